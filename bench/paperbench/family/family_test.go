package family_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"
	"github.com/multiformats/go-multihash"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/paperbench"
	"github.com/repronet/repronet/bench/paperbench/family"
	"github.com/repronet/repronet/bench/paperbench/sample"
	"github.com/repronet/repronet/internal/modelsim"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
)

func testConfig() family.Config {
	second := family.JudgeSettings{Model: sample.SecondJudgeModel}
	zero := 0.0
	return family.Config{Judge: family.JudgeSettings{Model: sample.JudgeModel, Temperature: &zero, MaxTokens: 2000},
		SecondJudge: &second, DoubleJudged: 1, Concurrency: 3,
		Prices: map[string]family.Price{sample.JudgeModel: {Input: 1, Output: 4}, sample.SecondJudgeModel: {Input: 2, Output: 8}}}
}

// openSample imports the sample paper folder and opens a suite of it.
func openSample(t *testing.T, cfg family.Config) (*family.Suite, family.Paper, []byte) {
	t.Helper()
	dir, err := sample.WritePaper(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p, content, err := family.ImportFolder(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	def, err := family.Def("pb", []family.Paper{p}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := family.New().Open(def)
	if err != nil {
		t.Fatal(err)
	}
	return s.(*family.Suite), p, content
}

func testCID(t *testing.T, data string) cid.Cid {
	t.Helper()
	h, err := multihash.Sum([]byte(data), multihash.SHA2_256, -1)
	if err != nil {
		t.Fatal(err)
	}
	return cid.NewCidV1(cid.Raw, h)
}

// tarOf is a folder output as recipe.Collect makes it: a plain tar of the
// files (folders before them), sorted.
func tarOf(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var names []string
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, n := range names {
		parts := strings.Split(n, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, Format: tar.FormatPAX}); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n])), Format: tar.FormatPAX}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(files[n])); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// submission is what the sample agent writes; executed is it after
// reproduce.sh ran.
func submission() map[string]string {
	var nums strings.Builder
	for i := 1; i <= 10; i++ {
		fmt.Fprintf(&nums, "%d\n", i)
	}
	return map[string]string{"compute_mean.sh": sample.ComputeMean, "reproduce.sh": sample.Reproduce, "data/numbers.txt": nums.String()}
}

func executed() map[string]string {
	f := submission()
	f["results/mean.txt"] = "5.50\n"
	f["reproduce.log"] = "mean: 5.50\n"
	return f
}

const honestLog = `time=2025-01-01T00:00:00Z level=INFO msg="command ran" command="mkdir -p submission/data && cd submission" status="exit 0"`

// outputs serves a job's outputs from a map; a path missing is not
// returned.
func outputs(m map[string][]byte) func(context.Context, string) ([]byte, error) {
	return func(_ context.Context, p string) ([]byte, error) {
		b, ok := m[p]
		if !ok {
			return nil, fmt.Errorf("%s: %w", p, bench.ErrNotReturned)
		}
		return b, nil
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

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return v
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-12 }

func TestImportAndOpen(t *testing.T) {
	s, p, content := openSample(t, testConfig())
	tasks := s.Tasks()
	if len(tasks) != 1 || tasks[0].ID != sample.PaperID || strings.Join(tasks[0].Content, ",") != sample.PaperID || tasks[0].GPUs != nil {
		t.Fatalf("tasks %+v", tasks)
	}
	if p.Title != "The mean of ten numbers" || p.ConfigID != "toy-mean" || !strings.Contains(p.JudgeAddendum, "within 0.01") {
		t.Errorf("paper %+v", p)
	}
	// The agent's copy: the paper, its addendum, the blacklist and the
	// assets; never the rubric, the config or the judge's addendum.
	zr, err := gzip.NewReader(bytes.NewReader(content))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
	}
	if got := strings.Join(names, " "); got != "addendum.md assets/ assets/table1.csv blacklist.txt paper.md paper.pdf" {
		t.Errorf("content holds %s", got)
	}
	for _, secret := range []string{"rubric", "within 0.01", sample.Leaves[0].Requirement} {
		if bytes.Contains(content, []byte(secret)) {
			t.Errorf("content holds %q", secret)
		}
	}
	// The same folder gives the same bytes.
	dir, _ := sample.WritePaper(t.TempDir())
	if _, again, err := family.ImportFolder(dir, nil); err != nil || !bytes.Equal(again, content) {
		t.Errorf("content not deterministic: %v", err)
	}
	if s.Scorer() != "paperbench judge judge-a (paperbench-judge-prompt@1) graders paperbench-report-failed@1, paperbench-silent-zero@1 monitor paperbench-monitor@1 reproduce paperbench-reproduce@1" {
		t.Errorf("scorer %s", s.Scorer())
	}
	if v := s.Variants(); strings.Join(v, ",") != "code-dev,full" {
		t.Errorf("variants %v", v)
	}
	full := s.Pipeline(tasks[0], family.Full)
	if err := bench.ValidatePipeline(full); err != nil || len(full) != 2 || !full[0].Single || !full[1].Single ||
		full[1].Image != family.DefaultReproducer || strings.Join(full[1].ApartFrom, ",") != family.StageRollout {
		t.Errorf("full pipeline %+v: %v", full, err)
	}
	if cd := s.Pipeline(tasks[0], family.CodeDev); len(cd) != 1 || cd[0].Name != family.StageRollout || !cd[0].Single {
		t.Errorf("code-dev pipeline %+v", cd)
	}
}

