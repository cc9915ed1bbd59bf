package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/demo"
)

// TestNodeNoNewPrivileges: a node process started with no_new_privs (as
// repronet-node.service's NoNewPrivileges=yes starts it), with its own
// containerd (--start-containerd, as the unit runs it: the daemon, runc
// and every job inherit the flag), runs attempts in user namespaces to
// validated results.
func TestNodeNoNewPrivileges(t *testing.T) {
	requireRoot(t)
	bin := binary(t)
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Fatalf("setpriv (util-linux) missing: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testLogger(t)
	c := startCoordinator(ctx, t, coordinator.Config{Logger: log})
	dir := t.TempDir()
	// Jobs' user namespaces map root to an unprivileged ID, which must be
	// able to pass through to their root file systems under the daemon's
	// state (as /var/lib/repronet, 0755, lets it).
	for _, d := range []string{dir, filepath.Dir(dir)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	daemonDir := filepath.Join(dir, "containerd")
	logPath := filepath.Join(dir, "node.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(setpriv, "--no-new-privs", bin, "node", "--data", filepath.Join(dir, "node"), "--coordinator", c.Addrs()[0].String(),
		"--slots", "2", "--start-containerd", daemonDir, "--namespace", "repronet-e2e-nnp", "--join-token-file", joinTokenFile(t),
		"--base-image", baseImages(t)[0])
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stopProcess(cmd)
		// The node's containerd outlives it (its own session): end it.
		if b, err := os.ReadFile(filepath.Join(daemonDir, "containerd.pid")); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 1 {
				_ = syscall.Kill(pid, syscall.SIGTERM)
				for i := 0; i < 100 && syscall.Kill(pid, 0) == nil; i++ {
					time.Sleep(100 * time.Millisecond)
				}
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("node log:\n%s", lastKB(string(b), 16))
		}
	}()
	waitFor(ctx, t, "the node in view", func() bool { return len(c.Nodes()) == 1 && c.Nodes()[0].Connected })
	b, err := os.ReadFile(filepath.Join(daemonDir, "containerd.pid"))
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/" + strings.TrimSpace(string(b)) + "/status")
	if err != nil || !strings.Contains(string(status), "NoNewPrivs:\t1") {
		t.Fatalf("the node's containerd does not run with no_new_privs (%v)", err)
	}
	nodeID := c.Nodes()[0].ID
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: "oracle", Levels: []string{"easy"}, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "every attempt finished", func() bool {
		p := c.Progress()
		return p.Total > 0 && p.Done+p.Failed == p.Total
	})
	for _, a := range c.Attempts() {
		if a.State != coordinator.StateDone || a.ReportedBy != nodeID || a.Outcome != "ok" {
			t.Fatalf("attempt %s: %s, outcome %q, reported by %q: %s", a.ID, a.State, a.Outcome, a.ReportedBy, a.Detail)
		}
	}
	for _, r := range flatBoard(c) {
		if r.Accuracy != 1 {
			t.Fatalf("oracle scored %.2f at %s under no_new_privs", r.Accuracy, r.Level)
		}
	}
}
