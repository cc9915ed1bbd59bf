package coordinator

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/proto"
)

// apiViews is what the API shows of a coordinator, as its admin reads it:
// the boards, every attempt (canaries included) by ID, every evaluation,
// and the trajectory of every finished attempt that made model calls.
type apiViews struct {
	boards, entries, evaluations string
	attempts                     map[string]string
	states                       map[string]AttemptState
	trajectories                 map[string]string
}

func readViews(t *testing.T, base, token string) apiViews {
	t.Helper()
	get := func(path string) []byte {
		req, _ := http.NewRequest("GET", base+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		return b
	}
	v := apiViews{boards: string(get("/api/leaderboards")), entries: sortedEntries(t, get("/api/leaderboard/entries")),
		evaluations: withoutLive(t, get("/api/evaluations")), attempts: map[string]string{}, states: map[string]AttemptState{},
		trajectories: map[string]string{}}
	var atts []json.RawMessage
	if err := json.Unmarshal(get("/api/attempts?canaries=1"), &atts); err != nil {
		t.Fatal(err)
	}
	for _, raw := range atts {
		var a Attempt
		if err := json.Unmarshal(raw, &a); err != nil {
			t.Fatal(err)
		}
		v.attempts[a.ID], v.states[a.ID] = string(raw), a.State
		if a.State == StateDone && a.Model != nil && a.Model.Calls > 0 {
			v.trajectories[a.ID] = string(get("/api/attempts/" + a.ID + "/trajectory"))
		}
	}
	return v
}

// sortedEntries is the board entries in a fixed order: the endpoint
// leaves entries that tie (runs of one task, say) in any order.
func sortedEntries(t *testing.T, b []byte) string {
	var es []json.RawMessage
	if err := json.Unmarshal(b, &es); err != nil {
		t.Fatal(err)
	}
	out := make([]string, len(es))
	for i, e := range es {
		var c bytes.Buffer
		if err := json.Compact(&c, e); err != nil {
			t.Fatal(err)
		}
		out[i] = c.String()
	}
	slices.Sort(out)
	return strings.Join(out, "\n")
}

// withoutLive is the evaluations without what they are waiting for: a
// live view of the nodes in view (none yet at a restored coordinator),
// not a record.
func withoutLive(t *testing.T, b []byte) string {
	var evs []map[string]any
	if err := json.Unmarshal(b, &evs); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	for _, e := range evs {
		delete(e, "waiting")
	}
	out, _ := json.Marshal(evs)
	return string(out)
}

// withoutFields is the JSON object a without the named fields.
func withoutFields(t *testing.T, a string, names ...string) string {
	var m map[string]any
	if err := json.Unmarshal([]byte(a), &m); err != nil {
		t.Fatalf("%v: %s", err, a)
	}
	for _, n := range names {
		delete(m, n)
	}
	b, _ := json.Marshal(m)
	return string(b)
}

// backupOf streams GET /api/backup as the admin.
func backupOf(t *testing.T, base, token string) []byte {
	t.Helper()
	req, _ := http.NewRequest("GET", base+"/api/backup", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /api/backup: %d %v %.200s", resp.StatusCode, err, b)
	}
	return b
}

// restoreAndStart restores backup into a new folder and starts a
// coordinator there with the original's configuration (no node knows it).
func restoreAndStart(t *testing.T, orig *Coordinator, backup []byte) (*Coordinator, string) {
	t.Helper()
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "restored")
	sum, err := Restore(ctx, bytes.NewReader(backup), dir, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records == 0 || sum.Blocks == 0 || sum.Files == 0 || sum.Manifest.Peer != orig.ID().String() {
		t.Fatalf("restore summary %+v", sum)
	}
	cfg := orig.cfg
	cfg.DataDir, cfg.Logger = dir, testLog(t)
	c2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c2.Close() })
	if c2.ID() != orig.ID() {
		t.Fatalf("restored peer ID %s, want %s", c2.ID(), orig.ID())
	}
	srv := httptest.NewServer(c2.Handler())
	t.Cleanup(srv.Close)
	return c2, srv.URL
}

