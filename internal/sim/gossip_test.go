package sim

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	pb "github.com/libp2p/go-libp2p-pubsub/pb"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/proto"
)

// The guarantees of the capacity topic, on real libp2p hosts on loopback
// (TCP, TLS, yamux), in the design since issue 17 and, as a control that
// shows each check can fail, in the design before it.

const testNet = "gossip-test"

// lpeer is a real host running gossipsub on the capacity topic.
type lpeer struct {
	h     host.Host
	key   crypto.PrivKey
	ps    *pubsub.PubSub
	topic *pubsub.Topic
	count *Counter
	seq   uint64

	mu     sync.Mutex
	got    map[peer.ID]int // announcements taken, by author (subscribers)
	scores map[peer.ID]float64
}

// newRawPeer is a host without a gossipsub router: what it sends on
// gossipsub streams it writes by hand (OpenRaw), and no router of its own
// opens a stream that would replace them.
func newRawPeer(t *testing.T) *lpeer {
	t.Helper()
	key, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(key), libp2p.ListenAddrStrings("/ip4/127.0.0.1/tcp/0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return &lpeer{h: h, key: key, count: &Counter{}, seq: uint64(time.Now().UnixNano()), got: map[peer.ID]int{},
		scores: map[peer.ID]float64{}}
}

// newLPeer is a peer with a gossipsub router of its own.
func newLPeer(ctx context.Context, t *testing.T, opts ...pubsub.Option) *lpeer {
	t.Helper()
	p := newRawPeer(t)
	p.count.On.Store(true)
	var err error
	opts = append(opts, pubsub.WithRawTracer(p.count), pubsub.WithPeerScoreInspect(func(m map[peer.ID]float64) {
		p.mu.Lock()
		p.scores = m
		p.mu.Unlock()
	}, 100*time.Millisecond))
	if p.ps, err = pubsub.NewGossipSub(ctx, p.h, opts...); err != nil {
		t.Fatal(err)
	}
	return p
}

// subscribe joins as a coordinator does (or did) and records what it takes.
func (p *lpeer) subscribe(ctx context.Context, t *testing.T) {
	t.Helper()
	topic, sub, err := proto.JoinCapacity(p.ps, testNet, proto.NewAnnouncementGuard(testNet), nil)
	if err != nil {
		t.Fatal(err)
	}
	p.topic = topic
	go func() {
		for {
			m, err := sub.Next(ctx)
			if err != nil {
				return
			}
			p.mu.Lock()
			p.got[m.GetFrom()]++
			p.mu.Unlock()
		}
	}()
}

func (p *lpeer) taken(from peer.ID) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.got[from]
}

func (p *lpeer) score(of peer.ID) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.scores[of]
}

func (p *lpeer) connect(ctx context.Context, t *testing.T, to ...*lpeer) {
	t.Helper()
	for _, o := range to {
		if err := p.h.Connect(ctx, peer.AddrInfo{ID: o.h.ID(), Addrs: o.h.Addrs()}); err != nil {
			t.Fatal(err)
		}
	}
}

