package bench

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"path"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/proto"
)

// Checker judges fresh capsules for reproducibility: the network runs a
// capsule's own run script on several independent nodes (one job per run,
// each on a distinct node and operator) and the checker compares what the
// runs returned and reports which results reproduce. It is registered
// beside the families (bench/repro is CORE-Bench's); the core knows it only
// through this interface.
type Checker interface {
	// Parse reads a submitted check strictly (every error names the
	// field) and returns what the core needs of it.
	Parse(spec json.RawMessage) (Check, error)
	// Recipe is the job of one run: the capsule's own run script in image.
	Recipe(c Check, capsule, image cid.Cid, limits *proto.Limits) (*proto.Recipe, error)
	// Compare is what the runs are compared on, from one run's files (by
	// the names in Check.Files, and below Check.Dirs).
	Compare(c Check, files map[string][]byte) Comparable
	// Judge reports on the decided runs (a failed run has no files)
	// against the files as submitted (claimed), in the checker's JSON.
	Judge(c Check, runs []CheckRun, claimed map[string][]byte) (json.RawMessage, error)
}

// Check is a parsed check.
type Check struct {
	// Spec is the check as the checker keeps it (normalised JSON).
	Spec json.RawMessage `json:"spec"`
	// Runs is how many independent runs it wants.
	Runs int `json:"runs"`
	// Top is the one top folder the submitted tarball must hold.
	Top string `json:"top"`
	// Files are the files (relative to Top) each run returns and the
	// checker reads; the submitted tarball's copies are kept as claimed.
	Files []string `json:"files"`
	// Dirs are folders (relative to Top) each run returns whole (as a
	// folder output); their files are read as Files are, named
	// DIR/PATH. The submitted tarball's copies are kept as claimed (a
	// draft check compares the runs with what the capsule published).
	Dirs []string `json:"dirs,omitempty"`
	// MaxFile bounds one of them (a folder: its tarball).
	MaxFile int64 `json:"max_file"`
	// Prompt is what an agent would be asked of the capsule (for logs).
	Prompt string `json:"prompt,omitempty"`
}

// CheckRun is one decided run.
type CheckRun struct {
	Node    string
	Outcome string
	Files   map[string][]byte
}

// FolderFiles reads the tarball of a folder output (recipe.Collect's) as
// the regular files it holds, named dir/PATH, within maxBytes in all;
// folders and links are left out. An entry whose name leaves the folder
// is an error.
func FolderFiles(dir string, tarball []byte, maxBytes int64) (map[string][]byte, error) {
	out := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(tarball))
	var total int64
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, fmt.Errorf("folder %s: %w", dir, err)
		}
		name := path.Clean(h.Name)
		if !fs.ValidPath(name) || name == "." {
			return nil, fmt.Errorf("folder %s: entry %q is not a path inside it", dir, h.Name)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		if total += h.Size; total > maxBytes {
			return nil, fmt.Errorf("folder %s: over %d bytes", dir, maxBytes)
		}
		b, err := io.ReadAll(io.LimitReader(tr, h.Size))
		if err != nil {
			return nil, fmt.Errorf("folder %s: %s: %w", dir, name, err)
		}
		out[dir+"/"+name] = b
	}
}
