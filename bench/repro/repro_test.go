package repro

import (
	"encoding/json"
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench/corebench"
)

func TestExtract(t *testing.T) {
	files := map[string][]byte{
		"results/summary.txt": []byte("Accuracy: 93.75%\nLoss = 0.25\nmodel: LASSO\n"),
		"results/auc.txt":     []byte("  0.9375660604380387\n"),
		"results/m.json":      []byte(`{"auc": 0.94, "folds": [0.9, 0.95], "name": "LASSO", "a/b": {"~x": "12.5%"}, "n": 7, "flag": true, "bad": NaN}`),
		"results/t.csv":       []byte("model,auc,n\nA,0.91,10\nB, 0.95 ,12\n"),
		"results/big.txt":     make([]byte, MaxFileSize+1),
	}
	tests := []struct {
		rule    Rule
		want    string // JSON of the value
		wantErr string
	}{
		{Rule{File: "results/auc.txt", Kind: KindText, Type: TypeNumber}, `0.9375660604380387`, ""},
		{Rule{File: "results/auc.txt", Kind: KindText}, `"0.9375660604380387"`, ""},
		{Rule{File: "results/summary.txt", Kind: KindRegex, Expr: `Accuracy: ([0-9.]+%)`, Type: TypeNumber}, `93.75`, ""},
		{Rule{File: "results/summary.txt", Kind: KindRegex, Expr: `Loss = (\S+)`, Type: TypeNumber}, `0.25`, ""},
		{Rule{File: "results/summary.txt", Kind: KindRegex, Expr: `model: \w+`}, `"model: LASSO"`, ""},
		{Rule{File: "results/summary.txt", Kind: KindRegex, Expr: `F1: (\S+)`}, "", "no match"},
		{Rule{File: "results/summary.txt", Kind: KindRegex, Expr: `model: (\w+)`, Type: TypeNumber}, "", `"LASSO" is not a number`},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/auc"}, `0.94`, ""},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/folds/1", Type: TypeNumber}, `0.95`, ""},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/folds"}, `[0.9,0.95]`, ""},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/a~1b/~0x", Type: TypeNumber}, `12.5`, ""},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/n", Type: TypeNumber}, `7`, ""},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/name", Type: TypeString}, `"LASSO"`, ""},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/auc", Type: TypeString}, "", "want a string"},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/flag"}, "", "a JSON bool"},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/bad"}, "", "not a finite number"},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/folds/2"}, "", "no index"},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/folds/01"}, "", "no index"},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/nope"}, "", `no key "nope"`},
		{Rule{File: "results/m.json", Kind: KindJSON, Expr: "/auc/x"}, "", "goes into a JSON number"},
		{Rule{File: "results/t.csv", Kind: KindCSV, Expr: "auc@2", Type: TypeNumber}, `0.95`, ""},
		{Rule{File: "results/t.csv", Kind: KindCSV, Expr: "auc@-2", Type: TypeNumber}, `0.91`, ""},
		{Rule{File: "results/t.csv", Kind: KindCSV, Expr: "#1@1"}, `"A"`, ""},
		{Rule{File: "results/t.csv", Kind: KindCSV, Expr: "n@1", Type: TypeNumber}, `10`, ""},
		{Rule{File: "results/t.csv", Kind: KindCSV, Expr: "f1@1"}, "", `no column "f1"`},
		{Rule{File: "results/t.csv", Kind: KindCSV, Expr: "auc@3"}, "", "no data row 3"},
		{Rule{File: "results/missing.txt", Kind: KindText}, "", "file results/missing.txt: missing"},
		{Rule{File: "results/big.txt", Kind: KindText}, "", "over the"},
	}
	for _, tt := range tests {
		tt.rule.Question = "q"
		v, err := Extract(tt.rule, files)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%+v: error %v, want %q", tt.rule, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%+v: %v", tt.rule, err)
			continue
		}
		if got, _ := json.Marshal(v); string(got) != tt.want {
			t.Errorf("%+v: %s, want %s", tt.rule, got, tt.want)
		}
	}
}

