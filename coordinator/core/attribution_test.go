package core

import (
	"strings"
	"testing"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/verify"
)

// unboundOn runs a model-driven attempt on n1 (operator op1) and scores it
// with unbound answers: what an agent that writes its answer from its own
// code does on an honest node (issue 24.1).
func unboundOn(t *testing.T, h *harness) *Attempt {
	t.Helper()
	h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
	var a *Attempt
	for _, id := range h.s.Queue {
		if x := h.s.Attempts[id]; x.State == StateQueued && x.Kind != KindReplay {
			a = x
		}
	}
	if _, ok := h.runOn(a.ID, "n1").(ReportRecorded); !ok {
		t.Fatalf("report of %s not recorded", a.ID)
	}
	h.step(Scored{Attempt: a.ID, Scorer: "test@1", Score: bench.Score{Comparable: bench.Comparable{Grading: &bench.Grading{Pass: true}}},
		Unbound: "answers report.json#q are found in no model output or tool result"})
	return a
}

// TestStepUnboundAttribution: an unbound result is the agent's: it never
// marks the node at scoring; replays on other operators decide, and only
// two bound replays from distinct operators charge the node.
func TestStepUnboundAttribution(t *testing.T) {
	for _, tc := range []struct {
		name string
		// replays' own binding: "" bound, else why not.
		replays     []string
		verdict     verify.Verdict
		state       string
		quarantined bool
	}{
		{"the replay is unbound too: the agent's", []string{"answers report.json#q are found in no model output"}, verify.Verified, VerifyUnbound, false},
		{"one replay binds, the second does not: the agent's", []string{"", "answers report.json#q unbound"}, verify.Verified, VerifyUnbound, false},
		{"two replays bind where the recording does not: the node's", []string{"", ""}, verify.Verified, string(verify.Forged), true},
		{"two replays bind and differ alike from the recording: the node's", []string{"", ""}, verify.Forged, string(verify.Forged), true},
		{"two replays bind but diverge from each other: the agent's", []string{"", ""}, verify.Nondeterministic, VerifyUnbound, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			for _, n := range []string{"n1", "n2", "n3"} {
				h.announce(n, "op-"+n, 1)
			}
			a := unboundOn(t, h)
			if rec := h.s.Records["n1"].Verify; rec.Marks() != 0 || h.s.quarantined("n1") {
				t.Fatalf("an unbound result marked its node at scoring: %+v", rec)
			}
			if es := h.s.Entries(); len(es) != 1 || es[0].Status != bench.Validated || es[0].Verification != VerifyUnbound {
				t.Fatalf("the board's entry %+v, want the run validated (the node did its job) and shown unbound", es)
			}
			var ids []string
			for i, why := range tc.replays {
				r := h.queuedReplay(a.ID)
				node := []string{"n2", "n3"}[i]
				h.runOn(r.ID, node)
				ids = append(ids, r.ID)
				h.step(Judged{Attempt: a.ID, Replays: ids, Unbound: tc.replays[:i+1], Judgement: verify.Judgement{Verdict: tc.verdict}})
				_ = why
			}
			for _, x := range h.s.Queue {
				if h.s.Attempts[x].Kind == KindReplay {
					t.Fatalf("a replay is still queued after the last verdict: %s", h.states())
				}
			}
			v := a.Verification
			if v.State != tc.state || v.Attributing || len(v.Replays) != len(tc.replays) {
				t.Fatalf("verification %+v, want %s after %d replays", v, tc.state, len(tc.replays))
			}
			if q := h.s.quarantined("n1"); q != tc.quarantined {
				t.Fatalf("n1 quarantined %v, want %v (%+v)", q, tc.quarantined, h.s.Records["n1"].Verify)
			}
			for _, n := range []string{"n2", "n3"} {
				if h.s.quarantined(n) || h.s.Records[n].Verify.Marks() != 0 {
					t.Fatalf("replayer %s marked", n)
				}
			}
		})
	}
}

// TestStepUnboundNeverQuarantines: the attack of issue 24.1 (an agent
// writing {"q": 1} on every run) on honest nodes: no node is marked or
// quarantined, whatever the number of runs.
func TestStepUnboundNeverQuarantines(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"n1", "n2"} {
		h.announce(n, "op-"+n, 1)
	}
	for i := range 5 {
		a := unboundOn(t, h)
		r := h.queuedReplay(a.ID)
		h.runOn(r.ID, "n2")
		h.step(Judged{Attempt: a.ID, Replays: []string{r.ID}, Unbound: []string{"answers report.json#q unbound"}})
		if a.Verification.State != VerifyUnbound || a.Verification.Attributing {
			t.Fatalf("run %d: verification %+v", i, a.Verification)
		}
	}
	for _, n := range []string{"n1", "n2"} {
		if h.s.quarantined(n) || h.s.Records[n].Verify.Marks() != 0 || h.s.Book.Node(n, "op-"+n).Invalid != 0 {
			t.Fatalf("honest node %s charged for the agent's unbound answers: %+v", n, h.s.Records[n])
		}
	}
}

