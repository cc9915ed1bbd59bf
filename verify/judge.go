package verify

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// MaxReplays bounds the replays of one attempt: a third is asked for only
// when two disagree in a way a third decides (one replay alone against
// the recording and another; two agreeing against the recording on a
// result no answer holds literally).
const MaxReplays = 3

// JudgeInput is what Judge reads: the recorded attempt's counted calls
// and answers, and each replay's calls and (for runs without model
// calls) answers.
type JudgeInput struct {
	Recorded []Exchange
	Answers  []Answer
	Replays  [][]Exchange
	// ReplayAnswers are each replay's own answers (nil: not read). They
	// are compared with Answers when the recorded run made no answered
	// model call: such a run's replay is a replica.
	ReplayAnswers [][]Answer
	// Outputs and ReplayOutputs name each returned output's content (path
	// to content address) of the recorded attempt and of each replay (nil:
	// not known). For a run without model calls, outputs that hold no
	// answers binding can read (directories, tarballs, text) are compared
	// by content: a replica's outputs.
	Outputs       map[string]string
	ReplayOutputs []map[string]string
	Tolerance     Tolerance
}

// Judge concludes from the replays of an attempt so far (Judge over
// JudgeInput without replays' answers).
func Judge(recorded []Exchange, replays [][]Exchange, answers []Answer, tol Tolerance) Judgement {
	return JudgeAll(JudgeInput{Recorded: recorded, Answers: answers, Replays: replays, Tolerance: tol})
}

// item is one thing a replay must reproduce: a recorded tool result,
// a recorded call being made at all, no call beyond the recording, or
// (for a run without model calls) an answer.
type item struct {
	what string
	rec  string
	reps []string
	has  []bool
	// atoms are the answers' atoms the recorded value holds; names the
	// answers they are of.
	atoms []Atom
	names []string
	// structural: a call made or not, or an answer of a run without
	// calls: two replays agreeing against the recording decide.
	structural bool
}

// itemVerdict is how the replays so far stand on one item.
type itemVerdict int

const (
	itemSame itemVerdict = iota
	itemBenign
	itemNeedsReplay
	itemNondeterministic
	itemForged
)

// JudgeAll concludes from the replays of an attempt so far, each on a
// node of an operator other than the recorder's and each other's. Every
// recorded tool result of the counted assignment, every recorded call and
// the absence of calls beyond the recording are items a replay must
// reproduce (for a run without model calls, its answers). On each item:
//   - every replay agrees with the recording: fine;
//   - one replay alone: any difference asks for a second;
//   - two replays agree with each other and not with the recording: the
//     recording was forged (Forged) when the item held an answer
//     literally or is structural; otherwise a third replay must agree
//     too (honest low-entropy noise, such as a coin flip, can make two
//     replays agree by chance);
//   - replays that differ from the recording and from each other are
//     nondeterministic work: Nondeterministic where an answer came from,
//     benign elsewhere;
//   - a replay that differs where two others agree with the recording is
//     outvoted (Judgement.Outvoted: its replayer is marked), and the
//     item is fine; with only one other, a third replay decides.
func JudgeAll(in JudgeInput) Judgement {
	j := Judgement{Verdict: NeedsReplay, Reason: "no replay yet"}
	if len(in.Replays) == 0 {
		return j
	}
	tol := in.Tolerance
	var recs map[ToolRef]string
	var reps []map[ToolRef]string
	for _, rp := range in.Replays {
		c, r, p := compare(in.Recorded, rp, in.Answers, tol)
		recs, reps = r, append(reps, p)
		j.Comparisons = append(j.Comparisons, c)
		j.Normalised += c.countNormalised()
	}
	items := judgeItems(in, j.Comparisons, recs, reps)
	n := len(in.Replays)
	outvoted := map[int]bool{}
	var first [itemForged + 1]*item
	count := map[itemVerdict]int{}
	for k := range items {
		it := &items[k]
		v, odd := tol.judgeItem(it)
		if odd >= 0 {
			outvoted[odd] = true
		}
		count[v]++
		if first[v] == nil {
			first[v] = it
		}
	}
	j.Benign = count[itemBenign]
	switch {
	case first[itemForged] != nil:
		it := first[itemForged]
		j.Verdict = Forged
		j.Reason = fmt.Sprintf("%d replays on other operators agree with each other on %s, and the recording differs", n, it.what)
		if len(it.names) > 0 {
			j.Reason += fmt.Sprintf(" (it held answers %s)", strings.Join(it.names, ", "))
		}
		return j
	case first[itemNeedsReplay] != nil && n < MaxReplays:
		j.Reason = fmt.Sprintf("the replays so far do not settle %s: another replay decides", first[itemNeedsReplay].what)
		return j
	case first[itemNondeterministic] != nil || first[itemNeedsReplay] != nil:
		it := first[itemNondeterministic]
		if it == nil {
			it = first[itemNeedsReplay]
		}
		j.Verdict = Nondeterministic
		j.Reason = fmt.Sprintf("the replays disagree with each other on %s: not reproducible there", it.what)
		if len(it.names) > 0 {
			j.Reason += fmt.Sprintf(" (answers %s came from it)", strings.Join(it.names, ", "))
		}
	default:
		j.Verdict = Verified
		j.Reason = fmt.Sprintf("%d items compared over %d replays: every tool result, call and answer reproduced (%d benign differences, %d equal after normalisation)",
			len(items), n, j.Benign, j.Normalised)
	}
	for i := range n {
		if outvoted[i] {
			j.Outvoted = append(j.Outvoted, i)
		}
	}
	if len(j.Outvoted) > 0 {
		j.Reason += fmt.Sprintf("; replays %v differ where two others agree with the recording", j.Outvoted)
	}
	return j
}

