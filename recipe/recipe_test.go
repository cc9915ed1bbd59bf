package recipe

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/ipfs/go-cid"
	mh "github.com/multiformats/go-multihash"

	"github.com/repronet/repronet/proto"
)

func mkfifo(t *testing.T, p string) {
	t.Helper()
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
}

// memStore is content by CID, in memory: the Opener and Adder of the tests.
type memStore map[cid.Cid][]byte

func (m memStore) put(b []byte) cid.Cid {
	h, _ := mh.Sum(b, mh.SHA2_256, -1)
	c := cid.NewCidV1(cid.Raw, h)
	m[c] = b
	return c
}

func (m memStore) open(_ context.Context, c cid.Cid) (io.ReadCloser, error) {
	b, ok := m[c]
	if !ok {
		return nil, errors.New("not held")
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

func (m memStore) add(_ context.Context, r io.Reader) (cid.Cid, int64, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return cid.Undef, 0, err
	}
	return m.put(b), int64(len(b)), nil
}

// TestCollect reads outputs from a hostile tree: links out of the
// workspace (to a file and through a parent folder), a FIFO, a folder where
// a file is asked, files too large, paths that climb or are absolute. Only
// the plain files inside come back; nothing outside is ever read.
func TestCollect(t *testing.T) {
	outside := t.TempDir()
	secret := []byte("SECRET outside the workspace")
	os.WriteFile(filepath.Join(outside, "secret"), secret, 0o644)
	mkfifo(t, filepath.Join(outside, "fifo")) // reading it through a link would hang

	ws := t.TempDir()
	results := filepath.Join(ws, "capsule-1", "results")
	os.MkdirAll(results, 0o755)
	os.WriteFile(filepath.Join(results, "summary.txt"), []byte("Accuracy: 93.75%\n"), 0o644)
	os.WriteFile(filepath.Join(results, "empty.txt"), nil, 0o644)
	os.WriteFile(filepath.Join(results, "big.bin"), make([]byte, 1<<20+1), 0o644)
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(results, "abs-link"))
	os.Symlink("../../../"+filepath.Base(outside)+"/secret", filepath.Join(results, "rel-link"))
	os.Symlink(filepath.Join(outside, "fifo"), filepath.Join(results, "fifo-link"))
	os.Symlink("summary.txt", filepath.Join(results, "inner-link")) // even a link inside is refused
	os.Symlink(outside, filepath.Join(ws, "capsule-1", "linkdir"))
	os.Symlink(".", filepath.Join(results, "self"))
	mkfifo(t, filepath.Join(results, "fifo"))
	os.Mkdir(filepath.Join(results, "sub"), 0o755)

	tests := []struct {
		path string
		data string // want this content
		err  string // or an error mentioning this
	}{
		{"capsule-1/results/summary.txt", "Accuracy: 93.75%\n", ""},
		{"capsule-1/results/empty.txt", "", ""},
		{"capsule-1/results/missing.txt", "", "missing"},
		{"capsule-1/results/big.bin", "", "over its max_bytes"},
		{"capsule-1/results/abs-link", "", "symlink"},
		{"capsule-1/results/rel-link", "", "symlink"},
		{"capsule-1/results/fifo-link", "", "symlink"},
		{"capsule-1/results/inner-link", "", "symlink"},
		{"capsule-1/linkdir/secret", "", "linkdir is a symlink"},
		{"capsule-1/results/self/summary.txt", "", "results/self is a symlink"},
		{"capsule-1/results/fifo", "", "named pipe"},
		{"capsule-1/results/sub", "", "folder, not a regular file"},
		{"capsule-1/results/summary.txt/x", "", "summary.txt is a regular file, not a folder"},
		{"../beside.txt", "", `".."`},
		{"capsule-1/../../beside.txt", "", `".."`},
		{"/etc/passwd", "", "absolute"},
		{"./capsule-1/results/summary.txt", "", "not a clean"},
		{"capsule-1//results", "", "not a clean"},
		{"", "", "empty path"},
		{"capsule-1/a\x00b", "", "NUL"},
	}
	var outputs []*proto.Output
	for _, tt := range tests {
		outputs = append(outputs, &proto.Output{Path: tt.path, MaxBytes: 1 << 20})
	}
	store := memStore{}
	got := Collect(context.Background(), ws, outputs, store.add)
	if len(got) != len(tests) {
		t.Fatalf("%d entries for %d outputs", len(got), len(tests))
	}
	for i, tt := range tests {
		o := got[i]
		if o.GetPath() != tt.path {
			t.Fatalf("entry %d is %q, want %q", i, o.GetPath(), tt.path)
		}
		c, _ := cid.Cast(o.GetCid())
		data := store[c]
		if bytes.Contains(data, []byte("SECRET")) {
			t.Fatalf("%q: read a file outside the workspace", tt.path)
		}
		if tt.err == "" {
			if o.GetError() != "" || string(data) != tt.data || o.GetSize() != uint64(len(tt.data)) {
				t.Errorf("%q: data %q (size %d) error %q, want %q", tt.path, data, o.GetSize(), o.GetError(), tt.data)
			}
			continue
		}
		if len(o.GetCid()) != 0 || !strings.Contains(o.GetError(), tt.err) {
			t.Errorf("%q: cid %x, error %q; want an error mentioning %q", tt.path, o.GetCid(), o.GetError(), tt.err)
		}
	}

	t.Run("a folder comes back as a tarball of what is in it, links as links", func(t *testing.T) {
		got := Collect(context.Background(), ws, []*proto.Output{{Path: "capsule-1/results", MaxBytes: 8 << 20, Directory: true}}, store.add)
		if got[0].GetError() != "" {
			t.Fatal(got[0].GetError())
		}
		c, _ := cid.Cast(got[0].GetCid())
		entries := map[string]string{}
		tr := tar.NewReader(bytes.NewReader(store[c]))
		for {
			h, err := tr.Next()
			if err == io.EOF {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(tr)
			if bytes.Contains(b, []byte("SECRET")) {
				t.Fatalf("%s: the tarball holds a file outside the workspace", h.Name)
			}
			entries[h.Name] = fmt.Sprintf("%c:%s:%s", h.Typeflag, h.Linkname, b)
		}
		for name, want := range map[string]string{
			"summary.txt": "0::Accuracy: 93.75%\n", "abs-link": "2:" + filepath.Join(outside, "secret") + ":", "sub/": "5::",
		} {
			if entries[name] != want {
				t.Errorf("%s: %q, want %q", name, entries[name], want)
			}
		}
		if _, ok := entries["fifo"]; ok {
			t.Error("a FIFO is in the tarball")
		}
		again := Collect(context.Background(), ws, []*proto.Output{{Path: "capsule-1/results", MaxBytes: 8 << 20, Directory: true}}, store.add)
		if !bytes.Equal(again[0].GetCid(), got[0].GetCid()) {
			t.Error("the same folder made two different tarballs")
		}
		small := Collect(context.Background(), ws, []*proto.Output{{Path: "capsule-1/results", MaxBytes: 4096, Directory: true}}, store.add)
		if len(small[0].GetCid()) != 0 || !strings.Contains(small[0].GetError(), "over its max_bytes") {
			t.Errorf("a folder over its max_bytes: %+v", small[0])
		}
		link := Collect(context.Background(), ws, []*proto.Output{{Path: "capsule-1/linkdir", MaxBytes: 8 << 20, Directory: true}}, store.add)
		if !strings.Contains(link[0].GetError(), "symlink") {
			t.Errorf("a link to a folder outside: %+v", link[0])
		}
	})

	t.Run("the workspace replaced by a link", func(t *testing.T) {
		base := t.TempDir()
		os.Symlink(outside, filepath.Join(base, "ws"))
		for _, o := range Collect(context.Background(), filepath.Join(base, "ws"), []*proto.Output{{Path: "secret", MaxBytes: 100}}, store.add) {
			if len(o.GetCid()) != 0 || o.GetError() == "" {
				t.Fatalf("%s: cid %x error %q", o.GetPath(), o.GetCid(), o.GetError())
			}
		}
	})
}

// tarball makes a gzip'd tarball of entries (a name ending in / is a
// folder; "->" makes a link).
func tarball(t *testing.T, entries ...string) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	for _, e := range entries {
		name, body, _ := strings.Cut(e, "=")
		h := &tar.Header{Name: name, Mode: 0o644, Typeflag: tar.TypeReg, Size: int64(len(body))}
		switch {
		case strings.HasSuffix(name, "/"):
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		case strings.Contains(name, "->"):
			n, target, _ := strings.Cut(name, "->")
			h.Name, h.Typeflag, h.Linkname, h.Size = n, tar.TypeSymlink, target, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(body))
		}
	}
	tw.Close()
	zw.Close()
	return buf.Bytes()
}

