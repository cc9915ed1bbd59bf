package capsulestore

// Benchmarks. Each runs its peers as separate OS processes (see
// helper_process_test.go) and, where it compares with plain HTTP, runs both
// in the same benchmark so the ratio is measured on the same machine state.
// Run them once each:
//
//	go test -run '^$' -bench . -benchtime 1x ./capsulestore/
//
// The shaped-link and swarm benchmarks build network namespaces (root,
// iproute2); they never send traffic anywhere but loopback and the
// namespaces they create, and remove those when done.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/repronet/repronet/capsulestore/internal/netlab"
)

func envInt(name string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(name), 10, 64); err == nil && v > 0 {
		return v
	}
	return def
}

func envStr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func mibps(bytes int64, ms int64) float64 {
	return float64(bytes) / (1 << 20) / (float64(ms) / 1000)
}

type fetchResult struct {
	ElapsedMS int64 `json:"elapsed_ms"`
	Bytes     int64 `json:"bytes"`
	Fetched   int64 `json:"fetched"`
	Peers     int   `json:"peers"`
}

type addResult struct {
	CID       string `json:"cid"`
	Size      int64  `json:"size"`
	SHA256    string `json:"sha256"`
	ElapsedMS int64  `json:"elapsed_ms"`
}

// BenchmarkImport imports a file (written beforehand, so read from the page
// cache) into a fresh store, in a fresh process, as `repronet capsule add`
// does (blocks as flat files, badger for the index), and reports the rate
// and the process's peak anonymous memory (RssAnon, sampled) and Go heap:
// at 1 GiB (the 200 MiB/s target; also with blocks in badger, for
// comparison) and at CS_BENCH_IMPORT_BIG_GIB GiB (default 4; 13 for
// CORE-Bench's whole size) to show that memory does not grow with the file.
func BenchmarkImport(b *testing.B) {
	cases := []struct {
		name   string
		gib    int64
		blocks string
	}{
		{"1GiB", 1, "files"},
		{"1GiB-badger", 1, "badger"},
		{fmt.Sprintf("%dGiB", envInt("CS_BENCH_IMPORT_BIG_GIB", 4)), envInt("CS_BENCH_IMPORT_BIG_GIB", 4), "files"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			gib := c.gib
			size := gib << 30
			for range b.N {
				exe, err := os.Executable()
				if err != nil {
					b.Fatal(err)
				}
				cmd := exec.Command(exe, "-test.run=^$")
				cmd.Env = append(os.Environ(), helperEnv+"=peer", "CS_DIR="+b.TempDir(), "CS_BLOCKS="+c.blocks,
					fmt.Sprintf("CS_ONESHOT=import %d 11", size))
				cmd.Stderr = &prefixWriter{tb: b, prefix: "import: "}
				out, err := cmd.Output()
				if err != nil {
					b.Fatalf("import helper: %v", err)
				}
				line := strings.TrimSpace(string(out))
				rest, ok := strings.CutPrefix(line, "ok ")
				if !ok {
					b.Fatalf("import helper: %s", line)
				}
				var r struct {
					ElapsedMS int64  `json:"elapsed_ms"`
					PeakRSS   int64  `json:"peak_rss"`
					PeakAnon  int64  `json:"peak_anon"`
					PeakHeap  int64  `json:"peak_heap"`
					HeapSys   int64  `json:"heap_sys"`
					CID       string `json:"cid"`
				}
				if err := json.Unmarshal([]byte(rest), &r); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(mibps(size, r.ElapsedMS), "MiB/s")
				b.ReportMetric(float64(r.PeakAnon)/(1<<20), "peakAnon_MiB")
				b.ReportMetric(float64(r.PeakHeap)/(1<<20), "peakHeap_MiB")
				b.ReportMetric(float64(r.PeakRSS)/(1<<20), "peakRSS_MiB")
				b.Logf("imported %d GiB in %d ms (%.0f MiB/s): peak anonymous memory %d MiB, peak Go heap objects %d MiB, heap sys %d MiB; "+
					"peak RSS %d MiB (with blocks in badger this includes the page cache of its memory-mapped value log, which the kernel reclaims); CID %s",
					gib, r.ElapsedMS, mibps(size, r.ElapsedMS), r.PeakAnon>>20, r.PeakHeap>>20, r.HeapSys>>20, r.PeakRSS>>20, r.CID)
			}
		})
	}
}

