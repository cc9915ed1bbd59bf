package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"

	"github.com/repronet/repronet/coordinator"
)

// `repronet coordinator backup` and `restore` (docs/backup.md). A running
// coordinator holds its data folder's badger lock, and its state lives in
// its memory and journal as much as on disk: its backup is made inside it,
// consistently, and streamed to the admin (GET /api/backup). A stopped
// coordinator's folder is backed up directly.

const backupUsage = `coordinator backup [--config FILE] [--data DIR] -o FILE [--api URL] [--admin-token-file FILE]
       coordinator restore -i FILE --data NEWDIR`

func runCoordinatorBackup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return subcommands("coordinator", backupUsage, args, stderr, map[string]func([]string) error{
		"backup":  func(a []string) error { return coordinatorBackup(ctx, a, stdout, stderr) },
		"restore": func(a []string) error { return coordinatorRestore(ctx, a, stdout, stderr) },
	})
}

func coordinatorBackup(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("coordinator backup", backupUsage, stderr)
	configPath := fs.String(configFlag, "", "the coordinator's TOML configuration file: its data, http and admin-token-file settings are used (flags given here win)")
	dataDir := fs.String("data", defaultDataDir("coordinator"), "the coordinator's data folder")
	out := fs.String("o", "", "write the backup to this file (a tar stream; \"-\": standard output); it holds the coordinator's identity key and gold answers: keep it as secret as the folder")
	api := fs.String("api", "", "base URL of the running coordinator's HTTP API (default: from --config's http, else http://127.0.0.1:8080); used when the folder is in use")
	tokenFile := fs.String("admin-token-file", "", "file holding the coordinator's admin token (default: --config's admin-token-file, else $REPRONET_TOKEN)")
	timeout := fs.Duration("timeout", 0, "bound on the whole backup (0: none)")
	if err := fs.Parse(interleave(args)); err != nil {
		return err
	}
	if *out == "" || fs.NArg() != 0 {
		fs.Usage()
		return errors.New("coordinator backup: -o FILE is required, and no arguments")
	}
	if *configPath != "" {
		if err := backupConfig(fs, *configPath, dataDir, api, tokenFile); err != nil {
			return err
		}
	}
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	start := time.Now()
	how := "from the stopped folder " + *dataDir
	write := func(w io.Writer) (coordinator.BackupSummary, error) {
		if flagSet(fs, "api") {
			return coordinator.BackupSummary{}, coordinator.ErrRunning
		}
		return coordinator.BackupFolder(ctx, *dataDir, w, nil)
	}
	sum, err := writeBackupFile(*out, write)
	if errors.Is(err, coordinator.ErrRunning) {
		base := *api
		if base == "" {
			base = "http://127.0.0.1:8080"
		}
		token := os.Getenv("REPRONET_TOKEN")
		if *tokenFile != "" {
			if token, err = readSecret("--admin-token-file", *tokenFile, false); err != nil {
				return err
			}
		}
		if token == "" {
			return fmt.Errorf("coordinator backup: the folder %s is in use by a running coordinator: back it up through its API, with its admin token (--admin-token-file, --config, or $REPRONET_TOKEN)", *dataDir)
		}
		how = "from the running coordinator at " + base
		sum, err = writeBackupFile(*out, func(w io.Writer) (coordinator.BackupSummary, error) {
			return fetchBackup(ctx, base, token, w)
		})
	}
	if err != nil {
		return fmt.Errorf("coordinator backup: %w", err)
	}
	fmt.Fprintf(stdout, "backup %s: %d records (%s), %d block files (%s), in %s -> %s\n", how, sum.Records, mib(sum.RecordBytes),
		sum.Blocks, mib(sum.BlockBytes), time.Since(start).Round(time.Millisecond), *out)
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// backupConfig takes data, http and admin-token-file from the
// coordinator's configuration file where the command line left them unset.
func backupConfig(fs *flag.FlagSet, path string, dataDir, api, tokenFile *string) error {
	var doc map[string]any
	if _, err := toml.DecodeFile(path, &doc); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	str := func(k string) string { s, _ := doc[k].(string); return s }
	if v := str("data"); v != "" && !flagSet(fs, "data") {
		*dataDir = v
	}
	if v := str("http"); v != "" && !flagSet(fs, "api") {
		*api = "http://" + v
	}
	if v := str("admin-token-file"); v != "" && !flagSet(fs, "admin-token-file") {
		*tokenFile = v
	}
	return nil
}

// writeBackupFile writes the backup to path through a temporary file
// renamed into place once write succeeded and the file reads back whole
// ("-": standard output, unchecked).
func writeBackupFile(path string, write func(io.Writer) (coordinator.BackupSummary, error)) (coordinator.BackupSummary, error) {
	if path == "-" {
		return write(os.Stdout)
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".partial")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return coordinator.BackupSummary{}, err
	}
	defer os.Remove(tmp)
	sum, err := write(f)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return sum, err
	}
	r, err := os.Open(tmp)
	if err != nil {
		return sum, err
	}
	defer r.Close()
	if _, sum, err = coordinator.CheckBackup(r); err != nil {
		return sum, err
	}
	return sum, os.Rename(tmp, path)
}

// fetchBackup streams GET /api/backup into w.
func fetchBackup(ctx context.Context, base, token string, w io.Writer) (coordinator.BackupSummary, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(base, "/")+"/api/backup", nil)
	if err != nil {
		return coordinator.BackupSummary{}, fmt.Errorf("--api %q: %w", base, err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return coordinator.BackupSummary{}, fmt.Errorf("GET /api/backup: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return coordinator.BackupSummary{}, fmt.Errorf("GET /api/backup: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if _, err := io.Copy(w, resp.Body); err != nil {
		return coordinator.BackupSummary{}, fmt.Errorf("GET /api/backup: %w", err)
	}
	// The counts are read back from the file by writeBackupFile.
	return coordinator.BackupSummary{}, nil
}

func coordinatorRestore(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("coordinator restore", backupUsage, stderr)
	in := fs.String("i", "", "the backup file (\"-\": standard input)")
	dataDir := fs.String("data", "", "the new data folder (must not exist, or be empty)")
	if err := fs.Parse(interleave(args)); err != nil {
		return err
	}
	if *in == "" || *dataDir == "" || fs.NArg() != 0 {
		fs.Usage()
		return errors.New("coordinator restore: -i FILE and --data NEWDIR are required, and no arguments")
	}
	var r io.Reader = os.Stdin
	if *in != "-" {
		f, err := os.Open(*in)
		if err != nil {
			return fmt.Errorf("coordinator restore: %w", err)
		}
		defer f.Close()
		r = f
	}
	start := time.Now()
	log, err := newLogger(stderr, "warn", false)
	if err != nil {
		return err
	}
	sum, err := coordinator.Restore(ctx, r, *dataDir, log)
	if err != nil {
		return fmt.Errorf("coordinator restore: %w", err)
	}
	fmt.Fprintf(stdout, "restored coordinator %s (backup of %s) into %s: %d records (%s), %d block files (%s), %d stored files checked, in %s\n",
		sum.Manifest.Peer, sum.Manifest.Created.Format(time.RFC3339), *dataDir, sum.Records, mib(sum.RecordBytes), sum.Blocks, mib(sum.BlockBytes),
		sum.Files, time.Since(start).Round(time.Millisecond))
	return nil
}
