// Package gateway is the metered model gateway: agents in sandboxes call
// models through it with a per-attempt token, and it forwards each call to
// the configured provider with the provider's key (which never leaves the
// gateway), bounds each call so that no budget is ever exceeded, charges
// the call to the attempt's, evaluation's and group's budgets, and records
// every request and answer, content-addressed, in the attempt's
// trajectory. It links each call into the attempt's conversation chain
// (package verify) and returns the head after it (ChainHeader), and it
// answers a replay attempt's calls with the recorded attempt's answers,
// paired by conversation, free (replay.go).
//
// It serves OpenAI's chat completions (POST /v1/chat/completions,
// streaming or not, tool calls passed through untouched), OpenAI's
// Responses API (POST /v1/responses, responses.go), Anthropic's
// Messages API (POST /v1/messages; POST /v1/messages/count_tokens,
// forwarded free, count_tokens.go), Google's Gemini API (POST
// /v1beta/models/{model}:generateContent, :streamGenerateContent and
// :countTokens, gemini.go) and the model lists (GET /v1/models, GET
// /v1beta/models). No provider key leaves it but on the provider's own
// connection: the provider client follows no redirect and only an
// allow-list of answer headers, scrubbed, reaches the agent
// (hygiene.go).
// It owns the arithmetic of money, prices and budgets (budget.go, pure,
// with the proof that a budget is never exceeded), the reading and
// rewriting of the APIs' requests, answers and streams (openai.go,
// anthropic.go, gemini.go, sse.go, pure), the Authorizer, Ledger and Recorder
// interfaces with in-memory (and, for trajectories, file-backed)
// implementations, and the conversion of a trajectory to HAL's upload
// fields (hal.go, pure).
//
// It must not know how calls reach it: the transport (package modelnet,
// libp2p streams from nodes) names the calling node in the request's
// context. It must not keep durable budget state of its own: the
// coordinator implements Ledger and Authorizer over its journal and
// leases. docs/gateway.md describes the whole.
package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptrace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/verify"
)

// Gateway serves model calls; it is an http.Handler.
type Gateway struct {
	routes      map[string]route
	limits      Limits
	auth        Authorizer
	ledger      Ledger
	rec         Recorder
	client      *http.Client
	log         *slog.Logger
	now         func() time.Time
	onExhausted func(context.Context, Grant, *BudgetError)
	secrets     [][]byte

	chains  *chains
	replays *replayBook
	counts  *rateWindows // token counting calls per attempt
}

// maxKeptHeads bounds the chain heads kept in memory.
const maxKeptHeads = 4096

// chains order each attempt's records with its chain: the head is linked
// and the record appended under mu.
type chains struct {
	mu    sync.Mutex
	heads map[string]string // attempt -> its chain's head
}

// ChainHeader carries the attempt's chain head after the call (a
// trailer of streamed and refused answers): the node signs the last one
// in its report.
const ChainHeader = modelnet.ChainHeader

// Option changes a Gateway.
type Option func(*Gateway)

// WithHTTPClient sets the client that calls providers (a copy of it that
// never follows a redirect, whatever its CheckRedirect).
func WithHTTPClient(c *http.Client) Option { return func(g *Gateway) { g.client = c } }

// WithLogger sets the logger.
func WithLogger(l *slog.Logger) Option { return func(g *Gateway) { g.log = l } }

// WithClock sets the clock (leases' ends and records' times).
func WithClock(now func() time.Time) Option { return func(g *Gateway) { g.now = now } }

// OnBudgetExhausted sets f to be told of every call refused because a
// budget cannot pay for it: the coordinator ends the attempt with the
// outcome budget_exhausted.
func OnBudgetExhausted(f func(ctx context.Context, g Grant, err *BudgetError)) Option {
	return func(g *Gateway) { g.onExhausted = f }
}

