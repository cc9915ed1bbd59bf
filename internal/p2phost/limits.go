package p2phost

import (
	"fmt"
	"net/netip"
	"time"

	"github.com/ipfs/boxo/bitswap/network/bsnet"
	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/protocol"
	rcmgr "github.com/libp2p/go-libp2p/p2p/host/resource-manager"
	"github.com/libp2p/go-libp2p/p2p/net/connmgr"
	"github.com/libp2p/go-libp2p/x/rate"
	"golang.org/x/sys/unix"

	"github.com/repronet/repronet/proto"
)

// DefaultMaxConnsPerIP is how many connections a host accepts from one
// IPv4 address (or IPv6 /56) unless told otherwise: enough for a
// consortium whose machines all reach the coordinator through one NAT
// address. libp2p's own default is 8.
const DefaultMaxConnsPerIP = 256

// StreamLimit bounds the streams of one protocol: Total across all peers,
// PerPeer from any one peer. Each bounds inbound and outbound streams
// alike (and twice that both ways together).
type StreamLimit struct {
	Total, PerPeer int
}

// Unbounded as a StreamLimit's Total leaves only the host-wide limits.
const Unbounded = -1

// ProtocolLimits are the stream limits every repronet host puts on the
// protocols it speaks. One peer (or a few) holding many streams of a
// protocol, slow ones included, fills its own PerPeer share and no more:
// Total is far above what a few peers' shares add up to, so everyone
// else's streams still open. bitswap and gossipsub keep one or a few
// long-lived streams per peer; only their number per peer is bounded.
func ProtocolLimits() map[protocol.ID]StreamLimit {
	m := map[protocol.ID]StreamLimit{
		// A node delivers its outbox one report at a time.
		proto.ReportProtocol: {Total: 1024, PerPeer: 8},
		// One short stream per renewal, per running attempt.
		proto.LeaseProtocol: {Total: 4096, PerPeer: 256},
		// One offer per free slot, offered at once.
		proto.AssignProtocol: {Total: 1024, PerPeer: 256},
	}
	for _, id := range []protocol.ID{bsnet.ProtocolBitswap, bsnet.ProtocolBitswapOneOne, bsnet.ProtocolBitswapOneZero, bsnet.ProtocolBitswapNoVers} {
		m[id] = StreamLimit{Total: Unbounded, PerPeer: 32}
	}
	for _, id := range pubsub.GossipSubDefaultProtocols {
		m[id] = StreamLimit{Total: Unbounded, PerPeer: 8}
	}
	return m
}

// Per-peer and host-wide limits, on top of the protocols' own.
const (
	// peerStreams bounds the streams of one peer, all protocols together,
	// each way.
	peerStreams = 512
	// systemConns bounds a host's connections each way (its file
	// descriptor limit, half the process's, bounds them too), unless
	// WithMaxPeers asks for more.
	systemConns = 4096
)

// Peers a host keeps connected (its connection manager's high water mark;
// it trims to 5/6 of it once past it).
const (
	// DefaultMaxPeers is libp2p's own default (trim past 192, to 160):
	// plenty for a node, which connects to its coordinators and to the
	// few peers it fetches from or serves.
	DefaultMaxPeers = 192
	// CoordinatorMaxPeers is what a coordinator keeps: every node keeps a
	// connection to each coordinator it serves (the coordinator reaches
	// it only over that connection), so a coordinator that trimmed at
	// libp2p's 192 would close and see redialled the connections of any
	// nodes past that. 20,000 nodes, with the connections' headroom
	// below, is twice the 10,000 docs/scale.md models.
	CoordinatorMaxPeers = 20_000
)

// settings are what Options can change.
type settings struct {
	maxConnsPerIP int
	maxPeers      int
}

// WithMaxPeers sets how many peers the host keeps connected: its
// connection manager trims only past n connections (to 5/6 of n), and its
// resource manager accepts n connections each way and a quarter more (at
// least its default, 4096). n must be at least 1.
func WithMaxPeers(n int) Setting {
	return func(s *settings) error {
		if n < 1 {
			return fmt.Errorf("max peers must be at least 1, got %d", n)
		}
		s.maxPeers = n
		return nil
	}
}

// newSettings applies opts over the defaults.
func newSettings(opts []Setting) (settings, error) {
	s := settings{maxConnsPerIP: DefaultMaxConnsPerIP, maxPeers: DefaultMaxPeers}
	for _, o := range opts {
		if err := o(&s); err != nil {
			return s, err
		}
	}
	return s, nil
}

// ConnManager builds the connection manager Option gives a host: libp2p's
// basic one (grace period 1 minute, as libp2p's default), trimming past
// WithMaxPeers connections (default DefaultMaxPeers) to 5/6 of them.
func ConnManager(opts ...Setting) (*connmgr.BasicConnMgr, error) {
	s, err := newSettings(opts)
	if err != nil {
		return nil, fmt.Errorf("connection manager: %w", err)
	}
	cm, err := connmgr.NewConnManager(s.maxPeers*5/6, s.maxPeers)
	if err != nil {
		return nil, fmt.Errorf("connection manager for %d peers: %w", s.maxPeers, err)
	}
	return cm, nil
}

// A Setting changes one of the limits Option puts on a host.
type Setting func(*settings) error

