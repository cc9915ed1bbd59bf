package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// newWorkspace makes a workspace the way the node does and closes it at
// the end of the test.
func newWorkspace(t *testing.T, id string, size int64) *Workspace {
	t.Helper()
	ws, err := testRunner.CreateWorkspace(context.Background(), id, size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := ws.Close(context.Background()); err != nil {
			t.Errorf("close workspace: %v", err)
		}
	})
	if err := os.Chown(ws.Dir(), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	return ws
}

func TestForkBomb(t *testing.T) {
	const pids = 64
	ctx := context.Background()
	type outcome struct {
		res Result
		err error
	}
	bomb := make(chan outcome, 1)
	start := time.Now()
	go func() {
		res, err := testRunner.Run(ctx, Spec{ID: t.Name(), Image: testImage,
			Args:   sh(`(b() { b | b & }; b); exec sleep 30`), // the bomb in a subshell, forked while pids are plenty: the main shell forks nothing after it (a failed fork would end it) and execs the sleep
			Limits: Limits{Pids: pids, Wall: 3 * time.Second}})
		bomb <- outcome{res, err}
	}()
	// While the bomb runs, the node keeps working: another attempt runs
	// beside it and finishes promptly.
	time.Sleep(1500 * time.Millisecond)
	probeStart := time.Now()
	res, err := testRunner.Run(ctx, Spec{ID: t.Name() + "-beside", Image: testImage, Args: sh(`echo alive`)})
	if err != nil || res.Outcome != OutcomeOK || string(res.Stdout) != "alive\n" {
		t.Fatalf("attempt beside the bomb: %v %+v", err, res)
	}
	beside := time.Since(probeStart)
	if beside > 10*time.Second {
		t.Fatalf("attempt beside the bomb took %v", beside)
	}
	o := <-bomb
	if o.err != nil || o.res.Outcome != OutcomeTimeout {
		t.Fatalf("bomb: %v, %s (%s)", o.err, o.res.Outcome, o.res.Detail)
	}
	if o.res.PeakPids != pids {
		t.Fatalf("bomb peaked at %d pids, want the limit %d", o.res.PeakPids, pids)
	}
	if took := time.Since(start); took > 3*time.Second+5*time.Second {
		t.Fatalf("bomb took %v to end", took)
	}
	t.Logf("bomb: peak %d pids, %.2f CPU s, wall %v; attempt beside it took %v", o.res.PeakPids, o.res.CPUSeconds, o.res.Wall, beside)
}

func TestTimeoutWithinASecond(t *testing.T) {
	const limit = 1500 * time.Millisecond
	start := time.Now()
	res := run(t, Limits{Wall: limit}, sh(`trap "" TERM; sleep 30`)...)
	took := time.Since(start)
	if res.Outcome != OutcomeTimeout || res.ExitCode != 137 {
		t.Fatalf("outcome %s exit %d (%s), want timeout 137", res.Outcome, res.ExitCode, res.Detail)
	}
	if res.Wall < limit || res.Wall > limit+time.Second {
		t.Fatalf("attempt wall %v; want the kill within a second of %v", res.Wall, limit)
	}
	t.Logf("limit %v: attempt wall %v, Run returned after %v", limit, res.Wall, took)
}

