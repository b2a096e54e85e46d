//go:build privileged

package fastpath

// BPF_PROG_RUN tests of the fast path over an IPv6 underlay
// (datapath/bpf/include/encap6.h): IPv6 pods' flows in IPv6 tunnels, in
// the maps keyed by the peers' IPv6 endpoints; IPv4 pods' flows on the
// slow path there.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// openFastU6 is openU6 with the fast path on.
func openFastU6(t *testing.T, podCIDR netip.Prefix) *Datapath {
	d := openU6(t, podCIDR)
	testutil.Must(t, d.Configure(true))
	return d
}

// sentU6 is pkt (a pod's frame) as the kernel's VXLAN device sends it
// from this node to node over the IPv6 underlay: our NIC to the peer's.
func sentU6(pkt []byte, node netip.Addr) []byte {
	b := vxlan6(pkt, localNode6, node, 1)
	copy(b[0:6], nicPeer)
	copy(b[6:12], nicLocal)
	return b
}

// headerU6 is the header learned for peerNode6, left by ifindex 7.
func headerU6() Encap6Val {
	e := Encap6Val{Ifindex: 7}
	copy(e.Hdr[:], sentU6(frame(vtepPeer, vtepLocal, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0, 0), peerNode6))
	return e
}

// establishedU6 fills the maps as learning would for [localPod6]:40000
// <-> [remotePod6]:80 over the IPv6 underlay, with peerNode6 a fast-path
// peer of both its pod CIDRs.
func establishedU6(t *testing.T, d *Datapath) {
	t.Helper()
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode6}, {PodCIDR: peerCIDR6, NodeIP: peerNode6}}, false))
	testutil.Must(t, d.SyncSenders([]Sender{peerSenderU6}, false))
	testutil.Must(t, d.SetLocalPod(localPod6, loIndex, podMAC, hostMAC))
	testutil.Must(t, d.maps.OncFilter6.Put(flowKey6(localPod6, remotePod6, 40000, 80, unix.IPPROTO_TCP), FlowVal{Egress: 1, Ingress: 1}))
	testutil.Must(t, d.maps.OncEgress6U6.Put(addr6{Addr: remotePod6.As16()}, addr6{Addr: peerNode6.As16()}))
	testutil.Must(t, d.maps.OncEncapU6.Put(addr6{Addr: peerNode6.As16()}, headerU6()))
}

func TestEgressOverAnIPv6UnderlayEncapsulates(t *testing.T) {
	d := openFastU6(t, netip.Prefix{})
	establishedU6(t, d)
	pkt := frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0, 100)
	pkt[15] |= 3 << 4 // ECN CE
	ret, out := run(t, d.progs.OncEgressFast, pkt, 0)
	if ret != actRedirect || stat6(t, d, "egress_hit") != 1 {
		t.Fatalf("verdict %d, IPv6 hits %d; want redirect and one hit", ret, stat6(t, d, "egress_hit"))
	}
	if len(out) != len(pkt)+70 {
		t.Fatalf("encapsulated length %d, want %d", len(out), len(pkt)+70)
	}
	if net.HardwareAddr(out[0:6]).String() != nicPeer.String() || binary.BigEndian.Uint16(out[12:]) != 0x86dd {
		t.Fatalf("outer Ethernet header %x: want the learned next hop and IPv6's type", out[0:14])
	}
	oip, udp := out[14:54], out[54:62]
	if oip[6] != unix.IPPROTO_UDP || netip.AddrFrom16([16]byte(oip[8:24])) != localNode6 || netip.AddrFrom16([16]byte(oip[24:40])) != peerNode6 {
		t.Fatalf("outer IPv6 header %x: want UDP from this node's endpoint to the peer's", oip)
	}
	if got := int(binary.BigEndian.Uint16(oip[4:])); got != len(out)-54 {
		t.Fatalf("outer payload length %d, want %d", got, len(out)-54)
	}
	if tclass := oip[0]<<4 | oip[1]>>4; tclass&3 != 2 { // CE is sent as ECT(0), as over IPv4
		t.Errorf("outer ECN %d, want 2 from the inner traffic class", tclass&3)
	}
	if oip[1]&0x0f != 0 || oip[2] != 0 || oip[3] != 0 {
		t.Errorf("outer flow label %x, want 0", oip[1:4])
	}
	sport := binary.BigEndian.Uint16(udp[0:])
	if sport < 49152 || binary.BigEndian.Uint16(udp[2:]) != 4789 || int(binary.BigEndian.Uint16(udp[4:])) != len(out)-54 || binary.BigEndian.Uint16(udp[6:]) != 0 {
		t.Fatalf("outer UDP header %x: want a source port from 49152, port 4789, the length and a zero checksum", udp)
	}
	if out[62] != 0x08 || binary.BigEndian.Uint32(out[66:]) != 1<<8 {
		t.Fatalf("VXLAN header %x, want VNI 1", out[62:70])
	}
	if net.HardwareAddr(out[70:76]).String() != vtepPeer.String() || binary.BigEndian.Uint16(out[82:]) != 0x86dd {
		t.Fatalf("inner Ethernet header %x: want the peer's VTEP MAC and IPv6's type", out[70:84])
	}
	if inner := out[84:124]; inner[7] != 63 || netip.AddrFrom16([16]byte(inner[24:40])) != remotePod6 {
		t.Fatalf("inner hop limit %d (want 63) or destination %x", inner[7], inner[24:40])
	}
}

