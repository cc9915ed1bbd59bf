// Package sample owns the stand-in PaperBench suite of tests and demos:
// a tiny paper folder in the published layout ("toy-mean": compute the
// mean of ten numbers; paper.md, addendum.md, judge.addendum.md, a
// seven-leaf rubric.json with every category, a zero weight and a
// blacklist), the sample agent's image (the reference agent, its log kept
// in $LOG_DIR/agent.log as an agent harness keeps one), the reproducer
// image (busybox with a bash that is busybox's sh), and the scripted
// model (package modelsim) that plays both the agent and the judges:
//
//   - model HonestModel writes a submission (data, compute_mean.sh,
//     reproduce.sh) with one bash call, then submits;
//   - model CheatModel first tries to fetch the authors' code from the
//     blacklisted URL, then writes the same submission;
//   - JudgeModel grades each leaf as Grades says and answers
//     results-spread with prose instead of the JSON asked for (a failed
//     leaf); SecondJudgeModel grades as SecondGrades says.
//
// Expected scores, by hand from the rubric (see the tests): full variant
// 0.875 under paperbench-report-failed@1 and 19/24 under
// paperbench-silent-zero@1; Code-Dev 0.75 under both.
//
// Nothing here does I/O but WritePaper (writes the folder) and reading
// the binaries an image is built from.
package sample

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/modelsim"
)

// PaperID is the toy paper's folder name: its task and content name.
const PaperID = "toy-mean"

// Models of the scripted model server.
const (
	HonestModel      = "toy-honest"
	CheatModel       = "toy-cheat"
	JudgeModel       = "judge-a"
	SecondJudgeModel = "judge-b"
)

// BlacklistedURL is the authors' code, in blacklist.txt.
const BlacklistedURL = "https://github.com/toy-authors/toy-mean-code"

// Leaf is one leaf of the toy rubric.
type Leaf struct {
	ID, Category, Requirement string
}

// Leaves of the rubric, in tree order.
var Leaves = []Leaf{
	{"impl-read", "Code Development", "compute_mean.sh reads the numbers in data/numbers.txt and computes their arithmetic mean."},
	{"impl-write", "Code Development", "compute_mean.sh writes the mean with two decimals to results/mean.txt."},
	{"impl-tests", "Code Development", "The submission includes unit tests of the mean computation."},
	{"impl-style", "Code Development", "The code states in a comment which table of the paper it reproduces."},
	{"run-mean", "Code Execution", "Running reproduce.sh executes compute_mean.sh without an error."},
	{"results-mean", "Result Analysis", "results/mean.txt reports a mean of 5.50, as in Table 1."},
	{"results-spread", "Result Analysis", "The reproduction reports the standard deviation of the numbers, 2.87, as in Table 1."},
}

// Grades are JudgeModel's grades by leaf; results-spread is missing: the
// judge answers it with prose, a failed judging.
var Grades = map[string]int{"impl-read": 1, "impl-write": 1, "impl-tests": 0, "impl-style": 1, "run-mean": 1, "results-mean": 1}

// SecondGrades are SecondJudgeModel's: it disagrees on impl-write.
var SecondGrades = map[string]int{"impl-read": 1, "impl-write": 0, "impl-tests": 0, "impl-style": 1, "run-mean": 1,
	"results-mean": 1, "results-spread": 0}

// Rubric is rubric.json: root (1) > impl (3: read 2, write 1, tests 1,
// style 0), run (2: run-mean 1), results (1: mean 1, spread 1).
func Rubric() []byte {
	type node struct {
		ID           string  `json:"id"`
		Requirements string  `json:"requirements"`
		Weight       float64 `json:"weight"`
		SubTasks     []node  `json:"sub_tasks"`
		Category     string  `json:"task_category,omitempty"`
		Fine         string  `json:"finegrained_task_category,omitempty"`
	}
	leaf := func(i int, w float64, fine string) node {
		return node{ID: Leaves[i].ID, Requirements: Leaves[i].Requirement, Weight: w, SubTasks: []node{}, Category: Leaves[i].Category, Fine: fine}
	}
	root := node{ID: "toy-mean-root", Requirements: "The toy mean paper is reproduced.", Weight: 1, SubTasks: []node{
		{ID: "impl", Requirements: "The mean computation of Section 2 is implemented.", Weight: 3, SubTasks: []node{
			leaf(0, 2, "Method Implementation"), leaf(1, 1, "Logging, Analysis & Presentation"),
			leaf(2, 1, "Experimental Setup"), leaf(3, 0, "Logging, Analysis & Presentation")}},
		{ID: "run", Requirements: "The reproduction runs.", Weight: 2, SubTasks: []node{leaf(4, 1, "Experimental Setup")}},
		{ID: "results", Requirements: "The results of Table 1 are reproduced.", Weight: 1, SubTasks: []node{
			leaf(5, 1, "Evaluation, Metrics & Benchmarking"), leaf(6, 1, "Evaluation, Metrics & Benchmarking")}},
	}}
	b, _ := json.MarshalIndent(root, "", "  ")
	return b
}

