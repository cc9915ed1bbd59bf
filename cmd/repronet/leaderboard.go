package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench/hal"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
	hfamily "github.com/repronet/repronet/bench/heureka/family"
	pbfamily "github.com/repronet/repronet/bench/paperbench/family"
	"github.com/repronet/repronet/bench/shellqa"
)

// Coordinator API paths the leaderboard command reads (public, read-only).
const (
	// leaderboardsPath serves []leaderboard.Board.
	leaderboardsPath = "/api/leaderboards"
	// leaderboardEntriesPath serves []leaderboard.Entry: one per attempt
	// (not per replica), canaries left out, no gold.
	leaderboardEntriesPath = "/api/leaderboard/entries"
	// halTrajectoriesPath serves []hal.Trajectory (coordinator.HALRun): the
	// model calls of the validated runs the token may read.
	halTrajectoriesPath = "/api/hal/trajectories"
)

// leaderboardSource is what the leaderboard command needs from a
// coordinator.
type leaderboardSource interface {
	// Boards are the boards of every family as served: JSON objects, each
	// naming its family (CORE-Bench's may not: older coordinators).
	Boards(ctx context.Context) ([]json.RawMessage, error)
	Entries(ctx context.Context) ([]leaderboard.Entry, error)
	// HALTrajectories needs a token; nil, nil without one.
	HALTrajectories(ctx context.Context, suite, level string) ([]hal.Trajectory, error)
}

func runLeaderboard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("leaderboard", "leaderboard --api URL [--json | --hal DIR [--token-file F]] [--family F] [--suite S] [--level L] [--grader G]", stderr)
	api := fs.String("api", "http://127.0.0.1:8080", "base URL of the coordinator's HTTP API")
	tokenFile := fs.String("token-file", "", "with --hal: file holding a submitter's or the admin's token (default: $REPRONET_TOKEN), "+
		"to fill raw_logging_results, total_usage and latencies from the trajectories of the runs it may read")
	asJSON := fs.Bool("json", false, "print the boards as JSON (as the coordinator serves them, each naming its family)")
	halDir := fs.String("hal", "", "write one HAL <run_id>_UPLOAD.json per agent, level and run into this folder")
	runPrefix := fs.String("hal-run-prefix", "repronet_", "prefix of the run_id of --hal uploads")
	family := fs.String("family", "", "only this family's boards (corebench, paperbench, heureka, shellqa, ...)")
	suite := fs.String("suite", "", "only this suite")
	level := fs.String("level", "", "only this level, variant (paperbench: code-dev, full) or question kind (heureka: mcq, oeq)")
	grader := fs.String("grader", "", "only this grader (heureka: MCQ grader or OEQ scorer)")
	timeout := fs.Duration("timeout", 30*time.Second, "HTTP timeout")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *asJSON && *halDir != "" {
		return errors.New("--json and --hal exclude each other")
	}
	token := ""
	if *halDir != "" {
		token = os.Getenv("REPRONET_TOKEN")
		if *tokenFile != "" {
			b, err := os.ReadFile(*tokenFile)
			if err != nil {
				return fmt.Errorf("--token-file: %w", err)
			}
			token = strings.TrimSpace(string(b))
		}
	}
	src, err := newAPIClient(*api, token, *timeout)
	if err != nil {
		return err
	}
	return leaderboardCommand(ctx, src, leaderboardOptions{json: *asJSON, halDir: *halDir, runPrefix: *runPrefix,
		family: *family, suite: *suite, level: *level, grader: *grader}, stdout)
}

type leaderboardOptions struct {
	json                         bool
	halDir, runPrefix            string
	family, suite, level, grader string
}

func (o leaderboardOptions) keep(suite, level, grader string) bool {
	return (o.suite == "" || o.suite == suite) && (o.level == "" || o.level == level) && (o.grader == "" || o.grader == grader)
}

