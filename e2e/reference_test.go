package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/modelsim"
)

// providerKey is the scripted provider's key: it must stay with the
// coordinator's gateway.
const providerKey = "sk-e2e-provider-key-7f3a9c21d4"

// TestReferenceAgentThroughGateway runs the reference agent on the sample
// suite at every level on real sandboxes, its model calls going node ->
// libp2p -> the coordinator's gateway -> a scripted model server on
// loopback (the provider). The scripted model submits a task's answers
// only when a tool result shows the capsule's real results, so the
// sandbox, the bash tool and the results' regeneration at Medium and Hard
// all have to work. The leaderboard shows every run validated and right,
// with tokens and cost equal to the scripted usage at the price table; the
// provider's key is in no node file, in no sandbox (the agent lists its
// model environment into its trajectory), and in no trajectory.
func TestReferenceAgentThroughGateway(t *testing.T) {
	requireRoot(t)
	if agentBin == "" {
		t.Fatal(buildErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	script, err := demo.SampleScript()
	if err != nil {
		t.Fatal(err)
	}
	sim, err := modelsim.Start(script, modelsim.Options{APIKey: providerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-ref")
	c := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, IdleCanaryEvery: -1,
		ScheduleInterval: 200 * time.Millisecond,
		Gateway: &gateway.Config{
			Providers: []gateway.Provider{{Name: "scripted", API: gateway.APIOpenAI, BaseURL: sim.URL() + "/v1", Key: providerKey}},
			Models:    []gateway.Model{{Name: demo.ScriptedModel, Provider: "scripted", Price: demo.ScriptedPrice, MaxOutput: 4096}},
		}})
	img, err := demo.ReferenceImage(demo.BusyboxPath, agentBin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: demo.ReferenceAgent, Model: demo.ScriptedModel}, bytes.NewReader(img)); err != nil {
		t.Fatal(err)
	}
	addr := c.Addrs()[0].String()
	var dirs []string
	for i := range 2 {
		dir := t.TempDir()
		dirs = append(dirs, dir)
		startNode(ctx, t, d, log, nodeOpts{name: fmt.Sprintf("ref-%d", i), coord: addr, network: network, dataDir: dir})
	}
	// A stochastic agent: one run per task, never voted against another.
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{ID: "ref", Suite: demo.SuiteName, Agent: demo.ReferenceAgent,
		Levels: allLevels, Replicas: 1, Env: []string{"MODEL=" + demo.ScriptedModel}, Models: []string{demo.ScriptedModel},
		Budget: core.Budget{AttemptUSD: 1}}); err != nil {
		t.Fatal(err)
	}
	for !allValidated(c) {
		select {
		case <-ctx.Done():
			t.Fatalf("not all validated: %+v; attempts: %+v", c.Progress(), c.Attempts())
		case <-time.After(500 * time.Millisecond):
		}
	}

	// Every run right, with the scripted usage at the price table: two
	// calls (look, then submit) of 1200 input and 80 output tokens.
	calls := int64(2)
	wantCost := float64(calls) * (float64(demo.ScriptedUsage.Prompt)*demo.ScriptedPrice.Input +
		float64(demo.ScriptedUsage.Completion)*demo.ScriptedPrice.Output) / 1e6
	entries := c.LeaderboardEntries()
	if len(entries) != len(allLevels)*len(sample.CapsuleIDs()) {
		t.Fatalf("%d entries", len(entries))
	}
	for _, e := range entries {
		if e.Status != bench.Validated || !strings.Contains(string(e.Score), `"task_correct":true`) {
			t.Fatalf("entry %s %s: %s %s", e.TaskID, e.Variant, e.Status, e.Score)
		}
		if e.CostUSD == nil || fmt.Sprintf("%.7f", *e.CostUSD) != fmt.Sprintf("%.7f", wantCost) ||
			e.InputTokens != calls*demo.ScriptedUsage.Prompt || e.OutputTokens != calls*demo.ScriptedUsage.Completion {
			t.Fatalf("entry %s %s: cost %v (want %.7f), tokens %d/%d", e.TaskID, e.Variant, e.CostUSD, wantCost, e.InputTokens, e.OutputTokens)
		}
	}

	// The key stays with the coordinator.
	for _, a := range c.Attempts() {
		traj, err := c.Trajectory(ctx, a.ID)
		if err != nil || len(traj) != int(calls) {
			t.Fatalf("trajectory of %s: %d calls, %v", a.ID, len(traj), err)
		}
		// The node signed the head of the conversation the gateway
		// recorded; the answers are bound to it (the entry is validated).
		rep, _, err := c.Report(ctx, a.ID)
		if err != nil || rep.GetModelChainHead() == "" || rep.GetModelChainHead() != traj[len(traj)-1].Chain {
			t.Fatalf("attempt %s: the report signs chain head %q, the gateway's is %q (%v)", a.ID, rep.GetModelChainHead(), traj[len(traj)-1].Chain, err)
		}
		second := string(traj[1].RequestBody)
		if !strings.Contains(second, "OPENAI_API_KEY="+gateway.TokenPrefix) || !strings.Contains(second, "OPENAI_BASE_URL=http://") {
			t.Fatalf("the agent's environment, as it listed it: %s", second)
		}
		for _, tc := range traj {
			if bytes.Contains(tc.RequestBody, []byte(providerKey)) || bytes.Contains(tc.ResponseBody, []byte(providerKey)) {
				t.Fatalf("attempt %s: the provider's key is in its trajectory", a.ID)
			}
		}
	}
	for _, dir := range dirs {
		err := filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
			if err != nil || de.IsDir() || !de.Type().IsRegular() {
				return err
			}
			b, err := os.ReadFile(p)
			if err == nil && bytes.Contains(b, []byte(providerKey)) {
				return fmt.Errorf("%s holds the provider's key", p)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
