package family

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/paperbench"
	"github.com/repronet/repronet/capsulestore"
)

// Public is what a reader of a leaderboard sees of a scored job: the
// figures of its board, never a leaf's requirement or explanation.
type Public struct {
	Stage string `json:"stage"`
	// Submitted: the rollout returned a submission holding a file;
	// ReproduceSH: with reproduce.sh at its root.
	Submitted   bool `json:"submitted"`
	ReproduceSH bool `json:"reproduce_sh"`
	// Reproduction is the reproduction stage's (full variant only).
	Reproduction *Reproduction `json:"reproduction,omitempty"`
	// Disqualified: the monitor found a fetch of a blacklisted resource;
	// every leaf scores 0 and no judge was asked.
	Disqualified bool `json:"disqualified,omitempty"`
	// Leaves counts the leaves of the tree graded (the Code-Dev tree for
	// code-dev), Judged those a judge graded, Auto those graded without
	// one (Result Analysis leaves with no changed file to see, every leaf
	// of an empty or disqualified submission).
	Leaves int `json:"leaves"`
	Judged int `json:"judged"`
	Auto   int `json:"auto"`
	// Scores are the paper's score under each grader (GraderReportFailed
	// first), with its failed leaves.
	Scores []GraderScore `json:"scores,omitempty"`
	// Judge is what the judging cost; Agreement the leaves judged twice.
	Judge     JudgeUse       `json:"judge"`
	Agreement AgreementTable `json:"agreement"`
}

// Reproduction is what a public reader sees of the reproduction.
type Reproduction struct {
	// Outcome is the job's (ok, agent_error when reproduce.sh failed,
	// timeout...). ExitCode is reproduce.sh's exit status (nil: unknown,
	// e.g. killed at the wall-clock limit).
	Outcome  string `json:"outcome"`
	ExitCode *int   `json:"exit_code,omitempty"`
	// Executed: the executed submission came back (else the submission as
	// submitted is judged, with nothing reproduced).
	Executed bool `json:"executed"`
	// Changed counts the files the reproduction added or modified, Dropped
	// those removed for being over 10 MiB.
	Changed int `json:"changed"`
	Dropped int `json:"dropped"`
}

// GraderScore is a paper's score under one grader.
type GraderScore struct {
	Grader paperbench.Grader `json:"grader"`
	Score  float64           `json:"score"`
	Valid  bool              `json:"valid"`
	// Failed counts the leaves whose judging failed (the judge's answer
	// was unusable): out of the mean under GraderReportFailed, 0 under
	// GraderSilentZero.
	Failed int `json:"failed"`
}

// Verdict is the family's full record of a scoring: admin eyes only (it
// holds the leaves' judgements).
type Verdict struct {
	Public
	Scoring Scoring `json:"scoring"`
	Outcome string  `json:"outcome"`
	// Detail says what was missing or could not be read, if anything.
	Detail string `json:"detail,omitempty"`
	// Monitor is the blacklist monitor's result, over Sources.
	Monitor paperbench.MonitorResult `json:"monitor"`
	Sources []string                 `json:"sources,omitempty"`
	// Files counts the submission's files; Changed and Dropped list the
	// reproduction's.
	Files   int      `json:"files"`
	Changed []string `json:"changed,omitempty"`
	Dropped []string `json:"dropped,omitempty"`
	// Failed lists the failed leaves; Grading every leaf's grading, in
	// tree order.
	Failed  []paperbench.FailedLeaf `json:"failed,omitempty"`
	Grading []LeafRecord            `json:"grading,omitempty"`
}

// Score scores a job: the rollout of Code-Dev (judged), the rollout of the
// full variant (checked, not judged), or the reproduction (judged).
func (s *Suite) Score(ctx context.Context, in bench.ScoreInput) (bench.Score, error) {
	p, err := s.paper(in.Task.ID)
	if err != nil {
		return bench.Score{}, err
	}
	if err := s.checkVariant(in.Variant); err != nil {
		return bench.Score{}, err
	}
	if in.Output == nil {
		return bench.Score{}, fmt.Errorf("paper %s: no output reader", p.ID)
	}
	switch {
	case in.Stage == StageRollout && in.Variant == CodeDev:
		return s.scoreCodeDev(ctx, in, p)
	case in.Stage == StageRollout:
		return s.scoreRollout(ctx, in, p)
	case in.Stage == StageReproduce && in.Variant == Full:
		return s.scoreReproduction(ctx, in, p)
	}
	return bench.Score{}, fmt.Errorf("paper %s, variant %s: no stage %q", p.ID, in.Variant, in.Stage)
}

