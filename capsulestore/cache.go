package capsulestore

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
)

var (
	// ErrQuota: a file does not fit under the store's quota even after
	// evicting every file that is neither pinned nor in use.
	ErrQuota = errors.New("store quota exceeded")
	// ErrInUse: the file is in use (Acquire) and cannot be removed.
	ErrInUse = errors.New("file in use")
	// ErrNotFound: the CID is not in the store's index.
	ErrNotFound = errors.New("not in the store's index")
)

// Entry describes a file in the store's index.
type Entry struct {
	CID      cid.Cid
	Name     string
	Size     int64  // file bytes; 0 until the root block is known
	SHA256   string // hex sha256 of the file; "" until computed (Add, Verify)
	Bytes    int64  // store bytes counted against the quota (the estimate, while fetching)
	Complete bool   // every block was local when it was last recorded
	Pinned   bool   // never evicted: imported with Add, or pinned with Pin
	InUse    int    // Acquire holds (and running fetches) not yet released
	Added    time.Time
	LastUsed time.Time
}

// record is an index entry as stored, JSON under /index/<cid>.
type record struct {
	Name     string    `json:"name,omitempty"`
	Size     int64     `json:"size"`
	SHA256   string    `json:"sha256,omitempty"`
	Bytes    int64     `json:"bytes"`
	Complete bool      `json:"complete"`
	Pinned   bool      `json:"pinned,omitempty"`
	Added    time.Time `json:"added"`
	LastUsed time.Time `json:"last_used"`
	// Placed: the file WriteTo wrote, which holds the raw leaves (the
	// store holds the inner nodes); "" when the store holds every block.
	Placed string `json:"placed,omitempty"`
}

// cache is the store's index: what files it holds, their use, the quota and
// eviction. Its records survive restarts; in-use counts do not (a process
// that restarts has no running attempts).
type cache struct {
	s     *Store
	ds    datastore.Batching
	quota int64

	mu    sync.Mutex
	recs  map[cid.Cid]*record
	inUse map[cid.Cid]int

	gcMu      sync.Mutex
	gcRunning bool
	gcWG      sync.WaitGroup
	gcCtx     context.Context
	gcCancel  context.CancelFunc
}

var indexPrefix = datastore.NewKey("/index")

func indexKey(c cid.Cid) datastore.Key { return indexPrefix.ChildString(c.String()) }

func openCache(ctx context.Context, s *Store, ds datastore.Batching) (*cache, error) {
	gctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ca := &cache{
		s: s, ds: ds, quota: s.cfg.quota,
		recs: make(map[cid.Cid]*record), inUse: make(map[cid.Cid]int),
		gcCtx: gctx, gcCancel: cancel,
	}
	res, err := ds.Query(ctx, query.Query{Prefix: indexPrefix.String()})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("reading the index: %w", err)
	}
	defer res.Close()
	for r := range res.Next() {
		if r.Error != nil {
			cancel()
			return nil, fmt.Errorf("reading the index: %w", r.Error)
		}
		name := strings.TrimPrefix(r.Key, indexPrefix.String()+"/")
		c, err := cid.Decode(name)
		if err != nil {
			s.log.Warn("skipping index entry with a bad key", "key", r.Key, "err", err)
			continue
		}
		var rec record
		if err := json.Unmarshal(r.Value, &rec); err != nil {
			s.log.Warn("skipping unreadable index entry", "cid", c, "err", err)
			continue
		}
		ca.recs[c] = &rec
	}
	return ca, nil
}

func (ca *cache) close() {
	ca.gcCancel()
	ca.gcWG.Wait()
}

// put writes rec; sync makes it durable at once.
func (ca *cache) put(ctx context.Context, c cid.Cid, rec *record, sync bool) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	k := indexKey(c)
	if err := ca.ds.Put(ctx, k, b); err != nil {
		return fmt.Errorf("index entry %s: %w", c, err)
	}
	if sync {
		// The blocks the entry speaks of must be durable before it is.
		if ca.s.blocks != nil {
			if err := ca.s.blocks.Sync(ctx, datastore.NewKey("/")); err != nil {
				return fmt.Errorf("index entry %s: syncing blocks: %w", c, err)
			}
		}
		if err := ca.ds.Sync(ctx, k); err != nil {
			return fmt.Errorf("index entry %s: %w", c, err)
		}
	}
	return nil
}

