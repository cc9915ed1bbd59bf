package coordinator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/dashboard"
)

// The views of the state for each scope (package dashboard's types, which
// the JSON API serves and the pages render). Reads only: each takes the
// lock once, through the state's queries.

// entryKey names the unit of a leaderboard entry and its public score.
type entryKey struct {
	suite, agent, task, variant string
	run                         int
	public                      string
}

// dashEntries turns leaderboard entries into the dashboard's, each with
// its score's value: a bench.Entry carries only the family's public
// score, whose value is that of any attempt of its unit scored with that
// very public score (a family's value is a function of its public score).
func (c *Coordinator) dashEntries(es []bench.Entry) []dashboard.Entry {
	values := map[entryKey]float64{}
	for _, a := range c.Attempts() {
		if a.Score != nil {
			values[entryKey{a.Suite, a.Agent, a.TaskID, a.Level, max(a.Run, 1), string(a.Score.Public)}] = a.Score.Value
		}
	}
	// graders are the suites' bench.ValueGrader (nil: a suite grading each
	// job one way).
	graders := map[string]bench.ValueGrader{}
	out := make([]dashboard.Entry, len(es))
	for i, e := range es {
		d := dashboard.Entry{Suite: e.Suite, Variant: e.Variant, Scoring: scoringLabel(e.Scoring), Agent: e.Agent, Model: e.Model,
			Task: e.TaskID, Run: e.Run, Status: string(e.Status), CostUSD: e.CostUSD, InputTokens: e.InputTokens,
			OutputTokens: e.OutputTokens, CPUSeconds: e.CPUSeconds, WallSeconds: e.WallSeconds, Verification: e.Verification, Eval: e.Eval}
		d.Written, d.Vision = questionKinds(e.Score)
		vg, seen := graders[e.Suite]
		if !seen {
			if si, ok := c.catalog.LookupSuite(e.Suite); ok {
				vg, _ = si.Bench.(bench.ValueGrader)
			}
			graders[e.Suite] = vg
		}
		if vg != nil {
			d.Grader = vg.ValueGrader(e.Scoring)
		}
		if len(e.Score) > 0 {
			if v, ok := values[entryKey{e.Suite, e.Agent, e.TaskID, e.Variant, e.Run, string(e.Score)}]; ok {
				d.Value = &v
			}
		}
		out[i] = d
	}
	return out
}

// questionKinds reads whether all of a task's written and vision
// questions were right from a public score that counts them (CORE-Bench's,
// whose boards and HAL uploads give written and vision accuracy): nil for
// a kind the task has none of, or a score without the counts.
func questionKinds(public json.RawMessage) (written, vision *bool) {
	var s struct {
		CorrectWritten *int `json:"correct_written_answers"`
		TotalWritten   *int `json:"total_written_questions"`
		CorrectVision  *int `json:"correct_vision_answers"`
		TotalVision    *int `json:"total_vision_questions"`
	}
	if len(public) == 0 || json.Unmarshal(public, &s) != nil {
		return nil, nil
	}
	all := func(correct, total *int) *bool {
		if correct == nil || total == nil || *total <= 0 {
			return nil
		}
		ok := *correct == *total
		return &ok
	}
	return all(s.CorrectWritten, s.TotalWritten), all(s.CorrectVision, s.TotalVision)
}

// scoringLabel is a family's scoring JSON as one line: an object's fields
// as key=value in key order, anything else as it is.
func scoringLabel(raw json.RawMessage) string {
	var m map[string]any
	if json.Unmarshal(raw, &m) != nil {
		return string(raw)
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%v", k, m[k])
	}
	return strings.Join(parts, " ")
}

// publicEntries are the public's board entries: a snapshot at most
// Config.PublicBoardsEvery old (see there), and when it was taken.
func (c *Coordinator) publicEntries(now time.Time) ([]dashboard.Entry, time.Time) {
	w := c.web
	w.publicMu.Lock()
	defer w.publicMu.Unlock()
	if w.public.entries == nil || now.Sub(w.public.at) >= c.cfg.PublicBoardsEvery {
		w.public = entriesSnapshot{at: now, entries: c.dashEntries(c.PublicEntries())}
	}
	return w.public.entries, w.public.at
}

