package recipe

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/ipfs/go-cid"
	"golang.org/x/sys/unix"

	"github.com/repronet/repronet/proto"
)

// Adder stores content and returns its CID and size (the node's capsule
// store, which then serves it to the coordinator over bitswap).
type Adder func(ctx context.Context, r io.Reader) (cid.Cid, int64, error)

// Collect returns the recipe's outputs from the workspace folder ws, in
// order, each stored with add and named by its CID, or with an error
// saying why not: missing, not a clean relative path, a symbolic link in
// any component, not a regular file (or, for a directory output, not a
// folder), or over its max_bytes. No symbolic link is ever followed, so
// nothing outside ws is read; a folder is returned as a tarball of what
// is in it (files, folders and links as links), in name order, with
// times and owners left out, so equal folders make equal tarballs.
func Collect(ctx context.Context, ws string, outputs []*proto.Output, add Adder) []*proto.OutputRef {
	if len(outputs) == 0 {
		return nil
	}
	out := make([]*proto.OutputRef, 0, len(outputs))
	for _, o := range outputs {
		ref := &proto.OutputRef{Path: o.GetPath()}
		c, n, err := collectOne(ctx, ws, o, add)
		if err != nil {
			ref.Error = err.Error()
		} else {
			ref.Cid, ref.Size = c.Bytes(), uint64(n)
		}
		out = append(out, ref)
	}
	return out
}

func collectOne(ctx context.Context, ws string, o *proto.Output, add Adder) (cid.Cid, int64, error) {
	if err := proto.CheckWorkspacePath(o.GetPath()); err != nil {
		return cid.Undef, 0, err
	}
	root, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return cid.Undef, 0, fmt.Errorf("open workspace: %w", err)
	}
	defer unix.Close(root)
	limit := int64(min(o.GetMaxBytes(), 1<<62))
	if !o.GetDirectory() {
		f, err := openFileAt(root, o.GetPath(), limit)
		if err != nil {
			return cid.Undef, 0, err
		}
		defer f.Close()
		return add(ctx, io.LimitReader(f, limit))
	}
	dfd, err := openPathAt(root, o.GetPath(), true)
	if err != nil {
		return cid.Undef, 0, err
	}
	defer unix.Close(dfd)
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.CloseWithError(writeTar(pw, dfd, limit))
	}()
	c, n, err := add(ctx, pr)
	pr.CloseWithError(err) // stops the writer if add gave up
	<-done
	if err != nil {
		return cid.Undef, 0, err
	}
	return c, n, nil
}

// errMissing is what opening a path that is not there returns.
var errMissing = errors.New("missing")

// errOverLimit is what a folder's tarball hits when it grows past its limit.
var errOverLimit = errors.New("over its max_bytes")

// writeTar writes the tarball of the folder dirfd to w, refusing to grow
// past limit bytes.
func writeTar(w io.Writer, dirfd int, limit int64) error {
	cw := &capWriter{w: w, left: limit}
	tw := tar.NewWriter(cw)
	if err := tarFolder(tw, dirfd, ""); err != nil {
		if errors.Is(err, errOverLimit) {
			return fmt.Errorf("the folder's tarball is %w (%d bytes)", errOverLimit, limit)
		}
		return err
	}
	return tw.Close()
}

