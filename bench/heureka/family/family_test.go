package family_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/heureka"
	"github.com/repronet/repronet/bench/heureka/family"
	"github.com/repronet/repronet/bench/heureka/sample"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
)

const sharedHeureka = "../../../../shared/heurekabench"

func readShared(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(sharedHeureka, name))
	if err != nil {
		t.Fatalf("the real HeurekaBench file %s is required: %v", name, err)
	}
	return b
}

func testConfig() family.Config {
	j := heureka.PublishedJudgeSettings()
	j.Model = sample.JudgeModel
	return family.Config{Judge: j, Prices: map[string]family.Price{sample.JudgeModel: {Input: 2.5, Output: 10}}}
}

func open(t *testing.T, mcq, oeq []byte, cfg family.Config) *family.Suite {
	t.Helper()
	def, err := family.Def("hb", mcq, oeq, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := family.New().Open(def)
	if err != nil {
		t.Fatal(err)
	}
	return s.(*family.Suite)
}

func testCID(t *testing.T, data string) cid.Cid {
	t.Helper()
	h, err := multihash.Sum([]byte(data), multihash.SHA2_256, -1)
	if err != nil {
		t.Fatal(err)
	}
	return cid.NewCidV1(cid.Raw, h)
}

// TestRealFiles opens a suite of both published question files: every
// question a task with a label ID of its own and its paper's datasets,
// and no recipe holds a gold answer or the insight's finding.
func TestRealFiles(t *testing.T) {
	mcqData, oeqData := readShared(t, "mcq.json"), readShared(t, "oeq.json")
	s := open(t, mcqData, oeqData, family.DefaultConfig())
	mcqs, err := heureka.ParseMCQFile(mcqData)
	if err != nil {
		t.Fatal(err)
	}
	oeqs, err := heureka.ParseOEQFile(oeqData)
	if err != nil {
		t.Fatal(err)
	}
	tasks := s.Tasks()
	if len(tasks) != len(mcqs)+len(oeqs) || len(mcqs) != 50 || len(oeqs) != 50 {
		t.Fatalf("%d tasks of %d MCQ and %d OEQ", len(tasks), len(mcqs), len(oeqs))
	}
	secrets := map[string][]string{}
	for _, q := range mcqs {
		id := family.TaskID(family.KindMCQ, q.ID)
		secrets[id] = []string{"**Answer", q.Insight.Summary, q.Insight.How, q.Insight.Relevant}
	}
	for _, q := range oeqs {
		id := family.TaskID(family.KindOEQ, q.ID)
		secrets[id] = []string{"**Answer", q.Answer, q.Insight.Summary, q.Insight.How, q.Insight.Relevant}
	}
	limits := &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, WallSeconds: 600}
	for i, task := range tasks {
		if !proto.ValidLabel(task.ID, proto.MaxLabelLen) || len(task.Content) != 1 || !strings.HasPrefix(task.Content[0], "heureka-paper") {
			t.Fatalf("task %d: %+v", i, task)
		}
		want := family.KindMCQ
		if i >= len(mcqs) {
			want = family.KindOEQ
		}
		if s.Kind(task.ID) != want || secrets[task.ID] == nil {
			t.Fatalf("task %s: kind %q", task.ID, s.Kind(task.ID))
		}
		r, err := s.Recipe(bench.RecipeInput{Task: task, Variant: family.Variant, Stage: family.Stage, Image: testCID(t, "image"),
			Content: map[string]cid.Cid{task.Content[0]: testCID(t, task.Content[0])}, Limits: limits})
		if err != nil {
			t.Fatal(err)
		}
		if err := recipe.Validate(r); err != nil {
			t.Fatalf("task %s: %v", task.ID, err)
		}
		text := string(r.GetEdits()[0].GetWrite().GetContent())
		if !strings.Contains(text, family.DataDir+"/") || !strings.Contains(text, "<solution>") {
			t.Fatalf("task %s: question file %q", task.ID, text)
		}
		for _, sec := range secrets[task.ID] {
			if sec != "" && strings.Contains(text, strings.TrimSpace(sec)) {
				t.Fatalf("task %s: the question file holds %q", task.ID, clip(sec))
			}
		}
		for _, e := range r.GetEnv() {
			for _, sec := range secrets[task.ID] {
				if sec != "" && strings.Contains(e, sec) {
					t.Fatalf("task %s: env holds a secret", task.ID)
				}
			}
		}
	}
	// The multiple-choice question file shows the options, one a line.
	r, _ := s.Recipe(bench.RecipeInput{Task: tasks[0], Variant: family.Variant, Stage: family.Stage, Image: testCID(t, "image"),
		Content: map[string]cid.Cid{tasks[0].Content[0]: testCID(t, "c")}, Limits: limits})
	text := string(r.GetEdits()[0].GetWrite().GetContent())
	for _, o := range mcqs[0].Options {
		if !strings.Contains(text, o.Letter+") "+o.Text+"\n") {
			t.Errorf("option %s missing from %q", o.Letter, text)
		}
	}
}

