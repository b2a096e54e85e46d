package agent

import (
	"github.com/onc-net/onc/agent/bypass"
	"github.com/onc-net/onc/agent/policy"
	"github.com/onc-net/onc/agent/services"
	"github.com/onc-net/onc/agent/underlay"
	"github.com/onc-net/onc/datapath"
	dpservices "github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/datastore"
)

// Datapath is the kernel side as the agent drives it: the node and its
// overlay, and one part per feature, each typed by the interface of the
// watcher that uses it (so each is faked next to that watcher's tests).
// KernelDatapath builds it from a *datapath.Node.
type Datapath struct {
	Node     Node
	Pods     Pods
	Policy   policy.Datapath
	Services services.Datapath
	Bypass   bypass.Datapath
	Underlay underlay.Datapath
}

// KernelDatapath is n's parts.
func KernelDatapath(n *datapath.Node) Datapath {
	return Datapath{Node: n, Pods: n, Policy: n.Policy(), Services: nodeServices{n.Services(), n}, Bypass: n.Bypass(), Underlay: n.Underlay()}
}

// nodeServices is the node's socket load balancer, with the families its
// uplink translates, which the node as a whole decides.
type nodeServices struct {
	*dpservices.Node
	node *datapath.Node
}

func (s nodeServices) UplinkFamilies() (ipv4, ipv6 bool) { return s.node.UplinkFamilies() }

// Node is the node's datapath as a whole and its overlay: what the peer
// watcher, onctl status and the metrics need.
type Node interface {
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
	// KernelWrites counts the writes (netlink messages, BPF map updates
	// and deletes) made to program peers since start: at steady state it
	// stands still.
	KernelWrites() uint64
	// FastPath is the flow cache's controls, nil when it is not loaded.
	FastPath() datapath.FastPath
	// Close lets go of the datapath; what is in the kernel stays.
	Close() error
}

// Pods is what the CNI server needs of the kernel.
type Pods interface {
	// AttachPod makes the pod's interface; on error the caller rolls
	// back with DetachPod.
	AttachPod(datapath.Pod) (datapath.PodLink, error)
	// AdoptPod takes over a pod attached before a restart.
	AdoptPod(datapath.Pod) error
	// CheckPod verifies the pod's interface is as AttachPod made it.
	CheckPod(datapath.Pod) error
	// DetachPod removes whatever exists of the pod's interface; idempotent.
	DetachPod(datapath.Pod) error
}
