// Package node owns the volunteer daemon: it connects out to coordinators
// (it never needs an open port), announces its slots (and GPUs) over
// gossipsub, accepts assignments on streams the coordinator opens, runs
// each one's job as its recipe says (fetching its image and inputs by CID,
// preparing the workspace with package recipe, running it through the
// sandbox), returns the recipe's outputs by content address, and delivers
// signed reports from a durable outbox until they are acknowledged. When its data folder runs out of
// room it declines new work as busy and keeps reports in memory until they
// are stored or delivered.
//
// It knows no benchmark: no task, level, strip rule or capsule layout,
// only neutral recipes. It must not grade, and it never sees gold answers.
// Container mechanics belong to package sandbox, content transfer and safe
// extraction to capsulestore, what a recipe means on disk to recipe.
package node

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/namespace"
	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/capsulestore"
	"github.com/repronet/repronet/internal/badgerds"
	"github.com/repronet/repronet/internal/diskguard"
	"github.com/repronet/repronet/internal/identity"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/sandbox/egress"
	"github.com/repronet/repronet/sandbox/gpu"
	"github.com/repronet/repronet/sandbox/pkgcache"
)

// Version is the node software version carried in announcements.
const Version = "0.1.0"

// Config configures a node. DataDir, Coordinators and Sandbox are required.
type Config struct {
	Network string
	DataDir string
	// DiskReserve is the free space the data folder keeps (default
	// DefaultDiskReserve): below it nothing more is written there, new
	// assignments are declined as busy, and finished reports wait in
	// memory until they are stored or delivered.
	DiskReserve uint64
	// Coordinators are full multiaddrs (with /p2p/ID) the node connects out to.
	Coordinators []string
	// ListenAddrs are optional: a node needs no open port.
	ListenAddrs []string
	// Slots is how many attempts run at once, each with Slot's shape.
	Slots int
	Slot  *proto.SlotShape
	// GPUs are the node's GPUs, given to the jobs that ask for them (each
	// to one job at a time); a node without GPUs never runs GPU work.
	// With GPUDevices (gpu.Detect), GPUs are those devices, in order, and
	// a job is given the devices it was granted; without, GPUs are only
	// announced and counted (tests).
	GPUs       []GPU
	GPUDevices *gpu.Inventory
	// NoUserNamespace runs jobs as uid 1000 without a user namespace. By
	// default a job runs as root in a user namespace of its own (its IDs
	// map to an unprivileged host range), so that it can install packages.
	NoUserNamespace bool
	// Egress configures the node's egress proxy, which serves jobs of
	// network "proxy" (host names; the node narrows them with
	// Egress.Restrict). PackageCache, when set, keeps the packages the
	// proxy passes for later jobs.
	Egress       egress.Config
	PackageCache *pkgcache.Config
	// Registries are the registry hosts (egress patterns) the node pulls
	// the base images of jobs' environments from (a Dockerfile's FROM),
	// through an egress proxy of its own that reaches nothing else (with
	// Egress's Permit, Resolver and Dial); nil: DefaultRegistries, empty:
	// none. RegistryMirrors are tried first for a registry as references
	// name it ("docker.io" -> base URLs, sandbox.ParseMirror); their hosts
	// and ports are allowed too. BaseImages are OCI image-layout tarballs
	// imported at start under the names they carry: an environment whose
	// FROM names one is built without a pull (an offline node; the demo).
	Registries      []string
	RegistryMirrors map[string][]string
	BaseImages      []string
	// Sandbox runs the attempts.
	Sandbox Sandbox
	// AnnounceInterval is the steady announcement period; the first 30 s
	// announce every second so a new node is seen at once.
	AnnounceInterval time.Duration
	// GossipGrace is how long a connected coordinator's gossip link (the
	// stream the node publishes to it on, and its subscription) may stay
	// down before the node closes the connection and dials again (default
	// 30 s; below 0, never). See gossipwatch.go.
	GossipGrace time.Duration
	// OperatorKey, when set, is the key of the operator this node belongs
	// to: the node announces a certificate, signed with it, naming its own
	// peer ID. Nodes of one operator never get two replicas of one attempt.
	OperatorKey crypto.PrivKey
	// JoinToken, when set, is presented to every coordinator on connecting
	// (/repronet/join/1.0.0), so that the node's operator is admitted: only
	// admitted operators count as independent of each other.
	JoinToken string
	// Suites and Groups, when not empty, are the only suites and submitter
	// groups this node serves.
	Suites []string
	Groups []string
	// DefaultDiskBytes is what an attempt whose limits name no disk_bytes
	// may write besides its inputs: its workspace is made DefaultDiskBytes
	// plus three times the size of the tarballs it extracts (default
	// sandbox.DefaultDiskBytes).
	DefaultDiskBytes int64
	// MaxDiskBytes, when above 0, is the largest workspace the node makes:
	// an assignment whose limits ask for more is declined
	// (DECLINE_UNSUPPORTED), and a default size is capped to it.
	MaxDiskBytes int64
	// CacheQuota, when above 0, caps the content cache in bytes: content
	// no running attempt uses are evicted, least recently used first.
	CacheQuota int64
	// HostOptions are appended to the options of the node's libp2p host
	// (e.g. a transport of a test's own).
	HostOptions []libp2p.Option
	Logger      *slog.Logger
	// TestHooks play a misbehaving node in tests (nil in production).
	TestHooks *TestHooks
}

