package dashboard

import (
	"cmp"
	"encoding/xml"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"
)

func f(v float64) *float64 { return &v }

// entries: agent a with two runs of two tasks (run 1: 1 of 2 right, run 2:
// 2 of 2), agent b cheaper and worse, agent c dearer and worse (dominated),
// agent d without a cost; plus statuses that do not count.
func sampleEntries() []Entry {
	e := func(agent, task string, run int, status string, v, cost *float64) Entry {
		return Entry{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: agent, Task: task, Run: run, Status: status, Value: v,
			CostUSD: cost, InputTokens: 100, OutputTokens: 50, CPUSeconds: 2, WallSeconds: 3}
	}
	return []Entry{
		e("a", "t1", 1, "validated", f(1), f(0.5)), e("a", "t2", 1, "validated", f(0), f(0.5)),
		e("a", "t1", 2, "validated", f(1), f(0.25)), e("a", "t2", 2, "validated", f(1), f(0.25)),
		e("a", "t3", 1, "unvalidated", f(1), f(9)), e("a", "t3", 2, "inconsistent", nil, nil), e("a", "t4", 1, "infra_failed", nil, nil),
		e("b", "t1", 1, "validated", f(0), f(0.1)), e("b", "t2", 1, "validated", f(1), f(0.1)),
		e("c", "t1", 1, "validated", f(0), f(1)), e("c", "t2", 1, "validated", f(0), f(1)),
		e("d", "t1", 1, "validated", f(1), nil), e("d", "t2", 1, "pending", nil, nil),
		{Suite: "s", Variant: "hard", Scoring: "g=1", Agent: "a", Task: "t1", Run: 1, Status: "pending"},
	}
}

func TestBuildBoards(t *testing.T) {
	boards := BuildBoards(sampleEntries())
	if len(boards) != 2 || boards[0].Variant != "easy" || boards[1].Variant != "hard" {
		t.Fatalf("boards %+v", boards)
	}
	rows := map[string]Row{}
	for _, r := range boards[0].Rows {
		rows[r.Agent] = r
	}
	a := rows["a"]
	// Run 1: 1/2, run 2: 2/2: mean 0.75, range 0.5-1. Cost per run: run 1
	// $1, run 2 $0.5: mean $0.75. Tokens: 300 a run. Verified: 4 of 6
	// graded (4 validated, 1 unvalidated, 1 inconsistent).
	if a.Runs != 2 || a.Accuracy != 0.75 || a.AccuracyMin != 0.5 || a.AccuracyMax != 1 || a.CostUSD == nil || *a.CostUSD != 0.75 ||
		a.Tokens != 300 || a.WallSeconds != 6 || a.CPUSeconds != 4 || math.Abs(a.CrossCheckedShare-4.0/6) > 1e-12 ||
		a.Validated != 4 || a.Unvalidated != 1 || a.Inconsistent != 1 || a.InfraFailed != 1 {
		t.Fatalf("row a: %+v", a)
	}
	if d := rows["d"]; d.CostUSD != nil || !d.Pareto || d.Accuracy != 1 || d.Pending != 1 {
		t.Fatalf("row d (no cost): %+v", d)
	}
	// d has no model cost, so the board is weighed on CPU time (a run of
	// a: 4 s, of b, c, d: 2 s): d (2 s, 100%) dominates the others.
	if boards[0].CostAxis != CostCompute || rows["a"].Pareto || rows["b"].Pareto || rows["c"].Pareto {
		t.Fatalf("pareto on CPU time (%s): a %v b %v c %v", boards[0].CostAxis, rows["a"].Pareto, rows["b"].Pareto, rows["c"].Pareto)
	}
	// Without d, on model cost: a ($0.75, 75%) and b ($0.20, 50%) are on
	// the frontier; c ($2, 0%) is dominated.
	var metered []Entry
	for _, e := range sampleEntries() {
		if e.Agent != "d" {
			metered = append(metered, e)
		}
	}
	mrows := map[string]Row{}
	mb := BuildBoards(metered)[0]
	for _, r := range mb.Rows {
		mrows[r.Agent] = r
	}
	if mb.CostAxis != CostModel || !mrows["a"].Pareto || !mrows["b"].Pareto || mrows["c"].Pareto {
		t.Fatalf("pareto on model cost: a %v b %v c %v", mrows["a"].Pareto, mrows["b"].Pareto, mrows["c"].Pareto)
	}
	if got := boards[0].Rows[0].Agent; got != "d" {
		t.Fatalf("first row %s, want the most accurate (d)", got)
	}
	if hard := boards[1].Rows[0]; hard.Runs != 0 || hard.Pending != 1 || hard.AccuracyMin != 0 {
		t.Fatalf("hard board row: %+v", hard)
	}
	// Two scorings never share a board.
	es := sampleEntries()
	es[0].Scoring = "g=2"
	if got := len(BuildBoards(es)); got != 3 {
		t.Fatalf("%d boards with a second scoring, want 3", got)
	}
}

