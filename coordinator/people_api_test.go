package coordinator

import (
	"archive/tar"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/coordinator/accounts"
	"github.com/repronet/repronet/dashboard"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// TestPeople runs the scope tests of the API and the dashboard's browser
// tests on one fixture (building it takes the time: real evaluations over
// libp2p through the metered gateway).
func TestPeople(t *testing.T) {
	f := newPeople(t)
	t.Run("scopes", func(t *testing.T) { testScopes(t, f) })
	t.Run("hal", func(t *testing.T) { testHAL(t, f) })
	t.Run("reliability", func(t *testing.T) { testReliability(t, f) })
	t.Run("browser", func(t *testing.T) { testBrowser(t, f) })
	t.Run("revoke", func(t *testing.T) { testRevoke(t, f) })
}

// testScopes checks every scope boundary of the API on finished work:
// tokens of the wrong length or form, unknown and revoked tokens; a
// submitter reading its group's attempts (by handle: logs, outputs,
// trajectory) but never another group's, a canary, an attempt by its ID,
// a verdict or report (gold), nor anything of the operator's.
func testScopes(t *testing.T, f *people) {
	attsA, attsB := f.attemptsOf(f.evA), f.attemptsOf(f.evB)
	if len(attsA) == 0 || len(attsB) == 0 {
		t.Fatalf("%d and %d attempts", len(attsA), len(attsB))
	}
	h := f.c.web.handle
	rawA := attsA[0].ID
	hA, hB, hCanary := h(rawA), h(attsB[0].ID), h(f.canary)
	var nodeIDs []string
	for _, w := range f.nodes {
		nodeIDs = append(nodeIDs, w.id().String())
	}
	annID, annSecret, _ := accounts.ParseToken(f.ann)
	wrongSecret := accounts.TokenPrefix + annID + "_" + strings.Repeat("B", len(annSecret)-1) + "A"

	type check struct {
		name, token, method, path string
		status                    int
		want                      []string // substrings of the body
		never                     []string // never in the body
	}
	idsOnly := append([]string{rawA, f.canary, hCanary, hB, `"node"`, `"operator"`, "canary", "verdict", `"lower"`}, nodeIDs...)
	checks := []check{
		// Who.
		{"public", "", "GET", "/api/whoami", 200, []string{`"scope": "public"`}, nil},
		{"submitter", f.ann, "GET", "/api/whoami", 200, []string{`"scope": "submitter"`, `"group": "lab-a"`}, nil},
		{"admin", f.admin, "GET", "/api/whoami", 200, []string{`"scope": "admin"`}, nil},
		{"a token one character short", f.ann[:len(f.ann)-1], "GET", "/api/whoami", 401, []string{"malformed submitter token", "60 characters"}, nil},
		{"a token one character long", f.ann + "x", "GET", "/api/evaluations", 401, []string{"malformed"}, nil},
		{"a wrong secret", wrongSecret, "GET", "/api/evaluations", 401, []string{"unknown submitter token"}, nil},
		{"a revoked submitter", f.carl, "GET", "/api/evaluations", 401, []string{"revoked"}, nil},
		{"a revoked submitter on a public path", f.carl, "GET", "/api/leaderboards", 401, []string{"revoked"}, nil},
		{"not a token at all", "not-a-token-at-all", "GET", "/api/evaluations", 401, []string{"unknown bearer token"}, nil},
		{"an admin token one character short", peopleAdmin[:len(peopleAdmin)-1], "GET", "/api/progress", 401, []string{"unknown bearer token"}, nil},

		// A submitter's own work.
		{"own attempts, by handle only", f.ann, "GET", "/api/attempts", 200, []string{hA, `"state": "done"`}, idsOnly},
		{"own attempt", f.ann, "GET", "/api/attempts/" + hA, 200, []string{hA, `"task_correct"`}, idsOnly},
		{"own logs", f.ann, "GET", "/api/attempts/" + hA + "/logs", 200, []string{"agent solver-a on", "nothing to worry about"}, nodeIDs},
		{"own egress record", f.ann, "GET", "/api/attempts/" + hA + "/egress", 200,
			[]string{`"host": "pypi.org"`, `"connections": 3`, `"bytes_received": 1048576`, `"host": "answers.example"`, `"refused": 2`,
				`"omitted": 1`, `"attempt": "` + hA + `"`}, idsOnly},
		{"own outputs", f.ann, "GET", "/api/attempts/" + hA + "/outputs", 200, []string{"report.json"}, []string{"cid"}},
		{"own trajectory", f.ann, "GET", "/api/attempts/" + hA + "/trajectory", 200,
			[]string{"Step 1: what is in results/?", "the figure is 0.96", `"assignment": 1`}, append([]string{rawA, `"lease"`}, nodeIDs...)},
		{"own evaluation", f.ann, "GET", "/api/evaluations/" + f.evA, 200, []string{f.evA, hA}, idsOnly},
		{"own evaluations only", f.ann, "GET", "/api/evaluations", 200, []string{f.evA}, []string{f.evB}},
		{"own agents only", f.bob, "GET", "/api/agents", 200, []string{"solver-b"}, []string{"solver-a", "oracle"}},

		// Another group's work, canaries, IDs.
		{"another group's attempt", f.bob, "GET", "/api/attempts/" + hA, 404, []string{"no attempt"}, nil},
		{"another group's logs", f.bob, "GET", "/api/attempts/" + hA + "/logs", 404, nil, []string{"solver-a"}},
		{"another group's trajectory", f.bob, "GET", "/api/attempts/" + hA + "/trajectory", 404, nil, []string{"Step 1"}},
		{"another group's egress record", f.bob, "GET", "/api/attempts/" + hA + "/egress", 404, nil, []string{"pypi.org"}},
		{"a canary's egress record", f.ann, "GET", "/api/attempts/" + hCanary + "/egress", 404, nil, nil},
		{"an egress record, publicly", "", "GET", "/api/attempts/" + hA + "/egress", 401, nil, []string{"pypi.org"}},
		{"another group's output", f.bob, "GET", "/api/attempts/" + hA + "/outputs/report.json", 404, nil, nil},
		{"another group's trajectory, the other way", f.ann, "GET", "/api/attempts/" + hB + "/trajectory", 404, nil, []string{"Step 1"}},
		{"another group's evaluation", f.ann, "GET", "/api/evaluations/" + f.evB, 404, nil, []string{"solver-b"}},
		{"another group's attempts by evaluation", f.ann, "GET", "/api/attempts?eval=" + f.evB, 200, []string{"[]"}, nil},
		{"an attempt by its ID", f.ann, "GET", "/api/attempts/" + rawA, 404, nil, nil},
		{"a trajectory by its ID", f.ann, "GET", "/api/attempts/" + rawA + "/trajectory", 404, nil, []string{"Step 1"}},
		{"a canary of its own group", f.ann, "GET", "/api/attempts/" + hCanary, 404, nil, nil},
		{"a canary's trajectory", f.ann, "GET", "/api/attempts/" + hCanary + "/trajectory", 404, nil, []string{"Step 1"}},
		{"a canary's logs by its ID", f.ann, "GET", "/api/attempts/" + f.canary + "/logs", 404, nil, nil},
		{"the canary list", f.ann, "GET", "/api/attempts?canaries=1", 403, []string{"operator's only"}, nil},
		{"a forged handle", f.ann, "GET", "/api/attempts/ah-" + strings.Repeat("0", 32), 404, nil, nil},

		// Gold.
		{"a verdict", f.ann, "GET", "/api/attempts/" + hA + "/verdict", 403, []string{"admin only"}, nil},
		{"a report envelope", f.ann, "GET", "/api/reports/" + rawA, 403, []string{"admin only"}, nil},
		{"a verdict, publicly", "", "GET", "/api/attempts/" + hA + "/verdict", 401, nil, nil},

		// The operator's.
		{"nodes", f.ann, "GET", "/api/nodes", 403, nil, nodeIDs},
		{"progress", f.ann, "GET", "/api/progress", 403, nil, nil},
		{"stats", f.ann, "GET", "/api/stats", 403, nil, nil},
		{"cross-check records", f.ann, "GET", "/api/crosscheck/nodes", 403, nil, nil},
		{"metrics", f.ann, "GET", "/metrics", 403, nil, nil},
		{"groups", f.ann, "GET", "/api/groups", 403, nil, nil},
		{"tokens", f.ann, "GET", "/api/tokens", 403, nil, nil},
		{"making a submitter", f.ann, "POST", "/api/submitters", 403, nil, nil},
		{"the operator's reproducibility checks", f.ann, "GET", "/api/repro", 200, []string{"["}, []string{f.repro, f.failed, f.draft}},
		{"public credit", "", "GET", "/api/credit", 200, []string{`"cpu_hours"`}, append([]string{`"nodes": [`}, nodeIDs...)},
		{"submitter's credit", f.ann, "GET", "/api/credit", 200, []string{`"total"`}, nodeIDs},
		{"the admin's credit", f.admin, "GET", "/api/credit", 200, nodeIDs[:1], nil},

		// Public.
		{"attempts need a token", "", "GET", "/api/attempts", 401, []string{"bearer token"}, nil},
		{"evaluations need a token", "", "GET", "/api/evaluations", 401, nil, nil},
		{"the leaderboards are public", "", "GET", "/api/leaderboards", 200, []string{"solver-a", "solver-b"}, nodeIDs},

		// The admin.
		{"the admin by ID", f.admin, "GET", "/api/attempts/" + rawA, 200, []string{rawA, `"node"`}, nil},
		{"the admin by handle", f.admin, "GET", "/api/attempts/" + hCanary, 200, []string{f.canary, `"canary": true`}, nil},
		{"the admin's canaries", f.admin, "GET", "/api/attempts?canaries=1", 200, []string{f.canary}, nil},
		{"the admin's egress record", f.admin, "GET", "/api/attempts/" + rawA + "/egress", 200, []string{`"host": "pypi.org"`, rawA}, nil},
		{"the admin's verdict", f.admin, "GET", "/api/attempts/" + rawA + "/verdict", 200, []string{`"verdict"`}, nil},
		{"the admin's accounts", f.admin, "GET", "/api/tokens", 200, []string{`"submitter": "ann"`}, []string{f.ann, `"hash"`}},
	}
	for _, c := range checks {
		code, body := f.request(c.token, c.method, c.path, nil, "")
		if code != c.status {
			t.Errorf("%s: %s %s: %d %s; want %d", c.name, c.method, c.path, code, body, c.status)
			continue
		}
		for _, s := range c.want {
			if !strings.Contains(body, s) {
				t.Errorf("%s: %s %s: %q not in %s", c.name, c.method, c.path, s, body)
			}
		}
		for _, s := range c.never {
			if strings.Contains(body, s) {
				t.Errorf("%s: %s %s: %q in the answer", c.name, c.method, c.path, s)
			}
		}
	}

	// The output is the agent's file, as an attachment.
	code, body := f.request(f.ann, "GET", "/api/attempts/"+hA+"/outputs/report.json", nil, "")
	if code != 200 || body != f.answer(attsA[0]) {
		t.Errorf("output: %d %q, want %q", code, body, f.answer(attsA[0]))
	}

	// What a submitter may not do.
	refused := []struct {
		name, token, path, body string
		status                  int
		want                    string
	}{
		{"another group's agent", f.ann, "/api/evaluations", `{"suite":"sample","agent":"solver-b"}`, 403, "no agent of that name"},
		{"the operator's agent", f.ann, "/api/evaluations", `{"suite":"sample","agent":"oracle"}`, 403, "no agent of that name"},
		{"for another group", f.ann, "/api/evaluations", `{"suite":"sample","agent":"solver-a","group":"lab-b"}`, 403, "its own group"},
		{"fixed replicas", f.ann, "/api/evaluations", `{"suite":"sample","agent":"solver-a","replicas":1}`, 403, "replicas"},
		{"another group's evaluation ID", f.ann, "/api/evaluations", fmt.Sprintf(`{"id":%q,"suite":"sample","agent":"solver-a"}`, f.evB), 409, "taken"},
		{"publicly", "", "/api/evaluations", `{"suite":"sample","agent":"solver-a"}`, 401, "bearer token"},
		{"revoked", f.carl, "/api/evaluations", `{"suite":"sample","agent":"solver-a"}`, 401, "revoked"},
		{"overwrite another group's agent", f.ann, "/api/agents?name=solver-b", "x", 403, "another group"},
		{"overwrite the operator's agent", f.ann, "/api/agents?name=oracle", "x", 403, "another group"},
		{"push an agent publicly", "", "/api/agents?name=x", "x", 401, "bearer token"},
		{"push what is not an image", f.ann, "/api/agents?name=junk", "not a tarball at all", 400, "image refused"},
		{"push an image whose manifest is missing", f.ann, "/api/agents?name=junk", danglingIndex(t), 400,
			"is not in the archive"},
		{"push an agent with a bad name", f.ann, "/api/agents?name=a/b", "x", 400, "agent name"},
	}
	for _, r := range refused {
		code, body := f.request(r.token, "POST", r.path, strings.NewReader(r.body), "application/json")
		if code != r.status || !strings.Contains(body, r.want) {
			t.Errorf("%s: POST %s: %d %s; want %d with %q", r.name, r.path, code, body, r.status, r.want)
		}
	}
	if _, ok := f.c.web.accounts.AgentOwner("junk"); ok || f.c.HasAgent("junk") {
		t.Error("a push that was no image left an agent or a claim")
	}

	// The evaluation's figures count its attempts, never the canary.
	var ev dashboard.EvaluationDetail
	f.get(t, f.ann, "/api/evaluations/"+f.evA, &ev)
	cost := 0.0
	for _, a := range attsA {
		cost += a.Model.CostUSD
	}
	canary, _ := f.c.Attempt(f.canary)
	// Its progress counts the agent's own attempts, its replays apart
	// (issue 13); its attempt list holds both, replays labelled.
	replays, listed := 0, 0
	for _, a := range attsA {
		if a.Kind == KindReplay {
			replays++
		}
	}
	for _, a := range ev.Attempts {
		if a.Kind == "replay" {
			listed++
		}
	}
	own := len(attsA) - replays
	if math.Abs(ev.CostUSD-cost) > 1e-9 || ev.Progress.Done != own || ev.Progress.Total != own || len(ev.Attempts) != len(attsA) ||
		ev.Progress.Replays != replays || replays == 0 || listed != replays || ev.Progress.Detail != nil || canary.Eval != f.evA {
		t.Errorf("evaluation: cost %v (want %v, the canary's %v apart), progress %+v (want %d own, %d replays), %d attempts (want %d, %d replays labelled), canary of %q",
			ev.CostUSD, cost, canary.Model.CostUSD, ev.Progress, own, replays, len(ev.Attempts), len(attsA), listed, canary.Eval)
	}
	for _, a := range attsA {
		want := 2 * callUSD
		if a.Kind == KindReplay {
			want = 0 // its calls answered from the recording (issue 13)
		}
		if math.Abs(a.Model.CostUSD-want) > 1e-12 || a.Model.Calls != 2 {
			t.Errorf("%s attempt %s: model use %+v, want 2 calls costing $%v in all", cmp.Or(a.Kind, "agent"), a.ID, a.Model, want)
		}
	}
}

// testRevoke: a revoked token is refused at once, the submitter's other
// tokens still work.
func testRevoke(t *testing.T, f *people) {
	var tok NewTokenResponse
	f.post(t, f.admin, "/api/tokens", `{"submitter":"ann"}`, &tok)
	if code, body := f.request(tok.Token, "GET", "/api/evaluations", nil, ""); code != 200 {
		t.Fatalf("a new token: %d %s", code, body)
	}
	id, _, _ := accounts.ParseToken(f.ann)
	f.post(t, f.admin, "/api/tokens/"+id+"/revoke", "", nil)
	if code, body := f.request(f.ann, "GET", "/api/evaluations", nil, ""); code != 401 || !strings.Contains(body, "revoked") {
		t.Fatalf("a revoked token: %d %s", code, body)
	}
	if code, _ := f.request(tok.Token, "GET", "/api/evaluations", nil, ""); code != 200 {
		t.Fatalf("the submitter's other token after a revocation: %d", code)
	}
	if code, body := f.request(f.admin, "POST", "/api/tokens/nope/revoke", nil, ""); code != 404 {
		t.Fatalf("revoking an unknown token: %d %s", code, body)
	}
}

// TestSubmitterQuotaAndPending: a group's quota bounds its unfinished
// attempts; while an attempt runs its submitter sees it only as pending,
// without times, logs or trajectory (a node could time them against its
// own work); two groups' evaluation IDs never mix.
func TestSubmitterQuotaAndPending(t *testing.T) {
	c := openTestWith(t, t.TempDir(), func(cfg *Config) { cfg.AdminToken = testToken })
	defer c.Close()
	ctx := context.Background()
	acc := c.Accounts()
	if _, err := acc.CreateGroup(ctx, "lab-q", 4); err != nil {
		t.Fatal(err)
	}
	_, tok, err := acc.CreateSubmitter(ctx, "quinn", "lab-q")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acc.ClaimAgent(ctx, "oracle", "lab-q"); err != nil {
		t.Fatal(err)
	}
	h := c.Handler()
	post := func(body string) (int, string) {
		rec := do(h, "POST", "/api/evaluations", tok, body)
		return rec.Code, rec.Body.String()
	}
	// The sample suite has 3 tasks: 3 attempts of 4 fit, 3 more do not.
	if code, body := post(`{"id":"q1","suite":"sample","agent":"oracle","levels":["easy"]}`); code != 200 {
		t.Fatalf("first evaluation: %d %s", code, body)
	}
	if code, body := post(`{"id":"q1","suite":"sample","agent":"oracle","levels":["easy"]}`); code != 200 || !strings.Contains(body, `"attempts": 3`) {
		t.Fatalf("the same request again (queues nothing): %d %s", code, body)
	}
	if code, body := post(`{"id":"q2","suite":"sample","agent":"oracle","levels":["hard"]}`); code != 429 || !strings.Contains(body, "quota") {
		t.Fatalf("over the quota: %d %s", code, body)
	}
	if n := len(c.Attempts()); n != 3 {
		t.Fatalf("%d attempts queued, want 3", n)
	}
	// A push over an agent with unfinished attempts is a new version for
	// new evaluations: the queued ones keep running the image they were
	// queued with, so that every replica runs one image.
	_, before, err := c.jobRecipe(c.Attempts()[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	var v2 bytes.Buffer
	if _, err := ociimage.Build(&v2, "repronet.local/agents/oracle:v2", []ociimage.File{{Path: "/agent/run", Mode: 0o755,
		Data: []byte("#!/bin/sh\necho v2\n")}}, ociimage.Config{Entrypoint: []string{"/agent/run"}}); err != nil {
		t.Fatal(err)
	}
	if rec := do(h, "POST", "/api/agents?name=oracle", tok, v2.String()); rec.Code != http.StatusOK {
		t.Fatalf("push over an agent with unfinished attempts: %d %s", rec.Code, rec.Body)
	}
	if ag, _ := c.Agent("oracle"); ag.CID == cid.MustParse(before.GetImageCid()).String() {
		t.Fatal("the push did not change the agent")
	}
	for _, a := range c.Attempts() {
		_, r, err := c.jobRecipe(a.ID)
		if err != nil || !bytes.Equal(r.GetImageCid(), before.GetImageCid()) {
			t.Fatalf("attempt %s queued before the push now runs another image: %v", a.ID, err)
		}
	}

	// One attempt runs: the submitter sees it pending, like the queued.
	var atts []dashboard.Attempt
	if err := json.Unmarshal(do(h, "GET", "/api/attempts", tok, "").Body.Bytes(), &atts); err != nil {
		t.Fatal(err)
	}
	first := c.Attempts()[0]
	n := newTestNode(t)
	assign(t, c, first.ID, n)
	running := do(h, "GET", "/api/attempts/"+c.web.handle(first.ID), tok, "").Body.String()
	if !strings.Contains(running, `"state": "pending"`) || strings.Contains(running, `"started"`) || strings.Contains(running, n.id.String()) {
		t.Fatalf("a running attempt as its submitter sees it: %s", running)
	}
	for _, p := range []string{"/logs", "/trajectory", "/outputs/report.json"} {
		if rec := do(h, "GET", "/api/attempts/"+c.web.handle(first.ID)+p, tok, ""); rec.Code != http.StatusConflict {
			t.Fatalf("%s of a running attempt: %d %s", p, rec.Code, rec.Body)
		}
	}
	// (Its placement queued its second replica: 4 pending.)
	var evs []dashboard.Evaluation
	if err := json.Unmarshal(do(h, "GET", "/api/evaluations", tok, "").Body.Bytes(), &evs); err != nil || len(evs) != 1 ||
		evs[0].Progress.Pending != len(c.Attempts()) || evs[0].Progress.Detail != nil {
		t.Fatalf("evaluations while one runs: %+v (%v)", evs, err)
	}
	// Once it reports, the submitter sees it done, with its times.
	if ack := c.Ingest(ctx, seal(t, c, n, first.ID, proto.Outcome_OUTCOME_OK, oracleReport(t, c, first.ID))); !ack.GetAccepted() {
		t.Fatal(ack)
	}
	settle(t, c)
	done := do(h, "GET", "/api/attempts/"+c.web.handle(first.ID), tok, "").Body.String()
	if !strings.Contains(done, `"state": "done"`) || !strings.Contains(done, `"started"`) || !strings.Contains(done, `"outcome": "ok"`) {
		t.Fatalf("a finished attempt as its submitter sees it: %s", done)
	}
	// The admin sees the split and the ID.
	var adminEvs []dashboard.Evaluation
	if err := json.Unmarshal(do(h, "GET", "/api/evaluations", testToken, "").Body.Bytes(), &adminEvs); err != nil || adminEvs[0].Progress.Detail == nil {
		t.Fatalf("the admin's evaluations: %+v (%v)", adminEvs, err)
	}
}

// TestAttemptHandles: a handle names its attempt and nothing else; a
// changed handle names none.
func TestAttemptHandles(t *testing.T) {
	c := openTest(t, t.TempDir())
	defer c.Close()
	w := c.web
	id := "at-0123456789abcdef01234567"
	h := w.handle(id)
	if got, ok := w.attemptID(h); !ok || got != id || strings.Contains(h, "0123456789abcdef") {
		t.Fatalf("handle %q of %s: back %q %v", h, id, got, ok)
	}
	for i := len(handlePrefix); i < len(h); i++ {
		b := []byte(h)
		b[i] ^= 1
		if got, ok := w.attemptID(string(b)); ok {
			t.Fatalf("handle changed at %d names %s", i, got)
		}
	}
	for _, bad := range []string{"", "ah-", "ah-zz", "at-xyz", "x"} {
		if _, ok := w.attemptID(bad); ok {
			t.Fatalf("%q names an attempt", bad)
		}
	}
	if w.handle("not-an-attempt-id") != "" {
		t.Fatal("a handle of an ID the core never makes")
	}
	// Handles are stable across restarts (the key derives from the
	// identity).
	dir := t.TempDir()
	c1 := openTest(t, dir)
	h1 := c1.web.handle(id)
	c1.Close()
	c2 := openTest(t, dir)
	defer c2.Close()
	if c2.web.handle(id) != h1 {
		t.Fatal("a handle changed across a restart")
	}
}

// danglingIndex is an OCI layout whose index.json names a manifest the
// archive does not hold: no node could import it.
func danglingIndex(t *testing.T) string {
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	index := `{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:` +
		strings.Repeat("0", 64) + `","size":2}]}`
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "index.json", Size: int64(len(index)), Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(index))
	tw.Close()
	return b.String()
}
