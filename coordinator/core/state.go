package core

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/lease"
	"github.com/repronet/repronet/coordinator/schedule"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/verify"
)

// Config sets up a State. The zero value of a duration or count means its
// default (see Defaults).
type Config struct {
	// Self is this coordinator's peer ID (announcements list the
	// coordinators a node serves).
	Self string
	// LeaseTTL is how long an assignment lives without renewal; NodeTTL
	// how long a node stays in view after its last announcement.
	LeaseTTL, NodeTTL time.Duration
	// Renewals never take a lease past its attempt's limit: the time
	// allowed to fetch its inputs (FetchAllowance plus their size at
	// MinFetchRate bytes a second), its wall-clock limit and LeaseMargin.
	FetchAllowance time.Duration
	MinFetchRate   int64
	LeaseMargin    time.Duration
	// AvoidAfterLeaseLoss keeps an attempt off the node that lost its
	// lease for this long.
	AvoidAfterLeaseLoss time.Duration
	// UnschedulableAfter is how long an attempt may stay queued while
	// nodes are in view and none of them could run it before it ends as
	// unschedulable (stuck.go).
	UnschedulableAfter time.Duration
	// MaxTries bounds infrastructure failures of an attempt, MaxLeaseLosses
	// its lost leases, MaxDeclines the nodes that may decline it.
	MaxTries, MaxLeaseLosses, MaxDeclines int
	// MaxLateReports bounds the late reports kept per attempt, MaxLateBytes
	// the bytes of late reports kept per node (a budget that halves every
	// HalfLife).
	MaxLateReports int
	MaxLateBytes   int64
	// MaxScoreTries bounds the scorings of an attempt that fail before it
	// waits for a restart (never counted against the agent); ScoreRetry is
	// the wait before the first retry (doubled each time).
	MaxScoreTries int
	ScoreRetry    time.Duration
	// Groups holds the fair-share policy of submitter groups; HalfLife is
	// the fair-share usage half-life.
	Groups   map[string]schedule.GroupConfig
	HalfLife time.Duration
	// IdleCanaryEvery: a node given nothing for this long may be given a
	// canary; negative: only while work is being placed.
	IdleCanaryEvery time.Duration
	// CrossCheck is the replication and trust policy; Allowance the node
	// allowance policy.
	CrossCheck crosscheck.Policy
	Allowance  lease.AllowancePolicy
	// Models are the models the coordinator's gateway serves (none: no
	// model access): an evaluation naming another is refused.
	Models []string
	// Verify is the replay verification policy of model-driven attempts
	// (zero: verify.DefaultPolicy).
	Verify verify.Policy
	// OpenOperators trusts every operator certificate; otherwise only
	// admitted operators count apart (see Admit).
	OpenOperators bool
	// Limits are the limits of jobs whose suite has none of its own.
	Limits *proto.Limits
	// Seed seeds the generator of replica IDs, spot checks and canaries;
	// IDSecret keys the derivation of attempt IDs from evaluation IDs.
	// Both must stay unknown to nodes.
	Seed     [32]byte
	IDSecret []byte
	Logger   *slog.Logger
}

// Defaults fills in the zero fields.
func (c *Config) Defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(n *int, v int) {
		if *n == 0 {
			*n = v
		}
	}
	def(&c.LeaseTTL, 30*time.Second)
	def(&c.NodeTTL, 15*time.Second)
	def(&c.FetchAllowance, time.Minute)
	def(&c.LeaseMargin, 2*c.LeaseTTL)
	def(&c.AvoidAfterLeaseLoss, 4*c.LeaseTTL)
	def(&c.HalfLife, schedule.DefaultHalfLife)
	def(&c.IdleCanaryEvery, 10*time.Minute)
	def(&c.ScoreRetry, 5*time.Second)
	def(&c.UnschedulableAfter, DefaultUnschedulableAfter)
	if c.MinFetchRate == 0 {
		c.MinFetchRate = 2 << 20
	}
	defInt(&c.MaxTries, 3)
	defInt(&c.MaxLeaseLosses, 10)
	defInt(&c.MaxDeclines, 5)
	defInt(&c.MaxLateReports, 4)
	defInt(&c.MaxScoreTries, 5)
	if c.MaxLateBytes == 0 {
		c.MaxLateBytes = 32 << 20
	}
	if c.CrossCheck == (crosscheck.Policy{}) {
		c.CrossCheck = crosscheck.DefaultPolicy()
	}
	if c.Verify == (verify.Policy{}) {
		c.Verify = verify.DefaultPolicy()
	}
	if c.Allowance == (lease.AllowancePolicy{}) {
		c.Allowance = lease.DefaultAllowancePolicy()
	}
	if c.Limits == nil {
		c.Limits = &proto.Limits{CpuMillis: 1000, MemoryBytes: 4 << 30, Pids: 1024, WallSeconds: 2700, OutputBytes: 1 << 20}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
}

// Catalog is what the core knows of imported suites, agents and content:
// read-only lookups of plain data (package coordinator keeps it).
type Catalog interface {
	LookupSuite(name string) (SuiteInfo, bool)
	LookupAgent(name string) (AgentInfo, bool)
	LookupContent(name string) (ContentInfo, bool)
}

