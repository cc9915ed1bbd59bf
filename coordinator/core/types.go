package core

import (
	"encoding/json"
	"slices"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/lease"
	"github.com/repronet/repronet/coordinator/schedule"
	"github.com/repronet/repronet/verify"
)

// AttemptState is where an attempt is in its life.
type AttemptState string

const (
	StateQueued   AttemptState = "queued"
	StateAssigned AttemptState = "assigned"
	// StateReported: its report is recorded (and acknowledged); its
	// outputs wait to be scored. Scorer failures keep it here, never
	// counted against the agent.
	StateReported AttemptState = "reported"
	StateDone     AttemptState = "done"
	// StateFailed: infrastructure failed on every try, or no node would
	// run it; never scored.
	StateFailed AttemptState = "failed"
	// StateCancelled: a queued replica the cross-check no longer needs
	// (its unit was decided without it). Never offered again.
	StateCancelled AttemptState = "cancelled"
)

// Kinds of attempt.
const (
	// KindAgent runs a stage of a unit of an evaluation (the default).
	KindAgent = "agent"
	// KindCapsuleRun runs a capsule's own run script (a reproducibility
	// check) and returns the files its checker reads.
	KindCapsuleRun = "capsule_run"
	// KindReplay re-runs a model-driven attempt's recipe on another node,
	// its model calls answered from the recorded attempt's (ReplayOf)
	// trajectory (replay.go). Nodes cannot tell it from any attempt.
	KindReplay = "replay"
)

// OutcomeDeclined is the outcome of an attempt that every node that could
// run it declined (see also OutcomeUnschedulable).
const OutcomeDeclined = "declined"

