package core

import (
	"fmt"
	"slices"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/schedule"
)

// Scored is the outcome of scoring a reported attempt (outside the lock,
// by the suite's family, or a capsule run by the checker): its score, or
// Err when the scorer failed (never the agent's failure: it is retried).
type Scored struct {
	Attempt string
	Scorer  string
	Score   bench.Score
	Err     string
	// Unbound says why the result is not bound to the attempt's model
	// trajectory (package verify, checked by the shell): the replica is
	// invalid (crosscheck.Evidence.Unbound).
	Unbound string
	// Rewritten: one of Unbound's reasons is a request that rewrote what
	// the model was shown earlier (a mark of its own on the node's replay
	// record).
	Rewritten bool
}

func (Scored) event() {}

// scored records a score and gives the replica to the cross-check, which
// may decide its unit, ask for more replicas, or catch its node lying.
func (s *State) scored(e Scored) {
	a := s.Attempts[e.Attempt]
	if a == nil || a.State != StateReported {
		return // scored already, or taken back
	}
	if e.Err != "" {
		a.ScoreTries++
		a.Detail = "not scored: " + e.Err
		s.persistAttempt(a)
		if a.ScoreTries < s.cfg.MaxScoreTries {
			s.fx.Scores = append(s.fx.Scores, ScoreJob{Attempt: a.ID, After: s.cfg.ScoreRetry << (a.ScoreTries - 1)})
			s.log.Warn("scoring failed; will retry", "attempt", a.ID, "try", a.ScoreTries, "err", e.Err)
		} else {
			s.log.Error("scoring failed; the attempt waits, unscored, never counted against the agent", "attempt", a.ID,
				"tries", a.ScoreTries, "err", e.Err)
		}
		return
	}
	a.State, a.Detail = StateDone, ""
	if a.Kind != KindCapsuleRun {
		sc := e.Score
		a.Score = &ScoreRecord{Scorer: e.Scorer, Scoring: sc.Scoring, Verdict: sc.Verdict, Public: sc.Public, Value: sc.Value}
	}
	var ev crosscheck.Evidence
	if a.Evidence != nil {
		ev = *a.Evidence
	}
	if e.Unbound != "" {
		ev.Unbound = e.Unbound
		a.Evidence = &ev
		s.log.Warn("result not bound to its model trajectory", "attempt", a.ID, "node", a.ReportedBy, "why", e.Unbound)
	}
	eff, err := s.Book.Report(a.Unit, crosscheck.Replica{Job: a.ID, Node: a.ReportedBy, Operator: a.Operator,
		Result: e.Score.Comparable, Evidence: ev})
	if err != nil {
		s.log.Error("cross-check: report", "attempt", a.ID, "err", err)
	}
	s.persistBookNode(a.ReportedBy)
	s.persistAttempt(a)
	s.applyEffects(eff, a.Unit)
	s.verifyScored(a, e.Unbound, e.Rewritten)
	s.persistAttempt(a)
	s.wake()
}

// template is the attempt a unit's new jobs copy: its first replica.
func (s *State) template(unit string) *Attempt {
	var best *Attempt
	for _, id := range s.Units[unit] {
		if a := s.Attempts[id]; a != nil && (best == nil || a.Replica < best.Replica) {
			best = a
		}
	}
	return best
}

// newReplica queues one more job of unit, as the cross-check asked: the
// same work as its other replicas, a fresh random ID, the queue position
// of the unit (so that started work is validated before new work starts).
func (s *State) newReplica(unit string) *Attempt {
	t := s.template(unit)
	if t == nil {
		s.log.Error("cross-check asked for a replica of a unit without attempts", "unit", unit)
		return nil
	}
	a := s.copyJob(t, s.newAttemptID(), unit)
	a.Replica = len(s.Units[unit])
	if err := s.Book.NewJob(unit, a.ID); err != nil {
		s.log.Error("cross-check: new job", "unit", unit, "err", err)
		return nil
	}
	s.addAttempt(a)
	s.log.Info("replica queued", "unit", unit, "attempt", a.ID, "replica", a.Replica)
	return a
}

// copyJob is a new queued attempt doing t's work under id in unit.
func (s *State) copyJob(t *Attempt, id, unit string) *Attempt {
	return &Attempt{ID: id, Eval: t.Eval, Suite: t.Suite, TaskID: t.TaskID, Agent: t.Agent, Level: t.Level, Stage: t.Stage,
		Pipe: t.Pipe, Run: t.Run, Unit: unit, Kind: t.Kind, Group: t.Group, Priority: t.Priority, Canary: t.Canary,
		CanaryOf: t.CanaryOf, Repro: t.Repro, Needs: t.Needs, GPUs: t.GPUs, Avoid: slices.Clone(t.Avoid), Seq: t.Seq,
		State: StateQueued, EnqueuedAt: s.now}
}

