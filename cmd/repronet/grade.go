package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/repronet/repronet/bench/corebench"
	"github.com/repronet/repronet/bench/heureka"
	"github.com/repronet/repronet/bench/paperbench"
)

// runGrade re-grades offline, from a score's inputs: CORE-Bench (the
// default, or "grade corebench ..."), "grade paperbench ..." and
// "grade heureka ...".
func runGrade(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "corebench":
			return runGradeCoreBench(ctx, args[1:], stdout, stderr)
		case "paperbench":
			return runGradePaperBench(args[1:], stdout, stderr)
		case "heureka", "heurekabench":
			return runGradeHeureka(args[1:], stdout, stderr)
		}
	}
	return runGradeCoreBench(ctx, args, stdout, stderr)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// paperGrade is one grader's score of a paper, as "grade paperbench"
// prints it.
type paperGrade struct {
	Grader paperbench.Grader       `json:"grader"`
	Score  float64                 `json:"score"`
	Valid  bool                    `json:"valid"`
	Leaves int                     `json:"leaves"`
	Failed []paperbench.FailedLeaf `json:"failed"`
	// Tree is the scored tree, with --tree.
	Tree *paperbench.ScoredNode `json:"tree,omitempty"`
}

func runGradePaperBench(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("grade paperbench", "grade paperbench --rubric rubric.json --grades GRADES [--code-dev] [--grader NAME] [--tree]", stderr)
	rubricPath := fs.String("rubric", "", "the paper's rubric.json (PaperBench's published tree)")
	gradesPath := fs.String("grades", "", "the leaves' grades: a verdict's \"grading\" list, {leaf id: 0|1 | {score, failed, reason}}, or the original grader's graded tree")
	codeDev := fs.Bool("code-dev", false, "score the Code-Dev variant's tree (Code Development leaves only)")
	grader := fs.String("grader", "", "one grader (default: every grader): "+joinNames(paperbench.Graders()))
	tree := fs.Bool("tree", false, "print the scored tree too")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *rubricPath == "" || *gradesPath == "" {
		fs.Usage()
		return errors.New("--rubric and --grades are required")
	}
	data, err := os.ReadFile(*rubricPath)
	if err != nil {
		return err
	}
	root, err := paperbench.ParseRubric(data)
	if err != nil {
		return fmt.Errorf("%s: %w", *rubricPath, err)
	}
	if *codeDev {
		root = paperbench.CodeDev(root)
	}
	data, err = os.ReadFile(*gradesPath)
	if err != nil {
		return err
	}
	grades, err := paperbench.ParseLeafGrades(data)
	if err != nil {
		return fmt.Errorf("%s: %w", *gradesPath, err)
	}
	graders := paperbench.Graders()
	if *grader != "" {
		graders = []paperbench.Grader{paperbench.Grader(*grader)}
	}
	var out []paperGrade
	for _, g := range graders {
		r, err := paperbench.Score(root, grades, g)
		if err != nil {
			return fmt.Errorf("grade %s with %s: %w", *gradesPath, *rubricPath, err)
		}
		pg := paperGrade{Grader: g, Score: r.Score, Valid: r.Valid, Leaves: r.Leaves, Failed: r.Failed}
		if pg.Failed == nil {
			pg.Failed = []paperbench.FailedLeaf{}
		}
		if *tree {
			pg.Tree = r.Tree
		}
		out = append(out, pg)
	}
	return writeJSON(stdout, out)
}

func joinNames[T ~string](names []T) string {
	s := make([]string, len(names))
	for i, n := range names {
		s[i] = string(n)
	}
	return strings.Join(s, ", ")
}

