package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	cliagent "github.com/repronet/repronet/agents/cli"
	"github.com/repronet/repronet/internal/debimage"
)

const agentBuildSynopsis = "agent build claude-code|codex|gemini-cli -o FILE.oci.tar [--version V] [--npm-dir DIR] [--cache DIR] [--mirror URL]"

// runAgentBuild builds a CLI agent's image (agents/cli): its npm
// packages from the npm registry (npm pack, integrity-checked against the
// pins), a Debian base made by debootstrap (root; cached), and the
// harness. Push it with `repronet agent push NAME FILE`.
func runAgentBuild(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("agent build", agentBuildSynopsis, stderr)
	out := fs.String("o", "", "the image tarball to write (OCI image layout)")
	version := fs.String("version", "", "the CLI's npm version (default: the pinned one, whose integrity hashes are checked)")
	npmDir := fs.String("npm-dir", "", "where the npm tarballs are kept (default: npm/ in --cache); tarballs there with the pinned hashes are not fetched again")
	cache := fs.String("cache", debimage.DefaultCacheDir, "where the Debian root file systems are kept")
	mirror := fs.String("mirror", debimage.DefaultMirror, "the Debian mirror")
	if err := fs.Parse(interleave(args)); err != nil {
		return err
	}
	if fs.NArg() != 1 || *out == "" {
		fs.Usage()
		return fmt.Errorf("agent build: want one agent (%s) and -o FILE", strings.Join(cliagent.Names, ", "))
	}
	a, err := cliagent.Lookup(fs.Arg(0), *version)
	if err != nil {
		return fmt.Errorf("agent build: %w", err)
	}
	dir := *npmDir
	if dir == "" {
		dir = filepath.Join(*cache, "npm")
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("agent build: the Debian base is made by debootstrap, which needs root")
	}
	fmt.Fprintf(stderr, "building %s %s (npm tarballs in %s, Debian base in %s)\n", a.Name, a.Version, dir, *cache)
	sums, err := cliagent.Build(ctx, debimage.Builder{CacheDir: *cache, Mirror: *mirror}, a, dir, *out)
	if err != nil {
		return fmt.Errorf("agent build: %w", err)
	}
	for _, spec := range slices.Sorted(maps.Keys(sums)) {
		fmt.Fprintf(stdout, "%s %s\n", spec, sums[spec])
	}
	st, err := os.Stat(*out)
	if err != nil {
		return fmt.Errorf("agent build: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s: %s %s, %d bytes; push it with: repronet agent push %s %s --model MODEL\n",
		*out, a.Ref(), a.Version, st.Size(), a.Name, *out)
	return nil
}
