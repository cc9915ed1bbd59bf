// Package ociimage builds small OCI image-layout tarballs deterministically,
// so that repronet can make agent images without a registry (typically from
// busybox-static plus the agent's own files).
//
// It owns only the bytes of the tarball: one gzip layer, the image config,
// the manifest, index.json and oci-layout. It does not talk to containerd,
// a registry or the network; importing the result is the sandbox package's job.
//
// The same input always gives the same bytes: entries are sorted, modification
// times are fixed at the Unix epoch, and owners default to root.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/distribution/reference"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// AnnotationImageName is the annotation containerd's importer reads the full
// image name from (containerd's images.AnnotationImageName).
const AnnotationImageName = "io.containerd.image.name"

// File is one entry of the image's single layer.
type File struct {
	// Path inside the image; a leading "/" is optional. Must not contain "..".
	Path string
	// Mode holds the permission bits plus the type: 0 for a regular file,
	// fs.ModeDir for a directory, fs.ModeSymlink for a symbolic link.
	// fs.ModeSetuid, fs.ModeSetgid and fs.ModeSticky are honoured.
	Mode fs.FileMode
	// Data is the content of a regular file.
	Data []byte
	// Linkname is the target of a symlink (Mode&fs.ModeSymlink).
	Linkname string
	// UID and GID own the entry; zero (root) unless set.
	UID, GID int
}

// Config is the part of the OCI image config a runtime uses.
type Config struct {
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
	User       string
}

// epoch returns the modification time of every entry, for reproducibility.
func epoch() time.Time { return time.Unix(0, 0).UTC() }

// Build writes an OCI image-layout tarball for files and cfg to w and returns
// the digest of the image manifest. ref names the image: index.json carries it
// as org.opencontainers.image.ref.name (as given) and io.containerd.image.name
// (normalised to a full reference, e.g. "busybox" becomes
// "docker.io/library/busybox:latest"), so containerd's importer names the image
// by the latter. Parent directories missing from files are added (0755, root).
// The compressed layer is held in memory while the tarball is written.
func Build(w io.Writer, ref string, files []File, cfg Config) (digest.Digest, error) {
	layerTar, err := layerTarball(files)
	if err != nil {
		return "", fmt.Errorf("build layer: %w", err)
	}
	return BuildFromLayer(w, ref, layerTar, cfg)
}

// BuildFromLayer is Build for a layer given as an uncompressed tar, as it
// is (its entries are not checked: Check does that).
func BuildFromLayer(w io.Writer, ref string, layerTar []byte, cfg Config) (digest.Digest, error) {
	fullRef, err := FullRef(ref)
	if err != nil {
		return "", err
	}
	diffID := digest.FromBytes(layerTar)
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return "", fmt.Errorf("gzip layer: %w", err)
	}
	if _, err := zw.Write(layerTar); err != nil {
		return "", fmt.Errorf("gzip layer: %w", err)
	}
	if err := zw.Close(); err != nil {
		return "", fmt.Errorf("gzip layer: %w", err)
	}
	layer := gz.Bytes()
	layerDesc := ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageLayerGzip,
		Digest:    digest.FromBytes(layer),
		Size:      int64(len(layer)),
	}
	return writeLayout(w, ref, fullRef, layerDesc, bytes.NewReader(layer), diffID, cfg)
}

