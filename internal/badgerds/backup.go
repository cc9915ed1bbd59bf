package badgerds

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/dgraph-io/badger/v4"
	"github.com/dgraph-io/badger/v4/pb"
	"google.golang.org/protobuf/proto"
)

// BackupStats counts what Backup wrote.
type BackupStats struct {
	// Entries are the keys written; Bytes their keys' and values' bytes.
	Entries int64 `json:"entries"`
	Bytes   int64 `json:"bytes"`
	// Version is badger's version of the read the backup is made of.
	Version uint64 `json:"version"`
}

// backupListBytes is about how much one KVList of a backup holds.
const backupListBytes = 4 << 20

// Backup writes every live entry of the datastore, as one read
// transaction sees it, to w in badger's backup format (that of DB.Backup:
// repeated little-endian uint64 lengths each followed by a protobuf
// pb.KVList), which Load and badger's own tools read. Badger's Stream
// reads with one transaction per goroutine, each at its own moment; this
// reads with one, so the backup is a single point in time.
//
// at, when not nil, is called with the function that opens that read
// transaction, and must call it once: the caller picks the moment (the
// coordinator: between two commits of its journal, so that no batch is
// half in the backup). The rest of the backup runs after at returns,
// while writes go on.
func (d *Datastore) Backup(ctx context.Context, w io.Writer, at func(begin func())) (BackupStats, error) {
	var txn *badger.Txn
	begin := func() { txn = d.db.DB.NewTransaction(false) }
	if at == nil {
		begin()
	} else {
		at(begin)
	}
	if txn == nil {
		return BackupStats{}, errors.New("badger backup: no read transaction was opened")
	}
	defer txn.Discard()
	st := BackupStats{Version: txn.ReadTs()}
	opts := badger.DefaultIteratorOptions
	opts.PrefetchValues = false
	it := txn.NewIterator(opts)
	defer it.Close()
	list := &pb.KVList{}
	size := 0
	flush := func() error {
		if len(list.Kv) == 0 {
			return nil
		}
		b, err := proto.Marshal(list)
		if err != nil {
			return fmt.Errorf("badger backup: encode: %w", err)
		}
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		if _, err := w.Write(n[:]); err != nil {
			return fmt.Errorf("badger backup: write: %w", err)
		}
		if _, err := w.Write(b); err != nil {
			return fmt.Errorf("badger backup: write: %w", err)
		}
		list, size = &pb.KVList{}, 0
		return nil
	}
	for it.Rewind(); it.Valid(); it.Next() {
		if err := ctx.Err(); err != nil {
			return st, fmt.Errorf("badger backup: %w", err)
		}
		item := it.Item()
		if item.IsDeletedOrExpired() {
			continue
		}
		val, err := item.ValueCopy(nil)
		if err != nil {
			return st, fmt.Errorf("badger backup: read %q: %w", item.Key(), err)
		}
		key := item.KeyCopy(nil)
		list.Kv = append(list.Kv, &pb.KV{Key: key, Value: val, UserMeta: []byte{item.UserMeta()},
			Version: item.Version(), ExpiresAt: item.ExpiresAt()})
		st.Entries++
		st.Bytes += int64(len(key) + len(val))
		if size += len(key) + len(val); size >= backupListBytes {
			if err := flush(); err != nil {
				return st, err
			}
		}
	}
	return st, flush()
}

// Load writes a backup made by Backup (or badger's DB.Backup) into a new
// badger datastore in dir/badger, which must not exist yet or be empty.
func Load(dir string, r io.Reader, log *slog.Logger) error {
	path := filepath.Join(dir, "badger")
	if ents, err := os.ReadDir(path); err == nil && len(ents) > 0 {
		return fmt.Errorf("load badger backup: %s is not empty", path)
	}
	d, err := Open(dir, log)
	if err != nil {
		return fmt.Errorf("load badger backup: %w", err)
	}
	loadErr := d.db.DB.Load(r, 256)
	if err := errors.Join(loadErr, d.Close()); err != nil {
		return fmt.Errorf("load badger backup into %s: %w", path, err)
	}
	return nil
}
