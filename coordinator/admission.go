package coordinator

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/journal"
	"github.com/repronet/repronet/proto"
)

// Operators and admission. (Who counts as which operator is the core's
// rule: core.State.operatorOfNode; this file keeps the join tokens.)
//
// The cross-check never counts two replicas of one unit from nodes of one
// operator, so "operator" is what stands between the leaderboard and one
// person with many keys. An operator certificate proves only that some
// key vouches for a node; anyone can make keys. So only operators the
// coordinator has admitted count as operators of their own: the peer IDs
// of Config.Operators, and operators admitted with a join token (a node
// presents the token on /repronet/join/1.0.0 and its certificate's signer,
// or the node itself without a certificate, is admitted). Every other
// node counts as one operator, UnadmittedOperator: it still gets work,
// but all such nodes together hold at most one replica of a unit, so they
// can never outvote an admitted operator. Config.OpenOperators restores
// the trust of any certificate, for a pool one person runs.

// JoinToken is the durable record of a join token: its SHA-256, never the
// token itself.
type JoinToken struct {
	Hash    string    `json:"hash"`
	Label   string    `json:"label"`
	Expires time.Time `json:"expires,omitzero"`
	// Uses left; negative: unlimited.
	Uses    int       `json:"uses"`
	Created time.Time `json:"created"`
}

// tokenHash is the hex SHA-256 a token is kept under.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// MaxJoinTokenLen bounds a join token presented by a node.
const MaxJoinTokenLen = 256

// matchToken returns the stored token whose hash is token's, comparing
// every stored hash in constant time. Callers hold c.mu.
func (c *Coordinator) matchToken(token string) (*JoinToken, error) {
	if token == "" || len(token) > MaxJoinTokenLen {
		return nil, fmt.Errorf("join token must be 1-%d bytes", MaxJoinTokenLen)
	}
	h := []byte(tokenHash(token))
	var found *JoinToken
	for _, t := range c.joinTokens {
		if subtle.ConstantTimeCompare(h, []byte(t.Hash)) == 1 {
			found = t
		}
	}
	if found == nil {
		return nil, errors.New("unknown join token")
	}
	return found, nil
}

// usable says why t cannot admit another operator at now, if it cannot.
func (t *JoinToken) usable(now time.Time) error {
	switch {
	case !t.Expires.IsZero() && now.After(t.Expires):
		return fmt.Errorf("join token %q expired at %s", t.Label, t.Expires.Format(time.RFC3339))
	case t.Uses == 0:
		return fmt.Errorf("join token %q has no uses left", t.Label)
	}
	return nil
}

// joinTokensKey is the prefix of the join tokens' records (by hash).
var joinTokensKey = datastore.NewKey("/state/jointokens")

// admitConfigured admits the operators of the configuration and adds its
// standing join tokens; callers hold c.mu (at start-up).
func (c *Coordinator) admitConfigured() error {
	for _, op := range c.cfg.Operators {
		if _, err := peer.Decode(op); err != nil {
			return fmt.Errorf("admitted operator %q: %w", op, err)
		}
		c.stepLocked(core.Admit{Operator: op, Via: "config"})
	}
	for i, tok := range c.cfg.JoinTokens {
		if tok == "" || len(tok) > MaxJoinTokenLen {
			return fmt.Errorf("join token %d of the configuration: must be 1-%d bytes", i, MaxJoinTokenLen)
		}
		h := tokenHash(tok)
		if _, ok := c.joinTokens[h]; !ok {
			c.joinTokens[h] = &JoinToken{Hash: h, Label: fmt.Sprintf("config-%d", i+1), Uses: -1}
		}
	}
	return nil
}

// NewJoinToken makes a join token: label names it, it admits operators
// until expires (zero: never) and at most uses times (negative: no
// limit). Only its hash is stored; the token is returned once.
func (c *Coordinator) NewJoinToken(ctx context.Context, label string, uses int, expires time.Time) (string, error) {
	if !proto.ValidLabel(label, proto.MaxFilterLen) {
		return "", fmt.Errorf("join token label %q: want 1-%d of [A-Za-z0-9._+-]", label, proto.MaxFilterLen)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("join token: %w", err)
	}
	token := "rnj_" + base64.RawURLEncoding.EncodeToString(b[:])
	if err := c.addJoinToken(ctx, token, label, uses, expires); err != nil {
		return "", err
	}
	return token, nil
}

// addJoinToken stores the hash of token.
func (c *Coordinator) addJoinToken(ctx context.Context, token, label string, uses int, expires time.Time) error {
	if token == "" || len(token) > MaxJoinTokenLen {
		return fmt.Errorf("join token %q: must be 1-%d bytes", label, MaxJoinTokenLen)
	}
	if uses == 0 {
		uses = -1
	}
	jt := &JoinToken{Hash: tokenHash(token), Label: label, Expires: expires, Uses: uses, Created: time.Now()}
	c.mu.Lock()
	c.joinTokens[jt.Hash] = jt
	t := c.putToken(jt)
	c.mu.Unlock()
	if err := t.Wait(ctx); err != nil {
		return fmt.Errorf("store join token %q: %w", label, err)
	}
	return nil
}