// writeLayout writes the OCI layout tarball of a one-layer image: the
// layer's bytes come from layer (layerDesc.Size of them).
func writeLayout(w io.Writer, ref, fullRef string, layerDesc ocispec.Descriptor, layer io.Reader, diffID digest.Digest, cfg Config) (digest.Digest, error) {
	platform := ocispec.Platform{OS: "linux", Architecture: runtime.GOARCH}
	config := ocispec.Image{
		Platform: platform,
		Config: ocispec.ImageConfig{
			User:       cfg.User,
			Env:        cfg.Env,
			Entrypoint: cfg.Entrypoint,
			Cmd:        cfg.Cmd,
			WorkingDir: cfg.WorkingDir,
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return "", fmt.Errorf("encode image config: %w", err)
	}
	configDesc := ocispec.Descriptor{
		MediaType: ocispec.MediaTypeImageConfig,
		Digest:    digest.FromBytes(configJSON),
		Size:      int64(len(configJSON)),
	}

	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Layers:    []ocispec.Descriptor{layerDesc},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return "", fmt.Errorf("encode manifest: %w", err)
	}
	manifestDigest := digest.FromBytes(manifestJSON)

	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{{
			MediaType: ocispec.MediaTypeImageManifest,
			Digest:    manifestDigest,
			Size:      int64(len(manifestJSON)),
			Platform:  &platform,
			Annotations: map[string]string{
				ocispec.AnnotationRefName: ref,
				AnnotationImageName:       fullRef,
			},
		}},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return "", fmt.Errorf("encode index: %w", err)
	}
	layoutJSON, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return "", fmt.Errorf("encode oci-layout: %w", err)
	}

	blobs := map[digest.Digest][]byte{
		configDesc.Digest: configJSON,
		manifestDigest:    manifestJSON,
	}
	keys := []string{layerDesc.Digest.String()}
	for d := range blobs {
		keys = append(keys, d.String())
	}
	sort.Strings(keys)

	tw := tar.NewWriter(w)
	if err := writeTarFile(tw, ocispec.ImageLayoutFile, layoutJSON); err != nil {
		return "", err
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: dir, Mode: 0o755, ModTime: epoch()}); err != nil {
			return "", fmt.Errorf("write %s: %w", dir, err)
		}
	}
	for _, k := range keys {
		d := digest.Digest(k)
		name := "blobs/" + d.Algorithm().String() + "/" + d.Encoded()
		if d != layerDesc.Digest {
			if err := writeTarFile(tw, name, blobs[d]); err != nil {
				return "", err
			}
			continue
		}
		hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: layerDesc.Size, ModTime: epoch()}
		if err := tw.WriteHeader(hdr); err != nil {
			return "", fmt.Errorf("write layer header: %w", err)
		}
		if n, err := io.Copy(tw, layer); err != nil || n != layerDesc.Size {
			return "", fmt.Errorf("write layer: %d of %d bytes: %v", n, layerDesc.Size, err)
		}
	}
	if err := writeTarFile(tw, "index.json", indexJSON); err != nil {
		return "", err
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("finish image tarball: %w", err)
	}
	return manifestDigest, nil
}

// FullRef returns the full (normalised) form of an image reference, the name
// containerd gives an image built by Build: "busybox" becomes
// "docker.io/library/busybox:latest"; "repronet.local/agent:1" stays as it is.
func FullRef(ref string) (string, error) {
	if ref == "" {
		return "", errors.New("image reference is empty")
	}
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", fmt.Errorf("parse image reference %q: %w", ref, err)
	}
	return named.String(), nil
}

func writeTarFile(tw *tar.Writer, name string, data []byte) error {
	hdr := &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch()}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("write %s header: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	return nil
}

