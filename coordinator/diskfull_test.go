package coordinator

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/internal/badgerds"
	"github.com/repronet/repronet/internal/diskguard"
	"github.com/repronet/repronet/internal/diskguard/diskguardtest"
	"github.com/repronet/repronet/proto"
)

// TestIngestFullDisk: a coordinator on a real filesystem (a tmpfs) that
// runs out of room acknowledges no report it has not written, in both
// ways the disk can be full:
//
//   - below the reserve: the report is answered retry before anything
//     changes, and an evaluation is refused;
//   - above it, but without room for this report: the report is taken in
//     memory, its batch is refused, and it is answered retry; sent again
//     while the disk is full, retry again; once space returns the journal
//     writes it by itself, and the same report is then acknowledged as a
//     duplicate, counted once, and on disk.
func TestIngestFullDisk(t *testing.T) {
	dir := diskguardtest.SmallFS(t, badgerds.DefaultReserve+64<<20)
	ctx := context.Background()
	c := openTest(t, dir)
	defer func() { c.Close() }()
	atts := evaluate(t, c, Evaluation{ID: "ev-full"})
	n := newTestNode(t)
	a, b := atts[0].ID, atts[1].ID
	assign(t, c, a, n)
	assign(t, c, b, n)
	stateOf := func(id string) AttemptState { return state(t, c, id).State }

	// The reports are sealed (their outputs stored) while there is room.
	first := seal(t, c, n, a, proto.Outcome_OUTCOME_OK, `{}`)
	big := sealWith(t, c, n, b, func(r *proto.Report) { r.StdoutTail = []byte(strings.Repeat("x", 1<<20)) })

	// Below the reserve.
	ballast := diskguardtest.Fill(t, dir, 0)
	ack := c.Ingest(ctx, first)
	if !ack.GetRetry() || ack.GetAccepted() || !strings.Contains(ack.GetError(), "disk full") || stateOf(a) != StateAssigned {
		t.Fatalf("report on a full disk: %v, attempt %s; want retry, nothing changed", ack, stateOf(a))
	}
	if _, _, err := c.Evaluate(ctx, Evaluation{ID: "ev-2", Suite: testSuite, Agent: "oracle", Levels: []string{"easy"}}); !diskguard.IsFull(err) {
		t.Fatalf("evaluation on a full disk: %v", err)
	}
	if !c.diskFull() {
		t.Fatal("the coordinator does not say its disk is full")
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if ack := c.Ingest(ctx, first); !ack.GetAccepted() || ack.GetDuplicate() {
		t.Fatalf("report after space returned: %v", ack)
	}

	// Above the reserve, without room for a 1 MiB report.
	ballast = diskguardtest.Fill(t, dir, badgerds.DefaultReserve+256<<10)
	if ack := c.Ingest(ctx, big); !ack.GetRetry() || ack.GetAccepted() {
		t.Fatalf("a report with no room for it: %v, want retry", ack)
	}
	if ack := c.Ingest(ctx, big); !ack.GetRetry() {
		t.Fatalf("the same report again while full: %v, want retry", ack)
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for c.journal.Blocked() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the journal still holds its changes after space returned: %v", c.journal.Blocked())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ack := c.Ingest(ctx, big); !ack.GetAccepted() || !ack.GetDuplicate() {
		t.Fatalf("the report once written: %v, want accepted as a duplicate", ack)
	}
	if r := record(c, n.id.String()); r.Completed != 2 || r.LateReports != 0 {
		t.Fatalf("node record %+v: want each report counted once", r)
	}

	// On disk.
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = openTest(t, dir)
	settle(t, c)
	for _, id := range []string{a, b} {
		if _, signer, err := c.Report(ctx, id); err != nil || signer != n.id || stateOf(id) != StateDone {
			t.Fatalf("after a restart, attempt %s is %s, report signer %s, err %v", id, stateOf(id), signer, err)
		}
	}
}

// TestFullDiskChargesNoLease, as found live: while the coordinator's disk
// is full an honest node that finished its work retries its report (each
// answered "retry") and renews nothing. Far past the lease's TTL nothing
// is charged to it: no lease is lost while the coordinator cannot write,
// and once space returns its report counts, with its allowance and
// cross-check record untouched.
func TestFullDiskChargesNoLease(t *testing.T) {
	dir := diskguardtest.SmallFS(t, badgerds.DefaultReserve+64<<20)
	ctx := context.Background()
	const ttl = time.Second
	c := openTestWith(t, dir, func(cfg *Config) {
		cfg.LeaseTTL = ttl
		cfg.ScheduleInterval = 50 * time.Millisecond
	})
	defer func() { c.Close() }()
	atts := evaluate(t, c, Evaluation{ID: "ev-full-lease"})
	n := newTestNode(t)
	a := atts[0].ID
	assign(t, c, a, n)
	env := seal(t, c, n, a, proto.Outcome_OUTCOME_OK, `{}`)
	allowance := c.cfg.Allowance.Limit(record(c, n.id.String()).Allowance, time.Now())

	ballast := diskguardtest.Fill(t, dir, 0)
	for end := time.Now().Add(4 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) {
		if ack := c.Ingest(ctx, env); !ack.GetRetry() || ack.GetAccepted() {
			t.Fatalf("report on a full disk: %v; want retry", ack)
		}
		if st := state(t, c, a); st.State != StateAssigned || st.LeaseLosses != 0 {
			t.Fatalf("while the disk is full the attempt is %s with %d lost leases (%q)", st.State, st.LeaseLosses, st.Detail)
		}
	}
	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if ack := c.Ingest(ctx, env); !ack.GetAccepted() || ack.GetLate() {
		t.Fatalf("report once space returned: %v", ack)
	}
	rec := record(c, n.id.String())
	if rec.LeaseLost != 0 || c.cfg.Allowance.Limit(rec.Allowance, time.Now()) < allowance {
		t.Fatalf("node record after the coordinator's full disk: %+v (allowance was %d); want nothing charged", rec, allowance)
	}
	c.mu.Lock()
	bn := c.state.Book.Nodes[n.id.String()]
	c.mu.Unlock()
	if bn != nil && bn.MissedDeadlines != 0 {
		t.Fatalf("cross-check record: %d missed deadlines", bn.MissedDeadlines)
	}
	if st := state(t, c, a); st.ReportedBy != n.id.String() || st.LeaseLosses != 0 {
		t.Fatalf("attempt after: reported by %q, %d lost leases", st.ReportedBy, st.LeaseLosses)
	}
}
