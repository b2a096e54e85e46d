//go:build privileged

package fastpath

// The overlay guard (datapath/bpf/include/overlay.h), run on crafted frames
// with BPF_PROG_RUN against real maps: what it lets on, what it drops, and
// the counter each drop lands in, with the fast path on and off.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// A dual-stack cluster's IPv6 pod CIDRs and pods, beside the IPv4 ones of
// prog_test.go: this node's, the peer's and another node's.
var (
	localCIDR6 = netip.MustParsePrefix("fd00:10:244:1::/64")
	peerCIDR6  = netip.MustParsePrefix("fd00:10:244:2::/64")
	otherCIDR6 = netip.MustParsePrefix("fd00:10:244:9::/64")
	localPod6  = netip.MustParseAddr("fd00:10:244:1::2")
	remotePod6 = netip.MustParseAddr("fd00:10:244:2::3")
	otherPod6  = netip.MustParseAddr("fd00:10:244:9::3")
)

// withSources is s speaking for more sources too.
func withSources(s Sender, more ...netip.Prefix) Sender {
	return Sender{NodeIP: s.NodeIP, Sources: append(slices.Clone(s.Sources), more...)}
}

// ext6 is an IPv6 extension header: its protocol number and its bytes,
// whose first (the next header) frame6 fills in.
type ext6 struct {
	proto uint8
	hdr   []byte
}

// options6 is a hop-by-hop, routing or destination options header of n
// 8-byte units, padded (PadN; a routing header of type 0 with no segment
// left).
func options6(proto uint8, n int) ext6 {
	h := make([]byte, 8*n)
	h[1] = byte(n - 1)
	if proto != unix.IPPROTO_ROUTING {
		h[2], h[3] = 1, byte(len(h)-4)
	}
	return ext6{proto, h}
}

// ah6 is an authentication header with a 12-byte ICV: 24 bytes, which it
// counts in 4-byte units less 2.
func ah6() ext6 {
	h := make([]byte, 24)
	h[1] = 24/4 - 2
	return ext6{unix.IPPROTO_AH, h}
}

// fragment6 is a fragment header at offset (in bytes, a multiple of 8),
// more fragments to come or not.
func fragment6(offset uint16, more bool) ext6 {
	h := make([]byte, 8)
	binary.BigEndian.PutUint16(h[2:], offset)
	if more {
		h[3] |= 1
	}
	binary.BigEndian.PutUint32(h[4:], 1) // identification
	return ext6{unix.IPPROTO_FRAGMENT, h}
}

// frame6 builds Ethernet/IPv6 with the extension headers exts, then an
// upper-layer header of proto (TCP with ACK; any other 8 bytes, whose
// first four are the ports) from sport to dport, and payload bytes.
func frame6(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, proto uint8, sport, dport uint16, payload int, exts ...ext6) []byte {
	b := append(append(append([]byte{}, dstMAC...), srcMAC...), 0x86, 0xdd)
	ip := make([]byte, 40)
	ip[0], ip[7] = 0x60, 64
	copy(ip[8:24], src.AsSlice())
	copy(ip[24:40], dst.AsSlice())
	b = append(b, ip...)
	next := 14 + 6 // where the next header's protocol goes
	for _, e := range exts {
		b[next] = e.proto
		next = len(b)
		b = append(b, e.hdr...)
	}
	b[next] = proto
	l4 := make([]byte, 8, 20)
	if proto == unix.IPPROTO_TCP {
		l4 = l4[:20]
		l4[12], l4[13] = 5<<4, 0x10
	}
	binary.BigEndian.PutUint16(l4[0:], sport)
	binary.BigEndian.PutUint16(l4[2:], dport)
	if proto == unix.IPPROTO_UDP {
		binary.BigEndian.PutUint16(l4[4:], uint16(8+payload))
	}
	b = append(append(b, l4...), make([]byte, payload)...)
	binary.BigEndian.PutUint16(b[14+4:], uint16(len(b)-14-40))
	return b
}

// guardCase is a frame for the uplink's program and what must become of it.
type guardCase struct {
	name string
	pkt  []byte
	drop string // counter of the drop; "" when the guard lets it on
}

