package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/heureka"
)

// TestGradeTestSplit grades a gold run of the encrypted test split through
// the CLI, decrypting in-process, and a wrong report for the same task.
func TestGradeTestSplit(t *testing.T) {
	gpg := filepath.Join("..", "..", "..", "shared", "corebench", "core_test.json.gpg")
	data, err := os.ReadFile(gpg)
	if err != nil {
		t.Fatalf("the test split must be beside the repo: %v", err)
	}
	tasks, err := corebench.LoadTasks(data, corebench.LoadOptions{Passphrase: []byte("reproducibility")})
	if err != nil {
		t.Fatal(err)
	}
	task := tasks[0]
	gold, err := json.Marshal(task.Results[0])
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	goodPath, wrongPath := filepath.Join(dir, "good.json"), filepath.Join(dir, "wrong.json")
	os.WriteFile(goodPath, gold, 0o644)
	os.WriteFile(wrongPath, []byte(`{}`), 0o644)

	for _, tt := range []struct {
		report string
		want   bool
	}{{goodPath, true}, {wrongPath, false}} {
		var out, errb bytes.Buffer
		args := []string{"grade", "--tasks", gpg, "--passphrase", "reproducibility", "--capsule", task.CapsuleID, "--report", tt.report}
		if code := run(context.Background(), args, &out, &errb); code != 0 {
			t.Fatalf("grade %s exited %d: %s", tt.report, code, errb.String())
		}
		var v struct {
			TaskCorrect           bool   `json:"task_correct"`
			TotalWrittenQuestions *int   `json:"total_written_questions"`
			Grader                string `json:"grader"`
		}
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Fatalf("verdict is not JSON: %v\n%s", err, out.String())
		}
		if v.TaskCorrect != tt.want || v.TotalWrittenQuestions == nil || v.Grader != corebench.OriginalGraderName {
			t.Fatalf("grade %s: %s", tt.report, out.String())
		}
	}

	var out, errb bytes.Buffer
	args := []string{"grade", "--tasks", gpg, "--passphrase", "wrong", "--capsule", task.CapsuleID, "--report", goodPath}
	if code := run(context.Background(), args, &out, &errb); code == 0 || !strings.Contains(errb.String(), "core_test.json.gpg") {
		t.Fatalf("wrong passphrase: exit %d, stderr %q", code, errb.String())
	}
}

// gradeRubric is a small rubric: root (a weight 3; n weight 1: b, c).
const gradeRubric = `{"id":"root","requirements":"all","weight":1,"task_category":null,"finegrained_task_category":null,"sub_tasks":[
 {"id":"a","requirements":"code","weight":3,"sub_tasks":[],"task_category":"Code Development","finegrained_task_category":"Data Processing & Preparation"},
 {"id":"n","requirements":"runs","weight":1,"task_category":null,"finegrained_task_category":null,"sub_tasks":[
  {"id":"b","requirements":"run b","weight":1,"sub_tasks":[],"task_category":"Code Execution","finegrained_task_category":"Data Processing & Preparation"},
  {"id":"c","requirements":"result c","weight":1,"sub_tasks":[],"task_category":"Result Analysis","finegrained_task_category":"Data Processing & Preparation"}]}]}`

