// Package coordinator is a repronet coordinator's shell: everything around
// the deterministic core (package core, which owns the life of every
// attempt and unit) that touches the world. It owns the libp2p host
// (gossipsub intake of node announcements; the assign, lease, report and
// join streams), the journal that makes the core's records durable before
// anything is acted on (package journal), the capsule store, the catalog
// of suites, content and agents (package catalog), the scoring workers
// that call each suite's family outside the lock, reproducibility checks,
// join tokens, the leaderboards and the HTTP API. Gold answers never leave
// it; when its data folder runs out of room it acknowledges nothing it
// cannot write and resumes by itself (diskfull.go).
//
// Where to look: coordinator.go (Config, New, start-up and restore),
// step.go (one event through the core, its records through the journal,
// its effects carried out), gossip.go (announcements), dispatch.go
// (scheduling rounds, offers, leases), ingest.go and outputs.go (reports
// and their outputs), score.go (scoring workers), reproduce.go,
// admission.go, leaderboard.go, metrics.go; people's access (accounts,
// scopes, the JSON API and the dashboard's pages) in web.go, web_data.go,
// web_pages.go and api*.go.
//
// It must not run containers or touch a node's files (that is the node's
// job), and must not decide anything about an attempt's life itself: that
// is the core's.
package coordinator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/namespace"
	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/capsulestore"
	"github.com/repronet/repronet/coordinator/catalog"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/journal"
	"github.com/repronet/repronet/coordinator/schedule"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/badgerds"
	"github.com/repronet/repronet/internal/diskguard"
	"github.com/repronet/repronet/internal/identity"
	"github.com/repronet/repronet/internal/lograte"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/internal/schema"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/verify"
)

