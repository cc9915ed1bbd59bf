package capsulestore

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	bsmsg "github.com/ipfs/boxo/bitswap/message"
	pb "github.com/ipfs/boxo/bitswap/message/pb"
	bsnetwork "github.com/ipfs/boxo/bitswap/network"
	"github.com/ipfs/boxo/bitswap/server"
	"github.com/ipfs/boxo/blockstore"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
)

// exchange speaks bitswap on the Store's host. boxo's bitswap server answers
// every peer's wants from the blockstore, exactly as Kubo does; the client
// side is ours: boxo's client sessions choose the peer for each block
// themselves (mostly whichever peer sent the most blocks so far, that is the
// seed), which puts the whole swarm's load on the seed. Ours lets each fetch
// ask, block by block, the peer it chooses (see fetch.go), over the same wire
// protocol, so Kubo peers can still serve us and fetch from us.
//
// The exchange keeps, per connected peer, the wants this process has sent it
// (want-have, want-block or none) and the fetches that asked for them, and
// sends only changes. It follows how a bitswap server treats a wantlist: a
// want-have is dropped by the server when it answers HAVE, a want-block when
// it sends the block; a want it cannot serve yet stays (a subscription: it is
// answered when the server gets the block).
type exchange struct {
	log    *slog.Logger
	net    bsnetwork.BitSwapNetwork
	srv    *server.Server
	bstore blockstore.Blockstore
	refs   *refStore       // bstore, for placing leaves
	ctx    context.Context // lives as long as the Store

	writes     chan received
	writerDone chan struct{}

	mu      sync.Mutex
	links   map[peer.ID]*link
	wanted  map[cid.Cid][]*fetch  // blocks that running fetches wait for
	place   map[cid.Cid]placement // raw leaves to write into a WriteTo's file on arrival
	fetches map[*fetch]bool
	closed  bool
}

// Server tuning. A bitswap server sends one message at a time per peer until
// MaxOutstandingBytesPerPeer is in flight; boxo's 1 MiB default means one
// 1 MiB block at a time, which leaves a fast link idle between blocks.
const (
	serverOutstandingBytesPerPeer = 4 << 20
	serverTaskWorkers             = 8
)

func newExchange(ctx context.Context, net bsnetwork.BitSwapNetwork, bstore *refStore, log *slog.Logger) *exchange {
	ex := &exchange{
		log:     log,
		net:     net,
		bstore:  bstore,
		refs:    bstore,
		ctx:     ctx,
		links:   make(map[peer.ID]*link),
		wanted:  make(map[cid.Cid][]*fetch),
		place:   make(map[cid.Cid]placement),
		fetches: make(map[*fetch]bool),
		writes:  make(chan received, writeQueue),

		writerDone: make(chan struct{}),
	}
	go ex.writer()
	ex.srv = server.New(ctx, net, bstore,
		server.MaxOutstandingBytesPerPeer(serverOutstandingBytesPerPeer),
		server.TaskWorkerCount(serverTaskWorkers),
	)
	net.Start(ex)
	return ex
}

func (ex *exchange) close() {
	ex.mu.Lock()
	ex.closed = true
	links := ex.links
	ex.links = map[peer.ID]*link{}
	ex.mu.Unlock()
	ex.net.Stop()
	for _, l := range links {
		l.stop()
	}
	ex.srv.Close()
	<-ex.writerDone // ctx is cancelled by the Store
}

// register makes blocks arriving for c reach f.
func (ex *exchange) register(f *fetch, cs ...cid.Cid) {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ex.fetches[f] = true
	for _, c := range cs {
		if !slices.Contains(ex.wanted[c], f) {
			ex.wanted[c] = append(ex.wanted[c], f)
		}
	}
}

