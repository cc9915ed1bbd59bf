package core

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/repronet/repronet/proto"
)

// OfferAnswered is what became of an offer: the node accepted it (from
// process Incarnation), declined it (Code, Reason), could not be asked
// (Err), the shell could not build the job at all (Unbuildable), or the
// placement's records could not be made durable, so it was never offered
// (NotDurable).
type OfferAnswered struct {
	Attempt     string
	Node        string
	Accepted    bool
	Incarnation uint64
	Code        proto.DeclineCode
	Reason      string
	Err         string
	Unbuildable string
	NotDurable  string
}

func (OfferAnswered) event() {}

func (s *State) offerAnswered(e OfferAnswered) {
	a := s.Attempts[e.Attempt]
	if a == nil || a.State != StateAssigned || a.Node != e.Node {
		return // a report or an expiry got there first
	}
	n := s.Nodes[e.Node]
	untake := func() {
		s.Leases.Release(a.ID)
		// The node did not take it: it is not an assignee.
		if k := len(a.Assignees); k > 0 && a.Assignees[k-1].Node == a.Node {
			a.Assignees = a.Assignees[:k-1]
		}
	}
	switch {
	case e.NotDurable != "":
		untake()
		s.requeue(a, requeueTransient, "assignment not durable, not offered: "+e.NotDurable)
	case e.Unbuildable != "":
		untake()
		s.failAttempt(a, "cannot build its job: "+e.Unbuildable)
	case e.Err != "":
		// The node may or may not have taken it; if it did, its renewals
		// will be refused and a report it sends is checked as late.
		s.log.Warn("assignment not delivered; requeued", "attempt", a.ID, "node", e.Node, "err", e.Err)
		s.OfferFailures++
		if n != nil {
			n.hold = n.Seq
		}
		s.Leases.Release(a.ID)
		s.requeue(a, requeueTransient, "assignment not delivered: "+e.Err)
	case e.Accepted:
		s.Leases.Bind(a.ID, e.Incarnation)
		a.Incarnation = e.Incarnation
		rec := s.record(a.Node)
		rec.Assigned++
		s.persistRecord(rec)
		s.persistAttempt(a)
		s.log.Info("attempt assigned", "attempt", a.ID, "node", e.Node, "task", a.TaskID, "agent", a.Agent, "level", a.Level,
			"stage", a.Stage, "replica", a.Replica)
	case e.Code == proto.DeclineCode_DECLINE_BUSY || e.Code == proto.DeclineCode_DECLINE_STOPPING:
		untake()
		s.BusyDeclines++
		if n != nil {
			n.hold = n.Seq
		}
		s.requeue(a, requeueTransient, "node busy: "+e.Reason)
	default:
		untake()
		rec := s.record(a.Node)
		rec.Declined++
		s.persistRecord(rec)
		a.Declines = append(a.Declines, Decline{Node: a.Node, Reason: clipReason(e.Reason), At: s.now})
		a.keepOff(a.Node)
		if why, ok := s.undeliverable(a); ok {
			s.giveUp(a, OutcomeDeclined, why)
			return
		}
		s.requeue(a, requeueDeclined, "declined by node "+a.Node+": "+e.Reason)
	}
}

// maxDeclineReason bounds a node's decline reason as it is kept.
const maxDeclineReason = 256

