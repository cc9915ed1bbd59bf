package capsulestore

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	pb "github.com/ipfs/boxo/bitswap/message/pb"
	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
)

// ErrStalled: Fetch received no block for the stall timeout.
var ErrStalled = errors.New("fetch stalled")

// ErrTooLarge is returned by Fetch for a file over WithMaxSize.
var ErrTooLarge = errors.New("file over the size allowed")

// ErrOffline: the Store has no libp2p host and a block is not local.
var ErrOffline = errors.New("store is offline and the content is not all local")

// Fetch makes every block of the file DAG c local, fetching the missing ones
// from peers, several at once and from several peers at once. Blocks already
// local are not fetched again, so a Fetch resumes where an earlier one
// stopped. Every block is verified against its CID on arrival.
//
// The peers asked are every connected peer plus the providers given with
// [WithProviders] (dialled first; they are hints, an unreachable one is
// skipped). Each peer is asked which blocks it has (bitswap want-have, which
// also subscribes to blocks it gets later), and each block is requested from
// one peer that has it: the one that fewest others have first, in an order
// of its own per fetcher, so that fetchers of one capsule fetch different
// blocks from the seed and trade them among themselves. The number of blocks
// requested from a peer at once follows the rate it delivers at
// (WithFetchConcurrency bounds it); a block that a peer is slow to deliver is
// also asked of another, and a peer that disconnects has its requests moved.
//
// Fetch fails with an error wrapping ErrStalled when no block arrives for the
// stall timeout (WithStallTimeout); it sets no limit on the total duration.
// progress, if not nil, is called from Fetch's goroutine every progress
// interval while something changed, and once at the end on success; it must
// not block.
//
// While it runs, c counts as in use (never evicted); the cache index records
// it (WithName names it), and when the Store has a quota Fetch first evicts
// least recently used capsules no one uses to make room, failing with
// ErrQuota if it cannot.
func (s *Store) Fetch(ctx context.Context, c cid.Cid, progress func(Progress), opts ...ItemOption) error {
	_, err := s.fetchTo(ctx, c, progress, nil, opts...)
	return err
}

// fetchTo is Fetch; with out, it also writes the file into out: raw leaves
// that arrive are written there (only there: the store serves them from
// out), and the bytes of blocks that were local are copied there. It
// returns the file's size.
func (s *Store) fetchTo(ctx context.Context, c cid.Cid, progress func(Progress), out *placedFile, opts ...ItemOption) (int64, error) {
	if s.closed.Load() {
		return 0, ErrClosed
	}
	if !c.Defined() {
		return 0, errors.New("capsulestore: fetch: undefined CID")
	}
	if err := checkCodec(c); err != nil {
		return 0, fmt.Errorf("capsulestore: fetch %s: %w", c, err)
	}
	ic := itemConfig{}
	for _, o := range opts {
		o(&ic)
	}
	// One fetch per root at a time; a second waits and then finds the
	// blocks local.
	unlock, err := s.lockRoot(ctx, c)
	if err != nil {
		return 0, fmt.Errorf("capsulestore: fetch %s: %w", c, err)
	}
	defer unlock()
	release, err := s.cache.begin(ctx, c, ic.name)
	if err != nil {
		return 0, fmt.Errorf("capsulestore: fetch %s: %w", c, err)
	}
	defer release()
	if len(ic.providers) > 0 && s.host != nil {
		s.connectProviders(ctx, ic.providers)
	}
	f := newFetch(s, c, progress)
	f.maxSize = ic.maxSize
	f.out = out
	err = f.run(ctx)
	if out != nil && s.ex != nil {
		s.ex.unplace(f)
	}
	release()
	if errors.Is(err, ErrQuota) || errors.Is(err, ErrTooLarge) {
		// It cannot be held: drop what was fetched of it (the root).
		if rerr := s.Remove(ctx, c); rerr != nil {
			s.log.Debug("dropping a fetch over quota", "cid", c, "err", rerr)
		}
	}
	if err != nil {
		return 0, fmt.Errorf("capsulestore: fetch %s: %w", c, err)
	}
	return f.total, nil
}

