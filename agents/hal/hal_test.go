package hal

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/repronet/repronet/internal/modelsim"
)

// python is the interpreter the harness runs with in these tests (the
// image's is Debian's /usr/bin/python3).
func python(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	return p
}

// runHarness lays out a workspace holding a capsule and a prompt, and runs
// harness.py there on the agent in agentDir, with env added.
func runHarness(t *testing.T, agentDir string, env ...string) (ws string, code int, out string) {
	t.Helper()
	dir := t.TempDir()
	ws = filepath.Join(dir, "workspace")
	for p, body := range map[string]string{
		"capsule-0000001/results/out.txt": "accuracy 0.93\n",
		"capsule-0000001/code/run":        "echo hi\n",
		"prompt.txt":                      "What is the accuracy (`accuracy` in results/out.txt)?",
	} {
		full := filepath.Join(ws, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(dir, "harness.py")
	if err := os.WriteFile(script, Harness(), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python(t), script)
	cmd.Dir = ws
	cmd.Env = append(os.Environ(), append([]string{"PROMPT_FILE=" + filepath.Join(ws, "prompt.txt"), "HAL_AGENT_DIR=" + agentDir}, env...)...)
	b, err := cmd.CombinedOutput()
	code = cmd.ProcessState.ExitCode()
	if err != nil && code <= 0 {
		t.Fatalf("harness: %v: %s", err, b)
	}
	return ws, code, string(b)
}

// exampleDir writes the example agent to a folder.
func exampleDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, Example()); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestHarnessExampleAgent runs the example HAL agent through the
// adapter's harness against a scripted model on loopback: it finds the
// task's files under environment/ as HAL lays them out, calls the model
// with the key and model name it was given, runs the bash command the
// model asks for, and its answers (returned as a JSON string) land in
// report.json.
func TestHarnessExampleAgent(t *testing.T) {
	cmd, _ := json.Marshal(map[string]string{"command": "cat environment/results/out.txt; test -f input.json && test -f agent_args.json && echo laid-out"})
	sim, err := modelsim.Start(modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{ToolResultContains: "accuracy 0.93\nlaid-out", Model: "m-1"}, Reply: modelsim.Reply{
			ToolCalls: []modelsim.ToolCall{{ID: "s", Name: "submit", Arguments: `{"answers": {"What is the accuracy?": 0.93}}`}}}},
		{When: modelsim.Cond{ToolOffered: "bash", LastRole: "user", Model: "m-1"}, Reply: modelsim.Reply{
			ToolCalls: []modelsim.ToolCall{{ID: "b", Name: "bash", Arguments: string(cmd)}}}},
	}, Default: &modelsim.Reply{Content: "I cannot tell."}}, modelsim.Options{APIKey: "tok-1"})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	model := []string{"OPENAI_BASE_URL=" + sim.URL() + "/v1", "OPENAI_API_KEY=tok-1"}
	ws, code, out := runHarness(t, exampleDir(t), append(model, `HAL_AGENT_ARGS={"model_name": "m-1"}`)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, out)
	}
	b, err := os.ReadFile(filepath.Join(ws, "report.json"))
	if err != nil || string(b) != `{"What is the accuracy?": 0.93}` {
		t.Fatalf("report %s, %v; output %s", b, err, out)
	}
	var input map[string]struct {
		Prompt string
		Files  map[string]string
		GPU    bool
	}
	b, _ = os.ReadFile(filepath.Join(ws, "input.json"))
	if err := json.Unmarshal(b, &input); err != nil || input["capsule-0000001"].Files["/root/environment/results/out.txt"] != "out.txt" ||
		!strings.Contains(input["capsule-0000001"].Prompt, "What is the accuracy") {
		t.Errorf("input.json %s: %v", b, err)
	}

	// The model never answers: nothing for the task, exit 1, no report.
	ws, code, out = runHarness(t, exampleDir(t), append(model, `HAL_AGENT_ARGS={"model_name": "other"}`)...)
	if _, err := os.Stat(filepath.Join(ws, "report.json")); code != 1 || err == nil || !strings.Contains(out, "returned no answers for capsule-0000001") {
		t.Errorf("no answers: exit %d, report %v: %s", code, err, out)
	}
	// Wrong settings: exit 2, saying what is wrong.
	for _, c := range []struct{ env, want string }{
		{`HAL_AGENT_ARGS=["m-1"]`, "want a JSON object"},
		{"HAL_AGENT_FUNCTION=agent.solve", "no "},
		{"HAL_AGENT_FUNCTION=main.nothing", "main has no function nothing"},
	} {
		if _, code, out := runHarness(t, exampleDir(t), append(model, c.env)...); code != 2 || !strings.Contains(out, c.want) {
			t.Errorf("%s: exit %d: %s", c.env, code, out)
		}
	}
}

func TestSpec(t *testing.T) {
	agent := fstest.MapFS{"main.py": {Data: []byte("def run(input, **kw): return {}\n")}, "lib/util.py": {Data: []byte("")}}
	s, err := Spec("x", agent, "")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range s.Files {
		paths = append(paths, f.Path)
	}
	if got := strings.Join(paths, " "); got != "/agent /agent/hal_harness.py /agent/agent /agent/agent/lib /agent/agent/lib/util.py /agent/agent/main.py" {
		t.Errorf("files %s", got)
	}
	if !strings.Contains(strings.Join(s.Config.Env, " "), "HAL_AGENT_FUNCTION=main.run") || s.Config.Entrypoint[1] != HarnessPath {
		t.Errorf("config %+v", s.Config)
	}
	for _, fn := range []string{"run", "agent.run", "main.", "a b.run"} {
		if _, err := Spec("x", agent, fn); err == nil {
			t.Errorf("function %q accepted", fn)
		}
	}
}
