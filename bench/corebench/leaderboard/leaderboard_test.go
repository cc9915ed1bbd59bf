package leaderboard

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench"
)

var original = corebench.Scoring{Grader: "corebench-original", GraderVersion: "1", StripRule: "original", StripRuleVersion: "1"}

// score: written w/W correct, vision v/V correct.
func score(w, W, v, V int) *Score {
	return &Score{CorrectWrittenAnswers: w, TotalWrittenQuestions: W, CorrectVisionAnswers: v, TotalVisionQuestions: V,
		TaskCorrect: w == W && v == V}
}

func entry(agent, task string, run int, st Status, s *Score) Entry {
	cost := 0.5
	return Entry{Suite: "core-test", Level: "hard", Scoring: original, Agent: agent, Model: "gpt-x", TaskID: task, Run: run,
		Status: st, Score: s, CostUSD: &cost, WallSeconds: 100, CPUSeconds: 50}
}

func approx(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestBuild(t *testing.T) {
	entries := []Entry{
		// agent A, run 1: 2 of 3 correct; run 2: 1 of 2 validated (one unvalidated, one inconsistent)
		entry("A", "t1", 1, Validated, score(1, 1, 1, 1)),
		entry("A", "t2", 1, Validated, score(2, 2, 0, 0)),
		entry("A", "t3", 1, Validated, score(0, 1, 1, 1)),
		entry("A", "t1", 2, Validated, score(1, 1, 0, 1)),
		entry("A", "t2", 2, Validated, score(2, 2, 0, 0)),
		entry("A", "t3", 2, Unvalidated, score(1, 1, 1, 1)),
		entry("A", "t4", 2, Inconsistent, nil),
		entry("A", "t5", 2, InfraFailed, nil),
		entry("A", "t6", 2, Pending, nil),
		// agent B: one run, all correct, one entry without a cost
		entry("B", "t1", 1, Validated, score(1, 1, 1, 1)),
		func() Entry { e := entry("B", "t2", 1, Validated, score(2, 2, 0, 0)); e.CostUSD = nil; return e }(),
		// agent B under another grader: its own board
		func() Entry {
			e := entry("B", "t1", 1, Validated, score(0, 1, 0, 0))
			e.Scoring.Grader = "corebench-lenient"
			return e
		}(),
		// the same grader with another strip rule version: its own board too
		func() Entry {
			e := entry("B", "t1", 1, Validated, score(0, 1, 0, 0))
			e.Scoring.StripRuleVersion = "2"
			return e
		}(),
		// invalid entries are reported, never counted
		func() Entry { e := entry("C", "t1", 0, Validated, score(1, 1, 0, 0)); return e }(),
		func() Entry { e := entry("C", "t1", 1, Validated, nil); return e }(),
		func() Entry { e := entry("C", "t1", 1, "done", nil); return e }(),
		func() Entry {
			e := entry("C", "t1", 1, Validated, score(1, 1, 0, 0))
			e.Scoring.GraderVersion = ""
			return e
		}(),
	}
	boards, errs := Build(entries)
	if len(errs) != 4 {
		t.Errorf("%d errors, want 4: %v", len(errs), errs)
	}
	for _, want := range []string{"field run", "field score", "field status", "field scoring"} {
		found := false
		for _, err := range errs {
			found = found || strings.Contains(err.Error(), want)
		}
		if !found {
			t.Errorf("no error naming %s", want)
		}
	}
	if len(boards) != 3 {
		t.Fatalf("%d boards, want 3 (one per scoring)", len(boards))
	}
	for i, want := range []string{"corebench-lenient@1/original@1", "corebench-original@1/original@1", "corebench-original@1/original@2"} {
		if got := boards[i].Scoring.String(); got != want {
			t.Errorf("board %d: %s, want %s", i, got, want)
		}
	}
	b := boards[1]
	if len(b.Rows) != 2 || b.Rows[0].Agent != "B" || b.Rows[1].Agent != "A" {
		t.Fatalf("rows %+v", b.Rows)
	}
	a := b.Rows[1]
	// run 1: 2/3 (t1 and t2), run 2: 1/2 (t2)
	if a.Tasks != 5 || a.Correct != 3 || !approx(a.Accuracy, (2.0/3+0.5)/2) || !approx(a.AccuracyMin, 0.5) || !approx(a.AccuracyMax, 2.0/3) {
		t.Errorf("A accuracy: %+v", a)
	}
	// written: run 1 t1 ok, t2 ok, t3 no -> 2/3; run 2 t1 ok, t2 ok -> 1
	// vision: run 1 t1 ok, t3 ok -> 1; run 2 t1 no -> 0
	if a.WrittenAccuracy == nil || !approx(*a.WrittenAccuracy, (2.0/3+1)/2) || a.VisionAccuracy == nil || !approx(*a.VisionAccuracy, 0.5) {
		t.Errorf("A written/vision: %v %v", *a.WrittenAccuracy, *a.VisionAccuracy)
	}
	if a.Runs != 2 || a.Validated != 5 || a.Unvalidated != 1 || a.Inconsistent != 1 || a.InfraFailures != 1 || a.Pending != 1 ||
		!approx(a.ValidatedShare, 5.0/7) {
		t.Errorf("A counts: %+v", a)
	}
	// cost and time: means over runs of the run totals (run 1: 3 entries, run 2: 2)
	if a.CostUSD == nil || !approx(*a.CostUSD, (1.5+1.0)/2) || !approx(a.WallSeconds, 250) || !approx(a.CPUSeconds, 125) {
		t.Errorf("A cost %v, wall %v, cpu %v", a.CostUSD, a.WallSeconds, a.CPUSeconds)
	}
	bb := b.Rows[0]
	if bb.CostUSD != nil || bb.Accuracy != 1 || bb.VisionAccuracy == nil || *bb.VisionAccuracy != 1 {
		t.Errorf("B: %+v", bb)
	}
}

func TestBuildNoValidated(t *testing.T) {
	boards, _ := Build([]Entry{entry("A", "t1", 1, InfraFailed, nil), entry("A", "t2", 1, Pending, nil)})
	r := boards[0].Rows[0]
	if r.Runs != 0 || r.Accuracy != 0 || r.WrittenAccuracy != nil || r.CostUSD != nil || r.InfraFailures != 1 || r.ValidatedShare != 0 {
		t.Errorf("%+v", r)
	}
}

func TestScoreOf(t *testing.T) {
	task, err := corebench.ParseTasks([]byte(`[{"field": "F", "language": "P", "capsule_title": "T", "capsule_id": "capsule-1", "task_prompt": "p", "capsule_doi": "d",
		"results": [{"q": 1, "fig q": "a"}, {"q": 1, "fig q": "a"}]}]`))
	if err != nil {
		t.Fatal(err)
	}
	v, _ := corebench.NewOriginal().Grade(task[0], []byte(`{"q": 1, "fig q": "b"}`))
	if s := ScoreOf(v); s != (Score{CorrectWrittenAnswers: 1, TotalWrittenQuestions: 1, TotalVisionQuestions: 1}) || !s.WrittenCorrect() || s.VisionCorrect() {
		t.Errorf("%+v", s)
	}
}

func TestWriteText(t *testing.T) {
	boards, _ := Build([]Entry{
		entry("A", "t1", 1, Validated, score(1, 1, 1, 1)),
		entry("A", "t2", 1, Validated, score(0, 2, 0, 0)),
		entry("A", "t3", 1, Unvalidated, score(0, 2, 0, 0)),
		entry("A", "t4", 1, InfraFailed, nil),
	})
	var b strings.Builder
	if err := WriteText(&b, boards); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"core-test, hard level, grader corebench-original v1, strip rule original v1", "ACCURACY", "50%", "$1.00", "2/3", "200s",
		"CROSS-CHECKED", "AWAITING CROSS-CHECK"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in\n%s", want, out)
		}
	}
	// The row's last columns: 1 infra failed, 1 awaiting cross-check (its
	// unvalidated task), 0 pending, as the row's fields say.
	// (The reliability lines follow the table.)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	row := lines[slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "A ") })]
	if f := strings.Fields(row); len(f) < 3 || f[len(f)-3] != "1" || f[len(f)-2] != "1" || f[len(f)-1] != "0" {
		t.Errorf("row %q: want infra failed 1, awaiting cross-check 1, pending 0", row)
	}
	b.Reset()
	WriteText(&b, nil)
	if !strings.Contains(b.String(), "no leaderboard yet") {
		t.Error(b.String())
	}
}

