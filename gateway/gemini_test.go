package gateway_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/verify"
)

// geminiKey is the Gemini provider's key of the tests.
const geminiKey = "AIza-provider-SECRET-gemini-5555555555"

// geminiPrice is the price of gemini-sim, dollars per million tokens.
var geminiPrice = gateway.PriceUSD{Input: 1.25, Output: 10, CachedInput: 0.3125}

// withGemini adds a Gemini provider (the scripted server) and its model
// gemini-sim (upstream gemini-sim-2026) to a test configuration.
func withGemini(c *gateway.Config) {
	base := c.Providers[1].BaseURL // the scripted server's root
	c.Providers = append(c.Providers, gateway.Provider{Name: "sim-gemini", API: gateway.APIGemini, BaseURL: base, Key: geminiKey})
	c.Models = append(c.Models, gateway.Model{Name: "gemini-sim", Provider: "sim-gemini", Upstream: "gemini-sim-2026", Price: geminiPrice, MaxOutput: 4096})
}

// geminiCall posts body to a Gemini path with token (in x-goog-api-key,
// or in ?key= when inQuery) and returns the status, the body and the
// chain head (header or trailer).
func geminiCall(t testing.TB, base, path, token string, inQuery bool, body any) (int, []byte, string) {
	t.Helper()
	b, ok := body.([]byte)
	if !ok {
		b, _ = json.Marshal(body)
	}
	url := base + path
	if inQuery && token != "" {
		sep := "?"
		if strings.Contains(url, "?") {
			sep = "&"
		}
		url += sep + "key=" + token
	}
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if !inQuery && token != "" {
		req.Header.Set("x-goog-api-key", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the answer: %v", err)
	}
	head := resp.Header.Get(gateway.ChainHeader)
	if head == "" {
		head = resp.Trailer.Get(gateway.ChainHeader)
	}
	return resp.StatusCode, out, head
}

const (
	generatePath = "/v1beta/models/gemini-sim:generateContent"
	streamPath   = "/v1beta/models/gemini-sim:streamGenerateContent?alt=sse"
)

// geminiTurns are a Gemini CLI-like agent's two requests: the task, then
// the task, the model's run_shell_command call and its result.
func geminiTurns(extra map[string]any) (first, second map[string]any) {
	tools := []any{map[string]any{"functionDeclarations": []any{
		map[string]any{"name": "run_shell_command", "parameters": map[string]any{"type": "OBJECT", "properties": map[string]any{"command": map[string]any{"type": "STRING"}}}},
		map[string]any{"name": "write_file"}}}}
	user := map[string]any{"role": "user", "parts": []any{map[string]any{"text": "Find the answer."}}}
	body := func(contents ...any) map[string]any {
		b := map[string]any{"contents": contents, "tools": tools, "systemInstruction": map[string]any{"parts": []any{map[string]any{"text": "You are an agent."}}}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	first = body(user)
	second = body(user,
		map[string]any{"role": "model", "parts": []any{map[string]any{"functionCall": map[string]any{"id": "c1", "name": "run_shell_command", "args": map[string]any{"command": "cat answer.txt"}}}}},
		map[string]any{"role": "user", "parts": []any{map[string]any{"functionResponse": map[string]any{"id": "c1", "name": "run_shell_command", "response": map[string]any{"output": "ANSWER=42"}}}}})
	return first, second
}

// geminiScript answers the first turn with a run_shell_command call and
// the second, after its result, with the answer (with cached and
// thinking tokens).
func geminiScript() modelsim.Script {
	return modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{API: "gemini", ToolResultContains: "ANSWER=42"}, Reply: modelsim.Reply{Content: "The answer is 42.",
			Usage: modelsim.Usage{Prompt: 1500, Cached: 1000, Thoughts: 300}}},
		{When: modelsim.Cond{API: "gemini", Turn: 1}, Reply: modelsim.Reply{
			ToolCalls: []modelsim.ToolCall{{ID: "c1", Name: "run_shell_command", Arguments: `{"command":"cat answer.txt"}`}},
			Usage:     modelsim.Usage{Prompt: 1200, Thoughts: 50}}},
	}}
}

