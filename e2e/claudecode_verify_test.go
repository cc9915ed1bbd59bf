package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	cliagent "github.com/repronet/repronet/agents/cli"
	"github.com/repronet/repronet/agents/cli/clisim"
	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/fixtures"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/verify"
)

// Scripted models of Claude Code's verification matrix: three main models
// (the behaviours of TestVerificationMatrix's) and the small model its
// sub-agent runs on.
const (
	ccDet   = "cc-det"
	ccNoisy = "cc-noisy"
	ccBlind = "cc-blind"
	ccSmall = "cc-small"
)

// ccSide is the prompt of the sub-agent Claude Code's main loop starts in
// the background on the small model: the main loop goes on (its Bash
// call, report.json, its last words) while the sub-agent's conversation
// runs. The sub-agent takes 6 s, so that its completion notice reaches
// the main loop after the main loop's last words, at the same place on
// every node (Claude Code inserts a notice wherever it arrives).
const ccSide = "SIDE: list the capsule's results folder and say what is in it."

// ccBashID is the id of the main loop's Bash call (the forging node plants
// the answer in its result).
const ccBashID = "toolu_bash_main"

// ccScript scripts Claude Code for the matrix. Each main model's first
// turn calls, at once, the Agent tool (a general-purpose sub-agent on the
// small model, "haiku", in the background: its own conversation with the
// small model, open while the main loop makes its next calls) and Bash
// (the model's command); once a tool result holds a task's result
// line it writes report.json with the task's answers, and once written
// it says it is done. The blind model's command lists the results folder
// only: an honest run sees no answer and writes no report. The sub-agent
// runs one Bash call that waits 6 s, prints the date and lists the
// folder, then reports. (A sub-agent in the foreground hands back a tool
// result holding its duration_ms and a random hex id: docs/verification.md
// says why that can leave honest runs unverified.)
func ccScript(tasks []verifyTask) (modelsim.Script, error) {
	u := clisim.UsageAnthropic
	var s modelsim.Script
	for _, model := range []string{ccDet, ccNoisy, ccBlind} {
		agent, err := json.Marshal(map[string]any{"description": "List the results folder", "prompt": ccSide,
			"subagent_type": "general-purpose", "model": "haiku", "run_in_background": true})
		if err != nil {
			return modelsim.Script{}, err
		}
		// Written: done (first, since the result line stays in the
		// conversation).
		s.Rules = append(s.Rules, modelsim.Rule{When: modelsim.Cond{Model: model, ToolResultContains: clisim.ReportPath},
			Reply: modelsim.Reply{Usage: u, Content: clisim.Done}})
		for i, vt := range tasks {
			var v map[string]any
			if err := json.Unmarshal(vt.answers, &v); err != nil {
				return modelsim.Script{}, err
			}
			body, err := json.MarshalIndent(v, "", "  ")
			if err != nil {
				return modelsim.Script{}, err
			}
			w, _ := json.Marshal(map[string]string{"file_path": clisim.ReportPath, "content": string(body) + "\n"})
			s.Rules = append(s.Rules, modelsim.Rule{When: modelsim.Cond{Model: model, Turn: 2, AnyContains: vt.line},
				Reply: modelsim.Reply{Usage: u, Content: "The results are in; I write the report.",
					ToolCalls: []modelsim.ToolCall{{ID: fmt.Sprintf("toolu_write_%d", i), Name: "Write", Arguments: string(w)}}}})
		}
		cmd := resultsCommand
		switch model {
		case ccNoisy:
			cmd += "\ndate\necho \"draw $(od -An -N4 -tu4 /dev/urandom)\"\ncat /proc/sys/kernel/random/uuid"
		case ccBlind:
			cmd = "ls /results"
		}
		c, _ := json.Marshal(map[string]string{"command": cmd, "description": "Show the capsule's results"})
		s.Rules = append(s.Rules,
			modelsim.Rule{When: modelsim.Cond{Model: model, Turn: 1, ToolOffered: "Agent"},
				Reply: modelsim.Reply{Usage: u, Content: "I look at the results, and have a helper list them.",
					ToolCalls: []modelsim.ToolCall{{ID: "toolu_agent_side", Name: "Agent", Arguments: string(agent)},
						{ID: ccBashID, Name: "Bash", Arguments: string(c)}}}},
			modelsim.Rule{When: modelsim.Cond{Model: model}, Reply: modelsim.Reply{Usage: u, Content: "I found no answer to write."}})
	}
	ls, _ := json.Marshal(map[string]string{"command": "python3 -c 'import time; time.sleep(6)'; date; ls -A /results",
		"description": "List the results folder after a while"})
	s.Rules = append(s.Rules,
		modelsim.Rule{When: modelsim.Cond{Model: ccSmall, Turn: 1, AnyContains: "SIDE:"},
			Reply: modelsim.Reply{Usage: u, Content: "I list the folder.",
				ToolCalls: []modelsim.ToolCall{{ID: "toolu_side_ls", Name: "Bash", Arguments: string(ls)}}}},
		modelsim.Rule{When: modelsim.Cond{Model: ccSmall}, Reply: modelsim.Reply{Usage: u, Content: "The folder holds the capsule's results."}})
	s.Default = &modelsim.Reply{Usage: u, Content: "Reading a capsule."}
	return s, nil
}

