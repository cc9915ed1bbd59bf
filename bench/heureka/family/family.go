// Package family is HeurekaBench as a benchmark family of the neutral core
// (bench.Family), built on package heureka's pure rules.
//
// A suite's task file holds the published question files as they are
// (TaskFile: mcq.json and oeq.json, or their _lite versions, either may be
// left out); its config names the open-ended judge and its settings
// (Config). Each question is a task ("mcq-paper1-insight1-Question2"),
// with one variant ("") and one stage ("answer"): the paper's datasets
// (content named DataContent(paper), a tarball of the files the insight's
// "data" names, by base name) extracted into /workspace/data, the question
// (with its options for a multiple-choice one, and the datasets'
// descriptions) in question.txt; the agent writes its final message to
// answer.txt. No insight's summary, how or relevant, nor any gold answer,
// enters a recipe.
//
// Scoring. A multiple-choice answer is scored under both of heureka's
// graders (the published split on "," and the one trimming spaces); an
// open-ended one is rated 1-5 by the judge through bench.ScoreInput.Models
// (the gateway) against the gold answer's atomic facts, asking for the
// top log-probabilities, and scored under both of heureka's OEQ scorers:
// probability-weighted when the provider returned log-probabilities,
// plain otherwise, each score saying which. A score's scoring is its
// kind's (Scoring: an open-ended one names the judge, its settings and the
// prompt's version). Boards are one per question kind, grader (or OEQ
// scorer) and scoring: grader and judge versions never mix.
//
// It owns the task file, the recipe, the scorer and the boards of the
// family and holds no scoring rule of its own: those are heureka's. It
// does no I/O.
package family

import (
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/heureka"
	"github.com/repronet/repronet/bench/internal/judging"
	"github.com/repronet/repronet/bench/internal/strictjson"
	"github.com/repronet/repronet/proto"
)

// Name is the family's name.
const Name = "heureka"

// Stage is a unit's one stage; Variant its one variant.
const (
	Stage   = "answer"
	Variant = ""
)

// Question kinds.
const (
	KindMCQ = "mcq"
	KindOEQ = "oeq"
)

// PromptVersion versions the judge's prompt (heureka.OEQJudgePrompt) and
// how its answer is read: a change of either is a new version.
const PromptVersion = "heureka-oeq-prompt@1"

// The agent's view of a job.
const (
	Workspace    = "/workspace"
	DataDir      = "data"
	QuestionFile = "question.txt"
	AnswerFile   = "answer.txt"
	// MaxAnswerBytes bounds the final message read.
	MaxAnswerBytes = 256 << 10
)

// TaskFile is a suite's task file: the published question files, as
// published.
type TaskFile struct {
	MCQ json.RawMessage `json:"mcq,omitempty"`
	OEQ json.RawMessage `json:"oeq,omitempty"`
}

// Price is what a judge model costs, dollars per million tokens.
type Price = judging.Price

// Config is a suite's settings (bench.SuiteDef.Config).
type Config struct {
	// Judge rates open-ended answers (default: the published judge,
	// heureka.PublishedJudgeSettings). TopLogprobs 0 asks for no
	// log-probabilities: every score is then the plain rating.
	Judge heureka.JudgeSettings `json:"judge"`
	// Prices of judge models for the board's judge cost (a model without
	// one has none). Not part of the scoring.
	Prices map[string]Price `json:"prices,omitempty"`
}

// DefaultConfig is the published judge.
func DefaultConfig() Config { return Config{Judge: heureka.PublishedJudgeSettings()} }

// MaxTopLogprobs is the most alternatives a judge may be asked for
// (OpenAI's bound).
const MaxTopLogprobs = 20

func (c *Config) check() error {
	j := c.Judge
	switch {
	case strings.TrimSpace(j.Model) == "":
		return errors.New("config: judge.model is required")
	case !(j.Temperature >= 0 && j.Temperature <= 2):
		return fmt.Errorf("config: judge.temperature %v: want 0-2", j.Temperature)
	case !(j.TopP > 0 && j.TopP <= 1):
		return fmt.Errorf("config: judge.top_p %v: want (0, 1]", j.TopP)
	case j.MaxTokens < 1:
		return fmt.Errorf("config: judge.max_tokens %d: want at least 1", j.MaxTokens)
	case j.TopLogprobs < 0 || j.TopLogprobs > MaxTopLogprobs:
		return fmt.Errorf("config: judge.top_logprobs %d: want 0-%d", j.TopLogprobs, MaxTopLogprobs)
	}
	return judging.CheckPrices(c.Prices)
}

