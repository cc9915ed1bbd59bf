package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/netip"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	eventstypes "github.com/containerd/containerd/api/events"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"
	"github.com/opencontainers/image-spec/identity"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/repronet/repronet/sandbox/gpu"
	"github.com/repronet/repronet/sandbox/idmap"
	"github.com/repronet/repronet/sandbox/loopfs"
	"github.com/repronet/repronet/sandbox/netns"

	cgroup1stats "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2stats "github.com/containerd/cgroups/v3/cgroup2/stats"
)

// defaultUser is the unprivileged agent user of images built by ociimage.
const defaultUser = "1000:1000"

// oomScoreAdj makes agent processes the host OOM killer's first choice.
const oomScoreAdj = 500

// diskPollInterval is how often a running attempt's writable space is
// checked for being full.
const diskPollInterval = 200 * time.Millisecond

// labelContainer names, on a snapshot, the container it belongs to (an
// attempt has several snapshots when it mounts images besides its root).
const labelContainer = "repronet.container"

// labelGCRoot keeps containerd's garbage collector off a snapshot that no
// container references (the attempt's read-only view of its image).
const labelGCRoot = "containerd.io/gc.root"

// Run runs one attempt to its end and always removes everything it made for
// it — task, container, snapshot, mounts, loop device, network namespace and
// rules, and the private writable space when Spec.Workspace is nil — even
// when ctx is cancelled. The error is non-nil exactly when the outcome is
// OutcomeInfraError (containerd failed, the image is missing, the spec is
// invalid, or ctx ended); an agent's failure is a Result, not an error.
func (r *Runner) Run(ctx context.Context, spec Spec) (Result, error) {
	begin := time.Now()
	res := Result{ExitCode: -1}
	lim := spec.Limits.withDefaults()
	cid := containerID(spec.ID)
	log := r.log.With("attempt", spec.ID, "container", cid)
	infra := func(detail string, err error) (Result, error) {
		res.Outcome, res.Detail = OutcomeInfraError, detail+": "+err.Error()
		log.Error("attempt failed on infrastructure", "detail", detail, "err", err)
		return res, fmt.Errorf("attempt %s: %s: %w", spec.ID, detail, err)
	}
	if err := validateSpec(spec); err != nil {
		return infra("invalid spec", err)
	}
	mounts, err := resolveMounts(spec)
	if err != nil {
		return infra("invalid spec", err)
	}
	if !r.claim(cid) {
		return infra("claim container", fmt.Errorf("attempt %q is already running", spec.ID))
	}
	defer r.release(cid)
	ctx = r.nsCtx(ctx)
	// Cleanup and post-mortem reads use a context that outlives ctx. So do
	// the calls that create an object of the attempt (snapshot, container,
	// task): cancelled halfway, such a call may still create its object
	// after the cleanup ran. Their callers check ctx between steps instead.
	detached := context.WithoutCancel(ctx)
	td := &teardown{log: log}
	defer td.run(detached)
	cancelled := func() (Result, error) { return infra("attempt cancelled", context.Cause(ctx)) }

	// In use from before the lookup, so that the image cache cannot prune it
	// in between.
	r.useImage(spec.Image, 1)
	defer r.useImage(spec.Image, -1)
	image, err := r.client.GetImage(ctx, spec.Image)
	if err != nil {
		return infra("look up image "+spec.Image, err)
	}
	if ok, err := image.IsUnpacked(ctx, r.snapshotter); err != nil {
		return infra("check image unpacked", err)
	} else if !ok {
		if err := image.Unpack(ctx, r.snapshotter); err != nil {
			return infra("unpack image", err)
		}
	}

	ws := spec.Workspace
	var wsDone chan error
	if ws == nil {
		if ctx.Err() != nil {
			return cancelled()
		}
		// Made while the image's view is prepared.
		wsDone = make(chan error, 1)
		go func() {
			w, err := r.createWorkspace(detached, spec.ID, cid, lim.DiskBytes)
			ws = w
			wsDone <- err
		}()
		td.add("remove writable space", func(context.Context) error {
			if ws == nil {
				return nil
			}
			return ws.teardown()
		})
	}
	joinWorkspace := func() error {
		if wsDone == nil {
			return nil
		}
		err := <-wsDone
		wsDone = nil
		return err
	}
	defer joinWorkspace() // before the teardown on early returns
	if ctx.Err() != nil {
		return cancelled()
	}
	view, err := r.viewImage(detached, log, cid, cid, spec.ID, image, td)
	if err != nil {
		return infra("prepare root filesystem", err)
	}
	imageViews := make([][]mount.Mount, len(spec.ImageMounts))
	for i, im := range spec.ImageMounts {
		r.useImage(im.Image, 1)
		defer r.useImage(im.Image, -1)
		img, err := r.client.GetImage(ctx, im.Image)
		if err != nil {
			return infra("look up image "+im.Image, err)
		}
		if ok, err := img.IsUnpacked(ctx, r.snapshotter); err != nil {
			return infra("check image unpacked", err)
		} else if !ok {
			if err := img.Unpack(ctx, r.snapshotter); err != nil {
				return infra("unpack image "+im.Image, err)
			}
		}
		if imageViews[i], err = r.viewImage(detached, log, cid, fmt.Sprintf("%s-image%d", cid, i), spec.ID, img, td); err != nil {
			return infra("view image "+im.Image, err)
		}
	}
	if err := joinWorkspace(); err != nil {
		return infra("create writable space", err)
	}
	rootfs, err := prepareRootfs(view, ws, spec.UserNamespace, td)
	if err != nil {
		return infra("prepare root filesystem", err)
	}
	var extraMounts []specs.Mount
	for i, im := range spec.ImageMounts {
		src, err := mountImageView(imageViews[i], ws, spec.UserNamespace, i, td)
		if err == nil {
			src, err = imageFolder(src, im.Source)
		}
		if err != nil {
			return infra("mount image "+im.Image, err)
		}
		extraMounts = append(extraMounts, specs.Mount{Destination: im.Target, Type: "bind", Source: src,
			Options: []string{"rbind", "rprivate", "ro", "nosuid", "nodev"}})
	}
	// Egress and proxy attempts: the link and its rules are made now, so
	// that the attempt's addresses are known for its spec; the link goes
	// into the container's own network namespace once the task exists.
	var (
		netm       *netns.Manager
		link       *netns.Netns
		proxyURL   string
		serviceEnv []string
		refused    uint64 // by the egress proxy, read after the teardown
	)
	if m := spec.Network.Mode; m == NetworkEgress || m == NetworkProxy || len(spec.Services) > 0 {
		if m == NetworkProxy && spec.Proxy == nil {
			return infra("proxy network", errors.New("no egress proxy given (Spec.Proxy)"))
		}
		if netm, err = r.netManager(ctx, true); err != nil {
			return infra("egress network", err)
		}
		if ctx.Err() != nil {
			return cancelled()
		}
		var rules []netns.Rule
		var gateway []uint16
		switch m {
		case NetworkEgress:
			rules = spec.Network.rules()
		case NetworkProxy:
			gateway = []uint16{ProxyPort}
		}
		for _, svc := range spec.Services {
			gateway = append(gateway, svc.Port)
		}
		if link, err = netm.Prepare(detached, cid, rules, gateway...); err != nil {
			return infra("create network link", err)
		}
		td.add("remove network namespace", func(c context.Context) error { return netm.Remove(c, cid) })
		if m == NetworkProxy {
			listen := netip.AddrPortFrom(link.Gateway, ProxyPort)
			stop, err := spec.Proxy.ServeAttempt(spec.ID, listen, link.Addr, spec.Network.Hosts)
			if err != nil {
				return infra("start egress proxy", err)
			}
			td.add("stop egress proxy", func(context.Context) error {
				refused = stop()
				return nil
			})
			proxyURL = "http://" + listen.String()
		}
		for _, svc := range spec.Services {
			listen := netip.AddrPortFrom(link.Gateway, svc.Port)
			stop, err := svc.Start(listen, link.Addr)
			if err != nil {
				return infra("start "+svc.Name, err)
			}
			td.add("stop "+svc.Name, func(context.Context) error { stop(); return nil })
			if svc.Env != nil {
				serviceEnv = append(serviceEnv, svc.Env(listen)...)
			}
		}
	}

	var cgroupsPath string
	newContainer := func() (client.Container, error) {
		opts, err := r.specOpts(image, spec, lim, mounts, extraMounts, ws, proxyURL, serviceEnv, imageHasDir(view, "etc/apt"), &cgroupsPath)
		if err != nil {
			return nil, err
		}
		return r.client.NewContainer(detached, cid,
			client.WithContainerLabels(map[string]string{LabelAttempt: spec.ID}),
			client.WithImageName(image.Name()),
			// The view snapshot stands in as the container's root while the
			// spec is generated, so that user and group names resolve
			// against the image's /etc files; the container itself keeps
			// no snapshot: its root is the overlay given to the task.
			client.WithSnapshotter(r.snapshotter),
			withSnapshotKey(cid),
			client.WithNewSpec(opts...),
			withSnapshotKey(""),
		)
	}
	if ctx.Err() != nil {
		return cancelled()
	}
	container, err := newContainer()
	if errdefs.IsAlreadyExists(err) {
		// A leftover of this very attempt (a crash before cleanup): remove and retry.
		log.Warn("removing leftover container of this attempt")
		cctx, cancel := context.WithTimeout(detached, cleanupTimeout)
		if old, lerr := r.client.LoadContainer(cctx, cid); lerr == nil {
			_ = r.removeContainer(cctx, old)
		}
		cancel()
		container, err = newContainer()
	}
	if err != nil {
		return infra("create container", err)
	}
	td.add("delete container", func(c context.Context) error {
		if err := container.Delete(c); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return nil
	})

	// Watch for OOM kills before the task exists so none is missed.
	evCtx, evCancel := context.WithCancel(detached)
	defer evCancel()
	var oomEvent atomic.Bool
	oomSeen := make(chan struct{})
	evCh, evErr := r.client.Subscribe(evCtx, `topic=="/tasks/oom"`)
	go func() {
		for {
			select {
			case env, ok := <-evCh:
				if !ok {
					return
				}
				ev, err := typeurl.UnmarshalAny(env.Event)
				if err != nil {
					continue
				}
				if oom, ok := ev.(*eventstypes.TaskOOM); ok && oom.ContainerID == cid && !oomEvent.Swap(true) {
					close(oomSeen)
				}
			case err, ok := <-evErr:
				if ok && err != nil && evCtx.Err() == nil {
					log.Warn("oom event subscription ended; relying on cgroup counters", "err", err)
				}
				return
			}
		}
	}()

	meter := newOutputMeter(lim.OutputBytes * OutputKillFactor)
	stdout := newRingBuffer(int(lim.OutputBytes), meter)
	stderr := newRingBuffer(int(lim.OutputBytes), meter)
	finish := func() {
		res.Stdout, res.StdoutTruncated = stdout.Bytes(), stdout.Truncated()
		res.Stderr, res.StderrTruncated = stderr.Bytes(), stderr.Truncated()
	}

	if ctx.Err() != nil {
		return cancelled()
	}
	// created: a command that cannot be executed fails while its task is
	// created or started, and its run lasted from here (never 0: a
	// report of no time at all could not be true).
	created := time.Now()
	task, err := container.NewTask(detached, cio.NewCreator(cio.WithStreams(nil, stdout, stderr)), client.WithRootFS(rootfs))
	if err != nil {
		if isExecFailure(err) {
			return r.execFailure(detached, &res, log, err, td, finish, created)
		}
		return infra("create task", err)
	}
	// WithProcessKill: a task still running (an error path) is killed
	// first. Deleting the task also waits for its output to be copied.
	td.addFirst("delete task", func(c context.Context) error {
		if _, err := task.Delete(c, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return nil
	})
	if link != nil {
		// The task's network namespace, made by runc (inside the user
		// namespace with UserNamespace), gets its link before the agent's
		// process starts.
		if ctx.Err() != nil {
			return cancelled()
		}
		if err := netm.Attach(detached, link, int(task.Pid())); err != nil {
			return infra("attach network link", err)
		}
		log.Debug("network ready", "netns", link.Netns, "addr", link.Addr, "rules", len(link.Rules), "proxy", proxyURL)
	}
	// Wait before Start, on a context that the caller's cancellation does not end.
	waitCtx, waitCancel := context.WithCancel(detached)
	defer waitCancel()
	statusC, err := task.Wait(waitCtx)
	if err != nil {
		return infra("wait for task", err)
	}
	if ctx.Err() != nil {
		return cancelled()
	}
	start := time.Now()
	if err := task.Start(detached); err != nil {
		if isExecFailure(err) {
			return r.execFailure(detached, &res, log, err, td, finish, created)
		}
		return infra("start task", err)
	}
	log.Info("attempt started", "image", spec.Image, "pid", task.Pid(),
		"cpu_millis", lim.CPUMillis, "memory_bytes", lim.MemoryBytes, "pids", lim.Pids, "wall", lim.Wall,
		"disk_bytes", ws.Size(), "network", spec.Network.Mode, "read_only_rootfs", spec.ReadOnlyRootfs,
		"user_namespace", spec.UserNamespace, "gpus", len(spec.GPUs.Devices))

	var diskFull atomic.Bool
	monitorDone := make(chan struct{})
	go func() {
		tick := time.NewTicker(diskPollInterval)
		defer tick.Stop()
		for {
			select {
			case <-monitorDone:
				return
			case <-tick.C:
				if _, full, err := ws.Usage(); err == nil && full {
					diskFull.Store(true)
				}
			}
		}
	}()

	deadline := time.NewTimer(lim.Wall)
	defer deadline.Stop()
	var (
		status   client.ExitStatus
		killedAs Outcome
		exited   bool
	)
	select {
	case status = <-statusC:
		exited = true
	case <-deadline.C:
		killedAs = OutcomeTimeout
	case <-meter.exceeded:
		killedAs = OutcomeOutputLimit
	case <-ctx.Done():
		killedAs = OutcomeInfraError
	}
	if !exited {
		kctx, cancel := context.WithTimeout(detached, cleanupTimeout)
		if err := task.Kill(kctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
			log.Warn("kill task", "err", err)
		}
		cancel()
		select {
		case status = <-statusC:
		case <-time.After(cleanupTimeout):
			close(monitorDone)
			res.Wall = time.Since(start)
			return infra("wait for killed task", errors.New("task did not exit after SIGKILL"))
		}
	}
	res.Wall = time.Since(start)
	close(monitorDone)
	code, _, werr := status.Result()
	if werr != nil {
		return infra("wait for task exit", werr)
	}
	res.ExitCode = int(code)

	// An OOM event can trail the exit; give it a moment when the exit looks like a kill.
	if killedAs == "" && code == 128+uint32(syscall.SIGKILL) && !oomEvent.Load() {
		select {
		case <-oomSeen:
		case <-time.After(200 * time.Millisecond):
		}
	}

	// Resource use from the cgroup, which lives until the task is deleted.
	var oomKills uint64
	mctx, mcancel := context.WithTimeout(detached, 10*time.Second)
	if m, err := task.Metrics(mctx); err != nil {
		log.Warn("read task metrics", "err", err)
	} else if u, err := parseMetrics(m); err != nil {
		log.Warn("parse task metrics", "err", err)
	} else {
		res.CPUSeconds, res.PeakMemoryBytes, oomKills = u.cpuSeconds, u.peakMemory, u.oomKills
	}
	mcancel()
	res.PeakPids = readPeakPids(cgroupsPath)
	if used, full, err := ws.Usage(); err != nil {
		log.Warn("read writable space usage", "err", err)
	} else {
		res.DiskUsedBytes = used
		res.DiskFull = full || diskFull.Load()
	}

	if spec.commit != nil && killedAs == "" && code == 0 && !oomEvent.Load() && oomKills == 0 {
		upper := filepath.Join(ws.privDir(), "rootfs", "upper")
		if err := spec.commit(detached, upper, ws.IDs()); err != nil {
			return infra("commit writable layer", err)
		}
	}
	exitedAt := time.Now()
	td.run(detached) // drains the output streams before the buffers are read
	teardownTook := time.Since(exitedAt)
	finish()
	res.EgressRefused = refused

	oom := oomEvent.Load() || oomKills > 0
	switch {
	case killedAs == OutcomeInfraError:
		return infra("attempt cancelled", context.Cause(ctx))
	case killedAs == OutcomeTimeout:
		res.Outcome, res.Detail = OutcomeTimeout, fmt.Sprintf("killed at the wall-clock limit of %s", lim.Wall)
	case killedAs == OutcomeOutputLimit:
		res.Outcome, res.Detail = OutcomeOutputLimit, fmt.Sprintf("killed after more than %d bytes of output", meter.ceiling)
	case oom:
		res.Outcome, res.Detail = OutcomeOOM, fmt.Sprintf("out of memory at the limit of %d bytes (exit code %d)", lim.MemoryBytes, code)
	case code == 0:
		res.Outcome = OutcomeOK
		if res.DiskFull {
			res.Detail = fmt.Sprintf("exited 0, but the writable space of %d bytes was full", ws.Size())
		}
	case res.DiskFull:
		res.Outcome, res.Detail = OutcomeDiskQuota, fmt.Sprintf("exit code %d with the writable space of %d bytes full", code, ws.Size())
	default:
		res.Outcome, res.Detail = OutcomeAgentError, fmt.Sprintf("exit code %d", code)
	}
	log.Info("attempt finished", "outcome", res.Outcome, "exit_code", res.ExitCode, "wall", res.Wall,
		"cpu_seconds", res.CPUSeconds, "peak_memory_bytes", res.PeakMemoryBytes, "peak_pids", res.PeakPids,
		"disk_used_bytes", res.DiskUsedBytes, "stdout_bytes", stdout.Total(), "stderr_bytes", stderr.Total(),
		"oom_event", oomEvent.Load(), "oom_kills", oomKills, "egress_refused", res.EgressRefused, "detail", res.Detail,
		"setup", start.Sub(begin), "teardown", teardownTook)
	return res, nil
}

// teardown runs cleanup steps once, each with a fresh timeout on a context
// the caller's cancellation does not end: first the steps added with
// addFirst (deleting the task, which unmounts the root filesystem and
// leaves the namespace), in reverse order, then all the others at once
// (they no longer depend on each other).
type teardown struct {
	log         *slog.Logger
	first, rest []teardownStep
	done        bool
}

type teardownStep struct {
	name string
	fn   func(context.Context) error
}

func (t *teardown) add(name string, fn func(context.Context) error) {
	t.rest = append(t.rest, teardownStep{name, fn})
}

func (t *teardown) addFirst(name string, fn func(context.Context) error) {
	t.first = append(t.first, teardownStep{name, fn})
}

func (t *teardown) run(ctx context.Context) {
	if t.done {
		return
	}
	t.done = true
	do := func(s teardownStep) {
		sctx, cancel := context.WithTimeout(ctx, cleanupTimeout)
		defer cancel()
		if err := s.fn(sctx); err != nil {
			// Reconcile removes what is left.
			t.log.Error("cleanup failed", "step", s.name, "err", err)
		}
	}
	for i := len(t.first) - 1; i >= 0; i-- {
		do(t.first[i])
	}
	var wg sync.WaitGroup
	for _, s := range t.rest {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(s)
		}()
	}
	wg.Wait()
}

