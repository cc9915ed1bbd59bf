// Package chaos runs a whole repronet network on one machine as separate
// processes (a coordinator and several nodes, all the repronet binary) and
// breaks it while it works: nodes are SIGKILLed and restarted, the
// coordinator is SIGKILLed and restarted, a node is cut off by taking its
// network namespace's link down. At the end it checks, from the
// coordinator's API alone, that every attempt was recorded exactly once
// with a verified report, and that the leaderboard equals the one of a run
// without faults.
//
// It owns the orchestration (processes, namespaces, the fault schedule) and
// the checks; it must not reach into the coordinator's or a node's
// internals: everything it knows comes from the HTTP API and the signed
// report envelopes. Traffic stays on loopback and in namespaces it creates.
package chaos

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/sandbox"
)

// Config configures a chaos run.
type Config struct {
	// Dir holds every process's data and logs.
	Dir string
	// Binary is the repronet executable.
	Binary string
	// Nodes is how many node processes run; Slots their slots each.
	Nodes int
	Slots int
	// Attempts is how many attempts to submit at least (rounded up to whole
	// waves of 9 x Replicas: one agent, three levels, three sample tasks).
	Attempts int
	// Replicas of each run, on distinct nodes and operators.
	Replicas int
	// Duration is the fault window: work is submitted over its first 75%
	// and faults happen within it.
	Duration time.Duration
	// KillEvery is the period of node kills (0: none).
	KillEvery time.Duration
	// CoordinatorKills is how many times the coordinator is SIGKILLed.
	CoordinatorKills int
	// Partitions is how many nodes are cut off (one after another), each
	// for PartitionFor.
	Partitions   int
	PartitionFor time.Duration
	// LeaseTTL of the coordinator (short, so lost work comes back fast).
	LeaseTTL time.Duration
	// Baseline runs the same work without faults first and requires the
	// final leaderboards to be equal.
	Baseline bool
	// Drain bounds the wait for the last attempts after the fault window.
	Drain time.Duration
	Seed  uint64
	// DaemonDir is the shared containerd's folder; NamespacePrefix
	// prefixes each node's containerd namespace.
	DaemonDir       string
	NamespacePrefix string
	Progress        io.Writer
	Logger          *slog.Logger
}

