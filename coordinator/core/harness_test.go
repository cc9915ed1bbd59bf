package core

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/schedule"
	"github.com/repronet/repronet/proto"
)

// The core is tested as etcd's raft is: a State, a scripted sequence of
// events at chosen times, and the effects checked, with no network,
// storage or clock. harness plays the shell: it keeps the records the
// core asks to make durable (as JSON, as the journal would), so that a
// restart can be replayed from them.

const self = "coord"

// testSuite is a family's suite reduced to what the core reads: tasks,
// variants and pipelines (Recipe, Score and Boards belong to the shell).
type testSuite struct {
	tasks  []bench.Task
	stages []bench.Stage
}

func (s testSuite) Tasks() []bench.Task                       { return s.tasks }
func (s testSuite) Variants() []string                        { return []string{"easy", "hard"} }
func (s testSuite) Scorer() string                            { return "test@1" }
func (s testSuite) Scoring() json.RawMessage                  { return json.RawMessage(`{"scorer":"test@1"}`) }
func (s testSuite) Pipeline(bench.Task, string) []bench.Stage { return s.stages }
func (s testSuite) Recipe(bench.RecipeInput) (*proto.Recipe, error) {
	return nil, fmt.Errorf("not in the core")
}
func (s testSuite) Score(context.Context, bench.ScoreInput) (bench.Score, error) {
	return bench.Score{}, fmt.Errorf("not in the core")
}
func (s testSuite) Boards([]bench.Entry) ([]any, error) { return nil, nil }

// testCatalog is a Catalog over maps.
type testCatalog struct {
	suites  map[string]SuiteInfo
	agents  map[string]AgentInfo
	content map[string]ContentInfo
}

func (c testCatalog) LookupSuite(n string) (SuiteInfo, bool)     { s, ok := c.suites[n]; return s, ok }
func (c testCatalog) LookupAgent(n string) (AgentInfo, bool)     { a, ok := c.agents[n]; return a, ok }
func (c testCatalog) LookupContent(n string) (ContentInfo, bool) { x, ok := c.content[n]; return x, ok }

func newCatalog() testCatalog {
	c := testCatalog{suites: map[string]SuiteInfo{}, agents: map[string]AgentInfo{
		"agent":  {CID: "bafyagent", Size: 1 << 20},
		"det":    {CID: "bafydet", Size: 1 << 20, Deterministic: true},
		"plain":  {CID: "bafyplain", Size: 1 << 20},
		"judger": {CID: "bafyjudger", Size: 1 << 20},
	}, content: map[string]ContentInfo{
		"cap-1": {CID: "bafycap1", Size: 10 << 20},
		"cap-2": {CID: "bafycap2", Size: 10 << 20},
	}}
	c.add("one", testSuite{tasks: []bench.Task{{ID: "t1", Content: []string{"cap-1"}}},
		stages: []bench.Stage{{Name: "solve"}}})
	c.add("two", testSuite{tasks: []bench.Task{{ID: "t1", Content: []string{"cap-1"}}, {ID: "t2", Content: []string{"cap-2"}}},
		stages: []bench.Stage{{Name: "solve"}}})
	c.add("piped", testSuite{tasks: []bench.Task{{ID: "t1", Content: []string{"cap-1"}}},
		stages: []bench.Stage{{Name: "rollout", Single: true}, {Name: "reproduce", Image: "plain", ApartFrom: []string{"rollout"}},
			{Name: "judge", Image: "judger"}}})
	c.add("gpu", testSuite{tasks: []bench.Task{{ID: "t1", Content: []string{"cap-1"}, GPUs: &proto.GPURequest{Count: 1}}},
		stages: []bench.Stage{{Name: "solve"}}})
	return c
}

func (c testCatalog) add(name string, s testSuite) {
	idx := map[string]bench.Task{}
	for _, t := range s.tasks {
		idx[t.ID] = t
	}
	c.suites[name] = SuiteInfo{Bench: s, Tasks: idx}
}

