// Package sandbox runs one attempt of an untrusted agent in one containerd
// container: resource limits (CPU quota, memory without swap, pids, a disk
// quota, wall clock, output size), containment (no new privileges, default
// capabilities and seccomp profile, a non-root user or root in a user
// namespace of its own mapped to an unprivileged host ID range, an optional
// read-only root, no host path but the attempt's own workspace, no network,
// an egress allow-list of addresses, or only the node's egress proxy, which
// allows host names — see the egress subpackage), the outcome class, captured output, resource
// use, and cleanup that always runs and, after a crash, Reconcile. It also
// keeps a private containerd daemon (daemon.go), a small keyed image cache
// with a quota (images.go), imports agent images from OCI tarballs (see
// the ociimage subpackage), pulls images, and builds a capsule's
// Dockerfile into an image in the sandbox itself (build.go, see the
// dockerfile subpackage); GPUs come from the gpu subpackage.
//
// It owns, in containerd: its namespace (default "repronet"), the
// containers, tasks and snapshots labelled "repronet.attempt", the images it
// imported under a key, and the daemon directory. On the host: its state
// folder (default /var/lib/repronet/sandbox/<namespace>) with each attempt's
// disk image, mounts, idmapped layer mounts and loop device
// (sandbox/loopfs), each workspace's claim on a host ID range
// (sandbox/idmap), and each egress attempt's network namespace name, veth
// pair and nftables table, named with a tag derived from the state folder
// (sandbox/netns). It knows nothing of libp2p, capsules, suites or grading,
// and touches no host path except its state folder and the bind mounts a
// Spec names.
package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	digest "github.com/opencontainers/go-digest"

	"github.com/repronet/repronet/sandbox/idmap"
	"github.com/repronet/repronet/sandbox/loopfs"
	"github.com/repronet/repronet/sandbox/netns"
)

// LabelAttempt labels every container and snapshot the sandbox creates; its
// value is the attempt ID. Reconcile removes whatever carries it.
const LabelAttempt = "repronet.attempt"

// DefaultStateDir is the parent of each Runner's state folder
// (DefaultStateDir/<namespace>): attempts' disk images and mounts.
const DefaultStateDir = "/var/lib/repronet/sandbox"

// DefaultImageCacheBytes is the default quota of keyed images.
const DefaultImageCacheBytes = 10 << 30

const (
	defaultNamespace   = "repronet"
	defaultSnapshotter = "overlayfs"
	// cleanupTimeout bounds every cleanup step; cleanup runs on a context
	// detached from the caller's so that a cancelled attempt still cleans up.
	cleanupTimeout = 30 * time.Second
)

// Option configures a Runner.
type Option func(*options)

type options struct {
	namespace   string
	snapshotter string
	stateDir    string
	egressPool  netip.Prefix
	imageQuota  int64
	ids         idmap.Config
	log         *slog.Logger
}

// WithNamespace sets the containerd namespace (default "repronet").
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithSnapshotter sets the snapshotter for image unpacking and container
// root filesystems (default "overlayfs").
func WithSnapshotter(name string) Option { return func(o *options) { o.snapshotter = name } }

// WithStateDir sets the Runner's state folder, where attempts' disk images
// are kept and mounted (default DefaultStateDir/<namespace>). It must be on
// a filesystem with room for what attempts write (the images are sparse),
// and belong to this Runner alone: Reconcile removes whatever it finds there,
// and the network namespaces and tables named after it. Two Runners on one
// host that use the same containerd namespace on different daemons need
// different state folders.
func WithStateDir(dir string) Option { return func(o *options) { o.stateDir = dir } }

// WithEgressPool sets the IPv4 pool egress attempts' links are carved from,
// a /30 each (default netns.DefaultPool, 10.213.0.0/16). Runners on one host
// may share it.
func WithEgressPool(p netip.Prefix) Option { return func(o *options) { o.egressPool = p } }

// WithImageCacheBytes sets the quota of images imported with
// ImportKeyedImage (default DefaultImageCacheBytes): past it, the least
// recently used are removed.
func WithImageCacheBytes(n int64) Option { return func(o *options) { o.imageQuota = n } }

