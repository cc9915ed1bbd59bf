package verify

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// Tolerance says which differences between a recorded tool result and a
// replayed one are benign: numbers within Relative (or Absolute) of each
// other, and, when Normalise is set, timestamps, dates, clock times,
// durations, UUIDs and long hex strings (ids, hashes, addresses), which
// are replaced by placeholders before comparing.
type Tolerance struct {
	Relative  float64 `json:"relative"`
	Absolute  float64 `json:"absolute"`
	Normalise bool    `json:"normalise"`
}

// DefaultTolerance: numbers within one part in a million, everything
// normalised.
func DefaultTolerance() Tolerance {
	return Tolerance{Relative: 1e-6, Absolute: 1e-12, Normalise: true}
}

// Placeholders are in brackets no program prints by chance.
var normalisers = []struct {
	re   *regexp.Regexp
	with string
}{
	// 2026-11-24T09:13:44.123Z, 2026-11-24 09:13:44+01:00
	{regexp.MustCompile(`\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:[.,]\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?`), "⟨time⟩"},
	// Tue Nov 24 09:13:44 UTC 2026 (date(1)), Tue, 24 Nov 2026 09:13:44 GMT
	{regexp.MustCompile(`(?i)(?:mon|tue|wed|thu|fri|sat|sun)[a-z]*,? +(?:\d{1,2} +)?(?:jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec)[a-z]* +(?:\d{1,2} +)?(?:\d{4} +)?\d{1,2}:\d{2}:\d{2}(?:\.\d+)?(?: +[A-Z]{2,5})?(?: +\d{4})?`), "⟨time⟩"},
	{regexp.MustCompile(`\d{4}-\d{2}-\d{2}`), "⟨date⟩"},
	{regexp.MustCompile(`\b\d{1,2}:\d{2}:\d{2}(?:[.,]\d+)?\b`), "⟨time⟩"},
	{regexp.MustCompile(`(?i)\b[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\b`), "⟨uuid⟩"},
	{regexp.MustCompile(`(?i)\b\d+(?:\.\d+)?\s?(?:ns|µs|us|ms|s|sec|secs|seconds|min|minutes|h|hours)\b`), "⟨duration⟩"},
}

var hexID = regexp.MustCompile(`(?i)\b(?:0x)?[0-9a-f]{8,}\b`)

// Normalise replaces what differs between honest runs of the same
// commands (times, ids, durations) by placeholders.
func Normalise(s string) string {
	for _, n := range normalisers {
		s = n.re.ReplaceAllString(s, n.with)
	}
	// Hex strings of 8 digits or more with a letter among them: ids and
	// hashes (runs of decimal digits are numbers, compared with tolerance).
	return hexID.ReplaceAllStringFunc(s, func(m string) string {
		if !isHexID(m) {
			return m
		}
		return "⟨id⟩"
	})
}

// isHexID reports whether a hexID match is an id or hash: it has a letter
// among its digits (a run of decimal digits is a number).
func isHexID(m string) bool {
	return strings.IndexFunc(strings.TrimPrefix(strings.ToLower(m), "0x"), func(r rune) bool { return r >= 'a' && r <= 'f' }) >= 0
}

// Same says whether two tool outputs agree under tol: after normalising
// (when asked), their words are equal, numbers within the tolerance.
func (tol Tolerance) Same(a, b string) bool {
	if a == b {
		return true
	}
	if tol.Normalise {
		a, b = Normalise(a), Normalise(b)
	}
	ta, tb := tokens(a), tokens(b)
	if len(ta) != len(tb) {
		return false
	}
	for i := range ta {
		if ta[i] == tb[i] {
			continue
		}
		x, errx := strconv.ParseFloat(ta[i], 64)
		y, erry := strconv.ParseFloat(tb[i], 64)
		if errx != nil || erry != nil || !(math.Abs(x-y) <= math.Max(tol.Absolute, tol.Relative*math.Max(math.Abs(x), math.Abs(y)))) {
			return false
		}
	}
	return true
}