// Scoring is what a score depends on besides the agent and the question,
// as entries carry it. A multiple-choice score depends on the graders
// only; an open-ended one on the scorers, the judge and the prompt's
// version: so a new judge starts new OEQ boards and leaves the MCQ boards
// as they are. Every score holds all of its kind's graders or scorers;
// boards keep them apart. The suite's default scoring (Suite.Scoring, for
// units nothing is scored of yet) has no kind and names everything.
type Scoring struct {
	Family     string                 `json:"family"`
	Kind       string                 `json:"kind,omitempty"`
	MCQGraders []heureka.MCQGrader    `json:"mcq_graders,omitempty"`
	OEQScorers []heureka.OEQScorer    `json:"oeq_scorers,omitempty"`
	Judge      *heureka.JudgeSettings `json:"judge,omitempty"`
	Prompt     string                 `json:"prompt,omitempty"`
}

// Family is HeurekaBench.
type Family struct{}

// New makes the family.
func New() Family { return Family{} }

// Name is "heureka".
func (Family) Name() string { return Name }

// Def makes a suite's stored definition from the question files as
// published (either may be nil) and a config.
func Def(name string, mcq, oeq []byte, cfg Config) (bench.SuiteDef, error) {
	tasks, err := json.Marshal(TaskFile{MCQ: mcq, OEQ: oeq})
	if err != nil {
		return bench.SuiteDef{}, fmt.Errorf("heureka suite %s: task file: %w", name, err)
	}
	c, err := json.Marshal(cfg)
	if err != nil {
		return bench.SuiteDef{}, fmt.Errorf("heureka suite %s: config: %w", name, err)
	}
	return bench.SuiteDef{Name: name, Family: Name, Config: c, Tasks: tasks}, nil
}

// question is one task: a multiple-choice or an open-ended question.
type question struct {
	id      string
	kind    string
	content string
	mcq     *heureka.MCQ
	oeq     *heureka.OEQ
}

func (q *question) insight() *heureka.Insight {
	if q.mcq != nil {
		return q.mcq.Insight
	}
	return q.oeq.Insight
}

// Suite is an opened suite; never changed after Open, so safe for
// concurrent use.
type Suite struct {
	name      string
	cfg       Config
	questions map[string]*question
	order     []string
}

// Open parses a suite's config (defaults when empty) and task file
// strictly; every error names the question at fault.
func (Family) Open(def bench.SuiteDef) (bench.Suite, error) {
	cfg := DefaultConfig()
	if c := strings.TrimSpace(string(def.Config)); c != "" && c != "null" {
		cfg = Config{}
		if err := strictjson.Decode(def.Config, &cfg); err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
	}
	if err := cfg.check(); err != nil {
		return nil, err
	}
	var tf TaskFile
	if err := strictjson.Decode(def.Tasks, &tf); err != nil {
		return nil, fmt.Errorf("task file: %w", err)
	}
	if len(tf.MCQ) == 0 && len(tf.OEQ) == 0 {
		return nil, errors.New("task file: neither mcq nor oeq questions")
	}
	s := &Suite{name: def.Name, cfg: cfg, questions: map[string]*question{}}
	add := func(q *question, id heureka.QuestionID) error {
		q.id = TaskID(q.kind, id)
		if !proto.ValidLabel(q.id, proto.MaxLabelLen) {
			return fmt.Errorf("%s question %s: task ID %q is not a label of 1-%d of [A-Za-z0-9._+-]", q.kind, id, q.id, proto.MaxLabelLen)
		}
		if _, dup := s.questions[q.id]; dup {
			return fmt.Errorf("%s question %s: task ID %q twice", q.kind, id, q.id)
		}
		q.content = DataContent(id.Paper)
		if !proto.ValidLabel(q.content, proto.MaxLabelLen) {
			return fmt.Errorf("%s question %s: paper %q makes no content name", q.kind, id, id.Paper)
		}
		if _, err := dataFiles(q.insight()); err != nil {
			return fmt.Errorf("%s question %s: %w", q.kind, id, err)
		}
		s.questions[q.id] = q
		s.order = append(s.order, q.id)
		return nil
	}
	if len(tf.MCQ) > 0 && string(tf.MCQ) != "null" {
		mcqs, err := heureka.ParseMCQFile(tf.MCQ)
		if err != nil {
			return nil, fmt.Errorf("mcq: %w", err)
		}
		for i := range mcqs {
			if err := add(&question{kind: KindMCQ, mcq: &mcqs[i]}, mcqs[i].ID); err != nil {
				return nil, err
			}
		}
	}
	if len(tf.OEQ) > 0 && string(tf.OEQ) != "null" {
		oeqs, err := heureka.ParseOEQFile(tf.OEQ)
		if err != nil {
			return nil, fmt.Errorf("oeq: %w", err)
		}
		for i := range oeqs {
			if err := add(&question{kind: KindOEQ, oeq: &oeqs[i]}, oeqs[i].ID); err != nil {
				return nil, err
			}
		}
	}
	return s, nil
}

