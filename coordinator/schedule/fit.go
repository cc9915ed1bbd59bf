package schedule

import (
	"slices"
	"strings"
)

// Misfit says why a node could never run a job, whatever its free slots:
// what the scheduler's matchmaking checks of the node itself, leaving out
// what changes with placement (free slots and GPUs, where the other
// replicas of its unit run) and the job's own avoid list.
type Misfit int

// Misfits, in the order Explain checks them.
const (
	// Fits: the node could run the job once it has a free slot.
	Fits Misfit = iota
	// SuiteNotServed, GroupNotServed: the node lists the suites or
	// groups it serves, and not the job's.
	SuiteNotServed
	GroupNotServed
	// SlotTooSmall: one of the node's slots offers less CPU, memory or
	// disk than the job needs.
	SlotTooSmall
	// TooFewGPUs: the node has fewer GPUs of the model and memory the job
	// needs than it needs.
	TooFewGPUs
)

// Fits reports whether a slot of shape s holds a job needing n: each
// dimension the slot announces is at least the need.
func (s Shape) Fits(n Shape) bool { return s.fits(n) }

// Explain says whether node v could ever run p (Fits), else the first
// reason it could not. It agrees with Schedule: a node Schedule may place
// p on is one Explain says Fits.
func Explain(p Pending, v NodeView) Misfit {
	switch {
	case len(v.Suites) > 0 && !slices.Contains(v.Suites, p.Suite):
		return SuiteNotServed
	case len(v.Groups) > 0 && !slices.Contains(v.Groups, p.Group):
		return GroupNotServed
	case !v.Slot.fits(p.Needs):
		return SlotTooSmall
	case p.GPUs.Count > 0 && matchingGPUs(v.GPUs, p.GPUs) < p.GPUs.Count:
		return TooFewGPUs
	}
	return Fits
}

// matchingGPUs counts the GPUs that can serve need, busy or not.
func matchingGPUs(gpus []GPU, need GPUNeed) int {
	m := 0
	for _, g := range gpus {
		if g.MemoryBytes >= need.MinMemoryBytes && strings.Contains(strings.ToLower(g.Model), strings.ToLower(need.Model)) {
			m++
		}
	}
	return m
}
