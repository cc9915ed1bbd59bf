package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/repronet/repronet/bench/corebench/hal"
	"github.com/repronet/repronet/bench/corebench/leaderboard"
)

// Coordinator API paths the leaderboard command reads (public, read-only).
const (
	// leaderboardsPath serves []leaderboard.Board.
	leaderboardsPath = "/api/leaderboards"
	// leaderboardEntriesPath serves []leaderboard.Entry: one per attempt
	// (not per replica), canaries left out, no gold.
	leaderboardEntriesPath = "/api/leaderboard/entries"
)

// leaderboardSource is what the leaderboard command needs from a
// coordinator.
type leaderboardSource interface {
	Boards(ctx context.Context) ([]leaderboard.Board, error)
	Entries(ctx context.Context) ([]leaderboard.Entry, error)
}

func runLeaderboard(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("leaderboard", "leaderboard --api URL [--json | --hal DIR] [--suite S] [--level L] [--grader G]", stderr)
	api := fs.String("api", "http://127.0.0.1:8080", "base URL of the coordinator's HTTP API")
	asJSON := fs.Bool("json", false, "print the boards as JSON")
	halDir := fs.String("hal", "", "write one HAL <run_id>_UPLOAD.json per agent, level and run into this folder")
	runPrefix := fs.String("hal-run-prefix", "repronet_", "prefix of the run_id of --hal uploads")
	suite := fs.String("suite", "", "only this suite")
	level := fs.String("level", "", "only this level")
	grader := fs.String("grader", "", "only this grader")
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
	src, err := newAPIClient(*api, "", *timeout)
	if err != nil {
		return err
	}
	return leaderboardCommand(ctx, src, leaderboardOptions{json: *asJSON, halDir: *halDir, runPrefix: *runPrefix,
		suite: *suite, level: *level, grader: *grader}, stdout)
}

type leaderboardOptions struct {
	json                 bool
	halDir, runPrefix    string
	suite, level, grader string
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
		uploads, errs := hal.Export(kept, hal.Options{RunIDPrefix: o.runPrefix})
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
			fmt.Fprintf(stdout, "%s: accuracy %.3f over %d validated tasks\n", p, u.Results.Accuracy, len(u.RawEvalResults))
		}
		return nil
	}
	boards, err := src.Boards(ctx)
	if err != nil {
		return err
	}
	var kept []leaderboard.Board
	for _, b := range boards {
		if o.keep(b.Suite, b.Level, b.Scoring.Grader) {
			kept = append(kept, b)
		}
	}
	if o.json {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if kept == nil {
			kept = []leaderboard.Board{}
		}
		return enc.Encode(kept)
	}
	return leaderboard.WriteText(stdout, kept)
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

// Boards returns the coordinator's CORE-Bench boards. Boards of other
// families travel in the same list, each naming its family: they are left
// out here (the API serves them whole).
func (c *apiClient) Boards(ctx context.Context) ([]leaderboard.Board, error) {
	var raw []json.RawMessage
	if err := c.do(ctx, http.MethodGet, leaderboardsPath, nil, "", &raw); err != nil {
		return nil, err
	}
	var out []leaderboard.Board
	for i, r := range raw {
		var head struct {
			Family string `json:"family"`
		}
		if err := json.Unmarshal(r, &head); err != nil {
			return nil, fmt.Errorf("board %d: %w", i, err)
		}
		if head.Family != "" && head.Family != "corebench" {
			continue
		}
		var b leaderboard.Board
		if err := json.Unmarshal(r, &b); err != nil {
			return nil, fmt.Errorf("board %d: %w", i, err)
		}
		out = append(out, b)
	}
	return out, nil
}

func (c *apiClient) Entries(ctx context.Context) ([]leaderboard.Entry, error) {
	var e []leaderboard.Entry
	return e, c.do(ctx, http.MethodGet, leaderboardEntriesPath, nil, "", &e)
}
