package node

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
)

// reportMargin is what fitReport removes beyond the excess of a report.
const reportMargin = 4 << 10

// outboxEntry is a sealed report waiting for its coordinator's ack.
type outboxEntry struct {
	Coordinator string `json:"coordinator"`
	Envelope    []byte `json:"envelope"`
}

// enqueueReport signs r and stores it durably in the outbox; the deliver
// loop sends it until the coordinator acknowledges it. When the data
// folder has no room (diskguard), the report is kept in memory instead,
// delivered from there and stored as soon as there is room: it is lost
// only if the node stops before either.
func (n *Node) enqueueReport(ctx context.Context, coord peer.ID, r *proto.Report) error {
	env, err := proto.SealReport(r, n.key)
	if err != nil {
		return err
	}
	// The coordinator refuses a larger envelope unread: shrink the report
	// until it fits, or it could never be delivered. The margin covers
	// the notes fitReport adds.
	for tries := 0; len(env) > proto.MaxReportEnvelopeSize; tries++ {
		if tries == 3 || !fitReport(r, len(env)-proto.MaxReportEnvelopeSize+reportMargin) {
			return fmt.Errorf("report %s: %d bytes sealed, over the %d byte limit, and cannot be shrunk", r.GetAttemptId(), len(env), proto.MaxReportEnvelopeSize)
		}
		n.log.Warn("report shrunk to fit the envelope limit", "attempt", r.GetAttemptId(), "bytes", len(env), "detail", r.GetDetail())
		if env, err = proto.SealReport(r, n.key); err != nil {
			return err
		}
	}
	b, err := json.Marshal(outboxEntry{Coordinator: coord.String(), Envelope: env})
	if err != nil {
		return fmt.Errorf("encode outbox entry: %w", err)
	}
	// One entry per coordinator and attempt: attempt IDs are each
	// coordinator's own.
	key := datastore.NewKey(coord.String()).ChildString(r.GetAttemptId())
	if err := n.storeReport(ctx, key, b); err != nil {
		if !fullDisk(err) {
			return err
		}
		n.unsaved.hold(key, b)
		n.log.Warn("no room to store the report: kept in memory until it is stored or delivered", "attempt", r.GetAttemptId(), "err", err)
	}
	n.signal(n.deliverNow)
	return nil
}

// storeReport puts an outbox entry and syncs it.
func (n *Node) storeReport(ctx context.Context, key datastore.Key, entry []byte) error {
	if err := n.outbox.Put(ctx, key, entry); err != nil {
		return fmt.Errorf("store report %s in outbox: %w", key.BaseNamespace(), err)
	}
	if err := n.outbox.Sync(ctx, key); err != nil {
		return fmt.Errorf("sync outbox: %w", err)
	}
	return nil
}

// Pending counts the reports not yet acknowledged: in the outbox, or held
// in memory for want of room.
func (n *Node) Pending(ctx context.Context) (int, error) {
	res, err := n.outbox.Query(ctx, query.Query{KeysOnly: true})
	if err != nil {
		return 0, err
	}
	all, err := res.Rest()
	if err != nil {
		return 0, err
	}
	count := len(all)
	for _, e := range n.unsaved.entries() {
		if !slices.ContainsFunc(all, func(s query.Entry) bool { return s.Key == e.Key }) {
			count++
		}
	}
	return count, nil
}

func (n *Node) deliverLoop(ctx context.Context) {
	backoff := time.Second
	for {
		failed := n.deliverAll(ctx)
		wait := 30 * time.Second
		if failed {
			wait, backoff = backoff, min(2*backoff, 10*time.Second)
		} else {
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return
		case <-n.deliverNow:
		case <-time.After(wait):
		}
	}
}

// deliverAll tries every outbox entry once; it reports whether any
// delivery failed for a reason worth retrying.
func (n *Node) deliverAll(ctx context.Context) (retry bool) {
	n.saveUnsaved(ctx)
	res, err := n.outbox.Query(ctx, query.Query{})
	if err != nil {
		n.log.Error("read outbox", "err", err)
		return true
	}
	entries, err := res.Rest()
	if err != nil {
		n.log.Error("read outbox", "err", err)
		return true
	}
	for _, e := range n.unsaved.entries() {
		if !slices.ContainsFunc(entries, func(s query.Entry) bool { return s.Key == e.Key }) {
			entries = append(entries, e)
		}
	}
	for _, e := range entries {
		var ob outboxEntry
		if err := json.Unmarshal(e.Value, &ob); err != nil {
			n.log.Error("corrupt outbox entry dropped", "key", e.Key, "err", err)
			_ = n.removeReport(ctx, datastore.NewKey(e.Key))
			continue
		}
		coord, err := peer.Decode(ob.Coordinator)
		if err != nil {
			n.log.Error("outbox entry names no valid coordinator; dropped", "key", e.Key, "err", err)
			_ = n.removeReport(ctx, datastore.NewKey(e.Key))
			continue
		}
		ack, err := n.deliver(ctx, coord, ob.Envelope)
		if err != nil {
			n.log.Warn("report not delivered; will retry", "attempt", e.Key, "err", err)
			retry = true
			continue
		}
		switch {
		case ack.GetRetry():
			n.log.Warn("coordinator could not record the report yet; will retry", "attempt", e.Key, "err", ack.GetError())
			retry = true
			continue
		case !ack.GetAccepted():
			// The coordinator read it and said no: retrying cannot help.
			n.log.Error("report refused by coordinator; dropped", "attempt", e.Key, "err", ack.GetError())
		default:
			n.log.Info("report delivered", "attempt", ack.GetAttemptId(), "duplicate", ack.GetDuplicate(), "late", ack.GetLate())
			if !ack.GetDuplicate() && !ack.GetLate() {
				n.credit(ctx, ob.Envelope)
			}
		}
		if err := n.removeReport(ctx, datastore.NewKey(e.Key)); err != nil {
			// Sent again later: the coordinator acknowledges it as a duplicate.
			n.log.Error("remove delivered report from outbox", "attempt", e.Key, "err", err)
			retry = true
		}
		// The coordinator has its outputs (or will never ask): the cache
		// may evict them.
		if r, _, err := proto.OpenReport(ob.Envelope); err == nil {
			n.unpinOutputs(r.GetOutputs())
		}
	}
	return retry
}

// outputBytes is the size of the outputs a sealed report names.
func outputBytes(envelope []byte) int {
	r, _, err := proto.OpenReport(envelope)
	if err != nil {
		return 0
	}
	var n uint64
	for _, o := range r.GetOutputs() {
		n += o.GetSize()
	}
	return int(min(n, 1<<40))
}

func (n *Node) deliver(ctx context.Context, coord peer.ID, envelope []byte) (*proto.ReportAck, error) {
	// The coordinator reads the envelope at p2phost's minimum pace, and
	// fetches the outputs it names before it answers.
	wait := 30*time.Second + p2phost.Budget(len(envelope)) + p2phost.Budget(outputBytes(envelope))
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	s, err := n.host.NewStream(ctx, coord, proto.ReportProtocol)
	if err != nil {
		return nil, fmt.Errorf("open report stream: %w", err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(wait))
	if err := proto.WriteFrame(s, envelope); err != nil {
		s.Reset()
		return nil, err
	}
	var ack proto.ReportAck
	if err := proto.ReadMsg(s, &ack, proto.MaxControlSize); err != nil {
		s.Reset()
		return nil, err
	}
	return &ack, nil
}
