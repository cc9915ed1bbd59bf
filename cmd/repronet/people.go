package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/dashboard"
)

// The commands people use without the operator, over a coordinator's API
// with a token (--token-file, or $REPRONET_TOKEN; --api, or
// $REPRONET_API): the operator's `admin` (groups, submitters, tokens), and
// a submitter's `agent push`, `eval start|watch|ls` and `attempt
// ls|logs|trajectory|outputs`. docs/api.md lists the endpoints.

const adminUsage = `admin group add NAME [--max-pending N] | group quota NAME --max-pending N | group ls
       admin submitter add NAME --group G | submitter ls | submitter revoke NAME
       admin token new SUBMITTER | token ls | token revoke ID`

// subcommands dispatches args[0] (and, for nested ones, args[1]) to cmds.
func subcommands(name, usage string, args []string, stderr io.Writer, cmds map[string]func([]string) error) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(stderr, "Usage: repronet %s\n", usage)
		if len(args) == 0 {
			return errors.New("a subcommand is required")
		}
		return nil
	}
	key := args[0]
	rest := args[1:]
	if _, ok := cmds[key]; !ok && len(args) > 1 {
		key, rest = args[0]+" "+args[1], args[2:]
	}
	cmd, ok := cmds[key]
	if !ok {
		return fmt.Errorf("%s: unknown subcommand %q; usage: repronet %s", name, strings.Join(args[:min(2, len(args))], " "), usage)
	}
	return cmd(rest)
}

