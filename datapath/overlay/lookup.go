package overlay

import (
	"fmt"
	"net"
	"net/netip"

	"github.com/onc-net/onc/internal/netaddr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Forwarding is where the node's kernel sends a packet, as onctl trace
// shows it: the route and, when it leads into the overlay device, the
// next hop's VTEP MAC (neighbour table) and the node that MAC lives on
// (the device's FDB), the outer destination of the VXLAN frame.
type Forwarding struct {
	Dev     string     // the route's device
	Via     netip.Addr // the route's gateway; invalid for a directly connected destination
	Src     netip.Addr // the source address the route prefers, if any
	VTEPMAC net.HardwareAddr
	Remote  netip.Addr // the peer node's tunnel address: the outer destination
	// Missing names the entry the overlay lacks (neighbour or FDB), if
	// the route leads into it and the chain breaks there.
	Missing string
}

// Lookup asks the kernel of the current network namespace (the node's)
// how it forwards a packet from src, arriving on iif (a pod's host-side
// veth), to dst.
func Lookup(iif string, src, dst netip.Addr) (Forwarding, error) {
	var f Forwarding
	routes, err := netlink.RouteGetWithOptions(dst.AsSlice(), &netlink.RouteGetOptions{Iif: iif, SrcAddr: src.AsSlice()})
	if err != nil {
		return f, fmt.Errorf("route from %s (%s) to %s: %w", src, iif, dst, err)
	}
	if len(routes) == 0 {
		return f, fmt.Errorf("route from %s (%s) to %s: none", src, iif, dst)
	}
	r := routes[0]
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return f, fmt.Errorf("route to %s: its device %d: %w", dst, r.LinkIndex, err)
	}
	f.Dev, f.Via, f.Src = link.Attrs().Name, addrOf(r.Gw), addrOf(r.Src)
	if f.Dev != DeviceName {
		return f, nil
	}
	next := f.Via
	if !next.IsValid() {
		next = dst
	}
	neighs, err := netlink.NeighList(r.LinkIndex, netaddr.Family(next))
	if err != nil {
		return f, fmt.Errorf("neighbours of %s: %w", DeviceName, err)
	}
	for _, n := range neighs {
		if addrOf(n.IP) == next && n.HardwareAddr != nil {
			f.VTEPMAC = n.HardwareAddr
		}
	}
	if f.VTEPMAC == nil {
		f.Missing = fmt.Sprintf("neighbour %s on %s", next, DeviceName)
		return f, nil
	}
	fdb, err := netlink.NeighList(r.LinkIndex, unix.AF_BRIDGE)
	if err != nil {
		return f, fmt.Errorf("fdb of %s: %w", DeviceName, err)
	}
	for _, n := range fdb {
		if n.HardwareAddr.String() == f.VTEPMAC.String() && n.IP != nil {
			f.Remote = addrOf(n.IP)
		}
	}
	if !f.Remote.IsValid() {
		f.Missing = fmt.Sprintf("FDB entry of %s on %s", f.VTEPMAC, DeviceName)
	}
	return f, nil
}