func guardCases() []guardCase {
	in := func(src netip.Addr) []byte {
		return frame(vtepLocal, vtepPeer, src, localPod, unix.IPPROTO_TCP, 80, 40000, 0, 10)
	}
	fromPeer := func(src netip.Addr) []byte { return vxlan(in(src), peerNode, localNode, 1) }
	withOuter := func(pkt []byte, edit func(ip []byte)) []byte {
		edit(pkt[14:34])
		binary.BigEndian.PutUint16(pkt[24:], 0)
		binary.BigEndian.PutUint16(pkt[24:], ipsum(pkt[14:34]))
		return pkt
	}
	// The outer IPv4 header with 4 bytes of options (a NOP and an end).
	withOptions := func(pkt []byte) []byte {
		out := append(append(append([]byte{}, pkt[:34]...), 1, 0, 0, 0), pkt[34:]...)
		return withOuter(out, func(ip []byte) {
			ip[0] = 0x46
			binary.BigEndian.PutUint16(ip[2:], binary.BigEndian.Uint16(ip[2:])+4)
		})
	}
	toDst := func(dst netip.Addr) []byte {
		return vxlan(frame(vtepLocal, vtepPeer, remotePod, dst, unix.IPPROTO_TCP, 80, 40000, 0, 10), peerNode, localNode, 1)
	}
	// The outer frame with a VLAN tag left in its data (the kernel strips
	// a priority tag of VLAN 0, and the tag under it, after tc).
	tagged := func(pkt []byte) []byte {
		return append(append(append([]byte{}, pkt[:12]...), 0x81, 0x00, 0x00, 0x00), pkt[12:]...)
	}
	arp := fromPeer(remotePod)
	binary.BigEndian.PutUint16(arp[50+12:], unix.ETH_P_ARP)
	// IPv6 inner frames, over the same IPv4 underlay.
	in6 := func(src, dst netip.Addr) []byte {
		return frame6(vtepLocal, vtepPeer, src, dst, unix.IPPROTO_TCP, 80, 40000, 10)
	}
	fromPeer6 := func(src netip.Addr) []byte { return vxlan(in6(src, localPod6), peerNode, localNode, 1) }
	toDst6 := func(dst netip.Addr) []byte { return vxlan(in6(remotePod6, dst), peerNode, localNode, 1) }
	version4 := fromPeer6(remotePod6)
	version4[50+14] = 0x40
	short6 := fromPeer6(remotePod6)[:50+14+39]
	return []guardCase{
		{"a peer's pod", fromPeer(remotePod), ""},
		{"a peer's node address (its host's traffic)", fromPeer(peerNode), ""},
		{"plain UDP to another port", frame(nicLocal, nicPeer, peerNode, localNode, unix.IPPROTO_UDP, 1, 53, 0, 10), ""},
		{"a host that is no peer", vxlan(in(remotePod), netip.MustParseAddr("198.51.100.7"), localNode, 1), "overlay_drop_unknown_sender"},
		{"a host that is no peer, with its own inner source", vxlan(in(netip.MustParseAddr("198.51.100.7")), netip.MustParseAddr("198.51.100.7"), localNode, 1), "overlay_drop_unknown_sender"},
		{"a peer speaking for another peer's pod", fromPeer(otherPod), "overlay_drop_inner_source"},
		{"a peer speaking for this node's pod", fromPeer(netip.MustParseAddr("10.244.1.9")), "overlay_drop_inner_source"},
		{"a peer speaking for an address outside the cluster", fromPeer(netip.MustParseAddr("203.0.113.5")), "overlay_drop_inner_source"},
		{"a peer speaking for another node's address", fromPeer(otherNode), "overlay_drop_inner_source"},
		{"a peer to this node's gateway", toDst(netip.MustParseAddr("10.244.1.1")), ""},
		{"a peer to this node (its pod's reply to our host)", toDst(localNode), ""},
		{"a peer to another node's address (a relay)", toDst(otherNode), "overlay_drop_inner_destination"},
		{"a peer to its own address (a hairpin)", toDst(peerNode), "overlay_drop_inner_destination"},
		{"a peer to another node's pod (a relay)", toDst(otherPod), "overlay_drop_inner_destination"},
		{"a peer to an address outside the cluster (a relay)", toDst(netip.MustParseAddr("203.0.113.5")), "overlay_drop_inner_destination"},
		{"another VNI", vxlan(in(remotePod), peerNode, localNode, 2), "overlay_drop_malformed"},
		{"a VLAN tag left in the data", tagged(fromPeer(remotePod)), "overlay_drop_malformed"},
		{"two VLAN tags left in the data", tagged(tagged(fromPeer(remotePod))), "overlay_drop_malformed"},
		{"to another address of this node", vxlan(in(remotePod), peerNode, netip.MustParseAddr("192.0.2.100"), 1), "overlay_drop_malformed"},
		{"a first fragment", withOuter(fromPeer(remotePod), func(ip []byte) { ip[6] |= 0x20 }), "overlay_drop_malformed"},
		{"IP options", withOptions(fromPeer(remotePod)), "overlay_drop_malformed"},
		{"an inner frame neither IPv4 nor IPv6", arp, "overlay_drop_malformed"},
		{"IPv6: a peer's pod", fromPeer6(remotePod6), ""},
		{"IPv6: a peer to this node's gateway", toDst6(localCIDR6.Addr().Next()), ""},
		{"IPv6: a host that is no peer", vxlan(in6(remotePod6, localPod6), netip.MustParseAddr("198.51.100.7"), localNode, 1), "overlay_drop_unknown_sender"},
		{"IPv6: a peer speaking for another peer's pod", fromPeer6(otherPod6), "overlay_drop_inner_source"},
		{"IPv6: a peer speaking for this node's pod", fromPeer6(localPod6), "overlay_drop_inner_source"},
		{"IPv6: a peer speaking for an address outside the cluster", fromPeer6(netip.MustParseAddr("2001:db8::5")), "overlay_drop_inner_source"},
		{"IPv6: a peer speaking for a link-local address", fromPeer6(netip.MustParseAddr("fe80::1")), "overlay_drop_inner_source"},
		{"IPv6: a peer speaking for its pod, IPv4-mapped", fromPeer6(netip.AddrFrom16(remotePod.As16())), "overlay_drop_inner_source"},
		{"IPv6: a peer speaking for its node address, IPv4-mapped", fromPeer6(netip.AddrFrom16(peerNode.As16())), "overlay_drop_inner_source"},
		{"IPv6: a peer to another node's pod (a relay)", toDst6(otherPod6), "overlay_drop_inner_destination"},
		{"IPv6: a peer to its own pod (a hairpin)", toDst6(remotePod6), "overlay_drop_inner_destination"},
		{"IPv6: a peer to an address outside the cluster (a relay)", toDst6(netip.MustParseAddr("2001:db8::5")), "overlay_drop_inner_destination"},
		{"IPv6: a peer to this node's pod, IPv4-mapped", toDst6(netip.AddrFrom16(localPod.As16())), "overlay_drop_inner_destination"},
		{"IPv6: a peer's neighbour solicitation (multicast)", toDst6(netip.MustParseAddr("ff02::1:ff00:2")), "overlay_drop_inner_destination"},
		{"IPv6: another VNI", vxlan(in6(remotePod6, localPod6), peerNode, localNode, 2), "overlay_drop_malformed"},
		{"IPv6: an inner header of version 4", version4, "overlay_drop_malformed"},
		{"IPv6: an inner header cut short", short6, "overlay_drop_malformed"},
	}
}

