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
	// XLabel and YLabel say what each axis is.
	XLabel, YLabel string
	// Axis is the board's cost axis (CostModel or CostCompute); Unmetered
	// counts the rows with runs but no metered model cost, which put the
	// chart on CPU time.
	Axis      string
	Unmetered int
}

// Tick is an axis tick at a position, with its label.
type Tick struct {
	At    float64
	Label string
}

// Point is one row on the chart, with its label at (LX, LY) anchored
// at Anchor (start, or end when the point is in the right half: a label
// never runs out of the chart).
type Point struct {
	X, Y     float64
	LX, LY   float64
	Anchor   string
	Label    string
	Title    string
	Frontier bool
}

// ParetoPlot lays out every row of a board with runs: accuracy up, cost
// per run right on the board's cost axis (model cost in dollars, or CPU
// time when an agent has no metered model cost); nil when no row has
// runs.
func ParetoPlot(b Board) *Plot {
	p := &Plot{Width: 680, Height: 330, Left: 72, Top: 20, Right: 620, Bottom: 276, Axis: cmp.Or(b.CostAxis, CostModel),
		YLabel: "accuracy (mean over runs)"}
	var rows []Row
	for _, r := range b.Rows {
		if r.Runs == 0 || r.Cost(p.Axis) == nil {
			continue
		}
		if r.CostUSD == nil {
			p.Unmetered++
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil
	}
	format := usd
	p.XLabel = "model cost per run (USD)"
	if p.Axis == CostCompute {
		format, p.XLabel = cpuTime, "compute per run (CPU time)"
	}
	maxCost := 0.0
	for _, r := range rows {
		maxCost = max(maxCost, *r.Cost(p.Axis))
	}
	step := niceStep(maxCost / 4)
	xMax := step * math.Ceil(maxCost/step)
	if xMax <= maxCost {
		xMax += step
	}
	x := func(c float64) float64 { return p.Left + (p.Right-p.Left)*c/xMax }
	y := func(a float64) float64 { return p.Bottom - (p.Bottom-p.Top)*a }
	for i := 0; float64(i)*step <= xMax+step/2; i++ {
		v := float64(i) * step
		p.XTicks = append(p.XTicks, Tick{At: x(v), Label: format(v)})
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
		cost := *r.Cost(p.Axis)
		pt := Point{X: x(cost), Y: y(r.Accuracy), Label: name, Frontier: r.Pareto,
			Title: fmt.Sprintf("%s: accuracy %.1f%% (%.1f-%.1f%%), %s a run", name, 100*r.Accuracy, 100*r.AccuracyMin,
				100*r.AccuracyMax, format(cost))}
		pt.LX, pt.LY, pt.Anchor = pt.X+8, pt.Y-8, "start"
		if pt.X > (p.Left+p.Right)/2 {
			pt.LX, pt.Anchor = pt.X-8, "end"
		}
		if pt.LY < p.Top+4 {
			pt.LY = pt.Y + 18
		}
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

// cpuTime formats CPU seconds on an axis.
func cpuTime(sec float64) string {
	switch {
	case sec == 0:
		return "0 s"
	case sec < 60:
		return strconv.FormatFloat(sec, 'g', 3, 64) + " s"
	case sec < 3600:
		return strconv.FormatFloat(sec/60, 'g', 3, 64) + " min"
	}
	return strconv.FormatFloat(sec/3600, 'g', 3, 64) + " h"
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
		out[i] = CreditBar{Y: float64(i) * 22, Width: w, Label: short(c.Name), Value: Hours(c.CPUHours) + " CPU-h"}
	}
	return out
}

// Hours formats hours as the credit tables and bars show them: four
// decimals, or three significant digits below 0.001 (a bar never says 0
// beside a table that does not).
func Hours(h float64) string {
	if h != 0 && math.Abs(h) < 0.001 {
		return strconv.FormatFloat(h, 'g', 3, 64)
	}
	return strconv.FormatFloat(h, 'f', 4, 64)
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