// unregister forgets c for f, or every block of f when cs is empty, and
// withdraws f's wants from every peer.
func (ex *exchange) unregister(f *fetch, cs ...cid.Cid) {
	ex.mu.Lock()
	if len(cs) == 0 {
		delete(ex.fetches, f)
		for c := range ex.wanted {
			ex.unwantLocked(c, f)
		}
	}
	for _, c := range cs {
		ex.unwantLocked(c, f)
	}
	links := make([]*link, 0, len(ex.links))
	for _, l := range ex.links {
		links = append(links, l)
	}
	ex.mu.Unlock()
	for _, l := range links {
		l.drop(f, cs...)
	}
}

// unwantLocked removes f from the fetches waiting for c; ex.mu is held.
func (ex *exchange) unwantLocked(c cid.Cid, f *fetch) {
	fs := ex.wanted[c]
	if i := slices.Index(fs, f); i >= 0 {
		fs = slices.Delete(fs, i, i+1)
	}
	if len(fs) == 0 {
		delete(ex.wanted, c)
	} else {
		ex.wanted[c] = fs
	}
}

// placement: where a wanted raw leaf goes on arrival.
type placement struct {
	f   *fetch
	off int64
}

// placeAt makes c, when it arrives, be written at off into f's output file
// (and served from there) instead of into the store.
func (ex *exchange) placeAt(f *fetch, c cid.Cid, off int64) {
	ex.mu.Lock()
	ex.place[c] = placement{f: f, off: off}
	ex.mu.Unlock()
}

// unplace forgets f's placements.
func (ex *exchange) unplace(f *fetch) {
	ex.mu.Lock()
	for c, p := range ex.place {
		if p.f == f {
			delete(ex.place, c)
		}
	}
	ex.mu.Unlock()
}

// fetchCount is the number of running fetches (at least 1).
func (ex *exchange) fetchCount() int {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	return max(len(ex.fetches), 1)
}

// peers lists the connected peers.
func (ex *exchange) peers() []peer.ID {
	ex.mu.Lock()
	defer ex.mu.Unlock()
	ps := make([]peer.ID, 0, len(ex.links))
	for p := range ex.links {
		ps = append(ps, p)
	}
	return ps
}

// want asks p for c on behalf of f: kind is pb.Message_Wantlist_Have (a
// subscription: tell me when you have it) or pb.Message_Wantlist_Block.
// It reports false when p is not connected or cannot speak bitswap; f then
// gets no answer from p.
func (ex *exchange) want(f *fetch, p peer.ID, c cid.Cid, kind pb.Message_Wantlist_WantType, prio int32) bool {
	ex.mu.Lock()
	l := ex.links[p]
	ex.mu.Unlock()
	if l == nil {
		return false
	}
	return l.want(f, c, kind, prio)
}

// cancel withdraws f's want of c from p.
func (ex *exchange) cancel(f *fetch, p peer.ID, c cid.Cid) {
	ex.mu.Lock()
	l := ex.links[p]
	ex.mu.Unlock()
	if l != nil {
		l.drop(f, c)
	}
}

// ReceiveMessage implements bsnetwork.Receiver. Blocks that a fetch waits
// for are stored (the message decoder derived each block's CID from its
// bytes, so a block that matches a wanted CID is verified), announced to the
// server (peers subscribed to them get a HAVE) and reported to the fetches;
// others are dropped. HAVE and DONT_HAVE are reported to the fetches that
// wait for the block. The server then handles the peer's wantlist.
func (ex *exchange) ReceiveMessage(ctx context.Context, p peer.ID, msg bsmsg.BitSwapMessage) {
	ex.mu.Lock()
	l := ex.links[p]
	ex.mu.Unlock()

	for _, blk := range msg.Blocks() {
		c := blk.Cid()
		if l != nil {
			l.answered(c, true)
		}
		ex.mu.Lock()
		wanted := len(ex.wanted[c]) > 0
		ex.mu.Unlock()
		if !wanted {
			continue // not wanted (late, duplicate or unsolicited)
		}
		// Stored by the writer, so that this stream goes on reading while
		// the datastore writes; the queue is bounded (backpressure).
		select {
		case ex.writes <- received{from: p, blk: blk}:
		case <-ex.ctx.Done():
			return
		}
	}
	for _, c := range msg.Haves() {
		if l != nil {
			l.answered(c, false)
		}
		ex.postAll(c, event{kind: evHave, from: p, c: c})
	}
	for _, c := range msg.DontHaves() {
		if l != nil {
			l.dontHave(c)
		}
		ex.postAll(c, event{kind: evDontHave, from: p, c: c})
	}
	if blks := msg.Blocks(); len(blks) > 0 {
		ex.srv.ReceivedBlocks(p, blks)
	}
	ex.srv.ReceiveMessage(ctx, p, msg)
}

