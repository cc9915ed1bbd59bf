package proto

import (
	"errors"
	"fmt"
	"math"
	"path"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/peer"
	gproto "google.golang.org/protobuf/proto"

	"github.com/repronet/repronet/verify"
)

// Bounds on announcement fields: an announcement is a few KiB at most
// (64 CIDs of 36 bytes or 256 cached keys of 4, an operator certificate of
// about 200 bytes).
const (
	MaxSlots          = 1024
	MaxCachedCapsules = 64
	// MaxFilters bounds the suites and groups a node may list, and
	// MaxFilterLen each name.
	MaxFilters   = 16
	MaxFilterLen = 64
	// MaxCoordinators bounds the coordinators a node may serve.
	MaxCoordinators = 16
	// MaxLabelLen bounds an announcement's arch and version, which must
	// be made of label characters (see ValidLabel): receivers log them.
	MaxLabelLen = 32
	// MaxClockSkew is how far an announcement's timestamp may be from the
	// receiver's clock before it is stale (or from the future).
	MaxClockSkew = 60 * time.Second
)

// ValidateAnnouncement checks an announcement received on network's
// capacity topic from author (the gossipsub signer) at now. Replay checks
// (seq) need per-sender state and are the receiver's job.
func ValidateAnnouncement(a *Announcement, network string, author peer.ID, now time.Time) error {
	if a.GetNetwork() != network {
		return invalid("announcement for network %q on network %q", a.GetNetwork(), network)
	}
	id, err := peer.IDFromBytes(a.GetPeerId())
	if err != nil {
		return invalid("announcement peer_id: %v", err)
	}
	if id != author {
		return invalid("announcement names peer %s but was signed by %s", id, author)
	}
	ts := time.UnixMilli(a.GetUnixMillis())
	if d := now.Sub(ts); d > MaxClockSkew || d < -MaxClockSkew {
		return invalid("announcement from %s is %s away from local time (max %s)", author, d.Round(time.Millisecond), MaxClockSkew)
	}
	if a.GetTotalSlots() > MaxSlots || a.GetFreeSlots() > a.GetTotalSlots() {
		return invalid("announcement from %s: %d free of %d slots (max %d)", author, a.GetFreeSlots(), a.GetTotalSlots(), MaxSlots)
	}
	for _, f := range []struct{ name, v string }{{"arch", a.GetArch()}, {"version", a.GetVersion()}} {
		if f.v != "" && !ValidLabel(f.v, MaxLabelLen) {
			return invalid("announcement from %s: %s must be at most %d of [A-Za-z0-9._+-], got %d bytes", author, f.name, MaxLabelLen, len(f.v))
		}
	}
	if a.GetSlot().GetCpuMillis() == 0 || a.GetSlot().GetMemoryBytes() == 0 {
		return invalid("announcement from %s: slot shape missing", author)
	}
	if len(a.GetCachedCapsules()) > MaxCachedCapsules {
		return invalid("announcement from %s lists %d cached capsules (max %d)", author, len(a.GetCachedCapsules()), MaxCachedCapsules)
	}
	for i, b := range a.GetCachedCapsules() {
		if _, err := cid.Cast(b); err != nil {
			return invalid("announcement from %s: cached_capsules[%d]: %v", author, i, err)
		}
	}
	if k := a.GetCachedKeys(); len(k)%CacheKeyLen != 0 || len(k) > MaxCachedKeys*CacheKeyLen {
		return invalid("announcement from %s: cached_keys of %d bytes (a multiple of %d, at most %d keys)",
			author, len(k), CacheKeyLen, MaxCachedKeys)
	}
	if len(a.GetOperatorCert()) > MaxOperatorCertSize {
		return invalid("announcement from %s: operator certificate of %d bytes (max %d)", author, len(a.GetOperatorCert()), MaxOperatorCertSize)
	}
	for _, f := range []struct {
		what string
		list []string
	}{{"suites", a.GetSuites()}, {"groups", a.GetGroups()}} {
		what, list := f.what, f.list
		if len(list) > MaxFilters {
			return invalid("announcement from %s lists %d %s (max %d)", author, len(list), what, MaxFilters)
		}
		for i, s := range list {
			if s == "" || len(s) > MaxFilterLen {
				return invalid("announcement from %s: %s[%d] must be 1-%d bytes", author, what, i, MaxFilterLen)
			}
			if !printable(s) {
				return invalid("announcement from %s: %s[%d] %q is not printable UTF-8", author, what, i, s)
			}
		}
	}
	if len(a.GetCoordinators()) > MaxCoordinators {
		return invalid("announcement from %s lists %d coordinators (max %d)", author, len(a.GetCoordinators()), MaxCoordinators)
	}
	running := uint64(0)
	for i, c := range a.GetCoordinators() {
		if _, err := peer.IDFromBytes(c.GetPeerId()); err != nil {
			return invalid("announcement from %s: coordinators[%d]: %v", author, i, err)
		}
		running += uint64(c.GetRunning())
	}
	if running+uint64(a.GetFreeSlots()) > uint64(a.GetTotalSlots()) {
		return invalid("announcement from %s: %d running and %d free of %d slots", author, running, a.GetFreeSlots(), a.GetTotalSlots())
	}
	if a.GetIncarnation() == 0 {
		return invalid("announcement from %s: no incarnation", author)
	}
	return nil
}

