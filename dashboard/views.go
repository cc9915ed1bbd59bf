package dashboard

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"time"
)

// The views: what a reader sees of each thing, as plain data. The
// coordinator fills them for the scope of the reader (a submitter's never
// hold a gold answer, a canary, a node or another group's work); its JSON
// API serves the same values, and the pages render them.

// Who is the reader of a page.
type Who struct {
	// Scope is public, submitter or admin.
	Scope     string `json:"scope"`
	Submitter string `json:"submitter,omitempty"`
	Group     string `json:"group,omitempty"`
	// CSRF is the form token of a signed-in reader's forms.
	CSRF string `json:"-"`
}

// SignedIn reports whether the reader gave a token.
func (w Who) SignedIn() bool { return w.Scope == "submitter" || w.Scope == "admin" }

// Admin reports whether the reader is the operator.
func (w Who) Admin() bool { return w.Scope == "admin" }

// Progress counts an evaluation's attempts: the agent's own (Pending is
// every one not finished; the admin also sees it split, Detail), with its
// replays (verification, docs/verification.md) counted apart. Units are
// its runs' cross-check units; Decided those validated, inconsistent or
// failed.
type Progress struct {
	Pending   int `json:"pending"`
	Done      int `json:"done"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled,omitempty"`
	Total     int `json:"total"`
	Units     int `json:"units"`
	Decided   int `json:"decided"`
	// Replays counts the replay attempts of its results (cancelled ones
	// aside), ReplaysPending those not finished.
	Replays        int             `json:"replays,omitempty"`
	ReplaysPending int             `json:"replays_pending,omitempty"`
	Detail         *ProgressDetail `json:"detail,omitempty"`
}

// ProgressDetail splits pending attempts (admin only: a node could time
// these against its own work and tell its canaries apart).
type ProgressDetail struct {
	Queued   int `json:"queued"`
	Assigned int `json:"assigned"`
	Reported int `json:"reported"`
}

// Finished reports whether every attempt (replays too) and unit is
// finished.
func (p Progress) Finished() bool {
	return p.Pending == 0 && p.ReplaysPending == 0 && p.Units == p.Decided
}

