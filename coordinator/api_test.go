package coordinator

import (
	"context"
	"encoding/json"
	"fmt"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/bench/repro"
	"github.com/repronet/repronet/proto"
)

const testToken = "0123456789abcdef-token"

func openAPITest(t testing.TB) (*Coordinator, http.Handler) {
	t.Helper()
	c := openTest(t, t.TempDir())
	c.cfg.AdminToken = testToken
	return c, c.Handler()
}

func do(h http.Handler, method, path, token, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func TestAPI(t *testing.T) {
	c, h := openAPITest(t)
	defer c.Close()
	body := `{"id":"w1","suite":"sample","agent":"oracle","levels":["easy","hard"],"replicas":2,"group":"lab-a","priority":3}`
	tests := []struct {
		name, method, path, token, body string
		status                          int
		want                            string
	}{
		{"submit without a token", "POST", "/api/evaluations", "", body, 401, "bearer token"},
		{"submit with a wrong token", "POST", "/api/evaluations", "nope", body, 401, "bearer token"},
		{"unknown field", "POST", "/api/evaluations", testToken, `{"suite":"sample","gold":1}`, 400, "unknown field"},
		{"bad level", "POST", "/api/evaluations", testToken, `{"suite":"sample","agent":"oracle","levels":["x"]}`, 400, "level"},
		{"unknown agent", "POST", "/api/evaluations", testToken, `{"suite":"sample","agent":"zz","levels":["easy"]}`, 400, "no agent"},
		{"submit", "POST", "/api/evaluations", testToken, body, 200, `"attempts": 12`},
		{"submit again: nothing more", "POST", "/api/evaluations", testToken, body, 200, `"attempts": 12`},
		{"progress", "GET", "/api/progress", testToken, "", 200, `"queued": 12`},
		{"progress is not public", "GET", "/api/progress", "", "", 401, "bearer token"},
		{"evaluations", "GET", "/api/evaluations", testToken, "", 200, `"group": "lab-a"`},
		{"evaluations are not public", "GET", "/api/evaluations", "", "", 401, "bearer token"},
		{"stats", "GET", "/api/stats", testToken, "", 200, `"reassignments": 0`},
		{"stats are not public", "GET", "/api/stats", "", "", 401, "bearer token"},
		{"leaderboards", "GET", "/api/leaderboards", "", "", 200, `"scoring"`},
		{"entries: pending, no gold", "GET", "/api/leaderboard/entries", "", "", 200, `"status": "pending"`},
		{"attempts are admin only", "GET", "/api/attempts", "", "", 401, "bearer token"},
		{"attempts", "GET", "/api/attempts", testToken, "", 200, `"state": "queued"`},
		{"reports are admin only", "GET", "/api/reports/at-000000000000000000000000", "", "", 401, "bearer token"},
		{"no report yet", "GET", "/api/reports/at-000000000000000000000000", testToken, "", 404, "not found"},
		{"bad attempt ID", "GET", "/api/reports/..x", testToken, "", 400, "attempt_id"},
		{"the node list is admin only", "GET", "/api/nodes", "", "", 401, "bearer token"},
		{"the node list", "GET", "/api/nodes", testToken, "", 200, "[]"},
		{"the network's size is public", "GET", "/api/network", "", "", 200, `"free_slots": 0`},
		{"cross-check records are admin only", "GET", "/api/crosscheck/nodes", "", "", 401, "bearer token"},
		{"cross-check records", "GET", "/api/crosscheck/nodes", testToken, "", 200, "[]"},
		{"no such check", "GET", "/api/repro/rp-nope", "", "", 404, "no such"},
		{"repro submit is admin only", "POST", "/api/repro", "", "", 401, "bearer token"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := do(h, tt.method, tt.path, tt.token, tt.body)
			if rec.Code != tt.status || !strings.Contains(rec.Body.String(), tt.want) {
				t.Fatalf("%s %s: %d %s; want %d with %q", tt.method, tt.path, rec.Code, rec.Body, tt.status, tt.want)
			}
		})
	}
	// A recorded report is served as its signed envelope, which verifies;
	// the attempt's verdict is served without anything derived from gold.
	n := newTestNode(t)
	first := c.Attempts()[0].ID
	assign(t, c, first, n)
	oracle := oracleReport(t, c, first)
	if ack := c.Ingest(context.Background(), seal(t, c, n, first, proto.Outcome_OUTCOME_OK, oracle)); !ack.GetAccepted() {
		t.Fatal(ack)
	}
	settle(t, c)
	if rec := do(h, "GET", "/api/attempts", testToken, ""); rec.Code != 200 || strings.Contains(rec.Body.String(), `"lower"`) ||
		strings.Contains(rec.Body.String(), `"answer"`) || !strings.Contains(rec.Body.String(), `"task_correct": true`) {
		t.Fatalf("attempts after a graded report: %d %s", rec.Code, rec.Body)
	}
	rec := do(h, "GET", "/api/reports/"+first, testToken, "")
	var env ReportEnvelopeJSON
	if err := json.Unmarshal(rec.Body.Bytes(), &env); err != nil {
		t.Fatal(err)
	}
	if _, signer, err := proto.OpenReport(env.Envelope); err != nil || signer != n.id {
		t.Fatalf("served envelope: signer %v err %v", signer, err)
	}
	// The public entries hold no times and only rounded figures; the
	// admin's are exact. (Found live: a node matched the exact CPU time and
	// start of public entries against its own attempts.)
	c.mu.Lock()
	c.state.Attempts[first].Usage.CPUSeconds = 1.2345
	c.mu.Unlock()
	var public, live []leaderboard.Entry
	for _, x := range []struct {
		token string
		into  *[]leaderboard.Entry
	}{{"", &public}, {testToken, &live}} {
		c.cfg.PublicBoardsEvery = -1
		rec := do(c.Handler(), "GET", "/api/leaderboard/entries", x.token, "")
		if err := json.Unmarshal(rec.Body.Bytes(), x.into); err != nil {
			t.Fatal(err)
		}
	}
	found := false
	for i := range live {
		if live[i].CPUSeconds == 0 {
			continue
		}
		found = true
		if live[i].CPUSeconds != 1.2345 || live[i].Started.IsZero() {
			t.Fatalf("admin entry: cpu %v, started %v; want exact", live[i].CPUSeconds, live[i].Started)
		}
		if public[i].CPUSeconds != 1.2 || !public[i].Started.IsZero() || !public[i].Finished.IsZero() {
			t.Fatalf("public entry: cpu %v, started %v, finished %v; want 1.2 and no times", public[i].CPUSeconds,
				public[i].Started, public[i].Finished)
		}
	}
	if !found {
		t.Fatal("no entry with a CPU time")
	}

	// Without a token configured the admin API is off; what a submitter
	// may do still asks for a (submitter's) token.
	c.cfg.AdminToken = ""
	for _, p := range []struct {
		route  string
		status int
	}{{"POST /api/evaluations", 401}, {"GET /api/attempts", 401}, {"GET /api/reports/" + first, 403}} {
		method, path, _ := strings.Cut(p.route, " ")
		if rec := do(c.Handler(), method, path, "", body); rec.Code != p.status {
			t.Fatalf("API without an admin token answered %s with %d, want %d", p.route, rec.Code, p.status)
		}
	}
}

