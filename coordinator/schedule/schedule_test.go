package schedule

import (
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"
	"time"
)

func TestSchedule(t *testing.T) {
	free := func(id string, slots int) NodeView { return NodeView{ID: id, FreeSlots: slots, Reliability: 0.5} }
	tests := []struct {
		name string
		in   ScheduleInput
		want []Placement
	}{
		{
			name: "no nodes",
			in:   ScheduleInput{Pending: []Pending{{AttemptID: "a1"}}},
			want: nil,
		},
		{
			name: "prefers node holding the capsule",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "a1", CapsuleCID: "c1"}},
				Nodes:   []NodeView{free("n1", 4), {ID: "n2", FreeSlots: 1, Cached: map[string]bool{"c1": true}}},
			},
			want: []Placement{{"a1", "n2"}},
		},
		{
			name: "spreads by free slots then ID",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "a1", Seq: 1}, {AttemptID: "a2", Seq: 2}, {AttemptID: "a3", Seq: 3}},
				Nodes:   []NodeView{free("n2", 1), free("n1", 2)},
			},
			want: []Placement{{"a1", "n1"}, {"a2", "n1"}, {"a3", "n2"}},
		},
		{
			name: "more reliable node first",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "a1"}},
				Nodes:   []NodeView{{ID: "n1", FreeSlots: 4, Reliability: 0.2}, {ID: "n2", FreeSlots: 1, Reliability: 0.9}},
			},
			want: []Placement{{"a1", "n2"}},
		},
		{
			name: "never exceeds free slots",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "a1", Seq: 1}, {AttemptID: "a2", Seq: 2}},
				Nodes:   []NodeView{free("n1", 1), free("n2", 0)},
			},
			want: []Placement{{"a1", "n1"}},
		},
		{
			name: "avoided nodes are skipped, attempt waits if none left",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "a1", Avoid: []string{"n1"}, Seq: 1}, {AttemptID: "a2", Avoid: []string{"n1", "n2"}, Seq: 2}},
				Nodes:   []NodeView{free("n1", 3), free("n2", 3)},
			},
			want: []Placement{{"a1", "n2"}},
		},
		{
			name: "replicas never share a node or an operator",
			in: ScheduleInput{
				Pending: []Pending{
					{AttemptID: "r1", Unit: "u", Seq: 1}, {AttemptID: "r2", Unit: "u", Seq: 2}, {AttemptID: "r3", Unit: "u", Seq: 3},
				},
				Nodes: []NodeView{
					{ID: "n1", Operator: "op1", FreeSlots: 4}, {ID: "n2", Operator: "op1", FreeSlots: 4}, {ID: "n3", FreeSlots: 1},
				},
			},
			// n1 and n2 share op1: r3 has nowhere to go.
			want: []Placement{{"r1", "n1"}, {"r2", "n3"}},
		},
		{
			name: "replicas avoid nodes and operators of replicas placed earlier",
			in: ScheduleInput{
				Pending:       []Pending{{AttemptID: "r2", Unit: "u"}},
				Nodes:         []NodeView{{ID: "n1", FreeSlots: 4}, {ID: "n2", Operator: "op1", FreeSlots: 4}, {ID: "n3", FreeSlots: 1}},
				UnitNodes:     map[string][]string{"u": {"n1", "n9"}},
				UnitOperators: map[string][]string{"u": {"n1", "op1"}},
			},
			want: []Placement{{"r2", "n3"}},
		},
		{
			name: "a node serves only the suites and groups it lists",
			in: ScheduleInput{
				Pending: []Pending{
					{AttemptID: "a1", Suite: "s1", Group: "g1", Seq: 1},
					{AttemptID: "a2", Suite: "s2", Group: "g1", Seq: 2},
					{AttemptID: "a3", Suite: "s1", Group: "g2", Seq: 3},
				},
				Nodes: []NodeView{{ID: "n1", FreeSlots: 3, Suites: []string{"s1"}, Groups: []string{"g1"}}},
			},
			want: []Placement{{"a1", "n1"}},
		},
		{
			name: "priority first within a group, then queue order",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "low", Seq: 1}, {AttemptID: "high", Priority: 5, Seq: 2}, {AttemptID: "mid", Priority: 1, Seq: 3}},
				Nodes:   []NodeView{free("n1", 2)},
			},
			want: []Placement{{"high", "n1"}, {"mid", "n1"}},
		},
		{
			name: "fair share alternates between groups of equal standing",
			in: ScheduleInput{
				Pending: []Pending{
					{AttemptID: "a1", Group: "a", Seq: 1}, {AttemptID: "a2", Group: "a", Seq: 2}, {AttemptID: "a3", Group: "a", Seq: 3},
					{AttemptID: "b1", Group: "b", Seq: 4}, {AttemptID: "b2", Group: "b", Seq: 5},
				},
				Nodes: []NodeView{free("n1", 4)},
			},
			want: []Placement{{"a1", "n1"}, {"b1", "n1"}, {"a2", "n1"}, {"b2", "n1"}},
		},
		{
			name: "a group with less decayed usage goes first",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "a1", Group: "a", Seq: 1}, {AttemptID: "b1", Group: "b", Seq: 2}},
				Nodes:   []NodeView{free("n1", 1)},
				Groups:  map[string]GroupShare{"a": {Usage: 5000}, "b": {Usage: 100}},
			},
			want: []Placement{{"b1", "n1"}},
		},
		{
			name: "weights: twice the weight, twice the slots",
			in: ScheduleInput{
				Pending: []Pending{
					{AttemptID: "a1", Group: "a", Seq: 1}, {AttemptID: "a2", Group: "a", Seq: 2}, {AttemptID: "a3", Group: "a", Seq: 3},
					{AttemptID: "a4", Group: "a", Seq: 4}, {AttemptID: "b1", Group: "b", Seq: 5}, {AttemptID: "b2", Group: "b", Seq: 6},
					{AttemptID: "b3", Group: "b", Seq: 7},
				},
				Nodes:  []NodeView{free("n1", 6)},
				Groups: map[string]GroupShare{"a": {Weight: 2}, "b": {Weight: 1}},
			},
			want: []Placement{{"a1", "n1"}, {"b1", "n1"}, {"a2", "n1"}, {"a3", "n1"}, {"b2", "n1"}, {"a4", "n1"}},
		},
		{
			name: "quota caps a group; others get the slots",
			in: ScheduleInput{
				Pending: []Pending{{AttemptID: "a1", Group: "a", Seq: 1}, {AttemptID: "a2", Group: "a", Seq: 2}, {AttemptID: "b1", Group: "b", Seq: 3}},
				Nodes:   []NodeView{free("n1", 3)},
				Groups:  map[string]GroupShare{"a": {Quota: 2, Running: 1}},
			},
			want: []Placement{{"b1", "n1"}, {"a1", "n1"}},
		},
		{
			name: "a group at quota takes surplus only if it accepts it",
			in: ScheduleInput{
				Pending: []Pending{
					{AttemptID: "a1", Group: "a", Seq: 1}, {AttemptID: "a2", Group: "a", Seq: 2},
					{AttemptID: "c1", Group: "c", Seq: 3}, {AttemptID: "c2", Group: "c", Seq: 4},
				},
				Nodes:  []NodeView{free("n1", 4)},
				Groups: map[string]GroupShare{"a": {Quota: 1, AcceptSurplus: true}, "c": {Quota: 1}},
			},
			want: []Placement{{"a1", "n1"}, {"c1", "n1"}, {"a2", "n1"}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Schedule(tt.in)
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Schedule() = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestScheduleDoesNotMutateInput(t *testing.T) {
	in := ScheduleInput{
		Pending: []Pending{{AttemptID: "b", Seq: 2}, {AttemptID: "a", Seq: 1, Unit: "u"}},
		Nodes:   []NodeView{{ID: "n1", FreeSlots: 1}},
	}
	Schedule(in)
	if in.Nodes[0].FreeSlots != 1 || in.Pending[0].AttemptID != "b" || in.UnitNodes != nil {
		t.Fatalf("input changed: %+v", in)
	}
}

// TestScheduleInvariants checks, on random inputs, what must always hold:
// no node over its free slots, no attempt twice, no avoided node, no two
// replicas of a unit on one node or operator, and determinism.
func TestScheduleInvariants(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for iter := range 200 {
		var in ScheduleInput
		for i := range 1 + rng.IntN(20) {
			in.Nodes = append(in.Nodes, NodeView{ID: fmt.Sprintf("n%d", i), Operator: fmt.Sprintf("op%d", rng.IntN(5)),
				FreeSlots: rng.IntN(4), Reliability: rng.Float64()})
		}
		for i := range rng.IntN(60) {
			p := Pending{AttemptID: fmt.Sprintf("a%d", i), Unit: fmt.Sprintf("u%d", rng.IntN(15)), Group: fmt.Sprintf("g%d", rng.IntN(3)),
				Priority: rng.IntN(3), Seq: uint64(rng.IntN(100))}
			if rng.IntN(4) == 0 {
				p.Avoid = []string{fmt.Sprintf("n%d", rng.IntN(20))}
			}
			in.Pending = append(in.Pending, p)
		}
		got := Schedule(in)
		if again := Schedule(in); !reflect.DeepEqual(got, again) {
			t.Fatalf("iteration %d: not deterministic", iter)
		}
		used := map[string]int{}
		seen := map[string]bool{}
		unitNodes, unitOps := map[string]map[string]bool{}, map[string]map[string]bool{}
		for _, pl := range got {
			var p Pending
			for _, q := range in.Pending {
				if q.AttemptID == pl.AttemptID {
					p = q
				}
			}
			var n NodeView
			for _, m := range in.Nodes {
				if m.ID == pl.Node {
					n = m
				}
			}
			used[n.ID]++
			if used[n.ID] > n.FreeSlots {
				t.Fatalf("iteration %d: node %s over its %d free slots", iter, n.ID, n.FreeSlots)
			}
			if seen[p.AttemptID] {
				t.Fatalf("iteration %d: %s placed twice", iter, p.AttemptID)
			}
			seen[p.AttemptID] = true
			if slices.Contains(p.Avoid, n.ID) {
				t.Fatalf("iteration %d: %s placed on avoided node %s", iter, p.AttemptID, n.ID)
			}
			if unitNodes[p.Unit] == nil {
				unitNodes[p.Unit], unitOps[p.Unit] = map[string]bool{}, map[string]bool{}
			}
			if unitNodes[p.Unit][n.ID] || unitOps[p.Unit][n.Operator] {
				t.Fatalf("iteration %d: two replicas of %s on node %s / operator %s", iter, p.Unit, n.ID, n.Operator)
			}
			unitNodes[p.Unit][n.ID], unitOps[p.Unit][n.Operator] = true, true
		}
	}
}

func TestGroupUsageDecay(t *testing.T) {
	t0 := time.Unix(1000, 0)
	u := GroupUsage{Group: "g"}.Add(t0, 100, time.Hour)
	tests := []struct {
		after time.Duration
		want  float64
	}{{0, 100}, {time.Hour, 50}, {2 * time.Hour, 25}, {-time.Hour, 100}}
	for _, tt := range tests {
		if got := u.Decayed(t0.Add(tt.after), time.Hour); math.Abs(got-tt.want) > 1e-9 {
			t.Errorf("after %s: %v, want %v", tt.after, got, tt.want)
		}
	}
	if got := u.Add(t0.Add(time.Hour), 10, time.Hour).SlotSeconds; math.Abs(got-60) > 1e-9 {
		t.Errorf("add after a half-life: %v, want 60", got)
	}
}

// TestScheduleOneOperatorPool: second replicas in a pool of a single
// operator have nowhere to go, and finding that out stays cheap.
func TestScheduleOneOperatorPool(t *testing.T) {
	in := ScheduleInput{UnitNodes: map[string][]string{}, UnitOperators: map[string][]string{}}
	for i := range 2000 {
		in.Nodes = append(in.Nodes, NodeView{ID: fmt.Sprintf("n%04d", i), Operator: "op", FreeSlots: 4})
	}
	for i := range 40_000 {
		unit := fmt.Sprintf("u%d", i)
		in.Pending = append(in.Pending, Pending{AttemptID: fmt.Sprintf("a%d", i), Unit: unit, Seq: uint64(i)})
		in.UnitNodes[unit], in.UnitOperators[unit] = []string{"elsewhere"}, []string{"op"}
	}
	start := time.Now()
	if got := Schedule(in); len(got) != 0 {
		t.Fatalf("%d replicas placed on their unit's operator", len(got))
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("took %s", d)
	}
}

// TestScheduleMatchesResources: a job goes only to a slot whose shape
// holds its needs, and a GPU job only to a node with free GPUs of the
// model it asks for; a CPU-only node never gets GPU work, and a node's
// free GPUs are spent as jobs are placed on it.
func TestScheduleMatchesResources(t *testing.T) {
	cpu := NodeView{ID: "cpu", FreeSlots: 4, Slot: Shape{CPUMillis: 1000, MemoryBytes: 4 << 30}}
	big := NodeView{ID: "big", FreeSlots: 4, Slot: Shape{CPUMillis: 4000, MemoryBytes: 32 << 30, DiskBytes: 100 << 30}}
	gpu := NodeView{ID: "gpu", FreeSlots: 4, Slot: Shape{CPUMillis: 1000, MemoryBytes: 16 << 30},
		GPUs: []GPU{{Model: "NVIDIA A10", MemoryBytes: 24 << 30}, {Model: "NVIDIA A10", MemoryBytes: 24 << 30}}, FreeGPUs: 1}
	tests := []struct {
		name  string
		nodes []NodeView
		p     Pending
		want  string // the node, "" for none
	}{
		{"fits a small slot", []NodeView{cpu}, Pending{Needs: Shape{CPUMillis: 1000, MemoryBytes: 4 << 30}}, "cpu"},
		{"more memory than the slot", []NodeView{cpu}, Pending{Needs: Shape{MemoryBytes: 8 << 30}}, ""},
		{"more memory: only the big node", []NodeView{cpu, big}, Pending{Needs: Shape{MemoryBytes: 8 << 30}}, "big"},
		{"disk over what a slot announces", []NodeView{big}, Pending{Needs: Shape{DiskBytes: 200 << 30}}, ""},
		{"disk when the slot announces none", []NodeView{cpu}, Pending{Needs: Shape{DiskBytes: 200 << 30}}, "cpu"},
		{"a GPU job never on a CPU-only node", []NodeView{cpu, big}, Pending{GPUs: GPUNeed{Count: 1}}, ""},
		{"a GPU job on the GPU node", []NodeView{cpu, gpu}, Pending{GPUs: GPUNeed{Count: 1, Model: "a10"}}, "gpu"},
		{"another model", []NodeView{gpu}, Pending{GPUs: GPUNeed{Count: 1, Model: "H100"}}, ""},
		{"more GPU memory than it has", []NodeView{gpu}, Pending{GPUs: GPUNeed{Count: 1, MinMemoryBytes: 40 << 30}}, ""},
		{"two GPUs, one free", []NodeView{gpu}, Pending{GPUs: GPUNeed{Count: 2}}, ""},
	}
	for _, tt := range tests {
		tt.p.AttemptID = "a1"
		got := Schedule(ScheduleInput{Pending: []Pending{tt.p}, Nodes: tt.nodes})
		node := ""
		if len(got) == 1 {
			node = got[0].Node
		}
		if node != tt.want {
			t.Errorf("%s: placed on %q, want %q", tt.name, node, tt.want)
		}
	}
	// The one free GPU is spent by the first GPU job; the second waits,
	// while a CPU job still gets a slot there.
	got := Schedule(ScheduleInput{Nodes: []NodeView{gpu}, Pending: []Pending{
		{AttemptID: "g1", Seq: 1, GPUs: GPUNeed{Count: 1}}, {AttemptID: "g2", Seq: 2, GPUs: GPUNeed{Count: 1}},
		{AttemptID: "c1", Seq: 3}}})
	placed := map[string]bool{}
	for _, p := range got {
		placed[p.AttemptID] = true
	}
	if !placed["g1"] || placed["g2"] || !placed["c1"] {
		t.Fatalf("placements %v: want g1 and c1, not g2", got)
	}
}

// TestBestHolderIsTheScan: the holder heap chooses, at every placement of
// a busy round, exactly the node a scan of every holder of the capsule
// would (the first eligible one in rank order), while free slots fall,
// replicas exclude nodes and operators and some attempts avoid nodes.
func TestBestHolderIsTheScan(t *testing.T) {
	for seed := range uint64(5) {
		in := benchInput(300, 3000, seed)
		s := newScheduler(in)
		chosen, placed := 0, 0
		for i := range in.Pending {
			p := &in.Pending[i]
			var want *nodeSlot
			for _, n := range s.cached[p.CapsuleCID] {
				if n.free > 0 && s.eligible(p, n) && (want == nil || rankBefore(n, want)) {
					want = n
				}
			}
			if got := s.bestHolder(p); got != want {
				t.Fatalf("seed %d, attempt %d (%s): holder heap chose %v, a scan %v", seed, i, p.AttemptID, id(got), id(want))
			}
			if want != nil {
				chosen++
			}
			if s.place(p) != nil {
				placed++
			}
			if s.free == 0 {
				break
			}
		}
		if chosen < 100 || placed < 1000 {
			t.Fatalf("seed %d: %d attempts went to a holder, %d placed: the case tests too little", seed, chosen, placed)
		}
	}
}

func id(n *nodeSlot) string {
	if n == nil {
		return "none"
	}
	return n.view.ID
}
