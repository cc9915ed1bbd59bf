package coordinator

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/dashboard"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// The dashboard in a real browser: Debian's chromium, headless, driven
// over the DevTools protocol (chromedp), one browser for the test binary
// and a browser context (its own cookies) per reader. Set
// REPRONET_SCREENSHOTS=DIR to write the screenshots docs/ shows.

// tab is one reader's tab, with the console messages of its page.
type tab struct {
	t    *testing.T
	ctx  context.Context
	base string
	mu   sync.Mutex
	msgs []chromedp.ConsoleMessage
}

func newTab(t *testing.T, browser context.Context, base string) *tab {
	ctx, cancel := chromedp.NewContext(browser, chromedp.WithNewBrowserContext())
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	tb := &tab{t: t, ctx: ctx, base: base}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			tb.mu.Lock()
			tb.msgs = append(tb.msgs, m)
			tb.mu.Unlock()
		}
	}()
	return tb
}

// open loads path and checks its status; a page that should load (200)
// must write no error or warning to the console (a failed resource, a
// policy violation, an exception); another may only log its own status.
func (tb *tab) open(path string, status int) {
	tb.t.Helper()
	tb.mu.Lock()
	tb.msgs = nil
	tb.mu.Unlock()
	ctx, cancel := context.WithTimeout(tb.ctx, 15*time.Second)
	defer cancel()
	resp, err := chromedp.Run(ctx, chromedp.NavigateResponse(tb.base+path))
	if err != nil {
		tb.t.Fatalf("open %s: %v", path, err)
	}
	if int(resp.Status) != status {
		tb.t.Fatalf("open %s: status %d, want %d: %s", path, resp.Status, status, tb.text())
	}
	tb.checkConsole(path, status)
}

// checkConsole fails on the console's errors and warnings since the page
// was asked for (waiting a moment for late ones).
func (tb *tab) checkConsole(path string, status int) {
	tb.t.Helper()
	time.Sleep(50 * time.Millisecond)
	tb.mu.Lock()
	defer tb.mu.Unlock()
	for _, m := range tb.msgs {
		if m.Type != chromedp.ConsoleError && m.Type != chromedp.ConsoleException && m.Type != chromedp.ConsoleWarning {
			continue
		}
		if status != 200 && strings.Contains(m.Text, fmt.Sprintf("status of %d", status)) {
			continue // the page's own status, asked for
		}
		tb.t.Errorf("%s: console %s: %s (%s)", path, m.Type, m.Text, m.URL)
	}
}

// text is the page's visible text; html its markup.
func (tb *tab) text() string { return tb.eval(`document.body ? document.body.innerText : ""`) }
func (tb *tab) html() string { return tb.eval(`document.documentElement.outerHTML`) }

func (tb *tab) eval(js string) string {
	tb.t.Helper()
	s, err := chromedp.Run(tb.ctx, chromedp.Evaluate[string](js))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", js, err)
	}
	return s
}

func (tb *tab) number(js string) float64 {
	tb.t.Helper()
	v, err := chromedp.Run(tb.ctx, chromedp.Evaluate[float64](js))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", js, err)
	}
	return v
}

// has fails unless the page's text holds every one of want.
func (tb *tab) has(what string, want ...string) {
	tb.t.Helper()
	text := tb.text()
	for _, w := range want {
		if !strings.Contains(text, w) {
			tb.t.Errorf("%s: %q not on the page:\n%s", what, w, text)
		}
	}
}

// lacks fails if the page's markup holds any of never.
func (tb *tab) lacks(what string, never ...string) {
	tb.t.Helper()
	html := tb.html()
	for _, n := range never {
		if n != "" && strings.Contains(html, n) {
			tb.t.Errorf("%s: %q in the page", what, n)
		}
	}
}

// submit submits a form and waits for the page it leads to; it returns
// that page's status.
func (tb *tab) submit(form string, fill ...chromedp.Action[chromedp.Void]) int {
	tb.t.Helper()
	tb.mu.Lock()
	tb.msgs = nil
	tb.mu.Unlock()
	ctx, cancel := context.WithTimeout(tb.ctx, 15*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, fill...); err != nil {
		tb.t.Fatalf("fill %s: %v", form, err)
	}
	resp, err := chromedp.RunResponse(ctx, chromedp.Submit(chromedp.CSS(form)))
	if err != nil {
		tb.t.Fatalf("submit %s: %v", form, err)
	}
	return int(resp.Status)
}

// signIn signs in with token through the sign-in form.
func (tb *tab) signIn(token string, status int) {
	tb.t.Helper()
	tb.open("/login", 200)
	if got := tb.submit("#login", chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), token)); got != status {
		tb.t.Fatalf("sign in: status %d, want %d: %s", got, status, tb.text())
	}
	tb.checkConsole("sign-in", status)
}