// WithMaxConnsPerIP sets how many connections the host accepts from one
// IPv4 address (IPv6: one /56, and 8 times as many from one /48); n must be
// at least 1. New connections from one address are also rate-limited, to a
// burst of 2n and n/40 a second after it (libp2p's default for n = 8).
// Loopback is never limited.
func WithMaxConnsPerIP(n int) Setting {
	return func(s *settings) error {
		if n < 1 {
			return fmt.Errorf("max connections per IP must be at least 1, got %d", n)
		}
		s.maxConnsPerIP = n
		return nil
	}
}

// ResourceManager builds the libp2p resource manager Option gives a host:
// libp2p's default limits (scaled to the machine's memory and file
// descriptors, with libp2p's service limits), the stream limits of
// ProtocolLimits, peerStreams per peer, systemConns per host, the
// transient (negotiation) scope bounded per peer and host-wide
// (transient.go: TransientPerPeer, TransientStreams), and the
// per-address connection limits of WithMaxConnsPerIP; WithMaxPeers raises
// the host-wide connections to fit its peers.
func ResourceManager(opts ...Setting) (network.ResourceManager, error) {
	s, err := newSettings(opts)
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	want := s.maxPeers + s.maxPeers/4
	conns := rcmgr.LimitVal(max(systemConns, want))
	scaling := rcmgr.DefaultLimits
	libp2p.SetDefaultServiceLimits(&scaling)
	limits := rcmgr.PartialLimitConfig{
		System: rcmgr.ResourceLimits{ConnsInbound: conns, ConnsOutbound: conns, Conns: 2 * conns, FD: fdLimit(want)},
		// Streams in negotiation, host-wide (transient.go bounds each
		// peer's share).
		Transient: rcmgr.ResourceLimits{StreamsInbound: TransientStreams, StreamsOutbound: TransientStreams,
			Streams: 2 * TransientStreams},
		PeerDefault: rcmgr.ResourceLimits{StreamsInbound: peerStreams, StreamsOutbound: peerStreams,
			Streams: 2 * peerStreams},
		Protocol:     map[protocol.ID]rcmgr.ResourceLimits{},
		ProtocolPeer: map[protocol.ID]rcmgr.ResourceLimits{},
	}
	for id, l := range ProtocolLimits() {
		limits.Protocol[id] = streams(l.Total)
		limits.ProtocolPeer[id] = streams(l.PerPeer)
	}
	n := s.maxConnsPerIP
	mgr, err := rcmgr.NewResourceManager(rcmgr.NewFixedLimiter(limits.Build(scaling.AutoScale())),
		rcmgr.WithLimitPerSubnet(
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 32, ConnCount: n}},
			[]rcmgr.ConnLimitPerSubnet{{PrefixLength: 56, ConnCount: n}, {PrefixLength: 48, ConnCount: 8 * n}}),
		rcmgr.WithConnRateLimiters(connRateLimiter(n)))
	if err != nil {
		return nil, fmt.Errorf("resource manager: %w", err)
	}
	return newTransientGuard(mgr, time.Now), nil
}

// fdReserve is what a host leaves of the process's file descriptors to
// everything but its connections (badger, block files, HTTP clients).
const fdReserve = 1024

// fdLimit is the file descriptors a host's connections may take when it
// must hold want of them: libp2p's default (half the process's limit) or,
// when that is too few, up to the process's limit less fdReserve. 0
// leaves libp2p's default. A coordinator for thousands of nodes needs a
// process limit to match (LimitNOFILE); docs/scale.md says how many.
func fdLimit(want int) rcmgr.LimitVal {
	var l unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &l); err != nil || l.Cur > 1<<30 {
		return 0
	}
	half, most := int(l.Cur)/2, int(l.Cur)-fdReserve
	if want <= half || most <= half {
		return 0
	}
	return rcmgr.LimitVal(min(want, most))
}

// streams is n streams each way (2n both ways together), or no limit of
// its own for Unbounded.
func streams(n int) rcmgr.ResourceLimits {
	if n == Unbounded {
		return rcmgr.ResourceLimits{Streams: rcmgr.Unlimited, StreamsInbound: rcmgr.Unlimited, StreamsOutbound: rcmgr.Unlimited}
	}
	return rcmgr.ResourceLimits{Streams: rcmgr.LimitVal(2 * n), StreamsInbound: rcmgr.LimitVal(n), StreamsOutbound: rcmgr.LimitVal(n)}
}

// connRateLimiter limits new connections from one IPv4 address or IPv6 /56
// to a burst of 2n, then n/40 a second (libp2p's default is n = 8: 16, then
// 0.2 a second), and from one IPv6 /48 to 8 times that; loopback is not
// limited.
func connRateLimiter(n int) *rate.Limiter {
	l := rate.Limit{RPS: float64(n) / 40, Burst: 2 * n}
	unlimited := rate.Limit{}
	return &rate.Limiter{
		NetworkPrefixLimits: []rate.PrefixLimit{
			{Prefix: netip.MustParsePrefix("127.0.0.0/8"), Limit: unlimited},
			{Prefix: netip.MustParsePrefix("::1/128"), Limit: unlimited},
		},
		SubnetRateLimiter: rate.SubnetLimiter{
			IPv4SubnetLimits: []rate.SubnetLimit{{PrefixLength: 32, Limit: l}},
			IPv6SubnetLimits: []rate.SubnetLimit{{PrefixLength: 56, Limit: l},
				{PrefixLength: 48, Limit: rate.Limit{RPS: 8 * l.RPS, Burst: 8 * l.Burst}}},
			GracePeriod: time.Minute,
		},
	}
}
