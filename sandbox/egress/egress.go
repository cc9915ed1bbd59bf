// Package egress is the node's egress proxy for attempts: an HTTP proxy
// (plain HTTP requests in absolute form, and HTTPS through CONNECT
// tunnels, never intercepted) that a proxy-mode attempt reaches on the
// host end of its network link, and through which it reaches the host
// names of its allow-list and nothing else.
//
// Every connection is decided by name: the name must match the attempt's
// allow-list and the node's narrowing list (Config.Restrict), the port
// must be allowed (Config.Ports), and the proxy resolves the name once
// itself and connects to an address it checked — never the node's own
// addresses, loopback, private, link-local (cloud metadata), shared,
// multicast or reserved ranges, unless Config.Permit names them (a LAN
// mirror) — so that a name resolving to a private address (DNS rebinding)
// is refused. Address literals are refused. Every refusal is counted per
// attempt, reported to Config.OnRefuse and logged with the attempt.
//
// It owns, per attempt, one listener (on the address the sandbox gives
// it), the connections accepted there and the upstream connections it
// opens for them. It does not touch the attempt's namespace or firewall
// (sandbox/netns keeps the attempt from reaching anything but this
// proxy), keeps nothing between attempts but what Config.Transport keeps
// (the package cache), and does not carry model traffic (that goes
// through the gateway).
package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Resolver looks host names up; *net.Resolver is one. Tests map names to
// addresses they serve.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Refusal is one connection or request the proxy refused.
type Refusal struct {
	Attempt string
	Host    string // as asked for (a name, or an address literal)
	Port    uint16
	Reason  string
	Addr    netip.Addr // the checked address that was refused, when the name resolved
}

// Config sets up a Proxy.
type Config struct {
	// Restrict narrows every attempt's allow-list (the node's flag): a
	// host must match both. Empty: the attempt's list alone.
	Restrict []string
	// Permit lists addresses the proxy may connect to although they are
	// not public (a mirror on the volunteer's LAN). Empty: none.
	Permit []netip.Prefix
	// Ports are the destination ports allowed (default 80 and 443).
	Ports []uint16
	// Resolver looks names up (default net.DefaultResolver).
	Resolver Resolver
	// Dial opens upstream connections to checked addresses (default a
	// net.Dialer with a 30 s timeout).
	Dial func(ctx context.Context, network, address string) (net.Conn, error)
	// Transport, when set, wraps each attempt's upstream HTTP transport
	// for plain HTTP requests (the package cache: pkgcache.Cache.Wrap).
	Transport func(attempt string, next http.RoundTripper) http.RoundTripper
	// OnRefuse is called for every refusal, after it is counted.
	OnRefuse func(Refusal)
	// MaxConns caps an attempt's open client connections (default 64);
	// connections past it are closed and counted as refused.
	MaxConns int
	// Logger logs refusals (the first 100 of each attempt, then a count
	// at its end) and failures (default slog.Default()).
	Logger *slog.Logger
}

// Proxy serves attempts. It is safe for concurrent use.
type Proxy struct {
	restrict []string
	permit   []netip.Prefix
	ports    []uint16
	resolver Resolver
	dial     func(ctx context.Context, network, address string) (net.Conn, error)
	wrap     func(attempt string, next http.RoundTripper) http.RoundTripper
	onRefuse func(Refusal)
	maxConns int
	log      *slog.Logger
	// kept holds the egress records of closed sessions until taken.
	kept kept
}

// maxLoggedRefusals is how many refusals of one attempt are logged one by
// one; the rest are counted and logged as a total when it ends.
const maxLoggedRefusals = 100

// New checks cfg.
func New(cfg Config) (*Proxy, error) {
	restrict, err := ParseHosts(cfg.Restrict)
	if err != nil {
		return nil, fmt.Errorf("egress: restrict: %w", err)
	}
	p := &Proxy{restrict: restrict, permit: cfg.Permit, ports: cfg.Ports, resolver: cfg.Resolver, dial: cfg.Dial,
		wrap: cfg.Transport, onRefuse: cfg.OnRefuse, maxConns: cfg.MaxConns, log: cfg.Logger}
	for _, pr := range p.permit {
		if !pr.IsValid() {
			return nil, errors.New("egress: permit: invalid prefix")
		}
	}
	if len(p.ports) == 0 {
		p.ports = []uint16{80, 443}
	}
	if slices.Contains(p.ports, 0) {
		return nil, errors.New("egress: port 0 in Ports")
	}
	if p.resolver == nil {
		p.resolver = net.DefaultResolver
	}
	if p.dial == nil {
		d := &net.Dialer{Timeout: 30 * time.Second}
		p.dial = d.DialContext
	}
	if p.maxConns <= 0 {
		p.maxConns = 64
	}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.log = p.log.With("component", "egress")
	return p, nil
}

