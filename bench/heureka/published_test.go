package heureka

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// publishedScript finds HeurekaBench's own evaluate_agent_answer.py
// (scheurekabench/ of mlbio-epfl/HeurekaBench): $HEUREKA_PUBLISHED_CODE, or
// beside the real question files. repronet does not ship it.
func publishedScript(t *testing.T) string {
	t.Helper()
	for _, p := range []string{os.Getenv("HEUREKA_PUBLISHED_CODE"), filepath.Join(sharedHeureka, "evaluate_agent_answer.py")} {
		if p == "" {
			continue
		}
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("HeurekaBench's evaluate_agent_answer.py is not here: set HEUREKA_PUBLISHED_CODE to its path to compare the published graders with it")
	return ""
}

// python returns Debian's python3 (with python3-numpy, scripts/setup.sh).
func python(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/python3", "python3"} {
		if path, err := exec.LookPath(p); err == nil {
			if exec.Command(path, "-c", "import numpy").Run() == nil {
				return path
			}
		}
	}
	t.Fatal("python3 with numpy is required (scripts/setup.sh installs python3-numpy)")
	return ""
}

type harnessCase struct {
	Results map[string]map[string]map[string]string `json:"results"`
	Judge   map[string]harnessJudge                 `json:"judge,omitempty"`
}

type harnessJudge struct {
	Content  string         `json:"content"`
	Logprobs []TokenLogprob `json:"logprobs"`
}

// runHarness runs testdata/published_harness.py over the cases.
func runHarness(t *testing.T, kind, dataset string, cases []harnessCase) []map[string]json.RawMessage {
	t.Helper()
	req, err := json.Marshal(map[string]any{"script": publishedScript(t), "dataset": dataset, "kind": kind, "cases": cases})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python(t), "testdata/published_harness.py")
	cmd.Stdin = bytes.NewReader(req)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("published harness: %v\n%s", err, stderr.String())
	}
	var res []map[string]json.RawMessage
	if err := json.Unmarshal(out, &res); err != nil || len(res) != len(cases) {
		t.Fatalf("published harness output: %v (%d results for %d cases)", err, len(res), len(cases))
	}
	return res
}

func num(t *testing.T, m map[string]json.RawMessage, k string) float64 {
	t.Helper()
	var v float64
	if err := json.Unmarshal(m[k], &v); err != nil {
		t.Fatalf("%s: %v (%s)", k, err, m[k])
	}
	return v
}

func put(res map[string]map[string]map[string]string, id QuestionID, answer string) {
	if res[id.Paper] == nil {
		res[id.Paper] = map[string]map[string]string{}
	}
	if res[id.Paper][id.Insight] == nil {
		res[id.Paper][id.Insight] = map[string]string{}
	}
	res[id.Paper][id.Insight][id.Question] = answer
}

// mcqFormats are the ways an answer is written, from the gold letters;
// "" with ok false is no answer.
func mcqFormat(gold []string, k int) (string, bool) {
	all := []string{"A", "B", "C", "D"}
	wrong := "A"
	for _, l := range all {
		if !strings.Contains(strings.Join(gold, ","), l) {
			wrong = l
			break
		}
	}
	rev := make([]string, len(gold))
	for i, g := range gold {
		rev[len(gold)-1-i] = g
	}
	formats := []string{
		strings.Join(gold, ","), strings.Join(gold, ", "), strings.Join(rev, ","), strings.Join(append([]string{wrong}, gold...), ","),
		wrong, "", " " + strings.Join(gold, ",") + " ", strings.ToLower(strings.Join(gold, ",")), strings.Join(gold, ",,"),
		gold[0], gold[0] + "," + gold[0], "A,B,C,D", strings.Join(gold, ",") + ",", "The answer is " + gold[0], "-",
	}
	if k%len(formats) == 0 || k%7 == 3 {
		return "", false
	}
	return formats[k%len(formats)], true
}

