package journal

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
	dssync "github.com/ipfs/go-datastore/sync"
)

// slowBatchDS commits a batch one write at a time, as badger does with a
// batch too large for one transaction.
type slowBatchDS struct{ datastore.Batching }

type slowBatch struct {
	ds  datastore.Batching
	ops []func(context.Context) error
}

func (d slowBatchDS) Batch(context.Context) (datastore.Batch, error) {
	return &slowBatch{ds: d.Batching}, nil
}

func (b *slowBatch) Put(_ context.Context, k datastore.Key, v []byte) error {
	b.ops = append(b.ops, func(ctx context.Context) error { return b.ds.Put(ctx, k, v) })
	return nil
}

func (b *slowBatch) Delete(_ context.Context, k datastore.Key) error {
	b.ops = append(b.ops, func(ctx context.Context) error { return b.ds.Delete(ctx, k) })
	return nil
}

func (b *slowBatch) Commit(ctx context.Context) error {
	for _, op := range b.ops {
		if err := op(ctx); err != nil {
			return err
		}
		time.Sleep(100 * time.Microsecond)
	}
	return nil
}

// TestBetween: what a reader sees inside Between holds whole batches
// only: the two records every critical section writes are both there or
// neither, although the datastore commits a batch write by write.
func TestBetween(t *testing.T) {
	ctx := context.Background()
	ds := slowBatchDS{dssync.MutexWrap(datastore.NewMapDatastore())}
	var mu sync.Mutex
	j := New(ds, datastore.NewKey("/state"), WithLock(&mu))
	defer j.Close()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			mu.Lock()
			j.Put(datastore.NewKey(fmt.Sprintf("/state/a/%d", i)), []byte("a"))
			t := j.Put(datastore.NewKey(fmt.Sprintf("/state/b/%d", i)), []byte("b"))
			mu.Unlock()
			if i%10 == 0 {
				_ = t.Wait(ctx)
			}
		}
	}()
	snapshots, seen := 0, 0
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); {
		var keys map[string]bool
		j.Between(func() {
			res, err := ds.Query(ctx, query.Query{KeysOnly: true})
			if err != nil {
				t.Error(err)
				return
			}
			all, _ := res.Rest()
			keys = map[string]bool{}
			for _, e := range all {
				keys[e.Key] = true
			}
		})
		snapshots++
		seen = len(keys)
		for k := range keys {
			var other string
			if n, ok := strings.CutPrefix(k, "/state/a/"); ok {
				other = "/state/b/" + n
			} else if n, ok := strings.CutPrefix(k, "/state/b/"); ok {
				other = "/state/a/" + n
			}
			if !keys[other] {
				t.Fatalf("snapshot %d holds %s without %s: half a batch", snapshots, k, other)
			}
		}
		time.Sleep(time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if seen < 100 {
		t.Fatalf("only %d records written: the test proves nothing", seen)
	}
	t.Logf("%d snapshots, the last of %d records", snapshots, seen)
}
