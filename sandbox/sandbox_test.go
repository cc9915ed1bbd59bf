package sandbox

import (
	"bytes"
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	tasksapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/identifiers"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"

	"github.com/repronet/repronet/sandbox/loopfs"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// The tests run against a real private containerd. They fail, never skip,
// when it cannot be started: CI relies on EnsureDaemon installing what it needs.
const (
	testDaemonDir = "/var/lib/repronet/containerd-test"
	testNamespace = "repronet-sandbox-test"
	testImageRef  = "repronet.local/test/busybox:1"
	busyboxPath   = "/bin/busybox"
	// testLockFile serialises the test binaries of sandbox and sandbox/netns.
	testLockFile = "/var/lib/repronet/sandbox-tests.lock"
)

// Shared by the tests; set up once in TestMain.
var (
	testRunner *Runner
	testImage  string
	testSocket string
)

func TestMain(m *testing.M) {
	// The crash test re-executes this binary as a "node" that it kills.
	if os.Getenv(crashHelperEnv) != "" {
		os.Exit(crashHelper())
	}
	os.Exit(testMain(m))
}

func testMain(m *testing.M) int {
	flag.Parse()
	log := slog.New(slog.DiscardHandler)
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute) // apt-get may be slow
	defer cancel()
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "FAIL: sandbox test setup: "+format+"\n", args...)
		return 1
	}

	// One sandbox or netns test binary at a time on this machine: they
	// share the test daemon's namespace, the state folder and the names of
	// the test network namespaces (go test ./... runs packages in parallel,
	// and several developers may share the machine).
	lctx, lcancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer lcancel()
	if err := os.MkdirAll(filepath.Dir(testLockFile), 0o755); err != nil {
		return fail("%v", err)
	}
	unlock, err := lockFile(lctx, testLockFile)
	if err != nil {
		return fail("wait for other sandbox test runs: %v", err)
	}
	defer unlock()

	if _, err := os.Stat(busyboxPath); err != nil {
		if err := aptInstall(ctx, log, "busybox-static"); err != nil {
			return fail("install busybox-static: %v", err)
		}
	}
	d, err := EnsureDaemon(ctx, testDaemonDir, log)
	if err != nil {
		return fail("start containerd: %v", err)
	}
	testSocket = d.Socket
	if err := EnsureTools(ctx, log); err != nil {
		return fail("host programs: %v", err)
	}
	// The daemon is left running: other test binaries may share it, and the
	// next run reuses it. Only this package's namespace is touched.
	r, err := New(ctx, d.Socket, WithNamespace(testNamespace), WithLogger(log))
	if err != nil {
		return fail("connect: %v", err)
	}
	defer r.Close()
	if n, err := r.Reconcile(ctx); err != nil {
		return fail("reconcile leftovers of an earlier run: %v", err)
	} else if n > 0 {
		fmt.Fprintf(os.Stderr, "removed %d leftovers of an earlier run\n", n)
	}
	ref, err := importTestImage(ctx, r)
	if err != nil {
		return fail("%v", err)
	}
	testRunner, testImage = r, ref

	forwarding := forwardingState()
	code := m.Run()
	// The tests switch forwarding on only for interfaces they make.
	for dev, was := range forwarding {
		if now, ok := forwardingState()[dev]; ok && now != was {
			fmt.Fprintf(os.Stderr, "FAIL: IPv4 forwarding of host interface %s changed from %s to %s\n", dev, was, now)
			code = 1
		}
	}

	// Whatever ran, nothing of ours may be left behind.
	var left []string
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if left, err = leftovers(ctx, r); err != nil {
			return fail("list leftovers: %v", err)
		}
		if len(left) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(left) > 0 {
		return fail("left behind after the tests: %v", left)
	}
	return code
}

// forwardingState reads the IPv4 forwarding switch of every host interface.
func forwardingState() map[string]string {
	out := map[string]string{}
	entries, _ := os.ReadDir("/proc/sys/net/ipv4/conf")
	for _, e := range entries {
		if b, err := os.ReadFile(filepath.Join("/proc/sys/net/ipv4/conf", e.Name(), "forwarding")); err == nil {
			out[e.Name()] = strings.TrimSpace(string(b))
		}
	}
	return out
}

