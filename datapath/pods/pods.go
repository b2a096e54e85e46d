// Package pods wires a pod into its node: a veth pair whose pod end is
// the pod's interface (a /32 address, a default route via the node
// gateway) and whose host end carries a /32 route to the pod. Both sides
// get permanent neighbour entries, so no ARP is needed in either direction.
package pods

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/onc-net/onc/internal/netns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ErrIfaceExists: the pod already has an interface of the requested name.
var ErrIfaceExists = errors.New("interface already exists in the pod")

// RouteProtocol tags the routes ONC installs, so they can be told apart
// from anyone else's ("ip route show proto 0xb7").
const RouteProtocol netlink.RouteProtocol = 0xb7

// Pod describes one pod interface.
type Pod struct {
	Netns     string     // path of the pod's network namespace
	IfName    string     // interface in the pod, e.g. eth0
	HostIface string     // host end of the veth
	IP        netip.Addr // the pod's address (configured as /32)
	Gateway   netip.Addr // the node gateway (first address of the node CIDR)
	MTU       int
	// Cookie asks Setup for the namespace's cookie (SO_NETNS_COOKIE,
	// Linux 5.14), for the socket programs that act on pods' sockets.
	Cookie bool
}

// HostIfaceName derives a stable host-side name from the attachment key.
func HostIfaceName(containerID, ifname string) string {
	h := fnv32(containerID + "/" + ifname)
	return fmt.Sprintf("onc%08x", h)
}

func fnv32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// Link is what Setup made.
type Link struct {
	PodMAC, HostMAC net.HardwareAddr
	HostIndex       int    // the host end's ifindex
	NetnsCookie     uint64 // the pod namespace's, as the socket programs read it; with Pod.Cookie only
}

// Setup creates the pod's interface, opening the pod's namespace once for
// all of it. On any failure everything it made is removed again.
func Setup(p Pod) (Link, error) {
	ns, err := netns.Open(p.Netns)
	if err != nil {
		return Link{}, err
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return Link{}, err
	}
	defer nh.Close()
	if _, err := nh.LinkByName(p.IfName); err == nil {
		return Link{}, fmt.Errorf("%w: %s in %s", ErrIfaceExists, p.IfName, p.Netns)
	}
	if l, err := netlink.LinkByName(p.HostIface); err == nil {
		// A leftover of an earlier, interrupted attachment with the same key.
		_ = netlink.LinkDel(l)
	}

	// The peer is born in the pod's namespace under a temporary name so
	// it never collides with host interfaces, then renamed there.
	tmp := "onctmp" + randHex(4)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: p.HostIface, MTU: p.MTU},
		PeerName:      tmp,
		PeerNamespace: netlink.NsFd(int(ns)),
		PeerMTU:       uint32(p.MTU),
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return Link{}, fmt.Errorf("create veth %s: %w", p.HostIface, err)
	}
	link, err := setup(p, nh, tmp)
	if err == nil && p.Cookie {
		if link.NetnsCookie, err = netns.CookieOf(ns); err != nil {
			err = fmt.Errorf("pod sockets: %w", err)
		}
	}
	if err != nil {
		if l, lerr := netlink.LinkByName(p.HostIface); lerr == nil {
			_ = netlink.LinkDel(l) // takes the pod end with it
		}
		return Link{}, err
	}
	return link, nil
}

