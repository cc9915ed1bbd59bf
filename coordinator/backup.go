package coordinator

// Backups of a coordinator's data folder, and its schema version.
//
// A backup is a tar stream (`tar tf` lists it) of, in this order:
//
//	repronet-backup.json  the manifest: format, when, the coordinator's peer
//	                      ID, the folder's schema versions
//	identity.key          the coordinator's key (its peer ID, and the secret
//	                      its attempt IDs derive from): a backup is a secret
//	badger/NNNNNN         badger's backup stream (badgerds.Backup), cut into
//	                      pieces of about 8 MiB: every record (attempts,
//	                      evaluations, nodes, cross-check book, suites, gold
//	                      answers, accounts, join tokens, model ledger,
//	                      trajectory call records) and the capsule store's
//	                      index (its references), as one read transaction
//	                      taken between two journal commits saw them
//	blocks/KEY            every block file of the capsule store (content,
//	                      agent images, outputs, trajectory bodies), copied
//	                      after that read: blocks are written before the
//	                      records that name them and never deleted by a
//	                      running coordinator, so every block the records
//	                      need is there (blocks written since are extra)
//	repronet-backup-end.json  counts of the above: a backup without it was cut
//	                      short and is refused
//
// A running coordinator holds its folder's badger lock, so its backup is
// made inside it (Coordinator.Backup, served to the admin as GET
// /api/backup); a stopped one's by BackupFolder. Restore makes a new folder
// of a backup.

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/ipfs/go-datastore"
	"github.com/ipfs/go-datastore/namespace"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/capsulestore"
	"github.com/repronet/repronet/internal/badgerds"
	"github.com/repronet/repronet/internal/identity"
	"github.com/repronet/repronet/internal/schema"
)

// SchemaVersion is the version of the coordinator's records in its data
// folder (internal/schema). Version 1: the layout of every release so far.
const SchemaVersion = 1

// schemaParts are the parts of a coordinator's data folder.
func schemaParts() []schema.Part {
	return []schema.Part{{Name: "coordinator", Version: SchemaVersion}, capsulestore.Schema()}
}

// Names inside a backup.
const (
	backupManifest = "repronet-backup.json"
	backupEnd      = "repronet-backup-end.json"
	backupBadger   = "badger/"
	backupBlocks   = "blocks/"
	// BackupFormat names the format in the manifest.
	BackupFormat = "repronet coordinator backup"
	// backupFormatVersion is the version of this layout.
	backupFormatVersion = 1
	// backupPiece is about how much of badger's stream one tar entry holds.
	backupPiece = 8 << 20
)

// BackupManifest is a backup's first entry.
type BackupManifest struct {
	Format  string    `json:"format"`
	Version int       `json:"version"`
	Created time.Time `json:"created"`
	// Peer is the coordinator's peer ID.
	Peer string `json:"peer,omitempty"`
	// Schema is the folder's schema versions, by part.
	Schema map[string]int `json:"schema"`
	// Online: made by the running coordinator (else from a stopped folder).
	Online bool `json:"online"`
}

// BackupSummary counts what a backup holds (its last entry).
type BackupSummary struct {
	Records      int64 `json:"records"`
	RecordBytes  int64 `json:"record_bytes"`
	BadgerPieces int   `json:"badger_pieces"`
	Blocks       int64 `json:"blocks"`
	BlockBytes   int64 `json:"block_bytes"`
	// Vanished are block files listed but gone when read (none, unless
	// something removed blocks while the backup ran).
	Vanished int64 `json:"vanished,omitempty"`
}

// ErrRunning: the data folder is in use by a running coordinator (its
// badger lock is held); back it up through the coordinator's API.
var ErrRunning = errors.New("the data folder is in use by a running process")

// NotEmptyError: a restore's folder already holds something.
type NotEmptyError struct {
	Dir     string
	Entries []string
}