// WithIDPool sets the pool of host user and group ID ranges that
// workspaces get for user-namespaced attempts (default: idmap's, 4096
// ranges of 65536 IDs from host ID 2^30, claims under /run/repronet/idmap).
// Runners on one host may share it: claims are host-wide.
func WithIDPool(cfg idmap.Config) Option { return func(o *options) { o.ids = cfg } }

// WithLogger sets the structured logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.log = l } }

// Runner runs attempts in containers of one containerd daemon. It is safe for
// concurrent use; attempts with the same ID may not run at the same time.
type Runner struct {
	client      *client.Client
	namespace   string
	snapshotter string
	stateDir    string
	tag         string // names host objects: 8 hex digits of the state folder's SHA-256
	egressPool  netip.Prefix
	imageQuota  int64
	ids         *idmap.Pool
	log         *slog.Logger
	tools       *tools

	mu         sync.Mutex
	inflight   map[string]bool // container IDs of running attempts
	workspaces map[string]bool // container IDs of open workspaces
	images     map[string]int  // image names in use by running attempts
	net        *netns.Manager  // made on first use
	importMu   sync.Mutex      // serialises keyed imports and pruning
}

// New connects to the containerd daemon at socket and checks that it answers.
func New(ctx context.Context, socket string, opts ...Option) (*Runner, error) {
	o := options{namespace: defaultNamespace, snapshotter: defaultSnapshotter}
	for _, opt := range opts {
		opt(&o)
	}
	if o.log == nil {
		o.log = slog.Default()
	}
	if err := identifiers.Validate(o.namespace); err != nil {
		return nil, fmt.Errorf("containerd namespace %q: %w", o.namespace, err)
	}
	if !strings.Contains(socket, "://") {
		if _, err := os.Stat(socket); err != nil {
			return nil, fmt.Errorf("containerd socket: %w", err)
		}
	}
	if o.stateDir == "" {
		o.stateDir = filepath.Join(DefaultStateDir, o.namespace)
	}
	stateDir, err := filepath.Abs(o.stateDir)
	if err != nil {
		return nil, fmt.Errorf("state folder: %w", err)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("create state folder: %w", err)
	}
	// Mount tables and loop devices name real paths.
	if stateDir, err = filepath.EvalSymlinks(stateDir); err != nil {
		return nil, fmt.Errorf("state folder: %w", err)
	}
	if o.imageQuota <= 0 {
		o.imageQuota = DefaultImageCacheBytes
	}
	ids, err := idmap.NewPool(o.ids)
	if err != nil {
		return nil, err
	}
	c, err := client.New(socket, client.WithDefaultNamespace(o.namespace))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", socket, err)
	}
	// The tag names this Runner's host objects (network namespaces, tables):
	// it follows the state folder, which belongs to one Runner.
	sum := sha256.Sum256([]byte(stateDir))
	log := o.log.With("component", "sandbox")
	r := &Runner{
		client:      c,
		namespace:   o.namespace,
		snapshotter: o.snapshotter,
		stateDir:    stateDir,
		tag:         hex.EncodeToString(sum[:4]),
		egressPool:  o.egressPool,
		imageQuota:  o.imageQuota,
		ids:         ids,
		log:         log,
		tools:       newTools(log),
		inflight:    map[string]bool{},
		workspaces:  map[string]bool{},
		images:      map[string]int{},
	}
	vctx, cancel := context.WithTimeout(r.nsCtx(ctx), 10*time.Second)
	defer cancel()
	v, err := c.Version(vctx)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("containerd at %s does not answer: %w", socket, err)
	}
	r.log.Debug("connected to containerd", "socket", socket, "version", v.Version, "namespace", o.namespace,
		"snapshotter", o.snapshotter, "state_dir", stateDir)
	return r, nil
}

// Close closes the connection to containerd. Attempts still running are not
// stopped by it; their own contexts govern them.
func (r *Runner) Close() error {
	if err := r.client.Close(); err != nil {
		return fmt.Errorf("close containerd client: %w", err)
	}
	return nil
}

func (r *Runner) nsCtx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.namespace)
}