// BenchmarkFetchLoopback fetches a CS_BENCH_LOOPBACK_MIB (default 1024) MiB
// file between two processes over loopback, each with its own store,
// CS_BENCH_ROUNDS times (default 3, a fresh fetcher each time), for three
// set-ups alternately in the same run, seed and fetcher alike:
//
//   - "badger+stock": blocks in badger, libp2p's default transport stack;
//   - "files+stock": blocks as flat files (WithBlockDir), the default stack;
//   - "files+p2phost": flat files and p2phost's stack, as node and
//     coordinator run.
//
// It reports each one's median rate and the CPU seconds both processes
// spent per GiB (which the other load on the machine disturbs less than the
// rate), and the ratios of the medians to badger+stock's. The headline
// MiB/s and cpu_s/GiB are files+p2phost's.
func BenchmarkFetchLoopback(b *testing.B) {
	size := envInt("CS_BENCH_LOOPBACK_MIB", 1024) << 20
	rounds := int(envInt("CS_BENCH_ROUNDS", 3))
	variants := []struct {
		name, metric string
		env          []string
	}{
		{"badger+stock", "badger_stock", []string{"CS_BLOCKS=badger", "CS_STACK=stock"}},
		{"files+stock", "files_stock", []string{"CS_STACK=stock"}},
		{"files+p2phost", "", nil},
	}
	seeds := make([]*helper, len(variants))
	cids := make([]string, len(variants))
	for i, v := range variants {
		seeds[i] = startHelperEnv(b, "seed-"+v.name, "/ip4/127.0.0.1/tcp/0", "", nil, v.env...)
		seeds[i].call(nil, "gen %d 7 capsule.bin", size)
		var info addResult
		seeds[i].call(&info, "add capsule.bin")
		cids[i] = info.CID
		if cids[i] != cids[0] {
			b.Fatalf("the stores import different CIDs: %s, %s", cids[0], cids[i])
		}
	}
	gib := float64(size) / (1 << 30)
	for range b.N {
		rates := make([][]float64, len(variants))
		cpus := make([][]float64, len(variants))
		for round := range rounds {
			for i, v := range variants {
				seed := seeds[i]
				f := startHelperEnv(b, "fetcher-"+v.name, "/ip4/127.0.0.1/tcp/0", "", nil, v.env...)
				prof := os.Getenv("CS_BENCH_PROFILE")
				if prof != "" {
					seed.call(nil, "prof-start %s.%s.seed.%d", prof, v.name, round)
					f.call(nil, "prof-start %s.%s.fetcher.%d", prof, v.name, round)
				}
				c0 := cpuOf(seed, f)
				var r fetchResult
				f.call(&r, "fetch %s %s", cids[i], seed.addrOn("127.0.0.1"))
				c1 := cpuOf(seed, f)
				if prof != "" {
					seed.call(nil, "prof-stop")
					f.call(nil, "prof-stop")
				}
				f.stop()
				rate := mibps(size, r.ElapsedMS)
				cpuPerGiB := (c1[0] - c0[0] + c1[1] - c0[1]) / gib
				rates[i], cpus[i] = append(rates[i], rate), append(cpus[i], cpuPerGiB)
				b.Logf("round %d, %s: %d MiB in %d ms = %.0f MiB/s; CPU s/GiB seed %.2f + fetcher %.2f; load %s",
					round, v.name, size>>20, r.ElapsedMS, rate, (c1[0]-c0[0])/gib, (c1[1]-c0[1])/gib, loadAvg())
			}
		}
		base := len(variants) - 1
		for i, v := range variants {
			b.Logf("%s: median %.0f MiB/s (rounds %.0f), median %.2f CPU s/GiB; vs badger+stock: rate %.2fx, CPU %.2fx",
				v.name, median(rates[i]), rates[i], median(cpus[i]), median(rates[i])/median(rates[0]), median(cpus[i])/median(cpus[0]))
			if v.metric != "" {
				b.ReportMetric(median(rates[i]), v.metric+"_MiB/s")
				b.ReportMetric(median(cpus[i]), v.metric+"_cpu_s/GiB")
			}
		}
		b.ReportMetric(median(rates[base]), "MiB/s")
		b.ReportMetric(slices.Min(rates[base]), "worst_MiB/s")
		b.ReportMetric(median(cpus[base]), "cpu_s/GiB")
		b.ReportMetric(median(rates[base])/median(rates[0]), "rate_vs_badger_stock")
		b.ReportMetric(median(cpus[base])/median(cpus[0]), "cpu_vs_badger_stock")
	}
}