func TestTaskResults(t *testing.T) {
	rows := TaskResults(sampleEntries(), "a")
	if len(rows) != 5 || rows[0].Task != "t1" || len(rows[0].Runs) != 2 || rows[0].Runs[1].Run != 2 || *rows[0].Runs[1].Value != 1 {
		t.Fatalf("task rows %+v", rows)
	}
	if only := OnlyAgent(BuildBoards(sampleEntries()), "b"); len(only) != 1 || len(only[0].Rows) != 1 || only[0].Rows[0].Agent != "b" {
		t.Fatalf("OnlyAgent: %+v", only)
	}
}

// TestCreditFormat: the operator bars and the tables give one figure
// alike, never 0 for a small non-zero credit.
func TestCreditFormat(t *testing.T) {
	bars := CreditBars([]Credit{{Name: "op", CPUHours: 0.0002}, {Name: "op2", CPUHours: 0.00023456}, {Name: "op3", CPUHours: 1.5}}, 12, 100)
	for i, want := range []string{"0.0002 CPU-h", "0.000235 CPU-h", "1.5000 CPU-h"} {
		if bars[i].Value != want {
			t.Errorf("bar %d: %q, want %q", i, bars[i].Value, want)
		}
	}
	for h, want := range map[float64]string{0: "0.0000", 0.0002: "0.0002", 0.01: "0.0100", 12.34567: "12.3457"} {
		if got := Hours(h); got != want {
			t.Errorf("Hours(%v) = %q, want %q", h, got, want)
		}
	}
}

func TestSumCredit(t *testing.T) {
	total, nodes, ops := SumCredit([]CreditInput{
		{Node: "n1", Operator: "op", CPUSeconds: 3600, WallSeconds: 7200},
		{Node: "n2", Operator: "op", CPUSeconds: 1800},
		{Node: "n3", CPUSeconds: 36000},
	})
	if total.Attempts != 3 || total.CPUHours != 11.5 || total.WallHours != 2 {
		t.Fatalf("total %+v", total)
	}
	if len(nodes) != 3 || nodes[0].Name != "n3" || nodes[2].Name != "n2" {
		t.Fatalf("nodes %+v", nodes)
	}
	if len(ops) != 2 || ops[0].Name != "n3" || ops[1].Name != "op" || ops[1].CPUHours != 1.5 || ops[1].Attempts != 2 {
		t.Fatalf("operators %+v", ops)
	}
}

func TestMessages(t *testing.T) {
	openai := `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"what is in results/?"},{"type":"image_url"}]},{"role":"tool","content":"ls: ok"}]}`
	got := RequestMessages([]byte(openai))
	if len(got) != 3 || got[0].Role != "system" || got[1].Content != "what is in results/?\n[image]" || got[2].Content != "ls: ok" {
		t.Fatalf("openai request: %+v", got)
	}
	answer := `{"choices":[{"message":{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"shell","arguments":"{\"cmd\":\"ls\"}"}}]}}]}`
	if got := ResponseMessages([]byte(answer)); len(got) != 1 || got[0].ToolCalls[0].Name != "shell" || got[0].ToolCalls[0].Arguments != `{"cmd":"ls"}` {
		t.Fatalf("openai answer: %+v", got)
	}
	anthropic := `{"system":[{"type":"text","text":"sys"}],"messages":[{"role":"user","content":[{"type":"tool_result","content":"42"}]}]}`
	if got := RequestMessages([]byte(anthropic)); len(got) != 2 || got[0].Content != "sys" || got[1].Content != "[tool result] 42" {
		t.Fatalf("anthropic request: %+v", got)
	}
	reply := `{"role":"assistant","content":[{"type":"text","text":"done"},{"type":"tool_use","name":"bash","input":{"c":1}}]}`
	if got := ResponseMessages([]byte(reply)); len(got) != 1 || got[0].Content != "done" || got[0].ToolCalls[0].Name != "bash" {
		t.Fatalf("anthropic answer: %+v", got)
	}
	if RequestMessages([]byte("not json")) != nil {
		t.Fatal("garbage read as messages")
	}
}