func (c Comparison) countNormalised() int {
	n := 0
	for _, s := range c.Steps {
		if s.Normalised {
			n++
		}
	}
	return n
}

// judgeItems lists what the replays must reproduce.
func judgeItems(in JudgeInput, cs []Comparison, recs map[ToolRef]string, reps []map[ToolRef]string) []item {
	n := len(in.Replays)
	var all []Atom
	type named struct {
		name string
		a    Atom
	}
	var atoms []named
	for _, ans := range in.Answers {
		as, _ := Atoms(ans.Value)
		for _, a := range as {
			atoms = append(atoms, named{ans.Name, a})
			all = append(all, a)
		}
	}
	newItem := func(what, rec string, structural bool) item {
		it := item{what: what, rec: rec, reps: make([]string, n), has: make([]bool, n), structural: structural}
		for _, x := range atoms {
			if x.a.Holds(rec) {
				it.atoms = append(it.atoms, x.a)
				if !containsString(it.names, x.name) {
					it.names = append(it.names, x.name)
				}
			}
		}
		return it
	}
	var items []item
	for k, s := range cs[0].Steps {
		it := newItem(fmt.Sprintf("the tool result of call %s (exchange %d)", s.Ref.CallID, s.Ref.Step), recs[s.Ref], false)
		for i := range n {
			it.reps[i], it.has[i] = lookup(reps[i], cs[i].Steps[k].Ref)
		}
		items = append(items, it)
	}
	// Every recorded answered call must be made.
	unreached := make([]map[int]bool, n)
	for i, c := range cs {
		unreached[i] = map[int]bool{}
		for _, x := range c.Unreached {
			unreached[i][x] = true
		}
	}
	t := ReadTurns(in.Recorded)
	answered := 0
	for x := range in.Recorded {
		if t.Answers[x].Role != RoleAssistant {
			continue
		}
		answered++
		it := newItem(fmt.Sprintf("recorded call %d (made or not)", x), "made", true)
		it.atoms, it.names = nil, nil
		for i := range n {
			it.has[i], it.reps[i] = true, "made"
			if unreached[i][x] {
				it.reps[i] = "not made"
			}
		}
		items = append(items, it)
	}
	// No call beyond the recording.
	extra := item{what: "calls the recording lacks", rec: "0", reps: make([]string, n), has: make([]bool, n), structural: true}
	for i, c := range cs {
		extra.has[i], extra.reps[i] = true, "0"
		if len(c.Extra) > 0 {
			extra.reps[i] = "some"
		}
	}
	items = append(items, extra)
	// A run without model calls: its replays are replicas, compared by
	// their answers.
	if answered == 0 && len(in.ReplayAnswers) == n {
		names := map[string]bool{}
		for _, a := range in.Answers {
			names[a.Name] = true
		}
		for _, ra := range in.ReplayAnswers {
			for _, a := range ra {
				names[a.Name] = true
			}
		}
		for _, name := range sortedKeys(names) {
			rec, _ := answerValue(in.Answers, name)
			it := newItem("answer "+name, rec, true)
			for i := range n {
				it.reps[i], it.has[i] = answerValue(in.ReplayAnswers[i], name)
			}
			it.atoms, it.names = all, []string{name}
			items = append(items, it)
		}
	}
	if answered == 0 && in.Outputs != nil && len(in.ReplayOutputs) == n {
		for _, path := range sortedKeys(in.Outputs) {
			it := item{what: "output " + path, rec: in.Outputs[path], reps: make([]string, n), has: make([]bool, n), structural: true}
			for i := range n {
				it.reps[i], it.has[i] = in.ReplayOutputs[i][path]
			}
			items = append(items, it)
		}
	}
	return items
}

