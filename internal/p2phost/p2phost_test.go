package p2phost

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	ci "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// countingConn counts the writes that reach the socket.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func newKey(t testing.TB) (ci.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := ci.GenerateEd25519Key(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, id
}

// securePair returns the two ends of a TLS session over loopback TCP: the
// client end from client (ours or stock libp2p TLS), the server end from
// stock libp2p TLS, and the client's socket, counting writes.
func securePair(t testing.TB, corked bool) (cl, srv sec.SecureConn, raw *countingConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ckey, _ := newKey(t)
	skey, sid := newKey(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	type result struct {
		c   sec.SecureConn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		st, err := libp2ptls.New(libp2ptls.ID, skey, nil)
		if err != nil {
			done <- result{err: err}
			return
		}
		sc, err := st.SecureInbound(ctx, c, "")
		done <- result{sc, err}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	raw = &countingConn{Conn: c}
	var ct sec.SecureTransport
	if corked {
		ct, err = NewTLS(libp2ptls.ID, ckey, nil)
	} else {
		ct, err = libp2ptls.New(libp2ptls.ID, ckey, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	cl, err = ct.SecureOutbound(ctx, raw, sid)
	if err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatal(r.err)
	}
	t.Cleanup(func() { cl.Close(); r.c.Close() })
	return cl, r.c, raw
}

// TestOneSyscallPerWrite: a 256 KiB write (16 TLS records) reaches the
// socket in one write with our TLS and in one per record with stock TLS,
// and the stock server reads the same bytes either way.
func TestOneSyscallPerWrite(t *testing.T) {
	for _, tc := range []struct {
		name      string
		corked    bool
		minWrites int64
		maxWrites int64
	}{
		{"repronet", true, 1, 1},
		{"stock", false, 16, 1 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, srv, raw := securePair(t, tc.corked)
			msg := make([]byte, 256<<10)
			rand.Read(msg)
			// Warm up past TLS's small records at the start of a connection.
			warm := make([]byte, 1<<20)
			got := make(chan []byte, 2)
			go func() {
				b := make([]byte, len(warm))
				io.ReadFull(srv, b)
				b = make([]byte, len(msg))
				io.ReadFull(srv, b)
				got <- b
			}()
			if _, err := cl.Write(warm); err != nil {
				t.Fatal(err)
			}
			before := raw.writes.Load()
			if n, err := cl.Write(msg); err != nil || n != len(msg) {
				t.Fatalf("write: %d, %v", n, err)
			}
			writes := raw.writes.Load() - before
			if writes < tc.minWrites || writes > tc.maxWrites {
				t.Errorf("a 256 KiB write took %d socket writes, want %d..%d", writes, tc.minWrites, tc.maxWrites)
			}
			select {
			case b := <-got:
				if !bytes.Equal(b, msg) {
					t.Fatal("the server read other bytes than were written")
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the server did not read the message")
			}
		})
	}
}

// TestWriteAfterCloseFails: once the socket is gone, a write fails, and
// keeps failing, rather than vanishing into the cork.
func TestWriteAfterCloseFails(t *testing.T) {
	cl, _, raw := securePair(t, true)
	raw.Conn.Close()
	for i := range 2 {
		if n, err := cl.Write(make([]byte, 64<<10)); err == nil || n != 0 {
			t.Fatalf("write %d on a closed socket: %d, %v", i, n, err)
		}
	}
}

func newHost(t testing.TB, ours bool) host.Host {
	t.Helper()
	opts := []libp2p.Option{libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0")}
	if ours {
		opts = append(opts, Option())
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// TestHostsInterop: a host with these options and a stock libp2p host (as
// Kubo runs) connect over TLS, both ways round, and an 8 MiB stream crosses
// intact in both directions.
func TestHostsInterop(t *testing.T) {
	const proto protocol.ID = "/repronet/test/echo"
	for _, tc := range []struct {
		name             string
		dialer, listener bool // ours?
	}{
		{"ours to ours", true, true},
		{"ours to stock", true, false},
		{"stock to ours", false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			a, b := newHost(t, tc.dialer), newHost(t, tc.listener)
			b.SetStreamHandler(proto, func(s network.Stream) {
				defer s.Close()
				io.Copy(s, s)
			})
			if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
				t.Fatal(err)
			}
			// 8 streams at once, each echoing 2 MiB written in pieces of
			// random size, so frames of different streams interleave on
			// the connection.
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := range 8 {
				wg.Go(func() { errs <- echo(ctx, a, b.ID(), proto, int64(i)) })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// echo sends 2 MiB on a new stream in pieces of random size, reads the
// echo back, and checks it.
func echo(ctx context.Context, h host.Host, to peer.ID, proto protocol.ID, seed int64) error {
	s, err := h.NewStream(ctx, to, proto)
	if err != nil {
		return err
	}
	defer s.Close()
	if sec := s.Conn().ConnState().Security; sec != libp2ptls.ID {
		return fmt.Errorf("security %q, want %q", sec, libp2ptls.ID)
	}
	data := make([]byte, 2<<20)
	rand.Read(data)
	rng := mrand.New(mrand.NewPCG(uint64(seed), 1))
	go func() {
		for rest := data; len(rest) > 0; {
			n := min(len(rest), 1+rng.IntN(300<<10))
			if _, err := s.Write(rest[:n]); err != nil {
				return
			}
			rest = rest[n:]
		}
		s.CloseWrite()
	}()
	back, err := io.ReadAll(s)
	if err != nil {
		return err
	}
	if sha256.Sum256(back) != sha256.Sum256(data) {
		return fmt.Errorf("stream %d: echoed %d bytes, not the %d sent", seed, len(back), len(data))
	}
	return nil
}

// TestOptionYieldsToHostChoices: Option adds its stack only where the
// host's own options chose nothing: a host asking for no security gets
// none, and one naming Noise speaks Noise.
func TestOptionYieldsToHostChoices(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name     string
		opt      libp2p.Option
		peerOpt  libp2p.Option
		security string
	}{
		{"no security", libp2p.NoSecurity, libp2p.NoSecurity, "/plaintext/2.0.0"},
		{"noise only", libp2p.Security(noise.ID, noise.New), nil, noise.ID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mk := func(o libp2p.Option) host.Host {
				opts := []libp2p.Option{libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0")}
				if o != nil {
					opts = append(opts, o)
				}
				h, err := libp2p.New(append(opts, Option())...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { h.Close() })
				return h
			}
			a, b := mk(tc.opt), mk(tc.peerOpt)
			if err := a.Connect(ctx, peer.AddrInfo{ID: b.ID(), Addrs: b.Addrs()}); err != nil {
				t.Fatal(err)
			}
			conns := a.Network().ConnsToPeer(b.ID())
			if len(conns) == 0 {
				t.Fatal("no connection")
			}
			if got := string(conns[0].ConnState().Security); got != tc.security {
				t.Errorf("security %q, want %q", got, tc.security)
			}
		})
	}
}
