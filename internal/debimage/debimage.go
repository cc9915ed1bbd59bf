// Package debimage builds Debian 12 (bookworm) OCI image tarballs: a
// minbase root file system made by debootstrap from a Debian mirror, with
// the packages asked for, plus files of the caller's, packed by
// sandbox/ociimage (one uncompressed layer, no registry). The sandbox's
// tests (an image with apt and pip) and the HAL adapter's image (Python,
// agents/hal) are built here.
//
// A root file system is made once per package set and kept in a cache
// folder (locked while it is made); an image is packed from a copy of it
// made of hard links, with the files added, so the cache is never
// changed. It owns only that; it needs root (debootstrap) and the
// debootstrap command, and reaches only the mirror.
package debimage

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/repronet/repronet/internal/flock"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// Suite is the Debian release the images are made of.
const Suite = "bookworm"

// DefaultMirror is Debian's mirror network.
const DefaultMirror = "http://deb.debian.org/debian"

// DefaultCacheDir is where root file systems and tarballs are kept
// between runs.
const DefaultCacheDir = "/var/lib/repronet/test-images"

// Spec is an image to build.
type Spec struct {
	// Ref names the image (ociimage.Build's ref).
	Ref string
	// Packages are installed beyond minbase (debootstrap --include).
	Packages []string
	// Files are added to the root file system: regular files and folders
	// (their parents are made 0755); an existing file is replaced.
	Files []ociimage.File
	// Config is the image's configuration.
	Config ociimage.Config
	// Extra, when set, adds to the root file system after Files, before
	// it is packed: what is too big to hold in memory (an npm package's
	// native binary, agents/cli). root is the copy's path on the host;
	// Extra must make new files only, never write through one that is
	// there (they are hard links into the cache).
	Extra func(root string) error
}

// Builder makes images.
type Builder struct {
	// CacheDir keeps root file systems ("": DefaultCacheDir).
	CacheDir string
	// Mirror is the Debian mirror ("": DefaultMirror).
	Mirror string
	// Offline refuses to make a root file system that is not in the
	// cache (ErrNotCached) instead of reaching the mirror: tests build
	// with it, so that they send nothing beyond loopback (the fixtures
	// are made beforehand, by internal/fixtures).
	Offline bool
}

// ErrNotCached is returned by an Offline Builder asked for a root file
// system it does not hold.
var ErrNotCached = errors.New("root file system not made yet")

// Build writes the image tarball of spec to tarball (through a temporary
// file renamed into place).
func (b Builder) Build(ctx context.Context, tarball string, spec Spec) error {
	if spec.Ref == "" {
		return fmt.Errorf("debimage: image %s: no ref", tarball)
	}
	rootfs, err := b.Rootfs(ctx, spec.Packages)
	if err != nil {
		return err
	}
	work, err := os.MkdirTemp(filepath.Dir(rootfs), "image-")
	if err != nil {
		return fmt.Errorf("debimage: %w", err)
	}
	defer os.RemoveAll(work)
	tree := filepath.Join(work, "rootfs")
	// Hard links: the copy costs no data, and the added files are new
	// entries, so the cached tree is never written.
	if out, err := exec.CommandContext(ctx, "cp", "-al", rootfs, tree).CombinedOutput(); err != nil {
		return fmt.Errorf("debimage: copy %s: %w: %s", rootfs, err, out)
	}
	if err := addFiles(tree, spec.Files); err != nil {
		return fmt.Errorf("debimage: image %s: %w", spec.Ref, err)
	}
	if spec.Extra != nil {
		if err := spec.Extra(tree); err != nil {
			return fmt.Errorf("debimage: image %s: %w", spec.Ref, err)
		}
	}
	if err := os.MkdirAll(filepath.Dir(tarball), 0o755); err != nil {
		return fmt.Errorf("debimage: %w", err)
	}
	tmp := tarball + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("debimage: %w", err)
	}
	_, err = ociimage.BuildFromDir(f, spec.Ref, tree, work, spec.Config)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("debimage: image %s: %w", spec.Ref, err)
	}
	return os.Rename(tmp, tarball)
}