// importTestImage builds the busybox test image and imports it.
func importTestImage(ctx context.Context, r *Runner) (string, error) {
	files, err := ociimage.BusyboxFiles(busyboxPath)
	if err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := ociimage.Build(pw, testImageRef, files, ociimage.Config{
			Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/bin:/usr/bin", "HOME=/home/agent"}, WorkingDir: "/home/agent",
		})
		pw.CloseWithError(err)
	}()
	ref, err := r.ImportImage(ctx, pr)
	if err != nil {
		return "", fmt.Errorf("import busybox image: %w", err)
	}
	return ref, nil
}

// leftovers lists everything of r's that an attempt can leave behind:
// containers, tasks and snapshots in containerd; on the host, mounts and
// loop devices under the state folder, state folders, network namespaces
// and nftables tables with r's tag, attempt veths, and ID range claims.
func leftovers(ctx context.Context, r *Runner) ([]string, error) {
	ctx = r.nsCtx(ctx)
	var out []string
	ctrs, err := r.client.Containers(ctx, fmt.Sprintf("labels.%q", LabelAttempt))
	if err != nil {
		return nil, err
	}
	for _, c := range ctrs {
		out = append(out, "container "+c.ID())
	}
	tasks, err := r.client.TaskService().List(ctx, &tasksapi.ListTasksRequest{})
	if err != nil {
		return nil, err
	}
	for _, t := range tasks.Tasks {
		out = append(out, "task "+t.ID)
	}
	err = r.client.SnapshotService(r.snapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if _, ok := info.Labels[LabelAttempt]; ok {
			out = append(out, "snapshot "+info.Name)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	mounts, err := loopfs.MountsUnder(r.stateDir)
	if err != nil {
		return nil, err
	}
	for _, m := range mounts {
		out = append(out, "mount "+m)
	}
	devs, err := loopfs.DevicesBackedBy(func(p string) bool { return strings.HasPrefix(p, r.stateDir+"/") })
	if err != nil {
		return nil, err
	}
	for _, d := range devs {
		out = append(out, "loop device "+d)
	}
	entries, err := os.ReadDir(r.stateDir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		out = append(out, "state "+e.Name())
	}
	m, err := r.netManager(ctx, false)
	if err != nil {
		return nil, err
	}
	if m != nil {
		o, err := m.Owned(ctx)
		if err != nil {
			return nil, err
		}
		for _, k := range o.Keys {
			out = append(out, "netns "+m.Names(k).Netns)
		}
		for _, t := range o.Tables {
			out = append(out, "nftables table "+t)
		}
	}
	owners, err := r.ids.Owners(ctx)
	if err != nil {
		return nil, err
	}
	for _, o := range owners {
		if strings.HasPrefix(o, r.tag+"/") {
			out = append(out, "id range "+o)
		}
	}
	links, err := os.ReadDir("/sys/class/net")
	if err != nil {
		return nil, err
	}
	for _, l := range links {
		if isAttemptVeth(l.Name()) {
			out = append(out, "link "+l.Name())
		}
	}
	return out, nil
}

// isAttemptVeth matches the host-end names netns gives attempt veths ("rn"
// and 13 hex digits), whichever Runner made them.
func isAttemptVeth(name string) bool {
	if len(name) != 15 || !strings.HasPrefix(name, "rn") {
		return false
	}
	_, err := hex.DecodeString(name[2:14])
	return err == nil && strings.Trim(name[14:], "0123456789abcdef") == ""
}

// waitNoLeftovers polls leftovers for up to a few seconds: the kernel frees
// some objects (a loop device after its last mount) asynchronously.
func waitNoLeftovers(t *testing.T, r *Runner) {
	t.Helper()
	var left []string
	var err error
	start := time.Now()
	for deadline := start.Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if left, err = leftovers(context.Background(), r); err == nil && len(left) == 0 {
			return
		}
		if time.Since(start) < 60*time.Millisecond {
			t.Logf("not gone yet: %v (err %v)", left, err)
		}
	}
	t.Fatalf("left behind: %v (err %v)", left, err)
}

// run runs args in the busybox image with the given limits and fails the
// test on an infrastructure error.
func run(t *testing.T, lim Limits, args ...string) Result {
	t.Helper()
	res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage, Args: args, Limits: lim})
	if err != nil {
		t.Fatalf("Run: %v (result %+v)", err, res)
	}
	return res
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