// TestBackupUnderLoad backs up a coordinator through GET /api/backup while
// wire nodes run an evaluation (their agents calling models through the
// gateway, reports being ingested and scored), restores it into a new
// folder, starts it, and compares what the API shows field by field with
// the original's at the backup point. Then, once the evaluation is done,
// the same again with the whole state fixed: everything equal.
func TestBackupUnderLoad(t *testing.T) {
	f := newPeople(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for _, w := range f.nodes {
		run := f.agentRun(w)
		w.report = func(a *proto.Assignment) *proto.Report {
			time.Sleep(time.Duration(100+rand.IntN(300)) * time.Millisecond)
			return run(a)
		}
	}
	var ev EvaluationResponse
	f.post(t, f.ann, "/api/evaluations", `{"suite":"sample","agent":"solver-a","levels":["easy","medium","hard"],"runs":6,"models":["sim-1"]}`, &ev)
	unfinished := func() (done, open int) {
		for _, a := range f.attemptsOf(ev.ID) {
			switch a.State {
			case StateDone, StateFailed, StateCancelled:
				done++
			default:
				open++
			}
		}
		return done, open
	}
	waitUntil(ctx, t, "the load under way", func() bool { d, o := unfinished(); return d >= 3 && o > 0 })

	// Phase 1: under load. The backup holds its read transaction open for
	// a while before reading from it, so the load moves the state while the
	// records are read and the blocks copied.
	f.c.backupBegun = func() { time.Sleep(700 * time.Millisecond) }
	before := readViews(t, f.srv.URL, f.admin)
	backup := backupOf(t, f.srv.URL, f.admin)
	after := readViews(t, f.srv.URL, f.admin)
	f.c.backupBegun = nil
	if _, open := unfinished(); open == 0 {
		t.Fatal("the evaluation finished during the backup: no load to test under")
	}
	_, url := restoreAndStart(t, f.c, backup)
	got := readViews(t, url, f.admin)
	exact, moving := 0, 0
	for id, b := range before.attempts {
		r, ok := got.attempts[id]
		if !ok {
			t.Errorf("attempt %s (%s before the backup) is not restored", id, before.states[id])
			continue
		}
		if before.states[id] != StateDone {
			continue // in flight: leases and scoring start anew on restore
		}
		if b == after.attempts[id] {
			exact++
			if r != b {
				t.Errorf("attempt %s restored as\n%s\nwant\n%s", id, r, b)
			}
		} else if r != b && r != after.attempts[id] {
			t.Errorf("attempt %s restored as\n%s\nwant its state before or after the backup:\n%s\n%s", id, r, b, after.attempts[id])
		} else {
			moving++
		}
	}
	for id := range got.attempts {
		if _, ok := after.attempts[id]; !ok {
			t.Errorf("restored attempt %s is unknown to the original", id)
		}
	}
	if exact < 9 {
		t.Fatalf("only %d finished attempts compared exactly (%d moved during the backup)", exact, moving)
	}
	for id, tr := range before.trajectories {
		if tr == after.trajectories[id] && got.trajectories[id] != tr {
			t.Errorf("trajectory of %s restored as\n%s\nwant\n%s", id, got.trajectories[id], tr)
		}
	}
	if before.boards == after.boards && got.boards != before.boards {
		t.Errorf("boards restored as\n%s\nwant\n%s", got.boards, before.boards)
	}
	changed := 0
	for id, a := range after.attempts {
		if before.attempts[id] != a {
			changed++
		}
	}
	if changed == 0 {
		t.Fatal("nothing changed while the backup ran: no load to test under")
	}
	t.Logf("under load: %d attempts before, %d after (%d changed during the backup), %d restored; %d finished ones equal field by field, %d moved; %d trajectories",
		len(before.attempts), len(after.attempts), changed, len(got.attempts), exact, moving, len(got.trajectories))

	// Phase 2: at rest.
	waitUntil(ctx, t, "the evaluation done", func() bool { _, o := unfinished(); return o == 0 })
	// Attempts may stay queued (units waiting for a replica no node in
	// view can run): nothing is running or waiting to be scored.
	waitUntil(ctx, t, "nothing running or left to score", func() bool { p := f.c.Progress(); return p.Assigned+p.Reported == 0 })
	want := readViews(t, f.srv.URL, f.admin)
	_, url2 := restoreAndStart(t, f.c, backupOf(t, f.srv.URL, f.admin))
	rest := readViews(t, url2, f.admin)
	for _, c := range []struct{ what, got, want string }{{"boards", rest.boards, want.boards},
		{"board entries", rest.entries, want.entries}, {"evaluations", rest.evaluations, want.evaluations}} {
		if c.got != c.want {
			t.Errorf("%s restored as\n%s\nwant\n%s", c.what, c.got, c.want)
		}
	}
	if len(rest.attempts) != len(want.attempts) || len(rest.trajectories) != len(want.trajectories) {
		t.Errorf("restored %d attempts and %d trajectories, want %d and %d", len(rest.attempts), len(rest.trajectories),
			len(want.attempts), len(want.trajectories))
	}
	for id, a := range want.attempts {
		r := rest.attempts[id]
		if want.states[id] == StateQueued {
			// Whether a queued attempt is stuck depends on the nodes in
			// view, which the restored coordinator has none of yet.
			a, r = withoutFields(t, a, "stuck_since", "stuck_reason"), withoutFields(t, r, "stuck_since", "stuck_reason")
		}
		if r != a {
			t.Errorf("attempt %s restored as\n%s\nwant\n%s", id, r, a)
		}
	}
	for id, tr := range want.trajectories {
		if rest.trajectories[id] != tr {
			t.Errorf("trajectory of %s restored as\n%s\nwant\n%s", id, rest.trajectories[id], tr)
		}
	}
	if !strings.Contains(want.boards, "solver-a") || len(want.trajectories) < 10 {
		t.Fatalf("the compared state is too thin: %d trajectories, boards %.200s", len(want.trajectories), want.boards)
	}
}

// TestRestoreRefuses: a restore into a folder that holds anything is
// refused with the reason and the folder untouched; a backup cut short is
// refused and leaves nothing behind. The backup is made offline, from the
// stopped coordinator's folder (a running one's is refused as in use).
func TestRestoreRefuses(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	c := openTestWith(t, dir, nil)
	if _, err := BackupFolder(ctx, dir, io.Discard, testLog(t)); !errors.Is(err, ErrRunning) {
		t.Fatalf("backup of a running coordinator's folder: %v, want ErrRunning", err)
	}
	c.Close()
	// A backup that fails before its first byte is an error status, not
	// an empty 200.
	rec := httptest.NewRecorder()
	c.handleBackup(rec, httptest.NewRequest("GET", "/api/backup", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "closed") {
		t.Fatalf("backup of a closed coordinator: %d %s", rec.Code, rec.Body.String())
	}
	var buf bytes.Buffer
	sum, err := BackupFolder(ctx, dir, &buf, testLog(t))
	if err != nil {
		t.Fatal(err)
	}
	if sum.Records == 0 || sum.Blocks == 0 {
		t.Fatalf("summary %+v", sum)
	}
	if _, got, err := CheckBackup(bytes.NewReader(buf.Bytes())); err != nil || got != sum {
		t.Fatalf("CheckBackup = %+v, %v; want %+v", got, err, sum)
	}

	full := t.TempDir()
	if err := os.WriteFile(filepath.Join(full, "notes.txt"), []byte("mine"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = Restore(ctx, bytes.NewReader(buf.Bytes()), full, testLog(t))
	var ne *NotEmptyError
	if !errors.As(err, &ne) || !strings.Contains(err.Error(), "not empty") || !strings.Contains(err.Error(), "notes.txt") {
		t.Fatalf("restore into a non-empty folder: %v", err)
	}
	if ents, _ := os.ReadDir(full); len(ents) != 1 {
		t.Fatalf("the refused folder now holds %d entries", len(ents))
	}

	cut := filepath.Join(t.TempDir(), "cut")
	short := buf.Bytes()[:buf.Len()-4096]
	if _, err := Restore(ctx, bytes.NewReader(short), cut, testLog(t)); err == nil {
		t.Fatal("a backup cut short was restored")
	}
	if _, _, err := CheckBackup(bytes.NewReader(short)); err == nil {
		t.Fatal("CheckBackup passed a backup cut short")
	}
	if ents, _ := os.ReadDir(cut); len(ents) != 0 {
		t.Fatalf("a failed restore left %d entries", len(ents))
	}

	// The good backup restores and opens.
	good := filepath.Join(t.TempDir(), "good")
	if _, err := Restore(ctx, bytes.NewReader(buf.Bytes()), good, testLog(t)); err != nil {
		t.Fatal(err)
	}
	c2 := openTestWith(t, good, nil)
	defer c2.Close()
	if !c2.HasSuite(testSuite) {
		t.Fatal("the restored coordinator lost its suite")
	}
}

// BenchmarkBackupRestore times a backup of a stopped coordinator's folder
// holding the sample suite and N more records of 1 KiB (an attempt's
// record is 0.5 to 2 KiB), and its restore (docs/backup.md):
//
//	go test -run '^$' -bench BackupRestore -benchtime 1x ./coordinator/
func BenchmarkBackupRestore(b *testing.B) {
	for _, n := range []int{10_000, 100_000} {
		b.Run(fmt.Sprintf("%drecords", n), func(b *testing.B) {
			ctx := context.Background()
			dir := b.TempDir()
			c := openTestWith(b, dir, nil)
			rec := bytes.Repeat([]byte("x"), 1024)
			batch, _ := c.ds.Batch(ctx)
			for i := range n {
				_ = batch.Put(ctx, datastoreKey("/state/bench/%08d", i), rec)
				if i%5000 == 4999 {
					if err := batch.Commit(ctx); err != nil {
						b.Fatal(err)
					}
					batch, _ = c.ds.Batch(ctx)
				}
			}
			if err := batch.Commit(ctx); err != nil {
				b.Fatal(err)
			}
			c.Close()
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				path := filepath.Join(b.TempDir(), "backup.tar")
				out, _ := os.Create(path)
				sum, err := BackupFolder(ctx, dir, out, testLog(b))
				out.Close()
				if err != nil {
					b.Fatal(err)
				}
				took := time.Since(start)
				in, _ := os.Open(path)
				start = time.Now()
				if _, err := Restore(ctx, in, filepath.Join(b.TempDir(), "r"), testLog(b)); err != nil {
					b.Fatal(err)
				}
				in.Close()
				info, _ := os.Stat(path)
				b.Logf("%d records (%.1f MiB), %d blocks (%.1f MiB): backup %s, restore %s, file %.1f MiB", sum.Records,
					float64(sum.RecordBytes)/(1<<20), sum.Blocks, float64(sum.BlockBytes)/(1<<20), took.Round(time.Millisecond),
					time.Since(start).Round(time.Millisecond), float64(info.Size())/(1<<20))
			}
		})
	}
}

func datastoreKey(format string, a ...any) datastore.Key {
	return datastore.NewKey(fmt.Sprintf(format, a...))
}

// FuzzCheckBackup: a backup file is outside input; reading one never
// panics, and one it accepts has its manifest first and counts that match.
func FuzzCheckBackup(f *testing.F) {
	mk := func(entries ...[2]string) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, e := range entries {
			_ = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: e[0], Mode: 0o600, Size: int64(len(e[1]))})
			_, _ = tw.Write([]byte(e[1]))
		}
		_ = tw.Close()
		return b.Bytes()
	}
	manifest := `{"format":"repronet coordinator backup","version":1,"schema":{"coordinator":1,"capsulestore":1}}`
	f.Add(mk([2]string{backupManifest, manifest}, [2]string{"identity.key", "k"}, [2]string{"badger/000001", "xx"},
		[2]string{"blocks/ABC", "block"}, [2]string{backupEnd, `{"badger_pieces":1,"blocks":1,"block_bytes":5}`}))
	f.Add(mk([2]string{backupManifest, manifest}, [2]string{backupEnd, `{"blocks":3}`}))
	f.Add(mk([2]string{"identity.key", "k"}))
	f.Add([]byte("not a tar"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, sum, err := CheckBackup(bytes.NewReader(b))
		if err != nil {
			return
		}
		if m.Format != BackupFormat || sum.Blocks < 0 || sum.BlockBytes < 0 {
			t.Fatalf("accepted %+v %+v", m, sum)
		}
	})
}