// Each check of the IPv4 underlay's path holds over IPv6 too, and an IPv4
// pod's packet finds no fast-path peer there.
func TestEgressOverAnIPv6UnderlayMissReasons(t *testing.T) {
	d := openFastU6(t, localCIDR)
	establishedU6(t, d)
	pkt := func() []byte {
		return frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0, 10)
	}
	expectMiss := func(what, counter string, pkt []byte) {
		t.Helper()
		before := stat6(t, d, counter)
		if ret, out := run(t, d.progs.OncEgressFast, pkt, 0); ret != actOK || string(out) != string(pkt) {
			t.Fatalf("%s: verdict %d, changed %v; want the packet to the slow path as it is", what, ret, string(out) != string(pkt))
		}
		if stat6(t, d, counter) != before+1 {
			t.Fatalf("%s: not counted as %s", what, counter)
		}
	}
	testutil.Must(t, d.maps.OncEgress6U6.Put(addr6{Addr: remotePod6.As16()}, addr6{Addr: otherNode6.As16()}))
	expectMiss("destination learned behind another node", "egress_miss_dest", pkt())
	testutil.Must(t, d.maps.OncEgress6U6.Put(addr6{Addr: remotePod6.As16()}, addr6{Addr: peerNode6.As16()}))
	last := pkt()
	last[14+7] = 1
	expectMiss("hop limit 1", "egress_miss_ttl", last)
	testutil.Must(t, d.maps.OncEncapU6.Delete(addr6{Addr: peerNode6.As16()}))
	expectMiss("no learned header", "egress_miss_encap", pkt())
	expectMiss("to a pod of no fast-path peer", "egress_miss_no_peer", frame(hostMAC, podMAC, localPod6, otherPod6, unix.IPPROTO_TCP, 40000, 80, 0, 10))

	testutil.Must(t, d.SetLocalPod(localPod, loIndex, podMAC, hostMAC))
	v4 := frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 10)
	if ret, _ := run(t, d.progs.OncEgressFast, v4, 0); ret != actOK || stat(t, d, "egress_miss_no_peer") != 1 {
		t.Fatalf("an IPv4 pod's packet over an IPv6 underlay: verdict %d, no_peer %d; want the slow path", ret, stat(t, d, "egress_miss_no_peer"))
	}
}

