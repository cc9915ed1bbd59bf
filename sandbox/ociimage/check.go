package ociimage

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/klauspost/compress/zstd"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Checking an image archive as a node imports it. The coordinator checks
// every pushed agent image with Check and the node checks every image
// before it gives it to containerd, with the same rules: what a push
// accepts, a node can run, and an image that cannot run is refused at
// the push with its reason instead of failing on volunteers' machines.

// CheckLimits bound what Check accepts.
type CheckLimits struct {
	// UnpackedBytes bounds the bytes of an image's files, all layers
	// added up (a decompression bomb unpacks to far more than it moves);
	// 0: DefaultUnpackedBytes.
	UnpackedBytes int64
	// Entries bounds the entries of all layers together; 0:
	// DefaultEntries.
	Entries int
}

// Defaults of CheckLimits.
const (
	DefaultUnpackedBytes = 32 << 30
	DefaultEntries       = 2_000_000
	// maxJSON bounds an index, manifest or configuration read.
	maxJSON = 4 << 20
)

// ErrImageRefused wraps every reason Check refuses an image.
var ErrImageRefused = errors.New("image refused")

// CheckSummary is what Check found in an accepted image.
type CheckSummary struct {
	// Format is "oci" (an OCI image layout) or "docker" (docker save).
	Format string
	// Manifests and Layers count the images and their distinct layers.
	Manifests, Layers int
	// UnpackedBytes are the bytes of the largest image's files; Entries
	// the entries of all layers.
	UnpackedBytes int64
	Entries       int
}

// Check reads an image archive through once: an OCI image layout or a
// docker save archive, gzipped or not. It refuses, wrapping
// ErrImageRefused and naming the file at fault: an archive with neither
// index.json nor manifest.json; a manifest, configuration or layer that is
// missing, or whose digest or size differs from what names it; a
// configuration whose rootfs.diff_ids are not its layers' uncompressed
// digests; a layer entry that is a device file (character or block), whose
// path leaves the root, or that hard-links to a file no layer below it or
// before it holds; and an image whose files add up to more than
// lim.UnpackedBytes, or whose layers hold more than lim.Entries entries.
func Check(r io.Reader, lim CheckLimits) (CheckSummary, error) {
	if lim.UnpackedBytes <= 0 {
		lim.UnpackedBytes = DefaultUnpackedBytes
	}
	if lim.Entries <= 0 {
		lim.Entries = DefaultEntries
	}
	c := &checker{lim: lim, blobs: map[string]*blob{}}
	if err := c.read(r); err != nil {
		return CheckSummary{}, err
	}
	return c.finish()
}

type checker struct {
	lim     CheckLimits
	blobs   map[string]*blob // by their path in the archive
	entries int
}

// blob is a file of the archive.
type blob struct {
	sha256 string // hex
	size   int64
	json   []byte // kept when small and not a layer
	layer  *layer
}

// layer is what a layer holds, as far as linking and sizes go.
type layer struct {
	diffID   string // sha256 of the uncompressed tar, hex
	files    map[string]bool
	removed  []string // whiteouts: paths of lower layers it removes
	links    [][2]string
	unpacked int64
	entries  int
}

func refuse(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrImageRefused, fmt.Sprintf(format, args...))
}

func (c *checker) read(r io.Reader) error {
	br := bufio.NewReader(r)
	var in io.Reader = br
	if magic, err := br.Peek(2); err == nil && magic[0] == 0x1f && magic[1] == 0x8b {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return refuse("the archive: %v", err)
		}
		defer gz.Close()
		in = gz
	}
	tr := tar.NewReader(in)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return refuse("the archive: %v", err)
		}
		if h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeRegA {
			continue
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		b, err := c.readBlob(name, tr)
		if err != nil {
			return err
		}
		c.blobs[name] = b
	}
}

