package coordinator

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/ipfs/go-datastore"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/coordinator/core"
)

// Handler serves the coordinator's HTTP API (JSON, under /api/, and
// /metrics) and the dashboard's pages (web_pages.go). docs/api.md lists
// every endpoint with its scope. In short:
//
// Public: the leaderboards (/api/leaderboards, /api/leaderboard/entries:
// snapshots at most Config.PublicBoardsEvery old, Last-Modified saying
// when each was taken; live to the admin), /api/network (the pool's size),
// /api/credit (its total credit), /api/suites, /api/repro/{id} and
// /api/whoami. Nothing public holds a gold answer, an agent's answer, an
// attempt or node ID a node could use to tell a canary from a replica, or
// a canary at all.
//
// Submitter ("Authorization: Bearer rns_..."; package accounts): its
// group's evaluations (GET and POST /api/evaluations, within the group's
// quota, of its group's agents), attempts (by handle, never by ID: see
// web.go), their logs, outputs and trajectories once finished, the
// trajectories of their validated runs in HAL's shape (/api/hal/trajectories,
// for HAL uploads), agents (GET and POST /api/agents), and reproducibility
// checks (POST /api/repro, within the group's quota; GET /api/repro: the
// group's). Never a gold answer, a canary, a node, or
// another group's work: an attempt it may not see is "not found".
//
// Admin (Config.AdminToken): everything, including the live counters
// (/api/progress, /api/stats: they move for real reports and not for
// canaries, so a node watching them could tell), every attempt with
// ?canaries=1, reports (/api/reports/{attempt}: the agent's answers, the
// correct ones being gold values) and verdicts, nodes, cross-check
// records, operators and join tokens, accounts, every reproducibility
// check, and /metrics.
func (c *Coordinator) Handler() http.Handler {
	mux := http.NewServeMux()
	c.apiRoutes(mux)
	c.webRoutes(mux)
	return mux
}

// scopedFunc serves a request of p.
type scopedFunc func(w http.ResponseWriter, r *http.Request, p accounts.Principal)

