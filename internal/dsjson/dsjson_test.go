package dsjson

import (
	"context"
	"strings"
	"testing"

	"github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
)

type rec struct {
	Name string `json:"name"`
	N    int    `json:"n"`
}

// TestPutLoad: records put under a key are loaded back, those of a
// sibling key are not, and a record that does not decode is named.
func TestPutLoad(t *testing.T) {
	ctx := context.Background()
	ds := dssync.MutexWrap(datastore.NewMapDatastore())
	for _, r := range []rec{{"a", 1}, {"b", 2}} {
		if err := Put(ctx, ds, datastore.NewKey("/recs").ChildString(r.Name), r); err != nil {
			t.Fatal(err)
		}
	}
	if err := Put(ctx, ds, datastore.NewKey("/recsx/c"), rec{"c", 3}); err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	if err := Load(ctx, ds, datastore.NewKey("/recs"), func(r rec) { got[r.Name] = r.N }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got["a"] != 1 || got["b"] != 2 {
		t.Fatalf("loaded %v, want a:1 and b:2 only", got)
	}
	if err := Put(ctx, ds, datastore.NewKey("/recs/bad"), make(chan int)); err == nil || !strings.Contains(err.Error(), "/recs/bad") {
		t.Fatalf("put of a value JSON cannot encode: %v", err)
	}
	if err := ds.Put(ctx, datastore.NewKey("/recs/junk"), []byte("{")); err != nil {
		t.Fatal(err)
	}
	if err := Load(ctx, ds, datastore.NewKey("/recs"), func(rec) {}); err == nil || !strings.Contains(err.Error(), "/recs/junk") {
		t.Fatalf("load over a record that is not JSON: %v", err)
	}
}
