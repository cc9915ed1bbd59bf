package clisim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/repronet/repronet/internal/modelsim"
)

// TestScripts walks each agent's script through a task as the agent's
// requests show it: the shell tool first, the report once a tool result
// holds the task's results (with the task's answers, as report.json's
// text), the last words once the report is written; and nothing is
// answered from a tool result that does not show the results.
func TestScripts(t *testing.T) {
	_, tasks, err := sample()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, api, shell, write, written string
		script                           func() (modelsim.Script, error)
	}{
		{"claude-code", "anthropic", "Bash", "Write", "File created successfully at: /workspace/report.json", Claude},
		{"codex", "responses", "exec_command", "exec_command", "Output:\nSuccess. Updated the following files:\nA /workspace/report.json\n", Codex},
		{"gemini-cli", "gemini", "run_shell_command", "write_file", "Successfully created and wrote to new file: /workspace/report.json.", Gemini},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := c.script()
			if err != nil {
				t.Fatal(err)
			}
			tools := []string{c.shell, c.write, "Read"}
			first, err := s.Match(modelsim.Request{API: c.api, Tools: tools, Messages: []modelsim.Message{{Role: "system"}, {Role: "user", Text: "Task"}}})
			if err != nil || len(first.ToolCalls) != 1 || first.ToolCalls[0].Name != c.shell || !strings.Contains(first.ToolCalls[0].Arguments, "/results") {
				t.Fatalf("first reply: %+v %v", first, err)
			}
			turn := func(result string) modelsim.Request {
				return modelsim.Request{API: c.api, Tools: tools, Messages: []modelsim.Message{{Role: "user", Text: "Task"},
					{Role: "assistant", ToolCalls: first.ToolCalls}, {Role: "tool", Text: result}}}
			}
			for _, task := range tasks {
				r, err := s.Match(turn("== /results/x.txt\n" + task.line + "\n"))
				if err != nil || len(r.ToolCalls) != 1 || r.ToolCalls[0].Name != c.write {
					t.Fatalf("after the results: %+v %v", r, err)
				}
				var a map[string]string
				if err := json.Unmarshal([]byte(r.ToolCalls[0].Arguments), &a); err != nil {
					t.Fatal(err)
				}
				var want map[string]any
				json.Unmarshal(task.answers, &want)
				for q := range want {
					if !strings.Contains(a["content"]+strings.ReplaceAll(a["cmd"], "\n+", "\n"), q) {
						t.Errorf("the report lacks %q: %v", q, a)
					}
				}
			}
			if r, err := s.Match(turn(c.written)); err != nil || r.Content != Done || len(r.ToolCalls) != 0 {
				t.Fatalf("after the report: %+v %v", r, err)
			}
			if r, err := s.Match(turn("ls: cannot access '/results': No such file or directory")); err != nil || len(r.ToolCalls) != 0 || r.Content == Done {
				t.Fatalf("without the results: %+v %v", r, err)
			}
		})
	}
}
