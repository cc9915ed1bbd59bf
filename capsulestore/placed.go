package capsulestore

// Placed files: WriteTo writes a fetched file's raw leaves once, into the
// file it was asked for, and the store serves those leaves from there (as
// Kubo's filestore does with `--nocopy`), instead of writing every leaf as a
// block file and then copying the whole file out of the store. See
// docs/capsulestore.md ("Fetch to a file").

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/ipfs/boxo/blockstore"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	ipld "github.com/ipfs/go-ipld-format"
)

// Leaves whose size and offset are multiples of placedAlign, from
// placedDirectMin up (a capsule's 1 MiB leaves), are written with O_DIRECT
// on Linux: the bytes go to the disk while the fetch runs, so the final
// fsync has little left to do, and they are not copied into page-cache
// pages (the kernel's dirty-page throttling made buffered writes of a
// gigabyte take seconds on a busy machine). A filesystem that refuses
// O_DIRECT (tmpfs) gets buffered writes.
const (
	placedAlign     = 4096
	placedDirectMin = 64 << 10
	// writebackEvery: buffered writes are handed to the disk (sync_file_range)
	// every this many bytes, so the final fsync does not find a gigabyte dirty.
	writebackEvery = 32 << 20
)

// placedFile is a file being written by WriteTo (under a temporary name,
// then renamed) whose raw leaves the store serves while it exists.
type placedFile struct {
	f        *os.File // read-write, buffered
	direct   *os.File // write-only with O_DIRECT; nil when refused
	noDirect atomic.Bool

	mu       sync.Mutex
	path     string
	dirtyOff int64 // buffered bytes written since the last writeback
	bufs     [][]byte
}

// createPlaced creates a temporary file beside path.
func createPlaced(path string) (*placedFile, error) {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return nil, err
	}
	p := &placedFile{f: f, path: f.Name()}
	if oDirectFlag != 0 {
		d, err := os.OpenFile(f.Name(), os.O_WRONLY|oDirectFlag, 0)
		if err == nil {
			p.direct = d
		} else {
			p.noDirect.Store(true)
		}
	} else {
		p.noDirect.Store(true)
	}
	return p, nil
}

// name is the file's current path.
func (p *placedFile) name() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.path
}

func (p *placedFile) renamed(path string) {
	p.mu.Lock()
	p.path = path
	p.mu.Unlock()
}

// writeAt writes b at off. It is safe for concurrent use (pwrite).
func (p *placedFile) writeAt(b []byte, off int64) error {
	if !p.noDirect.Load() && len(b) >= placedDirectMin && len(b)%placedAlign == 0 && off%placedAlign == 0 {
		buf := p.alignedBuf(len(b))
		copy(buf, b)
		_, err := p.direct.WriteAt(buf, off)
		p.putBuf(buf)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EINVAL) {
			return err
		}
		p.noDirect.Store(true) // the filesystem took the flag but not the write
	}
	if _, err := p.f.WriteAt(b, off); err != nil {
		return err
	}
	p.mu.Lock()
	p.dirtyOff += int64(len(b))
	kick := p.dirtyOff >= writebackEvery
	if kick {
		p.dirtyOff = 0
	}
	p.mu.Unlock()
	if kick {
		startWriteback(p.f)
	}
	return nil
}

func (p *placedFile) alignedBuf(n int) []byte {
	p.mu.Lock()
	for i, b := range p.bufs {
		if cap(b) >= n {
			p.bufs = append(p.bufs[:i], p.bufs[i+1:]...)
			p.mu.Unlock()
			return b[:n]
		}
	}
	p.mu.Unlock()
	raw := make([]byte, n+placedAlign)
	off := int((placedAlign - uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%placedAlign) % placedAlign)
	return raw[off : off+n : off+n]
}

func (p *placedFile) putBuf(b []byte) {
	p.mu.Lock()
	if len(p.bufs) < 4 {
		p.bufs = append(p.bufs, b)
	}
	p.mu.Unlock()
}

// finish truncates the file to size, sets its mode, makes it durable and
// closes it.
func (p *placedFile) finish(size int64, mode os.FileMode) error {
	if p.direct != nil {
		if err := p.direct.Close(); err != nil {
			return err
		}
		p.direct = nil
	}
	if err := p.f.Truncate(size); err != nil {
		return err
	}
	if err := p.f.Chmod(mode); err != nil {
		return err
	}
	if err := p.f.Sync(); err != nil {
		return err
	}
	return p.f.Close()
}

// abandon closes and removes the file.
func (p *placedFile) abandon() {
	if p.direct != nil {
		p.direct.Close()
	}
	p.f.Close()
	os.Remove(p.name())
}

// placedRef is where a placed leaf is.
type placedRef struct {
	file *placedFile
	off  int64
	size int
}

// refStore is the Store's blockstore: the block files (or badger) and the
// leaves of placed files. Leaves of a placed file are read from it and
// verified against their CID on every read (the file is the user's, who
// may change or remove it): one that no longer matches is not found, so
// Verify lists it as missing and Repair fetches it into the store.
type refStore struct {
	blockstore.Blockstore

	mu   sync.RWMutex
	refs map[string]placedRef // by multihash, as the blockstore keys blocks
}

func newRefStore(inner blockstore.Blockstore) *refStore {
	return &refStore{Blockstore: inner, refs: map[string]placedRef{}}
}