// addAttempt adds a new queued attempt.
func (s *State) addAttempt(a *Attempt) {
	s.stuckSoon()
	s.Attempts[a.ID] = a
	s.Units[a.Unit] = append(s.Units[a.Unit], a.ID)
	s.persistAttempt(a)
	s.Queue = append(s.Queue, a.ID)
	s.wake()
}

// cancelJob ends a queued job the cross-check no longer needs.
func (s *State) cancelJob(id string) {
	a := s.Attempts[id]
	if a == nil || a.State != StateQueued {
		return
	}
	s.Queue = slices.DeleteFunc(s.Queue, func(x string) bool { return x == id })
	a.State, a.FinishedAt, a.Detail = StateCancelled, s.now, "not needed: the cross-check decided its unit without it"
	s.persistAttempt(a)
}

// revokeJob takes a job back from a node that was just quarantined and
// queues it elsewhere (the book already counts it as queued).
func (s *State) revokeJob(id string) {
	a := s.Attempts[id]
	if a == nil || a.State != StateAssigned {
		return
	}
	s.Leases.Release(id)
	s.requeue(a, requeueRevoked, "node "+a.Node+" quarantined")
}

// canaryFor creates a canary for node, when the cross-check wants one now
// (the node's canary probability) and has validated work to replay that
// the node may be given: a unit of its own, one queued attempt that copies
// a real replica of the replayed unit (same task, agent, level, stage,
// group: only the attempt ID is new). Callers place it at once.
func (s *State) canaryFor(node string, view *schedule.NodeView) *Attempt {
	if !s.Book.ShouldCanary(node, s.rng.Float64()) {
		return nil
	}
	return s.newCanary(node, view)
}

// newCanary creates a canary for node, if there is validated work to
// replay that the node may be given.
func (s *State) newCanary(node string, view *schedule.NodeView) *Attempt {
	src, ok := s.pickCanary(node)
	if !ok {
		return nil
	}
	t := s.template(src)
	if t == nil || t.Pipe != "" {
		return nil // a stage of a pipeline is never replayed alone
	}
	if view != nil && (len(view.Suites) > 0 && !slices.Contains(view.Suites, t.Suite) ||
		len(view.Groups) > 0 && !slices.Contains(view.Groups, t.Group)) {
		return nil
	}
	unit := "cn-" + s.newAttemptID()[3:]
	w, err := s.Book.CanaryFrom(src, unit)
	if err != nil {
		s.log.Error("cross-check: canary", "source", src, "err", err)
		return nil
	}
	a := s.copyJob(t, s.newAttemptID(), unit)
	a.Canary, a.CanaryOf, a.Avoid, a.Replica = true, src, nil, 0
	if err := s.Book.Add(w, a.ID); err != nil {
		s.log.Error("cross-check: add canary", "source", src, "err", err)
		return nil
	}
	s.Attempts[a.ID] = a
	s.Units[unit] = []string{a.ID}
	s.persistAttempt(a)
	s.persistWork(unit)
	s.log.Debug("canary created", "attempt", a.ID, "replays", src, "for", node)
	return a
}

// Probe gives a node a canary now, whatever its canary probability: a
// replay of validated work that it cannot tell from a real job (an
// admin's check of a node in doubt). Its reply is the canary's attempt ID,
// or an error saying why there is none.
type Probe struct{ Node string }

func (Probe) event() {}

func (s *State) probe(e Probe) {
	if s.quarantined(e.Node) {
		s.fx.Reply = fmt.Errorf("%w: node %s is quarantined", ErrBadRequest, e.Node)
		return
	}
	switch ca := s.newCanary(e.Node, nil); {
	case ca == nil:
		s.fx.Reply = fmt.Errorf("no validated work the node has not run to replay on node %s", e.Node)
	case !s.placeOn(ca, e.Node):
		s.fx.Reply = fmt.Errorf("the cross-check refuses node %s", e.Node)
	default:
		s.fx.Reply = ca.ID
	}
}

// canarySample bounds the validated units a canary is picked among.
const canarySample = 64

// pickCanary picks the unit to replay on node: Book.PickCanary (which
// prefers telling answers and never gives a node work it answered) over a
// random sample of at most canarySample units that may be canary sources,
// so that the pick costs the same however many units the book holds.
func (s *State) pickCanary(node string) (string, bool) {
	ids := s.canarySources.sample(s.rng, canarySample)
	if len(ids) == 0 {
		return "", false
	}
	sub := crosscheck.Book{Policy: s.Book.Policy, Attempts: make(map[string]*crosscheck.Attempt, len(ids)), Nodes: s.Book.Nodes}
	for _, id := range ids {
		if w := s.Book.Attempts[id]; w != nil {
			sub.Attempts[id] = w
		}
	}
	return sub.PickCanary(node, s.rng.Float64())
}

