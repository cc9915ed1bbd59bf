package crosscheck

import (
	"encoding/json"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench"
)

func TestPolicyValidate(t *testing.T) {
	if err := DefaultPolicy().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		field string
		edit  func(*Policy)
	}{
		{"quorum", func(p *Policy) { p.Quorum = 0 }},
		{"max_replicas", func(p *Policy) { p.MaxReplicas = 1 }},
		{"max_dropped", func(p *Policy) { p.MaxDropped = -1 }},
		{"trust_after", func(p *Policy) { p.TrustAfter = 0 }},
		{"canary_rate", func(p *Policy) { p.CanaryRate = 1.5 }},
		{"new_node_canary_rate", func(p *Policy) { p.NewNodeCanaryRate = -0.1 }},
		{"quarantine_after_invalid", func(p *Policy) { p.QuarantineAfterInvalid = 0 }},
		{"invalid_window", func(p *Policy) { p.InvalidWindow = 0 }},
		{"evidence.max_cpu_per_wall", func(p *Policy) { p.Evidence.MaxCPUPerWall = 0 }},
		{"evidence.slack_seconds", func(p *Policy) { p.Evidence.SlackSeconds = -1 }},
	} {
		p := DefaultPolicy()
		tt.edit(&p)
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "field "+tt.field) {
			t.Errorf("%s: %v", tt.field, err)
		}
	}
}

func TestReliability(t *testing.T) {
	p := DefaultPolicy()
	tests := []struct {
		name       string
		rec        NodeRecord
		spot       float64
		target     map[float64]int // draw -> target
		canaryProb float64
	}{
		{"new node", NodeRecord{}, 1, map[float64]int{0: 2, 0.99: 2}, 0.5},
		{"9 valid", NodeRecord{ConsecutiveValid: 9, Valid: 9}, 1, map[float64]int{0.99: 2}, 0.05},
		{"10 valid: trusted, spot checked 1 in 10", NodeRecord{ConsecutiveValid: 10, Valid: 10}, 0.1, map[float64]int{0.05: 2, 0.1: 1, 0.5: 1}, 0.05},
		{"100 valid", NodeRecord{ConsecutiveValid: 100, Valid: 100}, 0.01, map[float64]int{0.009: 2, 0.01: 1}, 0.05},
		{"quarantined", NodeRecord{ConsecutiveValid: 100, Quarantined: true}, 1, map[float64]int{0.5: 2}, 0.5},
		{"4 valid", NodeRecord{ConsecutiveValid: 4, Valid: 4}, 1, nil, 0.1},
	}
	for _, tt := range tests {
		if got := p.SpotCheckProbability(tt.rec); got != tt.spot {
			t.Errorf("%s: spot check %v, want %v", tt.name, got, tt.spot)
		}
		for draw, want := range tt.target {
			if got := p.Target(tt.rec, draw); got != want {
				t.Errorf("%s: Target(draw %v) = %d, want %d", tt.name, draw, got, want)
			}
		}
		if got := p.CanaryProbability(tt.rec); got != tt.canaryProb {
			t.Errorf("%s: canary probability %v, want %v", tt.name, got, tt.canaryProb)
		}
	}

	r := NodeRecord{Node: "n"}
	for range 12 {
		r = p.Apply(r, Valid, "", false)
	}
	r = p.Apply(r, Valid, "", true)
	if r.ConsecutiveValid != 13 || r.Valid != 13 || r.CanariesPassed != 1 || !p.Trusted(r) {
		t.Errorf("after 13 valid: %+v", r)
	}
	r = p.Apply(r, Disagreed, "", false)
	r = p.Apply(r, Accepted, "", false)
	r = p.Apply(r, Pending, "", false)
	if r.ConsecutiveValid != 13 || r.Disagreed != 1 {
		t.Errorf("disagreed, accepted and pending change nothing but the count: %+v", r)
	}
	r = p.MissedDeadline(r)
	if r.ConsecutiveValid != 0 || r.MissedDeadlines != 1 || p.Trusted(r) {
		t.Errorf("missed deadline: %+v", r)
	}
	// invalid results: quarantined at 3 among the last 20
	for i := range 2 {
		r = p.Apply(r, Invalid, "x", false)
		for range 8 {
			r = p.Apply(r, Valid, "", false)
		}
		if r.Quarantined {
			t.Fatalf("quarantined after %d invalid results: %+v", i+1, r)
		}
	}
	r = p.Apply(r, Invalid, "third", false)
	if !r.Quarantined || !strings.Contains(r.QuarantineReason, "3 invalid results among its last 20 (last: third)") {
		t.Errorf("third invalid in 20: %+v", r)
	}
	// spread out, they are forgiven
	r = NodeRecord{Node: "m"}
	for range 3 {
		r = p.Apply(r, Invalid, "x", false)
		for range 19 {
			r = p.Apply(r, Valid, "", false)
		}
	}
	if r.Quarantined || len(r.Recent) != 20 {
		t.Errorf("3 invalid results 20 apart: %+v", r)
	}
	l := p.Apply(NodeRecord{Node: "l", ConsecutiveValid: 50}, Lied, "forged", true)
	if !l.Quarantined || l.CanariesFailed != 1 || l.ConsecutiveValid != 0 || l.QuarantineReason != "caught lying: forged" {
		t.Errorf("lie: %+v", l)
	}
}

