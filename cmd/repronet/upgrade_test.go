package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/repronet/repronet/coordinator"
	"github.com/repronet/repronet/internal/families"
	"github.com/repronet/repronet/internal/schema"
)

// prevRelease is the commit of the release before data-folder schema
// versions: main at the start of the session that added them (issue 26).
const prevRelease = "4395d29"

// prevBinaryEnv names a prebuilt binary of prevRelease, used instead of
// building one.
const prevBinaryEnv = "REPRONET_PREV_BINARY"

// prevBinary is the previous release's repronet: $REPRONET_PREV_BINARY,
// or built from prevRelease's source (git archive of this repository, go
// build with the module cache) once into the user's cache folder. The
// test is skipped, saying why, where neither git history nor a toolchain
// is at hand.
func prevBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv(prevBinaryEnv); p != "" {
		return p
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		t.Skipf("no cache folder for the previous release's binary: %v", err)
	}
	bin := filepath.Join(cache, "repronet-test", "repronet-"+prevRelease)
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(os.Getenv("GOROOT"), "bin", "go")
	}
	root, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("no git history to build the previous release (%s) from: %v; set %s", prevRelease, err, prevBinaryEnv)
	}
	src := t.TempDir()
	archive := exec.Command("sh", "-c", fmt.Sprintf("git -C %q archive --format=tar %s | tar -x -C %q", strings.TrimSpace(string(root)), prevRelease, src))
	if out, err := archive.CombinedOutput(); err != nil {
		t.Skipf("the previous release %s is not in this repository's history: %v: %s; set %s", prevRelease, err, out, prevBinaryEnv)
	}
	if err := os.MkdirAll(filepath.Dir(bin), 0o755); err != nil {
		t.Fatal(err)
	}
	build := exec.Command(goBin, "build", "-o", bin+".tmp", "./cmd/repronet")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the previous release %s: %v\n%s", prevRelease, err, out)
	}
	if err := os.Rename(bin+".tmp", bin); err != nil {
		t.Fatal(err)
	}
	return bin
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// adminGet reads path from a coordinator's API as its admin.
func adminGet(base, token, path string) ([]byte, error) {
	req, _ := http.NewRequest("GET", base+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != 200 {
		err = fmt.Errorf("GET %s: %s: %s", path, resp.Status, b)
	}
	return b, err
}

// TestUpgradeFromPreviousRelease: the previous release's binary makes a
// coordinator folder (the sample suite, its agents, an evaluation queued)
// and a capsule store folder (`capsule add`), neither with a schema file;
// this release adopts both at schema version 1 and opens them with
// nothing lost (every attempt field by field, the suites, the stored
// file); a folder at a newer version is refused naming both versions; and
// the upgraded coordinator folder backs up and restores with the CLI.
func TestUpgradeFromPreviousRelease(t *testing.T) {
	old := prevBinary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dir := t.TempDir()
	coordDir, nodeDir := filepath.Join(dir, "coordinator"), filepath.Join(dir, "node")
	const token = "upgrade-admin-token-0123456789"
	tokenFile := filepath.Join(dir, "admin.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// The previous release's coordinator.
	httpAddr := freeAddr(t)
	addrFile := filepath.Join(dir, "addr")
	var logs bytes.Buffer
	cmd := exec.CommandContext(ctx, old, "coordinator", "--data", coordDir, "--http", httpAddr, "--admin-token-file", tokenFile,
		"--listen", "/ip4/127.0.0.1/tcp/0", "--addr-file", addrFile, "--sample", "--suite", "corebench-sample",
		"--evaluate", "oracle", "--eval-id", "old-eval", "--log-level", "warn")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	base := "http://" + httpAddr
	var oldAttempts, oldSuites []byte
	deadline := time.Now().Add(time.Minute)
	for {
		var err error
		if oldAttempts, err = adminGet(base, token, "/api/attempts"); err == nil && strings.Contains(string(oldAttempts), "old-eval") {
			break
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("the previous release's coordinator did not come up: %v\n%s", err, logs.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	oldSuites, err := adminGet(base, token, "/api/suites")
	if err != nil {
		t.Fatal(err)
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Logf("previous release's coordinator: %v\n%s", err, logs.String())
	}
	file := filepath.Join(dir, "file.txt")
	os.WriteFile(file, []byte("a file the previous release stored\n"), 0o644)
	out, err := exec.CommandContext(ctx, old, "capsule", "add", "--data", nodeDir, file).CombinedOutput()
	if err != nil {
		t.Fatalf("previous release's capsule add: %v: %s", err, out)
	}
	storedCID := strings.Fields(string(out))[0]
	for _, d := range []string{coordDir, nodeDir} {
		if _, err := os.Stat(filepath.Join(d, schema.FileName)); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("the previous release wrote %s in %s (%v): not the folder this test is about", schema.FileName, d, err)
		}
	}

	// This release opens them.
	c, err := coordinator.New(ctx, coordinator.Config{DataDir: coordDir, Families: families.Registry(), Checker: families.Checker(),
		AdminToken: token, ScheduleInterval: time.Hour, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: c.Handler()}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go srv.Serve(ln)
	newBase := "http://" + ln.Addr().String()
	newAttempts, err := adminGet(newBase, token, "/api/attempts")
	if err != nil {
		t.Fatal(err)
	}
	newSuites, _ := adminGet(newBase, token, "/api/suites")
	srv.Close()
	c.Close()
	sameFields(t, "attempts", oldAttempts, newAttempts)
	sameFields(t, "suites", oldSuites, newSuites)
	f, ok, err := schema.Read(coordDir)
	if err != nil || !ok || f.Parts["coordinator"] != 1 || f.Parts["capsulestore"] != 1 {
		t.Fatalf("coordinator folder's schema after the upgrade: %+v %v %v", f, ok, err)
	}
	out2, err := capsuleCmd(t, ctx, "ls", "--data", nodeDir)
	if err != nil || !strings.Contains(out2, storedCID) {
		t.Fatalf("capsule ls of the previous release's store: %q, %v", out2, err)
	}
	if out2, err = capsuleCmd(t, ctx, "verify", "--data", nodeDir, storedCID); err != nil || !strings.Contains(out2, "ok") {
		t.Fatalf("capsule verify: %q, %v", out2, err)
	}
	if f, ok, err := schema.Read(nodeDir); err != nil || !ok || f.Parts["capsulestore"] != 1 {
		t.Fatalf("store folder's schema after the upgrade: %+v %v %v", f, ok, err)
	}

	// The upgraded folder backs up (offline) and restores with the CLI.
	backup := filepath.Join(dir, "backup.tar")
	var so, se bytes.Buffer
	if code := run(ctx, []string{"coordinator", "backup", "--data", coordDir, "-o", backup}, &so, &se); code != 0 {
		t.Fatalf("coordinator backup: %d %s", code, se.String())
	}
	restored := filepath.Join(dir, "restored")
	so.Reset()
	if code := run(ctx, []string{"coordinator", "restore", "-i", backup, "--data", restored}, &so, &se); code != 0 || !strings.Contains(so.String(), "restored coordinator") {
		t.Fatalf("coordinator restore: %d %s %s", code, so.String(), se.String())
	}
	se.Reset()
	if code := run(ctx, []string{"coordinator", "restore", "-i", backup, "--data", restored}, &so, &se); code == 0 || !strings.Contains(se.String(), "not empty") {
		t.Fatalf("restore into a non-empty folder: %d %s", code, se.String())
	}

	// A folder newer than this binary is refused, naming both versions.
	if err := schema.Write(coordDir, schema.File{Parts: map[string]int{"coordinator": 2, "capsulestore": 1}}); err != nil {
		t.Fatal(err)
	}
	_, err = coordinator.New(ctx, coordinator.Config{DataDir: coordDir, Families: families.Registry(), Logger: testLogger(t)})
	if err == nil || !strings.Contains(err.Error(), "schema version 2") || !strings.Contains(err.Error(), "version 1") {
		t.Fatalf("a newer folder: %v", err)
	}
}

// sameFields checks that every attempt (or suite) the previous release
// showed is shown by this one with every field it had equal.
func sameFields(t *testing.T, what string, oldJSON, newJSON []byte) {
	t.Helper()
	var olds, news []map[string]any
	if err := json.Unmarshal(oldJSON, &olds); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if err := json.Unmarshal(newJSON, &news); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	if len(olds) == 0 || len(olds) != len(news) {
		t.Fatalf("%s: the previous release showed %d, this one %d", what, len(olds), len(news))
	}
	for i, o := range olds {
		for k, v := range o {
			a, _ := json.Marshal(v)
			b, _ := json.Marshal(news[i][k])
			if !bytes.Equal(a, b) {
				t.Errorf("%s[%d].%s: previous release %s, this one %s", what, i, k, a, b)
			}
		}
	}
}

func testLogger(t *testing.T) *slog.Logger { return slog.New(slog.DiscardHandler) }
