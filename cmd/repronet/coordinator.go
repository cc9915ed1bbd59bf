package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/internal/httpserve"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox/ociimage"
)

func runCoordinator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && (args[0] == "backup" || args[0] == "restore") {
		return runCoordinatorBackup(ctx, args, stdout, stderr)
	}
	fs := newFlags("coordinator", "coordinator [--config FILE] [flags]", stderr)
	configPath := fs.String(configFlag, "", "TOML configuration file: any flag by its name (flags given here win), and the model gateway's [[providers]] (name, api: openai, anthropic or gemini, base_url, key_file or key_env), [[models]] (name, provider, upstream, price = {input, output, cached_input, cache_write} in dollars per million tokens, max_output) and [limits]; without providers agents get no model access and evaluations naming models are refused (docs/gateway.md)")
	dataDir := fs.String("data", defaultDataDir("coordinator"), "data folder: identity key and badger state")
	diskReserve := byteSize(coordinator.DefaultDiskReserve)
	fs.Var(&diskReserve, "disk-reserve", "free space the data folder keeps: below it nothing more is written, reports are answered retry (nodes keep them), evaluations are refused (HTTP 507), reads go on, and all resumes once there is room; bytes, or with a K, M, G or T suffix")
	maxImage := byteSize(ociimage.DefaultUnpackedBytes)
	fs.Var(&maxImage, "max-image-unpacked", "refuse agent images whose files add up to more than this (checked at the push as nodes check them: no device files, no dangling links; docs/agents.md); bytes, or with a K, M, G or T suffix")
	network := fs.String("network", coordinator.DefaultNetwork, "network name (the nodes' capacity topic); coordinators of one network share its nodes")
	var listen stringList
	fs.Var(&listen, "listen", "libp2p listen multiaddr, repeatable (default /ip4/0.0.0.0/tcp/4001)")
	httpAddr := fs.String("http", "127.0.0.1:8080", "address of the HTTP API and the dashboard (public: the leaderboards, the pool's size and credit, reproducibility checks by ID; submitters, with a token of their group: their agents, evaluations and attempts; admin: everything, /metrics included; see docs/api.md); empty to disable")
	adminTokenFile := fs.String("admin-token-file", "", "file holding the bearer token of the admin API (accounts: repronet admin; every attempt, report and node; reproducibility checks); without it the admin endpoints are off and no submitter can be made")
	joinTokenFile := fs.String("join-token-file", "", "file holding a standing join token (created with a new random token if missing): a node started with the same file is admitted, and its operator counts as independent of other admitted operators")
	var admitOps stringList
	fs.Var(&admitOps, "admit-operator", "peer ID of an operator (the key of its nodes' operator certificates, or a node's own ID) to admit, repeatable")
	openOps := fs.Bool("open-operators", false, "count every operator certificate, self-made or not, as an independent operator (only for a pool run by one person: anyone can make many keys)")
	addrFile := fs.String("addr-file", "", "write the coordinator's first full multiaddr to this file once listening (replaced whole; \"-\": standard output)")
	httpLimits := httpLimitFlags(fs)
	suite := fs.String("suite", "corebench", "name to import --tasks under")
	tasks := fs.String("tasks", "", "CORE-Bench task file to import (JSON, or OpenPGP-encrypted with --passphrase)")
	passphrase := fs.String("passphrase", "", "passphrase of an OpenPGP --tasks file (CORE-Bench's test split: reproducibility)")
	stripRule := fs.String("strip-rule", corebench.OriginalStripRuleName, "strip rule of the imported suite: "+strings.Join(corebench.StripRuleNames(), ", "))
	suiteLimits := fs.String("suite-limits", "", `JSON file of the imported suite's sandbox settings, e.g. {"wall_seconds":2700,"disk_bytes":21474836480,"network":"egress","allow":["tcp:10.0.0.0/8:443"]}; unset fields keep the defaults`)
	capsules := fs.String("capsules", "", "folder of capsule tarballs named capsule-NNNNNNN.tar.gz to import")
	grader := fs.String("grader", family.DefaultGrader, "grader of the imported suite")
	withSample := fs.Bool("sample", false, "import the sample CORE-Bench suite (as "+demo.SuiteName+") and its oracle and wrong agents, once, and use the sample limits")
	var agents, evaluate, deterministic, models stringList
	fs.Var(&agents, "agent", "NAME=OCI_TARBALL: register an agent image, repeatable")
	fs.Var(&deterministic, "deterministic", "NAME: declare a registered agent deterministic (its replicas must agree exactly; its validated runs become canaries), repeatable")
	fs.Var(&models, "model", "NAME=MODEL: declare a registered agent's primary model (a leaderboard column), repeatable")
	fs.Var(&evaluate, "evaluate", "agent to evaluate on every task of --suite, repeatable")
	levels := fs.String("levels", "easy,medium,hard", "levels for --evaluate")
	runs := fs.Int("runs", 1, "runs per task and level for --evaluate")
	replicas := fs.Int("replicas", 0, "replicas of each run for --evaluate, on distinct nodes and operators (0: the cross-check policy's adaptive replication, --quorum)")
	quorum := fs.Int("quorum", 2, "agreeing replicas, on distinct nodes and operators, a run needs (fewer for trusted nodes a spot check spares)")
	trustAfter := fs.Int("trust-after", 10, "consecutive valid results after which a node's results may stand alone (spot-checked with probability 1/consecutive valid)")
	maxReplicas := fs.Int("max-replicas", 5, "replicas of a run without agreement after which it is marked inconsistent")
	canaryRate := fs.Float64("canary-rate", 0.05, "least probability that a job given to a node is a canary (new nodes get more)")
	idleCanary := fs.Duration("idle-canary-every", 10*time.Minute, "give a node idle this long a canary now and then (negative: never)")
	publicEvery := fs.Duration("public-boards-every", time.Minute, "the public leaderboard endpoints serve a snapshot at most this old, so a node cannot time a board's change against its own reports (negative: live); admin requests see them live")
	evalID := fs.String("eval-id", "", "ID of the --evaluate request (with several agents, suffixed -AGENT): a restart with the same flags queues nothing twice")
	group := fs.String("group", "", "submitter group of --evaluate (fair share)")
	priority := fs.Int("priority", 0, "priority of --evaluate within its group")
	groupsFile := fs.String("groups", "", `JSON file of group policies: {"GROUP": {"weight": 1, "quota": 10, "accept_surplus": true}}`)
	halfLife := fs.Duration("half-life", coordinator.DefaultHalfLife, "fair-share usage half-life")
	leaseTTL := fs.Duration("lease-ttl", 30*time.Second, "lease of an assignment without renewal")
	nodeTTL := fs.Duration("node-ttl", 15*time.Second, "how long a node stays in view after its last announcement")
	unschedulable := fs.Duration("unschedulable-after", coordinator.DefaultUnschedulableAfter, "an attempt that no node in view can run (limits over every slot, suite, group or GPUs not served, every node that could failed or declined it) ends with outcome unschedulable and the reason after this long")
	maxConnsPerIP := fs.Int("max-conns-per-ip", p2phost.DefaultMaxConnsPerIP, "libp2p connections accepted from one IPv4 address (IPv6: one /56, 8x that from one /48); every node of a consortium behind one NAT address counts against it; new connections from one address are rate-limited to a burst of twice this, then this/40 a second; loopback is never limited")
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logJSON := fs.Bool("log-json", false, "log as JSON lines")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tables, err := applyConfig(fs, *configPath, gatewayTables...)
	if err != nil {
		return err
	}
	gw, err := gatewayConfig(*configPath, tables)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, *logLevel, *logJSON)
	if err != nil {
		return err
	}
	limits, err := httpLimits()
	if err != nil {
		return err
	}
	var addrOut output
	if *addrFile != "" {
		if addrOut, err = resolveOutput(*addrFile); err != nil {
			return fmt.Errorf("--addr-file: %w", err)
		}
	}
	if len(listen) == 0 {
		listen = stringList{"/ip4/0.0.0.0/tcp/4001"}
	}
	if *maxConnsPerIP < 1 {
		return fmt.Errorf("--max-conns-per-ip must be at least 1, got %d", *maxConnsPerIP)
	}
	policy := crosscheck.DefaultPolicy()
	policy.Quorum, policy.TrustAfter, policy.MaxReplicas, policy.CanaryRate = *quorum, *trustAfter, *maxReplicas, *canaryRate
	if err := policy.Validate(); err != nil {
		return err
	}
	cfg := coordinator.Config{Families: families.Registry(), Checker: families.Checker(), Network: *network, DataDir: *dataDir, DiskReserve: uint64(diskReserve), ListenAddrs: listen, Logger: log,
		LeaseTTL: *leaseTTL, NodeTTL: *nodeTTL, UnschedulableAfter: *unschedulable, HalfLife: *halfLife, CrossCheck: &policy,
		IdleCanaryEvery: *idleCanary, PublicBoardsEvery: *publicEvery, MaxConnsPerIP: *maxConnsPerIP, Gateway: gw, MaxImageUnpacked: int64(maxImage)}
	if *withSample {
		cfg.Limits = demo.SampleLimits()
	}
	if *groupsFile != "" {
		b, err := os.ReadFile(*groupsFile)
		if err != nil {
			return fmt.Errorf("--groups: %w", err)
		}
		if err := json.Unmarshal(b, &cfg.Groups); err != nil {
			return fmt.Errorf("--groups %s: %w", *groupsFile, err)
		}
	}
	if *adminTokenFile != "" {
		if cfg.AdminToken, err = readSecret("--admin-token-file", *adminTokenFile, false); err != nil {
			return err
		}
	}
	if *joinTokenFile != "" {
		tok, err := readSecret("--join-token-file", *joinTokenFile, true)
		if err != nil {
			return err
		}
		cfg.JoinTokens = []string{tok}
	}
	cfg.Operators, cfg.OpenOperators = admitOps, *openOps
	c, err := coordinator.New(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	addrs := c.Addrs()
	for _, a := range addrs {
		fmt.Fprintln(stdout, a)
	}
	if *withSample && !sampleImported(c) {
		if err := demo.ImportSample(ctx, c); err != nil {
			return fmt.Errorf("--sample: %w", err)
		}
		log.Info("sample suite imported", "suite", demo.SuiteName)
	}
	imp := suiteImport{name: *suite, tasks: *tasks, passphrase: *passphrase, grader: *grader, stripRule: *stripRule, limits: *suiteLimits}
	if err := importFromFlags(ctx, c, imp, *capsules, agents); err != nil {
		return err
	}
	if err := declareAgents(ctx, c, deterministic, models); err != nil {
		return err
	}
	if len(evaluate) > 0 {
		if err := evaluateFromFlags(ctx, c, log, evaluate, evalSpec{suite: *suite, levels: *levels, runs: *runs,
			replicas: *replicas, id: *evalID, group: *group, priority: *priority}); err != nil {
			return err
		}
	}
	if *httpAddr != "" {
		srv, err := httpserve.Start(ctx, *httpAddr, c.Handler(), limits, log)
		if err != nil {
			return fmt.Errorf("--http %s: %w", *httpAddr, err)
		}
		defer srv.Close()
		log.Info("HTTP API listening", "addr", srv.Addr().String(), "submit", cfg.AdminToken != "", "max_conns", srv.Limits().MaxConns)
	}
	// Written last: whoever waits for this file may use the API at once.
	if *addrFile != "" && len(addrs) > 0 {
		if err := addrOut.write(stdout, func(w io.Writer) error {
			_, err := io.WriteString(w, addrs[0].String()+"\n")
			return err
		}); err != nil {
			return fmt.Errorf("--addr-file: %w", err)
		}
	}
	<-ctx.Done()
	log.Info("coordinator stopping")
	return nil
}