func TestRuleValidate(t *testing.T) {
	for _, tt := range []struct {
		rule Rule
		want string
	}{
		{Rule{File: "a", Kind: KindText}, "field question"},
		{Rule{Question: "q", File: "../a", Kind: KindText}, "field file"},
		{Rule{Question: "q", File: "/etc/passwd", Kind: KindText}, "field file"},
		{Rule{Question: "q", File: "a", Kind: "xpath"}, "field kind"},
		{Rule{Question: "q", File: "a", Kind: KindText, Type: "int"}, "field type"},
		{Rule{Question: "q", File: "a", Kind: KindText, Expr: "x"}, "field expr"},
		{Rule{Question: "q", File: "a", Kind: KindRegex, Expr: "("}, "field expr"},
		{Rule{Question: "q", File: "a", Kind: KindJSON, Expr: "auc"}, "JSON Pointer"},
		{Rule{Question: "q", File: "a", Kind: KindCSV, Expr: "auc"}, "COLUMN@ROW"},
		{Rule{Question: "q", File: "a", Kind: KindCSV, Expr: "auc@0"}, "non-zero"},
	} {
		if err := tt.rule.Validate(); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v: %v, want %q", tt.rule, err, tt.want)
		}
	}
	r := Rule{Question: "q", File: "a", Kind: KindText}
	if err := ValidateRules([]Rule{r, r}); err == nil || !strings.Contains(err.Error(), "appears twice") {
		t.Errorf("duplicate question: %v", err)
	}
}

func spec(runs int, rules ...Rule) Spec {
	return Spec{Capsule: Capsule{Field: "F", Language: "Python", CapsuleTitle: "T", CapsuleID: "capsule-1234567", CapsuleDOI: "d",
		TaskPrompt: "Run main.py."}, Rules: rules, Runs: runs}
}

var (
	ruleAUC   = Rule{Question: "Report the AUC.", File: "results/m.json", Kind: KindJSON, Expr: "/auc", Type: TypeNumber}
	ruleN     = Rule{Question: "Report the count.", File: "results/m.json", Kind: KindJSON, Expr: "/n", Type: TypeNumber}
	ruleModel = Rule{Question: "fig Report the model.", File: "results/log.txt", Kind: KindRegex, Expr: `model: (\w+)`}
)

func run(node, auc, n, model string) Run {
	files := map[string][]byte{"results/m.json": []byte(`{"auc": ` + auc + `, "n": ` + n + `}`)}
	if model != "" {
		files["results/log.txt"] = []byte("model: " + model)
	}
	return Run{Node: node, Outcome: "ok", Files: files}
}

func TestCheck(t *testing.T) {
	three := []Run{run("a", "0.9375", "6", "LASSO"), run("b", "0.9372", "6", "LASSO"), run("c", "0.9319", "6", "LASSO")}
	claimedIn := run("", "0.935", "6", "LASSO").Files
	claimedOut := run("", "0.96", "6", "lasso").Files
	tests := []struct {
		name          string
		spec          Spec
		runs          []Run
		claimed       map[string][]byte
		notReproduced []string
		inEntry       []string
		reproducible  bool
		wantErr       string
	}{
		{name: "all reproduce, no claims", spec: spec(3, ruleAUC, ruleN, ruleModel), runs: three,
			notReproduced: []string{}, inEntry: []string{ruleAUC.Question, ruleN.Question, ruleModel.Question}, reproducible: true},
		{name: "claims inside the interval", spec: spec(3, ruleAUC, ruleN, ruleModel), runs: three, claimed: claimedIn,
			notReproduced: []string{}, inEntry: []string{ruleAUC.Question, ruleN.Question, ruleModel.Question}, reproducible: true},
		{name: "claims outside (case does not matter, as in CORE-Bench)", spec: spec(3, ruleAUC, ruleN, ruleModel), runs: three, claimed: claimedOut,
			notReproduced: []string{ruleAUC.Question}, inEntry: []string{ruleAUC.Question, ruleN.Question, ruleModel.Question}},
		{name: "claimed file lacks an answer", spec: spec(3, ruleAUC, ruleModel), runs: three, claimed: run("", "0.935", "6", "").Files,
			notReproduced: []string{ruleModel.Question}, inEntry: []string{ruleAUC.Question, ruleModel.Question}},
		{name: "a run lacks a file", spec: spec(3, ruleAUC, ruleModel), runs: []Run{three[0], three[1], run("c", "0.93", "6", "")},
			notReproduced: []string{ruleModel.Question}, inEntry: []string{ruleAUC.Question}},
		{name: "strings differ", spec: spec(3, ruleAUC, ruleModel), runs: []Run{three[0], three[1], run("c", "0.93", "6", "Ridge")},
			notReproduced: []string{ruleModel.Question}, inEntry: []string{ruleAUC.Question}},
		{name: "kinds differ", spec: spec(3, Rule{Question: "q", File: "results/m.json", Kind: KindJSON, Expr: "/auc"}),
			runs:          []Run{three[0], {Node: "b", Outcome: "ok", Files: map[string][]byte{"results/m.json": []byte(`{"auc": "x"}`)}}},
			notReproduced: []string{"q"}, inEntry: nil},
		{name: "a failed run", spec: spec(3, ruleAUC), runs: []Run{three[0], three[1], {Node: "c", Outcome: "timeout"}},
			notReproduced: []string{}, inEntry: []string{ruleAUC.Question}},
		{name: "too wide", spec: func() Spec { s := spec(3, ruleAUC, ruleN); s.MaxRelativeWidth = 0.01; return s }(), runs: three,
			notReproduced: []string{ruleAUC.Question}, inEntry: []string{ruleAUC.Question, ruleN.Question}},
		{name: "one successful run", spec: spec(3, ruleAUC), runs: []Run{three[0], {Node: "b", Outcome: "oom"}}, wantErr: "1 successful runs of 2"},
		{name: "bad spec", spec: spec(1, ruleAUC), runs: three, wantErr: "field runs"},
		{name: "bad capsule", spec: func() Spec { s := spec(3, ruleAUC); s.Capsule.CapsuleID = "../x"; return s }(), runs: three, wantErr: "want the capsule's folder name"},
		// No rules: a draft check (TestDraftCheck), which needs 2 runs too.
		{name: "no rules, one successful run", spec: spec(3), runs: []Run{three[0], {Node: "b", Outcome: "oom"}}, wantErr: "at least 2"},
	}
	for _, tt := range tests {
		rep, err := Check(tt.spec, tt.runs, tt.claimed)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("%s: error %v, want %q", tt.name, err, tt.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tt.name, err)
			continue
		}
		if !reflect.DeepEqual(rep.NotReproduced, tt.notReproduced) || rep.Reproducible != tt.reproducible {
			t.Errorf("%s: not reproduced %q reproducible %v, want %q %v\n%+v", tt.name, rep.NotReproduced, rep.Reproducible, tt.notReproduced, tt.reproducible, rep.Questions)
		}
		if got := rep.Task.Questions(); len(got)+len(tt.inEntry) > 0 && !reflect.DeepEqual(got, tt.inEntry) {
			t.Errorf("%s: entry questions %q, want %q", tt.name, got, tt.inEntry)
		}
		// The entry is a CORE-Bench task: it survives the task file
		// parser, and each of its runs graded as a report passes.
		data, err := json.Marshal([]corebench.Task{rep.Task})
		if err != nil {
			t.Fatal(err)
		}
		tasks, err := corebench.ParseTasks(data)
		if err != nil {
			t.Errorf("%s: entry does not parse: %v\n%s", tt.name, err, data)
			continue
		}
		for r, gold := range tasks[0].Results {
			report, _ := json.Marshal(gold)
			if v, _ := corebench.NewOriginal().Grade(tasks[0], report); !v.TaskCorrect {
				t.Errorf("%s: run %d of the entry fails its own grading", tt.name, r)
			}
		}
	}
	rep, _ := Check(spec(3, ruleAUC, ruleN), three, claimedIn)
	iv := rep.Questions[0].Interval
	want := corebench.PredictionInterval([]float64{0.9375, 0.9372, 0.9319})
	if iv == nil || iv.Lower != want.Lower || iv.Upper != want.Upper || iv.N != 3 {
		t.Errorf("interval %+v, want %+v", iv, want)
	}
	if q := rep.Questions[1]; q.Interval.Lower != 6 || q.Interval.Upper != 6 || q.Reason != "the same number in every run; the submitted answer passes CORE-Bench's grading against the runs" {
		t.Errorf("count: %+v", q)
	}
}

// TestRealTrainAsRuns treats each real train task's three gold runs as
// three runs of its capsule, with its answers in a JSON file and one JSON
// Pointer rule per question: the entry Check builds must equal the task,
// and run 1's file as the submitted answers must reproduce every question.
func TestRealTrainAsRuns(t *testing.T) {
	data, err := os.ReadFile("../../../shared/corebench/core_train.json")
	if err != nil {
		t.Fatalf("the real CORE-Bench train split is required: %v", err)
	}
	tasks, err := corebench.ParseTasks(data)
	if err != nil {
		t.Fatal(err)
	}
	differing := 0
	for _, task := range tasks {
		var rules []Rule
		for _, q := range task.Questions() {
			ptr := "/" + strings.ReplaceAll(strings.ReplaceAll(q, "~", "~0"), "/", "~1")
			rules = append(rules, Rule{Question: q, File: "results/answers.json", Kind: KindJSON, Expr: ptr})
		}
		var runs []Run
		for i, r := range task.Results {
			b, _ := json.Marshal(r)
			runs = append(runs, Run{Node: string(rune('a' + i)), Outcome: "ok", Files: map[string][]byte{"results/answers.json": b}})
		}
		s := Spec{Capsule: Capsule{Field: task.Field, Language: task.Language, CapsuleTitle: task.CapsuleTitle, CapsuleID: task.CapsuleID,
			CapsuleDOI: task.CapsuleDOI, TaskPrompt: task.TaskPrompt}, Rules: rules, Runs: 3}
		rep, err := Check(s, runs, runs[0].Files)
		if err != nil {
			t.Fatalf("%s: %v", task.CapsuleID, err)
		}
		if len(rep.NotReproduced) > 0 {
			// Only string answers that differ between gold runs may fail.
			for _, q := range rep.Questions {
				if !q.Reproduced && !strings.Contains(q.Reason, "run 1 gives") {
					t.Errorf("%s %q: %s", task.CapsuleID, q.Question, q.Reason)
				}
			}
			differing += len(rep.NotReproduced)
			continue
		}
		if !reflect.DeepEqual(rep.Task, task) {
			t.Errorf("%s: the entry differs from the task", task.CapsuleID)
		}
	}
	t.Logf("%d string questions of the train split differ between gold runs", differing)
}

// Values Python's == finds equal are written alike, others not.
func TestCanonical(t *testing.T) {
	parse := func(s string) corebench.Value {
		v, err := corebench.ParseValue([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		a, b  string
		equal bool
	}{
		{`7`, `7.0`, true},
		{`[1, 2.0]`, `[1.0, 2]`, true},
		{`true`, `1`, true},
		{`[true, false]`, `[1, 0.0]`, true},
		{`{"b": 1, "a": [2]}`, `{"a": [2.0], "b": 1.0}`, true},
		{`"7"`, `7`, false},
		{`[1, 2]`, `[2, 1]`, false},
		{`9007199254740993`, `9007199254740992`, false}, // beyond float64's exact integers
		{`0.1`, `0.10000000000000001`, true},            // the same float64
		{`null`, `0`, false},
		{`"a"`, `"A"`, false},
	}
	for _, tt := range tests {
		ca, cb := Canonical(parse(tt.a)), Canonical(parse(tt.b))
		if got := string(ca) == string(cb); got != tt.equal {
			t.Errorf("%s -> %s, %s -> %s: equal %v, want %v", tt.a, ca, tt.b, cb, got, tt.equal)
		}
		if tt.equal != parse(tt.a).Equal(parse(tt.b)) {
			t.Errorf("%s == %s is %v in Python's terms; the table says %v", tt.a, tt.b, !tt.equal, tt.equal)
		}
	}
}

// TestCheckFolderName: any safe folder name is a capsule's, with a
// message for scientists otherwise.
func TestCheckFolderName(t *testing.T) {
	for name, ok := range map[string]bool{
		"capsule-1234567": true, "my-analysis": true, "rnaseq_2024.v2": true, "A": true, strings.Repeat("a", MaxFolderName): true,
		"": false, ".": false, "..": false, "-x": false, ".hidden": false, "a/b": false, "a b": false, "é": false,
		strings.Repeat("a", MaxFolderName+1): false,
	} {
		err := CheckFolderName(name)
		if (err == nil) != ok {
			t.Errorf("%q: %v, want ok %v", name, err, ok)
		}
		if err != nil && !strings.Contains(err.Error(), "folder name") {
			t.Errorf("%q: %v is not written for scientists", name, err)
		}
	}
	// A spec of a capsule named my-analysis validates and checks.
	s := spec(3, ruleAUC)
	s.Capsule.CapsuleID = "my-analysis"
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(s, []Run{run("a", "0.93", "6", "Lasso"), run("b", "0.93", "6", "Lasso"), run("c", "0.93", "6", "Lasso")}, nil)
	if err != nil || rep.Task.CapsuleID != "my-analysis" {
		t.Errorf("check of my-analysis: %+v %v", rep.Task, err)
	}
}
