package lease

import (
	"fmt"
	"sort"
	"time"
)

// Lease is a node's time-bounded claim on an attempt. Incarnation is the
// node process that accepted it (0 until the node answers). Deadline moves
// with renewals but never past Limit (zero: no limit), which the attempt's
// own limits fix when it is granted: a node that renews and never reports
// loses the attempt at Limit all the same.
type Lease struct {
	AttemptID   string
	Node        string
	Incarnation uint64
	Deadline    time.Time
	Limit       time.Time
}

// Leases is the lease table: plain data, no clock of its own (callers pass
// now), no I/O. It is not safe for concurrent use.
type Leases struct {
	ttl    time.Duration
	m      map[string]Lease
	byNode map[string]int
}

// NewLeases returns an empty table whose leases last ttl from their last renewal.
func NewLeases(ttl time.Duration) *Leases {
	return &Leases{ttl: ttl, m: make(map[string]Lease), byNode: make(map[string]int)}
}

// TTL is how long a lease lasts without renewal.
func (l *Leases) TTL() time.Duration { return l.ttl }

// Grant gives attempt to node until now+ttl (or limit, if earlier),
// replacing any earlier lease; renewals never take it past limit (zero:
// no limit).
func (l *Leases) Grant(attempt, node string, now, limit time.Time) Lease {
	ls := Lease{AttemptID: attempt, Node: node, Deadline: capAt(now.Add(l.ttl), limit), Limit: limit}
	l.put(ls)
	return ls
}

// laterOf is the later of two times (a zero time is earliest).
func laterOf(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// capAt is t, or limit when limit is set and earlier.
func capAt(t, limit time.Time) time.Time {
	if !limit.IsZero() && limit.Before(t) {
		return limit
	}
	return t
}

// Restore puts back a lease read from storage.
func (l *Leases) Restore(ls Lease) { l.put(ls) }

// Resume puts back, after a restart at now, the lease of an attempt that was
// assigned: a full TTL from now (or the deadline already acknowledged to the
// node, if later), never past the attempt's limit unless an acknowledged
// deadline already was.
func (l *Leases) Resume(attempt, node string, incarnation uint64, acked, limit, now time.Time) Lease {
	deadline := laterOf(now.Add(l.ttl), acked)
	deadline = capAt(deadline, laterOf(limit, acked))
	ls := Lease{AttemptID: attempt, Node: node, Incarnation: incarnation, Deadline: deadline, Limit: limit}
	l.put(ls)
	return ls
}

func (l *Leases) put(ls Lease) {
	l.Release(ls.AttemptID)
	l.m[ls.AttemptID] = ls
	l.byNode[ls.Node]++
}

// Bind records which incarnation of its node holds the lease on attempt.
func (l *Leases) Bind(attempt string, incarnation uint64) {
	if ls, ok := l.m[attempt]; ok {
		ls.Incarnation = incarnation
		l.m[attempt] = ls
	}
}

// Renew extends node's lease on attempt, up to its limit. It fails when
// the attempt has no lease, the lease belongs to another node, it has
// already expired, or it has reached its limit.
func (l *Leases) Renew(attempt, node string, now time.Time) (Lease, error) {
	ls, ok := l.m[attempt]
	switch {
	case !ok:
		return Lease{}, fmt.Errorf("renew lease on attempt %q: no lease held", attempt)
	case ls.Node != node:
		return Lease{}, fmt.Errorf("renew lease on attempt %q: held by %s, not %s", attempt, ls.Node, node)
	case now.After(ls.Deadline):
		return Lease{}, fmt.Errorf("renew lease on attempt %q: expired at %s", attempt, ls.Deadline.Format(time.RFC3339Nano))
	case !ls.Limit.IsZero() && !now.Before(ls.Limit):
		return Lease{}, fmt.Errorf("renew lease on attempt %q: it reached its limit at %s (the attempt's limits plus a margin)",
			attempt, ls.Limit.Format(time.RFC3339Nano))
	}
	ls.Deadline = capAt(now.Add(l.ttl), ls.Limit)
	l.m[attempt] = ls
	return ls, nil
}

// Grace makes every lease last at least a full TTL from now, taking its
// limit along if need be, and returns the leases it changed (in no
// order). It is for the times the coordinator cannot act on what its
// nodes send (its disk is full: reports are answered "retry"): a lease
// must not run out for want of an answer the coordinator could not give,
// so a node is never charged for the coordinator's own trouble. A limit
// moves by no more than the time Grace is called for.
func (l *Leases) Grace(now time.Time) []Lease {
	var out []Lease
	until := now.Add(l.ttl)
	for id, ls := range l.m {
		if !ls.Deadline.Before(until) {
			continue
		}
		ls.Deadline = until
		if !ls.Limit.IsZero() && ls.Limit.Before(until) {
			ls.Limit = until
		}
		l.m[id] = ls
		out = append(out, ls)
	}
	return out
}

// Get returns the lease on attempt, if any.
func (l *Leases) Get(attempt string) (Lease, bool) {
	ls, ok := l.m[attempt]
	return ls, ok
}

// Release drops the lease on attempt.
func (l *Leases) Release(attempt string) {
	ls, ok := l.m[attempt]
	if !ok {
		return
	}
	delete(l.m, attempt)
	if l.byNode[ls.Node]--; l.byNode[ls.Node] <= 0 {
		delete(l.byNode, ls.Node)
	}
}

// Expire removes and returns, oldest deadline first, every lease whose
// deadline is before now.
func (l *Leases) Expire(now time.Time) []Lease {
	var out []Lease
	for _, ls := range l.m {
		if now.After(ls.Deadline) {
			out = append(out, ls)
		}
	}
	return l.drop(out)
}

// ExpireStale removes and returns every lease of node bound to an
// incarnation other than current: that process is gone.
func (l *Leases) ExpireStale(node string, current uint64) []Lease {
	if l.byNode[node] == 0 {
		return nil
	}
	var out []Lease
	for _, ls := range l.m {
		if ls.Node == node && ls.Incarnation != 0 && ls.Incarnation != current {
			out = append(out, ls)
		}
	}
	return l.drop(out)
}

func (l *Leases) drop(out []Lease) []Lease {
	for _, ls := range out {
		l.Release(ls.AttemptID)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Deadline.Equal(out[j].Deadline) {
			return out[i].Deadline.Before(out[j].Deadline)
		}
		return out[i].AttemptID < out[j].AttemptID
	})
	return out
}

// HeldBy counts the leases node holds.
func (l *Leases) HeldBy(node string) int { return l.byNode[node] }

// Len counts the leases.
func (l *Leases) Len() int { return len(l.m) }

// Attempts lists the attempts holding a lease, sorted.
func (l *Leases) Attempts() []string {
	out := make([]string, 0, len(l.m))
	for id := range l.m {
		out = append(out, id)
	}
	sort.Strings(out)
	return out
}

// AttemptsOf lists the attempts node holds a lease on, sorted.
func (l *Leases) AttemptsOf(node string) []string {
	if l.byNode[node] == 0 {
		return nil
	}
	var out []string
	for id, ls := range l.m {
		if ls.Node == node {
			out = append(out, id)
		}
	}
	sort.Strings(out)
	return out
}
