package node

import (
	"context"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/proto"
)

// TestMetrics: the node's metrics show its slots, attempts finished by
// outcome, the reports waiting in its outbox, its cache, and the libp2p
// host's and Go's own metrics.
func TestMetrics(t *testing.T) {
	n, coords := newTestNode(t, 3, nil)
	n.mu.Lock()
	n.running[runKey{coords[0], "x1"}] = func() {}
	n.running[runKey{coords[1], "x2"}] = func() {}
	for i := range 4 {
		c, _ := cid.Cast(testCID(t, fmt.Sprint(i)))
		n.cached[c.String()] = time.Now()
	}
	n.finished[proto.Outcome_OUTCOME_OK] = 2
	n.finished[proto.Outcome_OUTCOME_TIMEOUT] = 1
	n.mu.Unlock()
	// A report its coordinator (unreachable here) never acknowledges.
	report := &proto.Report{AttemptId: "at-1", Outcome: proto.Outcome_OUTCOME_OK}
	if err := n.enqueueReport(context.Background(), coords[0], report); err != nil {
		t.Fatal(err)
	}

	rec := httptest.NewRecorder()
	n.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if rec.Code != 200 {
		t.Fatalf("metrics: %d", rec.Code)
	}
	for _, want := range []string{
		`repronet_node_slots{state="total"} 3`,
		`repronet_node_slots{state="free"} 1`,
		`repronet_node_attempts_finished_total{outcome="OUTCOME_OK"} 2`,
		`repronet_node_attempts_finished_total{outcome="OUTCOME_TIMEOUT"} 1`,
		`repronet_node_outbox_reports 1`,
		`repronet_node_capsules_cached 4`,
		`repronet_node_capsule_cache_bytes{kind="used"}`,
		`repronet_node_coordinators_connected 0`,
		`repronet_node_draining 0`,
		"go_goroutines",
		"libp2p_",
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
