package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"
)

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// TestPassAtK checks the estimators against hand-computed binomials.
func TestPassAtK(t *testing.T) {
	tests := []struct {
		n, c, k     int
		at, hat     float64
		explanation string
	}{
		{5, 2, 1, 0.4, 0.4, "k=1 is c/n for both"},
		{5, 2, 2, 1 - 3.0/10, 1.0 / 10, "C(3,2)/C(5,2) = 3/10; C(2,2)/C(5,2) = 1/10"},
		{5, 2, 3, 1 - 1.0/10, 0, "C(3,3)/C(5,3) = 1/10; fewer passes than k"},
		{5, 2, 4, 1, 0, "n-c < k: some pass is always drawn"},
		{3, 3, 3, 1, 1, "all passed"},
		{3, 0, 2, 0, 0, "none passed"},
		{4, 1, 2, 1 - 3.0/6, 0, "C(3,2)/C(4,2) = 1/2"},
		{10, 3, 5, 1 - 21.0/252, 0, "C(7,5)/C(10,5) = 21/252"},
		{10, 3, 3, 1 - 35.0/120, 1.0 / 120, "C(7,3)/C(10,3) = 35/120; C(3,3)/C(10,3) = 1/120"},
		{10, 7, 4, 1, 35.0 / 210, "n-c = 3 < 4; C(7,4)/C(10,4) = 35/210"},
		{1, 1, 1, 1, 1, "one run, passed"},
		{1, 0, 1, 0, 0, "one run, failed"},
	}
	for _, tt := range tests {
		if got := PassAtK(tt.n, tt.c, tt.k); !near(got, tt.at) {
			t.Errorf("pass@%d n=%d c=%d = %v, want %v (%s)", tt.k, tt.n, tt.c, got, tt.at, tt.explanation)
		}
		if got := PassHatK(tt.n, tt.c, tt.k); !near(got, tt.hat) {
			t.Errorf("pass^%d n=%d c=%d = %v, want %v (%s)", tt.k, tt.n, tt.c, got, tt.hat, tt.explanation)
		}
	}
	// Large n: no overflow, no NaN, monotone in k.
	prev := 0.0
	for k := 1; k <= 100; k++ {
		at, hat := PassAtK(200, 100, k), PassHatK(200, 100, k)
		if math.IsNaN(at) || math.IsNaN(hat) || at < prev || at > 1 || hat < 0 || hat > 0.5 {
			t.Fatalf("n=200 c=100 k=%d: pass@k %v pass^k %v", k, at, hat)
		}
		prev = at
	}
}

func TestSpreadOf(t *testing.T) {
	if SpreadOf(nil) != nil {
		t.Fatal("a spread of nothing")
	}
	for _, tt := range []struct {
		xs            []float64
		min, med, max float64
	}{
		{[]float64{3}, 3, 3, 3},
		{[]float64{4, 6}, 4, 5, 6},
		{[]float64{30, 10, 20}, 10, 20, 30},
		{[]float64{1, 100, 2, 3}, 1, 2.5, 100},
	} {
		s := SpreadOf(tt.xs)
		if s.Min != tt.min || s.Median != tt.med || s.Max != tt.max || s.N != len(tt.xs) {
			t.Errorf("SpreadOf(%v) = %+v, want %v/%v/%v", tt.xs, *s, tt.min, tt.med, tt.max)
		}
	}
}

func usd(x float64) *float64 { return &x }

