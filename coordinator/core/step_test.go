package core

import (
	"encoding/json"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/schedule"
	"github.com/repronet/repronet/proto"
)

// oneJob is the usual start: node n1 of operator op1 with two slots, and
// one attempt of one task, replicated once (no cross-check replicas).
func oneJob(t *testing.T, mod ...func(*Config)) (*harness, *Attempt) {
	t.Helper()
	h := newHarness(t, mod...)
	h.announce("n1", "op1", 2)
	h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
	return h, h.only()
}

func hasRecord(fx Effects, key string) bool {
	return slices.ContainsFunc(fx.Records, func(r Record) bool { return r.Key == key })
}

func TestStepAssign(t *testing.T) {
	h, a := oneJob(t)
	if a.State != StateQueued || len(h.s.Queue) != 1 {
		t.Fatalf("evaluation left %s, queue %v", a.State, h.s.Queue)
	}
	fx := h.tick()
	if len(fx.Offers) != 1 || fx.Offers[0].Node != "n1" || fx.Offers[0].Attempt != a.ID {
		t.Fatalf("offers %+v, want %s on n1", fx.Offers, a.ID)
	}
	if want := h.now.Add(h.s.Config().LeaseTTL); !fx.Offers[0].Deadline.Equal(want) {
		t.Errorf("offer deadline %v, want a TTL from now (%v)", fx.Offers[0].Deadline, want)
	}
	// The offer is made only with the record that says so: same effects.
	if !hasRecord(fx, AttemptKey(a.ID)) {
		t.Errorf("offer without the attempt's record in the same batch: %+v", fx.Records)
	}
	if a.State != StateAssigned || a.Node != "n1" || a.Tries != 1 || len(a.Assignees) != 1 || len(h.s.Queue) != 0 {
		t.Fatalf("after placement: %+v, queue %v", a, h.s.Queue)
	}
	if _, ok := h.s.Leases.Get(a.ID); !ok {
		t.Fatal("no lease")
	}
	fx = h.accept(fx.Offers[0])
	if a.Incarnation != 1 || h.s.Records["n1"].Assigned != 1 || !hasRecord(fx, NodesKey+"/n1") {
		t.Fatalf("accept: incarnation %d, record %+v", a.Incarnation, h.s.Records["n1"])
	}
	if fx := h.tick(); len(fx.Offers) != 0 {
		t.Fatalf("an empty queue offered %+v", fx.Offers)
	}
	// A full data folder holds placement.
	h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"hard"}, Replicas: 1})
	if fx := h.step(Tick{Writable: false}); len(fx.Offers) != 0 || len(fx.Records) != 0 {
		t.Fatalf("placed while the disk is full: %+v", fx)
	}
}

