package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/sandbox/gpu"
)

// gpuSuite is the sample suite with every task marked as needing a GPU.
const gpuSuite = "sample-gpu"

// gpuTasks is the sample task file with "gpu": true on every task.
func gpuTasks(t *testing.T) []byte {
	t.Helper()
	var tasks []map[string]any
	if err := json.Unmarshal(sample.Tasks(), &tasks); err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		task["gpu"] = true
	}
	b, err := json.Marshal(tasks)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// fakeGPU is one GPU whose device node is the host's /dev/zero and whose
// driver's control device is /dev/null: what the sandbox grants is real,
// only the hardware is not.
func fakeGPU() *gpu.Inventory {
	return &gpu.Inventory{
		Driver: gpu.Driver{Version: "550.54.15", Controls: []gpu.Node{{HostPath: "/dev/null", Path: "/dev/nvidiactl", Major: 1, Minor: 3}}},
		Devices: []gpu.Device{{Index: 0, UUID: "GPU-00000000-0000-0000-0000-000000000001", Model: "NVIDIA A100-SXM4-40GB",
			BusID: "0000:00:04.0", MemoryBytes: 40 << 30, Node: gpu.Node{HostPath: "/dev/zero", Path: "/dev/nvidia0", Major: 1, Minor: 5}}},
	}
}

// TestGPUScheduling runs GPU tasks and CPU tasks on a coordinator and
// three nodes on loopback, on the real daemon: two CPU-only nodes and one
// announcing a GPU (a fake device node behind it, granted by the
// sandbox). Every GPU attempt is assigned to the GPU node alone (never
// offered to a CPU-only node), one at a time (it has one GPU for its two
// slots), and sees its device inside the sandbox; the CPU attempts run
// too. The oracle is right on all of them.
func TestGPUScheduling(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)
	c := startCoordinator(ctx, t, coordinator.Config{Logger: log, IdleCanaryEvery: -1, ScheduleInterval: 200 * time.Millisecond})
	importSuite(ctx, t, c, gpuSuite, gpuTasks(t))
	// The oracle, telling which GPU devices it sees.
	files, err := sample.AgentFiles("oracle")
	if err != nil {
		t.Fatal(err)
	}
	script := string(files[sample.AgentEntrypoint])
	first, rest, _ := strings.Cut(script, "\n")
	files[sample.AgentEntrypoint] = []byte(first + "\n" +
		`for d in /dev/nvidia0 /dev/nvidiactl; do if [ -c "$d" ]; then echo "gpu-device $d"; fi; done` + "\n" + rest)
	img, err := agentimage.Build("gpu-oracle", demo.BusyboxPath, files)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: "gpu-oracle", Model: "none (busybox sh)", Deterministic: true},
		bytes.NewReader(img)); err != nil {
		t.Fatal(err)
	}

	addr := c.Addrs()[0].String()
	var cpuNodes []string
	for _, name := range []string{"cpu-1", "cpu-2"} {
		n := startNode(ctx, t, d, log, nodeOpts{name: uniqueName("gpu-" + name), coord: addr, slots: 2})
		cpuNodes = append(cpuNodes, n.ID().String())
	}
	gpuNode := startNode(ctx, t, d, log, nodeOpts{name: uniqueName("gpu-gpu"), coord: addr, slots: 2,
		gpus: []node.GPU{{Model: "NVIDIA A100-SXM4-40GB", MemoryBytes: 40 << 30}}, gpuDevices: fakeGPU()}).ID().String()
	waitFor(ctx, t, "three nodes in the coordinator's view", func() bool { return len(c.Nodes()) == 3 })

	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: gpuSuite, Agent: "gpu-oracle", Levels: []string{"easy", "hard"},
		Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: "gpu-oracle", Levels: []string{"easy", "hard"},
		Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	want := 2 * 2 * len(sample.CapsuleIDs())
	waitFor(ctx, t, "every attempt finished", func() bool {
		p := c.Progress()
		return p.Total == want && p.Done+p.Failed == p.Total
	})

	type span struct{ from, to time.Time }
	var gpuRuns []span
	onCPU := 0
	for _, a := range c.Attempts() {
		if a.State != coordinator.StateDone || a.Outcome != "ok" {
			t.Fatalf("attempt %s (%s %s %s) ended %s %s: %s", a.ID, a.Suite, a.TaskID, a.Level, a.State, a.Outcome, a.Detail)
		}
		r, _, err := c.Report(ctx, a.ID)
		if err != nil {
			t.Fatal(err)
		}
		out := string(r.GetStdoutTail())
		sawGPU := strings.Contains(out, "gpu-device /dev/nvidia0\n") && strings.Contains(out, "gpu-device /dev/nvidiactl\n")
		if a.Suite != gpuSuite {
			if sawGPU {
				t.Fatalf("CPU attempt %s on %s saw a GPU:\n%s", a.ID, a.Node, out)
			}
			if a.Node != gpuNode {
				onCPU++
			}
			continue
		}
		if a.GPUs.Count != 1 {
			t.Fatalf("GPU attempt %s needs %+v", a.ID, a.GPUs)
		}
		// Never offered to a CPU-only node: no assignment, no decline.
		for _, as := range a.Assignees {
			if as.Node != gpuNode {
				t.Fatalf("GPU attempt %s was assigned to %s, a CPU-only node (%v)", a.ID, as.Node, cpuNodes)
			}
		}
		if len(a.Declines) != 0 || len(a.Avoid) != 0 {
			t.Fatalf("GPU attempt %s was offered to nodes that declined it: %+v (avoid %v; CPU-only nodes %v)", a.ID, a.Declines, a.Avoid, cpuNodes)
		}
		if a.Node != gpuNode || !sawGPU {
			t.Fatalf("GPU attempt %s ran on %s (the GPU node is %s), saw its GPU %v:\n%s", a.ID, a.Node, gpuNode, sawGPU, out)
		}
		gpuRuns = append(gpuRuns, span{a.AssignedAt, a.FinishedAt})
	}
	if len(gpuRuns) != want/2 || onCPU == 0 {
		t.Fatalf("%d GPU attempts, %d CPU attempts on CPU-only nodes", len(gpuRuns), onCPU)
	}
	// One GPU: its jobs never overlapped.
	for i, x := range gpuRuns {
		for _, y := range gpuRuns[i+1:] {
			if x.from.Before(y.to) && y.from.Before(x.to) {
				t.Fatalf("two jobs held the one GPU at once: %v-%v and %v-%v", x.from, x.to, y.from, y.to)
			}
		}
	}
	for _, r := range flatBoard(c) {
		if (r.Suite == gpuSuite || r.Suite == demo.SuiteName) && r.Agent == "gpu-oracle" && (r.Accuracy != 1 || r.InfraFailures != 0) {
			t.Fatalf("board row %+v", r)
		}
	}
}
