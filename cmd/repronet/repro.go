package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"cmp"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/repronet/repronet/bench/repro"
	"github.com/repronet/repronet/bench/repro/reproenv"
	"github.com/repronet/repronet/internal/debimage"
)

// Coordinator API of reproducibility checks (submitting needs a
// submitter's token, or the admin's).
const (
	// reproPath: POST a multipart/form-data body with a "spec" part
	// (repro.Spec as JSON), optionally an "image" part (the registered
	// agent image the runs use), and a "capsule" part (the capsule
	// tarball, last); the answer is {"id": "..."}.
	reproPath = "/api/repro"
	// reproStatusPath + ID: GET repro.Status.
	reproStatusPath = "/api/repro/"
)

// reproService is what `repronet repro` needs from a coordinator.
type reproService interface {
	Submit(ctx context.Context, spec repro.Spec, capsuleName string, capsule io.Reader) (string, error)
	Status(ctx context.Context, id string) (repro.Status, error)
}

const reproUsage = `repro submit TARBALL [--spec SPEC.json] [--runs K] [--wait] | repro status ID | repro check (--spec SPEC.json [--claimed TARBALL|DIR] | --capsule-id ID) RUN_DIR... | repro runtime-image --out FILE`

func runRepro(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprintf(stderr, "Usage: repronet %s\n\n"+
			"  submit  runs the capsule's own run script K times on distinct nodes and reports which answers reproduce\n"+
			"          (without --spec: a draft task entry from every number of the runs' results/, to edit)\n"+
			"  status  shows a submitted check\n"+
			"  check   builds the report from runs made elsewhere (capsule folders after their run), without a coordinator\n"+
			"  runtime-image  builds the default environment of capsules without environment/ (Debian 12, Python 3, R), to push as agent \"runtime\"\n", reproUsage)
		if len(args) == 0 {
			return errors.New("a subcommand is required")
		}
		return nil
	}
	switch args[0] {
	case "submit":
		return reproSubmit(ctx, args[1:], stdout, stderr)
	case "status":
		return reproStatus(ctx, args[1:], stdout, stderr)
	case "check":
		return reproCheck(args[1:], stdout, stderr)
	case "runtime-image":
		return reproRuntimeImage(ctx, args[1:], stdout, stderr)
	}
	return fmt.Errorf("unknown subcommand %q (submit, status, check, runtime-image)", args[0])
}

// apiFlags are the flags of the commands that talk to a coordinator.
type apiFlags struct {
	api, tokenFile *string
	asJSON         *bool
	timeout        *time.Duration
	fs             *flag.FlagSet
}

func addAPIFlags(fs *flag.FlagSet) apiFlags {
	return apiFlags{
		fs:        fs,
		api:       fs.String("api", "http://127.0.0.1:8080", "base URL of the coordinator's HTTP API (default: $REPRONET_API when set)"),
		tokenFile: fs.String("token-file", "", "file holding the bearer token for submitting (default: $REPRONET_TOKEN)"),
		asJSON:    fs.Bool("json", false, "print JSON"),
		timeout:   fs.Duration("timeout", 10*time.Minute, "HTTP timeout of one request (an upload can be large)"),
	}
}

