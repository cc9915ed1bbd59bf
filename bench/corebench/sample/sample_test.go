package sample

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/bench/corebench"
)

const busybox = "/bin/busybox"

// parseTasks reads the tasks of both sample suites: the sample suite's
// then the Medium suite's.
func parseTasks(t *testing.T) []corebench.Task {
	t.Helper()
	tasks, err := corebench.ParseTasks(Tasks())
	if err != nil {
		t.Fatalf("ParseTasks(sample tasks.json): %v", err)
	}
	medium, err := corebench.ParseTasks(MediumTasks())
	if err != nil {
		t.Fatalf("ParseTasks(sample tasks-medium.json): %v", err)
	}
	return append(tasks, medium...)
}

// taskCapsuleIDs are the capsules the sample suites' tasks name.
func taskCapsuleIDs() []string { return append(CapsuleIDs(), MediumCapsuleIDs()...) }

// questionRe is how every sample question names its answer.
func questionRe() *regexp.Regexp {
	return regexp.MustCompile("\\(`([A-Za-z0-9_]+)` in results/([A-Za-z0-9_.]+)\\)\\.$")
}

// lookup reads "KEY VALUE" from a results file.
func lookup(results fs.FS, file, key string) (string, bool) {
	data, err := fs.ReadFile(results, file)
	if err != nil {
		return "", false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			return v, true
		}
	}
	return "", false
}

// reportFrom answers every question of task from a results folder, as the
// oracle agent does.
func reportFrom(t *testing.T, task corebench.Task, results fs.FS) []byte {
	t.Helper()
	var b strings.Builder
	b.WriteString("{")
	for i, q := range task.Questions() {
		m := questionRe().FindStringSubmatch(q)
		if m == nil {
			t.Fatalf("%s: question does not name its answer: %q", task.CapsuleID, q)
		}
		v, ok := lookup(results, m[2], m[1])
		if !ok {
			t.Fatalf("%s: no %s in results/%s", task.CapsuleID, m[1], m[2])
		}
		if i > 0 {
			b.WriteString(", ")
		}
		key, _ := corebench.StringValue(q).MarshalJSON()
		b.Write(key)
		b.WriteString(": ")
		b.WriteString(v)
	}
	b.WriteString("}")
	return []byte(b.String())
}

func TestTasks(t *testing.T) {
	tasks := parseTasks(t)
	var ids []string
	kinds := map[string]int{}
	wide := 0
	for _, task := range tasks {
		ids = append(ids, task.CapsuleID)
		if len(task.Results) != 3 {
			t.Errorf("%s: %d gold runs", task.CapsuleID, len(task.Results))
		}
		for _, q := range task.Questions() {
			if strings.Contains(q, "'") || strings.Contains(q, "\\") || !questionRe().MatchString(q) {
				t.Errorf("%s: question %q must name its answer and avoid quotes and backslashes", task.CapsuleID, q)
			}
			v, _ := task.Results[0].Get(q)
			kind := v.Kind.String()
			if v.Kind == corebench.Number && v.Int {
				kind = "int"
			} else if v.Kind == corebench.Number {
				kind = "float"
			}
			if corebench.IsVision(q) {
				kind = "fig " + kind
			}
			kinds[kind]++
			for _, run := range task.Results[1:] {
				if w, _ := run.Get(q); v.Kind == corebench.Number && w.Num != v.Num {
					wide++
					break
				}
			}
		}
		// The published results answer every question.
		sub, err := fs.Sub(capsules, path.Join("capsules", task.CapsuleID, "results"))
		if err != nil {
			t.Fatal(err)
		}
		v, err := corebench.NewOriginal().Grade(task, reportFrom(t, task, sub))
		if err != nil || !v.TaskCorrect {
			t.Errorf("%s: the published results do not answer the task: %v %+v", task.CapsuleID, err, v.Questions)
		}
	}
	if !reflect.DeepEqual(ids, taskCapsuleIDs()) || len(CapsuleIDs()) != 3 || len(MediumCapsuleIDs()) != 1 {
		t.Errorf("tasks %v, capsules %v and %v", ids, CapsuleIDs(), MediumCapsuleIDs())
	}
	for _, id := range ids {
		if !slices.Contains(AllCapsuleIDs(), id) {
			t.Errorf("task %s names no capsule here (%v)", id, AllCapsuleIDs())
		}
	}
	for _, k := range []string{"int", "float", "string", "list", "fig string", "fig float", "fig int"} {
		if kinds[k] == 0 {
			t.Errorf("no %s question in the sample suite (have %v)", k, kinds)
		}
	}
	if wide == 0 {
		t.Error("no numeric question whose gold runs differ")
	}
}

