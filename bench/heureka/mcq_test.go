package heureka

import (
	"math"
	"strings"
	"testing"
)

func TestExtractSolution(t *testing.T) {
	cases := []struct {
		in, want string
		ok       bool
	}{
		{"I think <solution>B,D</solution>", "B,D", true},
		{"<solution>A</solution> then, on reflection, <solution> C </solution>", "C", true},
		{"<solution>stem cells</solution>", "stem cells", true}, // the published lstrip would leave "em cells"
		{"<solution>A<solution>B</solution>", "B", true},        // a match holds no other opening tag
		{"<solution>A</solution> <solution>unclosed", "A", true},
		{"<solution></solution>", "", true},
		{"no tag", "", false},
		{"<solution>open", "", false},
		{"</solution><solution>", "", false},
		{"<SOLUTION>A</SOLUTION>", "", false}, // tags are lower case, as published
	}
	for _, c := range cases {
		got, ok := ExtractSolution(c.in)
		if got != c.want || ok != c.ok {
			t.Errorf("ExtractSolution(%q) = %q, %v; want %q, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}

func TestPredicted(t *testing.T) {
	cases := []struct {
		in                string
		published, trimmd string
	}{
		{"B,D", "B|D", "B|D"},
		{"B, D", " D|B", "B|D"},
		{" A ", "A", "A"},
		{"A,A", "A", "A"},
		{"", "", ""}, // published: {""}, one empty prediction; trimmed: none
		{"B,D,", "|B|D", "B|D"},
		{"b", "b", "b"},
	}
	for _, c := range cases {
		p, err := MCQPublished.Predicted(c.in)
		if err != nil {
			t.Fatal(err)
		}
		tr, _ := MCQTrimmed.Predicted(c.in)
		if strings.Join(p, "|") != c.published || strings.Join(tr, "|") != c.trimmd {
			t.Errorf("%q: published %q trimmed %q; want %q %q", c.in, p, tr, c.published, c.trimmd)
		}
	}
	if p, _ := MCQPublished.Predicted(""); len(p) != 1 {
		t.Errorf("published empty answer predicts %q, want one empty letter", p)
	}
	if _, err := MCQGrader("x@1").Predicted("A"); err == nil {
		t.Error("unknown grader accepted")
	}
}

func sol(s string) string { return "Final answer: <solution>" + s + "</solution>" }

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

// wantMetrics checks one outcome's counts and metrics.
func wantMetrics(t *testing.T, what string, o MCQOutcome, exact bool, tp, fp, fn int) {
	t.Helper()
	p, r := 0.0, 0.0
	if tp+fp > 0 {
		p = float64(tp) / float64(tp+fp)
	}
	if tp+fn > 0 {
		r = float64(tp) / float64(tp+fn)
	}
	f := 0.0
	if p+r > 0 {
		f = 2 * p * r / (p + r)
	}
	if o.Exact != exact || o.TP != tp || o.FP != fp || o.FN != fn || !near(o.Precision, p) || !near(o.Recall, r) || !near(o.F1, f) {
		t.Errorf("%s %s: %+v; want exact %v tp %d fp %d fn %d P %v R %v F1 %v", o.ID, what, o, exact, tp, fp, fn, p, r, f)
	}
}

// TestEveryRealMCQ scores, for every question of both real files under both
// graders, answers whose metrics follow from the gold set G (|G| = g):
// the gold itself (exact), the gold with ", " (published: g=1 exact; g>1
// half wrong), the first gold letter (tp 1, fn g-1), the other letters
// (tp 0), all four letters (tp g, fp 4-g), and no answer.
func TestEveryRealMCQ(t *testing.T) {
	for _, file := range []string{"mcq.json", "mcq_lite.json"} {
		for _, q := range loadMCQ(t, file) {
			g := len(q.Gold)
			var others []string
			for _, o := range q.Options {
				if !strings.Contains(q.GoldRaw, o.Letter) {
					others = append(others, o.Letter)
				}
			}
			for _, grader := range MCQGraders() {
				score := func(final string) MCQOutcome {
					o, err := ScoreMCQ(q, final, grader)
					if err != nil {
						t.Fatal(err)
					}
					return o
				}
				wantMetrics(t, "gold", score(sol(q.GoldRaw)), true, g, 0, 0)
				spaced := score(sol(strings.ReplaceAll(q.GoldRaw, ",", ", ")))
				if grader == MCQTrimmed || g == 1 {
					wantMetrics(t, "gold with spaces", spaced, true, g, 0, 0)
				} else {
					// "B, D": " D" is wrong and D is missed.
					wantMetrics(t, "gold with spaces (published)", spaced, false, 1, g-1, g-1)
				}
				wantMetrics(t, "first gold letter", score(sol(q.Gold[0])), g == 1, 1, 0, g-1)
				if len(others) > 0 {
					wantMetrics(t, "the other letters", score(sol(strings.Join(others, ","))), false, 0, len(others), g)
				}
				wantMetrics(t, "all four", score(sol("D,C,B,A")), g == 4, g, 4-g, 0)
				un := score("I could not load the dataset.")
				wantMetrics(t, "unanswered", un, false, 0, 0, g)
				if un.Answered || len(un.Predicted) != 0 {
					t.Errorf("%s unanswered: %+v", q.ID, un)
				}
			}
		}
	}
}

// TestAggregateMCQ checks macro and micro metrics on a constructed set,
// worked out by hand.
func TestAggregateMCQ(t *testing.T) {
	qs := []MCQ{
		{ID: QuestionID{"p", "i", "Question1"}, Gold: []string{"A"}, GoldRaw: "A"},
		{ID: QuestionID{"p", "i", "Question2"}, Gold: []string{"B", "D"}, GoldRaw: "B,D"},
		{ID: QuestionID{"p", "j", "Question1"}, Gold: []string{"C"}, GoldRaw: "C"},
		{ID: QuestionID{"p", "j", "Question2"}, Gold: []string{"A", "B", "C"}, GoldRaw: "A,B,C"},
		{ID: QuestionID{"p", "k", "Question1"}, Gold: []string{"D"}, GoldRaw: "D"},
	}
	finals := []string{
		sol("A"),      // exact: P 1, R 1, F1 1
		sol("B, D"),   // published: {B, " D"}: tp 1 fp 1 fn 1: P 1/2 R 1/2 F1 1/2; trimmed: exact
		sol("A,C"),    // tp 1 fp 1 fn 0: P 1/2 R 1 F1 2/3
		sol("A"),      // tp 1 fp 0 fn 2: P 1 R 1/3 F1 1/2
		"no solution", // unanswered: tp 0 fp 0 fn 1
	}
	score := func(g MCQGrader) MCQMetrics {
		var out []MCQOutcome
		for i, q := range qs {
			o, err := ScoreMCQ(q, finals[i], g)
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, o)
		}
		return AggregateMCQ(out, g)
	}
	pub := score(MCQPublished)
	// Accuracy 1/5 (the unanswered question counts there, as published).
	// The other figures leave it out: macro P (1+.5+.5+1)/4 = .75; R
	// (1+.5+1+1/3)/4 = 17/24; F1 (1+.5+2/3+.5)/4 = 2/3. Micro: tp 4,
	// predicted 1+2+2+1 = 6, fn 0+1+0+2 = 3: P 4/6, R 4/7, F1
	// 2*(2/3)(4/7)/(2/3+4/7) = 8/13.
	want := MCQMetrics{Grader: MCQPublished, Questions: 5, Answered: 4, Correct: 1, Accuracy: 0.2,
		MacroPrecision: 0.75, MacroRecall: 17.0 / 24, MacroF1: 2.0 / 3,
		TP: 4, FP: 2, FN: 3, Predicted: 6, MicroPrecision: 4.0 / 6, MicroRecall: 4.0 / 7, MicroF1: 8.0 / 13}
	if !metricsNear(pub, want) {
		t.Errorf("published:\n%+v\nwant\n%+v", pub, want)
	}
	tr := score(MCQTrimmed)
	// Question 2 exact now: accuracy 2/5; macro P (1+1+.5+1+0)/5 = .7,
	// R (1+1+1+1/3)/5 = 2/3, F1 (1+1+2/3+1/2)/5 = 19/30; micro tp 5,
	// predicted 6, fn 3: P 5/6, R 5/8, F1 2*(5/6)(5/8)/(35/24) = 5/7.
	want = MCQMetrics{Grader: MCQTrimmed, Questions: 5, Answered: 4, Correct: 2, Accuracy: 0.4,
		MacroPrecision: 0.7, MacroRecall: 2.0 / 3, MacroF1: 19.0 / 30,
		TP: 5, FP: 1, FN: 3, Predicted: 6, MicroPrecision: 5.0 / 6, MicroRecall: 5.0 / 8, MicroF1: 5.0 / 7}
	if !metricsNear(tr, want) {
		t.Errorf("trimmed:\n%+v\nwant\n%+v", tr, want)
	}
	if m := AggregateMCQ(nil, MCQTrimmed); m.Questions != 0 || m.Accuracy != 0 || m.MicroF1 != 0 {
		t.Errorf("empty set: %+v", m)
	}
}

func metricsNear(a, b MCQMetrics) bool {
	return a.Grader == b.Grader && a.Questions == b.Questions && a.Answered == b.Answered && a.Correct == b.Correct &&
		a.TP == b.TP && a.FP == b.FP && a.FN == b.FN && a.Predicted == b.Predicted &&
		near(a.Accuracy, b.Accuracy) && near(a.MacroPrecision, b.MacroPrecision) && near(a.MacroRecall, b.MacroRecall) &&
		near(a.MacroF1, b.MacroF1) && near(a.MicroPrecision, b.MicroPrecision) && near(a.MicroRecall, b.MicroRecall) && near(a.MicroF1, b.MicroF1)
}

// TestRealMCQAllGold: an agent answering every real question with its gold
// scores 1 everywhere; with the gold written "B, D" the published grader
// loses exactly the 11 multi-letter questions.
func TestRealMCQAllGold(t *testing.T) {
	qs := loadMCQ(t, "mcq.json")
	for _, g := range MCQGraders() {
		var exact, spaced []MCQOutcome
		for _, q := range qs {
			o, _ := ScoreMCQ(q, sol(q.GoldRaw), g)
			exact = append(exact, o)
			o, _ = ScoreMCQ(q, sol(strings.ReplaceAll(q.GoldRaw, ",", ", ")), g)
			spaced = append(spaced, o)
		}
		m := AggregateMCQ(exact, g)
		if m.Accuracy != 1 || m.MacroF1 != 1 || m.MicroF1 != 1 || m.Questions != 50 {
			t.Errorf("%s gold: %+v", g, m)
		}
		s := AggregateMCQ(spaced, g)
		want := 1.0
		if g == MCQPublished {
			want = 39.0 / 50
		}
		if !near(s.Accuracy, want) {
			t.Errorf("%s spaced gold: accuracy %v, want %v", g, s.Accuracy, want)
		}
	}
}
