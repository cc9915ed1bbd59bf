package core

import (
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/verify"
)

// reportModel sends node's report of a model-driven attempt id (it made
// calls through the gateway), through both phases, and returns the last
// reply. A replay's evidence is its recorded attempt's.
func (h *harness) reportModel(id, node string) any {
	h.t.Helper()
	ev := id
	if a := h.s.Attempts[id]; a != nil && a.ReplayOf != "" {
		ev = a.ReplayOf
	}
	e := ReportArrived{Attempt: id, Node: node, Digest: "d-" + id, Outcome: "ok", Usage: Usage{CPUSeconds: 1, WallMillis: 2000},
		Evidence: h.evidence(ev), Envelope: []byte("envelope " + id), Model: &ModelUse{Calls: 3, CostUSD: 0.01}}
	fx := h.step(e)
	if _, ok := fx.Reply.(ReportCounts); !ok {
		return fx.Reply
	}
	e.Fetched = true
	return h.step(e).Reply
}

// runOn places queued attempt id on node by hand, has it accepted and
// reported (model-driven) and returns the report's effects' reply.
func (h *harness) runOn(id, node string) any {
	h.t.Helper()
	if err, _ := h.step(Place{Attempt: id, Node: node}).Reply.(error); err != nil {
		h.t.Fatalf("place %s on %s: %v", id, node, err)
	}
	h.accept(Offer{Attempt: id, Node: node})
	return h.reportModel(id, node)
}

// replayOf returns the one queued replay of attempt id (failing otherwise).
func (h *harness) queuedReplay(id string) *Attempt {
	h.t.Helper()
	var out []*Attempt
	for _, q := range h.s.Queue {
		if a := h.s.Attempts[q]; a.Kind == KindReplay && a.ReplayOf == id {
			out = append(out, a)
		}
	}
	if len(out) != 1 {
		h.t.Fatalf("%d queued replays of %s, want 1: %s", len(out), id, h.states())
	}
	return out[0]
}

// offersOf are the offers of a tick that place attempt id.
func offersOf(fx Effects, id string) []Offer {
	var out []Offer
	for _, o := range fx.Offers {
		if o.Attempt == id {
			out = append(out, o)
		}
	}
	return out
}

// replayed sets up a model-driven attempt recorded on n1 (operator op1),
// scored and bound, with n1b of the same operator in view: it returns the
// harness, the attempt and its replay (queued).
func replayed(t *testing.T, mod ...func(*Config)) (*harness, *Attempt, *Attempt) {
	t.Helper()
	h := newHarness(t, mod...)
	h.announce("n1", "op1", 2)
	h.announce("n1b", "op1", 2)
	h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1})
	a := h.only()
	if _, ok := h.runOn(a.ID, "n1").(ReportRecorded); !ok {
		t.Fatalf("report of %s not recorded", a.ID)
	}
	fx := h.score(a.ID, true)
	if a.Verification == nil || a.Verification.State != VerifyPending {
		t.Fatalf("a new node's model-driven result is not drawn for a replay: %+v", a.Verification)
	}
	r := h.queuedReplay(a.ID)
	if !hasRecord(fx, AttemptKey(r.ID)) || !hasRecord(fx, AttemptKey(a.ID)) {
		t.Fatalf("the replay is not made durable with the draw: %+v", fx.Records)
	}
	if r.Suite != a.Suite || r.TaskID != a.TaskID || r.Agent != a.Agent || r.Level != a.Level || r.Eval != a.Eval ||
		r.Unit != "" || r.Canary || !strings.HasPrefix(r.ID, "at-") || len(r.ID) != len(a.ID) {
		t.Fatalf("replay %+v is not the same job as %+v under an ordinary ID", r, a)
	}
	return h, a, r
}