// client is the API client of the parsed flags: --api, else $REPRONET_API,
// else the local default; --token-file, else $REPRONET_TOKEN. Every
// command that talks to a coordinator reads the same settings.
func (f apiFlags) client() (*apiClient, error) {
	if env := os.Getenv("REPRONET_API"); env != "" && (f.fs == nil || !flagSet(f.fs, "api")) {
		*f.api = env
	}
	token := os.Getenv("REPRONET_TOKEN")
	if *f.tokenFile != "" {
		b, err := os.ReadFile(*f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	return newAPIClient(*f.api, token, *f.timeout)
}

func reproSubmit(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("repro submit", "repro submit TARBALL [--spec SPEC.json] [--runs K] [--wait] [--api URL]", stderr)
	f := addAPIFlags(fs)
	specPath := fs.String("spec", "", "the check: capsule description and rules, as JSON (repro.Spec); none: a draft check (the runs' results/ compared value by value into a draft task entry)")
	runs := fs.Int("runs", 0, "K, the runs on distinct nodes (overrides the spec; default 3)")
	wait := fs.Bool("wait", false, "wait for the report")
	image := fs.String("image", "", `registered agent image the runs use as their environment (default: the coordinator's "runtime", else "oracle")`)
	if err := fs.Parse(interleave(args)); err != nil {
		return err
	}
	if len(fs.Args()) != 1 {
		fs.Usage()
		return errors.New("one TARBALL is required")
	}
	var spec repro.Spec
	var err error
	if *specPath != "" {
		spec, err = readSpec(*specPath, *runs)
	} else {
		spec, err = draftSpec(fs.Args()[0], *runs)
	}
	if err != nil {
		return err
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	c.reproImage = *image
	tarball := fs.Args()[0]
	file, err := os.Open(tarball)
	if err != nil {
		return err
	}
	defer file.Close()
	return reproSubmitWith(ctx, c, spec, filepath.Base(tarball), file, *wait, *f.asJSON, 2*time.Second, stdout)
}

func reproSubmitWith(ctx context.Context, svc reproService, spec repro.Spec, name string, capsule io.Reader, wait, asJSON bool, every time.Duration, stdout io.Writer) error {
	id, err := svc.Submit(ctx, spec, name, capsule)
	if err != nil {
		return err
	}
	if !wait {
		if asJSON {
			return json.NewEncoder(stdout).Encode(map[string]string{"id": id})
		}
		fmt.Fprintf(stdout, "submitted %s: follow it with `repronet repro status %s`\n", id, id)
		return nil
	}
	if !asJSON {
		fmt.Fprintf(stdout, "submitted %s; waiting for its report\n", id)
	}
	last := ""
	for {
		st, err := svc.Status(ctx, id)
		if err != nil {
			return err
		}
		if st.State == repro.StateDone || st.State == repro.StateFailed {
			return printStatus(st, asJSON, stdout)
		}
		if line := statusLine(st); line != last && !asJSON {
			fmt.Fprint(stdout, line)
			last = line
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (%d of %d runs): %w", id, st.RunsDone, st.RunsWanted, ctx.Err())
		case <-time.After(every):
		}
	}
}

// reproRuntimeImage builds the capsules' default environment
// (reproenv.RuntimeImageSpec) with debimage: as root, with debootstrap,
// reaching a Debian mirror the first time (the root file system is cached).
func reproRuntimeImage(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("repro runtime-image", "repro runtime-image --out FILE [--mirror URL] [--cache DIR]", stderr)
	out := fs.String("out", "", "the OCI image tarball to write")
	mirror := fs.String("mirror", debimage.DefaultMirror, "Debian mirror")
	cache := fs.String("cache", debimage.DefaultCacheDir, "folder keeping the root file system between builds")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || fs.NArg() != 0 {
		fs.Usage()
		return errors.New("--out is required")
	}
	spec := reproenv.RuntimeImageSpec()
	if err := (debimage.Builder{CacheDir: *cache, Mirror: *mirror}).Build(ctx, *out, spec); err != nil {
		return fmt.Errorf("runtime image: %w", err)
	}
	fmt.Fprintf(stdout, "wrote %s (%s: %s); register it with `repronet agent push %s %s` (admin token), "+
		"and give it to nodes with --base-image %s so that environments can build FROM it\n",
		*out, spec.Ref, strings.Join(spec.Packages, ", "), reproenv.DefaultRuntimeAgent, *out, *out)
	return nil
}

func reproStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlags("repro status", "repro status ID [--api URL] [--json]", stderr)
	f := addAPIFlags(fs)
	if err := fs.Parse(interleave(args)); err != nil {
		return err
	}
	if len(fs.Args()) != 1 {
		fs.Usage()
		return errors.New("one check ID is required")
	}
	c, err := f.client()
	if err != nil {
		return err
	}
	st, err := c.Status(ctx, fs.Args()[0])
	if err != nil {
		return err
	}
	return printStatus(st, *f.asJSON, stdout)
}

// statusLine says how far a check is and why its runs wait, if they do.
func statusLine(st repro.Status) string {
	s := fmt.Sprintf("%s: %s, %d of %d runs done\n", st.ID, st.State, st.RunsDone, st.RunsWanted)
	for _, w := range st.Waiting {
		s += "  waiting: " + w + "\n"
	}
	return s
}

func printStatus(st repro.Status, asJSON bool, stdout io.Writer) error {
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	fmt.Fprint(stdout, statusLine(st))
	if st.Capsule.ID != "" {
		fmt.Fprintf(stdout, "capsule %s", st.Capsule.ID)
		if st.Capsule.Title != "" {
			fmt.Fprintf(stdout, ": %s", st.Capsule.Title)
		}
		fmt.Fprintln(stdout)
	}
	for _, r := range st.Runs {
		fmt.Fprintf(stdout, "  run %d: %s", r.Run, r.State)
		if r.Outcome != "" {
			fmt.Fprintf(stdout, ", %s", r.Outcome)
		}
		if r.ExitCode != nil {
			fmt.Fprintf(stdout, ", exit status %d", *r.ExitCode)
		}
		if r.Logs != "" {
			fmt.Fprintf(stdout, "  logs: repronet attempt logs %s", r.Attempt)
		}
		fmt.Fprintln(stdout)
	}
	for _, why := range st.FailedBecause {
		fmt.Fprintf(stdout, "failed: %s\n", why)
	}
	if st.Error != "" {
		fmt.Fprintf(stdout, "error: %s\n", st.Error)
	}
	if st.Report != nil {
		return st.Report.WriteText(stdout)
	}
	return nil
}

func reproCheck(args []string, stdout, stderr io.Writer) error {
	fs := newFlags("repro check", "repro check (--spec SPEC.json [--claimed TARBALL|DIR] | --capsule-id ID) [--json] RUN_DIR...", stderr)
	specPath := fs.String("spec", "", "the check: capsule description and rules, as JSON (repro.Spec)")
	capsuleID := fs.String("capsule-id", "", "without --spec: the capsule's ID; the runs' results/ are compared value by value into a draft task entry")
	claimed := fs.String("claimed", "", "the capsule as submitted (tarball or folder): its files give the answers to reproduce")
	asJSON := fs.Bool("json", false, "print the report as JSON (with the CORE-Bench task entry)")
	if err := fs.Parse(interleave(args)); err != nil {
		return err
	}
	if fs.NArg() < 2 || (*specPath == "") == (*capsuleID == "") {
		fs.Usage()
		return errors.New("--spec or --capsule-id, and at least 2 RUN_DIRs, are required")
	}
	var spec repro.Spec
	var err error
	if *specPath != "" {
		spec, err = readSpec(*specPath, 0)
	} else {
		spec = repro.Spec{Capsule: repro.Capsule{CapsuleID: *capsuleID}, Runs: fs.NArg()}
		err = spec.Validate()
	}
	if err != nil {
		return err
	}
	files := ruleFiles(spec.Rules)
	var runs []repro.Run
	for _, dir := range fs.Args() {
		var got map[string][]byte
		if spec.Draft() {
			got, err = readResultsDir(dir)
		} else {
			got, err = readCapsuleDir(dir, files)
		}
		if err != nil {
			return err
		}
		runs = append(runs, repro.Run{Node: dir, Outcome: "ok", Files: got})
	}
	var claimedFiles map[string][]byte
	if *claimed != "" {
		if fi, err := os.Stat(*claimed); err == nil && fi.IsDir() {
			claimedFiles, err = readCapsuleDir(*claimed, files)
			if err != nil {
				return err
			}
		} else {
			claimedFiles, err = readCapsuleTarball(*claimed, files)
			if err != nil {
				return err
			}
		}
	}
	rep, err := repro.Check(spec, runs, claimedFiles)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	return rep.WriteText(stdout)
}

// interleave moves positional arguments after the flags, so that
// `repro submit capsule.tar.gz --spec s.json` parses like Go's flag
// package wants it (flags first).
func interleave(args []string) []string {
	var flags, pos []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "--":
			pos = append(pos, args[i+1:]...)
			i = len(args)
		case strings.HasPrefix(a, "-") && a != "-":
			flags = append(flags, a)
			name := strings.TrimLeft(a, "-")
			if !strings.Contains(name, "=") && !boolFlag(name) && i+1 < len(args) {
				flags = append(flags, args[i+1])
				i++
			}
		default:
			pos = append(pos, a)
		}
	}
	return append(flags, pos...)
}