func setup(p Pod, nh *netlink.Handle, tmp string) (Link, error) {
	host, err := netlink.LinkByName(p.HostIface)
	if err != nil {
		return Link{}, err
	}
	pod, err := nh.LinkByName(tmp)
	if err != nil {
		return Link{}, fmt.Errorf("pod end of veth: %w", err)
	}
	if err := nh.LinkSetName(pod, p.IfName); err != nil {
		return Link{}, fmt.Errorf("rename pod interface to %s: %w", p.IfName, err)
	}
	if pod, err = nh.LinkByName(p.IfName); err != nil {
		return Link{}, err
	}
	podMAC := pod.Attrs().HardwareAddr
	hostMAC := host.Attrs().HardwareAddr

	// Pod side.
	if lo, err := nh.LinkByName("lo"); err == nil {
		if err := nh.LinkSetUp(lo); err != nil {
			return Link{}, fmt.Errorf("pod lo up: %w", err)
		}
	}
	if err := nh.AddrAdd(pod, &netlink.Addr{IPNet: host32(p.IP)}); err != nil {
		return Link{}, fmt.Errorf("pod address %s: %w", p.IP, err)
	}
	if err := nh.LinkSetUp(pod); err != nil {
		return Link{}, fmt.Errorf("pod %s up: %w", p.IfName, err)
	}
	if err := nh.NeighAdd(&netlink.Neigh{LinkIndex: pod.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: p.Gateway.AsSlice(), HardwareAddr: hostMAC, Family: unix.AF_INET}); err != nil {
		return Link{}, fmt.Errorf("pod neighbour for gateway: %w", err)
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: pod.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: host32(p.Gateway)}); err != nil {
		return Link{}, fmt.Errorf("pod route to gateway: %w", err)
	}
	if err := nh.RouteAdd(&netlink.Route{LinkIndex: pod.Attrs().Index, Gw: p.Gateway.AsSlice()}); err != nil {
		return Link{}, fmt.Errorf("pod default route: %w", err)
	}

	// Host side.
	if err := netlink.LinkSetUp(host); err != nil {
		return Link{}, fmt.Errorf("host %s up: %w", p.HostIface, err)
	}
	if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: host.Attrs().Index, State: netlink.NUD_PERMANENT,
		IP: p.IP.AsSlice(), HardwareAddr: podMAC, Family: unix.AF_INET}); err != nil {
		return Link{}, fmt.Errorf("host neighbour for pod: %w", err)
	}
	if err := netlink.RouteReplace(hostRoute(host.Attrs().Index, p.IP)); err != nil {
		return Link{}, fmt.Errorf("host route to pod %s: %w", p.IP, err)
	}
	return Link{PodMAC: podMAC, HostMAC: hostMAC, HostIndex: host.Attrs().Index}, nil
}

func hostRoute(ifindex int, ip netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: ifindex, Scope: netlink.SCOPE_LINK, Dst: host32(ip), Protocol: RouteProtocol}
}

func host32(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(32, 32)}
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Teardown removes the host end of the pod's veth (the kernel removes the
// pod end and both ends' routes with it). A missing interface is not an
// error: DEL is idempotent.
func Teardown(hostIface string) error {
	l, err := netlink.LinkByName(hostIface)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return err
	}
	if err := netlink.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete %s: %w", hostIface, err)
	}
	return nil
}

// Check verifies that the pod's interface, address and routes and the host
// end with its route are as Setup made them.
func Check(p Pod) error {
	host, err := netlink.LinkByName(p.HostIface)
	if err != nil {
		return fmt.Errorf("host interface %s: %w", p.HostIface, err)
	}
	if host.Attrs().OperState == netlink.OperDown || host.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("host interface %s is down", p.HostIface)
	}
	routes, err := netlink.RouteListFiltered(unix.AF_INET, hostRoute(host.Attrs().Index, p.IP), netlink.RT_FILTER_DST|netlink.RT_FILTER_OIF)
	if err != nil || len(routes) == 0 {
		return fmt.Errorf("host route %s dev %s missing", p.IP, p.HostIface)
	}
	ns, err := netns.Open(p.Netns)
	if err != nil {
		return err
	}
	defer ns.Close()
	nh, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer nh.Close()
	pod, err := nh.LinkByName(p.IfName)
	if err != nil {
		return fmt.Errorf("pod interface %s: %w", p.IfName, err)
	}
	if pod.Attrs().Flags&net.FlagUp == 0 {
		return fmt.Errorf("pod interface %s is down", p.IfName)
	}
	if pod.Attrs().MTU != p.MTU {
		return fmt.Errorf("pod interface %s has MTU %d, want %d", p.IfName, pod.Attrs().MTU, p.MTU)
	}
	addrs, err := nh.AddrList(pod, unix.AF_INET)
	if err != nil {
		return err
	}
	found := false
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == p.IP {
			found = true
		}
	}
	if !found {
		return fmt.Errorf("pod interface %s lacks address %s", p.IfName, p.IP)
	}
	defaults, err := nh.RouteListFiltered(unix.AF_INET, &netlink.Route{LinkIndex: pod.Attrs().Index}, netlink.RT_FILTER_OIF)
	if err != nil {
		return err
	}
	for _, r := range defaults {
		if (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && net.IP(p.Gateway.AsSlice()).Equal(r.Gw) {
			return nil
		}
	}
	return fmt.Errorf("pod default route via %s dev %s missing", p.Gateway, p.IfName)
}