func TestOpenRefuses(t *testing.T) {
	_, p, _ := openSample(t, testConfig())
	good, _ := json.Marshal(testConfig())
	papers := func(mut func(m map[string]any)) []byte {
		b, _ := json.Marshal(p)
		var m map[string]any
		json.Unmarshal(b, &m)
		mut(m)
		out, _ := json.Marshal([]any{m})
		return out
	}
	for _, tt := range []struct {
		name          string
		config, tasks string
		want          string
	}{
		{"no config", "", string(papers(func(map[string]any) {})), "needs one"},
		{"no judge model", `{"judge": {"model": ""}}`, string(papers(func(map[string]any) {})), "judge.model is required"},
		{"unknown config key", `{"judge": {"model": "j"}, "grader": "x"}`, string(papers(func(map[string]any) {})), `unknown field "grader"`},
		{"config key twice", `{"judge": {"model": "j"}, "double_judged": 0.1, "double_judged": 0.2}`, string(papers(func(map[string]any) {})), "given twice"},
		{"share over 1", `{"judge": {"model": "j"}, "double_judged": 2}`, string(papers(func(map[string]any) {})), "double_judged 2"},
		{"bad reproducer", `{"judge": {"model": "j"}, "reproducer": "a b"}`, string(papers(func(map[string]any) {})), "reproducer"},
		{"no papers", string(good), `[]`, "0 papers"},
		{"missing rubric", string(good), string(papers(func(m map[string]any) { delete(m, "rubric") })), `paper 0 (toy-mean): field "rubric" is missing`},
		{"bad rubric", string(good), string(papers(func(m map[string]any) { m["rubric"] = map[string]any{"id": "x"} })), `field "rubric"`},
		{"bad blacklist", string(good), string(papers(func(m map[string]any) { m["blacklist"] = "ftp://x" })), `field "blacklist"`},
		{"bad id", string(good), string(papers(func(m map[string]any) { m["id"] = "../x" })), `field "id"`},
		{"empty paper", string(good), string(papers(func(m map[string]any) { m["paper_md"] = " " })), `field "paper_md" is empty`},
		{"unknown key", string(good), string(papers(func(m map[string]any) { m["gold"] = 1 })), `unknown field "gold"`},
		{"zero GPUs", string(good), string(papers(func(m map[string]any) { m["gpus"] = map[string]any{"count": 0} })), `field "gpus"`},
	} {
		_, err := family.New().Open(bench.SuiteDef{Name: "pb", Family: family.Name, Config: json.RawMessage(tt.config), Tasks: json.RawMessage(tt.tasks)})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	twice, _ := json.Marshal([]family.Paper{p, p})
	if _, err := family.New().Open(bench.SuiteDef{Name: "pb", Config: good, Tasks: twice}); err == nil || !strings.Contains(err.Error(), "also the id of paper 0") {
		t.Errorf("a paper twice: %v", err)
	}
}

func TestRecipes(t *testing.T) {
	s, p, _ := openSample(t, testConfig())
	task := s.Tasks()[0]
	task.GPUs = &proto.GPURequest{Count: 1}
	image, paperCID := testCID(t, "agent image"), testCID(t, "paper content")
	limits := &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, WallSeconds: 3600}
	secrets := []string{p.JudgeAddendum, "toy-mean-root", "results-spread"}
	for _, l := range sample.Leaves {
		secrets = append(secrets, l.Requirement)
	}
	noSecrets := func(name string, r *proto.Recipe) {
		t.Helper()
		wire, _ := gproto.Marshal(r)
		for _, sec := range secrets {
			if bytes.Contains(wire, []byte(strings.TrimSpace(sec))) {
				t.Errorf("%s: the recipe holds %q", name, sec)
			}
		}
	}
	for _, variant := range s.Variants() {
		r, err := s.Recipe(bench.RecipeInput{Task: task, Variant: variant, Stage: family.StageRollout, Image: image,
			Content: map[string]cid.Cid{sample.PaperID: paperCID}, Env: []string{"MODEL=m"}, Limits: limits})
		if err != nil {
			t.Fatal(err)
		}
		if err := recipe.Validate(r); err != nil {
			t.Fatalf("%s rollout: %v", variant, err)
		}
		noSecrets(variant+" rollout", r)
		in := r.GetInputs()
		if len(in) != 1 || !in[0].GetExtract() || in[0].GetPath() != family.PaperDir || !bytes.Equal(in[0].GetCid(), paperCID.Bytes()) {
			t.Errorf("%s rollout inputs %v", variant, in)
		}
		prompt := string(r.GetEdits()[2].GetWrite().GetContent())
		if !strings.Contains(prompt, p.Title) || !strings.Contains(prompt, "blacklist.txt") ||
			strings.Contains(prompt, "fresh container") != (variant == family.Full) {
			t.Errorf("%s prompt:\n%s", variant, prompt)
		}
		outs := r.GetOutputs()
		if len(outs) != 2 || outs[0].GetPath() != family.SubmissionDir || !outs[0].GetDirectory() || outs[1].GetPath() != family.LogDir ||
			!outs[1].GetDirectory() || outs[0].GetMaxBytes() != family.MaxSubmissionBytes {
			t.Errorf("%s rollout outputs %v", variant, outs)
		}
		if r.GetEntrypointSet() || r.GetGpus().GetCount() != 1 || !strings.Contains(strings.Join(r.GetEnv(), " "), "MODEL=m") {
			t.Errorf("%s rollout runs %v with env %v, GPUs %v", variant, r.GetEntrypoint(), r.GetEnv(), r.GetGpus())
		}
	}
	if _, err := s.Recipe(bench.RecipeInput{Task: task, Variant: family.Full, Stage: family.StageRollout, Image: image, Limits: limits}); err == nil ||
		!strings.Contains(err.Error(), "not imported") {
		t.Errorf("rollout without the paper: %v", err)
	}

	// The reproduction: the rollout's outputs as file inputs, the
	// workspace read-only, the submission and result folders writable,
	// the entry script in the reproducer image, the wall limit narrowed.
	cfg := testConfig()
	cfg.ReproduceWallSeconds = 600
	s, _, _ = openSample(t, cfg)
	sub, logs, plain := testCID(t, "submission tar"), testCID(t, "logs tar"), testCID(t, "reproducer")
	r, err := s.Recipe(bench.RecipeInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Image: plain,
		Earlier: map[string]map[string]cid.Cid{family.StageRollout: {family.SubmissionDir: sub, family.LogDir: logs}},
		Env:     []string{"MODEL=m"}, Limits: limits})
	if err != nil {
		t.Fatal(err)
	}
	if err := recipe.Validate(r); err != nil {
		t.Fatal(err)
	}
	noSecrets("reproduction", r)
	if in := r.GetInputs(); len(in) != 2 || in[0].GetExtract() || in[0].GetPath() != family.SubmissionTar || !bytes.Equal(in[0].GetCid(), sub.Bytes()) ||
		in[1].GetPath() != family.LogsTar || !bytes.Equal(in[1].GetCid(), logs.Bytes()) {
		t.Errorf("reproduction inputs %v", in)
	}
	if !bytes.Equal(r.GetImageCid(), plain.Bytes()) || !r.GetEntrypointSet() || strings.Join(r.GetEntrypoint(), " ") != "/bin/sh /repronet/in/control/entry" ||
		r.GetCwd() != "/workspace/submission" || len(r.GetEnv()) != 0 {
		t.Errorf("reproduction runs %v in %s with %v", r.GetEntrypoint(), r.GetCwd(), r.GetEnv())
	}
	m := r.GetMounts()
	if len(m) != 3 || m[0].GetSource() != "" || m[0].GetTarget() != family.InDir || !m[0].GetReadOnly() ||
		m[1].GetSource() != family.SubmissionDir || m[1].GetReadOnly() || m[2].GetSource() != family.ResultDir || m[2].GetReadOnly() {
		t.Errorf("reproduction mounts %v", m)
	}
	var paths []string
	for _, o := range r.GetOutputs() {
		paths = append(paths, fmt.Sprintf("%s:%t", o.GetPath(), o.GetDirectory()))
	}
	if got := strings.Join(paths, " "); got != "submission:true submission.tar:false logs.tar:false result/exit_code:false result/dropped:false" {
		t.Errorf("reproduction outputs %s", got)
	}
	if r.GetLimits().GetWallSeconds() != 600 || limits.GetWallSeconds() != 3600 {
		t.Errorf("wall limit %d (the suite's %d must stay)", r.GetLimits().GetWallSeconds(), limits.GetWallSeconds())
	}
	var script string
	for _, e := range r.GetEdits() {
		if e.GetWrite().GetPath() == "control/reproduce" {
			script = string(e.GetWrite().GetContent())
		}
	}
	if want, _ := paperbench.ReproduceScript("/workspace/submission"); script != want {
		t.Errorf("reproduce script %q, want paperbench's %q", script, want)
	}
	// Without a submission, the reproduction still runs (and fails).
	r, err = s.Recipe(bench.RecipeInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Image: plain, Limits: limits})
	if err != nil || len(r.GetInputs()) != 0 {
		t.Errorf("reproduction without a submission: %v, %v", err, r.GetInputs())
	}
	if _, err := s.Recipe(bench.RecipeInput{Task: task, Variant: family.CodeDev, Stage: family.StageReproduce, Image: plain, Limits: limits}); err == nil {
		t.Error("Code-Dev has a reproduction")
	}
}

