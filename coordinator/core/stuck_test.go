package core

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/schedule"
	"github.com/repronet/repronet/proto"
)

// Work no node can take ends in bounded time with a reason (issue 23):
// the core is driven at chosen times, never by sleeping.

// small is the slot the test nodes announce: 2 cores, 4 GiB.
var small = schedule.Shape{CPUMillis: 2000, MemoryBytes: 4 << 30}

func slot(sh schedule.Shape) func(*Announced) { return func(a *Announced) { a.Slot = sh } }

// addBigSuite imports suite "big", whose limits exceed every small slot
// (64 cores, 64 GiB: what issue 23 saw).
func (h *harness) addBigSuite() {
	h.cat.add("big", testSuite{tasks: []bench.Task{{ID: "t1", Content: []string{"cap-1"}}}, stages: []bench.Stage{{Name: "solve"}}})
	si := h.cat.suites["big"]
	si.Limits = &proto.Limits{CpuMillis: 64000, MemoryBytes: 64 << 30, Pids: 64, WallSeconds: 600, OutputBytes: 1 << 20}
	h.cat.suites["big"] = si
}

// wait advances d in steps of 10 s, the nodes announcing (so that they
// stay in view) and a scheduling round after each step; it returns the
// offers made.
func (h *harness) wait(d time.Duration, nodes map[string]schedule.Shape) []Offer {
	var offers []Offer
	for end := h.now.Add(d); h.now.Before(end); {
		h.advance(min(10*time.Second, end.Sub(h.now)))
		for _, n := range sortedKeys(nodes) {
			h.announce(n, "op-"+n, 2, slot(nodes[n]))
		}
		offers = append(offers, h.tick().Offers...)
	}
	return offers
}

// infraFail has node report an infrastructure failure of the attempt
// offered to it (accepted first).
func (h *harness) infraFail(o Offer, detail string) {
	h.t.Helper()
	h.accept(o)
	fx := h.step(ReportArrived{Attempt: o.Attempt, Node: o.Node, Digest: "d-" + o.Node, Outcome: "infra_error", Detail: detail,
		Envelope: []byte("e")})
	if _, ok := fx.Reply.(ReportKept); !ok {
		h.t.Fatalf("infrastructure failure answered %#v", fx.Reply)
	}
}

func (h *harness) waitingOf(a *Attempt) Waiting {
	return h.s.Waiting([]string{a.ID}, h.now)[a.ID]
}

