package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/proto"
)

// TestDrain: a draining node announces no free slot and declines new work
// as stopping (an attempt it already runs is still accepted again); at
// the grace's end what still runs is cancelled and handed back (here its
// coordinator cannot be reached, which the result says); Resume makes it
// take work again.
func TestDrain(t *testing.T) {
	n, coords := newTestNode(t, 2, nil)
	c1 := coords[0]
	// Its inputs cannot be fetched from anywhere: the attempt runs until cancelled.
	if code, reason := n.admit(c1, assignment(t, "a1")); code != proto.DeclineCode_DECLINE_UNSPECIFIED {
		t.Fatalf("admit: %s %s", code, reason)
	}
	done := make(chan DrainResult, 1)
	start := time.Now()
	const grace = 600 * time.Millisecond
	go func() { done <- n.Drain(context.Background(), grace) }()
	waitUntil(t, "draining", n.Draining)
	a := n.Announcement()
	if a.GetTotalSlots() != 1 || a.GetFreeSlots() != 0 {
		t.Fatalf("draining node announces %d free of %d, want 0 of 1 (what it runs)", a.GetFreeSlots(), a.GetTotalSlots())
	}
	if _, err := proto.NewAnnouncementGuard(n.cfg.Network).Check(a, n.ID(), time.Now()); err != nil {
		t.Fatalf("a draining node's announcement is refused: %v", err)
	}
	if code, reason := n.admit(c1, assignment(t, "a2")); code != proto.DeclineCode_DECLINE_STOPPING || !strings.Contains(reason, "draining") {
		t.Fatalf("new work while draining: %s %q", code, reason)
	}
	if code, _ := n.admit(c1, assignment(t, "a1")); code != proto.DeclineCode_DECLINE_UNSPECIFIED {
		t.Fatalf("the running attempt offered again: %s", code)
	}
	if st := n.Status(context.Background()); !st.Draining || st.TotalSlots != 2 || st.FreeSlots != 0 {
		t.Fatalf("status while draining: draining %v, %d free of %d", st.Draining, st.FreeSlots, st.TotalSlots)
	}
	rec := httptest.NewRecorder()
	n.MetricsHandler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	if m := rec.Body.String(); !strings.Contains(m, "repronet_node_draining 1") || !strings.Contains(m, `repronet_node_slots{state="free"} 0`) {
		t.Fatalf("metrics while draining lack repronet_node_draining 1 or free slots 0")
	}
	res := <-done
	if took := time.Since(start); took < grace || took > grace+15*time.Second {
		t.Fatalf("drain took %v with a grace of %v", took, grace)
	}
	if len(res.HandedBack) != 0 || !strings.Contains(res.NotHandedBack["a1"], "hand back a1") {
		t.Fatalf("result %+v: want a1 not handed back (its coordinator is unreachable)", res)
	}
	waitUntil(t, "the attempt cancelled", func() bool {
		n.mu.Lock()
		defer n.mu.Unlock()
		return len(n.running) == 0
	})
	if a := n.Announcement(); a.GetTotalSlots() != 0 || a.GetFreeSlots() != 0 {
		t.Fatalf("drained node announces %d free of %d", a.GetFreeSlots(), a.GetTotalSlots())
	}
	n.Resume()
	if a := n.Announcement(); a.GetTotalSlots() != 2 || a.GetFreeSlots() != 2 || n.Draining() {
		t.Fatalf("resumed node announces %d free of %d", a.GetFreeSlots(), a.GetTotalSlots())
	}
	if code, reason := n.admit(c1, assignment(t, "a3")); code != proto.DeclineCode_DECLINE_UNSPECIFIED {
		t.Fatalf("after Resume: %s %s", code, reason)
	}
}

// TestControlHandler: POST /drain drains (a bad grace is refused), POST
// /resume resumes, GET /status answers.
func TestControlHandler(t *testing.T) {
	n, _ := newTestNode(t, 1, nil)
	srv := httptest.NewServer(n.ControlHandler(time.Hour))
	defer srv.Close()
	post := func(path string) (*http.Response, []byte) {
		t.Helper()
		resp, err := http.Post(srv.URL+path, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, b
	}
	if resp, _ := post("/drain?grace=soon"); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("bad grace: %s", resp.Status)
	}
	resp, body := post("/drain?grace=0s")
	var res DrainResult
	if resp.StatusCode != http.StatusOK || json.Unmarshal(body, &res) != nil || !n.Draining() {
		t.Fatalf("drain: %s %s (draining %v)", resp.Status, body, n.Draining())
	}
	if resp, _ := post("/resume"); resp.StatusCode != http.StatusOK || n.Draining() {
		t.Fatalf("resume: %s (draining %v)", resp.Status, n.Draining())
	}
	if resp, err := http.Get(srv.URL + "/status"); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status: %v %v", resp, err)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 20 s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
