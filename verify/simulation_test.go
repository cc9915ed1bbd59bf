package verify_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/repronet/repronet/verify"
)

// The simulation: a seeded evaluation of model-driven attempts on a
// network with honest nodes and three kinds of cheaters, verified with
// binding, the append-only rule and adaptive replays, all through the
// package's own functions on OpenAI-shaped trajectories.

type nodeKind int

const (
	honestNode nodeKind = iota
	planter             // prints the gold answer in a tool result
	editor              // edits report.json after the agent stopped
	rewriter            // edits report.json, then calls the model once more itself with the gold answer in place of a tool result the model saw
)

func (k nodeKind) String() string {
	return [...]string{"honest", "planter", "editor", "rewriter"}[k]
}

type simNode struct {
	id      string
	kind    nodeKind
	cheat   float64 // probability of cheating on an attempt
	cheated bool
	rec     verify.Record
	// held are its results not verified yet, by forged or not: dropped
	// from the board when the node is quarantined.
	held []bool
}

type simTask struct {
	value, gold float64 // what the capsule honestly prints; the gold answer
	noisy       bool    // prints timestamps and random numbers
	seeded      bool    // the value itself varies from run to run
}

// output is what the capsule prints on one run.
func (t simTask) output(rng *rand.Rand, value float64) string {
	s := fmt.Sprintf("accuracy: %.5f\n", value)
	if t.noisy {
		s = fmt.Sprintf("started %s\nrandom draw %.6f\n", fmt.Sprintf("2026-11-%02dT%02d:%02d:%02dZ", 1+rng.IntN(28), rng.IntN(24), rng.IntN(60), rng.IntN(60)), rng.Float64()) + s
	}
	return s
}

func (t simTask) honestValue(rng *rand.Rand) float64 {
	if t.seeded {
		return t.value + (rng.Float64()-0.5)/10
	}
	return t.value
}

func agentRun(out string, value float64) run {
	return run{commands: []string{"ls", "python run.py"}, outputs: []string{"run.py\n", out},
		submit: fmt.Sprintf(`{"answers": {"Report the accuracy.": %.4f}}`, value)}
}

type simFigures struct {
	attempts, cheats, replays, replayedCalls, calls int
	caught                                          map[nodeKind][2]int // kind -> caught, cheating nodes that cheated
	honestQuarantined, forgedOnBoard, forgedTotal   int
	verdicts                                        map[verify.Verdict]int
	benign                                          int
}