// TestHooks are test-only behaviours of a node that lies: production
// code never sets them. End-to-end tests use them to check that the
// coordinator catches what such a node does.
type TestHooks struct {
	// ModelRequest is given each model request an attempt's agent sends
	// through the node's model endpoint and returns the body to forward
	// (a node that plants a tool result, or drops earlier turns).
	ModelRequest func(attempt string, body []byte) []byte
}

// Sandbox is what the node needs of package sandbox (*sandbox.Runner).
type Sandbox interface {
	// KeyedImage finds the image imported under key (the agent CID).
	KeyedImage(ctx context.Context, key string) (name string, ok bool, err error)
	// ImportKeyedImage imports an OCI image-layout tarball under key.
	ImportKeyedImage(ctx context.Context, key string, tarball io.Reader) (string, error)
	// CreateWorkspace makes an attempt's size-capped writable space; its ID
	// is the Spec.ID of the attempt's Run.
	CreateWorkspace(ctx context.Context, attemptID string, sizeBytes int64) (*sandbox.Workspace, error)
	Run(ctx context.Context, spec sandbox.Spec) (sandbox.Result, error)
	// For jobs' environments: ImportImage imports a base image tarball
	// under its own names, HasImage looks an image up, PullImage pulls
	// one, BuildEnvironment builds a Dockerfile's image (or finds it
	// built), ImageConfig reads a job image's entrypoint and command.
	ImportImage(ctx context.Context, tarball io.Reader) (string, error)
	HasImage(ctx context.Context, ref string) (bool, error)
	PullImage(ctx context.Context, ref string, opts sandbox.PullOptions) (string, error)
	BuildEnvironment(ctx context.Context, spec sandbox.BuildSpec) (sandbox.BuildResult, error)
	ImageConfig(ctx context.Context, name string) (ocispec.ImageConfig, error)
}

