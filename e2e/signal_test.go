package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// TestSecondSignalEndsAHangingStop: a coordinator whose data folder was
// deleted under it cannot finish a clean stop (badger retries flushing its
// memtable into the missing folder forever); the first SIGTERM starts the
// stop, and a second one ends the process.
func TestSecondSignalEndsAHangingStop(t *testing.T) {
	bin := binary(t)
	dir := t.TempDir()
	addrFile := filepath.Join(dir, "addr")
	data := filepath.Join(dir, "data")
	cmd := exec.Command(bin, "coordinator", "--data", data, "--listen", "/ip4/127.0.0.1/tcp/0", "--http", "",
		"--addr-file", addrFile, "--sample")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		cmd.Process.Kill()
		<-done
	}()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(addrFile); err == nil && len(b) > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the coordinator did not start within 60 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.RemoveAll(data); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err // it stopped on the first signal after all: fine too
		t.Logf("stopped on the first signal: %v", err)
		return
	case <-time.After(2 * time.Second):
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		done <- err
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("after the second SIGTERM: %v, want death by the signal", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the coordinator outlived a second SIGTERM by 15 s")
	}
}