// received is a wanted block on its way to the blockstore.
type received struct {
	from peer.ID
	blk  blocks.Block
}

// Writer queue: blocks received and not yet stored (about 1 MiB each).
const (
	writeQueue    = 32
	writeBatch    = 16
	writeParallel = 4
)

// writer stores received blocks in batches (one datastore transaction for
// whatever accumulated), tells the server (peers subscribed to them get a
// HAVE) and the fetches waiting for them.
func (ex *exchange) writer() {
	defer close(ex.writerDone)
	batch := make([]received, 0, writeBatch)
	for {
		batch = batch[:0]
		select {
		case r := <-ex.writes:
			batch = append(batch, r)
		case <-ex.ctx.Done():
			return
		}
	more:
		for len(batch) < writeBatch {
			select {
			case r := <-ex.writes:
				batch = append(batch, r)
			default:
				break more
			}
		}
		// Raw leaves a WriteTo placed go into its file; the rest into the
		// store. Both are written by writeParallel goroutines at once: a
		// block file costs a create, a write that goes to the disk
		// (O_DIRECT) and a rename, and one at a time they leave the disk
		// and the CPU idle in turn.
		placed := make([]bool, len(batch))
		perr := make([]error, len(batch))
		var toStore []int
		var wg sync.WaitGroup
		sem := make(chan struct{}, writeParallel)
		for i, r := range batch {
			c := r.blk.Cid()
			ex.mu.Lock()
			pl, ok := ex.place[c]
			// A leaf another fetch waits for too goes into the store:
			// that fetch must not depend on this one's file.
			ok = ok && len(ex.wanted[c]) == 1
			ex.mu.Unlock()
			if !ok || c.Type() != cid.Raw {
				toStore = append(toStore, i)
				continue
			}
			placed[i] = true
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				data := r.blk.RawData()
				if perr[i] = pl.f.out.writeAt(data, pl.off); perr[i] == nil {
					ex.refs.place(c, pl.f.out, pl.off, len(data))
				}
			})
		}
		for _, i := range toStore {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				perr[i] = ex.bstore.Put(ex.ctx, batch[i].blk)
			})
		}
		wg.Wait()
		var stored []blocks.Block
		for i, r := range batch {
			if perr[i] == nil {
				stored = append(stored, r.blk)
			}
		}
		if len(stored) > 0 {
			if nerr := ex.srv.NotifyNewBlocks(ex.ctx, stored...); nerr != nil {
				ex.log.Debug("bitswap notify", "err", nerr)
			}
		}
		for i, r := range batch {
			c := r.blk.Cid()
			ev := event{kind: evBlock, from: r.from, c: c, size: len(r.blk.RawData()), placed: placed[i]}
			if c.Type() == cid.DagProtobuf {
				ev.data = r.blk.RawData() // inner nodes are small; the fetch decodes them
			}
			if perr[i] != nil {
				ev.kind, ev.err = evStoreFailed, fmt.Errorf("storing block %s: %w", c, perr[i])
			}
			ex.postAll(c, ev)
		}
	}
}

func (ex *exchange) postAll(c cid.Cid, ev event) {
	ex.mu.Lock()
	fs := slices.Clone(ex.wanted[c])
	ex.mu.Unlock()
	for _, f := range fs {
		f.post(ev)
	}
}

// ReceiveError implements bsnetwork.Receiver.
func (ex *exchange) ReceiveError(err error) {
	ex.log.Debug("bitswap receive error", "err", err)
}