// Files are the paper folder's files.
func Files() map[string]string {
	return map[string]string{
		"paper.md": "# The mean of ten numbers\n\n## 1 Introduction\nWe study the arithmetic mean of the numbers 1 to 10.\n\n" +
			"## 2 Method\nThe numbers are stored one a line in data/numbers.txt. We add them and divide by their count.\n\n" +
			"## 3 Results\nTable 1: the mean is 5.50 and the standard deviation 2.87.\n",
		"addendum.md":       "The numbers are exactly 1, 2, ..., 10. Results are written to results/.\n",
		"judge.addendum.md": "A mean within 0.01 of 5.50 counts as reproduced.\n",
		"config.yaml":       "id: toy-mean\ntitle: \"The mean of ten numbers\"\n",
		"blacklist.txt":     BlacklistedURL + "\n",
		"rubric.json":       string(Rubric()),
		"paper.pdf":         "%PDF-1.4\n% a stand-in for the paper's PDF\n",
		"assets/table1.csv": "statistic,value\nmean,5.50\nstd,2.87\n",
	}
}

// WritePaper writes the paper folder into dir/PaperID and returns its path.
func WritePaper(dir string) (string, error) {
	root := filepath.Join(dir, PaperID)
	for name, content := range Files() {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return "", err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return "", err
		}
	}
	return root, nil
}

// ComputeMean and Reproduce are the submission's scripts.
const (
	ComputeMean = "#!/bin/sh\n# Reproduces Table 1 of the toy paper: the mean of data/numbers.txt.\nmkdir -p results\n" +
		"awk '{ s += $1; n++ } END { printf \"%.2f\\n\", s / n }' data/numbers.txt > results/mean.txt\n"
	Reproduce = "#!/bin/bash\nset -e\nsh compute_mean.sh\necho \"mean: $(cat results/mean.txt)\"\n"
)

// SubmitCommand is the bash command the scripted agent writes its
// submission with, in the workspace.
func SubmitCommand() string {
	return "mkdir -p submission/data && cd submission && seq 1 10 > data/numbers.txt && cat > compute_mean.sh <<'EOF'\n" +
		ComputeMean + "EOF\ncat > reproduce.sh <<'EOF'\n" + Reproduce + "EOF\nls"
}

// FetchCommand is the cheat's attempt at the authors' code (the sandbox
// has no network: it fails, and is in the agent's log all the same).
func FetchCommand() string {
	return "git clone " + BlacklistedURL + " /tmp/upstream || wget -q -O /tmp/upstream.zip " + BlacklistedURL +
		"/archive/refs/heads/main.zip || echo no network"
}

func bash(id, command string) modelsim.ToolCall {
	args, _ := json.Marshal(map[string]string{"command": command})
	return modelsim.ToolCall{ID: id, Name: "bash", Arguments: string(args)}
}

var submit = modelsim.ToolCall{ID: "call-submit", Name: "submit", Arguments: `{"answers": {"submission": "done"}}`}

// Criterion is the text that marks a leaf's judge request: the criterion
// graded, as paperbench.BuildJudgeInput writes it.
func Criterion(requirement string) string { return "<criterion>\n" + requirement + "\n</criterion>" }

