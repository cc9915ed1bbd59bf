package lease

import (
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestLeases(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := NewLeases(10 * time.Second)
	l.Grant("a1", "n1", t0, time.Time{})
	l.Grant("a2", "n2", t0.Add(time.Second), time.Time{})

	if _, err := l.Renew("a1", "n2", t0.Add(time.Second)); err == nil {
		t.Fatal("renewal by a node that does not hold the lease succeeded")
	}
	if _, err := l.Renew("zz", "n1", t0); err == nil {
		t.Fatal("renewal of an unknown attempt succeeded")
	}
	ls, err := l.Renew("a1", "n1", t0.Add(5*time.Second))
	if err != nil {
		t.Fatalf("renew: %v", err)
	}
	if want := t0.Add(15 * time.Second); !ls.Deadline.Equal(want) {
		t.Fatalf("renewed deadline = %v, want %v", ls.Deadline, want)
	}
	if got := l.HeldBy("n1"); got != 1 {
		t.Fatalf("HeldBy(n1) = %d, want 1", got)
	}
	exp := l.Expire(t0.Add(12 * time.Second))
	if len(exp) != 1 || exp[0].AttemptID != "a2" {
		t.Fatalf("Expire at +12s = %v, want only a2", exp)
	}
	if _, err := l.Renew("a1", "n1", t0.Add(16*time.Second)); err == nil {
		t.Fatal("renewal after the deadline succeeded")
	}
	if _, ok := l.Get("a2"); ok {
		t.Fatal("expired lease still present")
	}
}

// A lease is renewed up to its limit and never past it: a node that
// renews and never reports loses the attempt at the limit.
func TestLeaseLimit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := NewLeases(10 * time.Second)
	limit := t0.Add(25 * time.Second)
	if ls := l.Grant("a1", "n1", t0, limit); !ls.Deadline.Equal(t0.Add(10 * time.Second)) {
		t.Fatalf("granted deadline %v", ls.Deadline)
	}
	for _, tt := range []struct {
		at   time.Duration
		want time.Duration // the deadline after renewal; -1: refused
	}{
		{5 * time.Second, 15 * time.Second},
		{14 * time.Second, 24 * time.Second},
		{20 * time.Second, 25 * time.Second}, // capped at the limit
		{25 * time.Second, -1},               // at the limit: refused
	} {
		ls, err := l.Renew("a1", "n1", t0.Add(tt.at))
		switch {
		case tt.want < 0 && (err == nil || !strings.Contains(err.Error(), "reached its limit")):
			t.Fatalf("renew at +%v: %v, want a refusal naming the limit", tt.at, err)
		case tt.want >= 0 && err != nil:
			t.Fatalf("renew at +%v: %v", tt.at, err)
		case tt.want >= 0 && !ls.Deadline.Equal(t0.Add(tt.want)):
			t.Fatalf("renew at +%v: deadline +%v, want +%v", tt.at, ls.Deadline.Sub(t0), tt.want)
		}
	}
	if exp := l.Expire(t0.Add(25*time.Second + time.Millisecond)); len(exp) != 1 {
		t.Fatalf("past the limit, Expire = %v", exp)
	}
	// A grant too close to its limit gets only what is left.
	if ls := l.Grant("a2", "n1", t0, t0.Add(3*time.Second)); !ls.Deadline.Equal(t0.Add(3 * time.Second)) {
		t.Fatalf("grant with 3 s to its limit: deadline %v", ls.Deadline.Sub(t0))
	}
}

