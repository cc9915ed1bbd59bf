package coordinator

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/crosscheck"
	"github.com/repronet/repronet/proto"
)

// A reproducibility check runs a capsule's own run script K times, on K
// distinct nodes and operators, collects the files its checker reads and
// has the checker (Config.Checker, a bench.Checker; CORE-Bench's turns
// them into a task entry with prediction intervals) report on them. Each
// run is a unit of kind capsule_run with a single replica: the K runs are
// the replication, judged together by the checker; runs are never
// replayed as canaries (a canary needs two agreeing replicas).

// Reproducibility check settings.
const (
	// MaxReproRuns bounds K.
	MaxReproRuns = 16
	// DefaultReproImage is the agent image capsule runs use when the
	// request names none and it is registered; else FallbackReproImage
	// (the sample suite's oracle: busybox, enough for shell capsules).
	DefaultReproImage  = "runtime"
	FallbackReproImage = "oracle"
	// maxClaimedBytes bounds the rule files kept from a submitted tarball.
	maxClaimedBytes = 16 << 20
)

// ReproStatus is the state of a check (GET /api/repro/{id}).
type ReproStatus struct {
	ID string `json:"id"`
	// State is queued, running, done or failed.
	State      string `json:"state"`
	RunsDone   int    `json:"runs_done"`
	RunsWanted int    `json:"runs_wanted"`
	// Report is the checker's, once every run is decided.
	Report json.RawMessage `json:"report,omitempty"`
	Error  string          `json:"error,omitempty"`
	// Waiting says why runs wait that no node in view can run (or that
	// no node is in view), one line per reason (core/stuck.go): they end
	// as unschedulable, with the reason, within the coordinator's bound.
	Waiting []string `json:"waiting,omitempty"`
	// Capsule names the capsule checked.
	Capsule ReproCapsule `json:"capsule"`
	// Runs are the check's runs, in order, each with links to its page
	// and logs (open to the submitter's group and the admin).
	Runs []ReproRunView `json:"runs"`
	// FailedBecause says, one line per failed run, why it failed: its
	// outcome, exit status and the tail of its stderr (or why no node ran
	// it).
	FailedBecause []string `json:"failed_because,omitempty"`
}

// ReproCapsule names a check's capsule: its folder (the spec's
// capsule_id, the tarball's top folder) and its title.
type ReproCapsule struct {
	ID    string `json:"id"`
	Title string `json:"title,omitempty"`
}

// ReproRunView is one run of a check as its status shows it.
type ReproRunView struct {
	Run int `json:"run"`
	// Attempt is the run's latest attempt, by handle (as submitters see
	// attempts); Page and Logs its page and its logs in the API.
	Attempt string `json:"attempt,omitempty"`
	Page    string `json:"page,omitempty"`
	Logs    string `json:"logs,omitempty"`
	State   string `json:"state"`
	Outcome string `json:"outcome,omitempty"`
	// Failed: the run did not end ok; ExitCode, StderrTail and Detail
	// say why (from its report, when it has one).
	Failed     bool   `json:"failed,omitempty"`
	ExitCode   *int32 `json:"exit_code,omitempty"`
	StderrTail string `json:"stderr_tail,omitempty"`
	Detail     string `json:"detail,omitempty"`
}

// stderrTailBytes bounds the stderr tail a failed run shows.
const stderrTailBytes = 2048

// States of a check.
const (
	ReproQueued  = "queued"
	ReproRunning = "running"
	ReproDone    = "done"
	ReproFailed  = "failed"
)

var (
	errNoRepro  = errors.New("no such reproducibility check")
	errBadRepro = errors.New("bad reproducibility check request")
)

// SubmitRepro starts a reproducibility check, spec in its checker's JSON,
// of the capsule tarball (its one top folder the one the check names) with
// the named agent image as the runs' environment (empty: DefaultReproImage,
// else FallbackReproImage). It returns the check's ID once it is durably
// queued.
func (c *Coordinator) SubmitRepro(ctx context.Context, rawSpec json.RawMessage, image string, tarball io.Reader) (string, error) {
	return c.SubmitReproAs(ctx, accounts.Principal{Scope: accounts.ScopeAdmin}, rawSpec, image, tarball)
}

// errReproQuota: the submitter's group has too many unfinished attempts
// for the check's runs.
var errReproQuota = errors.New("over your group's quota")

