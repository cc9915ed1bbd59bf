package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/heureka"
	"github.com/repronet/repronet/bench/heureka/family"
	"github.com/repronet/repronet/bench/heureka/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/modelsim"
)

// TestHeureka runs the HeurekaBench family end to end on the stand-in
// suite: both question files imported, the paper's stand-in datasets as
// content, two real nodes running the sample agent (which analyses the
// datasets in its sandbox) on every question, and the open-ended answers
// rated by the scripted judge through the coordinator's gateway, once
// with the rating token's log-probabilities and once without. The boards
// hold the metrics computed here by hand: MCQ accuracy 1/3 under the
// published grader ("B, D" is a wrong letter " D") and 2/3 under the
// trimmed one, with macro and micro precision and recall; OEQ mean of the
// probability-weighted 4 and the plain 2, the board saying "mixed". Every
// judge call is recorded with its attempt, and the board's judge cost is
// what the gateway metered.
func TestHeureka(t *testing.T) {
	requireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sim, err := modelsim.Start(sample.Script(), modelsim.Options{APIKey: providerKey})
	if err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	price := gateway.PriceUSD{Input: 2.5, Output: 10}
	d := ensureDaemon(ctx, t, log)
	network := uniqueName("e2e-heureka")
	c := startCoordinator(ctx, t, coordinator.Config{Network: network, Logger: log, IdleCanaryEvery: -1,
		ScheduleInterval: 200 * time.Millisecond,
		Gateway: &gateway.Config{
			Providers: []gateway.Provider{{Name: "scripted", API: gateway.APIOpenAI, BaseURL: sim.URL() + "/v1", Key: providerKey}},
			Models:    []gateway.Model{{Name: sample.JudgeModel, Provider: "scripted", Price: price, MaxOutput: 4096}},
		}})

	const suite = "heureka-standin"
	cfg := family.DefaultConfig()
	cfg.Judge.Model = sample.JudgeModel
	cfg.Prices = map[string]family.Price{sample.JudgeModel: {Input: price.Input, Output: price.Output}}
	def, err := family.Def(suite, sample.MCQFile(), sample.OEQFile(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.ImportSuite(ctx, def); err != nil {
		t.Fatal(err)
	}
	data, err := sample.DataTarball()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddCapsule(ctx, family.DataContent(sample.Paper), bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	img, err := sample.AgentImage(agentimage.BusyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddAgentWith(ctx, coordinator.AgentInfo{Name: sample.Agent, Model: "none (busybox awk)", Deterministic: true},
		bytes.NewReader(img)); err != nil {
		t.Fatal(err)
	}
	addr := c.Addrs()[0].String()
	for i := range 2 {
		startNode(ctx, t, d, log, nodeOpts{name: fmt.Sprintf("heureka-%d", i), coord: addr, network: network})
	}
	waitFor(ctx, t, "both nodes in view", func() bool { return len(c.Nodes()) == 2 })
	if _, _, err := c.Evaluate(ctx, coordinator.Evaluation{ID: "hb", Suite: suite, Agent: sample.Agent, Replicas: 1}); err != nil {
		t.Fatal(err)
	}
	for !allValidated(c) || len(c.LeaderboardEntries()) != 5 {
		select {
		case <-ctx.Done():
			t.Fatalf("not all validated: %+v; entries %+v", c.Progress(), c.LeaderboardEntries())
		case <-time.After(500 * time.Millisecond):
		}
	}

	var boards []family.Board
	for _, b := range c.Boards() {
		if hb, ok := b.(family.Board); ok {
			boards = append(boards, hb)
		}
	}
	if len(boards) != 4 {
		t.Fatalf("%d heureka boards, want 4 (2 MCQ graders, 2 OEQ scorers)", len(boards))
	}
	near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
	weighted := sample.WeightedRating()
	for _, b := range boards {
		if len(b.Rows) != 1 || b.Rows[0].Agent != sample.Agent {
			t.Fatalf("board %s %s rows %+v", b.Kind, b.Grader, b.Rows)
		}
		r := b.Rows[0]
		switch heureka.MCQGrader(b.Grader) {
		case heureka.MCQPublished:
			// Q1 {B, " D"} against {B, D}: tp 1, fp 1, fn 1 (precision
			// 1/2, recall 1/2); Q2 {A} exact; Q3 unanswered (gold {C}),
			// which the published code counts in the accuracy only.
			m := r.MCQ
			if m.Questions != 3 || m.Answered != 2 || m.Correct != 1 || !near(m.Accuracy, 1.0/3) ||
				!near(m.MacroPrecision, (0.5+1)/2) || !near(m.MacroRecall, (0.5+1)/2) ||
				!near(m.MicroPrecision, 2.0/3) || !near(m.MicroRecall, 2.0/3) {
				t.Errorf("published MCQ: %+v", m)
			}
		case heureka.MCQTrimmed:
			m := r.MCQ
			if m.Correct != 2 || !near(m.Accuracy, 2.0/3) || !near(m.MacroPrecision, 2.0/3) || !near(m.MicroPrecision, 1) ||
				!near(m.MicroRecall, 3.0/4) || !near(m.MicroF1, 2*0.75/1.75) {
				t.Errorf("trimmed MCQ: %+v", m)
			}
		}
		if b.Kind == family.KindOEQ {
			o := r.OEQ
			if o.Questions != 2 || !near(o.Mean, (weighted+2)/2) || o.Mode != "mixed" || o.Weighted != 1 || o.Plain != 1 {
				t.Errorf("OEQ %s: %+v, want mean %v", b.Grader, o, (weighted+2)/2)
			}
			if b.Judge == nil || b.Judge.Model != sample.JudgeModel || b.Judge.TopLogprobs != 3 || r.Judge == nil || r.Judge.Calls != 2 {
				t.Errorf("OEQ %s: judge %+v, use %+v", b.Grader, b.Judge, r.Judge)
			}
		}
	}

	// Every judge call through the gateway, recorded with its attempt; the
	// board's judge cost is what the gateway metered.
	var metered gateway.Money
	calls := 0
	for _, a := range c.Attempts() {
		if !strings.HasPrefix(a.TaskID, family.KindOEQ) {
			continue
		}
		traj, err := c.Trajectory(ctx, a.ID+".judge")
		if err != nil {
			t.Fatal(err)
		}
		for _, call := range traj {
			if call.Status != 200 || call.Model != sample.JudgeModel || !strings.Contains(string(call.RequestBody), `"top_logprobs":3`) {
				t.Fatalf("judge call of %s: %s %d %s", a.ID, call.Model, call.Status, call.RequestBody)
			}
			metered += call.Cost
			calls++
		}
	}
	oeq := boards[2].Rows[0]
	if calls != 2 || oeq.Judge.CostUSD == nil || math.Abs(*oeq.Judge.CostUSD-metered.USDValue()) > 1e-6 {
		t.Errorf("%d judge calls metered %v; the board says %v", calls, metered.USDValue(), oeq.Judge.CostUSD)
	}
	var text strings.Builder
	if err := family.WriteText(&text, boards); err != nil {
		t.Fatal(err)
	}
	t.Logf("boards:\n%s", text.String())

	// The dashboard: an MCQ board (the value is exact under the trimmed
	// grader) and an OEQ board (the published score mapped from [1, 5]).
	checkDashboard(t, dashboardBoards(t, c, suite), map[string]map[string]float64{
		"kind=mcq": {sample.Agent: 2.0 / 3},
		"kind=oeq": {sample.Agent: ((weighted-1)/4 + (2.0-1)/4) / 2},
	})
}

// dashboardBoards reads the coordinator's public leaderboard page (the
// dashboard's "/") and returns its boards' sections of suite, each as
// its HTML.
func dashboardBoards(t *testing.T, c *coordinator.Coordinator, suite string) []string {
	t.Helper()
	srv := httptest.NewServer(c.Handler())
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("dashboard: %s %v", resp.Status, err)
	}
	var out []string
	for _, s := range strings.Split(string(body), `<section class="board"`)[1:] {
		s, _, _ = strings.Cut(s, "</section>")
		if strings.Contains(s, `data-suite="`+suite+`"`) {
			out = append(out, s)
		}
	}
	return out
}

// checkDashboard checks that the dashboard shows a board of suite per
// scoring fragment, with each agent's accuracy (the family's value).
func checkDashboard(t *testing.T, sections []string, want map[string]map[string]float64) {
	t.Helper()
	for frag, agents := range want {
		found := false
		for _, s := range sections {
			scoring, _, _ := strings.Cut(s, "</p>")
			if !strings.Contains(scoring, frag) {
				continue
			}
			found = true
			for agent, acc := range agents {
				row := s[strings.Index(s, `data-agent="`+agent+`"`):]
				if !strings.Contains(row, fmt.Sprintf(`<td class="acc">%.1f%%</td>`, 100*acc)) {
					t.Errorf("dashboard board %q: agent %s, want accuracy %.1f%%:\n%s", frag, agent, 100*acc, s)
				}
			}
		}
		if !found {
			t.Errorf("no dashboard board of scoring %q among %d:\n%s", frag, len(sections), strings.Join(sections, "\n---\n"))
		}
	}
}
