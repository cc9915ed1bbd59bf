package repro

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/repronet/repronet/bench/corebench"
)

// Capsule describes the capsule as a CORE-Bench task entry does.
type Capsule struct {
	Field        string `json:"field"`
	Language     string `json:"language"`
	CapsuleTitle string `json:"capsule_title"`
	CapsuleID    string `json:"capsule_id"`
	CapsuleDOI   string `json:"capsule_doi"`
	// TaskPrompt is what an agent is asked to do ("Run main.py ..."),
	// for the task entry.
	TaskPrompt string `json:"task_prompt"`
}

// Spec is what a submitter asks for.
type Spec struct {
	Capsule Capsule `json:"capsule"`
	// Rules say where each question's answer is; none: a draft check (the
	// runs' results/ folders compared value by value, DraftEntry).
	Rules []Rule `json:"rules"`
	// Runs is K, the runs wanted on distinct nodes (at least 2; 3 like
	// CORE-Bench's gold runs by default).
	Runs int `json:"runs"`
	// MaxRelativeWidth, when above 0, also calls a numeric answer not
	// reproduced when its prediction interval is wider than this share of
	// the mean's magnitude.
	MaxRelativeWidth float64 `json:"max_relative_width,omitempty"`
}

// DefaultRuns is K when the spec leaves it 0.
const DefaultRuns = 3

// Validate checks the spec, naming the field.
func (s Spec) Validate() error {
	if s.Runs != 0 && s.Runs < 2 {
		return fmt.Errorf("spec: field runs: %d, want at least 2 (one run has no prediction interval)", s.Runs)
	}
	if !(s.MaxRelativeWidth >= 0) || math.IsInf(s.MaxRelativeWidth, 0) {
		return fmt.Errorf("spec: field max_relative_width: %v", s.MaxRelativeWidth)
	}
	t := corebench.Task{Field: s.Capsule.Field, Language: s.Capsule.Language, CapsuleTitle: s.Capsule.CapsuleTitle,
		CapsuleID: s.Capsule.CapsuleID, CapsuleDOI: s.Capsule.CapsuleDOI, TaskPrompt: s.Capsule.TaskPrompt,
		Results: []corebench.Answers{{}}}
	if err := validateEntry(t); err != nil {
		return fmt.Errorf("spec: field capsule: %w", err)
	}
	if len(s.Rules) == 0 {
		return nil // a draft check (DraftEntry)
	}
	return ValidateRules(s.Rules)
}

// Draft reports whether the spec is a draft check: no rules, so the runs
// return their results/ folder and the report drafts the task entry.
func (s Spec) Draft() bool { return len(s.Rules) == 0 }

// Run is one run of the capsule's run script on one node.
type Run struct {
	Node string `json:"node"`
	// Outcome is the sandbox's outcome: "ok", or why the script failed
	// ("agent_error" for a non-zero exit, "timeout", "oom", ...).
	// Infrastructure failures are rerun by the coordinator, never passed.
	Outcome string `json:"outcome"`
	// Files are the rule files the run produced (path -> content); a file
	// the run did not produce is absent.
	Files map[string][]byte `json:"files"`
}

// Question is what became of one question.
type Question struct {
	Question string `json:"question"`
	// Kind is numeric, string or list, as CORE-Bench's grader sees it.
	Kind string `json:"kind,omitempty"`
	// Values per successful run, in run order (absent when extraction
	// failed in that run; see Errors).
	Values []*corebench.Value `json:"values"`
	Errors []string           `json:"errors,omitempty"`
	// Interval is the 95% prediction interval of a numeric answer over the
	// runs, computed exactly as CORE-Bench's grader does.
	Interval *Interval `json:"interval,omitempty"`
	// Claimed is the answer the capsule's own files (as submitted) give,
	// when they were supplied.
	Claimed      *corebench.Value `json:"claimed,omitempty"`
	ClaimedError string           `json:"claimed_error,omitempty"`
	Reproduced   bool             `json:"reproduced"`
	Reason       string           `json:"reason"`
}

