// Package accounts owns who may do what on a coordinator besides its
// operator: submitter groups (with their quota), submitters (each in one
// group), their bearer tokens, and which group owns which agent. Tokens
// are kept as the SHA-256 of their secret, never the secret itself, and
// compared in constant time; a token or a whole submitter can be revoked.
// Every record is written to the coordinator's datastore and synced before
// a change returns.
//
// It answers one question for the HTTP API: who holds this token
// (Authenticate), and the ownership rules of agents (ClaimAgent). What a
// scope may read is decided where the data is (the coordinator's API); it
// must not import the coordinator, libp2p or any benchmark family.
package accounts

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/internal/dsjson"
	"github.com/repronet/repronet/proto"
)

// Group is a submitter group: the unit evaluations are accounted to
// (core.Evaluation.Group), that owns agents and sees its own work.
type Group struct {
	Name string `json:"name"`
	// MaxPending bounds the group's attempts not finished at once (queued,
	// running, or waiting to be scored): an evaluation that would take it
	// past this is refused. 0: no bound.
	MaxPending int       `json:"max_pending,omitempty"`
	Created    time.Time `json:"created"`
}

// Submitter is a person (or a program) who submits for one group.
type Submitter struct {
	Name    string    `json:"name"`
	Group   string    `json:"group"`
	Created time.Time `json:"created"`
	// Revoked: every token of the submitter is refused from then on.
	Revoked time.Time `json:"revoked,omitzero"`
}

// Token is the record of a submitter's bearer token: its ID (a public part
// of the token) and the SHA-256 of its secret part.
type Token struct {
	ID        string    `json:"id"`
	Submitter string    `json:"submitter"`
	Hash      string    `json:"hash"`
	Created   time.Time `json:"created"`
	Revoked   time.Time `json:"revoked,omitzero"`
}

// TokenInfo is what may be shown of a token: never its hash.
type TokenInfo struct {
	ID        string    `json:"id"`
	Submitter string    `json:"submitter"`
	Group     string    `json:"group"`
	Created   time.Time `json:"created"`
	Revoked   time.Time `json:"revoked,omitzero"`
}

// A token is TokenPrefix, an ID of idLen hex digits, "_", and a secret of
// 32 random bytes in unpadded base64url: TokenLen characters in all.
const (
	TokenPrefix = "rns_"
	idLen       = 12
	secretLen   = 43
	TokenLen    = len(TokenPrefix) + idLen + 1 + secretLen
)

// Errors of Authenticate and of the changes. Authenticate never says
// whether a token's ID exists when its secret is wrong.
var (
	ErrMalformed = fmt.Errorf("malformed submitter token: want %d characters, %s then %d hex digits, _ and %d base64url characters",
		TokenLen, TokenPrefix, idLen, secretLen)
	ErrUnknownToken = errors.New("unknown submitter token")
	ErrRevoked      = errors.New("revoked submitter token")
	ErrNotFound     = errors.New("not found")
	ErrExists       = errors.New("already exists")
	ErrNotOwner     = errors.New("agent belongs to another group")
)

// Principal is who a request comes from.
type Principal struct {
	Scope Scope
	// Submitter, Group and Token are set for ScopeSubmitter.
	Submitter string
	Group     string
	Token     string
}

// Scope is what a request may read and do.
type Scope int

// Scopes, from least to most.
const (
	// ScopePublic reads published leaderboards, the pool's size and
	// reproducibility checks by ID.
	ScopePublic Scope = iota
	// ScopeSubmitter also pushes agents and starts evaluations for its
	// group, and reads its group's evaluations and attempts (logs,
	// outputs, trajectories): never gold, canaries or other groups' work.
	ScopeSubmitter
	// ScopeAdmin is the operator: everything.
	ScopeAdmin
)

func (s Scope) String() string {
	switch s {
	case ScopeSubmitter:
		return "submitter"
	case ScopeAdmin:
		return "admin"
	}
	return "public"
}

// MayRead reports whether p may read the private work of group (its
// evaluations, attempts, agents): the admin reads every group's, a
// submitter its own group's only (never the work of no group).
func (p Principal) MayRead(group string) bool {
	switch p.Scope {
	case ScopeAdmin:
		return true
	case ScopeSubmitter:
		return group != "" && group == p.Group
	}
	return false
}

