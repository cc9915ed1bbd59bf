package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/halcheck"
	"github.com/repronet/repronet/internal/modelsim"
)

// demoRow is a row of `repronet demo --json`'s leaderboard.
type demoRow struct {
	Level          string   `json:"level"`
	Agent          string   `json:"agent"`
	Model          string   `json:"model"`
	Tasks          int      `json:"tasks"`
	Accuracy       float64  `json:"accuracy"`
	ValidatedShare float64  `json:"validated_share"`
	InfraFailures  int      `json:"infra_failures"`
	CostUSD        *float64 `json:"cost_usd"`
}

// runDemo runs `repronet demo --json --dir DIR --nodes 2 args...` and
// returns its rows, HAL files and everything it printed.
func runDemo(ctx context.Context, t *testing.T, dir string, args ...string) (rows []demoRow, halFiles []string, reference, printed string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, binary(t), append([]string{"demo", "--json", "--dir", dir, "--nodes", "2"}, args...)...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("repronet demo: %v\nstderr:\n%s", err, stderr.String())
	}
	var res struct {
		Leaderboard []demoRow `json:"leaderboard"`
		Failed      int       `json:"failed"`
		Reference   string    `json:"reference"`
		HALFiles    []string  `json:"hal_files"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &res); err != nil {
		t.Fatalf("demo --json printed no JSON: %v\n%s", err, stdout.String())
	}
	if res.Failed != 0 {
		t.Fatalf("demo: %d failed:\n%s", res.Failed, stdout.String())
	}
	return res.Leaderboard, res.HALFiles, res.Reference, stdout.String() + stderr.String()
}

// checkDemoRows checks the sample agents' rows and the reference agent's
// (declaring model, all right, each run two calls at price).
func checkDemoRows(t *testing.T, rows []demoRow, model string, callUSD float64) {
	t.Helper()
	if len(rows) != 9 {
		t.Fatalf("%d leaderboard rows, want 9 (three agents at three levels): %+v", len(rows), rows)
	}
	seen := map[string]bool{}
	for _, r := range rows {
		want := map[string]float64{"oracle": 1, "wrong": 0, demo.ReferenceAgent: 1}[r.Agent]
		if r.Tasks != 3 || r.Accuracy != want || r.ValidatedShare != 1 || r.InfraFailures != 0 {
			t.Errorf("%s %s: %+v, want accuracy %.0f over 3 validated tasks", r.Level, r.Agent, r, want)
		}
		if r.Agent == demo.ReferenceAgent {
			// A run is three tasks of two calls each.
			if r.Model != model || r.CostUSD == nil || fmt.Sprintf("%.7f", *r.CostUSD) != fmt.Sprintf("%.7f", 6*callUSD) {
				t.Errorf("%s reference: model %q, cost %v; want %q, %.7f", r.Level, r.Model, r.CostUSD, model, 6*callUSD)
			}
		}
		seen[r.Level+"/"+r.Agent] = true
	}
	if len(seen) != 9 {
		t.Fatalf("leaderboard rows do not cover three agents at three levels: %v", seen)
	}
}

// checkHALFiles runs HAL's own upload check on files, which must hold the
// reference agent's calls.
func checkHALFiles(ctx context.Context, t *testing.T, files []string) {
	t.Helper()
	calls := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var u struct {
			Config struct {
				AgentName string `json:"agent_name"`
			} `json:"config"`
			Raw []json.RawMessage `json:"raw_logging_results"`
		}
		if err := json.Unmarshal(b, &u); err != nil {
			t.Fatal(err)
		}
		if u.Config.AgentName == demo.ReferenceAgent {
			calls += len(u.Raw)
		}
	}
	// Three levels of a run of three tasks, two calls each.
	if len(files) != 9 || calls != 18 {
		t.Fatalf("%d HAL files, %d reference calls in them (want 9 and 18): %v", len(files), calls, files)
	}
	check, err := halcheck.Find(ctx, "../scripts/hal_upload_check.py", t.TempDir())
	if errors.Is(err, halcheck.ErrUnavailable) {
		t.Logf("HAL's own check not run: %v", err)
		return
	} else if err != nil {
		t.Fatal(err)
	}
	if msg, err := check.Check(ctx, files...); err != nil || strings.Count(msg, "is_valid=True") != len(files) {
		t.Fatalf("HAL's check: %v\n%s", err, msg)
	}
}

// TestDemoCommand runs `repronet demo --json --hal DIR` as a user would
// (the README's main job): a private containerd, a coordinator and node
// processes, both sample agents on every level, and the reference agent
// through the gateway against the built-in scripted model server. The
// oracle and the reference agent must score 100% and the wrong agent 0%
// on every level, every unit validated, nothing lost; the reference rows
// say the model is scripted and cost the scripted usage at its price; the
// HAL files carry the reference agent's calls and pass HAL's check.
func TestDemoCommand(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "demo")
	halDir := filepath.Join(t.TempDir(), "hal")
	rows, files, ref, _ := runDemo(ctx, t, dir, "--hal", halDir)
	callUSD := (float64(demo.ScriptedUsage.Prompt)*demo.ScriptedPrice.Input + float64(demo.ScriptedUsage.Completion)*demo.ScriptedPrice.Output) / 1e6
	checkDemoRows(t, rows, demo.ScriptedLabel, callUSD)
	if !strings.Contains(ref, "scripted model server") || !strings.Contains(ref, "not a real model") {
		t.Errorf("reference: %q", ref)
	}
	checkHALFiles(ctx, t, files)
}

// TestDemoModelURL runs the demo's reference agent against a provider
// given by --model-url and --model-key-file: the scripted server on
// loopback stands in for it (tests never reach a real provider), and
// answers only with the key of the file. The key is in no file of the
// demo's folder (nodes, coordinator, logs) and nowhere in its output.
func TestDemoModelURL(t *testing.T) {
	const key = "sk-e2e-demo-provider-key-93b1c0"
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	script, err := demo.SampleScript()
	if err != nil {
		t.Fatal(err)
	}
	sim, err := modelsim.Start(script, modelsim.Options{APIKey: key})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "demo")
	rows, _, ref, printed := runDemo(ctx, t, dir, "--model-url", sim.URL()+"/v1", "--model-key-file", keyFile,
		"--model", "provider-model-1", "--model-price", "3/12")
	checkDemoRows(t, rows, "provider-model-1", (float64(demo.ScriptedUsage.Prompt)*3+float64(demo.ScriptedUsage.Completion)*12)/1e6)
	if !strings.Contains(ref, "provider-model-1 at "+sim.URL()) {
		t.Errorf("reference: %q", ref)
	}
	if strings.Contains(printed, key) {
		t.Error("the provider's key is in the demo's output")
	}
	err = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		if err == nil && bytes.Contains(b, []byte(key)) {
			return fmt.Errorf("%s holds the provider's key", p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
