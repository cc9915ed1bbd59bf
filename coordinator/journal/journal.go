// Package journal owns how the coordinator's state becomes durable: a
// Journal writes records to the datastore in the order the state changed,
// with group commit, and a Ticket says when a change is durable. It knows
// nothing of what the records mean, and must not import the coordinator.
package journal

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/internal/diskguard"
)

// A Journal writes the coordinator's records to badger in the order the state
// changed, with group commit: every change made while the previous batch
// was being written and synced goes into the next batch, written and
// synced once. A caller that must not answer before its change is durable
// waits on the ticket put returns; others need not.
//
// Ordering: callers call put while holding the coordinator's lock, so the
// journal sees changes in state order; within a batch the last write of a
// key wins; batches are committed one after another. A batch is cut only
// while holding that same lock (swap), so every change made in one
// critical section lands in one batch: after a crash the records are
// those of a moment between two critical sections, never half of one
// (an attempt and its cross-check record, say).
//
// Full disk: a commit refused for want of space (diskguard.IsFull) is not
// an error for good. Its changes stay queued, in front of later ones, and
// are tried again every journalRetry (while the datastore's guard says
// the disk is still full, without cutting a batch); its ticket closes when
// they are written. Meanwhile every wait returns the refusal at once, so
// that nothing is acknowledged that is not durable (a report is answered
// "retry"), and the coordinator keeps running on its state in memory.
type Journal struct {
	ds datastore.Batching
	// prefix is the key prefix synced after each batch.
	prefix datastore.Key
	// swap is the coordinator's lock, held while a batch is cut (nil: none).
	swap sync.Locker
	log  *slog.Logger
	// probe, when set, says whether a write would be refused for want of
	// space now: while it does, held changes are not cut into a new batch.
	probe func() error

	mu      sync.Mutex
	pending map[datastore.Key][]byte // nil value: delete
	order   []datastore.Key
	ticket  *Ticket
	// poison is why the batch being gathered must fail: a record of it
	// could not be encoded (see putJSON).
	poison error
	// held are the tickets of batches that failed for want of space: their
	// changes are back in pending, and they close with the batch that
	// writes them.
	held []*Ticket
	// full is the error of the last commit when it failed for want of
	// space (nil otherwise); fullCh is closed while full is set.
	full   error
	fullCh chan struct{}
	// err is sticky: once a commit failed for another reason than space,
	// every later one fails.
	err     error
	kick    chan struct{}
	done    chan struct{}
	stopped bool
	// commitMu is held from a batch's cut to its commit (see Between).
	commitMu sync.Mutex
}

// journalRetry is how often changes held for want of space are tried again.
const journalRetry = time.Second

// ticket is the promise of one batch: done is closed after the batch is
// durable (or failed, with err set). A batch that failed for want of
// space does not close its ticket: its changes go into the next batch,
// and the ticket closes with that one.
type Ticket struct {
	j    *Journal
	done chan struct{}
	err  error
}

// wait returns once t's batch is durable (nil) or failed, or at once with
// the error of the last commit while the journal holds changes for want
// of space: nobody waits for a full disk to empty.
func (t *Ticket) Wait(ctx context.Context) error {
	if t == nil {
		return nil
	}
	for {
		var full <-chan struct{}
		if t.j != nil {
			var err error
			if full, err = t.j.fullState(); err != nil {
				select {
				case <-t.done:
					return t.err
				default:
					return fmt.Errorf("state not durable yet: %w", err)
				}
			}
		}
		select {
		case <-t.done:
			return t.err
		case <-full:
			// The journal just found the disk full: look again.
		case <-ctx.Done():
			return fmt.Errorf("wait for durable state: %w", ctx.Err())
		}
	}
}

// Option configures a Journal.
type Option func(*Journal)

// WithLock makes the journal cut batches while holding l, the lock its
// callers hold while they change state and call Put: every change of one
// critical section then lands in one batch.
func WithLock(l sync.Locker) Option { return func(j *Journal) { j.swap = l } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(j *Journal) { j.log = l } }

// New starts a journal writing to ds; each batch ends with a sync of the
// keys under prefix.
func New(ds datastore.Batching, prefix datastore.Key, opts ...Option) *Journal {
	j := &Journal{ds: ds, prefix: prefix, log: slog.Default(), pending: make(map[datastore.Key][]byte), kick: make(chan struct{}, 1),
		done: make(chan struct{}), fullCh: make(chan struct{})}
	for _, o := range opts {
		o(j)
	}
	j.ticket = j.newTicket()
	if g, ok := ds.(interface{ Guard() *diskguard.Guard }); ok {
		j.probe = func() error { return g.Guard().Check(0) }
	}
	go j.loop()
	return j
}

func (j *Journal) newTicket() *Ticket { return &Ticket{j: j, done: make(chan struct{})} }

// ErrClosed is the error of a write after Close.
var ErrClosed = errors.New("coordinator state journal is closed")

// put queues a write of v under k and returns the ticket of its batch.
func (j *Journal) Put(k datastore.Key, v []byte) *Ticket { return j.queue(k, v) }

// putJSON queues a write of v, encoded as JSON, under k. A value that
// cannot be encoded is never dropped silently: the batch it should have
// joined fails with the error (so that nothing waiting on that batch is
// acknowledged), and the error is returned.
func (j *Journal) PutJSON(k datastore.Key, v any) (*Ticket, error) {
	b, err := json.Marshal(v)
	if err == nil {
		return j.queue(k, b), nil
	}
	err = fmt.Errorf("encode %s: %w", k, err)
	j.mu.Lock()
	defer j.mu.Unlock()
	j.poison = errors.Join(j.poison, err)
	return j.ticket, err
}