// Join admits the operator of node with a join token. certificate is the
// node's operator certificate (empty: the node is its own operator). It is
// idempotent: an operator already admitted uses no token use.
func (c *Coordinator) Join(ctx context.Context, node peer.ID, token string, certificate []byte) (string, error) {
	op := node
	if len(certificate) > 0 {
		var err error
		if op, err = proto.OpenOperatorCert(certificate, node, c.cfg.Network); err != nil {
			return "", fmt.Errorf("join: %w", err)
		}
	}
	c.mu.Lock()
	jt, err := c.matchToken(token)
	if err != nil {
		c.mu.Unlock()
		return "", fmt.Errorf("join: %w", err)
	}
	if _, ok := c.state.Admitted[op.String()]; ok {
		c.mu.Unlock()
		return op.String(), c.durable(ctx, nil) // admitted before: no use of the token
	}
	if err := jt.usable(time.Now()); err != nil {
		c.mu.Unlock()
		return "", fmt.Errorf("join: %w", err)
	}
	if jt.Uses > 0 {
		jt.Uses--
		c.putToken(jt)
	}
	fx, t := c.stepLocked(core.Admit{Operator: op.String(), Via: "token:" + jt.Label})
	c.mu.Unlock()
	c.carry(ctx, fx, t)
	if err := c.durable(ctx, t); err != nil {
		return "", fmt.Errorf("join: %w", err)
	}
	c.log.Info("operator admitted", "operator", op, "node", node, "token", jt.Label)
	return op.String(), nil
}

// Admit admits an operator by its peer ID (the admin's decision).
func (c *Coordinator) Admit(ctx context.Context, operator string) error {
	if _, err := peer.Decode(operator); err != nil {
		return fmt.Errorf("admit operator %q: %w", operator, err)
	}
	_, t := c.step(ctx, core.Admit{Operator: operator, Via: "admin"})
	return c.durable(ctx, t)
}

// Operators lists the admitted operators, sorted.
func (c *Coordinator) Operators() []Admitted {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.state.OperatorList()
}

// putToken queues a write of a join token's record; callers hold c.mu.
func (c *Coordinator) putToken(jt *JoinToken) *journal.Ticket {
	t, err := c.journal.PutJSON(joinTokensKey.ChildString(jt.Hash), jt)
	if err != nil {
		c.log.Error("join token record not written", "label", jt.Label, "err", err)
	}
	return t
}

// JoinTokenRequest is the body of POST /api/join-tokens: a label, the uses
// (0: unlimited) and how long the token lives (a Go duration; empty:
// forever).
type JoinTokenRequest struct {
	Label     string `json:"label"`
	Uses      int    `json:"uses"`
	ExpiresIn string `json:"expires_in"`
}

// JoinTokenResponse answers it with the token, shown this once.
type JoinTokenResponse struct {
	Token   string    `json:"token"`
	Label   string    `json:"label"`
	Expires time.Time `json:"expires,omitzero"`
}

func (c *Coordinator) handleNewJoinToken(w http.ResponseWriter, r *http.Request) {
	var req JoinTokenRequest
	if !decodeRequest(w, r, "join token request", &req) {
		return
	}
	var expires time.Time
	if req.ExpiresIn != "" {
		d, err := time.ParseDuration(req.ExpiresIn)
		if err != nil || d <= 0 {
			writeJSON(w, http.StatusBadRequest, apiError{fmt.Sprintf("join token request: expires_in %q: want a positive duration like 72h", req.ExpiresIn)})
			return
		}
		expires = time.Now().Add(d)
	}
	if req.Uses < 0 {
		writeJSON(w, http.StatusBadRequest, apiError{"join token request: uses must be 0 (unlimited) or more"})
		return
	}
	tok, err := c.NewJoinToken(r.Context(), req.Label, req.Uses, expires)
	if err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, JoinTokenResponse{Token: tok, Label: req.Label, Expires: expires})
}

func (c *Coordinator) handleAdmit(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Operator string `json:"operator"`
	}
	if !decodeRequest(w, r, "admit request", &req) {
		return
	}
	if err := c.Admit(r.Context(), req.Operator); err != nil {
		writeJSON(w, http.StatusBadRequest, apiError{err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, Admitted{Operator: req.Operator, Via: "admin"})
}

// handleJoin serves /repronet/join/1.0.0.
func (c *Coordinator) handleJoin(s network.Stream) {
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	var req proto.JoinRequest
	if err := proto.ReadMsg(s, &req, proto.MaxControlSize); err != nil {
		s.Reset()
		return
	}
	node := s.Conn().RemotePeer()
	resp := &proto.JoinResponse{}
	op, err := c.Join(context.Background(), node, req.GetToken(), req.GetOperatorCert())
	if err != nil {
		resp.Reason = err.Error()
		if ok, unlogged := c.joinLog.Allow(); ok {
			c.log.Warn("join refused", "node", node, "err", err, "refusals_not_logged_before", unlogged)
		}
	} else {
		resp.Admitted, resp.Operator = true, op
	}
	if err := proto.WriteMsg(s, resp); err != nil {
		s.Reset()
	}
}