// ServeAttempt listens on listen (the host end of the attempt's link) and
// serves attempt there until the returned stop is called: only connections
// from client (when valid) are served, and they reach hosts (an allow-list
// as ParseHosts takes) and nothing else. stop closes the listener and
// every connection and returns how many requests were refused. It is what
// the sandbox calls for a proxy-mode attempt (sandbox.EgressProxy).
func (p *Proxy) ServeAttempt(attempt string, listen netip.AddrPort, client netip.Addr, hosts []string) (func() uint64, error) {
	ln, err := net.Listen("tcp", listen.String())
	if err != nil {
		return nil, fmt.Errorf("egress: listen for %s on %s: %w", attempt, listen, err)
	}
	s, err := p.Start(attempt, ln, client, hosts)
	if err != nil {
		ln.Close()
		return nil, err
	}
	return s.Close, nil
}

// Session is one attempt's proxy.
type Session struct {
	p       *Proxy
	attempt string
	hosts   []string
	client  netip.Addr
	ln      net.Listener
	srv     *http.Server
	tr      *http.Transport
	rt      http.RoundTripper
	log     *slog.Logger

	refused atomic.Uint64
	conns   chan struct{} // a slot per open client connection
	rec     recorder
	active  sync.WaitGroup // tunnels being spliced

	mu      sync.Mutex
	tunnels map[net.Conn]bool // hijacked client and upstream connections
	closed  bool
	done    chan struct{}
}

// Start serves attempt on ln (which it closes when the session is
// closed); see ServeAttempt.
func (p *Proxy) Start(attempt string, ln net.Listener, client netip.Addr, hosts []string) (*Session, error) {
	allowed, err := ParseHosts(hosts)
	if err != nil {
		return nil, fmt.Errorf("egress: allow-list of %s: %w", attempt, err)
	}
	s := &Session{p: p, attempt: attempt, hosts: allowed, client: client.Unmap(), ln: ln,
		log: p.log.With("attempt", attempt), conns: make(chan struct{}, p.maxConns),
		tunnels: map[net.Conn]bool{}, done: make(chan struct{})}
	s.tr = &http.Transport{
		Proxy:                 nil, // never the node's own proxy settings
		DialContext:           s.dialChecked,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
		DisableCompression:    true, // bytes pass as the server sent them
	}
	s.rt = s.tr
	if p.wrap != nil {
		s.rt = p.wrap(attempt, s.tr)
	}
	s.srv = &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed { // a hijacked one frees its slot when its tunnel ends
				<-s.conns
			}
		},
	}
	go func() {
		defer close(s.done)
		_ = s.srv.Serve(&sessionListener{Listener: ln, s: s})
	}()
	s.log.Debug("egress proxy serving", "listen", ln.Addr().String(), "hosts", len(allowed))
	return s, nil
}

// Addr is where the session listens.
func (s *Session) Addr() net.Addr { return s.ln.Addr() }

// Refused is how many requests and connections were refused so far.
func (s *Session) Refused() uint64 { return s.refused.Load() }

// Record is the session's egress record so far (complete once closed).
func (s *Session) Record() Record { return s.rec.record() }

// Close stops the session: the listener, every client connection and
// tunnel, the upstream connections. It returns Refused() and is idempotent.
// The Proxy keeps the session's Record for TakeRecord.
func (s *Session) Close() uint64 {
	s.mu.Lock()
	first := !s.closed
	s.closed = true
	tunnels := s.tunnels
	s.tunnels = map[net.Conn]bool{}
	s.mu.Unlock()
	if first {
		_ = s.srv.Close() // closes the listener and the connections it tracks
		for c := range tunnels {
			_ = c.Close()
		}
		<-s.done
		s.active.Wait() // their bytes are counted
		s.tr.CloseIdleConnections()
		s.p.kept.put(s.attempt, s.rec.record())
		if n := s.refused.Load(); n > 0 {
			s.log.Info("egress proxy closed", "refused", n)
		}
	}
	return s.refused.Load()
}

// sessionListener admits connections from the attempt's address alone and
// at most MaxConns at once.
type sessionListener struct {
	net.Listener
	s *Session
}

func (l *sessionListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		from, _ := netip.ParseAddrPort(c.RemoteAddr().String())
		if l.s.client.IsValid() && from.Addr().Unmap() != l.s.client {
			l.s.refuseAs(Refusal{Host: from.Addr().String(), Reason: "connection from outside the attempt"}, "") // not the attempt's
			c.Close()
			continue
		}
		select {
		case l.s.conns <- struct{}{}:
			return c, nil
		default:
			l.s.refuseAs(Refusal{Host: from.Addr().String(), Reason: fmt.Sprintf("more than %d connections at once", cap(l.s.conns))},
				ConnectionLimitHost)
			c.Close()
		}
	}
}

