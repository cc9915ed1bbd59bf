package verify_test

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/repronet/repronet/verify"
)

var honest = run{
	commands: []string{"ls results", "cat results/metrics.txt"},
	outputs:  []string{"metrics.txt\n", "accuracy: 0.93456\nmethod: ridge regression\n"},
	submit:   `{"answers": {"Report the accuracy.": 0.9346, "Report the method.": "Ridge Regression"}}`,
}

func TestHeadCommitsToEveryByte(t *testing.T) {
	ex := honest.exchanges()
	h := verify.Head("a1", ex)
	if err := verify.ValidHead(h); err != nil {
		t.Fatal(err)
	}
	if h != verify.Head("a1", honest.exchanges()) {
		t.Fatal("the head of the same exchanges differs")
	}
	if verify.Head("a2", ex) == h {
		t.Fatal("the head does not depend on the attempt")
	}
	if verify.Head("a1", ex[:len(ex)-1]) == h || verify.Head("a1", nil) != verify.Genesis("a1") {
		t.Fatal("the head does not depend on the number of exchanges")
	}
	for i := range ex {
		for _, side := range []string{"request", "response"} {
			c := slices.Clone(ex)
			if side == "request" {
				c[i].Request = append(slices.Clone(c[i].Request[:len(c[i].Request)-1]), ' ', '}')
			} else {
				c[i].Response = append(slices.Clone(c[i].Response), ' ')
			}
			if verify.Head("a1", c) == h {
				t.Errorf("changing the %s of exchange %d left the head as it was", side, i)
			}
		}
	}
	for _, bad := range []string{"xyz", strings.Repeat("A", 64), h[:63]} {
		if verify.ValidHead(bad) == nil {
			t.Errorf("ValidHead(%q) accepted it", bad)
		}
	}
}

func TestAppendOnly(t *testing.T) {
	ex := honest.exchanges()
	// drop: the last request shows the model its history without the
	// first command and its output.
	var dropped []msg
	json.Unmarshal(ex[2].Request, &struct{ Messages *[]msg }{&dropped})
	dropped = append(dropped[:2:2], dropped[4:]...)
	// rewrite: the first tool result changed after the model saw it.
	rewritten := honest.with(0, "metrics.txt gold.txt\n").exchanges()
	mixed := slices.Clone(ex)
	mixed[2] = rewritten[2]
	// A fresh conversation (a sub-agent) beside the first: allowed.
	fresh := append(slices.Clone(ex), verify.Exchange{API: verify.APIOpenAIChat,
		Request: request([]msg{{Role: "user", Content: "Summarise."}}), Response: answer(msg{Role: "assistant", Content: "ok"})})
	// Anthropic: a tool_result block that rewrites an earlier tool_use.
	anth := func(result string) []byte {
		return []byte(`{"model":"m","system":"s","messages":[{"role":"user","content":"go"},
			{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{"command":"ls"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"` + result + `"}]},
			{"role":"assistant","content":[{"type":"text","text":"done"}]},
			{"role":"user","content":"and?"}]}`)
	}
	anthAnswer := []byte(`{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{"command":"ls"}}]}`)
	doneAnswer := []byte(`{"role":"assistant","content":[{"type":"text","text":"done"}]}`)
	anthFirst := verify.Exchange{API: verify.APIAnthropicMessages, Request: []byte(`{"model":"m","system":"s","messages":[{"role":"user","content":"go"}]}`), Response: anthAnswer}
	anthSecond := func(result string) verify.Exchange {
		return verify.Exchange{API: verify.APIAnthropicMessages, Request: []byte(`{"model":"m","system":"s","messages":[{"role":"user","content":"go"},
			{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"bash","input":{"command":"ls"}}]},
			{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"` + result + `"}]}]}`), Response: doneAnswer}
	}
	for _, tc := range []struct {
		name string
		ex   []verify.Exchange
		want []int // steps with a rewrite finding
	}{
		{"honest", ex, nil},
		{"dropped turns", append(slices.Clone(ex[:2]), verify.Exchange{API: verify.APIOpenAIChat, Request: request(dropped), Response: ex[2].Response}), []int{2}},
		{"rewritten tool result", mixed, []int{2}},
		{"a fresh conversation beside", fresh, nil},
		{"a branch from an earlier exchange", append(slices.Clone(ex[:2]), rewritten[1]), []int{2}},
		{"a retry", append(slices.Clone(ex), ex[1]), nil},
		{"anthropic honest", []verify.Exchange{anthFirst, anthSecond("a b"), {API: verify.APIAnthropicMessages, Request: anth("a b"), Response: doneAnswer}}, nil},
		{"anthropic rewritten", []verify.Exchange{anthFirst, anthSecond("a b"), {API: verify.APIAnthropicMessages, Request: anth("a b gold"), Response: doneAnswer}}, []int{2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got []int
			for _, f := range verify.CheckAppendOnly(tc.ex) {
				if f.Kind != verify.FindingRewrite {
					t.Fatalf("unexpected finding %+v", f)
				}
				got = append(got, f.Step)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("rewrites at %v, want %v", got, tc.want)
			}
		})
	}
	if f := verify.CheckAppendOnly([]verify.Exchange{{API: verify.APIOpenAIChat, Request: []byte("{"), Response: []byte("[]")}}); len(f) != 2 || f[0].Kind != verify.FindingUnreadable {
		t.Fatalf("unreadable bodies: %+v", f)
	}
}

