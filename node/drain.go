package node

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/proto"
)

// Leaving politely (docs/volunteer.md, "Stopping"): Drain stops the node
// taking work, lets what runs finish within a grace period and its reports
// be delivered, and hands back to its coordinator whatever still runs
// then (LeaseRenewal.hand_back), so that the coordinator requeues it at
// once and does not count it against the node, as it counts a crash.

// DefaultDrainGrace is how long a node stopping lets its attempts run
// before it hands them back: a little under the systemd unit's stop
// timeout (TimeoutStopSec=180 in dist/repronet-node.service), which must
// also cover the hand-back and the stop itself.
const DefaultDrainGrace = 150 * time.Second

// handBackTimeout bounds one hand-back's exchange with its coordinator;
// stopWait how long a drain waits for the attempts it handed back to stop.
const (
	handBackTimeout = 10 * time.Second
	stopWait        = 30 * time.Second
)

// DrainResult is what a drain did.
type DrainResult struct {
	// Finished counts the attempts that ended (and were reported) while
	// the node drained; HandedBack lists those given back at the grace's
	// end, NotHandedBack those whose coordinator could not take them back
	// (their leases run out there as a crash's would), with why.
	Finished      int               `json:"finished"`
	HandedBack    []string          `json:"handed_back"`
	NotHandedBack map[string]string `json:"not_handed_back,omitempty"`
	// Undelivered counts the reports still waiting in the outbox (they are
	// delivered when the node runs again).
	Undelivered int `json:"undelivered"`
	// Took is how long the drain took.
	Took time.Duration `json:"took_ns"`
}

// Draining reports whether the node takes no new work.
func (n *Node) Draining() bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.draining
}

// Resume makes a drained node take work again.
func (n *Node) Resume() {
	n.mu.Lock()
	was := n.draining
	n.draining = false
	n.mu.Unlock()
	if was {
		n.log.Info("drain ended: taking work again")
		n.signal(n.announceNow)
	}
}

// Drain stops the node taking new work (it announces no free slot and
// declines offers as stopping) and waits until what it runs has finished
// and its reports been delivered (while a coordinator can be reached), or
// grace has passed (or ctx ended): then it cancels
// the attempts still running and hands each back to its coordinator. The
// node stays up, taking no work, until Resume or Close.
func (n *Node) Drain(ctx context.Context, grace time.Duration) DrainResult {
	start := time.Now()
	n.mu.Lock()
	n.draining = true
	running := len(n.running)
	finished := n.finishedTotalLocked()
	n.mu.Unlock()
	n.signal(n.announceNow)
	n.log.Info("draining: no new work; running attempts may finish", "running", running, "grace", grace)

	timer := time.NewTimer(grace)
	defer timer.Stop()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		n.mu.Lock()
		idle := len(n.running) == 0
		n.mu.Unlock()
		// Reports wait in the outbox for a coordinator to take them (its
		// lease would run out otherwise), unless none can be reached now.
		if idle && (!n.anyCoordinatorConnected() || n.outboxEmpty(ctx)) {
			break
		}
		select {
		case <-ctx.Done():
			break wait
		case <-timer.C:
			break wait
		case <-tick.C:
		}
	}
	res := DrainResult{NotHandedBack: map[string]string{}}
	n.handBackAll(&res)
	// The attempts handed back stop (their containers are removed) before
	// the drain is done, within bounds.
	stopBy := time.Now().Add(stopWait)
	for {
		n.mu.Lock()
		left := len(n.running)
		n.mu.Unlock()
		if left == 0 || time.Now().After(stopBy) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	n.mu.Lock()
	res.Finished = n.finishedTotalLocked() - finished
	n.mu.Unlock()
	res.Undelivered, _ = n.Pending(context.WithoutCancel(ctx))
	res.Took = time.Since(start)
	if len(res.NotHandedBack) == 0 {
		res.NotHandedBack = nil
	}
	n.log.Info("drained", "finished", res.Finished, "handed_back", len(res.HandedBack), "not_handed_back", len(res.NotHandedBack),
		"undelivered_reports", res.Undelivered, "took", res.Took.Round(time.Millisecond))
	return res
}