func TestDiskQuota(t *testing.T) {
	const size = 48 << 20
	fill := `dd if=/dev/zero of=%s bs=1M 2>/dev/null; echo dd=$?`
	for _, tc := range []struct {
		name      string
		workspace bool // a node-made workspace mounted at /workspace
		readOnly  bool
		user      string
		script    string
		want      Outcome
		wantOut   string
	}{
		{name: "workspace", workspace: true, script: strings.Replace(fill, "%s", "/workspace/fill", 1) + `; exit 1`, want: OutcomeDiskQuota, wantOut: "dd=1\n"},
		{name: "writable layer", script: strings.Replace(fill, "%s", "/tmp/fill", 1) + `; exit 1`, want: OutcomeDiskQuota, wantOut: "dd=1\n"},
		{name: "writable layer as root", user: "0:0", script: strings.Replace(fill, "%s", "/usr/fill", 1) + `; exit 1`, want: OutcomeDiskQuota, wantOut: "dd=1\n"},
		{name: "writable layer with workspace", workspace: true, script: strings.Replace(fill, "%s", "/tmp/fill", 1) + `; exit 2`, want: OutcomeDiskQuota, wantOut: "dd=1\n"},
		{name: "read-only root tmp", workspace: true, readOnly: true, script: strings.Replace(fill, "%s", "/tmp/fill", 1) + `; exit 1`, want: OutcomeDiskQuota, wantOut: "dd=1\n"},
		{name: "read-only root home", workspace: true, readOnly: true, script: strings.Replace(fill, "%s", "$HOME/fill", 1) + `; exit 1`, want: OutcomeDiskQuota, wantOut: "dd=1\n"},
		{name: "inodes", workspace: true, script: `i=0; while echo -n > /workspace/f$i; do i=$((i+1)); done 2>/dev/null; echo stopped; exit 1`, want: OutcomeDiskQuota, wantOut: "stopped\n"},
		{name: "full but exit 0", workspace: true, script: strings.Replace(fill, "%s", "/workspace/fill", 1), want: OutcomeOK, wantOut: "dd=1\n"},
		{name: "not full", workspace: true, script: `dd if=/dev/zero of=/workspace/f bs=1M count=8 2>/dev/null; exit 1`, want: OutcomeAgentError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := Spec{ID: t.Name(), Image: testImage, Args: sh(tc.script), ReadOnlyRootfs: tc.readOnly, User: tc.user,
				Limits: Limits{DiskBytes: size, Wall: 30 * time.Second}}
			if tc.workspace {
				ws := newWorkspace(t, t.Name(), size)
				spec.Workspace = ws
				spec.Mounts = []Mount{{Source: ws.Dir(), Target: "/workspace"}}
			}
			res, err := testRunner.Run(context.Background(), spec)
			if err != nil {
				t.Fatal(err)
			}
			if res.Outcome != tc.want || string(res.Stdout) != tc.wantOut {
				t.Fatalf("outcome %s (%s), stdout %q stderr %q; want %s, %q", res.Outcome, res.Detail, res.Stdout, res.Stderr, tc.want, tc.wantOut)
			}
			full := tc.want != OutcomeAgentError
			if res.DiskFull != full || (full && tc.name != "inodes" && res.DiskUsedBytes < size*3/4) {
				t.Fatalf("disk full %v used %d of %d", res.DiskFull, res.DiskUsedBytes, size)
			}
		})
	}
}

func TestWritesOutsideWorkspace(t *testing.T) {
	// Every place the agent might write: the result says which writes worked.
	probe := `for p in /etc /usr /bin /x /workspace /code /tmp /var/tmp $HOME /dev /dev/shm /sys/fs/cgroup /sys/fs/cgroup/memory /proc/sys/kernel /run; do ` +
		`if (echo x > $p/probe) 2>/dev/null; then echo "W $p"; fi; done; ` +
		`mount -o remount,rw / 2>/dev/null && echo remounted; ` +
		`mknod /tmp/dev b 7 0 2>/dev/null && cat /tmp/dev >/dev/null 2>&1 && echo blockdev; true`
	for _, tc := range []struct {
		name     string
		user     string
		readOnly bool
		userns   bool
		want     []string
	}{
		{name: "read-only root", readOnly: true, want: []string{"/workspace", "/code", "/tmp", "/var/tmp", "/home/agent", "/dev/shm"}},
		// Root may also write the container's own tmpfs folders: /dev and /run.
		{name: "read-only root as root", user: "0:0", readOnly: true, want: []string{"/workspace", "/code", "/tmp", "/var/tmp", "/home/agent", "/dev", "/dev/shm", "/run"}},
		{name: "writable root", want: []string{"/workspace", "/code", "/tmp", "/home/agent", "/dev/shm"}},
		// Root in a writable root writes its own layer (on the workspace filesystem).
		{name: "writable root as root", user: "0:0", want: []string{"/etc", "/usr", "/bin", "/workspace", "/code", "/tmp", "/home/agent", "/dev", "/dev/shm", "/run"}},
		// Root in a user namespace: the same places as root, no more.
		{name: "read-only root as root in a user namespace", userns: true, readOnly: true, want: []string{"/workspace", "/code", "/tmp", "/var/tmp", "/home/agent", "/dev", "/dev/shm", "/run"}},
		{name: "writable root as root in a user namespace", userns: true, want: []string{"/etc", "/usr", "/bin", "/workspace", "/code", "/tmp", "/home/agent", "/dev", "/dev/shm", "/run"}},
		{name: "writable root as user in a user namespace", userns: true, user: "1000:1000", want: []string{"/workspace", "/code", "/tmp", "/home/agent", "/dev/shm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := newWorkspace(t, t.Name(), 64<<20)
			code := filepath.Join(ws.Dir(), "capsule", "code")
			if err := os.MkdirAll(code, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(code, 1000, 1000); err != nil {
				t.Fatal(err)
			}
			if tc.userns {
				if err := ws.Chown(ws.Dir(), 1000, 1000); err != nil {
					t.Fatal(err)
				}
			}
			res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage, Args: sh(probe),
				User: tc.user, Workspace: ws, ReadOnlyRootfs: tc.readOnly, UserNamespace: tc.userns,
				Mounts: []Mount{{Source: ws.Dir(), Target: "/workspace"}, {Source: code, Target: "/code"}}})
			if err != nil || res.Outcome != OutcomeOK {
				t.Fatalf("%v %s %q", err, res.Outcome, res.Stderr)
			}
			var got []string
			for _, l := range strings.Split(strings.TrimSpace(string(res.Stdout)), "\n") {
				got = append(got, strings.TrimPrefix(l, "W "))
			}
			if strings.Join(got, " ") != strings.Join(tc.want, " ") {
				t.Fatalf("writable: %q, want %q", got, tc.want)
			}
			// On the host, the writes landed in the workspace only.
			for _, p := range []string{filepath.Join(ws.Dir(), "probe"), filepath.Join(code, "probe")} {
				if _, err := os.Stat(p); err != nil {
					t.Errorf("host does not see %s: %v", p, err)
				}
			}
		})
	}
	// A writable root's writes die with the attempt: the next one starts clean.
	res := run(t, Limits{}, sh(`test -e /etc/probe && echo dirty; echo clean`)...)
	if string(res.Stdout) != "clean\n" {
		t.Fatalf("next attempt sees %q", res.Stdout)
	}
}

