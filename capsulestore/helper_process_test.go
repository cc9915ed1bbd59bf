package capsulestore

// The benchmarks run peers as separate OS processes: the test binary
// re-executes itself with CAPSULESTORE_HELPER=peer (TestMain below), opens a
// store over the production badger settings (internal/badgerds) on a libp2p
// host with the default transports, like a node, and obeys one-line
// commands on stdin, answering one line on stdout:
//
//	gen SIZE SEED PATH      write SIZE deterministic bytes to PATH
//	add PATH                import PATH                  -> ok {"cid":...}
//	fetch CID [MULTIADDR..] fetch with provider hints    -> ok {"elapsed_ms":...}
//	httpget URL PATH        download over HTTP to PATH   -> ok {"elapsed_ms":...}
//	getfile CID NAME [MA..] WriteTo files/NAME            -> ok {"elapsed_ms":...}
//	sha256 NAME             sha256 of files/NAME         -> ok {"sha256":...}
//	stats                   bitswap bytes sent           -> ok {"sent":...}
//	import SIZE SEED        streamed import, memory peak -> ok {"peak_rss":...}
//
// A failed command answers "err MESSAGE". The process exits at EOF.

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/namespace"
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/repronet/repronet/internal/badgerds"
	"github.com/repronet/repronet/internal/p2phost"
)

const helperEnv = "CAPSULESTORE_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "peer" {
		if err := runPeer(); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// runPeer is the helper process. Environment: CS_DIR (data folder),
// CS_LISTEN (libp2p listen multiaddr), CS_HTTP (optional: serve CS_DIR/files
// over HTTP on this address). By default the peer is set up as node and
// coordinator are: blocks as files in CS_DIR/blocks (WithBlockDir) and
// p2phost's transport stack. CS_BLOCKS=badger keeps blocks in badger
// instead; CS_STACK=stock uses libp2p's default stack.
func runPeer() error {
	ctx := context.Background()
	dir := os.Getenv("CS_DIR")
	if prof := os.Getenv("CS_CPUPROFILE"); prof != "" {
		// One profile per process: the name gets the pid.
		f, err := os.Create(fmt.Sprintf("%s.%d", prof, os.Getpid()))
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if lv := os.Getenv("CS_LOG"); lv == "info" {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	out := bufio.NewWriter(os.Stdout)
	reply := func(ok bool, v any) {
		if ok {
			b, _ := json.Marshal(v)
			fmt.Fprintf(out, "ok %s\n", b)
		} else {
			fmt.Fprintf(out, "err %v\n", v)
		}
		out.Flush()
	}
	if cmdArgs := os.Getenv("CS_ONESHOT"); cmdArgs != "" {
		// A command that needs a fresh process (memory peaks).
		v, err := helperImport(ctx, dir, strings.Fields(cmdArgs), log)
		reply(err == nil, orErr(err, v))
		return nil
	}
	ds, err := badgerds.Open(dir, log)
	if err != nil {
		return err
	}
	defer ds.Close()
	hopts := []libp2p.Option{libp2p.ListenAddrStrings(os.Getenv("CS_LISTEN"))}
	if os.Getenv("CS_STACK") != "stock" {
		hopts = append(hopts, p2phost.Option())
	}
	h, err := libp2p.New(hopts...)
	if err != nil {
		return err
	}
	defer h.Close()
	opts := []Option{WithLogger(log), WithStallTimeout(30 * time.Second)}
	if os.Getenv("CS_BLOCKS") != "badger" {
		opts = append(opts, WithBlockDir(filepath.Join(dir, "blocks")))
	}
	s, err := Open(ctx, namespace.Wrap(ds, datastore.NewKey("/blocks")), h, opts...)
	if err != nil {
		return err
	}
	defer s.Close()
	files := filepath.Join(dir, "files")
	if err := os.MkdirAll(files, 0o755); err != nil {
		return err
	}
	if addr := os.Getenv("CS_HTTP"); addr != "" {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: http.FileServer(http.Dir(files))}
		go srv.Serve(ln)
		defer srv.Close()
	}
	var addrs []string
	for _, a := range h.Addrs() {
		addrs = append(addrs, a.String()+"/p2p/"+h.ID().String())
	}
	reply(true, map[string]any{"addrs": addrs})

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		v, err := helperCommand(ctx, s, files, f)
		reply(err == nil, orErr(err, v))
	}
	return nil
}

func orErr(err error, v any) any {
	if err != nil {
		return err
	}
	return v
}

