package schedule

import (
	"cmp"
	"container/heap"
	"math"
	"slices"
)

// NodeView is what the scheduler knows of one node: plain data, built from
// its latest announcement and the coordinator's own count of the attempts
// it has placed there.
type NodeView struct {
	ID string
	// Operator is who controls the node (the signer of its operator
	// certificate); empty means the node is its own operator.
	Operator  string
	FreeSlots int
	// Cached holds the capsule CIDs the node announced as held.
	Cached map[string]bool
	// Suites and Groups restrict what the node serves; empty means any.
	Suites []string
	Groups []string
	// Reliability in [0, 1] ranks nodes after the capsule preference (see
	// NodeRecord.Reliability); tenths are compared, finer differences not.
	Reliability float64
	// Slot is the shape of one slot (zero fields: not announced, any need
	// fits); GPUs are the node's GPUs, FreeGPUs how many are not in use.
	Slot     Shape
	GPUs     []GPU
	FreeGPUs int
}

// Shape is what a slot offers, or what a job needs, of CPU (thousandths of
// a core), memory and disk (bytes).
type Shape struct {
	CPUMillis   uint32
	MemoryBytes uint64
	DiskBytes   uint64
}

// GPU is one GPU of a node.
type GPU struct {
	Model       string
	MemoryBytes uint64
}

// GPUNeed is what a job needs of GPUs: Count GPUs whose model contains
// Model (case aside) and with at least MinMemoryBytes each.
type GPUNeed struct {
	Count          int
	Model          string
	MinMemoryBytes uint64
}

// fits reports whether a slot of shape s holds a job needing n: each
// dimension the slot announces must be at least the need.
func (s Shape) fits(n Shape) bool {
	return (s.CPUMillis == 0 || n.CPUMillis <= s.CPUMillis) && (s.MemoryBytes == 0 || n.MemoryBytes <= s.MemoryBytes) &&
		(s.DiskBytes == 0 || n.DiskBytes <= s.DiskBytes)
}

// gpusFor counts the node's GPUs that can serve need, up to its free ones.
func (n *NodeView) gpusFor(need GPUNeed) int { return min(matchingGPUs(n.GPUs, need), n.FreeGPUs) }

func (n *NodeView) operator() string {
	if n.Operator == "" {
		return n.ID
	}
	return n.Operator
}

// Pending is one queued attempt as the scheduler sees it.
type Pending struct {
	AttemptID string
	// Unit names the piece of work the attempt is a replica of; replicas of
	// one unit never share a node or an operator. Empty: no replicas.
	Unit       string
	CapsuleCID string
	Suite      string
	// Group is the submitter group the attempt is accounted to.
	Group string
	// Priority orders attempts within their group: higher first, then Seq.
	Priority int
	Seq      uint64
	// Avoid lists nodes this attempt must not go to: nodes that declined
	// it, or lost its lease recently.
	Avoid []string
	// Needs is what one slot must offer the job (HTCondor's Requirements);
	// GPUs, what it needs of the node's GPUs (a job needing none never
	// waits for GPUs, and a job needing some goes only to nodes with them).
	Needs Shape
	GPUs  GPUNeed
}

// GroupShare is a submitter group's standing in the fair-share model
// (HTCondor's): Usage is its slot-seconds of past work decayed with a
// half-life (see DecayedUsage), Running the slots it holds now. Groups
// with less usage per unit of Weight are served first. Quota caps the
// slots a group holds at once (0: no cap); a group with AcceptSurplus
// may go over its quota with slots nobody else can use this round.
type GroupShare struct {
	Weight        float64
	Quota         int
	AcceptSurplus bool
	Usage         float64
	Running       int
}

// ScheduleInput is everything the scheduler decides from.
type ScheduleInput struct {
	Pending []Pending
	Nodes   []NodeView
	// Groups holds the share of each group; a group not listed has weight
	// 1, no quota and no usage.
	Groups map[string]GroupShare
	// UnitNodes and UnitOperators list, per unit, the nodes and operators
	// already holding a replica of it (running or finished).
	UnitNodes     map[string][]string
	UnitOperators map[string][]string
	// RunningCharge is the usage, in slot-seconds, one held slot adds to
	// its group's priority (default DefaultRunningCharge): it balances
	// current holdings against decayed past usage.
	RunningCharge float64
}

// DefaultRunningCharge counts a held slot as an hour of usage.
const DefaultRunningCharge = 3600

// Placement is one scheduling decision: run AttemptID on Node.
type Placement struct {
	AttemptID string
	Node      string
}