func num(lit string) json.RawMessage { return json.RawMessage(lit) }

func TestAgree(t *testing.T) {
	g := func(task bool, c ...bool) Result { return Result{Grading: &Grading{Pass: task, Checks: c}} }
	agent := Work{ID: "w", Kind: AgentAttempt}
	exact := Work{ID: "w", Kind: AgentAttempt, ExactOutputs: true}
	// CORE-Bench's 95% prediction interval of the runs 0.93, 0.94, 0.95.
	iv := bench.Interval{Lower: 0.8903, Upper: 0.9897}
	capsule := Work{ID: "c", Kind: CapsuleRun, Tolerances: map[string]Tolerance{
		"auc": {Interval: &iv}, "loss": {Rel: 1e-6}, "n": {},
	}}
	out := func(auc, loss, n string, label string) Result {
		return Result{Outputs: []Output{{Name: "auc", Value: num(auc)}, {Name: "loss", Value: num(loss)}, {Name: "n", Value: num(n)},
			{Name: "label", Value: json.RawMessage(strconv.Quote(label))}}}
	}
	tests := []struct {
		name string
		w    Work
		a, b Result
		want bool
	}{
		{"same grading", agent, g(true, true, true), g(true, true, true), true},
		{"other question", agent, g(false, true, false), g(false, false, true), false},
		{"other task_correct", agent, g(true), g(false), false},
		{"no grading", agent, Result{}, g(true), false},
		{"digest ignored", agent, Result{Grading: &Grading{}, OutputDigest: "a"}, Result{Grading: &Grading{}, OutputDigest: "b"}, true},
		{"digest compared", exact, Result{Grading: &Grading{}, OutputDigest: "a"}, Result{Grading: &Grading{}, OutputDigest: "b"}, false},
		{"capsule same", capsule, out("0.94", "1.5", "7", "x"), out("0.94", "1.5", "7", "x"), true},
		{"both in the gold interval", capsule, out("0.93", "1.5", "7", "x"), out("0.955", "1.5", "7", "x"), true},
		{"one outside the interval", capsule, out("0.93", "1.5", "7", "x"), out("0.99", "1.5", "7", "x"), false},
		{"relative tolerance", capsule, out("0.94", "1.5", "7", "x"), out("0.94", "1.5000001", "7", "x"), true},
		{"beyond it", capsule, out("0.94", "1.5", "7", "x"), out("0.94", "1.501", "7", "x"), false},
		{"exact number", capsule, out("0.94", "1.5", "7", "x"), out("0.94", "1.5", "7.0", "x"), true},
		{"exact number differs", capsule, out("0.94", "1.5", "7", "x"), out("0.94", "1.5", "8", "x"), false},
		{"string differs", capsule, out("0.94", "1.5", "7", "x"), out("0.94", "1.5", "7", "X"), false},
		{"missing output", capsule, out("0.94", "1.5", "7", "x"), Result{Outputs: out("0.94", "1.5", "7", "x").Outputs[:3]}, false},
		{"NaN never agrees", capsule, out("NaN", "1.5", "7", "x"), out("NaN", "1.5", "7", "x"), false},
	}
	for _, tt := range tests {
		if got := Agree(tt.w, tt.a, tt.b); got != tt.want {
			t.Errorf("%s: Agree = %v, want %v", tt.name, got, tt.want)
		}
		if got := Agree(tt.w, tt.b, tt.a); got != tt.want {
			t.Errorf("%s: Agree is not symmetric", tt.name)
		}
	}
}