// ValidName checks a group or submitter name: 1-64 of [A-Za-z0-9._+-],
// the rule of every group name a node may filter on (proto.ValidLabel).
func ValidName(what, name string) error {
	if !proto.ValidLabel(name, proto.MaxFilterLen) {
		return fmt.Errorf("%s name %q: want 1-%d of [A-Za-z0-9._+-]", what, name, proto.MaxFilterLen)
	}
	return nil
}

// Key prefixes of the records.
var (
	groupsKey     = datastore.NewKey("/state/accounts/groups")
	submittersKey = datastore.NewKey("/state/accounts/submitters")
	tokensKey     = datastore.NewKey("/state/accounts/tokens")
	agentsKey     = datastore.NewKey("/state/accounts/agents")
)

// ownership is the record of an agent's owning group.
type ownership struct {
	Agent string    `json:"agent"`
	Group string    `json:"group"`
	At    time.Time `json:"at"`
}

// Store holds the accounts. It is safe for concurrent use.
type Store struct {
	ds datastore.Batching
	// now is the clock (tests may set it).
	now func() time.Time

	mu         sync.RWMutex
	groups     map[string]Group
	submitters map[string]Submitter
	tokens     map[string]Token
	agents     map[string]ownership
}

// Open loads the accounts from ds.
func Open(ctx context.Context, ds datastore.Batching) (*Store, error) {
	s := &Store{ds: ds, now: time.Now, groups: map[string]Group{}, submitters: map[string]Submitter{},
		tokens: map[string]Token{}, agents: map[string]ownership{}}
	err := errors.Join(
		dsjson.Load(ctx, ds, groupsKey, func(g Group) { s.groups[g.Name] = g }),
		dsjson.Load(ctx, ds, submittersKey, func(x Submitter) { s.submitters[x.Name] = x }),
		dsjson.Load(ctx, ds, tokensKey, func(t Token) { s.tokens[t.ID] = t }),
		dsjson.Load(ctx, ds, agentsKey, func(o ownership) { s.agents[o.Agent] = o }))
	if err != nil {
		return nil, fmt.Errorf("accounts: %w", err)
	}
	return s, nil
}

// put writes v under k and syncs it; callers hold s.mu.
func (s *Store) put(ctx context.Context, k datastore.Key, v any) error {
	return dsjson.Put(ctx, s.ds, k, v)
}