// shot writes a screenshot of the page when REPRONET_SCREENSHOTS names a
// folder.
func (tb *tab) shot(name string) {
	dir := os.Getenv("REPRONET_SCREENSHOTS")
	if dir == "" {
		return
	}
	b, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		tb.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+".png"), b, 0o644); err != nil {
		tb.t.Fatal(err)
	}
}

// startBrowser starts headless chromium for the test.
func startBrowser(t *testing.T) context.Context {
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium is not installed: scripts/setup.sh installs Debian's chromium for these tests")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.WindowSize(1280, 900), chromedp.Flag("lang", "en-US"))
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	browser, cancel := chromedp.NewContext(alloc)
	t.Cleanup(cancel)
	if err := chromedp.Do(browser); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return browser
}

// testBrowser: each page loads without console errors, shows the
// fixture's numbers, and respects scopes: the public sees the boards and
// the pool, a submitter its group's work but never another group's
// attempt, a canary, an attempt ID or a verdict, the admin everything;
// the Pareto chart renders; the forms push an agent and start an
// evaluation.
func testBrowser(t *testing.T, f *people) {
	browser := startBrowser(t)
	attsA, attsB := f.attemptsOf(f.evA), f.attemptsOf(f.evB)
	h := f.c.web.handle
	hA, hB, hCanary := h(attsA[0].ID), h(attsB[0].ID), h(f.canary)
	var nodeIDs, rawIDs []string
	for _, w := range f.nodes {
		nodeIDs = append(nodeIDs, w.id().String())
	}
	for _, a := range append(attsA, attsB...) {
		rawIDs = append(rawIDs, a.ID)
	}
	rawIDs = append(rawIDs, f.canary, hCanary)
	// lab-a's own attempts and replays (issue 13), and one own attempt a
	// replay verified and one not drawn for a replay.
	var own, replays []Attempt
	var verified, notDrawn Attempt
	for _, a := range attsA {
		switch {
		case a.Kind == KindReplay:
			replays = append(replays, a)
		case a.Verification != nil && a.Verification.State == "verified":
			verified = a
		case a.Verification != nil && a.Verification.State == core.VerifyNotDrawn:
			notDrawn = a
		}
		if a.Kind != KindReplay {
			own = append(own, a)
		}
	}
	// A new node's every result is drawn for a replay, so some are
	// verified; one is left undrawn only once a replay was judged before
	// its node's next result was scored, as a rule but not always.
	if len(replays) == 0 || verified.ID == "" {
		t.Fatalf("the fixture has %d replays and verified attempt %q: want some", len(replays), verified.ID)
	}
	if notDrawn.ID == "" {
		t.Log("every one of lab-a's results was drawn for a replay: the checks of one not drawn are skipped")
	}
	// The boards' verified column counts solver-a's validated sampled
	// units and those a replay verified, as the entries say.
	sampled, replayVerified := 0, 0
	for _, e := range f.c.PublicEntries() {
		if e.Agent == "solver-a" && e.Variant == "easy" && e.Status == "validated" && e.Verification != "" {
			sampled++
			if e.Verification == "verified" {
				replayVerified++
			}
		}
	}

	t.Run("public", func(t *testing.T) {
		tb := newTab(t, browser, f.srv.URL)
		tb.t = t
		tb.open("/", 200)
		// Every board row shows what /api/leaderboards says of it, cell by
		// cell; solver-a: run 1 two of three right, run 2 all: 83.3%
		// (66.7-100%), 3 x 2 calls x $0.002 = $0.012 a run.
		if n := sameBoards(t, f, tb, "", ""); n < 5 {
			t.Errorf("%d board rows compared, want solver-a's two, solver-b's, solver-free's and solver-wait's", n)
		}
		rows := pageRows(tb)
		if r := rows["sample/easy/solver-a"]; r["acc"] != "83.3%" || r["range"] != "66.7%–100.0%" || r["cost"] != "$0.012" {
			t.Errorf("solver-a's easy row %v", r)
		}
		// A row without a validated run (its units scored, awaiting a
		// replica no node can run): no accuracy, its units counted.
		if r := rows["sample/easy/solver-wait"]; r["acc"] != "—" || r["range"] != "—" || r["runs"] != "0" || r["unvalidated"] == "0" && r["pending"] == "0" && r["infra"] == "0" {
			t.Errorf("solver-wait's row %v: want no accuracy, its units awaiting", r)
		}
		if first := tb.eval(`document.querySelector('section.board tbody tr').dataset.agent`); first != "solver-a" && first != "solver-free" {
			t.Errorf("first row %q, want the most accurate", first)
		}
		// The charts: easy weighs CPU time (solver-free has no model
		// cost) and plots every agent with a validated run; medium, one
		// agent with a model cost, its one label inside the chart.
		for _, c := range []struct {
			level, axis, xlabel string
			points              int
		}{{"easy", dashboard.CostCompute, "compute per run (CPU time) →", 3}, {"medium", dashboard.CostModel, "model cost per run (USD) →", 1}} {
			svg := `document.querySelector('section.board[data-level="` + c.level + `"] svg.pareto')`
			if axis := tb.eval(svg + `.dataset.axis`); axis != c.axis {
				t.Errorf("%s chart on %q, want %q", c.level, axis, c.axis)
			}
			if n := tb.number(svg + `.querySelectorAll('g.point').length`); n != float64(c.points) {
				t.Errorf("%s chart: %v points, want %d", c.level, n, c.points)
			}
			if got := tb.eval(svg + `.querySelector('text.x-label').textContent`); got != c.xlabel {
				t.Errorf("%s chart's x axis says %q, want %q", c.level, got, c.xlabel)
			}
			inside := tb.number(`(() => { const svg = ` + svg + `; const s = svg.getBoundingClientRect();
				return [...svg.querySelectorAll('circle, text.label')].filter(c => { const r = c.getBoundingClientRect();
				return r.width > 0 && r.left >= s.left && r.right <= s.right && r.top >= s.top && r.bottom <= s.bottom; }).length })()`)
			if inside != float64(2*c.points) {
				t.Errorf("%s chart: %v of %d points and labels drawn inside it", c.level, inside, 2*c.points)
			}
		}
		if w := tb.number(`document.querySelector('svg.pareto').getBoundingClientRect().width`); w < 300 {
			t.Errorf("the chart is %v pixels wide", w)
		}
		if fill := tb.eval(`getComputedStyle(document.querySelector('svg.pareto g.on-frontier circle')).fill`); fill != "rgb(36, 87, 197)" {
			t.Errorf("frontier points filled %q: the style sheet is not applied", fill)
		}
		// Verification by replay: solver-a's runs are model-driven (its
		// attempts made model calls), some verified, some not drawn.
		if got, want := rows["sample/easy/solver-a"]["verified"], fmt.Sprintf("%d of %d", replayVerified, sampled); got != want || sampled != 6 || replayVerified == 0 {
			t.Errorf("solver-a's replay-verified cell %q, want %q (of its 6 units)", got, want)
		}
		tb.has("boards", "Cross-checked", "Replay-verified", "Awaiting cross-check", "Written", "Vision")
		// CORE-Bench grades each job one way: no grader in the heading.
		if n := tb.number(`document.querySelectorAll('section.board[data-grader], section.board .grader').length`); n != 0 {
			t.Errorf("%v CORE-Bench boards name a grader", n)
		}
		tb.lacks("boards", append(nodeIDs, rawIDs...)...)
		tb.shot("leaderboards")

		tb.open("/agents/solver-a", 200)
		if n := sameBoards(t, f, tb, "", "solver-a"); n != 2 {
			t.Errorf("%d rows of solver-a compared, want its easy and medium ones", n)
		}
		if n := tb.number(`document.querySelectorAll('table.tasks tbody tr').length`); n != float64(2*len(f.tasks)) {
			t.Errorf("%v task rows for solver-a, want %d (easy and medium)", n, 2*len(f.tasks))
		}
		tb.has("agent", "1: 0.00", "2: 1.00")
		// Each task's runs as the public entries say: a validated run's
		// score (CORE-Bench: 1 when every question is right), else its
		// status.
		var entries []struct {
			Agent, Status string
			Level         string `json:"level"`
			TaskID        string `json:"task_id"`
			Run           int
			Score         *struct {
				TaskCorrect bool `json:"task_correct"`
			}
		}
		f.get(t, "", "/api/leaderboard/entries", &entries)
		cellsOf := map[string][]string{}
		for _, e := range entries {
			if e.Agent != "solver-a" {
				continue
			}
			v := e.Status
			if e.Score != nil {
				v = map[bool]string{true: "1.00", false: "0.00"}[e.Score.TaskCorrect]
			}
			k := e.Level + "/" + e.TaskID
			cellsOf[k] = append(cellsOf[k], fmt.Sprintf("%d: %s", e.Run, v))
		}
		for _, r := range tb.cells("table.tasks tbody tr") {
			same(t, "solver-a's task "+r["data-task"], r, map[string]string{"c3": strings.Join(cellsOf[r["data-level"]+"/"+r["data-task"]], " ")})
		}
		tb.shot("agent")

		tb.open("/nodes", 200)
		tb.has("nodes", "Nodes in view", "CPU-hours")
		tb.lacks("nodes", nodeIDs...)
		// A reproducibility check: each run's value (7, 7, 8), the 95%
		// prediction interval (mean 7.33 +- t(0.975, 2) x 0.577 x sqrt(4/3)),
		// the claimed value inside it.
		// Each check's page says what /api/repro/{id} says: the one whose
		// runs reproduce the published value says yes; the one whose
		// seed is not the published one says no (issue 23: it said yes).
		if r := sameRepro(t, f, tb, f.failed); r.Report.Reproducible {
			t.Errorf("the failing check is reproducible: %+v", r.Report)
		}
		if got := tb.eval(`document.getElementById('reproducible').innerText`); got != "no" {
			t.Errorf("the failing check says Reproducible %q", got)
		}
		tb.shot("repro-failed")
		if r := sameRepro(t, f, tb, f.repro); !r.Report.Reproducible {
			t.Errorf("the passing check is not reproducible: %+v", r.Report)
		}
		tb.has("check", "Report the number of time points.", "[4.465, 10.2] (mean 7.333, n=3)", "yes", "done")
		if vals := strings.Split(tb.eval(`document.querySelector('table.questions tbody td:nth-child(3)').innerText`), ", "); len(vals) != 3 ||
			strings.Count(strings.Join(vals, " "), "7") != 2 || !slices.Contains(vals, "8") {
			t.Errorf("values per run %q, want 7, 7 and 8", vals)
		}
		tb.shot("repro")
		// A draft check (no rules): each value with its file, values per
		// run and verdict; n_timepoints (7, 7, 8) kept with its interval,
		// seed 42 stable, the time each run finished flagged; the draft
		// spec to download holds a rule per kept value.
		// It is compared with what the capsule published: the runs agree
		// with each other on fixed_seed_random 0.166599 and the seed 42,
		// the capsule published 0.178395 and 41: not reproduced.
		dr := sameRepro(t, f, tb, f.draft)
		tb.has("draft", "Draft task entry", "results/growth.txt", "[4.465, 10.2] (mean 7.333, n=3)", "42, 42, 42", "3 of 4 values kept")
		verdicts := tb.eval(`[...document.querySelectorAll('table.draft tbody tr')].map(r => r.dataset.verdict + ':' + r.dataset.comparison).join(' ')`)
		if verdicts != "interval:reproduced stable:not_reproduced stable:not_reproduced timestamp:not_published" {
			t.Errorf("draft verdicts %q", verdicts)
		}
		if dr.Report.Reproducible || tb.eval(`document.getElementById('reproducible').innerText`) != "no" || len(dr.Report.Draft.Unproduced) == 0 {
			t.Errorf("a draft whose runs disagree with the published values: %+v", dr.Report)
		}
		tb.has("draft", "0.178395", "published 0.178395, every run gives 0.166599", "NOT reproduced by the runs")
		href := tb.eval(`document.getElementById('draft-spec').getAttribute('href')`)
		code, spec := f.request("", "GET", href, nil, "")
		var ds struct {
			Rules []struct{ Question, File string }
		}
		if code != 200 || json.Unmarshal([]byte(spec), &ds) != nil || len(ds.Rules) != 3 || ds.Rules[0].File != "results/growth.txt" {
			t.Errorf("draft spec at %s: %d %s", href, code, spec)
		}
		if code, _ := f.request("", "GET", "/repro/"+f.repro+"/draft-spec.json", nil, ""); code != 404 {
			t.Errorf("a check with rules has a draft spec: %d", code)
		}
		tb.shot("repro-draft")
		tb.open("/evaluations", 401)
		tb.has("evaluations, publicly", "Sign in to see this page")
		if next := tb.eval(`document.querySelector('#login input[name="next"]').value`); next != "/evaluations" {
			t.Errorf("the sign-in form goes back to %q", next)
		}
		tb.open("/attempts/"+hA, 401)
		tb.lacks("an attempt, publicly", "solver-a on")
		tb.open("/no/such/page", 404)
	})

	t.Run("submitter", func(t *testing.T) {
		tb := newTab(t, browser, f.srv.URL)
		tb.t = t
		// Asked for an evaluation's page, ann signs in and lands on it.
		tb.open("/evaluations/"+f.evA, 401)
		if got := tb.submit("#login", chromedp.SendKeys(chromedp.CSS(`input[name="token"]`), f.ann)); got != 200 {
			t.Fatalf("sign in: status %d: %s", got, tb.text())
		}
		if loc := tb.eval(`location.pathname`); loc != "/evaluations/"+f.evA {
			t.Errorf("after sign-in at %s, want the page asked for", loc)
		}
		// Never to another site.
		for _, next := range []string{"//evil.example/x", "https://evil.example/", "/\\evil.example"} {
			req, _ := http.NewRequest("POST", f.srv.URL+"/login", strings.NewReader(url.Values{"token": {f.ann}, "next": {next}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil || resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/evaluations" {
				t.Errorf("sign-in with next %q: %v %v", next, resp.Header.Get("Location"), err)
			}
		}
		// A sign-in posted by another site's form (login CSRF: the victim's
		// browser signed in as the attacker) is refused, and sets no cookie.
		for _, h := range []map[string]string{{"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}} {
			req, _ := http.NewRequest("POST", f.srv.URL+"/login", strings.NewReader(url.Values{"token": {f.ann}}.Encode()))
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			for k, v := range h {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultTransport.RoundTrip(req)
			if err != nil || resp.StatusCode != http.StatusForbidden || len(resp.Cookies()) != 0 {
				t.Errorf("a cross-site sign-in %v: %v, %d cookies, %v", h, resp.Status, len(resp.Cookies()), err)
			}
		}
		tb.signIn(f.ann, 200)
		if loc := tb.eval(`location.pathname`); loc != "/evaluations" {
			t.Errorf("after sign-in at %s", loc)
		}
		if who := tb.eval(`document.getElementById('who').innerText`); who != "submitter ann · group lab-a" {
			t.Errorf("signed in as %q", who)
		}
		if evs := tb.eval(`[...document.querySelectorAll('tr[data-eval]')].map(r => r.dataset.eval).join(' ')`); evs != f.evA2+" "+f.evA {
			t.Errorf("evaluations listed: %q, want %s and %s", evs, f.evA2, f.evA)
		}
		// Progress counts the agent's own attempts, replays apart.
		bar := `document.querySelector('tr[data-eval="` + f.evA + `"] svg.bar')`
		if done, total := tb.number(`+`+bar+`.dataset.done`), tb.number(`+`+bar+`.dataset.total`); done != float64(len(own)) || total != done {
			t.Errorf("progress bar %v of %v, want %d of %d", done, total, len(own), len(own))
		}
		tb.has("evaluations", fmt.Sprintf("%d done", len(own)), fmt.Sprintf("+%d replays", len(replays)))
		// Each listed evaluation as GET /api/evaluations says.
		var evs []dashboard.Evaluation
		f.get(t, f.ann, "/api/evaluations", &evs)
		listed := tb.cells("table.evaluations tbody tr")
		if len(listed) != len(evs) {
			t.Fatalf("%d evaluations listed, the API has %d", len(listed), len(evs))
		}
		for i, e := range evs {
			same(t, "listed evaluation "+e.ID, listed[i], map[string]string{"data-eval": e.ID, "c1": e.Suite, "c2": e.Agent, "c3": e.Group,
				"c4": strings.Join(e.Levels, ", "), "c5": fmt.Sprintf("%d", e.Runs), "c7": dashboard.FormatUSD(e.CostUSD)})
			if bar := tb.cells(`tr[data-eval="` + e.ID + `"] svg.bar`); len(bar) != 1 || bar[0]["data-done"] != fmt.Sprintf("%d", e.Progress.Done) ||
				bar[0]["data-total"] != fmt.Sprintf("%d", e.Progress.Total) {
				t.Errorf("listed evaluation %s: progress %v, the API says %+v", e.ID, bar, e.Progress)
			}
		}

		// Two evaluations of one agent: each page is its own runs, as the
		// API says, never the other's level or runs.
		d2 := sameEvaluation(t, f, tb, f.ann, f.evA2)
		if len(d2.Boards) != 1 || d2.Boards[0].Variant != "medium" || d2.Boards[0].Rows[0].Runs != 1 || len(d2.Tasks) != len(f.tasks) {
			t.Errorf("the second evaluation's results: %+v", d2.Boards)
		}
		d := sameEvaluation(t, f, tb, f.ann, f.evA)
		if len(d.Boards) != 1 || d.Boards[0].Variant != "easy" || d.Boards[0].Rows[0].Runs != 2 || len(d.Tasks) != len(f.tasks) {
			t.Errorf("the first evaluation's results: %+v", d.Boards)
		}
		tb.has("evaluation", "83.3%", fmt.Sprintf("%d done", len(own)), fmt.Sprintf("+%d replays", len(replays)), "$0.048")
		links := tb.eval(`[...document.querySelectorAll('table.attempts td:first-child a')].map(a => a.getAttribute('href')).join(' ')`)
		if n := len(strings.Fields(links)); n != len(attsA) || strings.Count(links, "/attempts/ah-") != n {
			t.Errorf("attempt links %q: want %d handles", links, len(attsA))
		}
		// Replays are labelled, each naming the attempt it replays by its
		// handle; the agent's own attempts say where verification stands.
		if n := tb.number(`[...document.querySelectorAll('table.attempts tr[data-kind="replay"]')].filter(r => r.querySelector('.kind-replay').innerText == 'replay').length`); n != float64(len(replays)) {
			t.Errorf("%v attempts labelled replays, want %d", n, len(replays))
		}
		if got := tb.eval(`document.querySelector('tr[data-attempt="` + h(replays[0].ID) + `"] td.verification').innerText`); got != "replays "+h(replays[0].ReplayOf) {
			t.Errorf("replay row says %q, want it to name %s", got, h(replays[0].ReplayOf))
		}
		if got := tb.eval(`document.querySelector('tr[data-attempt="` + h(verified.ID) + `"] td.verification').innerText`); got != "replay-verified" {
			t.Errorf("a verified attempt's row says %q", got)
		}
		tb.lacks("evaluation", append(nodeIDs, rawIDs...)...)
		tb.shot("evaluation")

		// An attempt's verification, in words, never the node's rate.
		sameAttempt(t, f, tb, f.ann, h(verified.ID))
		if st := tb.eval(`document.getElementById('verification').dataset.state`); st != "verified" {
			t.Errorf("verified attempt's state %q", st)
		}
		tb.has("a verified attempt", "answers bound to the trajectory: yes", "replayed: 1 time", "Another volunteer re-ran the attempt's tools")
		if notDrawn.ID != "" {
			tb.open("/attempts/"+h(notDrawn.ID), 200)
			tb.has("an attempt not drawn", "unverified: not picked for a replay", "replayed: no")
			tb.lacks("an attempt's verification", "node's rate", notDrawn.Verification.Reason)
		}
		sameAttempt(t, f, tb, f.ann, h(replays[0].ID))
		tb.has("a replay", "replay of "+h(replays[0].ReplayOf))
		if href := tb.eval(`document.querySelector('#kind a').getAttribute('href')`); href != "/attempts/"+h(replays[0].ReplayOf) {
			t.Errorf("the replay links to %q", href)
		}
		tb.lacks("a replay", append(nodeIDs, rawIDs...)...)

		sameAttempt(t, f, tb, f.ann, hA)
		tb.has("attempt", "done", "agent solver-a on", "nothing to worry about", "Step 1: what is in results/?", "the figure is 0.96",
			"Call 1 · sim-1", "Call 2 · sim-1", "report.json")
		if n := tb.number(`document.querySelectorAll('article.call').length`); n != 2 {
			t.Errorf("%v calls in the trajectory, want 2", n)
		}
		// The conversation is read once: the second call adds what is new
		// (the first's answer came before it), tool results indented.
		if n := strings.Count(tb.text(), "You reproduce papers."); n != 1 {
			t.Errorf("the system prompt shown %d times, want once", n)
		}
		if got := tb.eval(`document.querySelector('article.call[data-seq="1"] p.earlier').dataset.earlier`); got != "4" {
			t.Errorf("the second call repeats %q earlier messages, want 4 (system, step 1, its tool result, the answer)", got)
		}
		if n := tb.number(`[...document.querySelectorAll('pre.tool-result')].filter(p => p.innerText.startsWith('{\n')).length`); n != 2 {
			t.Errorf("%v tool results shown indented, want 2", n)
		}
		tb.lacks("attempt", append(append([]string{"Verdict", "canary"}, nodeIDs...), rawIDs...)...)
		tb.shot("attempt")

		// Another group's attempt, a canary of its own group's work, an
		// attempt by its ID, another group's evaluation, the operator's
		// pages: none opens.
		for _, p := range []string{"/attempts/" + hB, "/attempts/" + hCanary, "/attempts/" + attsA[0].ID, "/attempts/" + f.canary,
			"/evaluations/" + f.evB} {
			tb.open(p, 404)
			tb.lacks(p, "solver-b on", "solver-a on", "Step 1")
		}
		for _, p := range []string{"/repro", "/admin/accounts"} {
			tb.open(p, 403)
			tb.has(p, "This page is the operator's.")
		}

		// Push an agent with the form, then evaluate it with the other.
		var img bytes.Buffer
		if _, err := ociimage.Build(&img, "repronet.local/agents/form:test", []ociimage.File{{Path: "/agent/run", Mode: 0o755,
			Data: []byte("#!/bin/sh\n")}}, ociimage.Config{Entrypoint: []string{"/agent/run"}}); err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "agent.tar")
		if err := os.WriteFile(file, img.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		tb.open("/agents", 200)
		// The group's agents as GET /api/agents says.
		var agents []dashboard.Agent
		f.get(t, f.ann, "/api/agents", &agents)
		rows := tb.cells("table.agents tbody tr")
		if len(rows) != len(agents) || len(agents) == 0 {
			t.Fatalf("%d agents listed, the API has %d", len(rows), len(agents))
		}
		for i, a := range agents {
			same(t, "agent "+a.Name, rows[i], map[string]string{"data-agent": a.Name, "c1": a.Group, "c2": a.Model,
				"c3": map[bool]string{true: "yes", false: "no"}[a.Deterministic], "c4": dashboard.FormatBytes(a.Size), "digest": a.SHA256})
		}
		if got := tb.submit("#push-agent", chromedp.SendKeys(chromedp.CSS(`input[name="name"]`), "solver-form"),
			chromedp.SetUploadFiles(chromedp.CSS(`input[name="image"]`), []string{file})); got != 200 {
			t.Fatalf("push with the form: %d %s", got, tb.text())
		}
		tb.checkConsole("push", 200)
		tb.has("push", "Agent solver-form pushed", fmt.Sprintf("%d bytes", img.Len()))
		if g, ok := f.c.web.accounts.AgentOwner("solver-form"); !ok || g != "lab-a" {
			t.Errorf("the form's agent is owned by %q", g)
		}
		tb.open("/evaluations", 200)
		if got := tb.submit("#start-evaluation", chromedp.SetValue(chromedp.CSS(`select[name="agent"]`), "solver-form"),
			chromedp.SendKeys(chromedp.CSS(`input[name="levels"]`), "hard")); got != 200 {
			t.Fatalf("start with the form: %d %s", got, tb.text())
		}
		tb.checkConsole("start", 200)
		loc := tb.eval(`location.pathname`)
		ev := strings.TrimPrefix(loc, "/evaluations/")
		if rec, ok := f.c.Evaluations(), false; ev == loc || len(rec) == 0 {
			t.Fatalf("after starting at %s (%v)", loc, ok)
		}
		tb.has("started", "solver-form", "hard")
		if e := evalRecord(f.c, ev); e.Group != "lab-a" || e.Agent != "solver-form" {
			t.Errorf("the form's evaluation: %+v", e)
		}
		// A form posted without its form token (as another site would) is
		// refused.
		jar := &http.Cookie{Name: cookieName, Value: f.ann}
		req, _ := http.NewRequest("POST", f.srv.URL+"/evaluations", strings.NewReader(url.Values{"suite": {"sample"}, "agent": {"solver-a"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.AddCookie(jar)
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
			t.Errorf("a form without its token: %v %v", resp.StatusCode, err)
		}
	})

	t.Run("other group", func(t *testing.T) {
		tb := newTab(t, browser, f.srv.URL)
		tb.t = t
		tb.signIn(f.bob, 200)
		if evs := tb.eval(`[...document.querySelectorAll('tr[data-eval]')].map(r => r.dataset.eval).join(' ')`); evs != f.evB {
			t.Errorf("bob's evaluations: %q", evs)
		}
		tb.open("/attempts/"+hA, 404)
		tb.lacks("another group's attempt", "solver-a on", "Step 1")
		tb.open("/attempts/"+hB, 200)
		tb.has("own attempt", "agent solver-b on")
	})

	t.Run("admin", func(t *testing.T) {
		tb := newTab(t, browser, f.srv.URL)
		tb.t = t
		tb.signIn(f.admin, 200)
		tb.open("/nodes", 200)
		if n := tb.number(`document.querySelectorAll('table.nodes tbody tr').length`); n != 3 {
			t.Errorf("%v node rows, want 3", n)
		}
		if n := tb.number(`document.querySelectorAll('svg.credit rect').length`); n != 3 {
			t.Errorf("%v credit bars, want one per operator (3)", n)
		}
		// Nodes, operators and their bars say what /api/credit says.
		var cr dashboard.CreditReport
		f.get(t, f.admin, "/api/credit", &cr)
		nodes := map[string]map[string]string{}
		for _, r := range tb.cells("table.nodes tbody tr") {
			nodes[r["data-node"]] = r
		}
		for _, n := range cr.Nodes {
			same(t, "node "+n.Name, nodes[n.Name], map[string]string{"c4": fmt.Sprintf("%.2f", n.Reliability), "c5": fmt.Sprintf("%d", n.Attempts),
				"c6": dashboard.Hours(n.CPUHours), "c7": dashboard.Hours(n.WallHours)})
		}
		ops := tb.cells("table.credit tbody tr")
		bars := strings.Split(tb.eval(`[...document.querySelectorAll('svg.credit text')].filter((_, i) => i % 2 == 1).map(t => t.textContent).join('|')`), "|")
		if len(ops) != len(cr.Operators) || len(bars) != len(cr.Operators) {
			t.Fatalf("%d operator rows and %d bars, the API has %d operators", len(ops), len(bars), len(cr.Operators))
		}
		for i, o := range cr.Operators {
			same(t, "operator "+o.Name, map[string]string{"attempts": ops[i]["c1"], "cpu": ops[i]["c2"], "wall": ops[i]["c3"], "bar": bars[i]},
				map[string]string{"attempts": fmt.Sprintf("%d", o.Attempts), "cpu": dashboard.Hours(o.CPUHours), "wall": dashboard.Hours(o.WallHours),
					"bar": dashboard.Hours(o.CPUHours) + " CPU-h"})
		}
		tb.shot("nodes")
		tb.open("/admin/accounts", 200)
		tb.has("accounts", "ann", "bob", "carl", "lab-a", "lab-b")
		// Groups as GET /api/groups says: unfinished attempts, quota.
		var groups []dashboard.Group
		f.get(t, f.admin, "/api/groups", &groups)
		listed := map[string]map[string]string{}
		for _, r := range tb.cells("table.groups tbody tr") {
			listed[r["data-group"]] = r
		}
		for _, g := range groups {
			want := fmt.Sprintf("%d", g.Pending)
			if g.MaxPending > 0 {
				want += fmt.Sprintf(" of at most %d", g.MaxPending)
			}
			same(t, "group "+g.Name, listed[g.Name], map[string]string{"c1": want, "c2": strings.Join(g.Agents, ", ")})
		}
		if len(listed) != len(groups) || len(groups) != 3 {
			t.Errorf("%d groups listed, the API has %d, want 3", len(listed), len(groups))
		}
		tb.lacks("accounts", f.ann, f.bob)
		tb.open("/attempts/"+attsA[0].ID, 200)
		tb.has("the admin's attempt", "Verdict", "operator only")
		tb.open("/attempts/"+f.canary, 200)
		tb.has("a canary", "canary of")
		tb.open("/attempts/"+verified.ID, 200)
		tb.has("the admin's verification", "verified", "(operator: "+verified.Verification.Reason+")")
		tb.open("/repro", 200)
		tb.has("the checks", f.repro)
		// The list says what GET /api/repro says of each check.
		var repros []dashboard.Repro
		f.get(t, f.admin, "/api/repro", &repros)
		listed = map[string]map[string]string{}
		for _, r := range tb.cells("table.repros tbody tr") {
			listed[r["data-repro"]] = r
		}
		if len(listed) != len(repros) || len(repros) != 3 {
			t.Errorf("%d checks listed, the API has %d, want 3", len(listed), len(repros))
		}
		for _, r := range repros {
			same(t, "listed check "+r.ID, listed[r.ID], map[string]string{"capsule": r.CapsuleID + ": " + r.CapsuleTitle, "c2": r.State,
				"c3": fmt.Sprintf("%d/%d", r.RunsDone, r.RunsWanted), "reproducible": dashboard.YesNo(r.Reproducible)})
		}
		if got := listed[f.failed]["reproducible"]; got != "no" {
			t.Errorf("the failing check is listed reproducible %q", got)
		}
		// A capsule run's task line names its check, without an empty
		// level.
		for _, a := range f.c.Attempts() {
			if a.Kind == KindCapsuleRun && a.TaskID == f.repro {
				tb.open("/attempts/"+a.ID, 200)
				if got, want := tb.eval(`document.getElementById('task').innerText`), fmt.Sprintf("reproducibility check %s · run %d", f.repro, a.Run); got != want {
					t.Errorf("capsule run's task line %q, want %q", got, want)
				}
				break
			}
		}
	})

	t.Run("revoked", func(t *testing.T) {
		tb := newTab(t, browser, f.srv.URL)
		tb.t = t
		tb.signIn(f.carl, 401)
		tb.has("a revoked token", "revoked")
		tb.signIn(f.ann[:len(f.ann)-2], 401)
		tb.has("a token too short", "malformed")
	})
}

// evalRecord returns an evaluation's record.
func evalRecord(c *Coordinator, id string) EvalRecord {
	for _, e := range c.Evaluations() {
		if e.ID == id {
			return e
		}
	}
	return EvalRecord{}
}
