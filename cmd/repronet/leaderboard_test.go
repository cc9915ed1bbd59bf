package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/hal"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	"github.com/repronet/repronet/bench/heureka"
	hfamily "github.com/repronet/repronet/bench/heureka/family"
	"github.com/repronet/repronet/bench/paperbench"
	pbfamily "github.com/repronet/repronet/bench/paperbench/family"
	"github.com/repronet/repronet/bench/shellqa"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/halcheck"
)

func testEntries() []leaderboard.Entry {
	sc := corebench.Scoring{Grader: "corebench-original", GraderVersion: "1", StripRule: "original", StripRuleVersion: "1"}
	var out []leaderboard.Entry
	for i, level := range []string{"easy", "hard"} {
		for task := range 3 {
			s := leaderboard.Score{TotalWrittenQuestions: 1, CorrectWrittenAnswers: (task + i) % 2, TaskCorrect: (task+i)%2 == 1}
			out = append(out, leaderboard.Entry{Suite: "corebench", Level: level, Scoring: sc, Agent: "oracle", TaskID: "capsule-000000" + string(rune('1'+task)),
				Run: 1, Status: leaderboard.Validated, Score: &s})
		}
	}
	return out
}

// otherBoards are boards of the other families, served before
// CORE-Bench's: one of each known family, one of a family the command
// does not know.
func otherBoards() []any {
	cost := 0.0123
	return []any{
		shellqa.Board{Family: shellqa.Name, Suite: "qa", Variant: shellqa.Plain, Scoring: json.RawMessage(`{"scorer":"shellqa","version":1}`),
			Rows: []shellqa.Row{{Agent: "solver", StatusCounts: bench.StatusCounts{Units: 4, Validated: 4}, Correct: 3, Accuracy: 0.75}}},
		pbfamily.Board{Family: pbfamily.Name, Suite: "pb", Variant: pbfamily.Full, Grader: paperbench.GraderReportFailed,
			Judge: pbfamily.JudgeSettings{Model: "o3-mini", ReasoningEffort: "high"}, Scoring: json.RawMessage(`{}`),
			Rows: []pbfamily.Row{{Agent: "honest", Score: 0.875, Papers: map[string]float64{"toy": 0.875},
				StatusCounts: bench.StatusCounts{Validated: 1, Units: 1},
				Judge:        pbfamily.JudgeUse{Calls: 14, CostUSD: &cost}}}},
		hfamily.Board{Family: hfamily.Name, Suite: "hb", Kind: hfamily.KindMCQ, Grader: string(heureka.MCQTrimmed), Scoring: json.RawMessage(`{}`),
			Rows: []hfamily.Row{{Agent: "analyst", StatusCounts: bench.StatusCounts{Units: 3, Validated: 3}, MCQ: &hfamily.MCQRow{Questions: 3, Answered: 2, Correct: 2,
				Accuracy: 2.0 / 3, MicroPrecision: 1}}}},
		hfamily.Board{Family: hfamily.Name, Suite: "hb", Kind: hfamily.KindOEQ, Grader: string(heureka.OEQPublished), Scoring: json.RawMessage(`{}`),
			Judge: &heureka.JudgeSettings{Model: "gpt-4o", TopP: 1, MaxTokens: 1000, TopLogprobs: 3},
			Rows: []hfamily.Row{{Agent: "analyst", StatusCounts: bench.StatusCounts{Units: 2, Validated: 2}, OEQ: &hfamily.OEQRow{Questions: 2, Mean: 3.02, Weighted: 1, Plain: 1, Mode: "mixed"},
				Judge: &hfamily.JudgeUse{Calls: 2, CostUSD: &cost}}}},
		map[string]any{"family": "bixbench", "suite": "bx", "rows": []any{}},
	}
}