func (c *Config) setDefaults() {
	if c.Network == "" {
		c.Network = "repronet-local"
	}
	if c.Registries == nil {
		c.Registries = DefaultRegistries()
	}
	if c.GPUDevices != nil && len(c.GPUs) == 0 {
		for _, d := range c.GPUDevices.Devices {
			c.GPUs = append(c.GPUs, GPU{Model: d.Model, MemoryBytes: d.MemoryBytes})
		}
	}
	if c.Slots == 0 {
		c.Slots = 1
	}
	if c.Slot == nil {
		c.Slot = &proto.SlotShape{CpuMillis: 1000, MemoryBytes: 4 << 30}
	}
	if c.GossipGrace == 0 {
		c.GossipGrace = 30 * time.Second
	}
	if c.AnnounceInterval == 0 {
		c.AnnounceInterval = 5 * time.Second
	}
	if c.DefaultDiskBytes <= 0 {
		c.DefaultDiskBytes = sandbox.DefaultDiskBytes
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Node is a running volunteer node.
type Node struct {
	cfg    Config
	log    *slog.Logger
	key    crypto.PrivKey
	host   host.Host
	ds     datastore.Batching
	outbox datastore.Batching
	store  *capsulestore.Store
	ps     *pubsub.PubSub
	topic  *pubsub.Topic
	// streams tracks gossipsub's outbound streams; gossipRedials counts
	// connections closed because announcements did not reach a
	// coordinator (gossipwatch.go).
	streams       *gossipStreams
	gossipRedials atomic.Int64
	coords        []peer.AddrInfo
	cancel        context.CancelFunc
	wg            sync.WaitGroup
	// announceNow asks for an announcement out of turn (a slot changed).
	announceNow chan struct{}
	deliverNow  chan struct{}

	// incarnation identifies this process to coordinators.
	incarnation  uint64
	operatorCert []byte
	guard        *proto.AnnouncementGuard

	metrics *prometheus.Registry
	// egress serves proxy-mode jobs; pkgs caches their packages (nil:
	// none); egressRefused counts what the proxy refused, since start.
	egress        *egress.Proxy
	pkgs          *pkgcache.Cache
	egressRefused atomic.Uint64
	// pulls reaches registryHosts alone, for environments' base images.
	pulls         *egress.Proxy
	registryHosts []string

	// disk guards the data folder's free space (every write to ds and to
	// the block files asks it first).
	disk *diskguard.Guard
	// unsaved are reports the outbox could not store (outbox.go).
	unsaved unsavedReports

	mu       sync.Mutex
	finished map[proto.Outcome]int // attempts run to a stored report, by outcome
	running  map[runKey]context.CancelFunc
	cached   map[string]time.Time // extracted inputs held -> last used
	joined   map[peer.ID]bool     // coordinators that admitted this node's operator
	gpus     *gpuPool
	seq      uint64
	lastAnn  time.Time
	closed   bool
	// draining: no new work (drain.go); handingBack are the attempts
	// cancelled to be handed back.
	draining    bool
	handingBack map[runKey]bool
	// tracked are the running attempts, for the status (status.go).
	tracked map[runKey]*trackedRun
	// imports serialises the lookup and import of each agent image, so
	// that one CID is imported once while others import beside it.
	imports keyedMutex
}

// New starts a node: opens its datastore, starts a libp2p host, connects
// to the coordinators and starts announcing and delivering.
func New(ctx context.Context, cfg Config) (*Node, error) {
	cfg.setDefaults()
	if cfg.DataDir == "" || len(cfg.Coordinators) == 0 || cfg.Sandbox == nil {
		return nil, errors.New("node: DataDir, Coordinators and Sandbox are required")
	}
	var coords []peer.AddrInfo
	for _, s := range cfg.Coordinators {
		ai, err := peer.AddrInfoFromString(s)
		if err != nil {
			return nil, fmt.Errorf("node: coordinator address %q: %w", s, err)
		}
		coords = append(coords, *ai)
	}
	key, err := identity.LoadOrCreate(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	ds, err := badgerds.Open(cfg.DataDir, cfg.Logger, badgerds.WithReserve(cfg.DiskReserve))
	if err != nil {
		return nil, fmt.Errorf("node: %w", err)
	}
	// Workspaces used to live in DataDir/work; they are now the sandbox's
	// (size-capped, removed by its Reconcile). Remove what an older version
	// left behind.
	if err := os.RemoveAll(filepath.Join(cfg.DataDir, "work")); err != nil {
		cfg.Logger.Warn("cannot remove the old workspace folder", "dir", filepath.Join(cfg.DataDir, "work"), "err", err)
	}
	n := &Node{
		cfg: cfg, log: cfg.Logger.With("component", "node"), key: key, ds: ds, disk: ds.Guard(),
		outbox: namespace.Wrap(ds, datastore.NewKey("/outbox")), coords: coords,
		announceNow: make(chan struct{}, 1), deliverNow: make(chan struct{}, 1),
		running: make(map[runKey]context.CancelFunc), cached: make(map[string]time.Time), joined: make(map[peer.ID]bool),
		handingBack: make(map[runKey]bool),
		gpus:        newGPUPool(cfg.GPUs),
		seq:         uint64(time.Now().UnixNano()), incarnation: newIncarnation(), guard: proto.NewAnnouncementGuard(cfg.Network),
		finished: make(map[proto.Outcome]int),
	}
	n.metrics = newMetrics(n)
	if err := n.start(ctx); err != nil {
		n.Close()
		return nil, err
	}
	return n, nil
}

func (n *Node) start(ctx context.Context) error {
	if err := n.startEgress(); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := n.startPulls(); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	if err := n.importBaseImages(ctx); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	opts := []libp2p.Option{libp2p.Identity(n.key), libp2p.PrometheusRegisterer(n.metrics)}
	if len(n.cfg.ListenAddrs) > 0 {
		opts = append(opts, libp2p.ListenAddrStrings(n.cfg.ListenAddrs...))
	} else {
		opts = append(opts, libp2p.NoListenAddrs)
	}
	opts = append(opts, n.cfg.HostOptions...)
	opts = append(opts, p2phost.Option())
	h, err := libp2p.New(opts...)
	if err != nil {
		return fmt.Errorf("node: start libp2p host: %w", err)
	}
	n.host = h
	// The connections to coordinators are the node's reason to be: never
	// trimmed for room, however many peers fetch from it.
	for _, c := range n.coords {
		h.ConnManager().Protect(c.ID, "repronet-coordinator")
	}
	if n.cfg.OperatorKey != nil {
		if n.operatorCert, err = proto.SealOperatorCert(n.cfg.OperatorKey, h.ID(), n.cfg.Network, time.Now()); err != nil {
			return fmt.Errorf("node: %w", err)
		}
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	n.cancel = cancel
	blocks := namespace.Wrap(n.ds, datastore.NewKey("/blocks"))
	// Block data lives in flat files beside badger (which keeps the index):
	// see docs/capsulestore.md for why.
	storeOpts := []capsulestore.Option{capsulestore.WithLogger(n.log), capsulestore.WithBlockDir(filepath.Join(n.cfg.DataDir, "blocks")),
		capsulestore.WithDiskGuard(n.disk)}
	if n.cfg.CacheQuota > 0 {
		storeOpts = append(storeOpts, capsulestore.WithQuota(n.cfg.CacheQuota))
	}
	if n.store, err = capsulestore.Open(runCtx, blocks, h, storeOpts...); err != nil {
		return fmt.Errorf("node: open capsule store: %w", err)
	}
	// What the cache held before a restart is announced again.
	held, err := n.store.List(ctx)
	if err != nil {
		return fmt.Errorf("node: list capsule cache: %w", err)
	}
	for _, e := range held {
		if e.Complete {
			n.cached[e.CID.String()] = e.LastUsed
		}
	}
	coordIDs := make([]peer.ID, len(n.coords))
	for i, c := range n.coords {
		coordIDs[i] = c.ID
	}
	n.streams = newGossipStreams()
	gossipOpts := append(proto.NodeGossipOptions(n.cfg.Network, coordIDs), pubsub.WithRawTracer(n.streams))
	if n.ps, err = pubsub.NewGossipSub(runCtx, h, gossipOpts...); err != nil {
		return fmt.Errorf("node: start gossipsub: %w", err)
	}
	// The node publishes on the capacity topic without subscribing: its
	// announcements go straight to its coordinators (the only topic peers
	// it hears of), and it neither receives nor relays anyone else's, so
	// what announcing costs it does not grow with the network. Its own
	// announcements pass the same validator before they leave.
	if n.topic, err = proto.JoinCapacityToPublish(n.ps, n.cfg.Network, n.guard); err != nil {
		return fmt.Errorf("node: %w", err)
	}
	events, err := n.topic.EventHandler()
	if err != nil {
		return fmt.Errorf("node: watch the capacity topic: %w", err)
	}
	h.SetStreamHandler(proto.AssignProtocol, n.handleAssign)

	n.goLoop(func() { n.watchCoordinators(runCtx, events) })
	n.goLoop(func() { n.connectLoop(runCtx) })
	n.goLoop(func() { n.announceLoop(runCtx) })
	n.goLoop(func() { n.deliverLoop(runCtx) })
	n.goLoop(func() { n.disk.Watch(runCtx, 5*time.Second) })
	n.log.Info("node started", "peer", h.ID(), "slots", n.cfg.Slots, "coordinators", len(n.coords),
		"operator_cert", len(n.operatorCert) > 0, "incarnation", n.incarnation)
	return nil
}

func (n *Node) goLoop(f func()) {
	n.wg.Add(1)
	go func() { defer n.wg.Done(); f() }()
}

// ID is the node's peer ID.
func (n *Node) ID() peer.ID { return n.host.ID() }

// Close stops the node: running attempts are cancelled (their containers
// are removed by the sandbox); undelivered reports stay in the outbox
// (but for those its full disk still has no room for, which are lost and
// logged).
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	for _, cancel := range n.running {
		cancel()
	}
	n.mu.Unlock()
	if n.cancel != nil {
		n.cancel()
	}
	var errs []error
	if n.host != nil {
		errs = append(errs, n.host.Close())
	}
	n.wg.Wait()
	if n.unsaved.len() > 0 {
		n.saveUnsaved(context.Background()) // a last try
		if k := n.unsaved.len(); k > 0 {
			n.log.Error("reports lost: the data folder had no room to store them and they were not delivered", "reports", k)
		}
	}
	if n.store != nil {
		errs = append(errs, n.store.Close())
	}
	errs = append(errs, n.ds.Close())
	return errors.Join(errs...)
}

// connectLoop keeps a connection open to every coordinator.
func (n *Node) connectLoop(ctx context.Context) {
	backoff := 250 * time.Millisecond
	links := gossipLinks{grace: n.cfg.GossipGrace, down: map[peer.ID]time.Time{}}
	for {
		allUp := true
		for _, ai := range n.coords {
			if n.host.Network().Connectedness(ai.ID) == network.Connected {
				if links.stale(ai.ID, n.gossipUp(ai.ID), time.Now()) {
					n.log.Warn("connected to coordinator, but announcements do not reach it; dialling again",
						"coordinator", ai.ID, "grace", n.cfg.GossipGrace, "gossip_stream", n.streams.has(ai.ID))
					n.gossipRedials.Add(1)
					_ = n.host.Network().ClosePeer(ai.ID)
				}
				continue
			}
			links.forget(ai.ID)
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := n.host.Connect(cctx, ai)
			cancel()
			if err != nil {
				allUp = false
				n.log.Warn("cannot reach coordinator", "coordinator", ai.ID, "err", err)
				continue
			}
			n.log.Info("connected to coordinator", "coordinator", ai.ID)
			if n.cfg.JoinToken != "" {
				n.join(ctx, ai.ID)
			}
			n.signal(n.announceNow)
			n.signal(n.deliverNow)
		}
		wait := 2 * time.Second
		if !allUp {
			wait, backoff = backoff, min(backoff*2, 10*time.Second)
		} else {
			backoff = 250 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// join presents the node's join token to coord once per process, so that
// its operator is admitted there.
func (n *Node) join(ctx context.Context, coord peer.ID) {
	n.mu.Lock()
	done := n.joined[coord]
	n.mu.Unlock()
	if done {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := n.sendJoin(ctx, coord)
	switch {
	case err != nil:
		n.log.Warn("cannot present the join token; will try again on reconnecting", "coordinator", coord, "err", err)
	case !resp.GetAdmitted():
		n.log.Error("join token refused: this node's operator counts as unadmitted there", "coordinator", coord, "reason", resp.GetReason())
	default:
		n.log.Info("operator admitted", "coordinator", coord, "operator", resp.GetOperator())
		n.mu.Lock()
		n.joined[coord] = true
		n.mu.Unlock()
	}
}

func (n *Node) sendJoin(ctx context.Context, coord peer.ID) (*proto.JoinResponse, error) {
	s, err := n.host.NewStream(ctx, coord, proto.JoinProtocol)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := proto.WriteMsg(s, &proto.JoinRequest{Token: n.cfg.JoinToken, OperatorCert: n.operatorCert}); err != nil {
		s.Reset()
		return nil, err
	}
	var resp proto.JoinResponse
	if err := proto.ReadMsg(s, &resp, proto.MaxControlSize); err != nil {
		s.Reset()
		return nil, err
	}
	return &resp, nil
}

func (n *Node) signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// watchCoordinators announces at once whenever a coordinator subscribes
// to the capacity topic as seen from here (it connected, or came back):
// until then the node's announcements have nowhere to go.
func (n *Node) watchCoordinators(ctx context.Context, events *pubsub.TopicEventHandler) {
	defer events.Cancel()
	for {
		ev, err := events.NextPeerEvent(ctx)
		if err != nil {
			return
		}
		if ev.Type == pubsub.PeerJoin {
			n.signal(n.announceNow)
		}
	}
}

func (n *Node) announceLoop(ctx context.Context) {
	start := time.Now()
	for {
		// Never faster than MinAnnounceGap, by the clock peers check.
		n.mu.Lock()
		wait := proto.MinAnnounceGap - time.Since(n.lastAnn)
		n.mu.Unlock()
		if wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
		}
		if err := n.announce(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("announce", "err", err)
		}
		wait = n.cfg.AnnounceInterval
		if time.Since(start) < 30*time.Second {
			wait = min(wait, time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		case <-n.announceNow:
		}
	}
}

// Announcement builds the node's current announcement.
func (n *Node) Announcement() *proto.Announcement {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.announcementLocked(time.Now())
}

func (n *Node) announcementLocked(now time.Time) *proto.Announcement {
	total := n.cfg.Slots
	if n.draining {
		// Coordinators count a node's free slots from its total less what
		// runs there: a draining node's total is what it still runs.
		total = min(total, len(n.running))
	}
	a := &proto.Announcement{
		Network: n.cfg.Network, PeerId: []byte(n.host.ID()), Seq: n.seq, UnixMillis: now.UnixMilli(),
		TotalSlots: uint32(total), FreeSlots: uint32(max(0, total-len(n.running))),
		Slot: n.cfg.Slot, Arch: runtime.GOARCH, Version: Version, OperatorCert: n.operatorCert,
		Suites: n.cfg.Suites, Groups: n.cfg.Groups, Incarnation: n.incarnation,
		Gpus: n.gpus.announced(), FreeGpus: uint32(n.gpus.free()),
	}
	perCoord := make(map[peer.ID]uint32, len(n.coords))
	for k := range n.running {
		perCoord[k.coord]++
	}
	for _, c := range n.coords {
		a.Coordinators = append(a.Coordinators, &proto.CoordinatorLoad{PeerId: []byte(c.ID), Running: perCoord[c.ID]})
	}
	// The keys of the most recently used capsules, as many as fit.
	type used struct {
		c  cid.Cid
		at time.Time
	}
	var caps []used
	for s, at := range n.cached {
		if c, err := cid.Decode(s); err == nil {
			caps = append(caps, used{c, at})
		}
	}
	slices.SortFunc(caps, func(x, y used) int {
		if d := y.at.Compare(x.at); d != 0 {
			return d
		}
		return strings.Compare(x.c.KeyString(), y.c.KeyString())
	})
	held := make([][]byte, 0, min(len(caps), proto.MaxCachedKeys))
	for _, u := range caps[:min(len(caps), proto.MaxCachedKeys)] {
		held = append(held, u.c.Bytes())
	}
	a.CachedKeys = proto.CacheKeys(held)
	return a
}

func (n *Node) announce(ctx context.Context) error {
	n.mu.Lock()
	n.seq++
	now := time.Now()
	n.lastAnn = now
	a := n.announcementLocked(now)
	n.mu.Unlock()
	b, err := gproto.Marshal(a)
	if err != nil {
		return fmt.Errorf("encode announcement: %w", err)
	}
	if err := n.topic.Publish(ctx, b); err != nil {
		return fmt.Errorf("publish announcement: %w", err)
	}
	return nil
}

// newIncarnation picks a random non-zero incarnation number.
func newIncarnation() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:])
		if v := binary.BigEndian.Uint64(b[:]); v != 0 {
			return v
		}
	}
}

// Holds reports whether the node's capsule store holds the whole DAG of c.
func (n *Node) Holds(ctx context.Context, c cid.Cid) (bool, error) { return n.store.Has(ctx, c) }

// keyedMutex is a mutex per key; entries live while someone holds or waits.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

// lock locks key and returns its unlock function.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	if k.m == nil {
		k.m = make(map[string]*keyedEntry)
	}
	e := k.m[key]
	if e == nil {
		e = &keyedEntry{}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}