func (ca *cache) recordLocked(c cid.Cid, name string, now time.Time) *record {
	rec := ca.recs[c]
	if rec == nil {
		rec = &record{Added: now}
		ca.recs[c] = rec
	}
	if name != "" {
		rec.Name = name
	}
	rec.LastUsed = now
	return rec
}

// begin records c (creating its entry) and marks it in use until the
// returned release is called.
func (ca *cache) begin(ctx context.Context, c cid.Cid, name string) (func(), error) {
	ca.mu.Lock()
	rec := ca.recordLocked(c, name, time.Now())
	ca.inUse[c]++
	err := ca.put(ctx, c, rec, false)
	ca.mu.Unlock()
	if err != nil {
		ca.unuse(c)
		return nil, err
	}
	var once sync.Once
	return func() { once.Do(func() { ca.unuse(c) }) }, nil
}

func (ca *cache) unuse(c cid.Cid) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.inUse[c]--; ca.inUse[c] <= 0 {
		delete(ca.inUse, c)
	}
	if rec := ca.recs[c]; rec != nil {
		rec.LastUsed = time.Now()
		if err := ca.put(context.Background(), c, rec, false); err != nil {
			ca.s.log.Warn("recording last use", "cid", c, "err", err)
		}
	}
}

// touch records a use of c (Open, a completed Fetch of a held file).
func (ca *cache) touch(ctx context.Context, c cid.Cid) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	rec := ca.recs[c]
	if rec == nil {
		return
	}
	now := time.Now()
	if now.Sub(rec.LastUsed) < time.Second {
		return
	}
	rec.LastUsed = now
	if err := ca.put(ctx, c, rec, false); err != nil {
		ca.s.log.Warn("recording last use", "cid", c, "err", err)
	}
}

// reserve counts bytes against the quota for c (being fetched) and evicts
// to make room.
func (ca *cache) reserve(ctx context.Context, c cid.Cid, bytes int64) error {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	rec := ca.recordLocked(c, "", time.Now())
	if !rec.Complete {
		rec.Bytes = bytes
	}
	if err := ca.put(ctx, c, rec, false); err != nil {
		return err
	}
	return ca.makeRoomLocked(ctx, c)
}

// complete records that every block of c is local.
func (ca *cache) complete(ctx context.Context, c cid.Cid, size, bytes int64) error {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	rec := ca.recordLocked(c, "", time.Now())
	if rec.Complete && rec.Size == size && rec.Bytes == bytes {
		return ca.put(ctx, c, rec, false)
	}
	rec.Size, rec.Bytes, rec.Complete = size, bytes, true
	return ca.put(ctx, c, rec, true)
}

// placed records that c's raw leaves are in the file at path (WriteTo).
func (ca *cache) placed(ctx context.Context, c cid.Cid, path string, size, bytes int64) error {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	rec := ca.recordLocked(c, "", time.Now())
	rec.Size, rec.Bytes, rec.Complete, rec.Placed = size, bytes, true, path
	return ca.put(ctx, c, rec, true)
}

// placedFiles lists the files recorded as holding leaves.
func (ca *cache) placedFiles() map[cid.Cid]string {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	out := map[cid.Cid]string{}
	for c, r := range ca.recs {
		if r.Placed != "" {
			out[c] = r.Placed
		}
	}
	return out
}

// added records an imported file, pinned, and evicts others to get under
// the quota if it can.
func (ca *cache) added(ctx context.Context, info Info, bytes int64) error {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	rec := ca.recordLocked(info.CID, info.Name, time.Now())
	rec.Size, rec.SHA256, rec.Bytes, rec.Complete, rec.Pinned = info.Size, info.SHA256, bytes, true, true
	if err := ca.put(ctx, info.CID, rec, true); err != nil {
		return err
	}
	if err := ca.makeRoomLocked(ctx, info.CID); err != nil {
		ca.s.log.Warn("store over quota after an import (imported files are pinned)", "cid", info.CID, "err", err)
	}
	return nil
}

// verified records a file's sha256 and size after Verify.
func (ca *cache) verified(ctx context.Context, c cid.Cid, size int64, sha string) error {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	rec := ca.recs[c]
	if rec == nil {
		return nil
	}
	if rec.SHA256 != "" && rec.SHA256 != sha {
		return fmt.Errorf("sha256 %s, the index recorded %s", sha, rec.SHA256)
	}
	rec.SHA256, rec.Size, rec.Complete = sha, size, true
	return ca.put(ctx, c, rec, true)
}

