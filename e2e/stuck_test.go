package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/demo"
)

// cliRun is a repronet command running as a process, its output read as
// it comes, each line with the time it came.
type cliRun struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	out  []cliLine
	done chan error
}

type cliLine struct {
	at   time.Time
	text string
}

// startCLI runs `repronet args...` with env added to the test's.
func startCLI(ctx context.Context, t *testing.T, env []string, args ...string) *cliRun {
	t.Helper()
	r := &cliRun{cmd: exec.CommandContext(ctx, binary(t), args...), done: make(chan error, 1)}
	r.cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	r.cmd.Stderr = &stderr
	pipe, err := r.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(pipe)
		for sc.Scan() {
			r.mu.Lock()
			r.out = append(r.out, cliLine{time.Now(), sc.Text()})
			r.mu.Unlock()
		}
		err := r.cmd.Wait()
		if err != nil {
			err = fmt.Errorf("%w: %s", err, stderr.String())
		}
		r.done <- err
	}()
	return r
}

// first is when a line containing s came (zero: none yet).
func (r *cliRun) first(s string) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.out {
		if strings.Contains(l.text, s) {
			return l.at
		}
	}
	return time.Time{}
}

func (r *cliRun) text() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, l := range r.out {
		fmt.Fprintf(&b, "%s %s\n", l.at.Format("15:04:05.000"), l.text)
	}
	return b.String()
}

