package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
)

func TestParseChatRequest(t *testing.T) {
	for _, tc := range []struct {
		name      string
		body      string
		err       string // substring; "" = accepted
		requested int64
		choices   int64
		images    int64
		usage     bool
	}{
		{"minimal", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "", 0, 1, 0, false},
		{"both bounds: the smaller", `{"model":"m","max_tokens":500,"max_completion_tokens":200,"messages":[{"role":"user","content":"hi"}]}`, "", 200, 1, 0, false},
		{"n and images", `{"model":"m","n":3,"messages":[{"role":"user","content":[{"type":"text","text":"see"},{"type":"image_url","image_url":{"url":"data:x"}},{"type":"image_url","image_url":{"url":"http://x"}}]}]}`, "", 0, 3, 2, false},
		{"stream with usage", `{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`, "", 0, 1, 0, true},
		{"tools", `{"model":"m","tools":[{"type":"function","function":{"name":"bash","parameters":{}}}],"messages":[{"role":"user","content":"hi"}]}`, "", 0, 1, 0, false},
		{"no model", `{"messages":[{"role":"user","content":"hi"}]}`, "model is required", 0, 0, 0, false},
		{"model not a string", `{"model":5,"messages":[{"role":"user","content":"hi"}]}`, "model", 0, 0, 0, false},
		{"no messages", `{"model":"m","messages":[]}`, "messages is required", 0, 0, 0, false},
		{"not an object", `[1,2]`, "not a JSON object", 0, 0, 0, false},
		{"null", `null`, "null", 0, 0, 0, false},
		{"zero bound", `{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens 0 is below 1", 0, 0, 0, false},
		{"too many choices", `{"model":"m","n":17,"messages":[{"role":"user","content":"hi"}]}`, "n 17", 0, 0, 0, false},
		{"audio input", `{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{}}]}]}`, `part type "input_audio"`, 0, 0, 0, false},
		{"file input", `{"model":"m","messages":[{"role":"user","content":[{"type":"file","file":{}}]}]}`, `part type "file"`, 0, 0, 0, false},
		{"web search", `{"model":"m","web_search_options":{},"messages":[{"role":"user","content":"hi"}]}`, "web_search_options", 0, 0, 0, false},
		{"audio output", `{"model":"m","modalities":["text","audio"],"messages":[{"role":"user","content":"hi"}]}`, `modality "audio"`, 0, 0, 0, false},
		{"priority tier", `{"model":"m","service_tier":"priority","messages":[{"role":"user","content":"hi"}]}`, "service_tier", 0, 0, 0, false},
		{"a provider's tool", `{"model":"m","tools":[{"type":"web_search"}],"messages":[{"role":"user","content":"hi"}]}`, `type "web_search"`, 0, 0, 0, false},
	} {
		r, err := parseChatRequest([]byte(tc.body))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || r.Requested != tc.requested || r.Choices != tc.choices || r.Images != tc.images || r.IncludeUsage != tc.usage {
			t.Errorf("%s: %+v, %v", tc.name, r, err)
		}
	}
}

func TestRewriteChat(t *testing.T) {
	tools := `[{"type":"function","function":{"name":"bash","description":"<run> & see","parameters":{"type":"object"}}}]`
	msgs := `[{"role":"user","content":"a < b && c"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"cmd\":\"ls\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"x"}]`
	for _, tc := range []struct {
		name, body, field string
		want              map[string]string
		absent            []string
	}{
		{"no bound: the provider's field", `{"model":"agent-name","messages":` + msgs + `,"tools":` + tools + `}`, "max_completion_tokens",
			map[string]string{"model": `"up-name"`, "max_completion_tokens": "300"}, []string{"max_tokens", "stream_options"}},
		{"no bound, older server", `{"model":"agent-name","messages":` + msgs + `}`, "max_tokens",
			map[string]string{"max_tokens": "300"}, []string{"max_completion_tokens"}},
		{"the client's bounds lowered", `{"model":"agent-name","max_tokens":9000,"max_completion_tokens":8000,"messages":` + msgs + `}`, "max_completion_tokens",
			map[string]string{"max_tokens": "300", "max_completion_tokens": "300"}, nil},
		{"stream: usage asked for, other options kept", `{"model":"agent-name","stream":true,"stream_options":{"x":1},"messages":` + msgs + `}`, "max_completion_tokens",
			map[string]string{"stream_options": `{"include_usage":true,"x":1}`}, nil},
	} {
		r, err := parseChatRequest([]byte(tc.body))
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		out, err := rewriteChat(r, "up-name", 300, tc.field)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s: rewritten body %s: %v", tc.name, out, err)
		}
		for k, v := range tc.want {
			if string(got[k]) != v {
				t.Errorf("%s: %s = %s, want %s", tc.name, k, got[k], v)
			}
		}
		for _, k := range tc.absent {
			if _, ok := got[k]; ok {
				t.Errorf("%s: %s set: %s", tc.name, k, out)
			}
		}
		// Messages and tools pass untouched (HTML characters unescaped).
		if string(got["messages"]) != msgs || (strings.Contains(tc.body, `"tools"`) && string(got["tools"]) != tools) {
			t.Errorf("%s: messages or tools changed:\n%s", tc.name, out)
		}
	}
}

