package coordinator

import (
	"net/url"
	"strings"
	"testing"
)

// TestLocalPath: sign-in goes back only to a page of this site.
func TestLocalPath(t *testing.T) {
	for in, want := range map[string]string{
		"/evaluations/ev-1":       "/evaluations/ev-1",
		"/attempts/ah-1?x=1#frag": "/attempts/ah-1?x=1#frag",
		"/repro/rp-1":             "/repro/rp-1",
		"":                        "",
		"evaluations":             "",
		"//evil.example/x":        "",
		"/\\evil.example":         "",
		"https://evil.example/":   "",
		"javascript:alert(1)":     "",
		"/login":                  "",
		"/logout":                 "",
		"/a\r\nSet-Cookie: x":     "",
	} {
		if got := localPath(in); got != want {
			t.Errorf("localPath(%q) = %q, want %q", in, got, want)
		}
	}
}

// FuzzLocalPath: whatever a form says, the redirect is "" or a path on
// this site.
func FuzzLocalPath(f *testing.F) {
	for _, s := range []string{"/evaluations", "//x", "/\\x", "http://x/", "/a?b=//c", "/%2f%2fx", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got := localPath(s)
		if got == "" {
			return
		}
		u, err := url.Parse(got)
		if err != nil || got[0] != '/' || strings.HasPrefix(got, "//") || u.Host != "" || u.Scheme != "" || strings.ContainsAny(got, "\\\r\n") {
			t.Fatalf("localPath(%q) = %q: not a local path", s, got)
		}
	})
}
