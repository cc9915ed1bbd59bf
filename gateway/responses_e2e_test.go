package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/modelsim"
)

// codexTurn is a Responses request as Codex CLI sends it (codex-rs
// ResponsesApiRequest, store false, the whole history in input), with
// input the conversation so far.
func codexTurn(stream bool, input ...any) map[string]any {
	if len(input) == 0 {
		input = []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "Find the answer."}}}}
	}
	return map[string]any{
		"model": "gpt-sim", "instructions": "You are Codex, a coding agent.", "input": input,
		"tools": []any{map[string]any{"type": "function", "name": "shell", "strict": false, "parameters": map[string]any{"type": "object",
			"properties": map[string]any{"command": map[string]any{"type": "array", "items": map[string]any{"type": "string"}}}}}},
		"tool_choice": "auto", "parallel_tool_calls": false, "reasoning": map[string]any{"effort": "medium", "summary": "auto"},
		"store": false, "stream": stream, "include": []any{"reasoning.encrypted_content"}, "prompt_cache_key": "conv-7",
	}
}

// shellArgs are the arguments of Codex's shell tool.
const shellArgs = `{"command":["bash","-lc","cat results/answer.txt"]}`

func codexScript() modelsim.Script {
	return modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{API: "responses", ToolResultContains: "ANSWER=42"}, Reply: modelsim.Reply{Content: "The answer is 42.",
			Usage: modelsim.Usage{Prompt: 2000, Cached: 1500}}},
		{When: modelsim.Cond{API: "responses", Turn: 1}, Reply: modelsim.Reply{Reasoning: "Read the results file.", Content: "Looking.",
			ToolCalls: []modelsim.ToolCall{{ID: "call_1", Name: "shell", Arguments: shellArgs}}, Usage: modelsim.Usage{Prompt: 1200, Cached: 1000}}},
	}}
}

// responsesItems reads a Responses stream as Codex does: the items of
// its response.output_item.done events, the text of its deltas, and the
// final response.
func responsesItems(t testing.TB, body []byte) (items []json.RawMessage, text string, final map[string]json.RawMessage) {
	t.Helper()
	var b strings.Builder
	for _, d := range sseData(body) {
		var e struct {
			Type     string                     `json:"type"`
			Item     json.RawMessage            `json:"item"`
			Delta    string                     `json:"delta"`
			Response map[string]json.RawMessage `json:"response"`
		}
		if err := json.Unmarshal([]byte(d), &e); err != nil {
			t.Fatalf("event %q: %v", d, err)
		}
		switch e.Type {
		case "response.output_item.done":
			items = append(items, e.Item)
		case "response.output_text.delta":
			b.WriteString(e.Delta)
		case "response.completed", "response.incomplete":
			final = e.Response
		}
	}
	return items, b.String(), final
}

