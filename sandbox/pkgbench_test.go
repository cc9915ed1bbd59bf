package sandbox

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/internal/fixtures"
)

var (
	mirrorRate = flag.Int64("sandbox.mirror-rate", 4<<20,
		"bytes per second per connection of the stand-in mirror in BenchmarkPackageCache")
	mirrorDelay = flag.Duration("sandbox.mirror-delay", 50*time.Millisecond,
		"delay before each response of the stand-in mirror in BenchmarkPackageCache")
	benchDebs = flag.String("sandbox.bench-debs", strings.Join(fixtures.BenchPackageSets[0], ","),
		"Debian packages BenchmarkPackageCache installs (with what they depend on; one of internal/fixtures.BenchPackageSets)")
	benchIndex = flag.Bool("sandbox.bench-full-index", true,
		"the stand-in mirror's index lists the rest of Debian's bookworm main as well, as a real mirror's does (about 9 MB gzipped)")
	benchWheels = flag.Int("sandbox.bench-wheels", 3, "10 MB wheels BenchmarkPackageCache installs with pip")
)

// BenchmarkPackageCache installs the same packages twice on one node, each
// time in a fresh attempt (root in a user namespace, proxy network): real
// Debian packages (-sandbox.bench-debs and their dependencies missing from
// the image) with apt-get, and -sandbox.bench-wheels wheels of 10 MB with
// pip, from a stand-in mirror on 127.0.0.2 that sends at
// -sandbox.mirror-rate bytes per second per connection after
// -sandbox.mirror-delay. The first install fills the node's package cache
// (cold), the second is served from it (warm). It reports:
//
//	cold-s, warm-s  wall time of each attempt (task start to exit)
//	speedup         cold-s / warm-s (the target is at least 5)
//	apt-download-speedup  the same for apt-get's download phase alone
//	mirror-MB-cold, mirror-MB-warm  bytes the mirror sent for each
//	download-MB     package bytes the cache stored
//
// The Debian packages, and Debian's index of bookworm main, are fixtures
// (go run ./internal/fixtures/prepare -bench, which make bench runs); with
// -sandbox.bench-full-index (the default) the stand-in mirror's index also
// lists the rest of bookworm main, so that apt-get update fetches and reads
// an index as long as a real mirror's (apt fetches it by hash, and the
// warm attempt gets it from the cache).
//
// Run with: go test -run '^$' -bench PackageCache -benchtime 1x ./sandbox/
func BenchmarkPackageCache(b *testing.B) {
	image := debianImage(b)
	names := strings.Split(*benchDebs, ",")
	debs, index, err := fixtures.BenchDebs(names)
	if err != nil {
		b.Fatal(err)
	}
	var rest []byte
	if *benchIndex {
		if rest, err = otherPackages(index, debs); err != nil {
			b.Fatal(err)
		}
	}
	repo := b.TempDir()
	writeDebRepo(b, repo, debs, rest)
	rng := rand.New(rand.NewPCG(1, 2))
	wheels := map[string]map[string][]byte{}
	var projects []string
	for i := range *benchWheels {
		data := make([]byte, 10<<20)
		for j := range data {
			data[j] = byte(rng.Uint32())
		}
		project := fmt.Sprintf("bench-data-%d", i)
		name, whl := makeWheel(b, project, "1.0", fmt.Sprintf("bench_data_%d", i), map[string][]byte{"__init__.py": nil, "blob.bin": data})
		wheels[project] = map[string][]byte{name: whl}
		projects = append(projects, project)
	}
	writeSimpleIndex(b, repo, wheels)
	m := serveMirror(b, repo, *mirrorRate, *mirrorDelay)
	proxy, cache := packageProxy(b, filepath.Join(b.TempDir(), "cache"), m.port)
	script := installScript(m.port, names, projects, "echo installed\n")

	run := func(i int) (time.Duration, int64, map[string]time.Duration) {
		before := m.sent()
		id := fmt.Sprintf("bench-pkgcache-%d", i)
		ws, err := testRunner.CreateWorkspace(context.Background(), id, 4<<30)
		if err != nil {
			b.Fatal(err)
		}
		defer ws.Close(context.Background())
		if err := ws.Chown(ws.Dir(), 0, 0); err != nil {
			b.Fatal(err)
		}
		res, err := testRunner.Run(context.Background(), Spec{ID: id, Image: image, Args: []string{"/bin/sh", "-c", script},
			UserNamespace: true, Workspace: ws, Proxy: proxy,
			Network: Network{Mode: NetworkProxy, Hosts: []string{"deb.test", "pypi.test"}},
			Limits:  Limits{Wall: 20 * time.Minute}})
		if err != nil || res.Outcome != OutcomeOK || string(res.Stdout) != "installed\n" {
			b.Fatalf("install %d: %v %s (%s)\nstdout %s\nstderr %s", i, err, res.Outcome, res.Detail, res.Stdout, res.Stderr)
		}
		durs, line := phases(res.Stderr)
		b.Logf("install %d: %v, mirror sent %d bytes; %s", i, res.Wall, m.sent()-before, line)
		return res.Wall, m.sent() - before, durs
	}
	cold, coldBytes, coldPhases := run(0)
	warm, warmBytes, warmPhases := run(1)
	st := cache.Stats()
	b.ReportMetric(cold.Seconds(), "cold-s")
	b.ReportMetric(warm.Seconds(), "warm-s")
	b.ReportMetric(cold.Seconds()/warm.Seconds(), "speedup")
	b.ReportMetric(coldPhases["apt-download"].Seconds()/warmPhases["apt-download"].Seconds(), "apt-download-speedup")
	b.ReportMetric(float64(coldBytes)/1e6, "mirror-MB-cold")
	b.ReportMetric(float64(warmBytes)/1e6, "mirror-MB-warm")
	b.ReportMetric(float64(st.Bytes)/1e6, "download-MB")
	b.Logf("%d debs, %d wheels at %d B/s per connection: cold %v, warm %v; cache %+v", len(debs), len(projects), *mirrorRate, cold, warm, st)
}

// phases turns installScript's "phase <name> <time>" lines into the
// duration of each phase, and a line listing them.
func phases(stderr []byte) (map[string]time.Duration, string) {
	durs := map[string]time.Duration{}
	var out []string
	var last float64
	for _, l := range strings.Split(string(stderr), "\n") {
		var name string
		var at float64
		if n, _ := fmt.Sscanf(l, "phase %s %f", &name, &at); n != 2 {
			continue
		}
		if last > 0 {
			durs[name] = time.Duration((at - last) * float64(time.Second))
			out = append(out, fmt.Sprintf("%s %.1fs", name, at-last))
		}
		last = at
	}
	return durs, strings.Join(out, ", ")
}

func (m *mirror) sent() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.bytes
}

// otherPackages returns the stanzas of the Debian index at path whose
// packages are not among debs (named name_version_arch.deb).
func otherPackages(path string, debs []string) ([]byte, error) {
	have := map[string]bool{}
	for _, d := range debs {
		name, _, _ := strings.Cut(filepath.Base(d), "_")
		have[name] = true
	}
	index, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	for _, stanza := range bytes.Split(index, []byte("\n\n")) {
		name, _, _ := bytes.Cut(bytes.TrimPrefix(stanza, []byte("Package: ")), []byte("\n"))
		if len(bytes.TrimSpace(stanza)) == 0 || have[string(name)] {
			continue
		}
		out.Write(bytes.TrimSpace(stanza))
		out.WriteString("\n\n")
	}
	return out.Bytes(), nil
}