// BenchmarkFetchToFile is issue 29's fetch to a file over loopback: a seed
// process serves a CS_BENCH_TOFILE_MIB (default 1024) MiB file over libp2p
// (blocks as files, p2phost, as node and coordinator run) and over HTTP (Go's
// file server: sendfile), and each round, alternately:
//
//   - http: curl -o FILE, openssl dgst -sha256 FILE, sync FILE (one shell);
//   - file: a fresh fetcher process's WriteTo (what `capsule get -o FILE`
//     does: the leaves written once, into the file, fsynced);
//   - store: a fresh fetcher's Fetch into its store (the node's path).
//
// It reports the medians over CS_BENCH_ROUNDS (default 3) rounds, the speed
// ratio file/http (above 1: faster than HTTP) and the receivers' CPU
// seconds per GiB (for http, the shell and its children).
func BenchmarkFetchToFile(b *testing.B) {
	size := envInt("CS_BENCH_TOFILE_MIB", 1024) << 20
	rounds := int(envInt("CS_BENCH_ROUNDS", 3))
	for _, t := range []string{"curl", "openssl", "sync"} {
		if _, err := exec.LookPath(t); err != nil {
			b.Skipf("%s is needed for the HTTP baseline: %v", t, err)
		}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	httpAddr := ln.Addr().String()
	ln.Close()
	seed := startHelper(b, "seed", "/ip4/127.0.0.1/tcp/0", httpAddr, nil)
	seed.call(nil, "gen %d 29 capsule.bin", size)
	var info addResult
	seed.call(&info, "add capsule.bin")
	gib := float64(size) / (1 << 30)
	for range b.N {
		var walls, cpus [3][]float64 // http, file, store
		for round := range rounds {
			// HTTP.
			out := filepath.Join(b.TempDir(), "http.bin")
			cmd := exec.Command("sh", "-c", `curl -sf -o "$1" "$2" && openssl dgst -sha256 -r "$1" && sync "$1"`, "sh", out, "http://"+httpAddr+"/capsule.bin")
			start := time.Now()
			got, err := cmd.Output()
			el := time.Since(start).Seconds()
			if err != nil {
				b.Fatalf("http: %v", err)
			}
			if sum, _, _ := strings.Cut(string(got), " "); sum != info.SHA256 {
				b.Fatalf("http: sha256 %q, want %s", sum, info.SHA256)
			}
			walls[0] = append(walls[0], el)
			cpus[0] = append(cpus[0], (cmd.ProcessState.UserTime()+cmd.ProcessState.SystemTime()).Seconds()/gib)
			os.Remove(out)

			// repronet: WriteTo, then Fetch into the store, fresh fetchers.
			for i, how := range []string{"getfile %s out.bin %s", "fetch %s %s"} {
				f := startHelper(b, "fetcher", "/ip4/127.0.0.1/tcp/0", "", nil)
				prof := os.Getenv("CS_BENCH_PROFILE")
				if prof != "" {
					f.call(nil, "prof-start %s.tofile.%d.%d", prof, i, round)
				}
				c0 := cpuOf(f)
				var r fetchResult
				f.call(&r, how, info.CID, seed.addrOn("127.0.0.1"))
				c1 := cpuOf(f)
				if prof != "" {
					f.call(nil, "prof-stop")
				}
				if i == 0 {
					var sum struct {
						SHA256 string `json:"sha256"`
					}
					f.call(&sum, "sha256 out.bin")
					if sum.SHA256 != info.SHA256 {
						b.Fatalf("WriteTo: sha256 %s, want %s", sum.SHA256, info.SHA256)
					}
				}
				f.stop()
				walls[i+1] = append(walls[i+1], float64(r.ElapsedMS)/1000)
				cpus[i+1] = append(cpus[i+1], (c1[0]-c0[0])/gib)
			}
			b.Logf("round %d, %d MiB: http %.2f s (%.2f CPU-s/GiB), file %.2f s (%.2f), store %.2f s (%.2f); file vs http %.2fx; load %s",
				round, size>>20, walls[0][round], cpus[0][round], walls[1][round], cpus[1][round], walls[2][round], cpus[2][round],
				walls[0][round]/walls[1][round], loadAvg())
		}
		b.ReportMetric(median(walls[0]), "http_s")
		b.ReportMetric(median(walls[1]), "file_s")
		b.ReportMetric(median(walls[2]), "store_s")
		b.ReportMetric(median(walls[0])/median(walls[1]), "file_vs_http")
		b.ReportMetric(median(cpus[0]), "http_cpu_s/GiB")
		b.ReportMetric(median(cpus[1]), "file_cpu_s/GiB")
		b.ReportMetric(median(cpus[1])/median(cpus[0]), "file_cpu_vs_http")
	}
}

// BenchmarkFetchShaped fetches a CS_BENCH_SHAPED_MIB (default 1024) MiB
// file between two network namespaces linked at CS_BENCH_SHAPED_RATE
// (default 1gbit, tc tbf both ways), over bitswap and over plain HTTP
// (Go's net/http server and client, the file written to disk), alternately,
// CS_BENCH_ROUNDS times (default 2); it reports the medians and their ratio.
func BenchmarkFetchShaped(b *testing.B) {
	size := envInt("CS_BENCH_SHAPED_MIB", 1024) << 20
	rate := envStr("CS_BENCH_SHAPED_RATE", "1gbit")
	rounds := int(envInt("CS_BENCH_ROUNDS", 2))
	lab, inNS, seed, info := seededLab(b, 2, rate, size, 9)
	ip0 := lab.Hosts[0].IP
	for range b.N {
		var p2ps, https []float64
		gib := float64(size) / (1 << 30)
		for round := range rounds {
			f := startHelper(b, fmt.Sprintf("fetcher%d", round), "/ip4/"+lab.Hosts[1].IP+"/tcp/4001", "", inNS(1))
			var h, p fetchResult
			c0 := cpuOf(seed, f)
			f.call(&h, "httpget http://%s:8080/capsule.bin out.bin", ip0)
			c1 := cpuOf(seed, f)
			prof := os.Getenv("CS_BENCH_PROFILE")
			if prof != "" {
				f.call(nil, "prof-start %s.shaped.%d", prof, round)
			}
			f.call(&p, "fetch %s %s", info.CID, seed.addrOn(ip0))
			if prof != "" {
				f.call(nil, "prof-stop")
			}
			c2 := cpuOf(seed, f)
			f.stop()
			https = append(https, mibps(size, h.ElapsedMS))
			p2ps = append(p2ps, mibps(size, p.ElapsedMS))
			b.Logf("round %d over %s: HTTP %.1f MiB/s, bitswap %.1f MiB/s (%.2fx); CPU s/GiB seed+fetcher: HTTP %.2f+%.2f, bitswap %.2f+%.2f; load %s",
				round, rate, https[round], p2ps[round], p2ps[round]/https[round],
				(c1[0]-c0[0])/gib, (c1[1]-c0[1])/gib, (c2[0]-c1[0])/gib, (c2[1]-c1[1])/gib, loadAvg())
		}
		mp, mh := median(p2ps), median(https)
		b.ReportMetric(mp, "MiB/s")
		b.ReportMetric(mh, "http_MiB/s")
		b.ReportMetric(mp/mh, "ratio")
	}
}

// seededLab builds a lab of hosts namespaces linked at rate (removed when
// b ends) and starts a seed in the first, serving libp2p on port 4001 and
// HTTP on 8080, holding a size-byte capsule generated from genSeed. inNS(i)
// wraps a command to run in host i's namespace.
func seededLab(b *testing.B, hosts int, rate string, size int64, genSeed int) (lab *netlab.Lab, inNS func(int) func([]string) *exec.Cmd, seed *helper, info addResult) {
	ctx := context.Background()
	lab, err := netlab.New(ctx, hosts, rate)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { lab.Close() })
	inNS = func(i int) func([]string) *exec.Cmd {
		return func(args []string) *exec.Cmd { return lab.Command(ctx, i, args[0], args[1:]...) }
	}
	ip0 := lab.Hosts[0].IP
	seed = startHelper(b, "seed", "/ip4/"+ip0+"/tcp/4001", ip0+":8080", inNS(0))
	seed.call(nil, "gen %d %d capsule.bin", size, genSeed)
	seed.call(&info, "add capsule.bin")
	return lab, inNS, seed, info
}

