package coordinator

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/sandbox/ociimage"
)

// Imports: the bytes go into the capsule store (served over bitswap), the
// records into the catalog (package catalog).

// ImportSuite stores a suite: its family's definition, opened (strictly:
// every error names the task and field) by the family it names. Every
// content its tasks name must be imported (AddCapsule) before an
// evaluation of the suite runs. WithSuiteLimits gives the suite sandbox
// settings of its own. It returns the number of tasks.
func (c *Coordinator) ImportSuite(ctx context.Context, def bench.SuiteDef, opts ...SuiteOption) (int, error) {
	return c.catalog.ImportSuite(ctx, def, opts...)
}

// HasSuite reports whether a suite of that name was imported.
func (c *Coordinator) HasSuite(name string) bool {
	_, ok := c.catalog.LookupSuite(name)
	return ok
}

// AddCapsule imports content (a capsule tarball...) into the capsule
// store under the name tasks give it, and serves it over bitswap.
func (c *Coordinator) AddCapsule(ctx context.Context, id string, tarball io.Reader) (Capsule, error) {
	info, err := c.store.Add(ctx, tarball)
	if err != nil {
		return Capsule{}, fmt.Errorf("add capsule %s: %w", id, err)
	}
	cp := Capsule{ID: id, CID: info.CID.String(), Size: info.Size, SHA256: info.SHA256}
	return cp, c.catalog.AddContent(ctx, cp)
}

// Capsule returns imported content by name.
func (c *Coordinator) Capsule(id string) (Capsule, bool) { return c.catalog.Content(id) }

// AddAgent imports an agent's OCI image tarball under name; the agent is
// not declared deterministic and has no model (see AddAgentWith).
func (c *Coordinator) AddAgent(ctx context.Context, name string, tarball io.Reader) (Agent, error) {
	return c.AddAgentWith(ctx, AgentInfo{Name: name}, tarball)
}

// AddAgentWith imports an agent's OCI image tarball with what its
// submitter declares about it.
func (c *Coordinator) AddAgentWith(ctx context.Context, info AgentInfo, tarball io.Reader) (Agent, error) {
	if info.Name == "" {
		return Agent{}, errors.New("add agent: empty name")
	}
	// Checked as a node imports it, while it is stored: an image no node
	// could run is refused here with its reason (wrapping
	// ociimage.ErrImageRefused), never charged to a node later.
	cr := ociimage.NewCheckingReader(tarball, ociimage.CheckLimits{UnpackedBytes: c.cfg.MaxImageUnpacked})
	st, err := c.store.Add(ctx, cr)
	if err != nil {
		cr.Abort()
		return Agent{}, fmt.Errorf("add agent %s: %w", info.Name, err)
	}
	if err := cr.Finish(); err != nil {
		return Agent{}, fmt.Errorf("add agent %s: %w", info.Name, err)
	}
	a := Agent{Name: info.Name, CID: st.CID.String(), Size: st.Size, SHA256: st.SHA256, Model: info.Model,
		Deterministic: info.Deterministic, NotReplayable: info.NotReplayable}
	return a, c.catalog.AddAgent(ctx, a)
}

// SetAgentInfo changes what is declared about a registered agent. It
// applies to units queued from then on.
func (c *Coordinator) SetAgentInfo(ctx context.Context, info AgentInfo) error {
	return c.catalog.Declare(ctx, info)
}

// Agent returns a registered agent.
func (c *Coordinator) Agent(name string) (Agent, bool) { return c.catalog.Agent(name) }

// HasAgent reports whether an agent of that name was registered.
func (c *Coordinator) HasAgent(name string) bool {
	_, ok := c.catalog.Agent(name)
	return ok
}
