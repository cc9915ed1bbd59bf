// Package family is PaperBench as a benchmark family of the neutral core
// (bench.Family), built on package paperbench's pure rules.
//
// A suite is a task file of papers (Paper: the rubric, the blacklist, the
// paper's text and addendum for the judge; built from a paper folder in the
// published layout by ImportFolder) and a Config (the judge model and its
// settings, the share of leaves judged twice, the reproduction's image).
// Each paper's files for the agent (paper.md, paper.pdf, addendum.md,
// assets/, blacklist.txt) are imported as content under the paper's id;
// the rubric and the judge's addendum stay in the suite's definition on
// the coordinator and never enter a recipe.
//
// Variants: "code-dev" (one stage: the agent's rollout, scored on the
// Code Development leaves of the Code-Dev rubric, nothing run) and "full"
// (two stages: the rollout, then the reproduction: the submission's
// reproduce.sh run in a fresh sandbox of the reproducer image, never on
// the rollout's node, scored on the whole rubric). Both stages are Single:
// a rollout and a reproduction of ML code are samples, not replicas, and
// each scoring asks a judge for every leaf. The judge is called through
// bench.ScoreInput.Models (the coordinator's gateway: metered, recorded,
// charged to the evaluation's judge budget); the tree is scored under both
// of paperbench's graders, and boards never mix graders or judge
// settings. The blacklist monitor reads the agent's logs (the rollout's
// "logs" output) and the rollout's model calls as the gateway recorded
// them (bench.ScoreInput.Trajectory).
//
// It owns the task file, the recipes, the scorer and the boards of the
// family, and holds no scoring rule of its own: those are paperbench's.
// It touches no coordinator state; its only I/O is ImportFolder (reads a
// paper folder) and the scorer's temporary folders (a submission
// extracted for paperbench's snapshot and judge input).
package family

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/internal/judging"
	"github.com/repronet/repronet/bench/internal/strictjson"
	"github.com/repronet/repronet/bench/paperbench"
	"github.com/repronet/repronet/proto"
)

// Name is the family's name.
const Name = "paperbench"

// Variants.
const (
	// CodeDev judges the Code Development leaves of the Code-Dev rubric on
	// the rollout's submission; nothing is run.
	CodeDev = "code-dev"
	// Full runs the reproduction and judges every leaf.
	Full = "full"
)

// Stages.
const (
	StageRollout   = "rollout"
	StageReproduce = "reproduce"
)

// Versions of what a score depends on besides the judge: the judge's
// prompt and file selection (paperbench.BuildJudgeInput), the monitor
// (paperbench.Blacklist.Check over the agent's logs) and the reproduction
// (paperbench.ReproduceScript with pipefail, files over 10 MiB dropped,
// changes by content hash). A change of any is a new version.
const (
	PromptVersion    = "paperbench-judge-prompt@1"
	MonitorVersion   = "paperbench-monitor@1"
	ReproduceVersion = "paperbench-reproduce@1"
)

// DefaultReproducer is the registered image the reproduction runs in when
// the config names none.
const DefaultReproducer = "paperbench-reproducer"

// JudgeSettings are the request settings of a judge: part of the scoring.
type JudgeSettings struct {
	Model string `json:"model"`
	// Temperature is sent when set (reasoning models refuse it).
	Temperature *float64 `json:"temperature,omitempty"`
	// MaxTokens bounds each answer (max_completion_tokens; 0: none sent).
	MaxTokens int `json:"max_tokens,omitempty"`
	// ReasoningEffort is sent when set ("high" in the paper's judge).
	ReasoningEffort string `json:"reasoning_effort,omitempty"`
}

// Price is what a judge model costs, in dollars per million tokens: the
// board's judge cost is the tokens the judge's answers report at it.
type Price = judging.Price