func TestStepUnschedulable(t *testing.T) {
	bound := 10 * time.Minute
	cases := []struct {
		name  string
		suite string
		nodes map[string]schedule.Shape
		// script runs the case from the evaluation on; it returns once the
		// attempt should have ended (or not, per wantState).
		script func(t *testing.T, h *harness, a *Attempt)
		// wantWaiting is what Waiting says while it waits (checked by the
		// script where it matters); wantState, wantDetail its end.
		wantState  AttemptState
		wantDetail []string
	}{
		{
			name: "limits larger than every slot", suite: "big",
			nodes: map[string]schedule.Shape{"n1": small, "n2": small},
			script: func(t *testing.T, h *harness, a *Attempt) {
				t0 := h.now
				if offers := h.wait(10*time.Second, map[string]schedule.Shape{"n1": small, "n2": small}); len(offers) != 0 {
					t.Fatalf("offered to a slot too small: %+v", offers)
				}
				w := h.waitingOf(a)
				if !w.Blocked || w.InView != 2 || w.Eligible != 0 || !a.StuckSince.Equal(h.now) ||
					!w.Deadline.Equal(h.now.Add(bound)) {
					t.Fatalf("waiting %+v, stuck since %v (now %v)", w, a.StuckSince, h.now)
				}
				for _, want := range []string{"none of the 2 nodes in view can run it", "2 have slots too small for its limits",
					"it needs 64000 mCPU, 64.0 GiB of memory", "the largest slot offers 2000 mCPU, 4.0 GiB of memory"} {
					if !strings.Contains(w.Reason, want) {
						t.Errorf("reason %q lacks %q", w.Reason, want)
					}
				}
				// Just before the bound it still waits; a restart keeps its
				// clock (StuckSince is durable).
				h.wait(5*time.Minute, map[string]schedule.Shape{"n1": small, "n2": small})
				h.restart()
				a = h.s.Attempts[a.ID]
				if a.State != StateQueued || a.StuckSince.IsZero() {
					t.Fatalf("after restart: %s, stuck since %v", a.State, a.StuckSince)
				}
				h.wait(t0.Add(bound).Sub(h.now), map[string]schedule.Shape{"n1": small, "n2": small})
				if a.State != StateQueued {
					t.Fatalf("ended at %v, before the bound (%v after it was found stuck)", h.now.Sub(t0), bound)
				}
				h.wait(10*time.Second, map[string]schedule.Shape{"n1": small, "n2": small})
			},
			wantState:  StateFailed,
			wantDetail: []string{"none of the 2 nodes in view can run it", "too small", "(for 10m0s)"},
		},
		{
			name: "a node that fits comes into view", suite: "big",
			nodes: map[string]schedule.Shape{"n1": small},
			script: func(t *testing.T, h *harness, a *Attempt) {
				h.wait(5*time.Minute, map[string]schedule.Shape{"n1": small})
				if a.StuckSince.IsZero() {
					t.Fatal("not found stuck")
				}
				big := schedule.Shape{CPUMillis: 64000, MemoryBytes: 128 << 30}
				offers := h.wait(10*time.Second, map[string]schedule.Shape{"n1": small, "big": big})
				if len(offers) != 1 || offers[0].Node != "big" {
					t.Fatalf("offers %+v, want one to the big node", offers)
				}
				if !a.StuckSince.IsZero() {
					t.Errorf("placed, still stuck since %v", a.StuckSince)
				}
			},
			wantState: StateAssigned,
		},
		{
			name: "no node in view: the clock stands", suite: "big",
			script: func(t *testing.T, h *harness, a *Attempt) {
				h.wait(30*time.Minute, nil)
				if w := h.waitingOf(a); w.Blocked || w.Reason != "no node serving this coordinator is in view" {
					t.Fatalf("waiting %+v", w)
				}
			},
			wantState: StateQueued,
		},
		{
			name: "every eligible node failed it", suite: "one",
			nodes: map[string]schedule.Shape{"n1": small, "n2": small, "tiny": {CPUMillis: 100, MemoryBytes: 64 << 20}},
			script: func(t *testing.T, h *harness, a *Attempt) {
				nodes := map[string]schedule.Shape{"n1": small, "n2": small, "tiny": {CPUMillis: 100, MemoryBytes: 64 << 20}}
				for i := range 2 {
					offers := h.wait(time.Second, nodes)
					if len(offers) != 1 {
						t.Fatalf("try %d: offers %+v", i+1, offers)
					}
					h.infraFail(offers[0], "pull registry.example/agent:1: 403 Forbidden")
					if i == 0 {
						// One of two eligible nodes left: it waits for a slot.
						if w := h.waitingOf(a); a.State != StateQueued || w.Blocked || w.Open != 1 || w.Eligible != 2 {
							t.Fatalf("after one failure: %s, waiting %+v", a.State, w)
						}
					}
				}
				if a.InfraFailures != 2 || a.InfraFailures >= h.s.Config().MaxTries {
					t.Fatalf("%d infrastructure failures (MaxTries %d): the test means fewer", a.InfraFailures, h.s.Config().MaxTries)
				}
			},
			wantState: StateFailed,
			wantDetail: []string{"2 of 2 eligible nodes failed it", "n1: pull registry.example/agent:1: 403 Forbidden",
				"no other node in view can run it: 1 has a slot too small for its limits"},
		},
		{
			name: "no node has its GPUs", suite: "gpu",
			nodes: map[string]schedule.Shape{"n1": small},
			script: func(t *testing.T, h *harness, a *Attempt) {
				h.wait(bound+20*time.Second, map[string]schedule.Shape{"n1": small})
			},
			wantState:  StateFailed,
			wantDetail: []string{"none of the 1 node in view can run it: 1 has fewer than 1 GPU"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.UnschedulableAfter = bound })
			h.addBigSuite()
			for _, n := range sortedKeys(tc.nodes) {
				h.announce(n, "op-"+n, 2, slot(tc.nodes[n]))
			}
			h.evaluate(Evaluation{Suite: tc.suite, Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
			a := h.only()
			tc.script(t, h, a)
			a = h.s.Attempts[a.ID]
			if a.State != tc.wantState {
				t.Fatalf("state %s (%s), want %s", a.State, a.Detail, tc.wantState)
			}
			if tc.wantState != StateFailed {
				return
			}
			if a.Outcome != OutcomeUnschedulable {
				t.Errorf("outcome %q, want %q", a.Outcome, OutcomeUnschedulable)
			}
			for _, want := range tc.wantDetail {
				if !strings.Contains(a.Detail, want) {
					t.Errorf("detail %q lacks %q", a.Detail, want)
				}
			}
			// The unit fails with the reason: never scored, so never a 0 on
			// a board, and never charged to a node.
			d := h.s.Book.Attempts[a.Unit].Decision
			if d.State != crosscheck.Failed || !strings.Contains(d.Reason, a.Detail) {
				t.Errorf("unit decision %+v", d)
			}
			if e := h.s.Entries(); len(e) != 1 || e[0].Status != bench.InfraFailed || e[0].Score != nil {
				t.Errorf("entries %+v", e)
			}
			for id, r := range h.s.Records {
				if r.Declined != 0 || r.LeaseLost != 0 || r.InfraErrors > 1 {
					t.Errorf("node %s charged: %+v", id, r)
				}
			}
			if len(h.s.Queue) != 0 {
				t.Errorf("queue %v after the end", h.s.Queue)
			}
			// And it stays ended across a restart.
			h.restart()
			if b := h.s.Attempts[a.ID]; b.State != StateFailed || b.Detail != a.Detail || len(h.s.Queue) != 0 {
				t.Errorf("after restart: %s %q, queue %v", b.State, b.Detail, h.s.Queue)
			}
		})
	}
}

