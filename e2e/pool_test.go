package e2e

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/sandbox"
)

// countingSandbox records the most attempts its node ran at once.
type countingSandbox struct {
	node.Sandbox
	mu       sync.Mutex
	cur, max int
}

func (c *countingSandbox) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Result, error) {
	c.mu.Lock()
	c.cur++
	c.max = max(c.max, c.cur)
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.cur--
		c.mu.Unlock()
	}()
	return c.Sandbox.Run(ctx, spec)
}

// TestSharedPool: two coordinators share one network and its nodes. Nodes
// n1 and n2 serve both; n3 serves only coordinator A, and shares an
// operator with n1. Both
// coordinators evaluate an agent with two replicas per run at once. Every
// attempt finishes; no node ever runs more than its slots; replicas of a
// run land on distinct operators; B never hears of n3 (nodes publish to the
// coordinators they serve and relay nothing) and never uses it. A node is
// in view within seconds of starting and leaves it once it stops
// announcing.
func TestSharedPool(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)
	const network = "e2e-pool"
	var coords []*coordinator.Coordinator
	for range 2 {
		c, err := coordinator.New(ctx, coordinator.Config{
			DataDir: t.TempDir(), Network: network, Limits: demo.SampleLimits(), Logger: log,
			LeaseTTL: 20 * time.Second, NodeTTL: 3 * time.Second, JoinTokens: []string{e2eJoinToken}, Families: families.Registry(),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := demo.ImportSample(ctx, c); err != nil {
			t.Fatal(err)
		}
		coords = append(coords, c)
	}
	a, b := coords[0], coords[1]
	runner, err := sandbox.New(ctx, d.Socket, sandbox.WithNamespace("repronet-e2e-pool"), sandbox.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer runner.Close()
	opKey, _, _ := crypto.GenerateEd25519Key(nil)
	both := []string{a.Addrs()[0].String(), b.Addrs()[0].String()}
	specs := []struct {
		coords []string
		op     crypto.PrivKey
	}{{both, opKey}, {both, nil}, {both[:1], opKey}}
	var nodes []*node.Node
	var boxes []*countingSandbox
	for _, s := range specs {
		box := &countingSandbox{Sandbox: runner}
		started := time.Now()
		n, err := node.New(ctx, node.Config{DataDir: t.TempDir(), Network: network, Coordinators: s.coords, Slots: 2,
			Sandbox: box, OperatorKey: s.op, AnnounceInterval: time.Second, JoinToken: e2eJoinToken, Logger: log, BaseImages: baseImages(t)})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		waitFor(ctx, t, "the new node in A's view", func() bool { return inView(a, n.ID().String()) })
		if d := time.Since(started); d > 5*time.Second {
			t.Fatalf("a node took %s to appear in the coordinator's view", d)
		}
		nodes, boxes = append(nodes, n), append(boxes, box)
	}
	n3 := nodes[2].ID().String()
	waitFor(ctx, t, "n1 and n2 in B's view", func() bool { return inView(b, nodes[0].ID().String()) && inView(b, nodes[1].ID().String()) })
	if inView(b, n3) {
		t.Fatal("n3, which serves only A, is in B's view: someone relayed its announcement")
	}

	levels := allLevels
	for _, c := range coords {
		if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: "oracle", Levels: levels, Replicas: 2}); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range coords {
		waitFor(ctx, t, "every attempt finished", func() bool {
			p := c.Progress()
			return p.Done+p.Failed == p.Total
		})
	}
	opOf := map[string]string{}
	for _, n := range nodes {
		opOf[n.ID().String()] = n.ID().String()
	}
	opOf[n3] = nodes[0].ID().String() // n1 and n3: one operator
	for i, c := range coords {
		units := map[string]map[string]bool{}
		for _, at := range c.Attempts() {
			if at.State != coordinator.StateDone {
				t.Fatalf("coordinator %d: attempt %s ended %s: %s", i, at.ID, at.State, at.Detail)
			}
			if c == b && at.ReportedBy == n3 {
				t.Fatalf("coordinator B ran attempt %s on n3, which does not serve it", at.ID)
			}
			if units[at.Unit] == nil {
				units[at.Unit] = map[string]bool{}
			}
			if op := opOf[at.ReportedBy]; units[at.Unit][op] {
				t.Fatalf("coordinator %d: two replicas of %s on operator %s", i, at.Unit, op)
			} else {
				units[at.Unit][op] = true
			}
		}
		st := c.Stats()
		t.Logf("coordinator %d: %d attempts, %d busy declines, %d reassignments", i, st.Total, st.BusyDeclines, st.Reassignments)
	}
	for i, box := range boxes {
		if box.max > 2 {
			t.Fatalf("node %d ran %d attempts at once on 2 slots", i+1, box.max)
		}
	}

	if inView(b, n3) {
		t.Fatal("n3, which serves only A, came into B's view")
	}

	// A stopped node leaves the view after NodeTTL.
	nodes[2].Close()
	waitFor(ctx, t, "the stopped node out of A's view", func() bool { return !inView(a, n3) })
}

func inView(c *coordinator.Coordinator, id string) bool {
	for _, n := range c.Nodes() {
		if n.ID == id {
			return true
		}
	}
	return false
}
