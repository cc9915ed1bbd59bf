package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/repronet/repronet/capsulestore"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/sandbox/egress"
)

// agentUID is the unprivileged user jobs run as; their workspace is
// handed to it.
const agentUID = 1000

// runKey names a running attempt: attempt IDs are the coordinator's, so
// two coordinators' attempts never collide.
type runKey struct {
	coord   peer.ID
	attempt string
}

// handleAssign answers one assignment offered by a coordinator.
func (n *Node) handleAssign(s network.Stream) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(20 * time.Second))
	from := s.Conn().RemotePeer()
	var a proto.Assignment
	if err := proto.ReadMsg(p2phost.Paced(s, p2phost.ReadGrace), &a, proto.MaxAssignmentSize); err != nil {
		n.log.Warn("unreadable assignment", "from", from, "err", err)
		s.Reset()
		return
	}
	resp := &proto.AssignmentResponse{AttemptId: a.GetAttemptId(), Incarnation: n.incarnation}
	if code, reason := n.admit(from, &a); code != proto.DeclineCode_DECLINE_UNSPECIFIED {
		resp.Code, resp.Reason = code, reason
		level := slog.LevelWarn
		if code == proto.DeclineCode_DECLINE_BUSY {
			level = slog.LevelInfo // normal when coordinators share this node
		}
		n.log.Log(context.Background(), level, "assignment declined", "from", from, "attempt", a.GetAttemptId(),
			"code", code.String(), "reason", reason)
	} else {
		resp.Accepted = true
	}
	if err := proto.WriteMsg(s, resp); err != nil {
		n.log.Warn("answer assignment", "attempt", a.GetAttemptId(), "err", err)
	}
	if resp.Accepted {
		n.signal(n.announceNow)
	}
}

// admit decides whether to take an assignment and, if so, starts it. It
// returns DECLINE_UNSPECIFIED to accept, else why not. An attempt this node
// already runs for the same coordinator is accepted again (the first
// answer may have been lost), not started twice.
func (n *Node) admit(from peer.ID, a *proto.Assignment) (proto.DeclineCode, string) {
	if !n.isCoordinator(from) {
		return proto.DeclineCode_DECLINE_NOT_SERVED, "not a coordinator this node serves"
	}
	if err := proto.ValidateAssignment(a); err != nil {
		return proto.DeclineCode_DECLINE_INVALID, err.Error()
	}
	p, code, reason := n.plan(a.GetRecipe())
	if code != proto.DeclineCode_DECLINE_UNSPECIFIED {
		return code, reason
	}
	if len(n.cfg.Suites) > 0 && !slices.Contains(n.cfg.Suites, a.GetSuite()) {
		return proto.DeclineCode_DECLINE_UNSUPPORTED, fmt.Sprintf("this node serves suites %q, not %q", n.cfg.Suites, a.GetSuite())
	}
	if len(n.cfg.Groups) > 0 && !slices.Contains(n.cfg.Groups, a.GetGroup()) {
		return proto.DeclineCode_DECLINE_UNSUPPORTED, fmt.Sprintf("this node serves groups %q, not %q", n.cfg.Groups, a.GetGroup())
	}
	key := runKey{from, a.GetAttemptId()}
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closed:
		return proto.DeclineCode_DECLINE_STOPPING, "node is stopping"
	case n.running[key] != nil:
		return proto.DeclineCode_DECLINE_UNSPECIFIED, ""
	case n.draining:
		return proto.DeclineCode_DECLINE_STOPPING, "node is draining: it takes no new work"
	case len(n.running) >= n.cfg.Slots:
		return proto.DeclineCode_DECLINE_BUSY, fmt.Sprintf("no free slot (%d of %d busy)", len(n.running), n.cfg.Slots)
	}
	if err := n.disk.Check(0); err != nil { // transient: not held against the node
		return proto.DeclineCode_DECLINE_BUSY, fmt.Sprintf("no room for its work: %v", err)
	}
	if p.gpus, reason = n.gpus.take(key, a.GetRecipe().GetGpus()); reason != "" {
		return proto.DeclineCode_DECLINE_BUSY, reason
	}
	ctx, cancel := context.WithCancel(context.Background())
	n.running[key] = cancel
	n.goLoop(func() {
		defer func() {
			cancel()
			n.mu.Lock()
			delete(n.running, key)
			delete(n.handingBack, key)
			n.gpus.release(key)
			n.mu.Unlock()
			n.signal(n.announceNow)
		}()
		n.runAttempt(ctx, from, a, p)
	})
	return proto.DeclineCode_DECLINE_UNSPECIFIED, ""
}

