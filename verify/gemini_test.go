package verify

import (
	"testing"
)

// TestGeminiMessages reads a Gemini CLI conversation as verification
// compares it: the system instruction, the user's text, the model's text
// and function call (thoughts left out), the function response as a tool
// message answering the call's id; and the answer's message equals the
// same turn when the next request repeats it.
func TestGeminiMessages(t *testing.T) {
	req := []byte(`{"systemInstruction":{"parts":[{"text":"You are an agent."}]},
"contents":[{"role":"user","parts":[{"text":"solve"}]},
{"role":"model","parts":[{"text":"thinking","thought":true},{"text":"I look."},{"functionCall":{"id":"c1","name":"run_shell_command","args":{"command":"ls"}},"thoughtSignature":"sig"}]},
{"role":"user","parts":[{"functionResponse":{"id":"c1","name":"run_shell_command","response":{"output":"a.txt"}}}]}]}`)
	ms, err := RequestMessages(APIGeminiGenerate, req)
	if err != nil {
		t.Fatal(err)
	}
	want := []Message{
		{Role: RoleSystem, Text: "You are an agent."},
		{Role: RoleUser, Text: "solve"},
		{Role: RoleAssistant, Text: "I look.", Calls: []ToolCall{{ID: "c1", Name: "run_shell_command", Args: `{"command":"ls"}`}}},
		{Role: RoleTool, CallID: "c1", Text: "a.txt"},
	}
	if len(ms) != len(want) {
		t.Fatalf("%d messages: %+v", len(ms), ms)
	}
	for i := range want {
		if !ms[i].Equal(want[i]) {
			t.Errorf("message %d: %+v, want %+v", i, ms[i], want[i])
		}
	}
	resp := []byte(`{"candidates":[{"content":{"role":"model","parts":[{"text":"I look."},{"functionCall":{"id":"c1","name":"run_shell_command","args":{"command":"ls"}}}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":5}}`)
	m, err := ResponseMessage(APIGeminiGenerate, resp)
	if err != nil || !m.Equal(ms[2]) {
		t.Fatalf("answer %+v (%v), want the request's model turn %+v", m, err, ms[2])
	}
	// A call without an id is answered by name.
	ms, err = RequestMessages(APIGeminiGenerate, []byte(`{"contents":[{"role":"model","parts":[{"functionCall":{"name":"f","args":{}}}]},
{"role":"user","parts":[{"functionResponse":{"name":"f","response":{"a":1,"b":2}}},{"text":"go on"}]}]}`))
	if err != nil || len(ms) != 3 || ms[0].Calls[0].ID != "f" || ms[1].CallID != "f" || ms[1].Text != `{"a":1,"b":2}` || ms[2].Text != "go on" {
		t.Fatalf("%+v %v", ms, err)
	}
	for _, bad := range []string{`{"candidates":[]}`, `not json`, `{"candidates":[{"content":{"parts":[{"text":1}]}}]}`} {
		if _, err := ResponseMessage(APIGeminiGenerate, []byte(bad)); err == nil {
			t.Errorf("answer %s was read", bad)
		}
	}
	if _, err := RequestMessages(APIGeminiGenerate, []byte(`{"contents":[{"role":"robot","parts":[]}]}`)); err == nil {
		t.Error("a content of an unknown role was read")
	}
}

// FuzzGeminiMessages: any request or answer body is read or refused,
// never a panic.
func FuzzGeminiMessages(f *testing.F) {
	for _, s := range []string{
		`{"contents":[{"role":"user","parts":[{"text":"x"}]}]}`,
		`{"candidates":[{"content":{"parts":[{"functionCall":{"name":"f","args":{"a":[1,2]}}}]}}]}`,
		`{"contents":[{"role":"user","parts":[{"functionResponse":{"name":"f","response":null}},{"inlineData":{"mimeType":"image/png"}}]}]}`,
		`{"systemInstruction":{"parts":[{"thought":true}]},"contents":null}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		RequestMessages(APIGeminiGenerate, b)
		ResponseMessage(APIGeminiGenerate, b)
	})
}