func TestLeasesIncarnation(t *testing.T) {
	t0 := time.Unix(1000, 0)
	l := NewLeases(10 * time.Second)
	l.Grant("a1", "n1", t0, time.Time{})
	l.Grant("a2", "n1", t0, time.Time{})
	l.Grant("a3", "n2", t0, time.Time{})
	l.Bind("a1", 7)
	l.Bind("a3", 7)
	// a2 is not bound yet (the node has not answered): it is not stale.
	if got := l.ExpireStale("n1", 8); len(got) != 1 || got[0].AttemptID != "a1" {
		t.Fatalf("ExpireStale(n1, 8) = %v, want a1", got)
	}
	if got := l.ExpireStale("n2", 7); len(got) != 0 {
		t.Fatalf("ExpireStale of the current incarnation = %v", got)
	}
	if l.HeldBy("n1") != 1 || l.HeldBy("n2") != 1 || l.Len() != 2 {
		t.Fatalf("counts after expiry: n1 %d n2 %d total %d", l.HeldBy("n1"), l.HeldBy("n2"), l.Len())
	}
	l.Grant("a2", "n2", t0, time.Time{}) // reassigned
	if l.HeldBy("n1") != 0 || l.HeldBy("n2") != 2 {
		t.Fatalf("counts after regrant: n1 %d n2 %d", l.HeldBy("n1"), l.HeldBy("n2"))
	}
}

// BenchmarkLeaseRenew measures a lease renewal's bookkeeping (Renew, under
// a lock as the coordinator's) with 40,000 leases held: 10,000 nodes with 4
// slots busy, which renew 4,000 times a second at the default LeaseTTL
// (30 s, renewed every third).
func BenchmarkLeaseRenew(b *testing.B) {
	const leases = 40_000
	var mu sync.Mutex
	l := NewLeases(30 * time.Second)
	now := time.Now()
	ids := make([]string, leases)
	nodes := make([]string, leases)
	for i := range ids {
		ids[i], nodes[i] = fmt.Sprintf("at-%024d", i), fmt.Sprintf("12D3KooWnode%06d", i/4)
		l.Grant(ids[i], nodes[i], now, time.Time{})
	}
	b.ResetTimer()
	for i := range b.N {
		k := i % leases
		mu.Lock()
		_, err := l.Renew(ids[k], nodes[k], now)
		mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/1000, "µs/renewal")
}

// While the coordinator cannot write, Grace keeps every lease alive a full
// TTL past each call, its limit included; once it stops being called the
// leases run out a TTL after the last call, as usual.
func TestLeaseGrace(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ttl := 10 * time.Second
	l := NewLeases(ttl)
	l.Grant("a1", "n1", t0, t0.Add(12*time.Second)) // limit soon
	l.Grant("a2", "n2", t0, time.Time{})
	l.Grant("a3", "n3", t0.Add(9*time.Second), time.Time{}) // deadline t0+19s
	for _, tt := range []struct {
		at      time.Duration
		changed []string
	}{
		{5 * time.Second, []string{"a1", "a2"}},
		{25 * time.Second, []string{"a1", "a2", "a3"}}, // every deadline had passed: none expired
		{26 * time.Second, []string{"a1", "a2", "a3"}},
	} {
		now := t0.Add(tt.at)
		got := l.Grace(now)
		var ids []string
		for _, ls := range got {
			ids = append(ids, ls.AttemptID)
			if !ls.Deadline.Equal(now.Add(ttl)) || (!ls.Limit.IsZero() && ls.Limit.Before(ls.Deadline)) {
				t.Fatalf("at +%v: %+v, want a deadline and limit of at least %v", tt.at, ls, now.Add(ttl))
			}
		}
		sort.Strings(ids)
		if fmt.Sprint(ids) != fmt.Sprint(tt.changed) {
			t.Fatalf("at +%v: changed %v, want %v", tt.at, ids, tt.changed)
		}
		if exp := l.Expire(now); len(exp) != 0 {
			t.Fatalf("at +%v: %d leases expired during grace", tt.at, len(exp))
		}
	}
	// Renewals work on a lease kept by grace, up to its (moved) limit.
	if _, err := l.Renew("a1", "n1", t0.Add(30*time.Second)); err != nil {
		t.Fatalf("renew after grace: %v", err)
	}
	if exp := l.Expire(t0.Add(36*time.Second + time.Millisecond)); len(exp) != 3 {
		t.Fatalf("a TTL after the last grace, %d leases expired, want all 3", len(exp))
	}
}
