package capsulestore

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ipfs/boxo/bitswap/network/bsnet"
	"github.com/ipfs/boxo/blockservice"
	"github.com/ipfs/boxo/blockstore"
	chunker "github.com/ipfs/boxo/chunker"
	"github.com/ipfs/boxo/ipld/merkledag"
	"github.com/ipfs/boxo/ipld/unixfs/importer/balanced"
	"github.com/ipfs/boxo/ipld/unixfs/importer/helpers"
	uio "github.com/ipfs/boxo/ipld/unixfs/io"
	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
	ipld "github.com/ipfs/go-ipld-format"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	mh "github.com/multiformats/go-multihash"
	"github.com/repronet/repronet/internal/blockfs"
	"github.com/repronet/repronet/internal/diskguard"
)

// The import profile: Kubo's `unixfs-v1-2025` (IPIP-499), as constants rather
// than boxo's mutable uio.UnixFS_v1_2025 (a test checks they agree).
const (
	profileChunkSize = 1 << 20
	profileMaxLinks  = 1024
	profileRawLeaves = true
)

// profileCidBuilder: CIDv1, dag-pb for inner nodes (raw for leaves), sha2-256.
func profileCidBuilder() cid.Builder {
	return cid.Prefix{Version: 1, Codec: cid.DagProtobuf, MhType: mh.SHA2_256, MhLength: -1}
}

// Defaults of the options.
const (
	DefaultStallTimeout     = 60 * time.Second
	DefaultProgressInterval = time.Second
	DefaultFetchConcurrency = 32
)

// Option configures a Store.
type Option func(*config)

type config struct {
	log              *slog.Logger
	progressInterval time.Duration
	stallTimeout     time.Duration
	concurrency      int
	quota            int64
	blockDir         string
	guard            *diskguard.Guard
	// DAG shape; only tests change it (withDAGShape), production always
	// imports with the profile.
	chunkSize int64
	maxLinks  int
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) {
		if l != nil {
			c.log = l
		}
	}
}

// WithProgressInterval sets how often Fetch reports progress (default 1 s).
// Fetch reports once more when it completes.
func WithProgressInterval(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.progressInterval = d
		}
	}
}

// WithStallTimeout sets how long Fetch waits without receiving any block
// before it gives up with ErrStalled (default 60 s). There is no limit on a
// fetch's total duration; bound that with the context if needed.
func WithStallTimeout(d time.Duration) Option {
	return func(c *config) {
		if d > 0 {
			c.stallTimeout = d
		}
	}
}

// WithFetchConcurrency bounds how many blocks Fetch asks of one peer at once
// (default 32); within the bound it follows the rate the peer delivers at.
func WithFetchConcurrency(n int) Option {
	return func(c *config) {
		if n > 0 {
			c.concurrency = n
		}
	}
}

// WithQuota sets the store's quota in bytes (default 0: none). Fetch evicts
// least recently used files that are neither pinned nor in use to stay under
// it, and fails with ErrQuota when it cannot; Add evicts the same way but
// never fails for the quota (imported files are pinned).
func WithQuota(bytes int64) Option {
	return func(c *config) {
		if bytes > 0 {
			c.quota = bytes
		}
	}
}

// WithBlockDir keeps block bytes as files, one per block, in dir (created
// if needed; see internal/blockfs) instead of in the datastore given to
// Open, which then holds only the index. A fetch writes each block with one
// write and a rename, not through the datastore's (badger's) memory-mapped
// log. Blocks that a Store opened without this option kept in the
// datastore are moved to files when the Store opens. Every Store over the
// same datastore (node, coordinator, command line) must then use the same
// dir.
func WithBlockDir(dir string) Option {
	return func(c *config) { c.blockDir = dir }
}

// WithDiskGuard makes every block file written (WithBlockDir) ask g
// first, so that the store never eats into the free space its data folder
// keeps for badger (internal/diskguard): a refused write fails the Add or
// Fetch with an error wrapping diskguard.ErrDiskFull. The index, in the
// datastore given to Open, is guarded by that datastore.
func WithDiskGuard(g *diskguard.Guard) Option {
	return func(c *config) { c.guard = g }
}

// withDAGShape changes the chunk size and links per node; for tests of DAG
// shapes that would need gigabytes with the real profile.
func withDAGShape(chunkSize int64, maxLinks int) Option {
	return func(c *config) {
		c.chunkSize = chunkSize
		c.maxLinks = maxLinks
	}
}

