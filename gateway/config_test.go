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

func TestServerToolsConfig(t *testing.T) {
	base := func(m Model) Config {
		return Config{Providers: []Provider{{Name: "a", API: APIAnthropic, BaseURL: "https://api.anthropic.com", AnthropicBetas: []string{"x-2026"}},
			{Name: "o", API: APIOpenAI, BaseURL: "https://api.openai.com/v1"}}, Models: []Model{m}}
	}
	ok := Model{Name: "c", Provider: "a", MaxOutput: 100, Price: PriceUSD{Input: 3, Output: 15, CacheWrite: 6, CacheWrite5m: 3.75},
		ServerTools: map[string]ServerTool{"web_search_20250305": {Price: 0.01, MaxUses: 5, InputTokensPerUse: 8000},
			"web_fetch_20250910": {MaxUses: 2, InputTokensPerUse: 20000}}}
	cc, err := base(ok).compile()
	if err != nil {
		t.Fatal(err)
	}
	rt := cc.routes["c"]
	if rt.price.WebSearch != USD/100 || rt.price.WebFetch != 0 || rt.price.CacheWrite5m != 3_750_000 || rt.price.CacheWrite != 6_000_000 ||
		rt.tools["web_search_20250305"].maxUses != 5 || rt.tools["web_fetch_20250910"].perUse != 20000 || !rt.betas["x-2026"] ||
		!rt.betas["claude-code-20250219"] {
		t.Fatalf("route %+v", rt)
	}
	for _, tc := range []struct {
		name string
		m    func(Model) Model
		want string
	}{
		{"a tool billed by container time", func(m Model) Model {
			m.ServerTools = map[string]ServerTool{"code_execution_20250522": {MaxUses: 1, InputTokensPerUse: 1}}
			return m
		}, "code_execution_20250522"},
		{"no max_uses", func(m Model) Model {
			m.ServerTools = map[string]ServerTool{"web_search_20250305": {Price: 0.01, InputTokensPerUse: 1}}
			return m
		}, "max_uses 0"},
		{"no tokens per use", func(m Model) Model {
			m.ServerTools = map[string]ServerTool{"web_search_20250305": {Price: 0.01, MaxUses: 1}}
			return m
		}, "input_tokens_per_use 0"},
		{"two versions of one kind", func(m Model) Model {
			m.ServerTools = map[string]ServerTool{"web_search_20250305": {MaxUses: 1, InputTokensPerUse: 1}, "web_search_20260209": {MaxUses: 1, InputTokensPerUse: 1}}
			return m
		}, "already configured"},
		{"a negative price", func(m Model) Model {
			m.ServerTools = map[string]ServerTool{"web_search_20250305": {Price: -1, MaxUses: 1, InputTokensPerUse: 1}}
			return m
		}, "price"},
		{"an OpenAI model", func(m Model) Model { m.Provider = "o"; return m }, "only Anthropic models"},
		{"a five-minute price finer than a millionth", func(m Model) Model { m.Price.CacheWrite5m = 0.0000001; return m }, "cache_write_5m"},
	} {
		if err := base(tc.m(ok)).Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
	bad := base(Model{Name: "c", Provider: "a", MaxOutput: 1})
	bad.Providers[0].AnthropicBetas = []string{"a,b"}
	bad.Limits.CountTokensPerMinute = -1
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), `"a,b"`) || !strings.Contains(err.Error(), "count_tokens_per_minute") {
		t.Errorf("bad betas and rate: %v", err)
	}
}
