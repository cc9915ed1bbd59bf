package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
)

// mediumSuite is the suite of the sample capsules whose results need
// their environment.
const mediumSuite = "sample-medium"

// importSuite imports a CORE-Bench suite of the sample family's settings
// from a task file.
func importSuite(ctx context.Context, t *testing.T, c *coordinator.Coordinator, name string, tasks []byte) {
	t.Helper()
	def, err := family.Def(name, tasks, "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportSuite(ctx, def); err != nil {
		t.Fatal(err)
	}
}

// TestMediumEnvironment runs CORE-Bench Medium the way repronet chose
// (docs/sandbox.md): a coordinator and a node on loopback, the real
// containerd daemon; the sample Medium suite's capsule (capsule-0000004,
// whose code needs a tool only its environment/Dockerfile installs) is
// solved by the oracle at Medium, two runs on one node with one slot: the
// node builds the capsule's environment for the first (its FROM from the
// base image the node was given), finds it built for the second, and runs
// the oracle inside it, as root in a user namespace, with its own image
// at /agent. The wrong agent, in the same environment, is scored wrong.
// The wall times of the two oracle runs are logged (cold build, cached).
func TestMediumEnvironment(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)
	c := startCoordinator(ctx, t, coordinator.Config{Logger: log, IdleCanaryEvery: -1, ScheduleInterval: 200 * time.Millisecond})
	importSuite(ctx, t, c, mediumSuite, sample.MediumTasks())
	for _, id := range sample.MediumCapsuleIDs() {
		tb, err := sample.CapsuleTarball(id)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.AddCapsule(ctx, id, bytes.NewReader(tb)); err != nil {
			t.Fatal(err)
		}
	}
	// A namespace of its own: the environment is not built yet.
	startNode(ctx, t, d, log, nodeOpts{name: uniqueName("medium"), coord: c.Addrs()[0].String(), slots: 1})
	waitFor(ctx, t, "the node in the coordinator's view", func() bool { return len(c.Nodes()) == 1 })

	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: mediumSuite, Agent: "oracle", Levels: []string{"medium"},
		Runs: 2, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: mediumSuite, Agent: "wrong", Levels: []string{"medium"},
		Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "every attempt finished", func() bool {
		p := c.Progress()
		return p.Total == 3 && p.Done+p.Failed == p.Total
	})
	var oracle []coordinator.Attempt
	for _, a := range c.Attempts() {
		if a.State != coordinator.StateDone || a.Outcome != "ok" {
			t.Fatalf("attempt %s (%s %s) ended %s %s: %s", a.ID, a.Agent, a.TaskID, a.State, a.Outcome, a.Detail)
		}
		r, _, err := c.Report(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		if out := string(r.GetStdoutTail()); a.Agent == "oracle" &&
			(!strings.Contains(out, "running /code/run") || !strings.Contains(out, "uid 0")) {
			t.Fatalf("attempt %s: the oracle did not regenerate the results as root in the environment:\n%s\n%s", a.ID, out, r.GetStderrTail())
		}
		if a.Agent == "oracle" {
			oracle = append(oracle, a)
		}
	}
	rows := 0
	for _, r := range flatBoard(c) {
		if r.Suite != mediumSuite {
			continue
		}
		rows++
		want := map[string]float64{"oracle": 1, "wrong": 0}[r.Agent]
		runs := map[string]int{"oracle": 2, "wrong": 1}[r.Agent]
		if r.Level != "medium" || r.Accuracy != want || r.Runs != runs || r.Validated != runs || r.InfraFailures != 0 {
			t.Fatalf("board row %+v, want accuracy %v over %d runs", r, want, runs)
		}
	}
	if rows != 2 {
		t.Fatalf("%d board rows of %s, want the oracle's and the wrong agent's", rows, mediumSuite)
	}
	for _, a := range oracle {
		t.Logf("oracle run %d at Medium: %v from assignment to report", a.Run, a.FinishedAt.Sub(a.AssignedAt).Round(time.Millisecond))
	}
}
