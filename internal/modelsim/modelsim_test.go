package modelsim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestTokens(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"hello world", []string{"hello", " world"}},
		{"  two  spaces", []string{"  two", "  spaces"}},
		{"abcdefghijkl", []string{"abcdefgh", "ijkl"}},
		{"ééééé", []string{"éééé", "é"}}, // 8 bytes, cut at a character boundary
		{"a\nb", []string{"a", "\nb"}},
		{"trailing ", []string{"trailing", " "}},
	} {
		got := Tokens(tc.in)
		if strings.Join(got, "|") != strings.Join(tc.want, "|") || len(got) != len(tc.want) {
			t.Errorf("Tokens(%q) = %q, want %q", tc.in, got, tc.want)
		}
		if strings.Join(got, "") != tc.in {
			t.Errorf("Tokens(%q) joined is %q", tc.in, strings.Join(got, ""))
		}
	}
}

func FuzzTokens(f *testing.F) {
	f.Add("hello world, this is a test")
	f.Add("\xff\xfe ab")
	f.Fuzz(func(t *testing.T, s string) {
		toks := Tokens(s)
		if strings.Join(toks, "") != s {
			t.Fatalf("tokens of %q join to %q", s, strings.Join(toks, ""))
		}
		for _, tok := range toks {
			if tok == "" {
				t.Fatalf("empty token in %q", toks)
			}
		}
	})
}

func TestMatch(t *testing.T) {
	script := Script{Rules: []Rule{
		{When: Cond{ToolResultContains: "ANSWER=42"}, Reply: Reply{Content: "submit"}},
		{When: Cond{ToolChoice: "tool:read"}, Reply: Reply{Content: "forced read"}},
		{When: Cond{Turn: 1, ToolOffered: "bash"}, Reply: Reply{Content: "first with bash"}},
		{When: Cond{Turn: 1}, Reply: Reply{Content: "first"}},
		{When: Cond{Model: "m2", LastRole: "tool"}, Reply: Reply{Content: "m2 after tool"}},
		{When: Cond{AnyContains: "magic"}, Reply: Reply{Content: "magic"}},
	}}
	user := Message{Role: "user", Text: "go"}
	asst := Message{Role: "assistant", ToolCalls: []ToolCall{{ID: "c1", Name: "bash"}}}
	for _, tc := range []struct {
		name string
		req  Request
		want string // "" = no match
	}{
		{"first turn", Request{Model: "m", Messages: []Message{user}}, "first"},
		{"first turn with a tool", Request{Model: "m", Messages: []Message{user}, Tools: []string{"bash"}}, "first with bash"},
		{"tool result with the answer", Request{Model: "m", Messages: []Message{user, asst, {Role: "tool", Text: "out: ANSWER=42"}}}, "submit"},
		{"tool result without it, other model", Request{Model: "m2", Messages: []Message{user, asst, {Role: "tool", Text: "nothing"}}}, "m2 after tool"},
		{"tool result without it", Request{Model: "m", Messages: []Message{user, asst, {Role: "tool", Text: "nothing"}}}, ""},
		{"tool choice forced", Request{Model: "m", ToolChoice: "tool:read", Messages: []Message{user, asst, {Role: "tool", Text: "x"}}}, "forced read"},
		{"magic anywhere", Request{Model: "m", Messages: []Message{{Role: "system", Text: "magic"}, user, asst, user}}, "magic"},
		{"answer not in a tool result", Request{Model: "m", Messages: []Message{user, asst, {Role: "user", Text: "ANSWER=42"}}}, ""},
	} {
		got, err := script.Match(tc.req)
		if tc.want == "" {
			if err == nil || !strings.Contains(err.Error(), "no rule matches") {
				t.Errorf("%s: got %q, %v; want no match", tc.name, got.Content, err)
			}
			continue
		}
		if err != nil || got.Content != tc.want {
			t.Errorf("%s: got %q, %v; want %q", tc.name, got.Content, err, tc.want)
		}
	}
	seq := Sequence(Reply{Content: "one"}, Reply{Content: "two"})
	for turn, want := range []string{"one", "two", "two"} {
		var msgs []Message
		for range turn {
			msgs = append(msgs, user, Message{Role: "assistant", Text: "x"})
		}
		got, err := seq.Match(Request{Messages: append(msgs, user)})
		if err != nil || got.Content != want {
			t.Errorf("sequence turn %d: %q, %v; want %q", turn+1, got.Content, err, want)
		}
	}
}

