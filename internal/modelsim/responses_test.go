package modelsim

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// codexRequest is shaped as Codex CLI's Responses requests are (codex-rs:
// instructions, the whole history in input with store false, reasoning
// items sent back with their encrypted_content, function and custom
// tools, include, prompt_cache_key, parallel_tool_calls).
func codexRequest(stream bool, input ...any) map[string]any {
	if len(input) == 0 {
		input = []any{
			map[string]any{"type": "message", "role": "developer", "content": []any{map[string]any{"type": "input_text", "text": "<permissions>sandboxed</permissions>"}}},
			map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "Find the answer."}}},
		}
	}
	return map[string]any{
		"model": "gpt-sim", "instructions": "You are Codex.", "input": input,
		"tools": []any{
			map[string]any{"type": "function", "name": "shell", "strict": false, "parameters": map[string]any{"type": "object",
				"properties": map[string]any{"command": map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}}},
			map[string]any{"type": "custom", "name": "apply_patch", "format": map[string]any{"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
			map[string]any{"type": "local_shell"},
			map[string]any{"type": "namespace", "name": "multi_agent_v1", "description": "sub-agents",
				"tools": []any{map[string]any{"type": "function", "name": "spawn_agent", "parameters": map[string]any{"type": "object"}}}},
		},
		"tool_choice": "auto", "parallel_tool_calls": false, "reasoning": map[string]any{"effort": "medium", "summary": "auto"},
		"store": false, "stream": stream, "include": []any{"reasoning.encrypted_content"}, "prompt_cache_key": "conv-1",
	}
}

// codexHistory is a conversation after one turn with a reasoning item, a
// message, a function call and a custom tool call, and their outputs.
func codexHistory() []any {
	return []any{
		map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "Find the answer."}}},
		map[string]any{"type": "reasoning", "summary": []any{map[string]any{"type": "summary_text", "text": "look"}}, "encrypted_content": "gAAAA-opaque"},
		map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "Looking."}}},
		map[string]any{"type": "function_call", "name": "shell", "arguments": `{"command":["bash","-lc","cat answer.txt"]}`, "call_id": "call_1"},
		map[string]any{"type": "custom_tool_call", "name": "apply_patch", "input": "*** Begin Patch", "call_id": "call_2"},
		map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "ANSWER=42"},
		map[string]any{"type": "custom_tool_call_output", "call_id": "call_2", "output": "patched"},
	}
}

func TestParseResponses(t *testing.T) {
	raw := func(v any) []byte { b, _ := json.Marshal(v); return b }
	req, err := ParseResponses(raw(codexRequest(true, codexHistory()...)))
	if err != nil {
		t.Fatal(err)
	}
	roles := []string{}
	for _, m := range req.Messages {
		roles = append(roles, m.Role)
	}
	if strings.Join(roles, ",") != "system,user,assistant,tool,tool" {
		t.Fatalf("roles %v, want the instructions, the user, one assistant turn and two tool results", roles)
	}
	a := req.Messages[2]
	if a.Text != "Looking." || len(a.ToolCalls) != 2 || a.ToolCalls[0] != (ToolCall{ID: "call_1", Name: "shell", Arguments: `{"command":["bash","-lc","cat answer.txt"]}`}) ||
		a.ToolCalls[1] != (ToolCall{ID: "call_2", Name: "apply_patch", Arguments: "*** Begin Patch"}) {
		t.Fatalf("assistant turn %+v", a)
	}
	if tr := req.Messages[3]; tr.ToolCallID != "call_1" || tr.Text != "ANSWER=42" {
		t.Fatalf("tool result %+v", tr)
	}
	if req.Turn() != 2 || !req.Stream || !req.IncludeUsage || !req.EncryptedReasoning || req.ToolChoice != "auto" || req.API != "responses" {
		t.Fatalf("request %+v (turn %d)", req, req.Turn())
	}
	if !slices.Equal(req.Tools, []string{"shell", "apply_patch", "local_shell", "spawn_agent"}) || !slices.Equal(req.CustomTools, []string{"apply_patch"}) {
		t.Fatalf("tools %v, custom %v", req.Tools, req.CustomTools)
	}
	if !(Cond{ToolResultContains: "patched", API: "responses", Turn: 2}).Holds(req) {
		t.Fatal("the last tool result does not match")
	}

	for _, tc := range []struct {
		name, body, want string
	}{
		{"string input", `{"model":"m","input":"hi","max_output_tokens":7,"tool_choice":{"type":"function","name":"shell"}}`, ""},
		{"no model", `{"input":"hi"}`, "model is required"},
		{"no input", `{"model":"m"}`, "input is empty"},
		{"previous response", `{"model":"m","input":"hi","previous_response_id":"resp_1"}`, "resp_1"},
		{"bad max", `{"model":"m","input":"hi","max_output_tokens":0}`, "below 1"},
		{"bad role", `{"model":"m","input":[{"role":"wizard","content":"x"}]}`, "unknown role"},
		{"bad choice", `{"model":"m","input":"hi","tool_choice":"maybe"}`, "tool_choice"},
	} {
		req, err := ParseResponses([]byte(tc.body))
		if tc.want == "" {
			if err != nil || req.MaxTokens != 7 || req.ToolChoice != "tool:shell" || req.Messages[0].Role != "user" || req.Messages[0].Text != "hi" {
				t.Errorf("%s: %+v %v", tc.name, req, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", tc.name, err, tc.want)
		}
	}
}

// responsesEvents reads a Responses stream's events (their data, whose
// type must match the event line).
func responsesEvents(t *testing.T, r io.Reader) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, e := range events(t, r) {
		name, data, _ := strings.Cut(e, " ")
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("event %q: %v", e, err)
		}
		if m["type"] != name {
			t.Fatalf("event %q has type %v", name, m["type"])
		}
		out = append(out, m)
	}
	return out
}

