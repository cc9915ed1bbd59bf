package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/repronet/repronet/sandbox/ociimage"
)

// LabelImageKey labels the images imported with ImportKeyedImage; its value
// is the caller's key (the node uses the agent image's CID). Only these
// images count against the image cache quota and are ever pruned.
const LabelImageKey = "repronet.image.key"

const (
	labelImageUsed  = "repronet.image.used"  // Unix nanoseconds of the last import or lookup
	labelImageBytes = "repronet.image.bytes" // content plus unpacked layers
)

// keyedImageName is the image name of a key: the key itself when it is a
// short lower-case alphanumeric string (as CIDv1 in base32 is), else a hash.
func keyedImageName(key string) string {
	plain := len(key) > 0 && len(key) <= 100
	for _, c := range key {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			plain = false
			break
		}
	}
	if !plain {
		sum := sha256.Sum256([]byte(key))
		key = "sha256-" + hex.EncodeToString(sum[:16])
	}
	return "repronet.local/keyed/" + key + ":latest"
}

// ImportKeyedImage imports an OCI image-layout tarball under key (e.g. a
// content identifier of the tarball) and returns its image name. The name
// depends only on the key, never on names inside the tarball, so two
// tarballs that call themselves the same never replace each other. The
// image joins the cache: once keyed images take more than the quota
// (WithImageCacheBytes), the least recently used that no attempt is running
// are removed.
func (r *Runner) ImportKeyedImage(ctx context.Context, key string, tarball io.Reader) (string, error) {
	if key == "" {
		return "", errors.New("import keyed image: key is empty")
	}
	r.importMu.Lock()
	defer r.importMu.Unlock()
	ctx = r.nsCtx(ctx)
	// A lease holds the imported content until the image record refers to it.
	lctx, done, err := r.client.WithLease(ctx)
	if err != nil {
		return "", fmt.Errorf("import image %s: lease: %w", key, err)
	}
	defer done(context.WithoutCancel(ctx))
	cs := r.client.ContentStore()
	// Checked as the coordinator checked it at its push, before anything
	// is unpacked: no device files, no links to nothing, and files that add
	// up to no more than the image cache's quota (a decompression bomb is
	// refused here, wrapping ociimage.ErrImageRefused).
	cr := ociimage.NewCheckingReader(tarball, ociimage.CheckLimits{UnpackedBytes: r.imageQuota})
	index, err := archive.ImportIndex(lctx, cs, cr)
	if err != nil {
		if ctx.Err() == nil {
			// The check's reason, when it has one, says what is wrong
			// with the image better than the importer's.
			if verdict := cr.Finish(); verdict != nil {
				return "", fmt.Errorf("import image %s: %w", key, verdict)
			}
		} else {
			cr.Abort()
		}
		return "", fmt.Errorf("import image %s: %w", key, err)
	}
	if err := cr.Finish(); err != nil {
		return "", fmt.Errorf("import image %s: %w", key, err)
	}
	// Label the index's children for the garbage collector (for the host
	// platform), as containerd's own importer does.
	handler := images.FilterPlatforms(images.SetChildrenLabels(cs, images.ChildrenHandler(cs)), platforms.Default())
	if err := images.WalkNotEmpty(lctx, handler, index); err != nil {
		return "", fmt.Errorf("import image %s: %w", key, err)
	}
	return r.registerKeyed(ctx, lctx, key, index)
}

