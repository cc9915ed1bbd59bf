package dashboard

import "testing"

// TestCallMessages: the attempt page reads every API the gateway serves:
// a Responses API call (Codex CLI's) and a Gemini call (Gemini CLI's)
// read as messages with their tool calls and tool results, as chat
// completions do, not as raw JSON.
func TestCallMessages(t *testing.T) {
	cases := []struct {
		api, req, resp string
		wantReq        []Message
		wantResp       Message
	}{
		{api: "openai.responses",
			req: `{"model":"m","instructions":"Be brief.","input":[{"type":"message","role":"user","content":[{"type":"input_text","text":"Find q."}]},` +
				`{"type":"function_call","call_id":"c1","name":"exec_command","arguments":"{\"cmd\":\"cat a\"}"},{"type":"function_call_output","call_id":"c1","output":"q=2"}]}`,
			resp:     `{"output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"q is 2"}]}]}`,
			wantReq:  []Message{{Role: "system", Content: "Be brief."}, {Role: "user", Content: "Find q."}},
			wantResp: Message{Role: "assistant", Content: "q is 2"}},
		{api: "gemini.generateContent",
			req: `{"systemInstruction":{"parts":[{"text":"You are Gemini CLI."}]},"contents":[{"role":"user","parts":[{"text":"Find q."}]},` +
				`{"role":"model","parts":[{"functionCall":{"name":"run_shell_command","args":{"command":"cat a"}}}]},` +
				`{"role":"user","parts":[{"functionResponse":{"name":"run_shell_command","response":{"output":"q=2"}}}]}]}`,
			resp:     `{"candidates":[{"content":{"role":"model","parts":[{"text":"q is 2"}]}}]}`,
			wantReq:  []Message{{Role: "system", Content: "You are Gemini CLI."}, {Role: "user", Content: "Find q."}},
			wantResp: Message{Role: "assistant", Content: "q is 2"}},
	}
	for _, c := range cases {
		t.Run(c.api, func(t *testing.T) {
			req, resp := CallMessages(c.api, []byte(c.req), []byte(c.resp))
			if len(req) < 4 {
				t.Fatalf("request read as %+v", req)
			}
			for i, w := range c.wantReq {
				if req[i].Role != w.Role || req[i].Content != w.Content {
					t.Errorf("message %d: %+v, want %+v", i, req[i], w)
				}
			}
			if len(req[2].ToolCalls) != 1 || req[3].Content == "" {
				t.Errorf("the tool call and its result: %+v %+v", req[2], req[3])
			}
			if len(resp) != 1 || resp[0].Role != c.wantResp.Role || resp[0].Content != c.wantResp.Content {
				t.Errorf("answer %+v, want %+v", resp, c.wantResp)
			}
		})
	}
	// Chat completions read as before.
	req, resp := CallMessages("openai.chat.completions", []byte(`{"messages":[{"role":"user","content":"hi"}]}`),
		[]byte(`{"choices":[{"message":{"role":"assistant","content":"hello"}}]}`))
	if len(req) != 1 || req[0].Content != "hi" || len(resp) != 1 || resp[0].Content != "hello" {
		t.Fatalf("chat: %+v %+v", req, resp)
	}
}