func TestPlanReply(t *testing.T) {
	reply := Reply{Content: "one two three four", ToolCalls: []ToolCall{{ID: "a", Name: "bash", Arguments: `{"cmd": "ls"}`}}}
	// content 4 tokens; the call costs 1 + 2 ({"cmd": and "ls"}).
	for _, tc := range []struct {
		name      string
		max       int64
		r         Reply
		content   int
		calls     int
		truncated bool
		reported  int64
	}{
		{"no bound", 0, reply, 4, 1, false, 7},
		{"room for all", 7, reply, 4, 1, false, 7},
		{"no room for the call", 6, reply, 4, 0, true, 4},
		{"content cut", 2, reply, 2, 0, true, 2},
		{"ignores the bound", 2, Reply{Content: reply.Content, ToolCalls: reply.ToolCalls, IgnoreMaxTokens: true}, 4, 1, false, 7},
		{"over-reports", 2, Reply{Content: reply.Content, OverReport: 100}, 2, 0, true, 102},
		{"scripted usage capped by the bound", 3, Reply{Content: "a", Usage: Usage{Completion: 50}}, 1, 0, false, 3},
		{"tool choice none", -1, reply, 4, 0, false, 4},
	} {
		req := Request{MaxTokens: max(tc.max, 0), BodyBytes: 401}
		if tc.max < 0 {
			req.ToolChoice = "none"
		}
		p := planReply(tc.r, req)
		if len(p.content) != tc.content || len(p.calls) != tc.calls || p.truncated != tc.truncated || p.usage.Completion != tc.reported {
			t.Errorf("%s: content %d calls %d truncated %v reported %d; want %d %d %v %d", tc.name,
				len(p.content), len(p.calls), p.truncated, p.usage.Completion, tc.content, tc.calls, tc.truncated, tc.reported)
		}
		if p.usage.Prompt != 101 {
			t.Errorf("%s: prompt %d, want 101 (401 bytes / 4, rounded up)", tc.name, p.usage.Prompt)
		}
	}
}

func post(t *testing.T, s *Server, path, key string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.URL()+path, bytes.NewReader(b))
	if path == "/v1/messages" {
		req.Header.Set("x-api-key", key)
	} else {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// events reads an SSE body into its data lines (with their event names
// for Anthropic), in order.
func events(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	name := ""
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			d := strings.TrimPrefix(line, "data: ")
			if name != "" {
				d = name + " " + d
			}
			out = append(out, d)
			name = ""
		}
	}
	return out
}