// TestGradePaperBench re-grades a rubric from leaf grades in each shape
// through the CLI: a=1, b=1, c failed. Report-failed leaves c out: n = 1,
// root (3+1)/4 = 1; silent-zero counts it 0: n = 1/2, root 3.5/4.
func TestGradePaperBench(t *testing.T) {
	dir := t.TempDir()
	rubric := filepath.Join(dir, "rubric.json")
	os.WriteFile(rubric, []byte(gradeRubric), 0o644)
	shapes := map[string]string{
		"verdict": `{"grading":[{"id":"a","score":1},{"id":"b","score":1},{"id":"c","score":0,"failed":true,"reason":"judge refused"}]}`,
		"map":     `{"a":1,"b":1,"c":{"failed":true,"reason":"judge refused"}}`,
		"original graded tree": `{"id":"root","score":0.875,"valid_score":true,"sub_tasks":[{"id":"a","score":1,"valid_score":true,"sub_tasks":[]},
			{"id":"n","sub_tasks":[{"id":"b","score":1,"valid_score":true,"sub_tasks":[]},{"id":"c","score":0,"valid_score":false,"sub_tasks":[]}]}]}`,
	}
	for name, grades := range shapes {
		path := filepath.Join(dir, "grades.json")
		os.WriteFile(path, []byte(grades), 0o644)
		var out, errb bytes.Buffer
		if code := run(context.Background(), []string{"grade", "paperbench", "--rubric", rubric, "--grades", path}, &out, &errb); code != 0 {
			t.Fatalf("%s: exited %d: %s", name, code, errb.String())
		}
		var got []struct {
			Grader string
			Score  float64
			Valid  bool
			Leaves int
			Failed []struct{ ID string }
		}
		if err := json.Unmarshal(out.Bytes(), &got); err != nil || len(got) != 2 {
			t.Fatalf("%s: %v\n%s", name, err, out.String())
		}
		want := map[string]float64{"paperbench-report-failed@1": 1, "paperbench-silent-zero@1": 3.5 / 4}
		for _, g := range got {
			if w, ok := want[g.Grader]; !ok || g.Score != w || !g.Valid || g.Leaves != 3 || len(g.Failed) != 1 || g.Failed[0].ID != "c" {
				t.Errorf("%s: %+v, want score %v", name, g, want[g.Grader])
			}
		}
	}
	// Code-Dev: only leaf a: 1 under both.
	path := filepath.Join(dir, "codedev.json")
	os.WriteFile(path, []byte(`{"a":1}`), 0o644)
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"grade", "paperbench", "--rubric", rubric, "--grades", path, "--code-dev", "--grader", "paperbench-silent-zero@1"}, &out, &errb); code != 0 {
		t.Fatalf("code-dev: exited %d: %s", code, errb.String())
	}
	if !strings.Contains(out.String(), `"score": 1,`) || strings.Contains(out.String(), "report-failed") {
		t.Errorf("code-dev: %s", out.String())
	}
	// A grade for a leaf the rubric lacks is refused, naming it.
	os.WriteFile(path, []byte(`{"a":1,"b":1,"c":0,"z":1}`), 0o644)
	out.Reset()
	errb.Reset()
	if code := run(context.Background(), []string{"grade", "paperbench", "--rubric", rubric, "--grades", path}, &out, &errb); code == 0 || !strings.Contains(errb.String(), `"z"`) {
		t.Errorf("an extra leaf: exit %d, %s", code, errb.String())
	}
}