// boardEntries are the entries reader p sees: live for the admin, the
// public snapshot for everyone else, with the live entries of agent when
// p's group owns it (its own work, which it follows live).
func (c *Coordinator) boardEntries(p accounts.Principal, agent string) ([]dashboard.Entry, time.Time, bool) {
	now := time.Now()
	if p.Scope == accounts.ScopeAdmin {
		return c.dashEntries(c.LeaderboardEntries()), now, true
	}
	pub, at := c.publicEntries(now)
	if agent == "" || !c.ownsAgent(p, agent) {
		return pub, at, false
	}
	var out []dashboard.Entry
	for _, e := range pub {
		if e.Agent != agent {
			out = append(out, e)
		}
	}
	for _, e := range c.dashEntries(c.PublicEntries()) {
		if e.Agent == agent {
			out = append(out, e)
		}
	}
	return out, now, true
}

// ownsAgent reports whether p's group owns agent (the admin owns all).
func (c *Coordinator) ownsAgent(p accounts.Principal, agent string) bool {
	if p.Scope == accounts.ScopeAdmin {
		return true
	}
	g, ok := c.web.accounts.AgentOwner(agent)
	return ok && p.MayRead(g)
}

// finished reports whether an attempt's state is final.
func finished(s AttemptState) bool {
	return s == StateDone || s == StateFailed || s == StateCancelled
}

// attemptView is what p sees of attempt a (which p may see). A submitter
// sees a handle instead of its ID, "pending" for queued, assigned and
// reported alike, and its times, outcome and logs only once it is
// finished: a node that could watch its group's attempts move while it
// runs one would tell its canaries (which move nothing there) apart.
func (c *Coordinator) attemptView(p accounts.Principal, a Attempt) dashboard.Attempt {
	admin := p.Scope == accounts.ScopeAdmin
	v := dashboard.Attempt{ID: a.ID, Eval: a.Eval, Suite: a.Suite, Task: a.TaskID, Variant: a.Level, Stage: a.Stage,
		Agent: a.Agent, Group: a.Group, Run: max(a.Run, 1), Replica: a.Replica, State: string(a.State),
		Enqueued: a.EnqueuedAt.UTC().Truncate(time.Second)}
	if a.Kind == KindReplay {
		v.Kind, v.ReplayOf = dashboard.KindReplay, a.ReplayOf
	}
	if a.Kind == KindCapsuleRun {
		v.Repro = a.TaskID
	}
	if !admin {
		v.ID = c.web.handle(a.ID)
		if v.ReplayOf != "" {
			v.ReplayOf = c.web.handle(a.ReplayOf)
		}
		if !finished(a.State) {
			v.State = "pending"
		}
	}
	if si, ok := c.catalog.LookupSuite(a.Suite); ok && si.Limits != nil {
		l := si.Limits
		v.Limits = &dashboard.Limits{CPUMillis: l.GetCpuMillis(), MemoryBytes: l.GetMemoryBytes(), WallSeconds: l.GetWallSeconds(),
			DiskBytes: l.GetDiskBytes(), Network: cmp.Or(l.GetNetwork(), "none"), Allow: l.GetAllow()}
	}
	if admin {
		v.Node, v.Operator, v.Tries, v.InfraFailures, v.LeaseLosses = a.Node, a.Operator, a.Tries, a.InfraFailures, a.LeaseLosses
		v.Canary, v.CanaryOf = a.Canary, a.CanaryOf
	}
	if !admin && !finished(a.State) {
		return v
	}
	v.Outcome, v.Detail = a.Outcome, a.Detail
	v.Started, v.Finished = a.AssignedAt.UTC().Truncate(time.Second), a.FinishedAt.UTC().Truncate(time.Second)
	if a.Usage != nil {
		v.Usage = &dashboard.Usage{CPUSeconds: a.Usage.CPUSeconds, PeakMemoryBytes: a.Usage.PeakMemoryBytes,
			WallSeconds: float64(a.Usage.WallMillis) / 1000}
	}
	if a.Model != nil {
		v.Model = &dashboard.ModelUse{Calls: a.Model.Calls, InputTokens: a.Model.InputTokens, OutputTokens: a.Model.OutputTokens,
			CostUSD: a.Model.CostUSD}
	}
	if a.Score != nil {
		v.Score = &dashboard.Score{Scorer: a.Score.Scorer, Value: a.Score.Value, Public: a.Score.Public}
	}
	for _, o := range a.Outputs {
		v.Outputs = append(v.Outputs, dashboard.Output{Path: o.Path, Size: o.Size, Error: o.Error})
	}
	if vr := a.Verification; vr != nil {
		v.Verification = &dashboard.Verification{State: vr.State, Replays: len(vr.Replays), Benign: vr.Benign}
		if admin {
			v.Verification.Reason = vr.Reason
		}
	}
	return v
}

