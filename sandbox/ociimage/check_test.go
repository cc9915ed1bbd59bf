package ociimage

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// layerOf is an uncompressed layer tar of hdrs (a regular file's content
// is Size bytes of 'x').
func layerOf(t testing.TB, hdrs ...tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hdrs {
		h := h
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
		}
	}
	tw.Close()
	return b.Bytes()
}

// imageOf is the OCI layout tarball of a one-layer image whose
// configuration says diffID (empty: the layer's own).
func imageOf(t testing.TB, layer []byte, diffID digest.Digest) []byte {
	t.Helper()
	if diffID == "" {
		diffID = digest.FromBytes(layer)
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: digest.FromBytes(layer), Size: int64(len(layer))}
	var out bytes.Buffer
	if _, err := writeLayout(&out, "repronet.local/check:test", "repronet.local/check:test", desc, bytes.NewReader(layer), diffID,
		Config{Entrypoint: []string{"/bin/sh"}}); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// editArchive rewrites an archive's files through edit (nil: drop it).
func editArchive(t testing.TB, archive []byte, edit func(name string, data []byte) []byte) []byte {
	t.Helper()
	tr := tar.NewReader(bytes.NewReader(archive))
	var out bytes.Buffer
	tw := tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		if h.Typeflag == tar.TypeReg {
			if data = edit(h.Name, data); data == nil {
				continue
			}
			h.Size = int64(len(data))
		}
		tw.WriteHeader(h)
		tw.Write(data)
	}
	tw.Close()
	return out.Bytes()
}

func TestCheck(t *testing.T) {
	file := func(name string, size int64) tar.Header {
		return tar.Header{Typeflag: tar.TypeReg, Name: name, Size: size}
	}
	good := layerOf(t, tar.Header{Typeflag: tar.TypeDir, Name: "bin/", Mode: 0o755}, file("bin/sh", 100),
		tar.Header{Typeflag: tar.TypeLink, Name: "bin/ash", Linkname: "bin/sh"},
		tar.Header{Typeflag: tar.TypeSymlink, Name: "bin/dash", Linkname: "/bin/sh"})
	var built bytes.Buffer
	if _, err := Build(&built, "repronet.local/agents/x:test", []File{{Path: "/agent/run", Mode: 0o755, Data: []byte("#!/bin/sh\n")}},
		Config{Entrypoint: []string{"/agent/run"}}); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		archive []byte
		lim     CheckLimits
		want    string // "" : accepted
	}{
		{name: "built by Build (gzip layer)", archive: built.Bytes()},
		{name: "files, a hard link, a symbolic link", archive: imageOf(t, good, "")},
		{name: "a character device", archive: imageOf(t, layerOf(t, tar.Header{Typeflag: tar.TypeChar, Name: "dev/mem", Devmajor: 1, Devminor: 1}), ""),
			want: "dev/mem is a device file (1,1)"},
		{name: "a block device outside /dev", archive: imageOf(t, layerOf(t, tar.Header{Typeflag: tar.TypeBlock, Name: "tmp/disk", Devmajor: 8}), ""),
			want: "tmp/disk is a device file (8,0)"},
		{name: "a hard link to nothing", archive: imageOf(t, layerOf(t, tar.Header{Typeflag: tar.TypeLink, Name: "a", Linkname: "nowhere"}), ""),
			want: "hard link a names nowhere, which no file before it holds"},
		{name: "a path leaving the root", archive: imageOf(t, layerOf(t, file("../../etc/cron.d/x", 1)), ""), want: "leaves the root"},
		{name: "a bomb", archive: imageOf(t, layerOf(t, file("big", 2048), file("big2", 2048)), ""), lim: CheckLimits{UnpackedBytes: 3000},
			want: "unpacks to over 3000 bytes"},
		{name: "too many entries", archive: imageOf(t, good, ""), lim: CheckLimits{Entries: 2}, want: "over 2 entries"},
		{name: "a configuration that names another layer", archive: imageOf(t, good, digest.FromString("other")),
			want: "but its configuration says sha256:"},
		{name: "no index", archive: editArchive(t, imageOf(t, good, ""), func(n string, d []byte) []byte {
			if n == "index.json" {
				return nil
			}
			return d
		}), want: "no index.json"},
		{name: "a missing layer", archive: editArchive(t, imageOf(t, good, ""), func(n string, d []byte) []byte {
			if bytes.HasPrefix(d, good[:100]) {
				return nil
			}
			return d
		}), want: "is not in the archive"},
		{name: "a layer that is not what its digest says", archive: editArchive(t, imageOf(t, good, ""), func(n string, d []byte) []byte {
			if bytes.Equal(d, good) {
				return layerOf(t, file("bin/sh", 100))
			}
			return d
		}), want: "holds content of digest"},
		{name: "not an archive", archive: []byte("hello"), want: "the archive"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Check(bytes.NewReader(c.archive), c.lim)
			if c.want == "" {
				if err != nil || s.Manifests != 1 || s.Layers != 1 || s.Format != "oci" || s.UnpackedBytes == 0 {
					t.Fatalf("refused: %v (%+v)", err, s)
				}
				return
			}
			if !errors.Is(err, ErrImageRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a refusal saying %q", err, c.want)
			}
		})
	}
}