// registerKeyed names target (an index or manifest whose content is in
// the store, held by the lease of lctx) as key's image, unpacks it, records
// its size, and prunes the cache. r.importMu is held.
func (r *Runner) registerKeyed(ctx, lctx context.Context, key string, target ocispec.Descriptor) (string, error) {
	name := keyedImageName(key)
	rec := images.Image{Name: name, Target: target, Labels: map[string]string{
		LabelImageKey:  key,
		labelImageUsed: strconv.FormatInt(time.Now().UnixNano(), 10),
	}}
	is := r.client.ImageService()
	if _, err := is.Update(lctx, rec, "target", "labels"); errdefs.IsNotFound(err) {
		_, err = is.Create(lctx, rec)
		if err != nil {
			return "", fmt.Errorf("import image %s: record: %w", key, err)
		}
	} else if err != nil {
		return "", fmt.Errorf("import image %s: record: %w", key, err)
	}
	img := client.NewImage(r.client, rec)
	start := time.Now()
	if err := img.Unpack(lctx, r.snapshotter); err != nil {
		return "", fmt.Errorf("unpack image %s into %s: %w", name, r.snapshotter, err)
	}
	size, err := img.Usage(lctx, client.WithSnapshotUsage())
	if err != nil {
		return "", fmt.Errorf("size of image %s: %w", name, err)
	}
	if _, err := is.Update(lctx, images.Image{Name: name, Labels: map[string]string{labelImageBytes: strconv.FormatInt(size, 10)}},
		"labels."+labelImageBytes); err != nil {
		return "", fmt.Errorf("record size of image %s: %w", name, err)
	}
	r.log.Info("imported keyed image", "key", key, "image", name, "bytes", size, "unpack", time.Since(start))
	if _, err := r.pruneImages(ctx, name); err != nil {
		r.log.Warn("prune image cache", "err", err)
	}
	return name, nil
}

// KeyedImage returns the name of the image imported under key, if it is
// present and complete, and marks it as just used.
func (r *Runner) KeyedImage(ctx context.Context, key string) (string, bool, error) {
	ctx = r.nsCtx(ctx)
	name := keyedImageName(key)
	ok, err := r.HasImage(ctx, name)
	if err != nil || !ok {
		return "", false, err
	}
	is := r.client.ImageService()
	if _, err := is.Update(ctx, images.Image{Name: name, Labels: map[string]string{labelImageUsed: strconv.FormatInt(time.Now().UnixNano(), 10)}},
		"labels."+labelImageUsed); err != nil {
		if errdefs.IsNotFound(err) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("mark image %s used: %w", name, err)
	}
	return name, true, nil
}

// ImageConfig returns the configuration of the image name for the host
// platform: its entrypoint, command, environment, working folder, user
// (the node runs an agent's entrypoint from its image mounted in another
// image, CORE-Bench Medium).
func (r *Runner) ImageConfig(ctx context.Context, name string) (ocispec.ImageConfig, error) {
	ctx = r.nsCtx(ctx)
	img, err := r.client.GetImage(ctx, name)
	if err != nil {
		return ocispec.ImageConfig{}, fmt.Errorf("image %s: %w", name, err)
	}
	spec, err := img.Spec(ctx)
	if err != nil {
		return ocispec.ImageConfig{}, fmt.Errorf("config of image %s: %w", name, err)
	}
	return spec.Config, nil
}

// PruneImages removes the least recently used keyed images that no attempt
// is running until they fit the quota. It returns how many it removed.
func (r *Runner) PruneImages(ctx context.Context) (int, error) {
	r.importMu.Lock()
	defer r.importMu.Unlock()
	return r.pruneImages(r.nsCtx(ctx), "")
}

func (r *Runner) pruneImages(ctx context.Context, keep string) (int, error) {
	is := r.client.ImageService()
	imgs, err := is.List(ctx, fmt.Sprintf("labels.%q", LabelImageKey))
	if err != nil {
		return 0, fmt.Errorf("list keyed images: %w", err)
	}
	type entry struct {
		name  string
		used  int64
		bytes int64
	}
	var entries []entry
	var total int64
	for _, img := range imgs {
		used, _ := strconv.ParseInt(img.Labels[labelImageUsed], 10, 64)
		n, _ := strconv.ParseInt(img.Labels[labelImageBytes], 10, 64)
		entries = append(entries, entry{img.Name, used, n})
		total += n
	}
	sort.Slice(entries, func(i, j int) bool { return entries[i].used < entries[j].used })
	removed := 0
	var errs []error
	for _, e := range entries {
		if total <= r.imageQuota {
			break
		}
		if e.name == keep || r.imageInUse(e.name) {
			continue
		}
		if err := is.Delete(ctx, e.name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove image %s: %w", e.name, err))
			continue
		}
		total -= e.bytes
		removed++
		r.log.Info("pruned image from cache", "image", e.name, "bytes", e.bytes, "cache_bytes", total, "quota", r.imageQuota)
	}
	return removed, errors.Join(errs...)
}