// waitingOf says why the unfinished attempts of ids wait, now.
func (c *Coordinator) waitingOf(ids ...string) map[string]Waiting {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.Waiting(ids, time.Now())
}

// waitingView is what p sees of why attempt a waits (w, if ok): a
// submitter only why one waits that no node in view can run, or that no
// node is in view, which holds alike whether it is queued or running
// somewhere (core/stuck.go), so that it never tells a node watching its
// group's attempts which of its jobs are real; the admin also why a
// queued attempt waits otherwise.
func waitingView(p accounts.Principal, a Attempt, w Waiting, ok bool) *dashboard.Waiting {
	if !ok || !(w.Blocked || w.InView == 0 || (p.Scope == accounts.ScopeAdmin && a.State == StateQueued)) {
		return nil
	}
	v := &dashboard.Waiting{Reason: w.Reason, Attempts: 1, Blocked: w.Blocked}
	if !w.Since.IsZero() {
		v.Since, v.Deadline = w.Since.UTC().Truncate(time.Second), w.Deadline.UTC().Truncate(time.Second)
	}
	return v
}

// waitingSummary groups the waiting views of attempts by reason, each
// with the earliest Since and Deadline of its attempts, by reason.
func waitingSummary(ws []*dashboard.Waiting) []dashboard.Waiting {
	by := map[string]*dashboard.Waiting{}
	for _, w := range ws {
		if w == nil {
			continue
		}
		s := by[w.Reason]
		if s == nil {
			cp := *w
			cp.Attempts = 0
			s = &cp
			by[w.Reason] = s
		}
		s.Attempts++
		if !w.Since.IsZero() && (s.Since.IsZero() || w.Since.Before(s.Since)) {
			s.Since = w.Since
		}
		if !w.Deadline.IsZero() && (s.Deadline.IsZero() || w.Deadline.Before(s.Deadline)) {
			s.Deadline = w.Deadline
		}
	}
	var out []dashboard.Waiting
	for _, r := range slices.Sorted(maps.Keys(by)) {
		out = append(out, *by[r])
	}
	return out
}

// visibleAttempt returns the attempt ref names if p may see it: the admin
// names any by ID or handle; a submitter names one of its group's by
// handle only, and never sees a canary (whose group is the group of the
// work it replays).
func (c *Coordinator) visibleAttempt(p accounts.Principal, ref string) (Attempt, bool) {
	id := ref
	if strings.HasPrefix(ref, handlePrefix) {
		var ok bool
		if id, ok = c.web.attemptID(ref); !ok {
			return Attempt{}, false
		}
	} else if p.Scope != accounts.ScopeAdmin {
		return Attempt{}, false
	}
	a, ok := c.Attempt(id)
	if !ok || (p.Scope != accounts.ScopeAdmin && (a.Canary || !p.MayRead(a.Group))) {
		return Attempt{}, false
	}
	return a, true
}

// progressOf counts attempts (never canaries) into a progress: the
// agent's own, with replays apart; units are the distinct units, decided
// those decide says are.
func progressOf(atts []Attempt, decided func(unit string) bool, detail bool) dashboard.Progress {
	var p dashboard.Progress
	var d dashboard.ProgressDetail
	units := map[string]bool{}
	for _, a := range atts {
		if a.Kind == KindReplay {
			if a.State != StateCancelled {
				p.Replays++
			}
			if !finished(a.State) {
				p.ReplaysPending++
			}
			continue
		}
		switch a.State {
		case StateQueued:
			d.Queued++
		case StateAssigned:
			d.Assigned++
		case StateReported:
			d.Reported++
		case StateDone:
			p.Done++
		case StateFailed:
			p.Failed++
		case StateCancelled:
			p.Cancelled++
		}
		if a.Unit != "" {
			units[a.Unit] = true
		}
	}
	p.Pending = d.Queued + d.Assigned + d.Reported
	p.Total = p.Pending + p.Done + p.Failed
	p.Units = len(units)
	for u := range units {
		if decided(u) {
			p.Decided++
		}
	}
	if detail {
		p.Detail = &d
	}
	return p
}

