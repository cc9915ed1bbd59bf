package main

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/dashboard"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/sandbox/ociimage"
)

const cliAdmin = "cli-admin-token-0123456789"

// peopleCoordinator is a real coordinator with the sample suite and an
// admin token, serving its API on loopback.
func peopleCoordinator(t *testing.T) string {
	t.Helper()
	ctx := context.Background()
	c, err := coordinator.New(ctx, coordinator.Config{DataDir: t.TempDir(), Families: families.Registry(), AdminToken: cliAdmin,
		ScheduleInterval: time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	def, err := family.Def("sample", sample.Tasks(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportSuite(ctx, def); err != nil {
		t.Fatal(err)
	}
	for _, id := range sample.CapsuleIDs() {
		tb, _ := sample.CapsuleTarball(id)
		if _, err := c.AddCapsule(ctx, id, bytes.NewReader(tb)); err != nil {
			t.Fatal(err)
		}
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

// cli runs repronet with args and returns its output and error.
func cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out, errb bytes.Buffer
	if code := run(context.Background(), args, &out, &errb); code != 0 {
		return out.String(), &cliError{errb.String()}
	}
	return out.String(), nil
}

type cliError struct{ msg string }

func (e *cliError) Error() string { return e.msg }

// TestPeopleCLI: the operator makes a group and a submitter with repronet
// admin; the submitter pushes an agent and starts an evaluation with its
// token, lists them, and reads its attempts (by handle); what it may not
// do is refused with the API's reason; a revoked token stops working.
func TestPeopleCLI(t *testing.T) {
	api := peopleCoordinator(t)
	dir := t.TempDir()
	adminFile := filepath.Join(dir, "admin.token")
	os.WriteFile(adminFile, []byte(cliAdmin+"\n"), 0o600)
	t.Setenv("REPRONET_API", api)
	t.Setenv("REPRONET_TOKEN", "")
	admin := func(args ...string) string {
		t.Helper()
		out, err := cli(t, append(append([]string{"admin"}, args...), "--token-file", adminFile)...)
		if err != nil {
			t.Fatalf("admin %v: %v", args, err)
		}
		return out
	}
	if out := admin("group", "add", "lab-a", "--max-pending", "5"); !strings.Contains(out, "group lab-a made") {
		t.Fatalf("group add: %s", out)
	}
	out := admin("submitter", "add", "ann", "--group", "lab-a")
	token := regexp.MustCompile(`rns_[0-9a-f]{12}_[A-Za-z0-9_-]{43}`).FindString(out)
	if token == "" || !strings.Contains(out, "shown this once") {
		t.Fatalf("submitter add: %s", out)
	}
	if out := admin("group", "ls"); !strings.Contains(out, "lab-a") || !strings.Contains(out, "5") {
		t.Fatalf("group ls: %s", out)
	}
	if out := admin("token", "ls", "--json"); strings.Contains(out, token) || !strings.Contains(out, `"submitter": "ann"`) {
		t.Fatalf("token ls shows %s", out)
	}

	// The submitter, with its token in the environment.
	t.Setenv("REPRONET_TOKEN", token)
	var img bytes.Buffer
	if _, err := ociimage.Build(&img, "repronet.local/agents/solver:test", []ociimage.File{{Path: "/agent/run", Mode: 0o755,
		Data: []byte("#!/bin/sh\n")}}, ociimage.Config{Entrypoint: []string{"/agent/run"}}); err != nil {
		t.Fatal(err)
	}
	tarball := filepath.Join(dir, "solver.tar")
	os.WriteFile(tarball, img.Bytes(), 0o644)
	if out, err := cli(t, "agent", "push", "solver", tarball, "--deterministic", "--not-replayable", "--model", "m-1"); err != nil ||
		!strings.Contains(out, "agent solver pushed for group lab-a") {
		t.Fatalf("agent push: %s %v", out, err)
	}
	if out, err := cli(t, "agent", "ls"); err != nil || !strings.Contains(out, "solver") || !strings.Contains(out, "m-1") {
		t.Fatalf("agent ls: %s %v", out, err)
	}
	if out, err := cli(t, "agent", "ls", "--json"); err != nil || !strings.Contains(out, `"not_replayable": true`) {
		t.Fatalf("agent ls --json does not show the agent declared not replayable: %s %v", out, err)
	}
	if out, err := cli(t, "eval", "start", "--suite", "sample", "--agent", "solver", "--levels", "easy", "--id", "e1"); err != nil ||
		!strings.Contains(out, "evaluation e1: 3 attempts queued") {
		t.Fatalf("eval start: %s %v", out, err)
	}
	// Over the group's quota of 5: 3 unfinished + 3 asked.
	if _, err := cli(t, "eval", "start", "--suite", "sample", "--agent", "solver", "--levels", "hard"); err == nil ||
		!strings.Contains(err.Error(), "quota") {
		t.Fatalf("an evaluation over the quota: %v", err)
	}
	if out, err := cli(t, "eval", "ls"); err != nil || !strings.Contains(out, "e1") || !strings.Contains(out, "0/3 attempts done") {
		t.Fatalf("eval ls: %s %v", out, err)
	}
	out, err := cli(t, "attempt", "ls", "--eval", "e1")
	handles := regexp.MustCompile(`ah-[0-9a-f]{32}`).FindAllString(out, -1)
	if err != nil || len(handles) != 3 || !strings.Contains(out, "pending") || strings.Contains(out, "at-") {
		t.Fatalf("attempt ls: %s %v", out, err)
	}
	for _, sub := range []string{"logs", "trajectory"} {
		if _, err := cli(t, "attempt", sub, handles[0]); err == nil || !strings.Contains(err.Error(), "not finished") {
			t.Fatalf("attempt %s of a pending attempt: %v", sub, err)
		}
	}
	if out, err := cli(t, "attempt", "outputs", handles[0]); err != nil || out != "" {
		t.Fatalf("outputs of a pending attempt: %q %v", out, err)
	}
	// A pending evaluation is watched until the caller gives up.
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	var watch, werr bytes.Buffer
	if code := run(ctx, []string{"eval", "watch", "e1", "--every", "50ms"}, &watch, &werr); code == 0 ||
		!strings.Contains(watch.String(), "[..............................] 0/3 attempts done") {
		t.Fatalf("eval watch of a pending evaluation: %d %q %q", code, watch.String(), werr.String())
	}
	// Refused: the operator's commands, another group's name.
	if _, err := cli(t, "admin", "group", "ls"); err == nil || !strings.Contains(err.Error(), "admin only") {
		t.Fatalf("admin with a submitter's token: %v", err)
	}
	if _, err := cli(t, "attempt", "logs", "at-0123456789abcdef01234567"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("logs by attempt ID: %v", err)
	}

	// Revoked, the token opens nothing.
	t.Setenv("REPRONET_TOKEN", "")
	var ts []dashboard.Token
	if err := json.Unmarshal([]byte(admin("token", "ls", "--json")), &ts); err != nil || len(ts) != 1 {
		t.Fatalf("token ls: %v %+v", err, ts)
	}
	admin("token", "revoke", ts[0].ID)
	t.Setenv("REPRONET_TOKEN", token)
	if _, err := cli(t, "eval", "ls"); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a revoked token: %v", err)
	}
}

// TestEvalResultsText: the board and per-task results an evaluation
// prints when it is done, in the pages' words: cross-checked and
// replay-verified apart, no accuracy for a row without a validated run,
// its units awaiting cross-check and pending as the API counts them.
func TestEvalResultsText(t *testing.T) {
	v := func(x float64) *float64 { return &x }
	yes := true
	entries := []dashboard.Entry{
		{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: "a", Task: "t1", Run: 1, Status: "validated", Value: v(1), CostUSD: v(0.5), WallSeconds: 2,
			Verification: dashboard.VerifyVerified, Written: &yes},
		{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: "a", Task: "t2", Run: 1, Status: "validated", Value: v(0), CostUSD: v(0.5), WallSeconds: 2,
			Verification: dashboard.VerifyNotDrawn},
		{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: "w", Task: "t1", Run: 1, Status: "unvalidated", Value: v(1)},
		{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: "w", Task: "t2", Run: 1, Status: "unvalidated", Value: v(1)},
		{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: "w", Task: "t3", Run: 1, Status: "pending"},
	}
	d := dashboard.EvaluationDetail{Boards: dashboard.BuildBoards(entries), Tasks: dashboard.TaskResults(entries, "a")}
	var buf bytes.Buffer
	writeEvalResults(&buf, d)
	for _, want := range []string{"s easy (g=1)", "50.0%", "50.0-50.0%", "$1.0000", "t1", "1:1.00", "1:0.00", "CROSS-CHECKED", "REPLAY-VERIFIED"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("%q not in:\n%s", want, buf.String())
		}
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(buf.String(), "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = f
		}
	}
	// AGENT MODEL ACCURACY MIN-MAX WRITTEN VISION RUNS COST TOKENS WALL
	// CROSS-CHECKED REPLAY-VERIFIED AWAITING PENDING.
	if a := rows["a"]; strings.Join(a, " ") != "a - 50.0% 50.0-50.0% 100.0% - 1 $1.0000 0 4.0s 2/2 1/2 0 0" {
		t.Errorf("row a: %q", a)
	}
	if w := rows["w"]; strings.Join(w, " ") != "w - - - - - 0 - - - 0/2 - 2 1" {
		t.Errorf("row w (no validated run): %q", w)
	}
	if got := progressLine(dashboard.Progress{Done: 2, Failed: 1, Total: 4, Units: 2, Decided: 1}, 8); got != "[######..] 2/4 attempts done, 1 failed, 1/2 runs decided" {
		t.Errorf("progress line %q", got)
	}
	if got := progressLine(dashboard.Progress{Done: 2, Total: 2, Units: 2, Decided: 2, Replays: 3, ReplaysPending: 1}, 0); got != "2/2 attempts done, 2/2 runs decided (+3 replays, 1 pending)" {
		t.Errorf("progress line with replays %q", got)
	}
}

// TestNodeStatusCommand: repronet node status reads a node's /status and
// prints its slots, running attempts, cache, refused egress and credit.
func TestNodeStatusCommand(t *testing.T) {
	st := node.Status{Peer: "12D3KooWnode", TotalSlots: 4, FreeSlots: 3, Outbox: 1, Credit: node.Credit{Reports: 7, CPUHours: 1.25, WallSeconds: 9000},
		Running: []node.Running{{Attempt: "at-1", Suite: "sample", Group: "lab-a", Phase: "running", Elapsed: 75, WallSeconds: 2700,
			CPUMillis: 1000, MemoryBytes: 4 << 30, Network: "egress", Allow: []string{"tcp:10.0.0.0/8:443"}}},
		Cache: node.CacheStatus{UsedBytes: 3 << 20, QuotaBytes: 10 << 20, Capsules: 2}, Finished: map[string]int{"ok": 6, "timeout": 1}, EgressRefused: 5}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/status" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(st)
	}))
	defer srv.Close()
	out, err := cli(t, "node", "status", "--metrics", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"slots: 3 free of 4", "1.2500 CPU-hours", "7 accepted report(s)", "at-1", "running", "1m15s", "2700s",
		"egress (1 allowed)", "3.0 MiB used of 10.0 MiB, 2 capsule(s)", "finished since start: ok 6, timeout 1", "egress refused since start: 5"} {
		if !strings.Contains(out, want) {
			t.Errorf("%q not in:\n%s", want, out)
		}
	}
	if _, err := cli(t, "node", "status", "--metrics", "127.0.0.1:1"); err == nil || !strings.Contains(err.Error(), "is it running") {
		t.Fatalf("status of no node: %v", err)
	}
}

