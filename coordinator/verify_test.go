package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/proto"
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

// convCall makes one chat call of a conversation through a node's model
// endpoint and returns the assistant message to append and the tool call
// it asks for ("" when it answered in text).
func convCall(base, token string, msgs []any) (map[string]any, string, string, error) {
	body, _ := json.Marshal(map[string]any{"model": "sim-1", "messages": msgs})
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return nil, "", "", fmt.Errorf("%d %s", resp.StatusCode, b)
	}
	var r struct {
		Choices []struct {
			Message struct {
				Content   *string `json:"content"`
				ToolCalls []struct {
					ID       string `json:"id"`
					Function struct{ Name, Arguments string }
				} `json:"tool_calls"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &r); err != nil || len(r.Choices) == 0 {
		return nil, "", "", fmt.Errorf("answer %s: %v", b, err)
	}
	m := r.Choices[0].Message
	if len(m.ToolCalls) == 0 {
		return map[string]any{"role": "assistant", "content": *m.Content}, "", "", nil
	}
	tc := m.ToolCalls[0]
	return map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": tc.ID, "type": "function",
		"function": map[string]any{"name": tc.Function.Name, "arguments": tc.Function.Arguments}}}}, tc.ID, tc.Function.Arguments, nil
}

// conversationsAgent is an agent with two conversations (a main loop that
// runs `cat a` and a title request), whose calls it makes in order: 'm'
// the main loop's next call, 't' the title's.
func conversationsAgent(base, token, order string) error {
	convs := map[byte][]any{
		'm': {map[string]any{"role": "system", "content": "You are an agent."}, map[string]any{"role": "user", "content": "Find the answer."}},
		't': {map[string]any{"role": "system", "content": "Write a title."}, map[string]any{"role": "user", "content": "Find the answer."}},
	}
	for _, k := range []byte(order) {
		m, id, args, err := convCall(base, token, convs[k])
		if err != nil {
			return fmt.Errorf("conversation %c: %w", k, err)
		}
		if id == "" {
			continue
		}
		out := "the answer is 42"
		if !strings.Contains(args, "cat a") {
			out = "no such command"
		}
		convs[k] = append(convs[k], m, map[string]any{"role": "tool", "tool_call_id": id, "content": out})
	}
	return nil
}

// TestReplayConversations: an agent whose conversations call the model
// in one interleaving on its node is replayed on another operator's node
// in another: every replay call is answered from the recording (the
// provider gets none), and the judge pairs calls by conversation and
// verifies the attempt.
func TestReplayConversations(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c, sim := modelCoordinator(t, modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "Write a title"}, Reply: modelsim.Reply{Content: "Finding the answer"}},
		{When: modelsim.Cond{ToolResultContains: "42"}, Reply: modelsim.Reply{Content: "It is 42."}},
		{When: modelsim.Cond{LastRole: "user"}, Reply: modelsim.Reply{ToolCalls: []modelsim.ToolCall{{ID: "call_1", Name: "bash", Arguments: `{"cmd":"cat a"}`}}}},
	}}, func(cfg *Config) { cfg.OpenOperators = true })
	operator := func(w *wireNode) {
		op, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			t.Fatal(err)
		}
		w.withOperator(op)
	}
	agent := func(w *wireNode, order string) func(*proto.Assignment) *proto.Report {
		return func(a *proto.Assignment) *proto.Report {
			if err := conversationsAgent(agentProxy(ctx, t, w, a.GetAttemptId()), a.GetModelToken(), order); err != nil {
				t.Errorf("attempt %s: %v", a.GetAttemptId(), err)
			}
			return w.okReport(a, `{"q": 42}`)
		}
	}
	rec := newWireNode(ctx, t, c, 8)
	rec.report = agent(rec, "mtm")
	operator(rec)
	rec.announce(ctx)
	atts := evaluate(t, c, Evaluation{ID: "ev-conv", Models: []string{"sim-1"}})
	waitUntil(ctx, t, "the recorder's attempts reported", func() bool { return rec.reported() == len(atts) })
	settle(t, c)
	calls := len(sim.Requests())
	rep := newWireNode(ctx, t, c, 8)
	rep.report = agent(rep, "tmm")
	operator(rep)
	rep.announce(ctx)
	rep.announceEvery(ctx, proto.MinAnnounceGap+100*time.Millisecond)
	verified := func() bool {
		for _, a := range atts {
			got := state(t, c, a.ID)
			if got.Verification == nil || got.Verification.State == core.VerifyPending {
				return false
			}
		}
		return true
	}
	for !verified() {
		select {
		case <-ctx.Done():
			var out []string
			for _, a := range c.Attempts() {
				out = append(out, fmt.Sprintf("%s %s %s by %s verification %+v", a.ID, a.Kind, a.State, a.ReportedBy, a.Verification))
			}
			t.Fatalf("not every attempt judged:\n%s", strings.Join(out, "\n"))
		case <-time.After(200 * time.Millisecond):
		}
	}
	for _, a := range atts {
		got := state(t, c, a.ID)
		if got.Verification.State != string(verify.Verified) || got.Verification.Benign != 0 {
			t.Fatalf("attempt %s: verification %+v", a.ID, got.Verification)
		}
	}
	replays := 0
	for _, a := range c.Attempts() {
		if a.Kind != KindReplay {
			continue
		}
		replays++
		traj, err := c.Trajectory(ctx, a.ID)
		if err != nil || len(traj) != 3 || traj[0].ReplayOf == "" || !traj[0].ReplayMatch {
			t.Fatalf("replay %s: %d calls (%v), first %+v", a.ID, len(traj), err, traj[0].Call)
		}
	}
	if replays < len(atts) || len(sim.Requests()) != calls || calls != 3*len(atts) {
		t.Fatalf("%d replays of %d attempts; the provider got %d calls, %d of them during the replays", replays, len(atts), len(sim.Requests()), len(sim.Requests())-calls)
	}
}
