package heureka

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
)

// MaxAnswersBytes bounds an answers, finals or judge-answers file.
const MaxAnswersBytes = 64 << 20

// ParseNested reads a JSON object keyed as the published
// processed_results.json, {paper: {insight: {QuestionN: value}}}, and
// returns each value by question.
func ParseNested(data []byte) (map[QuestionID]json.RawMessage, error) {
	if len(data) > MaxAnswersBytes {
		return nil, fmt.Errorf("%d bytes, more than %d", len(data), MaxAnswersBytes)
	}
	var nested map[string]map[string]map[string]json.RawMessage
	if err := json.Unmarshal(data, &nested); err != nil {
		return nil, fmt.Errorf("want {paper: {insight: {QuestionN: ...}}}: %w", err)
	}
	out := map[QuestionID]json.RawMessage{}
	for p, ins := range nested {
		for i, qs := range ins {
			for q, v := range qs {
				out[QuestionID{p, i, q}] = v
			}
		}
	}
	return out, nil
}

// ParseTexts reads {paper: {insight: {QuestionN: "text"}}}: final
// messages, or answers as the published extraction writes them.
func ParseTexts(data []byte) (map[QuestionID]string, error) {
	raw, err := ParseNested(data)
	if err != nil {
		return nil, err
	}
	out := make(map[QuestionID]string, len(raw))
	for id, v := range raw {
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return nil, fmt.Errorf("%s: want a string: %w", id, err)
		}
		out[id] = s
	}
	return out, nil
}

// JudgeAnswer is one judge's answer on an open-ended question: its text
// and, when the provider returned them, its tokens' log-probabilities.
type JudgeAnswer struct {
	Content  string         `json:"content"`
	Logprobs []TokenLogprob `json:"logprobs,omitempty"`
}

// ParseJudgeAnswers reads {paper: {insight: {QuestionN: answer}}} where an
// answer is the judge's text, {"content": ..., "logprobs": [...]} (the
// tokens as OpenAI's logprobs.content), or an OpenAI chat completion as
// it came ({"choices": [{"message": {"content"}, "logprobs": {"content"}}]}).
func ParseJudgeAnswers(data []byte) (map[QuestionID]JudgeAnswer, error) {
	raw, err := ParseNested(data)
	if err != nil {
		return nil, err
	}
	out := make(map[QuestionID]JudgeAnswer, len(raw))
	for id, v := range raw {
		a, err := parseJudgeAnswer(v)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", id, err)
		}
		out[id] = a
	}
	return out, nil
}

