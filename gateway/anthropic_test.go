package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestMessagesUsage(t *testing.T) {
	for _, tc := range []struct {
		name string
		body string
		want Usage
		err  bool
	}{
		{"cache writes split by lifetime", `{"usage":{"input_tokens":10,"output_tokens":3,"cache_read_input_tokens":50,"cache_creation_input_tokens":40,"cache_creation":{"ephemeral_5m_input_tokens":30,"ephemeral_1h_input_tokens":10}}}`,
			Usage{Input: 100, Output: 3, CachedInput: 50, CacheWrite: 40, CacheWrite5m: 30}, false},
		{"a split that does not add up: all at the longest lifetime", `{"usage":{"input_tokens":10,"output_tokens":3,"cache_creation_input_tokens":40,"cache_creation":{"ephemeral_5m_input_tokens":35,"ephemeral_1h_input_tokens":10}}}`,
			Usage{Input: 50, Output: 3, CacheWrite: 40}, false},
		{"a negative split is ignored", `{"usage":{"input_tokens":10,"output_tokens":3,"cache_creation_input_tokens":40,"cache_creation":{"ephemeral_5m_input_tokens":50,"ephemeral_1h_input_tokens":-10}}}`,
			Usage{Input: 50, Output: 3, CacheWrite: 40}, false},
		{"no writes, a zero split", `{"usage":{"input_tokens":10,"output_tokens":3,"cache_creation":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0}}}`,
			Usage{Input: 10, Output: 3}, false},
		{"server tool uses", `{"usage":{"input_tokens":10,"output_tokens":3,"server_tool_use":{"web_search_requests":2,"web_fetch_requests":1}}}`,
			Usage{Input: 10, Output: 3, WebSearches: 2, WebFetches: 1}, false},
		{"negative server tool uses", `{"usage":{"input_tokens":10,"output_tokens":3,"server_tool_use":{"web_search_requests":-2}}}`, Usage{}, true},
	} {
		u, found, err := parseMessagesResponse([]byte(tc.body))
		if (err != nil) != tc.err || (!tc.err && (!found || u != tc.want)) {
			t.Errorf("%s: %+v %v %v; want %+v, error %v", tc.name, u, found, err, tc.want, tc.err)
		}
	}
}

// A stream with provider-side tools, citations and redacted thinking; its
// input grows during the turn, and the cumulative message_delta is what
// counts.
const serverToolStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_2","type":"message","role":"assistant","content":[],"usage":{"input_tokens":100,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"redacted_thinking","data":"ENCRYPTED"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"server_tool_use","id":"srvtoolu_1","name":"web_search","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"query\": \"go"}}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"lang\"}"}}

event: content_block_stop
data: {"type":"content_block_stop","index":1}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"web_search_tool_result","tool_use_id":"srvtoolu_1","content":[{"type":"web_search_result","url":"https://go.dev","title":"Go"}]}}

event: content_block_stop
data: {"type":"content_block_stop","index":2}

