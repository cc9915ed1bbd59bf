// Package dist makes repronet's Debian packages (make dist): a static
// repronet binary, and with nfpm (github.com/goreleaser/nfpm, as a
// library) three .deb files from the nfpm configurations beside this file:
// repronet (the binary), repronet-node (the volunteer service: its systemd
// unit, /etc/repronet/node.toml, its dependencies) and
// repronet-coordinator (the coordinator service, user repronet). See
// docs/operator.md and docs/volunteer.md.
//
// It owns this folder's files and what it writes to its output folder; it
// reads the source tree (to build the binary) and touches nothing else.
package dist

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	"github.com/goreleaser/nfpm/v2"
	"github.com/goreleaser/nfpm/v2/deb"
)

// Packages are the packages made, by their nfpm configuration's name.
var Packages = []string{"repronet", "repronet-node", "repronet-coordinator"}

// Options say what to make.
type Options struct {
	// Root is the source tree (holding go.mod, cmd/repronet and dist/).
	Root string
	// Out receives the binary (Out/ARCH/repronet) and the packages.
	Out string
	// Version is the packages' version ("": the binary's, from
	// cmd/repronet/main.go); Arch a Go architecture ("": this machine's).
	Version, Arch string
	// Go is the go command ("": go on PATH).
	Go string
}

// Build builds the binary and the packages and returns the packages' paths,
// in Packages' order.
func Build(ctx context.Context, o Options) ([]string, error) {
	if o.Arch == "" {
		o.Arch = runtime.GOARCH
	}
	if o.Go == "" {
		o.Go = "go"
	}
	if o.Version == "" {
		v, err := sourceVersion(o.Root)
		if err != nil {
			return nil, err
		}
		o.Version = v
	}
	root, err := filepath.Abs(o.Root)
	if err != nil {
		return nil, fmt.Errorf("dist: source tree: %w", err)
	}
	out, err := filepath.Abs(o.Out)
	if err != nil {
		return nil, fmt.Errorf("dist: output folder: %w", err)
	}
	bin := filepath.Join(out, o.Arch, "repronet")
	cmd := exec.CommandContext(ctx, o.Go, "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, "./cmd/repronet")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch)
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("dist: build repronet for %s: %w\n%s", o.Arch, err, b)
	}
	env := map[string]string{"VERSION": o.Version, "ARCH": o.Arch, "BIN": bin, "DIST": filepath.Join(root, "dist")}
	var made []string
	for _, name := range Packages {
		p, err := pack(filepath.Join(root, "dist", name+".yaml"), out, env)
		if err != nil {
			return nil, err
		}
		made = append(made, p)
	}
	return made, nil
}

// pack makes one .deb from an nfpm configuration, in out.
func pack(config, out string, env map[string]string) (path string, err error) {
	cfg, err := nfpm.ParseFileWithEnvMapping(config, func(k string) string { return env[k] })
	if err != nil {
		return "", fmt.Errorf("dist: %s: %w", config, err)
	}
	info, err := cfg.Get("deb")
	if err != nil {
		return "", fmt.Errorf("dist: %s: %w", config, err)
	}
	info = nfpm.WithDefaults(info)
	// Scripts are named relative to dist/ (nfpm expands no variable there).
	for _, p := range []*string{&info.Scripts.PreInstall, &info.Scripts.PostInstall, &info.Scripts.PreRemove, &info.Scripts.PostRemove} {
		if *p != "" && !filepath.IsAbs(*p) {
			*p = filepath.Join(env["DIST"], *p)
		}
	}
	if err := nfpm.PrepareForPackager(info, "deb"); err != nil {
		return "", fmt.Errorf("dist: %s: %w", config, err)
	}
	path = filepath.Join(out, deb.Default.ConventionalFileName(info))
	info.Target = path
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("dist: %w", err)
	}
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("dist: write %s: %w", path, cerr)
		}
		if err != nil {
			os.Remove(path)
		}
	}()
	if err := deb.Default.Package(info, f); err != nil {
		return "", fmt.Errorf("dist: package %s: %w", info.Name, err)
	}
	return path, nil
}

var versionRE = regexp.MustCompile(`(?m)^const version = "([^"]+)"`)

// sourceVersion reads the version the repronet binary reports.
func sourceVersion(root string) (string, error) {
	b, err := os.ReadFile(filepath.Join(root, "cmd", "repronet", "main.go"))
	if err != nil {
		return "", fmt.Errorf("dist: read the version: %w", err)
	}
	m := versionRE.FindSubmatch(b)
	if m == nil {
		return "", errors.New("dist: no `const version = \"...\"` in cmd/repronet/main.go")
	}
	return strings.TrimSpace(string(m[1])), nil
}