// sampleImported reports whether the sample suite and both its agents are
// there (an import cut short by a crash is done again).
func sampleImported(c *coordinator.Coordinator) bool {
	if !c.HasSuite(demo.SuiteName) {
		return false
	}
	for _, a := range sample.AgentNames() {
		if !c.HasAgent(a) {
			return false
		}
	}
	return true
}

type evalSpec struct {
	suite, levels, id, group string
	runs, replicas, priority int
}

func evaluateFromFlags(ctx context.Context, c *coordinator.Coordinator, log *slog.Logger, agents []string, spec evalSpec) error {
	var lv []string
	for _, s := range strings.Split(spec.levels, ",") {
		if s = strings.TrimSpace(s); s != "" {
			lv = append(lv, s)
		}
	}
	for _, agent := range agents {
		id := spec.id
		if id != "" && len(agents) > 1 {
			id += "-" + agent
		}
		if id != "" {
			if err := proto.ValidateAttemptID(id); err != nil {
				return fmt.Errorf("--eval-id: %w", err)
			}
		}
		eid, n, err := c.Evaluate(ctx, coordinator.Evaluation{ID: id, Suite: spec.suite, Agent: agent, Levels: lv,
			Runs: spec.runs, Replicas: spec.replicas, Group: spec.group, Priority: spec.priority})
		if err != nil {
			return err
		}
		log.Info("evaluation queued", "eval", eid, "agent", agent, "attempts", n)
	}
	return nil
}