func TestResponsesNonStreaming(t *testing.T) {
	r := newRig(t, codexScript(), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	status, body := call(t, r.srv.URL, "/v1/responses", tok, codexTurn(false), nil)
	if status != http.StatusOK || !bytes.Contains(body, []byte(`"call_id":"call_1"`)) {
		t.Fatalf("%d %s", status, body)
	}
	got := r.sim.Requests()
	if len(got) != 1 || got[0].Path != "/v1/responses" || got[0].Header.Get("Authorization") != "Bearer "+openAIKey {
		t.Fatalf("provider got %d requests, the first at %s", len(got), got[0].Path)
	}
	var fwd map[string]any
	_ = json.Unmarshal(got[0].Body, &fwd)
	if fwd["model"] != "gpt-sim-2026" || fwd["max_output_tokens"] != 4096.0 || fwd["store"] != false || fwd["prompt_cache_key"] != "conv-7" ||
		!slices.Equal(fwd["include"].([]any), []any{"reasoning.encrypted_content"}) {
		t.Fatalf("forwarded %v", fwd)
	}
	var answer struct {
		Output []struct{ Type, EncryptedContent string } `json:"output"`
		Usage  map[string]any
	}
	if err := json.Unmarshal(body, &answer); err != nil || len(answer.Output) != 3 || answer.Output[0].Type != "reasoning" {
		t.Fatalf("answer %s", body)
	}
	calls := trajectory(t, r, "at-1")
	if len(calls) != 1 {
		t.Fatalf("%d calls recorded", len(calls))
	}
	c := calls[0]
	// Reasoning "Read the results file." 4 tokens, "Looking." 1, the call
	// 1 + its arguments' tokens: all output, reasoning included.
	output := int64(4 + 1 + 1 + len(modelsim.Tokens(shellArgs)))
	want := cost(gptPrice, 1200, 1000, 0, output)
	if c.API != gateway.CallOpenAIResponses || c.Usage != (gateway.Usage{Input: 1200, CachedInput: 1000, Output: output}) || c.Cost != want ||
		c.Charged != want || !c.UsageReported || c.MaxOutput != 4096 || c.Forwarded == "" || c.Upstream != "gpt-sim-2026" {
		t.Fatalf("record %+v, want cost %v", c.Call, want)
	}
	for _, key := range []string{"attempt/at-1", "evaluation/ev-1", "group/grp"} {
		if s := spent(t, r, key); s != want {
			t.Fatalf("%s spent %v, want %v", key, s, want)
		}
	}
	if !bytes.Equal(c.ResponseBody, body) {
		t.Fatal("recorded answer differs from what the client got")
	}
	if h, err := gateway.ToHAL("capsule-1", calls); err != nil || len(h.Calls) != 1 || h.Calls[0].OpName != "openai.responses.create" ||
		h.Calls[0].Outputs.Choices[0] != "Looking." {
		t.Fatalf("HAL %+v %v", h.Calls, err)
	}
}

// TestResponsesStreamingFunctionCall: a streamed turn with a reasoning
// item and a function call, then the turn after it carrying the items
// back with the call's output, as Codex does with store false: both pass
// untouched, both are charged at their usage, cached tokens at the
// cached price.
func TestResponsesStreamingFunctionCall(t *testing.T) {
	r := newRig(t, codexScript(), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first := codexTurn(true)
	status, body := call(t, r.srv.URL, "/v1/responses", tok, first, nil)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, body)
	}
	items, text, final := responsesItems(t, body)
	if text != "Looking." || len(items) != 3 || final == nil || !bytes.Contains(final["usage"], []byte(`"cached_tokens":1000`)) {
		t.Fatalf("text %q, %d items, final %v", text, len(items), final)
	}
	var fc struct{ Type, CallID, Name, Arguments string }
	if err := json.Unmarshal(items[2], &fc); err != nil || fc.Type != "function_call" || fc.Arguments != shellArgs || fc.Name != "shell" {
		t.Fatalf("function call item %s", items[2])
	}
	if !bytes.Contains(items[0], []byte(`"encrypted_content"`)) {
		t.Fatalf("reasoning item %s has no encrypted_content", items[0])
	}
	// The next turn: the history, the items as they came, the output.
	input := append(slices.Clone(first["input"].([]any)), items[0], items[1], items[2],
		map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "ANSWER=42\n"})
	second := codexTurn(true, input...)
	status, body2 := call(t, r.srv.URL, "/v1/responses", tok, second, nil)
	if _, text2, _ := responsesItems(t, body2); status != http.StatusOK || text2 != "The answer is 42." {
		t.Fatalf("second turn: %d %s", status, body2)
	}
	reqs := r.sim.Requests()
	var fwd struct{ Input []json.RawMessage }
	_ = json.Unmarshal(reqs[1].Body, &fwd)
	if len(fwd.Input) != 5 || !bytes.Equal(fwd.Input[1], items[0]) || !bytes.Equal(fwd.Input[3], items[2]) ||
		string(fwd.Input[4]) != `{"call_id":"call_1","output":"ANSWER=42\n","type":"function_call_output"}` {
		t.Fatalf("forwarded input %s", fwd.Input)
	}
	calls := trajectory(t, r, "at-1")
	if len(calls) != 2 {
		t.Fatalf("%d calls", len(calls))
	}
	output := int64(4 + 1 + 1 + len(modelsim.Tokens(shellArgs)))
	wants := []struct {
		u gateway.Usage
		c gateway.Money
	}{
		{gateway.Usage{Input: 1200, CachedInput: 1000, Output: output}, cost(gptPrice, 1200, 1000, 0, output)},
		{gateway.Usage{Input: 2000, CachedInput: 1500, Output: 4}, cost(gptPrice, 2000, 1500, 0, 4)},
	}
	var total gateway.Money
	for i, c := range calls {
		if c.Usage != wants[i].u || c.Cost != wants[i].c || !c.Stream || c.StreamBytes == "" || c.FirstTokenMS <= 0 || c.Error != "" {
			t.Fatalf("call %d: %+v, want usage %+v cost %v", i, c.Call, wants[i].u, wants[i].c)
		}
		total += c.Cost
	}
	if s := spent(t, r, "attempt/at-1"); s != total {
		t.Fatalf("spent %v, want %v", s, total)
	}
	// The recorded answer of a stream is its completed response; its
	// bytes are what the client got.
	var rec map[string]json.RawMessage
	streamed, _ := r.rec.Get(context.Background(), calls[0].StreamBytes)
	if err := json.Unmarshal(calls[0].ResponseBody, &rec); err != nil || string(rec["status"]) != `"completed"` ||
		!bytes.Equal(rec["output"], final["output"]) || !bytes.Equal(streamed, body) {
		t.Fatalf("recorded answer %s", calls[0].ResponseBody)
	}
}

