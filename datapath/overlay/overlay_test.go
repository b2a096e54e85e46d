//go:build privileged

package overlay_test

import (
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/pods"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/utils/ptr"
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

// ensure makes the device as a node at 192.0.2.1 with gateway 10.244.1.1 would.
func ensure(t *testing.T, uplink int) (*overlay.Overlay, overlay.Config) {
	t.Helper()
	cfg := overlay.Config{VNI: 1, Port: 4789, LocalIP: netip.MustParseAddr("192.0.2.1"), Uplink: uplink,
		MAC: net.HardwareAddr{0x02, 1, 1, 1, 1, 1}, MTU: 1450, Gateway: netip.MustParseAddr("10.244.1.1")}
	o, err := overlay.Ensure(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return o, cfg
}

func peer(name, ip, cidr string, last byte) overlay.Peer {
	return overlay.Peer{Name: name, NodeIP: netip.MustParseAddr(ip), PodCIDR: netip.MustParsePrefix(cidr),
		VTEPMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, last}}
}

func TestDeviceIsAdoptedOrReplacedAndPeersPruned(t *testing.T) {
	inNode(t, func(uplink int) {
		o, cfg := ensure(t, uplink)
		v := o.Link().(*netlink.Vxlan)
		if v.UDPCSum || v.Learning || v.Port != 4789 || v.VxlanId != 1 || v.MTU != 1450 || v.HardwareAddr.String() != cfg.MAC.String() {
			t.Fatalf("device settings: udpcsum=%v learning=%v port=%d vni=%d mtu=%d mac=%s", v.UDPCSum, v.Learning, v.Port, v.VxlanId, v.MTU, v.HardwareAddr)
		}
		a, b := peer("a", "192.0.2.2", "10.244.2.0/24", 2), peer("b", "192.0.2.3", "10.244.3.0/24", 3)
		if err := o.Sync([]overlay.Peer{a, b}, false); err != nil {
			t.Fatal(err)
		}
		expectKernel(t, "after 2 peers", []overlay.Peer{a, b})
		// Same settings: adopted, entries kept (an agent restart).
		o2, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if o2.Link().Attrs().Index != o.Link().Attrs().Index {
			t.Fatal("unchanged device was recreated instead of adopted")
		}
		expectKernel(t, "after adoption", []overlay.Peer{a, b})
		// b left while the agent was down; a moved to another node IP.
		a.NodeIP = netip.MustParseAddr("192.0.2.9")
		if err := o2.Sync([]overlay.Peer{a}, false); err != nil {
			t.Fatal(err)
		}
		expectKernel(t, "after b left and a moved", []overlay.Peer{a})
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

// manyPeers are n peers p000…: pod CIDR 10.244.(i+2).0/24, node IP
// 198.18.(i/256).(i%256), VTEP MAC 02:00:00:00:(i/256):(i%256).
func manyPeers(n int) []overlay.Peer {
	out := make([]overlay.Peer, n)
	for i := range out {
		out[i] = overlay.Peer{Name: fmt.Sprintf("p%03d", i), NodeIP: netip.AddrFrom4([4]byte{198, 18, byte(i / 256), byte(i)}),
			PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i + 2), 0}), 24), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, byte(i / 256), byte(i)}}
	}
	return out
}

// kernel is the device's ONC entries as text: routes by destination,
// neighbours by IP, FDB entries by MAC.
type kernel struct{ routes, neighs, fdb map[string]string }