func TestRowsKeepScoringsApart(t *testing.T) {
	sc := func(v string) corebench.Scoring {
		return corebench.Scoring{Grader: "corebench-original", GraderVersion: v, StripRule: "original", StripRuleVersion: "1"}
	}
	s := func(ok bool) *Score {
		x := Score{TotalWrittenQuestions: 1, TaskCorrect: ok}
		if ok {
			x.CorrectWrittenAnswers = 1
		}
		return &x
	}
	entries := []Entry{
		{Suite: "s", Level: "easy", Scoring: sc("1"), Agent: "a", TaskID: "t1", Run: 1, Status: Validated, Score: s(true)},
		{Suite: "s", Level: "easy", Scoring: sc("1"), Agent: "a", TaskID: "t2", Run: 1, Status: Unvalidated, Score: s(true)},
		{Suite: "s", Level: "easy", Scoring: sc("1"), Agent: "a", TaskID: "t3", Run: 1, Status: InfraFailed},
		{Suite: "s", Level: "easy", Scoring: sc("2"), Agent: "a", TaskID: "t1", Run: 1, Status: Validated, Score: s(false)},
	}
	boards, errs := Build(entries)
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	rows := Flatten(boards)
	if len(rows) != 2 {
		t.Fatalf("%d rows, want one per grader version: %+v", len(rows), rows)
	}
	if r := rows[0]; r.GraderVersion != "1" || r.Tasks != 1 || r.Accuracy != 1 || r.Pending != 1 || r.InfraFailures != 1 || r.ValidatedShare != 0.5 {
		t.Errorf("version 1 row: %+v", r)
	}
	if r := rows[1]; r.GraderVersion != "2" || r.Tasks != 1 || r.Accuracy != 0 {
		t.Errorf("version 2 row: %+v", r)
	}
}

