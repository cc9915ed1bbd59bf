package modelsim

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// geminiConversation is a Gemini CLI-like conversation: a system
// instruction, a prompt, a model turn calling run_shell_command and the
// user turn with its result.
const geminiConversation = `{
 "systemInstruction": {"parts": [{"text": "You are an agent."}]},
 "contents": [
  {"role": "user", "parts": [{"text": "Find the answer."}]},
  {"role": "model", "parts": [{"text": "Looking.", "thought": true}, {"text": "Let me look."},
    {"functionCall": {"id": "c1", "name": "run_shell_command", "args": {"command": "cat answer.txt"}}}]},
  {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "run_shell_command", "response": {"output": "ANSWER=42"}}}]}
 ],
 "tools": [{"functionDeclarations": [{"name": "run_shell_command"}, {"name": "write_file"}]}],
 "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["write_file"]}},
 "generationConfig": {"maxOutputTokens": 100, "thinkingConfig": {"thinkingBudget": 50}}
}`

func TestParseGemini(t *testing.T) {
	req, err := ParseGemini([]byte(geminiConversation), "gemini-sim", true)
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{
		{Role: "system", Text: "You are an agent."},
		{Role: "user", Text: "Find the answer."},
		{Role: "assistant", Text: "Let me look.", ToolCalls: []ToolCall{{ID: "c1", Name: "run_shell_command", Arguments: `{"command": "cat answer.txt"}`}}},
		{Role: "tool", Text: "ANSWER=42", ToolCallID: "c1"},
	}
	got, _ := json.Marshal(req.Messages)
	if w, _ := json.Marshal(want); !bytes.Equal(got, w) {
		t.Fatalf("messages\n%s\nwant\n%s", got, w)
	}
	if req.API != "gemini" || req.Model != "gemini-sim" || !req.Stream || req.MaxTokens != 100 || req.ToolChoice != "tool:write_file" ||
		strings.Join(req.Tools, ",") != "run_shell_command,write_file" || req.Turn() != 2 {
		t.Fatalf("request %+v", req)
	}
	for _, tc := range []struct {
		name, body, want string
	}{
		{"no contents", `{"contents": []}`, "contents is empty"},
		{"not JSON", `{`, "generateContent request"},
		{"zero max", `{"contents": [{"role": "user", "parts": [{"text": "x"}]}], "generationConfig": {"maxOutputTokens": 0}}`, "below 1"},
		{"bad role", `{"contents": [{"role": "system", "parts": [{"text": "x"}]}]}`, "unknown role"},
		{"bad mode", `{"contents": [{"parts": [{"text": "x"}]}], "toolConfig": {"functionCallingConfig": {"mode": "SOME"}}}`, "mode"},
	} {
		if _, err := ParseGemini([]byte(tc.body), "m", false); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one saying %q", tc.name, err, tc.want)
		}
	}
	for mode, want := range map[string]string{"NONE": "none", "ANY": "required", "AUTO": "auto", "": "auto"} {
		body := `{"contents": [{"parts": [{"text": "x"}]}], "toolConfig": {"functionCallingConfig": {"mode": "` + mode + `"}}}`
		if req, err := ParseGemini([]byte(body), "m", false); err != nil || req.ToolChoice != want {
			t.Errorf("mode %q: tool choice %q (%v), want %q", mode, req.ToolChoice, err, want)
		}
	}
}