// TestStepForeignHeadMarksNode: a report signing a chain head the gateway
// never gave is evidence only the node can produce: an invalid replica and
// a mark, no replay.
func TestStepForeignHeadMarksNode(t *testing.T) {
	h := newHarness(t)
	h.announce("n1", "op1", 1)
	h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
	a := h.only()
	h.runOn(a.ID, "n1")
	h.step(Scored{Attempt: a.ID, Scorer: "test@1", Score: bench.Score{Comparable: bench.Comparable{Grading: &bench.Grading{Pass: true}}},
		NodeEvidence: "the report signs chain head 00, which the gateway never gave attempt " + a.ID})
	if a.Verification == nil || a.Verification.State != VerifyUnbound || h.s.Records["n1"].Verify.Unbound != 1 {
		t.Fatalf("verification %+v, record %+v", a.Verification, h.s.Records["n1"].Verify)
	}
	if a.Evidence == nil || a.Evidence.Unbound == "" {
		t.Fatalf("the cross-check was not given the evidence: %+v", a.Evidence)
	}
	for _, x := range h.s.Attempts {
		if x.Kind == KindReplay {
			t.Fatal("a replay was queued for evidence against the node")
		}
	}
}

// TestStepRunWithoutCallsReplayed: a run of a model-driven agent that
// made no model call is replicated by a replay, not exempt (issue 25.1).
func TestStepRunWithoutCallsReplayed(t *testing.T) {
	h := newHarness(t)
	h.cat.agents["llm"] = AgentInfo{CID: "bafyllm", Model: "m"}
	h.announce("n1", "op1", 1)
	h.announce("n2", "op2", 1)
	h.evaluate(Evaluation{Suite: "one", Agent: "llm", Levels: []string{"easy"}, Runs: 1})
	a := h.only()
	h.accept(h.offerTo("n1"))
	h.report(a.ID, "n1", "d") // no model use
	h.score(a.ID, true)
	if a.Verification == nil || a.Verification.State != VerifyPending {
		t.Fatalf("a model-driven run without calls: verification %+v, want a replay pending", a.Verification)
	}
	r := h.queuedReplay(a.ID)
	if r.Avoid[0] != "n1" {
		t.Fatalf("its replay avoids %v", r.Avoid)
	}
}

// TestStepReplayersVerified: a Forged verdict needs two replays from
// distinct admitted operators, neither the recorder's; a replay outvoted
// by two others marks its replayer (never quarantining it alone).
func TestStepReplayersVerified(t *testing.T) {
	h, a, r := replayed(t)
	for _, n := range []string{"n2", "n3", "n4"} {
		h.announce(n, "op-"+n, 1)
	}
	var ids []string
	for i, node := range []string{"n2", "n3", "n4"} {
		h.runOn(r.ID, node)
		ids = append(ids, r.ID)
		j := verify.Judgement{Verdict: verify.NeedsReplay}
		if i == 2 {
			j = verify.Judgement{Verdict: verify.Verified, Outvoted: []int{0}, Reason: "replay 0 outvoted"}
		}
		h.step(Judged{Attempt: a.ID, Replays: ids, Judgement: j})
		if i < 2 {
			r = h.queuedReplay(a.ID)
		}
	}
	if a.Verification.State != string(verify.Verified) || len(a.Verification.Replays) != 3 {
		t.Fatalf("verification %+v, want verified after three replays", a.Verification)
	}
	if rec := h.s.Records["n2"].Verify; rec.Outvoted != 1 || h.s.quarantined("n2") {
		t.Fatalf("the outvoted replayer's record %+v", rec)
	}
	if rec := h.s.Records["n3"].Verify; rec.Outvoted != 0 {
		t.Fatalf("an agreeing replayer marked: %+v", rec)
	}

	// Independence, by hand: replays of the recorder's operator, or of
	// unadmitted nodes when operators must be admitted, do not count.
	rec := &Attempt{ID: "a", Operator: "op1"}
	for _, tc := range []struct {
		ops  []string
		open bool
		ok   bool
	}{
		{[]string{"op2", "op3"}, true, true},
		{[]string{"op2", "op2"}, true, false},
		{[]string{"op1", "op2"}, true, false},
		{[]string{UnadmittedOperator, "op2"}, false, false},
		{[]string{UnadmittedOperator, "op2"}, true, true},
	} {
		var reps []*Attempt
		for _, op := range tc.ops {
			reps = append(reps, &Attempt{Operator: op})
		}
		h.s.cfg.OpenOperators = tc.open
		if why := h.s.independent(rec, reps); (why == "") != tc.ok {
			t.Errorf("operators %v (open %v): %q, want independent %v", tc.ops, tc.open, why, tc.ok)
		} else if !tc.ok && !strings.Contains(why, "distinct admitted operators") {
			t.Errorf("reason %q", why)
		}
	}
}

// TestStepAttributionRestart: an unbound result whose replays are still
// deciding whom it charges survives a restart, and is judged again.
func TestStepAttributionRestart(t *testing.T) {
	h := newHarness(t)
	for _, n := range []string{"n1", "n2", "n3"} {
		h.announce(n, "op-"+n, 1)
	}
	a := unboundOn(t, h)
	r := h.queuedReplay(a.ID)
	h.runOn(r.ID, "n2")
	fx := h.restart()
	if len(fx.Judges) != 1 || fx.Judges[0].Attempt != a.ID {
		t.Fatalf("after restart: judges %+v, want the reported replay judged again", fx.Judges)
	}
	if v := h.s.Attempts[a.ID].Verification; v == nil || v.State != VerifyUnbound || !v.Attributing {
		t.Fatalf("restored verification %+v", v)
	}
	h.step(Judged{Attempt: a.ID, Replays: []string{r.ID}, Unbound: []string{"answers unbound"}})
	h.restart()
	if v := h.s.Attempts[a.ID].Verification; v.State != VerifyUnbound || v.Attributing || h.s.Records["n1"].Verify.Marks() != 0 {
		t.Fatalf("after the verdict and a restart: %+v, n1 %+v", v, h.s.Records["n1"].Verify)
	}
}