func startSim(t *testing.T, script Script, opts Options) *Server {
	t.Helper()
	s, err := Start(script, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestOpenAI(t *testing.T) {
	script := Sequence(
		Reply{Content: "Let me look.", ToolCalls: []ToolCall{{ID: "call_1", Name: "bash", Arguments: `{"cmd":"cat answer.txt"}`}},
			Usage: Usage{Prompt: 120, Cached: 20}},
		Reply{Content: "Done.", TopLogprobs: [][]Logprob{{{Token: "Done.", Logprob: -0.5}, {Token: "No", Logprob: -1.5}}}},
	)
	s := startSim(t, script, Options{APIKey: "sk-sim"})
	req := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "bash"}}}}

	t.Run("non-streaming", func(t *testing.T) {
		resp := post(t, s, "/v1/chat/completions", "sk-sim", req)
		var got struct {
			Object  string `json:"object"`
			Choices []struct {
				Message struct {
					Content   string `json:"content"`
					ToolCalls []struct {
						ID       string `json:"id"`
						Function struct{ Name, Arguments string }
					} `json:"tool_calls"`
				} `json:"message"`
				FinishReason string `json:"finish_reason"`
			} `json:"choices"`
			Usage struct {
				PromptTokens        int64 `json:"prompt_tokens"`
				CompletionTokens    int64 `json:"completion_tokens"`
				PromptTokensDetails struct {
					CachedTokens int64 `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		ch := got.Choices[0]
		if got.Object != "chat.completion" || ch.Message.Content != "Let me look." || ch.FinishReason != "tool_calls" ||
			len(ch.Message.ToolCalls) != 1 || ch.Message.ToolCalls[0].Function.Arguments != `{"cmd":"cat answer.txt"}` {
			t.Fatalf("answer %+v", got)
		}
		// 3 content tokens, 1 for the call's name, 4 for its arguments
		// ({"cmd":" cat  answer. txt"}).
		if got.Usage.PromptTokens != 120 || got.Usage.CompletionTokens != 8 || got.Usage.PromptTokensDetails.CachedTokens != 20 {
			t.Fatalf("usage %+v, want 120 prompt (20 cached), 8 completion", got.Usage)
		}
	})

	t.Run("streaming with usage", func(t *testing.T) {
		r := map[string]any{"stream": true, "stream_options": map[string]any{"include_usage": true}}
		for k, v := range req {
			r[k] = v
		}
		resp := post(t, s, "/v1/chat/completions", "sk-sim", r)
		if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
			t.Fatalf("content type %q", ct)
		}
		evs := events(t, resp.Body)
		if evs[len(evs)-1] != "[DONE]" {
			t.Fatalf("last event %q", evs[len(evs)-1])
		}
		var content, args strings.Builder
		var usage map[string]any
		for _, e := range evs[:len(evs)-1] {
			var c struct {
				Choices []struct {
					Delta struct {
						Content   string
						ToolCalls []struct{ Function struct{ Arguments string } } `json:"tool_calls"`
					}
				}
				Usage map[string]any
			}
			if err := json.Unmarshal([]byte(e), &c); err != nil {
				t.Fatalf("chunk %q: %v", e, err)
			}
			if !strings.Contains(e, `"usage":`) {
				t.Fatalf("chunk %q lacks the usage key (include_usage)", e)
			}
			for _, ch := range c.Choices {
				content.WriteString(ch.Delta.Content)
				for _, tc := range ch.Delta.ToolCalls {
					args.WriteString(tc.Function.Arguments)
				}
			}
			if c.Usage != nil {
				if len(c.Choices) != 0 {
					t.Fatalf("usage chunk with choices: %q", e)
				}
				usage = c.Usage
			}
		}
		if content.String() != "Let me look." || args.String() != `{"cmd":"cat answer.txt"}` {
			t.Fatalf("streamed %q and arguments %q", content.String(), args.String())
		}
		if usage["completion_tokens"] != 8.0 || usage["prompt_tokens"] != 120.0 {
			t.Fatalf("usage %v", usage)
		}
	})

	t.Run("streaming without usage", func(t *testing.T) {
		r := map[string]any{"stream": true}
		for k, v := range req {
			r[k] = v
		}
		for _, e := range events(t, post(t, s, "/v1/chat/completions", "sk-sim", r).Body) {
			if strings.Contains(e, `"usage"`) {
				t.Fatalf("chunk %q has usage though the request did not ask", e)
			}
		}
	})

	t.Run("logprobs on the second turn", func(t *testing.T) {
		r := map[string]any{"model": "m", "logprobs": true, "top_logprobs": 2, "messages": []any{
			map[string]any{"role": "user", "content": "hi"},
			map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
				"function": map[string]any{"name": "bash", "arguments": "{}"}}}},
			map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "42"}}}
		var got struct {
			Choices []struct {
				Logprobs struct {
					Content []struct {
						Token       string
						Logprob     float64
						TopLogprobs []struct {
							Token   string
							Logprob float64
						} `json:"top_logprobs"`
					}
				}
			}
		}
		if err := json.NewDecoder(post(t, s, "/v1/chat/completions", "sk-sim", r).Body).Decode(&got); err != nil {
			t.Fatal(err)
		}
		lp := got.Choices[0].Logprobs.Content
		if len(lp) != 1 || lp[0].Token != "Done." || lp[0].Logprob != -0.5 || len(lp[0].TopLogprobs) != 2 || lp[0].TopLogprobs[1].Token != "No" {
			t.Fatalf("logprobs %+v", lp)
		}
	})

	t.Run("wrong key is echoed", func(t *testing.T) {
		resp := post(t, s, "/v1/chat/completions", "sk-wrong", req)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), "sk-wrong") {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})

	reqs := s.Requests()
	if len(reqs) != 5 || reqs[0].Path != "/v1/chat/completions" || reqs[0].Header.Get("Authorization") != "Bearer sk-sim" {
		t.Fatalf("recorded %d requests, first %+v", len(reqs), reqs[0])
	}
}

func TestAnthropic(t *testing.T) {
	script := Script{Rules: []Rule{
		{When: Cond{ToolResultContains: "42"}, Reply: Reply{Content: "The answer is 42.", Usage: Usage{Prompt: 300, Cached: 100, CacheWrite: 50}}},
		{When: Cond{}, Reply: Reply{ToolCalls: []ToolCall{{ID: "toolu_1", Name: "bash", Arguments: `{"cmd":"cat a"}`}}}},
	}}
	s := startSim(t, script, Options{APIKey: "sk-ant"})
	first := []any{map[string]any{"role": "user", "content": "hi"}}
	second := append(first,
		map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": map[string]any{"cmd": "cat a"}}}},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}}})

	var msg struct {
		Content []struct {
			Type  string
			Text  string
			Name  string
			Input map[string]any
		}
		StopReason string `json:"stop_reason"`
		Usage      struct {
			InputTokens              int64 `json:"input_tokens"`
			OutputTokens             int64 `json:"output_tokens"`
			CacheReadInputTokens     int64 `json:"cache_read_input_tokens"`
			CacheCreationInputTokens int64 `json:"cache_creation_input_tokens"`
		}
	}
	resp := post(t, s, "/v1/messages", "sk-ant", map[string]any{"model": "c", "max_tokens": 100, "messages": first})
	if err := json.NewDecoder(resp.Body).Decode(&msg); err != nil {
		t.Fatal(err)
	}
	if msg.StopReason != "tool_use" || len(msg.Content) != 1 || msg.Content[0].Type != "tool_use" || msg.Content[0].Input["cmd"] != "cat a" {
		t.Fatalf("first answer %+v", msg)
	}

	resp = post(t, s, "/v1/messages", "sk-ant", map[string]any{"model": "c", "max_tokens": 100, "stream": true, "messages": second})
	evs := events(t, resp.Body)
	var names []string
	var text strings.Builder
	for _, e := range evs {
		name, data, _ := strings.Cut(e, " ")
		names = append(names, name)
		var ev struct {
			Delta struct{ Text string }
			Usage map[string]any
		}
		_ = json.Unmarshal([]byte(data), &ev)
		text.WriteString(ev.Delta.Text)
		if name == "message_delta" && ev.Usage["output_tokens"] != 4.0 {
			t.Fatalf("message_delta usage %v, want 4 output tokens", ev.Usage)
		}
		if name == "message_start" && !strings.Contains(data, `"input_tokens":150`) {
			t.Fatalf("message_start %s: want 150 fresh input tokens (300 - 100 read - 50 written)", data)
		}
	}
	want := "message_start content_block_start ping content_block_delta content_block_delta content_block_delta content_block_delta content_block_stop message_delta message_stop"
	if strings.Join(names, " ") != want || text.String() != "The answer is 42." {
		t.Fatalf("events %s, text %q", strings.Join(names, " "), text.String())
	}
}

func TestPacingAndCut(t *testing.T) {
	s := startSim(t, Sequence(Reply{Content: "a b c d e f", FirstTokenDelay: 60 * time.Millisecond, TokenDelay: 10 * time.Millisecond, CutAfter: 3}), Options{})
	start := time.Now()
	resp := post(t, s, "/v1/chat/completions", "", map[string]any{"model": "m", "stream": true, "messages": []any{map[string]any{"role": "user", "content": "x"}}})
	b, err := io.ReadAll(resp.Body)
	if err == nil {
		t.Fatalf("a cut stream read cleanly: %s", b)
	}
	if took := time.Since(start); took < 80*time.Millisecond {
		t.Fatalf("three tokens came in %s, faster than scripted (60 ms + 2 × 10 ms)", took)
	}
	if n := strings.Count(string(b), `"content":"`); n != 4 { // the role chunk and three tokens
		t.Fatalf("%d content chunks before the cut, want 4:\n%s", n, b)
	}
}

func FuzzParseOpenAI(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_tokens":5}`))
	f.Add([]byte(`{"model":"m","messages":[{"role":"tool","tool_call_id":"x","content":null}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseOpenAI(b)
		if err == nil && (req.Model == "" || len(req.Messages) == 0) {
			t.Fatalf("accepted %q as %+v", b, req)
		}
	})
}

func FuzzParseAnthropic(f *testing.F) {
	f.Add([]byte(`{"model":"c","max_tokens":10,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"42"}]}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseAnthropic(b)
		if err == nil && (req.Model == "" || req.MaxTokens < 1) {
			t.Fatalf("accepted %q as %+v", b, req)
		}
	})
}

func TestToolChoice(t *testing.T) {
	for _, tc := range []struct {
		api, choice, want string
	}{
		{"openai", ``, "auto"},
		{"openai", `"none"`, "none"},
		{"openai", `"required"`, "required"},
		{"openai", `{"type":"function","function":{"name":"bash"}}`, "tool:bash"},
		{"openai", `"sometimes"`, ""},
		{"anthropic", `{"type":"any"}`, "required"},
		{"anthropic", `{"type":"tool","name":"read"}`, "tool:read"},
		{"anthropic", `{"type":"maybe"}`, ""},
	} {
		field := ""
		if tc.choice != "" {
			field = `,"tool_choice":` + tc.choice
		}
		var req Request
		var err error
		if tc.api == "openai" {
			req, err = ParseOpenAI([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}]` + field + `}`))
		} else {
			req, err = ParseAnthropic([]byte(`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"x"}]` + field + `}`))
		}
		if tc.want == "" {
			if err == nil {
				t.Errorf("%s %s: accepted as %q", tc.api, tc.choice, req.ToolChoice)
			}
			continue
		}
		if err != nil || req.ToolChoice != tc.want {
			t.Errorf("%s %s: %q %v, want %q", tc.api, tc.choice, req.ToolChoice, err, tc.want)
		}
	}
}

// TestContentTokensAndNoLogprobs: a reply's scripted tokens are the
// tokens sent (a rating digit alone, with its alternatives); tokens that do
// not join to the content are refused; a reply without logprobs carries
// none even when asked.
func TestContentTokensAndNoLogprobs(t *testing.T) {
	content := "<rating>4</rating>"
	s := startSim(t, Script{Rules: []Rule{
		{When: Cond{Model: "with"}, Reply: Reply{Content: content, ContentTokens: []string{"<rating>", "4", "</rating>"},
			TopLogprobs: [][]Logprob{nil, {{Token: "4", Logprob: -0.2}, {Token: "3", Logprob: -1.8}}}}},
		{When: Cond{Model: "without"}, Reply: Reply{Content: content, NoLogprobs: true}},
		{When: Cond{Model: "bad"}, Reply: Reply{Content: content, ContentTokens: []string{"<rating>4"}}},
	}}, Options{})
	ask := func(model string) (int, []byte) {
		resp := post(t, s, "/v1/chat/completions", "", map[string]any{"model": model, "logprobs": true, "top_logprobs": 2,
			"messages": []any{map[string]any{"role": "user", "content": "rate"}}})
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	type tokens struct {
		Choices []struct {
			Logprobs *struct {
				Content []struct {
					Token       string
					TopLogprobs []struct {
						Token   string
						Logprob float64
					} `json:"top_logprobs"`
				}
			}
		}
	}
	code, b := ask("with")
	var got tokens
	if err := json.Unmarshal(b, &got); err != nil || code != http.StatusOK {
		t.Fatalf("%d %s: %v", code, b, err)
	}
	lp := got.Choices[0].Logprobs
	if lp == nil || len(lp.Content) != 3 || lp.Content[1].Token != "4" || len(lp.Content[1].TopLogprobs) != 2 ||
		lp.Content[1].TopLogprobs[1].Token != "3" || lp.Content[1].TopLogprobs[1].Logprob != -1.8 {
		t.Fatalf("scripted tokens: %s", b)
	}
	code, b = ask("without")
	got = tokens{}
	if err := json.Unmarshal(b, &got); err != nil || code != http.StatusOK || got.Choices[0].Logprobs != nil {
		t.Fatalf("a reply without logprobs: %d %s", code, b)
	}
	if code, b = ask("bad"); code != http.StatusInternalServerError || !strings.Contains(string(b), "do not join") {
		t.Fatalf("tokens that do not join: %d %s", code, b)
	}
}

// Claude Code's request shape: system blocks with cache_control, tools
// with input_schema and a server tool, metadata, thinking, beta flags.
func TestAnthropicClaudeCodeShape(t *testing.T) {
	reply := Reply{Thinking: "Think first then answer", RedactedThinking: "UkVEQUNURUQ=", Content: "Done now.", WebSearches: 2,
		Usage: Usage{Prompt: 400, Cached: 100, CacheWrite: 200, CacheWrite1h: 50}}
	s := startSim(t, Sequence(reply), Options{})
	body := map[string]any{"model": "c", "max_tokens": 3000, "stream": true,
		"thinking": map[string]any{"type": "enabled", "budget_tokens": 2000},
		"system":   []any{map[string]any{"type": "text", "text": "You are Claude Code.", "cache_control": map[string]any{"type": "ephemeral", "ttl": "1h"}}},
		"tools": []any{map[string]any{"name": "Bash", "input_schema": map[string]any{"type": "object"}},
			map[string]any{"type": "web_search_20250305", "name": "web_search", "max_uses": 3}},
		"metadata": map[string]any{"user_id": "u"},
		"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "hi", "cache_control": map[string]any{"type": "ephemeral"}}}}}}
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/messages", bytes.NewReader(b))
	req.Header.Set("anthropic-beta", "claude-code-20250219, interleaved-thinking-2025-05-14")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var names, thinking, text []string
	var start, final map[string]any
	for _, e := range events(t, resp.Body) {
		name, data, _ := strings.Cut(e, " ")
		names = append(names, name)
		var ev struct {
			Message map[string]any
			Delta   struct{ Type, Thinking, Text, Signature string }
			Usage   map[string]any
		}
		_ = json.Unmarshal([]byte(data), &ev)
		switch {
		case name == "message_start":
			start = ev.Message["usage"].(map[string]any)
		case name == "message_delta":
			final = ev.Usage
		case ev.Delta.Type == "thinking_delta":
			thinking = append(thinking, ev.Delta.Thinking)
		case ev.Delta.Type == "text_delta":
			text = append(text, ev.Delta.Text)
		case ev.Delta.Type == "signature_delta" && ev.Delta.Signature == "":
			t.Fatal("an empty signature")
		}
	}
	got := s.Requests()[0]
	parsed, err := ParseAnthropic(got.Body)
	if err != nil || parsed.Thinking != 2000 || len(parsed.ServerTools) != 1 || parsed.Tools[0] != "Bash" {
		t.Fatalf("parsed %+v %v", parsed, err)
	}
	if strings.Join(thinking, "") != reply.Thinking || strings.Join(text, "") != reply.Content {
		t.Fatalf("thinking %q text %q", thinking, text)
	}
	joined := strings.Join(names, " ")
	if strings.Count(joined, "content_block_start") != 7 || !strings.HasSuffix(joined, "message_delta message_stop") {
		t.Fatalf("events %s: want thinking, redacted, 2 × (search use, result), text", joined)
	}
	cc := start["cache_creation"].(map[string]any)
	out := float64(len(Tokens(reply.Thinking)) + len(Tokens(reply.Content)))
	if start["input_tokens"] != 100.0 || cc["ephemeral_5m_input_tokens"] != 150.0 || cc["ephemeral_1h_input_tokens"] != 50.0 ||
		final["output_tokens"] != out || final["input_tokens"] != 100.0 || final["cache_read_input_tokens"] != 100.0 ||
		final["server_tool_use"].(map[string]any)["web_search_requests"] != 2.0 {
		t.Fatalf("usage at start %v, final %v (want %v output tokens)", start, final, out)
	}
	// Without thinking enabled, no thinking is sent; without the
	// search tool offered, no search.
	resp2 := post(t, s, "/v1/messages", "", map[string]any{"model": "c", "max_tokens": 100, "messages": []any{map[string]any{"role": "user", "content": "x"}}})
	b2, _ := io.ReadAll(resp2.Body)
	if bytes.Contains(b2, []byte("thinking")) || bytes.Contains(b2, []byte("server_tool_use\"")) || !bytes.Contains(b2, []byte("Done now.")) {
		t.Fatalf("plain answer %s", b2)
	}
}

func TestAnthropicThinkingBounds(t *testing.T) {
	s := startSim(t, Sequence(Reply{Thinking: strings.Repeat("word ", 2000), Content: "answer"}), Options{})
	for _, tc := range []struct {
		name   string
		body   map[string]any
		status int
	}{
		{"budget below 1024", map[string]any{"max_tokens": 3000, "thinking": map[string]any{"type": "enabled", "budget_tokens": 1000}}, 400},
		{"budget not below max_tokens", map[string]any{"max_tokens": 2000, "thinking": map[string]any{"type": "enabled", "budget_tokens": 2000}}, 400},
		{"thinking cut at its budget", map[string]any{"max_tokens": 3000, "thinking": map[string]any{"type": "enabled", "budget_tokens": 1024}}, 200},
	} {
		tc.body["model"], tc.body["messages"] = "c", []any{map[string]any{"role": "user", "content": "x"}}
		resp := post(t, s, "/v1/messages", "", tc.body)
		var msg struct {
			Content []struct{ Type, Thinking, Text string }
			Usage   struct {
				OutputTokens int64 `json:"output_tokens"`
			}
			StopReason string `json:"stop_reason"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&msg)
		if resp.StatusCode != tc.status {
			t.Fatalf("%s: %d", tc.name, resp.StatusCode)
		}
		if tc.status == 200 && (len(msg.Content) != 2 || len(Tokens(msg.Content[0].Thinking)) != 1024 || msg.Content[1].Text != "answer" ||
			msg.Usage.OutputTokens != 1025 || msg.StopReason != "end_turn") {
			t.Fatalf("%s: %+v", tc.name, msg)
		}
	}
}