// TestBuildSamples: model-driven runs are samples: mean and min-max over
// runs, and the row counts which validated samples a replay verified
// (the others are unverified, not left out).
func TestBuildSamples(t *testing.T) {
	with := func(e Entry, v string) Entry { e.Verification = v; return e }
	boards, errs := Build([]Entry{
		with(entry("A", "t1", 1, Validated, score(1, 1, 0, 0)), "verified"),
		with(entry("A", "t1", 2, Validated, score(0, 1, 0, 0)), "not_drawn"),
		with(entry("A", "t1", 3, Validated, score(1, 1, 0, 0)), "nondeterministic"),
		with(entry("A", "t1", 4, Pending, nil), "pending"),
	})
	if len(errs) != 0 || len(boards) != 1 || len(boards[0].Rows) != 1 {
		t.Fatalf("boards %+v, errors %v", boards, errs)
	}
	r := boards[0].Rows[0]
	if r.Runs != 3 || !approx(r.Accuracy, 2.0/3) || r.AccuracyMin != 0 || r.AccuracyMax != 1 || r.Sampled != 3 || r.ReplayVerified != 1 {
		t.Fatalf("row %+v: want 3 runs, mean 2/3 in [0, 1], 3 samples of which 1 replay-verified", r)
	}
}

// TestBuildReliability: a row's reliability measures count its validated
// attempts only, a run passing when the task is correct.
func TestBuildReliability(t *testing.T) {
	entries := []Entry{
		entry("A", "t1", 1, Validated, score(1, 1, 1, 1)),
		entry("A", "t1", 2, Validated, score(1, 1, 1, 1)),
		entry("A", "t1", 3, Validated, score(0, 1, 1, 1)),
		entry("A", "t2", 1, Validated, score(0, 2, 0, 0)),
		entry("A", "t2", 2, Validated, score(1, 2, 0, 0)),
		entry("A", "t2", 3, Inconsistent, nil), // never counted
		entry("A", "t3", 1, InfraFailed, nil),
	}
	entries[1].WallSeconds, entries[2].WallSeconds = 300, 200
	boards, errs := Build(entries)
	if len(errs) != 0 || len(boards) != 1 || len(boards[0].Rows) != 1 {
		t.Fatalf("boards %+v errs %v", boards, errs)
	}
	r := boards[0].Rows[0].Reliability
	if r == nil || r.Pass != PassRule || r.Tasks != 2 || r.Runs != 5 || r.MinRuns != 2 || r.MaxRuns != 3 {
		t.Fatalf("reliability %+v", r)
	}
	// t1: n=3 c=2; t2: n=2 c=0.
	if !approx(r.PassAtK[0].Value, (2.0/3+0)/2) || !approx(r.PassAtK[1].Value, (1+0)/2.0) || r.PassAtK[2].Tasks != 1 ||
		!approx(r.PassAtK[2].Value, 1) {
		t.Errorf("pass@k %+v", r.PassAtK)
	}
	if !approx(r.PassHatK[1].Value, (1.0/3+0)/2) || !approx(r.PassHatK[2].Value, 0) {
		t.Errorf("pass^k %+v", r.PassHatK)
	}
	if r.Consistency == nil || !approx(*r.Consistency, 0.5) {
		t.Errorf("consistency %v, want t2 consistent, t1 not", r.Consistency)
	}
	if w := r.PerTask[0].WallSeconds; w.Min != 100 || w.Median != 200 || w.Max != 300 {
		t.Errorf("t1 wall spread %+v", w)
	}
	var text strings.Builder
	if err := WriteText(&text, boards); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"A (gpt-x):", "pass@1 33.3%", "pass^2 16.7%", "pass@3 100.0% (1 tasks)", "consistency 50.0% (1 of 2", "t1 ++- t2 --"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("%q not in\n%s", want, text.String())
		}
	}
}

