package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/verify"
)

// Tests of what Claude Code needs of the Messages API: prompt caching
// priced by lifetime, extended thinking streamed and bounded, token
// counting, the anthropic-beta allow-list, provider-side tools, and the
// provider key kept in the gateway whatever the provider answers.

// cachePrice is a model whose cache writes are priced by lifetime: one
// hour at 2 × input, five minutes at 1.25 × input.
var cachePrice = gateway.PriceUSD{Input: 3, Output: 15, CachedInput: 0.3, CacheWrite: 6, CacheWrite5m: 3.75}

func withCacheModel(c *gateway.Config) {
	c.Models = append(c.Models, gateway.Model{Name: "claude-cache", Provider: "sim-anthropic", Upstream: "claude-cache-2026",
		Price: cachePrice, MaxOutput: 4096})
}

// costByLifetime is what usage costs at p, computed here: dollars per
// million tokens times tokens, cache writes split by lifetime.
func costByLifetime(p gateway.PriceUSD, fresh, read, write5m, write1h, output int64) gateway.Money {
	usd := (float64(fresh)*p.Input + float64(read)*p.CachedInput + float64(write5m)*p.CacheWrite5m +
		float64(write1h)*p.CacheWrite + float64(output)*p.Output) / 1e6
	m, _ := gateway.Dollars(usd)
	return m
}

func userMessages(text string) []any {
	return []any{map[string]any{"role": "user", "content": text}}
}

func TestCachePricing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		usage  modelsim.Usage
		stream bool
	}{
		// Within the call's bound (the body's bytes and 1024 tokens of
		// overhead), so that the cost is charged whole.
		{"no cache", modelsim.Usage{Prompt: 1000, Completion: 7}, false},
		{"reads only", modelsim.Usage{Prompt: 1000, Cached: 800, Completion: 7}, true},
		{"five-minute writes", modelsim.Usage{Prompt: 1000, CacheWrite: 600, Completion: 7}, false},
		{"one-hour writes", modelsim.Usage{Prompt: 1000, CacheWrite: 600, CacheWrite1h: 600, Completion: 7}, true},
		{"both lifetimes and reads", modelsim.Usage{Prompt: 1100, Cached: 500, CacheWrite: 400, CacheWrite1h: 150, Completion: 7}, true},
		{"both lifetimes and reads, not streamed", modelsim.Usage{Prompt: 1100, Cached: 500, CacheWrite: 400, CacheWrite1h: 150, Completion: 7}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: "Cached answer here.", Usage: tc.usage}), withCacheModel)
			tok := r.grant(t, "at-1", gateway.USD, nil)
			status, body := call(t, r.srv.URL, "/v1/messages", tok, map[string]any{"model": "claude-cache", "max_tokens": 100,
				"stream": tc.stream, "messages": userMessages("hi")}, nil)
			if status != 200 {
				t.Fatalf("%d %s", status, body)
			}
			u := tc.usage
			want := costByLifetime(cachePrice, u.Prompt-u.Cached-u.CacheWrite, u.Cached, u.CacheWrite-u.CacheWrite1h, u.CacheWrite1h, u.Completion)
			c := trajectory(t, r, "at-1")[0]
			wantUsage := gateway.Usage{Input: u.Prompt, Output: u.Completion, CachedInput: u.Cached, CacheWrite: u.CacheWrite,
				CacheWrite5m: u.CacheWrite - u.CacheWrite1h}
			if c.Cost != want || c.Charged != want || c.Usage != wantUsage || !c.UsageReported {
				t.Fatalf("cost %v charged %v usage %+v (reported %v); want %v, %+v", c.Cost, c.Charged, c.Usage, c.UsageReported, want, wantUsage)
			}
			if s := spent(t, r, "attempt/at-1"); s != want {
				t.Fatalf("spent %v, want %v", s, want)
			}
			// The bound priced the input at the dearest of input and
			// cache writes (6 > 3.75 > 3): whatever the cache did, the
			// bound held.
			if c.Bound < want || c.Bound < gateway.Money(float64(len(c.RequestBody))*6e6) {
				t.Fatalf("bound %v: below the cost %v or the input at the cache-write price", c.Bound, want)
			}
		})
	}
}

