package core

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/repronet/repronet/coordinator/schedule"
)

// Work that no node can take (issue 23): an attempt waits for a free slot
// only while a node in view could run it. It ends, with OutcomeUnschedulable
// and the reason in its Detail, when every node in view that could run it
// has failed it for infrastructure reasons (at once, when the last of them
// reports its failure), or when for Config.UnschedulableAfter no node in
// view could run it at all (its limits exceed every slot, no node serves
// its suite or group or has its GPUs, or every node that could failed or
// declined it). While it waits, Waiting says why, in words. Nothing of it
// is charged to a node: the cross-check fails its unit as undeliverable
// (never scored, never counted against the agent).
//
// What "could run it" means is the scheduler's matchmaking on what does
// not move with placement (schedule.Explain: the node's suites, groups,
// slot shape and GPUs) less the nodes the attempt must avoid for good
// (declined it, failed it, or it must run apart from them): so whether an
// attempt is blocked does not change when it or another attempt is
// placed, and a submitter who sees it learns nothing about where its
// attempts run (or which of a node's jobs are canaries). Free slots and
// the other replicas of its unit are left out: they are a wait, not a
// block. With no node in view at all the clock stands still: an empty
// pool is the network's trouble, not the attempt's.

// OutcomeUnschedulable is the outcome of an attempt that no node in view
// could run (see above). Its Detail says why.
const OutcomeUnschedulable = "unschedulable"

// DefaultUnschedulableAfter is the default of Config.UnschedulableAfter.
const DefaultUnschedulableAfter = 10 * time.Minute

// ReplayUnschedulableAfter bounds the wait of a replay no node in view may
// run (every one is its recorder's operator's or ran it already): a replay
// is the network's check, not the submitter's work, and its evaluation
// should not wait the whole bound for it; the result stays unverified,
// saying why.
const ReplayUnschedulableAfter = time.Minute

// stuckBound is how long a blocked attempt waits before it ends
// unschedulable.
func (s *State) stuckBound(a *Attempt) time.Duration {
	if a.Kind == KindReplay {
		return min(s.cfg.UnschedulableAfter, ReplayUnschedulableAfter)
	}
	return s.cfg.UnschedulableAfter
}

// stuckCheckEvery spaces the rounds of checkStuck over the queue (a
// scheduling round may come every half second; a round over a queue of
// 250,000 costs 0.2-0.3 s: docs/scale.md); new attempts bring the next
// round to stuckCheckSoon after the last.
const (
	stuckCheckEvery = 5 * time.Second
	stuckCheckSoon  = time.Second
)

// Waiting says why an unfinished attempt waits.
type Waiting struct {
	// Blocked: nodes are in view, and none could run it. It ends as
	// unschedulable at Deadline unless one that could comes into view.
	Blocked bool `json:"blocked"`
	// Reason says why it waits, in words.
	Reason string `json:"reason"`
	// Since is when it was first found blocked, Deadline when it ends
	// (both zero unless Blocked).
	Since    time.Time `json:"since,omitzero"`
	Deadline time.Time `json:"deadline,omitzero"`
	// InView counts the nodes in view serving this coordinator, Eligible
	// those of them that could run it, Open those of these that neither
	// failed nor declined it nor must be avoided.
	InView   int `json:"in_view"`
	Eligible int `json:"eligible"`
	Open     int `json:"open"`
}

// fitter classifies the nodes in view for attempts: one pass over the
// nodes per class of attempt (suite, group, needs, GPUs), so that a
// round over a long queue costs its classes, not its length times the
// nodes.
type fitter struct {
	nodes   []schedule.NodeView
	classes map[fitKey]*fitClass
}

type fitKey struct {
	suite, group string
	needs        schedule.Shape
	gpus         schedule.GPUNeed
}

