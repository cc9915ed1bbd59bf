package coordinator

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/journal"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
)

// handleReport receives one signed report envelope and answers with an ack.
// The envelope must arrive at p2phost's minimum pace.
func (c *Coordinator) handleReport(s network.Stream) {
	defer s.Close()
	data, err := proto.ReadFrame(p2phost.Paced(s, p2phost.ReadGrace), proto.MaxReportEnvelopeSize)
	var ack *proto.ReportAck
	if err != nil {
		ack = &proto.ReportAck{Error: fmt.Sprintf("read report: %v", err)}
	} else {
		ack = c.Ingest(context.Background(), data)
	}
	if !ack.GetAccepted() {
		c.log.Warn("report rejected", "from", s.Conn().RemotePeer(), "attempt", ack.GetAttemptId(), "err", ack.GetError())
	}
	_ = s.SetWriteDeadline(time.Now().Add(30 * time.Second))
	if err := proto.WriteMsg(s, ack); err != nil {
		s.Reset()
	}
}

// Ingest verifies and records one signed report envelope, and answers only
// once what it recorded is durable. It is idempotent by attempt ID and
// report digest: the same report delivered twice (before or after a
// restart) is acknowledged twice and recorded once.
//
// A report is rejected, with the reason in the ack, when its envelope does
// not verify, when a number or list in it is out of bounds
// (proto.ValidateReport), or when the core refuses it (its signer was
// never given the attempt, say; see core.ReportArrived). The core decides
// whether it counts, is late (kept apart, within bounds, never counted),
// an infrastructure failure (requeued, never scored) or a duplicate.
//
// The outputs of a report that counts are fetched from its node by CID
// (bitswap verifies every block), bounded by the recipe, and kept before
// anything is recorded or acknowledged: a node keeps them until then. The
// report is then recorded, acknowledged once durable, and scored by a
// worker afterwards (score.go).
//
// The ack says nothing of the verdict: a canary, a replica that agrees
// and one that will be caught lying are acknowledged alike.
func (c *Coordinator) Ingest(ctx context.Context, envelope []byte) *proto.ReportAck {
	// Verify without the lock: signature, domain, payload type, and that
	// the node the report names is its signer. Every number and list the
	// signature cannot vouch for is checked before anything of it is kept
	// (the core refuses an invalid report once it knows who sent it for
	// what).
	r, signer, err := proto.OpenReport(envelope)
	if err != nil {
		return &proto.ReportAck{Error: fmt.Sprintf("report rejected: %v", err)}
	}
	id := r.GetAttemptId()
	notRecorded := func(format string, args ...any) *proto.ReportAck {
		return &proto.ReportAck{AttemptId: id, Retry: true, Error: fmt.Sprintf("report for attempt %q not recorded: ", id) +
			fmt.Sprintf(format, args...)}
	}
	if err := c.writable(); err != nil { // the disk is full: the node keeps the report and sends it again
		return notRecorded("%v", err)
	}
	ev := core.ReportArrived{Attempt: id, Node: signer.String(), Digest: reportDigest(r), Outcome: outcomeName(r.GetOutcome()),
		Detail: r.GetDetail(), Evidence: evidenceOf(r), Envelope: envelope,
		Usage: core.Usage{CPUSeconds: r.GetUsage().GetCpuSeconds(), PeakMemoryBytes: r.GetUsage().GetPeakMemoryBytes(),
			WallMillis: r.GetUsage().GetWallMillis()}}
	if err := proto.ValidateReport(r); err != nil {
		ev = core.ReportArrived{Attempt: id, Node: ev.Node, Digest: ev.Digest, Invalid: err.Error()}
	}
	fx, t := c.step(ctx, ev)
	if _, counts := fx.Reply.(core.ReportCounts); counts {
		bounds, err := c.outputBounds(id)
		if err != nil {
			return notRecorded("%v", err)
		}
		ev.Outputs, err = c.fetchOutputs(ctx, signer, r.GetOutputs(), bounds)
		if err != nil {
			c.log.Warn("outputs not fetched; node asked to retry", "attempt", id, "node", signer, "err", err)
			return notRecorded("outputs not fetched: %v", err)
		}
		c.mu.Lock()
		lease := c.state.LeaseOf(id, ev.Node)
		c.mu.Unlock()
		if ev.Model, err = c.modelUse(ctx, id, lease); err != nil {
			return notRecorded("model calls: %v", err)
		}
		// Another report may have counted meanwhile: the core looks again.
		ev.Fetched = true
		fx, t = c.step(ctx, ev)
	}
	return c.answer(ctx, id, fx.Reply, t)
}

