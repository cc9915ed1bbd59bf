package core

import (
	"fmt"
	"slices"
	"time"

	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/schedule"
)

// Tick is a scheduling round: leases that ran out are requeued, nodes
// long silent forgotten, queued attempts placed on the nodes in view
// (and idle nodes perhaps given a canary). Connected says which nodes'
// connections are up (nil: leave as they are); Writable false holds all
// placement (the data folder is full: a placement could not be recorded)
// and keeps every lease alive (holdLeases: no node is charged for the
// coordinator's trouble).
type Tick struct {
	Connected map[string]bool
	Writable  bool
}

func (Tick) event() {}

func (s *State) tick(e Tick) {
	for id, up := range e.Connected {
		if n := s.Nodes[id]; n != nil {
			n.Connected = up
		}
	}
	if !e.Writable {
		s.holdLeases()
	}
	s.expireLeases()
	s.pruneNodes()
	if !e.Writable || (len(s.Queue) == 0 && s.cfg.IdleCanaryEvery < 0) {
		return
	}
	s.checkStuck()
	s.poolRooms()
	defer func() { s.room = nil }()
	views := s.nodeViews()
	if len(views) == 0 {
		return
	}
	if len(s.Queue) > 0 {
		s.place(views)
	}
	s.idleCanaries(views)
}

// expireLeases requeues every attempt whose lease ran out.
func (s *State) expireLeases() {
	for _, ls := range s.Leases.Expire(s.now) {
		a := s.Attempts[ls.AttemptID]
		if a == nil || a.State != StateAssigned || a.Node != ls.Node {
			continue
		}
		s.log.Warn("lease expired; requeued", "attempt", a.ID, "node", ls.Node)
		s.requeue(a, requeueLeaseLost, "lease expired on node "+ls.Node)
	}
}

// nodeViews builds the scheduler's view of the nodes that can take work
// from this coordinator now: in view, serving this coordinator, connected,
// not held back, not quarantined, with a free slot. A node's free slots
// are its total less what other coordinators hold there (as it last
// announced) less what this one holds (its own lease count, or the node's
// count when higher), and never more than its allowance (what it has shown
// it finishes) less what it holds, nor more than its pool's room
// (pool.go: every unadmitted node shares one allowance).
func (s *State) nodeViews() []schedule.NodeView {
	var views []schedule.NodeView
	for _, id := range sortedKeys(s.Nodes) {
		n := s.Nodes[id]
		if !s.inView(n) || n.hold >= n.Seq || !n.ServesUs || !n.Connected || s.quarantined(id) {
			continue
		}
		held := max(n.Mine, s.Leases.HeldBy(id))
		free := n.TotalSlots - n.Others - held
		limit := s.cfg.Allowance.Initial
		rel := 0.5
		if r := s.Records[id]; r != nil {
			limit, rel = s.cfg.Allowance.Limit(r.Allowance, s.now), r.Reliability()
		}
		free = min(free, limit-held)
		if room := s.roomFor(id); room >= 0 {
			free = min(free, room)
		}
		if free <= 0 {
			continue
		}
		views = append(views, schedule.NodeView{ID: id, Operator: n.Operator, FreeSlots: free, Suites: n.Suites, Groups: n.Groups,
			Reliability: rel, Cached: n.Cached, Slot: n.Slot, GPUs: n.GPUs, FreeGPUs: max(0, n.FreeGPUs-s.gpusHeld(id))})
	}
	return views
}

// gpusHeld counts the GPUs the jobs this coordinator leased to node need.
func (s *State) gpusHeld(node string) int {
	n := 0
	for _, id := range s.Leases.AttemptsOf(node) {
		if a := s.Attempts[id]; a != nil {
			n += a.GPUs.Count
		}
	}
	return n
}

// scheduleInput builds the scheduler's input from the queue.
func (s *State) scheduleInput(views []schedule.NodeView) schedule.ScheduleInput {
	in := schedule.ScheduleInput{Nodes: views, Groups: make(map[string]schedule.GroupShare),
		UnitNodes: make(map[string][]string), UnitOperators: make(map[string][]string)}
	in.Pending = make([]schedule.Pending, 0, len(s.Queue))
	viewIDs := make([]string, len(views))
	for i := range views {
		viewIDs[i] = views[i].ID
	}
	for _, id := range s.Queue {
		a := s.Attempts[id]
		key := a.spreadKey()
		in.Pending = append(in.Pending, schedule.Pending{AttemptID: id, Unit: key, CapsuleCID: s.firstInput(a),
			Suite: a.Suite, Group: a.Group, Priority: a.Priority, Seq: a.Seq, Avoid: s.poolAvoids(a, a.avoids(s.now), viewIDs),
			Needs: a.Needs, GPUs: a.GPUs})
		if key == "" {
			continue
		}
		if _, done := in.UnitNodes[key]; done {
			continue
		}
		in.UnitNodes[key] = nil
		for _, sid := range s.siblings(a) {
			sib := s.Attempts[sid]
			if sid == id || sib == nil || (sib.State != StateAssigned && sib.State != StateDone && sib.State != StateReported) ||
				sib.Node == "" {
				continue
			}
			in.UnitNodes[key] = append(in.UnitNodes[key], sib.Node)
			in.UnitOperators[key] = append(in.UnitOperators[key], s.currentOperator(sib))
		}
	}
	running := make(map[string]int)
	for _, id := range s.Leases.Attempts() {
		if a := s.Attempts[id]; a != nil {
			running[a.Group]++
		}
	}
	for _, p := range in.Pending {
		if _, ok := in.Groups[p.Group]; ok {
			continue
		}
		gc := s.cfg.Groups[p.Group]
		in.Groups[p.Group] = schedule.GroupShare{Weight: gc.Weight, Quota: gc.Quota, AcceptSurplus: gc.AcceptSurplus,
			Usage: s.Usage[p.Group].Decayed(s.now, s.cfg.HalfLife), Running: running[p.Group]}
	}
	return in
}

