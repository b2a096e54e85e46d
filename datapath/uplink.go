package datapath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/onc-net/onc/datapath/overlay"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Uplink is the interface the node's overlay traffic leaves by.
type Uplink struct {
	Name   string
	Index  int
	MTU    int
	NodeIP netip.Addr
}

// Overhead is what VXLAN over the uplink's family adds to a frame.
func (u Uplink) Overhead() int { return overlay.OverheadOf(u.NodeIP) }

// unstableAddr flags an IPv6 address no tunnel endpoint may be: one that
// goes away or changes (a privacy address, one being deprecated) or is
// not usable yet or at all (duplicate address detection).
const unstableAddr = unix.IFA_F_TEMPORARY | unix.IFA_F_DEPRECATED | unix.IFA_F_TENTATIVE | unix.IFA_F_DADFAILED

// findUplink picks the uplink: the interface named iface, else the one that
// holds nodeIP, else the one of the default route (IPv4's, else IPv6's).
// The node IP, the overlay's tunnel endpoint, is nodeIP if given, else
// the interface's first IPv4 address, else its first stable global IPv6
// one (an IPv6 underlay).
func findUplink(iface string, nodeIP netip.Addr) (Uplink, error) {
	var link netlink.Link
	var err error
	switch {
	case iface != "":
		if link, err = netlink.LinkByName(iface); err != nil {
			return Uplink{}, fmt.Errorf("uplink interface %q: %w", iface, err)
		}
	case nodeIP.IsValid():
		if link, err = linkWithAddr(nodeIP); err != nil {
			return Uplink{}, err
		}
	default:
		if link, err = defaultRouteLink(); err != nil {
			return Uplink{}, err
		}
	}
	addrs, err := netlink.AddrList(link, unix.AF_UNSPEC)
	if err != nil {
		return Uplink{}, err
	}
	up := Uplink{Name: link.Attrs().Name, Index: link.Attrs().Index, MTU: link.Attrs().MTU, NodeIP: nodeIP}
	var first6 netip.Addr
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		ip = ip.Unmap()
		if nodeIP.IsValid() && ip == nodeIP {
			return up, nil
		}
		switch {
		case ip.Is4() && !up.NodeIP.IsValid():
			up.NodeIP = ip
		case ip.Is6() && ip.IsGlobalUnicast() && !first6.IsValid() && a.Flags&unstableAddr == 0:
			first6 = ip
		}
	}
	if nodeIP.IsValid() {
		return Uplink{}, fmt.Errorf("node IP %s is not an address of uplink %s", nodeIP, up.Name)
	}
	if !up.NodeIP.IsValid() {
		up.NodeIP = first6
	}
	if !up.NodeIP.IsValid() {
		return Uplink{}, fmt.Errorf("uplink %s has no IPv4 or global IPv6 address; set --node-ip", up.Name)
	}
	return up, nil
}

func linkWithAddr(ip netip.Addr) (netlink.Link, error) {
	addrs, err := netlink.AddrList(nil, unix.AF_UNSPEC)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if got, _ := netip.AddrFromSlice(a.IP); got.Unmap() == ip {
			return netlink.LinkByIndex(a.LinkIndex)
		}
	}
	return nil, fmt.Errorf("node IP %s is not configured on any interface", ip)
}

func defaultRouteLink() (netlink.Link, error) {
	for _, family := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := netlink.RouteList(nil, family)
		if err != nil {
			return nil, err
		}
		for _, r := range routes {
			if isDefault(r.Dst) && r.LinkIndex > 0 {
				return netlink.LinkByIndex(r.LinkIndex)
			}
		}
	}
	return nil, errors.New("no default route to pick the uplink from; set --iface or --node-ip")
}

// isDefault says whether dst is a default route's destination.
func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}
