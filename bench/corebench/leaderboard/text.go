package leaderboard

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/repronet/repronet/bench"
)

// WriteText prints boards as aligned text tables: one per suite, level
// and scoring, headed by everything the numbers depend on. Accuracies are
// percentages; "-" marks what is unknown. Cross-checked is validated of
// graded; replay-verified, of a model-driven row's validated tasks, those
// a replay verified; awaiting cross-check and pending are the row's
// unvalidated and pending counts, as the API gives them.
func WriteText(w io.Writer, boards []Board) error {
	if len(boards) == 0 {
		_, err := fmt.Fprintln(w, "no leaderboard yet: no graded attempt")
		return err
	}
	for i, b := range boards {
		if i > 0 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		if _, err := fmt.Fprintf(w, "%s, %s level, grader %s v%s, strip rule %s v%s\n", b.Suite, b.Level,
			b.Scoring.Grader, b.Scoring.GraderVersion, b.Scoring.StripRule, b.Scoring.StripRuleVersion); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "AGENT\tMODEL\tACCURACY\tMIN-MAX\tWRITTEN\tVISION\tCOST/RUN\tWALL/RUN\tRUNS\tCROSS-CHECKED\tREPLAY-VERIFIED\tINCONSISTENT\tINFRA FAILED\tAWAITING CROSS-CHECK\tPENDING")
		for _, r := range b.Rows {
			model := r.Model
			if model == "" {
				model = "-"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s-%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%d\n",
				r.Agent, model, pct(&r.Accuracy, r.Runs > 0), pct(&r.AccuracyMin, r.Runs > 0), pct(&r.AccuracyMax, r.Runs > 0),
				pct(r.WrittenAccuracy, true), pct(r.VisionAccuracy, true), usd(r.CostUSD), seconds(r.WallSeconds, r.Runs > 0),
				r.Runs, validated(r), replayVerified(r), r.Inconsistent, r.InfraFailures, r.Unvalidated, r.Pending)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if err := writeReliability(w, b.Rows); err != nil {
			return err
		}
	}
	return nil
}

// writeReliability prints each row's reliability measures under a board.
func writeReliability(w io.Writer, rows []Row) error {
	for _, r := range rows {
		if r.Reliability == nil || r.Reliability.Runs == 0 {
			continue
		}
		model := ""
		if r.Model != "" {
			model = " (" + r.Model + ")"
		}
		if _, err := fmt.Fprintf(w, "%s%s:\n%s\n", r.Agent, model, strings.Join(bench.ReliabilityText(r.Reliability, "  "), "\n")); err != nil {
			return err
		}
	}
	return nil
}

func pct(x *float64, known bool) string {
	if x == nil || !known {
		return "-"
	}
	return strings.TrimSuffix(strings.TrimSuffix(fmt.Sprintf("%.1f", 100**x), "0"), ".") + "%"
}

func usd(x *float64) string {
	if x == nil {
		return "-"
	}
	return fmt.Sprintf("$%.2f", *x)
}

func seconds(s float64, known bool) string {
	if !known {
		return "-"
	}
	return fmt.Sprintf("%.0fs", s)
}

// replayVerified is "verified/sampled" for a row of model-driven runs.
func replayVerified(r Row) string {
	if r.Sampled == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d", r.ReplayVerified, r.Sampled)
}

func validated(r Row) string {
	graded := r.Validated + r.Unvalidated + r.Inconsistent
	if graded == 0 {
		return "-"
	}
	return fmt.Sprintf("%d/%d", r.Validated, graded)
}