func TestStepDecline(t *testing.T) {
	cases := []struct {
		name  string
		nodes []string
		code  proto.DeclineCode
		// declines: how many nodes decline in turn.
		declines    int
		maxDeclines int
		wantState   AttemptState
		wantDetail  string
	}{
		{name: "busy", nodes: []string{"n1"}, code: proto.DeclineCode_DECLINE_BUSY, declines: 1, wantState: StateQueued,
			wantDetail: "node busy"},
		{name: "lasting, another node left", nodes: []string{"n1", "n2"}, code: proto.DeclineCode_DECLINE_UNSUPPORTED,
			declines: 1, wantState: StateQueued, wantDetail: "declined by node"},
		{name: "lasting, every node declined", nodes: []string{"n1"}, code: proto.DeclineCode_DECLINE_UNSUPPORTED,
			declines: 1, wantState: StateFailed, wantDetail: "declined by every node that could run it (1)"},
		{name: "lasting, MaxDeclines reached", nodes: []string{"n1", "n2", "n3"}, code: proto.DeclineCode_DECLINE_INVALID,
			declines: 2, maxDeclines: 2, wantState: StateFailed, wantDetail: "declined by 2 nodes (max 2)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *Config) { c.MaxDeclines = tc.maxDeclines })
			for i, n := range tc.nodes {
				h.announce(n, "op"+n, 1)
				_ = i
			}
			h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
			a := h.only()
			var declined []string
			for range tc.declines {
				fx := h.tick()
				if len(fx.Offers) != 1 {
					t.Fatalf("offers %+v", fx.Offers)
				}
				o := fx.Offers[0]
				if slices.Contains(declined, o.Node) {
					t.Fatalf("offered again to %s, which declined it", o.Node)
				}
				declined = append(declined, o.Node)
				h.step(OfferAnswered{Attempt: o.Attempt, Node: o.Node, Code: tc.code, Reason: "no \x00runtime\nhere"})
			}
			if a.State != tc.wantState || !strings.Contains(a.Detail, tc.wantDetail) {
				t.Fatalf("state %s detail %q, want %s with %q", a.State, a.Detail, tc.wantState, tc.wantDetail)
			}
			if len(a.Assignees) != 0 {
				t.Errorf("a declined offer left assignees %+v", a.Assignees)
			}
			if _, ok := h.s.Leases.Get(a.ID); ok {
				t.Error("a declined offer kept its lease")
			}
			switch {
			case tc.code == proto.DeclineCode_DECLINE_BUSY:
				// Not counted against anyone; the node is held until it
				// announces again.
				if a.Tries != 0 || len(a.Declines) != 0 || h.s.BusyDeclines != 1 {
					t.Fatalf("busy: tries %d declines %v busy %d", a.Tries, a.Declines, h.s.BusyDeclines)
				}
				if fx := h.tick(); len(fx.Offers) != 0 {
					t.Fatalf("offered to a node held back: %+v", fx.Offers)
				}
				h.announce("n1", "opn1", 1)
				if fx := h.tick(); len(fx.Offers) != 1 {
					t.Fatalf("not offered again after a new announcement: %+v", fx.Offers)
				}
			case tc.wantState == StateFailed:
				if a.Outcome != OutcomeDeclined {
					t.Errorf("outcome %q, want %q", a.Outcome, OutcomeDeclined)
				}
				if d := h.s.Book.Attempts[a.Unit].Decision.State; d != crosscheck.Failed {
					t.Errorf("unit %s, want failed", d)
				}
				if strings.ContainsAny(a.Declines[0].Reason, "\x00\n") {
					t.Errorf("a node's reason kept raw: %q", a.Declines[0].Reason)
				}
			default:
				if !slices.Equal(a.Avoid, declined) || h.s.Records[declined[0]].Declined != 1 {
					t.Fatalf("avoid %v, record %+v", a.Avoid, h.s.Records[declined[0]])
				}
				fx := h.tick()
				if len(fx.Offers) != 1 || fx.Offers[0].Node == declined[0] {
					t.Fatalf("next offer %+v, want another node than %s", fx.Offers, declined[0])
				}
			}
		})
	}
}

func TestStepLeaseLoss(t *testing.T) {
	t.Run("expiry", func(t *testing.T) {
		h, a := oneJob(t)
		h.accept(h.offerTo("n1"))
		ttl := h.s.Config().LeaseTTL
		h.advance(ttl / 2)
		h.announce("n1", "op1", 2)
		fx := h.step(Renewal{Attempt: a.ID, Node: "n1", Phase: "running"})
		if r := fx.Reply.(RenewalReply); !r.OK || !r.Deadline.Equal(h.now.Add(ttl)) || len(fx.Records) != 0 {
			t.Fatalf("renewal %+v (records %d)", r, len(fx.Records))
		}
		if r := h.step(Renewal{Attempt: a.ID, Node: "n2"}).Reply.(RenewalReply); r.OK {
			t.Fatal("another node renewed the lease")
		}
		h.advance(ttl + time.Second)
		h.announce("n1", "op1", 2)
		h.tick()
		if a.State != StateQueued || a.LeaseLosses != 1 || a.AvoidUntil["n1"].IsZero() {
			t.Fatalf("after expiry: %s, losses %d, avoid %v", a.State, a.LeaseLosses, a.AvoidUntil)
		}
		rec := h.s.Records["n1"]
		if rec.LeaseLost != 1 || h.s.Config().Allowance.Limit(rec.Allowance, h.now) != 1 {
			t.Fatalf("record %+v: want a lost lease and the allowance halved", rec)
		}
		if fx := h.tick(); len(fx.Offers) != 0 {
			t.Fatalf("offered again to the node that lost it, at once: %+v", fx.Offers)
		}
		h.advance(h.s.Config().AvoidAfterLeaseLoss)
		h.announce("n1", "op1", 2)
		if o := h.offerTo("n1"); o.Attempt != a.ID {
			t.Fatalf("offer %+v", o)
		}
	})
	t.Run("node restarted", func(t *testing.T) {
		h, a := oneJob(t)
		h.accept(h.offerTo("n1"))
		h.announce("n1", "op1", 2, func(an *Announced) { an.Incarnation = 2 })
		if a.State != StateQueued || a.LeaseLosses != 1 || !strings.Contains(a.Detail, "restarted") {
			t.Fatalf("a new process of the node left %s (%q)", a.State, a.Detail)
		}
	})
	t.Run("never past the limit", func(t *testing.T) {
		h, a := oneJob(t)
		h.accept(h.offerTo("n1"))
		limit := a.LeaseLimit
		for h.now.Before(limit.Add(time.Minute)) {
			h.advance(h.s.Config().LeaseTTL / 2)
			h.announce("n1", "op1", 2)
			r := h.step(Renewal{Attempt: a.ID, Node: "n1"}).Reply.(RenewalReply)
			if r.OK && r.Deadline.After(limit) {
				t.Fatalf("renewed to %v, past the limit %v", r.Deadline, limit)
			}
			h.tick()
		}
		if a.State != StateQueued || a.LeaseLosses != 1 {
			t.Fatalf("a lease renewed forever: %s", a.State)
		}
	})
	t.Run("gave up", func(t *testing.T) {
		h, a := oneJob(t, func(c *Config) { c.MaxLeaseLosses = 1 })
		h.accept(h.offerTo("n1"))
		h.advance(time.Hour)
		h.tick()
		if a.State != StateFailed || !strings.Contains(a.Detail, "lost leases") {
			t.Fatalf("%s %q", a.State, a.Detail)
		}
	})
}