// ImportImage imports an OCI image-layout tarball (as made by ociimage.Build,
// or any OCI layout tar) for the host platform, unpacks it into the
// snapshotter and returns the image name: the io.containerd.image.name
// annotation, else org.opencontainers.image.ref.name, else
// "repronet.local/import@<manifest digest>" for an unnamed image. When the
// tarball names several images the first is returned.
func (r *Runner) ImportImage(ctx context.Context, tarball io.Reader) (string, error) {
	ctx = r.nsCtx(ctx)
	imgs, err := r.client.Import(ctx, tarball,
		client.WithDigestRef(func(d digest.Digest) string { return "repronet.local/import@" + d.String() }),
		client.WithSkipDigestRef(func(name string) bool { return name != "" }),
	)
	if err != nil {
		return "", fmt.Errorf("import image tarball: %w", err)
	}
	if len(imgs) == 0 {
		return "", errors.New("import image tarball: it holds no image")
	}
	for _, img := range imgs {
		start := time.Now()
		if err := client.NewImage(r.client, img).Unpack(ctx, r.snapshotter); err != nil {
			return "", fmt.Errorf("unpack image %s into %s: %w", img.Name, r.snapshotter, err)
		}
		r.log.Info("imported image", "image", img.Name, "digest", img.Target.Digest, "unpack", time.Since(start))
	}
	return imgs[0].Name, nil
}

// HasImage reports whether the image ref is known and all of its content for
// the host platform is present.
func (r *Runner) HasImage(ctx context.Context, ref string) (bool, error) {
	ctx = r.nsCtx(ctx)
	img, err := r.client.ImageService().Get(ctx, ref)
	if errdefs.IsNotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up image %s: %w", ref, err)
	}
	available, _, _, missing, err := images.Check(ctx, r.client.ContentStore(), img.Target, platforms.Default())
	if err != nil {
		return false, fmt.Errorf("check content of image %s: %w", ref, err)
	}
	return available && len(missing) == 0, nil
}