type harness struct {
	t   *testing.T
	cfg Config
	cat testCatalog
	s   *State
	now time.Time
	// db holds the durable records, as the journal would.
	db map[string][]byte
	// seq numbers announcements per node.
	seq map[string]uint64
}

func testConfig() Config {
	return Config{Self: self, OpenOperators: true, IdleCanaryEvery: -1, Seed: [32]byte{1}, IDSecret: []byte("secret"), Models: []string{"m"}}
}

func newHarness(t *testing.T, mod ...func(*Config)) *harness {
	t.Helper()
	cfg := testConfig()
	for _, m := range mod {
		m(&cfg)
	}
	h := &harness{t: t, cfg: cfg, cat: newCatalog(), now: time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC),
		db: map[string][]byte{}, seq: map[string]uint64{}}
	s, err := New(cfg, h.cat)
	if err != nil {
		t.Fatal(err)
	}
	h.s = s
	return h
}

// step applies ev now and keeps its records.
func (h *harness) step(ev Event) Effects {
	h.t.Helper()
	fx := h.s.Step(h.now, ev)
	h.keep(fx.Records)
	return fx
}

func (h *harness) keep(recs []Record) {
	h.t.Helper()
	for _, r := range recs {
		switch {
		case r.Raw != nil:
			h.db[r.Key] = slices.Clone(r.Raw)
		case r.Value != nil:
			b, err := json.Marshal(r.Value)
			if err != nil {
				h.t.Fatalf("record %s cannot be encoded: %v", r.Key, err)
			}
			h.db[r.Key] = b
		default:
			delete(h.db, r.Key)
		}
	}
}

func (h *harness) advance(d time.Duration) { h.now = h.now.Add(d) }

// announce has node announce slots free slots of slots (incarnation 1),
// serving this coordinator, as operator op.
func (h *harness) announce(node, op string, slots int, opts ...func(*Announced)) Effects {
	h.seq[node]++
	a := Announced{Node: node, Seq: h.seq[node], Incarnation: 1, Certified: op, TotalSlots: slots, FreeSlots: slots,
		Coordinators: map[string]int{self: 0}}
	for _, o := range opts {
		o(&a)
	}
	return h.step(a)
}

func (h *harness) tick() Effects { return h.step(Tick{Writable: true}) }

// evaluate queues an evaluation and fails the test on a refusal.
func (h *harness) evaluate(e Evaluation) EvaluateReply {
	h.t.Helper()
	fx := h.step(Evaluate{e})
	r := fx.Reply.(EvaluateReply)
	if r.Err != nil {
		h.t.Fatalf("evaluate %+v: %v", e, r.Err)
	}
	return r
}

// placeOn ticks until an offer goes to node and returns it.
func (h *harness) offerTo(node string) Offer {
	h.t.Helper()
	for _, o := range h.tick().Offers {
		if o.Node == node {
			return o
		}
	}
	h.t.Fatalf("no offer to %s; attempts: %s", node, h.states())
	return Offer{}
}

func (h *harness) accept(o Offer) Effects {
	return h.step(OfferAnswered{Attempt: o.Attempt, Node: o.Node, Accepted: true, Incarnation: 1})
}

// evidence is what an honest node reports of running attempt id.
func (h *harness) evidence(id string) crosscheck.Evidence {
	a := h.s.Attempts[id]
	if a == nil {
		return crosscheck.Evidence{}
	}
	w := h.s.Book.Attempts[a.Unit].Work
	end := h.now.UnixMilli()
	return crosscheck.Evidence{Outcome: "ok", ImageCID: w.ImageCID, InputCIDs: w.InputCIDs, StartedMillis: end - 2000,
		FinishedMillis: end, WallSeconds: 2, CPUSeconds: 1}
}

