package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/namespace"
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/capsulestore"
	"github.com/repronet/repronet/capsulestore/origin"
	"github.com/repronet/repronet/internal/badgerds"
	"github.com/repronet/repronet/internal/identity"
	"github.com/repronet/repronet/internal/p2phost"
)

const capsuleUsage = `Usage: repronet capsule <command> [flags] [args]

Content-addressed capsules in a local store (the badger datastore of a
--data folder, the same layout a node and a coordinator use; stop the daemon
that owns the folder first).

Commands:
  add FILE|DIR...                 import tarballs (a DIR: every *.tar.gz, *.tgz, *.tar in it);
                                  prints CID  SIZE  SHA256  NAME per tarball
  get CID -o FILE                 fetch a file from peers (--peer) and write it to FILE ("-": stdout;
                                  a regular FILE is replaced whole, a device or FIFO written into)
  ls                              list what the store holds
  verify CID...                   re-hash every block; with --peer, repair what is corrupt or missing
  extract CID DIR                 extract a capsule safely into DIR (created if missing)
  rm CID...                       remove files from the store
  fetch-origin CAPSULE_ID...      download CORE-Bench capsules from their origin and import them
  serve                           serve the store to peers until interrupted

Run 'repronet capsule <command> --help' for a command's flags.
`

// runCapsule implements "repronet capsule ...".
func runCapsule(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, capsuleUsage)
		return errors.New("a command is required")
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"add":          capsuleAdd,
		"get":          capsuleGet,
		"ls":           capsuleLs,
		"verify":       capsuleVerify,
		"extract":      capsuleExtract,
		"rm":           capsuleRm,
		"fetch-origin": capsuleFetchOrigin,
		"serve":        capsuleServe,
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, capsuleUsage)
		return nil
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprint(stderr, capsuleUsage)
		return fmt.Errorf("unknown capsule command %q", args[0])
	}
	return cmd(ctx, args[1:], stdout, stderr)
}

// capsuleFlags are the flags every capsule command has.
type capsuleFlags struct {
	fs       *flag.FlagSet
	data     *string
	logLevel *string
	peers    stringList
	stall    *time.Duration
}

func newCapsuleFlags(name, synopsis string, stderr io.Writer, withPeers bool) *capsuleFlags {
	cf := &capsuleFlags{fs: newFlags("capsule "+name, "capsule "+synopsis, stderr)}
	cf.data = cf.fs.String("data", defaultDataDir("node"), "data folder holding the store (a node's or coordinator's --data)")
	cf.logLevel = cf.fs.String("log-level", "warn", "log level: debug, info, warn, error")
	if withPeers {
		cf.fs.Var(&cf.peers, "peer", "multiaddr with /p2p/ID of a peer that holds the content, repeatable")
		cf.stall = cf.fs.Duration("stall", capsulestore.DefaultStallTimeout, "give up when no block arrives for this long (there is no limit on the total time)")
	}
	return cf
}

