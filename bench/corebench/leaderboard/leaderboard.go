// Package leaderboard owns how CORE-Bench attempts become leaderboards:
// one board per suite, level and scoring (grader and strip rule, each with
// its version), one row per agent and model, with accuracy over the runs
// (mean and min-max), written and vision accuracy, cost, runtime, runs,
// the share of attempts that passed cross-checking, and infrastructure
// failures counted apart.
//
// It is pure: plain Entries in, Boards out. It holds no gold answer (an
// Entry carries only CORE-Bench's counts), does no I/O, and must not
// depend on the coordinator, the network or storage. The coordinator turns
// its attempts into Entries; the HTTP API serves Boards; the CLI prints
// them; package hal exports them in HAL's upload format.
package leaderboard

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench"
)

// Status is where a unit stands for the leaderboard (bench.Status).
type Status = bench.Status

// Statuses. Only Validated attempts are scored.
const (
	Validated    = bench.Validated
	Unvalidated  = bench.Unvalidated
	Inconsistent = bench.Inconsistent
	InfraFailed  = bench.InfraFailed
	Pending      = bench.Pending
)

// Score is the grading of one attempt with CORE-Bench's own field names.
// It holds no gold answer.
type Score struct {
	CorrectWrittenAnswers int  `json:"correct_written_answers"`
	CorrectVisionAnswers  int  `json:"correct_vision_answers"`
	TotalWrittenQuestions int  `json:"total_written_questions"`
	TotalVisionQuestions  int  `json:"total_vision_questions"`
	TaskCorrect           bool `json:"task_correct"`
}

// ScoreOf takes the counts of a verdict.
func ScoreOf(v corebench.Verdict) Score {
	return Score{
		CorrectWrittenAnswers: v.CorrectWrittenAnswers, CorrectVisionAnswers: v.CorrectVisionAnswers,
		TotalWrittenQuestions: v.TotalWrittenQuestions, TotalVisionQuestions: v.TotalVisionQuestions,
		TaskCorrect: v.TaskCorrect,
	}
}

// WrittenCorrect: the task has written questions and all are correct.
func (s Score) WrittenCorrect() bool {
	return s.TotalWrittenQuestions > 0 && s.CorrectWrittenAnswers == s.TotalWrittenQuestions
}

// VisionCorrect: the task has vision questions and all are correct.
func (s Score) VisionCorrect() bool {
	return s.TotalVisionQuestions > 0 && s.CorrectVisionAnswers == s.TotalVisionQuestions
}

// TokenUsage is an agent's self-reported model usage, as HAL records it.
type TokenUsage struct {
	PromptTokens             int64 `json:"prompt_tokens"`
	CompletionTokens         int64 `json:"completion_tokens"`
	CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
}

// Entry is one attempt (agent, task, level, run) as a leaderboard sees it.
type Entry struct {
	Suite   string            `json:"suite"`
	Level   string            `json:"level"`
	Scoring corebench.Scoring `json:"scoring"`
	Agent   string            `json:"agent"`
	// Model is the agent's primary model, when the submitter declared it.
	Model  string `json:"model,omitempty"`
	TaskID string `json:"task_id"`
	// Run numbers the independent runs of an evaluation, from 1.
	Run    int    `json:"run"`
	Status Status `json:"status"`
	// Score is set once the attempt is graded (Validated, Unvalidated and
	// the canonical grading of an Inconsistent attempt).
	Score *Score `json:"score,omitempty"`
	// CostUSD is the agent's model cost, when known (HAL's total_cost is
	// self-reported from token counts the same way).
	CostUSD *float64 `json:"cost_usd,omitempty"`
	// Usage per model, when the agent reported it.
	Usage       map[string]TokenUsage `json:"usage,omitempty"`
	CPUSeconds  float64               `json:"cpu_seconds,omitempty"`
	WallSeconds float64               `json:"wall_seconds,omitempty"`
	Started     time.Time             `json:"started,omitzero"`
	Finished    time.Time             `json:"finished,omitzero"`
	// Verification is bench.Entry.Verification: "verified" when a replay
	// verified a model-driven run ("": not model-driven).
	Verification string `json:"verification,omitempty"`
	// Eval is bench.Entry.Eval: the evaluation the run belongs to (run 1
	// of two evaluations are two runs).
	Eval string `json:"eval,omitempty"`
}

