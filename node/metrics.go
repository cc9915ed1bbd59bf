package node

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/repronet/repronet/proto"
)

// The node's Prometheus metrics (MetricsHandler; `repronet node --metrics
// ADDR`). Gauges are read from the node's state at scrape time; the one
// counter, attempts finished by outcome, is kept where an attempt ends.
// The registry also holds the libp2p host's own metrics and Go's.
var (
	descSlots     = prometheus.NewDesc("repronet_node_slots", "Slots this node offers, total and free.", []string{"state"}, nil)
	descFinished  = prometheus.NewDesc("repronet_node_attempts_finished_total", "Attempts run to a report, by outcome, since start.", []string{"outcome"}, nil)
	descOutbox    = prometheus.NewDesc("repronet_node_outbox_reports", "Reports not yet acknowledged by their coordinator (stored, or held in memory for want of room).", nil, nil)
	descUnsaved   = prometheus.NewDesc("repronet_node_outbox_unsaved_reports", "Reports held in memory because the data folder had no room to store them.", nil, nil)
	descDiskFull  = prometheus.NewDesc("repronet_node_disk_full", "1 while the data folder is below its free-space reserve (nothing is written there, assignments are declined as busy), else 0.", nil, nil)
	descDiskBytes = prometheus.NewDesc("repronet_node_data_disk_bytes", "The data folder's filesystem: bytes free, the reserve kept free, and the total.", []string{"kind"}, nil)
	descCache     = prometheus.NewDesc("repronet_node_capsule_cache_bytes", "Bytes the capsule cache holds, and its quota (0: none).", []string{"kind"}, nil)
	descCapsules  = prometheus.NewDesc("repronet_node_capsules_cached", "Capsules this node holds whole.", nil, nil)
	descCoordPeer = prometheus.NewDesc("repronet_node_coordinators_connected", "Coordinators this node is connected to.", nil, nil)
	descRefused   = prometheus.NewDesc("repronet_node_egress_refused_total", "Requests and connections the egress proxy refused jobs, since start.", nil, nil)
	descRedials   = prometheus.NewDesc("repronet_node_gossip_redials_total", "Connections to coordinators closed and dialled again because announcements did not reach them (no gossipsub stream, or no subscription heard, for --gossip-grace), since start.", nil, nil)
	descDraining  = prometheus.NewDesc("repronet_node_draining", "1 while the node takes no new work (repronet node drain, or stopping), else 0.", nil, nil)
	descPkgCache  = prometheus.NewDesc("repronet_node_package_cache", "The package cache: files served from it (hits), passed on (misses), stored, verified, evicted, refused for a hash mismatch, held, and bytes held.", []string{"kind"}, nil)
)

type metricsCollector struct{ n *Node }

func (m metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSlots, descFinished, descOutbox, descUnsaved, descCache, descCapsules, descCoordPeer,
		descDiskFull, descDiskBytes, descRefused, descRedials, descPkgCache, descDraining} {
		ch <- d
	}
}

func (m metricsCollector) Collect(ch chan<- prometheus.Metric) {
	n := m.n
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	a := n.Announcement()
	gauge(descSlots, float64(a.GetTotalSlots()), "total")
	gauge(descSlots, float64(a.GetFreeSlots()), "free")
	draining := 0.0
	if n.Draining() {
		draining = 1
	}
	gauge(descDraining, draining)
	n.mu.Lock()
	finished := make(map[proto.Outcome]int, len(n.finished))
	for o, c := range n.finished {
		finished[o] = c
	}
	cached := len(n.cached)
	n.mu.Unlock()
	for o, c := range finished {
		ch <- prometheus.MustNewConstMetric(descFinished, prometheus.CounterValue, float64(c), o.String())
	}
	if pending, err := n.Pending(context.Background()); err == nil {
		gauge(descOutbox, float64(pending))
	}
	gauge(descUnsaved, float64(n.unsaved.len()))
	disk := n.disk.Status()
	full := 0.0
	if disk.Low {
		full = 1
	}
	gauge(descDiskFull, full)
	gauge(descDiskBytes, float64(disk.Free), "free")
	gauge(descDiskBytes, float64(disk.Reserve), "reserve")
	gauge(descDiskBytes, float64(disk.Total), "total")
	used, quota := n.store.Usage()
	gauge(descCache, float64(used), "used")
	gauge(descCache, float64(quota), "quota")
	gauge(descCapsules, float64(cached))
	connected := 0
	for _, c := range n.coords {
		if len(n.host.Network().ConnsToPeer(c.ID)) > 0 {
			connected++
		}
	}
	gauge(descCoordPeer, float64(connected))
	ch <- prometheus.MustNewConstMetric(descRefused, prometheus.CounterValue, float64(n.egressRefused.Load()))
	ch <- prometheus.MustNewConstMetric(descRedials, prometheus.CounterValue, float64(n.gossipRedials.Load()))
	if n.pkgs != nil {
		st := n.pkgs.Stats()
		for kind, v := range map[string]int64{"hits": st.Hits, "misses": st.Misses, "stored": st.Stored, "verified": st.Verified,
			"evicted": st.Evicted, "mismatches": st.Mismatches, "entries": st.Entries, "bytes": st.Bytes} {
			gauge(descPkgCache, float64(v), kind)
		}
	}
}

func newMetrics(n *Node) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(metricsCollector{n}, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// MetricsHandler serves the node's Prometheus metrics.
func (n *Node) MetricsHandler() http.Handler {
	return promhttp.HandlerFor(n.metrics, promhttp.HandlerOpts{})
}
