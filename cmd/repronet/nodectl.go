package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/repronet/repronet/node"
)

// The node's local control (repronet node drain, resume) and its joining a
// network (repronet node join): see docs/volunteer.md.

// controlSocket is the control socket's name in the node's data folder.
const controlSocket = "control.sock"

// Where the packages keep the node's configuration (dist/).
const (
	defaultNodeConfig = "/etc/repronet/node.toml"
	nodeUnit          = "repronet-node.service"
)

var cmpOr = cmp.Or[string]

// serveControl serves h on a unix socket at path, mode 0600 (a stale socket
// left by a crash is replaced), until the func it returns is called.
func serveControl(path string, h http.Handler, log *slog.Logger) (func(), error) {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Warn("control socket", "err", err)
		}
	}()
	log.Info("control socket listening", "path", path)
	return func() {
		srv.Close()
		os.Remove(path)
	}, nil
}

// controlClient talks HTTP to a node's control socket.
func controlClient(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
}

// runNodeDrain asks the running node to drain (and waits until it has) or
// to take work again.
func runNodeDrain(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("node "+verb, "node "+verb+" [--control SOCKET | --data DIR | --config FILE] [--grace D] [--json]", stderr)
	config := fs.String("config", defaultNodeConfig, "the node's configuration file, for its data and control settings (when it exists)")
	dataDir := fs.String("data", defaultDataDir("node"), "the node's data folder (its control socket is DATA/"+controlSocket+")")
	control := fs.String("control", "", "the node's control socket (default DATA/"+controlSocket+")")
	grace := fs.Duration("grace", -1, "drain: how long running attempts may go on before they are handed back (default: the node's --drain-grace)")
	asJSON := fs.Bool("json", false, "print JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := fromNodeConfig(fs, *config, map[string]*string{"data": dataDir, "control": control}); err != nil {
		return err
	}
	if *control == "off" {
		return fmt.Errorf("the node's control socket is off (control = \"off\" in %s)", *config)
	}
	path := cmpOr(*control, filepath.Join(*dataDir, controlSocket))
	u := "http://node/" + verb
	if verb == "drain" && *grace >= 0 {
		u += "?grace=" + url.QueryEscape(grace.String())
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return err
	}
	resp, err := controlClient(path).Do(req)
	if err != nil {
		return fmt.Errorf("node control socket %s: %w (is the node running? as root: sudo)", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("node control socket %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("node %s: %s: %s", verb, resp.Status, strings.TrimSpace(string(body)))
	}
	if verb == "resume" {
		var st node.Status
		if err := json.Unmarshal(body, &st); err != nil {
			return fmt.Errorf("node resume: %w", err)
		}
		if *asJSON {
			return printJSON(stdout, st)
		}
		fmt.Fprintf(stdout, "node %s takes work again: %d slot(s)\n", st.Peer, st.TotalSlots)
		return nil
	}
	var res node.DrainResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("node drain: %w", err)
	}
	if *asJSON {
		return printJSON(stdout, res)
	}
	fmt.Fprintf(stdout, "drained in %s: %d attempt(s) finished, %d handed back", res.Took.Round(time.Millisecond), res.Finished, len(res.HandedBack))
	if k := len(res.NotHandedBack); k > 0 {
		fmt.Fprintf(stdout, ", %d could not be handed back (their leases run out)", k)
	}
	if res.Undelivered > 0 {
		fmt.Fprintf(stdout, "; %d report(s) wait in the outbox until the node runs again", res.Undelivered)
	}
	fmt.Fprintln(stdout, "\nThe node takes no new work until it restarts or `repronet node resume`.")
	return nil
}

// runNodeJoin admits the node's operator at a coordinator with a join
// token, then writes the node's configuration (the coordinator, its
// network, the token file) and, under systemd, (re)starts the node.
func runNodeJoin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("node join", "node join [flags] URL|MULTIADDR TOKEN  (TOKEN \"-\": read from standard input)", stderr)
	config := fs.String("config", defaultNodeConfig, "the node's configuration file to write (its other settings are kept)")
	tokenFile := fs.String("token-file", "", "where to keep the join token, mode 0600 (default: join.token beside --config)")
	dataDir := fs.String("data", defaultDataDir("node"), "the node's data folder (its identity is made there if missing)")
	operatorKey := fs.String("operator-key", "", "operator key file (created if missing): its signer is admitted, and the node is configured to use it")
	network := fs.String("network", "", "network name (default: the coordinator's, read from its URL; with a multiaddr: "+node.DefaultNetwork+")")
	restart := fs.String("restart", "auto", "after writing the configuration, enable and restart "+nodeUnit+": yes, no, or auto (yes when run as root under systemd with the default --config)")
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		fs.Usage()
		return errors.New("node join needs the coordinator (URL or multiaddr) and the join token")
	}
	// The node's data folder and operator key, unless given here, are the
	// ones its configuration names: the operator admitted is then the one
	// the node will announce.
	if err := fromNodeConfig(fs, *config, map[string]*string{"data": dataDir, "operator-key": operatorKey}); err != nil {
		return err
	}
	token := pos[1]
	if token == "-" {
		line, err := bufio.NewReader(os.Stdin).ReadString('\n')
		if err != nil && line == "" {
			return fmt.Errorf("read the join token from standard input: %w", err)
		}
		token = strings.TrimSpace(line)
	}
	if len(token) < minSecret {
		// The node reads its token file as any secret (readSecret).
		return fmt.Errorf("node join: a join token has at least %d characters", minSecret)
	}
	coord, netName, err := resolveCoordinator(ctx, pos[0])
	if err != nil {
		return err
	}
	netName = cmpOr(*network, netName, node.DefaultNetwork)
	opts := node.JoinOptions{DataDir: *dataDir, Network: netName, Coordinator: coord, Token: token}
	if *operatorKey != "" {
		if opts.OperatorKey, err = loadOrCreateKey(*operatorKey); err != nil {
			return fmt.Errorf("--operator-key: %w", err)
		}
	}
	res, err := node.Join(ctx, opts)
	if err != nil {
		return err
	}
	if !res.Admitted {
		return fmt.Errorf("coordinator %s refused the join token: %s (nothing written)", coord, res.Reason)
	}
	fmt.Fprintf(stdout, "node %s: operator %s admitted by %s (network %s)\n", res.Node, res.Operator, coord, netName)
	tf := cmpOr(*tokenFile, filepath.Join(filepath.Dir(*config), "join.token"))
	if err := writeFileAtomic(tf, []byte(token+"\n"), 0o600); err != nil {
		return fmt.Errorf("write the join token: %w", err)
	}
	set := map[string]string{"coordinator": tomlList(coord), "network": tomlString(netName), "join-token-file": tomlString(tf)}
	if *dataDir != defaultDataDir("node") {
		set["data"] = tomlString(*dataDir)
	}
	if *operatorKey != "" {
		abs, _ := filepath.Abs(*operatorKey)
		set["operator-key"] = tomlString(abs)
	}
	if err := setTOMLKeys(*config, set, "written by repronet node join, "+time.Now().UTC().Format(time.RFC3339)); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "wrote %s and %s\n", *config, tf)
	doRestart := *restart == "yes"
	if *restart == "auto" {
		_, err := os.Stat("/run/systemd/system")
		doRestart = err == nil && os.Geteuid() == 0 && *config == defaultNodeConfig
	}
	if !doRestart {
		fmt.Fprintf(stdout, "start the node with: repronet node --config %s\n", *config)
		return nil
	}
	for _, a := range [][]string{{"enable", nodeUnit}, {"restart", nodeUnit}} {
		if out, err := exec.CommandContext(ctx, "systemctl", a...).CombinedOutput(); err != nil {
			return fmt.Errorf("systemctl %s: %w: %s", strings.Join(a, " "), err, strings.TrimSpace(string(out)))
		}
	}
	fmt.Fprintf(stdout, "%s enabled and (re)started: see journalctl -u %s, repronet node status\n", nodeUnit, nodeUnit)
	return nil
}