// CreateGroup adds a group. maxPending bounds its unfinished attempts (0:
// no bound).
func (s *Store) CreateGroup(ctx context.Context, name string, maxPending int) (Group, error) {
	if err := ValidName("group", name); err != nil {
		return Group{}, err
	}
	if maxPending < 0 {
		return Group{}, fmt.Errorf("group %q: max_pending %d: want 0 (no bound) or more", name, maxPending)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[name]; ok {
		return Group{}, fmt.Errorf("group %q: %w", name, ErrExists)
	}
	g := Group{Name: name, MaxPending: maxPending, Created: s.now().UTC()}
	if err := s.put(ctx, groupsKey.ChildString(name), g); err != nil {
		return Group{}, fmt.Errorf("group %q: %w", name, err)
	}
	s.groups[name] = g
	return g, nil
}

// SetQuota changes a group's bound on unfinished attempts.
func (s *Store) SetQuota(ctx context.Context, name string, maxPending int) (Group, error) {
	if maxPending < 0 {
		return Group{}, fmt.Errorf("group %q: max_pending %d: want 0 (no bound) or more", name, maxPending)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[name]
	if !ok {
		return Group{}, fmt.Errorf("group %q: %w", name, ErrNotFound)
	}
	g.MaxPending = maxPending
	if err := s.put(ctx, groupsKey.ChildString(name), g); err != nil {
		return Group{}, fmt.Errorf("group %q: %w", name, err)
	}
	s.groups[name] = g
	return g, nil
}

// Group returns a group.
func (s *Store) Group(name string) (Group, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	g, ok := s.groups[name]
	return g, ok
}

// Groups lists the groups by name.
func (s *Store) Groups() []Group {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedValues(s.groups)
}

// CreateSubmitter adds a submitter to a group and returns its first
// token (shown this once: only its hash is kept).
func (s *Store) CreateSubmitter(ctx context.Context, name, group string) (Submitter, string, error) {
	if err := ValidName("submitter", name); err != nil {
		return Submitter{}, "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[group]; !ok {
		return Submitter{}, "", fmt.Errorf("submitter %q: group %q: %w", name, group, ErrNotFound)
	}
	if _, ok := s.submitters[name]; ok {
		return Submitter{}, "", fmt.Errorf("submitter %q: %w", name, ErrExists)
	}
	sub := Submitter{Name: name, Group: group, Created: s.now().UTC()}
	if err := s.put(ctx, submittersKey.ChildString(name), sub); err != nil {
		return Submitter{}, "", fmt.Errorf("submitter %q: %w", name, err)
	}
	s.submitters[name] = sub
	tok, err := s.newToken(ctx, name)
	if err != nil {
		return Submitter{}, "", err
	}
	return sub, tok, nil
}

// Submitters lists the submitters by name.
func (s *Store) Submitters() []Submitter {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return sortedValues(s.submitters)
}

// NewToken makes another token for a submitter (shown this once).
func (s *Store) NewToken(ctx context.Context, submitter string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub, ok := s.submitters[submitter]
	if !ok {
		return "", fmt.Errorf("submitter %q: %w", submitter, ErrNotFound)
	}
	if !sub.Revoked.IsZero() {
		return "", fmt.Errorf("submitter %q: %w", submitter, ErrRevoked)
	}
	return s.newToken(ctx, submitter)
}

// newToken makes and stores a token; callers hold s.mu.
func (s *Store) newToken(ctx context.Context, submitter string) (string, error) {
	var id [idLen / 2]byte
	var secret [32]byte
	for {
		if _, err := rand.Read(id[:]); err != nil {
			return "", fmt.Errorf("token: %w", err)
		}
		if _, dup := s.tokens[hex.EncodeToString(id[:])]; !dup {
			break
		}
	}
	if _, err := rand.Read(secret[:]); err != nil {
		return "", fmt.Errorf("token: %w", err)
	}
	enc := base64.RawURLEncoding.EncodeToString(secret[:])
	t := Token{ID: hex.EncodeToString(id[:]), Submitter: submitter, Hash: secretHash(enc), Created: s.now().UTC()}
	if err := s.put(ctx, tokensKey.ChildString(t.ID), t); err != nil {
		return "", fmt.Errorf("token of %q: %w", submitter, err)
	}
	s.tokens[t.ID] = t
	return TokenPrefix + t.ID + "_" + enc, nil
}

// secretHash is the hex SHA-256 a token's secret is kept as.
func secretHash(secret string) string {
	sum := sha256.Sum256([]byte(secret))
	return hex.EncodeToString(sum[:])
}

// Tokens lists the tokens (never their hashes), by submitter then ID;
// Revoked is when the token, or else its submitter, was revoked.
func (s *Store) Tokens() []TokenInfo {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]TokenInfo, 0, len(s.tokens))
	for _, t := range s.tokens {
		sub := s.submitters[t.Submitter]
		revoked := t.Revoked
		if revoked.IsZero() {
			revoked = sub.Revoked // revoked with its submitter
		}
		out = append(out, TokenInfo{ID: t.ID, Submitter: t.Submitter, Group: sub.Group, Created: t.Created, Revoked: revoked})
	}
	slices.SortFunc(out, func(a, b TokenInfo) int {
		if d := strings.Compare(a.Submitter, b.Submitter); d != 0 {
			return d
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

// RevokeToken revokes one token by its ID. Revoking a revoked token is
// not an error.
func (s *Store) RevokeToken(ctx context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.tokens[id]
	if !ok {
		return fmt.Errorf("token %q: %w", id, ErrNotFound)
	}
	if !t.Revoked.IsZero() {
		return nil
	}
	t.Revoked = s.now().UTC()
	if err := s.put(ctx, tokensKey.ChildString(id), t); err != nil {
		return fmt.Errorf("revoke token %q: %w", id, err)
	}
	s.tokens[id] = t
	return nil
}

// RevokeSubmitter revokes a submitter: every token of theirs, now and
// later, is refused.
func (s *Store) RevokeSubmitter(ctx context.Context, name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	sub, ok := s.submitters[name]
	if !ok {
		return fmt.Errorf("submitter %q: %w", name, ErrNotFound)
	}
	if !sub.Revoked.IsZero() {
		return nil
	}
	sub.Revoked = s.now().UTC()
	if err := s.put(ctx, submittersKey.ChildString(name), sub); err != nil {
		return fmt.Errorf("revoke submitter %q: %w", name, err)
	}
	s.submitters[name] = sub
	return nil
}

// ParseToken splits a submitter token into its ID and secret, checking
// its length and form first.
func ParseToken(token string) (id, secret string, err error) {
	if len(token) != TokenLen || !strings.HasPrefix(token, TokenPrefix) {
		return "", "", ErrMalformed
	}
	rest := token[len(TokenPrefix):]
	id, secret = rest[:idLen], rest[idLen+1:]
	if rest[idLen] != '_' {
		return "", "", ErrMalformed
	}
	if _, err := hex.DecodeString(id); err != nil {
		return "", "", ErrMalformed
	}
	if b, err := base64.RawURLEncoding.DecodeString(secret); err != nil || len(b) != 32 {
		return "", "", ErrMalformed
	}
	return id, secret, nil
}

// LooksLikeToken reports whether s is meant as a submitter token (it has
// the prefix), whatever its length.
func LooksLikeToken(s string) bool { return strings.HasPrefix(s, TokenPrefix) }

// Authenticate returns who holds token: ErrMalformed for a token of the
// wrong length or form, ErrUnknownToken for one whose ID is unknown or
// whose secret is wrong (alike, and in the same time), ErrRevoked for a
// right token that was revoked or whose submitter was.
func (s *Store) Authenticate(token string) (Principal, error) {
	id, secret, err := ParseToken(token)
	if err != nil {
		return Principal{}, err
	}
	h := []byte(secretHash(secret))
	s.mu.RLock()
	defer s.mu.RUnlock()
	t, ok := s.tokens[id]
	want := []byte(t.Hash)
	if !ok {
		want = make([]byte, len(h)) // compared all the same
	}
	if subtle.ConstantTimeCompare(h, want) != 1 || !ok {
		return Principal{}, ErrUnknownToken
	}
	sub := s.submitters[t.Submitter]
	if !t.Revoked.IsZero() || !sub.Revoked.IsZero() || sub.Name == "" {
		return Principal{}, ErrRevoked
	}
	return Principal{Scope: ScopeSubmitter, Submitter: sub.Name, Group: sub.Group, Token: t.ID}, nil
}

// ClaimAgent records that group owns agent: the first claim of a name
// wins, a second claim by the same group is a no-op, and a claim by
// another group fails with ErrNotOwner. It reports whether this call made
// the claim (so a failed upload can give it back, see ReleaseAgent).
func (s *Store) ClaimAgent(ctx context.Context, agent, group string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[group]; !ok {
		return false, fmt.Errorf("agent %q: group %q: %w", agent, group, ErrNotFound)
	}
	if o, ok := s.agents[agent]; ok {
		if o.Group != group {
			return false, fmt.Errorf("agent %q: %w", agent, ErrNotOwner)
		}
		return false, nil
	}
	o := ownership{Agent: agent, Group: group, At: s.now().UTC()}
	if err := s.put(ctx, agentsKey.ChildString(agent), o); err != nil {
		return false, fmt.Errorf("agent %q: %w", agent, err)
	}
	s.agents[agent] = o
	return true, nil
}

// ReleaseAgent gives back a claim this group made (an upload that
// failed before the agent existed).
func (s *Store) ReleaseAgent(ctx context.Context, agent, group string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.agents[agent]; !ok || o.Group != group {
		return nil
	}
	k := agentsKey.ChildString(agent)
	if err := s.ds.Delete(ctx, k); err != nil {
		return fmt.Errorf("release agent %q: %w", agent, err)
	}
	if err := s.ds.Sync(ctx, k); err != nil {
		return fmt.Errorf("release agent %q: %w", agent, err)
	}
	delete(s.agents, agent)
	return nil
}

// AgentOwner returns the group that owns agent, if one does (an agent the
// operator registered has none).
func (s *Store) AgentOwner(agent string) (string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	o, ok := s.agents[agent]
	return o.Group, ok
}

// AgentsOf lists the agents group owns, sorted.
func (s *Store) AgentsOf(group string) []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var out []string
	for name, o := range s.agents {
		if o.Group == group {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// sortedValues are m's values in key order.
func sortedValues[T any](m map[string]T) []T {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]T, len(keys))
	for i, k := range keys {
		out[i] = m[k]
	}
	return out
}