// The senders of a dual-stack cluster: each peer speaks for its IPv6 pod
// CIDR too.
var (
	peerSender6  = withSources(peerSender, peerCIDR6)
	otherSender6 = withSources(otherSender, otherCIDR6)
)

// Each case on a dual-stack node, and on one without an IPv6 pod CIDR
// (its peers dual-stack already), where no IPv6 frame has a destination:
// the ones a dual-stack node lets on count inner_destination, and IPv4
// frames fare as on the dual-stack node.
func TestOverlayGuardOnTheUplink(t *testing.T) {
	for _, on := range []bool{true, false} {
		for _, podCIDR6 := range []netip.Prefix{localCIDR6, {}} {
			name := map[bool]string{true: "fast path on", false: "fast path off"}[on] +
				map[bool]string{true: ", dual-stack node", false: ", node without an IPv6 pod CIDR"}[podCIDR6.IsValid()]
			t.Run(name, func(t *testing.T) {
				d := openWith(t, Options{PodCIDRv6: podCIDR6})
				established(t, d)
				testutil.Must(t, d.SyncSenders([]Sender{peerSender6, otherSender6}, false))
				testutil.Must(t, d.Configure(on))
				for _, c := range guardCases() {
					inner6 := len(c.pkt) >= 64 && binary.BigEndian.Uint16(c.pkt[62:]) == unix.ETH_P_IPV6
					if inner6 && !podCIDR6.IsValid() && c.drop == "" {
						c.drop = "overlay_drop_inner_destination"
					}
					expectGuard(t, d, d.progs.OncIngressFast, c)
				}
			})
		}
	}
}