// TestMCQPublishedEqualsPublishedCode: heureka-mcq-published gives the
// published code's figures on the real questions, answered in many
// formats, with questions left unanswered.
func TestMCQPublishedEqualsPublishedCode(t *testing.T) {
	data := readShared(t, "mcq.json")
	qs, err := ParseMCQFile(data)
	if err != nil {
		t.Fatal(err)
	}
	const nCases = 41
	var cases []harnessCase
	var ours []MCQMetrics
	unanswered := 0
	for c := 0; c < nCases; c++ {
		hc := harnessCase{Results: map[string]map[string]map[string]string{}}
		var outs []MCQOutcome
		for i, q := range qs {
			answer, ok := mcqFormat(q.Gold, c*len(qs)+i*(c+1))
			if c == nCases-1 {
				ok = false // a case with nothing answered
			}
			final := "no answer"
			if ok {
				put(hc.Results, q.ID, answer)
				final = "<solution>" + answer + "</solution>"
			} else {
				unanswered++
			}
			o, err := ScoreMCQ(q, final, MCQPublished)
			if err != nil {
				t.Fatal(err)
			}
			outs = append(outs, o)
		}
		cases = append(cases, hc)
		ours = append(ours, AggregateMCQ(outs, MCQPublished))
	}
	res := runHarness(t, "mcq", filepath.Join(sharedHeureka, "mcq.json"), cases)
	for c, r := range res {
		m := ours[c]
		if e, ok := r["error"]; ok || m.Undefined() != nil {
			if !ok || m.Undefined() == nil || !strings.Contains(string(e), "StatisticsError") {
				t.Errorf("case %d: the published code: %s; ours: %v", c, e, m.Undefined())
			}
			continue
		}
		got := map[string]float64{"total": float64(m.Questions), "correct": float64(m.Correct), "answered": float64(m.Answered),
			"accuracy": m.Accuracy, "macro_precision": m.MacroPrecision, "macro_recall": m.MacroRecall,
			"micro_precision": m.MicroPrecision, "micro_recall": m.MicroRecall, "micro_f1": m.MicroF1}
		if string(r["macro_f1"]) != "null" {
			got["macro_f1"] = m.MacroF1
		} else if m.MacroF1 != 0 || m.Answered != 0 {
			t.Errorf("case %d: the published macro F1 is undefined (nothing answered), ours %v over %d answered", c, m.MacroF1, m.Answered)
		}
		for k, v := range got {
			if want := num(t, r, k); math.Abs(v-want) > 1e-12 {
				t.Errorf("case %d: %s %v, published code %v", c, k, v, want)
			}
		}
	}
	t.Logf("%d cases, %d answers, %d unanswered: equal to the published code", nCases, nCases*len(qs), unanswered)
}

// judgeAnswer makes a synthetic judge answer for question i of case c: a
// rating, facts numbered like ratings before it (decoys for the
// published "first token with the rating's text"), and alternatives with
// digits, ratings out of range and non-digits.
func judgeAnswer(c, i int) harnessJudge {
	k := c*131 + i*17
	rating := 1 + k%5
	nFacts := k % 6
	var parts []string
	parts = append(parts, "<facts>\n")
	for f := 1; f <= nFacts; f++ {
		label := []string{"PRESENT", "PARTIAL", "MISSING", "INCORRECT"}[(k+f)%4]
		parts = append(parts, "F", fmt.Sprint(f), ": "+label+" | fact "+fmt.Sprint(f)+"\n")
	}
	parts = append(parts, "</facts>\n<rating>", fmt.Sprint(rating), "</rating>")
	if nFacts == 0 {
		parts = []string{"<rating>", fmt.Sprint(rating), "</rating>"}
	}
	altTokens := [][]string{{"1", "2", "3", "4", "5"}, {"3", " ", "4"}, {"5", "4"}, {"2", "x", "10"}, {"4"}, {"1", "5", "07", "<"}}
	var toks []TokenLogprob
	for j, p := range parts {
		tl := TokenLogprob{Token: p, Logprob: -0.01}
		if _, err := fmt.Sscan(p, new(int)); err == nil {
			alts := altTokens[(k+j)%len(altTokens)]
			for a, tok := range alts {
				tl.TopLogprobs = append(tl.TopLogprobs, TopLogprob{Token: tok, Logprob: -0.05 - float64((k+a*a+j)%23)/3})
			}
			if len(alts) > 3 && (k+j)%2 == 0 {
				tl.TopLogprobs = tl.TopLogprobs[:3]
			}
		}
		toks = append(toks, tl)
	}
	return harnessJudge{Content: strings.Join(parts, ""), Logprobs: toks}
}

