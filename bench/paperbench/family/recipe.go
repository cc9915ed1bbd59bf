package family

import (
	"fmt"
	"strconv"

	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/paperbench"
	"github.com/repronet/repronet/proto"
)

// The rollout's workspace, mounted at Workspace: the paper's files in
// paper/, the instructions beside them; the agent builds submission/ and
// keeps its log in logs/, both returned as folders.
const (
	Workspace     = "/workspace"
	PaperDir      = "paper"
	SubmissionDir = "submission"
	LogDir        = "logs"
	PromptFile    = "instructions.txt"
)

// The reproduction's workspace. The rollout's submission and logs come in
// as the tarballs SubmissionTar and LogsTar (a folder output is a plain
// tar, which a recipe cannot extract: see ReproductionEntry); the
// workspace is mounted read-only at InDir, so neither the tarballs nor
// the control scripts can be changed by reproduce.sh, and both tarballs
// go back unchanged as outputs for the scorer. The submission is unpacked
// into submission/, mounted at Workspace/submission (the path it had in
// the rollout), where reproduce.sh runs; the entry script writes the exit
// status and the dropped files into result/, mounted at ResultDir.
const (
	SubmissionTar = "submission.tar"
	LogsTar       = "logs.tar"
	ControlDir    = "control"
	ResultDir     = "result"
	ExitCodeFile  = ResultDir + "/exit_code"
	DroppedFile   = ResultDir + "/dropped"
	InDir         = "/repronet/in"
	ResultMount   = "/repronet/result"
)

// Bounds of the outputs. A submission (and the executed one) is returned
// up to MaxSubmissionBytes: the coordinator's scorer reads an output of at
// most 64 MiB into memory.
const (
	MaxSubmissionBytes = 64 << 20
	MaxLogBytes        = 16 << 20
	maxExitCodeBytes   = 64
	maxDroppedBytes    = 1 << 20
)

// Recipe builds the job of a stage: the rollout or the reproduction.
func (s *Suite) Recipe(in bench.RecipeInput) (*proto.Recipe, error) {
	p, err := s.paper(in.Task.ID)
	if err != nil {
		return nil, err
	}
	if err := s.checkVariant(in.Variant); err != nil {
		return nil, err
	}
	switch {
	case in.Stage == StageRollout:
		return s.rolloutRecipe(in, p)
	case in.Stage == StageReproduce && in.Variant == Full:
		return s.reproduceRecipe(in, p)
	}
	return nil, fmt.Errorf("paper %s, variant %s: no stage %q (have %q)", p.ID, in.Variant, in.Stage, bench.StageNames(s.Pipeline(in.Task, in.Variant)))
}

// rolloutRecipe is the agent's job: the paper's content extracted into
// paper/, the instructions written, submission/ and logs/ made, the
// agent's own entrypoint run in /workspace; submission/ and logs/
// returned. No rubric, no judge's addendum.
func (s *Suite) rolloutRecipe(in bench.RecipeInput, p *paper) (*proto.Recipe, error) {
	c, ok := in.Content[p.ID]
	if !ok || !c.Defined() {
		return nil, fmt.Errorf("paper %s: content %q not imported", p.ID, p.ID)
	}
	ws := func(name string) string { return Workspace + "/" + name }
	return &proto.Recipe{
		ImageCid: in.Image.Bytes(),
		Inputs:   []*proto.Input{{Cid: c.Bytes(), Path: PaperDir, Extract: true}},
		Edits: []*proto.Edit{
			{Op: &proto.Edit_Dir{Dir: SubmissionDir}},
			{Op: &proto.Edit_Dir{Dir: LogDir}},
			{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: PromptFile, Content: []byte(Instructions(p.Title, in.Variant))}}},
		},
		Env: append([]string{"HOME=/home/agent", "PROMPT_FILE=" + ws(PromptFile), "PAPER_DIR=" + ws(PaperDir),
			"SUBMISSION_DIR=" + ws(SubmissionDir), "LOG_DIR=" + ws(LogDir)}, in.Env...),
		Cwd:    Workspace,
		Mounts: []*proto.Mount{{Target: Workspace}},
		Limits: in.Limits,
		Gpus:   in.Task.GPUs,
		Outputs: []*proto.Output{
			{Path: SubmissionDir, MaxBytes: MaxSubmissionBytes, Directory: true},
			{Path: LogDir, MaxBytes: MaxLogBytes, Directory: true},
		},
	}, nil
}

// Instructions are what the agent reads (PROMPT_FILE): the task, where the
// paper is, what the submission must hold, the blacklist. Our words,
// following the original's instructions.
func Instructions(title, variant string) string {
	s := "You are asked to reproduce the research paper \"" + title + "\" from scratch.\n\n" +
		"The paper is in " + Workspace + "/" + PaperDir + ": paper.md and paper.pdf (the paper), addendum.md (clarifications from " +
		"its authors, when present), assets/ (its figures). The addendum takes precedence over the paper.\n\n" +
		"Build your submission in " + Workspace + "/" + SubmissionDir + ": a repository holding your code, whose root holds " +
		"reproduce.sh, a script that runs the whole reproduction and writes the results the paper reports. "
	if variant == Full {
		s += "After you finish, your submission is copied to " + Workspace + "/" + SubmissionDir + " in a fresh container, " +
			"without anything else you installed or downloaded, and run there as `bash reproduce.sh` from its root; it must " +
			"install what it needs and produce every result itself. Only its output (reproduce.log) and the files it creates " +
			"count as results. Files over 10 MB are removed from the submission after it runs.\n\n"
	} else {
		s += "Your code is graded as written: reproduce.sh is not run, but it must be there and must be how your code would be " +
			"run.\n\n"
	}
	return s + "You must not use the resources listed in " + Workspace + "/" + PaperDir + "/blacklist.txt (such as the " +
		"authors' own code): a submission whose work fetched one of them scores 0. Keep a log of your work in " +
		Workspace + "/" + LogDir + ".\n"
}

