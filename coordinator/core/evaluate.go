package core

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/schedule"
	"github.com/repronet/repronet/proto"
)

// Evaluation asks for an agent to be run on every task of a suite.
type Evaluation struct {
	// ID, when set, makes the request idempotent: a second request with
	// the same ID queues nothing and returns what the first queued. It must
	// be 1-64 of [A-Za-z0-9._-].
	ID    string
	Suite string
	Agent string
	// Levels are the task variants to run (CORE-Bench: its levels); each
	// must be one of the suite's. Empty: every variant.
	Levels []string
	// Runs is how many independent runs of each (task, level); default 1.
	Runs int
	// Replicas is the replication of each run: 0 leaves it to the
	// cross-check policy (a quorum of agreeing replicas on distinct nodes
	// and operators, fewer for trusted nodes a spot check spares); N >= 1
	// asks for exactly N, queued at once.
	Replicas int
	// Group is the submitter group the attempts are accounted to;
	// Priority orders them within it (higher first).
	Group    string
	Priority int
	// Env are per-evaluation arguments for the agent (a model name, say),
	// KEY=value, given to it as environment: never baked into images.
	// Names the node sets (REPRONET_*, OPENAI_*, ANTHROPIC_*,
	// GEMINI_API_KEY, GOOGLE_GEMINI_BASE_URL) and the Gemini SDK's that
	// would take its calls elsewhere (GOOGLE_API_KEY*, GOOGLE_GENAI_*,
	// GOOGLE_VERTEX_*) are refused.
	Env []string
	// Models are the models its agents may call through the gateway
	// (empty: any the gateway prices); Budget caps what they spend.
	Models []string
	Budget Budget
}

// samples reports whether the runs of an evaluation are statistical
// samples rather than replicas (issue 13): its agent is model-driven (it
// may call models through the gateway: the evaluation names models, or
// the agent declares one) and not declared deterministic, and the
// request leaves replication to the coordinator. Each run is then one
// replica, verified by binding and replays.
func samples(e EvalRecord, agent AgentInfo) bool {
	return e.Replicas == 0 && !agent.Deterministic && (len(e.Models) > 0 || agent.Model != "")
}

// reservedEnv are the prefixes of environment names the node sets for an
// agent (its model endpoint and token, its own settings), and of those
// with which Google's SDK would override them (GOOGLE_API_KEY is read
// before GEMINI_API_KEY; GOOGLE_GENAI_USE_VERTEXAI and _USE_GCA switch
// to Google's own endpoints).
var reservedEnv = []string{"REPRONET_", "OPENAI_", "ANTHROPIC_", "GEMINI_API_KEY", "GOOGLE_GEMINI_BASE_URL",
	"GOOGLE_API_KEY", "GOOGLE_GENAI_", "GOOGLE_VERTEX_"}

// MaxEnv bounds an evaluation's agent environment.
const MaxEnv = 64

// checkAgentEnv checks an evaluation's agent arguments and model list.
func checkAgentEnv(e Evaluation) error {
	if len(e.Env) > MaxEnv || len(e.Models) > MaxEnv {
		return fmt.Errorf("%d env entries and %d models (max %d each)", len(e.Env), len(e.Models), MaxEnv)
	}
	for i, kv := range e.Env {
		if err := proto.ValidEnvVar(kv); err != nil {
			return fmt.Errorf("env[%d]: %w", i, err)
		}
		for _, p := range reservedEnv {
			if strings.HasPrefix(kv, p) {
				return fmt.Errorf("env[%d]: names starting %s are the node's", i, p)
			}
		}
	}
	for i, m := range e.Models {
		if !proto.ValidLabel(m, proto.MaxFilterLen) {
			return fmt.Errorf("models[%d] %q: want 1-%d of [A-Za-z0-9._+-]", i, m, proto.MaxFilterLen)
		}
	}
	for _, v := range []float64{e.Budget.AttemptUSD, e.Budget.EvaluationUSD, e.Budget.JudgeUSD} {
		if v < 0 || math.IsNaN(v) || math.IsInf(v, 0) || v > 1e6 {
			return fmt.Errorf("budget %v: want 0 (none) to 1,000,000 dollars", v)
		}
	}
	return nil
}