// TestCheckDocker: a docker save archive is checked alike.
func TestCheckDocker(t *testing.T) {
	layer := layerOf(t, tar.Header{Typeflag: tar.TypeReg, Name: "bin/sh", Size: 10})
	cfg, _ := json.Marshal(ocispec.Image{RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{digest.FromBytes(layer)}}})
	archive := func(layer []byte) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, f := range []struct {
			name string
			data []byte
		}{{"abc/layer.tar", layer}, {"cfg.json", cfg}, {"manifest.json", []byte(`[{"Config":"cfg.json","Layers":["abc/layer.tar"]}]`)}} {
			tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Size: int64(len(f.data)), Mode: 0o644})
			tw.Write(f.data)
		}
		tw.Close()
		return b.Bytes()
	}
	if s, err := Check(bytes.NewReader(archive(layer)), CheckLimits{}); err != nil || s.Format != "docker" || s.UnpackedBytes != 10 {
		t.Fatalf("docker save archive: %+v %v", s, err)
	}
	dev := layerOf(t, tar.Header{Typeflag: tar.TypeChar, Name: "bin/sh", Devmajor: 1, Devminor: 3})
	if _, err := Check(bytes.NewReader(archive(dev)), CheckLimits{}); !errors.Is(err, ErrImageRefused) || !strings.Contains(err.Error(), "device file") {
		t.Fatalf("docker save archive with a device: %v", err)
	}
}

// FuzzCheck: no archive makes Check panic or hang.
func FuzzCheck(f *testing.F) {
	good := layerOf(f, tar.Header{Typeflag: tar.TypeReg, Name: "a", Size: 3})
	f.Add(imageOf(f, good, ""))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _ = Check(bytes.NewReader(b), CheckLimits{UnpackedBytes: 1 << 20, Entries: 1000})
	})
}

// TestCheckingReader: the consumer reads the archive unchanged; a refused
// archive fails the read at its end, and Finish gives the verdict to a
// consumer that stopped early.
func TestCheckingReader(t *testing.T) {
	good := imageOf(t, layerOf(t, tar.Header{Typeflag: tar.TypeReg, Name: "a", Size: 3}), "")
	bad := imageOf(t, layerOf(t, tar.Header{Typeflag: tar.TypeChar, Name: "dev/mem", Devmajor: 1, Devminor: 1}), "")

	r := NewCheckingReader(bytes.NewReader(good), CheckLimits{})
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, good) || r.Finish() != nil {
		t.Fatalf("a good archive: %d bytes (of %d), %v, %v", len(got), len(good), err, r.Finish())
	}
	r = NewCheckingReader(bytes.NewReader(bad), CheckLimits{})
	if _, err := io.ReadAll(r); !errors.Is(err, ErrImageRefused) {
		t.Fatalf("a bad archive read to its end: %v", err)
	}
	r = NewCheckingReader(bytes.NewReader(bad), CheckLimits{})
	if _, err := io.ReadFull(r, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if err := r.Finish(); !errors.Is(err, ErrImageRefused) || !strings.Contains(err.Error(), "device file") {
		t.Fatalf("a bad archive read in part, then finished: %v", err)
	}
	if err := r.Finish(); !errors.Is(err, ErrImageRefused) {
		t.Fatalf("Finish again: %v", err)
	}
}