// Config configures a coordinator. DataDir is required.
type Config struct {
	// Network names the volunteer pool; nodes announce on its topic.
	// Several coordinators may share one network and its nodes.
	Network string
	// Families are the benchmark families this coordinator can import and
	// run (required: the binary registers them, e.g. CORE-Bench).
	Families *bench.Registry
	// Checker judges reproducibility checks (nil: the coordinator takes
	// none).
	Checker bench.Checker
	// DataDir holds the identity key and the badger datastore.
	DataDir string
	// DiskReserve is the free space the data folder keeps (default
	// DefaultDiskReserve): below it nothing more is written, reports are
	// answered "retry", new evaluations and imports are refused, and all
	// resumes by itself once space returns.
	DiskReserve uint64
	// MaxImageUnpacked bounds what an agent image's files add up to
	// (default ociimage.DefaultUnpackedBytes): a bigger image is refused
	// at its push, as every image ociimage.Check refuses.
	MaxImageUnpacked int64
	// ListenAddrs are libp2p listen multiaddrs (default: loopback TCP, any port).
	ListenAddrs []string
	// LeaseTTL is how long an assignment lives without renewal.
	LeaseTTL time.Duration
	// Renewals never take a lease past its attempt's limit: the time
	// allowed to fetch its inputs (FetchAllowance plus their size at
	// MinFetchRate bytes a second), its wall-clock limit and LeaseMargin to
	// report (defaults: 1 minute, 2 MiB/s, 2 x LeaseTTL).
	FetchAllowance time.Duration
	MinFetchRate   int64
	LeaseMargin    time.Duration
	// Allowance bounds the attempts a node may hold at once by what it has
	// shown it finishes (default DefaultAllowancePolicy).
	Allowance *AllowancePolicy
	// NodeTTL is how long a node stays in view after its last announcement.
	NodeTTL time.Duration
	// Limits are the per-attempt limits sent with every assignment.
	Limits *proto.Limits
	// MaxTries bounds how often an attempt is retried after infrastructure
	// failures reported by nodes.
	MaxTries int
	// MaxLateReports bounds the late reports kept per attempt (default 4),
	// and MaxLateBytes the bytes of late reports kept per node, a budget
	// that halves every HalfLife (default 32 MiB). Beyond them a late
	// report is refused with the reason. A node has at most one report of
	// an attempt on record.
	MaxLateReports int
	MaxLateBytes   int64
	// MaxDeclines bounds the distinct nodes that may decline an attempt
	// for a lasting reason before it fails with outcome "declined"
	// (default 5); it fails at once when every node in view that could run
	// it has declined it.
	MaxDeclines int
	// UnschedulableAfter is how long an attempt may stay queued while
	// nodes are in view and none of them could run it (its limits exceed
	// every slot, no node serves its suite or group or has its GPUs, or
	// every one that could failed or declined it) before it ends with
	// outcome "unschedulable" and the reason (default 10 minutes;
	// core/stuck.go). One that every eligible node in view failed ends at
	// once.
	UnschedulableAfter time.Duration
	// MaxLeaseLosses bounds how often an attempt is requeued because its
	// lease ran out or died with its node.
	MaxLeaseLosses int
	// AvoidAfterLeaseLoss keeps an attempt off the node that lost its lease
	// for this long (default 4 x LeaseTTL).
	AvoidAfterLeaseLoss time.Duration
	// Operators are the peer IDs of admitted operators: only they (and
	// operators admitted with a join token) count as operators of their
	// own; every other node counts as UnadmittedOperator (see
	// admission.go). OpenOperators trusts every operator certificate
	// instead, as before admission existed: for a pool run by one person.
	Operators     []string
	OpenOperators bool
	// JoinTokens are standing join tokens (no expiry, no use limit), e.g.
	// from --join-token-file; NewJoinToken makes others.
	JoinTokens []string
	// Groups holds the fair-share policy of submitter groups; a group not
	// listed has weight 1 and no quota.
	Groups map[string]GroupConfig
	// HalfLife is the fair-share usage half-life (default schedule.DefaultHalfLife).
	HalfLife time.Duration
	// ScheduleInterval is how often the scheduler runs when nothing wakes
	// it (default 500 ms).
	ScheduleInterval time.Duration
	// AdminToken, when set, enables the HTTP admin API (POST
	// /api/evaluations and /api/repro, GET /api/attempts,
	// /api/reports/{attempt} and /api/crosscheck/nodes) for requests
	// bearing it.
	AdminToken string
	// CrossCheck is the replication and trust policy (default
	// crosscheck.DefaultPolicy: a quorum of 2 on distinct nodes and
	// operators, BOINC's adaptive replication, canaries).
	CrossCheck *crosscheck.Policy
	// Verify is the replay verification policy of model-driven attempts
	// (nil: verify.DefaultPolicy: every attempt of a new node replayed,
	// the rate falling with clean replays to 5%).
	Verify *verify.Policy
	// IdleCanaryEvery: a node with a free slot that was given nothing for
	// this long may be given a canary (at its canary probability) even
	// when no work is queued, so that nodes are checked continually.
	// Default 10 minutes; negative: only while work is being placed.
	IdleCanaryEvery time.Duration
	// PublicBoardsEvery: the public leaderboard endpoints serve a snapshot
	// at most this old (default 1 minute; negative: always live), so a node
	// cannot time a board's change against the report it just sent and so
	// tell its canaries from real work. Admin requests see them live.
	PublicBoardsEvery time.Duration
	// MaxReproUpload bounds a capsule tarball submitted for a
	// reproducibility check (default 16 GiB).
	MaxReproUpload int64
	// Gateway, when set, gives agents model access through the metered
	// gateway this coordinator runs (package gateway; docs/gateway.md):
	// providers with their keys, models with their prices. GroupBudgets
	// caps each submitter group's model spend in dollars (absent or 0:
	// none); evaluations cap theirs (Evaluation.Budget).
	Gateway      *gateway.Config
	GroupBudgets map[string]float64
	// Scorers is how many scoring workers run beside each other (default
	// 4); ScoreTimeout bounds one scoring (default 10 minutes: a judge may
	// call a model).
	Scorers      int
	ScoreTimeout time.Duration
	// MaxConnsPerIP bounds the connections accepted from one IPv4 address
	// (or IPv6 /56); every node of a consortium behind one NAT address
	// counts against it (0: p2phost.DefaultMaxConnsPerIP).
	MaxConnsPerIP int
	// HostOptions are added to the libp2p host's options (tests use them
	// for a plaintext transport whose bytes they can inspect).
	HostOptions []libp2p.Option
	Logger      *slog.Logger
}