// Evaluation is an evaluation request and how far it is.
type Evaluation struct {
	ID       string    `json:"id"`
	Suite    string    `json:"suite"`
	Agent    string    `json:"agent"`
	Group    string    `json:"group,omitempty"`
	Levels   []string  `json:"levels"`
	Runs     int       `json:"runs"`
	Replicas int       `json:"replicas,omitempty"`
	Priority int       `json:"priority,omitempty"`
	Env      []string  `json:"env,omitempty"`
	Models   []string  `json:"models,omitempty"`
	At       time.Time `json:"at"`
	Attempts int       `json:"attempts"`
	Progress Progress  `json:"progress"`
	// CostUSD and the tokens sum the model use of its finished attempts.
	CostUSD      float64 `json:"cost_usd"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	// Waiting says why its unfinished attempts that no node in view can
	// run wait, one entry per reason (none: nothing is blocked).
	Waiting []Waiting `json:"waiting,omitempty"`
}

// Waiting is why unfinished attempts wait although nothing moves: no node
// in view can run them (their limits exceed every slot, no node serves
// their suite or group, every node that could failed or declined them),
// or no node is in view at all. Blocked ones end with outcome
// "unschedulable" and the reason at Deadline unless a node that can run
// them comes into view.
type Waiting struct {
	Reason   string `json:"reason"`
	Attempts int    `json:"attempts"`
	// Blocked: nodes are in view and none can run them.
	Blocked  bool      `json:"blocked"`
	Since    time.Time `json:"since,omitzero"`
	Deadline time.Time `json:"deadline,omitzero"`
}

// EvaluationDetail is an evaluation with its attempts and its agent's
// results.
type EvaluationDetail struct {
	Evaluation
	Attempts []Attempt `json:"attempt_list"`
	// Boards are the agent's rows on its suite's boards, live.
	Boards []Board `json:"boards"`
	// Tasks are the agent's per-task results on the suite.
	Tasks []TaskRow `json:"tasks"`
}

// Attempt is one attempt as its reader may see it. ID is, for a
// submitter, a handle of its own (never the ID a node was given); the
// fields marked admin are the operator's only.
type Attempt struct {
	ID      string `json:"id"`
	Eval    string `json:"eval,omitempty"`
	Suite   string `json:"suite"`
	Task    string `json:"task"`
	Variant string `json:"level"`
	Stage   string `json:"stage,omitempty"`
	Agent   string `json:"agent"`
	Group   string `json:"group,omitempty"`
	Run     int    `json:"run"`
	Replica int    `json:"replica"`
	// Kind is "replay" for a replay of another attempt's tools with its
	// recorded model answers (ReplayOf: that attempt, as the reader names
	// it); "" for the agent's own attempt.
	Kind     string `json:"kind,omitempty"`
	ReplayOf string `json:"replay_of,omitempty"`
	// Repro is the reproducibility check a capsule run is a run of (Task
	// is then the check's ID, and there is no level).
	Repro string `json:"repro,omitempty"`
	// State is pending, done, failed or cancelled (the admin sees queued,
	// assigned and reported instead of pending).
	State    string    `json:"state"`
	Outcome  string    `json:"outcome,omitempty"`
	Detail   string    `json:"detail,omitempty"`
	Enqueued time.Time `json:"enqueued"`
	// Started and Finished are set once it is finished.
	Started  time.Time `json:"started,omitzero"`
	Finished time.Time `json:"finished,omitzero"`
	Usage    *Usage    `json:"usage,omitempty"`
	Limits   *Limits   `json:"limits,omitempty"`
	Model    *ModelUse `json:"model,omitempty"`
	Score    *Score    `json:"score,omitempty"`
	Outputs  []Output  `json:"outputs,omitempty"`
	// Verification is replay verification's word on its result (a
	// model-driven attempt's, once scored).
	Verification *Verification `json:"verification,omitempty"`
	// Waiting says why it waits, while no node in view can run it (the
	// admin: also why a queued one waits otherwise).
	Waiting *Waiting `json:"waiting,omitempty"`

	// Admin only.
	Node          string `json:"node,omitempty"`
	Operator      string `json:"operator,omitempty"`
	Tries         int    `json:"tries,omitempty"`
	InfraFailures int    `json:"infra_failures,omitempty"`
	LeaseLosses   int    `json:"lease_losses,omitempty"`
	Canary        bool   `json:"canary,omitempty"`
	CanaryOf      string `json:"canary_of,omitempty"`
}

// IsReplay reports whether the attempt is a replay.
func (a Attempt) IsReplay() bool { return a.Kind == KindReplay }

// KindReplay is the kind of a replay attempt.
const KindReplay = "replay"

// IsFinished reports whether the attempt has ended (done, failed or
// cancelled).
func (a Attempt) IsFinished() bool {
	return a.State == "done" || a.State == "failed" || a.State == "cancelled"
}

// Usage is what an attempt consumed, as its node reported it.
type Usage struct {
	CPUSeconds      float64 `json:"cpu_seconds"`
	PeakMemoryBytes uint64  `json:"peak_memory_bytes"`
	WallSeconds     float64 `json:"wall_seconds"`
}

// Limits are the sandbox limits an attempt ran under.
type Limits struct {
	CPUMillis   uint32   `json:"cpu_millis"`
	MemoryBytes uint64   `json:"memory_bytes"`
	WallSeconds uint32   `json:"wall_seconds"`
	DiskBytes   uint64   `json:"disk_bytes,omitempty"`
	Network     string   `json:"network"`
	Allow       []string `json:"allow,omitempty"`
}

// ModelUse sums an attempt's model calls through the gateway.
type ModelUse struct {
	Calls        int     `json:"calls"`
	InputTokens  int64   `json:"input_tokens"`
	OutputTokens int64   `json:"output_tokens"`
	CostUSD      float64 `json:"cost_usd"`
}

// Score is the public part of an attempt's scoring: never its verdict.
type Score struct {
	Scorer string          `json:"scorer"`
	Value  float64         `json:"value"`
	Public json.RawMessage `json:"public,omitempty"`
}

// Output is one output file of an attempt.
type Output struct {
	Path  string `json:"path"`
	Size  int64  `json:"size,omitempty"`
	Error string `json:"error,omitempty"`
}

// Logs are what an attempt's counted report says of its run: the tails of
// its output streams.
type Logs struct {
	Outcome  string `json:"outcome"`
	ExitCode int32  `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	Detail   string `json:"detail,omitempty"`
}

