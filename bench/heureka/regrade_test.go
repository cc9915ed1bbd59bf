package heureka

import (
	"encoding/json"
	"math"
	"strings"
	"testing"
)

func TestParseJudgeAnswers(t *testing.T) {
	cases := []struct {
		name, in string
		content  string
		tokens   int
		err      string
	}{
		{"text", `{"p":{"i":{"Question1":"<rating>3</rating>"}}}`, "<rating>3</rating>", 0, ""},
		{"content and logprobs", `{"p":{"i":{"Question1":{"content":"<rating>3</rating>","logprobs":[{"token":"<rating>","logprob":0,"top_logprobs":[]},{"token":"3","logprob":-0.1,"top_logprobs":[{"token":"3","logprob":-0.1}]}]}}}}`, "<rating>3</rating>", 2, ""},
		{"chat completion", `{"p":{"i":{"Question1":{"id":"x","choices":[{"message":{"role":"assistant","content":"<rating>4</rating>"},"logprobs":{"content":[{"token":"4","logprob":0,"top_logprobs":[]}]}}]}}}}`, "<rating>4</rating>", 1, ""},
		{"no content", `{"p":{"i":{"Question1":{"choices":[]}}}}`, "", 0, "no content"},
		{"number", `{"p":{"i":{"Question1":4}}}`, "", 0, "want a string"},
		{"flat", `{"Question1":"x"}`, "", 0, "want {paper"},
	}
	for _, c := range cases {
		got, err := ParseJudgeAnswers([]byte(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want %q", c.name, err, c.err)
			}
			continue
		}
		a, ok := got[QuestionID{"p", "i", "Question1"}]
		if err != nil || !ok || a.Content != c.content || len(a.Logprobs) != c.tokens {
			t.Errorf("%s: %+v %v", c.name, got, err)
		}
	}
}

// TestRegradeMCQ: final messages and extracted answers grade the same; a
// missing answer is unanswered; an answer for no question is an error.
func TestRegradeMCQ(t *testing.T) {
	qs := []MCQ{
		{ID: QuestionID{"p", "i", "Question1"}, Gold: []string{"A"}, GoldRaw: "A"},
		{ID: QuestionID{"p", "i", "Question2"}, Gold: []string{"B", "D"}, GoldRaw: "B,D"},
		{ID: QuestionID{"p", "j", "Question1"}, Gold: []string{"C"}, GoldRaw: "C"},
	}
	answers := map[QuestionID]string{qs[0].ID: "A", qs[1].ID: "B, D"}
	finals := map[QuestionID]string{qs[0].ID: "I think <solution>A</solution>", qs[1].ID: "<solution>B, D</solution>"}
	a, err := RegradeMCQ(qs, answers, false, MCQGraders())
	if err != nil {
		t.Fatal(err)
	}
	f, err := RegradeMCQ(qs, finals, true, MCQGraders())
	if err != nil {
		t.Fatal(err)
	}
	for i := range a {
		if a[i].Metrics != f[i].Metrics {
			t.Errorf("%s: answers %+v, finals %+v", a[i].Grader, a[i].Metrics, f[i].Metrics)
		}
	}
	// Published: Q1 exact, Q2 {B, " D"}: P 1/2 R 1/2; Q3 left out but in
	// the accuracy. Trimmed: Q1, Q2 exact, Q3 counted 0.
	pub, tr := a[0].Metrics, a[1].Metrics
	if a[0].Origin != OriginPublished || pub.Correct != 1 || math.Abs(pub.Accuracy-1.0/3) > 1e-12 || math.Abs(pub.MacroPrecision-0.75) > 1e-12 {
		t.Errorf("published: %+v (%s)", pub, a[0].Origin)
	}
	if a[1].Origin != OriginRepronet || tr.Correct != 2 || math.Abs(tr.MacroPrecision-2.0/3) > 1e-12 || tr.Answered != 2 {
		t.Errorf("trimmed: %+v (%s)", tr, a[1].Origin)
	}
	none, err := RegradeMCQ(qs, nil, true, []MCQGrader{MCQPublished})
	if err != nil || none[0].Undefined == "" {
		t.Errorf("nothing answered: %+v %v, want the published code's undefined figures said", none, err)
	}
	if _, err := RegradeMCQ(qs, map[QuestionID]string{{"p", "x", "Question9"}: "A"}, true, MCQGraders()); err == nil || !strings.Contains(err.Error(), "p/x/Question9") {
		t.Errorf("an answer for no question: %v", err)
	}
	if _, err := RegradeMCQ(qs, map[QuestionID]string{qs[0].ID: "<solution>A</solution>"}, false, MCQGraders()); err == nil {
		t.Error("an extracted answer with a tag accepted")
	}
	if _, err := RegradeMCQ(qs, answers, false, []MCQGrader{"heureka-mcq-other@1"}); err == nil {
		t.Error("unknown grader accepted")
	}
}

func TestRegradeOEQ(t *testing.T) {
	qs := []OEQ{{ID: QuestionID{"p", "i", "Question1"}}, {ID: QuestionID{"p", "i", "Question2"}}, {ID: QuestionID{"p", "j", "Question1"}}}
	toks := []TokenLogprob{{Token: "<rating>"}, {Token: "4", TopLogprobs: []TopLogprob{{"4", math.Log(.5)}, {"2", math.Log(.5)}}}, {Token: "</rating>"}}
	judged := map[QuestionID]JudgeAnswer{qs[0].ID: {Content: "<rating>4</rating>", Logprobs: toks}, qs[1].ID: {Content: "<rating>2</rating>"}}
	out, err := RegradeOEQ(qs, judged, OEQScorers())
	if err != nil {
		t.Fatal(err)
	}
	// Published: (3 + 2) / 2, the unanswered question left out;
	// rating-tokens: (3 + 2 + 1) / 3.
	if out[0].Scorer != OEQPublished || math.Abs(out[0].Summary.Mean-2.5) > 1e-12 || out[0].Summary.Unanswered != 1 {
		t.Errorf("published: %+v", out[0].Summary)
	}
	if out[1].Scorer != OEQRatingTokens || math.Abs(out[1].Summary.Mean-2) > 1e-12 || out[1].Origin != OriginRepronet {
		t.Errorf("rating-tokens: %+v", out[1].Summary)
	}
	judged[qs[2].ID] = JudgeAnswer{Content: "four"}
	if _, err := RegradeOEQ(qs, judged, OEQScorers()); err == nil || !strings.Contains(err.Error(), "p/j/Question1") {
		t.Errorf("an unusable judge answer: %v", err)
	}
	b, err := json.Marshal(out[0])
	if err != nil || !strings.Contains(string(b), `"mean":2.5`) {
		t.Errorf("JSON %s %v", b, err)
	}
}

func FuzzParseJudgeAnswers(f *testing.F) {
	f.Add([]byte(`{"p":{"i":{"Question1":"<rating>3</rating>"}}}`))
	f.Add([]byte(`{"p":{"i":{"Question1":{"choices":[{"message":{"content":"x"},"logprobs":{"content":[]}}]}}}}`))
	f.Add([]byte(`{"p":{"i":{"Question1":{"content":"x","logprobs":null}}}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := ParseJudgeAnswers(data)
		if err != nil {
			return
		}
		for id, a := range got {
			for _, s := range OEQScorers() {
				_, _ = ScoreOEQ(id, a.Content, a.Logprobs, s) // must not panic
			}
		}
	})
}
