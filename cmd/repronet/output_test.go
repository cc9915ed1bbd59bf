package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// nullDevice makes a character device node with /dev/null's numbers (1, 3)
// in a test folder: the same device, where a failing test cannot replace
// the machine's /dev/null.
func nullDevice(t *testing.T, dir string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a device node needs root")
	}
	p := filepath.Join(dir, "null")
	if err := syscall.Mknod(p, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
		t.Skipf("mknod: %v", err)
	}
	return p
}

func isCharDevice(t *testing.T, p string) bool {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return fi.Mode()&fs.ModeCharDevice != 0 && ok && st.Rdev == 1<<8|3
}

// TestCapsuleGetOutputs is finding 9 of the security review: "capsule get
// -o PATH" replaced whatever PATH was by a rename, so -o /dev/null as
// root turned the device into a regular file. A device or FIFO is written
// into, a regular file (or one a symbolic link names) replaced whole, a
// directory or a link to one refused before anything is fetched.
func TestCapsuleGetOutputs(t *testing.T) {
	ctx := context.Background()
	src := filepath.Join(t.TempDir(), "capsule-1.tar.gz")
	body := tarball(t, "capsule-1", map[string]string{"code/run.sh": "echo hi\n"})
	if err := os.WriteFile(src, body, 0o644); err != nil {
		t.Fatal(err)
	}
	data := t.TempDir()
	out, err := capsuleCmd(t, ctx, "add", "--data", data, src)
	if err != nil {
		t.Fatal(err)
	}
	cid := strings.Fields(out)[0]
	get := func(path string) error {
		_, err := capsuleCmd(t, ctx, "get", "--data", data, cid, "-o", path)
		return err
	}
	dir := t.TempDir()

	t.Run("null device", func(t *testing.T) {
		null := nullDevice(t, dir)
		if err := get(null); err != nil {
			t.Fatal(err)
		}
		if !isCharDevice(t, null) {
			t.Fatal("-o on a null device replaced it: it is no longer the character device 1,3")
		}
	})

	t.Run("FIFO", func(t *testing.T) {
		fifo := filepath.Join(dir, "fifo")
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			t.Fatal(err)
		}
		// Held open both ways, so neither side's open waits for the other.
		keep, err := os.OpenFile(fifo, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer keep.Close()
		got := make(chan error, 1)
		go func() { got <- get(fifo) }()
		if err := keep.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, len(body))
		if _, err := io.ReadFull(keep, buf); err != nil {
			t.Fatalf("reading the FIFO: %v (the command wrote elsewhere?)", err)
		}
		if !bytes.Equal(buf, body) {
			t.Fatal("the FIFO carried other bytes than the file's")
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&fs.ModeNamedPipe == 0 {
			t.Fatalf("the FIFO was replaced: %v, %v", fi.Mode(), err)
		}
	})

	t.Run("regular file", func(t *testing.T) {
		p := filepath.Join(dir, "old.tar.gz")
		if err := os.WriteFile(p, []byte("old content"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := get(p); err != nil {
			t.Fatal(err)
		}
		if b, _ := os.ReadFile(p); !bytes.Equal(b, body) {
			t.Fatalf("the file holds %d bytes, want the %d of the capsule", len(b), len(body))
		}
		if fi, _ := os.Stat(p); fi.Mode().Perm() != 0o600 {
			t.Errorf("the replaced file's mode is %v, want its old 0600", fi.Mode().Perm())
		}
	})

	t.Run("symbolic link to a file", func(t *testing.T) {
		target := filepath.Join(dir, "target.tar.gz")
		os.WriteFile(target, []byte("old"), 0o644)
		link := filepath.Join(dir, "link.tar.gz")
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		if err := get(link); err != nil {
			t.Fatal(err)
		}
		if fi, err := os.Lstat(link); err != nil || fi.Mode()&fs.ModeSymlink == 0 {
			t.Fatal("the symbolic link was replaced by a file")
		}
		if b, _ := os.ReadFile(target); !bytes.Equal(b, body) {
			t.Fatal("the file the link names was not written")
		}
	})

	for _, tc := range []struct {
		name string
		path func() string
		want string
	}{
		{"directory", func() string { return t.TempDir() }, "is a directory"},
		{"symbolic link to a directory", func() string {
			link := filepath.Join(dir, "dirlink")
			os.Symlink(t.TempDir(), link)
			return link
		}, "is a directory"},
		{"dangling symbolic link", func() string {
			link := filepath.Join(dir, "dangling")
			os.Symlink(filepath.Join(dir, "nothing"), link)
			return link
		}, "does not exist"},
		{"socket", func() string {
			p := filepath.Join(dir, "sock")
			ln, err := net.Listen("unix", p)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { ln.Close() })
			return p
		}, "is a socket"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := tc.path()
			before, err := os.Lstat(p)
			if err != nil {
				t.Fatal(err)
			}
			err = get(p)
			if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("get -o %s: %v, want an error naming the path and saying %q", p, err, tc.want)
			}
			after, err := os.Lstat(p)
			if err != nil || after.Mode() != before.Mode() {
				t.Fatalf("%s was changed: %v -> %v (%v)", p, before.Mode(), after.Mode(), err)
			}
		})
	}

	// Nothing was left behind in the folder but what the subtests made.
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.Contains(e.Name(), ".tmp-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// TestWriteOutputDevNull writes into the machine's /dev/null, once the
// rule says it is written into rather than replaced (so a regression fails
// here without replacing the device).
func TestWriteOutputDevNull(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the replacement only happened as root")
	}
	if !isCharDevice(t, "/dev/null") {
		t.Skip("/dev/null is not the null device here")
	}
	for _, p := range []string{"/dev/null", "/dev/stdout"} {
		o, err := resolveOutput(p)
		if err != nil {
			t.Fatal(err)
		}
		if p == "/dev/null" && o.kind != writeInto {
			t.Fatalf("/dev/null resolves to kind %d, want writeInto: not writing it", o.kind)
		}
	}
	if err := writeOutput("/dev/null", io.Discard, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !isCharDevice(t, "/dev/null") {
		t.Fatal("/dev/null is no longer the null device")
	}
}

func TestWriteOutputStdout(t *testing.T) {
	var buf bytes.Buffer
	if err := writeOutput("-", &buf, []byte("hello\n")); err != nil || buf.String() != "hello\n" {
		t.Fatalf("-: %q, %v", buf.String(), err)
	}
	// /dev/stdout is standard output, even when it is a regular file
	// (`repronet capsule get -o /dev/stdout > file`): written into, never
	// replaced.
	for _, p := range stdoutNames {
		buf.Reset()
		if err := writeOutput(p, &buf, []byte("hello\n")); err != nil || buf.String() != "hello\n" {
			t.Fatalf("%s: %q, %v", p, buf.String(), err)
		}
	}
	for _, p := range []string{"/dev/stderr", "/dev/fd/3", "/proc/self/fd/2"} {
		if err := writeOutput(p, &buf, nil); err == nil || !strings.Contains(err.Error(), "is a descriptor of this command") {
			t.Errorf("%s: %v, want a refusal", p, err)
		}
	}
	if err := writeOutput("", &buf, nil); err == nil {
		t.Error("an empty path was accepted")
	}
	p := filepath.Join(t.TempDir(), "missing", "file")
	if err := writeOutput(p, &buf, nil); err == nil || !strings.Contains(err.Error(), p) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a file in a missing folder: %v, want an error naming it", err)
	}
}