// TestResponsesBudget: the output bound is lowered so that the budget
// holds, and a call the budget cannot pay for is refused with 402 before
// it reaches the provider.
func TestResponsesBudget(t *testing.T) {
	script := modelsim.Sequence(modelsim.Reply{Reasoning: strings.Repeat("think ", 50), Content: strings.Repeat("word ", 3000)})
	r := newRig(t, script, nil)
	// The request's input bound is about 1,700 tokens at $2 per million
	// ($0.0034); a budget of $0.005 leaves about 200 output tokens at $8
	// per million.
	budget := 5 * gateway.USD / 1000
	tok := r.grant(t, "at-1", budget, nil)
	body := codexTurn(true)
	body["max_output_tokens"] = 100000
	status, out := call(t, r.srv.URL, "/v1/responses", tok, body, nil)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	c := trajectory(t, r, "at-1")[0]
	var fwd struct {
		Max int64 `json:"max_output_tokens"`
	}
	_ = json.Unmarshal(r.sim.Requests()[0].Body, &fwd)
	if c.MaxOutput >= 4096 || c.MaxOutput < gateway.DefaultMinOutputTokens || fwd.Max != c.MaxOutput || c.Bound > budget {
		t.Fatalf("bound %v of %v, max output %d, forwarded %d", c.Bound, budget, c.MaxOutput, fwd.Max)
	}
	// The model stopped at the bound: the answer is incomplete, its
	// output (reasoning included) is the bound, the charge within it.
	_, _, final := responsesItems(t, out)
	if string(final["status"]) != `"incomplete"` || c.Usage.Output != c.MaxOutput || c.Charged > c.Bound || spent(t, r, "attempt/at-1") > budget {
		t.Fatalf("final %s, usage %+v, charged %v of bound %v", final["status"], c.Usage, c.Charged, c.Bound)
	}

	small := r.grant(t, "at-2", gateway.USD/1000, nil)
	n := len(r.sim.Requests())
	status, out = call(t, r.srv.URL, "/v1/responses", small, codexTurn(false), nil)
	var e struct {
		Error struct{ Type, Message string }
	}
	if status != http.StatusPaymentRequired || json.Unmarshal(out, &e) != nil || e.Error.Type != "budget_exhausted" {
		t.Fatalf("%d %s", status, out)
	}
	if len(r.sim.Requests()) != n || spent(t, r, "attempt/at-2") != 0 {
		t.Fatal("a refused call reached the provider or was charged")
	}
	if tr := trajectory(t, r, "at-2"); len(tr) != 1 || tr[0].Refused != gateway.RefusedBudget || tr[0].API != gateway.CallOpenAIResponses {
		t.Fatalf("refusal recorded as %+v", tr)
	}
}