// localRunID names an attempt on this node: its ID and 8 hex digits of its
// coordinator's, so that two coordinators' attempts of the same ID never
// share a workspace or a container.
func localRunID(coord peer.ID, attempt string) string {
	sum := sha256.Sum256([]byte(coord))
	return attempt + "." + hex.EncodeToString(sum[:4])
}

func (n *Node) isCoordinator(p peer.ID) bool {
	for _, c := range n.coords {
		if c.ID == p {
			return true
		}
	}
	return false
}

// plan is what admit decided about a recipe, for execute.
type plan struct {
	network sandbox.Network
	// disk is the workspace size the limits ask for; 0: sized from the
	// inputs (workspaceSize).
	disk int64
	// gpus are the indexes (in Config.GPUs) of the GPUs granted.
	gpus []int
}

// plan checks what the node must know of a recipe beyond recipe.Validate:
// that its slot shape holds the limits, that the workspace it asks for is
// within this node's bounds, that the node has GPUs enough. It returns
// DECLINE_UNSPECIFIED with the plan, or a decline code and reason.
func (n *Node) plan(r *proto.Recipe) (plan, proto.DeclineCode, string) {
	unsupported := func(format string, args ...any) (plan, proto.DeclineCode, string) {
		return plan{}, proto.DeclineCode_DECLINE_UNSUPPORTED, fmt.Sprintf(format, args...)
	}
	if err := recipe.Validate(r); err != nil {
		return unsupported("%v", err)
	}
	var p plan
	p.network, _ = recipe.Network(r)
	l := r.GetLimits()
	if l.GetCpuMillis() > n.cfg.Slot.GetCpuMillis() || l.GetMemoryBytes() > n.cfg.Slot.GetMemoryBytes() {
		return unsupported("limits %d mCPU / %d bytes exceed this node's slot %d mCPU / %d bytes",
			l.GetCpuMillis(), l.GetMemoryBytes(), n.cfg.Slot.GetCpuMillis(), n.cfg.Slot.GetMemoryBytes())
	}
	if d := l.GetDiskBytes(); d > 0 {
		switch {
		case n.cfg.MaxDiskBytes > 0 && d > uint64(n.cfg.MaxDiskBytes):
			return unsupported("limits.disk_bytes %d exceeds this node's largest workspace, %d bytes", d, n.cfg.MaxDiskBytes)
		case d > math.MaxInt64:
			return unsupported("limits.disk_bytes %d is too large", d)
		}
		p.disk = int64(d)
	}
	if g := r.GetGpus(); g.GetCount() > 0 && !n.gpus.could(g) {
		return unsupported("the job needs %d GPU(s) (model %q, %d bytes each); this node has %d that could serve",
			g.GetCount(), g.GetModel(), g.GetMinMemoryBytes(), n.gpus.matching(g))
	}
	return p, proto.DeclineCode_DECLINE_UNSPECIFIED, ""
}