// Validate checks what Build relies on, naming the entry.
func (e Entry) Validate() error {
	name := fmt.Sprintf("entry %s/%s/%s/%s run %d", e.Suite, e.Level, e.Agent, e.TaskID, e.Run)
	switch {
	case e.Suite == "" || e.Level == "" || e.Agent == "" || e.TaskID == "":
		return fmt.Errorf("%s: suite, level, agent and task_id are required", name)
	case e.Scoring.Grader == "" || e.Scoring.GraderVersion == "" || e.Scoring.StripRule == "" || e.Scoring.StripRuleVersion == "":
		return fmt.Errorf("%s: field scoring: grader, strip rule and both versions are required", name)
	case e.Run < 1:
		return fmt.Errorf("%s: field run: %d, want 1 or more", name, e.Run)
	case !e.Status.Valid():
		return fmt.Errorf("%s: field status: unknown %q", name, e.Status)
	case (e.Status == Validated || e.Status == Unvalidated) && e.Score == nil:
		return fmt.Errorf("%s: field score: missing for a %s attempt", name, e.Status)
	}
	return nil
}

// Row is one agent (and model) on one board.
type Row struct {
	Agent string `json:"agent"`
	Model string `json:"model,omitempty"`
	// Tasks and Correct count validated attempts over all runs.
	Tasks   int `json:"tasks"`
	Correct int `json:"correct"`
	// Accuracy is the mean over runs of each run's accuracy (correct
	// validated tasks / validated tasks of the run); AccuracyMin and
	// AccuracyMax range over runs.
	Accuracy    float64 `json:"accuracy"`
	AccuracyMin float64 `json:"accuracy_min"`
	AccuracyMax float64 `json:"accuracy_max"`
	// WrittenAccuracy and VisionAccuracy are HAL's: per run, over the tasks
	// that have such questions, the share with all of them correct; then
	// the mean over runs that have such tasks. Nil when no task has any.
	WrittenAccuracy *float64 `json:"written_accuracy"`
	VisionAccuracy  *float64 `json:"vision_accuracy"`
	// CostUSD is the mean over runs of a run's total cost over its
	// validated attempts; nil unless every one of them has a cost.
	CostUSD *float64 `json:"cost_usd"`
	// WallSeconds and CPUSeconds are means over runs of a run's total over
	// its validated attempts.
	WallSeconds float64 `json:"wall_seconds"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	// Runs counts the runs with at least one validated attempt.
	Runs int `json:"runs"`
	// Attempts by status. ValidatedShare = Validated / (Validated +
	// Unvalidated + Inconsistent): the share of graded attempts that
	// passed cross-checking.
	Validated      int     `json:"validated"`
	Unvalidated    int     `json:"unvalidated"`
	Inconsistent   int     `json:"inconsistent"`
	ValidatedShare float64 `json:"validated_share"`
	InfraFailures  int     `json:"infra_failures"`
	Pending        int     `json:"pending"`
	// Sampled counts the validated attempts of model-driven runs (each run
	// one sample, issue 13), ReplayVerified those a replay verified; the
	// others are shown as unverified.
	Sampled        int `json:"sampled,omitempty"`
	ReplayVerified int `json:"replay_verified,omitempty"`
	// Reliability holds the reliability measures of the validated
	// attempts (bench.MeasureReliability; a run passes when the task is
	// correct, PassRule): pass@k, pass^k, consistency, cost and wall-time
	// spreads, and which runs of each task passed.
	Reliability *bench.Reliability `json:"reliability,omitempty"`
}

// PassRule is what a passed run is for the reliability measures: the
// task correct (every question right), as HAL's accuracy counts it.
const PassRule = "task_correct"

// Board is one leaderboard: a suite, a level and one scoring. Rows are
// sorted by accuracy (best first), then agent and model.
type Board struct {
	// Family is "corebench": boards of several families travel together.
	Family  string            `json:"family"`
	Suite   string            `json:"suite"`
	Level   string            `json:"level"`
	Scoring corebench.Scoring `json:"scoring"`
	Rows    []Row             `json:"rows"`
}

type boardKey struct {
	suite, level string
	scoring      corebench.Scoring
}

type rowKey struct {
	board        boardKey
	agent, model string
}

type runAcc struct {
	tasks, correct   int
	wN, wOK, vN, vOK int
	cost             float64
	costKnown        bool
	wall, cpu        float64
}

// Build computes the boards from entries. Entries that fail Validate are
// skipped and returned as errors (they never reach a number). Boards are
// sorted by suite, level (easy, medium, hard, then others), and scoring.
// Entries of different scorings are never mixed: each scoring has its own
// board.
func Build(entries []Entry) ([]Board, []error) {
	var errs []error
	rows := map[rowKey]*Row{}
	runs := map[rowKey]map[runKey]*runAcc{}
	outcomes := map[rowKey][]bench.RunOutcome{}
	for _, e := range entries {
		if err := e.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		k := rowKey{boardKey{e.Suite, e.Level, e.Scoring}, e.Agent, e.Model}
		r := rows[k]
		if r == nil {
			r = &Row{Agent: e.Agent, Model: e.Model}
			rows[k] = r
			runs[k] = map[runKey]*runAcc{}
		}
		switch e.Status {
		case Validated:
			r.Validated++
		case Unvalidated:
			r.Unvalidated++
		case Inconsistent:
			r.Inconsistent++
		case InfraFailed:
			r.InfraFailures++
		case Pending:
			r.Pending++
		}
		if e.Status != Validated {
			continue
		}
		if e.Verification != "" {
			r.Sampled++
			if e.Verification == "verified" {
				r.ReplayVerified++
			}
		}
		ra := runs[k][runKey{e.Eval, e.Run}]
		if ra == nil {
			ra = &runAcc{costKnown: true}
			runs[k][runKey{e.Eval, e.Run}] = ra
		}
		s := *e.Score
		outcomes[k] = append(outcomes[k], bench.RunOutcome{Task: e.TaskID, Eval: e.Eval, Run: e.Run, Pass: s.TaskCorrect, CostUSD: e.CostUSD,
			WallSeconds: e.WallSeconds})
		ra.tasks++
		r.Tasks++
		if s.TaskCorrect {
			ra.correct++
			r.Correct++
		}
		if s.TotalWrittenQuestions > 0 {
			ra.wN++
			if s.WrittenCorrect() {
				ra.wOK++
			}
		}
		if s.TotalVisionQuestions > 0 {
			ra.vN++
			if s.VisionCorrect() {
				ra.vOK++
			}
		}
		if e.CostUSD != nil {
			ra.cost += *e.CostUSD
		} else {
			ra.costKnown = false
		}
		ra.wall += e.WallSeconds
		ra.cpu += e.CPUSeconds
	}
	boards := map[boardKey]*Board{}
	for k, r := range rows {
		finishRow(r, runs[k])
		r.Reliability = bench.MeasureReliability(PassRule, outcomes[k])
		b := boards[k.board]
		if b == nil {
			b = &Board{Family: "corebench", Suite: k.board.suite, Level: k.board.level, Scoring: k.board.scoring}
			boards[k.board] = b
		}
		b.Rows = append(b.Rows, *r)
	}
	out := make([]Board, 0, len(boards))
	for _, b := range boards {
		slices.SortFunc(b.Rows, func(x, y Row) int {
			if c := cmp.Compare(y.Accuracy, x.Accuracy); c != 0 {
				return c
			}
			if c := cmp.Compare(x.Agent, y.Agent); c != 0 {
				return c
			}
			return cmp.Compare(x.Model, y.Model)
		})
		out = append(out, *b)
	}
	slices.SortFunc(out, func(x, y Board) int {
		if c := cmp.Compare(x.Suite, y.Suite); c != 0 {
			return c
		}
		if c := cmp.Compare(levelRank(x.Level), levelRank(y.Level)); c != 0 {
			return c
		}
		if c := cmp.Compare(x.Level, y.Level); c != 0 {
			return c
		}
		return cmp.Compare(x.Scoring.String(), y.Scoring.String())
	})
	return out, errs
}

// runKey names a run: its evaluation and its number there (every
// evaluation numbers its runs from 1: run 1 of two evaluations are two
// runs).
type runKey struct {
	eval string
	run  int
}

func finishRow(r *Row, byRun map[runKey]*runAcc) {
	if graded := r.Validated + r.Unvalidated + r.Inconsistent; graded > 0 {
		r.ValidatedShare = float64(r.Validated) / float64(graded)
	}
	keys := make([]runKey, 0, len(byRun))
	for run := range byRun {
		keys = append(keys, run)
	}
	// A fixed order keeps the float sums reproducible.
	slices.SortFunc(keys, func(a, b runKey) int { return cmp.Or(cmp.Compare(a.eval, b.eval), cmp.Compare(a.run, b.run)) })
	var acc, wAcc, vAcc, cost []float64
	costKnown := true
	for _, run := range keys {
		ra := byRun[run]
		acc = append(acc, float64(ra.correct)/float64(ra.tasks))
		if ra.wN > 0 {
			wAcc = append(wAcc, float64(ra.wOK)/float64(ra.wN))
		}
		if ra.vN > 0 {
			vAcc = append(vAcc, float64(ra.vOK)/float64(ra.vN))
		}
		costKnown = costKnown && ra.costKnown
		cost = append(cost, ra.cost)
		r.WallSeconds += ra.wall
		r.CPUSeconds += ra.cpu
	}
	r.Runs = len(keys)
	if r.Runs == 0 {
		return
	}
	r.WallSeconds /= float64(r.Runs)
	r.CPUSeconds /= float64(r.Runs)
	r.Accuracy = mean(acc)
	r.AccuracyMin, r.AccuracyMax = slices.Min(acc), slices.Max(acc)
	if len(wAcc) > 0 {
		x := mean(wAcc)
		r.WrittenAccuracy = &x
	}
	if len(vAcc) > 0 {
		x := mean(vAcc)
		r.VisionAccuracy = &x
	}
	if costKnown {
		x := mean(cost)
		r.CostUSD = &x
	}
}

func mean(xs []float64) float64 {
	s := 0.0
	for _, x := range xs {
		s += x
	}
	return s / float64(len(xs))
}

func levelRank(l string) int {
	switch corebench.Level(l) {
	case corebench.Easy:
		return 0
	case corebench.Medium:
		return 1
	case corebench.Hard:
		return 2
	}
	return 3
}

// FlatRow is one line of the flat leaderboard: one agent on one suite,
// level and scoring. The numbers are the board row's: only
// validated units are scored, Pending counts the units not yet validated
// (pending or unvalidated), InfraFailures the units lost to
// infrastructure; inconsistent units are counted apart.
type FlatRow struct {
	Suite            string  `json:"suite"`
	Level            string  `json:"level"`
	Grader           string  `json:"grader"`
	GraderVersion    string  `json:"grader_version"`
	StripRule        string  `json:"strip_rule"`
	StripRuleVersion string  `json:"strip_rule_version"`
	Agent            string  `json:"agent"`
	Model            string  `json:"model,omitempty"`
	Tasks            int     `json:"tasks"`
	Correct          int     `json:"correct"`
	Accuracy         float64 `json:"accuracy"`
	// AccuracyMin and AccuracyMax range over runs.
	AccuracyMin     float64  `json:"accuracy_min"`
	AccuracyMax     float64  `json:"accuracy_max"`
	WrittenAccuracy *float64 `json:"written_accuracy"`
	VisionAccuracy  *float64 `json:"vision_accuracy"`
	Runs            int      `json:"runs"`
	Validated       int      `json:"validated"`
	Inconsistent    int      `json:"inconsistent"`
	ValidatedShare  float64  `json:"validated_share"`
	InfraFailures   int      `json:"infra_failures"`
	Pending         int      `json:"pending"`
	// CPUSeconds and WallSeconds are means over runs of a run's total.
	CPUSeconds  float64 `json:"cpu_seconds"`
	WallSeconds float64 `json:"wall_seconds"`
	// CostUSD is Row.CostUSD: the mean model cost of a run, when known.
	CostUSD *float64 `json:"cost_usd"`
}

// Flatten flattens boards, in their order.
func Flatten(boards []Board) []FlatRow {
	var out []FlatRow
	for _, b := range boards {
		for _, r := range b.Rows {
			out = append(out, FlatRow{Suite: b.Suite, Level: b.Level, Grader: b.Scoring.Grader, GraderVersion: b.Scoring.GraderVersion,
				StripRule: b.Scoring.StripRule, StripRuleVersion: b.Scoring.StripRuleVersion, Agent: r.Agent, Model: r.Model,
				Tasks: r.Tasks, Correct: r.Correct, Accuracy: r.Accuracy, AccuracyMin: r.AccuracyMin, AccuracyMax: r.AccuracyMax,
				WrittenAccuracy: r.WrittenAccuracy, VisionAccuracy: r.VisionAccuracy, Runs: r.Runs, Validated: r.Validated,
				Inconsistent: r.Inconsistent, ValidatedShare: r.ValidatedShare, InfraFailures: r.InfraFailures,
				Pending: r.Pending + r.Unvalidated, CPUSeconds: r.CPUSeconds, WallSeconds: r.WallSeconds, CostUSD: r.CostUSD})
		}
	}
	return out
}