// firstInput is the CID of the first content an attempt's job places (a
// capsule), which the scheduler prefers nodes holding.
func (s *State) firstInput(a *Attempt) string {
	if a.Kind == KindCapsuleRun {
		if r := s.Repros[a.Repro]; r != nil {
			return r.CapsuleCID
		}
		return ""
	}
	if si, ok := s.catalog.LookupSuite(a.Suite); ok {
		if t := si.Tasks[a.TaskID]; len(t.Content) > 0 {
			if c, ok := s.catalog.LookupContent(t.Content[0]); ok {
				return c.CID
			}
		}
	}
	return ""
}

// place schedules the queue onto views and records each placement as
// assigned. A placement may instead give the node a canary (at the node's
// canary probability): the scheduled attempt then waits for the next
// round.
func (s *State) place(views []schedule.NodeView) {
	placements := schedule.Schedule(s.scheduleInput(views))
	byID := make(map[string]*schedule.NodeView, len(views))
	for i := range views {
		byID[views[i].ID] = &views[i]
	}
	placed := make(map[string]bool, len(placements))
	for _, p := range placements {
		if s.roomFor(p.Node) == 0 {
			// Its pool was given all it may hold this round (the
			// scheduler saw each of its nodes alone): the attempt waits
			// for the next round, where other nodes may take it.
			s.wake()
			continue
		}
		a := s.Attempts[p.AttemptID]
		if !a.Canary {
			if ca := s.canaryFor(p.Node, byID[p.Node]); ca != nil {
				a = ca // in this slot, this round; the scheduled attempt stays queued
			}
		}
		if s.placeOn(a, p.Node) {
			placed[a.ID] = true
			s.useRoom(p.Node)
		}
	}
	s.dequeue(placed)
}

// Place puts a queued attempt on a node, as a scheduling round would
// (lease, cross-check, offer), without asking the scheduler: for tools and
// tests that drive the core by hand. Its reply is nil, or an error saying
// why not.
type Place struct{ Attempt, Node string }

func (Place) event() {}

func (s *State) placeByHand(e Place) {
	a := s.Attempts[e.Attempt]
	switch {
	case a == nil:
		s.fx.Reply = fmt.Errorf("%w: no attempt %q", ErrBadRequest, e.Attempt)
	case a.State != StateQueued:
		s.fx.Reply = fmt.Errorf("%w: attempt %s is %s, not queued", ErrBadRequest, a.ID, a.State)
	case !s.placeOn(a, e.Node):
		s.fx.Reply = fmt.Errorf("attempt %s: the cross-check refuses node %s", a.ID, e.Node)
	default:
		s.dequeue(map[string]bool{a.ID: true})
	}
}

// dequeue removes attempts from the queue (one pass for a round).
func (s *State) dequeue(ids map[string]bool) {
	if len(ids) > 0 {
		s.Queue = slices.DeleteFunc(s.Queue, func(id string) bool { return ids[id] })
	}
}

// idleCanaries gives a canary, at its canary probability, to each node
// with a free slot that has been given nothing for IdleCanaryEvery.
func (s *State) idleCanaries(views []schedule.NodeView) {
	if s.cfg.IdleCanaryEvery < 0 {
		return
	}
	for i := range views {
		v := &views[i]
		last, ok := s.lastJob[v.ID]
		if !ok {
			s.lastJob[v.ID] = s.now // a node is idle from when it is first seen
			continue
		}
		if s.now.Sub(last) < s.cfg.IdleCanaryEvery { // also when a job was placed there this round
			continue
		}
		s.lastJob[v.ID] = s.now
		if s.roomFor(v.ID) == 0 {
			continue
		}
		if ca := s.canaryFor(v.ID, v); ca != nil && s.placeOn(ca, v.ID) {
			s.useRoom(v.ID)
		}
	}
}

