package recipe

import (
	"errors"
	"fmt"
	"io"
	"path"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/repronet/repronet/proto"
)

// MaxDockerfile bounds the Dockerfile of a recipe's environment.
const MaxDockerfile = 1 << 20

// EnvironmentFiles are where a recipe's environment is in its prepared
// workspace.
type EnvironmentFiles struct {
	// Dockerfile is the host path of the Dockerfile, and Data what it
	// holds.
	Dockerfile string
	Data       []byte
	// Context is the host path of the build context folder.
	Context string
}

// Environment finds the recipe's environment (proto.Environment) in the
// workspace folder ws once it is prepared: the Dockerfile must be a
// regular file of at most MaxDockerfile bytes and the context a folder,
// with no symbolic link in any component of either path (nothing outside
// ws is ever read). ok is false when the recipe has no environment, or
// when its environment is if_present and no Dockerfile is there; a
// Dockerfile that is there but is not a regular file is an error.
func Environment(ws string, r *proto.Recipe) (files EnvironmentFiles, ok bool, err error) {
	env := r.GetEnvironment()
	if env == nil {
		return EnvironmentFiles{}, false, nil
	}
	df := env.GetDockerfile()
	ctxDir := env.GetContext()
	if ctxDir == "" {
		ctxDir = path.Dir(df)
	}
	for _, p := range []string{df, ctxDir} {
		if p == "." {
			continue
		}
		if err := proto.CheckWorkspacePath(p); err != nil {
			return EnvironmentFiles{}, false, fmt.Errorf("environment: %s: %w", p, err)
		}
	}
	root, err := unix.Open(ws, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return EnvironmentFiles{}, false, fmt.Errorf("environment: open workspace: %w", err)
	}
	defer unix.Close(root)
	f, err := openFileAt(root, df, MaxDockerfile)
	if errors.Is(err, errMissing) && env.GetIfPresent() {
		return EnvironmentFiles{}, false, nil
	}
	if err != nil {
		return EnvironmentFiles{}, false, fmt.Errorf("environment: Dockerfile %s: %w", df, err)
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxDockerfile+1))
	f.Close()
	if err != nil {
		return EnvironmentFiles{}, false, fmt.Errorf("environment: read Dockerfile %s: %w", df, err)
	}
	if ctxDir != "." {
		fd, err := openPathAt(root, ctxDir, true)
		if err != nil {
			return EnvironmentFiles{}, false, fmt.Errorf("environment: context %s: %w", ctxDir, err)
		}
		unix.Close(fd)
	}
	return EnvironmentFiles{Dockerfile: filepath.Join(ws, filepath.FromSlash(df)), Data: data,
		Context: filepath.Join(ws, filepath.FromSlash(ctxDir))}, true, nil
}
