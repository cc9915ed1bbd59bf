package heureka

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// MaxQuestionFileBytes bounds a question file (the published ones are
// under 100 kB).
const MaxQuestionFileBytes = 16 << 20

// QuestionID names one question: the paper, the insight and the question
// key as the published evaluation names them ("paper1", "insight #1",
// "Question2").
type QuestionID struct {
	Paper    string `json:"paper"`
	Insight  string `json:"insight"`
	Question string `json:"question"`
}

func (q QuestionID) String() string { return q.Paper + "/" + q.Insight + "/" + q.Question }

// DataFile is one file of an insight's "data": the path (relative to the
// benchmark's root) and its description.
type DataFile struct {
	Path        string
	Description string
}

// Insight is the context a question was made from. Summary, How and
// Relevant state the finding and so give the answers away: they are gold,
// never for the agent. Data names the datasets the agent analyses.
type Insight struct {
	Summary, How, Relevant string
	Data                   []DataFile
}

// Option is one choice of a multiple-choice question.
type Option struct {
	Letter string
	Text   string
}

// MCQ is one multiple-choice question.
type MCQ struct {
	ID      QuestionID
	Text    string
	Options []Option
	// Gold is the set of correct letters, sorted ("B", "D").
	Gold []string
	// GoldRaw is the answer as written after **AnswerN:** ("B,D").
	GoldRaw string
	Insight *Insight
}

// OEQ is one open-ended question.
type OEQ struct {
	ID     QuestionID
	Text   string
	Answer string
	// AtomicFacts are the gold answer's atomic facts when the file gives
	// them; the published files do not (the judge extracts them).
	AtomicFacts []string
	Insight     *Insight
}

// Question blocks: "**QuestionN:**" and "**AnswerN:**" markers.
var (
	questionMarker = regexp.MustCompile(`\*\*Question(\d+):\*\*`)
	answerMarker   = regexp.MustCompile(`\*\*Answer(\d+):\*\*`)
	optionLine     = regexp.MustCompile(`^\s*([A-D])\)\s*(.*?)\s*$`)
	goldLetters    = regexp.MustCompile(`^[A-D](?:,[A-D])*$`)
)

// ParseMCQFile reads mcq.json or mcq_lite.json as published: an object of
// papers, each an object of insights, each with exactly the keys summary,
// how, relevant, data and mcq_question. A question text holds one or more
// blocks "**QuestionN:** text", then the options "A) ..." to "D) ..." one
// a line, then "**AnswerN:** letters" (one letter or several joined by ","
// without spaces, as the published evaluation's pattern requires). Blocks
// are keyed "QuestionN" within their insight, as the published evaluation
// keys them. Order is the file's. Every error names the paper, insight and
// question.
func ParseMCQFile(data []byte) ([]MCQ, error) {
	var out []MCQ
	err := walkInsights(data, "mcq_question", func(paper, insight string, in *Insight, text string) error {
		blocks, err := splitBlocks(text)
		if err != nil {
			return err
		}
		for _, b := range blocks {
			id := QuestionID{paper, insight, "Question" + b.num}
			q, err := parseMCQBlock(b.body, b.num)
			if err != nil {
				return fmt.Errorf("%s: %w", id, err)
			}
			q.ID, q.Insight = id, in
			out = append(out, q)
		}
		return nil
	})
	return out, err
}

// ParseOEQFile reads oeq.json or oeq_lite.json as published: the same
// shape with oe_question, whose blocks are "**QuestionN:** text" then
// "**AnswerN:** free text" up to the next block. Every error names the
// paper, insight and question.
func ParseOEQFile(data []byte) ([]OEQ, error) {
	var out []OEQ
	err := walkInsights(data, "oe_question", func(paper, insight string, in *Insight, text string) error {
		blocks, err := splitBlocks(text)
		if err != nil {
			return err
		}
		for _, b := range blocks {
			id := QuestionID{paper, insight, "Question" + b.num}
			q, a, err := splitAnswer(b.body, b.num)
			if err != nil {
				return fmt.Errorf("%s: %w", id, err)
			}
			if q == "" {
				return fmt.Errorf("%s: empty question", id)
			}
			if a == "" {
				return fmt.Errorf("%s: empty answer", id)
			}
			out = append(out, OEQ{ID: id, Text: q, Answer: a, Insight: in})
		}
		return nil
	})
	return out, err
}

