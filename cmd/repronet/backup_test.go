package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/families"
)

// TestBackupCLI: `coordinator backup` of a running coordinator goes
// through its API (found in its configuration file, with its admin
// token), a wrong token is refused, and `coordinator restore` of the file
// gives a folder a coordinator starts on with the same peer ID.
func TestBackupCLI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	data := filepath.Join(dir, "data")
	const token = "cli-backup-admin-token-0123456789"
	tokenFile := filepath.Join(dir, "admin.token")
	os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
	c, err := coordinator.New(ctx, coordinator.Config{DataDir: data, Families: families.Registry(), AdminToken: token,
		ScheduleInterval: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: c.Handler()}
	go srv.Serve(ln)
	defer srv.Close()
	config := filepath.Join(dir, "coordinator.toml")
	os.WriteFile(config, []byte("data = \""+data+"\"\nhttp = \""+ln.Addr().String()+"\"\nadmin-token-file = \""+tokenFile+"\"\nnetwork = \"x\"\n"), 0o600)

	out := filepath.Join(dir, "backup.tar")
	var so, se bytes.Buffer
	if code := run(ctx, []string{"coordinator", "backup", "--config", config, "-o", out}, &so, &se); code != 0 {
		t.Fatalf("backup: %d %s", code, se.String())
	}
	if !strings.Contains(so.String(), "from the running coordinator at http://"+ln.Addr().String()) {
		t.Fatalf("backup output: %s", so.String())
	}
	wrong := filepath.Join(dir, "wrong.token")
	os.WriteFile(wrong, []byte("not-the-admin-token-0123456789\n"), 0o600)
	se.Reset()
	if code := run(ctx, []string{"coordinator", "backup", "--data", data, "--api", "http://" + ln.Addr().String(), "--admin-token-file", wrong,
		"-o", filepath.Join(dir, "b2.tar")}, &so, &se); code == 0 || !strings.Contains(se.String(), "401") {
		t.Fatalf("backup with a wrong token: %d %s", code, se.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "b2.tar")); err == nil {
		t.Fatal("a failed backup left its file")
	}
	se.Reset()
	if code := run(ctx, []string{"coordinator", "backup", "--data", data, "-o", filepath.Join(dir, "b3.tar")}, &so, &se); code == 0 ||
		!strings.Contains(se.String(), "in use by a running coordinator") {
		t.Fatalf("backup of a running folder without a token: %d %s", code, se.String())
	}

	restored := filepath.Join(dir, "restored")
	so.Reset()
	if code := run(ctx, []string{"coordinator", "restore", "-i", out, "--data", restored}, &so, &se); code != 0 {
		t.Fatalf("restore: %d %s", code, se.String())
	}
	c2, err := coordinator.New(ctx, coordinator.Config{DataDir: restored, Families: families.Registry(), ScheduleInterval: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if c2.ID() != c.ID() || !strings.Contains(so.String(), c.ID().String()) {
		t.Fatalf("restored peer %s (%s), want %s", c2.ID(), so.String(), c.ID())
	}
}
