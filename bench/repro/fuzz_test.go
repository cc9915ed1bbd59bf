package repro

import (
	"io/fs"
	"math"
	"testing"
)

// FuzzExtract feeds the extraction rules files a node controls: they
// must never panic, and what they extract is a gradable answer.
func FuzzExtract(f *testing.F) {
	f.Add([]byte(`{"auc": 0.94, "l": [1, "a"]}`), "json", "/auc", "number")
	f.Add([]byte("a,b\n1,2\n"), "csv", "b@-1", "number")
	f.Add([]byte("Accuracy: 93.75%"), "regex", `Accuracy: (\S+)`, "number")
	f.Add([]byte("  LASSO \n"), "text", "", "string")
	f.Fuzz(func(t *testing.T, data []byte, kind, expr, typ string) {
		r := Rule{Question: "q", File: "results/f", Kind: kind, Expr: expr, Type: typ}
		if r.Validate() != nil {
			return
		}
		v, err := Extract(r, map[string][]byte{"results/f": data})
		if err != nil {
			return
		}
		if k := kindOf(v); k != "numeric" && k != "string" && k != "list" {
			t.Fatalf("extracted a %s", k)
		}
		if _, err := v.MarshalJSON(); err != nil {
			t.Fatal(err)
		}
	})
}

// FuzzFindValues feeds the draft's value finder files a node controls: it
// must never panic, and every value it finds is read back by its rule,
// the same text (a number: the same number).
func FuzzFindValues(f *testing.F) {
	f.Add("results/s.txt", []byte("median 42.5\nat 2026-11-24T09:14:13Z x2 v1.2.3 -1e-3 50%\n"))
	f.Add("results/m.csv", []byte("a,b,when\n1,2.5,2026-01-02\n"))
	f.Add("results/m.json", []byte(`{"a/b": [1, {"~c": 2e3}], "t": "09:14:13"}`))
	f.Fuzz(func(t *testing.T, name string, data []byte) {
		if !fs.ValidPath(name) || name == "." {
			return
		}
		vals, _ := findValues(name, data)
		files := map[string][]byte{name: data}
		for _, v := range vals {
			r := v.rule
			r.Question = "q"
			got, err := Extract(r, files)
			if err != nil {
				t.Fatalf("rule %+v of %q: %v", r, v.text, err)
			}
			if v.time && got.Str != v.text && got.Lit != v.text {
				t.Fatalf("rule %+v reads %s, found %q", r, got.Repr(), v.text)
			}
			if !v.time && got.Num != v.num && !(math.IsNaN(got.Num) && math.IsNaN(v.num)) {
				t.Fatalf("rule %+v reads %v, found %q (%v)", r, got.Num, v.text, v.num)
			}
		}
	})
}

// FuzzComparePublished feeds the comparison with what a capsule
// published files its submitter controls: it must never panic, keeps
// every value the runs gave, says of each a known comparison, and adds
// only values the runs did not give.
func FuzzComparePublished(f *testing.F) {
	f.Add([]byte("fixed_seed_random 0.178395\nn 7\n"))
	f.Add([]byte("n 7\nn 8\nat 2026-01-01T00:00:00Z\n"))
	f.Add([]byte("\x00binary"))
	f.Fuzz(func(t *testing.T, published []byte) {
		runs := []Run{
			{Node: "a", Outcome: "ok", Files: map[string][]byte{"results/r.txt": []byte("fixed_seed_random 0.166599\nn 7\nat 2026-11-24T09:14:13Z\n")}},
			{Node: "b", Outcome: "ok", Files: map[string][]byte{"results/r.txt": []byte("fixed_seed_random 0.166599\nn 8\nat 2026-11-24T09:14:15Z\n")}},
		}
		d, _, err := DraftEntry(draftCapsule, runs)
		if err != nil {
			t.Fatal(err)
		}
		before := len(d.Values)
		ComparePublished(&d, runs, map[string][]byte{"results/r.txt": published})
		if len(d.Values) < before {
			t.Fatalf("%d values, had %d", len(d.Values), before)
		}
		for i, v := range d.Values {
			switch v.Comparison {
			case PublishedReproduced, PublishedNotReproduced, PublishedNotCompared, PublishedNone:
			default:
				t.Fatalf("value %d %q: comparison %q", i, v.Question, v.Comparison)
			}
			if i >= before && (v.Kept() || v.Published == "") {
				t.Fatalf("an added value %+v", v)
			}
		}
	})
}
