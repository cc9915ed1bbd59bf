package node

import (
	"bytes"
	"context"
	"encoding/json"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-datastore"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/proto"
)

// The volunteer's view of its node (StatusHandler, StatusPage; `repronet
// node status`, and the --metrics address's / and /status): its slots,
// the attempts it runs with their phase, elapsed time and limits, its
// capsule cache and data folder, its outbox, the egress its proxy refused
// jobs, and the credit it earned:
// the CPU and wall-clock time of the reports its coordinators accepted,
// kept in its datastore across restarts.

// Status is what a volunteer sees of its node.
type Status struct {
	Peer         string        `json:"peer"`
	Incarnation  uint64        `json:"incarnation"`
	Coordinators []CoordStatus `json:"coordinators"`
	TotalSlots   int           `json:"total_slots"`
	FreeSlots    int           `json:"free_slots"`
	// Draining: the node takes no new work (repronet node drain, or it is
	// stopping).
	Draining bool        `json:"draining,omitempty"`
	Running  []Running   `json:"running"`
	Cache    CacheStatus `json:"cache"`
	Disk     DiskStatus  `json:"disk"`
	// Outbox counts reports not yet acknowledged (Unsaved: held in
	// memory for want of room).
	Outbox  int `json:"outbox"`
	Unsaved int `json:"unsaved"`
	// Finished counts attempts run to a report since start, by outcome.
	Finished map[string]int `json:"finished"`
	Credit   Credit         `json:"credit"`
	// EgressRefused counts the requests and connections the egress proxy
	// refused this node's jobs since start (each is also logged with its
	// attempt).
	EgressRefused uint64 `json:"egress_refused"`
}

// CoordStatus is one coordinator this node serves.
type CoordStatus struct {
	Peer      string `json:"peer"`
	Connected bool   `json:"connected"`
}

// Running is an attempt this node runs.
type Running struct {
	Attempt     string    `json:"attempt"`
	Coordinator string    `json:"coordinator"`
	Suite       string    `json:"suite"`
	Group       string    `json:"group,omitempty"`
	Label       string    `json:"label,omitempty"`
	Phase       string    `json:"phase"`
	Started     time.Time `json:"started"`
	Elapsed     float64   `json:"elapsed_seconds"`
	CPUMillis   uint32    `json:"cpu_millis"`
	MemoryBytes uint64    `json:"memory_bytes"`
	WallSeconds uint32    `json:"wall_seconds"`
	DiskBytes   uint64    `json:"disk_bytes,omitempty"`
	Network     string    `json:"network"`
	Allow       []string  `json:"allow,omitempty"`
}

// CacheStatus is the capsule cache.
type CacheStatus struct {
	UsedBytes  int64 `json:"used_bytes"`
	QuotaBytes int64 `json:"quota_bytes"`
	Capsules   int   `json:"capsules"`
}

// DiskStatus is the data folder's filesystem.
type DiskStatus struct {
	FreeBytes    uint64 `json:"free_bytes"`
	ReserveBytes uint64 `json:"reserve_bytes"`
	TotalBytes   uint64 `json:"total_bytes"`
	Full         bool   `json:"full"`
}

// Credit is what the node contributed: the reports its coordinators
// accepted (never duplicates or late ones), with their CPU and wall time.
type Credit struct {
	Reports     int     `json:"reports"`
	CPUSeconds  float64 `json:"cpu_seconds"`
	WallSeconds float64 `json:"wall_seconds"`
	CPUHours    float64 `json:"cpu_hours"`
}

// trackedRun is an attempt running here, for the status.
type trackedRun struct {
	coord   peer.ID
	asg     *proto.Assignment
	phase   *phase
	started time.Time
}

// track notes an attempt running (until the func it returns is called).
func (n *Node) track(coord peer.ID, a *proto.Assignment, ph *phase) func() {
	key := runKey{coord, a.GetAttemptId()}
	n.mu.Lock()
	if n.tracked == nil {
		n.tracked = map[runKey]*trackedRun{}
	}
	n.tracked[key] = &trackedRun{coord: coord, asg: a, phase: ph, started: time.Now()}
	n.mu.Unlock()
	return func() {
		n.mu.Lock()
		delete(n.tracked, key)
		n.mu.Unlock()
	}
}

// creditKey holds the node's credit.
var creditKey = datastore.NewKey("/status/credit")

