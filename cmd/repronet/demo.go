package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/repronet/repronet/gateway"
	"github.com/repronet/repronet/internal/demo"
	"github.com/repronet/repronet/sandbox"
)

func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("demo", "demo [--json] [--dir DIR] [--nodes N] [--hal DIR] [--model-url URL --model-key-file F --model NAME [--model-price IN/OUT] | --config FILE --model NAME]", stderr)
	configPath := fs.String(configFlag, "", "TOML file of the demo's flags by name and the model gateway's [[providers]], [[models]] and [limits], as `repronet coordinator --config` reads them (docs/gateway.md); the reference agent calls --model, which one of them must serve with api openai")
	asJSON := fs.Bool("json", false, "print the leaderboard as JSON instead of a table")
	dir := fs.String("dir", "", "empty or new folder for the demo's data and logs (default: a new temporary folder)")
	nodes := fs.Int("nodes", 3, "node processes to start")
	slots := fs.Int("slots", 2, "slots per node")
	daemonDir := fs.String("containerd-dir", sandbox.DefaultDaemonDir, "folder of the private containerd daemon (started when not running)")
	logLevel := fs.String("log-level", "info", "level of the log written to DIR/demo.log")
	halDir := fs.String("hal", "", "write HAL's <run_id>_UPLOAD.json files of the demo's evaluations into this folder")
	modelURL := fs.String("model-url", "", "an OpenAI-compatible provider's base URL (…/v1) for the reference agent (default: the built-in scripted model server)")
	keyFile := fs.String("model-key-file", "", "with --model-url: file holding the provider's key (only the coordinator's gateway reads it)")
	model := fs.String("model", "", "with --model-url: the model the reference agent calls")
	price := fs.String("model-price", "0/0", "with --model-url: the model's price, dollars per million input/output tokens (e.g. 2.5/10)")
	budget := fs.Float64("budget-usd", 1, "cap on each reference attempt's model cost, dollars")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tables, err := applyConfig(fs, *configPath, gatewayTables...)
	if err != nil {
		return err
	}
	gw, err := gatewayConfig(*configPath, tables)
	if err != nil {
		return err
	}
	var m demo.Model
	if gw != nil {
		if *modelURL != "" || *keyFile != "" || *price != "0/0" {
			return errors.New("--model-url, --model-key-file and --model-price do not go with a --config that configures providers")
		}
		if *model == "" {
			return fmt.Errorf("--config configures providers: --model names the one the reference agent calls (one of %v)", gw.ModelNames())
		}
		m = demo.Model{Gateway: gw, Name: *model, AttemptUSD: *budget}
		if err := m.Validate(); err != nil {
			return err
		}
	} else if m, err = demoModel(*modelURL, *keyFile, *model, *price, *budget); err != nil {
		return err
	}
	runDir, log, closeLog, err := runFolder(*dir, "demo", *logLevel)
	if err != nil {
		return err
	}
	defer closeLog()
	*dir = runDir
	bin, err := os.Executable()
	if err != nil {
		return fmt.Errorf("find own executable to run nodes: %w", err)
	}
	agentBin, err := demo.AgentBinary(bin)
	if err != nil {
		if !m.Scripted() {
			return err
		}
		agentBin = "" // the progress says the reference agent is left out
	}
	res, err := demo.Run(ctx, demo.Config{
		Dir: *dir, Binary: bin, Nodes: *nodes, SlotsPerNode: *slots, DaemonDir: *daemonDir,
		Progress: stderr, Logger: log, AgentBinary: agentBin, Model: m, HALDir: *halDir,
	})
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, *dir)
	}
	if *asJSON {
		b, err := res.JSON()
		if err != nil {
			return err
		}
		fmt.Fprintln(stdout, string(b))
		return nil
	}
	fmt.Fprintf(stdout, "\nLeaderboard: %s (%d attempts, %d lost to infrastructure, %.1f s)\n\n", demo.SuiteName, res.Attempts, res.Failed, res.WallSeconds)
	fmt.Fprint(stdout, demo.FormatLeaderboard(res.Leaderboard))
	if res.Reference != "" {
		fmt.Fprintf(stdout, "\nThe %s.\n", res.Reference)
	}
	for _, f := range res.HALFiles {
		fmt.Fprintf(stdout, "HAL upload: %s\n", f)
	}
	fmt.Fprintf(stdout, "\nLogs and data: %s\n", res.Dir)
	return nil
}

// demoModel is the reference agent's model from the demo's flags: the
// key is read from its file here and goes only to the coordinator's
// gateway.
func demoModel(url, keyFile, name, price string, budget float64) (demo.Model, error) {
	if url == "" {
		if keyFile != "" || name != "" || price != "0/0" {
			return demo.Model{}, errors.New("--model-key-file, --model and --model-price go with --model-url")
		}
		return demo.Model{AttemptUSD: budget}, validBudget(budget)
	}
	if keyFile == "" {
		return demo.Model{}, errors.New("--model-url needs --model-key-file (the provider's key, read from the file)")
	}
	b, err := os.ReadFile(keyFile)
	if err != nil {
		return demo.Model{}, fmt.Errorf("--model-key-file: %w", err)
	}
	key := strings.TrimSpace(string(b))
	if key == "" || strings.ContainsAny(key, " \t\r\n") {
		return demo.Model{}, fmt.Errorf("--model-key-file %s: want one key on one line", keyFile)
	}
	in, out, ok := strings.Cut(price, "/")
	pin, errIn := strconv.ParseFloat(in, 64)
	pout, errOut := strconv.ParseFloat(out, 64)
	if !ok || errIn != nil || errOut != nil {
		return demo.Model{}, fmt.Errorf("--model-price %q: want IN/OUT, dollars per million tokens (e.g. 2.5/10)", price)
	}
	if err := validBudget(budget); err != nil {
		return demo.Model{}, err
	}
	m := demo.Model{URL: url, Key: key, Name: name, Price: gateway.PriceUSD{Input: pin, Output: pout}, AttemptUSD: budget}
	return m, m.Validate()
}

func validBudget(usd float64) error {
	if !(usd > 0) {
		return fmt.Errorf("--budget-usd %v: want more than 0", usd)
	}
	return nil
}
