package proto

import (
	"bytes"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/record"
	mh "github.com/multiformats/go-multihash"
	gproto "google.golang.org/protobuf/proto"
)

func newKey(t testing.TB) (crypto.PrivKey, peer.ID) {
	t.Helper()
	k, _, err := crypto.GenerateEd25519Key(nil)
	if err != nil {
		t.Fatal(err)
	}
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return k, id
}

func TestReportEnvelope(t *testing.T) {
	k, id := newKey(t)
	other, otherID := newKey(t)
	r := &Report{AttemptId: "at-1", NodePeerId: []byte(id), Outcome: Outcome_OUTCOME_OK, Detail: `{"q":1}`}

	env, err := SealReport(r, k)
	if err != nil {
		t.Fatal(err)
	}
	got, signer, err := OpenReport(env)
	if err != nil {
		t.Fatalf("OpenReport: %v", err)
	}
	if signer != id || got.GetAttemptId() != "at-1" || got.GetDetail() != r.Detail {
		t.Fatalf("round trip: signer %s report %v", signer, got)
	}

	// A report naming one node but signed by another.
	forged, err := SealReport(r, other)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := OpenReport(forged); err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), otherID.String()) {
		t.Fatalf("forged report: err = %v, want ErrInvalid naming the signer", err)
	}

	// Flipping any byte of the payload breaks the signature.
	tampered := bytes.Replace(env, []byte(`{"q":1}`), []byte(`{"q":2}`), 1)
	if bytes.Equal(tampered, env) {
		t.Fatal("test did not tamper")
	}
	if _, _, err := OpenReport(tampered); err == nil {
		t.Fatal("tampered report verified")
	}

	// A validly signed envelope of another domain is not a report.
	other2 := &otherDomain{payload: env}
	e2, err := record.Seal(other2, k)
	if err != nil {
		t.Fatal(err)
	}
	b2, _ := e2.Marshal()
	if _, _, err := OpenReport(b2); err == nil {
		t.Fatal("envelope of another domain accepted as a report")
	}
}

type otherDomain struct{ payload []byte }

func (*otherDomain) Domain() string                   { return "not-repronet" }
func (*otherDomain) Codec() []byte                    { return reportCodec }
func (o *otherDomain) MarshalRecord() ([]byte, error) { return o.payload, nil }
func (o *otherDomain) UnmarshalRecord(b []byte) error { o.payload = b; return nil }

