package node

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"slices"
	"strconv"
	"time"

	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/sandbox/dockerfile"
	"github.com/repronet/repronet/sandbox/egress"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// A job's environment (proto.Environment, CORE-Bench Medium): the node
// builds the Dockerfile of the job's workspace into an image with the
// sandbox (sandbox.BuildEnvironment: root in a user namespace, the job's
// limits and network), its FROM taken from the node's images or pulled
// through an egress proxy of the node's own that reaches the registries
// it allows and nothing else, and runs the job in that image with the
// job's own image mounted inside it. Built images are keyed images of the
// sandbox: the same environment is built once per node.

// DefaultRegistries are the registries a node pulls environments' base
// images from unless told otherwise: Docker Hub (with its token service
// and blob CDN), Code Ocean's (CORE-Bench's capsules are built FROM its
// images), GitHub's and Quay's.
func DefaultRegistries() []string {
	return []string{"registry-1.docker.io", "auth.docker.io", "production.cloudflare.docker.com", "registry.codeocean.com",
		"ghcr.io", "pkg-containers.githubusercontent.com", "quay.io", "*.quay.io"}
}

// startPulls sets up the proxy that pulls go through: the node's egress
// checks (names only, no private, loopback or link-local address unless
// Egress.Permit says, DNS rebinding refused) with the registries, and the
// mirrors' hosts and ports, as the only destinations.
func (n *Node) startPulls() error {
	hosts := slices.Clone(n.cfg.Registries)
	ports := []uint16{80, 443}
	for reg, urls := range n.cfg.RegistryMirrors {
		for _, m := range urls {
			_, base, err := sandbox.ParseMirror(reg + "=" + m)
			if err != nil {
				return err
			}
			u, _ := url.Parse(base)
			hosts = append(hosts, u.Hostname())
			if p := u.Port(); p != "" {
				port, err := strconv.ParseUint(p, 10, 16)
				if err != nil || port == 0 {
					return fmt.Errorf("registry mirror %s: port %q", m, p)
				}
				ports = append(ports, uint16(port))
			}
		}
	}
	if _, err := egress.ParseHosts(hosts); err != nil {
		return fmt.Errorf("registries: %w", err)
	}
	p, err := egress.New(egress.Config{Permit: n.cfg.Egress.Permit, Ports: ports, Resolver: n.cfg.Egress.Resolver,
		Dial: n.cfg.Egress.Dial, OnRefuse: func(egress.Refusal) { n.egressRefused.Add(1) },
		Logger: n.log.With("component", "registry-pulls")})
	if err != nil {
		return fmt.Errorf("registry pulls: %w", err)
	}
	n.pulls, n.registryHosts = p, hosts
	return nil
}

// importBaseImages imports Config.BaseImages into the node's daemon.
func (n *Node) importBaseImages(ctx context.Context) error {
	for _, p := range n.cfg.BaseImages {
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("base image: %w", err)
		}
		name, err := n.cfg.Sandbox.ImportImage(ctx, f)
		f.Close()
		if err != nil {
			return fmt.Errorf("base image %s: %w", p, err)
		}
		n.log.Info("base image imported", "image", name, "file", p)
	}
	return nil
}

// inEnvironment turns the spec of a job with an environment into the
// spec of the job in it: the environment built (or found built) from the
// workspace's Dockerfile, the job image's folder image_mount (if any)
// shown read-only at the same path, the job's entrypoint and command (the
// recipe's, else those of the job's image) run from there. The time it
// takes (pull and build) is taken off the job's wall-clock limit. ok is
// false when the recipe's environment is if_present and its Dockerfile is
// not there: the spec is left as it was.
func (n *Node) inEnvironment(ctx context.Context, spec *sandbox.Spec, r *proto.Recipe, log *slog.Logger) (ok bool, err error) {
	files, ok, err := recipe.Environment(spec.Workspace.Dir(), r)
	if err != nil || !ok {
		return false, err
	}
	deadline := time.Now().Add(spec.Limits.Wall)
	built, err := n.buildEnvironment(ctx, spec, files, deadline, log)
	if err != nil {
		return false, err
	}
	cfg, err := n.cfg.Sandbox.ImageConfig(ctx, spec.Image)
	if err != nil {
		return false, fmt.Errorf("environment: the job's image: %w", err)
	}
	if !r.GetEntrypointSet() {
		spec.Entrypoint = slices.Clone(cfg.Entrypoint)
		if len(r.GetArgs()) == 0 {
			spec.Args = slices.Clone(cfg.Cmd)
		}
	}
	if spec.Entrypoint == nil {
		spec.Entrypoint = []string{} // never the environment's own
	}
	if len(spec.Entrypoint)+len(spec.Args) == 0 {
		return false, errors.New("environment: neither the recipe nor the job's image names a command")
	}
	if m := r.GetEnvironment().GetImageMount(); m != "" {
		spec.ImageMounts = append(spec.ImageMounts, sandbox.ImageMount{Image: spec.Image, Source: m, Target: m})
	}
	spec.Image = built
	spec.Limits.Wall = max(time.Until(deadline), time.Second)
	return true, nil
}

