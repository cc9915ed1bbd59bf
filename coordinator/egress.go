package coordinator

import (
	"context"
	"errors"
	"net/http"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/coordinator/accounts"
)

// EgressView is an attempt's egress record as the API serves it (GET
// /api/attempts/{id}/egress): what the node's egress proxy saw the
// attempt reach or try to reach, from its counted signed report
// (proto.Report.egress). Nodes sign it; the coordinator checks its bounds
// (proto.ValidateReport) and keeps it in the stored report.
type EgressView struct {
	// Attempt is the attempt as the reader names it (a submitter: its
	// handle).
	Attempt string `json:"attempt"`
	// Hosts are at most 64, most connections, refusals and failures
	// first; Omitted counts the hosts the node left out.
	Hosts   []EgressHostView `json:"hosts"`
	Omitted uint32           `json:"omitted"`
	// Refused is the report's usage.egress_refused: every refusal of the
	// attempt, the ones not tied to a host included.
	Refused uint64 `json:"refused"`
}

// EgressHostView is one host of an egress record.
type EgressHostView struct {
	Host          string `json:"host"`
	Connections   uint64 `json:"connections"`
	Refused       uint64 `json:"refused"`
	Failed        uint64 `json:"failed"`
	BytesSent     uint64 `json:"bytes_sent"`
	BytesReceived uint64 `json:"bytes_received"`
}

// egressOf reads an attempt's egress record from its counted report.
func (c *Coordinator) egressOf(ctx context.Context, a Attempt, name string) (EgressView, error) {
	r, _, err := c.Report(ctx, a.ID)
	if err != nil {
		return EgressView{}, err
	}
	v := EgressView{Attempt: name, Hosts: []EgressHostView{}, Omitted: r.GetEgressHostsOmitted(), Refused: r.GetUsage().GetEgressRefused()}
	for _, h := range r.GetEgress() {
		v.Hosts = append(v.Hosts, EgressHostView{Host: h.GetHost(), Connections: h.GetConnections(), Refused: h.GetRefused(),
			Failed: h.GetFailed(), BytesSent: h.GetBytesSent(), BytesReceived: h.GetBytesReceived()})
	}
	return v, nil
}

// handleEgress serves an attempt's egress record to the admin and to the
// submitters of its group, once the attempt is finished (as its logs).
func (c *Coordinator) handleEgress(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	a, ok := c.attemptOf(w, r, p)
	if !ok || !finishedFor(w, p, a) {
		return
	}
	v, err := c.egressOf(r.Context(), a, r.PathValue("id"))
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		writeJSON(w, http.StatusNotFound, apiError{"no report of this attempt: it has no egress record"})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
	default:
		writeJSON(w, http.StatusOK, v)
	}
}