// lockRoot serializes fetches of one root.
func (s *Store) lockRoot(ctx context.Context, c cid.Cid) (func(), error) {
	for {
		s.flightMu.Lock()
		ch, busy := s.flights[c]
		if !busy {
			ch = make(chan struct{})
			s.flights[c] = ch
			s.flightMu.Unlock()
			return func() {
				s.flightMu.Lock()
				delete(s.flights, c)
				s.flightMu.Unlock()
				close(ch)
			}, nil
		}
		s.flightMu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// connectProviders dials the provider hints that are not connected yet, all
// at once, each for at most 10 s.
func (s *Store) connectProviders(ctx context.Context, ps []peer.AddrInfo) {
	var wg sync.WaitGroup
	for _, p := range ps {
		if p.ID == "" || p.ID == s.host.ID() || len(s.host.Network().ConnsToPeer(p.ID)) > 0 {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if err := s.host.Connect(cctx, p); err != nil {
				s.log.Info("provider unreachable", "peer", p.ID, "err", err)
			}
		})
	}
	wg.Wait()
}

type eventKind int

const (
	evBlock       eventKind = iota // a wanted block arrived and is stored
	evStoreFailed                  // a wanted block arrived but could not be stored
	evHave                         // a peer has a block
	evDontHave                     // a peer does not have a block it was asked for
	evPeerUp                       // a peer connected
	evPeerDown                     // a peer disconnected or cannot be used
)

// event is what the exchange tells a fetch.
type event struct {
	kind   eventKind
	from   peer.ID
	c      cid.Cid
	size   int    // block size (evBlock)
	data   []byte // block bytes of a dag-pb block (evBlock)
	placed bool   // evBlock: written into the fetch's output file, not the store
	err    error
}

// want is one block the fetch needs.
type want struct {
	c        cid.Cid
	fileSize int64  // file bytes under the block, as its parent says; -1 for the root
	offset   int64  // where its file bytes start in the file
	order    uint64 // this fetcher's own priority: lower first
	done     bool
	holders  map[peer.ID]bool      // peers that said they have it
	subs     map[peer.ID]bool      // peers holding our want-have for it
	inflight map[peer.ID]time.Time // peers asked for the block, and when
}

// fpeer is what a fetch knows of one peer.
type fpeer struct {
	id       peer.ID
	usable   bool
	subs     int // our want-haves on its list
	inflight int // blocks asked of it and not yet received
	holds    int // blocks of this DAG it said it has
	received int64
	blocks   int
	rate     float64 // bytes/s, smoothed
	rateMark int64   // received at the last rate update
	window   int     // blocks to have asked of it at once
}

// fetch is one running Fetch: the scheduler, fed by the exchange's events.
type fetch struct {
	s        *Store
	root     cid.Cid
	progress func(Progress)
	rng      *rand.Rand

	mu     sync.Mutex
	queue  []event
	notify chan struct{}

	wants    map[cid.Cid]*want
	pending  []*want // not done, by order
	peers    map[peer.ID]*fpeer
	total    int64 // file size, once the root is known
	maxSize  int64 // WithMaxSize; 0: none
	done     int64 // file bytes local
	dagBytes int64 // bytes of all distinct blocks of the DAG seen so far
	netBytes int64 // bytes received from peers
	blocks   int64 // blocks received from peers
	dups     int64 // blocks received twice
	start    time.Time
	last     time.Time // last block received
	rate     rateMeter
	reserved bool
	live     bool // pending blocks are registered with the exchange
	subsDue  bool // some peer may lack want-haves for pending blocks

	out         *placedFile // WriteTo's file, or nil
	copies      []copyJob   // file bytes to copy into out from local blocks
	placedBytes int64       // bytes of leaves written into out only
}

// copyJob: the file bytes of block c (local) belong at off in the output.
type copyJob struct {
	c   cid.Cid
	off int64
}

// Scheduling parameters.
const (
	minWindow         = 2
	initialWindow     = 4
	windowTime        = 500 * time.Millisecond // a peer's window holds this much of its rate
	maxSubsPerPeer    = 800                    // our wants on one peer's list, shared by the running fetches (bitswap servers keep 1024 entries per peer)
	minSubsPerPeer    = 64
	hedgeMinAge       = 3 * time.Second // a request older than this, and slow for the peer's rate, is also asked of another peer
	rateUpdatePeriod  = 250 * time.Millisecond
	progressRateRange = 5 * time.Second
)

func newFetch(s *Store, root cid.Cid, progress func(Progress)) *fetch {
	h := fnv.New64a()
	if s.host != nil {
		h.Write([]byte(s.host.ID()))
	}
	h.Write(root.Bytes())
	seed := h.Sum64()
	return &fetch{
		s: s, root: root, progress: progress,
		rng:    rand.New(rand.NewPCG(seed, seed>>1|1)),
		notify: make(chan struct{}, 1),
		wants:  make(map[cid.Cid]*want),
		peers:  make(map[peer.ID]*fpeer),
	}
}

// post queues an event; it never blocks (the exchange calls it).
func (f *fetch) post(ev event) {
	f.mu.Lock()
	f.queue = append(f.queue, ev)
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
}

func (f *fetch) run(ctx context.Context) error {
	f.start = time.Now()
	f.last = f.start
	f.rate.init(f.start)
	s := f.s
	ex := s.ex

	root := f.addWant(f.root, -1, 0)
	if err := f.resolveLocal(ctx, root); err != nil {
		return err
	}
	if len(f.pending) > 0 && ex == nil {
		return fmt.Errorf("%d blocks missing: %w", len(f.pending), ErrOffline)
	}
	if len(f.pending) > 0 {
		if err := f.reserve(ctx); err != nil {
			return err
		}
		ex.register(f, f.pendingCIDs()...)
		f.live = true
		defer ex.unregister(f)
		for _, p := range ex.peers() {
			f.peerUp(p)
		}
		if err := f.loop(ctx); err != nil {
			return err
		}
	}
	if f.total != f.done {
		return fmt.Errorf("DAG holds %d bytes but its root says %d: %w", f.done, f.total, ErrNotFile)
	}
	if f.out != nil {
		if err := f.copyLocal(ctx); err != nil {
			return err
		}
	} else if err := s.cache.complete(ctx, f.root, f.total, f.dagBytes); err != nil {
		s.log.Warn("recording fetched file", "cid", f.root, "err", err)
	}
	f.report(time.Now(), true)
	el := time.Since(f.start)
	if f.blocks > 0 {
		var from []string
		for _, p := range f.peers {
			if p.blocks > 0 {
				from = append(from, fmt.Sprintf("%s:%d", shortID(p.id), p.blocks))
			}
		}
		slices.Sort(from)
		s.log.Info("file fetched", "cid", f.root, "bytes", f.total, "fetched_blocks", f.blocks,
			"fetched_bytes", f.netBytes, "duplicate_blocks", f.dups, "from", from,
			"elapsed", el.Round(time.Millisecond), "mib_per_s", fmt.Sprintf("%.1f", float64(f.netBytes)/(1<<20)/max(el.Seconds(), 1e-9)))
	}
	return nil
}

// copyLocal writes into the output the file bytes of blocks that were
// local (or repeated) rather than placed on arrival. Placed leaves of other
// files are verified as they are read.
func (f *fetch) copyLocal(ctx context.Context) error {
	for _, j := range f.copies {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		blk, err := f.s.bstore.Get(ctx, j.c)
		if err != nil {
			return fmt.Errorf("block %s: %w", j.c, err)
		}
		if err := f.out.writeAt(blk.RawData(), j.off); err != nil {
			return fmt.Errorf("writing the file: %w", err)
		}
	}
	f.copies = nil
	return nil
}

func shortID(p peer.ID) string {
	s := p.String()
	if len(s) > 8 {
		return s[len(s)-6:]
	}
	return s
}

// reserve makes room for the file under the quota once its size is known
// (the root is local).
func (f *fetch) reserve(ctx context.Context) error {
	if f.reserved || !f.wants[f.root].done {
		return nil
	}
	if f.maxSize > 0 && f.total > f.maxSize {
		return fmt.Errorf("%d bytes, over %d: %w", f.total, f.maxSize, ErrTooLarge)
	}
	f.reserved = true
	return f.s.cache.reserve(ctx, f.root, estimateDAGBytes(f.total))
}

func (f *fetch) pendingCIDs() []cid.Cid {
	cs := make([]cid.Cid, len(f.pending))
	for i, w := range f.pending {
		cs[i] = w.c
	}
	return cs
}

func (f *fetch) addWant(c cid.Cid, fileSize, offset int64) *want {
	w := &want{
		c: c, fileSize: fileSize, offset: offset, order: f.rng.Uint64(),
		holders: map[peer.ID]bool{}, subs: map[peer.ID]bool{}, inflight: map[peer.ID]time.Time{},
	}
	f.wants[c] = w
	return w
}

// resolveLocal walks the local part of the DAG under w: local blocks are
// counted done (dag-pb ones decoded and their children visited), missing ones
// become pending.
func (f *fetch) resolveLocal(ctx context.Context, w *want) error {
	stack := []*want{w}
	for len(stack) > 0 {
		if err := ctx.Err(); err != nil {
			return context.Cause(ctx)
		}
		w := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		has, err := f.s.bstore.Has(ctx, w.c)
		if err != nil {
			return fmt.Errorf("block %s: %w", w.c, err)
		}
		if !has {
			f.addPending(w)
			continue
		}
		if w.c.Type() == cid.Raw && f.out != nil {
			f.copies = append(f.copies, copyJob{w.c, w.offset})
		}
		if w.c.Type() == cid.Raw && w.fileSize >= 0 {
			// Verified when it was stored; its size is the parent's word
			// (re-checked by Verify).
			f.markDone(w, int(w.fileSize))
			continue
		}
		blk, err := f.s.bstore.Get(ctx, w.c)
		if err != nil {
			return fmt.Errorf("block %s: %w", w.c, err)
		}
		children, err := f.blockDone(w, blk.RawData())
		if err != nil {
			return fmt.Errorf("block %s: %w", w.c, err)
		}
		stack = append(stack, children...)
	}
	return nil
}

func (f *fetch) addPending(w *want) {
	i, _ := slices.BinarySearchFunc(f.pending, w.order, func(x *want, o uint64) int {
		switch {
		case x.order < o:
			return -1
		case x.order > o:
			return 1
		}
		return 0
	})
	f.pending = slices.Insert(f.pending, i, w)
	f.subsDue = true
	if f.out != nil && w.c.Type() == cid.Raw && f.s.ex != nil {
		f.s.ex.placeAt(f, w.c, w.offset)
	}
	if f.live {
		f.s.ex.register(f, w.c)
	}
}

func (f *fetch) removePending(w *want) {
	if i := slices.Index(f.pending, w); i >= 0 {
		f.pending = slices.Delete(f.pending, i, i+1)
	}
}

// blockDone accounts for a block that is now local and returns the children
// that are new to this fetch.
func (f *fetch) blockDone(w *want, data []byte) ([]*want, error) {
	n, err := decodeBlock(w.c, data)
	if err != nil {
		return nil, err
	}
	if w.fileSize >= 0 && n.fileSize != uint64(w.fileSize) {
		return nil, fmt.Errorf("block holds %d file bytes, its parent says %d: %w", n.fileSize, w.fileSize, ErrNotFile)
	}
	if w.c == f.root {
		if n.fileSize > math.MaxInt64/2 {
			return nil, fmt.Errorf("file size %d: %w", n.fileSize, ErrNotFile)
		}
		f.total = int64(n.fileSize)
		w.fileSize = f.total
	}
	f.markDone(w, len(data))
	if w.c.Type() == cid.DagProtobuf {
		f.done += int64(n.dataLen) // a raw block's bytes were counted by markDone
		if f.out != nil && n.dataLen > 0 {
			if err := f.out.writeAt(n.data, w.offset); err != nil {
				return nil, fmt.Errorf("writing the file: %w", err)
			}
		}
	}
	var children []*want
	off := w.offset + int64(n.dataLen)
	for i, l := range n.links {
		size := int64(n.linkSizes[i])
		if f.wants[l] != nil {
			// The same block again (a file of repeated chunks): it is
			// fetched once, and its bytes count once per reference (here
			// in advance: the final check compares the sum to the size).
			f.done += size
			if f.out != nil {
				f.copies = append(f.copies, copyJob{l, off})
			}
			off += size
			continue
		}
		children = append(children, f.addWant(l, size, off))
		off += size
	}
	return children, nil
}

// markDone records w as local, size being the block's size; a raw block's
// bytes are file bytes.
func (f *fetch) markDone(w *want, size int) {
	w.done = true
	f.dagBytes += int64(size)
	if w.c.Type() == cid.Raw {
		f.done += int64(size)
	}
}

func (f *fetch) loop(ctx context.Context) error {
	s := f.s
	tick := min(s.cfg.progressInterval, s.cfg.stallTimeout/10, rateUpdatePeriod)
	tick = max(tick, 10*time.Millisecond)
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	lastReport := f.start
	lastRate := f.start
	var lastReported int64 = -1
	for len(f.pending) > 0 {
		f.schedule(time.Now())
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-s.ex.ctx.Done():
			return ErrClosed
		case <-f.notify:
			if err := f.drain(ctx); err != nil {
				return err
			}
		case now := <-ticker.C:
			if idle := now.Sub(f.last); idle >= s.cfg.stallTimeout {
				usable := 0
				for _, p := range f.peers {
					if p.usable {
						usable++
					}
				}
				return fmt.Errorf("%w: no block arrived for %s (%d of %d bytes, %d blocks missing, %d peers usable)",
					ErrStalled, idle.Round(time.Millisecond), f.done, f.total, len(f.pending), usable)
			}
			if now.Sub(lastRate) >= rateUpdatePeriod {
				f.updateRates(now.Sub(lastRate))
				lastRate = now
			}
			f.hedge(now)
			if now.Sub(lastReport) >= s.cfg.progressInterval && f.done != lastReported {
				lastReport = now
				lastReported = f.done
				f.report(now, false)
			}
		}
	}
	return nil
}