func tarFolder(tw *tar.Writer, dirfd int, prefix string) error {
	d := os.NewFile(uintptr(mustDup(dirfd)), prefix)
	names, err := d.Readdirnames(-1)
	d.Close()
	if err != nil {
		return err
	}
	slices.Sort(names)
	for _, name := range names {
		rel := prefix + name
		var st unix.Stat_t
		if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return fmt.Errorf("%s: %w", rel, err)
		}
		hdr := &tar.Header{Name: rel, Mode: int64(st.Mode & 0o777), Format: tar.FormatPAX}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			hdr.Typeflag, hdr.Name = tar.TypeDir, rel+"/"
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
			fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			err = tarFolder(tw, fd, rel+"/")
			unix.Close(fd)
			if err != nil {
				return err
			}
		case unix.S_IFLNK:
			buf := make([]byte, 4096)
			n, err := unix.Readlinkat(dirfd, name, buf)
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			hdr.Typeflag, hdr.Linkname = tar.TypeSymlink, string(buf[:n])
			if err := tw.WriteHeader(hdr); err != nil {
				return err
			}
		case unix.S_IFREG:
			fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
			if err != nil {
				return fmt.Errorf("%s: %w", rel, err)
			}
			f := os.NewFile(uintptr(fd), rel)
			fi, err := f.Stat()
			if err == nil && !fi.Mode().IsRegular() {
				err = errors.New("not a regular file")
			}
			if err != nil {
				f.Close()
				return fmt.Errorf("%s: %w", rel, err)
			}
			hdr.Typeflag, hdr.Size = tar.TypeReg, fi.Size()
			if err := tw.WriteHeader(hdr); err != nil {
				f.Close()
				return err
			}
			_, err = io.Copy(tw, io.LimitReader(f, fi.Size()))
			f.Close()
			if err != nil {
				return err
			}
		default:
			// FIFOs, devices and sockets are never opened: left out.
		}
	}
	return nil
}

func mustDup(fd int) int {
	n, err := unix.Dup(fd)
	if err != nil {
		return -1
	}
	return n
}

// capWriter writes at most left bytes, then fails with errOverLimit.
type capWriter struct {
	w    io.Writer
	left int64
}

func (c *capWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, errOverLimit
	}
	n, err := c.w.Write(p)
	c.left -= int64(n)
	return n, err
}

// openFileAt opens the regular file at the relative path p below the folder
// root, following no symlink in any component, and refuses files over limit
// bytes.
func openFileAt(root int, p string, limit int64) (*os.File, error) {
	fd, err := openPathAt(root, p, false)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), p)
	fi, err := f.Stat()
	switch {
	case err != nil:
	case !fi.Mode().IsRegular():
		err = errors.New("not a regular file")
	case fi.Size() > limit:
		err = fmt.Errorf("%d bytes, over its max_bytes (%d)", fi.Size(), limit)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// openPathAt opens the relative path p below the folder root, a folder if
// dir, else a regular file, following no symlink in any component.
func openPathAt(root int, p string, dir bool) (int, error) {
	parts := strings.Split(p, "/")
	cur := root
	closeCur := func() {
		if cur != root {
			unix.Close(cur)
		}
	}
	for i, c := range parts[:len(parts)-1] {
		fd, err := openDirAt(cur, c, strings.Join(parts[:i+1], "/"))
		closeCur()
		if err != nil {
			return -1, err
		}
		cur = fd
	}
	defer closeCur()
	name := parts[len(parts)-1]
	if dir {
		return openDirAt(cur, name, p)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(cur, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, errMissing
		}
		return -1, err
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFREG {
		return -1, fmt.Errorf("%s, not a regular file", describeType(t))
	}
	// O_NOFOLLOW and O_NONBLOCK: should it have been replaced since, by a
	// symlink the open fails, and a FIFO neither blocks nor passes the
	// caller's check.
	return unix.Openat(cur, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
}

// openDirAt opens name in the folder dirfd as a folder, refusing a symlink.
func openDirAt(dirfd int, name, what string) (int, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return -1, fmt.Errorf("%s: %w", what, errMissing)
		}
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	if t := st.Mode & unix.S_IFMT; t != unix.S_IFDIR {
		return -1, fmt.Errorf("%s is %s, not a folder", what, describeType(t))
	}
	fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("%s: %w", what, err)
	}
	return fd, nil
}

// describeType names a file type (the S_IFMT bits of a mode).
func describeType(t uint32) string {
	switch t {
	case unix.S_IFLNK:
		return "a symlink (not followed)"
	case unix.S_IFDIR:
		return "a folder"
	case unix.S_IFREG:
		return "a regular file"
	case unix.S_IFIFO:
		return "a named pipe"
	case unix.S_IFSOCK:
		return "a socket"
	case unix.S_IFCHR, unix.S_IFBLK:
		return "a device"
	}
	return fmt.Sprintf("of file type %#o", t)
}