func TestPrepare(t *testing.T) {
	store := memStore{}
	capsule := store.put(tarball(t, "cap/", "cap/code/", "cap/code/run=echo hi", "cap/results/", "cap/results/old.txt=stale",
		"cap/REPRODUCING.md=how"))
	two := store.put(tarball(t, "a/", "b/"))
	file := store.put([]byte("plain content"))
	write := func(p, s string) *proto.Edit {
		return &proto.Edit{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: p, Content: []byte(s)}}}
	}
	base := func() *proto.Recipe {
		return &proto.Recipe{Inputs: []*proto.Input{{Cid: capsule.Bytes(), Extract: true, Top: "cap"}}}
	}
	tests := []struct {
		name  string
		edit  func(*proto.Recipe)
		setup func(ws string)
		want  string // error substring; "" for success
		check func(t *testing.T, ws string)
	}{
		{"extract and edit", func(r *proto.Recipe) {
			r.Inputs = append(r.Inputs, &proto.Input{Cid: file.Bytes(), Path: "cap/data.txt"})
			r.Edits = []*proto.Edit{
				{Op: &proto.Edit_Dir{Dir: "cap/data"}},
				{Op: &proto.Edit_Remove{Remove: "cap/REPRODUCING.md"}},
				{Op: &proto.Edit_Remove{Remove: "cap/absent/deeper"}},
				{Op: &proto.Edit_EmptyDir{EmptyDir: "cap/results"}},
				{Op: &proto.Edit_RemoveMatching{RemoveMatching: &proto.RemoveMatching{Under: "cap", MatchRoot: "/root/",
					Any: []*proto.FileMatch{{PathSuffix: []string{"/code/run"}}}}}},
				write("prompt.txt", "solve it"),
			}
		}, nil, "", func(t *testing.T, ws string) {
			for p, want := range map[string]string{"cap/data.txt": "plain content", "prompt.txt": "solve it"} {
				if b, err := os.ReadFile(filepath.Join(ws, p)); err != nil || string(b) != want {
					t.Errorf("%s: %q %v", p, b, err)
				}
			}
			for _, gone := range []string{"cap/REPRODUCING.md", "cap/results/old.txt", "cap/code/run"} {
				if _, err := os.Lstat(filepath.Join(ws, gone)); err == nil {
					t.Errorf("%s is still there", gone)
				}
			}
			for _, dir := range []string{"cap/data", "cap/results", "cap/code"} {
				if fi, err := os.Lstat(filepath.Join(ws, dir)); err != nil || !fi.IsDir() {
					t.Errorf("%s is not a folder: %v", dir, err)
				}
			}
		}},
		{"top folder named otherwise", func(r *proto.Recipe) { r.Inputs[0].Top = "capsule-9" }, nil, `a folder named "capsule-9"`, nil},
		{"two top entries", func(r *proto.Recipe) { r.Inputs[0].Cid, r.Inputs[0].Top = two.Bytes(), "a" }, nil, "exactly one top entry", nil},
		{"no top check", func(r *proto.Recipe) { r.Inputs[0].Cid, r.Inputs[0].Top = two.Bytes(), "" }, nil, "", nil},
		{"content not held", func(r *proto.Recipe) { r.Inputs[0].Cid = store.put(nil).Bytes(); delete(store, store.put(nil)) }, nil, "not held", nil},
		{"writing over a file", func(r *proto.Recipe) { r.Edits = []*proto.Edit{write("cap/code/run", "x")} }, nil, "exists", nil},
		{"a dir where a file is", func(r *proto.Recipe) { r.Edits = []*proto.Edit{{Op: &proto.Edit_Dir{Dir: "cap/code/run"}}} },
			nil, "not a folder", nil},
		{"a file input where one exists", func(r *proto.Recipe) {
			r.Inputs = append(r.Inputs, &proto.Input{Cid: file.Bytes(), Path: "cap/code/run"})
		}, nil, "exists", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ws := t.TempDir()
			r := base()
			if tt.edit != nil {
				tt.edit(r)
			}
			err := Prepare(context.Background(), ws, r, store.open)
			if tt.want == "" && err != nil {
				t.Fatalf("Prepare: %v", err)
			}
			if tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
				t.Fatalf("Prepare: %v, want an error mentioning %q", err, tt.want)
			}
			if tt.check != nil {
				tt.check(t, ws)
			}
		})
	}
}