// SuiteInfo is an imported suite: its family's view (tasks, variants,
// pipelines: pure) and the limits its jobs run under.
type SuiteInfo struct {
	Bench bench.Suite
	// Tasks indexes Bench.Tasks() by ID.
	Tasks  map[string]bench.Task
	Limits *proto.Limits
}

// AgentInfo is a registered agent (or image).
type AgentInfo struct {
	CID  string
	Size int64
	// Deterministic: every honest node gets the same grading of it.
	Deterministic bool
	Model         string
	// NotReplayable: the submitter declares the agent not replayable
	// (hidden randomness outside the model's answers): its model-driven
	// results are never replayed and show as unverified.
	NotReplayable bool
}

// ContentInfo is imported content (a capsule tarball...).
type ContentInfo struct {
	CID  string
	Size int64
}

// NodeView is the core's view of a node from its latest announcement.
type NodeView struct {
	Seq         uint64
	Incarnation uint64
	// Certified is the operator its announcement names (its certificate's
	// signer, or itself); Operator the one it counts as.
	Certified, Operator string
	TotalSlots          int
	FreeSlots           int
	// Mine is what it says this coordinator holds there, Others what other
	// coordinators hold; ServesUs whether it lists this coordinator.
	Mine, Others int
	ServesUs     bool
	Slot         schedule.Shape
	GPUs         []schedule.GPU
	FreeGPUs     int
	Suites       []string
	Groups       []string
	Cached       map[string]bool
	Version      string
	LastSeen     time.Time
	// Connected: the node's connection to this coordinator is up (set by
	// the shell with each tick).
	Connected bool
	// hold keeps the scheduler off the node until an announcement newer
	// than this seq arrives (it declined as busy, or could not be reached).
	hold uint64
}

// State is the coordinator's lifecycle state: attempts, queue, units,
// leases, node records and views, fair-share usage, evaluations,
// pipelines, reproducibility checks, admitted operators and the
// cross-check book. Every field is plain data; only Step (and the read
// methods) touch it, one call at a time.
type State struct {
	cfg     Config
	catalog Catalog
	log     *slog.Logger
	rng     *mrand.Rand

	Attempts map[string]*Attempt
	// Queue holds the queued attempts' IDs.
	Queue []string
	// Units maps a cross-check work to its attempts.
	Units     map[string][]string
	Seq       uint64
	Leases    *lease.Leases
	Nodes     map[string]*NodeView
	Records   map[string]*NodeRecord
	Usage     map[string]schedule.GroupUsage
	Evals     map[string]EvalRecord
	Pipelines map[string]*Pipeline
	Repros    map[string]*ReproRecord
	Admitted  map[string]Admitted
	// Pools are the records of the nodes that share their bounds
	// (pool.go: every unadmitted node, as one).
	Pools map[string]*PoolRecord
	Book  *crosscheck.Book
	// canarySources are the units that may be replayed as canaries.
	canarySources idSet
	// lastJob is when each node was last given a job (idle canaries).
	lastJob map[string]time.Time
	// holders indexes Nodes by the content they announce as cached.
	holders map[string]*idSet
	// BusyDeclines and OfferFailures count, since start, offers declined
	// for want of a slot and offers that never got an answer.
	BusyDeclines, OfferFailures int
	// lastStuckCheck and nextStuckCheck are when the last checkStuck round
	// ran and the earliest the next may.
	lastStuckCheck, nextStuckCheck time.Time
	// room is what each pool may still be given in the scheduling round
	// being applied (pool.go).
	room map[string]int

	// now and fx are the time and the effects of the Step being applied.
	now time.Time
	fx  *Effects
}

// New returns an empty State.
func New(cfg Config, catalog Catalog) (*State, error) {
	cfg.Defaults()
	if err := cfg.CrossCheck.Validate(); err != nil {
		return nil, err
	}
	if err := cfg.Verify.Validate(); err != nil {
		return nil, err
	}
	book, err := crosscheck.NewBook(cfg.CrossCheck)
	if err != nil {
		return nil, err
	}
	return &State{
		cfg: cfg, catalog: catalog, log: cfg.Logger,
		rng:      mrand.New(mrand.NewChaCha8(cfg.Seed)),
		Attempts: map[string]*Attempt{}, Units: map[string][]string{}, Leases: lease.NewLeases(cfg.LeaseTTL),
		Nodes: map[string]*NodeView{}, Records: map[string]*NodeRecord{}, Usage: map[string]schedule.GroupUsage{},
		Evals: map[string]EvalRecord{}, Pipelines: map[string]*Pipeline{}, Repros: map[string]*ReproRecord{},
		Admitted: map[string]Admitted{}, Pools: map[string]*PoolRecord{}, Book: book, lastJob: map[string]time.Time{}, holders: map[string]*idSet{},
	}, nil
}

// Config is the state's configuration, defaults filled in.
func (s *State) Config() Config { return s.cfg }

