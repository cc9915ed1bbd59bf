package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ipfs/go-cid"
	mh "github.com/multiformats/go-multihash"

	"github.com/repronet/repronet/verify"
)

// API names of recorded calls.
const (
	CallOpenAIChat        = "openai.chat.completions"
	CallAnthropicMessages = "anthropic.messages"
)

// Call is the record of one model call, bound to its attempt. Bodies are
// kept apart, by CID (CIDv1, raw codec, SHA-256: the form capsules take).
// Records of one attempt form a chain: each names the CID of the record
// before it, and ID is the CID of the record itself (its JSON with ID
// empty), so the last ID commits to the whole trajectory.
type Call struct {
	ID   string `json:"id,omitempty"`
	Seq  int    `json:"seq"`
	Prev string `json:"prev,omitempty"`

	Attempt    string `json:"attempt"`
	Lease      string `json:"lease"`
	Node       string `json:"node"`
	Evaluation string `json:"evaluation,omitempty"`
	Group      string `json:"group,omitempty"`
	Task       string `json:"task,omitempty"`

	API      string `json:"api"`
	Model    string `json:"model"`
	Upstream string `json:"upstream,omitempty"`
	Provider string `json:"provider,omitempty"`
	Stream   bool   `json:"stream,omitempty"`

	// Request is the body as the client sent it; Forwarded the body sent
	// to the provider (bounds lowered); Response the answer (a stream
	// reassembled into the answer it amounts to); StreamBytes the stream
	// as it came.
	Request     string `json:"request"`
	Forwarded   string `json:"forwarded,omitempty"`
	Response    string `json:"response,omitempty"`
	StreamBytes string `json:"stream_bytes,omitempty"`

	// Status is what the client got; Refused says why the gateway
	// refused the call itself (e.g. budget_exhausted); Error what went
	// wrong, if anything.
	Status  int    `json:"status"`
	Refused string `json:"refused,omitempty"`
	Error   string `json:"error,omitempty"`

	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended"`
	// FirstTokenMS is the time to the first output token (to the answer,
	// when not streaming), TotalMS to the end.
	FirstTokenMS float64 `json:"first_token_ms,omitempty"`
	TotalMS      float64 `json:"total_ms"`

	// MaxOutput is the output bound the gateway set.
	MaxOutput int64 `json:"max_output,omitempty"`
	Usage     Usage `json:"usage"`
	// UsageReported is false when the provider reported no valid usage:
	// then Cost is the call's bound.
	UsageReported bool   `json:"usage_reported"`
	UsageError    string `json:"usage_error,omitempty"`
	// Cost is what the usage costs at the price table; Charged what the
	// budgets were charged (min(Cost, Bound)); Overrun the rest.
	Cost    Money `json:"cost"`
	Bound   Money `json:"bound"`
	Charged Money `json:"charged"`
	Overrun Money `json:"overrun,omitempty"`

	// Chain is the head of the attempt's conversation chain after this
	// call (package verify: over the request and answer bodies as
	// recorded); the node signs the last one in its report.
	Chain string `json:"chain,omitempty"`
	// ReplayOf names the recorded call ("<attempt>/<seq>") whose answer a
	// replay was given; ReplayMatch says whether the replayed request was
	// the recorded one, byte for byte.
	ReplayOf    string `json:"replay_of,omitempty"`
	ReplayMatch bool   `json:"replay_match,omitempty"`
}

// Unavailable says why the call failed when it failed for the gateway's
// or its provider's reasons, which neither the agent nor its node can
// cause: the provider answered 5xx or 429, did not answer, refused the
// gateway's credentials, or the gateway could not serve the call. It is
// "" for an answered call and for a refusal the caller caused (a bad
// request, a model not granted, a budget spent, a replay past its
// record).
func (c Call) Unavailable() string {
	if c.Refused != "" || c.Status < 500 && c.Status != http.StatusTooManyRequests {
		return ""
	}
	if c.Error != "" {
		return fmt.Sprintf("model %s: %d: %s", c.Model, c.Status, c.Error)
	}
	return fmt.Sprintf("model %s: %d from the gateway", c.Model, c.Status)
}

// Refusal reasons.
const (
	RefusedBudget = "budget_exhausted"
	// RefusedReplayExhausted: a replay asked for more calls than the
	// recorded trajectory holds.
	RefusedReplayExhausted = "replay_exhausted"
	// RefusedReplayUnmatched: no recorded call left matches a replay's
	// call (its conversation or its content differs).
	RefusedReplayUnmatched = "replay_unmatched"
)

// BodySum is the SHA-256 a body's CID holds (of nothing for "": a call
// without that body).
func BodySum(id string) ([sha256.Size]byte, error) {
	if id == "" {
		return sha256.Sum256(nil), nil
	}
	c, err := cid.Decode(id)
	if err != nil {
		return [sha256.Size]byte{}, fmt.Errorf("body %q: %w", id, err)
	}
	d, err := mh.Decode(c.Hash())
	if err != nil || d.Code != mh.SHA2_256 || len(d.Digest) != sha256.Size {
		return [sha256.Size]byte{}, fmt.Errorf("body %s: not a SHA-256 CID", id)
	}
	return [sha256.Size]byte(d.Digest), nil
}

