//go:build privileged

package fastpath

// The overlay guard on an IPv6 underlay (datapath/bpf/include/overlay.h):
// frames with an outer IPv6 header, judged as strictly as IPv4 ones, with
// BPF_PROG_RUN against real maps; the sender maps of IPv6 tunnel
// endpoints; and the fast path, which cannot run there.

import (
	"encoding/binary"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// The IPv6 underlay: this node's tunnel endpoint, a peer's, another
// node's and a stranger's, with the pods of prog_test.go and
// senders_test.go.
var (
	localNode6    = netip.MustParseAddr("2001:db8:0:2::1")
	peerNode6     = netip.MustParseAddr("2001:db8:0:2::2")
	otherNode6    = netip.MustParseAddr("2001:db8:0:2::9")
	strangerNode6 = netip.MustParseAddr("2001:db8:0:7::7")
	// peerSenderU6 is what the control plane lets peerNode6 speak for: its
	// pod CIDRs of both families and its node address.
	peerSenderU6  = Sender{NodeIP: peerNode6, Sources: []netip.Prefix{peerCIDR, peerCIDR6, netip.PrefixFrom(peerNode6, 128)}}
	otherSenderU6 = Sender{NodeIP: otherNode6, Sources: []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24"), otherCIDR6, netip.PrefixFrom(otherNode6, 128)}}
)

// openNode loads the datapath with o's node settings on a private bpffs
// mounted on a temporary dir, the fast path left off.
func openNode(t *testing.T, o Options) *Datapath {
	testutil.Privileged(t)
	dir := t.TempDir()
	o.PinDir, o.VNI, o.Port, o.Mark = dir, 1, 4789, mark
	d, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	return d
}

// openU6 is a node on the IPv6 underlay with the IPv6 pod CIDR localCIDR6
// and podCIDR (zero: an IPv6-only node).
func openU6(t *testing.T, podCIDR netip.Prefix) *Datapath {
	return openNode(t, Options{NodeIP: localNode6, PodCIDR: podCIDR, PodCIDRv6: localCIDR6})
}

// vxlan6 wraps an inner frame as the kernel's VXLAN device does over an
// IPv6 underlay, with the extension headers exts before UDP (ONC's peers
// send none).
func vxlan6(inner []byte, src, dst netip.Addr, vni uint32, exts ...ext6) []byte {
	b := frame6(nicLocal, nicPeer, src, dst, unix.IPPROTO_UDP, 50000, 4789, 8+len(inner), exts...)
	vx := b[len(b)-8-len(inner):]
	vx[0] = 0x08
	binary.BigEndian.PutUint32(vx[4:], vni<<8)
	copy(vx[8:], inner)
	return b
}

// tagged is pkt with a VLAN tag left in its data.
func tagged(pkt []byte) []byte {
	return append(append(append([]byte{}, pkt[:12]...), 0x81, 0x00, 0x00, 0x00), pkt[12:]...)
}

// hiding6 is a destination options header whose option (an unknown one
// a receiver skips) holds, at the offsets where an IPv6 frame without
// extension headers has them, a VXLAN header and the inner frame fake:
// a guard reading those fixed offsets past an extension header would
// judge fake, while the kernel decapsulates the frame after it.
func hiding6(fake []byte) ext6 {
	h := make([]byte, 8+8+len(fake)+(8-len(fake)%8)%8)
	h[1] = byte(len(h)/8 - 1)
	h[2], h[3] = 0x1e, byte(len(h)-4)
	vx := h[8:] // at 14+40+8, where the UDP header ends without it
	vx[0] = 0x08
	binary.BigEndian.PutUint32(vx[4:], 1<<8)
	copy(vx[8:], fake)
	return ext6{unix.IPPROTO_DSTOPTS, h}
}

// guardCasesU6 are frames to a node on the IPv6 underlay, whose IPv4 pod
// CIDR is localCIDR unless ipv6Only; its senders are peerSenderU6 and
// otherSenderU6, and peerSender and otherSender on the IPv4 underlay.
func guardCasesU6(ipv6Only bool) []guardCase {
	in4 := func(src, dst netip.Addr) []byte {
		return frame(vtepLocal, vtepPeer, src, dst, unix.IPPROTO_TCP, 80, 40000, 0, 10)
	}
	in6 := func(src, dst netip.Addr) []byte {
		return frame6(vtepLocal, vtepPeer, src, dst, unix.IPPROTO_TCP, 80, 40000, 10)
	}
	fromPeer := func(inner []byte) []byte { return vxlan6(inner, peerNode6, localNode6, 1) }
	pod6 := fromPeer(in6(remotePod6, localPod6))
	arp := fromPeer(in4(remotePod, localPod))
	binary.BigEndian.PutUint16(arp[70+12:], unix.ETH_P_ARP)
	// To an IPv4 pod: inner_destination on a node without IPv4 pods.
	toPods4 := ""
	if ipv6Only {
		toPods4 = "overlay_drop_inner_destination"
	}
	outside6 := netip.MustParseAddr("2001:db8::5")
	return []guardCase{
		{"a peer's IPv6 pod", pod6, ""},
		{"a peer's IPv4 pod", fromPeer(in4(remotePod, localPod)), toPods4},
		{"a peer's node address (its host's traffic)", fromPeer(in6(peerNode6, localPod6)), ""},
		{"a peer to this node's IPv6 gateway", fromPeer(in6(remotePod6, localCIDR6.Addr().Next())), ""},
		{"a peer to this node's IPv4 gateway", fromPeer(in4(remotePod, netip.MustParseAddr("10.244.1.1"))), toPods4},
		{"a peer to this node (its pod's reply to our host)", fromPeer(in6(remotePod6, localNode6)), ""},
		{"plain UDP over IPv6 to another port", frame6(nicLocal, nicPeer, peerNode6, localNode6, unix.IPPROTO_UDP, 1, 53, 10), ""},
		{"TCP over IPv6 to port 4789", frame6(nicLocal, nicPeer, peerNode6, localNode6, unix.IPPROTO_TCP, 40000, 4789, 10), ""},
		{"a later fragment (no port to read)", frame6(nicLocal, nicPeer, peerNode6, localNode6, unix.IPPROTO_UDP, 50000, 4789, 10, fragment6(8, false)), ""},

		{"a host that is no peer", vxlan6(in6(remotePod6, localPod6), strangerNode6, localNode6, 1), "overlay_drop_unknown_sender"},
		{"a host that is no peer, IPv4 inside", vxlan6(in4(remotePod, localPod), strangerNode6, localNode6, 1), "overlay_drop_unknown_sender"},
		{"a host that is no peer, with its own inner source", vxlan6(in6(strangerNode6, localPod6), strangerNode6, localNode6, 1), "overlay_drop_unknown_sender"},
		{"a peer's IPv4 endpoint, IPv4-mapped", vxlan6(in4(remotePod, localPod), netip.AddrFrom16(peerNode.As16()), localNode6, 1), "overlay_drop_unknown_sender"},

		{"a peer speaking for another peer's IPv6 pod", fromPeer(in6(otherPod6, localPod6)), "overlay_drop_inner_source"},
		{"a peer speaking for another peer's IPv4 pod", fromPeer(in4(otherPod, localPod)), "overlay_drop_inner_source"},
		{"a peer speaking for this node's pod", fromPeer(in6(localPod6, localPod6)), "overlay_drop_inner_source"},
		{"a peer speaking for another node's address", fromPeer(in6(otherNode6, localPod6)), "overlay_drop_inner_source"},
		{"a peer speaking for an IPv4 node address it has not", fromPeer(in4(peerNode, localPod)), "overlay_drop_inner_source"},
		{"a peer speaking for an address outside the cluster", fromPeer(in6(outside6, localPod6)), "overlay_drop_inner_source"},
		{"a peer speaking for a link-local address", fromPeer(in6(netip.MustParseAddr("fe80::1"), localPod6)), "overlay_drop_inner_source"},

		{"a peer to another node's IPv6 pod (a relay)", fromPeer(in6(remotePod6, otherPod6)), "overlay_drop_inner_destination"},
		{"a peer to another node's address (a relay)", fromPeer(in6(remotePod6, otherNode6)), "overlay_drop_inner_destination"},
		{"a peer to its own address (a hairpin)", fromPeer(in6(remotePod6, peerNode6)), "overlay_drop_inner_destination"},
		{"a peer to an address outside the cluster (a relay)", fromPeer(in6(remotePod6, outside6)), "overlay_drop_inner_destination"},
		{"a peer to another node's IPv4 pod (a relay)", fromPeer(in4(remotePod, otherPod)), "overlay_drop_inner_destination"},
		{"a peer to this node's IPv4 address, no tunnel endpoint here", fromPeer(in4(remotePod, localNode)), "overlay_drop_inner_destination"},
		{"a peer to 0.0.0.0 (no IPv4 endpoint: onc_node_ip is zero)", fromPeer(in4(remotePod, netip.IPv4Unspecified())), "overlay_drop_inner_destination"},
		{"a peer to the IPv6 unspecified address", fromPeer(in6(remotePod6, netip.IPv6Unspecified())), "overlay_drop_inner_destination"},
		{"a peer's neighbour solicitation (multicast)", fromPeer(in6(remotePod6, netip.MustParseAddr("ff02::1:ff00:2"))), "overlay_drop_inner_destination"},

		{"another VNI", vxlan6(in6(remotePod6, localPod6), peerNode6, localNode6, 2), "overlay_drop_malformed"},
		{"to another address of this node", vxlan6(in6(remotePod6, localPod6), peerNode6, netip.MustParseAddr("2001:db8:0:2::100"), 1), "overlay_drop_malformed"},
		{"to the unspecified address", vxlan6(in6(remotePod6, localPod6), peerNode6, netip.IPv6Unspecified(), 1), "overlay_drop_malformed"},
		{"a VLAN tag left in the data", tagged(pod6), "overlay_drop_malformed"},
		{"destination options before UDP", vxlan6(in6(remotePod6, localPod6), peerNode6, localNode6, 1, options6(unix.IPPROTO_DSTOPTS, 1)), "overlay_drop_malformed"},
		{"hop-by-hop options before UDP", vxlan6(in6(remotePod6, localPod6), peerNode6, localNode6, 1, options6(unix.IPPROTO_HOPOPTS, 1)), "overlay_drop_malformed"},
		{"destination options longer than the guard pulls", vxlan6(in6(remotePod6, localPod6), peerNode6, localNode6, 1, options6(unix.IPPROTO_DSTOPTS, 32)), "overlay_drop_malformed"},
		{"a first fragment", vxlan6(in6(remotePod6, localPod6), peerNode6, localNode6, 1, fragment6(0, true)), "overlay_drop_malformed"},
		{"destination options hiding a frame the guard would let on", vxlan6(in6(otherPod6, localPod6), peerNode6, localNode6, 1, hiding6(in6(remotePod6, localPod6))), "overlay_drop_malformed"},
		{"an atomic fragment", vxlan6(in6(remotePod6, localPod6), peerNode6, localNode6, 1, fragment6(0, false)), "overlay_drop_malformed"},
		{"an inner frame neither IPv4 nor IPv6", arp, "overlay_drop_malformed"},
		{"cut short before the inner Ethernet header", pod6[:70+10], "overlay_drop_malformed"},
		{"an inner IPv6 header cut short", pod6[:70+14+39], "overlay_drop_malformed"},
		// The IPv4 underlay's frames, from a sender known there: this node
		// has no IPv4 endpoint (onc_node_ip is zero).
		{"IPv4 underlay: a known peer to this node's IPv4 address", vxlan(in4(remotePod, localPod), peerNode, localNode, 1), "overlay_drop_malformed"},
		{"IPv4 underlay: a known peer to 0.0.0.0", vxlan(in4(remotePod, localPod), peerNode, netip.IPv4Unspecified(), 1), "overlay_drop_malformed"},
	}
}

// Each case on a dual-stack node of the IPv6 underlay and on an IPv6-only
// one, whose senders include the IPv4 underlay's (a sender set the agent
// would not write, so that the frames of that underlay find a sender).
// The fast path stays off: it cannot run on an IPv6 underlay.
func TestOverlayGuardOnAnIPv6Underlay(t *testing.T) {
	for _, podCIDR := range []netip.Prefix{localCIDR, {}} {
		ipv6Only := !podCIDR.IsValid()
		t.Run(map[bool]string{false: "dual-stack node", true: "IPv6-only node"}[ipv6Only], func(t *testing.T) {
			d := openU6(t, podCIDR)
			testutil.Must(t, d.SyncSenders([]Sender{peerSenderU6, otherSenderU6, peerSender6, otherSender6}, false))
			for _, c := range guardCasesU6(ipv6Only) {
				expectGuard(t, d, d.progs.OncIngressFast, c)
			}
		})
	}
}

// A node on the IPv4 underlay has no IPv6 tunnel endpoint (onc_node_ip6
// is zero): a frame with an outer IPv6 header has no destination there,
// even from a sender known on the IPv6 underlay (a sender set the agent
// would not write), and no inner IPv6 packet is for its (zero) endpoint.
func TestOverlayGuardIPv6FramesOnAnIPv4Underlay(t *testing.T) {
	d := openNode(t, Options{NodeIP: localNode, PodCIDR: localCIDR, PodCIDRv6: localCIDR6})
	testutil.Must(t, d.SyncSenders([]Sender{peerSender6, peerSenderU6}, false))
	in6 := func(src, dst netip.Addr) []byte {
		return frame6(vtepLocal, vtepPeer, src, dst, unix.IPPROTO_TCP, 80, 40000, 10)
	}
	for _, c := range []guardCase{
		{"IPv4 underlay: a peer's IPv6 pod", vxlan(in6(remotePod6, localPod6), peerNode, localNode, 1), ""},
		{"IPv4 underlay: a peer to the IPv6 unspecified address", vxlan(in6(remotePod6, netip.IPv6Unspecified()), peerNode, localNode, 1), "overlay_drop_inner_destination"},
		{"IPv6 underlay: a known peer to this node's IPv6 address", vxlan6(in6(remotePod6, localPod6), peerNode6, localNode6, 1), "overlay_drop_malformed"},
		{"IPv6 underlay: a known peer to the unspecified address", vxlan6(in6(remotePod6, localPod6), peerNode6, netip.IPv6Unspecified(), 1), "overlay_drop_malformed"},
		{"IPv6 underlay: a host that is no peer", vxlan6(in6(remotePod6, localPod6), strangerNode6, localNode6, 1), "overlay_drop_malformed"},
		{"plain UDP over IPv6 to another port", frame6(nicLocal, nicPeer, peerNode6, localNode6, unix.IPPROTO_UDP, 1, 53, 10), ""},
	} {
		expectGuard(t, d, d.progs.OncIngressFast, c)
	}
}

// A node of an IPv6-only cluster on the IPv4 underlay: without an IPv4
// pod CIDR (an all-zero mask), inner IPv4 goes only to the node's
// endpoint, never to a pod-looking address.
func TestOverlayGuardOnAnIPv6OnlyNodeOfTheIPv4Underlay(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "fast path on", false: "fast path off"}[on], func(t *testing.T) {
			d := openNode(t, Options{NodeIP: localNode, PodCIDRv6: localCIDR6})
			testutil.Must(t, d.Configure(on))
			testutil.Must(t, d.SyncSenders([]Sender{peerSender6}, false))
			in4 := func(dst netip.Addr) []byte {
				return vxlan(frame(vtepLocal, vtepPeer, remotePod, dst, unix.IPPROTO_TCP, 80, 40000, 0, 10), peerNode, localNode, 1)
			}
			for _, c := range []guardCase{
				{"IPv4 to a pod-looking address", in4(localPod), "overlay_drop_inner_destination"},
				{"IPv4 to a gateway-looking address", in4(netip.MustParseAddr("10.244.1.1")), "overlay_drop_inner_destination"},
				{"IPv4 to 0.0.0.0", in4(netip.IPv4Unspecified()), "overlay_drop_inner_destination"},
				{"IPv4 to this node (its pod's reply to our host)", in4(localNode), ""},
				{"a peer's IPv6 pod", vxlan(frame6(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, 80, 40000, 10), peerNode, localNode, 1), ""},
			} {
				expectGuard(t, d, d.progs.OncIngressFast, c)
			}
		})
	}
}

