package core

import (
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/repronet/repronet/coordinator/crosscheck"
)

// ReportArrived is a verified report (its envelope's signature checked:
// proto.OpenReport; its numbers validated: Invalid). The
// shell gives it twice when it counts: first without outputs (Fetched
// false), to learn whether to fetch them; then with the outputs fetched
// from the node and kept (Fetched true), to record it.
type ReportArrived struct {
	Attempt  string
	Node     string
	Digest   string
	Outcome  string
	Detail   string
	Usage    Usage
	Evidence crosscheck.Evidence
	Envelope []byte
	Fetched  bool
	Outputs  []Output
	// Model sums the model calls of the reporting node's assignment (nil:
	// none), as the gateway recorded them.
	Model *ModelUse
	// Invalid says what is wrong with the report's numbers and lists
	// (proto.ValidateReport), if anything: it is refused, after the
	// checks of who sent it for what.
	Invalid string
}

func (ReportArrived) event() {}

// Replies to a ReportArrived.
type (
	// ReportRefused: the report is refused (Reason says why); the node
	// should drop it.
	ReportRefused struct{ Reason string }
	// ReportDuplicate: the same report was recorded already; acknowledge
	// it once what was written before is durable.
	ReportDuplicate struct{}
	// ReportKept: recorded apart (late, or of a quarantined node: Late
	// says whether the node is told it was late) or an infrastructure
	// failure handled; acknowledge once the step's records are durable.
	ReportKept struct{ Late bool }
	// ReportCounts: the report counts; fetch its outputs and send it again
	// with them (Fetched).
	ReportCounts struct{}
	// ReportRecorded: recorded; acknowledge once the step's records are
	// durable. Its outputs are scored next.
	ReportRecorded struct{}
)

