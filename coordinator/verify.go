package coordinator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/verify"
)

// maxBoundOutput bounds an output read to bind its answers.
const maxBoundOutput = 1 << 20

// binding is what bindToTrajectory found.
type binding struct {
	// Unbound says why the result is not bound: answers found in no model
	// output or tool result of the counted assignment, a rewritten
	// conversation, an output binding cannot read. An agent can cause
	// each on an honest node.
	Unbound   string
	Rewritten bool
	// Foreign is evidence only the node can produce: the report signs a
	// chain head the gateway never gave the counted assignment.
	Foreign string
}

// bindToTrajectory checks a model-driven attempt's result against the
// trajectory the gateway recorded for its counted assignment (package
// verify; calls of other assignments, or made with the attempt's token by
// anyone after the lease changed hands, never bind): the chain head the
// node signed is one the gateway gave that assignment, no request
// rewrote what the model was shown earlier in its conversation (the
// calls read as concurrent conversations), and every answer the attempt
// returned is found in the model's outputs or in a tool result the agent
// sent the gateway. The answers are read neutrally (answersOf); an output
// they cannot be read from makes the result unbound (an invalid report,
// not an empty one). An error only when the trajectory or an output
// cannot be read now (retried as a scoring failure).
func (c *Coordinator) bindToTrajectory(ctx context.Context, a core.Attempt) (binding, error) {
	c.mu.Lock()
	lease := c.state.LeaseOf(a.ID, a.ReportedBy)
	c.mu.Unlock()
	calls, err := c.leaseCalls(ctx, a.ID, lease)
	if err != nil {
		return binding{}, fmt.Errorf("bind to trajectory: %w", err)
	}
	signed := ""
	if a.Evidence != nil {
		signed = a.Evidence.ChainHead
	}
	answers, unreadable, err := c.answersOf(ctx, a)
	if err != nil {
		return binding{}, fmt.Errorf("bind to trajectory: %w", err)
	}
	if len(calls) == 0 {
		b := binding{Unbound: unreadable}
		if signed != "" {
			b.Foreign = fmt.Sprintf("the report signs chain head %s, and the gateway recorded no model call", signed)
		}
		return b, nil
	}
	b := bindReason(a.ID, signed, calls, answers)
	if unreadable != "" {
		b.Unbound = strings.Join(slices.DeleteFunc([]string{unreadable, b.Unbound}, func(s string) bool { return s == "" }), "; ")
	}
	return b, nil
}

// answersOf reads an attempt's answers neutrally: the top-level fields of
// every returned output that is a JSON object (CORE-Bench's report.json),
// named path#field. An output named *.json that is not one it can read
// (too large, not JSON: a NaN, a truncated file) is named in unreadable:
// binding reads nothing from it, so the report is invalid. An error only
// when an output cannot be read now.
func (c *Coordinator) answersOf(ctx context.Context, a core.Attempt) ([]verify.Answer, string, error) {
	var answers []verify.Answer
	var bad []string
	for _, o := range a.Outputs {
		if o.CID == "" {
			continue
		}
		b, err := c.readOutput(ctx, o, maxBoundOutput)
		if err != nil && !errors.Is(err, bench.ErrNotReturned) {
			return nil, "", err
		}
		as, why := outputAnswers(o.Path, b, err)
		answers = append(answers, as...)
		if why != "" {
			bad = append(bad, why)
		}
	}
	if len(bad) > 0 {
		return answers, "outputs binding cannot read: " + strings.Join(bad, "; "), nil
	}
	return answers, "", nil
}

