package coordinator

import (
	"cmp"
	"math"
	"slices"
	"time"

	"github.com/repronet/repronet/bench"
)

// The leaderboards are each suite's family's boards (bench.Suite.Boards)
// built from one bench.Entry per run of an agent on a task at a variant
// (canaries and capsule runs left out; see core.State.Entries for the
// statuses). This file adds what the public may see of them.

// LeaderboardEntries returns one entry per run of every evaluation
// (core.State.Entries): never a canary, never a gold answer, sorted by
// suite, variant (in the suite's order), agent, task and run.
func (c *Coordinator) LeaderboardEntries() []bench.Entry {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.Entries()
}

// PublicEntries are LeaderboardEntries as the public reads them: only
// what a reader of a leaderboard needs. A node knows the exact CPU time
// and start of each attempt it ran, so exact figures would let it learn
// afterwards which of its attempts counted and which were canaries: times
// are left out, CPU and wall time rounded to two significant digits, and
// each evaluation is named by its label (evalLabel), not its ID.
func (c *Coordinator) PublicEntries() []bench.Entry {
	out := c.LeaderboardEntries()
	labels := map[string]string{}
	for i := range out {
		out[i].Started, out[i].Finished = time.Time{}, time.Time{}
		out[i].CPUSeconds, out[i].WallSeconds = roundSignificant(out[i].CPUSeconds, 2), roundSignificant(out[i].WallSeconds, 2)
		l, ok := labels[out[i].Eval]
		if !ok {
			l = c.evalLabel(out[i].Eval)
			labels[out[i].Eval] = l
		}
		out[i].Eval = l
	}
	return out
}

// roundSignificant rounds v to digits significant digits.
func roundSignificant(v float64, digits int) float64 {
	if v == 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return v
	}
	scale := math.Pow(10, float64(digits)-math.Ceil(math.Log10(math.Abs(v))))
	return math.Round(v*scale) / scale
}

// PublicBoards are the leaderboards built from PublicEntries.
func (c *Coordinator) PublicBoards() []any { return c.boards(c.PublicEntries()) }

// Boards computes the leaderboards: each suite's family's, from its
// entries, suites in name order.
func (c *Coordinator) Boards() []any { return c.boards(c.LeaderboardEntries()) }

func (c *Coordinator) boards(entries []bench.Entry) []any {
	bySuite := map[string][]bench.Entry{}
	for _, e := range entries {
		bySuite[e.Suite] = append(bySuite[e.Suite], e)
	}
	names := make([]string, 0, len(bySuite))
	for n := range bySuite {
		names = append(names, n)
	}
	slices.SortFunc(names, cmp.Compare)
	out := []any{}
	for _, n := range names {
		s, ok := c.catalog.LookupSuite(n)
		if !ok {
			continue
		}
		b, err := s.Bench.Boards(bySuite[n])
		if err != nil {
			c.log.Error("leaderboard of a suite not built", "suite", n, "err", err)
			continue
		}
		out = append(out, b...)
	}
	return out
}
