// Package pkgcache is the node's package cache: immutable package files
// (Debian .deb, Python wheels and sdists, CRAN and conda packages, and
// Debian's indexes named by their hash; see Classify) that the egress proxy fetched over plain HTTP for one attempt
// are kept on disk, within a size quota, least recently used first out,
// and served to later attempts on the same node without a download.
//
// A file is stored only when it was received whole, with status 200 and
// no content encoding, from a host on the node's list of cacheable hosts
// (Config.Hosts), and only when it is verified: its name is its SHA-256
// (Debian's indexes by hash), or an index the same attempt read (a Debian
// Packages file, a PyPI simple page) gave its SHA-256, and it matches. A
// stored file is served to an attempt only when an index that attempt
// read gives the stored file's SHA-256 (or its name is its SHA-256); a
// stored file that an attempt's index contradicts is dropped and fetched
// again. So a bad mirror, or a man in the middle, that one attempt's
// requests met can never give its bytes to another attempt: each gets only
// what its own indexes (which its apt or pip checks) vouch for. HTTPS
// goes through the proxy's CONNECT tunnels, which are never intercepted,
// so it is never cached (see docs/sandbox.md for why the node points
// agents at plain-HTTP mirrors instead of rewriting their URLs).
//
// It owns its folder (Config.Dir): objects/<sha256 of the URL> with a
// .json record beside each, and tmp/ for downloads in progress. It keeps
// nothing of an attempt but those files (and hashes read from indexes),
// and it never changes what passes through it: a response is served from
// the cache or passed on byte for byte.
package pkgcache

import (
	"container/list"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/repronet/repronet/sandbox/egress"
)

// Defaults of Config.
const (
	DefaultMaxBytes  = 10 << 30
	DefaultMaxHashes = 1 << 19
)

// Config sets up a Cache.
type Config struct {
	// Dir holds the cache (created if missing).
	Dir string
	// MaxBytes is the quota of stored files (default DefaultMaxBytes); a
	// single file larger than a quarter of it is passed on, not stored.
	MaxBytes int64
	// Hosts are the hosts whose package files are cached and whose
	// indexes are read (egress.ParseHosts patterns: "deb.debian.org",
	// "*.r-project.org"). The cache trusts them to keep a released file's
	// URL unchanged. Empty: nothing is cached.
	Hosts []string
	// MaxHashes bounds the SHA-256 sums kept from indexes (default
	// DefaultMaxHashes); past it they are forgotten and read again.
	MaxHashes int
	// Logger (default slog.Default()).
	Logger *slog.Logger
}

// Stats counts what the cache did.
type Stats struct {
	Hits, Misses   int64 // requests for cacheable files served from disk / passed on
	Stored         int64 // files stored
	Verified       int64 // of them, matched the SHA-256 an index or their name gave (all of them)
	Evicted        int64 // files removed for the quota
	Mismatches     int64 // files not stored: their SHA-256 differs from their index's
	Contradicted   int64 // stored files dropped: an attempt's index gave another SHA-256
	Entries, Bytes int64 // what the cache holds now
	Hashes         int64 // SHA-256 sums learnt from attempts' indexes (a running count)
}

// Cache is a package cache on disk. It is safe for concurrent use.
type Cache struct {
	dir       string
	max       int64
	hosts     []string
	maxHashes int
	log       *slog.Logger

	mu      sync.Mutex
	entries map[string]*entry
	lru     *list.List // of *entry, most recently used first
	size    int64
	stats   Stats
}

// entry is one stored file; its record is the .json beside it.
type entry struct {
	URL         string `json:"url"` // canonical
	Kind        Kind   `json:"kind"`
	Size        int64  `json:"size"`
	SHA256      string `json:"sha256"`
	Verified    bool   `json:"verified"` // an index or its name gave the sum and it matched (always, since issue 24)
	ContentType string `json:"content_type,omitempty"`
	Stored      string `json:"stored"` // RFC 3339

	elem *list.Element
}