func boolFlag(name string) bool {
	switch name {
	case "wait", "json", "h", "help", "deterministic", "not-replayable", "watch":
		return true
	}
	return false
}

func readSpec(p string, runs int) (repro.Spec, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return repro.Spec{}, fmt.Errorf("--spec: %w", err)
	}
	var s repro.Spec
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&s); err != nil {
		return repro.Spec{}, fmt.Errorf("--spec %s: %w", p, err)
	}
	if runs != 0 {
		s.Runs = runs
	}
	if s.Runs == 0 {
		s.Runs = repro.DefaultRuns
	}
	if err := s.Validate(); err != nil {
		return repro.Spec{}, fmt.Errorf("--spec %s: %w", p, err)
	}
	return s, nil
}

func ruleFiles(rules []repro.Rule) map[string]bool {
	files := map[string]bool{}
	for _, r := range rules {
		files[r.File] = true
	}
	return files
}

// readCapsuleDir reads the rule files of a capsule folder; nothing outside
// the folder is read, whatever links it holds. A missing file is left out.
func readCapsuleDir(dir string, files map[string]bool) (map[string][]byte, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	out := map[string][]byte{}
	for name := range files {
		f, err := root.Open(name)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
		}
		b, err := io.ReadAll(io.LimitReader(f, repro.MaxFileSize+1))
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", filepath.Join(dir, name), err)
		}
		out[name] = b
	}
	return out, nil
}

