package coordinator

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench/corebench/leaderboard"
)

// testReliability: the boards the API serves carry the reliability
// measures of the fixture's real runs (solver-a: two runs of the easy
// level, the first task wrong in run 1 alone; solver-b: one run, the
// second task wrong), and the text `repronet leaderboard` prints of them
// (the CORE-Bench family's text form) shows them with the per-task view.
func testReliability(t *testing.T, f *people) {
	var raw []json.RawMessage
	f.get(t, f.admin, "/api/leaderboards", &raw)
	var boards []leaderboard.Board
	for _, r := range raw {
		var b leaderboard.Board
		if err := json.Unmarshal(r, &b); err != nil {
			t.Fatal(err)
		}
		if b.Family == "corebench" && b.Suite == "sample" && b.Level == "easy" {
			boards = append(boards, b)
		}
	}
	if len(boards) != 1 {
		t.Fatalf("%d easy boards of the sample suite", len(boards))
	}
	n := float64(len(f.tasks))
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	var a, b *leaderboard.Row
	for i, r := range boards[0].Rows {
		switch r.Agent {
		case "solver-a":
			a = &boards[0].Rows[i]
		case "solver-b":
			b = &boards[0].Rows[i]
		}
	}
	if a == nil || b == nil || a.Reliability == nil || b.Reliability == nil {
		t.Fatalf("rows %+v", boards[0].Rows)
	}
	ra := a.Reliability
	if ra.Pass != leaderboard.PassRule || ra.Tasks != len(f.tasks) || ra.Runs != 2*len(f.tasks) || ra.MinRuns != 2 || ra.MaxRuns != 2 {
		t.Fatalf("solver-a: %+v", ra)
	}
	// The first task passed once of two; the others twice.
	if len(ra.PassAtK) != 2 || !near(ra.PassAtK[0].Value, (n-0.5)/n) || !near(ra.PassAtK[1].Value, 1) ||
		!near(ra.PassHatK[1].Value, (n-1)/n) || ra.Consistency == nil || !near(*ra.Consistency, (n-1)/n) {
		t.Errorf("solver-a: pass@k %+v pass^k %+v consistency %v", ra.PassAtK, ra.PassHatK, ra.Consistency)
	}
	first := ra.PerTask[0]
	if first.Task != f.tasks[0] || len(first.Runs) != 2 || first.Runs[0].Pass || !first.Runs[1].Pass || first.Consistent {
		t.Errorf("solver-a's first task: %+v", first)
	}
	// Two model calls a run at $0.002 each.
	if c := ra.CostUSD; c == nil || !near(c.Median, 2*callUSD) || c.N != 2*len(f.tasks) {
		t.Errorf("solver-a's cost spread %+v", c)
	}
	if w := ra.WallSeconds; w == nil || w.N != 2*len(f.tasks) || w.Min > w.Median || w.Median > w.Max {
		t.Errorf("solver-a's wall spread %+v", w)
	}
	if rb := b.Reliability; rb.MaxRuns != 1 || rb.Consistency != nil || !near(rb.PassAtK[0].Value, (n-1)/n) {
		t.Errorf("solver-b: %+v", rb)
	}
	var text strings.Builder
	if err := leaderboard.WriteText(&text, boards); err != nil {
		t.Fatal(err)
	}
	perTask := f.tasks[0] + " -+"
	for _, want := range []string{"solver-a (sim-1):", "reliability (pass = task_correct; ", "pass@2 100.0%", "pass^2 ", "consistency ",
		perTask} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("%q not in\n%s", want, text.String())
		}
	}
}
