// Package demo runs the main job on one machine: a private containerd, a
// coordinator and several node processes on loopback, the sample
// CORE-Bench suite and its two sample agents, evaluated end to end, and
// the reference agent (agents/reference) through the coordinator's model
// gateway: against a scripted model server it starts on loopback, or
// against a real provider whose key only the gateway holds. It owns that
// orchestration (the sample agents' images are package agentimage's);
// everything it runs is the real coordinator, gateway, node and sandbox
// code.
package demo

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
)

// SuiteName is the name the sample suite is imported under.
const SuiteName = "corebench-sample"

// BusyboxPath is where Debian's busybox-static installs its binary.
const BusyboxPath = agentimage.BusyboxPath

// Config configures a demo run.
type Config struct {
	// Dir holds every process's data and logs; it is created if missing.
	Dir string
	// Binary is the repronet executable that runs the nodes.
	Binary string
	// Nodes is how many node processes to start; SlotsPerNode their slots.
	Nodes        int
	SlotsPerNode int
	// DaemonDir is the private containerd's folder.
	DaemonDir string
	Timeout   time.Duration
	// Progress receives the progress display (nil: none).
	Progress io.Writer
	Logger   *slog.Logger
	// AgentBinary is repronet-agent, the reference agent ("": the
	// reference agent is not evaluated, and the progress says so).
	AgentBinary string
	// Model is what the reference agent calls.
	Model Model
	// HALDir, when set, receives HAL's upload files of the demo's
	// evaluations (with the reference agent's trajectories).
	HALDir string
}

// Model is the model behind the gateway in the demo.
type Model struct {
	// URL is an OpenAI-compatible provider's base URL (…/v1); "" starts
	// the scripted model server (SampleScript) on loopback instead.
	URL string
	// Key is the provider's key: only the coordinator's gateway holds it.
	Key string
	// Name is the model to call (required with URL; the scripted
	// server's is ScriptedModel).
	Name string
	// Price is the model's price (with URL; the scripted server's is
	// ScriptedPrice).
	Price gateway.PriceUSD
	// AttemptUSD caps each attempt's model cost (0: 1 dollar).
	AttemptUSD float64
	// Gateway, instead of URL, Key and Price, is the model gateway's
	// configuration as `repronet coordinator --config` reads it; Name is
	// one of its models, served by an OpenAI-compatible provider (the
	// reference agent speaks chat completions).
	Gateway *gateway.Config
}

// Scripted reports whether the demo uses its scripted model server.
func (m Model) Scripted() bool { return m.URL == "" && m.Gateway == nil }

// Validate checks m, naming what is wrong (never the key).
func (m Model) Validate() error {
	if m.Gateway != nil {
		if m.URL != "" || m.Key != "" {
			return fmt.Errorf("demo: a model URL or key beside a gateway configuration")
		}
		api := ""
		for _, gm := range m.Gateway.Models {
			if gm.Name != m.Name {
				continue
			}
			for _, p := range m.Gateway.Providers {
				if p.Name == gm.Provider {
					api = p.API
				}
			}
		}
		switch {
		case api == "":
			return fmt.Errorf("demo: model %q is not among the configuration's models %v", m.Name, m.Gateway.ModelNames())
		case api != gateway.APIOpenAI:
			return fmt.Errorf("demo: model %q is served by a %s provider; the reference agent speaks OpenAI's chat completions", m.Name, api)
		case m.AttemptUSD < 0:
			return fmt.Errorf("demo: model %s: negative budget", m.Name)
		}
		return nil
	}
	if m.Scripted() {
		if m.Key != "" || m.Name != "" {
			return fmt.Errorf("demo: a model key or name without a model URL")
		}
		return nil
	}
	u, err := url.Parse(m.URL)
	switch {
	case err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "":
		return fmt.Errorf("demo: model URL %q: want an http:// or https:// base URL (…/v1)", m.URL)
	case m.Key == "":
		return fmt.Errorf("demo: model URL %s given without a key", m.URL)
	case m.Name == "":
		return fmt.Errorf("demo: model URL %s given without a model name", m.URL)
	case m.Price.Input < 0 || m.Price.Output < 0 || m.AttemptUSD < 0:
		return fmt.Errorf("demo: model %s: negative price or budget", m.Name)
	}
	return nil
}

