// Package pods wires a pod into its node: a veth pair whose pod end is
// the pod's interface (per family, a /32 or /128 address and a default
// route via the node's gateway of that family) and whose host end carries
// a host route to each of the pod's addresses. Both sides get permanent
// neighbour entries, so no ARP or IPv6 neighbour discovery is needed in
// either direction.
package pods

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/onc-net/onc/internal/netaddr"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/sysctl"
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
	Netns     string       // path of the pod's network namespace
	IfName    string       // interface in the pod, e.g. eth0
	HostIface string       // host end of the veth
	IPs       []netip.Addr // the pod's addresses, at most one per family (each configured as a host prefix)
	Gateways  []netip.Addr // the node's gateways, one for each of IPs' families (first address of its node CIDR)
	MTU       int
	// ProcSys is where the node's sysctls are ("" = /proc/sys); in the
	// pod's namespace its net/ subtree shows the pod's.
	ProcSys string
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
	link, err := setup(p, ns, nh, tmp)
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

func setup(p Pod, ns netns.Handle, nh *netlink.Handle, tmp string) (Link, error) {
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

	if len(p.IPs) == 0 || len(p.Gateways) != len(p.IPs) {
		return Link{}, fmt.Errorf("pod addresses %v need one gateway each, have %v", p.IPs, p.Gateways)
	}
	// IPv6 on both ends even where the node or the runtime turned it off
	// by default, and no duplicate address detection on the pod's end:
	// its address is the node's to give, and usable at once.
	if slices.ContainsFunc(p.IPs, netip.Addr.Is6) {
		err := netns.Do(ns, func() error {
			return sysctl.WriteIPv6Conf(p.ProcSys, p.IfName, "accept_dad=0", "disable_ipv6=0")
		})
		if err != nil {
			return Link{}, err
		}
		if err := sysctl.WriteIPv6Conf(p.ProcSys, p.HostIface, "disable_ipv6=0"); err != nil {
			return Link{}, err
		}
	}

	// Pod side.
	if lo, err := nh.LinkByName("lo"); err == nil {
		if err := nh.LinkSetUp(lo); err != nil {
			return Link{}, fmt.Errorf("pod lo up: %w", err)
		}
	}
	for _, ip := range p.IPs {
		if err := nh.AddrAdd(pod, &netlink.Addr{IPNet: netaddr.HostPrefix(ip), Flags: unix.IFA_F_NODAD}); err != nil {
			return Link{}, fmt.Errorf("pod address %s: %w", ip, err)
		}
	}
	if err := nh.LinkSetUp(pod); err != nil {
		return Link{}, fmt.Errorf("pod %s up: %w", p.IfName, err)
	}
	for _, gw := range p.Gateways {
		if err := nh.NeighAdd(&netlink.Neigh{LinkIndex: pod.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: gw.AsSlice(), HardwareAddr: hostMAC, Family: netaddr.Family(gw)}); err != nil {
			return Link{}, fmt.Errorf("pod neighbour for gateway %s: %w", gw, err)
		}
		if err := nh.RouteAdd(&netlink.Route{LinkIndex: pod.Attrs().Index, Scope: netlink.SCOPE_LINK, Dst: netaddr.HostPrefix(gw)}); err != nil {
			return Link{}, fmt.Errorf("pod route to gateway %s: %w", gw, err)
		}
		if err := nh.RouteAdd(&netlink.Route{LinkIndex: pod.Attrs().Index, Gw: gw.AsSlice(), Family: netaddr.Family(gw)}); err != nil {
			return Link{}, fmt.Errorf("pod default route via %s: %w", gw, err)
		}
	}

	// Host side.
	if err := netlink.LinkSetUp(host); err != nil {
		return Link{}, fmt.Errorf("host %s up: %w", p.HostIface, err)
	}
	for _, ip := range p.IPs {
		if err := netlink.NeighAdd(&netlink.Neigh{LinkIndex: host.Attrs().Index, State: netlink.NUD_PERMANENT,
			IP: ip.AsSlice(), HardwareAddr: podMAC, Family: netaddr.Family(ip)}); err != nil {
			return Link{}, fmt.Errorf("host neighbour for pod %s: %w", ip, err)
		}
		if err := netlink.RouteReplace(hostRoute(host.Attrs().Index, ip)); err != nil {
			return Link{}, fmt.Errorf("host route to pod %s: %w", ip, err)
		}
	}
	return Link{PodMAC: podMAC, HostMAC: hostMAC, HostIndex: host.Attrs().Index}, nil
}

func hostRoute(ifindex int, ip netip.Addr) *netlink.Route {
	return &netlink.Route{LinkIndex: ifindex, Scope: netlink.SCOPE_LINK, Dst: netaddr.HostPrefix(ip), Protocol: RouteProtocol}
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
	for _, ip := range p.IPs {
		routes, err := netlink.RouteListFiltered(netaddr.Family(ip), hostRoute(host.Attrs().Index, ip), netlink.RT_FILTER_DST|netlink.RT_FILTER_OIF)
		if err != nil || len(routes) == 0 {
			return fmt.Errorf("host route %s dev %s missing", ip, p.HostIface)
		}
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
	addrs, err := nh.AddrList(pod, unix.AF_UNSPEC)
	if err != nil {
		return err
	}
	for _, want := range p.IPs {
		if !slices.ContainsFunc(addrs, func(a netlink.Addr) bool { ip, _ := netip.AddrFromSlice(a.IP); return ip.Unmap() == want }) {
			return fmt.Errorf("pod interface %s lacks address %s", p.IfName, want)
		}
	}
	for _, gw := range p.Gateways {
		routes, err := nh.RouteListFiltered(netaddr.Family(gw), &netlink.Route{LinkIndex: pod.Attrs().Index}, netlink.RT_FILTER_OIF)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(routes, func(r netlink.Route) bool {
			return (r.Dst == nil || r.Dst.IP.IsUnspecified() && isZero(r.Dst.Mask)) && net.IP(gw.AsSlice()).Equal(r.Gw)
		}) {
			return fmt.Errorf("pod default route via %s dev %s missing", gw, p.IfName)
		}
	}
	return nil
}

func isZero(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}