// fakeCoordinator serves the leaderboard API from entries.
func fakeCoordinator(t *testing.T, entries []leaderboard.Entry) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+leaderboardsPath, func(w http.ResponseWriter, r *http.Request) {
		boards, _ := leaderboard.Build(entries)
		all := otherBoards()
		for _, b := range boards {
			all = append(all, b)
		}
		json.NewEncoder(w).Encode(all)
	})
	mux.HandleFunc("GET "+leaderboardEntriesPath, func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(entries)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

func TestLeaderboardCommand(t *testing.T) {
	srv := fakeCoordinator(t, testEntries())
	var out, errOut bytes.Buffer
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"corebench, easy level, grader corebench-original v1, strip rule original v1", "corebench, hard level", "oracle", "33.3%", "66.7%"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	// Every family's boards as text, each in its family's form.
	for _, want := range []string{"shellqa qa, plain variant, scorer shellqa@1", "solver", "75.0%",
		"paperbench pb, full variant, grader paperbench-report-failed@1", "judge o3-mini (reasoning high)", "87.5%", "$0.0123",
		"heureka hb, mcq questions, heureka-mcq-trimmed@1", "66.7%", "heureka hb, oeq questions, heureka-oeq-published@2", "grader: published code",
		"judge gpt-4o (temperature 0, top_p 1, max 1000 tokens, top 3 log-probabilities)", "mixed (1 weighted, 1 plain, 0 unanswered)",
		"bixbench: 1 boards of a family this command cannot show as text (see --json)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--json", "--level", "hard"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	// Only the boards of that level; other families' have none of it.
	var boards []leaderboard.Board
	if err := json.Unmarshal(out.Bytes(), &boards); err != nil || len(boards) != 1 || boards[0].Level != "hard" || boards[0].Family != "corebench" {
		t.Errorf("--json --level hard: %v %s", err, out.String())
	}
	// A family and a grader: heureka's trimmed MCQ board alone, as JSON.
	out.Reset()
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--json", "--family", "heureka", "--grader", string(heureka.MCQTrimmed)},
		&out, &errOut); err != nil {
		t.Fatal(err)
	}
	var hb []hfamily.Board
	if err := json.Unmarshal(out.Bytes(), &hb); err != nil || len(hb) != 1 || hb[0].Kind != hfamily.KindMCQ || hb[0].Rows[0].MCQ.Correct != 2 {
		t.Errorf("--family heureka --grader trimmed: %v %s", err, out.String())
	}
	out.Reset()
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--family", "paperbench", "--level", "code-dev"}, &out, &errOut); err != nil ||
		strings.TrimSpace(out.String()) != "no leaderboard yet: no graded attempt" {
		t.Errorf("nothing kept: %v %q", err, out.String())
	}
	dir := t.TempDir()
	out.Reset()
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--hal", dir}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "repronet_oracle_corebench_easy_run1_UPLOAD.json"))
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var u hal.Upload
	if err := json.Unmarshal(b, &u); err != nil || len(u.RawEvalResults) != 3 || u.Config.BenchmarkName != "corebench_easy" {
		t.Errorf("upload: %v %+v", err, u)
	}
}

func TestLeaderboardCommandErrors(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	defer srv.Close()
	var out, errOut bytes.Buffer
	err := runLeaderboard(context.Background(), []string{"--api", srv.URL}, &out, &errOut)
	if err == nil || !strings.Contains(err.Error(), "does not serve /api/leaderboards") {
		t.Errorf("old coordinator: %v", err)
	}
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error": "closing"}`))
	}))
	defer failing.Close()
	if err := runLeaderboard(context.Background(), []string{"--api", failing.URL}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "503 Service Unavailable: closing") {
		t.Errorf("API error: %v", err)
	}
	for _, args := range [][]string{{"--api", "ftp://x"}, {"--json", "--hal", "d"}, {"extra"}} {
		if err := runLeaderboard(context.Background(), args, &out, &errOut); err == nil {
			t.Errorf("%q accepted", args)
		}
	}
}