func TestValidateAnnouncement(t *testing.T) {
	_, id := newKey(t)
	_, otherID := newKey(t)
	now := time.Unix(1_800_000_000, 0)
	capsule := cid.NewCidV1(cid.Raw, mustHash(t, "x")).Bytes()
	good := func() *Announcement {
		return &Announcement{Network: "net", PeerId: []byte(id), Seq: 1, UnixMillis: now.UnixMilli(),
			TotalSlots: 2, FreeSlots: 1, Slot: &SlotShape{CpuMillis: 1000, MemoryBytes: 4 << 30},
			CachedCapsules: [][]byte{capsule}, Incarnation: 7,
			Coordinators: []*CoordinatorLoad{{PeerId: []byte(otherID), Running: 1}}}
	}
	tests := []struct {
		name   string
		mutate func(a *Announcement)
		author peer.ID
		want   string
	}{
		{"valid", func(*Announcement) {}, id, ""},
		{"other network", func(a *Announcement) { a.Network = "x" }, id, "network"},
		{"author differs", func(*Announcement) {}, otherID, "signed by"},
		{"garbage peer id", func(a *Announcement) { a.PeerId = []byte("zz") }, id, "peer_id"},
		{"stale", func(a *Announcement) { a.UnixMillis = now.Add(-2 * time.Minute).UnixMilli() }, id, "away from local time"},
		{"future", func(a *Announcement) { a.UnixMillis = now.Add(2 * time.Minute).UnixMilli() }, id, "away from local time"},
		{"free over total", func(a *Announcement) { a.FreeSlots = 3 }, id, "free of"},
		{"too many slots", func(a *Announcement) { a.TotalSlots = MaxSlots + 1 }, id, "slots"},
		{"no shape", func(a *Announcement) { a.Slot = nil }, id, "slot shape"},
		{"bad cid", func(a *Announcement) { a.CachedCapsules = [][]byte{{1, 2, 3}} }, id, "cached_capsules[0]"},
		{"too many cids", func(a *Announcement) {
			for range MaxCachedCapsules {
				a.CachedCapsules = append(a.CachedCapsules, capsule)
			}
		}, id, "cached capsules"},
		{"cached keys", func(a *Announcement) { a.CachedKeys = make([]byte, MaxCachedKeys*CacheKeyLen) }, id, ""},
		{"cached keys cut short", func(a *Announcement) { a.CachedKeys = make([]byte, 2*CacheKeyLen+1) }, id, "cached_keys"},
		{"too many cached keys", func(a *Announcement) { a.CachedKeys = make([]byte, (MaxCachedKeys+1)*CacheKeyLen) }, id, "cached_keys"},
		{"running over total", func(a *Announcement) { a.Coordinators[0].Running = 2 }, id, "running"},
		{"bad coordinator id", func(a *Announcement) { a.Coordinators[0].PeerId = []byte("x") }, id, "coordinators[0]"},
		{"empty suite name", func(a *Announcement) { a.Suites = []string{""} }, id, "suites[0]"},
		{"a NUL in a suite name", func(a *Announcement) { a.Suites = []string{"core\x00bench"} }, id, "suites[0]"},
		{"a control character in a group name", func(a *Announcement) { a.Groups = []string{"lab\x1b[31m"} }, id, "not printable"},
		{"a group name that is not UTF-8", func(a *Announcement) { a.Groups = []string{"lab\xff"} }, id, "not printable"},
		{"too many groups", func(a *Announcement) { a.Groups = make([]string, MaxFilters+1) }, id, "groups"},
		{"no incarnation", func(a *Announcement) { a.Incarnation = 0 }, id, "incarnation"},
		{"huge cert", func(a *Announcement) { a.OperatorCert = make([]byte, MaxOperatorCertSize+1) }, id, "operator certificate"},
		// Found live: ~3.8 KB version and arch strings, logged verbatim.
		{"huge version", func(a *Announcement) { a.Version = strings.Repeat("v", 3800) }, id, "version must be"},
		{"version with a newline", func(a *Announcement) { a.Version = "1.0\nlevel=ERROR msg=forged" }, id, "version must be"},
		{"arch with a space", func(a *Announcement) { a.Arch = "amd 64" }, id, "arch must be"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := good()
			tt.mutate(a)
			err := ValidateAnnouncement(a, "net", tt.author, now)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("valid announcement rejected: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestValidateAttemptID(t *testing.T) {
	for _, ok := range []string{"at-1", "A.b_c-9"} {
		if err := ValidateAttemptID(ok); err != nil {
			t.Errorf("ValidateAttemptID(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "../x", "a/b", ".hidden", "a b", strings.Repeat("a", 129), "a\x00"} {
		if err := ValidateAttemptID(bad); err == nil {
			t.Errorf("ValidateAttemptID(%q) accepted", bad)
		}
	}
}

func TestFraming(t *testing.T) {
	var buf bytes.Buffer
	in := &LeaseRenewal{AttemptId: "at-1", Phase: "running"}
	if err := WriteMsg(&buf, in); err != nil {
		t.Fatal(err)
	}
	var out LeaseRenewal
	if err := ReadMsg(bytes.NewReader(buf.Bytes()), &out, MaxControlSize); err != nil {
		t.Fatal(err)
	}
	if out.GetAttemptId() != "at-1" || out.GetPhase() != "running" {
		t.Fatalf("read back %v", &out)
	}
	if err := ReadMsg(bytes.NewReader(buf.Bytes()), &out, 3); err == nil {
		t.Fatal("message over the size cap was read")
	}
}

func mustHash(t testing.TB, s string) mh.Multihash {
	t.Helper()
	h, err := mh.Sum([]byte(s), mh.SHA2_256, -1)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// FuzzOpenReport: arbitrary bytes never panic and never verify unless
// they are a sealed report whose named node is its signer.
func FuzzOpenReport(f *testing.F) {
	k, id := newKey(f)
	env, err := SealReport(&Report{AttemptId: "at-1", NodePeerId: []byte(id)}, k)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(env)
	withEgress, err := SealReport(&Report{AttemptId: "at-2", NodePeerId: []byte(id), Egress: []*EgressHost{{Host: "pypi.org", Connections: 2,
		BytesReceived: 4096}, {Host: "answers.example", Refused: 1}}, EgressHostsOmitted: 3}, k)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(withEgress)
	f.Add([]byte{})
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, signer, err := OpenReport(data)
		if err != nil {
			return
		}
		_ = ValidateReport(r) // never panics, whatever the record holds
		named, perr := peer.IDFromBytes(r.GetNodePeerId())
		if perr != nil || named != signer || r.GetAttemptId() == "" {
			t.Fatalf("accepted inconsistent report: named %v signer %v attempt %q", named, signer, r.GetAttemptId())
		}
	})
}

// FuzzReadAssignment: the node's decoder for assignments never panics and
// never passes an assignment with an unsafe attempt ID or a recipe path
// that could leave the workspace.
func FuzzReadAssignment(f *testing.F) {
	var buf bytes.Buffer
	c := cid.NewCidV1(cid.Raw, mustHash(f, "c")).Bytes()
	_ = WriteMsg(&buf, &Assignment{AttemptId: "at-1", Recipe: &Recipe{ImageCid: c,
		Inputs:  []*Input{{Cid: c, Extract: true, Top: "capsule-1"}},
		Edits:   []*Edit{{Op: &Edit_Remove{Remove: "capsule-1/results"}}, {Op: &Edit_Write{Write: &FileWrite{Path: "prompt.txt", Content: []byte("p")}}}},
		Mounts:  []*Mount{{Target: "/workspace"}, {Source: "capsule-1/code", Target: "/code"}},
		Outputs: []*Output{{Path: "report.json", MaxBytes: 1 << 20}},
		Limits:  &Limits{CpuMillis: 1000, MemoryBytes: 1 << 30, WallSeconds: 60}}})
	f.Add(buf.Bytes())
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Fuzz(func(t *testing.T, data []byte) {
		var a Assignment
		if err := ReadMsg(bytes.NewReader(data), &a, MaxAssignmentSize); err != nil {
			return
		}
		if ValidateAssignment(&a) != nil {
			return
		}
		if ValidateAttemptID(a.GetAttemptId()) != nil {
			t.Fatalf("assignment with unsafe attempt id %q validated", a.GetAttemptId())
		}
		r := a.GetRecipe()
		var paths []string
		for _, in := range r.GetInputs() {
			paths = append(paths, in.GetPath())
		}
		for _, m := range r.GetMounts() {
			paths = append(paths, m.GetSource())
		}
		for _, o := range r.GetOutputs() {
			paths = append(paths, o.GetPath())
		}
		for _, p := range paths {
			if strings.HasPrefix(p, "/") || slices.Contains(strings.Split(p, "/"), "..") {
				t.Fatalf("recipe path %q that leaves the workspace validated", p)
			}
		}
	})
}

// FuzzAnnouncement: decoding and validating arbitrary announcement bytes never panics.
func FuzzAnnouncement(f *testing.F) {
	_, id := newKey(f)
	now := time.Unix(1_800_000_000, 0)
	good, _ := gproto.Marshal(&Announcement{Network: "n", PeerId: []byte(id), UnixMillis: now.UnixMilli(), TotalSlots: 1,
		Slot: &SlotShape{CpuMillis: 1000, MemoryBytes: 1}, Incarnation: 1, Suites: []string{"s"},
		Coordinators: []*CoordinatorLoad{{PeerId: []byte(id), Running: 1}}})
	f.Add(good)
	f.Fuzz(func(t *testing.T, data []byte) {
		a, err := DecodeAnnouncement(data)
		if err != nil {
			return
		}
		if ValidateAnnouncement(a, "n", id, now) == nil && gproto.Size(a) > MaxAnnouncementSize {
			t.Fatalf("announcement of %d bytes validated", gproto.Size(a))
		}
		_, _ = NewAnnouncementGuard("n").Check(a, id, now)
	})
}

func TestOperatorCert(t *testing.T) {
	opKey, opID := newKey(t)
	_, node := newKey(t)
	_, other := newKey(t)
	now := time.Unix(1_800_000_000, 0)
	cert, err := SealOperatorCert(opKey, node, "net", now)
	if err != nil {
		t.Fatal(err)
	}
	got, err := OpenOperatorCert(cert, node, "net")
	if err != nil || got != opID {
		t.Fatalf("OpenOperatorCert = %v, %v; want %v", got, err, opID)
	}
	for _, tt := range []struct {
		name    string
		data    []byte
		node    peer.ID
		network string
		want    string
	}{
		{"other node", cert, other, "net", "is for node"},
		{"other network", cert, node, "x", "is for network"},
		{"garbage", []byte("zz"), node, "net", "operator certificate"},
		{"tampered", bytes.Replace(cert, []byte("net"), []byte("nat"), 1), node, "nat", "operator certificate"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := OpenOperatorCert(tt.data, tt.node, tt.network); err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

func TestAnnouncementGuard(t *testing.T) {
	_, id := newKey(t)
	opKey, opID := newKey(t)
	t0 := time.Unix(1_800_000_000, 0)
	ann := func(seq uint64, at time.Time) *Announcement {
		return &Announcement{Network: "net", PeerId: []byte(id), Seq: seq, UnixMillis: at.UnixMilli(),
			TotalSlots: 1, FreeSlots: 1, Slot: &SlotShape{CpuMillis: 1000, MemoryBytes: 1}, Incarnation: 1}
	}
	g := NewAnnouncementGuard("net")
	op, err := g.Check(ann(10, t0), id, t0)
	if err != nil || op != id {
		t.Fatalf("first announcement: operator %v err %v; want the node itself", op, err)
	}
	steps := []struct {
		name string
		a    *Announcement
		now  time.Time
		want string // "" accept; "superseded" ignore; else a reject mentioning it
	}{
		{"older seq is superseded", ann(9, t0.Add(time.Second)), t0.Add(time.Second), "superseded"},
		{"same seq is a replay", ann(10, t0.Add(time.Second)), t0.Add(time.Second), "replayed"},
		{"too soon by its own clock", ann(11, t0.Add(100*time.Millisecond)), t0.Add(time.Second), "too frequent"},
		{"next one", ann(12, t0.Add(time.Second)), t0.Add(time.Second), ""},
		{"stale", ann(13, t0.Add(-2*time.Minute)), t0.Add(2 * time.Second), "away from local time"},
	}
	for _, s := range steps {
		_, err := g.Check(s.a, id, s.now)
		switch {
		case s.want == "" && err != nil:
			t.Fatalf("%s: rejected: %v", s.name, err)
		case s.want == "superseded" && !errors.Is(err, ErrSuperseded):
			t.Fatalf("%s: err = %v, want ErrSuperseded", s.name, err)
		case s.want != "" && s.want != "superseded" && (err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), s.want)):
			t.Fatalf("%s: err = %v, want ErrInvalid mentioning %q", s.name, err, s.want)
		}
	}

	// A flood with honest-looking timestamps is cut off by the arrival-time bucket.
	at, seq, rejected := t0.Add(time.Minute), uint64(100), 0
	for range 3 * AnnounceBurst {
		seq++
		at = at.Add(MinAnnounceGap)
		if _, err := g.Check(ann(seq, at), id, t0.Add(time.Minute)); err != nil {
			rejected++
		}
	}
	if rejected < AnnounceBurst {
		t.Fatalf("a burst of %d announcements at one instant: only %d rejected", 3*AnnounceBurst, rejected)
	}

	// An operator certificate names the operator; one for another node is refused.
	_, other := newKey(t)
	g2 := NewAnnouncementGuard("net")
	a := ann(1, t0)
	a.OperatorCert, _ = SealOperatorCert(opKey, id, "net", t0)
	if op, err := g2.Check(a, id, t0); err != nil || op != opID {
		t.Fatalf("with certificate: operator %v err %v; want %v", op, err, opID)
	}
	b := ann(2, t0.Add(time.Second))
	b.OperatorCert, _ = SealOperatorCert(opKey, other, "net", t0)
	if _, err := g2.Check(b, id, t0.Add(time.Second)); err == nil || !strings.Contains(err.Error(), "is for node") {
		t.Fatalf("certificate of another node: err = %v", err)
	}
}

// FuzzOperatorCert: arbitrary certificate bytes never panic and never
// verify for a node they do not name.
func FuzzOperatorCert(f *testing.F) {
	k, _ := newKey(f)
	_, node := newKey(f)
	cert, err := SealOperatorCert(k, node, "n", time.Unix(1, 0))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(cert)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		if _, err := OpenOperatorCert(data, node, "n"); err != nil {
			return
		}
		var c OperatorCert
		if env, err := record.ConsumeTypedEnvelope(data, operatorRecord{&c}); err != nil || env == nil {
			t.Fatalf("accepted a certificate that does not open: %v", err)
		}
		if named, _ := peer.IDFromBytes(c.GetNodePeerId()); named != node {
			t.Fatalf("accepted a certificate for %v", named)
		}
	})
}

// FuzzControlMessages: the decoders of every small message read from a
// peer (AssignmentResponse, LeaseRenewal, LeaseAck, ReportAck) never
// panic and never read past the size cap.
func FuzzControlMessages(f *testing.F) {
	for _, m := range []gproto.Message{
		&AssignmentResponse{AttemptId: "at-1", Accepted: true, Code: DeclineCode_DECLINE_BUSY, Incarnation: 3},
		&LeaseRenewal{AttemptId: "at-1", Phase: "running"},
		&LeaseAck{AttemptId: "at-1", Ok: true, LeaseDeadlineUnixMillis: 5},
		&ReportAck{AttemptId: "at-1", Accepted: true, Late: true, Retry: true},
	} {
		var buf bytes.Buffer
		_ = WriteMsg(&buf, m)
		f.Add(buf.Bytes())
	}
	f.Add([]byte{0x80, 0x80, 0x80, 0x80, 0x01})
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, m := range []gproto.Message{&AssignmentResponse{}, &LeaseRenewal{}, &LeaseAck{}, &ReportAck{}} {
			if err := ReadMsg(bytes.NewReader(data), m, MaxControlSize); err == nil && gproto.Size(m) > MaxControlSize {
				t.Fatalf("%T of %d bytes read under a %d byte cap", m, gproto.Size(m), MaxControlSize)
			}
		}
	})
}
