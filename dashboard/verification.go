package dashboard

import "fmt"

// Verification states of a model-driven result, as entries and attempts
// carry them (docs/verification.md; the coordinator's core sets them).
const (
	VerifyVerified         = "verified"
	VerifyPending          = "pending"
	VerifyNotDrawn         = "not_drawn"
	VerifyNotReplayable    = "not_replayable"
	VerifyUnbound          = "unbound"
	VerifyReplayFailed     = "replay_failed"
	VerifyNondeterministic = "nondeterministic"
	VerifyForged           = "forged"
)

// Verification is what replay verification says of an attempt's result
// (a model-driven attempt's, once scored), as a submitter may see it: its
// state, how many replays ran and how many tool results differed
// harmlessly. It never says which node ran what, nor a node's rate.
type Verification struct {
	State string `json:"state"`
	// Replays counts the replays asked for.
	Replays int `json:"replays"`
	// Benign counts the tool results that differed harmlessly over its
	// replays (timestamps, seeded noise beside the answer...).
	Benign int `json:"benign,omitempty"`
	// Reason is the core's (admin only: it names the node's rate).
	Reason string `json:"reason,omitempty"`
}

// Bound reports whether the result's answers were found in its
// trajectory (every state but unbound: binding is checked at scoring).
func (v Verification) Bound() bool { return v.State != VerifyUnbound }

// Counted reports whether the result counts on the boards.
func (v Verification) Counted() bool { return v.State != VerifyUnbound && v.State != VerifyForged }

// Verdict is the state in a few words.
func (v Verification) Verdict() string {
	switch v.State {
	case VerifyVerified:
		if v.Benign > 0 {
			return "replay-verified, with benign differences"
		}
		return "replay-verified"
	case VerifyPending:
		return "unverified: replay running"
	case VerifyNotDrawn:
		return "unverified: not picked for a replay"
	case VerifyNotReplayable:
		return "unverified: not replayable"
	case VerifyUnbound:
		return "unbound: not counted"
	case VerifyReplayFailed:
		return "unverified: replay failed"
	case VerifyNondeterministic:
		return "unverified: nondeterministic"
	case VerifyForged:
		return "forged: not counted"
	}
	return v.State
}

// Explain says what the state means to the result's submitter.
func (v Verification) Explain() string {
	switch v.State {
	case VerifyVerified:
		s := "Another volunteer re-ran the attempt's tools with the recorded model answers (a replay, at no model cost) and the tool outputs the answers came from matched."
		if v.Benign > 0 {
			s += fmt.Sprintf(" %d tool output(s) differed harmlessly (times, identifiers, values beside the answers).", v.Benign)
		}
		return s
	case VerifyPending:
		return "A replay of its tools with the recorded model answers is queued or running on another volunteer's node; until it ends the result counts as unverified."
	case VerifyNotDrawn:
		return "A share of results is replayed at random to check them; this one was not picked, so it counts as unverified."
	case VerifyNotReplayable:
		return "The agent is declared not replayable, so its results are never replayed and count as unverified."
	case VerifyUnbound:
		return "An answer in its report.json appears in no model output or tool result of its trajectory (or the conversation was rewritten): the result is not counted and the run is redone elsewhere."
	case VerifyReplayFailed:
		return "Its replay could not run, so the result counts as unverified; no one is penalised."
	case VerifyNondeterministic:
		return "Two replays of its tools disagreed with each other where the answers are (the computation is not deterministic), so the result counts as unverified; no one is penalised."
	case VerifyForged:
		return "Two replays agreed with each other and not with the recorded tool output the answers came from: the result was forged, is not counted, and the run is redone elsewhere."
	}
	return ""
}