// readBlob hashes one file of the archive and, when it is a layer (a tar,
// gzipped, zstd-compressed or not), checks its entries.
func (c *checker) readBlob(name string, r io.Reader) (*blob, error) {
	sum := sha256.New()
	cr := &countReader{r: io.TeeReader(r, sum)}
	br := bufio.NewReaderSize(cr, 64<<10)
	head, _ := br.Peek(512)
	b := &blob{}
	var err error
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		var gz *gzip.Reader
		if gz, err = gzip.NewReader(br); err == nil {
			b.layer, err = c.readLayer(name, gz)
			gz.Close()
		}
	case bytes.HasPrefix(head, []byte{0x28, 0xb5, 0x2f, 0xfd}):
		var zr *zstd.Decoder
		if zr, err = zstd.NewReader(br, zstd.WithDecoderConcurrency(1)); err == nil {
			b.layer, err = c.readLayer(name, zr)
			zr.Close()
		}
	case len(head) == 512 && string(head[257:262]) == "ustar":
		b.layer, err = c.readLayer(name, br)
	default:
		var j []byte
		if j, err = io.ReadAll(io.LimitReader(br, maxJSON+1)); err == nil && len(j) <= maxJSON {
			b.json = j
		}
	}
	if err != nil {
		return nil, err
	}
	if _, err := io.Copy(io.Discard, br); err != nil {
		return nil, refuse("%s: %v", name, err)
	}
	b.sha256, b.size = hex.EncodeToString(sum.Sum(nil)), cr.n
	return b, nil
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// readLayer walks a layer's tar.
func (c *checker) readLayer(name string, r io.Reader) (*layer, error) {
	sum := sha256.New()
	tr := tar.NewReader(io.TeeReader(r, sum))
	l := &layer{files: map[string]bool{}}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, refuse("layer %s: %v", name, err)
		}
		c.entries++
		l.entries++
		if c.entries > c.lim.Entries {
			return nil, refuse("layer %s: over %d entries in the image's layers", name, c.lim.Entries)
		}
		p, err := entryPath(h.Name)
		if err != nil {
			return nil, refuse("layer %s: %v", name, err)
		}
		switch h.Typeflag {
		case tar.TypeChar, tar.TypeBlock:
			return nil, refuse("layer %s: %s is a device file (%d,%d): images may not make devices", name, p, h.Devmajor, h.Devminor)
		case tar.TypeLink:
			target, err := entryPath(h.Linkname)
			if err != nil {
				return nil, refuse("layer %s: hard link %s: %v", name, p, err)
			}
			if !l.files[target] {
				l.links = append(l.links, [2]string{p, target}) // resolved against the layers below
			}
			l.files[p] = true
		case tar.TypeReg, tar.TypeRegA:
			l.unpacked += h.Size
			if l.unpacked > c.lim.UnpackedBytes {
				return nil, refuse("layer %s: unpacks to over %d bytes", name, c.lim.UnpackedBytes)
			}
			if base := path.Base(p); strings.HasPrefix(base, ".wh.") {
				if base != ".wh..wh..opq" {
					l.removed = append(l.removed, path.Join(path.Dir(p), strings.TrimPrefix(base, ".wh.")))
				}
				continue
			}
			l.files[p] = true
		case tar.TypeSymlink, tar.TypeFifo:
			l.files[p] = true
		}
	}
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return nil, refuse("layer %s: %v", name, err)
	}
	// The tar's end may be followed by padding: read it for the digest.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return nil, refuse("layer %s: %v", name, err)
	}
	l.diffID = hex.EncodeToString(sum.Sum(nil))
	return l, nil
}

// entryPath is a layer entry's path inside the root, or why it leaves it.
func entryPath(name string) (string, error) {
	if name == "" {
		return "", errors.New("an entry without a name")
	}
	for _, part := range strings.Split(strings.TrimPrefix(name, "/"), "/") {
		if part == ".." {
			return "", fmt.Errorf("%q leaves the root", name)
		}
	}
	return strings.TrimPrefix(path.Clean("/"+name), "/"), nil
}

// image is one image of the archive: its configuration and layers.
type image struct {
	what   string // for messages
	config *blob
	layers []*blob
}