func (e *NotEmptyError) Error() string {
	return fmt.Sprintf("restore into %s refused: the folder is not empty (it holds %s); restore only into a new or empty folder, so that nothing is overwritten or mixed",
		e.Dir, strings.Join(e.Entries, ", "))
}

// Backup writes a backup of the running coordinator to w (see the top of
// this file): its records as of a moment between two journal commits,
// after every change made before the call is durable, then its block
// files, while it keeps running. A full disk (the journal holding
// changes) fails it.
func (c *Coordinator) Backup(ctx context.Context, w io.Writer) (BackupSummary, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return BackupSummary{}, errors.New("backup: the coordinator is closed")
	}
	c.wg.Add(1)
	c.mu.Unlock()
	defer c.wg.Done()
	ds, ok := c.ds.(*badgerds.Datastore)
	if !ok {
		return BackupSummary{}, fmt.Errorf("backup: the datastore is a %T, not badger", c.ds)
	}
	// Everything changed before the backup was asked for is in it.
	if err := c.journal.Flush().Wait(ctx); err != nil {
		return BackupSummary{}, fmt.Errorf("backup: %w", err)
	}
	at := func(begin func()) {
		c.journal.Between(begin)
		if c.backupBegun != nil {
			c.backupBegun()
		}
	}
	return writeBackup(ctx, w, c.cfg.DataDir, ds, at, c.host.ID().String(), true, c.log)
}

// handleBackup serves GET /api/backup (admin): the backup as a tar stream.
func (c *Coordinator) handleBackup(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	cw := &countingWriter{w: w, header: func() {
		w.Header().Set("Content-Type", "application/x-tar")
		w.Header().Set("Content-Disposition", `attachment; filename="repronet-coordinator-backup.tar"`)
		w.Header().Set("Cache-Control", "no-store")
	}}
	sum, err := c.Backup(r.Context(), cw)
	if err != nil {
		c.log.Warn("backup failed", "err", err)
		if cw.n == 0 {
			writeJSON(w, http.StatusServiceUnavailable, apiError{err.Error()})
		}
		// Else the status is sent: the stream ends without its last
		// entry, which a reader refuses.
		return
	}
	c.log.Info("backup served", "records", sum.Records, "blocks", sum.Blocks,
		"bytes", sum.RecordBytes+sum.BlockBytes, "took", time.Since(start).Round(time.Millisecond))
}

// countingWriter counts what goes through it, and calls header before
// the first write.
type countingWriter struct {
	w      io.Writer
	header func()
	n      int64
}

func (c *countingWriter) Write(b []byte) (int, error) {
	if c.n == 0 && c.header != nil {
		c.header()
	}
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// BackupFolder writes a backup of the stopped coordinator's data folder
// dir to w. It fails with an error wrapping ErrRunning when a process
// holds the folder; a folder whose schema is newer than this binary is
// refused (a *schema.TooNewError); the folder is not migrated.
func BackupFolder(ctx context.Context, dir string, w io.Writer, log *slog.Logger) (BackupSummary, error) {
	if log == nil {
		log = slog.Default()
	}
	if _, err := os.Stat(filepath.Join(dir, "badger")); err != nil {
		return BackupSummary{}, fmt.Errorf("backup: %s is not a coordinator's data folder: %w", dir, err)
	}
	f, _, err := schema.Read(dir)
	if err != nil {
		return BackupSummary{}, fmt.Errorf("backup: %w", err)
	}
	if err := schema.Check(dir, f, schemaParts()...); err != nil {
		return BackupSummary{}, fmt.Errorf("backup: %w", err)
	}
	ds, err := badgerds.Open(dir, log)
	if err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) || strings.Contains(err.Error(), "directory lock") {
			return BackupSummary{}, fmt.Errorf("backup %s: %w (%v)", dir, ErrRunning, err)
		}
		return BackupSummary{}, fmt.Errorf("backup: %w", err)
	}
	defer ds.Close()
	peerID := ""
	if b, err := os.ReadFile(filepath.Join(dir, identity.FileName)); err == nil {
		if k, err := crypto.UnmarshalPrivateKey(b); err == nil {
			if id, err := peer.IDFromPrivateKey(k); err == nil {
				peerID = id.String()
			}
		}
	}
	return writeBackup(ctx, w, dir, ds, nil, peerID, false, log)
}