// ItemOption describes the file an Add, AddFile, Fetch or WriteTo is about.
type ItemOption func(*itemConfig)

type itemConfig struct {
	name      string
	providers []peer.AddrInfo
	maxSize   int64
	mode      os.FileMode
}

// WithMode sets the permissions of the file WriteTo writes (default 0644);
// it has them before it is renamed into place.
func WithMode(m os.FileMode) ItemOption {
	return func(c *itemConfig) { c.mode = m.Perm() }
}

// WithMaxSize makes Fetch fail with ErrTooLarge, before it fetches more
// than the root, when the file is larger than n bytes (a node's output the
// coordinator fetches is bounded by its recipe).
func WithMaxSize(n int64) ItemOption {
	return func(c *itemConfig) { c.maxSize = n }
}

// WithName names the file in the cache index (Add, AddFile, Fetch,
// WriteTo); a name already recorded is kept when this one is empty.
func WithName(name string) ItemOption {
	return func(c *itemConfig) { c.name = name }
}

// WithProviders gives peers that hold the file (Fetch, WriteTo, Open,
// Verify): provider hints, dialled before the fetch starts. Peers already
// connected are asked too.
func WithProviders(ps ...peer.AddrInfo) ItemOption {
	return func(c *itemConfig) { c.providers = append(c.providers, ps...) }
}

// Store holds content-addressed files (capsules, agent image tarballs, any
// file) in a blockstore over a go-datastore, keeps an index of them (see
// List), and serves and fetches them over bitswap on a libp2p host. Its
// methods are safe for concurrent use.
type Store struct {
	cfg    config
	log    *slog.Logger
	host   host.Host             // nil: offline
	bstore blockstore.Blockstore // refs
	refs   *refStore             // the blocks, and the leaves of placed files (WriteTo)
	// blocks is the block files' datastore (WithBlockDir), or nil: blocks
	// live in the index's datastore.
	blocks datastore.Datastore
	ex     *exchange // nil: offline
	dag    ipld.DAGService
	cache  *cache
	cancel context.CancelFunc

	flightMu sync.Mutex
	flights  map[cid.Cid]chan struct{}

	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error
}

// ErrClosed: the Store was closed.
var ErrClosed = errors.New("capsulestore: store closed")

// Open creates a Store over ds that serves its blocks to, and fetches blocks
// from, the peers connected to h (bitswap registers its protocols on h, so
// open one Store per host). With a nil h the Store is offline: it imports,
// lists, verifies and reads what is local, and Fetch fails with ErrOffline
// for anything missing. Blocks live under ds's /blocks prefix and the index
// under /index. ctx bounds only the opening; the Store lives until Close.
// The caller keeps ownership of ds and h and closes them after the Store.
func Open(ctx context.Context, ds datastore.Batching, h host.Host, opts ...Option) (*Store, error) {
	if ds == nil {
		return nil, errors.New("capsulestore: open: nil datastore")
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("capsulestore: open: %w", err)
	}
	cfg := config{
		log:              slog.Default(),
		progressInterval: DefaultProgressInterval,
		stallTimeout:     DefaultStallTimeout,
		concurrency:      DefaultFetchConcurrency,
		chunkSize:        profileChunkSize,
		maxLinks:         profileMaxLinks,
	}
	for _, o := range opts {
		o(&cfg)
	}
	// Identity CIDs (data inlined in the CID) resolve without a lookup.
	var bstore blockstore.Blockstore
	var blocksDS datastore.Datastore
	if cfg.blockDir != "" {
		bfs, err := blockfs.Open(cfg.blockDir)
		if err != nil {
			return nil, fmt.Errorf("capsulestore: open: %w", err)
		}
		if err := migrateBlocks(ctx, ds, bfs, cfg.log); err != nil {
			return nil, fmt.Errorf("capsulestore: open: %w", err)
		}
		var files datastore.Batching = bfs
		if cfg.guard != nil {
			files = diskguard.Wrap(bfs, cfg.guard, 0)
		}
		bstore = blockstore.NewIdStore(blockstore.NewBlockstore(files, blockstore.NoPrefix()))
		blocksDS = files
	} else {
		bstore = blockstore.NewIdStore(blockstore.NewBlockstore(ds))
	}
	refs := newRefStore(bstore)
	bstore = refs
	// The exchange lives as long as the Store, not as long as ctx.
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	log := cfg.log.With("component", "capsulestore")
	s := &Store{
		cfg:     cfg,
		log:     log,
		host:    h,
		bstore:  bstore,
		refs:    refs,
		blocks:  blocksDS,
		dag:     merkledag.NewDAGService(blockservice.New(bstore, nil)),
		cancel:  cancel,
		flights: make(map[cid.Cid]chan struct{}),
	}
	c, err := openCache(ctx, s, ds)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("capsulestore: open: %w", err)
	}
	s.cache = c
	for pc, path := range c.placedFiles() {
		if err := s.loadPlaced(ctx, pc, path); err != nil {
			log.Warn("a file written by get -o is no longer usable: its blocks will be fetched again when needed", "cid", pc, "err", err)
		}
	}
	if h != nil {
		s.ex = newExchange(bctx, bsnet.NewFromIpfsHost(h), refs, log)
	}
	return s, nil
}

