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

// name is the address the socket LB names a pod's network namespace by:
// its IPv4 one, or on an IPv6-only node its IPv6 one; invalid without
// any.
func (p Pod) name() netip.Addr {
	if ip := netaddr.IPv4(p.IPs); ip.IsValid() {
		return ip
	}
	if len(p.IPs) == 0 {
		return netip.Addr{}
	}
	return p.IPs[0]
}
