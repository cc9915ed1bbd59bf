package halcheck

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindUnavailable: without HAL's repository (or without the script)
// Find says what is missing, as ErrUnavailable, so tests can skip.
func TestFindUnavailable(t *testing.T) {
	dir := t.TempDir()
	script := filepath.Join(dir, "check.py")
	if err := os.WriteFile(script, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Find(context.Background(), filepath.Join(dir, "missing.py"), dir); !errors.Is(err, ErrUnavailable) {
		t.Errorf("no script: %v", err)
	}
	t.Setenv(EnvRepo, filepath.Join(dir, "no-such-repo"))
	_, err := Find(context.Background(), script, dir)
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no repository: %v", err)
	}
	if !strings.Contains(err.Error(), "no-such-repo") && !strings.Contains(err.Error(), "aiofiles") {
		t.Errorf("the error names neither the repository nor the module: %v", err)
	}
	if _, err := (&Checker{Script: script}).Check(context.Background()); err == nil {
		t.Error("a check of no file passed")
	}
}
