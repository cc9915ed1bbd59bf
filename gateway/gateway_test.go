package gateway_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/internal/modelsim"
)

// Provider keys of the tests: they must never reach a node.
const (
	openAIKey    = "sk-provider-SECRET-openai-0123456789"
	anthropicKey = "sk-ant-provider-SECRET-9876543210"
)

// Prices of the test models, dollars per million tokens.
var (
	gptPrice    = gateway.PriceUSD{Input: 2, Output: 8, CachedInput: 0.5}
	claudePrice = gateway.PriceUSD{Input: 3, Output: 15, CachedInput: 0.3, CacheWrite: 3.75}
)

func testConfig(simURL string) gateway.Config {
	return gateway.Config{
		Providers: []gateway.Provider{
			{Name: "sim-openai", API: gateway.APIOpenAI, BaseURL: simURL + "/v1", Key: openAIKey},
			{Name: "sim-anthropic", API: gateway.APIAnthropic, BaseURL: simURL, Key: anthropicKey},
		},
		Models: []gateway.Model{
			{Name: "gpt-sim", Provider: "sim-openai", Upstream: "gpt-sim-2026", Price: gptPrice, MaxOutput: 4096},
			{Name: "claude-sim", Provider: "sim-anthropic", Price: claudePrice, MaxOutput: 4096},
		},
	}
}

var newPeerID = gateway.NewPeerID

// rig is a gateway in front of a scripted model server, served over
// loopback HTTP with the caller named by the X-Test-Node header (the
// libp2p transport is tested in e2e_test.go).
type rig struct {
	sim    *modelsim.Server
	gw     *gateway.Gateway
	tokens *gateway.TokenTable
	ledger *gateway.MemLedger
	rec    *gateway.MemRecorder
	srv    *httptest.Server
	node   peer.ID

	mu        sync.Mutex
	exhausted []string
}

func newRig(t testing.TB, script modelsim.Script, mutate func(*gateway.Config)) *rig {
	return newRigWith(t, script, modelsim.Options{}, mutate)
}

