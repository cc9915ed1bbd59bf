package catalog

import (
	"context"
	"strings"
	"testing"

	"github.com/ipfs/go-datastore"
	dssync "github.com/ipfs/go-datastore/sync"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/bench/corebench/family"
	"github.com/repronet/repronet/bench/corebench/sample"
	"github.com/repronet/repronet/proto"
)

func TestCatalogRoundTrip(t *testing.T) {
	ctx := context.Background()
	ds := dssync.MutexWrap(datastore.NewMapDatastore())
	reg, err := bench.NewRegistry(family.New())
	if err != nil {
		t.Fatal(err)
	}
	defaults := &proto.Limits{CpuMillis: 1000, MemoryBytes: 4 << 30, WallSeconds: 2700}
	c, err := Open(ctx, ds, reg, defaults)
	if err != nil {
		t.Fatal(err)
	}
	def, err := family.Def("sample", sample.Tasks(), "", "")
	if err != nil {
		t.Fatal(err)
	}
	n, err := c.ImportSuite(ctx, def, WithSuiteLimits(SuiteLimits{WallSeconds: 60}))
	if err != nil || n != len(sample.CapsuleIDs()) {
		t.Fatalf("import: %d tasks, %v", n, err)
	}
	if _, err := c.ImportSuite(ctx, bench.SuiteDef{Name: "x", Family: "nope"}); err == nil {
		t.Fatal("a suite of an unknown family was imported")
	}
	if _, err := c.ImportSuite(ctx, def, WithSuiteLimits(SuiteLimits{Network: "host"})); err == nil ||
		!strings.Contains(err.Error(), `"host"`) {
		t.Fatalf("bad limits: %v", err)
	}
	if err := c.AddContent(ctx, Content{ID: "capsule-1", CID: "bafyc", Size: 10}); err != nil {
		t.Fatal(err)
	}
	if err := c.AddAgent(ctx, Agent{Name: "oracle", CID: "bafya", Size: 5}); err != nil {
		t.Fatal(err)
	}
	if err := c.Declare(ctx, Declared{Name: "oracle", Model: "m", Deterministic: true, NotReplayable: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.Declare(ctx, Declared{Name: "nobody"}); err == nil {
		t.Fatal("declared an unregistered agent")
	}

	// Everything survives a reopen.
	again, err := Open(ctx, ds, reg, defaults)
	if err != nil {
		t.Fatal(err)
	}
	si, ok := again.LookupSuite("sample")
	if !ok || si.Limits.GetWallSeconds() != 60 || si.Limits.GetCpuMillis() != 1000 || len(si.Tasks) != n {
		t.Fatalf("suite after reopen: %v %+v", ok, si.Limits)
	}
	if ag, ok := again.LookupAgent("oracle"); !ok || !ag.Deterministic || !ag.NotReplayable || ag.Model != "m" || ag.CID != "bafya" {
		t.Fatalf("agent after reopen: %+v", ag)
	}
	if x, ok := again.LookupContent("capsule-1"); !ok || x.CID != "bafyc" || x.Size != 10 {
		t.Fatalf("content after reopen: %+v", x)
	}
	if _, ok := again.LookupSuite("x"); ok {
		t.Fatal("a refused suite was stored")
	}
}