// geminiParts are the parts of the first candidate of a
// GenerateContentResponse.
func geminiParts(t testing.TB, body []byte) []map[string]json.RawMessage {
	t.Helper()
	var r struct {
		Candidates []struct {
			Content struct {
				Parts []map[string]json.RawMessage `json:"parts"`
			} `json:"content"`
		} `json:"candidates"`
	}
	if err := json.Unmarshal(body, &r); err != nil || len(r.Candidates) == 0 {
		t.Fatalf("not a GenerateContentResponse (%v): %s", err, body)
	}
	return r.Candidates[0].Content.Parts
}

// checkForwarded checks what the provider got: the upstream model's URL
// for method, the provider's key in x-goog-api-key, and the attempt's
// token nowhere (URL, headers, body).
func checkForwarded(t *testing.T, got modelsim.Recorded, method, token string) {
	t.Helper()
	if got.Path != "/v1beta/models/gemini-sim-2026:"+method || got.Header.Get("x-goog-api-key") != geminiKey {
		t.Fatalf("provider got %s with key %q", got.Path, got.Header.Get("x-goog-api-key"))
	}
	for k, vs := range got.Header {
		for _, v := range vs {
			if strings.Contains(v, token) {
				t.Fatalf("the attempt's token was forwarded in header %s", k)
			}
		}
	}
	if bytes.Contains(got.Body, []byte(token)) {
		t.Fatal("the attempt's token was forwarded in the body")
	}
}

// TestGeminiFunctionCallRoundTrip: a Gemini agent's two turns, not
// streamed: the function call passes to the agent and its result back
// to the model; each call is bounded, priced from usageMetadata (thinking
// tokens as output, cached tokens at the cached price), recorded and
// chained.
func TestGeminiFunctionCallRoundTrip(t *testing.T) {
	r := newRig(t, geminiScript(), withGemini)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first, second := geminiTurns(map[string]any{"generationConfig": map[string]any{"maxOutputTokens": 9000, "temperature": 0}})
	status, out, head1 := geminiCall(t, r.srv.URL, generatePath, tok, false, first)
	if status != http.StatusOK || head1 == "" {
		t.Fatalf("%d %s", status, out)
	}
	parts := geminiParts(t, out)
	if len(parts) != 1 || !bytes.Contains(parts[0]["functionCall"], []byte(`"name":"run_shell_command"`)) ||
		!bytes.Contains(parts[0]["functionCall"], []byte(`"args":{"command":"cat answer.txt"}`)) {
		t.Fatalf("answer parts %s", out)
	}
	status, out, head2 := geminiCall(t, r.srv.URL, generatePath, tok, true, second)
	if status != http.StatusOK || !bytes.Contains(out, []byte("The answer is 42.")) {
		t.Fatalf("%d %s", status, out)
	}
	reqs := r.sim.Requests()
	if len(reqs) != 2 {
		t.Fatalf("provider got %d requests", len(reqs))
	}
	for _, got := range reqs {
		checkForwarded(t, got, "generateContent", tok)
	}
	var fwd struct {
		Contents         []json.RawMessage `json:"contents"`
		GenerationConfig map[string]any    `json:"generationConfig"`
	}
	if err := json.Unmarshal(reqs[1].Body, &fwd); err != nil {
		t.Fatal(err)
	}
	if fwd.GenerationConfig["maxOutputTokens"] != float64(4096) || fwd.GenerationConfig["temperature"] != float64(0) || len(fwd.Contents) != 3 ||
		!bytes.Contains(fwd.Contents[2], []byte(`"functionResponse"`)) {
		t.Fatalf("forwarded %s: want maxOutputTokens lowered to the model's 4096, the rest as sent", reqs[1].Body)
	}
	traj := trajectory(t, r, "at-1")
	if len(traj) != 2 {
		t.Fatalf("%d calls recorded", len(traj))
	}
	firstOut := int64(1 + len(modelsim.Tokens(`{"command":"cat answer.txt"}`)))
	want := []struct {
		usage gateway.Usage
		cost  gateway.Money
	}{
		{gateway.Usage{Input: 1200, Output: firstOut + 50}, cost(geminiPrice, 1200, 0, 0, firstOut+50)},
		{gateway.Usage{Input: 1500, Output: 4 + 300, CachedInput: 1000}, cost(geminiPrice, 1500, 1000, 0, 4+300)},
	}
	var total gateway.Money
	for i, c := range traj {
		if c.API != gateway.CallGeminiGenerate || c.Model != "gemini-sim" || c.Upstream != "gemini-sim-2026" || c.Stream || c.Status != 200 ||
			!c.UsageReported || c.Usage != want[i].usage || c.Cost != want[i].cost || c.Charged != c.Cost || c.MaxOutput != 4096 {
			t.Fatalf("call %d recorded %+v; want usage %+v costing %v", i, c.Call, want[i].usage, want[i].cost)
		}
		total += c.Cost
	}
	if s := spent(t, r, "attempt/at-1"); s != total {
		t.Fatalf("attempt spent %v, want %v", s, total)
	}
	if !bytes.Equal(traj[1].ResponseBody, out) {
		t.Fatalf("recorded answer %s, the agent got %s", traj[1].ResponseBody, out)
	}
	ex := gateway.Exchanges(traj)
	if head1 != verify.Head("at-1", ex[:1]) || head2 != verify.Head("at-1", ex) {
		t.Fatal("chain heads are not the recorded trajectory's")
	}
	for id, b := range r.rec.Blobs() {
		if bytes.Contains(b, []byte("SECRET")) || bytes.Contains(b, []byte(tok)) {
			t.Fatalf("recorded blob %s holds a key or the token: %s", id, b)
		}
	}
}