// viewImage makes the attempt's read-only view of an image's layers, the
// snapshot key (cid for the root, cid-image<i> for image mounts).
func (r *Runner) viewImage(ctx context.Context, log *slog.Logger, cid, key, attempt string, image client.Image, td *teardown) ([]mount.Mount, error) {
	diffIDs, err := image.RootFS(ctx)
	if err != nil {
		return nil, fmt.Errorf("layers of %s: %w", image.Name(), err)
	}
	parent := identity.ChainID(diffIDs).String()
	sn := r.client.SnapshotService(r.snapshotter)
	labels := map[string]string{LabelAttempt: attempt, labelContainer: cid, labelGCRoot: time.Now().UTC().Format(time.RFC3339)}
	view, err := sn.View(ctx, key, parent, snapshots.WithLabels(labels))
	if errdefs.IsAlreadyExists(err) {
		log.Warn("removing leftover snapshot of this attempt", "snapshot", key)
		if err := sn.Remove(ctx, key); err != nil && !errdefs.IsNotFound(err) {
			return nil, fmt.Errorf("remove leftover snapshot: %w", err)
		}
		view, err = sn.View(ctx, key, parent, snapshots.WithLabels(labels))
	}
	if err != nil {
		return nil, fmt.Errorf("view of %s: %w", image.Name(), err)
	}
	td.add("remove snapshot "+key, func(c context.Context) error {
		if err := sn.Remove(c, key); err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return nil
	})
	return view, nil
}

