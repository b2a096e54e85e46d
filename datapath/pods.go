package datapath

import (
	"net"
	"net/netip"

	"github.com/onc-net/onc/internal/netaddr"
	"github.com/onc-net/onc/internal/netns"

	"github.com/onc-net/onc/datapath/pods"
)

// Errors of AttachPod and CheckPod that the CNI maps to its own codes.
var (
	ErrNoNetns     = netns.ErrNotExist
	ErrIfaceExists = pods.ErrIfaceExists
)

// Pod is one attachment as the datapath programs it.
type Pod struct {
	Netns     string       // path of the pod's network namespace
	IfName    string       // interface in the pod, e.g. eth0
	HostIface string       // host end of the veth
	IPs       []netip.Addr // one per family
	Gateways  []netip.Addr // the node's, one for each of IPs
	MTU       int
	MAC       net.HardwareAddr // the pod end's; what AttachPod returned, for AdoptPod
}

// PodLink is what AttachPod made: the two ends' MACs.
type PodLink struct {
	PodMAC  net.HardwareAddr
	HostMAC net.HardwareAddr
}

// HostIfaceName is the host end's name for an attachment: stable, so a
// retried ADD or a DEL after a restart finds it.
func HostIfaceName(containerID, ifname string) string {
	return pods.HostIfaceName(containerID, ifname)
}

func (p Pod) spec() pods.Pod {
	return pods.Pod{Netns: p.Netns, IfName: p.IfName, HostIface: p.HostIface, IPs: p.IPs, Gateways: p.Gateways, MTU: p.MTU}
}

// ipv4 is the pod's IPv4 address, invalid when it has none: the socket LB
// names a pod's network namespace by it (every pod has one so far:
// IPv6-only clusters are not supported yet, issue 28).
func (p Pod) ipv4() netip.Addr { return netaddr.IPv4(p.IPs) }
