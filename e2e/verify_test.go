package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/verify"
)

// Scripted models of the verification matrix (one per behaviour of the
// tools the agent is asked to run).
const (
	// modelDet has the agent print the capsule's results: deterministic.
	modelDet = "verify-det"
	// modelNoisy has it print them beside a timestamp, a random draw and a
	// UUID: an honest run whose tool results differ from run to run.
	modelNoisy = "verify-noisy"
	// modelBlind has it list the results folder only: an honest run cannot
	// see the answers (and submits none), so an answer can only come from
	// a tool result the node forged.
	modelBlind = "verify-blind"
)

// resultsCommand prints the capsule's results, regenerated when the level
// emptied them (as the demo's scripted model does, without the model
// environment).
const resultsCommand = `if [ -z "$(ls -A /results 2>/dev/null)" ]; then
  if [ -f /code/run ]; then (cd /code && sh run); else
    e=$(sed -n 's/^Entry point: ` + "`" + `\(.*\)` + "`" + `.*$/\1/p' /code/README.md | head -n 1); (cd /code && sh -c "$e"); fi
fi
for f in /results/*; do echo "== $f"; cat "$f"; done`

// verifyTask is what the scripted model and the forging node know of a
// sample task: a phrase of its prompt naming its first question's result,
// the result line that answers it, and its gold answers.
type verifyTask struct {
	capsule, marker, line string
	answers               json.RawMessage
}

func verifyTasks(t *testing.T) []verifyTask {
	t.Helper()
	tasks, err := corebench.ParseTasks(sample.Tasks())
	if err != nil {
		t.Fatal(err)
	}
	var out []verifyTask
	for _, task := range tasks {
		q := task.Results[0].Questions()[0]
		i, j := strings.Index(q, "(`"), strings.Index(q, "` in results/")
		if i < 0 || j < i {
			t.Fatalf("task %s: question %q names no result", task.CapsuleID, q)
		}
		key := q[i+2 : j]
		file := strings.TrimSuffix(strings.TrimSuffix(q[j+len("` in results/"):], ")."), ")")
		tb, err := sample.CapsuleTarball(task.CapsuleID)
		if err != nil {
			t.Fatal(err)
		}
		body := tarballFile(t, tb, path.Join(task.CapsuleID, "results", file))
		vt := verifyTask{capsule: task.CapsuleID, marker: "`" + key + "` in results/" + file}
		for _, l := range strings.Split(body, "\n") {
			if strings.HasPrefix(l, key+" ") {
				vt.line = l
			}
		}
		if vt.line == "" {
			t.Fatalf("task %s: results/%s has no line %q", task.CapsuleID, file, key)
		}
		if vt.answers, err = json.Marshal(task.Results[0]); err != nil {
			t.Fatal(err)
		}
		out = append(out, vt)
	}
	return out
}

func tarballFile(t *testing.T, tgz []byte, name string) string {
	t.Helper()
	gz, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	for {
		h, err := tr.Next()
		if err != nil {
			t.Fatalf("no %s in the tarball: %v", name, err)
		}
		if path.Clean(strings.TrimPrefix(h.Name, "./")) == name {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			return string(b)
		}
	}
}