// SubmitReproAs is SubmitRepro on behalf of p: the admin, or a submitter,
// whose check is its group's (its runs count in the group's quota and
// are the group's attempts, their logs open to it) and whose runs may use
// only the default images or its group's own agents.
func (c *Coordinator) SubmitReproAs(ctx context.Context, p accounts.Principal, rawSpec json.RawMessage, image string, tarball io.Reader) (string, error) {
	if c.cfg.Checker == nil {
		return "", fmt.Errorf("%w: this coordinator has no reproducibility checker", errBadRepro)
	}
	check, err := c.cfg.Checker.Parse(rawSpec)
	if err != nil {
		return "", fmt.Errorf("%w: %w", errBadRepro, err)
	}
	if check.Runs < 2 || check.Runs > MaxReproRuns {
		return "", fmt.Errorf("%w: %d runs (want 2 to %d)", errBadRepro, check.Runs, MaxReproRuns)
	}
	if err := c.writable(); err != nil {
		return "", fmt.Errorf("reproducibility check: %w", err)
	}
	if p.Scope != accounts.ScopeAdmin {
		if image != "" && image != DefaultReproImage && image != FallbackReproImage && !c.ownsAgent(p, image) {
			return "", fmt.Errorf("%w: image %q: your group has no agent of that name (leave it empty for the default environment)", errBadRepro, image)
		}
		if c.web != nil {
			c.web.submit.Lock()
			defer c.web.submit.Unlock()
			g, ok := c.web.accounts.Group(p.Group)
			if !ok {
				return "", fmt.Errorf("%w: your group %q no longer exists", errBadRepro, p.Group)
			}
			if pending := c.groupPending(p.Group); g.MaxPending > 0 && pending+check.Runs > g.MaxPending {
				return "", fmt.Errorf("reproducibility check: %w: %d runs asked, %d unfinished, at most %d at once", errReproQuota,
					check.Runs, pending, g.MaxPending)
			}
		}
	}
	img, ok := c.catalog.Agent(image)
	if image == "" {
		if img, ok = c.catalog.Agent(DefaultReproImage); !ok {
			img, ok = c.catalog.Agent(FallbackReproImage)
		}
	}
	files := map[string]bool{}
	for _, f := range check.Files {
		files[f] = true
	}
	// Import the tarball while reading the rule files out of it.
	pr, pw := io.Pipe()
	scanned := make(chan tarScan, 1)
	// The files under the check's returned folders (a draft's results/)
	// are kept too: what the capsule published, compared with the runs.
	keep := func(name string) bool {
		return files[name] || slices.ContainsFunc(check.Dirs, func(d string) bool { return strings.HasPrefix(name, d+"/") })
	}
	go func() { scanned <- scanCapsuleTarball(pr, keep, check.MaxFile) }()
	info, err := c.store.Add(ctx, io.TeeReader(tarball, pw))
	pw.CloseWithError(err)
	sc := <-scanned
	if err != nil {
		return "", fmt.Errorf("reproducibility check: import capsule: %w", err)
	}
	switch {
	case sc.err != nil:
		return "", fmt.Errorf("%w: capsule tarball: %w", errBadRepro, sc.err)
	case sc.top != check.Top:
		return "", fmt.Errorf("%w: the tarball's top folder is %q, the check's %q", errBadRepro, sc.top, check.Top)
	}
	var claimed map[string][]byte
	if len(sc.files) > 0 {
		claimed = sc.files
	}

	rec := core.ReproRecord{ID: randomID("rp-"), Check: check, CapsuleCID: info.CID.String(), CapsuleSize: info.Size,
		Image: img.Name, ImageCID: img.CID, Claimed: claimed}
	if p.Scope != accounts.ScopeAdmin {
		rec.Group, rec.Submitter = p.Group, p.Submitter
	}
	fx, t := c.step(ctx, core.ReproQueued{Record: rec})
	if err, ok := fx.Reply.(error); ok {
		return "", fmt.Errorf("reproducibility check: %w", err)
	}
	if err := c.durable(ctx, t); err != nil {
		return "", fmt.Errorf("reproducibility check: %w", err)
	}
	c.log.Info("reproducibility check queued", "repro", rec.ID, "capsule", check.Top, "runs", check.Runs, "image", img.Name)
	return rec.ID, nil
}