// geminiStreamed reads a Gemini SSE answer as a client does: the text,
// the function calls and the last chunk's usageMetadata.
func geminiStreamed(t testing.TB, body []byte) (text string, calls []string, usage map[string]any) {
	t.Helper()
	for _, d := range sseData(body) {
		var c struct {
			Candidates []struct {
				Content struct {
					Parts []struct {
						Text         string          `json:"text"`
						FunctionCall json.RawMessage `json:"functionCall"`
					} `json:"parts"`
				} `json:"content"`
			} `json:"candidates"`
			UsageMetadata map[string]any `json:"usageMetadata"`
		}
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("chunk %s: %v", d, err)
		}
		for _, cand := range c.Candidates {
			for _, p := range cand.Content.Parts {
				text += p.Text
				if p.FunctionCall != nil {
					calls = append(calls, string(p.FunctionCall))
				}
			}
		}
		usage = c.UsageMetadata
	}
	return text, calls, usage
}

// TestGeminiStreaming: both turns streamed (token in ?key=): the agent
// gets Google's chunks; the gateway asks for server-sent events, prices
// the last chunk's usage and records the answer the stream amounts to.
func TestGeminiStreaming(t *testing.T) {
	r := newRig(t, geminiScript(), withGemini)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first, second := geminiTurns(nil)
	status, out, head := geminiCall(t, r.srv.URL, streamPath, tok, true, first)
	if status != http.StatusOK || head == "" {
		t.Fatalf("%d %s", status, out)
	}
	_, calls, _ := geminiStreamed(t, out)
	if len(calls) != 1 || !strings.Contains(calls[0], `"args":{"command":"cat answer.txt"}`) {
		t.Fatalf("streamed function calls %q", calls)
	}
	status, out, _ = geminiCall(t, r.srv.URL, streamPath, tok, false, second)
	text, _, usage := geminiStreamed(t, out)
	if status != http.StatusOK || text != "The answer is 42." || usage["thoughtsTokenCount"] != float64(300) || usage["cachedContentTokenCount"] != float64(1000) {
		t.Fatalf("%d: text %q usage %v", status, text, usage)
	}
	reqs := r.sim.Requests()
	for _, got := range reqs {
		checkForwarded(t, got, "streamGenerateContent", tok)
	}
	traj := trajectory(t, r, "at-1")
	c := traj[1]
	wantUsage := gateway.Usage{Input: 1500, Output: 304, CachedInput: 1000}
	if len(traj) != 2 || !c.Stream || c.Usage != wantUsage || c.Cost != cost(geminiPrice, 1500, 1000, 0, 304) || c.StreamBytes == "" || c.Error != "" {
		t.Fatalf("recorded %+v", c.Call)
	}
	if got := geminiParts(t, c.ResponseBody); len(got) != 1 || string(got[0]["text"]) != `"The answer is 42."` {
		t.Fatalf("recorded answer %s", c.ResponseBody)
	}
	if got := geminiParts(t, traj[0].ResponseBody); len(got) != 1 || got[0]["functionCall"] == nil {
		t.Fatalf("recorded first answer %s", traj[0].ResponseBody)
	}
}

