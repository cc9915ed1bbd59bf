package repro

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/ipfs/go-cid"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/proto"
)

// Checker is the reproducibility check as a bench.Checker.
type Checker struct{}

var _ bench.Checker = Checker{}

// runScript runs a capsule as CodeOcean does: code/run, or code/run.sh
// when there is no run.
const runScript = "cd /code && if [ -f run ]; then sh ./run; else sh ./run.sh; fi"

// Parse reads a submitted Spec strictly (unknown fields are refused) and
// validates it; Runs 0 means DefaultRuns.
func (Checker) Parse(raw json.RawMessage) (bench.Check, error) {
	var s Spec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return bench.Check{}, fmt.Errorf("spec: %w", err)
	}
	if s.Runs == 0 {
		s.Runs = DefaultRuns
	}
	if err := s.Validate(); err != nil {
		return bench.Check{}, err
	}
	norm, err := json.Marshal(s)
	if err != nil {
		return bench.Check{}, err
	}
	c := bench.Check{Spec: norm, Runs: s.Runs, Top: s.Capsule.CapsuleID, Files: RunFiles(s), MaxFile: MaxFileSize,
		Prompt: s.Capsule.TaskPrompt}
	if s.Draft() {
		c.Dirs = []string{ResultsDir}
	}
	return c, nil
}

func specOf(c bench.Check) (Spec, error) {
	var s Spec
	if err := json.Unmarshal(c.Spec, &s); err != nil {
		return Spec{}, fmt.Errorf("spec: %w", err)
	}
	return s, nil
}

// Recipe is the job of one run of a check: the capsule tarball extracted
// (its one top folder the spec's capsule ID), code/, data/ and results/
// made real folders and results/ emptied (what a run returns must be its
// own, never the author's published files), the capsule's own run script
// run in /code with the capsule's folders at /code, /data and /results —
// in the capsule's own environment (the image the node builds from its
// environment/Dockerfile, nothing of image shown in it) when it has one,
// else in image (only the environment: its entrypoint is dropped) — and
// the files the rules read (a draft: the results/ folder) returned.
// Nothing else: no level, no prompt.
func (Checker) Recipe(c bench.Check, capsule, image cid.Cid, limits *proto.Limits) (*proto.Recipe, error) {
	dir := c.Top
	var outputs []*proto.Output
	for _, f := range c.Files {
		outputs = append(outputs, &proto.Output{Path: dir + "/" + f, MaxBytes: uint64(c.MaxFile)})
	}
	for _, f := range c.Dirs {
		outputs = append(outputs, &proto.Output{Path: dir + "/" + f, MaxBytes: uint64(c.MaxFile), Directory: true})
	}
	return &proto.Recipe{
		ImageCid: image.Bytes(),
		Inputs:   []*proto.Input{{Cid: capsule.Bytes(), Extract: true, Top: dir}},
		Edits: []*proto.Edit{
			{Op: &proto.Edit_Dir{Dir: dir + "/code"}},
			{Op: &proto.Edit_Dir{Dir: dir + "/data"}},
			{Op: &proto.Edit_EmptyDir{EmptyDir: dir + "/results"}},
		},
		EntrypointSet: true,
		Args:          []string{"sh", "-c", runScript},
		Env:           []string{"HOME=/home/agent"},
		Cwd:           "/code",
		Mounts: []*proto.Mount{
			{Source: dir + "/code", Target: "/code"},
			{Source: dir + "/data", Target: "/data"},
			{Source: dir + "/results", Target: "/results"},
		},
		Limits:      limits,
		Outputs:     outputs,
		Environment: &proto.Environment{Dockerfile: dir + "/environment/Dockerfile", Context: dir + "/environment", IfPresent: true},
	}, nil
}

// Compare is Comparable over the spec's rules.
func (Checker) Compare(c bench.Check, files map[string][]byte) bench.Comparable {
	s, err := specOf(c)
	if err != nil {
		return bench.Comparable{}
	}
	return Comparable(s.Rules, files)
}

// Judge runs Check and returns its Report.
func (Checker) Judge(c bench.Check, runs []bench.CheckRun, claimed map[string][]byte) (json.RawMessage, error) {
	s, err := specOf(c)
	if err != nil {
		return nil, err
	}
	rs := make([]Run, len(runs))
	for i, r := range runs {
		rs[i] = Run{Node: r.Node, Outcome: r.Outcome, Files: r.Files}
	}
	rep, err := Check(s, rs, claimed)
	if err != nil {
		return nil, err
	}
	return json.Marshal(rep)
}

// RunFiles are the files, relative to the capsule folder, the spec's
// rules read: what each run returns, sorted.
func RunFiles(spec Spec) []string {
	var files []string
	for _, r := range spec.Rules {
		if !slices.Contains(files, r.File) {
			files = append(files, r.File)
		}
	}
	slices.Sort(files)
	return files
}
