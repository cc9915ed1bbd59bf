// Package hal owns the export of CORE-Bench results in the shape of HAL's
// <run_id>_UPLOAD.json (princeton-pli/hal-harness, BaseBenchmark.
// process_results with CoreBench.get_metrics), the file HAL's leaderboard
// reads.
//
// It is pure: leaderboard Entries (and the runs' model calls, as the
// coordinator's /api/hal/trajectories gives them) in, Uploads out. It must
// not do I/O, hold gold answers (raw_eval_results carries only
// CORE-Bench's counts) or depend on the coordinator or the gateway.
package hal

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	"github.com/repronet/repronet/internal/pystr"
)

// Upload is one <run_id>_UPLOAD.json: one agent's run of one level.
type Upload struct {
	Config         Config             `json:"config"`
	Results        Results            `json:"results"`
	RawEvalResults map[string]RawEval `json:"raw_eval_results"`
	// RawLoggingResults are the model calls of the validated tasks that
	// have a trajectory (Options.Trajectories), one Weave-style call each,
	// in call order per task (HAL's leaderboard requires the list, each
	// entry with weave_task_id, inputs and outputs).
	RawLoggingResults []json.RawMessage                 `json:"raw_logging_results"`
	TotalUsage        map[string]leaderboard.TokenUsage `json:"total_usage"`
	TotalCost         float64                           `json:"total_cost"`
	// WallClockTimes is HAL's {task_id: seconds}.
	WallClockTimes map[string]float64 `json:"wall_clock_times"`
	// Repronet is not HAL's: what the numbers depend on and what was left
	// out, so that the file cannot be mistaken for a HAL run.
	Repronet Provenance `json:"repronet"`
}

// RawEval is HAL's per-capsule grading: CORE-Bench's four counts.
type RawEval struct {
	CorrectWrittenAnswers int `json:"correct_written_answers"`
	CorrectVisionAnswers  int `json:"correct_vision_answers"`
	TotalWrittenQuestions int `json:"total_written_questions"`
	TotalVisionQuestions  int `json:"total_vision_questions"`
}

// Config is HAL's run configuration.
type Config struct {
	AgentName     string         `json:"agent_name"`
	BenchmarkName string         `json:"benchmark_name"`
	Date          string         `json:"date"`
	RunID         string         `json:"run_id"`
	AgentArgs     map[string]any `json:"agent_args"`
}

// Results are HAL's metrics (CoreBench.get_metrics) plus cost and latency.
type Results struct {
	Accuracy        float64            `json:"accuracy"`
	WrittenAccuracy float64            `json:"written_accuracy"`
	VisionAccuracy  float64            `json:"vision_accuracy"`
	SuccessfulTasks []string           `json:"successful_tasks"`
	FailedTasks     []string           `json:"failed_tasks"`
	TotalCost       float64            `json:"total_cost"`
	Latencies       map[string]Latency `json:"latencies"`
}

// Latency is HAL's per-task timing: the first and last model call of the
// task's trajectory when there is one (HAL's own), else the attempt's
// assignment and finish (RFC 3339 with microseconds, as Python's
// isoformat()).
type Latency struct {
	FirstCallTimestamp string  `json:"first_call_timestamp"`
	LastCallTimestamp  string  `json:"last_call_timestamp"`
	TotalTime          float64 `json:"total_time"`
}

// Provenance says where an upload's numbers come from.
type Provenance struct {
	Suite   string            `json:"suite"`
	Level   string            `json:"level"`
	Scoring corebench.Scoring `json:"scoring"`
	Model   string            `json:"model,omitempty"`
	Run     int               `json:"run"`
	// Eval is the evaluation the run belongs to (as the entries name it).
	Eval string `json:"eval,omitempty"`
	// Only validated attempts are in raw_eval_results; the others are
	// counted here and in no metric.
	Unvalidated   []string `json:"unvalidated"`
	Inconsistent  []string `json:"inconsistent"`
	InfraFailures []string `json:"infra_failures"`
	Pending       []string `json:"pending"`
	// CostComplete is false when some validated attempt had no cost: then
	// total_cost undercounts.
	CostComplete bool `json:"cost_complete"`
	// NoTrajectory lists the validated tasks whose model calls were not
	// given (none recorded, or not read): they are not in
	// raw_logging_results, their usage is not in total_usage, and their
	// latency is the attempt's.
	NoTrajectory []string `json:"no_trajectory"`
	// Reliability is not per run: the reliability measures of every
	// validated run of the agent (and model) at this level and scoring
	// (leaderboard.Row.Reliability), the same in each of its runs'
	// uploads: pass@k, pass^k, consistency, spreads, per-task runs.
	Reliability *bench.Reliability `json:"reliability"`
}

