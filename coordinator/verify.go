package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/verify"
)

// maxBoundOutput bounds an output read to bind its answers.
const maxBoundOutput = 1 << 20

// bindToTrajectory checks a model-driven attempt's result against the
// trajectory the gateway recorded (package verify): the chain head the
// node signed is one the gateway gave for this attempt, no request
// rewrote what the model was shown earlier in its conversation (the
// attempt's calls read as concurrent conversations), and every answer the attempt
// returned is found in the model's outputs or in a tool result the agent
// sent the gateway. The answers are read neutrally: the top-level fields
// of every returned output that is a JSON object (CORE-Bench's
// report.json), named path#field. It returns why the result is not bound
// ("" when it is, or when the attempt made no model call) and whether a
// request rewrote earlier turns (one of the reasons); an error only when
// the trajectory or an output cannot be read now (retried as a scoring
// failure).
func (c *Coordinator) bindToTrajectory(ctx context.Context, a core.Attempt) (string, bool, error) {
	calls, err := c.Trajectory(ctx, a.ID)
	if err != nil {
		return "", false, fmt.Errorf("bind to trajectory: %w", err)
	}
	signed := ""
	if a.Evidence != nil {
		signed = a.Evidence.ChainHead
	}
	if len(calls) == 0 {
		if signed != "" {
			return fmt.Sprintf("the report signs chain head %s, and the gateway recorded no model call", signed), false, nil
		}
		return "", false, nil
	}
	why, rewritten := bindReason(a.ID, signed, calls, c.answersOf(ctx, a))
	return why, rewritten, nil
}

// answersOf reads an attempt's answers neutrally: the top-level fields of
// every returned output that is a JSON object (CORE-Bench's report.json),
// named path#field.
func (c *Coordinator) answersOf(ctx context.Context, a core.Attempt) []verify.Answer {
	var answers []verify.Answer
	for _, o := range a.Outputs {
		if o.CID == "" {
			continue
		}
		b, err := c.readOutput(ctx, o, maxBoundOutput)
		if err != nil {
			continue // too large or not a file: not answers
		}
		var fields map[string]json.RawMessage
		if json.Unmarshal(b, &fields) != nil {
			continue
		}
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			answers = append(answers, verify.Answer{Name: o.Path + "#" + k, Value: fields[k]})
		}
	}
	return answers
}

// judgePrefix names a judging job in the scoring queue.
const judgePrefix = "judge:"

// judge judges an attempt's reported replays (core.JudgeJob), outside
// the lock: each replay's trajectory (its counted assignment's calls) is
// compared with the recorded one, tool result by tool result, each
// replayed call paired with the recorded call the gateway gave it
// (replay_of: by conversation, whatever order the agent's conversations
// called in), classed with the attempt's answers (verify.Judge). It reports false when there
// is nothing to judge (the attempt is gone or judged already).
func (c *Coordinator) judge(ctx context.Context, id string) (core.Judged, bool) {
	c.mu.Lock()
	a, ok := c.state.Attempt(id)
	var reps []core.Attempt
	leases := map[string]string{}
	if ok && a.Verification != nil {
		leases[a.ID] = c.state.LeaseOf(a.ID, a.ReportedBy)
		for _, rid := range a.Verification.Replays {
			if r, ok := c.state.Attempt(rid); ok && (r.State == core.StateReported || r.State == core.StateDone) {
				reps = append(reps, r)
				leases[r.ID] = c.state.LeaseOf(r.ID, r.ReportedBy)
			}
		}
	}
	tol := c.state.Config().Verify.Tolerance
	c.mu.Unlock()
	if !ok || a.Verification == nil || a.Verification.State != core.VerifyPending || len(reps) == 0 {
		return core.Judged{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ScoreTimeout)
	defer cancel()
	ev := core.Judged{Attempt: id}
	recorded, err := c.leaseExchanges(ctx, a.ID, leases[a.ID])
	var replays [][]verify.Exchange
	for _, r := range reps {
		ev.Replays = append(ev.Replays, r.ID)
		if err == nil {
			var ex []verify.Exchange
			ex, err = c.leaseExchanges(ctx, r.ID, leases[r.ID])
			replays = append(replays, ex)
		}
	}
	if err != nil {
		ev.Err = err.Error()
		return ev, true
	}
	ev.Judgement = verify.Judge(recorded, replays, c.answersOf(ctx, a), tol)
	ev.Judgement.Comparisons = nil // what the core keeps is the verdict
	return ev, true
}

// leaseExchanges are the recorded exchanges of one assignment (lease) of
// an attempt (every call when lease is "").
func (c *Coordinator) leaseExchanges(ctx context.Context, attempt, lease string) ([]verify.Exchange, error) {
	calls, err := c.Trajectory(ctx, attempt)
	if err != nil {
		return nil, fmt.Errorf("trajectory of %s: %w", attempt, err)
	}
	if lease != "" {
		calls = slices.DeleteFunc(calls, func(cl gateway.TrajectoryCall) bool { return cl.Lease != lease })
	}
	return gateway.Exchanges(calls), nil
}

// bindReason is the pure part of bindToTrajectory.
func bindReason(attempt, signed string, calls []gateway.TrajectoryCall, answers []verify.Answer) (string, bool) {
	var why []string
	rewritten := false
	if signed != "" {
		heads := make([]string, len(calls))
		for i, c := range calls {
			heads[i] = c.Chain
		}
		if !slices.Contains(heads, signed) {
			why = append(why, fmt.Sprintf("the report signs chain head %s, which the gateway never gave attempt %s", signed, attempt))
		}
	}
	ex := gateway.Exchanges(calls)
	for _, f := range verify.CheckAppendOnly(ex) {
		if f.Kind == verify.FindingRewrite {
			why, rewritten = append(why, f.Detail), true
		}
	}
	if un := verify.Unbound(verify.Bind(ex, answers)); len(un) > 0 {
		why = append(why, fmt.Sprintf("answers %s are found in no model output or tool result", strings.Join(un, ", ")))
	}
	return strings.Join(why, "; "), rewritten
}

// verifyPolicy is the configured replay policy (zero: the core's default).
func verifyPolicy(p *verify.Policy) verify.Policy {
	if p == nil {
		return verify.Policy{}
	}
	return *p
}

// ModelSpent is what the gateway's ledger holds as spent on an account
// ("attempt/<id>", "evaluation/<id>", "group/<id>"), in US dollars (0
// without a gateway).
func (c *Coordinator) ModelSpent(ctx context.Context, account string) (float64, error) {
	if c.models == nil {
		return 0, nil
	}
	a, err := c.models.ledger.Balance(ctx, account)
	if err != nil {
		return 0, fmt.Errorf("ledger account %s: %w", account, err)
	}
	return a.Spent.USDValue(), nil
}
