package core

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
)

// scored is a family's score of an attempt, with a scoring of the given
// version.
func scored(value float64, version string) *ScoreRecord {
	return &ScoreRecord{Scorer: "x", Scoring: json.RawMessage(`{"grader_version":"` + version + `"}`),
		Public: json.RawMessage(fmt.Sprintf(`{"value":%v}`, value)), Verdict: json.RawMessage(`{"gold":"secret"}`), Value: value}
}

func TestUnitEntry(t *testing.T) {
	suite := json.RawMessage(`{"grader_version":"1"}`)
	tmpl := Attempt{ID: "j1", Suite: "s", TaskID: "capsule-1", Agent: "a", Level: "easy", Run: 2, Unit: "u"}
	at := time.Unix(1000, 0)
	atts := map[string]*Attempt{
		"j1": {ID: "j1", Score: scored(0, "1"), Usage: &Usage{CPUSeconds: 1, WallMillis: 3000}, AssignedAt: at, FinishedAt: at.Add(time.Minute)},
		"j2": {ID: "j2", Score: scored(1, "1"), Usage: &Usage{CPUSeconds: 2, WallMillis: 4000}, AssignedAt: at, FinishedAt: at.Add(time.Hour)},
		"j3": {ID: "j3", Score: scored(1, "2")},
	}
	reps := []crosscheck.Replica{{Job: "j1", Node: "n1"}, {Job: "j2", Node: "n2"}, {Job: "j3", Node: "n3"}}
	base := bench.Entry{Suite: "s", Variant: "easy", Scoring: suite, Agent: "a", Model: "m", TaskID: "capsule-1", Run: 2}
	with := func(f func(e *bench.Entry)) bench.Entry { e := base; f(&e); return e }
	tests := []struct {
		name string
		w    crosscheck.Attempt
		want bench.Entry
	}{
		{"nothing reported: pending, the suite's scoring",
			crosscheck.Attempt{Decision: crosscheck.Decision{State: crosscheck.Open, Canonical: -1}},
			with(func(e *bench.Entry) { e.Status = bench.Pending })},
		{"validated: the canonical replica's public score, usage and times",
			crosscheck.Attempt{Replicas: reps[:2], Decision: crosscheck.Decision{State: crosscheck.Validated, Canonical: 1,
				Replicas: []crosscheck.ReplicaVerdict{{Index: 0, Verdict: crosscheck.Lied}, {Index: 1, Verdict: crosscheck.Valid}}}},
			with(func(e *bench.Entry) {
				e.Status, e.Score, e.CPUSeconds, e.WallSeconds = bench.Validated, atts["j2"].Score.Public, 2, 4
				e.Scoring = atts["j2"].Score.Scoring
				e.Started, e.Finished = at, at.Add(time.Hour)
			})},
		{"open: the first replica still standing, unvalidated",
			crosscheck.Attempt{Replicas: reps[:2], Decision: crosscheck.Decision{State: crosscheck.Open, Canonical: -1,
				Replicas: []crosscheck.ReplicaVerdict{{Index: 0, Verdict: crosscheck.Discarded}, {Index: 1, Verdict: crosscheck.Pending}}}},
			with(func(e *bench.Entry) {
				e.Status, e.Score, e.CPUSeconds, e.WallSeconds = bench.Unvalidated, atts["j2"].Score.Public, 2, 4
				e.Scoring = atts["j2"].Score.Scoring
				e.Started, e.Finished = at, at.Add(time.Hour)
			})},
		{"open with only a discarded replica: pending",
			crosscheck.Attempt{Replicas: reps[:1], Decision: crosscheck.Decision{State: crosscheck.Open, Canonical: -1,
				Replicas: []crosscheck.ReplicaVerdict{{Index: 0, Verdict: crosscheck.Discarded}}}},
			with(func(e *bench.Entry) { e.Status = bench.Pending })},
		{"inconsistent: shown, never scored",
			crosscheck.Attempt{Replicas: reps, Decision: crosscheck.Decision{State: crosscheck.Inconsistent, Canonical: -1}},
			with(func(e *bench.Entry) { e.Status = bench.Inconsistent })},
		{"failed: infrastructure, apart",
			crosscheck.Attempt{Decision: crosscheck.Decision{State: crosscheck.Failed, Canonical: -1}},
			with(func(e *bench.Entry) { e.Status = bench.InfraFailed })},
		{"the scoring is the canonical replica's",
			crosscheck.Attempt{Replicas: reps, Decision: crosscheck.Decision{State: crosscheck.Validated, Canonical: 2}},
			with(func(e *bench.Entry) {
				e.Status, e.Score, e.Scoring = bench.Validated, atts["j3"].Score.Public, atts["j3"].Score.Scoring
			})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t)
			h.s.Attempts = atts
			w := tt.w
			h.s.Book.Attempts["u"] = &w
			got, _ := h.s.unitEntry(&tmpl, "u", suite, "m")
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("entry\n got  %+v\n want %+v", got, tt.want)
			}
			if b, _ := json.Marshal(got); strings.Contains(string(b), "secret") {
				t.Fatalf("an entry holds the private verdict: %s", b)
			}
		})
	}
}

// TestHolders: the holders of a content are the nodes in view that
// announce it, most recently seen first, at most max; a node that stops
// announcing it, falls out of view or is forgotten is no holder.
func TestHolders(t *testing.T) {
	h := newHarness(t)
	cache := func(cids ...string) func(*Announced) { return func(a *Announced) { a.Cached = cids } }
	h.announce("n1", "op1", 1, cache("c1", "c2"))
	h.advance(time.Second)
	h.announce("n2", "op2", 1, cache("c1"))
	h.advance(time.Second)
	h.announce("n3", "op3", 1, cache("c1", "c3"))
	h.announce("n0", "op0", 1, cache("c1"))
	check := func(step, cid string, max int, want ...string) {
		t.Helper()
		if got := h.s.Holders(cid, h.now, max); !slices.Equal(got, want) {
			t.Fatalf("%s: Holders(%s, max %d) = %v, want %v", step, cid, max, got, want)
		}
	}
	check("announced", "c1", 10, "n0", "n3", "n2", "n1") // n0 and n3 seen together: by ID
	check("announced", "c1", 2, "n0", "n3")
	check("announced", "c2", 10, "n1")
	check("announced", "c9", 10)
	check("announced", "c1", 0)

	h.advance(time.Second)
	h.announce("n1", "op1", 1, cache("c3")) // n1 drops c1 and c2
	check("changed", "c1", 10, "n0", "n3", "n2")
	check("changed", "c2", 10)
	check("changed", "c3", 10, "n1", "n3")
	h.announce("n1", "op1", 1, cache("c3")) // unchanged
	check("unchanged", "c3", 10, "n1", "n3")

	ttl := h.s.Config().NodeTTL
	h.advance(ttl - time.Second) // n2 (seen at +1s) is now out of view
	check("out of view", "c1", 10, "n0", "n3")
	h.announce("n2", "op2", 1, cache("c1"))
	check("back in view", "c1", 10, "n2", "n0", "n3")
	h.advance(10*ttl + time.Second)
	h.announce("n3", "op3", 1, cache("c3"))
	h.tick() // forgets n0, n1 and n2
	check("forgotten", "c1", 10)
	check("forgotten", "c3", 10, "n3")
	if len(h.s.holders) != 1 {
		t.Fatalf("the index keeps %d contents after the nodes holding them were forgotten, want 1", len(h.s.holders))
	}
}
