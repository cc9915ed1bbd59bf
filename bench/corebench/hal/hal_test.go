package hal

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
)

func TestExport(t *testing.T) {
	scoring := corebench.Scoring{Grader: "corebench-hal", GraderVersion: "1", StripRule: "hal-2026", StripRuleVersion: "1"}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 250_000_000, time.UTC)
	cost := func(x float64) *float64 { return &x }
	e := func(task string, run int, st leaderboard.Status, s *leaderboard.Score) leaderboard.Entry {
		return leaderboard.Entry{Suite: "core-test", Level: "hard", Scoring: scoring, Agent: "core agent", Model: "gpt-4o", TaskID: task, Run: run,
			Status: st, Score: s, CostUSD: cost(0.25), WallSeconds: 90, Started: t0, Finished: t0.Add(90 * time.Second),
			Usage: map[string]leaderboard.TokenUsage{"gpt-4o": {PromptTokens: 1000, CompletionTokens: 10}}}
	}
	entries := []leaderboard.Entry{
		e("capsule-2", 1, leaderboard.Validated, &leaderboard.Score{CorrectWrittenAnswers: 1, TotalWrittenQuestions: 1, CorrectVisionAnswers: 1, TotalVisionQuestions: 2}),
		e("capsule-1", 1, leaderboard.Validated, &leaderboard.Score{CorrectWrittenAnswers: 2, TotalWrittenQuestions: 2, TaskCorrect: true}),
		e("capsule-3", 1, leaderboard.Validated, &leaderboard.Score{TaskCorrect: true}), // no question: HAL fails it
		e("capsule-4", 1, leaderboard.Inconsistent, nil),
		e("capsule-5", 1, leaderboard.InfraFailed, nil),
		func() leaderboard.Entry {
			x := e("capsule-6", 1, leaderboard.Validated, &leaderboard.Score{CorrectVisionAnswers: 1, TotalVisionQuestions: 1, TaskCorrect: true})
			x.CostUSD = nil
			return x
		}(),
		e("capsule-1", 2, leaderboard.Validated, &leaderboard.Score{TotalWrittenQuestions: 2}),
		{Suite: "bad"},
	}
	ups, errs := Export(entries, Options{RunIDPrefix: "repronet_", AgentArgs: map[string]map[string]any{"core agent": {"model_name": "gpt-4o"}}})
	if len(errs) != 1 || len(ups) != 2 {
		t.Fatalf("%d uploads, errors %v", len(ups), errs)
	}
	u := ups[0]
	if u.Config.RunID != "repronet_core_agent_corebench_hard_run1" || u.FileName() != "repronet_core_agent_corebench_hard_run1_UPLOAD.json" ||
		u.Config.BenchmarkName != "corebench_hard" || u.Config.AgentName != "core agent" || u.Config.Date != "2026-03-01" ||
		u.Config.AgentArgs["model_name"] != "gpt-4o" {
		t.Errorf("config %+v", u.Config)
	}
	r := u.Results
	if !slices.Equal(r.SuccessfulTasks, []string{"capsule-1", "capsule-6"}) || !slices.Equal(r.FailedTasks, []string{"capsule-2", "capsule-3"}) {
		t.Errorf("tasks %v %v", r.SuccessfulTasks, r.FailedTasks)
	}
	// written: capsule-1 ok, capsule-2 ok -> 1; vision: capsule-2 no, capsule-6 ok -> 0.5
	if r.Accuracy != 0.5 || r.WrittenAccuracy != 1 || r.VisionAccuracy != 0.5 || r.TotalCost != 0.75 || u.TotalCost != 0.75 {
		t.Errorf("results %+v", r)
	}
	if l := r.Latencies["capsule-1"]; l.FirstCallTimestamp != "2026-03-01T12:00:00.250000+00:00" || l.LastCallTimestamp != "2026-03-01T12:01:30.250000+00:00" || l.TotalTime != 90 {
		t.Errorf("latency %+v", l)
	}
	if got := u.RawEvalResults["capsule-2"]; got != (RawEval{CorrectWrittenAnswers: 1, CorrectVisionAnswers: 1, TotalWrittenQuestions: 1, TotalVisionQuestions: 2}) {
		t.Errorf("raw %+v", got)
	}
	if u.TotalUsage["gpt-4o"].PromptTokens != 4000 || u.WallClockTimes["capsule-3"] != 90 {
		t.Errorf("usage %+v, wall %+v", u.TotalUsage, u.WallClockTimes)
	}
	p := u.Repronet
	if p.Scoring != scoring || !slices.Equal(p.Inconsistent, []string{"capsule-4"}) || !slices.Equal(p.InfraFailures, []string{"capsule-5"}) || p.CostComplete {
		t.Errorf("provenance %+v", p)
	}
	if ups[1].Results.Accuracy != 0 || ups[1].Repronet.Run != 2 || !ups[1].Repronet.CostComplete {
		t.Errorf("run 2: %+v", ups[1])
	}
	// HAL's readers see HAL's keys.
	data, err := json.Marshal(u)
	if err != nil {
		t.Fatal(err)
	}
	var top map[string]json.RawMessage
	json.Unmarshal(data, &top)
	var keys []string
	for k := range top {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	if want := []string{"config", "raw_eval_results", "raw_logging_results", "repronet", "results", "total_cost", "total_usage", "wall_clock_times"}; !reflect.DeepEqual(keys, want) {
		t.Errorf("keys %v", keys)
	}
	var res map[string]json.RawMessage
	json.Unmarshal(top["results"], &res)
	for _, k := range []string{"accuracy", "written_accuracy", "vision_accuracy", "successful_tasks", "failed_tasks", "total_cost", "latencies"} {
		if _, ok := res[k]; !ok {
			t.Errorf("results.%s missing", k)
		}
	}
}

