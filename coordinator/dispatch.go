package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/bench"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
	"github.com/repronet/repronet/recipe"
)

// scheduleLoop runs a scheduling round (core.Tick: leases that ran out
// requeued, queued attempts placed) every ScheduleInterval, or sooner when
// something woke it.
func (c *Coordinator) scheduleLoop(ctx context.Context) {
	tick := time.NewTicker(c.cfg.ScheduleInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		case <-c.wake:
		}
		c.round(ctx)
	}
}

// round is one scheduling round. The core learns which nodes' connections
// are up, and whether a placement could be recorded now (a full data
// folder holds placement).
func (c *Coordinator) round(ctx context.Context) {
	writable := c.writable() == nil
	c.mu.Lock()
	ids := c.state.NodeIDs()
	connected := make(map[string]bool, len(ids))
	for _, id := range ids {
		if p, err := peer.Decode(id); err == nil {
			connected[id] = c.host.Network().Connectedness(p) == network.Connected
		}
	}
	fx, t := c.stepLocked(core.Tick{Connected: connected, Writable: writable})
	c.mu.Unlock()
	c.carry(ctx, fx, t)
}

// dispatch builds the job of one placement and offers it to its node over
// a stream the coordinator opens on the connection the node keeps open;
// the core learns the answer.
func (c *Coordinator) dispatch(ctx context.Context, o core.Offer) {
	ev := core.OfferAnswered{Attempt: o.Attempt, Node: o.Node}
	log := c.log.With("attempt", o.Attempt, "node", o.Node)
	asg, err := c.assignment(o.Attempt)
	if err != nil {
		log.Error("job not built; attempt failed", "err", err)
		ev.Unbuildable = err.Error()
		c.step(ctx, ev)
		return
	}
	asg.LeaseDeadlineUnixMillis = o.Deadline.UnixMilli()
	resp, err := c.offer(ctx, o.Node, asg)
	switch {
	case err != nil:
		ev.Err = err.Error()
	case resp.GetAccepted():
		ev.Accepted, ev.Incarnation = true, resp.GetIncarnation()
	default:
		ev.Code, ev.Reason = resp.GetCode(), resp.GetReason()
		level := slog.LevelWarn
		if ev.Code == proto.DeclineCode_DECLINE_BUSY {
			level = slog.LevelInfo // normal when coordinators share nodes
		}
		log.Log(ctx, level, "assignment declined", "code", ev.Code.String(), "reason", ev.Reason)
	}
	c.step(ctx, ev)
}

