// Package modelsim is a scripted model server speaking OpenAI's chat
// completions (POST /v1/chat/completions, streaming or not, with tool
// calls, usage and top logprobs), OpenAI's Responses API (POST
// /v1/responses, streaming or not, with function and custom tool calls,
// reasoning items and usage with cached and reasoning tokens;
// responses.go), Anthropic's Messages API (POST /v1/messages, streaming
// or not, with tool use, extended thinking, provider-side web searches
// and usage with its cache reads and writes; POST
// /v1/messages/count_tokens) and Google's Gemini API (POST
// /v1beta/models/{model}:generateContent, :streamGenerateContent?alt=sse
// and :countTokens, with function calls and usage metadata, cached and
// thinking tokens included: gemini.go). It stands in
// for every model provider in tests, benchmarks and the demo; nothing in
// repronet calls a real provider in a test.
//
// Replies come from a Script: rules on the conversation so far (which
// reply of the conversation this is, what the last message or tool result
// says, which tools are offered, the tool choice), tried in order. Matching looks only at
// the request, so replies are deterministic and concurrent conversations
// independent. A reply may set its latency (before the first token and
// between tokens), its token counts, its top logprobs, a provider error,
// or misbehaviour a gateway must survive (ignoring max_tokens,
// over-reporting usage, dropping usage, cutting a stream). Every request
// received is recorded for tests to assert on.
//
// It owns only its own listener; it must not be used to reach anything but
// the client in front of it.
package modelsim

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Options configure a Server.
type Options struct {
	// APIKey, when set, is the key every request must present
	// (Authorization: Bearer for OpenAI, x-api-key for Anthropic,
	// x-goog-api-key or ?key= for Gemini). A
	// wrong key is answered 401 with the key presented echoed in the
	// message, as the worst provider would.
	APIKey string
	// Created is the "created" time of every OpenAI reply (Unix seconds);
	// 0: 1700000000.
	Created int64
	// MaxBodyBytes bounds a request body; 0: 64 MiB.
	MaxBodyBytes int64
}

// Recorded is a request the server received.
type Recorded struct {
	Method, Path string
	Header       http.Header
	Body         []byte
	At           time.Time
}

// Server is a scripted model server.
type Server struct {
	opts Options

	mu     sync.Mutex
	script Script
	reqs   []Recorded

	ln   net.Listener
	srv  *http.Server
	done chan struct{}
}

// New returns a server answering from script; serve it with ServeHTTP or
// Start one with Start.
func New(script Script, opts Options) *Server {
	if opts.Created == 0 {
		opts.Created = 1700000000
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 64 << 20
	}
	return &Server{script: script, opts: opts}
}

// Start serves a new server on a loopback port until Close.
func Start(script Script, opts Options) (*Server, error) {
	s := New(script, opts)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("modelsim: listen: %w", err)
	}
	s.ln = ln
	s.srv = &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second}
	s.done = make(chan struct{})
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(ln)
	}()
	return s, nil
}

// URL is the server's base URL, e.g. http://127.0.0.1:41234 (the OpenAI
// base URL is URL()+"/v1").
func (s *Server) URL() string { return "http://" + s.ln.Addr().String() }

// Close stops a started server and every connection.
func (s *Server) Close() error {
	if s.srv == nil {
		return nil
	}
	err := s.srv.Close()
	<-s.done
	return err
}

// Chat posts an OpenAI chat completions request body to a started server
// over loopback and returns the response body; a status other than 200 is
// an error quoting the body. It is the provider a test's judge calls
// without a gateway (it has bench.Models' method).
func (s *Server) Chat(ctx context.Context, body json.RawMessage) (json.RawMessage, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if s.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.opts.APIKey)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("modelsim: %s: %s", resp.Status, b)
	}
	return b, nil
}

// SetScript replaces the script for the requests that follow.
func (s *Server) SetScript(script Script) {
	s.mu.Lock()
	s.script = script
	s.mu.Unlock()
}

// Requests are the requests received so far, in order of arrival.
func (s *Server) Requests() []Recorded {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Recorded, len(s.reqs))
	copy(out, s.reqs)
	return out
}