// tokens splits text into numbers and the runs of other text between
// them (whitespace collapsed).
func tokens(s string) []string {
	var out []string
	last := 0
	for _, loc := range numbers.FindAllStringIndex(s, -1) {
		if t := strings.Join(strings.Fields(s[last:loc[0]]), " "); t != "" {
			out = append(out, t)
		}
		out = append(out, s[loc[0]:loc[1]])
		last = loc[1]
	}
	if t := strings.Join(strings.Fields(s[last:]), " "); t != "" {
		out = append(out, t)
	}
	return out
}

// Class is how a replayed tool result compares with the recorded one.
type Class string

// Classes, from harmless to damning.
const (
	// Same: equal, or equal after normalisation and within tolerance
	// (Benign says which).
	Same Class = "same"
	// Benign: different beyond normalisation, but no answer came from the
	// recorded result (random numbers, a progress bar, a listing order).
	Benign Class = "benign"
	// AnswerBearing: different, and the recorded result holds an answer
	// the replayed one does not: the answer may have come from a forged
	// tool result (or from nondeterministic science; Judge tells which).
	AnswerBearing Class = "answer_bearing"
	// Missing: the replay produced no result at this step (it stopped,
	// or called tools otherwise).
	Missing Class = "missing"
)

// StepDiff is the comparison of one recorded tool result.
type StepDiff struct {
	Ref   ToolRef `json:"ref"`
	Class Class   `json:"class"`
	// Normalised: equal only after normalisation or within tolerance.
	Normalised bool `json:"normalised,omitempty"`
	// Answers are the answers whose atoms the recorded result holds and
	// the replayed one does not.
	Answers []string `json:"answers,omitempty"`
}

// Comparison is a replay compared with the recorded trajectory.
type Comparison struct {
	Steps []StepDiff `json:"steps"`
	// Pairs has, for each replayed exchange, the recorded exchange it
	// replayed (-1: none); Unreached are the recorded answered exchanges
	// that no replayed exchange replayed (a conversation the replay did
	// not have, or ended sooner).
	Pairs     []int `json:"pairs,omitempty"`
	Unreached []int `json:"unreached,omitempty"`
	// Exchanges: how many calls each side made.
	Recorded, Replayed int `json:"-"`
}

// Count is how many steps are of class c.
func (c Comparison) Count(class Class) int {
	n := 0
	for _, s := range c.Steps {
		if s.Class == class {
			n++
		}
	}
	return n
}

// toolResults maps each tool message shown to the model for the first
// time (in its conversation) to its text, in order.
func toolResults(t Turns, places []Place) ([]ToolRef, map[ToolRef]string) {
	var refs []ToolRef
	text := map[ToolRef]string{}
	for i := range t.Requests {
		if places[i].Retried {
			continue // its retry shows the same results
		}
		for n, k := range newTools(t, places, i) {
			m := t.Requests[i][k]
			// Positions, not message indexes, pair a replay's results:
			// the replayed history may differ in length before them.
			r := ToolRef{Step: i, Msg: n, CallID: m.CallID}
			refs = append(refs, r)
			text[r] = m.Text
		}
	}
	return refs, text
}

// replayResults are a replay's new tool results named by the recorded
// exchange its exchange replayed (pairs), in the recorded step's terms.
func replayResults(t Turns, places []Place, pairs []int) map[ToolRef]string {
	out := map[ToolRef]string{}
	for j := range t.Requests {
		if pairs[j] < 0 {
			continue
		}
		for n, k := range newTools(t, places, j) {
			m := t.Requests[j][k]
			out[ToolRef{Step: pairs[j], Msg: n, CallID: m.CallID}] = m.Text
		}
	}
	return out
}

// Compare compares a replay (the same agent, given the recorded answers,
// running its tools honestly on another node) with the recorded
// trajectory, tool result by tool result: each replayed exchange is
// paired with the recorded exchange it replayed (Pair: by conversation,
// whatever the order the conversations' calls came in), and a tool result
// with the one at the same position among the new tool results of its
// pair. Each recorded result that differs is classed with the answers of
// the report (Bind's atoms): a result that held an answer the replay's
// does not is AnswerBearing.
func Compare(recorded, replayed []Exchange, answers []Answer, tol Tolerance) Comparison {
	c, _, _ := compare(recorded, replayed, answers, tol)
	return c
}