func TestBind(t *testing.T) {
	edited := honest
	edited.submit = `{"answers": {"Report the accuracy.": 0.9346}}`
	for _, tc := range []struct {
		name    string
		r       run
		answers []verify.Answer
		unbound []string
		tools   map[string]int // answer -> tool results holding it
	}{
		{"from the model and a tool", honest, answers("acc", "0.9346", "method", `"ridge regression"`), nil, map[string]int{"acc": 1, "method": 1}},
		{"a number as a string", honest, answers("acc", `"0.93456"`), nil, map[string]int{"acc": 1}},
		{"report.json edited after the agent stopped", edited, answers("acc", "0.9346", "method", `"lasso"`), []string{"method"}, nil},
		{"a gold number nowhere", honest, answers("acc", "0.9721"), []string{"acc"}, nil},
		{"a list", honest, answers("both", `[0.9346, "ridge"]`), nil, map[string]int{"both": 1}},
		{"not JSON", honest, answers("acc", `{`), []string{"acc"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := verify.Bind(tc.r.exchanges(), tc.answers)
			if got := verify.Unbound(bs); !slices.Equal(got, tc.unbound) {
				t.Fatalf("unbound %v, want %v (%+v)", got, tc.unbound, bs)
			}
			for _, b := range bs {
				if want, ok := tc.tools[b.Answer]; ok && len(b.Tools) != want {
					t.Errorf("answer %s held by tool results %+v, want %d", b.Answer, b.Tools, want)
				}
			}
		})
	}
}

