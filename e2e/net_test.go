package e2e

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/sandbox/gpu"
)

// ensureDaemon starts (or finds running) the private containerd daemon.
func ensureDaemon(ctx context.Context, t *testing.T, log *slog.Logger) *sandbox.Daemon {
	t.Helper()
	d, err := sandbox.EnsureDaemon(ctx, sandbox.DefaultDaemonDir, log)
	if err != nil {
		t.Fatalf("containerd: %v", err)
	}
	return d
}

// allLevels are CORE-Bench's levels, as evaluations name them.
var allLevels = []string{"easy", "medium", "hard"}

// flatBoard is the coordinator's CORE-Bench leaderboard, flattened.
func flatBoard(c *coordinator.Coordinator) []leaderboard.FlatRow {
	return leaderboard.Flatten(demo.CoreBenchBoards(c.Boards()))
}

// e2eJoinToken admits the tests' nodes (startNode, joinTokenFile).
const e2eJoinToken = "e2e-join-token-for-every-node"

// joinTokenFile writes e2eJoinToken to a file, for node processes.
func joinTokenFile(t *testing.T) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "join.token")
	if err := os.WriteFile(p, []byte(e2eJoinToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// startCoordinator starts an in-process coordinator on loopback with the
// sample suite and agents imported.
func startCoordinator(ctx context.Context, t *testing.T, cfg coordinator.Config) *coordinator.Coordinator {
	t.Helper()
	if cfg.DataDir == "" {
		cfg.DataDir = t.TempDir()
	}
	if cfg.Limits == nil {
		cfg.Limits = demo.SampleLimits()
	}
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = 20 * time.Second
	}
	cfg.JoinTokens = append(cfg.JoinTokens, e2eJoinToken)
	if cfg.Families == nil {
		cfg.Families, cfg.Checker = families.Registry(), families.Checker()
	}
	c, err := coordinator.New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := demo.ImportSample(ctx, c); err != nil {
		t.Fatal(err)
	}
	return c
}

// nodeOpts describes one in-process node.
type nodeOpts struct {
	// name makes the node's containerd namespace (and so its sandbox state
	// folder, sandbox.DefaultStateDir/<namespace>) its own.
	name  string
	coord string
	slots int
	// sandbox wraps the real one (nil: honest).
	sandbox     func(node.Sandbox) node.Sandbox
	network     string
	hostOptions []libp2p.Option
	// dataDir is the node's data folder (default: a temporary folder).
	dataDir string
	// groups are the only submitter groups the node serves (nil: all);
	// hooks make it misbehave (nil: honest).
	groups []string
	hooks  *node.TestHooks
	// gpus are announced; gpuDevices, when set, are the devices behind
	// them (granted to the jobs given them), else there are none.
	gpus       []node.GPU
	gpuDevices *gpu.Inventory
	// noBaseImages: the node is given no base image (an environment's
	// FROM is then not on it, and it pulls from no registry).
	noBaseImages bool
}

// baseImages are the base images every test node is given.
func baseImages(t *testing.T) []string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return []string{baseImage}
}

// startNode starts an in-process node with a sandbox of its own on the
// real containerd daemon.
func startNode(ctx context.Context, t *testing.T, d *sandbox.Daemon, log *slog.Logger, o nodeOpts) *node.Node {
	t.Helper()
	runner, err := sandbox.New(ctx, d.Socket, sandbox.WithNamespace("repronet-e2e-"+o.name), sandbox.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { runner.Close() })
	var box node.Sandbox = runner
	if o.sandbox != nil {
		box = o.sandbox(runner)
	}
	if o.slots == 0 {
		o.slots = 2
	}
	if o.dataDir == "" {
		o.dataDir = t.TempDir()
	}
	bases, registries := baseImages(t), []string(nil)
	if o.noBaseImages {
		bases, registries = nil, []string{} // and no registry: nothing leaves loopback
	}
	n, err := node.New(ctx, node.Config{DataDir: o.dataDir, Network: o.network, Coordinators: []string{o.coord}, Slots: o.slots,
		Sandbox: box, HostOptions: o.hostOptions, JoinToken: e2eJoinToken, Logger: log.With("node", o.name), Groups: o.groups,
		TestHooks: o.hooks, BaseImages: bases, Registries: registries, GPUs: o.gpus, GPUDevices: o.gpuDevices})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n
}

// evaluateSample evaluates both sample agents at every level, one run
// each, with the coordinator's replication policy.
func evaluateSample(ctx context.Context, t *testing.T, c *coordinator.Coordinator) {
	t.Helper()
	for _, agent := range sample.AgentNames() {
		if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: agent, Levels: allLevels}); err != nil {
			t.Fatal(err)
		}
	}
}

// allValidated reports whether every attempt is finished and every run of
// the evaluations is validated.
func allValidated(c *coordinator.Coordinator) bool {
	p := c.Progress()
	if p.Units == 0 || p.Done+p.Failed != p.Total || p.Decided != p.Units {
		return false
	}
	for _, e := range c.LeaderboardEntries() {
		if e.Status != bench.Validated {
			return false
		}
	}
	return true
}