// migrateBlocks moves the blocks that a Store opened without WithBlockDir
// kept in ds (under /blocks) into the block folder, so that switching to
// WithBlockDir loses nothing. The files are synced before the datastore's
// copies are deleted; an interrupted migration is finished by the next Open.
func migrateBlocks(ctx context.Context, ds datastore.Batching, bfs *blockfs.Datastore, log *slog.Logger) error {
	res, err := ds.Query(ctx, query.Query{Prefix: blockstore.BlockPrefix.String(), KeysOnly: true})
	if err != nil {
		return fmt.Errorf("moving blocks to files: %w", err)
	}
	es, err := res.Rest()
	if err != nil {
		return fmt.Errorf("moving blocks to files: %w", err)
	}
	if len(es) == 0 {
		return nil
	}
	start := time.Now()
	var moved []datastore.Key
	var bytes int64
	for _, e := range es {
		name, ok := strings.CutPrefix(e.Key, blockstore.BlockPrefix.String()+"/")
		if !ok || strings.Contains(name, "/") {
			continue
		}
		k := datastore.RawKey(e.Key)
		v, err := ds.Get(ctx, k)
		if errors.Is(err, datastore.ErrNotFound) {
			continue
		}
		if err != nil {
			return fmt.Errorf("moving block %s to files: %w", name, err)
		}
		if err := bfs.Put(ctx, datastore.NewKey(name), v); err != nil {
			return fmt.Errorf("moving block %s to files: %w", name, err)
		}
		moved = append(moved, k)
		bytes += int64(len(v))
	}
	if err := bfs.Sync(ctx, datastore.NewKey("/")); err != nil {
		return fmt.Errorf("moving blocks to files: %w", err)
	}
	for _, k := range moved {
		if err := ds.Delete(ctx, k); err != nil {
			return fmt.Errorf("moving blocks to files: %w", err)
		}
	}
	if err := ds.Sync(ctx, blockstore.BlockPrefix); err != nil {
		return fmt.Errorf("moving blocks to files: %w", err)
	}
	log.Info("moved blocks from the datastore to files", "component", "capsulestore", "blocks", len(moved), "bytes", bytes,
		"elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

// Close stops serving and fetching. It does not close the datastore or the host.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		s.cancel()
		if s.ex != nil {
			s.ex.close()
		}
		s.cache.close()
	})
	return s.closeErr
}

// Info describes an imported file.
type Info struct {
	CID    cid.Cid
	Size   int64  // bytes
	SHA256 string // hex sha256 of the whole file
	Name   string // as given with WithName, or the file name for AddFile
}

