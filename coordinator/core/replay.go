package core

import (
	"fmt"
	"slices"

	"github.com/repronet/repronet/verify"
)

// Replay verification of model-driven attempts (docs/verification.md):
// when a model-driven attempt's result is scored and bound to its
// trajectory, the node's replay rate (Config.Verify, from its
// NodeRecord.Verify) decides, with a draw of the core's generator,
// whether it is replayed. A replay is an attempt of kind KindReplay: the
// same recipe, on a node and operator other than the recorder's and the
// other replays' (its spread key), with a model token whose grant names
// the recorded attempt (Grant.Replay: answered from the recording, at no
// cost). It is outside the cross-check's book: it is no replica, and its
// report is not scored but judged (Effects.Judges): the shell compares
// the trajectories with verify.Judge outside the lock and gives back a
// Judged event. A verdict asking for a second replay queues one on a
// third operator; a final verdict updates the node's record (adaptive
// rate), and a forgery quarantines the node (the cross-check's
// quarantine: its unvalidated results discarded and redone).

// Verification states of a model-driven attempt's result.
const (
	// VerifyPending: a replay is queued or running.
	VerifyPending = "pending"
	// VerifyNotDrawn: the node's replay rate did not draw it: shown
	// unverified.
	VerifyNotDrawn = "not_drawn"
	// VerifyNotReplayable: its agent is declared not replayable: shown
	// unverified, never replayed.
	VerifyNotReplayable = "not_replayable"
	// VerifyUnbound: its result is not bound to its trajectory (an invalid
	// replica): never replayed.
	VerifyUnbound = "unbound"
	// VerifyFailed: its replay could not run (no node would, or
	// infrastructure failed): shown unverified, no one penalised.
	VerifyFailed = "replay_failed"
)

// Verification is what replay verification knows of one attempt's
// result. State is a verification state above or a final verdict of
// verify.Judge (verified, nondeterministic, forged).
type Verification struct {
	State  string `json:"state"`
	Reason string `json:"reason,omitempty"`
	// Replays are the replay attempts, in order.
	Replays []string `json:"replays,omitempty"`
	// Benign and Normalised count the tool results that differed
	// harmlessly, over its replays.
	Benign     int `json:"benign,omitempty"`
	Normalised int `json:"normalised,omitempty"`
}

// Verified reports whether a replay verified the result.
func (v *Verification) Verified() bool { return v != nil && v.State == string(verify.Verified) }

// modelDriven reports whether a's counted assignment made model calls.
func modelDriven(a *Attempt) bool { return a.Model != nil && a.Model.Calls > 0 }

// JudgeJob asks the shell to judge an attempt's reported replays
// (verify.Judge over its recorded trajectory and theirs) and give the
// verdict back (Judged).
type JudgeJob struct {
	Attempt string
}

// Judged is the shell's judgement of an attempt's replays. Replays are
// the replays judged (reported ones, in order); Err says why it could
// not judge now (the trajectories could not be read: retried).
type Judged struct {
	Attempt   string
	Replays   []string
	Judgement verify.Judgement
	Err       string
}

func (Judged) event() {}

// verifyScored decides what verification does with a model-driven
// attempt just scored: nothing for work that is not, a mark on its node's
// record when it is unbound, else a draw at the node's replay rate.
func (s *State) verifyScored(a *Attempt, unbound string, rewritten bool) {
	if a.Canary || a.Kind == KindReplay || a.Kind == KindCapsuleRun || !modelDriven(a) || a.Verification != nil {
		return
	}
	rec := s.record(a.ReportedBy)
	if unbound != "" {
		a.Verification = &Verification{State: VerifyUnbound, Reason: unbound}
		ev := verify.Event{Unbound: []string{unbound}}
		if rewritten {
			ev = verify.Event{Rewrites: []verify.Finding{{Kind: verify.FindingRewrite, Detail: unbound}}}
		}
		s.applyVerify(a.ReportedBy, ev)
		return
	}
	if ag, _ := s.catalog.LookupAgent(a.Agent); ag.NotReplayable {
		a.Verification = &Verification{State: VerifyNotReplayable, Reason: "the agent is declared not replayable"}
		return
	}
	rate := s.cfg.Verify.Rate(rec.Verify)
	if !s.cfg.Verify.ShouldReplay(rec.Verify, s.rng.Float64()) {
		a.Verification = &Verification{State: VerifyNotDrawn, Reason: fmt.Sprintf("not drawn for a replay (node's rate %.2f)", rate)}
		return
	}
	a.Verification = &Verification{State: VerifyPending, Reason: fmt.Sprintf("drawn for a replay (node's rate %.2f)", rate)}
	s.newReplay(a)
}

