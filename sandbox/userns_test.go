package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/repronet/repronet/sandbox/idmap"
	"github.com/repronet/repronet/sandbox/netns"
)

// newRootWorkspace makes a workspace for a user-namespaced attempt: its
// folder belongs to root in the container (the node's Chown(Dir(), 0, 0)).
func newRootWorkspace(t *testing.T, id string, size int64) *Workspace {
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
	if err := ws.Chown(ws.Dir(), 0, 0); err != nil {
		t.Fatal(err)
	}
	return ws
}

// hostIDs reads the real, effective, saved and filesystem user and group
// IDs of a host process.
func hostIDs(pid uint32) (uids, gids []string, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, nil, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Uid:"); ok {
			uids = strings.Fields(v)
		}
		if v, ok := strings.CutPrefix(l, "Gid:"); ok {
			gids = strings.Fields(v)
		}
	}
	return uids, gids, nil
}

func TestUserNamespace(t *testing.T) {
	ws := newRootWorkspace(t, t.Name(), 64<<20)
	ids := ws.IDs()
	if ids.HostID < idmap.DefaultBase || ids.Size != idmap.RangeSize {
		t.Fatalf("workspace range %s outside the default pool", ids)
	}
	// Inside: root, the image's files owned by root (through the idmapped
	// layers), root can change the image (its own writable layer) and own
	// files as another user; a sleeping child stays while the host looks.
	script := `id -u; id -g; cat /proc/self/uid_map /proc/self/gid_map | tr -s ' \t' ' '; ` +
		`stat -c '%u:%g' /bin/busybox /etc/passwd /; ` +
		`echo installed > /usr/bin/tool && echo root-writes-usr; ` +
		`touch /workspace/mine /workspace/apt && chown 42:43 /workspace/apt && echo chowned; ` +
		`touch /workspace/started; sleep 30 & wait`
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage, Args: sh(script),
			UserNamespace: true, Workspace: ws, Mounts: []Mount{{Source: ws.Dir(), Target: "/workspace"}},
			Limits: Limits{Wall: 4 * time.Second}})
		done <- outcome{res, err}
	}()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(ws.Dir(), "started")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("attempt did not start")
		}
	}
	// From the host, every process of the attempt is the range's first
	// ID — no host root, no real account.
	ctx := testRunner.nsCtx(context.Background())
	ctr, err := testRunner.client.LoadContainer(ctx, containerID(t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	task, err := ctr.Task(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	procs, err := task.Pids(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(procs) < 2 {
		t.Fatalf("attempt has %d processes, want the shell and its sleep", len(procs))
	}
	want := strconv.FormatUint(uint64(ids.HostID), 10)
	for _, p := range procs {
		uids, gids, err := hostIDs(p.Pid)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Join(uids, " ") != strings.Join([]string{want, want, want, want}, " ") || strings.Join(gids, " ") != strings.Join(uids, " ") {
			t.Fatalf("host sees process %d as uids %v gids %v; want all %s", p.Pid, uids, gids, want)
		}
	}
	o := <-done
	if o.err != nil || o.res.Outcome != OutcomeTimeout {
		t.Fatalf("%v %s (%s) %q", o.err, o.res.Outcome, o.res.Detail, o.res.Stderr)
	}
	wantOut := fmt.Sprintf("0\n0\n 0 %[1]d 65536\n 0 %[1]d 65536\n0:0\n0:0\n0:0\nroot-writes-usr\nchowned\n", ids.HostID)
	if got := string(o.res.Stdout); got != wantOut {
		t.Fatalf("stdout %q, want %q (stderr %q)", got, wantOut, o.res.Stderr)
	}
	// On the host, what the attempt wrote belongs to the range.
	for name, id := range map[string]uint32{"mine": ids.HostID, "apt": ids.HostID + 42} {
		st, err := os.Lstat(filepath.Join(ws.Dir(), name))
		if err != nil {
			t.Fatal(err)
		}
		sys := st.Sys().(*syscall.Stat_t)
		if sys.Uid != id || (name == "mine" && sys.Gid != id) || (name == "apt" && sys.Gid != ids.HostID+43) {
			t.Fatalf("host sees %s owned by %d:%d, want %d", name, sys.Uid, sys.Gid, id)
		}
	}
}

func TestUserNamespaceRangesDistinct(t *testing.T) {
	seen := map[uint32]string{}
	for i := range 4 {
		ws := newRootWorkspace(t, fmt.Sprintf("%s-%d", t.Name(), i), 16<<20)
		if other, dup := seen[ws.IDs().HostID]; dup {
			t.Fatalf("%s and %s share host IDs %s", ws.Attempt(), other, ws.IDs())
		}
		seen[ws.IDs().HostID] = ws.Attempt()
	}
	// Chown maps container IDs and stays inside the workspace.
	ws := newRootWorkspace(t, t.Name(), 16<<20)
	f := filepath.Join(ws.Dir(), "sub", "f")
	if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(f, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := ws.Chown(filepath.Join(ws.Dir(), "sub"), 1000, 1000); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(f); err != nil || st.Sys().(*syscall.Stat_t).Uid != ws.IDs().HostID+1000 {
		t.Fatalf("after Chown: %v %v", st, err)
	}
	for _, bad := range []struct {
		p        string
		uid, gid uint32
	}{{"/etc", 0, 0}, {filepath.Dir(ws.Dir()), 0, 0}, {ws.Dir(), idmap.RangeSize, 0}, {ws.Dir(), 0, idmap.RangeSize}} {
		if err := ws.Chown(bad.p, bad.uid, bad.gid); err == nil {
			t.Errorf("Chown(%s, %d, %d) succeeded", bad.p, bad.uid, bad.gid)
		}
	}
}

// buildEscapeProbe builds sandbox/internal/escapeprobe as a static binary
// into dir and returns its path.
func buildEscapeProbe(t *testing.T, dir string) string {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		gobin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "escapeprobe")
	cmd := exec.Command(gobin, "build", "-trimpath", "-o", out, "./internal/escapeprobe")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build escape probe: %v: %s", err, b)
	}
	return out
}

// loRules allows one destination that routes to lo: an egress attempt
// gets its namespace and link, and no host interface gets forwarding.
func loRules() []netns.Rule {
	return []netns.Rule{{Prefix: netip.MustParsePrefix("127.0.0.2/32"), Port: 9, Proto: "tcp"}}
}

// TestUserNamespaceEscapes runs the escape probe as root in the user
// namespace, with no network and with egress, writable and read-only
// root: mount, ptrace and signals to a host process, raw sockets,
// namespaces, block devices all fail; only chown, which root in the
// container may do to its own files, works.
func TestUserNamespaceEscapes(t *testing.T) {
	probe := buildEscapeProbe(t, t.TempDir())
	bin, err := os.ReadFile(probe)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{
		"chown ok",
		"ptrace-host ESRCH", // the host's processes do not exist in the container
		"kill-host ESRCH",
		"raw-inet EPERM", // CAP_NET_RAW dropped
		"raw-packet EPERM",
		"mount-tmpfs EPERM", // no CAP_SYS_ADMIN, and the seccomp profile
		"mount-bind EPERM",
		"remount-root EPERM",
		"unshare-mount EPERM",
		"unshare-net EPERM",
		"mknod-block EPERM", // no device nodes in a user namespace
		"setns-init EPERM",
	}, "\n") + "\n"
	for _, tc := range []struct {
		name     string
		egress   bool
		readOnly bool
	}{
		{name: "none"},
		{name: "egress", egress: true},
		{name: "read-only root", readOnly: true},
		{name: "egress read-only root", egress: true, readOnly: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := newRootWorkspace(t, t.Name(), 64<<20)
			p := filepath.Join(ws.Dir(), "escapeprobe")
			if err := os.WriteFile(p, bin, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := ws.Chown(p, 0, 0); err != nil {
				t.Fatal(err)
			}
			spec := Spec{ID: t.Name(), Image: testImage, UserNamespace: true, Workspace: ws, ReadOnlyRootfs: tc.readOnly,
				Mounts: []Mount{{Source: ws.Dir(), Target: "/workspace"}},
				Args:   []string{"/workspace/escapeprobe", strconv.Itoa(os.Getpid())}, Limits: Limits{Wall: 30 * time.Second}}
			if tc.egress {
				spec.Network = Network{Mode: NetworkEgress, Allow: loRules()}
			}
			res, err := testRunner.Run(context.Background(), spec)
			if err != nil || res.Outcome != OutcomeOK {
				t.Fatalf("%v %s (%s) %q", err, res.Outcome, res.Detail, res.Stderr)
			}
			if got := string(res.Stdout); got != want {
				t.Fatalf("probe:\n%s\nwant:\n%s", got, want)
			}
		})
	}
}

// TestUserNamespaceLimits checks that every limit holds for root in a user
// namespace as it does for the agent user: the cgroup values, memory
// without swap (oom), pids, CPU quota, disk quota, wall clock.
func TestUserNamespaceLimits(t *testing.T) {
	const mem = 48 << 20
	for _, tc := range []struct {
		name    string
		script  string
		lim     Limits
		want    Outcome
		wantOut string
		check   func(t *testing.T, res Result)
	}{
		{name: "cgroup values", lim: Limits{CPUMillis: 500, MemoryBytes: mem, Pids: 77},
			script: `cd /sys/fs/cgroup && cat cpu/cpu.cfs_quota_us cpu/cpu.cfs_period_us memory/memory.limit_in_bytes memory/memory.memsw.limit_in_bytes pids/pids.max; ` +
				`echo 1 > pids/pids.max 2>/dev/null && echo cgroup-writable; true`,
			want: OutcomeOK, wantOut: fmt.Sprintf("50000\n100000\n%d\n%d\n77\n", mem, mem)},
		{name: "memory", lim: Limits{MemoryBytes: 32 << 20},
			script: `awk 'BEGIN { s = "x"; while (1) s = s s }'; exit 0`, want: OutcomeOOM},
		{name: "pids", lim: Limits{Pids: 32, Wall: 3 * time.Second},
			script: `(b() { b | b & }; b); exec sleep 30`, want: OutcomeTimeout,
			check: func(t *testing.T, res Result) {
				if res.PeakPids != 32 {
					t.Fatalf("peak pids %d, want the limit 32", res.PeakPids)
				}
			}},
		{name: "cpu", lim: Limits{CPUMillis: 250, Wall: 1200 * time.Millisecond},
			script: `while :; do :; done & while :; do :; done`, want: OutcomeTimeout,
			check: func(t *testing.T, res Result) {
				if max := 0.25*max(1200*time.Millisecond, res.Wall).Seconds()*1.3 + 0.05; res.CPUSeconds > max {
					t.Fatalf("CPU %.2f s in %v: over %.2f", res.CPUSeconds, res.Wall, max)
				}
			}},
		{name: "disk", lim: Limits{DiskBytes: 48 << 20},
			script: `dd if=/dev/zero of=/usr/fill bs=1M 2>/dev/null; echo dd=$?; exit 1`, want: OutcomeDiskQuota, wantOut: "dd=1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: testImage, Args: sh(tc.script),
				UserNamespace: true, Limits: tc.lim})
			if err != nil || res.Outcome != tc.want {
				t.Fatalf("%v %s (%s), stderr %q; want %s", err, res.Outcome, res.Detail, res.Stderr, tc.want)
			}
			if tc.wantOut != "" && string(res.Stdout) != tc.wantOut {
				t.Fatalf("stdout %q, want %q", res.Stdout, tc.wantOut)
			}
			if tc.check != nil {
				tc.check(t, res)
			}
		})
	}
}
