// Command repronet is the one binary of a repronet network: the
// coordinator, the volunteer node, the single-machine demo, and tools.
// It owns flag parsing, logging setup and signal handling, and nothing
// else: each subcommand calls into its package.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
)

const usage = `repronet: a peer-to-peer volunteer compute network for research-agent benchmarks.

Usage:
  repronet <command> [flags]

Commands:
  demo          run a coordinator and three nodes on this machine with the sample suite, end to end
  coordinator   run a coordinator: import suites, schedule attempts, ingest and grade reports
  node          run a volunteer node: announce slots, run assigned attempts in containerd
  capsule       manage content-addressed capsules: add, get, ls, verify, extract, rm, fetch-origin, serve
  chaos         run a coordinator and nodes as processes, kill and partition them, check nothing is lost
  grade         re-grade offline as the coordinator does: a CORE-Bench report.json, a PaperBench rubric and leaf grades, HeurekaBench answers or judge answers
  leaderboard   print a coordinator's leaderboards (--api URL): text, --json, or --hal DIR for HAL _UPLOAD.json files
  repro         reproducibility checks: submit TARBALL --spec S --runs K [--wait], status ID, check --spec S RUN_DIR...
  admin         the operator's accounts: groups (quota), submitters, tokens (make, list, revoke)
  agent         push an agent image for your group (agent push NAME OCI_TARBALL), list them; build a CLI agent's image (agent build claude-code|codex|gemini-cli -o FILE)
  eval          start an evaluation of your agent, watch it (progress, then the board), list them
  attempt       an attempt's logs, trajectory (model calls) and outputs
  coordinator backup|restore  back up a coordinator, running or not, to a file; restore one into a new folder
  node status   a running node's slots, attempts, cache and credit (from its --metrics address)
  version       print the version

Run 'repronet <command> --help' for a command's flags. The commands that talk to a
coordinator take --api URL (or $REPRONET_API) and --token-file (or $REPRONET_TOKEN).
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The first signal asks for a clean stop; from then on the signals
	// have their default action again, so a second one ends a stop that
	// hangs (say, badger retrying a flush into a folder deleted under it).
	// State is durable before it is acknowledged, so nothing is lost.
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmds := map[string]func(context.Context, []string, io.Writer, io.Writer) error{
		"demo":        runDemo,
		"coordinator": runCoordinator,
		"node":        runNode,
		"capsule":     runCapsule,
		"chaos":       runChaos,
		"grade":       runGrade,
		"leaderboard": runLeaderboard,
		"repro":       runRepro,
		"admin":       runAdmin,
		"agent":       runAgent,
		"eval":        runEval,
		"attempt":     runAttempt,
		"version": func(context.Context, []string, io.Writer, io.Writer) error {
			fmt.Fprintln(stdout, "repronet", version)
			return nil
		},
	}
	switch args[0] {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	cmd, ok := cmds[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "repronet: unknown command %q\n\n%s", args[0], usage)
		return 2
	}
	if err := cmd(ctx, args[1:], stdout, stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "repronet %s: %v\n", args[0], err)
		return 1
	}
	return 0
}

const version = "0.1.0"

// newFlags makes a flag set that prints its usage to stderr with a synopsis.
func newFlags(name, synopsis string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: repronet %s\n\n", synopsis)
		fs.PrintDefaults()
	}
	return fs
}

// newLogger makes the structured logger: JSON or text to w, at level.
func newLogger(w io.Writer, level string, json bool) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: l}
	if json {
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return slog.New(slog.NewTextHandler(w, opts)), nil
}

// stringList is a repeatable string flag.
type stringList []string

func (s *stringList) String() string     { return fmt.Sprint([]string(*s)) }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// runFolder prepares the data and log folder of a one-shot run (demo,
// chaos): dir, or a new temporary folder named after prefix when dir is
// empty. A given folder must be empty or absent. It opens DIR/NAME.log and
// returns the folder, the JSON logger writing there, and the log's close.
func runFolder(dir, prefix, logLevel string) (string, *slog.Logger, func() error, error) {
	if dir == "" {
		d, err := os.MkdirTemp("", "repronet-"+prefix+"-")
		if err != nil {
			return "", nil, nil, err
		}
		dir = d
	} else if entries, err := os.ReadDir(dir); err == nil && len(entries) > 0 {
		return "", nil, nil, fmt.Errorf("--dir %s is not empty; give an empty or new folder", dir)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", nil, nil, err
	}
	logf, err := os.Create(filepath.Join(dir, prefix+".log"))
	if err != nil {
		return "", nil, nil, err
	}
	log, err := newLogger(logf, logLevel, true)
	if err != nil {
		logf.Close()
		return "", nil, nil, err
	}
	return dir, log, logf.Close, nil
}
