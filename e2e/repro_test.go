package e2e

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/bench/repro"
	"github.com/repronet/repronet/coordinator"
)

// sampleSpec is the reproducibility check of a sample capsule: one rule
// per question of its task, read from where the question says its answer
// is ("... (`KEY` in results/FILE)": a line "KEY VALUE" of that file).
func sampleSpec(t *testing.T, task corebench.Task, runs int) repro.Spec {
	t.Helper()
	where := regexp.MustCompile("`([A-Za-z0-9_]+)` in (results/[A-Za-z0-9_.]+)\\)")
	spec := repro.Spec{Runs: runs, Capsule: repro.Capsule{Field: task.Field, Language: task.Language, CapsuleTitle: task.CapsuleTitle,
		CapsuleID: task.CapsuleID, CapsuleDOI: task.CapsuleDOI, TaskPrompt: task.TaskPrompt}}
	for _, a := range task.Results[0] {
		m := where.FindStringSubmatch(a.Question)
		if m == nil {
			t.Fatalf("question %q names no file", a.Question)
		}
		r := repro.Rule{Question: a.Question, File: m[2], Kind: repro.KindRegex, Expr: "(?m)^" + m[1] + " (\\S+)$", Type: repro.TypeNumber}
		if a.Value.Kind == corebench.String {
			r.Expr, r.Type = "(?m)^"+m[1]+` "(.*)"$`, repro.TypeString
		}
		spec.Rules = append(spec.Rules, r)
	}
	return spec
}

// reproToken is the admin token of the reproducibility tests'
// coordinators.
const reproToken = "repro-test-admin-token-0123456789"

// reproCluster starts a coordinator with its HTTP API and three nodes on
// loopback, on the real daemon, for reproducibility checks; it returns
// the coordinator, the API's URL and a file holding the admin token.
func reproCluster(ctx context.Context, t *testing.T, name string) (*coordinator.Coordinator, string, string) {
	t.Helper()
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-" + name)
	coord := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, AdminToken: reproToken})
	api := httptest.NewServer(coord.Handler())
	t.Cleanup(api.Close)
	for i := range 3 {
		startNode(ctx, t, d, log, nodeOpts{name: name + "-" + string(rune('1'+i)), coord: coord.Addrs()[0].String(), network: network})
	}
	waitFor(ctx, t, "three nodes in view", func() bool { return len(coord.Nodes()) == 3 })
	tokenPath := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenPath, []byte(reproToken), 0o600); err != nil {
		t.Fatal(err)
	}
	return coord, api.URL, tokenPath
}

// reproSubmit runs `repronet repro submit ... --wait --json` and returns
// the check's status and the command's output.
func reproSubmit(ctx context.Context, t *testing.T, args ...string) (repro.Status, []byte) {
	t.Helper()
	start := time.Now()
	out, err := exec.CommandContext(ctx, binary(t), append([]string{"repro", "submit", "--wait", "--json"}, args...)...).Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("repronet repro submit: %v\n%s\n%s", err, out, stderr)
	}
	var st repro.Status
	if err := json.Unmarshal(out, &st); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Logf("check %s: %s in %.1f s", st.ID, st.State, time.Since(start).Seconds())
	return st, out
}

