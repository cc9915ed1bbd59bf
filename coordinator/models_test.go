package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	corebenchfamily "github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/dashboard"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/proto"
)

const providerKey = "sk-provider-secret-0123456789abcdef"

// modelCoordinator is a coordinator whose gateway forwards to a scripted
// model server on loopback (the provider), with a price of $1 per million
// input tokens and $4 per million output tokens.
func modelCoordinator(t *testing.T, script modelsim.Script, edit func(*Config)) (*Coordinator, *modelsim.Server) {
	t.Helper()
	sim, err := modelsim.Start(script, modelsim.Options{APIKey: providerKey})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	c := openTestWith(t, t.TempDir(), func(cfg *Config) {
		cfg.ScheduleInterval = 50 * time.Millisecond
		cfg.IdleCanaryEvery = -1
		cfg.Gateway = &gateway.Config{
			Providers: []gateway.Provider{{Name: "sim", API: gateway.APIOpenAI, BaseURL: sim.URL() + "/v1", Key: providerKey}},
			Models:    []gateway.Model{{Name: "sim-1", Provider: "sim", Price: gateway.PriceUSD{Input: 1, Output: 4}, MaxOutput: 4096}},
		}
		if edit != nil {
			edit(cfg)
		}
	})
	t.Cleanup(func() { c.Close() })
	return c, sim
}