// servedModels checks that every model an evaluation names is one the
// coordinator's gateway serves: otherwise its agents would fail for want
// of a provider, and a configuration mistake would be published as the
// model's score.
func servedModels(asked, served []string) error {
	var missing []string
	for _, m := range asked {
		if !slices.Contains(served, m) {
			missing = append(missing, m)
		}
	}
	switch {
	case len(missing) == 0:
		return nil
	case len(served) == 0:
		return fmt.Errorf("models %s: this coordinator has no model access (no [[providers]] and [[models]] in its --config)", strings.Join(missing, ", "))
	default:
		return fmt.Errorf("models %s: no provider of this coordinator serves them (it serves %s; add them to [[models]] in its --config)",
			strings.Join(missing, ", "), strings.Join(served, ", "))
	}
}

// JudgeSuffix ends the names of a scorer's model account and trajectory:
// evaluation X's judges are charged to "X.judge", so no evaluation may be
// named so.
const JudgeSuffix = ".judge"

// Bounds on an evaluation.
const (
	MaxReplicas           = 16
	MaxEvaluationAttempts = 250_000
)

// Evaluate is a request to queue an evaluation. Its reply is an
// EvaluateReply.
type Evaluate struct{ Evaluation }

func (Evaluate) event() {}

// EvaluateReply answers an Evaluate: the evaluation's ID and the attempts
// it queued, or why nothing was queued.
type EvaluateReply struct {
	ID       string
	Attempts int
	Err      error
}

// ErrBadRequest wraps every refusal of a request (evaluation, check) for
// what it asks, as opposed to the coordinator's trouble.
var ErrBadRequest = errors.New("bad request")