// del queues a delete of k.
func (j *Journal) Delete(k datastore.Key) *Ticket { return j.queue(k, nil) }

func (j *Journal) queue(k datastore.Key, v []byte) *Ticket {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.stopped {
		t := &Ticket{done: make(chan struct{}), err: ErrClosed}
		close(t.done)
		return t
	}
	if _, ok := j.pending[k]; !ok {
		j.order = append(j.order, k)
	}
	j.pending[k] = v
	t := j.ticket
	select {
	case j.kick <- struct{}{}:
	default:
	}
	return t
}

// flush returns a ticket covering everything queued so far.
func (j *Journal) Flush() *Ticket {
	j.mu.Lock()
	defer j.mu.Unlock()
	if len(j.pending) == 0 && !j.stopped {
		// Nothing queued: the last batch is already committed or in flight;
		// an empty batch is cheap and keeps the promise simple.
		select {
		case j.kick <- struct{}{}:
		default:
		}
	}
	return j.ticket
}

// blocked returns the error of the last commit while changes are held for
// want of space, else nil.
func (j *Journal) Blocked() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.full
}

// fullState returns the channel closed when the journal next finds the
// disk full, or the error it found if it is full now.
func (j *Journal) fullState() (<-chan struct{}, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.fullCh, j.full
}

func (j *Journal) loop() {
	defer close(j.done)
	var retry <-chan time.Time
	for {
		select {
		case <-j.kick:
		case <-retry:
		}
		retry = nil
		j.mu.Lock()
		waiting := j.full != nil && !j.stopped
		j.mu.Unlock()
		if waiting && j.probe != nil && j.probe() != nil {
			retry = time.After(journalRetry) // still full: nothing to try
			continue
		}
		j.commitMu.Lock()
		if j.swap != nil {
			j.swap.Lock()
		}
		j.mu.Lock()
		pending, order, t, held, poison := j.pending, j.order, j.ticket, j.held, j.poison
		j.pending, j.order, j.held, j.poison = make(map[datastore.Key][]byte, len(pending)), nil, nil, nil
		j.ticket = j.newTicket()
		stopped := j.stopped
		j.mu.Unlock()
		if j.swap != nil {
			j.swap.Unlock()
		}

		err := j.commit(pending, order)
		j.commitMu.Unlock()
		if err != nil && diskguard.IsFull(err) && !stopped {
			j.hold(pending, order, append(held, t), err, poison)
			retry = time.After(journalRetry)
			continue
		}
		if err != nil && !diskguard.IsFull(err) {
			j.err = err
		}
		j.settled(err, len(order))
		for _, h := range append(held, t) {
			h.err = errors.Join(poison, err)
			close(h.done)
		}
		if stopped {
			return
		}
	}
}

// hold puts the changes of a batch that failed for want of space back in
// front of what was queued since (which wins where it writes the same
// key), with its tickets, and marks the journal full.
func (j *Journal) hold(pending map[datastore.Key][]byte, order []datastore.Key, tickets []*Ticket, err, poison error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.poison = errors.Join(poison, j.poison)
	for _, k := range j.order {
		if _, ok := pending[k]; !ok {
			order = append(order, k)
		}
		pending[k] = j.pending[k]
	}
	j.pending, j.order = pending, order
	j.held = append(tickets, j.held...)
	if j.full == nil {
		close(j.fullCh)
		j.log.Warn("coordinator state not durable: changes held in memory until the disk has space; nothing is acknowledged meanwhile",
			"records", len(order), "err", err)
	}
	j.full = err
}

// settled clears the full mark after a commit that did not fail for want
// of space.
func (j *Journal) settled(err error, records int) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.full == nil {
		return
	}
	j.full = nil
	j.fullCh = make(chan struct{})
	if err == nil {
		j.log.Info("held coordinator state written: the disk has space again", "records", records)
	}
}

func (j *Journal) commit(pending map[datastore.Key][]byte, order []datastore.Key) error {
	if j.err != nil {
		return j.err
	}
	if len(order) == 0 {
		return nil
	}
	ctx := context.Background()
	b, err := j.ds.Batch(ctx)
	if err != nil {
		return fmt.Errorf("journal: start batch: %w", err)
	}
	for _, k := range order {
		if v := pending[k]; v != nil {
			err = b.Put(ctx, k, v)
		} else {
			err = b.Delete(ctx, k)
		}
		if err != nil {
			return fmt.Errorf("journal: write %s: %w", k, err)
		}
	}
	if err := b.Commit(ctx); err != nil {
		return fmt.Errorf("journal: commit %d records: %w", len(order), err)
	}
	if err := j.ds.Sync(ctx, j.prefix); err != nil {
		return fmt.Errorf("journal: sync: %w", err)
	}
	return nil
}

// Between calls f at a moment between two batches: every batch cut
// before it is committed, none is being written. A reader that opens its
// read transaction in f sees the records of a moment between two of the
// coordinator's critical sections, never half of a batch (badger may
// write a large batch as several transactions). f must be quick: commits
// wait for it.
func (j *Journal) Between(f func()) {
	j.commitMu.Lock()
	defer j.commitMu.Unlock()
	f()
}

// close commits what is queued and stops the journal. Changes held for
// want of space are tried once more; if the disk is still full they are
// lost, and were never acknowledged.
func (j *Journal) Close() error {
	j.mu.Lock()
	if j.stopped {
		j.mu.Unlock()
		<-j.done
		return nil
	}
	j.stopped = true
	t := j.ticket
	j.mu.Unlock()
	select {
	case j.kick <- struct{}{}:
	default:
	}
	<-t.done
	<-j.done
	return t.err
}
