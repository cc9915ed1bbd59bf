package heureka

import (
	"math"
	"strings"
	"testing"
)

func TestOEQJudgePrompt(t *testing.T) {
	q := loadOEQ(t, "oeq.json")[0]
	msgs := OEQJudgePrompt(q, "MES cells rise from 4% to 11% (p=0.01).")
	if len(msgs) != 2 || msgs[0].Role != "system" || msgs[1].Role != "user" {
		t.Fatalf("messages %+v", msgs)
	}
	u := msgs[1].Content
	for _, want := range []string{q.Text, q.Answer, "MES cells rise from 4% to 11%", "PRESENT", "PARTIAL", "MISSING", "INCORRECT", "<rating>N</rating>", "Break the gold answer"} {
		if !strings.Contains(u, want) {
			t.Errorf("prompt lacks %q", want)
		}
	}
	for _, gold := range []string{q.Insight.Summary, q.Insight.How} {
		if strings.Contains(u, gold) {
			t.Errorf("prompt holds the insight's %q", clip(gold, 40))
		}
	}
	q.AtomicFacts = []string{"ADRN-baseline decreases", "MES increases"}
	if u := OEQJudgePrompt(q, "x")[1].Content; !strings.Contains(u, "F1: ADRN-baseline decreases\nF2: MES increases") || strings.Contains(u, "Break the gold answer") {
		t.Errorf("given facts not listed:\n%s", u)
	}
}

func TestParseOEQJudgement(t *testing.T) {
	good := "<facts>\nF1: PRESENT | ADRN-baseline decreases\nF2: PARTIAL | MES increases\nF3: MISSING | ALK\n</facts>\n<rating>3</rating>"
	j, err := ParseOEQJudgement(good)
	if err != nil || j.Rating != 3 || len(j.Facts) != 3 || j.Facts[1] != (LabelledFact{Partial, "MES increases"}) {
		t.Fatalf("%+v %v", j, err)
	}
	if c := j.Counts(); c[Present] != 1 || c[Partial] != 1 || c[Missing] != 1 || c[Incorrect] != 0 {
		t.Errorf("counts %v", c)
	}
	for in, rating := range map[string]int{
		"<rating>5</rating>":                       5, // the published format: the rating alone
		"```\n<rating>1</rating>\n```":             1,
		"Some words.\n<rating>4</rating>\nThanks.": 4,
	} {
		if j, err := ParseOEQJudgement(in); err != nil || j.Rating != rating {
			t.Errorf("%q: %+v %v", in, j, err)
		}
	}
	bad := map[string]string{
		"":                                     "no <rating>",
		"rating: 4":                            "no <rating>",
		"<rating>6</rating>":                   "want one digit 1-5",
		"<rating>0</rating>":                   "want one digit 1-5",
		"<rating> 4</rating>":                  "want one digit 1-5",
		"<rating>4.5</rating>":                 "want one digit 1-5",
		"<rating>45</rating>":                  "want one digit 1-5",
		"<rating>4</rating><rating>2</rating>": "2 <rating> tags",
		"<facts>\nF1: GOOD | x\n</facts><rating>3</rating>":                              "fact line",
		"<facts>\nF2: PRESENT | x\n</facts><rating>3</rating>":                           "fact F2 where F1",
		"<facts>\n</facts><rating>3</rating>":                                            "empty <facts>",
		"<facts>F1: PRESENT | a</facts><facts>F1: MISSING | b</facts><rating>3</rating>": "2 <facts> blocks",
		strings.Repeat("x", MaxJudgeResponseBytes+1):                                     "more than",
	}
	for in, want := range bad {
		if _, err := ParseOEQJudgement(in); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", clip(in, 50), err, want)
		}
	}
}

// tokensOf splits a response into tokens the way a provider might, giving
// the rating digit the alternatives alts (others get none).
func tokensOf(parts []string, rating string, alts []TopLogprob) []TokenLogprob {
	var out []TokenLogprob
	for _, p := range parts {
		tl := TokenLogprob{Token: p}
		if p == rating && alts != nil {
			tl.TopLogprobs = alts
			alts = nil // only the first occurrence
		}
		out = append(out, tl)
	}
	return out
}

