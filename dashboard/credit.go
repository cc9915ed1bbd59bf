package dashboard

import (
	"cmp"
	"slices"
	"strings"
)

// Credit is what a node or operator contributed, as BOINC counts it: the
// attempts whose report counted, with their CPU and wall-clock hours.
type Credit struct {
	Name      string  `json:"name"`
	Attempts  int     `json:"attempts"`
	CPUHours  float64 `json:"cpu_hours"`
	WallHours float64 `json:"wall_hours"`
}

// CreditInput is one attempt whose report counted: who reported it and
// what it used.
type CreditInput struct {
	Node, Operator          string
	CPUSeconds, WallSeconds float64
}

// SumCredit adds up credit in total, by node and by operator (an empty
// operator counts as the node's own), each list by CPU hours, most first,
// then name.
func SumCredit(in []CreditInput) (total Credit, nodes, operators []Credit) {
	byNode, byOp := map[string]*Credit{}, map[string]*Credit{}
	add := func(m map[string]*Credit, name string, x CreditInput) {
		c := m[name]
		if c == nil {
			c = &Credit{Name: name}
			m[name] = c
		}
		c.Attempts++
		c.CPUHours += x.CPUSeconds / 3600
		c.WallHours += x.WallSeconds / 3600
	}
	total.Name = "total"
	for _, x := range in {
		add(byNode, x.Node, x)
		add(byOp, cmp.Or(x.Operator, x.Node), x)
		total.Attempts++
		total.CPUHours += x.CPUSeconds / 3600
		total.WallHours += x.WallSeconds / 3600
	}
	return total, sortedCredit(byNode), sortedCredit(byOp)
}

func sortedCredit(m map[string]*Credit) []Credit {
	out := make([]Credit, 0, len(m))
	for _, c := range m {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Credit) int {
		if d := cmp.Compare(b.CPUHours, a.CPUHours); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}
