// Package reproenv is the default environment of reproducibility checks
// whose capsule has no environment/: its Debian packages and image spec.
// It owns only those; building is internal/debimage's, running the
// checks bench/repro's and the coordinator's. It is apart from bench/repro
// so that the fixtures step can name its packages without linking the
// checks (and the sandbox below them).
package reproenv

import (
	"github.com/repronet/repronet/internal/debimage"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// The default environment of capsules without an environment/: Debian 12
// with Python 3 and R and their common scientific libraries, from Debian's
// packages (internal/debimage). The operator builds it (repronet repro
// runtime-image) and registers it as the agent image named
// DefaultRuntimeAgent, which the coordinator gives such capsules' runs
// (coordinator.DefaultReproImage); nodes given it with --base-image can
// also build environment/Dockerfiles FROM RuntimeImageRef offline.
const (
	RuntimeImageRef     = "repronet.local/runtime:bookworm"
	DefaultRuntimeAgent = "runtime"
)

// RuntimePackages are the default environment's packages beyond Debian's
// minbase.
var RuntimePackages = []string{"python3", "python3-numpy", "python3-pandas", "python3-scipy", "r-base-core"}

// RuntimeImageSpec is the default environment's image. It has no
// entrypoint: a capsule run's recipe gives the command (cd /code and run
// its run script).
func RuntimeImageSpec() debimage.Spec {
	return debimage.Spec{
		Ref:      RuntimeImageRef,
		Packages: RuntimePackages,
		Config: ociimage.Config{
			WorkingDir: "/code",
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8",
				"PYTHONUNBUFFERED=1", "MPLBACKEND=Agg"},
		},
	}
}
