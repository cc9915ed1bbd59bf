package heureka

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func addShared(f *testing.F, names ...string) {
	for _, n := range names {
		if data, err := os.ReadFile(filepath.Join(sharedHeureka, n)); err == nil {
			f.Add(data)
		}
	}
}

func FuzzParseMCQFile(f *testing.F) {
	f.Add([]byte(`{"p": {"i": {"summary": "s", "how": "h", "relevant": "r", "data": {}, "mcq_question": "**Question1:** Q\nA) a\nB) b\nC) c\nD) d\n**Answer1:** A,C"}}}`))
	f.Add([]byte(`{"p": {"i": {"summary": "s", "how": "h", "relevant": "r", "data": {"x": "y"}, "mcq_question": "**Question1:** Q\nA)a\n\nB) b\nC) c\nD) d\n**Answer1:**D\n**Question2:** R\nA) a\nB) b\nC) c\nD) d\n**Answer2:** B"}}}`))
	addShared(f, "mcq_lite.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		qs, err := ParseMCQFile(data)
		if err != nil {
			return
		}
		for _, q := range qs {
			if len(q.Options) != 4 || len(q.Gold) == 0 || q.Text == "" || strings.Join(q.Gold, ",") == "" {
				t.Fatalf("accepted %+v", q)
			}
			// The gold answer always scores exactly, under both graders.
			for _, g := range MCQGraders() {
				o, err := ScoreMCQ(q, "<solution>"+q.GoldRaw+"</solution>", g)
				if err != nil || !o.Exact || o.F1 != 1 {
					t.Fatalf("gold of %s under %s: %+v %v", q.ID, g, o, err)
				}
			}
		}
	})
}

func FuzzParseOEQFile(f *testing.F) {
	f.Add([]byte(`{"p": {"i": {"summary": "s", "how": "h", "relevant": "r", "data": {}, "oe_question": "**Question1:** Q?\n**Answer1:** A."}}}`))
	addShared(f, "oeq_lite.json")
	f.Fuzz(func(t *testing.T, data []byte) {
		qs, err := ParseOEQFile(data)
		if err != nil {
			return
		}
		seen := map[QuestionID]bool{}
		for _, q := range qs {
			if q.Text == "" || q.Answer == "" || seen[q.ID] {
				t.Fatalf("accepted %+v", q)
			}
			seen[q.ID] = true
		}
	})
}

func FuzzScoreMCQ(f *testing.F) {
	for _, s := range []string{"<solution>B,D</solution>", "<solution>B, D</solution>", "<solution><solution>A</solution>", "", "<solution></solution>", "<solution>Z,,A</solution>"} {
		f.Add(s)
	}
	q := MCQ{ID: QuestionID{"p", "i", "Question1"}, Gold: []string{"B", "D"}, GoldRaw: "B,D"}
	f.Fuzz(func(t *testing.T, final string) {
		for _, g := range MCQGraders() {
			o, err := ScoreMCQ(q, final, g)
			if err != nil {
				t.Fatal(err)
			}
			if o.TP+o.FN != 2 || o.TP+o.FP != len(o.Predicted) || o.Precision < 0 || o.Precision > 1 || o.Recall < 0 || o.Recall > 1 || o.F1 < 0 || o.F1 > 1 {
				t.Fatalf("%+v", o)
			}
			if o.Exact != (o.Answered && strings.Join(o.Predicted, ",") == "B,D") {
				t.Fatalf("exact %v for %q", o.Exact, o.Predicted)
			}
		}
	})
}

func FuzzScoreOEQ(f *testing.F) {
	f.Add("<rating>4</rating>", "4", -0.5, "3", -1.0)
	f.Add("```\n<facts>\nF1: PRESENT | x\n</facts>\n<rating>2</rating>\n```", "2", 0.0, "x", -3.0)
	f.Add("<rating>9</rating>", "9", -0.1, "1", -100.0)
	f.Fuzz(func(t *testing.T, resp, tok string, lp float64, alt string, lp2 float64) {
		j, jerr := ParseOEQJudgement(resp)
		toks := []TokenLogprob{{Token: resp}, {Token: tok, TopLogprobs: []TopLogprob{{tok, lp}, {alt, lp2}}}}
		for _, s := range OEQScorers() {
			sc, err := ScoreOEQ(QuestionID{"p", "i", "Question1"}, resp, toks, s)
			if s == OEQPublished {
				// The published rule reads any first <rating>digits</rating>;
				// a score it gives is a number, and its rating is the tag's.
				if err == nil && (math.IsNaN(sc.Score) || math.IsInf(sc.Score, 0) || sc.Rating < 0) {
					t.Fatalf("published: %+v", sc)
				}
				continue
			}
			if jerr != nil {
				if err == nil {
					t.Fatalf("a response ParseOEQJudgement refuses was scored: %q", resp)
				}
				continue
			}
			if err != nil {
				if !(math.IsNaN(lp) || math.IsNaN(lp2) || lp > 0 || lp2 > 0 || math.IsInf(lp, 1) || math.IsInf(lp2, 1)) {
					t.Fatalf("%s: %v", s, err)
				}
				continue
			}
			if sc.Rating != j.Rating || j.Rating < 1 || j.Rating > 5 || math.IsNaN(sc.Score) {
				t.Fatalf("%s: %+v", s, sc)
			}
			if s == OEQRatingTokens && (sc.Score < 1 || sc.Score > 5) {
				t.Fatalf("rating-tokens score %v out of [1, 5]", sc.Score)
			}
			if !sc.Weighted && sc.Score != float64(sc.Rating) {
				t.Fatalf("plain score %v for rating %d", sc.Score, sc.Rating)
			}
		}
	})
}