func TestIngressOverAnIPv6UnderlayDecapsulates(t *testing.T) {
	d := openFastU6(t, netip.Prefix{})
	establishedU6(t, d)
	inner := frame(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, 80, 40000, 0, 100)
	ret, out := run(t, d.progs.OncIngressFast, vxlan6(inner, peerNode6, localNode6, 1), 0)
	if ret != actRedirect || stat6(t, d, "ingress_hit") != 1 {
		t.Fatalf("verdict %d, IPv6 hits %d; want redirect and one hit", ret, stat6(t, d, "ingress_hit"))
	}
	if len(out) != len(inner) {
		t.Fatalf("decapsulated length %d, want %d", len(out), len(inner))
	}
	if net.HardwareAddr(out[0:6]).String() != podMAC.String() || net.HardwareAddr(out[6:12]).String() != hostMAC.String() || binary.BigEndian.Uint16(out[12:]) != 0x86dd {
		t.Fatalf("Ethernet header %x, want the pod's and host veth's MACs and IPv6's type", out[0:14])
	}
	if out[14+7] != 63 || string(out[14+8:]) != string(inner[14+8:]) {
		t.Fatalf("inner packet changed beyond its hop limit (%d, want 63)", out[14+7])
	}
}

// A frame the guard lets on goes to the pod only from the node the fast
// path's peers say owns its source: another sender allowed for the
// source (a CIDR that moved, while the two syncs catch up) and a peer
// that left the fast path get the slow path.
func TestIngressOverAnIPv6UnderlayNeedsTheOwner(t *testing.T) {
	d := openFastU6(t, netip.Prefix{})
	establishedU6(t, d)
	moved := Sender{NodeIP: otherNode6, Sources: []netip.Prefix{peerCIDR6, netip.PrefixFrom(otherNode6, 128)}}
	testutil.Must(t, d.SyncSenders([]Sender{peerSenderU6, moved}, false))
	inner := frame(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, 80, 40000, 0, 100)
	for _, c := range []struct {
		what string
		from netip.Addr
		sync []Peer
	}{
		{"from another node than the owner", otherNode6, []Peer{{PodCIDR: peerCIDR6, NodeIP: peerNode6}}},
		{"from a peer off the fast path", peerNode6, nil},
	} {
		testutil.Must(t, d.SyncPeers(c.sync, false))
		before := stat6(t, d, "ingress_miss_no_peer")
		in := vxlan6(inner, c.from, localNode6, 1)
		if ret, out := run(t, d.progs.OncIngressFast, in, 0); ret != actOK || string(out) != string(in) {
			t.Fatalf("%s: verdict %d, changed %v; want it left to the kernel as it is", c.what, ret, string(out) != string(in))
		}
		if stat6(t, d, "ingress_miss_no_peer") != before+1 {
			t.Fatalf("%s: not counted as no_peer", c.what)
		}
	}
}