func TestStepReplayPlacedApart(t *testing.T) {
	h, a, r := replayed(t)
	// n1 recorded it and n1b is of the same operator: neither may replay it.
	for range 3 {
		if o := offersOf(h.tick(), r.ID); len(o) > 0 {
			t.Fatalf("replay offered to %s, which shares the recorder's node or operator", o[0].Node)
		}
		h.advance(time.Second)
		h.announce("n1", "op1", 2)
		h.announce("n1b", "op1", 2)
	}
	h.announce("n2", "op2", 1)
	o := offersOf(h.tick(), r.ID)
	if len(o) != 1 || o[0].Node != "n2" {
		t.Fatalf("replay offers %+v, want one to n2", o)
	}
	h.accept(o[0])
	g, ok := h.s.GrantOf(r.ID, LeaseID(r), h.now)
	if !ok || g.Replay != a.ID || g.Node != "n2" {
		t.Fatalf("the replay's grant %+v does not name the recorded attempt %s", g, a.ID)
	}
	if g, ok := h.s.GrantOf(a.ID, LeaseID(a), h.now); ok {
		t.Fatalf("a done attempt still has a grant: %+v", g)
	}
	fx := h.step(ReportArrived{Attempt: r.ID, Node: "n2", Digest: "dr", Outcome: "ok", Evidence: h.evidence(a.ID),
		Envelope: []byte("e"), Model: &ModelUse{Calls: 3}})
	if _, ok := fx.Reply.(ReportCounts); !ok {
		t.Fatalf("replay report: %#v", fx.Reply)
	}
	fx = h.step(ReportArrived{Attempt: r.ID, Node: "n2", Digest: "dr", Outcome: "ok", Evidence: h.evidence(a.ID),
		Envelope: []byte("e"), Model: &ModelUse{Calls: 3}, Fetched: true})
	if _, ok := fx.Reply.(ReportRecorded); !ok || len(fx.Scores) != 0 || len(fx.Judges) != 1 || fx.Judges[0].Attempt != a.ID {
		t.Fatalf("replay report: reply %#v, scores %+v, judges %+v: want it judged, not scored", fx.Reply, fx.Scores, fx.Judges)
	}
	if r.State != StateReported || a.Verification.State != VerifyPending {
		t.Fatalf("after the replay's report: replay %s, verification %+v", r.State, a.Verification)
	}
	// Replays are no replicas: the board has one entry, from n1's run.
	if es := h.s.Entries(); len(es) != 1 || es[0].Status != bench.Validated {
		t.Fatalf("entries %+v", es)
	}
}