// Trajectory is one validated run's model calls as HAL counts them (the
// JSON of the coordinator's /api/hal/trajectories): the key of its
// leaderboard entry, and HAL's fields. Several trajectories of one key
// (the stages of a pipeline) add up.
type Trajectory struct {
	Suite  string `json:"suite"`
	Level  string `json:"level"`
	Agent  string `json:"agent"`
	TaskID string `json:"task_id"`
	Run    int    `json:"run"`
	// Eval is the run's evaluation, as its entry names it.
	Eval string `json:"eval,omitempty"`
	// RawLoggingResults are HAL's entries of the run's calls.
	RawLoggingResults []json.RawMessage                 `json:"raw_logging_results"`
	TotalUsage        map[string]leaderboard.TokenUsage `json:"total_usage"`
	TotalCost         float64                           `json:"total_cost"`
	// Latency is nil when no call was answered.
	Latency *Latency `json:"latency,omitempty"`
}

// runKey names a run of a task across entries and trajectories.
type runKey struct {
	suite, level, agent, task, eval string
	run                             int
}

// mergeTrajectories indexes ts by run, adding up those of one run: calls
// appended, usage and cost summed, latency from the earliest first call
// to the latest last call.
func mergeTrajectories(ts []Trajectory) map[runKey]Trajectory {
	out := map[runKey]Trajectory{}
	for _, t := range ts {
		k := runKey{t.Suite, t.Level, t.Agent, t.TaskID, t.Eval, t.Run}
		m, ok := out[k]
		if !ok {
			m = Trajectory{Suite: t.Suite, Level: t.Level, Agent: t.Agent, TaskID: t.TaskID, Run: t.Run, Eval: t.Eval,
				TotalUsage: map[string]leaderboard.TokenUsage{}}
		}
		m.RawLoggingResults = append(m.RawLoggingResults, t.RawLoggingResults...)
		addUsage(m.TotalUsage, t.TotalUsage)
		m.TotalCost += t.TotalCost
		if l := t.Latency; l != nil {
			if m.Latency == nil {
				c := *l
				m.Latency = &c
			} else {
				// isoformat() strings of one zone order as their times.
				m.Latency.FirstCallTimestamp = min(m.Latency.FirstCallTimestamp, l.FirstCallTimestamp)
				m.Latency.LastCallTimestamp = max(m.Latency.LastCallTimestamp, l.LastCallTimestamp)
				m.Latency.TotalTime = seconds(m.Latency.FirstCallTimestamp, m.Latency.LastCallTimestamp)
			}
		}
		out[k] = m
	}
	return out
}

// seconds is the time from a to b, two isoformat() strings (0 when one
// does not parse).
func seconds(a, b string) float64 {
	ta, errA := time.Parse(time.RFC3339Nano, a)
	tb, errB := time.Parse(time.RFC3339Nano, b)
	if errA != nil || errB != nil {
		return 0
	}
	return tb.Sub(ta).Seconds()
}

// addUsage adds from into to.
func addUsage(to, from map[string]leaderboard.TokenUsage) {
	for m, use := range from {
		t := to[m]
		t.PromptTokens += use.PromptTokens
		t.CompletionTokens += use.CompletionTokens
		t.CacheCreationInputTokens += use.CacheCreationInputTokens
		t.CacheReadInputTokens += use.CacheReadInputTokens
		to[m] = t
	}
}

// BenchmarkName is HAL's name for a CORE-Bench level: corebench_easy,
// corebench_medium, corebench_hard.
func BenchmarkName(level string) string { return "corebench_" + level }

// Options name the export.
type Options struct {
	// RunIDPrefix starts every run_id; the rest is
	// "<agent>_<benchmark>_run<N>" (HAL uses <benchmark>_<agent>_<unix time>).
	RunIDPrefix string
	// Date is written as YYYY-MM-DD (the zero time writes the latest
	// Finished of the run's entries).
	Date time.Time
	// AgentArgs per agent name, copied into config.agent_args.
	AgentArgs map[string]map[string]any
	// Trajectories are the runs' model calls. A validated task with one
	// takes its calls, usage, cost and latency from it; one without is
	// listed in repronet.no_trajectory and counts its entry's cost and
	// usage.
	Trajectories []Trajectory
}

