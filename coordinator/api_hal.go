package coordinator

import (
	"cmp"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"

	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/gateway"
)

// HALRun is one validated run's model calls in the shape of HAL's upload
// (gateway.ToHAL): the calls of the assignment whose report counted, so
// that its cost is the leaderboard's. The key fields are those of the
// run's leaderboard entry (bench.Entry).
type HALRun struct {
	Suite  string `json:"suite"`
	Level  string `json:"level"`
	Agent  string `json:"agent"`
	TaskID string `json:"task_id"`
	Run    int    `json:"run"`
	// Eval is the run's evaluation, as its entry names it for the reader
	// (the public label for a submitter, as /api/leaderboard/entries).
	Eval string `json:"eval,omitempty"`
	gateway.HALTrajectory
}

// halSource is a validated run to read: its counted attempt and the lease
// of the assignment whose report counted.
type halSource struct {
	run            HALRun
	attempt, lease string
}

// HALRuns returns the HAL trajectories of the validated runs p may read
// (a submitter: its group's; the admin: all), canaries and capsule runs
// left out, optionally only those of suite, level and agent (""
// matches any), sorted like the leaderboard's entries. A run whose unit is
// a pipeline gives one HALRun per validated stage. Calls name their
// attempt (trace_id) by its ID for the admin, by its handle for a
// submitter, as the rest of the API does.
func (c *Coordinator) HALRuns(ctx context.Context, p accounts.Principal, suite, level, agent string) ([]HALRun, error) {
	var srcs []halSource
	c.mu.Lock()
	for _, w := range c.state.Book.Attempts {
		if w.Work.Canary() || w.Work.Kind != crosscheck.AgentAttempt || w.Decision.State != crosscheck.Validated ||
			w.Decision.Canonical < 0 || w.Decision.Canonical >= len(w.Replicas) {
			continue
		}
		rep := w.Replicas[w.Decision.Canonical]
		a := c.state.Attempts[rep.Job]
		if a == nil || a.Canary || !p.MayRead(a.Group) || (suite != "" && a.Suite != suite) ||
			(level != "" && a.Level != level) || (agent != "" && a.Agent != agent) {
			continue
		}
		eval := a.Eval
		if p.Scope != accounts.ScopeAdmin {
			eval = c.evalLabel(eval)
		}
		srcs = append(srcs, halSource{run: HALRun{Suite: a.Suite, Level: a.Level, Agent: a.Agent, TaskID: a.TaskID, Run: max(a.Run, 1), Eval: eval},
			attempt: a.ID, lease: c.state.LeaseOf(a.ID, rep.Node)})
	}
	c.mu.Unlock()
	slices.SortFunc(srcs, func(a, b halSource) int {
		return cmp.Or(cmp.Compare(a.run.Suite, b.run.Suite), cmp.Compare(a.run.Level, b.run.Level), cmp.Compare(a.run.Agent, b.run.Agent),
			cmp.Compare(a.run.TaskID, b.run.TaskID), cmp.Compare(a.run.Run, b.run.Run), cmp.Compare(a.run.Eval, b.run.Eval), cmp.Compare(a.attempt, b.attempt))
	})
	out := make([]HALRun, 0, len(srcs))
	for _, s := range srcs {
		calls, err := c.Trajectory(ctx, s.attempt)
		if err != nil {
			return nil, fmt.Errorf("trajectory of %s: %w", runKey(s.run.Suite, s.run.Agent, s.run.TaskID, s.run.Run), err)
		}
		counted := slices.DeleteFunc(calls, func(cl gateway.TrajectoryCall) bool { return cl.Lease != s.lease })
		if p.Scope != accounts.ScopeAdmin { // a submitter knows its attempts by handle only
			for i := range counted {
				counted[i].Attempt = c.web.handle(s.attempt)
			}
		}
		s.run.HALTrajectory, err = gateway.ToHAL(s.run.TaskID, counted)
		if err != nil {
			return nil, fmt.Errorf("trajectory of %s: %w", runKey(s.run.Suite, s.run.Agent, s.run.TaskID, s.run.Run), err)
		}
		out = append(out, s.run)
	}
	return out, nil
}

// handleHALRuns serves GET /api/hal/trajectories[?suite=S][&level=L][&agent=A].
func (c *Coordinator) handleHALRuns(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	q := r.URL.Query()
	runs, err := c.HALRuns(r.Context(), p, q.Get("suite"), q.Get("level"), q.Get("agent"))
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, runs)
}

// runKey names a run in logs.
func runKey(suite, agent, task string, run int) string {
	return suite + "/" + agent + "/" + task + " run " + strconv.Itoa(run)
}
