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
	"github.com/repronet/repronet/bench/internal/judging"
	"github.com/repronet/repronet/bench/paperbench"
)

// Board is one leaderboard of a suite: one variant, one scoring (judges
// and versions), one grader. Boards of different graders, judges or
// versions are never merged.
type Board struct {
	Family  string            `json:"family"`
	Suite   string            `json:"suite"`
	Variant string            `json:"variant"`
	Grader  paperbench.Grader `json:"grader"`
	Scoring json.RawMessage   `json:"scoring"`
	// Judge and SecondJudge are the scoring's judges, for display.
	Judge       JudgeSettings `json:"judge"`
	SecondJudge JudgeSettings `json:"second_judge"`
	Rows        []Row         `json:"rows"`
	// Agreement pools the leaves judged twice on the board.
	Agreement Agreement `json:"agreement"`
}

// Row is one agent's line.
type Row struct {
	Agent string `json:"agent"`
	Model string `json:"model,omitempty"`
	// StatusCounts are the agent's runs of papers, by status; only
	// validated ones are scored.
	bench.StatusCounts
	// Score is the benchmark's: the mean over papers of each paper's mean
	// score over its validated runs. Papers holds those means by paper.
	Score  float64            `json:"score"`
	Papers map[string]float64 `json:"papers"`
	// Of the validated units: disqualified by the monitor, with a
	// submission, with reproduce.sh, whose reproduce.sh failed (full).
	Disqualified int `json:"disqualified"`
	Submitted    int `json:"submitted"`
	ReproduceSH  int `json:"reproduce_sh"`
	ReproFailed  int `json:"reproduce_failed,omitempty"`
	// Leaves graded, by a judge or without one, and those whose judging
	// failed (under this board's grader: kept out of the mean, or 0).
	Leaves       int `json:"leaves"`
	Judged       int `json:"judged"`
	Auto         int `json:"auto"`
	FailedLeaves int `json:"failed_leaves"`
	// AgentCostUSD is the agent's model cost (every stage) of the validated
	// units, when metered; Judge what their judging used.
	AgentCostUSD *float64  `json:"agent_cost_usd,omitempty"`
	Judge        JudgeUse  `json:"judge"`
	Agreement    Agreement `json:"agreement"`
	// Reliability holds the reliability measures of the validated units
	// under the board's grader (a run passes when its score is at least
	// PassThreshold: PassRule).
	Reliability *bench.Reliability `json:"reliability,omitempty"`
}

// PassThreshold is the score from which a run counts as passed for the
// reliability measures (a PaperBench score is a replication score in
// [0, 1], not a pass or fail), and PassRule names it.
const (
	PassThreshold = 0.5
	PassRule      = "score>=0.5"
)

// Agreement is an agreement table with paperbench.Agree's figures.
type Agreement struct {
	AgreementTable
	Pairs    int     `json:"pairs"`
	Agree    int     `json:"agree"`
	Observed float64 `json:"observed"`
	// Kappa is Cohen's kappa; nil when undefined (no pairs, or both
	// judges gave one score to every leaf).
	Kappa *float64 `json:"kappa"`
}

func agreementOf(t AgreementTable) Agreement {
	a := t.Agreement()
	out := Agreement{AgreementTable: t, Pairs: a.Pairs, Agree: a.Agree, Observed: a.Observed}
	if a.KappaDefined {
		k := a.Kappa
		out.Kappa = &k
	}
	return out
}