func TestParetoPlot(t *testing.T) {
	b := BuildBoards(sampleEntries())[0]
	// d has no metered model cost: the board is weighed on CPU time, and
	// every agent with a run is on the chart.
	p := ParetoPlot(b)
	if b.CostAxis != CostCompute || p == nil || len(p.Points) != 4 || p.Unmetered != 1 || p.XLabel != "compute per run (CPU time)" {
		t.Fatalf("plot %+v", p)
	}
	for _, pt := range p.Points {
		if pt.X < p.Left || pt.X > p.Right || pt.Y < p.Top || pt.Y > p.Bottom {
			t.Fatalf("point %+v outside the plot", pt)
		}
	}
	// On CPU time (b and c and d: 2 s a run, a: 4 s), d (100%) dominates
	// every other: the frontier is d alone.
	if pts := strings.Fields(p.Frontier); len(pts) != 1 {
		t.Fatalf("frontier %q", p.Frontier)
	}
	// Without d, every row has a model cost: the frontier on model cost
	// runs from b (cheapest) to a.
	var metered []Entry
	for _, e := range sampleEntries() {
		if e.Agent != "d" {
			metered = append(metered, e)
		}
	}
	b = BuildBoards(metered)[0]
	if p = ParetoPlot(b); b.CostAxis != CostModel || p == nil || len(p.Points) != 3 || p.Unmetered != 0 || len(strings.Fields(p.Frontier)) != 2 ||
		p.XLabel != "model cost per run (USD)" {
		t.Fatalf("metered plot %+v", p)
	}
	if ParetoPlot(Board{Rows: []Row{{Agent: "x", Runs: 0}}}) != nil {
		t.Fatal("a plot without any run")
	}
	// One point: its label is anchored so that it ends inside the chart.
	one := ParetoPlot(Board{CostAxis: CostModel, Rows: []Row{{Agent: "a-rather-long-agent-name", Model: "some-model", Runs: 1, Accuracy: 1, CostUSD: f(0.012)}}})
	if pt := one.Points[0]; pt.X <= (one.Left+one.Right)/2 || pt.Anchor != "end" || pt.LX >= pt.X || pt.LY <= one.Top {
		t.Fatalf("one point %+v in %+v: its label may run out of the chart", pt, one)
	}
}

