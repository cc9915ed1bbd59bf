package family

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/repronet/repronet/bench/internal/strictjson"
	"github.com/repronet/repronet/bench/paperbench"
	"github.com/repronet/repronet/proto"
)

// Paper is one paper of a suite's task file: what the coordinator keeps
// of a paper folder. The rubric, the blacklist and the judge's addendum
// are for grading; the paper's text and addendum are what the judge is
// shown. The agent's copy of the paper is the content of the same name.
type Paper struct {
	// ID is the paper folder's name: the task's id and its content's name.
	ID string `json:"id"`
	// ConfigID and Title are config.yaml's.
	ConfigID string `json:"config_id"`
	Title    string `json:"title"`
	// Rubric is rubric.json as published.
	Rubric json.RawMessage `json:"rubric"`
	// Blacklist is blacklist.txt as published ("none": nothing).
	Blacklist string `json:"blacklist"`
	// PaperMD is paper.md, the judge's copy of the paper.
	PaperMD string `json:"paper_md"`
	// Addendum and JudgeAddendum are addendum.md and judge.addendum.md
	// ("" when the folder has none).
	Addendum      string `json:"addendum,omitempty"`
	JudgeAddendum string `json:"judge_addendum,omitempty"`
	// GPUs is what the paper's jobs need of GPUs (nil: none).
	GPUs *GPUs `json:"gpus,omitempty"`
}

// GPUs is a paper's GPU request (proto.GPURequest).
type GPUs struct {
	Count          uint32 `json:"count"`
	Model          string `json:"model,omitempty"`
	MinMemoryBytes uint64 `json:"min_memory_bytes,omitempty"`
}

// paper is a parsed Paper.
type paper struct {
	Paper
	rubric    *paperbench.Node
	codeDev   *paperbench.Node
	blacklist paperbench.Blacklist
}

// Bounds of a task file.
const (
	MaxPapers     = 1000
	MaxTaskFile   = 512 << 20
	MaxPaperIDLen = 64
)

// ParseTasks reads a task file strictly: a JSON array of papers, each
// with exactly the keys of Paper (addendum, judge_addendum and gpus
// optional), no key twice, nothing after the array. The rubric is parsed
// by paperbench.ParseRubric, the blacklist by paperbench.ParseBlacklist;
// every error names the paper (index and id) and the field.
func ParseTasks(data []byte) ([]*paper, error) {
	if len(data) > MaxTaskFile {
		return nil, fmt.Errorf("task file: %d bytes, over %d", len(data), MaxTaskFile)
	}
	var raws []json.RawMessage
	if err := strictjson.Decode(data, &raws); err != nil {
		return nil, fmt.Errorf("task file: want a JSON array of papers: %w", err)
	}
	if len(raws) == 0 || len(raws) > MaxPapers {
		return nil, fmt.Errorf("task file: %d papers, want 1-%d", len(raws), MaxPapers)
	}
	out := make([]*paper, 0, len(raws))
	seen := map[string]int{}
	for i, raw := range raws {
		p, err := parsePaper(raw)
		if err != nil {
			return nil, fmt.Errorf("paper %d%s: %w", i, idNote(raw), err)
		}
		if j, dup := seen[p.ID]; dup {
			return nil, fmt.Errorf("paper %d (%s): field \"id\": also the id of paper %d", i, p.ID, j)
		}
		seen[p.ID] = i
		out = append(out, p)
	}
	return out, nil
}

// idNote is " (id)" for an entry with a usable id, for errors.
func idNote(raw json.RawMessage) string {
	var probe struct {
		ID any `json:"id"`
	}
	_ = json.Unmarshal(raw, &probe)
	if id, ok := probe.ID.(string); ok && validID(id) {
		return " (" + id + ")"
	}
	return ""
}

