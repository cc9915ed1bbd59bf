package core

import (
	"fmt"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/verify"
)

// TestReplayPatientForger is issue 25.10's patient forger through the
// core: a node honest until its replay rate reaches the floor, then
// forging one attempt in ten (a forgery that pays: a correct answer),
// beside four honest nodes whose results are correct half the time. It
// counts the forged results left on the board once the forger has made
// 300 attempts (or was quarantined), with results that score replayed
// whatever the rate (Policy.ReplayScored, the default) and without, and
// what that costs in replays per attempt (docs/verification.md,
// "Patience"; docs/benchmarks.md).
func TestReplayPatientForger(t *testing.T) {
	for _, scored := range []bool{true, false} {
		var leftTotal, attemptsTotal, replaysTotal int
		seeds := 5
		for seed := uint64(1); seed <= uint64(seeds); seed++ {
			left, attempts, replays, forgerAttempts := patientForger(t, seed, scored)
			leftTotal += left
			attemptsTotal += attempts
			replaysTotal += replays
			t.Logf("replay_scored=%v seed %d: the forger made %d attempts; %d forged results left on the board; %d replays for %d attempts",
				scored, seed, forgerAttempts, left, replays, attempts)
		}
		perForger := float64(leftTotal) / float64(seeds)
		t.Logf("replay_scored=%v: %.1f forged results left per patient forger; %.2f replays per attempt", scored, perForger,
			float64(replaysTotal)/float64(attemptsTotal))
		if scored && perForger > 0.5 {
			t.Fatalf("with results that score always replayed, %.1f forged results are left per forger, want at most 0.5", perForger)
		}
	}
}

// patientForger runs one seeded network; it returns the forged results
// left on the board, the attempts and replays made, and the forger's
// attempts.
func patientForger(t *testing.T, seed uint64, scored bool) (left, originals, replays, forgerAttempts int) {
	t.Helper()
	h := newHarness(t, func(c *Config) {
		c.Seed = [32]byte{byte(seed), 7}
		c.Verify = verify.DefaultPolicy()
		c.Verify.ReplayScored = scored
	})
	h.cat.agents["llm"] = AgentInfo{CID: "bafyllm", Model: "m"}
	world := mrand.New(mrand.NewPCG(seed, 99))
	const forger = "n0"
	nodes := []string{"n0", "n1", "n2", "n3", "n4"}
	announce := func() {
		for _, n := range nodes {
			h.announce(n, "op-"+n, 2)
		}
	}
	announce()
	h.evaluate(Evaluation{Suite: "two", Agent: "llm", Levels: []string{"easy", "hard"}, Runs: 600})
	forged := map[string]bool{}
	for round := 0; round < 4000 && len(h.s.Queue) > 0 && forgerAttempts < 300 && !h.s.quarantined(forger); round++ {
		for _, o := range h.tick().Offers {
			a := h.s.Attempts[o.Attempt]
			h.accept(o)
			if _, ok := h.reportModel(a.ID, o.Node).(ReportRecorded); !ok {
				continue
			}
			if a.Kind != KindReplay {
				originals++
				pass := world.Float64() < 0.5
				if o.Node == forger {
					forgerAttempts++
					rec := h.s.Records[forger].Verify
					if h.s.cfg.Verify.Rate(rec) <= h.s.cfg.Verify.Floor && world.Float64() < 0.1 {
						forged[a.ID], pass = true, true
					}
				}
				h.score(a.ID, pass)
				continue
			}
			replays++
			orig := h.s.Attempts[a.ReplayOf]
			reps := orig.Verification.Replays
			j := verify.Judgement{Verdict: verify.Verified}
			switch {
			case forged[orig.ID] && len(reps) == 1:
				j.Verdict = verify.NeedsReplay
			case forged[orig.ID]:
				j.Verdict = verify.Forged
			}
			h.step(Judged{Attempt: orig.ID, Replays: slices.Clone(reps), Judgement: j})
		}
		h.advance(time.Second)
		announce()
	}
	for id, w := range h.s.Book.Attempts {
		if w.Decision.State != crosscheck.Validated {
			continue
		}
		if c := h.s.canonical(id); c != nil && forged[c.ID] {
			left++
		}
	}
	if forgerAttempts < 300 && !h.s.quarantined(forger) {
		t.Fatal(fmt.Sprintf("seed %d: the forger made %d attempts and is not quarantined: the run is too short", seed, forgerAttempts))
	}
	return left, originals, replays, forgerAttempts
}
