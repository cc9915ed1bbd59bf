package verify

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"strings"
)

// An attempt's exchanges are several conversations at once: an agent's
// main loop, its sub-agents, a small model's side calls (titles,
// summaries), made concurrently, so that their calls arrive interleaved
// in no fixed order. A conversation is a line of requests in which each
// request shows the model the previous request's messages, its answer and
// new messages that are not the model's (tool results, user messages).
// Splitting reads which request extends which: a request extends the
// last answered exchange of an open conversation when its messages begin
// with that exchange's request and answer and add no assistant message
// after them; otherwise it starts a conversation (legitimately when it
// shows the model no assistant turn, or repeats an earlier request whole:
// a retry; else it is a finding: a rewrite, or a fork of an exchange that
// another request already continued).

// Place is where one exchange stands among its attempt's conversations.
type Place struct {
	// Conv is the conversation's index (in the order they started), -1
	// for a failed exchange that would have started one.
	Conv int `json:"conv"`
	// Pos is the exchange's position in its conversation (0: it starts
	// it). A failed exchange takes the place its retry will take.
	Pos int `json:"pos"`
	// Prev is the exchange it extends (-1: none). A fork names the
	// exchange it continues a second time while starting a conversation.
	Prev int `json:"prev"`
	// From is the index of the first message the request adds: past the
	// extended request and its answer (0 when it extends none).
	From int `json:"from"`
	// Retried: the exchange failed and a later request repeats it whole
	// (its retry stands for it).
	Retried bool `json:"retried,omitempty"`
}

// Conversations are an attempt's exchanges split into conversations.
type Conversations struct {
	// Places has one place per exchange.
	Places []Place
	// Convs are the answered exchanges of each conversation, in order.
	Convs [][]int
	// Findings are the requests that break the append-only rule.
	Findings []Finding
}

// digest is the SHA-256 of a message sequence.
type digest [sha256.Size]byte

// prefixKey names a message sequence by its length and digest.
type prefixKey struct {
	n int
	d digest
}

// chainDigest is the digest of a sequence with digest prev followed by m;
// two sequences have the same digest when their messages are Equal.
func chainDigest(prev digest, m Message) digest {
	b, _ := json.Marshal(Message{Role: m.Role, Text: strings.TrimSpace(m.Text), CallID: m.CallID, Calls: m.Calls})
	h := sha256.New()
	h.Write(prev[:])
	h.Write(b)
	return digest(h.Sum(nil))
}

// digests are the digests of every prefix of ms: out[k] of ms[:k].
func digests(ms []Message) []digest {
	out := make([]digest, len(ms)+1)
	for k, m := range ms {
		out[k+1] = chainDigest(out[k], m)
	}
	return out
}

func lastAssistant(ms []Message) int {
	for k := len(ms) - 1; k >= 0; k-- {
		if ms[k].Role == RoleAssistant {
			return k
		}
	}
	return -1
}

// splitter places exchanges one at a time (the gateway places a replay's
// calls as they come). Exchanges are named by ids the caller gives.
type splitter struct {
	// ext maps a request followed by its answer to the answered
	// exchanges that were that, in order.
	ext map[prefixKey][]int
	// seen are the requests placed so far.
	seen map[prefixKey]bool
	// tips are each conversation's last answered exchange; tipOf the
	// conversation an exchange is the tip of.
	tips  []int
	tipOf map[int]int
	// pos and next: an answered exchange's position, and the first
	// exchange that extended it.
	pos  map[int]int
	next map[int]int
}

func newSplitter() *splitter {
	return &splitter{ext: map[prefixKey][]int{}, seen: map[prefixKey]bool{}, tipOf: map[int]int{}, pos: map[int]int{}, next: map[int]int{}}
}

// findingKind is what is wrong with a request's place ("": nothing).
type findingKind string

const (
	findRewrite findingKind = "rewrite"
	findFork    findingKind = "fork"
)

