package coordinator

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/verify"
)

// trajectoryOf is an agent's two calls: it ran `cat metrics` (whose
// output is toolOut) and submitted; chained as the gateway chains them.
func trajectoryOf(attempt, toolOut, submitted string) []gateway.TrajectoryCall {
	user := `{"role":"user","content":"Reproduce."}`
	call1 := `{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"bash","arguments":"{\"command\":\"cat metrics\"}"}}]}`
	tool := fmt.Sprintf(`{"role":"tool","tool_call_id":"c1","content":%q}`, toolOut)
	submit := fmt.Sprintf(`{"role":"assistant","content":null,"tool_calls":[{"id":"c2","type":"function","function":{"name":"submit","arguments":%q}}]}`, submitted)
	bodies := [][2]string{
		{`{"model":"m","messages":[` + user + `]}`, `{"choices":[{"message":` + call1 + `}]}`},
		{`{"model":"m","messages":[` + user + `,` + call1 + `,` + tool + `]}`, `{"choices":[{"message":` + submit + `}]}`},
	}
	var out []gateway.TrajectoryCall
	head := verify.Genesis(attempt)
	for i, b := range bodies {
		head = verify.Link(head, []byte(b[0]), []byte(b[1]))
		out = append(out, gateway.TrajectoryCall{Call: gateway.Call{Seq: i, Attempt: attempt, API: gateway.CallOpenAIChat, Status: 200, Chain: head},
			RequestBody: []byte(b[0]), ResponseBody: []byte(b[1])})
	}
	return out
}

// withSideCall is calls with a title request (a conversation of its own)
// made between the first and the second, chained again as the gateway
// chains them in arrival order.
func withSideCall(attempt string, calls []gateway.TrajectoryCall) []gateway.TrajectoryCall {
	side := gateway.TrajectoryCall{Call: gateway.Call{Attempt: attempt, API: gateway.CallOpenAIChat, Status: 200},
		RequestBody:  []byte(`{"model":"m","messages":[{"role":"system","content":"Write a title."},{"role":"user","content":"Reproduce."}]}`),
		ResponseBody: []byte(`{"choices":[{"message":{"role":"assistant","content":"Reproducing"}}]}`)}
	out := append([]gateway.TrajectoryCall{calls[0], side}, calls[1:]...)
	head := verify.Genesis(attempt)
	for i := range out {
		head = verify.Link(head, out[i].RequestBody, out[i].ResponseBody)
		out[i].Seq, out[i].Chain = i, head
	}
	return out
}

func TestBindReason(t *testing.T) {
	calls := trajectoryOf("at-1", "accuracy 0.93456", `{"answers":{"acc":0.9346}}`)
	head := calls[1].Chain
	ans := func(v string) []verify.Answer {
		return []verify.Answer{{Name: "report.json#acc", Value: json.RawMessage(v)}}
	}
	rewritten := trajectoryOf("at-1", "accuracy 0.97210", `{"answers":{"acc":0.9346}}`)
	side := withSideCall("at-1", calls)
	for _, tc := range []struct {
		name   string
		signed string
		calls  []gateway.TrajectoryCall
		ans    []verify.Answer
		want   string // "" or a substring of the reason
	}{
		{"bound", head, calls, ans("0.9346"), ""},
		{"no head signed", "", calls, ans("0.9346"), ""},
		{"an earlier head", calls[0].Chain, calls, ans("0.9346"), ""},
		{"report.json edited after the agent stopped", head, calls, ans("0.9721"), "report.json#acc"},
		{"a head the gateway never gave", strings.Repeat("0", 64), calls, ans("0.9346"), "never gave"},
		{"an earlier turn rewritten", head, append(calls, rewritten[1]), ans("0.9721"), "otherwise than request 1 did"},
		{"a side conversation between two calls", side[2].Chain, side, ans("0.9346"), ""},
		{"a side conversation, then a turn rewritten", side[2].Chain, append(side, rewritten[1]), ans("0.9721"), "otherwise than request 2 did"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, rw := bindReason("at-1", tc.signed, tc.calls, tc.ans)
			if tc.want == "" && got != "" || tc.want != "" && !strings.Contains(got, tc.want) {
				t.Fatalf("reason %q, want %q", got, tc.want)
			}
			if want := strings.Contains(tc.name, "rewritten"); rw != want {
				t.Fatalf("rewritten %v, want %v", rw, want)
			}
		})
	}
}

// TestUnboundIsInvalid: an unbound result is an invalid replica (not
// counted, marking the node's record), never valid evidence.
func TestUnboundIsInvalid(t *testing.T) {
	e := crosscheck.Evidence{Outcome: "ok", StartedMillis: 1_000, FinishedMillis: 11_000, WallSeconds: 10, CPUSeconds: 5}
	if v, why := crosscheck.CheckEvidence(crosscheck.DefaultPolicy(), crosscheck.Work{ID: "u"}, e); v != "" {
		t.Fatalf("plain evidence: %s %s", v, why)
	}
	e.Unbound = "answers report.json#acc are found in no model output or tool result"
	if v, why := crosscheck.CheckEvidence(crosscheck.DefaultPolicy(), crosscheck.Work{ID: "u"}, e); v != crosscheck.Invalid || !strings.Contains(why, "report.json#acc") {
		t.Fatalf("unbound evidence: %s %s", v, why)
	}
}