// suiteImport is what the coordinator's flags say about a suite to import.
type suiteImport struct {
	name, tasks, passphrase, grader, stripRule, limits string
}

func (s suiteImport) load(ctx context.Context, c *coordinator.Coordinator) error {
	data, err := os.ReadFile(s.tasks)
	if err != nil {
		return fmt.Errorf("--tasks: %w", err)
	}
	tasks, err := corebench.LoadTasks(data, corebench.LoadOptions{Passphrase: []byte(s.passphrase), Parse: corebench.ParseOptions{AllowGPUKey: true}})
	if err != nil {
		return fmt.Errorf("--tasks %s: %w", s.tasks, err)
	}
	plain, err := json.Marshal(tasks)
	if err != nil {
		return fmt.Errorf("--tasks %s: %w", s.tasks, err)
	}
	var opts []coordinator.SuiteOption
	if s.limits != "" {
		b, err := os.ReadFile(s.limits)
		if err != nil {
			return fmt.Errorf("--suite-limits: %w", err)
		}
		var l coordinator.SuiteLimits
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&l); err != nil {
			return fmt.Errorf("--suite-limits %s: %w", s.limits, err)
		}
		opts = append(opts, coordinator.WithSuiteLimits(l))
	}
	def, err := family.Def(s.name, plain, s.grader, s.stripRule)
	if err != nil {
		return err
	}
	_, err = c.ImportSuite(ctx, def, opts...)
	return err
}