// honestEvidence ran for 100 s with 80 s of CPU.
func honestEvidence() Evidence {
	return Evidence{Outcome: "ok", InputCIDs: []string{"c"}, ImageCID: "a", StartedMillis: 1_000_000, FinishedMillis: 1_100_000,
		WallSeconds: 100, CPUSeconds: 80, LogBytes: 10}
}

func TestCheckEvidence(t *testing.T) {
	p := DefaultPolicy()
	w := Work{ID: "w", Kind: AgentAttempt, InputCIDs: []string{"c"}, ImageCID: "a", WallLimitSeconds: 120}
	tests := []struct {
		name string
		edit func(*Evidence)
		want Verdict
		why  string
	}{
		{"honest", func(*Evidence) {}, "", ""},
		{"timeout is fine", func(e *Evidence) { e.Outcome = "timeout" }, "", ""},
		{"other inputs", func(e *Evidence) { e.InputCIDs = []string{"x"} }, Lied, "reports inputs"},
		{"other image", func(e *Evidence) { e.ImageCID = "" }, Lied, "reports image"},
		{"unknown outcome", func(e *Evidence) { e.Outcome = "infra_error" }, Invalid, "unknown outcome"},
		{"time backwards", func(e *Evidence) { e.FinishedMillis = 0 }, Lied, "finished before it started"},
		{"no wall time", func(e *Evidence) { e.WallSeconds = 0 }, Lied, "impossible usage"},
		{"negative CPU", func(e *Evidence) { e.CPUSeconds = -1 }, Lied, "impossible usage"},
		{"too much CPU", func(e *Evidence) { e.CPUSeconds = 200 }, Lied, "CPU seconds"},
		{"wall against timestamps", func(e *Evidence) { e.WallSeconds, e.CPUSeconds = 50, 30 }, Lied, "contradicts its timestamps"},
		{"past the limit", func(e *Evidence) { e.WallSeconds, e.FinishedMillis = 130, 1_130_000 }, Lied, "past its 120 s limit"},
		{"within slack", func(e *Evidence) { e.WallSeconds, e.FinishedMillis = 124, 1_124_000 }, "", ""},
	}
	for _, tt := range tests {
		e := honestEvidence()
		tt.edit(&e)
		v, why := CheckEvidence(p, w, e)
		if v != tt.want || !strings.Contains(why, tt.why) {
			t.Errorf("%s: %q %q, want %q %q", tt.name, v, why, tt.want, tt.why)
		}
	}
}

func rep(node, op string, r Result) Replica {
	return Replica{Job: "j-" + node, Node: node, Operator: op, Result: r, Evidence: honestEvidence()}
}