// Interval is a prediction interval in JSON-friendly form.
type Interval struct {
	N     int     `json:"n"`
	Mean  float64 `json:"mean"`
	Std   float64 `json:"std"`
	Lower float64 `json:"lower"`
	Upper float64 `json:"upper"`
}

// Report is the outcome of a reproducibility check.
type Report struct {
	// Task is the CORE-Bench task entry: one gold run per successful run,
	// with every question that was extracted in all of them with one kind
	// of answer. It passes corebench's validation and can join a task file.
	Task corebench.Task `json:"task"`
	// Questions in the order of the rules.
	Questions []Question `json:"questions"`
	// Runs counts successful runs; FailedRuns lists the others by node
	// and outcome.
	Runs       int      `json:"runs"`
	FailedRuns []string `json:"failed_runs,omitempty"`
	// NotReproduced lists the questions that did not reproduce.
	NotReproduced []string `json:"not_reproduced"`
	// Reproducible: every run succeeded and every question reproduced
	// (a draft: no value was flagged, and the runs reproduce every value
	// the capsule published).
	Reproducible bool `json:"reproducible"`
	// Draft is a draft check's (a spec without rules): every value found
	// in the runs' results/ with its verdict; Task is then the draft entry
	// and NotReproduced the flagged values' questions.
	Draft *Draft `json:"draft,omitempty"`
}