func TestStepReports(t *testing.T) {
	t.Run("counted", func(t *testing.T) {
		h, a := oneJob(t)
		h.accept(h.offerTo("n1"))
		ev := ReportArrived{Attempt: a.ID, Node: "n1", Digest: "d1", Outcome: "ok", Evidence: h.evidence(a.ID),
			Envelope: []byte("env")}
		fx := h.step(ev)
		if _, ok := fx.Reply.(ReportCounts); !ok || len(fx.Records) != 0 || a.State != StateAssigned {
			t.Fatalf("first phase: %#v, %d records, %s", fx.Reply, len(fx.Records), a.State)
		}
		ev.Fetched, ev.Outputs = true, []Output{{Path: "report.json", CID: "bafyout", Size: 10}}
		fx = h.step(ev)
		if _, ok := fx.Reply.(ReportRecorded); !ok {
			t.Fatalf("second phase: %#v", fx.Reply)
		}
		if a.State != StateReported || a.ReportedBy != "n1" || len(a.Outputs) != 1 || h.s.Records["n1"].Completed != 1 {
			t.Fatalf("recorded: %+v", a)
		}
		if string(h.db[ReportKey(a.ID)]) != "env" {
			t.Error("envelope not recorded")
		}
		if len(fx.Scores) != 1 || fx.Scores[0].Attempt != a.ID || fx.Scores[0].After != 0 {
			t.Fatalf("scores %+v", fx.Scores)
		}
		if _, ok := h.s.Leases.Get(a.ID); ok {
			t.Error("lease kept after the report")
		}
		h.score(a.ID, true)
		if a.State != StateDone || a.Score == nil || a.Score.Value != 1 {
			t.Fatalf("scored: %s %+v", a.State, a.Score)
		}
		if d := h.s.Book.Attempts[a.Unit].Decision.State; d != crosscheck.Validated {
			t.Fatalf("unit %s", d)
		}
	})

	refused := func(reply any, want string) error {
		r, ok := reply.(ReportRefused)
		if !ok || !strings.Contains(r.Reason, want) {
			return errors.New("got " + strings.TrimSpace(jsonOf(reply)) + ", want a refusal with " + want)
		}
		return nil
	}
	t.Run("refused, duplicate", func(t *testing.T) {
		h, a := oneJob(t)
		h.accept(h.offerTo("n1"))
		if err := refused(h.report("at-nope", "n1", "d"), "no attempt"); err != nil {
			t.Error(err)
		}
		if err := refused(h.report(a.ID, "n9", "d"), "assigned to node n1"); err != nil {
			t.Error(err)
		}
		fx := h.step(ReportArrived{Attempt: a.ID, Node: "n1", Digest: "d0", Invalid: "usage.cpu_seconds is NaN"})
		if err := refused(fx.Reply, "usage.cpu_seconds"); err != nil || len(fx.Records) != 0 || a.State != StateAssigned {
			t.Errorf("invalid report: %v, %d records, %s", err, len(fx.Records), a.State)
		}
		if _, ok := h.report(a.ID, "n1", "d1").(ReportRecorded); !ok {
			t.Fatal("not recorded")
		}
		for _, st := range []func(){func() {}, func() { h.score(a.ID, true) }} {
			st()
			fx := h.step(ReportArrived{Attempt: a.ID, Node: "n1", Digest: "d1", Outcome: "ok", Envelope: []byte("x")})
			if _, ok := fx.Reply.(ReportDuplicate); !ok || len(fx.Records) != 0 {
				t.Fatalf("same report again (%s): %#v with %d records", a.State, fx.Reply, len(fx.Records))
			}
		}
		if err := refused(h.report(a.ID, "n1", "d2"), "already has a report"); err != nil {
			t.Error(err)
		}
		if a.ReportDigest != "d1" || len(a.LateReports) != 0 {
			t.Fatalf("a second report of the same node changed the record: %+v", a)
		}
	})
	t.Run("late, after another counted", func(t *testing.T) {
		h, a := oneJob(t)
		h.announce("n2", "op2", 2)
		o := h.firstOffer()
		h.accept(o)
		first := o.Node
		h.advance(h.s.Config().LeaseTTL + time.Second)
		h.announce("n1", "op1", 2)
		h.announce("n2", "op2", 2)
		h.tick() // lease lost; requeued and placed on the other node
		second := a.Node
		if a.State != StateAssigned || second == first {
			t.Fatalf("after the loss: %s on %q", a.State, second)
		}
		h.accept(Offer{Attempt: a.ID, Node: second})
		if _, ok := h.report(a.ID, second, "d2").(ReportRecorded); !ok {
			t.Fatal("the current assignee's report did not count")
		}
		fx := h.step(ReportArrived{Attempt: a.ID, Node: first, Digest: "d1", Outcome: "ok", Envelope: []byte("late")})
		if r, ok := fx.Reply.(ReportKept); !ok || !r.Late {
			t.Fatalf("late report: %#v", fx.Reply)
		}
		if len(a.LateReports) != 1 || string(h.db[LateReportKey(a.ID, "d1")]) != "late" || h.s.Records[first].LateReports != 1 {
			t.Fatalf("late report not kept apart: %+v", a.LateReports)
		}
		if a.ReportedBy != second || a.ReportDigest != "d2" {
			t.Fatal("a late report changed what counts")
		}
		fx = h.step(ReportArrived{Attempt: a.ID, Node: first, Digest: "d1", Outcome: "ok", Envelope: []byte("late")})
		if _, ok := fx.Reply.(ReportKept); !ok || len(fx.Records) != 0 {
			t.Fatalf("the same late report again: %#v, %d records", fx.Reply, len(fx.Records))
		}
	})
	t.Run("late, first to arrive", func(t *testing.T) {
		h, a := oneJob(t)
		h.announce("n2", "op2", 2)
		h.tick()
		first := a.Node
		h.accept(Offer{Attempt: a.ID, Node: first})
		h.advance(h.s.Config().LeaseTTL + time.Second)
		h.announce("n1", "op1", 2)
		h.announce("n2", "op2", 2)
		h.tick()
		second := a.Node
		h.accept(Offer{Attempt: a.ID, Node: second})
		// The past assignee finished after all, before the new one: its
		// report counts and the job is taken back from the new one.
		if _, ok := h.report(a.ID, first, "d1").(ReportRecorded); !ok {
			t.Fatal("a past assignee's report, first to arrive, did not count")
		}
		if _, ok := h.s.Leases.Get(a.ID); ok || a.ReportedBy != first {
			t.Fatal("the new assignee kept its lease")
		}
		if r, ok := h.report(a.ID, second, "d2").(ReportKept); !ok || !r.Late {
			t.Fatal("the new assignee's report was not late")
		}
	})
	t.Run("late bytes bounded", func(t *testing.T) {
		h, a := oneJob(t, func(c *Config) { c.MaxLateBytes = 10 })
		h.announce("n2", "op2", 2)
		h.tick()
		first := a.Node
		h.accept(Offer{Attempt: a.ID, Node: first})
		h.advance(time.Minute)
		h.announce("n1", "op1", 2)
		h.announce("n2", "op2", 2)
		h.tick()
		h.report(a.ID, a.Node, "d2")
		fx := h.step(ReportArrived{Attempt: a.ID, Node: first, Digest: "d1", Outcome: "ok", Envelope: make([]byte, 11)})
		if err := refused(fx.Reply, "bytes of late reports"); err != nil || len(fx.Records) != 0 {
			t.Fatalf("%v (%d records)", err, len(fx.Records))
		}
	})
	t.Run("infrastructure failure", func(t *testing.T) {
		h, a := oneJob(t, func(c *Config) { c.MaxTries = 2 })
		h.announce("n2", "op2", 2)
		for try := 1; try <= 2; try++ {
			h.tick()
			node := a.Node
			h.accept(Offer{Attempt: a.ID, Node: node})
			fx := h.step(ReportArrived{Attempt: a.ID, Node: node, Digest: "d", Outcome: "infra_error", Detail: "disk gone"})
			if _, ok := fx.Reply.(ReportKept); !ok || len(fx.Scores) != 0 {
				t.Fatalf("infra report: %#v, scores %v", fx.Reply, fx.Scores)
			}
			if a.InfraFailures != try || !slices.Contains(a.Avoid, node) || h.s.Records[node].InfraErrors != 0 {
				t.Fatalf("try %d: %+v", try, a)
			}
		}
		// Every node failed the job: the job's fault, charged to no node.
		if a.State == StateQueued || a.Score != nil || h.s.Records["n1"].InfraErrors+h.s.Records["n2"].InfraErrors != 0 {
			t.Fatalf("after every node failed it: %s %q, records %+v %+v", a.State, a.Outcome, h.s.Records["n1"], h.s.Records["n2"])
		}
	})
	t.Run("infrastructure failure where another node succeeds", func(t *testing.T) {
		h, a := oneJob(t)
		h.accept(h.offerTo("n1"))
		h.announce("n2", "op2", 2)
		h.step(ReportArrived{Attempt: a.ID, Node: "n1", Digest: "d", Outcome: "infra_error", Detail: "disk gone"})
		allowance := h.s.Records["n1"].Allowance
		h.accept(h.offerTo("n2"))
		if _, ok := h.report(a.ID, "n2", "d2").(ReportRecorded); !ok {
			t.Fatal("n2's report did not count")
		}
		if h.s.Records["n1"].InfraErrors != 1 || h.s.Records["n2"].InfraErrors != 0 || h.s.Records["n1"].Allowance == allowance {
			t.Fatalf("records after another node ran the job: n1 %+v, n2 %+v", h.s.Records["n1"], h.s.Records["n2"])
		}
	})
}