// Edits never act through a link: not a removal, not an emptying, not a
// write.
func TestEditsNeverFollowLinks(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "precious.txt"), []byte("keep"), 0o644)
	ws := t.TempDir()
	os.MkdirAll(filepath.Join(ws, "cap"), 0o755)
	os.Symlink(outside, filepath.Join(ws, "cap", "results"))
	os.Symlink(outside, filepath.Join(ws, "cap", "code"))
	os.Symlink(filepath.Join(outside, "precious.txt"), filepath.Join(ws, "prompt.txt"))
	for _, tt := range []struct {
		name string
		e    *proto.Edit
		want string // "" for no error
	}{
		{"emptying a linked folder replaces the link", &proto.Edit{Op: &proto.Edit_EmptyDir{EmptyDir: "cap/results"}}, ""},
		{"removing through a linked parent", &proto.Edit{Op: &proto.Edit_Remove{Remove: "cap/code/precious.txt"}}, "symbolic link"},
		{"writing over a planted link", &proto.Edit{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: "prompt.txt", Content: []byte("x")}}}, "exists"},
		{"matching under a linked folder", &proto.Edit{Op: &proto.Edit_RemoveMatching{RemoveMatching: &proto.RemoveMatching{Under: "cap/code",
			Any: []*proto.FileMatch{{NameSuffix: []string{".txt"}}}}}}, "not a folder"},
	} {
		err := ApplyEdits(ws, []*proto.Edit{tt.e})
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(outside, "precious.txt")); err != nil || string(b) != "keep" {
		t.Fatalf("a file outside the workspace changed: %q %v", b, err)
	}
	if fi, err := os.Lstat(filepath.Join(ws, "cap", "results")); err != nil || !fi.IsDir() {
		t.Fatalf("results is not a real folder: %v", err)
	}
}