// Attempt is one job: one placement of one stage of one unit (an agent's
// run on a task at a variant, or one run of a capsule's own run script) on
// one node. Replicas of a stage share Unit (the cross-check's work) and
// differ in Replica. A canary is an attempt of a unit of its own that
// replays validated work; nodes cannot tell it from a replica.
type Attempt struct {
	ID     string `json:"id"`
	Eval   string `json:"eval,omitempty"`
	Suite  string `json:"suite"`
	TaskID string `json:"task_id"`
	Agent  string `json:"agent"`
	// Level is the task's variant (CORE-Bench: its level; "" when the
	// family has none).
	Level string `json:"level"`
	// Stage is the step of the unit's pipeline this attempt runs; Pipe
	// names the pipeline (the unit of the leaderboard) when it is another
	// than Unit.
	Stage string `json:"stage,omitempty"`
	Pipe  string `json:"pipe,omitempty"`
	Run   int    `json:"run"`
	Unit  string `json:"unit,omitempty"`
	// Kind is KindAgent (empty: the same), KindCapsuleRun or KindReplay.
	Kind string `json:"kind,omitempty"`
	// ReplayOf names the attempt a replay replays (KindReplay only).
	ReplayOf string `json:"replay_of,omitempty"`
	// Verification is what replay verification knows of a model-driven
	// attempt's counted result (nil: not model-driven, or not scored yet).
	Verification *Verification `json:"verification,omitempty"`
	Replica      int           `json:"replica"`
	Group        string        `json:"group,omitempty"`
	Priority     int           `json:"priority,omitempty"`
	// Canary marks a canary; CanaryOf names the unit it replays.
	Canary   bool   `json:"canary,omitempty"`
	CanaryOf string `json:"canary_of,omitempty"`
	// Repro names the reproducibility check a capsule run belongs to; the
	// runs of one check go to distinct nodes and operators.
	Repro string `json:"repro,omitempty"`
	// Needs is what a slot must offer its job, GPUs what it needs of GPUs.
	Needs schedule.Shape   `json:"needs,omitzero"`
	GPUs  schedule.GPUNeed `json:"gpus,omitzero"`
	// Seq orders the queue: attempts keep it when requeued.
	Seq   uint64       `json:"seq"`
	State AttemptState `json:"state"`
	// Node is the peer the attempt is (or was last) assigned to, Operator
	// that node's operator.
	Node          string    `json:"node,omitempty"`
	Operator      string    `json:"operator,omitempty"`
	LeaseDeadline time.Time `json:"lease_deadline,omitzero"`
	// LeaseLimit is the latest its lease may be renewed to (lease.Lease.Limit).
	LeaseLimit time.Time `json:"lease_limit,omitzero"`
	// Incarnation is the node process that accepted the assignment.
	Incarnation uint64 `json:"incarnation,omitempty"`
	// Tries counts assignments; InfraFailures the infrastructure failures
	// reported (bounded by Config.MaxTries); LeaseLosses the leases that ran
	// out or died with their node (bounded by Config.MaxLeaseLosses).
	Tries         int `json:"tries"`
	InfraFailures int `json:"infra_failures,omitempty"`
	LeaseLosses   int `json:"lease_losses,omitempty"`
	// UnadmittedLosses counts the lost leases of LeaseLosses that were
	// lost by unadmitted nodes: all of them together count as one
	// towards MaxLeaseLosses (countedLosses), as they count as one
	// operator.
	UnadmittedLosses int `json:"unadmitted_losses,omitempty"`
	// ModelFaults counts the assignments whose last model call failed for
	// the coordinator's reasons (its provider or gateway; bounded by
	// Config.MaxTries, then the outcome is model_unavailable): charged to
	// neither the agent nor the node.
	ModelFaults int `json:"model_faults,omitempty"`
	// Assignees lists every node the attempt was given to, in order.
	Assignees []Assignee `json:"assignees,omitempty"`
	// Avoid lists nodes not to assign this attempt to again; AvoidUntil
	// nodes not to assign it to before a time (a lost lease), and, under
	// the key "pool:unadmitted" (poolAvoidKey), every unadmitted node.
	Avoid        []string             `json:"avoid,omitempty"`
	AvoidUntil   map[string]time.Time `json:"avoid_until,omitempty"`
	EnqueuedAt   time.Time            `json:"enqueued_at"`
	AssignedAt   time.Time            `json:"assigned_at,omitzero"`
	FinishedAt   time.Time            `json:"finished_at,omitzero"`
	Outcome      string               `json:"outcome,omitempty"`
	ReportDigest string               `json:"report_digest,omitempty"`
	// ReportedBy is the node whose report counts.
	ReportedBy string `json:"reported_by,omitempty"`
	// LateReports are verified reports from earlier assignees that arrived
	// after another report counted: recorded, never counted.
	LateReports []LateReport `json:"late_reports,omitempty"`
	// Declines are the nodes that declined the attempt for a lasting
	// reason, with what they said; Failures the nodes that reported an
	// infrastructure failure of it, with what they said.
	Declines []Decline `json:"declines,omitempty"`
	Failures []Decline `json:"failures,omitempty"`
	// StuckSince is when the attempt was first found queued with no node
	// in view able to run it (zero: it is not; stuck.go). It ends as
	// unschedulable Config.UnschedulableAfter later unless one comes.
	StuckSince time.Time `json:"stuck_since,omitzero"`
	// Outputs are the attempt's outputs as its counted report names them
	// (fetched, verified and kept by the coordinator).
	Outputs []Output `json:"outputs,omitempty"`
	// Evidence is what its counted report says about how it ran, kept for
	// the cross-check until it is scored.
	Evidence *crosscheck.Evidence `json:"evidence,omitempty"`
	// Score is its family's scoring; ScoreTries counts failed scorings.
	Score      *ScoreRecord `json:"score,omitempty"`
	ScoreTries int          `json:"score_tries,omitempty"`
	Usage      *Usage       `json:"usage,omitempty"`
	// Model is what its counted assignment spent on model calls through
	// the gateway (nil: it made none). Exhausted says why a budget
	// refused its calls, if one did: its outcome is then budget_exhausted.
	Model     *ModelUse `json:"model,omitempty"`
	Exhausted string    `json:"exhausted,omitempty"`
	Detail    string    `json:"detail,omitempty"`
}