// ValidLabel reports whether s is 1 to max bytes of [A-Za-z0-9._+-]:
// safe to log and to show as it is.
func ValidLabel(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '+' || c == '-') {
			return false
		}
	}
	return true
}

// printable reports whether s is UTF-8 without control characters (names
// that end in logs, pages and terminals).
func printable(s string) bool {
	return utf8.ValidString(s) && !strings.ContainsFunc(s, unicode.IsControl)
}

// ValidateAttemptID checks that an attempt ID is short and made of
// characters safe in file names and container IDs.
func ValidateAttemptID(id string) error {
	if id == "" || len(id) > 128 {
		return invalid("attempt_id must be 1-128 characters, got %d", len(id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') || (i == 0 && c == '.') {
			return invalid("attempt_id %q: character %q at %d is not allowed", id, c, i)
		}
	}
	return nil
}

// ValidateAssignment checks the structure of an assignment: IDs, the
// recipe (ValidateRecipe), providers. Whether the node can run it is the
// node's question.
func ValidateAssignment(a *Assignment) error {
	if err := ValidateAttemptID(a.GetAttemptId()); err != nil {
		return err
	}
	id := a.GetAttemptId()
	for _, f := range []struct{ name, v string }{{"suite", a.GetSuite()}, {"group", a.GetGroup()}} {
		if len(f.v) > MaxFilterLen {
			return invalid("assignment %s: %s of %d bytes (max %d)", id, f.name, len(f.v), MaxFilterLen)
		}
	}
	if len(a.GetLabel()) > MaxReportText {
		return invalid("assignment %s: label of %d bytes (max %d)", id, len(a.GetLabel()), MaxReportText)
	}
	if t := a.GetModelToken(); len(t) > MaxModelToken || strings.ContainsFunc(t, func(r rune) bool { return r <= ' ' || r >= 0x7f }) {
		return invalid("assignment %s: model token of %d bytes (max %d) or with other than printable ASCII", id, len(t), MaxModelToken)
	}
	if a.GetRecipe() == nil {
		return invalid("assignment %s: no recipe", id)
	}
	if err := ValidateRecipe(a.GetRecipe()); err != nil {
		return fmt.Errorf("assignment %s: %w", id, err)
	}
	for i, p := range a.GetProviders() {
		if _, err := peer.IDFromBytes(p.GetPeerId()); err != nil {
			return invalid("assignment %s: providers[%d]: %v", id, i, err)
		}
	}
	return nil
}

// MaxModelToken bounds an assignment's model token.
const MaxModelToken = 256

// Bounds on a recipe.
const (
	MaxRecipeInputs  = 64
	MaxRecipeEdits   = 1024
	MaxRecipeMounts  = 64
	MaxRecipeArgs    = 1024
	MaxRecipeOutputs = 1024
	// MaxRecipeWrite bounds one written file, and the files of a recipe
	// together (with everything else) fit MaxAssignmentSize.
	MaxRecipeWrite = 128 << 10
	// MaxRecipePath bounds a path or an argument.
	MaxRecipePath = 4096
)

// ValidEnvVar checks one environment entry: KEY=value, a non-empty key
// without NUL, at most MaxRecipePath bytes in all.
func ValidEnvVar(kv string) error {
	k, _, ok := strings.Cut(kv, "=")
	if !ok || k == "" || len(kv) > MaxRecipePath || strings.ContainsRune(kv, 0) {
		return fmt.Errorf("want KEY=value (at most %d bytes), got %q", MaxRecipePath, clipQuoted(kv))
	}
	return nil
}

// clipQuoted bounds what an error quotes of input.
func clipQuoted(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

// ValidateRecipe checks the structure of a recipe, naming the field: CIDs
// that parse, workspace paths that are clean and relative, container paths
// that are absolute and clean, bounded lists and sizes, environment
// entries of the form KEY=value, limits with CPU, memory and a wall-clock
// limit. Network rules are checked where they are enforced
// (sandbox.ParseNetwork, through recipe.Validate).
func ValidateRecipe(r *Recipe) error {
	if _, err := cid.Cast(r.GetImageCid()); err != nil {
		return invalid("recipe: image_cid: %v", err)
	}
	if len(r.GetInputs()) > MaxRecipeInputs || len(r.GetEdits()) > MaxRecipeEdits || len(r.GetMounts()) > MaxRecipeMounts ||
		len(r.GetOutputs()) > MaxRecipeOutputs || len(r.GetArgs())+len(r.GetEntrypoint())+len(r.GetEnv()) > MaxRecipeArgs {
		return invalid("recipe: %d inputs, %d edits, %d mounts, %d outputs, %d arguments: over the bounds (%d, %d, %d, %d, %d)",
			len(r.GetInputs()), len(r.GetEdits()), len(r.GetMounts()), len(r.GetOutputs()),
			len(r.GetArgs())+len(r.GetEntrypoint())+len(r.GetEnv()), MaxRecipeInputs, MaxRecipeEdits, MaxRecipeMounts,
			MaxRecipeOutputs, MaxRecipeArgs)
	}
	for i, in := range r.GetInputs() {
		if _, err := cid.Cast(in.GetCid()); err != nil {
			return invalid("recipe: inputs[%d].cid: %v", i, err)
		}
		if in.GetPath() != "" {
			if err := CheckWorkspacePath(in.GetPath()); err != nil {
				return invalid("recipe: inputs[%d].path: %v", i, err)
			}
		}
		if !in.GetExtract() && in.GetPath() == "" {
			return invalid("recipe: inputs[%d]: a file input needs a path", i)
		}
		if t := in.GetTop(); t != "" && (!in.GetExtract() || strings.Contains(t, "/") || CheckWorkspacePath(t) != nil) {
			return invalid("recipe: inputs[%d].top %q: a single folder name, for an extracted input", i, t)
		}
	}
	for i, e := range r.GetEdits() {
		var p string
		switch op := e.GetOp().(type) {
		case *Edit_Remove:
			p = op.Remove
		case *Edit_Dir:
			p = op.Dir
		case *Edit_EmptyDir:
			p = op.EmptyDir
		case *Edit_Write:
			p = op.Write.GetPath()
			if len(op.Write.GetContent()) > MaxRecipeWrite {
				return invalid("recipe: edits[%d].write: %d bytes (max %d)", i, len(op.Write.GetContent()), MaxRecipeWrite)
			}
		case *Edit_RemoveMatching:
			p = op.RemoveMatching.GetUnder()
			if len(op.RemoveMatching.GetAny()) == 0 {
				return invalid("recipe: edits[%d].remove_matching: no file match", i)
			}
		default:
			return invalid("recipe: edits[%d]: no operation", i)
		}
		if err := CheckWorkspacePath(p); err != nil {
			return invalid("recipe: edits[%d]: path %q: %v", i, p, err)
		}
	}
	for i, a := range append(append(slices.Clone(r.GetEntrypoint()), r.GetArgs()...), r.GetCwd()) {
		if len(a) > MaxRecipePath || strings.ContainsRune(a, 0) {
			return invalid("recipe: argument %d: over %d bytes or holds a NUL byte", i, MaxRecipePath)
		}
	}
	for i, kv := range r.GetEnv() {
		if err := ValidEnvVar(kv); err != nil {
			return invalid("recipe: env[%d]: %v", i, err)
		}
	}
	if c := r.GetCwd(); c != "" {
		if err := checkContainerPath(c); err != nil {
			return invalid("recipe: cwd %q: %v", c, err)
		}
	}
	targets := map[string]bool{}
	for i, m := range r.GetMounts() {
		if m.GetSource() != "" {
			if err := CheckWorkspacePath(m.GetSource()); err != nil {
				return invalid("recipe: mounts[%d].source: %v", i, err)
			}
		}
		if err := checkContainerPath(m.GetTarget()); err != nil || m.GetTarget() == "/" {
			return invalid("recipe: mounts[%d].target %q: an absolute, clean path other than /", i, m.GetTarget())
		}
		if targets[m.GetTarget()] {
			return invalid("recipe: mounts[%d].target %q: mounted twice", i, m.GetTarget())
		}
		targets[m.GetTarget()] = true
	}
	if env := r.GetEnvironment(); env != nil {
		if err := CheckWorkspacePath(env.GetDockerfile()); err != nil {
			return invalid("recipe: environment.dockerfile: %v", err)
		}
		if c := env.GetContext(); c != "" {
			if err := CheckWorkspacePath(c); err != nil {
				return invalid("recipe: environment.context: %v", err)
			}
		}
		if t := env.GetImageMount(); t != "" { // empty: the job's image is not shown
			if err := checkContainerPath(t); err != nil || t == "/" {
				return invalid("recipe: environment.image_mount %q: an absolute, clean path other than /", t)
			}
			if targets[t] {
				return invalid("recipe: environment.image_mount %q: also a mount's target", t)
			}
		}
	}
	l := r.GetLimits()
	if l.GetCpuMillis() == 0 || l.GetMemoryBytes() == 0 || l.GetWallSeconds() == 0 {
		return invalid("recipe: limits need cpu_millis, memory_bytes and wall_seconds")
	}
	if g := r.GetGpus(); len(g.GetModel()) > MaxLabelLen*2 {
		return invalid("recipe: gpus.model of %d bytes", len(g.GetModel()))
	}
	for i, o := range r.GetOutputs() {
		if err := CheckWorkspacePath(o.GetPath()); err != nil {
			return invalid("recipe: outputs[%d].path: %v", i, err)
		}
		if o.GetMaxBytes() == 0 {
			return invalid("recipe: outputs[%d].max_bytes: 0", i)
		}
	}
	return nil
}

// CheckWorkspacePath checks that p is a clean relative path: not empty,
// no leading "/", no empty, "." or ".." component, no NUL byte, at most
// MaxRecipePath bytes.
func CheckWorkspacePath(p string) error {
	switch {
	case p == "":
		return errors.New("empty path")
	case len(p) > MaxRecipePath:
		return fmt.Errorf("path of %d bytes (max %d)", len(p), MaxRecipePath)
	case strings.HasPrefix(p, "/"):
		return errors.New("absolute path refused: paths are relative to the workspace")
	case strings.ContainsRune(p, 0):
		return errors.New("path holds a NUL byte")
	}
	for _, c := range strings.Split(p, "/") {
		switch c {
		case "..":
			return errors.New(`path with a ".." component refused`)
		case "", ".":
			return errors.New("not a clean relative path (empty or . component)")
		}
	}
	return nil
}

// checkContainerPath checks an absolute, clean path inside the container.
func checkContainerPath(p string) error {
	if !strings.HasPrefix(p, "/") || path.Clean(p) != p || strings.ContainsRune(p, 0) || len(p) > MaxRecipePath {
		return errors.New("want an absolute, clean path")
	}
	return nil
}

// DecodeAnnouncement decodes an announcement of at most MaxAnnouncementSize bytes.
func DecodeAnnouncement(data []byte) (*Announcement, error) {
	if len(data) > MaxAnnouncementSize {
		return nil, invalid("announcement is %d bytes, over the %d byte limit", len(data), MaxAnnouncementSize)
	}
	a := new(Announcement)
	if err := gproto.Unmarshal(data, a); err != nil {
		return nil, fmt.Errorf("%w: decode announcement: %v", ErrInvalid, err)
	}
	return a, nil
}

// Bounds on a report's fields beyond its envelope's size.
const (
	// MaxReportText bounds the report's free-text fields (detail,
	// report_error, an output's error).
	MaxReportText = 16 << 10
	// MaxReportOutputs bounds the output files a report returns.
	MaxReportOutputs = 1024
	// MaxOutputPath bounds an output file's path.
	MaxOutputPath = 4096
	// MaxReportEgressHosts bounds the hosts of a report's egress record
	// (the node keeps the 64 with the most connections).
	MaxReportEgressHosts = 64
	// MaxEgressHost bounds an egress host's name (a DNS name's 253, or
	// an IPv6 literal's).
	MaxEgressHost = 253
	// maxEgressCount bounds an egress host's connection and refusal
	// counts, maxEgressBytes its byte counts (a PiB).
	maxEgressCount = 1 << 32
	maxEgressBytes = 1 << 50
	// maxReportCPUSeconds bounds usage.cpu_seconds: a year of 1024 cores,
	// far beyond any attempt, but small enough to stay exact in a float64
	// and in every encoding.
	maxReportCPUSeconds = 1024 * 365 * 24 * 3600
	// minReportUnixMillis is 2020-01-01: no report was made before it.
	minReportUnixMillis = 1577836800000
	// maxReportUnixMillis is 2100-01-01: a time past it is no report's
	// (issue 24: a report "finished" in the year 292 million was counted).
	maxReportUnixMillis = 4102444800000
)

// ValidateReport checks every field of a report that its envelope's
// signature cannot vouch for: numbers finite and in range (a NaN or an
// infinity would make the attempt's record impossible to encode), times
// in order, the outcome one the protocol defines, text and lists bounded.
// Node and coordinator both call it: the node before it seals a report,
// the coordinator before it records one. Every error names the field.
func ValidateReport(r *Report) error {
	if err := ValidateAttemptID(r.GetAttemptId()); err != nil {
		return err
	}
	id := r.GetAttemptId()
	if _, ok := Outcome_name[int32(r.GetOutcome())]; !ok {
		return invalid("report %s: outcome %d is not one the protocol defines", id, r.GetOutcome())
	}
	u := r.GetUsage()
	switch cpu := u.GetCpuSeconds(); {
	case math.IsNaN(cpu) || math.IsInf(cpu, 0):
		return invalid("report %s: usage.cpu_seconds is %v, not a finite number", id, cpu)
	case cpu < 0 || cpu > maxReportCPUSeconds:
		return invalid("report %s: usage.cpu_seconds %v is outside [0, %d]", id, cpu, maxReportCPUSeconds)
	}
	if w := u.GetWallMillis(); w < 0 {
		return invalid("report %s: usage.wall_millis %d is negative", id, w)
	}
	started, finished := r.GetStartedUnixMillis(), r.GetFinishedUnixMillis()
	switch {
	case started < minReportUnixMillis || finished < minReportUnixMillis:
		return invalid("report %s: started_unix_millis %d and finished_unix_millis %d must both be set (after 2020)", id, started, finished)
	case finished < started:
		return invalid("report %s: finished_unix_millis %d is before started_unix_millis %d", id, finished, started)
	case finished > maxReportUnixMillis:
		return invalid("report %s: finished_unix_millis %d is after 2100", id, finished)
	}
	if len(r.GetDetail()) > MaxReportText {
		return invalid("report %s: detail is %d bytes (max %d)", id, len(r.GetDetail()), MaxReportText)
	}
	if err := verify.ValidHead(r.GetModelChainHead()); err != nil {
		return invalid("report %s: model_chain_head: %v", id, err)
	}
	if _, err := cid.Cast(r.GetImageCid()); err != nil && len(r.GetImageCid()) > 0 {
		return invalid("report %s: image_cid: %v", id, err)
	}
	if k := len(r.GetInputCids()); k > MaxRecipeInputs {
		return invalid("report %s: %d input_cids (max %d)", id, k, MaxRecipeInputs)
	}
	if k := len(r.GetOutputs()); k > MaxReportOutputs {
		return invalid("report %s: %d outputs (max %d)", id, k, MaxReportOutputs)
	}
	for i, o := range r.GetOutputs() {
		if len(o.GetPath()) == 0 || len(o.GetPath()) > MaxOutputPath {
			return invalid("report %s: outputs[%d].path must be 1-%d bytes", id, i, MaxOutputPath)
		}
		if len(o.GetError()) > MaxReportText {
			return invalid("report %s: outputs[%d].error is %d bytes (max %d)", id, i, len(o.GetError()), MaxReportText)
		}
		if o.GetError() == "" {
			if _, err := cid.Cast(o.GetCid()); err != nil {
				return invalid("report %s: outputs[%d].cid: %v", id, i, err)
			}
		}
	}
	return validateEgress(id, r.GetEgress(), r.GetEgressHostsOmitted())
}

// validateEgress checks a report's egress record: at most
// MaxReportEgressHosts hosts, each named once by 1-MaxEgressHost printable
// ASCII characters, counts and bytes bounded, and at least one connection
// refusal or failure each.
func validateEgress(id string, hosts []*EgressHost, omitted uint32) error {
	if k := len(hosts); k > MaxReportEgressHosts {
		return invalid("report %s: %d egress hosts (max %d)", id, k, MaxReportEgressHosts)
	}
	if omitted > maxEgressCount/2 {
		return invalid("report %s: egress_hosts_omitted %d is implausible", id, omitted)
	}
	seen := make(map[string]bool, len(hosts))
	for i, h := range hosts {
		name := h.GetHost()
		if len(name) == 0 || len(name) > MaxEgressHost {
			return invalid("report %s: egress[%d].host must be 1-%d bytes", id, i, MaxEgressHost)
		}
		for j := 0; j < len(name); j++ {
			if c := name[j]; c <= ' ' || c > '~' {
				return invalid("report %s: egress[%d].host has byte %#x at %d: want printable ASCII", id, i, c, j)
			}
		}
		if seen[name] {
			return invalid("report %s: egress[%d].host %q twice", id, i, name)
		}
		seen[name] = true
		switch {
		case h.GetConnections() == 0 && h.GetRefused() == 0 && h.GetFailed() == 0:
			return invalid("report %s: egress[%d] (%s): neither a connection, a refusal nor a failure", id, i, name)
		case h.GetConnections() > maxEgressCount || h.GetRefused() > maxEgressCount || h.GetFailed() > maxEgressCount:
			return invalid("report %s: egress[%d] (%s): connections %d, refused %d, failed %d (max %d each)", id, i, name,
				h.GetConnections(), h.GetRefused(), h.GetFailed(), uint64(maxEgressCount))
		case h.GetBytesSent() > maxEgressBytes || h.GetBytesReceived() > maxEgressBytes:
			return invalid("report %s: egress[%d] (%s): bytes sent %d, received %d (max %d each)", id, i, name,
				h.GetBytesSent(), h.GetBytesReceived(), uint64(maxEgressBytes))
		}
	}
	return nil
}