// answer turns the core's reply to a report into its ack, once what it
// answers for is durable.
func (c *Coordinator) answer(ctx context.Context, id string, reply any, t *journal.Ticket) *proto.ReportAck {
	ack := &proto.ReportAck{AttemptId: id, Accepted: true}
	switch r := reply.(type) {
	case core.ReportRefused:
		return &proto.ReportAck{AttemptId: id, Error: fmt.Sprintf("report for attempt %q rejected: %s", id, r.Reason)}
	case core.ReportDuplicate:
		ack.Duplicate = true
	case core.ReportKept:
		ack.Late = r.Late
	case core.ReportRecorded:
	default:
		return &proto.ReportAck{AttemptId: id, Retry: true, Error: fmt.Sprintf("report for attempt %q not recorded: %T", id, reply)}
	}
	if err := c.durable(ctx, t); err != nil {
		c.log.Error("report not durable; node asked to retry", "attempt", id, "err", err)
		return &proto.ReportAck{AttemptId: id, Retry: true, Error: fmt.Sprintf("report for attempt %q not recorded: %v", id, err)}
	}
	return ack
}

// outputBounds are the outputs an attempt's recipe asks for, by path,
// with the most bytes each may hold.
func (c *Coordinator) outputBounds(id string) (map[string]uint64, error) {
	_, r, err := c.jobRecipe(id)
	if err != nil {
		return nil, err
	}
	bounds := map[string]uint64{}
	for _, o := range r.GetOutputs() {
		bounds[o.GetPath()] = o.GetMaxBytes()
	}
	return bounds, nil
}

// ReportDigest is the digest a report is recorded under: the hex SHA-256
// of its deterministic protobuf encoding.
func ReportDigest(r *proto.Report) string { return reportDigest(r) }

func reportDigest(r *proto.Report) string {
	b, _ := gproto.MarshalOptions{Deterministic: true}.Marshal(r)
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func outcomeName(o proto.Outcome) string {
	switch o {
	case proto.Outcome_OUTCOME_OK:
		return "ok"
	case proto.Outcome_OUTCOME_AGENT_ERROR:
		return "agent_error"
	case proto.Outcome_OUTCOME_TIMEOUT:
		return "timeout"
	case proto.Outcome_OUTCOME_OOM:
		return "oom"
	case proto.Outcome_OUTCOME_DISK_QUOTA:
		return "disk_quota"
	case proto.Outcome_OUTCOME_OUTPUT_LIMIT:
		return "output_limit"
	case proto.Outcome_OUTCOME_INFRA_ERROR:
		return "infra_error"
	}
	return "unspecified"
}

// evidenceOf is what a report says about how its attempt ran, for the
// cross-check's plausibility checks. The times are the container run's:
// it ended when the report says the attempt finished and lasted its
// reported wall time; its start is clipped to the attempt's reported
// start (fetching the capsule and the image comes first and may take
// long), so that a run longer than the attempt it belongs to is caught
// as a contradiction. CIDs that do not parse are kept as hex, so that
// they differ from the assigned ones.
func evidenceOf(r *proto.Report) crosscheck.Evidence {
	wall := r.GetUsage().GetWallMillis()
	inputs := make([]string, len(r.GetInputCids()))
	for i, b := range r.GetInputCids() {
		inputs[i] = cidString(b)
	}
	return crosscheck.Evidence{
		Outcome:        outcomeName(r.GetOutcome()),
		ImageCID:       cidString(r.GetImageCid()),
		InputCIDs:      inputs,
		StartedMillis:  max(r.GetStartedUnixMillis(), r.GetFinishedUnixMillis()-wall),
		FinishedMillis: r.GetFinishedUnixMillis(),
		WallSeconds:    float64(wall) / 1000,
		CPUSeconds:     r.GetUsage().GetCpuSeconds(),
		LogBytes:       len(r.GetStdoutTail()) + len(r.GetStderrTail()),
		ChainHead:      r.GetModelChainHead(),
	}
}

func cidString(b []byte) string {
	c, err := cid.Cast(b)
	if err != nil {
		return "invalid:" + hex.EncodeToString(b)
	}
	return c.String()
}

// Report returns the recorded report of an attempt, re-verified from its
// stored envelope, with the peer that signed it.
func (c *Coordinator) Report(ctx context.Context, attemptID string) (*proto.Report, peer.ID, error) {
	env, err := c.ReportEnvelope(ctx, attemptID)
	if err != nil {
		return nil, "", err
	}
	return proto.OpenReport(env)
}

// LateReport returns a recorded late report of an attempt by its digest,
// re-verified from its stored envelope.
func (c *Coordinator) LateReport(ctx context.Context, attemptID, digest string) (*proto.Report, peer.ID, error) {
	env, err := c.ds.Get(ctx, datastore.NewKey(core.LateReportKey(attemptID, digest)))
	if err != nil {
		return nil, "", fmt.Errorf("late report %s of attempt %q: %w", digest, attemptID, err)
	}
	return proto.OpenReport(env)
}

// ReportEnvelope returns the stored signed envelope of an attempt's recorded report.
func (c *Coordinator) ReportEnvelope(ctx context.Context, attemptID string) ([]byte, error) {
	if err := proto.ValidateAttemptID(attemptID); err != nil {
		return nil, err
	}
	env, err := c.ds.Get(ctx, datastore.NewKey(core.ReportKey(attemptID)))
	if err != nil {
		return nil, fmt.Errorf("report of attempt %q: %w", attemptID, err)
	}
	return env, nil
}
