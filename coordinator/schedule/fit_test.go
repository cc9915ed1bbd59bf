package schedule

import (
	"math/rand/v2"
	"testing"
)

func TestExplain(t *testing.T) {
	slot := Shape{CPUMillis: 2000, MemoryBytes: 4 << 30}
	a100 := []GPU{{Model: "NVIDIA A100", MemoryBytes: 40 << 30}}
	cases := []struct {
		name string
		p    Pending
		v    NodeView
		want Misfit
	}{
		{"fits", Pending{Suite: "s", Needs: Shape{CPUMillis: 1000}}, NodeView{Slot: slot}, Fits},
		{"unannounced slot holds anything", Pending{Needs: Shape{CPUMillis: 64000}}, NodeView{}, Fits},
		{"suite", Pending{Suite: "s"}, NodeView{Suites: []string{"t"}, Slot: slot}, SuiteNotServed},
		{"group", Pending{Group: "g"}, NodeView{Groups: []string{"h"}, Slot: slot}, GroupNotServed},
		{"cpu", Pending{Needs: Shape{CPUMillis: 64000}}, NodeView{Slot: slot}, SlotTooSmall},
		{"memory", Pending{Needs: Shape{MemoryBytes: 64 << 30}}, NodeView{Slot: slot}, SlotTooSmall},
		{"no GPU", Pending{GPUs: GPUNeed{Count: 1}}, NodeView{Slot: slot}, TooFewGPUs},
		{"wrong GPU", Pending{GPUs: GPUNeed{Count: 1, Model: "H100"}}, NodeView{Slot: slot, GPUs: a100}, TooFewGPUs},
		// Busy GPUs are a wait, not a misfit.
		{"GPU busy", Pending{GPUs: GPUNeed{Count: 1, Model: "a100"}}, NodeView{Slot: slot, GPUs: a100, FreeGPUs: 0}, Fits},
	}
	for _, tc := range cases {
		if got := Explain(tc.p, tc.v); got != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestExplainAgreesWithSchedule: every placement Schedule makes is on a
// node Explain says fits (random pools and queues).
func TestExplainAgreesWithSchedule(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	for round := range 200 {
		var in ScheduleInput
		for i := range 6 {
			v := NodeView{ID: string(rune('a' + i)), FreeSlots: 1 + rng.IntN(2), Reliability: 0.5,
				Slot: Shape{CPUMillis: uint32(1000 * (1 + rng.IntN(4))), MemoryBytes: uint64(1+rng.IntN(8)) << 30}}
			if rng.IntN(3) == 0 {
				v.Suites = []string{pick("s1", "s2")}
			}
			if rng.IntN(3) == 0 {
				v.Groups = []string{pick("g1", "g2")}
			}
			if rng.IntN(3) == 0 {
				v.GPUs, v.FreeGPUs = []GPU{{Model: "A100", MemoryBytes: 40 << 30}}, 1
			}
			in.Nodes = append(in.Nodes, v)
		}
		for i := range 10 {
			p := Pending{AttemptID: string(rune('A' + i)), Suite: pick("s1", "s2"), Group: pick("g1", "g2"), Seq: uint64(i),
				Needs: Shape{CPUMillis: uint32(1000 * (1 + rng.IntN(4))), MemoryBytes: uint64(1+rng.IntN(8)) << 30}}
			if rng.IntN(4) == 0 {
				p.GPUs = GPUNeed{Count: 1}
			}
			in.Pending = append(in.Pending, p)
		}
		byID := map[string]NodeView{}
		for _, v := range in.Nodes {
			byID[v.ID] = v
		}
		pend := map[string]Pending{}
		for _, p := range in.Pending {
			pend[p.AttemptID] = p
		}
		for _, pl := range Schedule(in) {
			if m := Explain(pend[pl.AttemptID], byID[pl.Node]); m != Fits {
				t.Fatalf("round %d: %s placed on %s, which Explain says cannot run it (%v)", round, pl.AttemptID, pl.Node, m)
			}
		}
	}
}
