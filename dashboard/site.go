package dashboard

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Page is the data of one page; each page type names its template.
type Page interface {
	template() string
	// Title is the page's title.
	Title() string
	// Reader is who reads it.
	Reader() Who
	// Refresh is how often the page reloads itself, in seconds (0: never):
	// pages of unfinished work follow it live.
	Refresh() int
}

// Base is what every page has: its reader.
type Base struct{ Who Who }

// Reader implements Page.
func (b Base) Reader() Who { return b.Who }

// Refresh implements Page: never.
func (Base) Refresh() int { return 0 }

// BoardsPage shows the leaderboards with their Pareto charts.
type BoardsPage struct {
	Base
	Boards []Board
	// Taken is when the entries were read; Live says they are live (the
	// public sees a snapshot).
	Taken time.Time
	Live  bool
}

// AgentPage shows one agent's boards and per-task results.
type AgentPage struct {
	Base
	Agent  string
	Boards []Board
	Tasks  []TaskRow
	Taken  time.Time
	Live   bool
}

// EvaluationsPage lists evaluations, with the form to start one.
type EvaluationsPage struct {
	Base
	Evaluations []Evaluation
	// Suites and Agents fill the form (signed-in readers).
	Suites  []Suite
	Agents  []Agent
	Message string
	Error   string
}

// EvaluationPage shows one evaluation: progress, attempts, results.
type EvaluationPage struct {
	Base
	Eval EvaluationDetail
}

// AttemptPage shows one attempt: outcome, timings, resource use, logs,
// outputs and its trajectory.
type AttemptPage struct {
	Base
	Attempt         Attempt
	Logs            *Logs
	LogsError       string
	Trajectory      []Call
	TrajectoryError string
	// Verdict is the scorer's full verdict (admin only: it derives from
	// gold answers).
	Verdict string
}

// NodesPage shows the pool and its credit.
type NodesPage struct {
	Base
	Credit CreditReport
}

// ReprosPage lists reproducibility checks (admin).
type ReprosPage struct {
	Base
	Repros []Repro
}

// ReproPage shows one reproducibility check.
type ReproPage struct {
	Base
	Repro Repro
}

// AgentsPage lists a group's agents, with the upload form.
type AgentsPage struct {
	Base
	Agents  []Agent
	Message string
	Error   string
}

// AccountsPage lists groups, submitters and tokens (admin).
type AccountsPage struct {
	Base
	Groups     []Group
	Submitters []Submitter
	Tokens     []Token
}

// LoginPage asks for a token; Next is the local page to go back to once
// signed in ("": the evaluations).
type LoginPage struct {
	Base
	Error string
	Next  string
}

// ErrorPage says what went wrong.
type ErrorPage struct {
	Base
	Status  int
	Message string
}

func (BoardsPage) template() string      { return "boards" }
func (AgentPage) template() string       { return "agent" }
func (EvaluationsPage) template() string { return "evaluations" }
func (EvaluationPage) template() string  { return "evaluation" }
func (AttemptPage) template() string     { return "attempt" }
func (NodesPage) template() string       { return "nodes" }
func (ReprosPage) template() string      { return "repros" }
func (ReproPage) template() string       { return "repro" }
func (AgentsPage) template() string      { return "agents" }
func (AccountsPage) template() string    { return "accounts" }
func (LoginPage) template() string       { return "login" }
func (ErrorPage) template() string       { return "error" }

