package verify_test

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/repronet/repronet/verify"
)

// apiConv is a conversation of two calls in api's wire: the model asks
// for `cat a`, is shown output, and answers. Each carries what the
// provider adds and the next request leaves out (reasoning, thoughts).
func apiConv(api, prompt, output string) []verify.Exchange {
	q := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	var req0, ans0, req1, ans1 string
	switch api {
	case verify.APIOpenAIResponses:
		user := fmt.Sprintf(`{"type":"message","role":"user","content":[{"type":"input_text","text":%s}]}`, q(prompt))
		call := `{"type":"function_call","id":"fc_1","call_id":"call_1","name":"shell","arguments":"{\"command\": [\"cat\", \"a\"]}","status":"completed"}`
		req0 = `{"model":"gpt-x","instructions":"You are Codex.","store":false,"input":[` + user + `]}`
		ans0 = `{"id":"resp_1","output":[{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"enc"},` + call + `]}`
		req1 = `{"model":"gpt-x","instructions":"You are Codex.","store":false,"input":[` + user + `,{"type":"reasoning","id":"rs_1","summary":[],"encrypted_content":"enc"},` + call +
			`,{"type":"function_call_output","call_id":"call_1","output":` + q(output) + `}]}`
		ans1 = `{"id":"resp_2","output":[{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Done.","annotations":[]}]}]}`
	case verify.APIGeminiGenerate:
		sys := `"systemInstruction":{"parts":[{"text":"You are Gemini CLI."}]}`
		user := fmt.Sprintf(`{"role":"user","parts":[{"text":%s}]}`, q(prompt))
		call := `{"functionCall":{"name":"run_shell_command","args":{"command":"cat a"}},"thoughtSignature":"sig"}`
		req0 = `{` + sys + `,"contents":[` + user + `]}`
		ans0 = `{"candidates":[{"content":{"role":"model","parts":[{"text":"Let me look.","thought":true},` + call + `]}}]}`
		req1 = `{` + sys + `,"contents":[` + user + `,{"role":"model","parts":[` + call + `]},{"role":"user","parts":[{"functionResponse":{"name":"run_shell_command","response":{"output":` + q(output) + `}}}]}]}`
		ans1 = `{"candidates":[{"content":{"role":"model","parts":[{"text":"Done."}]}}]}`
	}
	return []verify.Exchange{{API: api, Model: "x", Request: []byte(req0), Response: []byte(ans0)},
		{API: api, Model: "x", Request: []byte(req1), Response: []byte(ans1)}}
}

// TestOtherAPIs: the Responses API's and Gemini's conversations are read
// as chat completions' are: split, kept append-only, bound, paired and
// compared.
func TestOtherAPIs(t *testing.T) {
	for _, api := range []string{verify.APIOpenAIResponses, verify.APIGeminiGenerate} {
		t.Run(api, func(t *testing.T) {
			main := apiConv(api, "Find the answer.", "the answer is 42")
			side := apiConv(api, "Find the method.", "ridge regression")
			rec, _ := interleave([][]verify.Exchange{main, side}, "ABBA")
			sp := verify.SplitExchanges(rec)
			if len(sp.Convs) != 2 || len(sp.Convs[0]) != 2 || len(sp.Convs[1]) != 2 || len(verify.CheckAppendOnly(rec)) != 0 {
				t.Fatalf("conversations %v, findings %+v", sp.Convs, verify.CheckAppendOnly(rec))
			}
			rewritten := append(rec, apiConv(api, "Find the answer.", "the answer is 43")[1])
			if f := verify.CheckAppendOnly(rewritten); len(f) != 1 || f[0].Step != 4 {
				t.Fatalf("a tool result rewritten: findings %+v", f)
			}
			ans := answers("q", "42")
			if un := verify.Unbound(verify.Bind(rec, ans)); len(un) != 0 {
				t.Fatalf("unbound %v", un)
			}
			honest, _ := interleave([][]verify.Exchange{main, side}, "BBAA")
			if j := verify.Judge(rec, [][]verify.Exchange{honest}, ans, verify.DefaultTolerance()); j.Verdict != verify.Verified || j.Comparisons[0].Count(verify.Same) != 2 {
				t.Fatalf("honest replay: %s (%s) %+v", j.Verdict, j.Reason, j.Comparisons[0])
			}
			other, _ := interleave([][]verify.Exchange{apiConv(api, "Find the answer.", "the answer is 41"), side}, "BABA")
			if j := verify.Judge(rec, [][]verify.Exchange{other}, ans, verify.DefaultTolerance()); j.Verdict != verify.NeedsReplay {
				t.Fatalf("a replay without the answer: %s (%s)", j.Verdict, j.Reason)
			}
			m := verify.NewMatcher(rec, verify.DefaultTolerance())
			for j, e := range other {
				x, err := m.Match(strip(e))
				if err != nil {
					t.Fatalf("replay call %d: %v", j, err)
				}
				m.Commit(x)
			}
		})
	}
}

// TestCountingCalls: calls that only count a prompt's tokens (Gemini's
// countTokens, Anthropic's count_tokens) are not turns of a conversation:
// among an agent's calls they raise no finding, bind nothing, and a
// replay's identical counting call is paired with the recorded one.
func TestCountingCalls(t *testing.T) {
	for _, api := range []string{"gemini.countTokens", "anthropic.count_tokens"} {
		t.Run(api, func(t *testing.T) {
			count := verify.Exchange{API: api, Model: "x", Request: []byte(`{"contents":[{"role":"user","parts":[{"text":"the answer is 42"}]}]}`),
				Response: []byte(`{"totalTokens":12,"input_tokens":12}`)}
			conv := apiConv(verify.APIGeminiGenerate, "Find the answer.", "the answer is 7")
			rec := []verify.Exchange{conv[0], count, conv[1]}
			if f := verify.CheckAppendOnly(rec); len(f) != 0 {
				t.Fatalf("findings %+v", f)
			}
			if un := verify.Unbound(verify.Bind(rec, answers("q", "42"))); len(un) != 1 {
				t.Fatalf("a counting call's request bound an answer: unbound %v", un)
			}
			m := verify.NewMatcher(rec, verify.DefaultTolerance())
			x, err := m.Match(strip(count))
			if err != nil {
				t.Fatalf("the replay's counting call: %v", err)
			}
			m.Commit(x)
		})
	}
}
