package heureka

import (
	"errors"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// Message is one chat message of a judge's input.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// JudgeSettings are the request settings of the OEQ judge.
type JudgeSettings struct {
	Model       string  `json:"model"`
	Temperature float64 `json:"temperature"`
	TopP        float64 `json:"top_p"`
	MaxTokens   int     `json:"max_tokens"`
	// TopLogprobs is how many alternatives per token the provider is asked
	// for (0: no log-probabilities).
	TopLogprobs int `json:"top_logprobs"`
}

// PublishedJudgeSettings are the published evaluation's (evaluate_agent_answer.py):
// gpt-4o, temperature 0, top_p 1, 1,000 tokens, the top 3 log-probabilities.
func PublishedJudgeSettings() JudgeSettings {
	return JudgeSettings{Model: "gpt-4o", Temperature: 0, TopP: 1, MaxTokens: 1000, TopLogprobs: 3}
}

// FactLabel is the judge's coverage label for one atomic fact of the gold
// answer.
type FactLabel string

const (
	Present   FactLabel = "PRESENT"
	Partial   FactLabel = "PARTIAL"
	Missing   FactLabel = "MISSING"
	Incorrect FactLabel = "INCORRECT"
)

// OEQJudgePrompt returns the messages asking a judge to rate an agent's
// answer against the gold answer: the gold answer's atomic facts (those
// given, or extracted by the judge), each labelled PRESENT, PARTIAL,
// MISSING or INCORRECT, then a rating 1-5. The rubric follows the
// published one (geval_prompts/eval_prompts.py), in our words; unlike it,
// the question is shown too, and the judge writes its fact labels before
// the rating in the format ParseOEQJudgement reads.
func OEQJudgePrompt(q OEQ, answer string) []Message {
	var facts strings.Builder
	if len(q.AtomicFacts) > 0 {
		facts.WriteString("The gold answer's atomic facts, to label as given:\n")
		for i, f := range q.AtomicFacts {
			fmt.Fprintf(&facts, "F%d: %s\n", i+1, f)
		}
	} else {
		facts.WriteString("Break the gold answer into its atomic facts (F1, F2, ...): each a claim that can be checked on its own, such as a cell type or condition, the direction or size of a change, a gene or pathway, a statistic, a method, a conclusion.\n")
	}
	user := "You grade a PhD student's answer to an open research question about a single-cell biology dataset. " +
		"Answering requires analysing the dataset.\n\n" + facts.String() + `
Label each gold fact by how the student's answer covers it:
- PRESENT: stated with the same meaning and tied to evidence from the dataset (numbers, statistics, cluster or subtype identifiers).
- PARTIAL: the right meaning, but supported only by general biology, a list of plausible options, or hedged wording ("e.g.", "likely", "typically", "may"), without dataset evidence.
- MISSING: not stated.
- INCORRECT: wrong, or contradicting the gold answer.

Then rate the answer's correctness from 1 to 5, judging only the gold facts (extra information that does not contradict them changes nothing; all facts weigh the same):
- 5: every fact PRESENT, none MISSING or INCORRECT, no contradiction.
- 4: most or all facts PRESENT; some may be MISSING; none INCORRECT.
- 3: some facts PRESENT but not all, at least one PARTIAL or MISSING; minor contradictions allowed.
- 2: no fact PRESENT, some PARTIAL; generic lists recalled from biology rather than dataset evidence.
- 1: every fact MISSING, or most INCORRECT, or a major contradiction, or the student says the question cannot be answered.

The question:
<question>
` + q.Text + `
</question>

The student's answer:
<answer>
` + answer + `
</answer>

The gold answer:
<gold>
` + q.Answer + `
</gold>

Reply in exactly this format and nothing else:
<facts>
F1: LABEL | the fact
F2: LABEL | the fact
</facts>
<rating>N</rating>
where LABEL is PRESENT, PARTIAL, MISSING or INCORRECT and N is one digit from 1 to 5.`
	return []Message{
		{Role: "system", Content: "You are a professor of single-cell biology grading your PhD student's answers."},
		{Role: "user", Content: user},
	}
}

// LabelledFact is one line of the judge's facts block.
type LabelledFact struct {
	Label FactLabel `json:"label"`
	Fact  string    `json:"fact"`
}

// OEQJudgement is a judge's parsed answer.
type OEQJudgement struct {
	Rating int
	Facts  []LabelledFact
	// ratingAt is the byte offset of the rating digit in the response
	// (after any code fence was removed, see ratingOffset).
	ratingAt int
}

// Counts returns how many facts carry each label.
func (j OEQJudgement) Counts() map[FactLabel]int {
	c := map[FactLabel]int{}
	for _, f := range j.Facts {
		c[f.Label]++
	}
	return c
}

var (
	ratingTag = regexp.MustCompile(`<rating>([^<]*)</rating>`)
	factsTag  = regexp.MustCompile(`(?s)<facts>(.*?)</facts>`)
	factLine  = regexp.MustCompile(`^F(\d+):\s*(PRESENT|PARTIAL|MISSING|INCORRECT)\s*\|\s*(.+?)\s*$`)
)

// MaxJudgeResponseBytes bounds a judge response ParseOEQJudgement reads.
const MaxJudgeResponseBytes = 1 << 20

// ParseOEQJudgement reads a judge's answer. It must hold exactly one
// <rating>N</rating> with N a single digit 1-5 and nothing else inside the
// tag. A <facts> block is optional (the published prompt asks for the
// rating only); when present every non-blank line must read
// "Fn: LABEL | fact" with a known label and n counting from 1. One Markdown
// code fence around the whole answer is allowed. Anything else is an error
// saying what is wrong: the question's judging failed (retry it; it is not
// the agent's score).
func ParseOEQJudgement(resp string) (OEQJudgement, error) {
	if len(resp) > MaxJudgeResponseBytes {
		return OEQJudgement{}, fmt.Errorf("judge response: %d bytes, more than %d", len(resp), MaxJudgeResponseBytes)
	}
	body, off := unfence(resp)
	tags := ratingTag.FindAllStringSubmatchIndex(body, -1)
	switch len(tags) {
	case 0:
		return OEQJudgement{}, errors.New("judge response: no <rating>N</rating>")
	case 1:
	default:
		return OEQJudgement{}, fmt.Errorf("judge response: %d <rating> tags, want one", len(tags))
	}
	inner := body[tags[0][2]:tags[0][3]]
	if len(inner) != 1 || inner[0] < '1' || inner[0] > '5' {
		return OEQJudgement{}, fmt.Errorf("judge response: rating %q, want one digit 1-5", clip(inner, 20))
	}
	j := OEQJudgement{Rating: int(inner[0] - '0'), ratingAt: off + tags[0][2]}
	blocks := factsTag.FindAllStringSubmatch(body, -1)
	if len(blocks) > 1 {
		return OEQJudgement{}, fmt.Errorf("judge response: %d <facts> blocks, want at most one", len(blocks))
	}
	if len(blocks) == 1 {
		for _, line := range strings.Split(blocks[0][1], "\n") {
			if strings.TrimSpace(line) == "" {
				continue
			}
			m := factLine.FindStringSubmatch(strings.TrimSpace(line))
			if m == nil {
				return OEQJudgement{}, fmt.Errorf("judge response: fact line %q, want \"Fn: PRESENT|PARTIAL|MISSING|INCORRECT | fact\"", clip(strings.TrimSpace(line), 60))
			}
			if m[1] != strconv.Itoa(len(j.Facts)+1) {
				return OEQJudgement{}, fmt.Errorf("judge response: fact F%s where F%d was expected", m[1], len(j.Facts)+1)
			}
			j.Facts = append(j.Facts, LabelledFact{Label: FactLabel(m[2]), Fact: m[3]})
		}
		if len(j.Facts) == 0 {
			return OEQJudgement{}, errors.New("judge response: empty <facts> block")
		}
	}
	return j, nil
}

// unfence removes one Markdown code fence around the whole response and
// returns the body and the body's offset in resp.
func unfence(resp string) (string, int) {
	t := strings.TrimSpace(resp)
	if !strings.HasPrefix(t, "```") || !strings.HasSuffix(t, "```") || len(t) < 6 {
		return resp, 0
	}
	nl := strings.IndexByte(t, '\n')
	if nl < 0 {
		return resp, 0
	}
	start := strings.Index(resp, t) + nl + 1
	return strings.TrimSuffix(t[nl+1:], "```"), start
}

// TopLogprob is one alternative the provider returns for a token.
type TopLogprob struct {
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
}

// TokenLogprob is one token of the response with its top alternatives
// (the shape of OpenAI's logprobs.content).
type TokenLogprob struct {
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	TopLogprobs []TopLogprob `json:"top_logprobs"`
}

// OEQScorer names an open-ended scoring rule ("name@version"); scores of
// different scorers never mix.
type OEQScorer string

const (
	// OEQPublished is the published rule (evaluate_agent_answer.py, its
	// default, non-batch path) exactly: the rating is the first
	// <rating>digits</rating> of the response, whatever its value; with
	// log-probabilities, the rating token is the first token whose text is
	// the rating's, and the score is sum(p_i * r_i) over all of that
	// token's alternatives, p_i = exp(logprob_i) normalised over all of
	// them, r_i the token's number when it is all digits and 0 otherwise
	// (so a non-rating alternative drags the score down, and the score is
	// not bounded below by 1); without them, the plain rating. An
	// unanswered question is left out of the mean. Where the published
	// code crashes (no rating; no token with the rating's text;
	// probabilities that are not numbers) ScoreOEQ returns an error saying
	// so. (Version 1 read the token at the rating's position and scored an
	// unanswered question 1: repronet's choices, kept in OEQRatingTokens.)
	OEQPublished OEQScorer = "heureka-oeq-published@2"
	// OEQRatingTokens is repronet's own rule: the response must hold one
	// <rating>N</rating>, N one digit 1-5; the rating token is the one at
	// the rating's position in the response (when the token texts spell
	// it; else the first with the rating's text); the first TopK
	// alternatives that are ratings ("1" to "5") are normalised among
	// themselves, so the score stays in [1, 5]; without
	// log-probabilities, or with no rating among the alternatives, the
	// plain rating. An unanswered question scores 1 and counts in the
	// mean.
	OEQRatingTokens OEQScorer = "heureka-oeq-rating-tokens@1"
)

// OEQScorers lists the known open-ended scorers.
func OEQScorers() []OEQScorer { return []OEQScorer{OEQPublished, OEQRatingTokens} }

// TopK is how many alternatives of the rating token are used (the
// published top_logprobs=3); more given are ignored.
const TopK = 3

// OEQScore is the score of one open-ended answer.
type OEQScore struct {
	ID     QuestionID `json:"id"`
	Scorer OEQScorer  `json:"scorer"`
	// Score is the probability-weighted rating when Weighted, else the
	// plain Rating.
	Score    float64 `json:"score"`
	Rating   int     `json:"rating"`
	Weighted bool    `json:"weighted"`
	// Unanswered is set when the agent gave no <solution>: no judge was
	// asked; under OEQRatingTokens the score is 1 (the rubric's rating for
	// an answer that does not answer) and counts in the mean, under
	// OEQPublished it is 0 and left out of the mean.
	Unanswered bool           `json:"unanswered,omitempty"`
	Facts      []LabelledFact `json:"facts,omitempty"`
}

// UnansweredOEQ is the score of a question the agent did not answer.
func UnansweredOEQ(id QuestionID, s OEQScorer) OEQScore {
	if s == OEQPublished {
		return OEQScore{ID: id, Scorer: s, Unanswered: true}
	}
	return OEQScore{ID: id, Scorer: s, Score: 1, Rating: 1, Unanswered: true}
}

// ScoreOEQ scores a judge's response (and, when the provider returned them,
// its tokens' log-probabilities) under scorer s, as each scorer's comment
// says. An unusable response is an error: the judging failed.
func ScoreOEQ(id QuestionID, resp string, tokens []TokenLogprob, s OEQScorer) (OEQScore, error) {
	switch s {
	case OEQPublished:
		return scorePublished(id, resp, tokens)
	case OEQRatingTokens:
	default:
		return OEQScore{}, fmt.Errorf("heureka: unknown OEQ scorer %q (known: %q)", s, OEQScorers())
	}
	j, err := ParseOEQJudgement(resp)
	if err != nil {
		return OEQScore{}, err
	}
	out := OEQScore{ID: id, Scorer: s, Score: float64(j.Rating), Rating: j.Rating, Facts: j.Facts}
	tok := ratingToken(resp, j, tokens)
	if tok == nil {
		return out, nil
	}
	alts := tok.TopLogprobs
	if len(alts) > TopK {
		alts = alts[:TopK]
	}
	for _, a := range alts {
		if math.IsNaN(a.Logprob) || math.IsInf(a.Logprob, 1) || a.Logprob > 0 {
			return OEQScore{}, fmt.Errorf("judge log-probabilities: %q has log-probability %v", a.Token, a.Logprob)
		}
	}
	var values []float64
	var logps []float64
	for _, a := range alts {
		if len(a.Token) == 1 && a.Token[0] >= '1' && a.Token[0] <= '5' {
			logps = append(logps, a.Logprob)
			values = append(values, float64(a.Token[0]-'0'))
		}
	}
	probs := normalise(logps)
	if probs == nil {
		return out, nil
	}
	score := 0.0
	for i, p := range probs {
		score += p * values[i]
	}
	out.Score, out.Weighted = score, true
	return out, nil
}

// ratingToken finds the token carrying the rating.
func ratingToken(resp string, j OEQJudgement, tokens []TokenLogprob) *TokenLogprob {
	if len(tokens) == 0 {
		return nil
	}
	digit := strconv.Itoa(j.Rating)
	at := 0
	for i := range tokens {
		if at == j.ratingAt && tokens[i].Token == digit && strings.HasPrefix(resp[at:], digit) {
			if spells(resp, tokens) {
				return &tokens[i]
			}
			break
		}
		at += len(tokens[i].Token)
		if at > j.ratingAt {
			break
		}
	}
	for i := range tokens {
		if tokens[i].Token == digit {
			return &tokens[i]
		}
	}
	return nil
}

// spells reports whether the tokens' texts, joined, are the response.
func spells(resp string, tokens []TokenLogprob) bool {
	at := 0
	for _, t := range tokens {
		if !strings.HasPrefix(resp[at:], t.Token) {
			return false
		}
		at += len(t.Token)
	}
	return at == len(resp)
}

// publishedRating is the published code's rating pattern; its first match
// counts.
var publishedRating = regexp.MustCompile(`<rating>(\d+)</rating>`)

// maxPublishedRating bounds a rating's digits (the published code takes any
// number; a judge asked for 1-5 writing more than this is not rating).
const maxPublishedRating = 1 << 20

// scorePublished is OEQPublished: the published code's steps, each of its
// crashes an error naming the step.
func scorePublished(id QuestionID, resp string, tokens []TokenLogprob) (OEQScore, error) {
	if len(resp) > MaxJudgeResponseBytes {
		return OEQScore{}, fmt.Errorf("judge response: %d bytes, more than %d", len(resp), MaxJudgeResponseBytes)
	}
	m := publishedRating.FindStringSubmatch(resp)
	if m == nil {
		return OEQScore{}, errors.New("judge response: no <rating>digits</rating> (the published code stops here with an IndexError)")
	}
	rating, err := strconv.Atoi(m[1])
	if err != nil || rating > maxPublishedRating {
		return OEQScore{}, fmt.Errorf("judge response: rating %q is not a rating", clip(m[1], 20))
	}
	out := OEQScore{ID: id, Scorer: OEQPublished, Score: float64(rating), Rating: rating}
	if j, err := ParseOEQJudgement(resp); err == nil {
		out.Facts = j.Facts
	}
	if len(tokens) == 0 {
		return out, nil
	}
	idx := slices.IndexFunc(tokens, func(t TokenLogprob) bool { return t.Token == m[1] })
	if idx < 0 {
		return OEQScore{}, fmt.Errorf("judge log-probabilities: no token is %q, the rating (the published code stops here with a ValueError)", m[1])
	}
	alts := tokens[idx].TopLogprobs
	probs := make([]float64, len(alts))
	total := 0.0
	for i, a := range alts {
		probs[i] = math.Exp(a.Logprob)
		total += probs[i]
	}
	score := 0.0
	for i, a := range alts {
		v, err := publishedValue(a.Token)
		if err != nil {
			return OEQScore{}, err
		}
		score += v * (probs[i] / total)
	}
	if math.IsNaN(score) || math.IsInf(score, 0) {
		return OEQScore{}, fmt.Errorf("judge log-probabilities: the rating token's alternatives give no probabilities (%d alternatives summing to %v; the published code's score would be NaN)", len(alts), total)
	}
	out.Score, out.Weighted = score, true
	return out, nil
}

// publishedValue is the published rating of an alternative: float(token)
// when token.isdigit(), else 0. Python's isdigit is true of digits other
// than ASCII ones too, which float() may then refuse: such a token is an
// error, not a guess.
func publishedValue(tok string) (float64, error) {
	if tok == "" {
		return 0, nil
	}
	ascii := true
	for _, r := range tok {
		if !unicode.IsDigit(r) && !unicode.Is(unicode.No, r) {
			return 0, nil
		}
		if r < '0' || r > '9' {
			ascii = false
		}
	}
	if !ascii {
		return 0, fmt.Errorf("judge log-probabilities: alternative %q is digits Python may not read as a number", tok)
	}
	v, err := strconv.ParseFloat(tok, 64)
	if err != nil {
		return 0, fmt.Errorf("judge log-probabilities: alternative %q: %w", tok, err)
	}
	return v, nil
}

// normalise turns log-probabilities into probabilities summing to 1
// (exp(l_i)/sum exp(l_j), computed from the largest so that nothing
// underflows); nil when there are none or all are -Inf.
func normalise(logps []float64) []float64 {
	if len(logps) == 0 {
		return nil
	}
	top := math.Inf(-1)
	for _, l := range logps {
		top = math.Max(top, l)
	}
	if math.IsInf(top, -1) {
		return nil
	}
	out := make([]float64, len(logps))
	sum := 0.0
	for i, l := range logps {
		out[i] = math.Exp(l - top)
		sum += out[i]
	}
	for i := range out {
		out[i] /= sum
	}
	return out
}

// OEQSummary is the mean over open-ended questions scored by one scorer.
type OEQSummary struct {
	Scorer    OEQScorer `json:"scorer"`
	Questions int       `json:"questions"`
	// Mean is over every question under OEQRatingTokens (unanswered ones
	// count 1), over the answered ones under OEQPublished (0 when none is).
	Mean float64 `json:"mean"`
	// Weighted and Plain count how each score was computed, Unanswered the
	// questions without an answer. Mode is "weighted", "plain"
	// or "mixed" for the board to show.
	Weighted   int    `json:"weighted"`
	Plain      int    `json:"plain"`
	Unanswered int    `json:"unanswered"`
	Mode       string `json:"mode"`
}

// SummariseOEQ averages scores; every score must be by scorer s.
func SummariseOEQ(scores []OEQScore, s OEQScorer) (OEQSummary, error) {
	sum := OEQSummary{Scorer: s, Questions: len(scores)}
	total, counted := 0.0, 0
	for _, sc := range scores {
		if sc.Scorer != s {
			return OEQSummary{}, fmt.Errorf("heureka: %s scored by %s, not %s: scores of different scorers do not mix", sc.ID, sc.Scorer, s)
		}
		// The published code skips a missing prediction.
		if !(sc.Unanswered && s == OEQPublished) {
			total += sc.Score
			counted++
		}
		switch {
		case sc.Unanswered:
			sum.Unanswered++
		case sc.Weighted:
			sum.Weighted++
		default:
			sum.Plain++
		}
	}
	if counted > 0 {
		sum.Mean = total / float64(counted)
	}
	switch {
	case sum.Weighted > 0 && sum.Plain > 0:
		sum.Mode = "mixed"
	case sum.Weighted > 0:
		sum.Mode = "weighted"
	default:
		sum.Mode = "plain"
	}
	return sum, nil
}