// firstOffer ticks and returns the one offer made.
func (h *harness) firstOffer() Offer {
	h.t.Helper()
	fx := h.tick()
	if len(fx.Offers) != 1 {
		h.t.Fatalf("offers %+v, want one", fx.Offers)
	}
	return fx.Offers[0]
}

func jsonOf(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestStepScorerFailure(t *testing.T) {
	h, a := oneJob(t, func(c *Config) { c.MaxScoreTries = 3 })
	h.accept(h.offerTo("n1"))
	h.report(a.ID, "n1", "d1")
	retry := h.s.Config().ScoreRetry
	for try := 1; try <= 3; try++ {
		fx := h.step(Scored{Attempt: a.ID, Err: "judge unreachable"})
		if a.State != StateReported || a.ScoreTries != try || !strings.Contains(a.Detail, "judge unreachable") {
			t.Fatalf("try %d: %s, tries %d, %q", try, a.State, a.ScoreTries, a.Detail)
		}
		switch {
		case try < 3 && (len(fx.Scores) != 1 || fx.Scores[0].After != retry<<(try-1)):
			t.Fatalf("try %d: retry %+v, want after %v", try, fx.Scores, retry<<(try-1))
		case try == 3 && len(fx.Scores) != 0:
			t.Fatalf("retried past MaxScoreTries: %+v", fx.Scores)
		}
	}
	// Never counted against the agent or the node.
	if w := h.s.Book.Attempts[a.Unit]; len(w.Replicas) != 0 || w.Decision.State != crosscheck.Open {
		t.Fatalf("an unscored report reached the cross-check: %+v", w)
	}
	if p := h.s.Progress(); p.Reported != 1 || p.Failed != 0 || p.Done != 0 {
		t.Fatalf("progress %+v", p)
	}
	if h.s.Records["n1"].Completed != 1 {
		t.Fatal("the node lost credit for a scorer's failure")
	}
	// A restart scores it again; then it is done.
	fx := h.restart()
	a = h.s.Attempts[a.ID]
	if len(fx.Scores) != 1 || fx.Scores[0].Attempt != a.ID || a.ScoreTries != 3 {
		t.Fatalf("restart: scores %+v, tries %d", fx.Scores, a.ScoreTries)
	}
	h.score(a.ID, false)
	if a.State != StateDone || a.Score.Value != 0 || a.Detail != "" {
		t.Fatalf("%s %+v %q", a.State, a.Score, a.Detail)
	}
	// A score for an attempt scored already changes nothing.
	if fx := h.score(a.ID, true); len(fx.Records) != 0 || a.Score.Value != 0 {
		t.Fatal("scored twice")
	}
}

func TestStepRestart(t *testing.T) {
	h := newHarness(t)
	h.announce("n1", "op1", 1)
	h.announce("n2", "op2", 1)
	r := h.evaluate(Evaluation{ID: "ev1", Suite: "two", Agent: "agent", Levels: []string{"easy", "hard"}, Replicas: 1})
	if r.Attempts != 4 {
		t.Fatalf("%d attempts", r.Attempts)
	}
	offers := h.tick().Offers
	if len(offers) != 2 {
		t.Fatalf("offers %+v", offers)
	}
	h.accept(offers[0])
	h.accept(offers[1])
	reported := offers[1].Attempt
	h.report(reported, offers[1].Node, "d")
	assigned := h.s.Attempts[offers[0].Attempt]
	deadline := assigned.LeaseDeadline
	before := h.s.AttemptList(true)
	queue := slices.Clone(h.s.Queue)

	h.advance(10 * time.Second)
	fx := h.restart()
	if got := h.s.AttemptList(true); !reflect.DeepEqual(jsonOf(got), jsonOf(before)) {
		t.Fatalf("attempts after restart differ:\n%s\n%s", jsonOf(got), jsonOf(before))
	}
	if !slices.Equal(h.s.Queue, queue) {
		t.Fatalf("queue %v, want %v", h.s.Queue, queue)
	}
	ls, ok := h.s.Leases.Get(assigned.ID)
	if !ok || ls.Node != offers[0].Node || ls.Deadline.Before(deadline) || ls.Deadline.Before(h.now.Add(h.s.Config().LeaseTTL)) {
		t.Fatalf("lease after restart %+v (was until %v)", ls, deadline)
	}
	if len(fx.Scores) != 1 || fx.Scores[0].Attempt != reported {
		t.Fatalf("the recorded report is not scored again: %+v", fx.Scores)
	}
	// The node keeps its work: its report counts.
	if _, ok := h.report(assigned.ID, offers[0].Node, "d0").(ReportRecorded); !ok {
		t.Fatal("a report for a lease restored did not count")
	}
	// The same evaluation asked again queues nothing more.
	fx = h.step(Evaluate{Evaluation{ID: "ev1", Suite: "two", Agent: "agent", Levels: []string{"easy", "hard"}, Replicas: 1}})
	if r := fx.Reply.(EvaluateReply); r.Err != nil || r.Attempts != 4 || len(fx.Records) != 0 || len(h.s.Attempts) != 4 {
		t.Fatalf("repeated evaluation: %+v, %d records", r, len(fx.Records))
	}
	if fx := h.step(Evaluate{Evaluation{ID: "ev1", Suite: "one", Agent: "agent"}}); fx.Reply.(EvaluateReply).Err == nil {
		t.Fatal("an evaluation ID reused for another suite was accepted")
	}
}

// runAll ticks and runs every offered job to its score until nothing is
// offered, for at most rounds rounds, passing every job.
func (h *harness) runAll(rounds int, outputs func(a *Attempt) []Output) {
	h.t.Helper()
	for range rounds {
		fx := h.tick()
		if len(fx.Offers) == 0 && len(h.s.Queue) == 0 {
			return
		}
		for _, o := range fx.Offers {
			h.accept(o)
			var outs []Output
			if outputs != nil {
				outs = outputs(h.s.Attempts[o.Attempt])
			}
			if _, ok := h.report(o.Attempt, o.Node, "d-"+o.Attempt, outs...).(ReportRecorded); !ok {
				h.t.Fatalf("report of %s not recorded", o.Attempt)
			}
			h.score(o.Attempt, true)
		}
		h.advance(time.Second)
		for n := range h.seq {
			h.announce(n, "op-"+n, 2)
		}
	}
}

func TestStepStages(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"n1", "n2", "n3", "n4"} {
		h.announce(n, "op-"+n, 2)
	}
	h.evaluate(Evaluation{Suite: "piped", Agent: "agent", Levels: []string{"easy"}})
	first := h.only()
	if first.Stage != "rollout" || first.Pipe != first.Unit {
		t.Fatalf("first job: stage %q pipe %q", first.Stage, first.Pipe)
	}
	if e := h.s.Entries(); len(e) != 1 || e[0].Status != bench.Pending {
		t.Fatalf("entries before anything ran: %+v", e)
	}
	// The rollout runs once (Single), whatever the cross-check policy.
	o := h.firstOffer()
	h.accept(o)
	if fx := h.tick(); len(fx.Offers) != 0 {
		t.Fatalf("a single stage was replicated: %+v", fx.Offers)
	}
	h.report(first.ID, o.Node, "d", Output{Path: "submission", CID: "bafysub", Size: 3}, Output{Path: "log", Error: "too big"})
	h.score(first.ID, true)

	p := h.s.Pipelines[first.Unit]
	if p.Current != 1 || p.Outputs["rollout"]["submission"] != "bafysub" || p.Nodes["rollout"] != o.Node {
		t.Fatalf("pipeline after the rollout: %+v", p)
	}
	var next *Attempt
	for _, a := range h.s.Attempts {
		if a.Stage == "reproduce" {
			next = a
		}
	}
	if next == nil || next.Unit != first.Unit+"/reproduce" || !slices.Contains(next.Avoid, o.Node) {
		t.Fatalf("reproduce stage: %+v", next)
	}
	if id, err := h.s.CountedJob(first.Pipe, "rollout"); err != nil || id != first.ID {
		t.Fatalf("counted job of the rollout: %q, %v; want %s", id, err, first.ID)
	}
	for _, stage := range []string{"reproduce", "nosuch"} {
		if id, err := h.s.CountedJob(first.Pipe, stage); err == nil {
			t.Fatalf("counted job of stage %s before it ran: %q", stage, id)
		}
	}
	if w := h.s.Book.Attempts[next.Unit].Work; w.ImageCID != "bafyplain" {
		t.Errorf("the stage's work checks image %q, want its own image's", w.ImageCID)
	}
	j, _ := h.s.JobOf(next.ID)
	if j.Image != "plain" || !reflect.DeepEqual(j.Earlier, map[string]map[string]string{"rollout": {"submission": "bafysub"}}) {
		t.Fatalf("job of the stage: image %q earlier %v", j.Image, j.Earlier)
	}

	// A restart in the middle resumes the pipeline where it was.
	h.restart()
	h.runAll(20, func(a *Attempt) []Output { return []Output{{Path: a.Stage + ".out", CID: "bafy" + a.Stage}} })
	p = h.s.Pipelines[first.Unit]
	if p.Current != 3 || p.Halted != "" {
		t.Fatalf("pipeline at %d (halted %q): %s", p.Current, p.Halted, h.states())
	}
	count := map[string]int{}
	for _, a := range h.s.Attempts {
		count[a.Stage]++
		if a.Stage == "reproduce" && a.Node == o.Node {
			t.Errorf("reproduction ran on the rollout's node %s", o.Node)
		}
	}
	if count["rollout"] != 1 || count["reproduce"] < 2 || count["judge"] < 2 {
		t.Fatalf("jobs per stage %v: the rollout once, the others replicated", count)
	}
	j, _ = h.s.JobOf(h.s.canonical(first.Unit + "/judge").ID)
	if j.Image != "judger" || j.Earlier["reproduce"]["reproduce.out"] != "bafyreproduce" {
		t.Fatalf("judge job: %+v", j)
	}
	e := h.s.Entries()
	if len(e) != 1 || e[0].Status != bench.Validated || string(e[0].Score) != `{"pass":true}` || e[0].CPUSeconds < 3 {
		t.Fatalf("entry of the finished pipeline: %+v", e)
	}
}

