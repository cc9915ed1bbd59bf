package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// outputKind is how a command writes a file the user named.
type outputKind int

const (
	// toStdout: the path was "-".
	toStdout outputKind = iota
	// replaceFile: a regular file or nothing is there; the output is
	// written to a temporary file beside it and renamed over it, so the
	// path holds the old content or the whole new one, never a part.
	replaceFile
	// writeInto: a device or a FIFO (/dev/null, a terminal, a pipe) is
	// there; the output is written into it, never replaced.
	writeInto
)

// output is where a command writes what the user asked for (-o PATH,
// --addr-file, --hal DIR's files): decided by resolveOutput before any
// work is done, written by write.
type output struct {
	path string // as given, for messages
	kind outputKind
	// target is the file to write into or to replace: path, or what a
	// symbolic link at path resolves to.
	target string
}

// resolveOutput decides how to write to path: "-" is standard output; a
// regular file or nothing is replaced atomically; a device or FIFO is
// written into; a directory, a socket and a symbolic link to a directory
// or to nothing are refused with an error naming path. A symbolic link to
// a file is followed: the file it names is what is written.
func resolveOutput(path string) (output, error) {
	if path == "-" || slices.Contains(stdoutNames, path) {
		// /dev/stdout resolves to whatever standard output is: replacing
		// that file would leave the shell writing to an unlinked one.
		return output{path: path, kind: toStdout}, nil
	}
	if strings.HasPrefix(path, "/dev/fd/") || strings.HasPrefix(path, "/proc/self/fd/") || path == "/dev/stderr" {
		return output{}, fmt.Errorf("%s is a descriptor of this command: give - for standard output, or the path of a file", path)
	}
	if path == "" {
		return output{}, errors.New("no output path given")
	}
	o := output{path: path, target: path}
	fi, err := os.Stat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if li, lerr := os.Lstat(path); lerr == nil && li.Mode()&fs.ModeSymlink != 0 {
			dest, _ := os.Readlink(path)
			return output{}, fmt.Errorf("%s is a symbolic link to %s, which does not exist: give the path of a file", path, dest)
		}
		o.kind = replaceFile
		return o, nil
	case err != nil:
		return output{}, fmt.Errorf("output %s: %w", path, err)
	}
	switch mode := fi.Mode(); {
	case mode.IsDir():
		return output{}, fmt.Errorf("%s is a directory: give the path of a file to write", path)
	case mode&fs.ModeSocket != 0:
		return output{}, fmt.Errorf("%s is a socket, which cannot be written like a file", path)
	case mode.IsRegular():
		o.kind = replaceFile
		if li, err := os.Lstat(path); err == nil && li.Mode()&fs.ModeSymlink != 0 {
			if o.target, err = filepath.EvalSymlinks(path); err != nil {
				return output{}, fmt.Errorf("output %s: %w", path, err)
			}
		}
		return o, nil
	default: // character or block device, FIFO
		o.kind = writeInto
		return o, nil
	}
}

// stdoutNames are the paths that name this process's standard output.
var stdoutNames = []string{"/dev/stdout", "/dev/fd/1", "/proc/self/fd/1"}

// write writes to the output what fill writes into w.
func (o output) write(stdout io.Writer, fill func(w io.Writer) error) error {
	switch o.kind {
	case toStdout:
		return fill(stdout)
	case writeInto:
		return o.writeInto(fill)
	default:
		return o.replace(fill)
	}
}

func (o output) writeInto(fill func(io.Writer) error) error {
	// No O_CREATE, no O_TRUNC: only what is there is written into.
	f, err := os.OpenFile(o.target, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("write %s: %w", o.path, err)
	}
	// What was opened is checked again: a regular file put there since
	// resolveOutput must not be written over in place.
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", o.path, err)
	}
	if fi.Mode().IsRegular() || fi.IsDir() {
		f.Close()
		return fmt.Errorf("write %s: it is no longer a device or FIFO (it changed while this command ran)", o.path)
	}
	if err := fill(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", o.path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", o.path, err)
	}
	return nil
}

func (o output) replace(fill func(io.Writer) error) (err error) {
	dir := filepath.Dir(o.target)
	mode := fs.FileMode(0o644)
	if fi, err := os.Stat(o.target); err == nil {
		mode = fi.Mode().Perm()
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(o.target)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", o.path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
			err = fmt.Errorf("write %s: %w", o.path, err)
		}
	}()
	if err = fill(tmp); err != nil {
		return err
	}
	if err = tmp.Chmod(mode); err != nil {
		return err
	}
	if err = tmp.Sync(); err != nil {
		return err
	}
	if err = tmp.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp.Name(), o.target); err != nil {
		return err
	}
	// The rename is durable once the folder is synced.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// writeOutput writes b to path by the rules of resolveOutput.
func writeOutput(path string, stdout io.Writer, b []byte) error {
	o, err := resolveOutput(path)
	if err != nil {
		return err
	}
	return o.write(stdout, func(w io.Writer) error {
		_, err := w.Write(b)
		return err
	})
}
