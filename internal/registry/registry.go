// Package registry is a read-only OCI distribution registry serving the
// images of OCI image-layout tarballs (as ociimage.Build makes them): what
// a site's registry mirror is to a node, for the tests and for nodes
// without a way out. It serves /v2/, manifests by tag or digest and blobs
// by digest (GET and HEAD), and refuses everything else.
//
// It owns only the serving of what it was given, held in memory; it pushes
// nothing, authenticates no one and knows nothing of the node or the
// sandbox.
package registry

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/repronet/repronet/sandbox/ociimage"
)

// Registry serves images; New makes one.
type Registry struct {
	blobs map[digest.Digest][]byte
	media map[digest.Digest]string // manifests' media types
	tags  map[string]digest.Digest // "repository:tag" -> manifest
}

// New reads OCI image-layout tarballs: each image of their index.json is
// served under the name its io.containerd.image.name annotation gives
// ("docker.io/library/busybox:1.36" is repository library/busybox, tag
// 1.36, as a mirror of docker.io is asked for it).
func New(layouts ...[]byte) (*Registry, error) {
	r := &Registry{blobs: map[digest.Digest][]byte{}, media: map[digest.Digest]string{}, tags: map[string]digest.Digest{}}
	for i, l := range layouts {
		if err := r.add(l); err != nil {
			return nil, fmt.Errorf("registry: layout %d: %w", i, err)
		}
	}
	return r, nil
}

func (r *Registry) add(layout []byte) error {
	tr := tar.NewReader(bytes.NewReader(layout))
	var index []byte
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return err
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return err
		}
		if h.Name == "index.json" {
			index = b
		} else if enc, ok := strings.CutPrefix(h.Name, "blobs/sha256/"); ok && enc != "" {
			d := digest.NewDigestFromEncoded(digest.SHA256, enc)
			if d.Validate() != nil || digest.FromBytes(b) != d {
				return fmt.Errorf("blob %s: its content does not match its name", h.Name)
			}
			r.blobs[d] = b
		}
	}
	var idx ocispec.Index
	if err := json.Unmarshal(index, &idx); err != nil {
		return fmt.Errorf("index.json: %w", err)
	}
	if len(idx.Manifests) == 0 {
		return errors.New("index.json names no image")
	}
	for _, m := range idx.Manifests {
		if _, ok := r.blobs[m.Digest]; !ok {
			return fmt.Errorf("manifest %s: not in the layout", m.Digest)
		}
		r.media[m.Digest] = m.MediaType
		name := m.Annotations[ociimage.AnnotationImageName]
		if name == "" {
			return fmt.Errorf("manifest %s: no %s annotation", m.Digest, ociimage.AnnotationImageName)
		}
		_, path, ok := strings.Cut(name, "/") // drop the registry host
		repo, tag, hasTag := strings.Cut(path, ":")
		if !ok || !hasTag || repo == "" || tag == "" {
			return fmt.Errorf("manifest %s: name %q is not HOST/REPOSITORY:TAG", m.Digest, name)
		}
		r.tags[repo+":"+tag] = m.Digest
	}
	return nil
}

// ServeHTTP answers the pull half of the distribution API.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		http.Error(w, "read-only registry", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Docker-Distribution-API-Version", "registry/2.0")
	p, ok := strings.CutPrefix(req.URL.Path, "/v2/")
	switch {
	case !ok:
		http.NotFound(w, req)
		return
	case p == "":
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, "{}")
		return
	}
	var repo, kind, ref string
	if i := strings.LastIndex(p, "/manifests/"); i > 0 {
		repo, kind, ref = p[:i], "manifests", p[i+len("/manifests/"):]
	} else if i := strings.LastIndex(p, "/blobs/"); i > 0 {
		repo, kind, ref = p[:i], "blobs", p[i+len("/blobs/"):]
	} else {
		http.NotFound(w, req)
		return
	}
	d := digest.Digest(ref)
	if kind == "manifests" {
		if t, ok := r.tags[repo+":"+ref]; ok {
			d = t
		}
		if _, ok := r.media[d]; !ok {
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
			return
		}
		w.Header().Set("Content-Type", r.media[d])
	}
	b, ok := r.blobs[d]
	if !ok {
		http.Error(w, `{"errors":[{"code":"BLOB_UNKNOWN"}]}`, http.StatusNotFound)
		return
	}
	if kind == "blobs" {
		w.Header().Set("Content-Type", "application/octet-stream")
	}
	w.Header().Set("Docker-Content-Digest", d.String())
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	if req.Method == http.MethodGet {
		w.Write(b)
	}
}
