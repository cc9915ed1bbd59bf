package family

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/heureka"
	"github.com/repronet/repronet/bench/internal/judging"
)

// Board is one leaderboard of a suite: one question kind, one grader (MCQ)
// or scorer (OEQ), one scoring (the judge, its settings, the prompt's
// version). Boards of different graders or judges are never merged.
type Board struct {
	Family string `json:"family"`
	Suite  string `json:"suite"`
	Kind   string `json:"kind"`
	// Grader is the MCQ grader or the OEQ scorer; Origin says whose rule
	// it is (heureka.Origin): the published code's, or repronet's own.
	Grader  string          `json:"grader"`
	Origin  string          `json:"origin"`
	Scoring json.RawMessage `json:"scoring"`
	// Judge is the OEQ judge and its settings (OEQ boards only).
	Judge *heureka.JudgeSettings `json:"judge,omitempty"`
	Rows  []Row                  `json:"rows"`
}

// Row is one agent's line.
type Row struct {
	Agent string `json:"agent"`
	Model string `json:"model,omitempty"`
	// StatusCounts are the agent's runs of questions, by status; only
	// validated ones are scored.
	bench.StatusCounts
	MCQ   *MCQRow   `json:"mcq,omitempty"`
	OEQ   *OEQRow   `json:"oeq,omitempty"`
	Judge *JudgeUse `json:"judge,omitempty"`
	// AgentCostUSD is the agent's model cost of the validated units, when
	// metered.
	AgentCostUSD *float64 `json:"agent_cost_usd,omitempty"`
	// Reliability holds the reliability measures of the validated units
	// under the board's grader (PassRule says when a run passed).
	Reliability *bench.Reliability `json:"reliability,omitempty"`
}

// The pass rules of the reliability measures: an MCQ run passes when its
// letters are exactly the gold's under the board's grader, an OEQ run
// when the judge rated it at least OEQPassRating of 5.
const (
	MCQPassRule   = "exact"
	OEQPassRating = 4
	OEQPassRule   = "rating>=4"
)

// MCQRow is heureka.AggregateMCQ's metrics over the validated units.
type MCQRow struct {
	Questions      int     `json:"questions"`
	Answered       int     `json:"answered"`
	Correct        int     `json:"correct"`
	Accuracy       float64 `json:"accuracy"`
	MacroPrecision float64 `json:"macro_precision"`
	MacroRecall    float64 `json:"macro_recall"`
	MacroF1        float64 `json:"macro_f1"`
	MicroPrecision float64 `json:"micro_precision"`
	MicroRecall    float64 `json:"micro_recall"`
	MicroF1        float64 `json:"micro_f1"`
}

// OEQRow is heureka.SummariseOEQ's summary: the mean score, and how many
// scores were probability-weighted, plain or unanswered (Mode: weighted,
// plain or mixed).
type OEQRow struct {
	Questions  int     `json:"questions"`
	Mean       float64 `json:"mean"`
	Weighted   int     `json:"weighted"`
	Plain      int     `json:"plain"`
	Unanswered int     `json:"unanswered"`
	Mode       string  `json:"mode"`
}

// graders in board order for a kind.
func graders(kind string) []string {
	var out []string
	if kind == KindMCQ {
		for _, g := range heureka.MCQGraders() {
			out = append(out, string(g))
		}
	} else {
		for _, s := range heureka.OEQScorers() {
			out = append(out, string(s))
		}
	}
	return out
}