// DetailRepeatsExit reports whether the detail only says the exit code
// again ("exit code 2" beside exit code 2): it is then not shown twice.
func (l Logs) DetailRepeatsExit() bool {
	return strings.TrimSpace(l.Detail) == fmt.Sprintf("exit code %d", l.ExitCode)
}

// Call is one model call of an attempt's trajectory, readable.
type Call struct {
	Seq int `json:"seq"`
	// Assignment numbers the assignments of the attempt, from 1: calls of
	// an assignment that lost its lease are kept, apart.
	Assignment   int       `json:"assignment"`
	API          string    `json:"api"`
	Model        string    `json:"model"`
	Stream       bool      `json:"stream,omitempty"`
	Status       int       `json:"status"`
	Refused      string    `json:"refused,omitempty"`
	Error        string    `json:"error,omitempty"`
	Started      time.Time `json:"started"`
	TotalMS      float64   `json:"total_ms"`
	InputTokens  int64     `json:"input_tokens"`
	OutputTokens int64     `json:"output_tokens"`
	CostUSD      float64   `json:"cost_usd"`
	// Request and Response are the messages read from the bodies; the
	// bodies themselves follow, as sent and answered. NewFrom is where the
	// messages new to this call start in Request: those before repeat the
	// previous call's conversation (its request and answer, in the same
	// assignment; MarkNew), which a reader has just read.
	NewFrom      int       `json:"new_from,omitempty"`
	Request      []Message `json:"request"`
	Response     []Message `json:"response"`
	RequestBody  string    `json:"request_body"`
	ResponseBody string    `json:"response_body,omitempty"`
}

// NewRequest is the request's messages new to this call.
func (c Call) NewRequest() []Message { return c.Request[min(c.NewFrom, len(c.Request)):] }

// MarkNew sets each call's NewFrom: a call whose request begins with the
// previous call's request and then its answer (an agent's conversation
// growing call by call, as chat APIs are used) shows only what follows;
// any other call (the first, another assignment's, a new conversation)
// shows its whole request. A trajectory is thus read once, in time linear
// in its length.
func MarkNew(calls []Call) {
	for i := range calls {
		calls[i].NewFrom = 0
		if i == 0 || calls[i-1].Assignment != calls[i].Assignment {
			continue
		}
		prev, req := calls[i-1], calls[i].Request
		n := len(prev.Request)
		if n == 0 || len(req) < n || !sameMessages(req[:n], prev.Request) {
			continue
		}
		for _, m := range prev.Response {
			if n < len(req) && sameMessage(req[n], m) {
				n++
			}
		}
		calls[i].NewFrom = n
	}
}

func sameMessages(a, b []Message) bool {
	for i := range a {
		if !sameMessage(a[i], b[i]) {
			return false
		}
	}
	return len(a) == len(b)
}

// sameMessage compares two messages as a reader would: role, text and
// tool calls (their arguments as JSON values, however spaced).
func sameMessage(a, b Message) bool {
	if a.Role != b.Role || strings.TrimSpace(a.Content) != strings.TrimSpace(b.Content) || len(a.ToolCalls) != len(b.ToolCalls) {
		return false
	}
	for i := range a.ToolCalls {
		x, y := a.ToolCalls[i], b.ToolCalls[i]
		if x.Name != y.Name || compactJSON(x.Arguments) != compactJSON(y.Arguments) {
			return false
		}
	}
	return true
}

func compactJSON(s string) string {
	var b bytes.Buffer
	if json.Compact(&b, []byte(s)) != nil {
		return s
	}
	return b.String()
}

// Message is one message of a model conversation.
type Message struct {
	Role      string     `json:"role"`
	Content   string     `json:"content,omitempty"`
	ToolCalls []ToolCall `json:"tool_calls,omitempty"`
}

