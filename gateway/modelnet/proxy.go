package modelnet

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/internal/httpserve"
)

// Paths the node-side listener forwards; anything else is answered 404
// on the node and never sent.
var forwarded = map[string]string{
	"/v1/chat/completions": http.MethodPost,
	"/v1/responses":        http.MethodPost,
	"/v1/messages":         http.MethodPost,
	"/v1/models":           http.MethodGet,
	// Claude Code sizes its context with it (free; gateway/count_tokens.go).
	"/v1/messages/count_tokens": http.MethodPost,
}

// geminiMethod is the method of a Gemini path: GET for the model list
// (/v1beta/models) and a model (/v1beta/models/{model}), POST for a
// model's methods (/v1beta/models/{model}:generateContent …).
func geminiMethod(path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/v1beta/models")
	switch {
	case !ok || (rest != "" && rest[0] != '/'):
		return "", false
	case strings.Contains(rest, ":"):
		return http.MethodPost, true
	}
	return http.MethodGet, true
}

// ProxyOptions configure a Proxy.
type ProxyOptions struct {
	Limits Limits
	// Attempt is the attempt whose sandbox alone reaches this proxy; its
	// calls carry it in AttemptHeader. Empty: the proxy serves several
	// attempts and names none.
	Attempt string
	// WrapStream, when set, wraps each stream opened to the gateway (to
	// meter or capture what crosses it).
	WrapStream func(net.Conn) net.Conn
	// OnChainHead, when set, is told the conversation chain head each
	// answer carries (ChainHeader, in its header or trailer), once the
	// answer has been passed on whole.
	OnChainHead func(head string)
	// TestRewriteRequest is a test hook (never set in production): it is
	// given each request body and returns the body to forward, so that a
	// test can play a node that rewrites what its agent sends the model
	// (package verify must catch it).
	TestRewriteRequest func(body []byte) []byte
}

// ChainHeader is the header (or trailer) in which the gateway returns the
// attempt's chain head after a call (gateway.ChainHeader).
const ChainHeader = "Repronet-Chain"

// Proxy is the node-side listener: agents in sandboxes call it as their
// model endpoint (OPENAI_BASE_URL is its URL + "/v1", ANTHROPIC_BASE_URL
// and GOOGLE_GEMINI_BASE_URL its URL), and it forwards each call over a Protocol stream to the
// gateway's host.
type Proxy struct {
	srv *httpserve.Server
	tr  *http.Transport
}

// StartProxy listens on addr (TCP; bind it where the sandboxes can reach
// it and nothing else can) and forwards calls from there to gateway over
// h. Requests' contexts derive from ctx.
func StartProxy(ctx context.Context, h host.Host, gateway peer.ID, addr string, o ProxyOptions, log *slog.Logger) (*Proxy, error) {
	l := o.Limits.withDefaults()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			s, err := h.NewStream(ctx, gateway, Protocol)
			if err != nil {
				return nil, fmt.Errorf("open %s stream to %s: %w", Protocol, gateway, err)
			}
			var c net.Conn = &streamConn{Stream: s}
			if o.WrapStream != nil {
				c = o.WrapStream(c)
			}
			return c, nil
		},
		MaxIdleConnsPerHost:    8,
		IdleConnTimeout:        l.IdleTimeout / 2,
		MaxResponseHeaderBytes: int64(l.MaxHeaderBytes),
		ResponseHeaderTimeout:  l.CallTimeout,
		DisableCompression:     true,
	}
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = "repronet-gateway"
			pr.Out.Host = "repronet-gateway"
			pr.Out.Header.Del(AttemptHeader)
			if o.Attempt != "" {
				pr.Out.Header.Set(AttemptHeader, o.Attempt)
			}
		},
		Transport:     tr,
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			if o.OnChainHead != nil {
				resp.Body = &chainBody{ReadCloser: resp.Body, resp: resp, report: o.OnChainHead}
			}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			log.Warn("model call not forwarded", "path", r.URL.Path, "err", err)
			writeError(w, http.StatusBadGateway, "the node could not reach the model gateway: "+err.Error())
		},
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		method, ok := forwarded[r.URL.Path]
		if !ok {
			method, ok = geminiMethod(r.URL.Path)
		}
		if !ok {
			writeError(w, http.StatusNotFound, fmt.Sprintf("no model endpoint %s here (use /v1/chat/completions, /v1/responses, /v1/messages or /v1beta/models/{model}:generateContent)", r.URL.Path))
			return
		}
		if r.Method != method {
			writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s takes %s", r.URL.Path, method))
			return
		}
		if r.ContentLength > l.MaxRequestBytes {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body of %d bytes is over the %d allowed", r.ContentLength, l.MaxRequestBytes))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, l.MaxRequestBytes)
		if o.TestRewriteRequest != nil {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				writeError(w, http.StatusBadRequest, "read the request: "+err.Error())
				return
			}
			b = o.TestRewriteRequest(b)
			r.Body, r.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
			r.Header.Set("Content-Length", strconv.Itoa(len(b)))
		}
		rp.ServeHTTP(w, r)
	})
	srv, err := httpserve.Start(ctx, addr, handler, httpserve.Limits{
		MaxConns:       l.MaxConns,
		HeaderTimeout:  l.HeaderTimeout,
		IdleTimeout:    l.IdleTimeout,
		RequestTimeout: l.CallTimeout,
		MinRate:        16 << 10,
		MaxHeaderBytes: l.MaxHeaderBytes,
	}, log)
	if err != nil {
		return nil, fmt.Errorf("model proxy: %w", err)
	}
	return &Proxy{srv: srv, tr: tr}, nil
}

// Addr is where the proxy listens.
func (p *Proxy) Addr() net.Addr { return p.srv.Addr() }

// URL is the proxy's base URL (http://host:port).
func (p *Proxy) URL() string { return "http://" + p.srv.Addr().String() }

// Close stops the listener, ends every call in progress and closes the
// streams kept for reuse.
func (p *Proxy) Close() error {
	err := p.srv.Close()
	p.tr.CloseIdleConnections()
	return err
}

// writeError answers in OpenAI's error format (Anthropic's clients read
// the status and message the same way).
func writeError(w http.ResponseWriter, status int, msg string) {
	b, _ := json.Marshal(map[string]any{"error": map[string]any{"message": msg, "type": "node_error", "param": nil, "code": nil}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// chainBody tells the chain head of its answer once the answer was read
// to its end (a trailer is known only then).
type chainBody struct {
	io.ReadCloser
	resp   *http.Response
	report func(string)
	done   bool
}

func (b *chainBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		h := b.resp.Header.Get(ChainHeader)
		if t := b.resp.Trailer.Get(ChainHeader); t != "" {
			h = t
		}
		if h != "" {
			b.report(h)
		}
	}
	return n, err
}