func readKernel(t *testing.T) kernel {
	t.Helper()
	l, err := netlink.LinkByName(overlay.DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	k := kernel{map[string]string{}, map[string]string{}, map[string]string{}}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		routes, err := netlink.RouteListFiltered(fam, &netlink.Route{LinkIndex: l.Attrs().Index, Table: unix.RT_TABLE_UNSPEC},
			netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range routes {
			if r.Protocol == pods.RouteProtocol {
				k.routes[fmt.Sprintf("table %d %s", r.Table, r.Dst)] = fmt.Sprintf("via %s onlink=%v", r.Gw, r.Flags&int(netlink.FLAG_ONLINK) != 0)
			}
		}
	}
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6, unix.AF_BRIDGE} {
		ns, err := netlink.NeighList(l.Attrs().Index, fam)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range ns {
			switch {
			case fam == unix.AF_BRIDGE:
				k.fdb[n.HardwareAddr.String()] += fmt.Sprintf("dst %s state=%#x;", n.IP, n.State)
			case fam == unix.AF_INET || n.State != netlink.NUD_NOARP: // IPv6 multicast groups: the kernel's
				k.neighs[n.IP.String()] = fmt.Sprintf("%s state=%#x", n.HardwareAddr, n.State)
			}
		}
	}
	return k
}

// wantKernel is what readKernel must find for peers.
func wantKernel(peers []overlay.Peer) kernel {
	k := kernel{map[string]string{}, map[string]string{}, map[string]string{}}
	for _, p := range peers {
		for _, cidr := range []netip.Prefix{p.PodCIDR, p.PodCIDR6} {
			if !cidr.IsValid() {
				continue
			}
			gw := overlay.Gateway(cidr)
			k.routes[fmt.Sprintf("table %d %s", unix.RT_TABLE_MAIN, cidr)] = fmt.Sprintf("via %s onlink=true", gw)
			k.neighs[gw.String()] = fmt.Sprintf("%s state=%#x", p.VTEPMAC, netlink.NUD_PERMANENT)
			if cidr.Addr().Is4() == p.NodeIP.Is4() {
				// The peer's host, in the table its marked connections
				// are routed by.
				k.routes[fmt.Sprintf("table %d %s", overlay.PeerHostTable, netip.PrefixFrom(p.NodeIP, p.NodeIP.BitLen()))] = fmt.Sprintf("via %s onlink=true", gw)
			}
		}
		k.fdb[p.VTEPMAC.String()] = fmt.Sprintf("dst %s state=%#x;", p.NodeIP, netlink.NUD_PERMANENT)
	}
	return k
}

