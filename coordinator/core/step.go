package core

import (
	"fmt"
	"time"

	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/coordinator/schedule"
)

// Effects is what a Step asks of the shell, in order: make Records
// durable (one journal batch: a crash leaves all of them or none), then,
// once they are, answer the event with Reply, make the Offers and run the
// Scores and Judges. Wake asks for a scheduling round soon.
type Effects struct {
	Records []Record
	Offers  []Offer
	Scores  []ScoreJob
	Judges  []JudgeJob
	Reply   any
	Wake    bool
}

// Record is one durable record to write: Value encoded as JSON, or Raw
// as it is (a signed report envelope); both nil: delete the key.
type Record struct {
	Key   string
	Value any
	Raw   []byte
}

// Offer asks the shell to offer an attempt to its node (once the records
// saying it is assigned are durable).
type Offer struct {
	Attempt string
	Node    string
	// Deadline is the lease deadline to tell the node.
	Deadline time.Time
}

// ScoreJob asks the shell to score a reported attempt, After a delay.
type ScoreJob struct {
	Attempt string
	After   time.Duration
}

// Key prefixes of the durable records.
const (
	AttemptsKey  = "/state/attempts"
	NodesKey     = "/state/nodes"
	UsageKey     = "/state/usage"
	EvalsKey     = "/state/evals"
	PipelinesKey = "/state/pipes"
	ReprosKey    = "/state/repro"
	ReportsKey   = "/state/reports"
	LateKey      = "/state/late"
	AdmittedKey  = "/state/operators"
	PoolsKey     = "/state/pools"
	WorksKey     = "/state/xc/works"
	BookNodesKey = "/state/xc/nodes"
)

// AttemptKey is the key of an attempt's record.
func AttemptKey(id string) string { return AttemptsKey + "/" + id }

// ReportKey is the key of an attempt's counted report envelope.
func ReportKey(id string) string { return ReportsKey + "/" + id }

// LateReportKey is the key of a late report envelope.
func LateReportKey(id, digest string) string { return LateKey + "/" + id + "/" + digest }

// groupKeyName makes a group name safe as a key segment.
func groupKeyName(group string) string {
	if group == "" {
		return "_"
	}
	return "g-" + fmt.Sprintf("%x", group)
}

func (s *State) put(key string, v any) {
	s.fx.Records = append(s.fx.Records, Record{Key: key, Value: v})
}
func (s *State) putRaw(key string, b []byte) {
	s.fx.Records = append(s.fx.Records, Record{Key: key, Raw: b})
}

func (s *State) persistAttempt(a *Attempt)   { s.put(AttemptKey(a.ID), a) }
func (s *State) persistRecord(r *NodeRecord) { s.put(NodesKey+"/"+r.ID, r) }
func (s *State) persistPool(p *PoolRecord)   { s.put(PoolsKey+"/"+p.ID, p) }
func (s *State) persistEval(e EvalRecord)    { s.put(EvalsKey+"/"+e.ID, e) }
func (s *State) persistPipeline(p *Pipeline) { s.put(PipelinesKey+"/"+p.ID, p) }
func (s *State) persistRepro(r *ReproRecord) { s.put(ReprosKey+"/"+r.ID, r) }
func (s *State) persistUsage(u schedule.GroupUsage) {
	s.put(UsageKey+"/"+groupKeyName(u.Group), u)
}

// persistWork writes a unit's cross-check record.
func (s *State) persistWork(id string) {
	if w, ok := s.Book.Attempts[id]; ok {
		s.put(WorksKey+"/"+id, w)
	}
}

// persistBookNode writes a node's cross-check record.
func (s *State) persistBookNode(id string) {
	if r, ok := s.Book.Nodes[id]; ok {
		s.put(BookNodesKey+"/"+id, r)
	}
}

// Event is something that happened, which Step applies.
type Event interface{ event() }

// Step applies ev at now and returns its effects. It is deterministic: the
// same state, events and times give the same state and effects.
func (s *State) Step(now time.Time, ev Event) Effects {
	s.begin(now)
	switch e := ev.(type) {
	case Announced:
		s.announced(e)
	case Tick:
		s.tick(e)
	case Place:
		s.placeByHand(e)
	case Probe:
		s.probe(e)
	case OfferAnswered:
		s.offerAnswered(e)
	case Renewal:
		s.renewal(e)
	case HandBack:
		s.handBack(e)
	case ReportArrived:
		s.reportArrived(e)
	case Scored:
		s.scored(e)
	case BudgetExhausted:
		s.budgetExhausted(e)
	case Evaluate:
		s.evaluate(e)
	case ReproQueued:
		s.reproQueued(e)
	case ReproJudged:
		s.reproJudged(e)
	case Admit:
		s.admit(e)
	case Quarantine:
		s.quarantine(e)
	case Judged:
		s.judged(e)
	default:
		panic(fmt.Sprintf("core: unknown event %T", ev)) // a programming error, never input from the network
	}
	return s.end()
}

// Quarantine quarantines a node by hand: it gets no more work, its jobs
// are taken back, its unvalidated results are discarded.
type Quarantine struct{ Node, Reason string }

func (Quarantine) event() {}

func (s *State) quarantine(e Quarantine) {
	eff := s.Book.Quarantine(e.Node, e.Reason)
	s.applyEffects(eff)
}

// applyEffects carries out what a book call asks and persists every
// record it may have changed: the units named (the one the call was about
// included), their effects' units and nodes, and, when a node was
// quarantined, every unit it touched.
func (s *State) applyEffects(eff crosscheck.Effects, units ...string) {
	touched := map[string]bool{}
	for _, u := range units {
		touched[u] = true
	}
	for u := range eff.Decisions {
		touched[u] = true
	}
	for _, q := range eff.Quarantined {
		r := s.Book.Nodes[q]
		s.log.Warn("node quarantined: its unvalidated results are discarded and it gets no more work", "node", q,
			"reason", r.QuarantineReason)
		for id, w := range s.Book.Attempts {
			for _, rp := range w.Replicas {
				if rp.Node == q {
					touched[id] = true
				}
			}
		}
	}
	for _, ref := range eff.Revoke {
		touched[ref.Work] = true
		s.revokeJob(ref.Job)
	}
	for _, ref := range eff.Cancel {
		touched[ref.Work] = true
		s.cancelJob(ref.Job)
	}
	for _, req := range eff.Replicate {
		touched[req.Work] = true
		for range req.Count {
			s.newReplica(req.Work)
		}
	}
	for _, n := range eff.Nodes {
		s.persistBookNode(n)
	}
	for _, u := range sortedKeys(touched) {
		s.persistWork(u)
	}
	for _, u := range sortedIDs(eff.Decisions) {
		d := eff.Decisions[u]
		s.noteDecision(u)
		if w := s.Book.Attempts[u]; w != nil && !w.Work.Canary() && d.State != crosscheck.Open {
			s.log.Info("unit decided", "unit", u, "state", d.State, "reason", d.Reason)
			s.stageDecided(u, d)
		}
	}
}

// bookCall runs a book call about unit and applies its effects; a failing
// call is logged (it means the book and the attempts disagree, which the
// core never lets happen on purpose).
func (s *State) bookCall(unit, what string, eff crosscheck.Effects, err error) {
	if err != nil {
		s.log.Error("cross-check: "+what, "unit", unit, "err", err)
	}
	s.applyEffects(eff, unit)
}
