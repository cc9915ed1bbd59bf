package coordinator

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/gateway/modelnet"
)

// Model access. With Config.Gateway set, the coordinator runs the metered
// model gateway (package gateway) behind libp2p (package modelnet): an
// agent calls its node-local endpoint with a per-attempt token, the node
// forwards the call over a stream, and the gateway calls the provider
// with the provider's key, which never leaves this process.
//
// This file implements what the gateway leaves to the coordinator:
//   - the Authorizer: a token is the attempt, its assignment (lease ID)
//     and an HMAC of both under a key derived from the identity key; it is
//     valid while that assignment is the attempt's current one, on the
//     node holding it, before its lease ends (core.State.GrantOf): no
//     token is stored, and none outlives its lease;
//   - the Ledger: budgets kept by gateway.MemLedger, every change written
//     through the journal, a reservation returned only once durable;
//   - the Recorder: request and answer bodies in the capsule store (by
//     CID), call records through the journal, chained per attempt;
//   - the budget hook: an attempt whose budget refused a call ends with
//     the outcome budget_exhausted (core.BudgetExhausted).

// Key prefixes of model access records.
var (
	ledgerKey = datastore.NewKey("/state/ledger")
	callsKey  = datastore.NewKey("/state/calls")
)

// models is the coordinator's model access.
type models struct {
	gw     *gateway.Gateway
	ledger *gateway.MemLedger
	rec    *trajectories
	// secret keys the tokens' HMAC.
	secret []byte
	srv    *modelnet.Server
}

// startModels starts the gateway (when configured) and serves it on the
// host; callers are in start.
func (c *Coordinator) startModels(ctx context.Context, secret []byte) error {
	c.trajectories = &trajectories{c: c, heads: map[string]callHead{}}
	if c.cfg.Gateway == nil {
		return nil
	}
	m := &models{rec: c.trajectories, secret: tokenKey(secret)}
	m.ledger = gateway.NewMemLedger(gateway.WithPersist(c.persistAccounts))
	accounts := map[string]gateway.Account{}
	err := eachRecordKey(ctx, c.ds, ledgerKey.String(), func(key string, b []byte) error {
		var a gateway.Account
		if err := json.Unmarshal(b, &a); err != nil {
			return err
		}
		accounts[strings.TrimPrefix(key, ledgerKey.String()+"/")] = a
		return nil
	})
	if err != nil {
		return fmt.Errorf("load model budgets: %w", err)
	}
	m.ledger.Restore(accounts)
	if m.gw, err = gateway.New(*c.cfg.Gateway, c, m.ledger, c.trajectories, gateway.WithLogger(c.log.With("component", "gateway")),
		gateway.OnBudgetExhausted(c.budgetExhausted)); err != nil {
		return fmt.Errorf("model gateway: %w", err)
	}
	m.srv = modelnet.Serve(ctx, c.host, m.gw, modelnet.Limits{}, c.log.With("component", "modelnet"))
	c.models = m
	c.log.Info("model gateway serving", "models", len(c.cfg.Gateway.Models), "protocol", modelnet.Protocol)
	return nil
}

// persistAccounts writes budget accounts through the journal (the ledger
// calls it under its lock, in the order of its changes).
func (c *Coordinator) persistAccounts(changed map[string]gateway.Account) func(context.Context) error {
	var t interface{ Wait(context.Context) error }
	for k, a := range changed {
		tk, err := c.journal.PutJSON(ledgerKey.Child(datastore.NewKey(k)), a)
		if err != nil {
			return func(context.Context) error { return err }
		}
		t = tk
	}
	if t == nil {
		return func(context.Context) error { return nil }
	}
	return t.Wait
}

// budgetExhausted is the gateway's hook: a budget refused a call.
func (c *Coordinator) budgetExhausted(ctx context.Context, g gateway.Grant, err *gateway.BudgetError) {
	c.step(ctx, core.BudgetExhausted{Attempt: g.Attempt, Lease: g.Lease, Detail: err.Error()})
}

// tokenKey derives the key of model tokens from the ID secret.
func tokenKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte("repronet model tokens"))
	return m.Sum(nil)
}

// modelToken is the token of an attempt's assignment (lease).
func (m *models) token(attempt, lease string) string {
	return gateway.TokenPrefix + attempt + "." + lease + "." + m.mac(attempt, lease)
}

func (m *models) mac(attempt, lease string) string {
	h := hmac.New(sha256.New, m.secret)
	fmt.Fprintf(h, "%s\x00%s", attempt, lease)
	return hex.EncodeToString(h.Sum(nil)[:16])
}