// verifyScript scripts the three models: asked a task, each has the agent
// run its command; shown a tool result holding the task's result line, it
// submits the task's answers; shown another, it submits none.
func verifyScript(tasks []verifyTask) modelsim.Script {
	var s modelsim.Script
	for model, cmd := range map[string]string{
		modelDet:   resultsCommand,
		modelNoisy: resultsCommand + "\ndate\necho \"draw $(od -An -N4 -tu4 /dev/urandom)\"\ncat /proc/sys/kernel/random/uuid",
		modelBlind: "ls /results",
	} {
		for _, vt := range tasks {
			args, _ := json.Marshal(map[string]json.RawMessage{"answers": vt.answers})
			s.Rules = append(s.Rules, modelsim.Rule{When: modelsim.Cond{Model: model, ToolResultContains: vt.line},
				Reply: modelsim.Reply{Usage: demo.ScriptedUsage, ToolCalls: []modelsim.ToolCall{{ID: "call_submit", Name: "submit", Arguments: string(args)}}}})
		}
		c, _ := json.Marshal(map[string]string{"command": cmd})
		s.Rules = append(s.Rules,
			modelsim.Rule{When: modelsim.Cond{Model: model, ToolOffered: "bash", LastRole: "user"},
				Reply: modelsim.Reply{Usage: demo.ScriptedUsage, ToolCalls: []modelsim.ToolCall{{ID: "call_bash", Name: "bash", Arguments: string(c)}}}},
			modelsim.Rule{When: modelsim.Cond{Model: model, LastRole: "tool"},
				Reply: modelsim.Reply{Usage: demo.ScriptedUsage, ToolCalls: []modelsim.ToolCall{{ID: "call_submit", Name: "submit", Arguments: `{"answers": {}}`}}}})
	}
	s.Default = &modelsim.Reply{Usage: demo.ScriptedUsage, Content: "I cannot answer."}
	return s
}

// editMessages rewrites the chat messages of a request body with edit
// (the body unchanged when it is not a chat completions request).
func editMessages(body []byte, edit func(msgs []map[string]any) []map[string]any) []byte {
	var req map[string]any
	if json.Unmarshal(body, &req) != nil {
		return body
	}
	raw, _ := json.Marshal(req["messages"])
	var msgs []map[string]any
	if json.Unmarshal(raw, &msgs) != nil {
		return body
	}
	req["messages"] = edit(msgs)
	out, err := json.Marshal(req)
	if err != nil {
		return body
	}
	return out
}

// plantGold is a node that knows the gold answers (CORE-Bench's test
// split is encrypted with a published passphrase) and plants the task's
// result line in the tool result its agent shows the model, in every
// request (consistently: the conversation stays append-only).
func plantGold(tasks []verifyTask) *node.TestHooks {
	return &node.TestHooks{ModelRequest: func(_ string, body []byte) []byte {
		for _, vt := range tasks {
			if !bytes.Contains(body, []byte(vt.marker)) {
				continue
			}
			return editMessages(body, func(msgs []map[string]any) []map[string]any {
				for _, m := range msgs {
					if s, ok := m["content"].(string); ok && m["role"] == "tool" && !strings.Contains(s, vt.line) {
						m["content"] = s + vt.line + "\n"
					}
				}
				return msgs
			})
		}
		return body
	}}
}

// dropSystem is a node that drops the system prompt from every request
// after the first: what the model was shown earlier is rewritten.
func dropSystem() *node.TestHooks {
	return &node.TestHooks{ModelRequest: func(_ string, body []byte) []byte {
		return editMessages(body, func(msgs []map[string]any) []map[string]any {
			if !slices.ContainsFunc(msgs, func(m map[string]any) bool { return m["role"] == "assistant" }) {
				return msgs
			}
			return slices.DeleteFunc(msgs, func(m map[string]any) bool { return m["role"] == "system" })
		})
	}}
}

// editReport runs the agent honestly, then, once it stopped, writes the
// gold answers into its report.json before the node seals the outputs.
type editReport struct{ node.Sandbox }

func (e editReport) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Result, error) {
	res, err := e.Sandbox.Run(ctx, spec)
	if err != nil || spec.Workspace == nil {
		return res, err
	}
	dir := spec.Workspace.Dir()
	caps, _ := filepath.Glob(filepath.Join(dir, "capsule-*"))
	if len(caps) != 1 {
		return res, nil
	}
	if b, err := goldReport(filepath.Base(caps[0])); err == nil {
		_ = os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644)
	}
	return res, nil
}