// Config is a suite's settings (bench.SuiteDef.Config).
type Config struct {
	// Judge grades every leaf.
	Judge JudgeSettings `json:"judge"`
	// SecondJudge grades the leaves judged twice (nil: Judge again).
	SecondJudge *JudgeSettings `json:"second_judge,omitempty"`
	// DoubleJudged is the share of judged leaves (in [0, 1]) judged twice,
	// chosen by a hash of the leaf id (so the same leaves on every run), at
	// least one when not 0. The first judging is the one scored.
	DoubleJudged float64 `json:"double_judged"`
	// Reproducer names the registered image the reproduction runs in
	// (default DefaultReproducer). It must hold /bin/sh, bash, tar and
	// find, and what the papers' code needs (the paper's: Ubuntu 24.04,
	// CUDA).
	Reproducer string `json:"reproducer,omitempty"`
	// ReproduceWallSeconds narrows the suite's wall-clock limit for the
	// reproduction (0: the suite's).
	ReproduceWallSeconds uint32 `json:"reproduce_wall_seconds,omitempty"`
	// Concurrency bounds the judge calls of one scoring in flight
	// (default 8).
	Concurrency int `json:"judge_concurrency,omitempty"`
	// Prices of judge models, for the board's judge cost (a model without
	// one has no cost on the board). Not part of the scoring.
	Prices map[string]Price `json:"prices,omitempty"`
}

// DefaultConfig is the paper's judge (o3-mini, reasoning effort high), a
// tenth of the leaves judged twice, the default reproducer.
func DefaultConfig() Config {
	return Config{Judge: JudgeSettings{Model: "o3-mini", ReasoningEffort: "high"}, DoubleJudged: 0.1, Reproducer: DefaultReproducer}
}

// Bounds of a config.
const (
	MaxConcurrency     = 64
	defaultConcurrency = 8
)

// check validates a config and fills its defaults.
func (c *Config) check() error {
	for _, j := range []struct {
		name string
		s    *JudgeSettings
	}{{"judge", &c.Judge}, {"second_judge", c.SecondJudge}} {
		if j.s == nil {
			continue
		}
		if strings.TrimSpace(j.s.Model) == "" {
			return fmt.Errorf("config: %s.model is required", j.name)
		}
		if t := j.s.Temperature; t != nil && !(*t >= 0 && *t <= 2) {
			return fmt.Errorf("config: %s.temperature %v: want 0-2", j.name, *t)
		}
		if j.s.MaxTokens < 0 {
			return fmt.Errorf("config: %s.max_tokens %d: negative", j.name, j.s.MaxTokens)
		}
	}
	if !(c.DoubleJudged >= 0 && c.DoubleJudged <= 1) {
		return fmt.Errorf("config: double_judged %v: want a share in [0, 1]", c.DoubleJudged)
	}
	if c.Reproducer == "" {
		c.Reproducer = DefaultReproducer
	}
	if !proto.ValidLabel(c.Reproducer, proto.MaxFilterLen) {
		return fmt.Errorf("config: reproducer %q: want 1-%d of [A-Za-z0-9._+-]", c.Reproducer, proto.MaxFilterLen)
	}
	if c.Concurrency == 0 {
		c.Concurrency = defaultConcurrency
	}
	if c.Concurrency < 1 || c.Concurrency > MaxConcurrency {
		return fmt.Errorf("config: judge_concurrency %d: want 1-%d", c.Concurrency, MaxConcurrency)
	}
	return judging.CheckPrices(c.Prices)
}

// second is the judge of the leaves judged twice.
func (c *Config) second() JudgeSettings {
	if c.SecondJudge != nil {
		return *c.SecondJudge
	}
	return c.Judge
}

// Scoring is what a score depends on besides the agent and the paper, as
// entries carry it (bench.Score.Scoring): the judges and the versions.
// Both graders' scores are in every public score; the boards keep them
// apart.
type Scoring struct {
	Family       string        `json:"family"`
	Judge        JudgeSettings `json:"judge"`
	SecondJudge  JudgeSettings `json:"second_judge"`
	DoubleJudged float64       `json:"double_judged"`
	Prompt       string        `json:"prompt"`
	Monitor      string        `json:"monitor"`
	Reproduce    string        `json:"reproduce"`
}

// String names the scoring in one line (Suite.Scorer).
func (s Scoring) String() string {
	return fmt.Sprintf("paperbench judge %s (%s) graders %s, %s monitor %s reproduce %s", s.Judge.Model, s.Prompt,
		paperbench.GraderReportFailed, paperbench.GraderSilentZero, s.Monitor, s.Reproduce)
}

// Family is PaperBench.
type Family struct{}