// Add imports the file read from r as a UnixFS file DAG with the Kubo
// `unixfs-v1-2025` profile (CIDv1, sha2-256, raw leaves, 1 MiB chunks, 1024
// links per node, balanced layout), streaming: it holds a few chunks in
// memory, never the whole file. It computes the file's sha256 on the way,
// writes the blocks to the local blockstore only (nothing is announced
// beyond the connected bitswap peers, who may then fetch them), and records
// the file in the index, pinned (never evicted).
func (s *Store) Add(ctx context.Context, r io.Reader, opts ...ItemOption) (Info, error) {
	if s.closed.Load() {
		return Info{}, ErrClosed
	}
	ic := itemConfig{}
	for _, o := range opts {
		o(&ic)
	}
	start := time.Now()
	h := sha256.New()
	cr := &countingReader{r: io.TeeReader(&ctxReader{ctx: ctx, r: r}, h)}
	batch := ipld.NewBufferedDAG(ctx, s.dag)
	counted := &countingDAG{DAGService: batch}
	params := helpers.DagBuilderParams{
		Maxlinks:   s.cfg.maxLinks,
		RawLeaves:  profileRawLeaves,
		CidBuilder: profileCidBuilder(),
		Dagserv:    counted,
	}
	db, err := params.New(chunker.NewSizeSplitter(cr, s.cfg.chunkSize))
	if err != nil {
		return Info{}, fmt.Errorf("capsulestore: add %s: %w", ic.name, err)
	}
	root, err := balanced.Layout(db)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			err = cerr
		}
		return Info{}, fmt.Errorf("capsulestore: add %s: importing after %d bytes: %w", ic.name, cr.n, err)
	}
	if err := batch.Commit(); err != nil {
		return Info{}, fmt.Errorf("capsulestore: add %s: writing blocks of %s: %w", ic.name, root.Cid(), err)
	}
	info := Info{CID: root.Cid(), Size: cr.n, SHA256: hex.EncodeToString(h.Sum(nil)), Name: ic.name}
	if err := s.cache.added(ctx, info, counted.bytes.Load()); err != nil {
		return Info{}, fmt.Errorf("capsulestore: add %s: %w", ic.name, err)
	}
	s.log.Info("file added", "cid", info.CID, "name", info.Name, "bytes", info.Size, "sha256", info.SHA256,
		"elapsed", time.Since(start).Round(time.Millisecond))
	return info, nil
}