func (f *fetch) drain(ctx context.Context) error {
	f.mu.Lock()
	evs := f.queue
	f.queue = nil
	f.mu.Unlock()
	for _, ev := range evs {
		if err := f.handle(ctx, ev); err != nil {
			return err
		}
	}
	return nil
}

func (f *fetch) handle(ctx context.Context, ev event) error {
	switch ev.kind {
	case evPeerUp:
		f.peerUp(ev.from)
	case evPeerDown:
		f.peerDown(ev.from)
	case evHave:
		w, p := f.wants[ev.c], f.peers[ev.from]
		if w == nil || w.done || p == nil {
			return nil
		}
		if w.subs[p.id] {
			delete(w.subs, p.id)
			p.subs--
		}
		if !w.holders[p.id] {
			w.holders[p.id] = true
			p.holds++
		}
	case evDontHave:
		w, p := f.wants[ev.c], f.peers[ev.from]
		if w == nil || w.done || p == nil {
			return nil
		}
		f.subsDue = true // subscribe again: it may get the block later
		if _, ok := w.inflight[p.id]; ok {
			delete(w.inflight, p.id)
			p.inflight--
		}
		if w.holders[p.id] {
			delete(w.holders, p.id)
			p.holds--
		}
	case evStoreFailed:
		return ev.err
	case evBlock:
		return f.received(ctx, ev)
	}
	return nil
}

