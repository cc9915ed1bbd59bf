package crosscheck

import (
	"fmt"
	"slices"
)

// Work describes one piece of work to be trusted.
type Work struct {
	ID   string `json:"id"`
	Kind Kind   `json:"kind"`
	// Deterministic work gives honest replicas the same result: capsule
	// runs, agents their submitter declares deterministic, and canaries. A
	// replica disagreeing with the canonical result of deterministic work
	// is invalid; of other work it merely disagreed.
	Deterministic bool `json:"deterministic,omitempty"`
	// ExactOutputs also compares Result.OutputDigest.
	ExactOutputs bool `json:"exact_outputs,omitempty"`
	// ImageCID and InputCIDs are what every job of the work is given;
	// a replica must report the same (InputCIDs nil: unchecked).
	ImageCID  string   `json:"image_cid,omitempty"`
	InputCIDs []string `json:"input_cids,omitempty"`
	// WallLimitSeconds is the jobs' wall-clock limit (0: unchecked).
	WallLimitSeconds float64 `json:"wall_limit_seconds,omitempty"`
	// Tolerances per output name, for capsule runs.
	Tolerances map[string]Tolerance `json:"tolerances,omitempty"`
	// Known makes the work a canary: its answer is known, each replica is
	// compared with it, and a replica that differs is a lie.
	Known *Result `json:"known,omitempty"`
	// CanaryOf names the work a canary replays, for the record.
	CanaryOf string `json:"canary_of,omitempty"`
	// Samples: the work is a run of a model-driven agent, one statistical
	// sample (issue 13): it is never voted against other runs, and a run
	// whose replica is discarded (its node quarantined, say for a forged
	// tool result) is run again once, not raised to a quorum. Its trust
	// comes from binding and replays (package verify), not replicas.
	Samples bool `json:"samples,omitempty"`
}

// Canary reports whether the work is a canary.
func (w Work) Canary() bool { return w.Known != nil }

// Validate checks the work, naming it.
func (w Work) Validate() error {
	switch {
	case w.ID == "":
		return fmt.Errorf("work: field id: empty")
	case w.Kind != AgentAttempt && w.Kind != CapsuleRun:
		return fmt.Errorf("work %s: field kind: unknown %q", w.ID, w.Kind)
	case w.Known != nil && !w.Deterministic:
		return fmt.Errorf("work %s: field known: a canary must be deterministic work (an honest node must always match it)", w.ID)
	case w.Known != nil && w.Kind == AgentAttempt && w.Known.Grading == nil:
		return fmt.Errorf("work %s: field known: an agent canary needs a grading", w.ID)
	}
	return nil
}

// Replica is the report of one job.
type Replica struct {
	Job      string   `json:"job"`
	Node     string   `json:"node"`
	Operator string   `json:"operator,omitempty"`
	Result   Result   `json:"result"`
	Evidence Evidence `json:"evidence"`
	// Settled is the verdict last applied to the node's record (so that a
	// verdict is applied once, and again only when it changes).
	Settled Verdict `json:"settled,omitempty"`
}

func (r Replica) operator() string {
	if r.Operator != "" {
		return r.Operator
	}
	return r.Node
}

// Attempt is one work with its replicas and its outstanding jobs.
type Attempt struct {
	Work Work `json:"work"`
	// Target is how many agreeing replicas the work needs, fixed when its
	// first job is placed (Policy.Target); 0 until then.
	Target   int       `json:"target"`
	Replicas []Replica `json:"replicas"`
	// Jobs are the outstanding jobs: job ID -> the node it is placed on
	// ("" while queued).
	Jobs map[string]string `json:"jobs"`
	// JobOperators are the operators of placed outstanding jobs.
	JobOperators map[string]string `json:"job_operators,omitempty"`
	// Dropped counts jobs lost for good to infrastructure failures.
	Dropped int `json:"dropped"`
	// Undeliverable says why no node will run the work's jobs (every node
	// that could declined them): more replicas would wait forever.
	Undeliverable string `json:"undeliverable,omitempty"`
	// Decision is the latest decision.
	Decision Decision `json:"decision"`
}

// Verdict is what became of one replica.
type Verdict string

