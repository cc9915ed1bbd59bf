package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/dashboard"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// The API of submitters' work (and the operator's view of it):
// evaluations, attempts with their logs, outputs and trajectories, and
// agents. Every read is filtered by the reader's scope (web_data.go).

// MaxAgentUpload bounds an agent image pushed over the API.
const MaxAgentUpload = 16 << 30

// maxOutputServed bounds an output file served whole.
const maxOutputServed = 64 << 20

func (c *Coordinator) handleEvaluation(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	d, ok := c.evaluationDetail(p, r.PathValue("id"))
	if !ok {
		writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("no evaluation %q of yours", r.PathValue("id"))})
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (c *Coordinator) handleEvaluate(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	var req EvaluationRequest
	if !decodeRequest(w, r, "evaluation request", &req) {
		return
	}
	id, n, status, err := c.submitEvaluation(r.Context(), p, req)
	if err != nil {
		writeJSON(w, status, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, EvaluationResponse{ID: id, Attempts: n})
}

// submitEvaluation queues an evaluation for p (the API's and the
// dashboard's form) and returns its ID and attempts, or the HTTP status
// and error of a refusal. A submitter's is for its group, of one of its
// group's agents, with the cross-check's replication, and within its
// group's bound on unfinished attempts.
func (c *Coordinator) submitEvaluation(ctx context.Context, p accounts.Principal, req EvaluationRequest) (string, int, int, error) {
	e := Evaluation{ID: req.ID, Suite: req.Suite, Agent: req.Agent, Levels: req.Levels, Runs: req.Runs, Replicas: req.Replicas,
		Group: req.Group, Priority: req.Priority, Env: req.Env, Models: req.Models, Budget: req.Budget}
	if p.Scope == accounts.ScopeAdmin {
		if e.Group != "" {
			if err := accounts.ValidName("group", e.Group); err != nil {
				return "", 0, http.StatusBadRequest, fmt.Errorf("evaluate: %w", err)
			}
		}
		id, n, err := c.Evaluate(ctx, e)
		return id, n, evaluateStatus(err), err
	}
	switch {
	case e.Group != "" && e.Group != p.Group:
		return "", 0, http.StatusForbidden, fmt.Errorf("evaluate: group %q: a submitter evaluates for its own group, %q", e.Group, p.Group)
	case e.Replicas != 0:
		return "", 0, http.StatusForbidden, errors.New("evaluate: replicas: the cross-check policy replicates a submitter's evaluation; leave it 0")
	case !c.ownsAgent(p, e.Agent):
		return "", 0, http.StatusForbidden, fmt.Errorf("evaluate: agent %q: your group has no agent of that name (push one with repronet agent push)", e.Agent)
	}
	e.Group = p.Group
	c.web.submit.Lock()
	defer c.web.submit.Unlock()
	if e.ID != "" {
		for _, prev := range c.Evaluations() {
			if prev.ID == e.ID && prev.Group != p.Group {
				return "", 0, http.StatusConflict, fmt.Errorf("evaluate: evaluation ID %q is taken; choose another", e.ID)
			}
			if prev.ID == e.ID {
				id, n, err := c.Evaluate(ctx, e) // a repeat: queues nothing new
				return id, n, evaluateStatus(err), err
			}
		}
	}
	g, ok := c.web.accounts.Group(p.Group)
	if !ok {
		return "", 0, http.StatusForbidden, fmt.Errorf("evaluate: your group %q no longer exists", p.Group)
	}
	if g.MaxPending > 0 {
		want, pending := c.attemptsAsked(e), c.groupPending(p.Group)
		if pending+want > g.MaxPending {
			return "", 0, http.StatusTooManyRequests, fmt.Errorf("evaluate: over your group's quota: %d attempts asked, %d unfinished, at most %d at once",
				want, pending, g.MaxPending)
		}
	}
	id, n, err := c.Evaluate(ctx, e)
	return id, n, evaluateStatus(err), err
}

// attemptsAsked is how many attempts e would queue (as core.Evaluate
// counts them: tasks x levels x runs x replicas, at least one each); 0
// for a suite that does not exist (refused anyway).
func (c *Coordinator) attemptsAsked(e Evaluation) int {
	si, ok := c.catalog.LookupSuite(e.Suite)
	if !ok {
		return 0
	}
	levels := len(e.Levels)
	if levels == 0 {
		levels = len(si.Bench.Variants())
	}
	return len(si.Tasks) * levels * max(1, e.Runs) * max(1, e.Replicas)
}

// handleAttempts lists attempts: the admin gets the records (with
// ?canaries=1 the canaries too; scores without their verdict), a
// submitter the views of its group's (?eval=ID: of one evaluation).
func (c *Coordinator) handleAttempts(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	q := r.URL.Query()
	eval := q.Get("eval")
	if p.Scope == accounts.ScopeAdmin {
		atts := c.Attempts()
		if q.Get("canaries") == "1" {
			atts = c.AllAttempts()
		}
		out := atts[:0]
		for _, a := range atts {
			if s := a.Score; s != nil {
				a.Score = &ScoreRecord{Scorer: s.Scorer, Scoring: s.Scoring, Public: s.Public, Value: s.Value}
			}
			if eval == "" || a.Eval == eval {
				out = append(out, a)
			}
		}
		writeJSON(w, http.StatusOK, nonNil(out))
		return
	}
	if q.Has("canaries") {
		writeJSON(w, http.StatusForbidden, apiError{"canaries are the operator's only"})
		return
	}
	var mine []Attempt
	var ids []string
	for _, a := range c.Attempts() {
		if p.MayRead(a.Group) && (eval == "" || a.Eval == eval) {
			mine = append(mine, a)
			if !finished(a.State) {
				ids = append(ids, a.ID)
			}
		}
	}
	waiting := c.waitingOf(ids...)
	out := make([]dashboard.Attempt, len(mine))
	for i, a := range mine {
		out[i] = c.attemptView(p, a)
		wt, ok := waiting[a.ID]
		out[i].Waiting = waitingView(p, a, wt, ok)
	}
	writeJSON(w, http.StatusOK, out)
}

// attemptOf resolves the attempt of the path for p, answering 404 when p
// may not see it (whether or not it exists).
func (c *Coordinator) attemptOf(w http.ResponseWriter, r *http.Request, p accounts.Principal) (Attempt, bool) {
	a, ok := c.visibleAttempt(p, r.PathValue("id"))
	if !ok {
		writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("no attempt %q of yours", r.PathValue("id"))})
	}
	return a, ok
}