func (n *Node) outboxEmpty(ctx context.Context) bool {
	p, err := n.Pending(ctx)
	return err == nil && p == 0
}

func (n *Node) anyCoordinatorConnected() bool {
	for _, c := range n.coords {
		if n.host.Network().Connectedness(c.ID) == network.Connected {
			return true
		}
	}
	return false
}

func (n *Node) finishedTotalLocked() int {
	t := 0
	for _, k := range n.finished {
		t += k
	}
	return t
}

// handBackAll cancels every attempt still running and hands each back to
// its coordinator, all at once.
func (n *Node) handBackAll(res *DrainResult) {
	n.mu.Lock()
	keys := make([]runKey, 0, len(n.running))
	for k, cancel := range n.running {
		n.handingBack[k] = true
		cancel()
		keys = append(keys, k)
	}
	n.mu.Unlock()
	sort.Slice(keys, func(i, j int) bool { return keys[i].attempt < keys[j].attempt })
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := n.handBack(k.coord, k.attempt, "the node is stopping")
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				res.NotHandedBack[k.attempt] = err.Error()
				n.log.Warn("attempt not handed back; its lease runs out at its coordinator", "attempt", k.attempt,
					"coordinator", k.coord, "err", err)
				return
			}
			res.HandedBack = append(res.HandedBack, k.attempt)
			n.log.Info("attempt handed back", "attempt", k.attempt, "coordinator", k.coord)
		}()
	}
	wg.Wait()
	sort.Strings(res.HandedBack)
}

// handBack gives one attempt back to coord.
func (n *Node) handBack(coord peer.ID, attempt, why string) error {
	ctx, cancel := context.WithTimeout(context.Background(), handBackTimeout)
	defer cancel()
	s, err := n.host.NewStream(ctx, coord, proto.LeaseProtocol)
	if err != nil {
		return fmt.Errorf("hand back %s: %w", attempt, err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(handBackTimeout))
	if err := proto.WriteMsg(s, &proto.LeaseRenewal{AttemptId: attempt, Phase: "stopping", HandBack: why}); err != nil {
		s.Reset()
		return fmt.Errorf("hand back %s: %w", attempt, err)
	}
	var ack proto.LeaseAck
	if err := proto.ReadMsg(s, &ack, proto.MaxControlSize); err != nil {
		s.Reset()
		return fmt.Errorf("hand back %s: %w", attempt, err)
	}
	switch {
	case ack.GetHandedBack():
		return nil
	case ack.GetOk():
		return fmt.Errorf("hand back %s: the coordinator does not take attempts back (an older version): it renewed the lease", attempt)
	default:
		return fmt.Errorf("hand back %s: refused: %s", attempt, ack.GetReason())
	}
}

// ControlHandler serves the node's local control: POST /drain (optional
// ?grace=DURATION, default defaultGrace) drains it and answers the
// DrainResult when done; POST /resume makes it take work again; GET
// /status is its Status. Serve it only where the node's owner alone can
// reach it (repronet node serves it on a unix socket of mode 0600).
func (n *Node) ControlHandler(defaultGrace time.Duration) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /drain", func(w http.ResponseWriter, r *http.Request) {
		grace := defaultGrace
		if g := r.URL.Query().Get("grace"); g != "" {
			d, err := time.ParseDuration(g)
			if err != nil || d < 0 {
				http.Error(w, fmt.Sprintf("grace %q is not a duration (e.g. 90s, 5m)", g), http.StatusBadRequest)
				return
			}
			grace = d
		}
		// The drain goes on if the asker leaves: it is a state of the node.
		writeJSON(w, n.Drain(context.WithoutCancel(r.Context()), grace))
	})
	mux.HandleFunc("POST /resume", func(w http.ResponseWriter, r *http.Request) {
		n.Resume()
		writeJSON(w, n.Status(r.Context()))
	})
	mux.Handle("GET /status", n.StatusHandler())
	return mux
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(b, '\n'))
}