// layerTarball returns the uncompressed layer: entries sorted by path, parents
// before children, fixed times.
func layerTarball(files []File) ([]byte, error) {
	entries := make(map[string]File, len(files))
	for _, f := range files {
		p, err := cleanPath(f.Path)
		if err != nil {
			return nil, err
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("duplicate path %q", f.Path)
		}
		f.Path = p
		entries[p] = f
	}
	// Add missing parents.
	for p := range entries {
		for dir := path.Dir(p); dir != "."; dir = path.Dir(dir) {
			if e, ok := entries[dir]; ok {
				if e.Mode&fs.ModeDir == 0 {
					return nil, fmt.Errorf("%q is not a directory but %q is under it", dir, p)
				}
				continue
			}
			entries[dir] = File{Path: dir, Mode: fs.ModeDir | 0o755}
		}
	}
	names := make([]string, 0, len(entries))
	for p := range entries {
		names = append(names, p)
	}
	// Sorting by path components keeps a directory right before its contents.
	sort.Slice(names, func(i, j int) bool { return lessPath(names[i], names[j]) })

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range names {
		f := entries[p]
		hdr := &tar.Header{
			Name:    p,
			Mode:    tarMode(f.Mode),
			Uid:     f.UID,
			Gid:     f.GID,
			ModTime: epoch(),
			Format:  tar.FormatPAX,
		}
		switch {
		case f.Mode&fs.ModeDir != 0:
			hdr.Typeflag = tar.TypeDir
			hdr.Name = p + "/"
		case f.Mode&fs.ModeSymlink != 0:
			if f.Linkname == "" {
				return nil, fmt.Errorf("symlink %q has no target", p)
			}
			hdr.Typeflag = tar.TypeSymlink
			hdr.Linkname = f.Linkname
		case f.Mode&fs.ModeType == 0:
			hdr.Typeflag = tar.TypeReg
			hdr.Size = int64(len(f.Data))
		default:
			return nil, fmt.Errorf("%q: unsupported file type %v", p, f.Mode.Type())
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write %q header: %w", p, err)
		}
		if hdr.Typeflag == tar.TypeReg {
			if _, err := tw.Write(f.Data); err != nil {
				return nil, fmt.Errorf("write %q: %w", p, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("finish layer: %w", err)
	}
	return buf.Bytes(), nil
}

// lessPath orders paths component by component ("a" < "a/b" < "a-b").
func lessPath(a, b string) bool {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	for i := 0; i < len(as) && i < len(bs); i++ {
		if as[i] != bs[i] {
			return as[i] < bs[i]
		}
	}
	return len(as) < len(bs)
}

func cleanPath(p string) (string, error) {
	trimmed := strings.TrimLeft(p, "/")
	if trimmed == "" {
		return "", fmt.Errorf("invalid path %q: empty or root", p)
	}
	for _, part := range strings.Split(trimmed, "/") {
		if part == ".." {
			return "", fmt.Errorf("invalid path %q: contains ..", p)
		}
	}
	c := path.Clean(trimmed)
	if c == "." {
		return "", fmt.Errorf("invalid path %q", p)
	}
	return c, nil
}

func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

// busyboxApplets returns the applets BusyboxFiles links in /bin.
func busyboxApplets() []string {
	return []string{
		"sh", "ash", "awk", "sed", "grep", "cat", "ls", "mkdir", "rm", "cp", "mv", "echo", "printf",
		"sort", "uniq", "wc", "head", "tail", "tr", "cut", "sleep", "env", "find", "xargs", "date",
		"expr", "seq", "tee", "dd", "ip", "ifconfig", "id", "true", "false", "test", "[", "basename",
		"dirname", "od", "hexdump", "yes", "touch", "chmod", "sha256sum", "md5sum", "gzip", "tar",
	}
}

// AgentUID and AgentGID are the ids of the unprivileged "agent" user that
// BusyboxFiles puts in /etc/passwd and /etc/group.
const (
	AgentUID = 1000
	AgentGID = 1000
)

// BusyboxFiles returns a minimal root filesystem around a static busybox
// binary read from busyboxPath: /bin/busybox and symlinks for the common
// applets, /usr/bin/env, /tmp (1777), /etc/passwd and /etc/group with root
// and an "agent" user (uid/gid 1000), and /home/agent owned by that user.
func BusyboxFiles(busyboxPath string) ([]File, error) {
	data, err := os.ReadFile(busyboxPath)
	if err != nil {
		return nil, fmt.Errorf("read busybox binary: %w", err)
	}
	files := []File{
		{Path: "/bin", Mode: fs.ModeDir | 0o755},
		{Path: "/bin/busybox", Mode: 0o755, Data: data},
		{Path: "/usr/bin/env", Mode: fs.ModeSymlink | 0o777, Linkname: "/bin/busybox"},
		{Path: "/tmp", Mode: fs.ModeDir | fs.ModeSticky | 0o777},
		{Path: "/etc", Mode: fs.ModeDir | 0o755},
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte(fmt.Sprintf(
			"root:x:0:0:root:/root:/bin/sh\nagent:x:%d:%d:agent:/home/agent:/bin/sh\n", AgentUID, AgentGID))},
		{Path: "/etc/group", Mode: 0o644, Data: []byte(fmt.Sprintf("root:x:0:\nagent:x:%d:\n", AgentGID))},
		{Path: "/root", Mode: fs.ModeDir | 0o700},
		{Path: "/home", Mode: fs.ModeDir | 0o755},
		{Path: "/home/agent", Mode: fs.ModeDir | 0o755, UID: AgentUID, GID: AgentGID},
		{Path: "/proc", Mode: fs.ModeDir | 0o555},
		{Path: "/sys", Mode: fs.ModeDir | 0o555},
		{Path: "/dev", Mode: fs.ModeDir | 0o755},
	}
	for _, a := range busyboxApplets() {
		files = append(files, File{Path: "/bin/" + a, Mode: fs.ModeSymlink | 0o777, Linkname: "busybox"})
	}
	return files, nil
}