// The kernel's frames teach the IPv6 maps: the header as a template (what
// varies per packet zeroed), the destination's node and the flow; a frame
// that differs only per packet writes nothing; one to a node that does not
// own the destination teaches nothing.
func TestLearningOverAnIPv6Underlay(t *testing.T) {
	d := openFastU6(t, netip.Prefix{})
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR6, NodeIP: peerNode6}}, false))
	testutil.Must(t, d.SetLocalPod(localPod6, loIndex, podMAC, hostMAC))
	sent := func(sport uint16, label byte, node netip.Addr) []byte {
		b := sentU6(frame(vtepPeer, vtepLocal, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0, 100), node)
		b[15] |= 0x20 | label>>4 // ECT(0) and a flow label, which the kernel may set
		b[16] = label
		binary.BigEndian.PutUint16(b[54:], sport)
		binary.BigEndian.PutUint16(b[60:], 0xbeef) // the checksum the kernel computed
		return b
	}
	if ret, _ := run(t, d.progs.OncLearnEgress, sent(50000, 0x12, otherNode6), mark); ret != actOK || bpftest.Entries(t, d.maps.OncEncapU6) != 0 {
		t.Fatal("a frame to a node that does not own the destination taught a header")
	}
	if ret, _ := run(t, d.progs.OncLearnEgress, sent(50000, 0x12, peerNode6), mark); ret != actOK || stat6(t, d, "learn_egress") != 1 {
		t.Fatalf("verdict %d, learned %d; want one frame learned", ret, stat6(t, d, "learn_egress"))
	}
	var e Encap6Val
	testutil.Must(t, d.maps.OncEncapU6.Lookup(addr6{Addr: peerNode6.As16()}, &e))
	h := e.Hdr[:]
	if h[15]&0x3f != 0 || h[16] != 0 || h[17] != 0 || binary.BigEndian.Uint16(h[18:]) != 0 ||
		binary.BigEndian.Uint16(h[54:]) != 0 || binary.BigEndian.Uint32(h[58:]) != 0 {
		t.Fatalf("learned header %x: ECN, flow label, lengths, source port and checksum must be zero", h)
	}
	encaps, err := d.Encaps()
	testutil.Must(t, err)
	if len(encaps) != 1 || encaps[0].Node != peerNode6 || encaps[0].OuterSrcIP != localNode6 || encaps[0].OuterDstIP != peerNode6 ||
		encaps[0].OuterDst.String() != nicPeer.String() || encaps[0].InnerDst.String() != vtepPeer.String() {
		t.Fatalf("headers %+v, want one to %s as sent", encaps, peerNode6)
	}
	dests, err := d.Dests()
	testutil.Must(t, err)
	if len(dests) != 1 || dests[0] != (Dest{Pod: remotePod6, Node: peerNode6}) {
		t.Fatalf("destinations %+v, want %s behind %s", dests, remotePod6, peerNode6)
	}
	var flow FlowVal
	testutil.Must(t, d.maps.OncFilter6.Lookup(flowKey6(localPod6, remotePod6, 40000, 80, unix.IPPROTO_TCP), &flow))
	if flow.Egress != 1 {
		t.Fatal("the flow's egress direction was not learned")
	}
	if run(t, d.progs.OncLearnEgress, sent(61000, 0x34, peerNode6), mark); stat6(t, d, "learn_known") != 1 || stat6(t, d, "learn_egress") != 1 {
		t.Fatal("a frame differing only per packet wrote to the maps")
	}
}

// What the agent's evictions do to the IPv6 underlay's maps: a stale
// header goes, a peer that leaves takes its header and destinations with
// it, and a flush empties them. SyncPeers refuses an IPv4 endpoint there.
func TestEvictionsOverAnIPv6Underlay(t *testing.T) {
	d := openFastU6(t, localCIDR)
	establishedU6(t, d)
	if n := bpftest.Entries(t, d.maps.OncPeers) + bpftest.Entries(t, d.maps.OncPeers6); n != 0 {
		t.Fatalf("%d entries in the IPv4 endpoints' peer maps, want none (the IPv4 CIDR takes the slow path)", n)
	}
	evicted, err := d.EvictEncaps(func(e Encap) bool { return e.Node == peerNode6 && e.Ifindex == 7 })
	if err != nil || evicted != 1 || bpftest.Entries(t, d.maps.OncEncapU6) != 0 {
		t.Fatalf("evicted %d (%v), %d left; want the stale header gone", evicted, err, bpftest.Entries(t, d.maps.OncEncapU6))
	}
	testutil.Must(t, d.maps.OncEncapU6.Put(addr6{Addr: peerNode6.As16()}, headerU6()))
	testutil.Must(t, d.SyncPeers(nil, false))
	for name, m := range map[string]int{"headers": bpftest.Entries(t, d.maps.OncEncapU6), "destinations": bpftest.Entries(t, d.maps.OncEgress6U6),
		"flows": bpftest.Entries(t, d.maps.OncFilter6), "peers": bpftest.Entries(t, d.maps.OncPeers6U6)} {
		if m != 0 {
			t.Errorf("%d %s left after the peer left", m, name)
		}
	}
	// A CIDR whose endpoint changed (its node re-addressed): the old
	// endpoint's header and destinations go, the new one is the peer.
	establishedU6(t, d)
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR6, NodeIP: otherNode6}}, false))
	var now addr6
	testutil.Must(t, d.maps.OncPeers6U6.Lookup(cidr6Key{Prefixlen: 64, Addr: peerCIDR6.Addr().As16()}, &now))
	if netip.AddrFrom16(now.Addr) != otherNode6 || bpftest.Entries(t, d.maps.OncEncapU6)+bpftest.Entries(t, d.maps.OncEgress6U6) != 0 {
		t.Fatalf("after the endpoint changed: peer %s, %d headers and destinations left", netip.AddrFrom16(now.Addr), bpftest.Entries(t, d.maps.OncEncapU6)+bpftest.Entries(t, d.maps.OncEgress6U6))
	}
	establishedU6(t, d)
	testutil.Must(t, d.Flush())
	if n := bpftest.Entries(t, d.maps.OncEncapU6) + bpftest.Entries(t, d.maps.OncEgress6U6); n != 0 {
		t.Fatalf("%d entries left after a flush", n)
	}
	before := d.PeerWrites()
	err = d.SyncPeers([]Peer{{PodCIDR: otherCIDR6, NodeIP: otherNode6}, {PodCIDR: peerCIDR6, NodeIP: peerNode}}, false)
	if err == nil || !strings.Contains(err.Error(), "not of the underlay's family") || d.PeerWrites() != before {
		t.Fatalf("a peer at an IPv4 endpoint on an IPv6 underlay: %v after %d writes, want refused before any", err, d.PeerWrites()-before)
	}
}

