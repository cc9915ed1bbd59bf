package coordinator

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/repronet/repronet/dashboard"
)

// What a page shows equals what the API says of the same object: each
// page's cells are read in the browser and compared, field by field, with
// the API's numbers formatted as the pages format them (issue 23).

// cells reads the rows matching sel on tb's page: each row's data
// attributes (as "data-NAME") and its cells by their first class (else
// "cN", N its place from 0), as the browser shows them (innerText).
func (tb *tab) cells(sel string) []map[string]string {
	tb.t.Helper()
	js := `JSON.stringify([...document.querySelectorAll(` + strconv.Quote(sel) + `)].map(tr => {
		const o = {};
		for (const [k, v] of Object.entries(tr.dataset)) o['data-' + k] = v;
		[...tr.children].forEach((td, i) => { o[(td.getAttribute('class') || '').split(' ')[0] || ('c' + i)] = (td.innerText ?? td.textContent ?? '').trim(); });
		return o; }))`
	var out []map[string]string
	if err := json.Unmarshal([]byte(tb.eval(js)), &out); err != nil {
		tb.t.Fatalf("rows %s: %v", sel, err)
	}
	return out
}

// same fails where got and want differ in a field of want.
func same(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for _, k := range slices.Sorted(maps.Keys(want)) {
		if got[k] != want[k] {
			t.Errorf("%s: %s shows %q, the API says %q", what, k, got[k], want[k])
		}
	}
}

// apiBoard is a family board as /api/leaderboards serves it (the fields
// every family's row has, and CORE-Bench's written and vision accuracy).
type apiBoard struct {
	Family string `json:"family"`
	Suite  string `json:"suite"`
	Level  string `json:"level"`
	Rows   []struct {
		Agent           string   `json:"agent"`
		Model           string   `json:"model"`
		Runs            int      `json:"runs"`
		Accuracy        float64  `json:"accuracy"`
		AccuracyMin     float64  `json:"accuracy_min"`
		AccuracyMax     float64  `json:"accuracy_max"`
		WrittenAccuracy *float64 `json:"written_accuracy"`
		VisionAccuracy  *float64 `json:"vision_accuracy"`
		CostUSD         *float64 `json:"cost_usd"`
		WallSeconds     float64  `json:"wall_seconds"`
		CPUSeconds      float64  `json:"cpu_seconds"`
		Validated       int      `json:"validated"`
		Unvalidated     int      `json:"unvalidated"`
		Inconsistent    int      `json:"inconsistent"`
		InfraFailures   int      `json:"infra_failures"`
		Pending         int      `json:"pending"`
		Sampled         int      `json:"sampled"`
		ReplayVerified  int      `json:"replay_verified"`
	} `json:"rows"`
}

// rowCells is what a board row shows of these numbers.
func rowCells(runs int, acc, lo, hi float64, written, vision, cost *float64, wall, cpu float64,
	validated, unvalidated, inconsistent, infra, pending, sampled, replayVerified int) map[string]string {
	pctOf := func(v *float64) string {
		if v == nil {
			return "—"
		}
		return dashboard.FormatPercent(*v)
	}
	c := map[string]string{"acc": "—", "range": "—", "written": pctOf(written), "vision": pctOf(vision), "runs": strconv.Itoa(runs),
		"cost": "—", "wall": dashboard.FormatDuration(wall), "cpu": dashboard.FormatDuration(cpu), "crosschecked": "—", "verified": "—",
		"unvalidated": strconv.Itoa(unvalidated), "pending": strconv.Itoa(pending), "infra": strconv.Itoa(infra)}
	if runs > 0 {
		c["acc"], c["range"] = dashboard.FormatPercent(acc), dashboard.FormatPercent(lo)+"–"+dashboard.FormatPercent(hi)
	}
	if cost != nil {
		c["cost"] = dashboard.FormatUSD(*cost)
	}
	if graded := validated + unvalidated + inconsistent; graded > 0 {
		c["crosschecked"] = fmt.Sprintf("%d of %d (%s)", validated, graded, dashboard.FormatPercent(float64(validated)/float64(graded)))
	}
	if sampled > 0 {
		c["verified"] = fmt.Sprintf("%d of %d", replayVerified, sampled)
	}
	return c
}

