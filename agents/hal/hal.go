// Package hal runs HAL's agents as they are: it builds the image of the
// HAL adapter, a Debian image with Python in which harness.py lays a
// CORE-Bench task out as HAL's harness does, calls the agent's
// run(input, **kwargs) and writes its answers to report.json
// (docs/agents.md, "HAL agents"). Example is a small stdlib-only
// HAL-style agent for the tests.
//
// It owns the adapter's image layout and its harness script; the Debian
// base is package debimage's, the agent contract the node's.
package hal

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/repronet/repronet/internal/debimage"
	"github.com/repronet/repronet/sandbox/ociimage"
)

//go:embed harness.py
var harness []byte

//go:embed example
var example embed.FS

// Where the adapter puts things in the image.
const (
	// HarnessPath is the adapter's script, the image's entry point.
	HarnessPath = "/agent/hal_harness.py"
	// AgentDir holds the HAL agent's folder.
	AgentDir = "/agent/agent"
	// DefaultFunction is HAL's usual --agent_function.
	DefaultFunction = "main.run"
)

// Packages are the adapter image's Debian packages beyond minbase: Python
// and pip (for an agent's requirements.txt).
var Packages = []string{"python3-pip"}

// Harness returns the adapter's script (harness.py).
func Harness() []byte { return append([]byte(nil), harness...) }

// Example is the folder of the example HAL agent (main.py, run()).
func Example() fs.FS {
	sub, err := fs.Sub(example, "example")
	if err != nil {
		panic(err) // cannot happen: the folder is embedded
	}
	return sub
}

// Spec is the adapter image of the HAL agent whose folder is agent:
// HAL's function function ("": DefaultFunction) is called; name names the
// image (repronet.local/agents/hal-NAME:latest).
func Spec(name string, agent fs.FS, function string) (debimage.Spec, error) {
	if function == "" {
		function = DefaultFunction
	}
	mod, fn, ok := strings.Cut(function, ".")
	if !ok || mod == "" || fn == "" || strings.ContainsAny(function, "/ \n") {
		return debimage.Spec{}, fmt.Errorf("hal agent %s: function %q: want MODULE.FUNCTION, as HAL's --agent_function", name, function)
	}
	files := []ociimage.File{
		{Path: "/agent", Mode: 0o755 | fs.ModeDir},
		{Path: HarnessPath, Mode: 0o755, Data: harness},
		{Path: AgentDir, Mode: 0o755 | fs.ModeDir},
	}
	err := fs.WalkDir(agent, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == "." {
			return err
		}
		target := path.Join(AgentDir, p)
		switch {
		case d.IsDir():
			files = append(files, ociimage.File{Path: target, Mode: 0o755 | fs.ModeDir})
		case d.Type().IsRegular():
			data, err := fs.ReadFile(agent, p)
			if err != nil {
				return err
			}
			files = append(files, ociimage.File{Path: target, Mode: 0o644, Data: data})
		default:
			return fmt.Errorf("%s: only files and folders are copied, not %v", p, d.Type())
		}
		return nil
	})
	if err != nil {
		return debimage.Spec{}, fmt.Errorf("hal agent %s: %w", name, err)
	}
	if _, err := fs.Stat(agent, strings.ReplaceAll(mod, ".", "/")+".py"); err != nil {
		return debimage.Spec{}, fmt.Errorf("hal agent %s: function %s: %w", name, function, err)
	}
	return debimage.Spec{
		Ref: "repronet.local/agents/hal-" + name + ":latest", Packages: Packages, Files: files,
		Config: ociimage.Config{
			Entrypoint: []string{"/usr/bin/python3", HarnessPath},
			WorkingDir: "/workspace",
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8", "PYTHONUNBUFFERED=1",
				"HAL_AGENT_DIR=" + AgentDir, "HAL_AGENT_FUNCTION=" + function},
		},
	}, nil
}

// Image writes the adapter image of the HAL agent in folder agent to
// tarball, built by b (the first build makes the Debian base: about 80 s).
func Image(ctx context.Context, b debimage.Builder, tarball, name string, agent fs.FS, function string) error {
	spec, err := Spec(name, agent, function)
	if err != nil {
		return err
	}
	return b.Build(ctx, tarball, spec)
}

// ImageFromDir is Image for an agent folder on disk.
func ImageFromDir(ctx context.Context, b debimage.Builder, tarball, name, dir, function string) error {
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		return fmt.Errorf("hal agent %s: %s is not a folder", name, dir)
	}
	return Image(ctx, b, tarball, name, os.DirFS(dir), function)
}