func (c *Config) setDefaults() {
	if c.Nodes == 0 {
		c.Nodes = 5
	}
	if c.Slots == 0 {
		c.Slots = 2
	}
	if c.Attempts == 0 {
		c.Attempts = 200
	}
	if c.Replicas == 0 {
		c.Replicas = 2
	}
	if c.Duration == 0 {
		c.Duration = 90 * time.Second
	}
	if c.PartitionFor == 0 {
		c.PartitionFor = 30 * time.Second
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 6 * time.Second
	}
	if c.Drain == 0 {
		c.Drain = 5 * time.Minute
	}
	if c.DaemonDir == "" {
		c.DaemonDir = sandbox.DefaultDaemonDir
	}
	if c.NamespacePrefix == "" {
		c.NamespacePrefix = "repronet-chaos-"
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
}

// operators is how many operators the nodes belong to: two nodes each.
func (c *Config) operators() int { return (c.Nodes + 1) / 2 }

// Summary is the outcome of a chaos run.
type Summary struct {
	Attempts         int `json:"attempts"`
	Recorded         int `json:"recorded"`
	Lost             int `json:"lost"`
	Duplicated       int `json:"duplicated"`
	Unverified       int `json:"unverified"`
	NodeKills        int `json:"node_kills"`
	CoordinatorKills int `json:"coordinator_kills"`
	Partitions       int `json:"partitions"`
	Reassignments    int `json:"reassignments"`
	LeaseLosses      int `json:"lease_losses"`
	LateReports      int `json:"late_reports"`
	// LeaderboardEqual is true when the final leaderboard equals the
	// fault-free run's (nil without a baseline).
	LeaderboardEqual *bool    `json:"leaderboard_equal"`
	WallSeconds      float64  `json:"wall_seconds"`
	BaselineSeconds  float64  `json:"baseline_seconds,omitempty"`
	Seed             uint64   `json:"seed"`
	Dir              string   `json:"dir"`
	Problems         []string `json:"problems,omitempty"`
}

// OK reports whether the run passed: nothing lost, duplicated or
// unverified, the leaderboard as without faults, no other problem.
func (s Summary) OK() bool {
	return s.Lost == 0 && s.Duplicated == 0 && s.Unverified == 0 && len(s.Problems) == 0 &&
		(s.LeaderboardEqual == nil || *s.LeaderboardEqual)
}

// Run runs the chaos scenario (and the baseline first, if asked) and
// returns its summary. An error means the run could not be carried out;
// a run that found faults returns a summary that is not OK.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	cfg.setDefaults()
	if cfg.Binary == "" || cfg.Dir == "" {
		return Summary{}, errors.New("chaos: Binary and Dir are required")
	}
	if cfg.Replicas > cfg.operators() {
		return Summary{}, fmt.Errorf("chaos: %d replicas need at least %d operators; %d nodes make %d", cfg.Replicas,
			cfg.Replicas, cfg.Nodes, cfg.operators())
	}
	if cfg.Partitions > cfg.Nodes {
		return Summary{}, fmt.Errorf("chaos: %d partitions of %d nodes", cfg.Partitions, cfg.Nodes)
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return Summary{}, fmt.Errorf("chaos: %w", err)
	}
	if err := ensureBusybox(ctx); err != nil {
		return Summary{}, err
	}
	d, err := sandbox.EnsureDaemon(ctx, cfg.DaemonDir, cfg.Logger)
	if err != nil {
		return Summary{}, fmt.Errorf("chaos: containerd: %w", err)
	}
	var base *outcome
	if cfg.Baseline {
		fmt.Fprintf(cfg.Progress, "chaos: baseline run without faults (%s)\n", filepath.Join(cfg.Dir, "baseline"))
		b, err := runScenario(ctx, cfg, d.Socket, filepath.Join(cfg.Dir, "baseline"), false)
		if err != nil {
			return Summary{}, fmt.Errorf("chaos: baseline: %w", err)
		}
		if !b.summary.OK() {
			b.summary.Problems = append(b.summary.Problems, "the baseline run itself failed")
			return b.summary, nil
		}
		base = &b
	}
	fmt.Fprintf(cfg.Progress, "chaos: run with faults (%s)\n", filepath.Join(cfg.Dir, "chaos"))
	res, err := runScenario(ctx, cfg, d.Socket, filepath.Join(cfg.Dir, "chaos"), true)
	if err != nil {
		return Summary{}, fmt.Errorf("chaos: %w", err)
	}
	s := res.summary
	s.Dir = cfg.Dir
	if base != nil {
		s.BaselineSeconds = base.summary.WallSeconds
		eq := sameLeaderboard(base.board, res.board)
		s.LeaderboardEqual = &eq
		if !eq {
			s.Problems = append(s.Problems, fmt.Sprintf("leaderboard differs from the fault-free run:\n  baseline %s\n  chaos    %s",
				formatBoard(base.board), formatBoard(res.board)))
		}
	}
	return s, nil
}

// outcome is one scenario's summary and final leaderboard.
type outcome struct {
	summary Summary
	board   []boardRow
}

// scenario is one run: the processes, the namespaces and the counters.
type scenario struct {
	cfg      Config
	dir      string
	faults   bool
	api      *apiClient
	coord    *proc
	nodes    []*proc
	netns    []*Netns
	rng      *mrand.Rand
	progress io.Writer
	log      *slog.Logger

	mu                             sync.Mutex
	nodeKills, coordKills, cuts    int
	expectedAttempts, submittedWav int
}

