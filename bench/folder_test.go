package bench

import (
	"archive/tar"
	"bytes"
	"reflect"
	"strings"
	"testing"
)

func folderTarball(t *testing.T, entries ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(strings.Repeat("x", int(h.Size)))); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestFolderFiles: a folder output's regular files under the folder's
// name; folders and links left out; a name leaving the folder, a
// malformed tarball and a folder over the bound are errors.
func TestFolderFiles(t *testing.T) {
	good := folderTarball(t, tar.Header{Name: "a.txt", Typeflag: tar.TypeReg, Size: 2, Mode: 0o644},
		tar.Header{Name: "sub/", Typeflag: tar.TypeDir, Mode: 0o755},
		tar.Header{Name: "sub/b.csv", Typeflag: tar.TypeReg, Size: 3, Mode: 0o644},
		tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"})
	got, err := FolderFiles("results", good, 10)
	if want := map[string][]byte{"results/a.txt": []byte("xx"), "results/sub/b.csv": []byte("xxx")}; err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%v %q", err, got)
	}
	for name, tc := range map[string]struct {
		tarball []byte
		max     int64
		want    string
	}{
		"over the bound": {good, 4, "over 4 bytes"},
		"leaves":         {folderTarball(t, tar.Header{Name: "../x", Typeflag: tar.TypeReg, Size: 1}), 10, "not a path inside"},
		"absolute":       {folderTarball(t, tar.Header{Name: "/x", Typeflag: tar.TypeReg, Size: 1}), 10, "not a path inside"},
		"malformed":      {bytes.Repeat([]byte("not a tarball "), 64), 10, "folder results"},
	} {
		if _, err := FolderFiles("results", tc.tarball, tc.max); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", name, err, tc.want)
		}
	}
}
