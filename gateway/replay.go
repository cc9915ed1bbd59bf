package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/repronet/repronet/verify"
)

// serveReplay answers a call of a replay attempt (its grant names the
// recorded attempt) with the answer of the recorded call it replays: the
// same agent, given the same answers, runs the same tool calls on
// another node, and the coordinator compares the tool results its
// requests carry with the recorded ones (package verify). Calls are
// paired by conversation, not by arrival order (verify.Matcher): a call
// that continues one of the replay's conversations gets the recorded
// call that continued the recorded one at that place, a call that starts
// a conversation the first recorded start left with the same content, so
// an agent's concurrent conversations (sub-agents, side calls) may
// interleave otherwise than they did. Nothing is forwarded or charged.
// The replayed call is recorded in the replay attempt's own trajectory
// (and chain), naming the recorded call and whether the request was the
// recorded one byte for byte; a call no recorded call is left to answer
// is refused with 409.
//
// It is generic over the APIs: what it reads of a call is the adapter's
// call name, the parsed request's model and stream flag and the body,
// which package verify reads as messages (a body of an API verify cannot
// read is paired by its whole content).
func (g *Gateway) serveReplay(w http.ResponseWriter, r *http.Request, a adapter, grant Grant, req callRequest, body []byte, start time.Time) {
	ctx := r.Context()
	c := Call{Attempt: grant.Attempt, Lease: grant.Lease, Node: grant.Node.String(), Evaluation: grant.Evaluation,
		Group: grant.Group, Task: grant.Task, API: a.call, Model: req.Model, Provider: "replay", Stream: req.Stream,
		Started: start.UTC()}
	c.Request = g.put(ctx, body)
	st, err := g.replays.open(ctx, g.rec, grant)
	if err != nil {
		g.log.Error("reading a replay's trajectories failed", "replay", grant.Attempt, "of", grant.Replay, "err", err)
		writeAPIError(w, a.api, http.StatusServiceUnavailable, errAPI, "the gateway cannot read the recorded trajectory now; retry")
		return
	}
	defer g.replays.close(st)
	st.mu.Lock()
	m, err := st.matcher.Match(verify.Exchange{API: a.call, Model: req.Model, Request: body})
	st.mu.Unlock()
	if err != nil {
		var nm *verify.NoMatchError
		if !errors.As(err, &nm) {
			nm = &verify.NoMatchError{Reason: err.Error()}
		}
		c.Status, c.Refused = http.StatusConflict, RefusedReplayUnmatched
		if nm.Exhausted {
			c.Refused = RefusedReplayExhausted
		}
		c.Error = fmt.Sprintf("replay of %s: %s", grant.Replay, nm.Reason)
		w.Header().Set(ChainHeader, g.finish(ctx, c))
		writeAPIError(w, a.api, http.StatusConflict, errInvalidRequest, c.Error)
		return
	}
	rc := st.recorded[m.Recorded]
	c.ReplayOf = fmt.Sprintf("%s/%d", grant.Replay, rc.Seq)
	c.ReplayMatch = rc.Request == c.Request
	c.Usage, c.UsageReported = rc.Usage, rc.UsageReported
	c.Response, c.StreamBytes = rc.Response, rc.StreamBytes
	answer, err := g.rec.Get(ctx, rc.Response)
	stream := req.Stream && rc.StreamBytes != ""
	if err == nil && stream {
		answer, err = g.rec.Get(ctx, rc.StreamBytes)
	}
	if err != nil {
		st.mu.Lock()
		st.matcher.Release(m)
		st.mu.Unlock()
		g.log.Error("reading a recorded answer failed", "replay", grant.Attempt, "call", c.ReplayOf, "err", err)
		writeAPIError(w, a.api, http.StatusServiceUnavailable, errAPI, "the gateway cannot read the recorded answer now; retry")
		return
	}
	c.Status = http.StatusOK
	head := g.finish(context.WithoutCancel(ctx), c)
	// The conversation ends with this answer before the agent has it.
	st.mu.Lock()
	st.matcher.Commit(m)
	st.mu.Unlock()
	w.Header().Set(ChainHeader, head)
	if stream {
		w.Header().Set("Content-Type", "text/event-stream")
	} else {
		w.Header().Set("Content-Type", "application/json")
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(answer)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(answer)
}

// maxKeptReplays bounds the replays whose pairing is kept in memory; an
// idle one past it is dropped and read back from its records when it
// calls again.
const maxKeptReplays = 256

// replayBook keeps, per replay being served, the recorded calls and the
// pairing of the replay's calls with them so far.
type replayBook struct {
	mu     sync.Mutex
	states map[string]*replayState // replay attempt -> its state
}

type replayState struct {
	users int // calls being served (under replayBook.mu)

	mu sync.Mutex
	// recorded are the recorded attempt's calls, indexed as the matcher's
	// exchanges; matcher is nil until they are read.
	recorded []Call
	matcher  *verify.Matcher
}

// open returns grant's replay state (read from the records the first
// time), held until close.
func (b *replayBook) open(ctx context.Context, rec Recorder, grant Grant) (*replayState, error) {
	b.mu.Lock()
	st, ok := b.states[grant.Attempt]
	if !ok {
		if len(b.states) >= maxKeptReplays {
			for k, s := range b.states {
				if s.users == 0 {
					delete(b.states, k)
				}
			}
		}
		st = &replayState{}
		b.states[grant.Attempt] = st
	}
	st.users++
	b.mu.Unlock()
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.matcher == nil {
		if err := st.load(ctx, rec, grant); err != nil {
			b.close(st)
			return nil, err
		}
	}
	return st, nil
}

func (b *replayBook) close(st *replayState) {
	b.mu.Lock()
	st.users--
	b.mu.Unlock()
}

// load reads the recorded trajectory and pairs the replay's calls made so
// far (a restarted gateway) as they were paired (their ReplayOf).
func (st *replayState) load(ctx context.Context, rec Recorder, grant Grant) error {
	ctx = context.WithoutCancel(ctx)
	recorded, err := LoadTrajectory(ctx, rec, grant.Replay)
	if err != nil {
		return err
	}
	done, err := LoadTrajectory(ctx, rec, grant.Attempt)
	if err != nil {
		return err
	}
	m := verify.NewMatcher(Exchanges(recorded), verify.DefaultTolerance())
	prefix := grant.Replay + "/"
	for _, d := range done {
		if d.ReplayOf == "" || d.Status != http.StatusOK {
			continue
		}
		seq, err := strconv.Atoi(strings.TrimPrefix(d.ReplayOf, prefix))
		if !strings.HasPrefix(d.ReplayOf, prefix) || err != nil {
			return fmt.Errorf("replay %s: call %d replays %q, not a call of %s", grant.Attempt, d.Seq, d.ReplayOf, grant.Replay)
		}
		if err := m.Resume(verify.Exchange{API: d.API, Model: d.Model, Request: d.RequestBody}, seq); err != nil {
			return fmt.Errorf("replay %s: call %d: %w", grant.Attempt, d.Seq, err)
		}
	}
	st.recorded = make([]Call, len(recorded))
	for i, c := range recorded {
		st.recorded[i] = c.Call
	}
	st.matcher = m
	return nil
}