// announcement is a valid announcement by p, serving coords.
func (p *lpeer) announcement(t *testing.T, coords ...*lpeer) []byte {
	t.Helper()
	p.seq++
	a := &proto.Announcement{Network: testNet, PeerId: []byte(p.h.ID()), Seq: p.seq, UnixMillis: time.Now().UnixMilli(),
		TotalSlots: 4, FreeSlots: 4, Slot: &proto.SlotShape{CpuMillis: 1000, MemoryBytes: 4 << 30}, Incarnation: 1}
	for _, c := range coords {
		a.Coordinators = append(a.Coordinators, &proto.CoordinatorLoad{PeerId: []byte(c.h.ID())})
	}
	b, err := gproto.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func (p *lpeer) publish(ctx context.Context, t *testing.T, data []byte) {
	t.Helper()
	if err := p.topic.Publish(ctx, data); err != nil {
		t.Fatal(err)
	}
}

// roles builds a coordinator and a node of design d.
type roles struct {
	d Design
}

func (r roles) coordinator(ctx context.Context, t *testing.T) *lpeer {
	opts := proto.GossipOptions(testNet, nil)
	if r.d == PublishOnly {
		opts = proto.CoordinatorGossipOptions(testNet, nil)
	}
	c := newLPeer(ctx, t, opts...)
	c.subscribe(ctx, t)
	return c
}

func (r roles) node(ctx context.Context, t *testing.T, coords ...*lpeer) *lpeer {
	if r.d == Subscribed {
		n := newLPeer(ctx, t, proto.GossipOptions(testNet, nil)...)
		n.subscribe(ctx, t)
		return n
	}
	var ids []peer.ID
	for _, c := range coords {
		ids = append(ids, c.h.ID())
	}
	n := newLPeer(ctx, t, proto.NodeGossipOptions(testNet, ids)...)
	var err error
	if n.topic, err = proto.JoinCapacityToPublish(n.ps, testNet, proto.NewAnnouncementGuard(testNet)); err != nil {
		t.Fatal(err)
	}
	return n
}

func eventually(ctx context.Context, t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestAnnouncementsReachOnlyCoordinators: a node's announcements reach
// both coordinators it serves, within a second, and nobody else: not a
// subscriber connected to it and to a coordinator (an older node, an
// eavesdropper), not another node connected to it. Before, the
// subscriber got them all (the control).
func TestAnnouncementsReachOnlyCoordinators(t *testing.T) {
	for _, d := range []Design{PublishOnly, Subscribed} {
		t.Run(d.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r := roles{d}
			c1, c2 := r.coordinator(ctx, t), r.coordinator(ctx, t)
			n := r.node(ctx, t, c1, c2)
			other := r.node(ctx, t, c1, c2)
			spy := newLPeer(ctx, t, proto.GossipOptions(testNet, nil)...)
			spy.subscribe(ctx, t)
			n.connect(ctx, t, c1, c2, other)
			other.connect(ctx, t, c1, c2)
			spy.connect(ctx, t, n, c1)
			eventually(ctx, t, 5*time.Second, "the node sees both coordinators subscribed", func() bool {
				return len(n.topic.ListPeers()) >= 2
			})
			time.Sleep(2 * time.Second) // meshes form (before)
			const sent = 3
			for i := range sent {
				if i > 0 {
					time.Sleep(proto.MinAnnounceGap)
				}
				start := time.Now()
				n.publish(ctx, t, n.announcement(t, c1, c2))
				eventually(ctx, t, time.Second, "both coordinators take the announcement", func() bool {
					return c1.taken(n.h.ID()) == i+1 && c2.taken(n.h.ID()) == i+1
				})
				t.Logf("announcement %d at both coordinators after %s", i+1, time.Since(start).Round(time.Millisecond))
			}
			time.Sleep(2 * time.Second) // gossip's heartbeats
			spied, relayed := spy.taken(n.h.ID()), other.count.MsgsIn.Load()
			t.Logf("%s: the subscriber took %d of %d; the other node received %d messages", d, spied, sent, relayed)
			if d == PublishOnly && (spied != 0 || relayed != 0 || n.count.MsgsIn.Load() != 0) {
				t.Fatalf("publish-only: a subscriber took %d announcements, another node received %d messages, the node %d",
					spied, relayed, n.count.MsgsIn.Load())
			}
			if d == Subscribed && spied != sent {
				t.Fatalf("control: the subscriber took %d of %d announcements before issue 17", spied, sent)
			}
		})
	}
}

// TestNodeRelaysNothing: an attacker connected to a node pushes at it, on
// its own gossipsub stream, a valid announcement of its own, junk and an
// announcement naming another peer. The node validates none of them (no
// CPU spent) and its coordinator never sees any, while the node's own
// announcements arrive. Before, the node validated them all and relayed
// the valid one (the control); junk never crossed a node in either design.
func TestNodeRelaysNothing(t *testing.T) {
	for _, d := range []Design{PublishOnly, Subscribed} {
		t.Run(d.String(), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			r := roles{d}
			c := r.coordinator(ctx, t)
			n := r.node(ctx, t, c)
			n.connect(ctx, t, c)
			// Without a router of its own: its router's stream to the
			// node, opened late under load, would replace the raw one.
			attacker := newRawPeer(t)
			DiscardRaw(attacker.h)
			attacker.connect(ctx, t, n)
			eventually(ctx, t, 5*time.Second, "the node sees the coordinator subscribed", func() bool { return len(n.topic.ListPeers()) >= 1 })
			time.Sleep(2 * time.Second) // meshes form (before)

			topic := proto.CapacityTopic(testNet)
			var msgs []*pb.Message
			for i, data := range [][]byte{attacker.announcement(t, c), []byte("junk"), n.announcement(t, c)} {
				m, err := SignedMessage(attacker.key, topic, data, uint64(i+1))
				if err != nil {
					t.Fatal(err)
				}
				msgs = append(msgs, m)
			}
			raw, err := OpenRaw(ctx, attacker.h, n.h.ID())
			if err != nil {
				t.Fatal(err)
			}
			if err := raw.Subscribe(topic); err != nil {
				t.Fatal(err)
			}
			if err := raw.Publish(msgs...); err != nil {
				t.Fatal(err)
			}
			eventually(ctx, t, 5*time.Second, "the node receives the attacker's three messages", func() bool {
				return n.count.MsgsIn.Load() >= 3
			})
			n.publish(ctx, t, n.announcement(t, c))
			eventually(ctx, t, 2*time.Second, "the node's own announcement at the coordinator", func() bool { return c.taken(n.h.ID()) == 1 })
			time.Sleep(time.Second)
			relayed, validated := c.taken(attacker.h.ID()), n.count.Validated.Load()
			t.Logf("%s: the node validated %d, the coordinator took %d from the attacker", d, validated, relayed)
			if d == PublishOnly && (relayed != 0 || validated != 0) {
				t.Fatalf("publish-only: the node validated %d messages and the coordinator took %d of the attacker's", validated, relayed)
			}
			if d == Subscribed && (relayed != 1 || validated != 3) {
				t.Fatalf("control: before issue 17 the node validated %d (want 3) and relayed %d (want the valid one)", validated, relayed)
			}
		})
	}
}

