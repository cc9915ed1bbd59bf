package sample

import (
	"math"
	"os/exec"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench/paperbench"
)

// TestPaper: the folder loads strictly; its rubric has every category, a
// zero weight, and scores what ExpectedScores computes by hand from the
// weights under paperbench's graders, Code-Dev included.
func TestPaper(t *testing.T) {
	dir, err := WritePaper(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, err := paperbench.LoadPaper(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := p.Rubric.Stats()
	if st.Leaves != len(Leaves) || st.ByCategory[paperbench.CodeDevelopment] != 4 || st.ByCategory[paperbench.CodeExecution] != 1 ||
		st.ByCategory[paperbench.ResultAnalysis] != 2 || len(p.Blacklist.Entries) != 1 || !p.HasPaperPDF || len(p.Assets) != 1 {
		t.Fatalf("paper %+v, stats %+v", p, st)
	}
	grades := map[string]paperbench.LeafGrade{}
	for _, l := range Leaves {
		g, ok := Grades[l.ID]
		grades[l.ID] = paperbench.LeafGrade{Score: g, Failed: !ok, Reason: "prose"}
	}
	rf, sz, cd := ExpectedScores()
	for g, want := range map[paperbench.Grader]float64{paperbench.GraderReportFailed: rf, paperbench.GraderSilentZero: sz} {
		res, err := paperbench.Score(p.Rubric, grades, g)
		if err != nil || math.Abs(res.Score-want) > 1e-12 || len(res.Failed) != 1 {
			t.Errorf("%s: %+v, %v; want %v", g, res, err, want)
		}
	}
	code := paperbench.CodeDev(p.Rubric)
	cdGrades := map[string]paperbench.LeafGrade{}
	for _, l := range code.Leaves() {
		cdGrades[l.ID] = grades[l.ID]
	}
	if res, err := paperbench.Score(code, cdGrades, paperbench.GraderReportFailed); err != nil || math.Abs(res.Score-cd) > 1e-12 {
		t.Errorf("code-dev: %+v, %v; want %v", res, err, cd)
	}
	if rf != 0.875 || sz != 19.0/24 || cd != 0.75 {
		t.Errorf("by hand: %v %v %v", rf, sz, cd)
	}
}

// TestSubmissionScripts: the command the scripted agent runs writes a
// submission whose reproduce.sh prints the mean of Table 1 (run with the
// host's sh, as the sample reproducer's bash is sh).
func TestSubmissionScripts(t *testing.T) {
	dir := t.TempDir()
	if out, err := exec.Command("/bin/sh", "-c", "cd "+dir+" && "+SubmitCommand()).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "reproduce.sh") {
		t.Fatalf("%v: %s", err, out)
	}
	out, err := exec.Command("/bin/sh", "-c", "cd "+dir+"/submission && sh reproduce.sh && cat results/mean.txt").CombinedOutput()
	if err != nil || string(out) != "mean: 5.50\n5.50\n" {
		t.Fatalf("%v: %q", err, out)
	}
	if !strings.Contains(FetchCommand(), "git clone "+BlacklistedURL) {
		t.Error(FetchCommand())
	}
}
