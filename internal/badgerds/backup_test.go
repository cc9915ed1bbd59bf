package badgerds

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"testing"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
)

func allEntries(t *testing.T, ds datastore.Datastore) map[string]string {
	t.Helper()
	res, err := ds.Query(context.Background(), query.Query{})
	if err != nil {
		t.Fatal(err)
	}
	rs, err := res.Rest()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, e := range rs {
		out[e.Key] = string(e.Value)
	}
	return out
}

// TestBackupLoad: a backup taken at one moment holds what was written
// before it and nothing written after (the moment is the at callback),
// deletes included, large values (value log) included; Load brings it back
// into a new folder and refuses a folder that has a badger already.
func TestBackupLoad(t *testing.T) {
	ctx := context.Background()
	log := slog.New(slog.DiscardHandler)
	ds, err := Open(t.TempDir(), log)
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	big := bytes.Repeat([]byte("v"), 2<<20) // past the value threshold: in the value log
	for i := range 500 {
		if err := ds.Put(ctx, datastore.NewKey(fmt.Sprintf("/state/a/%04d", i)), fmt.Appendf(nil, "value %d", i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := ds.Put(ctx, datastore.NewKey("/big"), big); err != nil {
		t.Fatal(err)
	}
	if err := ds.Delete(ctx, datastore.NewKey("/state/a/0007")); err != nil {
		t.Fatal(err)
	}
	want := allEntries(t, ds)
	var buf bytes.Buffer
	st, err := ds.Backup(ctx, &buf, func(begin func()) {
		begin()
		// Written after the moment: not in the backup.
		if err := ds.Put(ctx, datastore.NewKey("/state/after"), []byte("x")); err != nil {
			t.Error(err)
		}
		if err := ds.Delete(ctx, datastore.NewKey("/state/a/0001")); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if st.Entries != int64(len(want)) {
		t.Fatalf("backup has %d entries, want %d", st.Entries, len(want))
	}
	dir := t.TempDir()
	if err := Load(dir, bytes.NewReader(buf.Bytes()), log); err != nil {
		t.Fatal(err)
	}
	if err := Load(dir, bytes.NewReader(buf.Bytes()), log); err == nil {
		t.Fatal("Load into a folder holding a badger succeeded")
	}
	back, err := Open(dir, log)
	if err != nil {
		t.Fatal(err)
	}
	defer back.Close()
	got := allEntries(t, back)
	if len(got) != len(want) {
		t.Fatalf("restored %d entries, want %d", len(got), len(want))
	}
	for k, v := range want {
		if got[k] != v {
			t.Fatalf("restored %s = %.20q, want %.20q", k, got[k], v)
		}
	}
	if _, ok := got["/state/after"]; ok {
		t.Fatal("a write after the backup's moment is in it")
	}
	// The restored store takes new writes above the loaded versions.
	if err := back.Put(ctx, datastore.NewKey("/state/a/0002"), []byte("new")); err != nil {
		t.Fatal(err)
	}
	if v, err := back.Get(ctx, datastore.NewKey("/state/a/0002")); err != nil || string(v) != "new" {
		t.Fatalf("after a write: %q, %v", v, err)
	}
}