// Result is what a demo run produced.
type Result struct {
	// Leaderboard is the boards flattened (coordinator.Rows); Boards the
	// boards themselves, one per suite, level and scoring.
	Leaderboard []leaderboard.FlatRow `json:"leaderboard"`
	Boards      []leaderboard.Board   `json:"boards"`
	// Attempts counts every replica run (canaries left out), Units the
	// runs they cross-checked.
	Attempts    int     `json:"attempts"`
	Units       int     `json:"units"`
	Failed      int     `json:"failed"`
	WallSeconds float64 `json:"wall_seconds"`
	Dir         string  `json:"dir"`
	// Reference says what the reference agent ran against ("" when it
	// was not evaluated).
	Reference string `json:"reference,omitempty"`
	// HALFiles are the HAL upload files written (Config.HALDir).
	HALFiles []string `json:"hal_files,omitempty"`
}

// Run runs the demo to completion.
func Run(ctx context.Context, cfg Config) (Result, error) {
	start := time.Now()
	if cfg.Nodes == 0 {
		cfg.Nodes = 3
	}
	if cfg.SlotsPerNode == 0 {
		cfg.SlotsPerNode = 2
	}
	if cfg.DaemonDir == "" {
		cfg.DaemonDir = sandbox.DefaultDaemonDir
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 15 * time.Minute
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	log := cfg.Logger
	if err := cfg.Model.Validate(); err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return Result{}, fmt.Errorf("demo: create %s: %w", cfg.Dir, err)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()

	say := func(format string, args ...any) { fmt.Fprintf(cfg.Progress, format+"\n", args...) }
	say("repronet demo: data and logs in %s", cfg.Dir)
	say("- containerd: ensuring a private daemon in %s", cfg.DaemonDir)
	d, err := sandbox.EnsureDaemon(ctx, cfg.DaemonDir, log)
	if err != nil {
		return Result{}, err
	}
	if err := ensureBusybox(ctx, log); err != nil {
		return Result{}, err
	}

	// The nodes are admitted with a join token, as a consortium's
	// volunteers are: only admitted operators count as independent.
	joinToken, err := writeJoinToken(filepath.Join(cfg.Dir, "join.token"))
	if err != nil {
		return Result{}, err
	}
	var ref *referenceRun
	if cfg.AgentBinary != "" {
		if ref, err = startReference(cfg.Model); err != nil {
			return Result{}, err
		}
		defer ref.close()
	}
	ccfg := coordinator.Config{
		Families:   families.Registry(),
		Checker:    families.Checker(),
		DataDir:    filepath.Join(cfg.Dir, "coordinator"),
		Logger:     log,
		Limits:     SampleLimits(),
		JoinTokens: []string{joinToken},
	}
	if ref != nil {
		ccfg.Gateway = ref.gateway
	}
	coord, err := coordinator.New(ctx, ccfg)
	if err != nil {
		return Result{}, err
	}
	defer coord.Close()
	say("- coordinator %s listening on %v", coord.ID(), coord.Addrs())

	if err := ImportSample(ctx, coord); err != nil {
		return Result{}, err
	}
	say("- imported %d sample capsules and agents %v over the capsule store", len(sample.CapsuleIDs()), sample.AgentNames())
	if ref != nil {
		if err := ref.register(ctx, coord, cfg.AgentBinary); err != nil {
			return Result{}, err
		}
		say("- %s", ref.label)
	} else {
		say("- the reference agent is not evaluated: no repronet-agent binary (build it with `make build`)")
	}

	// The sample capsules' environments (CORE-Bench Medium) build FROM
	// busybox: the nodes get it as a file instead of pulling it.
	base := filepath.Join(cfg.Dir, "sample-base.oci.tar")
	if err := agentimage.WriteBase(base, sample.BaseImage, BusyboxPath); err != nil {
		return Result{}, err
	}
	nodes, err := startNodes(ctx, cfg, coord.Addrs()[0].String(), d.Socket, base)
	if err != nil {
		return Result{}, err
	}
	defer stopNodes(nodes, log)
	if err := waitForNodes(ctx, coord, cfg.Nodes); err != nil {
		return Result{}, err
	}
	say("- %d nodes announced %d slots each (1 CPU / 4 GiB); they listen on loopback and serve each other capsules", cfg.Nodes, cfg.SlotsPerNode)

	levels := []string{string(corebench.Easy), string(corebench.Medium), string(corebench.Hard)}
	for _, agent := range sample.AgentNames() {
		if _, _, err := coord.Evaluate(ctx, coordinator.Evaluation{Suite: SuiteName, Agent: agent, Levels: levels, Runs: 1}); err != nil {
			return Result{}, err
		}
	}
	if ref != nil {
		if _, _, err := coord.Evaluate(ctx, ref.evaluation(levels)); err != nil {
			return Result{}, err
		}
	}
	if err := waitDone(ctx, coord, cfg.Progress); err != nil {
		return Result{}, err
	}
	p := coord.Progress()
	boards := CoreBenchBoards(coord.Boards())
	res := Result{Leaderboard: leaderboard.Flatten(boards), Boards: boards, Attempts: p.Total, Units: p.Units, Failed: p.Failed,
		Dir: cfg.Dir}
	if ref != nil {
		res.Reference = ref.label
	}
	if cfg.HALDir != "" {
		if res.HALFiles, err = WriteHAL(ctx, coord, cfg.HALDir); err != nil {
			return Result{}, err
		}
		say("- wrote %d HAL upload files to %s", len(res.HALFiles), cfg.HALDir)
	}
	res.WallSeconds = time.Since(start).Seconds()
	return res, nil
}

// CoreBenchBoards picks the CORE-Bench boards out of a coordinator's.
func CoreBenchBoards(boards []any) []leaderboard.Board {
	var out []leaderboard.Board
	for _, b := range boards {
		if lb, ok := b.(leaderboard.Board); ok {
			out = append(out, lb)
		}
	}
	return out
}

// SampleLimits are the limits of sample attempts: CORE-Bench's slot shape
// with a wall-clock limit fit for seconds-long sample capsules.
func SampleLimits() *proto.Limits {
	return &proto.Limits{CpuMillis: 1000, MemoryBytes: 4 << 30, Pids: 1024, WallSeconds: 120, OutputBytes: 256 << 10}
}

// ImportSample imports the sample suite, its capsules and both sample
// agents, declared deterministic (they answer a task alike on every honest
// node), so that their validated runs can be replayed as canaries.
func ImportSample(ctx context.Context, coord *coordinator.Coordinator) error {
	def, err := family.Def(SuiteName, sample.Tasks(), "", "")
	if err != nil {
		return err
	}
	if _, err := coord.ImportSuite(ctx, def); err != nil {
		return err
	}
	for _, id := range sample.CapsuleIDs() {
		tb, err := sample.CapsuleTarball(id)
		if err != nil {
			return err
		}
		if _, err := coord.AddCapsule(ctx, id, bytes.NewReader(tb)); err != nil {
			return err
		}
	}
	for _, name := range sample.AgentNames() {
		img, err := AgentImage(name, BusyboxPath)
		if err != nil {
			return err
		}
		info := coordinator.AgentInfo{Name: name, Model: "none (busybox sh)", Deterministic: true}
		if _, err := coord.AddAgentWith(ctx, info, bytes.NewReader(img)); err != nil {
			return err
		}
	}
	return nil
}

// AgentImage builds the OCI image tarball of a sample agent: busybox from
// Debian's busybox-static plus the agent's scripts (agentimage.Build).
func AgentImage(name, busybox string) ([]byte, error) {
	files, err := sample.AgentFiles(name)
	if err != nil {
		return nil, fmt.Errorf("agent %s: %w", name, err)
	}
	return agentimage.Build(name, busybox, files)
}

// ensureBusybox installs Debian's busybox-static when /bin/busybox is missing.
func ensureBusybox(ctx context.Context, log *slog.Logger) error {
	if _, err := os.Stat(BusyboxPath); err == nil {
		return nil
	}
	log.Info("installing busybox-static with apt-get")
	cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "busybox-static")
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("install busybox-static: %w: %s", err, tail(out, 2000))
	}
	return nil
}