func TestCacheWriteNoSplit(t *testing.T) {
	// A provider that reports cache writes without their lifetimes: all
	// are priced at the longest lifetime's price.
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"id":"m","type":"message","role":"assistant","content":[{"type":"text","text":"ok"}],"stop_reason":"end_turn",`+
			`"usage":{"input_tokens":100,"output_tokens":5,"cache_creation_input_tokens":900,"cache_read_input_tokens":0}}`)
	}))
	t.Cleanup(up.Close)
	r := newRig(t, modelsim.Script{}, func(c *gateway.Config) {
		c.Providers = append(c.Providers, gateway.Provider{Name: "plain", API: gateway.APIAnthropic, BaseURL: up.URL, Key: anthropicKey})
		c.Models = append(c.Models, gateway.Model{Name: "claude-plain", Provider: "plain", Price: cachePrice, MaxOutput: 100})
	})
	tok := r.grant(t, "at-1", gateway.USD, nil)
	if status, body := call(t, r.srv.URL, "/v1/messages", tok, map[string]any{"model": "claude-plain", "max_tokens": 10, "messages": userMessages("x")}, nil); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	c := trajectory(t, r, "at-1")[0]
	if want := costByLifetime(cachePrice, 100, 0, 0, 900, 5); c.Cost != want {
		t.Fatalf("cost %v, want %v (unsplit writes at the one-hour price)", c.Cost, want)
	}
}

// claudeCodeBody is a request shaped as Claude Code 2.x sends it: system
// blocks with cache_control, tools with input_schema, metadata, thinking,
// a stream.
func claudeCodeBody(model string, maxTokens, budget int, msgs []any) map[string]any {
	b := map[string]any{
		"model": model, "max_tokens": maxTokens, "stream": true, "temperature": 1,
		"system": []any{
			map[string]any{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."},
			map[string]any{"type": "text", "text": "Use the tools to answer.", "cache_control": map[string]any{"type": "ephemeral"}},
		},
		"tools": []any{
			map[string]any{"name": "Bash", "description": "Run a command <in a shell>", "input_schema": map[string]any{"type": "object",
				"properties": map[string]any{"command": map[string]any{"type": "string"}}, "required": []string{"command"}}},
			map[string]any{"name": "Read", "description": "Read a file", "input_schema": map[string]any{"type": "object"}},
		},
		"metadata": map[string]any{"user_id": "user_abc_account__session_123"},
		"messages": msgs,
	}
	if budget > 0 {
		b["thinking"] = map[string]any{"type": "enabled", "budget_tokens": budget}
	}
	return b
}

// claudeCodeBetas are the anthropic-beta flags Claude Code 2.x sends with
// an API key.
const claudeCodeBetas = "claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14,context-management-2025-06-27"

func TestThinkingStream(t *testing.T) {
	reply := modelsim.Reply{Thinking: "Let me look at the file first, then answer.", RedactedThinking: "RVhBTVBMRSByZWRhY3RlZA==",
		Content: "I will read it.", ToolCalls: []modelsim.ToolCall{{ID: "toolu_1", Name: "Read", Arguments: `{"file_path":"/w/a.txt"}`}},
		Usage: modelsim.Usage{Prompt: 3000, Cached: 2000, CacheWrite: 500}}
	r := newRig(t, modelsim.Sequence(reply), withCacheModel)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	hdr := map[string]string{"anthropic-beta": claudeCodeBetas, "anthropic-version": "2023-06-01"}
	status, body := call(t, r.srv.URL, "/v1/messages", tok, claudeCodeBody("claude-cache", 8000, 6000, userMessages("what is in a.txt?")), hdr)
	if status != 200 || !bytes.Contains(body, []byte("signature_delta")) || !bytes.Contains(body, []byte("redacted_thinking")) {
		t.Fatalf("%d %s", status, body)
	}
	// Forwarded: max_tokens lowered to the model's 4096, the thinking
	// budget below it, the betas as sent.
	fwd := r.sim.Requests()[0]
	var sent struct {
		Model     string `json:"model"`
		MaxTokens int64  `json:"max_tokens"`
		Thinking  struct {
			BudgetTokens int64 `json:"budget_tokens"`
		} `json:"thinking"`
		Metadata map[string]string `json:"metadata"`
		Tools    []map[string]any  `json:"tools"`
	}
	if err := json.Unmarshal(fwd.Body, &sent); err != nil || sent.Model != "claude-cache-2026" || sent.MaxTokens != 4096 ||
		sent.Thinking.BudgetTokens != 4095 || sent.Metadata["user_id"] == "" || sent.Tools[0]["description"] != "Run a command <in a shell>" {
		t.Fatalf("forwarded %s", fwd.Body)
	}
	if fwd.Header.Get("anthropic-beta") != claudeCodeBetas || fwd.Header.Get("x-api-key") != anthropicKey {
		t.Fatalf("forwarded headers %v", fwd.Header)
	}
	// Recorded: the stream assembled into the Message it amounts to.
	c := trajectory(t, r, "at-1")[0]
	var msg struct {
		Content []struct {
			Type, Text, Thinking, Signature, Data, ID, Name string
			Input                                           map[string]any
		}
		StopReason string `json:"stop_reason"`
	}
	if err := json.Unmarshal(c.ResponseBody, &msg); err != nil || len(msg.Content) != 4 {
		t.Fatalf("recorded %s (%v)", c.ResponseBody, err)
	}
	th, red, text, use := msg.Content[0], msg.Content[1], msg.Content[2], msg.Content[3]
	if th.Type != "thinking" || th.Thinking != reply.Thinking || th.Signature == "" || red.Type != "redacted_thinking" ||
		red.Data != reply.RedactedThinking || text.Text != reply.Content || use.Type != "tool_use" || use.Input["file_path"] != "/w/a.txt" ||
		msg.StopReason != "tool_use" {
		t.Fatalf("recorded content %+v, stop %q", msg.Content, msg.StopReason)
	}
	// Thinking tokens are output tokens, charged at the output price.
	out := int64(len(modelsim.Tokens(reply.Thinking)) + len(modelsim.Tokens(reply.Content)) + 1 + len(modelsim.Tokens(reply.ToolCalls[0].Arguments)))
	want := costByLifetime(cachePrice, 500, 2000, 500, 0, out)
	if c.Usage.Output != out || c.Cost != want || c.FirstTokenMS <= 0 {
		t.Fatalf("usage %+v cost %v first token %v ms; want %d output tokens, %v", c.Usage, c.Cost, c.FirstTokenMS, out, want)
	}
}

// Extended thinking needs max_tokens above 1024: a budget that cannot pay
// for 1025 output tokens refuses the call (402), as it would any other.
func TestThinkingFloor(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Thinking: "hm", Content: "ok"}), nil)
	budget := gateway.USD / 100 // $0.01: the input and a few hundred output tokens, not 1025
	plain := r.grant(t, "at-1", budget, nil)
	status, body := call(t, r.srv.URL, "/v1/messages", plain, claudeCodeBody("claude-sim", 2000, 0, userMessages("hi")), nil)
	if status != 200 {
		t.Fatalf("without thinking: %d %s", status, body)
	}
	thinking := r.grant(t, "at-2", budget, nil)
	status, body = call(t, r.srv.URL, "/v1/messages", thinking, claudeCodeBody("claude-sim", 2000, 1024, userMessages("hi")), nil)
	if status != http.StatusPaymentRequired || !bytes.Contains(body, []byte("budget_exhausted")) {
		t.Fatalf("with thinking: %d %s", status, body)
	}
	var sent struct {
		MaxTokens int64 `json:"max_tokens"`
	}
	_ = json.Unmarshal(r.sim.Requests()[0].Body, &sent)
	if sent.MaxTokens >= 1025 || sent.MaxTokens < gateway.DefaultMinOutputTokens || len(r.sim.Requests()) != 1 {
		t.Fatalf("the plain call asked for %d tokens (want 16 to 1024), the provider got %d calls", sent.MaxTokens, len(r.sim.Requests()))
	}
}

func TestAnthropicBetas(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: "ok"}), func(c *gateway.Config) {
		withCacheModel(c)
		c.Providers = append(c.Providers, gateway.Provider{Name: "sim-extra", API: gateway.APIAnthropic, BaseURL: c.Providers[1].BaseURL,
			Key: anthropicKey, AnthropicBetas: []string{"new-feature-2026-01-01"}})
		c.Models = append(c.Models, gateway.Model{Name: "claude-extra", Provider: "sim-extra", Price: claudePrice, MaxOutput: 100})
	})
	tok := r.grant(t, "at-1", gateway.USD, nil)
	for _, tc := range []struct {
		name, model, betas string
		status             int
		named              []string
	}{
		{"Claude Code's default", "claude-cache", claudeCodeBetas, 200, nil},
		{"one flag per line and spaces", "claude-cache", " effort-2025-11-24 ,, token-efficient-tools-2025-02-19", 200, nil},
		{"long context is priced above the table", "claude-cache", "claude-code-20250219,context-1m-2025-08-07", 400, []string{"context-1m-2025-08-07", "200k"}},
		{"OAuth and an unknown flag, both named", "claude-cache", "oauth-2025-04-20,new-feature-2026-01-01", 400, []string{"oauth-2025-04-20", "new-feature-2026-01-01"}},
		{"a flag the provider's configuration adds", "claude-extra", "new-feature-2026-01-01", 200, nil},
	} {
		before := len(r.sim.Requests())
		status, body := call(t, r.srv.URL, "/v1/messages", tok, map[string]any{"model": tc.model, "max_tokens": 10, "messages": userMessages("hi")},
			map[string]string{"anthropic-beta": tc.betas})
		if status != tc.status {
			t.Errorf("%s: %d %s", tc.name, status, body)
			continue
		}
		for _, n := range tc.named {
			if !bytes.Contains(body, []byte(n)) {
				t.Errorf("%s: refusal %s does not name %q", tc.name, body, n)
			}
		}
		reqs := r.sim.Requests()
		if tc.status != 200 {
			if len(reqs) != before {
				t.Errorf("%s: a refused call reached the provider", tc.name)
			}
			continue
		}
		var want []string
		for _, f := range strings.Split(tc.betas, ",") {
			if f = strings.TrimSpace(f); f != "" {
				want = append(want, f)
			}
		}
		if got := reqs[len(reqs)-1].Header.Get("anthropic-beta"); got != strings.Join(want, ",") {
			t.Errorf("%s: forwarded anthropic-beta %q, want %q", tc.name, got, strings.Join(want, ","))
		}
	}
}

func TestServerTools(t *testing.T) {
	search := map[string]any{"type": "web_search_20250305", "name": "web_search", "max_uses": 10}
	body := func(model string) map[string]any {
		return map[string]any{"model": model, "max_tokens": 200, "messages": userMessages("search it"),
			"tools": []any{map[string]any{"name": "Bash", "input_schema": map[string]any{"type": "object"}}, search}}
	}
	reply := modelsim.Reply{Content: "Found it.", WebSearches: 2, Usage: modelsim.Usage{Prompt: 9000, Completion: 20}}
	r := newRig(t, modelsim.Sequence(reply), func(c *gateway.Config) {
		c.Models = append(c.Models, gateway.Model{Name: "claude-search", Provider: "sim-anthropic", Price: claudePrice, MaxOutput: 1000,
			ServerTools: map[string]gateway.ServerTool{"web_search_20250305": {Price: 0.01, MaxUses: 3, InputTokensPerUse: 5000}}})
	})
	tok := r.grant(t, "at-1", gateway.USD, nil)
	// Not priced for the model: refused, naming the tool.
	status, out := call(t, r.srv.URL, "/v1/messages", tok, body("claude-sim"), nil)
	if status != 400 || !bytes.Contains(out, []byte("web_search_20250305")) || len(r.sim.Requests()) != 0 {
		t.Fatalf("an unpriced server tool: %d %s", status, out)
	}
	// Priced: max_uses lowered to the configured 3, the uses metered.
	status, out = call(t, r.srv.URL, "/v1/messages", tok, body("claude-search"), nil)
	if status != 200 || !bytes.Contains(out, []byte("web_search_tool_result")) {
		t.Fatalf("a priced server tool: %d %s", status, out)
	}
	var sent struct {
		Tools []struct {
			Type    string `json:"type"`
			MaxUses int64  `json:"max_uses"`
		} `json:"tools"`
	}
	if err := json.Unmarshal(r.sim.Requests()[0].Body, &sent); err != nil || sent.Tools[1].MaxUses != 3 {
		t.Fatalf("forwarded tools %+v (%v): want max_uses 3", sent.Tools, err)
	}
	c := trajectory(t, r, "at-1")[0] // the refused call was answered, not recorded
	want := cost(claudePrice, 9000, 0, 0, 20) + 2*gateway.USD/100
	if c.Usage.WebSearches != 2 || c.Cost != want {
		t.Fatalf("usage %+v cost %v, want 2 searches and %v", c.Usage, c.Cost, want)
	}
	// The bound: 3 uses' fees, and the input read again after each use
	// with what the uses added.
	in := int64(len(c.RequestBody)) + 1024 + 3*5000
	if minBound := gateway.Money(4*in)*3_750_000 + 3*gateway.USD/100; c.Bound < minBound {
		t.Fatalf("bound %v, want at least %v", c.Bound, minBound)
	}
	// The next turn sends the searches back (opaque results, each bounded
	// by the tool's tokens per use).
	var first struct {
		Content []json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(out, &first); err != nil || len(first.Content) != 5 {
		t.Fatalf("answer %s: want 2 × (search, result) and text", out)
	}
	next := body("claude-search")
	next["messages"] = append(userMessages("search it"), map[string]any{"role": "assistant", "content": first.Content},
		map[string]any{"role": "user", "content": "thanks"})
	if status, out = call(t, r.srv.URL, "/v1/messages", tok, next, nil); status != 200 {
		t.Fatalf("the turn after the searches: %d %s", status, out)
	}
	if c2 := trajectory(t, r, "at-1")[1]; c2.Bound < gateway.Money(4*(int64(len(c2.RequestBody))+1024+3*5000+2*5000))*3_750_000 {
		t.Fatalf("the next turn's bound %v does not cover the results sent back", c2.Bound)
	}
	// A budget that cannot pay the fees refuses the call.
	poor := r.grant(t, "at-2", 3*gateway.USD/100, nil)
	if status, out = call(t, r.srv.URL, "/v1/messages", poor, body("claude-search"), nil); status != http.StatusPaymentRequired {
		t.Fatalf("a budget under the fees: %d %s", status, out)
	}
}

func TestCountTokens(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: "ok"}), func(c *gateway.Config) {
		withCacheModel(c)
		c.Limits.CountTokensPerMinute = 3
	})
	tok := r.grant(t, "at-1", gateway.Money(1), func(g *gateway.Grant) { g.Models = []string{"claude-cache", "gpt-sim"} })
	hdr := map[string]string{"anthropic-beta": claudeCodeBetas, "x-api-key": tok}
	req := claudeCodeBody("claude-cache", 0, 0, userMessages("how long is this?"))
	delete(req, "max_tokens")
	delete(req, "stream")
	status, body := call(t, r.srv.URL, "/v1/messages/count_tokens", "", req, hdr)
	if status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	var n struct {
		InputTokens int64 `json:"input_tokens"`
	}
	got := r.sim.Requests()
	if err := json.Unmarshal(body, &n); err != nil || n.InputTokens != int64(len(got[0].Body)+3)/4 {
		t.Fatalf("answer %s (%v), provider body %d bytes", body, err, len(got[0].Body))
	}
	if got[0].Path != "/v1/messages/count_tokens" || got[0].Header.Get("x-api-key") != anthropicKey ||
		got[0].Header.Get("anthropic-beta") != claudeCodeBetas || !bytes.Contains(got[0].Body, []byte(`"model":"claude-cache-2026"`)) {
		t.Fatalf("forwarded %s %v %s", got[0].Path, got[0].Header, got[0].Body)
	}
	calls := trajectory(t, r, "at-1")
	c := calls[0]
	if len(calls) != 1 || c.API != gateway.CallAnthropicCountTokens || c.Status != 200 || c.Cost != 0 || c.Charged != 0 ||
		!bytes.Equal(c.ResponseBody, body) || c.Chain == "" {
		t.Fatalf("recorded %+v", c.Call)
	}
	if s := spent(t, r, "attempt/at-1"); s != 0 {
		t.Fatalf("counting spent %v", s)
	}
	// Free, so not stopped by the budget (1 pico-dollar), but bounded in
	// rate: 3 a minute here.
	for i := 2; i <= 4; i++ {
		status, body = call(t, r.srv.URL, "/v1/messages/count_tokens", "", req, hdr)
		if (i <= 3 && status != 200) || (i == 4 && (status != http.StatusTooManyRequests || !bytes.Contains(body, []byte("rate_limit_error")))) {
			t.Fatalf("count %d: %d %s", i, status, body)
		}
	}
	for _, tc := range []struct {
		name   string
		model  string
		status int
	}{{"a model not granted", "claude-sim", 403}, {"an OpenAI model", "gpt-sim", 400}, {"an unknown model", "nope", 404}} {
		other := r.grant(t, "at-other-"+tc.model, gateway.USD, func(g *gateway.Grant) { g.Models = []string{"claude-cache", "gpt-sim"} })
		b := map[string]any{"model": tc.model, "messages": userMessages("x")}
		if status, body := call(t, r.srv.URL, "/v1/messages/count_tokens", "", b, map[string]string{"x-api-key": other}); status != tc.status {
			t.Errorf("%s: %d %s", tc.name, status, body)
		}
	}
	// Not a model call: no HAL entry; among the exchanges verification
	// reads no turn of a conversation (no finding, nothing bound); the
	// chain covers it.
	calls = trajectory(t, r, "at-1")
	if h, err := gateway.ToHAL("task", calls); err != nil || len(h.Calls) != 0 || h.CostUSD != 0 {
		t.Fatalf("HAL %+v %v", h, err)
	}
	if ex := gateway.Exchanges(calls); len(ex) != len(calls) || len(verify.CheckAppendOnly(ex)) != 0 {
		t.Fatalf("exchanges %d, findings %+v", len(ex), verify.CheckAppendOnly(ex))
	}
	plain := make([]gateway.Call, len(calls))
	for i, c := range calls {
		plain[i] = c.Call
	}
	if head, err := gateway.ChainOf("at-1", plain); err != nil || head != calls[len(calls)-1].Chain {
		t.Fatalf("chain %s %v", head, err)
	}
}

// A replay answers token counts and model calls each in their own order:
// whether the agent counts tokens never shifts a model call's answer.
func TestReplayCountTokens(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: "first"}, modelsim.Reply{Content: "second"}), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	count := map[string]any{"model": "claude-sim", "messages": userMessages("x")}
	turn := func(n int) map[string]any {
		msgs := userMessages("x")
		if n == 2 {
			msgs = append(msgs, map[string]any{"role": "assistant", "content": "first"}, map[string]any{"role": "user", "content": "again"})
		}
		return map[string]any{"model": "claude-sim", "max_tokens": 50, "messages": msgs}
	}
	for _, step := range []any{count, turn(1), count, turn(2)} {
		path := "/v1/messages"
		if _, ok := step.(map[string]any)["max_tokens"]; !ok {
			path += "/count_tokens"
		}
		if status, body := call(t, r.srv.URL, path, "", step, map[string]string{"x-api-key": tok}); status != 200 {
			t.Fatalf("%s: %d %s", path, status, body)
		}
	}
	rep := r.grant(t, "at-r", 0, func(g *gateway.Grant) { g.Replay = "at-1" })
	// The replay counts once, then makes both model calls.
	for i, step := range []struct {
		path, want string
		body       map[string]any
	}{{"/v1/messages", "first", turn(1)}, {"/v1/messages/count_tokens", "input_tokens", count}, {"/v1/messages", "second", turn(2)}} {
		status, body := call(t, r.srv.URL, step.path, "", step.body, map[string]string{"x-api-key": rep})
		if status != 200 || !bytes.Contains(body, []byte(step.want)) {
			t.Fatalf("replay step %d: %d %s, want %q", i, status, body, step.want)
		}
	}
	if n := len(r.sim.Requests()); n != 4 {
		t.Fatalf("the provider got %d calls, want the 4 recorded ones (the replay forwards nothing)", n)
	}
}

// misbehaving is a provider on loopback that puts the key it was given in
// every header it answers with, and in its body; for redirect it answers
// 302 to target with the key in the URL.
func misbehaving(t *testing.T, mode string, target string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("x-api-key")
		for _, h := range []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry", "Request-Id", "X-Request-Id", "Set-Cookie",
			"X-Echo", "Anthropic-Ratelimit-Requests-Remaining", "Www-Authenticate", "Link", "Trailer"} {
			w.Header().Set(h, key)
		}
		w.Header().Set("Request-Id", "req_"+key)
		switch mode {
		case "redirect":
			w.Header().Set("Location", target+"/v1/messages?key="+key)
			w.WriteHeader(http.StatusFound)
			_, _ = io.WriteString(w, `{"moved":"`+key+`"}`)
		case "refuse":
			w.Header().Set("Content-Type", "application/json; key="+key)
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down `+key+`"}}`)
		case "count":
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"input_tokens":12,"echo":"`+key+`"}`)
		case "stream":
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\""+key+"\",\"content\":[],\"usage\":{\"input_tokens\":5,\"output_tokens\":1}}}\n\n"+
				"event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":2}}\n\n"+
				"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"`+key+`","type":"message","content":[{"type":"text","text":"`+key+`"}],"usage":{"input_tokens":5,"output_tokens":2}}`)
		}
	}))
	t.Cleanup(s.Close)
	return s
}