// validID reports whether s is a usable paper id: a label of at most
// MaxPaperIDLen bytes starting with a letter or digit (so never "." or
// "..": it names a content and a workspace-free task).
func validID(s string) bool {
	if !proto.ValidLabel(s, MaxPaperIDLen) {
		return false
	}
	c := s[0]
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

func parsePaper(raw json.RawMessage) (*paper, error) {
	var p paper
	if err := strictjson.Decode(raw, &p.Paper); err != nil {
		return nil, err
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(raw, &fields)
	for _, k := range []string{"id", "config_id", "title", "rubric", "blacklist", "paper_md"} {
		if v, ok := fields[k]; !ok || string(bytes.TrimSpace(v)) == "null" {
			return nil, fmt.Errorf("field %q is missing", k)
		}
	}
	if !validID(p.ID) {
		return nil, fmt.Errorf("field \"id\": %q: want 1-%d of [A-Za-z0-9._+-], starting with a letter or digit", clip(p.ID, 80), MaxPaperIDLen)
	}
	for _, f := range []struct{ name, v string }{{"config_id", p.ConfigID}, {"title", p.Title}, {"paper_md", p.PaperMD}} {
		if strings.TrimSpace(f.v) == "" {
			return nil, fmt.Errorf("field %q is empty", f.name)
		}
	}
	for _, f := range []struct{ name, v string }{{"paper_md", p.PaperMD}, {"addendum", p.Addendum}, {"judge_addendum", p.JudgeAddendum}} {
		if !utf8.ValidString(f.v) || strings.ContainsRune(f.v, 0) {
			return nil, fmt.Errorf("field %q: not UTF-8 text", f.name)
		}
	}
	var err error
	if p.rubric, err = paperbench.ParseRubric(p.Rubric); err != nil {
		return nil, fmt.Errorf("field \"rubric\": %w", err)
	}
	p.codeDev = paperbench.CodeDev(p.rubric)
	if p.blacklist, err = paperbench.ParseBlacklist([]byte(p.Blacklist)); err != nil {
		return nil, fmt.Errorf("field \"blacklist\": %w", err)
	}
	if g := p.GPUs; g != nil && (g.Count == 0 || len(g.Model) > 2*proto.MaxLabelLen) {
		return nil, fmt.Errorf("field \"gpus\": count %d, model of %d bytes: want a count of 1 or more and a model of at most %d bytes",
			g.Count, len(g.Model), 2*proto.MaxLabelLen)
	}
	return &p, nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return string(validPrefix(s[:n])) + "..."
}

// validPrefix drops a character cut at the end of s.
func validPrefix(s string) string {
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// The agent's copy of a paper: the files of a paper folder the original
// gives the agent. Everything else (rubric.json, config.yaml,
// judge.addendum.md) is for grading.
var agentFiles = []string{"paper.md", "paper.pdf", "addendum.md", "blacklist.txt"}

// Bounds of the agent's copy of a paper.
const (
	maxContentFiles = 10_000
	maxContentBytes = 4 << 30
)

// ImportFolder reads a paper folder in the published layout
// (paperbench.LoadPaper: rubric.json, config.yaml and blacklist.txt
// required, strict) and returns its task file entry and its content: a
// gzip'd tarball of the files the agent is given (paper.md, paper.pdf,
// addendum.md, blacklist.txt and assets/, those present), at the top,
// deterministic (sorted, fixed times and owners). gpus, when set, is what
// its jobs need of GPUs. Nothing outside the folder is read: it is opened
// as an os.Root, and only regular files and folders are taken.
func ImportFolder(dir string, gpus *GPUs) (Paper, []byte, error) {
	lp, err := paperbench.LoadPaper(dir)
	if err != nil {
		return Paper{}, nil, err
	}
	if !lp.HasPaperMD {
		return Paper{}, nil, fmt.Errorf("paper %s: no paper.md: the judge reads the paper as Markdown", lp.Folder)
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Paper{}, nil, fmt.Errorf("paper %s: %w", lp.Folder, err)
	}
	defer root.Close()
	blacklist, err := fs.ReadFile(root.FS(), "blacklist.txt")
	if err != nil {
		return Paper{}, nil, fmt.Errorf("paper %s: %w", lp.Folder, err)
	}
	rubric, err := fs.ReadFile(root.FS(), "rubric.json")
	if err != nil {
		return Paper{}, nil, fmt.Errorf("paper %s: %w", lp.Folder, err)
	}
	var compact bytes.Buffer
	if err := json.Compact(&compact, rubric); err != nil {
		return Paper{}, nil, fmt.Errorf("paper %s: rubric.json: %w", lp.Folder, err)
	}
	p := Paper{ID: lp.Folder, ConfigID: lp.ConfigID, Title: lp.Title, Rubric: compact.Bytes(), Blacklist: string(blacklist),
		PaperMD: lp.PaperMD, Addendum: lp.Addendum, JudgeAddendum: lp.JudgeAddendum, GPUs: gpus}
	if !validID(p.ID) {
		return Paper{}, nil, fmt.Errorf("paper folder %q: its name is the paper's id: want 1-%d of [A-Za-z0-9._+-]", p.ID, MaxPaperIDLen)
	}
	var names []string
	for _, n := range agentFiles {
		if _, err := root.Lstat(n); err == nil {
			names = append(names, n)
		}
	}
	names = append(names, lp.Assets...)
	content, err := contentTarball(root, names)
	if err != nil {
		return Paper{}, nil, fmt.Errorf("paper %s: %w", lp.Folder, err)
	}
	return p, content, nil
}

// contentTarball writes the named regular files of root into a
// deterministic gzip'd tarball, their folders before them.
func contentTarball(root *os.Root, names []string) ([]byte, error) {
	if len(names) > maxContentFiles {
		return nil, fmt.Errorf("%d files for the agent, over %d", len(names), maxContentFiles)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	mtime := time.Date(2024, 7, 21, 0, 0, 0, 0, time.UTC) // ICML 2024
	dirs := map[string]bool{}
	var total int64
	for _, n := range names {
		parts := strings.Split(n, "/")
		for i := 1; i < len(parts); i++ {
			d := strings.Join(parts[:i], "/") + "/"
			if !dirs[d] {
				dirs[d] = true
				if err := tw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
					return nil, err
				}
			}
		}
		st, err := root.Lstat(n)
		if err != nil {
			return nil, err
		}
		if !st.Mode().IsRegular() {
			return nil, fmt.Errorf("%s: not a regular file", n)
		}
		if total += st.Size(); total > maxContentBytes {
			return nil, fmt.Errorf("the agent's files are over %d bytes", maxContentBytes)
		}
		f, err := root.Open(n)
		if err != nil {
			return nil, err
		}
		err = func() error {
			defer f.Close()
			if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: st.Size(), ModTime: mtime,
				Format: tar.FormatPAX}); err != nil {
				return err
			}
			w, err := io.Copy(tw, io.LimitReader(f, st.Size()))
			if err == nil && w != st.Size() {
				err = errors.New("changed while being read")
			}
			return err
		}()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