// report sends node's report of id (digest d) through both phases, as the
// shell does when it counts, and returns the last reply.
func (h *harness) report(id, node, digest string, outputs ...Output) any {
	h.t.Helper()
	ev := ReportArrived{Attempt: id, Node: node, Digest: digest, Outcome: "ok", Usage: Usage{CPUSeconds: 1, WallMillis: 2000},
		Evidence: h.evidence(id), Envelope: []byte("envelope " + digest)}
	fx := h.step(ev)
	if _, ok := fx.Reply.(ReportCounts); !ok {
		return fx.Reply
	}
	ev.Fetched, ev.Outputs = true, outputs
	return h.step(ev).Reply
}

// score scores id as passing (value) with a grading replicas compare.
func (h *harness) score(id string, pass bool) Effects {
	v := 0.0
	if pass {
		v = 1
	}
	return h.step(Scored{Attempt: id, Scorer: "test@1", Score: bench.Score{Comparable: bench.Comparable{Grading: &bench.Grading{Pass: pass}},
		Public: json.RawMessage(fmt.Sprintf(`{"pass":%t}`, pass)), Value: v}})
}

// only returns the one attempt of the state (failing otherwise).
func (h *harness) only() *Attempt {
	h.t.Helper()
	if len(h.s.Attempts) != 1 {
		h.t.Fatalf("%d attempts, want 1: %s", len(h.s.Attempts), h.states())
	}
	for _, a := range h.s.Attempts {
		return a
	}
	return nil
}

func (h *harness) states() string {
	var out []string
	for _, a := range h.s.AttemptList(true) {
		out = append(out, fmt.Sprintf("%s %s/%s %s on %q", a.ID, a.Unit, a.Stage, a.State, a.Node))
	}
	return strings.Join(out, "; ")
}

// snapshot reads the durable records back, as the shell's load does.
func (h *harness) snapshot() Snapshot {
	h.t.Helper()
	var snap Snapshot
	dec := func(k string, v any) {
		if err := json.Unmarshal(h.db[k], v); err != nil {
			h.t.Fatalf("decode %s: %v", k, err)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(h.db)) {
		switch {
		case strings.HasPrefix(k, AttemptsKey+"/"):
			var a Attempt
			dec(k, &a)
			snap.Attempts = append(snap.Attempts, a)
		case strings.HasPrefix(k, NodesKey+"/"):
			var r NodeRecord
			dec(k, &r)
			snap.Records = append(snap.Records, r)
		case strings.HasPrefix(k, UsageKey+"/"):
			var u schedule.GroupUsage
			dec(k, &u)
			snap.Usage = append(snap.Usage, u)
		case strings.HasPrefix(k, EvalsKey+"/"):
			var e EvalRecord
			dec(k, &e)
			snap.Evals = append(snap.Evals, e)
		case strings.HasPrefix(k, PipelinesKey+"/"):
			var p Pipeline
			dec(k, &p)
			snap.Pipelines = append(snap.Pipelines, p)
		case strings.HasPrefix(k, ReprosKey+"/"):
			var r ReproRecord
			dec(k, &r)
			snap.Repros = append(snap.Repros, r)
		case strings.HasPrefix(k, AdmittedKey+"/"):
			var a Admitted
			dec(k, &a)
			snap.Admitted = append(snap.Admitted, a)
		case strings.HasPrefix(k, PoolsKey+"/"):
			var p PoolRecord
			dec(k, &p)
			snap.Pools = append(snap.Pools, p)
		case strings.HasPrefix(k, WorksKey+"/"):
			var w crosscheck.Attempt
			dec(k, &w)
			snap.Works = append(snap.Works, w)
		case strings.HasPrefix(k, BookNodesKey+"/"):
			var r crosscheck.NodeRecord
			dec(k, &r)
			snap.BookNodes = append(snap.BookNodes, r)
		}
	}
	return snap
}

// restart makes a new State from the durable records at now (a
// coordinator restart) and returns the effects of the restore.
func (h *harness) restart() Effects {
	h.t.Helper()
	s, err := New(h.cfg, h.cat)
	if err != nil {
		h.t.Fatal(err)
	}
	h.s = s
	fx := s.Restore(h.snapshot(), h.now)
	h.keep(fx.Records)
	return fx
}