// addFiles writes files into the tree at root. A file replacing one of
// the tree's is written as a new inode (never through a hard link).
func addFiles(root string, files []ociimage.File) error {
	for _, f := range files {
		clean := path.Clean("/" + f.Path)
		if strings.Contains(f.Path, "..") || clean == "/" {
			return fmt.Errorf("file %q: want an absolute path without ..", f.Path)
		}
		p := filepath.Join(root, filepath.FromSlash(clean))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		switch {
		case f.Mode.IsDir():
			if err := os.MkdirAll(p, f.Mode.Perm()); err != nil {
				return err
			}
		case f.Mode.IsRegular():
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return err
			}
			if err := os.WriteFile(p, f.Data, f.Mode.Perm()); err != nil {
				return err
			}
		default:
			return fmt.Errorf("file %q: only regular files and folders are added, not %v", f.Path, f.Mode.Type())
		}
		if err := os.Chmod(p, f.Mode.Perm()); err != nil {
			return err
		}
		if err := os.Lchown(p, f.UID, f.GID); err != nil {
			return err
		}
	}
	return nil
}

// Rootfs returns the cached root file system of packages, making it with
// debootstrap (about 80 s) if it is not there. Docs, manuals, locales,
// package lists and downloaded packages are left out, and so is
// sources.list: an image names its own sources.
func (b Builder) Rootfs(ctx context.Context, packages []string) (string, error) {
	cache := cmp.Or(b.CacheDir, DefaultCacheDir)
	mirror := cmp.Or(b.Mirror, DefaultMirror)
	pkgs := slices.Sorted(slices.Values(packages))
	pkgs = slices.Compact(pkgs)
	for _, p := range pkgs {
		if p == "" || strings.ContainsAny(p, ", \t\n") {
			return "", fmt.Errorf("debimage: package name %q", p)
		}
	}
	sum := sha256.Sum256([]byte(Suite + "\n" + mirror + "\n" + strings.Join(pkgs, ",")))
	dir := filepath.Join(cache, "rootfs", Suite+"-"+hex.EncodeToString(sum[:6]))
	release, err := flock.Lock(ctx, dir+".lock", 200*time.Millisecond)
	if err != nil {
		return "", fmt.Errorf("debimage: %w", err)
	}
	defer release()
	if _, err := os.Stat(filepath.Join(dir, "etc", "debian_version")); err == nil {
		return dir, nil
	}
	if b.Offline {
		return "", fmt.Errorf("debimage: %s with %v: %w (make it first: go run ./internal/fixtures/prepare, which make test runs)",
			dir, pkgs, ErrNotCached)
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		if _, serr := os.Stat("/usr/sbin/debootstrap"); serr != nil {
			return "", fmt.Errorf("debimage: debootstrap not installed (apt-get install debootstrap): %w", err)
		}
	}
	tmp := dir + ".tmp"
	if err := os.RemoveAll(tmp); err != nil {
		return "", fmt.Errorf("debimage: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(tmp), 0o755); err != nil {
		return "", fmt.Errorf("debimage: %w", err)
	}
	args := []string{"--variant=minbase"}
	if len(pkgs) > 0 {
		args = append(args, "--include="+strings.Join(pkgs, ","))
	}
	cmd := exec.CommandContext(ctx, "debootstrap", append(args, Suite, tmp, mirror)...)
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.RemoveAll(tmp)
		return "", fmt.Errorf("debimage: debootstrap %s: %w: %s", strings.Join(pkgs, ","), err, lastLines(out, 20))
	}
	for _, g := range []string{"var/cache/apt/archives/*.deb", "var/lib/apt/lists/*", "usr/share/doc/*", "usr/share/man/*",
		"usr/share/locale/*", "usr/share/info/*", "etc/apt/sources.list"} {
		matches, _ := filepath.Glob(filepath.Join(tmp, g))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return "", fmt.Errorf("debimage: %w", err)
			}
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return "", fmt.Errorf("debimage: %w", err)
	}
	return dir, nil
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