func (r *refStore) ref(c cid.Cid) (placedRef, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	ref, ok := r.refs[string(c.Hash())]
	return ref, ok
}

// place records that c's bytes are at off in file.
func (r *refStore) place(c cid.Cid, file *placedFile, off int64, size int) {
	r.mu.Lock()
	r.refs[string(c.Hash())] = placedRef{file: file, off: off, size: size}
	r.mu.Unlock()
}

// dropFile forgets every leaf placed in file.
func (r *refStore) dropFile(file *placedFile) {
	r.mu.Lock()
	for k, ref := range r.refs {
		if ref.file == file {
			delete(r.refs, k)
		}
	}
	r.mu.Unlock()
}

// readRef reads and verifies a placed leaf. One whose file is gone or
// whose bytes changed is forgotten (so that Has says it is missing and a
// fetch gets it again, into the store) and is ipld's not-found.
func (r *refStore) readRef(c cid.Cid, ref placedRef) ([]byte, error) {
	gone := func() ([]byte, error) {
		r.mu.Lock()
		if cur, ok := r.refs[string(c.Hash())]; ok && cur == ref {
			delete(r.refs, string(c.Hash()))
		}
		r.mu.Unlock()
		return nil, ipld.ErrNotFound{Cid: c}
	}
	f, err := os.Open(ref.file.name())
	if err != nil {
		return gone()
	}
	defer f.Close()
	b := make([]byte, ref.size)
	if _, err := f.ReadAt(b, ref.off); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return gone()
		}
		return nil, fmt.Errorf("reading block %s from %s: %w", c, ref.file.name(), err)
	}
	got, err := c.Prefix().Sum(b)
	if err != nil || !got.Equals(c) {
		return gone()
	}
	return b, nil
}

func (r *refStore) Get(ctx context.Context, c cid.Cid) (blocks.Block, error) {
	blk, err := r.Blockstore.Get(ctx, c)
	if err == nil || !ipld.IsNotFound(err) {
		return blk, err
	}
	ref, ok := r.ref(c)
	if !ok {
		return nil, err
	}
	b, rerr := r.readRef(c, ref)
	if rerr != nil {
		return nil, rerr
	}
	return blocks.NewBlockWithCid(b, c)
}

// Has reports a placed leaf as held while its file is there and long
// enough; its bytes are checked when read.
func (r *refStore) Has(ctx context.Context, c cid.Cid) (bool, error) {
	ok, err := r.Blockstore.Has(ctx, c)
	if ok || err != nil {
		return ok, err
	}
	ref, placed := r.ref(c)
	if !placed {
		return false, nil
	}
	fi, serr := os.Stat(ref.file.name())
	return serr == nil && fi.Mode().IsRegular() && fi.Size() >= ref.off+int64(ref.size), nil
}

func (r *refStore) GetSize(ctx context.Context, c cid.Cid) (int, error) {
	n, err := r.Blockstore.GetSize(ctx, c)
	if err == nil || !ipld.IsNotFound(err) {
		return n, err
	}
	if ok, _ := r.Has(ctx, c); ok {
		ref, _ := r.ref(c)
		return ref.size, nil
	}
	return n, err
}

// DeleteBlock deletes the block from the store and forgets where it was
// placed; a placed file itself is never touched.
func (r *refStore) DeleteBlock(ctx context.Context, c cid.Cid) error {
	r.mu.Lock()
	delete(r.refs, string(c.Hash()))
	r.mu.Unlock()
	return r.Blockstore.DeleteBlock(ctx, c)
}

func (r *refStore) AllKeysChan(ctx context.Context) (<-chan cid.Cid, error) {
	inner, err := r.Blockstore.AllKeysChan(ctx)
	if err != nil {
		return nil, err
	}
	r.mu.RLock()
	var placed []cid.Cid
	for k := range r.refs {
		placed = append(placed, cid.NewCidV1(cid.Raw, []byte(k)))
	}
	r.mu.RUnlock()
	out := make(chan cid.Cid)
	go func() {
		defer close(out)
		for c := range inner {
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
		for _, c := range placed {
			select {
			case out <- c:
			case <-ctx.Done():
				return
			}
		}
	}()
	return out, nil
}

// loadPlaced registers the leaves of c, recorded as placed in path, after a
// restart: the inner nodes are in the store and give every leaf's offset.
func (s *Store) loadPlaced(ctx context.Context, c cid.Cid, path string) error {
	fi, err := os.Stat(path)
	if err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("placed file %s: %w", path, errors.Join(err, errors.New("not a regular file")))
	}
	file := &placedFile{path: path}
	type item struct {
		c   cid.Cid
		off int64
		n   int64 // file bytes under it (from its parent; -1 for the root)
	}
	stack := []item{{c, 0, -1}}
	for len(stack) > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		it := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if it.c.Type() == cid.Raw {
			if it.n >= 0 {
				s.refs.place(it.c, file, it.off, int(it.n))
			}
			continue
		}
		blk, err := s.refs.Blockstore.Get(ctx, it.c)
		if err != nil {
			return fmt.Errorf("block %s: %w", it.c, err)
		}
		n, err := decodeBlock(it.c, blk.RawData())
		if err != nil {
			return fmt.Errorf("block %s: %w", it.c, err)
		}
		off := it.off + int64(n.dataLen)
		for i, l := range n.links {
			stack = append(stack, item{l, off, int64(n.linkSizes[i])})
			off += int64(n.linkSizes[i])
		}
	}
	return nil
}
