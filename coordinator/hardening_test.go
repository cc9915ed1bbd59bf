package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore/query"
	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/proto"
)

// sealWith signs a report made by seal and then changed by edit.
func sealWith(t testing.TB, c *Coordinator, n testNode, id string, edit func(*proto.Report)) []byte {
	t.Helper()
	const now = 1_700_000_000_000
	r := &proto.Report{AttemptId: id, NodePeerId: []byte(n.id), Outcome: proto.Outcome_OUTCOME_OK,
		StartedUnixMillis: now - 2000, FinishedUnixMillis: now,
		Usage: &proto.Usage{CpuSeconds: 0.5, WallMillis: 1500}}
	r.ImageCid, r.InputCids = inputsOf(t, c, id)
	r.Outputs = []*proto.OutputRef{storedOutput(t, c, "report.json", `{}`)}
	edit(r)
	env, err := proto.SealReport(r, n.key)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

// A report whose usage holds NaN or an infinity is refused at the
// boundary, naming the field: the attempt stays assigned, its record stays
// encodable (the admin API answers with JSON), and after a restart it is
// still assigned, not lost. Before ValidateReport the report was
// acknowledged, the attempt record could not be encoded, and the API
// answered 200 with an empty body.
func TestNonFiniteUsageRefused(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := openTest(t, dir)
	c.cfg.AdminToken = "secret"
	atts := evaluate(t, c, Evaluation{ID: "ev-nan"})
	n := newTestNode(t)
	id := atts[0].ID
	assign(t, c, id, n)
	for _, v := range []float64{math.NaN(), math.Inf(1), math.Inf(-1), -1} {
		ack := c.Ingest(ctx, sealWith(t, c, n, id, func(r *proto.Report) { r.Usage.CpuSeconds = v }))
		if ack.GetAccepted() || ack.GetRetry() || !strings.Contains(ack.GetError(), "usage.cpu_seconds") {
			t.Fatalf("cpu_seconds %v: ack %+v, want a refusal naming usage.cpu_seconds", v, ack)
		}
	}
	ack := c.Ingest(ctx, sealWith(t, c, n, id, func(r *proto.Report) { r.Usage.WallMillis = -5 }))
	if ack.GetAccepted() || !strings.Contains(ack.GetError(), "usage.wall_millis") {
		t.Fatalf("negative wall: ack %+v", ack)
	}
	if st := state(t, c, id).State; st != StateAssigned {
		t.Fatalf("after refused reports the attempt is %s, want assigned", st)
	}

	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	req, _ := http.NewRequest("GET", srv.URL+"/api/attempts", nil)
	req.Header.Set("Authorization", "Bearer secret")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list []Attempt
	err = json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	if want := len(c.Attempts()); resp.StatusCode != 200 || err != nil || len(list) != want {
		t.Fatalf("GET /api/attempts: status %d, %d attempts, err %v; want 200 with %d", resp.StatusCode, len(list), err, want)
	}

	// The honest report is then accepted and survives a restart.
	if ack := c.Ingest(ctx, seal(t, c, n, id, proto.Outcome_OUTCOME_OK, `{}`)); !ack.GetAccepted() {
		t.Fatalf("honest report: %+v", ack)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = openTest(t, dir)
	defer c.Close()
	settle(t, c)
	if st := state(t, c, id).State; st != StateDone {
		t.Fatalf("after restart the attempt is %s, want done", st)
	}
}

// A record that cannot be encoded fails the batch it should have joined:
// whoever waits on that batch gets the error, instead of an
// acknowledgement of something that was never written.
func TestUnencodableRecordFailsItsBatch(t *testing.T) {
	c := openTest(t, t.TempDir())
	defer c.Close()
	c.mu.Lock()
	good := c.write([]core.Record{{Key: "/state/test-good", Value: map[string]int{"x": 1}}})
	bad := c.write([]core.Record{{Key: "/state/test-bad", Value: map[string]float64{"x": math.NaN()}}})
	c.mu.Unlock()
	if good != bad {
		t.Fatal("two writes of one critical section landed in different batches")
	}
	err := bad.Wait(context.Background())
	if err == nil || !strings.Contains(err.Error(), "test-bad") {
		t.Fatalf("wait: %v, want the encoding error naming the record", err)
	}
	c.mu.Lock()
	next := c.write([]core.Record{{Key: "/state/test-next", Value: 1}})
	c.mu.Unlock()
	if err := next.Wait(context.Background()); err != nil {
		t.Fatalf("the next batch fails too: %v", err)
	}
}

// Work that every node in view declines ends, failed with outcome
// "declined" and what the nodes said, instead of staying queued forever
// (a live attack found suite limits every node declined, queued across
// restarts).
func TestWorkEveryNodeDeclinesFails(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) { cfg.ScheduleInterval = 50 * time.Millisecond })
	defer c.Close()
	const why = `limits.nameservers[0] "2001:db8::53": only IPv4 nameservers are supported`
	var nodes []*wireNode
	for range 2 {
		w := newWireNode(ctx, t, c, 2)
		w.decline = why
		w.announce(ctx)
		nodes = append(nodes, w)
	}
	atts := evaluate(t, c, Evaluation{ID: "ev-declined", Replicas: 1})
	waitUntil(ctx, t, "every attempt has failed", func() bool {
		for _, a := range c.Attempts() {
			if a.Eval == "ev-declined" && a.State != StateFailed {
				for _, w := range nodes {
					w.announce(ctx) // a declined node is held back until it announces again
				}
				return false
			}
		}
		return true
	})
	for _, a := range c.Attempts() {
		if a.Eval != "ev-declined" {
			continue
		}
		if a.Outcome != OutcomeDeclined || !strings.Contains(a.Detail, "only IPv4 nameservers") || len(a.Declines) != 2 {
			t.Fatalf("attempt %s: outcome %q, detail %q, %d declines; want %q naming the reason, declined by both nodes",
				a.ID, a.Outcome, a.Detail, len(a.Declines), OutcomeDeclined)
		}
	}
	if len(atts) == 0 {
		t.Fatal("no attempts")
	}
}

