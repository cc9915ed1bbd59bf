package debimage

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/sandbox/ociimage"
)

// TestBuild builds an image with python3 and a file of ours from the
// cached root file system (made beforehand by internal/fixtures: the test
// reaches no mirror): the layer holds the file and Debian's python3, and
// the cached tree is not changed by the file added.
func TestBuild(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the root file system's files are root's")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	b := Builder{Offline: true}
	tarball := filepath.Join(t.TempDir(), "img.tar")
	err := b.Build(ctx, tarball, Spec{Ref: "repronet.local/test/debimage:1", Packages: []string{"python3-pip"},
		Files:  []ociimage.File{{Path: "/agent/hello.py", Mode: 0o755, Data: []byte("print('hi')\n")}, {Path: "/etc/hostname", Mode: 0o644, Data: []byte("ours\n")}},
		Config: ociimage.Config{Entrypoint: []string{"/usr/bin/python3", "/agent/hello.py"}}})
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]string{}
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	outer := tar.NewReader(f)
	for {
		h, err := outer.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !strings.HasPrefix(h.Name, "blobs/") || h.Size < 1<<20 {
			continue
		}
		layer := tar.NewReader(outer)
		for {
			lh, err := layer.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			switch name := strings.TrimPrefix(lh.Name, "./"); name {
			case "agent/hello.py", "etc/hostname", "usr/bin/python3":
				body, _ := io.ReadAll(layer)
				found[name] = string(body)
				if name == "usr/bin/python3" {
					found[name] = lh.Linkname
				}
			}
		}
	}
	if found["agent/hello.py"] != "print('hi')\n" || found["etc/hostname"] != "ours\n" || !strings.HasPrefix(found["usr/bin/python3"], "python3") {
		t.Fatalf("layer entries %q", found)
	}
	root, err := b.Rootfs(ctx, []string{"python3-pip"})
	if err != nil {
		t.Fatal(err)
	}
	if h, _ := os.ReadFile(filepath.Join(root, "etc", "hostname")); string(h) == "ours\n" {
		t.Error("the cached root file system was changed")
	}
	if _, err := os.Stat(filepath.Join(root, "agent")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the cached root file system has /agent: %v", err)
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	b := Builder{CacheDir: t.TempDir()}
	if err := b.Build(context.Background(), filepath.Join(t.TempDir(), "x.tar"), Spec{}); err == nil || !strings.Contains(err.Error(), "no ref") {
		t.Errorf("no ref: %v", err)
	}
	if _, err := b.Rootfs(context.Background(), []string{"python3,evil"}); err == nil || !strings.Contains(err.Error(), "package name") {
		t.Errorf("bad package: %v", err)
	}
	if err := addFiles(t.TempDir(), []ociimage.File{{Path: "/../x", Data: []byte("x")}}); err == nil {
		t.Error("a path with .. accepted")
	}
	if err := addFiles(t.TempDir(), []ociimage.File{{Path: "/l", Mode: fs.ModeSymlink, Linkname: "/etc"}}); err == nil {
		t.Error("a symlink accepted")
	}
}

// TestOffline: an offline builder asked for a root file system it has not
// got says so, naming it, and makes nothing (no debootstrap, no mirror).
func TestOffline(t *testing.T) {
	cache := t.TempDir()
	b := Builder{CacheDir: cache, Mirror: "http://127.0.0.1:9/debian", Offline: true}
	_, err := b.Rootfs(context.Background(), []string{"python3-pip", "nonexistent-package"})
	if !errors.Is(err, ErrNotCached) || !strings.Contains(err.Error(), "nonexistent-package") {
		t.Fatalf("Rootfs = %v; want ErrNotCached naming the packages", err)
	}
	err = b.Build(context.Background(), filepath.Join(cache, "img.tar"), Spec{Ref: "repronet.local/test/offline:1"})
	if !errors.Is(err, ErrNotCached) {
		t.Fatalf("Build = %v; want ErrNotCached", err)
	}
	des, _ := os.ReadDir(filepath.Join(cache, "rootfs"))
	for _, d := range des {
		if !strings.HasSuffix(d.Name(), ".lock") {
			t.Fatalf("made %s", d.Name())
		}
	}
}
