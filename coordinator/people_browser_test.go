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
		if e.Agent == "solver-a" && e.Status == "validated" && e.Verification != "" {
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
		// solver-a: run 1 two of three right, run 2 all: 83.3% (66.7-100%),
		// 3 x 2 calls x $0.002 = $0.012 a run; solver-b: 66.7%, $0.006.
		tb.has("boards", "solver-a", "83.3%", "66.7%–100.0%", "$0.012", "solver-b", "66.7%–66.7%", "$0.006", "100.0%")
		if first := tb.eval(`document.querySelector('section.board tbody tr').dataset.agent`); first != "solver-a" {
			t.Errorf("first row %q, want the most accurate, solver-a", first)
		}
		// The chart renders: an SVG laid out at its size, both agents on
		// the frontier drawn inside it, the style sheet applied.
		if n := tb.number(`document.querySelectorAll('svg.pareto g.point.on-frontier circle').length`); n != 2 {
			t.Errorf("%v points on the frontier, want 2", n)
		}
		if w := tb.number(`document.querySelector('svg.pareto').getBoundingClientRect().width`); w < 300 {
			t.Errorf("the chart is %v pixels wide", w)
		}
		inside := tb.number(`(() => { const s = document.querySelector('svg.pareto').getBoundingClientRect();
			return [...document.querySelectorAll('svg.pareto circle')].filter(c => { const r = c.getBoundingClientRect();
			return r.width > 0 && r.left >= s.left && r.right <= s.right && r.top >= s.top && r.bottom <= s.bottom; }).length })()`)
		if inside != 2 {
			t.Errorf("%v points drawn inside the chart, want 2", inside)
		}
		if pts := tb.eval(`document.querySelector('svg.pareto polyline.frontier').getAttribute('points')`); len(strings.Fields(pts)) != 2 {
			t.Errorf("frontier %q, want a line through 2 points", pts)
		}
		if fill := tb.eval(`getComputedStyle(document.querySelector('svg.pareto g.on-frontier circle')).fill`); fill != "rgb(36, 87, 197)" {
			t.Errorf("frontier points filled %q: the style sheet is not applied", fill)
		}
		// Verification by replay: solver-a's runs are model-driven (its
		// attempts made model calls), some verified, some not drawn.
		if got, want := tb.eval(`document.querySelector('section.board tr[data-agent="solver-a"] td.verified').innerText`),
			fmt.Sprintf("%d of %d replay-verified", replayVerified, sampled); got != want || sampled != 6 || replayVerified == 0 {
			t.Errorf("solver-a's verified cell %q, want %q (of its 6 units)", got, want)
		}
		tb.has("boards", "Cross-checked", "Verified")
		// CORE-Bench grades each job one way: no grader in the heading.
		if n := tb.number(`document.querySelectorAll('section.board[data-grader], section.board .grader').length`); n != 0 {
			t.Errorf("%v CORE-Bench boards name a grader", n)
		}
		tb.lacks("boards", append(nodeIDs, rawIDs...)...)
		tb.shot("leaderboards")

		tb.open("/agents/solver-a", 200)
		if n := tb.number(`document.querySelectorAll('table.tasks tbody tr').length`); n != 3 {
			t.Errorf("%v task rows for solver-a, want 3", n)
		}
		tb.has("agent", "1: 0.00", "2: 1.00")
		tb.shot("agent")

		tb.open("/nodes", 200)
		tb.has("nodes", "Nodes in view", "CPU-hours")
		tb.lacks("nodes", nodeIDs...)
		// A reproducibility check: each run's value (7, 7, 8), the 95%
		// prediction interval (mean 7.33 +- t(0.975, 2) x 0.577 x sqrt(4/3)),
		// the claimed value inside it.
		tb.open("/repro/"+f.repro, 200)
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
		tb.open("/repro/"+f.draft, 200)
		tb.has("draft", "Draft task entry", "results/growth.txt", "[4.465, 10.2] (mean 7.333, n=3)", "42, 42, 42", "2 of 3 values kept")
		verdicts := tb.eval(`[...document.querySelectorAll('table.draft tbody tr')].map(r => r.dataset.verdict).join(' ')`)
		if verdicts != "interval stable timestamp" {
			t.Errorf("draft verdicts %q, want interval stable timestamp", verdicts)
		}
		href := tb.eval(`document.getElementById('draft-spec').getAttribute('href')`)
		code, spec := f.request("", "GET", href, nil, "")
		var ds struct {
			Rules []struct{ Question, File string }
		}
		if code != 200 || json.Unmarshal([]byte(spec), &ds) != nil || len(ds.Rules) != 2 || ds.Rules[0].File != "results/growth.txt" {
			t.Errorf("draft spec at %s: %d %s", href, code, spec)
		}
		if code, _ := f.request("", "GET", "/repro/"+f.repro+"/draft-spec.json", nil, ""); code != 404 {
			t.Errorf("a check with rules has a draft spec: %d", code)
		}
		tb.shot("repro-draft")
		tb.open("/evaluations", 401)
		tb.has("evaluations, publicly", "Sign in to see this page")
		tb.open("/attempts/"+hA, 401)
		tb.lacks("an attempt, publicly", "solver-a on")
		tb.open("/no/such/page", 404)
	})

	t.Run("submitter", func(t *testing.T) {
		tb := newTab(t, browser, f.srv.URL)
		tb.t = t
		tb.signIn(f.ann, 200)
		if loc := tb.eval(`location.pathname`); loc != "/evaluations" {
			t.Errorf("after sign-in at %s", loc)
		}
		if who := tb.eval(`document.getElementById('who').innerText`); who != "submitter ann · group lab-a" {
			t.Errorf("signed in as %q", who)
		}
		if evs := tb.eval(`[...document.querySelectorAll('tr[data-eval]')].map(r => r.dataset.eval).join(' ')`); evs != f.evA {
			t.Errorf("evaluations listed: %q, want only %s", evs, f.evA)
		}
		// Progress counts the agent's own attempts, replays apart.
		if done, total := tb.number(`+document.querySelector('svg.bar').dataset.done`), tb.number(`+document.querySelector('svg.bar').dataset.total`); done != float64(len(own)) || total != done {
			t.Errorf("progress bar %v of %v, want %d of %d", done, total, len(own), len(own))
		}
		tb.has("evaluations", fmt.Sprintf("%d done", len(own)), fmt.Sprintf("+%d replays", len(replays)))

		tb.open("/evaluations/"+f.evA, 200)
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
		if got := tb.eval(`document.querySelector('tr[data-attempt="` + h(verified.ID) + `"] td.verification').innerText`); got != "verified" {
			t.Errorf("a verified attempt's row says %q", got)
		}
		tb.lacks("evaluation", append(nodeIDs, rawIDs...)...)
		tb.shot("evaluation")

		// An attempt's verification, in words, never the node's rate.
		tb.open("/attempts/"+h(verified.ID), 200)
		if st := tb.eval(`document.getElementById('verification').dataset.state`); st != "verified" {
			t.Errorf("verified attempt's state %q", st)
		}
		tb.has("a verified attempt", "answers bound to the trajectory: yes", "replayed: 1 time", "Another volunteer re-ran the attempt's tools")
		if notDrawn.ID != "" {
			tb.open("/attempts/"+h(notDrawn.ID), 200)
			tb.has("an attempt not drawn", "unverified: not picked for a replay", "replayed: no")
			tb.lacks("an attempt's verification", "node's rate", notDrawn.Verification.Reason)
		}
		tb.open("/attempts/"+h(replays[0].ID), 200)
		tb.has("a replay", "replay of "+h(replays[0].ReplayOf))
		if href := tb.eval(`document.querySelector('#kind a').getAttribute('href')`); href != "/attempts/"+h(replays[0].ReplayOf) {
			t.Errorf("the replay links to %q", href)
		}
		tb.lacks("a replay", append(nodeIDs, rawIDs...)...)

		tb.open("/attempts/"+hA, 200)
		tb.has("attempt", "done", "agent solver-a on", "nothing to worry about", "Step 1: what is in results/?", "the figure is 0.96",
			"Call 1 · sim-1", "Call 2 · sim-1", "report.json")
		if n := tb.number(`document.querySelectorAll('article.call').length`); n != 2 {
			t.Errorf("%v calls in the trajectory, want 2", n)
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
		tb.shot("nodes")
		tb.open("/admin/accounts", 200)
		tb.has("accounts", "ann", "bob", "carl", "lab-a", "lab-b")
		tb.lacks("accounts", f.ann, f.bob)
		tb.open("/attempts/"+attsA[0].ID, 200)
		tb.has("the admin's attempt", "Verdict", "operator only")
		tb.open("/attempts/"+f.canary, 200)
		tb.has("a canary", "canary of")
		tb.open("/attempts/"+verified.ID, 200)
		tb.has("the admin's verification", "verified", "(operator: "+verified.Verification.Reason+")")
		tb.open("/repro", 200)
		tb.has("the checks", f.repro)
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