// A node that floods one finished attempt with distinct signed reports
// (found live: 300 reports of 1 MB, every one acknowledged as late and
// stored) gets each refused with the reason, and nothing of them is kept.
func TestLateReportFloodRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) { cfg.ScheduleInterval = 50 * time.Millisecond })
	defer c.Close()
	w := newWireNode(ctx, t, c, 1)
	w.announce(ctx)
	evaluate(t, c, Evaluation{ID: "ev-flood", Replicas: 1})
	waitUntil(ctx, t, "the node holds an attempt", func() bool { return len(w.held()) > 0 })
	a := w.held()[0]
	if ack := w.deliver(ctx, w.okReport(a, `{}`)); !ack.GetAccepted() || ack.GetLate() {
		t.Fatalf("first report: %+v", ack)
	}
	big := strings.Repeat("x", 1<<20-64)
	for i := range 100 {
		ack := w.deliver(ctx, w.okReport(a, fmt.Sprintf(`{"pad":"%s","n":%d}`, big, i)))
		if ack.GetAccepted() || ack.GetRetry() || !strings.Contains(ack.GetError(), "already has a report of this attempt") {
			t.Fatalf("flood report %d: %+v, want a refusal with the reason", i, ack)
		}
	}
	late := len(state(t, c, a.GetAttemptId()).LateReports)
	rec := record(c, w.id().String())
	if late != 0 || rec.LateReports != 0 || rec.LateBytes.Amount != 0 {
		t.Fatalf("after the flood: %d late reports kept, node record %+v; want none", late, rec)
	}
	res, err := c.ds.Query(ctx, query.Query{Prefix: core.LateKey, KeysOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	stored, _ := res.Rest()
	if len(stored) != 0 {
		t.Fatalf("%d late envelopes stored", len(stored))
	}
}

// Late reports are bounded per node by a byte budget that decays: an
// honest node's occasional late report is kept, a stream of them is
// refused once the budget is spent.
func TestLateReportBudgetPerNode(t *testing.T) {
	ctx := context.Background()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) { cfg.MaxLateBytes = 3 << 20 })
	defer c.Close()
	atts := evaluate(t, c, Evaluation{ID: "ev-budget", Runs: 3, Replicas: 1})
	slow, fast := newTestNode(t), newTestNode(t)
	pad := strings.Repeat("y", 1<<20)
	kept, refused := 0, 0
	for i, at := range atts {
		assign(t, c, at.ID, slow)
		expire(t, c, at.ID)
		assign(t, c, at.ID, fast)
		if ack := c.Ingest(ctx, seal(t, c, fast, at.ID, proto.Outcome_OUTCOME_OK, `{}`)); !ack.GetAccepted() {
			t.Fatalf("attempt %d: %+v", i, ack)
		}
		ack := c.Ingest(ctx, sealWith(t, c, slow, at.ID, func(r *proto.Report) { r.StdoutTail = []byte(pad) }))
		switch {
		case ack.GetLate():
			kept++
		case !ack.GetAccepted() && strings.Contains(ack.GetError(), "bytes of late reports on record"):
			refused++
		default:
			t.Fatalf("late report %d: %+v", i, ack)
		}
	}
	if kept != 2 || refused != len(atts)-2 {
		t.Fatalf("%d late reports kept and %d refused of %d; want 2 kept (3 MiB budget, 1 MiB each)", kept, refused, len(atts))
	}
	// The budget comes back with time.
	rec := record(c, slow.id.String())
	if v := rec.LateBytes.Value(time.Now().Add(3*c.cfg.HalfLife), c.cfg.HalfLife); v > float64(c.cfg.MaxLateBytes)/2 {
		t.Fatalf("budget after three half-lives: %.0f bytes still counted", v)
	}
}

