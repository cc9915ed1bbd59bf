package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/chaos"
	"github.com/repronet/repronet/internal/demo"
)

// TestManyNodesBehindOneAddress (issue 10, finding 11): 50 node processes,
// each in a network namespace of its own on a LAN behind one NAT router
// (a namespace masquerading their traffic to its one uplink address),
// serve two coordinators: A, started with a per-IP connection limit of 8,
// and B, with the default. A lets in at most 8 of them (libp2p's default
// limit); every node connects to B, from the one address, and each gets an
// assignment, accepts it and reports.
func TestManyNodesBehindOneAddress(t *testing.T) {
	requireRoot(t)
	bin := binary(t)
	const nodes, lowLimit, network = 50, 8, "e2e-manynat"
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := testLogger(t)
	start := time.Now()

	lan, err := newNATLAN(ctx, "mnat", nodes)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := lan.Close(); err != nil {
			t.Errorf("remove namespaces: %v", err)
		}
	}()
	t.Logf("%d namespaces behind %s made in %s", nodes, lan.router.NsIP, time.Since(start).Round(time.Millisecond))

	d := ensureDaemon(ctx, t, log)
	listen := []string{fmt.Sprintf("/ip4/%s/tcp/0", lan.router.HostIP)}
	limited := startCoordinator(ctx, t, coordinator.Config{Network: network, ListenAddrs: listen, Logger: log,
		MaxConnsPerIP: lowLimit})
	open := startCoordinator(ctx, t, coordinator.Config{Network: network, ListenAddrs: listen, Logger: log})

	dir := t.TempDir()
	// The nodes join (each is its own admitted operator): unadmitted
	// nodes would share one allowance (docs/security.md, free identities).
	tokenFile := joinTokenFile(t)
	procs := make([]*exec.Cmd, nodes)
	defer stopAll(t, procs, dir)
	for i := range nodes {
		logf, err := os.Create(filepath.Join(dir, fmt.Sprintf("node%02d.log", i)))
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("nsenter", "--net=/var/run/netns/"+lan.leaves[i], "--", bin, "node",
			"--data", filepath.Join(dir, fmt.Sprintf("node%02d", i)), "--network", network,
			"--coordinator", open.Addrs()[0].String(), "--coordinator", limited.Addrs()[0].String(),
			"--slots", "1", "--disk-default", "128M", "--containerd", d.Socket,
			"--namespace", fmt.Sprintf("repronet-e2e-manynat-%02d", i), "--base-image", baseImages(t)[0],
			"--join-token-file", tokenFile)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		err = cmd.Start()
		logf.Close()
		if err != nil {
			t.Fatal(err)
		}
		procs[i] = cmd
	}

	// The limited coordinator never holds more than its limit; the other
	// sees every node, connected, from the router's one address.
	var mostLimited int
	waitFor(ctx, t, fmt.Sprintf("all %d nodes connected to the coordinator with the default limit", nodes), func() bool {
		mostLimited = max(mostLimited, len(limited.Host().Network().Peers()))
		connected := 0
		for _, n := range open.Nodes() {
			if n.Connected && n.ServesUs {
				connected++
			}
		}
		return connected == nodes
	})
	t.Logf("all %d nodes in view after %s", nodes, time.Since(start).Round(time.Millisecond))
	for _, c := range open.Host().Network().Conns() {
		if ip, err := manet.ToIP(c.RemoteMultiaddr()); err != nil || ip.String() != lan.router.NsIP.String() {
			t.Fatalf("a node connected from %s, not from the NAT address %s", c.RemoteMultiaddr(), lan.router.NsIP)
		}
	}
	// Every node has tried the limited coordinator by now (right after
	// the other); give their retries a few seconds more.
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		mostLimited = max(mostLimited, len(limited.Host().Network().Peers()))
	}
	t.Logf("the coordinator limited to %d connections per IP let in at most %d of %d nodes", lowLimit, mostLimited, nodes)
	if mostLimited > lowLimit || mostLimited == 0 {
		t.Fatalf("the coordinator limited to %d connections per IP let in at most %d nodes, want 1 to %d",
			lowLimit, mostLimited, lowLimit)
	}

	// Work for every node: with one slot each and more attempts than
	// nodes, all are placed at once.
	if _, _, err := open.Evaluate(ctx, coordinator.Evaluation{Suite: demo.SuiteName, Agent: "oracle",
		Levels: allLevels, Runs: (nodes + 8) / 9, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(ctx, t, "every attempt finished", func() bool {
		p := open.Progress()
		return p.Total > 0 && p.Done+p.Failed == p.Total
	})
	worked := map[string]int{}
	for _, a := range open.Attempts() {
		if a.State != coordinator.StateDone {
			t.Fatalf("attempt %s ended %s: %s", a.ID, a.State, a.Detail)
		}
		worked[a.ReportedBy]++
	}
	for _, n := range open.Nodes() {
		if worked[n.ID] == 0 {
			t.Errorf("node %s got no work", n.ID)
		}
	}
	if len(worked) != nodes {
		t.Fatalf("%d nodes reported, want %d", len(worked), nodes)
	}
	t.Logf("%d attempts done by %d nodes behind one address; %s since start", len(open.Attempts()), len(worked),
		time.Since(start).Round(time.Millisecond))
}

// stopAll stops the node processes (SIGTERM, then SIGKILL after 15 s) and,
// if the test failed, logs the tail of a few of their logs.
func stopAll(t *testing.T, procs []*exec.Cmd, dir string) {
	var wg sync.WaitGroup
	for _, cmd := range procs {
		if cmd == nil {
			continue
		}
		wg.Go(func() { stopProcess(cmd) })
	}
	wg.Wait()
	if t.Failed() {
		for i := range min(3, len(procs)) {
			b, _ := os.ReadFile(filepath.Join(dir, fmt.Sprintf("node%02d.log", i)))
			lines := strings.Split(strings.TrimSpace(string(b)), "\n")
			t.Logf("node %d log (tail):\n%s", i, strings.Join(lines[max(0, len(lines)-15):], "\n"))
		}
	}
}

// stopProcess stops a started command: SIGTERM, then SIGKILL after 15 s.
func stopProcess(cmd *exec.Cmd) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// natLAN is a LAN behind a NAT router, all in network namespaces: the
// router is a chaos.Netns (uplink to the host: HostIP on the host,
// NsIP on the router) with a bridge, and each leaf namespace has one
// address on the bridge's subnet and its default route through the
// router, which masquerades what leaves through the uplink as NsIP.
type natLAN struct {
	router *chaos.Netns
	leaves []string
}

// lanPrefix is the LAN's subnet; it exists only inside the namespaces.
var lanPrefix = netip.MustParsePrefix("172.30.0.0/24")

func newNATLAN(ctx context.Context, tag string, n int) (*natLAN, error) {
	if n > 250 {
		return nil, fmt.Errorf("a LAN of %d leaves does not fit %s", n, lanPrefix)
	}
	if err := chaos.EnsureTools(ctx, "ip", "iptables"); err != nil {
		return nil, err
	}
	r, err := chaos.NewNetns(ctx, tag)
	if err != nil {
		return nil, err
	}
	lan := &natLAN{router: r}
	gw := lanPrefix.Addr().Next()
	in := func(ns string, args ...string) []string { return append([]string{"ip", "-n", ns}, args...) }
	steps := [][]string{
		in(r.Name, "link", "add", "br0", "type", "bridge"),
		in(r.Name, "addr", "add", netip.PrefixFrom(gw, lanPrefix.Bits()).String(), "dev", "br0"),
		in(r.Name, "link", "set", "br0", "up"),
		{"ip", "netns", "exec", r.Name, "sysctl", "-qw", "net.ipv4.ip_forward=1"},
		{"ip", "netns", "exec", r.Name, "iptables", "-t", "nat", "-A", "POSTROUTING", "-o", r.NsIf, "-j", "MASQUERADE"},
	}
	if err := runAll(ctx, steps); err != nil {
		return nil, errors.Join(err, lan.Close())
	}
	addr := gw
	for i := range n {
		leaf := fmt.Sprintf("%s-l%d", r.Name, i)
		if err := runAll(ctx, [][]string{{"ip", "netns", "add", leaf}}); err != nil {
			return nil, errors.Join(err, lan.Close())
		}
		lan.leaves = append(lan.leaves, leaf)
		addr = addr.Next()
		port := fmt.Sprintf("l%d", i)
		if err := runAll(ctx, [][]string{
			in(r.Name, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", leaf),
			in(r.Name, "link", "set", port, "master", "br0", "up"),
			in(leaf, "addr", "add", netip.PrefixFrom(addr, lanPrefix.Bits()).String(), "dev", "eth0"),
			in(leaf, "link", "set", "eth0", "up"),
			in(leaf, "link", "set", "lo", "up"),
			in(leaf, "route", "add", "default", "via", gw.String()),
		}); err != nil {
			return nil, errors.Join(err, lan.Close())
		}
	}
	return lan, nil
}

// Close deletes the leaf namespaces (and with them their links) and the
// router.
func (l *natLAN) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for _, leaf := range l.leaves {
		if err := runAll(ctx, [][]string{{"ip", "netns", "del", leaf}}); err != nil {
			errs = append(errs, err)
		}
	}
	l.leaves = nil
	return errors.Join(append(errs, l.router.Close())...)
}

func runAll(ctx context.Context, cmds [][]string) error {
	for _, c := range cmds {
		if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
			return fmt.Errorf("%s: %w: %s", strings.Join(c, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}
