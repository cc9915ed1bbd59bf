package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	cliagent "github.com/repronet/repronet/agents/cli"
	"github.com/repronet/repronet/agents/cli/clisim"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/dashboard"
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
	// usage is what each scripted reply reports.
	usage modelsim.Usage
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
// writes included), every call is in the trajectory, runs are verified
// by replays on the other node, and the provider's key is in no node
// file, no sandbox output and no trajectory. The coordinator is a process
// configured by a TOML file (--config), as a user runs it.
func TestClaudeCodeThroughGateway(t *testing.T) {
	runCLIAgent(t, cliCase{agent: "claude-code", model: "scripted-claude", api: gateway.APIAnthropic,
		baseURL: func(sim string) string { return sim }, script: clisim.Claude, usage: clisim.UsageAnthropic, calls: 3, envKey: "ANTHROPIC_API_KEY"})
}

// TestCodexThroughGateway is the same for Codex CLI (the real
// @openai/codex package and its native linux x64 binary, `codex exec`):
// OpenAI's Responses API through the gateway, its exec_command function
// and apply_patch (called through exec_command, which Codex intercepts
// and applies itself: it offers apply_patch as a tool only to models it
// has metadata for), cached tokens priced.
func TestCodexThroughGateway(t *testing.T) {
	runCLIAgent(t, cliCase{agent: "codex", model: "scripted-codex", api: gateway.APIOpenAI,
		baseURL: func(sim string) string { return sim + "/v1" }, script: clisim.Codex, usage: clisim.UsageOpenAI, calls: 3, envKey: "OPENAI_API_KEY"})
}

// TestGeminiCLIThroughGateway is the same for Gemini CLI (the real
// @google/gemini-cli package, `gemini -p --yolo`): Gemini's
// streamGenerateContent through the gateway, its run_shell_command and
// write_file tools, cached and thinking tokens priced.
func TestGeminiCLIThroughGateway(t *testing.T) {
	runCLIAgent(t, cliCase{agent: "gemini-cli", model: "scripted-gemini", api: gateway.APIGemini,
		baseURL: func(sim string) string { return sim }, script: clisim.Gemini, usage: clisim.UsageGemini, calls: 3, envKey: "GEMINI_API_KEY"})
}