// Hoarding, as found live: a node announces 1,000 slots, claims every
// capsule as cached, accepts everything, renews every lease and never
// reports. It holds no more than a new node's allowance, each lease ends
// at its attempt's limit however often it is renewed, and an honest node
// beside it does the work.
func TestHoarderBounded(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const wall = 2 * time.Second
	c := openTestWith(t, t.TempDir(), func(cfg *Config) {
		cfg.ScheduleInterval = 50 * time.Millisecond
		cfg.LeaseTTL = time.Second
		cfg.FetchAllowance, cfg.MinFetchRate, cfg.LeaseMargin = 500*time.Millisecond, 1<<40, 500*time.Millisecond
		cfg.Limits = &proto.Limits{CpuMillis: 1000, MemoryBytes: 4 << 30, WallSeconds: uint32(wall / time.Second)}
		cfg.IdleCanaryEvery = -1
	})
	defer c.Close()
	hoarder := newWireNode(ctx, t, c, 1000)
	for _, cp := range c.catalog.ContentList() {
		cc, _ := cid.Decode(cp.CID)
		hoarder.cached = append(hoarder.cached, cc.Bytes())
	}
	hoarder.announce(ctx)
	hoarder.announceEvery(ctx, time.Second)
	// It renews every lease it ever got, every 200 ms, and remembers
	// when each was last renewed.
	lastRenewed := map[string]time.Time{}
	var renewMu sync.Mutex
	go func() {
		for ctx.Err() == nil {
			for _, a := range hoarder.held() {
				if ack := hoarder.renew(ctx, a.GetAttemptId()); ack.GetOk() {
					renewMu.Lock()
					lastRenewed[a.GetAttemptId()] = time.Now()
					renewMu.Unlock()
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
	}()

	atts := evaluate(t, c, Evaluation{ID: "ev-hoard", Runs: 5, Replicas: 1})
	// Until the honest node comes, only the hoarder is there.
	maxHeld := 0
	sample := func() {
		c.mu.Lock()
		maxHeld = max(maxHeld, c.state.Leases.HeldBy(hoarder.id().String()))
		c.mu.Unlock()
	}
	for end := time.Now().Add(3 * wall); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		sample()
	}
	honest := newWireNode(ctx, t, c, 2)
	honest.report = func(a *proto.Assignment) *proto.Report { return honest.okReport(a, `{}`) }
	honest.announce(ctx)
	honest.announceEvery(ctx, time.Second)
	waitUntil(ctx, t, "every attempt is done", func() bool {
		sample()
		done := 0
		for _, a := range c.Attempts() {
			if a.Eval == "ev-hoard" && a.State == StateDone {
				done++
			}
		}
		return done == len(atts)
	})
	if want := c.cfg.Allowance.Initial; maxHeld > want {
		t.Fatalf("the hoarder held %d leases at once; a new node may hold %d", maxHeld, want)
	}
	// Every lease the hoarder got ended at its limit: it was never renewed
	// past assignment + fetch allowance + wall limit + margin.
	limit := c.cfg.FetchAllowance + wall + c.cfg.LeaseMargin
	for _, a := range c.Attempts() {
		for _, as := range a.Assignees {
			if as.Node != hoarder.id().String() {
				continue
			}
			renewMu.Lock()
			last, ok := lastRenewed[a.ID]
			renewMu.Unlock()
			if ok && last.Sub(as.At) > limit {
				t.Fatalf("attempt %s: renewed %v after it was given to the hoarder, past its limit %v", a.ID, last.Sub(as.At), limit)
			}
		}
		if a.Eval == "ev-hoard" && a.ReportedBy != honest.id().String() {
			t.Fatalf("attempt %s reported by %s, not the honest node", a.ID, a.ReportedBy)
		}
	}
	rec := record(c, hoarder.id().String())
	if rec.LeaseLost == 0 || c.cfg.Allowance.Limit(rec.Allowance, time.Now()) != 1 {
		t.Fatalf("hoarder's record after losing its leases: %+v", rec)
	}
	if quarantined(c, hoarder.id().String()) {
		t.Fatal("the hoarder was quarantined as a liar; it only hoarded")
	}
	t.Logf("hoarder held at most %d leases; %d leases lost", maxHeld, rec.LeaseLost)
}

// A node that reports an infrastructure failure for everything it is
// given, while another node runs the same jobs, loses work (each failure
// is charged once another node ran the job: its allowance halves, and
// after five in a row it cools down) without being taken for a liar.
func TestInfraFailuresLoseWork(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) {
		cfg.ScheduleInterval = 50 * time.Millisecond
		cfg.IdleCanaryEvery = -1
		cfg.MaxTries = 100
	})
	defer c.Close()
	broken := newWireNode(ctx, t, c, 8)
	broken.report = func(a *proto.Assignment) *proto.Report {
		r := broken.okReport(a, ``)
		r.Outcome, r.Detail = proto.Outcome_OUTCOME_INFRA_ERROR, "disk on fire"
		return r
	}
	broken.announce(ctx)
	broken.announceEvery(ctx, time.Second)
	honest := newWireNode(ctx, t, c, 2)
	honest.report = func(a *proto.Assignment) *proto.Report { return honest.okReport(a, `{}`) }
	honest.announce(ctx)
	honest.announceEvery(ctx, time.Second)
	evaluate(t, c, Evaluation{ID: "ev-infra", Runs: 10, Replicas: 1})
	waitUntil(ctx, t, "the node is cooling down", func() bool {
		r := record(c, broken.id().String())
		return r.ID != "" && c.cfg.Allowance.Limit(r.Allowance, time.Now()) == 0
	})
	// An offer made before the charge that cooled it may still land.
	time.Sleep(time.Second)
	got := len(broken.held())
	time.Sleep(3 * time.Second) // cooling: nothing more is given to it
	if later := len(broken.held()); later != got {
		t.Fatalf("while cooling down the node got %d more attempts", later-got)
	}
	rec := record(c, broken.id().String())
	// Charges wait for another node to run the job, so how many attempts
	// the broken node takes before it cools down depends on how fast the
	// honest node runs them (a job's own fault must never cool a
	// volunteer down): what holds is that it was charged, cooled, and
	// never took all the work.
	if rec.InfraErrors < c.cfg.Allowance.CoolAfter || got >= 30 {
		t.Fatalf("%d infrastructure failures reported, %d attempts given; want at least %d failures and few attempts",
			rec.InfraErrors, got, c.cfg.Allowance.CoolAfter)
	}
	if quarantined(c, broken.id().String()) {
		t.Fatal("a node with infrastructure trouble was quarantined")
	}
	if r := record(c, honest.id().String()); r.InfraErrors != 0 {
		t.Fatalf("the node that ran the jobs was charged %d infrastructure failures", r.InfraErrors)
	}
}