func writeBackup(ctx context.Context, w io.Writer, dir string, ds *badgerds.Datastore, at func(func()), peerID string, online bool,
	log *slog.Logger) (BackupSummary, error) {
	var sum BackupSummary
	f, _, err := schema.Read(dir)
	if err != nil {
		return sum, fmt.Errorf("backup: %w", err)
	}
	parts := map[string]int{}
	for _, p := range schemaParts() {
		parts[p.Name] = f.Version(p.Name)
	}
	tw := tar.NewWriter(w)
	now := time.Now().UTC()
	m, _ := json.MarshalIndent(BackupManifest{Format: BackupFormat, Version: backupFormatVersion, Created: now, Peer: peerID,
		Schema: parts, Online: online}, "", "  ")
	if err := tarFile(tw, backupManifest, 0o644, now, m); err != nil {
		return sum, err
	}
	key, err := os.ReadFile(filepath.Join(dir, identity.FileName))
	if err != nil {
		return sum, fmt.Errorf("backup: identity key: %w", err)
	}
	if err := tarFile(tw, identity.FileName, 0o600, now, key); err != nil {
		return sum, err
	}
	pw := &pieceWriter{tw: tw, at: now}
	st, err := ds.Backup(ctx, pw, at)
	if err == nil {
		err = pw.flush()
	}
	if err != nil {
		return sum, fmt.Errorf("backup: records: %w", err)
	}
	sum.Records, sum.RecordBytes, sum.BadgerPieces = st.Entries, st.Bytes, pw.n
	if err := copyBlocks(ctx, tw, filepath.Join(dir, "blocks"), &sum); err != nil {
		return sum, err
	}
	end, _ := json.MarshalIndent(sum, "", "  ")
	if err := tarFile(tw, backupEnd, 0o644, now, end); err != nil {
		return sum, err
	}
	if err := tw.Close(); err != nil {
		return sum, fmt.Errorf("backup: %w", err)
	}
	return sum, nil
}

// tarFile writes one regular file entry.
func tarFile(tw *tar.Writer, name string, mode int64, at time.Time, b []byte) error {
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(b)), ModTime: at}); err != nil {
		return fmt.Errorf("backup: write %s: %w", name, err)
	}
	if _, err := tw.Write(b); err != nil {
		return fmt.Errorf("backup: write %s: %w", name, err)
	}
	return nil
}

// pieceWriter cuts badger's stream into tar entries of about backupPiece
// bytes (an entry's size goes before its bytes).
type pieceWriter struct {
	tw  *tar.Writer
	at  time.Time
	buf bytes.Buffer
	n   int
}

func (p *pieceWriter) Write(b []byte) (int, error) {
	p.buf.Write(b)
	if p.buf.Len() >= backupPiece {
		if err := p.flush(); err != nil {
			return 0, err
		}
	}
	return len(b), nil
}

func (p *pieceWriter) flush() error {
	if p.buf.Len() == 0 {
		return nil
	}
	p.n++
	err := tarFile(p.tw, fmt.Sprintf("%s%06d", backupBadger, p.n), 0o600, p.at, p.buf.Bytes())
	p.buf.Reset()
	return err
}

// copyBlocks writes every block file of dir.
func copyBlocks(ctx context.Context, tw *tar.Writer, dir string, sum *BackupSummary) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup: list blocks: %w", err)
	}
	for _, e := range ents {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if !e.Type().IsRegular() || !validBlockName(e.Name()) {
			continue
		}
		if err := copyBlock(tw, filepath.Join(dir, e.Name()), e.Name(), sum); err != nil {
			return err
		}
	}
	return nil
}