func TestStepReplayVerdicts(t *testing.T) {
	forged := verify.Judgement{Verdict: verify.Forged, Reason: "two replays agree, the recorded result differs"}
	for _, tc := range []struct {
		name string
		// verdicts are the judgements of the first and (when asked) second
		// replay.
		verdicts    []verify.Judgement
		state       string
		quarantined bool
		record      verify.Record
	}{
		{"verified", []verify.Judgement{{Verdict: verify.Verified, Benign: 2}}, "verified", false,
			verify.Record{Node: "n1", CleanRun: 1, Replayed: 1, Verified: 1, Benign: 2}},
		{"benign differences then nondeterministic", []verify.Judgement{{Verdict: verify.NeedsReplay},
			{Verdict: verify.Nondeterministic, Benign: 3}}, "nondeterministic", false,
			verify.Record{Node: "n1", Replayed: 1, Nondeterministic: 1, Benign: 3}},
		{"forged", []verify.Judgement{{Verdict: verify.NeedsReplay}, forged}, "forged", true,
			verify.Record{Node: "n1", Replayed: 1, Forged: 1, Quarantined: "forged a tool result: " + forged.Reason}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h, a, r := replayed(t)
			h.announce("n2", "op2", 1)
			h.announce("n3", "op3", 1)
			before := h.s.Entries()
			var replays []string
			for i, j := range tc.verdicts {
				node := []string{"n2", "n3"}[i]
				if _, ok := h.runOn(r.ID, node).(ReportRecorded); !ok {
					t.Fatalf("replay %d not recorded", i+1)
				}
				replays = append(replays, r.ID)
				fx := h.step(Judged{Attempt: a.ID, Replays: replays, Judgement: j})
				if j.Verdict != verify.NeedsReplay {
					break
				}
				r = h.queuedReplay(a.ID)
				if !slices.Contains(r.Avoid, "n1") || !slices.Contains(r.Avoid, "n2") || !hasRecord(fx, AttemptKey(r.ID)) {
					t.Fatalf("second replay %+v does not avoid the recorder and the first replayer", r)
				}
				if a.Verification.State != VerifyPending {
					t.Fatalf("a second replay is queued but the attempt is %s", a.Verification.State)
				}
			}
			if a.Verification.State != tc.state || len(a.Verification.Replays) != len(tc.verdicts) {
				t.Fatalf("verification %+v, want %s after %d replays", a.Verification, tc.state, len(tc.verdicts))
			}
			for _, id := range a.Verification.Replays {
				if h.s.Attempts[id].State != StateDone {
					t.Fatalf("replay %s is %s after the verdict", id, h.s.Attempts[id].State)
				}
			}
			if got := h.s.Records["n1"].Verify; got != tc.record {
				t.Fatalf("n1's replay record %+v, want %+v", got, tc.record)
			}
			if q := h.s.quarantined("n1"); q != tc.quarantined {
				t.Fatalf("n1 quarantined: %v, want %v", q, tc.quarantined)
			}
			for _, n := range []string{"n2", "n3"} {
				if h.s.quarantined(n) {
					t.Fatalf("replaying node %s quarantined", n)
				}
			}
			es := h.s.Entries()
			if tc.quarantined {
				// Its result is discarded: the board shows no score for the
				// run, and the run is queued again elsewhere.
				if len(es) != 1 || es[0].Status == bench.Validated || es[0].Score != nil {
					t.Fatalf("the forged result stays on the board: %+v", es)
				}
				var again bool
				for _, id := range h.s.Queue {
					again = again || h.s.Attempts[id].Unit == a.Unit
				}
				if !again {
					t.Fatalf("the discarded run is not queued again: %s", h.states())
				}
			} else if len(es) != 1 || len(before) != 1 || es[0].Status != before[0].Status || es[0].Score == nil {
				t.Fatalf("the board changed for an honest node: %+v, was %+v", es, before)
			}
			// A second judgement of the same replays changes nothing.
			if fx := h.step(Judged{Attempt: a.ID, Replays: replays, Judgement: forged}); len(fx.Records) != 0 {
				t.Fatalf("a repeated judgement wrote %+v", fx.Records)
			}
		})
	}
}

func TestStepReplayNotDrawn(t *testing.T) {
	for _, tc := range []struct {
		name    string
		agent   string
		unbound string
		rewrite bool
		model   bool
		state   string
	}{
		{"no model calls", "agent", "", false, false, ""},
		{"not replayable", "noreplay", "", false, true, VerifyNotReplayable},
		{"unbound", "agent", "answers x are found in no model output", false, true, VerifyUnbound},
		{"rewritten", "agent", "request 1 shows the model 3 messages that extend no earlier request", true, true, VerifyUnbound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.cat.agents["noreplay"] = AgentInfo{CID: "bafynr", NotReplayable: true}
			h.announce("n1", "op1", 1)
			h.evaluate(Evaluation{Suite: "one", Agent: tc.agent, Levels: []string{"easy"}, Replicas: 1})
			a := h.only()
			if tc.model {
				h.runOn(a.ID, "n1")
			} else {
				h.accept(h.offerTo("n1"))
				h.report(a.ID, "n1", "d")
			}
			h.step(Scored{Attempt: a.ID, Scorer: "test@1", Score: bench.Score{Comparable: bench.Comparable{Grading: &bench.Grading{Pass: true}}},
				Unbound: tc.unbound, Rewritten: tc.rewrite})
			for _, x := range h.s.Attempts {
				if x.Kind == KindReplay {
					t.Fatalf("a replay was queued: %s", h.states())
				}
			}
			if got := ""; a.Verification != nil {
				got = a.Verification.State
				if got != tc.state {
					t.Fatalf("verification %+v, want %s", a.Verification, tc.state)
				}
			} else if tc.state != "" {
				t.Fatalf("no verification, want %s", tc.state)
			}
			if rec := h.s.Records["n1"].Verify; (rec.Unbound == 1) != (tc.unbound != "" && !tc.rewrite) ||
				(rec.Rewrites == 1) != tc.rewrite || rec.Replayed != 0 {
				t.Fatalf("n1's replay record %+v", rec)
			}
		})
	}
}