// ServeHTTP answers one request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxBodyBytes))
	s.mu.Lock()
	s.reqs = append(s.reqs, Recorded{Method: r.Method, Path: r.URL.Path, Header: r.Header.Clone(), Body: bytes.Clone(body), At: time.Now()})
	script := s.script
	s.mu.Unlock()

	var api string
	gmModel, gmMethod, isGemini := geminiPath(r.URL.Path)
	switch {
	case r.URL.Path == "/v1/chat/completions":
		api = "openai"
	case r.URL.Path == "/v1/messages", r.URL.Path == "/v1/messages/count_tokens":
		api = "anthropic"
	case r.URL.Path == "/v1/responses":
		api = "responses"
	case isGemini:
		api = "gemini"
	default:
		http.Error(w, "modelsim: no such endpoint: "+r.URL.Path, http.StatusNotFound)
		return
	}
	if err != nil {
		writeError(w, api, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body: %v", err))
		return
	}
	if r.Method != http.MethodPost {
		writeError(w, api, http.StatusMethodNotAllowed, "use POST")
		return
	}
	if s.opts.APIKey != "" {
		got := r.Header.Get("x-api-key")
		switch api {
		case "openai", "responses":
			got = bearer(r.Header.Get("Authorization"))
		case "gemini":
			got = geminiKey(r)
		}
		if got != s.opts.APIKey {
			writeError(w, api, http.StatusUnauthorized, "Incorrect API key provided: "+got)
			return
		}
	}
	parse := ParseOpenAI
	switch {
	case r.URL.Path == "/v1/messages/count_tokens":
		parse = ParseAnthropicCount
	case api == "anthropic":
		parse = ParseAnthropic
	case api == "responses":
		parse = ParseResponses
	case api == "gemini":
		if gmMethod == "countTokens" {
			serveGeminiCount(w, body)
			return
		}
		parse = func(b []byte) (Request, error) { return ParseGemini(b, gmModel, gmMethod == "streamGenerateContent") }
	}
	req, err := parse(body)
	if err != nil {
		writeError(w, api, http.StatusBadRequest, err.Error())
		return
	}
	for _, line := range r.Header.Values("anthropic-beta") {
		for _, f := range strings.Split(line, ",") {
			if f = strings.TrimSpace(f); f != "" {
				req.Betas = append(req.Betas, f)
			}
		}
	}
	if r.URL.Path == "/v1/messages/count_tokens" {
		// The count is what a reply's usage reports by default: a
		// quarter of the body's bytes.
		writeJSON(w, http.StatusOK, map[string]int64{"input_tokens": int64(len(body)+3) / 4})
		return
	}
	reply, err := script.Match(req)
	if err != nil {
		writeError(w, api, http.StatusInternalServerError, err.Error())
		return
	}
	if reply.Status != 0 {
		writeError(w, api, reply.Status, reply.Error)
		return
	}
	p := planReply(reply, req)
	id := replyID(body)
	switch api {
	case "openai":
		s.serveOpenAI(w, r.Context(), req, reply, p, id)
	case "responses":
		s.serveResponses(w, r.Context(), req, reply, p, id)
	case "anthropic":
		s.serveAnthropic(w, r.Context(), req, reply, p, id)
	default:
		s.serveGemini(w, r.Context(), req, reply, p, id)
	}
	if req.Stream && reply.LingerAfter > 0 {
		t := time.NewTimer(reply.LingerAfter)
		defer t.Stop()
		select {
		case <-t.C:
		case <-r.Context().Done():
		}
	}
}

func bearer(h string) string {
	const prefix = "Bearer "
	if len(h) > len(prefix) && h[:len(prefix)] == prefix {
		return h[len(prefix):]
	}
	return h
}

// pacer sleeps before each token as the reply says.
type pacer struct {
	ctx   context.Context
	reply Reply
	n     int
}

// next waits for the next token; it fails when the request is gone.
func (p *pacer) next() error {
	d := p.reply.TokenDelay
	if p.n == 0 {
		d = p.reply.FirstTokenDelay
	}
	p.n++
	if d <= 0 {
		return p.ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-p.ctx.Done():
		return p.ctx.Err()
	}
}

// tick waits for the next token of a stream: false when the request or
// the stream is gone; a scripted cut aborts the response.
func (p *pacer) tick(out *sse) bool {
	if p.next() != nil || out.err != nil {
		return false
	}
	if p.reply.CutAfter > 0 && p.n > p.reply.CutAfter {
		cut()
	}
	return true
}

// waitAll waits as long as streaming n tokens would take.
func (p *pacer) waitAll(n int64) error {
	for range max(n, 1) {
		if err := p.next(); err != nil {
			return err
		}
	}
	return nil
}

// sse writes server-sent events and flushes each.
type sse struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func newSSE(w http.ResponseWriter) *sse {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sse{w: w, rc: http.NewResponseController(w)}
}

func (s *sse) event(name string, data []byte) {
	if s.err != nil {
		return
	}
	var b bytes.Buffer
	if name != "" {
		b.WriteString("event: " + name + "\n")
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	if _, err := s.w.Write(b.Bytes()); err != nil {
		s.err = err
		return
	}
	if err := s.rc.Flush(); err != nil {
		s.err = err
	}
}

// cut aborts the response without ending it properly.
func cut() { panic(http.ErrAbortHandler) }