// Schedule matches pending attempts to free slots. It is deterministic and
// pure: the same input gives the same output, and the input is not changed.
//
// Groups take turns by fair share: the next placement goes to the group
// with the least (Usage + RunningCharge x slots held) / Weight, counting the
// slots it was given earlier in the same call; a group at its quota waits
// unless it accepts surplus and no other group can use the slot. Within a
// group, attempts go by Priority (highest first), then Seq.
//
// Each attempt goes to an eligible node (a free slot whose shape holds its
// needs, free GPUs enough of the model it needs, not in its Avoid list,
// serving its suite and group, no replica of its unit on the node or on
// another node of the same operator), preferring one that already holds
// the capsule, then the more reliable, then the one with the most free
// slots (to spread load), then the smallest ID. An attempt with no
// eligible node stays queued (is not in the result).
func Schedule(in ScheduleInput) []Placement {
	s := newScheduler(in)
	if s.free == 0 || len(in.Pending) == 0 {
		return nil
	}
	var out []Placement
	// First every group within its quota; then, with what is left, the
	// groups that accept surplus.
	for _, surplus := range []bool{false, true} {
		s.queueGroups(surplus)
		for s.free > 0 && s.groupQ.Len() > 0 {
			g := s.groupQ.groups[0]
			p := &in.Pending[g.order[g.next]]
			g.next++
			if n := s.place(p); n != nil {
				out = append(out, Placement{AttemptID: p.AttemptID, Node: n.view.ID})
				g.held++
				g.key = s.groupKey(g)
			}
			if g.next == len(g.order) || (!surplus && g.share.Quota > 0 && g.held >= g.share.Quota) {
				heap.Pop(&s.groupQ)
			} else {
				heap.Fix(&s.groupQ, 0)
			}
		}
	}
	return out
}

type scheduler struct {
	in     ScheduleInput
	charge float64
	free   int
	nodes  []*nodeSlot
	byID   map[string]*nodeSlot
	// ranked orders nodes with free slots by reliability, free slots, ID.
	ranked nodeHeap
	// cached maps a capsule CID to the free nodes holding it, in ID
	// order; holders ranks them, per capsule, built when first asked.
	cached  map[string][]*nodeSlot
	holders map[string]*holderHeap
	groups  []*groupTurn
	groupQ  groupHeap
	// unitNodes and unitOps add this call's placements to the input's.
	unitNodes map[string][]string
	unitOps   map[string][]string
	// unplaceable remembers (suite, group, needs) for which an attempt with
	// no constraint of its own found no node: slots only get fewer within a
	// call, so every such attempt after it fails too.
	unplaceable map[memoKey]bool
	// freeByOp counts free slots per operator, so that a replica whose
	// unit already holds every operator with free slots fails at once.
	freeByOp map[string]int
}

type nodeSlot struct {
	view     *NodeView
	free     int
	freeGPUs int
	rel      int
	heapIdx  int
}

// memoKey is what makes attempts alike for unplaceable.
type memoKey struct {
	suite, group string
	needs        Shape
	gpus         GPUNeed
}

type groupTurn struct {
	name  string
	share GroupShare
	order []int // indexes into Pending, in turn order
	next  int
	held  int
	key   float64
}

func newScheduler(in ScheduleInput) *scheduler {
	s := &scheduler{in: in, charge: in.RunningCharge, byID: make(map[string]*nodeSlot),
		cached: make(map[string][]*nodeSlot), holders: make(map[string]*holderHeap), unitNodes: make(map[string][]string),
		unitOps: make(map[string][]string), unplaceable: make(map[memoKey]bool), freeByOp: make(map[string]int)}
	if s.charge <= 0 {
		s.charge = DefaultRunningCharge
	}
	for i := range in.Nodes {
		v := &in.Nodes[i]
		if v.FreeSlots <= 0 {
			continue
		}
		if _, dup := s.byID[v.ID]; dup {
			continue
		}
		ns := &nodeSlot{view: v, free: v.FreeSlots, freeGPUs: v.FreeGPUs,
			rel: int(math.Round(math.Max(0, math.Min(1, v.Reliability)) * 10))}
		s.nodes = append(s.nodes, ns)
		s.byID[v.ID] = ns
		s.free += ns.free
		s.freeByOp[v.operator()] += ns.free
	}
	// Cached lists in ID order keep the choice deterministic.
	slices.SortFunc(s.nodes, func(a, b *nodeSlot) int { return cmp.Compare(a.view.ID, b.view.ID) })
	for _, ns := range s.nodes {
		for c, ok := range ns.view.Cached {
			if ok {
				s.cached[c] = append(s.cached[c], ns)
			}
		}
		heap.Push(&s.ranked, ns)
	}

	byGroup := make(map[string]*groupTurn)
	for i := range in.Pending {
		name := in.Pending[i].Group
		g, ok := byGroup[name]
		if !ok {
			share, ok := in.Groups[name]
			if !ok || share.Weight <= 0 {
				share.Weight = 1
			}
			g = &groupTurn{name: name, share: share, held: share.Running}
			byGroup[name] = g
			s.groups = append(s.groups, g)
		}
		g.order = append(g.order, i)
	}
	slices.SortFunc(s.groups, func(a, b *groupTurn) int { return cmp.Compare(a.name, b.name) })
	for _, g := range s.groups {
		less := func(i, j int) int {
			a, b := &in.Pending[i], &in.Pending[j]
			if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
				return c
			}
			if c := cmp.Compare(a.Seq, b.Seq); c != 0 {
				return c
			}
			return cmp.Compare(a.AttemptID, b.AttemptID)
		}
		if !slices.IsSortedFunc(g.order, less) {
			slices.SortStableFunc(g.order, less)
		}
		g.key = s.groupKey(g)
	}
	return s
}