// peopleFlags parses a people command's flags (with --api, --token-file,
// --json, --timeout; positional arguments may come before flags) and
// checks it has want positional arguments.
func peopleFlags(name, synopsis string, args []string, want int, stderr io.Writer, more func(*flag.FlagSet)) (*apiClient, apiFlags, []string, error) {
	fs := newFlags(name, synopsis, stderr)
	f := addAPIFlags(fs)
	if more != nil {
		more(fs)
	}
	if err := fs.Parse(interleave(args)); err != nil {
		return nil, f, nil, err
	}
	if fs.NArg() != want {
		fs.Usage()
		return nil, f, nil, fmt.Errorf("want %d argument(s), got %q", want, fs.Args())
	}
	if os.Getenv("REPRONET_API") != "" && !flagSet(fs, "api") {
		*f.api = os.Getenv("REPRONET_API")
	}
	c, err := f.client()
	return c, f, fs.Args(), err
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// printJSON prints v indented.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// get and post are the API calls of these commands.
func (c *apiClient) get(ctx context.Context, path string, out any) error {
	return c.do(ctx, http.MethodGet, path, nil, "", out)
}

func (c *apiClient) postJSON(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return c.do(ctx, http.MethodPost, path, strings.NewReader(string(b)), "application/json", out)
}

func runAdmin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var maxPending int
	pending := func(fs *flag.FlagSet) {
		fs.IntVar(&maxPending, "max-pending", 0, "bound on the group's unfinished attempts at once (0: none)")
	}
	var group string
	groupFlag := func(fs *flag.FlagSet) { fs.StringVar(&group, "group", "", "the submitter's group (required)") }
	show := func(f apiFlags, v any, text func(w *tabwriter.Writer)) error {
		if *f.asJSON {
			return printJSON(stdout, v)
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		text(tw)
		return tw.Flush()
	}
	tokenMade := func(f apiFlags, t coordinator.NewTokenResponse) error {
		return show(f, t, func(w *tabwriter.Writer) {
			fmt.Fprintf(w, "submitter %s (group %s), token %s:\n%s\nKeep it: it is shown this once (only its hash is kept).\n", t.Submitter, t.Group, t.TokenID, t.Token)
		})
	}
	revoked := func(f apiFlags, what string) error {
		return show(f, map[string]string{"revoked": what}, func(w *tabwriter.Writer) { fmt.Fprintf(w, "revoked %s\n", what) })
	}
	cmds := map[string]func([]string) error{
		"group add": func(args []string) error {
			c, f, pos, err := peopleFlags("admin group add", "admin group add NAME [--max-pending N]", args, 1, stderr, pending)
			if err != nil {
				return err
			}
			var g dashboard.Group
			if err := c.postJSON(ctx, "/api/groups", coordinator.GroupRequest{Name: pos[0], MaxPending: maxPending}, &g); err != nil {
				return err
			}
			return show(f, g, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "group %s made (at most %d unfinished attempts; 0: no bound)\n", g.Name, g.MaxPending)
			})
		},
		"group quota": func(args []string) error {
			c, f, pos, err := peopleFlags("admin group quota", "admin group quota NAME --max-pending N", args, 1, stderr, pending)
			if err != nil {
				return err
			}
			var g dashboard.Group
			b, _ := json.Marshal(coordinator.GroupRequest{MaxPending: maxPending})
			if err := c.do(ctx, http.MethodPut, "/api/groups/"+url.PathEscape(pos[0])+"/quota", strings.NewReader(string(b)), "application/json", &g); err != nil {
				return err
			}
			return show(f, g, func(w *tabwriter.Writer) {
				fmt.Fprintf(w, "group %s: at most %d unfinished attempts\n", g.Name, g.MaxPending)
			})
		},
		"group ls": func(args []string) error {
			c, f, _, err := peopleFlags("admin group ls", "admin group ls", args, 0, stderr, nil)
			if err != nil {
				return err
			}
			var gs []dashboard.Group
			if err := c.get(ctx, "/api/groups", &gs); err != nil {
				return err
			}
			return show(f, gs, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "GROUP\tUNFINISHED\tMAX\tAGENTS")
				for _, g := range gs {
					fmt.Fprintf(w, "%s\t%d\t%d\t%s\n", g.Name, g.Pending, g.MaxPending, strings.Join(g.Agents, ","))
				}
			})
		},
		"submitter add": func(args []string) error {
			c, f, pos, err := peopleFlags("admin submitter add", "admin submitter add NAME --group G", args, 1, stderr, groupFlag)
			if err != nil {
				return err
			}
			var t coordinator.NewTokenResponse
			if err := c.postJSON(ctx, "/api/submitters", coordinator.SubmitterRequest{Name: pos[0], Group: group}, &t); err != nil {
				return err
			}
			return tokenMade(f, t)
		},
		"submitter ls": func(args []string) error {
			c, f, _, err := peopleFlags("admin submitter ls", "admin submitter ls", args, 0, stderr, nil)
			if err != nil {
				return err
			}
			var ss []dashboard.Submitter
			if err := c.get(ctx, "/api/submitters", &ss); err != nil {
				return err
			}
			return show(f, ss, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "SUBMITTER\tGROUP\tCREATED\tREVOKED")
				for _, s := range ss {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", s.Name, s.Group, stamp(s.Created), stamp(s.Revoked))
				}
			})
		},
		"submitter revoke": func(args []string) error {
			c, f, pos, err := peopleFlags("admin submitter revoke", "admin submitter revoke NAME", args, 1, stderr, nil)
			if err != nil {
				return err
			}
			if err := c.postJSON(ctx, "/api/submitters/"+url.PathEscape(pos[0])+"/revoke", struct{}{}, &map[string]string{}); err != nil {
				return err
			}
			return revoked(f, "submitter "+pos[0]+" (every token of theirs)")
		},
		"token new": func(args []string) error {
			c, f, pos, err := peopleFlags("admin token new", "admin token new SUBMITTER", args, 1, stderr, nil)
			if err != nil {
				return err
			}
			var t coordinator.NewTokenResponse
			if err := c.postJSON(ctx, "/api/tokens", coordinator.TokenRequest{Submitter: pos[0]}, &t); err != nil {
				return err
			}
			return tokenMade(f, t)
		},
		"token ls": func(args []string) error {
			c, f, _, err := peopleFlags("admin token ls", "admin token ls", args, 0, stderr, nil)
			if err != nil {
				return err
			}
			var ts []dashboard.Token
			if err := c.get(ctx, "/api/tokens", &ts); err != nil {
				return err
			}
			return show(f, ts, func(w *tabwriter.Writer) {
				fmt.Fprintln(w, "TOKEN ID\tSUBMITTER\tGROUP\tCREATED\tREVOKED")
				for _, t := range ts {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Submitter, t.Group, stamp(t.Created), stamp(t.Revoked))
				}
			})
		},
		"token revoke": func(args []string) error {
			c, f, pos, err := peopleFlags("admin token revoke", "admin token revoke ID", args, 1, stderr, nil)
			if err != nil {
				return err
			}
			if err := c.postJSON(ctx, "/api/tokens/"+url.PathEscape(pos[0])+"/revoke", struct{}{}, &map[string]string{}); err != nil {
				return err
			}
			return revoked(f, "token "+pos[0])
		},
	}
	return subcommands("admin", adminUsage, args, stderr, cmds)
}