event: content_block_start
data: {"type":"content_block_start","index":3,"content_block":{"type":"text","text":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":3,"delta":{"type":"citations_delta","citation":{"type":"web_search_result_location","url":"https://go.dev"}}}

event: content_block_delta
data: {"type":"content_block_delta","index":3,"delta":{"type":"text_delta","text":"Go is a language."}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":5600,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":30,"server_tool_use":{"web_search_requests":1}}}

event: message_stop
data: {"type":"message_stop"}

`

func TestMessagesAssemblerServerTools(t *testing.T) {
	a := &messagesAssembler{}
	feed(t, a, []byte(serverToolStream))
	u, found, err := a.Usage()
	if !a.Complete() || !found || err != nil || u != (Usage{Input: 5600, Output: 30, WebSearches: 1}) {
		t.Fatalf("usage %+v %v %v", u, found, err)
	}
	var msg struct {
		Content []struct {
			Type, Data, Text string
			ToolUseID        string `json:"tool_use_id"`
			Input            map[string]any
			Content          []map[string]any
			Citations        []map[string]any
		}
	}
	if err := json.Unmarshal(a.Response(), &msg); err != nil || len(msg.Content) != 4 {
		t.Fatalf("%s (%v)", a.Response(), err)
	}
	c := msg.Content
	if c[0].Type != "redacted_thinking" || c[0].Data != "ENCRYPTED" || c[1].Input["query"] != "golang" || c[2].Type != "web_search_tool_result" || c[2].ToolUseID != "srvtoolu_1" ||
		len(c[2].Content) != 1 || c[3].Text != "Go is a language." || len(c[3].Citations) != 1 || c[3].Citations[0]["url"] != "https://go.dev" {
		t.Fatalf("reassembled %s", a.Response())
	}
}

func TestCheckBetas(t *testing.T) {
	allowed := anthropicBetas([]string{"extra-1"})
	for _, tc := range []struct {
		name  string
		lines []string
		want  string
		bad   []string
	}{
		{"none", nil, "", nil},
		{"Claude Code's", []string{"claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14"},
			"claude-code-20250219,interleaved-thinking-2025-05-14,fine-grained-tool-streaming-2025-05-14", nil},
		{"several lines, spaces, repeats, empties", []string{" prompt-caching-2024-07-31 ,", "extra-1, prompt-caching-2024-07-31,,"},
			"prompt-caching-2024-07-31,extra-1", nil},
		{"refused with reasons, all named", []string{"claude-code-20250219,oauth-2025-04-20", "files-api-2025-04-14,made-up"}, "",
			[]string{"oauth-2025-04-20 (the gateway calls", "files-api-2025-04-14 (", "made-up"}},
	} {
		h := http.Header{}
		for _, l := range tc.lines {
			h.Add("anthropic-beta", l)
		}
		got, err := checkBetas(h, allowed)
		if len(tc.bad) == 0 && (err != nil || got != tc.want) {
			t.Errorf("%s: %q %v, want %q", tc.name, got, err, tc.want)
		}
		for _, b := range tc.bad {
			if err == nil || !strings.Contains(err.Error(), b) {
				t.Errorf("%s: error %v does not name %q", tc.name, err, b)
			}
		}
	}
	for _, f := range DefaultAnthropicBetas() {
		if _, refused := refusedBetas[f]; refused {
			t.Errorf("%s is both allowed and refused", f)
		}
	}
}

func TestPrepareMessages(t *testing.T) {
	rt := route{model: Model{Name: "c"}, provider: Provider{AnthropicVersion: DefaultAnthropicVersion}, betas: anthropicBetas(nil),
		tools: map[string]serverTool{
			"web_search_20250305": {kind: "web_search", price: USD / 100, maxUses: 5, perUse: 1000},
			"web_fetch_20250910":  {kind: "web_fetch", maxUses: 2, perUse: 3000},
		}}
	for _, tc := range []struct {
		name   string
		body   string
		header map[string]string
		want   callExtra
		err    string
	}{
		{"plain", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, nil, callExtra{Rounds: 1}, ""},
		{"thinking needs 1025 tokens", `{"model":"c","max_tokens":5000,"thinking":{"type":"enabled","budget_tokens":2000},"messages":[{"role":"user","content":"x"}]}`, nil,
			callExtra{Rounds: 1, MinOutput: 1025}, ""},
		{"search at the configured most", `{"model":"c","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":50}],"messages":[{"role":"user","content":"x"}]}`, nil,
			callExtra{Rounds: 6, ToolTokens: 5000, Fees: 5 * USD / 100}, ""},
		{"search and fetch, the client's smaller max_uses", `{"model":"c","max_tokens":5,"tools":[{"type":"web_search_20250305","name":"web_search","max_uses":1},{"type":"web_fetch_20250910","name":"web_fetch"}],"messages":[{"role":"user","content":"x"}]}`, nil,
			callExtra{Rounds: 4, ToolTokens: 1000 + 2*3000, Fees: USD / 100}, ""},
		{"a version not configured", `{"model":"c","max_tokens":5,"tools":[{"type":"web_search_20260209","name":"web_search"}],"messages":[{"role":"user","content":"x"}]}`, nil,
			callExtra{}, `server tool "web_search_20260209"`},
		{"earlier search results, each bounded by the tool's tokens per use", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"server_tool_use","id":"s1","name":"web_search","input":{}},{"type":"web_search_tool_result","tool_use_id":"s1","content":[]},{"type":"web_search_tool_result","tool_use_id":"s2","content":[]},{"type":"text","text":"y"}]},{"role":"user","content":"z"}]}`, nil,
			callExtra{Rounds: 1, ToolTokens: 2000}, ""},
		{"a refused beta", `{"model":"c","max_tokens":5,"messages":[{"role":"user","content":"x"}]}`, map[string]string{"anthropic-beta": "context-1m-2025-08-07"},
			callExtra{}, "context-1m-2025-08-07"},
	} {
		r, err := parseMessagesRequest([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		h := http.Header{}
		for k, v := range tc.header {
			h.Set(k, v)
		}
		got, err := prepareMessages(r, rt, h)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || got.Rounds != tc.want.Rounds || got.ToolTokens != tc.want.ToolTokens || got.Fees != tc.want.Fees ||
			got.MinOutput != tc.want.MinOutput || got.Header.Get("anthropic-version") != DefaultAnthropicVersion {
			t.Errorf("%s: %+v %v, want %+v", tc.name, got, err, tc.want)
		}
	}
	r, err := parseMessagesRequest([]byte(`{"model":"c","max_tokens":5,"messages":[{"role":"assistant","content":[{"type":"web_fetch_tool_result","tool_use_id":"s1","content":{}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prepareMessages(r, route{model: Model{Name: "c"}, betas: anthropicBetas(nil)}, http.Header{}); err == nil || !strings.Contains(err.Error(), "web_fetch results") {
		t.Errorf("results of a tool the model is not offered: %v", err)
	}
	if got := (callExtra{Rounds: 3, ToolTokens: 100}).inputTokens(50); got != 450 {
		t.Errorf("input bound %d, want 3 rounds of 150", got)
	}
}

func TestRewriteMessagesServerTools(t *testing.T) {
	tools := map[string]serverTool{"web_search_20250305": {kind: "web_search", maxUses: 3, perUse: 1000},
		"web_fetch_20250910": {kind: "web_fetch", maxUses: 2, perUse: 4000}}
	body := `{"model":"c","max_tokens":9000,"tools":[{"name":"Bash","description":"a <b> & c","input_schema":{}},` +
		`{"type":"web_search_20250305","name":"web_search","max_uses":10},{"type":"web_fetch_20250910","name":"web_fetch","max_uses":1,"max_content_tokens":100000}],` +
		`"messages":[{"role":"user","content":"x"}]}`
	r, err := parseMessagesRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	out, err := rewriteMessages(r, "up", 500, tools)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Tools []map[string]any
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatal(err)
	}
	if got.Tools[1]["max_uses"] != 3.0 || got.Tools[2]["max_uses"] != 1.0 || got.Tools[2]["max_content_tokens"] != 4000.0 ||
		!bytes.Contains(out, []byte(`"a <b> & c"`)) {
		t.Fatalf("rewritten %s", out)
	}
}

func TestRateWindows(t *testing.T) {
	r := newRateWindows(2, time.Minute)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		key  string
		at   time.Duration
		ok   bool
		wait time.Duration
	}{
		{"a", 0, true, 0}, {"a", time.Second, true, 0}, {"a", 10 * time.Second, false, 50 * time.Second},
		{"b", 10 * time.Second, true, 0}, {"a", time.Minute, true, 0}, {"a", time.Minute, true, 0}, {"a", 61 * time.Second, false, 59 * time.Second},
	} {
		ok, wait := r.allow(tc.key, t0.Add(tc.at))
		if ok != tc.ok || wait != tc.wait {
			t.Errorf("%s at %v: %v %v, want %v %v", tc.key, tc.at, ok, wait, tc.ok, tc.wait)
		}
	}
	for i := range maxRateKeys + 10 {
		r.allow(strings.Repeat("k", i%50)+string(rune('a'+i%26))+time.Duration(i).String(), t0)
	}
	if len(r.keys) > maxRateKeys {
		t.Fatalf("%d keys kept", len(r.keys))
	}
}

func TestRelayedContentType(t *testing.T) {
	for in, want := range map[string]string{"application/json; charset=utf-8; key=sk-x": "application/json", "text/html": "text/html",
		"": "application/json", "application/x-evil": "application/json", "text/event-stream": "text/event-stream", "%%%": "application/json"} {
		if got := relayedContentType(in); got != want {
			t.Errorf("%q: %q, want %q", in, got, want)
		}
	}
}

func FuzzBetaHeader(f *testing.F) {
	f.Add("claude-code-20250219,interleaved-thinking-2025-05-14", "oauth-2025-04-20")
	f.Fuzz(func(t *testing.T, a, b string) {
		allowed := anthropicBetas(nil)
		h := http.Header{"Anthropic-Beta": {a, b}}
		got, err := checkBetas(h, allowed)
		if err != nil {
			return
		}
		for _, f := range strings.Split(got, ",") {
			if f != "" && !allowed[f] {
				t.Fatalf("%q, %q: passed %q", a, b, f)
			}
		}
	})
}

func FuzzCountTokens(f *testing.F) {
	f.Add([]byte(`{"model":"c","messages":[{"role":"user","content":"x"}],"system":[{"type":"text","text":"s","cache_control":{"type":"ephemeral"}}]}`), []byte(`{"input_tokens":12}`))
	f.Fuzz(func(t *testing.T, req, answer []byte) {
		if r, err := parseCountTokensRequest(req); err == nil && (r.Model == "" || r.fields == nil) {
			t.Fatalf("accepted %q as %+v", req, r)
		}
		if n, err := parseCountAnswer(answer); err == nil && n < 0 {
			t.Fatalf("%q: count %d", answer, n)
		}
	})
}

func FuzzMessagesUsage(f *testing.F) {
	f.Add([]byte(serverToolStream))
	f.Add([]byte("data: {\"type\":\"message_delta\",\"usage\":{\"input_tokens\":1,\"output_tokens\":1,\"cache_creation_input_tokens\":5,\"cache_creation\":{\"ephemeral_5m_input_tokens\":9}}}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) { feed(t, &messagesAssembler{}, b) })
}