// fitClass is how the nodes in view fit one class of attempt.
type fitClass struct {
	// fitting lists the nodes that could run it, by ID; fitSet indexes
	// them (made when first asked).
	fitting []string
	fitSet  map[string]bool
	// misfits counts the other nodes by the first reason they could not.
	misfits [schedule.TooFewGPUs + 1]int
	// largest is the largest slot in view, dimension by dimension, of the
	// nodes too small for it.
	largest schedule.Shape
}

// newFitter takes the nodes in view at now that serve this coordinator
// and are not quarantined.
func (s *State) newFitter(now time.Time) *fitter {
	f := &fitter{classes: map[fitKey]*fitClass{}}
	for _, id := range sortedKeys(s.Nodes) {
		n := s.Nodes[id]
		if now.Sub(n.LastSeen) > s.cfg.NodeTTL || !n.ServesUs || s.quarantined(id) {
			continue
		}
		f.nodes = append(f.nodes, schedule.NodeView{ID: id, Operator: n.Operator, Suites: n.Suites, Groups: n.Groups, Slot: n.Slot,
			GPUs: n.GPUs})
	}
	return f
}

// class is how the nodes in view fit attempts like a.
func (f *fitter) class(a *Attempt) *fitClass {
	k := fitKey{a.Suite, a.Group, a.Needs, a.GPUs}
	if c, ok := f.classes[k]; ok {
		return c
	}
	c := &fitClass{}
	p := schedule.Pending{Suite: a.Suite, Group: a.Group, Needs: a.Needs, GPUs: a.GPUs}
	for _, v := range f.nodes {
		m := schedule.Explain(p, v)
		if m == schedule.Fits {
			c.fitting = append(c.fitting, v.ID)
			continue
		}
		c.misfits[m]++
		if m == schedule.SlotTooSmall {
			c.largest.CPUMillis = max(c.largest.CPUMillis, v.Slot.CPUMillis)
			c.largest.MemoryBytes = max(c.largest.MemoryBytes, v.Slot.MemoryBytes)
			c.largest.DiskBytes = max(c.largest.DiskBytes, v.Slot.DiskBytes)
		}
	}
	f.classes[k] = c
	return c
}

func (c *fitClass) fits(node string) bool {
	if c.fitSet == nil {
		c.fitSet = make(map[string]bool, len(c.fitting))
		for _, id := range c.fitting {
			c.fitSet[id] = true
		}
	}
	return c.fitSet[node]
}

// waiting says whether a is blocked at now, without its reason (see
// reason): cheap, for a round over the queue.
func (f *fitter) waiting(a *Attempt) Waiting {
	c := f.class(a)
	w := Waiting{InView: len(f.nodes), Eligible: len(c.fitting), Open: len(c.fitting)}
	for _, id := range a.Avoid { // each node once (every append checks)
		if c.fits(id) {
			w.Open--
		}
	}
	w.Blocked = w.InView > 0 && w.Open == 0
	return w
}

// reason says, in words, why a waits as w says.
func (f *fitter) reason(a *Attempt, w Waiting) string {
	c := f.class(a)
	switch {
	case w.InView == 0:
		return "no node serving this coordinator is in view"
	case w.Open > 0:
		return fmt.Sprintf("waiting for a free slot: %s in view can run it", countOf(w.Open, "node", "nodes"))
	}
	var parts []string
	if w.Eligible > 0 {
		// Every node that could run it is kept off it: say what each said.
		failed, declined := map[string]string{}, map[string]string{}
		for _, d := range a.Failures {
			failed[d.Node] = d.Reason
		}
		for _, d := range a.Declines {
			declined[d.Node] = d.Reason
		}
		var fl, dl []string
		other := 0
		seen := map[string]bool{}
		for _, id := range a.Avoid {
			if seen[id] || !c.fits(id) {
				continue
			}
			seen[id] = true
			switch {
			case failed[id] != "":
				fl = append(fl, shortID(id)+": "+failed[id])
			case declined[id] != "":
				dl = append(dl, shortID(id)+": "+declined[id])
			default:
				other++
			}
		}
		var kept []string
		if len(fl) > 0 {
			kept = append(kept, fmt.Sprintf("%d of %d eligible nodes failed it (%s)", len(fl), w.Eligible, listSome(fl, 3)))
		}
		if len(dl) > 0 {
			kept = append(kept, fmt.Sprintf("%d of %d eligible nodes declined it (%s)", len(dl), w.Eligible, listSome(dl, 3)))
		}
		if other > 0 {
			kept = append(kept, fmt.Sprintf("%d of %d eligible nodes may not take it (its unit or pipeline ran or failed there)",
				other, w.Eligible))
		}
		parts = append(parts, strings.Join(kept, "; "))
		if w.Eligible == w.InView {
			parts = append(parts, "no other node is in view")
		} else {
			parts = append(parts, "no other node in view can run it: "+f.misfits(a, c))
		}
	} else {
		parts = append(parts, fmt.Sprintf("none of the %s in view can run it: %s", countOf(w.InView, "node", "nodes"), f.misfits(a, c)))
	}
	return strings.Join(parts, "; ")
}