// Snapshot is what a State is restored from: every durable record, as
// read back from storage.
type Snapshot struct {
	Attempts  []Attempt
	Records   []NodeRecord
	Usage     []schedule.GroupUsage
	Evals     []EvalRecord
	Pipelines []Pipeline
	Repros    []ReproRecord
	Admitted  []Admitted
	Pools     []PoolRecord
	Works     []crosscheck.Attempt
	BookNodes []crosscheck.NodeRecord
}

// Restore makes s the state a snapshot describes, at now (a coordinator
// restart). Queued attempts go back in the queue in Seq order; an attempt
// that was assigned keeps its node, with a lease until the later of its
// stored deadline and a full TTL from now (renewals are not synced one by
// one, so this is never earlier than any deadline acknowledged to the node
// before a crash), never past its limit; an attempt whose report was
// recorded is scored again. It returns the effects to carry out.
func (s *State) Restore(snap Snapshot, now time.Time) Effects {
	s.begin(now)
	for i := range snap.Records {
		s.Records[snap.Records[i].ID] = &snap.Records[i]
	}
	for _, u := range snap.Usage {
		s.Usage[u.Group] = u
	}
	for _, e := range snap.Evals {
		s.Evals[e.ID] = e
	}
	for i := range snap.Pipelines {
		s.Pipelines[snap.Pipelines[i].ID] = &snap.Pipelines[i]
	}
	for i := range snap.Repros {
		s.Repros[snap.Repros[i].ID] = &snap.Repros[i]
	}
	for _, a := range snap.Admitted {
		s.Admitted[a.Operator] = a
	}
	for i := range snap.Pools {
		s.Pools[snap.Pools[i].ID] = &snap.Pools[i]
	}
	for i := range snap.Works {
		w := &snap.Works[i]
		if w.Jobs == nil {
			w.Jobs = map[string]string{}
		}
		if w.JobOperators == nil {
			w.JobOperators = map[string]string{}
		}
		s.Book.Attempts[w.Work.ID] = w
		s.noteDecision(w.Work.ID)
	}
	for i := range snap.BookNodes {
		s.Book.Nodes[snap.BookNodes[i].Node] = &snap.BookNodes[i]
	}
	atts := snap.Attempts
	slices.SortFunc(atts, func(a, b Attempt) int {
		if d := cmp.Compare(a.Seq, b.Seq); d != 0 {
			return d
		}
		if d := a.EnqueuedAt.Compare(b.EnqueuedAt); d != 0 {
			return d
		}
		return cmp.Compare(a.ID, b.ID)
	})
	for i := range atts {
		a := &atts[i]
		s.Attempts[a.ID] = a
		s.Seq = max(s.Seq, a.Seq)
		if a.Unit != "" {
			s.Units[a.Unit] = append(s.Units[a.Unit], a.ID)
		}
		switch a.State {
		case StateQueued:
			s.Queue = append(s.Queue, a.ID)
		case StateAssigned:
			s.Leases.Resume(a.ID, a.Node, a.Incarnation, a.LeaseDeadline, a.LeaseLimit, now)
		case StateReported:
			if a.Kind == KindReplay {
				s.fx.Judges = append(s.fx.Judges, JudgeJob{Attempt: a.ReplayOf})
			} else {
				s.fx.Scores = append(s.fx.Scores, ScoreJob{Attempt: a.ID})
			}
		}
	}
	return s.end()
}

// begin starts applying a step at now.
func (s *State) begin(now time.Time) {
	s.now = now
	s.fx = &Effects{}
}

// end returns the effects of the step applied.
func (s *State) end() Effects {
	fx := *s.fx
	s.fx = nil
	return fx
}

// wake asks for a scheduling round soon.
func (s *State) wake() { s.fx.Wake = true }

// newAttemptID draws a fresh attempt ID ("at-" and 24 hex digits, like
// every other, canaries included).
func (s *State) newAttemptID() string {
	var b [12]byte
	binary.LittleEndian.PutUint64(b[:8], s.rng.Uint64())
	binary.LittleEndian.PutUint32(b[8:], s.rng.Uint32())
	return "at-" + hex.EncodeToString(b[:])
}

// derivedAttemptID is the ID of the n-th attempt an evaluation (or a
// reproducibility check) queues: the same after a restart, so that a
// repeated request completes its set and never doubles it, and shaped like
// any other attempt ID, so that a node cannot tell a first replica from a
// later one or from a canary.
func (s *State) derivedAttemptID(parent string, n int) string {
	m := hmac.New(sha256.New, s.cfg.IDSecret)
	fmt.Fprintf(m, "%s\x00%d", parent, n)
	return "at-" + hex.EncodeToString(m.Sum(nil)[:12])
}

// record returns the durable record of node, creating it.
func (s *State) record(node string) *NodeRecord {
	r, ok := s.Records[node]
	if !ok {
		r = &NodeRecord{ID: node, FirstSeen: s.now, LastSeen: s.now}
		s.Records[node] = r
		s.persistRecord(r)
	}
	return r
}

// quarantined reports whether the cross-check quarantined node.
func (s *State) quarantined(node string) bool {
	r := s.Book.Nodes[node]
	return r != nil && r.Quarantined
}