// PeerConnected implements bsnetwork.Receiver.
func (ex *exchange) PeerConnected(p peer.ID) {
	ex.srv.PeerConnected(p)
	ex.mu.Lock()
	if ex.closed || ex.links[p] != nil {
		ex.mu.Unlock()
		return
	}
	l := newLink(ex, p)
	ex.links[p] = l
	fs := make([]*fetch, 0, len(ex.fetches))
	for f := range ex.fetches {
		fs = append(fs, f)
	}
	ex.mu.Unlock()
	for _, f := range fs {
		f.post(event{kind: evPeerUp, from: p})
	}
}

// PeerDisconnected implements bsnetwork.Receiver.
func (ex *exchange) PeerDisconnected(p peer.ID) {
	ex.srv.PeerDisconnected(p)
	ex.mu.Lock()
	l := ex.links[p]
	delete(ex.links, p)
	fs := make([]*fetch, 0, len(ex.fetches))
	for f := range ex.fetches {
		fs = append(fs, f)
	}
	ex.mu.Unlock()
	if l != nil {
		l.stop()
	}
	for _, f := range fs {
		f.post(event{kind: evPeerDown, from: p})
	}
}

// sentNone: nothing for this CID is on the peer's wantlist.
const sentNone pb.Message_Wantlist_WantType = -1

// linkWant is what this process wants from one peer for one CID.
type linkWant struct {
	haves  []*fetch // fetches subscribed with a want-have
	blocks []*fetch // fetches waiting for the block from this peer
	prio   int32
	sent   pb.Message_Wantlist_WantType // what the peer's wantlist holds, as far as we know
}

func (w *linkWant) desired() pb.Message_Wantlist_WantType {
	switch {
	case len(w.blocks) > 0:
		return pb.Message_Wantlist_Block
	case len(w.haves) > 0:
		return pb.Message_Wantlist_Have
	default:
		return sentNone
	}
}

// link sends this process's wantlist changes to one peer, over one bitswap
// stream, batching whatever accumulated while the previous message was sent.
type link struct {
	ex   *exchange
	peer peer.ID

	mu     sync.Mutex
	wants  map[cid.Cid]*linkWant
	dirty  map[cid.Cid]bool
	failed error

	signal chan struct{}
	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

func newLink(ex *exchange, p peer.ID) *link {
	ctx, cancel := context.WithCancel(ex.ctx)
	l := &link{
		ex: ex, peer: p,
		wants:  make(map[cid.Cid]*linkWant),
		dirty:  make(map[cid.Cid]bool),
		signal: make(chan struct{}, 1),
		ctx:    ctx, cancel: cancel,
		done: make(chan struct{}),
	}
	go l.run()
	return l
}

func (l *link) stop() {
	l.cancel()
	<-l.done
}

func (l *link) want(f *fetch, c cid.Cid, kind pb.Message_Wantlist_WantType, prio int32) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.failed != nil || l.ctx.Err() != nil {
		return false
	}
	w := l.wants[c]
	if w == nil {
		w = &linkWant{sent: sentNone}
		l.wants[c] = w
	}
	w.prio = prio
	if kind == pb.Message_Wantlist_Block {
		if !slices.Contains(w.blocks, f) {
			w.blocks = append(w.blocks, f)
		}
	} else if !slices.Contains(w.haves, f) {
		w.haves = append(w.haves, f)
	}
	l.markDirty(c)
	return true
}

// drop withdraws f's wants for cs (all of f's wants when cs is empty).
func (l *link) drop(f *fetch, cs ...cid.Cid) {
	l.mu.Lock()
	defer l.mu.Unlock()
	del := func(c cid.Cid, w *linkWant) {
		n := len(w.haves) + len(w.blocks)
		w.haves = slices.DeleteFunc(w.haves, func(x *fetch) bool { return x == f })
		w.blocks = slices.DeleteFunc(w.blocks, func(x *fetch) bool { return x == f })
		if len(w.haves)+len(w.blocks) != n {
			l.markDirty(c)
		}
	}
	if len(cs) == 0 {
		for c, w := range l.wants {
			del(c, w)
		}
		return
	}
	for _, c := range cs {
		if w := l.wants[c]; w != nil {
			del(c, w)
		}
	}
}

