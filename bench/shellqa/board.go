package shellqa

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/repronet/repronet/bench"
)

// Board is the accuracy table of one suite at one variant under one
// scoring: a row per agent.
type Board struct {
	Family  string          `json:"family"`
	Suite   string          `json:"suite"`
	Variant string          `json:"variant"`
	Scoring json.RawMessage `json:"scoring"`
	Rows    []Row           `json:"rows"`
}

// Row is one agent's line: its units (task runs) by status, and of the
// validated ones, how many were answered right.
type Row struct {
	Agent string `json:"agent"`
	Model string `json:"model,omitempty"`
	// StatusCounts are the agent's units by status; validated ones are
	// the only ones scored: Accuracy is Correct / Validated (0 when none
	// is).
	bench.StatusCounts
	Correct  int     `json:"correct"`
	Accuracy float64 `json:"accuracy"`
	// Reliability holds the reliability measures of the validated units
	// (a run passes when answered right, PassRule).
	Reliability *bench.Reliability `json:"reliability,omitempty"`
}

// PassRule is what a passed run is for the reliability measures.
const PassRule = "correct"

// Boards builds one Board per variant (in the suite's order) and scoring,
// rows sorted by accuracy, then agent. An entry of a variant the suite does
// not have, with an unknown status, a scoring that is not JSON, or a
// validated entry whose score does not parse, is an error naming it. An
// entry without a scoring counts under the suite's.
func (s *Suite) Boards(entries []bench.Entry) ([]any, error) {
	type key struct{ variant, scoring string }
	var keys []key
	rows := map[key]map[string]*Row{}
	outcomes := map[key]map[string][]bench.RunOutcome{}
	for _, e := range entries {
		name := fmt.Sprintf("entry %s/%s/%s/%s run %d", e.Suite, e.Variant, e.Agent, e.TaskID, e.Run)
		if !slices.Contains(s.Variants(), e.Variant) {
			return nil, fmt.Errorf("%s: no variant %q in suite %s", name, e.Variant, s.name)
		}
		scoring, err := e.BoardScoring(s.Scoring())
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		k := key{e.Variant, scoring}
		if rows[k] == nil {
			rows[k], outcomes[k] = map[string]*Row{}, map[string][]bench.RunOutcome{}
			keys = append(keys, k)
		}
		r := rows[k][e.Agent]
		if r == nil {
			r = &Row{Agent: e.Agent, Model: e.Model}
			rows[k][e.Agent] = r
		}
		if err := r.Count(e.Status); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		if e.Status == bench.Validated {
			var p Public
			if err := json.Unmarshal(e.Score, &p); err != nil {
				return nil, fmt.Errorf("%s: score: %w", name, err)
			}
			if p.Correct {
				r.Correct++
			}
			outcomes[k][e.Agent] = append(outcomes[k][e.Agent], e.Outcome(p.Correct))
		}
	}
	slices.SortStableFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(slices.Index(s.Variants(), a.variant), slices.Index(s.Variants(), b.variant)),
			cmp.Compare(a.scoring, b.scoring))
	})
	out := make([]any, 0, len(keys))
	for _, k := range keys {
		b := Board{Family: Name, Suite: s.name, Variant: k.variant, Scoring: json.RawMessage(k.scoring)}
		for _, r := range rows[k] {
			if r.Validated > 0 {
				r.Accuracy = float64(r.Correct) / float64(r.Validated)
			}
			r.Reliability = bench.MeasureReliability(PassRule, outcomes[k][r.Agent])
			b.Rows = append(b.Rows, *r)
		}
		slices.SortFunc(b.Rows, func(x, y Row) int {
			return cmp.Or(cmp.Compare(y.Accuracy, x.Accuracy), cmp.Compare(x.Agent, y.Agent))
		})
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
		var sc Scoring
		if err := json.Unmarshal(b.Scoring, &sc); err != nil {
			return fmt.Errorf("board %s/%s: scoring: %w", b.Suite, b.Variant, err)
		}
		fmt.Fprintf(w, "shellqa %s, %s variant, scorer %s\n", b.Suite, b.Variant, sc)
		tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "agent\tmodel\taccuracy\tcorrect/validated\tunits\tpending")
		for _, r := range b.Rows {
			model := r.Model
			if model == "" {
				model = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%.1f%%\t%d/%d\t%d\t%d\n", r.Agent, model, 100*r.Accuracy, r.Correct, r.Validated, r.Units, r.Pending)
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
