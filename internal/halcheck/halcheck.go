// Package halcheck runs HAL's own upload check (check_upload_structure in
// utils/processing.py of HAL's leaderboard app,
// github.com/benediktstroebl/hal-frontend) on HAL upload files, through
// scripts/hal_upload_check.py, from a copy of that repository that is not
// part of repronet. Tests use it to show that HAL would accept what
// repronet exports.
//
// It owns finding the check (Find) and running it (Check); it holds none
// of HAL's code and never fetches anything.
package halcheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// EnvRepo names HAL's leaderboard app: a checkout or a git directory
// (bare, as the project's fetch tool leaves it). Without it, DefaultRepo
// is tried.
const EnvRepo = "HAL_FRONTEND"

// DefaultRepo is where the project's machines keep a fetched copy of
// benediktstroebl/hal-frontend.
const DefaultRepo = "/work/.mirror/benediktstroebl+hal-frontend/repo"

// Python is the interpreter the check runs with: Debian's, whose
// python3-aiofiles and python3-tqdm the module imports.
const Python = "/usr/bin/python3"

// Checker runs the check.
type Checker struct {
	// Script is scripts/hal_upload_check.py; Processing HAL's
	// utils/processing.py; Source says where it came from.
	Script, Processing, Source string
}

// ErrUnavailable wraps what is missing for the check to run.
var ErrUnavailable = errors.New("HAL's upload check is not available")

// Find locates the check: script is scripts/hal_upload_check.py, tmp an
// existing folder where a processing.py read from a git directory is
// written. Its error wraps ErrUnavailable when Python, its modules or
// HAL's repository are missing.
func Find(ctx context.Context, script, tmp string) (*Checker, error) {
	if _, err := os.Stat(script); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	if out, err := exec.CommandContext(ctx, Python, "-c", "import aiofiles, tqdm").CombinedOutput(); err != nil {
		return nil, fmt.Errorf("%w: %s cannot import aiofiles and tqdm (apt-get install python3-aiofiles python3-tqdm): %v: %s",
			ErrUnavailable, Python, err, strings.TrimSpace(string(out)))
	}
	repo := os.Getenv(EnvRepo)
	if repo == "" {
		repo = DefaultRepo
	}
	if p := filepath.Join(repo, "utils", "processing.py"); fileExists(p) {
		return &Checker{Script: script, Processing: p, Source: p}, nil
	}
	commit, err := exec.CommandContext(ctx, "git", "--git-dir", repo, "rev-parse", "HEAD").Output()
	if err != nil {
		return nil, fmt.Errorf("%w: no checkout or git directory of hal-frontend at %s (set $%s): %v", ErrUnavailable, repo, EnvRepo, err)
	}
	rev := strings.TrimSpace(string(commit))
	src, err := exec.CommandContext(ctx, "git", "--git-dir", repo, "show", rev+":utils/processing.py").Output()
	if err != nil {
		return nil, fmt.Errorf("%w: %s has no utils/processing.py at %s: %v", ErrUnavailable, repo, rev, err)
	}
	p := filepath.Join(tmp, "processing.py")
	if err := os.WriteFile(p, src, 0o644); err != nil {
		return nil, err
	}
	return &Checker{Script: script, Processing: p, Source: repo + " at " + rev}, nil
}

// Check runs HAL's check on files: nil when it accepts every one; the
// output names each file and HAL's message.
func (c *Checker) Check(ctx context.Context, files ...string) (string, error) {
	if len(files) == 0 {
		return "", errors.New("halcheck: no file to check")
	}
	args := append([]string{c.Script, "--processing", c.Processing}, files...)
	out, err := exec.CommandContext(ctx, Python, args...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("HAL's check_upload_structure (%s): %w: %s", c.Source, err, out)
	}
	return string(out), nil
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular()
}