// TestTwoEvaluationsTwoRuns: two evaluations of an agent both number their
// runs from 1; their run 1 are two runs (accuracy per run, then the
// mean), never one run of both evaluations' tasks.
func TestTwoEvaluationsTwoRuns(t *testing.T) {
	a, b := entry("A", "t1", 1, Validated, score(1, 1, 0, 0)), entry("A", "t2", 1, Validated, score(1, 1, 0, 0))
	c := entry("A", "t1", 1, Validated, score(0, 1, 0, 0))
	a.Eval, b.Eval, c.Eval = "ev-1", "ev-1", "ev-2"
	boards, errs := Build([]Entry{a, b, c})
	if len(errs) != 0 || len(boards) != 1 {
		t.Fatalf("%v %v", boards, errs)
	}
	// ev-1's run 1: 2/2; ev-2's run 1: 0/1; mean 50%, range 0-100%.
	if r := boards[0].Rows[0]; r.Runs != 2 || r.Accuracy != 0.5 || r.AccuracyMin != 0 || r.AccuracyMax != 1 || *r.CostUSD != 0.75 {
		t.Fatalf("row %+v", r)
	}
	// t1's two runs, one of each evaluation, disagree; each is its own.
	rel := boards[0].Rows[0].Reliability
	if rel.Runs != 3 || rel.MaxRuns != 2 || rel.Consistency == nil || *rel.Consistency != 0 || len(rel.PerTask[0].Runs) != 2 ||
		rel.PerTask[0].Runs[0] != (bench.RunPass{Eval: "ev-1", Run: 1, Pass: true}) || rel.PerTask[0].Runs[1] != (bench.RunPass{Eval: "ev-2", Run: 1}) {
		t.Fatalf("reliability %+v", rel)
	}
}
