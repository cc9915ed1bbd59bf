// Package agentimage builds the OCI image tarball of a sample agent: the
// busybox of Debian's busybox-static plus the agent's own files, run as
// uid 1000 from /agent/run in /workspace. Every family's sample agents
// (CORE-Bench's in internal/demo, shellqa's in bench/shellqa/sample) are
// built here, so that they run alike. It also builds the plain busybox
// image the sample capsules' environments build FROM (Base).
//
// It owns only those conventions; the tarball's bytes are package
// ociimage's, importing it is the sandbox's job.
package agentimage

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	"github.com/repronet/repronet/sandbox/ociimage"
)

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = "/bin/busybox"

// Entrypoint is a sample agent's entry point: a #!/bin/sh script among
// its files.
const Entrypoint = "/agent/run"

// Build builds the image tarball of the agent name from the busybox binary
// at busybox and files (absolute paths in the image, each installed with
// mode 0755; /agent is made a folder). The image runs Entrypoint as 1000:1000 in
// /workspace with PATH=/bin; it is named repronet.local/agents/NAME:sample.
// The same inputs give the same bytes.
func Build(name, busybox string, files map[string][]byte) ([]byte, error) {
	if _, ok := files[Entrypoint]; !ok {
		return nil, fmt.Errorf("agent %s: no %s among its files", name, Entrypoint)
	}
	image, err := ociimage.BusyboxFiles(busybox)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", name, err)
	}
	image = append(image, ociimage.File{Path: "/agent", Mode: 0o755 | os.ModeDir})
	for path, data := range files {
		image = append(image, ociimage.File{Path: path, Mode: 0o755, Data: data})
	}
	var buf bytes.Buffer
	ref := "repronet.local/agents/" + name + ":sample"
	if _, err := ociimage.Build(&buf, ref, image, ociimage.Config{
		Entrypoint: []string{Entrypoint}, WorkingDir: "/workspace", User: "1000:1000",
		Env: []string{"PATH=/bin"},
	}); err != nil {
		return nil, fmt.Errorf("agent %s: build image: %w", name, err)
	}
	return buf.Bytes(), nil
}

// Script returns the files of the sample agent name, one of names, whose
// run script is DIR/NAME/run in fsys (a sample's embedded agents): the
// script at Entrypoint.
func Script(fsys fs.FS, dir string, names []string, name string) (map[string][]byte, error) {
	if !slices.Contains(names, name) {
		return nil, fmt.Errorf("sample agent %q: no such agent (have %s)", name, strings.Join(names, ", "))
	}
	run, err := fs.ReadFile(fsys, path.Join(dir, name, "run"))
	if err != nil {
		return nil, fmt.Errorf("sample agent %s: %w", name, err)
	}
	return map[string][]byte{Entrypoint: run}, nil
}

// BasePath is the PATH of Base images, as Docker's busybox image sets it.
const BasePath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Base builds the OCI image tarball of a plain busybox image named ref from
// the busybox binary at busybox: what the sample capsules' environments
// build FROM (sample.BaseImage), for a node that cannot pull it (node
// --base-image) or a test's registry. It runs sh as root, with BasePath.
// The same inputs give the same bytes.
func Base(ref, busybox string) ([]byte, error) {
	files, err := ociimage.BusyboxFiles(busybox)
	if err != nil {
		return nil, fmt.Errorf("base image %s: %w", ref, err)
	}
	var buf bytes.Buffer
	if _, err := ociimage.Build(&buf, ref, files, ociimage.Config{Cmd: []string{"sh"}, Env: []string{BasePath}}); err != nil {
		return nil, fmt.Errorf("base image %s: %w", ref, err)
	}
	return buf.Bytes(), nil
}

// WriteBase writes Base(ref, busybox) to the file path (for node
// --base-image).
func WriteBase(path, ref, busybox string) error {
	b, err := Base(ref, busybox)
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("base image %s: %w", ref, err)
	}
	return nil
}