// agentProxy is what a node starts for an attempt with model access: a
// node-local endpoint forwarding to the coordinator's gateway.
func agentProxy(ctx context.Context, t *testing.T, w *wireNode, attempt string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p, err := modelnet.StartProxy(ctx, w.h, w.c.ID(), addr, modelnet.ProxyOptions{Attempt: attempt}, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return "http://" + addr
}

// chat makes one OpenAI chat call as an agent would and returns the
// status and body.
func chat(t *testing.T, base, token string) (int, string) {
	t.Helper()
	body := `{"model":"sim-1","messages":[{"role":"user","content":"What is in results/?"}]}`
	req, _ := http.NewRequest("POST", base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestModelAccess: an attempt's assignment carries a model token; its
// node's endpoint reaches the gateway over libp2p and the provider with
// the provider's key; the token works for that attempt, on that node,
// during its lease only; the attempt's cost and tokens reach its record
// and the leaderboard; the trajectory is recorded and chained; and the
// provider's key is in no assignment.
func TestModelAccess(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, sim := modelCoordinator(t, modelsim.Sequence(modelsim.Reply{Content: "the figure is 0.96",
		Usage: modelsim.Usage{Prompt: 1000, Completion: 250}}), nil)
	w := newWireNode(ctx, t, c, 2)
	w.announce(ctx)
	other := newWireNode(ctx, t, c, 1)
	evaluate(t, c, Evaluation{ID: "ev-models", Replicas: 1, Runs: 2, Models: []string{"sim-1"}})
	waitUntil(ctx, t, "the node holds two attempts", func() bool { return len(w.held()) >= 2 })
	a, b := w.held()[0], w.held()[1]
	for _, asg := range []*proto.Assignment{a, b} {
		if !strings.HasPrefix(asg.GetModelToken(), gateway.TokenPrefix) {
			t.Fatalf("assignment without a model token: %q", asg.GetModelToken())
		}
		raw, _ := json.Marshal(asg)
		if bytes.Contains(raw, []byte(providerKey)) {
			t.Fatal("an assignment carries the provider's key")
		}
	}
	base := agentProxy(ctx, t, w, a.GetAttemptId())
	for range 3 {
		if code, body := chat(t, base, a.GetModelToken()); code != 200 || !strings.Contains(body, "0.96") {
			t.Fatalf("agent call: %d %s", code, body)
		}
	}
	// The provider saw its own key, never the agent's token.
	for _, r := range sim.Requests() {
		if strings.Contains(r.Header.Get("Authorization"), a.GetModelToken()) || !strings.Contains(r.Header.Get("Authorization"), providerKey) {
			t.Fatalf("the provider got %q", r.Header.Get("Authorization"))
		}
	}
	// Another attempt's token through this attempt's endpoint, and this
	// token from another node, are refused.
	if code, _ := chat(t, base, b.GetModelToken()); code != http.StatusForbidden {
		t.Fatalf("another attempt's token: %d", code)
	}
	if code, _ := chat(t, agentProxy(ctx, t, other, a.GetAttemptId()), a.GetModelToken()); code != http.StatusForbidden {
		t.Fatalf("this token from another node: %d", code)
	}
	if code, _ := chat(t, base, a.GetModelToken()+"x"); code != http.StatusUnauthorized {
		t.Fatalf("a forged token: %d", code)
	}

	// The report counts; its cost and tokens are the calls' at the price
	// table: 3 x (1000 input at $1/M + 250 output at $4/M) = $0.006.
	if ack := w.deliver(ctx, w.okReport(a, `{}`)); !ack.GetAccepted() {
		t.Fatalf("report: %+v", ack)
	}
	settle(t, c)
	got := state(t, c, a.GetAttemptId())
	if got.Model == nil || got.Model.Calls != 3 || got.Model.InputTokens != 3000 || got.Model.OutputTokens != 750 ||
		fmt.Sprintf("%.6f", got.Model.CostUSD) != "0.006000" {
		t.Fatalf("model use %+v", got.Model)
	}
	var entry *float64
	for _, e := range c.LeaderboardEntries() {
		if e.TaskID == got.TaskID && e.Run == got.Run && e.CostUSD != nil {
			entry = e.CostUSD
			if e.InputTokens != 3000 || e.OutputTokens != 750 {
				t.Fatalf("entry tokens %d/%d", e.InputTokens, e.OutputTokens)
			}
		}
	}
	if entry == nil || fmt.Sprintf("%.6f", *entry) != "0.006000" {
		t.Fatalf("leaderboard cost %v", entry)
	}
	// Once reported, its lease is over: the token is refused.
	if code, _ := chat(t, base, a.GetModelToken()); code != http.StatusUnauthorized {
		t.Fatalf("a token after its lease: %d", code)
	}
	traj, err := c.Trajectory(ctx, a.GetAttemptId())
	if err != nil || len(traj) != 3 || traj[2].ID != got.Model.Head || !strings.Contains(string(traj[0].ResponseBody), "0.96") {
		t.Fatalf("trajectory: %d calls, err %v", len(traj), err)
	}
}

// TestModelBudgetExhausted: an agent that keeps calling is stopped at its
// attempt's cap, never past it, and its attempt ends budget_exhausted (that
// the cap holds across restarts is gateway's TestLedgerPersist).
func TestModelBudgetExhausted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c, _ := modelCoordinator(t, modelsim.Sequence(modelsim.Reply{Content: strings.Repeat("word ", 100),
		Usage: modelsim.Usage{Prompt: 2000}}), nil)
	w := newWireNode(ctx, t, c, 1)
	w.announce(ctx)
	evaluate(t, c, Evaluation{ID: "ev-cap", Replicas: 1, Budget: core.Budget{AttemptUSD: 0.01}})
	waitUntil(ctx, t, "the node holds an attempt", func() bool { return len(w.held()) > 0 })
	a := w.held()[0]
	base := agentProxy(ctx, t, w, a.GetAttemptId())
	refused := 0
	for range 40 {
		code, body := chat(t, base, a.GetModelToken())
		if code == http.StatusPaymentRequired {
			if !strings.Contains(body, "budget_exhausted") {
				t.Fatalf("refusal: %s", body)
			}
			refused++
			break
		}
		if code != 200 {
			t.Fatalf("call: %d %s", code, body)
		}
	}
	if refused == 0 {
		t.Fatal("an agent calling 40 times was never stopped by a $0.01 cap")
	}
	bal, err := c.models.ledger.Balance(ctx, "attempt/"+a.GetAttemptId())
	if err != nil || bal.Spent > bal.Cap || bal.Cap != gateway.USD/100 {
		t.Fatalf("attempt account %+v (%v)", bal, err)
	}
	if ack := w.deliver(ctx, w.okReport(a, `{}`)); !ack.GetAccepted() {
		t.Fatalf("report: %+v", ack)
	}
	settle(t, c)
	if got := state(t, c, a.GetAttemptId()); got.Outcome != core.OutcomeBudgetExhausted || got.Model == nil ||
		got.Model.CostUSD > 0.01 {
		t.Fatalf("attempt outcome %q, model %+v", got.Outcome, got.Model)
	}
}

// judgedFamily is a family whose scorer asks a judge (bench.Models): a
// job passes when the judge answers PASS. One task, content "capsule-1".
type judgedFamily struct{}

func (judgedFamily) Name() string { return "judged" }
func (judgedFamily) Open(def bench.SuiteDef) (bench.Suite, error) {
	return judgedSuite{name: def.Name}, nil
}

type judgedSuite struct{ name string }

func (judgedSuite) Tasks() []bench.Task                       { return []bench.Task{{ID: "t1"}} }
func (judgedSuite) Variants() []string                        { return []string{""} }
func (judgedSuite) Scorer() string                            { return "judged@1" }
func (judgedSuite) Scoring() json.RawMessage                  { return json.RawMessage(`{"scorer":"judged@1"}`) }
func (judgedSuite) Pipeline(bench.Task, string) []bench.Stage { return []bench.Stage{{Name: "solve"}} }
func (judgedSuite) Boards([]bench.Entry) ([]any, error)       { return nil, nil }

// ValueGrader: the judged family grades a job one way, and says so
// (bench.ValueGrader).
func (judgedSuite) ValueGrader(json.RawMessage) string { return "judged-strict@1" }
func (judgedSuite) Recipe(in bench.RecipeInput) (*proto.Recipe, error) {
	return &proto.Recipe{ImageCid: in.Image.Bytes(), Limits: in.Limits, Outputs: []*proto.Output{{Path: "report.json", MaxBytes: 1 << 10}}}, nil
}
func (judgedSuite) Score(ctx context.Context, in bench.ScoreInput) (bench.Score, error) {
	if in.Models == nil {
		return bench.Score{}, fmt.Errorf("no judge")
	}
	out, err := in.Models.Chat(ctx, json.RawMessage(`{"model":"sim-1","messages":[{"role":"user","content":"Judge this."}]}`))
	if err != nil {
		return bench.Score{}, err
	}
	pass := strings.Contains(string(out), "PASS")
	return bench.Score{Comparable: bench.Comparable{Grading: &bench.Grading{Pass: pass}}, Public: json.RawMessage(`{}`)}, nil
}

// TestJudgeThroughGateway: a scorer's judge calls go through the gateway
// as the coordinator's own: recorded in the attempt's judge trajectory,
// charged to the evaluation's judge account and never to the agent's
// budgets; its token serves only while the attempt is being scored.
func TestJudgeThroughGateway(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	reg, err := bench.NewRegistry(corebenchfamily.New(), judgedFamily{})
	if err != nil {
		t.Fatal(err)
	}
	c, sim := modelCoordinator(t, modelsim.Sequence(modelsim.Reply{Content: "PASS", Usage: modelsim.Usage{Prompt: 100, Completion: 10}}),
		func(cfg *Config) { cfg.Families = reg })
	if _, err := c.ImportSuite(ctx, bench.SuiteDef{Name: "judged", Family: "judged", Tasks: json.RawMessage(`[]`)}); err != nil {
		t.Fatal(err)
	}
	w := newWireNode(ctx, t, c, 2)
	w.announce(ctx)
	if _, _, err := c.Evaluate(ctx, Evaluation{ID: "ev-judged", Suite: "judged", Agent: "oracle", Replicas: 1,
		Budget: core.Budget{JudgeUSD: 1}}); err != nil {
		t.Fatal(err)
	}
	waitUntil(ctx, t, "the node holds the attempt", func() bool { return len(w.held()) > 0 })
	a := w.held()[0]
	// Before scoring, the judge's token is refused.
	j := judge{c: c, attempt: a.GetAttemptId()}
	if _, err := j.Chat(ctx, json.RawMessage(`{"model":"sim-1","messages":[{"role":"user","content":"x"}]}`)); err == nil {
		t.Fatal("a judge token served before its attempt was being scored")
	}
	if ack := w.deliver(ctx, w.okReport(a, `{}`)); !ack.GetAccepted() {
		t.Fatalf("report: %+v", ack)
	}
	settle(t, c)
	got := state(t, c, a.GetAttemptId())
	if got.State != StateDone || got.Score == nil {
		t.Fatalf("attempt %s, score %+v", got.State, got.Score)
	}
	traj, err := c.Trajectory(ctx, a.GetAttemptId()+".judge")
	if err != nil || len(traj) != 1 || traj[0].Evaluation != "ev-judged.judge" {
		t.Fatalf("judge trajectory: %+v, %v", traj, err)
	}
	if n := len(sim.Requests()); n != 1 {
		t.Fatalf("%d provider calls, want the judge's one", n)
	}
	judgeAcct, _ := c.models.ledger.Balance(ctx, "evaluation/ev-judged.judge")
	agentAcct, _ := c.models.ledger.Balance(ctx, "attempt/"+a.GetAttemptId())
	if judgeAcct.Spent == 0 || agentAcct.Spent != 0 || got.Model != nil {
		t.Fatalf("judge account %+v, agent account %+v, agent model use %+v", judgeAcct, agentAcct, got.Model)
	}
	// The dashboard's boards name the grader whose score is the number
	// (issue 16), as the family says.
	boards := dashboard.BuildBoards(c.dashEntries(c.LeaderboardEntries()))
	if len(boards) != 1 || boards[0].Grader != "judged-strict@1" {
		t.Fatalf("dashboard boards %+v, want one graded by judged-strict@1", boards)
	}
}