// noteDecision keeps the set of units that may be replayed as canaries
// (deterministic, not canaries, validated: Book.PickCanary checks the
// rest).
func (s *State) noteDecision(id string) {
	w := s.Book.Attempts[id]
	if w != nil && !w.Work.Canary() && w.Work.Deterministic && w.Decision.State == crosscheck.Validated {
		s.canarySources.add(id)
	} else {
		s.canarySources.remove(id)
	}
}

// stageDecided moves a unit's pipeline on when the work of its current
// stage is decided: validated, the next stage is queued with the canonical
// job's outputs; otherwise the pipeline ends there.
func (s *State) stageDecided(work string, d crosscheck.Decision) {
	t := s.template(work)
	if t == nil || t.Pipe == "" && len(s.Pipelines) == 0 {
		return
	}
	p := s.Pipelines[t.pipe()]
	if p == nil || p.Current >= len(p.Stages) || workID(p.ID, p.Current, p.Stages[p.Current].Name) != work {
		return
	}
	stage := p.Stages[p.Current]
	if d.State != crosscheck.Validated {
		p.Halted, p.Current = stage.Name, len(p.Stages)
		s.persistPipeline(p)
		s.log.Info("pipeline halted", "unit", p.ID, "stage", stage.Name, "state", d.State)
		return
	}
	canon := s.canonical(work)
	if canon == nil {
		s.log.Error("validated stage without a canonical attempt", "unit", p.ID, "stage", stage.Name)
		return
	}
	if p.Outputs == nil {
		p.Outputs, p.Nodes = map[string]map[string]string{}, map[string]string{}
	}
	outs := map[string]string{}
	for _, o := range canon.Outputs {
		if o.CID != "" {
			outs[o.Path] = o.CID
		}
	}
	p.Outputs[stage.Name], p.Nodes[stage.Name] = outs, canon.ReportedBy
	p.Current++
	s.persistPipeline(p)
	if p.Current == len(p.Stages) {
		return
	}
	next := p.Stages[p.Current]
	nw := workID(p.ID, p.Current, next.Name)
	first := s.derivedAttemptID(nw, 1)
	a := s.copyJob(t, first, nw)
	a.Stage, a.Pipe, a.Replica, a.Avoid = next.Name, p.ID, 0, nil
	for _, st := range next.ApartFrom {
		if n := p.Nodes[st]; n != "" && !slices.Contains(a.Avoid, n) {
			a.Avoid = append(a.Avoid, n)
		}
	}
	ag, _ := s.catalog.LookupAgent(a.Agent)
	image := ag.CID
	if next.Image != "" {
		img, _ := s.catalog.LookupAgent(next.Image)
		image = img.CID
	}
	// Its inputs are content and earlier outputs, in the order the family
	// builds its recipe: the cross-check checks the image only.
	w := crosscheck.Work{ID: nw, Kind: crosscheck.AgentAttempt, Deterministic: ag.Deterministic, ImageCID: image,
		WallLimitSeconds: float64(s.limitsOf(a).GetWallSeconds()), Samples: samples(s.Evals[a.Eval], ag)}
	if err := s.Book.Add(w, first); err != nil {
		s.log.Error("cross-check: next stage", "unit", p.ID, "stage", next.Name, "err", err)
		return
	}
	if next.Single || w.Samples {
		s.Book.Attempts[nw].Target = 1
	}
	s.addAttempt(a)
	s.persistWork(nw)
	s.log.Info("next stage queued", "unit", p.ID, "stage", next.Name, "attempt", a.ID)
}

// idSet is a set of IDs with uniform random samples.
type idSet struct {
	ids []string
	at  map[string]int
}

func (s *idSet) add(id string) {
	if s.at == nil {
		s.at = map[string]int{}
	}
	if _, ok := s.at[id]; !ok {
		s.at[id] = len(s.ids)
		s.ids = append(s.ids, id)
	}
}

func (s *idSet) remove(id string) {
	i, ok := s.at[id]
	if !ok {
		return
	}
	last := len(s.ids) - 1
	s.ids[i] = s.ids[last]
	s.at[s.ids[i]] = i
	s.ids = s.ids[:last]
	delete(s.at, id)
}

// sample returns at most n distinct IDs drawn uniformly, in a
// deterministic order for a given generator state.
func (s *idSet) sample(r interface{ IntN(int) int }, n int) []string {
	if len(s.ids) <= n {
		out := slices.Clone(s.ids)
		slices.Sort(out)
		return out
	}
	out := make([]string, 0, n)
	seen := make(map[int]bool, n)
	for len(out) < n {
		i := r.IntN(len(s.ids))
		if !seen[i] {
			seen[i] = true
			out = append(out, s.ids[i])
		}
	}
	return out
}