// runAttempt carries one attempt from assignment to a report in the outbox.
func (n *Node) runAttempt(ctx context.Context, coord peer.ID, a *proto.Assignment, p plan) {
	id := a.GetAttemptId()
	log := n.log.With("attempt", id, "job", a.GetLabel(), "suite", a.GetSuite())
	log.Info("attempt accepted")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	leaseLost := make(chan string, 1)
	var ph phase
	ph.set("fetching")
	defer n.track(coord, a, &ph)()
	n.goLoop(func() { n.renewLease(ctx, coord, a, &ph, leaseLost, cancel) })

	started := time.Now()
	r := a.GetRecipe()
	report := &proto.Report{AttemptId: id, NodePeerId: []byte(n.host.ID()), ImageCid: r.GetImageCid(),
		StartedUnixMillis: started.UnixMilli()}
	for _, in := range r.GetInputs() {
		report.InputCids = append(report.InputCids, in.GetCid())
	}
	res, err := n.execute(ctx, coord, a, p, &ph, log)
	select {
	case why := <-leaseLost:
		log.Warn("attempt abandoned: lease lost", "why", why)
		n.unpinOutputs(res.outputs)
		return
	default:
	}
	if err != nil {
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			n.mu.Lock()
			back := n.handingBack[runKey{coord, id}]
			n.mu.Unlock()
			if back {
				log.Info("attempt stopped: handed back to its coordinator")
			} else {
				log.Warn("attempt cancelled", "err", err)
			}
			return
		}
		log.Error("attempt failed on this node", "err", err)
		report.Outcome, report.Detail = proto.Outcome_OUTCOME_INFRA_ERROR, err.Error()
	} else {
		fillReport(report, res)
	}
	ph.set("reporting")
	report.FinishedUnixMillis = time.Now().UnixMilli()
	if err := proto.ValidateReport(report); err != nil {
		// The coordinator would refuse it: send what went wrong instead.
		log.Error("report fails validation; sent as an infrastructure failure", "err", err)
		n.unpinOutputs(res.outputs)
		report = &proto.Report{AttemptId: id, NodePeerId: report.GetNodePeerId(), ImageCid: report.GetImageCid(),
			InputCids: report.GetInputCids(), Outcome: proto.Outcome_OUTCOME_INFRA_ERROR, Detail: "invalid report: " + err.Error(),
			StartedUnixMillis: report.GetStartedUnixMillis(), FinishedUnixMillis: report.GetFinishedUnixMillis()}
	}
	if err := n.enqueueReport(context.WithoutCancel(ctx), coord, report); err != nil {
		log.Error("cannot store report", "err", err)
		return
	}
	n.mu.Lock()
	n.finished[report.GetOutcome()]++
	n.mu.Unlock()
	log.Info("attempt finished", "outcome", report.GetOutcome().String(), "exit", report.GetExitCode(),
		"wall", time.Duration(report.GetUsage().GetWallMillis())*time.Millisecond,
		"disk_used", report.GetUsage().GetDiskUsedBytes(), "outputs", len(report.GetOutputs()))
}

// phase is what an attempt is doing, as its lease renewals say.
type phase struct{ v atomic.Value }

func (p *phase) set(s string) { p.v.Store(s) }
func (p *phase) get() string {
	s, _ := p.v.Load().(string)
	return s
}

// attemptResult is what execute returns for the report.
type attemptResult struct {
	run     sandbox.Result
	outputs []*proto.OutputRef
	// chainHead is the last conversation chain head the gateway returned.
	chainHead string
	// egress is the job's egress record (its environment build's too).
	egress egress.Record
}