func (s *scheduler) groupKey(g *groupTurn) float64 {
	return (g.share.Usage + s.charge*float64(g.held)) / g.share.Weight
}

// queueGroups fills the group queue for a pass: groups with attempts left
// and, outside the surplus pass, room under their quota; in the surplus
// pass only the groups that accept surplus.
func (s *scheduler) queueGroups(surplus bool) {
	s.groupQ.groups = s.groupQ.groups[:0]
	for _, g := range s.groups {
		if g.next == len(g.order) {
			continue
		}
		if surplus != (g.share.Quota > 0 && g.held >= g.share.Quota) {
			continue
		}
		if surplus && !g.share.AcceptSurplus {
			continue
		}
		s.groupQ.groups = append(s.groupQ.groups, g)
	}
	heap.Init(&s.groupQ)
}

// place finds the node for p and takes one of its slots, or returns nil.
func (s *scheduler) place(p *Pending) *nodeSlot {
	constrained := len(p.Avoid) > 0 || len(s.in.UnitNodes[p.Unit])+len(s.unitNodes[p.Unit]) > 0
	memo := memoKey{p.Suite, p.Group, p.Needs, p.GPUs}
	if !constrained && s.unplaceable[memo] {
		return nil
	}
	if constrained && s.excludedFree(p) >= s.free {
		return nil // every free slot is on an operator or node it must avoid
	}
	best := s.bestHolder(p)
	if best == nil {
		// Walk nodes in rank order until one is eligible.
		var skipped []*nodeSlot
		for s.ranked.Len() > 0 {
			n := s.ranked.nodes[0]
			if s.eligible(p, n) {
				best = n
				break
			}
			skipped = append(skipped, heap.Pop(&s.ranked).(*nodeSlot))
		}
		for _, n := range skipped {
			heap.Push(&s.ranked, n)
		}
	}
	if best == nil {
		if !constrained {
			s.unplaceable[memo] = true
		}
		return nil
	}
	best.free--
	best.freeGPUs -= p.GPUs.Count
	s.free--
	s.freeByOp[best.view.operator()]--
	if best.free == 0 {
		heap.Remove(&s.ranked, best.heapIdx)
	} else {
		heap.Fix(&s.ranked, best.heapIdx)
	}
	if p.Unit != "" {
		s.unitNodes[p.Unit] = append(s.unitNodes[p.Unit], best.view.ID)
		s.unitOps[p.Unit] = append(s.unitOps[p.Unit], best.view.operator())
	}
	return best
}

// bestHolder is the first eligible node, in rank order, among the free
// nodes that hold p's capsule, or nil. It walks the capsule's holder heap
// from the top, so a placement costs the ineligible holders ranked above
// the chosen one, not every holder: with 10,000 nodes a capsule may have
// a thousand.
func (s *scheduler) bestHolder(p *Pending) *nodeSlot {
	if p.CapsuleCID == "" {
		return nil
	}
	h := s.holders[p.CapsuleCID]
	if h == nil {
		list := s.cached[p.CapsuleCID]
		if len(list) == 0 {
			return nil
		}
		h = &holderHeap{}
		entries := make([]holder, 0, len(list))
		for _, n := range list {
			if n.free > 0 {
				entries = append(entries, holder{n: n, free: n.free})
				h.entries = append(h.entries, &entries[len(entries)-1])
			}
		}
		heap.Init(h)
		s.holders[p.CapsuleCID] = h
	}
	var best *nodeSlot
	var skipped []*holder
	for h.Len() > 0 {
		top := h.entries[0]
		if top.free != top.n.free {
			// Ranked by a count of free slots it no longer has: rank it
			// anew, or drop it when it has none left (free slots only fall within a call, so every entry
			// ranks at or above where its node does now, and the first
			// entry that is current is the best holder there is).
			if top.n.free > 0 {
				top.free = top.n.free
				heap.Fix(h, 0)
			} else {
				heap.Pop(h)
			}
			continue
		}
		if s.eligible(p, top.n) {
			best = top.n
			break
		}
		skipped = append(skipped, heap.Pop(h).(*holder))
	}
	for _, e := range skipped {
		heap.Push(h, e)
	}
	return best
}