// clipReason bounds a reason a node sent and keeps it to one line.
func clipReason(s string) string {
	s = strings.ToValidUTF8(s, "?")
	s = strings.Map(func(r rune) rune {
		if r < ' ' || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	if len(s) > maxDeclineReason {
		s = strings.ToValidUTF8(s[:maxDeclineReason], "") + "..."
	}
	return s
}

// undeliverable decides whether attempt a, just declined, can still find
// a node: it cannot when MaxDeclines distinct nodes declined it, or when
// no node in view that could run it (stuck.go: serving this coordinator,
// its suite and its group, with a slot of its shape and its GPUs, not
// quarantined) is left that has not declined, failed or must avoid it.
// It returns the reason, with what the nodes said.
func (s *State) undeliverable(a *Attempt) (string, bool) {
	declined := map[string]string{}
	for _, d := range a.Declines {
		declined[d.Node] = d.Reason
	}
	reasons := func() string {
		var out []string
		for _, d := range a.Declines {
			out = append(out, fmt.Sprintf("%s: %s", shortID(d.Node), d.Reason))
		}
		return strings.Join(out, "; ")
	}
	if len(declined) >= s.cfg.MaxDeclines {
		return fmt.Sprintf("declined by %d nodes (max %d): %s", len(declined), s.cfg.MaxDeclines, reasons()), true
	}
	if w := s.newFitter(s.now).waiting(a); w.Open > 0 {
		return "", false // a node that may still take it
	}
	return fmt.Sprintf("declined by every node that could run it (%d): %s", len(declined), reasons()), true
}

// shortID is the tail of a peer ID, for messages.
func shortID(id string) string {
	if len(id) > 8 {
		return "…" + id[len(id)-8:]
	}
	return id
}

// requeueKind says why an attempt goes back to the queue.
type requeueKind int

const (
	// requeueTransient: the offer did not go through or the node was busy;
	// nothing counts against anyone.
	requeueTransient requeueKind = iota
	// requeueDeclined: the node cannot take this attempt; never offer it there again.
	requeueDeclined
	// requeueLeaseLost: the lease ran out or died with the node process.
	requeueLeaseLost
	// requeueInfra: the node reported an infrastructure failure.
	requeueInfra
	// requeueRevoked: the node was quarantined; the cross-check already
	// counts the job as queued.
	requeueRevoked
	// requeueHandedBack: the node gave the attempt back (it is stopping);
	// nothing counts against it, but the attempt keeps off it a while.
	requeueHandedBack
	// requeueModel: the agent could not reach its model for the
	// coordinator's reasons; charged to nobody.
	requeueModel
)

// requeue puts a back in the queue; callers have released its lease.
func (s *State) requeue(a *Attempt, kind requeueKind, why string) {
	node := a.Node
	if a.State == StateAssigned && !a.AssignedAt.IsZero() && !a.Canary {
		s.chargeUsage(a.Group, s.now.Sub(a.AssignedAt).Seconds())
	}
	a.Detail = why
	switch {
	case !booked(a):
	case kind == requeueLeaseLost:
		eff, err := s.Book.MissedDeadline(a.Unit, a.ID)
		s.bookCall(a.Unit, "missed deadline", eff, err)
	case kind == requeueRevoked:
	default:
		if err := s.Book.Requeued(a.Unit, a.ID); err != nil {
			s.log.Error("cross-check: requeue", "attempt", a.ID, "err", err)
		}
		s.persistWork(a.Unit)
	}
	switch kind {
	case requeueTransient:
		a.Tries--
	case requeueDeclined, requeueRevoked:
		if !slices.Contains(a.Avoid, node) {
			a.Avoid = append(a.Avoid, node)
		}
	case requeueHandedBack:
		if a.AvoidUntil == nil {
			a.AvoidUntil = make(map[string]time.Time)
		}
		a.AvoidUntil[node] = s.now.Add(s.cfg.AvoidAfterLeaseLoss)
	case requeueLeaseLost:
		a.LeaseLosses++
		if a.AvoidUntil == nil {
			a.AvoidUntil = make(map[string]time.Time)
		}
		a.AvoidUntil[node] = s.now.Add(s.cfg.AvoidAfterLeaseLoss)
		rec := s.record(node)
		rec.LeaseLost++
		rec.ConsecutiveOK = 0
		rec.Allowance = s.cfg.Allowance.LeaseLost(rec.Allowance)
		s.persistRecord(rec)
		if a.LeaseLosses >= s.cfg.MaxLeaseLosses {
			s.failAttempt(a, fmt.Sprintf("gave up after %d lost leases: %s", a.LeaseLosses, why))
			return
		}
	case requeueInfra:
		a.InfraFailures++
		if !slices.Contains(a.Avoid, node) {
			a.Avoid = append(a.Avoid, node)
		}
		if a.InfraFailures >= s.cfg.MaxTries {
			s.failAttempt(a, fmt.Sprintf("gave up after %d infrastructure failures: %s", a.InfraFailures, why))
			return
		}
		if reason, blocked := s.blockedNow(a); blocked {
			// Every node in view that could run it failed it: waiting
			// would be forever.
			s.giveUp(a, OutcomeUnschedulable, reason)
			return
		}
	case requeueModel:
		a.ModelFaults++
		if a.ModelFaults >= s.cfg.MaxTries {
			a.Outcome = OutcomeModelUnavailable
			s.failAttempt(a, fmt.Sprintf("gave up after %d runs whose agent could not reach its model: %s", a.ModelFaults, why))
			return
		}
	}
	for n, until := range a.AvoidUntil {
		if s.now.After(until) {
			delete(a.AvoidUntil, n)
		}
	}
	a.State, a.Node, a.Operator, a.LeaseDeadline, a.LeaseLimit, a.Incarnation = StateQueued, "", "", time.Time{}, time.Time{}, 0
	a.Exhausted = ""
	s.persistAttempt(a)
	s.Queue = append(s.Queue, a.ID)
	s.wake()
}

// failAttempt marks a as failed by infrastructure (or declined by every
// node) and tells the cross-check, which may ask for another replica of
// its unit or fail the unit.
func (s *State) failAttempt(a *Attempt, why string) {
	s.endAttempt(a, why)
	if !booked(a) {
		s.replayEnded(a)
		return
	}
	eff, err := s.Book.Dropped(a.Unit, a.ID)
	s.bookCall(a.Unit, "drop", eff, err)
}

// endAttempt marks a as failed, without telling the cross-check.
func (s *State) endAttempt(a *Attempt, why string) {
	s.Leases.Release(a.ID)
	if a.State == StateQueued {
		s.Queue = slices.DeleteFunc(s.Queue, func(id string) bool { return id == a.ID })
	}
	a.State, a.Detail, a.FinishedAt = StateFailed, why, s.now
	if a.Outcome == "" {
		a.Outcome = "infra_error"
	}
	s.persistAttempt(a)
	s.log.Warn("attempt failed", "attempt", a.ID, "why", why)
}

// chargeUsage adds slot-seconds to a group's fair-share usage.
func (s *State) chargeUsage(group string, slotSeconds float64) {
	if slotSeconds <= 0 {
		return
	}
	u := s.Usage[group]
	u.Group = group
	u = u.Add(s.now, slotSeconds, s.cfg.HalfLife)
	s.Usage[group] = u
	s.persistUsage(u)
}