// execute fetches, prepares and runs one job. An error is an
// infrastructure failure; the job's own failures are in the result.
func (n *Node) execute(ctx context.Context, coord peer.ID, a *proto.Assignment, p plan, ph *phase, log *slog.Logger) (attemptResult, error) {
	r := a.GetRecipe()
	image, err := cid.Cast(r.GetImageCid())
	if err != nil {
		return attemptResult{}, fmt.Errorf("image cid: %w", err)
	}
	inputs := make([]cid.Cid, 0, len(r.GetInputs()))
	for i, in := range r.GetInputs() {
		c, err := cid.Cast(in.GetCid())
		if err != nil {
			return attemptResult{}, fmt.Errorf("inputs[%d] cid: %w", i, err)
		}
		inputs = append(inputs, c)
	}
	// Inputs and image stay in the cache, never evicted, until the job ends.
	for _, c := range append(slices.Clone(inputs), image) {
		release, err := n.store.Acquire(ctx, c)
		if err != nil {
			return attemptResult{}, fmt.Errorf("pin %s in the capsule cache: %w", c, err)
		}
		defer release()
	}
	providers := capsulestore.WithProviders(providerHints(n.host.ID(), a.GetProviders())...)
	for i, c := range inputs {
		if err := n.fetch(ctx, fmt.Sprintf("input %d", i), c, r.GetInputs()[i].GetExtract(), providers); err != nil {
			return attemptResult{}, err
		}
	}
	img, err := n.image(ctx, image, providers)
	if err != nil {
		return attemptResult{}, err
	}
	// Attempt IDs are each coordinator's own: the workspace and the
	// container are named after the coordinator too. The workspace's ID
	// must be the Spec's.
	ph.set("preparing")
	runID := localRunID(coord, a.GetAttemptId())
	ws, err := n.prepare(ctx, runID, r, inputs, p)
	if err != nil {
		return attemptResult{}, err
	}
	defer func() {
		if err := ws.Close(context.WithoutCancel(ctx)); err != nil {
			log.Warn("cannot remove the workspace; the sandbox's Reconcile removes it at the next start", "err", err)
		}
	}()

	l := r.GetLimits()
	spec := sandbox.Spec{
		ID:        runID,
		Image:     img,
		Args:      r.GetArgs(),
		Env:       r.GetEnv(),
		Cwd:       r.GetCwd(),
		Workspace: ws,
		Limits: sandbox.Limits{CPUMillis: l.GetCpuMillis(), MemoryBytes: l.GetMemoryBytes(), Pids: int64(l.GetPids()),
			Wall: time.Duration(l.GetWallSeconds()) * time.Second, OutputBytes: int64(l.GetOutputBytes()), DiskBytes: ws.Size()},
		ReadOnlyRootfs: l.GetReadOnlyRootfs(),
		Network:        p.network,
		Proxy:          n.egress,
		// Root in a user namespace of its own (an unprivileged range on
		// the host); without one, the unprivileged agent user.
		UserNamespace: !n.cfg.NoUserNamespace,
	}
	if n.cfg.NoUserNamespace {
		spec.User = fmt.Sprintf("%d:%d", agentUID, agentUID)
	}
	if len(p.gpus) > 0 && n.cfg.GPUDevices != nil {
		if spec.GPUs, err = n.cfg.GPUDevices.Grant(p.gpus...); err != nil {
			return attemptResult{}, fmt.Errorf("grant GPUs %v: %w", p.gpus, err)
		}
	}
	var headMu sync.Mutex
	var head string
	if tok := a.GetModelToken(); tok != "" {
		spec.Services = append(spec.Services, n.modelService(ctx, coord, a.GetAttemptId(), tok, func(h string) {
			headMu.Lock()
			head = h
			headMu.Unlock()
		}))
	}
	if r.GetEntrypointSet() {
		spec.Entrypoint = append([]string{}, r.GetEntrypoint()...) // non-nil: replaces the image's
	}
	for _, m := range r.GetMounts() {
		spec.Mounts = append(spec.Mounts, sandbox.Mount{Source: filepath.Join(ws.Dir(), filepath.FromSlash(m.GetSource())),
			Target: m.GetTarget(), ReadOnly: m.GetReadOnly()})
	}
	if r.GetEnvironment() != nil {
		ph.set("building")
		inEnv, err := n.inEnvironment(ctx, &spec, r, log)
		if err != nil {
			return attemptResult{}, err
		}
		if !inEnv {
			log.Info("no Dockerfile for the environment; the job runs in its own image", "dockerfile", r.GetEnvironment().GetDockerfile())
		}
	}
	log.Info("workspace ready; starting", "workspace_bytes", ws.Size(), "network", string(p.network.Mode),
		"read_only_root", l.GetReadOnlyRootfs(), "image", spec.Image)
	ph.set("running")
	res, err := n.cfg.Sandbox.Run(ctx, spec)
	if err != nil {
		return attemptResult{}, fmt.Errorf("run attempt: %w", err)
	}
	// Everything is read before the workspace is closed.
	ph.set("collecting")
	headMu.Lock()
	defer headMu.Unlock()
	return attemptResult{run: res, outputs: recipe.Collect(ctx, ws.Dir(), r.GetOutputs(), n.addOutput), chainHead: head,
		egress: n.egressRecord(runID)}, nil
}

