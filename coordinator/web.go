package coordinator

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/dashboard"
)

// People's access (this file, api*.go and web_*.go): accounts and what
// each scope may read (package accounts), the JSON API and the dashboard's
// pages (package dashboard renders them). A request is public, a
// submitter's (a token of package accounts: its group's work only) or the
// operator's (Config.AdminToken). What a submitter sees is filled here:
// never a gold answer, a canary, a node or operator ID, another group's
// work, or a figure that moves only for real work while an attempt runs
// (see attemptView).

// web is the coordinator's state of people's access.
type web struct {
	accounts *accounts.Store
	site     *dashboard.Site
	// handles encrypts attempt IDs into the handles submitters see.
	handles cipher.Block
	// formKey keys the form tokens of signed-in readers.
	formKey []byte
	// crossOrigin refuses sign-ins posted from another site (a login
	// CSRF would sign the victim's browser in as the attacker).
	crossOrigin *http.CrossOriginProtection
	// evalKey keys the labels the public reads for evaluation IDs.
	evalKey []byte
	// submit serialises submitters' evaluations, so that two requests
	// cannot both pass their group's quota.
	submit sync.Mutex
	// public is the snapshot of the entries the public pages show.
	publicMu sync.Mutex
	public   entriesSnapshot
}

// entriesSnapshot is the board entries as of a time.
type entriesSnapshot struct {
	at      time.Time
	entries []dashboard.Entry
}

// startWeb opens the accounts and the dashboard; callers are in start.
func (c *Coordinator) startWeb(ctx context.Context, secret []byte) error {
	acc, err := accounts.Open(ctx, c.ds)
	if err != nil {
		return err
	}
	site, err := dashboard.New(c.log.With("component", "dashboard"))
	if err != nil {
		return err
	}
	block, err := aes.NewCipher(derive(secret, "repronet attempt handles")[:16])
	if err != nil {
		return fmt.Errorf("attempt handles: %w", err)
	}
	c.web = &web{accounts: acc, site: site, handles: block, formKey: derive(secret, "repronet form tokens"), crossOrigin: http.NewCrossOriginProtection(),
		evalKey: derive(secret, "repronet public evaluation labels")}
	return nil
}

// evalLabel is the label the public reads for evaluation id: opaque (an
// ID a submitter chose may say more than the public should read), the
// same for every entry of the evaluation, distinct for two.
func (c *Coordinator) evalLabel(id string) string {
	if id == "" || c.web == nil {
		return id
	}
	m := hmac.New(sha256.New, c.web.evalKey)
	m.Write([]byte(id))
	return "ev~" + hex.EncodeToString(m.Sum(nil)[:6])
}

// derive is a key for purpose from the coordinator's secret.
func derive(secret []byte, purpose string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(purpose))
	return m.Sum(nil)
}

// Accounts are the coordinator's groups, submitters and tokens.
func (c *Coordinator) Accounts() *accounts.Store { return c.web.accounts }

// Attempt handles. A submitter never sees an attempt's ID: a node knows
// the IDs of the attempts it runs, and one that could look them up among
// its group's would tell its canaries (absent there) apart at once. A
// handle is the ID's 12 bytes and 4 fixed ones, encrypted as one AES block
// under a key only the coordinator has.
const handlePrefix = "ah-"

var handleMagic = []byte("rnah")

// handle is the handle of attempt id ("" for an ID not of the form
// at-<24 hex digits>, which the core never makes).
func (w *web) handle(id string) string {
	raw, err := hex.DecodeString(strings.TrimPrefix(id, "at-"))
	if !strings.HasPrefix(id, "at-") || err != nil || len(raw) != 12 {
		return ""
	}
	var block [16]byte
	copy(block[:], raw)
	copy(block[12:], handleMagic)
	w.handles.Encrypt(block[:], block[:])
	return handlePrefix + hex.EncodeToString(block[:])
}

// attemptID is the attempt ID a handle stands for.
func (w *web) attemptID(h string) (string, bool) {
	raw, err := hex.DecodeString(strings.TrimPrefix(h, handlePrefix))
	if !strings.HasPrefix(h, handlePrefix) || err != nil || len(raw) != 16 {
		return "", false
	}
	w.handles.Decrypt(raw, raw)
	if subtle.ConstantTimeCompare(raw[12:], handleMagic) != 1 {
		return "", false
	}
	return "at-" + hex.EncodeToString(raw[:12]), true
}

// Who makes a request: the Authorization header's bearer token, or (for
// the dashboard's pages, fromCookie) the sign-in cookie.

// cookieName is the sign-in cookie of the dashboard.
const cookieName = "repronet_token"

// errNoAdmin: a token that is not a submitter's was given to a
// coordinator that has no admin token.
var errNoAdmin = errors.New("the admin API is off: the coordinator has no admin token (--admin-token-file)")

// principal is who makes r: public without a token, else the token's
// holder, or an error naming what is wrong with the token.
func (c *Coordinator) principal(r *http.Request, fromCookie bool) (accounts.Principal, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok && r.Header.Get("Authorization") != "" {
		return accounts.Principal{}, errors.New("malformed Authorization header: want \"Bearer <token>\"")
	}
	if !ok && fromCookie {
		if ck, err := r.Cookie(cookieName); err == nil {
			token, ok = ck.Value, true
		}
	}
	if !ok {
		return accounts.Principal{}, nil
	}
	return c.authenticate(token)
}

// authenticate returns who holds token.
func (c *Coordinator) authenticate(token string) (accounts.Principal, error) {
	if accounts.LooksLikeToken(token) {
		p, err := c.web.accounts.Authenticate(token)
		if err != nil {
			return p, fmt.Errorf("bearer token: %w", err)
		}
		return p, nil
	}
	if c.cfg.AdminToken == "" {
		return accounts.Principal{}, errNoAdmin
	}
	if !c.isAdminToken(token) {
		return accounts.Principal{}, errors.New("unknown bearer token")
	}
	return accounts.Principal{Scope: accounts.ScopeAdmin}, nil
}

// isAdminToken compares token with the admin token in constant time (of
// their digests: not even the admin token's length shows).
func (c *Coordinator) isAdminToken(token string) bool {
	a, b := sha256.Sum256([]byte(token)), sha256.Sum256([]byte(c.cfg.AdminToken))
	return c.cfg.AdminToken != "" && subtle.ConstantTimeCompare(a[:], b[:]) == 1
}

// formToken is the token a signed-in reader's forms carry: bound to its
// bearer token, unknown to another site (a cross-site form cannot post as
// the reader).
func (c *Coordinator) formToken(r *http.Request) string {
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return ""
	}
	m := hmac.New(sha256.New, c.web.formKey)
	m.Write([]byte(ck.Value))
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// who is the dashboard's reader of r.
func (c *Coordinator) who(r *http.Request, p accounts.Principal) dashboard.Who {
	return dashboard.Who{Scope: p.Scope.String(), Submitter: p.Submitter, Group: p.Group, CSRF: c.formToken(r)}
}