// compare is Compare, also returning the recorded tool results and the
// replay's (in the recorded steps' terms).
func compare(recorded, replayed []Exchange, answers []Answer, tol Tolerance) (Comparison, map[ToolRef]string, map[ToolRef]string) {
	rt, pt := ReadTurns(recorded), ReadTurns(replayed)
	pairs := Pair(recorded, replayed, tol)
	refs, rec := toolResults(rt, Split(rt).Places)
	rep := replayResults(pt, Split(pt).Places, pairs)
	var atoms []struct {
		name string
		a    Atom
	}
	for _, ans := range answers {
		as, _ := Atoms(ans.Value)
		for _, a := range as {
			atoms = append(atoms, struct {
				name string
				a    Atom
			}{ans.Name, a})
		}
	}
	c := Comparison{Recorded: len(recorded), Replayed: len(replayed), Pairs: pairs}
	reached := make([]bool, len(recorded))
	for _, i := range pairs {
		if i >= 0 {
			reached[i] = true
		}
	}
	for i := range recorded {
		if !reached[i] && rt.Answers[i].Role == RoleAssistant {
			c.Unreached = append(c.Unreached, i)
		}
	}
	for _, r := range refs {
		d := StepDiff{Ref: r, Class: Same}
		got, ok := lookup(rep, r)
		want := rec[r]
		switch {
		case !ok:
			d.Class = Missing
		case want == got:
		case tol.Same(want, got):
			d.Normalised = true
		default:
			d.Class = Benign
		}
		if d.Class != Same {
			for _, x := range atoms {
				if x.a.Holds(want) && !(ok && x.a.Holds(got)) && !containsString(d.Answers, x.name) {
					d.Answers = append(d.Answers, x.name)
				}
			}
			if len(d.Answers) > 0 {
				d.Class = AnswerBearing
			}
		}
		c.Steps = append(c.Steps, d)
	}
	return c, rec, rep
}

func containsString(ss []string, s string) bool {
	for _, x := range ss {
		if x == s {
			return true
		}
	}
	return false
}

// Verdict is what replays conclude about an attempt.
type Verdict string

// Verdicts.
const (
	// Verified: every tool result the replay produced agrees with the
	// recorded one (maybe after normalisation) or differs only where no
	// answer came from.
	Verified Verdict = "verified"
	// NeedsReplay: a result an answer came from differs; another replay
	// on a third node decides.
	NeedsReplay Verdict = "needs_replay"
	// Forged: two replays on distinct nodes agree with each other and not
	// with the recorded result an answer came from.
	Forged Verdict = "forged"
	// Nondeterministic: the replays disagree among themselves where the
	// answer came from: the work itself is not reproducible there; the
	// attempt stays unverified and the node is not penalised.
	Nondeterministic Verdict = "nondeterministic"
)

// Judgement is Judge's conclusion.
type Judgement struct {
	Verdict Verdict `json:"verdict"`
	// Benign counts the tool results that differed without bearing an
	// answer, Normalised those equal only after normalisation, over all
	// replays.
	Benign     int    `json:"benign"`
	Normalised int    `json:"normalised"`
	Reason     string `json:"reason"`
	// Comparisons are each replay's, in order.
	Comparisons []Comparison `json:"comparisons,omitempty"`
}