// evalState is one read of what evaluation views need.
type evalState struct {
	evals   []EvalRecord
	byEval  map[string][]Attempt
	decided map[string]bool
	// waiting says why their unfinished attempts wait.
	waiting map[string]Waiting
}

// readEvals reads the evaluations p may see (one: only), their attempts
// (never canaries) and their units' decisions, under one lock.
func (c *Coordinator) readEvals(p accounts.Principal, only string) evalState {
	st := evalState{byEval: map[string][]Attempt{}, decided: map[string]bool{}}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, e := range c.state.EvalList() {
		if p.MayRead(e.Group) && (only == "" || e.ID == only) {
			st.evals = append(st.evals, e)
			st.byEval[e.ID] = nil
		}
	}
	var unfinished []string
	for _, a := range c.state.AttemptList(false) {
		if _, ok := st.byEval[a.Eval]; !ok {
			continue
		}
		st.byEval[a.Eval] = append(st.byEval[a.Eval], a)
		if !finished(a.State) {
			unfinished = append(unfinished, a.ID)
		}
		if _, seen := st.decided[a.Unit]; !seen && a.Unit != "" {
			d, ok := c.state.Decision(a.Unit)
			st.decided[a.Unit] = ok && d.State != crosscheck.Open
		}
	}
	st.waiting = c.state.Waiting(unfinished, time.Now())
	return st
}

// evaluationView is the view of one evaluation from st.
func evaluationView(p accounts.Principal, st evalState, e EvalRecord) dashboard.Evaluation {
	atts := st.byEval[e.ID]
	v := dashboard.Evaluation{ID: e.ID, Suite: e.Suite, Agent: e.Agent, Group: e.Group, Levels: e.Levels, Runs: max(e.Runs, 1),
		Replicas: e.Replicas, Priority: e.Priority, Env: e.Env, Models: e.Models, At: e.At.UTC().Truncate(time.Second),
		Attempts: e.Attempts, Progress: progressOf(atts, func(u string) bool { return st.decided[u] }, p.Scope == accounts.ScopeAdmin)}
	var ws []*dashboard.Waiting
	for _, a := range atts {
		if a.Model != nil && finished(a.State) {
			v.CostUSD += a.Model.CostUSD
			v.InputTokens += a.Model.InputTokens
			v.OutputTokens += a.Model.OutputTokens
		}
		if w, ok := st.waiting[a.ID]; ok && (w.Blocked || w.InView == 0) {
			ws = append(ws, waitingView(p, a, w, ok))
		}
	}
	v.Waiting = waitingSummary(ws)
	return v
}

// evaluationViews lists the evaluations p may see, newest first.
func (c *Coordinator) evaluationViews(p accounts.Principal) []dashboard.Evaluation {
	st := c.readEvals(p, "")
	out := make([]dashboard.Evaluation, 0, len(st.evals))
	for i := len(st.evals) - 1; i >= 0; i-- {
		out = append(out, evaluationView(p, st, st.evals[i]))
	}
	return out
}

// evaluationDetail is one evaluation p may see, with its attempts and its
// own results: the boards and per-task results of its own runs only
// (never another evaluation's of the same agent, which numbers its runs
// from 1 too).
func (c *Coordinator) evaluationDetail(p accounts.Principal, id string) (dashboard.EvaluationDetail, bool) {
	st := c.readEvals(p, id)
	if len(st.evals) != 1 {
		return dashboard.EvaluationDetail{}, false
	}
	e := st.evals[0]
	d := dashboard.EvaluationDetail{Evaluation: evaluationView(p, st, e)}
	for _, a := range st.byEval[e.ID] {
		v := c.attemptView(p, a)
		w, ok := st.waiting[a.ID]
		v.Waiting = waitingView(p, a, w, ok)
		d.Attempts = append(d.Attempts, v)
	}
	entries, _, _ := c.boardEntries(p, e.Agent)
	label := c.evalLabel(e.ID)
	var mine []dashboard.Entry
	for _, en := range entries {
		if en.Agent == e.Agent && (en.Eval == e.ID || en.Eval == label) {
			mine = append(mine, en)
		}
	}
	d.Boards, d.Tasks = dashboard.BuildBoards(mine), dashboard.TaskResults(mine, e.Agent)
	return d, true
}