// walkInsights decodes the papers/insights structure in file order and
// calls f for each insight with its question text (under key qkey).
func walkInsights(data []byte, qkey string, f func(paper, insight string, in *Insight, text string) error) error {
	if len(data) > MaxQuestionFileBytes {
		return fmt.Errorf("question file: %d bytes, more than %d", len(data), MaxQuestionFileBytes)
	}
	papers, err := objectEntries(data)
	if err != nil {
		return fmt.Errorf("question file: %w", err)
	}
	if len(papers) == 0 {
		return errors.New("question file: no papers")
	}
	for _, p := range papers {
		insights, err := objectEntries(p.value)
		if err != nil {
			return fmt.Errorf("%s: %w", p.key, err)
		}
		if len(insights) == 0 {
			return fmt.Errorf("%s: no insights", p.key)
		}
		for _, i := range insights {
			where := p.key + "/" + i.key
			in, text, err := decodeInsight(i.value, qkey)
			if err != nil {
				return fmt.Errorf("%s: %w", where, err)
			}
			if err := f(p.key, i.key, in, text); err != nil {
				if strings.HasPrefix(err.Error(), where+"/") {
					return err
				}
				return fmt.Errorf("%s: %w", where, err)
			}
		}
	}
	return nil
}

func decodeInsight(raw json.RawMessage, qkey string) (*Insight, string, error) {
	fields, err := objectEntries(raw)
	if err != nil {
		return nil, "", err
	}
	in := &Insight{}
	var text string
	seen := map[string]bool{}
	for _, e := range fields {
		seen[e.key] = true
		var dst *string
		switch e.key {
		case "summary":
			dst = &in.Summary
		case "how":
			dst = &in.How
		case "relevant":
			dst = &in.Relevant
		case qkey:
			dst = &text
		case "data":
			files, err := objectEntries(e.value)
			if err != nil {
				return nil, "", fmt.Errorf("data: %w", err)
			}
			for _, d := range files {
				var desc string
				if err := json.Unmarshal(d.value, &desc); err != nil || !isString(d.value) {
					return nil, "", fmt.Errorf("data %q: the description must be a string", d.key)
				}
				if d.key == "" {
					return nil, "", errors.New("data: empty path")
				}
				in.Data = append(in.Data, DataFile{Path: d.key, Description: desc})
			}
			continue
		default:
			return nil, "", fmt.Errorf("unknown key %q (want summary, how, relevant, data, %s)", e.key, qkey)
		}
		if err := json.Unmarshal(e.value, dst); err != nil || !isString(e.value) {
			return nil, "", fmt.Errorf("%s must be a string", e.key)
		}
	}
	for _, k := range []string{"summary", "how", "relevant", "data", qkey} {
		if !seen[k] {
			return nil, "", fmt.Errorf("missing key %q", k)
		}
	}
	return in, text, nil
}

// block is one "**QuestionN:**" block: its number and what follows the
// marker up to the next block.
type block struct {
	num  string
	body string
}

// splitBlocks splits a question text into its blocks; only whitespace may
// precede the first, and numbers must not repeat.
func splitBlocks(text string) ([]block, error) {
	locs := questionMarker.FindAllStringSubmatchIndex(text, -1)
	if len(locs) == 0 {
		return nil, errors.New("no **QuestionN:** block")
	}
	if pre := strings.TrimSpace(text[:locs[0][0]]); pre != "" {
		return nil, fmt.Errorf("text before the first question: %q", clip(pre, 40))
	}
	var out []block
	seen := map[string]bool{}
	for i, l := range locs {
		num := text[l[2]:l[3]]
		if n, err := strconv.Atoi(num); err != nil || strconv.Itoa(n) != num {
			return nil, fmt.Errorf("Question%s: not a plain number", num)
		}
		if seen[num] {
			return nil, fmt.Errorf("Question%s: given twice", num)
		}
		seen[num] = true
		end := len(text)
		if i+1 < len(locs) {
			end = locs[i+1][0]
		}
		out = append(out, block{num: num, body: text[l[1]:end]})
	}
	return out, nil
}