var notLabel = regexp.MustCompile(`[^A-Za-z0-9._+-]+`)

// TaskID names a question as a task: kind, paper, insight and question
// key, joined by "-", with what is not a label character dropped
// ("mcq-paper1-insight1-Question2").
func TaskID(kind string, id heureka.QuestionID) string {
	return strings.Join([]string{kind, notLabel.ReplaceAllString(id.Paper, ""),
		notLabel.ReplaceAllString(id.Insight, ""), notLabel.ReplaceAllString(id.Question, "")}, "-")
}

// DataContent is the content name of a paper's datasets: a tarball of the
// files its insights' "data" name, each by its base name.
func DataContent(paper string) string { return "heureka-" + notLabel.ReplaceAllString(paper, "") }

// dataFiles are an insight's datasets as the agent sees them: base names
// under DataDir, with their descriptions; two of one base name are an
// error.
func dataFiles(in *heureka.Insight) ([]heureka.DataFile, error) {
	var out []heureka.DataFile
	seen := map[string]string{}
	for _, d := range in.Data {
		base := path.Base(d.Path)
		if base == "." || base == "/" || base == "" {
			return nil, fmt.Errorf("data path %q names no file", d.Path)
		}
		if prev, dup := seen[base]; dup {
			return nil, fmt.Errorf("data files %q and %q share the base name %q", prev, d.Path, base)
		}
		seen[base] = d.Path
		out = append(out, heureka.DataFile{Path: DataDir + "/" + base, Description: d.Description})
	}
	return out, nil
}

// Config is the suite's config, defaults filled.
func (s *Suite) Config() Config { return s.cfg }

// Kind is the kind of a task ("mcq" or "oeq"), "" for none of the suite.
func (s *Suite) Kind(taskID string) string {
	if q, ok := s.questions[taskID]; ok {
		return q.kind
	}
	return ""
}

// Tasks are the questions, multiple-choice first, each needing its
// paper's datasets.
func (s *Suite) Tasks() []bench.Task {
	out := make([]bench.Task, 0, len(s.order))
	for _, id := range s.order {
		out = append(out, bench.Task{ID: id, Content: []string{s.questions[id].content}})
	}
	return out
}

// Variants is the one variant, "".
func (s *Suite) Variants() []string { return []string{Variant} }

// scoring is the scoring of a kind's scores ("": the suite's default).
func (s *Suite) scoring(kind string) Scoring {
	sc := Scoring{Family: Name, Kind: kind}
	if kind != KindOEQ {
		sc.MCQGraders = heureka.MCQGraders()
	}
	if kind != KindMCQ {
		judge := s.cfg.Judge
		sc.OEQScorers, sc.Judge, sc.Prompt = heureka.OEQScorers(), &judge, PromptVersion
	}
	return sc
}

// Scorer names the scoring in one line.
func (s *Suite) Scorer() string {
	g, o := heureka.MCQGraders(), heureka.OEQScorers()
	return fmt.Sprintf("heureka mcq %s, %s; oeq %s, %s judged by %s (%s)", g[0], g[1], o[0], o[1], s.cfg.Judge.Model, PromptVersion)
}

// ValueGrader names the grader whose score a job's value is
// (bench.ValueGrader): an MCQ job's is exact under the trimmed grader (the
// last of MCQGraders), an OEQ job's the first OEQ scorer's; "" for a
// scoring of no one kind.
func (s *Suite) ValueGrader(scoring json.RawMessage) string {
	var sc Scoring
	if json.Unmarshal(scoring, &sc) != nil {
		return ""
	}
	switch sc.Kind {
	case KindMCQ:
		g := heureka.MCQGraders()
		return string(g[len(g)-1])
	case KindOEQ:
		return string(heureka.OEQScorers()[0])
	}
	return ""
}

