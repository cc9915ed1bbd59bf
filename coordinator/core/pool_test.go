package core

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/proto"
)

// closedOperators is a config where only admitted operators count apart
// (the default outside tests).
func closedOperators(c *Config) { c.OpenOperators = false }

// sybils announces n unadmitted nodes u0..u(n-1), each with its own
// self-made operator key, with slots slots each.
func (h *harness) sybils(n, slots int) []string {
	var ids []string
	for i := range n {
		id := fmt.Sprintf("u%d", i)
		h.announce(id, "selfmade-"+id, slots)
		ids = append(ids, id)
	}
	return ids
}

// admitted announces nodes of admitted operators: nodes[i] of ops[i].
func (h *harness) admitted(nodes, ops []string, slots int) {
	for i, n := range nodes {
		h.step(Admit{Operator: ops[i], Via: "test"})
		h.announce(n, ops[i], slots)
	}
}

// offersBy counts a round's offers to unadmitted nodes and to each other node.
func (h *harness) offersBy(fx Effects) (unadmitted int, others map[string]int) {
	others = map[string]int{}
	for _, o := range fx.Offers {
		if h.s.poolOf(o.Node) == UnadmittedOperator {
			unadmitted++
		} else {
			others[o.Node]++
		}
	}
	return unadmitted, others
}

// Peer IDs are free: however many unadmitted identities ask, they share one
// allowance (a new node's, grown by what they finish, halved by what they
// lose), while each admitted operator's node keeps its own.
func TestStepPoolAllowance(t *testing.T) {
	cases := []struct {
		name          string
		sybils        int
		honest        []string // nodes, each of its own admitted operator
		honestOps     []string
		wantUnadmited int
		wantEach      int
	}{
		{name: "one unadmitted node", sybils: 1, wantUnadmited: 2},
		{name: "ten unadmitted identities share one allowance", sybils: 10, wantUnadmited: 2},
		{name: "admitted operators' nodes keep their own", honest: []string{"a1", "a2", "a3"},
			honestOps: []string{"opA", "opB", "opC"}, wantEach: 2},
		{name: "one admitted operator's nodes keep their own", honest: []string{"a1", "a2", "a3"},
			honestOps: []string{"opA", "opA", "opA"}, wantEach: 2},
		{name: "ten unadmitted beside an admitted one", sybils: 10, honest: []string{"a1"}, honestOps: []string{"opA"},
			wantUnadmited: 2, wantEach: 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, closedOperators)
			h.sybils(tc.sybils, 8)
			h.admitted(tc.honest, tc.honestOps, 8)
			h.evaluate(Evaluation{Suite: "two", Agent: "agent", Runs: 20, Replicas: 1})
			un, others := h.offersBy(h.tick())
			if un != tc.wantUnadmited {
				t.Fatalf("unadmitted nodes were offered %d attempts in a round, want %d", un, tc.wantUnadmited)
			}
			for _, n := range tc.honest {
				if others[n] != tc.wantEach {
					t.Fatalf("admitted node %s was offered %d, want %d (offers %v)", n, others[n], tc.wantEach, others)
				}
			}
			// Nothing more while they hold what they may.
			if un, _ := h.offersBy(h.tick()); un != 0 {
				t.Fatalf("a second round gave unadmitted nodes %d more", un)
			}
		})
	}
}

// The pool's allowance grows by one for each report of any of its nodes
// that counts and halves for each lease any of them loses.
func TestStepPoolAllowanceMoves(t *testing.T) {
	h := newHarness(t, closedOperators)
	ids := h.sybils(10, 8)
	h.evaluate(Evaluation{Suite: "two", Agent: "agent", Runs: 20, Replicas: 1})
	fx := h.tick()
	if un, _ := h.offersBy(fx); un != 2 {
		t.Fatalf("first round: %d offers, want 2", un)
	}
	for _, o := range fx.Offers {
		h.accept(o)
	}
	o := fx.Offers[0]
	if r := h.report(o.Attempt, o.Node, "d1"); r != (ReportRecorded{}) {
		t.Fatalf("report: %#v", r)
	}
	if got := h.s.cfg.Allowance.Limit(h.s.Pools[UnadmittedOperator].Allowance, h.now); got != 3 {
		t.Fatalf("after one report the pool's allowance is %d, want 3", got)
	}
	// 3 allowed, 1 held: two more.
	fx = h.tick()
	if un, _ := h.offersBy(fx); un != 2 {
		t.Fatalf("after a report: %d more offers, want 2", un)
	}
	for _, o := range fx.Offers {
		h.accept(o)
	}
	// Every node lets its leases run out: 3 lost leases halve it to 1.
	h.advance(h.s.cfg.LeaseTTL + time.Second)
	for _, id := range ids {
		h.announce(id, "selfmade-"+id, 8)
	}
	fx = h.tick()
	if p := h.s.Pools[UnadmittedOperator]; p.LeaseLost != 3 || h.s.cfg.Allowance.Limit(p.Allowance, h.now) != 1 {
		t.Fatalf("after 3 lost leases: pool %+v, want 3 lost and an allowance of 1", p)
	}
	if un, _ := h.offersBy(fx); un != 1 {
		t.Fatalf("after the losses: %d offers, want 1", un)
	}
	// The pool's record survives a restart.
	h.restart()
	if p := h.s.Pools[UnadmittedOperator]; p == nil || p.LeaseLost != 3 {
		t.Fatalf("pool after a restart: %+v", p)
	}
}