func (f *fetch) received(ctx context.Context, ev event) error {
	w := f.wants[ev.c]
	if w == nil {
		return nil
	}
	now := time.Now()
	if p := f.peers[ev.from]; p != nil {
		p.received += int64(ev.size)
		p.blocks++
		if _, ok := w.inflight[p.id]; ok {
			delete(w.inflight, p.id)
			p.inflight--
		}
	}
	f.netBytes += int64(ev.size)
	f.rate.add(now, int64(ev.size))
	f.last = now
	if w.done {
		f.dups++
		return nil
	}
	f.blocks++
	// Every other peer's want of it is withdrawn.
	for id := range w.inflight {
		if p := f.peers[id]; p != nil {
			p.inflight--
		}
	}
	for id := range w.subs {
		if p := f.peers[id]; p != nil {
			p.subs--
		}
	}
	for id := range w.holders {
		if p := f.peers[id]; p != nil {
			p.holds--
		}
	}
	clear(w.inflight)
	clear(w.subs)
	clear(w.holders)
	f.s.ex.unregister(f, w.c)
	f.removePending(w)
	if len(f.pending) >= minSubsPerPeer {
		f.subsDue = true // a subscription slot may be free for a block not yet asked about
	}

	if w.c.Type() == cid.Raw {
		if w.fileSize >= 0 && int64(ev.size) != w.fileSize {
			return fmt.Errorf("block %s from %s: %d bytes, its parent says %d: %w", w.c, ev.from, ev.size, w.fileSize, ErrNotFile)
		}
		switch {
		case ev.placed:
			f.placedBytes += int64(ev.size)
		case f.out != nil:
			// Stored for another fetch (or before this one placed it).
			f.copies = append(f.copies, copyJob{w.c, w.offset})
		}
		if w.fileSize < 0 { // a file of one raw block
			f.total = int64(ev.size)
			w.fileSize = f.total
		}
		f.markDone(w, ev.size)
		return f.reserve(ctx)
	}
	children, err := f.blockDone(w, ev.data)
	if err != nil {
		return fmt.Errorf("block %s from %s: %w", w.c, ev.from, err)
	}
	if err := f.reserve(ctx); err != nil {
		return err
	}
	// Children may already be local (a resumed fetch).
	for _, c := range children {
		if err := f.resolveLocal(ctx, c); err != nil {
			return err
		}
	}
	return nil
}

