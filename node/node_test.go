package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	mh "github.com/multiformats/go-multihash"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/sandbox"
)

// idleSandbox never gets as far as running anything in these tests.
type idleSandbox struct{}

func (idleSandbox) KeyedImage(context.Context, string) (string, bool, error) { return "", false, nil }
func (idleSandbox) ImportKeyedImage(context.Context, string, io.Reader) (string, error) {
	return "", errors.New("no images here")
}
func (idleSandbox) CreateWorkspace(context.Context, string, int64) (*sandbox.Workspace, error) {
	return nil, errors.New("no workspaces here")
}
func (idleSandbox) Run(context.Context, sandbox.Spec) (sandbox.Result, error) {
	return sandbox.Result{}, errors.New("nothing runs here")
}
func (idleSandbox) ImportImage(context.Context, io.Reader) (string, error) {
	return "", errors.New("no images here")
}
func (idleSandbox) HasImage(context.Context, string) (bool, error) { return false, nil }
func (idleSandbox) PullImage(context.Context, string, sandbox.PullOptions) (string, error) {
	return "", errors.New("no images here")
}
func (idleSandbox) BuildEnvironment(context.Context, sandbox.BuildSpec) (sandbox.BuildResult, error) {
	return sandbox.BuildResult{}, errors.New("nothing is built here")
}
func (idleSandbox) ImageConfig(context.Context, string) (ocispec.ImageConfig, error) {
	return ocispec.ImageConfig{}, errors.New("no images here")
}

func newPeer(t *testing.T) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, _ := peer.IDFromPrivateKey(k)
	return k, id
}

// newTestNode starts a node whose coordinators are unreachable loopback
// addresses (it dials them and fails; nothing else leaves the machine).
func newTestNode(t *testing.T, slots int, mutate func(*Config)) (*Node, []peer.ID) {
	t.Helper()
	_, c1 := newPeer(t)
	_, c2 := newPeer(t)
	cfg := Config{
		DataDir: t.TempDir(), Slots: slots, Sandbox: idleSandbox{},
		Coordinators: []string{"/ip4/127.0.0.1/tcp/1/p2p/" + c1.String(), "/ip4/127.0.0.1/tcp/1/p2p/" + c2.String()},
		Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	if mutate != nil {
		mutate(&cfg)
	}
	n, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	return n, []peer.ID{c1, c2}
}

func testCID(t *testing.T, s string) []byte {
	t.Helper()
	h, err := mh.Sum([]byte(s), mh.SHA2_256, -1)
	if err != nil {
		t.Fatal(err)
	}
	return cid.NewCidV1(cid.Raw, h).Bytes()
}

// assignment is a job like a benchmark's: a tarball extracted, a prompt
// written, the image run in the workspace, report.json returned.
func assignment(t *testing.T, id string) *proto.Assignment {
	return &proto.Assignment{AttemptId: id, Suite: "s1", Group: "g1", Label: "task-1", Recipe: &proto.Recipe{
		ImageCid: testCID(t, "a"),
		Inputs:   []*proto.Input{{Cid: testCID(t, "c"), Extract: true, Top: "task-1"}},
		Edits:    []*proto.Edit{{Op: &proto.Edit_Write{Write: &proto.FileWrite{Path: "prompt.txt", Content: []byte("p")}}}},
		Env:      []string{"PROMPT_FILE=/workspace/prompt.txt"},
		Cwd:      "/workspace",
		Mounts:   []*proto.Mount{{Target: "/workspace"}},
		Limits:   &proto.Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, WallSeconds: 60},
		Outputs:  []*proto.Output{{Path: "report.json", MaxBytes: 1 << 20}},
	}}
}

func TestAdmit(t *testing.T) {
	n, coords := newTestNode(t, 2, func(c *Config) { c.Suites, c.Groups = []string{"s1"}, []string{"g1"} })
	_, stranger := newPeer(t)
	c1, c2 := coords[0], coords[1]
	steps := []struct {
		name   string
		from   peer.ID
		mutate func(*proto.Assignment)
		id     string
		want   proto.DeclineCode
		reason string
	}{
		{"not one of its coordinators", stranger, nil, "a1", proto.DeclineCode_DECLINE_NOT_SERVED, "not a coordinator"},
		{"unsafe attempt ID", c1, nil, "../x", proto.DeclineCode_DECLINE_INVALID, "attempt_id"},
		{"no recipe", c1, func(a *proto.Assignment) { a.Recipe = nil }, "a1", proto.DeclineCode_DECLINE_INVALID, "no recipe"},
		{"a recipe path out of the workspace", c1, func(a *proto.Assignment) { a.Recipe.Outputs[0].Path = "../../etc/shadow" }, "a1",
			proto.DeclineCode_DECLINE_INVALID, `".."`},
		{"suite not served", c1, func(a *proto.Assignment) { a.Suite = "s2" }, "a1", proto.DeclineCode_DECLINE_UNSUPPORTED, "suites"},
		{"group not served", c1, func(a *proto.Assignment) { a.Group = "g2" }, "a1", proto.DeclineCode_DECLINE_UNSUPPORTED, "groups"},
		{"over the slot shape", c1, func(a *proto.Assignment) { a.Recipe.Limits.CpuMillis = 2000 }, "a1", proto.DeclineCode_DECLINE_UNSUPPORTED, "exceed"},
		{"a GPU job on a node without GPUs", c1, func(a *proto.Assignment) { a.Recipe.Gpus = &proto.GPURequest{Count: 1} }, "a1",
			proto.DeclineCode_DECLINE_UNSUPPORTED, "GPU"},
		{"invalid allow rule", c1, func(a *proto.Assignment) { a.Recipe.Limits.Network, a.Recipe.Limits.Allow = "egress", []string{"nope"} },
			"a1", proto.DeclineCode_DECLINE_UNSUPPORTED, "limits.allow[0]"},
		{"first slot", c1, nil, "a1", proto.DeclineCode_DECLINE_UNSPECIFIED, ""},
		{"the same attempt again is accepted, not run twice", c1, nil, "a1", proto.DeclineCode_DECLINE_UNSPECIFIED, ""},
		{"same attempt ID from another coordinator", c2, nil, "a1", proto.DeclineCode_DECLINE_UNSPECIFIED, ""},
		{"no slot left", c1, nil, "a2", proto.DeclineCode_DECLINE_BUSY, "no free slot"},
	}
	for _, s := range steps {
		a := assignment(t, s.id)
		if s.mutate != nil {
			s.mutate(a)
		}
		code, reason := n.admit(s.from, a)
		if code != s.want || !strings.Contains(reason, s.reason) {
			t.Fatalf("%s: %s %q, want %s %q", s.name, code, reason, s.want, s.reason)
		}
	}
	n.mu.Lock()
	running := len(n.running)
	n.mu.Unlock()
	if running > 2 {
		t.Fatalf("%d attempts running on 2 slots", running)
	}
	n.Close()
	if code, _ := n.admit(c1, assignment(t, "a3")); code != proto.DeclineCode_DECLINE_STOPPING {
		t.Fatalf("after Close: %s", code)
	}
}