// New returns a gateway for cfg.
func New(cfg Config, auth Authorizer, ledger Ledger, rec Recorder, opts ...Option) (*Gateway, error) {
	c, err := cfg.compile()
	if err != nil {
		return nil, fmt.Errorf("gateway: %w", err)
	}
	if auth == nil || ledger == nil || rec == nil {
		return nil, errors.New("gateway: an authorizer, a ledger and a recorder are required")
	}
	g := &Gateway{routes: c.routes, limits: c.limits, auth: auth, ledger: ledger, rec: rec,
		client: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		log:    slog.New(slog.DiscardHandler), now: time.Now, chains: &chains{heads: map[string]string{}},
		replays: &replayBook{states: map[string]*replayState{}}}
	for _, o := range opts {
		o(g)
	}
	g.client = noRedirects(g.client)
	g.counts = newRateWindows(g.limits.CountTokensPerMinute, time.Minute)
	for _, p := range cfg.Providers {
		// Shorter keys would make scrubbing replace ordinary text.
		if len(p.Key) >= 8 {
			g.secrets = append(g.secrets, []byte(p.Key))
		}
	}
	return g, nil
}

// adapter is what differs between the APIs.
type adapter struct {
	api       string
	call      string
	parse     func([]byte) (callRequest, error)
	rewrite   func(callRequest, route, int64) ([]byte, error)
	response  func([]byte) (Usage, bool, error)
	assembler func() assembler
	// endpoint, when set, is the provider's URL for the call (the
	// Responses API's, or Gemini's, which depends on the method);
	// otherwise the route's.
	endpoint func(route) string
	// prepare, when set, checks a request against its route and says
	// what the route adds (anthropic.go).
	prepare func(callRequest, route, http.Header) (callExtra, error)
}

// assembler rebuilds an answer from its stream.
type assembler interface {
	Event(data []byte) (chunkInfo, error)
	Usage() (Usage, bool, error)
	Complete() bool
	Response() []byte
}

var (
	openAIAdapter = adapter{api: APIOpenAI, call: CallOpenAIChat, parse: parseChatRequest,
		rewrite: func(r callRequest, rt route, n int64) ([]byte, error) {
			return rewriteChat(r, rt.model.Upstream, n, rt.provider.OutputField)
		},
		response:  parseChatResponse,
		assembler: func() assembler { return &chatAssembler{} }}
	anthropicAdapter = adapter{api: APIAnthropic, call: CallAnthropicMessages, parse: parseMessagesRequest,
		rewrite: func(r callRequest, rt route, n int64) ([]byte, error) {
			return rewriteMessages(r, rt.model.Upstream, n, rt.tools)
		},
		response:  parseMessagesResponse,
		assembler: func() assembler { return &messagesAssembler{} },
		prepare:   prepareMessages}
)

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/chat/completions":
		g.serveCall(w, r, openAIAdapter)
	case "/v1/messages":
		g.serveCall(w, r, anthropicAdapter)
	case "/v1/responses":
		g.serveCall(w, r, responsesAdapter)
	case "/v1/messages/count_tokens":
		g.serveCountTokens(w, r)
	case "/v1/models":
		g.serveModels(w, r)
	default:
		if strings.HasPrefix(r.URL.Path, geminiPrefix) {
			g.serveGemini(w, r)
			return
		}
		writeAPIError(w, APIOpenAI, http.StatusNotFound, errNotFound, fmt.Sprintf("no endpoint %s (the gateway serves /v1/chat/completions, /v1/responses, /v1/messages, /v1/models and /v1beta/models)", r.URL.Path))
	}
}