func expectKernel(t *testing.T, when string, peers []overlay.Peer) {
	t.Helper()
	got, want := readKernel(t), wantKernel(peers)
	for _, c := range []struct {
		kind      string
		got, want map[string]string
	}{{"routes", got.routes, want.routes}, {"neighbours", got.neighs, want.neighs}, {"fdb", got.fdb, want.fdb}} {
		if !maps.Equal(c.got, c.want) {
			for k, v := range c.got {
				if c.want[k] != v {
					t.Errorf("%s: %s %s: kernel has %q, want %q", when, c.kind, k, v, c.want[k])
				}
			}
			for k, v := range c.want {
				if _, ok := c.got[k]; !ok {
					t.Errorf("%s: %s %s missing, want %q", when, c.kind, k, v)
				}
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}

// syncWrites runs a Sync and returns how many netlink writes it made.
func syncWrites(t *testing.T, o *overlay.Overlay, peers []overlay.Peer, checkKernel bool) uint64 {
	t.Helper()
	before := o.Writes()
	if err := o.Sync(peers, checkKernel); err != nil {
		t.Fatal(err)
	}
	return o.Writes() - before
}

func expectWrites(t *testing.T, what string, got, want uint64) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: %d netlink writes, want %d", what, got, want)
	}
}

// At scale a reconcile that changes nothing must write nothing: only what
// differs from what is programmed is written, and the kernel is read back
// (and repaired) only when asked.
func TestSyncWritesOnlyWhatDiffers(t *testing.T) {
	inNode(t, func(uplink int) {
		o, _ := ensure(t, uplink)
		peers := manyPeers(200)
		expectWrites(t, "first sync", syncWrites(t, o, peers, false), 4*200)
		expectKernel(t, "first sync", peers)
		expectWrites(t, "steady state", syncWrites(t, o, peers, false), 0)
		expectWrites(t, "steady state, kernel checked", syncWrites(t, o, peers, true), 0)
		if n := len(o.Programmed()); n != 200 {
			t.Fatalf("%d peers programmed, want 200", n)
		}

		peers[7].NodeIP = netip.MustParseAddr("198.18.9.9")
		expectWrites(t, "node IP changed", syncWrites(t, o, peers, false), 3) // the FDB entry; the reply route out and in
		expectKernel(t, "node IP changed", peers)
		peers[8].VTEPMAC = net.HardwareAddr{2, 0, 0, 0, 9, 9}
		expectWrites(t, "VTEP MAC changed", syncWrites(t, o, peers, false), 3) // neighbour; FDB entry out and in
		expectKernel(t, "VTEP MAC changed", peers)
		peers[9].PodCIDR = netip.MustParsePrefix("10.245.0.0/24")
		expectWrites(t, "pod CIDR changed", syncWrites(t, o, peers, false), 5) // route and neighbour out and in; the reply route's gateway
		expectKernel(t, "pod CIDR changed", peers)
		peers = slices.Delete(peers, 10, 11)
		expectWrites(t, "peer left", syncWrites(t, o, peers, false), 4)
		expectKernel(t, "peer left", peers)

		// Drift: only a kernel check notices it, and repairs just that.
		if err := netlink.RouteDel(&netlink.Route{Dst: &net.IPNet{IP: net.IPv4(10, 244, 20, 0), Mask: net.CIDRMask(24, 32)}}); err != nil {
			t.Fatal(err)
		}
		expectWrites(t, "route deleted, kernel not checked", syncWrites(t, o, peers, false), 0)
		expectWrites(t, "route deleted, kernel checked", syncWrites(t, o, peers, true), 1)
		expectKernel(t, "route restored", peers)

		// Entries of no peer, and wrong ones, are repaired by a kernel check.
		idx := o.Link().Attrs().Index
		for _, err := range []error{
			netlink.RouteAdd(&netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: net.IPv4(10, 99, 0, 0), Mask: net.CIDRMask(24, 32)},
				Gw: net.IPv4(10, 99, 0, 1), Flags: int(netlink.FLAG_ONLINK), Protocol: pods.RouteProtocol}),
			netlink.NeighAdd(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: net.IPv4(10, 99, 0, 1), HardwareAddr: net.HardwareAddr{2, 9, 9, 9, 9, 9}}),
			// A flood entry with two remotes.
			netlink.NeighAppend(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF,
				IP: net.IPv4(198, 18, 99, 1), HardwareAddr: make(net.HardwareAddr, 6)}),
			netlink.NeighAppend(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT, Flags: netlink.NTF_SELF,
				IP: net.IPv4(198, 18, 99, 2), HardwareAddr: make(net.HardwareAddr, 6)}),
			netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
				IP: overlay.Gateway(peers[1].PodCIDR).AsSlice(), HardwareAddr: net.HardwareAddr{2, 9, 9, 9, 9, 8}}),
			// Right MAC, but not permanent: the kernel may age it out.
			netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_REACHABLE,
				IP: overlay.Gateway(peers[2].PodCIDR).AsSlice(), HardwareAddr: peers[2].VTEPMAC}),
			netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: peers[3].PodCIDR.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)},
				Gw: net.IPv4(10, 99, 0, 1), Flags: int(netlink.FLAG_ONLINK), Protocol: pods.RouteProtocol}),
		} {
			if err != nil {
				t.Fatal(err)
			}
		}
		if fdb := readKernel(t).fdb["00:00:00:00:00:00"]; strings.Count(fdb, "dst") != 2 {
			t.Fatalf("flood entry: %q, want two remotes", fdb)
		}
		expectWrites(t, "strays, kernel not checked", syncWrites(t, o, peers, false), 0)
		expectWrites(t, "strays, kernel checked", syncWrites(t, o, peers, true), 7)
		expectKernel(t, "strays removed", peers)
	})
}