// New makes the family.
func New() Family { return Family{} }

// Name is "paperbench".
func (Family) Name() string { return Name }

// Def makes the stored definition of a suite from its papers and config.
func Def(name string, papers []Paper, cfg Config) (bench.SuiteDef, error) {
	tasks, err := json.Marshal(papers)
	if err != nil {
		return bench.SuiteDef{}, fmt.Errorf("paperbench suite %s: %w", name, err)
	}
	c, err := json.Marshal(cfg)
	if err != nil {
		return bench.SuiteDef{}, fmt.Errorf("paperbench suite %s: %w", name, err)
	}
	return bench.SuiteDef{Name: name, Family: Name, Config: c, Tasks: tasks}, nil
}

// Open parses a suite's config and task file strictly.
func (Family) Open(def bench.SuiteDef) (bench.Suite, error) {
	var cfg Config
	if len(def.Config) == 0 {
		return nil, fmt.Errorf("config: a paperbench suite needs one (at least the judge's model)")
	}
	if err := strictjson.Decode(def.Config, &cfg); err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	papers, err := ParseTasks(def.Tasks)
	if err != nil {
		return nil, err
	}
	s := &Suite{name: def.Name, cfg: cfg, papers: make(map[string]*paper, len(papers))}
	for _, p := range papers {
		s.papers[p.ID] = p
		s.order = append(s.order, p.ID)
	}
	return s, nil
}

// Suite is an opened suite; it is never changed after Open, so safe for
// concurrent use.
type Suite struct {
	name   string
	cfg    Config
	papers map[string]*paper
	order  []string
}

// Config is the suite's config, defaults filled.
func (s *Suite) Config() Config { return s.cfg }

// Tasks are the papers: each needs its content (imported under its id)
// and the GPUs its entry asks for.
func (s *Suite) Tasks() []bench.Task {
	out := make([]bench.Task, 0, len(s.order))
	for _, id := range s.order {
		p := s.papers[id]
		t := bench.Task{ID: id, Content: []string{id}}
		if g := p.GPUs; g != nil {
			t.GPUs = &proto.GPURequest{Count: g.Count, Model: g.Model, MinMemoryBytes: g.MinMemoryBytes}
		}
		out = append(out, t)
	}
	return out
}

// Variants are "code-dev" and "full", cheapest first.
func (s *Suite) Variants() []string { return []string{CodeDev, Full} }

func (s *Suite) scoring() Scoring {
	return Scoring{Family: Name, Judge: s.cfg.Judge, SecondJudge: s.cfg.second(), DoubleJudged: s.cfg.DoubleJudged,
		Prompt: PromptVersion, Monitor: MonitorVersion, Reproduce: ReproduceVersion}
}

// ValueGrader names the grader whose score a job's value is
// (bench.ValueGrader): GraderReportFailed's (Verdict.value), whatever the
// scoring.
func (s *Suite) ValueGrader(json.RawMessage) string { return string(paperbench.GraderReportFailed) }

// Scorer names the judges and versions in one line.
func (s *Suite) Scorer() string { return s.scoring().String() }

// Scoring is the scoring as entries carry it.
func (s *Suite) Scoring() json.RawMessage {
	b, _ := json.Marshal(s.scoring())
	return b
}

// Pipeline is the rollout alone for Code-Dev; the rollout then the
// reproduction, in the reproducer image and never on the rollout's node,
// for the full variant. Both stages are Single.
func (s *Suite) Pipeline(_ bench.Task, variant string) []bench.Stage {
	rollout := bench.Stage{Name: StageRollout, Single: true}
	if variant != Full {
		return []bench.Stage{rollout}
	}
	return []bench.Stage{rollout, {Name: StageReproduce, Image: s.cfg.Reproducer, Single: true, ApartFrom: []string{StageRollout}}}
}

func (s *Suite) paper(id string) (*paper, error) {
	p, ok := s.papers[id]
	if !ok {
		return nil, fmt.Errorf("suite %s has no paper %q", s.name, id)
	}
	return p, nil
}

func (s *Suite) checkVariant(variant string) error {
	if !slices.Contains(s.Variants(), variant) {
		return fmt.Errorf("suite %s: no variant %q (have %q)", s.name, variant, s.Variants())
	}
	return nil
}
