package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"
	specsv "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"golang.org/x/sys/unix"

	"github.com/repronet/repronet/sandbox/dockerfile"
	"github.com/repronet/repronet/sandbox/idmap"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// BuildSpec describes building a capsule's environment (its
// environment/Dockerfile) into an image the node then runs attempts in
// (CORE-Bench Medium).
type BuildSpec struct {
	ID         string // names the build's workspace and container, like an attempt ID
	Dockerfile string // host path of the Dockerfile
	Context    string // host folder of the build context (the capsule's environment folder); "": none
	BuildArgs  map[string]string
	// Network and Proxy: what the build's RUN steps may reach, as for an
	// attempt (NetworkProxy with the suite's hosts, typically).
	Network Network
	Proxy   EgressProxy
	// Limits bound the build like an attempt; DiskBytes is the size of
	// its workspace (the context and the new layer).
	Limits Limits
}

// BuildResult is what BuildEnvironment produced.
type BuildResult struct {
	Image  string // the environment's image (a keyed image)
	Key    string // its key: base manifest, Dockerfile, build args and context
	Cached bool   // found built already; no build ran
	Run    Result // the build attempt (zero when Cached)
	Layer  int64  // bytes of the new layer (uncompressed)
}

// BuildEnvironment builds a Dockerfile's image the way the sandbox runs
// attempts: the Dockerfile (package dockerfile: one stage; RUN, COPY/ADD of
// local files, ENV, ARG, WORKDIR, USER, CMD, ENTRYPOINT) becomes one
// script, run as root in a user namespace in a container of the base
// image (which must be in the daemon: ImportImage, or the node's pull),
// with the build context read-only at dockerfile.ContextDir, the limits,
// quota, network and proxy of spec; its writable layer, once it exits 0,
// becomes the image's new top layer (owners mapped back to the
// container's IDs, overlay whiteouts to OCI whiteouts), its config the
// base's updated by the Dockerfile. The image is keyed by the base
// manifest, the Dockerfile, the build args and the context's files, so a
// second build of the same environment on the node is a lookup; it joins
// the keyed-image cache and its quota. A build that fails (non-zero exit,
// any limit) returns its Result and an error.
func (r *Runner) BuildEnvironment(ctx context.Context, spec BuildSpec) (BuildResult, error) {
	var out BuildResult
	df, err := os.ReadFile(spec.Dockerfile)
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	first, err := dockerfile.Parse(bytes.NewReader(df), dockerfile.Options{BuildArgs: spec.BuildArgs})
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	base, err := ociimage.FullRef(first.From)
	if err != nil {
		return out, fmt.Errorf("build %s: FROM: %w", spec.ID, err)
	}
	nctx := r.nsCtx(ctx)
	img, err := r.client.GetImage(nctx, base)
	if err != nil {
		return out, fmt.Errorf("build %s: base image %s is not in the daemon (import or pull it first): %w", spec.ID, base, err)
	}
	cs := r.client.ContentStore()
	manifest, err := images.Manifest(nctx, cs, img.Target(), platforms.Default())
	if err != nil {
		return out, fmt.Errorf("build %s: manifest of %s: %w", spec.ID, base, err)
	}
	var cfg ocispec.Image
	if err := readJSONBlob(nctx, cs, manifest.Config, &cfg); err != nil {
		return out, fmt.Errorf("build %s: config of %s: %w", spec.ID, base, err)
	}
	b, err := dockerfile.Parse(bytes.NewReader(df), dockerfile.Options{BuildArgs: spec.BuildArgs, BaseEnv: cfg.Config.Env})
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	manifestDigest, err := manifestDigestOf(nctx, cs, img.Target())
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	out.Key, err = buildKey(manifestDigest, df, spec.BuildArgs, spec.Context)
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	if name, ok, err := r.KeyedImage(ctx, out.Key); err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	} else if ok {
		out.Image, out.Cached = name, true
		return out, nil
	}

	ws, err := r.CreateWorkspace(ctx, spec.ID, spec.Limits.DiskBytes)
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	defer ws.Close(context.WithoutCancel(ctx))
	contextDir := filepath.Join(ws.Dir(), "context")
	if err := copyTree(spec.Context, contextDir); err != nil {
		return out, fmt.Errorf("build %s: copy the build context: %w", spec.ID, err)
	}
	if err := ws.Chown(ws.Dir(), 0, 0); err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	// The new layer and the image are written under a lease: nothing is
	// collected before the image record refers to it.
	lctx, done, err := r.client.WithLease(nctx)
	if err != nil {
		return out, fmt.Errorf("build %s: lease: %w", spec.ID, err)
	}
	defer done(context.WithoutCancel(nctx))
	var layer ocispec.Descriptor
	run := Spec{ID: spec.ID, Image: img.Name(), Entrypoint: []string{}, Args: []string{"/bin/sh", "-c", b.Script},
		Cwd: "/", User: "0:0", UserNamespace: true, Workspace: ws, Network: spec.Network, Proxy: spec.Proxy, Limits: spec.Limits,
		Mounts: []Mount{{Source: contextDir, Target: dockerfile.ContextDir, ReadOnly: true}},
		commit: func(_ context.Context, upper string, ids idmap.Range) error {
			// Mount points runc made for the build, not the Dockerfile's.
			skip := map[string]bool{dockerfile.ContextDir: true, aptProxyConf: true, "/etc/resolv.conf": true}
			layer, err = writeLayer(lctx, cs, "repronet-build-"+containerID(spec.ID), upper, ids, skip)
			return err
		}}
	start := time.Now()
	res, err := r.Run(ctx, run)
	out.Run = res
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	if res.Outcome != OutcomeOK {
		return out, fmt.Errorf("build %s: the Dockerfile's steps failed: %s (%s)", spec.ID, res.Outcome, res.Detail)
	}
	out.Layer = layer.Size

	// The image: the base's layers and the new one; the base's config
	// updated by the Dockerfile.
	cfg.Config.Env = b.Config.Env
	if b.Config.WorkingDir != "" {
		cfg.Config.WorkingDir = b.Config.WorkingDir
	}
	if b.Config.User != "" {
		cfg.Config.User = b.Config.User
	}
	if b.Config.Entrypoint != nil {
		cfg.Config.Entrypoint, cfg.Config.Cmd = b.Config.Entrypoint, nil
	}
	if b.Config.Cmd != nil {
		cfg.Config.Cmd = b.Config.Cmd
	}
	cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, layer.Digest)
	now := time.Now().UTC()
	cfg.Created = &now
	cfg.History = append(cfg.History, ocispec.History{Created: &now, CreatedBy: "repronet BuildEnvironment " + spec.ID,
		Comment: fmt.Sprintf("%d Dockerfile steps", b.Steps)})
	cfgDesc, err := writeJSONBlob(lctx, cs, ocispec.MediaTypeImageConfig, cfg)
	if err != nil {
		return out, fmt.Errorf("build %s: config: %w", spec.ID, err)
	}
	m := ocispec.Manifest{Versioned: specsv.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cfgDesc, Layers: append(append([]ocispec.Descriptor{}, manifest.Layers...), layer)}
	mDesc, err := writeJSONBlob(lctx, cs, ocispec.MediaTypeImageManifest, m)
	if err != nil {
		return out, fmt.Errorf("build %s: manifest: %w", spec.ID, err)
	}
	if err := images.Walk(lctx, images.SetChildrenLabels(cs, images.ChildrenHandler(cs)), mDesc); err != nil {
		return out, fmt.Errorf("build %s: label content: %w", spec.ID, err)
	}
	r.importMu.Lock()
	out.Image, err = r.registerKeyed(nctx, lctx, out.Key, mDesc)
	r.importMu.Unlock()
	if err != nil {
		return out, fmt.Errorf("build %s: %w", spec.ID, err)
	}
	r.log.Info("environment built", "build", spec.ID, "from", base, "image", out.Image, "steps", b.Steps,
		"layer_bytes", layer.Size, "took", time.Since(start))
	return out, nil
}

