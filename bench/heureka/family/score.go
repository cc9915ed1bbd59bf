package family

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/heureka"
	"github.com/repronet/repronet/bench/internal/judging"
)

// Public is what a leaderboard reader sees of a scored question: its
// figures, never the answer, the gold or the judge's facts.
type Public struct {
	Kind     string `json:"kind"`
	Answered bool   `json:"answered"`
	// MCQ holds the question's figures under each grader; OEQ its score
	// under each scorer, and Judge what judging it used.
	MCQ   []MCQPublic `json:"mcq,omitempty"`
	OEQ   []OEQPublic `json:"oeq,omitempty"`
	Judge *JudgeUse   `json:"judge,omitempty"`
}

// MCQPublic is one question's figures under one grader.
type MCQPublic struct {
	Grader    heureka.MCQGrader `json:"grader"`
	Exact     bool              `json:"exact"`
	TP        int               `json:"tp"`
	FP        int               `json:"fp"`
	FN        int               `json:"fn"`
	Predicted int               `json:"predicted"`
	Precision float64           `json:"precision"`
	Recall    float64           `json:"recall"`
	F1        float64           `json:"f1"`
}

// OEQPublic is one question's score under one scorer: Weighted says
// whether it is the probability-weighted rating (the provider returned
// log-probabilities) or the plain one.
type OEQPublic struct {
	Scorer     heureka.OEQScorer `json:"scorer"`
	Score      float64           `json:"score"`
	Rating     int               `json:"rating"`
	Weighted   bool              `json:"weighted"`
	Unanswered bool              `json:"unanswered,omitempty"`
}

// JudgeUse is what judge calls used, priced at the config's prices
// (judging.Use).
type JudgeUse = judging.Use

// Verdict is the scorer's full record: admin eyes only (it holds the gold
// answer and the judge's labelled facts).
type Verdict struct {
	Public
	Scoring Scoring `json:"scoring"`
	Outcome string  `json:"outcome"`
	Detail  string  `json:"detail,omitempty"`
	// Final is the agent's final message (clipped), Solution what its
	// last <solution> holds.
	Final    string `json:"final,omitempty"`
	Solution string `json:"solution,omitempty"`
	Gold     string `json:"gold"`
	// Facts are the judge's labelled facts; JudgeResponse its answer as
	// it came (the gateway records the call too).
	Facts         []heureka.LabelledFact `json:"facts,omitempty"`
	JudgeResponse string                 `json:"judge_response,omitempty"`
}

// Score scores an answer: a multiple-choice one under both graders, an
// open-ended one by the judge under both scorers. An answer not returned
// is unanswered (scored, without error); a judge that does not answer, or
// answers unusably, is an error (the core retries the scoring: not the
// agent's doing).
func (s *Suite) Score(ctx context.Context, in bench.ScoreInput) (bench.Score, error) {
	q, err := s.question(in.Task.ID, in.Variant, in.Stage)
	if err != nil {
		return bench.Score{}, err
	}
	if in.Output == nil {
		return bench.Score{}, fmt.Errorf("question %s: no output reader", q.id)
	}
	v := Verdict{Public: Public{Kind: q.kind}, Scoring: s.scoring(q.kind), Outcome: in.Outcome}
	final, err := in.Output(ctx, AnswerFile)
	switch {
	case errors.Is(err, bench.ErrNotReturned):
		v.Detail, final = fmt.Sprintf("no final message: %v", err), nil
	case err != nil:
		return bench.Score{}, fmt.Errorf("question %s: read %s: %w", q.id, AnswerFile, err)
	}
	v.Final = judging.Clip(string(final), 4096)
	v.Solution, v.Answered = heureka.ExtractSolution(string(final))
	var g bench.Grading
	var value float64
	switch q.kind {
	case KindMCQ:
		v.Gold = q.mcq.GoldRaw
		for _, gr := range heureka.MCQGraders() {
			o, err := heureka.ScoreMCQ(*q.mcq, string(final), gr)
			if err != nil {
				return bench.Score{}, fmt.Errorf("question %s: %w", q.id, err)
			}
			v.MCQ = append(v.MCQ, MCQPublic{Grader: gr, Exact: o.Exact, TP: o.TP, FP: o.FP, FN: o.FN, Predicted: len(o.Predicted),
				Precision: o.Precision, Recall: o.Recall, F1: o.F1})
			g.Checks = append(g.Checks, o.Exact)
		}
		// The job's value and pass: exact under the trimmed grader.
		g.Pass = v.MCQ[len(v.MCQ)-1].Exact
		if g.Pass {
			value = 1
		}
	case KindOEQ:
		v.Gold = q.oeq.Answer
		if err := s.judge(ctx, in.Models, q, &v); err != nil {
			return bench.Score{}, fmt.Errorf("question %s: %w", q.id, err)
		}
		// Replicas compare on the rating's steps; the value is the
		// published score mapped from [1, 5] to [0, 1].
		r := v.OEQ[0].Rating
		g = bench.Grading{Pass: r == 5, Checks: []bool{r >= 2, r >= 3, r >= 4, r >= 5}}
		value = min(1, max(0, (v.OEQ[0].Score-1)/4))
	}
	out := bench.Score{Comparable: bench.Comparable{Grading: &g}, Value: value}
	var errs [3]error
	out.Scoring, errs[0] = json.Marshal(v.Scoring)
	out.Verdict, errs[1] = json.Marshal(v)
	out.Public, errs[2] = json.Marshal(v.Public)
	if err := errors.Join(errs[:]...); err != nil {
		return bench.Score{}, fmt.Errorf("question %s: encode score: %w", q.id, err)
	}
	return out, nil
}