// IPv4 pods' flows over an IPv6 underlay take the slow path, fast path
// on: a frame of theirs is left to the kernel unchanged (the guard's
// verdict stands), and none teaches any map.
func TestIPv4PodsOverAnIPv6UnderlayTakeTheSlowPath(t *testing.T) {
	d := openFastU6(t, localCIDR)
	establishedU6(t, d)
	testutil.Must(t, d.SetLocalPod(localPod, loIndex, podMAC, hostMAC))
	testutil.Must(t, d.maps.OncFilter.Put(FlowKey{LocalIp: bpf.NetIPv4(localPod), RemoteIp: bpf.NetIPv4(remotePod), LocalPort: bpf.NetPort(uint16(40000)),
		RemotePort: bpf.NetPort(uint16(80)), Proto: unix.IPPROTO_TCP}, FlowVal{Egress: 1, Ingress: 1}))
	in := vxlan6(frame(vtepLocal, vtepPeer, remotePod, localPod, unix.IPPROTO_TCP, 80, 40000, 0, 100), peerNode6, localNode6, 1)
	ret, out := run(t, d.progs.OncIngressFast, in, 0)
	if ret != actOK || string(out) != string(in) || stat(t, d, "ingress_miss_not_vxlan") != 1 {
		t.Fatalf("an IPv4 pod's frame over IPv6: verdict %d, changed %v, not_vxlan %d; want it left to the kernel", ret, string(out) != string(in), stat(t, d, "ingress_miss_not_vxlan"))
	}
	testutil.Must(t, d.Flush())
	testutil.Must(t, d.Configure(true))
	if ret, _ := run(t, d.progs.OncLearnEgress, sentU6(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 100), peerNode6), mark); ret != actOK {
		t.Fatalf("learning an IPv4 pod's frame over IPv6: verdict %d", ret)
	}
	for name, m := range map[string]int{"onc_encap": bpftest.Entries(t, d.maps.OncEncap), "onc_encap_u6": bpftest.Entries(t, d.maps.OncEncapU6),
		"onc_egress": bpftest.Entries(t, d.maps.OncEgress), "onc_filter": bpftest.Entries(t, d.maps.OncFilter)} {
		if m != 0 {
			t.Errorf("%d entries learned into %s from an IPv4 pod's frame over IPv6", m, name)
		}
	}
}
