package reproenv_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/repro/reproenv"
	"github.com/repronet/repronet/internal/debimage"
	"github.com/repronet/repronet/internal/fixtures"
)

func TestRuntimeImageSpec(t *testing.T) {
	s := reproenv.RuntimeImageSpec()
	for _, p := range []string{"python3", "r-base-core", "python3-numpy", "python3-pandas"} {
		if !slices.Contains(s.Packages, p) {
			t.Errorf("the default environment lacks %s: %v", p, s.Packages)
		}
	}
	if len(s.Config.Entrypoint) != 0 || s.Ref != reproenv.RuntimeImageRef || s.Config.WorkingDir != "/code" {
		t.Errorf("spec %+v", s)
	}
}

// TestRuntimeImageHasPythonAndR builds the default environment from the
// fixtures' root file system (made by go run ./internal/fixtures/prepare,
// as make test does) and finds Python 3, R and numpy in it.
func TestRuntimeImageHasPythonAndR(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	b := fixtures.Builder()
	rootfs, err := b.Rootfs(ctx, reproenv.RuntimePackages)
	if errors.Is(err, debimage.ErrNotCached) {
		t.Fatalf("the default environment's root file system is missing: run go run ./internal/fixtures/prepare (make fixtures): %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"usr/bin/python3", "usr/bin/Rscript", "usr/lib/python3/dist-packages/numpy", "usr/lib/python3/dist-packages/pandas"} {
		if _, err := os.Stat(filepath.Join(rootfs, f)); err != nil {
			t.Errorf("the default environment lacks %s: %v", f, err)
		}
	}
	out := filepath.Join(t.TempDir(), "runtime.tar")
	if err := b.Build(ctx, out, reproenv.RuntimeImageSpec()); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(out); err != nil || st.Size() < 50<<20 {
		t.Errorf("image %s: %v, %v bytes", out, err, st)
	}
}
