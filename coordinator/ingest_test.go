package coordinator

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox/ociimage"
)

const testSuite = "sample"

func testLog(t testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
}

// openTest starts a coordinator on dir (no nodes) with the sample suite
// imported; the agent image is a stand-in (nothing runs it).
func openTest(t testing.TB, dir string) *Coordinator { return openTestWith(t, dir, nil) }

// openTestWith is openTest with the configuration changed by edit first.
func openTestWith(t testing.TB, dir string, edit func(*Config)) *Coordinator {
	t.Helper()
	ctx := context.Background()
	cfg := Config{DataDir: dir, Logger: testLog(t), LeaseTTL: time.Minute, ScheduleInterval: time.Hour,
		Families: families.Registry(), Checker: families.Checker()}
	if edit != nil {
		edit(&cfg)
	}
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if c.HasSuite(testSuite) {
		return c
	}
	def, err := family.Def(testSuite, sample.Tasks(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportSuite(ctx, def); err != nil {
		t.Fatal(err)
	}
	for _, id := range sample.CapsuleIDs() {
		tb, err := sample.CapsuleTarball(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.AddCapsule(ctx, id, bytes.NewReader(tb)); err != nil {
			t.Fatal(err)
		}
	}
	// A real image (pushes are checked as a node imports them), never run.
	var img bytes.Buffer
	if _, err := ociimage.Build(&img, "repronet.local/agents/oracle:test", []ociimage.File{{Path: "/agent/run", Mode: 0o755,
		Data: []byte("#!/bin/sh\n")}}, ociimage.Config{Entrypoint: []string{"/agent/run"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddAgent(ctx, "oracle", &img); err != nil {
		t.Fatal(err)
	}
	return c
}

type testNode struct {
	key crypto.PrivKey
	id  peer.ID
}

func newTestNode(t testing.TB) testNode {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return testNode{k, id}
}

// assign places queued attempt id on node n as a scheduling round would
// (core.Place) and has n accept it, durably. The test nodes have no host:
// the offer itself is never made.
func assign(t testing.TB, c *Coordinator, id string, n testNode) {
	t.Helper()
	node := n.id.String()
	c.mu.Lock()
	fx, _ := c.stepLocked(core.Place{Attempt: id, Node: node})
	if err, ok := fx.Reply.(error); ok {
		c.mu.Unlock()
		t.Fatalf("assign %s to %s: %v", id, node, err)
	}
	c.mu.Unlock()
	accept(t, c, id, n)
}

// accept has node n accept attempt id, placed on it, durably.
func accept(t testing.TB, c *Coordinator, id string, n testNode) {
	t.Helper()
	node := n.id.String()
	c.mu.Lock()
	inc := uint64(1)
	if v := c.state.Nodes[node]; v != nil {
		inc = v.Incarnation
	}
	_, tk := c.stepLocked(core.OfferAnswered{Attempt: id, Node: node, Accepted: true, Incarnation: inc})
	c.mu.Unlock()
	if err := c.durable(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
}

// expire loses the lease of attempt id the way nodes lose leases: its node
// announces a new process (which holds none of its predecessor's jobs), so
// every lease the node holds is lost. The announcement serves no
// coordinator: nothing is placed on it.
func expire(t testing.TB, c *Coordinator, id string) {
	t.Helper()
	c.mu.Lock()
	a := c.state.Attempts[id]
	seq, inc := uint64(1), uint64(2)
	if v := c.state.Nodes[a.Node]; v != nil {
		seq, inc = v.Seq+1, v.Incarnation+1
	}
	_, tk := c.stepLocked(core.Announced{Node: a.Node, Seq: seq, Incarnation: inc, Certified: a.Node, TotalSlots: 1, FreeSlots: 1})
	st := a.State
	c.mu.Unlock()
	if st != StateQueued {
		t.Fatalf("attempt %s is %s after its node restarted", id, st)
	}
	if err := c.durable(context.Background(), tk); err != nil {
		t.Fatal(err)
	}
}

// settle waits until every recorded report is scored.
func settle(t testing.TB, c *Coordinator) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for unscored(c) > 0 { // canaries too, which Progress leaves out
		if time.Now().After(deadline) {
			t.Fatalf("reports still unscored after 30 s: %d (progress %+v)", unscored(c), c.Progress())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// unscored counts the attempts, canaries included, whose reports wait
// for their scoring.
func unscored(c *Coordinator) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, a := range c.state.Attempts {
		if a.State == StateReported {
			n++
		}
	}
	return n
}

// quarantined reports whether the cross-check quarantined node n.
func quarantined(c *Coordinator, n string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.state.Book.Nodes[n]
	return r != nil && r.Quarantined
}

// state returns a copy of attempt id.
func state(t testing.TB, c *Coordinator, id string) Attempt {
	t.Helper()
	a, ok := c.Attempt(id)
	if !ok {
		t.Fatalf("no attempt %s", id)
	}
	return a
}

// record returns a copy of node n's record.
func record(c *Coordinator, n string) NodeRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r := c.state.Records[n]; r != nil {
		return *r
	}
	return NodeRecord{}
}

// seal signs a report with plausible evidence of execution (a report
// without any would be caught lying by the cross-check) whose report.json
// is report ("": not returned). The test nodes have no host: the file is
// put in the coordinator's own store, where fetching it finds it.
func seal(t testing.TB, c *Coordinator, n testNode, id string, outcome proto.Outcome, report string) []byte {
	t.Helper()
	const now = 1_700_000_000_000 // fixed: the same report sealed twice is the same report
	r := &proto.Report{AttemptId: id, NodePeerId: []byte(n.id), Outcome: outcome,
		StartedUnixMillis: now - 2000, FinishedUnixMillis: now,
		Usage: &proto.Usage{CpuSeconds: 0.5, WallMillis: 1500}}
	r.ImageCid, r.InputCids = inputsOf(t, c, id)
	r.Outputs = []*proto.OutputRef{storedOutput(t, c, "report.json", report)}
	env, err := proto.SealReport(r, n.key)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func evaluate(t testing.TB, c *Coordinator, e Evaluation) []Attempt {
	t.Helper()
	if e.Suite == "" {
		e.Suite, e.Agent, e.Levels = testSuite, "oracle", []string{"easy"}
	}
	id, _, err := c.Evaluate(context.Background(), e)
	if err != nil {
		t.Fatal(err)
	}
	var out []Attempt
	for _, a := range c.Attempts() {
		if a.Eval == id {
			out = append(out, a)
		}
	}
	return out
}

func TestIngest(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := openTest(t, dir)
	atts := evaluate(t, c, Evaluation{ID: "ev1"})
	n1, n2, stranger := newTestNode(t), newTestNode(t), newTestNode(t)

	a, b, x := atts[0].ID, atts[1].ID, atts[2].ID
	assign(t, c, b, n1)
	expire(t, c, b) // n1 restarted
	assign(t, c, a, n1)
	assign(t, c, x, n1)
	assign(t, c, b, n2) // b was reassigned: n1 is a past assignee

	steps := []struct {
		name    string
		env     []byte
		want    string // "accepted", "duplicate", "late", or an error substring
		stateOf string
		state   AttemptState
	}{
		{"report of the assigned node", seal(t, c, n1, a, proto.Outcome_OUTCOME_OK, `{}`), "accepted", a, StateDone},
		{"the same report again", seal(t, c, n1, a, proto.Outcome_OUTCOME_OK, `{}`), "duplicate", a, StateDone},
		{"a different report from the same node", seal(t, c, n1, a, proto.Outcome_OUTCOME_OK, `{"x":1}`), "already has a report of this attempt on record", a, StateDone},
		{"signed by a node never assigned", seal(t, c, stranger, a, proto.Outcome_OUTCOME_OK, `{}`), "signed by node " + stranger.id.String(), a, StateDone},
		{"unknown attempt", seal(t, c, n1, "at-nope", proto.Outcome_OUTCOME_OK, `{}`), "no attempt with this ID", a, StateDone},
		{"late report of a past assignee counts first", seal(t, c, n1, b, proto.Outcome_OUTCOME_OK, `{}`), "accepted", b, StateDone},
		{"the current assignee's report then is late", seal(t, c, n2, b, proto.Outcome_OUTCOME_OK, `{}`), "late", b, StateDone},
		{"infrastructure failure requeues", seal(t, c, n1, x, proto.Outcome_OUTCOME_INFRA_ERROR, ``), "accepted", x, StateQueued},
		{"garbage", []byte("zzz"), "report envelope", a, StateDone},
	}
	for _, s := range steps {
		ack := c.Ingest(ctx, s.env)
		var got string
		switch {
		case ack.GetDuplicate():
			got = "duplicate"
		case ack.GetLate():
			got = "late"
		case ack.GetAccepted():
			got = "accepted"
		default:
			got = ack.GetError()
		}
		if !strings.Contains(got, s.want) {
			t.Fatalf("%s: ack %q, want %q", s.name, got, s.want)
		}
		settle(t, c)
		if st := state(t, c, s.stateOf).State; st != s.state {
			t.Fatalf("%s: attempt state %s, want %s", s.name, st, s.state)
		}
	}
	ab := state(t, c, b)
	rec1, rec2 := record(c, n1.id.String()), record(c, n2.id.String())
	if ab.ReportedBy != n1.id.String() || len(ab.LateReports) != 1 || ab.LateReports[0].Node != n2.id.String() {
		t.Fatalf("attempt b: reported by %s, late %+v", ab.ReportedBy, ab.LateReports)
	}
	// x's infrastructure failure is on x, charged to n1 only once
	// another node runs x (core.chargeFailures).
	if rec1.Completed != 2 || rec1.LeaseLost != 1 || rec1.InfraErrors != 0 || rec1.LateReports != 0 || rec2.LateReports != 1 {
		t.Fatalf("node records: n1 %+v n2 %+v", rec1, rec2)
	}
	if ax := state(t, c, x); len(ax.Failures) != 1 || ax.Failures[0].Node != n1.id.String() || ax.Failures[0].Charged {
		t.Fatalf("x's failures %+v", ax.Failures)
	}
	if _, _, err := c.LateReport(ctx, b, ab.LateReports[0].Digest); err != nil {
		t.Fatalf("late report not stored: %v", err)
	}

	// After a restart everything is where it was, and ingest is still
	// idempotent.
	before := c.Attempts()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = openTest(t, dir)
	defer c.Close()
	after := c.Attempts()
	if len(after) != len(before) {
		t.Fatalf("%d attempts after restart, %d before", len(after), len(before))
	}
	for i := range before {
		if before[i].ID != after[i].ID || before[i].State != after[i].State || before[i].ReportDigest != after[i].ReportDigest {
			t.Fatalf("attempt %s: %s/%s before restart, %s/%s after", before[i].ID, before[i].State, before[i].ReportDigest,
				after[i].State, after[i].ReportDigest)
		}
	}
	if ack := c.Ingest(ctx, seal(t, c, n1, a, proto.Outcome_OUTCOME_OK, `{}`)); !ack.GetDuplicate() {
		t.Fatalf("after restart, the same report: %v", ack)
	}
	if _, signer, err := c.Report(ctx, a); err != nil || signer != n1.id {
		t.Fatalf("stored report after restart: signer %v err %v", signer, err)
	}
	c.mu.Lock()
	queued := slices.Contains(c.state.Queue, x)
	c.mu.Unlock()
	if !queued {
		t.Fatal("requeued attempt not in the queue after restart")
	}
}

func TestLateReportKeepsReplicasApart(t *testing.T) {
	ctx := context.Background()
	c := openTest(t, t.TempDir())
	defer c.Close()
	atts := evaluate(t, c, Evaluation{ID: "ev2", Replicas: 2})
	r0, r1 := atts[0], atts[1]
	if r0.Unit == "" || r0.Unit != r1.Unit {
		t.Fatalf("replicas of one run have units %q and %q", r0.Unit, r1.Unit)
	}
	n1, n2 := newTestNode(t), newTestNode(t)
	assign(t, c, r0.ID, n1)
	expire(t, c, r0.ID)
	assign(t, c, r1.ID, n1) // n1 is free of r0's unit now
	assign(t, c, r0.ID, n2)
	if ack := c.Ingest(ctx, seal(t, c, n1, r1.ID, proto.Outcome_OUTCOME_OK, `{}`)); !ack.GetAccepted() || ack.GetLate() {
		t.Fatalf("r1 on n1: %v", ack)
	}
	// n1's late report for r0 would put both replicas on n1: recorded, not counted.
	if ack := c.Ingest(ctx, seal(t, c, n1, r0.ID, proto.Outcome_OUTCOME_OK, `{}`)); !ack.GetLate() {
		t.Fatalf("late r0 on n1: %v", ack)
	}
	if ack := c.Ingest(ctx, seal(t, c, n2, r0.ID, proto.Outcome_OUTCOME_OK, `{}`)); !ack.GetAccepted() || ack.GetLate() {
		t.Fatalf("r0 on n2: %v", ack)
	}
}

func TestEvaluateIdempotent(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := openTest(t, dir)
	e := Evaluation{ID: "wave-1", Suite: testSuite, Agent: "oracle", Levels: []string{"easy", "hard"}, Replicas: 2}
	_, n, err := c.Evaluate(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	if want := 2 * 2 * len(sample.CapsuleIDs()); n != want {
		t.Fatalf("%d attempts, want %d", n, want)
	}
	c.Close()
	c = openTest(t, dir)
	defer c.Close()
	if _, n2, err := c.Evaluate(ctx, e); err != nil || n2 != n {
		t.Fatalf("second Evaluate after restart: %d, %v", n2, err)
	}
	if got := len(c.Attempts()); got != n {
		t.Fatalf("%d attempts after a repeated evaluation, want %d", got, n)
	}
	if _, _, err := c.Evaluate(ctx, Evaluation{ID: "wave-1", Suite: testSuite, Agent: "other", Levels: e.Levels}); err == nil {
		t.Fatal("an evaluation ID reused for another agent was accepted")
	}
}

// inputsOf are the capsule and agent CIDs attempt id was given (nil for an
// unknown attempt), as an honest node reports them.
// storedOutput puts an output's content in the coordinator's store and
// returns the reference a node's report would carry ("": not returned).
func storedOutput(t testing.TB, c *Coordinator, path, content string) *proto.OutputRef {
	t.Helper()
	if content == "" {
		return &proto.OutputRef{Path: path, Error: "missing"}
	}
	info, err := c.store.Add(context.Background(), strings.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	return &proto.OutputRef{Path: path, Cid: info.CID.Bytes(), Size: uint64(info.Size)}
}

func inputsOf(t testing.TB, c *Coordinator, id string) (image []byte, inputs [][]byte) {
	t.Helper()
	if _, ok := c.Attempt(id); !ok {
		return nil, nil
	}
	asg, err := c.assignment(id)
	if err != nil {
		t.Fatal(err)
	}
	for _, in := range asg.GetRecipe().GetInputs() {
		inputs = append(inputs, in.GetCid())
	}
	return asg.GetRecipe().GetImageCid(), inputs
}