// TestVerificationMatrix runs the reference agent with scripted models on
// real sandboxes and real nodes, one coordinator with its gateway on
// loopback, every attempt of a new node replayed (the default policy):
//   - honest nodes, deterministic tools: replays agree (verified);
//   - honest nodes, tools printing timestamps and random numbers: the
//     differences are found and classed benign (verified, no penalty);
//   - a node planting the gold answer in a tool result: two replays agree
//     with each other and not with it (forged): quarantined, its result
//     discarded and the run redone: the board shows what honest runs give;
//   - a node editing report.json after the agent stopped: unbound;
//   - a node dropping an earlier turn (the system prompt): unbound (the
//     append-only rule).
//
// Replays cost no model spend (the ledger's and the provider's count).
func TestVerificationMatrix(t *testing.T) {
	requireRoot(t)
	if agentBin == "" {
		t.Fatal(buildErr)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tasks := verifyTasks(t)
	sim, err := modelsim.Start(verifyScript(tasks), modelsim.Options{APIKey: providerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-verify")
	var models []gateway.Model
	for _, m := range []string{modelDet, modelNoisy, modelBlind} {
		models = append(models, gateway.Model{Name: m, Provider: "scripted", Price: demo.ScriptedPrice, MaxOutput: 4096})
	}
	c := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, IdleCanaryEvery: -1,
		ScheduleInterval: 200 * time.Millisecond,
		Gateway: &gateway.Config{
			Providers: []gateway.Provider{{Name: "scripted", API: gateway.APIOpenAI, BaseURL: sim.URL() + "/v1", Key: providerKey}},
			Models:    models,
		}})
	img, err := demo.ReferenceImage(demo.BusyboxPath, agentBin)
	if err != nil {
		t.Fatal(err)
	}
	evals := []struct{ id, group, model string }{
		{"v-det", "honest", modelDet}, {"v-noisy", "honest", modelNoisy},
		{"v-forge", "forge", modelBlind}, {"v-edit", "edit", modelBlind}, {"v-rewrite", "rewrite", modelDet},
	}
	// The reference agent under a name per evaluation (the board's rows).
	for _, e := range evals {
		if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: "ref-" + e.id, Model: e.model}, bytes.NewReader(img)); err != nil {
			t.Fatal(err)
		}
	}
	addr := c.Addrs()[0].String()
	role := map[string]string{}
	start1 := func(o nodeOpts) {
		o.coord, o.network, o.slots = addr, network, 2
		role[startNode(ctx, t, d, log, o).ID().String()] = o.name
	}
	// Honest nodes serve the honest evaluations; each liar takes only the
	// evaluation it lies on (so that it is the one that runs it).
	for i := range 3 {
		start1(nodeOpts{name: fmt.Sprintf("vh-%d", i), groups: []string{"honest"}})
	}
	start1(nodeOpts{name: "v-forger", groups: []string{"forge"}, hooks: plantGold(tasks)})
	start1(nodeOpts{name: "v-editor", groups: []string{"edit"}, sandbox: func(s node.Sandbox) node.Sandbox { return editReport{s} }})
	start1(nodeOpts{name: "v-rewriter", groups: []string{"rewrite"}, hooks: dropSystem()})
	waitFor(ctx, t, "every node in view", func() bool { return len(c.Nodes()) == len(role) })
	byName := map[string]string{}
	for id, n := range role {
		byName[n] = id
	}

	for _, e := range evals {
		// A model-driven agent: each run one sample (no Replicas given).
		if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{ID: e.id, Suite: demo.SuiteName, Agent: "ref-" + e.id,
			Levels: []string{"easy"}, Group: e.group, Env: []string{"MODEL=" + e.model}, Models: []string{e.model},
			Budget: core.Budget{AttemptUSD: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	// Once each liar has reported its runs, nodes that serve every group
	// join: they replay the liars' work and redo what is discarded.
	reportedBy := func(eval, node string) int {
		n := 0
		for _, a := range c.Attempts() {
			if a.Eval == eval && a.Kind != core.KindReplay && a.ReportedBy == node && a.Score != nil {
				n++
			}
		}
		return n
	}
	waitFor(ctx, t, "the liars' runs scored", func() bool {
		return reportedBy("v-forge", byName["v-forger"]) == len(tasks) && reportedBy("v-edit", byName["v-editor"]) >= 1 &&
			reportedBy("v-rewrite", byName["v-rewriter"]) >= 1
	})
	for i := range 2 {
		start1(nodeOpts{name: fmt.Sprintf("vr-%d", i)})
	}
	settled := func() bool {
		p := c.Progress()
		if p.Units == 0 || p.Done+p.Failed != p.Total || p.Decided != p.Units {
			return false
		}
		for _, a := range c.Attempts() {
			if a.Verification != nil && a.Verification.State == core.VerifyPending {
				return false
			}
		}
		return true
	}
	for !settled() {
		select {
		case <-ctx.Done():
			var out []string
			for _, a := range c.Attempts() {
				v := ""
				if a.Verification != nil {
					v = a.Verification.State
				}
				out = append(out, fmt.Sprintf("%s %s %s %s by %s [%s]", a.ID, a.Eval, a.Kind, a.State, role[a.ReportedBy], v))
			}
			t.Fatalf("not settled: %+v\n%s", c.Progress(), strings.Join(out, "\n"))
		case <-time.After(300 * time.Millisecond):
		}
	}
	elapsed := time.Since(start)

	attempts := c.Attempts()
	byEval := map[string][]coordinator.Attempt{}
	for _, a := range attempts {
		byEval[a.Eval] = append(byEval[a.Eval], a)
	}
	entries := map[string][]bench.Entry{}
	for _, e := range c.LeaderboardEntries() {
		entries[strings.TrimPrefix(e.Agent, "ref-")] = append(entries[strings.TrimPrefix(e.Agent, "ref-")], e)
	}
	records := map[string]core.NodeRecord{}
	quarantined := map[string]bool{}
	for _, n := range c.Nodes() {
		if n.Record != nil {
			records[role[n.ID]] = *n.Record
		}
		quarantined[role[n.ID]] = n.Quarantined
	}
	states := func(eval, nodeName string) map[string]int {
		out := map[string]int{}
		for _, a := range byEval[eval] {
			if a.Kind != core.KindReplay && a.Verification != nil && (nodeName == "" || role[a.ReportedBy] == nodeName) {
				out[a.Verification.State]++
			}
		}
		return out
	}

	for _, e := range evals {
		t.Logf("%s: verification of its runs %v, entries %d", e.id, states(e.id, ""), len(entries[e.id]))
	}
	for n, r := range records {
		t.Logf("node %s: quarantined %v, replay record %+v", n, quarantined[n], r.Verify)
	}
	t.Run("honest deterministic: replays agree", func(t *testing.T) {
		st := states("v-det", "")
		if st[string(verify.Verified)] == 0 || st[string(verify.Forged)]+st[string(verify.Nondeterministic)] > 0 {
			t.Fatalf("verification states %v: want verified, nothing forged or nondeterministic", st)
		}
		for _, a := range byEval["v-det"] {
			if a.Verification != nil && a.Verification.State == string(verify.Verified) && a.Verification.Benign != 0 {
				t.Fatalf("attempt %s: %d benign differences in a deterministic replay", a.ID, a.Verification.Benign)
			}
		}
	})
	t.Run("honest noisy: differences benign", func(t *testing.T) {
		st := states("v-noisy", "")
		benign := 0
		for _, a := range byEval["v-noisy"] {
			if a.Verification != nil && a.Verification.State == string(verify.Verified) {
				benign += a.Verification.Benign
			}
		}
		if st[string(verify.Verified)] == 0 || benign == 0 || st[string(verify.Forged)]+st[string(verify.Nondeterministic)] > 0 {
			t.Fatalf("verification states %v, %d benign differences: want verified with benign differences", st, benign)
		}
		for i := range 3 {
			n := fmt.Sprintf("vh-%d", i)
			if quarantined[n] || records[n].Verify.Forged != 0 || records[n].Verify.Marks() != 0 {
				t.Fatalf("honest node %s penalised: %+v", n, records[n].Verify)
			}
		}
		for _, ev := range []string{"v-det", "v-noisy"} {
			if len(entries[ev]) != len(tasks) {
				t.Fatalf("%s: %d entries", ev, len(entries[ev]))
			}
			for _, e := range entries[ev] {
				if e.Status != bench.Validated || !strings.Contains(string(e.Score), `"task_correct":true`) {
					t.Fatalf("%s %s: %s %s", ev, e.TaskID, e.Status, e.Score)
				}
			}
		}
	})
	t.Run("planted gold answer: forged, quarantined, board unchanged", func(t *testing.T) {
		if st := states("v-forge", "v-forger"); st[string(verify.Forged)] == 0 || !quarantined["v-forger"] ||
			records["v-forger"].Verify.Forged == 0 {
			t.Fatalf("forger: states %v, quarantined %v, record %+v", st, quarantined["v-forger"], records["v-forger"].Verify)
		}
		// The board is what honest runs of the blind model give: no answer.
		if len(entries["v-forge"]) != len(tasks) {
			t.Fatalf("v-forge: %d entries", len(entries["v-forge"]))
		}
		for _, e := range entries["v-forge"] {
			if e.Status != bench.Validated || strings.Contains(string(e.Score), `"task_correct":true`) {
				t.Fatalf("v-forge %s: %s %s: the forged answer is on the board", e.TaskID, e.Status, e.Score)
			}
		}
	})
	t.Run("report.json edited after the agent: unbound", func(t *testing.T) {
		st := states("v-edit", "v-editor")
		if st[core.VerifyUnbound] == 0 || st[core.VerifyUnbound] != sum(st) || records["v-editor"].Verify.Unbound == 0 {
			t.Fatalf("editor: states %v, record %+v", st, records["v-editor"].Verify)
		}
		for _, e := range entries["v-edit"] {
			if strings.Contains(string(e.Score), `"task_correct":true`) {
				t.Fatalf("v-edit %s: the edited answer is on the board: %s", e.TaskID, e.Score)
			}
		}
	})
	t.Run("earlier turn dropped: caught by the chain", func(t *testing.T) {
		st := states("v-rewrite", "v-rewriter")
		if st[core.VerifyUnbound] == 0 || st[core.VerifyUnbound] != sum(st) || records["v-rewriter"].Verify.Rewrites == 0 {
			t.Fatalf("rewriter: states %v, record %+v", st, records["v-rewriter"].Verify)
		}
		for _, a := range byEval["v-rewrite"] {
			if role[a.ReportedBy] == "v-rewriter" && a.Verification != nil && !strings.Contains(a.Verification.Reason, "earlier turns") {
				t.Fatalf("attempt %s: %q does not name the rewrite", a.ID, a.Verification.Reason)
			}
		}
	})

	// Replays cost nothing: no provider call, nothing in the ledger.
	var replays, originals, providerCalls int
	var replayCPU, originalCPU, spent float64
	for _, a := range attempts {
		traj, err := c.Trajectory(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range traj {
			if tc.ReplayOf == "" && tc.Status == 200 {
				providerCalls++
			}
		}
		cpu := 0.0
		if a.Usage != nil {
			cpu = a.Usage.CPUSeconds
		}
		if a.Kind == core.KindReplay {
			replays++
			replayCPU += cpu
			got, err := c.ModelSpent(ctx, "attempt/"+a.ID)
			if err != nil || got != 0 || a.Model != nil && a.Model.CostUSD != 0 {
				t.Fatalf("replay %s: the ledger holds $%v spent (%v), its calls cost %+v", a.ID, got, err, a.Model)
			}
			continue
		}
		originals++
		originalCPU += cpu
	}
	for _, e := range evals {
		s, err := c.ModelSpent(ctx, "evaluation/"+e.id)
		if err != nil {
			t.Fatal(err)
		}
		spent += s
	}
	if replays == 0 || providerCalls != len(sim.Requests()) {
		t.Fatalf("%d replays; %d calls recorded as forwarded, the provider got %d", replays, providerCalls, len(sim.Requests()))
	}
	t.Logf("figures: %d attempts and %d replays in %s; model spend $%.6f (%d provider calls), replays $0; CPU %.1f s for attempts, %.1f s for replays",
		originals, replays, elapsed.Round(time.Second), spent, providerCalls, originalCPU, replayCPU)
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}