// token is the API key a request presents: x-api-key (Anthropic's
// clients), x-goog-api-key or ?key= (Gemini's) or Authorization: Bearer
// (OpenAI's). None is forwarded: the provider's call is built anew.
func token(r *http.Request) string {
	if k := r.Header.Get("x-api-key"); k != "" {
		return k
	}
	if k := r.Header.Get("x-goog-api-key"); k != "" {
		return k
	}
	if k := r.URL.Query().Get("key"); k != "" {
		return k
	}
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "Bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// authorize resolves the request's token to a grant the calling node may
// use now. On refusal it returns the status and error type to answer.
func (g *Gateway) authorize(ctx context.Context, r *http.Request) (Grant, int, string, error) {
	node, ok := modelnet.Caller(ctx)
	if !ok {
		return Grant{}, http.StatusForbidden, errPermission, errors.New("the gateway takes calls only through a transport that names the calling node")
	}
	tok := token(r)
	if tok == "" {
		return Grant{}, http.StatusUnauthorized, errAuthentication, errors.New("no API key: send the attempt's token (Authorization: Bearer, x-api-key or x-goog-api-key)")
	}
	grant, err := g.auth.Resolve(ctx, tok)
	switch {
	case errors.Is(err, ErrUnknownToken):
		return Grant{}, http.StatusUnauthorized, errAuthentication, ErrUnknownToken
	case err != nil:
		g.log.Error("authorizer failed", "err", err)
		return Grant{}, http.StatusServiceUnavailable, errAPI, errors.New("the gateway cannot check tokens now; retry")
	}
	if err := grant.Permits(node, r.Header.Get(modelnet.AttemptHeader), "", g.now()); err != nil {
		if errors.Is(err, ErrWrongNode) || errors.Is(err, ErrWrongAttempt) {
			g.log.Warn("token used outside its attempt", "attempt", grant.Attempt, "granted_to", grant.Node, "caller", node,
				"calling_attempt", r.Header.Get(modelnet.AttemptHeader))
			return Grant{}, http.StatusForbidden, errPermission, err
		}
		return Grant{}, http.StatusUnauthorized, errAuthentication, err
	}
	return grant, 0, "", nil
}

func (g *Gateway) serveModels(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeAPIError(w, APIOpenAI, http.StatusMethodNotAllowed, errInvalidRequest, "use GET")
		return
	}
	grant, status, typ, err := g.authorize(r.Context(), r)
	if err != nil {
		writeAPIError(w, APIOpenAI, status, typ, err.Error())
		return
	}
	// Each entry is in both APIs' shapes (OpenAI's object, created,
	// owned_by; Anthropic's type, display_name, created_at), and so is
	// the list (Anthropic's has_more, first_id, last_id): clients read
	// their own fields and ignore the others.
	type entry struct {
		ID          string `json:"id"`
		Object      string `json:"object"`
		Created     int64  `json:"created"`
		OwnedBy     string `json:"owned_by"`
		Type        string `json:"type"`
		DisplayName string `json:"display_name"`
		CreatedAt   string `json:"created_at"`
	}
	list := []entry{}
	for name, rt := range g.routes {
		if len(grant.Models) == 0 || slices.Contains(grant.Models, name) {
			list = append(list, entry{ID: name, Object: "model", OwnedBy: rt.provider.Name, Type: "model", DisplayName: name,
				CreatedAt: "1970-01-01T00:00:00Z"})
		}
	}
	slices.SortFunc(list, func(a, b entry) int { return strings.Compare(a.ID, b.ID) })
	out := map[string]any{"object": "list", "data": list, "has_more": false, "first_id": nil, "last_id": nil}
	if len(list) > 0 {
		out["first_id"], out["last_id"] = list[0].ID, list[len(list)-1].ID
	}
	writeJSON(w, out)
}

// readCall reads what every call starts with: a POST, authorized by its
// token, whose body is within the limit and parses as a's. On a refusal it
// has answered in a's format and ok is false.
func (g *Gateway) readCall(w http.ResponseWriter, r *http.Request, a adapter) (grant Grant, body []byte, req callRequest, ok bool) {
	if r.Method != http.MethodPost {
		writeAPIError(w, a.api, http.StatusMethodNotAllowed, errInvalidRequest, "use POST")
		return
	}
	grant, status, typ, err := g.authorize(r.Context(), r)
	if err != nil {
		writeAPIError(w, a.api, status, typ, err.Error())
		return
	}
	body, err = io.ReadAll(http.MaxBytesReader(w, r.Body, g.limits.MaxRequestBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeAPIError(w, a.api, http.StatusRequestEntityTooLarge, errTooLarge, fmt.Sprintf("request body over %d bytes", g.limits.MaxRequestBytes))
			return
		}
		writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, "reading the request body: "+err.Error())
		return
	}
	if req, err = a.parse(body); err != nil {
		writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	return grant, body, req, true
}