// apiRoutes registers the JSON API.
func (c *Coordinator) apiRoutes(mux *http.ServeMux) {
	route := func(pattern string, min accounts.Scope, f scopedFunc) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			if p, ok := c.allow(w, r, min); ok {
				f(w, r, p)
			}
		})
	}
	get := func(path string, min accounts.Scope, f func(p accounts.Principal) any) {
		route("GET "+path, min, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
			writeJSON(w, http.StatusOK, f(p))
		})
	}
	public, submitter, admin := accounts.ScopePublic, accounts.ScopeSubmitter, accounts.ScopeAdmin

	// The boards are public snapshots (see Config.PublicBoardsEvery).
	boards := &snapshots{every: c.cfg.PublicBoardsEvery, taken: map[string]snapshot{}}
	board := func(path string, live, snap func() any) {
		route("GET "+path, public, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
			if p.Scope == admin {
				writeJSON(w, http.StatusOK, live())
				return
			}
			s := boards.get(path, time.Now(), snap)
			w.Header().Set("Last-Modified", s.at.UTC().Format(http.TimeFormat))
			w.Header().Set("Content-Type", "application/json")
			w.Write(s.body)
		})
	}
	board("/api/leaderboards", func() any { return c.Boards() }, func() any { return c.PublicBoards() })
	board("/api/leaderboard/entries", func() any { return nonNil(c.LeaderboardEntries()) },
		func() any { return nonNil(c.PublicEntries()) })
	// The public sees the pool's size and its total credit; who is in it,
	// with operators, gossip scores and leases, is the operator's.
	get("/api/network", public, func(accounts.Principal) any { return c.Network() })
	get("/api/credit", public, func(p accounts.Principal) any { return c.creditReport(p) })
	get("/api/suites", public, func(accounts.Principal) any { return nonNil(c.suiteViews()) })
	get("/api/whoami", public, func(p accounts.Principal) any {
		return map[string]string{"scope": p.Scope.String(), "submitter": p.Submitter, "group": p.Group}
	})
	mux.HandleFunc("GET /api/repro/{id}", c.handleReproStatus)

	// A submitter's own group's work (the admin's: everyone's).
	get("/api/evaluations", submitter, func(p accounts.Principal) any { return nonNil(c.evaluationViews(p)) })
	route("GET /api/evaluations/{id}", submitter, c.handleEvaluation)
	route("POST /api/evaluations", submitter, c.handleEvaluate)
	route("GET /api/attempts", submitter, c.handleAttempts)
	route("GET /api/attempts/{id}", submitter, c.handleAttempt)
	route("GET /api/attempts/{id}/logs", submitter, c.handleLogs)
	route("GET /api/attempts/{id}/egress", submitter, c.handleEgress)
	route("GET /api/attempts/{id}/outputs", submitter, c.handleOutputs)
	route("GET /api/attempts/{id}/outputs/{path...}", submitter, c.handleOutput)
	route("GET /api/attempts/{id}/trajectory", submitter, c.handleTrajectory)
	route("GET /api/hal/trajectories", submitter, c.handleHALRuns)
	get("/api/agents", submitter, func(p accounts.Principal) any { return nonNil(c.agentViews(p)) })
	route("POST /api/agents", submitter, c.handlePushAgent)

	// The operator's.
	get("/api/nodes", admin, func(accounts.Principal) any { return nonNil(c.Nodes()) })
	get("/api/progress", admin, func(accounts.Principal) any { return c.Progress() })
	get("/api/stats", admin, func(accounts.Principal) any { return c.Stats() })
	get("/api/crosscheck/nodes", admin, func(accounts.Principal) any { return nonNil(c.CrossCheckNodes()) })
	get("/api/operators", admin, func(accounts.Principal) any { return nonNil(c.Operators()) })
	route("GET /api/attempts/{id}/verdict", admin, c.handleVerdict)
	route("GET /api/reports/{attempt}", admin, c.handleReportEnvelope)
	route("GET /metrics", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		promhttp.HandlerFor(c.metrics, promhttp.HandlerOpts{}).ServeHTTP(w, r)
	})
	adminOnly := func(f http.HandlerFunc) scopedFunc {
		return func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) { f(w, r) }
	}
	route("POST /api/operators", admin, adminOnly(c.handleAdmit))
	route("POST /api/join-tokens", admin, adminOnly(c.handleNewJoinToken))
	route("GET /api/backup", admin, adminOnly(c.handleBackup))
	// Reproducibility checks: a submitter's are its group's (the admin's:
	// everyone's).
	route("POST /api/repro", submitter, c.handleReproSubmit)
	route("GET /api/repro", submitter, func(w http.ResponseWriter, r *http.Request, p accounts.Principal) {
		writeJSON(w, http.StatusOK, nonNil(c.reproViewsFor(r.Context(), p)))
	})
	c.accountRoutes(route)
}

// allow resolves who makes r and whether that is at least scope min. It
// answers 401 for a missing, malformed, unknown or revoked token, 403 for
// a valid token of too small a scope (or an admin route while the admin
// API is off).
func (c *Coordinator) allow(w http.ResponseWriter, r *http.Request, min accounts.Scope) (accounts.Principal, bool) {
	if min == accounts.ScopeAdmin && c.cfg.AdminToken == "" {
		writeJSON(w, http.StatusForbidden, apiError{errNoAdmin.Error()})
		return accounts.Principal{}, false
	}
	p, err := c.principal(r, false)
	switch {
	case err != nil:
		writeJSON(w, http.StatusUnauthorized, apiError{err.Error()})
	case p.Scope >= min:
		return p, true
	case p.Scope == accounts.ScopePublic:
		writeJSON(w, http.StatusUnauthorized, apiError{"missing bearer token: this needs a submitter's or the admin's token"})
	default:
		writeJSON(w, http.StatusForbidden, apiError{"admin only: a submitter's token does not open " + r.URL.Path})
	}
	return accounts.Principal{}, false
}