// A restarted agent's first Sync reads the kernel: entries that are right
// stay untouched, those of peers that left while it was down go.
func TestRestartWritesOnlyWhatDiffers(t *testing.T) {
	inNode(t, func(uplink int) {
		o, cfg := ensure(t, uplink)
		peers := manyPeers(200)
		expectWrites(t, "first sync", syncWrites(t, o, peers, false), 4*200)

		o2, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		expectWrites(t, "first sync after a restart", syncWrites(t, o2, peers, false), 0)
		expectKernel(t, "after a restart", peers)
		if n := len(o2.Programmed()); n != 200 {
			t.Fatalf("%d peers programmed after a restart, want 200", n)
		}

		o3, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		expectWrites(t, "first sync after a restart, a peer gone", syncWrites(t, o3, peers[1:], false), 4)
		expectKernel(t, "after a restart, a peer gone", peers[1:])
		// The peer-host rule, added once however often the device is
		// ensured, and put back by a kernel check when it went.
		expectPeerHostRules(t, "after three Ensures", 1)
		rule := netlink.NewRule()
		rule.Priority, rule.Table, rule.Mark, rule.Mask = overlay.PeerHostRulePriority, overlay.PeerHostTable, overlay.PeerHostMark, ptr.To(uint32(overlay.PeerHostMark))
		if err := netlink.RuleDel(rule); err != nil {
			t.Fatal(err)
		}
		expectPeerHostRules(t, "deleted", 0)
		testutil.Must(t, o3.Sync(peers[1:], true))
		expectPeerHostRules(t, "after a kernel check", 1)
	})
}

// After a failed write the kernel's state is unknown: the next Sync reads
// it back, and writes only what is still missing.
func TestSyncAfterAFailedWriteReadsTheKernel(t *testing.T) {
	inNode(t, func(uplink int) {
		o, _ := ensure(t, uplink)
		a, b := peer("a", "192.0.2.2", "10.244.2.0/24", 2), peer("b", "2001:db8::3", "10.244.3.0/24", 3)
		if err := o.Sync([]overlay.Peer{a, b}, false); err == nil || !strings.Contains(err.Error(), "peer b: fdb") {
			t.Fatalf("error %v, want b's FDB entry refused (an IPv6 remote on an IPv4 device)", err)
		}
		if p := o.Programmed(); len(p) != 1 || p["a"].Name != "a" {
			t.Fatalf("programmed %v, want a only", p)
		}
		// b's neighbour went in before its FDB entry failed: only the FDB
		// entry and the routes are left to write.
		b.NodeIP = netip.MustParseAddr("192.0.2.3")
		expectWrites(t, "after a failed write", syncWrites(t, o, []overlay.Peer{a, b}, false), 3)
		expectKernel(t, "after a failed write", []overlay.Peer{a, b})
	})
}

// expectPeerHostRules wants n rules fwmark PeerHostMark lookup PeerHostTable.
func expectPeerHostRules(t *testing.T, when string, n int) {
	t.Helper()
	expectPeerHostRulesOf(t, unix.AF_INET, when, n)
}

// expectPeerHostRulesOf is expectPeerHostRules in family.
func expectPeerHostRulesOf(t *testing.T, family int, when string, n int) {
	t.Helper()
	rules, err := netlink.RuleList(family)
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for _, r := range rules {
		if r.Priority == overlay.PeerHostRulePriority && r.Table == overlay.PeerHostTable && r.Mark == overlay.PeerHostMark &&
			r.Mask != nil && *r.Mask == overlay.PeerHostMark {
			got++
		}
	}
	if got != n {
		t.Fatalf("%s: %d rules fwmark %#x lookup %d, want %d: %v", when, got, overlay.PeerHostMark, overlay.PeerHostTable, n, rules)
	}
}