// Exchanges are a trajectory's calls as verification reads them. Token
// counts are among them: package verify reads them as no turn of a
// conversation (they bind nothing) and pairs a replay's with them by
// content.
func Exchanges(calls []TrajectoryCall) []verify.Exchange {
	out := make([]verify.Exchange, len(calls))
	for i, c := range calls {
		out[i] = verify.Exchange{API: c.API, Model: c.Model, Request: c.RequestBody, Response: c.ResponseBody,
			Failed: c.Status != 200 || c.Refused != "", ID: fmt.Sprintf("%s/%d", c.Attempt, c.Seq), ReplayOf: c.ReplayOf}
	}
	return out
}

// CID is the content address of data: CIDv1, raw codec, SHA-256.
func CID(data []byte) string {
	sum, _ := mh.Sum(data, mh.SHA2_256, -1)
	return cid.NewCidV1(cid.Raw, sum).String()
}

// Seal sets c's ID: the CID of its JSON with ID empty.
func Seal(c Call) (Call, []byte) {
	c.ID = ""
	b, _ := json.Marshal(c)
	c.ID = CID(b)
	b, _ = json.Marshal(c)
	return c, b
}

// VerifyChain checks that calls are one attempt's trajectory as recorded:
// in order from Seq 0, each naming the one before, each ID its content's.
func VerifyChain(calls []Call) error {
	prev := ""
	for i, c := range calls {
		sealed, _ := Seal(c)
		switch {
		case c.Seq != i:
			return fmt.Errorf("call %d has seq %d", i, c.Seq)
		case c.Prev != prev:
			return fmt.Errorf("call %d names %q as the one before, not %q", i, c.Prev, prev)
		case sealed.ID != c.ID:
			return fmt.Errorf("call %d: id %s is not its content's (%s)", i, c.ID, sealed.ID)
		case i > 0 && c.Attempt != calls[0].Attempt:
			return fmt.Errorf("call %d is of attempt %q, not %q", i, c.Attempt, calls[0].Attempt)
		}
		prev = c.ID
	}
	return nil
}

// Recorder keeps trajectories: bodies by CID, call records by attempt.
type Recorder interface {
	// Put stores data and returns its CID.
	Put(ctx context.Context, data []byte) (string, error)
	// Get returns the data stored under cid.
	Get(ctx context.Context, cid string) ([]byte, error)
	// Append adds c to its attempt's trajectory: it sets Seq, Prev and
	// ID and returns the record as stored.
	Append(ctx context.Context, c Call) (Call, error)
	// Calls is an attempt's trajectory in order (empty when none).
	Calls(ctx context.Context, attempt string) ([]Call, error)
}

// LoadTrajectory reads an attempt's trajectory from rec with every
// call's request and answer, and checks its chain.
func LoadTrajectory(ctx context.Context, rec Recorder, attempt string) ([]TrajectoryCall, error) {
	calls, err := rec.Calls(ctx, attempt)
	if err != nil {
		return nil, fmt.Errorf("trajectory of %s: %w", attempt, err)
	}
	if err := VerifyChain(calls); err != nil {
		return nil, fmt.Errorf("trajectory of %s: %w", attempt, err)
	}
	out := make([]TrajectoryCall, len(calls))
	for i, c := range calls {
		out[i].Call = c
		for _, b := range []struct {
			id string
			to *[]byte
		}{{c.Request, &out[i].RequestBody}, {c.Response, &out[i].ResponseBody}} {
			if b.id == "" {
				continue
			}
			data, err := rec.Get(ctx, b.id)
			if err != nil {
				return nil, fmt.Errorf("trajectory of %s: call %d: %w", attempt, i, err)
			}
			*b.to = data
		}
	}
	return out, nil
}

// ErrNotFound: no data under that CID.
var ErrNotFound = errors.New("not found")

// MemRecorder is a Recorder in memory.
type MemRecorder struct {
	mu    sync.Mutex
	blobs map[string][]byte
	calls map[string][]Call
}

// NewMemRecorder returns an empty recorder.
func NewMemRecorder() *MemRecorder {
	return &MemRecorder{blobs: map[string][]byte{}, calls: map[string][]Call{}}
}

// Put implements Recorder.
func (m *MemRecorder) Put(_ context.Context, data []byte) (string, error) {
	id := CID(data)
	m.mu.Lock()
	m.blobs[id] = bytes.Clone(data)
	m.mu.Unlock()
	return id, nil
}

// Get implements Recorder.
func (m *MemRecorder) Get(_ context.Context, id string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.blobs[id]
	if !ok {
		return nil, fmt.Errorf("blob %s: %w", id, ErrNotFound)
	}
	return bytes.Clone(b), nil
}

