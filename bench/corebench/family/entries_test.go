package family

import (
	"testing"

	"github.com/repronet/repronet/bench"
)

// TestEntriesKeepTheEvaluation: the evaluation of a neutral entry reaches
// the board's and HAL export's entry, which tell two evaluations' run 1
// apart by it and match each run with its trajectory by it (the demo's
// HAL files lost every call without it).
func TestEntriesKeepTheEvaluation(t *testing.T) {
	got, err := Entries([]bench.Entry{{Suite: "s", Variant: "easy", Agent: "a", TaskID: "capsule-1", Run: 1, Eval: "ev-1"},
		{Suite: "s", Variant: "easy", Agent: "a", TaskID: "capsule-1", Run: 1, Eval: "ev-2"}})
	if err != nil || len(got) != 2 || got[0].Eval != "ev-1" || got[1].Eval != "ev-2" {
		t.Fatalf("entries %+v, %v", got, err)
	}
}
