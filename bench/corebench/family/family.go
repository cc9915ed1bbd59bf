// Package family is CORE-Bench as a benchmark family of the neutral core
// (bench.Family): a suite is a CORE-Bench task file with a grader and a
// strip rule; its variants are the three levels; a unit has one stage, the
// agent's rollout, whose recipe places the task's capsule in the workspace,
// strips it for the level (the strip rule as recipe edits), writes the
// prompt and mounts code/, data/ and results/ where CodeOcean puts them,
// and at Medium runs the agent in the capsule's environment (the image of
// its environment/Dockerfile, built by the node, the agent's own image at
// /agent); its scorer grades the returned report.json with the suite's
// grader; its boards are package leaderboard's.
//
// It adapts package corebench to package bench and holds no benchmark
// logic of its own.
package family

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	"github.com/repronet/repronet/proto"
)

// Name is the family's name.
const Name = "corebench"

// The agent's view of an attempt, as CORE-Bench's harness gives it: the
// prompt in the working folder beside the capsule folder, the capsule's
// code, data and results also where CodeOcean puts them.
const (
	Workspace  = "/workspace"
	PromptFile = "prompt.txt"
	ReportFile = "report.json"
	// MaxReport caps the agent's report file.
	MaxReport = 1 << 20
	// Stage is the one stage of a unit.
	Stage = "rollout"
	// AgentMount is where the agent's image is at Medium, inside the
	// capsule's environment (docs/agents.md: agents keep their files
	// there).
	AgentMount = "/agent"
)

// Config is a CORE-Bench suite's settings (bench.SuiteDef.Config).
type Config struct {
	Grader    string `json:"grader"`
	StripRule string `json:"strip_rule"`
}

// Default scoring of a suite.
const (
	DefaultGrader    = "corebench-original"
	DefaultStripRule = corebench.OriginalStripRuleName
)

// Family is CORE-Bench; New makes it.
type Family struct {
	templates map[string]string
}

// New is the family with the benchmark's own prompt templates.
func New() *Family { return &Family{templates: corebench.DefaultPrompts()} }

// Name is "corebench".
func (*Family) Name() string { return Name }

// Def makes the stored definition of a suite from a task file and its
// scoring (empty: the defaults).
func Def(name string, tasks []byte, grader, stripRule string) (bench.SuiteDef, error) {
	if grader == "" {
		grader = DefaultGrader
	}
	if stripRule == "" {
		stripRule = DefaultStripRule
	}
	cfg, err := json.Marshal(Config{Grader: grader, StripRule: stripRule})
	if err != nil {
		return bench.SuiteDef{}, err
	}
	return bench.SuiteDef{Name: name, Family: Name, Config: cfg, Tasks: tasks}, nil
}

// Open parses a suite: its task file (HAL's "gpu" key allowed) and its
// grader and strip rule.
func (f *Family) Open(def bench.SuiteDef) (bench.Suite, error) {
	var cfg Config
	if len(def.Config) > 0 {
		if err := json.Unmarshal(def.Config, &cfg); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	if cfg.Grader == "" {
		cfg.Grader = DefaultGrader
	}
	if cfg.StripRule == "" {
		cfg.StripRule = DefaultStripRule
	}
	tasks, err := corebench.ParseTasksWith(def.Tasks, corebench.ParseOptions{AllowGPUKey: true})
	if err != nil {
		return nil, err
	}
	g, rule, scoring, err := corebench.LookupScoring(cfg.Grader, cfg.StripRule)
	if err != nil {
		return nil, err
	}
	s := &Suite{name: def.Name, templates: f.templates, tasks: map[string]corebench.Task{}, grader: g, rule: rule,
		scoring: scoring, prompts: map[[2]string]string{}}
	for _, t := range tasks {
		s.tasks[t.CapsuleID] = t
		s.order = append(s.order, t.CapsuleID)
	}
	return s, nil
}

// Suite is an opened CORE-Bench suite.
type Suite struct {
	name      string
	templates map[string]string
	tasks     map[string]corebench.Task
	order     []string
	grader    corebench.Grader
	rule      corebench.StripRule
	scoring   corebench.Scoring

	mu      sync.Mutex
	prompts map[[2]string]string // by task and level
}

// Task returns a task by its capsule ID.
func (s *Suite) Task(id string) (corebench.Task, bool) { t, ok := s.tasks[id]; return t, ok }

// Tasks are the task file's tasks; each needs its capsule, imported under
// its capsule ID, and a GPU when HAL's copy says so.
func (s *Suite) Tasks() []bench.Task {
	out := make([]bench.Task, 0, len(s.order))
	for _, id := range s.order {
		t := bench.Task{ID: id, Content: []string{id}}
		if s.tasks[id].GPU {
			t.GPUs = &proto.GPURequest{Count: 1}
		}
		out = append(out, t)
	}
	return out
}

// Variants are the levels, easiest first.
func (s *Suite) Variants() []string {
	var out []string
	for _, l := range corebench.Levels() {
		out = append(out, string(l))
	}
	return out
}

// Scorer is the grader and the strip rule with their versions.
func (s *Suite) Scorer() string { return s.scoring.String() }

// Pipeline is the agent's rollout alone.
func (s *Suite) Pipeline(bench.Task, string) []bench.Stage { return []bench.Stage{{Name: Stage}} }

// prompt renders (once) the prompt of a task at a level.
func (s *Suite) prompt(t corebench.Task, level corebench.Level) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{t.CapsuleID, string(level)}
	if p, ok := s.prompts[k]; ok {
		return p, nil
	}
	p, err := corebench.Prompt(s.templates, level, t)
	if err != nil {
		return "", err
	}
	s.prompts[k] = p
	return p, nil
}