// groupPending counts a group's unfinished attempts (never canaries).
func (c *Coordinator) groupPending(group string) int {
	n := 0
	for _, a := range c.Attempts() {
		if a.Group == group && !finished(a.State) {
			n++
		}
	}
	return n
}

// logsOf reads an attempt's logs from its counted report.
func (c *Coordinator) logsOf(ctx context.Context, a Attempt) (dashboard.Logs, error) {
	r, _, err := c.Report(ctx, a.ID)
	if err != nil {
		return dashboard.Logs{}, err
	}
	return dashboard.Logs{Outcome: a.Outcome, ExitCode: r.GetExitCode(), Stdout: string(r.GetStdoutTail()),
		Stderr: string(r.GetStderrTail()), Detail: r.GetDetail()}, nil
}

// errRunning: a submitter asked for what an attempt shows only once it is
// finished.
var errRunning = errors.New("the attempt is not finished: its logs and trajectory are shown once it is")

// trajectoryView reads an attempt's model calls, readable. Calls of one
// assignment share its number, from 1.
func (c *Coordinator) trajectoryView(ctx context.Context, a Attempt) ([]dashboard.Call, error) {
	calls, err := c.Trajectory(ctx, a.ID)
	if err != nil {
		return nil, err
	}
	assignment := map[string]int{}
	out := make([]dashboard.Call, len(calls))
	for i, cl := range calls {
		if _, ok := assignment[cl.Lease]; !ok {
			assignment[cl.Lease] = len(assignment) + 1
		}
		req, resp := dashboard.CallMessages(cl.API, cl.RequestBody, cl.ResponseBody)
		out[i] = dashboard.Call{Seq: cl.Seq, Assignment: assignment[cl.Lease], API: cl.API, Model: cl.Model, Stream: cl.Stream,
			Status: cl.Status, Refused: cl.Refused, Error: cl.Error, Started: cl.Started.UTC(), TotalMS: cl.TotalMS,
			InputTokens: cl.Usage.Input, OutputTokens: cl.Usage.Output, CostUSD: cl.Charged.USDValue(),
			Request: req, Response: resp,
			RequestBody: string(cl.RequestBody), ResponseBody: string(cl.ResponseBody)}
	}
	dashboard.MarkNew(out)
	return out, nil
}

// agentViews lists the agents p may see: its group's (the admin: all).
func (c *Coordinator) agentViews(p accounts.Principal) []dashboard.Agent {
	var out []dashboard.Agent
	for _, a := range c.catalog.Agents() {
		g, _ := c.web.accounts.AgentOwner(a.Name)
		if p.Scope == accounts.ScopeAdmin || (g != "" && p.MayRead(g)) {
			out = append(out, dashboard.Agent{Name: a.Name, Group: g, Model: a.Model, Deterministic: a.Deterministic,
				NotReplayable: a.NotReplayable, CID: a.CID,
				Size: a.Size, SHA256: a.SHA256})
		}
	}
	return out
}

// suiteViews lists the imported suites.
func (c *Coordinator) suiteViews() []dashboard.Suite {
	var out []dashboard.Suite
	for _, n := range c.catalog.SuiteNames() {
		if si, ok := c.catalog.LookupSuite(n); ok {
			out = append(out, dashboard.Suite{Name: n, Variants: si.Bench.Variants(), Tasks: len(si.Tasks)})
		}
	}
	return out
}

