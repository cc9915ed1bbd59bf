package gateway_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
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
func callChain(t *testing.T, base, token string, body any) (int, []byte, string) {
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