// stamp formats a time for a table ("-" for none).
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04")
}

const agentUsage = `agent push NAME OCI_TARBALL [--model M] [--deterministic] [--not-replayable] | agent ls
       ` + agentBuildSynopsis

func runAgent(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var model string
	var deterministic, notReplayable bool
	cmds := map[string]func([]string) error{
		"push": func(args []string) error {
			c, f, pos, err := peopleFlags("agent push", "agent push NAME OCI_TARBALL [--model M] [--deterministic] [--not-replayable]", args, 2, stderr, func(fs *flag.FlagSet) {
				fs.StringVar(&model, "model", "", "the agent's primary model (a leaderboard column)")
				fs.BoolVar(&deterministic, "deterministic", false, "declare that the agent answers a task alike on every honest node (its replicas must then agree exactly)")
				fs.BoolVar(&notReplayable, "not-replayable", false, "declare that the agent is not replayable (randomness outside the model's answers): its results are run and shown unverified, never replayed (docs/agents.md)")
			})
			if err != nil {
				return err
			}
			file, err := os.Open(pos[1])
			if err != nil {
				return err
			}
			defer file.Close()
			q := url.Values{"name": {pos[0]}}
			if model != "" {
				q.Set("model", model)
			}
			if deterministic {
				q.Set("deterministic", "1")
			}
			if notReplayable {
				q.Set("not_replayable", "1")
			}
			var ag dashboard.Agent
			if err := c.do(ctx, http.MethodPost, "/api/agents?"+q.Encode(), file, "application/x-tar", &ag); err != nil {
				return err
			}
			if *f.asJSON {
				return printJSON(stdout, ag)
			}
			fmt.Fprintf(stdout, "agent %s pushed for group %s: %d bytes, sha256 %s, cid %s\n", ag.Name, ag.Group, ag.Size, ag.SHA256, ag.CID)
			return nil
		},
		"build": func(args []string) error { return runAgentBuild(ctx, args, stdout, stderr) },
		"ls": func(args []string) error {
			c, f, _, err := peopleFlags("agent ls", "agent ls", args, 0, stderr, nil)
			if err != nil {
				return err
			}
			var as []dashboard.Agent
			if err := c.get(ctx, "/api/agents", &as); err != nil {
				return err
			}
			if *f.asJSON {
				return printJSON(stdout, as)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "AGENT\tGROUP\tMODEL\tDETERMINISTIC\tBYTES\tSHA256")
			for _, a := range as {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%d\t%s\n", a.Name, a.Group, a.Model, a.Deterministic, a.Size, a.SHA256)
			}
			return tw.Flush()
		},
	}
	return subcommands("agent", agentUsage, args, stderr, cmds)
}

const evalUsage = `eval start --suite S --agent A [--levels L1,L2] [--runs N] [--id ID] [--env K=V]... [--models M1,M2] [--budget-attempt USD] [--budget-eval USD] [--watch]
       eval watch ID [--every 2s] | eval ls`

