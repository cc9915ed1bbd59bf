package core

import (
	"cmp"
	"slices"
	"time"

	"github.com/repronet/repronet/coordinator/schedule"
)

// Announced is a node's validated announcement (proto.Announcement,
// checked by proto.AnnouncementGuard), as the core needs it.
type Announced struct {
	Node        string
	Seq         uint64
	Incarnation uint64
	// Certified is the operator the announcement names: its certificate's
	// signer, or the node itself.
	Certified  string
	TotalSlots int
	FreeSlots  int
	// Coordinators lists the coordinators the node serves with the slots
	// each holds there.
	Coordinators map[string]int
	Slot         schedule.Shape
	GPUs         []schedule.GPU
	FreeGPUs     int
	Suites       []string
	Groups       []string
	Cached       []string
	Version      string
}

func (Announced) event() {}

// announced takes an announcement into the node's view. A new process of a
// node has none of the attempts its predecessor accepted: their leases are
// lost now, not at their deadline.
func (s *State) announced(e Announced) {
	n, ok := s.Nodes[e.Node]
	if !ok {
		n = &NodeView{}
		s.Nodes[e.Node] = n
		s.log.Info("node joined", "node", e.Node, "operator", e.Certified, "slots", e.TotalSlots, "version", e.Version,
			"serves_us", hasKey(e.Coordinators, s.cfg.Self))
	}
	if n.Seq != 0 && e.Seq <= n.Seq {
		return
	}
	restarted := n.Seq == 0 || n.Incarnation != e.Incarnation
	mine, others := 0, 0
	for c, running := range e.Coordinators {
		if c == s.cfg.Self {
			mine = running
		} else {
			others += running
		}
	}
	cached := s.indexCached(e.Node, n.Cached, e.Cached)
	hold, connected := n.hold, n.Connected
	*n = NodeView{Seq: e.Seq, Incarnation: e.Incarnation, Certified: e.Certified, Operator: s.operatorOfNode(e.Certified),
		TotalSlots: e.TotalSlots, FreeSlots: e.FreeSlots, Mine: mine, Others: others, ServesUs: hasKey(e.Coordinators, s.cfg.Self),
		Slot: e.Slot, GPUs: e.GPUs, FreeGPUs: e.FreeGPUs, Suites: e.Suites, Groups: e.Groups, Cached: cached, Version: e.Version,
		LastSeen: s.now, Connected: connected || !ok, hold: hold}
	if restarted {
		for _, ls := range s.Leases.ExpireStale(e.Node, e.Incarnation) {
			if a := s.Attempts[ls.AttemptID]; a != nil && a.State == StateAssigned && a.Node == ls.Node {
				s.log.Warn("node restarted; its attempt is requeued", "attempt", a.ID, "node", e.Node)
				s.requeue(a, requeueLeaseLost, "node "+ls.Node+" restarted")
			}
		}
	}
	rec := s.record(e.Node)
	rec.LastSeen = s.now
	if rec.Operator != n.Operator {
		rec.Operator = n.Operator
		s.persistRecord(rec)
	}
	s.wake()
}

// indexCached returns node's cached set as now announced and keeps the
// holders index in step with it: unchanged (the usual case, as nodes
// announce every few seconds) it is the old set, looked up and kept.
func (s *State) indexCached(node string, old map[string]bool, now []string) map[string]bool {
	if len(old) == len(now) {
		same := true
		for _, c := range now {
			if !old[c] {
				same = false
				break
			}
		}
		if same {
			return old
		}
	}
	for c := range old {
		if set := s.holders[c]; set != nil {
			set.remove(node)
			if len(set.ids) == 0 {
				delete(s.holders, c)
			}
		}
	}
	cached := make(map[string]bool, len(now))
	for _, c := range now {
		cached[c] = true
		set := s.holders[c]
		if set == nil {
			set = &idSet{}
			s.holders[c] = set
		}
		set.add(node)
	}
	return cached
}

func hasKey[V any](m map[string]V, k string) bool { _, ok := m[k]; return ok }

// UnadmittedOperator is the operator of every node whose operator has not
// been admitted: all such nodes count as one operator, so they hold at
// most one replica of a unit between them and can never outvote an
// admitted operator. (Anyone can make operator keys; only admitted ones
// count as independent.)
const UnadmittedOperator = "unadmitted"

