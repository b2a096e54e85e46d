package agent

import (
	"context"
	"net/netip"

	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datapath/policy"
	"github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/datastore"
)

// Datapath is the agent's one seam to the kernel: everything the agent's
// logic asks of it. *datapath.Node implements it; the unit tests use a fake.
type Datapath interface {
	// Uplink is the interface overlay traffic leaves by.
	Uplink() datapath.Uplink
	// BringUp builds the node's datapath; idempotent, retried on error.
	BringUp(datapath.NodeSetup) error
	// SyncPeers programs the other nodes of nodes as peers, exactly,
	// touching only peers that differ from what it programmed last. With
	// checkKernel it also reads the kernel's entries back and repairs drift.
	SyncPeers(self string, nodes []datastore.Node, checkKernel bool) error
	// ProgrammedPeers names the peers whose entries are in place.
	ProgrammedPeers() map[string]bool

	// AttachPod makes the pod's interface; on error the caller rolls
	// back with DetachPod.
	AttachPod(datapath.Pod) (datapath.PodLink, error)
	// AdoptPod takes over a pod attached before a restart.
	AdoptPod(datapath.Pod) error
	// CheckPod verifies the pod's interface is as AttachPod made it.
	CheckPod(datapath.Pod) error
	// DetachPod removes whatever exists of the pod's interface; idempotent.
	DetachPod(datapath.Pod) error

	// KernelWrites counts the writes (netlink messages, BPF map updates
	// and deletes) made to program peers since start: at steady state it
	// stands still.
	KernelWrites() uint64

	// EnforcePolicy makes the kernel enforce rs, ending the connections and
	// cached verdicts it no longer allows before it returns; checkKernel
	// rewrites every rule, repairing drift.
	EnforcePolicy(rs policy.Ruleset, checkKernel bool) (datapath.PolicyChange, error)
	// PolicyCounters are each local pod's allowed and denied connections.
	PolicyCounters() (map[string]policy.Counters, error)

	// SyncServices makes the socket programs balance exactly svcs; with
	// checkKernel it also reads the maps back, repairing drift, and
	// forgets the namespaces of pods not among pods.
	SyncServices(svcs []services.Service, pods []netip.Addr, checkKernel bool) error
	// SocketLB is the socket load balancer, nil when it is off or not
	// loaded; SocketLBStatus then says why.
	SocketLB() datapath.SocketLB
	SocketLBStatus() string

	// Bypass is the intra-node bypass, nil when it is not loaded;
	// BypassStatus then says why.
	Bypass() datapath.Bypass
	BypassStatus() string
	// KeepBypassedConntrack keeps bypassed connections' conntrack entries
	// from expiring; called on every resync.
	KeepBypassedConntrack() error

	// FastPath is the flow cache's controls, nil when it is not loaded.
	FastPath() datapath.FastPath
	// WatchUnderlay calls changed after each route, uplink or neighbour
	// change that can make a learned outer header stale, until ctx ends or
	// its subscription fails.
	WatchUnderlay(ctx context.Context, changed func()) error
	// EvictStaleHeaders removes the learned outer headers that no longer
	// match the underlay or the peers; it returns how many.
	EvictStaleHeaders() (int, error)
	// Close lets go of the datapath; what is in the kernel stays.
	Close() error
}