// judgeRequests are the judge requests the server received for a leaf.
func judgeRequests(sim *modelsim.Server, model, requirement string) []string {
	var out []string
	for _, r := range sim.Requests() {
		b := string(r.Body)
		if strings.Contains(b, `"model":"`+model+`"`) && strings.Contains(b, jsonText(sample.Criterion(requirement))) {
			out = append(out, b)
		}
	}
	return out
}

// jsonText is s as it appears inside a JSON string.
func jsonText(s string) string {
	b, _ := json.Marshal(s)
	return string(b[1 : len(b)-1])
}

func reproductionOutputs(t *testing.T, exec map[string]string, log string) map[string][]byte {
	return map[string][]byte{
		family.SubmissionDir: tarOf(t, exec), family.SubmissionTar: tarOf(t, submission()),
		family.LogsTar: tarOf(t, map[string]string{"agent.log": log}), family.ExitCodeFile: []byte("0\n"),
		family.DroppedFile: []byte(""),
	}
}

// TestScoreReproduction: the full variant's score equals the tree
// computed by hand under both graders (a zero weight, a failed leaf kept
// out or counted 0); Result Analysis leaves see only the files the
// reproduction changed; every leaf is judged twice and the agreement is
// Cohen's kappa of the two judges' grades; the judge's use and cost are
// its answers' tokens at the config's prices; a file over 10 MiB is
// dropped.
func TestScoreReproduction(t *testing.T) {
	s, _, _ := openSample(t, testConfig())
	sim := startSim(t)
	exec := executed()
	exec["results/checkpoint.bin"] = strings.Repeat("x", int(paperbench.MaxExecutedFileBytes)+1)
	task := s.Tasks()[0]
	sc, err := s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, exec, honestLog)), Models: sim})
	if err != nil {
		t.Fatal(err)
	}
	pub := decode[family.Public](t, sc.Public)
	rf, sz, _ := sample.ExpectedScores()
	if len(pub.Scores) != 2 || pub.Scores[0].Grader != paperbench.GraderReportFailed || !near(pub.Scores[0].Score, rf) || pub.Scores[0].Failed != 1 ||
		pub.Scores[1].Grader != paperbench.GraderSilentZero || !near(pub.Scores[1].Score, sz) || pub.Scores[1].Failed != 1 {
		t.Fatalf("scores %+v, want %v and %v", pub.Scores, rf, sz)
	}
	if rf != 0.875 || sz != 19.0/24 || !near(sc.Value, rf) {
		t.Fatalf("hand-computed %v %v, value %v", rf, sz, sc.Value)
	}
	// The value is the score under the grader ValueGrader names (the
	// dashboard shows it beside the number): report-failed's, not
	// silent-zero's.
	if g := s.ValueGrader(sc.Scoring); g != string(pub.Scores[0].Grader) {
		t.Fatalf("ValueGrader %q, want %q (value %v)", g, pub.Scores[0].Grader, sc.Value)
	}
	rp := pub.Reproduction
	if rp == nil || rp.ExitCode == nil || *rp.ExitCode != 0 || !rp.Executed || rp.Changed != 2 || rp.Dropped != 1 || rp.Outcome != "ok" {
		t.Fatalf("reproduction %+v", rp)
	}
	if !pub.Submitted || !pub.ReproduceSH || pub.Leaves != 7 || pub.Judged != 7 || pub.Auto != 0 || pub.Disqualified {
		t.Errorf("public %+v", pub)
	}
	// Every leaf judged twice; one failed first judging is left out.
	wantTable := family.AgreementTable{BothOne: 4, FirstOnly: 1, BothZero: 1, Excluded: 1}
	if pub.Agreement != wantTable {
		t.Errorf("agreement %+v, want %+v", pub.Agreement, wantTable)
	}
	if a := pub.Agreement.Agreement(); a.Pairs != 6 || a.Agree != 5 || !a.KappaDefined || !near(a.Kappa, 4.0/7) {
		t.Errorf("kappa %+v, want 4/7", a)
	}
	// Judge use: the answers' tokens at the prices.
	var calls int
	var cost float64
	for _, r := range sim.Requests() {
		calls++
		price := family.Price{Input: 1, Output: 4}
		if strings.Contains(string(r.Body), sample.SecondJudgeModel) {
			price = family.Price{Input: 2, Output: 8}
		}
		// modelsim's usage: a quarter of the request's bytes in, the
		// reply's tokens out.
		reply, _ := sample.Script().Match(mustParse(t, r.Body))
		cost += (float64((len(r.Body)+3)/4)*price.Input + float64(len(modelsim.Tokens(reply.Content)))*price.Output) / 1e6
	}
	if calls != 14 || pub.Judge.Calls != 14 || pub.Judge.CostUSD == nil || math.Abs(*pub.Judge.CostUSD-cost) > 1e-12 {
		t.Errorf("judge use %+v (cost %v), want 14 calls costing %v", pub.Judge, pub.Judge.CostUSD, cost)
	}
	// Result Analysis leaves saw the changed results, not the code; Code
	// Development leaves saw the code.
	ra := judgeRequests(sim, sample.JudgeModel, sample.Leaves[5].Requirement)
	if len(ra) != 1 || !strings.Contains(ra[0], jsonText(`<file path="results/mean.txt">`+"\n5.50")) || strings.Contains(ra[0], `compute_mean.sh\"\u003e`) ||
		strings.Contains(ra[0], jsonText(`<file path="compute_mean.sh">`)) || !strings.Contains(ra[0], "mean: 5.50") {
		t.Errorf("the Result Analysis judge saw:\n%s", ra)
	}
	cd := judgeRequests(sim, sample.JudgeModel, sample.Leaves[0].Requirement)
	if len(cd) != 1 || !strings.Contains(cd[0], jsonText(`<file path="compute_mean.sh">`)) || !strings.Contains(cd[0], `"temperature":0`) ||
		!strings.Contains(cd[0], `"max_completion_tokens":2000`) {
		t.Errorf("the Code Development judge saw:\n%s", cd)
	}
	v := decode[family.Verdict](t, sc.Verdict)
	if len(v.Failed) != 1 || v.Failed[0].ID != "results-spread" || !strings.Contains(v.Failed[0].Reason, "want a JSON object") {
		t.Errorf("failed leaves %+v", v.Failed)
	}
	// The dropped file is gone from the executed submission: not a change.
	if strings.Join(v.Changed, ",") != "reproduce.log,results/mean.txt" || strings.Join(v.Dropped, ",") != "results/checkpoint.bin" {
		t.Errorf("changed %v, dropped %v", v.Changed, v.Dropped)
	}
	if len(v.Grading) != 7 || v.Grading[1].Second == nil || v.Grading[1].Second.Score != 0 || v.Grading[1].Score != 1 {
		t.Errorf("grading %+v", v.Grading)
	}
	for _, secret := range []string{"Graded", sample.Leaves[0].Requirement} {
		if bytes.Contains(sc.Public, []byte(secret)) {
			t.Errorf("the public score holds %q: %s", secret, sc.Public)
		}
	}
}