// TestStepReplayRate: the node's replay rate falls with each clean replay
// (1, 1/2, 1/3... down to the floor): over many attempts of a node whose
// replays all verify, the replays drawn follow it, deterministically.
func TestStepReplayRate(t *testing.T) {
	run := func() (int, []string) {
		h := newHarness(t)
		h.announce("n1", "op1", 4)
		h.announce("n2", "op2", 4)
		h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Runs: 40, Replicas: 1})
		var order []string
		replays := 0
		for _, id := range slices.Clone(h.s.Queue) {
			a := h.s.Attempts[id]
			h.runOn(id, "n1")
			h.score(id, true)
			order = append(order, a.Verification.State)
			if a.Verification.State != VerifyPending {
				continue
			}
			replays++
			r := h.queuedReplay(id)
			h.runOn(r.ID, "n2")
			h.step(Judged{Attempt: id, Replays: []string{r.ID}, Judgement: verify.Judgement{Verdict: verify.Verified}})
		}
		if got := h.s.Records["n1"].Verify; got.Replayed != replays || got.CleanRun != replays {
			t.Fatalf("record %+v after %d replays", got, replays)
		}
		return replays, order
	}
	n, order := run()
	// Expected: sum of 1/(1+k) draws; with 40 attempts far fewer than 40
	// and more than the floor's 2.
	if n < 4 || n > 20 || order[0] != VerifyPending {
		t.Fatalf("%d of 40 attempts replayed (%v): the rate does not adapt", n, order)
	}
	if n2, order2 := run(); n2 != n || !slices.Equal(order, order2) {
		t.Fatalf("two runs of the same events drew differently: %v vs %v", order, order2)
	}
}

func TestStepReplayRestart(t *testing.T) {
	h, a, r := replayed(t)
	h.announce("n2", "op2", 1)
	h.runOn(r.ID, "n2")
	fx := h.restart()
	if len(fx.Judges) != 1 || fx.Judges[0].Attempt != a.ID || len(fx.Scores) != 0 {
		t.Fatalf("after restart: judges %+v, scores %+v; want the reported replay judged again", fx.Judges, fx.Scores)
	}
	a, r = h.s.Attempts[a.ID], h.s.Attempts[r.ID]
	if a.Verification == nil || a.Verification.State != VerifyPending || r.Kind != KindReplay || r.ReplayOf != a.ID {
		t.Fatalf("restored: attempt %+v, replay %+v", a.Verification, r)
	}
	h.step(Judged{Attempt: a.ID, Replays: []string{r.ID}, Judgement: verify.Judgement{Verdict: verify.Verified}})
	h.restart()
	if rec := h.s.Records["n1"].Verify; rec.Verified != 1 || rec.CleanRun != 1 {
		t.Fatalf("n1's replay record after restart: %+v", rec)
	}
	if got := h.s.Attempts[a.ID].Verification; got.State != "verified" {
		t.Fatalf("verification after restart: %+v", got)
	}
}

func TestStepReplayUndeliverable(t *testing.T) {
	h, a, r := replayed(t, func(c *Config) { c.MaxDeclines = 1 })
	h.announce("n2", "op2", 1)
	o := offersOf(h.tick(), r.ID)
	if len(o) != 1 {
		t.Fatalf("offers %+v", o)
	}
	h.step(OfferAnswered{Attempt: r.ID, Node: "n2", Reason: "no such suite here"})
	if r.State != StateFailed || a.Verification.State != VerifyFailed {
		t.Fatalf("a replay no node runs: replay %s, verification %+v", r.State, a.Verification)
	}
	if h.s.quarantined("n1") || h.s.Records["n1"].Verify.Replayed != 0 {
		t.Fatal("the recorder is penalised for a replay that could not run")
	}
}