// rawCall sends one request to the gateway over a plain TCP connection
// and returns every byte that came back (head, body, trailers).
func rawCall(t *testing.T, base, path, token string, body []byte) []byte {
	t.Helper()
	addr := strings.TrimPrefix(base, "http://")
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nx-api-key: %s\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s",
		path, token, len(body), body)
	out, err := io.ReadAll(bufio.NewReader(conn))
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	return out
}

// No byte of a provider key leaves the gateway toward the agent, whatever
// the provider answers: a redirect (never followed: the key would go where
// it points), a refusal, an answer or a stream with the key in every
// header and in the body.
func TestProviderKeyNeverRelayed(t *testing.T) {
	var elsewhere atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	t.Cleanup(target.Close)
	for _, tc := range []struct {
		mode, path string
		stream     bool
		status     string
	}{
		{"redirect", "/v1/messages", false, "502"},
		{"redirect", "/v1/messages", true, "502"},
		{"redirect", "/v1/messages/count_tokens", false, "502"},
		{"refuse", "/v1/messages", false, "429"},
		{"refuse", "/v1/messages/count_tokens", false, "429"},
		{"answer", "/v1/messages", false, "200"},
		{"stream", "/v1/messages", true, "200"},
		{"count", "/v1/messages/count_tokens", false, "200"},
	} {
		t.Run(tc.mode+tc.path, func(t *testing.T) {
			up := misbehaving(t, tc.mode, target.URL)
			r := newRig(t, modelsim.Script{}, func(c *gateway.Config) {
				c.Providers = append(c.Providers, gateway.Provider{Name: "bad", API: gateway.APIAnthropic, BaseURL: up.URL, Key: anthropicKey})
				c.Models = append(c.Models, gateway.Model{Name: "claude-bad", Provider: "bad", Price: claudePrice, MaxOutput: 100})
			})
			tok := r.grant(t, "at-1", gateway.USD, nil)
			body := map[string]any{"model": "claude-bad", "messages": userMessages("x")}
			if !strings.HasSuffix(tc.path, "count_tokens") {
				body["max_tokens"], body["stream"] = 10, tc.stream
			}
			b, _ := json.Marshal(body)
			// The rig's handler names the caller from X-Test-Node; the raw
			// call sends none, so the rig's own node is the caller.
			out := rawCall(t, r.srv.URL, tc.path, tok, b)
			if !bytes.HasPrefix(out, []byte("HTTP/1.1 "+tc.status)) {
				t.Fatalf("answer %s, want status %s", out, tc.status)
			}
			for _, secret := range []string{anthropicKey, "SECRET"} {
				if bytes.Contains(out, []byte(secret)) {
					t.Fatalf("the agent got the key (%q):\n%s", secret, out)
				}
			}
			for _, blob := range r.rec.Blobs() {
				if bytes.Contains(blob, []byte(anthropicKey)) {
					t.Fatalf("a recorded body holds the key: %s", blob)
				}
			}
		})
	}
	if n := elsewhere.Load(); n != 0 {
		t.Fatalf("a redirect was followed %d times: the key went where the provider pointed", n)
	}
}