// What Open gives the programs: the endpoint of the underlay's family,
// the other zero, and an all-zero mask for a family without pods.
func TestOpenSetsTheEndpointOfTheUnderlaysFamily(t *testing.T) {
	for _, c := range []struct {
		name            string
		o               Options
		ip4             uint32
		ip6             [16]byte
		podMask, pod6M0 uint32
	}{
		{"IPv4 underlay, dual-stack", Options{NodeIP: localNode, PodCIDR: localCIDR, PodCIDRv6: localCIDR6}, bpf.NetIPv4(localNode), [16]byte{}, 0x00ffffff, 0xffffffff},
		{"IPv4 underlay, IPv6-only", Options{NodeIP: localNode, PodCIDRv6: localCIDR6}, bpf.NetIPv4(localNode), [16]byte{}, 0, 0xffffffff},
		{"IPv6 underlay, dual-stack", Options{NodeIP: localNode6, PodCIDR: localCIDR, PodCIDRv6: localCIDR6}, 0, localNode6.As16(), 0x00ffffff, 0xffffffff},
		{"IPv6 underlay, IPv6-only", Options{NodeIP: localNode6, PodCIDRv6: localCIDR6}, 0, localNode6.As16(), 0, 0xffffffff},
		{"IPv6 underlay, IPv4-only", Options{NodeIP: localNode6, PodCIDR: localCIDR}, 0, localNode6.As16(), 0x00ffffff, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := openNode(t, c.o)
			v := d.objs.FastpathVariables
			var ip4, podMask uint32
			var ip6 [16]byte
			var pod6Mask [4]uint32
			testutil.Must(t, v.OncNodeIp.Get(&ip4))
			testutil.Must(t, v.OncNodeIp6.Get(&ip6))
			testutil.Must(t, v.OncPodMask.Get(&podMask))
			testutil.Must(t, v.OncPod6Mask.Get(&pod6Mask))
			if ip4 != c.ip4 || ip6 != c.ip6 || podMask != c.podMask || pod6Mask[0] != c.pod6M0 {
				t.Fatalf("onc_node_ip %#x, onc_node_ip6 %x, onc_pod_mask %#x, onc_pod6_mask[0] %#x; want %#x, %x, %#x, %#x",
					ip4, ip6, podMask, pod6Mask[0], c.ip4, c.ip6, c.podMask, c.pod6M0)
			}
		})
	}
}

