package egress

import (
	"cmp"
	"io"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// The egress record of an attempt: per host it asked for, the tunnels and
// plain requests carried, those refused and those that failed upstream,
// and the bytes each way. A session counts as the bytes flow; when it is
// closed the Proxy keeps its Record until the node takes it for the
// attempt's report (TakeRecord).

const (
	// MaxRecordHosts is how many hosts a Record keeps: those with the
	// most connections, refusals and failures (then bytes).
	MaxRecordHosts = 64
	// maxTrackedHosts bounds the hosts a session counts one by one; the
	// hosts past it are only counted (Record.Omitted).
	maxTrackedHosts = 4096
	// maxKeptRecords bounds the records of closed sessions the Proxy keeps
	// until taken; the oldest go first.
	maxKeptRecords = 256
	// InvalidHost names, in a record, requests that named no host name
	// nor address (a malformed request).
	InvalidHost = "(invalid)"
	// ConnectionLimitHost names, in a record, client connections closed
	// for going over Config.MaxConns (their destination is not known).
	ConnectionLimitHost = "(connection-limit)"
)

// HostRecord is what an attempt exchanged with one host.
type HostRecord struct {
	// Host is the name asked for, lower case without a trailing dot; an
	// address literal (refused) as the address; InvalidHost or
	// ConnectionLimitHost.
	Host string `json:"host"`
	// Connections counts the tunnels and plain requests carried, Refused
	// those refused, Failed those allowed whose lookup or upstream failed.
	Connections uint64 `json:"connections"`
	Refused     uint64 `json:"refused,omitempty"`
	Failed      uint64 `json:"failed,omitempty"`
	// BytesSent is what the attempt sent the host (tunnel bytes and
	// request bodies), BytesReceived what it got back (tunnel bytes and
	// response bodies).
	BytesSent     uint64 `json:"bytes_sent"`
	BytesReceived uint64 `json:"bytes_received"`
}

// Record is an attempt's egress record.
type Record struct {
	// Hosts are at most MaxRecordHosts, most connections, refusals and
	// failures first, then most bytes, then by name.
	Hosts []HostRecord `json:"hosts"`
	// Omitted counts the hosts left out of Hosts (past the 4,096 hosts a
	// session tracks, each request to a further host counts one).
	Omitted int `json:"omitted,omitempty"`
}

// Merge adds o's hosts to r's (an attempt's environment build and its run)
// and keeps the top MaxRecordHosts.
func (r Record) Merge(o Record) Record {
	by := map[string]*HostRecord{}
	var all []*HostRecord
	for _, h := range slices.Concat(r.Hosts, o.Hosts) {
		if x := by[h.Host]; x != nil {
			x.Connections += h.Connections
			x.Refused += h.Refused
			x.Failed += h.Failed
			x.BytesSent += h.BytesSent
			x.BytesReceived += h.BytesReceived
			continue
		}
		c := h
		by[h.Host] = &c
		all = append(all, &c)
	}
	return topHosts(all, r.Omitted+o.Omitted)
}

// topHosts sorts hosts and keeps MaxRecordHosts of them.
func topHosts(all []*HostRecord, omitted int) Record {
	slices.SortFunc(all, func(a, b *HostRecord) int {
		return cmp.Or(cmp.Compare(b.Connections+b.Refused+b.Failed, a.Connections+a.Refused+a.Failed),
			cmp.Compare(b.BytesSent+b.BytesReceived, a.BytesSent+a.BytesReceived), cmp.Compare(a.Host, b.Host))
	})
	out := Record{Hosts: make([]HostRecord, 0, min(len(all), MaxRecordHosts)), Omitted: omitted}
	for i, h := range all {
		if i >= MaxRecordHosts {
			out.Omitted += len(all) - i
			break
		}
		out.Hosts = append(out.Hosts, *h)
	}
	return out
}

// hostCounts is one host's live counters.
type hostCounts struct {
	connections, refused, failed, sent, received atomic.Uint64
}

// recorder counts a session's hosts.
type recorder struct {
	mu      sync.Mutex
	hosts   map[string]*hostCounts
	omitted int
}

// recordName is how a host asked for appears in a record: a valid name
// lower case, an address literal as the address, anything else
// InvalidHost (never the client's raw bytes).
func recordName(host string) string {
	name := strings.TrimSuffix(strings.ToLower(host), ".")
	if checkName(name) == nil {
		return name
	}
	if a, err := netip.ParseAddr(strings.Trim(name, "[]")); err == nil {
		return a.Unmap().String()
	}
	return InvalidHost
}

// of returns host's counters, or nil once maxTrackedHosts are counted and
// host is not one of them (then it is counted as omitted).
func (r *recorder) of(host string) *hostCounts {
	name := recordName(host)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.hosts == nil {
		r.hosts = map[string]*hostCounts{}
	}
	h := r.hosts[name]
	if h == nil {
		if len(r.hosts) >= maxTrackedHosts {
			r.omitted++
			return nil
		}
		h = &hostCounts{}
		r.hosts[name] = h
	}
	return h
}

func (r *recorder) count(host string, field func(*hostCounts) *atomic.Uint64, n uint64) {
	if h := r.of(host); h != nil {
		field(h).Add(n)
	}
}

func connections(h *hostCounts) *atomic.Uint64 { return &h.connections }
func refusals(h *hostCounts) *atomic.Uint64    { return &h.refused }
func failures(h *hostCounts) *atomic.Uint64    { return &h.failed }

// record is the session's record so far.
func (r *recorder) record() Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	all := make([]*HostRecord, 0, len(r.hosts))
	for name, h := range r.hosts {
		all = append(all, &HostRecord{Host: name, Connections: h.connections.Load(), Refused: h.refused.Load(),
			Failed: h.failed.Load(), BytesSent: h.sent.Load(), BytesReceived: h.received.Load()})
	}
	return topHosts(all, r.omitted)
}