func copyBlock(tw *tar.Writer, path, name string, sum *BackupSummary) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		sum.Vanished++
		return nil
	}
	if err != nil {
		return fmt.Errorf("backup: block %s: %w", name, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return fmt.Errorf("backup: block %s: %w", name, err)
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: backupBlocks + name, Mode: 0o644, Size: info.Size(),
		ModTime: info.ModTime()}); err != nil {
		return fmt.Errorf("backup: block %s: %w", name, err)
	}
	// A block file is written whole and renamed into place: its size does
	// not change under us.
	if _, err := io.CopyN(tw, f, info.Size()); err != nil {
		return fmt.Errorf("backup: block %s: %w", name, err)
	}
	sum.Blocks++
	sum.BlockBytes += info.Size()
	return nil
}

// validBlockName: what blockfs names a block file ([A-Za-z0-9_+=-]).
func validBlockName(s string) bool {
	if s == "" || len(s) > 255 {
		return false
	}
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '+' || r == '=' || r == '-'
		if !ok {
			return false
		}
	}
	return true
}

// RestoreSummary is what Restore brought back.
type RestoreSummary struct {
	Manifest BackupManifest `json:"manifest"`
	BackupSummary
	// Files are the capsule store's files (content, images, outputs,
	// trajectory bodies) checked block by block after the restore;
	// Incomplete those the source itself held only in part (fetches under
	// way), not checked.
	Files      int `json:"files"`
	Incomplete int `json:"incomplete,omitempty"`
}

// Restore makes the data folder dir (new, or empty) of the backup read
// from r, and checks it: every block of every complete file of the
// capsule store present and sound. A folder that holds anything is
// refused (*NotEmptyError) and left alone; a backup cut short, of another
// format, or of a schema newer than this binary, is refused, and what was
// written of it removed. Start a coordinator on dir afterwards (with the
// same flags as the original's); its peer ID is the original's.
func Restore(ctx context.Context, r io.Reader, dir string, log *slog.Logger) (sum RestoreSummary, err error) {
	if log == nil {
		log = slog.Default()
	}
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return sum, fmt.Errorf("restore: %w", err)
	case len(ents) > 0:
		e := &NotEmptyError{Dir: dir}
		for _, d := range ents[:min(len(ents), 5)] {
			e.Entries = append(e.Entries, d.Name())
		}
		if len(ents) > 5 {
			e.Entries = append(e.Entries, fmt.Sprintf("%d more", len(ents)-5))
		}
		return sum, e
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return sum, fmt.Errorf("restore: %w", err)
	}
	defer func() {
		if err != nil {
			// Nothing of a failed restore stays: the folder was empty.
			if ents, rerr := os.ReadDir(dir); rerr == nil {
				for _, e := range ents {
					_ = os.RemoveAll(filepath.Join(dir, e.Name()))
				}
			}
		}
	}()
	if err := unpack(ctx, r, dir, &sum, log); err != nil {
		return sum, err
	}
	if err := schema.Write(dir, schema.File{Parts: sum.Manifest.Schema}); err != nil {
		return sum, fmt.Errorf("restore: %w", err)
	}
	if err := checkRestored(ctx, dir, &sum, log); err != nil {
		return sum, err
	}
	return sum, nil
}

