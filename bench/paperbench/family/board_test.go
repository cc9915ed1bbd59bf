package family_test

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/paperbench"
	"github.com/repronet/repronet/bench/paperbench/family"
)

func publicOf(t *testing.T, p family.Public) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func scored(stage string, rf, sz float64, failed int, use family.JudgeUse, agree family.AgreementTable) family.Public {
	return family.Public{Stage: stage, Submitted: true, ReproduceSH: true, Leaves: 7, Judged: 7,
		Scores: []family.GraderScore{{Grader: paperbench.GraderReportFailed, Score: rf, Valid: true, Failed: failed},
			{Grader: paperbench.GraderSilentZero, Score: sz, Valid: true, Failed: failed}},
		Judge: use, Agreement: agree}
}

func cost(c float64) *float64 { return &c }

// TestBoards: one board per variant, scoring and grader; a row's score is
// the mean over papers of each paper's mean over runs; disqualified units
// count as 0; judge use, agent cost and agreement add up; unscored units
// are counted by status; another judge's scores go to another board.
func TestBoards(t *testing.T) {
	s, _, _ := openSample(t, testConfig())
	sc := s.Scoring()
	other := func() json.RawMessage {
		cfg := testConfig()
		cfg.Judge.Model = "judge-c"
		s2, _, _ := openSample(t, cfg)
		return s2.Scoring()
	}()
	use := family.JudgeUse{Calls: 14, InputTokens: 1000, OutputTokens: 100, CostUSD: cost(0.002)}
	agree := family.AgreementTable{BothOne: 4, FirstOnly: 1, BothZero: 1, Excluded: 1}
	full := func(rf, sz float64, exit int) family.Public {
		p := scored(family.StageReproduce, rf, sz, 1, use, agree)
		p.Reproduction = &family.Reproduction{Outcome: "ok", ExitCode: &exit, Executed: true}
		return p
	}
	dq := family.Public{Stage: family.StageRollout, Submitted: true, Disqualified: true, Leaves: 4, Auto: 4,
		Scores: []family.GraderScore{{Grader: paperbench.GraderReportFailed, Valid: true}, {Grader: paperbench.GraderSilentZero, Valid: true}}}
	e := func(agent, variant, task string, run int, status bench.Status, scoring json.RawMessage, p *family.Public, agentCost *float64) bench.Entry {
		en := bench.Entry{Suite: "pb", Variant: variant, Agent: agent, TaskID: task, Run: run, Status: status, Scoring: scoring, CostUSD: agentCost}
		if p != nil {
			en.Score = publicOf(t, *p)
		}
		return en
	}
	a1, a2, a3 := full(1, 0.5, 0), full(0.5, 0.5, 1), full(0.25, 0.25, 0)
	entries := []bench.Entry{
		e("honest", family.Full, "p1", 1, bench.Validated, sc, &a1, cost(1)),
		e("honest", family.Full, "p1", 2, bench.Validated, sc, &a2, cost(2)),
		e("honest", family.Full, "p2", 1, bench.Validated, sc, &a3, nil),
		e("honest", family.Full, "p3", 1, bench.Pending, nil, nil, nil),
		e("honest", family.Full, "p4", 1, bench.InfraFailed, sc, nil, nil),
		e("cheat", family.CodeDev, "p1", 1, bench.Validated, sc, &dq, cost(3)),
		e("honest", family.Full, "p1", 3, bench.Validated, other, &a1, nil),
	}
	boards, err := s.Boards(entries)
	if err != nil {
		t.Fatal(err)
	}
	var got []family.Board
	for _, b := range boards {
		got = append(got, b.(family.Board))
	}
	var keys []string
	for _, b := range got {
		keys = append(keys, b.Variant+"/"+string(b.Grader)+"/"+b.Judge.Model)
	}
	want := "code-dev/paperbench-report-failed@1/judge-a code-dev/paperbench-silent-zero@1/judge-a " +
		"full/paperbench-report-failed@1/judge-a full/paperbench-silent-zero@1/judge-a " +
		"full/paperbench-report-failed@1/judge-c full/paperbench-silent-zero@1/judge-c"
	if strings.Join(keys, " ") != want {
		t.Fatalf("boards %s", strings.Join(keys, " "))
	}
	// Full, report-failed: p1 = (1 + 0.5)/2 = 0.75, p2 = 0.25; mean 0.5.
	rf := got[2].Rows
	if len(rf) != 1 || rf[0].Agent != "honest" || !near(rf[0].Score, 0.5) || !near(rf[0].Papers["p1"], 0.75) || rf[0].Units != 5 ||
		rf[0].Validated != 3 || rf[0].Pending != 1 || rf[0].InfraFailed != 1 || rf[0].ReproFailed != 1 || rf[0].FailedLeaves != 3 ||
		rf[0].Judge.Calls != 42 || rf[0].Judge.CostUSD == nil || !near(*rf[0].Judge.CostUSD, 0.006) || *rf[0].AgentCostUSD != 3 {
		t.Errorf("full report-failed row %+v", rf)
	}
	// Reliability, a run passing from 0.5: p1's two runs (1 and 0.5) pass,
	// p2's (0.25) fails.
	if rel := rf[0].Reliability; rel == nil || rel.Pass != family.PassRule || rel.Runs != 3 || rel.Tasks != 2 ||
		!near(rel.PassAtK[0].Value, 0.5) || !near(rel.PassHatK[1].Value, 1) || rel.PassHatK[1].Tasks != 1 ||
		rel.Consistency == nil || *rel.Consistency != 1 || rel.CostUSD == nil || rel.CostUSD.N != 2 || rel.CostUSD.Median != 1.5 {
		t.Errorf("full report-failed reliability %+v", rel)
	}
	// Silent zero: p1 = 0.5, p2 = 0.25: 0.375.
	if sz := got[3].Rows; !near(sz[0].Score, 0.375) {
		t.Errorf("full silent-zero row %+v", sz)
	}
	// Agreement pooled: three units of 6 pairs, 5 agreeing each.
	if a := got[2].Agreement; a.Pairs != 18 || a.Agree != 15 || a.Excluded != 3 || a.Kappa == nil || !near(*a.Kappa, 4.0/7) {
		t.Errorf("agreement %+v", a)
	}
	if cd := got[0].Rows; len(cd) != 1 || cd[0].Agent != "cheat" || cd[0].Disqualified != 1 || cd[0].Score != 0 || cd[0].Judge.Calls != 0 ||
		cd[0].Agreement.Kappa != nil {
		t.Errorf("code-dev rows %+v", cd)
	}
	if other := got[4].Rows; len(other) != 1 || other[0].Validated != 1 || !near(other[0].Score, 1) {
		t.Errorf("other judge's board %+v", other)
	}
	var text bytes.Buffer
	if err := family.WriteText(&text, got); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"paperbench pb, full variant, grader paperbench-report-failed@1", "judge judge-a (temperature 0, max 2000 tokens)",
		"15 of 18 agree (83%), kappa 0.57, 3 excluded", "honest", "50.0%", "$0.0060", "pass = score>=0.5", "p1 ++ p2 -"} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("no %q in\n%s", w, text.String())
		}
	}
	// Refused: a rollout's score on a full board, an unknown variant or status.
	bad := a1
	bad.Stage = family.StageRollout
	for _, en := range []bench.Entry{e("x", family.Full, "p1", 1, bench.Validated, sc, &bad, nil), e("x", "hard", "p1", 1, bench.Pending, sc, nil, nil),
		e("x", family.Full, "p1", 1, "lost", sc, nil, nil)} {
		if _, err := s.Boards([]bench.Entry{en}); err == nil {
			t.Errorf("entry %+v accepted", en)
		}
	}
}
