package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/proto"
)

// TestReproSubmitterAndWhy: a submitter submits a check within its
// group's quota, with the default environment or its own agent only; the
// runs are the group's; every run of the check fails (the script exits 2
// with a Python traceback), and the check says so: the capsule named, each
// run linked to its page and logs, and why each failed (exit status and
// the end of its stderr).
func TestReproSubmitterAndWhy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := openTestWith(t, t.TempDir(), func(cfg *Config) { cfg.ScheduleInterval = 50 * time.Millisecond; cfg.OpenOperators = true })
	defer c.Close()
	const stderr = "Traceback (most recent call last):\n  File \"/code/main.py\", line 1, in <module>\n    import pandas\nModuleNotFoundError: No module named 'pandas'\n"
	var nodes []*wireNode
	for range 3 {
		w := newWireNode(ctx, t, c, 1)
		w.report = func(a *proto.Assignment) *proto.Report {
			r := w.okReport(a, "")
			r.Outcome, r.ExitCode, r.StderrTail = proto.Outcome_OUTCOME_AGENT_ERROR, 2, []byte(stderr)
			return r
		}
		w.announce(ctx)
		nodes = append(nodes, w)
	}
	if _, err := c.web.accounts.CreateGroup(ctx, "lab-x", 2); err != nil {
		t.Fatal(err)
	}
	ann := accounts.Principal{Scope: accounts.ScopeSubmitter, Submitter: "ann", Group: "lab-x"}
	tb, err := sample.CapsuleTarball("capsule-0000002")
	if err != nil {
		t.Fatal(err)
	}
	spec := json.RawMessage(`{"capsule": {"field": "F", "language": "Python", "capsule_title": "Growth curves", "capsule_id": "capsule-0000002", "capsule_doi": "", "task_prompt": "Run it."},
	 "rules": [{"question": "Report the number of time points.", "file": "results/growth.txt", "kind": "regex", "expr": "(?m)^n_timepoints (\\S+)$", "type": "number"}]}`)
	// Three runs over a quota of two: refused, saying so.
	if _, err := c.SubmitReproAs(ctx, ann, spec, "", bytes.NewReader(tb)); !errors.Is(err, errReproQuota) {
		t.Fatalf("over quota: %v", err)
	}
	if _, err := c.web.accounts.SetQuota(ctx, "lab-x", 10); err != nil {
		t.Fatal(err)
	}
	// Another group's (here the operator's sample) agent as the environment: refused.
	if _, err := c.SubmitReproAs(ctx, ann, spec, "solver-b", bytes.NewReader(tb)); !errors.Is(err, errBadRepro) || !strings.Contains(err.Error(), "no agent of that name") {
		t.Fatalf("another group's image: %v", err)
	}
	id, err := c.SubmitReproAs(ctx, ann, spec, "", bytes.NewReader(tb))
	if err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	rec := *c.state.Repros[id]
	for _, u := range rec.Units {
		for _, aid := range c.state.Units[u] {
			if g := c.state.Attempts[aid].Group; g != "lab-x" {
				t.Errorf("run %s of group %q, want lab-x", aid, g)
			}
		}
	}
	c.mu.Unlock()
	if rec.Group != "lab-x" || rec.Submitter != "ann" {
		t.Errorf("check of %q/%q", rec.Group, rec.Submitter)
	}
	if l := c.reproViewsFor(ctx, ann); len(l) != 1 || l[0].ID != id || l[0].CapsuleID != "capsule-0000002" || l[0].CapsuleTitle != "Growth curves" {
		t.Errorf("ann's checks: %+v", l)
	}
	if l := c.reproViewsFor(ctx, accounts.Principal{Scope: accounts.ScopeSubmitter, Submitter: "bob", Group: "lab-y"}); len(l) != 0 {
		t.Errorf("another group lists %+v", l)
	}
	var st ReproStatus
	for _, w := range nodes {
		w.announceEvery(ctx, proto.MinAnnounceGap+200*time.Millisecond)
	}
	waitUntil(ctx, t, "the check ended", func() bool {
		st, err = c.ReproStatus(ctx, id)
		return err == nil && (st.State == ReproDone || st.State == ReproFailed)
	})
	if st.State != ReproFailed || st.Capsule.ID != "capsule-0000002" || st.Capsule.Title != "Growth curves" || len(st.Runs) != 3 {
		t.Fatalf("status %+v", st)
	}
	if len(st.FailedBecause) != 3 {
		t.Fatalf("failed because %q, want a line per run", st.FailedBecause)
	}
	for i, r := range st.Runs {
		if !r.Failed || r.ExitCode == nil || *r.ExitCode != 2 || !strings.Contains(r.StderrTail, "No module named 'pandas'") ||
			r.Attempt == "" || r.Logs != "/api/attempts/"+r.Attempt+"/logs" || r.Page != "/attempts/"+r.Attempt {
			t.Errorf("run %d: %+v", i+1, r)
		}
		if a, ok := c.visibleAttempt(ann, r.Attempt); !ok || a.Repro != id {
			t.Errorf("run %d: its attempt is not ann's to read", i+1)
		}
		if _, ok := c.visibleAttempt(accounts.Principal{Scope: accounts.ScopeSubmitter, Group: "lab-y"}, r.Attempt); ok {
			t.Errorf("run %d: another group reads it", i+1)
		}
		line := st.FailedBecause[i]
		if !strings.Contains(line, "agent_error, exit status 2") || !strings.Contains(line, "ModuleNotFoundError: No module named 'pandas'") {
			t.Errorf("run %d: %q", i+1, line)
		}
	}
	// The page names the capsule and says why.
	v, err := c.reproView(ctx, id)
	if err != nil || v.CapsuleTitle != "Growth curves" || len(v.Runs) != 3 || len(v.FailedBecause) != 3 {
		t.Errorf("view %+v %v", v, err)
	}
}
