package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
)

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// TestWalkingSkeleton runs both sample agents on every sample task at all
// three levels through a coordinator and two nodes on loopback, against
// the real containerd daemon, then attacks the report stream.
func TestWalkingSkeleton(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	log := testLogger(t)

	d := ensureDaemon(ctx, t, log)
	coord := startCoordinator(ctx, t, coordinator.Config{Logger: log})

	runner, err := sandbox.New(ctx, d.Socket, sandbox.WithNamespace("repronet-e2e"), sandbox.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer runner.Close()
	var nodes []*node.Node
	for range 2 {
		n, err := node.New(ctx, node.Config{
			DataDir: t.TempDir(), Coordinators: []string{coord.Addrs()[0].String()},
			Slots: 2, Sandbox: runner, JoinToken: e2eJoinToken, Logger: log, BaseImages: baseImages(t),
		})
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		nodes = append(nodes, n)
	}
	waitFor(ctx, t, "both nodes in the coordinator's view", func() bool { return len(coord.Nodes()) == 2 })

	levels := allLevels
	for _, agent := range []string{"oracle", "wrong"} {
		if _, _, err := coord.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: agent, Levels: levels}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(ctx, t, "every attempt finished and every run cross-checked", func() bool {
		p := coord.Progress()
		return p.Done+p.Failed == p.Total && p.Decided == p.Units
	})

	// One unit per (agent, task, level), each with the replicas the
	// cross-check asked for (two, or one once a node is trusted).
	attempts := coord.Attempts()
	units := map[string]bool{}
	for _, a := range attempts {
		units[a.Unit] = true
	}
	want := 2 * len(levels) * len(sample.CapsuleIDs())
	if len(units) != want || len(attempts) < want {
		t.Fatalf("%d attempts of %d units, want %d units", len(attempts), len(units), want)
	}
	ranOn := map[string]int{}
	for _, a := range attempts {
		if a.State != coordinator.StateDone {
			t.Fatalf("attempt %s (%s %s %s) ended %s: %s", a.ID, a.Agent, a.TaskID, a.Level, a.State, a.Detail)
		}
		ranOn[a.Node]++

		// The stored report verifies and was signed by the assigned node.
		r, signer, err := coord.Report(ctx, a.ID)
		if err != nil {
			t.Fatalf("stored report of %s: %v", a.ID, err)
		}
		if signer.String() != a.Node {
			t.Fatalf("report of %s signed by %s, attempt assigned to %s", a.ID, signer, a.Node)
		}
		if a.Agent == "oracle" {
			checkLimitsSeenInside(t, a, r)
		}
	}
	if len(ranOn) != 2 {
		t.Fatalf("attempts ran on %d nodes, want both: %v", len(ranOn), ranOn)
	}

	// Every capsule a node ran crossed over bitswap into its own store.
	caps := map[string]cid.Cid{}
	for _, a := range attempts {
		if _, ok := caps[a.TaskID]; ok {
			continue
		}
		r, _, _ := coord.Report(ctx, a.ID)
		c, err := cid.Cast(r.GetInputCids()[0])
		if err != nil {
			t.Fatal(err)
		}
		caps[a.TaskID] = c
	}
	for _, a := range attempts {
		n := nodeByID(nodes, a.Node)
		if ok, err := n.Holds(ctx, caps[a.TaskID]); err != nil || !ok {
			t.Fatalf("node %s ran %s but does not hold capsule %s (err %v)", a.Node, a.TaskID, caps[a.TaskID], err)
		}
	}

	board := flatBoard(coord)
	checkBoard(t, board, levels)

	// Attacks on the report stream, from a host of the attacker's own.
	attacker, akey := newHost(t)
	defer attacker.Close()
	if err := attacker.Connect(ctx, peer.AddrInfo{ID: coord.ID(), Addrs: coord.Host().Addrs()}); err != nil {
		t.Fatal(err)
	}
	victim := attempts[0]
	victimID, _ := peer.Decode(victim.Node)
	tests := []struct {
		name   string
		report *proto.Report
		want   string
	}{
		{"signed by another node than the assigned one",
			&proto.Report{AttemptId: victim.ID, NodePeerId: []byte(attacker.ID()), Outcome: proto.Outcome_OUTCOME_OK, Detail: "{}"},
			fmt.Sprintf("signed by node %s, but the attempt is assigned to node %s", attacker.ID(), victim.Node)},
		{"names the assigned node but signed by another",
			&proto.Report{AttemptId: victim.ID, NodePeerId: []byte(victimID), Outcome: proto.Outcome_OUTCOME_OK},
			"but is signed by " + attacker.ID().String()},
		{"attempt never assigned",
			&proto.Report{AttemptId: "at-never-assigned", NodePeerId: []byte(attacker.ID()), Outcome: proto.Outcome_OUTCOME_OK},
			"no attempt with this ID was ever assigned"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ack := sendReport(ctx, t, attacker, coord.ID(), tt.report, akey)
			if ack.GetAccepted() {
				t.Fatalf("forged report accepted: %v", ack)
			}
			if !strings.Contains(ack.GetError(), tt.want) {
				t.Fatalf("ack error %q does not say %q", ack.GetError(), tt.want)
			}
		})
	}
	if after := flatBoard(coord); !reflect.DeepEqual(after, board) {
		t.Fatalf("leaderboard changed after forged reports:\nbefore %v\nafter  %v", board, after)
	}
}