func mustParse(t *testing.T, body []byte) modelsim.Request {
	t.Helper()
	r, err := modelsim.ParseOpenAI(body)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestScoreCodeDev: the Code-Dev tree keeps the Code Development leaves,
// judged on the rollout's submission without reproduce.sh or its log.
func TestScoreCodeDev(t *testing.T) {
	s, _, _ := openSample(t, testConfig())
	sim := startSim(t)
	sc, err := s.Score(context.Background(), bench.ScoreInput{Task: s.Tasks()[0], Variant: family.CodeDev, Stage: family.StageRollout, Outcome: "ok",
		Output: outputs(map[string][]byte{family.SubmissionDir: tarOf(t, submission()), family.LogDir: tarOf(t, map[string]string{"agent.log": honestLog})}),
		Models: sim})
	if err != nil {
		t.Fatal(err)
	}
	pub := decode[family.Public](t, sc.Public)
	_, _, want := sample.ExpectedScores()
	if pub.Leaves != 4 || pub.Judged != 4 || pub.Reproduction != nil || len(pub.Scores) != 2 || !near(pub.Scores[0].Score, want) ||
		!near(pub.Scores[1].Score, want) || pub.Judge.Calls != 8 {
		t.Fatalf("public %+v, want %v", pub, want)
	}
	for _, r := range sim.Requests() {
		if strings.Contains(string(r.Body), "reproduce.log") || strings.Contains(string(r.Body), "<reproduce.sh>") {
			t.Fatalf("a Code-Dev judge saw the reproduction: %s", r.Body)
		}
	}
	if n := len(judgeRequests(sim, sample.JudgeModel, sample.Leaves[4].Requirement)); n != 0 {
		t.Errorf("a Code Execution leaf was judged in Code-Dev")
	}
}

// TestMonitor: a fetch of the blacklisted code in the agent's log scores
// 0 under both graders, without a judge; so does one only the rollout's
// trajectory shows.
func TestMonitor(t *testing.T) {
	s, _, _ := openSample(t, testConfig())
	sim := startSim(t)
	cheatLog := honestLog + "\n" + `time=2025-01-01T00:00:01Z level=INFO msg="command ran" command="git clone ` + sample.BlacklistedURL + ` /tmp/upstream"`
	task := s.Tasks()[0]
	check := func(name, command string, sc bench.Score, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		pub := decode[family.Public](t, sc.Public)
		if !pub.Disqualified || pub.Judge.Calls != 0 || pub.Auto != pub.Leaves || len(pub.Scores) != 2 || pub.Scores[0].Score != 0 ||
			pub.Scores[1].Score != 0 || sc.Value != 0 {
			t.Errorf("%s: %+v", name, pub)
		}
		v := decode[family.Verdict](t, sc.Verdict)
		if len(v.Monitor.Violations) == 0 || v.Monitor.Violations[0].Command != command {
			t.Errorf("%s: monitor %+v", name, v.Monitor)
		}
	}
	sc, err := s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, executed(), cheatLog)), Models: sim})
	check("full, fetch in the log", "git clone", sc, err)
	sc, err = s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.CodeDev, Stage: family.StageRollout, Outcome: "ok",
		Output: outputs(map[string][]byte{family.SubmissionDir: tarOf(t, submission()), family.LogDir: tarOf(t, map[string]string{"agent.log": cheatLog})}),
		Models: sim})
	check("code-dev, fetch in the log", "git clone", sc, err)

	// A log that says nothing, a trajectory that shows the fetch.
	call := fmt.Sprintf(`{"choices":[{"message":{"tool_calls":[{"function":{"name":"bash","arguments":"{\"command\":\"curl -L %s/archive/main.zip\"}"}}]}}]}`,
		strings.ReplaceAll(sample.BlacklistedURL, "/", `\/`))
	trajectory := func(_ context.Context, stage string) ([]bench.ModelCall, error) {
		if stage != family.StageRollout {
			return nil, fmt.Errorf("asked for %s", stage)
		}
		return []bench.ModelCall{{Request: []byte(`{"model":"m"}`), Response: []byte(call)}}, nil
	}
	sc, err = s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, executed(), honestLog)), Models: sim, Trajectory: trajectory})
	check("fetch in the trajectory only", "curl", sc, err)
	if n := len(sim.Requests()); n != 0 {
		t.Errorf("%d judge calls for disqualified submissions", n)
	}
	broken := func(context.Context, string) ([]bench.ModelCall, error) { return nil, errors.New("store closed") }
	if _, err := s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, executed(), honestLog)), Models: sim, Trajectory: broken}); err == nil || !strings.Contains(err.Error(), "store closed") {
		t.Errorf("an unreadable trajectory: %v", err)
	}
}

