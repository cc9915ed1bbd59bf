package capsulestore

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipfs/go-datastore/query"
)

// TestBlockDir: with WithBlockDir the blocks are files and the datastore
// holds only the index; such a store fetches from, and serves to, a store
// that keeps its blocks in badger, and finds its blocks again after a
// restart.
func TestBlockDir(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "blocks")
	a := newTestStore(t)
	b := newTestStore(t, WithBlockDir(dir), WithStallTimeout(20*time.Second))
	c := newTestStore(t, WithStallTimeout(20*time.Second))
	const size = 5*mib + 777
	info, err := a.Add(ctx, fastReader(9, size))
	if err != nil {
		t.Fatal(err)
	}
	connect(t, b.host, a.host)
	if err := b.Fetch(ctx, info.CID, nil); err != nil {
		t.Fatal(err)
	}
	rep, err := b.Verify(ctx, info.CID)
	if err != nil {
		t.Fatalf("verify: %v (%+v)", err, rep)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 7 { // 6 leaves and the root
		t.Fatalf("%d block files, want 7: %v", len(files), files)
	}
	res, err := b.ds.Query(ctx, query.Query{Prefix: "/blocks", KeysOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if es, _ := res.Rest(); len(es) != 0 {
		t.Fatalf("%d blocks in the datastore, want none", len(es))
	}

	// b serves c, which keeps its blocks in badger.
	connect(t, c.host, b.host)
	a.Close()
	out := filepath.Join(t.TempDir(), "out.bin")
	if err := c.WriteTo(ctx, info.CID, out, nil); err != nil {
		t.Fatal(err)
	}
	if got := fileSHA256(t, out); got != info.SHA256 {
		t.Fatalf("sha256 %s, want %s", got, info.SHA256)
	}

	// Reopened over the same datastore and folder, b still has the file.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2, err := Open(ctx, b.ds, nil, WithLogger(testLogger(t)), WithBlockDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	if ok, err := b2.Has(ctx, info.CID); !ok || err != nil {
		t.Fatalf("after reopen: has %v, %v", ok, err)
	}
	if e, err := b2.Stat(ctx, info.CID); err != nil || !e.Complete {
		t.Fatalf("after reopen: %+v, %v", e, err)
	}
	// Remove deletes the block files.
	if err := b2.Remove(ctx, info.CID); err != nil {
		t.Fatal(err)
	}
	files, _ = filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 0 {
		t.Fatalf("block files left after Remove: %v", files)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatal(err)
	}
}

// TestBlockDirMigrates: a store opened with WithBlockDir over a datastore
// that holds blocks moves them to files, and keeps the file's index entry.
func TestBlockDirMigrates(t *testing.T) {
	ctx := context.Background()
	ds := newBadger(t)
	t.Cleanup(func() { ds.Close() })
	s, err := Open(ctx, ds, nil, WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Add(ctx, fastReader(3, 3*mib+5))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "blocks")
	s2, err := Open(ctx, ds, nil, WithLogger(testLogger(t)), WithBlockDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	rep, err := s2.Verify(ctx, info.CID)
	if err != nil {
		t.Fatalf("verify after migration: %v (%+v)", err, rep)
	}
	if e, err := s2.Stat(ctx, info.CID); err != nil || !e.Complete || !e.Pinned {
		t.Fatalf("index after migration: %+v, %v", e, err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 5 { // 4 leaves and the root
		t.Fatalf("%d block files, want 5", len(files))
	}
	res, err := ds.Query(ctx, query.Query{Prefix: "/blocks", KeysOnly: true})
	if err != nil {
		t.Fatal(err)
	}
	if es, _ := res.Rest(); len(es) != 0 {
		t.Fatalf("%d blocks left in the datastore", len(es))
	}
}