// manifestDigestOf is the digest of the platform's manifest under target.
func manifestDigestOf(ctx context.Context, cs content.Store, target ocispec.Descriptor) (digest.Digest, error) {
	switch target.MediaType {
	case ocispec.MediaTypeImageIndex, images.MediaTypeDockerSchema2ManifestList:
	default:
		return target.Digest, nil
	}
	children, err := images.Children(ctx, cs, target)
	if err != nil {
		return "", fmt.Errorf("manifests of %s: %w", target.Digest, err)
	}
	match := platforms.Default()
	for _, d := range children {
		if d.Platform == nil || match.Match(*d.Platform) {
			return d.Digest, nil
		}
	}
	return "", fmt.Errorf("no manifest for %s in %s", platforms.DefaultString(), target.Digest)
}

// buildKey hashes what the built image depends on.
func buildKey(base digest.Digest, df []byte, args map[string]string, contextDir string) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "repronet build 1\nbase %s\ndockerfile %d\n", base, len(df))
	h.Write(df)
	keys := make([]string, 0, len(args))
	for k := range args {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "arg %q=%q\n", k, args[k])
	}
	if contextDir != "" {
		err := filepath.WalkDir(contextDir, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, _ := filepath.Rel(contextDir, p)
			info, err := d.Info()
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "file %q %o %d\n", rel, info.Mode(), info.Size())
			switch {
			case info.Mode()&fs.ModeSymlink != 0:
				t, err := os.Readlink(p)
				if err != nil {
					return err
				}
				fmt.Fprintf(h, "link %q\n", t)
			case info.Mode().IsRegular():
				f, err := os.Open(p)
				if err != nil {
					return err
				}
				_, err = io.Copy(h, f)
				f.Close()
				return err
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("hash the build context: %w", err)
		}
	}
	return "env-" + hex.EncodeToString(h.Sum(nil))[:40], nil
}

