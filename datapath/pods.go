package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/onc-net/onc/datapath/podnet"
	"github.com/vishvananda/netlink"
)

// Errors of AttachPod and CheckPod that the CNI maps to its own codes.
var (
	ErrNoNetns     = podnet.ErrNoNetns
	ErrIfaceExists = podnet.ErrIfaceExists
)

// Pod is one attachment as the datapath programs it.
type Pod struct {
	Netns     string // path of the pod's network namespace
	IfName    string // interface in the pod, e.g. eth0
	HostIface string // host end of the veth
	IP        netip.Addr
	Gateway   netip.Addr
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
	return podnet.HostIfaceName(containerID, ifname)
}

func (p Pod) podnet() podnet.Pod {
	return podnet.Pod{Netns: p.Netns, IfName: p.IfName, HostIface: p.HostIface, IP: p.IP, Gateway: p.Gateway, MTU: p.MTU}
}

// AttachPod makes the pod's veth, address and routes, then lets the fast
// path deliver to it and see its traffic. On error part of it may exist:
// the caller rolls back with DetachPod.
func (n *Node) AttachPod(p Pod) (PodLink, error) {
	podMAC, err := podnet.Setup(p.podnet())
	if err != nil {
		return PodLink{}, err
	}
	p.MAC = podMAC
	host, err := netlink.LinkByName(p.HostIface)
	if err != nil {
		return PodLink{}, err
	}
	if err := n.addToFastPath(p, host); err != nil {
		return PodLink{}, err
	}
	return PodLink{PodMAC: podMAC, HostMAC: host.Attrs().HardwareAddr}, nil
}

// AdoptPod puts a pod attached before an agent restart back on the fast
// path; its veth and routes are still in place.
func (n *Node) AdoptPod(p Pod) error {
	host, err := netlink.LinkByName(p.HostIface)
	if err != nil {
		return err
	}
	return n.addToFastPath(p, host)
}

func (n *Node) addToFastPath(p Pod, host netlink.Link) error {
	fp := n.fastPath()
	if fp == nil {
		return nil
	}
	if len(p.MAC) != 6 {
		return fmt.Errorf("pod %s: no MAC recorded for its interface", p.IP)
	}
	if err := fp.SetLocalPod(p.IP, host.Attrs().Index, p.MAC, host.Attrs().HardwareAddr); err != nil {
		return err
	}
	return fp.AttachPod(p.HostIface)
}

// CheckPod verifies that the pod's network is as AttachPod left it.
func (n *Node) CheckPod(p Pod) error { return podnet.Check(p.podnet()) }

// DetachPod forgets the pod in the fast path, evicting its flows before its
// address can be reused, then removes its veth. Missing parts are fine:
// DEL is idempotent.
func (n *Node) DetachPod(p Pod) error {
	if fp := n.fastPath(); fp != nil {
		var errs []error
		if p.IP.IsValid() {
			errs = append(errs, fp.DeleteLocalPod(p.IP))
		}
		errs = append(errs, fp.DetachPod(p.HostIface))
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	return podnet.Teardown(p.HostIface)
}