type tarScan struct {
	top   string
	files map[string][]byte
	err   error
}

// scanCapsuleTarball reads a capsule tarball (gzipped or not) and keeps the
// regular files want names (paths below the one top folder), within
// maxClaimedBytes. It always reads r to its end, so that whoever writes
// into it is never blocked.
func scanCapsuleTarball(r io.Reader, want func(string) bool, maxFile int64) (out tarScan) {
	defer func() { _, _ = io.Copy(io.Discard, r) }()
	out.files = map[string][]byte{}
	br := bufio.NewReader(r)
	var tr *tar.Reader
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			out.err = err
			return out
		}
		defer gz.Close()
		tr = tar.NewReader(gz)
	} else {
		tr = tar.NewReader(br)
	}
	kept := 0
	for {
		h, err := tr.Next()
		if err == io.EOF {
			if out.top == "" {
				out.err = errors.New("empty tarball")
			}
			return out
		}
		if err != nil {
			out.err = err
			return out
		}
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "." {
			continue
		}
		top, rest, _ := strings.Cut(name, "/")
		switch {
		case out.top == "":
			out.top = top
		case top != out.top:
			out.err = fmt.Errorf("more than one top entry (%q and %q)", out.top, top)
			return out
		}
		if h.Typeflag != tar.TypeReg || !want(rest) || kept+int(h.Size) > maxClaimedBytes {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(tr, maxFile+1))
		if err != nil {
			out.err = err
			return out
		}
		kept += len(b)
		out.files[rest] = b
	}
}

// capsuleRunRecipe is the job of one run of a check (its checker's
// Recipe).
func (c *Coordinator) capsuleRunRecipe(rec *core.ReproRecord) (*proto.Recipe, error) {
	if rec == nil {
		return nil, errors.New("reproducibility check not loaded")
	}
	capsule, err := cid.Decode(rec.CapsuleCID)
	if err != nil {
		return nil, fmt.Errorf("capsule of %s: %w", rec.ID, err)
	}
	image, err := cid.Decode(rec.ImageCID)
	if err != nil {
		return nil, fmt.Errorf("image of %s: %w", rec.ID, err)
	}
	return c.cfg.Checker.Recipe(rec.Check, capsule, image, c.cfg.Limits)
}

// runFiles reads a run's returned files (fetched and kept when its report
// was recorded) by the names the check uses (relative to its top folder),
// and the files of its returned folders (Check.Dirs).
func (c *Coordinator) runFiles(ctx context.Context, check bench.Check, outputs []core.Output) (map[string][]byte, error) {
	out := map[string][]byte{}
	for _, o := range outputs {
		name, ok := strings.CutPrefix(o.Path, check.Top+"/")
		if o.Error != "" || o.CID == "" || !ok {
			continue
		}
		if slices.Contains(check.Dirs, name) {
			tb, err := c.readOutput(ctx, o, check.MaxFile)
			if err != nil {
				return nil, err
			}
			files, err := bench.FolderFiles(name, tb, check.MaxFile)
			if err != nil {
				return nil, err
			}
			maps.Copy(out, files)
			continue
		}
		if !slices.Contains(check.Files, name) {
			continue
		}
		b, err := c.readOutput(ctx, o, check.MaxFile)
		if err != nil {
			return nil, err
		}
		out[name] = b
	}
	return out, nil
}

// capsuleRunResult is what the runs of a check compare (its checker's
// Compare of the files a run returned).
func (c *Coordinator) capsuleRunResult(ctx context.Context, job core.Job) (crosscheck.Result, error) {
	if job.Repro == nil || c.cfg.Checker == nil {
		return crosscheck.Result{}, nil
	}
	files, err := c.runFiles(ctx, job.Repro.Check, job.Attempt.Outputs)
	if err != nil {
		return crosscheck.Result{}, err
	}
	return c.cfg.Checker.Compare(job.Repro.Check, files), nil
}