func TestScoreOEQLogprobs(t *testing.T) {
	ln := math.Log
	id := QuestionID{"paper1", "insight #1", "Question1"}
	resp := "<rating>4</rating>"
	parts := []string{"<", "rating", ">", "4", "</", "rating", ">"}
	cases := []struct {
		name      string
		alts      []TopLogprob
		published float64
		ratingTok float64
		weighted  bool
	}{
		// p = .6, .3, .1 over ratings 4, 3, 5: 2.4 + .9 + .5 = 3.8.
		{"three ratings", []TopLogprob{{"4", ln(.6)}, {"3", ln(.3)}, {"5", ln(.1)}}, 3.8, 3.8, true},
		// Unnormalised (the provider's top 3 sum to .5): .3/.5, .15/.5, .05/.5 = same as above.
		{"normalised", []TopLogprob{{"4", ln(.3)}, {"3", ln(.15)}, {"5", ln(.05)}}, 3.8, 3.8, true},
		// A non-rating alternative: published counts it as 0 with its
		// probability (.5*4 + .3*3 + .2*0 = 2.9); rating-tokens renormalises
		// over 4 and 3 (.5/.8*4 + .3/.8*3 = 3.625).
		{"non-digit alternative", []TopLogprob{{"4", ln(.5)}, {"3", ln(.3)}, {" ", ln(.2)}}, 2.9, 3.625, true},
		// A digit outside 1-5: published takes its number (.5*4 + .5*7 = 5.5),
		// rating-tokens ignores it (4).
		{"digit 7", []TopLogprob{{"4", ln(.5)}, {"7", ln(.5)}}, 5.5, 4, true},
		// More than 3 alternatives: rating-tokens takes the first 3 (3);
		// published all it is given ((4+3+2+1)/4).
		{"top 3 only", []TopLogprob{{"4", ln(.25)}, {"3", ln(.25)}, {"2", ln(.25)}, {"1", ln(.25)}}, 2.5, 3, true},
		// No alternatives: the plain rating for rating-tokens; published
		// sums nothing: 0.
		{"no alternatives", []TopLogprob{}, 0, 4, false},
		// Only non-ratings: published weighs them (0); rating-tokens falls back.
		{"no rating alternative", []TopLogprob{{"x", ln(.9)}}, 0, 4, true},
	}
	for _, c := range cases {
		for _, s := range OEQScorers() {
			toks := tokensOf(parts, "4", c.alts)
			got, err := ScoreOEQ(id, resp, toks, s)
			if err != nil {
				t.Fatalf("%s %s: %v", c.name, s, err)
			}
			want, weighted := c.published, c.weighted || c.name == "no alternatives"
			if s == OEQRatingTokens {
				want = c.ratingTok
				weighted = c.weighted && c.name != "no rating alternative"
			}
			if !near(got.Score, want) || got.Weighted != weighted || got.Rating != 4 || got.Scorer != s || got.ID != id {
				t.Errorf("%s %s: %+v, want score %v weighted %v", c.name, s, got, want, weighted)
			}
		}
	}
	// Tiny log-probabilities: rating-tokens does not underflow (equal
	// weights, (4+2)/2); published's probabilities are 0/0, an error.
	tiny := tokensOf(parts, "4", []TopLogprob{{"4", -2000}, {"2", -2000}})
	if got, err := ScoreOEQ(id, resp, tiny, OEQRatingTokens); err != nil || !near(got.Score, 3) {
		t.Errorf("tiny rating-tokens: %+v %v", got, err)
	}
	if _, err := ScoreOEQ(id, resp, tiny, OEQPublished); err == nil || !strings.Contains(err.Error(), "NaN") {
		t.Errorf("tiny published: %v, want the NaN error", err)
	}
	// Without log-probabilities: the plain rating, flagged so.
	for _, s := range OEQScorers() {
		got, err := ScoreOEQ(id, resp, nil, s)
		if err != nil || got.Score != 4 || got.Weighted {
			t.Errorf("%s without log-probabilities: %+v %v", s, got, err)
		}
	}
}

// TestScoreOEQRatingToken: under rating-tokens the rating token is found
// by its place in the response, not by the first token that equals the
// rating (the published rule, which a fact numbered like the rating would
// fool); when the tokens do not spell the response the published rule is
// used. Published always takes the first.
func TestScoreOEQRatingToken(t *testing.T) {
	id := QuestionID{"p", "i", "Question1"}
	resp := "<facts>\nF1: PRESENT | a\nF2: PRESENT | b\nF3: MISSING | x\n</facts>\n<rating>3</rating>"
	parts := []string{"<facts>\nF1: PRESENT | a\nF2: PRESENT | b\n", "F", "3", ": MISSING | x\n</facts>\n<rating>", "3", "</rating>"}
	if strings.Join(parts, "") != resp {
		t.Fatal("the tokens do not spell the response")
	}
	toks := tokensOf(parts, "", nil)
	toks[2].TopLogprobs = []TopLogprob{{"3", math.Log(.5)}, {"1", math.Log(.5)}} // the fact number's alternatives
	toks[4].TopLogprobs = []TopLogprob{{"3", math.Log(.5)}, {"5", math.Log(.5)}} // the rating's
	got, err := ScoreOEQ(id, resp, toks, OEQRatingTokens)
	if err != nil || !near(got.Score, 4) || !got.Weighted {
		t.Errorf("by place: %+v %v; want (3+5)/2 = 4", got, err)
	}
	// Published: the first token "3" (the decoy), as the published code.
	got, err = ScoreOEQ(id, resp, toks, OEQPublished)
	if err != nil || !near(got.Score, 2) {
		t.Errorf("published: %+v %v; want (3+1)/2 = 2", got, err)
	}
	// Tokens that do not spell the response: the first token "3" (the decoy).
	toks[1].Token = "G"
	got, err = ScoreOEQ(id, resp, toks, OEQRatingTokens)
	if err != nil || !near(got.Score, 2) {
		t.Errorf("rating-tokens fallback: %+v %v; want (3+1)/2 = 2", got, err)
	}
	// No token is the rating: the plain rating for rating-tokens, the
	// published code's ValueError for published.
	got, err = ScoreOEQ(id, resp, []TokenLogprob{{Token: resp}}, OEQRatingTokens)
	if err != nil || got.Score != 3 || got.Weighted {
		t.Errorf("no rating token: %+v %v", got, err)
	}
	if _, err = ScoreOEQ(id, resp, []TokenLogprob{{Token: resp}}, OEQPublished); err == nil || !strings.Contains(err.Error(), "ValueError") {
		t.Errorf("no rating token, published: %v", err)
	}
	// A fenced response: the offset accounts for the fence.
	fenced := "```\n<rating>2</rating>\n```"
	ft := []TokenLogprob{{Token: "```\n<rating>"}, {Token: "2", TopLogprobs: []TopLogprob{{"2", 0}}}, {Token: "</rating>\n```"}}
	if got, err := ScoreOEQ(id, fenced, ft, OEQRatingTokens); err != nil || got.Score != 2 || !got.Weighted {
		t.Errorf("fenced: %+v %v", got, err)
	}
}