// ToolCall is a tool call a model asked for.
type ToolCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Agent is a registered agent image.
type Agent struct {
	Name          string `json:"name"`
	Group         string `json:"group,omitempty"`
	Model         string `json:"model,omitempty"`
	Deterministic bool   `json:"deterministic,omitempty"`
	NotReplayable bool   `json:"not_replayable,omitempty"`
	CID           string `json:"cid"`
	Size          int64  `json:"size"`
	SHA256        string `json:"sha256"`
}

// Suite is an imported suite as a submitter chooses one.
type Suite struct {
	Name     string   `json:"name"`
	Variants []string `json:"levels"`
	Tasks    int      `json:"tasks"`
}

// Network is the pool's size.
type Network struct {
	Nodes     int `json:"nodes"`
	Operators int `json:"operators"`
	Slots     int `json:"slots"`
	FreeSlots int `json:"free_slots"`
}

// NodeRow is a node in the operator's view, with its credit.
type NodeRow struct {
	Credit
	Operator    string    `json:"operator,omitempty"`
	InView      bool      `json:"in_view"`
	TotalSlots  int       `json:"total_slots"`
	FreeSlots   int       `json:"free_slots"`
	Quarantined bool      `json:"quarantined,omitempty"`
	Reliability float64   `json:"reliability"`
	LastSeen    time.Time `json:"last_seen,omitzero"`
}

// CreditReport is the credit of the pool: its total, and (admin only) by
// node and operator.
type CreditReport struct {
	Network   Network   `json:"network"`
	Total     Credit    `json:"total"`
	Nodes     []NodeRow `json:"nodes,omitempty"`
	Operators []Credit  `json:"operators,omitempty"`
}

// Repro is a reproducibility check, with its report read when it has the
// questions of package bench/repro's report.
type Repro struct {
	ID string `json:"id"`
	// CapsuleID and CapsuleTitle name the capsule checked.
	CapsuleID    string          `json:"capsule_id"`
	CapsuleTitle string          `json:"capsule_title,omitempty"`
	State        string          `json:"state"`
	RunsDone     int             `json:"runs_done"`
	RunsWanted   int             `json:"runs_wanted"`
	Error        string          `json:"error,omitempty"`
	Reproducible *bool           `json:"reproducible,omitempty"`
	FailedRuns   []string        `json:"failed_runs,omitempty"`
	Questions    []ReproQuestion `json:"questions,omitempty"`
	// Draft is a draft check's (a spec without rules): every value found
	// in the runs' results/ with its verdict.
	Draft  *ReproDraft     `json:"draft,omitempty"`
	Report json.RawMessage `json:"report,omitempty"`
	// Runs are the check's runs with links to their pages and logs;
	// FailedBecause says why each failed run failed; Waiting why runs
	// wait.
	Runs          []ReproRun `json:"runs,omitempty"`
	FailedBecause []string   `json:"failed_because,omitempty"`
	Waiting       []string   `json:"waiting,omitempty"`
}