// refusedError is a refusal on the way out of a dial.
type refusedError struct{ r Refusal }

func (e *refusedError) Error() string {
	if e.r.Addr.IsValid() {
		return fmt.Sprintf("egress: %s:%d (%s): %s", e.r.Host, e.r.Port, e.r.Addr, e.r.Reason)
	}
	return fmt.Sprintf("egress: %s:%d: %s", e.r.Host, e.r.Port, e.r.Reason)
}

// refuse counts a refusal of a request for r.Host.
func (s *Session) refuse(r Refusal) { s.refuseAs(r, r.Host) }

// refuseAs counts a refusal, in the record under host ("": not there).
func (s *Session) refuseAs(r Refusal, host string) {
	if host != "" {
		s.rec.count(host, refusals, 1)
	}
	r.Attempt = s.attempt
	n := s.refused.Add(1)
	if n <= maxLoggedRefusals {
		s.log.Warn("egress refused", "host", r.Host, "port", r.Port, "addr", r.Addr, "reason", r.Reason, "refused", n)
	}
	if s.p.onRefuse != nil {
		s.p.onRefuse(r)
	}
}

// check decides host:port by name and port, before any lookup.
func (s *Session) check(host string, port uint16) *Refusal {
	r := &Refusal{Host: host, Port: port}
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	switch {
	case checkName(name) != nil:
		r.Reason = "not a host name (address literals are refused)"
	case !slices.Contains(s.p.ports, port):
		r.Reason = "port not allowed"
	case !MatchHost(s.hosts, name):
		r.Reason = "host not on the attempt's allow-list"
	case len(s.p.restrict) > 0 && !MatchHost(s.p.restrict, name):
		r.Reason = "host not on the node's allow-list"
	default:
		return nil
	}
	return r
}

// resolve looks name up once and returns its addresses if every one may be
// reached; a name with any address the proxy must not reach is refused
// whole (a rebinding name may return a public and a private address).
func (s *Session) resolve(ctx context.Context, host string, port uint16) ([]netip.Addr, error) {
	addrs, err := s.p.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, fmt.Errorf("egress: look up %s: %w", host, err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("egress: look up %s: no address", host)
	}
	own := ownAddrs()
	out := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		a = a.Unmap()
		if !s.reachable(a, own) {
			return nil, &refusedError{Refusal{Host: host, Port: port, Addr: a, Reason: "name resolves to an address the proxy does not reach"}}
		}
		out = append(out, a)
	}
	return out, nil
}

// reachable: Permit wins; otherwise public and not the node's own.
func (s *Session) reachable(a netip.Addr, own map[netip.Addr]bool) bool {
	for _, p := range s.p.permit {
		if p.Contains(a) {
			return true
		}
	}
	return isPublic(a) && !own[a]
}

// ownAddrs lists the node's addresses: a public address of the node is
// the node's own services, not the internet.
func ownAddrs() map[netip.Addr]bool {
	out := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return out
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok {
				out[ip.Unmap()] = true
			}
		}
	}
	return out
}

// connect checks host:port, resolves it once and dials the checked
// addresses in turn.
func (s *Session) connect(ctx context.Context, host string, port uint16) (net.Conn, error) {
	if r := s.check(host, port); r != nil {
		return nil, &refusedError{*r}
	}
	addrs, err := s.resolve(ctx, host, port)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, a := range addrs {
		c, err := s.p.dial(ctx, "tcp", netip.AddrPortFrom(a, port).String())
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
	}
	return nil, fmt.Errorf("egress: connect to %s:%d: %w", host, port, errors.Join(errs...))
}

// dialChecked is the upstream transport's dialer: every connection it
// opens goes through connect's checks.
func (s *Session) dialChecked(ctx context.Context, _, address string) (net.Conn, error) {
	host, portStr, err := net.SplitHostPort(address)
	if err != nil {
		return nil, err
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("egress: port %q: %w", portStr, err)
	}
	return s.connect(ctx, host, uint16(port))
}