// serveCall serves one model call.
func (g *Gateway) serveCall(w http.ResponseWriter, r *http.Request, a adapter) {
	start := g.now()
	ctx := r.Context()
	grant, body, req, ok := g.readCall(w, r, a)
	if !ok {
		return
	}
	rt, ok := g.routes[req.Model]
	if !ok {
		writeAPIError(w, a.api, http.StatusNotFound, errNotFound, fmt.Sprintf("model %q is not offered by the gateway", req.Model))
		return
	}
	if rt.provider.API != a.api {
		writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, fmt.Sprintf("model %q is served at %s", req.Model, servedAt(rt.provider.API)))
		return
	}
	if err := grant.Permits(grant.Node, "", req.Model, start); err != nil {
		writeAPIError(w, a.api, http.StatusForbidden, errPermission, err.Error())
		return
	}
	ext := callExtra{Rounds: 1}
	if a.prepare != nil {
		var err error
		if ext, err = a.prepare(req, rt, r.Header); err != nil {
			writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, err.Error())
			return
		}
	}
	if grant.Replay != "" {
		g.serveReplay(w, r, a, grant, req, body, start)
		return
	}
	// The input is bounded on the longest body the provider can get: the
	// rewrite with the model's largest output bound.
	longest, err := a.rewrite(req, rt, rt.model.MaxOutput)
	if err != nil {
		writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	c := Call{Attempt: grant.Attempt, Lease: grant.Lease, Node: grant.Node.String(), Evaluation: grant.Evaluation,
		Group: grant.Group, Task: grant.Task, API: a.call, Model: req.Model, Upstream: rt.model.Upstream,
		Provider: rt.provider.Name, Stream: req.Stream, Started: start.UTC()}
	c.Request = g.put(ctx, body)
	shape := CallShape{InputTokens: ext.inputTokens(InputBound(max(len(body), len(longest)), req.Images, rt.model)), Choices: req.Choices,
		Requested: req.Requested, ModelMax: rt.model.MaxOutput, MinOutput: max(g.limits.MinOutputTokens, ext.MinOutput), Fees: ext.Fees}
	res, plan, err := g.reserve(ctx, grant.Accounts(), func(avail Money) (Plan, error) {
		return PlanCall(avail, rt.price, shape)
	})
	if err != nil {
		var be *BudgetError
		if errors.As(err, &be) && errors.Is(err, ErrBudgetExhausted) {
			c.Status, c.Refused, c.Error = http.StatusPaymentRequired, RefusedBudget, err.Error()
			w.Header().Set(ChainHeader, g.finish(ctx, c))
			if g.onExhausted != nil {
				g.onExhausted(ctx, grant, be)
			}
			writeAPIError(w, a.api, http.StatusPaymentRequired, errBudget, err.Error())
			return
		}
		g.log.Error("ledger refused a reservation", "attempt", grant.Attempt, "err", err)
		writeAPIError(w, a.api, http.StatusServiceUnavailable, errAPI, "the gateway cannot reserve budget now; retry")
		return
	}
	c.MaxOutput, c.Bound = plan.MaxOutput, plan.Bound
	// settle charges the call and records it, once: before a whole answer
	// is given, after a stream ends, or however the call ends.
	var once sync.Once
	settle := func() {
		once.Do(func() {
			charged, overrun, err := g.ledger.Settle(context.WithoutCancel(ctx), res, c.Cost)
			if err != nil {
				g.log.Error("ledger refused a settlement", "attempt", grant.Attempt, "err", err)
			}
			c.Charged, c.Overrun = charged, overrun
			if overrun > 0 {
				g.log.Warn("provider reported more than the call's bound", "provider", rt.provider.Name, "model", req.Model,
					"attempt", grant.Attempt, "bound", plan.Bound, "reported", c.Cost)
			}
			c.Chain = g.finish(ctx, c)
		})
	}
	defer settle()
	fwd, err := a.rewrite(req, rt, plan.MaxOutput)
	if err == nil && len(fwd) > len(longest) {
		err = fmt.Errorf("rewritten body of %d bytes is longer than its bound's %d", len(fwd), len(longest))
	}
	if err != nil {
		c.Status, c.Error = http.StatusInternalServerError, err.Error()
		writeAPIError(w, a.api, http.StatusInternalServerError, errAPI, err.Error())
		return
	}
	if !bytes.Equal(fwd, body) {
		c.Forwarded = g.put(ctx, fwd)
	}
	g.forward(ctx, w, ext, a, rt, req, fwd, &c, settle)
}