// prepareRootfs makes the container's root filesystem: an overlay of the
// read-only view of the image's layers, with the writable layer on the
// workspace filesystem so that the workspace's size caps it. With userns,
// the layers are idmapped clones (idmapLayers), so that the image's files
// appear owned by the container's root and the writable layer's root is
// owned by the attempt's host range.
func prepareRootfs(view []mount.Mount, ws *Workspace, userns bool, td *teardown) ([]mount.Mount, error) {
	lower, extra, err := lowerDirs(view)
	if err != nil {
		return nil, err
	}
	if userns {
		if lower, err = idmapLayers(lower, ws, "layers", td); err != nil {
			return nil, err
		}
	}
	dir := filepath.Join(ws.privDir(), "rootfs")
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("clear writable layer: %w", err)
	}
	upper, work := filepath.Join(dir, "upper"), filepath.Join(dir, "work")
	for _, d := range []string{dir, upper, work} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return nil, fmt.Errorf("create writable layer: %w", err)
		}
	}
	// The root of the merged tree takes the upper folder's owner and mode:
	// give it the image's (as the idmapped layer shows it, with userns).
	st, err := os.Stat(lower[0])
	if err != nil {
		return nil, fmt.Errorf("image root: %w", err)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		if err := os.Chown(upper, int(sys.Uid), int(sys.Gid)); err != nil {
			return nil, fmt.Errorf("writable layer owner: %w", err)
		}
	}
	if err := os.Chmod(upper, st.Mode()&(fs.ModePerm|fs.ModeSticky|fs.ModeSetgid|fs.ModeSetuid)); err != nil {
		return nil, fmt.Errorf("writable layer mode: %w", err)
	}
	opts := append(extra, "lowerdir="+strings.Join(lower, ":"), "upperdir="+upper, "workdir="+work)
	return []mount.Mount{{Type: "overlay", Source: "overlay", Options: opts}}, nil
}