// Sybil operators, as found live: one person makes several operator
// keys, certifies a node with each, and so gets every replica of a unit.
// Only admitted operators count apart; every other node counts as one
// operator, UnadmittedOperator, so such nodes hold one replica of a unit
// between them. A join token admits an operator; a wrong, used-up or
// expired token admits nobody, and tokens are stored hashed.
func TestSybilOperators(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const standing = "standing-token-for-the-consortium"
	c := openTestWith(t, t.TempDir(), func(cfg *Config) {
		cfg.ScheduleInterval = 50 * time.Millisecond
		cfg.IdleCanaryEvery = -1
		cfg.JoinTokens = []string{standing}
	})
	defer c.Close()
	var sybils []*wireNode
	for range 3 {
		w := newWireNode(ctx, t, c, 4)
		opKey, _, _ := crypto.GenerateEd25519Key(nil)
		w.withOperator(opKey)
		w.report = func(a *proto.Assignment) *proto.Report { return w.okReport(a, `{}`) }
		w.announce(ctx)
		w.announceEvery(ctx, time.Second)
		sybils = append(sybils, w)
	}
	for _, n := range c.Nodes() {
		if n.Operator != UnadmittedOperator {
			t.Fatalf("node %s with a self-made certificate counts as operator %q", n.ID, n.Operator)
		}
	}
	atts := evaluate(t, c, Evaluation{ID: "ev-sybil", Replicas: 2})
	units := map[string]bool{}
	for _, a := range atts {
		units[a.Unit] = true
	}
	held := func() int {
		n := 0
		for _, w := range sybils {
			n += len(w.held())
		}
		return n
	}
	waitUntil(ctx, t, "one replica of each unit is placed", func() bool { return held() >= len(units) })
	time.Sleep(time.Second) // the other replicas have nowhere to go
	if got := held(); got != len(units) {
		t.Fatalf("the sybil nodes hold %d replicas of %d units; want one per unit", got, len(units))
	}

	// Tokens: a wrong one admits nobody; the standing one admits the
	// node's operator, once, and again uses nothing.
	if resp := sybils[0].join(ctx, "not-the-token-at-all"); resp.GetAdmitted() || !strings.Contains(resp.GetReason(), "unknown join token") {
		t.Fatalf("wrong token: %+v", resp)
	}
	resp := sybils[0].join(ctx, standing)
	if !resp.GetAdmitted() || resp.GetOperator() == "" {
		t.Fatalf("standing token: %+v", resp)
	}
	sybils[0].announceOnce(ctx)
	waitUntil(ctx, t, "the admitted operator's node takes the second replicas", func() bool { return held() == len(atts) })

	oneUse, err := c.NewJoinToken(ctx, "lab-b", 1, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if r := sybils[1].join(ctx, oneUse); !r.GetAdmitted() {
		t.Fatalf("one-use token, first use: %+v", r)
	}
	if r := sybils[1].join(ctx, oneUse); !r.GetAdmitted() {
		t.Fatalf("the same operator again: %+v", r)
	}
	if r := sybils[2].join(ctx, oneUse); r.GetAdmitted() || !strings.Contains(r.GetReason(), "no uses left") {
		t.Fatalf("one-use token, second operator: %+v", r)
	}
	expired, err := c.NewJoinToken(ctx, "old", 0, time.Now().Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if r := sybils[2].join(ctx, expired); r.GetAdmitted() || !strings.Contains(r.GetReason(), "expired") {
		t.Fatalf("expired token: %+v", r)
	}
	// Only hashes are stored.
	res, err := c.ds.Query(ctx, query.Query{Prefix: stateKey.String()})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := res.Rest()
	for _, e := range all {
		for _, tok := range []string{standing, oneUse, expired} {
			if bytes.Contains(e.Value, []byte(tok)) {
				t.Fatalf("record %s holds a join token in the clear", e.Key)
			}
		}
	}
	if ops := c.Operators(); len(ops) != 2 {
		t.Fatalf("admitted operators: %+v, want 2", ops)
	}
}
