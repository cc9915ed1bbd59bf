// Package families is where the binary is put together: the benchmark
// families and the reproducibility checker this build of repronet knows.
// It is the one place above the neutral core (coordinator, node, proto)
// that names a family; everything else goes through package bench.
package families

import (
	"github.com/repronet/repronet/bench"
	corebench "github.com/repronet/repronet/bench/corebench/family"
	heureka "github.com/repronet/repronet/bench/heureka/family"
	paperbench "github.com/repronet/repronet/bench/paperbench/family"
	"github.com/repronet/repronet/bench/repro"
	"github.com/repronet/repronet/bench/shellqa"
)

// Registry holds every family this build knows.
func Registry() *bench.Registry {
	r, err := bench.NewRegistry(corebench.New(), shellqa.New(), paperbench.New(), heureka.New())
	if err != nil {
		panic(err) // the families above have distinct names: a programming error
	}
	return r
}

// Checker is the reproducibility checker (CORE-Bench's: task entries with
// prediction intervals).
func Checker() bench.Checker { return repro.Checker{} }
