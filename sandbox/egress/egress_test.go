package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// The tests serve "the internet" on 127.0.0.2 (which Config.Permit lets
// the proxy reach) and resolve names with mapResolver; nothing leaves the
// machine.

// mapResolver answers from a map and counts lookups.
type mapResolver struct {
	mu      sync.Mutex
	names   map[string][]netip.Addr
	lookups map[string]int
}

func (m *mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lookups[host]++
	a, ok := m.names[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return a, nil
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, a := range s {
		out[i] = netip.MustParseAddr(a)
	}
	return out
}

type lab struct {
	proxy    *Proxy
	session  *Session
	client   *http.Client // through the proxy
	resolver *mapResolver
	httpPort uint16
	tlsPort  uint16
	refusals chan Refusal
	dialed   chan string
	hits     atomic.Int64
}

// newLab starts an HTTP and an HTTPS server on 127.0.0.2, a proxy whose
// session allows hosts, and a client that uses it.
func newLab(t *testing.T, hosts, restrict []string) *lab {
	t.Helper()
	l := &lab{refusals: make(chan Refusal, 64), dialed: make(chan string, 64)}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		l.hits.Add(1)
		fmt.Fprintf(w, "hello %s %s", r.Host, r.URL.Path)
	})
	listen := func() net.Listener {
		ln, err := net.Listen("tcp", "127.0.0.2:0")
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	plain := httptest.NewUnstartedServer(handler)
	plain.Listener = listen()
	plain.Start()
	t.Cleanup(plain.Close)
	secure := httptest.NewUnstartedServer(handler)
	secure.Listener = listen()
	secure.StartTLS()
	t.Cleanup(secure.Close)
	l.httpPort = uint16(plain.Listener.Addr().(*net.TCPAddr).Port)
	l.tlsPort = uint16(secure.Listener.Addr().(*net.TCPAddr).Port)
	l.resolver = &mapResolver{lookups: map[string]int{}, names: map[string][]netip.Addr{
		"pypi.test":               addrs("127.0.0.2"),
		"files.pythonhosted.test": addrs("127.0.0.2"),
		"loopback.test":           addrs("127.0.0.1"),
		"metadata.test":           addrs("169.254.169.254"),
		"lan.test":                addrs("192.168.1.10"),
		"rebind.test":             addrs("127.0.0.2", "10.0.0.1"),
		"mapped.test":             addrs("::ffff:127.0.0.1"),
	}}
	dialer := &net.Dialer{Timeout: 2 * time.Second}
	p, err := New(Config{
		Restrict: restrict,
		Permit:   []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Ports:    []uint16{l.httpPort, l.tlsPort},
		Resolver: l.resolver,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			l.dialed <- address
			return dialer.DialContext(ctx, network, address)
		},
		OnRefuse: func(r Refusal) { l.refusals <- r },
		Logger:   slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s, err := p.Start("attempt-1", ln, netip.MustParseAddr("127.0.0.1"), hosts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	l.proxy, l.session = p, s
	proxyURL := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	tr := &http.Transport{Proxy: http.ProxyURL(proxyURL), TLSClientConfig: &tls.Config{RootCAs: secure.Client().Transport.(*http.Transport).TLSClientConfig.RootCAs, ServerName: "example.com"}}
	t.Cleanup(tr.CloseIdleConnections)
	l.client = &http.Client{Transport: tr, Timeout: 5 * time.Second}
	return l
}

func (l *lab) get(t *testing.T, rawURL string) (int, string) {
	t.Helper()
	resp, err := l.client.Get(rawURL)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProxyAllows(t *testing.T) {
	l := newLab(t, []string{"pypi.test", "*.pythonhosted.test"}, nil)
	code, body := l.get(t, fmt.Sprintf("http://pypi.test:%d/simple/", l.httpPort))
	if code != 200 || body != fmt.Sprintf("hello pypi.test:%d /simple/", l.httpPort) {
		t.Fatalf("plain HTTP: %d %q", code, body)
	}
	// HTTPS through a CONNECT tunnel: the proxy sees no content.
	code, body = l.get(t, fmt.Sprintf("https://files.pythonhosted.test:%d/pkg.whl", l.tlsPort))
	if code != 200 || !strings.HasSuffix(body, "/pkg.whl") {
		t.Fatalf("HTTPS: %d %q", code, body)
	}
	if n := l.session.Refused(); n != 0 {
		t.Fatalf("refused %d", n)
	}
	// Every dial went to the checked address of the name.
	close(l.dialed)
	for a := range l.dialed {
		if !strings.HasPrefix(a, "127.0.0.2:") {
			t.Fatalf("dialed %s", a)
		}
	}
}

func TestProxyRefuses(t *testing.T) {
	l := newLab(t, []string{"pypi.test", "loopback.test", "metadata.test", "lan.test", "rebind.test", "mapped.test", "*.pythonhosted.test"},
		[]string{"pypi.test", "loopback.test", "metadata.test", "lan.test", "rebind.test", "mapped.test"})
	hp, tp := l.httpPort, l.tlsPort
	for _, tc := range []struct {
		url, reason string
	}{
		{fmt.Sprintf("http://other.test:%d/", hp), "host not on the attempt's allow-list"},
		{fmt.Sprintf("http://files.pythonhosted.test:%d/", hp), "host not on the node's allow-list"},
		{fmt.Sprintf("http://pypi.test:%d/", hp+1), "port not allowed"},
		{fmt.Sprintf("http://127.0.0.2:%d/", hp), "not a host name (address literals are refused)"},
		{fmt.Sprintf("http://[::1]:%d/", hp), "not a host name (address literals are refused)"},
		{fmt.Sprintf("http://169.254.169.254:%d/", hp), "not a host name (address literals are refused)"},
		{fmt.Sprintf("http://loopback.test:%d/", hp), "name resolves to an address the proxy does not reach"},
		{fmt.Sprintf("http://metadata.test:%d/", hp), "name resolves to an address the proxy does not reach"},
		{fmt.Sprintf("http://lan.test:%d/", hp), "name resolves to an address the proxy does not reach"},
		{fmt.Sprintf("http://rebind.test:%d/", hp), "name resolves to an address the proxy does not reach"},
		{fmt.Sprintf("http://mapped.test:%d/", hp), "name resolves to an address the proxy does not reach"},
		{fmt.Sprintf("https://loopback.test:%d/", tp), "name resolves to an address the proxy does not reach"},
		{fmt.Sprintf("https://metadata.test:%d/", tp), "name resolves to an address the proxy does not reach"},
		{fmt.Sprintf("https://127.0.0.2:%d/", tp), "not a host name (address literals are refused)"},
		{fmt.Sprintf("https://pypi.test:%d/", tp+1), "port not allowed"},
	} {
		code, body := l.get(t, tc.url)
		if code == 200 {
			t.Errorf("%s: reached: %q", tc.url, body)
			continue
		}
		select {
		case r := <-l.refusals:
			if r.Reason != tc.reason || r.Attempt != "attempt-1" {
				t.Errorf("%s: refused %+v, want reason %q", tc.url, r, tc.reason)
			}
		case <-time.After(2 * time.Second):
			t.Errorf("%s: %d %q, no refusal reported", tc.url, code, body)
		}
	}
	if n, hits := l.session.Refused(), l.hits.Load(); n != 15 || hits != 0 {
		t.Fatalf("refused %d (want 15), upstream hits %d (want 0)", n, hits)
	}
	close(l.dialed)
	for a := range l.dialed {
		t.Errorf("dialed %s for a refused request", a)
	}
	// One lookup per connection: the checked answer is the one dialed.
	if n := l.resolver.lookups["rebind.test"]; n != 1 {
		t.Fatalf("rebind.test looked up %d times", n)
	}
}

// TestProxyRawRequests speaks to the proxy byte by byte, as an agent could:
// origin-form requests, a foreign client, the connection cap.
func TestProxyRawRequests(t *testing.T) {
	l := newLab(t, []string{"pypi.test"}, nil)
	addr := l.session.Addr().String()
	send := func(req string) string {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(c).ReadString('\n')
		return strings.TrimSpace(line)
	}
	if got := send("GET / HTTP/1.1\r\nHost: pypi.test\r\n\r\n"); got != "HTTP/1.1 400 Bad Request" {
		t.Fatalf("origin-form request: %q", got)
	}
	if got := send(fmt.Sprintf("CONNECT pypi.test:%d HTTP/1.1\r\nHost: pypi.test\r\n\r\n", l.tlsPort)); got != "HTTP/1.1 200 Connection established" {
		t.Fatalf("CONNECT: %q", got)
	}
	// The upstream sees the checked name as Host, whatever the client sends.
	c0, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c0, "GET http://pypi.test:%d/h HTTP/1.1\r\nHost: evil.test\r\nConnection: close\r\n\r\n", l.httpPort)
	_ = c0.SetDeadline(time.Now().Add(3 * time.Second))
	body, _ := io.ReadAll(c0)
	c0.Close()
	if !strings.HasSuffix(string(body), fmt.Sprintf("hello pypi.test:%d /h", l.httpPort)) {
		t.Fatalf("Host passed upstream: %q", body)
	}
	if got := send("CONNECT pypi.test HTTP/1.1\r\nHost: pypi.test\r\n\r\n"); got != "HTTP/1.1 400 Bad Request" {
		t.Fatalf("CONNECT without a port: %q", got)
	}
	if n := l.session.Refused(); n != 2 {
		t.Fatalf("refused %d, want 2", n)
	}

	// A session for another client address refuses this one.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	other, err := l.proxy.Start("attempt-2", ln, netip.MustParseAddr("10.213.0.2"), []string{"pypi.test"})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err == nil {
		t.Fatalf("foreign client served: %d %v", n, err)
	}
	c.Close()
	if other.Refused() != 1 {
		t.Fatalf("foreign client not counted: %d", other.Refused())
	}
	// Close ends open tunnels.
	tc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	fmt.Fprintf(tc, "CONNECT pypi.test:%d HTTP/1.1\r\nHost: x\r\n\r\n", l.tlsPort)
	br := bufio.NewReader(tc)
	if line, _ := br.ReadString('\n'); !strings.Contains(line, "200") {
		t.Fatalf("tunnel: %q", line)
	}
	l.session.Close()
	_ = tc.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadAll(br); err != nil {
		t.Fatalf("tunnel not closed by Close: %v", err)
	}
}

func TestParseHosts(t *testing.T) {
	got, err := ParseHosts([]string{"PyPI.org.", "*.pythonhosted.org", "pypi.org", "deb.debian.org"})
	if err != nil || strings.Join(got, " ") != "pypi.org *.pythonhosted.org deb.debian.org" {
		t.Fatalf("ParseHosts = %v, %v", got, err)
	}
	for _, bad := range []string{"", "*.org", "*", "10.0.0.1", "[::1]", "::1", "pypi.org:443", "http://pypi.org", "a..b", "-a.org",
		"a_b.org", "pypi.org/simple", "1.2.3", strings.Repeat("a", 64) + ".org"} {
		if _, err := ParseHosts([]string{bad}); err == nil {
			t.Errorf("ParseHosts(%q) accepted", bad)
		}
	}
	pats, _ := ParseHosts([]string{"*.debian.org", "pypi.org"})
	for name, want := range map[string]bool{"deb.debian.org": true, "security.debian.org": true, "debian.org": false,
		"pypi.org": true, "x.pypi.org": false, "evildebian.org": false, "debian.org.evil.com": false} {
		if MatchHost(pats, name) != want {
			t.Errorf("MatchHost(%s) = %v", name, !want)
		}
	}
}

func TestIsPublic(t *testing.T) {
	for a, want := range map[string]bool{
		"151.101.0.223": true, "2a04:4e42::223": true, "8.8.8.8": true,
		"127.0.0.1": false, "10.1.2.3": false, "172.16.0.1": false, "192.168.1.1": false, "169.254.169.254": false,
		"100.64.0.1": false, "0.0.0.0": false, "224.0.0.1": false, "255.255.255.255": false, "192.0.2.2": false,
		"::1": false, "::": false, "fe80::1": false, "fd00::1": false, "::ffff:10.0.0.1": false, "::ffff:8.8.8.8": true,
		"::10.0.0.1": false, "::8.8.8.8": false, "::ffff:0:10.0.0.1": false, "::ffff:0:8.8.8.8": false, "::127.0.0.1": false,
		"64:ff9b::a00:1": false, "2002:a00:1::": false, "2001:0:a00:1::": false, "ff02::1": false, "2001:db8::1": false,
	} {
		if got := isPublic(netip.MustParseAddr(a)); got != want {
			t.Errorf("isPublic(%s) = %v", a, got)
		}
	}
	// The node's own public address is not the internet.
	s := &Session{p: &Proxy{}}
	own := map[netip.Addr]bool{netip.MustParseAddr("8.8.8.8"): true}
	if s.reachable(netip.MustParseAddr("8.8.8.8"), own) || !s.reachable(netip.MustParseAddr("8.8.4.4"), own) {
		t.Fatal("own address reachable, or another not")
	}
}