// copyTree copies src (files, folders, symbolic links as they are) to dst;
// an empty src makes an empty dst.
func copyTree(src, dst string) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	if src == "" {
		return nil
	}
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." {
			return nil
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(to, info.Mode().Perm())
		case info.Mode()&fs.ModeSymlink != 0:
			t, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(t, to)
		case info.Mode().IsRegular():
			in, err := os.Open(p)
			if err != nil {
				return err
			}
			defer in.Close()
			o, err := os.OpenFile(to, os.O_CREATE|os.O_EXCL|os.O_WRONLY, info.Mode().Perm())
			if err != nil {
				return err
			}
			if _, err := io.Copy(o, in); err != nil {
				o.Close()
				return err
			}
			return o.Close()
		}
		return fmt.Errorf("%s: not a file, folder or symbolic link", p)
	})
}

func readJSONBlob(ctx context.Context, cs content.Store, desc ocispec.Descriptor, v any) error {
	b, err := content.ReadBlob(ctx, cs, desc)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func writeJSONBlob(ctx context.Context, cs content.Store, mediaType string, v any) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(ctx, cs, desc.Digest.String(), bytes.NewReader(b), desc); err != nil {
		return ocispec.Descriptor{}, err
	}
	return desc, nil
}

// writeLayer writes an overlay upper folder as an uncompressed OCI layer
// into the content store: owners in ids mapped back to container IDs,
// overlayfs whiteouts (0/0 character devices) as .wh. files, opaque
// folders with .wh..wh..opq, hard links kept, the container paths in skip
// left out when they are empty (runc's mount points).
func writeLayer(ctx context.Context, cs content.Store, ref, upper string, ids idmap.Range, skip map[string]bool) (ocispec.Descriptor, error) {
	w, err := content.OpenWriter(ctx, cs, content.WithRef(ref+"-"+fmt.Sprint(time.Now().UnixNano())))
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("open layer writer: %w", err)
	}
	defer w.Close()
	cw := &byteCounter{w: w}
	tw := tar.NewWriter(cw)
	hardlinks := map[[2]uint64]string{}
	mapID := func(id uint32) int {
		if ids.Contains(id) {
			return int(id - ids.HostID)
		}
		return int(id)
	}
	err = filepath.WalkDir(upper, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(upper, p)
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := info.Sys().(*syscall.Stat_t)
		if skip["/"+name] && (info.IsDir() || info.Mode().IsRegular()) && emptyEntry(p, info) {
			if info.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if info.Mode()&fs.ModeCharDevice != 0 && st.Rdev == 0 {
			dir, base := path.Split(name)
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dir + ".wh." + base, ModTime: info.ModTime(), Format: tar.FormatPAX})
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name, hdr.Uname, hdr.Gname, hdr.Format = name, "", "", tar.FormatPAX
		hdr.Uid, hdr.Gid = mapID(st.Uid), mapID(st.Gid)
		if info.IsDir() {
			hdr.Name += "/"
		}
		if fcap, err := getxattr(p, "security.capability"); err == nil && len(fcap) > 0 {
			hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": string(fcap)}
		}
		if info.Mode().IsRegular() && st.Nlink > 1 {
			k := [2]uint64{uint64(st.Dev), st.Ino}
			if first, ok := hardlinks[k]; ok {
				hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			} else {
				hardlinks[k] = name
			}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.IsDir() {
			if v, err := getxattr(p, "trusted.overlay.opaque"); err == nil && string(v) == "y" {
				if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name + "/.wh..wh..opq", ModTime: info.ModTime(), Format: tar.FormatPAX}); err != nil {
					return err
				}
			}
		}
		if hdr.Typeflag == tar.TypeReg {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("write layer from %s: %w", upper, err)
	}
	if err := tw.Close(); err != nil {
		return ocispec.Descriptor{}, err
	}
	if err := w.Commit(ctx, cw.n, ""); err != nil && !errdefs.IsAlreadyExists(err) {
		return ocispec.Descriptor{}, fmt.Errorf("commit layer: %w", err)
	}
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayer, Digest: w.Digest(), Size: cw.n}, nil
}

