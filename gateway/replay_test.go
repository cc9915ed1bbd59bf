package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/verify"
)

// callChain makes a call and returns its status, body and chain head
// (header or trailer).
func callChain(t testing.TB, base, token string, body any) (int, []byte, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	head := resp.Header.Get(gateway.ChainHeader)
	if head == "" {
		head = resp.Trailer.Get(gateway.ChainHeader)
	}
	return resp.StatusCode, out, head
}

func agentTurns() (first, second map[string]any) {
	user := map[string]any{"role": "user", "content": "Find the answer."}
	first = chatBody("gpt-sim", nil, user)
	second = chatBody("gpt-sim", nil, user,
		map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "bash", "arguments": `{"cmd":"cat a"}`}}}},
		map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "the answer is 42"})
	return first, second
}

func agentScriptChat() modelsim.Script {
	return modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{ToolResultContains: "42"}, Reply: modelsim.Reply{Content: "It is 42."}},
		{Reply: modelsim.Reply{ToolCalls: []modelsim.ToolCall{{ID: "call_1", Name: "bash", Arguments: `{"cmd":"cat a"}`}}}},
	}}
}

// TestChainHead: every answer carries the attempt's chain head after it,
// the head of the recorded trajectory as package verify computes it,
// streamed answers in a trailer, refused calls too.
func TestChainHead(t *testing.T) {
	r := newRig(t, agentScriptChat(), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first, second := agentTurns()
	var heads []string
	for _, body := range []map[string]any{first, second} {
		status, out, head := callChain(t, r.srv.URL, tok, body)
		if status != http.StatusOK {
			t.Fatalf("%d %s", status, out)
		}
		heads = append(heads, head)
	}
	stream := chatBody("gpt-sim", map[string]any{"stream": true})
	status, out, head := callChain(t, r.srv.URL, tok, stream)
	if status != http.StatusOK || head == "" {
		t.Fatalf("streamed answer: %d, head %q: %s", status, head, out)
	}
	heads = append(heads, head)
	traj := trajectory(t, r, "at-1")
	ex := gateway.Exchanges(traj)
	for i := range heads {
		if want := verify.Head("at-1", ex[:i+1]); heads[i] != want || traj[i].Chain != want {
			t.Fatalf("head after call %d: header %s, record %s, want %s", i, heads[i], traj[i].Chain, want)
		}
	}
	calls, _ := r.rec.Calls(context.Background(), "at-1")
	if h, err := gateway.ChainOf("at-1", calls); err != nil || h != heads[2] {
		t.Fatalf("ChainOf: %s %v, want %s", h, err, heads[2])
	}
	if f := verify.CheckAppendOnly(ex); len(f) != 0 {
		t.Fatalf("an honest conversation has findings %+v", f)
	}
	// A gateway restarted on the same records continues the chain.
	gw2, err := gateway.New(testConfig(r.sim.URL()), r.tokens, r.ledger, r.rec)
	if err != nil {
		t.Fatal(err)
	}
	*r.gw = *gw2
	_, _, head = callChain(t, r.srv.URL, tok, first)
	if want := verify.Head("at-1", gateway.Exchanges(trajectory(t, r, "at-1"))); head != want {
		t.Fatalf("after a restart: head %s, want %s", head, want)
	}
}

// TestReplay: a replay attempt's calls are answered with the recorded
// answers in order, byte for byte, without calling the provider or
// charging anything; each is recorded naming the recorded call and
// whether the request matched; a call past the recording is refused.
func TestReplay(t *testing.T) {
	r := newRig(t, agentScriptChat(), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	first, second := agentTurns()
	var recorded [][]byte
	for _, body := range []map[string]any{first, second} {
		_, out, _ := callChain(t, r.srv.URL, tok, body)
		recorded = append(recorded, out)
	}
	upstream := len(r.sim.Requests())
	rtok := r.grant(t, "rp-1", gateway.USD, func(g *gateway.Grant) { g.Replay = "at-1" })
	// The replay's tool printed something else at the second step.
	changed := chatBody("gpt-sim", nil, second["messages"].([]any)[:2]...)
	changed["messages"] = append(changed["messages"].([]any), map[string]any{"role": "tool", "tool_call_id": "call_1", "content": "the answer is 41"})
	for i, body := range []map[string]any{first, changed} {
		status, out, head := callChain(t, r.srv.URL, rtok, body)
		if status != http.StatusOK || !bytes.Equal(out, recorded[i]) || head == "" {
			t.Fatalf("replayed call %d: %d, head %q, %s; want the recorded answer %s", i, status, head, out, recorded[i])
		}
	}
	status, out, _ := callChain(t, r.srv.URL, rtok, first)
	if status != http.StatusConflict || !bytes.Contains(out, []byte("made 2 calls")) {
		t.Fatalf("a call past the recording: %d %s", status, out)
	}
	if n := len(r.sim.Requests()); n != upstream {
		t.Fatalf("the provider got %d requests during the replay", n-upstream)
	}
	if s := spent(t, r, "attempt/rp-1"); s != 0 {
		t.Fatalf("the replay was charged %v", s)
	}
	traj := trajectory(t, r, "rp-1")
	if len(traj) != 3 || traj[0].ReplayOf != "at-1/0" || !traj[0].ReplayMatch || traj[1].ReplayOf != "at-1/1" || traj[1].ReplayMatch ||
		traj[2].Refused != gateway.RefusedReplayExhausted {
		t.Fatalf("replay records: %+v", traj)
	}
	// The replay's trajectory is what verify compares: the difference is
	// in the result the answer came from.
	j := verify.Judge(gateway.Exchanges(trajectory(t, r, "at-1")), [][]verify.Exchange{gateway.Exchanges(traj)},
		[]verify.Answer{{Name: "q", Value: json.RawMessage("42")}}, verify.DefaultTolerance())
	if j.Verdict != verify.NeedsReplay {
		t.Fatalf("verdict %s (%s), want %s", j.Verdict, j.Reason, verify.NeedsReplay)
	}
}

// TestNodeProxyChainHead: over libp2p, the node's proxy is told the chain
// head of every answer, plain or streamed (trailer), and the last one is
// the recorded trajectory's head: what the node signs in its report.
func TestNodeProxyChainHead(t *testing.T) {
	n := newP2PNet(t, agentScriptChat())
	h := newHost(t, false)
	if err := h.Connect(context.Background(), peer.AddrInfo{ID: n.coord.ID(), Addrs: n.coord.Addrs()}); err != nil {
		t.Fatal(err)
	}
	n.rig.node = h.ID()
	var mu sync.Mutex
	var heads []string
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	p, err := modelnet.StartProxy(ctx, h, n.coord.ID(), "127.0.0.1:0", modelnet.ProxyOptions{Attempt: "at-1",
		OnChainHead: func(s string) { mu.Lock(); heads = append(heads, s); mu.Unlock() }}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	tok := n.grant(t, "at-1", gateway.USD, nil)
	first, _ := agentTurns()
	for _, body := range []map[string]any{first, chatBody("gpt-sim", map[string]any{"stream": true})} {
		if status, out, _ := callChain(t, p.URL(), tok, body); status != http.StatusOK {
			t.Fatalf("%d %s", status, out)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	want := verify.Head("at-1", gateway.Exchanges(trajectory(t, n.rig, "at-1")))
	if len(heads) != 2 || heads[1] != want {
		t.Fatalf("the node was told heads %v, want 2 ending with %s", heads, want)
	}
}

// convAgent is one conversation of an agent with concurrent
// conversations (a main loop, a sub-agent, a title request): it asks the
// model, runs the tool call it gets (tools maps commands to outputs) and
// asks again with the result, until the model answers in text.
type convAgent struct {
	name   string
	msgs   []any
	tools  map[string]string
	stream bool
	done   bool
	// answers are the answer bodies it got, in order.
	answers [][]byte
}

// assistantOf rebuilds the assistant message of a chat answer, whole or
// streamed, as a client does.
func assistantOf(t testing.TB, body []byte, stream bool) (map[string]any, string) {
	t.Helper()
	type fn struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	}
	type tc struct {
		Index    int    `json:"index"`
		ID       string `json:"id,omitempty"`
		Type     string `json:"type,omitempty"`
		Function fn     `json:"function"`
	}
	var content string
	var calls []tc
	if !stream {
		var r struct {
			Choices []struct {
				Message struct {
					Content   *string `json:"content"`
					ToolCalls []tc    `json:"tool_calls"`
				} `json:"message"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(body, &r); err != nil || len(r.Choices) == 0 {
			t.Fatalf("answer %s: %v", body, err)
		}
		if c := r.Choices[0].Message.Content; c != nil {
			content = *c
		}
		calls = r.Choices[0].Message.ToolCalls
	} else {
		for _, d := range sseData(body) {
			if d == "[DONE]" {
				continue
			}
			var c struct {
				Choices []struct {
					Delta struct {
						Content   string `json:"content"`
						ToolCalls []tc   `json:"tool_calls"`
					} `json:"delta"`
				} `json:"choices"`
			}
			if err := json.Unmarshal([]byte(d), &c); err != nil {
				t.Fatalf("chunk %q: %v", d, err)
			}
			for _, ch := range c.Choices {
				content += ch.Delta.Content
				for _, x := range ch.Delta.ToolCalls {
					for len(calls) <= x.Index {
						calls = append(calls, tc{Index: len(calls), Type: "function"})
					}
					calls[x.Index].ID += x.ID
					calls[x.Index].Function.Name += x.Function.Name
					calls[x.Index].Function.Arguments += x.Function.Arguments
				}
			}
		}
	}
	m := map[string]any{"role": "assistant", "content": content}
	if len(calls) == 0 {
		return m, ""
	}
	var out []any
	for _, c := range calls {
		out = append(out, map[string]any{"id": c.ID, "type": "function", "function": map[string]any{"name": c.Function.Name, "arguments": c.Function.Arguments}})
	}
	m["content"], m["tool_calls"] = nil, out
	var args struct{ Cmd string }
	_ = json.Unmarshal([]byte(calls[0].Function.Arguments), &args)
	return m, calls[0].ID + "\x00" + args.Cmd
}

// step makes the conversation's next call.
func (c *convAgent) step(t testing.TB, base, token string) {
	t.Helper()
	status, out, _ := callChain(t, base, token, chatBody("gpt-sim", map[string]any{"stream": c.stream}, c.msgs...))
	if status != http.StatusOK {
		t.Fatalf("%s, call %d: %d %s", c.name, len(c.answers), status, out)
	}
	c.answers = append(c.answers, out)
	m, toolCall := assistantOf(t, out, c.stream)
	if toolCall == "" {
		c.done = true
		return
	}
	id, cmd, _ := strings.Cut(toolCall, "\x00")
	c.msgs = append(c.msgs, m, map[string]any{"role": "tool", "tool_call_id": id, "content": c.tools[cmd]})
}

// agentConversations are a main loop (m), a sub-agent (s) and a title
// request (t), each two calls but the title's one.
func agentConversations(stream bool) map[byte]*convAgent {
	user := func(s string) any { return map[string]any{"role": "user", "content": s} }
	sys := func(s string) any { return map[string]any{"role": "system", "content": s} }
	return map[byte]*convAgent{
		'm': {name: "main loop", msgs: []any{sys("You are an agent."), user("Find the answer.")}, tools: map[string]string{"cat a": "the answer is 42"}, stream: stream},
		's': {name: "sub-agent", msgs: []any{sys("You are a sub-agent."), user("Find the method.")}, tools: map[string]string{"cat m": "the method is ridge"}, stream: stream},
		't': {name: "title", msgs: []any{sys("Write a title."), user("Find the answer.")}, stream: !stream},
	}
}

func conversationsScript() modelsim.Script {
	return modelsim.Script{Rules: []modelsim.Rule{
		{When: modelsim.Cond{AnyContains: "Write a title"}, Reply: modelsim.Reply{Content: "Finding the answer"}},
		{When: modelsim.Cond{ToolResultContains: "42"}, Reply: modelsim.Reply{Content: "It is 42."}},
		{When: modelsim.Cond{ToolResultContains: "ridge"}, Reply: modelsim.Reply{Content: "Ridge regression."}},
		{When: modelsim.Cond{AnyContains: "Find the method", LastRole: "user"},
			Reply: modelsim.Reply{ToolCalls: []modelsim.ToolCall{{ID: "call_s1", Name: "bash", Arguments: `{"cmd":"cat m"}`}}}},
		{When: modelsim.Cond{LastRole: "user"}, Reply: modelsim.Reply{ToolCalls: []modelsim.ToolCall{{ID: "call_m1", Name: "bash", Arguments: `{"cmd":"cat a"}`}}}},
	}}
}

// TestReplayConversations: an agent's concurrent conversations are
// recorded in one interleaving and replayed in others (one after a
// gateway restart, one with the conversations' calls made at once),
// streamed and not: every replay call is answered from the record with
// the answer its conversation got at that place, the provider gets
// nothing, and the replays verify.
func TestReplayConversations(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			r := newRig(t, conversationsScript(), nil)
			tok := r.grant(t, "at-1", gateway.USD, nil)
			rec := agentConversations(stream)
			for _, k := range []byte("mstsm") {
				rec[k].step(t, r.srv.URL, tok)
			}
			for k, c := range rec {
				if !c.done || len(c.answers) != map[byte]int{'m': 2, 's': 2, 't': 1}[k] {
					t.Fatalf("%s: %d answers, done %v", c.name, len(c.answers), c.done)
				}
			}
			if f := verify.CheckAppendOnly(gateway.Exchanges(trajectory(t, r, "at-1"))); len(f) != 0 {
				t.Fatalf("the recorded conversations have findings %+v", f)
			}
			upstream := len(r.sim.Requests())
			check := func(t *testing.T, replay string, rep map[byte]*convAgent) {
				t.Helper()
				for k, c := range rep {
					// The answers are the recorded ones (a stream is served
					// as it came from the provider, with its usage chunk).
					if len(c.answers) != len(rec[k].answers) {
						t.Fatalf("%s replayed: %d answers, recorded %d", c.name, len(c.answers), len(rec[k].answers))
					}
					for i := range c.answers {
						got, gc := assistantOf(t, c.answers[i], c.stream)
						want, wc := assistantOf(t, rec[k].answers[i], c.stream)
						if gb, _ := json.Marshal(got); gc != wc || !bytes.Equal(gb, mustOK(json.Marshal(want))) {
							t.Fatalf("%s, call %d replayed: answer %s, recorded %s", c.name, i, c.answers[i], rec[k].answers[i])
						}
					}
				}
				traj := trajectory(t, r, replay)
				if len(traj) != 5 {
					t.Fatalf("%d replay calls recorded, want 5", len(traj))
				}
				for _, c := range traj {
					if c.ReplayOf == "" || !c.ReplayMatch || c.Provider != "replay" {
						t.Fatalf("replay call %d: %+v", c.Seq, c.Call)
					}
				}
				j := verify.Judge(gateway.Exchanges(trajectory(t, r, "at-1")), [][]verify.Exchange{gateway.Exchanges(traj)},
					[]verify.Answer{{Name: "q", Value: json.RawMessage("42")}}, verify.DefaultTolerance())
				if j.Verdict != verify.Verified || len(j.Comparisons[0].Unreached) != 0 || j.Comparisons[0].Count(verify.Same) != 2 {
					t.Fatalf("verdict %s (%s), comparison %+v", j.Verdict, j.Reason, j.Comparisons[0])
				}
				if s := spent(t, r, "attempt/"+replay); s != 0 {
					t.Fatalf("the replay was charged %v", s)
				}
			}
			t.Run("another order, across a restart", func(t *testing.T) {
				rtok := r.grant(t, "rp-1", gateway.USD, func(g *gateway.Grant) { g.Replay = "at-1" })
				rep := agentConversations(stream)
				for i, k := range []byte("tssmm") {
					if i == 3 {
						gw2, err := gateway.New(testConfig(r.sim.URL()), r.tokens, r.ledger, r.rec)
						if err != nil {
							t.Fatal(err)
						}
						*r.gw = *gw2
					}
					rep[k].step(t, r.srv.URL, rtok)
				}
				check(t, "rp-1", rep)
				status, out, _ := callChain(t, r.srv.URL, rtok, chatBody("gpt-sim", nil, rep['t'].msgs...))
				if status != http.StatusConflict || !bytes.Contains(out, []byte("made 5 calls")) {
					t.Fatalf("a call past the recording: %d %s", status, out)
				}
			})
			t.Run("at once", func(t *testing.T) {
				rtok := r.grant(t, "rp-2", gateway.USD, func(g *gateway.Grant) { g.Replay = "at-1" })
				rep := agentConversations(stream)
				var wg sync.WaitGroup
				for _, c := range rep {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for !c.done {
							c.step(t, r.srv.URL, rtok)
						}
					}()
				}
				wg.Wait()
				check(t, "rp-2", rep)
			})
			if n := len(r.sim.Requests()); n != upstream {
				t.Fatalf("the provider got %d requests during the replays", n-upstream)
			}
		})
	}
}

func mustOK[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestReplayUnmatched: a replay call that starts a conversation the
// recorded attempt never had is refused (409, replay_unmatched) while
// recorded calls are left; they are reported unreached.
func TestReplayUnmatched(t *testing.T) {
	r := newRig(t, conversationsScript(), nil)
	tok := r.grant(t, "at-1", gateway.USD, nil)
	rec := agentConversations(false)
	for _, k := range []byte("mm") {
		rec[k].step(t, r.srv.URL, tok)
	}
	rtok := r.grant(t, "rp-1", gateway.USD, func(g *gateway.Grant) { g.Replay = "at-1" })
	rep := agentConversations(false)
	status, out, _ := callChain(t, r.srv.URL, rtok, chatBody("gpt-sim", nil, rep['s'].msgs...))
	if status != http.StatusConflict || !bytes.Contains(out, []byte("starts a conversation")) {
		t.Fatalf("an unrecorded conversation: %d %s", status, out)
	}
	rep['m'].step(t, r.srv.URL, rtok)
	traj := trajectory(t, r, "rp-1")
	if len(traj) != 2 || traj[0].Refused != gateway.RefusedReplayUnmatched || traj[1].ReplayOf != "at-1/0" {
		t.Fatalf("replay records: %+v", traj)
	}
	c := verify.Compare(gateway.Exchanges(trajectory(t, r, "at-1")), gateway.Exchanges(traj), nil, verify.DefaultTolerance())
	if !slices.Equal(c.Unreached, []int{1}) {
		t.Fatalf("unreached %v, want the main loop's second call", c.Unreached)
	}
}

// TestBudgetCapParallel: an attempt whose conversations call at once
// (a main loop, sub-agents, side calls) is held to its budget as one
// calling in turn: nothing is spent past the cap, every call is charged
// once, and each conversation is refused with 402 only when the money is
// spent (a call whose budget is held by calls in flight waits for them).
func TestBudgetCapParallel(t *testing.T) {
	long := strings.Repeat("word ", 300)
	r := newRig(t, modelsim.Sequence(modelsim.Reply{Content: long}), nil)
	budget := 2 * gateway.USD / 100
	tok := r.grant(t, "at-1", budget, nil)
	const convs = 4
	var wg sync.WaitGroup
	answered := make([]int, convs)
	refused := make([]int, convs)
	for k := range convs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			msgs := []any{map[string]any{"role": "user", "content": fmt.Sprintf("Conversation %d.", k)}}
			for range 1000 {
				status, body := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-sim", map[string]any{"stream": k%2 == 0}, msgs...), nil)
				if status == http.StatusPaymentRequired {
					refused[k]++
					return
				}
				if status != http.StatusOK {
					t.Errorf("conversation %d: %d %s", k, status, body)
					return
				}
				answered[k]++
				msgs = append(msgs, map[string]any{"role": "assistant", "content": long}, map[string]any{"role": "user", "content": "Go on."})
			}
		}()
	}
	wg.Wait()
	s := spent(t, r, "attempt/at-1")
	calls := trajectory(t, r, "at-1")
	var charged gateway.Money
	n := 0
	for _, c := range calls {
		charged += c.Charged
		if c.Status == http.StatusOK {
			n++
		}
	}
	total := 0
	for k := range convs {
		total += answered[k]
		if refused[k] != 1 {
			t.Fatalf("conversation %d: %d answered, %d refused: want it stopped at the cap", k, answered[k], refused[k])
		}
	}
	if s > budget || s == 0 || charged != s || n != total || total < 3 {
		t.Fatalf("spent %v of %v, charged %v, %d calls answered (%d recorded)", s, budget, charged, total, n)
	}
	if a, _ := r.ledger.Balance(context.Background(), "attempt/at-1"); a.Reserved != 0 {
		t.Fatalf("%v still reserved", a.Reserved)
	}
	if len(r.sim.Requests()) != total {
		t.Fatalf("the provider got %d requests for %d answered calls", len(r.sim.Requests()), total)
	}
	// The conversations were refused when the money was spent, not while
	// calls in flight held it: a call made once they all settled is
	// refused too.
	if status, body := call(t, r.srv.URL, "/v1/chat/completions", tok, chatBody("gpt-sim", nil), nil); status != http.StatusPaymentRequired {
		t.Fatalf("a call after every conversation was refused: %d %s", status, body)
	}
	t.Logf("%d conversations at once: %d calls answered, $%.4f spent of $%.2f", convs, total, s.USDValue(), budget.USDValue())
}