func parseJudgeAnswer(v json.RawMessage) (JudgeAnswer, error) {
	t := bytes.TrimSpace(v)
	if len(t) > 0 && t[0] == '"' {
		var s string
		err := json.Unmarshal(t, &s)
		return JudgeAnswer{Content: s}, err
	}
	var obj struct {
		Content  *string        `json:"content"`
		Logprobs []TokenLogprob `json:"logprobs"`
		Choices  []struct {
			Message struct {
				Content *string `json:"content"`
			} `json:"message"`
			Logprobs *struct {
				Content []TokenLogprob `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(t, &obj); err != nil {
		return JudgeAnswer{}, fmt.Errorf("want a string, {\"content\", \"logprobs\"} or a chat completion: %w", err)
	}
	switch {
	case obj.Content != nil:
		return JudgeAnswer{Content: *obj.Content, Logprobs: obj.Logprobs}, nil
	case len(obj.Choices) > 0 && obj.Choices[0].Message.Content != nil:
		a := JudgeAnswer{Content: *obj.Choices[0].Message.Content}
		if lp := obj.Choices[0].Logprobs; lp != nil {
			a.Logprobs = lp.Content
		}
		return a, nil
	}
	return JudgeAnswer{}, errors.New("no content: want a string, {\"content\", \"logprobs\"} or a chat completion")
}

// unknownIDs lists the ids of given that are no question of ids, sorted.
func unknownIDs[V any](given map[QuestionID]V, known map[QuestionID]bool) error {
	var bad []string
	for id := range given {
		if !known[id] {
			bad = append(bad, id.String())
		}
	}
	if len(bad) == 0 {
		return nil
	}
	sort.Strings(bad)
	if len(bad) > 5 {
		bad = append(bad[:5], fmt.Sprintf("and %d more", len(bad)-5))
	}
	return fmt.Errorf("no such question in the question file: %s", strings.Join(bad, ", "))
}

// MCQRegrade is a re-grading of multiple-choice answers under one grader.
type MCQRegrade struct {
	Grader  MCQGrader  `json:"grader"`
	Origin  string     `json:"origin"`
	Metrics MCQMetrics `json:"metrics"`
	// Undefined says why the published code has no figures here, if so.
	Undefined string       `json:"undefined,omitempty"`
	Outcomes  []MCQOutcome `json:"outcomes,omitempty"`
}

// RegradeMCQ scores every question of qs under each grader: texts are the
// agents' final messages (finals true) or the answers as extracted (the
// published processed_results.json; an answer is what a <solution> held).
// A question without a text is unanswered; a text for no question of qs
// is an error.
func RegradeMCQ(qs []MCQ, texts map[QuestionID]string, finals bool, graders []MCQGrader) ([]MCQRegrade, error) {
	known := map[QuestionID]bool{}
	for _, q := range qs {
		known[q.ID] = true
	}
	if err := unknownIDs(texts, known); err != nil {
		return nil, err
	}
	var out []MCQRegrade
	for _, g := range graders {
		r := MCQRegrade{Grader: g, Origin: Origin(string(g))}
		for _, q := range qs {
			final, ok := texts[q.ID]
			if ok && !finals {
				if strings.Contains(final, "<solution>") || strings.Contains(final, "</solution>") {
					return nil, fmt.Errorf("%s: an extracted answer holds a <solution> tag: give final messages with --finals", q.ID)
				}
				final = "<solution>" + final + "</solution>"
			}
			o, err := ScoreMCQ(q, final, g)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", q.ID, err)
			}
			r.Outcomes = append(r.Outcomes, o)
		}
		r.Metrics = AggregateMCQ(r.Outcomes, g)
		if err := r.Metrics.Undefined(); err != nil {
			r.Undefined = err.Error()
		}
		out = append(out, r)
	}
	return out, nil
}

// OEQRegrade is a re-scoring of open-ended judge answers under one scorer.
type OEQRegrade struct {
	Scorer  OEQScorer  `json:"scorer"`
	Origin  string     `json:"origin"`
	Summary OEQSummary `json:"summary"`
	Scores  []OEQScore `json:"scores,omitempty"`
}

// RegradeOEQ scores every question of qs from its judge's answer under
// each scorer; a question without a judge answer is unanswered. A judge
// answer a scorer cannot score is an error naming the question (where the
// published code would stop).
func RegradeOEQ(qs []OEQ, judged map[QuestionID]JudgeAnswer, scorers []OEQScorer) ([]OEQRegrade, error) {
	known := map[QuestionID]bool{}
	for _, q := range qs {
		known[q.ID] = true
	}
	if err := unknownIDs(judged, known); err != nil {
		return nil, err
	}
	var out []OEQRegrade
	for _, s := range scorers {
		r := OEQRegrade{Scorer: s, Origin: Origin(string(s))}
		for _, q := range qs {
			a, ok := judged[q.ID]
			if !ok {
				r.Scores = append(r.Scores, UnansweredOEQ(q.ID, s))
				continue
			}
			sc, err := ScoreOEQ(q.ID, a.Content, a.Logprobs, s)
			if err != nil {
				return nil, fmt.Errorf("%s under %s: %w", q.ID, s, err)
			}
			r.Scores = append(r.Scores, sc)
		}
		sum, err := SummariseOEQ(r.Scores, s)
		if err != nil {
			return nil, err
		}
		r.Summary = sum
		out = append(out, r)
	}
	return out, nil
}