// finishedFor answers 409 and returns false when a submitter asks what an
// attempt shows only once finished.
func finishedFor(w http.ResponseWriter, p accounts.Principal, a Attempt) bool {
	if p.Scope != accounts.ScopeAdmin && !finished(a.State) {
		writeJSON(w, http.StatusConflict, apiError{errRunning.Error()})
		return false
	}
	return true
}

func (c *Coordinator) handleAttempt(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	if a, ok := c.attemptOf(w, r, p); ok {
		v := c.attemptView(p, a)
		wt, ok := c.waitingOf(a.ID)[a.ID]
		v.Waiting = waitingView(p, a, wt, ok)
		writeJSON(w, http.StatusOK, v)
	}
}

func (c *Coordinator) handleLogs(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	a, ok := c.attemptOf(w, r, p)
	if !ok || !finishedFor(w, p, a) {
		return
	}
	logs, err := c.logsOf(r.Context(), a)
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		writeJSON(w, http.StatusNotFound, apiError{"no report of this attempt: it has no logs"})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
	default:
		writeJSON(w, http.StatusOK, logs)
	}
}

func (c *Coordinator) handleOutputs(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	if a, ok := c.attemptOf(w, r, p); ok {
		writeJSON(w, http.StatusOK, nonNil(c.attemptView(p, a).Outputs))
	}
}

// handleOutput serves one output file as it was returned, as an
// attachment (never rendered by a browser).
func (c *Coordinator) handleOutput(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	a, ok := c.attemptOf(w, r, p)
	if !ok || !finishedFor(w, p, a) {
		return
	}
	want := r.PathValue("path")
	for _, o := range a.Outputs {
		if o.Path != want {
			continue
		}
		if o.Error != "" {
			writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("output %s was not returned: %s", o.Path, o.Error)})
			return
		}
		b, err := c.readOutput(r.Context(), o, maxOutputServed)
		if err != nil {
			writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
			return
		}
		dashboard.SecurityHeaders(w.Header())
		w.Header().Set("Content-Security-Policy", "sandbox; default-src 'none'")
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": path.Base(o.Path)}))
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		_, _ = w.Write(b)
		return
	}
	writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("attempt has no output %q", want)})
}