// TestLeaderboardHALTrajectories: with a token, `leaderboard --hal` fills
// raw_logging_results, total_usage, total_cost and the latencies from the
// coordinator's trajectories (gateway.ToHAL's entries, as the coordinator
// serves them); HAL's own upload check accepts the files, and refuses
// them without raw_logging_results (what HAL's leaderboard did to our
// uploads before).
func TestLeaderboardHALTrajectories(t *testing.T) {
	const token = "rns_test-token"
	t0 := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	var runs []coordinator.HALRun
	for i, task := range []string{"capsule-0000001", "capsule-0000002", "capsule-0000003"} {
		var calls []gateway.TrajectoryCall
		for n := range 2 {
			start := t0.Add(time.Duration(10*i+n) * time.Second)
			calls = append(calls, gateway.TrajectoryCall{Call: gateway.Call{ID: fmt.Sprintf("bafy-%d-%d", i, n), Seq: n, Attempt: "ah-x",
				Evaluation: "ev", API: gateway.CallOpenAIChat, Model: "gpt-4.1", Status: 200, Started: start, Ended: start.Add(time.Second),
				TotalMS: 1000, UsageReported: true, Usage: gateway.Usage{Input: 1200, Output: 80}, Cost: 4_000_000_000},
				RequestBody:  []byte(`{"model":"gpt-4.1","messages":[{"role":"user","content":"Task"}]}`),
				ResponseBody: []byte(`{"choices":[{"message":{"role":"assistant","content":"done"}}],"usage":{"prompt_tokens":1200,"completion_tokens":80}}`)})
		}
		h, err := gateway.ToHAL(task, calls)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, coordinator.HALRun{Suite: "corebench", Level: "easy", Agent: "oracle", TaskID: task, Run: 1, HALTrajectory: h})
	}
	mux := http.NewServeMux()
	mux.Handle("GET /api/leaderboard/", fakeCoordinator(t, testEntries()).Config.Handler)
	mux.HandleFunc("GET "+halTrajectoriesPath, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+token {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		if r.URL.Query().Get("level") != "easy" {
			t.Errorf("trajectories asked for %q", r.URL.RawQuery)
		}
		json.NewEncoder(w).Encode(runs)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--hal", dir, "--level", "easy", "--token-file", tokenFile}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	file := filepath.Join(dir, "repronet_oracle_corebench_easy_run1_UPLOAD.json")
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	var u hal.Upload
	if err := json.Unmarshal(b, &u); err != nil {
		t.Fatal(err)
	}
	// 6 calls of 1200 and 80 tokens at $0.004 each.
	if len(u.RawLoggingResults) != 6 || fmt.Sprintf("%.6f", u.TotalCost) != "0.024000" ||
		u.TotalUsage["gpt-4.1"] != (leaderboard.TokenUsage{PromptTokens: 7200, CompletionTokens: 480}) || len(u.Repronet.NoTrajectory) != 0 {
		t.Errorf("upload: %d calls, $%v, usage %+v, no trajectory %v", len(u.RawLoggingResults), u.TotalCost, u.TotalUsage, u.Repronet.NoTrajectory)
	}
	if l := u.Results.Latencies["capsule-0000002"]; l.FirstCallTimestamp != "2026-03-01T10:00:10+00:00" || l.TotalTime != 1 {
		t.Errorf("latency %+v", l)
	}
	if !strings.Contains(out.String(), "6 model calls, $0.0240") {
		t.Errorf("output: %s", out.String())
	}
	// Without a token: the entries' figures, said so.
	out.Reset()
	t.Setenv("REPRONET_TOKEN", "")
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--hal", t.TempDir(), "--level", "easy"}, &out, &errOut); err != nil ||
		!strings.Contains(out.String(), "no token") || !strings.Contains(out.String(), "(3 tasks without trajectory)") {
		t.Errorf("without a token: %v\n%s", err, out.String())
	}

	check, err := halcheck.Find(context.Background(), "../../scripts/hal_upload_check.py", t.TempDir())
	if errors.Is(err, halcheck.ErrUnavailable) {
		t.Skip(err)
	} else if err != nil {
		t.Fatal(err)
	}
	if msg, err := check.Check(context.Background(), file); err != nil || !strings.Contains(msg, "is_valid=True") {
		t.Fatalf("HAL's check refused our upload: %v\n%s", err, msg)
	}
	var raw map[string]any
	json.Unmarshal(b, &raw)
	delete(raw, "raw_logging_results")
	old := filepath.Join(t.TempDir(), "old_UPLOAD.json")
	b, _ = json.Marshal(raw)
	os.WriteFile(old, b, 0o644)
	if msg, err := check.Check(context.Background(), old); err == nil || !strings.Contains(msg, "Missing required keys: raw_logging_results") {
		t.Errorf("HAL's check accepted an upload without raw_logging_results: %v\n%s", err, msg)
	}
}

// TestLeaderboardReliability: `repronet leaderboard` prints each row's
// reliability measures under its board, and the key to them once; --json
// passes them as served.
func TestLeaderboardReliability(t *testing.T) {
	var entries []leaderboard.Entry
	sc := corebench.Scoring{Grader: "corebench-original", GraderVersion: "1", StripRule: "original", StripRuleVersion: "1"}
	// Three runs of two tasks: t1 passes in runs 1 and 3, t2 never.
	for run := 1; run <= 3; run++ {
		for _, task := range []string{"capsule-0000001", "capsule-0000002"} {
			pass := task == "capsule-0000001" && run != 2
			s := leaderboard.Score{TotalWrittenQuestions: 1, TaskCorrect: pass}
			if pass {
				s.CorrectWrittenAnswers = 1
			}
			cost := 0.01 * float64(run)
			entries = append(entries, leaderboard.Entry{Suite: "corebench", Level: "easy", Scoring: sc, Agent: "flaky", TaskID: task, Run: run,
				Status: leaderboard.Validated, Score: &s, CostUSD: &cost, WallSeconds: 60 * float64(run)})
		}
	}
	srv := fakeCoordinator(t, entries)
	var out, errOut bytes.Buffer
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--family", "corebench"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	// t1: n=3 c=2, t2: n=3 c=0. pass@1 = (2/3+0)/2, pass@2 = (1+0)/2,
	// pass^2 = (1/3+0)/2, pass^3 = 0; t2 agrees with itself, t1 does not.
	for _, want := range []string{"flaky:", "reliability (pass = task_correct; 6 runs of 2 tasks, 3-3 per task)",
		"pass@1 33.3%  pass@2 50.0%  pass@3 50.0%", "pass^1 33.3%  pass^2 16.7%  pass^3 0.0%",
		"consistency 50.0% (1 of 2 tasks with 2+ runs agree)", "cost min/median/max $0.0100 / $0.0200 / $0.0300 (6 runs); wall 60s / 120s / 180s (6 runs)",
		"capsule-0000001 +-+ capsule-0000002 ---", "key to the reliability lines:", "pass^k: chance that all k runs of a task pass"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	out.Reset()
	if err := runLeaderboard(context.Background(), []string{"--api", srv.URL, "--json", "--family", "corebench"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	var boards []leaderboard.Board
	if err := json.Unmarshal(out.Bytes(), &boards); err != nil || len(boards) != 1 || boards[0].Rows[0].Reliability == nil ||
		len(boards[0].Rows[0].Reliability.PassHatK) != 3 || !strings.Contains(out.String(), `"pass_at_k"`) {
		t.Fatalf("--json: %v %s", err, out.String())
	}
}