// Check turns the runs into a report. claimed, when not nil, holds the
// capsule's files as submitted (its results/ folder holds the author's
// outputs). A draft check compares every value found with the one
// published at the same place (ComparePublished). Otherwise each rule is
// applied to them too, and a question reproduces
// only when that claimed answer passes CORE-Bench's grading against the
// runs: a number inside the runs' prediction interval, a string or list
// equal to the runs'. Without claimed files a question reproduces when it
// was extracted in every run with one kind of answer, strings and lists
// are the same in every run, and (with MaxRelativeWidth) numbers vary
// little enough. An error means there is nothing to report: an invalid
// spec, or fewer than 2 successful runs.
func Check(spec Spec, runs []Run, claimed map[string][]byte) (Report, error) {
	if err := spec.Validate(); err != nil {
		return Report{}, err
	}
	var ok []Run
	rep := Report{NotReproduced: []string{}}
	for i, r := range runs {
		if r.Outcome == "ok" {
			ok = append(ok, r)
		} else {
			rep.FailedRuns = append(rep.FailedRuns, fmt.Sprintf("run %d on %s: %s", i+1, r.Node, r.Outcome))
		}
	}
	rep.Runs = len(ok)
	if spec.Draft() {
		d, task, err := DraftEntry(spec.Capsule, runs)
		if err != nil {
			return Report{}, fmt.Errorf("reproducibility check of %s: %w", spec.Capsule.CapsuleID, err)
		}
		ComparePublished(&d, ok, claimed)
		rep.Task, rep.Draft = task, &d
		for _, v := range d.Values {
			if !v.Kept() || v.Comparison == PublishedNotReproduced {
				rep.NotReproduced = append(rep.NotReproduced, v.Question)
			}
		}
		for _, f := range d.Unproduced {
			rep.NotReproduced = append(rep.NotReproduced, "published file "+f+": written by no run")
		}
		rep.Reproducible = len(rep.NotReproduced) == 0 && len(rep.FailedRuns) == 0
		return rep, nil
	}
	if len(ok) < 2 {
		return Report{}, fmt.Errorf("reproducibility check of %s: %d successful runs of %d, at least 2 are needed", spec.Capsule.CapsuleID, len(ok), len(runs))
	}
	c := spec.Capsule
	rep.Task = corebench.Task{Field: c.Field, Language: c.Language, CapsuleTitle: c.CapsuleTitle, CapsuleID: c.CapsuleID,
		CapsuleDOI: c.CapsuleDOI, TaskPrompt: c.TaskPrompt, Results: make([]corebench.Answers, len(ok))}
	for i := range rep.Task.Results {
		rep.Task.Results[i] = corebench.Answers{}
	}
	grader := corebench.NewOriginal()
	for _, rule := range spec.Rules {
		q := Question{Question: rule.Question, Values: make([]*corebench.Value, len(ok))}
		failed := 0
		for i, r := range ok {
			v, err := Extract(rule, r.Files)
			if err != nil {
				q.Errors = append(q.Errors, fmt.Sprintf("run %d (%s): %v", i+1, r.Node, err))
				failed++
				continue
			}
			q.Values[i] = &v
		}
		if claimed != nil {
			if v, err := Extract(rule, claimed); err != nil {
				q.ClaimedError = err.Error()
			} else {
				q.Claimed = &v
			}
		}
		judge(&q, failed, spec)
		if q.Kind != "" {
			for i, v := range q.Values {
				rep.Task.Results[i] = append(rep.Task.Results[i], corebench.Answer{Question: rule.Question, Value: *v})
			}
		}
		rep.Questions = append(rep.Questions, q)
	}
	// Grade each claimed answer exactly as the original grader would, on
	// the entry the runs make (one question at a time, so that one odd
	// answer cannot stop the grading of the others).
	if claimed != nil {
		for i := range rep.Questions {
			q := &rep.Questions[i]
			if q.Kind == "" || !q.Reproduced {
				continue
			}
			if q.Claimed == nil {
				q.Reproduced, q.Reason = false, "the submitted files give no answer: "+q.ClaimedError
				continue
			}
			data, err := json.Marshal(corebench.Answers{{Question: q.Question, Value: *q.Claimed}})
			if err != nil {
				return Report{}, fmt.Errorf("reproducibility check of %s: %w", c.CapsuleID, err)
			}
			v, err := grader.Grade(rep.Task, data)
			if err != nil {
				return Report{}, fmt.Errorf("reproducibility check of %s: %w", c.CapsuleID, err)
			}
			for _, qr := range v.Questions {
				if qr.Question != q.Question {
					continue
				}
				if qr.Correct {
					q.Reason += "; the submitted answer passes CORE-Bench's grading against the runs"
				} else {
					q.Reproduced = false
					q.Reason = "the submitted answer does not pass CORE-Bench's grading against the runs"
					if qr.Note != "" {
						q.Reason += ": " + qr.Note
					}
				}
			}
		}
	}
	if err := validateEntry(rep.Task); err != nil {
		return Report{}, fmt.Errorf("reproducibility check of %s: the task entry is invalid: %w", c.CapsuleID, err)
	}
	for _, q := range rep.Questions {
		if !q.Reproduced {
			rep.NotReproduced = append(rep.NotReproduced, q.Question)
		}
	}
	rep.Reproducible = len(rep.NotReproduced) == 0 && len(rep.FailedRuns) == 0
	return rep, nil
}

// judge decides a question from its values across runs (before any
// claimed answer is graded); Kind stays empty when the question cannot be
// part of the task entry.
func judge(q *Question, failed int, spec Spec) {
	if failed > 0 {
		q.Reason = fmt.Sprintf("not extracted in %d of %d runs", failed, len(q.Values))
		return
	}
	kind := ""
	for i, v := range q.Values {
		k := kindOf(*v)
		if i == 0 {
			kind = k
		} else if k != kind {
			q.Reason = fmt.Sprintf("a %s answer in run 1 but a %s answer in run %d", kind, k, i+1)
			return
		}
	}
	first := *q.Values[0]
	switch kind {
	case corebench.QuestionNumeric:
		xs := make([]float64, len(q.Values))
		for i, v := range q.Values {
			xs[i] = v.Num
		}
		iv := corebench.PredictionInterval(xs)
		q.Interval = &Interval{N: iv.N, Mean: iv.Mean, Std: iv.Std, Lower: iv.Lower, Upper: iv.Upper}
		q.Kind = kind
		q.Reproduced, q.Reason = true, "extracted in every run"
		if iv.Lower == iv.Upper {
			q.Reason = "the same number in every run"
		}
		if spec.MaxRelativeWidth > 0 && iv.Upper-iv.Lower > spec.MaxRelativeWidth*math.Abs(iv.Mean) {
			q.Reproduced = false
			q.Reason = fmt.Sprintf("the prediction interval [%g, %g] is wider than %g of the mean", iv.Lower, iv.Upper, spec.MaxRelativeWidth)
		}
	default:
		for i, v := range q.Values[1:] {
			if !v.Equal(first) || v.String() != first.String() {
				q.Reason = fmt.Sprintf("run %d gives %s, run 1 gives %s", i+2, clip(v.Repr()), clip(first.Repr()))
				return // a string or list question needs one answer: not in the entry
			}
		}
		q.Kind = kind
		q.Reproduced, q.Reason = true, "the same answer in every run"
	}
}

