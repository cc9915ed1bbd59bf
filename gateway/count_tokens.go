package gateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"time"
)

// CallAnthropicCountTokens is the API name of a recorded token counting
// call (POST /v1/messages/count_tokens).
const CallAnthropicCountTokens = "anthropic.count_tokens"

// maxCountAnswer bounds a token count's answer ({"input_tokens": n}).
const maxCountAnswer = 64 << 10

// countTokensAdapter is the endpoint's shape for the handlers shared with
// model calls (errors, replay).
var countTokensAdapter = adapter{api: APIAnthropic, call: CallAnthropicCountTokens, parse: parseCountTokensRequest}

// parseCountTokensRequest reads a token counting request: a JSON object
// naming a model and a non-empty list of messages. The rest (system,
// tools, thinking) passes as it came: counting is free, whatever it
// counts.
func parseCountTokensRequest(body []byte) (callRequest, error) {
	r := callRequest{Choices: 1}
	if err := json.Unmarshal(body, &r.fields); err != nil {
		return r, fmt.Errorf("request body is not a JSON object: %w", err)
	}
	if r.fields == nil {
		return r, errors.New("request body is null, not a JSON object")
	}
	if err := jsonField(r.fields, "model", &r.Model); err != nil || r.Model == "" {
		return r, errors.Join(errors.New("model is required (a string)"), err)
	}
	var msgs []json.RawMessage
	if err := jsonField(r.fields, "messages", &msgs); err != nil {
		return r, err
	}
	if len(msgs) == 0 {
		return r, errors.New("messages is required and not empty")
	}
	return r, nil
}

// parseCountAnswer reads a token count's answer.
func parseCountAnswer(b []byte) (int64, error) {
	var a struct {
		InputTokens *int64 `json:"input_tokens"`
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return 0, fmt.Errorf("token count answer: %w", err)
	}
	if a.InputTokens == nil || *a.InputTokens < 0 {
		return 0, errors.New("token count answer has no input_tokens, or a negative one")
	}
	return *a.InputTokens, nil
}

// serveCountTokens serves POST /v1/messages/count_tokens, which Claude
// Code calls to size its context: forwarded to the model's provider (an
// answer of the gateway's own would be a bound, several times the count,
// and make the agent compact its context early), authorised by the
// attempt's token like a model call, recorded in the attempt's
// trajectory and chain, and charged nothing (Anthropic does not bill it).
// No budget bounds it, so an attempt may make CountTokensPerMinute of
// them a minute (429 past that); its body is bounded like a model call's.
// A replay attempt's are answered from the recorded attempt's.
func (g *Gateway) serveCountTokens(w http.ResponseWriter, r *http.Request) {
	a := countTokensAdapter
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
	if rt.provider.API != APIAnthropic {
		writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, fmt.Sprintf("model %q is not an Anthropic model: it has no token counting endpoint", req.Model))
		return
	}
	if err := grant.Permits(grant.Node, "", req.Model, start); err != nil {
		writeAPIError(w, a.api, http.StatusForbidden, errPermission, err.Error())
		return
	}
	betas, err := checkBetas(r.Header, rt.betas)
	if err != nil {
		writeAPIError(w, a.api, http.StatusBadRequest, errInvalidRequest, err.Error())
		return
	}
	if ok, wait := g.counts.allow(grant.Attempt, start); !ok {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
		writeAPIError(w, a.api, http.StatusTooManyRequests, "rate_limit_error",
			fmt.Sprintf("token counting is limited to %d calls a minute per attempt", g.limits.CountTokensPerMinute))
		return
	}
	if grant.Replay != "" {
		g.serveReplay(w, r, a, grant, req, body, start)
		return
	}
	c := Call{Attempt: grant.Attempt, Lease: grant.Lease, Node: grant.Node.String(), Evaluation: grant.Evaluation,
		Group: grant.Group, Task: grant.Task, API: a.call, Model: req.Model, Upstream: rt.model.Upstream,
		Provider: rt.provider.Name, Started: start.UTC(), UsageReported: true}
	c.Request = g.put(ctx, body)
	f := req.edit()
	f.set("model", rt.model.Upstream)
	fwd, err := marshalFields(f)
	if err != nil {
		writeAPIError(w, a.api, http.StatusInternalServerError, errAPI, err.Error())
		return
	}
	if !bytes.Equal(fwd, body) {
		c.Forwarded = g.put(ctx, fwd)
	}
	finish := func() { w.Header().Set(ChainHeader, g.finish(ctx, c)) }
	cctx, cancel := context.WithTimeout(ctx, time.Duration(g.limits.CallTimeout))
	defer cancel()
	up, err := http.NewRequestWithContext(cctx, http.MethodPost, rt.endpoint+"/count_tokens", bytes.NewReader(fwd))
	if err != nil {
		c.Status, c.Error = http.StatusInternalServerError, err.Error()
		finish()
		writeAPIError(w, a.api, http.StatusInternalServerError, errAPI, "building the provider request failed")
		return
	}
	up.Header.Set("Content-Type", "application/json")
	up.Header.Set("Accept", "application/json")
	up.Header.Set("anthropic-version", cmpOr(r.Header.Get("anthropic-version"), rt.provider.AnthropicVersion))
	if betas != "" {
		up.Header.Set("anthropic-beta", betas)
	}
	up.Header.Set("x-api-key", rt.provider.Key)
	resp, err := g.client.Do(up)
	if err != nil {
		c.Status, c.Error = http.StatusBadGateway, "calling the provider: "+string(g.scrub([]byte(err.Error())))
		if errors.Is(err, context.DeadlineExceeded) {
			c.Status = http.StatusGatewayTimeout
		}
		finish()
		writeAPIError(w, a.api, c.Status, errAPI, fmt.Sprintf("the provider of %s did not answer", req.Model))
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		w.Header().Set("Trailer", ChainHeader)
		g.relayRefusal(w, a, rt, req, resp, &c)
		finish()
		return
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxCountAnswer+1))
	if err == nil && len(b) > maxCountAnswer {
		err = fmt.Errorf("answer over %d bytes", maxCountAnswer)
	}
	if err == nil {
		_, err = parseCountAnswer(b)
	}
	c.FirstTokenMS = ms(g.now().Sub(c.Started))
	if err != nil {
		c.Status, c.Error = http.StatusBadGateway, "reading the answer: "+err.Error()
		finish()
		writeAPIError(w, a.api, http.StatusBadGateway, errAPI, fmt.Sprintf("the token count of %s could not be read", req.Model))
		return
	}
	b = g.scrub(b)
	c.Response, c.Status = g.put(ctx, b), http.StatusOK
	finish()
	g.relayHeaders(w.Header(), resp.Header)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}
