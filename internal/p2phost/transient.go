package p2phost

import (
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/connmgr"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// A stream a peer opens sits in libp2p's transient scope until it
// negotiates a protocol (multistream-select), and libp2p bounds that scope
// only host-wide (by default a few hundred streams, shared by everyone).
// So a few peers holding streams that never negotiate (found live: four
// peers with 500 each) fill it, and every other peer's streams, of every
// protocol, are refused until libp2p's negotiation timeout (10 s) frees
// them. The transient scope is therefore bounded per peer too:
//
//   - each peer may hold TransientPerPeer inbound streams not yet
//     negotiated (an honest peer's streams negotiate within a round trip;
//     this is the largest burst of any protocol's PerPeer share);
//   - a peer that left SuspectAfter streams un-negotiated within
//     SuspectFor (their negotiation timed out, or they were reset first)
//     may hold only TransientSuspect of them until it stops;
//   - once TransientPressure inbound streams are in negotiation host-wide,
//     every peer may hold only TransientSuspect more (so filling the host
//     takes hundreds of peers, each a connection, not a few);
//   - host-wide, TransientStreams inbound streams (and as many outbound)
//     may be in negotiation.
const (
	TransientPerPeer  = 256
	TransientSuspect  = 8
	SuspectAfter      = 8
	SuspectFor        = time.Minute
	TransientStreams  = 4096
	TransientPressure = TransientStreams / 2
)

// transientGuard is a resource manager that bounds each peer's inbound
// streams in negotiation, as the comment above says; everything else is
// the wrapped manager's.
type transientGuard struct {
	network.ResourceManager
	perPeer, suspect, suspectAfter, pressure int
	suspectFor                               time.Duration
	now                                      func() time.Time

	mu    sync.Mutex
	peers map[peer.ID]*halfOpen
	// open counts the inbound streams in negotiation, all peers together.
	open int
}

// halfOpen is what the guard knows of one peer.
type halfOpen struct {
	open      int       // inbound streams not yet negotiated
	abandoned int       // streams that ended un-negotiated since lastAbandon-suspectFor
	last      time.Time // the last one that did
}

func newTransientGuard(inner network.ResourceManager, now func() time.Time) *transientGuard {
	return &transientGuard{ResourceManager: inner, perPeer: TransientPerPeer, suspect: TransientSuspect,
		suspectAfter: SuspectAfter, pressure: TransientPressure, suspectFor: SuspectFor, now: now, peers: map[peer.ID]*halfOpen{}}
}

// ErrTransientPeer is the error a stream over its peer's share of the
// transient scope is refused with.
var ErrTransientPeer = fmt.Errorf("peer holds its share of streams not yet negotiated: %w", network.ErrResourceLimitExceeded)

// OpenStream opens a stream's scope; an inbound one counts against its
// peer's share of streams in negotiation until it negotiates or ends.
func (g *transientGuard) OpenStream(p peer.ID, dir network.Direction) (network.StreamManagementScope, error) {
	if dir != network.DirInbound {
		return g.ResourceManager.OpenStream(p, dir)
	}
	g.mu.Lock()
	h := g.peers[p]
	if h == nil {
		h = &halfOpen{}
		g.peers[p] = h
	}
	now := g.now()
	if len(g.peers) > 4*TransientStreams {
		g.prune(now)
	}
	if h.abandoned > 0 && now.Sub(h.last) > g.suspectFor {
		h.abandoned = 0
	}
	limit := g.perPeer
	if h.abandoned >= g.suspectAfter || g.open >= g.pressure {
		limit = g.suspect
	}
	if h.open >= limit {
		g.mu.Unlock()
		return nil, fmt.Errorf("stream from %s (%d in negotiation, max %d): %w", p, h.open, limit, ErrTransientPeer)
	}
	h.open++
	g.open++
	g.mu.Unlock()
	scope, err := g.ResourceManager.OpenStream(p, dir)
	if err != nil {
		g.release(p, false)
		return nil, err
	}
	return &guardedStream{StreamManagementScope: scope, g: g, p: p}, nil
}

// prune forgets the peers with nothing in negotiation and no recent
// abandoned stream (g.mu held).
func (g *transientGuard) prune(now time.Time) {
	for id, h := range g.peers {
		if h.open <= 0 && (h.abandoned == 0 || now.Sub(h.last) > g.suspectFor) {
			delete(g.peers, id)
		}
	}
}

// release ends one of p's streams in negotiation: negotiated, or not
// (abandoned).
func (g *transientGuard) release(p peer.ID, abandoned bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	h := g.peers[p]
	if h == nil {
		return
	}
	h.open--
	g.open--
	if abandoned {
		h.abandoned++
		h.last = g.now()
	}
	if h.open <= 0 && (h.abandoned == 0 || g.now().Sub(h.last) > g.suspectFor) {
		delete(g.peers, p)
	}
}

// GetConnLimit passes on the wrapped manager's connection limit (libp2p
// checks its connection manager against it).
func (g *transientGuard) GetConnLimit() int {
	if l, ok := g.ResourceManager.(connmgr.GetConnLimiter); ok {
		return l.GetConnLimit()
	}
	return 0
}

// guardedStream is an inbound stream's scope, counted in its peer's share
// until SetProtocol succeeds or Done.
type guardedStream struct {
	network.StreamManagementScope
	g    *transientGuard
	p    peer.ID
	once sync.Once
}

func (s *guardedStream) SetProtocol(id protocol.ID) error {
	err := s.StreamManagementScope.SetProtocol(id)
	if err == nil {
		s.once.Do(func() { s.g.release(s.p, false) })
	}
	return err
}

func (s *guardedStream) Done() {
	s.once.Do(func() { s.g.release(s.p, true) })
	s.StreamManagementScope.Done()
}