func runGradeHeureka(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("grade heureka", "grade heureka --questions mcq.json (--finals FILE | --answers FILE) | --questions oeq.json --judge FILE [--grader NAME] [--per-question]", stderr)
	questionsPath := fs.String("questions", "", "HeurekaBench question file as published (mcq.json, oeq.json or their _lite versions)")
	finalsPath := fs.String("finals", "", "MCQ: the agents' final messages, {paper: {insight: {QuestionN: message}}}")
	answersPath := fs.String("answers", "", "MCQ: the extracted answers, as the published processed_results.json")
	judgePath := fs.String("judge", "", "OEQ: the judge's answers, {paper: {insight: {QuestionN: text | {content, logprobs} | chat completion}}}")
	grader := fs.String("grader", "", "one grader or scorer (default: every one): "+joinNames(heureka.MCQGraders())+", "+joinNames(heureka.OEQScorers()))
	perQuestion := fs.Bool("per-question", false, "print every question's score too")
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := 0
	for _, p := range []string{*finalsPath, *answersPath, *judgePath} {
		if p != "" {
			given++
		}
	}
	if *questionsPath == "" || given != 1 {
		fs.Usage()
		return errors.New("--questions and one of --finals, --answers or --judge are required")
	}
	qdata, err := os.ReadFile(*questionsPath)
	if err != nil {
		return err
	}
	if *judgePath != "" {
		qs, err := heureka.ParseOEQFile(qdata)
		if err != nil {
			return fmt.Errorf("%s: not an open-ended question file: %w", *questionsPath, err)
		}
		data, err := os.ReadFile(*judgePath)
		if err != nil {
			return err
		}
		judged, err := heureka.ParseJudgeAnswers(data)
		if err != nil {
			return fmt.Errorf("%s: %w", *judgePath, err)
		}
		scorers := heureka.OEQScorers()
		if *grader != "" {
			scorers = []heureka.OEQScorer{heureka.OEQScorer(*grader)}
		}
		out, err := heureka.RegradeOEQ(qs, judged, scorers)
		if err != nil {
			return fmt.Errorf("grade %s: %w", *judgePath, err)
		}
		if !*perQuestion {
			for i := range out {
				out[i].Scores = nil
			}
		}
		return writeJSON(stdout, out)
	}
	qs, err := heureka.ParseMCQFile(qdata)
	if err != nil {
		return fmt.Errorf("%s: not a multiple-choice question file: %w", *questionsPath, err)
	}
	path, finals := *answersPath, false
	if *finalsPath != "" {
		path, finals = *finalsPath, true
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	texts, err := heureka.ParseTexts(data)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	graders := heureka.MCQGraders()
	if *grader != "" {
		graders = []heureka.MCQGrader{heureka.MCQGrader(*grader)}
	}
	out, err := heureka.RegradeMCQ(qs, texts, finals, graders)
	if err != nil {
		return fmt.Errorf("grade %s: %w", path, err)
	}
	if !*perQuestion {
		for i := range out {
			out[i].Outcomes = nil
		}
	}
	return writeJSON(stdout, out)
}

func runGradeCoreBench(_ context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("grade", "grade [corebench] --tasks FILE --capsule ID --report report.json [--grader NAME] [--passphrase P]\n"+
		"       repronet grade paperbench --rubric rubric.json --grades GRADES ...\n"+
		"       repronet grade heureka --questions FILE (--finals | --answers | --judge) FILE ...", stderr)
	tasksPath := fs.String("tasks", "", "CORE-Bench task file (JSON, or OpenPGP-encrypted with --passphrase)")
	capsule := fs.String("capsule", "", "capsule ID of the task, e.g. capsule-7038571")
	reportPath := fs.String("report", "", "the agent's report.json")
	grader := fs.String("grader", corebench.OriginalGraderName, "grader: "+strings.Join(corebench.GraderNames(), ", "))
	stripRule := fs.String("strip-rule", corebench.OriginalStripRuleName, "strip rule the attempt ran under, recorded in the verdict: "+strings.Join(corebench.StripRuleNames(), ", "))
	passphrase := fs.String("passphrase", "", "passphrase of an OpenPGP task file (CORE-Bench's test split: reproducibility)")
	passphraseFile := fs.String("passphrase-file", "", "file holding the passphrase of an OpenPGP task file")
	allowGPU := fs.Bool("allow-gpu-key", false, `accept HAL's extra "gpu" key in task entries`)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *tasksPath == "" || *capsule == "" || *reportPath == "" {
		fs.Usage()
		return errors.New("--tasks, --capsule and --report are required")
	}
	pass := []byte(*passphrase)
	if *passphraseFile != "" {
		b, err := os.ReadFile(*passphraseFile)
		if err != nil {
			return fmt.Errorf("--passphrase-file: %w", err)
		}
		pass = corebench.Passphrase(b)
	}
	data, err := os.ReadFile(*tasksPath)
	if err != nil {
		return err
	}
	tasks, err := corebench.LoadTasks(data, corebench.LoadOptions{Passphrase: pass, Parse: corebench.ParseOptions{AllowGPUKey: *allowGPU}})
	if err != nil {
		return fmt.Errorf("%s: %w", *tasksPath, err)
	}
	report, err := os.ReadFile(*reportPath)
	if err != nil {
		return err
	}
	g, rule, _, err := corebench.LookupScoring(*grader, *stripRule)
	if err != nil {
		return err
	}
	for _, t := range tasks {
		if t.CapsuleID != *capsule {
			continue
		}
		v, err := corebench.GradeWith(g, rule, t, report)
		if err != nil {
			return fmt.Errorf("grade %s: %w", *reportPath, err)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(v)
	}
	return fmt.Errorf("%s has no task for capsule %q", *tasksPath, *capsule)
}