func runScenario(ctx context.Context, cfg Config, socket, dir string, faults bool) (outcome, error) {
	start := time.Now()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return outcome{}, err
	}
	s := &scenario{cfg: cfg, dir: dir, faults: faults, rng: mrand.New(mrand.NewPCG(cfg.Seed, 7)),
		progress: cfg.Progress, log: cfg.Logger}
	defer s.cleanup()

	partitioned := 0
	if faults {
		partitioned = cfg.Partitions
	}
	for i := range partitioned {
		ns, err := NewNetns(ctx, fmt.Sprintf("c%d", i))
		if err != nil {
			return outcome{}, fmt.Errorf("network namespace for node %d: %w", i+1, err)
		}
		s.netns = append(s.netns, ns)
	}
	p2pPort, err := freePort()
	if err != nil {
		return outcome{}, err
	}
	httpPort, err := freePort()
	if err != nil {
		return outcome{}, err
	}
	token := randomToken()
	if err := os.WriteFile(filepath.Join(dir, "admin.token"), []byte(token+"\n"), 0o600); err != nil {
		return outcome{}, err
	}
	// Every node presents the join token: their operators are admitted.
	joinToken := filepath.Join(dir, "join.token")
	if err := os.WriteFile(joinToken, []byte(randomToken()+"\n"), 0o600); err != nil {
		return outcome{}, err
	}
	network := fmt.Sprintf("chaos-%d-%s", os.Getpid(), token[:6])
	addrFile := filepath.Join(dir, "coordinator.addr")
	argv := []string{cfg.Binary, "coordinator", "--data", filepath.Join(dir, "coordinator"), "--network", network,
		"--listen", fmt.Sprintf("/ip4/127.0.0.1/tcp/%d", p2pPort), "--http", fmt.Sprintf("127.0.0.1:%d", httpPort),
		"--addr-file", addrFile, "--sample", "--admin-token-file", filepath.Join(dir, "admin.token"), "--join-token-file", joinToken,
		"--lease-ttl", cfg.LeaseTTL.String(), "--node-ttl", (2 * cfg.LeaseTTL).String(), "--log-json"}
	for _, ns := range s.netns {
		argv = append(argv, "--listen", fmt.Sprintf("/ip4/%s/tcp/%d", ns.HostIP, p2pPort))
	}
	s.coord = &proc{name: "coordinator", argv: argv, logPath: filepath.Join(dir, "coordinator.log")}
	s.api = &apiClient{base: fmt.Sprintf("http://127.0.0.1:%d", httpPort), token: token}
	if err := s.coord.start(); err != nil {
		return outcome{}, err
	}
	coordAddr, err := waitAddr(ctx, addrFile, s.coord, 2*time.Minute)
	if err != nil {
		return outcome{}, err
	}
	peerID := coordAddr[strings.LastIndex(coordAddr, "/p2p/")+len("/p2p/"):]
	// The sample capsules' environments (Medium) build FROM busybox: the
	// nodes get it as a file, not from a registry.
	base := filepath.Join(dir, "sample-base.oci.tar")
	if err := agentimage.WriteBase(base, sample.BaseImage, "/bin/busybox"); err != nil {
		return outcome{}, err
	}
	for i := 1; i <= cfg.Nodes; i++ {
		addr := coordAddr
		var wrap func(string, ...string) *exec.Cmd
		if i <= len(s.netns) {
			ns := s.netns[i-1]
			addr = fmt.Sprintf("/ip4/%s/tcp/%d/p2p/%s", ns.HostIP, p2pPort, peerID)
			wrap = ns.Command
		}
		p := &proc{name: fmt.Sprintf("node-%d", i), wrap: wrap, logPath: filepath.Join(dir, fmt.Sprintf("node-%d.log", i)),
			argv: []string{cfg.Binary, "node", "--data", filepath.Join(dir, fmt.Sprintf("node-%d", i)), "--network", network,
				"--coordinator", addr, "--slots", fmt.Sprint(cfg.Slots), "--containerd", socket,
				"--namespace", fmt.Sprintf("%s%d", cfg.NamespacePrefix, i),
				"--operator-key", filepath.Join(dir, fmt.Sprintf("operator-%d.key", (i+1)/2)), "--join-token-file", joinToken,
				"--announce-interval", "2s", "--log-json", "--base-image", base}}
		if err := p.start(); err != nil {
			return outcome{}, err
		}
		s.nodes = append(s.nodes, p)
	}
	if err := s.waitNodes(ctx, cfg.Nodes, 2*time.Minute); err != nil {
		return outcome{}, err
	}

	waves := (cfg.Attempts + 9*cfg.Replicas - 1) / (9 * cfg.Replicas)
	s.expectedAttempts = waves * 9 * cfg.Replicas
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	goRun := func(f func(context.Context) error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(runCtx); err != nil && runCtx.Err() == nil {
				errc <- err
				cancel()
			}
		}()
	}
	windowStart := time.Now()
	goRun(func(ctx context.Context) error { return s.submit(ctx, waves, windowStart) })
	if faults {
		goRun(func(ctx context.Context) error { return s.killNodes(ctx, windowStart) })
		goRun(func(ctx context.Context) error { return s.killCoordinator(ctx, windowStart) })
		goRun(func(ctx context.Context) error { return s.partition(ctx, windowStart) })
	}
	err = s.watch(runCtx, windowStart)
	cancel()
	wg.Wait()
	close(errc)
	for e := range errc {
		err = errors.Join(err, e)
	}
	if err != nil {
		return outcome{}, err
	}
	sum, board, err := s.check(ctx)
	if err != nil {
		return outcome{}, err
	}
	for _, p := range append([]*proc{s.coord}, s.nodes...) {
		if bad, err := p.unexpectedExit(); bad {
			sum.Problems = append(sum.Problems, fmt.Sprintf("%s exited on its own: %v (see %s)", p.name, err, p.logPath))
		}
	}
	sum.WallSeconds = time.Since(start).Seconds()
	sum.Seed = cfg.Seed
	sum.Dir = dir
	return outcome{summary: sum, board: board}, nil
}

