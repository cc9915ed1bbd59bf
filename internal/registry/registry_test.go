package registry

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	digest "github.com/opencontainers/go-digest"

	"github.com/repronet/repronet/sandbox/ociimage"
)

// TestServe serves an image built by ociimage and reads it back as a
// puller does: the API root, the manifest by tag (with its media type)
// and by digest, every blob it names by digest, HEAD without a body;
// unknown names and writes are refused.
func TestServe(t *testing.T) {
	var layout bytes.Buffer
	md, err := ociimage.Build(&layout, "docker.io/library/tiny:1", []ociimage.File{{Path: "/hello", Mode: 0o644, Data: []byte("hi\n")}},
		ociimage.Config{Cmd: []string{"/hello"}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(layout.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(r)
	defer srv.Close()
	get := func(method, path string) (int, http.Header, []byte) {
		t.Helper()
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header, b
	}
	if code, _, _ := get("GET", "/v2/"); code != 200 {
		t.Fatalf("/v2/: %d", code)
	}
	code, h, manifest := get("GET", "/v2/library/tiny/manifests/1?ns=docker.io")
	if code != 200 || h.Get("Content-Type") != "application/vnd.oci.image.manifest.v1+json" || digest.FromBytes(manifest) != md ||
		h.Get("Docker-Content-Digest") != md.String() {
		t.Fatalf("manifest by tag: %d %v", code, h)
	}
	if code, _, b := get("GET", "/v2/library/tiny/manifests/"+md.String()); code != 200 || !bytes.Equal(b, manifest) {
		t.Fatalf("manifest by digest: %d", code)
	}
	for _, d := range bytes.Split(manifest, []byte(`"digest":"`))[1:] {
		dg := digest.Digest(d[:bytes.IndexByte(d, '"')])
		code, _, b := get("GET", "/v2/library/tiny/blobs/"+dg.String())
		if code != 200 || digest.FromBytes(b) != dg {
			t.Fatalf("blob %s: %d", dg, code)
		}
		if code, h, b := get("HEAD", "/v2/library/tiny/blobs/"+dg.String()); code != 200 || len(b) != 0 || h.Get("Content-Length") == "0" {
			t.Fatalf("HEAD blob %s: %d %v", dg, code, h)
		}
	}
	for _, p := range []string{"/v2/library/tiny/manifests/2", "/v2/library/other/manifests/1", "/v2/library/tiny/blobs/sha256:" +
		digest.FromString("x").Encoded(), "/v1/", "/v2/library/tiny/tags/list"} {
		if code, _, _ := get("GET", p); code != 404 {
			t.Errorf("GET %s: %d, want 404", p, code)
		}
	}
	if code, _, _ := get("PUT", "/v2/library/tiny/manifests/1"); code != 405 {
		t.Errorf("PUT: %d, want 405", code)
	}
	if _, err := New([]byte("not a tarball")); err == nil {
		t.Error("a broken layout was accepted")
	}
}