// addOutput stores an output in the capsule store, pinned until its
// report is delivered, and serves it to the coordinator over bitswap.
func (n *Node) addOutput(ctx context.Context, r io.Reader) (cid.Cid, int64, error) {
	info, err := n.store.Add(ctx, r, capsulestore.WithName("output"))
	if err != nil {
		return cid.Undef, 0, err
	}
	return info.CID, info.Size, nil
}

// unpinOutputs lets the cache evict outputs no report will name.
func (n *Node) unpinOutputs(outs []*proto.OutputRef) {
	for _, o := range outs {
		if c, err := cid.Cast(o.GetCid()); err == nil {
			if err := n.store.Pin(context.Background(), c, false); err != nil {
				n.log.Warn("cannot unpin an output", "cid", c, "err", err)
			}
		}
	}
}

// handOver gives a prepared workspace to the job's user: root of its user
// namespace, or the agent user without one.
func (n *Node) handOver(ws *sandbox.Workspace) error {
	if n.cfg.NoUserNamespace {
		if err := chownTree(ws.Dir(), agentUID, agentUID); err != nil {
			return fmt.Errorf("hand workspace to uid %d: %w", agentUID, err)
		}
		return nil
	}
	if err := ws.Chown(ws.Dir(), 0, 0); err != nil {
		return fmt.Errorf("hand workspace to the job's root: %w", err)
	}
	return nil
}

// prepare makes the job's workspace, sized for its inputs, and fills it
// (recipe.Prepare), then hands it to the job's user.
func (n *Node) prepare(ctx context.Context, runID string, r *proto.Recipe, inputs []cid.Cid, p plan) (*sandbox.Workspace, error) {
	var extracted, files int64
	for i, c := range inputs {
		e, err := n.store.Stat(ctx, c)
		if err != nil {
			return nil, fmt.Errorf("size of input %s: %w", c, err)
		}
		if r.GetInputs()[i].GetExtract() {
			extracted += e.Size
		} else {
			files += e.Size
		}
	}
	size := workspaceSize(p.disk, extracted, files, n.cfg.DefaultDiskBytes, n.cfg.MaxDiskBytes)
	ws, err := n.cfg.Sandbox.CreateWorkspace(ctx, runID, size)
	if err != nil {
		return nil, fmt.Errorf("create workspace: %w", err)
	}
	open := func(ctx context.Context, c cid.Cid) (io.ReadCloser, error) { return n.store.Open(ctx, c) }
	err = recipe.Prepare(ctx, ws.Dir(), r, open)
	if err == nil {
		err = n.handOver(ws)
	}
	if err != nil {
		if errors.Is(err, syscall.ENOSPC) {
			how := "limits.disk_bytes"
			if p.disk == 0 {
				how = "the node's default for inputs of " + strconv.FormatInt(extracted+files, 10) + " bytes"
			}
			err = fmt.Errorf("%w (the workspace holds %d bytes: %s)", err, size, how)
		}
		if cerr := ws.Close(context.WithoutCancel(ctx)); cerr != nil {
			err = errors.Join(err, cerr)
		}
		return nil, err
	}
	return ws, nil
}