// InputBound is the most input tokens a request body of n bytes with the
// given images can cost at model m: one token per byte (every tokenizer
// in use is byte-level BPE or has byte fallback, so a token covers at
// least one byte of text, and JSON never encodes text in fewer bytes than
// the text), plus m.ImageTokens per image, plus m.InputOverhead for what
// the provider adds around the messages (chat template, tool-use system
// prompt). The JSON's own keys and punctuation, which are not tokens,
// cover the template's per-message tokens many times over.
func InputBound(n int, images int64, m Model) int64 {
	return add(add(int64(n), mul(images, m.ImageTokens)), m.InputOverhead)
}

// forward makes the call upstream and relays the answer, filling c; a
// whole answer is given only after settle. The provider gets the headers
// the route's preparation chose (ext.Header: Anthropic's version and beta
// flags), never the client's own, and the provider's key.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, ext callExtra, a adapter, rt route, req callRequest, fwd []byte, c *Call, settle func()) {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(g.limits.CallTimeout))
	defer cancel()
	var wrote atomic.Bool
	trace := &httptrace.ClientTrace{WroteRequest: func(i httptrace.WroteRequestInfo) {
		if i.Err == nil {
			wrote.Store(true)
		}
	}}
	endpoint := rt.endpoint
	if a.endpoint != nil {
		endpoint = a.endpoint(rt)
	}
	up, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost, endpoint, bytes.NewReader(fwd))
	if err != nil {
		c.Status, c.Error = http.StatusInternalServerError, err.Error()
		writeAPIError(w, a.api, http.StatusInternalServerError, errAPI, "building the provider request failed")
		return
	}
	up.Header.Set("Content-Type", "application/json")
	if req.Stream {
		up.Header.Set("Accept", "text/event-stream")
	} else {
		up.Header.Set("Accept", "application/json")
	}
	for k, v := range ext.Header {
		up.Header[k] = v
	}
	if rt.provider.API == APIAnthropic {
		up.Header.Set("x-api-key", rt.provider.Key)
	} else if rt.provider.API == APIGemini {
		up.Header.Set("x-goog-api-key", rt.provider.Key)
	} else if rt.provider.Key != "" {
		up.Header.Set("Authorization", "Bearer "+rt.provider.Key)
	}
	resp, err := g.client.Do(up)
	if err != nil {
		c.Error = "calling the provider: " + string(g.scrub([]byte(err.Error())))
		if wrote.Load() {
			// The provider got the call and may bill it.
			g.setUsage(c, rt, Usage{}, false, errors.New("no answer came"))
		}
		status := http.StatusBadGateway
		if errors.Is(err, context.DeadlineExceeded) {
			status = http.StatusGatewayTimeout
		}
		c.Status = status
		settle()
		writeAPIError(w, a.api, status, errAPI, fmt.Sprintf("the provider of %s did not answer", req.Model))
		return
	}
	defer resp.Body.Close()
	headerAt := g.now()
	if resp.StatusCode != http.StatusOK || strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		// The chain's head is known once the answer is recorded: after
		// the body, in a trailer.
		w.Header().Set("Trailer", ChainHeader)
		if resp.StatusCode != http.StatusOK {
			g.relayRefusal(w, a, rt, req, resp, c)
		} else {
			g.relayStream(w, a, rt, req, resp, c, cancel)
		}
		settle()
		w.Header().Set(ChainHeader, c.Chain)
		return
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, g.limits.MaxResponseBytes+1))
	if err == nil && int64(len(b)) > g.limits.MaxResponseBytes {
		err = fmt.Errorf("answer over %d bytes", g.limits.MaxResponseBytes)
	}
	c.FirstTokenMS = ms(headerAt.Sub(c.Started))
	if err != nil {
		c.Status, c.Error = http.StatusBadGateway, "reading the answer: "+err.Error()
		g.setUsage(c, rt, Usage{}, false, errors.New("the answer was not read whole"))
		settle()
		writeAPIError(w, a.api, http.StatusBadGateway, errAPI, fmt.Sprintf("the answer of %s could not be read", req.Model))
		return
	}
	u, found, uerr := a.response(b)
	g.setUsage(c, rt, u, found, uerr)
	b = g.scrub(b)
	c.Response = g.put(ctx, b)
	c.Status = http.StatusOK
	// Charged and recorded before the client has it: a crash after this
	// point cannot have given an answer for free.
	settle()
	g.relayHeaders(w.Header(), resp.Header)
	w.Header().Set(ChainHeader, c.Chain)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// relayRefusal passes a provider's refusal on, except one of the