func TestCapsuleTarball(t *testing.T) {
	for _, id := range AllCapsuleIDs() {
		a, err := CapsuleTarball(id)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := CapsuleTarball(id)
		if !bytes.Equal(a, b) {
			t.Errorf("%s: tarball is not deterministic", id)
		}
		zr, err := gzip.NewReader(bytes.NewReader(a))
		if err != nil {
			t.Fatal(err)
		}
		if zr.Name != "" || !zr.ModTime.IsZero() {
			t.Errorf("%s: gzip header %q %v", id, zr.Name, zr.ModTime)
		}
		tr := tar.NewReader(zr)
		var names []string
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			names = append(names, h.Name)
			rel := strings.TrimSuffix(strings.TrimPrefix(h.Name, id+"/"), "/")
			if !strings.HasPrefix(h.Name, id+"/") {
				t.Errorf("%s: entry %q outside the top folder", id, h.Name)
			}
			if h.Uid != 0 || h.Gid != 0 || !h.ModTime.Equal(tarballTime()) || h.Format != tar.FormatUSTAR {
				t.Errorf("%s: %s: uid %d gid %d mtime %v format %v", id, h.Name, h.Uid, h.Gid, h.ModTime, h.Format)
			}
			want := int64(0o644)
			switch {
			case h.Typeflag == tar.TypeDir:
				want = 0o755
			case rel == "code/run" || strings.HasSuffix(rel, ".sh") || strings.HasPrefix(rel, "code/vendor/"):
				want = 0o755
			}
			if h.Mode != want {
				t.Errorf("%s: %s mode %o, want %o", id, h.Name, h.Mode, want)
			}
			if h.Typeflag == tar.TypeReg {
				got, _ := io.ReadAll(tr)
				embedded, err := capsules.ReadFile(path.Join("capsules", id, rel))
				if err != nil || !bytes.Equal(got, embedded) {
					t.Errorf("%s: %s differs from the embedded file (%v)", id, rel, err)
				}
			}
		}
		if !slices.IsSorted(names) || names[0] != id+"/" {
			t.Errorf("%s: entries not sorted under the top folder: %v", id, names)
		}
		for _, need := range []string{"code/", "code/run", "code/README.md", "code/analysis.sh", "data/", "results/",
			"REPRODUCING.md", "environment/Dockerfile", "metadata/metadata.yml"} {
			if !slices.Contains(names, id+"/"+need) {
				t.Errorf("%s: no %s in the tarball", id, need)
			}
		}
	}
	if _, err := CapsuleTarball("capsule-9999999"); err == nil {
		t.Error("unknown capsule accepted")
	}
	if _, err := CapsuleTarball("../capsules"); err == nil {
		t.Error("path accepted as a capsule ID")
	}
}

func TestAgentFiles(t *testing.T) {
	for _, name := range AgentNames() {
		files, err := AgentFiles(name)
		if err != nil {
			t.Fatal(err)
		}
		run, ok := files[AgentEntrypoint]
		if len(files) != 1 || !ok || !bytes.HasPrefix(run, []byte("#!/bin/sh\n")) {
			t.Errorf("%s: files %v", name, files)
		}
	}
	if _, err := AgentFiles("gpt"); err == nil {
		t.Error("unknown agent accepted")
	}
}