// outputAnswers reads the answers of one returned output (its bytes, or
// why they could not be read): the top-level fields of a JSON object,
// named path#field. An output named *.json that cannot be read, or is not
// a JSON object Go can decode (a NaN, a truncated file), gives why; other
// outputs that are not JSON objects hold no answers.
func outputAnswers(path string, b []byte, readErr error) ([]verify.Answer, string) {
	isJSON := strings.HasSuffix(strings.ToLower(path), ".json")
	if readErr != nil {
		if isJSON {
			return nil, fmt.Sprintf("%s cannot be read (%v)", path, readErr)
		}
		return nil, "" // too large or not a file: not answers
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil || fields == nil {
		if isJSON {
			return nil, fmt.Sprintf("%s is not a JSON object binding can read (%v)", path, cmp.Or(err, errors.New("null")))
		}
		return nil, ""
	}
	var out []verify.Answer
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		out = append(out, verify.Answer{Name: path + "#" + k, Value: fields[k]})
	}
	return out, ""
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
	if !ok || a.Verification == nil || a.Verification.State != core.VerifyPending && !a.Verification.Attributing || len(reps) == 0 {
		return core.Judged{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.ScoreTimeout)
	defer cancel()
	ev := core.Judged{Attempt: id}
	recorded, err := c.leaseExchanges(ctx, a.ID, leases[a.ID])
	answers, _, aerr := c.answersOf(ctx, a)
	err = cmp.Or(err, aerr)
	var replays [][]verify.Exchange
	var replayAnswers [][]verify.Answer
	for _, r := range reps {
		ev.Replays = append(ev.Replays, r.ID)
		if err != nil {
			continue
		}
		// Each replay's own report, bound to its own counted assignment:
		// whether it binds decides whom an unbound result charges.
		var calls []gateway.TrajectoryCall
		calls, err = c.leaseCalls(ctx, r.ID, leases[r.ID])
		if err != nil {
			continue
		}
		var ra []verify.Answer
		var unreadable string
		ra, unreadable, err = c.answersOf(ctx, r)
		why := unreadable
		if len(calls) > 0 {
			why = strings.Join(slices.DeleteFunc([]string{unreadable, bindReason(r.ID, "", calls, ra).Unbound},
				func(s string) bool { return s == "" }), "; ")
		}
		replays = append(replays, gateway.Exchanges(calls))
		replayAnswers = append(replayAnswers, ra)
		ev.Unbound = append(ev.Unbound, why)
	}
	if err != nil {
		ev.Err = err.Error()
		return ev, true
	}
	in := verify.JudgeInput{Recorded: recorded, Answers: answers, Replays: replays, ReplayAnswers: replayAnswers,
		Outputs: outputCIDs(a), Tolerance: tol}
	for _, r := range reps {
		in.ReplayOutputs = append(in.ReplayOutputs, outputCIDs(r))
	}
	ev.Judgement = verify.JudgeAll(in)
	ev.Judgement.Comparisons = nil // what the core keeps is the verdict
	return ev, true
}

// outputCIDs names an attempt's returned outputs by content (those not
// returned are left out).
func outputCIDs(a core.Attempt) map[string]string {
	out := map[string]string{}
	for _, o := range a.Outputs {
		if o.CID != "" && o.Error == "" {
			out[o.Path] = o.CID
		}
	}
	return out
}

// leaseExchanges are the recorded exchanges of one assignment (lease) of
// an attempt (every call when lease is "").
func (c *Coordinator) leaseExchanges(ctx context.Context, attempt, lease string) ([]verify.Exchange, error) {
	calls, err := c.leaseCalls(ctx, attempt, lease)
	if err != nil {
		return nil, err
	}
	return gateway.Exchanges(calls), nil
}

// leaseCalls are the recorded calls of one assignment (lease) of an
// attempt (every call when lease is "").
func (c *Coordinator) leaseCalls(ctx context.Context, attempt, lease string) ([]gateway.TrajectoryCall, error) {
	calls, err := c.Trajectory(ctx, attempt)
	if err != nil {
		return nil, fmt.Errorf("trajectory of %s: %w", attempt, err)
	}
	if lease != "" {
		calls = slices.DeleteFunc(calls, func(cl gateway.TrajectoryCall) bool { return cl.Lease != lease })
	}
	return calls, nil
}

// bindReason is the pure part of bindToTrajectory.
func bindReason(attempt, signed string, calls []gateway.TrajectoryCall, answers []verify.Answer) binding {
	var b binding
	if signed != "" {
		heads := make([]string, len(calls))
		for i, c := range calls {
			heads[i] = c.Chain
		}
		if !slices.Contains(heads, signed) {
			b.Foreign = fmt.Sprintf("the report signs chain head %s, which the gateway never gave attempt %s", signed, attempt)
		}
	}
	var why []string
	ex := gateway.Exchanges(calls)
	for _, f := range verify.CheckAppendOnly(ex) {
		if f.Kind == verify.FindingRewrite {
			why, b.Rewritten = append(why, f.Detail), true
		}
	}
	if un := verify.Unbound(verify.Bind(ex, answers)); len(un) > 0 {
		why = append(why, fmt.Sprintf("answers %s are found in no model output or tool result", strings.Join(un, ", ")))
	}
	b.Unbound = strings.Join(why, "; ")
	return b
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
