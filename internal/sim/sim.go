// Package sim measures what capacity signalling costs each peer as a
// repronet network grows (issue 17; docs/scale.md). It runs the real
// gossipsub of go-libp2p-pubsub, with package proto's options, announcement
// validator and guard, on many libp2p hosts in one process over libp2p's
// in-memory network (mocknet), in either of two designs:
//
//   - Subscribed, the design before issue 17: every node and coordinator
//     joins and subscribes to the capacity topic with proto.GossipOptions,
//     so every node receives, validates and relays every announcement;
//   - PublishOnly, the design since: nodes join without subscribing
//     (proto.NodeGossipOptions, proto.JoinCapacityToPublish) and publish to
//     their coordinators only; coordinators subscribe as sinks
//     (proto.CoordinatorGossipOptions).
//
// Each node dials every coordinator and a few random nodes (as nodes that
// fetch content from each other do) and publishes a real-size announcement
// every Period. Run counts, per peer, the RPCs, messages and bytes its
// router sends and receives and the messages it validates (Counter), the
// process's CPU time while idle and under load, the heap, and the delay
// from each publish to each coordinator's view.
//
// It is test equipment: only tests and benchmarks use it. It owns no
// protocol rule (those are package proto's) and must not change how nodes
// or coordinators behave; it builds their gossipsub the way package node
// and package coordinator do, from the same proto functions.
package sim

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ipfs/go-cid"
	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
	mh "github.com/multiformats/go-multihash"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/proto"
)

// Design is how nodes and coordinators use the capacity topic.
type Design int

const (
	// Subscribed: every peer subscribes and relays (before issue 17).
	Subscribed Design = iota
	// PublishOnly: nodes publish without subscribing, coordinators are
	// sinks (since issue 17).
	PublishOnly
)

func (d Design) String() string {
	if d == PublishOnly {
		return "publish-only"
	}
	return "subscribed"
}

// ReferencePeriod is the announcement period rates are reported at: a
// node's steady announcement interval.
const ReferencePeriod = 5 * time.Second

// Config is one simulated network.
type Config struct {
	Design       Design
	Nodes        int
	Coordinators int
	// NodeLinks is how many random other nodes each node dials, besides
	// every coordinator (default 3).
	NodeLinks int
	// Publishers is how many nodes announce (default all), each every
	// Period (default ReferencePeriod). Fewer, or less often, keeps a large
	// Subscribed network within one machine: what every peer handles
	// grows linearly with the announcements in flight, so rates are scaled
	// to all nodes announcing every ReferencePeriod (Scale).
	Publishers int
	Period     time.Duration
	// Warmup runs before anything is measured (meshes form; default 5 s);
	// Idle is measured with nobody announcing (default 5 s), Window with
	// the publishers announcing (default 4 periods; a whole number of
	// periods has each publisher announce the same number of times).
	Warmup, Idle, Window time.Duration
	// Latency is each link's one-way latency (default none: the delays
	// measured are then the peers' own processing and queueing).
	Latency time.Duration
	// Cached is how many capsules each node announces as cached
	// (default 20).
	Cached int
	Seed   uint64
}

func (c *Config) setDefaults() {
	if c.NodeLinks == 0 {
		c.NodeLinks = 3
	}
	if c.Publishers == 0 {
		c.Publishers = c.Nodes
	}
	if c.Period == 0 {
		c.Period = ReferencePeriod
	}
	if c.Warmup == 0 {
		c.Warmup = 5 * time.Second
	}
	if c.Idle == 0 {
		c.Idle = 5 * time.Second
	}
	if c.Window == 0 {
		c.Window = 4 * c.Period
	}
	if c.Cached == 0 {
		c.Cached = 20
	}
}

// Load is what a peer's router handled, per second, scaled to one
// announcement per node every ReferencePeriod.
type Load struct {
	RPCsIn, RPCsOut, BytesIn, BytesOut, MsgsIn, MsgsOut float64
	// Validated: messages that entered validation (signature and topic
	// validator), its own publications left out.
	Validated float64
	// Dropped: messages lost for want of room (queues).
	Dropped float64
}