// reportArrived classifies a report and, when it counts and its outputs
// were fetched, records it: the attempt reported, its lease released, its
// node's record credited, a scoring job asked for. The cross-check gets
// the replica once it is scored.
func (s *State) reportArrived(e ReportArrived) {
	a, ok := s.Attempts[e.Attempt]
	refuse := func(format string, args ...any) {
		s.fx.Reply = ReportRefused{Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case !ok:
		refuse("no attempt with this ID was ever assigned")
		return
	case !a.assignedTo(e.Node):
		if a.Node == "" {
			refuse("signed by node %s, which was never assigned the attempt (state %s)", e.Node, a.State)
		} else {
			refuse("signed by node %s, but the attempt is assigned to node %s", e.Node, a.Node)
		}
		return
	case (a.State == StateDone || a.State == StateReported) && a.ReportDigest == e.Digest:
		s.fx.Reply = ReportDuplicate{}
		return
	case e.Invalid != "":
		refuse("%s", e.Invalid)
		return
	}
	current := a.State == StateAssigned && a.Node == e.Node
	infra := e.Outcome == "infra_error" || e.Outcome == "unspecified" || e.Outcome == ""
	if s.quarantined(e.Node) {
		// Counts for nothing; the node is not told.
		if err := s.recordLate(a, e); err != nil {
			refuse("%v", err)
			return
		}
		s.log.Info("report of a quarantined node recorded apart", "attempt", a.ID, "node", e.Node)
		s.fx.Reply = ReportKept{}
		return
	}
	if infra && current {
		// Never scored as an agent failure: run it again elsewhere. The
		// node is charged only once another node runs the same job
		// (chargeFailures): a job that fails on every node (an image no
		// node can import, an environment that does not build) is the
		// job's fault, never a volunteer's.
		s.log.Warn("infrastructure failure reported", "attempt", a.ID, "node", e.Node, "detail", e.Detail)
		s.Leases.Release(a.ID)
		a.Failures = append(a.Failures, Decline{Node: e.Node, Reason: clipReason(e.Detail), At: s.now})
		s.requeue(a, requeueInfra, "infrastructure failure on node "+e.Node+": "+e.Detail)
		s.fx.Reply = ReportKept{}
		return
	}
	if (a.State != StateAssigned && a.State != StateQueued) || infra || (!current && !s.unitAllows(a, e.Node)) || !s.outstanding(a) {
		// Another report counted already (or the attempt was given up or
		// cancelled), or this one cannot count: keep it, apart, verified,
		// within bounds.
		if err := s.recordLate(a, e); err != nil {
			refuse("%v", err)
			return
		}
		s.log.Info("late report recorded, not counted", "attempt", a.ID, "node", e.Node, "state", a.State)
		s.fx.Reply = ReportKept{Late: true}
		return
	}
	if !e.Fetched {
		s.fx.Reply = ReportCounts{}
		return
	}
	if e.Model != nil && e.Model.Unavailable != "" && current && a.State == StateAssigned {
		// The agent's last model call failed for the coordinator's
		// reasons: what it left is neither the agent's result nor the
		// node's fault. Run it again, charging nobody: the node's record
		// is left as it is and the agent is not scored.
		s.Leases.Release(a.ID)
		s.log.Warn("the agent could not reach its model", "attempt", a.ID, "node", e.Node, "why", e.Model.Unavailable)
		s.requeue(a, requeueModel, "the agent could not reach its model: "+e.Model.Unavailable)
		s.fx.Reply = ReportKept{}
		return
	}
	if !current && booked(a) {
		// A past assignee's report counts: the job is taken back from
		// wherever it is placed now.
		if err := s.Book.Requeued(a.Unit, a.ID); err != nil {
			s.log.Error("cross-check: requeue for a late report", "attempt", a.ID, "err", err)
		}
		s.persistWork(a.Unit)
	}
	if a.State == StateAssigned {
		s.Leases.Release(a.ID)
		if !a.Canary {
			s.chargeUsage(a.Group, s.now.Sub(a.AssignedAt).Seconds())
		}
	}
	if a.State == StateQueued {
		s.Queue = slices.DeleteFunc(s.Queue, func(id string) bool { return id == a.ID })
	}
	s.putRaw(ReportKey(a.ID), e.Envelope)
	a.State, a.ReportDigest, a.ReportedBy, a.FinishedAt = StateReported, e.Digest, e.Node, s.now
	a.Node, a.Operator = e.Node, s.operatorOf(a, e.Node)
	a.LeaseDeadline, a.LeaseLimit = time.Time{}, time.Time{}
	a.Outcome, a.Outputs, a.Detail, a.Model = e.Outcome, e.Outputs, "", e.Model
	if a.Exhausted != "" {
		a.Outcome = OutcomeBudgetExhausted
	}
	u := e.Usage
	a.Usage = &u
	ev := e.Evidence
	a.Evidence = &ev
	rec := s.record(e.Node)
	rec.Completed++
	rec.ConsecutiveOK++
	rec.Allowance = s.cfg.Allowance.Completed(rec.Allowance)
	s.persistRecord(rec)
	s.poolCompleted(e.Node)
	s.chargeFailures(a, e.Node)
	s.persistAttempt(a)
	s.log.Info("report recorded", "attempt", a.ID, "node", e.Node, "task", a.TaskID, "agent", a.Agent, "level", a.Level,
		"outcome", a.Outcome, "late", !current)
	if a.Kind == KindReplay {
		s.fx.Judges = append(s.fx.Judges, JudgeJob{Attempt: a.ReplayOf})
	} else {
		s.fx.Scores = append(s.fx.Scores, ScoreJob{Attempt: a.ID})
	}
	s.fx.Reply = ReportRecorded{}
	s.wake()
}

// outstanding reports whether the cross-check waits for a's report.
func (s *State) outstanding(a *Attempt) bool {
	if !booked(a) {
		return true
	}
	w := s.Book.Attempts[a.Unit]
	if w == nil {
		return false
	}
	_, ok := w.Jobs[a.ID]
	return ok
}

// recordLate keeps a verified report that does not count, within bounds:
// one per node and attempt, MaxLateReports per attempt, and per node
// MaxLateBytes of envelopes (a budget that halves every HalfLife, so an
// honest node's occasional late reports always fit while a flood is
// refused), one budget for all unadmitted nodes together (pool.go). It
// returns the error a refused report is answered with.
func (s *State) recordLate(a *Attempt, e ReportArrived) error {
	kept := 0
	for _, l := range a.LateReports {
		if l.Node == e.Node && l.Digest == e.Digest {
			return nil
		}
		if l.Node == e.Node {
			kept++
		}
	}
	rec := s.record(e.Node)
	switch budget := s.lateBudget(e.Node, rec); {
	case kept > 0 || (a.ReportedBy == e.Node && (a.State == StateDone || a.State == StateReported)):
		return fmt.Errorf("node %s already has a report of this attempt on record; a different one is not kept", e.Node)
	case len(a.LateReports) >= s.cfg.MaxLateReports:
		return fmt.Errorf("%d late reports of this attempt are kept already (max %d); not kept", len(a.LateReports), s.cfg.MaxLateReports)
	case budget+float64(len(e.Envelope)) > float64(s.cfg.MaxLateBytes):
		who := "node " + e.Node
		if p := s.poolOf(e.Node); p != "" {
			who = "node " + e.Node + " (with every other " + p + " node)"
		}
		return fmt.Errorf("%s has %.0f bytes of late reports on record within the last %s (max %d); not kept",
			who, budget, s.cfg.HalfLife, s.cfg.MaxLateBytes)
	}
	s.putRaw(LateReportKey(a.ID, e.Digest), e.Envelope)
	a.LateReports = append(a.LateReports, LateReport{Node: e.Node, Digest: e.Digest, At: s.now})
	rec.LateReports++
	rec.LateBytes = rec.LateBytes.Add(s.now, float64(len(e.Envelope)), s.cfg.HalfLife)
	s.persistRecord(rec)
	s.chargeLate(e.Node, len(e.Envelope))
	s.persistAttempt(a)
	return nil
}

// operatorOf is the operator node had when it was given a.
func (s *State) operatorOf(a *Attempt, node string) string {
	for i := len(a.Assignees) - 1; i >= 0; i-- {
		if a.Assignees[i].Node == node && a.Assignees[i].Operator != "" {
			return a.Assignees[i].Operator
		}
	}
	return node
}

// unitAllows reports whether a report of a from node may count without two
// replicas of its unit counting on one node or operator.
func (s *State) unitAllows(a *Attempt, node string) bool {
	if a.Unit == "" && booked(a) {
		return true
	}
	op := s.operatorOf(a, node)
	for _, sid := range s.siblings(a) {
		sib := s.Attempts[sid]
		if sid == a.ID || sib == nil || (sib.State != StateDone && sib.State != StateReported && sib.State != StateAssigned) {
			continue
		}
		if sib.Node == node || s.currentOperator(sib) == op {
			return false
		}
	}
	return true
}

// BudgetExhausted says a budget refused a model call of an attempt's
// current assignment (the gateway's hook): its outcome will be
// budget_exhausted, whatever the node reports.
type BudgetExhausted struct {
	Attempt, Lease, Detail string
}

func (BudgetExhausted) event() {}

func (s *State) budgetExhausted(e BudgetExhausted) {
	a := s.Attempts[e.Attempt]
	if a == nil || a.State != StateAssigned || LeaseID(a) != e.Lease || a.Exhausted != "" {
		return
	}
	a.Exhausted = clipReason(e.Detail)
	s.persistAttempt(a)
	s.log.Info("model budget exhausted", "attempt", a.ID, "detail", a.Exhausted)
}

// LeaseID names an assignment of an attempt: the time it was placed, in
// nanoseconds. A model token is valid for one assignment only.
func LeaseID(a *Attempt) string {
	if a.AssignedAt.IsZero() {
		return ""
	}
	return strconv.FormatInt(a.AssignedAt.UnixNano(), 10)
}

// chargeFailures charges the infrastructure failures of a's job to their
// nodes, now that node ran the same job: the failure was theirs, not the
// job's.
func (s *State) chargeFailures(a *Attempt, node string) {
	for i := range a.Failures {
		f := &a.Failures[i]
		if f.Charged || f.Node == node {
			continue
		}
		f.Charged = true
		rec := s.record(f.Node)
		rec.InfraErrors++
		rec.ConsecutiveOK = 0
		rec.Allowance = s.cfg.Allowance.InfraFailure(rec.Allowance, s.now)
		s.persistRecord(rec)
		s.poolInfraFailure(f.Node)
	}
}