func (c *checker) finish() (CheckSummary, error) {
	var (
		images []image
		format string
		err    error
	)
	switch {
	case c.blobs["index.json"] != nil:
		format = "oci"
		images, err = c.ociImages()
	case c.blobs["manifest.json"] != nil:
		format = "docker"
		images, err = c.dockerImages()
	default:
		return CheckSummary{}, refuse("no index.json (OCI layout) or manifest.json (docker save) at its top")
	}
	if err != nil {
		return CheckSummary{}, err
	}
	if len(images) == 0 {
		return CheckSummary{}, refuse("%s names no image", map[string]string{"oci": "index.json", "docker": "manifest.json"}[format])
	}
	s := CheckSummary{Format: format, Manifests: len(images), Entries: c.entries}
	distinct := map[*blob]bool{}
	for _, im := range images {
		size, err := c.checkImage(im)
		if err != nil {
			return CheckSummary{}, err
		}
		s.UnpackedBytes = max(s.UnpackedBytes, size)
		for _, l := range im.layers {
			distinct[l] = true
		}
	}
	s.Layers = len(distinct)
	return s, nil
}

// checkImage checks an image's configuration against its layers, the
// sum of its layers' sizes and its hard links, in layer order.
func (c *checker) checkImage(im image) (int64, error) {
	var cfg ocispec.Image
	if err := json.Unmarshal(im.config.json, &cfg); err != nil || im.config.json == nil {
		return 0, refuse("%s: its configuration is not JSON: %v", im.what, err)
	}
	if len(cfg.RootFS.DiffIDs) != len(im.layers) {
		return 0, refuse("%s: its configuration lists %d layers (rootfs.diff_ids), its manifest %d", im.what, len(cfg.RootFS.DiffIDs), len(im.layers))
	}
	present := map[string]bool{}
	var total int64
	for i, l := range im.layers {
		if want := "sha256:" + l.layer.diffID; cfg.RootFS.DiffIDs[i].String() != want {
			return 0, refuse("%s: layer %d unpacks to %s, but its configuration says %s", im.what, i, want, cfg.RootFS.DiffIDs[i])
		}
		for _, r := range l.layer.removed {
			for p := range present {
				if p == r || strings.HasPrefix(p, r+"/") {
					delete(present, p)
				}
			}
		}
		for _, ln := range l.layer.links {
			if !present[ln[1]] {
				return 0, refuse("%s: layer %d: hard link %s names %s, which no file before it holds", im.what, i, ln[0], ln[1])
			}
		}
		for p := range l.layer.files {
			present[p] = true
		}
		total += l.layer.unpacked
		if total > c.lim.UnpackedBytes {
			return 0, refuse("%s: its layers unpack to over %d bytes", im.what, c.lim.UnpackedBytes)
		}
	}
	return total, nil
}

// ociImages follows index.json to its manifests (through nested
// indexes), each to its configuration and layers, by digest.
func (c *checker) ociImages() ([]image, error) {
	var out []image
	var walk func(what string, b *blob, depth int) error
	walk = func(what string, b *blob, depth int) error {
		if depth > 4 {
			return refuse("%s: indexes nested deeper than 4", what)
		}
		var idx ocispec.Index
		if err := json.Unmarshal(b.json, &idx); err != nil || b.json == nil {
			return refuse("%s is not JSON: %v", what, err)
		}
		for i, d := range idx.Manifests {
			mb, err := c.byDigest(fmt.Sprintf("%s manifests[%d]", what, i), d)
			if err != nil {
				return err
			}
			switch d.MediaType {
			case ocispec.MediaTypeImageIndex, "application/vnd.docker.distribution.manifest.list.v2+json":
				if err := walk(fmt.Sprintf("index %s", d.Digest), mb, depth+1); err != nil {
					return err
				}
				continue
			}
			var m ocispec.Manifest
			if err := json.Unmarshal(mb.json, &m); err != nil || mb.json == nil {
				return refuse("manifest %s is not JSON: %v", d.Digest, err)
			}
			im := image{what: "manifest " + d.Digest.String()}
			if im.config, err = c.byDigest(im.what+" config", m.Config); err != nil {
				return err
			}
			for j, ld := range m.Layers {
				lb, err := c.byDigest(fmt.Sprintf("%s layers[%d]", im.what, j), ld)
				if err != nil {
					return err
				}
				if lb.layer == nil {
					return refuse("%s layers[%d] %s is not a tar (plain, gzip or zstd)", im.what, j, ld.Digest)
				}
				im.layers = append(im.layers, lb)
			}
			out = append(out, im)
		}
		return nil
	}
	if err := walk("index.json", c.blobs["index.json"], 0); err != nil {
		return nil, err
	}
	return out, nil
}

