// Package dsjson keeps plain records as JSON in a go-datastore: each
// written and synced on its own (Put), all those under a key read back in
// one pass (Load). It is what the coordinator's small durable stores
// (catalog, accounts) share; it owns no schema and no locking, and the
// coordinator's state, which needs group commit, goes through
// coordinator/journal instead.
package dsjson

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/query"
)

// Put writes v as JSON under k and syncs it: once Put returns nil, the
// record survives a crash.
func Put(ctx context.Context, ds datastore.Datastore, k datastore.Key, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", k, err)
	}
	if err := ds.Put(ctx, k, b); err != nil {
		return fmt.Errorf("store %s: %w", k, err)
	}
	if err := ds.Sync(ctx, k); err != nil {
		return fmt.Errorf("sync %s: %w", k, err)
	}
	return nil
}

// Load decodes every record below prefix (its children, not prefix
// itself) into each, in the datastore's order. The first record that does
// not decode as a T ends it with an error naming its key.
func Load[T any](ctx context.Context, ds datastore.Read, prefix datastore.Key, each func(T)) error {
	res, err := ds.Query(ctx, query.Query{Prefix: prefix.String() + "/"})
	if err != nil {
		return fmt.Errorf("query %s: %w", prefix, err)
	}
	defer res.Close()
	for e := range res.Next() {
		if e.Error != nil {
			return fmt.Errorf("query %s: %w", prefix, e.Error)
		}
		var v T
		if err := json.Unmarshal(e.Value, &v); err != nil {
			return fmt.Errorf("decode %s: %w", e.Key, err)
		}
		each(v)
	}
	return nil
}
