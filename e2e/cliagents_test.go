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

	cliagent "github.com/repronet/repronet/agents/cli"
	"github.com/repronet/repronet/agents/cli/clisim"
	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/fixtures"
	"github.com/repronet/repronet/internal/modelsim"
)

// cliCase is one CLI agent's end-to-end run.
type cliCase struct {
	agent string // agents/cli's name
	model string // the scripted model's name
	api   string // the provider's API (gateway.API*)
	// baseURL is the provider's base URL for the gateway, from the
	// scripted server's.
	baseURL func(sim string) string
	script  func() (modelsim.Script, error)
	// calls is how many model calls one attempt makes.
	calls int64
	// envKey is the variable whose value, the attempt's token, the
	// agent's first command prints into its trajectory.
	envKey string
}

// cliPrice is the scripted models' price, dollars per million tokens,
// cache reads and writes priced apart.
var cliPrice = gateway.PriceUSD{Input: 3, Output: 15, CachedInput: 0.3, CacheWrite: 3.75}

// TestClaudeCodeThroughGateway runs Claude Code (the real
// @anthropic-ai/claude-code package, `claude -p`, agents/cli) unchanged in
// its image on the sample suite at Easy and Hard on real sandboxes: its
// Messages calls go node -> libp2p -> the gateway -> the scripted model on
// loopback, which drives Claude Code's own Bash and Write tools: show the
// capsule's results (run its code at Hard), then write report.json with
// the answers the results show. Every run is validated and right, costs
// its calls times the scripted usage at the price table (cache reads and
// writes included), every call is in the trajectory, and the provider's
// key is in no node file, no sandbox output and no trajectory.
func TestClaudeCodeThroughGateway(t *testing.T) {
	runCLIAgent(t, cliCase{agent: "claude-code", model: "scripted-claude", api: gateway.APIAnthropic,
		baseURL: func(sim string) string { return sim }, script: clisim.Claude, calls: 3, envKey: "ANTHROPIC_API_KEY"})
}