// Export builds one Upload per (suite, level, scoring, agent, model, run)
// from entries. Metrics are HAL's CoreBench.get_metrics over the validated
// attempts: accuracy = tasks with every question correct and at least one
// question / tasks; written (vision) accuracy = tasks whose written (vision)
// questions are all correct / tasks with written (vision) questions (0
// when none). Uploads are in a stable order. Entries that fail Validate
// are returned as errors.
//
// With trajectories, total_cost is the sum of the counted calls' cost:
// the same as the entries' (the coordinator meters the same calls).
func Export(entries []leaderboard.Entry, opts Options) ([]Upload, []error) {
	type key struct {
		suite, level string
		scoring      corebench.Scoring
		agent, model string
		eval         string
		run          int
	}
	trajectories := mergeTrajectories(opts.Trajectories)
	groups := map[key][]leaderboard.Entry{}
	var keys []key
	var errs []error
	for _, e := range entries {
		if err := e.Validate(); err != nil {
			errs = append(errs, err)
			continue
		}
		k := key{e.Suite, e.Level, e.Scoring, e.Agent, e.Model, e.Eval, e.Run}
		if _, ok := groups[k]; !ok {
			keys = append(keys, k)
		}
		groups[k] = append(groups[k], e)
	}
	slices.SortFunc(keys, func(a, b key) int {
		return cmp.Or(cmp.Compare(a.suite, b.suite), cmp.Compare(a.level, b.level), cmp.Compare(a.scoring.String(), b.scoring.String()),
			cmp.Compare(a.agent, b.agent), cmp.Compare(a.model, b.model), cmp.Compare(a.eval, b.eval), cmp.Compare(a.run, b.run))
	})
	// Each evaluation numbers its runs from 1: an agent evaluated more
	// than once at a level has its evaluation in its run IDs, so that two
	// evaluations' run 1 are two uploads, never one.
	evals := map[[2]string]map[string]bool{}
	for _, k := range keys {
		ak := [2]string{k.agent, k.level}
		if evals[ak] == nil {
			evals[ak] = map[string]bool{}
		}
		evals[ak][k.eval] = true
	}
	// The reliability measures are the board row's: every run of every
	// evaluation of the agent and model at the level and scoring.
	type rowKey struct {
		suite, level string
		scoring      corebench.Scoring
		agent, model string
	}
	outcomes := map[rowKey][]bench.RunOutcome{}
	for _, k := range keys {
		rk := rowKey{k.suite, k.level, k.scoring, k.agent, k.model}
		for _, e := range groups[k] {
			if e.Status == leaderboard.Validated {
				outcomes[rk] = append(outcomes[rk], bench.RunOutcome{Task: e.TaskID, Eval: e.Eval, Run: e.Run, Pass: e.Score.TaskCorrect,
					CostUSD: e.CostUSD, WallSeconds: e.WallSeconds})
			}
		}
	}
	out := make([]Upload, 0, len(keys))
	for _, k := range keys {
		es := groups[k]
		reliability := bench.MeasureReliability(leaderboard.PassRule, outcomes[rowKey{k.suite, k.level, k.scoring, k.agent, k.model}])
		slices.SortFunc(es, func(a, b leaderboard.Entry) int { return cmp.Compare(a.TaskID, b.TaskID) })
		benchName := BenchmarkName(k.level)
		u := Upload{
			Config: Config{AgentName: k.agent, BenchmarkName: benchName,
				RunID:     fmt.Sprintf("%s%s_%s_%srun%d", opts.RunIDPrefix, sanitize(k.agent), benchName, evalPart(k.eval, len(evals[[2]string{k.agent, k.level}])), k.run),
				AgentArgs: map[string]any{}},
			Results:           Results{SuccessfulTasks: []string{}, FailedTasks: []string{}, Latencies: map[string]Latency{}},
			RawEvalResults:    map[string]RawEval{},
			RawLoggingResults: []json.RawMessage{},
			TotalUsage:        map[string]leaderboard.TokenUsage{},
			WallClockTimes:    map[string]float64{},
			Repronet: Provenance{Suite: k.suite, Level: k.level, Scoring: k.scoring, Model: k.model, Run: k.run, Eval: k.eval,
				Unvalidated: []string{}, Inconsistent: []string{}, InfraFailures: []string{}, Pending: []string{}, CostComplete: true,
				NoTrajectory: []string{}, Reliability: reliability},
		}
		for name, v := range opts.AgentArgs[k.agent] {
			u.Config.AgentArgs[name] = v
		}
		var last time.Time
		var correct, wN, wOK, vN, vOK int
		for _, e := range es {
			switch e.Status {
			case leaderboard.Unvalidated:
				u.Repronet.Unvalidated = append(u.Repronet.Unvalidated, e.TaskID)
			case leaderboard.Inconsistent:
				u.Repronet.Inconsistent = append(u.Repronet.Inconsistent, e.TaskID)
			case leaderboard.InfraFailed:
				u.Repronet.InfraFailures = append(u.Repronet.InfraFailures, e.TaskID)
			case leaderboard.Pending:
				u.Repronet.Pending = append(u.Repronet.Pending, e.TaskID)
			}
			if e.Status != leaderboard.Validated {
				continue
			}
			s := *e.Score
			u.RawEvalResults[e.TaskID] = RawEval{CorrectWrittenAnswers: s.CorrectWrittenAnswers, CorrectVisionAnswers: s.CorrectVisionAnswers,
				TotalWrittenQuestions: s.TotalWrittenQuestions, TotalVisionQuestions: s.TotalVisionQuestions}
			total := s.TotalWrittenQuestions + s.TotalVisionQuestions
			if total > 0 && s.CorrectWrittenAnswers+s.CorrectVisionAnswers == total {
				correct++
				u.Results.SuccessfulTasks = append(u.Results.SuccessfulTasks, e.TaskID)
			} else {
				u.Results.FailedTasks = append(u.Results.FailedTasks, e.TaskID)
			}
			if s.TotalWrittenQuestions > 0 {
				wN++
				if s.CorrectWrittenAnswers == s.TotalWrittenQuestions {
					wOK++
				}
			}
			if s.TotalVisionQuestions > 0 {
				vN++
				if s.CorrectVisionAnswers == s.TotalVisionQuestions {
					vOK++
				}
			}
			u.WallClockTimes[e.TaskID] = e.WallSeconds
			if tr, ok := trajectories[runKey{e.Suite, e.Level, e.Agent, e.TaskID, e.Eval, e.Run}]; ok {
				u.RawLoggingResults = append(u.RawLoggingResults, tr.RawLoggingResults...)
				addUsage(u.TotalUsage, tr.TotalUsage)
				u.TotalCost += tr.TotalCost
				if tr.Latency != nil {
					u.Results.Latencies[e.TaskID] = *tr.Latency
				}
			} else {
				u.Repronet.NoTrajectory = append(u.Repronet.NoTrajectory, e.TaskID)
				if e.CostUSD != nil {
					u.TotalCost += *e.CostUSD
				} else {
					u.Repronet.CostComplete = false
				}
				addUsage(u.TotalUsage, e.Usage)
				if !e.Started.IsZero() && !e.Finished.IsZero() {
					u.Results.Latencies[e.TaskID] = Latency{FirstCallTimestamp: pystr.Isoformat(e.Started), LastCallTimestamp: pystr.Isoformat(e.Finished),
						TotalTime: e.Finished.Sub(e.Started).Seconds()}
				}
			}
			if e.Finished.After(last) {
				last = e.Finished
			}
		}
		n := len(u.RawEvalResults)
		u.Results.Accuracy = ratio(correct, n)
		u.Results.WrittenAccuracy = ratio(wOK, wN)
		u.Results.VisionAccuracy = ratio(vOK, vN)
		u.Results.TotalCost = u.TotalCost
		date := opts.Date
		if date.IsZero() {
			date = last
		}
		if !date.IsZero() {
			u.Config.Date = date.UTC().Format("2006-01-02")
		}
		out = append(out, u)
	}
	return out, errs
}

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// sanitize keeps a name usable in a file name.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '.':
			return r
		}
		return '_'
	}, s)
}

// evalPart is the evaluation's part of a run ID ("" when the agent has
// one evaluation at the level).
func evalPart(eval string, evals int) string {
	if evals < 2 || eval == "" {
		return ""
	}
	return sanitize(eval) + "_"
}

// FileName is HAL's name for the upload: <run_id>_UPLOAD.json.
func (u Upload) FileName() string { return u.Config.RunID + "_UPLOAD.json" }
