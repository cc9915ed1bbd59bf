package coordinator

import (
	"context"
	"time"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/journal"
)

// Every change of the coordinator's state is one event through the core:
// under c.mu the core applies it (core.State.Step) and the journal queues
// the records it changed, in the same critical section, so that a batch
// never holds half of a step. Outside the lock the effects are carried
// out, offers only once the records that say so are durable, and the
// event's answer is given only once what it answers for is durable.

// stepLocked applies ev now and queues its records; callers hold c.mu. The
// ticket is nil when the step wrote nothing.
func (c *Coordinator) stepLocked(ev core.Event) (core.Effects, *journal.Ticket) {
	fx := c.state.Step(time.Now(), ev)
	return fx, c.write(fx.Records)
}

// step applies ev, carries out its effects and returns them with the
// ticket of its records (nil: none).
func (c *Coordinator) step(ctx context.Context, ev core.Event) (core.Effects, *journal.Ticket) {
	c.mu.Lock()
	fx, t := c.stepLocked(ev)
	c.mu.Unlock()
	c.carry(ctx, fx, t)
	return fx, t
}

// write queues the records of a step in the journal; callers hold c.mu.
// A record that cannot be encoded fails its batch (journal.PutJSON):
// whoever waits on it, an acknowledgement among them, gets the error.
func (c *Coordinator) write(recs []core.Record) *journal.Ticket {
	var t *journal.Ticket
	for _, r := range recs {
		k := datastore.NewKey(r.Key)
		switch {
		case r.Raw != nil:
			t = c.journal.Put(k, r.Raw)
		case r.Value != nil:
			var err error
			if t, err = c.journal.PutJSON(k, r.Value); err != nil {
				c.log.Error("state record not written; its batch fails", "key", k, "err", err)
			}
		default:
			t = c.journal.Delete(k)
		}
	}
	return t
}

// durable waits until t is durable; with t nil, until everything queued
// so far is (what the answer relies on was written by an earlier step).
func (c *Coordinator) durable(ctx context.Context, t *journal.Ticket) error {
	if t == nil {
		t = c.journal.Flush()
	}
	return t.Wait(ctx)
}

// carry carries out a step's effects: offers (each on its own goroutine,
// once the records that assign them are durable; if they cannot be made
// durable the placements are taken back, never offered), scoring jobs,
// and a scheduling round when asked for.
func (c *Coordinator) carry(ctx context.Context, fx core.Effects, t *journal.Ticket) {
	if len(fx.Offers) > 0 {
		offers := fx.Offers
		c.goLoop(func() {
			if err := c.durable(ctx, t); err != nil {
				if ctx.Err() != nil {
					return // stopping: the restart restores them
				}
				c.log.Error("assignments not durable; not offered, requeued", "count", len(offers), "err", err)
				for _, o := range offers {
					c.step(ctx, core.OfferAnswered{Attempt: o.Attempt, Node: o.Node, NotDurable: err.Error()})
				}
				return
			}
			for _, o := range offers {
				c.goLoop(func() { c.dispatch(ctx, o) })
			}
		})
	}
	for _, j := range fx.Scores {
		c.scoring.add(j)
	}
	for _, j := range fx.Judges {
		c.scoring.add(core.ScoreJob{Attempt: judgePrefix + j.Attempt})
	}
	if fx.Wake {
		c.kick()
	}
}