// Boards builds one Board per kind, scoring and grader (or scorer), rows
// by score then agent. An entry of a task the suite does not have, of an
// unknown status, or whose score does not parse or lacks a grader, is an
// error naming it. An entry without a scoring counts under the suite's.
func (s *Suite) Boards(entries []bench.Entry) ([]any, error) {
	type key struct{ kind, scoring, grader string }
	var keys []key
	rows := map[key]map[string]*acc{}
	for _, e := range entries {
		name := fmt.Sprintf("entry %s/%s/%s run %d", e.Suite, e.Agent, e.TaskID, e.Run)
		kind := s.Kind(e.TaskID)
		if kind == "" {
			return nil, fmt.Errorf("%s: no question %q in suite %s", name, e.TaskID, s.name)
		}
		// Nothing scored yet: the suite's default scoring (this suite's,
		// or the one of the config it had) narrowed to the kind's.
		scoring, err := e.BoardScoring(s.Scoring())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		var sc Scoring
		if err := json.Unmarshal([]byte(scoring), &sc); err != nil {
			return nil, fmt.Errorf("%s: scoring: %w", name, err)
		}
		if sc.Kind == "" {
			sc.Kind = kind
			if kind == KindMCQ {
				sc.OEQScorers, sc.Judge, sc.Prompt = nil, nil, ""
			} else {
				sc.MCQGraders = nil
			}
			b, _ := json.Marshal(sc)
			scoring = string(b)
		}
		var pub Public
		if e.Status == bench.Validated {
			if err := json.Unmarshal(e.Score, &pub); err != nil {
				return nil, fmt.Errorf("%s: score: %w", name, err)
			}
			if pub.Kind != kind {
				return nil, fmt.Errorf("%s: a score of a %q question, the task is %q", name, pub.Kind, kind)
			}
		}
		for _, g := range graders(kind) {
			k := key{kind, scoring, g}
			if rows[k] == nil {
				rows[k] = map[string]*acc{}
				keys = append(keys, k)
			}
			a := rows[k][e.Agent]
			if a == nil {
				a = &acc{row: &Row{Agent: e.Agent, Model: e.Model}}
				rows[k][e.Agent] = a
			}
			r := a.row
			if err := r.Count(e.Status); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if e.Status == bench.Validated {
				if err := a.add(pub, g); err != nil {
					return nil, fmt.Errorf("%s: %w", name, err)
				}
				a.runs = append(a.runs, e.Outcome(a.passed(pub)))
				if e.CostUSD != nil {
					c := *e.CostUSD
					if r.AgentCostUSD != nil {
						c += *r.AgentCostUSD
					}
					r.AgentCostUSD = &c
				}
				if pub.Judge != nil {
					if r.Judge == nil {
						r.Judge = &JudgeUse{}
					}
					r.Judge.Add(*pub.Judge)
				}
			}
		}
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(kindIndex(a.kind), kindIndex(b.kind)), cmp.Compare(a.scoring, b.scoring),
			cmp.Compare(slices.Index(graders(a.kind), a.grader), slices.Index(graders(b.kind), b.grader)))
	})
	out := make([]any, 0, len(keys))
	for _, k := range keys {
		b := Board{Family: Name, Suite: s.name, Kind: k.kind, Grader: k.grader, Origin: heureka.Origin(k.grader),
			Scoring: json.RawMessage(k.scoring), Rows: []Row{}}
		if k.kind == KindOEQ {
			var sc Scoring
			if err := json.Unmarshal([]byte(k.scoring), &sc); err != nil {
				return nil, fmt.Errorf("suite %s: scoring %s: %w", s.name, k.scoring, err)
			}
			b.Judge = sc.Judge
		}
		for _, a := range rows[k] {
			r := a.row
			switch k.kind {
			case KindMCQ:
				m := heureka.AggregateMCQ(a.mcq, heureka.MCQGrader(k.grader))
				r.MCQ = &MCQRow{Questions: m.Questions, Answered: m.Answered, Correct: m.Correct, Accuracy: m.Accuracy,
					MacroPrecision: m.MacroPrecision, MacroRecall: m.MacroRecall, MacroF1: m.MacroF1,
					MicroPrecision: m.MicroPrecision, MicroRecall: m.MicroRecall, MicroF1: m.MicroF1}
			case KindOEQ:
				sum, err := heureka.SummariseOEQ(a.oeq, heureka.OEQScorer(k.grader))
				if err != nil {
					return nil, fmt.Errorf("suite %s: %w", s.name, err)
				}
				r.OEQ = &OEQRow{Questions: sum.Questions, Mean: sum.Mean, Weighted: sum.Weighted, Plain: sum.Plain,
					Unanswered: sum.Unanswered, Mode: sum.Mode}
			}
			rule := MCQPassRule
			if k.kind == KindOEQ {
				rule = OEQPassRule
			}
			r.Reliability = bench.MeasureReliability(rule, a.runs)
			b.Rows = append(b.Rows, *r)
		}
		slices.SortFunc(b.Rows, func(x, y Row) int { return cmp.Or(cmp.Compare(y.score(), x.score()), cmp.Compare(x.Agent, y.Agent)) })
		out = append(out, b)
	}
	return out, nil
}

// maxPredicted bounds the letters a stored score says were predicted.
const maxPredicted = 1 << 10

// acc accumulates one agent's row of a board.
type acc struct {
	row  *Row
	mcq  []heureka.MCQOutcome
	oeq  []heureka.OEQScore
	runs []bench.RunOutcome
}

