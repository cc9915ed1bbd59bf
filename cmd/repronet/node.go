package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"

	"github.com/repronet/repronet/internal/httpserve"
	"github.com/repronet/repronet/node"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
)

func runNode(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "status":
			return runNodeStatus(ctx, args[1:], stdout, stderr)
		case "drain", "resume":
			return runNodeDrain(ctx, args[0], args[1:], stdout, stderr)
		case "join":
			return runNodeJoin(ctx, args[1:], stdout, stderr)
		}
	}
	fs := newFlags("node", "node [--config FILE] --coordinator MULTIADDR [flags] | node status [--metrics ADDR] | node drain|resume [--control SOCKET] | node join URL|MULTIADDR TOKEN", stderr)
	configPath := fs.String(configFlag, "", "TOML configuration file holding any of these flags by name (e.g. /etc/repronet/node.toml); flags given here win")
	dataDir := fs.String("data", defaultDataDir("node"), "data folder: identity key, capsule cache, report outbox, and the sandbox's state (attempts' workspace images, in DATA/sandbox)")
	diskReserve := byteSize(node.DefaultDiskReserve)
	fs.Var(&diskReserve, "disk-reserve", "free space the data folder keeps: below it nothing more is written there, assignments are declined as busy and finished reports wait in memory until there is room; bytes, or with a K, M, G or T suffix")
	network := fs.String("network", "repronet-local", "network name (the capacity topic to announce on)")
	var coords, listen stringList
	fs.Var(&coords, "coordinator", "coordinator multiaddr with /p2p/ID, repeatable; the node connects out (no open port needed) and shares its slots among them")
	fs.Var(&listen, "listen", "optional libp2p listen multiaddr, repeatable (default: none)")
	slots := fs.Int("slots", 1, "attempts to run at once; each slot is 1 CPU / 4 GiB")
	socket := fs.String("containerd", sandbox.DefaultDaemonDir+"/containerd.sock", "containerd socket")
	namespace := fs.String("namespace", "repronet", "containerd namespace of this node's containers; every node sharing a daemon needs its own (leftovers in it are removed at start)")
	startDaemon := fs.String("start-containerd", "", "ensure a private containerd daemon runs in this folder (installing containerd and runc with apt-get if missing) and use its socket")
	operatorKey := fs.String("operator-key", "", "operator key file (created if missing): the node announces a certificate signed with it; give all nodes of one operator the same key")
	joinTokenFile := fs.String("join-token-file", "", "file holding the coordinators' join token: presented on connecting, it admits this node's operator (see repronet coordinator --join-token-file)")
	suites := fs.String("suites", "", "comma-separated suites this node serves (default: any)")
	groups := fs.String("groups", "", "comma-separated submitter groups this node serves (default: any)")
	announce := fs.Duration("announce-interval", 5*time.Second, "steady announcement period (every second for the first 30 s)")
	gossipGrace := fs.Duration("gossip-grace", 30*time.Second, "how long a connected coordinator may go without receiving this node's announcements (no gossipsub stream to it, or its subscription not heard) before the node closes the connection and dials again (0: default; negative: never)")
	diskDefault := byteSize(sandbox.DefaultDiskBytes)
	fs.Var(&diskDefault, "disk-default", "what an attempt whose limits set no disk_bytes may write besides its capsule (its workspace is this plus 3x the capsule tarball); bytes, or with a K, M, G or T suffix (powers of 1024)")
	imageCache := byteSize(sandbox.DefaultImageCacheBytes)
	fs.Var(&imageCache, "image-cache", "cap on the agent images kept in containerd (least recently used ones no attempt runs are removed); bytes, or with a K, M, G or T suffix")
	var cacheQuota byteSize
	fs.Var(&cacheQuota, "cache-quota", "cap on the capsule cache (capsules no running attempt uses are evicted, least recently used first); bytes, or with a K, M, G or T suffix; 0: no cap")
	var diskMax byteSize
	fs.Var(&diskMax, "disk-max", "largest workspace this node makes: attempts whose limits ask for more are declined, default sizes are capped to it (0: no maximum)")
	registries := fs.String("registries", strings.Join(node.DefaultRegistries(), ","), "comma-separated registry hosts (*.example.org for any name below) the node pulls the base images of jobs' environments from (CORE-Bench Medium: a capsule's environment/Dockerfile FROM), through an egress proxy that reaches nothing else; empty: none")
	var mirrors, baseImages, permits stringList
	fs.Var(&mirrors, "registry-mirror", "REGISTRY=URL, repeatable: a mirror tried first for images of that registry (e.g. docker.io=http://mirror.lan:5000); its host and port are allowed too")
	fs.Var(&baseImages, "base-image", "OCI image-layout tarball, repeatable: imported at start under the names it carries, so that environments built FROM them need no pull (an offline node)")
	fs.Var(&permits, "egress-permit", "IPv4 or IPv6 prefix, repeatable: an address the node's egress proxy (jobs' and registry pulls') may reach although it is not public, e.g. a mirror on your LAN (10.0.0.5/32)")
	drainGrace := fs.Duration("drain-grace", node.DefaultDrainGrace, "on SIGTERM (or repronet node drain) the node takes no new work and lets running attempts finish for this long, then hands the rest back to their coordinators (which requeue them at once, charging the node nothing); keep it under the service's stop timeout")
	control := fs.String("control", "", "unix socket of the node's local control (repronet node drain, resume, status), mode 0600 (default DATA/control.sock; \"off\": none)")
	metricsAddr := fs.String("metrics", "", "serve Prometheus metrics at http://ADDR/metrics, the node's status at /status (JSON, read by repronet node status) and a status page at / (e.g. 127.0.0.1:9101; default: off), within the --http-* limits")
	httpLimits := httpLimitFlags(fs)
	logLevel := fs.String("log-level", "info", "log level: debug, info, warn, error")
	logJSON := fs.Bool("log-json", false, "log as JSON lines")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if _, err := applyConfig(fs, *configPath); err != nil {
		return err
	}
	if len(coords) == 0 {
		return errNoCoordinator
	}
	log, err := newLogger(stderr, *logLevel, *logJSON)
	if err != nil {
		return err
	}
	limits, err := httpLimits()
	if err != nil {
		return err
	}
	mirrorMap, err := parseMirrors(mirrors)
	if err != nil {
		return err
	}
	permit, err := parsePrefixes(permits)
	if err != nil {
		return err
	}
	cfg := node.Config{
		Network: *network, DataDir: *dataDir, DiskReserve: uint64(diskReserve), Coordinators: coords, ListenAddrs: listen,
		Slots: *slots, Slot: &proto.SlotShape{CpuMillis: 1000, MemoryBytes: 4 << 30},
		Suites: splitList(*suites), Groups: splitList(*groups), AnnounceInterval: *announce, GossipGrace: *gossipGrace,
		DefaultDiskBytes: int64(diskDefault), MaxDiskBytes: int64(diskMax), CacheQuota: int64(cacheQuota), Logger: log,
		Registries: splitList(*registries), RegistryMirrors: mirrorMap, BaseImages: baseImages,
	}
	cfg.Egress.Permit = permit
	if cfg.Registries == nil {
		cfg.Registries = []string{} // none, not the default
	}
	// The host programs the sandbox runs (mkfs.ext4, ip, nft): installed
	// now, if missing, rather than in the middle of the first attempt.
	if err := sandbox.EnsureTools(ctx, log); err != nil {
		return err
	}
	if *joinTokenFile != "" {
		if cfg.JoinToken, err = readSecret("--join-token-file", *joinTokenFile, false); err != nil {
			return err
		}
	}
	if *operatorKey != "" {
		if cfg.OperatorKey, err = loadOrCreateKey(*operatorKey); err != nil {
			return fmt.Errorf("--operator-key: %w", err)
		}
	}
	if *startDaemon != "" {
		d, err := sandbox.EnsureDaemon(ctx, *startDaemon, log)
		if err != nil {
			return err
		}
		*socket = d.Socket
	}
	// The sandbox's state (each attempt's workspace image and mounts) lives
	// in the node's data folder; Reconcile removes what a crash left there.
	runner, err := sandbox.New(ctx, *socket, sandbox.WithNamespace(*namespace),
		sandbox.WithStateDir(filepath.Join(*dataDir, "sandbox")), sandbox.WithImageCacheBytes(int64(imageCache)), sandbox.WithLogger(log))
	if err != nil {
		return err
	}
	defer runner.Close()
	if n, err := runner.Reconcile(ctx); err != nil {
		return err
	} else if n > 0 {
		log.Warn("removed leftovers of earlier attempts", "count", n)
	}
	cfg.Sandbox = runner
	nd, err := node.New(ctx, cfg)
	if err != nil {
		return err
	}
	if *metricsAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", nd.MetricsHandler())
		mux.Handle("GET /status", nd.StatusHandler())
		mux.Handle("GET /{$}", nd.StatusPage())
		// Served while the node drains, after the stop signal.
		srv, err := httpserve.Start(context.WithoutCancel(ctx), *metricsAddr, mux, limits, log)
		if err != nil {
			nd.Close()
			return fmt.Errorf("--metrics %s: %w", *metricsAddr, err)
		}
		defer srv.Close()
		log.Info("metrics listening", "url", "http://"+srv.Addr().String()+"/metrics", "max_conns", srv.Limits().MaxConns)
	}
	if *control != "off" {
		path := cmpOr(*control, filepath.Join(*dataDir, controlSocket))
		stopControl, err := serveControl(path, nd.ControlHandler(*drainGrace), log)
		if err != nil {
			nd.Close()
			return fmt.Errorf("--control %s: %w", path, err)
		}
		defer stopControl()
	}
	<-ctx.Done()
	// Leave politely: no new work, running attempts finish within the
	// grace, the rest is handed back. A second signal ends the process.
	log.Info("node stopping: draining first", "grace", *drainGrace)
	nd.Drain(context.Background(), *drainGrace)
	return nd.Close()
}