func clip(s string) string {
	if len(s) > 60 {
		return s[:60] + "..."
	}
	return s
}

func TestOpenRefuses(t *testing.T) {
	good := family.DefaultConfig()
	for _, c := range []struct {
		name string
		def  func() bench.SuiteDef
		want string
	}{
		{"no questions", func() bench.SuiteDef { d, _ := family.Def("x", nil, nil, good); return d }, "neither"},
		{"a broken MCQ file", func() bench.SuiteDef { d, _ := family.Def("x", []byte(`{"p":{}}`), nil, good); return d }, "mcq"},
		{"no judge model", func() bench.SuiteDef {
			c := good
			c.Judge.Model = ""
			d, _ := family.Def("x", sample.MCQFile(), nil, c)
			return d
		}, "judge.model"},
		{"top_logprobs 50", func() bench.SuiteDef {
			c := good
			c.Judge.TopLogprobs = 50
			d, _ := family.Def("x", sample.MCQFile(), nil, c)
			return d
		}, "top_logprobs"},
		{"an unknown config field", func() bench.SuiteDef {
			d, _ := family.Def("x", sample.MCQFile(), nil, good)
			d.Config = json.RawMessage(`{"judge":{"model":"m","top_p":1,"max_tokens":1},"graders":1}`)
			return d
		}, "unknown field"},
		{"an unknown task file key", func() bench.SuiteDef {
			d, _ := family.Def("x", sample.MCQFile(), nil, good)
			d.Tasks = json.RawMessage(`{"mcq":` + string(sample.MCQFile()) + `,"bixbench":{}}`)
			return d
		}, "unknown field"},
	} {
		if _, err := family.New().Open(c.def()); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error naming %q", c.name, err, c.want)
		}
	}
}

// outputs serves answer.txt (nil: not returned).
func outputs(final []byte) func(context.Context, string) ([]byte, error) {
	return func(_ context.Context, p string) ([]byte, error) {
		if p != family.AnswerFile || final == nil {
			return nil, fmt.Errorf("%s: %w", p, bench.ErrNotReturned)
		}
		return final, nil
	}
}

func startSim(t *testing.T) *modelsim.Server {
	t.Helper()
	sim, err := modelsim.Start(sample.Script(), modelsim.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sim.Close() })
	return sim
}

func publicOf(t *testing.T, sc bench.Score) family.Public {
	t.Helper()
	var p family.Public
	if err := json.Unmarshal(sc.Public, &p); err != nil {
		t.Fatal(err)
	}
	return p
}