// TestReproSubmit submits a sample capsule for a reproducibility check
// with `repronet repro submit TARBALL --runs 3 --wait` against a
// coordinator's HTTP API: its own run script runs three times, on three
// distinct nodes, in the sample oracle's busybox image; the answer is a
// CORE-Bench task entry shaped like the sample task (the same questions,
// in order, with the same kinds of answer, one gold run per run), a
// prediction interval for every numeric question, and no question left
// unreproduced (the capsule is deterministic, and its published results
// are what it computes).
func TestReproSubmit(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	coord, api, tokenPath := reproCluster(ctx, t, "repro")

	tasks, err := corebench.ParseTasks(sample.Tasks())
	if err != nil {
		t.Fatal(err)
	}
	task := tasks[1] // capsule-0000002: numbers whose gold runs differ, a string, an integer, a figure
	dir := t.TempDir()
	tb, err := sample.CapsuleTarball(task.CapsuleID)
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(dir, task.CapsuleID+".tar.gz")
	specPath := filepath.Join(dir, "spec.json")
	for p, b := range map[string][]byte{tarball: tb, specPath: mustJSON(t, sampleSpec(t, task, 0))} {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	st, out := reproSubmit(ctx, t, tarball, "--spec", specPath, "--runs", "3", "--api", api, "--token-file", tokenPath)
	if st.State != repro.StateDone || st.Report == nil || st.RunsDone != 3 || st.RunsWanted != 3 {
		t.Fatalf("status %+v", st)
	}
	rep := st.Report
	if rep.Runs != 3 || len(rep.FailedRuns) != 0 || !rep.Reproducible || len(rep.NotReproduced) != 0 {
		t.Fatalf("report: %d runs, failed %v, not reproduced %v\n%s", rep.Runs, rep.FailedRuns, rep.NotReproduced, out)
	}

	// The entry is shaped like the sample task.
	got := rep.Task
	if err := got.Validate(0); err != nil {
		t.Fatal(err)
	}
	if got.CapsuleID != task.CapsuleID || got.TaskPrompt != task.TaskPrompt || len(got.Results) != 3 {
		t.Fatalf("entry %s with %d runs", got.CapsuleID, len(got.Results))
	}
	for i, run := range got.Results {
		if len(run) != len(task.Results[0]) {
			t.Fatalf("run %d: %d answers, want %d", i+1, len(run), len(task.Results[0]))
		}
		for j, a := range run {
			g := task.Results[0][j]
			if a.Question != g.Question || a.Value.Kind != g.Value.Kind || a.Value.Int != g.Value.Int {
				t.Fatalf("run %d answer %d: %q = %s, the sample task has %q = %s", i+1, j, a.Question, a.Value.Repr(), g.Question, g.Value.Repr())
			}
			if g.Value.Kind == corebench.String && !a.Value.Equal(g.Value) {
				t.Fatalf("run %d: %q = %s, published %s", i+1, a.Question, a.Value.Repr(), g.Value.Repr())
			}
		}
	}
	numeric := 0
	for _, q := range rep.Questions {
		if q.Kind == corebench.QuestionNumeric {
			numeric++
			if q.Interval == nil || q.Interval.N != 3 || q.Interval.Lower > q.Interval.Upper || q.Claimed == nil ||
				!(q.Interval.Lower <= q.Claimed.Num && q.Claimed.Num <= q.Interval.Upper) {
				t.Fatalf("question %q: interval %+v, claimed %v", q.Question, q.Interval, q.Claimed)
			}
		}
	}
	if numeric != 4 {
		t.Fatalf("%d numeric questions with intervals, want 4", numeric)
	}

	// The three runs ran on three distinct nodes; none of them is a
	// leaderboard entry.
	nodes := map[string]bool{}
	for _, a := range coord.Attempts() {
		if a.Kind == coordinator.KindCapsuleRun && a.State == coordinator.StateDone {
			nodes[a.ReportedBy] = true
		}
	}
	if len(nodes) != 3 {
		t.Fatalf("the runs ran on %d distinct nodes", len(nodes))
	}
	if e := coord.LeaderboardEntries(); len(e) != 0 {
		t.Fatalf("capsule runs on the leaderboard: %+v", e)
	}
	// The report is kept: asking again gives the same.
	again, err := coord.ReproStatus(ctx, st.ID)
	var againRep repro.Report
	if err != nil || again.Report == nil || json.Unmarshal(again.Report, &againRep) != nil || againRep.Runs != 3 {
		t.Fatalf("status again: %+v %v", again, err)
	}
}

// TestReproDraft checks a fresh capsule with no spec (`repronet repro
// submit TARBALL --runs 3 --wait`): the sample capsule-0000005, whose
// results hold a stable number (rainy days, in a text file and a CSV), a
// Monte Carlo estimate seeded from /dev/urandom and the time of the run.
// Its own run script runs three times on three nodes, each returns its
// results/ folder, and the report drafts the task entry: the stable
// numbers kept as they are, the estimate kept with its prediction
// interval, the timestamp flagged and left out of the entry.
func TestReproDraft(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, api, tokenPath := reproCluster(ctx, t, "draft")

	const id = "capsule-0000005"
	tb, err := sample.CapsuleTarball(id)
	if err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(t.TempDir(), id+".tar.gz")
	if err := os.WriteFile(tarball, tb, 0o600); err != nil {
		t.Fatal(err)
	}
	st, out := reproSubmit(ctx, t, tarball, "--runs", "3", "--api", api, "--token-file", tokenPath)
	if st.State != repro.StateDone || st.Report == nil || st.Report.Draft == nil || st.Report.Runs != 3 {
		t.Fatalf("status %s", out)
	}
	rep := st.Report
	verdicts := map[string]repro.DraftValue{}
	for _, v := range rep.Draft.Values {
		verdicts[v.Question] = v
	}
	const (
		stable    = "Report `rainy_days` on line 1 of results/summary.txt."
		estimate  = "Report `pi_estimate` on line 2 of results/summary.txt."
		timestamp = "Report `finished_at` on line 3 of results/summary.txt."
		cell      = "Report column `rainy_days` of data row 1 of results/rainfall.csv."
	)
	for q, want := range map[string]string{stable: repro.DraftStable, estimate: repro.DraftInterval, timestamp: repro.DraftTimestamp,
		cell: repro.DraftStable} {
		if v, ok := verdicts[q]; !ok || v.Verdict != want {
			t.Fatalf("%q: %+v, want %s; the draft:\n%s", q, v, want, out)
		}
	}
	if v := verdicts[stable]; v.Values[0] != "8" || v.Values[2] != "8" {
		t.Fatalf("rainy days %v", v.Values)
	}
	iv := verdicts[estimate].Interval
	if iv == nil || iv.N != 3 || !(iv.Lower < 3.1416 && 3.1416 < iv.Upper) || iv.Upper-iv.Lower > 0.5 {
		t.Fatalf("the estimate's interval %+v", iv)
	}
	if !slices.Contains(rep.NotReproduced, timestamp) || rep.Reproducible {
		t.Fatalf("flagged %v", rep.NotReproduced)
	}
	// The entry holds the kept values, not the timestamp, and validates;
	// the estimate's gold runs are the runs' own values.
	if err := rep.Task.Validate(0); err != nil || rep.Task.CapsuleID != id || rep.Task.CapsuleTitle == "" || len(rep.Task.Results) != 3 {
		t.Fatalf("entry %+v: %v", rep.Task, err)
	}
	for i, run := range rep.Task.Results {
		var qs []string
		for _, a := range run {
			qs = append(qs, a.Question)
			if a.Question == estimate && a.Value.Lit != verdicts[estimate].Values[i] {
				t.Fatalf("run %d: the estimate %s, the run gave %s", i+1, a.Value.Lit, verdicts[estimate].Values[i])
			}
		}
		if !slices.Contains(qs, stable) || !slices.Contains(qs, estimate) || !slices.Contains(qs, cell) || slices.Contains(qs, timestamp) {
			t.Fatalf("run %d of the entry: %q", i+1, qs)
		}
	}
}
