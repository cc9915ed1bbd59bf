package verify

import (
	"fmt"
	"slices"
	"strings"
)

// A replay's calls are paired with the recorded calls they replay by
// conversation, not by arrival order: a replay call that extends one of
// the replay's conversations is paired with the recorded call that
// extends the recorded call its predecessor was paired with (the same
// conversation, the next position); a replay call that starts a
// conversation is paired with a recorded call that started one. Among
// the candidates, the request must have the recorded request's shape
// (as many new messages, with the same roles) and, for a start, share
// text with it; the candidate whose messages are all the same (after
// normalisation, numbers within tolerance: Tolerance.Same) wins, then
// the one with the most non-tool messages the same, then one the agent
// went on from (of a call retried after its answer was lost, the retry
// it continued), then the first recorded. Tool results never decide a pairing: they are what
// replays compare (Compare).

// NoMatchError says why a replay call has no recorded call to answer it.
type NoMatchError struct {
	// Exhausted: every answered recorded call has been given already.
	Exhausted bool
	// Recorded is how many answered recorded calls there are.
	Recorded int
	Reason   string
}

func (e *NoMatchError) Error() string { return e.Reason }

// candidate is a recorded exchange as pairing reads it.
type candidate struct {
	answered bool
	// continued: a later request extends it (the agent went on from its
	// answer; a retried call's lost answer was not).
	continued  bool
	api, model string
	prev       int
	// msgs are the messages the request adds (all of them for a start).
	msgs   []Message
	answer Message
}

// pairScore ranks a candidate for a request adding msgs.
type pairScore struct {
	ok        bool
	exact     bool
	same      int
	continued bool
}

func (a pairScore) better(b pairScore) bool {
	switch {
	case a.exact != b.exact:
		return a.exact
	case a.same != b.same:
		return a.same > b.same
	}
	return a.continued && !b.continued
}

// score compares what a replay request adds with what a recorded one
// added: ok when they have the same shape (and, for a start, share a
// non-tool text or have none), exact when every message is the same.
func score(tol Tolerance, a, b []Message, start bool) pairScore {
	if len(a) != len(b) {
		return pairScore{}
	}
	s := pairScore{ok: true, exact: true}
	nonTool := 0
	for k := range a {
		x, y := a[k], b[k]
		if x.Role != y.Role {
			return pairScore{}
		}
		eq := strings.TrimSpace(x.Text) == strings.TrimSpace(y.Text) || tol.Same(x.Text, y.Text)
		eq = eq && x.CallID == y.CallID && len(x.Calls) == len(y.Calls)
		for c := range x.Calls {
			eq = eq && x.Calls[c] == y.Calls[c]
		}
		if !eq {
			s.exact = false
		}
		if x.Role != RoleTool {
			nonTool++
			if eq {
				s.same++
			}
		}
	}
	if start && !s.exact && s.same == 0 && nonTool > 0 {
		return pairScore{}
	}
	return s
}

// pick returns the best candidate for a request adding msgs after the
// recorded exchange prev (-1: a start), or -1.
func pick(tol Tolerance, cands []candidate, taken func(int) bool, api, model string, answered bool, prev int, msgs []Message) (int, pairScore) {
	best, bs := -1, pairScore{}
	for i, c := range cands {
		if c.prev != prev || c.answered != answered || taken(i) || c.api != api || model != "" && c.model != "" && model != c.model {
			continue
		}
		s := score(tol, msgs, c.msgs, prev < 0)
		s.continued = c.continued
		if s.ok && (best < 0 || s.better(bs)) {
			best, bs = i, s
		}
	}
	return best, bs
}

// readLenient reads an exchange's request and answer as messages; a body
// of an API it cannot read is one message holding its canonical JSON, so
// that such calls are paired by their whole content.
func readLenient(e Exchange) ([]Message, Message, bool) {
	if counting(e.API) {
		// Paired by content, like a body this package cannot read.
		req := []Message{{Role: RoleUser, Text: canonicalJSON(e.Request)}}
		if e.Failed || len(e.Response) == 0 {
			return req, Message{}, false
		}
		return req, Message{Role: RoleAssistant, Text: canonicalJSON(e.Response)}, true
	}
	req, err := RequestMessages(e.API, e.Request)
	if err != nil {
		req = []Message{{Role: RoleUser, Text: canonicalJSON(e.Request)}}
	}
	if e.Failed || len(e.Response) == 0 {
		return req, Message{}, false
	}
	ans, err := ResponseMessage(e.API, e.Response)
	if err != nil {
		ans = Message{Role: RoleAssistant, Text: canonicalJSON(e.Response)}
	}
	return req, ans, true
}

// candidates reads recorded exchanges for pairing.
func candidates(recorded []Exchange) []candidate {
	t := Turns{Requests: make([][]Message, len(recorded)), Answers: make([]Message, len(recorded))}
	for i, e := range recorded {
		t.Requests[i], t.Answers[i], _ = readLenient(e)
	}
	sp := Split(t)
	out := make([]candidate, len(recorded))
	for _, p := range sp.Places {
		if p.Prev >= 0 {
			out[p.Prev].continued = true
		}
	}
	for i, e := range recorded {
		p := sp.Places[i]
		// A copy: the rest of the request is not kept.
		out[i] = candidate{continued: out[i].continued, answered: t.Answers[i].Role == RoleAssistant, api: e.API, model: e.Model, prev: p.Prev,
			msgs: slices.Clone(t.Requests[i][p.From:]), answer: t.Answers[i]}
	}
	return out
}