func TestRunOK(t *testing.T) {
	res := run(t, Limits{}, sh(`echo hello; echo oops >&2; id -u; id -g; pwd; touch /tmp/x && echo tmp-ok`)...)
	if res.Outcome != OutcomeOK || res.ExitCode != 0 {
		t.Fatalf("outcome %s exit %d (%s); stderr %q", res.Outcome, res.ExitCode, res.Detail, res.Stderr)
	}
	if got, want := string(res.Stdout), "hello\n1000\n1000\n/home/agent\ntmp-ok\n"; got != want {
		t.Fatalf("stdout %q, want %q", got, want)
	}
	if string(res.Stderr) != "oops\n" || res.StdoutTruncated || res.StderrTruncated {
		t.Fatalf("stderr %q, truncated %v/%v", res.Stderr, res.StdoutTruncated, res.StderrTruncated)
	}
	if res.PeakMemoryBytes == 0 || res.CPUSeconds <= 0 || res.Wall <= 0 {
		t.Fatalf("resource use not measured: cpu %v s, peak %d B, wall %v", res.CPUSeconds, res.PeakMemoryBytes, res.Wall)
	}
}

func TestRunImageDefaults(t *testing.T) {
	// No Args: the image's Cmd (/bin/sh) runs; it reads no stdin and exits 0.
	// Env and Cwd from the Spec override the image's.
	res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage,
		Env: []string{"GREETING=hi"}, Cwd: "/tmp", User: "0:0", Limits: Limits{Wall: 10 * time.Second}})
	if err != nil || res.Outcome != OutcomeOK {
		t.Fatalf("image defaults: %v %+v", err, res)
	}
	res, err = testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage,
		Args: sh(`echo "$GREETING $PWD $(id -u):$(id -g) $HOME"`), Env: []string{"GREETING=hi"}, Cwd: "/tmp", User: "0:0"})
	if err != nil || res.Outcome != OutcomeOK {
		t.Fatalf("env/cwd/user: %v %+v", err, res)
	}
	if got, want := string(res.Stdout), "hi /tmp 0:0 /home/agent\n"; got != want {
		t.Fatalf("stdout %q, want %q", got, want)
	}
}

func TestHardening(t *testing.T) {
	// Containerd's (Docker's) default capability set: CHOWN DAC_OVERRIDE
	// FOWNER FSETID KILL SETGID SETUID SETPCAP NET_BIND_SERVICE NET_RAW
	// SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP.
	const defaultCaps = "00000000a80425fb"
	script := sh(`grep -E '^(NoNewPrivs|Seccomp|CapEff|CapBnd):' /proc/self/status | tr -s '\t ' ' '; ` +
		`touch /sys/fs/cgroup/memory/x 2>/dev/null && echo cgroupfs-writable; ` +
		`echo 1 > /proc/sys/kernel/panic 2>/dev/null && echo procsys-writable; ` +
		`mount -t tmpfs none /mnt 2>/dev/null && echo mounted; true`)
	// In a user namespace, root has the default set without NET_RAW.
	const usernsCaps = "00000000a80405fb"
	for _, tc := range []struct {
		user           string
		userns         bool
		capEff, capBnd string
	}{
		{"", false, "0000000000000000", defaultCaps}, // the default agent user, 1000:1000
		{"0:0", false, defaultCaps, defaultCaps},     // root in the container: the default set, no more
		{"", true, usernsCaps, usernsCaps},           // root in its user namespace (the default user there)
		{"1000:1000", true, "0000000000000000", usernsCaps},
	} {
		res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage, Args: script, User: tc.user,
			UserNamespace: tc.userns})
		want := "CapEff: " + tc.capEff + "\nCapBnd: " + tc.capBnd + "\nNoNewPrivs: 1\nSeccomp: 2\n"
		if err != nil || res.Outcome != OutcomeOK || string(res.Stdout) != want {
			t.Fatalf("user %q (user namespace %v): %v %s, stdout %q, want %q", tc.user, tc.userns, err, res.Outcome, res.Stdout, want)
		}
	}
}

