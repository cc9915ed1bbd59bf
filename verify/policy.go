package verify

import (
	"errors"
	"fmt"
)

// Policy is the adaptive replay policy (BOINC's adaptive replication,
// applied to replays instead of replicas): a node's attempts are
// replayed with a probability that starts at NewNodeRate and falls as
// 1/(1+clean replays in a row), never below Floor; a forgery quarantines
// the node at once; marks (unbound answers, rewritten conversations)
// quarantine it once MarksToQuarantine accumulate, and each resets its
// clean run so that its next attempts are replayed more.
type Policy struct {
	NewNodeRate       float64   `json:"new_node_rate"`
	Floor             float64   `json:"floor"`
	MarksToQuarantine int       `json:"marks_to_quarantine"`
	Tolerance         Tolerance `json:"tolerance"`
}

// DefaultPolicy: every attempt of a new node replayed, one in twenty at
// the floor (reached after 19 clean replays), quarantine at 3 marks.
func DefaultPolicy() Policy {
	return Policy{NewNodeRate: 1, Floor: 0.05, MarksToQuarantine: 3, Tolerance: DefaultTolerance()}
}

// Validate checks the policy, naming the bad field.
func (p Policy) Validate() error {
	switch {
	case !(p.NewNodeRate >= 0 && p.NewNodeRate <= 1):
		return fmt.Errorf("verify policy: field new_node_rate: %v, want a probability", p.NewNodeRate)
	case !(p.Floor >= 0 && p.Floor <= p.NewNodeRate):
		return fmt.Errorf("verify policy: field floor: %v, want a probability at most new_node_rate", p.Floor)
	case p.MarksToQuarantine < 1:
		return fmt.Errorf("verify policy: field marks_to_quarantine: %d, want at least 1", p.MarksToQuarantine)
	case p.Tolerance.Relative < 0 || p.Tolerance.Absolute < 0:
		return errors.New("verify policy: field tolerance: want non-negative bounds")
	}
	return nil
}

// Record is what verification knows of one node.
type Record struct {
	Node string `json:"node"`
	// CleanRun counts the replays verified in a row since the last mark.
	CleanRun int `json:"clean_run"`
	Replayed int `json:"replayed"`
	Verified int `json:"verified"`
	// Benign counts tool results that differed harmlessly in its replays.
	Benign           int `json:"benign"`
	Nondeterministic int `json:"nondeterministic"`
	Forged           int `json:"forged"`
	// Unbound and Rewrites count reports with an unbound answer and
	// trajectories with a rewritten conversation.
	Unbound  int `json:"unbound"`
	Rewrites int `json:"rewrites"`
	// Quarantined says why the node was quarantined by verification.
	Quarantined string `json:"quarantined,omitempty"`
}

// Marks are the record's marks (unbound answers and rewrites).
func (r Record) Marks() int { return r.Unbound + r.Rewrites }

// Rate is the probability that the node's next attempt is replayed.
func (p Policy) Rate(r Record) float64 {
	return max(p.Floor, p.NewNodeRate/float64(1+r.CleanRun))
}

// ShouldReplay decides with draw in [0, 1).
func (p Policy) ShouldReplay(r Record, draw float64) bool { return draw < p.Rate(r) }

// Event is something verification learnt of one attempt of the node.
type Event struct {
	// Judgement of the attempt's replays (empty Verdict: none).
	Judgement Judgement
	// Unbound answers and rewrite findings of the attempt's report.
	Unbound  []string
	Rewrites []Finding
}

// Apply returns the record after e, and a reason to quarantine the node
// ("" for none).
func (p Policy) Apply(r Record, e Event) (Record, string) {
	switch e.Judgement.Verdict {
	case Verified:
		r.Replayed++
		r.Verified++
		r.CleanRun++
		r.Benign += e.Judgement.Benign
	case Nondeterministic:
		r.Replayed++
		r.Nondeterministic++
		r.Benign += e.Judgement.Benign
	case Forged:
		r.Replayed++
		r.Forged++
		r.CleanRun = 0
	}
	if len(e.Unbound) > 0 {
		r.Unbound++
		r.CleanRun = 0
	}
	if len(e.Rewrites) > 0 {
		r.Rewrites++
		r.CleanRun = 0
	}
	why := ""
	switch {
	case r.Quarantined != "":
	case e.Judgement.Verdict == Forged:
		why = "forged a tool result: " + e.Judgement.Reason
	case r.Marks() >= p.MarksToQuarantine:
		why = fmt.Sprintf("%d reports with unbound answers or rewritten conversations", r.Marks())
	}
	if why != "" {
		r.Quarantined = why
	}
	return r, why
}
