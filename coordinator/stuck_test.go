package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/proto"
)

// Work no node can take ends with a reason, and a submitter sees why while
// it waits (issue 23): through the shell, with nodes on the wire.

// Both nodes fail the attempt for infrastructure reasons (an image they
// cannot pull): it ends at once, unschedulable, with what they said; no
// third node, no MaxTries.
func TestWorkEveryNodeFailsEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) { cfg.ScheduleInterval = 50 * time.Millisecond })
	defer c.Close()
	const why = "pull registry.example/agent:1: 403 Forbidden"
	var nodes []*wireNode
	for range 2 {
		w := newWireNode(ctx, t, c, 2)
		w.report = func(a *proto.Assignment) *proto.Report {
			r := w.okReport(a, "")
			r.Outcome, r.Detail, r.Outputs = proto.Outcome_OUTCOME_INFRA_ERROR, why, nil
			return r
		}
		w.announce(ctx)
		nodes = append(nodes, w)
	}
	evaluate(t, c, Evaluation{ID: "ev-pull", Replicas: 1, Group: "g"})
	waitUntil(ctx, t, "every attempt has ended", func() bool {
		for _, a := range c.Attempts() {
			if a.Eval == "ev-pull" && a.State != StateFailed {
				for _, w := range nodes {
					w.announceOnce(ctx)
				}
				return false
			}
		}
		return true
	})
	sub := accounts.Principal{Scope: accounts.ScopeSubmitter, Submitter: "s", Group: "g"}
	d, ok := c.evaluationDetail(sub, "ev-pull")
	if !ok || len(d.Attempts) == 0 {
		t.Fatalf("the submitter's view: %v %+v", ok, d)
	}
	for _, a := range d.Attempts {
		if a.State != "failed" || a.Outcome != OutcomeUnschedulable || !strings.Contains(a.Detail, "2 of 2 eligible nodes failed it") ||
			!strings.Contains(a.Detail, why) || a.Waiting != nil {
			t.Errorf("attempt %s: %s %q %q waiting %+v", a.ID, a.State, a.Outcome, a.Detail, a.Waiting)
		}
	}
	for _, w := range nodes {
		if r := record(c, w.id().String()); r.Declined != 0 || r.LeaseLost != 0 {
			t.Errorf("node charged: %+v", r)
		}
	}
}

// Limits larger than every slot: the submitter sees why while it waits,
// and it ends unschedulable after the bound.
func TestWorkNoSlotFitsEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const bound = 3 * time.Second
	c := openTestWith(t, t.TempDir(), func(cfg *Config) {
		cfg.ScheduleInterval, cfg.UnschedulableAfter = 50*time.Millisecond, bound
		cfg.Limits = &proto.Limits{CpuMillis: 64000, MemoryBytes: 64 << 30, Pids: 64, WallSeconds: 600, OutputBytes: 1 << 20}
	})
	defer c.Close()
	w := newWireNode(ctx, t, c, 2)
	w.announce(ctx)
	go w.announceEvery(ctx, time.Second)
	evaluate(t, c, Evaluation{ID: "ev-big", Replicas: 1, Group: "g"})
	sub := accounts.Principal{Scope: accounts.ScopeSubmitter, Submitter: "s", Group: "g"}
	var seen string
	start := time.Now()
	waitUntil(ctx, t, "the evaluation is finished", func() bool {
		d, _ := c.evaluationDetail(sub, "ev-big")
		if len(d.Waiting) > 0 && seen == "" {
			seen = d.Waiting[0].Reason
			if !d.Waiting[0].Blocked || d.Waiting[0].Attempts != len(d.Attempts) || d.Attempts[0].Waiting == nil {
				t.Errorf("waiting %+v, attempts %+v", d.Waiting, d.Attempts)
			}
		}
		return d.Progress.Finished()
	})
	took := time.Since(start)
	if !strings.Contains(seen, "none of the 1 node in view can run it: 1 has a slot too small for its limits (it needs 64000 mCPU") {
		t.Errorf("while waiting the submitter saw %q", seen)
	}
	if took < bound || took > bound+10*time.Second {
		t.Errorf("ended after %v; the bound is %v", took, bound)
	}
	for _, a := range c.Attempts() {
		if a.Eval == "ev-big" && (a.Outcome != OutcomeUnschedulable || !strings.Contains(a.Detail, "too small")) {
			t.Errorf("attempt %s: %q %q", a.ID, a.Outcome, a.Detail)
		}
	}
	if w.reported() != 0 || len(w.held()) != 0 {
		t.Error("the node was given work it cannot run")
	}
}

// A reproducibility check whose runs cannot build their environment on
// any node ends, each run with its reason, and says why its runs wait
// while they do.
func TestReproNoNodeCanRunEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) { cfg.ScheduleInterval = 50 * time.Millisecond })
	defer c.Close()
	const why = "environment: build: apt-get install r-base: exit status 100"
	var nodes []*wireNode
	for range 2 {
		w := newWireNode(ctx, t, c, 1)
		w.report = func(a *proto.Assignment) *proto.Report {
			r := w.okReport(a, "")
			r.Outcome, r.Detail, r.Outputs = proto.Outcome_OUTCOME_INFRA_ERROR, why, nil
			return r
		}
		w.announce(ctx)
		nodes = append(nodes, w)
	}
	tb, err := sample.CapsuleTarball("capsule-0000002")
	if err != nil {
		t.Fatal(err)
	}
	spec := `{"capsule": {"field": "F", "language": "Shell", "capsule_title": "T", "capsule_id": "capsule-0000002", "capsule_doi": "", "task_prompt": "Run it."},
	 "rules": [{"question": "Report the number of time points.", "file": "results/growth.txt", "kind": "regex", "expr": "(?m)^n_timepoints (\\S+)$", "type": "number"}]}`
	id, err := c.SubmitRepro(ctx, json.RawMessage(spec), "", bytes.NewReader(tb))
	if err != nil {
		t.Fatal(err)
	}
	var st ReproStatus
	waitUntil(ctx, t, "the check ended", func() bool {
		for _, w := range nodes {
			w.announceOnce(ctx)
		}
		st, err = c.ReproStatus(ctx, id)
		return err == nil && (st.State == ReproDone || st.State == ReproFailed)
	})
	t.Logf("the check: %s", st.Error)
	// No run ran: the check fails, saying why each did not.
	if st.State != ReproFailed || st.RunsDone != st.RunsWanted || len(st.Waiting) != 0 {
		t.Fatalf("status %+v", st)
	}
	for k := 1; k <= st.RunsWanted; k++ {
		if !strings.Contains(st.Error, fmt.Sprintf("run %d: unschedulable: ", k)) {
			t.Errorf("run %d: no reason in %q", k, st.Error)
		}
	}
	if !strings.Contains(st.Error, "eligible nodes failed it") || !strings.Contains(st.Error, why) {
		t.Errorf("error %q: want what the nodes said", st.Error)
	}
}