func kindOf(v corebench.Value) string {
	switch v.Kind {
	case corebench.Number, corebench.Bool:
		return corebench.QuestionNumeric
	case corebench.String:
		return corebench.QuestionString
	case corebench.List:
		return corebench.QuestionList
	}
	return v.Kind.String()
}

// Status is a coordinator's answer about one reproducibility check (GET
// /api/repro/{id}).
type Status struct {
	ID string `json:"id"`
	// State is queued, running, done or failed.
	State      string  `json:"state"`
	RunsDone   int     `json:"runs_done"`
	RunsWanted int     `json:"runs_wanted"`
	Report     *Report `json:"report,omitempty"`
	Error      string  `json:"error,omitempty"`
	// Waiting says why runs wait that no node can run (the coordinator's
	// words, one line per reason).
	Waiting []string `json:"waiting,omitempty"`
	// Capsule names the capsule; Runs are the runs with links to their
	// pages and logs; FailedBecause says why each failed run failed.
	Capsule struct {
		ID    string `json:"id"`
		Title string `json:"title,omitempty"`
	} `json:"capsule"`
	Runs []struct {
		Run        int    `json:"run"`
		Attempt    string `json:"attempt,omitempty"`
		Page       string `json:"page,omitempty"`
		Logs       string `json:"logs,omitempty"`
		State      string `json:"state"`
		Outcome    string `json:"outcome,omitempty"`
		Failed     bool   `json:"failed,omitempty"`
		ExitCode   *int32 `json:"exit_code,omitempty"`
		StderrTail string `json:"stderr_tail,omitempty"`
		Detail     string `json:"detail,omitempty"`
	} `json:"runs,omitempty"`
	FailedBecause []string `json:"failed_because,omitempty"`
}

// Status states.
const (
	StateQueued  = "queued"
	StateRunning = "running"
	StateDone    = "done"
	StateFailed  = "failed"
)

