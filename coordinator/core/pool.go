package core

// Identities cost nothing: anyone can make peer IDs and operator keys by
// the thousand. So the bounds that protect the pool apply per admitted
// operator's node, and every unadmitted node, whatever its peer ID,
// shares one set of them with every other: one allowance (how many
// attempts they may hold at once, all together), one late-report budget,
// one vote in "declined by every node" (offer.go undeliverable), one
// count towards an attempt's MaxLeaseLosses (Attempt.countedLosses), and
// one entry in an attempt's avoid list after a lost lease. They already
// count as one operator for independence (UnadmittedOperator). Each node
// keeps its own record as well, and an unadmitted node is held by both
// its own bounds and the pool's.

// poolOf is the pool whose bounds node shares: UnadmittedOperator for a
// node that counts as unadmitted, "" for a node whose bounds are its own
// (an admitted operator's, every node under Config.OpenOperators, and a
// node never seen announcing).
func (s *State) poolOf(node string) string {
	op := ""
	if n := s.Nodes[node]; n != nil {
		op = n.Operator
	} else if r := s.Records[node]; r != nil {
		op = r.Operator
	}
	if op == UnadmittedOperator {
		return UnadmittedOperator
	}
	return ""
}

// pool returns the record of pool id, creating it.
func (s *State) pool(id string) *PoolRecord {
	p, ok := s.Pools[id]
	if !ok {
		p = &PoolRecord{ID: id}
		s.Pools[id] = p
	}
	return p
}

// poolAvoidKey is the key of Attempt.AvoidUntil that keeps an attempt off
// every node of a pool (a peer ID never holds a colon).
func poolAvoidKey(pool string) string { return "pool:" + pool }

// poolRooms sets, for the scheduling round at hand, how many more
// attempts each pool may be given: its allowance less what its nodes hold.
func (s *State) poolRooms() {
	held := map[string]int{}
	for _, id := range sortedKeys(s.Nodes) {
		if p := s.poolOf(id); p != "" {
			held[p] += s.Leases.HeldBy(id)
		}
	}
	s.room = map[string]int{}
	for _, p := range []string{UnadmittedOperator} {
		limit := s.cfg.Allowance.Initial
		if rec := s.Pools[p]; rec != nil {
			limit = s.cfg.Allowance.Limit(rec.Allowance, s.now)
		}
		s.room[p] = max(0, limit-held[p])
	}
}

// roomFor reports how many more attempts node's pool may be given this
// round (-1: no bound, the node's bounds are its own or no round is on).
func (s *State) roomFor(node string) int {
	p := s.poolOf(node)
	if p == "" || s.room == nil {
		return -1
	}
	return s.room[p]
}

// useRoom counts a placement on node against its pool's room.
func (s *State) useRoom(node string) {
	if p := s.poolOf(node); p != "" && s.room != nil {
		s.room[p]--
	}
}

// poolAvoids adds to avoid every node of a view whose pool a must avoid
// at now (it lost a lease of a).
func (s *State) poolAvoids(a *Attempt, avoid []string, nodes []string) []string {
	until, ok := a.AvoidUntil[poolAvoidKey(UnadmittedOperator)]
	if !ok || !s.now.Before(until) {
		return avoid
	}
	for _, id := range nodes {
		if s.poolOf(id) == UnadmittedOperator {
			avoid = append(avoid, id)
		}
	}
	return avoid
}

// poolCompleted credits node's pool with a report that counted.
func (s *State) poolCompleted(node string) {
	if p := s.poolOf(node); p != "" {
		rec := s.pool(p)
		rec.Completed++
		rec.Allowance = s.cfg.Allowance.Completed(rec.Allowance)
		s.persistPool(rec)
	}
}

// poolLeaseLost charges node's pool with a lost lease.
func (s *State) poolLeaseLost(node string) {
	if p := s.poolOf(node); p != "" {
		rec := s.pool(p)
		rec.LeaseLost++
		rec.Allowance = s.cfg.Allowance.LeaseLost(rec.Allowance)
		s.persistPool(rec)
	}
}

// poolInfraFailure charges node's pool with an infrastructure failure.
func (s *State) poolInfraFailure(node string) {
	if p := s.poolOf(node); p != "" {
		rec := s.pool(p)
		rec.Allowance = s.cfg.Allowance.InfraFailure(rec.Allowance, s.now)
		s.persistPool(rec)
	}
}

// holdLeases keeps every lease alive while the coordinator cannot record
// anything (its data folder is full): a node retrying a report the
// coordinator answered "retry", or a renewal it could not act on, must
// not lose its lease for the coordinator's trouble. Each lease lasts at
// least a full TTL from now, past its limit if need be (by no more than
// the outage); once the coordinator can write again, leases run out as
// usual a TTL after the last round that held them.
func (s *State) holdLeases() {
	for _, ls := range s.Leases.Grace(s.now) {
		if a := s.Attempts[ls.AttemptID]; a != nil && a.State == StateAssigned && a.Node == ls.Node {
			a.LeaseDeadline, a.LeaseLimit = ls.Deadline, ls.Limit
		}
	}
}

// lateBudget is the late-report bytes counted against node at now: its
// pool's, when it shares one, else its own.
func (s *State) lateBudget(node string, rec *NodeRecord) float64 {
	if p := s.poolOf(node); p != "" {
		if pr := s.Pools[p]; pr != nil {
			return pr.LateBytes.Value(s.now, s.cfg.HalfLife)
		}
		return 0
	}
	return rec.LateBytes.Value(s.now, s.cfg.HalfLife)
}

// chargeLate counts n bytes of late reports kept of node against its pool.
func (s *State) chargeLate(node string, n int) {
	if p := s.poolOf(node); p != "" {
		rec := s.pool(p)
		rec.LateBytes = rec.LateBytes.Add(s.now, float64(n), s.cfg.HalfLife)
		s.persistPool(rec)
	}
}
