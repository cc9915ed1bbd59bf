package node

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/bench/repro"
	"github.com/repronet/repronet/internal/agentimage"
	"github.com/repronet/repronet/internal/registry"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/sandbox/egress"
)

// mapResolver resolves the names of a test's own servers.
type mapResolver map[string][]netip.Addr

func (m mapResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := m[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestExecuteEnvironment runs CORE-Bench Medium the node's way, on the
// real sandbox: the sample capsule whose analysis needs a tool its
// environment/Dockerfile installs (capsule-0000004), the recipe the
// CORE-Bench family makes at Medium, the sample oracle agent. The node
// pulls the Dockerfile's FROM (docker.io/library/busybox:1.36) through its
// registry proxy from a mirror served on 127.0.0.2 (Docker Hub itself is
// never asked), builds the environment, runs the oracle in it with its own
// image at /agent: every answer is right. The same recipe without the
// environment (the oracle in its own image) fails: the tool is missing.
// Again with it, the environment is found built and nothing is pulled.
// Then: a Dockerfile whose FROM names a registry the node does not allow
// is refused by its proxy; a failing RUN step and a build past the wall
// limit are infrastructure errors naming why; an if_present environment
// without a Dockerfile runs in the job's own image. A reproducibility
// check's run of the capsule runs its own script in the environment.
// Nothing is left in the sandbox's state folder.
func TestExecuteEnvironment(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	runner, state := realSandbox(t, ctx, log)
	// Start and end without the images of earlier runs: the base image
	// must be pulled, the environment built.
	pruneAll := func(ctx context.Context) {
		d, err := sandbox.EnsureDaemon(ctx, sandbox.DefaultDaemonDir, log)
		if err != nil {
			t.Fatal(err)
		}
		r, err := sandbox.New(ctx, d.Socket, sandbox.WithNamespace("repronet-node-test"), sandbox.WithStateDir(t.TempDir()),
			sandbox.WithImageCacheBytes(1), sandbox.WithLogger(log))
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		if _, err := r.PruneImages(ctx); err != nil {
			t.Fatal(err)
		}
	}
	pruneAll(ctx)
	t.Cleanup(func() { pruneAll(context.Background()) })

	base, err := agentimage.Base(sample.BaseImage, "/bin/busybox")
	if err != nil {
		t.Fatal(err)
	}
	served, err := registry.New(base)
	if err != nil {
		t.Fatal(err)
	}
	var pulls atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		pulls.Add(1)
		served.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	mirror := fmt.Sprintf("http://registry.test:%d", port)
	local := []netip.Addr{netip.MustParseAddr("127.0.0.2")}

	n, coords := newTestNode(t, 1, func(c *Config) {
		c.Sandbox, c.Logger = runner, log
		c.Egress = egress.Config{Resolver: mapResolver{"registry.test": local, "other.test": local},
			Permit: []netip.Prefix{netip.MustParsePrefix("127.0.0.2/32")}}
		c.Registries = []string{} // the mirror alone
		c.RegistryMirrors = map[string][]string{"docker.io": {mirror}}
	})

	files, err := sample.AgentFiles("oracle")
	if err != nil {
		t.Fatal(err)
	}
	oracle, err := agentimage.Build("oracle", "/bin/busybox", files)
	if err != nil {
		t.Fatal(err)
	}
	agent := addToStore(t, ctx, n, oracle)
	const id = "capsule-0000004"
	tb, err := sample.CapsuleTarball(id)
	if err != nil {
		t.Fatal(err)
	}
	capsule := addToStore(t, ctx, n, tb)
	def, err := family.Def("sample-medium", sample.MediumTasks(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	suite, err := family.New().Open(def)
	if err != nil {
		t.Fatal(err)
	}
	var task bench.Task
	for _, tk := range suite.Tasks() {
		if tk.ID == id {
			task = tk
		}
	}
	medium := func() *proto.Recipe {
		r, err := suite.Recipe(bench.RecipeInput{Task: task, Variant: "medium", Stage: family.Stage, Image: agent,
			Content: map[string]cid.Cid{id: capsule},
			Limits:  &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, Pids: 256, WallSeconds: 60, OutputBytes: 64 << 10}})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	run := func(t *testing.T, name string, r *proto.Recipe) (*proto.Report, error) {
		t.Helper()
		a := &proto.Assignment{AttemptId: "env-" + name, Recipe: r}
		p, code, reason := n.plan(r)
		if code != proto.DeclineCode_DECLINE_UNSPECIFIED {
			t.Fatalf("plan: %s %s", code, reason)
		}
		var ph phase
		res, err := n.execute(ctx, coords[0], a, p, &ph, log)
		if left, _ := os.ReadDir(state); len(left) != 0 {
			t.Fatalf("the sandbox's state folder still holds %v", left)
		}
		if err != nil {
			return nil, err
		}
		rep := &proto.Report{}
		fillReport(rep, res)
		return rep, nil
	}
	score := func(t *testing.T, rep *proto.Report) bench.Score {
		t.Helper()
		sc, err := suite.Score(ctx, bench.ScoreInput{Task: task, Variant: "medium", Stage: family.Stage, Outcome: "ok",
			Output: func(ctx context.Context, path string) ([]byte, error) {
				for _, o := range rep.GetOutputs() {
					if o.GetPath() == path && o.GetError() == "" {
						c, _ := cid.Cast(o.GetCid())
						rc, err := n.store.Open(ctx, c)
						if err != nil {
							return nil, err
						}
						defer rc.Close()
						return io.ReadAll(rc)
					}
				}
				return nil, fmt.Errorf("%s: %w", path, bench.ErrNotReturned)
			}})
		if err != nil {
			t.Fatal(err)
		}
		return sc
	}

	t.Run("oracle in the environment", func(t *testing.T) {
		start := time.Now()
		rep, err := run(t, "oracle", medium())
		t.Logf("a job in an environment pulled and built now: %v", time.Since(start))
		if err != nil {
			t.Fatalf("execute: %v", err)
		}
		if rep.GetOutcome() != proto.Outcome_OUTCOME_OK || score(t, rep).Value != 1 {
			t.Fatalf("outcome %s, score %s; stdout:\n%s\nstderr:\n%s", rep.GetOutcome(), score(t, rep).Verdict, rep.GetStdoutTail(), rep.GetStderrTail())
		}
		if out := string(rep.GetStdoutTail()); !strings.Contains(out, "running /code/run") || !strings.Contains(out, "uid 0") {
			t.Errorf("the oracle did not regenerate the results as root:\n%s", out)
		}
		if pulls.Load() == 0 {
			t.Error("the base image was not pulled from the mirror")
		}
	})
	t.Run("oracle without the environment", func(t *testing.T) {
		r := medium()
		r.Environment = nil
		rep, err := run(t, "no-env", r)
		if err != nil {
			t.Fatalf("execute: %v", err)
		}
		if rep.GetOutcome() == proto.Outcome_OUTCOME_OK || score(t, rep).Value != 0 ||
			!strings.Contains(string(rep.GetStderrTail()), "robust-stats is not installed") {
			t.Fatalf("outcome %s, score %v; stderr:\n%s", rep.GetOutcome(), score(t, rep).Value, rep.GetStderrTail())
		}
	})
	t.Run("the environment again: built already", func(t *testing.T) {
		before := pulls.Load()
		start := time.Now()
		rep, err := run(t, "again", medium())
		if err != nil || rep.GetOutcome() != proto.Outcome_OUTCOME_OK || score(t, rep).Value != 1 {
			t.Fatalf("%v %s", err, rep.GetOutcome())
		}
		if pulls.Load() != before {
			t.Errorf("the registry was asked %d more times", pulls.Load()-before)
		}
		t.Logf("a job in an environment built already: %v", time.Since(start))
	})

	t.Run("a reproducibility check's run in the capsule's environment", func(t *testing.T) {
		// A draft check of capsule-0000004 (its code needs its
		// environment): the capsule's own run script runs in the built
		// environment, nothing of the job image shown; results/ returned.
		check, err := repro.Checker{}.Parse([]byte(`{"capsule": {"capsule_id": "` + id + `"}, "runs": 2}`))
		if err != nil {
			t.Fatal(err)
		}
		r, err := repro.Checker{}.Recipe(check, capsule, agent,
			&proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, Pids: 256, WallSeconds: 60, OutputBytes: 64 << 10})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := run(t, "capsule-run", r)
		if err != nil || rep.GetOutcome() != proto.Outcome_OUTCOME_OK || len(rep.GetOutputs()) != 1 || rep.GetOutputs()[0].GetError() != "" {
			t.Fatalf("%v %s %v\n%s", err, rep.GetOutcome(), rep.GetOutputs(), rep.GetStderrTail())
		}
		c, _ := cid.Cast(rep.GetOutputs()[0].GetCid())
		rc, err := n.store.Open(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		tb, _ := io.ReadAll(rc)
		rc.Close()
		files, err := bench.FolderFiles("results", tb, 1<<20)
		if err != nil || !strings.Contains(string(files["results/summary.txt"]), "median_upstream 42.5") {
			t.Fatalf("results %v: %q", err, files)
		}
	})

	dockerfile := func(df string, wall uint32) *proto.Recipe {
		r := medium()
		r.Edits = append(r.Edits, &proto.Edit{Op: &proto.Edit_Remove{Remove: id + "/environment/Dockerfile"}})
		if df != "" {
			r.Edits = append(r.Edits, &proto.Edit{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: id + "/environment/Dockerfile", Content: []byte(df)}}})
		}
		if wall > 0 {
			r.Limits.WallSeconds = wall
		}
		return r
	}
	for _, tt := range []struct {
		name, dockerfile string
		wall             uint32
		want             string
		refused          bool
	}{
		{"a registry the node does not allow", fmt.Sprintf("FROM other.test:%d/library/busybox:1.36\n", port), 0, "the registry proxy refused", true},
		{"a failing step", "FROM " + sample.BaseImage + "\nRUN echo broken step >&2; exit 3\n", 0, "broken step", false},
		{"a build past the wall limit", "FROM " + sample.BaseImage + "\nRUN sleep 30\n", 3, "timeout", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := pulls.Load()
			_, err := run(t, strings.ReplaceAll(tt.name, " ", "-"), dockerfile(tt.dockerfile, tt.wall))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("execute: %v, want an infrastructure error saying %q", err, tt.want)
			}
			t.Logf("%v", err)
			if tt.refused && pulls.Load() != before {
				t.Errorf("the registry was asked %d times", pulls.Load()-before)
			}
		})
	}
	t.Run("no Dockerfile, if present", func(t *testing.T) {
		rep, err := run(t, "absent", dockerfile("", 0))
		if err != nil {
			t.Fatalf("execute: %v", err)
		}
		// The oracle's own image: the tool is missing, as without an
		// environment.
		if !strings.Contains(string(rep.GetStderrTail()), "robust-stats is not installed") {
			t.Fatalf("outcome %s; stderr:\n%s", rep.GetOutcome(), rep.GetStderrTail())
		}
	})
}