// TestRender renders every page with data, checks each is well-formed
// markup (its SVG charts parse as XML), escapes what it shows, carries the
// security headers and no script.
func TestRender(t *testing.T) {
	site, err := New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	evil := `<script>alert(1)</script>`
	es := sampleEntries()
	es = append(es, Entry{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: evil, Task: "t1", Run: 1, Status: "validated", Value: f(1), CostUSD: f(0.3)})
	boards := BuildBoards(es)
	who := Who{Scope: "submitter", Submitter: "ann", Group: "lab-a", CSRF: "tok"}
	prog := Progress{Pending: 2, Done: 3, Failed: 1, Total: 6, Units: 3, Decided: 1}
	att := Attempt{ID: "ah-1", Suite: "s", Task: "t1", Variant: "easy", Agent: "a", State: "done", Outcome: "ok",
		Usage: &Usage{CPUSeconds: 1, WallSeconds: 2, PeakMemoryBytes: 1 << 20}, Score: &Score{Value: 1, Public: []byte(`{"x":1}`)},
		Outputs: []Output{{Path: "report.json", Size: 10}}, Model: &ModelUse{Calls: 1, CostUSD: 0.01}}
	pages := []Page{
		BoardsPage{Base: Base{who}, Boards: boards, Taken: time.Now()},
		AgentPage{Base: Base{who}, Agent: "a", Boards: OnlyAgent(boards, "a"), Tasks: TaskResults(es, "a")},
		EvaluationsPage{Base: Base{who}, Evaluations: []Evaluation{{ID: "ev-1", Suite: "s", Agent: "a", Progress: prog}},
			Suites: []Suite{{Name: "s", Variants: []string{"easy"}, Tasks: 2}}, Agents: []Agent{{Name: "a"}}},
		EvaluationPage{Base: Base{who}, Eval: EvaluationDetail{Evaluation: Evaluation{ID: "ev-1", Progress: prog}, Attempts: []Attempt{att}, Boards: boards}},
		AttemptPage{Base: Base{who}, Attempt: att, Logs: &Logs{Stdout: evil, Stderr: "err"}, Trajectory: []Call{{Seq: 0, Assignment: 1,
			Request: []Message{{Role: "user", Content: "hi"}}, Response: []Message{{Role: "assistant", Content: evil}}, RequestBody: `{"a":1}`}}},
		NodesPage{Base: Base{Who{Scope: "admin"}}, Credit: CreditReport{Total: Credit{CPUHours: 1}, Operators: []Credit{{Name: "op", CPUHours: 1}},
			Nodes: []NodeRow{{Credit: Credit{Name: "n1", CPUHours: 1}}}}},
		ReprosPage{Base: Base{Who{Scope: "admin"}}, Repros: []Repro{{ID: "rp-1", State: "done"}}},
		ReproPage{Base: Base{who}, Repro: Repro{ID: "rp-1", State: "done", Questions: []ReproQuestion{{Question: "q", Values: []string{"1", "2"},
			Interval: &Interval{N: 2, Mean: 1.5, Lower: 0, Upper: 3}, Reproduced: true}}}},
		AgentsPage{Base: Base{who}, Agents: []Agent{{Name: "a", Size: 2048}}},
		AccountsPage{Base: Base{Who{Scope: "admin"}}, Groups: []Group{{Name: "g"}}, Submitters: []Submitter{{Name: "s"}}, Tokens: []Token{{ID: "x"}}},
		LoginPage{Base: Base{}, Error: evil},
		ErrorPage{Base: Base{}, Status: 404, Message: "no"},
	}
	for _, pg := range pages {
		rec := httptest.NewRecorder()
		site.Render(rec, http.StatusOK, pg)
		body := rec.Body.String()
		if rec.Code != 200 || !strings.Contains(body, "<title>") {
			t.Fatalf("%s: %d %s", pg.template(), rec.Code, body)
		}
		if strings.Contains(body, "<script") {
			t.Fatalf("%s: unescaped markup or a script in the page", pg.template())
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'none'") {
			t.Fatalf("%s: CSP %q", pg.template(), csp)
		}
		for _, svg := range between(body, "<svg", "</svg>") {
			if err := xml.Unmarshal([]byte(svg), new(struct{})); err != nil {
				t.Fatalf("%s: SVG is not well-formed: %v\n%s", pg.template(), err, svg)
			}
		}
	}
	rec := httptest.NewRecorder()
	site.Render(rec, 200, pages[0])
	if n := strings.Count(rec.Body.String(), `class="pareto"`); n != 1 {
		t.Fatalf("%d Pareto charts on the boards page, want 1 (the hard board has no cost)", n)
	}
}

// between returns every substring from open to the end of close.
func between(s, open, close string) []string {
	var out []string
	for {
		i := strings.Index(s, open)
		if i < 0 {
			return out
		}
		j := strings.Index(s[i:], close)
		if j < 0 {
			return out
		}
		out = append(out, s[i:i+j+len(close)])
		s = s[i+j+len(close):]
	}
}

func TestFormats(t *testing.T) {
	for v, want := range map[float64]string{0: "$0.00", 0.006: "$0.006", 0.012: "$0.012", 0.0125: "$0.0125", 0.00012345: "$0.000123",
		1.5: "$1.50", 0.999: "$0.999", 12.345: "$12.35"} {
		if got := usd(v); got != want {
			t.Errorf("usd(%v) = %q, want %q", v, got, want)
		}
	}
	for v, want := range map[float64]string{0: "—", 1.5: "1.50s", 75: "1m15s", 3600: "1h0m0s"} {
		if got := duration(v); got != want {
			t.Errorf("duration(%v) = %q, want %q", v, got, want)
		}
	}
	if got := byteCount(int64(1536)); got != "1.5 KiB" {
		t.Errorf("byteCount(1536) = %q", got)
	}
}