// TestGeminiBudgetBound: a small budget lowers maxOutputTokens (and a
// thinking budget above it) so that the call's bound fits; a reply that
// ignores it is charged the bound, never more; a budget that cannot pay
// a minimal call is refused with 402 in Gemini's error format.
func TestGeminiBudgetBound(t *testing.T) {
	script := modelsim.Script{Default: &modelsim.Reply{Content: strings.Repeat("word ", 400), IgnoreMaxTokens: true,
		Usage: modelsim.Usage{Prompt: 100, Thoughts: 2000}}}
	r := newRig(t, script, withGemini)
	budget, _ := gateway.Dollars(0.01)
	tok := r.grant(t, "at-1", budget, nil)
	first, _ := geminiTurns(map[string]any{"generationConfig": map[string]any{"thinkingConfig": map[string]any{"thinkingBudget": 8192, "includeThoughts": true}}})
	status, out, _ := geminiCall(t, r.srv.URL, generatePath, tok, false, first)
	if status != http.StatusOK {
		t.Fatalf("%d %s", status, out)
	}
	var fwd struct {
		GenerationConfig struct {
			MaxOutputTokens int64 `json:"maxOutputTokens"`
			ThinkingConfig  struct {
				ThinkingBudget int64 `json:"thinkingBudget"`
			} `json:"thinkingConfig"`
		} `json:"generationConfig"`
	}
	if err := json.Unmarshal(r.sim.Requests()[0].Body, &fwd); err != nil {
		t.Fatal(err)
	}
	c := trajectory(t, r, "at-1")[0]
	gc := fwd.GenerationConfig
	// The plan, computed here: the input bound (on the longest body the
	// provider could get: the one with the model's 4096 and 4095) at the
	// worst input price, the rest of the budget in output tokens.
	longest := len(r.sim.Requests()[0].Body) - len(strconv.FormatInt(gc.MaxOutputTokens, 10)) - len(strconv.FormatInt(gc.ThinkingConfig.ThinkingBudget, 10)) + 8
	in := gateway.InputBound(longest, 0, gateway.Model{InputOverhead: gateway.DefaultInputOverhead})
	price, _ := gateway.PerMillion(geminiPrice.Input, geminiPrice.Output, geminiPrice.CachedInput, 0)
	wantMax := (int64(budget) - in*int64(price.Input)) / int64(price.Output)
	if gc.MaxOutputTokens != wantMax || wantMax >= 4096 || gc.ThinkingConfig.ThinkingBudget != wantMax-1 || c.MaxOutput != wantMax {
		t.Fatalf("forwarded maxOutputTokens %d thinkingBudget %d (recorded %d); want %d and %d", gc.MaxOutputTokens, gc.ThinkingConfig.ThinkingBudget, c.MaxOutput, wantMax, wantMax-1)
	}
	if c.Cost <= c.Bound || c.Charged != c.Bound || c.Overrun != c.Cost-c.Bound || c.Bound > budget {
		t.Fatalf("a reply over its bound: cost %v bound %v charged %v overrun %v (budget %v)", c.Cost, c.Bound, c.Charged, c.Overrun, budget)
	}
	// What is left cannot pay for a call: refused before the provider.
	n := len(r.sim.Requests())
	for range 3 {
		status, out, _ = geminiCall(t, r.srv.URL, generatePath, tok, false, first)
		if status == http.StatusPaymentRequired {
			break
		}
	}
	var e struct {
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
			Status  string `json:"status"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out, &e); err != nil || status != http.StatusPaymentRequired || e.Error.Code != 402 || e.Error.Status != "RESOURCE_EXHAUSTED" ||
		!strings.Contains(e.Error.Message, "budget_exhausted") {
		t.Fatalf("an exhausted budget: %d %s", status, out)
	}
	if s := spent(t, r, "attempt/at-1"); s > budget {
		t.Fatalf("spent %v over the budget %v", s, budget)
	}
	if len(r.sim.Requests()) > n+2 {
		t.Fatal("refused calls reached the provider")
	}
}

// TestGeminiRefusals: what cannot be bounded or recorded whole is refused
// before the provider, with a 400 in Gemini's format naming it.
func TestGeminiRefusals(t *testing.T) {
	r := newRig(t, geminiScript(), withGemini)
	tok := r.grant(t, "at-1", gateway.USD, func(g *gateway.Grant) { g.Models = []string{"gemini-sim", "gpt-sim"} })
	user := []any{map[string]any{"role": "user", "parts": []any{map[string]any{"text": "hi"}}}}
	for _, tc := range []struct {
		name, path string
		body       map[string]any
		status     int
		names      string
	}{
		{"google search", generatePath, map[string]any{"contents": user, "tools": []any{map[string]any{"googleSearch": map[string]any{}}}}, 400, "googleSearch"},
		{"code execution", streamPath, map[string]any{"contents": user, "tools": []any{map[string]any{"codeExecution": map[string]any{}}}}, 400, "codeExecution"},
		{"url context", generatePath, map[string]any{"contents": user, "tools": []any{map[string]any{"functionDeclarations": []any{}}, map[string]any{"urlContext": map[string]any{}}}}, 400, "urlContext"},
		{"server-side cache", generatePath, map[string]any{"contents": user, "cachedContent": "cachedContents/abc123"}, 400, "cachedContent"},
		{"uploaded file", generatePath, map[string]any{"contents": []any{map[string]any{"role": "user", "parts": []any{map[string]any{"fileData": map[string]any{"fileUri": "files/x"}}}}}}, 400, "fileData"},
		{"stream without sse", "/v1beta/models/gemini-sim:streamGenerateContent", map[string]any{"contents": user}, 400, "alt=sse"},
		{"model of another API", "/v1beta/models/gpt-sim:generateContent", map[string]any{"contents": user}, 400, "/v1/chat/completions"},
		{"unknown model", "/v1beta/models/gemini-9:generateContent", map[string]any{"contents": user}, 404, "gemini-9"},
		{"unknown method", "/v1beta/models/gemini-sim:embedContent", map[string]any{"contents": user}, 404, "embedContent"},
	} {
		status, out, _ := geminiCall(t, r.srv.URL, tc.path, tok, false, tc.body)
		var e struct {
			Error struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
				Status  string `json:"status"`
			} `json:"error"`
		}
		if err := json.Unmarshal(out, &e); err != nil || status != tc.status || e.Error.Code != tc.status || e.Error.Status == "" || !strings.Contains(e.Error.Message, tc.names) {
			t.Errorf("%s: %d %s; want %d naming %s", tc.name, status, out, tc.status, tc.names)
		}
	}
	// A Gemini model at OpenAI's endpoint is told where it is served.
	status, out := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gemini-sim", nil), nil)
	if status != 400 || !bytes.Contains(out, []byte("/v1beta/models/{model}:generateContent")) {
		t.Fatalf("gemini-sim at chat completions: %d %s", status, out)
	}
	if n := len(r.sim.Requests()); n != 0 {
		t.Fatalf("refused calls reached the provider %d times", n)
	}
	if s := spent(t, r, "attempt/at-1"); s != 0 {
		t.Fatalf("refused calls charged %v", s)
	}
	// No token, or an unknown one: 401 UNAUTHENTICATED.
	for _, token := range []string{"", "rpn-nope"} {
		status, out, _ := geminiCall(t, r.srv.URL, generatePath, token, true, map[string]any{"contents": user})
		if status != 401 || !bytes.Contains(out, []byte(`"UNAUTHENTICATED"`)) {
			t.Errorf("token %q: %d %s", token, status, out)
		}
	}
}

// TestGeminiCountTokensAndModels: countTokens is forwarded, answered,
// recorded in the trajectory and chain, and charged nothing; the model
// list names the Gemini models the token may call.
func TestGeminiCountTokensAndModels(t *testing.T) {
	r := newRig(t, geminiScript(), withGemini)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	body := map[string]any{"contents": []any{map[string]any{"role": "user", "parts": []any{map[string]any{"text": "count me"}}}}}
	status, out, head := geminiCall(t, r.srv.URL, "/v1beta/models/gemini-sim:countTokens", tok, false, body)
	if status != 200 || !bytes.Contains(out, []byte(`"totalTokens":`)) || head == "" {
		t.Fatalf("%d %s head %q", status, out, head)
	}
	withRequest := map[string]any{"generateContentRequest": map[string]any{"model": "models/gemini-sim", "contents": body["contents"]}}
	if status, out, _ := geminiCall(t, r.srv.URL, "/v1beta/models/gemini-sim:countTokens", tok, true, withRequest); status != 200 {
		t.Fatalf("%d %s", status, out)
	}
	reqs := r.sim.Requests()
	checkForwarded(t, reqs[0], "countTokens", tok)
	if !bytes.Contains(reqs[1].Body, []byte(`"model":"models/gemini-sim-2026"`)) {
		t.Fatalf("forwarded %s: the inner request must name the upstream model", reqs[1].Body)
	}
	traj := trajectory(t, r, "at-1")
	if len(traj) != 2 || traj[0].API != gateway.CallGeminiCountTokens || traj[0].Status != 200 || traj[0].Cost != 0 || traj[0].Charged != 0 ||
		!bytes.Equal(traj[0].ResponseBody, out) || traj[0].Chain != head {
		t.Fatalf("recorded %+v", traj)
	}
	if s := spent(t, r, "attempt/at-1"); s != 0 {
		t.Fatalf("countTokens charged %v", s)
	}

	get := func(path string) (int, []byte) {
		req, _ := http.NewRequest(http.MethodGet, r.srv.URL+path, nil)
		req.Header.Set("x-goog-api-key", tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	status, out = get("/v1beta/models")
	var list struct {
		Models []struct {
			Name             string   `json:"name"`
			OutputTokenLimit int64    `json:"outputTokenLimit"`
			Methods          []string `json:"supportedGenerationMethods"`
		} `json:"models"`
	}
	if err := json.Unmarshal(out, &list); err != nil || status != 200 || len(list.Models) != 1 || list.Models[0].Name != "models/gemini-sim" ||
		list.Models[0].OutputTokenLimit != 4096 {
		t.Fatalf("model list: %d %s", status, out)
	}
	if status, out = get("/v1beta/models/gemini-sim"); status != 200 || !bytes.Contains(out, []byte(`"name":"models/gemini-sim"`)) {
		t.Fatalf("one model: %d %s", status, out)
	}
	if status, _ = get("/v1beta/models/gpt-sim"); status != 404 {
		t.Fatalf("a model of another API: %d", status)
	}
}

// TestGeminiReplay: a replay of a Gemini attempt is answered with the
// recorded answers (a stream with the recorded stream), free, without the
// provider.
func TestGeminiReplay(t *testing.T) {
	r := newRig(t, geminiScript(), withGemini)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first, second := geminiTurns(nil)
	var recorded [][]byte
	for i, b := range []map[string]any{first, second} {
		path := generatePath
		if i == 1 {
			path = streamPath
		}
		status, out, _ := geminiCall(t, r.srv.URL, path, tok, false, b)
		if status != 200 {
			t.Fatalf("%d %s", status, out)
		}
		recorded = append(recorded, out)
	}
	upstream := len(r.sim.Requests())
	rtok := r.grant(t, "rp-1", gateway.USD, func(g *gateway.Grant) { g.Replay = "at-1" })
	for i, b := range []map[string]any{first, second} {
		path := generatePath
		if i == 1 {
			path = streamPath
		}
		status, out, head := geminiCall(t, r.srv.URL, path, rtok, true, b)
		if status != 200 || !bytes.Equal(out, recorded[i]) || head == "" {
			t.Fatalf("replayed call %d: %d %s; want %s", i, status, out, recorded[i])
		}
	}
	if len(r.sim.Requests()) != upstream || spent(t, r, "attempt/rp-1") != 0 {
		t.Fatal("the replay reached the provider or was charged")
	}
	traj := trajectory(t, r, "rp-1")
	if len(traj) != 2 || traj[0].ReplayOf != "at-1/0" || !traj[0].ReplayMatch || traj[1].ReplayOf != "at-1/1" || !traj[1].ReplayMatch ||
		traj[1].API != gateway.CallGeminiGenerate {
		t.Fatalf("replay records %+v", traj)
	}
}

// TestGeminiProviderKeyScrubbed: a provider that echoes the gateway's
// key in an error is not passed on and its message is recorded scrubbed.
func TestGeminiProviderKeyScrubbed(t *testing.T) {
	r := newRigWith(t, geminiScript(), modelsim.Options{APIKey: "AIza-other-key-0000"}, withGemini)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first, _ := geminiTurns(nil)
	status, out, _ := geminiCall(t, r.srv.URL, generatePath, tok, false, first)
	if status != http.StatusBadGateway || bytes.Contains(out, []byte("SECRET")) || !bytes.Contains(out, []byte("credentials")) {
		t.Fatalf("%d %s", status, out)
	}
	if got := r.sim.Requests()[0]; !strings.Contains(got.Header.Get("x-goog-api-key"), "SECRET") {
		t.Fatal("the provider's key was not sent")
	}
	for id, b := range r.rec.Blobs() {
		if bytes.Contains(b, []byte("SECRET")) {
			t.Fatalf("recorded blob %s holds the provider key: %s", id, b)
		}
	}
}

// newGeminiP2PNet is newP2PNet with the Gemini provider and model.
func newGeminiP2PNet(t testing.TB, script modelsim.Script) *p2pNet {
	t.Helper()
	n := newP2PNet(t, script)
	cfg := testConfig(n.sim.URL())
	withGemini(&cfg)
	gw, err := gateway.New(cfg, n.tokens, n.ledger, n.rec)
	if err != nil {
		t.Fatal(err)
	}
	*n.gw = *gw
	return n
}

// TestGeminiEndToEnd: a Gemini agent's turns through a node's proxy over
// libp2p, streamed and not, the token in ?key= and in x-goog-api-key: the
// node forwards Gemini's paths (and no other), the answers arrive whole,
// and the trajectory and charge are the gateway's.
func TestGeminiEndToEnd(t *testing.T) {
	n := newGeminiP2PNet(t, geminiScript())
	nodeHost, proxy, _ := n.node(t, "at-1")
	n.rig.node = nodeHost.ID()
	tok := n.grant(t, "at-1", gateway.USD, nil)
	first, second := geminiTurns(nil)
	status, out, _ := geminiCall(t, proxy.URL(), streamPath, tok, true, first)
	if _, calls, _ := geminiStreamed(t, out); status != 200 || len(calls) != 1 {
		t.Fatalf("%d %s", status, out)
	}
	status, out, head := geminiCall(t, proxy.URL(), generatePath, tok, false, second)
	if status != 200 || !bytes.Contains(out, []byte("The answer is 42.")) || head == "" {
		t.Fatalf("%d %s (head %q)", status, out, head)
	}
	traj := trajectory(t, n.rig, "at-1")
	if len(traj) != 2 || traj[1].Chain != head || spent(t, n.rig, "attempt/at-1") != traj[0].Cost+traj[1].Cost || traj[0].Cost == 0 {
		t.Fatalf("trajectory %+v", traj)
	}
	req, _ := http.NewRequest(http.MethodGet, proxy.URL()+"/v1beta/models?key="+tok, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !bytes.Contains(b, []byte(`"models/gemini-sim"`)) {
		t.Fatalf("model list through the node: %d %s", resp.StatusCode, b)
	}
	for _, path := range []string{"/v1beta/modelsx", "/v1beta/tunedModels/x:generateContent"} {
		status, out, _ := geminiCall(t, proxy.URL(), path, tok, false, first)
		if status != 404 {
			t.Fatalf("%s through the node: %d %s", path, status, out)
		}
	}
}

// urlRecorder is a transport that notes every URL the gateway calls.
type urlRecorder struct {
	mu   sync.Mutex
	urls []string
}

func (u *urlRecorder) RoundTrip(r *http.Request) (*http.Response, error) {
	u.mu.Lock()
	u.urls = append(u.urls, r.URL.String())
	u.mu.Unlock()
	return http.DefaultTransport.RoundTrip(r)
}

// TestGeminiForwardedURL: the provider is called at the upstream model's
// URL, a stream with alt=sse and nothing else in the query: neither the
// attempt's token (which came as ?key=) nor the provider's key.
func TestGeminiForwardedURL(t *testing.T) {
	r := newRig(t, geminiScript(), withGemini)
	urls := &urlRecorder{}
	cfg := testConfig(r.sim.URL())
	withGemini(&cfg)
	gw, err := gateway.New(cfg, r.tokens, r.ledger, r.rec, gateway.WithHTTPClient(&http.Client{Transport: urls}))
	if err != nil {
		t.Fatal(err)
	}
	*r.gw = *gw
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first, _ := geminiTurns(nil)
	for _, path := range []string{generatePath, streamPath, "/v1beta/models/gemini-sim:countTokens"} {
		if status, out, _ := geminiCall(t, r.srv.URL, path, tok, true, first); status != 200 {
			t.Fatalf("%s: %d %s", path, status, out)
		}
	}
	base := r.sim.URL() + "/v1beta/models/gemini-sim-2026:"
	want := []string{base + "generateContent", base + "streamGenerateContent?alt=sse", base + "countTokens"}
	if strings.Join(urls.urls, " ") != strings.Join(want, " ") {
		t.Fatalf("the gateway called %q, want %q", urls.urls, want)
	}
}