// placed is a request's place before it is committed, and the finding it
// makes.
type placed struct {
	Place
	n    int
	full digest // the request's digest
	kind findingKind
	// fork: the exchange continued twice and the one that continued it
	// first.
	forkOf, firstNext int
}

// place reads where a request goes: Conv -1 when it starts a
// conversation.
func (s *splitter) place(req []Message, ds []digest) placed {
	p := placed{Place: Place{Conv: -1, Prev: -1}, n: len(req), full: ds[len(req)], forkOf: -1, firstNext: -1}
	a := lastAssistant(req)
	if a < 0 {
		return p
	}
	retry := s.seen[prefixKey{len(req), ds[len(req)]}]
	js := s.ext[prefixKey{a + 1, ds[a+1]}]
	for _, j := range js {
		if c, ok := s.tipOf[j]; ok {
			p.Conv, p.Pos, p.Prev, p.From = c, s.pos[j]+1, j, a+1
			return p
		}
	}
	if len(js) > 0 {
		j := js[len(js)-1]
		p.Prev, p.From = j, a+1
		if !retry {
			p.kind, p.forkOf, p.firstNext = findFork, j, s.next[j]
		}
		return p
	}
	if !retry {
		p.kind = findRewrite
	}
	return p
}

// commit adds exchange id at its place; answer is nil for a failed
// exchange (it extends nothing further). It returns the place.
func (s *splitter) commit(id int, p placed, answer *Message) Place {
	s.seen[prefixKey{p.n, p.full}] = true
	if answer == nil {
		return p.Place
	}
	if p.Conv >= 0 && s.tips[p.Conv] != p.Prev {
		// The tip moved since the request was placed (two calls at once
		// in one conversation): the later starts a conversation of its own.
		p.Conv, p.Pos = -1, 0
	}
	if p.Conv < 0 {
		p.Conv, p.Pos = len(s.tips), 0
		s.tips = append(s.tips, id)
	} else {
		delete(s.tipOf, p.Prev)
		s.tips[p.Conv] = id
	}
	if p.Prev >= 0 {
		if _, ok := s.next[p.Prev]; !ok {
			s.next[p.Prev] = id
		}
	}
	s.tipOf[id] = p.Conv
	s.pos[id] = p.Pos
	k := prefixKey{p.n + 1, chainDigest(p.full, *answer)}
	s.ext[k] = append(s.ext[k], id)
	return p.Place
}

// Split reads an attempt's exchanges as conversations and applies the
// append-only rule to each.
func Split(t Turns) Conversations {
	s := newSplitter()
	out := Conversations{Places: make([]Place, len(t.Requests))}
	failed := map[digest][]int{} // failed requests not repeated yet
	for i, req := range t.Requests {
		p := s.place(req, digests(req))
		for _, f := range failed[p.full] {
			out.Places[f].Retried = true
		}
		delete(failed, p.full)
		var ans *Message
		if t.Answers[i].Role == RoleAssistant {
			ans = &t.Answers[i]
		}
		pl := s.commit(i, p, ans)
		out.Places[i] = pl
		if ans == nil {
			failed[p.full] = append(failed[p.full], i)
		}
		if ans != nil {
			if pl.Conv == len(out.Convs) {
				out.Convs = append(out.Convs, nil)
			}
			out.Convs[pl.Conv] = append(out.Convs[pl.Conv], i)
		}
		switch p.kind {
		case findRewrite:
			out.Findings = append(out.Findings, Finding{Step: i, Kind: FindingRewrite,
				Detail: fmt.Sprintf("request %d shows the model %d messages that extend no earlier request and its answer: earlier turns were dropped or changed", i, len(req))})
		case findFork:
			out.Findings = append(out.Findings, Finding{Step: i, Kind: FindingRewrite,
				Detail: fmt.Sprintf("request %d continues exchange %d otherwise than request %d did: what the model was shown after it was changed", i, p.forkOf, p.firstNext)})
		}
	}
	return out
}

// SplitExchanges splits exchanges (ReadTurns, then Split).
func SplitExchanges(exchanges []Exchange) Conversations {
	return Split(ReadTurns(exchanges))
}