func (c *Coordinator) handleTrajectory(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	a, ok := c.attemptOf(w, r, p)
	if !ok || !finishedFor(w, p, a) {
		return
	}
	calls, err := c.trajectoryView(r.Context(), a)
	if err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, nonNil(calls))
}

// handleVerdict serves an attempt's full verdict (admin: it derives from
// gold answers).
func (c *Coordinator) handleVerdict(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	a, ok := c.attemptOf(w, r, p)
	if !ok {
		return
	}
	if a.Score == nil {
		writeJSON(w, http.StatusNotFound, apiError{"the attempt is not scored"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"attempt": a.ID, "scorer": a.Score.Scorer, "verdict": a.Score.Verdict})
}

// handlePushAgent serves POST /api/agents?name=N[&model=M][&deterministic=1][&not_replayable=1]
// (the admin may add &group=G): the body is the agent's OCI image tarball
// (an OCI layout or docker save archive, possibly gzipped), streamed into
// the capsule store.
func (c *Coordinator) handlePushAgent(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
	q := r.URL.Query()
	flag := func(k string) bool { return q.Get(k) == "1" || q.Get(k) == "true" }
	info := AgentInfo{Name: q.Get("name"), Model: q.Get("model"), Deterministic: flag("deterministic"), NotReplayable: flag("not_replayable")}
	group := p.Group
	if p.Scope == accounts.ScopeAdmin {
		group = q.Get("group")
	}
	ag, status, err := c.pushAgent(r.Context(), p, group, info, http.MaxBytesReader(w, r.Body, MaxAgentUpload))
	if err != nil {
		writeJSON(w, status, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, ag)
}

// pushAgent registers an agent image for group ("" for the admin's
// without one): the first group to push a name owns it; nobody else may
// replace it, nor an agent the operator registered, nor one with
// unfinished attempts (their replicas must all run one image).
func (c *Coordinator) pushAgent(ctx context.Context, p accounts.Principal, group string, info AgentInfo, body io.Reader) (dashboard.Agent, int, error) {
	if err := accounts.ValidName("agent", info.Name); err != nil {
		return dashboard.Agent{}, http.StatusBadRequest, err
	}
	if info.Model != "" && len(info.Model) > 128 {
		return dashboard.Agent{}, http.StatusBadRequest, fmt.Errorf("agent %q: model name over 128 bytes", info.Name)
	}
	owner, owned := c.web.accounts.AgentOwner(info.Name)
	if p.Scope != accounts.ScopeAdmin && !owned && c.HasAgent(info.Name) {
		return dashboard.Agent{}, http.StatusForbidden, fmt.Errorf("agent %q: %w", info.Name, accounts.ErrNotOwner)
	}
	if p.Scope == accounts.ScopeAdmin && group == "" {
		group = owner
	}
	made := false
	if group != "" {
		var err error
		if made, err = c.web.accounts.ClaimAgent(ctx, info.Name, group); err != nil {
			status := http.StatusForbidden
			if errors.Is(err, accounts.ErrNotFound) {
				status = http.StatusBadRequest
			}
			return dashboard.Agent{}, status, err
		}
	}
	release := func() {
		if made {
			_ = c.web.accounts.ReleaseAgent(context.WithoutCancel(ctx), info.Name, group)
		}
	}
	// A push over an agent with unfinished attempts is a new version for
	// new evaluations: queued work keeps the image it was queued with
	// (core.Job.ImageCID).
	ag, err := c.AddAgentWith(ctx, info, body)
	if err != nil {
		release()
		var tooBig *http.MaxBytesError
		switch {
		case errors.As(err, &tooBig):
			return dashboard.Agent{}, http.StatusRequestEntityTooLarge, fmt.Errorf("agent %q: over %d bytes", info.Name, tooBig.Limit)
		case errors.Is(err, ociimage.ErrImageRefused):
			return dashboard.Agent{}, http.StatusBadRequest, fmt.Errorf("agent %q: %w", info.Name, err)
		}
		return dashboard.Agent{}, httpStatus(err, http.StatusInternalServerError), err
	}
	c.log.Info("agent pushed", "agent", ag.Name, "group", group, "cid", ag.CID, "size", ag.Size)
	return dashboard.Agent{Name: ag.Name, Group: group, Model: ag.Model, Deterministic: ag.Deterministic, NotReplayable: ag.NotReplayable,
		CID: ag.CID, Size: ag.Size,
		SHA256: ag.SHA256}, http.StatusOK, nil
}