// ReproStatus is the state of a reproducibility check and, once every run
// is decided, its report (computed once, then kept).
func (c *Coordinator) ReproStatus(ctx context.Context, id string) (ReproStatus, error) {
	c.mu.Lock()
	v, ok := c.state.Repro(id)
	var runIDs []string
	latest := make([]core.Attempt, len(v.Record.Units))
	for i, u := range v.Record.Units {
		ids := c.state.Units[u]
		runIDs = append(runIDs, ids...)
		if len(ids) > 0 {
			if a := c.state.Attempts[ids[len(ids)-1]]; a != nil {
				latest[i] = *a
			}
		}
	}
	waiting := c.state.Waiting(runIDs, time.Now())
	c.mu.Unlock()
	if !ok {
		return ReproStatus{}, fmt.Errorf("%w: %q", errNoRepro, id)
	}
	rec := v.Record
	st := ReproStatus{ID: id, State: ReproQueued, RunsDone: v.Decided, RunsWanted: len(rec.Units), Report: rec.Report, Error: rec.Error,
		Capsule: reproCapsule(rec.Check)}
	st.Runs, st.FailedBecause = c.reproRuns(ctx, latest)
	for _, aid := range runIDs {
		w, ok := waiting[aid]
		if !ok || !(w.Blocked || w.InView == 0) {
			continue
		}
		line := "run: " + w.Reason
		if w.Blocked && !w.Deadline.IsZero() {
			line += fmt.Sprintf(" (ends unschedulable at %s unless a node that can run it comes into view)",
				w.Deadline.UTC().Truncate(time.Second).Format(time.RFC3339))
		}
		if !slices.Contains(st.Waiting, line) {
			st.Waiting = append(st.Waiting, line)
		}
	}
	if v.Started {
		st.State = ReproRunning
	}
	switch {
	case st.Report != nil:
		st.State = ReproDone
		return st, nil
	case st.Error != "":
		st.State = ReproFailed
		return st, nil
	case st.RunsDone < st.RunsWanted:
		return st, nil
	}

	// Every run is decided: read the runs' files, once what decided them
	// is durable, and judge.
	if c.cfg.Checker == nil {
		return st, fmt.Errorf("reproducibility check %s: this coordinator has no reproducibility checker", id)
	}
	if err := c.durable(ctx, nil); err != nil {
		return st, fmt.Errorf("reproducibility check %s: %w", id, err)
	}
	runs := make([]bench.CheckRun, 0, len(v.Runs))
	for _, ref := range v.Runs {
		run := bench.CheckRun{Node: ref.Node, Outcome: ref.Outcome}
		if ref.Attempt == "" && ref.Detail != "" {
			// No report stands for it: say why (no node could run it, or
			// infrastructure failed on every try).
			run.Node, run.Outcome = "no node", ref.Outcome+": "+ref.Detail
		}
		if ref.Attempt != "" {
			files, err := c.runFiles(ctx, rec.Check, ref.Outputs)
			if err != nil {
				return st, fmt.Errorf("reproducibility check %s: %w", id, err)
			}
			run.Files = files
		}
		runs = append(runs, run)
	}
	ev := core.ReproJudged{ID: id}
	report, err := c.cfg.Checker.Judge(rec.Check, runs, rec.Claimed)
	if err != nil {
		// Say why the runs that ran nowhere did not (no node could run
		// them, or infrastructure failed on every try).
		var why []string
		for i, r := range runs {
			if r.Node == "no node" {
				why = append(why, fmt.Sprintf("run %d: %s", i+1, r.Outcome))
			}
		}
		if len(why) > 0 {
			err = fmt.Errorf("%w (%s)", err, strings.Join(why, "; "))
		}
		ev.Err, st.State, st.Error = err.Error(), ReproFailed, err.Error()
	} else {
		ev.Report, st.State, st.Report = report, ReproDone, report
	}
	_, t := c.step(ctx, ev)
	if err := c.durable(ctx, t); err != nil {
		return st, fmt.Errorf("reproducibility check %s: %w", id, err)
	}
	return st, nil
}

// reproCapsule names a check's capsule: its top folder, and the title
// its spec gives (bench/repro's "capsule": {"capsule_title"}), if any.
func reproCapsule(check bench.Check) ReproCapsule {
	var spec struct {
		Capsule struct {
			Title string `json:"capsule_title"`
		} `json:"capsule"`
	}
	_ = json.Unmarshal(check.Spec, &spec) // a checker of another shape: no title
	return ReproCapsule{ID: check.Top, Title: spec.Capsule.Title}
}

