package lograte

import (
	"testing"
	"time"
)

// TestLimiter: a burst passes, the rest is counted until the bucket
// refills, and the next line written carries the count.
func TestLimiter(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := New(3, time.Second, func() time.Time { return now })
	steps := []struct {
		advance     time.Duration
		ok          bool
		wantDropped int
	}{
		{0, true, 0}, {0, true, 0}, {0, true, 0}, // the burst
		{0, false, 0}, {100 * time.Millisecond, false, 0}, {0, false, 0}, // refused, counted
		{900 * time.Millisecond, true, 3}, // one token back: the line says 3 were dropped
		{0, false, 0},
		{10 * time.Second, true, 1}, // refilled to the burst, not beyond
		{0, true, 0}, {0, true, 0}, {0, false, 0},
		{-time.Hour, false, 0}, // a clock that steps back refills nothing
	}
	for i, s := range steps {
		now = now.Add(s.advance)
		ok, dropped := l.Allow()
		if ok != s.ok || dropped != s.wantDropped {
			t.Fatalf("step %d: Allow() = %v, %d; want %v, %d", i, ok, dropped, s.ok, s.wantDropped)
		}
	}
}

// TestFlood: 3,000 calls in the same second write the burst only.
func TestFlood(t *testing.T) {
	now := time.Unix(0, 0)
	l := New(5, time.Second, func() time.Time { return now })
	written := 0
	for range 3000 {
		if ok, _ := l.Allow(); ok {
			written++
		}
	}
	if written != 5 {
		t.Fatalf("%d lines written of 3,000, want the burst of 5", written)
	}
}