// oracleReport is the report.json of an agent that answers attempt id's
// task with its first gold run.
func oracleReport(t testing.TB, c *Coordinator, id string) string {
	t.Helper()
	a := state(t, c, id)
	s, _ := c.catalog.LookupSuite(a.Suite)
	task, _ := s.Bench.(*family.Suite).Task(a.TaskID)
	b, err := json.Marshal(task.Results[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// FuzzSubmitEvaluation: whatever an authenticated client posts, the
// handler answers 200 or 400 and never panics; what it queues is bounded.
func FuzzSubmitEvaluation(f *testing.F) {
	c, h := openAPITest(f)
	defer c.Close()
	f.Add(`{"id":"w1","suite":"sample","agent":"oracle","levels":["easy"],"replicas":2}`)
	f.Add(`{"suite":"sample","agent":"oracle","levels":["easy","medium","hard"],"runs":-1}`)
	f.Add(`{"replicas":100000}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		before := len(c.Attempts())
		rec := do(h, "POST", "/api/evaluations", testToken, body)
		if rec.Code != 200 && rec.Code != 400 {
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
		var req EvaluationRequest
		if json.Unmarshal([]byte(body), &req) == nil && rec.Code == 200 {
			limit := max(1, req.Runs) * MaxReplicas * 3 * len(sample.CapsuleIDs())
			if got := len(c.Attempts()) - before; got > limit {
				t.Fatalf("one request queued %d attempts", got)
			}
		}
	})
}

// reproBody builds a POST /api/repro body: a spec part (when spec is not
// empty), then a capsule part.
func reproBody(t testing.TB, spec string, capsule []byte) (string, string) {
	t.Helper()
	var b strings.Builder
	mw := multipart.NewWriter(&b)
	if spec != "" {
		w, _ := mw.CreateFormField("spec")
		w.Write([]byte(spec))
	}
	w, _ := mw.CreateFormFile("capsule", "c.tar.gz")
	w.Write(capsule)
	mw.Close()
	return b.String(), mw.FormDataContentType()
}

func TestReproAPI(t *testing.T) {
	dir := t.TempDir()
	c := openTest(t, dir)
	c.cfg.AdminToken = testToken
	h := c.Handler()
	tb, err := sample.CapsuleTarball("capsule-0000002")
	if err != nil {
		t.Fatal(err)
	}
	spec := `{"capsule": {"field": "F", "language": "Shell", "capsule_title": "T", "capsule_id": "capsule-0000002", "capsule_doi": "", "task_prompt": "Run it."},
	 "rules": [{"question": "Report the number of time points.", "file": "results/growth.txt", "kind": "regex", "expr": "(?m)^n_timepoints (\\S+)$", "type": "number"}]}`
	post := func(spec string, capsule []byte) *httptest.ResponseRecorder {
		body, ct := reproBody(t, spec, capsule)
		req := httptest.NewRequest("POST", "/api/repro", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", ct)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, tt := range []struct {
		name, spec string
		capsule    []byte
		want       string
	}{
		{"no spec before the capsule", "", tb, "spec part must come before"},
		{"a bad spec", `{"capsule": {}}`, tb, "field capsule"},
		{"another capsule than the spec's", strings.Replace(spec, "0000002", "0000009", 1), tb, "top folder is"},
		{"not a tarball", spec, []byte("zzzz"), "capsule tarball"},
	} {
		if rec := post(tt.spec, tt.capsule); rec.Code != 400 || !strings.Contains(rec.Body.String(), tt.want) {
			t.Errorf("%s: %d %s", tt.name, rec.Code, rec.Body)
		}
	}
	rec := post(spec, tb)
	var resp ReproResponse
	if err := json.Unmarshal(rec.Body.Bytes(), &resp); rec.Code != 200 || err != nil || resp.ID == "" {
		t.Fatalf("submit: %d %s", rec.Code, rec.Body)
	}
	get := do(h, "GET", "/api/repro/"+resp.ID, "", "")
	var st repro.Status
	if err := json.Unmarshal(get.Body.Bytes(), &st); err != nil || st.State != repro.StateQueued || st.RunsWanted != repro.DefaultRuns {
		t.Fatalf("status: %d %s", get.Code, get.Body)
	}
	// Three capsule runs are queued, on the submitted capsule, in the
	// fallback image, asking for the rule's file; the submitted results
	// are kept as the claimed answers.
	c.mu.Lock()
	rr := *c.state.Repros[resp.ID]
	var ids []string
	for _, u := range rr.Units {
		ids = append(ids, c.state.Units[u]...)
	}
	c.mu.Unlock()
	var asgs []*proto.Assignment
	for _, id := range ids {
		a, err := c.assignment(id)
		if err != nil {
			t.Fatal(err)
		}
		asgs = append(asgs, a)
	}
	if len(asgs) != 3 || rr.Image != FallbackReproImage || !strings.Contains(string(rr.Claimed["results/growth.txt"]), "n_timepoints 7") {
		t.Fatalf("check %+v, %d assignments", rr, len(asgs))
	}
	for _, a := range asgs {
		r := a.GetRecipe()
		if a.GetSuite() != ReproSuite || len(r.GetOutputs()) != 1 || !strings.HasSuffix(r.GetOutputs()[0].GetPath(), "/results/growth.txt") ||
			!r.GetEntrypointSet() || len(r.GetEntrypoint()) != 0 {
			t.Fatalf("assignment %v", a)
		}
		if err := proto.ValidateAssignment(a); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	c = openTest(t, dir)
	defer c.Close()
	if st, err := c.ReproStatus(context.Background(), resp.ID); err != nil || st.RunsWanted != 3 {
		t.Fatalf("after a restart: %+v %v", st, err)
	}
}

// TestPublicBoardsAreSnapshots: a public board stays as it was when its
// snapshot was taken until PublicBoardsEvery has passed, however the state
// moves meanwhile; an admin request sees the state live.
func TestPublicBoardsAreSnapshots(t *testing.T) {
	c := openTest(t, t.TempDir())
	defer c.Close()
	c.cfg.AdminToken = testToken
	c.cfg.PublicBoardsEvery = time.Hour
	h := c.Handler()
	submit := func(t *testing.T, id string) {
		t.Helper()
		body := `{"id":"` + id + `","suite":"sample","agent":"oracle","levels":["easy"]}`
		if rec := do(h, "POST", "/api/evaluations", testToken, body); rec.Code != 200 {
			t.Fatalf("submit %s: %d %s", id, rec.Code, rec.Body)
		}
	}
	submit(t, "w1")
	for i, path := range []string{"/api/leaderboards", "/api/leaderboard/entries"} {
		t.Run(path, func(t *testing.T) {
			first := do(h, "GET", path, "", "")
			if first.Code != 200 || first.Header().Get("Last-Modified") == "" {
				t.Fatalf("first: %d, Last-Modified %q", first.Code, first.Header().Get("Last-Modified"))
			}
			live0 := do(h, "GET", path, testToken, "").Body.String()
			// The public reads an evaluation by its label, the admin by
			// its ID: the rest is the same.
			evals := regexp.MustCompile(`"eval": "[^"]*"`)
			if pub := first.Body.String(); strings.Contains(path, "entries") &&
				(strings.Contains(pub, `"eval": "w1"`) || !strings.Contains(pub, `"eval": "ev~`) || !strings.Contains(live0, `"eval": "w1"`)) {
				t.Errorf("evaluations named %v publicly, %v to the admin", evals.FindAllString(pub, 2), evals.FindAllString(live0, 2))
			}
			if evals.ReplaceAllString(live0, "") != evals.ReplaceAllString(first.Body.String(), "") {
				t.Fatalf("a fresh snapshot differs from the live board:\n%s\n%s", first.Body, live0)
			}
			submit(t, fmt.Sprintf("w-%d", i)) // more pending entries on every board
			if again := do(h, "GET", path, "", ""); again.Body.String() != first.Body.String() {
				t.Errorf("the public board moved within its snapshot interval:\n%s", again.Body)
			}
			if live := do(h, "GET", path, testToken, ""); live.Body.String() == live0 {
				t.Error("the admin view did not move with the state")
			}
		})
	}
}