func TestParseMessagesRequest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		body   string
		err    string
		images int64
	}{
		{"minimal", `{"model":"c","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}`, "", 0},
		{"images, in tool results too", `{"model":"c","max_tokens":10,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"image","source":{}},{"type":"tool_result","tool_use_id":"t","content":[{"type":"image","source":{}},{"type":"text","text":"x"}]}]}]}`, "", 2},
		{"thinking blocks", `{"model":"c","max_tokens":10,"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"hm","signature":"s"},{"type":"tool_use","id":"t","name":"bash","input":{}}]}]}`, "", 0},
		{"no max_tokens", `{"model":"c","messages":[{"role":"user","content":"hi"}]}`, "max_tokens is required", 0},
		{"a document", `{"model":"c","max_tokens":10,"messages":[{"role":"user","content":[{"type":"document","source":{}}]}]}`, `block type "document"`, 0},
		{"a server tool the gateway cannot meter", `{"model":"c","max_tokens":10,"tools":[{"type":"code_execution_20250522","name":"code_execution"}],"messages":[{"role":"user","content":"hi"}]}`, "code_execution_20250522", 0},
		{"a client tool of Anthropic's", `{"model":"c","max_tokens":10,"tools":[{"name":"x","input_schema":{}},{"type":"bash_20250124","name":"bash"}],"messages":[{"role":"user","content":"hi"}]}`, `tools[1]: type "bash_20250124"`, 0},
		{"a server tool it can meter passes here (the route decides)", `{"model":"c","max_tokens":10,"tools":[{"type":"web_search_20250305","name":"web_search"}],"messages":[{"role":"user","content":"hi"}]}`, "", 0},
		{"MCP", `{"model":"c","max_tokens":10,"mcp_servers":[{}],"messages":[{"role":"user","content":"hi"}]}`, "mcp_servers", 0},
		{"fast mode", `{"model":"c","max_tokens":10,"speed":"fast","messages":[{"role":"user","content":"hi"}]}`, `speed "fast"`, 0},
		{"standard speed", `{"model":"c","max_tokens":10,"speed":"standard","messages":[{"role":"user","content":"hi"}]}`, "", 0},
		{"a pinned region", `{"model":"c","max_tokens":10,"inference_geo":"us","messages":[{"role":"user","content":"hi"}]}`, `inference_geo "us"`, 0},
		{"nested too deep", `{"model":"c","max_tokens":10,"messages":[{"role":"user","content":[{"type":"tool_result","content":[{"type":"tool_result","content":[{"type":"text"}]}]}]}]}`, "nested too deep", 0},
	} {
		r, err := parseMessagesRequest([]byte(tc.body))
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: error %v, want one naming %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil || r.Images != tc.images || r.Requested != 10 {
			t.Errorf("%s: %+v, %v", tc.name, r, err)
		}
	}
	r, err := parseMessagesRequest([]byte(`{"model":"c","max_tokens":4000,"thinking":{"type":"enabled","budget_tokens":3000},"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	out, _ := rewriteMessages(r, "claude-up", 2000, nil)
	if !bytes.Contains(out, []byte(`"max_tokens":2000`)) || !bytes.Contains(out, []byte(`"budget_tokens":1999`)) || !bytes.Contains(out, []byte(`"model":"claude-up"`)) {
		t.Fatalf("rewritten %s: want max_tokens 2000, the thinking budget under it, the upstream model", out)
	}
}

func TestParseResponses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parse func([]byte) (Usage, bool, error)
		body  string
		want  Usage
		found bool
		err   bool
	}{
		{"openai", parseChatResponse, `{"choices":[],"usage":{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":30}}}`, Usage{Input: 100, Output: 20, CachedInput: 30}, true, false},
		{"openai without usage", parseChatResponse, `{"choices":[]}`, Usage{}, false, false},
		{"openai partial usage", parseChatResponse, `{"usage":{"prompt_tokens":100}}`, Usage{}, false, true},
		{"openai negative", parseChatResponse, `{"usage":{"prompt_tokens":-1,"completion_tokens":2}}`, Usage{}, false, true},
		{"openai cached over input", parseChatResponse, `{"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":11}}}`, Usage{}, false, true},
		{"openai fractional", parseChatResponse, `{"usage":{"prompt_tokens":1.5,"completion_tokens":2}}`, Usage{}, false, true},
		{"openai not JSON", parseChatResponse, `<html>`, Usage{}, false, true},
		{"anthropic", parseMessagesResponse, `{"usage":{"input_tokens":50,"output_tokens":7,"cache_read_input_tokens":100,"cache_creation_input_tokens":20}}`, Usage{Input: 170, Output: 7, CachedInput: 100, CacheWrite: 20}, true, false},
		{"anthropic no cache fields", parseMessagesResponse, `{"usage":{"input_tokens":50,"output_tokens":7}}`, Usage{Input: 50, Output: 7}, true, false},
		{"anthropic negative cache", parseMessagesResponse, `{"usage":{"input_tokens":50,"output_tokens":7,"cache_read_input_tokens":-100}}`, Usage{}, false, true},
	} {
		u, found, err := tc.parse([]byte(tc.body))
		if u != tc.want || found != tc.found || (err != nil) != tc.err {
			t.Errorf("%s: %+v %v %v; want %+v %v error %v", tc.name, u, found, err, tc.want, tc.found, tc.err)
		}
	}
}

func TestSSEReader(t *testing.T) {
	in := "data: {\"a\":1}\n\n" +
		": keep-alive\n\n" +
		"event: message_start\r\ndata: {\"b\":\r\ndata: 2}\r\n\r\n" +
		"\n" +
		"data: [DONE]\n\n" +
		"data: partial"
	r := newSSEReader(strings.NewReader(in), 1<<10, 1<<20)
	var got []string
	var raw strings.Builder
	for {
		ev, err := r.Next()
		raw.Write(ev.Raw)
		if err != nil {
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("end: %v, want unexpected EOF (a partial event)", err)
			}
			break
		}
		got = append(got, ev.Name+"|"+string(ev.Data))
	}
	want := []string{`|{"a":1}`, `|`, "message_start|{\"b\":\n2}", `|[DONE]`}
	if strings.Join(got, ";") != strings.Join(want, ";") {
		t.Fatalf("events %q, want %q", got, want)
	}
	if raw.String() != strings.Replace(in, "\r\n\r\n\n", "\r\n\r\n", 1) {
		t.Fatalf("raw bytes %q differ from the input (only the stray blank line may go)", raw.String())
	}
	for _, tc := range []struct {
		name       string
		in         string
		maxEv      int
		maxTotal   int64
		wantErr    error
		okBeforeIt int
	}{
		{"event over its bound", "data: " + strings.Repeat("x", 100) + "\n\n", 64, 1 << 20, errEventTooLarge, 0},
		{"stream over its bound", strings.Repeat("data: x\n\n", 10), 64, 50, errStreamTooLarge, 5},
		{"a line longer than the buffer, within the bound", "data: " + strings.Repeat("y", 100<<10) + "\n\n", 200 << 10, 1 << 20, nil, 1},
	} {
		r := newSSEReader(strings.NewReader(tc.in), tc.maxEv, tc.maxTotal)
		n := 0
		var err error
		for {
			_, err = r.Next()
			if err != nil {
				break
			}
			n++
		}
		if n != tc.okBeforeIt || (tc.wantErr == nil && err != io.EOF) || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
			t.Errorf("%s: %d events then %v; want %d then %v", tc.name, n, err, tc.okBeforeIt, tc.wantErr)
		}
	}
}