// idmapLayers mounts an idmapped, read-only clone of each layer folder
// through the workspace's ID range at STATE/<cid>/<name>/<i> (runc 1.1
// cannot idmap mounts itself; the kernel lets overlayfs stack on idmapped
// layers since Linux 5.19) and returns their paths, in order. The clones
// are unmounted after the task is deleted (they are registered before it,
// and first-steps run in reverse), or by removeHostState after a crash.
func idmapLayers(lower []string, ws *Workspace, name string, td *teardown) ([]string, error) {
	dir := filepath.Join(ws.root, name)
	unmountAll := func(context.Context) error { return unmountTree(dir) }
	// A workspace may serve several runs of its attempt, one at a time.
	if err := unmountAll(context.Background()); err != nil {
		return nil, err
	}
	td.addFirst("unmount idmapped layers "+name, unmountAll)
	ns, err := idmap.UserNS(ws.IDs())
	if err != nil {
		return nil, err
	}
	defer ns.Close()
	out := make([]string, len(lower))
	for i, l := range lower {
		t := filepath.Join(dir, strconv.Itoa(i))
		if err := os.MkdirAll(t, 0o700); err != nil {
			return nil, fmt.Errorf("idmapped layer: %w", err)
		}
		if err := idmap.MountIDMapped(l, t, ns); err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

// unmountTree unmounts everything at or below dir and removes it.
func unmountTree(dir string) error {
	mounts, err := loopfs.MountsUnder(dir)
	if err != nil {
		return err
	}
	for _, m := range mounts {
		if err := loopfs.Unmount(m); err != nil {
			return err
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// mountImageView makes image mount i of an attempt: its layers (idmapped
// with userns) as one read-only tree on the host — the layer itself when
// there is one, else a read-only overlay of them at STATE/<cid>/images/<i>
// — and returns its path, for a read-only bind into the container. It is
// unmounted after the task is deleted.
func mountImageView(view []mount.Mount, ws *Workspace, userns bool, i int, td *teardown) (string, error) {
	lower, extra, err := lowerDirs(view)
	if err != nil {
		return "", err
	}
	if userns {
		if lower, err = idmapLayers(lower, ws, "image-layers-"+strconv.Itoa(i), td); err != nil {
			return "", err
		}
	}
	if len(lower) == 1 {
		return lower[0], nil
	}
	dir := filepath.Join(ws.root, "images", strconv.Itoa(i))
	if err := unmountTree(dir); err != nil {
		return "", err
	}
	td.addFirst("unmount image view", func(context.Context) error { return unmountTree(dir) })
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", fmt.Errorf("image view: %w", err)
	}
	opts := strings.Join(append(extra, "lowerdir="+strings.Join(lower, ":")), ",")
	if err := unix.Mount("overlay", dir, "overlay", unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return "", fmt.Errorf("image view: mount overlay at %s: %w", dir, err)
	}
	return dir, nil
}

// imageFolder is the folder p (absolute and clean; "" is the root) of the
// image view at root. No component may be a symbolic link: it would be
// resolved on the host, not in the image.
func imageFolder(root, p string) (string, error) {
	if p == "" || p == "/" {
		return root, nil
	}
	cur := root
	for _, c := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		cur = filepath.Join(cur, c)
		fi, err := os.Lstat(cur)
		if err != nil {
			return "", fmt.Errorf("the image's folder %s: %w", p, errors.Unwrap(err))
		}
		if !fi.IsDir() {
			return "", fmt.Errorf("the image's %s is not a folder (a symbolic link is not followed)", p)
		}
	}
	return cur, nil
}

// lowerDirs extracts the layer folders (topmost first) and the extra
// overlay options from the mounts of a read-only snapshot view: a read-only
// bind of the single layer, or an overlay of several without an upper.
func lowerDirs(ms []mount.Mount) ([]string, []string, error) {
	if len(ms) != 1 {
		return nil, nil, fmt.Errorf("snapshot view has %d mounts, want 1", len(ms))
	}
	m := ms[0]
	switch m.Type {
	case "bind", "rbind":
		return []string{m.Source}, nil, nil
	case "overlay":
		var lower, extra []string
		for _, o := range m.Options {
			switch {
			case strings.HasPrefix(o, "lowerdir="):
				lower = strings.Split(strings.TrimPrefix(o, "lowerdir="), ":")
			case strings.HasPrefix(o, "upperdir="), strings.HasPrefix(o, "workdir="):
				return nil, nil, fmt.Errorf("snapshot view is writable (%s)", o)
			case o == "ro", o == "rw":
			default:
				extra = append(extra, o)
			}
		}
		if len(lower) == 0 {
			return nil, nil, errors.New("snapshot view overlay has no lowerdir")
		}
		return lower, extra, nil
	}
	return nil, nil, fmt.Errorf("snapshot view mount type %q is not supported (use the overlayfs snapshotter)", m.Type)
}

// execFailure reports a command that could not be executed (missing binary,
// not executable, bad working directory) as the agent's error, exit code 127,
// its wall time the time since its task was being created.
func (r *Runner) execFailure(ctx context.Context, res *Result, log *slog.Logger, err error, td *teardown, finish func(), created time.Time) (Result, error) {
	res.Wall = time.Since(created)
	td.run(ctx)
	finish()
	res.Outcome, res.ExitCode = OutcomeAgentError, 127
	res.Detail = "command could not be executed: " + err.Error()
	log.Info("attempt finished", "outcome", res.Outcome, "exit_code", res.ExitCode, "detail", res.Detail)
	return *res, nil
}

// isExecFailure recognises runc's errors for a command that cannot be run in
// the container, which are the image's or the caller's Args' fault.
func isExecFailure(err error) bool {
	msg := err.Error()
	for _, s := range []string{
		"unable to start container process: exec:", // runc: missing or non-executable command
		"executable file not found in $PATH",
		"chdir to cwd", // runc: unusable working directory
	} {
		if strings.Contains(msg, s) {
			return true
		}
	}
	return false
}

// specOpts builds the OCI runtime spec: the image's config, then the attempt's
// command, environment, user, mounts, network and limits.
func (r *Runner) specOpts(image client.Image, spec Spec, lim Limits, binds []Mount, extra []specs.Mount, ws *Workspace, proxyURL string,
	serviceEnv []string, hasApt bool, cgroupsPath *string) ([]oci.SpecOpts, error) {
	user := spec.User
	if user == "" {
		user = defaultUser
		if spec.UserNamespace {
			user = "0:0"
		}
	}
	var ids *idmap.Range
	if spec.UserNamespace {
		r := ws.IDs()
		ids = &r
	}
	opts := []oci.SpecOpts{oci.WithImageConfigArgs(image, spec.Args)}
	if spec.Entrypoint != nil {
		args := append(append([]string{}, spec.Entrypoint...), spec.Args...)
		if len(args) == 0 {
			return nil, fmt.Errorf("attempt %s: empty entrypoint and no args", spec.ID)
		}
		opts = append(opts, oci.WithProcessArgs(args...))
	}
	if len(spec.Env) > 0 {
		opts = append(opts, oci.WithEnv(spec.Env))
	}
	if proxyURL != "" {
		// The node's services on the link are reached directly, not
		// through the egress proxy.
		var direct []netip.Addr
		if len(spec.Services) > 0 {
			if ap, err := netip.ParseAddrPort(strings.TrimPrefix(proxyURL, "http://")); err == nil {
				direct = append(direct, ap.Addr())
			}
		}
		opts = append(opts, oci.WithEnv(proxyEnv(proxyURL, direct...)))
	}
	if len(serviceEnv) > 0 {
		opts = append(opts, oci.WithEnv(serviceEnv)) // last: the attempt cannot point them elsewhere
	}
	gpuMounts, gpuOpt := gpuSpec(spec.GPUs, spec.UserNamespace)
	opts = append(opts, gpuOpt)
	if spec.Cwd != "" {
		opts = append(opts, oci.WithProcessCwd(spec.Cwd))
	}
	mounts := []specs.Mount{{
		// The container's own cgroups, read-only, so that tools can see their limits.
		Destination: "/sys/fs/cgroup",
		Type:        "cgroup",
		Source:      "cgroup",
		Options:     []string{"ro", "nosuid", "noexec", "nodev"},
	}}
	targets := map[string]bool{}
	for _, m := range binds {
		mode := "rw"
		if m.ReadOnly {
			mode = "ro"
		}
		mounts = append(mounts, specs.Mount{
			Destination: m.Target,
			Type:        "bind",
			Source:      m.Source,
			Options:     []string{"rbind", "rprivate", mode, "nosuid", "nodev"},
		})
		targets[path.Clean(m.Target)] = true
	}
	if spec.Network.Mode == NetworkEgress && len(spec.Network.Nameservers) > 0 {
		var b strings.Builder
		for _, a := range spec.Network.Nameservers {
			fmt.Fprintf(&b, "nameserver %s\n", a)
		}
		p := filepath.Join(ws.privDir(), "resolv.conf")
		if err := os.WriteFile(p, []byte(b.String()), 0o644); err != nil {
			return nil, fmt.Errorf("write resolv.conf: %w", err)
		}
		mounts = append(mounts, specs.Mount{Destination: "/etc/resolv.conf", Type: "bind", Source: p,
			Options: []string{"rbind", "rprivate", "ro", "nosuid", "nodev", "noexec"}})
	}
	if proxyURL != "" && hasApt {
		// apt reads its proxy from its configuration as well as from
		// http_proxy; a login shell or sudo may drop the environment.
		// Packages indexes in gzip, which the package cache reads for
		// the files' hashes (it has no xz decoder), not xz. dpkg without
		// an fsync per file: the attempt's filesystem is scratch, thrown
		// away at its end (it takes a third off installing).
		p := filepath.Join(ws.privDir(), "apt.conf")
		conf := fmt.Sprintf("Acquire::http::Proxy \"%[1]s\";\nAcquire::https::Proxy \"%[1]s\";\n"+
			"Acquire::CompressionTypes::Order { \"gz\"; };\nDPkg::Options { \"--force-unsafe-io\"; };\n", proxyURL)
		if err := os.WriteFile(p, []byte(conf), 0o644); err != nil {
			return nil, fmt.Errorf("write apt configuration: %w", err)
		}
		mounts = append(mounts, specs.Mount{Destination: aptProxyConf, Type: "bind", Source: p,
			Options: []string{"rbind", "rprivate", "ro", "nosuid", "nodev", "noexec"}})
	}
	mounts = append(mounts, gpuMounts...)
	mounts = append(mounts, extra...)
	for _, m := range extra {
		targets[path.Clean(m.Destination)] = true
	}
	period := uint64(100000)
	quota := int64(lim.CPUMillis) * int64(period) / 1000
	// A fresh network namespace with only lo; in egress and proxy modes Run
	// attaches the attempt's link to it (netns.Manager.Attach) before the task starts.
	netNS := specs.LinuxNamespace{Type: specs.NetworkNamespace}
	opts = append(opts,
		// WithUser last among the identity options: it resets supplementary
		// groups that the image config may have added.
		oci.WithUser(user),
		oci.WithHostname("sandbox"),
		oci.WithNoNewPrivileges,
		oci.WithLinuxNamespace(netNS),
		oci.WithCPUCFS(quota, period),
		oci.WithMemoryLimit(lim.MemoryBytes),
		oci.WithMemorySwap(int64(lim.MemoryBytes)),
		oci.WithPidsLimit(lim.Pids),
		oci.WithMounts(mounts),
		withOOMScoreAdj(oomScoreAdj),
	)
	if ids != nil {
		m := []specs.LinuxIDMapping{{ContainerID: 0, HostID: ids.HostID, Size: ids.Size}}
		opts = append(opts, oci.WithUserNamespace(m, m),
			// Root in the container needs no raw sockets: with
			// CAP_NET_RAW in its own user namespace it could open them in
			// a network namespace it owns (network none).
			oci.WithDroppedCapabilities([]string{"CAP_NET_RAW"}))
	}
	if spec.ReadOnlyRootfs {
		opts = append(opts, oci.WithRootFSReadonly(), withScratchDirs(ws, targets, ids))
	}
	opts = append(opts,
		// runc mounts a tmpfs at /sys/fs/cgroup to hold the (read-only)
		// controllers of a cgroup v1 host; make that read-only too.
		withReadonlyPaths("/sys/fs/cgroup"),
		captureCgroupsPath(cgroupsPath),
		// Docker's default seccomp profile, adjusted to the capabilities above; last.
		seccomp.WithDefaultProfile(),
	)
	return opts, nil
}

// gpuSpec returns the mounts and the spec changes that give an attempt
// its granted GPUs (none for an empty grant): device nodes (made by runc,
// or bind-mounted from the host in a user namespace, where runc cannot
// make them), device-cgroup rules allowing them, the driver's files
// (mounts), the environment that finds them, masks over the other GPUs'
// /proc entries.
func gpuSpec(g gpu.Grant, userns bool) ([]specs.Mount, oci.SpecOpts) {
	if len(g.Devices) == 0 {
		return nil, func(context.Context, oci.Client, *containers.Container, *oci.Spec) error { return nil }
	}
	mounts := g.LibraryMounts()
	if userns {
		mounts = append(mounts, g.DeviceMounts()...)
	}
	return mounts, func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		if s.Linux.Resources == nil {
			s.Linux.Resources = &specs.LinuxResources{}
		}
		if !userns {
			s.Linux.Devices = append(s.Linux.Devices, g.LinuxDevices()...)
		}
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, g.CgroupRules()...)
		s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, g.MaskedPaths()...)
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.Env = g.ExtendEnv(s.Process.Env)
		return nil
	}
}