// TestFloodCostsAuthor: a peer that publishes straight to a coordinator, as
// nodes now do, and sends invalid announcements loses score with the first
// (pruned below 0), is graylisted after three, and its valid announcements
// are then ignored; an honest node beside it is taken throughout and spends
// nothing on the flood.
func TestFloodCostsAuthor(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := roles{PublishOnly}
	c := r.coordinator(ctx, t)
	honest := r.node(ctx, t, c)
	// The attacker runs gossipsub without a validator: it can publish
	// anything, flooded to the coordinator like a node's.
	attacker := newLPeer(ctx, t, proto.NodeGossipOptions(testNet, []peer.ID{c.h.ID()})...)
	var err error
	if attacker.topic, err = attacker.ps.Join(proto.CapacityTopic(testNet)); err != nil {
		t.Fatal(err)
	}
	honest.connect(ctx, t, c)
	attacker.connect(ctx, t, c, honest)
	eventually(ctx, t, 5*time.Second, "both see the coordinator", func() bool {
		return len(honest.topic.ListPeers()) == 1 && len(attacker.topic.ListPeers()) == 1
	})
	attacker.publish(ctx, t, attacker.announcement(t, c))
	honest.publish(ctx, t, honest.announcement(t, c))
	eventually(ctx, t, 2*time.Second, "both taken", func() bool { return c.taken(attacker.h.ID()) == 1 && c.taken(honest.h.ID()) == 1 })

	attacker.publish(ctx, t, []byte("junk"))
	eventually(ctx, t, 3*time.Second, "a negative score after one invalid announcement", func() bool {
		return c.score(attacker.h.ID()) < 0
	})
	attacker.publish(ctx, t, []byte("more junk"))
	attacker.publish(ctx, t, []byte("still junk"))
	eventually(ctx, t, 3*time.Second, "graylisted after three", func() bool {
		return c.score(attacker.h.ID()) < proto.GraylistThreshold
	})
	var honestTaken atomic.Int64
	for range 3 {
		time.Sleep(proto.MinAnnounceGap + 50*time.Millisecond)
		attacker.publish(ctx, t, attacker.announcement(t, c))
		honest.publish(ctx, t, honest.announcement(t, c))
	}
	eventually(ctx, t, 2*time.Second, "the honest node's announcements taken", func() bool {
		honestTaken.Store(int64(c.taken(honest.h.ID())))
		return honestTaken.Load() == 4
	})
	time.Sleep(500 * time.Millisecond)
	if got := c.taken(attacker.h.ID()); got != 1 {
		t.Fatalf("the graylisted attacker had %d announcements taken, want only its first", got)
	}
	if s := c.score(honest.h.ID()); s < 0 {
		t.Fatalf("the honest node's score is %v", s)
	}
	if v := honest.count.Validated.Load(); v != 0 {
		t.Fatalf("the honest node validated %d messages", v)
	}
}

