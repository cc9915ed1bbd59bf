package heureka

import (
	"fmt"
	"sort"
	"strings"
)

// ExtractSolution returns the content of the last <solution>...</solution>
// in an agent's final message, trimmed, and whether there is one. As the
// published extraction (extract_agent_answer.py), a match is an opening tag
// whose content up to the first closing tag holds no other opening tag;
// unlike it, the content is cut out exactly (the published lstrip and
// rstrip of the tags strip any of their characters, so an answer starting
// "stem" loses its "st").
func ExtractSolution(final string) (string, bool) {
	const open, close = "<solution>", "</solution>"
	last, found := "", false
	for i := 0; i < len(final); {
		s := strings.Index(final[i:], open)
		if s < 0 {
			break
		}
		start := i + s + len(open)
		e := strings.Index(final[start:], close)
		if e < 0 {
			break
		}
		content := final[start : start+e]
		if o := strings.Index(content, open); o >= 0 {
			// Another opening tag first: the match starts there instead.
			i = start + o
			continue
		}
		last, found = strings.TrimSpace(content), true
		i = start + e + len(close)
	}
	return last, found
}

// MCQGrader names a multiple-choice scoring rule ("name@version"); scores
// of different graders never mix.
type MCQGrader string

const (
	// MCQPublished is the published evaluation (evaluate_agent_answer.py)
	// exactly: the answer, trimmed as a whole, is split on "," and nothing
	// else, so "B, D" predicts {"B", " D"} and " D" is a wrong letter; an
	// empty answer predicts {""}. An unanswered question counts in the
	// accuracy (as wrong) and is left out of every other figure: the macro
	// means are over the answered questions and the micro counts pool
	// theirs only. (Version 1 counted an unanswered question as 0 in
	// every figure: repronet's choice, kept in MCQTrimmed.)
	MCQPublished MCQGrader = "heureka-mcq-published@2"
	// MCQTrimmed is repronet's own rule: split on "," and trim spaces
	// around each letter, dropping empty pieces ("B, D" predicts {"B",
	// "D"}; an empty answer predicts nothing), and an unanswered question
	// counts in every figure, as wrong with precision and recall 0, so
	// that not answering never raises a figure.
	MCQTrimmed MCQGrader = "heureka-mcq-trimmed@1"
)

// MCQGraders lists the known multiple-choice graders.
func MCQGraders() []MCQGrader { return []MCQGrader{MCQPublished, MCQTrimmed} }

// Origin says whose rule a grader or scorer is, for a board to show:
// OriginPublished for the graders that equal the published code,
// OriginRepronet for repronet's own choices (and for any grader name no
// longer in use, such as heureka-mcq-published@1, whose figures counted
// unanswered questions as published code does not).
func Origin(grader string) string {
	switch grader {
	case string(MCQPublished), string(OEQPublished):
		return OriginPublished
	}
	return OriginRepronet
}

// The two origins Origin names.
const (
	OriginPublished = "published code (HeurekaBench evaluate_agent_answer.py)"
	OriginRepronet  = "repronet's own rule"
)

// Predicted returns the set of letters an answer predicts under g, sorted.
func (g MCQGrader) Predicted(answer string) ([]string, error) {
	set := map[string]bool{}
	answer = strings.TrimSpace(answer)
	switch g {
	case MCQPublished:
		for _, p := range strings.Split(answer, ",") {
			set[p] = true
		}
	case MCQTrimmed:
		for _, p := range strings.Split(answer, ",") {
			if p = strings.TrimSpace(p); p != "" {
				set[p] = true
			}
		}
	default:
		return nil, fmt.Errorf("heureka: unknown MCQ grader %q (known: %q)", g, MCQGraders())
	}
	return sortedSet(set), nil
}

// MCQOutcome is the score of one multiple-choice answer.
type MCQOutcome struct {
	ID QuestionID `json:"id"`
	// Answered is false when the final message has no <solution>.
	Answered  bool     `json:"answered"`
	Answer    string   `json:"answer,omitempty"`
	Predicted []string `json:"predicted"`
	Gold      []string `json:"gold"`
	// Exact is Predicted == Gold.
	Exact bool `json:"exact"`
	TP    int  `json:"tp"`
	FP    int  `json:"fp"`
	FN    int  `json:"fn"`
	// Precision is TP/|Predicted| (0 when nothing is predicted), Recall
	// TP/(TP+FN), F1 their harmonic mean (0 when both are 0).
	Precision float64 `json:"precision"`
	Recall    float64 `json:"recall"`
	F1        float64 `json:"f1"`
}