// readResultsDir reads the regular files of a capsule folder's results/
// (a draft check's), within repro.MaxFileSize in all; nothing outside the
// folder is read, whatever links it holds.
func readResultsDir(dir string) (map[string][]byte, error) {
	root, err := os.OpenRoot(filepath.Join(dir, repro.ResultsDir))
	if err != nil {
		return nil, err
	}
	defer root.Close()
	out := map[string][]byte{}
	total := 0
	err = fs.WalkDir(root.FS(), ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := fs.ReadFile(root.FS(), name)
		if err != nil {
			return err
		}
		if total += len(b); total > repro.MaxFileSize {
			return fmt.Errorf("over %d bytes", repro.MaxFileSize)
		}
		out[repro.ResultsDir+"/"+name] = b
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, repro.ResultsDir), err)
	}
	return out, nil
}

// draftSpec is the spec of a draft check of a capsule tarball: its ID
// (the tarball's top folder) and, when metadata/metadata.yml has a name
// line, its title; runs (0: repro.DefaultRuns).
func draftSpec(tarball string, runs int) (repro.Spec, error) {
	top, meta, err := tarballTopAndFile(tarball, "metadata/metadata.yml")
	if err != nil {
		return repro.Spec{}, err
	}
	s := repro.Spec{Capsule: repro.Capsule{CapsuleID: top}, Runs: cmp.Or(runs, repro.DefaultRuns)}
	for _, line := range strings.Split(string(meta), "\n") {
		if v, ok := strings.CutPrefix(line, "name:"); ok {
			s.Capsule.CapsuleTitle = strings.Trim(strings.TrimSpace(v), `"'`)
			break
		}
	}
	if err := s.Validate(); err != nil {
		return repro.Spec{}, fmt.Errorf("%s: %w", tarball, err)
	}
	return s, nil
}