// checkSampleBoards checks the sample leaderboard: one board per level, the
// oracle right on every task, the wrong agent on none, every run validated.
func checkSampleBoards(t *testing.T, boards []leaderboard.Board) {
	t.Helper()
	if len(boards) != 3 {
		t.Fatalf("%d boards, want one per level: %s", len(boards), boardsJSON(boards))
	}
	for _, b := range boards {
		if b.Scoring.Grader != family.DefaultGrader || b.Scoring.StripRule != family.DefaultStripRule ||
			b.Scoring.GraderVersion == "" || b.Scoring.StripRuleVersion == "" {
			t.Fatalf("board scored by %s", b.Scoring)
		}
		if len(b.Rows) != 2 {
			t.Fatalf("%s: %d rows", b.Level, len(b.Rows))
		}
		for _, r := range b.Rows {
			want := map[string]float64{"oracle": 1, "wrong": 0}[r.Agent]
			if r.Tasks != len(sample.CapsuleIDs()) || r.Accuracy != want || r.ValidatedShare != 1 || r.InfraFailures+r.Pending+r.Unvalidated+r.Inconsistent != 0 {
				t.Fatalf("%s %s: %+v", b.Level, r.Agent, r)
			}
		}
	}
}

// normalized drops what differs between two correct runs of the same
// work: CPU and wall time.
func normalized(boards []leaderboard.Board) []leaderboard.Board {
	out := slices.Clone(boards)
	for i := range out {
		out[i].Rows = slices.Clone(out[i].Rows)
		for j := range out[i].Rows {
			out[i].Rows[j].CPUSeconds, out[i].Rows[j].WallSeconds = 0, 0
			if r := out[i].Rows[j].Reliability; r != nil { // wall times differ from run to run
				c := *r
				c.WallSeconds, c.PerTask = nil, slices.Clone(r.PerTask)
				for k := range c.PerTask {
					c.PerTask[k].WallSeconds = nil
					// Runs name their evaluation, whose ID differs from
					// network to network.
					c.PerTask[k].Runs = slices.Clone(c.PerTask[k].Runs)
					for n := range c.PerTask[k].Runs {
						c.PerTask[k].Runs[n].Eval = ""
					}
				}
				out[i].Rows[j].Reliability = &c
			}
		}
	}
	return out
}

func boardsJSON(b []leaderboard.Board) string {
	j, _ := json.MarshalIndent(b, "", " ")
	return string(j)
}

// goldReport is the report.json of an agent that returns the gold answers
// of a sample task (its first gold run) without running anything.
func goldReport(capsuleID string) ([]byte, error) {
	tasks, err := corebench.ParseTasks(sample.Tasks())
	if err != nil {
		return nil, err
	}
	for _, t := range tasks {
		if t.CapsuleID == capsuleID {
			return json.Marshal(t.Results[0])
		}
	}
	return nil, fmt.Errorf("no sample task %s", capsuleID)
}

// liarSandbox is a malicious volunteer's sandbox: it runs nothing and
// writes the agent's report.json itself, with what answer returns for the
// capsule in the workspace, claiming a short plausible run.
type liarSandbox struct {
	node.Sandbox
	answer func(capsuleID string) ([]byte, error)
}

func (l *liarSandbox) Run(ctx context.Context, spec sandbox.Spec) (sandbox.Result, error) {
	if spec.Workspace == nil {
		return sandbox.Result{}, fmt.Errorf("liar: no workspace")
	}
	dir := spec.Workspace.Dir()
	caps, _ := filepath.Glob(filepath.Join(dir, "capsule-*"))
	if len(caps) != 1 {
		return sandbox.Result{}, fmt.Errorf("liar: %d capsule folders", len(caps))
	}
	b, err := l.answer(filepath.Base(caps[0]))
	if err != nil {
		return sandbox.Result{}, err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), b, 0o644); err != nil {
		return sandbox.Result{}, err
	}
	select {
	case <-ctx.Done():
		return sandbox.Result{}, ctx.Err()
	case <-time.After(300 * time.Millisecond):
	}
	return sandbox.Result{Outcome: sandbox.OutcomeOK, Stdout: []byte("done\n"), CPUSeconds: 0.2, Wall: 300 * time.Millisecond}, nil
}

// forger returns the gold answers without running anything.
func forger(s node.Sandbox) node.Sandbox { return &liarSandbox{Sandbox: s, answer: goldReport} }

// garbage returns random bytes as its report.
func garbage(s node.Sandbox) node.Sandbox {
	return &liarSandbox{Sandbox: s, answer: func(string) ([]byte, error) {
		b := make([]byte, 64)
		_, _ = rand.Read(b)
		return b, nil
	}}
}

// uniqueName makes a network name of this test run.
func uniqueName(prefix string) string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%s-%d-%x", prefix, os.Getpid(), b)
}

func lines(s string) []string { return strings.Split(strings.TrimSpace(s), "\n") }
