package dashboard

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Charts are SVG drawn by the templates from the geometry computed here
// (so every label goes through the template's escaping): the
// cost-accuracy Pareto chart of a board, progress bars and credit bars.

// Plot is the geometry of a board's cost-accuracy chart.
type Plot struct {
	Width, Height float64
	// Left, Top, Right, Bottom bound the plotting area.
	Left, Top, Right, Bottom float64
	XTicks, YTicks           []Tick
	Points                   []Point
	// Frontier is the polyline through the Pareto rows, cheapest first.
	Frontier string
	// Omitted counts rows with runs but no metered cost (not plotted).
	Omitted int
}

// Tick is an axis tick at a position, with its label.
type Tick struct {
	At    float64
	Label string
}

// Point is one row on the chart.
type Point struct {
	X, Y     float64
	Label    string
	Title    string
	Frontier bool
}

// ParetoPlot lays out a board's rows with runs and a cost: accuracy up,
// cost per run right; nil when no row has both.
func ParetoPlot(b Board) *Plot {
	p := &Plot{Width: 680, Height: 330, Left: 72, Top: 20, Right: 620, Bottom: 276}
	var rows []Row
	for _, r := range b.Rows {
		switch {
		case r.Runs == 0:
		case r.CostUSD == nil:
			p.Omitted++
		default:
			rows = append(rows, r)
		}
	}
	if len(rows) == 0 {
		return nil
	}
	maxCost := 0.0
	for _, r := range rows {
		maxCost = max(maxCost, *r.CostUSD)
	}
	step := niceStep(maxCost / 4)
	xMax := step * math.Ceil(maxCost/step)
	if xMax <= maxCost {
		xMax += step
	}
	x := func(c float64) float64 { return p.Left + (p.Right-p.Left)*c/xMax }
	y := func(a float64) float64 { return p.Bottom - (p.Bottom-p.Top)*a }
	for v := 0.0; v <= xMax+step/2; v += step {
		p.XTicks = append(p.XTicks, Tick{At: x(v), Label: usd(v)})
	}
	for i := 0; i <= 4; i++ {
		a := float64(i) / 4
		p.YTicks = append(p.YTicks, Tick{At: y(a), Label: fmt.Sprintf("%.0f%%", 100*a)})
	}
	var front []Point
	for _, r := range rows {
		name := r.Agent
		if r.Model != "" {
			name += " (" + r.Model + ")"
		}
		pt := Point{X: x(*r.CostUSD), Y: y(r.Accuracy), Label: name, Frontier: r.Pareto,
			Title: fmt.Sprintf("%s: accuracy %.1f%% (%.1f-%.1f%%), %s a run", name, 100*r.Accuracy, 100*r.AccuracyMin,
				100*r.AccuracyMax, usd(*r.CostUSD))}
		p.Points = append(p.Points, pt)
		if r.Pareto {
			front = append(front, pt)
		}
	}
	slices.SortFunc(front, func(a, b Point) int { return cmp.Compare(a.X, b.X) })
	var sb strings.Builder
	for i, pt := range front {
		if i > 0 {
			sb.WriteByte(' ')
		}
		fmt.Fprintf(&sb, "%.1f,%.1f", pt.X, pt.Y)
	}
	p.Frontier = sb.String()
	return p
}

// niceStep rounds v up to 1, 2 or 5 times a power of ten.
func niceStep(v float64) float64 {
	if v <= 0 || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0.01
	}
	pow := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*pow >= v {
			return m * pow
		}
	}
	return 10 * pow
}

// Bar is a progress bar's geometry: segments from the left, out of Width.
type Bar struct {
	Width                  float64
	Done, Failed, Pending  float64
	DoneX, FailedX, PendX  float64
	Percent                int
	DoneN, FailedN, Totals int
}

// ProgressBar lays out p's finished and pending attempts on a bar.
func ProgressBar(p Progress) Bar {
	b := Bar{Width: 240, DoneN: p.Done, FailedN: p.Failed, Totals: p.Total}
	if p.Total == 0 {
		return b
	}
	scale := b.Width / float64(p.Total)
	b.Done, b.Failed, b.Pending = scale*float64(p.Done), scale*float64(p.Failed), scale*float64(p.Pending)
	b.FailedX = b.Done
	b.PendX = b.Done + b.Failed
	b.Percent = 100 * (p.Done + p.Failed) / p.Total
	return b
}

// CreditBar is one bar of a credit chart.
type CreditBar struct {
	Y, Width float64
	Label    string
	Value    string
}

// CreditBars lays out the first n credits as horizontal bars, the longest
// Width wide.
func CreditBars(cs []Credit, n int, width float64) []CreditBar {
	cs = cs[:min(n, len(cs))]
	most := 0.0
	for _, c := range cs {
		most = max(most, c.CPUHours)
	}
	out := make([]CreditBar, len(cs))
	for i, c := range cs {
		w := 0.0
		if most > 0 {
			w = width * c.CPUHours / most
		}
		out[i] = CreditBar{Y: float64(i) * 22, Width: w, Label: short(c.Name), Value: fmt.Sprintf("%.3f CPU-h", c.CPUHours)}
	}
	return out
}

// short shortens a long name (a peer ID) to its first and last digits.
func short(s string) string {
	if len(s) <= 20 {
		return s
	}
	return s[:8] + "…" + s[len(s)-6:]
}

// usd formats dollars: cents above a dollar, else three significant
// digits ($0.006, $0.0125).
func usd(v float64) string {
	if math.Abs(v) >= 1 || v == 0 {
		return fmt.Sprintf("$%.2f", v)
	}
	digits := 3 - int(math.Ceil(math.Log10(math.Abs(v))))
	return "$" + strconv.FormatFloat(math.Round(v*math.Pow(10, float64(digits)))/math.Pow(10, float64(digits)), 'f', -1, 64)
}