func newRigWith(t testing.TB, script modelsim.Script, simOpts modelsim.Options, mutate func(*gateway.Config)) *rig {
	t.Helper()
	sim, err := modelsim.Start(script, simOpts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	r := &rig{sim: sim, tokens: gateway.NewTokenTable(), ledger: gateway.NewMemLedger(), rec: gateway.NewMemRecorder(),
		node: newPeerID(t)}
	cfg := testConfig(sim.URL())
	if mutate != nil {
		mutate(&cfg)
	}
	r.gw, err = gateway.New(cfg, r.tokens, r.ledger, r.rec,
		gateway.OnBudgetExhausted(func(_ context.Context, g gateway.Grant, err *gateway.BudgetError) {
			r.mu.Lock()
			r.exhausted = append(r.exhausted, g.Attempt+" "+err.Account)
			r.mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if n := req.Header.Get("X-Test-Node"); n != "none" {
			node := r.node
			if n != "" {
				node, _ = peer.Decode(n)
			}
			req = req.WithContext(modelnet.WithCaller(req.Context(), node))
		}
		r.gw.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// grant issues a token for attempt on the rig's node.
func (r *rig) grant(t testing.TB, attempt string, budget gateway.Money, mutate func(*gateway.Grant)) string {
	t.Helper()
	g := gateway.Grant{Attempt: attempt, Lease: "lease-" + attempt, Node: r.node, Evaluation: "ev-1", Group: "grp",
		Task: "capsule-1", Expires: time.Now().Add(time.Hour),
		Budgets: gateway.Budgets{Attempt: budget, Evaluation: gateway.Unlimited, Group: gateway.Unlimited}}
	if mutate != nil {
		mutate(&g)
	}
	tok, err := r.tokens.Issue(g)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// call posts body to path on the gateway with token; header sets extra
// headers.
func call(t testing.TB, base, path, token string, body any, header map[string]string) (int, []byte) {
	t.Helper()
	b, ok := body.([]byte)
	if !ok {
		b, _ = json.Marshal(body)
	}
	req, _ := http.NewRequest(http.MethodPost, base+path, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		if path == "/v1/messages" {
			req.Header.Set("x-api-key", token)
		} else {
			req.Header.Set("Authorization", "Bearer "+token)
		}
	}
	for k, v := range header {
		req.Header.Set(k, v)
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
	return resp.StatusCode, out
}

func chatBody(model string, extra map[string]any, msgs ...any) map[string]any {
	if len(msgs) == 0 {
		msgs = []any{map[string]any{"role": "user", "content": "Find the answer."}}
	}
	b := map[string]any{"model": model, "messages": msgs,
		"tools": []any{map[string]any{"type": "function", "function": map[string]any{"name": "bash",
			"parameters": map[string]any{"type": "object", "properties": map[string]any{"cmd": map[string]any{"type": "string"}}}}}}}
	for k, v := range extra {
		b[k] = v
	}
	return b
}

// cost is what usage costs at a price, computed here independently of
// the gateway: dollars per million tokens times tokens.
func cost(p gateway.PriceUSD, input, cached, cacheWrite, output int64) gateway.Money {
	usd := (float64(input-cached-cacheWrite)*p.Input + float64(cached)*p.CachedInput + float64(cacheWrite)*p.CacheWrite + float64(output)*p.Output) / 1e6
	m, _ := gateway.Dollars(usd)
	return m
}

func trajectory(t testing.TB, r *rig, attempt string) []gateway.TrajectoryCall {
	t.Helper()
	calls, err := gateway.LoadTrajectory(context.Background(), r.rec, attempt)
	if err != nil {
		t.Fatal(err)
	}
	return calls
}

func spent(t testing.TB, r *rig, key string) gateway.Money {
	a, _ := r.ledger.Balance(context.Background(), key)
	return a.Spent
}

func TestChatNonStreaming(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: "The answer is 42.", Usage: modelsim.Usage{Prompt: 1200, Cached: 200}}), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	status, body := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-sim", map[string]any{"max_tokens": 9000}), nil)
	if status != http.StatusOK || !bytes.Contains(body, []byte("The answer is 42.")) {
		t.Fatalf("%d %s", status, body)
	}
	got := r.sim.Requests()
	if len(got) != 1 {
		t.Fatalf("provider got %d requests", len(got))
	}
	if h := got[0].Header.Get("Authorization"); h != "Bearer "+openAIKey {
		t.Fatalf("provider got Authorization %q, want the provider key", h)
	}
	if bytes.Contains(got[0].Body, []byte(tok)) || strings.Contains(strings.Join(got[0].Header.Values("Authorization"), ""), tok) {
		t.Fatal("the attempt's token reached the provider")
	}
	var fwd map[string]any
	_ = json.Unmarshal(got[0].Body, &fwd)
	if fwd["model"] != "gpt-sim-2026" || fwd["max_tokens"] != 4096.0 {
		t.Fatalf("forwarded model %v and max_tokens %v, want the upstream name and the model's max (4096) under the client's 9000", fwd["model"], fwd["max_tokens"])
	}
	calls := trajectory(t, r, "at-1")
	if len(calls) != 1 {
		t.Fatalf("%d calls recorded", len(calls))
	}
	c := calls[0]
	// "The answer is 42." is 4 tokens.
	want := cost(gptPrice, 1200, 200, 0, 4)
	if c.Usage != (gateway.Usage{Input: 1200, Output: 4, CachedInput: 200}) || c.Cost != want || c.Charged != want || !c.UsageReported {
		t.Fatalf("recorded usage %+v cost %v charged %v, want cost %v", c.Usage, c.Cost, c.Charged, want)
	}
	for _, key := range []string{"attempt/at-1", "evaluation/ev-1", "group/grp"} {
		if s := spent(t, r, key); s != want {
			t.Fatalf("%s spent %v, want %v", key, s, want)
		}
	}
	if c.Node != r.node.String() || c.Task != "capsule-1" || c.Status != 200 || c.Forwarded == "" || c.MaxOutput != 4096 || c.TotalMS <= 0 {
		t.Fatalf("record %+v", c.Call)
	}
	if !bytes.Equal(c.ResponseBody, body) {
		t.Fatalf("recorded answer differs from what the client got")
	}
}

// sseData reads the data lines of an SSE body.
func sseData(body []byte) []string {
	var out []string
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	return out
}

// chatStreamText reassembles a chat stream as a client would: content,
// tool call arguments by index, and whether a usage chunk came.
func chatStreamText(t testing.TB, body []byte) (content string, args []string, usage map[string]any) {
	var b strings.Builder
	for _, d := range sseData(body) {
		if d == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Delta struct {
					Content   string
					ToolCalls []struct {
						Index    int
						Function struct{ Arguments string }
					} `json:"tool_calls"`
				}
			}
			Usage map[string]any
		}
		if err := json.Unmarshal([]byte(d), &c); err != nil {
			t.Fatalf("chunk %q: %v", d, err)
		}
		for _, ch := range c.Choices {
			b.WriteString(ch.Delta.Content)
			for _, tc := range ch.Delta.ToolCalls {
				for len(args) <= tc.Index {
					args = append(args, "")
				}
				args[tc.Index] += tc.Function.Arguments
			}
		}
		if c.Usage != nil {
			usage = c.Usage
		}
	}
	return b.String(), args, usage
}

func TestChatStreamingToolCalls(t *testing.T) {
	script := modelsim.Sequence(modelsim.Reply{Content: "Looking.",
		ToolCalls: []modelsim.ToolCall{{ID: "call_1", Name: "bash", Arguments: `{"cmd":"cat results/answer.txt"}`},
			{ID: "call_2", Name: "bash", Arguments: `{"cmd":"ls"}`}},
		Usage: modelsim.Usage{Prompt: 500}, FirstTokenDelay: 30 * time.Millisecond})
	r := newRig(t, script, nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	for _, withUsage := range []bool{false, true} {
		extra := map[string]any{"stream": true}
		if withUsage {
			extra["stream_options"] = map[string]any{"include_usage": true}
		}
		status, body := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-sim", extra), nil)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, body)
		}
		content, args, usage := chatStreamText(t, body)
		if content != "Looking." || len(args) != 2 || args[0] != `{"cmd":"cat results/answer.txt"}` || args[1] != `{"cmd":"ls"}` {
			t.Fatalf("client got %q and tool calls %q", content, args)
		}
		if (usage != nil) != withUsage {
			t.Fatalf("client asked for usage: %v, got usage chunk %v", withUsage, usage)
		}
	}
	for _, req := range r.sim.Requests() {
		var fwd struct {
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
			Tools json.RawMessage
		}
		_ = json.Unmarshal(req.Body, &fwd)
		if !fwd.StreamOptions.IncludeUsage || !bytes.Contains(fwd.Tools, []byte(`"name":"bash"`)) {
			t.Fatalf("forwarded %s: want include_usage set and the tools passed", req.Body)
		}
	}
	calls := trajectory(t, r, "at-1")
	// Content 1 token ("Looking."), call 1: 1 + 5 ({"cmd":" cat  results /answer. txt"}),
	// call 2: 1 + 2 ({"cmd":" ls"}).
	want := cost(gptPrice, 500, 0, 0, 10)
	for i, c := range calls {
		if c.Cost != want || c.Usage.Output != 10 || !c.Stream || c.StreamBytes == "" || c.Error != "" {
			t.Fatalf("call %d: %+v, want cost %v", i, c.Call, want)
		}
		if c.FirstTokenMS < 30 || c.TotalMS < c.FirstTokenMS {
			t.Fatalf("call %d: first token after %.1f ms, total %.1f ms; the provider waited 30 ms", i, c.FirstTokenMS, c.TotalMS)
		}
		var resp struct {
			Choices []struct {
				Message struct {
					Content   string
					ToolCalls []struct{ ID string } `json:"tool_calls"`
				}
				FinishReason string `json:"finish_reason"`
			}
		}
		if err := json.Unmarshal(c.ResponseBody, &resp); err != nil || resp.Choices[0].Message.Content != "Looking." ||
			len(resp.Choices[0].Message.ToolCalls) != 2 || resp.Choices[0].FinishReason != "tool_calls" {
			t.Fatalf("call %d: recorded answer %s", i, c.ResponseBody)
		}
	}
	if s := spent(t, r, "attempt/at-1"); s != 2*want {
		t.Fatalf("spent %v, want %v", s, 2*want)
	}
}

func TestAnthropicMessages(t *testing.T) {
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{ToolResultContains: "42"}, Reply: modelsim.Reply{Content: "It is 42.", Usage: modelsim.Usage{Prompt: 2000, Cached: 1500, CacheWrite: 300}}},
		{Reply: modelsim.Reply{ToolCalls: []modelsim.ToolCall{{ID: "toolu_1", Name: "bash", Arguments: `{"cmd":"cat a"}`}}, Usage: modelsim.Usage{Prompt: 800, CacheWrite: 600}}},
	}}
	r := newRig(t, script, nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	msgs := []any{map[string]any{"role": "user", "content": "Find the answer."}}
	status, body := call(t, r.srv.URL, "/v1/messages", tok, map[string]any{"model": "claude-sim", "max_tokens": 1000, "messages": msgs,
		"tools": []any{map[string]any{"name": "bash", "input_schema": map[string]any{"type": "object"}}}}, map[string]string{"anthropic-version": "2023-06-01"})
	var first struct {
		Content []struct {
			Type, ID, Name string
			Input          map[string]any
		}
	}
	if err := json.Unmarshal(body, &first); status != 200 || err != nil || len(first.Content) != 1 || first.Content[0].Input["cmd"] != "cat a" {
		t.Fatalf("%d %s", status, body)
	}
	msgs = append(msgs, map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "id": "toolu_1", "name": "bash", "input": first.Content[0].Input}}},
		map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}}})
	status, body = call(t, r.srv.URL, "/v1/messages", tok, map[string]any{"model": "claude-sim", "max_tokens": 1000, "stream": true, "messages": msgs}, nil)
	if status != 200 || !bytes.Contains(body, []byte("event: message_stop")) || !bytes.Contains(body, []byte(`"text":" 42."`)) {
		t.Fatalf("%d %s", status, body)
	}
	got := r.sim.Requests()
	if got[0].Header.Get("x-api-key") != anthropicKey || got[0].Header.Get("anthropic-version") != "2023-06-01" || got[1].Header.Get("anthropic-version") != gateway.DefaultAnthropicVersion {
		t.Fatalf("provider headers %v / %v", got[0].Header, got[1].Header)
	}
	calls := trajectory(t, r, "at-1")
	// Call 1: a tool call of 1 + 3 tokens ({"cmd":" cat  a"}); call 2:
	// "It is 42." 3 tokens.
	w1, w2 := cost(claudePrice, 800, 0, 600, 4), cost(claudePrice, 2000, 1500, 300, 3)
	if calls[0].Cost != w1 || calls[1].Cost != w2 || calls[1].Usage != (gateway.Usage{Input: 2000, Output: 3, CachedInput: 1500, CacheWrite: 300, CacheWrite5m: 300}) {
		t.Fatalf("costs %v %v (usage %+v), want %v %v", calls[0].Cost, calls[1].Cost, calls[1].Usage, w1, w2)
	}
	var msg struct {
		Content []struct{ Type, Text string }
		Usage   map[string]any
	}
	if err := json.Unmarshal(calls[1].ResponseBody, &msg); err != nil || msg.Content[0].Text != "It is 42." || msg.Usage["cache_read_input_tokens"] != 1500.0 {
		t.Fatalf("recorded answer %s", calls[1].ResponseBody)
	}
}