// Recipe is the rollout's job: the capsule extracted into the workspace
// (its one top folder must be the capsule ID), code/, data/ and results/
// made real folders, the strip rule applied for the level, the prompt
// written beside the capsule folder; the agent's image run in /workspace
// with PROMPT_FILE and HOME set and the capsule's folders mounted at
// /code, /data and /results; report.json returned. At Medium, as
// CORE-Bench intends, the agent gets the capsule's environment: when the
// capsule has environment/Dockerfile, the node builds it (context
// environment/) and runs the agent in that image, its own image at
// AgentMount.
func (s *Suite) Recipe(in bench.RecipeInput) (*proto.Recipe, error) {
	t, ok := s.tasks[in.Task.ID]
	if !ok {
		return nil, fmt.Errorf("suite %s has no task %s", s.name, in.Task.ID)
	}
	level, err := corebench.ParseLevel(in.Variant)
	if err != nil {
		return nil, err
	}
	capsule, ok := in.Content[t.CapsuleID]
	if !ok {
		return nil, fmt.Errorf("task %s: capsule not imported", t.CapsuleID)
	}
	prompt, err := s.prompt(t, level)
	if err != nil {
		return nil, err
	}
	dir := t.CapsuleID
	edits := []*proto.Edit{
		{Op: &proto.Edit_Dir{Dir: dir + "/code"}},
		{Op: &proto.Edit_Dir{Dir: dir + "/data"}},
		{Op: &proto.Edit_Dir{Dir: dir + "/results"}},
	}
	strip, err := s.rule.Edits(dir, level)
	if err != nil {
		return nil, err
	}
	edits = append(edits, strip...)
	edits = append(edits, &proto.Edit{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: PromptFile, Content: []byte(prompt)}}})
	var env *proto.Environment
	if level == corebench.Medium {
		env = &proto.Environment{Dockerfile: dir + "/environment/Dockerfile", Context: dir + "/environment", ImageMount: AgentMount,
			IfPresent: true}
	}
	return &proto.Recipe{
		ImageCid: in.Image.Bytes(),
		Inputs:   []*proto.Input{{Cid: capsule.Bytes(), Extract: true, Top: dir}},
		Edits:    edits,
		Env:      append([]string{"HOME=/home/agent", "PROMPT_FILE=" + Workspace + "/" + PromptFile}, in.Env...),
		Cwd:      Workspace,
		Mounts: []*proto.Mount{
			{Target: Workspace},
			{Source: dir + "/code", Target: "/code"},
			{Source: dir + "/data", Target: "/data"},
			{Source: dir + "/results", Target: "/results"},
		},
		Limits:      in.Limits,
		Gpus:        in.Task.GPUs,
		Outputs:     []*proto.Output{{Path: ReportFile, MaxBytes: MaxReport}},
		Environment: env,
	}, nil
}

