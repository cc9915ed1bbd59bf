package accounts

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/ipfs/go-datastore/query"

	"github.com/repronet/repronet/internal/badgerds"
)

func openStore(t *testing.T, dir string) (*Store, *badgerds.Datastore) {
	t.Helper()
	ds, err := badgerds.Open(dir, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(context.Background(), ds)
	if err != nil {
		ds.Close()
		t.Fatal(err)
	}
	return s, ds
}

// TestTokens: a token authenticates its submitter in its group; it is
// kept only as a hash; tokens of the wrong length or form, unknown tokens,
// tokens with a wrong secret and revoked tokens are refused, each with its
// error; and all of it survives a reopen of the datastore.
func TestTokens(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, ds := openStore(t, dir)
	if _, err := s.CreateGroup(ctx, "lab-a", 10); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateGroup(ctx, "lab-a", 0); !errors.Is(err, ErrExists) {
		t.Fatalf("second group of one name: %v", err)
	}
	if _, err := s.CreateGroup(ctx, "lab a/..", 0); err == nil || !strings.Contains(err.Error(), "group name") {
		t.Fatalf("bad group name: %v", err)
	}
	if _, _, err := s.CreateSubmitter(ctx, "ann", "nope"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("submitter of an unknown group: %v", err)
	}
	_, annTok, err := s.CreateSubmitter(ctx, "ann", "lab-a")
	if err != nil {
		t.Fatal(err)
	}
	bobTok1, err := func() (string, error) {
		_, tok, err := s.CreateSubmitter(ctx, "bob", "lab-a")
		return tok, err
	}()
	if err != nil {
		t.Fatal(err)
	}
	bobTok2, err := s.NewToken(ctx, "bob")
	if err != nil {
		t.Fatal(err)
	}
	if len(annTok) != TokenLen || !strings.HasPrefix(annTok, TokenPrefix) {
		t.Fatalf("token %q: want %d characters with prefix %s", annTok, TokenLen, TokenPrefix)
	}
	p, err := s.Authenticate(annTok)
	if err != nil || p.Scope != ScopeSubmitter || p.Submitter != "ann" || p.Group != "lab-a" {
		t.Fatalf("ann's token: %+v, %v", p, err)
	}
	// Only hashes are stored: no record holds a token's secret.
	res, err := ds.Query(ctx, query.Query{Prefix: "/state/accounts"})
	if err != nil {
		t.Fatal(err)
	}
	all, _ := res.Rest()
	for _, e := range all {
		for _, tok := range []string{annTok, bobTok1, bobTok2} {
			if bytes.Contains(e.Value, []byte(tok[len(TokenPrefix)+idLen+1:])) {
				t.Fatalf("record %s holds a token's secret", e.Key)
			}
		}
	}
	id, secret, _ := ParseToken(annTok)
	wrongSecret := TokenPrefix + id + "_" + strings.Repeat("A", secretLen-1) + "Q"
	if secret == wrongSecret[len(wrongSecret)-secretLen:] {
		t.Fatal("test token collides")
	}
	refused := []struct {
		name, token string
		want        error
	}{
		{"empty", "", ErrMalformed},
		{"one character short", annTok[:len(annTok)-1], ErrMalformed},
		{"one character long", annTok + "A", ErrMalformed},
		{"no prefix", "xxx_" + annTok[4:], ErrMalformed},
		{"not hex ID", TokenPrefix + "zzzzzzzzzzzz_" + annTok[len(TokenPrefix)+idLen+1:], ErrMalformed},
		{"unknown ID", TokenPrefix + "000000000000_" + annTok[len(TokenPrefix)+idLen+1:], ErrUnknownToken},
		{"wrong secret", wrongSecret, ErrUnknownToken},
	}
	for _, r := range refused {
		if _, err := s.Authenticate(r.token); !errors.Is(err, r.want) {
			t.Fatalf("%s: %v, want %v", r.name, err, r.want)
		}
	}
	// Revoking one token leaves the submitter's others; revoking the
	// submitter refuses all of them.
	bobID, _, _ := ParseToken(bobTok1)
	if err := s.RevokeToken(ctx, bobID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(bobTok1); !errors.Is(err, ErrRevoked) {
		t.Fatalf("revoked token: %v", err)
	}
	if _, err := s.Authenticate(bobTok2); err != nil {
		t.Fatalf("bob's other token: %v", err)
	}
	if err := s.RevokeSubmitter(ctx, "bob"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(bobTok2); !errors.Is(err, ErrRevoked) {
		t.Fatalf("token of a revoked submitter: %v", err)
	}
	if _, err := s.NewToken(ctx, "bob"); !errors.Is(err, ErrRevoked) {
		t.Fatalf("new token of a revoked submitter: %v", err)
	}
	// All of it is durable.
	s = nil
	if err := ds.Close(); err != nil {
		t.Fatal(err)
	}
	s, ds = openStore(t, dir)
	defer ds.Close()
	if p, err := s.Authenticate(annTok); err != nil || p.Group != "lab-a" {
		t.Fatalf("ann after reopen: %+v %v", p, err)
	}
	for _, tok := range []string{bobTok1, bobTok2} {
		if _, err := s.Authenticate(tok); !errors.Is(err, ErrRevoked) {
			t.Fatalf("bob's token after reopen: %v", err)
		}
	}
	if g, ok := s.Group("lab-a"); !ok || g.MaxPending != 10 {
		t.Fatalf("group after reopen: %+v", g)
	}
	infos := s.Tokens()
	if len(infos) != 3 || infos[0].Submitter != "ann" || infos[1].Revoked.IsZero() || infos[2].Revoked.IsZero() {
		t.Fatalf("tokens: %+v", infos)
	}
}

// TestAgentOwnership: the first group to claim an agent's name owns it;
// another group cannot claim (so cannot overwrite) it; a released claim
// is free again; ownership survives a reopen.
func TestAgentOwnership(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	s, ds := openStore(t, dir)
	for _, g := range []string{"lab-a", "lab-b"} {
		if _, err := s.CreateGroup(ctx, g, 0); err != nil {
			t.Fatal(err)
		}
	}
	if made, err := s.ClaimAgent(ctx, "solver", "lab-a"); err != nil || !made {
		t.Fatalf("first claim: %v %v", made, err)
	}
	if made, err := s.ClaimAgent(ctx, "solver", "lab-a"); err != nil || made {
		t.Fatalf("claim again by the owner: %v %v", made, err)
	}
	if _, err := s.ClaimAgent(ctx, "solver", "lab-b"); !errors.Is(err, ErrNotOwner) {
		t.Fatalf("claim by another group: %v", err)
	}
	if _, err := s.ClaimAgent(ctx, "x", "lab-z"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("claim by an unknown group: %v", err)
	}
	if _, err := s.ClaimAgent(ctx, "tmp", "lab-b"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseAgent(ctx, "tmp", "lab-a"); err != nil {
		t.Fatal(err)
	}
	if g, _ := s.AgentOwner("tmp"); g != "lab-b" {
		t.Fatal("another group released a claim it did not make")
	}
	if err := s.ReleaseAgent(ctx, "tmp", "lab-b"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimAgent(ctx, "tmp", "lab-a"); err != nil {
		t.Fatalf("claim of a released name: %v", err)
	}
	ds.Close()
	s, ds = openStore(t, dir)
	defer ds.Close()
	if g, ok := s.AgentOwner("solver"); !ok || g != "lab-a" {
		t.Fatalf("owner after reopen: %q %v", g, ok)
	}
	if got := s.AgentsOf("lab-a"); len(got) != 2 || got[0] != "solver" || got[1] != "tmp" {
		t.Fatalf("agents of lab-a: %v", got)
	}
}

func TestPrincipalMayRead(t *testing.T) {
	sub := Principal{Scope: ScopeSubmitter, Group: "lab-a"}
	for _, c := range []struct {
		p     Principal
		group string
		want  bool
	}{
		{sub, "lab-a", true}, {sub, "lab-b", false}, {sub, "", false},
		{Principal{}, "lab-a", false}, {Principal{}, "", false},
		{Principal{Scope: ScopeAdmin}, "", true}, {Principal{Scope: ScopeAdmin}, "lab-b", true},
	} {
		if got := c.p.MayRead(c.group); got != c.want {
			t.Fatalf("%v MayRead(%q) = %v", c.p, c.group, got)
		}
	}
}