// An agent that keeps calling is stopped at its cap, and spent <= cap.
func TestBudgetCap(t *testing.T) {
	long := strings.Repeat("word ", 300)
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: long}), nil)
	budget := 2 * gateway.USD / 100 // $0.02
	tok := r.grant(t, "at-1", budget, nil)
	var lastBody []byte
	ok, refused := 0, 0
	for i := range 1000 {
		status, body := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-sim", map[string]any{"stream": i%2 == 0}), nil)
		if status == http.StatusPaymentRequired {
			refused++
			lastBody = body
			break
		}
		if status != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, status, body)
		}
		ok++
	}
	if refused != 1 || ok < 3 {
		t.Fatalf("%d calls answered, %d refused: want the calls to stop at the cap", ok, refused)
	}
	var e struct {
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(lastBody, &e); err != nil || e.Error.Type != "budget_exhausted" || !strings.Contains(e.Error.Message, "attempt/at-1 budget") {
		t.Fatalf("refusal %s", lastBody)
	}
	s := spent(t, r, "attempt/at-1")
	if s > budget || s == 0 {
		t.Fatalf("spent %v of a %v cap", s, budget)
	}
	calls := trajectory(t, r, "at-1")
	var charged gateway.Money
	for _, c := range calls {
		charged += c.Charged
	}
	last := calls[len(calls)-1]
	if charged != s || last.Refused != gateway.RefusedBudget || last.Status != http.StatusPaymentRequired || len(calls) != ok+1 {
		t.Fatalf("charged %v (spent %v), last call %+v", charged, s, last.Call)
	}
	if len(r.exhausted) != 1 || r.exhausted[0] != "at-1 attempt/at-1" {
		t.Fatalf("exhaustion reported %v", r.exhausted)
	}
	// The last answered calls were bounded below what the client could
	// get: the plan lowered max_completion_tokens as the budget ran out.
	reqs := r.sim.Requests()
	var lastFwd struct {
		Max int64 `json:"max_completion_tokens"`
	}
	_ = json.Unmarshal(reqs[len(reqs)-1].Body, &lastFwd)
	if lastFwd.Max >= 4096 || lastFwd.Max < gateway.DefaultMinOutputTokens {
		t.Fatalf("the last call asked for %d tokens: want fewer than the model's max as the budget ran out", lastFwd.Max)
	}
	// Refusals never reach the provider.
	if len(reqs) != ok {
		t.Fatalf("provider got %d requests for %d answered calls", len(reqs), ok)
	}
}