// answered records that the peer dropped its entry for c: it sent the block
// (every want of c is served) or a HAVE (the want-haves are answered).
func (l *link) answered(c cid.Cid, block bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	w := l.wants[c]
	if w == nil {
		return
	}
	switch {
	case block:
		w.haves, w.blocks = nil, nil
		w.sent = sentNone
	case w.sent == pb.Message_Wantlist_Have:
		w.haves = nil
		w.sent = sentNone
	default:
		w.haves = nil // a want-block stays on the peer's list
	}
	l.markDirty(c)
}

// dontHave: the peer answered a want-block with DONT_HAVE. The want stays on
// its list (it would push the block when it gets it); the fetch that asked
// goes elsewhere, so the want-block is withdrawn.
func (l *link) dontHave(c cid.Cid) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if w := l.wants[c]; w != nil && w.sent == pb.Message_Wantlist_Block {
		w.blocks = nil
		l.markDirty(c)
	}
}

func (l *link) markDirty(c cid.Cid) {
	l.dirty[c] = true
	select {
	case l.signal <- struct{}{}:
	default:
	}
}

// maxEntriesPerMessage keeps wantlist messages small enough to go out at
// once even while blocks stream the other way.
const maxEntriesPerMessage = 512

func (l *link) run() {
	defer close(l.done)
	var sender bsnetwork.MessageSender
	defer func() {
		if sender != nil {
			sender.Reset()
		}
	}()
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-l.signal:
		}
		for {
			msg := l.nextMessage()
			if msg == nil {
				break
			}
			var err error
			if sender == nil {
				sctx, cancel := context.WithTimeout(l.ctx, 20*time.Second)
				sender, err = l.ex.net.NewMessageSender(sctx, l.peer, &bsnetwork.MessageSenderOpts{
					MaxRetries: 3, SendTimeout: 30 * time.Second, SendErrorBackoff: 200 * time.Millisecond,
				})
				cancel()
			}
			if err == nil {
				err = sender.SendMsg(l.ctx, msg)
			}
			if err != nil {
				if l.ctx.Err() != nil {
					return
				}
				l.fail(err)
				return
			}
		}
	}
}

// nextMessage turns the dirty entries into one message, updating what the
// peer's list holds; nil when there is nothing to send.
func (l *link) nextMessage() bsmsg.BitSwapMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	var msg bsmsg.BitSwapMessage
	n := 0
	for c := range l.dirty {
		if n == maxEntriesPerMessage {
			break
		}
		delete(l.dirty, c)
		w := l.wants[c]
		if w == nil {
			continue
		}
		want := w.desired()
		if want != w.sent {
			if msg == nil {
				msg = bsmsg.New(false)
			}
			n++
			if want == sentNone {
				msg.Cancel(c)
			} else {
				// A DONT_HAVE is useful for a want-block (go elsewhere);
				// a want-have is a subscription and needs no answer yet.
				msg.AddEntry(c, w.prio, want, want == pb.Message_Wantlist_Block)
			}
			w.sent = want
		}
		if want == sentNone {
			delete(l.wants, c)
		}
	}
	if len(l.dirty) > 0 {
		select {
		case l.signal <- struct{}{}:
		default:
		}
	}
	return msg
}

func (l *link) fail(err error) {
	l.mu.Lock()
	l.failed = err
	fs := map[*fetch]bool{}
	for _, w := range l.wants {
		for _, f := range w.haves {
			fs[f] = true
		}
		for _, f := range w.blocks {
			fs[f] = true
		}
	}
	l.wants = map[cid.Cid]*linkWant{}
	l.dirty = map[cid.Cid]bool{}
	l.mu.Unlock()
	l.ex.log.Debug("bitswap peer unusable", "peer", l.peer, "err", err)
	for f := range fs {
		f.post(event{kind: evPeerDown, from: l.peer, err: err})
	}
}

var _ bsnetwork.Receiver = (*exchange)(nil)