func helperCommand(ctx context.Context, s *Store, files string, f []string) (any, error) {
	switch {
	case f[0] == "gen" && len(f) == 4:
		size, err1 := strconv.ParseInt(f[1], 10, 64)
		seed, err2 := strconv.ParseUint(f[2], 10, 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, err
		}
		w, err := os.Create(filepath.Join(files, f[3]))
		if err != nil {
			return nil, err
		}
		if _, err := io.Copy(w, fastReader(seed, size)); err != nil {
			w.Close()
			return nil, err
		}
		return map[string]any{}, w.Close()
	case f[0] == "add" && len(f) == 2:
		start := time.Now()
		info, err := s.AddFile(ctx, filepath.Join(files, f[1]))
		if err != nil {
			return nil, err
		}
		return map[string]any{"cid": info.CID.String(), "size": info.Size, "sha256": info.SHA256,
			"elapsed_ms": time.Since(start).Milliseconds()}, nil
	case f[0] == "fetch" && len(f) >= 2:
		c, err := cid.Decode(f[1])
		if err != nil {
			return nil, err
		}
		var hints []peer.AddrInfo
		for _, a := range f[2:] {
			ai, err := peer.AddrInfoFromString(a)
			if err != nil {
				return nil, err
			}
			hints = append(hints, *ai)
		}
		start := time.Now()
		var last Progress
		if err := s.Fetch(ctx, c, func(p Progress) { last = p }, WithProviders(hints...)); err != nil {
			return nil, err
		}
		return map[string]any{"elapsed_ms": time.Since(start).Milliseconds(), "bytes": last.Total,
			"fetched": last.Fetched, "peers": last.Peers}, nil
	case f[0] == "getfile" && len(f) >= 3:
		// WriteTo into files/NAME: getfile CID NAME [PEER...]
		c, err := cid.Decode(f[1])
		if err != nil {
			return nil, err
		}
		var hints []peer.AddrInfo
		for _, a := range f[3:] {
			ai, err := peer.AddrInfoFromString(a)
			if err != nil {
				return nil, err
			}
			hints = append(hints, *ai)
		}
		start := time.Now()
		var last Progress
		if err := s.WriteTo(ctx, c, filepath.Join(files, f[2]), func(p Progress) { last = p }, WithProviders(hints...)); err != nil {
			return nil, err
		}
		return map[string]any{"elapsed_ms": time.Since(start).Milliseconds(), "bytes": last.Total,
			"fetched": last.Fetched, "peers": last.Peers}, nil
	case f[0] == "sha256" && len(f) == 2:
		r, err := os.Open(filepath.Join(files, f[1]))
		if err != nil {
			return nil, err
		}
		defer r.Close()
		h := sha256.New()
		if _, err := io.Copy(h, r); err != nil {
			return nil, err
		}
		return map[string]any{"sha256": hex.EncodeToString(h.Sum(nil))}, nil
	case f[0] == "httpget" && len(f) == 3:
		start := time.Now()
		resp, err := http.Get(f[1])
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s: %s", f[1], resp.Status)
		}
		w, err := os.Create(filepath.Join(files, f[2]))
		if err != nil {
			return nil, err
		}
		n, err := io.Copy(w, resp.Body)
		if err == nil {
			err = w.Sync()
		}
		if cerr := w.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return nil, err
		}
		return map[string]any{"elapsed_ms": time.Since(start).Milliseconds(), "bytes": n}, nil
	case f[0] == "cpu":
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			return nil, err
		}
		return map[string]any{"cpu_s": time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()}, nil
	case f[0] == "prof-start" && len(f) == 2:
		w, err := os.Create(f[1])
		if err != nil {
			return nil, err
		}
		return map[string]any{}, pprof.StartCPUProfile(w)
	case f[0] == "prof-stop":
		pprof.StopCPUProfile()
		return map[string]any{}, nil
	case f[0] == "stats":
		st, err := s.ex.srv.Stat()
		if err != nil {
			return nil, err
		}
		return map[string]any{"sent": st.DataSent, "blocks_sent": st.BlocksSent}, nil
	}
	return nil, fmt.Errorf("unknown command %q", strings.Join(f, " "))
}

