package dist

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/debimage"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/internal/fixtures"
	"github.com/repronet/repronet/sandbox"
)

// nodeNeeds are the Debian packages the node runs (scripts/setup.sh,
// sandbox.EnsureDaemon, sandbox.EnsureTools): repronet-node must depend on
// each.
var nodeNeeds = []string{"containerd", "runc", "iproute2", "nftables", "e2fsprogs"}

// TestPackagesInstall builds the packages (make dist), installs them with
// dpkg -i into a copy of a fresh Debian 12 root (debootstrap's, with
// systemd: a fixture), dependencies forced, and checks what they installed:
// the binary runs there, the configuration files are conffiles, the node's
// dependencies are declared, the coordinator's user and admin token are
// made, and systemd-analyze verify finds nothing wrong with the units.
// Then `repronet node join` runs inside the root against a coordinator on
// loopback and writes the node's configuration, the admitted node runs the
// coordinator's work, and a purge removes it.
func TestPackagesInstall(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: dpkg -i into a chroot")
	}
	for _, tool := range []string{"dpkg-deb", "chroot", "systemd-analyze"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s missing (scripts/setup.sh installs it): %v", tool, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	fresh, err := fixtures.Builder().Rootfs(ctx, fixtures.DistPackages)
	if errors.Is(err, debimage.ErrNotCached) {
		t.Fatalf("%v (make fixtures)", err)
	} else if err != nil {
		t.Fatal(err)
	}

	out := t.TempDir()
	debs, err := Build(ctx, Options{Root: "..", Out: out})
	if err != nil {
		t.Fatal(err)
	}
	if len(debs) != len(Packages) {
		t.Fatalf("made %v", debs)
	}
	for _, d := range debs {
		if !strings.HasSuffix(d, ".deb") {
			t.Fatalf("made %s", d)
		}
	}
	deps := debField(t, debs[1], "Depends")
	for _, need := range append([]string{"repronet (= "}, nodeNeeds...) {
		if !regexp.MustCompile(`(^|, )` + regexp.QuoteMeta(need)).MatchString(deps) {
			t.Errorf("repronet-node does not depend on %q: Depends: %s", need, deps)
		}
	}

	// A copy of the fresh root (the fixture is never changed).
	root := filepath.Join(t.TempDir(), "root")
	run(t, "", "cp", "-a", "--reflink=auto", fresh, root)
	for _, d := range debs {
		run(t, "", "cp", d, filepath.Join(root, "tmp"))
	}
	in := func(args ...string) string { return run(t, "", append([]string{"chroot", root}, args...)...) }
	var names []string
	for _, d := range debs {
		names = append(names, "/tmp/"+filepath.Base(d))
	}
	// containerd and friends are not in the root (and no test reaches a
	// mirror): their absence is forced past, their declaration checked above.
	in(append([]string{"dpkg", "--force-depends", "-i"}, names...)...)
	for _, p := range Packages {
		if st := in("dpkg-query", "-W", "-f=${db:Status-Status}", p); st != "installed" {
			t.Errorf("%s: %s", p, st)
		}
	}
	if v := in("/usr/bin/repronet", "version"); !strings.HasPrefix(v, "repronet ") {
		t.Errorf("repronet version in the root: %q", v)
	}
	for p, conf := range map[string]string{"repronet-node": "/etc/repronet/node.toml", "repronet-coordinator": "/etc/repronet/coordinator.toml"} {
		if c := in("dpkg-query", "-W", "-f=${Conffiles}", p); !strings.Contains(c, conf) {
			t.Errorf("%s's conffiles: %q, want %s", p, c, conf)
		}
	}
	if u := in("getent", "passwd", "repronet"); !strings.Contains(u, "/var/lib/repronet/coordinator") {
		t.Errorf("user repronet: %q", u)
	}
	tok := filepath.Join(root, "var/lib/repronet/coordinator/admin.token")
	if st, err := os.Stat(tok); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("admin token: %v %v", st, err)
	} else if b, _ := os.ReadFile(tok); !regexp.MustCompile(`^[0-9a-f]{64}\n$`).Match(b) {
		t.Errorf("admin token %q", b)
	}

	// The units, against the root's own systemd.
	units := []string{"/lib/systemd/system/repronet-node.service", "/lib/systemd/system/repronet-coordinator.service"}
	cmd := exec.CommandContext(ctx, "systemd-analyze", append([]string{"verify", "--root=" + root}, units...)...)
	b, err := cmd.CombinedOutput()
	if err != nil || strings.Contains(string(b), "repronet") {
		t.Errorf("systemd-analyze verify: %v\n%s", err, b)
	}
	for _, u := range units {
		sec, err := exec.CommandContext(ctx, "systemd-analyze", "security", "--offline=true", "--root="+root, u).CombinedOutput()
		if err != nil {
			t.Logf("systemd-analyze security %s: %v", u, err)
		}
		lines := strings.Split(strings.TrimSpace(string(sec)), "\n")
		t.Logf("%s: %s", filepath.Base(u), lines[len(lines)-1])
	}

	// repronet node join, inside the root, against a coordinator on loopback.
	c, err := coordinator.New(ctx, coordinator.Config{DataDir: t.TempDir(), Network: "dist-test", JoinTokens: []string{"dist-test-join-token"},
		Families: families.Registry(), Checker: families.Checker(), Limits: demo.SampleLimits(),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := demo.ImportSample(ctx, c); err != nil {
		t.Fatal(err)
	}
	web := httptest.NewServer(c.Handler())
	defer web.Close()
	joined := in("/usr/bin/repronet", "node", "join", web.URL, "dist-test-join-token")
	if !strings.Contains(joined, "admitted") || len(c.Operators()) != 1 {
		t.Fatalf("node join: %s (operators %+v)", joined, c.Operators())
	}
	conf, _ := os.ReadFile(filepath.Join(root, "etc/repronet/node.toml"))
	if !strings.Contains(string(conf), "/p2p/"+c.ID().String()) || !strings.Contains(string(conf), `network = "dist-test"`) ||
		!strings.Contains(string(conf), `join-token-file = "/etc/repronet/join.token"`) || !strings.Contains(string(conf), `start-containerd = `) {
		t.Errorf("node.toml after join:\n%s", conf)
	}
	if st, err := os.Stat(filepath.Join(root, "etc/repronet/join.token")); err != nil || st.Mode().Perm() != 0o600 {
		t.Errorf("join token file: %v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(root, "var/lib/repronet/node/identity.key")); err != nil {
		t.Errorf("the node's identity: %v", err)
	}

	// The installed binary, as the node that joined (its identity, its
	// configuration and token from the root), runs the sample suite's work
	// on this machine's containerd: the admitted node does work.
	runJoinedNode(ctx, t, c, root)

	// A purge takes the node's configuration, token and data away.
	in("dpkg", "--purge", "repronet-node")
	for _, gone := range []string{"etc/repronet/node.toml", "etc/repronet/join.token", "var/lib/repronet/node", "lib/systemd/system/repronet-node.service"} {
		if _, err := os.Stat(filepath.Join(root, gone)); err == nil {
			t.Errorf("%s left after purge", gone)
		}
	}
}

// runJoinedNode runs the root's repronet as the node `repronet node join`
// configured there (its data folder, configuration and join token), on
// this machine's private containerd (the root has none), until it has run
// the sample suite's easy level; then stops it with SIGTERM.
func runJoinedNode(ctx context.Context, t *testing.T, c *coordinator.Coordinator, root string) {
	t.Helper()
	d, err := sandbox.EnsureDaemon(ctx, sandbox.DefaultDaemonDir, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	base := filepath.Join(t.TempDir(), "base.oci.tar")
	if err := agentimage.WriteBase(base, sample.BaseImage, agentimage.BusyboxPath); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(t.TempDir(), "node.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	// Paths the configuration names on the installed system are the root's here.
	cmd := exec.Command(filepath.Join(root, "usr/bin/repronet"), "node", "--config", filepath.Join(root, "etc/repronet/node.toml"),
		"--data", filepath.Join(root, "var/lib/repronet/node"), "--join-token-file", filepath.Join(root, "etc/repronet/join.token"),
		"--start-containerd", "", "--containerd", d.Socket, "--namespace", "repronet-dist-test", "--metrics", "", "--base-image", base)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("node log:\n%s", b[max(0, len(b)-16<<10):])
		}
	}()
	wait := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			select {
			case <-ctx.Done():
				t.Fatalf("timed out waiting for %s", what)
			case err := <-exited:
				t.Fatalf("the node exited (%v) while waiting for %s", err, what)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	wait("the node in view", func() bool { return len(c.Nodes()) == 1 && c.Nodes()[0].Connected })
	nodeID := c.Nodes()[0].ID
	if ops := c.Operators(); len(ops) != 1 || ops[0].Operator != nodeID {
		t.Fatalf("admitted operators %+v; the node that joined is %s", ops, nodeID)
	}
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: "oracle", Levels: []string{"easy"}, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	wait("the work done", func() bool { p := c.Progress(); return p.Total > 0 && p.Done+p.Failed == p.Total })
	for _, a := range c.Attempts() {
		if a.State != coordinator.StateDone || a.ReportedBy != nodeID || a.Outcome != "ok" {
			t.Fatalf("attempt %s: %s, outcome %q, reported by %q: %s", a.ID, a.State, a.Outcome, a.ReportedBy, a.Detail)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("the node's stop: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the node, idle, did not stop within 30 s of SIGTERM")
	}
}

// debField reads a control field of a .deb.
func debField(t *testing.T, deb, field string) string {
	t.Helper()
	return run(t, "", "dpkg-deb", "-f", deb, field)
}

// run runs a command and returns its trimmed output, failing the test on an error.
func run(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND=noninteractive")
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return strings.TrimSpace(string(b))
}