// aptProxyConf is where a proxy attempt's image finds apt's settings.
const aptProxyConf = "/etc/apt/apt.conf.d/80repronet"

// proxyEnv points the programs agents install with at the egress proxy:
// curl, wget, pip, requests, conda, git, R (libcurl and its internal
// method), apt and npm read these. Local addresses bypass it.
func proxyEnv(url string, direct ...netip.Addr) []string {
	local := "localhost,127.0.0.1,::1"
	for _, a := range direct {
		local += "," + a.String()
	}
	return []string{
		"HTTP_PROXY=" + url, "HTTPS_PROXY=" + url, "http_proxy=" + url, "https_proxy=" + url,
		"NO_PROXY=" + local, "no_proxy=" + local,
		"npm_config_proxy=" + url, "npm_config_https_proxy=" + url,
	}
}

// imageHasDir reports whether the image seen through the view has the
// folder rel (in its topmost layer that has it; whiteouts are not
// followed).
func imageHasDir(view []mount.Mount, rel string) bool {
	lower, _, err := lowerDirs(view)
	if err != nil {
		return false
	}
	for _, l := range lower {
		if st, err := os.Lstat(filepath.Join(l, rel)); err == nil {
			return st.IsDir()
		}
	}
	return false
}

// withScratchDirs gives a read-only root writable /tmp, /var/tmp and $HOME:
// folders on the workspace filesystem, so the quota covers them. A path a
// Spec mount already covers is left to it. With ids, owners are the host
// IDs of the container's.
func withScratchDirs(ws *Workspace, targets map[string]bool, ids *idmap.Range) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		covered := func(p string) bool {
			for t := range targets {
				if p == t || strings.HasPrefix(p, t+"/") || t == "/" {
					return true
				}
			}
			return false
		}
		type scratch struct {
			target, name string
			mode         fs.FileMode
			uid, gid     int
		}
		dirs := []scratch{
			{"/tmp", "tmp", fs.ModeSticky | 0o777, 0, 0},
			{"/var/tmp", "var-tmp", fs.ModeSticky | 0o777, 0, 0},
		}
		if s.Process != nil {
			for _, e := range s.Process.Env {
				if h, ok := strings.CutPrefix(e, "HOME="); ok && path.IsAbs(h) && path.Clean(h) != "/" {
					dirs = append(dirs, scratch{path.Clean(h), "home", 0o700, int(s.Process.User.UID), int(s.Process.User.GID)})
				}
			}
		}
		for _, d := range dirs {
			if covered(d.target) {
				continue
			}
			p := filepath.Join(ws.privDir(), d.name)
			if err := os.RemoveAll(p); err != nil {
				return fmt.Errorf("scratch folder %s: %w", d.target, err)
			}
			if err := os.Mkdir(p, 0o700); err != nil {
				return fmt.Errorf("scratch folder %s: %w", d.target, err)
			}
			if ids != nil {
				u, err := ids.ToHost(uint32(d.uid))
				if err != nil {
					return fmt.Errorf("scratch folder %s: %w", d.target, err)
				}
				g, err := ids.ToHost(uint32(d.gid))
				if err != nil {
					return fmt.Errorf("scratch folder %s: %w", d.target, err)
				}
				d.uid, d.gid = int(u), int(g)
			}
			if err := os.Chown(p, d.uid, d.gid); err != nil {
				return fmt.Errorf("scratch folder %s: %w", d.target, err)
			}
			if err := os.Chmod(p, d.mode); err != nil {
				return fmt.Errorf("scratch folder %s: %w", d.target, err)
			}
			s.Mounts = append(s.Mounts, specs.Mount{Destination: d.target, Type: "bind", Source: p,
				Options: []string{"rbind", "rprivate", "rw", "nosuid", "nodev"}})
		}
		return nil
	}
}