func taskByPrefix(t *testing.T, s *family.Suite, prefix string) bench.Task {
	t.Helper()
	for _, task := range s.Tasks() {
		if strings.HasPrefix(task.ID, prefix) {
			return task
		}
	}
	t.Fatalf("no task %s*", prefix)
	return bench.Task{}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// TestScoreMCQ: the last <solution> counts; "B, D" is one wrong letter
// under the published grader and exact under the trimmed one; a final
// message without a solution, or none at all, is unanswered and wrong.
func TestScoreMCQ(t *testing.T) {
	s := open(t, sample.MCQFile(), nil, testConfig())
	task := taskByPrefix(t, s, "mcq-paperT-insight1-Question1")
	score := func(final []byte) family.Public {
		t.Helper()
		sc, err := s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Variant, Stage: family.Stage, Outcome: "ok",
			Output: outputs(final)})
		if err != nil {
			t.Fatal(err)
		}
		p := publicOf(t, sc)
		if sc.Comparable.Grading == nil || len(sc.Comparable.Grading.Checks) != 2 {
			t.Fatalf("comparable %+v", sc.Comparable)
		}
		// The value is the score under the grader ValueGrader names (the
		// dashboard shows it beside the number).
		g := s.ValueGrader(sc.Scoring)
		i := slices.IndexFunc(p.MCQ, func(m family.MCQPublic) bool { return string(m.Grader) == g })
		if i < 0 || p.MCQ[i].Exact != (sc.Value == 1) {
			t.Fatalf("value %v is not the score under ValueGrader's %q: %+v", sc.Value, g, p.MCQ)
		}
		return p
	}
	p := score([]byte("First <solution>A</solution>, then <solution>B, D</solution>"))
	pub, trim := p.MCQ[0], p.MCQ[1]
	if !p.Answered || pub.Grader != heureka.MCQPublished || pub.Exact || pub.TP != 1 || pub.FP != 1 || pub.FN != 1 || !near(pub.Precision, 0.5) ||
		trim.Grader != heureka.MCQTrimmed || !trim.Exact || trim.TP != 2 || !near(trim.F1, 1) {
		t.Fatalf("\"B, D\": %+v", p)
	}
	for _, final := range [][]byte{[]byte("I do not know."), nil} {
		p = score(final)
		if p.Answered || p.MCQ[0].Exact || p.MCQ[1].Exact || p.MCQ[1].FN != 2 || p.MCQ[1].Precision != 0 {
			t.Errorf("unanswered %q: %+v", final, p)
		}
	}
}

// TestScoreOEQ: the judge through Models rates the answer; with the
// rating token's log-probabilities the published score is the weighted
// rating computed by hand, without them the plain rating; an unanswered
// question is 1 and asks no judge; a judge that fails is an error.
func TestScoreOEQ(t *testing.T) {
	s := open(t, nil, sample.OEQFile(), testConfig())
	sim := startSim(t)
	score := func(prefix string, final []byte, m bench.Models) (family.Public, error) {
		sc, err := s.Score(context.Background(), bench.ScoreInput{Task: taskByPrefix(t, s, prefix), Variant: family.Variant, Stage: family.Stage,
			Outcome: "ok", Output: outputs(final), Models: m})
		if err != nil {
			return family.Public{}, err
		}
		p := publicOf(t, sc)
		g := s.ValueGrader(sc.Scoring)
		i := slices.IndexFunc(p.OEQ, func(o family.OEQPublic) bool { return string(o.Scorer) == g })
		if i < 0 || !near(sc.Value, max(0, (p.OEQ[i].Score-1)/4)) {
			t.Fatalf("value %v is not the score under ValueGrader's %q: %+v", sc.Value, g, p.OEQ)
		}
		return p, nil
	}
	p, err := score("oeq-paperT-insight1", []byte("<solution>ADRN-calcium rises</solution>"), sim)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.OEQ) != 2 || p.OEQ[0].Scorer != heureka.OEQPublished || !p.OEQ[0].Weighted || !near(p.OEQ[0].Score, sample.WeightedRating()) ||
		p.OEQ[0].Rating != 4 || !p.OEQ[1].Weighted || p.Judge == nil || p.Judge.Calls != 1 || p.Judge.CostUSD == nil {
		t.Fatalf("weighted: %+v (want %v)", p, sample.WeightedRating())
	}
	reqs := sim.Requests()
	var body struct {
		Model       string
		Logprobs    bool
		TopLogprobs int `json:"top_logprobs"`
		MaxTokens   int `json:"max_tokens"`
	}
	if err := json.Unmarshal(reqs[0].Body, &body); err != nil || body.Model != sample.JudgeModel || !body.Logprobs || body.TopLogprobs != 3 ||
		body.MaxTokens != 1000 || !strings.Contains(string(reqs[0].Body), "ADRN-calcium rises") {
		t.Fatalf("judge request %s", reqs[0].Body)
	}
	p, err = score("oeq-paperT-insight2", []byte("<solution>YAP1</solution>"), sim)
	if err != nil {
		t.Fatal(err)
	}
	if p.OEQ[0].Weighted || p.OEQ[0].Score != 2 || p.OEQ[1].Weighted || p.OEQ[1].Score != 2 {
		t.Fatalf("plain: %+v", p)
	}
	n := len(sim.Requests())
	p, err = score("oeq-paperT-insight2", []byte("no solution tag"), sim)
	// Published: 0 and left out of the mean; rating-tokens: 1.
	if err != nil || !p.OEQ[0].Unanswered || p.OEQ[0].Score != 0 || !p.OEQ[1].Unanswered || p.OEQ[1].Score != 1 || p.Judge != nil || len(sim.Requests()) != n {
		t.Fatalf("unanswered: %+v, %v", p, err)
	}
	if _, err := score("oeq-paperT-insight2", []byte("<solution>YAP1</solution>"), failing{}); err == nil || !strings.Contains(err.Error(), "no provider") {
		t.Errorf("a failing judge: %v", err)
	}
	if _, err := score("oeq-paperT-insight2", []byte("<solution>YAP1</solution>"), nil); err == nil {
		t.Error("no model access: no error")
	}
}