// A provider that ignores max_tokens, over-reports, drops usage or cuts
// its stream is charged at most each call's bound; the cap holds.
func TestMisbehavingProvider(t *testing.T) {
	long := strings.Repeat("word ", 2000)
	for _, tc := range []struct {
		name    string
		reply   modelsim.Reply
		stream  bool
		overrun bool
		usage   bool // usage reported
		errText string
	}{
		{"ignores max_tokens", modelsim.Reply{Content: long, IgnoreMaxTokens: true}, true, true, true, ""},
		{"over-reports", modelsim.Reply{Content: "x", OverReport: 1 << 20}, false, true, true, ""},
		{"drops usage", modelsim.Reply{Content: "x y z", DropUsage: true}, true, false, false, ""},
		{"cuts its stream", modelsim.Reply{Content: long, CutAfter: 5}, true, false, false, "stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, modelsim.Sequence(tc.reply), nil)
			budget := gateway.USD / 50
			tok := r.grant(t, "at-1", budget, nil)
			for range 200 {
				status, _ := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-sim", map[string]any{"stream": tc.stream, "max_tokens": 100}), nil)
				if status == http.StatusPaymentRequired {
					break
				}
			}
			s := spent(t, r, "attempt/at-1")
			if s > budget {
				t.Fatalf("spent %v over the %v cap", s, budget)
			}
			calls := trajectory(t, r, "at-1")
			if len(calls) < 2 || calls[len(calls)-1].Refused != gateway.RefusedBudget {
				t.Fatalf("%d calls, the last %+v: want the calls to end refused", len(calls), calls[len(calls)-1].Call)
			}
			for _, c := range calls[:len(calls)-1] {
				if c.Charged > c.Bound || c.Charged+c.Overrun != c.Cost || (c.Overrun > 0) != tc.overrun || c.UsageReported != tc.usage {
					t.Fatalf("call %+v: charged %v of bound %v, overrun %v, cost %v", c.Call, c.Charged, c.Bound, c.Overrun, c.Cost)
				}
				if !tc.usage && c.Cost != c.Bound {
					t.Fatalf("call without usage cost %v, want its bound %v", c.Cost, c.Bound)
				}
				if !strings.Contains(c.Error, tc.errText) {
					t.Fatalf("call error %q, want it to name %q", c.Error, tc.errText)
				}
			}
		})
	}
}