// TestBoardsVerification: a row counts its validated units of
// model-driven runs (those with a verification state) and those a replay
// verified; boards of two graders are never merged, and name theirs.
func TestBoardsVerification(t *testing.T) {
	es := sampleEntries()
	es[0].Verification, es[1].Verification, es[2].Verification = VerifyVerified, VerifyNotDrawn, VerifyVerified
	es[4].Verification = VerifyVerified // unvalidated: not counted
	b := BuildBoards(es)
	var a Row
	for _, r := range b[0].Rows {
		if r.Agent == "a" {
			a = r
		}
	}
	if a.Sampled != 3 || a.ReplayVerified != 2 {
		t.Fatalf("row a: %d sampled, %d replay-verified; want 3 and 2", a.Sampled, a.ReplayVerified)
	}
	for i := range es {
		if es[i].Agent == "b" {
			es[i].Grader = "g-two@1"
		}
	}
	b = BuildBoards(es)
	if len(b) != 3 || b[1].Grader != "g-two@1" || len(b[1].Rows) != 1 || b[1].Rows[0].Agent != "b" || b[0].Grader != "" {
		t.Fatalf("boards of two graders: %+v", b)
	}
}

// TestRenderVerificationDraftGrader: the boards say which grader a board's
// numbers are and how many sampled runs a replay verified; an attempt says
// where its verification stands in words (never the core's reason, which
// names the node's rate, unless given: the admin's) and labels a replay;
// a draft check shows each value with its file, runs, interval and
// verdict, and links to its draft spec.
func TestRenderVerificationDraftGrader(t *testing.T) {
	site, err := New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	render := func(p Page) string {
		t.Helper()
		rec := httptest.NewRecorder()
		site.Render(rec, 200, p)
		if rec.Code != 200 {
			t.Fatalf("%s: %d", p.template(), rec.Code)
		}
		return rec.Body.String()
	}
	es := sampleEntries()
	for i := range es {
		es[i].Grader = "paperbench-report-failed@1"
	}
	es[0].Verification, es[1].Verification = VerifyVerified, VerifyPending
	body := render(BoardsPage{Boards: BuildBoards(es), Taken: time.Now()})
	for _, want := range []string{`<span class="grader">graded by paperbench-report-failed@1</span>`, ">1 of 2<", "<th>Cross-checked</th>"} {
		if !strings.Contains(body, want) {
			t.Errorf("boards: no %q", want)
		}
	}
	att := Attempt{ID: "ah-1", Suite: "s", Task: "t1", State: "done", Verification: &Verification{State: VerifyVerified, Replays: 2, Benign: 3}}
	body = render(AttemptPage{Attempt: att})
	for _, want := range []string{`data-state="verified"`, "replay-verified, with benign differences", "replayed: 2 times", "3 tool output(s) differed harmlessly",
		"answers bound to the trajectory: yes"} {
		if !strings.Contains(body, want) {
			t.Errorf("verified attempt: no %q", want)
		}
	}
	for state, want := range map[string]string{VerifyUnbound: "answers bound to the trajectory: no", VerifyForged: "forged: not counted",
		VerifyNondeterministic: "unverified: nondeterministic", VerifyReplayFailed: "unverified: replay failed",
		VerifyNotReplayable: "unverified: not replayable", VerifyPending: "unverified: replay running"} {
		att.Verification = &Verification{State: state, Reason: "not drawn (node's rate 0.50)"}
		if body := render(AttemptPage{Attempt: att}); !strings.Contains(body, want) {
			t.Errorf("%s: no %q", state, want)
		}
	}
	att.Verification.Reason = ""
	if body := render(AttemptPage{Attempt: att}); strings.Contains(body, "operator:") {
		t.Error("an attempt without a reason shows the operator's")
	}
	rep := Attempt{ID: "ah-2", Kind: KindReplay, ReplayOf: "ah-1", State: "done"}
	if body := render(AttemptPage{Attempt: rep}); !strings.Contains(body, `replay of <a href="/attempts/ah-1">ah-1</a>`) {
		t.Errorf("replay page: %s", body)
	}
	ev := EvaluationDetail{Evaluation: Evaluation{ID: "ev-1", Progress: Progress{Done: 2, Total: 2, Replays: 1}}, Attempts: []Attempt{att, rep}}
	body = render(EvaluationPage{Eval: ev})
	for _, want := range []string{`data-kind="replay"`, `<span class="kind-replay">replay</span>`, "replays ah-1", "+1 replay<"} {
		if !strings.Contains(body, want) {
			t.Errorf("evaluation: no %q", want)
		}
	}
	draft := Repro{ID: "rp-1", State: "done", Draft: &ReproDraft{Spec: []byte(`{"rules":[]}`), Values: []ReproDraftValue{
		{Question: "n", File: "results/a.txt", Values: []string{"7", "8"}, Verdict: "interval", Interval: &Interval{N: 2, Mean: 7.5, Lower: 1, Upper: 14}},
		{Question: "t", File: "results/a.txt", Values: []string{"2026-01-01", "—"}, Verdict: "missing", Reason: "not in run 2"}}}}
	body = render(ReproPage{Repro: draft})
	for _, want := range []string{`href="/repro/rp-1/draft-spec.json"`, "1 of 2 values kept", `<td class="values">7, 8</td>`, "[1, 14] (mean 7.5, n=2)",
		`data-verdict="missing"`, "not in run 2", "results/a.txt"} {
		if !strings.Contains(body, want) {
			t.Errorf("draft: no %q", want)
		}
	}
}