// Scoring is the scoring as entries carry it.
func (s *Suite) Scoring() json.RawMessage {
	b, _ := json.Marshal(s.scoring(""))
	return b
}

// Pipeline is the one stage: the agent answers.
func (s *Suite) Pipeline(bench.Task, string) []bench.Stage { return []bench.Stage{{Name: Stage}} }

func (s *Suite) question(id, variant, stage string) (*question, error) {
	q, ok := s.questions[id]
	if !ok {
		return nil, fmt.Errorf("suite %s has no question %q", s.name, id)
	}
	if variant != Variant {
		return nil, fmt.Errorf("question %s: no variant %q (the one variant is %q)", id, variant, Variant)
	}
	if stage != Stage {
		return nil, fmt.Errorf("question %s: no stage %q (have %q)", id, stage, Stage)
	}
	return q, nil
}

// QuestionText is what the agent reads (question.txt): the question, its
// options for a multiple-choice one, the datasets with their
// descriptions, and how to answer. Never a gold answer or the insight's
// finding.
func QuestionText(q *heureka.MCQ, o *heureka.OEQ) string {
	var b strings.Builder
	var in *heureka.Insight
	if q != nil {
		in = q.Insight
		b.WriteString(strings.TrimSpace(q.Text) + "\n\n")
		for _, opt := range q.Options {
			fmt.Fprintf(&b, "%s) %s\n", opt.Letter, opt.Text)
		}
	} else {
		in = o.Insight
		b.WriteString(strings.TrimSpace(o.Text) + "\n")
	}
	files, _ := dataFiles(in) // checked by Open
	b.WriteString("\nThe datasets, in " + Workspace + ":\n")
	for _, f := range files {
		fmt.Fprintf(&b, "- %s: %s\n", f.Path, f.Description)
	}
	if q != nil {
		b.WriteString("\nAnalyse the datasets. One or more options are correct. End your final message with the letters of every correct option, " +
			"separated by commas, inside <solution></solution>, e.g. <solution>A,C</solution>.\n")
	} else {
		b.WriteString("\nAnalyse the datasets and answer with the evidence you find in them (numbers, statistics, cell types). " +
			"End your final message with your answer inside <solution></solution>.\n")
	}
	b.WriteString("Write your final message to " + Workspace + "/" + AnswerFile + ".\n")
	return b.String()
}

// Recipe is the answer stage's job: the paper's datasets extracted into
// data/, question.txt written, the agent image's entrypoint run in
// /workspace with QUESTION_FILE, ANSWER_FILE and DATA_DIR set; answer.txt
// returned.
func (s *Suite) Recipe(in bench.RecipeInput) (*proto.Recipe, error) {
	q, err := s.question(in.Task.ID, in.Variant, in.Stage)
	if err != nil {
		return nil, err
	}
	c, ok := in.Content[q.content]
	if !ok || !c.Defined() {
		return nil, fmt.Errorf("question %s: content %q not imported", q.id, q.content)
	}
	ws := func(name string) string { return Workspace + "/" + name }
	return &proto.Recipe{
		ImageCid: in.Image.Bytes(),
		Inputs:   []*proto.Input{{Cid: c.Bytes(), Path: DataDir, Extract: true}},
		Edits: []*proto.Edit{{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: QuestionFile,
			Content: []byte(QuestionText(q.mcq, q.oeq))}}}},
		Env: append([]string{"QUESTION_FILE=" + ws(QuestionFile), "PROMPT_FILE=" + ws(QuestionFile), "ANSWER_FILE=" + ws(AnswerFile),
			"DATA_DIR=" + ws(DataDir)}, in.Env...),
		Cwd:     Workspace,
		Mounts:  []*proto.Mount{{Target: Workspace}},
		Limits:  in.Limits,
		Gpus:    in.Task.GPUs,
		Outputs: []*proto.Output{{Path: AnswerFile, MaxBytes: MaxAnswerBytes}},
	}, nil
}

// kinds in board order.
var kinds = []string{KindMCQ, KindOEQ}

func kindIndex(k string) int { return slices.Index(kinds, k) }