// sameBoards compares the boards on tb's page (only those of agent when
// not "") with the API's boards of token's reader, row by row; it returns
// how many rows it compared.
func sameBoards(t *testing.T, f *people, tb *tab, token, agent string) int {
	t.Helper()
	var boards []apiBoard
	f.get(t, token, "/api/leaderboards", &boards)
	want := map[string]map[string]string{}
	for _, b := range boards {
		for _, r := range b.Rows {
			if agent != "" && r.Agent != agent {
				continue
			}
			want[b.Suite+"/"+b.Level+"/"+r.Agent] = rowCells(r.Runs, r.Accuracy, r.AccuracyMin, r.AccuracyMax, r.WrittenAccuracy, r.VisionAccuracy,
				r.CostUSD, r.WallSeconds, r.CPUSeconds, r.Validated, r.Unvalidated, r.Inconsistent, r.InfraFailures, r.Pending, r.Sampled, r.ReplayVerified)
		}
	}
	got := pageRows(tb)
	if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want))) {
		t.Errorf("board rows on the page %v, in the API %v", slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for k, w := range want {
		same(t, "board row "+k, got[k], w)
	}
	return len(want)
}

// pageRows reads every board row of tb's page, by suite/level/agent.
func pageRows(tb *tab) map[string]map[string]string {
	tb.t.Helper()
	js := `JSON.stringify([...document.querySelectorAll('section.board')].flatMap(s => [...s.querySelectorAll('table.rows tbody tr')].map(tr => {
		const o = {key: s.dataset.suite + '/' + s.dataset.level + '/' + tr.dataset.agent};
		[...tr.children].forEach((td, i) => { o[(td.getAttribute('class') || '').split(' ')[0] || ('c' + i)] = (td.innerText ?? td.textContent ?? '').trim(); });
		return o; })))`
	var rows []map[string]string
	if err := json.Unmarshal([]byte(tb.eval(js)), &rows); err != nil {
		tb.t.Fatalf("board rows: %v", err)
	}
	out := map[string]map[string]string{}
	for _, r := range rows {
		out[r["key"]] = r
	}
	return out
}

// sameEvaluation compares an evaluation's page with GET
// /api/evaluations/{id}: its progress, model use, boards (its own runs
// only), per-task results and attempts; it returns the API's view.
func sameEvaluation(t *testing.T, f *people, tb *tab, token, id string) dashboard.EvaluationDetail {
	t.Helper()
	var d dashboard.EvaluationDetail
	f.get(t, token, "/api/evaluations/"+id, &d)
	tb.open("/evaluations/"+id, 200)
	p := d.Progress
	bar := tb.cells("#progress svg.bar")
	if len(bar) != 1 {
		t.Fatalf("evaluation %s: %d progress bars", id, len(bar))
	}
	same(t, "evaluation "+id+" progress", bar[0], map[string]string{"data-done": strconv.Itoa(p.Done), "data-failed": strconv.Itoa(p.Failed),
		"data-total": strconv.Itoa(p.Total)})
	text := fmt.Sprintf("%d done", p.Done)
	if p.Failed > 0 {
		text += fmt.Sprintf(", %d failed", p.Failed)
	}
	text += fmt.Sprintf(", %d pending of %d", p.Pending, p.Total)
	if got := tb.eval(`document.querySelector('#progress .progress-text').innerText`); !strings.HasPrefix(got, text) ||
		!strings.HasSuffix(got, fmt.Sprintf("%d/%d runs decided", p.Decided, p.Units)) {
		t.Errorf("evaluation %s progress %q, the API says %+v", id, got, p)
	}
	if got, want := tb.eval(`document.getElementById('model-use').innerText`), dashboard.FormatUSD(d.CostUSD); !strings.HasPrefix(got, want+" ·") {
		t.Errorf("evaluation %s model use %q, the API says %s", id, got, want)
	}
	// Boards: the API's, row by row; only the evaluation's own levels and
	// runs.
	want := map[string]map[string]string{}
	for _, b := range d.Boards {
		if !slices.Contains(d.Levels, b.Variant) || b.Suite != d.Suite {
			t.Errorf("evaluation %s (levels %v) has a board of %s %s", id, d.Levels, b.Suite, b.Variant)
		}
		for _, r := range b.Rows {
			c := rowCells(r.Runs, r.Accuracy, r.AccuracyMin, r.AccuracyMax, r.WrittenAccuracy, r.VisionAccuracy, r.CostUSD, r.WallSeconds,
				r.CPUSeconds, r.Validated, r.Unvalidated, r.Inconsistent, r.InfraFailed, r.Pending, r.Sampled, r.ReplayVerified)
			c["tokens"] = "—"
			if r.Runs > 0 {
				c["tokens"] = fmt.Sprintf("%.0f", r.Tokens)
				if r.Tokens >= 10000 {
					c["tokens"] = fmt.Sprintf("%.1fk", r.Tokens/1000)
				}
			}
			want[b.Suite+"/"+b.Variant+"/"+r.Agent] = c
		}
	}
	got := pageRows(tb)
	if len(got) != len(want) || len(want) == 0 {
		t.Errorf("evaluation %s: board rows %v on the page, %v in the API", id, slices.Sorted(maps.Keys(got)), slices.Sorted(maps.Keys(want)))
	}
	for k, w := range want {
		same(t, "evaluation "+id+" board row "+k, got[k], w)
	}
	// Per-task results: each run's cell, and no run the evaluation did not
	// ask for.
	tasks := tb.cells("table.tasks tbody tr")
	if len(tasks) != len(d.Tasks) {
		t.Errorf("evaluation %s: %d task rows, the API has %d", id, len(tasks), len(d.Tasks))
	}
	for i, tr := range d.Tasks {
		var cells []string
		for _, r := range tr.Runs {
			if r.Run < 1 || r.Run > d.Runs {
				t.Errorf("evaluation %s (%d runs) shows run %d of %s", id, d.Runs, r.Run, tr.Task)
			}
			v := r.Status
			if r.Value != nil {
				v = fmt.Sprintf("%.2f", *r.Value)
			}
			cells = append(cells, fmt.Sprintf("%d: %s", r.Run, v))
		}
		if i < len(tasks) {
			same(t, "evaluation "+id+" task "+tr.Task, tasks[i], map[string]string{"data-task": tr.Task, "data-level": tr.Variant, "c3": strings.Join(cells, " ")})
		}
	}
	// Attempts: each as the API lists it.
	rows := tb.cells("table.attempts tbody tr")
	if len(rows) != len(d.Attempts) {
		t.Fatalf("evaluation %s: %d attempt rows, the API lists %d", id, len(rows), len(d.Attempts))
	}
	for i, a := range d.Attempts {
		w := map[string]string{"data-attempt": a.ID, "c1": a.Task, "c2": a.Variant, "c3": strconv.Itoa(a.Run), "c4": strconv.Itoa(a.Replica),
			"st-" + strings.ReplaceAll(a.State, "_", "-"): a.State, "c6": a.Outcome, "c8": "—", "c11": "—"}
		if a.Score != nil {
			w["c8"] = fmt.Sprintf("%.2f", a.Score.Value)
		}
		if a.Model != nil {
			w["c11"] = dashboard.FormatUSD(a.Model.CostUSD)
		}
		switch {
		case a.Verification != nil:
			w["verification"] = a.Verification.Verdict()
		case a.IsReplay():
			w["verification"] = "replays " + a.ReplayOf
		default:
			w["verification"] = "—"
		}
		same(t, "evaluation "+id+" attempt "+a.ID, rows[i], w)
	}
	return d
}

// sameAttempt compares an attempt's page with GET /api/attempts/{id} and
// its logs.
func sameAttempt(t *testing.T, f *people, tb *tab, token, id string) dashboard.Attempt {
	t.Helper()
	var a dashboard.Attempt
	f.get(t, token, "/api/attempts/"+id, &a)
	tb.open("/attempts/"+id, 200)
	text := func(sel string) string {
		return tb.eval(`(() => { const e = document.querySelector(` + strconv.Quote(sel) + `); return e ? e.innerText.trim() : "(none)"; })()`)
	}
	outcome := a.Outcome
	if outcome == "" {
		outcome = "—"
	}
	if a.Detail != "" {
		outcome += " (" + a.Detail + ")"
	}
	want := map[string]string{"state": a.State, "outcome": outcome}
	if a.Score != nil {
		want["score"] = fmt.Sprintf("%.2f (%s)", a.Score.Value, a.Score.Scorer)
	}
	if m := a.Model; m != nil {
		want["model-use"] = fmt.Sprintf("%d calls · %d input and %d output tokens · %s", m.Calls, m.InputTokens, m.OutputTokens, dashboard.FormatUSD(m.CostUSD))
	}
	got := map[string]string{}
	for k := range want {
		got[k] = text("#" + k)
		if k == "score" {
			got[k] = strings.SplitN(got[k], "\n", 2)[0]
		}
	}
	same(t, "attempt "+id, got, want)
	if v := a.Verification; v != nil {
		same(t, "attempt "+id+" verification", map[string]string{"state": tb.eval(`document.getElementById('verification').dataset.state`),
			"verdict": text("#verification > span")}, map[string]string{"state": v.State, "verdict": v.Verdict()})
	}
	if a.IsFinished() {
		var l dashboard.Logs
		f.get(t, token, "/api/attempts/"+id+"/logs", &l)
		w := fmt.Sprintf("exit code %d", l.ExitCode)
		if l.Detail != "" && !l.DetailRepeatsExit() {
			w += " · " + l.Detail
		}
		same(t, "attempt "+id+" logs", map[string]string{"exit": text("#exit")}, map[string]string{"exit": w})
		if strings.Count(text("#exit"), "exit code") != 1 {
			t.Errorf("attempt %s: %q says the exit code twice", id, text("#exit"))
		}
	}
	return a
}

// apiRepro is GET /api/repro/{id}: bench/repro's Status and Report.
type apiRepro struct {
	ID         string         `json:"id"`
	State      string         `json:"state"`
	RunsDone   int            `json:"runs_done"`
	RunsWanted int            `json:"runs_wanted"`
	Capsule    ReproCapsule   `json:"capsule"`
	Runs       []ReproRunView `json:"runs"`
	Report     *struct {
		Reproducible bool `json:"reproducible"`
		Questions    []struct {
			Question   string            `json:"question"`
			Kind       string            `json:"kind"`
			Values     []json.RawMessage `json:"values"`
			Claimed    json.RawMessage   `json:"claimed"`
			Reproduced bool              `json:"reproduced"`
		} `json:"questions"`
		Draft *struct {
			Values []struct {
				Question   string   `json:"question"`
				Values     []string `json:"values"`
				Verdict    string   `json:"verdict"`
				Published  string   `json:"published"`
				Comparison string   `json:"comparison"`
			} `json:"values"`
			Published  int      `json:"published_files"`
			Unproduced []string `json:"unproduced"`
		} `json:"draft"`
	} `json:"report"`
}

// sameRepro compares a check's page with GET /api/repro/{id}: state, runs,
// the verdict, each question (values, claimed, reproduced) or each draft
// value (verdict, published value, whether the runs reproduce it).
func sameRepro(t *testing.T, f *people, tb *tab, id string) apiRepro {
	t.Helper()
	var r apiRepro
	f.get(t, "", "/api/repro/"+id, &r)
	tb.open("/repro/"+id, 200)
	if r.Report == nil {
		t.Fatalf("check %s has no report: %+v", id, r)
	}
	yes := map[bool]string{true: "yes", false: "no"}
	same(t, "check "+id, map[string]string{"state": tb.eval(`document.getElementById('repro-state').innerText`),
		"reproducible": tb.eval(`document.getElementById('reproducible').innerText`),
		"runs":         tb.eval(`document.getElementById('repro-runs').innerText`)},
		map[string]string{"state": r.State, "reproducible": yes[r.Report.Reproducible], "runs": fmt.Sprintf("%d of %d decided", r.RunsDone, r.RunsWanted)})
	// The capsule named, each run linked to its page and logs.
	same(t, "check "+id+" capsule", map[string]string{"capsule": tb.eval(`document.getElementById('repro-capsule').innerText`)},
		map[string]string{"capsule": r.Capsule.ID + ": " + r.Capsule.Title})
	runRows := tb.cells("table.runs tbody tr")
	if len(runRows) != len(r.Runs) || len(r.Runs) != r.RunsWanted {
		t.Errorf("check %s: %d run rows, the API has %d runs of %d", id, len(runRows), len(r.Runs), r.RunsWanted)
	}
	for i, run := range r.Runs {
		if i >= len(runRows) {
			break
		}
		links := tb.eval(fmt.Sprintf(`Array.from(document.querySelectorAll('table.runs tbody tr')[%d].querySelectorAll('a')).map(a => a.getAttribute('href')).join(' ')`, i))
		same(t, fmt.Sprintf("check %s run %d", id, run.Run), map[string]string{"c1": runRows[i]["c1"], "links": links},
			map[string]string{"c1": run.State, "links": run.Page + " " + run.Logs})
	}
	if qs := r.Report.Questions; len(qs) > 0 {
		rows := tb.cells("table.questions tbody tr")
		if len(rows) != len(qs) {
			t.Fatalf("check %s: %d question rows, the API has %d", id, len(rows), len(qs))
		}
		for i, q := range qs {
			var vals []string
			for _, v := range q.Values {
				vals = append(vals, rawText(v))
			}
			got := rows[i]
			got["reproduced"] = strings.SplitN(got["reproduced"], " ", 2)[0]
			same(t, "check "+id+" question "+q.Question, got, map[string]string{"c0": q.Question, "c1": q.Kind, "c2": strings.Join(vals, ", "),
				"c4": rawText(q.Claimed), "reproduced": yes[q.Reproduced]})
		}
	}
	if d := r.Report.Draft; d != nil {
		rows := tb.cells("table.draft tbody tr")
		if len(rows) != len(d.Values) {
			t.Fatalf("check %s: %d draft rows, the API has %d", id, len(rows), len(d.Values))
		}
		words := map[string]string{"reproduced": "yes", "not_reproduced": "no", "not_compared": "not compared", "not_published": "nothing published here", "": "—"}
		for i, v := range d.Values {
			vals := make([]string, len(v.Values))
			for j, x := range v.Values {
				vals[j] = x
				if x == "" {
					vals[j] = "—"
				}
			}
			pub := v.Published
			if pub == "" {
				pub = "—"
			}
			got := rows[i]
			got["comparison"] = strings.SplitN(got["comparison"], " (", 2)[0]
			same(t, "check "+id+" value "+v.Question, got, map[string]string{"question": v.Question, "values": strings.Join(vals, ", "),
				"data-verdict": v.Verdict, "data-comparison": v.Comparison, "published": pub, "comparison": words[v.Comparison]})
		}
	}
	return r
}
