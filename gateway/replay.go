package gateway

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// serveReplay answers a call of a replay attempt (its grant names the
// recorded attempt) with the recorded answer of the same rank among the
// recorded attempt's answered calls: the same agent, given the same
// answers, runs the same tool calls on another node, and the coordinator
// compares the tool results its requests carry with the recorded ones
// (package verify). Nothing is forwarded or charged. The replayed call
// is recorded in the replay attempt's own trajectory (and chain), naming
// the recorded call and whether the request was the recorded one byte
// for byte; a call past the recorded ones is refused with 409.
func (g *Gateway) serveReplay(w http.ResponseWriter, r *http.Request, a adapter, grant Grant, req callRequest, body []byte, start time.Time) {
	ctx := r.Context()
	c := Call{Attempt: grant.Attempt, Lease: grant.Lease, Node: grant.Node.String(), Evaluation: grant.Evaluation,
		Group: grant.Group, Task: grant.Task, API: a.call, Model: req.Model, Provider: "replay", Stream: req.Stream,
		Started: start.UTC()}
	c.Request = g.put(ctx, body)
	recorded, err := g.rec.Calls(ctx, grant.Replay)
	if err != nil {
		g.log.Error("reading a recorded trajectory failed", "replay", grant.Attempt, "of", grant.Replay, "err", err)
		writeAPIError(w, a.api, http.StatusServiceUnavailable, errAPI, "the gateway cannot read the recorded trajectory now; retry")
		return
	}
	// Calls are replayed in order within their API: token counts
	// (which an agent may make or not, around its model calls) never
	// shift which answer a model call gets.
	var answered []Call
	for _, rc := range recorded {
		if rc.Status == http.StatusOK && rc.Refused == "" && rc.Response != "" && replayAPI(rc.API) == replayAPI(a.call) {
			answered = append(answered, rc)
		}
	}
	done, err := g.rec.Calls(ctx, grant.Attempt)
	if err != nil {
		g.log.Error("reading a replay's trajectory failed", "replay", grant.Attempt, "err", err)
		writeAPIError(w, a.api, http.StatusServiceUnavailable, errAPI, "the gateway cannot read the replay's trajectory now; retry")
		return
	}
	n := 0
	for _, d := range done {
		if d.ReplayOf != "" && replayAPI(d.API) == replayAPI(a.call) {
			n++
		}
	}
	if n >= len(answered) {
		c.Status, c.Refused = http.StatusConflict, RefusedReplayExhausted
		c.Error = fmt.Sprintf("the recorded attempt %s made %d calls; this is call %d of its replay", grant.Replay, len(answered), n+1)
		w.Header().Set(ChainHeader, g.finish(ctx, c))
		writeAPIError(w, a.api, http.StatusConflict, errInvalidRequest, c.Error)
		return
	}
	rc := answered[n]
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
		g.log.Error("reading a recorded answer failed", "replay", grant.Attempt, "call", c.ReplayOf, "err", err)
		writeAPIError(w, a.api, http.StatusServiceUnavailable, errAPI, "the gateway cannot read the recorded answer now; retry")
		return
	}
	c.Status = http.StatusOK
	head := g.finish(context.WithoutCancel(ctx), c)
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

// replayAPI is the sequence a recorded call is replayed in: token counts
// apart, model calls of every API together.
func replayAPI(api string) string {
	if api == CallAnthropicCountTokens {
		return api
	}
	return ""
}
