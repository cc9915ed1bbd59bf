package gateway

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
)

// Grant is what a per-attempt token allows: calls for one attempt, under
// one lease, from one node, until the lease ends, charged to the
// attempt's, its evaluation's and its group's budgets.
type Grant struct {
	Attempt string  `json:"attempt"`
	Lease   string  `json:"lease"`
	Node    peer.ID `json:"node"`
	// Evaluation and Group may be empty: then no such budget applies.
	Evaluation string `json:"evaluation,omitempty"`
	Group      string `json:"group,omitempty"`
	// Task is the task the attempt runs (HAL's weave_task_id).
	Task string `json:"task,omitempty"`
	// Expires is when the lease ends unless renewed.
	Expires time.Time `json:"expires"`
	Budgets Budgets   `json:"budgets"`
	// Models the attempt may call; empty: every model the gateway prices.
	Models []string `json:"models,omitempty"`
	// Replay names the recorded attempt this attempt replays: its calls
	// are answered with the recorded answers, in order, at no cost
	// (replay.go).
	Replay string `json:"replay,omitempty"`
}

// Budgets are the caps of a grant's three budgets (Unlimited for none).
type Budgets struct {
	Attempt, Evaluation, Group Money
}

// Errors of authorization; the gateway answers each with its own status.
var (
	// ErrUnknownToken: no grant has this token (never issued, revoked, or
	// its lease ended).
	ErrUnknownToken = errors.New("unknown or revoked token")
	// ErrWrongNode: the token was granted to another node.
	ErrWrongNode = errors.New("token granted to another node")
	// ErrWrongAttempt: the token was granted to another attempt than the
	// one the node says is calling.
	ErrWrongAttempt = errors.New("token granted to another attempt")
	// ErrLeaseEnded: the grant's lease has ended.
	ErrLeaseEnded = errors.New("the attempt's lease has ended")
	// ErrModelNotGranted: the grant does not allow this model.
	ErrModelNotGranted = errors.New("model not allowed for this attempt")
)

// Validate checks what a grant needs to be issued.
func (g Grant) Validate() error {
	var errs []error
	if g.Attempt == "" || g.Lease == "" {
		errs = append(errs, errors.New("attempt and lease are required"))
	}
	if g.Node == "" {
		errs = append(errs, errors.New("node is required"))
	} else if err := g.Node.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("node: %w", err))
	}
	if g.Expires.IsZero() {
		errs = append(errs, errors.New("expires is required"))
	}
	for _, b := range []struct {
		name string
		v    Money
	}{{"attempt", g.Budgets.Attempt}, {"evaluation", g.Budgets.Evaluation}, {"group", g.Budgets.Group}} {
		if b.v < 0 {
			errs = append(errs, fmt.Errorf("%s budget %v is negative", b.name, b.v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("grant for attempt %q: %w", g.Attempt, err)
	}
	return nil
}

// Permits is the rule every side applies to a call: it must come from the
// grant's node, for the grant's attempt when the node names the calling
// attempt (attempt "" skips that check), before the grant expires, for a
// model the grant allows (model "" skips that check).
func (g Grant) Permits(node peer.ID, attempt, model string, now time.Time) error {
	switch {
	case node != g.Node:
		return fmt.Errorf("%w: attempt %s runs on %s, the call came from %s", ErrWrongNode, g.Attempt, g.Node, node)
	case attempt != "" && attempt != g.Attempt:
		return fmt.Errorf("%w: the token is attempt %s's, the call came from attempt %s", ErrWrongAttempt, g.Attempt, attempt)
	case !now.Before(g.Expires):
		return fmt.Errorf("%w: lease %s of attempt %s ended at %s", ErrLeaseEnded, g.Lease, g.Attempt, g.Expires.UTC().Format(time.RFC3339))
	case model != "" && len(g.Models) > 0 && !slices.Contains(g.Models, model):
		return fmt.Errorf("%w: attempt %s may call %s, not %q", ErrModelNotGranted, g.Attempt, strings.Join(g.Models, ", "), model)
	}
	return nil
}

// Accounts are the budgets a call under g is charged to.
func (g Grant) Accounts() []AccountRef {
	refs := []AccountRef{{Key: "attempt/" + g.Attempt, Cap: g.Budgets.Attempt}}
	if g.Evaluation != "" {
		refs = append(refs, AccountRef{Key: "evaluation/" + g.Evaluation, Cap: g.Budgets.Evaluation})
	}
	if g.Group != "" {
		refs = append(refs, AccountRef{Key: "group/" + g.Group, Cap: g.Budgets.Group})
	}
	return refs
}

// Authorizer resolves the token a call presents (the API key the agent
// sees) to its grant. The coordinator implements it over its leases;
// TokenTable is an implementation in memory. Resolve must return
// ErrUnknownToken (wrapped or not) for a token it does not know; the
// gateway applies Grant.Permits to what it returns.
type Authorizer interface {
	Resolve(ctx context.Context, token string) (Grant, error)
}

// TokenPrefix starts every token TokenTable issues, so that one is
// recognisable in a log or a leak scan.
const TokenPrefix = "rpn-"

// TokenTable issues per-attempt tokens and resolves them. It keeps only
// each token's SHA-256 and looks a token up by its hash: neither a dump of
// the table nor the lookup's timing (which depends on the hash, not on
// how much of a guessed token is right) gives a token away.
type TokenTable struct {
	mu     sync.Mutex
	grants map[[sha256.Size]byte]Grant
}

// NewTokenTable returns an empty table.
func NewTokenTable() *TokenTable {
	return &TokenTable{grants: map[[sha256.Size]byte]Grant{}}
}

// Issue returns a new token for g: 32 random bytes, base64url, after
// TokenPrefix.
func (t *TokenTable) Issue(g Grant) (string, error) {
	if err := g.Validate(); err != nil {
		return "", err
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("issue token: %w", err)
	}
	tok := TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	t.mu.Lock()
	t.grants[sha256.Sum256([]byte(tok))] = g
	t.mu.Unlock()
	return tok, nil
}

// Resolve implements Authorizer.
func (t *TokenTable) Resolve(_ context.Context, token string) (Grant, error) {
	h := sha256.Sum256([]byte(token))
	t.mu.Lock()
	defer t.mu.Unlock()
	if g, ok := t.grants[h]; ok {
		return g, nil
	}
	return Grant{}, ErrUnknownToken
}

// Extend moves the expiry of every grant under lease to expires (a lease
// renewal).
func (t *TokenTable) Extend(lease string, expires time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k, g := range t.grants {
		if g.Lease == lease {
			g.Expires = expires
			t.grants[k] = g
		}
	}
}

// Revoke forgets every token granted under lease (the lease ended or was
// taken back); it returns how many.
func (t *TokenTable) Revoke(lease string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for k, g := range t.grants {
		if g.Lease == lease {
			delete(t.grants, k)
			n++
		}
	}
	return n
}