// ReproRun is one run of a check (coordinator.ReproRunView).
type ReproRun struct {
	Run        int    `json:"run"`
	Attempt    string `json:"attempt,omitempty"`
	Page       string `json:"page,omitempty"`
	Logs       string `json:"logs,omitempty"`
	State      string `json:"state"`
	Outcome    string `json:"outcome,omitempty"`
	Failed     bool   `json:"failed,omitempty"`
	ExitCode   *int32 `json:"exit_code,omitempty"`
	StderrTail string `json:"stderr_tail,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// HasVerdict reports whether the check has said whether the capsule
// reproduces.
func (r Repro) HasVerdict() bool { return r.Reproducible != nil }

// IsReproducible reports whether the check found the capsule
// reproducible (false while it has not said).
func (r Repro) IsReproducible() bool { return r.Reproducible != nil && *r.Reproducible }

// ReproDraft is the draft task entry of a check without rules (package
// bench/repro's Draft): each value found, and the draft spec (a rule per
// kept value) the scientist edits and submits.
type ReproDraft struct {
	Values []ReproDraftValue `json:"values"`
	// Spec is the draft spec, as JSON.
	Spec json.RawMessage `json:"spec"`
	// Truncated names the files not read in full.
	Truncated []string `json:"truncated,omitempty"`
	// PublishedFiles counts the files of the capsule's published results/
	// (as submitted) the runs were compared with; Unproduced names those
	// no run wrote.
	PublishedFiles int      `json:"published_files,omitempty"`
	Unproduced     []string `json:"unproduced,omitempty"`
}

// NotReproducedPublished counts the published values the runs did not
// reproduce, and the published files no run wrote.
func (d ReproDraft) NotReproducedPublished() int {
	n := len(d.Unproduced)
	for _, v := range d.Values {
		if v.Comparison == PublishedNotReproduced {
			n++
		}
	}
	return n
}

// Kept counts the values kept in the draft entry.
func (d ReproDraft) Kept() int {
	n := 0
	for _, v := range d.Values {
		if v.Kept() {
			n++
		}
	}
	return n
}

// ReproDraftValue is one value a draft check found: where (file and
// question), its text in each run, its verdict (stable, interval,
// timestamp, wild or missing) and its prediction interval.
type ReproDraftValue struct {
	Question string    `json:"question"`
	File     string    `json:"file"`
	Values   []string  `json:"values"`
	Verdict  string    `json:"verdict"`
	Interval *Interval `json:"interval,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	// Published is the value the capsule published at the same place,
	// Comparison whether the runs reproduce it (reproduced,
	// not_reproduced, not_compared, not_published; "" when the capsule
	// published nothing), ComparisonReason why.
	Published        string `json:"published,omitempty"`
	Comparison       string `json:"comparison,omitempty"`
	ComparisonReason string `json:"comparison_reason,omitempty"`
}

// Comparisons of a published value with a draft check's runs (package
// bench/repro's).
const (
	PublishedReproduced    = "reproduced"
	PublishedNotReproduced = "not_reproduced"
)

// ComparisonWords says a comparison as a reader reads it.
func (v ReproDraftValue) ComparisonWords() string {
	switch v.Comparison {
	case PublishedReproduced:
		return "yes"
	case PublishedNotReproduced:
		return "no"
	case "not_compared":
		return "not compared"
	case "not_published":
		return "nothing published here"
	}
	return "—"
}

// Kept reports whether the value is in the draft entry (stable, or an
// interval).
func (v ReproDraftValue) Kept() bool { return v.Verdict == "stable" || v.Verdict == "interval" }

// ReproQuestion is one question of a check: its value in each run, its
// prediction interval, and whether it reproduced.
type ReproQuestion struct {
	Question   string    `json:"question"`
	Kind       string    `json:"kind,omitempty"`
	Values     []string  `json:"values"`
	Interval   *Interval `json:"interval,omitempty"`
	Claimed    string    `json:"claimed,omitempty"`
	Reproduced bool      `json:"reproduced"`
	Reason     string    `json:"reason,omitempty"`
}

// Interval is a 95% prediction interval over the runs.
type Interval struct {
	N     int     `json:"n"`
	Mean  float64 `json:"mean"`
	Lower float64 `json:"lower"`
	Upper float64 `json:"upper"`
}

// Group, Submitter and Token are accounts as the operator sees them.
type Group struct {
	Name       string    `json:"name"`
	MaxPending int       `json:"max_pending,omitempty"`
	Pending    int       `json:"pending"`
	Agents     []string  `json:"agents,omitempty"`
	Created    time.Time `json:"created"`
}

// Submitter is a submitter as the operator sees it.
type Submitter struct {
	Name    string    `json:"name"`
	Group   string    `json:"group"`
	Created time.Time `json:"created"`
	Revoked time.Time `json:"revoked,omitzero"`
}

// Token is a token as the operator sees it: never its secret.
type Token struct {
	ID        string    `json:"id"`
	Submitter string    `json:"submitter"`
	Group     string    `json:"group"`
	Created   time.Time `json:"created"`
	Revoked   time.Time `json:"revoked,omitzero"`
}
