// Package blockfs is a flat-file go-datastore for content blocks: one file
// per key, all in one folder, written to a temporary file and renamed into
// place, so a reader (or a process that restarts after a crash) sees a block
// whole or not at all.
//
// The folder is not sharded. Capsule blocks are 1 MiB, so even a 1 TB cache
// is about a million files, which ext4 and XFS index within one directory;
// sharding (Kubo's flatfs makes 1024 folders) made a fresh store create a
// folder for nearly every block of its first gigabyte, and on ext4 creating
// files spread over many folders costs several times the CPU of creating
// them in one. Open moves the blocks of a store written with the older
// two-character shards into the flat layout.
//
// Keys are a single path component of [A-Za-z0-9_+=-] (what
// boxo's blockstore makes of a multihash with its NoPrefix option: base32
// upper case); any other key is refused with ErrBadKey, so a key can never
// name a file outside the folder. Writes are not synced one by one: Sync
// fsyncs every file and folder written since the previous Sync, which is
// what a caller needs before it records that the blocks are there.
package blockfs

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
)

// ErrBadKey: the key is not a single component of [A-Za-z0-9_+=-].
var ErrBadKey = errors.New("blockfs: key must be one path component of [A-Za-z0-9_+=-]")

const tmpPrefix = ".tmp-"

// Datastore is the flat-file datastore. Its methods are safe for concurrent use.
type Datastore struct {
	dir      string
	noDirect atomic.Bool // O_DIRECT refused here: write through the page cache

	mu       sync.Mutex
	dirty    map[string]struct{} // files written since the last Sync
	dirtyDir bool                // the folder changed since the last Sync
}

var _ datastore.Batching = (*Datastore)(nil)

// testHookBeforeRename, when set (tests only), runs after a block is written
// to its temporary file and before that file is renamed into place.
var testHookBeforeRename func(tmp string)

// Open opens (creating it if needed) the datastore in dir, removes
// temporary files that a crashed writer left behind, and moves the blocks of
// the older sharded layout into dir.
func Open(dir string) (*Datastore, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("blockfs: create %s: %w", dir, err)
	}
	d := &Datastore{dir: dir, dirty: map[string]struct{}{}}
	stale, shards, err := scan(dir)
	if err != nil {
		return nil, fmt.Errorf("blockfs: open %s: %w", dir, err)
	}
	for _, name := range stale {
		if err := os.Remove(filepath.Join(dir, name)); err != nil {
			return nil, fmt.Errorf("blockfs: removing a stale temporary file: %w", err)
		}
	}
	for _, name := range shards {
		if err := d.unshard(name); err != nil {
			return nil, err
		}
	}
	if len(shards) > 0 {
		// The moves are durable before the store is used.
		if err := syncPath(dir); err != nil {
			return nil, fmt.Errorf("blockfs: open %s: %w", dir, err)
		}
	}
	return d, nil
}

// scan lists the temporary files and the shard folders of the older layout
// in dir, reading it in batches: a big cache holds a million blocks, and
// only these few names are kept.
func scan(dir string) (stale, shards []string, err error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	for {
		ents, err := f.ReadDir(4096)
		for _, e := range ents {
			switch {
			case strings.HasPrefix(e.Name(), tmpPrefix):
				stale = append(stale, e.Name())
			case e.IsDir() && len(e.Name()) == 2 && validName(e.Name()):
				shards = append(shards, e.Name())
			}
		}
		if errors.Is(err, io.EOF) {
			return stale, shards, nil
		}
		if err != nil {
			return nil, nil, err
		}
	}
}

// unshard moves the blocks in the shard folder name (the older layout) into
// the datastore's folder and removes the shard. A block already in place is
// kept; temporary files are dropped.
func (d *Datastore) unshard(name string) error {
	shard := filepath.Join(d.dir, name)
	ents, err := os.ReadDir(shard)
	if err != nil {
		return fmt.Errorf("blockfs: open %s: %w", d.dir, err)
	}
	for _, e := range ents {
		from := filepath.Join(shard, e.Name())
		if e.Type().IsRegular() && validName(e.Name()) {
			to := filepath.Join(d.dir, e.Name())
			if _, err := os.Lstat(to); errors.Is(err, fs.ErrNotExist) {
				if err := os.Rename(from, to); err != nil {
					return fmt.Errorf("blockfs: moving %s out of shard %s: %w", e.Name(), name, err)
				}
				continue
			}
		}
		if err := os.RemoveAll(from); err != nil {
			return fmt.Errorf("blockfs: clearing shard %s: %w", name, err)
		}
	}
	if err := os.Remove(shard); err != nil {
		return fmt.Errorf("blockfs: removing shard %s: %w", name, err)
	}
	return nil
}

// validName reports whether name is a key this datastore accepts.
func validName(name string) bool {
	if name == "" || len(name) > 200 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_', c == '+', c == '=', c == '-':
		default:
			return false
		}
	}
	return true
}