// Title implements Page.
func (BoardsPage) Title() string       { return "Leaderboards" }
func (p AgentPage) Title() string      { return "Agent " + p.Agent }
func (EvaluationsPage) Title() string  { return "Evaluations" }
func (p EvaluationPage) Title() string { return "Evaluation " + p.Eval.ID }
func (p AttemptPage) Title() string    { return "Attempt " + p.Attempt.ID }
func (NodesPage) Title() string        { return "Nodes and credit" }
func (ReprosPage) Title() string       { return "Reproducibility checks" }
func (p ReproPage) Title() string {
	t := "Reproducibility check " + p.Repro.ID
	if p.Repro.CapsuleID != "" {
		t += " of " + p.Repro.CapsuleID
	}
	return t
}
func (AgentsPage) Title() string      { return "Agents" }
func (AccountsPage) Title() string    { return "Accounts" }
func (LoginPage) Title() string       { return "Sign in" }
func (p ErrorPage) Title() string     { return http.StatusText(p.Status) }
func (p EvaluationPage) Refresh() int { return refreshUnless(p.Eval.Progress.Finished()) }
func (p AttemptPage) Refresh() int    { return refreshUnless(p.Attempt.IsFinished()) }
func (p ReproPage) Refresh() int {
	return refreshUnless(p.Repro.State == "done" || p.Repro.State == "failed")
}
func (p EvaluationsPage) Refresh() int {
	// Live while work runs, unless the form to start one is on the page
	// (a reload would clear what the reader types).
	if len(p.Agents) > 0 && len(p.Suites) > 0 {
		return 0
	}
	return refreshUnless(allFinished(p.Evaluations))
}

func refreshUnless(finished bool) int {
	if finished {
		return 0
	}
	return 5
}

func allFinished(evs []Evaluation) bool {
	for _, e := range evs {
		if !e.Progress.Finished() {
			return false
		}
	}
	return true
}

// Site renders the pages. Make it with New; it is safe for concurrent
// use.
type Site struct {
	pages map[string]*template.Template
	log   *slog.Logger
}

// New parses the embedded templates.
func New(log *slog.Logger) (*Site, error) {
	if log == nil {
		log = slog.Default()
	}
	layout, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: layout: %w", err)
	}
	s := &Site{pages: map[string]*template.Template{}, log: log}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "templates/"), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.Must(layout.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, fmt.Errorf("dashboard: page %s: %w", name, err)
		}
		s.pages[name] = t
	}
	return s, nil
}

// SecurityHeaders are set on every page: no script runs, nothing is
// loaded from elsewhere, no frame holds a page.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// Render writes page p with status. The page is rendered whole before
// anything is sent: a template error is a 500, never half a page.
func (s *Site) Render(w http.ResponseWriter, status int, p Page) {
	t, ok := s.pages[p.template()]
	var buf bytes.Buffer
	err := fmt.Errorf("no template %q", p.template())
	if ok {
		err = t.ExecuteTemplate(&buf, "layout", p)
	}
	if err != nil {
		s.log.Error("dashboard page not rendered", "page", p.template(), "err", err)
		status = http.StatusInternalServerError
		buf.Reset()
		buf.WriteString("<!doctype html><title>Error</title><p>This page could not be rendered.</p>")
	}
	SecurityHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// Static serves the style sheet and the icon (under /static/).
func Static() http.Handler {
	sub, _ := fs.Sub(staticFS, "static")
	files := http.FileServerFS(sub)
	return http.StripPrefix("/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		SecurityHeaders(w.Header())
		w.Header().Set("Cache-Control", "public, max-age=3600")
		files.ServeHTTP(w, r)
	}))
}

// Icon serves the site's icon (browsers ask for /favicon.ico).
func Icon(w http.ResponseWriter, _ *http.Request) {
	b, _ := staticFS.ReadFile("static/icon.svg")
	SecurityHeaders(w.Header())
	w.Header().Set("Content-Type", "image/svg+xml")
	w.Header().Set("Cache-Control", "public, max-age=3600")
	_, _ = w.Write(b)
}

