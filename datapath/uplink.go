package datapath

import (
	"errors"
	"fmt"
	"net/netip"

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

// findUplink picks the uplink: the interface named iface, else the one that
// holds nodeIP, else the one of the default route. The node IP is nodeIP
// if given, else the interface's first IPv4 address.
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
	addrs, err := netlink.AddrList(link, unix.AF_INET)
	if err != nil {
		return Uplink{}, err
	}
	up := Uplink{Name: link.Attrs().Name, Index: link.Attrs().Index, MTU: link.Attrs().MTU, NodeIP: nodeIP}
	for _, a := range addrs {
		ip, _ := netip.AddrFromSlice(a.IP)
		if !nodeIP.IsValid() && !up.NodeIP.IsValid() {
			up.NodeIP = ip.Unmap()
		}
		if ip.Unmap() == nodeIP {
			return up, nil
		}
	}
	if nodeIP.IsValid() {
		return Uplink{}, fmt.Errorf("node IP %s is not an address of uplink %s", nodeIP, up.Name)
	}
	if !up.NodeIP.IsValid() {
		return Uplink{}, fmt.Errorf("uplink %s has no IPv4 address; set --node-ip", up.Name)
	}
	return up, nil
}

func linkWithAddr(ip netip.Addr) (netlink.Link, error) {
	addrs, err := netlink.AddrList(nil, unix.AF_INET)
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
	routes, err := netlink.RouteList(nil, unix.AF_INET)
	if err != nil {
		return nil, err
	}
	for _, r := range routes {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.LinkIndex > 0 {
			return netlink.LinkByIndex(r.LinkIndex)
		}
	}
	return nil, errors.New("no default route to pick the uplink from; set --iface or --node-ip")
}