// submit queues the waves over the first 60% of the fault window (all at
// once without faults). Each wave has an ID: resubmitting one after a
// coordinator crash queues nothing twice.
func (s *scenario) submit(ctx context.Context, waves int, t0 time.Time) error {
	agents := sample.AgentNames()
	for k := range waves {
		if s.faults && waves > 1 {
			at := t0.Add(time.Duration(float64(s.cfg.Duration) * 0.75 * float64(k) / float64(waves-1)))
			if err := sleepUntil(ctx, at); err != nil {
				return nil
			}
		}
		req := evaluationRequest{ID: fmt.Sprintf("wave-%d", k+1), Suite: "corebench-sample", Agent: agents[k%len(agents)],
			Levels: []string{"easy", "medium", "hard"}, Runs: 1, Replicas: s.cfg.Replicas}
		if err := s.api.submit(ctx, req); err != nil {
			return fmt.Errorf("submit wave %d: %w", k+1, err)
		}
		s.mu.Lock()
		s.submittedWav++
		s.mu.Unlock()
	}
	return nil
}

// killNodes SIGKILLs a random node every KillEvery within the window and
// starts it again a second later.
func (s *scenario) killNodes(ctx context.Context, t0 time.Time) error {
	if s.cfg.KillEvery <= 0 {
		return nil
	}
	for at := t0.Add(s.cfg.KillEvery); at.Before(t0.Add(s.cfg.Duration)); at = at.Add(s.cfg.KillEvery) {
		if err := sleepUntil(ctx, at); err != nil {
			return nil
		}
		p := s.nodes[s.rng.IntN(len(s.nodes))]
		s.event(t0, "SIGKILL %s", p.name)
		p.kill()
		s.mu.Lock()
		s.nodeKills++
		s.mu.Unlock()
		if err := sleep(ctx, time.Second); err != nil {
			return nil
		}
		if err := p.start(); err != nil {
			return err
		}
	}
	return nil
}

// killCoordinator SIGKILLs the coordinator CoordinatorKills times, evenly
// spread over the window, and starts it again a second later.
func (s *scenario) killCoordinator(ctx context.Context, t0 time.Time) error {
	k := s.cfg.CoordinatorKills
	for i := 1; i <= k; i++ {
		at := t0.Add(time.Duration(float64(s.cfg.Duration) * float64(i) / float64(k+1)))
		if err := sleepUntil(ctx, at); err != nil {
			return nil
		}
		s.event(t0, "SIGKILL coordinator")
		s.coord.kill()
		s.mu.Lock()
		s.coordKills++
		s.mu.Unlock()
		if err := sleep(ctx, time.Second); err != nil {
			return nil
		}
		if err := s.coord.start(); err != nil {
			return err
		}
		s.event(t0, "coordinator restarted")
	}
	return nil
}

// partition cuts the namespaced nodes off one after another, each for
// PartitionFor, starting at 10% of the window.
func (s *scenario) partition(ctx context.Context, t0 time.Time) error {
	at := t0.Add(s.cfg.Duration / 10)
	for i, ns := range s.netns {
		if err := sleepUntil(ctx, at); err != nil {
			return nil
		}
		s.event(t0, "cut node-%d off (%s down) for %s", i+1, ns.HostIf, s.cfg.PartitionFor)
		if err := ns.Cut(ctx); err != nil {
			return err
		}
		s.mu.Lock()
		s.cuts++
		s.mu.Unlock()
		err := sleep(ctx, s.cfg.PartitionFor)
		// Heal even when cancelled: the namespace is deleted at the end anyway.
		hctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		herr := ns.Heal(hctx)
		cancel()
		s.event(t0, "healed node-%d", i+1)
		if err != nil {
			return nil
		}
		if herr != nil {
			return herr
		}
		at = time.Now().Add(s.cfg.Duration / 10)
	}
	return nil
}

