package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/repronet/repronet/internal/registry"
	"github.com/repronet/repronet/sandbox/egress"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// TestBuildEnvironment builds a capsule's environment/Dockerfile the
// Medium way — the node builds the image in the sandbox, then runs the
// capsule in it: the Dockerfile installs a Debian package and a wheel
// through the egress proxy, deletes a file of the base image, changes an
// owner, sets ENV and WORKDIR and copies the capsule's own tool from the
// build context. The capsule's code (the oracle's run) works in the built
// image and not in the base image; the image's files are root's (owners
// mapped back), the deletion is a whiteout, the build's mount points are
// not in it; a second build is a cache hit; a failing build is an error.
func TestBuildEnvironment(t *testing.T) {
	base := debianImage(t)
	repo := t.TempDir()
	deb := makeDeb(t, t.TempDir(), "repronet-hello", "1.0", map[string]string{"usr/bin/repronet-hello": "#!/bin/sh\necho hello from deb\n"})
	writeDebRepo(t, repo, []string{deb}, nil)
	whlName, whl := makeWheel(t, "hello-repronet", "1.0", "hello_repronet", map[string][]byte{"__init__.py": []byte("GREETING = 'hello from wheel'\n")})
	writeSimpleIndex(t, repo, map[string]map[string][]byte{"hello-repronet": {whlName: whl}})
	m := serveMirror(t, repo, 0, 0)
	proxy, _ := packageProxy(t, filepath.Join(t.TempDir(), "cache"), m.port)

	env := t.TempDir()
	dockerfile := `# a capsule's environment
FROM ` + base + `
ARG PORT
ENV TOOL_HOME=/opt/tool PATH=/opt/tool/bin:$PATH
RUN echo "deb [trusted=yes] http://deb.test:${PORT}/debian test main" > /etc/apt/sources.list \
    && apt-get update -q && apt-get install -y -q repronet-hello && rm -rf /var/lib/apt/lists/*
RUN python3 -m pip install -q --no-cache-dir --disable-pip-version-check --break-system-packages \
    --index-url http://pypi.test:${PORT}/simple/ --trusted-host pypi.test:${PORT} hello-repronet
RUN rm /etc/debian_version && chown 42:43 /opt
WORKDIR /opt/tool
COPY bin/ bin/
CMD ["/bin/sh"]
`
	if err := os.WriteFile(filepath.Join(env, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(env, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	tool := "#!/bin/sh\necho \"$(repronet-hello) / $(python3 -c 'import hello_repronet; print(hello_repronet.GREETING)')\"\n"
	if err := os.WriteFile(filepath.Join(env, "bin", "tool-answer"), []byte(tool), 0o755); err != nil {
		t.Fatal(err)
	}
	spec := BuildSpec{ID: t.Name(), Dockerfile: filepath.Join(env, "Dockerfile"), Context: env,
		BuildArgs: map[string]string{"PORT": fmt.Sprint(m.port)}, Proxy: proxy,
		Network: Network{Mode: NetworkProxy, Hosts: []string{"deb.test", "pypi.test"}},
		Limits:  Limits{Wall: 5 * time.Minute, DiskBytes: 1 << 30}}
	start := time.Now()
	built, err := testRunner.BuildEnvironment(context.Background(), spec)
	if err != nil {
		t.Fatalf("%v\nstdout %s\nstderr %s", err, built.Run.Stdout, built.Run.Stderr)
	}
	took := time.Since(start)
	t.Cleanup(func() {
		if err := testRunner.client.ImageService().Delete(testRunner.nsCtx(context.Background()), built.Image); err != nil {
			t.Errorf("remove the built image: %v", err)
		}
	})
	if built.Cached || built.Layer == 0 || !strings.HasPrefix(built.Key, "env-") {
		t.Fatalf("built %+v", built)
	}

	// The capsule's run (what the oracle does at Medium): no network, the
	// agent user, the built image.
	capsule := `tool-answer; stat -c '%u:%g' /opt /usr/bin/repronet-hello /opt/tool/bin/tool-answer; ` +
		`test -e /etc/debian_version || echo whiteout-ok; test -e /.repronet-context || echo no-context; ` +
		`test -e /etc/apt/apt.conf.d/80repronet || echo no-apt-conf; pwd; echo $TOOL_HOME`
	res, err := testRunner.Run(context.Background(), Spec{ID: t.Name() + "-capsule", Image: built.Image, Args: sh(capsule)})
	if err != nil || res.Outcome != OutcomeOK {
		t.Fatalf("capsule in the built image: %v %s %q", err, res.Outcome, res.Stderr)
	}
	want := "hello from deb / hello from wheel\n42:43\n0:0\n0:0\nwhiteout-ok\nno-context\nno-apt-conf\n/opt/tool\n/opt/tool\n"
	if got := string(res.Stdout); got != want {
		t.Fatalf("capsule in the built image: %q, want %q (stderr %q)", got, want, res.Stderr)
	}
	res, err = testRunner.Run(context.Background(), Spec{ID: t.Name() + "-base", Image: base, Args: sh(`repronet-hello`)})
	if err != nil || res.Outcome != OutcomeAgentError {
		t.Fatalf("the base image runs the capsule's tool: %v %s", err, res.Outcome)
	}

	// The Medium attempt: root in a user namespace in the environment's
	// image, the agent's own image (here the busybox one) read-only at
	// /agent; the oracle agent runs the capsule's tool and reports.
	ws := newRootWorkspace(t, t.Name()+"-oracle", 64<<20)
	oracle := `answer=$(tool-answer); printf '{"answer": "%s"}\n' "$answer" > /workspace/report.json; ` +
		`/agent/bin/busybox touch /agent/x 2>/dev/null && echo agent-writable || echo agent-read-only`
	res, err = testRunner.Run(context.Background(), Spec{ID: t.Name() + "-oracle", Image: built.Image, UserNamespace: true,
		Workspace: ws, Mounts: []Mount{{Source: ws.Dir(), Target: "/workspace"}},
		ImageMounts: []ImageMount{{Image: testImage, Target: "/agent"}},
		Entrypoint:  []string{"/agent/bin/busybox", "sh", "-c"}, Args: []string{oracle}})
	if err != nil || res.Outcome != OutcomeOK || string(res.Stdout) != "agent-read-only\n" {
		t.Fatalf("oracle at Medium: %v %s %q %q", err, res.Outcome, res.Stdout, res.Stderr)
	}
	if report, err := os.ReadFile(filepath.Join(ws.Dir(), "report.json")); err != nil ||
		string(report) != `{"answer": "hello from deb / hello from wheel"}`+"\n" {
		t.Fatalf("report %q, %v", report, err)
	}
	if err := ws.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	// And the other way round: a two-layer image (the environment) as an
	// image mount, through a read-only overlay of its idmapped layers.
	res, err = testRunner.Run(context.Background(), Spec{ID: t.Name() + "-env-mount", Image: testImage, UserNamespace: true,
		ImageMounts: []ImageMount{{Image: built.Image, Target: "/env"}},
		Args:        sh(`cat /env/usr/bin/repronet-hello | tail -n1; stat -c '%u' /env/usr/bin/repronet-hello; touch /env/x 2>/dev/null || echo read-only`)})
	if err != nil || string(res.Stdout) != "echo hello from deb\n0\nread-only\n" {
		t.Fatalf("environment as an image mount: %v %s %q %q", err, res.Outcome, res.Stdout, res.Stderr)
	}

	// The same environment again: a lookup.
	start = time.Now()
	again, err := testRunner.BuildEnvironment(context.Background(), spec)
	if err != nil || !again.Cached || again.Image != built.Image {
		t.Fatalf("second build: %+v %v", again, err)
	}
	t.Logf("build %v (layer %d bytes), cached lookup %v", took, built.Layer, time.Since(start))

	// A failing step is an error, with the build's result.
	if err := os.WriteFile(filepath.Join(env, "Dockerfile"), []byte("FROM "+base+"\nRUN echo broken >&2; exit 3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec.ID = t.Name() + "-broken"
	broken, err := testRunner.BuildEnvironment(context.Background(), spec)
	if err == nil || broken.Image != "" || broken.Run.Outcome != OutcomeAgentError || string(broken.Run.Stderr) != "broken\n" {
		t.Fatalf("failing build: %+v %v", broken, err)
	}
	waitNoLeftovers(t, testRunner)
}

// TestPullImage pulls an image (the busybox test image) from a registry
// served on 127.0.0.2 as registry.test, through an egress proxy session on
// loopback that allows that registry alone, as a node pulls a
// Dockerfile's FROM; a registry off the list is refused.
func TestPullImage(t *testing.T) {
	files, err := ociimage.BusyboxFiles(busyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	var layout bytes.Buffer
	if _, err := ociimage.Build(&layout, "repronet.local/test/pulled:1", files, ociimage.Config{Cmd: []string{"/bin/sh"}, Env: []string{"PATH=/bin"}}); err != nil {
		t.Fatal(err)
	}
	served, err := registry.New(layout.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int64
	reg := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		served.ServeHTTP(w, r)
	})
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: reg}
	go srv.Serve(ln)
	defer srv.Close()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)
	registry := []netip.Addr{netip.MustParseAddr("127.0.0.2")}
	proxy, err := egress.New(egress.Config{Permit: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}, Ports: []uint16{port},
		Resolver: mapResolver{"registry.test": registry, "other.test": registry}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	pln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	session, err := proxy.Start("node-pulls", pln, netip.MustParseAddr("127.0.0.1"), []string{"registry.test"})
	if err != nil {
		t.Fatal(err)
	}
	defer session.Close()
	proxyURL, _ := url.Parse("http://" + pln.Addr().String())
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(proxyURL)}}

	name, err := testRunner.PullImage(context.Background(), fmt.Sprintf("registry.test:%d/test/pulled:1", port), PullOptions{Client: hc, PlainHTTP: true})
	if err != nil {
		t.Fatal(err)
	}
	defer testRunner.client.ImageService().Delete(testRunner.nsCtx(context.Background()), name)
	res, err := testRunner.Run(context.Background(), Spec{ID: t.Name(), Image: name, Args: sh(`echo pulled`)})
	if err != nil || string(res.Stdout) != "pulled\n" {
		t.Fatalf("run the pulled image: %v %s %q", err, res.Outcome, res.Stdout)
	}
	before := hits.Load()
	if _, err := testRunner.PullImage(context.Background(), fmt.Sprintf("other.test:%d/test/pulled:1", port), PullOptions{Client: hc, PlainHTTP: true}); err == nil {
		t.Fatal("pulled from a registry off the list")
	}
	if hits.Load() != before || session.Refused() == 0 {
		t.Fatalf("the registry off the list was reached (%d requests) or not refused (%d)", hits.Load()-before, session.Refused())
	}

	// Through a mirror: a Docker Hub name, pulled from registry.test
	// (Docker Hub itself is off the session's list, and is never asked).
	refused := session.Refused()
	mirrored, err := testRunner.PullImage(context.Background(), "docker.io/test/pulled:1",
		PullOptions{Client: hc, Mirrors: map[string][]string{"docker.io": {fmt.Sprintf("http://registry.test:%d", port)}}})
	if err != nil {
		t.Fatal(err)
	}
	defer testRunner.client.ImageService().Delete(testRunner.nsCtx(context.Background()), mirrored)
	if mirrored != "docker.io/test/pulled:1" || hits.Load() == before || session.Refused() != refused {
		t.Fatalf("pull through a mirror: %s, %d requests to the mirror, %d refusals", mirrored, hits.Load()-before, session.Refused()-refused)
	}
	for _, bad := range []string{"docker.io", "docker.io=ftp://m", "docker.io=http://m/path", "=http://m", "docker.io=http://u:p@m"} {
		if _, _, err := ParseMirror(bad); err == nil {
			t.Errorf("ParseMirror(%q) accepted", bad)
		}
	}
}
