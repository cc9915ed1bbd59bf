package gateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestLoadConfig(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "openai.key"), []byte("sk-from-file-123456\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	conf := `{
  "providers": [
    {"name": "openai", "api": "openai", "base_url": "https://api.openai.com/v1", "key_file": "openai.key"},
    {"name": "vllm", "api": "openai", "base_url": "http://10.0.0.9:8000/v1", "output_field": "max_tokens"},
    {"name": "anthropic", "api": "anthropic", "base_url": "https://api.anthropic.com"},
    {"name": "google", "api": "gemini", "base_url": "https://generativelanguage.googleapis.com/"}
  ],
  "models": [
    {"name": "gpt-4.1", "provider": "openai", "upstream": "gpt-4.1-2025-04-14", "price": {"input": 2, "output": 8, "cached_input": 0.5}, "max_output": 32768},
    {"name": "qwen", "provider": "vllm", "price": {"input": 0, "output": 0}, "max_output": 8192},
    {"name": "claude", "provider": "anthropic", "price": {"input": 3, "output": 15, "cached_input": 0.3, "cache_write": 6}, "max_output": 64000, "image_tokens": 1600},
    {"name": "gemini", "provider": "google", "upstream": "gemini-2.5-pro", "price": {"input": 1.25, "output": 10, "cached_input": 0.3125}, "max_output": 65536}
  ],
  "limits": {"call_timeout": "90s", "min_output_tokens": 32}
}`
	path := filepath.Join(dir, "gateway.json")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := LoadConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	if c.Providers[0].Key != "sk-from-file-123456" || time.Duration(c.Limits.CallTimeout) != 90*time.Second {
		t.Fatalf("loaded %+v", c)
	}
	cc, err := c.compile()
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"gpt-4.1": "https://api.openai.com/v1/chat/completions",
		"qwen":    "http://10.0.0.9:8000/v1/chat/completions",
		"claude":  "https://api.anthropic.com/v1/messages",
		"gemini":  "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro",
	} {
		if got := cc.routes[name].endpoint; got != want {
			t.Errorf("%s: endpoint %s, want %s", name, got, want)
		}
	}
	if r := cc.routes["gpt-4.1"]; r.model.Upstream != "gpt-4.1-2025-04-14" || r.price.Input != 2_000_000 || r.provider.OutputField != "max_completion_tokens" ||
		r.model.ImageTokens != DefaultImageTokens || r.model.InputOverhead != DefaultInputOverhead {
		t.Errorf("gpt-4.1 route %+v", r)
	}
	if r := cc.routes["qwen"]; r.model.Upstream != "qwen" || r.provider.OutputField != "max_tokens" {
		t.Errorf("qwen route %+v", r)
	}
	if r := cc.routes["claude"]; r.model.ImageTokens != 1600 || r.provider.AnthropicVersion != DefaultAnthropicVersion || cc.limits.MinOutputTokens != 32 {
		t.Errorf("claude route %+v", r)
	}
	// A configuration's errors name what is wrong, all of them at once.
	bad := Config{
		Providers: []Provider{{Name: "p", API: "palm", BaseURL: "ftp://x"}, {Name: "p", API: "openai", BaseURL: "https://x", OutputField: "max"},
			{Name: "g", API: "gemini", BaseURL: "https://g"}},
		Models: []Model{{Name: "m", Provider: "nobody", MaxOutput: 0, Price: PriceUSD{Input: -1}}, {Name: "m", Provider: "p", MaxOutput: 10},
			{Name: "g", Provider: "g", Upstream: "models/x:y", MaxOutput: 10}},
		Limits: Limits{CallTimeout: Duration(time.Millisecond)},
	}
	err = bad.Validate()
	for _, want := range []string{`api "palm"`, `upstream "models/x:y" of a Gemini model`, `base_url "ftp://x"`, "name used twice", `output_field "max"`, `provider "nobody"`,
		"input price", "max_output 0", "call timeout"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("validation error %v does not name %q", err, want)
		}
	}
	if _, err := LoadConfig(filepath.Join(dir, "absent.json")); err == nil {
		t.Error("loaded an absent file")
	}
	if err := os.WriteFile(path, []byte(`{"providers": [], "modles": []}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadConfig(path); err == nil || !strings.Contains(err.Error(), "modles") {
		t.Errorf("a misspelt field: %v", err)
	}
}