// Late reports: all unadmitted nodes together keep at most MaxLateBytes;
// each admitted operator's node has its own budget.
func TestStepPoolLateBudget(t *testing.T) {
	for _, tc := range []struct {
		name     string
		admitted bool
		wantKept int
	}{
		{"ten unadmitted identities share one budget", false, 3},
		{"ten admitted operators' nodes keep their own", true, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, closedOperators, func(c *Config) { c.MaxLateBytes = 3 << 20 })
			h.admitted([]string{"honest"}, []string{"opH"}, 1)
			var late []string
			for i := range 10 {
				id := fmt.Sprintf("n%d", i)
				if tc.admitted {
					h.admitted([]string{id}, []string{"op-" + id}, 1)
				} else {
					h.announce(id, "selfmade-"+id, 1)
				}
				late = append(late, id)
			}
			h.evaluate(Evaluation{Suite: "two", Agent: "agent", Runs: 5, Replicas: 1})
			atts := h.s.AttemptList(true)
			kept, refused := 0, 0
			for i, id := range late {
				a := atts[i]
				// id takes it and restarts (its lease is lost), honest
				// reports it, then id's report comes: late.
				if r := h.step(Place{Attempt: a.ID, Node: id}).Reply; r != nil {
					t.Fatalf("place: %v", r)
				}
				h.step(OfferAnswered{Attempt: a.ID, Node: id, Accepted: true, Incarnation: 1})
				h.announce(id, "", 1, func(an *Announced) {
					an.Incarnation, an.Certified = 2, h.s.Nodes[id].Certified
				})
				if r := h.step(Place{Attempt: a.ID, Node: "honest"}).Reply; r != nil {
					t.Fatalf("place on honest: %v", r)
				}
				h.step(OfferAnswered{Attempt: a.ID, Node: "honest", Accepted: true, Incarnation: 1})
				if r := h.report(a.ID, "honest", "ok-"+a.ID); r != (ReportRecorded{}) {
					t.Fatalf("honest report: %#v", r)
				}
				ev := ReportArrived{Attempt: a.ID, Node: id, Digest: "late-" + a.ID, Outcome: "ok", Evidence: h.evidence(a.ID),
					Envelope: make([]byte, 1<<20)}
				switch r := h.step(ev).Reply.(type) {
				case ReportKept:
					kept++
				case ReportRefused:
					if !strings.Contains(r.Reason, "bytes of late reports on record") {
						t.Fatalf("late report %d refused for another reason: %s", i, r.Reason)
					}
					refused++
				default:
					t.Fatalf("late report %d: %#v", i, r)
				}
			}
			if kept != tc.wantKept || kept+refused != 10 {
				t.Fatalf("%d late reports kept, %d refused; want %d kept (3 MiB budget, 1 MiB each)", kept, refused, tc.wantKept)
			}
		})
	}
}

// Declines: an operator's nodes vote once in "declined by MaxDeclines
// nodes", and all unadmitted nodes together vote once, so five free
// identities cannot fail an attempt an idle honest node would run.
func TestStepPoolDeclineVote(t *testing.T) {
	for _, tc := range []struct {
		name      string
		decliners func(h *harness) []string
		wantState AttemptState
	}{
		{"five unadmitted identities: one vote", func(h *harness) []string { return h.sybils(5, 1) }, StateQueued},
		{"five nodes of one admitted operator: one vote", func(h *harness) []string {
			ids := []string{"d0", "d1", "d2", "d3", "d4"}
			h.admitted(ids, []string{"opD", "opD", "opD", "opD", "opD"}, 1)
			return ids
		}, StateQueued},
		{"five admitted operators: five votes", func(h *harness) []string {
			ids := []string{"d0", "d1", "d2", "d3", "d4"}
			h.admitted(ids, []string{"op0", "op1", "op2", "op3", "op4"}, 1)
			return ids
		}, StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, closedOperators)
			h.admitted([]string{"honest"}, []string{"opH"}, 1)
			ids := tc.decliners(h)
			h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
			a := h.only()
			for _, id := range ids {
				if r := h.step(Place{Attempt: a.ID, Node: id}).Reply; r != nil {
					t.Fatalf("place on %s: %v", id, r)
				}
				h.step(OfferAnswered{Attempt: a.ID, Node: id, Code: proto.DeclineCode_DECLINE_UNSUPPORTED, Reason: "no runtime"})
			}
			if a.State != tc.wantState {
				t.Fatalf("after 5 declines: %s (%q), want %s", a.State, a.Detail, tc.wantState)
			}
			if tc.wantState == StateFailed {
				if !strings.Contains(a.Detail, "declined by 5 nodes (max 5)") {
					t.Fatalf("detail %q", a.Detail)
				}
				return
			}
			if o := h.offerTo("honest"); o.Attempt != a.ID {
				t.Fatalf("the honest node was offered %+v", o)
			}
		})
	}
}