func (c *Coordinator) handleReportEnvelope(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
	env, err := c.ReportEnvelope(r.Context(), r.PathValue("attempt"))
	switch {
	case errors.Is(err, datastore.ErrNotFound):
		writeJSON(w, http.StatusNotFound, apiError{err.Error()})
	case err != nil:
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
	default:
		writeJSON(w, http.StatusOK, ReportEnvelopeJSON{AttemptID: r.PathValue("attempt"), Envelope: env})
	}
}

func (c *Coordinator) handleReproStatus(w http.ResponseWriter, r *http.Request) {
	st, err := c.ReproStatus(r.Context(), r.PathValue("id"))
	switch {
	case errors.Is(err, errNoRepro):
		writeJSON(w, http.StatusNotFound, apiError{err.Error()})
	case err != nil:
		writeJSON(w, http.StatusInternalServerError, apiError{err.Error()})
	default:
		writeJSON(w, http.StatusOK, st)
	}
}

// snapshots holds what each public board path served last, and when it
// was taken: a request gets it while it is younger than every, and takes a
// new one otherwise (every <= 0: always).
type snapshots struct {
	every time.Duration
	mu    sync.Mutex
	taken map[string]snapshot
}

type snapshot struct {
	at   time.Time
	body []byte
}

func (s *snapshots) get(path string, now time.Time, f func() any) snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	if snap, ok := s.taken[path]; ok && now.Sub(snap.at) < s.every {
		return snap
	}
	body, err := json.MarshalIndent(f(), "", "  ")
	if err != nil {
		body, _ = json.Marshal(apiError{err.Error()})
	}
	snap := snapshot{at: now, body: append(body, '\n')}
	s.taken[path] = snap
	return snap
}

// nonNil makes a nil slice encode as [].
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ReportEnvelopeJSON is the body of GET /api/reports/{attempt}: the
// envelope as stored (base64 in JSON), to open with proto.OpenReport.
type ReportEnvelopeJSON struct {
	AttemptID string `json:"attempt_id"`
	Envelope  []byte `json:"envelope"`
}

// EvaluationRequest is the body of POST /api/evaluations. A submitter's
// is for its own group (Group empty or its group's) and one of its
// group's agents, and leaves Replicas to the cross-check policy.
type EvaluationRequest struct {
	ID       string      `json:"id"`
	Suite    string      `json:"suite"`
	Agent    string      `json:"agent"`
	Levels   []string    `json:"levels"`
	Runs     int         `json:"runs"`
	Replicas int         `json:"replicas"`
	Group    string      `json:"group"`
	Priority int         `json:"priority"`
	Env      []string    `json:"env,omitempty"`
	Models   []string    `json:"models,omitempty"`
	Budget   core.Budget `json:"budget,omitzero"`
}

// EvaluationResponse answers POST /api/evaluations.
type EvaluationResponse struct {
	ID       string `json:"id"`
	Attempts int    `json:"attempts"`
}

type apiError struct {
	Error string `json:"error"`
}

// decodeRequest reads a JSON request body of at most 64 KiB into v,
// refusing unknown fields; on error it answers 400 naming what, and
// returns false.
func decodeRequest(w http.ResponseWriter, r *http.Request, what string, v any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, 64<<10))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{what + ": " + err.Error()})
		return false
	}
	return true
}

// writeJSON answers with v as JSON. v is encoded before anything is sent,
// so a value that cannot be encoded is a 500 with the reason, never a 200
// with an empty body.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		status = http.StatusInternalServerError
		body, _ = json.Marshal(apiError{"encode response: " + err.Error()})
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// evaluateStatus is the status of a refused evaluation: 400 for what it
// asks, 507 when the disk is full, 500 otherwise.
func evaluateStatus(err error) int {
	if errors.Is(err, core.ErrBadRequest) {
		return http.StatusBadRequest
	}
	return httpStatus(err, http.StatusInternalServerError)
}