// Judge calls: a failed call (the gateway or the provider refused) is
// tried judgeTries times in all, judgeRetryDelay apart, doubling.
const (
	judgeTries      = 3
	judgeRetryDelay = 500 * time.Millisecond
)

// judge rates an open-ended answer: unanswered, 1 under every scorer and
// no judge asked; else one judge call, scored under every scorer from
// the same response.
func (s *Suite) judge(ctx context.Context, models bench.Models, q *question, v *Verdict) error {
	if !v.Answered {
		for _, sc := range heureka.OEQScorers() {
			u := heureka.UnansweredOEQ(q.oeq.ID, sc)
			v.OEQ = append(v.OEQ, OEQPublic{Scorer: sc, Score: u.Score, Rating: u.Rating, Unanswered: true})
		}
		return nil
	}
	body, err := JudgeRequest(s.cfg.Judge, heureka.OEQJudgePrompt(*q.oeq, v.Solution))
	if err != nil {
		return err
	}
	resp, err := judging.Call(ctx, models, body, judgeTries, judgeRetryDelay)
	if err != nil {
		return fmt.Errorf("judge %s: %w", s.cfg.Judge.Model, err)
	}
	a, err := judging.ReadAnswer(resp)
	use := judging.Priced(1, []judging.Tally{{Model: s.cfg.Judge.Model, In: a.In, Out: a.Out}}, s.cfg.Prices)
	v.Judge = &use
	if err != nil {
		return err
	}
	var tokens []heureka.TokenLogprob
	if a.Logprobs != nil {
		if err := json.Unmarshal(a.Logprobs, &tokens); err != nil {
			return fmt.Errorf("judge %s: log-probabilities: %w", s.cfg.Judge.Model, err)
		}
	}
	v.JudgeResponse = judging.Clip(a.Content, 16<<10)
	for _, sc := range heureka.OEQScorers() {
		r, err := heureka.ScoreOEQ(q.oeq.ID, a.Content, tokens, sc)
		if err != nil {
			return fmt.Errorf("judge %s answered unusably: %w", s.cfg.Judge.Model, err)
		}
		v.OEQ = append(v.OEQ, OEQPublic{Scorer: sc, Score: r.Score, Rating: r.Rating, Weighted: r.Weighted})
		v.Facts = r.Facts
	}
	return nil
}

// JudgeRequest is the chat completions request of one judging: the
// judge's settings, and the top log-probabilities when asked for.
func JudgeRequest(js heureka.JudgeSettings, msgs []heureka.Message) (json.RawMessage, error) {
	req := map[string]any{"model": js.Model, "messages": msgs, "temperature": js.Temperature, "top_p": js.TopP,
		"max_tokens": js.MaxTokens}
	if js.TopLogprobs > 0 {
		req["logprobs"] = true
		req["top_logprobs"] = js.TopLogprobs
	}
	return json.Marshal(req)
}