// TestUnschedulable: the only nodes cannot run a submitter's work (issue
// 23), and it ends, with outcome "unschedulable" and the reason, within
// the coordinator's bound, while the submitter's `repronet eval start
// --watch` says why it waits. Two real nodes on loopback, on the real
// daemon, given no base image and no registry:
//
//   - a suite whose limits (64 cores, 64 GiB) exceed every slot in view:
//     never offered, it ends once the bound (20 s here) has passed;
//   - CORE-Bench Medium, whose capsule environment is built FROM a base
//     image neither node has nor can pull: each node fails it (an
//     infrastructure failure it reports), and once both have it ends at
//     once, with what they said, long before the bound and without a
//     third try.
//
// Neither is charged to a node (no decline, no lost lease) nor counted
// as a wrong answer (the board counts the runs as infra_failed, never
// scored).
func TestUnschedulable(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const bound = 20 * time.Second
	const admin = "stuck-test-admin-token-0123456789"
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-stuck")
	c := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, AdminToken: admin, IdleCanaryEvery: -1,
		ScheduleInterval: 200 * time.Millisecond, UnschedulableAfter: bound})
	def, err := family.Def("sample-big", sample.Tasks(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportSuite(ctx, def, coordinator.WithSuiteLimits(coordinator.SuiteLimits{CPUMillis: 64000, MemoryBytes: 64 << 30,
		WallSeconds: 600})); err != nil {
		t.Fatal(err)
	}
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
	api := httptest.NewServer(c.Handler())
	defer api.Close()
	for i := range 2 {
		startNode(ctx, t, d, log, nodeOpts{name: uniqueName(fmt.Sprintf("stuck-%d", i+1)), coord: c.Addrs()[0].String(),
			network: network, noBaseImages: true})
	}
	waitFor(ctx, t, "two nodes in view", func() bool { return len(c.Nodes()) == 2 })

	// The operator makes a group and a submitter; the submitter pushes
	// the sample oracle as its agent, with the CLI.
	dir := t.TempDir()
	adminFile := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(adminFile, []byte(admin), 0o600); err != nil {
		t.Fatal(err)
	}
	cli := func(env []string, args ...string) string {
		t.Helper()
		cmd := exec.CommandContext(ctx, binary(t), args...)
		cmd.Env = append(os.Environ(), env...)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("repronet %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	apiEnv := []string{"REPRONET_API=" + api.URL, "REPRONET_TOKEN="}
	cli(apiEnv, "admin", "group", "add", "lab", "--token-file", adminFile)
	token := regexp.MustCompile(`rns_[0-9a-f]{12}_[A-Za-z0-9_-]{43}`).FindString(cli(apiEnv, "admin", "submitter", "add", "ann",
		"--group", "lab", "--token-file", adminFile))
	if token == "" {
		t.Fatal("no submitter token")
	}
	img, err := demo.AgentImage("oracle", demo.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	imgFile := filepath.Join(dir, "oracle.tar")
	if err := os.WriteFile(imgFile, img, 0o644); err != nil {
		t.Fatal(err)
	}
	sub := []string{"REPRONET_API=" + api.URL, "REPRONET_TOKEN=" + token}
	cli(sub, "agent", "push", "lab-oracle", imgFile, "--deterministic")

	start := time.Now()
	big := startCLI(ctx, t, sub, "eval", "start", "--suite", "sample-big", "--agent", "lab-oracle", "--levels", "easy", "--id", "ev-big",
		"--watch", "--every", "1s")
	medium := startCLI(ctx, t, sub, "eval", "start", "--suite", mediumSuite, "--agent", "lab-oracle", "--levels", "medium", "--id",
		"ev-medium", "--watch", "--every", "1s")
	for name, r := range map[string]*cliRun{"big": big, "medium": medium} {
		select {
		case err := <-r.done:
			if err != nil {
				t.Fatalf("eval start --watch (%s): %v\n%s", name, err, r.text())
			}
		case <-ctx.Done():
			t.Fatalf("eval start --watch (%s) still waits:\n%s", name, r.text())
		}
	}
	t.Logf("sample-big:\n%s", big.text())
	t.Logf("medium:\n%s", medium.text())

	// While it waited, the submitter was told why, and until when.
	waited := big.first("waiting (3 attempts): none of the 2 nodes in view can run it: 2 have slots too small for its limits " +
		"(it needs 64000 mCPU, 64.0 GiB of memory; the largest slot offers 1000 mCPU, 4.0 GiB of memory); " +
		"they end unschedulable at ")
	if waited.IsZero() || waited.Sub(start) > bound/2 {
		t.Errorf("the reason came at %v (after %v), want early in the wait", waited, waited.Sub(start))
	}
	for _, want := range []string{"3 attempts unschedulable: none of the 2 nodes in view can run it", "(for 2"} {
		if big.first(want).IsZero() {
			t.Errorf("sample-big: no %q", want)
		}
	}
	if medium.first("unschedulable: 2 of 2 eligible nodes failed it").IsZero() || medium.first("pulls from no registry").IsZero() {
		t.Errorf("medium: no reason for the end")
	}
	// Their board rows have no accuracy (not 0%).
	for name, r := range map[string]*cliRun{"big": big, "medium": medium} {
		if !regexp.MustCompile(`lab-oracle\s+-\s+-\s+-\s+-\s+-\s+0\s`).MatchString(r.text()) {
			t.Errorf("%s: the board row shows an accuracy", name)
		}
	}

	// Each attempt ended with the reason, in time; nothing was charged to
	// a node; the board has no score for them.
	for _, a := range c.Attempts() {
		if a.State != coordinator.StateFailed && a.State != coordinator.StateCancelled {
			t.Errorf("attempt %s of %s: %s", a.ID, a.Eval, a.State)
			continue
		}
		if a.State == coordinator.StateCancelled {
			continue
		}
		took := a.FinishedAt.Sub(a.EnqueuedAt)
		switch a.Eval {
		case "ev-big":
			if a.Outcome != coordinator.OutcomeUnschedulable || !strings.Contains(a.Detail, "too small for its limits") ||
				len(a.Assignees) != 0 || took < bound || took > bound+10*time.Second {
				t.Errorf("attempt %s: %s %q after %v, %d assignments; want unschedulable after %v", a.ID, a.Outcome, a.Detail, took,
					len(a.Assignees), bound)
			}
		case "ev-medium":
			if a.Outcome != coordinator.OutcomeUnschedulable || !strings.Contains(a.Detail, "2 of 2 eligible nodes failed it") ||
				!strings.Contains(a.Detail, "pulls from no registry") || a.InfraFailures != 2 || took >= bound {
				t.Errorf("attempt %s: %s %q after %v, %d infrastructure failures; want unschedulable after both nodes failed it",
					a.ID, a.Outcome, a.Detail, took, a.InfraFailures)
			}
		}
	}
	for _, n := range c.Nodes() {
		if r := n.Record; r != nil && (r.Declined != 0 || r.LeaseLost != 0) {
			t.Errorf("node %s charged: %+v", n.ID, r)
		}
	}
	for _, r := range flatBoard(c) {
		if r.Agent == "lab-oracle" && (r.Validated != 0 || r.Accuracy != 0 || r.InfraFailures == 0) {
			t.Errorf("board row %+v: want its runs infra_failed, unscored", r)
		}
	}
}