// ScoreMCQ scores the agent's final message for one question under g. An
// unanswered question predicts nothing: wrong, precision 0, recall 0.
func ScoreMCQ(q MCQ, final string, g MCQGrader) (MCQOutcome, error) {
	answer, ok := ExtractSolution(final)
	var pred []string
	if ok {
		var err error
		if pred, err = g.Predicted(answer); err != nil {
			return MCQOutcome{}, err
		}
	} else if _, err := g.Predicted(""); err != nil {
		return MCQOutcome{}, err
	}
	o := MCQOutcome{ID: q.ID, Answered: ok, Answer: answer, Predicted: pred, Gold: q.Gold}
	gold := map[string]bool{}
	for _, l := range q.Gold {
		gold[l] = true
	}
	for _, p := range pred {
		if gold[p] {
			o.TP++
		} else {
			o.FP++
		}
	}
	o.FN = len(q.Gold) - o.TP
	o.Exact = o.FP == 0 && o.FN == 0 && ok
	if len(pred) > 0 {
		o.Precision = float64(o.TP) / float64(len(pred))
	}
	if o.TP+o.FN > 0 {
		o.Recall = float64(o.TP) / float64(o.TP+o.FN)
	}
	o.F1 = f1(o.Precision, o.Recall)
	return o, nil
}

func f1(p, r float64) float64 {
	if p+r == 0 {
		return 0
	}
	return 2 * p * r / (p + r)
}

// MCQMetrics are the published metrics over a set of questions.
type MCQMetrics struct {
	Grader MCQGrader `json:"grader"`
	// Questions counts every question; Answered those with a <solution>;
	// Correct the exact matches.
	Questions int `json:"questions"`
	Answered  int `json:"answered"`
	Correct   int `json:"correct"`
	// Accuracy is Correct/Questions.
	Accuracy float64 `json:"accuracy"`
	// Macro metrics are means of the per-question values: over every
	// question (unanswered ones count 0), or, under MCQPublished, over the
	// answered ones (0 when none is).
	MacroPrecision float64 `json:"macro_precision"`
	MacroRecall    float64 `json:"macro_recall"`
	MacroF1        float64 `json:"macro_f1"`
	// Micro metrics pool the counts (under MCQPublished, of the answered
	// questions only): precision TP/sum|Predicted| (0 when nothing was
	// predicted), recall TP/(TP+FN), F1 of the two.
	TP             int     `json:"tp"`
	FP             int     `json:"fp"`
	FN             int     `json:"fn"`
	Predicted      int     `json:"predicted"`
	MicroPrecision float64 `json:"micro_precision"`
	MicroRecall    float64 `json:"micro_recall"`
	MicroF1        float64 `json:"micro_f1"`
}

// Undefined returns an error when the metrics have no value under the
// published code: under MCQPublished with questions but none answered,
// where the published script stops with a StatisticsError (the mean of
// no F1); the figures are then 0 but stand for nothing.
func (m MCQMetrics) Undefined() error {
	if m.Grader == MCQPublished && m.Questions > 0 && m.Answered == 0 {
		return fmt.Errorf("heureka: %s: none of %d questions answered: the published code has no macro F1 (it stops with a StatisticsError)", m.Grader, m.Questions)
	}
	return nil
}

// AggregateMCQ computes the metrics of outcomes scored under g.
func AggregateMCQ(outcomes []MCQOutcome, g MCQGrader) MCQMetrics {
	m := MCQMetrics{Grader: g, Questions: len(outcomes)}
	if len(outcomes) == 0 {
		return m
	}
	// The published code leaves a missing prediction out of every figure
	// but the accuracy.
	skipUnanswered := g == MCQPublished
	for _, o := range outcomes {
		if o.Answered {
			m.Answered++
		}
		if o.Exact {
			m.Correct++
		}
		if skipUnanswered && !o.Answered {
			continue
		}
		m.MacroPrecision += o.Precision
		m.MacroRecall += o.Recall
		m.MacroF1 += o.F1
		m.TP += o.TP
		m.FP += o.FP
		m.FN += o.FN
		m.Predicted += len(o.Predicted)
	}
	m.Accuracy = float64(m.Correct) / float64(len(outcomes))
	n := float64(len(outcomes))
	if skipUnanswered {
		n = float64(m.Answered)
	}
	if n > 0 {
		m.MacroPrecision /= n
		m.MacroRecall /= n
		m.MacroF1 /= n
	}
	if m.Predicted > 0 {
		m.MicroPrecision = float64(m.TP) / float64(m.Predicted)
	}
	if m.TP+m.FN > 0 {
		m.MicroRecall = float64(m.TP) / float64(m.TP+m.FN)
	}
	m.MicroF1 = f1(m.MicroPrecision, m.MicroRecall)
	return m
}

func sortedSet(set map[string]bool) []string {
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