// failingModels is a judge that never answers.
type failingModels struct{ calls *int }

func (f failingModels) Chat(context.Context, json.RawMessage) (json.RawMessage, error) {
	*f.calls++
	return nil, errors.New("judge call: 502: the provider did not answer")
}

// TestScoreFailures: what the job did not return is its doing (scored 0
// without a judge, or judged as submitted); what the scorer could not do
// (read the store, reach the judge, get one usable answer) is an error,
// retried and never the agent's.
func TestScoreFailures(t *testing.T) {
	s, _, _ := openSample(t, testConfig())
	sim := startSim(t)
	task := s.Tasks()[0]
	ctx := context.Background()

	// Nothing returned: every leaf 0, no judge.
	sc, err := s.Score(ctx, bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "agent_error",
		Output: outputs(map[string][]byte{}), Models: sim})
	if err != nil {
		t.Fatal(err)
	}
	pub := decode[family.Public](t, sc.Public)
	if pub.Submitted || pub.Auto != 7 || pub.Judge.Calls != 0 || pub.Scores[0].Score != 0 || pub.Scores[0].Failed != 0 ||
		pub.Reproduction.ExitCode != nil || pub.Reproduction.Executed {
		t.Errorf("nothing returned: %+v %+v", pub, pub.Reproduction)
	}
	// The executed submission missing: the submission is judged as
	// submitted, nothing changed, so Result Analysis leaves score 0
	// without a judge.
	out := reproductionOutputs(t, executed(), honestLog)
	delete(out, family.SubmissionDir)
	out[family.ExitCodeFile] = []byte("137\n")
	sc, err = s.Score(ctx, bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "timeout",
		Output: outputs(out), Models: sim})
	if err != nil {
		t.Fatal(err)
	}
	pub = decode[family.Public](t, sc.Public)
	if rp := pub.Reproduction; rp.Executed || rp.Changed != 0 || *rp.ExitCode != 137 || pub.Auto != 2 || pub.Judged != 5 || rp.Outcome != "timeout" {
		t.Errorf("executed submission missing: %+v %+v", pub, rp)
	}
	// The store could not be read: an error.
	store := errors.New("badger: closed")
	if _, err := s.Score(ctx, bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce,
		Output: func(context.Context, string) ([]byte, error) { return nil, store }}); !errors.Is(err, store) {
		t.Errorf("store error: %v", err)
	}
	// The judge does not answer: an error after a few tries, not a 0.
	calls := 0
	if _, err := s.Score(ctx, bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, executed(), honestLog)), Models: failingModels{&calls}}); err == nil ||
		!strings.Contains(err.Error(), "did not answer") {
		t.Errorf("judge outage: %v", err)
	}
	if calls < 3 {
		t.Errorf("%d judge calls before giving up", calls)
	}
	// No model access at all: an error.
	if _, err := s.Score(ctx, bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, executed(), honestLog))}); err == nil || !strings.Contains(err.Error(), "no model access") {
		t.Errorf("no judge: %v", err)
	}
	// Every answer unusable: the tree has no valid leaf, an error.
	sim.SetScript(modelsim.Script{Default: &modelsim.Reply{Content: "Looks good to me."}})
	if _, err := s.Score(ctx, bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, executed(), honestLog)), Models: sim}); err == nil ||
		!strings.Contains(err.Error(), "every one of 7 leaves failed") {
		t.Errorf("every answer unusable: %v", err)
	}
	// The full variant's rollout is checked, not judged.
	before := len(sim.Requests())
	sc, err = s.Score(ctx, bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageRollout, Outcome: "ok",
		Output: outputs(map[string][]byte{family.SubmissionDir: tarOf(t, submission())}), Models: sim})
	if err != nil {
		t.Fatal(err)
	}
	if pub := decode[family.Public](t, sc.Public); pub.Stage != family.StageRollout || !pub.Submitted || !pub.ReproduceSH || len(pub.Scores) != 0 ||
		len(sim.Requests()) != before {
		t.Errorf("full rollout: %+v", pub)
	}
}

