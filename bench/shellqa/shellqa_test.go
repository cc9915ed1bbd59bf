package shellqa

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
	"google.golang.org/protobuf/encoding/prototext"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
)

// The test suite's gold answers are distinctive strings, so that finding
// one anywhere in a recipe's bytes means it leaked.
const testTasks = `[
  {"id": "errors", "question": "How many lines of logs/app.log say ERROR?", "hint": "Use grep -c.",
   "content": ["logs"], "answer": "GOLD-EXACT-4711", "match": "exact"},
  {"id": "mean", "question": "What is the mean latency in logs/app.log and metrics/lat.txt?", "hint": "Field 3.",
   "content": ["logs", "metrics"], "answer": "271828.18", "match": "number", "tolerance": 0.001},
  {"id": "zero", "question": "How many lines say PANIC?", "hint": "None do.",
   "content": ["logs"], "answer": "0", "match": "number"}
]`

func openTest(t *testing.T) *Suite {
	t.Helper()
	s, err := New().Open(Def("qa", []byte(testTasks)))
	if err != nil {
		t.Fatal(err)
	}
	return s.(*Suite)
}

func testCID(t *testing.T, data string) cid.Cid {
	t.Helper()
	h, err := multihash.Sum([]byte(data), multihash.SHA2_256, -1)
	if err != nil {
		t.Fatal(err)
	}
	return cid.NewCidV1(cid.Raw, h)
}

func TestOpen(t *testing.T) {
	s := openTest(t)
	var ids []string
	for _, task := range s.Tasks() {
		ids = append(ids, task.ID+":"+strings.Join(task.Content, ","))
	}
	if got := strings.Join(ids, " "); got != "errors:logs mean:logs,metrics zero:logs" {
		t.Errorf("tasks %s", got)
	}
	if s.Scorer() != "shellqa@1" || string(s.Scoring()) != `{"scorer":"shellqa","version":1}` {
		t.Errorf("scorer %s, scoring %s", s.Scorer(), s.Scoring())
	}
	if err := bench.ValidatePipeline(s.Pipeline(s.Tasks()[0], Plain)); err != nil {
		t.Error(err)
	}
	for _, cfg := range []string{"", "null", "{}"} {
		if _, err := New().Open(bench.SuiteDef{Name: "qa", Family: Name, Config: json.RawMessage(cfg), Tasks: []byte(testTasks)}); err != nil {
			t.Errorf("config %q: %v", cfg, err)
		}
	}
	if _, err := New().Open(bench.SuiteDef{Name: "qa", Family: Name, Config: json.RawMessage(`{"grader": "x"}`), Tasks: []byte(testTasks)}); err == nil ||
		!strings.Contains(err.Error(), "config") {
		t.Errorf("a config was taken: %v", err)
	}
	// Registered beside another family, it is opened by name.
	r, err := bench.NewRegistry(New())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Open(Def("qa", []byte(`[]`))); err == nil || !strings.Contains(err.Error(), `suite "qa" (shellqa)`) {
		t.Errorf("a bad suite opened through the registry: %v", err)
	}
}

