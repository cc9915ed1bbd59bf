package node

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/repronet/repronet/internal/identity"
	"github.com/repronet/repronet/internal/p2phost"
	"github.com/repronet/repronet/proto"
)

// DefaultNetwork is the network a node announces on when none is given.
const DefaultNetwork = "repronet-local"

// JoinOptions name a node (by its data folder, which holds its identity)
// and the coordinator whose join token admits its operator.
type JoinOptions struct {
	DataDir string
	Network string
	// Coordinator is its full multiaddr (with /p2p/ID).
	Coordinator string
	Token       string
	// OperatorKey, when set, is the node's operator key: its signer is
	// admitted (else the node itself is its own operator).
	OperatorKey crypto.PrivKey
	HostOptions []libp2p.Option
}

// JoinResult is what a coordinator answered a join.
type JoinResult struct {
	Node     peer.ID
	Admitted bool
	// Operator is the operator admitted; Reason why not.
	Operator, Reason string
}

// Join presents a join token to a coordinator as the node of opts.DataDir
// (creating its identity if it has none), the way a running node does on
// connecting, so that its operator is admitted now (repronet node join).
// A refusal is a JoinResult with Admitted false; an error means the
// coordinator was not asked.
func Join(ctx context.Context, opts JoinOptions) (JoinResult, error) {
	ai, err := peer.AddrInfoFromString(opts.Coordinator)
	if err != nil {
		return JoinResult{}, fmt.Errorf("node join: coordinator address %q: %w", opts.Coordinator, err)
	}
	key, err := identity.LoadOrCreate(opts.DataDir)
	if err != nil {
		return JoinResult{}, fmt.Errorf("node join: %w", err)
	}
	hostOpts := append([]libp2p.Option{libp2p.Identity(key), libp2p.NoListenAddrs}, opts.HostOptions...)
	h, err := libp2p.New(append(hostOpts, p2phost.Option())...)
	if err != nil {
		return JoinResult{}, fmt.Errorf("node join: start libp2p host: %w", err)
	}
	defer h.Close()
	res := JoinResult{Node: h.ID()}
	var cert []byte
	if opts.OperatorKey != nil {
		if cert, err = proto.SealOperatorCert(opts.OperatorKey, h.ID(), opts.Network, time.Now()); err != nil {
			return res, fmt.Errorf("node join: %w", err)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := h.Connect(ctx, *ai); err != nil {
		return res, fmt.Errorf("node join: connect to coordinator %s: %w", ai.ID, err)
	}
	s, err := h.NewStream(ctx, ai.ID, proto.JoinProtocol)
	if err != nil {
		return res, fmt.Errorf("node join: open join stream to %s: %w", ai.ID, err)
	}
	defer s.Close()
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := proto.WriteMsg(s, &proto.JoinRequest{Token: opts.Token, OperatorCert: cert}); err != nil {
		s.Reset()
		return res, fmt.Errorf("node join: send join request: %w", err)
	}
	var resp proto.JoinResponse
	if err := proto.ReadMsg(s, &resp, proto.MaxControlSize); err != nil {
		s.Reset()
		return res, fmt.Errorf("node join: read join response: %w", err)
	}
	res.Admitted, res.Operator, res.Reason = resp.GetAdmitted(), resp.GetOperator(), resp.GetReason()
	return res, nil
}