// fromNodeConfig sets each of vals that the command line left unset from
// the node's configuration file, when it has that key.
func fromNodeConfig(flags *flag.FlagSet, path string, vals map[string]*string) error {
	var doc map[string]any
	if _, err := toml.DecodeFile(path, &doc); errors.Is(err, fs.ErrNotExist) {
		return nil
	} else if err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	set := map[string]bool{}
	flags.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for k, v := range vals {
		if s, ok := doc[k].(string); ok && s != "" && !set[k] {
			*v = s
		}
	}
	return nil
}

// parseInterspersed parses flags before, between and after positional
// arguments, and returns the positional ones.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// resolveCoordinator turns what a volunteer was given into the
// coordinator's full multiaddr, and its network when the coordinator says:
// a multiaddr is taken as it is; a URL is the coordinator's HTTP address,
// whose /api/network names its peer, network and listen addresses (the
// node dials the URL's host at the first TCP port it listens on).
func resolveCoordinator(ctx context.Context, s string) (addr, network string, err error) {
	if strings.HasPrefix(s, "/") {
		m, err := ma.NewMultiaddr(s)
		if err != nil {
			return "", "", fmt.Errorf("coordinator multiaddr %q: %w", s, err)
		}
		if _, err := m.ValueForProtocol(ma.P_P2P); err != nil {
			return "", "", fmt.Errorf("coordinator multiaddr %q has no /p2p/ID", s)
		}
		return s, "", nil
	}
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return "", "", fmt.Errorf("coordinator %q is neither a multiaddr (/ip4/.../p2p/ID) nor an http(s) URL", s)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(u.String(), "/")+"/api/network", nil)
	if err != nil {
		return "", "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", "", fmt.Errorf("coordinator %s: %w", s, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("coordinator %s: GET /api/network: %s", s, resp.Status)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", "", fmt.Errorf("coordinator %s: /api/network: %w", s, err)
	}
	return joinAddr(u.Hostname(), body)
}

