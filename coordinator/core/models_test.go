package core

import (
	"errors"
	"strings"
	"testing"
)

// TestStepEvaluateModels: an evaluation naming a model the coordinator's
// gateway does not serve is refused, naming the model and what is served;
// one naming served models is queued.
func TestStepEvaluateModels(t *testing.T) {
	cases := []struct {
		name   string
		served []string
		asked  []string
		want   string // "" : queued
	}{
		{"no model access", nil, []string{"gpt-4o"}, "has no model access"},
		{"not served", []string{"claude-x"}, []string{"claude-x", "gpt-4o"}, "models gpt-4o: no provider of this coordinator serves them (it serves claude-x"},
		{"served", []string{"claude-x", "claude-haiku"}, []string{"claude-haiku", "claude-x"}, ""},
		{"none asked", nil, nil, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h := newHarness(t, func(cfg *Config) { cfg.Models = c.served })
			fx := h.step(Evaluate{Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Models: c.asked}})
			r := fx.Reply.(EvaluateReply)
			if c.want == "" {
				if r.Err != nil || r.Attempts == 0 {
					t.Fatalf("refused: %v", r.Err)
				}
				return
			}
			if !errors.Is(r.Err, ErrBadRequest) || !strings.Contains(r.Err.Error(), c.want) || len(h.s.Attempts) != 0 {
				t.Fatalf("got %v with %d attempts, want a refusal saying %q", r.Err, len(h.s.Attempts), c.want)
			}
		})
	}
}

// TestStepModelUnavailable: a report whose assignment's last model call
// failed for the coordinator's reasons is not scored and charges nobody:
// the attempt runs again, and after MaxTries such runs it ends
// model_unavailable, with the reason, never scored.
func TestStepModelUnavailable(t *testing.T) {
	h, a := oneJob(t)
	before := *h.s.record("n1")
	for i := 1; i <= h.s.Config().MaxTries; i++ {
		if a.State != StateQueued {
			t.Fatalf("run %d: %s, want queued", i, a.State)
		}
		h.accept(h.offerTo("n1"))
		ev := ReportArrived{Attempt: a.ID, Node: "n1", Digest: "d", Outcome: "agent_error", Evidence: h.evidence(a.ID),
			Envelope: []byte("env")}
		if _, ok := h.step(ev).Reply.(ReportCounts); !ok {
			t.Fatalf("run %d: first phase", i)
		}
		ev.Fetched, ev.Model = true, &ModelUse{Calls: 2, Unavailable: "model gpt-x: 503: the provider answered 503"}
		fx := h.step(ev)
		if _, ok := fx.Reply.(ReportKept); !ok || len(fx.Scores) != 0 {
			t.Fatalf("run %d: %#v, %d scoring jobs", i, fx.Reply, len(fx.Scores))
		}
	}
	if a.State != StateFailed || a.Outcome != OutcomeModelUnavailable || !strings.Contains(a.Detail, "the provider answered 503") ||
		a.Score != nil || a.ModelFaults != h.s.Config().MaxTries {
		t.Fatalf("after %d runs: %s %s %q score %v", a.ModelFaults, a.State, a.Outcome, a.Detail, a.Score)
	}
	after := *h.s.record("n1")
	if after.InfraErrors != before.InfraErrors || after.Allowance != before.Allowance || after.LeaseLost != before.LeaseLost {
		t.Fatalf("the node was charged: before %+v, after %+v", before, after)
	}
}

// TestJobImageFixedAtQueue: the image a job runs is the agent's image as
// it was when the work was queued; pushing the agent again changes it for
// new evaluations only, so that a node given the old image is judged
// against the old image (issue 24: a re-push made honest nodes liars).
func TestJobImageFixedAtQueue(t *testing.T) {
	h, a := oneJob(t)
	h.cat.agents["agent"] = AgentInfo{CID: "bafyagent-v2", Size: 1 << 20}
	j, ok := h.s.JobOf(a.ID)
	if !ok || j.ImageCID != "bafyagent" {
		t.Fatalf("the queued job runs %q, want the image it was queued with (bafyagent)", j.ImageCID)
	}
	h.evaluate(Evaluation{Suite: "one", Agent: "agent", Levels: []string{"easy"}, Replicas: 1, ID: "ev-2"})
	var newer *Attempt
	for _, x := range h.s.Attempts {
		if x.Eval == "ev-2" {
			newer = x
		}
	}
	if j, _ := h.s.JobOf(newer.ID); j.ImageCID != "bafyagent-v2" {
		t.Fatalf("a new evaluation runs %q, want the pushed image bafyagent-v2", j.ImageCID)
	}
}
