package node

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/repronet/repronet/proto"
)

// TestStatus: the volunteer's status shows the attempts running with
// their phase, elapsed time and limits, its slots and cache, and the
// credit of the reports its coordinators accepted, which a restart keeps.
func TestStatus(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	n, coords := newTestNode(t, 2, func(c *Config) { c.DataDir = dir })
	var ph phase
	ph.set("running")
	asg := &proto.Assignment{AttemptId: "at-1", Suite: "sample", Group: "lab-a", Recipe: &proto.Recipe{
		Limits: &proto.Limits{CpuMillis: 1000, MemoryBytes: 4 << 30, WallSeconds: 2700, Network: "egress", Allow: []string{"tcp:10.0.0.0/8:443"}}}}
	untrack := n.track(coords[0], asg, &ph)
	for range 2 {
		env, err := proto.SealReport(&proto.Report{AttemptId: "at-1", NodePeerId: []byte(n.host.ID()), Outcome: proto.Outcome_OUTCOME_OK,
			Usage: &proto.Usage{CpuSeconds: 1800, WallMillis: 3_600_000}}, n.key)
		if err != nil {
			t.Fatal(err)
		}
		n.credit(ctx, env)
	}
	n.credit(ctx, []byte("not an envelope")) // ignored
	st := n.Status(ctx)
	if len(st.Running) != 1 {
		t.Fatalf("running %+v", st.Running)
	}
	r := st.Running[0]
	if r.Attempt != "at-1" || r.Phase != "running" || r.Group != "lab-a" || r.WallSeconds != 2700 || r.Network != "egress" || len(r.Allow) != 1 ||
		r.Elapsed < 0 || r.Coordinator != coords[0].String() {
		t.Fatalf("running attempt %+v", r)
	}
	if st.TotalSlots != 2 || st.Credit.Reports != 2 || st.Credit.CPUHours != 1 || st.Credit.WallSeconds != 7200 || len(st.Coordinators) != 2 {
		t.Fatalf("status %+v", st)
	}
	rec := httptest.NewRecorder()
	n.StatusHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	var got Status
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || got.Credit.Reports != 2 {
		t.Fatalf("/status: %v %s", err, rec.Body)
	}
	rec = httptest.NewRecorder()
	n.StatusPage().ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if page := rec.Body.String(); !strings.Contains(page, "1.0000 CPU-hours") || !strings.Contains(page, "at-1") ||
		!strings.Contains(page, "of 2700 s") {
		t.Fatalf("status page: %s", page)
	}
	untrack()
	if st := n.Status(ctx); len(st.Running) != 0 {
		t.Fatalf("running after the attempt ended: %+v", st.Running)
	}
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	n2, _ := newTestNode(t, 2, func(c *Config) { c.DataDir = dir })
	if c := n2.Status(ctx).Credit; c.Reports != 2 || c.CPUHours != 1 {
		t.Fatalf("credit after a restart: %+v", c)
	}
}