// expectGuard runs prog on c's frame: let on, or dropped and counted
// under c.drop alone.
func expectGuard(t *testing.T, d *Datapath, prog *ebpf.Program, c guardCase) {
	t.Helper()
	before := map[string]uint64{}
	for _, n := range guardCounters {
		before[n] = stat(t, d, n)
	}
	ret, _ := run(t, prog, c.pkt, 0)
	if c.drop == "" && ret == actShot {
		t.Errorf("%s: dropped; want it let on", c.name)
	}
	if c.drop != "" && ret != actShot {
		t.Errorf("%s: verdict %d; want dropped", c.name, ret)
	}
	for _, n := range guardCounters {
		want := before[n]
		if n == c.drop {
			want++
		}
		if got := stat(t, d, n); got != want {
			t.Errorf("%s: %s went from %d to %d, want %d", c.name, n, before[n], got, want)
		}
	}
}

var guardCounters = []string{"overlay_drop_unknown_sender", "overlay_drop_inner_source", "overlay_drop_inner_destination",
	"overlay_drop_malformed", "overlay_drop_from_pod"}

// A peer that leaves is refused from its next frame on, a source it loses
// too; a later fragment is left to the kernel, which cannot reassemble it
// without the first.
func TestOverlayGuardFollowsThePeers(t *testing.T) {
	d := open(t)
	established(t, d)
	pkt := vxlan(frame(vtepLocal, vtepPeer, remotePod, localPod, unix.IPPROTO_TCP, 80, 40000, 0, 10), peerNode, localNode, 1)
	if ret, _ := run(t, d.progs.OncIngressFast, pkt, 0); ret != actRedirect {
		t.Fatalf("a learned flow from the peer: verdict %d, want redirect", ret)
	}
	narrowed := Sender{NodeIP: peerNode, Sources: []netip.Prefix{netip.MustParsePrefix("10.244.2.128/25")}}
	testutil.Must(t, d.SyncSenders([]Sender{narrowed}, false))
	if ret, _ := run(t, d.progs.OncIngressFast, pkt, 0); ret != actShot || stat(t, d, "overlay_drop_inner_source") != 1 {
		t.Fatalf("a source the peer lost: verdict %d, want dropped as inner_source", ret)
	}
	testutil.Must(t, d.SyncSenders(nil, false))
	if ret, _ := run(t, d.progs.OncIngressFast, pkt, 0); ret != actShot || stat(t, d, "overlay_drop_unknown_sender") != 1 {
		t.Fatalf("a peer that left: verdict %d, want dropped as unknown_sender", ret)
	}
	later := append([]byte{}, pkt...)
	binary.BigEndian.PutUint16(later[20:], 100) // fragment offset 800: no UDP header here
	binary.BigEndian.PutUint16(later[24:], 0)
	binary.BigEndian.PutUint16(later[24:], ipsum(later[14:34]))
	if ret, _ := run(t, d.progs.OncIngressFast, later, 0); ret == actShot {
		t.Fatal("a later fragment was dropped: the guard cannot read its port")
	}
}