// Lost leases: those of unadmitted nodes count once towards an attempt's
// MaxLeaseLosses, and after one every unadmitted node keeps off the
// attempt for AvoidAfterLeaseLoss; each admitted operator's loss counts.
func TestStepPoolLeaseLosses(t *testing.T) {
	for _, tc := range []struct {
		name      string
		admitted  bool
		wantState AttemptState
	}{
		{"six unadmitted identities count once", false, StateQueued},
		{"six admitted operators count six times", true, StateFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, closedOperators, func(c *Config) { c.MaxLeaseLosses = 3 })
			var ids []string
			for i := range 6 {
				id := fmt.Sprintf("n%d", i)
				if tc.admitted {
					h.admitted([]string{id}, []string{"op-" + id}, 1)
				} else {
					h.announce(id, "selfmade-"+id, 1)
				}
				ids = append(ids, id)
			}
			h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
			a := h.only()
			for _, id := range ids {
				if a.State != StateQueued {
					break
				}
				if r := h.step(Place{Attempt: a.ID, Node: id}).Reply; r != nil {
					t.Fatalf("place on %s: %v", id, r)
				}
				h.step(OfferAnswered{Attempt: a.ID, Node: id, Accepted: true, Incarnation: 1})
				h.announce(id, "", 1, func(an *Announced) { an.Incarnation, an.Certified = 2, h.s.Nodes[id].Certified })
			}
			if a.State != tc.wantState {
				t.Fatalf("after the losses: %s (%q; %d lost, %d unadmitted), want %s", a.State, a.Detail, a.LeaseLosses,
					a.UnadmittedLosses, tc.wantState)
			}
			if tc.admitted {
				return
			}
			if a.LeaseLosses != 6 || a.countedLosses() != 1 {
				t.Fatalf("%d lost, %d counted; want 6 and 1", a.LeaseLosses, a.countedLosses())
			}
			// Kept off every unadmitted node, new identities too, for a while.
			h.announce("fresh", "selfmade-fresh", 1)
			if fx := h.tick(); len(fx.Offers) != 0 {
				t.Fatalf("offered to an unadmitted node right after the pool lost it: %+v", fx.Offers)
			}
			h.step(Admit{Operator: "opH", Via: "test"})
			h.announce("honest", "opH", 1)
			if o := h.offerTo("honest"); o.Attempt != a.ID {
				t.Fatalf("offer %+v", o)
			}
		})
	}
}

// A node is never charged for the coordinator's trouble: while it cannot
// write (Tick.Writable false: reports are answered "retry") no lease runs
// out, renewals go on, and the node's report counts once it can write
// again; a node that stays silent after that loses its lease as usual.
func TestStepLeaseHeldWhileUnwritable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reports  bool
		wantLost int
	}{
		{"the node reports once the coordinator can write", true, 0},
		{"the node stays silent after", false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, a := oneJob(t)
			h.accept(h.offerTo("n1"))
			ttl := h.s.cfg.LeaseTTL
			limit := a.LeaseLimit
			// The disk is full for far longer than a TTL and past the
			// attempt's limit; the node, its work done, only retries its
			// report (which the shell answers "retry").
			for end := limit.Add(ttl); h.now.Before(end); h.advance(5 * time.Second) {
				h.announce("n1", "op1", 2)
				h.step(Tick{Writable: false})
				if a.State != StateAssigned {
					t.Fatalf("at %v, while unwritable: %s (%q)", h.now.Sub(limit), a.State, a.Detail)
				}
			}
			if r := h.step(Renewal{Attempt: a.ID, Node: "n1"}).Reply.(RenewalReply); !r.OK {
				t.Fatalf("renewal while unwritable refused: %s", r.Reason)
			}
			h.advance(ttl / 2)
			h.announce("n1", "op1", 2)
			h.tick()
			if tc.reports {
				if r := h.report(a.ID, "n1", "d1"); r != (ReportRecorded{}) {
					t.Fatalf("report after the disk came back: %#v", r)
				}
			} else {
				h.advance(ttl)
				h.announce("n1", "op1", 2)
				h.tick()
			}
			rec := h.s.Records["n1"]
			if rec.LeaseLost != tc.wantLost || a.LeaseLosses != tc.wantLost {
				t.Fatalf("node record %+v, attempt losses %d; want %d lost", rec, a.LeaseLosses, tc.wantLost)
			}
			if bn := h.s.Book.Nodes["n1"]; bn != nil && bn.MissedDeadlines != tc.wantLost {
				t.Fatalf("cross-check record: %d missed deadlines, want %d", bn.MissedDeadlines, tc.wantLost)
			}
		})
	}
}