// output reads one output: its bytes and true, or false when the job did
// not return it (its doing), or an error (the core's trouble).
func output(ctx context.Context, in bench.ScoreInput, path string) ([]byte, bool, error) {
	b, err := in.Output(ctx, path)
	switch {
	case errors.Is(err, bench.ErrNotReturned):
		return nil, false, nil
	case err != nil:
		return nil, false, fmt.Errorf("read output %s: %w", path, err)
	}
	return b, true, nil
}

// scoreRollout checks the rollout of the full variant: what it submitted,
// for the record; the reproduction's scorer judges it.
func (s *Suite) scoreRollout(ctx context.Context, in bench.ScoreInput, p *paper) (bench.Score, error) {
	v := s.newVerdict(in, StageRollout)
	w, err := newWorkdir()
	if err != nil {
		return bench.Score{}, err
	}
	defer w.close()
	_, tarball, err := s.readSubmission(ctx, in, w, SubmissionDir, "submission", &v)
	if err != nil {
		return bench.Score{}, err
	}
	logs, ok, err := output(ctx, in, LogDir)
	if err != nil {
		return bench.Score{}, err
	}
	if err := s.monitor(ctx, in, p, logs, ok, &v); err != nil {
		return bench.Score{}, err
	}
	return finish(v, tarball, 0)
}

// scoreCodeDev judges the Code Development leaves of the Code-Dev rubric
// on the rollout's submission, unless the monitor disqualified it.
func (s *Suite) scoreCodeDev(ctx context.Context, in bench.ScoreInput, p *paper) (bench.Score, error) {
	v := s.newVerdict(in, StageRollout)
	logs, ok, err := output(ctx, in, LogDir)
	if err != nil {
		return bench.Score{}, err
	}
	if err := s.monitor(ctx, in, p, logs, ok, &v); err != nil {
		return bench.Score{}, err
	}
	w, err := newWorkdir()
	if err != nil {
		return bench.Score{}, err
	}
	defer w.close()
	dir, tarball, err := s.readSubmission(ctx, in, w, SubmissionDir, "submission", &v)
	if err != nil {
		return bench.Score{}, err
	}
	req := paperbench.JudgeRequest{PaperMD: p.PaperMD, Addendum: joinedAddendum(p), Rubric: p.codeDev, CodeOnly: true,
		Changed: map[string]bool{}}
	if err := s.grade(ctx, in.Models, p.codeDev, req, dir, &v); err != nil {
		return bench.Score{}, err
	}
	return finish(v, tarball, v.value())
}

// scoreReproduction judges every leaf of the rubric on the executed
// submission, Result Analysis leaves seeing only the files the
// reproduction changed (by content hash against the submission as the
// rollout returned it), unless the monitor disqualified it.
func (s *Suite) scoreReproduction(ctx context.Context, in bench.ScoreInput, p *paper) (bench.Score, error) {
	v := s.newVerdict(in, StageReproduce)
	rep := &Reproduction{Outcome: in.Outcome}
	v.Reproduction = rep
	logs, ok, err := output(ctx, in, LogsTar)
	if err != nil {
		return bench.Score{}, err
	}
	if err := s.monitor(ctx, in, p, logs, ok, &v); err != nil {
		return bench.Score{}, err
	}
	code, ok, err := output(ctx, in, ExitCodeFile)
	if err != nil {
		return bench.Score{}, err
	}
	if n, err := strconv.Atoi(strings.TrimSpace(string(code))); ok && err == nil {
		rep.ExitCode = &n
	}
	w, err := newWorkdir()
	if err != nil {
		return bench.Score{}, err
	}
	defer w.close()
	orig, submitted, err := s.readSubmission(ctx, in, w, SubmissionTar, "submission", &v)
	if err != nil {
		return bench.Score{}, err
	}
	exec := w.path("executed")
	tarball, executed, err := output(ctx, in, SubmissionDir)
	if err != nil {
		return bench.Score{}, err
	}
	if executed {
		if err := unpack(ctx, tarball, exec); err != nil {
			v.note("the executed submission could not be read (%v): the submission is judged as submitted", err)
			executed = false
		}
	} else if v.Submitted {
		v.note("the executed submission was not returned: the submission is judged as submitted")
	}
	if !executed {
		// The submission as submitted stands for the executed one.
		tarball = nil
		if err := os.RemoveAll(exec); err != nil {
			return bench.Score{}, err
		}
		if err := unpack(ctx, submitted, exec); err != nil && v.Submitted {
			return bench.Score{}, fmt.Errorf("unpack the submission again: %w", err)
		}
	}
	rep.Executed = executed
	dropped, err := paperbench.DropLargeFiles(exec, paperbench.MaxExecutedFileBytes)
	if err != nil {
		return bench.Score{}, err
	}
	listed, _, err := output(ctx, in, DroppedFile)
	if err != nil {
		return bench.Score{}, err
	}
	v.Dropped = droppedPaths(listed, dropped)
	rep.Dropped = len(v.Dropped)
	before, err := paperbench.TakeSnapshot(orig)
	if err != nil {
		return bench.Score{}, err
	}
	after, err := paperbench.TakeSnapshot(exec)
	if err != nil {
		return bench.Score{}, err
	}
	changed := paperbench.Diff(before, after).Set()
	for c := range changed {
		v.Changed = append(v.Changed, c)
	}
	sort.Strings(v.Changed)
	rep.Changed = len(v.Changed)
	req := paperbench.JudgeRequest{PaperMD: p.PaperMD, Addendum: joinedAddendum(p), Rubric: p.rubric, Changed: changed}
	if err := s.grade(ctx, in.Models, p.rubric, req, exec, &v); err != nil {
		return bench.Score{}, err
	}
	return finish(v, tarball, v.value())
}