// Matcher pairs a replay's calls, as they come, with the recorded
// answered calls whose answers they are given. It is not safe for
// concurrent use (the gateway holds a lock per replay).
type Matcher struct {
	tol   Tolerance
	cands []candidate
	used  []bool
	rep   *splitter
	recOf map[int]int // replay call -> recorded exchange
	n     int
}

// NewMatcher returns a matcher over a recorded attempt's exchanges (its
// failed ones are never given).
func NewMatcher(recorded []Exchange, tol Tolerance) *Matcher {
	c := candidates(recorded)
	return &Matcher{tol: tol, cands: c, used: make([]bool, len(c)), rep: newSplitter(), recOf: map[int]int{}}
}

// Match is a replay call paired with a recorded exchange.
type Match struct {
	// Recorded is the recorded exchange's index.
	Recorded int
	// Exact: the request is the recorded one, message for message (after
	// normalisation, numbers within tolerance).
	Exact bool
	// Start: the call starts a conversation.
	Start bool
	p     placed
}

// Match pairs a replay call and reserves the recorded exchange: Commit
// it once the answer is given, Release it if it is not.
func (m *Matcher) Match(e Exchange) (Match, error) {
	req, _, _ := readLenient(e)
	p := m.rep.place(req, digests(req))
	prev := -1
	if p.Prev >= 0 {
		prev = m.recOf[p.Prev]
	}
	i, s := pick(m.tol, m.cands, func(i int) bool { return m.used[i] }, e.API, e.Model, true, prev, req[p.From:])
	if i < 0 {
		return Match{}, m.noMatch(prev)
	}
	m.used[i] = true
	return Match{Recorded: i, Exact: s.exact, Start: prev < 0, p: p}, nil
}

func (m *Matcher) noMatch(prev int) error {
	left, total := 0, 0
	for i, c := range m.cands {
		if c.answered {
			total++
			if !m.used[i] {
				left++
			}
		}
	}
	e := &NoMatchError{Exhausted: left == 0, Recorded: total}
	switch {
	case left == 0:
		e.Reason = fmt.Sprintf("the recorded attempt made %d calls, all given already", total)
	case prev >= 0:
		e.Reason = fmt.Sprintf("the recorded attempt made %d calls; none left (of %d) continues its call %d as this request does", total, left, prev)
	default:
		e.Reason = fmt.Sprintf("the recorded attempt made %d calls; none left (of %d) starts a conversation as this request does", total, left)
	}
	return e
}

// Commit records that the replay call was given the matched answer: its
// conversation now ends with it.
func (m *Matcher) Commit(x Match) {
	a := m.cands[x.Recorded].answer
	m.rep.commit(m.n, x.p, &a)
	m.recOf[m.n] = x.Recorded
	m.n++
}

// Release gives back a match whose answer was not given.
func (m *Matcher) Release(x Match) { m.used[x.Recorded] = false }

// Resume replays a pairing made earlier (after a restart, from the
// replay's records): the call e was given recorded exchange i's answer.
func (m *Matcher) Resume(e Exchange, i int) error {
	if i < 0 || i >= len(m.cands) || !m.cands[i].answered || m.used[i] {
		return fmt.Errorf("resume a replay: recorded exchange %d is not an answered one left", i)
	}
	req, _, _ := readLenient(e)
	x := Match{Recorded: i, p: m.rep.place(req, digests(req))}
	m.used[i] = true
	m.Commit(x)
	return nil
}

// Pair pairs each of a replay's exchanges with the recorded exchange it
// replays (-1: none). Exchanges that name what they replay (ReplayOf,
// the gateway's records) are paired by name; the rest as a Matcher pairs
// them, in order: answered with answered (by conversation and content),
// failed with failed (a replay call refused where the recorded call was
// refused too, e.g. for budget, still carries the tool results before it).
func Pair(recorded, replayed []Exchange, tol Tolerance) []int {
	cands := candidates(recorded)
	byID := map[string]int{}
	for i, e := range recorded {
		if e.ID != "" {
			byID[e.ID] = i
		}
	}
	taken := make([]bool, len(recorded))
	out := make([]int, len(replayed))
	t := Turns{Requests: make([][]Message, len(replayed)), Answers: make([]Message, len(replayed))}
	for j, e := range replayed {
		t.Requests[j], t.Answers[j], _ = readLenient(e)
	}
	sp := Split(t)
	for j, e := range replayed {
		out[j] = -1
		if e.ReplayOf != "" {
			if i, ok := byID[e.ReplayOf]; ok && !taken[i] {
				out[j], taken[i] = i, true
			}
			continue
		}
		p := sp.Places[j]
		prev := -1
		if p.Prev >= 0 {
			if prev = out[p.Prev]; prev < 0 {
				continue // it extends a call paired with nothing
			}
		}
		answered := t.Answers[j].Role == RoleAssistant
		if i, _ := pick(tol, cands, func(i int) bool { return taken[i] }, e.API, e.Model, answered, prev, t.Requests[j][p.From:]); i >= 0 {
			out[j], taken[i] = i, true
		}
	}
	return out
}