func TestRecipe(t *testing.T) {
	s := openTest(t)
	image, logs, metrics := testCID(t, "image"), testCID(t, "logs.tar.gz"), testCID(t, "metrics.tar.gz")
	limits := &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, WallSeconds: 60}
	content := map[string]cid.Cid{"logs": logs, "metrics": metrics}
	for _, task := range s.Tasks() {
		for _, variant := range s.Variants() {
			name := task.ID + "/" + variant
			r, err := s.Recipe(bench.RecipeInput{Task: task, Variant: variant, Stage: Stage, Image: image, Content: content,
				Env: []string{"MODEL=none"}, Limits: limits})
			if err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			if err := recipe.Validate(r); err != nil {
				t.Errorf("%s: %v", name, err)
			}
			// The gold answer is nowhere in the recipe, in any encoding.
			gold := s.tasks[task.ID].Answer
			wire, _ := gproto.Marshal(r)
			if gold != "0" && (bytes.Contains(wire, []byte(gold)) || strings.Contains(prototext.Format(r), gold)) {
				t.Errorf("%s: the gold answer %q is in the recipe:\n%s", name, gold, prototext.Format(r))
			}
			// Each content tarball is extracted into the folder of its name.
			var placed []string
			for _, in := range r.GetInputs() {
				c, _ := cid.Cast(in.GetCid())
				if !in.GetExtract() || in.GetTop() != "" || content[in.GetPath()] != c {
					t.Errorf("%s: input %v", name, in)
				}
				placed = append(placed, in.GetPath())
			}
			if strings.Join(placed, ",") != strings.Join(task.Content, ",") {
				t.Errorf("%s: placed %v, want %v", name, placed, task.Content)
			}
			// The question is written; the hint only in the hinted variant.
			edits := r.GetEdits()
			if len(edits) != 1 || edits[0].GetWrite().GetPath() != QuestionFile {
				t.Fatalf("%s: edits %v", name, edits)
			}
			q := string(edits[0].GetWrite().GetContent())
			hint := "Hint: " + s.tasks[task.ID].Hint
			if !strings.HasPrefix(q, s.tasks[task.ID].Question+"\n") || strings.Contains(q, hint) != (variant == Hinted) {
				t.Errorf("%s: question file %q", name, q)
			}
			// The agent's own entrypoint runs in the workspace; the answer
			// comes back, bounded.
			if r.GetEntrypointSet() || len(r.GetArgs()) != 0 || r.GetCwd() != Workspace || len(r.GetMounts()) != 1 ||
				r.GetMounts()[0].GetTarget() != Workspace || r.GetMounts()[0].GetSource() != "" {
				t.Errorf("%s: runs %v %v in %s with mounts %v", name, r.GetEntrypoint(), r.GetArgs(), r.GetCwd(), r.GetMounts())
			}
			if o := r.GetOutputs(); len(o) != 1 || o[0].GetPath() != AnswerFile || o[0].GetMaxBytes() != MaxAnswer || o[0].GetDirectory() {
				t.Errorf("%s: outputs %v", name, o)
			}
			if env := strings.Join(r.GetEnv(), " "); env != "QUESTION_FILE=/workspace/question.txt ANSWER_FILE=/workspace/answer.txt MODEL=none" {
				t.Errorf("%s: env %s", name, env)
			}
			if !gproto.Equal(r.GetLimits(), limits) {
				t.Errorf("%s: limits %v", name, r.GetLimits())
			}
		}
	}
	task := s.Tasks()[1]
	for _, tt := range []struct {
		name string
		in   bench.RecipeInput
		want string
	}{
		{"content not imported", bench.RecipeInput{Task: task, Variant: Plain, Stage: Stage, Image: image,
			Content: map[string]cid.Cid{"logs": logs}, Limits: limits}, `content "metrics" not imported`},
		{"unknown variant", bench.RecipeInput{Task: task, Variant: "easy", Stage: Stage, Image: image, Content: content, Limits: limits},
			`no variant "easy"`},
		{"unknown stage", bench.RecipeInput{Task: task, Variant: Plain, Stage: "judge", Image: image, Content: content, Limits: limits},
			`no stage "judge"`},
		{"unknown task", bench.RecipeInput{Task: bench.Task{ID: "nope"}, Variant: Plain, Stage: Stage, Image: image, Content: content,
			Limits: limits}, `no task "nope"`},
	} {
		if _, err := s.Recipe(tt.in); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tt.name, err, tt.want)
		}
	}
}