func (l Load) add(o Load) Load {
	return Load{l.RPCsIn + o.RPCsIn, l.RPCsOut + o.RPCsOut, l.BytesIn + o.BytesIn, l.BytesOut + o.BytesOut,
		l.MsgsIn + o.MsgsIn, l.MsgsOut + o.MsgsOut, l.Validated + o.Validated, l.Dropped + o.Dropped}
}

func (l Load) scale(f float64) Load {
	return Load{l.RPCsIn * f, l.RPCsOut * f, l.BytesIn * f, l.BytesOut * f, l.MsgsIn * f, l.MsgsOut * f, l.Validated * f, l.Dropped * f}
}

func (l Load) max(o Load) Load {
	return Load{max(l.RPCsIn, o.RPCsIn), max(l.RPCsOut, o.RPCsOut), max(l.BytesIn, o.BytesIn), max(l.BytesOut, o.BytesOut),
		max(l.MsgsIn, o.MsgsIn), max(l.MsgsOut, o.MsgsOut), max(l.Validated, o.Validated), max(l.Dropped, o.Dropped)}
}

// Result is what Run measured.
type Result struct {
	Config Config
	// Node is the mean over nodes, NodeMax the largest of each figure over
	// nodes, Coordinator the mean over coordinators.
	Node, NodeMax, Coordinator Load
	// Sent is how many announcements nodes published in the window;
	// Delivered the share of them (times coordinators) that reached every
	// coordinator's view.
	Sent      int
	Delivered float64
	// MsgsPerAnnouncement is what the nodes sent per announcement they
	// published in the window (publish-only: one per coordinator).
	MsgsPerAnnouncement float64
	// Delays are, sorted, the times from a node's publish to a
	// coordinator's view, for the announcements of the window.
	Delays []time.Duration
	// CPUIdle and CPULoad are the process's CPU time per second (cores)
	// with nobody announcing and in the window; CPUScaled is CPULoad with
	// the announcing part scaled to ReferencePeriod.
	CPUIdle, CPULoad, CPUScaled float64
	// HeapPerPeer is the live heap after setup divided by all peers.
	HeapPerPeer float64
	// AnnouncementBytes is one node's announcement (the message's data).
	AnnouncementBytes int
	Setup             time.Duration
	// Redials is how many node-coordinator connections the warm-up
	// opened again because gossipsub had lost the coordinator.
	Redials int
}

// Delay is the q-quantile (0..1) of Delays.
func (r Result) Delay(q float64) time.Duration {
	if len(r.Delays) == 0 {
		return 0
	}
	return r.Delays[min(len(r.Delays)-1, int(q*float64(len(r.Delays))))]
}

// CPUPerPeer is CPUScaled divided by all peers (nodes and coordinators),
// in cores.
func (r Result) CPUPerPeer() float64 {
	return r.CPUScaled / float64(r.Config.Nodes+r.Config.Coordinators)
}

// Scale is the factor from what cfg runs to all nodes announcing every
// ReferencePeriod.
func (c Config) Scale() float64 {
	return float64(c.Nodes) / float64(c.Publishers) * c.Period.Seconds() / ReferencePeriod.Seconds()
}

const netName = "sim"

type simPeer struct {
	h       host.Host
	count   *Counter
	topic   *pubsub.Topic
	cert    []byte
	caps    [][]byte
	seq     uint64
	publish func(context.Context) error
}

type pubKey struct {
	author peer.ID
	seq    uint64
}

// pubRecord is one publication: when, and whether it was in the window.
type pubRecord struct {
	at       time.Time
	inWindow bool
}

