package coordinator

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/crosscheck"
)

// Evaluate queues an evaluation (core.Evaluate: one unit per task, level
// and run, each with its first replica, or all of them with Replicas set),
// durably, and returns the evaluation ID and the number of attempts
// queued. A request refused for what it asks wraps core.ErrBadRequest.
func (c *Coordinator) Evaluate(ctx context.Context, e Evaluation) (string, int, error) {
	if err := c.writable(); err != nil {
		return "", 0, fmt.Errorf("evaluate: %w", err)
	}
	fx, t := c.step(ctx, core.Evaluate{Evaluation: e})
	r, _ := fx.Reply.(core.EvaluateReply)
	if r.Err != nil {
		return "", 0, r.Err
	}
	if err := c.durable(ctx, t); err != nil {
		// Queued in memory: they are written if space returns before the
		// coordinator stops; the same request with its ID confirms them.
		return "", 0, fmt.Errorf("evaluate: %d attempts of evaluation %s not durable: %w", r.Attempts, r.ID, err)
	}
	return r.ID, r.Attempts, nil
}

// Evaluations lists the evaluation requests, oldest first.
func (c *Coordinator) Evaluations() []EvalRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.EvalList()
}

// Attempts returns a copy of every attempt but canaries, in queue order.
func (c *Coordinator) Attempts() []Attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.AttemptList(false)
}

// AllAttempts returns a copy of every attempt, canaries included, in
// queue order.
func (c *Coordinator) AllAttempts() []Attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.AttemptList(true)
}

// Attempt returns a copy of one attempt.
func (c *Coordinator) Attempt(id string) (Attempt, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.Attempt(id)
}

// Progress counts attempts by state, canaries left out.
func (c *Coordinator) Progress() Progress {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.Progress()
}

// Stats counts attempts by state, reassignments and late reports.
func (c *Coordinator) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.Stats(time.Now())
}

// NodeInfo describes a node in the coordinator's view.
type NodeInfo struct {
	core.NodeInfo
	GossipScore float64 `json:"gossip_score"`
}

// Nodes lists the nodes currently in view.
func (c *Coordinator) Nodes() []NodeInfo {
	c.mu.Lock()
	infos := c.state.NodeInfos(time.Now())
	c.mu.Unlock()
	out := make([]NodeInfo, len(infos))
	for i, n := range infos {
		out[i].NodeInfo = n
		if id, err := peer.Decode(n.ID); err == nil {
			out[i].GossipScore, _ = c.GossipScore(id)
		}
	}
	return out
}

// NetworkSummary is what the public may know of the pool: its size.
type NetworkSummary struct {
	Nodes     int `json:"nodes"`
	Operators int `json:"operators"`
	Slots     int `json:"slots"`
	FreeSlots int `json:"free_slots"`
	// Network, Peer and Addrs are what a node needs to serve this
	// coordinator (repronet node join URL TOKEN).
	Network string   `json:"network"`
	Peer    string   `json:"peer"`
	Addrs   []string `json:"addrs"`
}

// Network summarises the nodes in view that serve this coordinator.
func (c *Coordinator) Network() NetworkSummary {
	c.mu.Lock()
	infos := c.state.NodeInfos(time.Now())
	c.mu.Unlock()
	s := NetworkSummary{Network: c.cfg.Network, Peer: c.ID().String(), Addrs: []string{}}
	for _, a := range c.Addrs() {
		s.Addrs = append(s.Addrs, a.String())
	}
	ops := map[string]bool{}
	for _, n := range infos {
		if !n.ServesUs {
			continue
		}
		s.Nodes++
		s.Slots += n.TotalSlots
		s.FreeSlots += n.FreeSlots
		ops[cmp.Or(n.Operator, n.ID)] = true
	}
	s.Operators = len(ops)
	return s
}

// CrossCheckNodes returns every node's cross-check record (reliability,
// canaries, quarantine). Admin only: the counters of a node's own record
// would tell it which of its jobs were canaries.
func (c *Coordinator) CrossCheckNodes() []crosscheck.NodeRecord {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.BookNodes()
}

// CrossCheckUnits returns a copy of every unit's cross-check record (its
// work, replicas, outstanding jobs and decision), canaries included. Admin
// only, like CrossCheckNodes.
func (c *Coordinator) CrossCheckUnits() []crosscheck.Attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.BookUnits()
}

// Decision is the cross-check's latest decision on a unit.
func (c *Coordinator) Decision(unit string) (crosscheck.Decision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.Decision(unit)
}

// Quarantine quarantines a node by hand: it gets no more work, its jobs
// are taken back and its unvalidated results are discarded.
func (c *Coordinator) Quarantine(ctx context.Context, node, reason string) error {
	_, t := c.step(ctx, core.Quarantine{Node: node, Reason: reason})
	if err := c.durable(ctx, t); err != nil {
		return fmt.Errorf("quarantine %s: %w", node, err)
	}
	return nil
}