func TestRunExitCode(t *testing.T) {
	res := run(t, Limits{}, sh(`echo failing >&2; exit 3`)...)
	if res.Outcome != OutcomeAgentError || res.ExitCode != 3 || string(res.Stderr) != "failing\n" {
		t.Fatalf("got %s exit %d stderr %q, want agent_error 3", res.Outcome, res.ExitCode, res.Stderr)
	}
}

func TestRunExecFailure(t *testing.T) {
	for _, cmd := range []string{"/no/such/binary", "/etc/passwd", "nosuchcommand"} {
		res := run(t, Limits{}, cmd)
		if res.Outcome != OutcomeAgentError || res.ExitCode != 127 {
			t.Fatalf("%s: got %s exit %d (%s), want agent_error 127", cmd, res.Outcome, res.ExitCode, res.Detail)
		}
		if res.Wall <= 0 {
			t.Fatalf("%s: wall time %s: a run of no time at all is what the cross-check takes for a lie", cmd, res.Wall)
		}
	}
}

func TestLimitsVisible(t *testing.T) {
	const mem = 64 << 20
	// runc on a cgroup v1 host without a cgroup namespace bind-mounts the
	// container's own cgroup of each controller at /sys/fs/cgroup/<controller>.
	res := run(t, Limits{CPUMillis: 1000, MemoryBytes: mem, Pids: 77}, sh(`cd /sys/fs/cgroup && cat `+
		`cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us memory/memory.limit_in_bytes memory/memory.memsw.limit_in_bytes pids/pids.max; `+
		`grep -c . cpuset/cpuset.cpus`)...)
	if res.Outcome != OutcomeOK {
		t.Fatalf("outcome %s (%s), stderr %q", res.Outcome, res.Detail, res.Stderr)
	}
	got := strings.Fields(string(res.Stdout))
	want := []string{"100000", "100000", strconv.Itoa(mem), strconv.Itoa(mem), "77", "1"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("cgroup values %q, want %q (stderr %q)", got, want, res.Stderr)
	}
}

func TestCPUQuota(t *testing.T) {
	// Two busy loops under a quarter-CPU quota for 1.2 s use about 0.3
	// CPU-seconds; unthrottled they would use over a CPU-second even on a
	// loaded machine. (TestLimitsVisible checks that 1000 millis is 100000/100000.)
	wall := 1200 * time.Millisecond
	res := run(t, Limits{CPUMillis: 250, Wall: wall}, sh(`while :; do :; done & while :; do :; done`)...)
	if res.Outcome != OutcomeTimeout {
		t.Fatalf("outcome %s (%s)", res.Outcome, res.Detail)
	}
	// The bound follows the measured wall time: the kill at the limit
	// takes a moment on a loaded machine, and the quota runs until then.
	if max := 0.25*max(wall, res.Wall).Seconds()*1.3 + 0.05; res.CPUSeconds > max || res.CPUSeconds < 0.05 {
		t.Fatalf("CPU %.2f s in %v: outside (0.05, %.2f)", res.CPUSeconds, res.Wall, max)
	}
	t.Logf("CPU %.2f s in %v", res.CPUSeconds, res.Wall)
}