// TestExportMatchesLeaderboard: on tasks that all have questions, HAL's
// accuracy of each run is the leaderboard's per-run accuracy.
func TestExportMatchesLeaderboard(t *testing.T) {
	scoring := corebench.Scoring{Grader: "corebench-original", GraderVersion: "1", StripRule: "original", StripRuleVersion: "1"}
	var entries []leaderboard.Entry
	for run := 1; run <= 3; run++ {
		for task := range 7 {
			ok := (task+run)%3 == 0
			s := leaderboard.Score{TotalWrittenQuestions: 2, CorrectWrittenAnswers: 1, TotalVisionQuestions: 1, TaskCorrect: ok}
			if ok {
				s.CorrectWrittenAnswers, s.CorrectVisionAnswers = 2, 1
			}
			entries = append(entries, leaderboard.Entry{Suite: "s", Level: "easy", Scoring: scoring, Agent: "a", TaskID: string(rune('A' + task)),
				Run: run, Status: leaderboard.Validated, Score: &s})
		}
	}
	boards, _ := leaderboard.Build(entries)
	ups, _ := Export(entries, Options{})
	row := boards[0].Rows[0]
	var accs []float64
	for _, u := range ups {
		accs = append(accs, u.Results.Accuracy)
	}
	if slices.Min(accs) != row.AccuracyMin || slices.Max(accs) != row.AccuracyMax || (accs[0]+accs[1]+accs[2])/3 != row.Accuracy {
		t.Errorf("HAL per-run %v, leaderboard %v [%v, %v]", accs, row.Accuracy, row.AccuracyMin, row.AccuracyMax)
	} // Each run's upload carries the row's reliability measures, over all
	// three runs.
	for _, u := range ups {
		if !reflect.DeepEqual(u.Repronet.Reliability, row.Reliability) || u.Repronet.Reliability.Runs != 21 {
			t.Errorf("run %d: reliability %+v, want the board row's %+v", u.Repronet.Run, u.Repronet.Reliability, row.Reliability)
		}
	}
}

