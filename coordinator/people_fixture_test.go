package coordinator

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// people is a coordinator with real finished evaluations of two groups,
// as people reach it over HTTP: lab-a's submitter ann evaluated agent
// solver-a (two runs of the sample suite's easy level; it gets the first
// task wrong in run 1, and makes two model calls an attempt), lab-b's bob
// evaluated solver-b (one run; it gets the second task wrong, one model
// call an attempt). Two wire nodes of distinct operators ran every
// replica, calling the metered gateway (in front of modelsim) through
// their node-local endpoints; then a third node was given a canary of
// lab-a's work. carl of lab-a was revoked.
//
// Then the hard cases the pages must tell truly: ann evaluated solver-a a
// second time (evA2: the medium level, one run: its page shows its own
// run only, and evA's shows none of it); lab-c's dee pushed two free
// agents (no model calls): solver-free, evaluated once (validated, no
// model cost: the board weighs CPU time), and solver-wait, which the
// admin evaluated with 4 replicas on the 3 nodes, so that its units stay
// scored but awaiting cross-check (a board row without a validated run).
type people struct {
	c   *Coordinator
	srv *httptest.Server
	// Tokens.
	admin, ann, bob, carl, dee string
	// evA and evB are the two evaluations; evA2 solver-a's second,
	// evFree solver-free's, evWait solver-wait's.
	evA, evB, evA2, evFree, evWait string
	// tasks are the sample suite's tasks, sorted.
	tasks []string
	// canary is the canary's attempt ID (lab-a's group).
	canary string
	// repro is a reproducibility check whose three runs gave 7, 7 and 8
	// time points (the capsule published 7: reproduced); failed one that
	// also asks for the seed (runs 42, published 41: not reproduced);
	// draft one without rules (a draft check) of the same capsule, whose
	// runs' results/growth.txt held n_timepoints 7, 7 and 8, seed 42,
	// fixed_seed_random 0.166599 and the time they ran, where the capsule
	// published 7, 41 and 0.178395 (and files no run writes).
	repro, failed, draft string
	nodes                []*wireNode
}

const (
	peopleAdmin = "people-admin-token-0123456789"
	// Each model call: 1000 input tokens at $1/M and 250 output at $4/M.
	callUSD = 0.002
)

