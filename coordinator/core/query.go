package core

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
)

// Reads of the state. They copy what they return (callers may keep it
// after the shell's lock is released) and never change anything.

// AttemptList returns a copy of every attempt (canaries only when asked),
// in queue order.
func (s *State) AttemptList(canaries bool) []Attempt {
	out := make([]Attempt, 0, len(s.Attempts))
	for _, a := range s.Attempts {
		if a.Canary && !canaries {
			continue
		}
		out = append(out, *a)
	}
	slices.SortFunc(out, func(a, b Attempt) int {
		if d := cmp.Compare(a.Seq, b.Seq); d != 0 {
			return d
		}
		if d := a.EnqueuedAt.Compare(b.EnqueuedAt); d != 0 {
			return d
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// Attempt returns a copy of one attempt.
func (s *State) Attempt(id string) (Attempt, bool) {
	a, ok := s.Attempts[id]
	if !ok {
		return Attempt{}, false
	}
	return *a, true
}

// Progress counts attempts by state, canaries left out. Total counts the
// attempts that were or are needed (queued, assigned, reported, done,
// failed): replicas the cross-check cancelled are counted apart. Every
// attempt is finished when Done + Failed == Total; units are all decided
// when also Units == Decided.
type Progress struct {
	Queued   int `json:"queued"`
	Assigned int `json:"assigned"`
	// Reported counts attempts recorded and waiting to be scored.
	Reported  int `json:"reported,omitempty"`
	Done      int `json:"done"`
	Failed    int `json:"failed"`
	Cancelled int `json:"cancelled,omitempty"`
	Total     int `json:"total"`
	// Units counts the cross-check units (a stage of a run of an
	// evaluation, a run of a reproducibility check); Decided those
	// validated, inconsistent or failed.
	Units   int `json:"units"`
	Decided int `json:"decided"`
}

// Progress counts attempts by state, canaries left out.
func (s *State) Progress() Progress {
	var p Progress
	for _, a := range s.Attempts {
		if a.Canary {
			continue
		}
		switch a.State {
		case StateQueued:
			p.Queued++
		case StateAssigned:
			p.Assigned++
		case StateReported:
			p.Reported++
		case StateDone:
			p.Done++
		case StateFailed:
			p.Failed++
		case StateCancelled:
			p.Cancelled++
		}
	}
	p.Total = p.Queued + p.Assigned + p.Reported + p.Done + p.Failed
	for _, w := range s.Book.Attempts {
		if w.Work.Canary() {
			continue
		}
		p.Units++
		if w.Decision.State != crosscheck.Open {
			p.Decided++
		}
	}
	return p
}

// Stats are counters over the whole state.
type Stats struct {
	Progress
	// Reassignments counts assignments beyond each attempt's first that
	// its node accepted or could not be told about: lost leases and
	// infrastructure failures, plus declines.
	Reassignments int `json:"reassignments"`
	LeaseLosses   int `json:"lease_losses"`
	InfraFailures int `json:"infra_failures"`
	LateReports   int `json:"late_reports"`
	NodesInView   int `json:"nodes_in_view"`
	Leases        int `json:"leases"`
	// BusyDeclines and OfferFailures count, since start, offers declined
	// for want of a slot (another coordinator took it) and offers that got
	// no answer.
	BusyDeclines  int `json:"busy_declines"`
	OfferFailures int `json:"offer_failures"`
}

// Stats counts attempts by state, reassignments and late reports, at now.
func (s *State) Stats(now time.Time) Stats {
	st := Stats{Progress: s.Progress(), BusyDeclines: s.BusyDeclines, OfferFailures: s.OfferFailures}
	for _, n := range s.Nodes {
		if now.Sub(n.LastSeen) <= s.cfg.NodeTTL {
			st.NodesInView++
		}
	}
	for _, id := range s.Leases.Attempts() {
		if a := s.Attempts[id]; a != nil && !a.Canary {
			st.Leases++
		}
	}
	for _, a := range s.Attempts {
		if a.Canary {
			continue
		}
		if a.Tries > 1 {
			st.Reassignments += a.Tries - 1
		}
		st.LeaseLosses += a.LeaseLosses
		st.InfraFailures += a.InfraFailures
		st.LateReports += len(a.LateReports)
	}
	return st
}

// EvalList lists the evaluation requests, oldest first.
func (s *State) EvalList() []EvalRecord {
	out := make([]EvalRecord, 0, len(s.Evals))
	for _, e := range s.Evals {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b EvalRecord) int {
		if d := a.At.Compare(b.At); d != 0 {
			return d
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// OperatorList lists the admitted operators, by ID.
func (s *State) OperatorList() []Admitted {
	out := make([]Admitted, 0, len(s.Admitted))
	for _, id := range sortedKeys(s.Admitted) {
		out = append(out, s.Admitted[id])
	}
	return out
}

// BookNodes returns a copy of every node's cross-check record, by node.
func (s *State) BookNodes() []crosscheck.NodeRecord {
	out := make([]crosscheck.NodeRecord, 0, len(s.Book.Nodes))
	for _, id := range sortedKeys(s.Book.Nodes) {
		r := *s.Book.Nodes[id]
		r.Recent = slices.Clone(r.Recent)
		out = append(out, r)
	}
	return out
}

// BookUnits returns a copy of every unit's cross-check record, canaries
// included, by ID.
func (s *State) BookUnits() []crosscheck.Attempt {
	out := make([]crosscheck.Attempt, 0, len(s.Book.Attempts))
	for _, id := range sortedKeys(s.Book.Attempts) {
		b, err := json.Marshal(s.Book.Attempts[id])
		if err != nil {
			continue
		}
		var cp crosscheck.Attempt
		if json.Unmarshal(b, &cp) == nil {
			out = append(out, cp)
		}
	}
	return out
}

// Decision is the cross-check's latest decision on a unit.
func (s *State) Decision(work string) (crosscheck.Decision, bool) {
	w, ok := s.Book.Attempts[work]
	if !ok {
		return crosscheck.Decision{}, false
	}
	return w.Decision, true
}

// Entries returns one leaderboard entry per run of every evaluation (a
// unit, or a pipeline of units): never a canary, a capsule run or a gold
// answer, sorted by suite, variant (in the suite's order), agent, task and
// run.
func (s *State) Entries() []bench.Entry {
	var out []bench.Entry
	rank := map[string]map[string]int{}
	for id, w := range s.Book.Attempts {
		if w.Work.Canary() || w.Work.Kind != crosscheck.AgentAttempt {
			continue
		}
		t := s.template(id)
		if t == nil || t.pipe() != id {
			continue // a later stage of a pipeline: its first stage stands for it
		}
		si, ok := s.catalog.LookupSuite(t.Suite)
		if !ok {
			continue
		}
		if rank[t.Suite] == nil {
			rank[t.Suite] = map[string]int{}
			for i, v := range si.Bench.Variants() {
				rank[t.Suite][v] = i
			}
		}
		ag, _ := s.catalog.LookupAgent(t.Agent)
		out = append(out, s.entry(t, si.Bench.Scoring(), ag.Model))
	}
	slices.SortFunc(out, func(a, b bench.Entry) int {
		for _, d := range []int{strings.Compare(a.Suite, b.Suite), rank[a.Suite][a.Variant] - rank[b.Suite][b.Variant],
			strings.Compare(a.Agent, b.Agent), strings.Compare(a.TaskID, b.TaskID), a.Run - b.Run} {
			if d != 0 {
				return d
			}
		}
		return 0
	})
	return out
}

// entry is the leaderboard entry of the run whose first stage's first
// attempt is t. A one-stage run is its unit's entry. A pipeline's entry is
// its last stage's, once the earlier ones are validated (pending until
// then); a pipeline halted at a stage takes that stage's status, without
// a score. CPU and wall time add up the counted jobs of every stage.
func (s *State) entry(t *Attempt, scoring json.RawMessage, model string) bench.Entry {
	p := s.Pipelines[t.pipe()]
	if p == nil {
		e, _ := s.unitEntry(t, t.Unit, scoring, model)
		return e
	}
	last := len(p.Stages) - 1
	at := min(p.Current, last)
	if p.Halted != "" {
		at = slices.IndexFunc(p.Stages, func(st Stage) bool { return st.Name == p.Halted })
	}
	e, from := s.unitEntry(t, workID(p.ID, at, p.Stages[at].Name), scoring, model)
	if at < last && p.Halted == "" {
		e.Status, e.Score, e.Scoring = bench.Pending, nil, scoring
	}
	if p.Halted != "" {
		e.Score, e.Scoring = nil, scoring
	}
	e.CPUSeconds, e.WallSeconds, e.CostUSD, e.InputTokens, e.OutputTokens = 0, 0, nil, 0, 0
	var cost float64
	for i := range min(at+1, len(p.Stages)) {
		var a *Attempt
		if i == at {
			a = from
		} else {
			a = s.canonical(workID(p.ID, i, p.Stages[i].Name))
		}
		if a != nil && a.Usage != nil {
			e.CPUSeconds += a.Usage.CPUSeconds
			e.WallSeconds += float64(a.Usage.WallMillis) / 1000
		}
		if a != nil && a.Model != nil {
			cost += a.Model.CostUSD
			e.CostUSD, e.InputTokens, e.OutputTokens = &cost, e.InputTokens+a.Model.InputTokens, e.OutputTokens+a.Model.OutputTokens
		}
		if a != nil && i == 0 {
			e.Started = a.AssignedAt
		}
	}
	return e
}

// CountedJob is the job whose result counts for stage of pipeline pipe:
// the canonical replica of that stage's work. The error says what is
// missing (no such pipeline or stage, no counted job yet).
func (s *State) CountedJob(pipe, stage string) (string, error) {
	p := s.Pipelines[pipe]
	if p == nil {
		return "", fmt.Errorf("no pipeline %q: no stage %q", pipe, stage)
	}
	for i, st := range p.Stages {
		if st.Name != stage {
			continue
		}
		w := s.Book.Attempts[workID(p.ID, i, st.Name)]
		if w == nil || w.Decision.Canonical < 0 || w.Decision.Canonical >= len(w.Replicas) {
			return "", fmt.Errorf("stage %s of %s has no counted job", stage, p.ID)
		}
		return w.Replicas[w.Decision.Canonical].Job, nil
	}
	return "", fmt.Errorf("pipeline %s has no stage %q", p.ID, stage)
}

// canonical is the attempt whose result counts for a validated unit.
func (s *State) canonical(work string) *Attempt {
	w := s.Book.Attempts[work]
	if w == nil || w.Decision.State != crosscheck.Validated || w.Decision.Canonical < 0 || w.Decision.Canonical >= len(w.Replicas) {
		return nil
	}
	return s.Attempts[w.Replicas[w.Decision.Canonical].Job]
}

// unitEntry is the leaderboard entry of one unit (work), described by t:
// its status is the cross-check's decision; the score comes from the
// canonical replica when it is validated, else from the first replica
// still standing (unvalidated); the scoring is that replica's, or the
// suite's when nothing is scored. It also returns the attempt scored.
func (s *State) unitEntry(t *Attempt, work string, scoring json.RawMessage, model string) (bench.Entry, *Attempt) {
	e := bench.Entry{Suite: t.Suite, Variant: t.Level, Scoring: scoring, Agent: t.Agent, Model: model, TaskID: t.TaskID,
		Run: max(t.Run, 1), Status: bench.Pending, Eval: t.Eval}
	w := s.Book.Attempts[work]
	if w == nil {
		return e, nil
	}
	scored := func(i int) *Attempt {
		if i < 0 || i >= len(w.Replicas) {
			return nil
		}
		a := s.Attempts[w.Replicas[i].Job]
		if a == nil || a.Score == nil {
			return nil
		}
		return a
	}
	var from *Attempt
	switch w.Decision.State {
	case crosscheck.Validated:
		e.Status = bench.Validated
		if from = scored(w.Decision.Canonical); from == nil {
			e.Status = bench.Pending // cannot happen: a canonical replica is scored
		}
	case crosscheck.Inconsistent:
		e.Status = bench.Inconsistent
	case crosscheck.Failed:
		e.Status = bench.InfraFailed
	default:
		for _, rv := range w.Decision.Replicas {
			switch rv.Verdict {
			case crosscheck.Discarded, crosscheck.Lied, crosscheck.Invalid:
				continue
			}
			if a := scored(rv.Index); a != nil {
				e.Status, from = bench.Unvalidated, a
				break
			}
		}
	}
	if from != nil && from.Verification != nil {
		e.Verification = from.Verification.State
	}
	if from != nil && from.Model != nil {
		cost := from.Model.CostUSD
		e.CostUSD, e.InputTokens, e.OutputTokens = &cost, from.Model.InputTokens, from.Model.OutputTokens
	}
	if from != nil {
		e.Score = from.Score.Public
		if len(from.Score.Scoring) > 0 {
			e.Scoring = from.Score.Scoring
		}
		if from.Usage != nil {
			e.CPUSeconds, e.WallSeconds = from.Usage.CPUSeconds, float64(from.Usage.WallMillis)/1000
		}
		e.Started, e.Finished = from.AssignedAt, from.FinishedAt
	}
	return e, from
}

// Job is what the shell needs to build an attempt's job (its recipe) or
// to score it: a copy of the attempt, the outputs of its pipeline's
// earlier stages, and its reproducibility check.
type Job struct {
	Attempt Attempt
	// Env are its evaluation's agent arguments.
	Env []string
	// Earlier holds the counted outputs of the earlier stages of its
	// pipeline, by stage name and output path (CIDs).
	Earlier map[string]map[string]string
	// Image is the agent (or image) its stage runs; ImageCID the content
	// of that image as it was when the work was queued ("": the catalog's
	// current one): the job a node is given is the job its report is
	// judged against, whatever was pushed since.
	Image    string
	ImageCID string
	// Repro is its check, for a capsule run.
	Repro *ReproRecord
}

// JobOf returns what building or scoring attempt id needs.
func (s *State) JobOf(id string) (Job, bool) {
	a, ok := s.Attempts[id]
	if !ok {
		return Job{}, false
	}
	j := Job{Attempt: *a, Image: a.Agent, Env: s.Evals[a.Eval].Env}
	if p := s.Pipelines[a.pipe()]; p != nil {
		j.Earlier = map[string]map[string]string{}
		for _, st := range p.Stages {
			if st.Name == a.Stage {
				if st.Image != "" {
					j.Image = st.Image
				}
				break
			}
			if outs, ok := p.Outputs[st.Name]; ok {
				j.Earlier[st.Name] = outs
			}
		}
	}
	if w := s.Book.Attempts[a.Unit]; w != nil {
		j.ImageCID = w.Work.ImageCID
	}
	if r := s.Repros[a.Repro]; r != nil && a.Kind == KindCapsuleRun {
		rc := *r
		j.Repro = &rc
	}
	return j, true
}

// ReproView is the state of a reproducibility check: its record, how
// many of its runs are decided, and, once all are, the run that stands
// for each.
type ReproView struct {
	Record ReproRecord
	// Started: a run was placed at least once.
	Started bool
	Decided int
	Runs    []ReproRun
}

// ReproRun is a decided run of a check: the attempt whose report stands
// for it (none when the run was lost to infrastructure or no node could
// run it: Outcome is then its last attempt's, Detail why).
type ReproRun struct {
	Attempt, Node, Outcome string
	Detail                 string
	Outputs                []Output
}

// Repro returns the state of a check.
func (s *State) Repro(id string) (ReproView, bool) {
	r := s.Repros[id]
	if r == nil {
		return ReproView{}, false
	}
	v := ReproView{Record: *r}
	for _, u := range r.Units {
		for _, aid := range s.Units[u] {
			if a := s.Attempts[aid]; a != nil && a.State != StateQueued {
				v.Started = true
			}
		}
		w := s.Book.Attempts[u]
		if w == nil || w.Decision.State == crosscheck.Open {
			continue
		}
		v.Decided++
		run := ReproRun{Outcome: "infra_error", Detail: w.Decision.Reason}
		if ids := s.Units[u]; len(ids) > 0 {
			if a := s.Attempts[ids[len(ids)-1]]; a != nil && a.State == StateFailed && a.Outcome != "" {
				run.Outcome, run.Detail = a.Outcome, cmp.Or(a.Detail, run.Detail)
			}
		}
		i := w.Decision.Canonical
		if i < 0 && w.Decision.State == crosscheck.Inconsistent && len(w.Replicas) > 0 {
			i = 0
		}
		if i >= 0 && i < len(w.Replicas) {
			if a := s.Attempts[w.Replicas[i].Job]; a != nil {
				run = ReproRun{Attempt: a.ID, Node: a.ReportedBy, Outcome: a.Outcome, Outputs: slices.Clone(a.Outputs)}
			}
		}
		v.Runs = append(v.Runs, run)
	}
	return v, true
}

// Holders lists at most max nodes in view at now that announce content
// cid as cached, most recently seen first (then by ID). It costs the
// content's holders, not the nodes in view.
func (s *State) Holders(cid string, now time.Time, max int) []string {
	set := s.holders[cid]
	if set == nil || max <= 0 {
		return nil
	}
	before := func(a, b string) bool {
		sa, sb := s.Nodes[a].LastSeen, s.Nodes[b].LastSeen
		if !sa.Equal(sb) {
			return sa.After(sb)
		}
		return a < b
	}
	// The best max, kept sorted by insertion: max is a handful.
	out := make([]string, 0, max)
	for _, id := range set.ids {
		n := s.Nodes[id]
		if n == nil || now.Sub(n.LastSeen) > s.cfg.NodeTTL {
			continue
		}
		if len(out) == max && !before(id, out[max-1]) {
			continue
		}
		i := len(out)
		if i == max {
			i--
		} else {
			out = append(out, "")
		}
		for ; i > 0 && before(id, out[i-1]); i-- {
			out[i] = out[i-1]
		}
		out[i] = id
	}
	return out
}

// NodeIDs lists the nodes in the view (in view or not yet forgotten).
func (s *State) NodeIDs() []string { return sortedKeys(s.Nodes) }

// Grant is what a model token of an attempt's current assignment allows:
// the gateway's grant, as plain data.
type Grant struct {
	Attempt, Lease, Node string
	Eval, Group, Task    string
	Expires              time.Time
	Budget               Budget
	Models               []string
	// Replay names the recorded attempt a replay's calls are answered
	// from (KindReplay only).
	Replay string
}

// GrantOf returns the grant of attempt id's assignment lease, if that
// assignment is current: the attempt assigned under that lease, with a
// lease that has not run out at now.
func (s *State) GrantOf(id, lease string, now time.Time) (Grant, bool) {
	a := s.Attempts[id]
	if a == nil || a.State != StateAssigned || LeaseID(a) != lease {
		return Grant{}, false
	}
	ls, ok := s.Leases.Get(id)
	if !ok || ls.Node != a.Node || !now.Before(ls.Deadline) {
		return Grant{}, false
	}
	ev := s.Evals[a.Eval]
	return Grant{Attempt: a.ID, Lease: lease, Node: a.Node, Eval: a.Eval, Group: a.Group, Task: a.TaskID,
		Expires: ls.Deadline, Budget: ev.Budget, Models: slices.Clone(ev.Models), Replay: a.ReplayOf}, true
}

// LeaseOf is the lease ID of node's latest assignment of attempt id ("":
// none).
func (s *State) LeaseOf(id, node string) string {
	a := s.Attempts[id]
	if a == nil {
		return ""
	}
	for i := len(a.Assignees) - 1; i >= 0; i-- {
		if as := a.Assignees[i]; as.Node == node {
			return strconv.FormatInt(as.At.UnixNano(), 10)
		}
	}
	return ""
}