// byDigest is the blob a descriptor names, checked against its digest
// and size.
func (c *checker) byDigest(what string, d ocispec.Descriptor) (*blob, error) {
	if d.Digest.Algorithm() != digest.SHA256 || d.Digest.Validate() != nil {
		return nil, refuse("%s: digest %q is not a sha256 digest", what, d.Digest)
	}
	b := c.blobs["blobs/sha256/"+d.Digest.Encoded()]
	switch {
	case b == nil:
		return nil, refuse("%s: blob %s is not in the archive", what, d.Digest)
	case b.sha256 != d.Digest.Encoded():
		return nil, refuse("%s: blob %s holds content of digest sha256:%s", what, d.Digest, b.sha256)
	case b.size != d.Size:
		return nil, refuse("%s: blob %s is %d bytes, its descriptor says %d", what, d.Digest, b.size, d.Size)
	}
	return b, nil
}

// dockerImages follows manifest.json (docker save) to each image's
// configuration and layers, by path.
func (c *checker) dockerImages() ([]image, error) {
	var ms []struct {
		Config string
		Layers []string
	}
	if err := json.Unmarshal(c.blobs["manifest.json"].json, &ms); err != nil {
		return nil, refuse("manifest.json is not docker save's list of images: %v", err)
	}
	var out []image
	for i, m := range ms {
		im := image{what: fmt.Sprintf("manifest.json[%d]", i)}
		if im.config = c.blobs[strings.TrimPrefix(path.Clean("/"+m.Config), "/")]; im.config == nil {
			return nil, refuse("%s: its configuration %q is not in the archive", im.what, m.Config)
		}
		for j, p := range m.Layers {
			lb := c.blobs[strings.TrimPrefix(path.Clean("/"+p), "/")]
			if lb == nil || lb.layer == nil {
				return nil, refuse("%s: layer %d %q is not a tar in the archive", im.what, j, p)
			}
			im.layers = append(im.layers, lb)
		}
		out = append(out, im)
	}
	return out, nil
}

// CheckingReader passes an archive through to its consumer (a store, an
// importer) while Check reads a copy, so that the archive is read once.
// At the end of the archive Read answers Check's refusal instead of io.EOF,
// so that a consumer reading to the end fails; Finish gives the verdict
// to one that stops before the end.
type CheckingReader struct {
	r        io.Reader
	pw       *io.PipeWriter
	verdict  chan error
	err      error // what Read answers from now on
	finished bool
	result   error
}

// NewCheckingReader returns a reader of r whose copy Check reads with lim.
func NewCheckingReader(r io.Reader, lim CheckLimits) *CheckingReader {
	pr, pw := io.Pipe()
	c := &CheckingReader{pw: pw, verdict: make(chan error, 1)}
	c.r = io.TeeReader(r, pw)
	go func() {
		_, err := Check(pr, lim)
		_, _ = io.Copy(io.Discard, pr) // the consumer reads on, whatever Check found
		c.verdict <- err
	}()
	return c
}

// Read implements io.Reader.
func (c *CheckingReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.r.Read(p)
	if err == nil {
		return n, nil
	}
	c.pw.CloseWithError(err)
	c.err = err
	if verdict := c.wait(); err == io.EOF && verdict != nil {
		c.err = verdict
	}
	return n, c.err
}

// Finish reads what the consumer left of the archive, and returns Check's
// verdict (nil: accepted). It may be called more than once.
func (c *CheckingReader) Finish() error {
	if c.err == nil {
		_, err := io.Copy(io.Discard, c.r)
		if err == nil {
			err = io.EOF
		}
		c.pw.CloseWithError(err)
		c.err = err
	}
	return c.wait()
}

// Abort ends the check when the consumer gave up on the archive.
func (c *CheckingReader) Abort() {
	c.pw.CloseWithError(errors.New("the archive was not read to its end"))
}

func (c *CheckingReader) wait() error {
	if !c.finished {
		c.result, c.finished = <-c.verdict, true
	}
	return c.result
}