// TestReproducibleNo: a check that did not reproduce says "no" on its
// page and in the list (a pointer to false is not nil: a template that
// tests it with if or with says yes), one that did says "yes", one not
// decided says neither.
func TestReproducibleNo(t *testing.T) {
	site, err := New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	no, yes := false, true
	for _, c := range []struct {
		verdict *bool
		want    string
	}{{&no, "no"}, {&yes, "yes"}, {nil, ""}} {
		rec := httptest.NewRecorder()
		site.Render(rec, 200, ReproPage{Repro: Repro{ID: "rp-1", State: "done", Reproducible: c.verdict}})
		got := between(rec.Body.String(), `<dd id="reproducible"`, "</dd>")
		switch {
		case c.want == "" && len(got) != 0:
			t.Errorf("undecided check: %q", got)
		case c.want != "" && (len(got) != 1 || !strings.HasSuffix(got[0], ">"+c.want+"</dd>")):
			t.Errorf("check reproducible %v: %q, want %q", *c.verdict, got, c.want)
		}
		rec = httptest.NewRecorder()
		site.Render(rec, 200, ReprosPage{Base: Base{Who{Scope: "admin"}}, Repros: []Repro{{ID: "rp-1", State: "done", Reproducible: c.verdict}}})
		want := `<td class="reproducible">` + cmp.Or(c.want, "—") + `</td>`
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("list, reproducible %v: no %q", c.verdict, want)
		}
	}
}

// TestNoPointerTruthInTemplates: no template tests the truth of a field
// that is a *bool in the views (with, if, and, or, not of it are true for
// a pointer to false); they say it with yesno, or a method.
func TestNoPointerTruthInTemplates(t *testing.T) {
	names := map[string]bool{}
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		for ty.Kind() == reflect.Pointer || ty.Kind() == reflect.Slice || ty.Kind() == reflect.Map {
			ty = ty.Elem()
		}
		if ty.Kind() != reflect.Struct || seen[ty] {
			return
		}
		seen[ty] = true
		for i := range ty.NumField() {
			f := ty.Field(i)
			if f.Type.Kind() == reflect.Pointer && f.Type.Elem().Kind() == reflect.Bool {
				names[f.Name] = true
			}
			walk(f.Type)
		}
	}
	for _, p := range []any{BoardsPage{}, AgentPage{}, EvaluationsPage{}, EvaluationPage{}, AttemptPage{}, NodesPage{}, ReprosPage{},
		ReproPage{}, AgentsPage{}, AccountsPage{}, LoginPage{}, ErrorPage{}, Entry{}} {
		walk(reflect.TypeOf(p))
	}
	if !names["Reproducible"] || !names["Written"] {
		t.Fatalf("*bool fields found: %v", names)
	}
	files, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		t.Fatal(err)
	}
	action := regexp.MustCompile(`\{\{-?\s*(?:if|with|else if|else with)\s+([^}]*)\}\}`)
	for _, name := range files {
		b, _ := templateFS.ReadFile(name)
		for _, m := range action.FindAllStringSubmatch(string(b), -1) {
			for _, field := range regexp.MustCompile(`\.([A-Z]\w*)`).FindAllStringSubmatch(m[1], -1) {
				if names[field[1]] && !strings.Contains(m[1], "yesno") {
					t.Errorf("%s: %s tests the *bool %s", name, m[0], field[1])
				}
			}
		}
	}
}

