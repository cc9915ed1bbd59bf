// Package p2phost holds the libp2p transport stack every repronet host uses
// (coordinator, node, capsule CLI): its security transports and its stream
// muxer, tuned for moving 1 MiB blocks; its resource manager's limits, per
// protocol, per peer and per address; its connection manager's size; and
// Paced, the minimum rate every stream handler reads its messages at. It
// owns nothing about a host's identity, listen addresses or stream
// handlers; node, coordinator and the capsule CLI add those themselves. It
// knows the protocols' IDs (repronet's in package proto, bitswap's,
// gossipsub's) only to limit their streams.
//
// Both choices stay wire-compatible with stock libp2p (and so with Kubo):
// the security protocols are libp2p's TLS 1.3 (preferred) and Noise, and the
// muxer is yamux. What changes is only how this side writes:
//
//   - TLS splits each write into 16 KiB records and hands each record to the
//     socket on its own, so one 64 KiB muxer frame cost four write syscalls
//     (and, on loopback, four trips through the peer's TCP receive path).
//     [Option]'s TLS writes the records of one frame with one syscall.
//   - yamux frames are at most 256 KiB instead of 64 KiB, within a stream's
//     flow-control window, so a block crosses in fewer, larger writes.
//
// The limits ([ResourceManager], [ProtocolLimits], [WithMaxConnsPerIP]) and
// the pace ([Paced]) bound what one peer, or a few, can hold: a peer opening
// many slow streams fills its own share of a protocol and loses each stream
// within seconds, and a peer holding streams that never negotiate a
// protocol fills its own share of the transient scope (transient.go), not
// everyone's; docs/security.md gives the figures. [ConnManager] and
// [WithMaxPeers] set how many peers a host keeps connected: libp2p's 192
// for a node, [CoordinatorMaxPeers] for a coordinator, which every node of
// its pool stays connected to.
package p2phost

import (
	"context"
	"net"
	"sync"

	pool "github.com/libp2p/go-buffer-pool"
	"github.com/libp2p/go-libp2p"
	ci "github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/core/sec"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	tptu "github.com/libp2p/go-libp2p/p2p/net/upgrader"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
)

// maxFrame is the largest yamux frame this side sends.
const maxFrame = 256 << 10

// Option sets repronet's transport stack on a libp2p host. Give it after
// the host's own options: it adds TLS and Noise only if those asked for no
// other security (neither libp2p.NoSecurity nor transports of their own),
// yamux only if they set no muxer, the resource manager of
// ResourceManager(settings...) only if they set none, and the connection
// manager of ConnManager(settings...) likewise; libp2p's defaults fill in
// the rest.
func Option(settings ...Setting) libp2p.Option {
	return func(cfg *libp2p.Config) error {
		if cfg.ConnManager == nil {
			cm, err := ConnManager(settings...)
			if err != nil {
				return err
			}
			if err := cfg.Apply(libp2p.ConnectionManager(cm)); err != nil {
				cm.Close()
				return err
			}
		}
		if cfg.ResourceManager == nil {
			mgr, err := ResourceManager(settings...)
			if err != nil {
				return err
			}
			if err := cfg.Apply(libp2p.ResourceManager(mgr)); err != nil {
				mgr.Close()
				return err
			}
		}
		if !cfg.Insecure && len(cfg.SecurityTransports) == 0 {
			err := cfg.Apply(libp2p.Security(libp2ptls.ID, NewTLS), libp2p.Security(noise.ID, noise.New))
			if err != nil {
				return err
			}
		}
		if len(cfg.Muxers) == 0 {
			mux := *yamux.DefaultTransport
			mux.MaxMessageSize = maxFrame
			return cfg.Apply(libp2p.Muxer(yamux.ID, &mux))
		}
		return nil
	}
}

// TLS is libp2p's TLS 1.3 security transport, writing the records of each
// write with one syscall.
type TLS struct {
	inner *libp2ptls.Transport
}

