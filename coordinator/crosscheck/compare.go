package crosscheck

import (
	"fmt"
	"math"
	"slices"

	"github.com/repronet/repronet/bench"
)

// Kind is the kind of work, which decides what replicas compare.
type Kind string

// Kinds of work.
const (
	// AgentAttempt: an agent on a task at a level; replicas compare their
	// gradings.
	AgentAttempt Kind = "agent"
	// CapsuleRun: a capsule's own run script; replicas compare the
	// extracted outputs.
	CapsuleRun Kind = "capsule"
)

// The comparable part of a replica is the family's (package bench): a
// grading, named outputs, a digest. The names here keep the book's
// vocabulary.
type (
	Result    = bench.Comparable
	Grading   = bench.Grading
	Output    = bench.Output
	Tolerance = bench.Tolerance
)

// Agree reports whether two results of work w agree (bench.Agree with the
// work's tolerances); results of agent attempts must both be graded.
func Agree(w Work, a, b Result) bool {
	if w.Kind == AgentAttempt && (a.Grading == nil || b.Grading == nil) {
		return false
	}
	return bench.Agree(a, b, w.Tolerances, w.ExactOutputs)
}

// Evidence is what a node says about how it ran a job, checked for
// plausibility on its own.
type Evidence struct {
	// Outcome is the sandbox's outcome class: ok, agent_error, timeout,
	// oom, output_limit, disk_quota.
	Outcome string `json:"outcome"`
	// ImageCID and InputCIDs are what the node says it ran; they must be
	// the job's.
	ImageCID  string   `json:"image_cid,omitempty"`
	InputCIDs []string `json:"input_cids,omitempty"`
	// StartedMillis and FinishedMillis are Unix milliseconds.
	StartedMillis  int64   `json:"started_millis"`
	FinishedMillis int64   `json:"finished_millis"`
	WallSeconds    float64 `json:"wall_seconds"`
	CPUSeconds     float64 `json:"cpu_seconds"`
	// LogBytes is the size of the stdout and stderr tails.
	LogBytes int `json:"log_bytes"`
	// ChainHead is the model conversation chain head the node signed
	// (package verify; empty: no model call).
	ChainHead string `json:"chain_head,omitempty"`
	// Unbound says why the result is not bound to the recorded model
	// trajectory (an answer found in no model output or tool result, a
	// rewritten conversation, a chain head the gateway never gave): the
	// result does not count and marks the node as an invalid result does.
	Unbound string `json:"unbound,omitempty"`
}

// knownOutcome: the outcomes the sandbox reports for a finished run
// (infra_error never reaches a replica: the job is requeued).
func knownOutcome(o string) bool {
	switch o {
	case "ok", "agent_error", "timeout", "oom", "output_limit", "disk_quota":
		return true
	}
	return false
}

// CheckEvidence checks one replica's evidence against the work. It returns
// Lied for claims that cannot be true of an honest node (other inputs than
// assigned, time running backwards, more CPU than the slot has, a run
// longer than its limit, a wall time that contradicts the timestamps),
// Invalid for an unknown outcome, and "" when the evidence is plausible.
func CheckEvidence(p Policy, w Work, e Evidence) (Verdict, string) {
	lim := p.Evidence
	switch {
	case w.ImageCID != "" && e.ImageCID != w.ImageCID:
		return Lied, fmt.Sprintf("reports image %q, was given %q", e.ImageCID, w.ImageCID)
	case w.InputCIDs != nil && !slices.Equal(e.InputCIDs, w.InputCIDs):
		return Lied, fmt.Sprintf("reports inputs %q, was given %q", e.InputCIDs, w.InputCIDs)
	case !knownOutcome(e.Outcome):
		return Invalid, fmt.Sprintf("unknown outcome %q", e.Outcome)
	case e.Unbound != "":
		return Invalid, "not bound to its model trajectory: " + e.Unbound
	case e.FinishedMillis < e.StartedMillis:
		return Lied, "finished before it started"
	case !(e.WallSeconds > 0) || !(e.CPUSeconds >= 0) || math.IsInf(e.WallSeconds, 0) || math.IsInf(e.CPUSeconds, 0):
		return Lied, fmt.Sprintf("impossible usage: %v s wall, %v s CPU", e.WallSeconds, e.CPUSeconds)
	case e.CPUSeconds > e.WallSeconds*lim.MaxCPUPerWall+lim.SlackSeconds:
		return Lied, fmt.Sprintf("%.1f CPU seconds in %.1f wall seconds on a slot that cannot deliver that", e.CPUSeconds, e.WallSeconds)
	case math.Abs(e.WallSeconds-float64(e.FinishedMillis-e.StartedMillis)/1000) > lim.SlackSeconds:
		return Lied, fmt.Sprintf("wall time %.1f s contradicts its timestamps (%.1f s apart)", e.WallSeconds, float64(e.FinishedMillis-e.StartedMillis)/1000)
	case w.WallLimitSeconds > 0 && e.WallSeconds > w.WallLimitSeconds+lim.SlackSeconds:
		return Lied, fmt.Sprintf("ran %.1f s past its %.0f s limit", e.WallSeconds, w.WallLimitSeconds)
	}
	return "", ""
}