func runEval(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var req coordinator.EvaluationRequest
	var levels, models string
	var env stringList
	var watch bool
	every := 2 * time.Second
	cmds := map[string]func([]string) error{
		"start": func(args []string) error {
			c, f, _, err := peopleFlags("eval start", "eval start --suite S --agent A [flags]", args, 0, stderr, func(fs *flag.FlagSet) {
				fs.StringVar(&req.Suite, "suite", "", "suite to evaluate on (see GET /api/suites)")
				fs.StringVar(&req.Agent, "agent", "", "one of your group's agents (repronet agent push)")
				fs.StringVar(&levels, "levels", "", "comma-separated levels (default: all)")
				fs.IntVar(&req.Runs, "runs", 1, "independent runs of each task and level")
				fs.StringVar(&req.ID, "id", "", "ID of the request: repeating it queues nothing twice")
				fs.Var(&env, "env", "KEY=value given to the agent as environment, repeatable")
				fs.StringVar(&models, "models", "", "comma-separated models the agent may call through the gateway")
				fs.Float64Var(&req.Budget.AttemptUSD, "budget-attempt", 0, "model spend cap of each attempt in dollars (0: none)")
				fs.Float64Var(&req.Budget.EvaluationUSD, "budget-eval", 0, "model spend cap of the whole evaluation in dollars (0: none)")
				fs.BoolVar(&watch, "watch", false, "then watch it (eval watch)")
				fs.DurationVar(&every, "every", 2*time.Second, "with --watch, how often to ask")
			})
			if err != nil {
				return err
			}
			req.Levels, req.Models, req.Env = splitList(levels), splitList(models), env
			var resp coordinator.EvaluationResponse
			if err := c.postJSON(ctx, "/api/evaluations", req, &resp); err != nil {
				return err
			}
			if *f.asJSON && !watch {
				return printJSON(stdout, resp)
			}
			fmt.Fprintf(stdout, "evaluation %s: %d attempts queued\n", resp.ID, resp.Attempts)
			if watch {
				return watchEval(ctx, c, resp.ID, every, stdout)
			}
			return nil
		},
		"watch": func(args []string) error {
			c, f, pos, err := peopleFlags("eval watch", "eval watch ID [--every 2s]", args, 1, stderr, func(fs *flag.FlagSet) {
				fs.DurationVar(&every, "every", 2*time.Second, "how often to ask")
			})
			if err != nil {
				return err
			}
			if *f.asJSON {
				if err := watchEval(ctx, c, pos[0], every, io.Discard); err != nil {
					return err
				}
				var d dashboard.EvaluationDetail
				if err := c.get(ctx, "/api/evaluations/"+url.PathEscape(pos[0]), &d); err != nil {
					return err
				}
				return printJSON(stdout, d)
			}
			return watchEval(ctx, c, pos[0], every, stdout)
		},
		"ls": func(args []string) error {
			c, f, _, err := peopleFlags("eval ls", "eval ls", args, 0, stderr, nil)
			if err != nil {
				return err
			}
			var evs []dashboard.Evaluation
			if err := c.get(ctx, "/api/evaluations", &evs); err != nil {
				return err
			}
			if *f.asJSON {
				return printJSON(stdout, evs)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "EVALUATION\tSUITE\tAGENT\tGROUP\tLEVELS\tRUNS\tPROGRESS\tCOST")
			for _, e := range evs {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t$%.4f\n", e.ID, e.Suite, e.Agent, e.Group, strings.Join(e.Levels, ","), e.Runs,
					progressLine(e.Progress, 0), e.CostUSD)
			}
			return tw.Flush()
		},
	}
	return subcommands("eval", evalUsage, args, stderr, cmds)
}

// watchEval follows an evaluation, a progress line each time it moves
// (with why attempts wait, when no node can run them), until every
// attempt and run is finished; then prints its agent's board and per-task
// results.
func watchEval(ctx context.Context, c *apiClient, id string, every time.Duration, stdout io.Writer) error {
	last := ""
	for {
		var d dashboard.EvaluationDetail
		if err := c.get(ctx, "/api/evaluations/"+url.PathEscape(id), &d); err != nil {
			return err
		}
		if line := progressLine(d.Progress, 30) + "\n" + waitingLines(d.Waiting); line != last {
			fmt.Fprint(stdout, line)
			last = line
		}
		if d.Progress.Finished() {
			fmt.Fprintln(stdout)
			writeEvalResults(stdout, d)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(every):
		}
	}
}