func simulate(seed uint64, attempts int) simFigures {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	p := verify.DefaultPolicy()
	var nodes []*simNode
	add := func(kind nodeKind, n int, cheat float64) {
		for range n {
			nodes = append(nodes, &simNode{id: fmt.Sprintf("n%02d", len(nodes)), kind: kind, cheat: cheat})
		}
	}
	add(honestNode, 8, 0)
	add(planter, 2, 0.3)
	add(planter, 1, 0.05)
	add(editor, 1, 0.3)
	add(rewriter, 1, 0.3)
	tasks := make([]simTask, 40)
	for i := range tasks {
		tasks[i] = simTask{value: 0.5 + rng.Float64()/2, gold: 0.5 + rng.Float64()/2, noisy: i%2 == 0, seeded: i%10 == 3}
	}
	f := simFigures{caught: map[nodeKind][2]int{}, verdicts: map[verify.Verdict]int{}}
	live := func(not ...*simNode) []*simNode {
		var out []*simNode
		for _, n := range nodes {
			skip := n.rec.Quarantined != ""
			for _, x := range not {
				skip = skip || n == x
			}
			if !skip {
				out = append(out, n)
			}
		}
		return out
	}
	quarantine := func(n *simNode) {
		for _, forged := range n.held {
			if forged {
				f.forgedOnBoard-- // discarded with the node's unverified results
			}
		}
		n.held = nil
	}
	for a := range attempts {
		ln := live()
		n := ln[rng.IntN(len(ln))]
		task := tasks[rng.IntN(len(tasks))]
		value := task.honestValue(rng)
		honestOut := task.output(rng, value)
		recorded := agentRun(honestOut, value)
		reportValue := value
		exchanges := recorded.exchanges()
		cheat := n.kind != honestNode && rng.Float64() < n.cheat
		if cheat {
			f.cheats++
			n.cheated = true
			switch n.kind {
			case planter:
				recorded = agentRun(task.output(rng, task.gold), task.gold)
				exchanges, reportValue = recorded.exchanges(), task.gold
			case editor:
				reportValue = task.gold
			case rewriter:
				// The model answered from the honest output; the node then
				// shows it the gold answer in that result's place, so that
				// the gold is in a tool result of the trajectory.
				fx := recorded.with(1, task.output(rng, task.gold)).exchanges()
				exchanges = append(exchanges, fx[2])
				reportValue = task.gold
			}
		}
		f.attempts++
		f.calls += len(exchanges)
		ans := answers("acc", fmt.Sprintf("%.4f", reportValue))
		ev := verify.Event{Unbound: verify.Unbound(verify.Bind(exchanges, ans)), Rewrites: verify.CheckAppendOnly(exchanges)}
		counted := len(ev.Unbound) == 0 && len(ev.Rewrites) == 0
		if p.ShouldReplay(n.rec, rng.Float64()) && counted {
			var replays [][]verify.Exchange
			others := live(n)
			for len(replays) < 2 && len(others) > 0 {
				k := rng.IntN(len(others))
				others = append(others[:k], others[k+1:]...)
				// The replayer runs the same commands honestly, answered
				// with the recorded model responses (no model cost).
				v := task.honestValue(rng)
				rp := agentRun(task.output(rng, v), reportValue).exchanges()
				replays = append(replays, rp)
				f.replays++
				f.replayedCalls += len(rp)
				ev.Judgement = verify.Judge(exchanges, replays, ans, p.Tolerance)
				if ev.Judgement.Verdict != verify.NeedsReplay {
					break
				}
			}
			f.verdicts[ev.Judgement.Verdict]++
			f.benign += ev.Judgement.Benign
			counted = ev.Judgement.Verdict != verify.Forged
		}
		forgedResult := cheat && counted
		if forgedResult {
			f.forgedTotal++
			f.forgedOnBoard++
		}
		if counted && ev.Judgement.Verdict != verify.Verified {
			n.held = append(n.held, forgedResult)
		}
		var why string
		n.rec, why = p.Apply(n.rec, ev)
		if why != "" {
			quarantine(n)
		}
		_ = a
	}
	for _, n := range nodes {
		if n.kind == honestNode {
			if n.rec.Quarantined != "" {
				f.honestQuarantined++
			}
			continue
		}
		if !n.cheated {
			continue
		}
		c := f.caught[n.kind]
		c[1]++
		if n.rec.Quarantined != "" {
			c[0]++
		}
		f.caught[n.kind] = c
	}
	return f
}

func TestSimulation(t *testing.T) {
	const attempts = 300
	var caught, cheaters, replays, runs int
	for seed := uint64(1); seed <= 5; seed++ {
		f := simulate(seed, attempts)
		var kinds []string
		for _, k := range []nodeKind{planter, editor, rewriter} {
			c := f.caught[k]
			caught, cheaters = caught+c[0], cheaters+c[1]
			kinds = append(kinds, fmt.Sprintf("%s %d/%d", k, c[0], c[1]))
		}
		replays, runs = replays+f.replays, runs+f.attempts
		t.Logf("seed %d: %d attempts (%d cheated), cheaters quarantined: %s; %d replays (%.1f%% of attempts, %d model calls served from the record, 0 paid); verdicts %v; %d benign differences; forged results counted on the board: %d of %d; honest nodes quarantined: %d",
			seed, f.attempts, f.cheats, strings.Join(kinds, ", "), f.replays, 100*float64(f.replays)/float64(f.attempts), f.replayedCalls,
			f.verdicts, f.benign, f.forgedOnBoard, f.forgedTotal, f.honestQuarantined)
		if f.honestQuarantined != 0 {
			t.Errorf("seed %d: %d honest nodes quarantined", seed, f.honestQuarantined)
		}
		if f.verdicts[verify.Forged] == 0 {
			t.Errorf("seed %d: no forgery found", seed)
		}
		if f.benign == 0 {
			t.Errorf("seed %d: the noisy capsules gave no benign difference", seed)
		}
	}
	rate := float64(caught) / float64(cheaters)
	t.Logf("over 5 seeds x %d attempts: %d of %d cheating nodes quarantined (%.0f%%); replays %.1f%% of attempts (CPU of a replay ~ an attempt's tools; model spend 0)",
		attempts, caught, cheaters, 100*rate, 100*float64(replays)/float64(runs))
	if rate < 0.9 {
		t.Errorf("detection rate %.2f, want at least 0.9", rate)
	}
}
