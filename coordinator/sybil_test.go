package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
)

// Free identities, as found live: ten unadmitted peer IDs in one process
// announce 8 slots each, accept every offer, never renew and never report,
// so each lease lapses (10 identities took 399 assignments in 3.5 minutes
// and 33 of 52 attempts ended "gave up after 10 lost leases"). Beside them
// one honest node of an admitted operator. The ten share one allowance (a
// new node's: 2, halved by each lease they lose) and count as one towards
// an attempt's MaxLeaseLosses, so every attempt is run by the honest node
// and none ends as a lost-lease failure.
func TestFreeIdentitiesShareOneAllowance(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	opKey, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	c := openTestWith(t, t.TempDir(), func(cfg *Config) {
		cfg.ScheduleInterval = 50 * time.Millisecond
		cfg.LeaseTTL = time.Second
		cfg.IdleCanaryEvery = -1
		cfg.MaxLeaseLosses = 3 // ten identities would exhaust it three times over
	})
	defer c.Close()
	var sybils []*wireNode
	for range 10 {
		w := newWireNode(ctx, t, c, 8)
		selfMade, _, _ := crypto.GenerateEd25519Key(nil)
		w.withOperator(selfMade)
		w.announce(ctx)
		w.announceEvery(ctx, time.Second)
		sybils = append(sybils, w)
	}
	honest := newWireNode(ctx, t, c, 2)
	op := honest.withOperator(opKey)
	if err := c.Admit(ctx, op.String()); err != nil {
		t.Fatal(err)
	}
	honest.report = func(a *proto.Assignment) *proto.Report { return honest.okReport(a, `{}`) }
	honest.announce(ctx)
	honest.announceEvery(ctx, time.Second)

	start := time.Now()
	atts := evaluate(t, c, Evaluation{ID: "ev-free-ids", Runs: 3, Replicas: 1})
	maxHeld := 0
	sample := func() {
		c.mu.Lock()
		n := 0
		for _, w := range sybils {
			n += c.state.Leases.HeldBy(w.id().String())
		}
		c.mu.Unlock()
		maxHeld = max(maxHeld, n)
	}
	waitUntil(ctx, t, "every attempt has ended", func() bool {
		sample()
		for _, a := range c.Attempts() {
			if a.Eval == "ev-free-ids" && a.State != StateDone && a.State != StateFailed {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	given := 0
	for _, w := range sybils {
		given += len(w.held())
	}
	for _, a := range c.Attempts() {
		if a.Eval != "ev-free-ids" {
			continue
		}
		if a.State != StateDone || a.ReportedBy != honest.id().String() {
			t.Fatalf("attempt %s: %s by %q (%q); want done by the honest node", a.ID, a.State, a.ReportedBy, a.Detail)
		}
		if strings.Contains(a.Detail, "lost leases") {
			t.Fatalf("attempt %s ended as a lost-lease failure: %q", a.ID, a.Detail)
		}
	}
	if want := c.cfg.Allowance.Initial; maxHeld > want {
		t.Fatalf("the ten unadmitted identities held %d attempts at once; together they may hold %d", maxHeld, want)
	}
	if r := record(c, honest.id().String()); r.LeaseLost != 0 || r.Completed < len(atts) {
		t.Fatalf("honest node's record %+v", r)
	}
	c.mu.Lock()
	pool := *c.state.Pools[core.UnadmittedOperator]
	c.mu.Unlock()
	if pool.LeaseLost == 0 || c.cfg.Allowance.Limit(pool.Allowance, time.Now()) != 1 {
		t.Fatalf("the unadmitted pool after its lapses: %+v", pool)
	}
	t.Logf("%d attempts done by the honest node in %v; the ten identities were given %d, held at most %d at once, lost %d leases",
		len(atts), took.Round(time.Millisecond), given, maxHeld, pool.LeaseLost)
}

// Half-open streams against a real coordinator, as found live: four peers
// hold 500 streams each that never negotiate a protocol (before the fix
// they filled libp2p's transient scope, and an honest 6-attempt
// evaluation took 61.4 s instead of 1.15 s, its node charged 7 lost
// leases). An honest node's evaluation beside them runs within twice its
// time alone (or a second more, the announcements' granularity), and the
// node loses no lease.
func TestHalfOpenStreamsSpareTheProtocols(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) {
		cfg.ScheduleInterval = 50 * time.Millisecond
		cfg.LeaseTTL = 2 * time.Second
		cfg.IdleCanaryEvery = -1
	})
	defer c.Close()
	honest := newWireNode(ctx, t, c, 2)
	honest.report = func(a *proto.Assignment) *proto.Report { return honest.okReport(a, `{}`) }
	honest.announce(ctx)
	honest.announceEvery(ctx, proto.MinAnnounceGap+50*time.Millisecond)
	run := func(id string) time.Duration {
		start := time.Now()
		atts := evaluate(t, c, Evaluation{ID: id, Runs: 2, Replicas: 1})
		waitUntil(ctx, t, id+" done", func() bool {
			done := 0
			for _, a := range c.Attempts() {
				if a.Eval == id && a.State == StateDone {
					done++
				}
			}
			return done == len(atts)
		})
		return time.Since(start)
	}
	run("ev-warm")
	alone := run("ev-alone")

	target := peer.AddrInfo{ID: c.ID(), Addrs: c.Host().Addrs()}
	const attackers, each = 4, 500
	for range attackers {
		h := connectedHost(ctx, t, target, libp2p.ResourceManager(&network.NullResourceManager{}))
		go func() {
			// Hold 500, and open new ones as the coordinator ends them.
			for ctx.Err() == nil {
				conns := h.Network().ConnsToPeer(c.ID())
				if len(conns) == 0 {
					return
				}
				for range each - len(conns[0].GetStreams()) {
					h.Network().NewStream(network.WithNoDial(ctx, "half-open"), c.ID())
				}
				time.Sleep(100 * time.Millisecond)
			}
		}()
	}
	time.Sleep(time.Second)
	inNegotiation := 0
	c.Host().Network().ResourceManager().ViewTransient(func(s network.ResourceScope) error {
		inNegotiation = s.Stat().NumStreamsInbound
		return nil
	})
	if inNegotiation < attackers*p2phost.TransientPerPeer/2 {
		t.Fatalf("only %d streams in negotiation at the coordinator: the attack is not on", inNegotiation)
	}
	attacked := run("ev-attacked")
	t.Logf("6 attempts: %v alone, %v beside %d peers holding %d streams in negotiation", alone.Round(time.Millisecond),
		attacked.Round(time.Millisecond), attackers, inNegotiation)
	if attacked > max(2*alone, alone+time.Second) {
		t.Fatalf("beside half-open streams the evaluation took %v, %v alone", attacked, alone)
	}
	if r := record(c, honest.id().String()); r.LeaseLost != 0 {
		t.Fatalf("the honest node lost %d leases", r.LeaseLost)
	}
}