// unpack reads the backup into dir.
func unpack(ctx context.Context, r io.Reader, dir string, sum *RestoreSummary, log *slog.Logger) error {
	tr := tar.NewReader(r)
	next := func() (*tar.Header, error) {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, errors.New("restore: the backup ends before its last entry (" + backupEnd + "): it was cut short")
		}
		if err != nil {
			return nil, fmt.Errorf("restore: read the backup: %w", err)
		}
		return h, nil
	}
	h, err := next()
	if err != nil {
		return err
	}
	if h.Name != backupManifest || h.Size > 1<<20 {
		return fmt.Errorf("restore: not a %s (first entry %q)", BackupFormat, h.Name)
	}
	if err := readJSON(tr, h.Size, &sum.Manifest); err != nil {
		return fmt.Errorf("restore: manifest: %w", err)
	}
	m := sum.Manifest
	if m.Format != BackupFormat || m.Version != backupFormatVersion {
		return fmt.Errorf("restore: a backup of format %q version %d; this binary reads %q version %d", m.Format, m.Version, BackupFormat, backupFormatVersion)
	}
	if m.Schema == nil {
		return errors.New("restore: the manifest names no schema versions")
	}
	if err := schema.Check(dir, schema.File{Parts: m.Schema}, schemaParts()...); err != nil {
		return fmt.Errorf("restore: the backup's %w", err)
	}
	// badger's stream goes through a pipe into Load, piece after piece.
	var pw *io.PipeWriter
	var loaded chan error
	endRecords := func() error {
		if pw == nil {
			return nil
		}
		pw.Close()
		err := <-loaded
		pw = nil
		if err != nil {
			return fmt.Errorf("restore: records: %w", err)
		}
		return nil
	}
	defer func() {
		if pw != nil {
			pw.CloseWithError(errors.New("restore abandoned"))
			<-loaded
		}
	}()
	blockDir := filepath.Join(dir, "blocks")
	for {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		h, err := next()
		if err != nil {
			return err
		}
		switch name := h.Name; {
		case name == identity.FileName:
			b, err := io.ReadAll(io.LimitReader(tr, 1<<16))
			if err == nil {
				_, err = crypto.UnmarshalPrivateKey(b)
			}
			if err == nil {
				err = writeFileSync(filepath.Join(dir, identity.FileName), bytes.NewReader(b), 0o600)
			}
			if err != nil {
				return fmt.Errorf("restore: identity key: %w", err)
			}
		case strings.HasPrefix(name, backupBadger):
			if pw == nil {
				if sum.BadgerPieces > 0 {
					return fmt.Errorf("restore: badger piece %s out of order", name)
				}
				var pr *io.PipeReader
				pr, pw = io.Pipe()
				loaded = make(chan error, 1)
				go func() {
					err := badgerds.Load(dir, pr, log)
					pr.CloseWithError(err)
					loaded <- err
				}()
			}
			sum.BadgerPieces++
			if _, err := io.Copy(pw, tr); err != nil {
				return fmt.Errorf("restore: records: %w", err)
			}
		case strings.HasPrefix(name, backupBlocks):
			if err := endRecords(); err != nil {
				return err
			}
			key := strings.TrimPrefix(name, backupBlocks)
			if !validBlockName(key) {
				return fmt.Errorf("restore: bad block name %q", name)
			}
			if sum.Blocks == 0 {
				if err := os.MkdirAll(blockDir, 0o755); err != nil {
					return fmt.Errorf("restore: %w", err)
				}
			}
			if err := writeFileSync(filepath.Join(blockDir, key), tr, 0o644); err != nil {
				return fmt.Errorf("restore: block %s: %w", key, err)
			}
			sum.Blocks++
			sum.BlockBytes += h.Size
		case name == backupEnd:
			if err := endRecords(); err != nil {
				return err
			}
			var want BackupSummary
			if err := readJSON(tr, h.Size, &want); err != nil {
				return fmt.Errorf("restore: %s: %w", backupEnd, err)
			}
			if want.Blocks != sum.Blocks || want.BlockBytes != sum.BlockBytes || want.BadgerPieces != sum.BadgerPieces {
				return fmt.Errorf("restore: the backup says %d blocks (%d bytes) and %d record pieces, it held %d (%d bytes) and %d",
					want.Blocks, want.BlockBytes, want.BadgerPieces, sum.Blocks, sum.BlockBytes, sum.BadgerPieces)
			}
			sum.Records, sum.RecordBytes, sum.Vanished = want.Records, want.RecordBytes, want.Vanished
			if _, err := os.Stat(filepath.Join(dir, identity.FileName)); err != nil {
				return fmt.Errorf("restore: the backup holds no identity key: %w", err)
			}
			return nil
		default:
			return fmt.Errorf("restore: unknown entry %q in the backup", name)
		}
	}
}