// ModelUse sums an assignment's model calls.
type ModelUse struct {
	Calls        int     `json:"calls"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	CostUSD      float64 `json:"cost_usd"`
	// Head is the ID of its last call record: it commits to the whole
	// trajectory.
	Head string `json:"head,omitempty"`
	// Unavailable says why the assignment's last call failed when it
	// failed for the coordinator's reasons (the provider's error or
	// silence, the gateway's trouble; gateway.Call.Unavailable): the agent
	// could not reach its model, so its result is not its own.
	Unavailable string `json:"unavailable,omitempty"`
}

// OutcomeBudgetExhausted is the outcome of an attempt whose model budget
// ran out (what it had answered by then is scored).
const OutcomeBudgetExhausted = "budget_exhausted"

// OutcomeModelUnavailable is the outcome of an attempt whose agent could
// not reach its model for the coordinator's reasons on Config.MaxTries
// assignments: an infrastructure outcome charged to the coordinator, never
// scored and never on a board.
const OutcomeModelUnavailable = "model_unavailable"

// Assignee is one assignment of an attempt to a node.
type Assignee struct {
	Node     string    `json:"node"`
	Operator string    `json:"operator,omitempty"`
	At       time.Time `json:"at"`
}

// LateReport is a verified report that did not count.
type LateReport struct {
	Node   string    `json:"node"`
	Digest string    `json:"digest"`
	At     time.Time `json:"at"`
}

// Decline is a node's lasting refusal of an attempt.
type Decline struct {
	Node string `json:"node"`
	// Operator is the operator the node counted as when it declined
	// (UnadmittedOperator for every unadmitted node): declines vote once
	// per operator (offer.go undeliverable).
	Operator string    `json:"operator,omitempty"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
	// Charged: an infrastructure failure charged to its node, once
	// another node ran the same job (chargeFailures).
	Charged bool `json:"charged,omitempty"`
}

// Output is one output of an attempt: its path, and its CID once fetched.
type Output struct {
	Path  string `json:"path"`
	CID   string `json:"cid,omitempty"`
	Size  int64  `json:"size,omitempty"`
	Error string `json:"error,omitempty"`
}

// ScoreRecord is a family's scoring of an attempt.
type ScoreRecord struct {
	// Scorer is the suite's scorer (name and version) it was scored with.
	Scorer  string          `json:"scorer"`
	Scoring json.RawMessage `json:"scoring,omitempty"`
	// Verdict may derive from gold answers: admin eyes only.
	Verdict json.RawMessage `json:"verdict,omitempty"`
	Public  json.RawMessage `json:"public,omitempty"`
	Value   float64         `json:"value"`
}

// Usage is what an attempt consumed, as its node reported it.
type Usage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	PeakMemoryBytes uint64  `json:"peak_memory_bytes"`
	WallMillis      int64   `json:"wall_millis"`
}

// assignedTo reports whether node was ever given the attempt.
func (a *Attempt) assignedTo(node string) bool {
	if a.Node == node {
		return true
	}
	for _, as := range a.Assignees {
		if as.Node == node {
			return true
		}
	}
	return false
}

// spreadKey names the attempts that must run on distinct nodes and
// operators: the replicas of a unit, or every run of a reproducibility
// check (a canary is alone in its unit).
func (a *Attempt) spreadKey() string {
	if a.Kind == KindReplay {
		return "replay:" + a.ReplayOf
	}
	if a.Repro != "" && !a.Canary {
		return "repro:" + a.Repro
	}
	return a.Unit
}

