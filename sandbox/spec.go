package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/repronet/repronet/sandbox/egress"
	"github.com/repronet/repronet/sandbox/gpu"
	"github.com/repronet/repronet/sandbox/idmap"
	"github.com/repronet/repronet/sandbox/netns"
)

// Mount is a bind mount of a host path into the container.
type Mount struct {
	Source   string // host path, absolute, must exist; inside Spec.Workspace when one is given
	Target   string // path in the container, absolute
	ReadOnly bool
}

// ImageMount shows another image's files, read-only, at Target in the
// container: an agent's image inside a capsule's environment image (the
// Medium way: the attempt runs in the environment, the agent from its own
// files).
type ImageMount struct {
	Image  string // image name, as for Spec.Image
	Target string // absolute, not /
	// Source is the image's folder shown at Target (absolute and clean; a
	// symbolic link in any of its components is refused): "" or "/" for
	// the whole image; "/agent" shows an agent's own files where the
	// agent expects them.
	Source string
}

// Limits bound one attempt. A zero field takes its DefaultLimits value: an
// attempt never runs unlimited.
type Limits struct {
	CPUMillis   uint32        // CPU time per wall second, in thousandths of a CPU (CFS quota)
	MemoryBytes uint64        // memory limit; swap is limited to the same figure (no swap)
	Pids        int64         // maximum number of processes and threads
	Wall        time.Duration // wall-clock limit from start; SIGKILL at the deadline
	// OutputBytes is how much of each of stdout and stderr is kept (the
	// last bytes). The attempt is killed as OutcomeOutputLimit only when the
	// two streams together exceed OutputKillFactor times OutputBytes.
	OutputBytes int64
	// DiskBytes is the size of the private writable space Run makes when
	// Spec.Workspace is nil (the container's writable layer, /tmp). A
	// Workspace carries its own size, given to CreateWorkspace.
	DiskBytes int64
}

// OutputKillFactor times Limits.OutputBytes is the total output (stdout plus
// stderr) at which an attempt is killed as OutcomeOutputLimit; below it the
// output is only truncated to its tail.
const OutputKillFactor = 1024

// DefaultDiskBytes is the default size of an attempt's writable space.
const DefaultDiskBytes = 10 << 30

// DefaultLimits is one slot of the network, CORE-Bench Hard's shape: 1 CPU,
// 4 GiB of memory and no swap, 1024 pids, 45 minutes, 1 MiB of each output
// stream, 10 GiB of disk.
func DefaultLimits() Limits {
	return Limits{CPUMillis: 1000, MemoryBytes: 4 << 30, Pids: 1024, Wall: 45 * time.Minute, OutputBytes: 1 << 20,
		DiskBytes: DefaultDiskBytes}
}

func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.CPUMillis == 0 {
		l.CPUMillis = d.CPUMillis
	}
	if l.MemoryBytes == 0 {
		l.MemoryBytes = d.MemoryBytes
	}
	if l.Pids <= 0 {
		l.Pids = d.Pids
	}
	if l.Wall <= 0 {
		l.Wall = d.Wall
	}
	if l.OutputBytes <= 0 {
		l.OutputBytes = d.OutputBytes
	}
	if l.DiskBytes <= 0 {
		l.DiskBytes = d.DiskBytes
	}
	return l
}

// NetworkMode says what an attempt may reach.
type NetworkMode string

// Network modes.
const (
	// NetworkNone (the default, also "") gives the attempt a network
	// namespace with only a loopback interface.
	NetworkNone NetworkMode = "none"
	// NetworkEgress gives it a namespace of its own with a link to the host
	// through which it may open connections to Network.Allow and nothing else.
	NetworkEgress NetworkMode = "egress"
	// NetworkProxy gives it a namespace of its own with a link to the host
	// through which it reaches the node's egress proxy (Spec.Proxy, on
	// ProxyPort of the host end) and nothing else; the proxy lets it reach
	// the host names of Network.Hosts. The proxy's address is in the
	// environment (HTTP_PROXY and friends) and in apt's configuration.
	NetworkProxy NetworkMode = "proxy"
)

// ProxyPort is the TCP port of the host end of a proxy-mode attempt's link
// where the node's egress proxy serves it.
const ProxyPort = 3128