// busyboxPath returns a folder of links to every busybox applet, so the
// scripts run with busybox tools only, as in the agents' busybox image.
func busyboxPath(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(busybox); err != nil {
		t.Fatalf("these tests run the sample capsules and agents with busybox, required at %s (Debian: apt-get install busybox-static): %v", busybox, err)
	}
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		t.Fatalf("%s --list: %v", busybox, err)
	}
	dir := t.TempDir()
	for _, applet := range strings.Fields(string(out)) {
		if err := os.Symlink(busybox, filepath.Join(dir, applet)); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// extract unpacks a capsule tarball into dir and returns the capsule folder.
func extract(t *testing.T, id string, dir string) string {
	t.Helper()
	tgz, err := CapsuleTarball(id)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(tgz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if !fs.ValidPath(strings.TrimSuffix(h.Name, "/")) {
			t.Fatalf("unsafe entry %q", h.Name)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, fs.FileMode(h.Mode)); err != nil {
				t.Fatal(err)
			}
		case tar.TypeReg:
			data, _ := io.ReadAll(tr)
			if err := os.WriteFile(p, data, fs.FileMode(h.Mode)); err != nil {
				t.Fatal(err)
			}
		default:
			t.Fatalf("unexpected entry type %v", h.Typeflag)
		}
	}
	return filepath.Join(dir, id)
}