type nodeProc struct {
	cmd *exec.Cmd
	log *os.File
}

// writeJoinToken writes a new random join token to path (readable by its
// owner only) and returns it.
func writeJoinToken(path string) (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("demo: join token: %w", err)
	}
	tok := hex.EncodeToString(b[:])
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("demo: join token: %w", err)
	}
	return tok, nil
}

func startNodes(ctx context.Context, cfg Config, coordAddr, socket, baseImage string) ([]nodeProc, error) {
	var procs []nodeProc
	for i := 1; i <= cfg.Nodes; i++ {
		dir := filepath.Join(cfg.Dir, fmt.Sprintf("node-%d", i))
		logf, err := os.Create(dir + ".log")
		if err != nil {
			stopNodes(procs, cfg.Logger)
			return nil, fmt.Errorf("demo: node %d log: %w", i, err)
		}
		// Each node listens on loopback, so the nodes can serve each other
		// the capsules they hold (the coordinator names them as providers).
		cmd := exec.Command(cfg.Binary, "node", "--data", dir, "--coordinator", coordAddr,
			"--listen", "/ip4/127.0.0.1/tcp/0", "--join-token-file", filepath.Join(cfg.Dir, "join.token"),
			"--slots", fmt.Sprint(cfg.SlotsPerNode), "--containerd", socket, "--namespace", fmt.Sprintf("repronet-demo-node-%d", i),
			"--base-image", baseImage)
		cmd.Stdout, cmd.Stderr = logf, logf
		// The nodes die with the demo, whatever ends it.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			stopNodes(procs, cfg.Logger)
			return nil, fmt.Errorf("demo: start node %d (%s): %w", i, cfg.Binary, err)
		}
		procs = append(procs, nodeProc{cmd: cmd, log: logf})
	}
	return procs, nil
}

