package verify_test

import (
	"encoding/json"
	"testing"

	"github.com/repronet/repronet/verify"
)

// TestParallelToolResultsByCallID: the results of one turn's tools, run
// at once, come in the order they finished (Claude Code's): a replay
// that got them in another order is the same replay, result for result.
func TestParallelToolResultsByCallID(t *testing.T) {
	call := func(id, cmd string) map[string]any {
		args, _ := json.Marshal(map[string]string{"cmd": cmd})
		return map[string]any{"id": id, "type": "function", "function": map[string]any{"name": "bash", "arguments": string(args)}}
	}
	asst := map[string]any{"role": "assistant", "content": "", "tool_calls": []any{call("call_a", "cat a"), call("call_b", "cat b")}}
	user := map[string]any{"role": "user", "content": "Find q."}
	tool := func(id, out string) map[string]any {
		return map[string]any{"role": "tool", "tool_call_id": id, "content": out}
	}
	body := func(msgs ...any) []byte {
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		return b
	}
	answer := func(msg any) []byte {
		b, _ := json.Marshal(map[string]any{"choices": []any{map[string]any{"message": msg}}})
		return b
	}
	conv := func(first, second map[string]any) []verify.Exchange {
		return []verify.Exchange{
			{API: verify.APIOpenAIChat, Model: "m", Request: body(user), Response: answer(asst)},
			{API: verify.APIOpenAIChat, Model: "m", Request: body(user, asst, first, second),
				Response: answer(map[string]any{"role": "assistant", "content": "q is 2"})},
		}
	}
	a, b := tool("call_a", "a says 1"), tool("call_b", "b says 2")
	recorded, replay := conv(a, b), conv(b, a)
	ans := answers("q", "2")
	c := verify.Compare(recorded, replay, ans, verify.DefaultTolerance())
	if c.Count(verify.Same) != 2 || c.Count(verify.AnswerBearing) != 0 || c.Count(verify.Missing) != 0 {
		t.Fatalf("results in another order: %+v", c.Steps)
	}
	// A result that does differ is still found.
	forged := conv(a, tool("call_b", "b says 3"))
	if c := verify.Compare(forged, replay, answers("q", "3"), verify.DefaultTolerance()); c.Count(verify.AnswerBearing) != 1 {
		t.Fatalf("a differing result in another order: %+v", c.Steps)
	}
}

// TestHoldsSkipsHexIDs: a number inside a hex id or hash is no number
// ("12" in "a12b05a4c3d2"), so an id that differs between runs never
// looks like an answer; numbers with units still hold.
func TestHoldsSkipsHexIDs(t *testing.T) {
	as, err := verify.Atoms(json.RawMessage(`12`))
	if err != nil || len(as) != 1 {
		t.Fatal(as, err)
	}
	for text, want := range map[string]bool{
		"agent a12b05a4c3d2 finished":   false,
		"commit 0x12ab34cd":             false,
		"took 12 s":                     true,
		"doubling time 12.0min":         true,
		"id 12345678 and value 12":      true,
		"n_timepoints: 12 (a1b2c3d4e5)": true,
	} {
		if got := as[0].Holds(text); got != want {
			t.Errorf("Holds(%q) = %v, want %v", text, got, want)
		}
	}
}