// Open opens (or makes) the cache in cfg.Dir and loads what it holds:
// files without a record, records without a file and downloads left
// half-way are removed; past the quota, the least recently used go.
func Open(cfg Config) (*Cache, error) {
	if cfg.Dir == "" || !filepath.IsAbs(cfg.Dir) {
		return nil, fmt.Errorf("pkgcache: folder %q is not an absolute path", cfg.Dir)
	}
	hosts, err := egress.ParseHosts(cfg.Hosts)
	if err != nil {
		return nil, fmt.Errorf("pkgcache: hosts: %w", err)
	}
	c := &Cache{dir: cfg.Dir, max: cfg.MaxBytes, hosts: hosts, maxHashes: cfg.MaxHashes, log: cfg.Logger,
		entries: map[string]*entry{}, lru: list.New()}
	if c.max <= 0 {
		c.max = DefaultMaxBytes
	}
	if c.maxHashes <= 0 {
		c.maxHashes = DefaultMaxHashes
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	c.log = c.log.With("component", "pkgcache")
	if err := os.RemoveAll(c.tmpDir()); err != nil {
		return nil, fmt.Errorf("pkgcache: clear downloads in progress: %w", err)
	}
	for _, d := range []string{c.objDir(), c.tmpDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("pkgcache: %w", err)
		}
	}
	if err := c.load(); err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.evict()
	c.mu.Unlock()
	return c, nil
}

func (c *Cache) objDir() string { return filepath.Join(c.dir, "objects") }
func (c *Cache) tmpDir() string { return filepath.Join(c.dir, "tmp") }

// objPath is where the file of a canonical URL lives.
func (c *Cache) objPath(key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(c.objDir(), hex.EncodeToString(sum[:]))
}

// load reads the records, oldest use (file modification time) last.
func (c *Cache) load() error {
	des, err := os.ReadDir(c.objDir())
	if err != nil {
		return fmt.Errorf("pkgcache: list: %w", err)
	}
	type loaded struct {
		e   *entry
		use time.Time
	}
	var all []loaded
	records := map[string]bool{}
	for _, d := range des {
		if name, ok := strings.CutSuffix(d.Name(), ".json"); ok {
			records[name] = true
		}
	}
	for _, d := range des {
		name := d.Name()
		if strings.HasSuffix(name, ".json") {
			continue
		}
		p := filepath.Join(c.objDir(), name)
		drop := func(why string) {
			c.log.Warn("pkgcache: dropping a stored file", "file", p, "why", why)
			_ = os.Remove(p)
			_ = os.Remove(p + ".json")
		}
		if !records[name] {
			drop("no record")
			continue
		}
		delete(records, name)
		b, err := os.ReadFile(p + ".json")
		var e entry
		if err != nil || json.Unmarshal(b, &e) != nil || c.objPath(e.URL) != p {
			drop("unreadable record")
			continue
		}
		st, err := os.Stat(p)
		if err != nil || st.Size() != e.Size {
			drop("size differs from its record")
			continue
		}
		all = append(all, loaded{&e, st.ModTime()})
	}
	for name := range records {
		_ = os.Remove(filepath.Join(c.objDir(), name+".json"))
	}
	sort.Slice(all, func(i, j int) bool { return all[i].use.After(all[j].use) })
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range all {
		l.e.elem = c.lru.PushBack(l.e)
		c.entries[l.e.URL] = l.e
		c.size += l.e.Size
	}
	return nil
}

// Stats returns the counters.
func (c *Cache) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := c.stats
	s.Entries, s.Bytes = int64(len(c.entries)), c.size
	return s
}

// canonical is the cache's key of a URL: scheme, lower-case host, port
// unless 80, decoded path (apt writes '+' as %2b, an index writes it as
// it is); nothing else.
func canonical(u *url.URL) string {
	host := strings.ToLower(u.Hostname())
	if p := u.Port(); p != "" && p != "80" {
		host += ":" + p
	}
	k := url.URL{Scheme: u.Scheme, Host: host, Path: u.Path}
	return k.String()
}

// cacheableHost reports whether the URL's host is on the node's list.
func (c *Cache) cacheableHost(u *url.URL) bool {
	return len(c.hosts) > 0 && egress.MatchHost(c.hosts, strings.TrimSuffix(strings.ToLower(u.Hostname()), "."))
}

// Wrap returns the transport for one attempt's plain-HTTP requests: GETs
// of cacheable files are answered from disk when stored, and stored when
// fetched; indexes pass through and are read for hashes; everything else
// goes to next untouched. (egress.Config.Transport takes it.)
func (c *Cache) Wrap(attempt string, next http.RoundTripper) http.RoundTripper {
	return &transport{c: c, next: next, log: c.log.With("attempt", attempt), hashes: map[string]string{}}
}

// transport is one attempt's: the hashes it knows are those of the
// indexes this attempt read, never another's.
type transport struct {
	c    *Cache
	next http.RoundTripper
	log  *slog.Logger

	mu     sync.Mutex
	hashes map[string]string // canonical URL -> sha256 hex, from this attempt's indexes
}