var _ sec.SecureTransport = (*TLS)(nil)

// NewTLS has the signature libp2p.Security expects of a constructor.
func NewTLS(id protocol.ID, key ci.PrivKey, muxers []tptu.StreamMuxer) (*TLS, error) {
	inner, err := libp2ptls.New(id, key, muxers)
	if err != nil {
		return nil, err
	}
	return &TLS{inner: inner}, nil
}

// SecureInbound runs the TLS handshake as a server.
func (t *TLS) SecureInbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	return corked(ctx, insecure, p, t.inner.SecureInbound)
}

// SecureOutbound runs the TLS handshake as a client.
func (t *TLS) SecureOutbound(ctx context.Context, insecure net.Conn, p peer.ID) (sec.SecureConn, error) {
	return corked(ctx, insecure, p, t.inner.SecureOutbound)
}

// corked runs handshake over insecure wrapped in a corkedConn.
func corked(ctx context.Context, insecure net.Conn, p peer.ID,
	handshake func(context.Context, net.Conn, peer.ID) (sec.SecureConn, error)) (sec.SecureConn, error) {
	raw := &corkedConn{Conn: insecure}
	sc, err := handshake(ctx, raw, p)
	if err != nil {
		return nil, err
	}
	return &secureConn{SecureConn: sc, raw: raw}, nil
}

// ID is the protocol ID of libp2p's TLS.
func (t *TLS) ID() protocol.ID { return t.inner.ID() }

// secureConn corks the raw connection for the length of each write, so the
// TLS records of one write leave in one syscall.
type secureConn struct {
	sec.SecureConn
	raw *corkedConn
	mu  sync.Mutex // one write at a time, so corking covers one write's records
}

func (c *secureConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.raw.cork()
	n, err := c.SecureConn.Write(p)
	if ferr := c.raw.uncork(); err == nil && ferr != nil {
		// The records were accepted into the cork but did not reach the
		// socket: nothing of p can be counted as written.
		return 0, ferr
	}
	return n, err
}

// corkedConn is the connection under TLS. While corked it collects what TLS
// writes (in order: TLS writes records under its own lock) and uncork sends
// it in one write. Uncorked, writes go straight through; that is how the
// handshake and alerts, which TLS buffers or sends alone, leave. The buffer
// is borrowed from a pool for the length of one cork, so an idle connection
// holds none. Close is the embedded one and does not flush: a Close racing a
// write in progress may drop that write's tail, which the peer sees as the
// connection ending, as it would anyway.
type corkedConn struct {
	net.Conn
	mu     sync.Mutex
	corked bool
	buf    []byte
	err    error // sticky: once a write failed, every later one does
}

// corkSize is the most one cork holds before it is written out anyway: a
// largest frame in 16 KiB records, each with its few bytes of overhead.
const corkSize = maxFrame + 16<<10

func (c *corkedConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	if !c.corked {
		return c.write(p)
	}
	if c.buf == nil {
		c.buf = pool.Get(corkSize)[:0]
	}
	if len(c.buf)+len(p) > cap(c.buf) {
		if err := c.flush(); err != nil {
			return 0, err
		}
		if len(p) > cap(c.buf) {
			return c.write(p)
		}
	}
	c.buf = append(c.buf, p...)
	return len(p), nil
}

func (c *corkedConn) write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if err != nil {
		c.err = err
	}
	return n, err
}

// flush writes what the cork holds; c.mu is held.
func (c *corkedConn) flush() error {
	if len(c.buf) == 0 {
		return c.err
	}
	_, err := c.write(c.buf)
	c.buf = c.buf[:0]
	return err
}

func (c *corkedConn) cork() {
	c.mu.Lock()
	c.corked = true
	c.mu.Unlock()
}

func (c *corkedConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.corked = false
	err := c.flush()
	if c.buf != nil {
		pool.Put(c.buf)
		c.buf = nil
	}
	return err
}