// splitAnswer cuts a block's body at its one "**AnswerN:**" marker (N the
// block's number) and returns the trimmed question and answer texts.
func splitAnswer(body, num string) (string, string, error) {
	locs := answerMarker.FindAllStringSubmatchIndex(body, -1)
	if len(locs) == 0 {
		return "", "", fmt.Errorf("no **Answer%s:**", num)
	}
	if len(locs) > 1 {
		return "", "", fmt.Errorf("%d answer markers", len(locs))
	}
	l := locs[0]
	if got := body[l[2]:l[3]]; got != num {
		return "", "", fmt.Errorf("**Answer%s:** under **Question%s:**", got, num)
	}
	return strings.TrimSpace(body[:l[0]]), strings.TrimSpace(body[l[1]:]), nil
}

// parseMCQBlock reads one block's question text, its options A-D (one a
// line, in order, each non-empty; blank lines between are allowed, as in
// the published files) and its gold letters.
func parseMCQBlock(body, num string) (MCQ, error) {
	q, ans, err := splitAnswer(body, num)
	if err != nil {
		return MCQ{}, err
	}
	var text []string
	var opts []Option
	for _, line := range strings.Split(q, "\n") {
		m := optionLine.FindStringSubmatch(line)
		switch {
		case m != nil:
			want := string(rune('A' + len(opts)))
			if m[1] != want {
				return MCQ{}, fmt.Errorf("option %s) where %s) was expected", m[1], want)
			}
			if m[2] == "" {
				return MCQ{}, fmt.Errorf("option %s) is empty", m[1])
			}
			opts = append(opts, Option{Letter: m[1], Text: m[2]})
		case strings.TrimSpace(line) == "":
		case len(opts) > 0:
			return MCQ{}, fmt.Errorf("text after the options: %q", clip(strings.TrimSpace(line), 40))
		default:
			text = append(text, line)
		}
	}
	out := MCQ{Text: strings.TrimSpace(strings.Join(text, "\n")), Options: opts, GoldRaw: ans}
	if out.Text == "" {
		return MCQ{}, errors.New("empty question")
	}
	if len(opts) != 4 {
		return MCQ{}, fmt.Errorf("%d options, want A) to D)", len(opts))
	}
	if !goldLetters.MatchString(ans) {
		return MCQ{}, fmt.Errorf("answer %q: want letters A-D joined by \",\" without spaces", clip(ans, 40))
	}
	seen := map[string]bool{}
	for _, l := range strings.Split(ans, ",") {
		if seen[l] {
			return MCQ{}, fmt.Errorf("answer %q: %s given twice", ans, l)
		}
		seen[l] = true
	}
	out.Gold = sortedSet(seen)
	return out, nil
}

// entry is one key and value of a JSON object, in file order.
type entry struct {
	key   string
	value json.RawMessage
}

// objectEntries decodes a JSON object keeping its order; a key given twice
// is an error.
func objectEntries(data []byte) ([]entry, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("want an object, got %s", tokenKind(tok))
	}
	var out []entry
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("not JSON: %w", err)
		}
		key := tok.(string) // object keys are strings
		if seen[key] {
			return nil, fmt.Errorf("key %q given twice", key)
		}
		seen[key] = true
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, fmt.Errorf("%q: not JSON: %w", key, err)
		}
		out = append(out, entry{key, v})
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("not JSON: %w", err)
	}
	if strings.TrimSpace(string(data[dec.InputOffset():])) != "" {
		return nil, errors.New("text after the JSON object")
	}
	return out, nil
}

// tokenKind names the JSON type that starts with tok, for error messages.
func tokenKind(tok json.Token) string {
	switch t := tok.(type) {
	case json.Delim:
		if t == '[' {
			return "a list"
		}
		return "an object"
	case string:
		return "a string"
	case float64, json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "null"
}

// isString reports whether a raw JSON value is a string.
func isString(v json.RawMessage) bool {
	t := bytes.TrimSpace(v)
	return len(t) > 0 && t[0] == '"'
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	r := []rune(s)
	if len(r) > n {
		r = r[:n]
	}
	return string(r) + "..."
}