func TestProviderRefusals(t *testing.T) {
	script := modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "rate"}, Reply: modelsim.Reply{Status: 429, Error: "slow down"}}}}
	r := newRigWith(t, script, modelsim.Options{APIKey: openAIKey}, func(c *gateway.Config) {
		c.Providers = append(c.Providers, gateway.Provider{Name: "wrong-key", API: gateway.APIOpenAI, BaseURL: c.Providers[0].BaseURL, Key: "sk-wrong-SECRET-key-0000000000"})
		c.Models = append(c.Models, gateway.Model{Name: "gpt-wrong", Provider: "wrong-key", Price: gptPrice, MaxOutput: 100})
	})
	tok := r.grant(t, "at-1", gateway.USD, nil)
	status, body := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-sim", nil, map[string]any{"role": "user", "content": "rate me"}), nil)
	if status != http.StatusTooManyRequests || !bytes.Contains(body, []byte("slow down")) {
		t.Fatalf("a provider's 429: %d %s", status, body)
	}
	status, body = call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-wrong", nil), nil)
	if status != http.StatusBadGateway || bytes.Contains(body, []byte("SECRET")) || !bytes.Contains(body, []byte("credentials")) {
		t.Fatalf("a refused provider key: %d %s", status, body)
	}
	if s := spent(t, r, "attempt/at-1"); s != 0 {
		t.Fatalf("refused calls charged %v", s)
	}
	for id, b := range r.rec.Blobs() {
		if bytes.Contains(b, []byte("SECRET")) {
			t.Fatalf("recorded blob %s holds a provider key: %s", id, b)
		}
	}
}

