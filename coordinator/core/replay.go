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
	// VerifyUnbound: its answers are not bound to its trajectory (or its
	// conversation was rewritten, or an output binding reads could not be
	// read): the agent's result, not counted as correct; replays on other
	// operators decide whether the node is to blame (Verification.Attributing).
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
	// Attributing: the result is unbound (State VerifyUnbound) and its
	// replays decide whom that charges: the agent (a replay is unbound
	// too) or the node (two replays on distinct admitted operators bind
	// where the recording does not).
	Attributing bool `json:"attributing,omitempty"`
}

// Verified reports whether a replay verified the result.
func (v *Verification) Verified() bool { return v != nil && v.State == string(verify.Verified) }

// modelDriven reports whether a's counted assignment made model calls.
func modelDriven(a *Attempt) bool { return a.Model != nil && a.Model.Calls > 0 }

// sampledRun reports whether a is a run of a model-driven agent (its runs
// are samples), whether or not it made model calls: a run without calls
// is replicated by its replay (issue 25.1), never exempt.
func (s *State) sampledRun(a *Attempt) bool {
	e, ok := s.Evals[a.Eval]
	if !ok {
		return false
	}
	ag, _ := s.catalog.LookupAgent(a.Agent)
	return samples(e, ag)
}

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
	// Unbound says, for each replay, why its own report is not bound to
	// its own trajectory ("": bound). It decides whom an unbound result
	// charges (Verification.Attributing).
	Unbound []string
	Err     string
}

func (Judged) event() {}

