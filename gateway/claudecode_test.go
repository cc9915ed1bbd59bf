package gateway_test

import (
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/modelsim"
)

// TestClaudeCode runs Claude Code itself through the gateway, unchanged,
// against the scripted model on loopback: a main model that reads a file
// with the Bash tool and answers, and a small model for Claude Code's side
// calls, both granted. It runs when REPRONET_CLAUDE_CODE names Claude
// Code's cli.js (npm install @anthropic-ai/claude-code@2.0.54; Node 18 or
// later), and is skipped otherwise: the test suite fetches nothing.
//
//	REPRONET_CLAUDE_CODE=/tmp/cc/node_modules/@anthropic-ai/claude-code/cli.js go test -run TestClaudeCode -v ./gateway/
func TestClaudeCode(t *testing.T) {
	cli := os.Getenv("REPRONET_CLAUDE_CODE")
	if cli == "" {
		t.Skip("REPRONET_CLAUDE_CODE does not name Claude Code's cli.js")
	}
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{Model: "claude-sim", ToolResultContains: "ANSWER=42"}, Reply: modelsim.Reply{Content: "The answer is 42.",
			Usage: modelsim.Usage{Prompt: 9000, Cached: 8000, CacheWrite: 900}}},
		{When: modelsim.Cond{Model: "claude-sim", ToolOffered: "Bash"}, Reply: modelsim.Reply{Content: "Let me read it.",
			ToolCalls: []modelsim.ToolCall{{ID: "toolu_01", Name: "Bash", Arguments: `{"command":"cat answer.txt","description":"Read the answer"}`}},
			Usage:     modelsim.Usage{Prompt: 9000, CacheWrite: 8900}}},
		{Reply: modelsim.Reply{Content: "ok"}},
	}}
	// Both models granted; then the main one alone: Claude Code's side
	// calls to the small model are refused (403) and it still answers.
	for _, granted := range [][]string{{"claude-sim", "claude-haiku-sim"}, {"claude-sim"}} {
		t.Run(strings.Join(granted, "+"), func(t *testing.T) { runClaudeCode(t, cli, script, granted) })
	}
}

func runClaudeCode(t *testing.T, cli string, script modelsim.Script, granted []string) {
	r := newRig(t, script, func(c *gateway.Config) {
		c.Models = append(c.Models, gateway.Model{Name: "claude-haiku-sim", Provider: "sim-anthropic", Price: claudePrice, MaxOutput: 4096})
		c.Models[1].MaxOutput = 32000
	})
	tok := r.grant(t, "at-cc", gateway.USD, func(g *gateway.Grant) { g.Models = granted })
	work := t.TempDir()
	if err := os.WriteFile(filepath.Join(work, "answer.txt"), []byte("ANSWER=42\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", cli, "-p", "What is the answer in answer.txt?", "--allowedTools", "Bash(cat:*)", "--output-format", "json")
	cmd.Dir = work
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + t.TempDir(), "ANTHROPIC_BASE_URL=" + r.srv.URL, "ANTHROPIC_API_KEY=" + tok,
		"ANTHROPIC_MODEL=claude-sim", "ANTHROPIC_DEFAULT_HAIKU_MODEL=claude-haiku-sim", "ANTHROPIC_SMALL_FAST_MODEL=claude-haiku-sim",
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_AUTOUPDATER=1", "DISABLE_TELEMETRY=1", "DISABLE_ERROR_REPORTING=1"}
	out, err := cmd.CombinedOutput()
	calls := trajectory(t, r, "at-cc")
	for i, c := range calls {
		t.Logf("call %d: %s %s status %d stream %v cost %v usage %+v %s", i, c.API, c.Model, c.Status, c.Stream, c.Cost, c.Usage, c.Error)
	}
	for i, q := range r.sim.Requests() {
		var fields map[string]json.RawMessage
		_ = json.Unmarshal(q.Body, &fields)
		keys := slices.Sorted(maps.Keys(fields))
		t.Logf("provider request %d: %s beta %q fields %v thinking %s", i, q.Path, q.Header.Get("anthropic-beta"), keys, fields["thinking"])
	}
	if err != nil {
		t.Fatalf("claude: %v\n%s", err, out)
	}
	var res struct {
		Result  string  `json:"result"`
		IsError bool    `json:"is_error"`
		Cost    float64 `json:"total_cost_usd"`
	}
	if err := json.Unmarshal(out[strings.LastIndexByte(strings.TrimSpace(string(out))[:len(strings.TrimSpace(string(out)))-1], '\n')+1:], &res); err != nil {
		_ = json.Unmarshal(out, &res)
	}
	if res.IsError || !strings.Contains(res.Result, "42") {
		t.Fatalf("Claude Code answered %s", out)
	}
	var answered, bash bool
	for _, c := range calls {
		if c.Status != 200 && c.API != gateway.CallAnthropicCountTokens {
			t.Errorf("call %s %s: %d %s", c.API, c.Model, c.Status, c.Error)
		}
		if c.Model == "claude-sim" && strings.Contains(string(c.ResponseBody), "The answer is 42.") {
			answered = true
		}
		if strings.Contains(string(c.RequestBody), "ANSWER=42") {
			bash = true
		}
	}
	if !answered || !bash {
		t.Fatalf("the trajectory does not hold the tool result and the answer (%d calls)", len(calls))
	}
	if s := spent(t, r, "attempt/at-cc"); s == 0 || s > gateway.USD {
		t.Fatalf("spent %v", s)
	}
	if !slices.ContainsFunc(r.sim.Requests(), func(q modelsim.Recorded) bool {
		return strings.Contains(q.Header.Get("anthropic-beta"), "claude-code-20250219")
	}) {
		t.Error("no request carried Claude Code's beta flags to the provider")
	}
	for _, q := range r.sim.Requests() {
		if !slices.Contains(granted, modelOf(q.Body)) {
			t.Errorf("a call of %s reached the provider: not granted", modelOf(q.Body))
		}
	}
}

// modelOf is the model a request body names.
func modelOf(body []byte) string {
	var b struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal(body, &b)
	return b.Model
}
