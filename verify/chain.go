package verify

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// The chain of an attempt's conversation: h_0 = H("repronet/chain/1" 0
// attempt), h_i = H(h_{i-1} || H(request_i) || H(answer_i)), H SHA-256,
// heads in lowercase hex. The bodies are hashed as recorded (the request
// as the agent sent it, the answer as the gateway gave it), so whoever
// holds the trajectory can recompute the head and the head commits to
// every byte of it, in order. The gateway returns the head after each
// call; the node signs the last one in its report.

// Genesis is h_0 of attempt.
func Genesis(attempt string) string {
	h := sha256.Sum256(append([]byte("repronet/chain/1\x00"), attempt...))
	return hex.EncodeToString(h[:])
}

// Link is the head after an exchange of request and answer on prev.
func Link(prev string, request, answer []byte) string {
	return LinkSums(prev, sha256.Sum256(request), sha256.Sum256(answer))
}

// LinkSums is Link given the bodies' SHA-256 (which their CIDs hold).
func LinkSums(prev string, request, answer [sha256.Size]byte) string {
	h := sha256.New()
	h.Write([]byte(prev))
	h.Write(request[:])
	h.Write(answer[:])
	return hex.EncodeToString(h.Sum(nil))
}

// Head is the head of attempt's chain after exchanges.
func Head(attempt string, exchanges []Exchange) string {
	h := Genesis(attempt)
	for _, e := range exchanges {
		h = Link(h, e.Request, e.Response)
	}
	return h
}

// ValidHead checks the form of a head ("" is allowed: no model call).
func ValidHead(h string) error {
	if h == "" {
		return nil
	}
	if len(h) != 2*sha256.Size {
		return fmt.Errorf("chain head %q: want %d hex digits", h, 2*sha256.Size)
	}
	for _, r := range h {
		if !(r >= '0' && r <= '9' || r >= 'a' && r <= 'f') {
			return fmt.Errorf("chain head %q: want lowercase hex digits", h)
		}
	}
	return nil
}

// Kinds of findings on a trajectory.
const (
	// FindingRewrite: a request shows the model a history that no earlier
	// exchange of the attempt had: earlier turns were dropped, reordered
	// or changed.
	FindingRewrite = "rewrite"
	// FindingUnreadable: a body could not be read as its API's.
	FindingUnreadable = "unreadable"
)

// Finding is something wrong with a trajectory, at an exchange.
type Finding struct {
	Step   int    `json:"step"`
	Kind   string `json:"kind"`
	Detail string `json:"detail"`
}

// Turns are the exchanges read as messages: each request's messages and
// its answer's message.
type Turns struct {
	Requests [][]Message
	Answers  []Message
	// Unreadable holds findings for bodies that could not be read (their
	// messages are empty).
	Unreadable []Finding
}

// ReadTurns reads every exchange's messages.
func ReadTurns(exchanges []Exchange) Turns {
	t := Turns{Requests: make([][]Message, len(exchanges)), Answers: make([]Message, len(exchanges))}
	for i, e := range exchanges {
		if counting(e.API) {
			t.Requests[i] = []Message{{Role: RoleUser, Text: canonicalJSON(e.Request)}}
			continue
		}
		req, err := RequestMessages(e.API, e.Request)
		if err != nil {
			t.Unreadable = append(t.Unreadable, Finding{Step: i, Kind: FindingUnreadable, Detail: "request: " + err.Error()})
		}
		t.Requests[i] = req
		if len(e.Response) > 0 && !e.Failed {
			ans, err := ResponseMessage(e.API, e.Response)
			if err != nil {
				t.Unreadable = append(t.Unreadable, Finding{Step: i, Kind: FindingUnreadable, Detail: "answer: " + err.Error()})
			}
			t.Answers[i] = ans
		}
	}
	return t
}

// CheckAppendOnly applies the append-only rule to an attempt's
// exchanges, read as conversations (Split): every request either starts
// a conversation (it shows the model no assistant turn), repeats an
// earlier request (a retry), or extends the last answered exchange of one
// conversation (its messages begin with that exchange's request and
// answer, in order, unchanged) with new messages that are not the
// model's; and no exchange is continued in two different ways (a
// conversation is a line, not a tree). Several conversations may run side
// by side, their calls interleaved in any order (an agent with sub-agents
// and side calls); none may be rewritten. It returns a finding per
// request that breaks the rule, and per body it cannot read.
func CheckAppendOnly(exchanges []Exchange) []Finding {
	t := ReadTurns(exchanges)
	return append(append([]Finding(nil), t.Unreadable...), Split(t).Findings...)
}