// The same for IPv6 sources: a peer that lost its IPv6 pod CIDR, or that
// never had one (an IPv4-only cluster), speaks for others; one that left
// is unknown.
func TestOverlayGuardFollowsThePeersIPv6(t *testing.T) {
	d := openWith(t, Options{PodCIDRv6: localCIDR6})
	pkt := vxlan(frame6(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, 80, 40000, 10), peerNode, localNode, 1)
	for _, step := range []struct {
		senders []Sender
		c       guardCase
	}{
		{[]Sender{peerSender6}, guardCase{"a peer's IPv6 pod", pkt, ""}},
		{[]Sender{withSources(peerSender, netip.MustParsePrefix("fd00:10:244:2:8000::/65"))}, guardCase{"an IPv6 source the peer lost", pkt, "overlay_drop_inner_source"}},
		{[]Sender{peerSender}, guardCase{"a peer without IPv6 sources", pkt, "overlay_drop_inner_source"}},
		{[]Sender{peerSender6}, guardCase{"the peer's IPv6 pod CIDR back", pkt, ""}},
		{nil, guardCase{"a peer that left", pkt, "overlay_drop_unknown_sender"}},
	} {
		testutil.Must(t, d.SyncSenders(step.senders, false))
		expectGuard(t, d, d.progs.OncIngressFast, step.c)
	}
}

func TestOverlayGuardOnPods(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "fast path on", false: "fast path off"}[on], func(t *testing.T) {
			d := open(t)
			established(t, d)
			testutil.Must(t, d.Configure(on))
			toPort := func(dst netip.Addr, port uint16) []byte {
				return frame(hostMAC, podMAC, localPod, dst, unix.IPPROTO_UDP, 40000, port, 0, 60)
			}
			firstFragment := toPort(peerNode, 4789)
			firstFragment[14+6] |= 0x20
			binary.BigEndian.PutUint16(firstFragment[24:], 0)
			binary.BigEndian.PutUint16(firstFragment[24:], ipsum(firstFragment[14:34]))
			outside6 := netip.MustParseAddr("2001:db8::7")
			toPort6 := func(dst netip.Addr, port uint16, exts ...ext6) []byte {
				return frame6(hostMAC, podMAC, localPod6, dst, unix.IPPROTO_UDP, 40000, port, 60, exts...)
			}
			// Destination options alone in the first fragment: its UDP
			// header would come in the next one, at offset 8.
			leavesUDP := toPort6(outside6, 4789, fragment6(0, true), options6(unix.IPPROTO_DSTOPTS, 1))
			leavesUDP = leavesUDP[:len(leavesUDP)-8-60]
			binary.BigEndian.PutUint16(leavesUDP[14+4:], uint16(len(leavesUDP)-14-40))
			var seven []ext6
			for range 7 {
				seven = append(seven, options6(unix.IPPROTO_DSTOPTS, 1))
			}
			for _, c := range []guardCase{
				{"to a peer's VXLAN port", toPort(peerNode, 4789), "overlay_drop_from_pod"},
				{"to this node's VXLAN port", toPort(localNode, 4789), "overlay_drop_from_pod"},
				{"to a VXLAN port outside the cluster", toPort(netip.MustParseAddr("203.0.113.5"), 4789), "overlay_drop_from_pod"},
				{"a first fragment to the VXLAN port", firstFragment, "overlay_drop_from_pod"},
				{"a VLAN-tagged frame to a peer's VXLAN port", append(append(append([]byte{}, toPort(peerNode, 4789)[:12]...), 0x81, 0x00, 0, 0), toPort(peerNode, 4789)[12:]...), "overlay_drop_from_pod"},
				{"to another UDP port", toPort(peerNode, 4790), ""},
				{"TCP to port 4789", frame(hostMAC, podMAC, localPod, peerNode, unix.IPPROTO_TCP, 40000, 4789, 0, 10), ""},
				{"IPv6: to a VXLAN port outside the cluster", toPort6(outside6, 4789), "overlay_drop_from_pod"},
				{"IPv6: to a peer's pod's VXLAN port", toPort6(remotePod6, 4789), "overlay_drop_from_pod"},
				{"IPv6: a VLAN-tagged frame to a VXLAN port", append(append(append([]byte{}, toPort6(outside6, 4789)[:12]...), 0x81, 0x00, 0, 0), toPort6(outside6, 4789)[12:]...), "overlay_drop_from_pod"},
				{"IPv6: to a VXLAN port past hop-by-hop, routing and destination options", toPort6(outside6, 4789, options6(unix.IPPROTO_HOPOPTS, 1), options6(unix.IPPROTO_ROUTING, 3), options6(unix.IPPROTO_DSTOPTS, 2)), "overlay_drop_from_pod"},
				{"IPv6: to a VXLAN port past an authentication header", toPort6(outside6, 4789, ah6()), "overlay_drop_from_pod"},
				{"IPv6: to a VXLAN port past destination options longer than the guard pulls", toPort6(outside6, 4789, options6(unix.IPPROTO_DSTOPTS, 32)), "overlay_drop_from_pod"},
				{"IPv6: a first fragment to a VXLAN port", toPort6(outside6, 4789, fragment6(0, true)), "overlay_drop_from_pod"},
				{"IPv6: an atomic fragment to a VXLAN port", toPort6(outside6, 4789, fragment6(0, false)), "overlay_drop_from_pod"},
				{"IPv6: a first fragment past destination options to a VXLAN port", toPort6(outside6, 4789, options6(unix.IPPROTO_DSTOPTS, 1), fragment6(0, true), options6(unix.IPPROTO_DSTOPTS, 1)), "overlay_drop_from_pod"},
				{"IPv6: a first fragment that leaves its UDP header to a later one", leavesUDP, "overlay_drop_from_pod"},
				{"IPv6: seven extension headers, then to a VXLAN port", toPort6(outside6, 4789, seven...), "overlay_drop_from_pod"},
				{"IPv6: eight extension headers, more than the guard reads, to port 53", toPort6(outside6, 53, append(seven, options6(unix.IPPROTO_DSTOPTS, 1))...), "overlay_drop_from_pod"},
				{"IPv6: seven extension headers, then to port 53", toPort6(outside6, 53, seven...), ""},
				{"IPv6: a later fragment (no port to read)", toPort6(outside6, 4789, fragment6(8, false)), ""},
				{"IPv6: to another UDP port", toPort6(outside6, 4790), ""},
				{"IPv6: to another UDP port past extension headers and a first fragment", toPort6(outside6, 4790, options6(unix.IPPROTO_HOPOPTS, 1), fragment6(0, true)), ""},
				{"IPv6: TCP to port 4789", frame6(hostMAC, podMAC, localPod6, outside6, unix.IPPROTO_TCP, 40000, 4789, 10), ""},
				{"IPv6: ICMPv6 past destination options", frame6(hostMAC, podMAC, localPod6, outside6, unix.IPPROTO_ICMPV6, 0x12b5, 0x12b5, 10, options6(unix.IPPROTO_DSTOPTS, 1)), ""},
				{"IPv6: ESP, sealed", frame6(hostMAC, podMAC, localPod6, outside6, unix.IPPROTO_ESP, 0x12b5, 0x12b5, 40), ""},
			} {
				before := stat(t, d, "overlay_drop_from_pod")
				ret, _ := run(t, d.progs.OncEgressFast, c.pkt, 0)
				dropped := ret == actShot && stat(t, d, "overlay_drop_from_pod") == before+1
				if dropped != (c.drop != "") {
					t.Errorf("%s: verdict %d, from_pod %d -> %d; want dropped=%v", c.name, ret, before, stat(t, d, "overlay_drop_from_pod"), c.drop != "")
				}
			}
		})
	}
}