// evaluate queues one unit per task, level and run, each with its first
// replica (or, with Replicas set, all of them). Attempt and unit IDs
// derive from the evaluation ID, so that a retry after a crash in the
// middle of a write completes the set and never doubles it.
func (s *State) evaluate(ev Evaluate) {
	e := ev.Evaluation
	fail := func(format string, args ...any) {
		s.fx.Reply = EvaluateReply{Err: fmt.Errorf("%w: evaluate: %s", ErrBadRequest, fmt.Sprintf(format, args...))}
	}
	if e.Runs <= 0 {
		e.Runs = 1
	}
	if e.Replicas < 0 {
		e.Replicas = 0
	}
	if lim := min(MaxReplicas, s.cfg.CrossCheck.MaxReplicas); e.Replicas > lim {
		fail("%d replicas (max %d)", e.Replicas, lim)
		return
	}
	if e.ID != "" && (proto.ValidateAttemptID(e.ID) != nil || len(e.ID) > 64) {
		fail("evaluation ID %q: want 1-64 of [A-Za-z0-9._-]", e.ID)
		return
	}
	if strings.HasSuffix(e.ID, JudgeSuffix) {
		fail("evaluation ID %q: IDs ending %s name judges' budget accounts", e.ID, JudgeSuffix)
		return
	}
	if len(e.Group) > proto.MaxFilterLen {
		fail("group name of %d bytes (max %d)", len(e.Group), proto.MaxFilterLen)
		return
	}
	if err := checkAgentEnv(e); err != nil {
		fail("%v", err)
		return
	}
	if prev, ok := s.Evals[e.ID]; ok && e.ID != "" {
		if prev.Suite != e.Suite || prev.Agent != e.Agent {
			fail("evaluation %q exists for agent %q on suite %q", e.ID, prev.Agent, prev.Suite)
			return
		}
		s.fx.Reply = EvaluateReply{ID: prev.ID, Attempts: prev.Attempts}
		return
	}
	si, ok := s.catalog.LookupSuite(e.Suite)
	if !ok {
		fail("no suite %q", e.Suite)
		return
	}
	agent, ok := s.catalog.LookupAgent(e.Agent)
	if !ok {
		fail("no agent %q", e.Agent)
		return
	}
	if err := servedModels(e.Models, s.cfg.Models); err != nil {
		fail("%v", err)
		return
	}
	variants := si.Bench.Variants()
	if len(e.Levels) == 0 {
		e.Levels = variants
	}
	for i, l := range e.Levels {
		if slices.Contains(e.Levels[:i], l) {
			fail("level %q given twice", l)
			return
		}
		if !slices.Contains(variants, l) {
			fail("suite %q has no level %q (it has %q)", e.Suite, l, variants)
			return
		}
	}
	tasks := si.Bench.Tasks()
	for _, t := range tasks {
		for _, name := range t.Content {
			if _, ok := s.catalog.LookupContent(name); !ok {
				fail("suite %q: content %s of task %s was not imported", e.Suite, name, t.ID)
				return
			}
		}
	}
	if n := len(e.Levels) * e.Runs * max(1, e.Replicas) * len(tasks); e.Runs > MaxEvaluationAttempts || n > MaxEvaluationAttempts {
		fail("%d levels x %d runs x %d replicas x %d tasks is over %d attempts", len(e.Levels), e.Runs, max(1, e.Replicas),
			len(tasks), MaxEvaluationAttempts)
		return
	}
	evalID := e.ID
	if evalID == "" {
		evalID = "ev-" + s.newAttemptID()[3:19]
	}
	rec := EvalRecord{ID: evalID, Suite: e.Suite, Agent: e.Agent, Runs: e.Runs, Replicas: e.Replicas, Group: e.Group,
		Priority: e.Priority, At: s.now, Levels: e.Levels, Env: e.Env, Models: e.Models, Budget: e.Budget}
	per := max(1, e.Replicas)
	n, units := 0, 0
	limits := si.Limits
	if limits == nil {
		limits = s.cfg.Limits
	}
	for _, lvl := range e.Levels {
		for _, t := range tasks {
			stages := si.Bench.Pipeline(t, lvl)
			if err := bench.ValidatePipeline(stages); err != nil {
				fail("suite %q task %s: %v", e.Suite, t.ID, err)
				return
			}
			for run := 1; run <= e.Runs; run++ {
				units++
				unit := fmt.Sprintf("%s.u%d", evalID, units)
				pipe := ""
				if len(stages) > 1 {
					pipe = unit
					if _, ok := s.Pipelines[unit]; !ok {
						p := &Pipeline{ID: unit}
						for _, st := range stages {
							p.Stages = append(p.Stages, Stage{Name: st.Name, Image: st.Image, Single: st.Single, ApartFrom: st.ApartFrom})
						}
						s.Pipelines[unit] = p
						s.persistPipeline(p)
					}
				}
				if _, ok := s.Book.Attempts[unit]; !ok {
					w := crosscheck.Work{ID: unit, Kind: crosscheck.AgentAttempt, Deterministic: agent.Deterministic,
						InputCIDs: s.contentCIDs(t), ImageCID: agent.CID, WallLimitSeconds: float64(limits.GetWallSeconds()),
						Samples: samples(rec, agent)}
					if stages[0].Image != "" {
						img, _ := s.catalog.LookupAgent(stages[0].Image)
						w.ImageCID = img.CID
					}
					if err := s.Book.Add(w, s.derivedAttemptID(evalID, n+1)); err != nil {
						fail("%v", err)
						return
					}
					switch {
					case e.Replicas > 0:
						s.Book.Attempts[unit].Target = e.Replicas
					case stages[0].Single, w.Samples:
						s.Book.Attempts[unit].Target = 1
					}
				}
				for rep := 0; rep < per; rep++ {
					n++
					aid := s.derivedAttemptID(evalID, n)
					if _, exists := s.Attempts[aid]; exists {
						continue
					}
					if _, ok := s.Book.Attempts[unit].Jobs[aid]; !ok && rep > 0 {
						if err := s.Book.NewJob(unit, aid); err != nil {
							fail("%v", err)
							return
						}
					}
					s.Seq++
					s.addAttempt(&Attempt{ID: aid, Eval: evalID, Suite: e.Suite, TaskID: t.ID, Agent: e.Agent, Level: lvl,
						Stage: stages[0].Name, Pipe: pipe, Run: run, Unit: unit, Kind: KindAgent, Replica: rep, Group: e.Group,
						Priority: e.Priority, Seq: s.Seq, State: StateQueued, EnqueuedAt: s.now, Needs: needsOf(limits),
						GPUs: gpuNeed(t.GPUs)})
				}
				s.persistWork(unit)
			}
		}
	}
	rec.Attempts, rec.Units = n, units
	s.Evals[evalID] = rec
	s.persistEval(rec)
	s.fx.Reply = EvaluateReply{ID: evalID, Attempts: n}
}