// misfits says why the nodes of c that cannot run a cannot.
func (f *fitter) misfits(a *Attempt, c *fitClass) string {
	var out []string
	if n := c.misfits[schedule.SlotTooSmall]; n > 0 {
		out = append(out, fmt.Sprintf("%s too small for its limits (it needs %s; the largest slot offers %s)",
			countOf(n, "has a slot", "have slots"), shapeText(a.Needs, a.Needs), shapeText(c.largest, a.Needs)))
	}
	if n := c.misfits[schedule.SuiteNotServed]; n > 0 {
		out = append(out, fmt.Sprintf("%s not serve suite %q", countOf(n, "does", "do"), a.Suite))
	}
	if n := c.misfits[schedule.GroupNotServed]; n > 0 {
		out = append(out, fmt.Sprintf("%s not serve group %q", countOf(n, "does", "do"), a.Group))
	}
	if n := c.misfits[schedule.TooFewGPUs]; n > 0 {
		gpu := "GPU"
		if a.GPUs.Model != "" {
			gpu = a.GPUs.Model + " GPU"
		}
		out = append(out, fmt.Sprintf("%s fewer than %d %s", countOf(n, "has", "have"), a.GPUs.Count, gpu))
	}
	return strings.Join(out, ", ")
}

// countOf is "1 node has" or "3 nodes have": n, then the noun and verb
// one or many takes.
func countOf(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

// listSome joins the first max of items, saying how many more there are.
func listSome(items []string, max int) string {
	if len(items) <= max {
		return strings.Join(items, "; ")
	}
	return fmt.Sprintf("%s; and %d more", strings.Join(items[:max], "; "), len(items)-max)
}

// shapeText names the dimensions of s that need asks for: CPU in
// thousandths of a core, memory and disk in bytes (bytesText).
func shapeText(s, need schedule.Shape) string {
	var out []string
	if need.CPUMillis > 0 {
		out = append(out, fmt.Sprintf("%d mCPU", s.CPUMillis))
	}
	if need.MemoryBytes > 0 {
		out = append(out, bytesText(s.MemoryBytes)+" of memory")
	}
	if need.DiskBytes > 0 {
		out = append(out, bytesText(s.DiskBytes)+" of disk")
	}
	if len(out) == 0 {
		return "nothing in particular"
	}
	return strings.Join(out, ", ")
}

// bytesText is n bytes in GiB, or MiB below one GiB.
func bytesText(n uint64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
}

// checkStuck is a round over the queue: an attempt found blocked starts
// its clock (StuckSince, durable, so that it runs on across restarts), one
// that no longer is stops it, and one blocked for UnschedulableAfter
// ends as unschedulable. With no node in view every clock stands as it is.
func (s *State) checkStuck() {
	if len(s.Queue) == 0 || s.now.Before(s.nextStuckCheck) {
		return
	}
	s.lastStuckCheck, s.nextStuckCheck = s.now, s.now.Add(stuckCheckEvery)
	f := s.newFitter(s.now)
	if len(f.nodes) == 0 {
		return
	}
	var ended []*Attempt
	for _, id := range s.Queue {
		a := s.Attempts[id]
		w := f.waiting(a)
		switch {
		case !w.Blocked:
			if !a.StuckSince.IsZero() {
				a.StuckSince = time.Time{}
				s.persistAttempt(a)
			}
		case a.StuckSince.IsZero():
			a.StuckSince = s.now
			s.persistAttempt(a)
			s.log.Warn("no node in view can run the attempt", "attempt", a.ID, "why", f.reason(a, w),
				"ends", s.now.Add(s.stuckBound(a)))
		case s.now.Sub(a.StuckSince) >= s.stuckBound(a):
			ended = append(ended, a)
		}
	}
	if len(ended) == 0 {
		return
	}
	out := make(map[string]bool, len(ended))
	why := make([]string, len(ended))
	for i, a := range ended {
		out[a.ID] = true
		why[i] = fmt.Sprintf("%s (for %s)", f.reason(a, f.waiting(a)), s.now.Sub(a.StuckSince).Round(time.Second))
	}
	s.dequeue(out) // one pass over the queue for them all
	for i, a := range ended {
		a.State = StateFailed // out of the queue already: endAttempt leaves the queue be
		s.giveUp(a, OutcomeUnschedulable, why[i])
	}
}

// stuckSoon brings the next checkStuck round to stuckCheckSoon after the
// last (attempts were added: whether they are stuck is known soon).
func (s *State) stuckSoon() {
	if soon := s.lastStuckCheck.Add(stuckCheckSoon); soon.Before(s.nextStuckCheck) {
		s.nextStuckCheck = soon
	}
}

// blockedNow reports whether a, just kept off a node for good, can no
// longer run on any node in view (every node that could run it failed,
// declined or must avoid it), and why.
func (s *State) blockedNow(a *Attempt) (string, bool) {
	f := s.newFitter(s.now)
	w := f.waiting(a)
	if w.Open > 0 || w.Eligible == 0 {
		return "", false // another node can run it, or its clock decides
	}
	return f.reason(a, w), true
}

// giveUp ends a (out of the queue, its lease released) with outcome and
// why, and tells the cross-check no node will run its unit's jobs: never
// scored, never charged to a node.
func (s *State) giveUp(a *Attempt, outcome, why string) {
	s.log.Warn("attempt failed: no node can run it", "attempt", a.ID, "outcome", outcome, "why", why)
	a.Outcome = outcome
	s.endAttempt(a, why)
	if !booked(a) {
		s.replayEnded(a)
		return
	}
	eff, err := s.Book.Undeliverable(a.Unit, a.ID, why)
	s.bookCall(a.Unit, "undeliverable", eff, err)
}

// Waiting says why each unfinished attempt of ids waits at now (attempts
// finished or unknown are left out). A blocked attempt whose clock has not
// started yet (no round of checkStuck since it was found so: at most
// stuckCheckEvery, stuckCheckSoon after an attempt is added) has no Since
// or Deadline yet.
func (s *State) Waiting(ids []string, now time.Time) map[string]Waiting {
	f := s.newFitter(now)
	out := map[string]Waiting{}
	for _, id := range ids {
		a := s.Attempts[id]
		if a == nil || (a.State != StateQueued && a.State != StateAssigned) {
			continue
		}
		w := f.waiting(a)
		w.Reason = f.reason(a, w)
		if w.Blocked && !a.StuckSince.IsZero() {
			w.Since, w.Deadline = a.StuckSince, a.StuckSince.Add(s.stuckBound(a))
		}
		out[id] = w
	}
	return out
}

// keepOff keeps a off node for good (the node declined or failed it).
func (a *Attempt) keepOff(node string) {
	if !slices.Contains(a.Avoid, node) {
		a.Avoid = append(a.Avoid, node)
	}
}