// A node with IPv6 pods routes its dual-stack peers' IPv6 CIDRs over the
// device too (one FDB entry serves both families), holds its IPv6 gateway
// without a link-local address (nothing of the device's own goes into the
// overlay), writes nothing at steady state and after an agent restart, and
// removes a peer's IPv6 entries when the peer loses its IPv6 CIDR. A node
// without IPv6 pods programs no IPv6 at all.
func TestDualStackPeers(t *testing.T) {
	inNode(t, func(uplink int) {
		cfg := overlay.Config{VNI: 1, Port: 4789, LocalIP: netip.MustParseAddr("192.0.2.1"), Uplink: uplink,
			MAC: net.HardwareAddr{0x02, 1, 1, 1, 1, 1}, MTU: 1450, Gateway: netip.MustParseAddr("10.244.1.1"),
			Gateway6: netip.MustParseAddr("fd00:10:244:1::1")}
		// The device as a node without IPv6 pods (or an earlier version)
		// made it, with the link-local address the kernel gives it; then
		// adopted by a dual-stack agent.
		v4 := cfg
		v4.Gateway6 = netip.Addr{}
		o4, err := overlay.Ensure(v4)
		if err != nil {
			t.Fatal(err)
		}
		if addrs, _ := netlink.AddrList(o4.Link(), unix.AF_INET6); len(addrs) != 1 || !addrs[0].IP.IsLinkLocalUnicast() {
			t.Fatalf("the IPv4-only device's IPv6 addresses %v, want the kernel's link-local one (else this tests nothing)", addrs)
		}
		o, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := netlink.AddrList(o.Link(), unix.AF_UNSPEC)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, a := range addrs {
			got = append(got, a.IPNet.String())
		}
		slices.Sort(got)
		if want := []string{"10.244.1.1/32", "fd00:10:244:1::1/128"}; !slices.Equal(got, want) {
			t.Fatalf("device addresses %v, want %v", got, want)
		}
		a, b := peer("a", "192.0.2.2", "10.244.2.0/24", 2), peer("b", "192.0.2.3", "10.244.3.0/24", 3)
		a.PodCIDR6 = netip.MustParsePrefix("fd00:10:244:2::/64")
		peers := []overlay.Peer{a, b}
		if err := o.Sync(peers, false); err != nil {
			t.Fatal(err)
		}
		expectKernel(t, "dual-stack peer", peers)
		expectWrites(t, "steady state", syncWrites(t, o, peers, true), 0)
		again, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		expectWrites(t, "after a restart", syncWrites(t, again, peers, true), 0)
		a.PodCIDR6 = netip.Prefix{}
		peers = []overlay.Peer{a, b}
		if err := again.Sync(peers, false); err != nil {
			t.Fatal(err)
		}
		expectKernel(t, "the peer without its IPv6 CIDR", peers)

		// This node without IPv6 pods: the peer's IPv6 CIDR is not routed,
		// and the device's IPv6 gateway goes.
		if o4, err = overlay.Ensure(v4); err != nil {
			t.Fatal(err)
		}
		a.PodCIDR6 = netip.MustParsePrefix("fd00:10:244:2::/64")
		if err := o4.Sync([]overlay.Peer{a, b}, true); err != nil {
			t.Fatal(err)
		}
		a.PodCIDR6 = netip.Prefix{}
		expectKernel(t, "a node without IPv6 pods", []overlay.Peer{a, b})
		if addrs, _ := netlink.AddrList(o4.Link(), unix.AF_INET6); len(addrs) != 0 {
			t.Fatalf("IPv6 addresses left on the device: %v", addrs)
		}
	})
}

