package node

import (
	"slices"
	"sync"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/protocol"
)

// A connection to a coordinator is not enough for its announcements to
// reach it: gossipsub must also hold an outbound stream to it (the one the
// node publishes on) and have heard its subscription. gossipsub opens that
// stream once, when the connection comes up; if opening it fails (the
// coordinator's router not started yet, a stream or negotiation timeout
// under load) it forgets the peer and never tries again while the
// connection lasts, and the node publishes to nobody. So the node watches
// each coordinator's gossip link, and one that stays down for
// Config.GossipGrace while connected gets its connection closed: the
// connect loop dials again and gossipsub starts afresh.

// gossipStreams records which peers the node's gossipsub router holds an
// outbound stream to. It is a pubsub.RawTracer; every other event is
// ignored.
type gossipStreams struct {
	mu   sync.Mutex
	open map[peer.ID]bool
}

var _ pubsub.RawTracer = (*gossipStreams)(nil)

func newGossipStreams() *gossipStreams { return &gossipStreams{open: map[peer.ID]bool{}} }

func (g *gossipStreams) has(p peer.ID) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.open[p]
}

func (g *gossipStreams) OnNewOutboundStream(p peer.ID, _ protocol.ID) {
	g.mu.Lock()
	g.open[p] = true
	g.mu.Unlock()
}

func (g *gossipStreams) OnClosedOutboundStream(p peer.ID) {
	g.mu.Lock()
	delete(g.open, p)
	g.mu.Unlock()
}

func (*gossipStreams) Join(string)                           {}
func (*gossipStreams) Leave(string)                          {}
func (*gossipStreams) Graft(peer.ID, string)                 {}
func (*gossipStreams) Prune(peer.ID, string)                 {}
func (*gossipStreams) ValidateMessage(*pubsub.Message)       {}
func (*gossipStreams) DeliverMessage(*pubsub.Message)        {}
func (*gossipStreams) RejectMessage(*pubsub.Message, string) {}
func (*gossipStreams) DuplicateMessage(*pubsub.Message)      {}
func (*gossipStreams) ThrottlePeer(peer.ID)                  {}
func (*gossipStreams) RecvRPC(*pubsub.RPC)                   {}
func (*gossipStreams) SendRPC(*pubsub.RPC, peer.ID)          {}
func (*gossipStreams) DropRPC(*pubsub.RPC, peer.ID)          {}
func (*gossipStreams) UndeliverableMessage(*pubsub.Message)  {}

// gossipLinks decides, from what the connect loop sees, which connected
// coordinators' gossip links have been down too long. It is plain data:
// the loop passes the time and each coordinator's state.
type gossipLinks struct {
	grace time.Duration
	down  map[peer.ID]time.Time
}

// stale reports whether coordinator c, connected, with its gossip link up
// or not at now, should have its connection closed and dialled again.
func (l *gossipLinks) stale(c peer.ID, up bool, now time.Time) bool {
	if up || l.grace <= 0 {
		delete(l.down, c)
		return false
	}
	since, ok := l.down[c]
	if !ok {
		l.down[c] = now
		return false
	}
	if now.Sub(since) < l.grace {
		return false
	}
	delete(l.down, c)
	return true
}

// forget drops what is known of c (its connection is down anyway).
func (l *gossipLinks) forget(c peer.ID) { delete(l.down, c) }

// gossipUp reports whether the node's announcements reach coordinator c:
// an outbound gossipsub stream to it and its subscription heard.
func (n *Node) gossipUp(c peer.ID) bool {
	return n.streams.has(c) && slices.Contains(n.topic.ListPeers(), c)
}