func runCLIAgent(t *testing.T, c cliCase) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

	a, err := cliagent.Lookup(c.agent, "")
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), c.agent+".oci.tar")
	start := time.Now()
	if err := cliagent.Image(ctx, fixtures.Builder(), a, fixtures.NPMDir, tarball); err != nil {
		t.Fatalf("%v (the fixtures: go run ./internal/fixtures/prepare)", err)
	}
	st, _ := os.Stat(tarball)
	t.Logf("%s %s: image of %d MB built in %v", c.agent, a.Version, st.Size()>>20, time.Since(start).Round(time.Millisecond))

	script, err := c.script()
	if err != nil {
		t.Fatal(err)
	}
	sim, err := modelsim.Start(script, modelsim.Options{APIKey: providerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-" + c.agent)
	coord := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, IdleCanaryEvery: -1,
		ScheduleInterval: 200 * time.Millisecond,
		Gateway: &gateway.Config{
			Providers: []gateway.Provider{{Name: "scripted", API: c.api, BaseURL: c.baseURL(sim.URL()), Key: providerKey}},
			Models:    []gateway.Model{{Name: c.model, Provider: "scripted", Price: cliPrice, MaxOutput: 32000}},
		}})
	img, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	_, err = coord.AddAgentWith(ctx, coordinator.AgentInfo{Name: c.agent, Model: c.model}, img)
	img.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image registered in %v", time.Since(start).Round(time.Millisecond))
	// Two nodes: every attempt of a new node is replayed on another
	// (docs/verification.md), with the recorded answers.
	var dataDirs []string
	for i := range 2 {
		dir := t.TempDir()
		dataDirs = append(dataDirs, dir)
		startNode(ctx, t, d, log, nodeOpts{name: fmt.Sprintf("%s-%d", c.agent, i), coord: coord.Addrs()[0].String(), network: network, dataDir: dir})
	}
	start = time.Now()
	if _, _, err := coord.Evaluate(ctx, coordinator.Evaluation{ID: c.agent, Suite: demo.SuiteName, Agent: c.agent,
		Levels: halLevels, Replicas: 1, Env: []string{"MODEL=" + c.model}, Models: []string{c.model},
		Budget: core.Budget{AttemptUSD: 1}}); err != nil {
		t.Fatal(err)
	}
	for {
		p := coord.Progress()
		if p.Units > 0 && p.Done+p.Failed == p.Total && p.Decided == p.Units {
			break
		}
		select {
		case <-ctx.Done():
			dumpAttempts(ctx, t, coord)
			t.Fatalf("not all decided: %+v", coord.Progress())
		case <-time.After(500 * time.Millisecond):
		}
	}
	t.Logf("%d attempts decided in %v", len(coord.Attempts()), time.Since(start).Round(time.Millisecond))

	u := clisim.Usage
	callUSD := (float64(u.Prompt-u.Cached-u.CacheWrite)*cliPrice.Input + float64(u.Cached)*cliPrice.CachedInput +
		float64(u.CacheWrite)*cliPrice.CacheWrite + float64(u.Completion)*cliPrice.Output) / 1e6
	entries := coord.LeaderboardEntries()
	if len(entries) == 0 {
		t.Fatal("no entries")
	}
	for _, e := range entries {
		if e.Status != bench.Validated || !strings.Contains(string(e.Score), `"task_correct":true`) {
			dumpAttempts(ctx, t, coord)
			t.Fatalf("entry %s %s: %s %s", e.TaskID, e.Variant, e.Status, e.Score)
		}
		want := float64(c.calls) * callUSD
		if e.CostUSD == nil || fmt.Sprintf("%.7f", *e.CostUSD) != fmt.Sprintf("%.7f", want) ||
			e.InputTokens != c.calls*u.Prompt || e.OutputTokens != c.calls*u.Completion {
			t.Fatalf("entry %s %s: cost %v (want %.7f), tokens %d/%d (want %d/%d)", e.TaskID, e.Variant, e.CostUSD, want,
				e.InputTokens, e.OutputTokens, c.calls*u.Prompt, c.calls*u.Completion)
		}
	}

	// Every call the provider answered is in a trajectory, and the
	// provider's key is in none, nor in any sandbox's output.
	var recorded, replays int
	for _, at := range coord.Attempts() {
		if at.Outcome != "ok" {
			dumpAttempts(ctx, t, coord)
			t.Fatalf("attempt %s (%s): outcome %q", at.ID, at.Kind, at.Outcome)
		}
		if at.Kind != core.KindAgent {
			replays++
			continue
		}
		traj, err := coord.Trajectory(ctx, at.ID)
		if err != nil || int64(len(traj)) != c.calls {
			t.Fatalf("trajectory of %s: %d calls, want %d (%v)", at.ID, len(traj), c.calls, err)
		}
		recorded += len(traj)
		rep, _, err := coord.Report(ctx, at.ID)
		if err != nil || rep.GetModelChainHead() != traj[len(traj)-1].Chain {
			t.Fatalf("attempt %s: the report signs chain head %q, the gateway's is %q (%v)", at.ID, rep.GetModelChainHead(), traj[len(traj)-1].Chain, err)
		}
		if second := string(traj[1].RequestBody); !strings.Contains(second, c.envKey+"="+gateway.TokenPrefix) {
			t.Fatalf("attempt %s: the agent's first command did not show its token in %s: %.2000s", at.ID, c.envKey, second)
		}
		for _, tc := range traj {
			if bytes.Contains(tc.RequestBody, []byte(providerKey)) || bytes.Contains(tc.ResponseBody, []byte(providerKey)) {
				t.Fatalf("attempt %s: the provider's key is in its trajectory", at.ID)
			}
		}
		if bytes.Contains(rep.GetStdoutTail(), []byte(providerKey)) || bytes.Contains(rep.GetStderrTail(), []byte(providerKey)) {
			t.Fatalf("attempt %s: the provider's key is in the sandbox's output", at.ID)
		}
	}
	if n := len(sim.Requests()); n != recorded {
		t.Fatalf("the provider answered %d calls, the trajectories hold %d", n, recorded)
	}
	t.Logf("%d calls recorded, %d replays", recorded, replays)
	for _, dir := range dataDirs {
		err = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
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

// dumpAttempts logs each attempt's outcome and output tails.
func dumpAttempts(ctx context.Context, t *testing.T, coord *coordinator.Coordinator) {
	t.Helper()
	for _, at := range coord.Attempts() {
		rep, _, err := coord.Report(ctx, at.ID)
		if err != nil {
			t.Logf("attempt %s: %+v (no report: %v)", at.ID, at, err)
			continue
		}
		t.Logf("attempt %s: %+v\nstdout: %.3000s\nstderr: %.3000s", at.ID, at, lastKB(string(rep.GetStdoutTail()), 3), lastKB(string(rep.GetStderrTail()), 3))
	}
}