// parse parses flags placed anywhere among the arguments (get CID -o FILE)
// and returns the positional arguments.
func (cf *capsuleFlags) parse(args []string) ([]string, error) {
	var pos []string
	for {
		if err := cf.fs.Parse(args); err != nil {
			return nil, err
		}
		if cf.fs.NArg() == 0 {
			return pos, nil
		}
		rest := cf.fs.Args()
		if len(args) > 0 && len(rest) < len(args) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

func (cf *capsuleFlags) logger(stderr io.Writer) (*slog.Logger, error) {
	return newLogger(stderr, *cf.logLevel, false)
}

// positional parses args and requires at least one positional argument,
// printing the usage and returning need as the error when there is none.
func (cf *capsuleFlags) positional(args []string, need string) ([]string, error) {
	pos, err := cf.parse(args)
	if err != nil {
		return nil, err
	}
	if len(pos) == 0 {
		cf.fs.Usage()
		return nil, errors.New(need)
	}
	return pos, nil
}

// open makes the logger the flags ask for and opens the store in --data.
func (cf *capsuleFlags) open(ctx context.Context, stderr io.Writer, sn storeNet, opts ...capsulestore.Option) (*openedStore, *slog.Logger, error) {
	log, err := cf.logger(stderr)
	if err != nil {
		return nil, nil, err
	}
	s, err := openStore(ctx, *cf.data, sn, log, opts...)
	if err != nil {
		return nil, nil, err
	}
	return s, log, nil
}

func (cf *capsuleFlags) providers() ([]peer.AddrInfo, error) {
	var out []peer.AddrInfo
	for _, a := range cf.peers {
		ai, err := peer.AddrInfoFromString(a)
		if err != nil {
			return nil, fmt.Errorf("--peer %q: want a multiaddr ending in /p2p/ID: %w", a, err)
		}
		out = append(out, *ai)
	}
	return out, nil
}

// openedStore is a store over a data folder, with what must be closed.
type openedStore struct {
	*capsulestore.Store
	host    host.Host // nil when offline
	closers []func() error
}

func (o *openedStore) Close() error {
	var errs []error
	for i := len(o.closers) - 1; i >= 0; i-- {
		errs = append(errs, o.closers[i]())
	}
	return errors.Join(errs...)
}

// storeNet says whether and how a command's store talks to peers.
type storeNet struct {
	online bool
	listen []string
	key    bool // use the folder's identity key (stable peer ID)
}

func openStore(ctx context.Context, dataDir string, sn storeNet, log *slog.Logger, opts ...capsulestore.Option) (*openedStore, error) {
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, err
	}
	ds, err := badgerds.Open(dataDir, log)
	if err != nil {
		if strings.Contains(err.Error(), "Cannot acquire directory lock") {
			return nil, fmt.Errorf("%w (is a node or coordinator running on %s? stop it first)", err, dataDir)
		}
		return nil, err
	}
	o := &openedStore{closers: []func() error{ds.Close}}
	var store *capsulestore.Store
	blocks := namespace.Wrap(ds, datastore.NewKey("/blocks"))
	// The same block folder a node or coordinator on this data folder uses.
	opts = append([]capsulestore.Option{capsulestore.WithLogger(log), capsulestore.WithBlockDir(filepath.Join(dataDir, "blocks"))}, opts...)
	if sn.online {
		lopts := []libp2p.Option{libp2p.NoListenAddrs}
		if len(sn.listen) > 0 {
			lopts = []libp2p.Option{libp2p.ListenAddrStrings(sn.listen...)}
		}
		if sn.key {
			k, err := identity.LoadOrCreate(dataDir)
			if err != nil {
				o.Close()
				return nil, err
			}
			lopts = append(lopts, libp2p.Identity(k))
		}
		host, err := libp2p.New(append(lopts, p2phost.Option())...)
		if err != nil {
			o.Close()
			return nil, fmt.Errorf("start libp2p host: %w", err)
		}
		o.host = host
		o.closers = append(o.closers, host.Close)
		store, err = capsulestore.Open(ctx, blocks, host, opts...)
		if err != nil {
			o.Close()
			return nil, err
		}
	} else {
		store, err = capsulestore.Open(ctx, blocks, nil, opts...)
		if err != nil {
			o.Close()
			return nil, err
		}
	}
	o.Store = store
	o.closers = append(o.closers, store.Close)
	return o, nil
}

func printInfo(w io.Writer, i capsulestore.Info) {
	fmt.Fprintf(w, "%s  %d  %s  %s\n", i.CID, i.Size, i.SHA256, i.Name)
}

func capsuleAdd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("add", "add [--data DIR] FILE|DIR...", stderr, false)
	pos, err := cf.positional(args, "at least one FILE or DIR is required")
	if err != nil {
		return err
	}
	s, _, err := cf.open(ctx, stderr, storeNet{})
	if err != nil {
		return err
	}
	defer s.Close()
	var errs []error
	for _, p := range pos {
		fi, err := os.Stat(p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if fi.IsDir() {
			if _, err := s.AddDir(ctx, p, func(i capsulestore.Info) { printInfo(stdout, i) }); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		info, err := s.AddFile(ctx, p)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		printInfo(stdout, info)
	}
	return errors.Join(errs...)
}

func parseCID(s string) (cid.Cid, error) {
	c, err := cid.Decode(s)
	if err != nil {
		return cid.Undef, fmt.Errorf("CID %q: %w", s, err)
	}
	return c, nil
}

func capsuleGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("get", "get [--data DIR] [--peer MULTIADDR]... CID -o FILE", stderr, true)
	out := cf.fs.String("o", "", `write the file here ("-": standard output; a regular file is replaced whole, a device or FIFO such as /dev/null written into, a directory refused); required`)
	pos, err := cf.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 1 || *out == "" {
		cf.fs.Usage()
		return errors.New("one CID and -o FILE are required")
	}
	c, err := parseCID(pos[0])
	if err != nil {
		return err
	}
	// What -o names is checked before anything is fetched.
	dst, err := resolveOutput(*out)
	if err != nil {
		return fmt.Errorf("-o: %w", err)
	}
	provs, err := cf.providers()
	if err != nil {
		return err
	}
	log, err := cf.logger(stderr)
	if err != nil {
		return err
	}
	s, err := openStore(ctx, *cf.data, storeNet{online: true}, log,
		capsulestore.WithStallTimeout(*cf.stall), capsulestore.WithProgressInterval(200*time.Millisecond))
	if err != nil {
		return err
	}
	defer s.Close()
	if len(provs) == 0 {
		if has, err := s.Has(ctx, c); err != nil {
			return err
		} else if !has {
			return fmt.Errorf("%s is not (all) in the store at %s: give --peer MULTIADDR of a peer that holds it", c, *cf.data)
		}
	}
	bar := newProgressBar(stderr, "get "+shortCID(c))
	start := time.Now()
	var last capsulestore.Progress
	onProgress := func(p capsulestore.Progress) { last = p; bar.update(p) }
	if dst.kind == replaceFile {
		// Fetched straight into the file, each byte written once (the
		// store keeps the inner nodes and serves the leaves from the file).
		mode := fs.FileMode(0o644)
		if fi, err := os.Stat(dst.target); err == nil {
			mode = fi.Mode().Perm()
		}
		err = s.WriteTo(ctx, c, dst.target, onProgress, capsulestore.WithProviders(provs...), capsulestore.WithMode(mode))
		bar.finish()
		if err != nil {
			return fmt.Errorf("get %s: %w", c, err)
		}
	} else {
		err = s.Fetch(ctx, c, onProgress, capsulestore.WithProviders(provs...))
		bar.finish()
		if err != nil {
			return err
		}
		r, err := s.Open(ctx, c)
		if err != nil {
			return err
		}
		defer r.Close()
		if err := dst.write(stdout, func(w io.Writer) error { return copyWhole(w, r) }); err != nil {
			return fmt.Errorf("get %s: %w", c, err)
		}
	}
	if *out != "-" {
		fmt.Fprintf(stderr, "%s: %s in %s (%s/s from %d peers, %s from the network)\n", *out, capsulestore.FormatBytes(last.Total),
			capsulestore.FormatDuration(time.Since(start)), capsulestore.FormatBytes(int64(last.Rate)), last.Peers, capsulestore.FormatBytes(last.Fetched))
	}
	return nil
}

// copyWhole copies all of r, a file of the store, to w and checks that as
// many bytes came as the file's DAG says. (The store's reader stops when
// the context it was opened with ends.)
func copyWhole(w io.Writer, r io.Reader) error {
	n, err := io.Copy(w, r)
	if err != nil {
		return err
	}
	if s, ok := r.(interface{ Size() uint64 }); ok && uint64(n) != s.Size() {
		return fmt.Errorf("wrote %d bytes, the DAG says %d", n, s.Size())
	}
	return nil
}

func shortCID(c cid.Cid) string {
	s := c.String()
	if len(s) > 16 {
		return s[:8] + "…" + s[len(s)-6:]
	}
	return s
}

func capsuleLs(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("ls", "ls [--data DIR] [--json]", stderr, false)
	asJSON := cf.fs.Bool("json", false, "print JSON")
	pos, err := cf.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return errors.New("ls takes no arguments")
	}
	s, _, err := cf.open(ctx, stderr, storeNet{})
	if err != nil {
		return err
	}
	defer s.Close()
	entries, err := s.List(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		type jsonEntry struct {
			CID      string    `json:"cid"`
			Name     string    `json:"name,omitempty"`
			Size     int64     `json:"size"`
			SHA256   string    `json:"sha256,omitempty"`
			Bytes    int64     `json:"bytes"`
			Complete bool      `json:"complete"`
			Pinned   bool      `json:"pinned"`
			Added    time.Time `json:"added"`
			LastUsed time.Time `json:"last_used"`
		}
		out := make([]jsonEntry, 0, len(entries))
		for _, e := range entries {
			out = append(out, jsonEntry{e.CID.String(), e.Name, e.Size, e.SHA256, e.Bytes, e.Complete, e.Pinned, e.Added, e.LastUsed})
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CID\tSIZE\tSHA256\tNAME\tSTATE\tLAST USED")
	for _, e := range entries {
		state := "cached"
		switch {
		case !e.Complete:
			state = "partial"
		case e.Pinned:
			state = "pinned"
		}
		sha := e.SHA256
		if sha == "" {
			sha = "-"
		}
		name := e.Name
		if name == "" {
			name = "-"
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", e.CID, e.Size, sha, name, state, e.LastUsed.Local().Format("2006-01-02 15:04"))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	used, quota := s.Usage()
	q := "no quota"
	if quota > 0 {
		q = "quota " + capsulestore.FormatBytes(quota)
	}
	fmt.Fprintf(stderr, "%d files, %s (%s)\n", len(entries), capsulestore.FormatBytes(used), q)
	return nil
}

func capsuleVerify(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("verify", "verify [--data DIR] [--peer MULTIADDR]... [--no-repair] CID...", stderr, true)
	noRepair := cf.fs.Bool("no-repair", false, "only report; do not fetch corrupt or missing blocks again")
	pos, err := cf.positional(args, "at least one CID is required")
	if err != nil {
		return err
	}
	provs, err := cf.providers()
	if err != nil {
		return err
	}
	log, err := cf.logger(stderr)
	if err != nil {
		return err
	}
	repair := !*noRepair && len(provs) > 0
	s, err := openStore(ctx, *cf.data, storeNet{online: repair}, log, capsulestore.WithStallTimeout(*cf.stall))
	if err != nil {
		return err
	}
	defer s.Close()
	var errs []error
	for _, a := range pos {
		c, err := parseCID(a)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		var r capsulestore.VerifyReport
		if repair {
			r, err = s.Repair(ctx, c, capsulestore.WithProviders(provs...))
		} else {
			r, err = s.Verify(ctx, c)
		}
		switch {
		case err == nil && r.Repaired > 0:
			fmt.Fprintf(stdout, "%s  repaired  %d blocks fetched again; %d blocks, %d bytes, sha256 %s\n", c, r.Repaired, r.Blocks, r.Size, r.SHA256)
		case err == nil:
			fmt.Fprintf(stdout, "%s  ok  %d blocks, %d bytes, sha256 %s\n", c, r.Blocks, r.Size, r.SHA256)
		case errors.Is(err, capsulestore.ErrCorrupt):
			hint := ""
			if !repair {
				hint = " (repair with --peer MULTIADDR of a peer that holds it)"
			}
			fmt.Fprintf(stdout, "%s  CORRUPT  %d corrupt, %d missing blocks%s\n", c, len(r.Corrupt), len(r.Missing), hint)
			errs = append(errs, err)
		default:
			fmt.Fprintf(stdout, "%s  ERROR  %v\n", c, err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func capsuleExtract(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("extract", "extract [--data DIR] [--peer MULTIADDR]... CID DIR", stderr, true)
	pos, err := cf.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		cf.fs.Usage()
		return errors.New("CID and DIR are required")
	}
	c, err := parseCID(pos[0])
	if err != nil {
		return err
	}
	provs, err := cf.providers()
	if err != nil {
		return err
	}
	s, _, err := cf.open(ctx, stderr, storeNet{online: len(provs) > 0}, capsulestore.WithStallTimeout(*cf.stall))
	if err != nil {
		return err
	}
	defer s.Close()
	if err := os.MkdirAll(pos[1], 0o755); err != nil {
		return err
	}
	r, err := s.Open(ctx, c, capsulestore.WithProviders(provs...))
	if err != nil {
		return err
	}
	defer r.Close()
	st, err := capsulestore.Extract(ctx, r, pos[1], capsulestore.DefaultExtractLimits())
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%s: %d files, %d folders, %d symlinks, %d hard links, %d bytes\n", pos[1], st.Files, st.Dirs, st.Symlinks, st.HardLinks, st.Bytes)
	return nil
}

func capsuleRm(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("rm", "rm [--data DIR] CID...", stderr, false)
	pos, err := cf.positional(args, "at least one CID is required")
	if err != nil {
		return err
	}
	s, _, err := cf.open(ctx, stderr, storeNet{})
	if err != nil {
		return err
	}
	defer s.Close()
	var errs []error
	for _, a := range pos {
		c, err := parseCID(a)
		if err == nil {
			err = s.Remove(ctx, c)
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fmt.Fprintf(stdout, "%s  removed\n", c)
	}
	return errors.Join(errs...)
}

func capsuleFetchOrigin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("fetch-origin", "fetch-origin [--data DIR] [--base URL] [--keep] CAPSULE_ID...", stderr, false)
	base := cf.fs.String("base", origin.DefaultBaseURL, "base URL: a capsule is downloaded from BASE/CAPSULE_ID.tar.gz")
	keep := cf.fs.Bool("keep", false, "keep the downloaded tarballs in DATA/origin after importing them")
	retries := cf.fs.Int("retries", origin.DefaultRetries, "attempts in a row without progress before giving up on a capsule")
	stall := cf.fs.Duration("stall", origin.DefaultStallTimeout, "abandon and retry a request when no byte arrives for this long")
	pos, err := cf.positional(args, "at least one CAPSULE_ID (capsule-NNNNNNN) is required")
	if err != nil {
		return err
	}
	urls := make([]string, len(pos))
	for i, id := range pos {
		if urls[i], err = origin.CapsuleURL(*base, id); err != nil {
			return err
		}
	}
	s, log, err := cf.open(ctx, stderr, storeNet{})
	if err != nil {
		return err
	}
	defer s.Close()
	d := origin.New(origin.WithLogger(log), origin.WithRetries(*retries), origin.WithStallTimeout(*stall),
		origin.WithProgressInterval(200*time.Millisecond))
	dir := filepath.Join(*cf.data, "origin")
	var errs []error
	for i, id := range pos {
		path := filepath.Join(dir, id+".tar.gz")
		bar := newProgressBar(stderr, id)
		res, err := d.Download(ctx, urls[i], path, bar.update)
		bar.finish()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", id, err))
			if ctx.Err() != nil {
				break
			}
			continue
		}
		info, err := s.AddFile(ctx, path)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if info.SHA256 != res.SHA256 {
			errs = append(errs, fmt.Errorf("%s: imported sha256 %s differs from the download's %s", id, info.SHA256, res.SHA256))
			continue
		}
		printInfo(stdout, info)
		if !*keep {
			if err := os.Remove(path); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

func capsuleServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cf := newCapsuleFlags("serve", "serve [--data DIR] [--listen MULTIADDR]...", stderr, false)
	var listen stringList
	cf.fs.Var(&listen, "listen", "libp2p listen multiaddr, repeatable (default /ip4/0.0.0.0/tcp/4002)")
	pos, err := cf.parse(args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return errors.New("serve takes no arguments")
	}
	if len(listen) == 0 {
		listen = stringList{"/ip4/0.0.0.0/tcp/4002"}
	}
	s, _, err := cf.open(ctx, stderr, storeNet{online: true, listen: listen, key: true})
	if err != nil {
		return err
	}
	defer s.Close()
	for _, a := range s.host.Addrs() {
		fmt.Fprintf(stdout, "%s/p2p/%s\n", a, s.host.ID())
	}
	<-ctx.Done()
	return nil
}

// progressBar shows a Progress on a terminal (redrawn in place), or as a
// line every few seconds when the output is not a terminal (a log file).
type progressBar struct {
	w     io.Writer
	label string
	tty   bool
	last  time.Time
	shown bool
}

func newProgressBar(w io.Writer, label string) *progressBar {
	tty := false
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			tty = true
		}
	}
	return &progressBar{w: w, label: label, tty: tty}
}

func (b *progressBar) update(p capsulestore.Progress) {
	now := time.Now()
	complete := p.Total > 0 && p.Done >= p.Total
	if b.tty {
		if now.Sub(b.last) < 100*time.Millisecond && !complete {
			return
		}
		const width = 30
		fill := int(p.Fraction() * width)
		bar := strings.Repeat("=", fill) + strings.Repeat(" ", width-fill)
		if fill > 0 && fill < width {
			bar = bar[:fill-1] + ">" + bar[fill:]
		}
		fmt.Fprintf(b.w, "\r%s [%s] %s\x1b[K", b.label, bar, p)
	} else {
		if now.Sub(b.last) < 5*time.Second && !complete {
			return
		}
		fmt.Fprintf(b.w, "%s: %s\n", b.label, p)
	}
	b.last, b.shown = now, true
}

// finish ends the bar's line.
func (b *progressBar) finish() {
	if b.tty && b.shown {
		fmt.Fprintln(b.w)
	}
}