func withSnapshotKey(key string) client.NewContainerOpts {
	return func(_ context.Context, _ *client.Client, c *containers.Container) error {
		c.SnapshotKey = key
		return nil
	}
}

func withReadonlyPaths(paths ...string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux == nil {
			s.Linux = &specs.Linux{}
		}
		s.Linux.ReadonlyPaths = append(s.Linux.ReadonlyPaths, paths...)
		return nil
	}
}

func captureCgroupsPath(dst *string) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Linux != nil {
			*dst = s.Linux.CgroupsPath
		}
		return nil
	}
}

func withOOMScoreAdj(adj int) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			s.Process = &specs.Process{}
		}
		s.Process.OOMScoreAdj = &adj
		return nil
	}
}

// readPeakPids reads the pids controller's high-water mark of a container's
// cgroup (cgroup v1 or v2, cgroupfs driver); 0 when it cannot.
func readPeakPids(cgroupsPath string) uint64 {
	if cgroupsPath == "" || !path.IsAbs(cgroupsPath) {
		return 0
	}
	for _, p := range []string{
		filepath.Join("/sys/fs/cgroup/pids", cgroupsPath, "pids.peak"), // v1
		filepath.Join("/sys/fs/cgroup", cgroupsPath, "pids.peak"),      // v2
	} {
		if b, err := os.ReadFile(p); err == nil {
			if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil {
				return n
			}
		}
	}
	return 0
}

