package node

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-datastore/query"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
)

func TestFillReport(t *testing.T) {
	r := &proto.Report{}
	fillReport(r, attemptResult{
		run: sandbox.Result{Outcome: sandbox.OutcomeDiskQuota, ExitCode: 1, CPUSeconds: 1.5, PeakMemoryBytes: 7, PeakPids: 12,
			DiskUsedBytes: 33 << 20, DiskFull: true, Detail: "full"},
		outputs: []*proto.OutputRef{{Path: "report.json", Error: "missing"}},
	})
	u := r.GetUsage()
	if r.GetOutcome() != proto.Outcome_OUTCOME_DISK_QUOTA || r.GetExitCode() != 1 || u.GetPeakPids() != 12 ||
		u.GetDiskUsedBytes() != 33<<20 || u.GetCpuSeconds() != 1.5 || len(r.GetOutputs()) != 1 || r.GetDetail() != "full" {
		t.Fatalf("report %v", r)
	}
}

// bigReport is a report over the envelope limit: two 3 MiB log tails
// (outputs travel by CID: the tails are all that can be large).
func bigReport() *proto.Report {
	return &proto.Report{AttemptId: "a1", Outcome: proto.Outcome_OUTCOME_OK,
		StdoutTail: bytes.Repeat([]byte("o"), 3<<20), StderrTail: bytes.Repeat([]byte("e"), 3<<20)}
}

func TestFitReport(t *testing.T) {
	for _, excess := range []int{1000, 3 << 20, 5 << 20} {
		r := bigReport()
		before := len(mustMarshal(t, r))
		if !fitReport(r, excess) {
			t.Fatalf("excess %d: could not shrink", excess)
		}
		if after := len(mustMarshal(t, r)); before-after < excess {
			t.Fatalf("excess %d: shrunk by %d", excess, before-after)
		}
		if len(r.StdoutTail) > 0 && !bytes.HasSuffix(bigReport().StdoutTail, r.StdoutTail) ||
			len(r.StderrTail) > 0 && !bytes.HasSuffix(bigReport().StderrTail, r.StderrTail) {
			t.Fatalf("excess %d: the tails kept are not the last bytes", excess)
		}
		if excess < 3<<20 && len(r.StdoutTail) != 3<<20 {
			t.Fatalf("excess %d: stdout cut before stderr was gone", excess)
		}
		if !strings.Contains(r.Detail, "log tails cut") {
			t.Fatalf("excess %d: detail %q", excess, r.Detail)
		}
	}
	if r := bigReport(); !fitReport(r, 0) || r.Detail != "" || len(r.StdoutTail) != 3<<20 {
		t.Fatal("a report that fits was changed")
	}
	if fitReport(&proto.Report{AttemptId: "a1", Detail: strings.Repeat("d", 1000)}, 100) {
		t.Fatal("a report with nothing to drop claims to have shrunk")
	}
}

func mustMarshal(t *testing.T, r *proto.Report) []byte {
	t.Helper()
	b, err := gproto.MarshalOptions{Deterministic: true}.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestOversizedReportFitsItsEnvelope: a report too large for the envelope
// limit is stored shrunk, never as one the coordinator would refuse unread.
func TestOversizedReportFitsItsEnvelope(t *testing.T) {
	n, coords := newTestNode(t, 1, nil)
	ctx := context.Background()
	r := bigReport()
	r.NodePeerId = []byte(n.ID())
	if err := n.enqueueReport(ctx, coords[0], r); err != nil {
		t.Fatal(err)
	}
	res, err := n.outbox.Query(ctx, query.Query{})
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := res.Rest()
	if len(entries) != 1 {
		t.Fatalf("%d outbox entries", len(entries))
	}
	var ob outboxEntry
	if err := json.Unmarshal(entries[0].Value, &ob); err != nil {
		t.Fatal(err)
	}
	if len(ob.Envelope) > proto.MaxReportEnvelopeSize {
		t.Fatalf("sealed report of %d bytes, over %d", len(ob.Envelope), proto.MaxReportEnvelopeSize)
	}
	r, signer, err := proto.OpenReport(ob.Envelope)
	if err != nil || signer != n.ID() {
		t.Fatalf("open: %v (signer %s)", err, signer)
	}
	if len(r.GetStdoutTail())+len(r.GetStderrTail()) == 0 || !strings.Contains(r.GetDetail(), "log tails cut") {
		t.Fatalf("tails of %d and %d bytes, detail %q", len(r.GetStdoutTail()), len(r.GetStderrTail()), r.GetDetail())
	}
	t.Logf("sealed %d bytes: %s", len(ob.Envelope), r.GetDetail())
}

// TestWallMillis: a run's wall time is reported in whole milliseconds
// rounded up, so a run that took any time at all never reports 0 ms (the
// cross-check takes a run of no time for a lie).
func TestWallMillis(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want int64
	}{{0, 0}, {-time.Second, 0}, {time.Nanosecond, 1}, {999 * time.Microsecond, 1}, {time.Millisecond, 1},
		{time.Millisecond + 1, 2}, {1500 * time.Millisecond, 1500}} {
		if got := wallMillis(c.d); got != c.want {
			t.Errorf("wallMillis(%s) = %d, want %d", c.d, got, c.want)
		}
	}
}