// Reconcile removes the leftovers of a crash: every container (with its
// task) and snapshot labelled LabelAttempt in the Runner's namespace, every
// attempt state folder (unmounting its filesystems and detaching its loop
// devices), every network namespace and nftables table carrying the
// Runner's tag, and every host ID range claimed under the tag — except those of attempts this Runner is running now or
// whose workspace is open. It returns how many objects it removed. Give each
// Runner a namespace (and state folder) of its own: attempts of another
// process in the same namespace look like leftovers.
func (r *Runner) Reconcile(ctx context.Context) (int, error) {
	ctx = r.nsCtx(ctx)
	removed := 0
	var errs []error
	ctrs, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q", LabelAttempt))
	if err != nil {
		return 0, fmt.Errorf("list containers: %w", err)
	}
	for _, c := range ctrs {
		if r.isInflight(c.ID()) {
			continue
		}
		if err := r.removeContainer(ctx, c); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
		r.log.Info("reconcile: removed leftover container", "container", c.ID())
	}

	sn := r.client.SnapshotService(r.snapshotter)
	var stray []string
	err = sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		owner := info.Name
		if c, ok := info.Labels[labelContainer]; ok {
			owner = c
		}
		if _, ok := info.Labels[LabelAttempt]; ok && !r.isInflight(owner) {
			stray = append(stray, info.Name)
		}
		return nil
	})
	if err != nil {
		errs = append(errs, fmt.Errorf("list snapshots: %w", err))
	}
	for _, key := range stray {
		if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove snapshot %s: %w", key, err))
			continue
		}
		removed++
		r.log.Info("reconcile: removed leftover snapshot", "snapshot", key)
	}

	n, err := r.reconcileHost(ctx)
	removed += n
	if err != nil {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// reconcileHost removes network namespaces, nftables tables and state
// folders of attempts that are neither running nor holding a workspace.
func (r *Runner) reconcileHost(ctx context.Context) (int, error) {
	removed := 0
	var errs []error
	keep := r.busyIDs()
	if m, err := r.netManager(ctx, false); err != nil {
		errs = append(errs, err)
	} else if m != nil {
		n, err := m.Sweep(ctx, keep)
		removed += n
		if err != nil {
			errs = append(errs, fmt.Errorf("remove leftover network namespaces: %w", err))
		}
	}
	entries, err := os.ReadDir(r.stateDir)
	if err != nil {
		errs = append(errs, fmt.Errorf("list state folder: %w", err))
	}
	kept := map[string]bool{}
	for _, id := range keep {
		kept[id] = true
	}
	for _, e := range entries {
		if kept[e.Name()] {
			continue
		}
		if err := removeHostState(filepath.Join(r.stateDir, e.Name())); err != nil {
			errs = append(errs, fmt.Errorf("remove leftover state %s: %w", e.Name(), err))
			continue
		}
		removed++
		r.log.Info("reconcile: removed leftover attempt state", "dir", filepath.Join(r.stateDir, e.Name()))
	}
	// ID ranges of attempts that are gone.
	n, err := r.ids.ReleaseMatching(ctx, func(owner string) bool {
		id, ok := strings.CutPrefix(owner, r.tag+"/")
		return ok && !kept[id]
	})
	removed += n
	if err != nil {
		errs = append(errs, fmt.Errorf("release leftover ID ranges: %w", err))
	}
	// Loop devices backed by files under the state folder that is no longer
	// there (e.g. deleted by hand while mounted elsewhere) are detached too.
	devs, err := loopfs.DevicesBackedBy(func(p string) bool {
		rel, err := filepath.Rel(r.stateDir, p)
		if err != nil || strings.HasPrefix(rel, "..") {
			return false
		}
		return !kept[strings.Split(rel, string(filepath.Separator))[0]]
	})
	if err != nil {
		errs = append(errs, err)
	}
	for _, d := range devs {
		if err := loopfs.Detach(d); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
		r.log.Info("reconcile: detached leftover loop device", "device", d)
	}
	return removed, errors.Join(errs...)
}

// netManager returns the egress network manager, making it on first use.
// With install set, missing programs are installed; without, a host lacking
// them gets a nil Manager (it cannot hold any of our namespaces either).
func (r *Runner) netManager(ctx context.Context, install bool) (*netns.Manager, error) {
	r.mu.Lock()
	m := r.net
	r.mu.Unlock()
	if m != nil {
		return m, nil
	}
	var ip, nft string
	var err error
	if install {
		if ip, err = r.tools.path(ctx, "ip"); err != nil {
			return nil, err
		}
		if nft, err = r.tools.path(ctx, "nft"); err != nil {
			return nil, err
		}
	} else {
		if ip, err = lookPath("ip"); err != nil {
			return nil, nil
		}
		if nft, err = lookPath("nft"); err != nil {
			return nil, nil
		}
	}
	m, err = netns.NewManager(netns.Config{Tag: r.tag, Pool: r.egressPool, IP: ip, Nft: nft, Logger: r.log})
	if err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.net == nil {
		r.net = m
	}
	return r.net, nil
}

// removeContainer kills and deletes the container's task, if any, then the
// container and its snapshot.
func (r *Runner) removeContainer(ctx context.Context, c client.Container) error {
	task, err := c.Task(ctx, nil)
	switch {
	case err == nil:
		if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task of container %s: %w", c.ID(), err)
		}
	case !errdefs.IsNotFound(err):
		return fmt.Errorf("load task of container %s: %w", c.ID(), err)
	}
	if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container %s: %w", c.ID(), err)
	}
	return nil
}

func (r *Runner) claim(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inflight[id] {
		return false
	}
	r.inflight[id] = true
	return true
}

func (r *Runner) release(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.inflight, id)
}

func (r *Runner) isInflight(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inflight[id] || r.workspaces[id]
}

func (r *Runner) claimWorkspace(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.workspaces[id] {
		return false
	}
	r.workspaces[id] = true
	return true
}

func (r *Runner) releaseWorkspace(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.workspaces, id)
}

// busyIDs lists the container IDs of running attempts and open workspaces.
func (r *Runner) busyIDs() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.inflight)+len(r.workspaces))
	for id := range r.inflight {
		out = append(out, id)
	}
	for id := range r.workspaces {
		if !r.inflight[id] {
			out = append(out, id)
		}
	}
	return out
}