func TestResponses(t *testing.T) {
	args := `{"command":["bash","-lc","cat answer.txt"]}`
	script := Script{Rules: []Rule{
		{When: Cond{API: "responses", Turn: 1}, Reply: Reply{Reasoning: "I should read it.", Content: "Let me look.",
			ToolCalls: []ToolCall{{ID: "call_1", Name: "shell", Arguments: args}, {ID: "call_2", Name: "apply_patch", Arguments: "*** Begin Patch"}},
			Usage:     Usage{Prompt: 300, Cached: 100}}},
		{When: Cond{API: "responses", ToolResultContains: "patched"}, Reply: Reply{Content: "The answer is 42."}},
	}}
	s := startSim(t, script, Options{APIKey: "sk-sim"})
	// Reasoning "I should read it." is 4 tokens, "Let me look." 3, the
	// shell call 1 + its argument tokens, the patch call 1 + 3.
	wantOutput := int64(4 + 3 + 1 + len(Tokens(args)) + 1 + 3)

	t.Run("non-streaming", func(t *testing.T) {
		resp := post(t, s, "/v1/responses", "sk-sim", codexRequest(false))
		var r struct {
			Status string           `json:"status"`
			Output []map[string]any `json:"output"`
			Usage  rsUsage          `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, err)
		}
		types := []string{}
		for _, o := range r.Output {
			types = append(types, o["type"].(string))
		}
		if r.Status != "completed" || strings.Join(types, ",") != "reasoning,message,function_call,custom_tool_call" {
			t.Fatalf("status %s, output %v", r.Status, types)
		}
		if r.Output[0]["encrypted_content"] == nil || r.Output[2]["arguments"] != args || r.Output[2]["call_id"] != "call_1" ||
			r.Output[3]["input"] != "*** Begin Patch" {
			t.Fatalf("output %v", r.Output)
		}
		if u := r.Usage; u.InputTokens != 300 || u.InputTokensDetails.CachedTokens != 100 || u.OutputTokens != wantOutput ||
			u.OutputTokensDetails.ReasoningTokens != 4 || u.TotalTokens != 300+wantOutput {
			t.Fatalf("usage %+v, want output %d", u, wantOutput)
		}
	})

	t.Run("streaming", func(t *testing.T) {
		resp := post(t, s, "/v1/responses", "sk-sim", codexRequest(true))
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		evs := responsesEvents(t, resp.Body)
		var text, argsGot, input, summary strings.Builder
		for i, e := range evs {
			if e["sequence_number"] != float64(i) {
				t.Fatalf("event %d has sequence number %v", i, e["sequence_number"])
			}
			d, _ := e["delta"].(string)
			switch e["type"] {
			case "response.output_text.delta":
				text.WriteString(d)
			case "response.function_call_arguments.delta":
				argsGot.WriteString(d)
			case "response.custom_tool_call_input.delta":
				input.WriteString(d)
			case "response.reasoning_summary_text.delta":
				summary.WriteString(d)
			}
		}
		if evs[0]["type"] != "response.created" || evs[len(evs)-1]["type"] != "response.completed" {
			t.Fatalf("first %v, last %v", evs[0]["type"], evs[len(evs)-1]["type"])
		}
		if text.String() != "Let me look." || argsGot.String() != args || input.String() != "*** Begin Patch" || summary.String() != "I should read it." {
			t.Fatalf("deltas: text %q, args %q, input %q, summary %q", text.String(), argsGot.String(), input.String(), summary.String())
		}
		final := evs[len(evs)-1]["response"].(map[string]any)
		usage := final["usage"].(map[string]any)
		if usage["output_tokens"] != float64(wantOutput) || usage["input_tokens_details"].(map[string]any)["cached_tokens"] != 100.0 ||
			len(final["output"].([]any)) != 4 {
			t.Fatalf("final response %v", final)
		}
	})

	t.Run("second turn", func(t *testing.T) {
		resp := post(t, s, "/v1/responses", "sk-sim", codexRequest(false, codexHistory()...))
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || !strings.Contains(string(b), "The answer is 42.") || strings.Contains(string(b), `"type":"reasoning"`) {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})

	t.Run("bounded", func(t *testing.T) {
		body := codexRequest(true)
		body["max_output_tokens"] = 5 // the reasoning and one token of text
		resp := post(t, s, "/v1/responses", "sk-sim", body)
		evs := responsesEvents(t, resp.Body)
		last := evs[len(evs)-1]
		final := last["response"].(map[string]any)
		if last["type"] != "response.incomplete" || final["status"] != "incomplete" || final["usage"].(map[string]any)["output_tokens"] != 5.0 {
			t.Fatalf("last event %v", last)
		}
		for _, e := range evs {
			if e["type"] == "response.function_call_arguments.delta" {
				t.Fatal("a tool call past max_output_tokens was sent")
			}
		}
	})

	t.Run("wrong key", func(t *testing.T) {
		resp := post(t, s, "/v1/responses", "sk-wrong", codexRequest(false))
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%d", resp.StatusCode)
		}
	})
}

func FuzzParseResponses(f *testing.F) {
	b, _ := json.Marshal(codexRequest(true, codexHistory()...))
	f.Add(b)
	f.Add([]byte(`{"model":"m","input":"hi"}`))
	f.Add([]byte(`{"model":"m","input":[{"type":"local_shell_call","id":"ls","action":{"type":"exec","command":["ls"]}},{"type":"local_shell_call_output","id":"ls","output":"x"}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseResponses(b)
		if err == nil && (req.Model == "" || len(req.Messages) == 0 || req.MaxTokens < 0) {
			t.Fatalf("accepted %q as %+v", b, req)
		}
	})
}

// TestParseCodex169: the shape of Codex CLI 0.169.0's requests (items
// with ids, reasoning content null, exec_command, a namespace of
// sub-agent functions) reads as a conversation at its second turn.
func TestParseCodex169(t *testing.T) {
	body := `{"model":"m","stream":true,"tool_choice":"auto","parallel_tool_calls":true,"reasoning":{"summary":"auto"},"store":false,` +
		`"include":["reasoning.encrypted_content"],"client_metadata":{"session_id":"0199"},` +
		`"input":[{"type":"message","id":"msg_1","role":"developer","content":[{"type":"input_text","text":"<permissions>"}]},` +
		`{"type":"message","id":"msg_2","role":"user","content":[{"type":"input_text","text":"What is the answer?"}]},` +
		`{"type":"reasoning","id":"rs_1","summary":[{"type":"summary_text","text":"run it"}],"content":null,"encrypted_content":"gAAA"},` +
		`{"type":"message","status":"completed","id":"msg_3","role":"assistant","content":[{"type":"output_text","text":"Running."}]},` +
		`{"type":"function_call","status":"completed","id":"fc_1","name":"exec_command","arguments":"{\"cmd\":\"echo hi\"}","call_id":"call_1"},` +
		`{"type":"function_call_output","id":"fco_1","call_id":"call_1","output":"Process exited with code 0\nhi"}],` +
		`"tools":[{"type":"function","name":"exec_command","parameters":{}},{"type":"namespace","name":"multi_agent_v1","tools":[{"type":"function","name":"spawn_agent"}]}]}`
	req, err := ParseResponses([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if req.Turn() != 2 || !(Cond{LastRole: "tool", ToolResultContains: "hi", ToolOffered: "spawn_agent"}).Holds(req) ||
		req.Messages[2].ToolCalls[0].Name != "exec_command" || req.Messages[3].ToolCallID != "call_1" {
		t.Fatalf("%+v", req)
	}
}