type failing struct{}

func (failing) Chat(context.Context, json.RawMessage) (json.RawMessage, error) {
	return nil, errors.New("no provider")
}

// TestBoards: boards per kind, grader and judge, with the metrics of
// heureka.AggregateMCQ and SummariseOEQ over validated units; a unit of
// another judge goes to a board of its own.
func TestBoards(t *testing.T) {
	s := open(t, sample.MCQFile(), sample.OEQFile(), testConfig())
	sim := startSim(t)
	finals := map[string]string{
		"mcq-paperT-insight1-Question1": "<solution>B, D</solution>",
		"mcq-paperT-insight1-Question2": "<solution>A</solution>",
		"mcq-paperT-insight2-Question1": "no idea",
		"oeq-paperT-insight1-Question1": "<solution>ADRN-calcium rises</solution>",
		"oeq-paperT-insight2-Question1": "<solution>YAP1</solution>",
	}
	var entries []bench.Entry
	for _, task := range s.Tasks() {
		sc, err := s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Variant, Stage: family.Stage, Outcome: "ok",
			Output: outputs([]byte(finals[task.ID])), Models: sim})
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, bench.Entry{Suite: "hb", Agent: "a", TaskID: task.ID, Run: 1, Status: bench.Validated, Scoring: sc.Scoring, Score: sc.Public})
	}
	other := testConfig()
	other.Judge.Model = "another-judge"
	// Units nothing is scored of yet: an MCQ under another judge's suite
	// default counts on the MCQ boards (no judge there), an OEQ on a
	// board of that judge; an OEQ under this suite's default on this one.
	otherDefault := open(t, sample.MCQFile(), sample.OEQFile(), other).Scoring()
	entries = append(entries,
		bench.Entry{Suite: "hb", Agent: "a", TaskID: "oeq-paperT-insight1-Question1", Run: 2, Status: bench.Pending, Scoring: otherDefault},
		bench.Entry{Suite: "hb", Agent: "a", TaskID: "mcq-paperT-insight1-Question1", Run: 2, Status: bench.Pending, Scoring: otherDefault},
		bench.Entry{Suite: "hb", Agent: "a", TaskID: "oeq-paperT-insight2-Question1", Run: 2, Status: bench.Pending})
	boards, err := s.Boards(entries)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range boards {
		fb := b.(family.Board)
		got = append(got, fb.Kind+" "+fb.Grader)
		r := fb.Rows[0]
		switch {
		case fb.Grader == string(heureka.MCQPublished):
			// Q1 {B, " D"} vs {B,D}: tp 1 fp 1 fn 1; Q2 exact; Q3 none,
			// counted in the accuracy only, as the published code does.
			if r.MCQ.Questions != 3 || r.MCQ.Correct != 1 || r.Pending != 1 || fb.Judge != nil || !near(r.MCQ.Accuracy, 1.0/3) || !near(r.MCQ.MacroPrecision, (0.5+1)/2) ||
				!near(r.MCQ.MicroPrecision, 2.0/3) || !near(r.MCQ.MicroRecall, 2.0/3) || fb.Origin != heureka.OriginPublished {
				t.Errorf("published: %+v (%s)", r.MCQ, fb.Origin)
			}
			if rel := r.Reliability; rel == nil || rel.Pass != family.MCQPassRule || rel.Runs != 3 || !near(rel.PassAtK[0].Value, 1.0/3) {
				t.Errorf("published: reliability %+v", rel)
			}
		case fb.Grader == string(heureka.MCQTrimmed):
			if r.MCQ.Correct != 2 || !near(r.MCQ.Accuracy, 2.0/3) || !near(r.MCQ.MicroPrecision, 1) || !near(r.MCQ.MicroRecall, 3.0/4) ||
				r.MCQ.Answered != 2 || fb.Origin != heureka.OriginRepronet {
				t.Errorf("trimmed: %+v (%s)", r.MCQ, fb.Origin)
			}
			if rel := r.Reliability; rel == nil || rel.Runs != 3 || !near(rel.PassAtK[0].Value, 2.0/3) {
				t.Errorf("trimmed: reliability %+v", rel)
			}
		case fb.Judge != nil && fb.Judge.Model == "another-judge":
			if r.Units != 1 || r.Pending != 1 || r.Validated != 0 {
				t.Errorf("another judge's board: %+v", r)
			}
		case fb.Grader == string(heureka.OEQPublished):
			if r.Pending != 1 || r.Units != 3 {
				t.Errorf("oeq published: units %d, pending %d", r.Units, r.Pending)
			}
			if !near(r.OEQ.Mean, (sample.WeightedRating()+2)/2) || r.OEQ.Mode != "mixed" || r.OEQ.Weighted != 1 || r.OEQ.Plain != 1 ||
				r.Judge == nil || r.Judge.Calls != 2 {
				t.Errorf("oeq published: %+v %+v", r.OEQ, r.Judge)
			}
			if rel := r.Reliability; rel == nil || rel.Pass != family.OEQPassRule || rel.Runs != 2 || rel.PerTask[1].Runs[0].Pass {
				t.Errorf("oeq published: reliability %+v (a rating of 2 passed)", rel)
			}
		}
	}
	want := "mcq heureka-mcq-published@2,mcq heureka-mcq-trimmed@1,oeq heureka-oeq-published@2,oeq heureka-oeq-rating-tokens@1," +
		"oeq heureka-oeq-published@2,oeq heureka-oeq-rating-tokens@1"
	if strings.Join(got, ",") != want {
		t.Errorf("boards %s, want %s", strings.Join(got, ","), want)
	}
	bs := make([]family.Board, 0, len(boards))
	for _, b := range boards {
		bs = append(bs, b.(family.Board))
	}
	var text strings.Builder
	if err := family.WriteText(&text, bs); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"accuracy", "33.3%", "66.7%", "mixed (1 weighted, 1 plain, 0 unanswered)", "judge heureka-judge (temperature 0"} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("text boards lack %q:\n%s", w, text.String())
		}
	}
	if _, err := s.Boards([]bench.Entry{{Agent: "a", TaskID: "mcq-nope", Status: bench.Pending}}); err == nil {
		t.Error("an entry of no question: no error")
	}
}