// Judge concludes from the replays of an attempt so far (one or two, each
// on a node other than the recorder's and each other's). A first replay
// with no answer-bearing difference verifies the attempt; one with such a
// difference asks for a second; the second decides between a forgery (the
// replays agree on the results the answers came from) and
// nondeterministic work (they do not).
func Judge(recorded []Exchange, replays [][]Exchange, answers []Answer, tol Tolerance) Judgement {
	j := Judgement{Verdict: NeedsReplay, Reason: "no replay yet"}
	if len(replays) == 0 {
		return j
	}
	var suspect []StepDiff
	var rec map[ToolRef]string
	var reps []map[ToolRef]string
	for _, rp := range replays {
		c, r, p := compare(recorded, rp, answers, tol)
		rec, reps = r, append(reps, p)
		j.Comparisons = append(j.Comparisons, c)
		for _, s := range c.Steps {
			switch {
			case s.Class == Benign:
				j.Benign++
			case s.Normalised:
				j.Normalised++
			}
		}
	}
	for _, s := range j.Comparisons[0].Steps {
		if s.Class == AnswerBearing || s.Class == Missing && len(s.Answers) > 0 {
			suspect = append(suspect, s)
		}
	}
	if len(suspect) == 0 {
		j.Verdict = Verified
		j.Reason = fmt.Sprintf("%d tool results compared: no answer came from a result the replay did not reproduce (%d benign differences, %d equal after normalisation)",
			len(j.Comparisons[0].Steps), j.Benign, j.Normalised)
		if n := len(j.Comparisons[0].Unreached); n > 0 {
			j.Reason += fmt.Sprintf("; %d recorded calls the replay never made", n)
		}
		return j
	}
	s := suspect[0]
	if len(replays) < 2 {
		j.Reason = fmt.Sprintf("the tool result of call %s (exchange %d) held answers %s that the replay's did not: a second replay decides",
			s.Ref.CallID, s.Ref.Step, strings.Join(s.Answers, ", "))
		return j
	}
	a, b := reps[0], reps[1]
	for _, s := range suspect {
		x, okx := lookup(a, s.Ref)
		y, oky := lookup(b, s.Ref)
		var atoms []Atom
		for _, ans := range answers {
			if containsString(s.Answers, ans.Name) {
				as, _ := Atoms(ans.Value)
				atoms = append(atoms, as...)
			}
		}
		if okx != oky || okx && !tol.agreeWhere(rec[s.Ref], x, y, atoms) {
			j.Verdict = Nondeterministic
			j.Reason = fmt.Sprintf("two replays disagree with each other on the tool result of call %s (exchange %d), which answers %s came from: not reproducible there",
				s.Ref.CallID, s.Ref.Step, strings.Join(s.Answers, ", "))
			return j
		}
	}
	j.Verdict = Forged
	j.Reason = fmt.Sprintf("two replays on other nodes agree on the tool result of call %s (exchange %d), and the recorded one differs from it and held answers %s",
		s.Ref.CallID, s.Ref.Step, strings.Join(s.Answers, ", "))
	return j
}

func lookup(m map[ToolRef]string, r ToolRef) (string, bool) {
	if v, ok := m[r]; ok {
		return v, true
	}
	// The results of one turn's tools, run at once, come in the order
	// they finished (Claude Code's): a result with a call ID is the one
	// of the same call in the same step, wherever it stands.
	if r.CallID != "" {
		for k, v := range m {
			if k.Step == r.Step && k.CallID == r.CallID {
				return v, true
			}
		}
	}
	for k, v := range m {
		if k.Step == r.Step && k.Msg == r.Msg && (r.CallID == "" || k.CallID == "") {
			return v, true
		}
	}
	return "", false
}

// agreeWhere says whether two replayed results x and y agree where the
// recorded result rec held the atoms: at the same token positions (after
// normalisation) when the three have the same shape, else as wholes. What
// else differs between replays (a random draw printed beside the answer)
// does not matter.
func (tol Tolerance) agreeWhere(rec, x, y string, atoms []Atom) bool {
	if tol.Normalise {
		rec, x, y = Normalise(rec), Normalise(x), Normalise(y)
	}
	tr, tx, ty := tokens(rec), tokens(x), tokens(y)
	if len(tr) != len(tx) || len(tx) != len(ty) {
		return tol.Same(x, y)
	}
	for i, tok := range tr {
		held := false
		for _, a := range atoms {
			held = held || a.Holds(tok)
		}
		if held && !tol.Same(tx[i], ty[i]) {
			return false
		}
	}
	return true
}