func TestSnapshotsExpire(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	for _, tc := range []struct {
		name  string
		every time.Duration
		after time.Duration
		fresh bool
	}{
		{"within the interval", time.Minute, 59 * time.Second, false},
		{"at the interval", time.Minute, time.Minute, true},
		{"long after", time.Minute, time.Hour, true},
		{"live (negative)", -1, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &snapshots{every: tc.every, taken: map[string]snapshot{}}
			n := 0
			f := func() any { n++; return n }
			s.get("/p", t0, f)
			got := s.get("/p", t0.Add(tc.after), f)
			want := "1\n"
			if tc.fresh {
				want = "2\n"
			}
			if string(got.body) != want {
				t.Errorf("body %q, want %q", got.body, want)
			}
			if other := s.get("/q", t0.Add(tc.after), f); string(other.body) == string(got.body) {
				t.Error("two paths share a snapshot")
			}
		})
	}
}

// TestMetrics: GET /metrics is admin-only and shows the coordinator's
// state (attempts by state after a submission), Go's, and the libp2p
// host's own metrics.
func TestMetrics(t *testing.T) {
	c, h := openAPITest(t)
	defer c.Close()
	if rec := do(h, "GET", "/metrics", "", ""); rec.Code != http.StatusUnauthorized {
		t.Fatalf("metrics without a token: %d", rec.Code)
	}
	body := `{"id":"w1","suite":"sample","agent":"oracle","levels":["easy","hard"],"replicas":2}`
	if rec := do(h, "POST", "/api/evaluations", testToken, body); rec.Code != 200 {
		t.Fatalf("submit: %d %s", rec.Code, rec.Body)
	}
	rec := do(h, "GET", "/metrics", testToken, "")
	if rec.Code != 200 {
		t.Fatalf("metrics: %d %s", rec.Code, rec.Body)
	}
	for _, want := range []string{
		`repronet_coordinator_attempts{state="queued"} 12`,
		`repronet_coordinator_attempts{state="done"} 0`,
		`repronet_coordinator_units 6`,
		`repronet_coordinator_nodes 0`,
		`repronet_coordinator_capsule_store_bytes{kind="used"}`,
		"go_goroutines",
		"libp2p_", // the host's own
	} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}
