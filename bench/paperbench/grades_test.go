package paperbench

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseLeafGrades(t *testing.T) {
	want := map[string]LeafGrade{"a": {Score: 1}, "b": {Score: 0}, "c": {Failed: true, Reason: "no answer"}}
	cases := []struct {
		name, in string
		want     map[string]LeafGrade
		err      string
	}{
		{"records", `[{"id":"a","score":1},{"id":"b","score":0},{"id":"c","score":0,"failed":true,"reason":"no answer"}]`, want, ""},
		{"verdict", `{"grading":[{"id":"a","score":1,"category":"Code Development","files":["x.py"]},{"id":"b","score":0},{"id":"c","failed":true,"reason":"no answer"}]}`, want, ""},
		{"map of numbers and records", `{"a":1,"b":0,"c":{"failed":true,"reason":"no answer"}}`, want, ""},
		{"graded tree", `{"id":"root","score":0.5,"valid_score":true,"sub_tasks":[{"id":"a","score":1,"valid_score":true,"sub_tasks":[]},
			{"id":"n","sub_tasks":[{"id":"b","score":0,"valid_score":true,"sub_tasks":[]},{"id":"c","score":0,"valid_score":false,"explanation":"no answer","sub_tasks":[]}]}]}`,
			map[string]LeafGrade{"a": {Score: 1}, "b": {Score: 0}, "c": {Failed: true, Reason: "valid_score false: no answer"}}, ""},
		{"score 0.5", `{"a":0.5}`, nil, "score 0.5, want 0 or 1"},
		{"record score 2", `[{"id":"a","score":2}]`, nil, "want 0 or 1"},
		{"no score", `[{"id":"a"}]`, nil, "no score and is not failed"},
		{"no id", `[{"score":1}]`, nil, "has no id"},
		{"twice", `[{"id":"a","score":1},{"id":"a","score":0}]`, nil, "graded twice"},
		{"unknown field", `[{"id":"a","score":1,"grade":1}]`, nil, "unknown field"},
		{"string", `"a"`, nil, "want a JSON list or object"},
		{"empty", ` `, nil, "empty"},
		{"tree leaf without score", `{"id":"r","sub_tasks":[{"id":"a","sub_tasks":[]}]}`, nil, "no score"},
	}
	for _, c := range cases {
		got, err := ParseLeafGrades([]byte(c.in))
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: %v, want an error with %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if len(got) != len(c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
		for id, g := range c.want {
			if got[id] != g {
				t.Errorf("%s: leaf %s %+v, want %+v", c.name, id, got[id], g)
			}
		}
	}
}

// TestRegradeRealRubric: a real rubric's leaves graded in the three shapes
// score the same, under both graders, and as Score computes by hand.
func TestRegradeRealRubric(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "paperbench", "mechanistic-understanding", "rubric.json"))
	if err != nil {
		t.Fatalf("the real rubric is required beside the repository: %v", err)
	}
	root, err := ParseRubric(data)
	if err != nil {
		t.Fatal(err)
	}
	var recs []map[string]any
	byID := map[string]any{}
	for i, l := range root.Leaves() {
		switch i % 5 {
		case 4:
			recs = append(recs, map[string]any{"id": l.ID, "failed": true, "reason": "judge refused"})
			byID[l.ID] = map[string]any{"failed": true, "reason": "judge refused"}
		default:
			recs = append(recs, map[string]any{"id": l.ID, "score": i % 2})
			byID[l.ID] = i % 2
		}
	}
	var scores [2][]float64
	for _, v := range []any{recs, byID} {
		b, _ := json.Marshal(v)
		grades, err := ParseLeafGrades(b)
		if err != nil {
			t.Fatal(err)
		}
		for gi, g := range Graders() {
			r, err := Score(root, grades, g)
			if err != nil {
				t.Fatal(err)
			}
			scores[gi] = append(scores[gi], r.Score)
			if len(r.Failed) != (len(root.Leaves())+0)/5 {
				t.Errorf("%s: %d failed leaves, want %d", g, len(r.Failed), len(root.Leaves())/5)
			}
		}
	}
	for gi, s := range scores {
		if math.Abs(s[0]-s[1]) > 1e-15 || s[0] <= 0 || s[0] >= 1 {
			t.Errorf("%s: scores %v differ between the shapes or are not a mean", Graders()[gi], s)
		}
	}
	if scores[0][0] <= scores[1][0] {
		t.Errorf("report-failed %v is not above silent-zero %v with failed leaves counted 0", scores[0][0], scores[1][0])
	}
}

func FuzzParseLeafGrades(f *testing.F) {
	f.Add([]byte(`[{"id":"a","score":1}]`))
	f.Add([]byte(`{"a":1,"b":{"failed":true}}`))
	f.Add([]byte(`{"id":"r","sub_tasks":[{"id":"a","score":1,"valid_score":true,"sub_tasks":[]}]}`))
	f.Add([]byte(`{"grading":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		grades, err := ParseLeafGrades(data)
		if err != nil {
			return
		}
		for id, g := range grades {
			if !g.Failed && g.Score != 0 && g.Score != 1 {
				t.Fatalf("leaf %q: score %d", id, g.Score)
			}
		}
	})
}