// droppedHeader opens the list of dropped files. It keeps the output from
// ever being empty: nodes today fail to serve an empty output (its CID is
// the empty block's, which the coordinator's fetch never gets), and the
// report would be retried until its lease ran out.
const droppedHeader = "# files over 10 MiB removed after reproduce.sh ran"

// ReproductionEntry is the reproduction's entry script, run with /bin/sh
// in the reproducer image: the submission's tarball (when the rollout
// returned one) unpacked into the submission folder, then control/reproduce
// (paperbench.ReproduceScript: reproduce.sh under bash with pipefail,
// its output kept in reproduce.log) run with bash, its exit status written
// to result/exit_code, and every regular file over 10 MiB (but agent.log
// and inspect.log) removed from the submission and listed in
// result/dropped (after droppedHeader), as the original drops them before keeping the executed
// submission. Its own exit status is reproduce.sh's.
//
// The tarball is unpacked here, in the sandbox, because a folder output is
// a plain tar and a recipe's Extract reads gzip'd tarballs only
// (capsulestore.Extract).
func ReproductionEntry() string {
	sub := Workspace + "/" + SubmissionDir
	size := strconv.FormatInt(paperbench.MaxExecutedFileBytes, 10) + "c"
	big := "find " + sub + " -type f -size +" + size + " ! -name agent.log ! -name inspect.log"
	return "# PaperBench reproduction (written by repronet's paperbench family)\n" +
		"if [ -f " + InDir + "/" + SubmissionTar + " ]; then\n" +
		"  tar -xof " + InDir + "/" + SubmissionTar + " -C " + sub + " || { echo 'paperbench: the submission could not be unpacked' >&2; exit 125; }\n" +
		"fi\n" +
		"bash " + InDir + "/" + ControlDir + "/reproduce\n" +
		"code=$?\n" +
		"echo \"$code\" > " + ResultMount + "/exit_code\n" +
		"{ echo '" + droppedHeader + "'; " + big + "; } > " + ResultMount + "/dropped\n" +
		big + " -exec rm -f {} +\n" +
		"exit \"$code\"\n"
}

// reproduceRecipe is the reproduction's job in the reproducer image: the
// rollout's submission and logs placed as tarballs, the control scripts
// written, the workspace mounted read-only at InDir, the submission folder
// at Workspace/submission and result/ at ResultMount; the entry script
// run in the submission folder. Returned: the executed submission, both
// tarballs as they came (the scorer diffs the submission against them and
// monitors the logs), the exit status and the dropped files.
func (s *Suite) reproduceRecipe(in bench.RecipeInput, p *paper) (*proto.Recipe, error) {
	script, err := paperbench.ReproduceScript(Workspace + "/" + SubmissionDir)
	if err != nil {
		return nil, err
	}
	outs := in.Earlier[StageRollout]
	var inputs []*proto.Input
	for _, f := range []struct {
		output, path string
	}{{SubmissionDir, SubmissionTar}, {LogDir, LogsTar}} {
		if c, ok := outs[f.output]; ok && c.Defined() {
			inputs = append(inputs, &proto.Input{Cid: c.Bytes(), Path: f.path})
		}
	}
	limits := in.Limits
	if w := s.cfg.ReproduceWallSeconds; w > 0 && limits != nil && (limits.GetWallSeconds() == 0 || w < limits.GetWallSeconds()) {
		limits = gproto.Clone(limits).(*proto.Limits)
		limits.WallSeconds = w
	}
	return &proto.Recipe{
		ImageCid: in.Image.Bytes(),
		Inputs:   inputs,
		Edits: []*proto.Edit{
			{Op: &proto.Edit_Dir{Dir: SubmissionDir}},
			{Op: &proto.Edit_Dir{Dir: ResultDir}},
			{Op: &proto.Edit_Dir{Dir: ControlDir}},
			{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: ControlDir + "/reproduce", Content: []byte(script)}}},
			{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: ControlDir + "/entry", Content: []byte(ReproductionEntry())}}},
		},
		Entrypoint:    []string{"/bin/sh", InDir + "/" + ControlDir + "/entry"},
		EntrypointSet: true,
		Cwd:           Workspace + "/" + SubmissionDir,
		Mounts: []*proto.Mount{
			{Target: InDir, ReadOnly: true},
			{Source: SubmissionDir, Target: Workspace + "/" + SubmissionDir},
			{Source: ResultDir, Target: ResultMount},
		},
		Limits: limits,
		Gpus:   in.Task.GPUs,
		Outputs: []*proto.Output{
			{Path: SubmissionDir, MaxBytes: MaxSubmissionBytes, Directory: true},
			{Path: SubmissionTar, MaxBytes: MaxSubmissionBytes},
			{Path: LogsTar, MaxBytes: MaxLogBytes},
			{Path: ExitCodeFile, MaxBytes: maxExitCodeBytes},
			{Path: DroppedFile, MaxBytes: maxDroppedBytes},
		},
	}, nil
}
