package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/paperbench"
	"github.com/repronet/repronet/bench/paperbench/family"
	"github.com/repronet/repronet/bench/paperbench/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/internal/modelsim"
)

// TestPaperBench runs the PaperBench family end to end on the toy paper:
// the paper folder imported in the published layout, two real nodes, the
// reference agent (wrapped by the sample's log-keeping harness) played by
// the scripted model through the coordinator's gateway, and the judges
// (the same scripted server, through the same gateway) grading every
// leaf. The honest agent's full-variant pipeline reproduces on the other
// node than its rollout (reproduce.sh really runs in the reproducer image
// and writes results/mean.txt), and its score under both graders is the
// tree computed here by hand from the judges' scripted grades; its
// Code-Dev run scores the Code Development subtree alone. The cheat, whose
// log shows a fetch of the blacklisted URL, is disqualified and scores 0
// without a judge being asked; so is a quiet cheat that keeps no log,
// from the trajectory of its model calls the gateway recorded. Every judge call is in the coordinator's
// judge trajectory of the scored attempt, and the board's judge cost is
// what the gateway metered.
func TestPaperBench(t *testing.T) {
	requireRoot(t)
	if agentBin == "" {
		t.Fatal(buildErr)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sim, err := modelsim.Start(sample.Script(), modelsim.Options{APIKey: providerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	price := gateway.PriceUSD{Input: 3, Output: 12}
	var models []gateway.Model
	for _, m := range []string{sample.HonestModel, sample.CheatModel, sample.JudgeModel, sample.SecondJudgeModel} {
		models = append(models, gateway.Model{Name: m, Provider: "scripted", Price: price, MaxOutput: 4096})
	}
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-paperbench")
	c := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, IdleCanaryEvery: -1,
		ScheduleInterval: 200 * time.Millisecond,
		Gateway: &gateway.Config{
			Providers: []gateway.Provider{{Name: "scripted", API: gateway.APIOpenAI, BaseURL: sim.URL() + "/v1", Key: providerKey}},
			Models:    models,
		}})

	// The suite: the toy paper folder, its agent's copy as content, the
	// reproducer image, both agents (one image, two models).
	const suite = "paperbench-toy"
	dir, err := sample.WritePaper(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	paper, content, err := family.ImportFolder(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	second := family.JudgeSettings{Model: sample.SecondJudgeModel}
	zero := 0.0
	cfg := family.Config{Judge: family.JudgeSettings{Model: sample.JudgeModel, Temperature: &zero, MaxTokens: 2000},
		SecondJudge: &second, DoubleJudged: 1, Concurrency: 4,
		Prices: map[string]family.Price{sample.JudgeModel: {Input: price.Input, Output: price.Output},
			sample.SecondJudgeModel: {Input: price.Input, Output: price.Output}}}
	def, err := family.Def(suite, []family.Paper{paper}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportSuite(ctx, def); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddCapsule(ctx, paper.ID, bytes.NewReader(content)); err != nil {
		t.Fatal(err)
	}
	repro, err := sample.ReproducerImage(agentimage.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: family.DefaultReproducer, Model: "none"}, bytes.NewReader(repro)); err != nil {
		t.Fatal(err)
	}
	img, err := sample.AgentImage(agentimage.BusyboxPath, agentBin)
	if err != nil {
		t.Fatal(err)
	}
	agents := map[string]string{"honest": sample.HonestModel, "cheat": sample.CheatModel, "quiet-cheat": sample.CheatModel}
	for name, model := range agents {
		if name == "quiet-cheat" {
			continue
		}
		if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: name, Model: model}, bytes.NewReader(img)); err != nil {
			t.Fatal(err)
		}
	}
	// The quiet cheat keeps no log: the plain reference agent, whose
	// fetch only the trajectory the gateway recorded shows.
	quiet, err := demo.ReferenceImage(agentimage.BusyboxPath, agentBin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: "quiet-cheat", Model: sample.CheatModel}, bytes.NewReader(quiet)); err != nil {
		t.Fatal(err)
	}

	addr := c.Addrs()[0].String()
	for i := range 2 {
		startNode(ctx, t, d, log, nodeOpts{name: fmt.Sprintf("paperbench-%d", i), coord: addr, network: network, slots: 1})
	}
	waitFor(ctx, t, "both nodes in view", func() bool { return len(c.Nodes()) == 2 })
	for _, ev := range []coordinator.Evaluation{
		{ID: "pb-honest", Suite: suite, Agent: "honest", Levels: []string{family.Full, family.CodeDev}},
		{ID: "pb-cheat", Suite: suite, Agent: "cheat", Levels: []string{family.Full}},
		{ID: "pb-quiet-cheat", Suite: suite, Agent: "quiet-cheat", Levels: []string{family.CodeDev}},
	} {
		ev.Replicas = 1
		ev.Env = []string{"MODEL=" + agents[ev.Agent]}
		ev.Models = []string{agents[ev.Agent]}
		if _, _, err := c.Evaluate(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	for {
		if allValidated(c) && len(c.LeaderboardEntries()) == 4 {
			break
		}
		select {
		case <-ctx.Done():
			var why []string
			for _, a := range c.Attempts() {
				d, _ := c.Decision(a.Unit)
				why = append(why, fmt.Sprintf("%s %s/%s/%s replica %d: %s on %.8s, decision %+v", a.ID, a.Agent, a.Level, a.Stage, a.Replica,
					a.State, a.ReportedBy, d))
			}
			for _, u := range c.CrossCheckUnits() {
				why = append(why, fmt.Sprintf("unit %s target %d replicas %d", u.Work.ID, u.Target, len(u.Replicas)))
			}
			t.Fatalf("not finished: %+v; attempts:\n%s", c.Progress(), strings.Join(why, "\n"))
		case <-time.After(500 * time.Millisecond):
		}
	}

	// The honest full pipeline: rollout and reproduction on different
	// nodes, each run once (a replay of the rollout, issue 13, runs on
	// another node by design: it is verification, not the pipeline).
	var rollout, reproduce coordinator.Attempt
	for _, a := range c.Attempts() {
		if a.Agent != "honest" || a.Level != family.Full || a.Kind == coordinator.KindReplay {
			continue
		}
		switch a.Stage {
		case family.StageRollout:
			rollout = a
		case family.StageReproduce:
			reproduce = a
		}
	}
	if rollout.ID == "" || reproduce.ID == "" || rollout.Outcome != "ok" || reproduce.Outcome != "ok" {
		t.Fatalf("honest full pipeline: rollout %+v, reproduction %+v", rollout, reproduce)
	}
	if rollout.ReportedBy == "" || rollout.ReportedBy == reproduce.ReportedBy {
		t.Fatalf("the rollout ran on %q, the reproduction on %q: want two nodes", rollout.ReportedBy, reproduce.ReportedBy)
	}

	// The tree by hand, from the judges' scripted grades: impl (weight 3)
	// = (2*1 + 1*1 + 1*0 + 0*1) / (2+1+1+0); run (2) = 1; results (1):
	// results-mean 1, results-spread failed (the judge answered prose), so
	// 1 with it out of the mean, 1/2 with it as 0.
	impl := (2.0*1 + 1*1 + 1*0 + 0*1) / (2 + 1 + 1 + 0)
	wantFull := map[paperbench.Grader]float64{
		paperbench.GraderReportFailed: (3*impl + 2*1 + 1*1.0) / 6,
		paperbench.GraderSilentZero:   (3*impl + 2*1 + 1*0.5) / 6,
	}
	if math.Abs(wantFull[paperbench.GraderReportFailed]-0.875) > 1e-12 || math.Abs(wantFull[paperbench.GraderSilentZero]-19.0/24) > 1e-12 {
		t.Fatalf("the hand computation is off: %v", wantFull)
	}
	entries := map[string]bench.Entry{}
	for _, e := range c.LeaderboardEntries() {
		if e.Suite == suite {
			entries[e.Agent+"/"+e.Variant] = e
		}
	}
	if len(entries) != 4 {
		t.Fatalf("%d paperbench entries: %+v", len(entries), entries)
	}
	for k, e := range entries {
		if e.Status != bench.Validated {
			t.Fatalf("%s: %s", k, e.Status)
		}
	}
	full := publicOf(t, entries["honest/"+family.Full])
	if full.Stage != family.StageReproduce || full.Disqualified || !full.ReproduceSH || full.Leaves != 7 || full.Judged != 7 {
		t.Fatalf("honest full: %+v", full)
	}
	if rp := full.Reproduction; rp == nil || !rp.Executed || rp.ExitCode == nil || *rp.ExitCode != 0 || rp.Changed < 2 {
		t.Fatalf("honest full reproduction: %+v", full.Reproduction)
	}
	for _, g := range full.Scores {
		if !g.Valid || math.Abs(g.Score-wantFull[g.Grader]) > 1e-9 || g.Failed != 1 {
			t.Errorf("honest full under %s: %+v, want %.6f with 1 failed leaf", g.Grader, g, wantFull[g.Grader])
		}
	}
	if len(full.Scores) != 2 {
		t.Errorf("honest full: scores %+v", full.Scores)
	}
	// Judged twice (every leaf): the second judge disagrees on impl-write;
	// results-spread's pair is out (the first judging failed).
	if a := full.Agreement; a.Excluded != 1 || a.Agreement().Pairs != 6 || a.Agreement().Agree != 5 {
		t.Errorf("honest full agreement: %+v (%+v)", a, a.Agreement())
	}
	codeDev := publicOf(t, entries["honest/"+family.CodeDev])
	for _, g := range codeDev.Scores {
		if math.Abs(g.Score-impl) > 1e-9 {
			t.Errorf("honest code-dev under %s: %v, want %v", g.Grader, g.Score, impl)
		}
	}
	if codeDev.Reproduction != nil || codeDev.Leaves != 4 {
		t.Errorf("honest code-dev: %+v", codeDev)
	}
	cheat := publicOf(t, entries["cheat/"+family.Full])
	if !cheat.Disqualified || cheat.Judge.Calls != 0 {
		t.Errorf("cheat: disqualified %v, %d judge calls", cheat.Disqualified, cheat.Judge.Calls)
	}
	for _, g := range cheat.Scores {
		if g.Score != 0 {
			t.Errorf("cheat under %s: %v, want 0", g.Grader, g.Score)
		}
	}
	quietCheat := publicOf(t, entries["quiet-cheat/"+family.CodeDev])
	if !quietCheat.Disqualified || quietCheat.Judge.Calls != 0 || quietCheat.Scores[0].Score != 0 {
		t.Errorf("the quiet cheat (its fetch in its trajectory only): %+v", quietCheat)
	}

	// Every judge call went through the gateway and is recorded with the
	// scored attempt; the board's judge cost is what the gateway metered.
	calls, err := c.Trajectory(ctx, reproduce.ID+".judge")
	if err != nil {
		t.Fatal(err)
	}
	if len(calls) != full.Judge.Calls || len(calls) != 14 {
		t.Fatalf("%d judge calls recorded, %d on the score, want 14 (7 leaves twice)", len(calls), full.Judge.Calls)
	}
	var metered gateway.Money
	for _, call := range calls {
		if call.Status != 200 || (call.Model != sample.JudgeModel && call.Model != sample.SecondJudgeModel) {
			t.Fatalf("judge call %d: %s status %d", call.Seq, call.Model, call.Status)
		}
		metered += call.Cost
	}
	if full.Judge.CostUSD == nil || math.Abs(*full.Judge.CostUSD-metered.USDValue()) > 1e-6 {
		t.Errorf("judge cost on the score %v, metered %v", full.Judge.CostUSD, metered.USDValue())
	}

	// The boards: one per variant and grader, the honest agent's scores
	// as computed, the cheat at 0, nothing of another family mixed in.
	var boards []family.Board
	for _, b := range c.Boards() {
		if pb, ok := b.(family.Board); ok {
			boards = append(boards, pb)
		}
	}
	if len(boards) != 4 {
		t.Fatalf("%d paperbench boards, want 4 (2 variants x 2 graders)", len(boards))
	}
	for _, b := range boards {
		for _, r := range b.Rows {
			want := 0.0
			switch {
			case r.Agent == "honest" && b.Variant == family.Full:
				want = wantFull[b.Grader]
			case r.Agent == "honest":
				want = impl
			}
			if math.Abs(r.Score-want) > 1e-9 || r.Validated != 1 {
				t.Errorf("board %s/%s: row %s scores %v (%d validated), want %v", b.Variant, b.Grader, r.Agent, r.Score, r.Validated, want)
			}
		}
		if b.Judge.Model != sample.JudgeModel || b.SecondJudge.Model != sample.SecondJudgeModel {
			t.Errorf("board %s/%s judges %+v, %+v", b.Variant, b.Grader, b.Judge, b.SecondJudge)
		}
	}
	var text strings.Builder
	if err := family.WriteText(&text, boards); err != nil {
		t.Fatal(err)
	}
	t.Logf("boards:\n%s", text.String())

	// The dashboard: a board per variant, the value being the score under
	// the report-failed grader.
	byLevel := map[string][]string{}
	for _, s := range dashboardBoards(t, c, suite) {
		for _, l := range []string{family.Full, family.CodeDev} {
			if strings.Contains(s, `data-level="`+l+`"`) {
				byLevel[l] = append(byLevel[l], s)
			}
		}
	}
	checkDashboard(t, byLevel[family.CodeDev], map[string]map[string]float64{"model:" + sample.JudgeModel: {"honest": impl}})
	checkDashboard(t, byLevel[family.Full], map[string]map[string]float64{"model:" + sample.JudgeModel: {"honest": wantFull[paperbench.GraderReportFailed], "cheat": 0}})
}

func publicOf(t *testing.T, e bench.Entry) family.Public {
	t.Helper()
	var p family.Public
	if err := json.Unmarshal(e.Score, &p); err != nil {
		t.Fatalf("%s/%s: score %s: %v", e.Agent, e.Variant, e.Score, err)
	}
	return p
}