// TestBoardsHonest: a row without a validated run shows no accuracy (not
// 0%); its units awaiting cross-check and pending are shown as counted;
// written and vision accuracies are shown; cross-checked and
// replay-verified are two columns with their own words.
func TestBoardsHonest(t *testing.T) {
	site, err := New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	es := []Entry{
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "waiting", Task: "t1", Run: 1, Status: "unvalidated", Value: f(1)},
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "waiting", Task: "t2", Run: 1, Status: "unvalidated", Value: f(0)},
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "waiting", Task: "t3", Run: 1, Status: "pending"},
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "done", Task: "t1", Run: 1, Status: "validated", Value: f(0), Written: &yes, Vision: &no},
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "done", Task: "t2", Run: 1, Status: "validated", Value: f(0), Written: &yes},
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "done", Task: "t1", Run: 2, Status: "validated", Value: f(1), Written: &no, Vision: &yes},
	}
	b := BuildBoards(es)
	rows := map[string]Row{}
	for _, r := range b[0].Rows {
		rows[r.Agent] = r
	}
	w, d := rows["waiting"], rows["done"]
	if w.HasAccuracy() || w.Unvalidated != 2 || w.Pending != 1 || w.Graded() != 2 {
		t.Fatalf("waiting row %+v", w)
	}
	// Written: run 1 2/2, run 2 0/1: 50%; vision: run 1 0/1, run 2 1/1: 50%.
	if d.WrittenAccuracy == nil || *d.WrittenAccuracy != 0.5 || d.VisionAccuracy == nil || *d.VisionAccuracy != 0.5 || w.WrittenAccuracy != nil {
		t.Fatalf("written/vision: %+v", d)
	}
	rec := httptest.NewRecorder()
	site.Render(rec, 200, BoardsPage{Boards: b, Taken: time.Now()})
	body := rec.Body.String()
	row := between(body, `<tr data-agent="waiting"`, "</tr>")
	if len(row) != 1 {
		t.Fatalf("no row for waiting: %s", body)
	}
	for _, want := range []string{`<td class="acc">—</td>`, `<td class="range">—</td>`, `<td class="unvalidated">2</td>`, `<td class="pending">1</td>`,
		`<td class="written">—</td>`, `>0 of 2 (0.0%)<`} {
		if !strings.Contains(row[0], want) {
			t.Errorf("waiting row: no %q in %s", want, row[0])
		}
	}
	if strings.Contains(row[0], "0.0%</td>") && !strings.Contains(row[0], "(0.0%)") {
		t.Errorf("a row without a validated run shows an accuracy: %s", row[0])
	}
	row = between(body, `<tr data-agent="done"`, "</tr>")
	for _, want := range []string{`<td class="written">50.0%</td>`, `<td class="vision">50.0%</td>`, `<td class="acc">50.0%</td>`} {
		if len(row) != 1 || !strings.Contains(row[0], want) {
			t.Errorf("done row: no %q in %v", want, row)
		}
	}
	for _, want := range []string{"<th>Cross-checked</th>", "<th>Replay-verified</th>", "<th>Awaiting cross-check</th>"} {
		if !strings.Contains(body, want) {
			t.Errorf("boards: no %q", want)
		}
	}
}