// excludedFree counts the free slots p cannot use because of its unit's
// operators and the nodes it avoids (never more than the truth).
func (s *scheduler) excludedFree(p *Pending) int {
	n := 0
	ops := map[string]bool{}
	for _, list := range [][]string{s.in.UnitOperators[p.Unit], s.unitOps[p.Unit]} {
		for _, op := range list {
			if !ops[op] {
				ops[op] = true
				n += s.freeByOp[op]
			}
		}
	}
	seen := map[string]bool{}
	for _, id := range p.Avoid {
		if ns := s.byID[id]; ns != nil && !seen[id] && !ops[ns.view.operator()] {
			seen[id] = true
			n += ns.free
		}
	}
	return n
}

func (s *scheduler) eligible(p *Pending, n *nodeSlot) bool {
	v := n.view
	if slices.Contains(p.Avoid, v.ID) || !v.Slot.fits(p.Needs) {
		return false
	}
	if p.GPUs.Count > 0 && min(v.gpusFor(p.GPUs), n.freeGPUs) < p.GPUs.Count {
		return false
	}
	if len(v.Suites) > 0 && !slices.Contains(v.Suites, p.Suite) {
		return false
	}
	if len(v.Groups) > 0 && !slices.Contains(v.Groups, p.Group) {
		return false
	}
	if p.Unit != "" {
		op := v.operator()
		if slices.Contains(s.in.UnitNodes[p.Unit], v.ID) || slices.Contains(s.unitNodes[p.Unit], v.ID) ||
			slices.Contains(s.in.UnitOperators[p.Unit], op) || slices.Contains(s.unitOps[p.Unit], op) {
			return false
		}
	}
	return true
}

// rankBefore orders nodes: more reliable, then more free slots, then smaller ID.
func rankBefore(a, b *nodeSlot) bool { return rankedBefore(a, a.free, b, b.free) }

// rankedBefore is rankBefore with a and b counted as having af and bf
// free slots.
func rankedBefore(a *nodeSlot, af int, b *nodeSlot, bf int) bool {
	if a.rel != b.rel {
		return a.rel > b.rel
	}
	if af != bf {
		return af > bf
	}
	return a.view.ID < b.view.ID
}

type nodeHeap struct{ nodes []*nodeSlot }

func (h nodeHeap) Len() int           { return len(h.nodes) }
func (h nodeHeap) Less(i, j int) bool { return rankBefore(h.nodes[i], h.nodes[j]) }
func (h nodeHeap) Swap(i, j int) {
	h.nodes[i], h.nodes[j] = h.nodes[j], h.nodes[i]
	h.nodes[i].heapIdx, h.nodes[j].heapIdx = i, j
}
func (h *nodeHeap) Push(x any) {
	n := x.(*nodeSlot)
	n.heapIdx = len(h.nodes)
	h.nodes = append(h.nodes, n)
}
func (h *nodeHeap) Pop() any {
	n := h.nodes[len(h.nodes)-1]
	h.nodes = h.nodes[:len(h.nodes)-1]
	n.heapIdx = -1
	return n
}

// holder is a node in a capsule's holder heap, ranked as it was when it
// was pushed (with free free slots).
type holder struct {
	n    *nodeSlot
	free int
}

type holderHeap struct{ entries []*holder }

func (h holderHeap) Len() int { return len(h.entries) }
func (h holderHeap) Less(i, j int) bool {
	a, b := h.entries[i], h.entries[j]
	return rankedBefore(a.n, a.free, b.n, b.free)
}
func (h holderHeap) Swap(i, j int) { h.entries[i], h.entries[j] = h.entries[j], h.entries[i] }
func (h *holderHeap) Push(x any)   { h.entries = append(h.entries, x.(*holder)) }
func (h *holderHeap) Pop() any {
	e := h.entries[len(h.entries)-1]
	h.entries = h.entries[:len(h.entries)-1]
	return e
}

type groupHeap struct{ groups []*groupTurn }

func (h groupHeap) Len() int { return len(h.groups) }
func (h groupHeap) Less(i, j int) bool {
	a, b := h.groups[i], h.groups[j]
	if a.key != b.key {
		return a.key < b.key
	}
	return a.name < b.name
}
func (h groupHeap) Swap(i, j int) { h.groups[i], h.groups[j] = h.groups[j], h.groups[i] }
func (h *groupHeap) Push(x any)   { h.groups = append(h.groups, x.(*groupTurn)) }
func (h *groupHeap) Pop() any {
	g := h.groups[len(h.groups)-1]
	h.groups = h.groups[:len(h.groups)-1]
	return g
}
