package pkgcache

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func TestClassify(t *testing.T) {
	for raw, want := range map[string]Kind{
		"http://deb.debian.org/debian/pool/main/h/hello/hello_2.10-3_amd64.deb":                                    KindDeb,
		"http://deb.debian.org/debian/pool/main/d/debian-installer/x_1.0_amd64.udeb":                               KindDeb,
		"http://mirror/pypi/packages/ab/cd/numpy-1.26.0-cp311-cp311-manylinux_2_17_x86_64.whl":                     KindWheel,
		"http://mirror/packages/source/r/requests/requests-2.31.0.tar.gz":                                          KindSdist,
		"http://cloud.r-project.org/src/contrib/ggplot2_3.4.4.tar.gz":                                              KindCRAN,
		"http://cloud.r-project.org/src/contrib/Archive/ggplot2/ggplot2_3.4.3.tar.gz":                              KindCRAN,
		"http://cloud.r-project.org/bin/windows/contrib/4.3/ggplot2_3.4.4.zip":                                     KindCRAN,
		"http://conda.anaconda.org/conda-forge/linux-64/numpy-1.26.0-py311h64a7726_0.conda":                        KindConda,
		"http://conda.anaconda.org/conda-forge/noarch/requests-2.31.0-pyhd8ed1ab_0.tar.bz2":                        KindConda,
		"http://deb.debian.org/debian/dists/bookworm/main/binary-amd64/Packages.gz":                                "",
		"http://deb.debian.org/debian/dists/bookworm/main/binary-amd64/by-hash/SHA256/" + strings.Repeat("0a", 32): KindByHash,
		"http://deb.debian.org/debian/dists/bookworm/main/i18n/by-hash/SHA256/" + strings.Repeat("0a", 32):         KindByHash,
		"http://deb.debian.org/debian/dists/bookworm/main/binary-amd64/by-hash/SHA256/" + strings.Repeat("0A", 32): "", // hex as apt writes it: lower case
		"http://deb.debian.org/debian/dists/bookworm/main/binary-amd64/by-hash/SHA256/0a":                          "",
		"http://deb.debian.org/debian/dists/bookworm/main/binary-amd64/by-hash/MD5Sum/" + strings.Repeat("0a", 16): "",
		"http://deb.debian.org/debian/by-hash/SHA256/" + strings.Repeat("0a", 32):                                  "", // not under dists/
		"http://deb.debian.org/debian/dists/bookworm/InRelease":                                                    "",
		"http://deb.debian.org/debian/hello_2.10-3_amd64.deb":                                                      "", // not in a pool
		"http://mirror/pypi/packages/ab/numpy-1.26.0-cp311-cp311-manylinux_2_17_x86_64.whl?x=1":                    "", // a query
		"https://files.pythonhosted.org/packages/ab/numpy-1.26.0-cp311-cp311-manylinux_2_17_x86_64.whl":            "", // HTTPS never passes in clear
		"http://github.com/owner/repo/archive/main.tar.gz":                                                         "",
		"http://cloud.r-project.org/src/contrib/PACKAGES.gz":                                                       "",
		"http://conda.anaconda.org/conda-forge/linux-64/repodata.json":                                             "",
		"http://mirror/pool/main/../../etc/x_1_all.deb":                                                            "",
		"http://mirror/simple/numpy/":                 "",
		"http://mirror/downloads/numpy-1.26.0.tar.gz": "", // an sdist outside /packages/
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		got, ok := Classify(u)
		if got != want || ok != (want != "") {
			t.Errorf("Classify(%s) = %q, %v; want %q", raw, got, ok, want)
		}
	}
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

func TestParseIndex(t *testing.T) {
	deb := "Package: hello\nVersion: 1\nFilename: pool/main/h/hello/hello_1_all.deb\nSize: 3\nSHA256: " + strings.Repeat("ab", 32) +
		"\n\nPackage: other\nFilename: pool/main/o/other/other_1_all.deb\nSHA256: " + strings.Repeat("CD", 32) + "\n"
	for _, p := range []string{"/debian/dists/bookworm/main/binary-amd64/Packages", "/debian/dists/bookworm/main/binary-amd64/Packages.gz",
		"/debian/dists/bookworm/main/binary-amd64/by-hash/SHA256/" + strings.Repeat("0", 64)} {
		body := []byte(deb)
		if !strings.HasSuffix(p, "Packages") {
			body = gz(body)
		}
		u := &url.URL{Scheme: "http", Host: "deb.test:8080", Path: p}
		if !IsIndex(u) {
			t.Fatalf("%s not an index", p)
		}
		got := ParseIndex(u, "", body)
		if len(got) != 2 || got["http://deb.test:8080/debian/pool/main/h/hello/hello_1_all.deb"] != strings.Repeat("ab", 32) ||
			got["http://deb.test:8080/debian/pool/main/o/other/other_1_all.deb"] != strings.Repeat("cd", 32) {
			t.Fatalf("%s: %v", p, got)
		}
	}
	page := &url.URL{Scheme: "http", Host: "pypi.test", Path: "/simple/hello/"}
	html := `<a href="../../packages/h/hello-1.0-py3-none-any.whl#sha256=` + strings.Repeat("1", 64) + `">x</a>` +
		`<a href='http://other.test/packages/hello-0.9.tar.gz#sha256=` + strings.Repeat("2", 64) + `'>y</a><a href="/nohash.whl">z</a>`
	got := ParseIndex(page, "text/html", []byte(html))
	if len(got) != 2 || got["http://pypi.test/packages/h/hello-1.0-py3-none-any.whl"] != strings.Repeat("1", 64) ||
		got["http://other.test/packages/hello-0.9.tar.gz"] != strings.Repeat("2", 64) {
		t.Fatalf("simple HTML: %v", got)
	}
	js := `{"files":[{"url":"../../packages/h/hello-1.0-py3-none-any.whl","hashes":{"sha256":"` + strings.Repeat("3", 64) + `"}}]}`
	got = ParseIndex(page, "application/vnd.pypi.simple.v1+json", []byte(js))
	if len(got) != 1 || got["http://pypi.test/packages/h/hello-1.0-py3-none-any.whl"] != strings.Repeat("3", 64) {
		t.Fatalf("simple JSON: %v", got)
	}
}

// upstream serves files by path and counts requests per path.
type upstream struct {
	mu    sync.Mutex
	files map[string][]byte
	hits  map[string]int
	gzip  map[string]bool // served with Content-Encoding: gzip
	srv   *httptest.Server
}

func newUpstream(t *testing.T) *upstream {
	u := &upstream{files: map[string][]byte{}, hits: map[string]int{}, gzip: map[string]bool{}}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.hits[r.URL.Path]++
		b, ok := u.files[r.URL.Path]
		enc := u.gzip[r.URL.Path]
		u.mu.Unlock()
		if !ok {
			http.NotFound(w, r)
			return
		}
		if enc {
			w.Header().Set("Content-Encoding", "gzip")
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(b)
	}))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) count(p string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.hits[p]
}

