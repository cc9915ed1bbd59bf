package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/repronet/repronet/sandbox/ociimage"
)

// keyedTarball builds a busybox image whose /id holds id. Every such image
// calls itself by the same name inside the tarball.
func keyedTarball(t *testing.T, id string) []byte {
	t.Helper()
	files, err := ociimage.BusyboxFiles(busyboxPath)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, ociimage.File{Path: "/id", Mode: 0o644, Data: []byte(id + "\n")})
	var buf bytes.Buffer
	if _, err := ociimage.Build(&buf, "repronet.local/test/same-name:1", files, ociimage.Config{Cmd: []string{"cat", "/id"}}); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestKeyedImageCache(t *testing.T) {
	ctx := context.Background()
	const ns = "repronet-sandbox-images"
	log := slog.New(slog.DiscardHandler)
	probe, err := New(ctx, testSocket, WithNamespace(ns), WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	cleanup := func() {
		is := probe.client.ImageService()
		imgs, _ := is.List(probe.nsCtx(ctx))
		for _, img := range imgs {
			_ = is.Delete(probe.nsCtx(ctx), img.Name)
		}
	}
	cleanup()
	defer cleanup()

	// Size one image to set a quota of two and a half.
	name, err := probe.ImportKeyedImage(ctx, "probe", bytes.NewReader(keyedTarball(t, "probe")))
	if err != nil {
		t.Fatal(err)
	}
	img, err := probe.client.ImageService().Get(probe.nsCtx(ctx), name)
	if err != nil {
		t.Fatal(err)
	}
	size, err := strconv.ParseInt(img.Labels[labelImageBytes], 10, 64)
	if err != nil || size < 1<<20 {
		t.Fatalf("recorded size %q, %v", img.Labels[labelImageBytes], err)
	}
	// A key that cannot be a name is hashed into one.
	if n, err := probe.ImportKeyedImage(ctx, "Not/A plain key", bytes.NewReader(keyedTarball(t, "odd"))); err != nil ||
		!strings.HasPrefix(n, "repronet.local/keyed/sha256-") {
		t.Fatalf("odd key: %q, %v", n, err)
	}
	if n, ok, err := probe.KeyedImage(ctx, "Not/A plain key"); err != nil || !ok || n == "" {
		t.Fatalf("KeyedImage(odd key) = %q, %v, %v", n, ok, err)
	}
	cleanup()

	r, err := New(ctx, testSocket, WithNamespace(ns), WithLogger(log), WithImageCacheBytes(size*5/2))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	names := map[string]string{}
	for _, key := range []string{"bafyaaa", "bafybbb"} {
		n, err := r.ImportKeyedImage(ctx, key, bytes.NewReader(keyedTarball(t, key)))
		if err != nil {
			t.Fatal(err)
		}
		names[key] = n
	}
	if names["bafyaaa"] == names["bafybbb"] || names["bafyaaa"] != "repronet.local/keyed/bafyaaa:latest" {
		t.Fatalf("names %v: want one per key", names)
	}

	// aaa runs (in use) while ccc is imported: the cache is over its quota,
	// aaa is the least recently used but busy, so bbb goes.
	type outcome struct {
		res Result
		err error
	}
	done := make(chan outcome, 1)
	go func() {
		res, err := r.Run(ctx, Spec{ID: "image-in-use", Image: names["bafyaaa"], Args: sh(`cat /id; sleep 2`)})
		done <- outcome{res, err}
	}()
	for deadline := time.Now().Add(10 * time.Second); !r.imageInUse(names["bafyaaa"]); time.Sleep(10 * time.Millisecond) {
		select {
		case o := <-done:
			t.Fatalf("attempt ended early: %v %+v", o.err, o.res)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("attempt did not start")
		}
	}
	names["bafyccc"], err = r.ImportKeyedImage(ctx, "bafyccc", bytes.NewReader(keyedTarball(t, "bafyccc")))
	if err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]bool{"bafyaaa": true, "bafybbb": false, "bafyccc": true} {
		if _, ok, err := r.KeyedImage(ctx, key); err != nil || ok != want {
			t.Errorf("KeyedImage(%s) = %v, %v; want %v", key, ok, err, want)
		}
	}
	o := <-done
	if o.err != nil || string(o.res.Stdout) != "bafyaaa\n" {
		t.Fatalf("attempt on aaa: %v %q", o.err, o.res.Stdout)
	}
	// Each keyed image runs its own content, though all share one name inside.
	res, err := r.Run(ctx, Spec{ID: "image-ccc", Image: names["bafyccc"]})
	if err != nil || string(res.Stdout) != "bafyccc\n" {
		t.Fatalf("ccc: %v %q", err, res.Stdout)
	}
	// Within the quota now: nothing to prune.
	if n, err := r.PruneImages(ctx); err != nil || n != 0 {
		t.Fatalf("PruneImages = %d, %v", n, err)
	}
	if n, err := r.Reconcile(ctx); err != nil || n != 0 {
		t.Fatalf("Reconcile = %d, %v", n, err)
	}
}

// TestImportRefusesWhatCheckRefuses: an image that makes a device, or
// whose files add up to more than the image cache's quota (a
// decompression bomb), is refused before anything is unpacked, with
// ociimage.ErrImageRefused and the reason; nothing of it is left as an
// image.
func TestImportRefusesWhatCheckRefuses(t *testing.T) {
	ctx := context.Background()
	const ns = "repronet-sandbox-refused"
	r, err := New(ctx, testSocket, WithNamespace(ns), WithLogger(slog.New(slog.DiscardHandler)), WithImageCacheBytes(1<<20))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	layer := func(hdrs ...tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range hdrs {
			tw.WriteHeader(&h)
			if h.Typeflag == tar.TypeReg {
				tw.Write(make([]byte, h.Size))
			}
		}
		tw.Close()
		return b.Bytes()
	}
	for name, c := range map[string]struct {
		layer []byte
		want  string
	}{
		"a device": {layer(tar.Header{Typeflag: tar.TypeChar, Name: "tmp/mem", Devmajor: 1, Devminor: 1, Mode: 0o666}), "tmp/mem is a device file (1,1)"},
		"a bomb":   {layer(tar.Header{Typeflag: tar.TypeReg, Name: "zeros", Size: 2 << 20, Mode: 0o644}), "unpacks to over 1048576 bytes"},
	} {
		t.Run(name, func(t *testing.T) {
			var img bytes.Buffer
			if _, err := ociimage.BuildFromLayer(&img, "repronet.local/test/hostile:1", c.layer, ociimage.Config{Cmd: []string{"/x"}}); err != nil {
				t.Fatal(err)
			}
			key := "bafy" + strings.ReplaceAll(name, " ", "")
			_, err := r.ImportKeyedImage(ctx, key, &img)
			if !errors.Is(err, ociimage.ErrImageRefused) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("got %v, want a refusal saying %q", err, c.want)
			}
			if _, ok, err := r.KeyedImage(ctx, key); ok || err != nil {
				t.Fatalf("the refused image is there: %v", err)
			}
		})
	}
}