// plantGoldAnthropic is plantGold for Messages requests: a node that
// appends the task's result line to the result of the main loop's Bash
// call in every request that carries it (consistently: the conversation
// stays append-only).
func plantGoldAnthropic(tasks []verifyTask) *node.TestHooks {
	return &node.TestHooks{ModelRequest: func(_ string, body []byte) []byte {
		for _, vt := range tasks {
			if !bytes.Contains(body, []byte(vt.marker)) || !bytes.Contains(body, []byte(ccBashID)) {
				continue
			}
			var req map[string]any
			if json.Unmarshal(body, &req) != nil {
				return body
			}
			msgs, _ := req["messages"].([]any)
			for _, m := range msgs {
				blocks, _ := m.(map[string]any)["content"].([]any)
				for _, b := range blocks {
					blk, _ := b.(map[string]any)
					if blk["type"] != "tool_result" || blk["tool_use_id"] != ccBashID {
						continue
					}
					switch c := blk["content"].(type) {
					case string:
						if !strings.Contains(c, vt.line) {
							blk["content"] = c + "\n" + vt.line
						}
					case []any:
						blk["content"] = append(c, map[string]any{"type": "text", "text": vt.line})
					}
				}
			}
			out, err := json.Marshal(req)
			if err != nil {
				return body
			}
			return out
		}
		return body
	}}
}

// ccImage builds Claude Code's image as `repronet agent build` does; its
// harness gives the small model's roles (ANTHROPIC_SMALL_FAST_MODEL,
// ANTHROPIC_DEFAULT_HAIKU_MODEL) the evaluation's SMALL_MODEL.
func ccImage(ctx context.Context, t *testing.T, tarball string) {
	t.Helper()
	a, err := cliagent.Lookup("claude-code", "")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := a.Spec(fixtures.NPMDir)
	if err != nil {
		t.Fatalf("%v (the fixtures: go run ./internal/fixtures/prepare)", err)
	}
	if err := fixtures.Builder().Build(ctx, tarball, spec); err != nil {
		t.Fatal(err)
	}
}