// needsOf is what a slot must offer a job running under limits.
func needsOf(l *proto.Limits) schedule.Shape {
	return schedule.Shape{CPUMillis: l.GetCpuMillis(), MemoryBytes: l.GetMemoryBytes(), DiskBytes: l.GetDiskBytes()}
}

// gpuNeed is a task's GPU request for the scheduler.
func gpuNeed(g *proto.GPURequest) schedule.GPUNeed {
	return schedule.GPUNeed{Count: int(g.GetCount()), Model: g.GetModel(), MinMemoryBytes: g.GetMinMemoryBytes()}
}

// contentCIDs are the CIDs of a task's content, in order: what its jobs
// are given and must report they ran.
func (s *State) contentCIDs(t bench.Task) []string {
	out := make([]string, 0, len(t.Content))
	for _, name := range t.Content {
		c, _ := s.catalog.LookupContent(name)
		out = append(out, c.CID)
	}
	return out
}

// ReproSuite is the suite name capsule runs carry: a node that lists the
// suites it serves runs them only if it lists this one.
const ReproSuite = "repro"

// ReproQueued queues the runs of a reproducibility check whose capsule is
// stored (Record: ID, Check, Runs, capsule and image). Its reply is the
// check's ID.
type ReproQueued struct{ Record ReproRecord }

func (ReproQueued) event() {}

// reproQueued queues one unit per run of kind capsule_run, each with a
// single replica: the runs are the replication (on distinct nodes and
// operators), judged together by the checker.
func (s *State) reproQueued(e ReproQueued) {
	rec := e.Record
	rec.Created, rec.Units = s.now, nil
	for k := 1; k <= rec.Check.Runs; k++ {
		unit := fmt.Sprintf("%s.r%d", rec.ID, k)
		aid := s.derivedAttemptID(rec.ID, k)
		w := crosscheck.Work{ID: unit, Kind: crosscheck.CapsuleRun, Deterministic: true, InputCIDs: []string{rec.CapsuleCID},
			ImageCID: rec.ImageCID, WallLimitSeconds: float64(s.cfg.Limits.GetWallSeconds())}
		if err := s.Book.Add(w, aid); err != nil {
			s.fx.Reply = fmt.Errorf("reproducibility check: %w", err)
			return
		}
		s.Book.Attempts[unit].Target = 1 // the K runs are the replicas
		s.Seq++
		rec.Units = append(rec.Units, unit)
		s.addAttempt(&Attempt{ID: aid, Suite: ReproSuite, TaskID: rec.ID, Agent: rec.Image, Run: k, Unit: unit,
			Kind: KindCapsuleRun, Repro: rec.ID, Group: rec.Group, Seq: s.Seq, State: StateQueued, EnqueuedAt: s.now, Needs: needsOf(s.cfg.Limits)})
		s.persistWork(unit)
	}
	r := rec
	s.Repros[rec.ID] = &r
	s.persistRepro(&r)
	s.fx.Reply = rec.ID
}

// ReproJudged keeps the checker's report on a check whose runs are all
// decided (or why there is none).
type ReproJudged struct {
	ID     string
	Report json.RawMessage
	Err    string
}

func (ReproJudged) event() {}

func (s *State) reproJudged(e ReproJudged) {
	r := s.Repros[e.ID]
	if r == nil || r.Report != nil || r.Error != "" {
		return
	}
	r.Report, r.Error = e.Report, e.Err
	s.persistRepro(r)
}
