// Package schema owns the schema version file of a data folder
// (DATA/schema.json): which version of each part's on-disk layout the
// folder holds (the coordinator's records, a node's records, the capsule
// store's index and block files), the migrations that bring an older
// folder up to this binary's versions, and the refusal of a folder newer
// than this binary knows. It knows nothing of what the parts store: each
// part (package coordinator, node, capsulestore) declares its Part, and its
// migrations work on the folder themselves.
//
// A folder without the file was made by a release before schema versions
// existed (all of them wrote version 1's layout): it is adopted as version
// 1 of every part. A new folder is written at this binary's versions.
package schema

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/repronet/repronet/internal/flock"
)

// FileName is the schema version file inside a data folder.
const FileName = "schema.json"

// lockName is the lock taken while the file is read, migrated and written.
const lockName = "schema.lock"

// Legacy is the version of every part of a folder that has no schema file:
// the layout of the releases before versions were recorded.
const Legacy = 1

// A Migration brings part of the data folder dir from one version to the
// next. It runs before anything of the part is opened, with the folder's
// lock held, and must leave the folder unchanged or at the next version
// (it may be run again after a crash before the version was written).
type Migration func(ctx context.Context, dir string) error

// Part is one part of a data folder with its own version.
type Part struct {
	// Name is the part's key in the file (e.g. "coordinator").
	Name string
	// Version is the version this binary reads and writes.
	Version int
	// Migrations[v] migrates version v to v+1, for every v below Version
	// that a folder may hold.
	Migrations map[int]Migration
}

// File is the schema file's content: each part's version.
type File struct {
	Parts map[string]int `json:"parts"`
}

// TooNewError: the folder holds a part at a version newer than this
// binary knows; an older binary must not open it.
type TooNewError struct {
	Dir, Part      string
	Folder, Binary int
}

func (e *TooNewError) Error() string {
	return fmt.Sprintf("data folder %s: its %s data is at schema version %d, newer than this binary's version %d: run a newer repronet (or restore a backup made for version %d)",
		e.Dir, e.Part, e.Folder, e.Binary, e.Binary)
}

// NoMigrationError: the folder holds a part at a version this binary has
// no migration from.
type NoMigrationError struct {
	Dir, Part      string
	Folder, Binary int
}

func (e *NoMigrationError) Error() string {
	return fmt.Sprintf("data folder %s: its %s data is at schema version %d and this binary (version %d) has no migration from it: upgrade through an intermediate release",
		e.Dir, e.Part, e.Folder, e.Binary)
}

// Read returns the folder's schema file, and whether it exists. A folder
// without it is reported with every part at Legacy.
func Read(dir string) (File, bool, error) {
	path := filepath.Join(dir, FileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return File{Parts: map[string]int{}}, false, nil
	}
	if err != nil {
		return File{}, false, fmt.Errorf("read schema file: %w", err)
	}
	f, err := Decode(b)
	if err != nil {
		return File{}, false, fmt.Errorf("schema file %s: %w", path, err)
	}
	return f, true, nil
}

// Decode parses a schema file's bytes.
func Decode(b []byte) (File, error) {
	var f File
	if err := json.Unmarshal(b, &f); err != nil {
		return File{}, fmt.Errorf("decode: %w", err)
	}
	if f.Parts == nil {
		return File{}, errors.New("decode: no \"parts\"")
	}
	for name, v := range f.Parts {
		if name == "" || v < 0 {
			return File{}, fmt.Errorf("decode: part %q at version %d", name, v)
		}
	}
	return f, nil
}

// Version is a part's version in f (Legacy when f does not name it: the
// folder was made before the part recorded one).
func (f File) Version(part string) int {
	if v, ok := f.Parts[part]; ok {
		return v
	}
	return Legacy
}

// Write replaces the folder's schema file with f (written whole and
// renamed into place).
func Write(dir string, f File) error {
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode schema file: %w", err)
	}
	path := filepath.Join(dir, FileName)
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write schema file: %w", err)
	}
	if err := syncFile(tmp); err != nil {
		return fmt.Errorf("write schema file: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write schema file: %w", err)
	}
	return nil
}

func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// Check says whether this binary may open parts of f without migrating
// anything: nil, a *TooNewError, or a *NoMigrationError. It writes nothing.
func Check(dir string, f File, parts ...Part) error {
	for _, p := range parts {
		v := f.Version(p.Name)
		if v > p.Version {
			return &TooNewError{Dir: dir, Part: p.Name, Folder: v, Binary: p.Version}
		}
		for ; v < p.Version; v++ {
			if p.Migrations[v] == nil {
				return &NoMigrationError{Dir: dir, Part: p.Name, Folder: v, Binary: p.Version}
			}
		}
	}
	return nil
}

// Open makes the data folder dir (created if missing) hold parts at this
// binary's versions, before the caller opens anything in it: a new folder
// gets a schema file; a folder without one (an older release's) is
// adopted at Legacy and then migrated like any other; a part at an older
// version is migrated one version at a time, the file written after each
// step; a part at a newer version is refused (*TooNewError) and nothing is
// changed. Parts the file names that are not given are left as they are.
func Open(ctx context.Context, dir string, log *slog.Logger, parts ...Part) error {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("create data folder %s: %w", dir, err)
	}
	lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	release, err := flock.Lock(lctx, filepath.Join(dir, lockName), 20*time.Millisecond)
	if err != nil {
		return fmt.Errorf("data folder %s: schema: %w", dir, err)
	}
	defer release()
	f, exists, err := Read(dir)
	if err != nil {
		return fmt.Errorf("data folder %s: %w", dir, err)
	}
	if err := Check(dir, f, parts...); err != nil {
		return err
	}
	if !exists {
		used, err := inUse(dir)
		if err != nil {
			return err
		}
		if used {
			log.Info("data folder made by an earlier release: adopted at schema version 1", "dir", dir)
		}
		for _, p := range parts {
			// A new folder starts at this binary's versions; an old one
			// at Legacy, migrated below.
			f.Parts[p.Name] = p.Version
			if used {
				f.Parts[p.Name] = Legacy
			}
		}
	}
	changed := !exists
	for _, p := range parts {
		for v := f.Version(p.Name); v < p.Version; v++ {
			log.Info("migrating data folder", "dir", dir, "part", p.Name, "from", v, "to", v+1)
			if err := p.Migrations[v](ctx, dir); err != nil {
				return fmt.Errorf("data folder %s: migrate %s from schema version %d to %d: %w", dir, p.Name, v, v+1, err)
			}
			f.Parts[p.Name] = v + 1
			if err := Write(dir, f); err != nil {
				return fmt.Errorf("data folder %s: %w", dir, err)
			}
			changed = false
		}
		if _, ok := f.Parts[p.Name]; !ok {
			f.Parts[p.Name] = p.Version
			changed = true
		}
	}
	if changed {
		if err := Write(dir, f); err != nil {
			return fmt.Errorf("data folder %s: %w", dir, err)
		}
	}
	return nil
}

// inUse says whether dir holds anything beyond the schema lock: a folder
// an earlier release made.
func inUse(dir string) (bool, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return false, fmt.Errorf("read data folder %s: %w", dir, err)
	}
	for _, e := range ents {
		if e.Name() != lockName {
			return true, nil
		}
	}
	return false, nil
}
