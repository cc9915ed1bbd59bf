package node

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/gateway/modelnet"
	"github.com/repronet/repronet/sandbox"
	"github.com/repronet/repronet/sandbox/egress"
	"github.com/repronet/repronet/sandbox/pkgcache"
)

// The environment a job runs in, besides its recipe: root in a user
// namespace of its own, the node's egress proxy (host names, with the
// package cache), its granted GPUs, and, with model access, a model
// endpoint of its own.

// ModelPort is the port of a job's model endpoint, on the host end of its
// link (only that job reaches it).
const ModelPort = 8000

// startEgress opens the package cache and the egress proxy.
func (n *Node) startEgress() error {
	cfg := n.cfg.Egress
	if cfg.Logger == nil {
		cfg.Logger = n.log.With("component", "egress")
	}
	if pc := n.cfg.PackageCache; pc != nil {
		c := *pc
		if c.Logger == nil {
			c.Logger = n.log.With("component", "pkgcache")
		}
		cache, err := pkgcache.Open(c)
		if err != nil {
			return fmt.Errorf("package cache: %w", err)
		}
		n.pkgs = cache
		cfg.Transport = cache.Wrap
	}
	onRefuse := cfg.OnRefuse
	cfg.OnRefuse = func(r egress.Refusal) {
		n.egressRefused.Add(1)
		if onRefuse != nil {
			onRefuse(r)
		}
	}
	p, err := egress.New(cfg)
	if err != nil {
		return fmt.Errorf("egress proxy: %w", err)
	}
	n.egress = p
	return nil
}

// modelService is the model endpoint of a job with model access: a proxy
// of the coordinator's gateway for this attempt alone (its calls carry
// the attempt), and its address and token in the job's environment as
// OpenAI's, Anthropic's and Google's Gemini SDKs (and Gemini CLI) read
// them.
//
// onHead is told the chain head each answer carries: the last one goes
// in the report.
func (n *Node) modelService(ctx context.Context, coord peer.ID, attempt, token string, onHead func(string)) sandbox.Service {
	return sandbox.Service{Name: "model endpoint", Port: ModelPort,
		Start: func(listen netip.AddrPort, _ netip.Addr) (func(), error) {
			o := modelnet.ProxyOptions{Attempt: attempt, OnChainHead: onHead}
			if h := n.cfg.TestHooks; h != nil && h.ModelRequest != nil {
				o.TestRewriteRequest = func(b []byte) []byte { return h.ModelRequest(attempt, b) }
			}
			p, err := modelnet.StartProxy(ctx, n.host, coord, listen.String(), o, n.log.With("attempt", attempt, "component", "model-proxy"))
			if err != nil {
				return nil, err
			}
			return func() { p.Close() }, nil
		},
		Env: func(listen netip.AddrPort) []string {
			base := "http://" + listen.String()
			return []string{"OPENAI_BASE_URL=" + base + "/v1", "OPENAI_API_KEY=" + token,
				"ANTHROPIC_BASE_URL=" + base, "ANTHROPIC_API_KEY=" + token,
				"GOOGLE_GEMINI_BASE_URL=" + base, "GEMINI_API_KEY=" + token, "REPRONET_MODEL_URL=" + base}
		}}
}
