//go:build privileged

package fastpath

// The overlay guard (datapath/bpf/include/overlay.h), run on crafted frames
// with BPF_PROG_RUN against real maps: what it lets on, what it drops, and
// the counter each drop lands in, with the fast path on and off.

import (
	"encoding/binary"
	"net/netip"
	"testing"

	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

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
		{"an inner frame that is not IPv4", arp, "overlay_drop_malformed"},
	}
}

func TestOverlayGuardOnTheUplink(t *testing.T) {
	for _, on := range []bool{true, false} {
		t.Run(map[bool]string{true: "fast path on", false: "fast path off"}[on], func(t *testing.T) {
			d := open(t)
			established(t, d)
			testutil.Must(t, d.SyncSenders([]Sender{peerSender, otherSender}, false))
			testutil.Must(t, d.Configure(on))
			for _, c := range guardCases() {
				before := map[string]uint64{}
				for _, n := range guardCounters {
					before[n] = stat(t, d, n)
				}
				ret, _ := run(t, d.progs.OncIngressFast, c.pkt, 0)
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
		})
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
			for _, c := range []guardCase{
				{"to a peer's VXLAN port", toPort(peerNode, 4789), "overlay_drop_from_pod"},
				{"to this node's VXLAN port", toPort(localNode, 4789), "overlay_drop_from_pod"},
				{"to a VXLAN port outside the cluster", toPort(netip.MustParseAddr("203.0.113.5"), 4789), "overlay_drop_from_pod"},
				{"a first fragment to the VXLAN port", firstFragment, "overlay_drop_from_pod"},
				{"a VLAN-tagged frame to a peer's VXLAN port", append(append(append([]byte{}, toPort(peerNode, 4789)[:12]...), 0x81, 0x00, 0, 0), toPort(peerNode, 4789)[12:]...), "overlay_drop_from_pod"},
				{"to another UDP port", toPort(peerNode, 4790), ""},
				{"TCP to port 4789", frame(hostMAC, podMAC, localPod, peerNode, unix.IPPROTO_TCP, 40000, 4789, 0, 10), ""},
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
	// An endpoint entry and one per source: 3 for peerSender.
	expectPeerWrites(t, "first sync", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender}, false) }), 3)
	expectPeerWrites(t, "same set", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender}, false) }), 0)
	expectPeerWrites(t, "a peer more", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{peerSender, otherSender}, false) }), 3)
	expectPeerWrites(t, "a peer less", peerWrites(t, d, func() error { return d.SyncSenders([]Sender{otherSender}, false) }), 3)
	if err := d.SyncSenders([]Sender{{NodeIP: netip.MustParseAddr("2001:db8::1")}}, false); err == nil {
		t.Fatal("an IPv6 tunnel endpoint was accepted")
	}
}