// operatorOfNode is the operator a node counts as, given the one its
// announcement names.
func (s *State) operatorOfNode(certified string) string {
	if s.cfg.OpenOperators {
		return certified
	}
	if _, ok := s.Admitted[certified]; ok {
		return certified
	}
	return UnadmittedOperator
}

// Admit admits an operator (by the admin, a standing configuration or a
// join token: Via says which).
type Admit struct {
	Operator, Via string
}

func (Admit) event() {}

// admit records an operator as admitted. Its nodes count as it from now
// on, and so does their past work (crosscheck.Book.Reoperate).
func (s *State) admit(e Admit) {
	if _, ok := s.Admitted[e.Operator]; ok {
		return
	}
	a := Admitted{Operator: e.Operator, Via: e.Via, At: s.now}
	s.Admitted[e.Operator] = a
	s.put(AdmittedKey+"/"+e.Operator, a)
	for _, id := range sortedKeys(s.Nodes) {
		n := s.Nodes[id]
		if n.Certified != e.Operator {
			continue
		}
		n.Operator = e.Operator
		if rec := s.record(id); rec.Operator != e.Operator {
			rec.Operator = e.Operator
			s.persistRecord(rec)
		}
		for _, w := range s.Book.Reoperate(id, e.Operator) {
			s.persistWork(w)
		}
		s.persistBookNode(id)
		for _, aid := range sortedKeys(s.Attempts) {
			if at := s.Attempts[aid]; at.Node == id && at.Operator != e.Operator {
				at.Operator = e.Operator
				s.persistAttempt(at)
			}
		}
	}
	s.wake()
}

// currentOperator is the operator the node of attempt a counts as now (it
// changes when its operator is admitted), or the one recorded with a when
// the node is out of view.
func (s *State) currentOperator(a *Attempt) string {
	if n := s.Nodes[a.Node]; n != nil && n.Operator != "" {
		return n.Operator
	}
	return cmp.Or(a.Operator, a.Node)
}

// pruneNodes forgets nodes silent for ten NodeTTLs (their durable records
// stay).
func (s *State) pruneNodes() {
	for id, n := range s.Nodes {
		if s.now.Sub(n.LastSeen) > 10*s.cfg.NodeTTL {
			s.indexCached(id, n.Cached, nil)
			delete(s.Nodes, id)
			delete(s.lastJob, id)
		}
	}
}

// inView reports whether a node announced within NodeTTL.
func (s *State) inView(n *NodeView) bool { return s.now.Sub(n.LastSeen) <= s.cfg.NodeTTL }

// sortedKeys returns a map's keys in order (effects never depend on map order).
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func sortedIDs[V any](m map[string]V) []string { return sortedKeys(m) }

// NodeInfo describes a node in the coordinator's view.
type NodeInfo struct {
	ID          string      `json:"id"`
	Operator    string      `json:"operator"`
	TotalSlots  int         `json:"total_slots"`
	FreeSlots   int         `json:"free_slots"`
	GPUs        int         `json:"gpus,omitempty"`
	Leased      int         `json:"leased"`
	ServesUs    bool        `json:"serves_us"`
	Connected   bool        `json:"connected"`
	Suites      []string    `json:"suites,omitempty"`
	Groups      []string    `json:"groups,omitempty"`
	LastSeen    time.Time   `json:"last_seen"`
	Version     string      `json:"version"`
	Reliability float64     `json:"reliability"`
	Record      *NodeRecord `json:"record,omitempty"`
	// Quarantined: the cross-check caught the node lying (or an admin
	// quarantined it); it gets no work and its results count for nothing.
	Quarantined bool `json:"quarantined,omitempty"`
}

// NodeInfos lists the nodes in view at now, by ID.
func (s *State) NodeInfos(now time.Time) []NodeInfo {
	var out []NodeInfo
	for _, id := range sortedKeys(s.Nodes) {
		n := s.Nodes[id]
		if now.Sub(n.LastSeen) > s.cfg.NodeTTL {
			continue
		}
		info := NodeInfo{ID: id, Operator: n.Operator, TotalSlots: n.TotalSlots, FreeSlots: n.FreeSlots, GPUs: len(n.GPUs),
			Leased: s.Leases.HeldBy(id), ServesUs: n.ServesUs, Connected: n.Connected, Suites: n.Suites, Groups: n.Groups,
			LastSeen: n.LastSeen, Version: n.Version, Quarantined: s.quarantined(id)}
		if r := s.Records[id]; r != nil {
			rc := *r
			info.Record, info.Reliability = &rc, r.Reliability()
		}
		out = append(out, info)
	}
	return out
}