var funcs = template.FuncMap{
	"pct": FormatPercent,
	// pctOf is pct of a value that may be unknown (nil: "—").
	"pctOf": func(v *float64) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf("%.1f%%", 100**v)
	},
	// yesno says a verdict that may be unknown: a *bool is never tested
	// with if or with (a pointer to false is not nil, so it is true).
	"yesno": YesNo,
	"hours": Hours,
	"usd": func(v any) string {
		switch x := v.(type) {
		case *float64:
			if x == nil {
				return "—"
			}
			return usd(*x)
		case float64:
			return usd(x)
		}
		return "—"
	},
	"value": func(v *float64) string {
		if v == nil {
			return "—"
		}
		return fmt.Sprintf("%.2f", *v)
	},
	"dur":   duration,
	"bytes": byteCount,
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "—"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	"num":    func(v float64) string { return fmt.Sprintf("%.4g", v) },
	"tokens": tokenCount,
	"join":   strings.Join,
	"pretty": func(raw json.RawMessage) string {
		var buf bytes.Buffer
		if json.Indent(&buf, raw, "", "  ") != nil {
			return string(raw)
		}
		return buf.String()
	},
	// readable is a message's text or a tool call's arguments: JSON
	// (an object or a list) indented, anything else as it is.
	"readable": func(s string) string {
		t := strings.TrimSpace(s)
		if !strings.HasPrefix(t, "{") && !strings.HasPrefix(t, "[") {
			return s
		}
		var buf bytes.Buffer
		if json.Indent(&buf, []byte(t), "", "  ") != nil {
			return s
		}
		return buf.String()
	},
	"prettyString": func(s string) string {
		var buf bytes.Buffer
		if json.Indent(&buf, []byte(s), "", "  ") != nil {
			return s
		}
		return buf.String()
	},
	"bar":        ProgressBar,
	"pareto":     ParetoPlot,
	"creditBars": func(cs []Credit) []CreditBar { return CreditBars(cs, 12, 340) },
	"inc":        func(i int) int { return i + 1 },
	"barsHeight": func(bs []CreditBar) int { return 22*len(bs) + 4 },
	"short":      short,
	"add":        func(a, b float64) float64 { return a + b },
	"sub":        func(a, b float64) float64 { return a - b },
	"status":     func(s string) string { return "st-" + strings.ReplaceAll(s, "_", "-") },
	"mayStart":   func(w Who) bool { return w.Scope == "submitter" || w.Scope == "admin" },
}

// FormatUSD, FormatDuration and FormatPercent format dollars, seconds and
// a share as every page shows them (a test compares a page with the API's
// numbers through them).
func FormatUSD(v float64) string      { return usd(v) }
func FormatDuration(s float64) string { return duration(s) }
func FormatPercent(v float64) string  { return fmt.Sprintf("%.1f%%", 100*v) }

// FormatBytes formats a size as the pages show it (binary units).
func FormatBytes(n int64) string { return byteCount(n) }

// YesNo is "yes" or "no" for a known verdict, "—" for none.
func YesNo(b *bool) string {
	switch {
	case b == nil:
		return "—"
	case *b:
		return "yes"
	}
	return "no"
}

// duration formats seconds as a person reads them.
func duration(sec float64) string {
	switch {
	case sec <= 0 || math.IsNaN(sec):
		return "—"
	case sec < 10:
		return fmt.Sprintf("%.2fs", sec)
	}
	return (time.Duration(math.Round(sec)) * time.Second).String()
}

// byteCount formats bytes in binary units.
func byteCount(v any) string {
	var n float64
	switch x := v.(type) {
	case int64:
		n = float64(x)
	case uint64:
		n = float64(x)
	case uint32:
		n = float64(x)
	case int:
		n = float64(x)
	}
	units := []string{"B", "KiB", "MiB", "GiB", "TiB"}
	i := 0
	for n >= 1024 && i < len(units)-1 {
		n /= 1024
		i++
	}
	if i == 0 {
		return fmt.Sprintf("%.0f B", n)
	}
	return fmt.Sprintf("%.1f %s", n, units[i])
}

// tokenCount formats a token count (thousands as k).
func tokenCount(v any) string {
	var n float64
	switch x := v.(type) {
	case int64:
		n = float64(x)
	case float64:
		n = x
	}
	if n >= 10000 {
		return fmt.Sprintf("%.1fk", n/1000)
	}
	return fmt.Sprintf("%.0f", n)
}