// TestStepRunsAreSamples: runs of a model-driven agent are samples, one
// replica each, whatever the node's trust; a deterministic or
// model-free agent's runs are replicated to a quorum as before. A forged
// run is run again once, not raised to a quorum.
func TestStepRunsAreSamples(t *testing.T) {
	for _, tc := range []struct {
		name    string
		agent   AgentInfo
		models  []string
		samples bool
	}{
		{"evaluation names models", AgentInfo{CID: "bafyllm"}, []string{"m"}, true},
		{"agent declares a model", AgentInfo{CID: "bafyllm", Model: "m"}, nil, true},
		{"no model", AgentInfo{CID: "bafyllm"}, nil, false},
		{"deterministic", AgentInfo{CID: "bafyllm", Model: "m", Deterministic: true}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t)
			h.cat.agents["llm"] = tc.agent
			for _, n := range []string{"n1", "n2", "n3", "n4"} {
				h.announce(n, "op-"+n, 2)
			}
			r := h.evaluate(Evaluation{Suite: "one", Agent: "llm", Levels: []string{"easy"}, Runs: 3, Models: tc.models})
			if r.Attempts != 3 {
				t.Fatalf("%d attempts queued, want one per run", r.Attempts)
			}
			for _, a := range h.s.Attempts {
				w := h.s.Book.Attempts[a.Unit]
				if w.Work.Samples != tc.samples || tc.samples && w.Target != 1 {
					t.Fatalf("unit %s: samples %v target %d, want samples %v", a.Unit, w.Work.Samples, w.Target, tc.samples)
				}
			}
			fx := h.tick()
			replicas := 0
			for _, o := range fx.Offers {
				h.accept(o)
			}
			for _, id := range h.s.Queue {
				if h.s.Attempts[id].Kind != KindReplay {
					replicas++
				}
			}
			// A new node is never trusted: model-free runs need a quorum.
			if tc.samples != (replicas == 0) {
				t.Fatalf("%d more replicas queued after placement (samples %v): %s", replicas, tc.samples, h.states())
			}
			if !tc.samples {
				return
			}
			for _, o := range fx.Offers {
				h.reportModel(o.Attempt, o.Node)
				h.score(o.Attempt, true)
			}
			es := h.s.Entries()
			if len(es) != 3 {
				t.Fatalf("entries %+v", es)
			}
			for _, e := range es {
				if e.Status != bench.Validated || e.Verification != VerifyPending {
					t.Fatalf("a sampled run's entry %+v, want validated alone, its replay pending", e)
				}
			}
			// A forgery found in one run: its node is quarantined and that
			// run (and its other unvalidated ones) run again, once each.
			first := fx.Offers[0]
			a := h.s.Attempts[first.Attempt]
			rep := h.queuedReplay(a.ID)
			other := "n4"
			if first.Node == "n4" {
				other = "n3"
			}
			h.runOn(rep.ID, other)
			h.step(Judged{Attempt: a.ID, Replays: []string{rep.ID}, Judgement: verify.Judgement{Verdict: verify.Forged, Reason: "test"}})
			if !h.s.quarantined(first.Node) {
				t.Fatal("the forging node is not quarantined")
			}
			if w := h.s.Book.Attempts[a.Unit]; w.Target != 1 || w.Decision.Need != 1 {
				t.Fatalf("after a forgery: target %d, need %d; want the run redone once", w.Target, w.Decision.Need)
			}
		})
	}
}

