package repro

import (
	"strings"
	"testing"
	"time"
)

// TestDraftLargeFiles: files a node controls cannot make a draft costly:
// a 4 MiB line of numbers, a thousand lines of ten numbers and a CSV of
// many rows, in three runs, are drafted within the bounds (the files said
// truncated) in a few seconds at most (about 1 s here).
func TestDraftLargeFiles(t *testing.T) {
	files := map[string][]byte{
		"results/line.txt":  []byte(strings.Repeat("1 ", 2<<20)),
		"results/lines.txt": []byte(strings.Repeat("v 1 2 3 4 5 6 7 8 9 10\n", 1100)),
		"results/rows.csv":  []byte("a,b\n" + strings.Repeat("1,2\n", 5000)),
	}
	var runs []Run
	for _, n := range []string{"a", "b", "c"} {
		runs = append(runs, Run{Node: n, Outcome: "ok", Files: files})
	}
	start := time.Now()
	d, task, err := DraftEntry(draftCapsule, runs)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Values) > MaxDraftValues || len(d.Truncated) != 3*len(files) || len(task.Results[0]) != len(d.Spec.Rules) {
		t.Fatalf("%d values, truncated %v, %d answers, %d rules", len(d.Values), d.Truncated, len(task.Results[0]), len(d.Spec.Rules))
	}
	t.Logf("drafted %d values of 3 runs in %v", len(d.Values), took)
	if took > 30*time.Second {
		t.Fatalf("drafting took %v", took)
	}
}