// TestOEQPublishedEqualsPublishedCode: heureka-oeq-published scores
// synthetic judge answers on the real questions as the published code
// does, question by question and on average, leaving unanswered
// questions out; where the published code crashes, ScoreOEQ errs.
func TestOEQPublishedEqualsPublishedCode(t *testing.T) {
	data := readShared(t, "oeq.json")
	qs, err := ParseOEQFile(data)
	if err != nil {
		t.Fatal(err)
	}
	const nCases = 44
	type ourCase struct {
		scores map[string]float64
		mean   float64
		err    error
	}
	var cases []harnessCase
	var ours []ourCase
	differ := 0
	for c := 0; c < nCases; c++ {
		hc := harnessCase{Results: map[string]map[string]map[string]string{}, Judge: map[string]harnessJudge{}}
		oc := ourCase{scores: map[string]float64{}}
		var scores []OEQScore
		for i, q := range qs {
			if (c+i)%9 == 4 {
				scores = append(scores, UnansweredOEQ(q.ID, OEQPublished))
				continue
			}
			answer := fmt.Sprintf("answer %d to %s", c, q.ID)
			put(hc.Results, q.ID, answer)
			j := judgeAnswer(c, i)
			switch {
			case c == nCases-1 && i == 7:
				j.Content = "I rate it four." // no rating: the published code's IndexError
			case c == nCases-2 && i == 3:
				j.Logprobs = []TokenLogprob{{Token: j.Content}} // no rating token: its ValueError
			}
			hc.Judge[answer] = j
			if oc.err != nil {
				continue
			}
			sc, err := ScoreOEQ(q.ID, j.Content, j.Logprobs, OEQPublished)
			if err != nil {
				oc.err = err
				continue
			}
			rt, rtErr := ScoreOEQ(q.ID, j.Content, j.Logprobs, OEQRatingTokens)
			if rtErr == nil && math.Abs(rt.Score-sc.Score) > 1e-9 {
				differ++
			}
			oc.scores[q.ID.String()] = sc.Score
			scores = append(scores, sc)
		}
		if oc.err == nil {
			sum, err := SummariseOEQ(scores, OEQPublished)
			if err != nil {
				t.Fatal(err)
			}
			oc.mean = sum.Mean
		}
		cases = append(cases, hc)
		ours = append(ours, oc)
	}
	res := runHarness(t, "oe", filepath.Join(sharedHeureka, "oeq.json"), cases)
	compared := 0
	for c, r := range res {
		_, crashed := r["error"]
		if crashed != (ours[c].err != nil) {
			t.Errorf("case %d: published code %s, ScoreOEQ error %v", c, r["error"], ours[c].err)
			continue
		}
		if crashed {
			t.Logf("case %d: published code %s; ScoreOEQ: %v", c, r["error"], ours[c].err)
			continue
		}
		if got, want := ours[c].mean, num(t, r, "mean"); math.Abs(got-want) > 1e-9 {
			t.Errorf("case %d: mean %v, published code %v", c, got, want)
		}
		var pubScores map[string]float64
		if err := json.Unmarshal(r["scores"], &pubScores); err != nil {
			t.Fatal(err)
		}
		for id, want := range pubScores {
			got, ok := ours[c].scores[id]
			if !ok || math.Abs(got-want) > 1e-9 {
				t.Errorf("case %d %s: %v, published code %v", c, id, got, want)
			}
			compared++
		}
		if len(pubScores) != len(ours[c].scores) {
			t.Errorf("case %d: published code scored %d questions, ours %d", c, len(pubScores), len(ours[c].scores))
		}
	}
	if compared < 1500 || differ == 0 {
		t.Errorf("%d scores compared, %d where repronet's rule differs: the cases do not exercise the difference", compared, differ)
	}
	t.Logf("%d judge answers compared with the published code; heureka-oeq-rating-tokens differs on %d", compared, differ)
}