// Allow-listed headers without a key pass: an SDK still sees Retry-After
// and the request ID.
func TestRelayedHeaders(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "7")
		w.Header().Set("Request-Id", "req_011")
		w.Header().Set("Set-Cookie", "session=abc")
		w.Header().Set("Anthropic-Ratelimit-Tokens-Remaining", "99")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = io.WriteString(w, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`)
	}))
	t.Cleanup(up.Close)
	r := newRig(t, modelsim.Script{}, func(c *gateway.Config) {
		c.Providers = append(c.Providers, gateway.Provider{Name: "busy", API: gateway.APIAnthropic, BaseURL: up.URL, Key: anthropicKey})
		c.Models = append(c.Models, gateway.Model{Name: "claude-busy", Provider: "busy", Price: claudePrice, MaxOutput: 100})
	})
	tok := r.grant(t, "at-1", gateway.USD, nil)
	b, _ := json.Marshal(map[string]any{"model": "claude-busy", "max_tokens": 10, "messages": userMessages("x")})
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, r.srv.URL+"/v1/messages", bytes.NewReader(b))
	req.Header.Set("x-api-key", tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "7" || resp.Header.Get("Request-Id") != "req_011" ||
		resp.Header.Get("Set-Cookie") != "" || resp.Header.Get("Anthropic-Ratelimit-Tokens-Remaining") != "" {
		t.Fatalf("%d %v", resp.StatusCode, resp.Header)
	}
}

// Through the node's proxy (libp2p), token counting reaches the gateway.
func TestCountTokensThroughNode(t *testing.T) {
	n := newP2PNet(t, modelsim.Sequence(modelsim.Reply{Content: "ok"}))
	h, p, _ := n.node(t, "at-1")
	n.rig.node = h.ID()
	tok := n.grant(t, "at-1", gateway.USD, nil)
	b, _ := json.Marshal(map[string]any{"model": "claude-sim", "messages": userMessages("count me")})
	req, _ := http.NewRequest(http.MethodPost, p.URL()+"/v1/messages/count_tokens", bytes.NewReader(b))
	req.Header.Set("x-api-key", tok)
	req.Header.Set("anthropic-beta", claudeCodeBetas)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || !bytes.Contains(out, []byte("input_tokens")) || resp.Header.Get(modelnet.ChainHeader) == "" {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, out)
	}
}