// tarballTopAndFile reads a capsule tarball's top folder and the file
// name below it (nil when absent).
func tarballTopAndFile(p, name string) (string, []byte, error) {
	top := ""
	var data []byte
	err := walkTarball(p, func(first, rest string, h *tar.Header, r io.Reader) error {
		if top == "" {
			top = first
		}
		if first != top || rest != name || h.Typeflag != tar.TypeReg {
			return nil
		}
		var err error
		data, err = io.ReadAll(io.LimitReader(r, 1<<20))
		return err
	})
	if err == nil && top == "" {
		err = fmt.Errorf("%s: an empty tarball", p)
	}
	return top, data, err
}

// readCapsuleTarball reads the rule files of a capsule tarball (gzipped
// or not) holding one top folder, the capsule's (any safe folder name); paths are taken below
// that folder. Only regular files are read.
func readCapsuleTarball(p string, files map[string]bool) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := walkTarball(p, func(_, rest string, h *tar.Header, r io.Reader) error {
		if h.Typeflag != tar.TypeReg || !files[rest] {
			return nil
		}
		b, err := io.ReadAll(io.LimitReader(r, repro.MaxFileSize+1))
		if err != nil {
			return fmt.Errorf("%s: %w", h.Name, err)
		}
		out[rest] = b
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// walkTarball calls fn with every entry of the tarball p (gzipped or
// not): its name's first component and the rest ("" for the top folder
// itself), its header and its content.
func walkTarball(p string, fn func(first, rest string, h *tar.Header, r io.Reader) error) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	br := bufio.NewReader(f)
	var r io.Reader = br
	if magic, _ := br.Peek(2); bytes.Equal(magic, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		defer gz.Close()
		r = gz
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		first, rest, _ := strings.Cut(path.Clean(strings.TrimPrefix(h.Name, "./")), "/")
		if err := fn(first, rest, h, tr); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
}

// Submit streams the spec and the capsule as multipart/form-data.
func (c *apiClient) Submit(ctx context.Context, spec repro.Spec, capsuleName string, capsule io.Reader) (string, error) {
	specJSON, err := json.Marshal(spec)
	if err != nil {
		return "", err
	}
	pr, pw := io.Pipe()
	mw := multipart.NewWriter(pw)
	go func() {
		err := func() error {
			h := textproto.MIMEHeader{}
			h.Set("Content-Disposition", `form-data; name="spec"`)
			h.Set("Content-Type", "application/json")
			part, err := mw.CreatePart(h)
			if err != nil {
				return err
			}
			if _, err := part.Write(specJSON); err != nil {
				return err
			}
			if c.reproImage != "" {
				if err := mw.WriteField("image", c.reproImage); err != nil {
					return err
				}
			}
			part, err = mw.CreateFormFile("capsule", capsuleName)
			if err != nil {
				return err
			}
			if _, err := io.Copy(part, capsule); err != nil {
				return err
			}
			return mw.Close()
		}()
		pw.CloseWithError(err)
	}()
	var resp struct {
		ID string `json:"id"`
	}
	if err := c.do(ctx, http.MethodPost, reproPath, pr, mw.FormDataContentType(), &resp); err != nil {
		pr.CloseWithError(err)
		return "", err
	}
	if resp.ID == "" {
		return "", fmt.Errorf("POST %s: no check ID in the answer", reproPath)
	}
	return resp.ID, nil
}

// Status fetches a check.
func (c *apiClient) Status(ctx context.Context, id string) (repro.Status, error) {
	var st repro.Status
	if id == "" || strings.ContainsAny(id, "/?#") {
		return st, fmt.Errorf("check ID %q is malformed", id)
	}
	return st, c.do(ctx, http.MethodGet, reproStatusPath+id, nil, "", &st)
}