// credit adds an accepted report to the node's credit.
func (n *Node) credit(ctx context.Context, envelope []byte) {
	r, _, err := proto.OpenReport(envelope)
	if err != nil {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	c := n.readCredit(ctx)
	c.Reports++
	c.CPUSeconds += r.GetUsage().GetCpuSeconds()
	c.WallSeconds += float64(r.GetUsage().GetWallMillis()) / 1000
	b, _ := json.Marshal(c)
	if err := n.ds.Put(ctx, creditKey, b); err != nil {
		n.log.Warn("credit not recorded", "attempt", r.GetAttemptId(), "err", err)
	}
}

func (n *Node) readCredit(ctx context.Context) Credit {
	var c Credit
	if b, err := n.ds.Get(ctx, creditKey); err == nil {
		_ = json.Unmarshal(b, &c)
	}
	c.CPUHours = c.CPUSeconds / 3600
	return c
}

// Status is the node's status now.
func (n *Node) Status(ctx context.Context) Status {
	a := n.Announcement()
	st := Status{Peer: n.host.ID().String(), Incarnation: n.incarnation, TotalSlots: n.cfg.Slots,
		FreeSlots: int(a.GetFreeSlots()), Finished: map[string]int{}, Running: []Running{}, Draining: n.Draining()}
	for _, c := range n.coords {
		st.Coordinators = append(st.Coordinators, CoordStatus{Peer: c.ID.String(), Connected: len(n.host.Network().ConnsToPeer(c.ID)) > 0})
	}
	now := time.Now()
	n.mu.Lock()
	for o, k := range n.finished {
		st.Finished[strings.TrimPrefix(strings.ToLower(o.String()), "outcome_")] = k
	}
	for _, t := range n.tracked {
		l := t.asg.GetRecipe().GetLimits()
		st.Running = append(st.Running, Running{Attempt: t.asg.GetAttemptId(), Coordinator: t.coord.String(), Suite: t.asg.GetSuite(),
			Group: t.asg.GetGroup(), Label: t.asg.GetLabel(), Phase: t.phase.get(), Started: t.started.UTC(),
			Elapsed: now.Sub(t.started).Seconds(), CPUMillis: l.GetCpuMillis(), MemoryBytes: l.GetMemoryBytes(),
			WallSeconds: l.GetWallSeconds(), DiskBytes: l.GetDiskBytes(), Network: cmpOr(l.GetNetwork(), "none"), Allow: l.GetAllow()})
	}
	st.Cache.Capsules = len(n.cached)
	st.Credit = n.readCredit(ctx)
	n.mu.Unlock()
	slices.SortFunc(st.Running, func(x, y Running) int { return x.Started.Compare(y.Started) })
	st.Cache.UsedBytes, st.Cache.QuotaBytes = n.store.Usage()
	d := n.disk.Status()
	st.Disk = DiskStatus{FreeBytes: d.Free, ReserveBytes: d.Reserve, TotalBytes: d.Total, Full: d.Low}
	if p, err := n.Pending(ctx); err == nil {
		st.Outbox = p
	}
	st.Unsaved = n.unsaved.len()
	st.EgressRefused = n.egressRefused.Load()
	return st
}

func cmpOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// StatusHandler serves the status as JSON.
func (n *Node) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := json.MarshalIndent(n.Status(r.Context()), "", "  ")
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write(append(b, '\n'))
	})
}

// StatusPage serves the status as a small page (no script, reloads every
// 5 seconds).
func (n *Node) StatusPage() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var buf bytes.Buffer
		if err := statusPage.Execute(&buf, n.Status(r.Context())); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'")
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Write(buf.Bytes())
	})
}

var statusPage = template.Must(template.New("status").Funcs(template.FuncMap{
	"mib": func(v any) string {
		switch x := v.(type) {
		case int64:
			return formatMiB(float64(x))
		case uint64:
			return formatMiB(float64(x))
		}
		return ""
	},
	"secs": func(s float64) string { return (time.Duration(s) * time.Second).String() },
}).Parse(`<!doctype html><html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="5">
<title>repronet node</title><style>body{font:14px system-ui,sans-serif;margin:24px;color:#1d2330}table{border-collapse:collapse}td,th{border-bottom:1px solid #ddd;padding:4px 10px;text-align:left}h2{font-size:16px;margin-top:24px}.muted{color:#5d6678}</style></head><body>
<h1>repronet node</h1>
<p class="muted">{{.Peer}}</p>
<p>Slots: <b>{{.FreeSlots}}</b> free of {{.TotalSlots}}{{if .Draining}} <b>(draining: no new work)</b>{{end}} · outbox {{.Outbox}} report(s){{if .Unsaved}} ({{.Unsaved}} held in memory){{end}}</p>
<p>Credit: <b>{{printf "%.4f" .Credit.CPUHours}} CPU-hours</b> over {{.Credit.Reports}} accepted report(s)</p>
<p>Egress refused since start: {{.EgressRefused}} request(s) or connection(s)</p>
<p>Capsule cache: {{mib .Cache.UsedBytes}} used{{if .Cache.QuotaBytes}} of {{mib .Cache.QuotaBytes}}{{end}}, {{.Cache.Capsules}} capsule(s) · data disk {{mib .Disk.FreeBytes}} free of {{mib .Disk.TotalBytes}}{{if .Disk.Full}} <b>(full: work is declined)</b>{{end}}</p>
<h2>Running</h2>
<table><tr><th>Attempt</th><th>Suite</th><th>Group</th><th>Phase</th><th>Elapsed</th><th>Limits</th></tr>
{{range .Running}}<tr><td>{{.Attempt}}</td><td>{{.Suite}}</td><td>{{.Group}}</td><td>{{.Phase}}</td><td>{{secs .Elapsed}} of {{.WallSeconds}} s</td><td>{{.CPUMillis}} mCPU, {{mib .MemoryBytes}}, network {{.Network}}{{if .Allow}} ({{len .Allow}} allowed){{end}}</td></tr>
{{else}}<tr><td colspan="6" class="muted">nothing running</td></tr>{{end}}</table>
<h2>Coordinators</h2>
<ul>{{range .Coordinators}}<li>{{.Peer}}: {{if .Connected}}connected{{else}}not connected{{end}}</li>{{end}}</ul>
<h2>Finished since start</h2>
<ul>{{range $o, $n := .Finished}}<li>{{$o}}: {{$n}}</li>{{end}}</ul>
</body></html>`))

func formatMiB(v float64) string {
	b, _ := json.Marshal(float64(int64(v/(1<<20)*10)) / 10)
	return string(b) + " MiB"
}
