package egress

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestRecordCountsHostsBytesRefusals runs plain requests, a tunnel, a
// refusal and a failed lookup through a session and checks its record,
// kept by the proxy once the session is closed.
func TestRecordCountsHostsBytesRefusals(t *testing.T) {
	l := newLab(t, []string{"pypi.test", "files.pythonhosted.test", "gone.test"}, nil)
	plain := fmt.Sprintf("http://pypi.test:%d", l.httpPort)
	var wantReceived uint64
	for _, path := range []string{"/a", "/bb"} {
		code, body := l.get(t, plain+path)
		if code != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, code, body)
		}
		wantReceived += uint64(len(body))
	}
	resp, err := l.client.Post(plain+"/up", "text/plain", strings.NewReader("0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	wantReceived += uint64(len(b))
	code, body := l.get(t, fmt.Sprintf("https://files.pythonhosted.test:%d/wheel", l.tlsPort))
	if code != http.StatusOK {
		t.Fatalf("https: %d %s", code, body)
	}
	if code, _ := l.get(t, fmt.Sprintf("http://evil.test:%d/answers", l.httpPort)); code != http.StatusForbidden {
		t.Fatalf("evil.test: %d, want 403", code)
	}
	if code, _ := l.get(t, fmt.Sprintf("https://evil.test:%d/answers", l.tlsPort)); code != 0 {
		t.Fatalf("evil.test by CONNECT: %d, want a failed CONNECT", code)
	}
	if code, _ := l.get(t, fmt.Sprintf("http://gone.test:%d/", l.httpPort)); code != http.StatusBadGateway {
		t.Fatalf("gone.test: %d, want 502", code)
	}
	if code, _ := l.get(t, fmt.Sprintf("http://127.0.0.2:%d/", l.httpPort)); code != http.StatusForbidden {
		t.Fatalf("address literal: %d, want 403", code)
	}
	l.client.Transport.(*http.Transport).CloseIdleConnections()
	if _, ok := l.proxy.TakeRecord("attempt-1"); ok {
		t.Fatal("a record of a session still open")
	}
	l.session.Close()
	rec, ok := l.proxy.TakeRecord("attempt-1")
	if !ok {
		t.Fatal("no record kept for the closed session")
	}
	if _, again := l.proxy.TakeRecord("attempt-1"); again {
		t.Fatal("a record taken twice")
	}
	by := map[string]HostRecord{}
	for _, h := range rec.Hosts {
		by[h.Host] = h
	}
	if len(rec.Hosts) != 5 || rec.Omitted != 0 {
		t.Fatalf("record %+v: want 5 hosts, none omitted", rec)
	}
	if got := by["pypi.test"]; got.Connections != 3 || got.BytesSent != 10 || got.BytesReceived != wantReceived || got.Refused != 0 {
		t.Errorf("pypi.test: %+v, want 3 requests, 10 bytes sent, %d received", got, wantReceived)
	}
	// A TLS handshake and the request, never less than the body.
	if got := by["files.pythonhosted.test"]; got.Connections != 1 || got.BytesSent < 200 || got.BytesReceived < 500 {
		t.Errorf("files.pythonhosted.test: %+v, want 1 tunnel with TLS bytes both ways", got)
	}
	if got := by["evil.test"]; got.Refused != 2 || got.Connections != 0 || got.BytesReceived != 0 {
		t.Errorf("evil.test: %+v, want 2 refused, nothing carried", got)
	}
	if got := by["gone.test"]; got.Failed != 1 || got.Connections != 0 || got.BytesReceived != 0 {
		t.Errorf("gone.test: %+v, want 1 failed", got)
	}
	if got := by["127.0.0.2"]; got.Refused != 1 {
		t.Errorf("address literal: %+v, want 1 refused under the address", got)
	}
	if rec.Hosts[0].Host != "pypi.test" {
		t.Errorf("first host %q, want the one with most connections", rec.Hosts[0].Host)
	}
}

func TestRecordBoundedAndMerged(t *testing.T) {
	var r recorder
	for i := range 100 {
		r.count(fmt.Sprintf("h%02d.test", i), connections, uint64(i+1))
	}
	r.count("weird host\x1b", refusals, 1)
	rec := r.record()
	if len(rec.Hosts) != MaxRecordHosts || rec.Omitted != 101-MaxRecordHosts {
		t.Fatalf("%d hosts, %d omitted; want %d and %d", len(rec.Hosts), rec.Omitted, MaxRecordHosts, 101-MaxRecordHosts)
	}
	if rec.Hosts[0].Host != "h99.test" || rec.Hosts[0].Connections != 100 {
		t.Fatalf("first %+v, want h99.test with 100", rec.Hosts[0])
	}
	env := Record{Hosts: []HostRecord{{Host: "h99.test", Connections: 5, BytesReceived: 7}, {Host: "deb.test", Connections: 500}}, Omitted: 2}
	m := rec.Merge(env)
	if len(m.Hosts) != MaxRecordHosts || m.Hosts[0].Host != "deb.test" || m.Hosts[1].Connections != 105 || m.Hosts[1].BytesReceived != 7 {
		t.Fatalf("merged: %+v", m.Hosts[:2])
	}
	// 64 kept of the 64 + deb.test: one more left out, and env's 2.
	if m.Omitted != rec.Omitted+1+2 {
		t.Fatalf("merged omitted %d, want %d", m.Omitted, rec.Omitted+3)
	}
}

func TestRecordName(t *testing.T) {
	for in, want := range map[string]string{
		"PyPI.org.":              "pypi.org",
		"[::ffff:127.0.0.1]":     "127.0.0.1",
		"10.0.0.1":               "10.0.0.1",
		"a b":                    InvalidHost,
		"\x1b[2J":                InvalidHost,
		"":                       InvalidHost,
		strings.Repeat("a", 300): InvalidHost,
	} {
		if got := recordName(in); got != want {
			t.Errorf("recordName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestKeptRecordsBounded(t *testing.T) {
	var k kept
	for i := range maxKeptRecords + 10 {
		k.put(fmt.Sprintf("a%d", i), Record{})
	}
	if _, ok := k.take("a0"); ok {
		t.Fatal("the oldest record kept past the bound")
	}
	if _, ok := k.take(fmt.Sprintf("a%d", maxKeptRecords+9)); !ok {
		t.Fatal("the newest record dropped")
	}
}
