package dashboard

import (
	"cmp"
	"maps"
	"math"
	"slices"
	"strings"
)

// Entry is one run of an agent on a task at a variant, as a leaderboard
// sees it (a bench.Entry with its score's value): no gold answer.
type Entry struct {
	Suite   string `json:"suite"`
	Variant string `json:"level"`
	// Scoring names what the score depends on besides the agent (grader
	// and strip rule with versions): boards never mix two.
	Scoring string `json:"scoring"`
	Agent   string `json:"agent"`
	Model   string `json:"model,omitempty"`
	Task    string `json:"task"`
	Run     int    `json:"run"`
	// Status is validated, unvalidated, inconsistent, infra_failed or
	// pending.
	Status string `json:"status"`
	// Value is the score in [0, 1], when scored.
	Value        *float64 `json:"value,omitempty"`
	CostUSD      *float64 `json:"cost_usd,omitempty"`
	InputTokens  int64    `json:"input_tokens,omitempty"`
	OutputTokens int64    `json:"output_tokens,omitempty"`
	CPUSeconds   float64  `json:"cpu_seconds,omitempty"`
	WallSeconds  float64  `json:"wall_seconds,omitempty"`
	// Grader names the grader (with its version) whose score Value is,
	// for a family that grades each job several ways ("": its one way).
	Grader string `json:"grader,omitempty"`
	// Verification is where replay verification of the run's counted job
	// stands ("": not model-driven; see docs/verification.md).
	Verification string `json:"verification,omitempty"`
	// Eval is the evaluation the run belongs to (two evaluations of an
	// agent both number their runs from 1); an evaluation's view keeps its
	// own entries only.
	Eval string `json:"eval,omitempty"`
	// Written and Vision say whether all of the task's written (vision)
	// questions were answered right, for a family whose score counts them
	// (CORE-Bench's, as HAL does); nil when the task has none or the
	// family does not count them.
	Written *bool `json:"written,omitempty"`
	Vision  *bool `json:"vision,omitempty"`
}

// Board is one leaderboard: a suite, a variant, one scoring and one
// grader.
type Board struct {
	Suite   string `json:"suite"`
	Variant string `json:"level"`
	Scoring string `json:"scoring"`
	// Grader names the grader whose scores the board's numbers are, when
	// its family grades each job several ways.
	Grader string `json:"grader,omitempty"`
	// CostAxis is what the board's cost-accuracy frontier (Row.Pareto)
	// and chart weigh accuracy against: CostModel when every row with runs
	// has a metered model cost, else CostCompute (CPU time per run), so
	// that every agent is on the chart.
	CostAxis string `json:"cost_axis"`
	// Rows are sorted by accuracy, best first, then agent and model.
	Rows []Row `json:"rows"`
}

// Cost axes of a board.
const (
	// CostModel: model cost per run, in US dollars.
	CostModel = "model_usd"
	// CostCompute: CPU time per run, in seconds.
	CostCompute = "cpu_seconds"
)

