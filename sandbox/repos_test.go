package sandbox

import (
	"archive/zip"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/repronet/repronet/internal/debimage"
	"github.com/repronet/repronet/internal/fixtures"
	"github.com/repronet/repronet/sandbox/egress"
	"github.com/repronet/repronet/sandbox/ociimage"
	"github.com/repronet/repronet/sandbox/pkgcache"
)

// The package tests serve a Debian-style repository and a PyPI-style
// simple index from a folder on 127.0.0.2 (the proxy is permitted to
// reach it; the attempt reaches it only through the proxy), under the
// names deb.test and pypi.test.

// debianImageRef is the Debian image with apt and pip, packed from the
// root file system internal/fixtures made and kept on disk between runs.
const debianImageRef = "repronet.local/test/debian-pip:1"

// debianImage returns the Debian 12 image (minbase, python3-pip), packing
// it from the fixtures' root file system (made beforehand by
// internal/fixtures: the test reaches no mirror) if needed, and importing
// it from the tarball on disk, or finding it in the daemon.
func debianImage(t testing.TB) string {
	t.Helper()
	ctx := context.Background()
	if ok, err := testRunner.HasImage(ctx, debianImageRef); err != nil {
		t.Fatal(err)
	} else if ok {
		return debianImageRef
	}
	tarball := filepath.Join(fixtures.Dir, "debian-pip.oci.tar")
	if _, err := os.Stat(tarball); err != nil {
		start := time.Now()
		err := fixtures.Builder().Build(ctx, tarball, debimage.Spec{
			Ref: debianImageRef, Packages: fixtures.SandboxPackages,
			Config: ociimage.Config{
				Cmd: []string{"/bin/bash"},
				Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8"},
			}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("packed %s in %v", tarball, time.Since(start))
	}
	f, err := os.Open(tarball)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	ref, err := testRunner.ImportImage(ctx, f)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("imported %s in %v", ref, time.Since(start))
	return ref
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// makeDeb builds a Debian package (arch all) with dpkg-deb that installs
// files (path -> content; executable under /usr/bin).
func makeDeb(t testing.TB, dir, name, version string, files map[string]string) string {
	t.Helper()
	stage := t.TempDir()
	control := fmt.Sprintf("Package: %s\nVersion: %s\nArchitecture: all\nMaintainer: repronet tests <tests@repronet.invalid>\nDescription: test package %s\n", name, version, name)
	if err := os.MkdirAll(filepath.Join(stage, "DEBIAN"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stage, "DEBIAN", "control"), []byte(control), 0o644); err != nil {
		t.Fatal(err)
	}
	for p, content := range files {
		full := filepath.Join(stage, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		mode := os.FileMode(0o644)
		if strings.HasPrefix(p, "usr/bin/") {
			mode = 0o755
		}
		if err := os.WriteFile(full, []byte(content), mode); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, fmt.Sprintf("%s_%s_all.deb", name, version))
	if b, err := exec.Command("dpkg-deb", "--root-owner-group", "--build", stage, out).CombinedOutput(); err != nil {
		t.Fatalf("dpkg-deb: %v: %s", err, b)
	}
	return out
}

// writeDebRepo puts debs into root/debian/pool and writes the suite
// "test" (component main, amd64 and all) with Packages, Packages.gz and
// Release, whose SHA256 fields apt checks and the package cache reads. Like
// Debian's mirrors, it also publishes the indexes by hash (by-hash/SHA256/)
// and says so in Release (Acquire-By-Hash), so apt fetches them by hash.
// rest, when not empty, is more of the index (stanzas of packages the
// repository lists but does not hold), as a real mirror's is long.
func writeDebRepo(t testing.TB, root string, debs []string, rest []byte) {
	t.Helper()
	var packages bytes.Buffer
	sort.Strings(debs)
	for _, deb := range debs {
		ctl, err := exec.Command("dpkg-deb", "-f", deb).Output()
		if err != nil {
			t.Fatalf("dpkg-deb -f %s: %v", deb, err)
		}
		fields := map[string]string{}
		for _, l := range strings.Split(string(ctl), "\n") {
			if k, v, ok := strings.Cut(l, ": "); ok && !strings.HasPrefix(l, " ") {
				fields[k] = v
			}
		}
		// Pool names carry the version without its epoch (apt-get
		// download names its files with it, as %3a).
		name, version := fields["Package"], fields["Version"]
		if _, v, ok := strings.Cut(version, ":"); ok {
			version = v
		}
		rel := filepath.Join("pool", "main", name[:1], name, fmt.Sprintf("%s_%s_%s.deb", name, version, fields["Architecture"]))
		dst := filepath.Join(root, "debian", rel)
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(deb)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dst, data, 0o644); err != nil {
			t.Fatal(err)
		}
		packages.Write(bytes.TrimRight(ctl, "\n"))
		fmt.Fprintf(&packages, "\nFilename: %s\nSize: %d\nSHA256: %s\n\n", rel, len(data), sha256Hex(data))
	}
	packages.Write(rest)
	dists := filepath.Join(root, "debian", "dists", "test")
	bin := filepath.Join(dists, "main", "binary-amd64")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(packages.Bytes())
	zw.Close()
	release := "Origin: repronet-test\nLabel: repronet-test\nSuite: test\nCodename: test\nArchitectures: amd64 all\nComponents: main\n" +
		"Acquire-By-Hash: yes\nDate: " + time.Now().UTC().Format(time.RFC1123) + "\nSHA256:\n"
	if err := os.MkdirAll(filepath.Join(bin, "by-hash", "SHA256"), 0o755); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"Packages": packages.Bytes(), "Packages.gz": gz.Bytes()} {
		for _, p := range []string{name, filepath.Join("by-hash", "SHA256", sha256Hex(b))} {
			if err := os.WriteFile(filepath.Join(bin, p), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		release += fmt.Sprintf(" %s %d main/binary-amd64/%s\n", sha256Hex(b), len(b), name)
	}
	if err := os.WriteFile(filepath.Join(dists, "Release"), []byte(release), 0o644); err != nil {
		t.Fatal(err)
	}
}

// makeWheel builds a pure-Python wheel of module (files relative to the
// module folder) with a correct RECORD; it returns its file name and bytes.
func makeWheel(t testing.TB, dist, version, module string, files map[string][]byte) (string, []byte) {
	t.Helper()
	norm := strings.ReplaceAll(dist, "-", "_")
	info := fmt.Sprintf("%s-%s.dist-info", norm, version)
	entries := map[string][]byte{
		info + "/METADATA": []byte(fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", dist, version)),
		info + "/WHEEL":    []byte("Wheel-Version: 1.0\nGenerator: repronet-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"),
	}
	for p, b := range files {
		entries[module+"/"+p] = b
	}
	names := make([]string, 0, len(entries))
	for n := range entries {
		names = append(names, n)
	}
	sort.Strings(names)
	var record strings.Builder
	for _, n := range names {
		s := sha256.Sum256(entries[n])
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(s[:]), len(entries[n]))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", info)
	entries[info+"/RECORD"] = []byte(record.String())
	names = append(names, info+"/RECORD")
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	for _, n := range names {
		w, err := zw.CreateHeader(&zip.FileHeader{Name: n, Method: zip.Deflate})
		if err != nil {
			t.Fatal(err)
		}
		w.Write(entries[n])
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s-%s-py3-none-any.whl", norm, version), buf.Bytes()
}

// writeSimpleIndex writes a PEP 503 index at root/simple for wheels
// (project name -> file name -> bytes), the files under root/packages, with
// #sha256= fragments.
func writeSimpleIndex(t testing.TB, root string, wheels map[string]map[string][]byte) {
	t.Helper()
	var top strings.Builder
	top.WriteString("<!DOCTYPE html><html><body>\n")
	for project, files := range wheels {
		fmt.Fprintf(&top, "<a href=\"%s/\">%s</a>\n", project, project)
		var page strings.Builder
		page.WriteString("<!DOCTYPE html><html><body>\n")
		for name, b := range files {
			dst := filepath.Join(root, "packages", project[:1], name)
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o644); err != nil {
				t.Fatal(err)
			}
			fmt.Fprintf(&page, "<a href=\"../../packages/%s/%s#sha256=%s\">%s</a>\n", project[:1], name, sha256Hex(b), name)
		}
		page.WriteString("</body></html>\n")
		dir := filepath.Join(root, "simple", project)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "index.html"), []byte(page.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	top.WriteString("</body></html>\n")
	if err := os.WriteFile(filepath.Join(root, "simple", "index.html"), []byte(top.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// mirror serves a folder on 127.0.0.2, counting requests per path, at an
// optional rate per connection (bytes per second, 0: unlimited) after an
// optional first-byte delay: a stand-in for a remote mirror.
type mirror struct {
	port  uint16
	mu    sync.Mutex
	hits  map[string]int
	bytes int64
}

func serveMirror(t testing.TB, root string, rate int64, delay time.Duration) *mirror {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	m := &mirror{port: uint16(ln.Addr().(*net.TCPAddr).Port), hits: map[string]int{}}
	files := http.FileServer(http.Dir(root))
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.hits[r.URL.Path]++
		m.mu.Unlock()
		time.Sleep(delay)
		cw := &countWriter{ResponseWriter: w, m: m, rate: rate, start: time.Now()}
		files.ServeHTTP(cw, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return m
}

// count is how many requests the mirror had for paths ending in suffix.
func (m *mirror) count(suffix string) int {
	return m.countWhere(func(p string) bool { return strings.HasSuffix(p, suffix) })
}

// countIn is how many requests the mirror had for paths containing part.
func (m *mirror) countIn(part string) int {
	return m.countWhere(func(p string) bool { return strings.Contains(p, part) })
}

func (m *mirror) countWhere(match func(path string) bool) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for p, c := range m.hits {
		if match(p) {
			n += c
		}
	}
	return n
}

// countWriter counts the bytes a mirror sends and paces them at rate.
type countWriter struct {
	http.ResponseWriter
	m     *mirror
	rate  int64
	start time.Time
	sent  int64
}

func (w *countWriter) Write(p []byte) (int, error) {
	total := 0
	for len(p) > 0 {
		chunk := p
		if w.rate > 0 && len(chunk) > 32<<10 {
			chunk = chunk[:32<<10]
		}
		n, err := w.ResponseWriter.Write(chunk)
		total += n
		w.sent += int64(n)
		w.m.mu.Lock()
		w.m.bytes += int64(n)
		w.m.mu.Unlock()
		if err != nil {
			return total, err
		}
		if w.rate > 0 {
			if ahead := time.Duration(float64(w.sent)/float64(w.rate)*float64(time.Second)) - time.Since(w.start); ahead > 0 {
				time.Sleep(ahead)
			}
		}
		p = p[n:]
	}
	return total, nil
}

// ReadFrom keeps io.Copy going through Write (and its pacing).
func (w *countWriter) ReadFrom(r io.Reader) (int64, error) {
	return io.Copy(struct{ io.Writer }{w}, r)
}

// packageProxy is the node's egress proxy with a package cache in dir,
// permitted to reach the mirror on 127.0.0.2 under deb.test and pypi.test.
func packageProxy(t testing.TB, dir string, port uint16) (*egress.Proxy, *pkgcache.Cache) {
	t.Helper()
	cache, err := pkgcache.Open(pkgcache.Config{Dir: dir, Hosts: []string{"deb.test", "pypi.test"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	mirrorAddr := []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	proxy, err := egress.New(egress.Config{
		Permit:    []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")},
		Ports:     []uint16{port},
		Resolver:  mapResolver{"deb.test": mirrorAddr, "pypi.test": mirrorAddr},
		Transport: cache.Wrap,
		Logger:    slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	return proxy, cache
}