// TestEvalWatchWaiting: while no node can run its attempts, `eval watch`
// says why and until when; once they end, why they ended.
func TestEvalWatchWaiting(t *testing.T) {
	reason := "none of the 2 nodes in view can run it: 2 have slots too small for its limits"
	deadline := time.Date(2026, 11, 24, 12, 10, 0, 0, time.UTC)
	polls := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /api/evaluations/{id}", func(w http.ResponseWriter, r *http.Request) {
		polls++
		d := dashboard.EvaluationDetail{Evaluation: dashboard.Evaluation{ID: r.PathValue("id"),
			Progress: dashboard.Progress{Pending: 1, Total: 1, Units: 1}}}
		switch {
		case polls <= 2: // the same twice: printed once
			d.Waiting = []dashboard.Waiting{{Reason: reason, Attempts: 1, Blocked: true, Deadline: deadline}}
		default:
			d.Progress = dashboard.Progress{Failed: 1, Total: 1, Units: 1, Decided: 1}
			d.Attempts = []dashboard.Attempt{{State: "failed", Outcome: "unschedulable", Detail: reason + " (for 10m0s)"}}
			d.Boards = dashboard.BuildBoards([]dashboard.Entry{{Suite: "s", Variant: "easy", Scoring: "g=1", Agent: "a", Task: "t1", Run: 1,
				Status: "infra_failed"}})
		}
		json.NewEncoder(w).Encode(d)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	c, err := newAPIClient(srv.URL, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := watchEval(context.Background(), c, "ev-1", time.Millisecond, &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	wantWait := "  waiting (1 attempts): " + reason + "; they end unschedulable at 12:10:00 UTC unless a node that can run them comes into view\n"
	if strings.Count(got, wantWait) != 1 {
		t.Errorf("want the reason once, with its deadline:\n%s", got)
	}
	if !strings.Contains(got, "1 attempts unschedulable: "+reason+" (for 10m0s)") {
		t.Errorf("no reason for the end:\n%s", got)
	}
	// A row without a validated run has no accuracy, not 0%.
	if !regexp.MustCompile(`(?m)^a\s+-\s+-\s+-\s+-\s+-\s+0\s`).MatchString(got) {
		t.Errorf("the board row of a run no node could run:\n%s", got)
	}
}
