package node

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/proto"
)

// TestCoordinatorsSeeEveryNode: real nodes and two real coordinators on
// loopback. Every node is in both coordinators' views within 3 s of
// starting (it announces as soon as each coordinator's subscription
// reaches it), serving both. Past its first 30 s, with a steady interval
// of a minute, a slot taken or freed on a node is in both views within
// MinAnnounceGap and half a second: the change itself is announced, at
// once.
func TestCoordinatorsSeeEveryNode(t *testing.T) {
	if testing.Short() {
		t.Skip("waits out a node's first 30 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const network = "see-every-node"
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var coords []*coordinator.Coordinator
	var addrs []string
	for range 2 {
		c, err := coordinator.New(ctx, coordinator.Config{DataDir: t.TempDir(), Network: network, Logger: quiet,
			ScheduleInterval: time.Hour, NodeTTL: 3 * time.Minute, Families: families.Registry()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		coords = append(coords, c)
		addrs = append(addrs, c.Addrs()[0].String()+"/p2p/"+c.ID().String())
	}
	view := func(c *coordinator.Coordinator, id peer.ID) (coordinator.NodeInfo, bool) {
		for _, n := range c.Nodes() {
			if n.ID == id.String() {
				return n, true
			}
		}
		return coordinator.NodeInfo{}, false
	}
	within := func(what string, bound time.Duration, cond func() bool) time.Duration {
		t.Helper()
		start := time.Now()
		for !cond() {
			if time.Since(start) > bound {
				t.Fatalf("not within %s: %s", bound, what)
			}
			time.Sleep(10 * time.Millisecond)
		}
		return time.Since(start)
	}
	var nodes []*Node
	var started time.Time
	for range 3 {
		started = time.Now()
		n, err := New(ctx, Config{DataDir: t.TempDir(), Network: network, Coordinators: addrs, Slots: 2,
			Sandbox: idleSandbox{}, AnnounceInterval: time.Minute, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { n.Close() })
		within("the node in both coordinators' views, serving both", 3*time.Second, func() bool {
			for _, c := range coords {
				if v, ok := view(c, n.ID()); !ok || !v.ServesUs || v.FreeSlots != 2 {
					return false
				}
			}
			return true
		})
		t.Logf("node %d in both views %s after it started", len(nodes)+1, time.Since(started).Round(time.Millisecond))
		nodes = append(nodes, n)
	}

	// Past the first 30 s a node announces every minute, unless a slot
	// changes.
	time.Sleep(time.Until(started.Add(31 * time.Second)))
	n := nodes[1]
	a := coords[0].ID()
	bound := proto.MinAnnounceGap + 500*time.Millisecond
	for i, free := range []int{1, 2, 1} {
		n.mu.Lock()
		key := runKey{a, "slot-test"}
		if free == 1 {
			n.running[key] = func() {} // as admit takes a slot
		} else {
			delete(n.running, key) // as a finished attempt frees it
		}
		n.mu.Unlock()
		n.signal(n.announceNow)
		took := within("the slot change in both views", bound, func() bool {
			for _, c := range coords {
				if v, _ := view(c, n.ID()); v.FreeSlots != free {
					return false
				}
			}
			return true
		})
		t.Logf("change %d (%d free) in both views after %s", i+1, free, took.Round(time.Millisecond))
		time.Sleep(proto.MinAnnounceGap)
	}
}

// TestGossipLinkRedialled: a coordinator refuses the node's streams for a
// moment after the node connects, so the stream gossipsub opens to it on
// connecting fails, and gossipsub never tries again while the connection
// lasts (as when opening it times out under load: the node then
// publishes to nobody). The node notices that it holds no gossip stream
// to the coordinator and, after GossipGrace, closes the connection and
// dials again: the coordinator then takes its announcements. With the
// watch off, none arrive.
func TestGossipLinkRedialled(t *testing.T) {
	for _, c := range []struct {
		name  string
		grace time.Duration
		heard bool
	}{{"watched", time.Second, true}, {"unwatched", -1, false}} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			const net = "gossip-redial"
			rm := &refusingRM{ResourceManager: &network.NullResourceManager{}}
			rm.refuse.Store(true)
			h, err := libp2p.New(libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"), libp2p.ResourceManager(rm))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			ps, err := pubsub.NewGossipSub(ctx, h, proto.CoordinatorGossipOptions(net, nil)...)
			if err != nil {
				t.Fatal(err)
			}
			_, sub, err := proto.JoinCapacity(ps, net, proto.NewAnnouncementGuard(net), nil)
			if err != nil {
				t.Fatal(err)
			}
			quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
			n, err := New(ctx, Config{DataDir: t.TempDir(), Network: net, Slots: 1, Sandbox: idleSandbox{},
				Coordinators: []string{h.Addrs()[0].String() + "/p2p/" + h.ID().String()}, AnnounceInterval: time.Second,
				GossipGrace: c.grace, Logger: quiet})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { n.Close() })
			for n.host.Network().Connectedness(h.ID()) != network.Connected {
				if ctx.Err() != nil {
					t.Fatal("the node never connected")
				}
				time.Sleep(20 * time.Millisecond)
			}
			time.Sleep(500 * time.Millisecond) // gossipsub tries its stream, and fails
			if n.streams.has(h.ID()) {
				t.Fatal("the node holds a gossip stream to the coordinator: the case does not show the failure")
			}
			rm.refuse.Store(false)

			got := make(chan struct{}, 1)
			go func() {
				for {
					m, err := sub.Next(ctx)
					if err != nil {
						return
					}
					if m.GetFrom() == n.ID() {
						select {
						case got <- struct{}{}:
						default:
						}
					}
				}
			}()
			wait := 8 * time.Second
			select {
			case <-got:
				if !c.heard {
					t.Fatal("the coordinator took an announcement with the watch off: the case does not show the failure")
				}
				t.Logf("announcements arrive after %d redial(s)", n.gossipRedials.Load())
				if n.gossipRedials.Load() == 0 {
					t.Fatal("announcements arrived, but not through a redial")
				}
			case <-time.After(wait):
				if c.heard {
					t.Fatalf("no announcement reached the coordinator within %s (redials %d)", wait, n.gossipRedials.Load())
				}
			}
		})
	}
}

// refusingRM refuses every inbound stream while refuse is set.
type refusingRM struct {
	network.ResourceManager
	refuse atomic.Bool
}

func (r *refusingRM) OpenStream(p peer.ID, dir network.Direction) (network.StreamManagementScope, error) {
	if dir == network.DirInbound && r.refuse.Load() {
		return nil, errors.New("test: inbound streams refused")
	}
	return r.ResourceManager.OpenStream(p, dir)
}

// TestGossipLinksStale: a link down for the grace is stale once, then
// timed afresh; a link that comes up, or a coordinator that disconnects,
// starts over; a grace below 0 never redials.
func TestGossipLinksStale(t *testing.T) {
	c := peer.ID("coordinator")
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at    time.Duration
		up    bool
		stale bool
	}{
		{0, false, false},                      // down: timing starts
		{999 * time.Millisecond, false, false}, // within the grace
		{time.Second, false, true},             // the grace is out: redial
		{time.Second, false, false},            // timing starts again
		{1500 * time.Millisecond, true, false}, // up: forgotten
		{2600 * time.Millisecond, false, false},
		{3700 * time.Millisecond, false, true},
	}
	l := gossipLinks{grace: time.Second, down: map[peer.ID]time.Time{}}
	for i, s := range steps {
		if got := l.stale(c, s.up, t0.Add(s.at)); got != s.stale {
			t.Fatalf("step %d (%s, up %v): stale %v, want %v", i, s.at, s.up, got, s.stale)
		}
	}
	l.stale(c, false, t0)
	l.forget(c)
	if l.stale(c, false, t0.Add(time.Hour)) {
		t.Fatal("stale right after the coordinator was forgotten")
	}
	never := gossipLinks{grace: -1, down: map[peer.ID]time.Time{}}
	for _, at := range []time.Duration{0, time.Hour, 48 * time.Hour} {
		if never.stale(c, false, t0.Add(at)) {
			t.Fatal("a negative grace redialled")
		}
	}
}