// Score grades the agent's report.json with the suite's grader (a report
// that is missing or cannot be parsed is graded as empty: all wrong, with
// the reason kept in the verdict's detail). Replicas compare the grading
// and the report's digest.
func (s *Suite) Score(ctx context.Context, in bench.ScoreInput) (bench.Score, error) {
	t, ok := s.tasks[in.Task.ID]
	if !ok {
		return bench.Score{}, fmt.Errorf("suite %s has no task %s", s.name, in.Task.ID)
	}
	report, err := in.Output(ctx, ReportFile)
	if err != nil && !errors.Is(err, bench.ErrNotReturned) {
		return bench.Score{}, fmt.Errorf("task %s: read %s: %w", in.Task.ID, ReportFile, err)
	}
	detail := ""
	if err != nil || len(report) == 0 {
		detail = fmt.Sprintf("no report: %v", err)
		report = nil
	}
	body := report
	if body == nil {
		body = []byte("{}")
	}
	v, err := corebench.GradeWith(s.grader, s.rule, t, body)
	if err != nil {
		detail = fmt.Sprintf("report.json not gradable: %v", err)
		if v, err = corebench.GradeWith(s.grader, s.rule, t, []byte("{}")); err != nil {
			return bench.Score{}, err
		}
	}
	g := v.Grading()
	sum := sha256.Sum256(report)
	out := bench.Score{Comparable: bench.Comparable{Grading: &g, OutputDigest: hex.EncodeToString(sum[:])}}
	if v.TaskCorrect {
		out.Value = 1
	}
	var errs [3]error
	out.Scoring, errs[0] = json.Marshal(v.Scoring())
	out.Verdict, errs[1] = json.Marshal(Verdict{Verdict: v, Detail: detail})
	out.Public, errs[2] = json.Marshal(leaderboard.ScoreOf(v))
	for _, err := range errs {
		if err != nil {
			return bench.Score{}, fmt.Errorf("encode score of %s: %w", t.CapsuleID, err)
		}
	}
	return out, nil
}

// Verdict is what the family keeps of a graded attempt: the grader's
// verdict (with interval bounds: never public) and why the report could
// not be graded as it was, if so.
type Verdict struct {
	corebench.Verdict
	Detail string `json:"detail,omitempty"`
}

// Boards builds package leaderboard's boards from the suite's entries.
func (s *Suite) Boards(entries []bench.Entry) ([]any, error) {
	les, err := Entries(entries)
	if err != nil {
		return nil, err
	}
	boards, errs := leaderboard.Build(les)
	if len(errs) > 0 {
		return nil, fmt.Errorf("suite %s: %d entries skipped, first: %w", s.name, len(errs), errs[0])
	}
	out := make([]any, len(boards))
	for i := range boards {
		out[i] = boards[i]
	}
	return out, nil
}

// Entries turns neutral entries into package leaderboard's (for the
// boards and for the HAL export).
func Entries(entries []bench.Entry) ([]leaderboard.Entry, error) {
	out := make([]leaderboard.Entry, 0, len(entries))
	for _, e := range entries {
		le := leaderboard.Entry{Suite: e.Suite, Level: e.Variant, Agent: e.Agent, Model: e.Model, TaskID: e.TaskID, Run: e.Run, Eval: e.Eval,
			Status: e.Status, CostUSD: e.CostUSD, CPUSeconds: e.CPUSeconds, WallSeconds: e.WallSeconds,
			Started: e.Started, Finished: e.Finished, Verification: e.Verification}
		if len(e.Scoring) > 0 {
			if err := json.Unmarshal(e.Scoring, &le.Scoring); err != nil {
				return nil, fmt.Errorf("entry %s/%s/%s: scoring: %w", e.Suite, e.Variant, e.TaskID, err)
			}
		}
		if len(e.Score) > 0 {
			var sc leaderboard.Score
			if err := json.Unmarshal(e.Score, &sc); err != nil {
				return nil, fmt.Errorf("entry %s/%s/%s: score: %w", e.Suite, e.Variant, e.TaskID, err)
			}
			le.Score = &sc
		}
		out = append(out, le)
	}
	return out, nil
}

// Scoring is the suite's scoring as entries carry it, for units nothing is
// scored of yet.
func (s *Suite) Scoring() json.RawMessage {
	b, _ := json.Marshal(s.scoring)
	return b
}
