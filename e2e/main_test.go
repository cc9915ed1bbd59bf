package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/internal/agentimage"
)

// repronetBin is the repronet binary built for the tests that run nodes
// and coordinators as processes, agentBin the reference agent ("" when
// the build failed: buildErr says why). baseImage is the tarball of the
// base image the sample capsules' environments build FROM, which every
// test's nodes are given (node.Config.BaseImages, --base-image): they
// never reach a registry.
var (
	repronetBin, agentBin, baseImage string
	buildErr                         error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "repronet-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	repronetBin, buildErr = buildBinary(dir, "repronet")
	if buildErr == nil {
		agentBin, buildErr = buildBinary(dir, "repronet-agent")
	}
	if buildErr == nil {
		baseImage = filepath.Join(dir, "sample-base.oci.tar")
		buildErr = agentimage.WriteBase(baseImage, sample.BaseImage, agentimage.BusyboxPath)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinary builds ./cmd/<name> into dir with the go tool running the tests.
func buildBinary(dir, name string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(dir, name)
	cmd := exec.Command(goTool, "build", "-o", bin, "github.com/repronet/repronet/cmd/"+name)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/%s: %w\n%s", name, err, out)
	}
	return bin, nil
}

// binary returns the built repronet binary or fails the test.
func binary(t *testing.T) string {
	t.Helper()
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return repronetBin
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: network namespaces, containerd")
	}
}