func checkLimitsSeenInside(t *testing.T, a coordinator.Attempt, r *proto.Report) {
	t.Helper()
	out := string(r.GetStdoutTail())
	for _, want := range []string{"cpu.cfs_quota_us=100000", "cpu.cfs_period_us=100000",
		fmt.Sprintf("memory.limit_in_bytes=%d", demo.SampleLimits().GetMemoryBytes())} {
		if !strings.Contains(out, want) {
			t.Fatalf("attempt %s: agent did not see %q inside its container; stdout:\n%s", a.ID, want, out)
		}
	}
	// Network none: the only interface is loopback.
	for _, line := range strings.Split(out, "\n") {
		if name, ok := strings.CutPrefix(line, "netif "); ok && strings.TrimSpace(name) != "lo" {
			t.Fatalf("attempt %s: container has network interface %q; stdout:\n%s", a.ID, name, out)
		}
	}
	if !strings.Contains(out, "netif lo") {
		t.Fatalf("attempt %s: agent listed no interfaces; stdout:\n%s", a.ID, out)
	}
}

func checkBoard(t *testing.T, board []leaderboard.FlatRow, levels []string) {
	t.Helper()
	if len(board) != 2*len(levels) {
		t.Fatalf("leaderboard has %d rows, want %d: %+v", len(board), 2*len(levels), board)
	}
	for _, r := range board {
		want := map[string]float64{"oracle": 1, "wrong": 0}[r.Agent]
		if r.Tasks != len(sample.CapsuleIDs()) || r.Accuracy != want || r.InfraFailures != 0 {
			t.Errorf("%s %s: accuracy %.2f over %d tasks (%d infra failures), want %.0f over %d",
				r.Level, r.Agent, r.Accuracy, r.Tasks, r.InfraFailures, want, len(sample.CapsuleIDs()))
		}
		if r.Grader != family.DefaultGrader || r.StripRule != family.DefaultStripRule {
			t.Errorf("row graded by %s / %s", r.Grader, r.StripRule)
		}
	}
}

func nodeByID(nodes []*node.Node, id string) *node.Node {
	for _, n := range nodes {
		if n.ID().String() == id {
			return n
		}
	}
	return nil
}

func newHost(t *testing.T) (host.Host, crypto.PrivKey) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	h, err := libp2p.New(libp2p.Identity(k), libp2p.NoListenAddrs)
	if err != nil {
		t.Fatal(err)
	}
	return h, k
}

func sendReport(ctx context.Context, t *testing.T, h host.Host, to peer.ID, r *proto.Report, key crypto.PrivKey) *proto.ReportAck {
	t.Helper()
	env, err := proto.SealReport(r, key)
	if err != nil {
		t.Fatal(err)
	}
	s, err := h.NewStream(ctx, to, proto.ReportProtocol)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := proto.WriteFrame(s, env); err != nil {
		t.Fatal(err)
	}
	var ack proto.ReportAck
	if err := proto.ReadMsg(s, &ack, proto.MaxControlSize); err != nil {
		t.Fatal(err)
	}
	return &ack
}

func waitFor(ctx context.Context, t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