// byteSize is a flag value of bytes: a count, or one with a K, M, G or T
// suffix (powers of 1024; "KiB", "MiB", "GiB", "TiB" and "KB"... alike).
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(s string) error {
	num := strings.TrimSpace(s)
	shift := 0
	upper := strings.ToUpper(num)
	for _, unit := range []struct {
		suffix string
		shift  int
	}{{"K", 10}, {"M", 20}, {"G", 30}, {"T", 40}} {
		for _, suf := range []string{unit.suffix + "IB", unit.suffix + "B", unit.suffix} {
			if strings.HasSuffix(upper, suf) {
				num, shift = strings.TrimSpace(num[:len(num)-len(suf)]), unit.shift
				break
			}
		}
		if shift != 0 {
			break
		}
	}
	n, err := strconv.ParseInt(num, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return fmt.Errorf("%q is not a size in bytes (e.g. 10737418240, 10G, 512MiB)", s)
	}
	*b = byteSize(n << shift)
	return nil
}

// parseMirrors reads --registry-mirror values (sandbox.ParseMirror).
func parseMirrors(vals []string) (map[string][]string, error) {
	out := map[string][]string{}
	for _, v := range vals {
		reg, url, err := sandbox.ParseMirror(v)
		if err != nil {
			return nil, fmt.Errorf("--registry-mirror: %w", err)
		}
		out[reg] = append(out[reg], url)
	}
	return out, nil
}

// parsePrefixes reads --egress-permit values: prefixes, or addresses (a
// single host).
func parsePrefixes(vals []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, v := range vals {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				return nil, fmt.Errorf("--egress-permit %q: not an address or prefix", v)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// loadOrCreateKey reads a libp2p private key file, or creates one (Ed25519,
// mode 0600) when it does not exist.
func loadOrCreateKey(path string) (crypto.PrivKey, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		k, err := crypto.UnmarshalPrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("read key %s: %w", path, err)
		}
		return k, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		return nil, err
	}
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		return nil, err
	}
	if b, err = crypto.MarshalPrivateKey(k); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, err
	}
	// Written aside, then linked into place: a concurrent creator's key
	// wins whole, never half-written.
	tmp, err := os.CreateTemp(filepath.Dir(path), ".key-*")
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return nil, err
	}
	if err := tmp.Close(); err != nil {
		return nil, err
	}
	if err := os.Link(tmp.Name(), path); errors.Is(err, fs.ErrExist) {
		return loadOrCreateKey(path)
	} else if err != nil {
		return nil, err
	}
	return k, nil
}