// watch shows progress until every wave was submitted, the fault window is
// over and every attempt is finished, or the drain time runs out.
func (s *scenario) watch(ctx context.Context, t0 time.Time) error {
	deadline := t0.Add(s.cfg.Duration + s.cfg.Drain)
	if !s.faults {
		deadline = t0.Add(s.cfg.Drain)
	}
	last := ""
	for {
		p, err := s.api.progress(ctx)
		s.mu.Lock()
		line := fmt.Sprintf("  t=%3.0fs ", time.Since(t0).Seconds())
		if err != nil {
			line += "coordinator not answering"
		} else {
			line += fmt.Sprintf("done %d/%d  queued %d  running %d  failed %d", p.Done, s.expectedAttempts, p.Queued, p.Assigned, p.Failed)
		}
		line += fmt.Sprintf("  | node kills %d  coordinator kills %d  partitions %d", s.nodeKills, s.coordKills, s.cuts)
		allIn := s.submittedWav*9*s.cfg.Replicas == s.expectedAttempts
		s.mu.Unlock()
		if line[12:] != last {
			fmt.Fprintln(s.progress, line)
			last = line[12:]
		}
		windowOver := !s.faults || time.Since(t0) >= s.cfg.Duration
		if err == nil && allIn && windowOver && p.Total >= s.expectedAttempts && p.Done+p.Failed == p.Total {
			return nil
		}
		if time.Now().After(deadline) {
			return nil // check reports what is missing
		}
		if err := sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

func (s *scenario) event(t0 time.Time, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(s.progress, "  t=%3.0fs %s\n", time.Since(t0).Seconds(), msg)
	s.log.Info("chaos event", "event", msg)
}

func (s *scenario) waitNodes(ctx context.Context, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		nodes, err := s.api.nodes(ctx)
		if err == nil {
			serving := 0
			for _, nd := range nodes {
				if nd.ServesUs && nd.Connected {
					serving++
				}
			}
			if serving >= n {
				return nil
			}
		}
		for _, p := range s.nodes {
			if bad, err := p.unexpectedExit(); bad {
				return fmt.Errorf("%s exited: %v (see %s)", p.name, err, p.logPath)
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d nodes not in the coordinator's view after %s (logs in %s)", n, timeout, s.dir)
		}
		if err := sleep(ctx, 200*time.Millisecond); err != nil {
			return err
		}
	}
}

func (s *scenario) cleanup() {
	var wg sync.WaitGroup
	for _, p := range s.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); p.stop(15 * time.Second) }()
	}
	wg.Wait()
	if s.coord != nil {
		s.coord.stop(15 * time.Second)
	}
	for _, ns := range s.netns {
		if err := ns.Close(); err != nil {
			s.log.Warn("remove network namespace", "netns", ns.Name, "err", err)
		}
	}
}

func waitAddr(ctx context.Context, path string, p *proc, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		if b, err := os.ReadFile(path); err == nil && strings.Contains(string(b), "/p2p/") {
			return strings.TrimSpace(string(b)), nil
		}
		if bad, err := p.unexpectedExit(); bad {
			return "", fmt.Errorf("%s exited: %v (see %s)", p.name, err, p.logPath)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("%s did not start in %s (see %s)", p.name, timeout, p.logPath)
		}
		if err := sleep(ctx, 100*time.Millisecond); err != nil {
			return "", err
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pick a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

func randomToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func sleepUntil(ctx context.Context, t time.Time) error { return sleep(ctx, time.Until(t)) }

// ensureBusybox installs Debian's busybox-static when /bin/busybox (the
// sample agents' base) is missing.
func ensureBusybox(ctx context.Context) error {
	if _, err := os.Stat("/bin/busybox"); err == nil {
		return nil
	}
	cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "-qq", "busybox-static")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install busybox-static: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}