// TestStepUnschedulableRepro: a reproducibility check whose runs fail on
// every node that could run them ends, each run with its reason.
func TestStepUnschedulableRepro(t *testing.T) {
	h := newHarness(t)
	nodes := map[string]schedule.Shape{"n1": small, "n2": small}
	for _, n := range sortedKeys(nodes) {
		h.announce(n, "op-"+n, 2, slot(nodes[n]))
	}
	fx := h.step(ReproQueued{Record: ReproRecord{ID: "rp-1", Check: bench.Check{Runs: 2}, CapsuleCID: "bafycap1", Image: "plain",
		ImageCID: "bafyplain"}})
	if id, ok := fx.Reply.(string); !ok || id != "rp-1" {
		t.Fatalf("queued: %#v", fx.Reply)
	}
	// Each run fails on each node (its environment cannot be built), in
	// turn: the runs of a check go to distinct nodes.
	for round := 0; round < 4; round++ {
		offers := h.wait(time.Second, nodes)
		for _, o := range offers {
			h.infraFail(o, "environment: build: apt-get install r-base: exit status 100")
		}
		if v, _ := h.s.Repro("rp-1"); v.Decided == 2 {
			break
		}
	}
	v, _ := h.s.Repro("rp-1")
	if v.Decided != 2 || len(v.Runs) != 2 {
		t.Fatalf("check not ended: %+v; %s", v, h.states())
	}
	for i, r := range v.Runs {
		if r.Outcome != OutcomeUnschedulable || !strings.Contains(r.Detail, "2 of 2 eligible nodes failed it") ||
			!strings.Contains(r.Detail, "apt-get install r-base") {
			t.Errorf("run %d: %+v", i+1, r)
		}
	}
}

// TestWaitingUnchangedByPlacement: whether an attempt is blocked, and
// why, does not move when it is placed (a submitter who sees it learns
// nothing of where its work runs).
func TestWaitingUnchangedByPlacement(t *testing.T) {
	h, a := oneJob(t)
	before := h.waitingOf(a)
	h.accept(h.offerTo("n1"))
	after := h.waitingOf(a)
	if before.Blocked || after.Blocked || before.Reason != after.Reason || before.Open != 1 {
		t.Fatalf("before %+v, after %+v", before, after)
	}
}

// BenchmarkCheckStuck: a round of checkStuck over a long queue (the
// suite's limits fit no node, so every attempt is blocked and its clock
// runs) with many nodes in view.
func BenchmarkCheckStuck(b *testing.B) {
	for _, size := range []struct{ queue, nodes int }{{10_000, 100}, {250_000, 1000}} {
		b.Run(fmt.Sprintf("queue=%d/nodes=%d", size.queue, size.nodes), func(b *testing.B) {
			t := &testing.T{}
			h := newHarness(t)
			h.addBigSuite()
			for i := range size.nodes {
				h.announce(fmt.Sprintf("n%05d", i), "op", 2, slot(small))
			}
			for i := range size.queue {
				h.s.Seq++
				a := &Attempt{ID: fmt.Sprintf("at-%024d", i), Suite: "big", TaskID: "t1", Agent: "agent", Unit: fmt.Sprintf("u%d", i),
					Seq: h.s.Seq, State: StateQueued, EnqueuedAt: h.now, Needs: schedule.Shape{CPUMillis: 64000}}
				if i%100 == 0 {
					a.Avoid = []string{"n00001", "n00002"}
				}
				h.s.Attempts[a.ID] = a
				h.s.Queue = append(h.s.Queue, a.ID)
			}
			h.s.begin(h.now)
			h.s.checkStuck() // the clocks start
			h.s.end()
			b.ResetTimer()
			for range b.N {
				h.s.lastStuckCheck, h.s.nextStuckCheck = time.Time{}, time.Time{}
				h.s.begin(h.now)
				h.s.checkStuck()
				h.s.end()
			}
		})
	}
}
