package sim

import (
	"context"
	"testing"
	"time"
)

// TestRun: a small network in each design, side by side. Publish-only,
// a node receives and validates nothing, sends one message per
// coordinator per announcement, and every announcement reaches both
// coordinators; subscribed, every node receives and validates the others'
// announcements.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("runs two 30-node networks for ~25 s")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const nodes = 30
	run := func(d Design, period time.Duration) Result {
		r, err := Run(ctx, Config{Design: d, Nodes: nodes, Coordinators: 2, Period: period, Warmup: 2 * time.Second,
			Idle: time.Second, Window: 3 * period, Seed: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: node %+v; coordinator %+v; sent %d, delivered %.3f, delay p50 %s p99 %s; %.1f%% CPU per peer; %d-byte announcement; %d connections opened again",
			d, r.Node, r.Coordinator, r.Sent, r.Delivered, r.Delay(0.5), r.Delay(0.99), 100*r.CPUPerPeer(), r.AnnouncementBytes, r.Redials)
		// Under load (other tests share the machine) the publishers
		// fall behind their period: what follows holds per announcement.
		if r.Sent < nodes {
			t.Fatalf("%s: %d sent, want at least one a node (%d)", d, r.Sent, nodes)
		}
		return r
	}
	after := run(PublishOnly, time.Second)
	if after.Delivered < 0.99 {
		t.Fatalf("publish-only: %.3f delivered to both coordinators", after.Delivered)
	}
	if after.NodeMax.MsgsIn != 0 || after.NodeMax.Validated != 0 {
		t.Fatalf("publish-only: a node received %.1f messages/s and validated %.1f/s", after.NodeMax.MsgsIn, after.NodeMax.Validated)
	}
	// Each node sends its announcement to each coordinator once.
	if m := after.MsgsPerAnnouncement; m < 1.9 || m > 2.1 {
		t.Fatalf("publish-only: %.2f messages sent per announcement, want 2 (one per coordinator)", m)
	}
	// Subscribed, nodes receive and validate the others' announcements
	// (how many arrive in the window depends on the machine's load).
	before := run(Subscribed, 2*time.Second)
	if before.Node.Validated == 0 || before.NodeMax.MsgsIn == 0 {
		t.Fatalf("subscribed: nodes validated %.2f messages/s and received %.2f: want some", before.Node.Validated, before.NodeMax.MsgsIn)
	}
}