func TestStepStageHalts(t *testing.T) {
	h := newHarness(t, func(c *Config) {
		c.CrossCheck = crosscheck.DefaultPolicy()
		c.CrossCheck.MaxDropped = 1
		c.MaxTries = 1
	})
	h.announce("n1", "op1", 2)
	h.evaluate(Evaluation{Suite: "piped", Agent: "agent", Levels: []string{"easy"}})
	a := h.only()
	o := h.offerTo("n1")
	h.accept(o)
	h.step(ReportArrived{Attempt: a.ID, Node: "n1", Digest: "d", Outcome: "infra_error"})
	p := h.s.Pipelines[a.Unit]
	if p.Halted != "rollout" || a.State != StateFailed {
		t.Fatalf("pipeline %+v, attempt %s", p, a.State)
	}
	if e := h.s.Entries(); len(e) != 1 || e[0].Status != bench.InfraFailed || e[0].Score != nil {
		t.Fatalf("entries %+v", e)
	}
	if len(h.s.Attempts) != 1 {
		t.Fatalf("a halted pipeline queued more: %s", h.states())
	}
}

func TestStepResources(t *testing.T) {
	h := newHarness(t)
	h.announce("cpu", "op1", 2)
	h.evaluate(Evaluation{Suite: "gpu", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
	a := h.only()
	if a.GPUs.Count != 1 {
		t.Fatalf("GPU need %+v", a.GPUs)
	}
	if fx := h.tick(); len(fx.Offers) != 0 {
		t.Fatalf("a GPU job offered to a node without GPUs: %+v", fx.Offers)
	}
	h.announce("gpu", "op2", 1, func(an *Announced) {
		an.GPUs, an.FreeGPUs = []schedule.GPU{{Model: "A100", MemoryBytes: 40 << 30}}, 1
	})
	if o := h.offerTo("gpu"); o.Attempt != a.ID {
		t.Fatal(o)
	}
	// Its GPU is held: a second GPU job waits.
	h.evaluate(Evaluation{Suite: "gpu", Agent: "agent", Levels: []string{"hard"}, Replicas: 1})
	if fx := h.tick(); len(fx.Offers) != 0 {
		t.Fatalf("a held GPU offered again: %+v", fx.Offers)
	}
}

func TestStepEvaluateRefusals(t *testing.T) {
	cases := map[string]Evaluation{
		"no suite":          {Suite: "nope", Agent: "agent"},
		"no agent":          {Suite: "one", Agent: "nope"},
		"no such level":     {Suite: "one", Agent: "agent", Levels: []string{"medium"}},
		"level twice":       {Suite: "one", Agent: "agent", Levels: []string{"easy", "easy"}},
		"too many replicas": {Suite: "one", Agent: "agent", Replicas: MaxReplicas + 1},
		"bad ID":            {ID: "a/b", Suite: "one", Agent: "agent"},
		"a judge's account": {ID: "ev-1.judge", Suite: "one", Agent: "agent"},
		"too many attempts": {Suite: "one", Agent: "agent", Runs: MaxEvaluationAttempts + 1},
		"group too long":    {Suite: "one", Agent: "agent", Group: strings.Repeat("g", proto.MaxFilterLen+1)},
	}
	for name, e := range cases {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t)
			fx := h.step(Evaluate{e})
			r := fx.Reply.(EvaluateReply)
			if !errors.Is(r.Err, ErrBadRequest) || len(fx.Records) != 0 || len(h.s.Attempts) != 0 {
				t.Fatalf("%v (%d records)", r.Err, len(fx.Records))
			}
		})
	}
}