// newPeople builds the fixture.
func newPeople(t *testing.T) *people {
	t.Helper()
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Second)
	defer cancel()
	c, _ := modelCoordinator(t, modelsim.Sequence(modelsim.Reply{Content: "the figure is 0.96",
		Usage: modelsim.Usage{Prompt: 1000, Completion: 250}}), func(cfg *Config) {
		cfg.AdminToken = peopleAdmin
		cfg.OpenOperators = true
	})
	f := &people{c: c, admin: peopleAdmin}
	f.srv = httptest.NewServer(c.Handler())
	t.Cleanup(f.srv.Close)

	f.post(t, f.admin, "/api/groups", `{"name":"lab-a","max_pending":100}`, nil)
	f.post(t, f.admin, "/api/groups", `{"name":"lab-b","max_pending":100}`, nil)
	f.post(t, f.admin, "/api/groups", `{"name":"lab-c","max_pending":100}`, nil)
	for _, s := range []struct {
		name, group string
		token       *string
	}{{"ann", "lab-a", &f.ann}, {"bob", "lab-b", &f.bob}, {"carl", "lab-a", &f.carl}, {"dee", "lab-c", &f.dee}} {
		var resp NewTokenResponse
		f.post(t, f.admin, "/api/submitters", fmt.Sprintf(`{"name":%q,"group":%q}`, s.name, s.group), &resp)
		*s.token = resp.Token
	}
	f.post(t, f.admin, "/api/submitters/carl/revoke", "", nil)
	f.pushAgent(t, f.ann, "solver-a", "sim-1")
	f.pushAgent(t, f.bob, "solver-b", "sim-1")
	f.pushAgent(t, f.dee, "solver-free", "")
	f.pushAgent(t, f.dee, "solver-wait", "")

	s, _ := c.catalog.LookupSuite(testSuite)
	for id := range s.Tasks {
		f.tasks = append(f.tasks, id)
	}
	slices.Sort(f.tasks)
	for range 2 {
		w := newWireNode(ctx, t, c, 4)
		w.report = f.agentRun(w)
		f.nodes = append(f.nodes, w)
	}
	runCtx, stop := context.WithCancel(context.Background())
	t.Cleanup(stop)
	for _, w := range f.nodes {
		w.announceEvery(runCtx, time.Second)
	}
	var ev EvaluationResponse
	f.post(t, f.ann, "/api/evaluations", `{"suite":"sample","agent":"solver-a","levels":["easy"],"runs":2,"models":["sim-1"]}`, &ev)
	f.evA = ev.ID
	f.post(t, f.bob, "/api/evaluations", `{"suite":"sample","agent":"solver-b","levels":["easy"],"models":["sim-1"]}`, &ev)
	f.evB = ev.ID
	waitUntil(ctx, t, "every unit decided", func() bool {
		p := c.Progress()
		return p.Units == 9 && p.Decided == p.Units && p.Queued+p.Assigned+p.Reported == 0
	})

	// A third node is given a canary of lab-a's work, and runs it.
	w3 := newWireNode(ctx, t, c, 1)
	w3.report = f.agentRun(w3)
	w3.announce(ctx)
	f.nodes = append(f.nodes, w3)
	// Canaries replay validated units at random: probe until one replays
	// lab-a's work (the others are run and kept).
	for range 9 {
		fx, _ := c.step(ctx, core.Probe{Node: w3.id().String()})
		id, ok := fx.Reply.(string)
		if !ok {
			t.Fatalf("no canary for the third node: %v", fx.Reply)
		}
		c.kick()
		waitUntil(ctx, t, "the canary done", func() bool {
			a, _ := c.Attempt(id)
			return a.State == StateDone
		})
		if a, _ := c.Attempt(id); a.Group == "lab-a" {
			if a.Model == nil {
				t.Fatalf("canary %s made no model call", id)
			}
			f.canary = id
			break
		}
	}
	if f.canary == "" {
		t.Fatal("no canary of lab-a's work in 9 probes")
	}

	// A reproducibility check of a sample capsule: three runs on the three
	// nodes, each returning the rule's file.
	w3.announceEvery(runCtx, time.Second)
	tb := publishedCapsule(t)
	spec := `{"capsule": {"field": "F", "language": "Shell", "capsule_title": "T", "capsule_id": "capsule-0000002", "capsule_doi": "", "task_prompt": "Run it."},
	 "rules": [{"question": "Report the number of time points.", "file": "results/growth.txt", "kind": "regex", "expr": "(?m)^n_timepoints (\\S+)$", "type": "number"}]}`
	body, ct := reproBody(t, spec, tb)
	code, resp := f.request(f.admin, "POST", "/api/repro", strings.NewReader(body), ct)
	var rr ReproResponse
	if code != 200 || json.Unmarshal([]byte(resp), &rr) != nil {
		t.Fatalf("submit a check: %d %s", code, resp)
	}
	f.repro = rr.ID
	// A check that fails: the seed the capsule published is not the runs'.
	spec = `{"capsule": {"field": "F", "language": "Shell", "capsule_title": "T", "capsule_id": "capsule-0000002", "capsule_doi": "", "task_prompt": "Run it."},
	 "rules": [{"question": "Report the number of time points.", "file": "results/growth.txt", "kind": "regex", "expr": "(?m)^n_timepoints (\\S+)$", "type": "number"},
	           {"question": "Report the seed.", "file": "results/growth.txt", "kind": "regex", "expr": "(?m)^seed (\\S+)$", "type": "number"}]}`
	body, ct = reproBody(t, spec, tb)
	code, resp = f.request(f.admin, "POST", "/api/repro", strings.NewReader(body), ct)
	if code != 200 || json.Unmarshal([]byte(resp), &rr) != nil {
		t.Fatalf("submit a failing check: %d %s", code, resp)
	}
	f.failed = rr.ID
	// A draft check: the same capsule without rules.
	spec = `{"capsule": {"field": "F", "language": "Shell", "capsule_title": "T", "capsule_id": "capsule-0000002", "capsule_doi": "", "task_prompt": "Run it."}}`
	body, ct = reproBody(t, spec, tb)
	code, resp = f.request(f.admin, "POST", "/api/repro", strings.NewReader(body), ct)
	if code != 200 || json.Unmarshal([]byte(resp), &rr) != nil {
		t.Fatalf("submit a draft check: %d %s", code, resp)
	}
	f.draft = rr.ID
	c.kick()
	for _, id := range []string{f.repro, f.failed, f.draft} {
		waitUntil(ctx, t, "the check done", func() bool {
			st, err := c.ReproStatus(ctx, id)
			return err == nil && st.State == ReproDone
		})
	}

	t.Logf("fixture: first evaluations, canary and checks done in %v", time.Since(began).Round(time.Millisecond))
	// The hard cases: a second evaluation of solver-a, a free agent's, and
	// one whose units wait for a fourth replica no node can run.
	f.post(t, f.ann, "/api/evaluations", `{"suite":"sample","agent":"solver-a","levels":["medium"],"models":["sim-1"]}`, &ev)
	f.evA2 = ev.ID
	f.post(t, f.dee, "/api/evaluations", `{"suite":"sample","agent":"solver-free","levels":["easy"]}`, &ev)
	f.evFree = ev.ID
	f.post(t, f.admin, "/api/evaluations", `{"suite":"sample","agent":"solver-wait","levels":["easy"],"replicas":4,"group":"lab-c"}`, &ev)
	f.evWait = ev.ID
	c.kick()
	waitUntil(ctx, t, "the second evaluations decided, the waiting one scored", func() bool {
		decided, waiting := 0, 0
		for _, e := range c.LeaderboardEntries() {
			switch {
			case (e.Eval == f.evA2 || e.Eval == f.evFree) && e.Status == "validated":
				decided++
			case e.Eval == f.evWait && (e.Status == "unvalidated" || e.Status == "infra_failed"):
				// Scored and awaiting its fourth replica (or, should the
				// wait for a node that will never come be cut short, ended
				// without a validated run): either way no accuracy.
				waiting++
			}
		}
		return decided == 2*len(f.tasks) && waiting == len(f.tasks)
	})
	waitUntil(ctx, t, "every replica of the waiting units reported", func() bool {
		n := 0
		for _, a := range f.attemptsOf(f.evWait) {
			if a.State == StateDone && a.Kind != KindReplay {
				n++
			}
		}
		return n == 3*len(f.tasks)
	})
	// Every replay decided (a scored result is replayed whatever the
	// node's rate), so that a page and the API read later say the same.
	waitUntil(ctx, t, "every replay decided", func() bool {
		for _, a := range c.AllAttempts() {
			if a.Kind == KindReplay && (a.State == StateQueued || a.State == StateAssigned || a.State == StateReported) {
				return false
			}
			if a.Verification != nil && a.Verification.State == core.VerifyPending {
				return false
			}
		}
		return true
	})
	t.Logf("fixture: made in %v", time.Since(began).Round(time.Millisecond))
	return f
}

