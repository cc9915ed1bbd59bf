package coordinator

import (
	"bytes"
	"cmp"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"

	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/dashboard"
)

// The dashboard's pages: package dashboard renders them from the views of
// web_data.go, each filled for its reader's scope. A reader signs in by
// pasting a token (kept in an HttpOnly, SameSite=Strict cookie); its forms
// carry a form token bound to it.

// pageFunc makes the page of a request of p, and its status.
type pageFunc func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int)

// webRoutes registers the pages.
func (c *Coordinator) webRoutes(mux *http.ServeMux) {
	public, submitter, admin := accounts.ScopePublic, accounts.ScopeSubmitter, accounts.ScopeAdmin
	page := func(pattern string, min accounts.Scope, f pageFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { c.servePage(w, r, min, f) })
	}
	mux.Handle("GET /static/", dashboard.Static())
	mux.HandleFunc("GET /favicon.ico", dashboard.Icon)
	mux.HandleFunc("/api/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("no endpoint %s %s (see docs/api.md)", r.Method, r.URL.Path)})
	})
	page("/", public, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		return c.errorPage(r, p, http.StatusNotFound, "There is no page "+r.URL.Path+".")
	})
	page("GET /{$}", public, c.boardsPage)
	page("GET /agents/{agent}", public, c.agentPage)
	page("GET /nodes", public, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		return dashboard.NodesPage{Base: c.base(r, p), Credit: c.creditReport(p)}, http.StatusOK
	})
	page("GET /repro/{id}", public, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		v, err := c.reproView(r.Context(), r.PathValue("id"))
		if errors.Is(err, errNoRepro) {
			return c.errorPage(r, p, http.StatusNotFound, err.Error())
		} else if err != nil {
			return c.errorPage(r, p, http.StatusInternalServerError, err.Error())
		}
		return dashboard.ReproPage{Base: c.base(r, p), Repro: v}, http.StatusOK
	})
	mux.HandleFunc("GET /repro/{id}/draft-spec.json", c.serveDraftSpec)
	page("GET /repro", admin, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		return dashboard.ReprosPage{Base: c.base(r, p), Repros: c.reproViews(r.Context())}, http.StatusOK
	})
	page("GET /evaluations", submitter, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		return c.evaluationsPage(r, p, "", ""), http.StatusOK
	})
	page("POST /evaluations", submitter, c.startEvaluationForm)
	page("GET /evaluations/{id}", submitter, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		d, ok := c.evaluationDetail(p, r.PathValue("id"))
		if !ok {
			return c.errorPage(r, p, http.StatusNotFound, "No evaluation "+r.PathValue("id")+" of yours.")
		}
		return dashboard.EvaluationPage{Base: c.base(r, p), Eval: d}, http.StatusOK
	})
	page("GET /attempts/{id}", submitter, c.attemptPage)
	mux.HandleFunc("GET /attempts/{id}/outputs/{path...}", func(w http.ResponseWriter, r *http.Request) {
		p, err := c.principal(r, true)
		if err != nil || p.Scope < submitter {
			writeJSON(w, http.StatusUnauthorized, apiError{"sign in to read an attempt's outputs"})
			return
		}
		c.handleOutput(w, r, p)
	})
	page("GET /agents", submitter, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		return dashboard.AgentsPage{Base: c.base(r, p), Agents: c.agentViews(p)}, http.StatusOK
	})
	page("POST /agents", submitter, c.pushAgentForm)
	page("GET /admin/accounts", admin, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		gs, ss, ts := c.accountViews()
		return dashboard.AccountsPage{Base: c.base(r, p), Groups: gs, Submitters: ss, Tokens: ts}, http.StatusOK
	})
	page("GET /login", public, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		return dashboard.LoginPage{Base: c.base(r, p), Next: localPath(r.URL.Query().Get("next"))}, http.StatusOK
	})
	mux.HandleFunc("POST /login", c.login)
	page("POST /logout", public, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
		if p.Scope != accounts.ScopePublic && !c.formOK(r, r.PostFormValue("csrf")) {
			return c.errorPage(r, p, http.StatusForbidden, "This form is stale: reload the page and try again.")
		}
		setTokenCookie(w, r, "")
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return nil, 0
	})
}

// servePage resolves the reader (header or cookie), checks its scope and
// renders the page f makes. A cookie whose token no longer works is
// cleared, and the reader asked to sign in again.
func (c *Coordinator) servePage(w http.ResponseWriter, r *http.Request, min accounts.Scope, f pageFunc) {
	p, err := c.principal(r, true)
	var pg dashboard.Page
	status := http.StatusOK
	switch {
	case err != nil:
		setTokenCookie(w, r, "")
		r.Header.Del("Cookie")
		pg, status = dashboard.LoginPage{Base: c.base(r, accounts.Principal{}), Error: err.Error() + ". Sign in again.", Next: askedFor(r)}, http.StatusUnauthorized
	case p.Scope >= min:
		pg, status = f(w, r, p)
	case p.Scope == accounts.ScopePublic:
		pg, status = dashboard.LoginPage{Base: c.base(r, p), Error: "Sign in to see this page.", Next: askedFor(r)}, http.StatusUnauthorized
	default:
		pg, status = c.errorPage(r, p, http.StatusForbidden, "This page is the operator's.")
	}
	if pg != nil {
		c.web.site.Render(w, status, pg)
	}
}