// TestClaudeCodeVerificationMatrix is TestVerificationMatrix with the real
// Claude Code (@anthropic-ai/claude-code, `claude -p`, agents/cli) in its
// image, its main loop on one model and, concurrently, a sub-agent's
// conversation on a small model, every attempt replayed (the policy's
// floor raised to 1):
//   - honest nodes, deterministic tools: replays verified;
//   - honest nodes, tools printing a timestamp, a random draw and a UUID:
//     verified (differences benign), never forged;
//   - a node planting the gold answer in the main loop's Bash result:
//     forged, quarantined, the board what honest runs give;
//   - a node editing report.json after Claude Code stopped: unbound.
//
// Replays make no provider call: every call the provider answered is an
// original attempt's, and every call of a replay was answered from the
// record.
func TestClaudeCodeVerificationMatrix(t *testing.T) {
	requireRoot(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tasks := verifyTasks(t)
	script, err := ccScript(tasks)
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), "claude-code.oci.tar")
	ccImage(ctx, t, tarball)
	t.Logf("image built in %v", time.Since(start).Round(time.Millisecond))
	sim, err := modelsim.Start(script, modelsim.Options{APIKey: providerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-ccverify")
	var models []gateway.Model
	for _, m := range []string{ccDet, ccNoisy, ccBlind, ccSmall} {
		models = append(models, gateway.Model{Name: m, Provider: "scripted", Price: cliPrice, MaxOutput: 32000})
	}
	// Every attempt replayed: the rate starts at 1 for a new node and, with
	// the floor at 1, does not fall with clean replays (by default it does,
	// and the last runs of an honest node may go unreplayed).
	policy := verify.DefaultPolicy()
	policy.Floor = 1
	c := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, IdleCanaryEvery: -1,
		ScheduleInterval: 200 * time.Millisecond, Verify: &policy,
		Gateway: &gateway.Config{
			Providers: []gateway.Provider{{Name: "scripted", API: gateway.APIAnthropic, BaseURL: sim.URL(), Key: providerKey}},
			Models:    models,
		}})
	evals := []struct{ id, group, model string }{
		{"cc-det", "honest", ccDet}, {"cc-noisy", "honest", ccNoisy},
		{"cc-forge", "forge", ccBlind}, {"cc-edit", "edit", ccBlind},
	}
	for _, e := range evals {
		f, err := os.Open(tarball)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.AddAgentWith(ctx, coordinator.AgentInfo{Name: "claude-" + e.id, Model: e.model}, f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	addr := c.Addrs()[0].String()
	role := map[string]string{}
	start1 := func(o nodeOpts) {
		o.coord, o.network, o.slots = addr, network, 2
		role[startNode(ctx, t, d, log, o).ID().String()] = o.name
	}
	// Each liar takes only the evaluation it lies on; the honest
	// evaluations wait for the nodes that serve every group.
	start1(nodeOpts{name: "cc-forger", groups: []string{"forge"}, hooks: plantGoldAnthropic(tasks)})
	start1(nodeOpts{name: "cc-editor", groups: []string{"edit"}, sandbox: func(s node.Sandbox) node.Sandbox { return editReport{s} }})
	byName := map[string]string{}
	for id, n := range role {
		byName[n] = id
	}
	for _, e := range evals {
		if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{ID: e.id, Suite: demo.SuiteName, Agent: "claude-" + e.id,
			Levels: []string{"easy"}, Group: e.group, Env: []string{"MODEL=" + e.model, "SMALL_MODEL=" + ccSmall},
			Models: []string{e.model, ccSmall}, Budget: core.Budget{AttemptUSD: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	reportedBy := func(eval, node string) int {
		n := 0
		for _, a := range c.Attempts() {
			if a.Eval == eval && a.Kind != core.KindReplay && a.ReportedBy == node && a.Score != nil {
				n++
			}
		}
		return n
	}
	dump := func() string {
		var out []string
		for _, a := range c.Attempts() {
			v := ""
			if a.Verification != nil {
				v = a.Verification.State + " " + a.Verification.Reason
			}
			out = append(out, fmt.Sprintf("%s %s %s %s %s by %s [%s] %s", a.ID, a.Eval, a.TaskID, a.Kind, a.State, role[a.ReportedBy], v, a.Detail))
		}
		return strings.Join(out, "\n")
	}
	for reportedBy("cc-forge", byName["cc-forger"]) != len(tasks) || reportedBy("cc-edit", byName["cc-editor"]) < 1 {
		select {
		case <-ctx.Done():
			t.Fatalf("the liars' runs not scored:\n%s", dump())
		case <-time.After(300 * time.Millisecond):
		}
	}
	t.Logf("liars' runs scored at %v", time.Since(start).Round(time.Second))
	for i := range 2 {
		start1(nodeOpts{name: fmt.Sprintf("cc-r%d", i)})
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
			t.Fatalf("not settled: %+v\n%s", c.Progress(), dump())
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
		id := strings.TrimPrefix(e.Agent, "claude-")
		entries[id] = append(entries[id], e)
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
	if t.Failed() || testing.Verbose() {
		t.Logf("attempts:\n%s", dump())
	}

	// Trajectories: the side conversation on the small model ran inside
	// every honest run, between the main loop's calls; replays were
	// answered from the record only.
	var replays, originals, providerCalls, replayCalls, sideCalls int
	for _, a := range attempts {
		traj, err := c.Trajectory(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		firstMain, lastMain, side := -1, -1, []int{}
		for i, tc := range traj {
			if tc.ReplayOf == "" && tc.Status == 200 {
				providerCalls++
			}
			if a.Kind == core.KindReplay {
				// Every call of a replay, side calls included, found its
				// recorded answer (none refused as out of turn) and none
				// reached the provider.
				if tc.Status != 200 || tc.ReplayOf == "" {
					t.Fatalf("replay %s: call %d (%s): %d %q, replay of %q", a.ID, tc.Seq, tc.Model, tc.Status, tc.Error, tc.ReplayOf)
				}
				replayCalls++
			}
			if tc.Model == ccSmall {
				side = append(side, i)
			} else {
				if firstMain < 0 {
					firstMain = i
				}
				lastMain = i
			}
		}
		if a.Kind == core.KindReplay {
			replays++
			if got, err := c.ModelSpent(ctx, "attempt/"+a.ID); err != nil || got != 0 {
				t.Fatalf("replay %s: the ledger holds $%v spent (%v)", a.ID, got, err)
			}
			continue
		}
		originals++
		sideCalls += len(side)
		if a.Eval == "cc-det" || a.Eval == "cc-noisy" {
			if len(side) == 0 || side[0] < firstMain || side[0] > lastMain {
				t.Fatalf("attempt %s: no side call on %s within the main loop (side calls at %v, main %d..%d)", a.ID, ccSmall, side, firstMain, lastMain)
			}
		}
		// The background sub-agent's conversation was open while the main
		// loop called: a main call between its first and last calls.
		if (a.Eval == "cc-det" || a.Eval == "cc-noisy") && !slices.ContainsFunc(traj, func(tc gateway.TrajectoryCall) bool {
			return tc.Model != ccSmall && tc.Seq > traj[side[0]].Seq && tc.Seq < traj[side[len(side)-1]].Seq
		}) {
			t.Fatalf("attempt %s: no main call while the background sub-agent ran (side calls at %v)", a.ID, side)
		}
	}
	if replays == 0 || replayCalls == 0 || providerCalls != len(sim.Requests()) {
		t.Fatalf("%d replays (%d calls); %d calls recorded as forwarded, the provider got %d", replays, replayCalls, providerCalls, len(sim.Requests()))
	}

	t.Run("honest deterministic: replays verified", func(t *testing.T) {
		st := states("cc-det", "")
		if st[string(verify.Verified)] != len(tasks) || st[string(verify.Forged)]+st[string(verify.Nondeterministic)]+st[core.VerifyUnbound] > 0 {
			t.Fatalf("verification states %v: want verified, nothing forged, nondeterministic or unbound", st)
		}
	})
	t.Run("honest noisy: verified, never forged", func(t *testing.T) {
		st := states("cc-noisy", "")
		if st[string(verify.Verified)] != len(tasks) || st[string(verify.Forged)]+st[string(verify.Nondeterministic)]+st[core.VerifyUnbound] > 0 {
			t.Fatalf("verification states %v: want verified, nothing forged, nondeterministic or unbound", st)
		}
		// The random draw differs in every replay (the date and the UUID
		// are normalised): a benign difference in each verified run.
		for _, a := range byEval["cc-noisy"] {
			if a.Verification.Verified() && a.Verification.Benign == 0 {
				t.Fatalf("attempt %s: verified with no benign difference: %+v", a.ID, a.Verification)
			}
		}
		for i := range 2 {
			n := fmt.Sprintf("cc-r%d", i)
			if quarantined[n] || records[n].Verify.Forged != 0 || records[n].Verify.Marks() != 0 {
				t.Fatalf("honest node %s penalised: %+v", n, records[n].Verify)
			}
		}
		for _, ev := range []string{"cc-det", "cc-noisy"} {
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
		if st := states("cc-forge", "cc-forger"); st[string(verify.Forged)] == 0 || !quarantined["cc-forger"] ||
			records["cc-forger"].Verify.Forged == 0 {
			t.Fatalf("forger: states %v, quarantined %v, record %+v", st, quarantined["cc-forger"], records["cc-forger"].Verify)
		}
		if len(entries["cc-forge"]) != len(tasks) {
			t.Fatalf("cc-forge: %d entries", len(entries["cc-forge"]))
		}
		for _, e := range entries["cc-forge"] {
			if e.Status != bench.Validated || strings.Contains(string(e.Score), `"task_correct":true`) {
				t.Fatalf("cc-forge %s: %s %s: the forged answer is on the board", e.TaskID, e.Status, e.Score)
			}
		}
	})
	t.Run("report.json edited after Claude Code: unbound", func(t *testing.T) {
		st := states("cc-edit", "cc-editor")
		if st[core.VerifyUnbound] == 0 || st[core.VerifyUnbound] != sum(st) || records["cc-editor"].Verify.Unbound == 0 {
			t.Fatalf("editor: states %v, record %+v", st, records["cc-editor"].Verify)
		}
		for _, e := range entries["cc-edit"] {
			if strings.Contains(string(e.Score), `"task_correct":true`) {
				t.Fatalf("cc-edit %s: the edited answer is on the board: %s", e.TaskID, e.Score)
			}
		}
	})
	t.Logf("figures: %d attempts (%d side calls on the small model) and %d replays (%d calls, all from the record) in %s; %d provider calls, all by attempts",
		originals, sideCalls, replays, replayCalls, elapsed.Round(time.Second), providerCalls)
}