// countingWriter counts what passes into w.
type countingWriter struct {
	w io.Writer
	n *atomic.Uint64
}

func (c countingWriter) Write(p []byte) (int, error) {
	k, err := c.w.Write(p)
	c.n.Add(uint64(max(k, 0)))
	return k, err
}

// countingReader counts what is read from r.
type countingReader struct {
	r io.ReadCloser
	n *atomic.Uint64
}

func (c countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n.Add(uint64(max(k, 0)))
	return k, err
}

func (c countingReader) Close() error { return c.r.Close() }

// countingResponse counts the bytes of a response body written to the
// client; Unwrap lets http.ResponseController reach the flusher.
type countingResponse struct {
	http.ResponseWriter
	n *atomic.Uint64
}

func (c countingResponse) Write(p []byte) (int, error) {
	k, err := c.ResponseWriter.Write(p)
	c.n.Add(uint64(max(k, 0)))
	return k, err
}

func (c countingResponse) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// kept holds the records of closed sessions until taken.
type kept struct {
	mu      sync.Mutex
	records map[string]Record
	order   []string
}

func (k *kept) put(attempt string, r Record) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.records == nil {
		k.records = map[string]Record{}
	}
	if _, ok := k.records[attempt]; !ok {
		k.order = append(k.order, attempt)
	}
	k.records[attempt] = r
	for len(k.order) > maxKeptRecords {
		delete(k.records, k.order[0])
		k.order = k.order[1:]
	}
}

func (k *kept) take(attempt string) (Record, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	r, ok := k.records[attempt]
	if ok {
		delete(k.records, attempt)
		k.order = slices.DeleteFunc(k.order, func(a string) bool { return a == attempt })
	}
	return r, ok
}

// TakeRecord returns the egress record of attempt's closed session (the
// attempt's ID as ServeAttempt was given it) and forgets it; false when
// there is none (no proxy-mode session, not closed yet, taken already, or
// one of more than 256 untaken since).
func (p *Proxy) TakeRecord(attempt string) (Record, bool) { return p.kept.take(attempt) }