func TestSyncSendersWritesOnlyChanges(t *testing.T) {
	d := open(t)
	// An endpoint entry in each family's map and one per source: 4 for
	// peerSender.
	expectPeerWrites(t, "first sync", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender}, false) }), 4)
	expectPeerWrites(t, "same set", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender}, false) }), 0)
	expectPeerWrites(t, "a peer more", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender, otherSender}, false) }), 4)
	expectPeerWrites(t, "a peer less", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{otherSender}, false) }), 4)

	sync := func(s Sender) func() error { return func() error { return d.SyncSenders([]Sender{s}, false) } }
	expectPeerWrites(t, "an IPv6 source more", peerWrites(t, d, sync(otherSender6)), 1)
	expectPeerWrites(t, "same set", peerWrites(t, d, sync(otherSender6)), 0)
	other := bpf.NetIPv4(otherNode)
	expectSenders(t, d, map[senderKey]senderVal{
		{Prefixlen: 32, Peer: other}: {MaySend: 0},
		{Prefixlen: 32 + 24, Peer: other, Inner: bpf.NetIPv4(netip.MustParseAddr("10.244.9.0"))}: {MaySend: 1},
		{Prefixlen: 32 + 32, Peer: other, Inner: other}:                                          {MaySend: 1},
	}, map[sender6Key]senderVal{
		{Prefixlen: 32, Peer: other}:                                       {MaySend: 0},
		{Prefixlen: 32 + 64, Peer: other, Inner: otherCIDR6.Addr().As16()}: {MaySend: 1},
	})
	// Masked, as IPv4 sources are.
	moved := netip.MustParsePrefix("fd00:10:244:99::1/64")
	expectPeerWrites(t, "the IPv6 source moved", peerWrites(t, d, sync(withSources(otherSender, moved))), 2)
	expectSenders(t, d, nil, map[sender6Key]senderVal{
		{Prefixlen: 32, Peer: other}: {MaySend: 0},
		{Prefixlen: 32 + 64, Peer: other, Inner: moved.Masked().Addr().As16()}: {MaySend: 1},
	})
	expectPeerWrites(t, "the IPv6 source gone", peerWrites(t, d, sync(otherSender)), 1)
	expectSenders(t, d, nil, map[sender6Key]senderVal{{Prefixlen: 32, Peer: other}: {MaySend: 0}})
}