// sum is the SHA-256 this attempt knows for key: the one its URL names,
// else the one an index it read gave ("" when it knows none).
func (t *transport) sum(u *url.URL, key string) string {
	if n := NamedHash(u); n != "" {
		return n
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.hashes[key]
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	c, u := t.c, req.URL
	if req.Method != http.MethodGet || req.Header.Get("Range") != "" || !c.cacheableHost(u) {
		return t.next.RoundTrip(req)
	}
	// An index is read for hashes whether it comes from the mirror or,
	// named by its hash, from disk.
	index := func(resp *http.Response) *http.Response {
		if IsIndex(u) && resp.StatusCode == http.StatusOK && identity(resp) {
			resp.Body = &indexReader{ReadCloser: resp.Body, t: t, u: u, ctype: resp.Header.Get("Content-Type")}
		}
		return resp
	}
	kind, ok := Classify(u)
	if !ok {
		resp, err := t.next.RoundTrip(req)
		if err != nil {
			return nil, err
		}
		return index(resp), nil
	}
	key := canonical(u)
	want := t.sum(u, key)
	if resp := c.serve(req, key, want, t.log); resp != nil {
		return index(resp), nil
	}
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK || !identity(resp) || resp.ContentLength > c.max/4 ||
		strings.Contains(strings.ToLower(resp.Header.Get("Cache-Control")), "no-store") {
		return index(resp), nil
	}
	f, err := os.CreateTemp(c.tmpDir(), "fill-*")
	if err != nil {
		t.log.Warn("pkgcache: cannot store a download", "url", key, "err", err)
		return index(resp), nil
	}
	resp.Body = &fill{ReadCloser: resp.Body, c: c, f: f, h: sha256.New(), key: key, kind: kind, sum: want,
		want: resp.ContentLength, ctype: resp.Header.Get("Content-Type"), log: t.log}
	return index(resp), nil
}

// identity reports whether the response carries the file's own bytes.
func identity(resp *http.Response) bool {
	ce := strings.ToLower(resp.Header.Get("Content-Encoding"))
	return ce == "" || ce == "identity"
}

// serve answers req from the stored file of key when the requesting
// attempt knows its SHA-256 (want) and it is the stored file's; a stored
// file that want contradicts is dropped. It returns nil for a miss.
func (c *Cache) serve(req *http.Request, key, want string, log *slog.Logger) *http.Response {
	c.mu.Lock()
	e, ok := c.entries[key]
	if ok && want != "" && e.SHA256 != want {
		log.Warn("pkgcache: a stored file contradicts the attempt's index; dropped", "url", key, "sha256", e.SHA256, "index_sha256", want)
		c.drop(e)
		c.stats.Contradicted++
		ok = false
	}
	if !ok || want == "" {
		c.stats.Misses++
		c.mu.Unlock()
		return nil
	}
	c.lru.MoveToFront(e.elem)
	c.mu.Unlock()
	p := c.objPath(key)
	f, err := os.Open(p)
	if err != nil {
		c.mu.Lock()
		c.stats.Misses++
		c.mu.Unlock()
		return nil
	}
	now := time.Now()
	_ = os.Chtimes(p, now, now) // the use order survives a restart
	c.mu.Lock()
	c.stats.Hits++
	c.mu.Unlock()
	h := http.Header{}
	if e.ContentType != "" {
		h.Set("Content-Type", e.ContentType)
	}
	h.Set("Content-Length", strconv.FormatInt(e.Size, 10))
	h.Set("X-Repronet-Cache", "hit")
	return &http.Response{Status: "200 OK", StatusCode: http.StatusOK, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, Body: f, ContentLength: e.Size, Request: req}
}

// fill copies a download into a temporary file as it passes to the
// client, and stores it once it has arrived whole.
type fill struct {
	io.ReadCloser
	c     *Cache
	f     *os.File // nil once given up
	h     hash.Hash
	n     int64
	key   string
	kind  Kind
	sum   string // the SHA-256 the attempt knows for it (its name, or its index), or ""
	want  int64  // Content-Length, or -1
	ctype string
	log   *slog.Logger
	done  bool
}

func (fl *fill) Read(p []byte) (int, error) {
	n, err := fl.ReadCloser.Read(p)
	if n > 0 && fl.f != nil {
		if _, werr := fl.f.Write(p[:n]); werr != nil || fl.n+int64(n) > fl.c.max/4 {
			fl.abandon() // the client still gets every byte
		} else {
			fl.h.Write(p[:n])
			fl.n += int64(n)
		}
	}
	if err == io.EOF && fl.f != nil && !fl.done {
		fl.done = true
		fl.commit()
	}
	return n, err
}

func (fl *fill) Close() error {
	err := fl.ReadCloser.Close()
	if fl.f != nil && !fl.done {
		fl.abandon() // the client went away before the end
	}
	return err
}

func (fl *fill) abandon() {
	name := fl.f.Name()
	fl.f.Close()
	_ = os.Remove(name)
	fl.f = nil
}

// commit stores the download if it is whole and matches its index's hash.
func (fl *fill) commit() {
	defer func() {
		if fl.f != nil {
			fl.abandon()
		}
	}()
	if fl.want >= 0 && fl.n != fl.want {
		return
	}
	sum := hex.EncodeToString(fl.h.Sum(nil))
	c := fl.c
	if fl.sum == "" {
		return // nothing vouches for these bytes: passed on, never stored
	}
	c.mu.Lock()
	_, have := c.entries[fl.key]
	if fl.sum != sum {
		c.stats.Mismatches++
	}
	c.mu.Unlock()
	if fl.sum != sum {
		fl.log.Warn("pkgcache: download does not match its index; not stored", "url", fl.key, "sha256", sum, "index_sha256", fl.sum)
		return
	}
	if have {
		return // another attempt stored it meanwhile
	}
	e := &entry{URL: fl.key, Kind: fl.kind, Size: fl.n, SHA256: sum, Verified: true, ContentType: fl.ctype,
		Stored: time.Now().UTC().Format(time.RFC3339)}
	if err := fl.store(e); err != nil {
		fl.log.Warn("pkgcache: cannot store a download", "url", fl.key, "err", err)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, have := c.entries[fl.key]; have {
		return // stored twice at once: same name, same bytes
	}
	e.elem = c.lru.PushFront(e)
	c.entries[e.URL] = e
	c.size += e.Size
	c.stats.Stored++
	if e.Verified {
		c.stats.Verified++
	}
	c.evict()
	fl.log.Debug("pkgcache: stored", "url", e.URL, "kind", e.Kind, "bytes", e.Size, "verified", e.Verified)
}

// store writes the record, then moves the file into place (a file without
// its record is dropped at Open).
func (fl *fill) store(e *entry) error {
	if err := fl.f.Sync(); err != nil {
		return err
	}
	rec, err := json.Marshal(e)
	if err != nil {
		return err
	}
	p := fl.c.objPath(e.URL)
	tmp := fl.f.Name() + ".json"
	if err := os.WriteFile(tmp, rec, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, p+".json"); err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if err := fl.f.Close(); err != nil {
		return err
	}
	name := fl.f.Name()
	fl.f = nil
	if err := os.Rename(name, p); err != nil {
		_ = os.Remove(name)
		_ = os.Remove(p + ".json")
		return err
	}
	return nil
}

// evict removes the least recently used files until the cache fits its
// quota. c.mu is held.
func (c *Cache) evict() {
	for c.size > c.max {
		back := c.lru.Back()
		if back == nil {
			return
		}
		c.drop(back.Value.(*entry))
		c.stats.Evicted++
	}
}

// drop removes a stored file and its record; c.mu is held.
func (c *Cache) drop(e *entry) {
	c.lru.Remove(e.elem)
	delete(c.entries, e.URL)
	c.size -= e.Size
	p := c.objPath(e.URL)
	// A reader of the file keeps it until it closes it.
	if err := errors.Join(os.Remove(p+".json"), os.Remove(p)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("pkgcache: drop", "url", e.URL, "err", err)
	}
}

// indexReader collects an index as it passes and reads its hashes at the
// end.
type indexReader struct {
	io.ReadCloser
	t     *transport
	u     *url.URL
	ctype string
	buf   []byte
	over  bool
	done  bool
}

func (r *indexReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if n > 0 && !r.over {
		if len(r.buf)+n > maxIndexBytes {
			r.over, r.buf = true, nil
		} else {
			r.buf = append(r.buf, p[:n]...)
		}
	}
	if err == io.EOF && !r.over && !r.done {
		r.done = true
		r.t.learn(ParseIndex(r.u, r.ctype, r.buf))
		r.buf = nil
	}
	return n, err
}

// learn keeps sums read from an index the attempt read.
func (t *transport) learn(sums map[string]string) {
	if len(sums) == 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.hashes)+len(sums) > t.c.maxHashes {
		t.log.Info("pkgcache: forgetting index hashes to stay under the bound", "known", len(t.hashes), "bound", t.c.maxHashes)
		t.hashes = map[string]string{}
	}
	n := 0
	for k, v := range sums {
		u, err := url.Parse(k)
		if err != nil {
			continue
		}
		t.hashes[canonical(u)] = v
		n++
	}
	t.c.mu.Lock()
	t.c.stats.Hashes += int64(n)
	t.c.mu.Unlock()
}