// droppedPaths merges the files the entry script listed as dropped (paths
// under the submission folder) with those DropLargeFiles found after it.
func droppedPaths(listed []byte, found []paperbench.DroppedFile) []string {
	set := map[string]bool{}
	prefix := Workspace + "/" + SubmissionDir + "/"
	for _, l := range strings.Split(string(listed), "\n") {
		if l = strings.TrimSpace(l); strings.HasPrefix(l, prefix) {
			set[strings.TrimPrefix(l, prefix)] = true
		}
	}
	for _, f := range found {
		set[f.Path] = true
	}
	out := make([]string, 0, len(set))
	for p := range set {
		out = append(out, p)
	}
	sort.Strings(out)
	return out
}

func joinedAddendum(p *paper) string {
	lp := paperbench.Paper{Addendum: p.Addendum, JudgeAddendum: p.JudgeAddendum}
	return lp.JoinedAddendum()
}

func (s *Suite) newVerdict(in bench.ScoreInput, stage string) Verdict {
	return Verdict{Public: Public{Stage: stage}, Scoring: s.scoring(), Outcome: in.Outcome}
}

func (v *Verdict) note(format string, args ...any) {
	if v.Detail != "" {
		v.Detail += "; "
	}
	v.Detail += fmt.Sprintf(format, args...)
}

// value is the job's score in [0, 1]: the paper's under
// GraderReportFailed.
func (v *Verdict) value() float64 {
	for _, g := range v.Scores {
		if g.Grader == paperbench.GraderReportFailed {
			return g.Score
		}
	}
	return 0
}

// readSubmission unpacks the submission output at path into a folder of
// w named name and records what it holds; a submission not returned or
// unreadable is an empty folder (the job's doing) and a note. It returns
// the folder and the tarball.
func (s *Suite) readSubmission(ctx context.Context, in bench.ScoreInput, w workdir, path, name string, v *Verdict) (string, []byte, error) {
	dir := w.path(name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, err
	}
	tarball, ok, err := output(ctx, in, path)
	if err != nil {
		return "", nil, err
	}
	switch {
	case !ok:
		v.note("no submission returned")
	default:
		if err := unpack(ctx, tarball, dir); err != nil {
			if ctx.Err() != nil {
				return "", nil, ctx.Err()
			}
			v.note("the submission could not be read: %v", err)
			tarball = nil
			if err := os.RemoveAll(dir); err != nil {
				return "", nil, err
			}
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return "", nil, err
			}
		}
	}
	snap, err := paperbench.TakeSnapshot(dir)
	if err != nil {
		return "", nil, err
	}
	for _, e := range snap {
		if e.Kind == paperbench.KindFile {
			v.Files++
		}
	}
	v.Submitted = v.Files > 0
	v.ReproduceSH = snap["reproduce.sh"].Kind == paperbench.KindFile
	return dir, tarball, nil
}