// Verdicts. Valid, Invalid, Disagreed and Lied are final and settle the
// node's record; Pending, Accepted and Discarded do not.
const (
	// Pending: not yet compared with enough replicas.
	Pending Verdict = "pending"
	// Valid: agrees with the canonical result (confirmed by another
	// operator's replica) or with the canary's answer.
	Valid Verdict = "valid"
	// Accepted: the canonical result of work that needed one replica (a
	// trusted node, not spot-checked). It counts for the work, not for the
	// node's trust; it becomes Valid if a later replica confirms it.
	Accepted Verdict = "accepted"
	// Invalid: disagrees with the canonical result of deterministic work,
	// or its evidence is implausible.
	Invalid Verdict = "invalid"
	// Disagreed: in the minority on non-deterministic work, or on work
	// that ended inconsistent. No penalty.
	Disagreed Verdict = "disagreed"
	// Lied: failed a canary, or its evidence cannot be true. The node is
	// quarantined.
	Lied Verdict = "lied"
	// Discarded: from a quarantined node, or from an operator that already
	// has a replica of this work. Counts for nothing.
	Discarded Verdict = "discarded"
)

func (v Verdict) final() bool { return v == Valid || v == Invalid || v == Disagreed || v == Lied }

// State is where a work stands.
type State string

// States.
const (
	// Open: more replicas are needed (or are running).
	Open State = "open"
	// Validated: a canonical result exists.
	Validated State = "validated"
	// Inconsistent: MaxReplicas replicas without agreement.
	Inconsistent State = "inconsistent"
	// Failed: MaxDropped jobs lost to infrastructure; never scored.
	Failed State = "failed"
)

// ReplicaVerdict is the verdict on Replicas[Index].
type ReplicaVerdict struct {
	Index   int     `json:"index"`
	Verdict Verdict `json:"verdict"`
	Reason  string  `json:"reason,omitempty"`
}

// Decision is what Decide concludes about one work.
type Decision struct {
	State State `json:"state"`
	// Canonical indexes Replicas: the result that counts (-1: none). For a
	// canary, the first replica that matched the known answer.
	Canonical int              `json:"canonical"`
	Replicas  []ReplicaVerdict `json:"replicas"`
	// Need is how many more jobs to create now (beyond the outstanding
	// ones), on nodes and operators not in Avoid*.
	Need           int      `json:"need"`
	AvoidNodes     []string `json:"avoid_nodes,omitempty"`
	AvoidOperators []string `json:"avoid_operators,omitempty"`
	// Reason explains the state in words.
	Reason string `json:"reason"`
}