func (ca *cache) usedLocked() int64 {
	var used int64
	for _, r := range ca.recs {
		used += r.Bytes
	}
	return used
}

// makeRoomLocked evicts least recently used files that are neither pinned,
// in use nor keep, until the store is under its quota.
func (ca *cache) makeRoomLocked(ctx context.Context, keep cid.Cid) error {
	if ca.quota <= 0 {
		return nil
	}
	used := ca.usedLocked()
	if used <= ca.quota {
		return nil
	}
	type cand struct {
		c   cid.Cid
		rec *record
	}
	var cands []cand
	for c, r := range ca.recs {
		if c != keep && !r.Pinned && ca.inUse[c] == 0 {
			cands = append(cands, cand{c, r})
		}
	}
	slices.SortFunc(cands, func(a, b cand) int { return a.rec.LastUsed.Compare(b.rec.LastUsed) })
	for _, v := range cands {
		if used <= ca.quota {
			break
		}
		ca.s.log.Info("evicting", "cid", v.c, "name", v.rec.Name, "bytes", v.rec.Bytes,
			"last_used", v.rec.LastUsed.Format(time.RFC3339), "used", used, "quota", ca.quota)
		if err := ca.removeLocked(ctx, v.c); err != nil {
			return fmt.Errorf("evicting %s: %w", v.c, err)
		}
		used -= v.rec.Bytes
	}
	if used > ca.quota {
		return fmt.Errorf("%w: %d bytes needed, quota %d, the rest is pinned or in use", ErrQuota, used, ca.quota)
	}
	return nil
}

// removeLocked deletes c's blocks that no other indexed file references,
// and its index entry.
func (ca *cache) removeLocked(ctx context.Context, c cid.Cid) error {
	victim, err := ca.s.localBlocks(ctx, c)
	if err != nil {
		return err
	}
	for other := range ca.recs {
		if other == c || len(victim) == 0 {
			continue
		}
		keep, err := ca.s.localBlocks(ctx, other)
		if err != nil {
			return err
		}
		for k := range keep {
			delete(victim, k)
		}
	}
	for k := range victim {
		if err := ca.s.bstore.DeleteBlock(ctx, k); err != nil {
			return fmt.Errorf("deleting block %s: %w", k, err)
		}
	}
	if err := ca.ds.Delete(ctx, indexKey(c)); err != nil {
		return fmt.Errorf("index entry %s: %w", c, err)
	}
	if err := ca.ds.Sync(ctx, indexPrefix); err != nil {
		return fmt.Errorf("index entry %s: %w", c, err)
	}
	delete(ca.recs, c)
	ca.collectGarbage()
	return nil
}

// collectGarbage asks the datastore to reclaim the space of deleted blocks
// (badger's value-log GC), in the background, one run at a time.
func (ca *cache) collectGarbage() {
	gc, ok := ca.ds.(datastore.GCFeature)
	if !ok {
		return
	}
	ca.gcMu.Lock()
	defer ca.gcMu.Unlock()
	if ca.gcRunning || ca.gcCtx.Err() != nil {
		return
	}
	ca.gcRunning = true
	ca.gcWG.Go(func() {
		defer func() {
			ca.gcMu.Lock()
			ca.gcRunning = false
			ca.gcMu.Unlock()
		}()
		if err := gc.CollectGarbage(ca.gcCtx); err != nil && ca.gcCtx.Err() == nil {
			ca.s.log.Debug("datastore garbage collection", "err", err)
		}
	})
}

// localBlocks returns the CIDs of every block of the DAG c that can be
// found locally: c, and the links of every local dag-pb block under it. Raw
// leaves are listed without being read.
func (s *Store) localBlocks(ctx context.Context, c cid.Cid) (map[cid.Cid]struct{}, error) {
	out := map[cid.Cid]struct{}{}
	stack := []cid.Cid{c}
	for len(stack) > 0 {
		k := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if _, seen := out[k]; seen {
			continue
		}
		out[k] = struct{}{}
		if k.Type() != cid.DagProtobuf {
			continue
		}
		blk, err := s.bstore.Get(ctx, k)
		if err != nil {
			if isNotFound(err) {
				continue
			}
			return nil, fmt.Errorf("block %s: %w", k, err)
		}
		n, err := decodeBlock(k, blk.RawData())
		if err != nil {
			continue // corrupt: its links are unknown (Verify repairs it)
		}
		stack = append(stack, n.links...)
	}
	return out, nil
}