// Append implements Recorder.
func (m *MemRecorder) Append(_ context.Context, c Call) (Call, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	calls := m.calls[c.Attempt]
	c.Seq, c.Prev = len(calls), ""
	if len(calls) > 0 {
		c.Prev = calls[len(calls)-1].ID
	}
	c, _ = Seal(c)
	m.calls[c.Attempt] = append(calls, c)
	return c, nil
}

// Calls implements Recorder.
func (m *MemRecorder) Calls(_ context.Context, attempt string) ([]Call, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]Call(nil), m.calls[attempt]...), nil
}

// Blobs are every body the recorder holds (tests scan them).
func (m *MemRecorder) Blobs() map[string][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string][]byte, len(m.blobs))
	for k, v := range m.blobs {
		out[k] = bytes.Clone(v)
	}
	return out
}

// FileRecorder is a Recorder in a folder: blobs/<cid> and
// calls/<attempt>.jsonl (one record a line), each write synced.
type FileRecorder struct {
	dir   string
	mu    sync.Mutex
	heads map[string]head // attempt -> its last record
}

type head struct {
	n  int
	id string
}

// OpenFileRecorder opens (creating) a recorder in dir.
func OpenFileRecorder(dir string) (*FileRecorder, error) {
	for _, d := range []string{"blobs", "calls"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("open recorder: %w", err)
		}
	}
	return &FileRecorder{dir: dir, heads: map[string]head{}}, nil
}

// ValidAttemptName says whether name can name a trajectory file.
func ValidAttemptName(name string) error {
	if len(name) == 0 || len(name) > 128 || name == "." || name == ".." {
		return fmt.Errorf("attempt name %q must be 1 to 128 characters, not . or ..", name)
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_' || r == '.') {
			return fmt.Errorf("attempt name %q may hold only letters, digits, '-', '_' and '.'", name)
		}
	}
	return nil
}

// Put implements Recorder.
func (f *FileRecorder) Put(_ context.Context, data []byte) (string, error) {
	id := CID(data)
	path := filepath.Join(f.dir, "blobs", id)
	if _, err := os.Stat(path); err == nil {
		return id, nil
	}
	tmp, err := os.CreateTemp(filepath.Join(f.dir, "blobs"), ".tmp-*")
	if err != nil {
		return "", fmt.Errorf("put blob: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return "", fmt.Errorf("put blob %s: %w", id, err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return "", fmt.Errorf("put blob %s: %w", id, err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("put blob %s: %w", id, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return "", fmt.Errorf("put blob %s: %w", id, err)
	}
	return id, nil
}

// Get implements Recorder.
func (f *FileRecorder) Get(_ context.Context, id string) ([]byte, error) {
	c, err := cid.Decode(id)
	if err != nil {
		return nil, fmt.Errorf("blob %q: %w", id, err)
	}
	b, err := os.ReadFile(filepath.Join(f.dir, "blobs", c.String()))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("blob %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", id, err)
	}
	if CID(b) != c.String() {
		return nil, fmt.Errorf("blob %s: content does not match its CID", id)
	}
	return b, nil
}

// Append implements Recorder.
func (f *FileRecorder) Append(_ context.Context, c Call) (Call, error) {
	if err := ValidAttemptName(c.Attempt); err != nil {
		return Call{}, fmt.Errorf("append call: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	h, ok := f.heads[c.Attempt]
	if !ok {
		calls, err := f.read(c.Attempt)
		if err != nil {
			return Call{}, err
		}
		h.n = len(calls)
		if h.n > 0 {
			h.id = calls[h.n-1].ID
		}
	}
	c.Seq, c.Prev = h.n, h.id
	c, line := Seal(c)
	fh, err := os.OpenFile(f.callsPath(c.Attempt), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return Call{}, fmt.Errorf("append call: %w", err)
	}
	_, werr := fh.Write(append(line, '\n'))
	serr := fh.Sync()
	cerr := fh.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		return Call{}, fmt.Errorf("append call of attempt %s: %w", c.Attempt, err)
	}
	f.heads[c.Attempt] = head{n: h.n + 1, id: c.ID}
	return c, nil
}

// Calls implements Recorder.
func (f *FileRecorder) Calls(_ context.Context, attempt string) ([]Call, error) {
	if err := ValidAttemptName(attempt); err != nil {
		return nil, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read(attempt)
}

func (f *FileRecorder) callsPath(attempt string) string {
	return filepath.Join(f.dir, "calls", attempt+".jsonl")
}

func (f *FileRecorder) read(attempt string) ([]Call, error) {
	fh, err := os.Open(f.callsPath(attempt))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read calls of %s: %w", attempt, err)
	}
	defer fh.Close()
	var calls []Call
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var c Call
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			return nil, fmt.Errorf("read calls of %s: record %d: %w", attempt, len(calls), err)
		}
		calls = append(calls, c)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read calls of %s: %w", attempt, err)
	}
	return calls, nil
}