// TestMeasureReliability: four tasks, three with three runs (all passed;
// two of three; none) and one with a single run, computed by hand.
func TestMeasureReliability(t *testing.T) {
	run := func(task string, run int, pass bool, cost *float64, wall float64) RunOutcome {
		return RunOutcome{Task: task, Run: run, Pass: pass, CostUSD: cost, WallSeconds: wall}
	}
	runs := []RunOutcome{
		run("b", 3, true, usd(6), 50), run("a", 1, true, usd(1), 10), run("a", 2, true, usd(2), 20), run("a", 3, true, usd(3), 30),
		run("b", 1, true, usd(4), 5), run("b", 2, false, nil, 5),
		run("c", 1, false, usd(0.5), 1), run("c", 2, false, usd(0.5), 2), run("c", 3, false, usd(0.5), 3),
		run("d", 1, true, usd(10), 100),
	}
	r := MeasureReliability("task_correct", runs)
	if r.Pass != "task_correct" || r.Tasks != 4 || r.Runs != 10 || r.MinRuns != 1 || r.MaxRuns != 3 {
		t.Fatalf("counts %+v", r)
	}
	wantAt := []float64{(1 + 2.0/3 + 0 + 1) / 4, (1 + 1 + 0) / 3.0, (1 + 1 + 0) / 3.0}
	wantHat := []float64{(1 + 2.0/3 + 0 + 1) / 4, (1 + 1.0/3 + 0) / 3, 1.0 / 3}
	wantTasks := []int{4, 3, 3}
	if len(r.PassAtK) != 3 || len(r.PassHatK) != 3 {
		t.Fatalf("pass@k %v pass^k %v: want k = 1..3", r.PassAtK, r.PassHatK)
	}
	for i := range 3 {
		if a := r.PassAtK[i]; a.K != i+1 || !near(a.Value, wantAt[i]) || a.Tasks != wantTasks[i] {
			t.Errorf("pass@%d = %+v, want %v over %d tasks", i+1, a, wantAt[i], wantTasks[i])
		}
		if h := r.PassHatK[i]; h.K != i+1 || !near(h.Value, wantHat[i]) || h.Tasks != wantTasks[i] {
			t.Errorf("pass^%d = %+v, want %v over %d tasks", i+1, h, wantHat[i], wantTasks[i])
		}
	}
	if r.Consistency == nil || !near(*r.Consistency, 2.0/3) || r.ConsistentTasks != 2 || r.RepeatedTasks != 3 {
		t.Errorf("consistency %v (%d of %d), want 2 of 3", r.Consistency, r.ConsistentTasks, r.RepeatedTasks)
	}
	if c := r.CostUSD; c == nil || *c != (Spread{Min: 0.5, Median: 2, Max: 10, N: 9}) {
		t.Errorf("cost spread %+v, want 0.5/2/10 over the 9 metered runs", c)
	}
	if w := r.WallSeconds; w == nil || *w != (Spread{Min: 1, Median: 7.5, Max: 100, N: 10}) {
		t.Errorf("wall spread %+v, want 1/7.5/100", w)
	}
	if len(r.PerTask) != 4 || r.PerTask[0].Task != "a" || r.PerTask[1].Task != "b" {
		t.Fatalf("per task %+v", r.PerTask)
	}
	b := r.PerTask[1]
	if b.Passed != 2 || b.Consistent || len(b.Runs) != 3 || b.Runs[0] != (RunPass{Run: 1, Pass: true}) || b.Runs[1] != (RunPass{Run: 2}) ||
		*b.CostUSD != (Spread{Min: 4, Median: 5, Max: 6, N: 2}) || *b.WallSeconds != (Spread{Min: 5, Median: 5, Max: 50, N: 3}) {
		t.Errorf("task b %+v", b)
	}
	if !r.PerTask[2].Consistent || r.PerTask[2].Passed != 0 || !r.PerTask[3].Consistent {
		t.Errorf("tasks c, d %+v %+v", r.PerTask[2], r.PerTask[3])
	}
	if _, err := json.Marshal(r); err != nil {
		t.Fatal(err)
	}
}

func TestMeasureReliabilityEmptyAndSingle(t *testing.T) {
	r := MeasureReliability("x", nil)
	if r.Tasks != 0 || len(r.PassAtK) != 0 || r.Consistency != nil || r.CostUSD != nil || r.WallSeconds != nil {
		t.Fatalf("empty: %+v", r)
	}
	b, _ := json.Marshal(r)
	if string(b) == "" || !json.Valid(b) {
		t.Fatal("empty measures do not encode")
	}
	r = MeasureReliability("x", []RunOutcome{{Task: "a", Run: 1, Pass: true, WallSeconds: 3}})
	if r.Consistency != nil || r.RepeatedTasks != 0 || len(r.PassAtK) != 1 || r.PassAtK[0].Value != 1 || r.CostUSD != nil {
		t.Fatalf("single run: %+v", r)
	}
}

func TestReliabilityText(t *testing.T) {
	runs := []RunOutcome{{Task: "a", Run: 1, Pass: true, WallSeconds: 10}, {Task: "a", Run: 2, Pass: false, WallSeconds: 30},
		{Task: "b", Run: 1, Pass: true, CostUSD: usd(0.25), WallSeconds: 20}}
	got := strings.Join(ReliabilityText(MeasureReliability("task_correct", runs), "  "), "\n")
	for _, want := range []string{"pass = task_correct; 3 runs of 2 tasks, 1-2 per task", "pass@1 75.0%", "pass@2 100.0% (1 tasks)",
		"pass^2 0.0% (1 tasks)", "consistency 0.0% (0 of 1 tasks with 2+ runs agree)", "cost min/median/max $0.2500 / $0.2500 / $0.2500 (1 runs)",
		"wall 10s / 20s / 30s (3 runs)", "a +- b +"} {
		if !strings.Contains(got, want) {
			t.Errorf("%q not in\n%s", want, got)
		}
	}
	if got := ReliabilityText(nil, ""); len(got) != 1 || !strings.Contains(got[0], "no validated run") {
		t.Errorf("nil: %q", got)
	}
}

// BenchmarkMeasureReliability: a CORE-Bench-sized row, 270 tasks of 5
// runs each; reports the size of its JSON.
func BenchmarkMeasureReliability(b *testing.B) {
	var runs []RunOutcome
	for task := range 270 {
		for run := 1; run <= 5; run++ {
			runs = append(runs, RunOutcome{Task: fmt.Sprintf("capsule-%07d", task), Run: run, Pass: (task*run)%3 == 0,
				CostUSD: usd(0.01 * float64(run)), WallSeconds: float64(60 * run)})
		}
	}
	var r *Reliability
	for b.Loop() {
		r = MeasureReliability("task_correct", runs)
	}
	j, _ := json.Marshal(r)
	b.ReportMetric(float64(len(j)), "json-bytes")
}