// emptyEntry: an empty folder or an empty file.
func emptyEntry(p string, info fs.FileInfo) bool {
	if info.Mode().IsRegular() {
		return info.Size() == 0
	}
	entries, err := os.ReadDir(p)
	return err == nil && len(entries) == 0
}

func getxattr(p, name string) ([]byte, error) {
	buf := make([]byte, 256)
	n, err := unix.Lgetxattr(p, name, buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}

// byteCounter counts what passes.
type byteCounter struct {
	w io.Writer
	n int64
}

func (c *byteCounter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// PullOptions tune PullImage.
type PullOptions struct {
	// Client makes the registry requests (default http.DefaultClient); a
	// node routes it through its egress proxy (a session on loopback
	// whose hosts are the registries it allows), so that a pull reaches
	// the registries on that list and nothing else.
	Client *http.Client
	// PlainHTTP speaks HTTP, not HTTPS, to the registry (a mirror on the
	// node's LAN; tests).
	PlainHTTP bool
	// Mirrors are registries tried first, in order, for the images of a
	// registry host as references name it ("docker.io"): base URLs
	// ("http://mirror.lan:5000", "https://mirror.example.org") whose
	// registry API is at /v2 (ParseMirror). The registry itself is tried
	// after them.
	Mirrors map[string][]string
}

// ParseMirror reads a registry mirror as a node's flag gives it,
// REGISTRY=URL ("docker.io=http://mirror.lan:5000"): the registry host
// references name, and the mirror's base URL (http or https, a host name
// and an optional port, no path, query or credentials).
func ParseMirror(s string) (registry, mirror string, err error) {
	registry, mirror, ok := strings.Cut(s, "=")
	if !ok || registry == "" || strings.ContainsAny(registry, "/ ") {
		return "", "", fmt.Errorf("registry mirror %q: want REGISTRY=URL (e.g. docker.io=http://mirror.lan:5000)", s)
	}
	u, err := url.Parse(mirror)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return "", "", fmt.Errorf("registry mirror %q: the mirror must be an http:// or https:// URL with a host and no path", s)
	}
	return registry, u.Scheme + "://" + u.Host, nil
}

// PullImage pulls ref (e.g. a Dockerfile's FROM) from its registry (or
// its mirrors) for the host platform, unpacks it and returns its name.
// Registries that ask for a token get one anonymously (Docker Hub's
// auth.docker.io), through the same client. The image joins the
// keyed-image cache and its quota (keyed by its name).
func (r *Runner) PullImage(ctx context.Context, ref string, opts PullOptions) (string, error) {
	name, err := ociimage.FullRef(ref)
	if err != nil {
		return "", err
	}
	hc := opts.Client
	if hc == nil {
		hc = http.DefaultClient
	}
	auth := docker.NewDockerAuthorizer(docker.WithAuthClient(hc))
	ropts := []docker.RegistryOpt{docker.WithClient(hc), docker.WithAuthorizer(auth)}
	if opts.PlainHTTP {
		ropts = append(ropts, docker.WithPlainHTTP(func(string) (bool, error) { return true, nil }))
	}
	registries := docker.ConfigureDefaultRegistries(ropts...)
	mirrors := map[string][]docker.RegistryHost{}
	for reg, urls := range opts.Mirrors {
		for _, m := range urls {
			_, base, err := ParseMirror(reg + "=" + m)
			if err != nil {
				return "", fmt.Errorf("pull %s: %w", name, err)
			}
			u, _ := url.Parse(base)
			mirrors[reg] = append(mirrors[reg], docker.RegistryHost{Client: hc, Authorizer: auth, Host: u.Host,
				Scheme: u.Scheme, Path: "/v2", Capabilities: docker.HostCapabilityPull | docker.HostCapabilityResolve})
		}
	}
	hosts := func(host string) ([]docker.RegistryHost, error) {
		up, err := registries(host)
		if err != nil {
			return nil, err
		}
		return append(slices.Clone(mirrors[host]), up...), nil
	}
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: hosts})
	r.importMu.Lock()
	defer r.importMu.Unlock()
	nctx := r.nsCtx(ctx)
	start := time.Now()
	img, err := r.client.Pull(nctx, name, client.WithResolver(resolver), client.WithPullUnpack,
		client.WithPullSnapshotter(r.snapshotter), client.WithPlatformMatcher(platforms.Default()))
	if err != nil {
		return "", fmt.Errorf("pull %s: %w", name, err)
	}
	size, err := img.Usage(nctx, client.WithSnapshotUsage())
	if err != nil {
		return "", fmt.Errorf("size of image %s: %w", name, err)
	}
	is := r.client.ImageService()
	if _, err := is.Update(nctx, images.Image{Name: name, Labels: map[string]string{LabelImageKey: name,
		labelImageUsed: strconv.FormatInt(time.Now().UnixNano(), 10), labelImageBytes: strconv.FormatInt(size, 10)}},
		"labels."+LabelImageKey, "labels."+labelImageUsed, "labels."+labelImageBytes); err != nil {
		return "", fmt.Errorf("label image %s: %w", name, err)
	}
	r.log.Info("pulled image", "image", name, "bytes", size, "took", time.Since(start))
	if _, err := r.pruneImages(nctx, name); err != nil {
		r.log.Warn("prune image cache", "err", err)
	}
	return name, nil
}