// run runs busybox sh with args in dir, with env and the busybox PATH.
func run(t *testing.T, bin, dir string, env []string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, busybox, append([]string{"sh"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append([]string{"PATH=" + bin, "HOME=" + dir, "LC_ALL=C"}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		rel, _ := filepath.Rel(dir, p)
		files[filepath.ToSlash(rel)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// environmentPath is what a capsule's environment/Dockerfile adds to the
// busybox base on the host: every file of environment/ but the Dockerfile
// is a tool the Dockerfile copies to /usr/local/bin (checked), here put in
// a folder of their own for PATH. "" when the environment adds nothing.
func environmentPath(t *testing.T, capsule string) string {
	t.Helper()
	env := filepath.Join(capsule, "environment")
	df, err := os.ReadFile(filepath.Join(env, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(df), "\nFROM "+BaseImage+"\n") {
		t.Errorf("%s: the Dockerfile is not FROM %s:\n%s", capsule, BaseImage, df)
	}
	entries, err := os.ReadDir(env)
	if err != nil {
		t.Fatal(err)
	}
	dir := ""
	for _, e := range entries {
		if e.Name() == "Dockerfile" {
			continue
		}
		if !strings.Contains(string(df), "\nCOPY "+e.Name()+" /usr/local/bin/"+e.Name()+"\n") {
			t.Fatalf("%s: environment/%s is not installed by the Dockerfile", capsule, e.Name())
		}
		if dir == "" {
			dir = t.TempDir()
		}
		b, err := os.ReadFile(filepath.Join(env, e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, e.Name()), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRunScriptsReproduceResults runs every capsule's code/run in its
// environment (the busybox tools and what its Dockerfile installs) and
// finds the published results; a capsule whose Dockerfile installs tools
// fails without them.
func TestRunScriptsReproduceResults(t *testing.T) {
	bin := busyboxPath(t)
	needy := 0
	for _, id := range taskCapsuleIDs() {
		dir := extract(t, id, t.TempDir())
		published := readTree(t, filepath.Join(dir, "results"))
		if len(published) == 0 {
			t.Fatalf("%s: no published results", id)
		}
		if err := os.RemoveAll(filepath.Join(dir, "results")); err != nil {
			t.Fatal(err)
		}
		if err := os.Mkdir(filepath.Join(dir, "results"), 0o755); err != nil {
			t.Fatal(err)
		}
		path := bin
		if tools := environmentPath(t, dir); tools != "" {
			needy++
			if out, err := run(t, bin, filepath.Join(dir, "code"), nil, "run"); err == nil {
				t.Fatalf("%s: sh run works without the tools its environment installs:\n%s", id, out)
			}
			path = tools + ":" + bin
			vendored, _ := os.ReadDir(filepath.Join(dir, "code", "vendor"))
			for _, v := range vendored {
				a, _ := os.ReadFile(filepath.Join(dir, "code", "vendor", v.Name()))
				b, _ := os.ReadFile(filepath.Join(tools, v.Name()))
				if !bytes.Equal(a, b) {
					t.Errorf("%s: code/vendor/%s is not the tool the environment installs", id, v.Name())
				}
			}
		}
		out, err := run(t, path, filepath.Join(dir, "code"), nil, "run")
		if err != nil {
			t.Fatalf("%s: sh run: %v\n%s", id, err, out)
		}
		regenerated := readTree(t, filepath.Join(dir, "results"))
		if !reflect.DeepEqual(regenerated, published) {
			for name := range published {
				if regenerated[name] != published[name] {
					t.Errorf("%s: results/%s regenerated as\n%s\npublished\n%s", id, name, regenerated[name], published[name])
				}
			}
			for name := range regenerated {
				if _, ok := published[name]; !ok {
					t.Errorf("%s: results/%s is not published", id, name)
				}
			}
		}
	}
	if needy == 0 {
		t.Error("no sample capsule needs what its environment installs")
	}
}

func TestAgentsAtEveryLevel(t *testing.T) {
	bin := busyboxPath(t)
	tasks := parseTasks(t)
	rule, err := corebench.LookupStripRule("original")
	if err != nil {
		t.Fatal(err)
	}
	grader := corebench.NewOriginal()
	agentDir := t.TempDir()
	for _, name := range AgentNames() {
		files, _ := AgentFiles(name)
		if err := os.WriteFile(filepath.Join(agentDir, name), files[AgentEntrypoint], 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, task := range tasks {
		for _, level := range corebench.Levels() {
			for _, name := range AgentNames() {
				ws := t.TempDir()
				capsule := extract(t, task.CapsuleID, ws)
				// At Medium the agent runs in the capsule's environment:
				// what its Dockerfile installs is on the PATH.
				path := bin
				if tools := environmentPath(t, capsule); tools != "" && level == corebench.Medium {
					path = tools + ":" + bin
				}
				if err := rule.Apply(capsule, level); err != nil {
					t.Fatal(err)
				}
				prompt, err := corebench.Prompt(corebench.DefaultPrompts(), level, task)
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(ws, "prompt.txt"), []byte(prompt), 0o644); err != nil {
					t.Fatal(err)
				}
				env := []string{
					"WORKSPACE=" + ws,
					"CODE=" + filepath.Join(capsule, "code"),
					"DATA=" + filepath.Join(capsule, "data"),
					"RESULTS=" + filepath.Join(capsule, "results"),
				}
				out, err := run(t, path, ws, env, filepath.Join(agentDir, name))
				if err != nil {
					t.Errorf("%s %s %s: agent failed: %v\n%s", task.CapsuleID, level, name, err, out)
					continue
				}
				report, err := os.ReadFile(filepath.Join(ws, "report.json"))
				if err != nil {
					t.Errorf("%s %s %s: %v\n%s", task.CapsuleID, level, name, err, out)
					continue
				}
				v, err := grader.Grade(task, report)
				if err != nil {
					t.Fatal(err)
				}
				correct := v.CorrectWrittenAnswers + v.CorrectVisionAnswers
				switch name {
				case "oracle":
					if !v.TaskCorrect || v.ReportError != "" {
						t.Errorf("%s %s oracle: not correct: %+v\nreport %s\n%s", task.CapsuleID, level, v, report, out)
					}
					if level != corebench.Easy && !strings.Contains(out, "is empty, running") {
						t.Errorf("%s %s oracle: did not regenerate the results:\n%s", task.CapsuleID, level, out)
					}
				case "wrong":
					if v.TaskCorrect || correct != 0 || v.StoppedAt != "" || v.ReportError != "" {
						t.Errorf("%s %s wrong: %d correct: %+v\nreport %s", task.CapsuleID, level, correct, v, report)
					}
				}
				if testing.Verbose() && task.CapsuleID == CapsuleIDs()[0] && level == corebench.Hard {
					t.Logf("%s %s %s output:\n%s", task.CapsuleID, level, name, out)
				}
			}
		}
	}
}
