package sample_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/heureka/family"
	"github.com/repronet/repronet/bench/heureka/sample"
	"github.com/repronet/repronet/internal/agentimage"
)

// TestAnalyst runs the sample agent's script with busybox on the stand-in
// datasets and every question file of the stand-in suite: it answers what
// the datasets say ("B, D", "A", the shares' changes, YAP1) and leaves the
// marker MCQ without a solution.
func TestAnalyst(t *testing.T) {
	if _, err := os.Stat(agentimage.BusyboxPath); err != nil {
		t.Fatalf("busybox is required: %v", err)
	}
	def, err := family.Def("hb", sample.MCQFile(), sample.OEQFile(), family.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	s, err := family.New().Open(def)
	if err != nil {
		t.Fatal(err)
	}
	run, err := os.ReadFile("agents/analyst/run")
	if err != nil {
		t.Fatal(err)
	}
	// The image's PATH: busybox's applets only.
	bin := t.TempDir()
	for _, applet := range []string{"sh", "sed", "awk", "grep", "sort", "printf"} {
		if err := os.Symlink(agentimage.BusyboxPath, filepath.Join(bin, applet)); err != nil {
			t.Fatal(err)
		}
	}
	h, _ := multihash.Sum([]byte("stand-in"), multihash.SHA2_256, -1)
	c := cid.NewCidV1(cid.Raw, h)
	want := map[string]string{
		"mcq-paperT-insight1-Question1": "<solution>B, D</solution>",
		"mcq-paperT-insight1-Question2": "<solution>A</solution>",
		"mcq-paperT-insight2-Question1": "could not analyse",
		"oeq-paperT-insight1-Question1": "<solution>ADRN-baseline falls from 0.40 to 0.20; ADRN-calcium rises from 0.20 to 0.45; " +
			"ADRN-proliferating falls from 0.30 to 0.10; MES rises from 0.10 to 0.25.</solution>",
		"oeq-paperT-insight2-Question1": "<solution>YAP1 marks the MES state (score 0.88).</solution>",
	}
	for _, task := range s.Tasks() {
		dir := t.TempDir()
		if err := os.MkdirAll(filepath.Join(dir, "data"), 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range sample.Datasets() {
			if err := os.WriteFile(filepath.Join(dir, "data", name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		r, err := s.Recipe(bench.RecipeInput{Task: task, Variant: family.Variant, Stage: family.Stage, Image: c,
			Content: map[string]cid.Cid{family.DataContent(sample.Paper): c}})
		if err != nil {
			t.Fatal(err)
		}
		q := r.GetEdits()[0].GetWrite()
		if err := os.WriteFile(filepath.Join(dir, q.GetPath()), q.GetContent(), 0o644); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(agentimage.BusyboxPath, "sh", "-c", string(run))
		cmd.Dir = dir
		cmd.Env = []string{"PATH=" + bin, "QUESTION_FILE=" + filepath.Join(dir, family.QuestionFile),
			"ANSWER_FILE=" + filepath.Join(dir, family.AnswerFile), "DATA_DIR=" + filepath.Join(dir, "data")}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%s: %v\n%s", task.ID, err, out)
		}
		got, err := os.ReadFile(filepath.Join(dir, family.AnswerFile))
		if err != nil || !strings.Contains(string(got), want[task.ID]) {
			t.Errorf("%s: answer %q (%v), want %q in it", task.ID, got, err, want[task.ID])
		}
	}
}