func TestTimeout(t *testing.T) {
	start := time.Now()
	res := run(t, Limits{Wall: time.Second}, "sleep", "30")
	took := time.Since(start)
	if res.Outcome != OutcomeTimeout || res.ExitCode != 137 {
		t.Fatalf("outcome %s exit %d (%s), want timeout 137", res.Outcome, res.ExitCode, res.Detail)
	}
	if took >= 2500*time.Millisecond || res.Wall < time.Second || res.Wall > 2*time.Second {
		t.Fatalf("Run took %v, attempt wall %v; want the kill at 1 s", took, res.Wall)
	}
}

func TestOOM(t *testing.T) {
	// awk doubles a string until the 32 MiB limit (no swap) stops it. The
	// shell then exits 0: only the OOM watch can tell.
	res := run(t, Limits{MemoryBytes: 32 << 20}, sh(`awk 'BEGIN { s = "x"; while (1) s = s s }'; echo awk=$?; exit 0`)...)
	if res.Outcome != OutcomeOOM {
		t.Fatalf("outcome %s exit %d (%s), stdout %q, want oom", res.Outcome, res.ExitCode, res.Detail, res.Stdout)
	}
	if res.ExitCode != 0 || string(res.Stdout) != "awk=137\n" {
		t.Fatalf("exit %d stdout %q: expected the shell to survive the kill of its child", res.ExitCode, res.Stdout)
	}
	if res.PeakMemoryBytes < 16<<20 || res.PeakMemoryBytes > 32<<20 {
		t.Fatalf("peak memory %d outside (16 MiB, 32 MiB]", res.PeakMemoryBytes)
	}
}

func TestNoNetwork(t *testing.T) {
	res := run(t, Limits{}, sh(`ls /sys/class/net; ip -o link | cut -d: -f2; cat /proc/net/route | wc -l; hostname`)...)
	if res.Outcome != OutcomeOK {
		t.Fatalf("outcome %s (%s), stderr %q", res.Outcome, res.Detail, res.Stderr)
	}
	// Interfaces: lo only; routing table: the header line only.
	if got, want := strings.Fields(string(res.Stdout)), []string{"lo", "lo", "1", "sandbox"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("network view %q, want %q", got, want)
	}
}

func TestOutputCap(t *testing.T) {
	const keep = 4096
	res := run(t, Limits{OutputBytes: keep}, sh(`seq 1 170000; seq 1 100 >&2`)...)
	if res.Outcome != OutcomeOK {
		t.Fatalf("outcome %s (%s)", res.Outcome, res.Detail)
	}
	var full bytes.Buffer
	for i := 1; i <= 170000; i++ {
		fmt.Fprintf(&full, "%d\n", i)
	}
	if full.Len() < 1<<20 {
		t.Fatalf("test prints only %d bytes", full.Len())
	}
	want := full.Bytes()[full.Len()-keep:]
	if !bytes.Equal(res.Stdout, want) || !res.StdoutTruncated {
		t.Fatalf("stdout kept %d bytes (truncated %v), want the last %d: %q...", len(res.Stdout), res.StdoutTruncated, keep, res.Stdout[:min(40, len(res.Stdout))])
	}
	var errs bytes.Buffer
	for i := 1; i <= 100; i++ {
		fmt.Fprintf(&errs, "%d\n", i)
	}
	if !bytes.Equal(res.Stderr, errs.Bytes()) || res.StderrTruncated {
		t.Fatalf("stderr %q truncated %v", res.Stderr, res.StderrTruncated)
	}
}

func TestOutputFlood(t *testing.T) {
	// OutputBytes 1 KiB: killed once the streams pass 1 MiB together.
	res := run(t, Limits{OutputBytes: 1024, Wall: 20 * time.Second}, "yes", "flood")
	if res.Outcome != OutcomeOutputLimit || len(res.Stdout) != 1024 || !res.StdoutTruncated {
		t.Fatalf("outcome %s (%s), %d bytes kept, truncated %v", res.Outcome, res.Detail, len(res.Stdout), res.StdoutTruncated)
	}
	if res.Wall > 10*time.Second {
		t.Fatalf("flood took %v to stop", res.Wall)
	}
}