func (r *Runner) useImage(name string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.images[name] += delta
	if r.images[name] <= 0 {
		delete(r.images, name)
	}
}

func (r *Runner) imageInUse(name string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.images[name] > 0
}

// containerID derives a valid, unique containerd identifier from an attempt
// ID: "rn-", the ID with anything outside [A-Za-z0-9._-] replaced (at most 40
// characters), and 12 hex digits of the ID's SHA-256 so that distinct IDs
// never collide after sanitising.
func containerID(attempt string) string {
	var b strings.Builder
	sep := true // suppress leading and doubled separators
	for _, ch := range attempt {
		switch {
		case ch >= 'a' && ch <= 'z', ch >= 'A' && ch <= 'Z', ch >= '0' && ch <= '9':
			b.WriteRune(ch)
			sep = false
		default:
			if !sep {
				b.WriteByte('-')
				sep = true
			}
		}
		if b.Len() >= 40 {
			break
		}
	}
	s := strings.TrimRight(b.String(), "-")
	if len(s) > 40 {
		s = strings.TrimRight(s[:40], "-")
	}
	sum := sha256.Sum256([]byte(attempt))
	if s == "" {
		return "rn-" + hex.EncodeToString(sum[:6])
	}
	return "rn-" + s + "-" + hex.EncodeToString(sum[:6])
}

// validateSpec checks what containerd would otherwise reject late or wrongly.
func validateSpec(spec Spec) error {
	if spec.ID == "" {
		return errors.New("attempt ID is empty")
	}
	if spec.Image == "" {
		return errors.New("image is empty")
	}
	if spec.Cwd != "" && !path.IsAbs(spec.Cwd) {
		return fmt.Errorf("working directory %q is not absolute", spec.Cwd)
	}
	for _, m := range spec.Mounts {
		if !path.IsAbs(m.Source) || !path.IsAbs(m.Target) {
			return fmt.Errorf("mount %s -> %s: source and target must be absolute", m.Source, m.Target)
		}
		if path.Clean(m.Target) == "/" {
			return fmt.Errorf("mount %s: target may not be /", m.Source)
		}
		if _, err := os.Stat(m.Source); err != nil {
			return fmt.Errorf("mount source: %w", err)
		}
	}
	for _, e := range spec.Env {
		if !strings.Contains(e, "=") {
			return fmt.Errorf("environment entry %q is not KEY=value", e)
		}
	}
	for _, im := range spec.ImageMounts {
		if im.Image == "" {
			return errors.New("image mount with no image")
		}
		if !path.IsAbs(im.Target) || path.Clean(im.Target) == "/" {
			return fmt.Errorf("image mount %s: target %q must be absolute and not /", im.Image, im.Target)
		}
		if im.Source != "" && (!path.IsAbs(im.Source) || path.Clean(im.Source) != im.Source) {
			return fmt.Errorf("image mount %s: source %q must be absolute and clean", im.Image, im.Source)
		}
	}
	if w := spec.Workspace; w != nil {
		if w.Attempt() != spec.ID {
			return fmt.Errorf("workspace was made for attempt %q, not %q", w.Attempt(), spec.ID)
		}
		if w.isClosed() {
			return errors.New("workspace is closed")
		}
	}
	if err := spec.GPUs.Validate(); err != nil {
		return err
	}
	if err := validateServices(spec.Services); err != nil {
		return err
	}
	return spec.Network.Validate()
}

// resolveMounts returns the spec's mounts with sources resolved. With a
// Workspace, every source must lie inside it once symlinks are resolved: an
// attempt sees no host path but its own workspace.
func resolveMounts(spec Spec) ([]Mount, error) {
	out := make([]Mount, len(spec.Mounts))
	for i, m := range spec.Mounts {
		out[i] = m
		if spec.Workspace == nil {
			continue
		}
		real, ok := spec.Workspace.contains(m.Source)
		if !ok {
			return nil, fmt.Errorf("mount %s -> %s: source is not inside the attempt's workspace %s", m.Source, m.Target, spec.Workspace.Dir())
		}
		out[i].Source = real
	}
	return out, nil
}