// Boards builds one Board per variant (in the suite's order), scoring and
// grader (report-failed first), rows sorted by score then agent. An entry
// of an unknown variant or status, a scoring that is not JSON, or a scored
// entry whose score does not parse or is not its variant's last stage's,
// is an error naming it. An entry without a scoring counts under the
// suite's.
func (s *Suite) Boards(entries []bench.Entry) ([]any, error) {
	type key struct {
		variant, scoring string
		grader           paperbench.Grader
	}
	type acc struct {
		row    *Row
		papers map[string][]float64
		agree  AgreementTable
		runs   []bench.RunOutcome
	}
	var keys []key
	rows := map[key]map[string]*acc{}
	for _, e := range entries {
		name := fmt.Sprintf("entry %s/%s/%s/%s run %d", e.Suite, e.Variant, e.Agent, e.TaskID, e.Run)
		if !slices.Contains(s.Variants(), e.Variant) {
			return nil, fmt.Errorf("%s: no variant %q in suite %s", name, e.Variant, s.name)
		}
		scoring, err := e.BoardScoring(s.Scoring())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		var pub Public
		scored := e.Status == bench.Validated
		if scored {
			if err := json.Unmarshal(e.Score, &pub); err != nil {
				return nil, fmt.Errorf("%s: score: %w", name, err)
			}
			last := s.Pipeline(bench.Task{ID: e.TaskID}, e.Variant)
			if want := last[len(last)-1].Name; pub.Stage != want {
				return nil, fmt.Errorf("%s: a score of stage %q, want the %s variant's last, %q", name, pub.Stage, e.Variant, want)
			}
		}
		for _, g := range paperbench.Graders() {
			k := key{e.Variant, scoring, g}
			if rows[k] == nil {
				rows[k] = map[string]*acc{}
				keys = append(keys, k)
			}
			a := rows[k][e.Agent]
			if a == nil {
				a = &acc{row: &Row{Agent: e.Agent, Model: e.Model, Papers: map[string]float64{}}, papers: map[string][]float64{}}
				rows[k][e.Agent] = a
			}
			r := a.row
			if err := r.Count(e.Status); err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			if e.Status == bench.Validated {
				gs := slices.IndexFunc(pub.Scores, func(x GraderScore) bool { return x.Grader == g })
				if gs < 0 {
					return nil, fmt.Errorf("%s: no score under %s", name, g)
				}
				a.papers[e.TaskID] = append(a.papers[e.TaskID], pub.Scores[gs].Score)
				a.runs = append(a.runs, e.Outcome(pub.Scores[gs].Score >= PassThreshold))
				r.FailedLeaves += pub.Scores[gs].Failed
				r.Leaves += pub.Leaves
				r.Judged += pub.Judged
				r.Auto += pub.Auto
				if pub.Disqualified {
					r.Disqualified++
				}
				if pub.Submitted {
					r.Submitted++
				}
				if pub.ReproduceSH {
					r.ReproduceSH++
				}
				if rp := pub.Reproduction; rp != nil && (rp.ExitCode == nil || *rp.ExitCode != 0) {
					r.ReproFailed++
				}
				if e.CostUSD != nil {
					c := *e.CostUSD
					if r.AgentCostUSD != nil {
						c += *r.AgentCostUSD
					}
					r.AgentCostUSD = &c
				}
				r.Judge.Add(pub.Judge)
				a.agree.Add(pub.Agreement)
			}
		}
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(slices.Index(s.Variants(), a.variant), slices.Index(s.Variants(), b.variant)),
			cmp.Compare(a.scoring, b.scoring), cmp.Compare(slices.Index(paperbench.Graders(), a.grader), slices.Index(paperbench.Graders(), b.grader)))
	})
	out := make([]any, 0, len(keys))
	for _, k := range keys {
		var sc Scoring
		if err := json.Unmarshal([]byte(k.scoring), &sc); err != nil {
			return nil, fmt.Errorf("suite %s: scoring %s: %w", s.name, k.scoring, err)
		}
		b := Board{Family: Name, Suite: s.name, Variant: k.variant, Grader: k.grader, Scoring: json.RawMessage(k.scoring),
			Judge: sc.Judge, SecondJudge: sc.SecondJudge, Rows: []Row{}}
		var pooled AgreementTable
		for _, a := range rows[k] {
			r := a.row
			total := 0.0
			for id, scores := range a.papers {
				sum := 0.0
				for _, x := range scores {
					sum += x
				}
				r.Papers[id] = sum / float64(len(scores))
				total += r.Papers[id]
			}
			if len(a.papers) > 0 {
				r.Score = total / float64(len(a.papers))
			}
			r.Agreement = agreementOf(a.agree)
			r.Reliability = bench.MeasureReliability(PassRule, a.runs)
			pooled.Add(a.agree)
			b.Rows = append(b.Rows, *r)
		}
		b.Agreement = agreementOf(pooled)
		slices.SortFunc(b.Rows, func(x, y Row) int { return cmp.Or(cmp.Compare(y.Score, x.Score), cmp.Compare(x.Agent, y.Agent)) })
		out = append(out, b)
	}
	return out, nil
}

// WriteText writes boards as text tables, one after another.
func WriteText(w io.Writer, boards []Board) error {
	for i, b := range boards {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "paperbench %s, %s variant, grader %s\n", b.Suite, b.Variant, b.Grader)
		fmt.Fprintf(w, "judge %s, second judge %s; leaves judged twice: %s\n", judgeText(b.Judge), judgeText(b.SecondJudge),
			agreementText(b.Agreement))
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "agent\tmodel\tscore\tpapers\tvalidated/units\tdisqualified\tfailed leaves\tjudge calls\tjudge tokens in/out\tjudge cost\tagent cost")
		for _, r := range b.Rows {
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%d\t%d/%d\t%d\t%d/%d\t%d\t%d/%d\t%s\t%s\n", r.Agent, orDash(r.Model), 100*r.Score, len(r.Papers),
				r.Validated, r.Units, r.Disqualified, r.FailedLeaves, r.Leaves, r.Judge.Calls, r.Judge.InputTokens, r.Judge.OutputTokens,
				judging.Dollars(r.Judge.CostUSD), judging.Dollars(r.AgentCostUSD))
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

func judgeText(j JudgeSettings) string {
	var opts []string
	if j.Temperature != nil {
		opts = append(opts, fmt.Sprintf("temperature %g", *j.Temperature))
	}
	if j.ReasoningEffort != "" {
		opts = append(opts, "reasoning "+j.ReasoningEffort)
	}
	if j.MaxTokens > 0 {
		opts = append(opts, fmt.Sprintf("max %d tokens", j.MaxTokens))
	}
	if len(opts) == 0 {
		return j.Model
	}
	return j.Model + " (" + strings.Join(opts, ", ") + ")"
}

func agreementText(a Agreement) string {
	if a.Pairs == 0 {
		return fmt.Sprintf("no pairs (%d excluded)", a.Excluded)
	}
	k := "kappa undefined"
	if a.Kappa != nil {
		k = fmt.Sprintf("kappa %.2f", *a.Kappa)
	}
	return fmt.Sprintf("%d of %d agree (%.0f%%), %s, %d excluded", a.Agree, a.Pairs, 100*a.Observed, k, a.Excluded)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