// List returns the index: every file imported or fetched (partly fetched
// ones included), by name then CID.
func (s *Store) List(ctx context.Context) ([]Entry, error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	ca := s.cache
	ca.mu.Lock()
	defer ca.mu.Unlock()
	out := make([]Entry, 0, len(ca.recs))
	for c, r := range ca.recs {
		out = append(out, ca.entryLocked(c, r))
	}
	slices.SortFunc(out, func(a, b Entry) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.CID.KeyString(), b.CID.KeyString()))
	})
	return out, nil
}

func (ca *cache) entryLocked(c cid.Cid, r *record) Entry {
	return Entry{
		CID: c, Name: r.Name, Size: r.Size, SHA256: r.SHA256, Bytes: r.Bytes, Complete: r.Complete,
		Pinned: r.Pinned, InUse: ca.inUse[c], Added: r.Added, LastUsed: r.LastUsed,
	}
}

// Stat returns the index entry of c, or an error wrapping ErrNotFound.
func (s *Store) Stat(ctx context.Context, c cid.Cid) (Entry, error) {
	ca := s.cache
	ca.mu.Lock()
	defer ca.mu.Unlock()
	r := ca.recs[c]
	if r == nil {
		return Entry{}, fmt.Errorf("capsulestore: %s: %w", c, ErrNotFound)
	}
	return ca.entryLocked(c, r), nil
}

// Acquire marks c in use until release is called: it is never evicted
// meanwhile. Call it before fetching a capsule for an attempt and release it
// when the attempt ends. c need not be held yet (the index records it);
// release may be called more than once.
func (s *Store) Acquire(ctx context.Context, c cid.Cid) (release func(), err error) {
	if s.closed.Load() {
		return nil, ErrClosed
	}
	if !c.Defined() {
		return nil, errors.New("capsulestore: acquire: undefined CID")
	}
	release, err = s.cache.begin(ctx, c, "")
	if err != nil {
		return nil, fmt.Errorf("capsulestore: acquire %s: %w", c, err)
	}
	return release, nil
}

// Pin sets whether c is pinned: a pinned file is never evicted. Files
// imported with Add are pinned; fetched ones are not.
func (s *Store) Pin(ctx context.Context, c cid.Cid, pinned bool) error {
	ca := s.cache
	ca.mu.Lock()
	defer ca.mu.Unlock()
	r := ca.recs[c]
	if r == nil {
		return fmt.Errorf("capsulestore: pin %s: %w", c, ErrNotFound)
	}
	r.Pinned = pinned
	if err := ca.put(ctx, c, r, true); err != nil {
		return fmt.Errorf("capsulestore: pin %s: %w", c, err)
	}
	if !pinned {
		if err := ca.makeRoomLocked(ctx, cid.Undef); err != nil {
			s.log.Warn("store over quota", "err", err)
		}
	}
	return nil
}

// Remove deletes c from the store: its blocks that no other indexed file
// references, and its index entry. It fails with ErrInUse while c is
// acquired or being fetched; a pinned file is removed too.
func (s *Store) Remove(ctx context.Context, c cid.Cid) error {
	if s.closed.Load() {
		return ErrClosed
	}
	ca := s.cache
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if ca.recs[c] == nil {
		return fmt.Errorf("capsulestore: remove %s: %w", c, ErrNotFound)
	}
	if ca.inUse[c] > 0 {
		return fmt.Errorf("capsulestore: remove %s: %w", c, ErrInUse)
	}
	if err := ca.removeLocked(ctx, c); err != nil {
		return fmt.Errorf("capsulestore: remove %s: %w", c, err)
	}
	return nil
}

// Usage returns the bytes the index counts (reservations of running fetches
// included) and the quota (0: none). The datastore's files may be larger
// until its garbage collection reclaims deleted blocks.
func (s *Store) Usage() (used, quota int64) {
	ca := s.cache
	ca.mu.Lock()
	defer ca.mu.Unlock()
	return ca.usedLocked(), ca.quota
}