// verifyScored decides what verification does with a model-driven
// attempt just scored: nothing for work that is not; for evidence only a
// node can produce (nodeEvidence: a chain head the gateway never gave), a
// mark on its node's record; for an unbound result (unbound: answers in
// no model output or tool result, a rewritten conversation, an output
// that cannot be read; an honest node running the agent can produce
// each), the agent's result is marked and replays on other operators
// decide whether the node is to blame; else a draw at the node's replay
// rate. Attribution (docs/verification.md): evidence an agent could
// produce on an honest node never marks the node.
func (s *State) verifyScored(a *Attempt, unbound string, rewritten bool, nodeEvidence string) {
	if a.Canary || a.Kind == KindReplay || a.Kind == KindCapsuleRun || a.Verification != nil || !modelDriven(a) && !s.sampledRun(a) {
		return
	}
	rec := s.record(a.ReportedBy)
	if nodeEvidence != "" {
		a.Verification = &Verification{State: VerifyUnbound, Reason: nodeEvidence}
		s.applyVerify(a.ReportedBy, verify.Event{Unbound: []string{nodeEvidence}})
		return
	}
	ag, _ := s.catalog.LookupAgent(a.Agent)
	if unbound != "" {
		a.Verification = &Verification{State: VerifyUnbound, Reason: "the agent's result: " + unbound}
		if ag.NotReplayable {
			return
		}
		// Whatever the node's rate: only replays can tell the agent's
		// doing from the node's.
		a.Verification.Attributing = true
		s.newReplay(a)
		return
	}
	if ag.NotReplayable {
		a.Verification = &Verification{State: VerifyNotReplayable, Reason: "the agent is declared not replayable"}
		return
	}
	rate := s.cfg.Verify.Rate(rec.Verify)
	if s.cfg.Verify.ReplayScored && a.Score != nil && a.Score.Value > 0 {
		a.Verification = &Verification{State: VerifyPending, Reason: fmt.Sprintf("a result with a positive score is replayed whatever the node's rate (%.2f)", rate)}
		s.newReplay(a)
		return
	}
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

// revokeReplays takes back the replays assigned to a node just
// quarantined and queues them elsewhere (the book takes back its own
// jobs): a replay must not wait for a lease to lapse on a node whose
// reports no longer count.
func (s *State) revokeReplays(node string) {
	for _, id := range sortedIDs(s.Attempts) {
		if a := s.Attempts[id]; a.Kind == KindReplay && a.State == StateAssigned && a.Node == node {
			s.revokeJob(id)
		}
	}
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

// judging reports whether a waits for its replays' judgement.
func judging(a *Attempt) bool {
	return a != nil && a.Verification != nil && (a.Verification.State == VerifyPending || a.Verification.Attributing)
}

// judged applies the shell's judgement of an attempt's replays.
func (s *State) judged(e Judged) {
	a := s.Attempts[e.Attempt]
	if !judging(a) {
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
	if a.Verification.Attributing {
		s.attributed(a, reps, e.Unbound, e.Judgement.Verdict)
		return
	}
	j := e.Judgement
	v := a.Verification
	v.Benign, v.Normalised, v.Reason = j.Benign, j.Normalised, j.Reason
	if j.Verdict == verify.Forged {
		if why := s.independent(a, reps); why != "" {
			j.Verdict, j.Reason = verify.NeedsReplay, j.Reason+"; but "+why
			v.Reason = j.Reason
		}
	}
	switch j.Verdict {
	case verify.NeedsReplay:
		if len(v.Replays) < verify.MaxReplays {
			s.persistAttempt(a)
			s.newReplay(a)
			return
		}
		// The replays cannot leave it undecided; never punish.
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
	for _, i := range j.Outvoted {
		if i >= 0 && i < len(reps) {
			s.log.Warn("a replay differs where two others agree with the recording: its replayer is marked",
				"replay", reps[i].ID, "node", reps[i].ReportedBy, "attempt", a.ID)
			s.applyVerify(reps[i].ReportedBy, verify.Event{Outvoted: 1})
		}
	}
	s.applyVerify(a.ReportedBy, verify.Event{Judgement: j})
}

// independent says why a's replays cannot convict its node ("" when they
// can): a forgery needs two replays from distinct admitted operators,
// neither the recorder's.
func (s *State) independent(a *Attempt, reps []*Attempt) string {
	ops := map[string]bool{}
	for _, r := range reps {
		switch {
		case r.Operator == "" || r.Operator == a.Operator:
			continue
		case r.Operator == UnadmittedOperator && !s.cfg.OpenOperators:
			continue
		}
		ops[r.Operator] = true
	}
	if len(ops) < 2 {
		return fmt.Sprintf("its replays come from %d distinct admitted operators other than the recorder's, and a forgery needs 2", len(ops))
	}
	return ""
}

// attributed decides whom an unbound result charges, from its replays'
// own binding (unbound: each replay's reason, "" when bound) and how
// they compare with the recording (verdict): a replay unbound too shows
// the agent's doing (final: the agent's result, no one else charged); two
// bound replays from distinct admitted operators that make the same calls
// as each other (verdict verified, or forged: both differ alike from the
// recording, as when the node rewrote a conversation) show that the node
// changed what the agent did or returned (the result is forged, the node
// quarantined). Replays that diverge from each other (nondeterministic)
// cannot testify: the agent's result.
func (s *State) attributed(a *Attempt, reps []*Attempt, unbound []string, verdict verify.Verdict) {
	v := a.Verification
	if len(unbound) != len(reps) {
		unbound = make([]string, len(reps)) // an older shell: read as bound
	}
	for i, why := range unbound {
		if why != "" {
			v.Attributing = false
			v.Reason += fmt.Sprintf("; its replay %d on another operator is unbound too (%s): the agent's doing, no node charged", i+1, why)
			s.persistAttempt(a)
			s.log.Info("unbound result charged to the agent", "attempt", a.ID, "agent", a.Agent)
			return
		}
	}
	if why := s.independent(a, reps); why != "" {
		if len(v.Replays) < verify.MaxReplays {
			s.persistAttempt(a)
			s.newReplay(a)
			return
		}
		v.Attributing = false
		v.Reason += "; its replays bind, but " + why + ": no node charged"
		s.persistAttempt(a)
		return
	}
	if verdict != verify.Verified && verdict != verify.Forged {
		v.Attributing = false
		v.Reason += fmt.Sprintf("; its replays bind but do not reproduce the same calls (%s): the agent's doing, no node charged", verdict)
		s.persistAttempt(a)
		return
	}
	v.Attributing = false
	v.State = string(verify.Forged)
	v.Reason += fmt.Sprintf("; %d replays on distinct admitted operators bind their answers where the recording does not: the node changed what the agent returned", len(reps))
	s.persistAttempt(a)
	s.log.Warn("unbound result charged to the node", "attempt", a.ID, "node", a.ReportedBy)
	s.applyVerify(a.ReportedBy, verify.Event{Judgement: verify.Judgement{Verdict: verify.Forged, Reason: v.Reason}, Unbound: []string{v.Reason}})
}

// replayEnded notes that replay r will not run (no node would, or it
// failed on every try): its attempt stays unverified, no one penalised.
func (s *State) replayEnded(r *Attempt) {
	a := s.Attempts[r.ReplayOf]
	if !judging(a) {
		return
	}
	if a.Verification.Attributing {
		a.Verification.Attributing = false
		a.Verification.Reason += "; its replay could not run (" + r.Detail + "): no node charged"
		s.persistAttempt(a)
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