// gateway's own credentials, which only the operator can act on and whose
// message may quote the key.
func (g *Gateway) relayRefusal(w http.ResponseWriter, a adapter, rt route, req callRequest, resp *http.Response, c *Call) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	b = g.scrub(b)
	c.Response = g.put(context.Background(), b)
	c.Error = fmt.Sprintf("the provider answered %d", resp.StatusCode)
	// Providers do not bill refused calls: nothing is charged.
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		// Never followed (noRedirects): the key would go where the
		// provider points.
		g.log.Error("provider redirected the gateway", "provider", rt.provider.Name, "status", resp.StatusCode,
			"location", string(g.scrub([]byte(resp.Header.Get("Location")))))
		c.Status = http.StatusBadGateway
		writeAPIError(w, a.api, http.StatusBadGateway, errAPI, fmt.Sprintf("the provider of %s answered with a redirect, which the gateway does not follow; tell the operator", req.Model))
		return
	}
	if resp.StatusCode == http.StatusUnauthorized || resp.StatusCode == http.StatusForbidden {
		g.log.Error("provider refused the gateway's credentials", "provider", rt.provider.Name, "status", resp.StatusCode, "answer", string(b))
		c.Status = http.StatusBadGateway
		writeAPIError(w, a.api, http.StatusBadGateway, errAPI, fmt.Sprintf("the provider of %s refused the gateway's credentials; tell the operator", req.Model))
		return
	}
	c.Status = resp.StatusCode
	g.relayHeaders(w.Header(), resp.Header)
	w.Header().Set("Content-Type", relayedContentType(resp.Header.Get("Content-Type")))
	w.WriteHeader(resp.StatusCode)
	_, _ = w.Write(b)
}

// relayStream passes a stream on event by event, each flushed as soon as
// no other has arrived behind it, and rebuilds the answer. A client that did not ask for OpenAI's usage chunk
// does not get it (the gateway asked for it). When the client goes away
// the call upstream is cancelled.
func (g *Gateway) relayStream(w http.ResponseWriter, a adapter, rt route, req callRequest, resp *http.Response, c *Call, cancel context.CancelFunc) {
	g.relayHeaders(w.Header(), resp.Header)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	c.Status = http.StatusOK
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	asm := a.assembler()
	rd := newSSEReader(resp.Body, g.limits.MaxEventBytes, g.limits.MaxResponseBytes)
	var raw bytes.Buffer
	var problems []string
	for {
		ev, err := rd.Next()
		raw.Write(ev.Raw)
		pass := len(ev.Raw) > 0
		if err == nil && len(ev.Data) > 0 {
			info, aerr := asm.Event(ev.Data)
			if aerr != nil && len(problems) < 4 {
				problems = append(problems, aerr.Error())
			}
			if info.Token && c.FirstTokenMS == 0 {
				c.FirstTokenMS = ms(g.now().Sub(c.Started))
			}
			if info.UsageOnly && !req.IncludeUsage {
				pass = false
			}
		}
		if pass {
			_, werr := w.Write(g.scrub(ev.Raw))
			// Flush unless the next event is already here: it is written
			// at once and flushed with this one, which delays nothing.
			if werr == nil && (err != nil || !rd.Ready()) {
				werr = rc.Flush()
			}
			if werr != nil {
				problems = append(problems, "the client stopped reading the stream")
				cancel()
				break
			}
		}
		if err != nil {
			// A client that leaves as soon as the last event came (Codex
			// does) cancels the read of the stream's end: not a problem.
			if !errors.Is(err, io.EOF) && !(asm.Complete() && errors.Is(err, context.Canceled)) {
				problems = append(problems, "reading the stream: "+err.Error())
			}
			break
		}
	}
	if !asm.Complete() {
		problems = append(problems, "the stream ended before its last event")
	}
	c.Error = strings.Join(problems, "; ")
	u, found, uerr := asm.Usage()
	g.setUsage(c, rt, u, found, uerr)
	c.Response = g.put(context.Background(), g.scrub(asm.Response()))
	c.StreamBytes = g.put(context.Background(), g.scrub(raw.Bytes()))
}