func importFromFlags(ctx context.Context, c *coordinator.Coordinator, suite suiteImport, capsules string, agents []string) error {
	if suite.tasks != "" {
		if err := suite.load(ctx, c); err != nil {
			return err
		}
	}
	if capsules != "" {
		paths, err := filepath.Glob(filepath.Join(capsules, "capsule-*.tar.gz"))
		if err != nil {
			return fmt.Errorf("--capsules: %w", err)
		}
		if len(paths) == 0 {
			return fmt.Errorf("--capsules %s: no capsule-*.tar.gz file", capsules)
		}
		for _, p := range paths {
			if err := addFile(p, func(r io.Reader) error {
				_, err := c.AddCapsule(ctx, strings.TrimSuffix(filepath.Base(p), ".tar.gz"), r)
				return err
			}); err != nil {
				return err
			}
		}
	}
	for _, a := range agents {
		name, path, ok := strings.Cut(a, "=")
		if !ok || name == "" || path == "" {
			return fmt.Errorf("--agent %q: want NAME=OCI_TARBALL", a)
		}
		if err := addFile(path, func(r io.Reader) error {
			_, err := c.AddAgent(ctx, name, r)
			return err
		}); err != nil {
			return err
		}
	}
	return nil
}

// declareAgents applies --deterministic and --model to registered agents.
func declareAgents(ctx context.Context, c *coordinator.Coordinator, deterministic, models []string) error {
	infos := map[string]*coordinator.AgentInfo{}
	get := func(name string) (*coordinator.AgentInfo, error) {
		if infos[name] == nil {
			a, ok := c.Agent(name)
			if !ok {
				return nil, fmt.Errorf("agent %q is not registered", name)
			}
			infos[name] = &coordinator.AgentInfo{Name: name, Model: a.Model, Deterministic: a.Deterministic}
		}
		return infos[name], nil
	}
	for _, name := range deterministic {
		info, err := get(name)
		if err != nil {
			return fmt.Errorf("--deterministic: %w", err)
		}
		info.Deterministic = true
	}
	for _, m := range models {
		name, model, ok := strings.Cut(m, "=")
		if !ok || name == "" || model == "" {
			return fmt.Errorf("--model %q: want NAME=MODEL", m)
		}
		info, err := get(name)
		if err != nil {
			return fmt.Errorf("--model: %w", err)
		}
		info.Model = model
	}
	for _, info := range infos {
		if err := c.SetAgentInfo(ctx, *info); err != nil {
			return err
		}
	}
	return nil
}

func addFile(path string, add func(io.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return add(f)
}

// defaultDataDir is /var/lib/repronet/NAME for root, else ~/.local/share/repronet/NAME.
func defaultDataDir(name string) string {
	if os.Geteuid() == 0 {
		return filepath.Join("/var/lib/repronet", name)
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(".repronet", name)
	}
	return filepath.Join(home, ".local", "share", "repronet", name)
}

var errNoCoordinator = errors.New("at least one --coordinator is required")