// newReplay queues a replay of a on a node and operator other than its
// recorder's and its other replays'.
func (s *State) newReplay(a *Attempt) *Attempt {
	r := s.copyJob(a, s.newAttemptID(), "")
	r.Kind, r.ReplayOf, r.Replica, r.Canary, r.CanaryOf = KindReplay, a.ID, 0, false, ""
	r.Avoid = []string{a.ReportedBy}
	for _, id := range a.Verification.Replays {
		if p := s.Attempts[id]; p != nil && p.Node != "" && !slices.Contains(r.Avoid, p.Node) {
			r.Avoid = append(r.Avoid, p.Node)
		}
	}
	a.Verification.Replays = append(a.Verification.Replays, r.ID)
	s.Attempts[r.ID] = r
	s.persistAttempt(r)
	s.Queue = append(s.Queue, r.ID)
	s.wake()
	s.log.Info("replay queued", "attempt", r.ID, "replays", a.ID, "recorded_by", a.ReportedBy, "nth", len(a.Verification.Replays))
	return r
}

// booked reports whether a is the cross-check's work (every attempt but
// a replay).
func booked(a *Attempt) bool { return a.Kind != KindReplay }

// applyVerify applies a verification event to node's record and
// quarantines the node when the policy says so.
func (s *State) applyVerify(node string, e verify.Event) {
	rec := s.record(node)
	rec.Verify.Node = node
	var why string
	rec.Verify, why = s.cfg.Verify.Apply(rec.Verify, e)
	s.persistRecord(rec)
	if why != "" {
		s.log.Warn("verification quarantines a node", "node", node, "why", why)
		s.quarantine(Quarantine{Node: node, Reason: "verification: " + why})
	}
}

// judged applies the shell's judgement of an attempt's replays.
func (s *State) judged(e Judged) {
	a := s.Attempts[e.Attempt]
	if a == nil || a.Verification == nil || a.Verification.State != VerifyPending {
		return // judged already
	}
	var reps []*Attempt
	for _, id := range e.Replays {
		r := s.Attempts[id]
		if r == nil || r.ReplayOf != a.ID || (r.State != StateReported && r.State != StateDone) {
			return // stale: a later judgement covers it
		}
		reps = append(reps, r)
	}
	if len(reps) == 0 || reps[len(reps)-1].State != StateReported {
		return
	}
	if e.Err != "" {
		r := reps[len(reps)-1]
		r.ScoreTries++
		r.Detail = "not judged: " + e.Err
		s.persistAttempt(r)
		if r.ScoreTries < s.cfg.MaxScoreTries {
			s.fx.Judges = append(s.fx.Judges, JudgeJob{Attempt: a.ID})
			s.log.Warn("judging a replay failed; will retry", "attempt", a.ID, "try", r.ScoreTries, "err", e.Err)
		}
		return
	}
	for _, r := range reps {
		r.State, r.Detail = StateDone, ""
		s.persistAttempt(r)
	}
	j := e.Judgement
	v := a.Verification
	v.Benign, v.Normalised, v.Reason = j.Benign, j.Normalised, j.Reason
	switch j.Verdict {
	case verify.NeedsReplay:
		if len(v.Replays) < 2 {
			s.persistAttempt(a)
			s.newReplay(a)
			return
		}
		// Two replays cannot leave it undecided (Judge); never punish.
		j.Verdict = verify.Nondeterministic
	case verify.Verified, verify.Nondeterministic, verify.Forged:
	default:
		s.log.Error("unknown replay verdict; the attempt stays unverified", "attempt", a.ID, "verdict", j.Verdict)
		v.State = VerifyFailed
		s.persistAttempt(a)
		return
	}
	v.State = string(j.Verdict)
	s.persistAttempt(a)
	s.log.Info("replay judged", "attempt", a.ID, "node", a.ReportedBy, "verdict", j.Verdict, "reason", j.Reason)
	s.applyVerify(a.ReportedBy, verify.Event{Judgement: j})
}

// replayEnded notes that replay r will not run (no node would, or it
// failed on every try): its attempt stays unverified, no one penalised.
func (s *State) replayEnded(r *Attempt) {
	a := s.Attempts[r.ReplayOf]
	if a == nil || a.Verification == nil || a.Verification.State != VerifyPending {
		return
	}
	a.Verification.State, a.Verification.Reason = VerifyFailed, "its replay could not run: "+r.Detail
	s.persistAttempt(a)
}

// replaySiblings are the attempts a replay must not share a node or
// operator with: the recorded attempt and its other replays.
func (s *State) replaySiblings(r *Attempt) []string {
	out := []string{r.ReplayOf}
	if a := s.Attempts[r.ReplayOf]; a != nil && a.Verification != nil {
		out = append(out, a.Verification.Replays...)
	}
	return out
}
