package core

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestStepHandBack: a node that gives back an attempt it holds gets it
// requeued at once, uncharged; anything else is refused and changes
// nothing. A lease that lapses is still charged, hand-back or not.
func TestStepHandBack(t *testing.T) {
	type setup func(h *harness, a *Attempt)
	accepted := func(h *harness, a *Attempt) { h.accept(h.offerTo("n1")) }
	cases := []struct {
		name  string
		setup setup
		// node hands back (default n1), after advancing by wait.
		node string
		wait time.Duration
		// wantOK: taken back; wantWhy: part of the refusal's reason.
		wantOK  bool
		wantWhy string
	}{
		{name: "running", setup: accepted, wantOK: true},
		{name: "late in the lease", setup: accepted, wait: 29 * time.Second, wantOK: true},
		{name: "offer not answered yet", setup: func(h *harness, a *Attempt) { h.offerTo("n1") }, wantOK: true},
		{name: "another node", setup: accepted, node: "n2", wantWhy: "another node"},
		{name: "never assigned", setup: func(*harness, *Attempt) {}, wantWhy: "no lease"},
		{name: "lease lapsed", setup: accepted, wait: 31 * time.Second, wantWhy: "expired"},
		{name: "already reported", setup: func(h *harness, a *Attempt) {
			h.accept(h.offerTo("n1"))
			h.report(a.ID, "n1", "d1")
		}, wantWhy: "no lease"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h, a := oneJob(t, func(c *Config) { c.LeaseTTL = 30 * time.Second })
			h.announce("n2", "op2", 2)
			tc.setup(h, a)
			h.advance(tc.wait)
			before := *h.s.record("n1")
			book := fmt.Sprintf("%+v", h.s.Book.Nodes["n1"])
			state, lost := a.State, a.LeaseLosses
			node := tc.node
			if node == "" {
				node = "n1"
			}
			fx := h.step(HandBack{Attempt: a.ID, Node: node, Reason: "node stopping\n(SIGTERM)"})
			r, ok := fx.Reply.(HandBackReply)
			if !ok {
				t.Fatalf("reply %T, want HandBackReply", fx.Reply)
			}
			if !tc.wantOK {
				if r.OK || !strings.Contains(r.Reason, tc.wantWhy) {
					t.Fatalf("reply %+v, want a refusal saying %q", r, tc.wantWhy)
				}
				if len(fx.Records) != 0 || a.State != state || a.LeaseLosses != lost {
					t.Fatalf("a refused hand-back changed things: %d records, %s", len(fx.Records), a.State)
				}
				return
			}
			if !r.OK {
				t.Fatalf("refused: %s", r.Reason)
			}
			// Requeued at once, without a lease, in the same step's records.
			if a.State != StateQueued || a.Node != "" || a.LeaseLosses != 0 || !hasRecord(fx, AttemptKey(a.ID)) || !fx.Wake {
				t.Fatalf("after hand-back: %s on %q, losses %d, wake %v", a.State, a.Node, a.LeaseLosses, fx.Wake)
			}
			if _, held := h.s.Leases.Get(a.ID); held || h.s.Leases.HeldBy("n1") != 0 {
				t.Fatal("the lease outlived the hand-back")
			}
			if !strings.Contains(a.Detail, "handed back") || strings.Contains(a.Detail, "\n") {
				t.Errorf("detail %q", a.Detail)
			}
			// The node's record is not charged: only the count of hand-backs moves.
			after := *h.s.record("n1")
			if after.HandedBack != before.HandedBack+1 {
				t.Errorf("handed back %d, want %d", after.HandedBack, before.HandedBack+1)
			}
			after.HandedBack = before.HandedBack
			if after.Allowance != before.Allowance || after.LeaseLost != before.LeaseLost || after.InfraErrors != before.InfraErrors ||
				after.Completed != before.Completed || after.ConsecutiveOK != before.ConsecutiveOK || after.Reliability() != before.Reliability() {
				t.Errorf("record charged: before %+v, after %+v", before, after)
			}
			if got := fmt.Sprintf("%+v", h.s.Book.Nodes["n1"]); got != book {
				t.Errorf("cross-check record changed: before %+v, after %+v", book, got)
			}
			// Offered again at once, to another node (it keeps off the one
			// that gave it back for a while).
			h.announce("n2", "op2", 2)
			if o := h.offerTo("n2"); o.Attempt != a.ID {
				t.Fatalf("next offer %+v, want %s on n2", o, a.ID)
			}
			// The node that gave it back cannot renew or hand it back again.
			if rr := h.step(Renewal{Attempt: a.ID, Node: "n1"}).Reply.(RenewalReply); rr.OK {
				t.Fatal("renewed after handing back")
			}
			if hr := h.step(HandBack{Attempt: a.ID, Node: "n1"}).Reply.(HandBackReply); hr.OK {
				t.Fatal("handed back twice")
			}
		})
	}
}

// TestStepHandBackCrashStillCounts: a node that hands back one attempt and
// dies with another still loses the second's lease.
func TestStepHandBackCrashStillCounts(t *testing.T) {
	h := newHarness(t)
	h.announce("n1", "op1", 2)
	h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy", "hard"}, Replicas: 1})
	fx := h.tick()
	if len(fx.Offers) != 2 {
		t.Fatalf("%d offers, want 2", len(fx.Offers))
	}
	for _, o := range fx.Offers {
		h.accept(o)
	}
	first, second := h.s.Attempts[fx.Offers[0].Attempt], h.s.Attempts[fx.Offers[1].Attempt]
	if r := h.step(HandBack{Attempt: first.ID, Node: "n1", Reason: "stopping"}).Reply.(HandBackReply); !r.OK {
		t.Fatal(r.Reason)
	}
	h.announce("n1", "op1", 2, func(an *Announced) { an.Incarnation = 2 })
	if first.LeaseLosses != 0 || second.LeaseLosses != 1 || h.s.Records["n1"].LeaseLost != 1 || h.s.Records["n1"].HandedBack != 1 {
		t.Fatalf("handed back %d losses, crashed %d losses, record %+v", first.LeaseLosses, second.LeaseLosses, h.s.Records["n1"])
	}
}

// TestStepHandBackDeterministic: the same events give the same records.
func TestStepHandBackDeterministic(t *testing.T) {
	run := func() []Record {
		h, a := oneJob(t)
		h.accept(h.offerTo("n1"))
		return h.step(HandBack{Attempt: a.ID, Node: "n1", Reason: "stopping"}).Records
	}
	a, b := run(), run()
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("%d and %d records", len(a), len(b))
	}
	for i := range a {
		if a[i].Key != b[i].Key {
			t.Fatalf("record %d: %s and %s", i, a[i].Key, b[i].Key)
		}
	}
}
