package node

import (
	"fmt"
	"time"

	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/sandbox/egress"
)

func fillReport(r *proto.Report, res attemptResult) {
	run := res.run
	r.Outcome = outcomeOf(run.Outcome)
	r.ExitCode = int32(run.ExitCode)
	r.StdoutTail, r.StderrTail = run.Stdout, run.Stderr
	r.Detail = run.Detail
	r.ModelChainHead = res.chainHead
	r.Usage = &proto.Usage{CpuSeconds: run.CPUSeconds, PeakMemoryBytes: run.PeakMemoryBytes, WallMillis: wallMillis(run.Wall),
		PeakPids: run.PeakPids, DiskUsedBytes: run.DiskUsedBytes, EgressRefused: run.EgressRefused}
	r.Outputs = res.outputs
	r.Egress, r.EgressHostsOmitted = egressOf(res.egress)
}

// egressRecord takes the egress records the node's proxy kept of a job
// run as runID: its environment build's (runID-env), when it built one,
// and its own, merged.
func (n *Node) egressRecord(runID string) egress.Record {
	if n.egress == nil {
		return egress.Record{}
	}
	rec, _ := n.egress.TakeRecord(runID)
	if env, ok := n.egress.TakeRecord(runID + "-env"); ok {
		rec = rec.Merge(env)
	}
	return rec
}

// egressOf is an egress record as a report carries it: at most
// proto.MaxReportEgressHosts hosts, names as the proxy recorded them
// (printable), the hosts left out counted.
func egressOf(rec egress.Record) ([]*proto.EgressHost, uint32) {
	out := make([]*proto.EgressHost, 0, min(len(rec.Hosts), proto.MaxReportEgressHosts))
	omitted := rec.Omitted
	for i, h := range rec.Hosts {
		if i >= proto.MaxReportEgressHosts {
			omitted += len(rec.Hosts) - i
			break
		}
		out = append(out, &proto.EgressHost{Host: h.Host, Connections: h.Connections, Refused: h.Refused, Failed: h.Failed,
			BytesSent: h.BytesSent, BytesReceived: h.BytesReceived})
	}
	if len(out) == 0 {
		out = nil
	}
	return out, uint32(min(omitted, 1<<30))
}

// wallMillis is a run's wall time in whole milliseconds, rounded up: a run
// shorter than a millisecond still took time, and a report of 0 ms is one
// the cross-check takes for a lie.
func wallMillis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func outcomeOf(o sandbox.Outcome) proto.Outcome {
	switch o {
	case sandbox.OutcomeOK:
		return proto.Outcome_OUTCOME_OK
	case sandbox.OutcomeAgentError:
		return proto.Outcome_OUTCOME_AGENT_ERROR
	case sandbox.OutcomeTimeout:
		return proto.Outcome_OUTCOME_TIMEOUT
	case sandbox.OutcomeOOM:
		return proto.Outcome_OUTCOME_OOM
	case sandbox.OutcomeOutputLimit:
		return proto.Outcome_OUTCOME_OUTPUT_LIMIT
	case sandbox.OutcomeDiskQuota:
		return proto.Outcome_OUTCOME_DISK_QUOTA
	}
	return proto.Outcome_OUTCOME_INFRA_ERROR
}

// noteReserve is what fitReport frees beyond the excess for the note it
// adds to the report's detail.
const noteReserve = 256

// fitReport shrinks r by at least excess bytes of its encoding, so that a
// sealed report the coordinator would refuse as too large (it reads at most
// proto.MaxReportEnvelopeSize) becomes one it reads: outputs travel by
// content address, so only the log tails can be large, and they are cut,
// keeping their last bytes, stderr first. The cut is noted in the report.
// It reports whether it could shrink r by excess.
func fitReport(r *proto.Report, excess int) bool {
	if excess <= 0 {
		return true
	}
	need := excess + noteReserve
	before := len(r.StdoutTail) + len(r.StderrTail)
	for _, tail := range []*[]byte{&r.StderrTail, &r.StdoutTail} {
		cut := min(len(*tail), need)
		*tail = (*tail)[cut:]
		need -= cut
	}
	if after := len(r.StdoutTail) + len(r.StderrTail); after < before {
		note := fmt.Sprintf("report over the %d byte limit: log tails cut by %d bytes", proto.MaxReportEnvelopeSize, before-after)
		if r.Detail != "" {
			note = r.Detail + "; " + note
		}
		r.Detail = note
	}
	return need <= 0
}