func TestAnnouncement(t *testing.T) {
	opKey, opID := newPeer(t)
	n, coords := newTestNode(t, 3, func(c *Config) { c.OperatorKey, c.Suites = opKey, []string{"s1"} })
	n.mu.Lock()
	n.running[runKey{coords[0], "x1"}] = func() {}
	n.running[runKey{coords[0], "x2"}] = func() {}
	const held = proto.MaxCachedKeys + 44
	for i := range held {
		c, _ := cid.Cast(testCID(t, fmt.Sprint(i)))
		n.cached[c.String()] = time.Unix(int64(1000+i), 0)
	}
	n.mu.Unlock()

	a := n.Announcement()
	if err := proto.ValidateAnnouncement(a, n.cfg.Network, n.ID(), time.Now()); err != nil {
		t.Fatalf("own announcement does not validate: %v", err)
	}
	if b, _ := gproto.Marshal(a); len(b) > proto.MaxAnnouncementSize {
		t.Fatalf("announcement of %d bytes", len(b))
	}
	if a.GetFreeSlots() != 1 || a.GetTotalSlots() != 3 || a.GetIncarnation() == 0 {
		t.Fatalf("slots %d/%d incarnation %d", a.GetFreeSlots(), a.GetTotalSlots(), a.GetIncarnation())
	}
	loads := map[peer.ID]uint32{}
	for _, l := range a.GetCoordinators() {
		id, _ := peer.IDFromBytes(l.GetPeerId())
		loads[id] = l.GetRunning()
	}
	if len(loads) != 2 || loads[coords[0]] != 2 || loads[coords[1]] != 0 {
		t.Fatalf("per-coordinator loads %v", loads)
	}
	if op, err := proto.OpenOperatorCert(a.GetOperatorCert(), n.ID(), n.cfg.Network); err != nil || op != opID {
		t.Fatalf("operator certificate: %v %v", op, err)
	}
	// The keys of the most recently used, newest first; no CID list.
	if len(a.GetCachedCapsules()) != 0 {
		t.Fatalf("%d cached capsule CIDs announced besides the keys", len(a.GetCachedCapsules()))
	}
	var newest [][]byte
	for i := held - 1; i >= held-proto.MaxCachedKeys; i-- {
		newest = append(newest, testCID(t, fmt.Sprint(i)))
	}
	if want := proto.CacheKeys(newest); !bytes.Equal(a.GetCachedKeys(), want) {
		t.Fatalf("cached_keys of %d bytes, want the %d keys of the most recently used (%d bytes)",
			len(a.GetCachedKeys()), proto.MaxCachedKeys, len(want))
	}
	oldest := testCID(t, "0")
	if got := proto.MatchCached(a.GetCachedKeys(), [][]byte{oldest, newest[0]}); len(got) != 1 || !bytes.Equal(got[0], newest[0]) {
		t.Fatalf("keys match %d of (least, most) recently used; want the most recently used only", len(got))
	}
	if !slices.Equal(a.GetSuites(), []string{"s1"}) {
		t.Fatalf("suites %v", a.GetSuites())
	}
}

// TestHostOptions: the configured libp2p options reach the node's host.
func TestHostOptions(t *testing.T) {
	applied := false
	newTestNode(t, 1, func(c *Config) {
		c.HostOptions = []libp2p.Option{func(*libp2p.Config) error { applied = true; return nil }}
	})
	if !applied {
		t.Fatal("HostOptions were not given to libp2p.New")
	}
	_, err := New(context.Background(), Config{DataDir: t.TempDir(), Sandbox: idleSandbox{},
		Coordinators: []string{"/ip4/127.0.0.1/tcp/1/p2p/" + newPeerID(t).String()},
		Logger:       slog.New(slog.DiscardHandler),
		HostOptions:  []libp2p.Option{func(*libp2p.Config) error { return errors.New("refused by the test") }}})
	if err == nil || !strings.Contains(err.Error(), "refused by the test") {
		t.Fatalf("New with a failing host option: %v", err)
	}
}

func newPeerID(t *testing.T) peer.ID {
	_, id := newPeer(t)
	return id
}