// path returns the file of key, or ErrBadKey. It looks at the raw key
// string, not a cleaned one, so "/a/../b" is refused.
func (d *Datastore) path(key datastore.Key) (string, error) {
	name, ok := strings.CutPrefix(key.String(), "/")
	if !ok || !validName(name) {
		return "", fmt.Errorf("%w: %q", ErrBadKey, key.String())
	}
	return filepath.Join(d.dir, name), nil
}

// Put writes value under key: into a temporary file, then renamed over the
// key's file.
func (d *Datastore) Put(ctx context.Context, key datastore.Key, value []byte) error {
	file, err := d.path(key)
	if err != nil {
		return err
	}
	tmp, err := d.writeTemp(value)
	if err == nil && testHookBeforeRename != nil {
		testHookBeforeRename(tmp)
	}
	if err == nil {
		err = os.Rename(tmp, file)
	}
	if err != nil {
		if tmp != "" {
			os.Remove(tmp)
		}
		return fmt.Errorf("blockfs: put %s: %w", key, err)
	}
	d.mu.Lock()
	d.dirty[file] = struct{}{}
	d.dirtyDir = true
	d.mu.Unlock()
	return nil
}

// Blocks whose size is a multiple of directAlign, from directMin up (the
// 1 MiB leaves of a capsule), are written with O_DIRECT on Linux: they are
// written once and read rarely, and copying them into fresh page-cache
// pages costs more CPU than the rest of a fetch's write path. A filesystem
// that refuses O_DIRECT (tmpfs) turns it off for the datastore.
const (
	directAlign = 4096
	directMin   = 64 << 10
)

// alignedBufs holds directAlign-aligned buffers to copy blocks into when
// their own memory is not aligned.
var alignedBufs sync.Pool

func alignedCopy(value []byte) (buf []byte, release func()) {
	if uintptr(unsafe.Pointer(unsafe.SliceData(value)))%directAlign == 0 {
		return value, func() {}
	}
	p, _ := alignedBufs.Get().(*[]byte)
	if p == nil || cap(*p) < len(value) {
		raw := make([]byte, len(value)+directAlign)
		off := int((directAlign - uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%directAlign) % directAlign)
		b := raw[off : off+len(value) : off+len(value)]
		p = &b
	}
	b := (*p)[:len(value)]
	copy(b, value)
	return b, func() { alignedBufs.Put(p) }
}

// writeTemp writes value to a new temporary file and returns its name (also
// on error, when the file exists).
func (d *Datastore) writeTemp(value []byte) (string, error) {
	direct := oDirect != 0 && !d.noDirect.Load() && len(value) >= directMin && len(value)%directAlign == 0
	flags := os.O_WRONLY | os.O_CREATE | os.O_EXCL
	for {
		name := filepath.Join(d.dir, fmt.Sprintf("%s%016x", tmpPrefix, rand.Uint64()))
		fl := flags
		if direct {
			fl |= oDirect
		}
		f, err := os.OpenFile(name, fl, 0o644)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		if direct && errors.Is(err, syscall.EINVAL) {
			d.noDirect.Store(true)
			direct = false
			continue
		}
		if err != nil {
			return "", err
		}
		buf, release := value, func() {}
		if direct {
			buf, release = alignedCopy(value)
		}
		_, err = f.Write(buf)
		release()
		if direct && errors.Is(err, syscall.EINVAL) {
			// The filesystem took the flag but not the write.
			f.Close()
			os.Remove(name)
			d.noDirect.Store(true)
			direct = false
			continue
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return name, err
	}
}

// Get returns the value of key, or datastore.ErrNotFound.
func (d *Datastore) Get(ctx context.Context, key datastore.Key) ([]byte, error) {
	file, err := d.path(key)
	if err != nil {
		return nil, err
	}
	b, err := d.readFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, datastore.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("blockfs: get %s: %w", key, err)
	}
	return b, nil
}

// readFile reads a block file; large aligned ones with O_DIRECT (see
// directAlign), into a fresh aligned buffer.
func (d *Datastore) readFile(file string) ([]byte, error) {
	if oDirect == 0 || d.noDirect.Load() {
		return os.ReadFile(file)
	}
	f, err := os.OpenFile(file, os.O_RDONLY|oDirect, 0)
	if errors.Is(err, syscall.EINVAL) {
		d.noDirect.Store(true)
		return os.ReadFile(file)
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	n := fi.Size()
	if n < directMin || n%directAlign != 0 {
		f.Close()
		return os.ReadFile(file)
	}
	buf := make([]byte, n)
	if uintptr(unsafe.Pointer(unsafe.SliceData(buf)))%directAlign != 0 {
		raw := make([]byte, n+directAlign)
		off := int((directAlign - uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%directAlign) % directAlign)
		buf = raw[off : off+int(n) : off+int(n)]
	}
	if _, err := io.ReadFull(f, buf); err != nil {
		if errors.Is(err, syscall.EINVAL) {
			d.noDirect.Store(true)
			f.Close()
			return os.ReadFile(file)
		}
		return nil, err
	}
	return buf, nil
}

// Has reports whether key is stored.
func (d *Datastore) Has(ctx context.Context, key datastore.Key) (bool, error) {
	_, err := d.GetSize(ctx, key)
	if errors.Is(err, datastore.ErrNotFound) {
		return false, nil
	}
	return err == nil, err
}

// GetSize returns the size of key's value, or datastore.ErrNotFound.
func (d *Datastore) GetSize(ctx context.Context, key datastore.Key) (int, error) {
	file, err := d.path(key)
	if err != nil {
		return -1, err
	}
	fi, err := os.Stat(file)
	if errors.Is(err, fs.ErrNotExist) {
		return -1, datastore.ErrNotFound
	}
	if err != nil {
		return -1, fmt.Errorf("blockfs: stat %s: %w", key, err)
	}
	return int(fi.Size()), nil
}

// Delete removes key; deleting a missing key is not an error.
func (d *Datastore) Delete(ctx context.Context, key datastore.Key) error {
	file, err := d.path(key)
	if err != nil {
		return err
	}
	if err := os.Remove(file); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("blockfs: delete %s: %w", key, err)
	}
	d.mu.Lock()
	delete(d.dirty, file)
	d.dirtyDir = true
	d.mu.Unlock()
	return nil
}