// client is an HTTP client whose requests to any host reach the upstream
// through the cache, as one attempt's.
func client(c *Cache, up *upstream) *http.Client { return attemptClient(c, up, "attempt") }

func attemptClient(c *Cache, up *upstream, attempt string) *http.Client {
	addr := up.srv.Listener.Addr().String()
	next := &http.Transport{DisableCompression: true, DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	return &http.Client{Transport: c.Wrap(attempt, next)}
}

func fetch(t *testing.T, cl *http.Client, raw string) []byte {
	t.Helper()
	resp, err := cl.Get(raw)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %v", raw, resp.StatusCode, err)
	}
	return b
}

func open(t *testing.T, dir string, max int64) *Cache {
	t.Helper()
	c, err := Open(Config{Dir: dir, MaxBytes: max, Hosts: []string{"deb.test", "pypi.test"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCache(t *testing.T) {
	up := newUpstream(t)
	debPath := "/debian/pool/main/h/hello/hello_1.0_all.deb"
	deb := bytes.Repeat([]byte("deb!"), 1000)
	whlPath := "/packages/h/hello-1.0-py3-none-any.whl"
	whl := bytes.Repeat([]byte("whl!"), 1000)
	badPath := "/packages/b/bad-1.0-py3-none-any.whl"
	bad := []byte("not what the index says")
	up.files[debPath] = deb
	up.files[whlPath] = whl
	up.files[badPath] = bad
	up.files["/debian/dists/test/main/binary-amd64/Packages.gz"] = gz([]byte("Package: hello\nFilename: pool/main/h/hello/hello_1.0_all.deb\nSHA256: " + sha(deb) + "\n"))
	up.files["/simple/bad/"] = []byte(`<a href="/packages/b/bad-1.0-py3-none-any.whl#sha256=` + sha([]byte("the real bytes")) + `">bad</a>`)
	gzPath := "/packages/g/gz-1.0-py3-none-any.whl"
	up.files[gzPath], up.gzip[gzPath] = gz(whl), true
	dir := t.TempDir()
	c := open(t, dir, 1<<20)
	cl := client(c, up)

	fetch(t, cl, "http://deb.test/debian/dists/test/main/binary-amd64/Packages.gz")
	fetch(t, cl, "http://pypi.test/simple/bad/")
	for i := range 2 {
		for p, want := range map[string][]byte{debPath: deb, whlPath: whl, badPath: bad, gzPath: gz(whl)} {
			host := "pypi.test"
			if strings.HasPrefix(p, "/debian") {
				host = "deb.test"
			}
			if got := fetch(t, cl, "http://"+host+p); !bytes.Equal(got, want) {
				t.Fatalf("round %d %s: %d bytes, want %d", i, p, len(got), len(want))
			}
		}
	}
	// The file its index vouches for is served once from upstream, then
	// from disk; the one no index names (nothing vouches for it), the one
	// whose bytes differ from its index's hash, and the encoded one, every
	// time.
	for p, want := range map[string]int{debPath: 1, whlPath: 2, badPath: 2, gzPath: 2} {
		if got := up.count(p); got != want {
			t.Errorf("%s fetched upstream %d times, want %d", p, got, want)
		}
	}
	st := c.Stats()
	if st.Hits != 1 || st.Stored != 1 || st.Verified != 1 || st.Mismatches != 2 || st.Entries != 1 || st.Bytes != int64(len(deb)) {
		t.Fatalf("stats %+v", st)
	}
	rec, err := os.ReadFile(c.objPath("http://deb.test/debian/pool/main/h/hello/hello_1.0_all.deb") + ".json")
	if err != nil || !strings.Contains(string(rec), `"verified":true`) {
		t.Fatalf("deb record %s %v; want verified", rec, err)
	}
	if _, err := os.Stat(c.objPath("http://pypi.test" + whlPath)); !os.IsNotExist(err) {
		t.Fatalf("the wheel no index named was stored: %v", err)
	}

	// Not cached: a host off the node's list, a query, a Range request.
	up.files["/packages/o/other-1.0-py3-none-any.whl"] = whl
	for range 2 {
		fetch(t, cl, "http://other.test/packages/o/other-1.0-py3-none-any.whl")
		fetch(t, cl, "http://pypi.test/packages/o/other-1.0-py3-none-any.whl?x=1")
	}
	if n := up.count("/packages/o/other-1.0-py3-none-any.whl"); n != 4 {
		t.Fatalf("uncacheable fetched %d times upstream, want 4", n)
	}

	// apt writes '+' as %2b; the index writes it as it is: one file.
	plusPath := "/debian/pool/main/g/g++-12/g++-12_12.2.0-14+deb12u1_amd64.deb"
	plus := []byte("g++")
	up.files[plusPath] = plus
	up.files["/debian/dists/test/main/binary-amd64/Packages"] = []byte("Package: g++-12\nFilename: pool/main/g/g++-12/g++-12_12.2.0-14+deb12u1_amd64.deb\nSHA256: " + sha(plus) + "\n")
	fetch(t, cl, "http://deb.test/debian/dists/test/main/binary-amd64/Packages")
	for range 2 {
		fetch(t, cl, "http://deb.test/debian/pool/main/g/g%2b%2b-12/g%2b%2b-12_12.2.0-14%2bdeb12u1_amd64.deb")
	}
	if st := c.Stats(); up.count(plusPath) != 1 || st.Verified != 2 {
		t.Fatalf("escaped '+': fetched %d times upstream, stats %+v; want once, verified", up.count(plusPath), st)
	}

	// A reopened cache (the node restarted) still serves what it held, to
	// an attempt whose index vouches for it.
	c2 := open(t, dir, 1<<20)
	cl2 := client(c2, up)
	fetch(t, cl2, "http://deb.test/debian/dists/test/main/binary-amd64/Packages.gz")
	fetch(t, cl2, "http://deb.test"+debPath)
	if up.count(debPath) != 1 || c2.Stats().Hits != 1 {
		t.Fatalf("after reopening: upstream %d, stats %+v", up.count(debPath), c2.Stats())
	}
}

func TestCacheQuotaAndAbandon(t *testing.T) {
	up := newUpstream(t)
	dir := t.TempDir()
	c := open(t, dir, 40000) // 10 KB files: four fit; a file over 10 KB is not stored
	cl := client(c, up)
	name := func(i int) string { return fmt.Sprintf("/packages/p/p%d-1.0-py3-none-any.whl", i) }
	var page strings.Builder
	for i := range 10 {
		up.files[name(i)] = bytes.Repeat([]byte{byte('a' + i)}, 10000)
		if i == 9 {
			up.files[name(i)] = bytes.Repeat([]byte("z"), 10001)
		}
		fmt.Fprintf(&page, `<a href="%s#sha256=%s">p%d</a>`, name(i), sha(up.files[name(i)]), i)
	}
	up.files["/simple/p/"] = []byte(page.String())
	fetch(t, cl, "http://pypi.test/simple/p/")  // the attempt's index vouches for them all
	for _, i := range []int{0, 1, 2, 3, 0, 4} { // 0 used again: 1 is the oldest when 4 arrives
		fetch(t, cl, "http://pypi.test"+name(i))
	}
	st := c.Stats()
	if st.Entries != 4 || st.Evicted != 1 || st.Bytes != 40000 {
		t.Fatalf("stats %+v", st)
	}
	fetch(t, cl, "http://pypi.test"+name(1))
	fetch(t, cl, "http://pypi.test"+name(0))
	if up.count(name(1)) != 2 || up.count(name(0)) != 1 {
		t.Fatalf("evicted the wrong file: p1 fetched %d times, p0 %d", up.count(name(1)), up.count(name(0)))
	}
	// Too large for a quarter of the quota: passed on, not stored.
	fetch(t, cl, "http://pypi.test"+name(9))
	fetch(t, cl, "http://pypi.test"+name(9))
	if up.count(name(9)) != 2 {
		t.Fatal("a file over a quarter of the quota was stored")
	}
	// A client that stops half-way leaves nothing.
	resp, err := cl.Get("http://pypi.test" + name(5))
	if err != nil {
		t.Fatal(err)
	}
	io.ReadFull(resp.Body, make([]byte, 100))
	resp.Body.Close()
	fetch(t, cl, "http://pypi.test"+name(5))
	if up.count(name(5)) != 2 {
		t.Fatalf("a half-read download was stored: fetched %d times", up.count(name(5)))
	}
	tmp, _ := os.ReadDir(filepath.Join(dir, "tmp"))
	if len(tmp) != 0 {
		t.Fatalf("left in tmp: %v", tmp)
	}
	// A file without its record is dropped at Open.
	if err := os.WriteFile(filepath.Join(dir, "objects", strings.Repeat("0", 64)), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	c2 := open(t, dir, 40000)
	if _, err := os.Stat(filepath.Join(dir, "objects", strings.Repeat("0", 64))); !os.IsNotExist(err) || c2.Stats().Entries != 4 {
		t.Fatalf("stray file kept (%v) or entries %d", err, c2.Stats().Entries)
	}
}

// TestCacheByHash: Debian indexes fetched by hash are kept, verified by
// their name, and still read for the packages' hashes when served from
// disk, so a cache reopened without the hashes it had learnt verifies the
// packages it stores against the index it holds.
func TestCacheByHash(t *testing.T) {
	up := newUpstream(t)
	deb := bytes.Repeat([]byte("deb!"), 1000)
	debPath := "/debian/pool/main/h/hello/hello_1.0_all.deb"
	index := gz([]byte("Package: hello\nFilename: pool/main/h/hello/hello_1.0_all.deb\nSHA256: " + sha(deb) + "\n"))
	byHash := "/debian/dists/test/main/binary-amd64/by-hash/SHA256/" + sha(index)
	up.files[byHash] = index
	up.files[debPath] = deb
	liar := "/debian/dists/test/main/i18n/by-hash/SHA256/" + sha([]byte("the named bytes"))
	up.files[liar] = []byte("other bytes")
	dir := t.TempDir()
	c := open(t, dir, 1<<20)
	cl := client(c, up)
	for range 2 {
		if got := fetch(t, cl, "http://deb.test"+byHash); !bytes.Equal(got, index) {
			t.Fatal("index changed on its way")
		}
		if got := fetch(t, cl, "http://deb.test"+liar); string(got) != "other bytes" {
			t.Fatalf("passed on %q", got)
		}
	}
	if up.count(byHash) != 1 || up.count(liar) != 2 {
		t.Fatalf("upstream saw the index %d times (want 1) and the mismatched file %d (want 2)", up.count(byHash), up.count(liar))
	}
	if st := c.Stats(); st.Stored != 1 || st.Verified != 1 || st.Mismatches != 2 || st.Hits != 1 {
		t.Fatalf("stats %+v", st)
	}

	c2 := open(t, dir, 1<<20) // knows no hashes until an index passes
	cl2 := client(c2, up)
	fetch(t, cl2, "http://deb.test"+byHash)
	fetch(t, cl2, "http://deb.test"+debPath)
	if st := c2.Stats(); up.count(byHash) != 1 || st.Hits != 1 || st.Hashes != 1 || st.Verified != 1 {
		t.Fatalf("reopened: upstream saw the index %d times, stats %+v; want the index from disk and the package verified by it",
			up.count(byHash), st)
	}
}

// TestCacheAttemptsApart: what one attempt's requests met (a bad mirror,
// a man in the middle) never reaches another attempt. An attempt is
// served a stored file only when its own index vouches for the stored
// bytes; a stored file its index contradicts is dropped and fetched
// again; an attempt that read no index gets nothing from the cache.
func TestCacheAttemptsApart(t *testing.T) {
	good := bytes.Repeat([]byte("good"), 1000)
	evil := bytes.Repeat([]byte("evil"), 1000)
	debPath := "/debian/pool/main/h/hello/hello_1.0_all.deb"
	indexPath := "/debian/dists/test/main/binary-amd64/Packages"
	indexOf := func(b []byte) []byte {
		return []byte("Package: hello\nFilename: pool/main/h/hello/hello_1.0_all.deb\nSHA256: " + sha(b) + "\n")
	}
	bad, honest := newUpstream(t), newUpstream(t)
	bad.files[indexPath], bad.files[debPath] = indexOf(evil), evil
	honest.files[indexPath], honest.files[debPath] = indexOf(good), good
	c := open(t, t.TempDir(), 1<<20)

	// The attacker's attempt meets the bad mirror: its index and bytes agree.
	a := attemptClient(c, bad, "attacker")
	fetch(t, a, "http://deb.test"+indexPath)
	if got := fetch(t, a, "http://deb.test"+debPath); !bytes.Equal(got, evil) || c.Stats().Stored != 1 {
		t.Fatalf("setup: the attacker's attempt did not store its bytes (%+v)", c.Stats())
	}
	// An attempt that read no index is not served what is stored.
	if got := fetch(t, attemptClient(c, honest, "no-index"), "http://deb.test"+debPath); !bytes.Equal(got, good) {
		t.Fatal("an attempt without an index was served the stored bytes")
	}
	// The victim's index contradicts the stored file: dropped, fetched
	// from its mirror, stored as its index says.
	v := attemptClient(c, honest, "victim")
	fetch(t, v, "http://deb.test"+indexPath)
	if got := fetch(t, v, "http://deb.test"+debPath); !bytes.Equal(got, good) {
		t.Fatal("the victim was served the attacker's bytes")
	}
	st := c.Stats()
	if st.Contradicted != 1 || st.Stored != 2 || st.Entries != 1 || honest.count(debPath) != 2 {
		t.Fatalf("stats %+v, honest mirror asked %d times", st, honest.count(debPath))
	}
	// And the attacker's attempt is not served the victim's bytes either:
	// its index says otherwise.
	if got := fetch(t, a, "http://deb.test"+debPath); !bytes.Equal(got, evil) {
		t.Fatal("the attacker's attempt got bytes its index does not vouch for")
	}
}