// openAIStream is a chat completions stream with content, two parallel
// tool calls and the usage chunk.
const openAIStream = `data: {"id":"c1","object":"chat.completion.chunk","created":5,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}],"usage":null}

data: {"id":"c1","choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":{"content":[{"token":"Hi","logprob":-0.1,"top_logprobs":[]}]},"finish_reason":null}],"usage":null}

data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"bash","arguments":""}},{"index":1,"id":"call_b","type":"function","function":{"name":"read","arguments":""}}]},"finish_reason":null}],"usage":null}

data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"cmd\":"}},{"index":1,"function":{"arguments":"{}"}}]},"finish_reason":null}],"usage":null}

data: {"id":"c1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"ls\"}"}}]},"finish_reason":null}],"usage":null}

data: {"id":"c1","choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}],"usage":null}

data: {"id":"c1","choices":[],"usage":{"prompt_tokens":40,"completion_tokens":9,"total_tokens":49,"prompt_tokens_details":{"cached_tokens":8}}}

data: [DONE]

`

func TestChatAssembler(t *testing.T) {
	a := &chatAssembler{}
	r := newSSEReader(strings.NewReader(openAIStream), 1<<20, 1<<20)
	var tokens, usageOnly int
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		info, err := a.Event(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		if info.Token {
			tokens++
		}
		if info.UsageOnly {
			usageOnly++
		}
	}
	u, found, err := a.Usage()
	if !a.Complete() || !found || err != nil || u != (Usage{Input: 40, Output: 9, CachedInput: 8}) || tokens != 4 || usageOnly != 1 {
		t.Fatalf("complete %v usage %+v %v %v tokens %d usage-only %d", a.Complete(), u, found, err, tokens, usageOnly)
	}
	var resp struct {
		ID      string
		Object  string
		Created int64
		Choices []struct {
			Message struct {
				Content   string
				ToolCalls []struct {
					ID       string
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			}
			Logprobs     struct{ Content []map[string]any }
			FinishReason string `json:"finish_reason"`
		}
		Usage map[string]any
	}
	if err := json.Unmarshal(a.Response(), &resp); err != nil {
		t.Fatal(err)
	}
	ch := resp.Choices[0]
	if resp.Object != "chat.completion" || resp.Created != 5 || ch.Message.Content != "Hi" || ch.FinishReason != "tool_calls" ||
		len(ch.Message.ToolCalls) != 2 || ch.Message.ToolCalls[0].Function.Arguments != `{"cmd":"ls"}` ||
		ch.Message.ToolCalls[1].Function.Name != "read" || len(ch.Logprobs.Content) != 1 || resp.Usage["completion_tokens"] != 9.0 {
		t.Fatalf("reassembled %s", a.Response())
	}
}

const anthropicStream = `event: message_start
data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"c","content":[],"stop_reason":null,"usage":{"input_tokens":30,"cache_read_input_tokens":100,"cache_creation_input_tokens":5,"output_tokens":1}}}

event: content_block_start
data: {"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"hmm"}}

event: content_block_delta
data: {"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig"}}

event: content_block_stop
data: {"type":"content_block_stop","index":0}

event: content_block_start
data: {"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}

event: ping
data: {"type":"ping"}

event: content_block_delta
data: {"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Let me check."}}

event: content_block_start
data: {"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"bash","input":{}}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"cmd\": "}}

event: content_block_delta
data: {"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"\"ls\"}"}}

event: message_delta
data: {"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}

event: message_stop
data: {"type":"message_stop"}

`

func TestMessagesAssembler(t *testing.T) {
	a := &messagesAssembler{}
	r := newSSEReader(strings.NewReader(anthropicStream), 1<<20, 1<<20)
	tokens := 0
	for {
		ev, err := r.Next()
		if err == io.EOF {
			break
		}
		info, err := a.Event(ev.Data)
		if err != nil {
			t.Fatal(err)
		}
		if info.Token {
			tokens++
		}
	}
	u, found, err := a.Usage()
	if !a.Complete() || !found || err != nil || u != (Usage{Input: 135, Output: 42, CachedInput: 100, CacheWrite: 5}) || tokens != 4 {
		t.Fatalf("complete %v usage %+v %v %v tokens %d", a.Complete(), u, found, err, tokens)
	}
	var msg struct {
		ID      string
		Content []struct {
			Type, Text, Thinking, Signature, Name string
			Input                                 map[string]any
		}
		StopReason string `json:"stop_reason"`
		Usage      map[string]any
	}
	if err := json.Unmarshal(a.Response(), &msg); err != nil {
		t.Fatal(err)
	}
	if msg.ID != "msg_1" || len(msg.Content) != 3 || msg.Content[0].Thinking != "hmm" || msg.Content[0].Signature != "sig" ||
		msg.Content[1].Text != "Let me check." || msg.Content[2].Input["cmd"] != "ls" || msg.StopReason != "tool_use" || msg.Usage["output_tokens"] != 42.0 {
		t.Fatalf("reassembled %s", a.Response())
	}
}

// TestStreamCutBeforeUsage: a stream cut before its final usage has no
// usage, whatever its start said.
func TestStreamCutBeforeUsage(t *testing.T) {
	for name, tc := range map[string]struct {
		a      assembler
		stream string
	}{
		"anthropic": {&messagesAssembler{}, anthropicStream[:strings.Index(anthropicStream, "event: message_delta")]},
		"openai":    {&chatAssembler{}, openAIStream[:strings.Index(openAIStream, `data: {"id":"c1","choices":[],"usage"`)]},
	} {
		feed(t, tc.a, []byte(tc.stream))
		if u, found, _ := tc.a.Usage(); found || tc.a.Complete() {
			t.Errorf("%s: a cut stream gives usage %+v (found %v), complete %v", name, u, found, tc.a.Complete())
		}
	}
}

// feed runs a stream through an assembler as the gateway does; nothing in
// it may panic, and the answer is JSON.
func feed(t *testing.T, a assembler, stream []byte) {
	r := newSSEReader(bytes.NewReader(stream), 1<<16, 1<<20)
	for {
		ev, err := r.Next()
		if err != nil {
			break
		}
		if len(ev.Data) > 0 {
			_, _ = a.Event(ev.Data)
		}
	}
	if !json.Valid(a.Response()) {
		t.Fatalf("answer is not JSON: %s", a.Response())
	}
	if u, found, err := a.Usage(); found && (err != nil || u.Validate() != nil) {
		t.Fatalf("usage %+v reported found with error %v", u, err)
	}
}

func FuzzChatStream(f *testing.F) {
	f.Add([]byte(openAIStream))
	f.Add([]byte("data: {\"choices\":[{\"index\":99999999,\"delta\":{}}]}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) { feed(t, &chatAssembler{}, b) })
}

func FuzzMessagesStream(f *testing.F) {
	f.Add([]byte(anthropicStream))
	f.Add([]byte("data: {\"type\":\"content_block_delta\",\"index\":-1}\n\n"))
	f.Fuzz(func(t *testing.T, b []byte) { feed(t, &messagesAssembler{}, b) })
}

func FuzzChatRequest(f *testing.F) {
	f.Add([]byte(`{"model":"m","n":2,"max_tokens":5,"stream":true,"messages":[{"role":"user","content":[{"type":"image_url"}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseChatRequest(b)
		if err != nil {
			return
		}
		if r.Model == "" || r.Choices < 1 || r.Choices > maxChoices || r.Requested < 0 || r.Images < 0 {
			t.Fatalf("accepted %q as %+v", b, r)
		}
		out, err := rewriteChat(r, "up", 7, "max_tokens")
		if err != nil {
			return
		}
		again, err := parseChatRequest(out)
		if err != nil || again.Model != "up" || again.Requested != 7 || again.Images != r.Images || again.Choices != r.Choices {
			t.Fatalf("rewrite of %q gives %q: %+v, %v", b, out, again, err)
		}
	})
}

func FuzzMessagesRequest(f *testing.F) {
	f.Add([]byte(`{"model":"c","max_tokens":50,"thinking":{"budget_tokens":60},"messages":[{"role":"user","content":[{"type":"image"}]}]}`))
	f.Add([]byte(`{"model":"c","max_tokens":50,"tools":[{"type":"web_search_20250305","name":"w","max_uses":2}],"messages":[{"role":"assistant","content":[{"type":"web_search_tool_result","content":[]}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseMessagesRequest(b)
		if err != nil {
			return
		}
		if r.Model == "" || r.Requested < 1 || r.Images < 0 {
			t.Fatalf("accepted %q as %+v", b, r)
		}
		rt := route{betas: anthropicBetas(nil), tools: map[string]serverTool{"web_search_20250305": {kind: "web_search", price: 7, maxUses: 3, perUse: 100}}}
		if e, err := prepareMessages(r, rt, http.Header{}); err == nil && (e.Rounds < 1 || e.ToolTokens < 0 || e.Fees < 0) {
			t.Fatalf("%q: prepared %+v", b, e)
		}
		if out, err := rewriteMessages(r, "up", 7, rt.tools); err == nil {
			if again, err := parseMessagesRequest(out); err != nil || again.Requested != 7 {
				t.Fatalf("rewrite with server tools of %q gives %q: %+v, %v", b, out, again, err)
			}
		}
		out, err := rewriteMessages(r, "up", 7, nil)
		if err != nil {
			return
		}
		again, err := parseMessagesRequest(out)
		if err != nil || again.Model != "up" || again.Requested != 7 || again.Images != r.Images {
			t.Fatalf("rewrite of %q gives %q: %+v, %v", b, out, again, err)
		}
	})
}

func FuzzResponseUsage(f *testing.F) {
	f.Add([]byte(`{"usage":{"prompt_tokens":100,"completion_tokens":20,"prompt_tokens_details":{"cached_tokens":30}}}`))
	f.Add([]byte(`{"usage":{"input_tokens":50,"output_tokens":7,"cache_read_input_tokens":100}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, parse := range []func([]byte) (Usage, bool, error){parseChatResponse, parseMessagesResponse} {
			u, found, err := parse(b)
			if found && (err != nil || u.Validate() != nil) {
				t.Fatalf("%q: usage %+v found with error %v", b, u, err)
			}
		}
	})
}