func TestScoreOEQFailures(t *testing.T) {
	id := QuestionID{"p", "i", "Question1"}
	if _, err := ScoreOEQ(id, "I rate it four.", nil, OEQPublished); err == nil {
		t.Error("no rating accepted (the published batch path scores it 0)")
	}
	if _, err := ScoreOEQ(id, "<rating>4</rating>", nil, "heureka-oeq-other@1"); err == nil {
		t.Error("unknown scorer accepted")
	}
	bad := []TokenLogprob{{Token: "<rating>"}, {Token: "4", TopLogprobs: []TopLogprob{{"4", math.NaN()}}}, {Token: "</rating>"}}
	if _, err := ScoreOEQ(id, "<rating>4</rating>", bad, OEQPublished); err == nil {
		t.Error("NaN log-probability accepted")
	}
	bad[1].TopLogprobs[0].Logprob = 0.5
	if _, err := ScoreOEQ(id, "<rating>4</rating>", bad, OEQRatingTokens); err == nil {
		t.Error("positive log-probability accepted")
	}
	// Published reads the first <rating>digits</rating>, whatever else
	// the response holds (rating-tokens refuses two ratings or a 9).
	for resp, want := range map[string]float64{"<rating>2</rating><rating>5</rating>": 2, "<rating>9</rating>": 9, "<rating>x</rating><rating>3</rating>": 3} {
		if got, err := ScoreOEQ(id, resp, nil, OEQPublished); err != nil || got.Score != want {
			t.Errorf("published %q: %+v %v, want %v", resp, got, err, want)
		}
		if _, err := ScoreOEQ(id, resp, nil, OEQRatingTokens); err == nil && want != 3 {
			t.Errorf("rating-tokens %q accepted", resp)
		}
	}
}

func TestSummariseOEQ(t *testing.T) {
	id := QuestionID{"p", "i", "Question1"}
	scores := []OEQScore{
		{ID: id, Scorer: OEQPublished, Score: 3.8, Rating: 4, Weighted: true},
		{ID: id, Scorer: OEQPublished, Score: 2, Rating: 2},
		UnansweredOEQ(id, OEQPublished),
	}
	s, err := SummariseOEQ(scores, OEQPublished)
	// (3.8 + 2) / 2: the published code skips the unanswered question.
	if err != nil || !near(s.Mean, 2.9) || s.Weighted != 1 || s.Plain != 1 || s.Unanswered != 1 || s.Mode != "mixed" || s.Questions != 3 {
		t.Errorf("%+v %v", s, err)
	}
	if s, _ := SummariseOEQ(scores[:1], OEQPublished); s.Mode != "weighted" {
		t.Errorf("mode %q", s.Mode)
	}
	if s, _ := SummariseOEQ(scores[1:], OEQPublished); s.Mode != "plain" {
		t.Errorf("mode %q", s.Mode)
	}
	if _, err := SummariseOEQ(scores, OEQRatingTokens); err == nil {
		t.Error("scores of another scorer mixed")
	}
	// Rating-tokens counts the unanswered question as 1: (3.8 + 2 + 1) / 3.
	rt := []OEQScore{{ID: id, Scorer: OEQRatingTokens, Score: 3.8, Weighted: true}, {ID: id, Scorer: OEQRatingTokens, Score: 2},
		UnansweredOEQ(id, OEQRatingTokens)}
	if s, err := SummariseOEQ(rt, OEQRatingTokens); err != nil || !near(s.Mean, 6.8/3) {
		t.Errorf("rating-tokens: %+v %v", s, err)
	}
	if s, _ := SummariseOEQ(scores[2:], OEQPublished); s.Mean != 0 || s.Unanswered != 1 {
		t.Errorf("published, none answered: %+v", s)
	}
}