func (f *fetch) peerUp(id peer.ID) {
	if f.s.host != nil && id == f.s.host.ID() {
		return
	}
	f.subsDue = true
	if p := f.peers[id]; p != nil {
		p.usable = true
		return
	}
	f.peers[id] = &fpeer{id: id, usable: true, window: initialWindow}
}

func (f *fetch) peerDown(id peer.ID) {
	p := f.peers[id]
	if p == nil {
		return
	}
	p.usable = false
	p.inflight, p.subs, p.holds = 0, 0, 0
	for _, w := range f.pending {
		delete(w.inflight, id)
		delete(w.subs, id)
		delete(w.holders, id)
	}
}

// updateRates refreshes every peer's smoothed rate and window.
func (f *fetch) updateRates(dt time.Duration) {
	sec := dt.Seconds()
	for _, p := range f.peers {
		got := p.received - p.rateMark
		p.rateMark = p.received
		inst := float64(got) / sec
		if p.rate == 0 {
			p.rate = inst
		} else {
			p.rate = 0.7*p.rate + 0.3*inst
		}
		if p.blocks == 0 {
			continue // no measure yet: keep the initial window
		}
		avg := float64(p.received) / float64(p.blocks)
		win := int(math.Ceil(p.rate*windowTime.Seconds()/avg)) + 1
		p.window = min(max(win, minWindow), f.s.cfg.concurrency)
	}
}