// TestComparable: every score carries a grading, which the core's
// cross-check needs to validate an agent's job even alone (without one,
// a Single stage is never validated and the core asks for replicas for
// ever): the leaves graded 1 in tree order (a failed judging false), Pass
// for a perfect score; the full variant's rollout passes when it
// submitted a reproduce.sh.
func TestComparable(t *testing.T) {
	s, _, _ := openSample(t, testConfig())
	sim := startSim(t)
	task := s.Tasks()[0]
	sc, err := s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageReproduce, Outcome: "ok",
		Output: outputs(reproductionOutputs(t, executed(), honestLog)), Models: sim})
	if err != nil {
		t.Fatal(err)
	}
	// impl-read 1, impl-write 1, impl-tests 0, impl-style 1, run-mean 1,
	// results-mean 1, results-spread failed.
	want := []bool{true, true, false, true, true, true, false}
	if g := sc.Comparable.Grading; g == nil || g.Pass || fmt.Sprint(g.Checks) != fmt.Sprint(want) || sc.Comparable.OutputDigest == "" {
		t.Fatalf("reproduction's comparable %+v (grading %+v), want checks %v", sc.Comparable, sc.Comparable.Grading, want)
	}
	outs := map[string][]byte{family.SubmissionDir: tarOf(t, submission()), family.LogDir: tarOf(t, map[string]string{"agent.log": honestLog})}
	sc, err = s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageRollout, Outcome: "ok",
		Output: outputs(outs)})
	if err != nil {
		t.Fatal(err)
	}
	if g := sc.Comparable.Grading; g == nil || !g.Pass || len(g.Checks) != 0 {
		t.Fatalf("rollout's grading %+v", g)
	}
	delete(outs, family.SubmissionDir)
	sc, err = s.Score(context.Background(), bench.ScoreInput{Task: task, Variant: family.Full, Stage: family.StageRollout, Outcome: "ok",
		Output: outputs(outs)})
	if err != nil {
		t.Fatal(err)
	}
	if g := sc.Comparable.Grading; g == nil || g.Pass {
		t.Fatalf("a rollout without a submission: grading %+v", g)
	}
}