// progressLine draws a progress bar width wide (0: none) and the counts.
func progressLine(p dashboard.Progress, width int) string {
	bar := ""
	if width > 0 {
		n := 0
		if p.Total > 0 {
			n = width * (p.Done + p.Failed) / p.Total
		}
		bar = "[" + strings.Repeat("#", n) + strings.Repeat(".", width-n) + "] "
	}
	s := fmt.Sprintf("%s%d/%d attempts done", bar, p.Done, p.Total)
	if p.Failed > 0 {
		s += fmt.Sprintf(", %d failed", p.Failed)
	}
	s += fmt.Sprintf(", %d/%d runs decided", p.Decided, p.Units)
	if p.Replays > 0 {
		s += fmt.Sprintf(" (+%d replays, %d pending)", p.Replays, p.ReplaysPending)
	}
	return s
}

// waitingLines says why attempts wait that no node can run, a line per
// reason, each with when they end unless a node that can run them comes.
func waitingLines(ws []dashboard.Waiting) string {
	var b strings.Builder
	for _, w := range ws {
		fmt.Fprintf(&b, "  waiting (%d attempts): %s", w.Attempts, w.Reason)
		if w.Blocked && !w.Deadline.IsZero() {
			fmt.Fprintf(&b, "; they end unschedulable at %s unless a node that can run them comes into view",
				w.Deadline.UTC().Format(time.TimeOnly+" UTC"))
		}
		b.WriteString("\n")
	}
	return b.String()
}

// failedLines says why attempts ended without a result, a line per
// outcome and reason.
func failedLines(atts []dashboard.Attempt) string {
	type key struct{ outcome, detail string }
	count := map[key]int{}
	var order []key
	for _, a := range atts {
		if a.State != "failed" {
			continue
		}
		k := key{a.Outcome, a.Detail}
		if count[k] == 0 {
			order = append(order, k)
		}
		count[k]++
	}
	var b strings.Builder
	for _, k := range order {
		fmt.Fprintf(&b, "%d attempts %s: %s\n", count[k], cmp.Or(k.outcome, "failed"), cmp.Or(k.detail, "no reason given"))
	}
	return b.String()
}

// writeEvalResults prints an evaluation's boards (its own runs) and
// per-task results, in the pages' words: a row without a validated run
// has no accuracy ("-"); cross-checked is validated of graded,
// replay-verified of a model-driven row's validated tasks, awaiting
// cross-check and pending the row's own counts.
func writeEvalResults(w io.Writer, d dashboard.EvaluationDetail) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	pct := func(v *float64) string {
		if v == nil {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100**v)
	}
	for _, b := range d.Boards {
		fmt.Fprintf(tw, "%s %s (%s)\n", b.Suite, b.Variant, b.Scoring)
		fmt.Fprintln(tw, "AGENT\tMODEL\tACCURACY\tMIN-MAX\tWRITTEN\tVISION\tRUNS\tCOST/RUN\tTOKENS/RUN\tWALL/RUN\tCROSS-CHECKED\tREPLAY-VERIFIED\tAWAITING CROSS-CHECK\tPENDING")
		for _, r := range b.Rows {
			cost := "-"
			if r.CostUSD != nil {
				cost = fmt.Sprintf("$%.4f", *r.CostUSD)
			}
			acc, span, tokens, wall := "-", "-", "-", "-"
			if r.HasAccuracy() {
				acc, span = pct(&r.Accuracy), fmt.Sprintf("%.1f-%.1f%%", 100*r.AccuracyMin, 100*r.AccuracyMax)
				tokens, wall = fmt.Sprintf("%.0f", r.Tokens), fmt.Sprintf("%.1fs", r.WallSeconds)
			}
			checked, replayed := "-", "-"
			if r.Graded() > 0 {
				checked = fmt.Sprintf("%d/%d", r.Validated, r.Graded())
			}
			if r.Sampled > 0 {
				replayed = fmt.Sprintf("%d/%d", r.ReplayVerified, r.Sampled)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%d\n", r.Agent, cmp.Or(r.Model, "-"), acc, span,
				pct(r.WrittenAccuracy), pct(r.VisionAccuracy), r.Runs, cost, tokens, wall, checked, replayed, r.Unvalidated, r.Pending)
		}
		fmt.Fprintln(tw)
	}
	if len(d.Tasks) > 0 {
		fmt.Fprintln(tw, "TASK\tLEVEL\tRUNS")
		for _, t := range d.Tasks {
			var cells []string
			for _, r := range t.Runs {
				v := r.Status
				if r.Value != nil {
					v = strconv.FormatFloat(*r.Value, 'f', 2, 64)
				}
				cells = append(cells, fmt.Sprintf("%d:%s", r.Run, v))
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\n", t.Task, t.Variant, strings.Join(cells, " "))
		}
	}
	tw.Flush()
	if s := failedLines(d.Attempts); s != "" {
		fmt.Fprintf(w, "\nended without a result (never scored, not counted against the agent):\n%s", s)
	}
}