// Resolve implements gateway.Authorizer: a token is good while its
// assignment is the attempt's current one and its lease has not run out.
func (c *Coordinator) Resolve(ctx context.Context, token string) (gateway.Grant, error) {
	m := c.models
	rest, ok := strings.CutPrefix(token, gateway.TokenPrefix)
	parts := strings.Split(rest, ".")
	if m == nil || !ok || len(parts) != 3 || len(token) > 256 {
		return gateway.Grant{}, gateway.ErrUnknownToken
	}
	if !hmac.Equal([]byte(parts[2]), []byte(m.mac(parts[0], parts[1]))) {
		return gateway.Grant{}, gateway.ErrUnknownToken
	}
	if parts[1] == judgeLease {
		return c.judgeGrant(parts[0])
	}
	c.mu.Lock()
	g, ok := c.state.GrantOf(parts[0], parts[1], time.Now())
	c.mu.Unlock()
	if !ok {
		return gateway.Grant{}, fmt.Errorf("%w: the assignment it was issued for is over", gateway.ErrUnknownToken)
	}
	node, err := peer.Decode(g.Node)
	if err != nil {
		return gateway.Grant{}, fmt.Errorf("grant of %s: node %q: %w", g.Attempt, g.Node, err)
	}
	budgets := gateway.Budgets{Attempt: gateway.Unlimited, Evaluation: gateway.Unlimited, Group: gateway.Unlimited}
	for _, b := range []struct {
		usd float64
		to  *gateway.Money
	}{{g.Budget.AttemptUSD, &budgets.Attempt}, {g.Budget.EvaluationUSD, &budgets.Evaluation},
		{c.cfg.GroupBudgets[g.Group], &budgets.Group}} {
		if b.usd > 0 {
			if *b.to, err = gateway.Dollars(b.usd); err != nil {
				return gateway.Grant{}, fmt.Errorf("grant of %s: %w", g.Attempt, err)
			}
		}
	}
	return gateway.Grant{Attempt: g.Attempt, Lease: g.Lease, Node: node, Evaluation: g.Eval, Group: g.Group, Task: g.Task,
		Expires: g.Expires, Budgets: budgets, Models: g.Models, Replay: g.Replay}, nil
}

// Trajectory returns an attempt's model calls with their bodies, in
// order, its chain checked (every assignment's calls: Call.Lease tells
// them apart).
func (c *Coordinator) Trajectory(ctx context.Context, attempt string) ([]gateway.TrajectoryCall, error) {
	return gateway.LoadTrajectory(ctx, c.trajectories, attempt)
}

// modelUse sums the calls of one assignment (lease) of an attempt.
func (c *Coordinator) modelUse(ctx context.Context, attempt, lease string) (*core.ModelUse, error) {
	if c.models == nil {
		return nil, nil
	}
	calls, err := c.trajectories.Calls(ctx, attempt)
	if err != nil {
		return nil, err
	}
	var u core.ModelUse
	var cost gateway.Money
	for _, cl := range calls {
		if cl.Lease != lease {
			continue
		}
		u.Calls++
		u.InputTokens += cl.Usage.Input
		u.OutputTokens += cl.Usage.Output
		cost += cl.Charged
		u.Head = cl.ID
		u.Unavailable = cl.Unavailable()
	}
	if u.Calls == 0 {
		return nil, nil
	}
	u.CostUSD = cost.USDValue()
	return &u, nil
}

// trajectories is the gateway's Recorder over the coordinator's storage:
// bodies in the capsule store, call records through the journal under
// /state/calls/<attempt>/<seq>.
type trajectories struct {
	c     *Coordinator
	mu    sync.Mutex
	heads map[string]callHead
}

// callHead is where an attempt's chain ends.
type callHead struct {
	next int
	id   string
}

// maxBody bounds a recorded body read back.
const maxBody = 64 << 20

// Put implements gateway.Recorder.
func (t *trajectories) Put(ctx context.Context, data []byte) (string, error) {
	info, err := t.c.store.Add(ctx, bytes.NewReader(data))
	if err != nil {
		return "", fmt.Errorf("record body: %w", err)
	}
	return info.CID.String(), nil
}

// Get implements gateway.Recorder.
func (t *trajectories) Get(ctx context.Context, id string) ([]byte, error) {
	cc, err := cid.Decode(id)
	if err != nil {
		return nil, fmt.Errorf("body %q: %w", id, err)
	}
	r, err := t.c.store.Open(ctx, cc)
	if err != nil {
		return nil, fmt.Errorf("body %s: %w: %w", id, gateway.ErrNotFound, err)
	}
	defer r.Close()
	b, err := io.ReadAll(io.LimitReader(r, maxBody+1))
	if err != nil {
		return nil, fmt.Errorf("body %s: %w", id, err)
	}
	if len(b) > maxBody {
		return nil, fmt.Errorf("body %s: over %d bytes", id, maxBody)
	}
	return b, nil
}

// Append implements gateway.Recorder: the record is durable when it
// returns.
func (t *trajectories) Append(ctx context.Context, call gateway.Call) (gateway.Call, error) {
	if err := gateway.ValidAttemptName(call.Attempt); err != nil {
		return gateway.Call{}, err
	}
	t.mu.Lock()
	h, ok := t.heads[call.Attempt]
	if !ok {
		calls, err := t.Calls(ctx, call.Attempt)
		if err != nil {
			t.mu.Unlock()
			return gateway.Call{}, err
		}
		if n := len(calls); n > 0 {
			h = callHead{next: n, id: calls[n-1].ID}
		}
	}
	call.Seq, call.Prev = h.next, h.id
	call, b := gateway.Seal(call)
	tk := t.c.journal.Put(callKey(call.Attempt, call.Seq), b)
	t.heads[call.Attempt] = callHead{next: call.Seq + 1, id: call.ID}
	t.mu.Unlock()
	if err := tk.Wait(ctx); err != nil {
		return gateway.Call{}, fmt.Errorf("record call %d of %s: %w", call.Seq, call.Attempt, err)
	}
	return call, nil
}

