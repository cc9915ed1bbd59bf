package main

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDemoModelFlags: the demo's model flags make the reference agent's
// model (the key read from its file), and bad combinations are refused
// with an error naming the flag, never the key.
func TestDemoModelFlags(t *testing.T) {
	const key = "sk-demo-flag-test-5b1e"
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	twoKeys := filepath.Join(dir, "two")
	os.WriteFile(twoKeys, []byte(key+"\n"+key+"\n"), 0o600)

	m, err := demoModel("", "", "", "0/0", 1)
	if err != nil || !m.Scripted() || m.AttemptUSD != 1 {
		t.Errorf("default: %+v %v", m, err)
	}
	m, err = demoModel("http://127.0.0.1:9/v1", keyFile, "gpt-x", "2.5/10", 0.5)
	if err != nil || m.Scripted() || m.Key != key || m.Name != "gpt-x" || m.Price.Input != 2.5 || m.Price.Output != 10 || m.AttemptUSD != 0.5 {
		t.Errorf("provider: %+v %v", m, err)
	}
	for _, c := range []struct {
		url, keyFile, model, price string
		budget                     float64
		want                       string
	}{
		{"", keyFile, "", "0/0", 1, "go with --model-url"},
		{"", "", "gpt-x", "0/0", 1, "go with --model-url"},
		{"http://127.0.0.1:9/v1", "", "gpt-x", "0/0", 1, "needs --model-key-file"},
		{"http://127.0.0.1:9/v1", filepath.Join(dir, "missing"), "gpt-x", "0/0", 1, "--model-key-file"},
		{"http://127.0.0.1:9/v1", twoKeys, "gpt-x", "0/0", 1, "one key on one line"},
		{"http://127.0.0.1:9/v1", keyFile, "", "0/0", 1, "without a model name"},
		{"ftp://x/v1", keyFile, "gpt-x", "0/0", 1, "want an http:// or https://"},
		{"http://127.0.0.1:9/v1", keyFile, "gpt-x", "2.5", 1, "--model-price"},
		{"http://127.0.0.1:9/v1", keyFile, "gpt-x", "-1/2", 1, "negative price"},
		{"http://127.0.0.1:9/v1", keyFile, "gpt-x", "0/0", 0, "--budget-usd"},
	} {
		_, err := demoModel(c.url, c.keyFile, c.model, c.price, c.budget)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), key) {
			t.Errorf("%+v: the key is in the error: %v", c, err)
		}
	}
}

// TestDemoConfig: `repronet demo --config FILE --model NAME` takes the
// reference agent's model from the gateway tables of a configuration file,
// as the coordinator does; what the reference agent cannot call is refused
// before anything starts, naming the model.
func TestDemoConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "demo.toml")
	os.WriteFile(filepath.Join(dir, "a.key"), []byte("sk-ant-demo-config-0123\n"), 0o600)
	os.WriteFile(cfg, []byte(`
[[providers]]
name = "anthropic"
api = "anthropic"
base_url = "http://127.0.0.1:9"
key_file = "a.key"

[[models]]
name = "claude-x"
provider = "anthropic"
max_output = 1024
price = { input = 3, output = 15 }
`), 0o600)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--config", cfg}, "--model names the one the reference agent calls"},
		{[]string{"--config", cfg, "--model", "gpt-x"}, `model "gpt-x" is not among the configuration's models [claude-x]`},
		{[]string{"--config", cfg, "--model", "claude-x"}, "the reference agent speaks OpenAI's chat completions"},
		{[]string{"--config", cfg, "--model", "claude-x", "--model-url", "http://127.0.0.1:9/v1"}, "do not go with a --config"},
	} {
		err := runDemo(t.Context(), c.args, io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