// schedule sends want-haves (which peers have what) and want-blocks (fetch
// it from this peer).
func (f *fetch) schedule(now time.Time) {
	ex := f.s.ex
	// Subscriptions: every usable peer is asked about the first pending
	// blocks in this fetcher's order, up to this fetch's share of what a
	// peer keeps on its list for us.
	limit := max(minSubsPerPeer, maxSubsPerPeer/ex.fetchCount())
	for _, p := range f.peers {
		if !f.subsDue {
			break
		}
		if !p.usable || p.subs+p.inflight >= limit || p.subs+p.holds >= len(f.pending) {
			continue // nothing to ask it about, or no room on its list
		}
		for _, w := range f.pending {
			if p.subs+p.inflight >= limit {
				break
			}
			if w.subs[p.id] || w.holders[p.id] {
				continue
			}
			if _, asked := w.inflight[p.id]; asked {
				continue
			}
			if !ex.want(f, p.id, w.c, pb.Message_Wantlist_Have, subPriority) {
				f.peerDown(p.id)
				break
			}
			w.subs[p.id] = true
			p.subs++
		}
	}
	f.subsDue = false
	// Requests: peers with room in their window, the ones that hold least
	// first (so that a block held by a fetcher and by the seed comes from
	// the fetcher, and the seed's upload goes to blocks only it has), each
	// asked for the rarest block it has, ties broken by this fetcher's
	// order.
	free := make([]*fpeer, 0, len(f.peers))
	for _, p := range f.peers {
		if p.usable && p.inflight < p.window && p.holds > 0 {
			free = append(free, p)
		}
	}
	slices.SortFunc(free, func(a, b *fpeer) int { return a.holds - b.holds })
	for _, p := range free {
		for p.inflight < p.window {
			w := f.pick(p)
			if w == nil {
				break
			}
			if !ex.want(f, p.id, w.c, pb.Message_Wantlist_Block, blockPriority(w)) {
				f.peerDown(p.id)
				break
			}
			w.inflight[p.id] = now
			p.inflight++
		}
	}
}