// passed says whether the unit add last counted passed (its pass rule).
func (a *acc) passed(pub Public) bool {
	if pub.Kind == KindMCQ {
		return a.mcq[len(a.mcq)-1].Exact
	}
	o := a.oeq[len(a.oeq)-1]
	return !o.Unanswered && o.Rating >= OEQPassRating
}

// add counts one validated unit's public score under grader g.
func (a *acc) add(pub Public, g string) error {
	switch pub.Kind {
	case KindMCQ:
		i := slices.IndexFunc(pub.MCQ, func(m MCQPublic) bool { return string(m.Grader) == g })
		if i < 0 {
			return fmt.Errorf("no score under %s", g)
		}
		m := pub.MCQ[i]
		if m.Predicted < 0 || m.Predicted > maxPredicted {
			return fmt.Errorf("%d letters predicted under %s", m.Predicted, g)
		}
		a.mcq = append(a.mcq, heureka.MCQOutcome{Answered: pub.Answered, Exact: m.Exact, TP: m.TP, FP: m.FP, FN: m.FN,
			Predicted: make([]string, m.Predicted), Precision: m.Precision, Recall: m.Recall, F1: m.F1})
	case KindOEQ:
		i := slices.IndexFunc(pub.OEQ, func(o OEQPublic) bool { return string(o.Scorer) == g })
		if i < 0 {
			return fmt.Errorf("no score under %s", g)
		}
		o := pub.OEQ[i]
		a.oeq = append(a.oeq, heureka.OEQScore{Scorer: o.Scorer, Score: o.Score, Rating: o.Rating, Weighted: o.Weighted,
			Unanswered: o.Unanswered})
	}
	return nil
}

func (r Row) score() float64 {
	switch {
	case r.MCQ != nil:
		return r.MCQ.Accuracy
	case r.OEQ != nil:
		return r.OEQ.Mean
	}
	return 0
}

// WriteText writes boards as text tables, one after another.
func WriteText(w io.Writer, boards []Board) error {
	for i, b := range boards {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "heureka %s, %s questions, %s\n", b.Suite, b.Kind, b.Grader)
		if b.Origin == "" {
			b.Origin = heureka.Origin(b.Grader)
		}
		fmt.Fprintf(w, "grader: %s\n", b.Origin)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		if b.Kind == KindMCQ {
			fmt.Fprintln(tw, "agent\tmodel\taccuracy\tmacro P/R/F1\tmicro P/R/F1\tanswered/questions\tvalidated/units\tagent cost")
			for _, r := range b.Rows {
				m := r.MCQ
				fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%.2f/%.2f/%.2f\t%.2f/%.2f/%.2f\t%d/%d\t%d/%d\t%s\n", r.Agent, orDash(r.Model), 100*m.Accuracy,
					m.MacroPrecision, m.MacroRecall, m.MacroF1, m.MicroPrecision, m.MicroRecall, m.MicroF1, m.Answered, m.Questions,
					r.Validated, r.Units, judging.Dollars(r.AgentCostUSD))
			}
		} else {
			j := b.Judge
			fmt.Fprintf(w, "judge %s (temperature %g, top_p %g, max %d tokens, top %d log-probabilities)\n", j.Model, j.Temperature, j.TopP,
				j.MaxTokens, j.TopLogprobs)
			fmt.Fprintln(tw, "agent\tmodel\tmean 1-5\tscores\tquestions\tvalidated/units\tjudge calls\tjudge tokens in/out\tjudge cost\tagent cost")
			for _, r := range b.Rows {
				o := r.OEQ
				var ju JudgeUse
				if r.Judge != nil {
					ju = *r.Judge
				}
				fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s (%d weighted, %d plain, %d unanswered)\t%d\t%d/%d\t%d\t%d/%d\t%s\t%s\n", r.Agent, orDash(r.Model),
					o.Mean, o.Mode, o.Weighted, o.Plain, o.Unanswered, o.Questions, r.Validated, r.Units, ju.Calls, ju.InputTokens,
					ju.OutputTokens, judging.Dollars(ju.CostUSD), judging.Dollars(r.AgentCostUSD))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, r := range b.Rows {
			if r.Reliability != nil && r.Reliability.Runs > 0 {
				fmt.Fprintf(w, "%s:\n%s\n", r.Agent, strings.Join(bench.ReliabilityText(r.Reliability, "  "), "\n"))
			}
		}
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
