package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/shellqa"
	"github.com/repronet/repronet/bench/shellqa/sample"
	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/proto"
)

// TestShellQA runs the second benchmark family, shellqa, end to end
// without any CORE-Bench part: its sample suite, content and two agents
// imported into a coordinator, two real nodes running both agents on every
// task at both variants in containerd with the coordinator's replication
// policy. The solver is right on every validated unit, the wrong agent on
// none (its unanswered questions scored as wrong, not as failures), and
// no assignment the coordinator sent (read back from a recording proxy in
// front of it) holds a gold answer, while each holds its question.
func TestShellQA(t *testing.T) {
	requireRoot(t)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	log := testLogger(t)
	d := ensureDaemon(ctx, t, log)

	const suite = "shellqa-sample"
	network := uniqueName("e2e-shellqa")
	coord, proxy, via := tappedCoordinator(t, coordinator.Config{DataDir: t.TempDir(), Network: network, Logger: log,
		Families: families.Registry(), Checker: families.Checker(), JoinTokens: []string{e2eJoinToken}, LeaseTTL: 20 * time.Second,
		Limits: &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, Pids: 256, WallSeconds: 60, OutputBytes: 64 << 10}},
		func(cfg coordinator.Config) *coordinator.Coordinator {
			c, err := coordinator.New(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c
		})
	tasks := importShellQA(ctx, t, coord, suite)

	var nodes []interface{ Close() error }
	for i := range 2 {
		nodes = append(nodes, startNode(ctx, t, d, log, nodeOpts{name: fmt.Sprintf("shellqa-%d", i+1), coord: via, network: network,
			hostOptions: []libp2p.Option{libp2p.NoSecurity}}))
	}
	waitFor(ctx, t, "both nodes in view", func() bool { return len(coord.Nodes()) == 2 })
	for _, agent := range sample.AgentNames() {
		if _, _, err := coord.Evaluate(ctx, coordinator.Evaluation{Suite: suite, Agent: agent}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(ctx, t, "every attempt finished and every unit decided", func() bool {
		p := coord.Progress()
		return p.Units > 0 && p.Done+p.Failed == p.Total && p.Decided == p.Units
	})
	if !allValidated(coord) {
		t.Fatalf("not every unit validated: %+v", coord.Stats())
	}
	t.Logf("%d attempts validated in %s", coord.Stats().Total, time.Since(start).Round(time.Millisecond))

	checkShellQABoards(t, coord.Boards(), suite, len(tasks))
	for _, e := range coord.LeaderboardEntries() {
		if e.Agent == "wrong" && e.TaskID == "top-item" && string(e.Score) != `{"answered":false,"correct":false}` {
			t.Errorf("the wrong agent's unanswered %s/%s is scored %s", e.TaskID, e.Variant, e.Score)
		}
	}

	// Every assignment sent, in the clear: none holds a gold answer; each
	// holds its task's question file. Everything is stopped first, so
	// that every byte sent is in the capture.
	total := coord.Stats().Total
	for _, n := range nodes {
		n.Close()
	}
	coord.Close()
	proxy.ln.Close()
	proxy.wg.Wait()
	var golds []string
	questions := map[string]bool{}
	for _, task := range tasks {
		golds = append(golds, task.Answer)
		questions[task.Question] = true
	}
	var sent []*proto.Assignment
	for i, c := range proxy.captures() {
		as, err := assignmentsIn(c)
		if err != nil {
			t.Fatalf("connection %d: %v", i, err)
		}
		sent = append(sent, as...)
	}
	if len(sent) < total {
		t.Fatalf("%d assignments captured for %d attempts", len(sent), total)
	}
	seen := map[string]bool{}
	for _, a := range sent {
		if leaks := goldIn(a, golds); len(leaks) > 0 {
			t.Errorf("assignment %s (%s) holds gold answers %q", a.GetAttemptId(), a.GetLabel(), leaks)
		}
		for _, e := range a.GetRecipe().GetEdits() {
			if w := e.GetWrite(); w.GetPath() == shellqa.QuestionFile {
				q, _, _ := strings.Cut(string(w.GetContent()), "\nsolve: ")
				seen[q] = true
			}
		}
	}
	for q := range questions {
		q, _, _ = strings.Cut(q, "\nsolve: ")
		if !seen[q] {
			t.Errorf("no assignment asked %q: not the run's traffic", q)
		}
	}
	// The search can fail: a gold answer in a question is found.
	leak := &proto.Assignment{Recipe: &proto.Recipe{Edits: []*proto.Edit{{Op: &proto.Edit_Write{Write: &proto.FileWrite{
		Path: shellqa.QuestionFile, Content: []byte("The answer is " + golds[2] + ".")}}}}}}
	if goldIn(leak, golds) == nil {
		t.Fatal("a gold answer in a question file is not found")
	}
	t.Logf("%d assignments checked; %s in all", len(sent), time.Since(start).Round(time.Millisecond))
}

// importShellQA imports the shellqa sample suite, its content and both
// agents (declared deterministic) and returns its tasks.
func importShellQA(ctx context.Context, t *testing.T, coord *coordinator.Coordinator, suite string) []shellqa.Task {
	t.Helper()
	data, err := sample.Tasks()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := coord.ImportSuite(ctx, shellqa.Def(suite, data)); err != nil {
		t.Fatal(err)
	}
	for _, name := range sample.ContentNames() {
		tb, err := sample.ContentTarball(name)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := coord.AddCapsule(ctx, name, bytes.NewReader(tb)); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range sample.AgentNames() {
		img, err := sample.AgentImage(name, agentimage.BusyboxPath)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := coord.AddAgentWith(ctx, coordinator.AgentInfo{Name: name, Model: "none (busybox sh)", Deterministic: true},
			bytes.NewReader(img)); err != nil {
			t.Fatal(err)
		}
	}
	tasks, err := shellqa.ParseTasks(data)
	if err != nil {
		t.Fatal(err)
	}
	return tasks
}

// checkShellQABoards checks the coordinator's boards: only shellqa's, one
// per variant under shellqa@1, the solver right on every task and the wrong
// agent on none, every unit validated.
func checkShellQABoards(t *testing.T, boards []any, suite string, tasks int) {
	t.Helper()
	js, _ := json.MarshalIndent(boards, "", "  ")
	var variants []string
	for _, b := range boards {
		board, ok := b.(shellqa.Board)
		if !ok {
			t.Fatalf("a board of type %T:\n%s", b, js)
		}
		variants = append(variants, board.Variant)
		if board.Suite != suite || string(board.Scoring) != `{"scorer":"shellqa","version":1}` || len(board.Rows) != 2 {
			t.Errorf("board %s/%s under %s with %d rows:\n%s", board.Suite, board.Variant, board.Scoring, len(board.Rows), js)
		}
		for _, r := range board.Rows {
			want := map[string]shellqa.Row{
				"solver": {Agent: "solver", Model: "none (busybox sh)", StatusCounts: bench.StatusCounts{Units: tasks, Validated: tasks}, Correct: tasks, Accuracy: 1},
				"wrong":  {Agent: "wrong", Model: "none (busybox sh)", StatusCounts: bench.StatusCounts{Units: tasks, Validated: tasks}},
			}[r.Agent]
			// One run a task: pass@1 is the accuracy.
			rel := r.Reliability
			r.Reliability = nil
			if r != want || rel == nil || rel.MaxRuns != 1 || rel.Tasks != tasks {
				t.Errorf("%s: row %+v (reliability %+v), want %+v", board.Variant, r, rel, want)
			}
		}
	}
	if !slices.Equal(variants, []string{shellqa.Plain, shellqa.Hinted}) {
		t.Errorf("boards of variants %q:\n%s", variants, js)
	}
}

// assignmentsIn decodes the assignments a coordinator sent on one
// plaintext connection (its capture): each stream of the assign protocol
// holds one, after multistream-select.
func assignmentsIn(capture []byte) ([]*proto.Assignment, error) {
	_, streams, err := demux(capture)
	if err != nil {
		return nil, err
	}
	var out []*proto.Assignment
	for id, s := range streams {
		if s.protocol != string(proto.AssignProtocol) {
			continue
		}
		_, off := multistreamSelect(s.data)
		var a proto.Assignment
		if err := proto.ReadMsg(bytes.NewReader(s.data[off:]), &a, proto.MaxAssignmentSize); err != nil {
			return nil, fmt.Errorf("assign stream %d: %w", id, err)
		}
		out = append(out, &a)
	}
	return out, nil
}

// goldIn lists the gold answers found in any text an assignment carries
// (its recipe's files, environment, arguments and paths, its label).
func goldIn(a *proto.Assignment, golds []string) []string {
	r := a.GetRecipe()
	texts := []string{a.GetLabel(), a.GetSuite(), a.GetGroup(), r.GetCwd()}
	texts = append(texts, r.GetEnv()...)
	texts = append(texts, r.GetArgs()...)
	texts = append(texts, r.GetEntrypoint()...)
	for _, in := range r.GetInputs() {
		texts = append(texts, in.GetPath(), in.GetTop())
	}
	for _, e := range r.GetEdits() {
		texts = append(texts, e.GetRemove(), e.GetDir(), e.GetEmptyDir(), e.GetWrite().GetPath(), string(e.GetWrite().GetContent()))
	}
	for _, m := range r.GetMounts() {
		texts = append(texts, m.GetSource(), m.GetTarget())
	}
	for _, o := range r.GetOutputs() {
		texts = append(texts, o.GetPath())
	}
	var found []string
	for _, g := range golds {
		for _, s := range texts {
			if strings.Contains(s, g) {
				found = append(found, g)
				break
			}
		}
	}
	return found
}