// EgressProxy serves proxy-mode attempts: the node's egress proxy
// (*egress.Proxy of package sandbox/egress).
type EgressProxy interface {
	// ServeAttempt listens on listen and serves the attempt's connections
	// (those from client) until stop is called, letting them reach the
	// host names hosts match and nothing else; stop closes everything and
	// returns how many requests and connections it refused.
	ServeAttempt(attempt string, listen netip.AddrPort, client netip.Addr, hosts []string) (stop func() uint64, err error)
}

// Service is a node-side service one attempt reaches: served on Port of
// the host end of its link (Start listens on listen and serves client,
// the attempt's address, until stop), and announced to it by Env (its
// URL, its key), which overrides the attempt's own environment.
type Service struct {
	Name  string
	Port  uint16
	Start func(listen netip.AddrPort, client netip.Addr) (stop func(), err error)
	Env   func(listen netip.AddrPort) []string
}

// validateServices checks the services' names and ports: distinct, not 0,
// not the egress proxy's.
func validateServices(svcs []Service) error {
	seen := map[uint16]string{ProxyPort: "the egress proxy"}
	for _, s := range svcs {
		switch other, dup := seen[s.Port]; {
		case s.Name == "" || s.Start == nil:
			return fmt.Errorf("service %q: a name and a Start are required", s.Name)
		case s.Port == 0:
			return fmt.Errorf("service %s: port 0", s.Name)
		case dup:
			return fmt.Errorf("service %s: port %d is %s's", s.Name, s.Port, other)
		}
		seen[s.Port] = s.Name
	}
	return nil
}

// Network is an attempt's network access.
type Network struct {
	Mode NetworkMode
	// Allow lists the destinations an egress attempt may connect to (see
	// netns.ParseRule for the "tcp:10.0.0.0/8:443" form).
	Allow []netns.Rule
	// Nameservers are written to the container's /etc/resolv.conf in egress
	// mode; TCP and UDP port 53 to them is allowed.
	Nameservers []netip.Addr
	// Hosts are the host names a proxy attempt may reach through the
	// egress proxy (egress.ParseHosts: "pypi.org", "*.debian.org").
	Hosts []string
}

// Validate checks that the sandbox can enforce n (see ParseNetwork).
func (n Network) Validate() error {
	switch n.Mode {
	case "", NetworkNone:
		if len(n.Allow) > 0 || len(n.Nameservers) > 0 || len(n.Hosts) > 0 {
			return fmt.Errorf("network %q takes no allow-list, nameservers or hosts (they need network %q or %q)", NetworkNone, NetworkEgress, NetworkProxy)
		}
	case NetworkEgress:
		if len(n.Hosts) > 0 {
			return fmt.Errorf("network %q takes addresses, not host names (host names need network %q)", NetworkEgress, NetworkProxy)
		}
		for _, r := range n.Allow {
			if err := r.Validate(); err != nil {
				return err
			}
		}
		for _, a := range n.Nameservers {
			if !a.Is4() {
				return fmt.Errorf("nameserver %s: only IPv4 nameservers are supported", a)
			}
		}
	case NetworkProxy:
		if len(n.Allow) > 0 || len(n.Nameservers) > 0 {
			return fmt.Errorf("network %q takes host names only: no address rules or nameservers (the proxy resolves names)", NetworkProxy)
		}
		if _, err := egress.ParseHosts(n.Hosts); err != nil {
			return err
		}
	default:
		return fmt.Errorf("network %q: unknown mode (want %q, %q or %q)", n.Mode, NetworkNone, NetworkEgress, NetworkProxy)
	}
	return nil
}

// rules is the allow-list with the nameservers' port 53 added.
func (n Network) rules() []netns.Rule {
	out := append([]netns.Rule(nil), n.Allow...)
	for _, a := range n.Nameservers {
		out = append(out, netns.Rule{Prefix: netip.PrefixFrom(a, 32), Port: 53})
	}
	return out
}

