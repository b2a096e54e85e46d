package overlay_test

import (
	"net"
	"net/netip"
	"testing"

	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/podnet"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inNode runs fn inside a fresh namespace with an uplink "ul0" at 192.0.2.1/24.
func inNode(t *testing.T, fn func(uplink int)) {
	testutil.InNewNetns(t, "ovl", func() {
		if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "ul0"}, PeerName: "ul1"}); err != nil {
			t.Fatal(err)
		}
		ul, _ := netlink.LinkByName("ul0")
		if err := netlink.AddrAdd(ul, &netlink.Addr{IPNet: &net.IPNet{IP: net.IPv4(192, 0, 2, 1), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatal(err)
		}
		if err := netlink.LinkSetUp(ul); err != nil {
			t.Fatal(err)
		}
		fn(ul.Attrs().Index)
	})
}

func peer(name, ip, cidr string, last byte) overlay.Peer {
	return overlay.Peer{Name: name, NodeIP: netip.MustParseAddr(ip), PodCIDR: netip.MustParsePrefix(cidr),
		VTEPMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, last}}
}

type state struct{ routes, neighs, fdb int }

func read(t *testing.T) state {
	l, err := netlink.LinkByName(overlay.DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	var s state
	routes, _ := netlink.RouteList(l, unix.AF_INET)
	for _, r := range routes {
		if r.Protocol == podnet.RouteProtocol {
			s.routes++
		}
	}
	n, _ := netlink.NeighList(l.Attrs().Index, unix.AF_INET)
	f, _ := netlink.NeighList(l.Attrs().Index, unix.AF_BRIDGE)
	s.neighs, s.fdb = len(n), len(f)
	return s
}

func TestDeviceIsAdoptedOrReplacedAndPeersPruned(t *testing.T) {
	inNode(t, func(uplink int) {
		cfg := overlay.Config{VNI: 1, Port: 4789, LocalIP: netip.MustParseAddr("192.0.2.1"), Uplink: uplink,
			MAC: net.HardwareAddr{0x02, 1, 1, 1, 1, 1}, MTU: 1450, Gateway: netip.MustParseAddr("10.244.1.1")}
		o, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		v := o.Link().(*netlink.Vxlan)
		if v.UDPCSum || v.Learning || v.Port != 4789 || v.VxlanId != 1 || v.MTU != 1450 || v.HardwareAddr.String() != cfg.MAC.String() {
			t.Fatalf("device settings: udpcsum=%v learning=%v port=%d vni=%d mtu=%d mac=%s", v.UDPCSum, v.Learning, v.Port, v.VxlanId, v.MTU, v.HardwareAddr)
		}
		a, b := peer("a", "192.0.2.2", "10.244.2.0/24", 2), peer("b", "192.0.2.3", "10.244.3.0/24", 3)
		if err := o.Sync([]overlay.Peer{a, b}); err != nil {
			t.Fatal(err)
		}
		if s := read(t); s != (state{2, 2, 2}) {
			t.Fatalf("after 2 peers: %+v", s)
		}
		// Same settings: adopted, entries kept (an agent restart).
		o2, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if o2.Link().Attrs().Index != o.Link().Attrs().Index {
			t.Fatal("unchanged device was recreated instead of adopted")
		}
		if s := read(t); s != (state{2, 2, 2}) {
			t.Fatalf("adoption lost entries: %+v", s)
		}
		// b left while the agent was down; a moved to another node IP.
		a.NodeIP = netip.MustParseAddr("192.0.2.9")
		if err := o2.Sync([]overlay.Peer{a}); err != nil {
			t.Fatal(err)
		}
		if s := read(t); s != (state{1, 1, 1}) {
			t.Fatalf("after b left: %+v", s)
		}
		f, _ := netlink.NeighList(o2.Link().Attrs().Index, unix.AF_BRIDGE)
		if !f[0].IP.Equal(net.IPv4(192, 0, 2, 9)) {
			t.Fatalf("fdb for a points at %s, want its new node IP", f[0].IP)
		}
		// Another VNI: the device is replaced.
		cfg.VNI = 7
		o3, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if o3.Link().(*netlink.Vxlan).VxlanId != 7 {
			t.Fatal("VNI change not applied")
		}
	})
}
