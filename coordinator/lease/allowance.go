package lease

import "time"

// Allowance is how many attempts a node may hold from this coordinator at
// once, whatever it announces: BOINC's host quota, adapted. A node starts
// small, earns one more attempt for each report that counts (so a node
// that finishes its work doubles its allowance about every round of
// attempts), and loses half for each lease it lets run out and each
// infrastructure failure it reports. After AllowancePolicy.CoolAfter
// infrastructure failures in a row it gets nothing for a while, twice as
// long each time, and then one attempt. The allowance is apart from the
// cross-check's record: a node with honest infrastructure trouble loses
// work, not trust (a lost lease also counts there as a missed deadline,
// which only makes its work replicated again; an infrastructure failure
// not at all). The core keeps one Allowance per admitted operator's node
// and one shared by all unadmitted nodes (peer IDs are free).
//
// It is plain data, persisted in the node's record; AllowancePolicy's
// methods are pure.
type Allowance struct {
	// Slots is the allowance; 0 means the policy's Initial.
	Slots int `json:"slots,omitempty"`
	// InfraStreak counts infrastructure failures since the last report
	// that counted.
	InfraStreak int `json:"infra_streak,omitempty"`
	// CoolUntil: no work before then.
	CoolUntil time.Time `json:"cool_until,omitzero"`
}

// AllowancePolicy sets how allowances start, grow and shrink.
type AllowancePolicy struct {
	// Initial is a new node's allowance (default 2); Max caps it (default
	// proto.MaxSlots: then only what the node announces).
	Initial, Max int
	// CoolAfter infrastructure failures in a row send a node to cool down
	// for CoolFor, doubled for each further one, at most CoolMax.
	CoolAfter        int
	CoolFor, CoolMax time.Duration
}

// DefaultAllowancePolicy starts nodes at 2 attempts and cools a node down
// for a minute after 5 infrastructure failures in a row (up to an hour).
func DefaultAllowancePolicy() AllowancePolicy {
	return AllowancePolicy{Initial: 2, Max: 1024, CoolAfter: 5, CoolFor: time.Minute, CoolMax: time.Hour}
}

func (p AllowancePolicy) slots(a Allowance) int {
	if a.Slots <= 0 {
		return p.Initial
	}
	return min(a.Slots, p.Max)
}

// Limit is how many attempts the node may hold at now.
func (p AllowancePolicy) Limit(a Allowance, now time.Time) int {
	if now.Before(a.CoolUntil) {
		return 0
	}
	return p.slots(a)
}

// Completed is a after a report of the node counted.
func (p AllowancePolicy) Completed(a Allowance) Allowance {
	return Allowance{Slots: min(p.slots(a)+1, p.Max)}
}

// LeaseLost is a after the node let a lease run out (or its process died).
func (p AllowancePolicy) LeaseLost(a Allowance) Allowance {
	a.Slots = max(1, p.slots(a)/2)
	return a
}

// InfraFailure is a after the node reported an infrastructure failure at now.
func (p AllowancePolicy) InfraFailure(a Allowance, now time.Time) Allowance {
	a.Slots = max(1, p.slots(a)/2)
	a.InfraStreak++
	if p.CoolAfter > 0 && a.InfraStreak >= p.CoolAfter {
		d := p.CoolFor
		for i := p.CoolAfter; i < a.InfraStreak && d < p.CoolMax; i++ {
			d *= 2
		}
		a.CoolUntil = now.Add(min(d, p.CoolMax))
	}
	return a
}