func TestCountTokensEndpoint(t *testing.T) {
	s := startSim(t, Script{}, Options{APIKey: "sk-ant"})
	body := map[string]any{"model": "c", "system": "s", "messages": []any{map[string]any{"role": "user", "content": "count me"}}}
	b, _ := json.Marshal(body)
	for _, tc := range []struct {
		key    string
		status int
	}{{"sk-ant", 200}, {"wrong", 401}} {
		req, _ := http.NewRequest(http.MethodPost, s.URL()+"/v1/messages/count_tokens", bytes.NewReader(b))
		req.Header.Set("x-api-key", tc.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var n struct {
			InputTokens int64 `json:"input_tokens"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&n)
		resp.Body.Close()
		if resp.StatusCode != tc.status || (tc.status == 200 && n.InputTokens != int64(len(b)+3)/4) {
			t.Fatalf("key %s: %d %+v", tc.key, resp.StatusCode, n)
		}
	}
	if _, err := ParseAnthropicCount([]byte(`{"model":"c","messages":[]}`)); err == nil {
		t.Fatal("counted no messages")
	}
}

func FuzzParseAnthropicCount(f *testing.F) {
	f.Add([]byte(`{"model":"c","thinking":{"type":"enabled","budget_tokens":2048},"messages":[{"role":"user","content":"x"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseAnthropicCount(b)
		if err == nil && (req.Model == "" || len(req.Messages) == 0 || req.Thinking < 0) {
			t.Fatalf("accepted %q as %+v", b, req)
		}
	})
}
