// Package sample owns repronet's sample CORE-Bench suites: small
// synthetic capsules in the real CORE-Bench tarball layout, task files in
// CORE-Bench's format, and two agents (an oracle and a wrong one) as files
// for a busybox image. The sample suite (Tasks, CapsuleIDs: three
// capsules) is what the demo and the integration tests run; the sample
// Medium suite (MediumTasks, MediumCapsuleIDs) holds a capsule whose
// results need its environment, for the Medium tests; capsule-0000005 is
// in no task file: a fresh capsule for the reproducibility check without
// a spec (its results hold a stable number, a Monte Carlo estimate seeded
// from /dev/urandom and the time of the run).
//
// Every capsule really computes its results from its data with busybox
// tools (sh, awk, sort): code/run calls code/analysis.sh, which reads
// ../data and writes ../results (the CodeOcean /data and /results when run
// from /code). The published results/ are what that computes. Every
// capsule's environment/Dockerfile builds FROM BaseImage; capsule-0000004's
// also installs a tool busybox lacks (robust-stats), which its code/run
// needs: run in the agent's own image at Medium, it fails (its README
// names an entry point with a vendored copy of the tool, for Hard). Each
// question names where its answer is ("... (`KEY` in results/FILE)."),
// FILE holding "KEY VALUE" lines whose VALUE is a JSON literal. The task
// file covers every kind of question: integers, floats (two with gold runs
// that differ, so the prediction interval has width), strings, lists and
// "fig" (vision) questions reading a figure's data.
//
// Everything is embedded; nothing here does I/O beyond returning bytes.
package sample

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/repronet/repronet/internal/agentimage"
)

// tasksJSON is the sample suite's task file, in CORE-Bench's format;
// mediumTasksJSON the sample Medium suite's.
//
//go:embed tasks.json
var tasksJSON []byte

//go:embed tasks-medium.json
var mediumTasksJSON []byte

// capsules holds one folder per capsule, capsules/capsule-NNNNNNN/.
//
//go:embed capsules
var capsules embed.FS

// agents holds one folder per agent with its run script.
//
//go:embed agents
var agents embed.FS

// AgentEntrypoint is the agents' entry point in their image: a #!/bin/sh
// script that must be executable (mode 0755).
const AgentEntrypoint = agentimage.Entrypoint

// BaseImage is what every sample capsule's environment/Dockerfile builds
// FROM (busybox): a node without network access is given it instead
// (node --base-image; internal/demo builds it from busybox-static).
const BaseImage = "docker.io/library/busybox:1.36"

// Tasks returns the task file (a fresh copy): one task per capsule, three
// gold runs each, for corebench.ParseTasks.
func Tasks() []byte { return bytes.Clone(tasksJSON) }

// MediumTasks returns the sample Medium suite's task file (a fresh copy):
// capsule-0000004, whose code needs a tool its environment/Dockerfile
// installs, three gold runs, for corebench.ParseTasks.
func MediumTasks() []byte { return bytes.Clone(mediumTasksJSON) }

// CapsuleIDs lists the sample suite's capsules (those of Tasks), sorted.
func CapsuleIDs() []string { return taskCapsules(tasksJSON) }

// MediumCapsuleIDs lists the sample Medium suite's capsules (those of
// MediumTasks), sorted.
func MediumCapsuleIDs() []string { return taskCapsules(mediumTasksJSON) }

// AllCapsuleIDs lists every capsule here, sorted: those of the task files
// and those no task names.
func AllCapsuleIDs() []string {
	entries, err := capsules.ReadDir("capsules")
	if err != nil {
		return nil // cannot happen: the folder is embedded
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// taskCapsules lists the capsules a task file names, sorted.
func taskCapsules(taskFile []byte) []string {
	var tasks []struct {
		CapsuleID string `json:"capsule_id"`
	}
	if err := json.Unmarshal(taskFile, &tasks); err != nil {
		return nil // cannot happen: the task files are embedded and tested
	}
	var ids []string
	for _, t := range tasks {
		ids = append(ids, t.CapsuleID)
	}
	slices.Sort(ids)
	return ids
}

// tarballTime is the modification time of every tarball entry.
func tarballTime() time.Time { return time.Date(2024, 9, 17, 0, 0, 0, 0, time.UTC) }

// fileMode gives a capsule file its mode: embedding drops modes, so they
// are set by rule. code/run, shell scripts and the tools vendored in
// code/vendor/ are executable.
func fileMode(rel string) int64 {
	if rel == "code/run" || strings.HasSuffix(rel, ".sh") || strings.HasPrefix(rel, "code/vendor/") {
		return 0o755
	}
	return 0o644
}

// CapsuleTarball returns the capsule as CORE-Bench publishes it: a gzip'd
// tar of one top folder capsule-NNNNNNN/ with code/, data/, results/,
// environment/, metadata/ and REPRODUCING.md. It is deterministic: entries
// sorted by path, directories before their contents, a fixed mtime, uid
// and gid 0, directories 0755, files 0644 except code/run, *.sh and
// code/vendor/* (0755), USTAR headers, no gzip name or time.
func CapsuleTarball(id string) ([]byte, error) {
	if !slices.Contains(AllCapsuleIDs(), id) {
		return nil, fmt.Errorf("sample capsule %q: no such capsule (have %s)", id, strings.Join(AllCapsuleIDs(), ", "))
	}
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	tw := tar.NewWriter(zw)
	root := path.Join("capsules", id)
	err = fs.WalkDir(capsules, root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		name := id
		if rel != "" {
			name += "/" + rel
		}
		hdr := &tar.Header{
			Name:    name,
			ModTime: tarballTime(),
			Format:  tar.FormatUSTAR,
		}
		if d.IsDir() {
			hdr.Typeflag = tar.TypeDir
			hdr.Name += "/"
			hdr.Mode = 0o755
			return tw.WriteHeader(hdr)
		}
		data, err := capsules.ReadFile(p)
		if err != nil {
			return err
		}
		hdr.Typeflag = tar.TypeReg
		hdr.Mode = fileMode(rel)
		hdr.Size = int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		_, err = tw.Write(data)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("sample capsule %s: %w", id, err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("sample capsule %s: %w", id, err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("sample capsule %s: %w", id, err)
	}
	return buf.Bytes(), nil
}

// AgentNames lists the sample agents: "oracle" answers every question
// correctly at every level (regenerating results/ when the level emptied
// it); "wrong" answers every question wrongly without reading results or
// running code.
func AgentNames() []string { return []string{"oracle", "wrong"} }

// AgentFiles returns the files of the named agent's image, keyed by their
// absolute path in the image: AgentEntrypoint, a #!/bin/sh script to be
// installed with mode 0755 in a busybox image. In the container the agent
// expects its working folder /workspace holding prompt.txt and the capsule
// folder, the capsule's code, data and results also at /code, /data and
// /results, and writes /workspace/report.json. The environment variables
// WORKSPACE, CODE, DATA and RESULTS override those paths (for tests).
func AgentFiles(name string) (map[string][]byte, error) {
	return agentimage.Script(agents, "agents", AgentNames(), name)
}