func (c *Coordinator) offer(ctx context.Context, node string, asg *proto.Assignment) (*proto.AssignmentResponse, error) {
	id, err := peer.Decode(node)
	if err != nil {
		return nil, fmt.Errorf("node %q: %w", node, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	s, err := c.host.NewStream(network.WithNoDial(ctx, "nodes connect to the coordinator"), id, proto.AssignProtocol)
	if err != nil {
		return nil, fmt.Errorf("open assign stream: %w", err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(20 * time.Second))
	if err := proto.WriteMsg(s, asg); err != nil {
		s.Reset()
		return nil, err
	}
	var resp proto.AssignmentResponse
	if err := proto.ReadMsg(s, &resp, proto.MaxControlSize); err != nil {
		s.Reset()
		return nil, err
	}
	if resp.GetAttemptId() != asg.GetAttemptId() {
		return nil, fmt.Errorf("node answered for attempt %q", resp.GetAttemptId())
	}
	return &resp, nil
}

// assignment builds what a node is told about an attempt: its job as a
// neutral recipe, built by its suite's family (or its check's checker)
// and checked with the one validator nodes apply (recipe.Validate), and
// who can serve its first input. Never a gold answer, and nothing that
// tells a canary from a replica (a canary's assignment is a replica's but
// for its attempt ID and lease deadline).
func (c *Coordinator) assignment(id string) (*proto.Assignment, error) {
	job, r, err := c.jobRecipe(id)
	if err != nil {
		return nil, err
	}
	a := job.Attempt
	var providers []*proto.Provider
	if in := r.GetInputs(); len(in) > 0 {
		if first, err := cid.Cast(in[0].GetCid()); err == nil {
			providers = c.providersFor(first)
		}
	}
	if providers == nil {
		providers = []*proto.Provider{c.selfProvider()}
	}
	asg := &proto.Assignment{AttemptId: a.ID, Suite: a.Suite, Group: a.Group, Label: label(a), Recipe: r, Providers: providers}
	if c.models != nil && a.Kind != KindCapsuleRun {
		asg.ModelToken = c.models.token(a.ID, core.LeaseID(&a))
	}
	return asg, nil
}

// jobRecipe returns an attempt's job and its recipe.
func (c *Coordinator) jobRecipe(id string) (core.Job, *proto.Recipe, error) {
	c.mu.Lock()
	job, ok := c.state.JobOf(id)
	c.mu.Unlock()
	if !ok {
		return core.Job{}, nil, fmt.Errorf("no attempt %q", id)
	}
	r, err := c.recipeOf(job)
	return job, r, err
}

// recipeOf builds and validates the recipe of a job.
func (c *Coordinator) recipeOf(job core.Job) (*proto.Recipe, error) {
	var r *proto.Recipe
	var err error
	if job.Attempt.Kind == KindCapsuleRun {
		r, err = c.capsuleRunRecipe(job.Repro)
	} else {
		r, err = c.agentRecipe(job)
	}
	if err != nil {
		return nil, err
	}
	if err := recipe.Validate(r); err != nil {
		return nil, fmt.Errorf("the %s family built an invalid job: %w", job.Attempt.Suite, err)
	}
	return r, nil
}

// agentRecipe asks an attempt's suite for the job of its stage, with the
// outputs of the unit's earlier stages.
func (c *Coordinator) agentRecipe(job core.Job) (*proto.Recipe, error) {
	a := job.Attempt
	s, ok := c.catalog.LookupSuite(a.Suite)
	if !ok {
		return nil, fmt.Errorf("suite %q not loaded", a.Suite)
	}
	task, ok := s.Tasks[a.TaskID]
	if !ok {
		return nil, fmt.Errorf("suite %q has no task %s", a.Suite, a.TaskID)
	}
	imageCID := job.ImageCID
	if imageCID == "" {
		ag, _ := c.catalog.Agent(job.Image)
		imageCID = ag.CID
	}
	image, err := cid.Decode(imageCID)
	if err != nil {
		return nil, fmt.Errorf("image %q: %w", job.Image, err)
	}
	content := make(map[string]cid.Cid, len(task.Content))
	for _, name := range task.Content {
		x, _ := c.catalog.Content(name)
		cc, err := cid.Decode(x.CID)
		if err != nil {
			return nil, fmt.Errorf("content %s of task %s: %w", name, task.ID, err)
		}
		content[name] = cc
	}
	var earlier map[string]map[string]cid.Cid
	if len(job.Earlier) > 0 {
		earlier = make(map[string]map[string]cid.Cid, len(job.Earlier))
		for stage, outs := range job.Earlier {
			earlier[stage] = make(map[string]cid.Cid, len(outs))
			for path, s := range outs {
				cc, err := cid.Decode(s)
				if err != nil {
					return nil, fmt.Errorf("output %s of stage %s: %w", path, stage, err)
				}
				earlier[stage][path] = cc
			}
		}
	}
	return s.Bench.Recipe(bench.RecipeInput{Task: task, Variant: a.Level, Stage: a.Stage, Image: image, Content: content,
		Earlier: earlier, Env: job.Env, Limits: s.Limits})
}

// label names an attempt in a node's logs.
func label(a core.Attempt) string {
	return strings.Join(slices.DeleteFunc([]string{a.TaskID, a.Level, a.Stage, a.Agent}, func(s string) bool { return s == "" }), " ")
}

// selfProvider names this coordinator as the holder of the content.
func (c *Coordinator) selfProvider() *proto.Provider {
	self := &proto.Provider{PeerId: []byte(c.host.ID())}
	for _, addr := range c.host.Addrs() {
		self.Addrs = append(self.Addrs, addr.Bytes())
	}
	return self
}

// MaxNodeProviders bounds the nodes an assignment names as providers of
// its first input, besides the coordinator.
const MaxNodeProviders = 4

// providersFor lists who can serve content: the coordinator first, then up
// to MaxNodeProviders nodes in view that announce it as cached and whose
// addresses are known (nodes that listen), most recently seen first.
// Fetching nodes ask them all, so content crosses the coordinator's link
// about once however many nodes run it.
func (c *Coordinator) providersFor(content cid.Cid) []*proto.Provider {
	c.mu.Lock()
	holders := c.state.Holders(content.String(), time.Now(), 2*MaxNodeProviders)
	c.mu.Unlock()
	out := []*proto.Provider{c.selfProvider()}
	for _, h := range holders {
		if len(out) > MaxNodeProviders {
			break
		}
		id, err := peer.Decode(h)
		if err != nil {
			continue
		}
		addrs := c.host.Peerstore().Addrs(id)
		if len(addrs) == 0 {
			continue
		}
		p := &proto.Provider{PeerId: []byte(id)}
		for _, a := range addrs {
			p.Addrs = append(p.Addrs, a.Bytes())
		}
		out = append(out, p)
	}
	return out
}

// handleLease serves lease renewals from nodes: the first at p2phost's
// minimum pace, each later one within 2 lease TTLs. Renewals are not made
// durable: on restart every restored lease runs at least a full TTL. A
// renewal with hand_back gives the attempt back (core.HandBack).
func (c *Coordinator) handleLease(s network.Stream) {
	defer s.Close()
	node := s.Conn().RemotePeer().String()
	for wait := p2phost.ReadGrace; ; wait = 2 * c.cfg.LeaseTTL {
		var req proto.LeaseRenewal
		if err := proto.ReadMsg(p2phost.Paced(s, wait), &req, proto.MaxControlSize); err != nil {
			return
		}
		var ack *proto.LeaseAck
		if why := req.GetHandBack(); why != "" {
			// Acknowledged once the requeue is durable.
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			fx, t := c.step(ctx, core.HandBack{Attempt: req.GetAttemptId(), Node: node, Reason: why})
			r, _ := fx.Reply.(core.HandBackReply)
			err := c.durable(ctx, t)
			cancel()
			if r.OK && err != nil {
				r = core.HandBackReply{Reason: "not recorded: " + err.Error()}
			}
			ack = &proto.LeaseAck{AttemptId: req.GetAttemptId(), Ok: r.OK, HandedBack: r.OK, Reason: r.Reason}
		} else {
			c.mu.Lock()
			fx, _ := c.stepLocked(core.Renewal{Attempt: req.GetAttemptId(), Node: node, Phase: req.GetPhase()})
			c.mu.Unlock()
			r, _ := fx.Reply.(core.RenewalReply)
			ack = &proto.LeaseAck{AttemptId: req.GetAttemptId(), Ok: r.OK, Reason: r.Reason}
			if r.OK {
				ack.LeaseDeadlineUnixMillis = r.Deadline.UnixMilli()
			}
		}
		if err := proto.WriteMsg(s, ack); err != nil {
			s.Reset()
			return
		}
	}
}