// setUsage sets c's usage and cost: the reported usage at the model's
// price, or, when no valid usage came, the call's bound (the most it can
// have cost).
func (g *Gateway) setUsage(c *Call, rt route, u Usage, found bool, err error) {
	if err != nil {
		c.UsageError = err.Error()
	}
	if !found || err != nil {
		c.UsageReported, c.Usage, c.Cost = false, Usage{}, c.Bound
		if c.UsageError == "" {
			c.UsageError = "the provider reported no usage"
		}
		return
	}
	c.UsageReported, c.Usage, c.Cost = true, u, Cost(rt.price, u)
}

// scrub replaces every provider key in b.
func (g *Gateway) scrub(b []byte) []byte {
	for _, k := range g.secrets {
		if bytes.Contains(b, k) {
			b = bytes.ReplaceAll(b, k, []byte("[redacted]"))
		}
	}
	return b
}

// put records data and returns its CID ("" when the recorder failed,
// which is logged: the call goes on).
func (g *Gateway) put(ctx context.Context, data []byte) string {
	id, err := g.rec.Put(context.WithoutCancel(ctx), data)
	if err != nil {
		g.log.Error("recording a body failed", "err", err)
		return ""
	}
	return id
}

// finish links c into its attempt's chain, records it and returns the
// chain's head after it ("" when the chain could not be read: logged).
func (g *Gateway) finish(ctx context.Context, c Call) string {
	end := g.now()
	c.Ended = end.UTC()
	c.TotalMS = ms(end.Sub(c.Started))
	ctx = context.WithoutCancel(ctx)
	g.chains.mu.Lock()
	defer g.chains.mu.Unlock()
	prev, err := g.chainHead(ctx, c.Attempt)
	if err == nil {
		var rq, an [32]byte
		rq, err = BodySum(c.Request)
		if err == nil {
			an, err = BodySum(c.Response)
		}
		c.Chain = verify.LinkSums(prev, rq, an)
	}
	if err != nil {
		c.Chain = ""
		g.log.Error("linking a call into its chain failed", "attempt", c.Attempt, "err", err)
	}
	if _, err := g.rec.Append(ctx, c); err != nil {
		g.log.Error("recording a call failed", "attempt", c.Attempt, "err", err)
	} else if c.Chain != "" {
		if len(g.chains.heads) >= maxKeptHeads {
			// Heads are kept to spare reading records; any is read back.
			clear(g.chains.heads)
		}
		g.chains.heads[c.Attempt] = c.Chain
	}
	g.log.Debug("model call", "attempt", c.Attempt, "model", c.Model, "status", c.Status, "input", c.Usage.Input,
		"output", c.Usage.Output, "cost", c.Cost, "charged", c.Charged, "ms", c.TotalMS)
	return c.Chain
}

// chainHead is the head of attempt's chain (under chains.mu): kept since
// its last call, or read back from its records (after a restart).
func (g *Gateway) chainHead(ctx context.Context, attempt string) (string, error) {
	if h, ok := g.chains.heads[attempt]; ok {
		return h, nil
	}
	calls, err := g.rec.Calls(ctx, attempt)
	if err != nil {
		return "", fmt.Errorf("chain of %s: %w", attempt, err)
	}
	return ChainOf(attempt, calls)
}

// ChainOf is the head of an attempt's chain after its recorded calls:
// the coordinator checks a report's head with it.
func ChainOf(attempt string, calls []Call) (string, error) {
	h := verify.Genesis(attempt)
	for _, c := range calls {
		rq, err := BodySum(c.Request)
		if err != nil {
			return "", fmt.Errorf("chain of %s: call %d: %w", attempt, c.Seq, err)
		}
		an, err := BodySum(c.Response)
		if err != nil {
			return "", fmt.Errorf("chain of %s: call %d: %w", attempt, c.Seq, err)
		}
		h = verify.LinkSums(h, rq, an)
	}
	return h, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeAPIError(w, APIOpenAI, http.StatusInternalServerError, errAPI, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}
