package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	halagent "github.com/repronet/repronet/agents/hal"
	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench/hal"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/fixtures"
	"github.com/repronet/repronet/internal/halcheck"
	"github.com/repronet/repronet/internal/modelsim"
)

// halAgent is the name the example HAL agent is registered under.
const halAgent = "hal-example"

// TestHALAgentThroughGateway runs the example HAL agent (agents/hal/example:
// HAL's run(input, **kwargs), standard library only) unchanged, in the HAL
// adapter's Debian image, on the sample suite at every level on real
// sandboxes: its urllib calls go node -> libp2p -> the gateway -> the
// scripted model on loopback, which has it run the same command as the
// reference agent and submits the answers once the capsule's real results
// are in a tool result. Every run is validated and right, with tokens and
// cost equal to the scripted usage at the price table; then `repronet
// leaderboard --hal` (the binary, over the HTTP API with the admin's
// token) writes one upload per level whose raw_logging_results are the
// runs' calls, and HAL's own check_upload_structure accepts each file.
// halLevels are the levels a HAL agent is evaluated at. At Medium the job
// runs inside the capsule's environment image with the agent's image at
// /agent (docs/agents.md), and the adapter needs its own image's Python:
// it cannot run there (agent_error), so HAL agents run at Easy and Hard.
var halLevels = []string{"easy", "hard"}

func TestHALAgentThroughGateway(t *testing.T) {
	requireRoot(t)
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	// The adapter's image, from the Debian base the fixtures made.
	tarball := filepath.Join(t.TempDir(), "hal-example.oci.tar")
	start := time.Now()
	if err := halagent.Image(ctx, fixtures.Builder(), tarball, "example", halagent.Example(), ""); err != nil {
		t.Fatal(err)
	}
	t.Logf("adapter image built in %v", time.Since(start).Round(time.Millisecond))

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
	network := uniqueName("e2e-hal")
	const adminToken = "e2e-hal-admin-token-0123456789"
	c := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, IdleCanaryEvery: -1, AdminToken: adminToken,
		ScheduleInterval: 200 * time.Millisecond,
		Gateway: &gateway.Config{
			Providers: []gateway.Provider{{Name: "scripted", API: gateway.APIOpenAI, BaseURL: sim.URL() + "/v1", Key: providerKey}},
			Models:    []gateway.Model{{Name: demo.ScriptedModel, Provider: "scripted", Price: demo.ScriptedPrice, MaxOutput: 4096}},
		}})
	img, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.AddAgentWith(ctx, coordinator.AgentInfo{Name: halAgent, Model: demo.ScriptedModel}, img)
	img.Close()
	if err != nil {
		t.Fatal(err)
	}
	addr := c.Addrs()[0].String()
	for i := range 2 {
		startNode(ctx, t, d, log, nodeOpts{name: fmt.Sprintf("hal-%d", i), coord: addr, network: network, dataDir: t.TempDir()})
	}
	args, _ := json.Marshal(map[string]any{"model_name": demo.ScriptedModel, "max_steps": 4})
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{ID: "hal", Suite: demo.SuiteName, Agent: halAgent,
		Levels: halLevels, Replicas: 1, Env: []string{"HAL_AGENT_ARGS=" + string(args)}, Models: []string{demo.ScriptedModel},
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

	// Every run right; two calls (look, then submit) at the scripted usage.
	calls := int64(2)
	callUSD := (float64(demo.ScriptedUsage.Prompt)*demo.ScriptedPrice.Input + float64(demo.ScriptedUsage.Completion)*demo.ScriptedPrice.Output) / 1e6
	entries := c.LeaderboardEntries()
	tasks := len(sample.CapsuleIDs())
	if len(entries) != len(halLevels)*tasks {
		t.Fatalf("%d entries", len(entries))
	}
	for _, e := range entries {
		if e.Status != bench.Validated || !strings.Contains(string(e.Score), `"task_correct":true`) {
			t.Fatalf("entry %s %s: %s %s", e.TaskID, e.Variant, e.Status, e.Score)
		}
		if e.CostUSD == nil || fmt.Sprintf("%.7f", *e.CostUSD) != fmt.Sprintf("%.7f", float64(calls)*callUSD) ||
			e.InputTokens != calls*demo.ScriptedUsage.Prompt || e.OutputTokens != calls*demo.ScriptedUsage.Completion {
			t.Fatalf("entry %s %s: cost %v (want %.7f), tokens %d/%d", e.TaskID, e.Variant, e.CostUSD, float64(calls)*callUSD, e.InputTokens, e.OutputTokens)
		}
	}

	// The HAL export, as a user makes it.
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	dir := t.TempDir()
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(adminToken), 0o600); err != nil {
		t.Fatal(err)
	}
	halDir := filepath.Join(dir, "hal")
	out, err := exec.CommandContext(ctx, bin, "leaderboard", "--api", srv.URL, "--hal", halDir, "--token-file", tokenFile).CombinedOutput()
	if err != nil {
		t.Fatalf("repronet leaderboard --hal: %v\n%s", err, out)
	}
	files, _ := filepath.Glob(filepath.Join(halDir, "*_UPLOAD.json"))
	if len(files) != len(halLevels) {
		t.Fatalf("%d uploads: %s", len(files), out)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var u hal.Upload
		if err := json.Unmarshal(b, &u); err != nil {
			t.Fatal(err)
		}
		usage := u.TotalUsage[demo.ScriptedModel]
		if u.Results.Accuracy != 1 || len(u.RawLoggingResults) != tasks*int(calls) || len(u.Repronet.NoTrajectory) != 0 ||
			fmt.Sprintf("%.7f", u.TotalCost) != fmt.Sprintf("%.7f", float64(tasks)*float64(calls)*callUSD) ||
			usage.PromptTokens != int64(tasks)*calls*demo.ScriptedUsage.Prompt || usage.CompletionTokens != int64(tasks)*calls*demo.ScriptedUsage.Completion ||
			len(u.Results.Latencies) != tasks {
			t.Errorf("%s: accuracy %v, %d calls, $%v, usage %+v, %d latencies, no trajectory %v", f, u.Results.Accuracy, len(u.RawLoggingResults),
				u.TotalCost, u.TotalUsage, len(u.Results.Latencies), u.Repronet.NoTrajectory)
		}
		if strings.Contains(string(b), providerKey) {
			t.Errorf("%s holds the provider's key", f)
		}
	}
	check, err := halcheck.Find(ctx, "../scripts/hal_upload_check.py", t.TempDir())
	if errors.Is(err, halcheck.ErrUnavailable) {
		t.Skipf("everything but HAL's own check passed: %v", err)
	} else if err != nil {
		t.Fatal(err)
	}
	msg, err := check.Check(ctx, files...)
	if err != nil || strings.Count(msg, "is_valid=True") != len(files) {
		t.Fatalf("HAL's check (%s): %v\n%s", check.Source, err, msg)
	}
	t.Logf("HAL's check_upload_structure (%s):\n%s", check.Source, msg)
}
