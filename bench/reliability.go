package bench

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
)

// Reliability measures (issue 27): what the runs an evaluation already has
// say of how reliably an agent reaches its answers, beside the mean. Every
// family's board rows carry them (Row.Reliability), computed here from
// the validated runs of the row, each reduced to passed or not by the
// family's pass rule (named in Reliability.Pass).
//
// The measures, as ReliabilityKey names them:
//
//   - pass@k: the chance that at least one of k runs of a task, drawn
//     without replacement from its n validated runs of which c passed,
//     passes: the unbiased estimator of Chen et al. 2021,
//     1 - C(n-c, k) / C(n, k), averaged over the tasks with n >= k.
//   - pass^k: the chance that all k drawn runs pass, C(c, k) / C(n, k),
//     averaged likewise.
//   - consistency: of the tasks with two validated runs or more, the share
//     whose runs all agree (all passed, or all failed).
//   - cost and wall time spread: min, median and max over the validated
//     runs (per task, and over the row's runs).

// RunOutcome is one validated run of a task as the reliability measures
// see it. A run is named by its evaluation and its number there (every
// evaluation numbers its runs from 1).
type RunOutcome struct {
	Task string
	Eval string
	Run  int
	Pass bool
	// CostUSD is the run's model cost, nil when not metered.
	CostUSD     *float64
	WallSeconds float64
}

// Outcome is e as a RunOutcome that passed or not.
func (e Entry) Outcome(pass bool) RunOutcome {
	return RunOutcome{Task: e.TaskID, Eval: e.Eval, Run: e.Run, Pass: pass, CostUSD: e.CostUSD, WallSeconds: e.WallSeconds}
}

// Reliability is a board row's reliability measures.
type Reliability struct {
	// Pass names the family's rule for a passed run on this board
	// ("task_correct": every question of the task right).
	Pass string `json:"pass"`
	// Tasks counts the tasks with a validated run, Runs the validated
	// runs; MinRuns and MaxRuns the fewest and most runs of a task.
	Tasks   int `json:"tasks"`
	Runs    int `json:"runs"`
	MinRuns int `json:"min_runs"`
	MaxRuns int `json:"max_runs"`
	// PassAtK and PassHatK hold k = 1 .. MaxRuns, in order.
	PassAtK  []AtK `json:"pass_at_k"`
	PassHatK []AtK `json:"pass_hat_k"`
	// Consistency is ConsistentTasks / RepeatedTasks: of the tasks with
	// two runs or more, the share whose runs all agree; nil when no task
	// has two runs.
	Consistency     *float64 `json:"consistency"`
	ConsistentTasks int      `json:"consistent_tasks"`
	RepeatedTasks   int      `json:"repeated_tasks"`
	// CostUSD and WallSeconds spread over the row's validated runs (cost:
	// its metered runs; nil when none was).
	CostUSD     *Spread `json:"cost_usd"`
	WallSeconds *Spread `json:"wall_seconds"`
	// PerTask lists the tasks by ID: which runs passed, and the spread of
	// their cost and wall time.
	PerTask []TaskRuns `json:"per_task"`
}

// AtK is pass@k or pass^k for one k: the mean over Tasks tasks (those
// with k runs or more).
type AtK struct {
	K     int     `json:"k"`
	Value float64 `json:"value"`
	Tasks int     `json:"tasks"`
}