// Script is the scripted model: both agents and both judges.
func Script() modelsim.Script {
	var s modelsim.Script
	rule := func(c modelsim.Cond, r modelsim.Reply) { s.Rules = append(s.Rules, modelsim.Rule{When: c, Reply: r}) }
	// The honest agent writes its submission, then submits once the
	// listing shows reproduce.sh.
	rule(modelsim.Cond{Model: HonestModel, Turn: 1}, modelsim.Reply{Content: "I will write the code.",
		ToolCalls: []modelsim.ToolCall{bash("call-write", SubmitCommand())}})
	rule(modelsim.Cond{Model: HonestModel, Turn: 2, ToolResultContains: "reproduce.sh"}, modelsim.Reply{ToolCalls: []modelsim.ToolCall{submit}})
	// The cheat fetches the authors' code first.
	rule(modelsim.Cond{Model: CheatModel, Turn: 1}, modelsim.Reply{Content: "Let me get the authors' code.",
		ToolCalls: []modelsim.ToolCall{bash("call-fetch", FetchCommand())}})
	rule(modelsim.Cond{Model: CheatModel, Turn: 2}, modelsim.Reply{ToolCalls: []modelsim.ToolCall{bash("call-write", SubmitCommand())}})
	rule(modelsim.Cond{Model: CheatModel, Turn: 3, ToolResultContains: "reproduce.sh"}, modelsim.Reply{ToolCalls: []modelsim.ToolCall{submit}})
	for _, l := range Leaves {
		if g, ok := Grades[l.ID]; ok {
			rule(modelsim.Cond{Model: JudgeModel, AnyContains: Criterion(l.Requirement)}, verdict(g, l.ID))
		} else {
			rule(modelsim.Cond{Model: JudgeModel, AnyContains: Criterion(l.Requirement)},
				modelsim.Reply{Content: "The submission does not report the spread anywhere, so this fails."})
		}
		rule(modelsim.Cond{Model: SecondJudgeModel, AnyContains: Criterion(l.Requirement)}, verdict(SecondGrades[l.ID], l.ID))
	}
	return s
}

func verdict(score int, id string) modelsim.Reply {
	b, _ := json.Marshal(map[string]any{"score": score, "explanation": fmt.Sprintf("Graded %s from the files shown.", id)})
	return modelsim.Reply{Content: string(b)}
}

// agentRun is the sample agent's entry point.
const agentRun = `#!/bin/sh
# The PaperBench sample agent: the reference agent, its output kept in
# $LOG_DIR/agent.log (as an agent harness keeps its log) and passed on.
set -o pipefail
log="${LOG_DIR:-/workspace/logs}"
mkdir -p "$log"
/agent/repronet-agent 2>&1 | tee -a "$log/agent.log"
`

// AgentImage builds the sample agent's image: busybox, the reference
// agent's binary at /agent/repronet-agent, the run script.
func AgentImage(busybox, agentBinary string) ([]byte, error) {
	bin, err := os.ReadFile(agentBinary)
	if err != nil {
		return nil, fmt.Errorf("paperbench sample agent: %w", err)
	}
	return agentimage.Build("paperbench-sample", busybox, map[string][]byte{agentimage.Entrypoint: []byte(agentRun),
		"/agent/repronet-agent": bin})
}

// bashShim stands in for bash in the reproducer image: busybox's sh reads
// reproduce.sh and runs `set -o pipefail` alike.
const bashShim = "#!/bin/sh\nexec /bin/sh \"$@\"\n"

// ReproducerImage builds the sample reproducer: busybox (sh, tar, find,
// awk, tee) with /bin/bash as its sh. The real one is the paper's
// environment (Ubuntu 24.04, CUDA).
func ReproducerImage(busybox string) ([]byte, error) {
	return agentimage.Build("paperbench-reproducer", busybox, map[string][]byte{
		agentimage.Entrypoint: []byte("#!/bin/sh\necho 'the reproducer runs what its recipe says' >&2\nexit 2\n"),
		"/bin/bash":           []byte(bashShim)})
}

// ExpectedScores are the full variant's scores by hand, per grader
// (report-failed, silent-zero), and Code-Dev's (both).
func ExpectedScores() (fullReportFailed, fullSilentZero, codeDev float64) {
	impl := (2.0*1 + 1*1 + 1*0 + 0*1) / (2 + 1 + 1 + 0) // 0.75
	run := 1.0
	resultsRF := 1.0           // results-spread failed: out of the mean
	resultsSZ := (1.0 + 0) / 2 // counted 0
	fullReportFailed = (3*impl + 2*run + 1*resultsRF) / 6
	fullSilentZero = (3*impl + 2*run + 1*resultsSZ) / 6
	return fullReportFailed, fullSilentZero, impl
}