// Open refuses node settings the guard cannot hold, before loading
// anything.
func TestOpenRefusesWhatTheGuardCannotHold(t *testing.T) {
	testutil.Privileged(t)
	for _, c := range []struct {
		name, want string
		o          Options
	}{
		{"no pod CIDR, IPv4 underlay", "no pod CIDR", Options{NodeIP: localNode}},
		{"no pod CIDR, IPv6 underlay", "no pod CIDR", Options{NodeIP: localNode6}},
		{"an IPv4-mapped node IP", "IPv4-mapped", Options{NodeIP: netip.AddrFrom16(localNode.As16()), PodCIDR: localCIDR}},
		{"no node IP", "tunnel endpoint", Options{PodCIDR: localCIDR}},
		{"the IPv4 unspecified node IP", "tunnel endpoint", Options{NodeIP: netip.IPv4Unspecified(), PodCIDR: localCIDR}},
		{"the IPv6 unspecified node IP", "tunnel endpoint", Options{NodeIP: netip.IPv6Unspecified(), PodCIDRv6: localCIDR6}},
		{"an IPv6 link-local node IP", "link-local", Options{NodeIP: netip.MustParseAddr("fe80::1"), PodCIDRv6: localCIDR6}},
		{"a zoned IPv6 node IP", "link-local or zoned", Options{NodeIP: netip.MustParseAddr("fd00::1%eth0"), PodCIDRv6: localCIDR6}},
		{"an IPv6 prefix as the IPv4 pod CIDR", "not an IPv4 prefix", Options{NodeIP: localNode6, PodCIDR: localCIDR6}},
		{"an IPv4-mapped prefix as the IPv4 pod CIDR", "not an IPv4 prefix", Options{NodeIP: localNode, PodCIDR: netip.MustParsePrefix("::ffff:10.244.1.0/120")}},
		{"an IPv4 pod CIDR of /0", "not an IPv4 prefix", Options{NodeIP: localNode, PodCIDR: netip.MustParsePrefix("0.0.0.0/0")}},
	} {
		dir := t.TempDir()
		c.o.PinDir, c.o.VNI, c.o.Port, c.o.Mark = dir, 1, 4789, mark
		d, err := Open(c.o)
		if err == nil {
			d.Close()
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
		// A fresh bpffs may hold the kernel's own iterators (maps.debug).
		if pins, _ := filepath.Glob(filepath.Join(dir, "onc_*")); len(pins) != 0 {
			t.Errorf("%s: pinned %v before the refusal", c.name, pins)
		}
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
}

// expectSendersU6 checks what the IPv6 underlay's sender maps hold:
// onc_senders_u6 exactly want4, onc_senders6_u6 exactly want6.
func expectSendersU6(t *testing.T, d *Datapath, want4 map[senderU6Key]senderVal, want6 map[sender6U6Key]senderVal) {
	t.Helper()
	expectMap(t, "onc_senders_u6", func() (map[senderU6Key]senderVal, error) {
		return contents[senderU6Key, senderVal](d.maps.OncSendersU6)
	}, want4)
	expectMap(t, "onc_senders6_u6", func() (map[sender6U6Key]senderVal, error) {
		return contents[sender6U6Key, senderVal](d.maps.OncSenders6U6)
	}, want6)
}

func TestSyncSendersWithIPv6EndpointsWritesOnlyChanges(t *testing.T) {
	d := openU6(t, localCIDR)
	all := func(ss ...Sender) func() error { return func() error { return d.SyncSenders(ss, false) } }
	// The endpoint in each map, a source of each family and the node
	// address: 5 for peerSenderU6.
	expectPeerWrites(t, "first sync", peerWrites(t, d, all(peerSenderU6)), 5)
	expectPeerWrites(t, "same set", peerWrites(t, d, all(peerSenderU6)), 0)
	expectPeerWrites(t, "a peer more", peerWrites(t, d, all(peerSenderU6, otherSenderU6)), 5)
	expectPeerWrites(t, "a peer less", peerWrites(t, d, all(otherSenderU6)), 5)
	other := otherNode6.As16()
	expectSendersU6(t, d, map[senderU6Key]senderVal{
		{Prefixlen: 128, Peer: other}: {MaySend: 0},
		{Prefixlen: 128 + 24, Peer: other, Inner: bpf.NetIPv4(netip.MustParseAddr("10.244.9.0"))}: {MaySend: 1},
	}, map[sender6U6Key]senderVal{
		{Prefixlen: 128, Peer: other}:                                       {MaySend: 0},
		{Prefixlen: 128 + 64, Peer: other, Inner: otherCIDR6.Addr().As16()}: {MaySend: 1},
		{Prefixlen: 128 + 128, Peer: other, Inner: otherNode6.As16()}:       {MaySend: 1},
	})
	expectSenders(t, d, map[senderKey]senderVal{}, map[sender6Key]senderVal{})

	// Masked, as every source is.
	moved := netip.MustParsePrefix("fd00:10:244:99::1/64")
	movedSender := Sender{NodeIP: otherNode6, Sources: []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24"), moved, netip.PrefixFrom(otherNode6, 128)}}
	expectPeerWrites(t, "the IPv6 source moved", peerWrites(t, d, all(movedSender)), 2)
	expectSendersU6(t, d, map[senderU6Key]senderVal{
		{Prefixlen: 128, Peer: other}: {MaySend: 0},
		{Prefixlen: 128 + 24, Peer: other, Inner: bpf.NetIPv4(netip.MustParseAddr("10.244.9.0"))}: {MaySend: 1},
	}, map[sender6U6Key]senderVal{
		{Prefixlen: 128, Peer: other}:                                           {MaySend: 0},
		{Prefixlen: 128 + 64, Peer: other, Inner: moved.Masked().Addr().As16()}: {MaySend: 1},
		{Prefixlen: 128 + 128, Peer: other, Inner: otherNode6.As16()}:           {MaySend: 1},
	})
	// Both underlays' senders at once: each in its own maps.
	expectPeerWrites(t, "an IPv4 endpoint beside", peerWrites(t, d, all(movedSender, peerSender)), 4)
	if n4, n6, u4, u6 := bpftest.Entries(t, d.maps.OncSenders), bpftest.Entries(t, d.maps.OncSenders6), bpftest.Entries(t, d.maps.OncSendersU6), bpftest.Entries(t, d.maps.OncSenders6U6); n4 != 3 || n6 != 1 || u4 != 2 || u6 != 3 {
		t.Fatalf("entries %d, %d, %d, %d; want 3, 1, 2, 3", n4, n6, u4, u6)
	}
	expectPeerWrites(t, "gone", peerWrites(t, d, all()), 9)
	expectSendersU6(t, d, map[senderU6Key]senderVal{}, map[sender6U6Key]senderVal{})
}

// Drift in the IPv6 underlay's sender maps (here an entry deleted from
// each behind the agent's back) stays until a sync that checks the kernel
// reads them back and writes exactly the missing entries.
func TestSyncSendersRepairsIPv6EndpointDriftWithCheckKernel(t *testing.T) {
	d := openU6(t, localCIDR)
	testutil.Must(t, d.SyncSenders([]Sender{peerSenderU6}, false))
	full4, err := contents[senderU6Key, senderVal](d.maps.OncSendersU6)
	testutil.Must(t, err)
	full6, err := contents[sender6U6Key, senderVal](d.maps.OncSenders6U6)
	testutil.Must(t, err)
	peer := peerNode6.As16()
	lost4 := senderU6Key{Prefixlen: 128 + 24, Peer: peer, Inner: bpf.NetIPv4(peerCIDR.Addr())}
	lost6 := sender6U6Key{Prefixlen: 128 + 128, Peer: peer, Inner: peerNode6.As16()}
	if _, ok := full4[lost4]; !ok {
		t.Fatal("the IPv4 source's entry was never there")
	}
	if _, ok := full6[lost6]; !ok {
		t.Fatal("the node address's entry was never there")
	}
	testutil.Must(t, d.maps.OncSendersU6.Delete(lost4))
	testutil.Must(t, d.maps.OncSenders6U6.Delete(lost6))
	sync := func(checkKernel bool) func() error {
		return func() error { return d.SyncSenders([]Sender{peerSenderU6}, checkKernel) }
	}
	reads4, reads6 := d.sendersU6.reads, d.senders6U6.reads
	expectPeerWrites(t, "without checkKernel", peerWrites(t, d, sync(false)), 0)
	if bpftest.Entries(t, d.maps.OncSendersU6) != len(full4)-1 || bpftest.Entries(t, d.maps.OncSenders6U6) != len(full6)-1 {
		t.Fatal("the drift was repaired without checkKernel")
	}
	expectPeerWrites(t, "checking the kernel", peerWrites(t, d, sync(true)), 2)
	if d.sendersU6.reads != reads4+1 || d.senders6U6.reads != reads6+1 {
		t.Fatalf("%d and %d read-backs, want 1 of each map", d.sendersU6.reads-reads4, d.senders6U6.reads-reads6)
	}
	expectSendersU6(t, d, full4, full6)
	// A peer whose node address the drift took is known again.
	pkt := vxlan6(frame6(vtepLocal, vtepPeer, peerNode6, localPod6, unix.IPPROTO_TCP, 80, 40000, 10), peerNode6, localNode6, 1)
	expectGuard(t, d, d.progs.OncIngressFast, guardCase{"the peer's host after the repair", pkt, ""})
}

// An agent of this version on the pins of the one before, which had no
// IPv6 underlay's sender maps: they are created beside the pinned ones,
// which are adopted, and the first sync reads all four back.
func TestUpgradeAddsTheIPv6EndpointSenderMaps(t *testing.T) {
	old := openWith(t, Options{PodCIDRv6: localCIDR6})
	established(t, old)
	testutil.Must(t, old.Close())
	for _, m := range []string{bpf.FastpathMapOncSendersU6, bpf.FastpathMapOncSenders6U6} {
		testutil.Must(t, os.Remove(filepath.Join(old.opts.PinDir, m)))
	}
	d, err := Open(old.opts)
	testutil.Must(t, err)
	t.Cleanup(func() { d.Close() })
	if flows, err := d.Flows(); err != nil || len(flows) != 1 {
		t.Fatalf("flows %v (%v) after the upgrade, want the learned one adopted", flows, err)
	}
	if n4, u4, u6 := bpftest.Entries(t, d.maps.OncSenders), bpftest.Entries(t, d.maps.OncSendersU6), bpftest.Entries(t, d.maps.OncSenders6U6); n4 != 3 || u4 != 0 || u6 != 0 {
		t.Fatalf("%d IPv4-endpoint and %d, %d IPv6-endpoint sender entries after the upgrade, want the 3 pinned and none", n4, u4, u6)
	}
	reads := d.senders.reads + d.senders6.reads + d.sendersU6.reads + d.senders6U6.reads
	expectPeerWrites(t, "first sync", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender, peerSenderU6}, false) }), 5)
	if got := d.senders.reads + d.senders6.reads + d.sendersU6.reads + d.senders6U6.reads; got != reads+4 {
		t.Fatalf("%d read-backs in the first sync, want one of each sender map", got-reads)
	}
}