// Spread is the min, median and max of N values.
type Spread struct {
	Min    float64 `json:"min"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	N      int     `json:"n"`
}

// TaskRuns is one task's runs on a row.
type TaskRuns struct {
	Task string `json:"task"`
	// Runs are the task's validated runs by evaluation and run number,
	// each passed or not.
	Runs   []RunPass `json:"runs"`
	Passed int       `json:"passed"`
	// Consistent: the runs all agree (a single run does too).
	Consistent  bool    `json:"consistent"`
	CostUSD     *Spread `json:"cost_usd"`
	WallSeconds *Spread `json:"wall_seconds"`
}

// RunPass is one run of a task: its evaluation (as the entries name it)
// and number there, and whether it passed.
type RunPass struct {
	Eval string `json:"eval,omitempty"`
	Run  int    `json:"run"`
	Pass bool   `json:"pass"`
}

// PassAtK is the unbiased estimate of pass@k for a task with n runs of
// which c passed: 1 - C(n-c, k) / C(n, k), computed as a product so that
// large n neither overflows nor loses precision. k must be in [1, n].
func PassAtK(n, c, k int) float64 {
	if n-c < k {
		return 1
	}
	// C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k/i)
	q := 1.0
	for i := n - c + 1; i <= n; i++ {
		q *= 1 - float64(k)/float64(i)
	}
	return 1 - q
}

// PassHatK is the estimate of pass^k for a task with n runs of which c
// passed: the chance that k runs drawn without replacement all passed,
// C(c, k) / C(n, k). k must be in [1, n].
func PassHatK(n, c, k int) float64 {
	if c < k {
		return 0
	}
	p := 1.0
	for i := range k {
		p *= float64(c-i) / float64(n-i)
	}
	return p
}

// SpreadOf is the spread of xs; nil when xs is empty.
func SpreadOf(xs []float64) *Spread {
	if len(xs) == 0 {
		return nil
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	med := s[n/2]
	if n%2 == 0 {
		med = (s[n/2-1] + s[n/2]) / 2
	}
	return &Spread{Min: s[0], Median: med, Max: s[n-1], N: n}
}

// MeasureReliability computes a row's measures from its validated runs
// (one per task, evaluation and run number) under the pass rule named
// pass.
func MeasureReliability(pass string, runs []RunOutcome) *Reliability {
	byTask := map[string][]RunOutcome{}
	for _, r := range runs {
		byTask[r.Task] = append(byTask[r.Task], r)
	}
	out := &Reliability{Pass: pass, Tasks: len(byTask), Runs: len(runs), PassAtK: []AtK{}, PassHatK: []AtK{}, PerTask: []TaskRuns{}}
	var costs, walls []float64
	type counted struct{ n, c int }
	var tasks []counted
	for _, id := range slices.Sorted(maps.Keys(byTask)) {
		rs := byTask[id]
		slices.SortFunc(rs, func(a, b RunOutcome) int { return cmp.Or(cmp.Compare(a.Eval, b.Eval), cmp.Compare(a.Run, b.Run)) })
		tr := TaskRuns{Task: id, Runs: make([]RunPass, 0, len(rs)), Consistent: true}
		var tc, tw []float64
		for _, r := range rs {
			tr.Runs = append(tr.Runs, RunPass{Eval: r.Eval, Run: r.Run, Pass: r.Pass})
			if r.Pass {
				tr.Passed++
			}
			if r.Pass != rs[0].Pass {
				tr.Consistent = false
			}
			if r.CostUSD != nil {
				tc = append(tc, *r.CostUSD)
			}
			tw = append(tw, r.WallSeconds)
		}
		tr.CostUSD, tr.WallSeconds = SpreadOf(tc), SpreadOf(tw)
		costs, walls = append(costs, tc...), append(walls, tw...)
		out.PerTask = append(out.PerTask, tr)
		tasks = append(tasks, counted{len(rs), tr.Passed})
		if len(rs) >= 2 {
			out.RepeatedTasks++
			if tr.Consistent {
				out.ConsistentTasks++
			}
		}
		if out.MinRuns == 0 || len(rs) < out.MinRuns {
			out.MinRuns = len(rs)
		}
		out.MaxRuns = max(out.MaxRuns, len(rs))
	}
	for k := 1; k <= out.MaxRuns; k++ {
		at, hat := AtK{K: k}, AtK{K: k}
		for _, t := range tasks { // in task order: the sums are reproducible
			if t.n < k {
				continue
			}
			at.Tasks++
			hat.Tasks++
			at.Value += PassAtK(t.n, t.c, k)
			hat.Value += PassHatK(t.n, t.c, k)
		}
		at.Value /= float64(at.Tasks)
		hat.Value /= float64(hat.Tasks)
		out.PassAtK, out.PassHatK = append(out.PassAtK, at), append(out.PassHatK, hat)
	}
	if out.RepeatedTasks > 0 {
		x := float64(out.ConsistentTasks) / float64(out.RepeatedTasks)
		out.Consistency = &x
	}
	out.CostUSD, out.WallSeconds = SpreadOf(costs), SpreadOf(walls)
	return out
}

// ReliabilityKey names each reliability measure and says what it is: the
// key printed under boards and shown beside them.
func ReliabilityKey() []KeyItem {
	return []KeyItem{
		{"pass", "the family's rule for a passed run on the board (CORE-Bench: task_correct, every question right)"},
		{"pass@k", "chance that at least one of k runs of a task passes: 1 - C(n-c,k)/C(n,k) over its n validated runs of which c passed (Chen et al. 2021), mean over tasks with n >= k"},
		{"pass^k", "chance that all k runs of a task pass: C(c,k)/C(n,k), mean over tasks with n >= k"},
		{"consistency", "of the tasks with 2 or more validated runs, the share whose runs all agree (all passed or all failed)"},
		{"cost, wall spread", "min / median / max over the validated runs (per task, and over the row's runs)"},
		{"per task", "each task's runs in run order, + passed, - failed"},
	}
}

// KeyItem is one line of a board's key.
type KeyItem struct {
	Name    string `json:"name"`
	Meaning string `json:"meaning"`
}

// ReliabilityText is how text views (the CLI) show a row's measures: a
// few lines, each indented by indent, without a trailing newline. A k
// over fewer tasks than the row has is followed by its task count.
func ReliabilityText(r *Reliability, indent string) []string {
	if r == nil || r.Runs == 0 {
		return []string{indent + "reliability: no validated run"}
	}
	pct := func(x float64) string { return strconv.FormatFloat(100*x, 'f', 1, 64) + "%" }
	ks := func(name string, xs []AtK) string {
		parts := make([]string, 0, len(xs))
		for _, x := range xs {
			p := name + strconv.Itoa(x.K) + " " + pct(x.Value)
			if x.Tasks < r.Tasks {
				p += " (" + strconv.Itoa(x.Tasks) + " tasks)"
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "  ")
	}
	lines := []string{
		fmt.Sprintf("%sreliability (pass = %s; %d runs of %d tasks, %d-%d per task)", indent, r.Pass, r.Runs, r.Tasks, r.MinRuns, r.MaxRuns),
		indent + "  " + ks("pass@", r.PassAtK),
		indent + "  " + ks("pass^", r.PassHatK),
	}
	cons := "consistency - (no task has 2 runs)"
	if r.Consistency != nil {
		cons = fmt.Sprintf("consistency %s (%d of %d tasks with 2+ runs agree)", pct(*r.Consistency), r.ConsistentTasks, r.RepeatedTasks)
	}
	spread := func(s *Spread, f func(float64) string) string {
		if s == nil {
			return "-"
		}
		return fmt.Sprintf("%s / %s / %s (%d runs)", f(s.Min), f(s.Median), f(s.Max), s.N)
	}
	dollars := func(x float64) string { return "$" + strconv.FormatFloat(x, 'f', 4, 64) }
	secs := func(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) + "s" }
	lines = append(lines, indent+"  "+cons,
		indent+"  cost min/median/max "+spread(r.CostUSD, dollars)+"; wall "+spread(r.WallSeconds, secs))
	line := indent + "  per task (+ passed, - failed, by run):"
	for _, t := range r.PerTask {
		var b strings.Builder
		for _, run := range t.Runs {
			if run.Pass {
				b.WriteByte('+')
			} else {
				b.WriteByte('-')
			}
		}
		item := " " + t.Task + " " + b.String()
		if len(line)+len(item) > 100 {
			lines = append(lines, line)
			line = indent + "   "
		}
		line += item
	}
	return append(lines, line)
}
