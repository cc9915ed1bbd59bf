package coordinator

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/core"
)

// Judging replays shares the scoring workers: a job named judgePrefix and
// an attempt judges that attempt's reported replays (verify.go).

// Grading is its own stage: a report is recorded (and acknowledged) first;
// Config.Scorers workers then score recorded attempts with their suite's
// family (a capsule run with its check's checker), outside the lock, for
// as long as a scorer takes (an LLM judge may take seconds), and the core
// learns the score (core.Scored). A scorer's failure is retried later and
// never counted as the agent's.

// scoreQueue holds the scoring jobs the core asked for: an unbounded
// queue, so that asking never blocks a step.
type scoreQueue struct {
	mu     sync.Mutex
	jobs   []string
	queued map[string]bool
	ready  chan struct{}
}

func newScoreQueue() *scoreQueue {
	return &scoreQueue{queued: map[string]bool{}, ready: make(chan struct{}, 1)}
}

// add queues j now, or after its delay.
func (q *scoreQueue) add(j core.ScoreJob) {
	if j.After > 0 {
		time.AfterFunc(j.After, func() { q.add(core.ScoreJob{Attempt: j.Attempt}) })
		return
	}
	q.mu.Lock()
	if !q.queued[j.Attempt] {
		q.queued[j.Attempt] = true
		q.jobs = append(q.jobs, j.Attempt)
	}
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// next returns the next attempt to score, waiting for one.
func (q *scoreQueue) next(ctx context.Context) (string, bool) {
	for {
		q.mu.Lock()
		if len(q.jobs) > 0 {
			id := q.jobs[0]
			q.jobs = q.jobs[1:]
			delete(q.queued, id)
			more := len(q.jobs) > 0
			q.mu.Unlock()
			if more {
				select { // wake another worker
				case q.ready <- struct{}{}:
				default:
				}
			}
			return id, true
		}
		q.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", false
		case <-q.ready:
		}
	}
}

// scoreLoop is one scoring worker.
func (c *Coordinator) scoreLoop(ctx context.Context) {
	for {
		id, ok := c.scoring.next(ctx)
		if !ok {
			return
		}
		var ev core.Event
		if orig, judging := strings.CutPrefix(id, judgePrefix); judging {
			ev, ok = c.judge(ctx, orig)
		} else {
			ev, ok = c.score(ctx, id)
		}
		if ok && ctx.Err() == nil {
			c.step(ctx, ev)
		}
	}
}

// maxScoredOutput bounds an output a scorer reads into memory.
const maxScoredOutput = 64 << 20

// score scores a recorded attempt: with its suite's family, reading its
// outputs from the store, or, for a capsule run, with its check's
// checker. It reports false when there is nothing to score (the attempt is
// gone or scored already).
func (c *Coordinator) score(ctx context.Context, id string) (core.Scored, bool) {
	c.mu.Lock()
	job, ok := c.state.JobOf(id)
	c.mu.Unlock()
	if !ok || job.Attempt.State != core.StateReported {
		return core.Scored{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ScoreTimeout)
	defer cancel()
	ev := core.Scored{Attempt: id}
	var err error
	if job.Attempt.Kind == KindCapsuleRun {
		ev.Score.Comparable, err = c.capsuleRunResult(ctx, job)
	} else {
		ev.Scorer, ev.Score, err = c.scoreAgent(ctx, job)
		if err == nil {
			ev.Unbound, ev.Rewritten, err = c.bindToTrajectory(ctx, job.Attempt)
		}
	}
	if err != nil {
		ev.Err = err.Error()
	}
	return ev, true
}

// scoreAgent scores one stage's job with its suite's family.
func (c *Coordinator) scoreAgent(ctx context.Context, job core.Job) (string, bench.Score, error) {
	a := job.Attempt
	s, ok := c.catalog.LookupSuite(a.Suite)
	if !ok {
		return "", bench.Score{}, fmt.Errorf("suite %q not loaded", a.Suite)
	}
	task, ok := s.Tasks[a.TaskID]
	if !ok {
		return "", bench.Score{}, fmt.Errorf("suite %q has no task %s", a.Suite, a.TaskID)
	}
	byPath := make(map[string]core.Output, len(a.Outputs))
	for _, o := range a.Outputs {
		byPath[o.Path] = o
	}
	read := func(ctx context.Context, path string) ([]byte, error) {
		o, ok := byPath[path]
		if !ok {
			return nil, fmt.Errorf("%s: %w", path, bench.ErrNotReturned)
		}
		return c.readOutput(ctx, o, maxScoredOutput)
	}
	score, err := s.Bench.Score(ctx, bench.ScoreInput{Task: task, Variant: a.Level, Stage: a.Stage, Outcome: a.Outcome, Output: read,
		Models: c.scorerModels(a.ID), Trajectory: c.scorerTrajectory(a)})
	return s.Bench.Scorer(), score, err
}

// scorerTrajectory gives a scorer of attempt a the model calls of the
// counted job of a stage of its unit (nil without a gateway): a's own for
// its stage, else the counted job of that earlier stage
// (core.State.CountedJob).
func (c *Coordinator) scorerTrajectory(a core.Attempt) func(context.Context, string) ([]bench.ModelCall, error) {
	if c.models == nil {
		return nil
	}
	return func(ctx context.Context, stage string) ([]bench.ModelCall, error) {
		id := a.ID
		if stage != a.Stage {
			var err error
			c.mu.Lock()
			id, err = c.state.CountedJob(a.Pipe, stage)
			c.mu.Unlock()
			if err != nil {
				return nil, fmt.Errorf("attempt %s: %w", a.ID, err)
			}
		}
		calls, err := c.Trajectory(ctx, id)
		if err != nil {
			return nil, fmt.Errorf("trajectory of %s: %w", id, err)
		}
		out := make([]bench.ModelCall, len(calls))
		for i, cl := range calls {
			out[i] = bench.ModelCall{Request: cl.RequestBody, Response: cl.ResponseBody}
		}
		return out, nil
	}
}