// On an IPv6 underlay the device's tunnel endpoint is the node's IPv6
// address and its FDB entries send to the peers' IPv6 addresses; an
// IPv6-only node routes its IPv6-only peers' pods and, in the peer-host
// table, their node addresses (/128) via their IPv6 gateways, with the
// peer-host rule in IPv6. Steady state and a restart write nothing.
func TestIPv6Underlay(t *testing.T) {
	inNode(t, func(uplink int) {
		ul, err := netlink.LinkByIndex(uplink)
		if err != nil {
			t.Fatal(err)
		}
		if err := netlink.AddrAdd(ul, &netlink.Addr{IPNet: &net.IPNet{IP: net.ParseIP("fd00:172::1"), Mask: net.CIDRMask(64, 128)},
			Flags: unix.IFA_F_NODAD}); err != nil {
			t.Fatal(err)
		}
		if overlay.ListensOn(netip.MustParseAddr("fd00:172::1")) {
			t.Fatal("ListensOn without a device")
		}
		cfg := overlay.Config{VNI: 1, Port: 4789, LocalIP: netip.MustParseAddr("fd00:172::1"), Uplink: uplink,
			MAC: net.HardwareAddr{0x02, 1, 1, 1, 1, 1}, MTU: 1500 - overlay.OverheadOf(netip.MustParseAddr("fd00:172::1")),
			Gateway6: netip.MustParseAddr("fd00:10:244:1::1")}
		// An earlier agent's device, alike but for zero-checksum frames,
		// which the kernel cannot turn on in place: replaced.
		if err := netlink.LinkAdd(&netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: overlay.DeviceName, MTU: cfg.MTU, HardwareAddr: cfg.MAC},
			VxlanId: cfg.VNI, VtepDevIndex: uplink, SrcAddr: net.ParseIP("fd00:172::1"), Port: cfg.Port}); err != nil {
			t.Fatal(err)
		}
		older, err := netlink.LinkByName(overlay.DeviceName)
		if err != nil {
			t.Fatal(err)
		}
		o, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if o.Link().Attrs().Index == older.Attrs().Index {
			t.Fatal("a device that refuses zero-checksum frames was adopted")
		}
		// The fast path's frames come with a zero UDP checksum.
		if v := o.Link().(*netlink.Vxlan); !v.SrcAddr.Equal(net.ParseIP("fd00:172::1")) || v.MTU != 1430 || !v.UDP6ZeroCSumRx {
			t.Fatalf("device local %s, MTU %d, udp6zerocsumrx %v; want fd00:172::1, 1430 and on", v.SrcAddr, v.MTU, v.UDP6ZeroCSumRx)
		}
		// BringUp puts the new guard first where the device does not
		// listen on the node's endpoint (a changed family, say).
		if !overlay.ListensOn(cfg.LocalIP) || overlay.ListensOn(netip.MustParseAddr("192.0.2.1")) {
			t.Error("ListensOn does not tell the device's tunnel endpoint")
		}
		expectPeerHostRulesOf(t, unix.AF_INET6, "an IPv6 underlay", 1)
		a := overlay.Peer{Name: "a", NodeIP: netip.MustParseAddr("fd00:172::2"), PodCIDR6: netip.MustParsePrefix("fd00:10:244:2::/64"),
			VTEPMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 2}}
		b := overlay.Peer{Name: "b", NodeIP: netip.MustParseAddr("fd00:172::3"), PodCIDR6: netip.MustParsePrefix("fd00:10:244:3::/64"),
			VTEPMAC: net.HardwareAddr{0x02, 0, 0, 0, 0, 3}}
		peers := []overlay.Peer{a, b}
		if err := o.Sync(peers, false); err != nil {
			t.Fatal(err)
		}
		expectKernel(t, "IPv6-only peers", peers)
		expectWrites(t, "steady state", syncWrites(t, o, peers, true), 0)
		again, err := overlay.Ensure(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if again.Link().Attrs().Index != o.Link().Attrs().Index {
			t.Fatal("the unchanged device was recreated instead of adopted")
		}
		expectWrites(t, "after a restart", syncWrites(t, again, peers, true), 0)
		if err := again.Sync([]overlay.Peer{a}, false); err != nil {
			t.Fatal(err)
		}
		expectKernel(t, "after b left", []overlay.Peer{a})
	})
}