// TestCoordinatorTakesABurst: 1,000 nodes' announcements arrive at a
// coordinator at once (as when every node reconnects after a restart)
// while its intake is stalled for a second (its lock held by a scheduling
// round): all are taken, none dropped. With gossipsub's default queues
// (32 waiting for validation, 32 validated waiting for the reader) most
// were lost.
func TestCoordinatorTakesABurst(t *testing.T) {
	const authors, pushers = 1000, 20
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr := mocknetTransport(t)
	coord := tr.add(0)
	count := &Counter{}
	count.On.Store(true)
	ps, err := pubsub.NewGossipSub(ctx, coord, append(proto.CoordinatorGossipOptions(testNet, nil), pubsub.WithRawTracer(count))...)
	if err != nil {
		t.Fatal(err)
	}
	_, sub, err := proto.JoinCapacity(ps, testNet, proto.NewAnnouncementGuard(testNet), nil)
	if err != nil {
		t.Fatal(err)
	}
	topic := proto.CapacityTopic(testNet)
	msgs := make([]*pb.Message, authors)
	for i := range msgs {
		key, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			t.Fatal(err)
		}
		id, _ := peer.IDFromPrivateKey(key)
		data, err := gproto.Marshal(&proto.Announcement{Network: testNet, PeerId: []byte(id), Seq: 1, UnixMillis: time.Now().UnixMilli(),
			TotalSlots: 4, FreeSlots: 4, Slot: &proto.SlotShape{CpuMillis: 1000, MemoryBytes: 4 << 30}, Incarnation: 1,
			Coordinators: []*proto.CoordinatorLoad{{PeerId: []byte(coord.ID())}}})
		if err != nil {
			t.Fatal(err)
		}
		if msgs[i], err = SignedMessage(key, topic, data, 1); err != nil {
			t.Fatal(err)
		}
	}
	streams := tr.rawPushers(ctx, t, coord, pushers)
	var wg sync.WaitGroup
	for p, s := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < authors; i += pushers {
				if err := s.Publish(msgs[i]); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	time.Sleep(time.Second) // the intake stalls
	taken := 0
	for taken < authors {
		next, stop := context.WithTimeout(ctx, 3*time.Second)
		_, err := sub.Next(next)
		stop()
		if err != nil {
			break
		}
		taken++
	}
	if taken != authors || count.Dropped.Load() != 0 {
		t.Fatalf("%d of %d announcements taken; %d dropped at the validation queue, %d undeliverable",
			taken, authors, count.QueueFull.Load(), count.Undeliverable.Load())
	}
}