// Calls implements gateway.Recorder.
func (t *trajectories) Calls(ctx context.Context, attempt string) ([]gateway.Call, error) {
	if err := gateway.ValidAttemptName(attempt); err != nil {
		return nil, err
	}
	var out []gateway.Call
	err := eachRecord(ctx, t.c.ds, callsKey.ChildString(attempt).String()+"/", appendJSON(&out))
	return out, err
}

// callKey is the key of call seq of attempt (zero-padded: keys sort as
// the chain runs).
func callKey(attempt string, seq int) datastore.Key {
	return callsKey.ChildString(attempt).ChildString(fmt.Sprintf("%08d", seq))
}

// eachRecordKey is eachRecord with the key of each record.
func eachRecordKey(ctx context.Context, ds datastore.Batching, prefix string, into func(key string, b []byte) error) error {
	res, err := ds.Query(ctx, query.Query{Prefix: prefix, Orders: []query.Order{query.OrderByKey{}}})
	if err != nil {
		return fmt.Errorf("query %s: %w", prefix, err)
	}
	defer res.Close()
	for e := range res.Next() {
		if e.Error != nil {
			return fmt.Errorf("query %s: %w", prefix, e.Error)
		}
		if err := into(e.Key, e.Value); err != nil {
			return fmt.Errorf("decode %s: %w", e.Key, err)
		}
	}
	return nil
}

// Judges. A scorer that asks a model (an LLM judge: bench.ScoreInput
// Models) calls through the same gateway, as the coordinator itself:
// metered, capped and recorded like an agent's calls, in the trajectory
// "<attempt>.judge", charged to the account "evaluation/<id>.judge" (the
// evaluation's Budget.JudgeUSD), never to the agent's budgets.

// judgeLease is the lease part of a judge's token.
const judgeLease = "judge"

// judgeGrant is the grant of the judge of a recorded attempt, while it is
// being scored.
func (c *Coordinator) judgeGrant(attempt string) (gateway.Grant, error) {
	c.mu.Lock()
	a, ok := c.state.Attempt(attempt)
	ev := c.state.Evals[a.Eval]
	c.mu.Unlock()
	if !ok || a.State != core.StateReported {
		return gateway.Grant{}, fmt.Errorf("%w: attempt %s is not being scored", gateway.ErrUnknownToken, attempt)
	}
	cap := gateway.Unlimited
	if ev.Budget.JudgeUSD > 0 {
		var err error
		if cap, err = gateway.Dollars(ev.Budget.JudgeUSD); err != nil {
			return gateway.Grant{}, err
		}
	}
	g := gateway.Grant{Attempt: attempt + core.JudgeSuffix, Lease: judgeLease, Node: c.host.ID(), Task: a.TaskID,
		Expires: time.Now().Add(c.cfg.ScoreTimeout), Budgets: gateway.Budgets{Attempt: gateway.Unlimited, Evaluation: cap,
			Group: gateway.Unlimited}}
	if a.Eval != "" {
		g.Evaluation = a.Eval + core.JudgeSuffix
	}
	return g, nil
}

// judge is the bench.Models a scorer of one attempt gets.
type judge struct {
	c       *Coordinator
	attempt string
}

// Chat implements bench.Models: an OpenAI chat completions request through
// the gateway; a refusal or a provider's error is an error (the scorer's
// failure, retried, never the agent's).
func (j judge) Chat(ctx context.Context, request json.RawMessage) (json.RawMessage, error) {
	m := j.c.models
	req, err := http.NewRequestWithContext(modelnet.WithCaller(ctx, j.c.host.ID()), http.MethodPost, "/v1/chat/completions",
		bytes.NewReader(request))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+m.token(j.attempt, judgeLease))
	req.Header.Set("Content-Type", "application/json")
	w := &memResponse{header: http.Header{}}
	m.gw.ServeHTTP(w, req)
	if w.status != http.StatusOK {
		return nil, fmt.Errorf("judge call: %d: %s", w.status, clip(w.body.String(), 300))
	}
	return json.RawMessage(w.body.Bytes()), nil
}

// memResponse is an http.ResponseWriter in memory.
type memResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (w *memResponse) Header() http.Header { return w.header }
func (w *memResponse) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.body.Write(b)
}
func (w *memResponse) WriteHeader(s int) {
	if w.status == 0 {
		w.status = s
	}
}
func (w *memResponse) Flush() {}

// clip bounds a message quoted in an error.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// models for a scorer of attempt id: its judge (nil without a gateway).
func (c *Coordinator) scorerModels(id string) bench.Models {
	if c.models == nil {
		return nil
	}
	return judge{c: c, attempt: id}
}
