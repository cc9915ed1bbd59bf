package blockfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
)

func open(t *testing.T, dir string) *Datastore {
	t.Helper()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func keys(t *testing.T, d *Datastore, q query.Query) []string {
	t.Helper()
	res, err := d.Query(context.Background(), q)
	if err != nil {
		t.Fatal(err)
	}
	es, err := res.Rest()
	if err != nil {
		t.Fatal(err)
	}
	var ks []string
	for _, e := range es {
		ks = append(ks, e.Key)
	}
	slices.Sort(ks)
	return ks
}

func TestOps(t *testing.T) {
	ctx := context.Background()
	d := open(t, t.TempDir())
	k := datastore.NewKey
	big := bytes.Repeat([]byte("x"), 1<<20+3)
	type step struct {
		op    string // put, get, has, delete, size
		key   string
		value []byte
		want  []byte // get: value; has: "true"/"false"
		err   error
	}
	steps := []step{
		{op: "get", key: "/CIQA", err: datastore.ErrNotFound},
		{op: "has", key: "/CIQA", want: []byte("false")},
		{op: "size", key: "/CIQA", err: datastore.ErrNotFound},
		{op: "put", key: "/CIQA", value: []byte("hello")},
		{op: "get", key: "/CIQA", want: []byte("hello")},
		{op: "has", key: "/CIQA", want: []byte("true")},
		{op: "size", key: "/CIQA", want: []byte("5")},
		{op: "put", key: "/CIQA", value: []byte("replaced")},
		{op: "get", key: "/CIQA", want: []byte("replaced")},
		{op: "put", key: "/a", value: []byte{}}, // short key, empty value
		{op: "get", key: "/a", want: []byte{}},
		{op: "has", key: "/a", want: []byte("true")},
		{op: "put", key: "/BIG-1_=+", value: big},
		{op: "get", key: "/BIG-1_=+", want: big},
		{op: "delete", key: "/a"},
		{op: "has", key: "/a", want: []byte("false")},
		{op: "get", key: "/a", err: datastore.ErrNotFound},
		{op: "delete", key: "/a"}, // missing: not an error
	}
	for i, s := range steps {
		t.Run(fmt.Sprintf("%d_%s_%s", i, s.op, strings.Trim(s.key, "/")), func(t *testing.T) {
			var got []byte
			var err error
			switch s.op {
			case "put":
				err = d.Put(ctx, k(s.key), s.value)
			case "get":
				got, err = d.Get(ctx, k(s.key))
			case "has":
				var ok bool
				ok, err = d.Has(ctx, k(s.key))
				got = fmt.Appendf(nil, "%v", ok)
			case "size":
				var n int
				n, err = d.GetSize(ctx, k(s.key))
				got = fmt.Appendf(nil, "%d", n)
			case "delete":
				err = d.Delete(ctx, k(s.key))
			}
			if !errors.Is(err, s.err) {
				t.Fatalf("%s %s: error %v, want %v", s.op, s.key, err, s.err)
			}
			if s.err == nil && s.want != nil && !bytes.Equal(got, s.want) {
				t.Fatalf("%s %s: got %.40q, want %.40q", s.op, s.key, got, s.want)
			}
		})
	}

	// Query: keys, values, sizes, prefix, limit; a stray temporary file is
	// not listed.
	if err := os.WriteFile(filepath.Join(d.dir, tmpPrefix+"123"), []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := d.Put(ctx, k("/CIQB"), []byte("b")); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(t, d, query.Query{KeysOnly: true}), []string{"/BIG-1_=+", "/CIQA", "/CIQB"}; !slices.Equal(got, want) {
		t.Fatalf("query keys: %q, want %q", got, want)
	}
	// go-datastore prefixes match whole key components.
	if got := keys(t, d, query.Query{Prefix: "/CIQ"}); len(got) != 0 {
		t.Fatalf("query prefix /CIQ: %q, want none", got)
	}
	if got, want := keys(t, d, query.Query{Prefix: "/"}), []string{"/BIG-1_=+", "/CIQA", "/CIQB"}; !slices.Equal(got, want) {
		t.Fatalf("query prefix /: %q, want %q", got, want)
	}
	if got := keys(t, d, query.Query{KeysOnly: true, Limit: 2}); len(got) != 2 {
		t.Fatalf("query limit 2: %q", got)
	}
	res, err := d.Query(ctx, query.Query{Filters: []query.Filter{query.FilterKeyCompare{Op: query.Equal, Key: "/CIQA"}}})
	if err != nil {
		t.Fatal(err)
	}
	es, err := res.Rest()
	if err != nil || len(es) != 1 || string(es[0].Value) != "replaced" || es[0].Size != 8 {
		t.Fatalf("query values: %+v, %v", es, err)
	}
	res, err = d.Query(ctx, query.Query{Filters: []query.Filter{query.FilterKeyCompare{Op: query.Equal, Key: "/BIG-1_=+"}}, KeysOnly: true, ReturnsSizes: true})
	if err != nil {
		t.Fatal(err)
	}
	es, err = res.Rest()
	if err != nil || len(es) != 1 || es[0].Size != len(big) || es[0].Value != nil {
		t.Fatalf("query sizes: %d entries, %v", len(es), err)
	}

	// Batch: applied on Commit, in order.
	b, err := d.Batch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Put(ctx, k("/CIQC"), []byte("c")); err != nil {
		t.Fatal(err)
	}
	if err := b.Delete(ctx, k("/CIQB")); err != nil {
		t.Fatal(err)
	}
	if ok, _ := d.Has(ctx, k("/CIQC")); ok {
		t.Fatal("batch applied before Commit")
	}
	if err := b.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := d.Sync(ctx, datastore.NewKey("/")); err != nil {
		t.Fatal(err)
	}
	if got, want := keys(t, d, query.Query{KeysOnly: true}), []string{"/BIG-1_=+", "/CIQA", "/CIQC"}; !slices.Equal(got, want) {
		t.Fatalf("after batch: %q, want %q", got, want)
	}

	// Reopened: the data is there and the stray temporary file is gone.
	d2 := open(t, d.dir)
	if v, err := d2.Get(ctx, k("/CIQC")); err != nil || string(v) != "c" {
		t.Fatalf("after reopen: %q, %v", v, err)
	}
	if _, err := os.Stat(filepath.Join(d.dir, tmpPrefix+"123")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("stale temporary file kept: %v", err)
	}
}

// TestUnshard opens a store written with the older two-character shard
// folders: its blocks are moved into the flat layout, a block present in
// both places keeps the flat copy, temporary files are dropped, and the
// shard folders are gone.
func TestUnshard(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	write := func(rel, data string) {
		t.Helper()
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("QA/CIQAQAB", "a")
	write("QA/CIQBQAC", "b")
	write("QA/"+tmpPrefix+"1", "partial")
	write("ZX/CIQZZXD", "shard copy")
	write("CIQZZXD", "flat copy")
	write("notashard/CIQE", "e") // not a shard name: left alone

	d := open(t, dir)
	for key, want := range map[string]string{"/CIQAQAB": "a", "/CIQBQAC": "b", "/CIQZZXD": "flat copy"} {
		if v, err := d.Get(ctx, datastore.NewKey(key)); err != nil || string(v) != want {
			t.Errorf("Get %s = %q, %v; want %q", key, v, err, want)
		}
	}
	if got, want := keys(t, d, query.Query{KeysOnly: true}), []string{"/CIQAQAB", "/CIQBQAC", "/CIQZZXD"}; !slices.Equal(got, want) {
		t.Errorf("keys %q, want %q", got, want)
	}
	for _, shard := range []string{"QA", "ZX"} {
		if _, err := os.Stat(filepath.Join(dir, shard)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("shard %s still there: %v", shard, err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "notashard", "CIQE")); err != nil {
		t.Errorf("a folder that is not a shard was touched: %v", err)
	}
}

func TestKeysOutsideRefused(t *testing.T) {
	ctx := context.Background()
	parent := t.TempDir()
	dir := filepath.Join(parent, "blocks")
	d := open(t, dir)
	bad := []string{
		"/../escape", "/../../escape", "/a/../../escape", "/sub/key", "/..", "/.", "/",
		"/.tmp-x", "/a\\..\\b", "/a\x00b", "/" + strings.Repeat("A", 201), "/a/b/c",
	}
	for _, s := range bad {
		// datastore.RawKey keeps the string as given (NewKey would clean it).
		key := datastore.RawKey(s)
		if err := d.Put(ctx, key, []byte("x")); !errors.Is(err, ErrBadKey) {
			t.Errorf("Put %q: %v, want ErrBadKey", s, err)
		}
		if _, err := d.Get(ctx, key); !errors.Is(err, ErrBadKey) {
			t.Errorf("Get %q: %v, want ErrBadKey", s, err)
		}
		if _, err := d.Has(ctx, key); !errors.Is(err, ErrBadKey) {
			t.Errorf("Has %q: %v, want ErrBadKey", s, err)
		}
		if err := d.Delete(ctx, key); !errors.Is(err, ErrBadKey) {
			t.Errorf("Delete %q: %v, want ErrBadKey", s, err)
		}
		b, _ := d.Batch(ctx)
		if err := b.Put(ctx, key, []byte("x")); !errors.Is(err, ErrBadKey) {
			t.Errorf("Batch.Put %q: %v, want ErrBadKey", s, err)
		}
	}
	ents, err := os.ReadDir(parent)
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != 1 || ents[0].Name() != "blocks" {
		t.Fatalf("something was written beside the folder: %v", ents)
	}
}

const crashEnv = "BLOCKFS_TEST_CRASH_DIR"

// TestCrashMidWrite kills a writer process (os.Exit, no cleanup) once a
// block is half written to its temporary file, and once it is fully written
// but not yet renamed; neither block may be visible afterwards, while a
// block written before the crash is whole.
func TestCrashMidWrite(t *testing.T) {
	if dir := os.Getenv(crashEnv); dir != "" {
		crashChild(dir, os.Getenv("BLOCKFS_TEST_CRASH_MODE"))
		return
	}
	ctx := context.Background()
	for _, mode := range []string{"half", "full"} {
		t.Run(mode, func(t *testing.T) {
			dir := t.TempDir()
			cmd := exec.Command(os.Args[0], "-test.run=^TestCrashMidWrite$")
			cmd.Env = append(os.Environ(), crashEnv+"="+dir, "BLOCKFS_TEST_CRASH_MODE="+mode)
			out, err := cmd.CombinedOutput()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != 3 {
				t.Fatalf("child did not crash as planned: %v\n%s", err, out)
			}
			// The temporary file is there, as a crash leaves it.
			tmps, _ := filepath.Glob(filepath.Join(dir, tmpPrefix+"*"))
			if len(tmps) != 1 {
				t.Fatalf("temporary files after the crash: %v", tmps)
			}
			d := open(t, dir)
			if ok, err := d.Has(ctx, datastore.NewKey("/CIQCRASH")); ok || err != nil {
				t.Fatalf("crashed block visible: %v, %v", ok, err)
			}
			if _, err := d.Get(ctx, datastore.NewKey("/CIQCRASH")); !errors.Is(err, datastore.ErrNotFound) {
				t.Fatalf("crashed block: %v", err)
			}
			if got, want := keys(t, d, query.Query{KeysOnly: true}), []string{"/CIQGOOD"}; !slices.Equal(got, want) {
				t.Fatalf("keys after crash: %q, want %q", got, want)
			}
			if v, err := d.Get(ctx, datastore.NewKey("/CIQGOOD")); err != nil || !bytes.Equal(v, bytes.Repeat([]byte("g"), 1<<20)) {
				t.Fatalf("block written before the crash: %d bytes, %v", len(v), err)
			}
			tmps, _ = filepath.Glob(filepath.Join(dir, tmpPrefix+"*"))
			if len(tmps) != 0 {
				t.Fatalf("Open left temporary files: %v", tmps)
			}
		})
	}
}

func crashChild(dir, mode string) {
	ctx := context.Background()
	d, err := Open(dir)
	if err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	if err := d.Put(ctx, datastore.NewKey("/CIQGOOD"), bytes.Repeat([]byte("g"), 1<<20)); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	value := bytes.Repeat([]byte("c"), 1<<20)
	testHookBeforeRename = func(tmp string) {
		if mode == "half" {
			// As if killed halfway through the write.
			if err := os.Truncate(tmp, int64(len(value)/2)); err != nil {
				fmt.Println(err)
				os.Exit(1)
			}
		}
		os.Exit(3)
	}
	d.Put(ctx, datastore.NewKey("/CIQCRASH"), value)
	fmt.Println("not crashed")
	os.Exit(1)
}