// Decide decides one work from its replicas and outstanding jobs;
// quarantined says which nodes are quarantined. Replicas are considered in
// order (the order they arrived).
func Decide(p Policy, a Attempt, quarantined map[string]bool) Decision {
	w := a.Work
	d := Decision{State: Open, Canonical: -1, Replicas: make([]ReplicaVerdict, len(a.Replicas))}
	var voters []int // replicas that take part in the comparison
	seenOp := map[string]int{}
	tainted := false // a liar or a quarantined node touched this work
	for i, r := range a.Replicas {
		rv := ReplicaVerdict{Index: i, Verdict: Pending}
		switch {
		case quarantined[r.Node]:
			rv.Verdict, rv.Reason = Discarded, "the node is quarantined"
			tainted = true
		default:
			if v, why := CheckEvidence(p, w, r.Evidence); v != "" {
				rv.Verdict, rv.Reason = v, why
				tainted = tainted || v == Lied
				break
			}
			if j, dup := seenOp[r.operator()]; dup {
				rv.Verdict, rv.Reason = Discarded, fmt.Sprintf("operator %s already has replica %d of this work", r.operator(), j)
				break
			}
			seenOp[r.operator()] = i
			voters = append(voters, i)
		}
		d.Replicas[i] = rv
	}
	avoid(&d, a)

	if w.Canary() {
		for _, i := range voters {
			if Agree(w, *w.Known, a.Replicas[i].Result) {
				d.Replicas[i].Verdict = Valid
				if d.Canonical < 0 {
					d.Canonical = i
				}
			} else {
				d.Replicas[i].Verdict, d.Replicas[i].Reason = Lied, fmt.Sprintf("canary %s (a replay of %s): result differs from the known answer", w.ID, w.CanaryOf)
			}
		}
		// A canary is never replicated: it checks the nodes it is given to.
		if d.Canonical >= 0 {
			d.State, d.Reason = Validated, "canary answered as known"
		} else {
			d.Reason = "canary not (yet) answered as known"
		}
		return d
	}

	target := max(a.Target, 1)
	if tainted && !w.Samples {
		target = max(target, p.Quorum) // trust no shortcut after a lie
	}
	need := target/2 + 1
	n := len(voters)
	// matches[k]: voters agreeing with voter k (itself included).
	matches := make([]int, n)
	for x := range voters {
		for y := range voters {
			if Agree(w, a.Replicas[voters[x]].Result, a.Replicas[voters[y]].Result) {
				matches[x]++
			}
		}
	}
	best := -1
	for x := range voters {
		if best < 0 || matches[x] > matches[best] {
			best = x
		}
	}
	unique := best >= 0
	for x := range voters {
		if best >= 0 && x != best && matches[x] == matches[best] &&
			!Agree(w, a.Replicas[voters[x]].Result, a.Replicas[voters[best]].Result) {
			unique = false // a tie between results that disagree
		}
	}
	switch {
	case a.Undeliverable != "" && n < target:
		d.State, d.Reason = Failed, "no node will run its jobs: "+a.Undeliverable
	case a.Dropped >= p.MaxDropped && n < target:
		d.State, d.Reason = Failed, fmt.Sprintf("%d jobs lost to infrastructure failures", a.Dropped)
	case n >= target && unique && matches[best] >= need:
		d.State, d.Canonical = Validated, voters[best]
		d.Reason = fmt.Sprintf("%d of %d replicas agree", matches[best], n)
		for _, i := range voters {
			switch {
			case Agree(w, a.Replicas[i].Result, a.Replicas[voters[best]].Result) && matches[best] == 1:
				d.Replicas[i].Verdict, d.Replicas[i].Reason = Accepted, "accepted alone from a trusted node"
			case Agree(w, a.Replicas[i].Result, a.Replicas[voters[best]].Result):
				d.Replicas[i].Verdict = Valid
			case w.Deterministic:
				d.Replicas[i].Verdict, d.Replicas[i].Reason = Invalid, fmt.Sprintf("disagrees with the canonical result (replica %d)", voters[best])
			default:
				d.Replicas[i].Verdict, d.Replicas[i].Reason = Disagreed, fmt.Sprintf("differs from the canonical result (replica %d)", voters[best])
			}
		}
	case n >= p.MaxReplicas:
		d.State, d.Reason = Inconsistent, fmt.Sprintf("%d replicas without a majority", n)
		for _, i := range voters {
			d.Replicas[i].Verdict, d.Replicas[i].Reason = Disagreed, "the work is inconsistent"
		}
	default:
		want := target - n
		if n >= target {
			want = 1 // no majority yet: one more replica
			d.Reason = fmt.Sprintf("%d replicas without a majority: one more", n)
		} else {
			d.Reason = fmt.Sprintf("%d of %d replicas", n, target)
		}
		d.Need = max(0, min(want-len(a.Jobs), p.MaxReplicas-n-len(a.Jobs)))
	}
	return d
}

func avoid(d *Decision, a Attempt) {
	for _, r := range a.Replicas {
		d.AvoidNodes = append(d.AvoidNodes, r.Node)
		d.AvoidOperators = append(d.AvoidOperators, r.operator())
	}
	for job, node := range a.Jobs {
		if node != "" {
			d.AvoidNodes = append(d.AvoidNodes, node)
			op := a.JobOperators[job]
			if op == "" {
				op = node
			}
			d.AvoidOperators = append(d.AvoidOperators, op)
		}
	}
	slices.Sort(d.AvoidNodes)
	d.AvoidNodes = slices.Compact(d.AvoidNodes)
	slices.Sort(d.AvoidOperators)
	d.AvoidOperators = slices.Compact(d.AvoidOperators)
}