func TestDecide(t *testing.T) {
	p := DefaultPolicy()
	yes := Result{Grading: &Grading{Pass: true, Checks: []bool{true}}}
	no := Result{Grading: &Grading{Checks: []bool{false}}}
	half := Result{Grading: &Grading{Checks: []bool{true, false}}}
	det := Work{ID: "w", Kind: AgentAttempt, Deterministic: true, InputCIDs: []string{"c"}, ImageCID: "a"}
	nondet := Work{ID: "w", Kind: AgentAttempt, InputCIDs: []string{"c"}, ImageCID: "a"}
	sampled := nondet
	sampled.Samples = true
	canary := det
	canary.Known = &no
	forged := rep("f", "eve", yes)
	forged.Evidence.InputCIDs = []string{"other"}
	tests := []struct {
		name        string
		a           Attempt
		quarantined map[string]bool
		state       State
		canonical   int
		verdicts    []Verdict
		need        int
	}{
		{"nothing yet", Attempt{Work: det, Target: 2}, nil, Open, -1, nil, 2},
		{"nothing yet, one job out", Attempt{Work: det, Target: 2, Jobs: map[string]string{"j": "n1"}}, nil, Open, -1, nil, 1},
		{"one of two", Attempt{Work: det, Target: 2, Replicas: []Replica{rep("a", "A", yes)}}, nil, Open, -1, []Verdict{Pending}, 1},
		{"two agree", Attempt{Work: det, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", yes)}}, nil,
			Validated, 0, []Verdict{Valid, Valid}, 0},
		{"two disagree: a third", Attempt{Work: det, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", no)}}, nil,
			Open, -1, []Verdict{Pending, Pending}, 1},
		{"third decides (deterministic)", Attempt{Work: det, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", no), rep("c", "C", no)}}, nil,
			Validated, 1, []Verdict{Invalid, Valid, Valid}, 0},
		{"third decides (non-deterministic)", Attempt{Work: nondet, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", no), rep("c", "C", no)}}, nil,
			Validated, 1, []Verdict{Disagreed, Valid, Valid}, 0},
		{"2-2 tie: one more", Attempt{Work: det, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", no), rep("c", "C", no), rep("d", "D", yes)}}, nil,
			Open, -1, []Verdict{Pending, Pending, Pending, Pending}, 1},
		{"inconsistent at max", Attempt{Work: nondet, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", no), rep("c", "C", half),
			rep("d", "D", Result{Grading: &Grading{Checks: []bool{false, true}}}), rep("e", "E", Result{Grading: &Grading{Checks: []bool{}}})}}, nil,
			Inconsistent, -1, []Verdict{Disagreed, Disagreed, Disagreed, Disagreed, Disagreed}, 0},
		{"same operator counts once", Attempt{Work: det, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("a2", "A", yes)}}, nil,
			Open, -1, []Verdict{Pending, Discarded}, 1},
		{"trusted node alone", Attempt{Work: det, Target: 1, Replicas: []Replica{rep("a", "A", yes)}}, nil,
			Validated, 0, []Verdict{Accepted}, 0},
		{"trusted node, then a spot check agrees", Attempt{Work: det, Target: 1, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", yes)}}, nil,
			Validated, 0, []Verdict{Valid, Valid}, 0},
		{"quarantined node discarded, quorum back to 2", Attempt{Work: det, Target: 1, Replicas: []Replica{rep("f", "eve", yes), rep("a", "A", yes)}},
			map[string]bool{"f": true}, Open, -1, []Verdict{Discarded, Pending}, 1},
		{"a sample from a quarantined node: redone once, not a quorum", Attempt{Work: sampled, Target: 1, Replicas: []Replica{rep("f", "eve", yes)}},
			map[string]bool{"f": true}, Open, -1, []Verdict{Discarded}, 1},
		{"a sample alone", Attempt{Work: sampled, Target: 1, Replicas: []Replica{rep("a", "A", no)}}, nil,
			Validated, 0, []Verdict{Accepted}, 0},
		{"forged evidence", Attempt{Work: det, Target: 2, Replicas: []Replica{forged, rep("a", "A", yes)}}, nil,
			Open, -1, []Verdict{Lied, Pending}, 1},
		{"canary passed", Attempt{Work: canary, Target: 1, Replicas: []Replica{rep("a", "A", no)}}, nil,
			Validated, 0, []Verdict{Valid}, 0},
		{"canary failed", Attempt{Work: canary, Target: 1, Replicas: []Replica{rep("f", "eve", yes)}}, nil,
			Open, -1, []Verdict{Lied}, 0},
		{"failed: jobs lost", Attempt{Work: det, Target: 2, Dropped: 3}, nil, Failed, -1, nil, 0},
		{"max replicas bounds need", Attempt{Work: det, Target: 2, Replicas: []Replica{rep("a", "A", yes), rep("b", "B", no), rep("c", "C", half), rep("d", "D", Result{Grading: &Grading{}})},
			Jobs: map[string]string{"j": ""}}, nil, Open, -1, []Verdict{Pending, Pending, Pending, Pending}, 0},
	}
	for _, tt := range tests {
		d := Decide(p, tt.a, tt.quarantined)
		var verdicts []Verdict
		for _, rv := range d.Replicas {
			verdicts = append(verdicts, rv.Verdict)
		}
		if d.State != tt.state || d.Canonical != tt.canonical || !reflect.DeepEqual(verdicts, tt.verdicts) || d.Need != tt.need {
			t.Errorf("%s: %s canonical %d %v need %d (%s); want %s %d %v need %d", tt.name, d.State, d.Canonical, verdicts, d.Need, d.Reason,
				tt.state, tt.canonical, tt.verdicts, tt.need)
		}
	}
	d := Decide(p, Attempt{Work: det, Replicas: []Replica{rep("a", "A", yes)}, Jobs: map[string]string{"j1": "b", "j2": ""},
		JobOperators: map[string]string{"j1": "B"}}, nil)
	if !reflect.DeepEqual(d.AvoidNodes, []string{"a", "b"}) || !reflect.DeepEqual(d.AvoidOperators, []string{"A", "B"}) {
		t.Errorf("avoid %v %v", d.AvoidNodes, d.AvoidOperators)
	}
}

func TestWorkValidate(t *testing.T) {
	yes := Result{Grading: &Grading{Pass: true}}
	for _, tt := range []struct {
		w    Work
		want string
	}{
		{Work{Kind: AgentAttempt}, "field id"},
		{Work{ID: "w", Kind: "x"}, "field kind"},
		{Work{ID: "w", Kind: AgentAttempt, Known: &yes}, "must be deterministic"},
		{Work{ID: "w", Kind: AgentAttempt, Deterministic: true, Known: &Result{}}, "needs a grading"},
	} {
		if err := tt.w.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.w, err, tt.want)
		}
	}
}

func TestBookFlow(t *testing.T) {
	b, err := NewBook(DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct{ node, op string }{{"a", "A"}, {"b", "B"}, {"c", "C"}, {"a2", "A"}} {
		b.Node(n.node, n.op)
	}
	yes := Result{Grading: &Grading{Pass: true, Checks: []bool{true, false}}}
	w := Work{ID: "w1", Kind: AgentAttempt, Deterministic: true, InputCIDs: []string{"c"}, ImageCID: "a"}
	if err := b.Add(w, "j1"); err != nil {
		t.Fatal(err)
	}
	if err := b.Add(w, "j9"); err == nil {
		t.Error("work added twice")
	}
	eff, err := b.Placed("w1", "j1", "a", 0.5)
	if err != nil {
		t.Fatal(err)
	}
	if len(eff.Replicate) != 1 || eff.Replicate[0].Count != 1 || !reflect.DeepEqual(eff.Replicate[0].AvoidOperators, []string{"A"}) {
		t.Fatalf("first placement asks for the second replica: %+v", eff)
	}
	if err := b.NewJob("w1", "j2"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Placed("w1", "j2", "a2", 0.5); err == nil || !strings.Contains(err.Error(), "operator A") {
		t.Errorf("same operator placed: %v", err)
	}
	if _, err := b.Placed("w1", "j2", "b", 0.5); err != nil {
		t.Fatal(err)
	}
	// b's lease expires: requeued, b loses its streak
	b.Nodes["b"].ConsecutiveValid = 5
	if _, err := b.MissedDeadline("w1", "j2"); err != nil {
		t.Fatal(err)
	}
	if b.Nodes["b"].ConsecutiveValid != 0 || b.Attempts["w1"].Jobs["j2"] != "" {
		t.Errorf("missed deadline: %+v %+v", *b.Nodes["b"], b.Attempts["w1"].Jobs)
	}
	if _, err := b.Placed("w1", "j2", "c", 0.5); err != nil {
		t.Fatal(err)
	}
	r1 := Replica{Job: "j1", Node: "a", Result: yes, Evidence: honestEvidence()}
	eff, err = b.Report("w1", r1)
	if err != nil || eff.Decisions["w1"].State != Open {
		t.Fatalf("first report: %+v %v", eff, err)
	}
	if _, err := b.Report("w1", r1); err == nil {
		t.Error("duplicate report accepted")
	}
	if _, err := b.Report("w1", Replica{Job: "j2", Node: "b", Result: yes, Evidence: honestEvidence()}); err == nil {
		t.Error("report from a node the job is not placed on accepted")
	}
	eff, err = b.Report("w1", Replica{Job: "j2", Node: "c", Result: yes, Evidence: honestEvidence()})
	if err != nil || eff.Decisions["w1"].State != Validated || b.Nodes["a"].Valid != 1 || b.Nodes["c"].Valid != 1 {
		t.Fatalf("second report: %+v %v", eff, err)
	}

	// A canary replaying w1, failed by a liar: quarantined; a job of the
	// liar's is revoked and the work it alone answered is reopened.
	if id, ok := b.PickCanary("b", 0.3); !ok || id != "w1" {
		t.Fatalf("PickCanary = %q %v", id, ok)
	}
	if _, ok := b.PickCanary("a", 0.3); ok {
		t.Error("canary of work the node answered")
	}
	cw, err := b.CanaryFrom("w1", "k1")
	if err != nil || cw.Known == nil || cw.CanaryOf != "w1" {
		t.Fatalf("CanaryFrom: %+v %v", cw, err)
	}
	if err := b.Add(cw, "kj"); err != nil {
		t.Fatal(err)
	}
	w2 := Work{ID: "w2", Kind: AgentAttempt, Deterministic: true, InputCIDs: []string{"c"}, ImageCID: "a"}
	w3 := Work{ID: "w3", Kind: AgentAttempt, Deterministic: true, InputCIDs: []string{"c"}, ImageCID: "a"}
	for _, w := range []Work{w2, w3} {
		if err := b.Add(w, w.ID+"-j1"); err != nil {
			t.Fatal(err)
		}
	}
	b.Nodes["b"].ConsecutiveValid = 20 // trusted: w2 is accepted from b alone
	if eff, err := b.Placed("w2", "w2-j1", "b", 0.99); err != nil || len(eff.Replicate) != 0 {
		t.Fatalf("trusted placement: %+v %v", eff, err)
	}
	if eff, err := b.Report("w2", Replica{Job: "w2-j1", Node: "b", Result: yes, Evidence: honestEvidence()}); err != nil || eff.Decisions["w2"].State != Validated {
		t.Fatalf("lone result: %+v %v", eff, err)
	}
	if _, err := b.Placed("w3", "w3-j1", "b", 0.99); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Placed("k1", "kj", "b", 0); err != nil {
		t.Fatal(err)
	}
	lie := Result{Grading: &Grading{Pass: true, Checks: []bool{true, true}}}
	eff, err = b.Report("k1", Replica{Job: "kj", Node: "b", Result: lie, Evidence: honestEvidence()})
	if err != nil {
		t.Fatal(err)
	}
	if !b.Nodes["b"].Quarantined || !reflect.DeepEqual(eff.Quarantined, []string{"b"}) || b.Nodes["b"].CanariesFailed != 1 {
		t.Fatalf("liar not quarantined: %+v %+v", eff, *b.Nodes["b"])
	}
	if !reflect.DeepEqual(eff.Revoke, []JobRef{{"w3", "w3-j1"}}) {
		t.Errorf("revoked %+v", eff.Revoke)
	}
	if d := eff.Decisions["w2"]; d.State != Open || d.Need != 2 || d.Replicas[0].Verdict != Discarded {
		t.Errorf("w2 accepted from the liar alone is not reopened for a full quorum: %+v", d)
	}
	if _, err := b.Placed("w3", "w3-j1", "b", 0); err == nil {
		t.Error("placed on a quarantined node")
	}
	if b.ShouldCanary("b", 0) {
		t.Error("canary for a quarantined node")
	}

	// Dropped jobs: the work fails after MaxDropped.
	if err := b.Add(Work{ID: "w4", Kind: AgentAttempt}, "d1"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		job := "d" + string(rune('1'+i))
		if i > 0 {
			if err := b.NewJob("w4", job); err != nil {
				t.Fatal(err)
			}
		}
		eff, err = b.Dropped("w4", job)
		if err != nil {
			t.Fatal(err)
		}
	}
	if d := eff.Decisions["w4"]; d.State != Failed {
		t.Errorf("w4 after 3 dropped jobs: %+v", d)
	}

	// A job no node will run fails its work at once, with the reason, and
	// asks for no replica.
	if err := b.Add(Work{ID: "w5", Kind: AgentAttempt}, "u1"); err != nil {
		t.Fatal(err)
	}
	eff, err = b.Undeliverable("w5", "u1", "declined by every node")
	if err != nil {
		t.Fatal(err)
	}
	if d := eff.Decisions["w5"]; d.State != Failed || !strings.Contains(d.Reason, "declined by every node") || len(eff.Replicate) != 0 {
		t.Errorf("w5 undeliverable: %+v %+v", d, eff.Replicate)
	}
	if _, err := b.Undeliverable("w5", "u1", "again"); err == nil {
		t.Error("a job dropped twice")
	}

	// The book survives a JSON round trip and decides the same.
	data, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	var again Book
	if err := json.Unmarshal(data, &again); err != nil {
		t.Fatal(err)
	}
	if data2, _ := json.Marshal(&again); string(data2) != string(data) {
		t.Error("JSON round trip changed the book")
	}
	for id, a := range again.Attempts {
		if d := Decide(again.Policy, *a, again.quarantinedAmong(a)); !reflect.DeepEqual(d, a.Decision) {
			t.Errorf("%s decided differently after reload: %+v vs %+v", id, d, a.Decision)
		}
	}
	// Unknown work and jobs are errors.
	for _, err := range []error{
		func() error { _, err := b.Report("nope", r1); return err }(),
		func() error { _, err := b.Placed("w1", "nope", "a", 0); return err }(),
		b.Requeued("w1", "nope"),
		b.NewJob("w1", ""),
		func() error { _, err := b.CanaryFrom("w4", "k2"); return err }(),
	} {
		if err == nil {
			t.Error("accepted")
		}
	}
}

func TestQuarantineByHand(t *testing.T) {
	b, _ := NewBook(DefaultPolicy())
	yes := Result{Grading: &Grading{Pass: true}}
	w := Work{ID: "w", Kind: AgentAttempt, Deterministic: true, InputCIDs: []string{"c"}, ImageCID: "a"}
	if err := b.Add(w, "j1"); err != nil {
		t.Fatal(err)
	}
	b.Placed("w", "j1", "a", 0)
	b.NewJob("w", "j2")
	b.Placed("w", "j2", "b", 0)
	b.Report("w", Replica{Job: "j1", Node: "a", Result: yes, Evidence: honestEvidence()})
	eff, _ := b.Report("w", Replica{Job: "j2", Node: "b", Result: yes, Evidence: honestEvidence()})
	if eff.Decisions["w"].State != Validated {
		t.Fatal(eff)
	}
	eff = b.Quarantine("a", "operator request")
	if d := eff.Decisions["w"]; d.State != Open || d.Need != 1 || !reflect.DeepEqual(eff.Quarantined, []string{"a"}) {
		t.Errorf("%+v", eff)
	}
	if again := b.Quarantine("a", "again"); len(again.Quarantined) != 0 || b.Nodes["a"].QuarantineReason != "operator request" {
		t.Errorf("second quarantine: %+v", again)
	}
}

// TestPlacedAfterRequeue: a job declined by a node (requeued) may be placed
// on that node again later; a node holding another job of the work may not.
func TestPlacedAfterRequeue(t *testing.T) {
	b, err := NewBook(DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Add(Work{ID: "w", Kind: AgentAttempt}, "j1"); err != nil {
		t.Fatal(err)
	}
	if err := b.NewJob("w", "j2"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Placed("w", "j1", "n1", 0.5); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Placed("w", "j2", "n2", 0.5); err != nil {
		t.Fatal(err)
	}
	if err := b.Requeued("w", "j2"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Placed("w", "j2", "n1", 0.5); err == nil {
		t.Fatal("a second job of the work placed on the node holding the first")
	}
	if _, err := b.Placed("w", "j2", "n2", 0.5); err != nil {
		t.Fatalf("the requeued job placed again on the node that declined it: %v", err)
	}
}
