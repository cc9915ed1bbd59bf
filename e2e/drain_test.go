package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/node"
)

// addSleeper registers agent name, which sleeps secs and then writes an
// empty report.json: work that is still running when its node is told to
// stop.
func addSleeper(ctx context.Context, t *testing.T, c *coordinator.Coordinator, name string, secs int) {
	t.Helper()
	script := fmt.Sprintf("#!/bin/sh\nsleep %d\necho '{}' > /workspace/report.json\n", secs)
	img, err := agentimage.Build(name, agentimage.BusyboxPath, map[string][]byte{agentimage.Entrypoint: []byte(script)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: name, Model: "none (sleeps)"}, bytes.NewReader(img)); err != nil {
		t.Fatal(err)
	}
}

// nodeRecord is the coordinator's record of node (failing the test
// without one).
func nodeRecord(t *testing.T, c *coordinator.Coordinator, id string) coordinator.NodeInfo {
	t.Helper()
	for _, n := range c.Nodes() {
		if n.ID == id && n.Record != nil {
			return n
		}
	}
	t.Fatalf("no record of node %s", id)
	return coordinator.NodeInfo{}
}

// sameCharges fails the test if what counts against a node changed: its
// allowance, lost leases, infrastructure errors, reliability.
func sameCharges(t *testing.T, before, after coordinator.NodeInfo) {
	t.Helper()
	b, a := before.Record, after.Record
	if a.Allowance != b.Allowance || a.LeaseLost != b.LeaseLost || a.InfraErrors != b.InfraErrors || a.ConsecutiveOK != b.ConsecutiveOK ||
		after.Reliability != before.Reliability {
		t.Fatalf("the node was charged: before %+v (reliability %.3f), after %+v (reliability %.3f)", *b, before.Reliability, *a, after.Reliability)
	}
}

// TestDrainLetsAttemptFinish: a node told to drain while an attempt runs
// takes nothing more, lets the attempt finish and its report be counted,
// and nothing is charged to it.
func TestDrainLetsAttemptFinish(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)
	c := startCoordinator(ctx, t, coordinator.Config{Logger: log})
	addSleeper(ctx, t, c, "sleep4", 4)
	n := startNode(ctx, t, d, log, nodeOpts{name: "drain-finish", coord: c.Addrs()[0].String(), slots: 1})
	id := n.ID().String()
	waitFor(ctx, t, "the node in view", func() bool { return len(c.Nodes()) == 1 && c.Nodes()[0].Connected })
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: "sleep4", Levels: []string{"easy"}, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	var attempt string
	waitFor(ctx, t, "the attempt running", func() bool {
		st := n.Status(ctx)
		if len(st.Running) == 1 && st.Running[0].Phase == "running" {
			attempt = st.Running[0].Attempt
			return true
		}
		return false
	})
	before := nodeRecord(t, c, id)
	res := n.Drain(ctx, 90*time.Second)
	if res.Finished != 1 || len(res.HandedBack) != 0 || len(res.NotHandedBack) != 0 || res.Undelivered != 0 {
		t.Fatalf("drain: %+v, want the running attempt finished and reported", res)
	}
	a, ok := c.Attempt(attempt)
	if !ok || a.ReportedBy != id || (a.State != coordinator.StateReported && a.State != coordinator.StateDone) {
		t.Fatalf("attempt %s after the drain: %+v", attempt, a)
	}
	for _, other := range c.Attempts() {
		if other.ID != attempt && other.Node == id {
			t.Fatalf("a draining node was given %s (%s)", other.ID, other.State)
		}
	}
	after := nodeRecord(t, c, id)
	if after.Record.LeaseLost != before.Record.LeaseLost || after.Record.Completed != before.Record.Completed+1 || after.Record.HandedBack != 0 {
		t.Fatalf("record before %+v, after %+v", *before.Record, *after.Record)
	}
}