type usage struct {
	cpuSeconds float64
	peakMemory uint64
	oomKills   uint64
}

// parseMetrics reads cgroup v1 or v2 statistics as containerd reports them.
func parseMetrics(m *types.Metric) (usage, error) {
	var u usage
	if m == nil || m.Data == nil {
		return u, errors.New("no metrics data")
	}
	switch {
	case typeurl.Is(m.Data, (*cgroup1stats.Metrics)(nil)):
		var s cgroup1stats.Metrics
		if err := typeurl.UnmarshalTo(m.Data, &s); err != nil {
			return u, fmt.Errorf("decode cgroup v1 metrics: %w", err)
		}
		u.cpuSeconds = float64(s.GetCPU().GetUsage().GetTotal()) / 1e9
		u.peakMemory = s.GetMemory().GetUsage().GetMax()
		u.oomKills = s.GetMemoryOomControl().GetOomKill()
	case typeurl.Is(m.Data, (*cgroup2stats.Metrics)(nil)):
		var s cgroup2stats.Metrics
		if err := typeurl.UnmarshalTo(m.Data, &s); err != nil {
			return u, fmt.Errorf("decode cgroup v2 metrics: %w", err)
		}
		u.cpuSeconds = float64(s.GetCPU().GetUsageUsec()) / 1e6
		u.peakMemory = s.GetMemory().GetMaxUsage()
		if u.peakMemory == 0 {
			u.peakMemory = s.GetMemory().GetUsage()
		}
		u.oomKills = s.GetMemoryEvents().GetOomKill()
	default:
		return u, fmt.Errorf("unknown metrics type %s", m.Data.GetTypeUrl())
	}
	return u, nil
}