// cpuOf returns the CPU seconds each helper has used.
func cpuOf(hs ...*helper) []float64 {
	out := make([]float64, len(hs))
	for i, h := range hs {
		var c struct {
			CPU float64 `json:"cpu_s"`
		}
		h.call(&c, "cpu")
		out[i] = c.CPU
	}
	return out
}

// loadAvg is the machine's 1-minute load average, for the log.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// BenchmarkSwarm: one seed and CS_BENCH_SWARM_FETCHERS (default 8) fetchers,
// each in its own network namespace, every link shaped to
// CS_BENCH_SWARM_RATE (default 100mbit) both ways, a CS_BENCH_SWARM_MIB
// (default 200) MiB capsule. All fetchers fetch it at once over repronet
// (each given the seed and every other fetcher as provider hints), then all
// download it at once over HTTP from the seed. Reports both makespans, their
// ratio, and the seed's upload (eth0 tx bytes, from the interface counters)
// as a multiple of the capsule size.
func BenchmarkSwarm(b *testing.B) {
	n := int(envInt("CS_BENCH_SWARM_FETCHERS", 8))
	size := envInt("CS_BENCH_SWARM_MIB", 200) << 20
	rate := envStr("CS_BENCH_SWARM_RATE", "100mbit")
	ctx := context.Background()
	lab, inNS, seed, info := seededLab(b, n+1, rate, size, 5)
	ip0 := lab.Hosts[0].IP

	for range b.N {
		fetchers := make([]*helper, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				ip := lab.Hosts[i+1].IP
				fetchers[i] = startHelper(b, fmt.Sprintf("f%d", i+1), "/ip4/"+ip+"/tcp/4001", "", inNS(i+1))
			})
		}
		wg.Wait()
		addrs := make([]string, n)
		for i, f := range fetchers {
			addrs[i] = f.addrOn(lab.Hosts[i+1].IP)
		}
		run := func(what string, cmd func(i int) string) (makespan time.Duration, seedTX int64, each []time.Duration) {
			before, err := lab.Counters(ctx, 0)
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			each = make([]time.Duration, n)
			errs := make([]error, n)
			for i, f := range fetchers {
				f.send("%s", cmd(i))
			}
			for i, f := range fetchers {
				wg.Go(func() {
					var r fetchResult
					errs[i] = f.readErr(&r)
					each[i] = time.Since(start)
				})
			}
			wg.Wait()
			makespan = time.Since(start)
			for _, err := range errs {
				if err != nil {
					b.Fatalf("%s: %v", what, err)
				}
			}
			after, err := lab.Counters(ctx, 0)
			if err != nil {
				b.Fatal(err)
			}
			return makespan, after.TX - before.TX, each
		}
		p2pSpan, p2pTX, p2pEach := run("repronet", func(i int) string {
			hints := []string{seed.addrOn(ip0)}
			for j, a := range addrs {
				if j != i {
					hints = append(hints, a)
				}
			}
			return "fetch " + info.CID + " " + strings.Join(hints, " ")
		})
		var sent struct{ Sent int64 }
		seed.call(&sent, "stats")
		httpSpan, httpTX, httpEach := run("http", func(i int) string {
			return fmt.Sprintf("httpget http://%s:8080/capsule.bin out.bin", ip0)
		})
		for _, f := range fetchers {
			f.stop()
		}
		b.Logf("%d fetchers, %s links, %d MiB: repronet makespan %s, seed upload %.2fx (bitswap payload %.2fx); HTTP makespan %s, seed upload %.2fx; makespan ratio %.3f",
			n, rate, size>>20, p2pSpan.Round(time.Millisecond), float64(p2pTX)/float64(size), float64(sent.Sent)/float64(size),
			httpSpan.Round(time.Millisecond), float64(httpTX)/float64(size), p2pSpan.Seconds()/httpSpan.Seconds())
		b.Logf("repronet finish times: %v", roundAll(p2pEach))
		b.Logf("HTTP finish times: %v", roundAll(httpEach))
		b.ReportMetric(p2pSpan.Seconds(), "makespan_s")
		b.ReportMetric(httpSpan.Seconds(), "http_makespan_s")
		b.ReportMetric(p2pSpan.Seconds()/httpSpan.Seconds(), "makespan_ratio")
		b.ReportMetric(float64(p2pTX)/float64(size), "seed_upload_x")
		b.ReportMetric(float64(httpTX)/float64(size), "http_seed_upload_x")
	}
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(100 * time.Millisecond)
	}
	return out
}

func TestMedian(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{5, 1, 3}, 3},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		in := slices.Clone(tc.xs)
		if got := median(tc.xs); got != tc.want {
			t.Errorf("median(%v) = %v, want %v", tc.xs, got, tc.want)
		}
		if !slices.Equal(tc.xs, in) {
			t.Errorf("median reordered its input: %v", tc.xs)
		}
	}
}