// Row is one agent (and model) on a board. Only validated runs count
// toward accuracy, cost, tokens and time; a run is one of the agent's
// independent runs over the suite's tasks.
type Row struct {
	Agent string `json:"agent"`
	Model string `json:"model,omitempty"`
	// Runs counts the runs with a validated unit.
	Runs int `json:"runs"`
	// Accuracy is the mean over runs of a run's mean score over its
	// validated units; AccuracyMin and AccuracyMax range over the runs.
	// A row without runs has none (0 here, shown as none: HasAccuracy).
	Accuracy    float64 `json:"accuracy"`
	AccuracyMin float64 `json:"accuracy_min"`
	AccuracyMax float64 `json:"accuracy_max"`
	// WrittenAccuracy and VisionAccuracy are HAL's (for a family whose
	// scores count written and vision questions): per run, over its
	// validated tasks with such questions, the share with all of them
	// right; then the mean over the runs that have such tasks. Nil when
	// no task has any.
	WrittenAccuracy *float64 `json:"written_accuracy,omitempty"`
	VisionAccuracy  *float64 `json:"vision_accuracy,omitempty"`
	// CostUSD is the mean over runs of a run's model cost; nil unless
	// every validated unit was metered.
	CostUSD *float64 `json:"cost_usd"`
	// Tokens (input and output), WallSeconds and CPUSeconds are means
	// over runs of a run's totals.
	Tokens      float64 `json:"tokens"`
	WallSeconds float64 `json:"wall_seconds"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	// Units by status (Pending: not finished; Unvalidated: scored, the
	// cross-check still waits for replicas); CrossCheckedShare =
	// validated / (validated + unvalidated + inconsistent), the share of
	// graded units that passed cross-checking on independent nodes.
	Validated         int     `json:"validated"`
	Unvalidated       int     `json:"unvalidated"`
	Inconsistent      int     `json:"inconsistent"`
	InfraFailed       int     `json:"infra_failed"`
	Pending           int     `json:"pending"`
	CrossCheckedShare float64 `json:"cross_checked_share"`
	// Sampled counts the validated units of model-driven runs (whose
	// verification is by replay, docs/verification.md), ReplayVerified
	// those a replay verified: the others are unverified.
	Sampled        int `json:"sampled"`
	ReplayVerified int `json:"replay_verified"`
	// Pareto: no other row of the board is as cheap (on the board's
	// CostAxis) and as accurate with one of the two strictly better (rows
	// with runs only).
	Pareto bool `json:"pareto"`
}

// HasAccuracy reports whether the row has an accuracy: a validated run.
func (r Row) HasAccuracy() bool { return r.Runs > 0 }

// Graded counts the units graded (validated, unvalidated or
// inconsistent): the denominator of CrossCheckedShare.
func (r Row) Graded() int { return r.Validated + r.Unvalidated + r.Inconsistent }

// Cost is the row's cost on axis (nil: unknown).
func (r Row) Cost(axis string) *float64 {
	if axis == CostCompute {
		c := r.CPUSeconds
		return &c
	}
	return r.CostUSD
}

// RunKey names a run: its evaluation and its number there (every
// evaluation numbers its runs from 1, so run 1 of two evaluations of an
// agent are two runs, never one).
type RunKey struct {
	Eval string
	Run  int
}

// Compare orders runs by evaluation, then number.
func (k RunKey) Compare(o RunKey) int {
	return cmp.Or(strings.Compare(k.Eval, o.Eval), cmp.Compare(k.Run, o.Run))
}

// BuildBoards makes the boards of entries: one per suite, variant,
// scoring and grader, in the order the entries first name them; one row per agent
// and model.
func BuildBoards(entries []Entry) []Board {
	type boardKey struct{ suite, variant, scoring, grader string }
	type rowKey struct{ agent, model string }
	type run struct {
		units, sumTokens int64
		sum, cost        float64
		costKnown        bool
		wall, cpu        float64
		wN, wOK, vN, vOK int
	}
	var order []boardKey
	rows := map[boardKey]map[rowKey]*Row{}
	runs := map[boardKey]map[rowKey]map[RunKey]*run{}
	for _, e := range entries {
		bk := boardKey{e.Suite, e.Variant, e.Scoring, e.Grader}
		if rows[bk] == nil {
			order = append(order, bk)
			rows[bk], runs[bk] = map[rowKey]*Row{}, map[rowKey]map[RunKey]*run{}
		}
		rk := rowKey{e.Agent, e.Model}
		r := rows[bk][rk]
		if r == nil {
			r = &Row{Agent: e.Agent, Model: e.Model}
			rows[bk][rk], runs[bk][rk] = r, map[RunKey]*run{}
		}
		switch e.Status {
		case "validated":
			r.Validated++
		case "unvalidated":
			r.Unvalidated++
		case "inconsistent":
			r.Inconsistent++
		case "infra_failed":
			r.InfraFailed++
		default:
			r.Pending++
		}
		if e.Status == "validated" && e.Verification != "" {
			r.Sampled++
			if e.Verification == VerifyVerified {
				r.ReplayVerified++
			}
		}
		if e.Status != "validated" || e.Value == nil {
			continue
		}
		ru := runs[bk][rk][RunKey{e.Eval, e.Run}]
		if ru == nil {
			ru = &run{costKnown: true}
			runs[bk][rk][RunKey{e.Eval, e.Run}] = ru
		}
		ru.units++
		ru.sum += *e.Value
		ru.wall += e.WallSeconds
		ru.cpu += e.CPUSeconds
		ru.sumTokens += e.InputTokens + e.OutputTokens
		if e.Written != nil {
			ru.wN++
			if *e.Written {
				ru.wOK++
			}
		}
		if e.Vision != nil {
			ru.vN++
			if *e.Vision {
				ru.vOK++
			}
		}
		if e.CostUSD == nil {
			ru.costKnown = false
		} else {
			ru.cost += *e.CostUSD
		}
	}
	out := make([]Board, 0, len(order))
	for _, bk := range order {
		b := Board{Suite: bk.suite, Variant: bk.variant, Scoring: bk.scoring, Grader: bk.grader}
		for rk, r := range rows[bk] {
			nums := slices.SortedFunc(maps.Keys(runs[bk][rk]), RunKey.Compare)
			costKnown := len(nums) > 0
			var cost float64
			var written, vision []float64
			r.AccuracyMin = math.Inf(1)
			for _, n := range nums {
				ru := runs[bk][rk][n]
				if ru.wN > 0 {
					written = append(written, float64(ru.wOK)/float64(ru.wN))
				}
				if ru.vN > 0 {
					vision = append(vision, float64(ru.vOK)/float64(ru.vN))
				}
				acc := ru.sum / float64(ru.units)
				r.Accuracy += acc
				r.AccuracyMin, r.AccuracyMax = min(r.AccuracyMin, acc), max(r.AccuracyMax, acc)
				r.Tokens += float64(ru.sumTokens)
				r.WallSeconds += ru.wall
				r.CPUSeconds += ru.cpu
				cost += ru.cost
				costKnown = costKnown && ru.costKnown
			}
			if r.Runs = len(nums); r.Runs > 0 {
				k := float64(r.Runs)
				r.Accuracy, r.Tokens, r.WallSeconds, r.CPUSeconds = r.Accuracy/k, r.Tokens/k, r.WallSeconds/k, r.CPUSeconds/k
				if costKnown {
					c := cost / k
					r.CostUSD = &c
				}
			} else {
				r.AccuracyMin = 0
			}
			r.WrittenAccuracy, r.VisionAccuracy = meanOf(written), meanOf(vision)
			if graded := r.Graded(); graded > 0 {
				r.CrossCheckedShare = float64(r.Validated) / float64(graded)
			}
			b.Rows = append(b.Rows, *r)
		}
		b.CostAxis = costAxis(b.Rows)
		markPareto(b.Rows, b.CostAxis)
		slices.SortFunc(b.Rows, func(x, y Row) int {
			if d := cmp.Compare(y.Accuracy, x.Accuracy); d != 0 {
				return d
			}
			if d := strings.Compare(x.Agent, y.Agent); d != 0 {
				return d
			}
			return strings.Compare(x.Model, y.Model)
		})
		out = append(out, b)
	}
	return out
}

// meanOf is the mean of xs (nil for none).
func meanOf(xs []float64) *float64 {
	if len(xs) == 0 {
		return nil
	}
	s := 0.0
	for _, x := range xs {
		s += x
	}
	m := s / float64(len(xs))
	return &m
}

// costAxis is the cost a board's rows are weighed on: model cost when
// every row with runs has one, else CPU time (every agent has one).
func costAxis(rows []Row) string {
	for _, r := range rows {
		if r.Runs > 0 && r.CostUSD == nil {
			return CostCompute
		}
	}
	return CostModel
}

// markPareto marks the rows on the cost-accuracy frontier of axis: rows
// with runs and a cost that no other such row dominates (no more costly,
// no less accurate, and strictly better in one).
func markPareto(rows []Row, axis string) {
	for i := range rows {
		a := &rows[i]
		ac := a.Cost(axis)
		if a.Runs == 0 || ac == nil {
			continue
		}
		a.Pareto = true
		for j := range rows {
			b := rows[j]
			bc := b.Cost(axis)
			if j == i || b.Runs == 0 || bc == nil {
				continue
			}
			if *bc <= *ac && b.Accuracy >= a.Accuracy && (*bc < *ac || b.Accuracy > a.Accuracy) {
				a.Pareto = false
				break
			}
		}
	}
}

// TaskRow is one task of an agent at one variant: each run's result.
type TaskRow struct {
	Suite   string    `json:"suite"`
	Variant string    `json:"level"`
	Scoring string    `json:"scoring"`
	Task    string    `json:"task"`
	Runs    []RunCell `json:"runs"`
}

// RunCell is one run of a task: its status and score.
type RunCell struct {
	Run     int      `json:"run"`
	Status  string   `json:"status"`
	Value   *float64 `json:"value,omitempty"`
	CostUSD *float64 `json:"cost_usd,omitempty"`
}

// TaskResults lists agent's results per task, in the entries' order of
// suites, variants and tasks, runs ascending.
func TaskResults(entries []Entry, agent string) []TaskRow {
	type key struct{ suite, variant, scoring, task string }
	var order []key
	cells := map[key][]RunCell{}
	for _, e := range entries {
		if e.Agent != agent {
			continue
		}
		k := key{e.Suite, e.Variant, e.Scoring, e.Task}
		if _, ok := cells[k]; !ok {
			order = append(order, k)
		}
		cells[k] = append(cells[k], RunCell{Run: e.Run, Status: e.Status, Value: e.Value, CostUSD: e.CostUSD})
	}
	out := make([]TaskRow, 0, len(order))
	for _, k := range order {
		cs := cells[k]
		slices.SortStableFunc(cs, func(a, b RunCell) int { return a.Run - b.Run })
		out = append(out, TaskRow{Suite: k.suite, Variant: k.variant, Scoring: k.scoring, Task: k.task, Runs: cs})
	}
	return out
}

// OnlyAgent keeps the rows of agent on boards, dropping boards without
// one.
func OnlyAgent(boards []Board, agent string) []Board {
	var out []Board
	for _, b := range boards {
		var rows []Row
		for _, r := range b.Rows {
			if r.Agent == agent {
				rows = append(rows, r)
			}
		}
		if len(rows) > 0 {
			b.Rows = rows
			out = append(out, b)
		}
	}
	return out
}