// creditReport is the pool's credit: every attempt whose report counted,
// canaries included (a node's credit must move alike for a canary and for
// real work), by the node that reported it and that node's operator. The
// public sees the pool's size and the total; the admin every node and
// operator.
func (c *Coordinator) creditReport(p accounts.Principal) dashboard.CreditReport {
	now := time.Now()
	c.mu.Lock()
	atts := c.state.AttemptList(true)
	infos := c.state.NodeInfos(now)
	ops := map[string]string{}
	reliability := map[string]float64{}
	for id, r := range c.state.Records {
		ops[id], reliability[id] = r.Operator, r.Reliability()
	}
	quarantined := map[string]bool{}
	for _, r := range c.state.BookNodes() {
		quarantined[r.Node] = r.Quarantined
	}
	c.mu.Unlock()
	var in []dashboard.CreditInput
	for _, a := range atts {
		if a.State != StateDone || a.ReportedBy == "" || a.Usage == nil {
			continue
		}
		in = append(in, dashboard.CreditInput{Node: a.ReportedBy, Operator: ops[a.ReportedBy], CPUSeconds: a.Usage.CPUSeconds,
			WallSeconds: float64(a.Usage.WallMillis) / 1000})
	}
	total, nodes, operators := dashboard.SumCredit(in)
	net := c.Network()
	rep := dashboard.CreditReport{Network: dashboard.Network{Nodes: net.Nodes, Operators: net.Operators, Slots: net.Slots,
		FreeSlots: net.FreeSlots}, Total: total}
	if p.Scope != accounts.ScopeAdmin {
		return rep
	}
	rep.Operators = operators
	rows := map[string]*dashboard.NodeRow{}
	for _, n := range nodes {
		rows[n.Name] = &dashboard.NodeRow{Credit: n, Operator: ops[n.Name], Reliability: reliability[n.Name],
			Quarantined: quarantined[n.Name]}
	}
	for _, n := range infos {
		r := rows[n.ID]
		if r == nil {
			r = &dashboard.NodeRow{Credit: dashboard.Credit{Name: n.ID}, Reliability: n.Reliability}
			rows[n.ID] = r
		}
		r.Operator, r.InView, r.TotalSlots, r.FreeSlots, r.LastSeen = n.Operator, true, n.TotalSlots, n.FreeSlots, n.LastSeen.UTC()
		r.Quarantined = r.Quarantined || n.Quarantined
	}
	for _, r := range rows {
		rep.Nodes = append(rep.Nodes, *r)
	}
	slices.SortFunc(rep.Nodes, func(a, b dashboard.NodeRow) int {
		if d := cmp.Compare(b.CPUHours, a.CPUHours); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	return rep
}

// reproView is a reproducibility check with its report read (questions,
// values per run, intervals) when it is bench/repro's.
func (c *Coordinator) reproView(ctx context.Context, id string) (dashboard.Repro, error) {
	st, err := c.ReproStatus(ctx, id)
	if err != nil {
		return dashboard.Repro{}, err
	}
	v := dashboard.Repro{ID: st.ID, State: st.State, RunsDone: st.RunsDone, RunsWanted: st.RunsWanted, Error: st.Error, Report: st.Report,
		CapsuleID: st.Capsule.ID, CapsuleTitle: st.Capsule.Title, FailedBecause: st.FailedBecause, Waiting: st.Waiting}
	for _, r := range st.Runs {
		v.Runs = append(v.Runs, dashboard.ReproRun{Run: r.Run, Attempt: r.Attempt, Page: r.Page, Logs: r.Logs, State: r.State,
			Outcome: r.Outcome, Failed: r.Failed, ExitCode: r.ExitCode, StderrTail: r.StderrTail, Detail: r.Detail})
	}
	readReproReport(&v, st.Report)
	return v, nil
}

// readReproReport fills v from a check's report when it is bench/repro's:
// its questions, or a draft check's values and draft spec.
func readReproReport(v *dashboard.Repro, report json.RawMessage) {
	var rep struct {
		Reproducible *bool    `json:"reproducible"`
		FailedRuns   []string `json:"failed_runs"`
		Questions    []struct {
			Question   string              `json:"question"`
			Kind       string              `json:"kind"`
			Values     []json.RawMessage   `json:"values"`
			Interval   *dashboard.Interval `json:"interval"`
			Claimed    json.RawMessage     `json:"claimed"`
			Reproduced bool                `json:"reproduced"`
			Reason     string              `json:"reason"`
		} `json:"questions"`
		Draft *struct {
			Values []struct {
				Question string                `json:"question"`
				Rule     struct{ File string } `json:"rule"`
				Values   []string              `json:"values"`
				Verdict  string                `json:"verdict"`
				Interval *dashboard.Interval   `json:"interval"`
				Reason   string                `json:"reason"`
				// What the capsule published there, and whether the
				// runs reproduce it (bench/repro's ComparePublished).
				Published        string `json:"published"`
				Comparison       string `json:"comparison"`
				ComparisonReason string `json:"comparison_reason"`
			} `json:"values"`
			Spec       json.RawMessage `json:"spec"`
			Truncated  []string        `json:"truncated"`
			Published  int             `json:"published_files"`
			Unproduced []string        `json:"unproduced"`
		} `json:"draft"`
	}
	if len(report) == 0 || json.Unmarshal(report, &rep) != nil {
		return
	}
	v.Reproducible, v.FailedRuns = rep.Reproducible, rep.FailedRuns
	if d := rep.Draft; d != nil {
		v.Draft = &dashboard.ReproDraft{Spec: d.Spec, Truncated: d.Truncated, Values: []dashboard.ReproDraftValue{},
			PublishedFiles: d.Published, Unproduced: d.Unproduced}
		for _, x := range d.Values {
			dv := dashboard.ReproDraftValue{Question: x.Question, File: x.Rule.File, Verdict: x.Verdict, Interval: x.Interval, Reason: x.Reason,
				Published: x.Published, Comparison: x.Comparison, ComparisonReason: x.ComparisonReason}
			for _, val := range x.Values {
				dv.Values = append(dv.Values, cmp.Or(val, "—"))
			}
			v.Draft.Values = append(v.Draft.Values, dv)
		}
	}
	for _, q := range rep.Questions {
		rq := dashboard.ReproQuestion{Question: q.Question, Kind: q.Kind, Interval: q.Interval, Reproduced: q.Reproduced,
			Reason: q.Reason, Claimed: rawText(q.Claimed)}
		for _, val := range q.Values {
			rq.Values = append(rq.Values, cmp.Or(rawText(val), "—"))
		}
		v.Questions = append(v.Questions, rq)
	}
}

// rawText is a JSON value as text: a string without its quotes.
func rawText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	if string(raw) == "null" {
		return ""
	}
	return string(raw)
}

// reproViews lists every reproducibility check (admin), newest first.
func (c *Coordinator) reproViews(ctx context.Context) []dashboard.Repro {
	return c.reproViewsFor(ctx, accounts.Principal{Scope: accounts.ScopeAdmin})
}

// reproViewsFor lists the checks p may list: the admin every one, a
// submitter its group's.
func (c *Coordinator) reproViewsFor(ctx context.Context, p accounts.Principal) []dashboard.Repro {
	c.mu.Lock()
	type rec struct {
		id string
		at time.Time
	}
	var ids []rec
	for id, r := range c.state.Repros {
		if p.Scope != accounts.ScopeAdmin && (r.Group == "" || !p.MayRead(r.Group)) {
			continue
		}
		ids = append(ids, rec{id, r.Created})
	}
	c.mu.Unlock()
	slices.SortFunc(ids, func(a, b rec) int { return cmp.Or(b.at.Compare(a.at), strings.Compare(a.id, b.id)) })
	out := make([]dashboard.Repro, 0, len(ids))
	for _, r := range ids {
		if v, err := c.reproView(ctx, r.id); err == nil {
			out = append(out, v)
		}
	}
	return out
}

// accountViews are the accounts as the operator sees them.
func (c *Coordinator) accountViews() ([]dashboard.Group, []dashboard.Submitter, []dashboard.Token) {
	acc := c.web.accounts
	pending := map[string]int{}
	for _, a := range c.Attempts() {
		if !finished(a.State) {
			pending[a.Group]++
		}
	}
	var gs []dashboard.Group
	for _, g := range acc.Groups() {
		gs = append(gs, dashboard.Group{Name: g.Name, MaxPending: g.MaxPending, Pending: pending[g.Name],
			Agents: acc.AgentsOf(g.Name), Created: g.Created})
	}
	var ss []dashboard.Submitter
	for _, s := range acc.Submitters() {
		ss = append(ss, dashboard.Submitter{Name: s.Name, Group: s.Group, Created: s.Created, Revoked: s.Revoked})
	}
	var ts []dashboard.Token
	for _, t := range acc.Tokens() {
		ts = append(ts, dashboard.Token{ID: t.ID, Submitter: t.Submitter, Group: t.Group, Created: t.Created, Revoked: t.Revoked})
	}
	return gs, ss, ts
}