func TestRefusedCalls(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: "ok"}), nil)
	tok := r.grant(t, "at-1", gateway.USD, func(g *gateway.Grant) { g.Models = []string{"gpt-sim"} })
	expired := r.grant(t, "at-2", gateway.USD, func(g *gateway.Grant) { g.Expires = time.Now().Add(-time.Second) })
	revoked := r.grant(t, "at-3", gateway.USD, nil)
	r.tokens.Revoke("lease-at-3")
	other := newPeerID(t)
	big := chatBody("gpt-sim", nil, map[string]any{"role": "user", "content": strings.Repeat("x", gateway.DefaultMaxRequestBytes)})
	for _, tc := range []struct {
		name   string
		path   string
		token  string
		body   any
		header map[string]string
		status int
		typ    string
	}{
		{"no transport names the caller", "/v1/chat/completions", tok, chatBody("gpt-sim", nil), map[string]string{"X-Test-Node": "none"}, 403, "permission_error"},
		{"no token", "/v1/chat/completions", "", chatBody("gpt-sim", nil), nil, 401, "authentication_error"},
		{"unknown token", "/v1/chat/completions", "rpn-nope", chatBody("gpt-sim", nil), nil, 401, "authentication_error"},
		{"from another node", "/v1/chat/completions", tok, chatBody("gpt-sim", nil), map[string]string{"X-Test-Node": other.String()}, 403, "permission_error"},
		{"lease ended", "/v1/chat/completions", expired, chatBody("gpt-sim", nil), nil, 401, "authentication_error"},
		{"lease revoked", "/v1/chat/completions", revoked, chatBody("gpt-sim", nil), nil, 401, "authentication_error"},
		{"model not granted", "/v1/messages", tok, map[string]any{"model": "claude-sim", "max_tokens": 5, "messages": []any{map[string]any{"role": "user", "content": "x"}}}, nil, 403, "permission_error"},
		{"unknown model", "/v1/chat/completions", tok, chatBody("gpt-9", nil), nil, 404, "not_found_error"},
		{"model at the wrong endpoint", "/v1/messages", tok, map[string]any{"model": "gpt-sim", "max_tokens": 5, "messages": []any{map[string]any{"role": "user", "content": "x"}}}, nil, 400, "invalid_request_error"},
		{"content the gateway cannot bound", "/v1/chat/completions", tok, chatBody("gpt-sim", nil, map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_audio"}}}), nil, 400, "invalid_request_error"},
		{"not JSON", "/v1/chat/completions", tok, []byte("{"), nil, 400, "invalid_request_error"},
		{"too large", "/v1/chat/completions", tok, big, nil, 413, "request_too_large"},
		{"no such endpoint", "/v1/embeddings", tok, chatBody("gpt-sim", nil), nil, 404, "not_found_error"},
	} {
		status, body := call(t, r.srv.URL, tc.path, tc.token, tc.body, tc.header)
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		_ = json.Unmarshal(body, &e)
		if status != tc.status || e.Error.Type != tc.typ || e.Error.Message == "" {
			t.Errorf("%s: %d %s; want %d %s", tc.name, status, body, tc.status, tc.typ)
		}
		if strings.HasSuffix(tc.path, "messages") && e.Type != "error" {
			t.Errorf("%s: %s is not in Anthropic's error format", tc.name, body)
		}
	}
	if n := len(r.sim.Requests()); n != 0 {
		t.Fatalf("refused calls reached the provider %d times", n)
	}
	for _, a := range []string{"at-1", "at-2", "at-3"} {
		if s := spent(t, r, "attempt/"+a); s != 0 {
			t.Fatalf("%s charged %v for refused calls", a, s)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, r.srv.URL+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var list struct {
		Data []struct{ ID, Object, Type string }
		// Anthropic's list fields.
		HasMore bool   `json:"has_more"`
		FirstID string `json:"first_id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil || len(list.Data) != 1 || list.Data[0].ID != "gpt-sim" ||
		list.Data[0].Object != "model" || list.Data[0].Type != "model" || list.HasMore || list.FirstID != "gpt-sim" {
		t.Fatalf("models: %+v %v", list, err)
	}
}

// TestClientGoesAway: an agent that drops a stream midway cancels the
// call upstream, and the call is charged its bound (its usage never
// came).
func TestClientGoesAway(t *testing.T) {
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: strings.Repeat("slow ", 100), TokenDelay: 20 * time.Millisecond}), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	b, _ := json.Marshal(chatBody("gpt-sim", map[string]any{"stream": true}))
	req, _ := http.NewRequest(http.MethodPost, r.srv.URL+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+tok)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 512)
	if _, err := resp.Body.Read(buf); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // gone after the first bytes
	var calls []gateway.TrajectoryCall
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if calls = trajectory(t, r, "at-1"); len(calls) == 1 {
			break
		}
	}
	if len(calls) != 1 {
		t.Fatal("the call was not recorded")
	}
	c := calls[0]
	if took := time.Since(start); took > 1500*time.Millisecond {
		t.Fatalf("the call ran %s: the provider's 2 s stream was not cancelled", took)
	}
	if c.UsageReported || c.Charged != c.Bound || c.Cost != c.Bound || c.Error == "" {
		t.Fatalf("call %+v: want it charged its bound, without usage, with the reason", c.Call)
	}
	if s := spent(t, r, "attempt/at-1"); s != c.Bound {
		t.Fatalf("spent %v, want the bound %v", s, c.Bound)
	}
}
