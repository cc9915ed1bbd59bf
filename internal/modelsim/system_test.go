package modelsim

import "testing"

// TestAnthropicSystemMessages: Claude Code sends system messages among
// the others (its environment after the user's prompt); they are read as
// system messages, and an unknown role is still refused.
func TestAnthropicSystemMessages(t *testing.T) {
	req, err := ParseAnthropic([]byte(`{"model":"m","max_tokens":10,"system":[{"type":"text","text":"top"}],
"messages":[{"role":"user","content":"solve"},{"role":"system","content":[{"type":"text","text":"# Environment","cache_control":{"type":"ephemeral"}}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if len(req.Messages) != 3 || req.Messages[2].Role != "system" || req.Messages[2].Text != "# Environment" || req.Turn() != 1 {
		t.Fatalf("%+v", req.Messages)
	}
	if _, err := ParseAnthropic([]byte(`{"model":"m","max_tokens":10,"messages":[{"role":"robot","content":"x"}]}`)); err == nil {
		t.Fatal("an unknown role was read")
	}
}
