// Package lograte bounds how often one kind of log line is written: a
// peer that provokes a warning thousands of times a second gets a few
// lines and a count of the rest, not a flooded journal. It owns only that
// arithmetic (a token bucket on an injected clock); what is logged is the
// caller's.
package lograte

import (
	"sync"
	"time"
)

// Limiter allows Burst lines at once and one more every Every.
type Limiter struct {
	burst int
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	tokens  float64
	last    time.Time
	dropped int
}

// New returns a limiter of burst lines refilled at one per every, on the
// clock now (nil: time.Now).
func New(burst int, every time.Duration, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	burst, every = max(burst, 1), max(every, time.Nanosecond)
	return &Limiter{burst: burst, every: every, now: now, tokens: float64(burst)}
}

// Allow reports whether a line may be written now and, when it may, how
// many lines were not written since the last one (to say in it).
func (l *Limiter) Allow() (ok bool, dropped int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	t := l.now()
	if !l.last.IsZero() && t.After(l.last) {
		l.tokens = min(float64(l.burst), l.tokens+float64(t.Sub(l.last))/float64(l.every))
	}
	if l.last.IsZero() || t.After(l.last) {
		l.last = t
	}
	if l.tokens < 1 {
		l.dropped++
		return false, 0
	}
	l.tokens--
	dropped, l.dropped = l.dropped, 0
	return true, dropped
}