// ServeHTTP proxies one request: CONNECT opens a tunnel, anything else
// must be an absolute http:// URL.
func (s *Session) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect {
		s.tunnel(w, r)
		return
	}
	if r.URL.Scheme != "http" || r.URL.Host == "" {
		s.refuse(Refusal{Host: r.Host, Reason: "not a proxy request (want an absolute http:// URL or CONNECT)"})
		http.Error(w, "egress proxy: send absolute http:// URLs, or CONNECT for https", http.StatusBadRequest)
		return
	}
	host, port, ok := splitHostPort(r.URL.Host, 80)
	if !ok {
		s.refuse(Refusal{Host: r.URL.Host, Reason: "bad host"})
		http.Error(w, "egress proxy: bad host", http.StatusBadRequest)
		return
	}
	if ref := s.check(host, port); ref != nil {
		s.refuse(*ref)
		http.Error(w, "egress proxy: refused: "+ref.Reason, http.StatusForbidden)
		return
	}
	counts := s.rec.of(host)
	if counts == nil {
		counts = &hostCounts{} // past the tracked hosts: counted as omitted
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = countingReader{r: r.Body, n: &counts.sent}
	}
	var failed bool
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL = pr.In.URL
			pr.Out.Host = "" // the Host header is the checked URL's host, whatever the client sent
			pr.Out.Header.Del("Proxy-Authorization")
			pr.Out.Header.Del("Proxy-Connection")
		},
		Transport: s.rt,
		ErrorLog:  slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		// w, not the counting writer: the proxy's own answers are not the
		// host's bytes.
		ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) {
			failed = true
			var re *refusedError
			if errors.As(err, &re) {
				s.refuse(re.r)
				http.Error(w, "egress proxy: refused: "+re.r.Reason, http.StatusForbidden)
				return
			}
			counts.failed.Add(1)
			s.log.Debug("egress upstream failed", "url", r.URL.String(), "err", err)
			http.Error(w, "egress proxy: upstream failed: "+err.Error(), http.StatusBadGateway)
		},
	}
	rp.ServeHTTP(countingResponse{ResponseWriter: w, n: &counts.received}, r)
	if !failed {
		counts.connections.Add(1)
	}
}

// tunnel serves CONNECT host:port: a byte stream to the checked address,
// never looked into.
func (s *Session) tunnel(w http.ResponseWriter, r *http.Request) {
	host, port, ok := splitHostPort(r.Host, 0)
	if !ok || port == 0 {
		s.refuse(Refusal{Host: r.Host, Reason: "CONNECT needs host:port"})
		http.Error(w, "egress proxy: CONNECT needs host:port", http.StatusBadRequest)
		return
	}
	up, err := s.connect(r.Context(), host, port)
	if err != nil {
		var re *refusedError
		if errors.As(err, &re) {
			s.refuse(re.r)
			http.Error(w, "egress proxy: refused: "+re.r.Reason, http.StatusForbidden)
			return
		}
		s.rec.count(host, failures, 1)
		s.log.Debug("egress tunnel failed", "host", host, "port", port, "err", err)
		http.Error(w, "egress proxy: "+err.Error(), http.StatusBadGateway)
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		up.Close()
		http.Error(w, "egress proxy: cannot tunnel", http.StatusInternalServerError)
		return
	}
	client, buf, err := hj.Hijack()
	if err != nil {
		up.Close()
		return
	}
	defer func() { <-s.conns }() // the client connection's slot
	if !s.track(client, up) {
		client.Close()
		up.Close()
		return
	}
	defer s.untrack(client, up)
	counts := s.rec.of(host)
	if counts == nil {
		counts = &hostCounts{} // past the tracked hosts: counted as omitted
	}
	counts.connections.Add(1)
	if _, err := io.WriteString(client, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	splice(countingWriter{w: client, n: &counts.received}, client, buf.Reader, countingWriter{w: up, n: &counts.sent}, up)
}

// splice copies both ways until either side ends, then closes both;
// toClient and toUp write to client and up (counting what passes).
func splice(toClient io.Writer, client net.Conn, pending *bufio.Reader, toUp io.Writer, up net.Conn) {
	done := make(chan struct{}, 2)
	go func() {
		_, _ = io.Copy(toUp, pending) // what the client sent after the head, then the rest
		closeWrite(up)
		done <- struct{}{}
	}()
	go func() {
		_, _ = io.Copy(toClient, up)
		closeWrite(client)
		done <- struct{}{}
	}()
	<-done
	<-done
}

func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
}

func (s *Session) track(cs ...net.Conn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	for _, c := range cs {
		s.tunnels[c] = true
	}
	s.active.Add(1)
	return true
}

func (s *Session) untrack(cs ...net.Conn) {
	s.mu.Lock()
	for _, c := range cs {
		delete(s.tunnels, c)
	}
	s.mu.Unlock()
	for _, c := range cs {
		_ = c.Close()
	}
	s.active.Done()
}

// splitHostPort splits "host[:port]" (an IPv6 literal in brackets), with
// def as the port when none is given.
func splitHostPort(hp string, def uint16) (string, uint16, bool) {
	host, portStr, err := net.SplitHostPort(hp)
	if err != nil {
		if strings.Contains(hp, ":") && !strings.HasPrefix(hp, "[") {
			return "", 0, false
		}
		return strings.Trim(hp, "[]"), def, hp != ""
	}
	port, err := strconv.ParseUint(portStr, 10, 16)
	if err != nil || host == "" {
		return "", 0, false
	}
	return host, uint16(port), true
}