// DefaultNetwork is the network name used when none is given.
const DefaultNetwork = "repronet-local"

func (c *Config) setDefaults() {
	if c.Network == "" {
		c.Network = DefaultNetwork
	}
	if len(c.ListenAddrs) == 0 {
		c.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 30 * time.Second
	}
	if c.FetchAllowance == 0 {
		c.FetchAllowance = time.Minute
	}
	if c.MinFetchRate == 0 {
		c.MinFetchRate = 2 << 20
	}
	if c.LeaseMargin == 0 {
		c.LeaseMargin = 2 * c.LeaseTTL
	}
	if c.Allowance == nil {
		p := DefaultAllowancePolicy()
		c.Allowance = &p
	}
	if c.NodeTTL == 0 {
		c.NodeTTL = 15 * time.Second
	}
	if c.Limits == nil {
		c.Limits = &proto.Limits{CpuMillis: 1000, MemoryBytes: 4 << 30, Pids: 1024, WallSeconds: 2700, OutputBytes: 1 << 20}
	}
	if c.MaxTries == 0 {
		c.MaxTries = 3
	}
	if c.MaxLateReports == 0 {
		c.MaxLateReports = 4
	}
	if c.MaxLateBytes == 0 {
		c.MaxLateBytes = 32 << 20
	}
	if c.MaxDeclines == 0 {
		c.MaxDeclines = 5
	}
	if c.MaxLeaseLosses == 0 {
		c.MaxLeaseLosses = 10
	}
	if c.AvoidAfterLeaseLoss == 0 {
		c.AvoidAfterLeaseLoss = 4 * c.LeaseTTL
	}
	if c.HalfLife == 0 {
		c.HalfLife = schedule.DefaultHalfLife
	}
	if c.ScheduleInterval == 0 {
		c.ScheduleInterval = 500 * time.Millisecond
	}
	if c.CrossCheck == nil {
		p := crosscheck.DefaultPolicy()
		c.CrossCheck = &p
	}
	if c.PublicBoardsEvery == 0 {
		c.PublicBoardsEvery = time.Minute
	}
	if c.IdleCanaryEvery == 0 {
		c.IdleCanaryEvery = 10 * time.Minute
	}
	if c.MaxReproUpload == 0 {
		c.MaxReproUpload = 16 << 30
	}
	if c.Scorers == 0 {
		c.Scorers = 4
	}
	if c.ScoreTimeout == 0 {
		c.ScoreTimeout = 10 * time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// coreConfig is the core's part of the configuration.
func (c *Config) coreConfig(self string, seed [32]byte, secret []byte, log *slog.Logger) core.Config {
	var models []string
	if c.Gateway != nil {
		models = c.Gateway.ModelNames()
	}
	return core.Config{Models: models, Self: self, LeaseTTL: c.LeaseTTL, NodeTTL: c.NodeTTL, FetchAllowance: c.FetchAllowance,
		MinFetchRate: c.MinFetchRate, LeaseMargin: c.LeaseMargin, AvoidAfterLeaseLoss: c.AvoidAfterLeaseLoss,
		MaxTries: c.MaxTries, MaxLeaseLosses: c.MaxLeaseLosses, MaxDeclines: c.MaxDeclines, MaxLateReports: c.MaxLateReports,
		UnschedulableAfter: c.UnschedulableAfter,
		MaxLateBytes:       c.MaxLateBytes, Groups: c.Groups, HalfLife: c.HalfLife, IdleCanaryEvery: c.IdleCanaryEvery,
		CrossCheck: *c.CrossCheck, Verify: verifyPolicy(c.Verify), Allowance: *c.Allowance, OpenOperators: c.OpenOperators, Limits: c.Limits, Seed: seed,
		IDSecret: secret, Logger: log}
}

// Coordinator is a running coordinator. Create it with New; stop it with Close.
type Coordinator struct {
	cfg Config
	log *slog.Logger
	// joinLog bounds the lines about refused joins (anyone may ask).
	joinLog *lograte.Limiter
	// backupBegun, when set (tests only), runs once a backup has opened
	// its read transaction, before it reads from it, while the
	// coordinator goes on.
	backupBegun func()
	metrics     *prometheus.Registry
	host        host.Host
	ds          datastore.Batching
	// disk guards the data folder's free space (every write to ds and to
	// the block files asks it first).
	disk    *diskguard.Guard
	journal *journal.Journal
	catalog *catalog.Catalog
	store   *capsulestore.Store
	ps      *pubsub.PubSub
	topic   *pubsub.Topic
	sub     *pubsub.Subscription
	guard   *proto.AnnouncementGuard
	scoring *scoreQueue
	// models is model access (nil: no gateway); trajectories keep the
	// model calls of attempts (models.go).
	models       *models
	trajectories *trajectories
	cancel       context.CancelFunc
	wg           sync.WaitGroup
	wake         chan struct{}

	scoreMu sync.Mutex
	scores  map[peer.ID]float64

	// mu serialises the core: every Step, and every read of the state,
	// holds it; the journal cuts its batches under it.
	mu    sync.Mutex
	state *core.State
	// joinTokens are the join tokens by hash (admission.go).
	joinTokens map[string]*JoinToken
	closed     bool

	// web is people's access: accounts, the dashboard (web.go).
	web *web
}

// New starts a coordinator: opens its datastore, restores its state,
// starts a libp2p host with gossipsub and the stream handlers.
func New(ctx context.Context, cfg Config) (*Coordinator, error) {
	cfg.setDefaults()
	if cfg.DataDir == "" || cfg.Families == nil {
		return nil, errors.New("coordinator: DataDir and Families are required")
	}
	if err := schema.Open(ctx, cfg.DataDir, cfg.Logger, schemaParts()...); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	key, err := identity.LoadOrCreate(cfg.DataDir)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	if err := cfg.CrossCheck.Validate(); err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	secret, err := idSecret(key)
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	ds, err := badgerds.Open(cfg.DataDir, cfg.Logger, badgerds.WithReserve(cfg.DiskReserve))
	if err != nil {
		return nil, fmt.Errorf("coordinator: %w", err)
	}
	c := &Coordinator{
		cfg:        cfg,
		log:        cfg.Logger.With("component", "coordinator"),
		joinLog:    lograte.New(10, 6*time.Second, nil),
		ds:         ds,
		joinTokens: make(map[string]*JoinToken),
		guard:      proto.NewAnnouncementGuard(cfg.Network),
		wake:       make(chan struct{}, 1),
	}
	c.disk = ds.Guard()
	c.journal = journal.New(ds, stateKey, journal.WithLock(&c.mu), journal.WithLogger(c.log))
	c.scoring = newScoreQueue()
	c.metrics = newMetrics(c)
	if err := c.start(ctx, key, secret); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Coordinator) start(ctx context.Context, key crypto.PrivKey, secret []byte) error {
	self, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return fmt.Errorf("coordinator: identity: %w", err)
	}
	if c.catalog, err = catalog.Open(ctx, c.ds, c.cfg.Families, c.cfg.Limits); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	var seed [32]byte
	_, _ = rand.Read(seed[:])
	if c.state, err = core.New(c.cfg.coreConfig(self.String(), seed, secret, c.log), c.catalog); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if err := c.restore(ctx); err != nil {
		return fmt.Errorf("coordinator: load state: %w", err)
	}
	opts := append([]libp2p.Option{libp2p.Identity(key), libp2p.ListenAddrStrings(c.cfg.ListenAddrs...),
		libp2p.PrometheusRegisterer(c.metrics)}, c.cfg.HostOptions...)
	// Every node keeps a connection to each coordinator it serves.
	limits := []p2phost.Setting{p2phost.WithMaxPeers(p2phost.CoordinatorMaxPeers)}
	if c.cfg.MaxConnsPerIP != 0 {
		limits = append(limits, p2phost.WithMaxConnsPerIP(c.cfg.MaxConnsPerIP))
	}
	opts = append(opts, p2phost.Option(limits...))
	h, err := libp2p.New(opts...)
	if err != nil {
		return fmt.Errorf("coordinator: start libp2p host: %w", err)
	}
	c.host = h
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel

	blocks := namespace.Wrap(c.ds, datastore.NewKey("/blocks"))
	if c.store, err = capsulestore.Open(runCtx, blocks, h, capsulestore.WithLogger(c.log),
		capsulestore.WithBlockDir(filepath.Join(c.cfg.DataDir, "blocks")), capsulestore.WithDiskGuard(c.disk)); err != nil {
		return fmt.Errorf("coordinator: open capsule store: %w", err)
	}
	psOpts := append(proto.CoordinatorGossipOptions(c.cfg.Network, nil), pubsub.WithPeerScoreInspect(c.setScores, time.Second))
	if c.ps, err = pubsub.NewGossipSub(runCtx, h, psOpts...); err != nil {
		return fmt.Errorf("coordinator: start gossipsub: %w", err)
	}
	c.topic, c.sub, err = proto.JoinCapacity(c.ps, c.cfg.Network, c.guard, func(from, author peer.ID, err error) {
		c.log.Warn("announcement rejected", "from", author, "via", from, "err", err)
	})
	if err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if err := c.startModels(runCtx, secret); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	if err := c.startWeb(runCtx, secret); err != nil {
		return fmt.Errorf("coordinator: %w", err)
	}
	h.SetStreamHandler(proto.LeaseProtocol, c.handleLease)
	h.SetStreamHandler(proto.JoinProtocol, c.handleJoin)
	h.SetStreamHandler(proto.ReportProtocol, c.handleReport)

	c.goLoop(func() { c.announcementLoop(runCtx) })
	c.goLoop(func() { c.scheduleLoop(runCtx) })
	for range c.cfg.Scorers {
		c.goLoop(func() { c.scoreLoop(runCtx) })
	}
	c.mu.Lock()
	p := c.state.Progress()
	c.mu.Unlock()
	c.log.Info("coordinator started", "peer", h.ID(), "addrs", c.Addrs(), "network", c.cfg.Network,
		"attempts", p.Total, "queued", p.Queued, "to_score", p.Reported)
	return nil
}

func (c *Coordinator) goLoop(f func()) {
	c.wg.Add(1)
	go func() { defer c.wg.Done(); f() }()
}

// stateKey is the prefix of every record of the coordinator's state.
var stateKey = datastore.NewKey("/state")

// restore reads the durable records and makes the core's state of them
// (core.State.Restore: queued attempts back in the queue, assigned ones
// with a lease, reported ones scored again), then the join tokens and the
// configured operators.
func (c *Coordinator) restore(ctx context.Context) error {
	var snap core.Snapshot
	var err error
	load := func(prefix string, into func(b []byte) error) {
		if err == nil {
			err = eachRecord(ctx, c.ds, prefix, into)
		}
	}
	load(core.AttemptsKey, appendJSON(&snap.Attempts))
	load(core.NodesKey, appendJSON(&snap.Records))
	load(core.UsageKey, appendJSON(&snap.Usage))
	load(core.EvalsKey, appendJSON(&snap.Evals))
	load(core.PipelinesKey, appendJSON(&snap.Pipelines))
	load(core.ReprosKey, appendJSON(&snap.Repros))
	load(core.AdmittedKey, appendJSON(&snap.Admitted))
	load(core.PoolsKey, appendJSON(&snap.Pools))
	load(core.WorksKey, appendJSON(&snap.Works))
	load(core.BookNodesKey, appendJSON(&snap.BookNodes))
	var tokens []JoinToken
	load(joinTokensKey.String(), appendJSON(&tokens))
	if err != nil {
		return err
	}
	c.mu.Lock()
	fx := c.state.Restore(snap, time.Now())
	t := c.write(fx.Records)
	for i := range tokens {
		c.joinTokens[tokens[i].Hash] = &tokens[i]
	}
	err = c.admitConfigured()
	c.mu.Unlock()
	if err != nil {
		return err
	}
	c.carry(ctx, fx, t)
	return nil
}

// eachRecord calls into with the value of every record under prefix, in
// key order.
func eachRecord(ctx context.Context, ds datastore.Batching, prefix string, into func(b []byte) error) error {
	return eachRecordKey(ctx, ds, prefix, func(_ string, b []byte) error { return into(b) })
}

// appendJSON decodes each record into a new element of *out.
func appendJSON[T any](out *[]T) func(b []byte) error {
	return func(b []byte) error {
		var v T
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		*out = append(*out, v)
		return nil
	}
}

// Close stops the coordinator and closes its datastore.
func (c *Coordinator) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.mu.Unlock()
	if c.cancel != nil {
		c.cancel()
	}
	if c.sub != nil {
		c.sub.Cancel()
	}
	var errs []error
	if c.host != nil {
		errs = append(errs, c.host.Close())
	}
	c.wg.Wait()
	if c.store != nil {
		errs = append(errs, c.store.Close())
	}
	errs = append(errs, c.journal.Close(), c.ds.Close())
	return errors.Join(errs...)
}