// The agent may hand an IPv4-underlay node IPv6 node addresses: SetHosts
// leaves them out of onc_hosts (its IPv4 ones stay), and SyncPeers refuses
// a fast-path peer at one, before writing anything, rather than take it
// for IPv4.
func TestSyncPeersAndSetHostsWithIPv6Addresses(t *testing.T) {
	d := open(t)
	established(t, d)
	expectPeerWrites(t, "hosts of both families", peerWrites(t, d, func() error {
		return d.SetHosts([]netip.Addr{peerNode6, otherNode, otherNode6}, false)
	}), 1)
	expectMap(t, "hosts", func() (map[uint32]uint8, error) { return contents[uint32, uint8](d.maps.OncHosts) }, hostEntries([]netip.Addr{otherNode}))
	before := d.PeerWrites()
	err := d.SyncPeers([]Peer{{PodCIDR: otherCIDR6, NodeIP: otherNode}, {PodCIDR: peerCIDR6, NodeIP: peerNode6}}, false)
	if err == nil || !strings.Contains(err.Error(), "not of the underlay's family") {
		t.Fatalf("a fast-path peer at an IPv6 endpoint: %v, want refused", err)
	}
	if d.PeerWrites() != before {
		t.Fatalf("%d writes before the refusal", d.PeerWrites()-before)
	}
	expectMap(t, "peers", func() (map[cidrKey]cidrVal, error) { return contents[cidrKey, cidrVal](d.maps.OncPeers) }, peerEntries([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}))
}