// WriteText prints the report for people: each question with its verdict,
// reason and interval, then the verdict on the capsule.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %d successful runs", r.Task.CapsuleID, r.Runs)
	if len(r.FailedRuns) > 0 {
		fmt.Fprintf(&b, ", %d failed (%s)", len(r.FailedRuns), strings.Join(r.FailedRuns, "; "))
	}
	b.WriteString("\n")
	if r.Draft != nil {
		writeDraft(&b, *r.Draft)
	}
	for _, q := range r.Questions {
		mark := "reproduced    "
		if !q.Reproduced {
			mark = "NOT reproduced"
		}
		fmt.Fprintf(&b, "  %s  %s\n", mark, q.Question)
		if q.Interval != nil {
			fmt.Fprintf(&b, "      95%% prediction interval [%.10g, %.10g] (mean %.10g over %d runs)\n", q.Interval.Lower, q.Interval.Upper, q.Interval.Mean, q.Interval.N)
		}
		if q.Claimed != nil {
			fmt.Fprintf(&b, "      submitted answer %s\n", clip(q.Claimed.Repr()))
		}
		fmt.Fprintf(&b, "      %s\n", q.Reason)
		for _, e := range q.Errors {
			fmt.Fprintf(&b, "      %s\n", e)
		}
	}
	if r.Draft != nil {
		fmt.Fprintf(&b, "draft entry: %d values kept, %d flagged (the draft's spec, with --json, checks them with rules once edited)\n",
			len(r.Draft.Spec.Rules), len(r.NotReproduced))
		if r.Draft.Published > 0 {
			if n := len(r.Draft.NotReproducedPublished()); n > 0 {
				fmt.Fprintf(&b, "the capsule's published results are NOT reproduced: %d published value(s) or file(s) not reproduced\n", n)
			} else {
				b.WriteString("the runs reproduce every value the capsule published\n")
			}
		} else {
			b.WriteString("the capsule published no results/ to compare with\n")
		}
	} else if r.Reproducible {
		b.WriteString("the capsule reproduces\n")
	} else {
		fmt.Fprintf(&b, "the capsule does not fully reproduce: %d of %d questions did not", len(r.NotReproduced), len(r.Questions))
		if len(r.FailedRuns) > 0 {
			b.WriteString(", and some runs failed")
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeDraft prints a draft's values: kept ones, then flagged ones.
func writeDraft(b *strings.Builder, d Draft) {
	for _, kept := range []bool{true, false} {
		for _, v := range d.Values {
			if v.Kept() != kept {
				continue
			}
			mark := "kept   "
			if !kept {
				mark = "FLAGGED"
			}
			fmt.Fprintf(b, "  %s  %-9s %s\n", mark, v.Verdict, v.Question)
			fmt.Fprintf(b, "      runs: %s\n", clip(strings.Join(v.Values, ", ")))
			if v.Interval != nil && kept {
				fmt.Fprintf(b, "      95%% prediction interval [%.10g, %.10g] (mean %.10g over %d runs)\n", v.Interval.Lower, v.Interval.Upper, v.Interval.Mean, v.Interval.N)
			}
			fmt.Fprintf(b, "      %s\n", v.Reason)
			switch v.Comparison {
			case PublishedReproduced:
				fmt.Fprintf(b, "      published %s: reproduced (%s)\n", clip(v.Published), v.ComparisonReason)
			case PublishedNotReproduced:
				fmt.Fprintf(b, "      published %s: NOT reproduced (%s)\n", clip(v.Published), v.ComparisonReason)
			}
		}
	}
	for _, f := range d.Unproduced {
		fmt.Fprintf(b, "  NOT reproduced: published file %s is written by no run\n", f)
	}
	for _, t := range d.Truncated {
		fmt.Fprintf(b, "  not read whole: %s\n", t)
	}
}

// MaxFolderName bounds a capsule's folder name.
const MaxFolderName = 128

// CheckFolderName checks a capsule's folder name, the spec's capsule_id
// and the tarball's one top folder: 1 to MaxFolderName letters, digits,
// '.', '_' or '-', starting with a letter or digit (so never "." or ".."
// and never a path). CodeOcean's "capsule-1234567" is one such name;
// "my-analysis" or "rnaseq_2024.v2" are others.
func CheckFolderName(name string) error {
	ok := name != "" && len(name) <= MaxFolderName
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '.' || c == '_' || c == '-')
	}
	if !ok {
		return fmt.Errorf("capsule_id %q: want the capsule's folder name, the one top folder of its tarball: 1 to %d letters, digits, '.', '_' or '-', starting with a letter or digit (e.g. capsule-1234567 or my-analysis)", name, MaxFolderName)
	}
	return nil
}

// validateEntry validates a task entry as CORE-Bench's Task.Validate does,
// except that its capsule ID may be any folder name CheckFolderName
// accepts (CORE-Bench's task files want "capsule-" and digits; a
// scientist's capsule need not come from CodeOcean).
func validateEntry(t corebench.Task) error {
	if err := CheckFolderName(t.CapsuleID); err != nil {
		return err
	}
	id := t.CapsuleID
	t.CapsuleID = "capsule-0" // checked above
	if err := t.Validate(0); err != nil {
		return errors.New(strings.ReplaceAll(err.Error(), "capsule-0", id))
	}
	return nil
}