// TestNodeProcessHandsBack: a node process with an attempt running is
// drained with `repronet node drain` (its control socket), then resumed,
// then stopped with SIGTERM. Each time, the attempt that still runs at the
// grace's end is handed back: the coordinator requeues it at once (not
// when its lease runs out), and the node's record is not charged.
func TestNodeProcessHandsBack(t *testing.T) {
	requireRoot(t)
	bin := binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)
	const ttl = 30 * time.Second
	c := startCoordinator(ctx, t, coordinator.Config{Logger: log, LeaseTTL: ttl})
	addSleeper(ctx, t, c, "sleep600", 600)

	dir := t.TempDir()
	data := filepath.Join(dir, "node")
	metrics := freePort(t)
	logPath := filepath.Join(dir, "node.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	const grace = 3 * time.Second
	cmd := exec.Command(bin, "node", "--data", data, "--coordinator", c.Addrs()[0].String(), "--slots", "1",
		"--containerd", d.Socket, "--namespace", "repronet-e2e-handback", "--join-token-file", joinTokenFile(t),
		"--base-image", baseImages(t)[0], "--metrics", metrics, "--drain-grace", grace.String())
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("node log:\n%s", lastKB(string(b), 16))
		}
	}()
	waitFor(ctx, t, "the node in view", func() bool { return len(c.Nodes()) == 1 && c.Nodes()[0].Connected })
	id := c.Nodes()[0].ID
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: "sleep600", Levels: []string{"easy"}, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	running := func() string {
		var attempt string
		waitFor(ctx, t, "an attempt running on the node", func() bool {
			st, err := nodeStatus(ctx, metrics)
			if err == nil && len(st.Running) == 1 && st.Running[0].Phase == "running" {
				attempt = st.Running[0].Attempt
				return true
			}
			return false
		})
		return attempt
	}
	// handedBack checks that attempt went back to the queue at once,
	// uncharged, its lease still good when it did.
	handedBack := func(attempt string, asked time.Time, before coordinator.NodeInfo, backs int) {
		t.Helper()
		a, ok := c.Attempt(attempt)
		if !ok || a.State != coordinator.StateQueued || a.LeaseLosses != 0 || !strings.Contains(a.Detail, "handed back") {
			t.Fatalf("attempt %s after the hand-back: %s, %d lost leases, %q", attempt, a.State, a.LeaseLosses, a.Detail)
		}
		if took := time.Since(asked); took >= ttl {
			t.Fatalf("requeued %v after the node was asked to stop: not before its lease (%v) could run out", took, ttl)
		}
		after := nodeRecord(t, c, id)
		sameCharges(t, before, after)
		if after.Record.HandedBack != backs {
			t.Fatalf("record counts %d hand-backs, want %d", after.Record.HandedBack, backs)
		}
	}

	// 1. repronet node drain, over the node's control socket.
	first := running()
	before := nodeRecord(t, c, id)
	asked := time.Now()
	out, err := exec.CommandContext(ctx, bin, "node", "drain", "--data", data, "--grace", "1s").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "1 handed back") {
		t.Fatalf("repronet node drain: %v\n%s", err, out)
	}
	if took := time.Since(asked); took < time.Second {
		t.Fatalf("drained in %v: the attempt was not given its grace", took)
	}
	handedBack(first, asked, before, 1)
	if st, err := nodeStatus(ctx, metrics); err != nil || !st.Draining || len(st.Running) != 0 {
		t.Fatalf("after drain: %+v %v", st, err)
	}
	time.Sleep(2 * time.Second) // announcements go on: still nothing given to it
	if st, _ := nodeStatus(ctx, metrics); len(st.Running) != 0 {
		t.Fatalf("a drained node took %+v", st.Running)
	}

	// 2. repronet node resume: it takes work again (another attempt: the
	// one it gave back keeps off it a while).
	if out, err := exec.CommandContext(ctx, bin, "node", "resume", "--data", data).CombinedOutput(); err != nil {
		t.Fatalf("repronet node resume: %v\n%s", err, out)
	}
	second := running()
	if second == first {
		t.Fatalf("the attempt it handed back came back to it at once")
	}

	// 3. SIGTERM: the node drains for its grace, hands back, exits.
	before = nodeRecord(t, c, id)
	asked = time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the node exited with %v", err)
		}
	case <-time.After(grace + 30*time.Second):
		t.Fatalf("the node did not exit within %v of SIGTERM", grace+30*time.Second)
	}
	if took := time.Since(asked); took < grace {
		t.Fatalf("stopped %v after SIGTERM: the attempt was not given its grace of %v", took, grace)
	}
	handedBack(second, asked, before, 2)
	logText, _ := os.ReadFile(logPath)
	if !strings.Contains(string(logText), "attempt handed back") {
		t.Fatalf("the node's log does not say it handed back")
	}
}

// nodeStatus reads a node process's status from its --metrics address.
func nodeStatus(ctx context.Context, addr string) (node.Status, error) {
	var st node.Status
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/status", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return st, fmt.Errorf("GET /status: %s", resp.Status)
	}
	return st, json.NewDecoder(resp.Body).Decode(&st)
}
