package coordinator

import (
	"errors"
	"net/http"

	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/dashboard"
)

// The operator's API of accounts (`repronet admin ...`): groups and their
// quota, submitters and their tokens. A token is answered once, when made;
// only its hash is kept.

// GroupRequest is the body of POST /api/groups and PUT
// /api/groups/{name}/quota.
type GroupRequest struct {
	Name       string `json:"name,omitempty"`
	MaxPending int    `json:"max_pending"`
}

// SubmitterRequest is the body of POST /api/submitters.
type SubmitterRequest struct {
	Name  string `json:"name"`
	Group string `json:"group"`
}

// TokenRequest is the body of POST /api/tokens.
type TokenRequest struct {
	Submitter string `json:"submitter"`
}

// NewTokenResponse answers the making of a token: the token, shown once.
type NewTokenResponse struct {
	Submitter string `json:"submitter"`
	Group     string `json:"group"`
	TokenID   string `json:"token_id"`
	Token     string `json:"token"`
}

// accountRoutes registers the accounts API with route (admin only).
func (c *Coordinator) accountRoutes(route func(string, accounts.Scope, scopedFunc)) {
	admin := accounts.ScopeAdmin
	acc := c.web.accounts
	route("GET /api/groups", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		gs, _, _ := c.accountViews()
		writeJSON(w, http.StatusOK, nonNil(gs))
	})
	route("POST /api/groups", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		var req GroupRequest
		if !decodeRequest(w, r, "group request", &req) {
			return
		}
		g, err := acc.CreateGroup(r.Context(), req.Name, req.MaxPending)
		answer(w, dashboard.Group{Name: g.Name, MaxPending: g.MaxPending, Created: g.Created}, err)
	})
	route("PUT /api/groups/{name}/quota", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		var req GroupRequest
		if !decodeRequest(w, r, "quota request", &req) {
			return
		}
		g, err := acc.SetQuota(r.Context(), r.PathValue("name"), req.MaxPending)
		answer(w, dashboard.Group{Name: g.Name, MaxPending: g.MaxPending, Created: g.Created}, err)
	})
	route("GET /api/submitters", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		_, ss, _ := c.accountViews()
		writeJSON(w, http.StatusOK, nonNil(ss))
	})
	route("POST /api/submitters", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		var req SubmitterRequest
		if !decodeRequest(w, r, "submitter request", &req) {
			return
		}
		s, tok, err := acc.CreateSubmitter(r.Context(), req.Name, req.Group)
		answer(w, newToken(s.Name, s.Group, tok), err)
	})
	route("POST /api/submitters/{name}/revoke", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		err := acc.RevokeSubmitter(r.Context(), r.PathValue("name"))
		answer(w, map[string]string{"revoked": r.PathValue("name")}, err)
	})
	route("GET /api/tokens", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		_, _, ts := c.accountViews()
		writeJSON(w, http.StatusOK, nonNil(ts))
	})
	route("POST /api/tokens", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		var req TokenRequest
		if !decodeRequest(w, r, "token request", &req) {
			return
		}
		tok, err := acc.NewToken(r.Context(), req.Submitter)
		group := ""
		for _, s := range acc.Submitters() {
			if s.Name == req.Submitter {
				group = s.Group
			}
		}
		answer(w, newToken(req.Submitter, group, tok), err)
	})
	route("POST /api/tokens/{id}/revoke", admin, func(w http.ResponseWriter, r *http.Request, _ accounts.Principal) {
		err := acc.RevokeToken(r.Context(), r.PathValue("id"))
		answer(w, map[string]string{"revoked": r.PathValue("id")}, err)
	})
}

// newToken is the answer of a made token.
func newToken(submitter, group, token string) NewTokenResponse {
	id, _, _ := accounts.ParseToken(token)
	return NewTokenResponse{Submitter: submitter, Group: group, TokenID: id, Token: token}
}

// answer answers v, or err with its status: 404 for what does not exist,
// 409 for what exists already or is revoked, 400 for the rest of what was
// asked, 507 when the disk is full.
func answer(w http.ResponseWriter, v any, err error) {
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, v)
	case errors.Is(err, accounts.ErrNotFound):
		writeJSON(w, http.StatusNotFound, apiError{err.Error()})
	case errors.Is(err, accounts.ErrExists), errors.Is(err, accounts.ErrRevoked):
		writeJSON(w, http.StatusConflict, apiError{err.Error()})
	default:
		writeJSON(w, httpStatus(err, http.StatusBadRequest), apiError{err.Error()})
	}
}