// Run builds the network of cfg, measures it and tears it down.
func Run(ctx context.Context, cfg Config) (Result, error) {
	cfg.setDefaults()
	if cfg.Nodes < 1 || cfg.Coordinators < 1 {
		return Result{}, fmt.Errorf("sim: %d nodes and %d coordinators: need at least one of each", cfg.Nodes, cfg.Coordinators)
	}
	if cfg.Publishers < 1 || cfg.Publishers > cfg.Nodes {
		return Result{}, fmt.Errorf("sim: %d publishers among %d nodes", cfg.Publishers, cfg.Nodes)
	}
	if cfg.Coordinators > proto.MaxCoordinators {
		return Result{}, fmt.Errorf("sim: %d coordinators, a node serves at most %d", cfg.Coordinators, proto.MaxCoordinators)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	mn := mocknet.New()
	defer mn.Close()
	mn.SetLinkDefaults(mocknet.LinkOptions{Latency: cfg.Latency})
	rng := rand.New(rand.NewPCG(cfg.Seed, 17))

	coords := make([]*simPeer, cfg.Coordinators)
	coordIDs := make([]peer.ID, cfg.Coordinators)
	for i := range coords {
		h, err := mockHost(mn, i)
		if err != nil {
			return Result{}, fmt.Errorf("sim: coordinator host: %w", err)
		}
		coords[i], coordIDs[i] = &simPeer{h: h, count: &Counter{}}, h.ID()
	}
	nodes := make([]*simPeer, cfg.Nodes)
	for i := range nodes {
		h, err := mockHost(mn, cfg.Coordinators+i)
		if err != nil {
			return Result{}, fmt.Errorf("sim: node host: %w", err)
		}
		nodes[i] = &simPeer{h: h, count: &Counter{}, seq: uint64(time.Now().UnixNano())}
	}

	var mu sync.Mutex
	var delays []time.Duration
	received := 0
	var pubs sync.Map // pubKey -> pubRecord

	// Coordinators: subscribed, reading every announcement into a view.
	for _, c := range coords {
		opts := proto.GossipOptions(netName, nil)
		if cfg.Design == PublishOnly {
			opts = proto.CoordinatorGossipOptions(netName, nil)
		}
		ps, err := pubsub.NewGossipSub(ctx, c.h, append(opts, pubsub.WithRawTracer(c.count))...)
		if err != nil {
			return Result{}, fmt.Errorf("sim: coordinator gossipsub: %w", err)
		}
		_, sub, err := proto.JoinCapacity(ps, netName, proto.NewAnnouncementGuard(netName), nil)
		if err != nil {
			return Result{}, fmt.Errorf("sim: %w", err)
		}
		go func() {
			defer sub.Cancel()
			for {
				m, err := sub.Next(ctx)
				if err != nil {
					return
				}
				va, ok := m.ValidatorData.(*proto.ValidatedAnnouncement)
				if !ok {
					continue
				}
				now := time.Now()
				v, ok := pubs.Load(pubKey{m.GetFrom(), va.Announcement.GetSeq()})
				if !ok || !v.(pubRecord).inWindow {
					continue
				}
				mu.Lock()
				delays = append(delays, now.Sub(v.(pubRecord).at))
				received++
				mu.Unlock()
			}
		}()
	}

	// Nodes: as package node runs them (or as it did before issue 17).
	opKeys := make([]crypto.PrivKey, (cfg.Nodes+3)/4) // four nodes per operator
	for i := range opKeys {
		opKeys[i], _, _ = crypto.GenerateEd25519Key(nil)
	}
	for i, n := range nodes {
		var opts []pubsub.Option
		if cfg.Design == PublishOnly {
			opts = proto.NodeGossipOptions(netName, coordIDs)
		} else {
			opts = proto.GossipOptions(netName, nil)
		}
		ps, err := pubsub.NewGossipSub(ctx, n.h, append(opts, pubsub.WithRawTracer(n.count))...)
		if err != nil {
			return Result{}, fmt.Errorf("sim: node gossipsub: %w", err)
		}
		guard := proto.NewAnnouncementGuard(netName)
		if cfg.Design == PublishOnly {
			n.topic, err = proto.JoinCapacityToPublish(ps, netName, guard)
		} else {
			var sub *pubsub.Subscription
			n.topic, sub, err = proto.JoinCapacity(ps, netName, guard, nil, pubsub.WithBufferSize(64))
			if err == nil {
				go func() {
					defer sub.Cancel()
					for {
						if _, err := sub.Next(ctx); err != nil {
							return
						}
					}
				}()
			}
		}
		if err != nil {
			return Result{}, fmt.Errorf("sim: %w", err)
		}
		if n.cert, err = proto.SealOperatorCert(opKeys[i/4], n.h.ID(), netName, time.Now()); err != nil {
			return Result{}, fmt.Errorf("sim: %w", err)
		}
		for range cfg.Cached {
			digest, _ := mh.Sum(fmt.Appendf(nil, "capsule %d", rng.IntN(1000)), mh.SHA2_256, -1)
			n.caps = append(n.caps, cid.NewCidV1(cid.Raw, digest).Bytes())
		}
	}

	// Connections: every node to every coordinator and to NodeLinks others.
	connect := func(a, b *simPeer) error {
		if len(mn.LinksBetweenPeers(a.h.ID(), b.h.ID())) > 0 {
			return nil
		}
		if _, err := mn.LinkPeers(a.h.ID(), b.h.ID()); err != nil {
			return err
		}
		_, err := mn.ConnectPeers(a.h.ID(), b.h.ID())
		return err
	}
	for i, n := range nodes {
		for _, c := range coords {
			if err := connect(n, c); err != nil {
				return Result{}, fmt.Errorf("sim: connect: %w", err)
			}
		}
		for range min(cfg.NodeLinks, cfg.Nodes-1) {
			j := rng.IntN(cfg.Nodes - 1)
			if j >= i {
				j++
			}
			if err := connect(n, nodes[j]); err != nil {
				return Result{}, fmt.Errorf("sim: connect: %w", err)
			}
		}
	}
	res := Result{Config: cfg}
	one, err := announcement(cfg, nodes[0], coordIDs, 1)
	if err != nil {
		return res, err
	}
	res.AnnouncementBytes = len(one)
	res.Setup = time.Since(start)

	if err := sleep(ctx, cfg.Warmup); err != nil {
		return res, err
	}
	// The warm-up is over once every publisher hears every coordinator's
	// subscription (under load that takes longer than Warmup): before,
	// what a node publishes reaches no one, which says nothing of the
	// design.
	redial := func(n *simPeer, c peer.ID) error {
		_ = n.h.Network().ClosePeer(c)
		_, err := mn.ConnectPeers(n.h.ID(), c)
		return err
	}
	if res.Redials, err = waitSubscribed(ctx, nodes[:cfg.Publishers], coordIDs, redial); err != nil {
		return res, err
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	res.HeapPerPeer = float64(ms.HeapInuse) / float64(cfg.Nodes+cfg.Coordinators)
	cpu0 := cpuTime()
	if err := sleep(ctx, cfg.Idle); err != nil {
		return res, err
	}
	res.CPUIdle = (cpuTime() - cpu0).Seconds() / cfg.Idle.Seconds()

	// Announce: each node every Period, spread over the period.
	var measuring sync.Mutex // held to flip the window
	inWindow := false
	sent := 0
	var wg sync.WaitGroup
	all := append(slices.Clone(nodes), coords...)
	measuring.Lock() // the window opens as the first announcement goes out
	inWindow = true
	for _, p := range all {
		p.count.On.Store(true)
	}
	measuring.Unlock()
	cpu0 = cpuTime()
	wstart := time.Now()
	for i, n := range nodes[:cfg.Publishers] {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if sleep(ctx, cfg.Period*time.Duration(i)/time.Duration(cfg.Publishers)) != nil {
				return
			}
			tick := time.NewTicker(cfg.Period)
			defer tick.Stop()
			for {
				n.seq++
				b, err := announcement(cfg, n, coordIDs, n.seq)
				if err != nil {
					return
				}
				measuring.Lock()
				rec := pubRecord{at: time.Now(), inWindow: inWindow}
				if inWindow {
					sent++
				}
				measuring.Unlock()
				pubs.Store(pubKey{n.h.ID(), n.seq}, rec)
				if err := n.topic.Publish(ctx, b); err != nil {
					return
				}
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}()
	}
	if err := sleep(ctx, cfg.Window); err != nil {
		return res, err
	}
	measuring.Lock()
	inWindow = false
	for _, p := range all {
		p.count.On.Store(false)
	}
	res.Sent = sent
	measuring.Unlock()
	elapsed := time.Since(wstart)
	res.CPULoad = (cpuTime() - cpu0).Seconds() / elapsed.Seconds()
	f := cfg.Scale()
	res.CPUScaled = res.CPUIdle + (res.CPULoad-res.CPUIdle)*f

	// Let the window's last announcements arrive.
	want := res.Sent * cfg.Coordinators
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		mu.Lock()
		got := received
		mu.Unlock()
		if got >= want {
			break
		}
		if err := sleep(ctx, 50*time.Millisecond); err != nil {
			return res, err
		}
	}
	cancel()
	wg.Wait()

	perSec := f / elapsed.Seconds()
	var out float64
	for _, n := range nodes {
		out += n.count.Load().MsgsOut
		l := n.count.Load().scale(perSec)
		res.Node = res.Node.add(l)
		res.NodeMax = res.NodeMax.max(l)
	}
	res.Node = res.Node.scale(1 / float64(cfg.Nodes))
	for _, c := range coords {
		res.Coordinator = res.Coordinator.add(c.count.Load().scale(perSec))
	}
	res.Coordinator = res.Coordinator.scale(1 / float64(cfg.Coordinators))
	mu.Lock()
	defer mu.Unlock()
	if want > 0 {
		res.Delivered = float64(received) / float64(want)
	}
	if res.Sent > 0 {
		res.MsgsPerAnnouncement = out / float64(res.Sent)
	}
	res.Delays = slices.Clone(delays)
	slices.Sort(res.Delays)
	return res, nil
}

// announcement is what package node announces (node.go,
// announcementLocked), encoded: 8 slots of which each coordinator's
// attempts hold one and the free count changes with every announcement,
// an operator certificate, the cached capsules as CIDs (Subscribed, as
// before issue 17) or as keys (PublishOnly).
func announcement(cfg Config, n *simPeer, coords []peer.ID, seq uint64) ([]byte, error) {
	a := &proto.Announcement{Network: netName, PeerId: []byte(n.h.ID()), Seq: seq, UnixMillis: time.Now().UnixMilli(),
		TotalSlots: 8, FreeSlots: uint32(2 + seq%3), Slot: &proto.SlotShape{CpuMillis: 1000, MemoryBytes: 4 << 30},
		Arch: "amd64", Version: "0.1.0", OperatorCert: n.cert, Incarnation: 1}
	for _, c := range coords {
		a.Coordinators = append(a.Coordinators, &proto.CoordinatorLoad{PeerId: []byte(c), Running: 1})
	}
	if cfg.Design == PublishOnly {
		a.CachedKeys = proto.CacheKeys(n.caps)
	} else {
		a.CachedCapsules = n.caps[:min(len(n.caps), proto.MaxCachedCapsules)]
	}
	b, err := gproto.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("sim: encode announcement: %w", err)
	}
	return b, nil
}