func leaderboardCommand(ctx context.Context, src leaderboardSource, o leaderboardOptions, stdout io.Writer) error {
	if o.halDir != "" {
		entries, err := src.Entries(ctx)
		if err != nil {
			return err
		}
		var kept []leaderboard.Entry
		for _, e := range entries {
			if o.keep(e.Suite, e.Level, e.Scoring.Grader) {
				kept = append(kept, e)
			}
		}
		trajectories, err := src.HALTrajectories(ctx, o.suite, o.level)
		if err != nil {
			return fmt.Errorf("--hal: %w", err)
		}
		if trajectories == nil {
			fmt.Fprintln(stdout, "no token: raw_logging_results are left empty, usage and latencies are the entries' (see --token-file)")
		}
		uploads, errs := hal.Export(kept, hal.Options{RunIDPrefix: o.runPrefix, Trajectories: trajectories})
		for _, err := range errs {
			fmt.Fprintf(stdout, "skipped: %v\n", err)
		}
		if err := os.MkdirAll(o.halDir, 0o755); err != nil {
			return fmt.Errorf("--hal: %w", err)
		}
		for _, u := range uploads {
			b, err := json.MarshalIndent(u, "", "  ")
			if err != nil {
				return fmt.Errorf("--hal: %s: %w", u.FileName(), err)
			}
			p := filepath.Join(o.halDir, u.FileName())
			if err := writeOutput(p, stdout, append(b, '\n')); err != nil {
				return fmt.Errorf("--hal: %w", err)
			}
			fmt.Fprintf(stdout, "%s: accuracy %.3f over %d validated tasks, %d model calls, $%.4f", p, u.Results.Accuracy,
				len(u.RawEvalResults), len(u.RawLoggingResults), u.TotalCost)
			if n := len(u.Repronet.NoTrajectory); n > 0 {
				fmt.Fprintf(stdout, " (%d tasks without trajectory)", n)
			}
			fmt.Fprintln(stdout)
		}
		return nil
	}
	raw, err := src.Boards(ctx)
	if err != nil {
		return err
	}
	boards, err := decodeBoards(raw)
	if err != nil {
		return err
	}
	kept := slices.DeleteFunc(boards, func(b familyBoard) bool {
		return !(o.family == "" || o.family == b.family) || !o.keep(b.key.suite, b.key.level, b.key.grader)
	})
	if o.json {
		out := make([]json.RawMessage, 0, len(kept))
		for _, b := range kept {
			out = append(out, b.raw)
		}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	return writeBoardsText(stdout, kept)
}

// boardKey is what the filters match a board on.
type boardKey struct{ suite, level, grader string }

// familyBoard is one served board, decoded by its family when the command
// knows it (value nil otherwise).
type familyBoard struct {
	family string
	raw    json.RawMessage
	key    boardKey
	value  any
}

// boardText is how the command reads and prints one family's boards.
type boardText struct {
	decode func(json.RawMessage) (any, boardKey, error)
	write  func(io.Writer, []any) error
}

// textFamily makes a boardText from a family's board type, its key and
// its text writer.
func textFamily[B any](key func(B) boardKey, write func(io.Writer, []B) error) boardText {
	return boardText{
		decode: func(raw json.RawMessage) (any, boardKey, error) {
			var b B
			if err := json.Unmarshal(raw, &b); err != nil {
				return nil, boardKey{}, err
			}
			return b, key(b), nil
		},
		write: func(w io.Writer, boards []any) error {
			bs := make([]B, 0, len(boards))
			for _, b := range boards {
				bs = append(bs, b.(B))
			}
			return write(w, bs)
		},
	}
}

// boardTexts are the families whose boards the command prints as text.
var boardTexts = map[string]boardText{
	"corebench": textFamily(func(b leaderboard.Board) boardKey { return boardKey{b.Suite, b.Level, b.Scoring.Grader} },
		leaderboard.WriteText),
	pbfamily.Name: textFamily(func(b pbfamily.Board) boardKey { return boardKey{b.Suite, b.Variant, string(b.Grader)} },
		pbfamily.WriteText),
	hfamily.Name: textFamily(func(b hfamily.Board) boardKey { return boardKey{b.Suite, b.Kind, b.Grader} }, hfamily.WriteText),
	shellqa.Name: textFamily(func(b shellqa.Board) boardKey {
		var sc shellqa.Scoring
		_ = json.Unmarshal(b.Scoring, &sc)
		return boardKey{b.Suite, b.Variant, sc.String()}
	}, shellqa.WriteText),
}

// decodeBoards reads served boards by family; a board without a family is
// CORE-Bench's (older coordinators), one of a family the command does not
// know is kept whole for --json and named in the text.
func decodeBoards(raw []json.RawMessage) ([]familyBoard, error) {
	out := make([]familyBoard, 0, len(raw))
	for i, r := range raw {
		var head struct {
			Family string `json:"family"`
			Suite  string `json:"suite"`
		}
		if err := json.Unmarshal(r, &head); err != nil {
			return nil, fmt.Errorf("board %d: %w", i, err)
		}
		b := familyBoard{family: cmp.Or(head.Family, "corebench"), raw: r, key: boardKey{suite: head.Suite}}
		if t, ok := boardTexts[b.family]; ok {
			v, k, err := t.decode(r)
			if err != nil {
				return nil, fmt.Errorf("board %d (%s): %w", i, b.family, err)
			}
			b.value, b.key = v, k
		}
		out = append(out, b)
	}
	return out, nil
}

// writeBoardsText prints boards family by family, in the order the
// families first come, each with its family's text form.
func writeBoardsText(w io.Writer, boards []familyBoard) error {
	if len(boards) == 0 {
		_, err := fmt.Fprintln(w, "no leaderboard yet: no graded attempt")
		return err
	}
	var order []string
	byFamily := map[string][]familyBoard{}
	for _, b := range boards {
		if _, seen := byFamily[b.family]; !seen {
			order = append(order, b.family)
		}
		byFamily[b.family] = append(byFamily[b.family], b)
	}
	for i, f := range order {
		if i > 0 {
			fmt.Fprintln(w)
		}
		t, ok := boardTexts[f]
		if !ok {
			fmt.Fprintf(w, "%s: %d boards of a family this command cannot show as text (see --json)\n", f, len(byFamily[f]))
			continue
		}
		values := make([]any, 0, len(byFamily[f]))
		for _, b := range byFamily[f] {
			values = append(values, b.value)
		}
		if err := t.write(w, values); err != nil {
			return err
		}
	}
	return writeReliabilityKey(w)
}

// writeReliabilityKey prints what the reliability lines under the boards
// mean (bench.ReliabilityKey).
func writeReliabilityKey(w io.Writer) error {
	if _, err := fmt.Fprintln(w, "\nkey to the reliability lines:"); err != nil {
		return err
	}
	for _, k := range bench.ReliabilityKey() {
		if _, err := fmt.Fprintf(w, "  %s: %s\n", k.Name, k.Meaning); err != nil {
			return err
		}
	}
	return nil
}

// apiClient talks to a coordinator's HTTP API.
type apiClient struct {
	base   *url.URL
	token  string
	client *http.Client
	// reproImage names the image of submitted reproducibility checks ("":
	// the coordinator's default).
	reproImage string
}

func newAPIClient(base, token string, timeout time.Duration) (*apiClient, error) {
	u, err := url.Parse(strings.TrimSuffix(base, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("--api %q: want an http:// or https:// URL", base)
	}
	return &apiClient{base: u, token: token, client: &http.Client{Timeout: timeout}}, nil
}

// maxAPIResponse bounds what the CLI reads from a coordinator.
const maxAPIResponse = 256 << 20

// do sends a request and decodes a JSON answer into out; an answer that
// is not 2xx is an error carrying the API's {"error": ...} when present.
func (c *apiClient) do(ctx context.Context, method, path string, body io.Reader, contentType string, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, body)
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAPIResponse))
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		var apiErr struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(data))
		if json.Unmarshal(data, &apiErr) == nil && apiErr.Error != "" {
			msg = apiErr.Error
		}
		if resp.StatusCode == http.StatusNotFound && msg == "404 page not found" {
			msg = "this coordinator does not serve " + path + " (too old?)"
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, msg)
	}
	if raw, ok := out.(*[]byte); ok { // the body as it is (an output file)
		*raw = data
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode: %w", method, path, err)
	}
	return nil
}

// Boards returns the coordinator's boards of every family as served.
func (c *apiClient) Boards(ctx context.Context) ([]json.RawMessage, error) {
	var raw []json.RawMessage
	return raw, c.do(ctx, http.MethodGet, leaderboardsPath, nil, "", &raw)
}

func (c *apiClient) Entries(ctx context.Context) ([]leaderboard.Entry, error) {
	var e []leaderboard.Entry
	return e, c.do(ctx, http.MethodGet, leaderboardEntriesPath, nil, "", &e)
}

// HALTrajectories reads the model calls of the validated runs the
// client's token may read (nil without a token).
func (c *apiClient) HALTrajectories(ctx context.Context, suite, level string) ([]hal.Trajectory, error) {
	if c.token == "" {
		return nil, nil
	}
	q := url.Values{}
	if suite != "" {
		q.Set("suite", suite)
	}
	if level != "" {
		q.Set("level", level)
	}
	path := halTrajectoriesPath
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	t := []hal.Trajectory{}
	return t, c.do(ctx, http.MethodGet, path, nil, "", &t)
}