// TestGradeHeureka re-grades the real MCQ file from extracted answers and
// from final messages, and the real OEQ file from judge answers, through
// the CLI; the figures are checked against hand counts.
func TestGradeHeureka(t *testing.T) {
	shared := filepath.Join("..", "..", "..", "shared", "heurekabench")
	mcqData, err := os.ReadFile(filepath.Join(shared, "mcq.json"))
	if err != nil {
		t.Fatalf("the real question files are required beside the repository: %v", err)
	}
	qs, err := heureka.ParseMCQFile(mcqData)
	if err != nil {
		t.Fatal(err)
	}
	// The first question answered right, the second right with a space
	// ("B, D" style when it has two letters) or wrong, the rest unanswered.
	answers := map[string]map[string]map[string]string{}
	finals := map[string]map[string]map[string]string{}
	put := func(m map[string]map[string]map[string]string, id heureka.QuestionID, s string) {
		if m[id.Paper] == nil {
			m[id.Paper] = map[string]map[string]string{}
		}
		if m[id.Paper][id.Insight] == nil {
			m[id.Paper][id.Insight] = map[string]string{}
		}
		m[id.Paper][id.Insight][id.Question] = s
	}
	put(answers, qs[0].ID, qs[0].GoldRaw)
	put(finals, qs[0].ID, "Done.\n<solution>"+qs[0].GoldRaw+"</solution>")
	wrong := "A"
	if strings.Contains(qs[1].GoldRaw, "A") {
		wrong = "D"
		if strings.Contains(qs[1].GoldRaw, "D") {
			wrong = "C"
		}
	}
	put(answers, qs[1].ID, wrong)
	put(finals, qs[1].ID, "<solution>"+wrong+"</solution>")
	dir := t.TempDir()
	grade := func(args ...string) []map[string]any {
		t.Helper()
		var out, errb bytes.Buffer
		if code := run(context.Background(), append([]string{"grade", "heureka"}, args...), &out, &errb); code != 0 {
			t.Fatalf("grade heureka %v: exited %d: %s", args, code, errb.String())
		}
		var got []map[string]any
		if err := json.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("%v\n%s", err, out.String())
		}
		return got
	}
	for name, m := range map[string]map[string]map[string]map[string]string{"--answers": answers, "--finals": finals} {
		b, _ := json.Marshal(m)
		path := filepath.Join(dir, "in.json")
		os.WriteFile(path, b, 0o644)
		got := grade("--questions", filepath.Join(shared, "mcq.json"), name, path)
		if len(got) != 2 {
			t.Fatalf("%s: %v", name, got)
		}
		for _, g := range got {
			m := g["metrics"].(map[string]any)
			// One of len(qs) right; two answered. Published: macro
			// precision over the two answered = (1 + 0)/2; trimmed: over
			// every question = 1/len(qs).
			wantP := 0.5
			if g["grader"] == string(heureka.MCQTrimmed) {
				wantP = 1 / float64(len(qs))
			}
			if m["correct"] != 1.0 || m["answered"] != 2.0 || m["questions"] != float64(len(qs)) || math.Abs(m["macro_precision"].(float64)-wantP) > 1e-12 {
				t.Errorf("%s %s: %v, want macro precision %v", name, g["grader"], m, wantP)
			}
			if g["origin"] != heureka.Origin(g["grader"].(string)) {
				t.Errorf("%s: origin %v", g["grader"], g["origin"])
			}
		}
	}
	// OEQ: two judge answers (a weighted 4/2 and a plain 5), the rest
	// unanswered: published mean (3 + 5)/2, rating-tokens (3 + 5 + 1*(n-2))/n.
	oqs, err := heureka.ParseOEQFile(mustRead(t, filepath.Join(shared, "oeq.json")))
	if err != nil {
		t.Fatal(err)
	}
	judge := map[string]map[string]map[string]any{}
	putJ := func(id heureka.QuestionID, v any) {
		if judge[id.Paper] == nil {
			judge[id.Paper] = map[string]map[string]any{}
		}
		if judge[id.Paper][id.Insight] == nil {
			judge[id.Paper][id.Insight] = map[string]any{}
		}
		judge[id.Paper][id.Insight][id.Question] = v
	}
	putJ(oqs[0].ID, map[string]any{"choices": []any{map[string]any{"message": map[string]any{"content": "<rating>4</rating>"},
		"logprobs": map[string]any{"content": []any{map[string]any{"token": "<rating>", "logprob": 0, "top_logprobs": []any{}},
			map[string]any{"token": "4", "logprob": -0.69, "top_logprobs": []any{map[string]any{"token": "4", "logprob": math.Log(.5)}, map[string]any{"token": "2", "logprob": math.Log(.5)}}}}}}}})
	putJ(oqs[1].ID, "<rating>5</rating>")
	b, _ := json.Marshal(judge)
	path := filepath.Join(dir, "judge.json")
	os.WriteFile(path, b, 0o644)
	got := grade("--questions", filepath.Join(shared, "oeq.json"), "--judge", path, "--per-question")
	n := float64(len(oqs))
	want := map[string]float64{string(heureka.OEQPublished): 4, string(heureka.OEQRatingTokens): (3 + 5 + (n - 2)) / n}
	for _, g := range got {
		s := g["summary"].(map[string]any)
		if w, ok := want[g["scorer"].(string)]; !ok || math.Abs(s["mean"].(float64)-w) > 1e-9 || len(g["scores"].([]any)) != len(oqs) {
			t.Errorf("%v: %v, want mean %v", g["scorer"], s, w)
		}
	}
	// Both --answers and --judge: refused.
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"grade", "heureka", "--questions", "x", "--answers", "a", "--judge", "j"}, &out, &errb); code == 0 {
		t.Error("two inputs accepted")
	}
}

func mustRead(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