// placeOn records queued attempt a as assigned to node, with a lease, tells
// the cross-check (which may ask for more replicas of its unit) and asks
// for the offer. Callers take a placed attempt out of the queue.
func (s *State) placeOn(a *Attempt, node string) bool {
	op := node
	if n := s.Nodes[node]; n != nil && n.Operator != "" {
		op = n.Operator
	}
	s.Book.Node(node, op)
	var eff crosscheck.Effects
	var err error
	if booked(a) {
		eff, err = s.Book.Placed(a.Unit, a.ID, node, s.rng.Float64())
	} else if s.quarantined(node) {
		err = fmt.Errorf("node %s is quarantined", node)
	}
	if err != nil {
		// The book refuses (the node is quarantined, or holds this unit
		// already): keep the attempt off that node.
		s.log.Warn("placement refused by the cross-check", "attempt", a.ID, "node", node, "err", err)
		if !slices.Contains(a.Avoid, node) {
			a.Avoid = append(a.Avoid, node)
			s.persistAttempt(a)
		}
		if a.Canary && !slices.Contains(s.Queue, a.ID) {
			s.Queue = append(s.Queue, a.ID) // a new canary: queued like any job
		}
		return false
	}
	ls := s.Leases.Grant(a.ID, node, s.now, s.leaseLimit(a))
	a.State, a.Node, a.Operator, a.Incarnation = StateAssigned, node, op, 0
	a.AssignedAt, a.LeaseDeadline, a.LeaseLimit = s.now, ls.Deadline, ls.Limit
	a.Tries++
	a.Assignees = append(a.Assignees, Assignee{Node: node, Operator: op, At: s.now})
	s.persistAttempt(a)
	s.persistBookNode(node)
	s.applyEffects(eff, a.Unit)
	s.lastJob[node] = s.now
	s.fx.Offers = append(s.fx.Offers, Offer{Attempt: a.ID, Node: node, Deadline: ls.Deadline})
	return true
}

// leaseLimit is the latest a's lease may run, granted now: the time to
// fetch its inputs (FetchAllowance plus their size at MinFetchRate), its
// wall-clock limit, and LeaseMargin to report.
func (s *State) leaseLimit(a *Attempt) time.Time {
	fetch := s.cfg.FetchAllowance + time.Duration(float64(s.inputBytes(a))/float64(s.cfg.MinFetchRate)*float64(time.Second))
	return s.now.Add(fetch + time.Duration(s.limitsOf(a).GetWallSeconds())*time.Second + s.cfg.LeaseMargin)
}

// limitsOf is the limits a's job runs under.
func (s *State) limitsOf(a *Attempt) interface{ GetWallSeconds() uint32 } {
	if a.Kind != KindCapsuleRun {
		if si, ok := s.catalog.LookupSuite(a.Suite); ok && si.Limits != nil {
			return si.Limits
		}
	}
	return s.cfg.Limits
}

// inputBytes is the size of what a's node fetches: its content and image.
func (s *State) inputBytes(a *Attempt) int64 {
	if a.Kind == KindCapsuleRun {
		if r := s.Repros[a.Repro]; r != nil {
			ag, _ := s.catalog.LookupAgent(r.Image)
			return r.CapsuleSize + ag.Size
		}
		return 0
	}
	ag, _ := s.catalog.LookupAgent(a.Agent)
	n := ag.Size
	if si, ok := s.catalog.LookupSuite(a.Suite); ok {
		for _, name := range si.Tasks[a.TaskID].Content {
			c, _ := s.catalog.LookupContent(name)
			n += c.Size
		}
	}
	return n
}

// siblings lists the attempts that share a's spread key.
func (s *State) siblings(a *Attempt) []string {
	if a.Kind == KindReplay {
		return s.replaySiblings(a)
	}
	if a.Repro == "" || a.Canary {
		return s.Units[a.Unit]
	}
	r := s.Repros[a.Repro]
	if r == nil {
		return s.Units[a.Unit]
	}
	var out []string
	for _, u := range r.Units {
		out = append(out, s.Units[u]...)
	}
	return out
}

// Renewal is a node's lease renewal of an attempt. Its reply is a
// RenewalReply.
type Renewal struct {
	Attempt, Node, Phase string
}

func (Renewal) event() {}

// RenewalReply answers a renewal: the new deadline, or why not.
type RenewalReply struct {
	OK       bool
	Deadline time.Time
	Reason   string
}

// renewal extends a lease. The new deadline is not made durable: on
// restart every restored lease runs at least a full TTL from then.
func (s *State) renewal(e Renewal) {
	ls, err := s.Leases.Renew(e.Attempt, e.Node, s.now)
	if err != nil {
		s.fx.Reply = RenewalReply{Reason: err.Error()}
		return
	}
	if a := s.Attempts[e.Attempt]; a != nil {
		a.LeaseDeadline = ls.Deadline
	}
	s.fx.Reply = RenewalReply{OK: true, Deadline: ls.Deadline}
}
