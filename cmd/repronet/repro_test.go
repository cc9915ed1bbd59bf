package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/repronet/repronet/bench/repro"
)

const testSpec = `{
 "capsule": {"field": "F", "language": "Python", "capsule_title": "T", "capsule_id": "capsule-0000007", "capsule_doi": "d", "task_prompt": "Run main.py."},
 "rules": [
  {"question": "Report the AUC.", "file": "results/metrics.json", "kind": "json", "expr": "/auc", "type": "number"},
  {"question": "Report the model.", "file": "results/log.txt", "kind": "regex", "expr": "model: (\\w+)"}
 ]
}`

func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func capsuleTarball(t *testing.T, files map[string]string) string {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for name, content := range files {
		tw.WriteHeader(&tar.Header{Name: "capsule-0000007/" + name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg})
		tw.Write([]byte(content))
	}
	tw.Close()
	gz.Close()
	p := filepath.Join(t.TempDir(), "capsule-0000007.tar.gz")
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestReproCheckCommand(t *testing.T) {
	dir := t.TempDir()
	spec := filepath.Join(dir, "spec.json")
	os.WriteFile(spec, []byte(testSpec), 0o644)
	var runs []string
	for i, auc := range []string{"0.9375", "0.9372", "0.9319"} {
		run := filepath.Join(dir, "run"+string(rune('1'+i)))
		writeFiles(t, run, map[string]string{"results/metrics.json": `{"auc": ` + auc + `}`, "results/log.txt": "model: LASSO\n"})
		runs = append(runs, run)
	}
	tarball := capsuleTarball(t, map[string]string{"results/metrics.json": `{"auc": 0.99}`, "results/log.txt": "model: LASSO", "code/run": "python main.py"})
	var out, errOut bytes.Buffer
	args := append([]string{"check", "--spec", spec, "--claimed", tarball}, runs...)
	if err := runRepro(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	for _, want := range []string{"capsule-0000007: 3 successful runs", "NOT reproduced  Report the AUC.", "reproduced      Report the model.",
		"95% prediction interval", "submitted answer 0.99", "does not fully reproduce: 1 of 2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	out.Reset()
	args = append([]string{"check", "--json", "--spec", spec, "--claimed", runs[0]}, runs...)
	if err := runRepro(context.Background(), args, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	var rep repro.Report
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || !rep.Reproducible || len(rep.Task.Results) != 3 {
		t.Errorf("--json: %v %+v", err, rep)
	}
	for _, bad := range [][]string{{"check", "--spec", spec, runs[0]}, {"check", runs[0], runs[1]}, {"nope"}, {}} {
		if err := runRepro(context.Background(), bad, &out, &errOut); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// TestReproCheckDraft: `repro check --capsule-id` without a spec drafts
// the entry from every file of the runs' results/ (a link out of it is
// not followed); a draft spec is made from a tarball's top folder and
// metadata name.
func TestReproCheckDraft(t *testing.T) {
	dir := t.TempDir()
	var runs []string
	for i, est := range []string{"3.1248", "3.1348", "3.1578"} {
		run := filepath.Join(dir, "run"+string(rune('1'+i)))
		writeFiles(t, run, map[string]string{"results/summary.txt": "n 8\nestimate " + est + "\nat 2026-11-24T09:31:1" + string(rune('5'+i)) + "Z\n",
			"results/sub/m.json": `{"k": 2}`, "code/other.txt": "x 1\n"})
		if err := os.Symlink("/etc/passwd", filepath.Join(run, "results", "link.txt")); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, run)
	}
	var out, errOut bytes.Buffer
	if err := runRepro(context.Background(), append([]string{"check", "--capsule-id", "capsule-0000009"}, runs...), &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	for _, want := range []string{"kept     stable    Report `n` on line 1 of results/summary.txt.", "kept     interval  Report `estimate`",
		"FLAGGED  timestamp Report `at`", "kept     stable    Report `/k` in results/sub/m.json.", "3 values kept, 1 flagged"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	if strings.Contains(out.String(), "other.txt") || strings.Contains(out.String(), "link.txt") {
		t.Errorf("read outside results/ or through a link:\n%s", out.String())
	}
	for _, bad := range [][]string{{"check", "--capsule-id", "../x", runs[0], runs[1]}, {"check", "--capsule-id", "capsule-0000009", "--spec", "s.json", runs[0], runs[1]}} {
		if err := runRepro(context.Background(), bad, &out, &errOut); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	tarball := capsuleTarball(t, map[string]string{"metadata/metadata.yml": "metadata_version: 1\nname: Rain at one station\n", "code/run": "sh x"})
	spec, err := draftSpec(tarball, 0)
	if err != nil || spec.Capsule.CapsuleID != "capsule-0000007" || spec.Capsule.CapsuleTitle != "Rain at one station" ||
		spec.Runs != repro.DefaultRuns || !spec.Draft() {
		t.Fatalf("draft spec %+v: %v", spec, err)
	}
}

func TestReproSubmitAndStatus(t *testing.T) {
	var gotSpec repro.Spec
	var gotCapsule []byte
	var gotAuth string
	polls := 0
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+reproPath, func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		_, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		mr := multipart.NewReader(r.Body, params["boundary"])
		for {
			p, err := mr.NextPart()
			if err == io.EOF {
				break
			}
			if err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			b, _ := io.ReadAll(p)
			switch p.FormName() {
			case "spec":
				json.Unmarshal(b, &gotSpec)
			case "capsule":
				gotCapsule = b
			}
		}
		json.NewEncoder(w).Encode(map[string]string{"id": "rp-1"})
	})
	mux.HandleFunc("GET "+reproStatusPath+"{id}", func(w http.ResponseWriter, r *http.Request) {
		polls++
		st := repro.Status{ID: r.PathValue("id"), State: repro.StateRunning, RunsDone: 1, RunsWanted: 5,
			Waiting: []string{"run: 2 of 2 eligible nodes failed it (n1: environment: build: exit status 100)"}}
		if polls > 1 {
			st.State, st.RunsDone = repro.StateDone, 5
			st.Report = &repro.Report{Runs: 5, NotReproduced: []string{}, Reproducible: true}
		}
		json.NewEncoder(w).Encode(st)
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	dir := t.TempDir()
	spec := filepath.Join(dir, "spec.json")
	os.WriteFile(spec, []byte(testSpec), 0o644)
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("s3cret\n"), 0o600)
	tarball := capsuleTarball(t, map[string]string{"code/run": "python main.py"})
	var out, errOut bytes.Buffer
	if err := runRepro(context.Background(), []string{"submit", tarball, "--spec", spec, "--runs", "5", "--api", srv.URL, "--token-file", token}, &out, &errOut); err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	want, _ := os.ReadFile(tarball)
	if gotSpec.Runs != 5 || gotSpec.Capsule.CapsuleID != "capsule-0000007" || !bytes.Equal(gotCapsule, want) || gotAuth != "Bearer s3cret" {
		t.Errorf("server got spec %+v, %d capsule bytes, auth %q", gotSpec, len(gotCapsule), gotAuth)
	}
	if !strings.Contains(out.String(), "submitted rp-1") {
		t.Error(out.String())
	}
	out.Reset()
	c, _ := newAPIClient(srv.URL, "", 0)
	f, _ := os.Open(tarball)
	defer f.Close()
	if err := reproSubmitWith(context.Background(), c, gotSpec, "c.tar.gz", f, true, false, 0, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "rp-1: done, 5 of 5 runs done") || !strings.Contains(out.String(), "the capsule reproduces") {
		t.Error(out.String())
	}
	// While it waited it said why.
	if !strings.Contains(out.String(), "rp-1: running, 1 of 5 runs done\n  waiting: run: 2 of 2 eligible nodes failed it (n1: environment") {
		t.Errorf("no reason while waiting:\n%s", out.String())
	}
	out.Reset()
	if err := runRepro(context.Background(), []string{"status", "rp-1", "--api", srv.URL, "--json"}, &out, &errOut); err != nil {
		t.Fatal(err)
	}
	var st repro.Status
	if err := json.Unmarshal(out.Bytes(), &st); err != nil || st.ID != "rp-1" {
		t.Errorf("status --json: %v %s", err, out.String())
	}
	if _, err := c.Status(context.Background(), "../x"); err == nil {
		t.Error("malformed ID accepted")
	}
}

// TestReproHonoursSettings: repro status and submit read $REPRONET_API
// and $REPRONET_TOKEN as the other commands do (--api still wins).
func TestReproHonoursSettings(t *testing.T) {
	var gotAuth []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = append(gotAuth, r.Header.Get("Authorization"))
		if r.URL.Path != "/api/repro/rp-1" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"rp-1","state":"running","runs_done":1,"runs_wanted":3,"capsule":{"id":"growth-curves","title":"Growth"},
			"runs":[{"run":1,"attempt":"ah-1","page":"/attempts/ah-1","logs":"/api/attempts/ah-1/logs","state":"done","outcome":"agent_error","failed":true,"exit_code":1}],
			"failed_because":["run 1: agent_error, exit status 1; stderr ends: No module named 'pandas'"]}`))
	}))
	defer srv.Close()
	t.Setenv("REPRONET_API", srv.URL)
	t.Setenv("REPRONET_TOKEN", "rns_from_the_environment")
	var out, errOut bytes.Buffer
	if err := runRepro(context.Background(), []string{"status", "rp-1"}, &out, &errOut); err != nil {
		t.Fatalf("status through $REPRONET_API: %v (%s)", err, errOut.String())
	}
	for _, want := range []string{"running", "capsule growth-curves: Growth", "run 1: done, agent_error, exit status 1  logs: repronet attempt logs ah-1",
		"failed: run 1: agent_error, exit status 1; stderr ends: No module named 'pandas'"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}
	if len(gotAuth) != 1 || gotAuth[0] != "Bearer rns_from_the_environment" {
		t.Errorf("status: %q, authorization %q", out.String(), gotAuth)
	}
	// --api wins over the environment.
	if err := runRepro(context.Background(), []string{"status", "rp-1", "--api", "http://127.0.0.1:1"}, &out, &errOut); err == nil {
		t.Error("--api was not used over $REPRONET_API")
	}
}