// TestExitCodeOnce: a detail that only repeats the exit code is not shown
// beside it ("exit code 2 (exit code 2)").
func TestExitCodeOnce(t *testing.T) {
	for _, c := range []struct {
		l       Logs
		repeats bool
	}{{Logs{ExitCode: 2, Detail: "exit code 2"}, true}, {Logs{ExitCode: 2, Detail: "killed: out of memory"}, false},
		{Logs{ExitCode: 0, Detail: "exit code 2"}, false}, {Logs{ExitCode: 1}, false}} {
		if got := c.l.DetailRepeatsExit(); got != c.repeats {
			t.Errorf("%+v: repeats %v, want %v", c.l, got, c.repeats)
		}
	}
	site, err := New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	site.Render(rec, 200, AttemptPage{Attempt: Attempt{ID: "ah-1", State: "failed", Outcome: "agent_error", Detail: "exit code 2"},
		Logs: &Logs{Outcome: "agent_error", ExitCode: 2, Detail: "exit code 2"}})
	if got := between(rec.Body.String(), `<p id="exit">`, "</p>"); len(got) != 1 || got[0] != `<p id="exit">exit code 2</p>` {
		t.Errorf("logs line %q", got)
	}
	// A capsule run names its check, with no empty level.
	rec = httptest.NewRecorder()
	site.Render(rec, 200, AttemptPage{Attempt: Attempt{ID: "at-1", Suite: "repro", Task: "rp-1", Repro: "rp-1", Run: 2, State: "done"}})
	if got := between(rec.Body.String(), `<dd id="task">`, "</dd>"); len(got) != 1 || got[0] != `<dd id="task">reproducibility check <a href="/repro/rp-1">rp-1</a> · run 2</dd>` {
		t.Errorf("capsule run's task line %q", got)
	}
}

// TestConversationOnce: a conversation that grows call by call is shown
// once, each call adding what is new; a new conversation (or another
// assignment's) is shown whole; tool calls' arguments and JSON tool
// results are shown indented, never as escaped JSON.
func TestConversationOnce(t *testing.T) {
	sys := Message{Role: "system", Content: "You reproduce papers."}
	u1, u2 := Message{Role: "user", Content: "Step 1"}, Message{Role: "user", Content: "Step 2"}
	call := Message{Role: "assistant", ToolCalls: []ToolCall{{Name: "shell", Arguments: `{"cmd":"cat results/growth.txt"}`}}}
	tool := Message{Role: "tool", Content: `{"n_timepoints": 7}`}
	calls := []Call{
		{Seq: 0, Assignment: 1, Request: []Message{sys, u1}, Response: []Message{call}},
		// The answer sent back with its arguments spaced otherwise.
		{Seq: 1, Assignment: 1, Request: []Message{sys, u1, {Role: "assistant", ToolCalls: []ToolCall{{Name: "shell", Arguments: `{ "cmd": "cat results/growth.txt" }`}}}, tool, u2},
			Response: []Message{{Role: "assistant", Content: "7"}}},
		{Seq: 2, Assignment: 1, Request: []Message{sys, u2}},
		{Seq: 3, Assignment: 2, Request: []Message{sys, u2}},
	}
	MarkNew(calls)
	for i, want := range []int{0, 3, 0, 0} {
		if calls[i].NewFrom != want {
			t.Errorf("call %d: new from %d, want %d", i, calls[i].NewFrom, want)
		}
	}
	if got := calls[1].NewRequest(); len(got) != 2 || got[0].Role != "tool" || got[1].Content != "Step 2" {
		t.Errorf("call 1's new messages %+v", got)
	}
	site, err := New(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	site.Render(rec, 200, AttemptPage{Attempt: Attempt{ID: "ah-1", State: "done"}, Trajectory: calls[:2]})
	body := rec.Body.String()
	if n := strings.Count(body, "You reproduce papers."); n != 1 {
		t.Errorf("the system prompt shown %d times, want once", n)
	}
	for _, want := range []string{"{\n  &#34;cmd&#34;: &#34;cat results/growth.txt&#34;\n}", "{\n  &#34;n_timepoints&#34;: 7\n}", `data-earlier="3"`, ">tool result<"} {
		if !strings.Contains(body, want) {
			t.Errorf("no %q in the trajectory", want)
		}
	}
}

// TestTwoEvaluationsTwoRuns: run 1 of two evaluations are two runs on a
// board, as the families' boards count them.
func TestTwoEvaluationsTwoRuns(t *testing.T) {
	es := []Entry{
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "a", Task: "t1", Run: 1, Status: "validated", Value: f(1), Eval: "ev-1"},
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "a", Task: "t2", Run: 1, Status: "validated", Value: f(1), Eval: "ev-1"},
		{Suite: "s", Variant: "easy", Scoring: "g", Agent: "a", Task: "t1", Run: 1, Status: "validated", Value: f(0), Eval: "ev-2"},
	}
	if r := BuildBoards(es)[0].Rows[0]; r.Runs != 2 || r.Accuracy != 0.5 || r.AccuracyMin != 0 || r.AccuracyMax != 1 {
		t.Fatalf("row %+v", r)
	}
}