func FuzzParseGemini(f *testing.F) {
	f.Add([]byte(geminiConversation))
	f.Add([]byte(`{"contents":[{"parts":[{"functionResponse":{"name":"x","response":null}}]}]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		req, err := ParseGemini(b, "m", false)
		if err == nil && (req.Model != "m" || len(req.Messages) == 0 || req.API != "gemini") {
			t.Fatalf("accepted %q as %+v", b, req)
		}
	})
}

func postGemini(t *testing.T, s *Server, path, key string, viaQuery bool, body string) *http.Response {
	t.Helper()
	url := s.URL() + path
	if viaQuery {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		url += sep + "key=" + key
	}
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if !viaQuery {
		req.Header.Set("x-goog-api-key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestGemini(t *testing.T) {
	script := Script{Rules: []Rule{
		{When: Cond{API: "gemini", ToolResultContains: "ANSWER=42"}, Reply: Reply{Content: "The answer is 42.",
			Usage: Usage{Prompt: 300, Cached: 100, Thoughts: 7}}},
		{When: Cond{API: "gemini", Turn: 1}, Reply: Reply{Content: "Let me look.",
			ToolCalls: []ToolCall{{ID: "c1", Name: "run_shell_command", Arguments: `{"command":"cat answer.txt"}`}}}},
	}}
	s := startSim(t, script, Options{APIKey: "AIza-sim-key"})
	first := `{"contents": [{"role": "user", "parts": [{"text": "Find the answer."}]}]}`

	t.Run("function call", func(t *testing.T) {
		resp := postGemini(t, s, "/v1beta/models/gemini-sim:generateContent", "AIza-sim-key", false, first)
		var r gmResponse
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != 200 {
			t.Fatalf("%d %v", resp.StatusCode, err)
		}
		parts := r.Candidates[0].Content.Parts
		if len(parts) != 2 || *parts[0].Text != "Let me look." || parts[1].FunctionCall == nil ||
			parts[1].FunctionCall.Name != "run_shell_command" || string(parts[1].FunctionCall.Args) != `{"command":"cat answer.txt"}` {
			t.Fatalf("parts %+v", parts)
		}
		if r.Candidates[0].FinishReason != "STOP" || r.UsageMetadata == nil || r.UsageMetadata.CandidatesTokenCount != int64(len(Tokens("Let me look."))+1+len(Tokens(`{"command":"cat answer.txt"}`))) ||
			r.UsageMetadata.PromptTokenCount != int64(len(first)+3)/4 {
			t.Fatalf("finish %q usage %+v", r.Candidates[0].FinishReason, r.UsageMetadata)
		}
	})
	t.Run("stream with cached and thinking tokens", func(t *testing.T) {
		resp := postGemini(t, s, "/v1beta/models/gemini-sim:streamGenerateContent?alt=sse", "AIza-sim-key", true, geminiConversation)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "text/event-stream" {
			t.Fatalf("%d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
		}
		var text strings.Builder
		var last gmResponse
		evs := events(t, resp.Body)
		for i, e := range evs {
			var c gmResponse
			if err := json.Unmarshal([]byte(e), &c); err != nil {
				t.Fatal(err)
			}
			for _, p := range c.Candidates[0].Content.Parts {
				if p.Text != nil {
					text.WriteString(*p.Text)
				}
			}
			if i < len(evs)-1 && (c.Candidates[0].FinishReason != "" || c.UsageMetadata.CandidatesTokenCount != 0) {
				t.Fatalf("chunk %d before the last ends or counts candidates: %s", i, e)
			}
			last = c
		}
		// The scripted 7 thinking tokens fit in maxOutputTokens 100 with
		// the 4 of the answer.
		u := last.UsageMetadata
		if text.String() != "The answer is 42." || last.Candidates[0].FinishReason != "STOP" || u == nil ||
			u.PromptTokenCount != 300 || u.CachedContentTokenCount != 100 || u.ThoughtsTokenCount != 7 || u.CandidatesTokenCount != 4 ||
			u.TotalTokenCount != 311 {
			t.Fatalf("text %q, last chunk %+v usage %+v", text.String(), last, u)
		}
	})
	t.Run("thoughts within maxOutputTokens", func(t *testing.T) {
		body := strings.Replace(geminiConversation, `"maxOutputTokens": 100`, `"maxOutputTokens": 8`, 1)
		resp := postGemini(t, s, "/v1beta/models/gemini-sim:generateContent", "AIza-sim-key", false, body)
		var r gmResponse
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
			t.Fatal(err)
		}
		if u := r.UsageMetadata; u.CandidatesTokenCount+u.ThoughtsTokenCount != 8 || u.ThoughtsTokenCount != 4 {
			t.Fatalf("usage %+v: candidates and thoughts must fill maxOutputTokens 8", u)
		}
	})
	t.Run("count tokens", func(t *testing.T) {
		resp := postGemini(t, s, "/v1beta/models/gemini-sim:countTokens", "AIza-sim-key", false, first)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || string(b) != `{"totalTokens":`+itoa(int64(len(first)+3)/4)+`}` {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})
	t.Run("wrong key", func(t *testing.T) {
		resp := postGemini(t, s, "/v1beta/models/gemini-sim:generateContent", "wrong", true, first)
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 401 || !strings.Contains(string(b), `"UNAUTHENTICATED"`) {
			t.Fatalf("%d %s", resp.StatusCode, b)
		}
	})
	t.Run("unknown method", func(t *testing.T) {
		resp := postGemini(t, s, "/v1beta/models/gemini-sim:embedContent", "AIza-sim-key", false, first)
		if resp.StatusCode != 404 {
			t.Fatalf("%d", resp.StatusCode)
		}
	})
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }
