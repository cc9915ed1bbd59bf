package repro

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
)

// TestFindValues: the values of a file, by kind (text, CSV, JSON), each
// with a rule that reads the same text back from the file; numbers inside
// names and versions are not values; dates and times are one value each.
func TestFindValues(t *testing.T) {
	tests := []struct {
		name, file, data string
		want             []string // text, and "@" for a date or time
	}{
		{"key value lines", "results/summary.txt",
			"median_upstream 42.5\nseed_estimate 3.1412\nfinished_at 2026-11-24T09:14:13Z\n", []string{"42.5", "3.1412", "@2026-11-24T09:14:13Z"}},
		{"names, versions and percentages", "results/log.txt",
			"capsule-0000004 ran with tool v1.2.3 on x2: accuracy: 93.5% (n=200), loss -1.5e-3\n", []string{"93.5%", "200", "-1.5e-3"}},
		{"times of day and several numbers on a line", "results/t.md",
			"fold 3 auc 0.91 at 09:14:13\n\n| a | 7 |\n", []string{"3", "0.91", "@09:14:13", "7"}},
		{"CSV cells", "results/m.csv",
			"model,auc,when,note\nlr,0.91,2026-01-02,ok\nrf,0.93,2026-01-03,12x\n", []string{"0.91", "@2026-01-02", "0.93", "@2026-01-03"}},
		{"CSV without data rows: as text", "results/e.csv", "n,7\n", []string{"7"}},
		{"JSON", "results/m.json",
			`{"metrics": {"auc": 0.91, "a/b": [1, 2e3]}, "at": "2026-11-24 09:14", "name": "x1", "ok": true}`,
			[]string{"0.91", "1", "2e3", "@2026-11-24 09:14"}},
		{"broken JSON: as text", "results/b.json", `{"auc": 0.5`, []string{"0.5"}},
		{"binary", "results/fig.png", "\x89PNG\x00\x01 42", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := findValues(tt.file, []byte(tt.data))
			var texts []string
			for _, f := range got {
				s := f.text
				if f.time {
					s = "@" + s
				}
				texts = append(texts, s)
				// The rule reads the value back.
				f.rule.Question = "q"
				if err := f.rule.Validate(); err != nil {
					t.Fatalf("rule %+v: %v", f.rule, err)
				}
				v, err := Extract(f.rule, map[string][]byte{tt.file: []byte(tt.data)})
				if err != nil {
					t.Fatalf("rule %+v of %q: %v", f.rule, f.text, err)
				}
				if f.time && v.Str != f.text || !f.time && v.Kind != corebench.Number {
					t.Fatalf("rule %+v reads %s, want %q", f.rule, v.Repr(), f.text)
				}
				if n, _ := corebench.PyFloat(strings.TrimSuffix(f.text, "%")); !f.time && n != v.Num {
					t.Fatalf("rule %+v reads %v, want %v", f.rule, v.Num, n)
				}
			}
			if !reflect.DeepEqual(texts, tt.want) {
				t.Fatalf("values %q, want %q", texts, tt.want)
			}
		})
	}
}

// TestFindValuesBounds: a text file's values far into a long line, past
// its last line read, past a CSV's last row read, or past the number of
// values a file gives are not drafted, and the file is said to be
// truncated.
func TestFindValuesBounds(t *testing.T) {
	for _, tt := range []struct {
		file, data string
		want       int
	}{
		{"r.txt", "a 1 " + strings.Repeat("x", MaxLinePrefix) + " 2\n", 1},
		{"r.txt", strings.Repeat("-\n", MaxTextLines) + "v 2\n", 0},
		{"r.csv", "a,b\n" + strings.Repeat("x,y\n", MaxCSVRows) + "1,2\n", 0},
		{"r.txt", strings.Repeat("v 1\n", MaxDraftValues+1), MaxDraftValues},
		{"r.csv", "a\n" + strings.Repeat("1\n", MaxDraftValues+1), MaxDraftValues},
		{"r.json", "[" + strings.Repeat("1,", MaxDraftValues) + "1]", MaxDraftValues},
	} {
		got, cut := findValues(tt.file, []byte(tt.data))
		if len(got) != tt.want || !cut {
			t.Errorf("%s: %d values, truncated %v; want %d, truncated", tt.file, len(got), cut, tt.want)
		}
	}
	_, cut := findValues("r.txt", []byte("a 1\n"))
	if cut {
		t.Error("a short file truncated")
	}
}

// TestFindValuesDisambiguates: the same label on two lines, and the same
// number twice on a line, are distinct values whose rules read each its
// own.
func TestFindValuesDisambiguates(t *testing.T) {
	data := []byte("x 1 1\nx 2 3\n")
	got, _ := findValues("r.txt", data)
	if len(got) != 4 {
		t.Fatalf("%d values", len(got))
	}
	questions := map[string]bool{}
	for i, f := range got {
		f.rule.Question = "q"
		v, err := Extract(f.rule, map[string][]byte{"r.txt": data})
		want := []float64{1, 1, 2, 3}[i]
		if err != nil || v.Num != want {
			t.Fatalf("value %d: %v %v, want %v", i, v.Num, err, want)
		}
		if questions[f.question] {
			t.Fatalf("question %q twice", f.question)
		}
		questions[f.question] = true
	}
}

func runsOf(file string, contents ...string) []Run {
	var runs []Run
	for i, c := range contents {
		runs = append(runs, Run{Node: fmt.Sprintf("n%d", i+1), Outcome: "ok", Files: map[string][]byte{file: []byte(c)}})
	}
	return runs
}

var draftCapsule = Capsule{Field: "Earth Sciences", Language: "Shell", CapsuleTitle: "t", CapsuleID: "capsule-0000005", TaskPrompt: "Run it."}

// TestDraftVerdicts: each kind of value across three runs gets its
// verdict; kept values are in the entry (stable: one value, varying: the
// runs' values, whose prediction interval the grader computes), flagged
// ones are not.
func TestDraftVerdicts(t *testing.T) {
	tests := []struct {
		name    string
		runs    []string
		verdict string
		kept    bool
	}{
		{"stable number", []string{"v 42.5", "v 42.5", "v 42.5"}, DraftStable, true},
		{"stable integer written alike", []string{"v 30", "v 30", "v 30"}, DraftStable, true},
		{"seeded random estimate", []string{"v 3.1412", "v 3.1528", "v 3.1336"}, DraftInterval, true},
		{"ISO time", []string{"at 2026-11-24T09:14:13Z", "at 2026-11-24T09:14:15Z", "at 2026-11-24T09:14:16Z"}, DraftTimestamp, false},
		{"the same ISO time", []string{"at 2026-11-24", "at 2026-11-24", "at 2026-11-24"}, DraftTimestamp, false},
		{"Unix seconds", []string{"t 1763975653", "t 1763975655", "t 1763975656"}, DraftTimestamp, false},
		{"Unix milliseconds, the same", []string{"t 1763975653123", "t 1763975653123", "t 1763975653123"}, DraftTimestamp, false},
		{"varies wildly", []string{"v 1.5", "v 12", "v 130"}, DraftWild, false},
		{"changes sign", []string{"v 0.01", "v -0.02", "v 0.015"}, DraftWild, false},
		{"around zero", []string{"v 0", "v 0.0", "v 0"}, DraftStable, true},
		{"not in every run", []string{"v 1", "v", "v 1"}, DraftMissing, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, task, err := DraftEntry(draftCapsule, runsOf("results/r.txt", tt.runs...))
			if err != nil {
				t.Fatal(err)
			}
			if len(d.Values) != 1 {
				t.Fatalf("%d values: %+v", len(d.Values), d.Values)
			}
			v := d.Values[0]
			if v.Verdict != tt.verdict || v.Kept() != tt.kept || v.Reason == "" {
				t.Fatalf("verdict %s (%s), want %s", v.Verdict, v.Reason, tt.verdict)
			}
			if err := task.Validate(0); err != nil {
				t.Fatal(err)
			}
			if got := len(task.Results[0]); got != map[bool]int{true: 1, false: 0}[tt.kept] || len(d.Spec.Rules) != got {
				t.Fatalf("%d answers and %d rules in the entry", got, len(d.Spec.Rules))
			}
			if (v.Interval != nil) != (tt.verdict == DraftInterval || tt.verdict == DraftWild) {
				t.Fatalf("interval %+v", v.Interval)
			}
			if tt.verdict == DraftInterval {
				iv := corebench.PredictionInterval([]float64{3.1412, 3.1528, 3.1336})
				if v.Interval.Lower != iv.Lower || v.Interval.Upper != iv.Upper {
					t.Fatalf("interval %+v, want %+v", v.Interval, iv)
				}
				for i, a := range task.Results {
					if a[0].Value.Lit != strings.TrimPrefix(tt.runs[i], "v ") {
						t.Fatalf("run %d answer %s", i+1, a[0].Value.Repr())
					}
				}
			}
		})
	}
}

// TestDraftCheck: a spec without rules is a draft check; Check drafts the
// entry from the runs (a failed run left out, and said), its draft spec
// passes validation and, checked with its rules on the same runs,
// reproduces every kept value.
func TestDraftCheck(t *testing.T) {
	spec := Spec{Capsule: draftCapsule, Runs: 4}
	if err := spec.Validate(); err != nil || !spec.Draft() {
		t.Fatalf("a spec without rules: %v", err)
	}
	files := func(est, at string) map[string][]byte {
		return map[string][]byte{
			"results/summary.txt": []byte("median 42.5\nestimate " + est + "\nfinished_at " + at + "\n"),
			"results/table.csv":   []byte("gauge,n\nup,30\n"),
			"results/fig.png":     []byte("\x89PNG\x00"),
		}
	}
	runs := []Run{{Node: "a", Outcome: "ok", Files: files("3.1412", "2026-11-24T09:14:13Z")},
		{Node: "b", Outcome: "timeout"},
		{Node: "c", Outcome: "ok", Files: files("3.1528", "2026-11-24T09:14:15Z")},
		{Node: "d", Outcome: "ok", Files: files("3.1336", "2026-11-24T09:14:16Z")}}
	rep, err := Check(spec, runs, nil)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Draft == nil || rep.Runs != 3 || len(rep.FailedRuns) != 1 || rep.Reproducible {
		t.Fatalf("report %+v", rep)
	}
	verdicts := map[string]string{}
	for _, v := range rep.Draft.Values {
		verdicts[v.Question] = v.Verdict
	}
	want := map[string]string{
		"Report `median` on line 1 of results/summary.txt.":      DraftStable,
		"Report `estimate` on line 2 of results/summary.txt.":    DraftInterval,
		"Report `finished_at` on line 3 of results/summary.txt.": DraftTimestamp,
		"Report column `n` of data row 1 of results/table.csv.":  DraftStable,
	}
	if !reflect.DeepEqual(verdicts, want) {
		t.Fatalf("verdicts %v, want %v", verdicts, want)
	}
	if !reflect.DeepEqual(rep.NotReproduced, []string{"Report `finished_at` on line 3 of results/summary.txt."}) {
		t.Fatalf("flagged %v", rep.NotReproduced)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "FLAGGED  timestamp") ||
		!strings.Contains(text.String(), "3 values kept, 1 flagged") {
		t.Fatalf("%v\n%s", err, text.String())
	}
	// The draft's spec, submitted as it is, checks the kept values.
	ds := rep.Draft.Spec
	if err := ds.Validate(); err != nil || ds.Draft() || len(ds.Rules) != 3 {
		t.Fatalf("draft spec %+v: %v", ds, err)
	}
	again, err := Check(ds, runs, nil)
	if err != nil || !reflect.DeepEqual(again.NotReproduced, []string{}) || !reflect.DeepEqual(again.Task, rep.Task) {
		t.Fatalf("checked with the draft's rules: %v %v\n%+v\n%+v", err, again.NotReproduced, again.Task, rep.Task)
	}
	// Fewer than 2 successful runs: nothing to draft.
	if _, err := Check(spec, runs[:2], nil); err == nil || !strings.Contains(err.Error(), "at least 2") {
		t.Fatalf("one successful run: %v", err)
	}
}

// TestCheckerRecipe: a run's job, with rules and as a draft, passes the
// validator nodes apply; it runs the capsule's script in the capsule's own
// environment when it has one (nothing of the image shown), and returns
// the rule files, or a draft's results/ folder whole.
func TestCheckerRecipe(t *testing.T) {
	c, _ := cid.Decode("bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy")
	limits := &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, WallSeconds: 60}
	for _, tt := range []struct {
		spec string
		want []*proto.Output
	}{
		{`{"capsule": {"capsule_id": "capsule-0000005"}}`,
			[]*proto.Output{{Path: "capsule-0000005/results", MaxBytes: MaxFileSize, Directory: true}}},
		{`{"capsule": {"capsule_id": "capsule-0000005"}, "rules": [{"question": "q", "file": "results/s.txt", "kind": "text"}]}`,
			[]*proto.Output{{Path: "capsule-0000005/results/s.txt", MaxBytes: MaxFileSize}}},
	} {
		check, err := Checker{}.Parse([]byte(tt.spec))
		if err != nil {
			t.Fatal(err)
		}
		r, err := Checker{}.Recipe(check, c, c, limits)
		if err != nil {
			t.Fatal(err)
		}
		if err := recipe.Validate(r); err != nil {
			t.Fatalf("%s: %v", tt.spec, err)
		}
		env := r.GetEnvironment()
		if env.GetDockerfile() != "capsule-0000005/environment/Dockerfile" || env.GetContext() != "capsule-0000005/environment" ||
			env.GetImageMount() != "" || !env.GetIfPresent() {
			t.Fatalf("%s: environment %v", tt.spec, env)
		}
		if len(r.Outputs) != len(tt.want) || !gproto.Equal(r.Outputs[0], tt.want[0]) {
			t.Fatalf("%s: outputs %v, want %v", tt.spec, r.Outputs, tt.want)
		}
	}
}

// TestDraftPublished: a draft check compares its runs with the results the
// capsule published (its results/ as submitted): a capsule that says
// fixed_seed_random 0.178395 whose runs all give 0.166599 is not
// reproduced, even though the runs agree with each other; a published
// value the runs give, or one inside their prediction interval, is; a
// date is not compared; a published value no run gives and a published
// file no run writes are not reproduced. Without published files the
// verdicts are the runs' alone.
func TestDraftPublished(t *testing.T) {
	spec := Spec{Capsule: draftCapsule, Runs: 3}
	run := func(node, est, at string) Run {
		return Run{Node: node, Outcome: "ok", Files: map[string][]byte{
			"results/results.txt": []byte("fixed_seed_random 0.166599\nestimate " + est + "\nn 7\nfinished_at " + at + "\n")}}
	}
	runs := []Run{run("a", "3.1412", "2026-11-24T09:14:13Z"), run("b", "3.1528", "2026-11-24T09:14:15Z"), run("c", "3.1336", "2026-11-24T09:14:16Z")}
	published := map[string][]byte{
		"results/results.txt": []byte("fixed_seed_random 0.178395\nestimate 3.14\nn 7\nfinished_at 2025-01-01T00:00:00Z\nextra 12\n"),
		"results/figure.csv":  []byte("x,y\n1,2\n"),
		"code/run":            []byte("not a result 99\n"),
	}
	rep, err := Check(spec, runs, published)
	if err != nil {
		t.Fatal(err)
	}
	type cmp struct{ published, comparison string }
	got := map[string]cmp{}
	for _, v := range rep.Draft.Values {
		got[v.Question] = cmp{v.Published, v.Comparison}
	}
	want := map[string]cmp{
		"Report `fixed_seed_random` on line 1 of results/results.txt.": {"0.178395", PublishedNotReproduced},
		"Report `estimate` on line 2 of results/results.txt.":          {"3.14", PublishedReproduced},
		"Report `n` on line 3 of results/results.txt.":                 {"7", PublishedReproduced},
		"Report `finished_at` on line 4 of results/results.txt.":       {"2025-01-01T00:00:00Z", PublishedNotCompared},
		"Report `extra` on line 5 of results/results.txt.":             {"12", PublishedNotReproduced},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("comparisons %v, want %v", got, want)
	}
	for _, v := range rep.Draft.Values {
		if v.Question == "Report `fixed_seed_random` on line 1 of results/results.txt." &&
			(v.Verdict != DraftStable || v.ComparisonReason != "published 0.178395, every run gives 0.166599") {
			t.Errorf("fixed_seed_random: %+v", v)
		}
	}
	if rep.Reproducible || rep.Draft.Published != 2 || !reflect.DeepEqual(rep.Draft.Unproduced, []string{"results/figure.csv"}) {
		t.Fatalf("report: reproducible %v, %d published files, unproduced %v", rep.Reproducible, rep.Draft.Published, rep.Draft.Unproduced)
	}
	wantNot := []string{"Report `fixed_seed_random` on line 1 of results/results.txt.", "Report `finished_at` on line 4 of results/results.txt.",
		"Report `extra` on line 5 of results/results.txt.", "published file results/figure.csv: written by no run"}
	if !reflect.DeepEqual(rep.NotReproduced, wantNot) {
		t.Fatalf("not reproduced %q, want %q", rep.NotReproduced, wantNot)
	}
	var text strings.Builder
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "published 0.178395: NOT reproduced (published 0.178395, every run gives 0.166599)") ||
		!strings.Contains(text.String(), "the capsule's published results are NOT reproduced") {
		t.Fatalf("%v\n%s", err, text.String())
	}
	// The runs agreeing with what was published: reproducible.
	published["results/results.txt"] = []byte("fixed_seed_random 0.166599\nestimate 3.14\nn 7\n")
	delete(published, "results/figure.csv")
	if rep, err = Check(spec, runs, published); err != nil || len(rep.Draft.NotReproducedPublished()) != 0 {
		t.Fatalf("agreeing: %v %v", err, rep.Draft.NotReproducedPublished())
	}
	// Nothing published: no comparison.
	if rep, err = Check(spec, runs, nil); err != nil || rep.Draft.Published != 0 || rep.Draft.Values[0].Comparison != "" {
		t.Fatalf("nothing published: %v %+v", err, rep.Draft)
	}
}