// providerHints turns an assignment's providers into address infos for the
// capsule store, which connects to them and asks each for blocks. Malformed
// entries and the node itself are skipped.
func providerHints(self peer.ID, providers []*proto.Provider) []peer.AddrInfo {
	var out []peer.AddrInfo
	for _, p := range providers {
		id, err := peer.IDFromBytes(p.GetPeerId())
		if err != nil || id == self {
			continue
		}
		ai := peer.AddrInfo{ID: id}
		for _, b := range p.GetAddrs() {
			if addr, err := ma.NewMultiaddrBytes(b); err == nil {
				ai.Addrs = append(ai.Addrs, addr)
			}
		}
		out = append(out, ai)
	}
	return out
}

// fetch makes sure the whole DAG of c is held locally; content that is
// extracted into workspaces is announced as cached.
func (n *Node) fetch(ctx context.Context, what string, c cid.Cid, announce bool, opts ...capsulestore.ItemOption) error {
	last := time.Time{}
	err := n.store.Fetch(ctx, c, func(p capsulestore.Progress) {
		if time.Since(last) < 2*time.Second && p.Done < p.Total {
			return
		}
		last = time.Now()
		n.log.Info("fetching", "what", what, "cid", c, "progress", p.String(), "done", p.Done, "total", p.Total,
			"rate_mib_s", fmt.Sprintf("%.1f", p.Rate/(1<<20)), "peers", p.Peers)
	}, opts...)
	if err != nil {
		return fmt.Errorf("fetch %s %s: %w", what, c, err)
	}
	if announce {
		n.mu.Lock()
		n.cached[c.String()] = time.Now()
		n.mu.Unlock()
	}
	return nil
}

// image returns the containerd image of a job: the one the sandbox keeps
// under its CID (also after a restart), else the image tarball fetched and
// imported under it.
func (n *Node) image(ctx context.Context, image cid.Cid, opts ...capsulestore.ItemOption) (string, error) {
	key := image.String()
	defer n.imports.lock(key)()
	name, ok, err := n.cfg.Sandbox.KeyedImage(ctx, key)
	if err != nil {
		return "", fmt.Errorf("look up image %s: %w", image, err)
	}
	if ok {
		return name, nil
	}
	if err := n.fetch(ctx, "image", image, false, opts...); err != nil {
		return "", err
	}
	r, err := n.store.Open(ctx, image)
	if err != nil {
		return "", fmt.Errorf("open image %s: %w", image, err)
	}
	defer r.Close()
	name, err = n.cfg.Sandbox.ImportKeyedImage(ctx, key, r)
	if err != nil {
		return "", fmt.Errorf("import image %s: %w", image, err)
	}
	return name, nil
}

// renewLease keeps the attempt's lease alive until ctx ends, saying what
// the attempt is doing. When the coordinator refuses a renewal the attempt
// is cancelled.
func (n *Node) renewLease(ctx context.Context, coord peer.ID, a *proto.Assignment, ph *phase, lost chan<- string, cancel context.CancelFunc) {
	deadline := time.UnixMilli(a.GetLeaseDeadlineUnixMillis())
	interval := max(time.Until(deadline)/3, time.Second)
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
		ack, err := n.sendRenewal(ctx, coord, a.GetAttemptId(), ph.get())
		if err != nil {
			n.log.Warn("lease renewal not delivered", "attempt", a.GetAttemptId(), "err", err)
			continue
		}
		if !ack.GetOk() {
			select {
			case lost <- ack.GetReason():
			default:
			}
			cancel()
			return
		}
	}
}

func (n *Node) sendRenewal(ctx context.Context, coord peer.ID, attempt, phase string) (*proto.LeaseAck, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := n.host.NewStream(ctx, coord, proto.LeaseProtocol)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := proto.WriteMsg(s, &proto.LeaseRenewal{AttemptId: attempt, Phase: phase}); err != nil {
		s.Reset()
		return nil, err
	}
	var ack proto.LeaseAck
	if err := proto.ReadMsg(s, &ack, proto.MaxControlSize); err != nil {
		s.Reset()
		return nil, err
	}
	return &ack, nil
}