// joinAddr reads a coordinator's /api/network answer and makes the
// multiaddr a node dials it at: host (its web address's), the first TCP
// port it listens on, its peer ID. It returns the network too.
func joinAddr(host string, body []byte) (addr, network string, err error) {
	var info struct {
		Network string   `json:"network"`
		Peer    string   `json:"peer"`
		Addrs   []string `json:"addrs"`
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return "", "", fmt.Errorf("coordinator %s: /api/network: %w", host, err)
	}
	if info.Peer == "" {
		return "", "", fmt.Errorf("coordinator %s does not say its peer ID (a version before node join): give its multiaddr instead", host)
	}
	prefix := "/dns/" + host
	if ip, err := netip.ParseAddr(host); err == nil {
		prefix = "/ip4/" + ip.String()
		if ip.Is6() {
			prefix = "/ip6/" + ip.String()
		}
	}
	for _, a := range info.Addrs {
		m, err := ma.NewMultiaddr(a)
		if err != nil {
			continue
		}
		if port, err := m.ValueForProtocol(ma.P_TCP); err == nil {
			addr = prefix + "/tcp/" + port + "/p2p/" + info.Peer
			if _, err := ma.NewMultiaddr(addr); err != nil {
				return "", "", fmt.Errorf("coordinator %s: no address to dial from %q and %q: %w", host, a, info.Peer, err)
			}
			if _, err := peer.AddrInfoFromString(addr); err != nil {
				return "", "", fmt.Errorf("coordinator %s: peer %q: %w", host, info.Peer, err)
			}
			return addr, info.Network, nil
		}
	}
	return "", "", fmt.Errorf("coordinator %s lists no TCP address to dial (%v)", host, info.Addrs)
}

func tomlString(s string) string { b, _ := json.Marshal(s); return string(b) }
func tomlList(s ...string) string {
	q := make([]string, len(s))
	for i, x := range s {
		q[i] = tomlString(x)
	}
	return "[" + strings.Join(q, ", ") + "]"
}

// setTOMLKeys sets top-level keys of a flat TOML file (one key = value a
// line, as dist/node.toml is): their lines are removed wherever they are,
// and written again at the end under a comment. The rest is kept as it is.
func setTOMLKeys(path string, set map[string]string, comment string) error {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	var out []string
	for _, line := range strings.Split(strings.TrimRight(string(old), "\n"), "\n") {
		k, _, found := strings.Cut(line, "=")
		if _, ours := set[strings.TrimSpace(k)]; found && ours {
			continue
		}
		if line != "" || len(out) > 0 {
			out = append(out, line)
		}
	}
	for len(out) > 0 && strings.TrimSpace(out[len(out)-1]) == "" {
		out = out[:len(out)-1]
	}
	out = append(out, "", "# "+comment)
	for _, k := range sortedKeys(set) {
		out = append(out, k+" = "+set[k])
	}
	return writeFileAtomic(path, []byte(strings.Join(out, "\n")+"\n"), 0o644)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// writeFileAtomic writes a file through a temporary one renamed into
// place, making its folder if needed.
func writeFileAtomic(path string, b []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