func TestValidate(t *testing.T) {
	img := memStore{}.put([]byte("image"))
	ok := func() *proto.Recipe {
		return &proto.Recipe{ImageCid: img.Bytes(), Limits: &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, WallSeconds: 60},
			Mounts:  []*proto.Mount{{Target: "/workspace"}, {Source: "cap/code", Target: "/code"}},
			Outputs: []*proto.Output{{Path: "report.json", MaxBytes: 1 << 20}}, Env: []string{"A=b"}, Cwd: "/workspace"}
	}
	tests := []struct {
		name string
		edit func(*proto.Recipe)
		want string
	}{
		{"valid", func(*proto.Recipe) {}, ""},
		{"no image", func(r *proto.Recipe) { r.ImageCid = nil }, "image_cid"},
		{"no wall limit", func(r *proto.Recipe) { r.Limits.WallSeconds = 0 }, "wall_seconds"},
		{"climbing input", func(r *proto.Recipe) { r.Inputs = []*proto.Input{{Cid: img.Bytes(), Path: "../x", Extract: true}} }, `".."`},
		{"file input without a path", func(r *proto.Recipe) { r.Inputs = []*proto.Input{{Cid: img.Bytes()}} }, "needs a path"},
		{"top with a slash", func(r *proto.Recipe) { r.Inputs = []*proto.Input{{Cid: img.Bytes(), Extract: true, Top: "a/b"}} }, "top"},
		{"absolute edit", func(r *proto.Recipe) { r.Edits = []*proto.Edit{{Op: &proto.Edit_Remove{Remove: "/etc"}}} }, "absolute"},
		{"empty edit", func(r *proto.Recipe) { r.Edits = []*proto.Edit{{}} }, "no operation"},
		{"huge write", func(r *proto.Recipe) {
			r.Edits = []*proto.Edit{{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: "x", Content: make([]byte, proto.MaxRecipeWrite+1)}}}}
		}, "bytes"},
		{"relative mount target", func(r *proto.Recipe) { r.Mounts[1].Target = "code" }, "mounts[1].target"},
		{"mount over /", func(r *proto.Recipe) { r.Mounts[1].Target = "/" }, "mounts[1].target"},
		{"mounted twice", func(r *proto.Recipe) { r.Mounts[1].Target = "/workspace" }, "twice"},
		{"env without =", func(r *proto.Recipe) { r.Env = []string{"JUSTKEY"} }, "env[0]"},
		{"relative cwd", func(r *proto.Recipe) { r.Cwd = "work" }, "cwd"},
		{"output without a bound", func(r *proto.Recipe) { r.Outputs[0].MaxBytes = 0 }, "max_bytes"},
		{"IPv6 nameserver (the sandbox's rule)", func(r *proto.Recipe) {
			r.Limits.Network, r.Limits.Nameservers = "egress", []string{"2001:db8::53"}
		}, "only IPv4"},
		{"allow-list without egress", func(r *proto.Recipe) { r.Limits.Allow = []string{"10.0.0.1"} }, "takes no allow-list"},
		{"disk below a workspace", func(r *proto.Recipe) { r.Limits.DiskBytes = 1 << 20 }, "disk_bytes"},
		{"environment", func(r *proto.Recipe) {
			r.Environment = &proto.Environment{Dockerfile: "cap/environment/Dockerfile", Context: "cap/environment", ImageMount: "/agent"}
		}, ""},
		{"environment showing nothing of the job's image", func(r *proto.Recipe) {
			r.Environment = &proto.Environment{Dockerfile: "cap/environment/Dockerfile", IfPresent: true}
		}, ""},
		{"environment without a Dockerfile", func(r *proto.Recipe) { r.Environment = &proto.Environment{ImageMount: "/agent"} }, "environment.dockerfile"},
		{"environment Dockerfile outside", func(r *proto.Recipe) {
			r.Environment = &proto.Environment{Dockerfile: "../Dockerfile", ImageMount: "/agent"}
		}, "environment.dockerfile"},
		{"environment context absolute", func(r *proto.Recipe) {
			r.Environment = &proto.Environment{Dockerfile: "Dockerfile", Context: "/etc", ImageMount: "/agent"}
		}, "environment.context"},
		{"environment image mount relative", func(r *proto.Recipe) {
			r.Environment = &proto.Environment{Dockerfile: "Dockerfile", ImageMount: "agent"}
		}, "environment.image_mount"},
		{"environment image mount over /", func(r *proto.Recipe) { r.Environment = &proto.Environment{Dockerfile: "Dockerfile", ImageMount: "/"} }, "environment.image_mount"},
		{"environment image mount over a mount", func(r *proto.Recipe) {
			r.Environment = &proto.Environment{Dockerfile: "Dockerfile", ImageMount: "/code"}
		}, "environment.image_mount"},
	}
	for _, tt := range tests {
		r := ok()
		tt.edit(r)
		err := Validate(r)
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
			t.Errorf("%s: %v, want %q", tt.name, err, tt.want)
		}
	}
}