const attemptUsage = `attempt ls --eval ID | attempt logs ID | attempt egress ID | attempt trajectory ID | attempt outputs ID [--get PATH [-o FILE]]`

func runAttempt(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var eval, get, out string
	cmds := map[string]func([]string) error{
		"ls": func(args []string) error {
			c, f, _, err := peopleFlags("attempt ls", "attempt ls --eval ID", args, 0, stderr, func(fs *flag.FlagSet) {
				fs.StringVar(&eval, "eval", "", "the evaluation (required)")
			})
			if err != nil {
				return err
			}
			if eval == "" {
				return errors.New("--eval is required")
			}
			var d dashboard.EvaluationDetail
			if err := c.get(ctx, "/api/evaluations/"+url.PathEscape(eval), &d); err != nil {
				return err
			}
			if *f.asJSON {
				return printJSON(stdout, d.Attempts)
			}
			tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ATTEMPT\tTASK\tLEVEL\tRUN\tREPLICA\tSTATE\tOUTCOME\tSCORE")
			for _, a := range d.Attempts {
				score := "-"
				if a.Score != nil {
					score = strconv.FormatFloat(a.Score.Value, 'f', 2, 64)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\n", a.ID, a.Task, a.Variant, a.Run, a.Replica, a.State, a.Outcome, score)
			}
			return tw.Flush()
		},
		"logs": func(args []string) error {
			c, f, pos, err := peopleFlags("attempt logs", "attempt logs ID", args, 1, stderr, nil)
			if err != nil {
				return err
			}
			var l dashboard.Logs
			if err := c.get(ctx, "/api/attempts/"+url.PathEscape(pos[0])+"/logs", &l); err != nil {
				return err
			}
			if *f.asJSON {
				return printJSON(stdout, l)
			}
			fmt.Fprintf(stdout, "outcome %s, exit code %d", l.Outcome, l.ExitCode)
			if l.Detail != "" && !l.DetailRepeatsExit() {
				fmt.Fprintf(stdout, " (%s)", l.Detail)
			}
			fmt.Fprintf(stdout, "\n--- stdout\n%s\n--- stderr\n%s\n", strings.TrimRight(l.Stdout, "\n"), strings.TrimRight(l.Stderr, "\n"))
			return nil
		},
		"egress": func(args []string) error {
			c, f, pos, err := peopleFlags("attempt egress", "attempt egress ID", args, 1, stderr, nil)
			if err != nil {
				return err
			}
			var e coordinator.EgressView
			if err := c.get(ctx, "/api/attempts/"+url.PathEscape(pos[0])+"/egress", &e); err != nil {
				return err
			}
			if *f.asJSON {
				return printJSON(stdout, e)
			}
			writeEgress(stdout, e)
			return nil
		},
		"trajectory": func(args []string) error {
			c, f, pos, err := peopleFlags("attempt trajectory", "attempt trajectory ID", args, 1, stderr, nil)
			if err != nil {
				return err
			}
			var calls []dashboard.Call
			if err := c.get(ctx, "/api/attempts/"+url.PathEscape(pos[0])+"/trajectory", &calls); err != nil {
				return err
			}
			if *f.asJSON {
				return printJSON(stdout, calls)
			}
			writeTrajectory(stdout, calls)
			return nil
		},
		"outputs": func(args []string) error {
			c, f, pos, err := peopleFlags("attempt outputs", "attempt outputs ID [--get PATH [-o FILE]]", args, 1, stderr, func(fs *flag.FlagSet) {
				fs.StringVar(&get, "get", "", "write this output's content")
				fs.StringVar(&out, "o", "-", "where --get writes (\"-\": standard output)")
			})
			if err != nil {
				return err
			}
			base := "/api/attempts/" + url.PathEscape(pos[0]) + "/outputs"
			if get == "" {
				var outs []dashboard.Output
				if err := c.get(ctx, base, &outs); err != nil {
					return err
				}
				if *f.asJSON {
					return printJSON(stdout, outs)
				}
				for _, o := range outs {
					if o.Error != "" {
						fmt.Fprintf(stdout, "%s\tnot returned: %s\n", o.Path, o.Error)
					} else {
						fmt.Fprintf(stdout, "%s\t%d bytes\n", o.Path, o.Size)
					}
				}
				return nil
			}
			data, err := c.raw(ctx, base+"/"+escapePath(get))
			if err != nil {
				return err
			}
			return writeOutput(out, stdout, data)
		},
	}
	return subcommands("attempt", attemptUsage, args, stderr, cmds)
}

// writeEgress prints an attempt's egress record as a table.
func writeEgress(w io.Writer, e coordinator.EgressView) {
	if len(e.Hosts) == 0 {
		fmt.Fprintf(w, "no host reached or refused (%d refusals in all)\n", e.Refused)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "HOST\tCONNECTIONS\tREFUSED\tFAILED\tSENT\tRECEIVED")
	for _, h := range e.Hosts {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\n", h.Host, h.Connections, h.Refused, h.Failed, h.BytesSent, h.BytesReceived)
	}
	tw.Flush()
	if e.Omitted > 0 {
		fmt.Fprintf(w, "%d more hosts left out by the node\n", e.Omitted)
	}
	fmt.Fprintf(w, "%d refusals in all\n", e.Refused)
}

// escapePath escapes each segment of a slash-separated path.
func escapePath(p string) string {
	parts := strings.Split(p, "/")
	for i := range parts {
		parts[i] = url.PathEscape(parts[i])
	}
	return strings.Join(parts, "/")
}

// raw gets path's body as it is (an error carries the API's message).
func (c *apiClient) raw(ctx context.Context, path string) ([]byte, error) {
	var data []byte
	err := c.do(ctx, http.MethodGet, path, nil, "", &data)
	return data, err
}

// writeTrajectory prints model calls as a conversation.
func writeTrajectory(w io.Writer, calls []dashboard.Call) {
	if len(calls) == 0 {
		fmt.Fprintln(w, "no model calls")
		return
	}
	for _, c := range calls {
		fmt.Fprintf(w, "=== call %d (assignment %d): %s %s, status %d, %d in / %d out tokens, $%.4f, %.0f ms\n", c.Seq+1, c.Assignment, c.Model,
			c.API, c.Status, c.InputTokens, c.OutputTokens, c.CostUSD, c.TotalMS)
		if c.Refused != "" || c.Error != "" {
			fmt.Fprintf(w, "refused %q, error %q\n", c.Refused, c.Error)
		}
		for _, m := range c.Request {
			writeMessage(w, m.Role, m)
		}
		for _, m := range c.Response {
			writeMessage(w, m.Role+" (answer)", m)
		}
	}
}

func writeMessage(w io.Writer, role string, m dashboard.Message) {
	fmt.Fprintf(w, "[%s] %s\n", role, m.Content)
	for _, tc := range m.ToolCalls {
		fmt.Fprintf(w, "  -> %s(%s)\n", tc.Name, tc.Arguments)
	}
}