// expectSenders checks what the sender maps hold: onc_senders exactly
// want4 (unless nil), onc_senders6 exactly want6.
func expectSenders(t *testing.T, d *Datapath, want4 map[senderKey]senderVal, want6 map[sender6Key]senderVal) {
	t.Helper()
	if want4 != nil {
		expectMap(t, "onc_senders", func() (map[senderKey]senderVal, error) { return contents[senderKey, senderVal](d.maps.OncSenders) }, want4)
	}
	expectMap(t, "onc_senders6", func() (map[sender6Key]senderVal, error) { return contents[sender6Key, senderVal](d.maps.OncSenders6) }, want6)
}

// A sender set with one sender the guard cannot hold is refused whole,
// before anything is written: the maps keep the last set.
func TestSyncSendersRefusesWhatIsNoSender(t *testing.T) {
	d := open(t)
	testutil.Must(t, d.SyncSenders([]Sender{peerSender6, peerSenderU6}, false))
	want4, err := contents[senderKey, senderVal](d.maps.OncSenders)
	testutil.Must(t, err)
	want6, err := contents[sender6Key, senderVal](d.maps.OncSenders6)
	testutil.Must(t, err)
	wantU4, err := contents[senderU6Key, senderVal](d.maps.OncSendersU6)
	testutil.Must(t, err)
	wantU6, err := contents[sender6U6Key, senderVal](d.maps.OncSenders6U6)
	testutil.Must(t, err)
	for _, c := range []struct {
		name, want string
		bad        Sender
	}{
		{"an IPv4-mapped tunnel endpoint", "IPv4-mapped", Sender{NodeIP: netip.MustParseAddr("::ffff:192.0.2.9")}},
		{"an IPv4-mapped tunnel endpoint with sources", "IPv4-mapped", Sender{NodeIP: netip.MustParseAddr("::ffff:192.0.2.9"), Sources: []netip.Prefix{otherCIDR6}}},
		{"no tunnel endpoint", "without a tunnel endpoint", Sender{Sources: []netip.Prefix{otherCIDR6}}},
		{"a source that is no prefix", "no prefix", withSources(otherSender6, netip.Prefix{})},
		{"an IPv4-mapped source", "IPv4-mapped", withSources(otherSender, netip.MustParsePrefix("::ffff:10.244.9.0/120"))},
		{"an IPv6 endpoint with a source that is no prefix", "no prefix", withSources(otherSenderU6, netip.Prefix{})},
		{"an IPv6 endpoint with an IPv4-mapped source", "IPv4-mapped", withSources(otherSenderU6, netip.MustParsePrefix("::ffff:10.244.9.0/120"))},
	} {
		before := d.PeerWrites()
		err := d.SyncSenders([]Sender{otherSender6, otherSenderU6, c.bad}, false)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error saying %q", c.name, err, c.want)
		}
		if d.PeerWrites() != before {
			t.Errorf("%s: %d writes before the refusal", c.name, d.PeerWrites()-before)
		}
		expectSenders(t, d, want4, want6)
		expectSendersU6(t, d, wantU4, wantU6)
	}
}

