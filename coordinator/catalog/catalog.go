// Package catalog owns what a coordinator knows of imported things: suites
// (a family's definition, opened by that family, with the suite's own
// sandbox limits), content (capsule tarballs, paper folders: anything a
// task names, by content address) and agents (images, with what their
// submitters declare). Each is a durable record, written and synced before
// an import returns.
//
// It answers the core's lookups (core.Catalog) and the shell's. It stores
// records only: the bytes themselves live in the capsule store, which the
// shell fills before it records them here. It must not import the
// coordinator, libp2p or any benchmark family.
package catalog

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/ipfs/go-datastore"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/internal/dsjson"
	"github.com/repronet/repronet/proto"
)

// Suite is an imported suite as stored: its family's definition and its
// own sandbox settings.
type Suite struct {
	bench.SuiteDef
	// Limits are the suite's own sandbox settings (nil: the defaults).
	Limits *SuiteLimits `json:"limits,omitempty"`
}

// Content is imported content (a capsule tarball, a paper folder...) that
// tasks name (bench.Task.Content).
type Content struct {
	ID     string `json:"id"`
	CID    string `json:"cid"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Agent is a registered agent image.
type Agent struct {
	Name   string `json:"name"`
	CID    string `json:"cid"`
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
	// Model is the agent's primary model, as its submitter declared it
	// (a leaderboard column).
	Model string `json:"model,omitempty"`
	// Deterministic: the submitter declares that the agent answers a task
	// the same way on every honest node. Its replicas that disagree with
	// the majority are then invalid (not merely disagreeing), and its
	// validated attempts can be replayed as canaries.
	Deterministic bool `json:"deterministic,omitempty"`
	// NotReplayable: the submitter declares that the agent is not
	// replayable (randomness outside the model's answers, docs/agents.md):
	// its model-driven results are never replayed and show as unverified.
	NotReplayable bool `json:"not_replayable,omitempty"`
}

// Declared is what a submitter declares about an agent.
type Declared struct {
	Name string
	// Model is the agent's primary model (a leaderboard column).
	Model string
	// Deterministic declares that the agent answers a task alike on every
	// honest node (see Agent.Deterministic).
	Deterministic bool
	// NotReplayable declares that the agent cannot be replayed (see
	// Agent.NotReplayable).
	NotReplayable bool
}

// Key prefixes of the catalog's records.
var (
	suitesKey  = datastore.NewKey("/state/suites")
	contentKey = datastore.NewKey("/state/capsules")
	agentsKey  = datastore.NewKey("/state/agents")
)

// Catalog is the coordinator's catalog. It is safe for concurrent use.
type Catalog struct {
	ds       datastore.Batching
	families *bench.Registry
	// defaults are the limits of suites without their own.
	defaults *proto.Limits

	mu      sync.RWMutex
	suites  map[string]*opened
	content map[string]Content
	agents  map[string]Agent
}

// opened is a suite opened by its family.
type opened struct {
	stored Suite
	info   core.SuiteInfo
}

// Open loads the catalog from ds, opening every stored suite with its
// family. defaults are the limits of suites without their own.
func Open(ctx context.Context, ds datastore.Batching, families *bench.Registry, defaults *proto.Limits) (*Catalog, error) {
	if families == nil || defaults == nil {
		return nil, errors.New("catalog: families and default limits are required")
	}
	c := &Catalog{ds: ds, families: families, defaults: defaults, suites: map[string]*opened{},
		content: map[string]Content{}, agents: map[string]Agent{}}
	var suites []Suite
	err := errors.Join(
		dsjson.Load(ctx, ds, suitesKey, func(s Suite) { suites = append(suites, s) }),
		dsjson.Load(ctx, ds, contentKey, func(x Content) { c.content[x.ID] = x }),
		dsjson.Load(ctx, ds, agentsKey, func(a Agent) { c.agents[a.Name] = a }))
	if err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	for _, s := range suites {
		o, err := c.open(s)
		if err != nil {
			return nil, fmt.Errorf("catalog: stored suite %q: %w", s.Name, err)
		}
		c.suites[s.Name] = o
	}
	return c, nil
}

// open opens a stored suite with its family.
func (c *Catalog) open(s Suite) (*opened, error) {
	bs, err := c.families.Open(s.SuiteDef)
	if err != nil {
		return nil, err
	}
	limits := c.defaults
	if s.Limits != nil {
		limits = s.Limits.Apply(c.defaults)
	}
	info := core.SuiteInfo{Bench: bs, Tasks: make(map[string]bench.Task), Limits: limits}
	for _, t := range bs.Tasks() {
		info.Tasks[t.ID] = t
	}
	return &opened{stored: s, info: info}, nil
}

// SuiteOption configures an imported suite.
type SuiteOption func(*Suite)

// WithSuiteLimits gives a suite its own sandbox settings.
func WithSuiteLimits(l SuiteLimits) SuiteOption {
	return func(s *Suite) { s.Limits = &l }
}

// ImportSuite stores a suite: its family's definition, opened (strictly:
// every error names the task and field) by the family it names. It returns
// the number of tasks. Importing a suite of an existing name replaces it.
func (c *Catalog) ImportSuite(ctx context.Context, def bench.SuiteDef, opts ...SuiteOption) (int, error) {
	if !proto.ValidLabel(def.Name, proto.MaxFilterLen) {
		return 0, fmt.Errorf("import suite: name %q: want 1-%d of [A-Za-z0-9._+-]", def.Name, proto.MaxFilterLen)
	}
	s := Suite{SuiteDef: def}
	for _, o := range opts {
		o(&s)
	}
	if s.Limits != nil {
		if err := s.Limits.Validate(); err != nil {
			return 0, fmt.Errorf("import suite %q: %w", def.Name, err)
		}
	}
	o, err := c.open(s)
	if err != nil {
		return 0, fmt.Errorf("import suite: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.put(ctx, suitesKey.ChildString(def.Name), s); err != nil {
		return 0, fmt.Errorf("import suite %q: %w", def.Name, err)
	}
	c.suites[def.Name] = o
	return len(o.info.Tasks), nil
}

// AddContent records imported content (already in the capsule store).
func (c *Catalog) AddContent(ctx context.Context, x Content) error {
	if x.ID == "" {
		return errors.New("add content: empty ID")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.put(ctx, contentKey.ChildString(x.ID), x); err != nil {
		return fmt.Errorf("add content %s: %w", x.ID, err)
	}
	c.content[x.ID] = x
	return nil
}

// AddAgent records a registered agent image (already in the capsule store).
func (c *Catalog) AddAgent(ctx context.Context, a Agent) error {
	if a.Name == "" {
		return errors.New("add agent: empty name")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.put(ctx, agentsKey.ChildString(a.Name), a); err != nil {
		return fmt.Errorf("add agent %s: %w", a.Name, err)
	}
	c.agents[a.Name] = a
	return nil
}

// Declare changes what is declared about a registered agent. It applies to
// units queued from then on.
func (c *Catalog) Declare(ctx context.Context, d Declared) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.agents[d.Name]
	if !ok {
		return fmt.Errorf("agent %q is not registered", d.Name)
	}
	a.Model, a.Deterministic, a.NotReplayable = d.Model, d.Deterministic, d.NotReplayable
	if err := c.put(ctx, agentsKey.ChildString(a.Name), a); err != nil {
		return fmt.Errorf("agent %s: %w", a.Name, err)
	}
	c.agents[a.Name] = a
	return nil
}

// Agent returns a registered agent.
func (c *Catalog) Agent(name string) (Agent, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	a, ok := c.agents[name]
	return a, ok
}

// Agents returns every registered agent, by name.
func (c *Catalog) Agents() []Agent {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Agent, 0, len(c.agents))
	for _, a := range c.agents {
		out = append(out, a)
	}
	slices.SortFunc(out, func(a, b Agent) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// SuiteNames lists the imported suites, sorted.
func (c *Catalog) SuiteNames() []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]string, 0, len(c.suites))
	for n := range c.suites {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Content returns imported content.
func (c *Catalog) Content(id string) (Content, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	x, ok := c.content[id]
	return x, ok
}

// ContentList returns every imported content record.
func (c *Catalog) ContentList() []Content {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Content, 0, len(c.content))
	for _, x := range c.content {
		out = append(out, x)
	}
	return out
}

// LookupSuite returns an imported suite, as its family opened it, with
// the limits its jobs run under (core.Catalog).
func (c *Catalog) LookupSuite(name string) (core.SuiteInfo, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	o, ok := c.suites[name]
	if !ok {
		return core.SuiteInfo{}, false
	}
	return o.info, true
}

// LookupAgent returns what the core knows of an agent (core.Catalog).
func (c *Catalog) LookupAgent(name string) (core.AgentInfo, bool) {
	a, ok := c.Agent(name)
	return core.AgentInfo{CID: a.CID, Size: a.Size, Deterministic: a.Deterministic, Model: a.Model, NotReplayable: a.NotReplayable}, ok
}

// LookupContent returns what the core knows of content (core.Catalog).
func (c *Catalog) LookupContent(name string) (core.ContentInfo, bool) {
	x, ok := c.Content(name)
	return core.ContentInfo{CID: x.CID, Size: x.Size}, ok
}

var _ core.Catalog = (*Catalog)(nil)

// put writes v under k and syncs it; callers hold c.mu.
func (c *Catalog) put(ctx context.Context, k datastore.Key, v any) error {
	return dsjson.Put(ctx, c.ds, k, v)
}
