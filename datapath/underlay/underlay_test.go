//go:build privileged

package underlay

import (
	"net"
	"net/netip"
	"testing"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// TestHeaderStale checks a learned header against the kernel's real routes,
// neighbours and links in a throwaway namespace, over an IPv4 underlay and
// an IPv6 one (NDP's neighbours, IPv6 routes): a header stays while the
// underlay matches it (or the kernel merely collected the next hop's entry,
// which it is then asked to resolve), and goes when the peer's or the
// gateway's MAC, the uplink's MAC, the route's interface or the peer's VTEP
// MAC changed, or the next hop failed.
func TestHeaderStale(t *testing.T) {
	t.Run("IPv4", func(t *testing.T) {
		headerStale(t, unix.AF_INET, "192.0.2.1/24", "192.0.2.2", "198.51.100.0/24", "198.51.100.7", "192.0.2.254")
	})
	t.Run("IPv6", func(t *testing.T) {
		headerStale(t, unix.AF_INET6, "2001:db8:2::1/64", "2001:db8:2::2", "2001:db8:51::/64", "2001:db8:51::7", "2001:db8:2::fe")
	})
}

// headerStale is TestHeaderStale on an underlay of family: the uplink's
// address (a prefix), a peer on its subnet, a subnet behind a gateway
// with a peer in it, and the gateway.
func headerStale(t *testing.T, family int, uplinkAddr, directPeer, remoteNet, routedPeer, gatewayAddr string) {
	var (
		direct  = netip.MustParseAddr(directPeer)
		routed  = netip.MustParseAddr(routedPeer)
		gateway = net.ParseIP(gatewayAddr)
		nodeMAC = net.HardwareAddr{2, 0, 0, 0, 0xb, 1}
		peerMAC = net.HardwareAddr{2, 0, 0, 0, 0xb, 2}
		gwMAC   = net.HardwareAddr{2, 0, 0, 0, 0xb, 0xfe}
		vtep    = net.HardwareAddr{2, 0, 0, 0, 0xa, 2}
	)
	testutil.InNewNetns(t, "ul", func() {
		veth := func(name, peer string, mac net.HardwareAddr) netlink.Link {
			testutil.Must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac}, PeerName: peer}))
			l, err := netlink.LinkByName(name)
			testutil.Must(t, err)
			testutil.Must(t, netlink.LinkSetUp(l))
			return l
		}
		up := veth("up0", "up1", nodeMAC)
		addr, err := netlink.ParseIPNet(uplinkAddr)
		testutil.Must(t, err)
		testutil.Must(t, netlink.AddrAdd(up, &netlink.Addr{IPNet: addr, Flags: unix.IFA_F_NODAD}))
		neigh := func(ip net.IP, mac net.HardwareAddr) {
			testutil.Must(t, netlink.NeighSet(&netlink.Neigh{LinkIndex: up.Attrs().Index, Family: family, State: netlink.NUD_REACHABLE, IP: ip, HardwareAddr: mac}))
		}
		neigh(direct.AsSlice(), peerMAC)
		neigh(gateway, gwMAC)
		dst, err := netlink.ParseIPNet(remoteNet)
		testutil.Must(t, err)
		viaGateway := &netlink.Route{Dst: dst, Gw: gateway, LinkIndex: up.Attrs().Index}
		testutil.Must(t, netlink.RouteAdd(viaGateway))

		header := func(node netip.Addr, next net.HardwareAddr) fastpath.Encap {
			return fastpath.Encap{Node: node, Ifindex: up.Attrs().Index, OuterSrc: nodeMAC, OuterDst: next, InnerDst: vtep}
		}
		expect := func(what string, e fastpath.Encap, vtepNow net.HardwareAddr, wantStale, wantMoved bool) {
			t.Helper()
			view := newUnderlayView()
			if stale, moved := view.headerStale(e, vtepNow); stale != wantStale || moved != wantMoved {
				t.Errorf("%s, header to %s: stale %v, moved %v; want %v, %v", what, e.Node, stale, moved, wantStale, wantMoved)
			}
		}

		expect("unchanged underlay", header(direct, peerMAC), vtep, false, false)
		expect("unchanged underlay", header(routed, gwMAC), vtep, false, false)
		expect("peer on a new machine", header(direct, peerMAC), net.HardwareAddr{2, 0, 0, 0, 0xa, 9}, true, true)
		expect("VTEP MAC unknown", header(direct, peerMAC), nil, false, false)

		neigh(direct.AsSlice(), net.HardwareAddr{2, 0, 0, 0, 0xb, 9})
		expect("peer's MAC changed", header(direct, peerMAC), vtep, true, false)
		expect("peer's MAC changed", header(routed, gwMAC), vtep, false, false)
		neigh(gateway, net.HardwareAddr{2, 0, 0, 0, 0xb, 0xfd})
		expect("gateway's MAC changed", header(routed, gwMAC), vtep, true, false)

		// An entry the kernel collected says nothing changed: the header
		// stays, and the kernel is asked to resolve the next hop again.
		testutil.Must(t, netlink.NeighDel(&netlink.Neigh{LinkIndex: up.Attrs().Index, Family: family, IP: gateway}))
		expect("next hop's entry collected", header(routed, gwMAC), vtep, false, false)
		if !hasNeighbour(t, up.Attrs().Index, family, gateway) {
			t.Error("the kernel was not asked to resolve the collected next hop")
		}
		testutil.Must(t, netlink.NeighSet(&netlink.Neigh{LinkIndex: up.Attrs().Index, Family: family, State: netlink.NUD_FAILED, IP: gateway}))
		expect("next hop failed", header(routed, gwMAC), vtep, true, false)

		other := veth("up2", "up3", nodeMAC) // same MAC too: only the interface differs
		testutil.Must(t, netlink.RouteReplace(&netlink.Route{Dst: viaGateway.Dst, LinkIndex: other.Attrs().Index, Scope: netlink.SCOPE_LINK}))
		// Resolved there with the old next hop's MAC.
		testutil.Must(t, netlink.NeighSet(&netlink.Neigh{LinkIndex: other.Attrs().Index, Family: family, State: netlink.NUD_REACHABLE, IP: routed.AsSlice(), HardwareAddr: gwMAC}))
		expect("route moved to another interface", header(routed, gwMAC), vtep, true, false)

		testutil.Must(t, netlink.LinkSetHardwareAddr(up, net.HardwareAddr{2, 0, 0, 0, 0xb, 0x11}))
		expect("uplink's MAC changed", header(direct, net.HardwareAddr{2, 0, 0, 0, 0xb, 9}), vtep, true, false)
	})
}

func hasNeighbour(t *testing.T, ifindex, family int, ip net.IP) bool {
	t.Helper()
	list, err := netlink.NeighList(ifindex, family)
	if err != nil {
		t.Fatal(err)
	}
	for _, nb := range list {
		if nb.IP.Equal(ip) {
			return true
		}
	}
	return false
}