// ID is the coordinator's peer ID.
func (c *Coordinator) ID() peer.ID { return c.host.ID() }

// Host is the coordinator's libp2p host.
func (c *Coordinator) Host() host.Host { return c.host }

// Addrs are the coordinator's full multiaddrs (with /p2p/ID), to give nodes.
func (c *Coordinator) Addrs() []ma.Multiaddr {
	out, _ := peer.AddrInfoToP2pAddrs(&peer.AddrInfo{ID: c.host.ID(), Addrs: c.host.Addrs()})
	return out
}

// setScores keeps the latest gossipsub peer scores (called every second).
func (c *Coordinator) setScores(m map[peer.ID]float64) {
	c.scoreMu.Lock()
	c.scores = m
	c.scoreMu.Unlock()
}

// GossipScore is a peer's gossipsub score as this coordinator last
// computed it (refreshed every second), and whether it has one.
func (c *Coordinator) GossipScore(p peer.ID) (float64, bool) {
	c.scoreMu.Lock()
	defer c.scoreMu.Unlock()
	s, ok := c.scores[p]
	return s, ok
}

// kick asks for a scheduling round now.
func (c *Coordinator) kick() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// randomID is a fresh random ID with prefix and 24 hex digits.
func randomID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// idSecret derives the key of attempt ID derivation from the
// coordinator's identity key: stable across restarts, unknown to nodes.
func idSecret(key crypto.PrivKey) ([]byte, error) {
	raw, err := key.Raw()
	if err != nil {
		return nil, fmt.Errorf("identity key: %w", err)
	}
	sum := sha256.Sum256(append([]byte("repronet attempt IDs\x00"), raw...))
	return sum[:], nil
}
