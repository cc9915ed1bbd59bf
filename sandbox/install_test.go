package sandbox

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// installScript installs from the test repositories as root: the Debian
// packages debs with apt-get (downloading first, then installing), the
// Python projects wheels with pip, each through the proxy the sandbox
// points them at; then runs check. It writes "phase <name> <unix time>"
// lines to stderr.
func installScript(port uint16, debs, wheels []string, check string) string {
	var b strings.Builder
	phase := func(name string) { fmt.Fprintf(&b, "echo \"phase %s $(date +%%s.%%N)\" >&2\n", name) }
	fmt.Fprintf(&b, "set -e\nrm -f /etc/apt/sources.list.d/*\n")
	phase("start")
	fmt.Fprintf(&b, "echo 'deb [trusted=yes] http://deb.test:%d/debian test main' > /etc/apt/sources.list\n", port)
	if len(debs) > 0 {
		fmt.Fprintf(&b, "apt-get update -q -o Acquire::Retries=0 >/dev/null\n")
		phase("apt-update")
		fmt.Fprintf(&b, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends --download-only %s >/dev/null\n", strings.Join(debs, " "))
		phase("apt-download")
		fmt.Fprintf(&b, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends %s >/dev/null\n", strings.Join(debs, " "))
		phase("apt-install")
	}
	if len(wheels) > 0 {
		fmt.Fprintf(&b, "python3 -m pip install -q --no-cache-dir --disable-pip-version-check --break-system-packages "+
			"--index-url http://pypi.test:%[1]d/simple/ --trusted-host pypi.test:%[1]d %[2]s\n", port, strings.Join(wheels, " "))
		phase("pip")
	}
	b.WriteString(check)
	return b.String()
}

// TestInstallThroughProxy installs, as root in a user namespace of a
// Debian image, a package from a Debian-style repository with apt-get and
// a wheel from a PyPI-style simple index with pip, through the egress
// proxy (proxy network mode; the repositories are reachable only through
// it), twice: the second attempt gets both files from the node's package
// cache, verified against the Packages and simple-index hashes, and the
// mirror sees each file requested once.
func TestInstallThroughProxy(t *testing.T) {
	image := debianImage(t)
	repo := t.TempDir()
	deb := makeDeb(t, t.TempDir(), "repronet-hello", "1.0", map[string]string{"usr/bin/repronet-hello": "#!/bin/sh\necho hello from deb\n"})
	writeDebRepo(t, repo, []string{deb}, nil)
	whlName, whl := makeWheel(t, "hello-repronet", "1.0", "hello_repronet", map[string][]byte{"__init__.py": []byte("GREETING = 'hello from wheel'\n")})
	writeSimpleIndex(t, repo, map[string]map[string][]byte{"hello-repronet": {whlName: whl}})
	m := serveMirror(t, repo, 0, 0)
	proxy, cache := packageProxy(t, filepath.Join(t.TempDir(), "cache"), m.port)

	script := installScript(m.port, []string{"repronet-hello"}, []string{"hello-repronet"},
		"repronet-hello\npython3 -c 'import hello_repronet; print(hello_repronet.GREETING)'\nid -u\n")
	for i := range 2 {
		ws := newRootWorkspace(t, fmt.Sprintf("%s-%d", t.Name(), i), 512<<20)
		start := time.Now()
		res, err := testRunner.Run(context.Background(), Spec{ID: fmt.Sprintf("%s-%d", t.Name(), i), Image: image,
			Args: []string{"/bin/sh", "-c", script}, UserNamespace: true, Workspace: ws, Proxy: proxy,
			Network: Network{Mode: NetworkProxy, Hosts: []string{"deb.test", "pypi.test"}},
			Limits:  Limits{Wall: 5 * time.Minute, MemoryBytes: 1 << 30}})
		if err != nil || res.Outcome != OutcomeOK {
			t.Fatalf("attempt %d: %v %s (%s)\nstdout %s\nstderr %s", i, err, res.Outcome, res.Detail, res.Stdout, res.Stderr)
		}
		if got, want := string(res.Stdout), "hello from deb\nhello from wheel\n0\n"; got != want {
			t.Fatalf("attempt %d: stdout %q, want %q (stderr %q)", i, got, want, res.Stderr)
		}
		if res.EgressRefused != 0 {
			t.Fatalf("attempt %d: the proxy refused %d requests", i, res.EgressRefused)
		}
		t.Logf("attempt %d: %v (cache %+v)", i, time.Since(start), cache.Stats())
	}
	// apt fetches Packages.gz by hash (the mirror says Acquire-By-Hash):
	// the second apt-get update gets it from the cache too.
	if d, w, i := m.count(".deb"), m.count(".whl"), m.countIn("/by-hash/SHA256/"); d != 1 || w != 1 || i != 1 || m.count("/Packages.gz") != 0 {
		t.Fatalf("the mirror served the .deb %d times, the wheel %d times, the index by hash %d times and by name %d; want once each, by hash",
			d, w, i, m.count("/Packages.gz"))
	}
	if st := cache.Stats(); st.Stored != 3 || st.Verified != 3 || st.Hits != 3 || st.Mismatches != 0 {
		t.Fatalf("cache %+v; want 3 stored and verified (the index by hash, the .deb, the wheel), 3 hits", st)
	}
}