// TestStepDeterministic runs one script twice: the same events at the
// same times give the same effects, byte for byte, canaries and random
// replica IDs included.
func TestStepDeterministic(t *testing.T) {
	run := func() []string {
		h := newHarness(t, func(c *Config) { c.IdleCanaryEvery, c.UnschedulableAfter = time.Minute, 2*time.Minute })
		var log []string
		note := func(fx Effects) {
			b, err := json.Marshal(fx)
			if err != nil {
				t.Fatal(err)
			}
			log = append(log, string(b))
		}
		for _, n := range []string{"n1", "n2", "n3"} {
			note(h.announce(n, "op-"+n, 2))
		}
		note(h.step(Evaluate{Evaluation{Suite: "two", Agent: "det", Runs: 2}}))
		// No node has a GPU: this one ends unschedulable.
		note(h.step(Evaluate{Evaluation{Suite: "gpu", Agent: "det", Levels: []string{"easy"}}}))
		for range 30 {
			fx := h.tick()
			note(fx)
			for _, o := range fx.Offers {
				note(h.accept(o))
				note(h.step(ReportArrived{Attempt: o.Attempt, Node: o.Node, Digest: "d" + o.Attempt, Outcome: "ok",
					Evidence: h.evidence(o.Attempt), Envelope: []byte("e"), Fetched: true}))
				note(h.score(o.Attempt, true))
			}
			h.advance(20 * time.Second)
			for _, n := range []string{"n1", "n2", "n3"} {
				note(h.announce(n, "op-"+n, 2))
			}
		}
		if p := h.s.Progress(); p.Decided != p.Units || p.Failed != 1 {
			t.Fatalf("script did not finish: %+v", p)
		}
		return log
	}
	a, b := run(), run()
	if len(a) != len(b) {
		t.Fatalf("%d and %d steps", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("step %d differs:\n%s\n%s", i, a[i], b[i])
		}
	}
}