// TestExportTrajectories: a validated task with a trajectory takes its
// calls, usage, cost and first and last call from it (the stages of one
// run adding up); one without keeps its entry's and is listed; runs of
// other tasks, agents or runs are not mixed in.
func TestExportTrajectories(t *testing.T) {
	scoring := corebench.Scoring{Grader: "corebench-hal", GraderVersion: "1", StripRule: "hal-2026", StripRuleVersion: "1"}
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	cost := 0.5
	e := func(task string) leaderboard.Entry {
		return leaderboard.Entry{Suite: "s", Level: "easy", Scoring: scoring, Agent: "a", TaskID: task, Run: 1, Status: leaderboard.Validated,
			Score: &leaderboard.Score{CorrectWrittenAnswers: 1, TotalWrittenQuestions: 1, TaskCorrect: true}, CostUSD: &cost,
			Usage: map[string]leaderboard.TokenUsage{"m": {PromptTokens: 7}}, Started: t0, Finished: t0.Add(time.Minute)}
	}
	call := func(task string, n int) json.RawMessage {
		return json.RawMessage(fmt.Sprintf(`{"weave_task_id":%q,"inputs":{"n":%d},"outputs":{"choices":["x"]}}`, task, n))
	}
	tr := func(task, agent string, run int, calls []json.RawMessage, usd float64, first, last string) Trajectory {
		return Trajectory{Suite: "s", Level: "easy", Agent: agent, TaskID: task, Run: run, RawLoggingResults: calls,
			TotalUsage: map[string]leaderboard.TokenUsage{"m": {PromptTokens: 100, CompletionTokens: 10, CacheReadInputTokens: 1}}, TotalCost: usd,
			Latency: &Latency{FirstCallTimestamp: first, LastCallTimestamp: last}}
	}
	ups, errs := Export([]leaderboard.Entry{e("capsule-1"), e("capsule-2")}, Options{Trajectories: []Trajectory{
		tr("capsule-1", "a", 1, []json.RawMessage{call("capsule-1", 1), call("capsule-1", 2)}, 0.25,
			"2026-03-01T12:00:05.000000+00:00", "2026-03-01T12:00:10.000000+00:00"),
		// A second stage of the same run.
		tr("capsule-1", "a", 1, []json.RawMessage{call("capsule-1", 3)}, 0.125,
			"2026-03-01T12:00:20.000000+00:00", "2026-03-01T12:00:30.500000+00:00"),
		tr("capsule-2", "b", 1, []json.RawMessage{call("capsule-2", 9)}, 9, "", ""),
		tr("capsule-2", "a", 2, []json.RawMessage{call("capsule-2", 9)}, 9, "", ""),
	}})
	if len(errs) != 0 || len(ups) != 1 {
		t.Fatalf("%d uploads, errors %v", len(ups), errs)
	}
	u := ups[0]
	var ns []int
	for _, c := range u.RawLoggingResults {
		var x struct {
			Task   string `json:"weave_task_id"`
			Inputs struct{ N int }
		}
		if err := json.Unmarshal(c, &x); err != nil || x.Task != "capsule-1" {
			t.Fatalf("call %s: %v", c, err)
		}
		ns = append(ns, x.Inputs.N)
	}
	if !slices.Equal(ns, []int{1, 2, 3}) {
		t.Errorf("calls %v", ns)
	}
	// capsule-1: 0.375 from its calls; capsule-2: its entry's 0.5.
	if u.TotalCost != 0.875 || u.Results.TotalCost != 0.875 || !u.Repronet.CostComplete {
		t.Errorf("cost %v %v", u.TotalCost, u.Results.TotalCost)
	}
	if got := u.TotalUsage["m"]; got != (leaderboard.TokenUsage{PromptTokens: 207, CompletionTokens: 20, CacheReadInputTokens: 2}) {
		t.Errorf("usage %+v", got)
	}
	if l := u.Results.Latencies["capsule-1"]; l.FirstCallTimestamp != "2026-03-01T12:00:05.000000+00:00" ||
		l.LastCallTimestamp != "2026-03-01T12:00:30.500000+00:00" || l.TotalTime != 25.5 {
		t.Errorf("latency of capsule-1 %+v", l)
	}
	if l := u.Results.Latencies["capsule-2"]; l.FirstCallTimestamp != "2026-03-01T12:00:00+00:00" || l.TotalTime != 60 {
		t.Errorf("latency of capsule-2 %+v", l)
	}
	if !slices.Equal(u.Repronet.NoTrajectory, []string{"capsule-2"}) {
		t.Errorf("no trajectory %v", u.Repronet.NoTrajectory)
	}
	// Without trajectories the list is there, empty.
	ups, _ = Export([]leaderboard.Entry{e("capsule-1")}, Options{})
	if b, _ := json.Marshal(ups[0]); !strings.Contains(string(b), `"raw_logging_results":[]`) {
		t.Errorf("%s", b)
	}
}