func sortedKeys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	for i := 1; i < len(out); i++ {
		for k := i; k > 0 && out[k] < out[k-1]; k-- {
			out[k], out[k-1] = out[k-1], out[k]
		}
	}
	return out
}

// answerValue is the compact JSON of the answer named name ("" and false
// when there is none).
func answerValue(as []Answer, name string) (string, bool) {
	for _, a := range as {
		if a.Name == name {
			var b bytes.Buffer
			if json.Compact(&b, a.Value) != nil {
				return string(a.Value), true
			}
			return b.String(), true
		}
	}
	return "", false
}

// judgeItem classes one item over the replays, and names the replay
// outvoted on it (-1: none).
func (tol Tolerance) judgeItem(it *item) (itemVerdict, int) {
	n := len(it.reps)
	off := offFor(it.rec, it.atoms)
	same := func(i int) bool { return it.has[i] && tol.sameOff(it.rec, it.reps[i], off, it.atoms) }
	// lit: the recorded value held an answer's atom the replay's does not.
	lit := func(i int) bool {
		if len(it.atoms) == 0 || it.structural {
			return false
		}
		if !it.has[i] {
			return true
		}
		for _, a := range it.atoms {
			if !a.Holds(it.reps[i]) {
				return true
			}
		}
		return false
	}
	agree := func(i, k int) bool {
		if it.has[i] != it.has[k] {
			return false
		}
		if !it.has[i] || tol.sameOff(it.reps[i], it.reps[k], off, it.atoms) {
			return true
		}
		return lit(i) && lit(k) && tol.agreeWhere(it.rec, it.reps[i], it.reps[k], it.atoms, off)
	}
	var diff []int
	for i := range n {
		if !same(i) {
			diff = append(diff, i)
		}
	}
	switch {
	case len(diff) == 0:
		return itemSame, -1
	case n == 1:
		return itemNeedsReplay, -1
	}
	// The largest group of differing replays that agree with each other.
	best := 0
	for _, i := range diff {
		g := 0
		for _, k := range diff {
			if agree(i, k) {
				g++
			}
		}
		best = max(best, g)
	}
	literal := false
	for _, i := range diff {
		literal = literal || lit(i)
	}
	switch {
	case best >= 2 && (it.structural || literal):
		return itemForged, -1
	case best >= 3:
		return itemForged, -1
	case best == 2 && n-len(diff) == 0:
		return itemNeedsReplay, -1 // a third replay must agree too
	case best == 2:
		return itemNondeterministic, -1
	case len(diff) == 1 && n-1 >= 2:
		return itemSame, diff[0]
	case len(diff) == 1:
		return itemNeedsReplay, -1
	case literal || it.structural:
		return itemNondeterministic, -1
	}
	return itemBenign, -1
}

// agreeWhere says whether two replayed results x and y agree where the
// recorded result rec held the atoms: for each atom, the shortest run of
// tokens of rec (after normalisation) that holds it is compared, token
// for token and strictly, with the same run of x and y, when the three
// have the same shape; else the wholes are compared. What else differs
// between replays (a random draw printed beside the answer) does not
// matter.
func (tol Tolerance) agreeWhere(rec, x, y string, atoms []Atom, off []bool) bool {
	if tol.Normalise {
		rec, x, y = normaliseOff(rec, off), normaliseOff(x, off), normaliseOff(y, off)
	}
	tr, tx, ty := tokens(rec), tokens(x), tokens(y)
	if len(tr) != len(tx) || len(tx) != len(ty) {
		return tol.sameOff(x, y, off, atoms)
	}
	found := false
	for _, a := range atoms {
		lo, hi := window(tr, a)
		if lo < 0 {
			continue
		}
		found = true
		for k := lo; k <= hi; k++ {
			if tx[k] != ty[k] {
				return false
			}
		}
	}
	return found || tol.sameOff(x, y, off, atoms)
}

// window is the shortest run of tokens lo..hi whose text (joined by
// spaces) holds a (-1, -1: none).
func window(ts []string, a Atom) (int, int) {
	for size := 1; size <= len(ts); size++ {
		for lo := 0; lo+size <= len(ts); lo++ {
			if a.Holds(strings.Join(ts[lo:lo+size], " ")) || a.Holds(strings.Join(ts[lo:lo+size], "")) {
				return lo, lo + size - 1
			}
		}
		if size >= 16 {
			break // answers are short; bound the search
		}
	}
	return -1, -1
}