// Query lists the stored keys (and values, unless KeysOnly), reading each
// value as the iteration reaches it; prefixes, filters, orders, offset and
// limit are applied naively.
func (d *Datastore) Query(ctx context.Context, q query.Query) (query.Results, error) {
	ents, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("blockfs: query: %w", err)
	}
	var names []string
	for _, e := range ents {
		if e.Type().IsRegular() && validName(e.Name()) {
			names = append(names, e.Name())
		}
	}
	i := 0
	it := query.Iterator{Next: func() (query.Result, bool) {
		for i < len(names) {
			if err := ctx.Err(); err != nil {
				i = len(names)
				return query.Result{Error: err}, true
			}
			name := names[i]
			i++
			key := "/" + name
			file := filepath.Join(d.dir, name)
			e := query.Entry{Key: key}
			if q.KeysOnly {
				if q.ReturnsSizes {
					fi, err := os.Stat(file)
					if errors.Is(err, fs.ErrNotExist) {
						continue // deleted meanwhile
					}
					if err != nil {
						return query.Result{Error: err}, true
					}
					e.Size = int(fi.Size())
				}
			} else {
				b, err := d.readFile(file)
				if errors.Is(err, fs.ErrNotExist) {
					continue
				}
				if err != nil {
					return query.Result{Error: err}, true
				}
				e.Value, e.Size = b, len(b)
			}
			return query.Result{Entry: e}, true
		}
		return query.Result{}, false
	}}
	// NaiveQueryApply applies the prefix, filters, orders, offset and limit.
	return query.NaiveQueryApply(q, query.ResultsFromIterator(q, it)), nil
}

// Sync makes every Put and Delete that returned before it durable: it
// fsyncs the files and folders written since the previous Sync (whatever
// the prefix).
func (d *Datastore) Sync(ctx context.Context, prefix datastore.Key) error {
	d.mu.Lock()
	files, dirty := d.dirty, d.dirtyDir
	d.dirty, d.dirtyDir = map[string]struct{}{}, false
	d.mu.Unlock()
	fail := func(err error) error {
		// Put back what was not synced, so a later Sync tries again.
		d.mu.Lock()
		for f := range files {
			d.dirty[f] = struct{}{}
		}
		d.dirtyDir = d.dirtyDir || dirty
		d.mu.Unlock()
		return fmt.Errorf("blockfs: sync: %w", err)
	}
	work := make(chan string)
	errs := make(chan error, 4)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			var first error
			for f := range work {
				if err := syncPath(f); err != nil && first == nil && !errors.Is(err, fs.ErrNotExist) {
					first = err
				}
			}
			errs <- first
		})
	}
	for f := range files {
		work <- f
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			return fail(err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fail(err)
	}
	if dirty {
		if err := syncPath(d.dir); err != nil {
			return fail(err)
		}
	}
	return nil
}

func syncPath(p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Close does nothing: the datastore holds no open files.
func (d *Datastore) Close() error { return nil }

// Batch returns a batch that applies its writes, in order, on Commit.
func (d *Datastore) Batch(ctx context.Context) (datastore.Batch, error) {
	return &batch{d: d}, nil
}

type batchOp struct {
	key    datastore.Key
	value  []byte
	delete bool
}

type batch struct {
	d   *Datastore
	ops []batchOp
}

func (b *batch) Put(ctx context.Context, key datastore.Key, value []byte) error {
	if _, err := b.d.path(key); err != nil {
		return err
	}
	b.ops = append(b.ops, batchOp{key: key, value: value})
	return nil
}

func (b *batch) Delete(ctx context.Context, key datastore.Key) error {
	if _, err := b.d.path(key); err != nil {
		return err
	}
	b.ops = append(b.ops, batchOp{key: key, delete: true})
	return nil
}

func (b *batch) Commit(ctx context.Context) error {
	ops := b.ops
	b.ops = nil
	for _, op := range ops {
		if err := ctx.Err(); err != nil {
			return err
		}
		var err error
		if op.delete {
			err = b.d.Delete(ctx, op.key)
		} else {
			err = b.d.Put(ctx, op.key, op.value)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