// publishedCapsule is the sample capsule-0000002 as its author published
// it: its results/growth.txt says 7 time points, seed 41 and
// fixed_seed_random 0.178395 (the runs give 7 or 8, 42 and 0.166599).
func publishedCapsule(t *testing.T) []byte {
	t.Helper()
	tb, err := sample.CapsuleTarball("capsule-0000002")
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(tb))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	tr, tw := tar.NewReader(zr), tar.NewWriter(&out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(tr)
		if h.Name == "capsule-0000002/results/growth.txt" {
			data = []byte("n_timepoints 7\nseed 41\nfixed_seed_random 0.178395\n")
			h.Size = int64(len(data))
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write(data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

// agentRun is what the wire node w does with an assignment: the agent's
// model calls through the node's endpoint, then a report.
func (f *people) agentRun(w *wireNode) func(*proto.Assignment) *proto.Report {
	return func(asg *proto.Assignment) *proto.Report {
		a, _ := f.c.Attempt(asg.GetAttemptId())
		if a.Kind == KindCapsuleRun {
			return f.capsuleRun(w, asg)
		}
		calls := 1
		if a.Agent == "solver-a" {
			calls = 2
		}
		answer := f.answer(a)
		// solver-a and solver-b call a model; solver-free and solver-wait
		// do not (free agents: no model cost).
		if tok := asg.GetModelToken(); tok != "" && (a.Agent == "solver-a" || a.Agent == "solver-b") {
			if err := agentCalls(w, asg.GetAttemptId(), tok, calls, answer); err != nil {
				w.t.Errorf("model calls of %s: %v", asg.GetAttemptId(), err)
			}
		}
		r := w.okReport(asg, answer)
		r.StdoutTail = []byte(fmt.Sprintf("agent %s on %s, run %d\nreading results/\n", a.Agent, a.TaskID, a.Run))
		r.StderrTail = []byte("warning: nothing to worry about\n")
		if a.Agent == "solver-a" { // what the node's egress proxy saw
			r.Egress = []*proto.EgressHost{{Host: "pypi.org", Connections: 3, BytesSent: 2048, BytesReceived: 1 << 20},
				{Host: "answers.example", Refused: 2}}
			r.EgressHostsOmitted = 1
			r.Usage.EgressRefused = 2
		}
		return r
	}
}

// capsuleRun is a capsule's run script's report: the file its check
// reads, with 7 time points on two nodes and 8 on the third; for a draft
// check, the results/ folder holding that file with a seed and the time.
func (f *people) capsuleRun(w *wireNode, asg *proto.Assignment) *proto.Report {
	r := w.okReport(asg, "")
	n := 7
	if w == f.nodes[len(f.nodes)-1] && len(f.nodes) == 3 {
		n = 8
	}
	out := asg.GetRecipe().GetOutputs()[0]
	path := out.GetPath()
	content := []byte(fmt.Sprintf("n_timepoints %d\nseed 42\nfixed_seed_random 0.166599\n", n))
	if out.GetDirectory() {
		var tb bytes.Buffer
		tw := tar.NewWriter(&tb)
		file := fmt.Sprintf("n_timepoints %d\nseed 42\nfixed_seed_random 0.166599\nfinished %s\n", n, time.Now().UTC().Format(time.RFC3339Nano))
		_ = tw.WriteHeader(&tar.Header{Name: "growth.txt", Mode: 0o644, Size: int64(len(file)), Typeflag: tar.TypeReg})
		_, _ = tw.Write([]byte(file))
		_ = tw.Close()
		content = tb.Bytes()
	}
	info, err := w.store.Add(context.Background(), bytes.NewReader(content))
	if err != nil {
		w.t.Errorf("capsule run output: %v", err)
	}
	r.Outputs = []*proto.OutputRef{{Path: path, Cid: info.CID.Bytes(), Size: uint64(info.Size)}}
	return r
}

// answer is the agent's report.json: the task's gold answers, but for
// solver-a's run 1 of the first task and solver-b's second task, which
// they get wrong.
func (f *people) answer(a Attempt) string {
	wrong := (a.Agent == "solver-a" && a.Run == 1 && a.TaskID == f.tasks[0]) || (a.Agent == "solver-b" && a.TaskID == f.tasks[1])
	if wrong {
		return `{"nothing": 0}`
	}
	s, _ := f.c.catalog.LookupSuite(a.Suite)
	task, _ := s.Bench.(*family.Suite).Task(a.TaskID)
	b, _ := json.Marshal(task.Results[0])
	return string(b)
}

// agentCalls makes n chat calls through a node-local endpoint of w for
// attempt, as its agent would, each showing the model the output of a
// tool that read the answers (so that the answers are bound to the
// trajectory, as issue 13 requires of a model-driven result).
func agentCalls(w *wireNode, attempt, token string, n int, answers string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := modelnet.StartProxy(context.Background(), w.h, w.c.ID(), addr, modelnet.ProxyOptions{Attempt: attempt}, testLog(w.t))
	if err != nil {
		return err
	}
	defer p.Close()
	// One conversation, growing call by call as a chat agent's does: each
	// call sends what came before, the model's last answer, and its step.
	messages := []string{`{"role":"system","content":"You reproduce papers."}`}
	for i := range n {
		tool, _ := json.Marshal(answers)
		if i > 0 {
			messages = append(messages, `{"role":"assistant","content":"the figure is 0.96"}`)
		}
		messages = append(messages, fmt.Sprintf(`{"role":"user","content":"Step %d: what is in results/?"}`, i+1),
			fmt.Sprintf(`{"role":"tool","tool_call_id":"call_%d","content":%s}`, i+1, tool))
		body := `{"model":"sim-1","messages":[` + strings.Join(messages, ",") + `]}`
		req, _ := http.NewRequest("POST", "http://"+addr+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("call %d: %d %s", i, resp.StatusCode, b)
		}
	}
	return nil
}

// pushAgent pushes a small real OCI image as agent name with token.
func (f *people) pushAgent(t *testing.T, token, name, model string) {
	t.Helper()
	var img bytes.Buffer
	if _, err := ociimage.Build(&img, "repronet.local/agents/"+name+":test", []ociimage.File{
		{Path: "/agent/run", Mode: 0o755, Data: []byte("#!/bin/sh\necho " + name + "\n")}}, ociimage.Config{Entrypoint: []string{"/agent/run"}}); err != nil {
		t.Fatal(err)
	}
	code, body := f.request(token, "POST", "/api/agents?name="+name+"&deterministic=1&model="+model, &img, "application/x-tar")
	if code != 200 {
		t.Fatalf("push %s: %d %s", name, code, body)
	}
}

// request sends a request to the fixture's server and returns the status
// and body.
func (f *people) request(token, method, path string, body io.Reader, contentType string) (int, string) {
	req, _ := http.NewRequest(method, f.srv.URL+path, body)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// post posts JSON and decodes the answer into out, failing on anything
// but 200.
func (f *people) post(t *testing.T, token, path, body string, out any) {
	t.Helper()
	code, resp := f.request(token, "POST", path, strings.NewReader(body), "application/json")
	if code != 200 {
		t.Fatalf("POST %s: %d %s", path, code, resp)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(resp), out); err != nil {
			t.Fatalf("POST %s: %v", path, err)
		}
	}
}

// get gets path with token into out, failing on anything but 200.
func (f *people) get(t *testing.T, token, path string, out any) {
	t.Helper()
	code, resp := f.request(token, "GET", path, nil, "")
	if code != 200 {
		t.Fatalf("GET %s: %d %s", path, code, resp)
	}
	if err := json.Unmarshal([]byte(resp), out); err != nil {
		t.Fatalf("GET %s: %v: %s", path, err, resp)
	}
}

// attemptsOf returns the attempts of evaluation ev (never canaries).
func (f *people) attemptsOf(ev string) []Attempt {
	var out []Attempt
	for _, a := range f.c.Attempts() {
		if a.Eval == ev {
			out = append(out, a)
		}
	}
	return out
}