// mockHost adds to mn a host with a new Ed25519 key and the i-th address.
func mockHost(mn mocknet.Mocknet, i int) (host.Host, error) {
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		return nil, fmt.Errorf("sim: host key: %w", err)
	}
	h, err := mn.AddPeer(k, ma.StringCast(fmt.Sprintf("/ip4/10.%d.%d.%d/tcp/4001", i>>16&255, i>>8&255, i&255)))
	if err != nil {
		return nil, fmt.Errorf("sim: add host: %w", err)
	}
	return h, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return errors.Join(errors.New("sim: stopped"), ctx.Err())
	case <-t.C:
		return nil
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// subscribeGrace is how long waitSubscribed lets a node go without
// hearing a coordinator's subscription before it opens their connection
// again.
const subscribeGrace = 5 * time.Second

// waitSubscribed waits until each node's topic lists every coordinator as
// a subscriber (at most a minute), and returns how many connections it
// opened again. A node that has not heard a coordinator for
// subscribeGrace gets its connection to it closed and opened again
// (redial), as a real node's gossip watch does (node/gossipwatch.go):
// gossipsub that failed to open its stream under load never tries again
// on the same connection.
func waitSubscribed(ctx context.Context, nodes []*simPeer, coords []peer.ID, redial func(*simPeer, peer.ID) error) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	redials := 0
	for _, n := range nodes {
		since := time.Now()
		for {
			listed := n.topic.ListPeers()
			missing := slices.DeleteFunc(slices.Clone(coords), func(c peer.ID) bool { return slices.Contains(listed, c) })
			if len(missing) == 0 {
				break
			}
			if time.Since(since) >= subscribeGrace {
				for _, c := range missing {
					if err := redial(n, c); err != nil {
						return redials, fmt.Errorf("sim: node %s: connect to coordinator %s again: %w", n.h.ID(), c, err)
					}
					redials++
				}
				since = time.Now()
			}
			if err := sleep(ctx, 20*time.Millisecond); err != nil {
				return redials, fmt.Errorf("sim: node %s does not hear every coordinator's subscription (%d connections opened again): %w",
					n.h.ID(), redials, err)
			}
		}
	}
	return redials, nil
}