// buildEnvironment builds the environment of files (or finds it built)
// with the job's limits, network and workspace size, and returns its
// image; pulling its base and building it must end by deadline (the
// build is killed there, as a job at its wall-clock limit).
func (n *Node) buildEnvironment(ctx context.Context, spec *sandbox.Spec, files recipe.EnvironmentFiles, deadline time.Time,
	log *slog.Logger) (string, error) {
	b, err := dockerfile.Parse(bytes.NewReader(files.Data), dockerfile.Options{})
	if err != nil {
		return "", fmt.Errorf("environment: %w", err)
	}
	base, err := ociimage.FullRef(b.From)
	if err != nil {
		return "", fmt.Errorf("environment: FROM %s: %w", b.From, err)
	}
	pctx, cancel := context.WithDeadline(ctx, deadline)
	err = n.baseImage(pctx, base, log)
	cancel()
	if err != nil {
		return "", err
	}
	// One build of a Dockerfile at a time: the next finds it built.
	sum := sha256.Sum256(files.Data)
	defer n.imports.lock("environment " + hex.EncodeToString(sum[:]))()
	start := time.Now()
	limits := spec.Limits
	if limits.Wall = time.Until(deadline); limits.Wall < time.Second {
		return "", fmt.Errorf("environment: no time left to build it (wall-clock limit %s)", spec.Limits.Wall)
	}
	res, err := n.cfg.Sandbox.BuildEnvironment(ctx, sandbox.BuildSpec{ID: spec.ID + "-env", Dockerfile: files.Dockerfile,
		Context: files.Context, Network: spec.Network, Proxy: spec.Proxy, Limits: limits})
	if err != nil {
		if tail := lastBytes(res.Run.Stderr, 512); tail != "" {
			err = fmt.Errorf("%w; its output ends: %s", err, tail)
		}
		return "", fmt.Errorf("environment: %w", err)
	}
	log.Info("environment ready", "image", res.Image, "from", base, "cached", res.Cached, "layer_bytes", res.Layer,
		"took", time.Since(start))
	return res.Image, nil
}

// baseImage makes sure the image ref (a Dockerfile's FROM) is in the
// node's daemon: there already (pulled before, or a base image the node
// was given), or pulled now through the registry proxy.
func (n *Node) baseImage(ctx context.Context, ref string, log *slog.Logger) error {
	defer n.imports.lock("base " + ref)()
	if ok, err := n.cfg.Sandbox.HasImage(ctx, ref); err != nil {
		return fmt.Errorf("environment: %w", err)
	} else if ok {
		return nil
	}
	if len(n.registryHosts) == 0 {
		return fmt.Errorf("environment: base image %s is not on this node, which pulls from no registry", ref)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("environment: registry proxy: %w", err)
	}
	s, err := n.pulls.Start("pull "+ref, ln, netip.MustParseAddr("127.0.0.1"), n.registryHosts)
	if err != nil {
		ln.Close()
		return fmt.Errorf("environment: registry proxy: %w", err)
	}
	defer s.Close()
	hc := &http.Client{Transport: &http.Transport{Proxy: http.ProxyURL(&url.URL{Scheme: "http", Host: ln.Addr().String()}),
		ResponseHeaderTimeout: 2 * time.Minute}}
	defer hc.CloseIdleConnections()
	start := time.Now()
	name, err := n.cfg.Sandbox.PullImage(ctx, ref, sandbox.PullOptions{Client: hc, Mirrors: n.cfg.RegistryMirrors})
	if err != nil {
		if k := s.Refused(); k > 0 {
			err = fmt.Errorf("%w (the registry proxy refused %d requests: registries allowed are %v)", err, k, n.registryHosts)
		}
		return fmt.Errorf("environment: base image: %w", err)
	}
	log.Info("base image pulled", "image", name, "took", time.Since(start))
	return nil
}

// lastBytes is the end of b, at most n bytes, as text.
func lastBytes(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}