// Drift in onc_senders6 (here an entry deleted behind the agent's back)
// stays until a sync that checks the kernel reads the map back and writes
// exactly the missing entry, as in every synced map.
func TestSyncSendersRepairsIPv6DriftWithCheckKernel(t *testing.T) {
	d := open(t)
	testutil.Must(t, d.SyncSenders([]Sender{peerSender6}, false))
	full, err := contents[sender6Key, senderVal](d.maps.OncSenders6)
	testutil.Must(t, err)
	lost := sender6Key{Prefixlen: 32 + 64, Peer: bpf.NetIPv4(peerNode), Inner: peerCIDR6.Addr().As16()}
	testutil.Must(t, d.maps.OncSenders6.Delete(lost))
	sync := func(checkKernel bool) func() error {
		return func() error { return d.SyncSenders([]Sender{peerSender6}, checkKernel) }
	}
	reads := d.senders6.reads
	expectPeerWrites(t, "without checkKernel", peerWrites(t, d, sync(false)), 0)
	if _, ok := full[lost]; !ok || bpftest.Entries(t, d.maps.OncSenders6) != len(full)-1 {
		t.Fatal("the drift was repaired without checkKernel, or the entry was never there")
	}
	expectPeerWrites(t, "checking the kernel", peerWrites(t, d, sync(true)), 1)
	if d.senders6.reads != reads+1 {
		t.Fatalf("%d read-backs of onc_senders6, want 1", d.senders6.reads-reads)
	}
	expectSenders(t, d, nil, full)
}

// An agent of this version on the pins of the one before, which had no
// onc_senders6: the new map is created beside the pinned ones, which are
// adopted, not replaced (the learned flow and the IPv4 senders stay). The
// first sync reads both sender maps back and writes only the new one's
// entries; from then on the guard judges IPv6 frames.
func TestUpgradeAddsTheIPv6SenderMap(t *testing.T) {
	old := openWith(t, Options{PodCIDRv6: localCIDR6})
	established(t, old)
	testutil.Must(t, old.Close())
	testutil.Must(t, os.Remove(filepath.Join(old.opts.PinDir, bpf.FastpathMapOncSenders6)))

	d, err := Open(old.opts)
	testutil.Must(t, err)
	t.Cleanup(func() { d.Close() })
	if flows, err := d.Flows(); err != nil || len(flows) != 1 {
		t.Fatalf("flows %v (%v) after the upgrade, want the learned one adopted", flows, err)
	}
	if n4, n6 := bpftest.Entries(t, d.maps.OncSenders), bpftest.Entries(t, d.maps.OncSenders6); n4 != 3 || n6 != 0 {
		t.Fatalf("%d IPv4 and %d IPv6 sender entries after the upgrade, want the 3 pinned and none", n4, n6)
	}
	reads4, reads6 := d.senders.reads, d.senders6.reads
	expectPeerWrites(t, "first sync", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender6}, false) }), 2)
	if d.senders.reads != reads4+1 || d.senders6.reads != reads6+1 {
		t.Fatal("the first sync did not read both sender maps back")
	}
	pkt := vxlan(frame6(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, 80, 40000, 10), peerNode, localNode, 1)
	expectGuard(t, d, d.progs.OncIngressFast, guardCase{"a peer's IPv6 pod after the upgrade", pkt, ""})
}

// The programs read an all-zero IPv6 mask as no IPv6 pod CIDR: Open
// refuses one that would look the same or is not IPv6.
func TestOpenRefusesAnIPv6PodCIDRTheGuardCannotHold(t *testing.T) {
	testutil.Privileged(t)
	for _, cidr := range []string{"::/0", "::ffff:10.244.1.0/120", "10.244.1.0/24"} {
		dir := t.TempDir()
		d, err := Open(Options{PinDir: dir, VNI: 1, Port: 4789, Mark: mark, NodeIP: localNode, PodCIDR: localCIDR, PodCIDRv6: netip.MustParsePrefix(cidr)})
		if err == nil {
			d.Close()
			t.Errorf("IPv6 pod CIDR %s accepted", cidr)
		}
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	}
}
