// Package bench owns what every benchmark family implements and what the
// core asks of one: a Family opens suites from their stored definitions;
// a Suite lists its tasks and variants (CORE-Bench's levels are variants),
// says which stages a unit of work goes through (a pipeline: PaperBench's
// rollout, then reproduction), builds each stage's job as a neutral recipe
// (proto.Recipe), scores a finished job (a Scorer named with its version;
// it may take seconds and call a model as a judge), says what replicas are
// compared on (Comparable) and builds its leaderboards from entries.
//
// The core (coordinator, node, proto) knows families only through these
// interfaces; families live beside this package (bench/corebench,
// bench/repro, bench/shellqa, ...) and are registered where the binary is
// put together (a Registry). This package is pure: it does no I/O and must
// not import the coordinator, the node or any family.
package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/proto"
)

// Family makes suites of one benchmark family.
type Family interface {
	// Name is the family's name ("corebench"), stored with its suites.
	Name() string
	// Open parses a suite's stored definition strictly: every error names
	// the task and field at fault.
	Open(def SuiteDef) (Suite, error)
}

// SuiteDef is what the coordinator stores of an imported suite.
type SuiteDef struct {
	Name   string `json:"name"`
	Family string `json:"family"`
	// Config is the family's settings for the suite (CORE-Bench: the
	// grader and the strip rule), in the family's JSON.
	Config json.RawMessage `json:"config,omitempty"`
	// Tasks is the task file as imported, in the family's format.
	Tasks json.RawMessage `json:"tasks"`
}

// Suite is an opened suite. Its methods must be safe for concurrent use:
// scorers run beside each other, outside the coordinator's lock.
type Suite interface {
	// Tasks are the suite's tasks, in the task file's order.
	Tasks() []Task
	// Variants are the ways each task can be posed (CORE-Bench: easy,
	// medium, hard), easiest first; a family without variants has one,
	// named "".
	Variants() []string
	// Scorer names what a score of the suite depends on besides the agent,
	// the task and the variant, with versions ("corebench-original@1
	// strip original@1"): scores of different scorers are never mixed.
	Scorer() string
	// Scoring is the scorer as entries carry it (Entry.Scoring): the
	// family's JSON, for units nothing is scored of yet.
	Scoring() json.RawMessage
	// Pipeline lists the stages a unit of (task, variant) goes through,
	// in order; most families have one.
	Pipeline(t Task, variant string) []Stage
	// Recipe builds the job of one stage of a unit.
	Recipe(in RecipeInput) (*proto.Recipe, error)
	// Score scores a finished job of one stage. An error is the scorer's
	// failure (a judge that did not answer, say): the core retries it and
	// never counts it against the agent. A job that ran but left nothing
	// gradable is scored, as failing, without error.
	Score(ctx context.Context, in ScoreInput) (Score, error)
	// Boards builds the suite's leaderboards (JSON-encodable, in the
	// family's format) from the entries of its units.
	Boards(entries []Entry) ([]any, error)
}

// ValueGrader is implemented by a suite that grades each job several
// ways (a board per grader, as PaperBench's and HeurekaBench's): it names
// the grader, with its version, whose score a job's Score.Value is, for a
// job scored under scoring (an Entry.Scoring); "" when it cannot tell.
// Views that show one number per job (the dashboard) name it beside.
type ValueGrader interface {
	ValueGrader(scoring json.RawMessage) string
}

// Task is one task of a suite.
type Task struct {
	ID string `json:"id"`
	// Content names what the task's recipes place in the workspace, as
	// imported into the coordinator's content catalog (CORE-Bench: the
	// task's capsule). Every name must be imported before an evaluation.
	Content []string `json:"content,omitempty"`
	// GPUs is what the task's jobs need of GPUs (nil: none); its jobs go
	// only to slots that offer it.
	GPUs *proto.GPURequest `json:"gpus,omitempty"`
}

// Stage is one step of a unit's pipeline: a job on a node.
type Stage struct {
	Name string `json:"name"`
	// Image, when set, names a registered image the stage runs in instead
	// of the agent's (PaperBench's reproduction runs the agent's
	// submission in a plain environment).
	Image string `json:"image,omitempty"`
	// Single: the stage is never replicated (a stochastic rollout whose
	// replicas would not agree); its one job's outputs feed the next stage.
	Single bool `json:"single,omitempty"`
	// ApartFrom names earlier stages whose nodes must not run this one.
	ApartFrom []string `json:"apart_from,omitempty"`
}

