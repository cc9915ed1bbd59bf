package coordinator

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// testHAL checks GET /api/hal/trajectories on the people fixture: each
// group reads the HAL trajectories of its own validated runs only (never
// a canary, an attempt ID, a node or a lease), with its calls, usage,
// cost and first and last call; the cost is the leaderboard's.
func testHAL(t *testing.T, f *people) {
	var nodeIDs []string
	for _, w := range f.nodes {
		nodeIDs = append(nodeIDs, w.id().String())
	}
	var rawIDs []string
	for _, a := range f.c.Attempts() {
		rawIDs = append(rawIDs, a.ID)
	}
	cost := map[string]float64{}
	for _, e := range f.c.LeaderboardEntries() {
		if e.CostUSD != nil {
			cost[fmt.Sprintf("%s/%s/%s/%d", e.Suite, e.Agent, e.TaskID, e.Run)] = *e.CostUSD
		}
	}
	for _, c := range []struct {
		name, token, query string
		agent              string
		runs, calls        int
		never              []string
	}{
		{"lab-a's", f.ann, "?level=easy", "solver-a", 2 * len(f.tasks), 2, append(append([]string{"solver-b", f.canary, `"lease"`, `"node"`}, nodeIDs...), rawIDs...)},
		{"lab-b's", f.bob, "", "solver-b", len(f.tasks), 1, append(append([]string{"solver-a", f.canary, `"lease"`}, nodeIDs...), rawIDs...)},
		{"the admin's, one agent", f.admin, "?agent=solver-b&suite=sample&level=easy", "solver-b", len(f.tasks), 1, []string{"solver-a", f.canary}},
	} {
		code, body := f.request(c.token, "GET", "/api/hal/trajectories"+c.query, nil, "")
		if code != 200 {
			t.Fatalf("%s: %d %s", c.name, code, body)
		}
		for _, s := range c.never {
			if strings.Contains(body, s) {
				t.Errorf("%s: %q in the answer", c.name, s)
			}
		}
		var runs []struct {
			Suite, Level, Agent string
			TaskID              string `json:"task_id"`
			Run                 int
			Eval                string
			Calls               []struct {
				WeaveTaskID string          `json:"weave_task_id"`
				TraceID     string          `json:"trace_id"`
				Inputs      json.RawMessage `json:"inputs"`
				Outputs     struct {
					Choices []string `json:"choices"`
				} `json:"outputs"`
			} `json:"raw_logging_results"`
			Usage map[string]struct {
				Prompt     int64 `json:"prompt_tokens"`
				Completion int64 `json:"completion_tokens"`
			} `json:"total_usage"`
			Cost    float64 `json:"total_cost"`
			Latency *struct {
				First string `json:"first_call_timestamp"`
				Last  string `json:"last_call_timestamp"`
			} `json:"latency"`
		}
		if err := json.Unmarshal([]byte(body), &runs); err != nil {
			t.Fatalf("%s: %v: %s", c.name, err, body)
		}
		if len(runs) != c.runs {
			t.Fatalf("%s: %d runs, want %d: %s", c.name, len(runs), c.runs, body)
		}
		// Each run names its evaluation as the reader's entries do (the
		// public label for a submitter, the ID for the admin), so that
		// the HAL export keeps two evaluations' run 1 apart.
		var entries []struct {
			Suite, Agent, Eval string
			Level              string `json:"level"`
			TaskID             string `json:"task_id"`
			Run                int
		}
		f.get(t, c.token, "/api/leaderboard/entries", &entries)
		evalOf := map[string]string{}
		for _, e := range entries {
			if c.token != f.admin && (!strings.HasPrefix(e.Eval, "ev~") || e.Eval == f.evA || e.Eval == f.evB) {
				t.Errorf("%s: a public entry names its evaluation %q, not by its label", c.name, e.Eval)
			}
			evalOf[fmt.Sprintf("%s/%s/%s/%s/%d", e.Suite, e.Level, e.Agent, e.TaskID, e.Run)] = e.Eval
		}
		for _, r := range runs {
			name := fmt.Sprintf("%s: %s run %d", c.name, r.TaskID, r.Run)
			if want := evalOf[fmt.Sprintf("%s/%s/%s/%s/%d", r.Suite, r.Level, r.Agent, r.TaskID, r.Run)]; r.Eval == "" || r.Eval != want {
				t.Errorf("%s: evaluation %q, its entry's %q", name, r.Eval, want)
			}
			if r.Agent != c.agent || r.Suite != "sample" || r.Level != "easy" || !slices.Contains(f.tasks, r.TaskID) {
				t.Errorf("%s: %+v", name, r)
			}
			if len(r.Calls) != c.calls {
				t.Fatalf("%s: %d calls, want %d", name, len(r.Calls), c.calls)
			}
			for _, cl := range r.Calls {
				if cl.WeaveTaskID != r.TaskID || !strings.Contains(string(cl.Inputs), "what is in results/?") ||
					!slices.Equal(cl.Outputs.Choices, []string{"the figure is 0.96"}) || cl.TraceID == "" {
					t.Errorf("%s: call %+v", name, cl)
				}
			}
			u := r.Usage["sim-1"]
			if u.Prompt != int64(1000*c.calls) || u.Completion != int64(250*c.calls) {
				t.Errorf("%s: usage %+v", name, r.Usage)
			}
			want := float64(c.calls) * callUSD
			if fmt.Sprintf("%.9f", r.Cost) != fmt.Sprintf("%.9f", want) ||
				fmt.Sprintf("%.9f", cost[fmt.Sprintf("sample/%s/%s/%d", r.Agent, r.TaskID, r.Run)]) != fmt.Sprintf("%.9f", want) {
				t.Errorf("%s: cost %v, leaderboard %v, want %v", name, r.Cost, cost[fmt.Sprintf("sample/%s/%s/%d", r.Agent, r.TaskID, r.Run)], want)
			}
			if r.Latency == nil || r.Latency.First == "" || r.Latency.Last < r.Latency.First {
				t.Errorf("%s: latency %+v", name, r.Latency)
			}
		}
	}
	for _, c := range []struct {
		name, token string
		status      int
	}{{"the public", "", 401}, {"a revoked submitter", f.carl, 401}} {
		if code, body := f.request(c.token, "GET", "/api/hal/trajectories", nil, ""); code != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, code, body, c.status)
		}
	}
}