func TestMountsConfinedToWorkspace(t *testing.T) {
	ws := newWorkspace(t, t.Name(), 32<<20)
	if err := os.Symlink("/etc", filepath.Join(ws.Dir(), "escape")); err != nil {
		t.Fatal(err)
	}
	for name, src := range map[string]string{
		"host path":           "/etc",
		"symlink out":         filepath.Join(ws.Dir(), "escape"),
		"dot-dot out":         ws.Dir() + "/../..",
		"workspace state dir": filepath.Dir(ws.Dir()),
	} {
		res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage, Args: []string{"true"},
			Workspace: ws, Mounts: []Mount{{Source: src, Target: "/x"}}})
		if err == nil || res.Outcome != OutcomeInfraError || !strings.Contains(res.Detail, "not inside the attempt's workspace") {
			t.Errorf("%s: %v %s %q; want refused", name, err, res.Outcome, res.Detail)
		}
	}
	// A workspace belongs to one attempt.
	if res, err := testRunner.Run(context.Background(), Spec{ID: "someone-else", Image: testImage, Workspace: ws}); err == nil {
		t.Fatalf("ran with another attempt's workspace: %+v", res)
	}
}

func TestWorkspaceLifecycle(t *testing.T) {
	ctx := context.Background()
	ws, err := testRunner.CreateWorkspace(ctx, t.Name(), 32<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := testRunner.CreateWorkspace(ctx, t.Name(), 32<<20); err == nil {
		t.Fatal("second workspace for one attempt")
	}
	// Reconcile leaves an open workspace alone.
	if n, err := testRunner.Reconcile(ctx); err != nil || n != 0 {
		t.Fatalf("Reconcile with an open workspace: %d, %v", n, err)
	}
	if err := os.WriteFile(filepath.Join(ws.Dir(), "prompt.txt"), []byte("hi"), 0o644); err != nil {
		t.Fatal(err)
	}
	used, full, err := ws.Usage()
	if err != nil || full || used == 0 {
		t.Fatalf("Usage = %d %v %v", used, full, err)
	}
	if err := ws.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := ws.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(ws.Dir()); !os.IsNotExist(err) {
		t.Fatalf("workspace still there: %v", err)
	}
	if _, err := testRunner.Run(ctx, Spec{ID: t.Name(), Image: testImage, Workspace: ws}); err == nil {
		t.Fatal("ran with a closed workspace")
	}
	waitNoLeftovers(t, testRunner)
}