func TestNormaliseAndTolerance(t *testing.T) {
	tol := verify.DefaultTolerance()
	for _, tc := range []struct {
		a, b string
		same bool
	}{
		{"run at 2026-11-24T09:13:44.123Z done", "run at 2026-11-25T10:00:01Z done", true},
		{"Tue Nov 24 09:13:44 UTC 2026\nacc 0.93", "Wed Nov 25 11:02:03 UTC 2026\nacc 0.93", true},
		{"id 123e4567-e89b-12d3-a456-426614174000", "id 00000000-aaaa-bbbb-cccc-000000000000", true},
		{"commit 9fceb02d0ae598e95dc970b74767f19372d61af8", "commit 1b2c3d4e5f60718293a4b5c6d7e8f90123456789", true},
		{"took 12.5s", "took 9 ms", true},
		{"loss 0.30000000000000004", "loss 0.3", true},
		{"acc 0.93", "acc 0.94", false},
		{"seed 12345678", "seed 87654321", false},
		{"a b c", "a b", false},
	} {
		if got := tol.Same(tc.a, tc.b); got != tc.same {
			t.Errorf("Same(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
	}
	if (verify.Tolerance{}).Same("at 09:13:44", "at 09:13:45") {
		t.Error("without normalisation times differ")
	}
}

func TestJudge(t *testing.T) {
	ans := answers("acc", "0.9346", "method", `"ridge regression"`)
	noisy := honest.with(0, "metrics.txt\nstarted 2026-11-24T09:13:44Z pid 4242 random 0.118\n")
	noisyReplay := honest.with(0, "metrics.txt\nstarted 2026-11-25T18:00:00Z pid 77 random 0.774\n")
	planted := honest.with(1, "accuracy: 0.97210\nmethod: ridge regression\n")
	plantedAns := answers("acc", "0.9721", "method", `"ridge regression"`)
	plantedRun := planted
	plantedRun.submit = `{"answers": {"Report the accuracy.": 0.9721, "Report the method.": "Ridge Regression"}}`
	seedA, seedB := honest.with(1, "accuracy: 0.91200\nmethod: ridge regression\n"), honest.with(1, "accuracy: 0.95800\nmethod: ridge regression\n")
	short := run{commands: honest.commands[:1], outputs: honest.outputs[:1], submit: honest.submit}
	for _, tc := range []struct {
		name     string
		recorded run
		answers  []verify.Answer
		replays  []run
		want     verify.Verdict
		benign   int
	}{
		{"deterministic", honest, ans, []run{honest}, verify.Verified, 0},
		{"timestamps and random numbers", noisy, ans, []run{noisyReplay}, verify.Verified, 1},
		{"planted gold, one replay", plantedRun, plantedAns, []run{honest}, verify.NeedsReplay, 0},
		{"planted gold, two replays", plantedRun, plantedAns, []run{honest, honest}, verify.Forged, 0},
		{"random answer, two replays", seedA, answers("acc", "0.912"), []run{honest, seedB}, verify.Nondeterministic, 0},
		{"replay stopped before the answer's result", plantedRun, plantedAns, []run{short, short}, verify.Forged, 0},
		{"no replay", honest, ans, nil, verify.NeedsReplay, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var reps [][]verify.Exchange
			for _, r := range tc.replays {
				reps = append(reps, r.exchanges())
			}
			j := verify.Judge(tc.recorded.exchanges(), reps, tc.answers, verify.DefaultTolerance())
			if j.Verdict != tc.want || j.Benign != tc.benign {
				t.Fatalf("verdict %s with %d benign (%s), want %s with %d", j.Verdict, j.Benign, j.Reason, tc.want, tc.benign)
			}
		})
	}
}

func TestPolicy(t *testing.T) {
	p := verify.DefaultPolicy()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	r := verify.Record{Node: "n"}
	if p.Rate(r) != 1 {
		t.Fatalf("a new node's rate is %v, want 1", p.Rate(r))
	}
	for range 40 {
		var why string
		r, why = p.Apply(r, verify.Event{Judgement: verify.Judgement{Verdict: verify.Verified}})
		if why != "" {
			t.Fatal("quarantined for clean replays")
		}
	}
	if p.Rate(r) != p.Floor {
		t.Fatalf("after 40 clean replays the rate is %v, want the floor %v", p.Rate(r), p.Floor)
	}
	r2, why := p.Apply(r, verify.Event{Judgement: verify.Judgement{Verdict: verify.Nondeterministic}})
	if why != "" || r2.CleanRun != r.CleanRun {
		t.Fatal("nondeterministic work penalised the node")
	}
	r2, why = p.Apply(r, verify.Event{Unbound: []string{"acc"}})
	if why != "" || p.Rate(r2) != 1 {
		t.Fatalf("one unbound answer: quarantine %q, rate %v; want none and 1", why, p.Rate(r2))
	}
	r2, _ = p.Apply(r2, verify.Event{Rewrites: []verify.Finding{{Kind: verify.FindingRewrite}}})
	if _, why = p.Apply(r2, verify.Event{Unbound: []string{"acc"}}); why == "" {
		t.Fatal("three marks did not quarantine")
	}
	if _, why = p.Apply(r, verify.Event{Judgement: verify.Judgement{Verdict: verify.Forged, Reason: "x"}}); !strings.Contains(why, "forged") {
		t.Fatalf("a forgery did not quarantine: %q", why)
	}
	for _, bad := range []verify.Policy{{NewNodeRate: 2, MarksToQuarantine: 1}, {NewNodeRate: 0.5, Floor: 0.6, MarksToQuarantine: 1}, {NewNodeRate: 1}} {
		if bad.Validate() == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}