// RecipeInput is what a family needs to build one stage's job.
type RecipeInput struct {
	Task    Task
	Variant string
	Stage   string
	// Image is the stage's image: the agent's, or the stage's own.
	Image cid.Cid
	// Content resolves the task's content names to CIDs.
	Content map[string]cid.Cid
	// Earlier holds the outputs of the unit's earlier stages, by stage and
	// output path.
	Earlier map[string]map[string]cid.Cid
	// Env are per-evaluation settings for the agent (a model name, say),
	// KEY=value, passed as its environment.
	Env []string
	// Limits are the suite's sandbox limits; the family may narrow them.
	Limits *proto.Limits
}

// ErrNotReturned is wrapped by ScoreInput.Output's error for an output the
// job did not return.
var ErrNotReturned = errors.New("output not returned")

// ScoreInput is what a scorer sees of a finished job. It never sees the
// node's word for anything it can check: outputs come fetched by content
// address and verified.
type ScoreInput struct {
	Task    Task
	Variant string
	Stage   string
	// Outcome is how the job ended: ok, agent_error, timeout, oom,
	// disk_quota, output_limit.
	Outcome string
	// Output returns the content of one of the recipe's outputs by path.
	// An output the job did not return (missing, too large, never asked
	// for) is an error wrapping ErrNotReturned, the job's doing: score it
	// as such. Any other error is the core's trouble (its store could not
	// be read): return it, and the scoring is retried, never counted
	// against the agent.
	Output func(ctx context.Context, path string) ([]byte, error)
	// Models, when set, calls models (an LLM judge) through the gateway.
	Models Models
	// Trajectory, when set, returns the model calls the agent made in the
	// counted job of a stage of this job's unit (this job's own, for its
	// stage), in order, as the gateway recorded them (every try of that
	// job). An error is the core's trouble: return it (retried).
	Trajectory func(ctx context.Context, stage string) ([]ModelCall, error)
}

// ModelCall is one model call of an agent's job: the request and response
// bodies as the gateway recorded them.
type ModelCall struct {
	Request, Response []byte
}

// Score is a scored job.
type Score struct {
	// Comparable is what the job's replicas are compared on.
	Comparable Comparable
	// Scoring names what this score depends on (the family's JSON, e.g.
	// grader and strip rule with their versions): entries of different
	// scorings are never mixed on a board.
	Scoring json.RawMessage
	// Verdict is the family's full record of the scoring, kept with the
	// job. It may hold values that derive from gold answers: never shown
	// to a node, nor to the public.
	Verdict json.RawMessage
	// Public is what a public reader may see of it: what leaderboards are
	// built from.
	Public json.RawMessage
	// Value is the job's score in [0, 1] (CORE-Bench: task correct or not).
	Value float64
}

// Models calls models on behalf of a scorer.
type Models interface {
	// Chat sends an OpenAI-style chat completion request body and returns
	// the response body.
	Chat(ctx context.Context, request json.RawMessage) (json.RawMessage, error)
}

// Status is where a unit stands on a leaderboard.
type Status string

// Statuses. Only Validated units are scored.
const (
	// Validated: scored, and its replicas agreed (or a trusted node's
	// result was accepted).
	Validated Status = "validated"
	// Unvalidated: scored, the cross-check still waits for replicas.
	Unvalidated Status = "unvalidated"
	// Inconsistent: replicas kept disagreeing up to the maximum; shown,
	// never scored.
	Inconsistent Status = "inconsistent"
	// InfraFailed: the infrastructure failed on every try; never scored
	// and never counted against the agent.
	InfraFailed Status = "infra_failed"
	// Pending: not finished.
	Pending Status = "pending"
)

// Valid reports whether s is one of the statuses.
func (s Status) Valid() bool {
	switch s {
	case Validated, Unvalidated, Inconsistent, InfraFailed, Pending:
		return true
	}
	return false
}

// Entry is one unit (agent, task, variant, run) as a leaderboard sees it.
// It holds no gold answer: only the public part of its score.
type Entry struct {
	Suite   string `json:"suite"`
	Variant string `json:"level"`
	// Scoring is the counted job's Score.Scoring (or the suite's default
	// when nothing is scored yet).
	Scoring json.RawMessage `json:"scoring"`
	Agent   string          `json:"agent"`
	Model   string          `json:"model,omitempty"`
	TaskID  string          `json:"task_id"`
	Run     int             `json:"run"`
	Status  Status          `json:"status"`
	// Score is the counted job's Score.Public (validated and unvalidated
	// units).
	Score json.RawMessage `json:"score,omitempty"`
	// CostUSD is the model cost of the counted job, when metered, and
	// InputTokens and OutputTokens the tokens of its model calls.
	CostUSD      *float64  `json:"cost_usd,omitempty"`
	InputTokens  int64     `json:"input_tokens,omitempty"`
	OutputTokens int64     `json:"output_tokens,omitempty"`
	CPUSeconds   float64   `json:"cpu_seconds,omitempty"`
	WallSeconds  float64   `json:"wall_seconds,omitempty"`
	Started      time.Time `json:"started,omitzero"`
	Finished     time.Time `json:"finished,omitzero"`
	// Verification is what replay verification says of the counted job of
	// a model-driven run ("": not model-driven): verified, or another
	// state (not drawn, not replayable, nondeterministic, pending...), all
	// shown as unverified.
	Verification string `json:"verification,omitempty"`
	// Eval names the evaluation the run belongs to (every evaluation
	// numbers its runs from 1: run 1 of two evaluations are two runs). The
	// public reads an opaque label of it, the same for every entry of one
	// evaluation.
	Eval string `json:"eval,omitempty"`
}

