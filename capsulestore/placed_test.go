package capsulestore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ipfs/boxo/bitswap"
	"github.com/ipfs/boxo/bitswap/network/bsnet"
	"github.com/ipfs/boxo/blockstore"
	chunker "github.com/ipfs/boxo/chunker"
	"github.com/ipfs/boxo/ipld/merkledag"
	"github.com/ipfs/boxo/ipld/unixfs/importer/balanced"
	"github.com/ipfs/boxo/ipld/unixfs/importer/helpers"
	blocks "github.com/ipfs/go-block-format"
	"github.com/ipfs/go-cid"
	"github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"
)

// TestWriteToPlacesLeaves: WriteTo writes the leaves into the output file
// only (the block folder gets the root alone), the store serves them from
// there, also after a restart, refuses a leaf the user changed, and Repair
// fetches that one into the store.
func TestWriteToPlacesLeaves(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := filepath.Join(t.TempDir(), "blocks")
	a := newTestStore(t)
	b := newTestStore(t, WithBlockDir(dir), WithStallTimeout(20*time.Second))
	const size = 6*mib + 4321
	info, err := a.Add(ctx, fastReader(77, size))
	if err != nil {
		t.Fatal(err)
	}
	connect(t, b.host, a.host)
	out := filepath.Join(t.TempDir(), "capsule.bin")
	if err := b.WriteTo(ctx, info.CID, out, nil); err != nil {
		t.Fatalf("WriteTo: %v", err)
	}
	if got := fileSHA256(t, out); got != info.SHA256 {
		t.Fatalf("sha256 %s, want %s", got, info.SHA256)
	}
	if fi, err := os.Stat(out); err != nil || fi.Size() != size || fi.Mode().Perm() != 0o644 {
		t.Fatalf("output %v, %v: want %d bytes, mode 0644", fi, err, size)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1 { // the root; the 7 leaves are in out
		t.Fatalf("%d block files after WriteTo, want only the root: %v", len(files), files)
	}
	if ok, err := b.Has(ctx, info.CID); !ok || err != nil {
		t.Fatalf("Has after WriteTo: %v, %v", ok, err)
	}

	// b serves c from the placed file (a is gone).
	a.Close()
	c := newTestStore(t, WithStallTimeout(20*time.Second))
	connect(t, c.host, b.host)
	if err := c.Fetch(ctx, info.CID, nil); err != nil {
		t.Fatalf("fetch from the placed file: %v", err)
	}
	checkFile(t, c.Store, info)

	// After a restart b still knows where the leaves are.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	b2, err := Open(ctx, b.ds, nil, WithLogger(testLogger(t)), WithBlockDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	checkFile(t, b2, info)

	// The user changes a byte of the third leaf: b2 no longer has it.
	f, err := os.OpenFile(out, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte{'!'}, 2*mib+5); err != nil {
		t.Fatal(err)
	}
	f.Close()
	rep, err := b2.Verify(ctx, info.CID)
	if !errors.Is(err, ErrCorrupt) || len(rep.Missing) != 1 {
		t.Fatalf("Verify after the file changed: %+v, %v; want one leaf missing", rep, err)
	}
	// Verify forgot it: the (offline) store no longer has the file.
	if ok, err := b2.Has(ctx, info.CID); ok || err != nil {
		t.Fatalf("Has with a changed leaf: %v, %v", ok, err)
	}
	if _, err := b2.Open(ctx, info.CID); !errors.Is(err, ErrOffline) {
		t.Fatalf("Open with a changed leaf: %v, want ErrOffline", err)
	}

	// Repaired from a peer that has it: into the store this time.
	h := newHost(t)
	t.Cleanup(func() { h.Close() })
	b3ds := b.ds
	if err := b2.Close(); err != nil {
		t.Fatal(err)
	}
	b3, err := Open(ctx, b3ds, h, WithLogger(testLogger(t)), WithBlockDir(dir), WithStallTimeout(20*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer b3.Close()
	connect(t, h, c.host)
	rep, err = b3.Repair(ctx, info.CID)
	if err != nil || !rep.OK() {
		t.Fatalf("Repair: %+v, %v", rep, err)
	}
	checkFile(t, b3, info)

	// Removing the file from the store leaves the user's file alone.
	if err := b3.Remove(ctx, info.CID); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("Remove touched the placed file: %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 0 {
		t.Fatalf("block files left after Remove: %v", files)
	}
}

// TestWriteToCopiesLocal: a file already in the store is written out from
// it, and a file partly in the store gets the rest from a peer.
func TestWriteToCopiesLocal(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := newTestStore(t)
	b := newTestStore(t, WithStallTimeout(20*time.Second))
	info, err := a.Add(ctx, fastReader(78, 5*mib+99))
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "a.bin")
	if err := a.WriteTo(ctx, info.CID, out, nil); err != nil {
		t.Fatalf("WriteTo of a local file: %v", err)
	}
	if got := fileSHA256(t, out); got != info.SHA256 {
		t.Fatalf("sha256 %s, want %s", got, info.SHA256)
	}
	connect(t, b.host, a.host)
	if err := b.Fetch(ctx, info.CID, nil); err != nil {
		t.Fatal(err)
	}
	leaves, err := b.localBlocks(ctx, info.CID)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for l := range leaves {
		if l.Type() == cid.Raw && n < 3 {
			if err := b.bstore.DeleteBlock(ctx, l); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	out2 := filepath.Join(t.TempDir(), "b.bin")
	if err := b.WriteTo(ctx, info.CID, out2, nil); err != nil {
		t.Fatalf("WriteTo of a partly local file: %v", err)
	}
	if got := fileSHA256(t, out2); got != info.SHA256 {
		t.Fatalf("sha256 %s, want %s", got, info.SHA256)
	}
}

// lyingBlockstore serves every raw leaf with one byte changed.
type lyingBlockstore struct{ blockstore.Blockstore }

func (l lyingBlockstore) Get(ctx context.Context, c cid.Cid) (blocks.Block, error) {
	blk, err := l.Blockstore.Get(ctx, c)
	if err != nil || c.Type() != cid.Raw {
		return blk, err
	}
	b := bytes.Clone(blk.RawData())
	b[len(b)/2] ^= 0xff
	return blocks.NewBlockWithCid(b, c)
}

// TestCorruptBlockRefused: a peer that sends wrong bytes for the leaves it
// is asked for gets nothing written, to the store or to the output file:
// the fetch stalls, leaves no file, and succeeds once an honest peer is
// there too (the liar still connected).
func TestCorruptBlockRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	src := newTestStore(t)
	info, err := src.Add(ctx, fastReader(79, 4*mib+1))
	if err != nil {
		t.Fatal(err)
	}
	// The liar: boxo's stock bitswap over a blockstore that holds the
	// file but changes every leaf as it reads it.
	h := newHost(t)
	t.Cleanup(func() { h.Close() })
	bstore := blockstore.NewBlockstore(dssync.MutexWrap(datastore.NewMapDatastore()))
	blks, err := src.localBlocks(ctx, info.CID)
	if err != nil {
		t.Fatal(err)
	}
	for c := range blks {
		blk, err := src.bstore.Get(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := bstore.Put(ctx, blk); err != nil {
			t.Fatal(err)
		}
	}
	liar := bitswap.New(ctx, bsnet.NewFromIpfsHost(h), nil, lyingBlockstore{bstore})
	t.Cleanup(func() { liar.Close() })

	for _, mode := range []string{"WriteTo", "Fetch"} {
		t.Run(mode, func(t *testing.T) {
			b := newTestStore(t, WithStallTimeout(5*time.Second))
			connect(t, b.host, h)
			dir := t.TempDir()
			out := filepath.Join(dir, "out.bin")
			get := func() error {
				if mode == "WriteTo" {
					return b.WriteTo(ctx, info.CID, out, nil)
				}
				return b.Fetch(ctx, info.CID, nil)
			}
			if err := get(); !errors.Is(err, ErrStalled) {
				t.Fatalf("with only the liar: %v, want ErrStalled", err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Fatalf("a failed WriteTo left %d files", len(ents))
			}
			for c := range blks {
				if c.Type() == cid.Raw {
					if ok, _ := b.bstore.Has(ctx, c); ok {
						t.Fatalf("a changed leaf %s is in the store", c)
					}
				}
			}
			connect(t, b.host, src.host)
			if err := get(); err != nil {
				t.Fatalf("with an honest peer too: %v", err)
			}
			if mode == "WriteTo" {
				if got := fileSHA256(t, out); got != info.SHA256 {
					t.Fatalf("sha256 %s, want %s", got, info.SHA256)
				}
			} else {
				checkFile(t, b.Store, info)
			}
		})
	}
}

// TestWriteToShapes: WriteTo puts every byte at its offset for DAGs other
// than the profile's: several levels of small nodes, and Kubo's older
// layout (CIDv0, dag-pb leaves holding the data, so the bytes come from
// blocks the store keeps rather than from placed leaves).
func TestWriteToShapes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	data := randBytes(81, 50_000+17)
	want := sha256.Sum256(data)

	deep := newTestStore(t, withDAGShape(1000, 3))
	deepInfo, err := deep.Add(ctx, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}

	old := newTestStore(t)
	db, err := (&helpers.DagBuilderParams{
		Maxlinks:   helpers.DefaultLinksPerBlock,
		RawLeaves:  false,
		CidBuilder: merkledag.V0CidPrefix(),
		Dagserv:    old.dag,
	}).New(chunker.NewSizeSplitter(bytes.NewReader(data), 4096))
	if err != nil {
		t.Fatal(err)
	}
	root, err := balanced.Layout(db)
	if err != nil {
		t.Fatal(err)
	}

	for name, c := range map[string]struct {
		src  *testStore
		root cid.Cid
	}{"deep": {deep, deepInfo.CID}, "dag-pb leaves": {old, root.Cid()}} {
		t.Run(name, func(t *testing.T) {
			b := newTestStore(t, WithStallTimeout(20*time.Second))
			connect(t, b.host, c.src.host)
			out := filepath.Join(t.TempDir(), "out.bin")
			if err := b.WriteTo(ctx, c.root, out, nil); err != nil {
				t.Fatalf("WriteTo: %v", err)
			}
			got, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(data) || sha256.Sum256(got) != want {
				t.Fatalf("wrote %d bytes that differ from the %d of the file", len(got), len(data))
			}
			// b serves what it placed to a third store.
			d := newTestStore(t, WithStallTimeout(20*time.Second))
			connect(t, d.host, b.host)
			c.src.Close()
			out2 := filepath.Join(t.TempDir(), "out2.bin")
			if err := d.WriteTo(ctx, c.root, out2, nil); err != nil {
				t.Fatalf("WriteTo from the placed copy: %v", err)
			}
			if got, _ := os.ReadFile(out2); sha256.Sum256(got) != want {
				t.Fatal("the copy fetched from the placed file differs")
			}
		})
	}
}