// TestReplaySimulation drives the core through seeded evaluations of a
// model-driven agent (at least 200 runs each) on 20 nodes of 20 operators,
// four of which forge tool results: two on every attempt, two on one in
// five. The replays' verdicts are scripted from what each node did (a
// forged attempt's two replays agree against it; an honest attempt's
// first replay verifies it, or, for one in ten, finds a difference the
// second replay shows to be nondeterministic). It checks that no honest
// node is penalised and every always-forging node is quarantined, and
// logs the figures of docs/benchmarks.md: forging nodes caught, replays
// per run, forged results left on the board.
func TestReplaySimulation(t *testing.T) {
	for seed := uint64(1); seed <= 5; seed++ {
		h := newHarness(t, func(c *Config) { c.Seed = [32]byte{byte(seed)} })
		h.cat.agents["llm"] = AgentInfo{CID: "bafyllm", Model: "m"}
		world := mrand.New(mrand.NewPCG(seed, 42))
		forgeRate := map[string]float64{}
		var nodes []string
		for i := range 20 {
			n := fmt.Sprintf("n%02d", i)
			nodes = append(nodes, n)
			switch i {
			case 0, 1:
				forgeRate[n] = 1
			case 2, 3:
				forgeRate[n] = 0.2
			}
		}
		announce := func() {
			for _, n := range nodes {
				h.announce(n, "op-"+n, 2)
			}
		}
		announce()
		r := h.evaluate(Evaluation{Suite: "two", Agent: "llm", Levels: []string{"easy", "hard"}, Runs: 60})
		if r.Attempts < 200 {
			t.Fatalf("%d runs", r.Attempts)
		}
		forged := map[string]bool{}
		noisy := map[string]bool{}
		var originals, replays, noisyJudged int
		for round := 0; round < 400 && (len(h.s.Queue) > 0 || round == 0); round++ {
			for _, o := range h.tick().Offers {
				a := h.s.Attempts[o.Attempt]
				h.accept(o)
				if _, ok := h.reportModel(a.ID, o.Node).(ReportRecorded); !ok {
					continue // a quarantined node's report counts for nothing
				}
				if a.Kind != KindReplay {
					originals++
					forged[a.ID] = world.Float64() < forgeRate[o.Node]
					noisy[a.ID] = !forged[a.ID] && world.Float64() < 0.1
					h.score(a.ID, true)
					continue
				}
				replays++
				orig := h.s.Attempts[a.ReplayOf]
				reps := orig.Verification.Replays
				j := verify.Judgement{Verdict: verify.Verified}
				switch {
				case len(reps) == 1 && (forged[orig.ID] || noisy[orig.ID]):
					j.Verdict = verify.NeedsReplay
				case forged[orig.ID]:
					j.Verdict = verify.Forged
				case noisy[orig.ID]:
					j.Verdict = verify.Nondeterministic
					noisyJudged++
				}
				h.step(Judged{Attempt: orig.ID, Replays: slices.Clone(reps), Judgement: j})
			}
			h.advance(time.Second)
			announce()
		}
		if len(h.s.Queue) > 0 {
			t.Fatalf("seed %d: not settled: %d queued", seed, len(h.s.Queue))
		}
		caught := map[float64]int{}
		for _, n := range nodes {
			switch q := h.s.quarantined(n); {
			case forgeRate[n] == 0 && (q || h.s.Records[n].Verify.Marks() > 0):
				t.Fatalf("seed %d: honest node %s penalised: %+v", seed, n, h.s.Records[n].Verify)
			case q:
				caught[forgeRate[n]]++
			}
		}
		if caught[1] != 2 {
			t.Fatalf("seed %d: %d of 2 always-forging nodes quarantined", seed, caught[1])
		}
		left, counted := 0, 0
		for id, w := range h.s.Book.Attempts {
			if w.Decision.State != crosscheck.Validated {
				continue
			}
			counted++
			if c := h.s.canonical(id); c != nil && forged[c.ID] {
				left++
			}
		}
		t.Logf("seed %d: %d runs, %d attempts, %d replays (%.2f per attempt); forging nodes quarantined: always %d/2, one in five %d/2; "+
			"%d honest attempts judged nondeterministic, no honest node penalised; %d forged results of %d left on the board",
			seed, r.Attempts, originals, replays, float64(replays)/float64(originals), caught[1], caught[0.2], noisyJudged, left, counted)
	}
}

// TestStepReplayNoOperatorEnds: a replay that no node in view may run
// (only the recorder is left in view) ends after
// ReplayUnschedulableAfter, not the whole UnschedulableAfter: the
// evaluation does not wait ten minutes for the network's own check, and
// the result stays unverified with the reason.
func TestStepReplayNoOperatorEnds(t *testing.T) {
	h, a, r := replayed(t)
	for range 20 { // 100 s: n1b leaves the view, n1 alone announces
		h.announce("n1", "op1", 2)
		h.tick()
		h.advance(5 * time.Second)
	}
	h.announce("n1", "op1", 2)
	h.tick()
	if r.State != StateFailed || a.Verification.State != VerifyFailed {
		t.Fatalf("after %s: replay %s, verification %+v", h.now.Sub(r.EnqueuedAt), r.State, a.Verification)
	}
	if h.s.quarantined("n1") || h.s.Records["n1"].InfraErrors != 0 {
		t.Fatal("the recorder is charged for a replay no node may run")
	}
}