// base is the common part of r's page for p.
func (c *Coordinator) base(r *http.Request, p accounts.Principal) dashboard.Base {
	return dashboard.Base{Who: c.who(r, p)}
}

func (c *Coordinator) errorPage(r *http.Request, p accounts.Principal, status int, msg string) (dashboard.Page, int) {
	return dashboard.ErrorPage{Base: c.base(r, p), Status: status, Message: msg}, status
}

// formOK checks a form's token in constant time.
func (c *Coordinator) formOK(r *http.Request, got string) bool {
	want := c.formToken(r)
	return want != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// setTokenCookie keeps token in the sign-in cookie ("": removes it).
func setTokenCookie(w http.ResponseWriter, r *http.Request, token string) {
	ck := &http.Cookie{Name: cookieName, Value: token, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: 30 * 24 * 3600}
	if token == "" {
		ck.MaxAge = -1
	}
	http.SetCookie(w, ck)
}

// login signs a reader in with a token pasted in the form.
func (c *Coordinator) login(w http.ResponseWriter, r *http.Request) {
	if err := c.web.crossOrigin.Check(r); err != nil {
		// Another site's form posting a token of its choosing: refused,
		// no cookie set.
		http.Error(w, "sign in from this site's own page: "+err.Error(), http.StatusForbidden)
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, 4<<10)
	token := strings.TrimSpace(r.PostFormValue("token"))
	p, err := c.authenticate(token)
	if err == nil && token == "" {
		err = errors.New("no token given")
	}
	next := localPath(r.PostFormValue("next"))
	if err != nil {
		c.web.site.Render(w, http.StatusUnauthorized, dashboard.LoginPage{Base: c.base(r, accounts.Principal{}), Error: err.Error(), Next: next})
		return
	}
	setTokenCookie(w, r, token)
	c.log.Info("dashboard sign-in", "scope", p.Scope.String(), "submitter", p.Submitter)
	http.Redirect(w, r, cmp.Or(next, "/evaluations"), http.StatusSeeOther)
}

// askedFor is the page r asked for, to go back to once signed in (a GET's
// only: a form's post is not repeated).
func askedFor(r *http.Request) string {
	if r.Method != http.MethodGet {
		return ""
	}
	return localPath(r.URL.RequestURI())
}

// localPath is next when it is a path on this site ("/evaluations/ev-1"),
// else "": never another site ("//evil.example", "https://...", "/\\x"),
// nor a sign-in or sign-out.
func localPath(next string) string {
	u, err := url.Parse(next)
	switch {
	case err != nil || next == "" || len(next) > 2048 || next[0] != '/' || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\x00\r\n\t"):
		return ""
	case u.Scheme != "" || u.Host != "" || u.User != nil || u.Path == "/login" || u.Path == "/logout":
		return ""
	}
	return next
}

func (c *Coordinator) boardsPage(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
	entries, at, live := c.boardEntries(p, "")
	return dashboard.BoardsPage{Base: c.base(r, p), Boards: dashboard.BuildBoards(entries), Taken: at, Live: live}, http.StatusOK
}

func (c *Coordinator) agentPage(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
	agent := r.PathValue("agent")
	entries, at, live := c.boardEntries(p, agent)
	var mine []dashboard.Entry
	for _, e := range entries {
		if e.Agent == agent {
			mine = append(mine, e)
		}
	}
	return dashboard.AgentPage{Base: c.base(r, p), Agent: agent, Boards: dashboard.BuildBoards(mine),
		Tasks: dashboard.TaskResults(mine, agent), Taken: at, Live: live}, http.StatusOK
}

// evaluationsPage is the list of p's evaluations with the form.
func (c *Coordinator) evaluationsPage(r *http.Request, p accounts.Principal, msg, errMsg string) dashboard.EvaluationsPage {
	return dashboard.EvaluationsPage{Base: c.base(r, p), Evaluations: c.evaluationViews(p), Suites: c.suiteViews(),
		Agents: c.agentViews(p), Message: msg, Error: errMsg}
}

// startEvaluationForm starts an evaluation from the dashboard's form.
func (c *Coordinator) startEvaluationForm(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if !c.formOK(r, r.PostFormValue("csrf")) {
		return c.errorPage(r, p, http.StatusForbidden, "This form is stale: reload the page and try again.")
	}
	req := EvaluationRequest{ID: strings.TrimSpace(r.PostFormValue("id")), Suite: r.PostFormValue("suite"), Agent: r.PostFormValue("agent")}
	for _, l := range strings.Split(r.PostFormValue("levels"), ",") {
		if l = strings.TrimSpace(l); l != "" {
			req.Levels = append(req.Levels, l)
		}
	}
	if s := strings.TrimSpace(r.PostFormValue("runs")); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return c.evaluationsPage(r, p, "", fmt.Sprintf("runs %q: want a whole number from 1", s)), http.StatusBadRequest
		}
		req.Runs = n
	}
	id, n, status, err := c.submitEvaluation(r.Context(), p, req)
	if err != nil {
		return c.evaluationsPage(r, p, "", err.Error()), status
	}
	c.log.Info("evaluation started from the dashboard", "eval", id, "attempts", n, "submitter", p.Submitter)
	http.Redirect(w, r, "/evaluations/"+url.PathEscape(id), http.StatusSeeOther)
	return nil, 0
}