// avoids lists the nodes the attempt must not go to at now.
func (a *Attempt) avoids(now time.Time) []string {
	if len(a.AvoidUntil) == 0 {
		return a.Avoid
	}
	out := slices.Clone(a.Avoid)
	for n, until := range a.AvoidUntil {
		if now.Before(until) {
			out = append(out, n)
		}
	}
	return out
}

// countedLosses is the lost leases that count towards MaxLeaseLosses:
// each one lost by an admitted operator's node, and those lost by
// unadmitted nodes as one, however many (peer IDs are free).
func (a *Attempt) countedLosses() int {
	return a.LeaseLosses - max(0, a.UnadmittedLosses-1)
}

// pipe is the unit of the leaderboard the attempt belongs to.
func (a *Attempt) pipe() string {
	if a.Pipe != "" {
		return a.Pipe
	}
	return a.Unit
}

// NodeRecord is the coordinator's durable record of a node: identity,
// operator and reliability counters.
type NodeRecord struct {
	ID        string    `json:"id"`
	Operator  string    `json:"operator,omitempty"`
	FirstSeen time.Time `json:"first_seen"`
	LastSeen  time.Time `json:"last_seen"`
	// Assigned counts accepted assignments; Completed reports that counted;
	// LeaseLost leases that ran out or died with the node process;
	// Declined offers declined for a lasting reason; InfraErrors
	// infrastructure failures reported; LateReports reports that arrived
	// after the attempt had been counted from another node; HandedBack
	// attempts the node gave back unfinished as it stopped (never charged).
	Assigned      int `json:"assigned"`
	Completed     int `json:"completed"`
	LeaseLost     int `json:"lease_lost"`
	Declined      int `json:"declined"`
	InfraErrors   int `json:"infra_errors"`
	LateReports   int `json:"late_reports"`
	HandedBack    int `json:"handed_back,omitempty"`
	ConsecutiveOK int `json:"consecutive_ok"`
	// Allowance bounds the attempts the node may hold at once.
	Allowance lease.Allowance `json:"allowance,omitzero"`
	// LateBytes is the size of the late reports kept of the node, decayed
	// with Config.HalfLife (bounded by Config.MaxLateBytes).
	LateBytes schedule.Decaying `json:"late_bytes,omitzero"`
	// Verify is the node's replay record (verify.Policy sets its replay
	// rate from it).
	Verify verify.Record `json:"verify,omitzero"`
}

// PoolRecord is the durable record of a set of nodes that share the
// bounds that protect the pool: every unadmitted node (the pool
// UnadmittedOperator) shares one allowance and one late-report budget,
// as it counts as one operator. (Peer IDs are free: bounds per peer ID
// would bound nothing.) Each node's own record is kept as well; an
// unadmitted node is held by both.
type PoolRecord struct {
	ID string `json:"id"`
	// Allowance bounds the attempts the pool's nodes may hold at once,
	// all together; it grows and shrinks as a node's does.
	Allowance lease.Allowance `json:"allowance,omitzero"`
	// LateBytes is the size of the late reports kept of the pool's nodes
	// (bounded by Config.MaxLateBytes, all together).
	LateBytes schedule.Decaying `json:"late_bytes,omitzero"`
	// Completed and LeaseLost count the pool's reports that counted and
	// the leases its nodes lost.
	Completed int `json:"completed,omitempty"`
	LeaseLost int `json:"lease_lost,omitempty"`
}

// Reliability estimates the chance the node completes what it accepts:
// (completed + 1) / (completed + lease losses + infrastructure errors + 2),
// so a new node starts at 0.5.
func (r NodeRecord) Reliability() float64 {
	return float64(r.Completed+1) / float64(r.Completed+r.LeaseLost+r.InfraErrors+2)
}