func TestMounts(t *testing.T) {
	dir := t.TempDir()
	out, in := filepath.Join(dir, "out"), filepath.Join(dir, "in")
	for _, d := range []string{out, in} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chown(out, 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(in, 0o777); err != nil { // writable but for the read-only mount
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(in, "data"), []byte("input\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := testRunner.Run(context.Background(), Spec{
		ID: t.Name(), Image: testImage,
		Args:   sh(`cat /in/data && echo result > /out/answer && if touch /in/new 2>/dev/null; then echo ro-broken; fi`),
		Mounts: []Mount{{Source: out, Target: "/out"}, {Source: in, Target: "/in", ReadOnly: true}},
	})
	if err != nil || res.Outcome != OutcomeOK {
		t.Fatalf("run: %v %+v stderr %q", err, res, res.Stderr)
	}
	if string(res.Stdout) != "input\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	got, err := os.ReadFile(filepath.Join(out, "answer"))
	if err != nil || string(got) != "result\n" {
		t.Fatalf("host sees %q, %v", got, err)
	}
	if _, err := os.Stat(filepath.Join(in, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("read-only mount was written: %v", err)
	}
}

func TestCancelCleansUp(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	res, err := testRunner.Run(ctx, Spec{ID: t.Name(), Image: testImage, Args: []string{"sleep", "30"}})
	if err == nil || !errors.Is(err, context.Canceled) || res.Outcome != OutcomeInfraError {
		t.Fatalf("got %v %s, want a context.Canceled infra error", err, res.Outcome)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("cancel took %v", took)
	}
	_, err = testRunner.client.LoadContainer(testRunner.nsCtx(context.Background()), containerID(t.Name()))
	if !errdefs.IsNotFound(err) {
		t.Fatalf("container still there after cancel: %v", err)
	}
}

func TestInfraErrors(t *testing.T) {
	for name, spec := range map[string]Spec{
		"missing image": {ID: t.Name() + "-1", Image: "repronet.local/no/such:image", Args: []string{"true"}},
		"bad mount":     {ID: t.Name() + "-2", Image: testImage, Mounts: []Mount{{Source: "/no/such/dir", Target: "/x"}}},
		"no id":         {Image: testImage},
	} {
		res, err := testRunner.Run(context.Background(), spec)
		if err == nil || res.Outcome != OutcomeInfraError || res.Detail == "" {
			t.Errorf("%s: got %v, %s %q; want an infra error", name, err, res.Outcome, res.Detail)
		}
	}
	// The daemon unreachable: a Runner whose connection is gone.
	r, err := New(context.Background(), testSocket, WithNamespace(testNamespace), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	r.Close()
	res, err := r.Run(context.Background(), Spec{ID: t.Name() + "-closed", Image: testImage, Args: []string{"true"}})
	if err == nil || !res.Outcome.IsInfra() {
		t.Errorf("closed client: got %v, %s; want an infra error", err, res.Outcome)
	}
	if _, err := New(context.Background(), "/nonexistent/containerd.sock"); err == nil {
		t.Error("New on a missing socket succeeded")
	}
}

func TestConcurrentAttempts(t *testing.T) {
	ctx := context.Background()
	// The slow attempt mounts an image too: its second snapshot is as much
	// its own as its root's.
	slow := Spec{ID: t.Name() + "-slow", Image: testImage, Args: sh(`sleep 1; echo slow`), Limits: Limits{Wall: 10 * time.Second},
		ImageMounts: []ImageMount{{Image: testImage, Target: "/agent"}}}
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := testRunner.Run(ctx, slow)
		done <- outcome{res, err}
	}()
	// Wait until the slow attempt's container exists.
	deadline := time.Now().Add(5 * time.Second)
	for !testRunner.isInflight(containerID(slow.ID)) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	// Another attempt runs alongside; the same attempt twice is refused;
	// Reconcile leaves running attempts alone.
	res, err := testRunner.Run(ctx, Spec{ID: t.Name() + "-fast", Image: testImage, Args: sh(`echo fast`)})
	if err != nil || res.Outcome != OutcomeOK || string(res.Stdout) != "fast\n" {
		t.Fatalf("concurrent attempt: %v %+v", err, res)
	}
	if res, err := testRunner.Run(ctx, slow); err == nil || res.Outcome != OutcomeInfraError {
		t.Fatalf("same attempt twice: %v %s", err, res.Outcome)
	}
	if n, err := testRunner.Reconcile(ctx); err != nil || n != 0 {
		t.Fatalf("Reconcile during a run removed %d, %v", n, err)
	}
	o := <-done
	if o.err != nil || o.res.Outcome != OutcomeOK || string(o.res.Stdout) != "slow\n" {
		t.Fatalf("slow attempt: %v %+v", o.err, o.res)
	}
}

func TestHasImage(t *testing.T) {
	ctx := context.Background()
	if ok, err := testRunner.HasImage(ctx, testImage); err != nil || !ok {
		t.Fatalf("HasImage(%s) = %v, %v", testImage, ok, err)
	}
	if ok, err := testRunner.HasImage(ctx, "repronet.local/no/such:image"); err != nil || ok {
		t.Fatalf("HasImage(missing) = %v, %v", ok, err)
	}
}

func TestReconcile(t *testing.T) {
	ctx := testRunner.nsCtx(context.Background())
	c := testRunner.client
	img, err := c.GetImage(ctx, testImage)
	if err != nil {
		t.Fatal(err)
	}
	// A crashed node's leftovers: a container with a running task, and a snapshot without a container.
	labels := map[string]string{LabelAttempt: "crashed"}
	id := containerID("crashed")
	ctr, err := c.NewContainer(ctx, id, client.WithContainerLabels(labels), client.WithSnapshotter(testRunner.snapshotter),
		client.WithNewSnapshot(id, img, snapshots.WithLabels(labels)),
		client.WithNewSpec(oci.WithImageConfigArgs(img, []string{"sleep", "60"})))
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.NewTask(ctx, cio.NullIO)
	if err != nil {
		t.Fatal(err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatal(err)
	}
	parent, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// As after a crash inside NewContainer, a lease keeps the stray snapshot
	// from containerd's garbage collector.
	lctx, done, err := c.WithLease(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer done(ctx)
	sn := c.SnapshotService(testRunner.snapshotter)
	if _, err := sn.Prepare(lctx, "stray-snapshot", identity.ChainID(parent).String(), snapshots.WithLabels(labels)); err != nil {
		t.Fatal(err)
	}
	n, err := testRunner.Reconcile(context.Background())
	if err != nil || n != 2 {
		t.Fatalf("Reconcile = %d, %v; want 2 removed", n, err)
	}
	if left, err := leftovers(context.Background(), testRunner); err != nil || len(left) > 0 {
		t.Fatalf("after Reconcile: %v, %v", left, err)
	}
}

func TestDaemonReuse(t *testing.T) {
	d, err := EnsureDaemon(context.Background(), testDaemonDir, slog.New(slog.DiscardHandler))
	if err != nil || d.Started || d.Socket != filepath.Join(testDaemonDir, "containerd.sock") {
		t.Fatalf("EnsureDaemon again: %+v, %v; want the running daemon reused", d, err)
	}
}

func TestDaemonStartStop(t *testing.T) {
	dir := "/var/lib/repronet/containerd-stoptest"
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx := context.Background()
	d, err := EnsureDaemon(ctx, dir, slog.New(slog.DiscardHandler))
	if err != nil || !d.Started {
		t.Fatalf("EnsureDaemon: %+v, %v", d, err)
	}
	pid, ok := d.runningPid()
	if !ok {
		t.Fatal("no running daemon recorded in the pid file")
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Fatalf("containerd %d still alive after Stop", pid)
	}
	if _, err := probe(ctx, d.Socket, time.Second); err == nil {
		t.Fatal("socket still answers after Stop")
	}
	if err := d.Stop(ctx); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestEnsureDaemonReportsStartFailure(t *testing.T) {
	dir := "/var/lib/repronet/containerd-badtest"
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.MkdirAll(dir, 0o711); err != nil {
		t.Fatal(err)
	}
	// A file where containerd wants its root folder makes it exit at once.
	if err := os.WriteFile(filepath.Join(dir, "root"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := EnsureDaemon(context.Background(), dir, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "log tail") || !strings.Contains(err.Error(), "root") {
		t.Fatalf("got %v, want an error quoting the log", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("failure took %v to report", took)
	}
	t.Logf("error: %v", err)
}

func TestEnsureDaemonRejectsLongSocketPath(t *testing.T) {
	dir := "/tmp/" + strings.Repeat("d", 90)
	if _, err := EnsureDaemon(context.Background(), dir, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "too long") {
		t.Fatalf("got %v, want a socket path error", err)
	}
}

func TestContainerID(t *testing.T) {
	seen := map[string]string{}
	for _, id := range []string{"a/b", "a-b", "a b", "ATTEMPT_01.x", strings.Repeat("z", 300), "..", "ü", "run-7/replica:2"} {
		cid := containerID(id)
		if err := identifiers.Validate(cid); err != nil {
			t.Errorf("containerID(%q) = %q: %v", id, cid, err)
		}
		if other, dup := seen[cid]; dup {
			t.Errorf("%q and %q both map to %q", id, other, cid)
		}
		seen[cid] = id
		if containerID(id) != cid {
			t.Errorf("containerID(%q) is not stable", id)
		}
	}
}

func TestRingBuffer(t *testing.T) {
	for _, limit := range []int{1, 7, 4096} {
		rb := newRingBuffer(limit, nil)
		var all []byte
		for i, n := range []int{0, 3, 1, 10, 5000, 2, 4095, 4096, 4097, 6, 1} {
			chunk := bytes.Repeat([]byte{byte('a' + i)}, n)
			for j := range chunk {
				chunk[j] += byte(j % 3)
			}
			rb.Write(chunk)
			all = append(all, chunk...)
			want := all[max(0, len(all)-limit):]
			if got := rb.Bytes(); !bytes.Equal(got, want) {
				t.Fatalf("limit %d after %d writes: got %q want %q", limit, i+1, got, want)
			}
			if rb.Truncated() != (len(all) > limit) || cap(rb.buf) > limit {
				t.Fatalf("limit %d: truncated %v with %d written, cap %d", limit, rb.Truncated(), len(all), cap(rb.buf))
			}
		}
	}
}

// TestImageMountSource shows a folder of another image (the Medium way:
// an agent's /agent inside an environment): only that folder, read-only,
// with and without a user namespace; a source that is a symbolic link or
// missing is refused before anything runs.
func TestImageMountSource(t *testing.T) {
	ctx := context.Background()
	for _, userns := range []bool{false, true} {
		res, err := testRunner.Run(ctx, Spec{ID: fmt.Sprintf("%s-%v", t.Name(), userns), Image: testImage, UserNamespace: userns,
			ImageMounts: []ImageMount{{Image: testImage, Source: "/bin", Target: "/tools"}},
			Args:        sh(`/tools/busybox echo from-tools; test -e /tools/bin || echo only-bin; touch /tools/x 2>/dev/null || echo read-only`)})
		if err != nil || res.Outcome != OutcomeOK || string(res.Stdout) != "from-tools\nonly-bin\nread-only\n" {
			t.Fatalf("userns %v: %v %s %q %q", userns, err, res.Outcome, res.Stdout, res.Stderr)
		}
	}
	for _, bad := range []string{"/usr/bin/env", "/nope", "/bin/../etc"} {
		res, err := testRunner.Run(ctx, Spec{ID: t.Name() + "-bad", Image: testImage,
			ImageMounts: []ImageMount{{Image: testImage, Source: bad, Target: "/tools"}}, Args: sh(`echo ran`)})
		if err == nil || res.Outcome != OutcomeInfraError || len(res.Stdout) != 0 {
			t.Errorf("source %s: %v %s %q", bad, err, res.Outcome, res.Stdout)
		}
	}
	waitNoLeftovers(t, testRunner)
}