// monitor runs the blacklist monitor over the agent's logs (a tarball of
// the logs folder) and the rollout's model calls (bench.ScoreInput's
// Trajectory, when the coordinator has a gateway).
func (s *Suite) monitor(ctx context.Context, in bench.ScoreInput, p *paper, logs []byte, returned bool, v *Verdict) error {
	var sources []paperbench.Source
	if returned {
		var err error
		if sources, err = tarSources(LogDir+"/", logs, MaxLogBytes); err != nil {
			v.note("the agent's logs could not be read whole: %v", err)
		}
	} else {
		v.note("no agent logs returned")
	}
	// The rollout's model calls, as the gateway recorded them: unlike the
	// logs, the agent cannot leave a fetch out of them.
	if in.Trajectory != nil {
		calls, err := in.Trajectory(ctx, StageRollout)
		if err != nil {
			return fmt.Errorf("paper %s: the rollout's trajectory: %w", p.ID, err)
		}
		for i, c := range calls {
			sources = append(sources,
				paperbench.Source{Name: fmt.Sprintf("trajectory call %d request", i+1), Text: string(c.Request)},
				paperbench.Source{Name: fmt.Sprintf("trajectory call %d response", i+1), Text: string(c.Response)})
		}
	} else {
		v.note("no trajectory to monitor (no gateway)")
	}
	for _, src := range sources {
		v.Sources = append(v.Sources, src.Name)
	}
	v.Monitor = p.blacklist.Check(sources...)
	if v.Monitor.Violations == nil {
		v.Monitor.Violations = []paperbench.Violation{}
	}
	return nil
}

// tarSources reads the regular files of a tarball as monitor sources, at
// most limit bytes in all, names prefixed.
func tarSources(prefix string, tarball []byte, limit int) ([]paperbench.Source, error) {
	var out []paperbench.Source
	tr := tar.NewReader(bytes.NewReader(tarball))
	for limit > 0 {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return out, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(tr, int64(limit)))
		if err != nil {
			return out, err
		}
		limit -= len(data)
		out = append(out, paperbench.Source{Name: prefix + h.Name, Text: string(data)})
	}
	return out, nil
}

// finish encodes a verdict into a score. Its comparable holds a grading,
// as the core's cross-check compares an agent's jobs on one and validates
// none without (a job of a Single stage is compared with itself): each
// leaf graded 1, in tree order, and Pass for a perfect score; for the full
// variant's rollout, which is not judged, Pass says that it submitted a
// reproduce.sh. Replicas asked for by hand would also be compared on the
// digest of the submission scored.
func finish(v Verdict, submission []byte, value float64) (bench.Score, error) {
	sum := sha256.Sum256(submission)
	g := &bench.Grading{Pass: len(v.Grading) > 0 && value == 1, Checks: make([]bool, 0, len(v.Grading))}
	for _, l := range v.Grading {
		g.Checks = append(g.Checks, l.Score == 1 && !l.Failed)
	}
	if v.Stage == StageRollout && v.Scores == nil {
		g.Pass = v.Submitted && v.ReproduceSH && !v.Disqualified
	}
	out := bench.Score{Comparable: bench.Comparable{Grading: g, OutputDigest: hex.EncodeToString(sum[:])}, Value: value}
	var errs [3]error
	out.Scoring, errs[0] = json.Marshal(v.Scoring)
	out.Verdict, errs[1] = json.Marshal(v)
	out.Public, errs[2] = json.Marshal(v.Public)
	if err := errors.Join(errs[:]...); err != nil {
		return bench.Score{}, fmt.Errorf("encode score: %w", err)
	}
	return out, nil
}

// workdir is a scoring's temporary folder.
type workdir string

func newWorkdir() (workdir, error) {
	d, err := os.MkdirTemp("", "paperbench-score-")
	if err != nil {
		return "", fmt.Errorf("scoring folder: %w", err)
	}
	return workdir(d), nil
}

func (w workdir) path(name string) string { return filepath.Join(string(w), name) }
func (w workdir) close()                  { _ = os.RemoveAll(string(w)) }

// Bounds of what the scorer unpacks.
var unpackLimits = capsulestore.ExtractLimits{MaxEntries: 200_000, MaxBytes: 8 << 30, MaxEntryBytes: 4 << 30}

// unpack extracts a folder output (a plain tar, recipe.Collect's) into
// dir with the one safe extractor, capsulestore.Extract, which reads
// gzip'd tarballs only: the tar is gzip'd on the way in.
func unpack(ctx context.Context, tarball []byte, dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		zw, _ := gzip.NewWriterLevel(pw, gzip.BestSpeed)
		_, err := zw.Write(tarball)
		if err == nil {
			err = zw.Close()
		}
		pw.CloseWithError(err)
	}()
	_, err := capsulestore.Extract(ctx, pr, dir, unpackLimits)
	pr.CloseWithError(errors.New("extraction ended"))
	<-done
	return err
}