// pushAgentForm registers an agent from the dashboard's upload form (a
// multipart body whose form token comes first, its image last).
func (c *Coordinator) pushAgentForm(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
	r.Body = http.MaxBytesReader(w, r.Body, MaxAgentUpload+(1<<20))
	fail := func(status int, msg string) (dashboard.Page, int) {
		return dashboard.AgentsPage{Base: c.base(r, p), Agents: c.agentViews(p), Error: msg}, status
	}
	mr, err := r.MultipartReader()
	if err != nil {
		return fail(http.StatusBadRequest, "want a multipart form: "+err.Error())
	}
	var info AgentInfo
	csrf := false
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return fail(http.StatusBadRequest, "no image was sent")
		}
		if err != nil {
			return fail(http.StatusBadRequest, err.Error())
		}
		if part.FormName() != "csrf" && !csrf {
			return c.errorPage(r, p, http.StatusForbidden, "This form is stale: reload the page and try again.")
		}
		if part.FormName() == "image" {
			ag, status, err := c.pushAgent(r.Context(), p, p.Group, info, part)
			if err != nil {
				return fail(status, err.Error())
			}
			return dashboard.AgentsPage{Base: c.base(r, p), Agents: c.agentViews(p),
				Message: fmt.Sprintf("Agent %s pushed: %d bytes, sha256 %s.", ag.Name, ag.Size, ag.SHA256)}, http.StatusOK
		}
		b, _ := io.ReadAll(io.LimitReader(part, 256))
		v := strings.TrimSpace(string(b))
		switch part.FormName() {
		case "csrf":
			if !c.formOK(r, v) {
				return c.errorPage(r, p, http.StatusForbidden, "This form is stale: reload the page and try again.")
			}
			csrf = true
		case "name":
			info.Name = v
		case "model":
			info.Model = v
		case "deterministic":
			info.Deterministic = v == "1"
		}
	}
}

// attemptPage shows an attempt p may see, with its logs and trajectory
// once it is finished (at once to the admin).
func (c *Coordinator) attemptPage(w http.ResponseWriter, r *http.Request, p accounts.Principal) (dashboard.Page, int) {
	a, ok := c.visibleAttempt(p, r.PathValue("id"))
	if !ok {
		return c.errorPage(r, p, http.StatusNotFound, "No attempt "+r.PathValue("id")+" of yours.")
	}
	pg := dashboard.AttemptPage{Base: c.base(r, p), Attempt: c.attemptView(p, a)}
	if p.Scope != accounts.ScopeAdmin && !finished(a.State) {
		pg.LogsError, pg.TrajectoryError = errRunning.Error(), errRunning.Error()
		return pg, http.StatusOK
	}
	if logs, err := c.logsOf(r.Context(), a); err == nil {
		pg.Logs = &logs
	} else if a.ReportDigest != "" {
		pg.LogsError = "logs not readable: " + err.Error()
	}
	calls, err := c.trajectoryView(r.Context(), a)
	if err != nil {
		pg.TrajectoryError = "trajectory not readable: " + err.Error()
	}
	pg.Trajectory = calls
	if p.Scope == accounts.ScopeAdmin && a.Score != nil {
		pg.Verdict = string(a.Score.Verdict)
	}
	return pg, http.StatusOK
}

// serveDraftSpec serves a draft check's draft spec (a rule per kept value)
// as a JSON file to download and edit; public, as the check's page is.
func (c *Coordinator) serveDraftSpec(w http.ResponseWriter, r *http.Request) {
	v, err := c.reproView(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, errNoRepro):
		writeJSON(w, http.StatusNotFound, apiError{err.Error()})
		return
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
		return
	case v.Draft == nil || len(v.Draft.Spec) == 0:
		writeJSON(w, http.StatusNotFound, apiError{fmt.Sprintf("reproducibility check %s has no draft spec: it is not a finished check without rules", v.ID)})
		return
	}
	var buf bytes.Buffer
	if err := json.Indent(&buf, v.Draft.Spec, "", "  "); err != nil {
		writeJSON(w, http.StatusInternalServerError, apiError{fmt.Sprintf("reproducibility check %s: draft spec: %v", v.ID, err)})
		return
	}
	buf.WriteByte('\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Disposition", fmt.Sprintf("attachment; filename=%q", v.ID+"-spec.json"))
	_, _ = w.Write(buf.Bytes())
}