// EvalRecord is the durable record of an evaluation request. Attempts
// counts the attempts it queued at once (replicas the cross-check asks
// for later are not counted); Units the runs.
type EvalRecord struct {
	ID       string   `json:"id"`
	Suite    string   `json:"suite"`
	Agent    string   `json:"agent"`
	Levels   []string `json:"levels"`
	Runs     int      `json:"runs"`
	Replicas int      `json:"replicas"`
	Group    string   `json:"group,omitempty"`
	Priority int      `json:"priority,omitempty"`
	// Env, Models and Budget are as the request gave them
	// (Evaluation).
	Env      []string  `json:"env,omitempty"`
	Models   []string  `json:"models,omitempty"`
	Budget   Budget    `json:"budget,omitzero"`
	Attempts int       `json:"attempts"`
	Units    int       `json:"units"`
	At       time.Time `json:"at"`
}

// Budget caps an evaluation's model spend, in US dollars (0: no cap).
type Budget struct {
	// AttemptUSD caps each attempt (CORE-Bench stops an agent at $4 a
	// task), EvaluationUSD the whole evaluation.
	AttemptUSD    float64 `json:"attempt_usd,omitempty"`
	EvaluationUSD float64 `json:"evaluation_usd,omitempty"`
	// JudgeUSD caps what its scorers' judges spend (they are the
	// evaluator's, not the agent's).
	JudgeUSD float64 `json:"judge_usd,omitempty"`
}

// Pipeline is the durable record of a unit whose pipeline has more than
// one stage: which stage it is at, and what its finished stages returned.
type Pipeline struct {
	ID     string  `json:"id"`
	Stages []Stage `json:"stages"`
	// Current is the index of the stage running (len(Stages): finished).
	Current int `json:"current"`
	// Halted names the stage whose work was not validated (inconsistent,
	// or failed): the pipeline ended there, without a score.
	Halted string `json:"halted,omitempty"`
	// Outputs are the counted outputs of each finished stage, by stage
	// name and output path: the CIDs later stages are given.
	Outputs map[string]map[string]string `json:"outputs,omitempty"`
	// Nodes are the nodes that ran each finished stage's counted job.
	Nodes map[string]string `json:"nodes,omitempty"`
}

// Stage is a stage of a pipeline as the core keeps it.
type Stage struct {
	Name      string   `json:"name"`
	Image     string   `json:"image,omitempty"`
	Single    bool     `json:"single,omitempty"`
	ApartFrom []string `json:"apart_from,omitempty"`
}

// workID is the cross-check work of stage i of unit: the unit itself for
// its first stage (so that a one-stage unit is its work), else unit/stage.
func workID(unit string, i int, name string) string {
	if i == 0 {
		return unit
	}
	return unit + "/" + name
}

// ReproRecord is the durable record of a reproducibility check.
type ReproRecord struct {
	ID string `json:"id"`
	// Check is the check as its checker parsed it.
	Check bench.Check `json:"check"`
	// CapsuleCID is the submitted tarball's root; Image and ImageCID the
	// agent image capsule runs use as their environment.
	CapsuleCID  string `json:"capsule_cid"`
	CapsuleSize int64  `json:"capsule_size,omitempty"`
	Image       string `json:"image"`
	ImageCID    string `json:"image_cid"`
	// Claimed holds the files of the tarball the checker reads, as
	// submitted (nil when it has none).
	Claimed map[string][]byte `json:"claimed,omitempty"`
	// Group and Submitter: who submitted it (empty: the admin); its
	// runs are the group's attempts.
	Group     string `json:"group,omitempty"`
	Submitter string `json:"submitter,omitempty"`
	// Units are the runs, in order.
	Units   []string        `json:"units"`
	Created time.Time       `json:"created"`
	Report  json.RawMessage `json:"report,omitempty"`
	Error   string          `json:"error,omitempty"`
}

// Admitted is the durable record of an admitted operator.
type Admitted struct {
	Operator string `json:"operator"`
	// Via says how: "config", "admin", or the label of a join token.
	Via string    `json:"via"`
	At  time.Time `json:"at"`
}