// AddFile imports the file at path (see Add); its base name is its name
// unless WithName says otherwise.
func (s *Store) AddFile(ctx context.Context, path string, opts ...ItemOption) (Info, error) {
	f, err := os.Open(path)
	if err != nil {
		return Info{}, fmt.Errorf("capsulestore: add %s: %w", path, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Info{}, fmt.Errorf("capsulestore: add %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("capsulestore: add %s: not a regular file", path)
	}
	info, err := s.Add(ctx, f, append([]ItemOption{WithName(filepath.Base(path))}, opts...)...)
	if err != nil {
		return Info{}, err
	}
	if info.Size != fi.Size() {
		return Info{}, fmt.Errorf("capsulestore: add %s: read %d bytes, the file has %d (changed while importing?)", path, info.Size, fi.Size())
	}
	return info, nil
}

// tarballSuffixes are the names AddDir imports.
var tarballSuffixes = []string{".tar.gz", ".tgz", ".tar"}

// AddDir imports every tarball (a regular file named *.tar.gz, *.tgz or
// *.tar) directly in dir, in name order, calling each (if not nil) after
// each import. It goes on after a failed file and returns the files it
// imported with every failure joined.
func (s *Store) AddDir(ctx context.Context, dir string, each func(Info)) ([]Info, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("capsulestore: add %s: %w", dir, err)
	}
	var infos []Info
	var errs []error
	for _, e := range ents {
		if !e.Type().IsRegular() || !slices.ContainsFunc(tarballSuffixes, func(suf string) bool { return strings.HasSuffix(e.Name(), suf) }) {
			continue
		}
		if err := ctx.Err(); err != nil {
			errs = append(errs, fmt.Errorf("capsulestore: add %s: %w", dir, err))
			break
		}
		info, err := s.AddFile(ctx, filepath.Join(dir, e.Name()))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		infos = append(infos, info)
		if each != nil {
			each(info)
		}
	}
	if len(infos) == 0 && len(errs) == 0 {
		return nil, fmt.Errorf("capsulestore: add %s: no tarball (%s) in it", dir, strings.Join(tarballSuffixes, ", "))
	}
	return infos, errors.Join(errs...)
}

// countingDAG counts the bytes of the blocks added through it.
type countingDAG struct {
	ipld.DAGService
	bytes atomic.Int64
}

func (c *countingDAG) Add(ctx context.Context, n ipld.Node) error {
	c.bytes.Add(int64(len(n.RawData())))
	return c.DAGService.Add(ctx, n)
}

func (c *countingDAG) AddMany(ctx context.Context, ns []ipld.Node) error {
	for _, n := range ns {
		c.bytes.Add(int64(len(n.RawData())))
	}
	return c.DAGService.AddMany(ctx, ns)
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Has reports whether every block of the file DAG c is stored locally. It
// never touches the network.
func (s *Store) Has(ctx context.Context, c cid.Cid) (bool, error) {
	if s.closed.Load() {
		return false, ErrClosed
	}
	if !c.Defined() {
		return false, errors.New("capsulestore: has: undefined CID")
	}
	seen := map[cid.Cid]bool{c: true}
	stack := []cid.Cid{c}
	for len(stack) > 0 {
		if err := ctx.Err(); err != nil {
			return false, fmt.Errorf("capsulestore: has %s: %w", c, err)
		}
		k := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if err := checkCodec(k); err != nil {
			return false, fmt.Errorf("capsulestore: has %s: block %s: %w", c, k, err)
		}
		ok, err := s.bstore.Has(ctx, k)
		if err != nil {
			return false, fmt.Errorf("capsulestore: has %s: block %s: %w", c, k, err)
		}
		if !ok {
			return false, nil
		}
		if k.Type() != cid.DagProtobuf {
			continue
		}
		blk, err := s.bstore.Get(ctx, k)
		if err != nil {
			return false, fmt.Errorf("capsulestore: has %s: block %s: %w", c, k, err)
		}
		n, err := decodeBlock(k, blk.RawData())
		if err != nil {
			return false, fmt.Errorf("capsulestore: has %s: block %s: %w", c, k, err)
		}
		for _, l := range n.links {
			if !seen[l] {
				seen[l] = true
				stack = append(stack, l)
			}
		}
	}
	return true, nil
}

// Open returns a reader of the file c, fetching it first (as Fetch does,
// with stall detection and the providers given) when it is not all local.
// The reader reads local blocks only. ctx bounds the reader's whole life.
func (s *Store) Open(ctx context.Context, c cid.Cid, opts ...ItemOption) (io.ReadSeekCloser, error) {
	r, err := s.open(ctx, c, opts...)
	if err != nil {
		return nil, err
	}
	return r, nil
}

func (s *Store) open(ctx context.Context, c cid.Cid, opts ...ItemOption) (uio.DagReader, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if !c.Defined() {
		return nil, errors.New("capsulestore: open: undefined CID")
	}
	if err := checkCodec(c); err != nil {
		return nil, fmt.Errorf("capsulestore: open %s: %w", c, err)
	}
	has, err := s.Has(ctx, c)
	if err != nil {
		return nil, err
	}
	if !has {
		if err := s.Fetch(ctx, c, nil, opts...); err != nil {
			return nil, err
		}
	}
	s.cache.touch(ctx, c)
	nd, err := s.dag.Get(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("capsulestore: open %s: %w", c, err)
	}
	r, err := uio.NewDagReader(ctx, nd, s.dag)
	if err != nil {
		return nil, fmt.Errorf("capsulestore: open %s: %w", c, err)
	}
	return r, nil
}

// WriteTo fetches the file c (as Fetch does, with stall detection, progress
// reports and the providers given) and writes it to path atomically: into a
// temporary file in the same directory, synced, then renamed over path. The
// file gets mode 0644 unless WithMode says otherwise.
//
// Every byte is written once. Raw leaves that arrive from peers are
// verified against their CID and written straight into the file, not into
// the store: the store keeps the inner nodes and records path as holding
// the leaves, and serves them from it (verifying each as it reads it) for
// as long as it is there unchanged; leaves it already held are copied in.
// A fetch that fails keeps the inner nodes only.
func (s *Store) WriteTo(ctx context.Context, c cid.Cid, path string, progress func(Progress), opts ...ItemOption) (err error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return fmt.Errorf("capsulestore: write %s to %s: %w", c, path, err)
	}
	out, err := createPlaced(abs)
	if err != nil {
		return fmt.Errorf("capsulestore: write %s to %s: %w", c, path, err)
	}
	defer func() {
		if err != nil {
			s.refs.dropFile(out)
			out.abandon()
		}
	}()
	size, err := s.fetchTo(ctx, c, progress, out, opts...)
	if err != nil {
		return err
	}
	ic := itemConfig{mode: 0o644}
	for _, o := range opts {
		o(&ic)
	}
	if err = out.finish(size, ic.mode); err != nil {
		return fmt.Errorf("capsulestore: write %s to %s: %w", c, path, err)
	}
	if err = os.Rename(out.name(), abs); err != nil {
		return fmt.Errorf("capsulestore: write %s to %s: %w", c, path, err)
	}
	out.renamed(abs)
	if d, derr := os.Open(filepath.Dir(abs)); derr == nil {
		if serr := d.Sync(); serr != nil {
			s.log.Warn("syncing directory after rename", "dir", filepath.Dir(abs), "err", serr)
		}
		d.Close()
	}
	// The inner nodes the record speaks of are made durable with it.
	if perr := s.cache.placed(ctx, c, abs, size, max(estimateDAGBytes(size)-size, 0)); perr != nil {
		s.log.Warn("recording fetched file", "cid", c, "err", perr)
	}
	return nil
}