// TestResponsesRefused: what the gateway cannot record or bound is
// refused with 400 naming it, in OpenAI's error format, before the
// provider.
func TestResponsesRefused(t *testing.T) {
	r := newRig(t, codexScript(), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	withSearch := codexTurn(false)
	withSearch["tools"] = append(withSearch["tools"].([]any), map[string]any{"type": "web_search", "external_web_access": false})
	stored := codexTurn(false)
	stored["previous_response_id"] = "resp_abc"
	claude := codexTurn(false)
	claude["model"] = "claude-sim"
	for name, tc := range map[string]struct {
		body any
		want string
	}{
		"previous_response_id": {stored, "previous_response_id is not supported"},
		"web search":           {withSearch, `tools[1]: type "web_search" is not supported`},
		"an Anthropic model":   {claude, "served at /v1/messages"},
		"not JSON":             {[]byte("{"), "not a JSON object"},
	} {
		status, out := call(t, r.srv.URL, "/v1/responses", tok, tc.body, nil)
		var e struct {
			Error struct{ Type, Message string }
		}
		if status != http.StatusBadRequest || json.Unmarshal(out, &e) != nil || e.Error.Type != "invalid_request_error" || !strings.Contains(e.Error.Message, tc.want) {
			t.Errorf("%s: %d %s", name, status, out)
		}
	}
	if n := len(r.sim.Requests()); n != 0 {
		t.Fatalf("the provider got %d refused requests", n)
	}
}

// TestResponsesReplay: a replay attempt gets the recorded Responses
// answers, streamed as recorded, without the provider.
func TestResponsesReplay(t *testing.T) {
	r := newRig(t, codexScript(), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first := codexTurn(true)
	_, body := call(t, r.srv.URL, "/v1/responses", tok, first, nil)
	items, _, _ := responsesItems(t, body)
	input := append(slices.Clone(first["input"].([]any)), items[0], items[1], items[2],
		map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "ANSWER=42"})
	second := codexTurn(false, input...)
	_, body2 := call(t, r.srv.URL, "/v1/responses", tok, second, nil)
	n := len(r.sim.Requests())
	rtok := r.grant(t, "rp-1", gateway.USD, func(g *gateway.Grant) { g.Replay = "at-1" })
	for i, tc := range []struct {
		body any
		want []byte
	}{{first, body}, {second, body2}} {
		status, out := call(t, r.srv.URL, "/v1/responses", rtok, tc.body, nil)
		if status != http.StatusOK || !bytes.Equal(out, tc.want) {
			t.Fatalf("replayed call %d: %d %s", i, status, out)
		}
	}
	traj := trajectory(t, r, "rp-1")
	if len(r.sim.Requests()) != n || len(traj) != 2 || !traj[0].ReplayMatch || !traj[1].ReplayMatch || traj[1].API != gateway.CallOpenAIResponses {
		t.Fatalf("replay records %+v", traj)
	}
}

// TestResponsesProviderRefusals: a provider's 429 passes through as it
// came; a provider that refuses the gateway's key (and echoes it) is a
// 502 naming no key, nothing charged, no recorded body holding the key.
func TestResponsesProviderRefusals(t *testing.T) {
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "rate"}, Reply: modelsim.Reply{Status: 429, Error: "slow down"}}}}
	r := newRigWith(t, script, modelsim.Options{APIKey: openAIKey}, func(c *gateway.Config) {
		c.Providers = append(c.Providers, gateway.Provider{Name: "wrong-key", API: gateway.APIOpenAI, BaseURL: c.Providers[0].BaseURL, Key: "sk-wrong-SECRET-key-0000000000"})
		c.Models = append(c.Models, gateway.Model{Name: "gpt-wrong", Provider: "wrong-key", Price: gptPrice, MaxOutput: 100})
	})
	tok := r.grant(t, "at-1", gateway.USD, nil)
	status, body := call(t, r.srv.URL, "/v1/responses", tok, codexTurn(true, map[string]any{"role": "user", "content": "rate me"}), nil)
	if status != http.StatusTooManyRequests || !bytes.Contains(body, []byte("slow down")) {
		t.Fatalf("a provider's 429: %d %s", status, body)
	}
	wrong := codexTurn(false)
	wrong["model"] = "gpt-wrong"
	status, body = call(t, r.srv.URL, "/v1/responses", tok, wrong, nil)
	if status != http.StatusBadGateway || bytes.Contains(body, []byte("SECRET")) || !bytes.Contains(body, []byte("credentials")) {
		t.Fatalf("a refused provider key: %d %s", status, body)
	}
	if s := spent(t, r, "attempt/at-1"); s != 0 {
		t.Fatalf("refused calls charged %v", s)
	}
	if tr := trajectory(t, r, "at-1"); len(tr) != 2 || tr[0].Status != http.StatusTooManyRequests || tr[1].Status != http.StatusBadGateway {
		t.Fatalf("recorded %+v", tr)
	}
	for id, b := range r.rec.Blobs() {
		if bytes.Contains(b, []byte("SECRET")) {
			t.Fatalf("recorded blob %s holds a provider key: %s", id, b)
		}
	}
}

// TestResponsesClientLeavesAtTheEnd: a client that closes its stream as
// soon as response.completed came (Codex does), while the provider is
// slow to end the stream, leaves a whole call: its usage charged, no
// error recorded.
func TestResponsesClientLeavesAtTheEnd(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: "The answer is 42.", Usage: modelsim.Usage{Prompt: 900, Cached: 600},
		LingerAfter: 10 * time.Second}), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	b, _ := json.Marshal(codexTurn(true))
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/v1/responses", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && !strings.Contains(sc.Text(), `"type":"response.completed"`) {
	}
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	var calls []gateway.TrajectoryCall
	for len(calls) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		calls = trajectory(t, r, "at-1")
	}
	want := cost(gptPrice, 900, 600, 0, 4)
	if len(calls) != 1 || calls[0].Error != "" || !calls[0].UsageReported || calls[0].Charged != want {
		t.Fatalf("recorded %+v, want no error and a charge of %v", calls, want)
	}
}
