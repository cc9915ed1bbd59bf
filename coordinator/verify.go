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
// rewrote what the model was shown earlier, and every answer the attempt
// returned is found in the model's outputs or in a tool result the agent
// sent the gateway. The answers are read neutrally: the top-level fields
// of every returned output that is a JSON object (CORE-Bench's
// report.json), named path#field. It returns why the result is not bound
// ("" when it is, or when the attempt made no model call); an error only
// when the trajectory or an output cannot be read now (retried as a
// scoring failure).
func (c *Coordinator) bindToTrajectory(ctx context.Context, a core.Attempt) (string, error) {
	calls, err := c.Trajectory(ctx, a.ID)
	if err != nil {
		return "", fmt.Errorf("bind to trajectory: %w", err)
	}
	signed := ""
	if a.Evidence != nil {
		signed = a.Evidence.ChainHead
	}
	if len(calls) == 0 {
		if signed != "" {
			return fmt.Sprintf("the report signs chain head %s, and the gateway recorded no model call", signed), nil
		}
		return "", nil
	}
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
	return bindReason(a.ID, signed, calls, answers), nil
}

// bindReason is the pure part of bindToTrajectory.
func bindReason(attempt, signed string, calls []gateway.TrajectoryCall, answers []verify.Answer) string {
	var why []string
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
			why = append(why, f.Detail)
		}
	}
	if un := verify.Unbound(verify.Bind(ex, answers)); len(un) > 0 {
		why = append(why, fmt.Sprintf("answers %s are found in no model output or tool result", strings.Join(un, ", ")))
	}
	return strings.Join(why, "; ")
}
