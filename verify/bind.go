package verify

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Answer is one answer of a report: a name and its value's JSON (a
// number, a string, a list or object of them, as the family reads the
// report). Binding is neutral: it needs no gold value and no family.
type Answer struct {
	Name  string          `json:"name"`
	Value json.RawMessage `json:"value"`
}

// Atom is a leaf of an answer's value: a number (with the text it was
// written as, whose decimals say how it may have been rounded) or a
// string.
type Atom struct {
	Number bool    `json:"number,omitempty"`
	Text   string  `json:"text"`
	Value  float64 `json:"-"`
}

// Atoms are the leaves of a value's JSON.
func Atoms(value json.RawMessage) ([]Atom, error) {
	d := json.NewDecoder(bytes.NewReader(value))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return nil, fmt.Errorf("answer value is not JSON: %w", err)
	}
	var out []Atom
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case json.Number:
			f, err := x.Float64()
			if err == nil && !math.IsInf(f, 0) {
				out = append(out, Atom{Number: true, Text: x.String(), Value: f})
			}
		case string:
			if f, err := strconv.ParseFloat(strings.TrimSpace(x), 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
				out = append(out, Atom{Number: true, Text: strings.TrimSpace(x), Value: f})
			} else if n := normText(x); n != "" {
				out = append(out, Atom{Text: n})
			}
		case bool:
			out = append(out, Atom{Text: strconv.FormatBool(x)})
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				walk(x[k])
			}
		}
	}
	walk(v)
	return out, nil
}

var (
	spaces  = regexp.MustCompile(`\s+`)
	numbers = regexp.MustCompile(`[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?`)
)

func normText(s string) string {
	return strings.TrimSpace(spaces.ReplaceAllString(strings.ToLower(s), " "))
}

// decimals is how many digits follow the point in a number's text (-1
// with an exponent: no rounding is assumed).
func decimals(text string) int {
	if strings.ContainsAny(text, "eE") {
		return -1
	}
	if i := strings.IndexByte(text, '.'); i >= 0 {
		return len(text) - i - 1
	}
	return 0
}

// numberMatches says whether a number written in a text may be the
// atom's: equal within a relative 1e-9, or the atom is it rounded to the
// atom's decimals (a model that read 0.93456 and answered 0.9346).
func numberMatches(a Atom, t float64) bool {
	if math.Abs(a.Value-t) <= 1e-9*math.Max(1, math.Abs(a.Value)) {
		return true
	}
	d := decimals(a.Text)
	if d < 0 || d > 12 {
		return false
	}
	p := math.Pow(10, float64(d))
	return math.Abs(math.Round(t*p)/p-a.Value) <= 1e-9*math.Max(1, math.Abs(a.Value))
}

// Holds says whether text holds the atom: a string atom as a substring of
// the text lowercased with whitespace collapsed, a number as any number
// written in it that matches.
func (a Atom) Holds(text string) bool {
	if !a.Number {
		return strings.Contains(normText(text), a.Text)
	}
	// Hex ids and hashes (an agent's id, a commit) are no numbers: "12" in
	// "a12b05a4c3d2" is not 12.
	text = hexID.ReplaceAllStringFunc(text, func(m string) string {
		if isHexID(m) {
			return " "
		}
		return m
	})
	for _, m := range numbers.FindAllString(text, -1) {
		if t, err := strconv.ParseFloat(m, 64); err == nil && numberMatches(a, t) {
			return true
		}
	}
	return false
}

// ToolRef names a tool message: the request that first showed it to the
// model, and its index among that request's messages.
type ToolRef struct {
	Step   int    `json:"step"`
	Msg    int    `json:"msg"`
	CallID string `json:"call_id,omitempty"`
}

// Binding says where in the trajectory an answer's value came from.
type Binding struct {
	Answer string `json:"answer"`
	Bound  bool   `json:"bound"`
	// Model are the exchanges whose answer (the model's own output:
	// text and tool call arguments) holds an atom of the value.
	Model []int `json:"model,omitempty"`
	// Tools are the tool messages that hold an atom of the value.
	Tools []ToolRef `json:"tools,omitempty"`
	// Missing are the atoms found nowhere.
	Missing []string `json:"missing,omitempty"`
}

// modelText is what a model wrote in an answer: its text and its tool
// calls' arguments, JSON leaves one a line.
func modelText(m Message) string {
	var b strings.Builder
	b.WriteString(m.Text)
	for _, c := range m.Calls {
		b.WriteByte('\n')
		d := json.NewDecoder(strings.NewReader(c.Args))
		d.UseNumber()
		var v any
		if d.Decode(&v) != nil {
			b.WriteString(c.Args)
			continue
		}
		var walk func(any)
		walk = func(v any) {
			switch x := v.(type) {
			case map[string]any:
				for k, e := range x {
					b.WriteString(k + "\n")
					walk(e)
				}
			case []any:
				for _, e := range x {
					walk(e)
				}
			default:
				fmt.Fprintf(&b, "%v\n", x)
			}
		}
		walk(v)
	}
	return b.String()
}

// newTools are the indexes of the tool messages request i shows the model
// for the first time: those after the request and answer it extends
// (Place.From), or all when it extends none.
func newTools(t Turns, places []Place, i int) []int {
	var out []int
	for k := places[i].From; k < len(t.Requests[i]); k++ {
		if t.Requests[i][k].Role == RoleTool {
			out = append(out, k)
		}
	}
	return out
}

// Bind finds each answer's atoms in the trajectory: in the model's
// outputs or in tool messages the agent sent the gateway (committed in a
// request before the model could use them). An answer is bound when all
// its atoms are found; an answer whose value is not JSON is unbound.
func Bind(exchanges []Exchange, answers []Answer) []Binding {
	t := ReadTurns(exchanges)
	model := make([]string, len(t.Answers))
	for i, a := range t.Answers {
		model[i] = modelText(a)
	}
	type tool struct {
		ref  ToolRef
		text string
	}
	var tools []tool
	places := Split(t).Places
	for i := range t.Requests {
		for _, k := range newTools(t, places, i) {
			m := t.Requests[i][k]
			tools = append(tools, tool{ToolRef{Step: i, Msg: k, CallID: m.CallID}, m.Text})
		}
	}
	out := make([]Binding, len(answers))
	for n, ans := range answers {
		b := Binding{Answer: ans.Name, Bound: true}
		atoms, err := Atoms(ans.Value)
		if err != nil {
			b.Bound, b.Missing = false, []string{err.Error()}
			out[n] = b
			continue
		}
		seenModel, seenTool := map[int]bool{}, map[ToolRef]bool{}
		for _, a := range atoms {
			found := false
			for i, txt := range model {
				if a.Holds(txt) {
					found = true
					if !seenModel[i] {
						seenModel[i] = true
						b.Model = append(b.Model, i)
					}
				}
			}
			for _, tl := range tools {
				if a.Holds(tl.text) {
					found = true
					if !seenTool[tl.ref] {
						seenTool[tl.ref] = true
						b.Tools = append(b.Tools, tl.ref)
					}
				}
			}
			if !found {
				b.Bound = false
				b.Missing = append(b.Missing, a.Text)
			}
		}
		out[n] = b
	}
	return out
}

// Unbound are the names of the answers that are not bound.
func Unbound(bs []Binding) []string {
	var out []string
	for _, b := range bs {
		if !b.Bound {
			out = append(out, b.Answer)
		}
	}
	return out
}