func stopNodes(procs []nodeProc, log *slog.Logger) {
	for _, p := range procs {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		done := make(chan error, 1)
		go func() { done <- p.cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			log.Warn("node did not stop in 15 s; killing", "pid", p.cmd.Process.Pid)
			_ = p.cmd.Process.Kill()
			<-done
		}
		p.log.Close()
	}
}

func waitForNodes(ctx context.Context, coord *coordinator.Coordinator, n int) error {
	for {
		if len(coord.Nodes()) >= n {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("demo: waiting for %d nodes to announce, %d seen: %w", n, len(coord.Nodes()), ctx.Err())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// waitDone shows progress until every attempt is done or failed and every
// run is decided by the cross-check: a bar redrawn in place on a terminal,
// a line per change otherwise.
func waitDone(ctx context.Context, coord *coordinator.Coordinator, w io.Writer) error {
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	start := time.Now()
	tty := isTerminal(w)
	last := ""
	for {
		p := coord.Progress()
		line := fmt.Sprintf("  %s %d/%d runs cross-checked  %d/%d attempts  running %d  queued %d  failed %d", bar(p.Decided, p.Units, 30),
			p.Decided, p.Units, p.Done+p.Failed, p.Total, p.Assigned, p.Queued, p.Failed)
		switch {
		case tty:
			fmt.Fprintf(w, "\r%s  %s ", line, time.Since(start).Round(time.Second))
		case line != last:
			fmt.Fprintf(w, "%s  %s\n", line, time.Since(start).Round(100*time.Millisecond))
		}
		last = line
		if p.Total > 0 && p.Done+p.Failed == p.Total && p.Decided == p.Units {
			if tty {
				fmt.Fprintln(w)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(w)
			return fmt.Errorf("demo: %d of %d attempts unfinished: %w", p.Total-p.Done-p.Failed, p.Total, ctx.Err())
		case <-tick.C:
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func bar(done, total, width int) string {
	if total == 0 {
		return "[" + strings.Repeat(" ", width) + "]"
	}
	n := done * width / total
	return "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "]"
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// FormatLeaderboard renders rows as a text table: MODEL is the model the
// agent declared (the demo's reference agent on its scripted server says
// so), COST the mean model cost of a run when metered, VALIDATED the share
// of graded runs whose replicas agreed (only those are scored).
func FormatLeaderboard(rows []leaderboard.FlatRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s %-9s %-27s %9s %8s %8s %8s %9s %10s %6s  %s\n", "LEVEL", "AGENT", "MODEL", "ACCURACY", "CORRECT", "WRITTEN", "VISION",
		"COST", "VALIDATED", "INFRA", "GRADER / STRIP RULE")
	for _, r := range rows {
		cost := "-"
		if r.CostUSD != nil {
			cost = fmt.Sprintf("$%.4f", *r.CostUSD)
		}
		fmt.Fprintf(&b, "%-8s %-9s %-27s %8.1f%% %8s %8s %8s %9s %10s %6d  %s@%s / %s@%s\n", r.Level, r.Agent, r.Model, 100*r.Accuracy,
			fmt.Sprintf("%d/%d", r.Correct, r.Tasks), pct(r.WrittenAccuracy), pct(r.VisionAccuracy), cost,
			fmt.Sprintf("%d/%d", r.Validated, r.Validated+r.Inconsistent+r.Pending), r.InfraFailures,
			r.Grader, r.GraderVersion, r.StripRule, r.StripRuleVersion)
	}
	return b.String()
}

func pct(p *float64) string {
	if p == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100**p)
}

// JSON renders a result for --json.
func (r Result) JSON() ([]byte, error) { return json.MarshalIndent(r, "", "  ") }
