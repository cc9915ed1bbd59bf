package core

import "time"

// HandBack is a node giving back an attempt it holds, unfinished, because
// it is stopping (proto.LeaseRenewal.hand_back). Its reply is a
// HandBackReply.
type HandBack struct {
	Attempt, Node, Reason string
}

func (HandBack) event() {}

// HandBackReply answers a hand-back: OK when the attempt was taken back,
// else why not (the node then keeps what it had: a lease it no longer
// renews runs out as any other).
type HandBackReply struct {
	OK     bool
	Reason string
}

// handBack takes back an attempt from the node holding its lease: the
// lease is released and the attempt requeued at once. The node is not
// charged (its allowance, lease losses and reliability stay as they
// were): it gave notice, where a crash or a lapsed lease gives none. The
// attempt is kept off that node for AvoidAfterLeaseLoss, so that a node
// cannot bounce one attempt back and forth; a lease past its deadline is
// not taken back (the next tick counts it lost).
func (s *State) handBack(e HandBack) {
	ls, held := s.Leases.Get(e.Attempt)
	a := s.Attempts[e.Attempt]
	switch {
	case !held || a == nil || a.State != StateAssigned:
		s.fx.Reply = HandBackReply{Reason: "attempt " + e.Attempt + " holds no lease"}
		return
	case ls.Node != e.Node || a.Node != e.Node:
		s.fx.Reply = HandBackReply{Reason: "attempt " + e.Attempt + " is held by another node"}
		return
	case s.now.After(ls.Deadline):
		s.fx.Reply = HandBackReply{Reason: "the lease on attempt " + e.Attempt + " expired at " + ls.Deadline.Format(time.RFC3339Nano)}
		return
	}
	s.Leases.Release(a.ID)
	s.requeue(a, requeueHandedBack, "handed back by node "+e.Node+": "+clipReason(e.Reason))
	rec := s.record(e.Node)
	rec.HandedBack++
	s.persistRecord(rec)
	s.log.Info("attempt handed back; requeued", "attempt", a.ID, "node", e.Node, "reason", clipReason(e.Reason))
	s.fx.Reply = HandBackReply{OK: true}
}