// Priorities on the peer's side: answers about presence before blocks.
const subPriority = math.MaxInt32

func blockPriority(w *want) int32 { return int32(w.order >> 33) }

// pick returns the pending block, not asked of anyone, that p has and the
// fewest other peers have, earliest in this fetcher's order.
func (f *fetch) pick(p *fpeer) *want {
	var best *want
	bestRarity := math.MaxInt
	for _, w := range f.pending {
		if len(w.inflight) > 0 || !w.holders[p.id] {
			continue
		}
		if r := len(w.holders); r < bestRarity {
			best, bestRarity = w, r
			if r == 1 {
				break
			}
		}
	}
	return best
}

// hedge asks a second peer for blocks that a peer is slow to deliver.
func (f *fetch) hedge(now time.Time) {
	for _, w := range f.pending {
		if len(w.inflight) != 1 {
			continue
		}
		var from peer.ID
		var since time.Time
		for id, t := range w.inflight {
			from, since = id, t
		}
		p := f.peers[from]
		age := now.Sub(since)
		if age < hedgeMinAge {
			continue
		}
		// Expected: the blocks queued before it at this peer's rate.
		if p != nil && p.rate > 0 {
			expect := time.Duration(float64(p.inflight) * float64(1<<20) / p.rate * float64(time.Second))
			if age < 3*expect {
				continue
			}
		}
		var alt *fpeer
		for id := range w.holders {
			q := f.peers[id]
			if q == nil || id == from || !q.usable || q.inflight >= q.window {
				continue
			}
			if alt == nil || q.rate > alt.rate {
				alt = q
			}
		}
		if alt == nil {
			continue
		}
		if f.s.ex.want(f, alt.id, w.c, pb.Message_Wantlist_Block, subPriority-1) {
			w.inflight[alt.id] = now
			alt.inflight++
		}
	}
}

func (f *fetch) report(now time.Time, final bool) {
	if f.progress == nil {
		return
	}
	p := Progress{CID: f.root, Done: f.done, Total: f.total, Fetched: f.netBytes, Elapsed: now.Sub(f.start)}
	if p.Total > 0 && p.Done > p.Total {
		p.Done = p.Total
	}
	for _, fp := range f.peers {
		if fp.blocks > 0 {
			p.Peers++
		}
	}
	if final {
		if el := p.Elapsed.Seconds(); el > 0 {
			p.Rate = float64(f.netBytes) / el
		}
	} else {
		p.Rate = f.rate.rate(now)
		if p.Rate > 0 && p.Total > p.Done {
			p.ETA = time.Duration(float64(p.Total-p.Done) / p.Rate * float64(time.Second))
		}
	}
	f.progress(p)
}

// rateMeter measures bytes/s over the last progressRateRange, in buckets.
type rateMeter struct {
	start   time.Time
	buckets [20]int64
	stamp   [20]int64 // bucket index each slot holds
}

const rateBucket = progressRateRange / 20

func (r *rateMeter) init(now time.Time) { r.start = now }

func (r *rateMeter) add(now time.Time, n int64) {
	i := int64(now.Sub(r.start) / rateBucket)
	slot := i % int64(len(r.buckets))
	if r.stamp[slot] != i {
		r.stamp[slot], r.buckets[slot] = i, 0
	}
	r.buckets[slot] += n
}

func (r *rateMeter) rate(now time.Time) float64 {
	el := now.Sub(r.start)
	i := int64(el / rateBucket)
	var sum int64
	for s := range r.buckets {
		if b := r.stamp[s]; b > i-int64(len(r.buckets)) && b <= i {
			sum += r.buckets[s]
		}
	}
	span := min(el, progressRateRange).Seconds()
	if span <= 0 {
		return 0
	}
	return float64(sum) / span
}

// estimateDAGBytes is the store space a file of size bytes takes: the file
// plus its inner nodes (about 45 bytes per link).
func estimateDAGBytes(size int64) int64 {
	leaves := size/profileChunkSize + 1
	return size + leaves*48 + 1024
}
