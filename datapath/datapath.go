// Package datapath is the kernel side of a node. Node composes the
// features that program it — overlay (the VXLAN slow path), pods (pod
// veths), netfilter (iptables), fastpath (the eBPF flow cache), policy,
// services, bypass and underlay, each in its own package — with the
// sysctls and uplink discovery, and is the one place that turns datastore
// records into what each feature programs.
package datapath

import (
	"net"
	"net/netip"

	"github.com/cilium/ebpf"

	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/internal/sysctl"
)

// Config of a node's datapath.
type Config struct {
	Iface    string     // uplink name; "" = the one holding NodeIP, else the default route's
	NodeIP   netip.Addr // "" = the uplink's first address
	VNI      int
	Port     int  // VXLAN UDP port
	FastPath bool // start with the fast path on
	// FastPathConnSetup lets TCP connections no policy can deny open and
	// close on the fast path (datapath/fastpath, setup.go).
	FastPathConnSetup bool
	// NoPolicy says no NetworkPolicy runs on this node (etcd clusters have
	// none): every pod is open to connection setup on the fast path.
	NoPolicy     bool
	BPFFS        string // where the fast path pins its maps and links
	FastPathMark uint32 // skb->mark bit for ESTABLISHED pod traffic
	AttachMode   string // auto, tcx or clsact
	// ProcSys is where sysctls are written, "" = /proc/sys. A container's
	// /proc/sys is read-only unless privileged, so the DaemonSet mounts
	// the host's /proc/sys/net elsewhere (everything ONC writes is under net/).
	ProcSys string
	// Services is whose sockets Services are balanced for (the socket LB).
	Services services.Mode
	// KubeProxyReplacement: no kube-proxy runs; ONC serves every Service
	// frontend (NodePort, externalIPs, load balancer IPs) at the socket
	// and, for clients outside the cluster, on the uplink. Needs Services
	// mode all.
	KubeProxyReplacement bool
	// DSR (with KubeProxyReplacement): a client outside the cluster sent to
	// a backend pod on another node keeps its address, and that node
	// answers it directly (--load-balancer-mode dsr); otherwise such a
	// flow is masqueraded to this node (snat, the default). Every node
	// takes DSR frames from its peers either way.
	DSR bool
	// Bypass is which connections between two pods of the node skip the
	// TCP/IP stacks (docs/bypass.md).
	Bypass bypass.Config
	// PolicyLogGroup is the NFLOG group the policy table logs its
	// verdicts to (agent/flows reads it); 0: it logs nothing.
	PolicyLogGroup uint16
	// FlowEvents is the eBPF programs' flow events' budget: of each class,
	// on each CPU, per second on average (include/flows.h); 0: none.
	FlowEvents uint32
	// Cgroup is the cgroup v2 directory the services and bypass programs
	// attach to ("" = the highest one mounted, mounting a cgroup2
	// hierarchy where none is; bpf.ResolveCgroup).
	Cgroup string
}

// NodeSetup is what bringing the node up needs from the control plane.
type NodeSetup struct {
	// PodCIDR is the node's IPv4 pod CIDR and ClusterCIDR the cluster's,
	// zero on an IPv6-only node.
	PodCIDR     netip.Prefix
	ClusterCIDR netip.Prefix
	VTEPMAC     net.HardwareAddr // persisted by the agent, so peers' FDB entries survive restarts
	// PodCIDRv6 is the node's IPv6 pod CIDR, zero when it has none: its
	// pods' IPv6 addresses, and the only inner destination of the IPv6
	// frames the overlay guard lets on. ClusterCIDRv6 is the cluster's
	// IPv6 pod CIDR (masquerade to outside it). A node has at least one
	// of PodCIDR and PodCIDRv6.
	PodCIDRv6, ClusterCIDRv6 netip.Prefix
}

// DeviceName is the VXLAN device ONC owns.
const DeviceName = overlay.DeviceName

// Gateway of a pod CIDR: its first usable address, on the host side.
func Gateway(cidr netip.Prefix) netip.Addr { return overlay.Gateway(cidr) }

// FastPath is the flow cache's controls, as the agent and onctl use them;
// *fastpath.Datapath implements it.
type FastPath interface {
	Enabled() bool
	Mode() fastpath.Mode
	ConnSetup() fastpath.ConnSetup
	// Switch turns the fast path on or off; turning it on starts from a
	// clean epoch, since verdicts learned while off may be stale.
	Switch(enabled bool) error
	Flush() error
	Stats() ([]fastpath.Stat, error)
	CacheEntries() (map[string]int, error)
	Dests() ([]fastpath.Dest, error)
	Encaps() ([]fastpath.Encap, error)
	Locals() ([]fastpath.Local, error)
	Flows() ([]fastpath.Flow, error)
	// Events is the ring of flow events (include/flows.h), the fast
	// path's and the services object's; EventStats what became of them.
	Events() *ebpf.Map
	EventStats() ([]fastpath.Stat, error)
	// OnEvict has fn told of each flow an eviction takes off the fast
	// path, and why (fastpath.Datapath.OnEvict).
	OnEvict(fn func(fastpath.Eviction))
}

func (n *Node) writeSysctl(name, val string) error { return sysctl.Write(n.cfg.ProcSys, name, val) }

// readSysctl reads sysctl name (a path under net/), trimmed.
func (n *Node) readSysctl(name string) (string, error) { return sysctl.Read(n.cfg.ProcSys, name) }