// helperImport writes a file of SIZE deterministic bytes (not timed), then
// imports it into a fresh store as the CLI's add does, and reports the rate
// and the process's peak memory during the import.
func helperImport(ctx context.Context, dir string, f []string, log *slog.Logger) (any, error) {
	if len(f) != 3 || f[0] != "import" {
		return nil, fmt.Errorf("bad one-shot command %q", f)
	}
	size, err1 := strconv.ParseInt(f[1], 10, 64)
	seed, err2 := strconv.ParseUint(f[2], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	ds, err := badgerds.Open(dir, log)
	if err != nil {
		return nil, err
	}
	defer ds.Close()
	opts := []Option{WithLogger(log)}
	if os.Getenv("CS_BLOCKS") != "badger" {
		opts = append(opts, WithBlockDir(filepath.Join(dir, "blocks")))
	}
	s, err := Open(ctx, namespace.Wrap(ds, datastore.NewKey("/blocks")), nil, opts...)
	if err != nil {
		return nil, err
	}
	defer s.Close()
	src := filepath.Join(dir, "import.bin")
	w, err := os.Create(src)
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(w, fastReader(seed, size)); err != nil {
		w.Close()
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	// Peaks from here on: reset the peak RSS (VmHWM).
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return nil, fmt.Errorf("resetting VmHWM: %w", err)
	}
	var peakHeap, peakAnon atomic.Uint64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			metrics.Read(sample)
			if v := sample[0].Value.Uint64(); v > peakHeap.Load() {
				peakHeap.Store(v)
			}
			if v := procStatus("RssAnon:"); v > int64(peakAnon.Load()) {
				peakAnon.Store(uint64(v))
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	start := time.Now()
	info, err := s.AddFile(ctx, src)
	el := time.Since(start)
	close(stop)
	<-done
	if err != nil {
		return nil, err
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return map[string]any{"cid": info.CID.String(), "size": info.Size, "elapsed_ms": el.Milliseconds(),
		"peak_rss": procStatus("VmHWM:"), "peak_anon": peakAnon.Load(), "peak_heap": peakHeap.Load(), "heap_sys": ms.HeapSys}, nil
}

// procStatus reads a kB field of /proc/self/status, in bytes: VmHWM (peak
// resident set, file pages of the datastore's memory-mapped files
// included), RssAnon (anonymous memory now).
func procStatus(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return -1
}

// helper is a running helper process, seen from the test.
type helper struct {
	tb    testing.TB
	name  string
	cmd   *exec.Cmd
	in    io.WriteCloser
	out   *bufio.Scanner
	addrs []string
}

// startHelper starts a helper peer. wrap, if not nil, turns the command
// line into another (to run it in a network namespace).
func startHelper(tb testing.TB, name, listen, httpAddr string, wrap func(args []string) *exec.Cmd) *helper {
	tb.Helper()
	return startHelperEnv(tb, name, listen, httpAddr, wrap)
}

// startHelperEnv is startHelper with extra environment (NAME=VALUE).
func startHelperEnv(tb testing.TB, name, listen, httpAddr string, wrap func(args []string) *exec.Cmd, env ...string) *helper {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	args := []string{exe, "-test.run=^$"}
	var cmd *exec.Cmd
	if wrap != nil {
		cmd = wrap(args)
	} else {
		cmd = exec.Command(args[0], args[1:]...)
	}
	cmd.Env = append(os.Environ(), helperEnv+"=peer", "CS_DIR="+tb.TempDir(), "CS_LISTEN="+listen, "CS_HTTP="+httpAddr)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = &prefixWriter{tb: tb, prefix: name + ": "}
	h := &helper{tb: tb, name: name, cmd: cmd}
	if h.in, err = cmd.StdinPipe(); err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	h.out = bufio.NewScanner(stdout)
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start helper %s: %v", name, err)
	}
	tb.Cleanup(h.stop)
	var ready struct{ Addrs []string }
	h.read(&ready)
	h.addrs = ready.Addrs
	return h
}

func (h *helper) stop() {
	if h.in != nil {
		h.in.Close()
		h.in = nil
		done := make(chan struct{})
		go func() { h.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			h.cmd.Process.Kill()
			<-done
		}
	}
}

func (h *helper) read(v any) {
	h.tb.Helper()
	if err := h.readErr(v); err != nil {
		h.tb.Fatal(err)
	}
}

func (h *helper) readErr(v any) error {
	if !h.out.Scan() {
		return fmt.Errorf("helper %s: no answer (%v)", h.name, h.out.Err())
	}
	line := h.out.Text()
	if rest, ok := strings.CutPrefix(line, "ok "); ok {
		if v == nil {
			return nil
		}
		return json.Unmarshal([]byte(rest), v)
	}
	return fmt.Errorf("helper %s: %s", h.name, line)
}

// send writes a command; the answer is read with read.
func (h *helper) send(format string, args ...any) {
	h.tb.Helper()
	if _, err := fmt.Fprintf(h.in, format+"\n", args...); err != nil {
		h.tb.Fatalf("helper %s: %v", h.name, err)
	}
}

func (h *helper) call(v any, format string, args ...any) {
	h.tb.Helper()
	h.send(format, args...)
	h.read(v)
}

// addrOn returns the helper's multiaddr on the given IP.
func (h *helper) addrOn(ip string) string {
	for _, a := range h.addrs {
		if strings.HasPrefix(a, "/ip4/"+ip+"/tcp/") {
			return a
		}
	}
	h.tb.Fatalf("helper %s has no TCP address on %s: %v", h.name, ip, h.addrs)
	return ""
}

type prefixWriter struct {
	tb     testing.TB
	prefix string
	buf    []byte
}

func (w *prefixWriter) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := strings.IndexByte(string(w.buf), '\n')
		if i < 0 {
			break
		}
		w.tb.Log(w.prefix + string(w.buf[:i]))
		w.buf = w.buf[i+1:]
	}
	return len(p), nil
}