// TestEnvironment finds a recipe's environment in a workspace whose
// capsule plants links: a Dockerfile that is a link (to a secret outside),
// a linked environment folder, a linked context, a FIFO and an oversized
// Dockerfile are refused; a missing Dockerfile is "none" only when the
// environment says if_present; nothing outside the workspace is read.
func TestEnvironment(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "Dockerfile"), []byte("FROM secret\n"), 0o644)
	ws := t.TempDir()
	for _, d := range []string{"good/environment", "linkdf/environment", "fifo/environment", "big/environment", "linkctx/environment", "none"} {
		os.MkdirAll(filepath.Join(ws, d), 0o755)
	}
	os.WriteFile(filepath.Join(ws, "good/environment/Dockerfile"), []byte("FROM busybox\n"), 0o644)
	os.WriteFile(filepath.Join(ws, "Dockerfile"), []byte("FROM top\n"), 0o644)
	os.Symlink(filepath.Join(outside, "Dockerfile"), filepath.Join(ws, "linkdf/environment/Dockerfile"))
	os.Symlink(outside, filepath.Join(ws, "linkenv"))
	mkfifo(t, filepath.Join(ws, "fifo/environment/Dockerfile"))
	os.WriteFile(filepath.Join(ws, "big/environment/Dockerfile"), make([]byte, MaxDockerfile+1), 0o644)
	os.WriteFile(filepath.Join(ws, "linkctx/environment/Dockerfile"), []byte("FROM busybox\n"), 0o644)
	os.Symlink(outside, filepath.Join(ws, "linkctx/ctx"))
	for _, tt := range []struct {
		name    string
		env     *proto.Environment
		ok      bool
		want    string // error; "" for none
		data    string
		context string
	}{
		{"no environment", nil, false, "", "", ""},
		{"found", &proto.Environment{Dockerfile: "good/environment/Dockerfile", ImageMount: "/agent"}, true, "", "FROM busybox\n", "good/environment"},
		{"found, context given", &proto.Environment{Dockerfile: "good/environment/Dockerfile", Context: "good", ImageMount: "/agent"}, true, "", "FROM busybox\n", "good"},
		{"at the top, the workspace as context", &proto.Environment{Dockerfile: "Dockerfile", ImageMount: "/agent"}, true, "", "FROM top\n", ""},
		{"missing, if present", &proto.Environment{Dockerfile: "none/environment/Dockerfile", IfPresent: true, ImageMount: "/agent"}, false, "", "", ""},
		{"missing folder, if present", &proto.Environment{Dockerfile: "nowhere/environment/Dockerfile", IfPresent: true, ImageMount: "/agent"}, false, "", "", ""},
		{"missing, required", &proto.Environment{Dockerfile: "none/environment/Dockerfile", ImageMount: "/agent"}, false, "missing", "", ""},
		{"a linked Dockerfile", &proto.Environment{Dockerfile: "linkdf/environment/Dockerfile", IfPresent: true, ImageMount: "/agent"}, false, "symlink", "", ""},
		{"through a linked folder", &proto.Environment{Dockerfile: "linkenv/Dockerfile", IfPresent: true, ImageMount: "/agent"}, false, "symlink", "", ""},
		{"a FIFO", &proto.Environment{Dockerfile: "fifo/environment/Dockerfile", ImageMount: "/agent"}, false, "named pipe", "", ""},
		{"too large", &proto.Environment{Dockerfile: "big/environment/Dockerfile", ImageMount: "/agent"}, false, "over", "", ""},
		{"a linked context", &proto.Environment{Dockerfile: "linkctx/environment/Dockerfile", Context: "linkctx/ctx", ImageMount: "/agent"}, false, "symlink", "", ""},
	} {
		files, ok, err := Environment(ws, &proto.Recipe{Environment: tt.env})
		if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) || ok != tt.ok {
			t.Errorf("%s: ok %v, %v; want ok %v, error %q", tt.name, ok, err, tt.ok, tt.want)
			continue
		}
		if !ok {
			continue
		}
		if string(files.Data) != tt.data || files.Context != filepath.Join(ws, tt.context) ||
			files.Dockerfile != filepath.Join(ws, tt.env.GetDockerfile()) {
			t.Errorf("%s: %+v", tt.name, files)
		}
	}
}