// Registry holds the families a binary knows, by name.
type Registry struct {
	families map[string]Family
}

// NewRegistry registers families; their names must be distinct.
func NewRegistry(families ...Family) (*Registry, error) {
	r := &Registry{families: map[string]Family{}}
	for _, f := range families {
		if f.Name() == "" {
			return nil, errors.New("bench: a family has no name")
		}
		if _, dup := r.families[f.Name()]; dup {
			return nil, fmt.Errorf("bench: family %q registered twice", f.Name())
		}
		r.families[f.Name()] = f
	}
	return r, nil
}

// Open opens a suite with its family.
func (r *Registry) Open(def SuiteDef) (Suite, error) {
	f, ok := r.families[def.Family]
	if !ok {
		return nil, fmt.Errorf("suite %q: unknown family %q (this build knows %v)", def.Name, def.Family, r.Names())
	}
	s, err := f.Open(def)
	if err != nil {
		return nil, fmt.Errorf("suite %q (%s): %w", def.Name, def.Family, err)
	}
	return s, nil
}

// Names lists the registered families, sorted.
func (r *Registry) Names() []string {
	out := make([]string, 0, len(r.families))
	for n := range r.families {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// Has reports whether a family is registered.
func (r *Registry) Has(name string) bool { _, ok := r.families[name]; return ok }

// StageNames lists the names of stages.
func StageNames(stages []Stage) []string {
	out := make([]string, len(stages))
	for i, s := range stages {
		out[i] = s.Name
	}
	return out
}

// ValidatePipeline checks a pipeline: at least one stage, distinct names,
// ApartFrom naming earlier stages only.
func ValidatePipeline(stages []Stage) error {
	if len(stages) == 0 {
		return errors.New("pipeline: no stage")
	}
	for i, s := range stages {
		if !proto.ValidLabel(s.Name, proto.MaxLabelLen) {
			return fmt.Errorf("pipeline: stage %d: name %q: want 1-%d of [A-Za-z0-9._+-]", i, s.Name, proto.MaxLabelLen)
		}
		if slices.Contains(StageNames(stages[:i]), s.Name) {
			return fmt.Errorf("pipeline: stage %q twice", s.Name)
		}
		for _, a := range s.ApartFrom {
			if !slices.Contains(StageNames(stages[:i]), a) {
				return fmt.Errorf("pipeline: stage %q: apart_from %q is not an earlier stage", s.Name, a)
			}
		}
	}
	return nil
}

// BoardScoring is the scoring e's board is kept under, as a key: e's
// Scoring, or def (the suite's) when e has none yet, in compact JSON, so
// that one scoring is one board however its JSON is spaced.
func (e Entry) BoardScoring(def json.RawMessage) (string, error) {
	scoring := e.Scoring
	if len(scoring) == 0 {
		scoring = def
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, scoring); err != nil {
		return "", fmt.Errorf("scoring: %w", err)
	}
	return compact.String(), nil
}

// StatusCounts counts a board row's units by status; families embed it in
// their rows.
type StatusCounts struct {
	Units        int `json:"units"`
	Validated    int `json:"validated"`
	Unvalidated  int `json:"unvalidated"`
	Inconsistent int `json:"inconsistent"`
	InfraFailed  int `json:"infra_failed"`
	Pending      int `json:"pending"`
}

// Count counts one unit of status s; an unknown status is an error
// naming it.
func (c *StatusCounts) Count(s Status) error {
	counter := map[Status]*int{Validated: &c.Validated, Unvalidated: &c.Unvalidated, Inconsistent: &c.Inconsistent,
		InfraFailed: &c.InfraFailed, Pending: &c.Pending}[s]
	if counter == nil {
		return fmt.Errorf("unknown status %q", s)
	}
	c.Units++
	*counter++
	return nil
}