func TestScore(t *testing.T) {
	s := openTest(t)
	task := func(id string) bench.Task { return bench.Task{ID: id} }
	answer := func(b string) func(context.Context, string) ([]byte, error) {
		return func(_ context.Context, p string) ([]byte, error) {
			if p != AnswerFile {
				return nil, fmt.Errorf("%s: %w: not an output", p, bench.ErrNotReturned)
			}
			return []byte(b), nil
		}
	}
	missing := func(context.Context, string) ([]byte, error) {
		return nil, fmt.Errorf("answer.txt: %w: missing", bench.ErrNotReturned)
	}
	tests := []struct {
		name     string
		task     string
		outcome  string
		output   func(context.Context, string) ([]byte, error)
		correct  bool
		answered bool
		detail   string
	}{
		{"exact", "errors", "ok", answer("GOLD-EXACT-4711"), true, true, ""},
		{"exact, white space around", "errors", "ok", answer("  GOLD-EXACT-4711\r\n"), true, true, ""},
		{"exact, case differs", "errors", "ok", answer("gold-exact-4711"), false, true, "not the answer"},
		{"exact, inner space differs", "errors", "ok", answer("GOLD-EXACT- 4711"), false, true, "not the answer"},
		{"number, equal", "mean", "ok", answer("271828.18\n"), true, true, ""},
		{"number, within the tolerance", "mean", "ok", answer("272000"), true, true, ""},
		{"number, another notation", "mean", "ok", answer("2.7182818e5"), true, true, ""},
		{"number, outside the tolerance", "mean", "ok", answer("272200"), false, true, "not within a relative 0.001"},
		{"number, not a number", "mean", "ok", answer("about 271828"), false, true, "not a decimal number"},
		{"number, NaN", "mean", "ok", answer("NaN"), false, true, "not a decimal number"},
		{"number, zero tolerance, exact zero", "zero", "ok", answer("0.0"), true, true, ""},
		{"number, zero tolerance, near zero", "zero", "ok", answer("1e-300"), false, true, "not within"},
		{"empty answer", "errors", "ok", answer(""), false, true, "not the answer"},
		{"no answer", "errors", "ok", missing, false, false, "no answer: answer.txt: output not returned: missing"},
		{"no answer after a timeout", "mean", "timeout", missing, false, false, "no answer"},
		{"answer at the bound", "errors", "ok", answer(strings.Repeat("x", MaxAnswer)), false, true, "not the answer"},
		{"oversized answer", "errors", "ok", answer("GOLD-EXACT-4711" + strings.Repeat(" ", MaxAnswer)), false, false,
			fmt.Sprintf("answer of %d bytes, over %d", MaxAnswer+15, MaxAnswer)},
		{"an agent error still scores what it wrote", "errors", "agent_error", answer("GOLD-EXACT-4711"), true, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sc, err := s.Score(context.Background(), bench.ScoreInput{Task: task(tt.task), Variant: Plain, Stage: Stage,
				Outcome: tt.outcome, Output: tt.output})
			if err != nil {
				t.Fatalf("scorer error: %v", err)
			}
			want := bench.Grading{Pass: tt.correct, Checks: []bool{tt.correct}}
			if sc.Comparable.Grading == nil || !sc.Comparable.Grading.Equal(want) || len(sc.Comparable.Outputs) != 0 ||
				sc.Comparable.OutputDigest != "" {
				t.Errorf("comparable %+v, want only the grading %+v", sc.Comparable, want)
			}
			if (sc.Value == 1) != tt.correct || sc.Value != 0 && sc.Value != 1 {
				t.Errorf("value %v", sc.Value)
			}
			if string(sc.Scoring) != `{"scorer":"shellqa","version":1}` {
				t.Errorf("scoring %s", sc.Scoring)
			}
			wantPublic := fmt.Sprintf(`{"answered":%t,"correct":%t}`, tt.answered, tt.correct)
			if string(sc.Public) != wantPublic {
				t.Errorf("public %s, want %s", sc.Public, wantPublic)
			}
			var v Verdict
			if err := json.Unmarshal(sc.Verdict, &v); err != nil {
				t.Fatal(err)
			}
			gold := s.tasks[tt.task].Answer
			if v.Correct != tt.correct || v.Gold != gold || v.Outcome != tt.outcome || v.Scoring != currentScoring() ||
				!strings.Contains(v.Detail, tt.detail) || (tt.detail == "") != (v.Detail == "") {
				t.Errorf("verdict %+v, want correct %t, gold %q, detail %q", v, tt.correct, gold, tt.detail)
			}
			// Only the verdict may hold the gold answer.
			for what, b := range map[string][]byte{"public": sc.Public, "scoring": sc.Scoring, "comparable": mustJSON(t, sc.Comparable)} {
				if bytes.Contains(b, []byte(gold)) {
					t.Errorf("%s holds the gold answer: %s", what, b)
				}
			}
		})
	}

	t.Run("scorer trouble is an error", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		read := func(ctx context.Context, _ string) ([]byte, error) { return nil, ctx.Err() }
		if _, err := s.Score(ctx, bench.ScoreInput{Task: task("errors"), Variant: Plain, Stage: Stage, Outcome: "ok", Output: read}); err == nil {
			t.Error("a cancelled read was scored as the agent's")
		}
		if _, err := s.Score(context.Background(), bench.ScoreInput{Task: task("nope"), Variant: Plain, Stage: Stage, Output: missing}); err == nil {
			t.Error("an unknown task was scored")
		}
		if _, err := s.Score(context.Background(), bench.ScoreInput{Task: task("errors"), Variant: Plain, Stage: Stage}); err == nil {
			t.Error("scored without an output reader")
		}
	})
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBoards(t *testing.T) {
	s := openTest(t)
	v1 := s.Scoring()
	v2 := json.RawMessage(`{"scorer": "shellqa", "version": 2}`)
	entry := func(variant, agent, task string, status bench.Status, correct bool, scoring json.RawMessage) bench.Entry {
		e := bench.Entry{Suite: "qa", Variant: variant, Agent: agent, Model: "m-" + agent, TaskID: task, Run: 1, Status: status, Scoring: scoring}
		if status == bench.Validated || status == bench.Unvalidated {
			e.Score = mustJSON(t, Public{Answered: true, Correct: correct})
		}
		return e
	}
	entries := []bench.Entry{
		entry(Hinted, "solver", "errors", bench.Validated, true, v1),
		entry(Plain, "solver", "errors", bench.Validated, true, v1),
		entry(Plain, "solver", "mean", bench.Validated, true, v1),
		entry(Plain, "solver", "zero", bench.Validated, false, v1),
		entry(Plain, "wrong", "errors", bench.Validated, false, v1),
		entry(Plain, "wrong", "mean", bench.Unvalidated, true, v1), // not counted until validated
		entry(Plain, "wrong", "zero", bench.Inconsistent, false, v1),
		entry(Plain, "flaky", "errors", bench.InfraFailed, false, v1),
		entry(Plain, "flaky", "mean", bench.Pending, false, nil), // no scoring yet: the suite's
		entry(Plain, "solver", "errors", bench.Validated, false, v2),
	}
	boards, err := s.Boards(entries)
	if err != nil {
		t.Fatal(err)
	}
	// The reliability measures, checked here, then left out of the
	// comparison below: the solver's validated runs (errors, mean right;
	// zero wrong), the wrong agent's one, the flaky agent's none.
	for _, b := range boards {
		for i, r := range b.(Board).Rows {
			rel := r.Reliability
			switch {
			case rel == nil || rel.Pass != PassRule:
				t.Errorf("%s: reliability %+v", r.Agent, rel)
			case r.Agent == "solver" && b.(Board).Variant == Plain && r.Validated == 3 &&
				(rel.Runs != 3 || len(rel.PerTask) != 3 || math.Abs(rel.PassAtK[0].Value-2.0/3) > 1e-12 || rel.Consistency != nil):
				t.Errorf("solver: reliability %+v", rel)
			case r.Agent == "wrong" && (rel.Runs != 1 || rel.PassAtK[0].Value != 0):
				t.Errorf("wrong: reliability %+v", rel)
			case r.Agent == "flaky" && (rel.Runs != 0 || len(rel.PassAtK) != 0):
				t.Errorf("flaky: reliability %+v", rel)
			}
			b.(Board).Rows[i].Reliability = nil
		}
	}
	got, err := json.Marshal(boards)
	if err != nil {
		t.Fatal(err)
	}
	want := `[` +
		`{"family":"shellqa","suite":"qa","variant":"plain","scoring":{"scorer":"shellqa","version":1},"rows":[` +
		`{"agent":"solver","model":"m-solver","units":3,"validated":3,"unvalidated":0,"inconsistent":0,"infra_failed":0,"pending":0,"correct":2,"accuracy":0.6666666666666666},` +
		`{"agent":"flaky","model":"m-flaky","units":2,"validated":0,"unvalidated":0,"inconsistent":0,"infra_failed":1,"pending":1,"correct":0,"accuracy":0},` +
		`{"agent":"wrong","model":"m-wrong","units":3,"validated":1,"unvalidated":1,"inconsistent":1,"infra_failed":0,"pending":0,"correct":0,"accuracy":0}]},` +
		`{"family":"shellqa","suite":"qa","variant":"plain","scoring":{"scorer":"shellqa","version":2},"rows":[` +
		`{"agent":"solver","model":"m-solver","units":1,"validated":1,"unvalidated":0,"inconsistent":0,"infra_failed":0,"pending":0,"correct":0,"accuracy":0}]},` +
		`{"family":"shellqa","suite":"qa","variant":"hinted","scoring":{"scorer":"shellqa","version":1},"rows":[` +
		`{"agent":"solver","model":"m-solver","units":1,"validated":1,"unvalidated":0,"inconsistent":0,"infra_failed":0,"pending":0,"correct":1,"accuracy":1}]}]`
	if string(got) != want {
		t.Errorf("boards\n%s\nwant\n%s", got, want)
	}
	if b, err := s.Boards(nil); err != nil || len(b) != 0 {
		t.Errorf("no entries: %v %v", b, err)
	}

	for _, tt := range []struct {
		name string
		e    bench.Entry
		want string
	}{
		{"unknown variant", entry("easy", "a", "errors", bench.Validated, true, v1), `no variant "easy"`},
		{"unknown status", entry(Plain, "a", "errors", "lost", true, v1), `unknown status "lost"`},
		{"score not JSON", func() bench.Entry {
			e := entry(Plain, "a", "errors", bench.Validated, true, v1)
			e.Score = json.RawMessage(`{`)
			return e
		}(), "entry qa/plain/a/errors run 1: score"},
		{"scoring not JSON", entry(Plain, "a", "errors", bench.Pending, false, json.RawMessage(`{`)), "scoring"},
	} {
		if _, err := s.Boards([]bench.Entry{tt.e}); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want an error mentioning %q", tt.name, err, tt.want)
		}
	}
}
