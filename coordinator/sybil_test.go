package coordinator

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/repronet/repronet/coordinator/core"
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
