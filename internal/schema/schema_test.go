package schema

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func readParts(t *testing.T, dir string) map[string]int {
	t.Helper()
	f, ok, err := Read(dir)
	if err != nil || !ok {
		t.Fatalf("Read(%s) = %v, %v, %v", dir, f, ok, err)
	}
	return f.Parts
}

func TestOpenNewFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "new")
	if err := Open(context.Background(), dir, nil, Part{Name: "coordinator", Version: 3,
		Migrations: map[int]Migration{1: failing, 2: failing}}); err != nil {
		t.Fatal(err)
	}
	// A new folder starts at the binary's version: nothing migrated.
	if got := readParts(t, dir); got["coordinator"] != 3 || len(got) != 1 {
		t.Fatalf("parts = %v, want coordinator at 3", got)
	}
}

func failing(context.Context, string) error { return errors.New("must not run") }

// TestAdoptLegacy: a folder made before schema files (it holds files, no
// schema.json) is adopted at version 1, then migrated from there.
func TestAdoptLegacy(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "identity.key"), []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	var ran []int
	step := func(v int) Migration {
		return func(_ context.Context, d string) error {
			if d != dir {
				t.Errorf("migration got folder %s", d)
			}
			ran = append(ran, v)
			return nil
		}
	}
	if err := Open(context.Background(), dir, nil, Part{Name: "node", Version: 2, Migrations: map[int]Migration{1: step(1)}},
		Part{Name: "capsulestore", Version: 1}); err != nil {
		t.Fatal(err)
	}
	if len(ran) != 1 || ran[0] != 1 {
		t.Fatalf("migrations run = %v, want [1]", ran)
	}
	if got := readParts(t, dir); got["node"] != 2 || got["capsulestore"] != 1 {
		t.Fatalf("parts = %v", got)
	}
}

// TestMigrateV0: the migration hook, with a fake v0 -> v1 step.
func TestMigrateV0(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, File{Parts: map[string]int{"coordinator": 0, "other": 7}}); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(dir, "migrated")
	part := Part{Name: "coordinator", Version: 1, Migrations: map[int]Migration{0: func(_ context.Context, d string) error {
		return os.WriteFile(filepath.Join(d, "migrated"), []byte("v1"), 0o600)
	}}}
	if err := Open(context.Background(), dir, nil, part); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(marker); err != nil || string(b) != "v1" {
		t.Fatalf("migration did not run: %q, %v", b, err)
	}
	got := readParts(t, dir)
	if got["coordinator"] != 1 || got["other"] != 7 {
		t.Fatalf("parts = %v, want coordinator 1 and other left at 7", got)
	}
	// Opening again runs nothing.
	os.Remove(marker)
	if err := Open(context.Background(), dir, nil, part); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("migration ran twice")
	}
}

// TestMigrationFails: a failed step leaves the version where it was.
func TestMigrationFails(t *testing.T) {
	dir := t.TempDir()
	if err := Write(dir, File{Parts: map[string]int{"coordinator": 0}}); err != nil {
		t.Fatal(err)
	}
	err := Open(context.Background(), dir, nil, Part{Name: "coordinator", Version: 1, Migrations: map[int]Migration{0: failing}})
	if err == nil || !strings.Contains(err.Error(), "migrate coordinator from schema version 0 to 1") {
		t.Fatalf("err = %v", err)
	}
	if got := readParts(t, dir); got["coordinator"] != 0 {
		t.Fatalf("parts = %v, want coordinator still 0", got)
	}
}

func TestRefuse(t *testing.T) {
	for _, tc := range []struct {
		name   string
		folder int
		want   any
		words  []string
	}{
		{"newer", 2, &TooNewError{}, []string{"schema version 2", "this binary's version 1"}},
		{"no migration", 0, &NoMigrationError{}, []string{"schema version 0", "no migration"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := Write(dir, File{Parts: map[string]int{"node": tc.folder}}); err != nil {
				t.Fatal(err)
			}
			before, _ := os.ReadFile(filepath.Join(dir, FileName))
			err := Open(context.Background(), dir, nil, Part{Name: "node", Version: 1})
			if err == nil {
				t.Fatal("opened")
			}
			switch tc.want.(type) {
			case *TooNewError:
				var e *TooNewError
				if !errors.As(err, &e) || e.Folder != tc.folder || e.Binary != 1 {
					t.Fatalf("err = %v", err)
				}
			case *NoMigrationError:
				var e *NoMigrationError
				if !errors.As(err, &e) {
					t.Fatalf("err = %v", err)
				}
			}
			for _, w := range tc.words {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
			after, _ := os.ReadFile(filepath.Join(dir, FileName))
			if string(before) != string(after) {
				t.Fatalf("schema file changed: %s -> %s", before, after)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	for _, s := range []string{`{"parts":{"coordinator":1}}`, `{}`, `{"parts":{"":1}}`, `{"parts":{"a":-1}}`, `[`, `{"parts":null}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := Decode(b)
		if err != nil {
			return
		}
		for name, v := range got.Parts {
			if name == "" || v < 0 {
				t.Fatalf("accepted part %q at %d", name, v)
			}
		}
	})
}