func runCLIAgent(t *testing.T, c cliCase) {
	requireRoot(t)
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dir := t.TempDir()

	a, err := cliagent.Lookup(c.agent, "")
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(dir, c.agent+".oci.tar")
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

	// The coordinator as a user runs it: a process configured by a TOML
	// file, its provider's key in a file beside it.
	if err := os.WriteFile(filepath.Join(dir, "provider.key"), []byte(providerKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	config := fmt.Sprintf(`sample = true
join-token-file = %q
agent = [%q]
model = [%q]
idle-canary-every = "-1s"

[[providers]]
name = "scripted"
api = %q
base_url = %q
key_file = "provider.key"

[[models]]
name = %q
provider = "scripted"
max_output = 32000
price = { input = %g, output = %g, cached_input = %g, cache_write = %g }
`, joinTokenFile(t), c.agent+"="+tarball, c.agent+"="+c.model, c.api, c.baseURL(sim.URL()), c.model,
		cliPrice.Input, cliPrice.Output, cliPrice.CachedInput, cliPrice.CacheWrite)
	configFile := filepath.Join(dir, "coordinator.toml")
	if err := os.WriteFile(configFile, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	cp := startConfiguredCoordinator(ctx, t, bin, filepath.Join(dir, "data"), dir, configFile)
	t.Logf("coordinator up, image registered, in %v", time.Since(start).Round(time.Millisecond))

	// Two nodes: every attempt of a new node is replayed on another
	// (docs/verification.md), with the recorded answers.
	var dataDirs []string
	for i := range 2 {
		nd := t.TempDir()
		dataDirs = append(dataDirs, nd)
		startNode(ctx, t, d, log, nodeOpts{name: fmt.Sprintf("%s-%d", c.agent, i), coord: cp.addr, dataDir: nd})
	}
	start = time.Now()
	req := fmt.Sprintf(`{"id":%q,"suite":%q,"agent":%q,"levels":["easy","hard"],"replicas":1,"env":["MODEL=%s"],"models":[%q],"budget":{"attempt_usd":1}}`,
		c.agent, demo.SuiteName, c.agent, c.model, c.model)
	if code, body := cp.postRaw(ctx, t, req); code != http.StatusOK {
		t.Fatalf("POST /api/evaluations: %d %s", code, body)
	}
	var atts []coordinator.Attempt
	decided := func() bool {
		atts = nil
		if err := cp.tryGet(ctx, "/api/attempts?eval="+c.agent, &atts); err != nil || len(atts) == 0 {
			return false
		}
		for _, at := range atts {
			if at.State != core.StateDone && at.State != core.StateFailed {
				return false
			}
			if at.Kind == core.KindAgent && (at.Score == nil || at.Verification == nil || at.Verification.State == core.VerifyPending) {
				return false
			}
		}
		return true
	}
	for !decided() {
		select {
		case <-ctx.Done():
			dumpAttempts(ctx, t, cp, atts)
			t.Fatalf("not all decided: %d attempts", len(atts))
		case <-time.After(500 * time.Millisecond):
		}
	}
	t.Logf("%d attempts decided in %v", len(atts), time.Since(start).Round(time.Millisecond))

	// Every run right, at the scripted usage times the price table.
	u := c.usage
	output := u.Completion + u.Thoughts // thinking is billed as output
	callUSD := (float64(u.Prompt-u.Cached-u.CacheWrite)*cliPrice.Input + float64(u.Cached)*cliPrice.CachedInput +
		float64(u.CacheWrite)*cliPrice.CacheWrite + float64(output)*cliPrice.Output) / 1e6
	var runs, recorded, replays, verified int
	levels := map[string]int{}
	for _, at := range atts {
		if at.Outcome != "ok" {
			dumpAttempts(ctx, t, cp, atts)
			t.Fatalf("attempt %s (%s %s %s): outcome %q", at.ID, at.Kind, at.TaskID, at.Level, at.Outcome)
		}
		if at.Kind != core.KindAgent {
			replays++
			continue
		}
		runs++
		levels[at.Level]++
		// A new node's runs are replayed on the other node with the
		// recorded answers (the rate falls with clean replays): the CLI
		// ran the same tools to the same results.
		switch {
		case at.Verification.Verified():
			verified++
		case at.Verification.State != core.VerifyNotDrawn:
			t.Fatalf("attempt %s (%s %s): replay verification %+v", at.ID, at.TaskID, at.Level, at.Verification)
		}
		if at.Score.Value != 1 {
			dumpAttempts(ctx, t, cp, atts)
			t.Fatalf("attempt %s (%s %s): score %v %s", at.ID, at.TaskID, at.Level, at.Score.Value, at.Score.Public)
		}
		want := float64(c.calls) * callUSD
		if m := at.Model; m == nil || int64(m.Calls) != c.calls || fmt.Sprintf("%.7f", m.CostUSD) != fmt.Sprintf("%.7f", want) ||
			m.InputTokens != c.calls*u.Prompt || m.OutputTokens != c.calls*output {
			t.Fatalf("attempt %s (%s %s): model use %+v, want %d calls, $%.7f, tokens %d/%d", at.ID, at.TaskID, at.Level, m,
				c.calls, want, c.calls*u.Prompt, c.calls*output)
		}

		// Every call is in the trajectory, the provider's key in none, nor
		// in the sandbox's output.
		var traj []dashboard.Call
		if err := cp.tryGet(ctx, "/api/attempts/"+at.ID+"/trajectory", &traj); err != nil || int64(len(traj)) != c.calls {
			t.Fatalf("trajectory of %s: %d calls, want %d (%v)", at.ID, len(traj), c.calls, err)
		}
		recorded += len(traj)
		var cost float64
		for _, call := range traj {
			cost += call.CostUSD
			if call.Status != http.StatusOK || call.Model != c.model {
				t.Fatalf("attempt %s: call %d: %d %s %s", at.ID, call.Seq, call.Status, call.Model, call.Error)
			}
		}
		if fmt.Sprintf("%.7f", cost) != fmt.Sprintf("%.7f", want) {
			t.Fatalf("attempt %s: the trajectory's calls cost $%.7f, want $%.7f", at.ID, cost, want)
		}
		if second := traj[1].RequestBody; !strings.Contains(second, c.envKey+"="+gateway.TokenPrefix) {
			t.Fatalf("attempt %s: the agent's first command did not show its token in %s: %.2000s", at.ID, c.envKey, second)
		}
		var logs dashboard.Logs
		if err := cp.tryGet(ctx, "/api/attempts/"+at.ID+"/logs", &logs); err != nil || logs.ExitCode != 0 {
			t.Fatalf("logs of %s: exit %d, %v", at.ID, logs.ExitCode, err)
		}
		raw := cp.text(ctx, t, "/api/attempts/"+at.ID+"/trajectory")
		if strings.Contains(raw, providerKey) || strings.Contains(logs.Stdout+logs.Stderr, providerKey) {
			t.Fatalf("attempt %s: the provider's key is in its trajectory or output", at.ID)
		}
	}
	if levels["easy"] != levels["hard"] || runs != 2*levels["easy"] || runs == 0 || verified == 0 {
		t.Fatalf("runs by level: %v, %d verified by a replay", levels, verified)
	}
	if n := len(sim.Requests()); n != recorded {
		t.Fatalf("the provider answered %d calls, the trajectories hold %d", n, recorded)
	}
	t.Logf("%d runs right, %d verified by %d replays, %d calls recorded", runs, verified, replays, recorded)
	for _, nd := range dataDirs {
		err = filepath.WalkDir(nd, func(p string, de fs.DirEntry, err error) error {
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

// startConfiguredCoordinator starts `repronet coordinator --config FILE`
// (the sample suite, the agent registered by the file) on loopback, with
// an admin token.
func startConfiguredCoordinator(ctx context.Context, t *testing.T, bin, data, dir, config string) *coordProcess {
	t.Helper()
	cp := &coordProcess{bin: bin, data: data, dir: dir, http: freePort(t), token: "cliagents-test-token-0123456789"}
	cp.api = "http://" + cp.http
	cp.listen = "/ip4/127.0.0.1/tcp/" + strings.TrimPrefix(freePort(t), "127.0.0.1:")
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte(cp.token), 0o600); err != nil {
		t.Fatal(err)
	}
	addrFile := filepath.Join(dir, "addr")
	cmd := exec.Command(bin, "coordinator", "--config", config, "--data", data, "--listen", cp.listen, "--http", cp.http,
		"--addr-file", addrFile, "--admin-token-file", filepath.Join(dir, "token"))
	logf, err := os.Create(filepath.Join(dir, "coordinator.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cp.cmd, cp.exited = cmd, make(chan error, 1)
	go func() { cp.exited <- cmd.Wait() }()
	t.Cleanup(func() {
		cp.kill()
		if t.Failed() {
			t.Logf("coordinator log:\n%s", lastKB(cp.logText(), 16))
		}
	})
	waitFor(ctx, t, "the coordinator up", func() bool {
		cp.alive(t)
		b, err := os.ReadFile(addrFile)
		cp.addr = strings.TrimSpace(string(b))
		return err == nil && cp.addr != ""
	})
	return cp
}

// dumpAttempts logs each attempt's outcome and output tails.
func dumpAttempts(ctx context.Context, t *testing.T, cp *coordProcess, atts []coordinator.Attempt) {
	t.Helper()
	for _, at := range atts {
		var logs dashboard.Logs
		err := cp.tryGet(ctx, "/api/attempts/"+at.ID+"/logs", &logs)
		t.Logf("attempt %s (%s %s %s): %s %s %s (logs: %v)\nstdout: %s\nstderr: %s", at.ID, at.Kind, at.TaskID, at.Level, at.State, at.Outcome,
			at.Detail, err, lastKB(logs.Stdout, 3), lastKB(logs.Stderr, 3))
	}
}