func readJSON(r io.Reader, size int64, v any) error {
	b, err := io.ReadAll(io.LimitReader(r, size))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// writeFileSync writes r to path (whole, synced, renamed into place).
func writeFileSync(path string, r io.Reader, mode os.FileMode) error {
	tmp := filepath.Join(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, mode)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
	}
	return err
}

// checkRestored opens the restored folder's capsule store offline and
// verifies every complete file, block by block.
func checkRestored(ctx context.Context, dir string, sum *RestoreSummary, log *slog.Logger) error {
	ds, err := badgerds.Open(dir, log)
	if err != nil {
		return fmt.Errorf("restore: check: %w", err)
	}
	defer ds.Close()
	store, err := capsulestore.Open(ctx, namespace.Wrap(ds, datastore.NewKey("/blocks")), nil, capsulestore.WithLogger(log),
		capsulestore.WithBlockDir(filepath.Join(dir, "blocks")))
	if err != nil {
		return fmt.Errorf("restore: check: %w", err)
	}
	defer store.Close()
	list, err := store.List(ctx)
	if err != nil {
		return fmt.Errorf("restore: check: %w", err)
	}
	var bad []string
	for _, e := range list {
		if !e.Complete {
			sum.Incomplete++
			continue
		}
		if _, err := store.Verify(ctx, e.CID); err != nil {
			bad = append(bad, fmt.Sprintf("%s (%s): %v", e.CID, e.Name, err))
			continue
		}
		sum.Files++
	}
	if len(bad) > 0 {
		return fmt.Errorf("restore: check: %d of the capsule store's files are incomplete: %s", len(bad), strings.Join(bad[:min(len(bad), 5)], "; "))
	}
	return nil
}

// CheckBackup reads a whole backup from r and checks its structure: the
// manifest first, its format and schema readable by this binary, and the
// last entry present with counts that match what came before. It writes
// nothing.
func CheckBackup(r io.Reader) (BackupManifest, BackupSummary, error) {
	var m BackupManifest
	var got BackupSummary
	tr := tar.NewReader(r)
	for i := 0; ; i++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return m, got, errors.New("backup: it ends before its last entry (" + backupEnd + "): it was cut short")
		}
		if err != nil {
			return m, got, fmt.Errorf("backup: read: %w", err)
		}
		switch {
		case i == 0:
			if h.Name != backupManifest || h.Size > 1<<20 {
				return m, got, fmt.Errorf("backup: not a %s (first entry %q)", BackupFormat, h.Name)
			}
			if err := readJSON(tr, h.Size, &m); err != nil {
				return m, got, fmt.Errorf("backup: manifest: %w", err)
			}
			if m.Format != BackupFormat || m.Version != backupFormatVersion {
				return m, got, fmt.Errorf("backup: format %q version %d; this binary reads %q version %d", m.Format, m.Version, BackupFormat, backupFormatVersion)
			}
		case strings.HasPrefix(h.Name, backupBadger):
			got.BadgerPieces++
		case strings.HasPrefix(h.Name, backupBlocks):
			got.Blocks++
			got.BlockBytes += h.Size
		case h.Name == backupEnd:
			var want BackupSummary
			if err := readJSON(tr, h.Size, &want); err != nil {
				return m, got, fmt.Errorf("backup: %s: %w", backupEnd, err)
			}
			if want.Blocks != got.Blocks || want.BlockBytes != got.BlockBytes || want.BadgerPieces != got.BadgerPieces {
				return m, got, fmt.Errorf("backup: it says %d blocks and %d record pieces, it holds %d and %d", want.Blocks, want.BadgerPieces, got.Blocks, got.BadgerPieces)
			}
			return m, want, nil
		}
	}
}
