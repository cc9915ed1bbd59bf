package gateway

import (
	"bytes"
	"mime"
	"net/http"
	"sync"
	"time"
)

// This file keeps provider keys from leaving the gateway by any way but
// the provider's own connection: the provider client never follows a
// redirect (a redirected call would carry the key wherever the provider
// points), and of a provider's answer headers only an allow-list is
// relayed to the agent, each value dropped when it holds a key. It also
// bounds the rate of calls that no budget bounds (token counting).

// relayedHeaders are the provider answer headers passed to the agent:
// what its SDK reads to retry (Retry-After, retry-after-ms,
// x-should-retry) and to quote a request in a bug report (request-id).
// Every other header (cookies, rate-limit details of the operator's
// account, anything a provider may echo) stays in the gateway.
var relayedHeaders = []string{"Retry-After", "Retry-After-Ms", "X-Should-Retry", "Request-Id", "X-Request-Id"}

// maxRelayedHeader bounds a relayed header's value.
const maxRelayedHeader = 256

// noRedirects is c with redirects never followed: the redirect itself is
// the answer (the gateway relays it as a provider error, and never sends
// the key to the place it names).
func noRedirects(c *http.Client) *http.Client {
	out := &http.Client{}
	if c != nil {
		*out = *c
	}
	out.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return out
}

// relayHeaders copies the allow-listed headers of src to dst: one value
// each, short, printable, and holding no provider key.
func (g *Gateway) relayHeaders(dst, src http.Header) {
	for _, k := range relayedHeaders {
		v := src.Get(k)
		if v == "" || len(v) > maxRelayedHeader || !printable(v) || g.holdsSecret([]byte(v)) {
			continue
		}
		dst.Set(k, v)
	}
}

// relayedContentType is a provider error's Content-Type as relayed: its
// media type alone when it is JSON or text, else application/json.
func relayedContentType(ct string) string {
	mt, _, err := mime.ParseMediaType(ct)
	switch {
	case err != nil:
		return "application/json"
	case mt == "application/json", mt == "text/plain", mt == "text/event-stream", mt == "text/html":
		return mt
	}
	return "application/json"
}

// holdsSecret says whether b holds a provider key.
func (g *Gateway) holdsSecret(b []byte) bool {
	for _, k := range g.secrets {
		if bytes.Contains(b, k) {
			return true
		}
	}
	return false
}

func printable(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// rateWindows bound events per key (an attempt) to n per window, in
// fixed windows. Keys are forgotten when their window ends; at most
// maxRateKeys are kept (past that, the oldest windows are dropped, which
// only ever lets a call through early).
type rateWindows struct {
	mu     sync.Mutex
	n      int
	window time.Duration
	keys   map[string]*rateWindow
}

type rateWindow struct {
	start time.Time
	count int
}

const maxRateKeys = 4096

func newRateWindows(n int, window time.Duration) *rateWindows {
	return &rateWindows{n: n, window: window, keys: map[string]*rateWindow{}}
}

// allow counts an event of key at now; false (and the time until the
// window ends) when key has had n in its window.
func (r *rateWindows) allow(key string, now time.Time) (bool, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	w, ok := r.keys[key]
	if !ok || now.Sub(w.start) >= r.window || now.Before(w.start) {
		if !ok && len(r.keys) >= maxRateKeys {
			for k, o := range r.keys {
				if now.Sub(o.start) >= r.window || now.Before(o.start) {
					delete(r.keys, k)
				}
			}
			if len(r.keys) >= maxRateKeys {
				clear(r.keys)
			}
		}
		w = &rateWindow{start: now}
		r.keys[key] = w
	}
	if w.count >= r.n {
		return false, w.start.Add(r.window).Sub(now)
	}
	w.count++
	return true, 0
}