// TestExportTwoEvaluations: two evaluations of one agent both have a run
// 1; they are two uploads (their run IDs name the evaluation), each with
// its own tasks, metrics and trajectories, never one run merging both.
func TestExportTwoEvaluations(t *testing.T) {
	scoring := corebench.Scoring{Grader: "corebench-hal", GraderVersion: "1", StripRule: "hal-2026", StripRuleVersion: "1"}
	e := func(eval, task string, right bool) leaderboard.Entry {
		s := &leaderboard.Score{TotalWrittenQuestions: 1}
		if right {
			s.CorrectWrittenAnswers, s.TaskCorrect = 1, true
		}
		return leaderboard.Entry{Suite: "s", Level: "easy", Scoring: scoring, Agent: "a", TaskID: task, Run: 1, Status: leaderboard.Validated,
			Score: s, Eval: eval}
	}
	tr := func(eval, task string, usd float64) Trajectory {
		return Trajectory{Suite: "s", Level: "easy", Agent: "a", TaskID: task, Run: 1, Eval: eval, TotalCost: usd,
			RawLoggingResults: []json.RawMessage{json.RawMessage(`{}`)}}
	}
	ups, errs := Export([]leaderboard.Entry{e("ev-1", "capsule-1", true), e("ev-1", "capsule-2", true), e("ev-2", "capsule-1", false)},
		Options{RunIDPrefix: "p_", Trajectories: []Trajectory{tr("ev-1", "capsule-1", 1), tr("ev-1", "capsule-2", 2), tr("ev-2", "capsule-1", 4)}})
	if len(errs) != 0 || len(ups) != 2 {
		t.Fatalf("%d uploads, errors %v", len(ups), errs)
	}
	type got struct {
		id       string
		tasks    int
		accuracy float64
		cost     float64
		eval     string
	}
	var gs []got
	for _, u := range ups {
		gs = append(gs, got{u.Config.RunID, len(u.RawEvalResults), u.Results.Accuracy, u.TotalCost, u.Repronet.Eval})
	}
	want := []got{{"p_a_corebench_easy_ev-1_run1", 2, 1, 3, "ev-1"}, {"p_a_corebench_easy_ev-2_run1", 1, 0, 4, "ev-2"}}
	if !reflect.DeepEqual(gs, want) {
		t.Fatalf("uploads %+v, want %+v", gs, want)
	}
	// One evaluation: run IDs as before.
	if ups, _ = Export([]leaderboard.Entry{e("ev-1", "capsule-1", true)}, Options{RunIDPrefix: "p_"}); ups[0].Config.RunID != "p_a_corebench_easy_run1" {
		t.Fatalf("one evaluation's run ID %q", ups[0].Config.RunID)
	}
}