// reproRuns shows a check's runs from their latest attempts, and says why
// each failed run failed: its outcome, exit status and stderr tail from
// its report, or why it never ran.
func (c *Coordinator) reproRuns(ctx context.Context, latest []core.Attempt) ([]ReproRunView, []string) {
	runs := make([]ReproRunView, 0, len(latest))
	var why []string
	for i, a := range latest {
		r := ReproRunView{Run: i + 1, State: string(a.State), Outcome: a.Outcome, Detail: a.Detail}
		if a.ID == "" {
			r.State = string(core.StateQueued)
			runs = append(runs, r)
			continue
		}
		if c.web != nil {
			if h := c.web.handle(a.ID); h != "" {
				r.Attempt, r.Page, r.Logs = h, "/attempts/"+h, "/api/attempts/"+h+"/logs"
			}
		}
		r.Failed = a.State == core.StateFailed || (a.Outcome != "" && a.Outcome != "ok")
		if r.Failed {
			line := fmt.Sprintf("run %d: %s", r.Run, cmp.Or(a.Outcome, string(a.State)))
			if rep, _, err := c.Report(ctx, a.ID); err == nil {
				code := rep.GetExitCode()
				r.ExitCode = &code
				r.StderrTail = tail(string(rep.GetStderrTail()), stderrTailBytes)
				r.Detail = cmp.Or(rep.GetDetail(), r.Detail)
				line += fmt.Sprintf(", exit status %d", code)
			}
			if r.Detail != "" {
				line += ": " + r.Detail
			}
			if r.StderrTail != "" {
				line += "; stderr ends: " + lastLines(r.StderrTail, 5)
			}
			why = append(why, line)
		}
		runs = append(runs, r)
	}
	return runs, why
}

// tail is the last max bytes of s, cut at a line start when one is near.
func tail(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[len(s)-max:]
	if i := strings.IndexByte(s, '\n'); i >= 0 && i < 200 {
		s = s[i+1:]
	}
	return s
}

// lastLines is the last n non-empty lines of s, joined with " / ".
func lastLines(s string, n int) string {
	var lines []string
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			lines = append(lines, l)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " / ")
}

// ReproResponse answers POST /api/repro.
type ReproResponse struct {
	ID string `json:"id"`
}

// handleReproSubmit serves POST /api/repro: a multipart/form-data body
// with a "spec" part (repro.Spec as JSON), optionally an "image" part (the
// agent image to run in; also ?image=), then a "capsule" part (the
// tarball, streamed into the capsule store).
func (c *Coordinator) handleReproSubmit(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	r.Body = http.MaxBytesReader(w, r.Body, c.cfg.MaxReproUpload+(2<<20))
	mr, err := r.MultipartReader()
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{"reproducibility check: want multipart/form-data: " + err.Error()})
		return
	}
	var spec json.RawMessage
	image := r.URL.Query().Get("image")
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			writeJSON(w, http.StatusBadRequest, apiError{"reproducibility check: no capsule part"})
			return
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, apiError{"reproducibility check: " + err.Error()})
			return
		}
		switch part.FormName() {
		case "spec":
			b, err := io.ReadAll(io.LimitReader(part, 1<<20+1))
			if err != nil || len(b) > 1<<20 {
				writeJSON(w, http.StatusBadRequest, apiError{fmt.Sprintf("reproducibility check: spec: over 1 MiB or unreadable (%v)", err)})
				return
			}
			spec = b
		case "image":
			b, _ := io.ReadAll(io.LimitReader(part, 256))
			image = strings.TrimSpace(string(b))
		case "capsule":
			if spec == nil {
				writeJSON(w, http.StatusBadRequest, apiError{"reproducibility check: the spec part must come before the capsule"})
				return
			}
			id, err := c.SubmitReproAs(r.Context(), p, spec, image, part)
			switch {
			case errors.Is(err, errReproQuota):
				writeJSON(w, http.StatusTooManyRequests, apiError{err.Error()})
			case errors.Is(err, errBadRepro):
				writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
			case err != nil:
				writeJSON(w, httpStatus(err, http.StatusInternalServerError), apiError{err.Error()})
			default:
				writeJSON(w, http.StatusOK, ReproResponse{ID: id})
			}
			return
		default:
			writeJSON(w, http.StatusBadRequest, apiError{fmt.Sprintf("reproducibility check: unknown part %q", part.FormName())})
			return
		}
	}
}