// Spec describes one attempt.
type Spec struct {
	ID    string   // attempt ID, unique; the container ID is derived from it
	Image string   // image name as returned by ImportImage
	Args  []string // command; empty: the image's entrypoint and cmd
	// Entrypoint, when non-nil, replaces the image's entrypoint: the
	// process is Entrypoint followed by Args (docker run --entrypoint).
	// An empty non-nil slice drops the image's entrypoint.
	Entrypoint []string
	Env        []string // KEY=value, added to (and overriding) the image's
	Cwd        string   // working directory; empty: the image's (or /)
	// User is "uid:gid" (or names from the image's /etc files); default
	// "1000:1000", or "0:0" with UserNamespace.
	User   string
	Mounts []Mount
	// ImageMounts are other images' files, read-only, in the container.
	ImageMounts []ImageMount
	Limits      Limits
	// Workspace is the attempt's size-capped writable space, from
	// CreateWorkspace with the same ID. The container's writable layer,
	// /tmp and the home folder live on it too, so its size caps everything
	// the attempt can write, and every Mount must lie inside
	// Workspace.Dir(). Nil: Run makes a private space of Limits.DiskBytes
	// for the writable layer, and Mounts may name any host path (the
	// caller's responsibility, not covered by the quota).
	Workspace *Workspace
	// ReadOnlyRootfs makes the image's filesystem read-only; /tmp, /var/tmp
	// and $HOME are then writable folders on the workspace's filesystem.
	ReadOnlyRootfs bool
	Network        Network
	// UserNamespace runs the attempt in a user namespace of its own that
	// maps container IDs 0-65535 to the workspace's host range
	// (Workspace.IDs): root in the container, which may then install
	// packages system-wide, is an unprivileged ID on the host. The image's
	// layers are seen through idmapped mounts (owned by the container's
	// root); files the attempt writes are owned on the host by IDs of the
	// range; what the node put into the workspace must be given to the
	// range first (Workspace.Chown). CAP_NET_RAW is dropped.
	UserNamespace bool
	// Proxy serves a NetworkProxy attempt (the node's egress proxy).
	Proxy EgressProxy
	// Services are node-side services the attempt reaches on the host end
	// of a link of its own (a model endpoint), whatever its network mode:
	// with NetworkNone the link leads to them and nothing else.
	Services []Service
	// GPUs are the NVIDIA GPUs granted to the attempt (gpu.Detect, then
	// Inventory.Grant): their device nodes and the driver's control
	// devices, allowed by the device cgroup, the driver's libraries and
	// tools under /usr/local/nvidia, the environment to find them. The
	// zero value: no GPU, and no NVIDIA device is reachable.
	GPUs gpu.Grant

	// commit, set by BuildEnvironment, reads the container's writable
	// layer (its overlay upper folder, files owned by the workspace's host
	// IDs) after the task exited 0, before anything is removed.
	commit func(ctx context.Context, upper string, ids idmap.Range) error
}

// Outcome classifies how an attempt ended.
type Outcome string

// Outcomes. Only OutcomeInfraError is the node's fault; the others are the agent's.
const (
	OutcomeOK          Outcome = "ok"           // exit code 0
	OutcomeAgentError  Outcome = "agent_error"  // non-zero exit, or the command could not be executed
	OutcomeTimeout     Outcome = "timeout"      // killed at the wall-clock limit
	OutcomeOOM         Outcome = "oom"          // the kernel killed a process at the memory limit
	OutcomeDiskQuota   Outcome = "disk_quota"   // non-zero exit with the writable space full
	OutcomeOutputLimit Outcome = "output_limit" // killed for flooding stdout/stderr
	OutcomeInfraError  Outcome = "infra_error"  // containerd, the daemon, the image or the caller failed
)

// IsInfra reports whether the outcome is the node's fault rather than the
// agent's: such an attempt is retried elsewhere, never scored.
func (o Outcome) IsInfra() bool { return o == OutcomeInfraError }

// Result is what one attempt produced.
type Result struct {
	Outcome  Outcome
	ExitCode int // -1 when the process never ran or its status is unknown
	// Stdout and Stderr hold the last Limits.OutputBytes of each stream.
	Stdout, Stderr                   []byte
	StdoutTruncated, StderrTruncated bool
	CPUSeconds                       float64 // user+system CPU of the container's cgroup
	PeakMemoryBytes                  uint64  // cgroup memory high-water mark (includes page cache)
	PeakPids                         uint64  // most processes and threads alive at once (0: unknown)
	// DiskUsedBytes is what the writable space held at the end (workspace,
	// writable layer, /tmp); DiskFull is set when it was seen full.
	DiskUsedBytes uint64
	DiskFull      bool
	Wall          time.Duration
	// EgressRefused is how many requests and connections the egress proxy
	// refused (NetworkProxy).
	EgressRefused uint64
	Detail        string // human-readable reason, set for every outcome but ok
}
