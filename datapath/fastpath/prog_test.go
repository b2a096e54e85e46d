//go:build privileged

package fastpath

// BPF_PROG_RUN tests: each program runs on crafted packets against real
// maps; the verdict, the packet it leaves and the counters are checked.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

const (
	actOK       = 0
	actShot     = 2
	actRedirect = 7
	mark        = 0x40000
	// BPF_PROG_RUN runs a tc program on a packet "received" on loopback,
	// so the local pod's veth is ifindex 1 in these tests.
	loIndex = 1
)

var (
	localPod  = netip.MustParseAddr("10.244.1.2")
	remotePod = netip.MustParseAddr("10.244.2.3")
	localNode = netip.MustParseAddr("192.0.2.1")
	peerNode  = netip.MustParseAddr("192.0.2.2")
	otherNode = netip.MustParseAddr("192.0.2.9")
	otherPod  = netip.MustParseAddr("10.244.9.3")
	peerCIDR  = netip.MustParsePrefix("10.244.2.0/24")
	localCIDR = netip.MustParsePrefix("10.244.1.0/24")
	// peerSender is what the control plane lets peerNode speak for.
	peerSender = Sender{NodeIP: peerNode, Sources: []netip.Prefix{peerCIDR, netip.PrefixFrom(peerNode, 32)}}
	// otherSender is a peer whose agent runs no fast path.
	otherSender = Sender{NodeIP: otherNode, Sources: []netip.Prefix{netip.MustParsePrefix("10.244.9.0/24"), netip.PrefixFrom(otherNode, 32)}}
	podMAC      = net.HardwareAddr{2, 0, 0, 0, 1, 2}
	hostMAC     = net.HardwareAddr{2, 0, 0, 0, 1, 1}
	vtepLocal   = net.HardwareAddr{2, 0, 0, 0, 0xa, 1}
	vtepPeer    = net.HardwareAddr{2, 0, 0, 0, 0xa, 2}
	nicLocal    = bpftest.NICLocal
	nicPeer     = bpftest.NICPeer
)

func open(t *testing.T) *Datapath { return openMode(t, ModeAuto) }

// openMode loads the datapath on a private bpffs mounted on a temporary dir.
func openMode(t *testing.T, mode Mode) *Datapath {
	return openWith(t, Options{Mode: mode})
}

// openWith is openMode with o's switches; the settings the tests' packets
// assume are filled in.
func openWith(t *testing.T, o Options) *Datapath {
	testutil.Privileged(t)
	dir := t.TempDir()
	o.PinDir, o.VNI, o.Port, o.Mark, o.NodeIP, o.PodCIDR = dir, 1, 4789, mark, localNode, localCIDR
	d, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		d.Close()
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	if err := d.Configure(true); err != nil {
		t.Fatal(err)
	}
	return d
}

// The packet builders and BPF_PROG_RUN, shared with the services tests.
var (
	frame = bpftest.Frame
	vxlan = bpftest.VXLAN
	ipsum = bpftest.IPChecksum
	run   = bpftest.Run
)

func stat(t *testing.T, d *Datapath, name string) uint64 { return bpftest.Counter(t, d.Stats, name) }

// established fills the maps as learning would for localPod:40000 <-> remotePod:80.
// told is what OnEvict told, each eviction printed.
type told []string

// telling has d tell its evictions from now on.
func telling(d *Datapath) *told {
	var evictions told
	d.OnEvict(func(e Eviction) { evictions = append(evictions, fmt.Sprint(e)) })
	return &evictions
}

// is checks that OnEvict told of the one flow established has, for why,
// and forgets it.
func (told *told) is(t *testing.T, why EvictReason) {
	t.Helper()
	want := fmt.Sprint(Eviction{netip.AddrPortFrom(localPod, 40000), netip.AddrPortFrom(remotePod, 80), unix.IPPROTO_TCP, why})
	if len(*told) != 1 || (*told)[0] != want {
		t.Fatalf("OnEvict told of %q, want %q", *told, want)
	}
	*told = nil
}

func established(t *testing.T, d *Datapath) {
	t.Helper()
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}, false))
	testutil.Must(t, d.SyncSenders([]Sender{peerSender}, false))
	testutil.Must(t, d.SetLocalPod(localPod, loIndex, podMAC, hostMAC))
	key := FlowKey{LocalIp: bpf.NetIPv4(localPod), RemoteIp: bpf.NetIPv4(remotePod), LocalPort: bpf.NetPort(uint16(40000)), RemotePort: bpf.NetPort(uint16(80)), Proto: unix.IPPROTO_TCP}
	testutil.Must(t, d.maps.OncFilter.Put(key, FlowVal{Egress: 1, Ingress: 1}))
	testutil.Must(t, d.maps.OncEgress.Put(bpf.NetIPv4(remotePod), EgressVal{NodeIp: bpf.NetIPv4(peerNode)}))
	var e EncapVal
	copy(e.Hdr[:], vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 0), localNode, peerNode, 1)[:64])
	// The learned header is what the kernel sent: our NIC to the peer's.
	copy(e.Hdr[0:6], nicPeer)
	copy(e.Hdr[6:12], nicLocal)
	e.Ifindex = 7
	testutil.Must(t, d.maps.OncEncap.Put(bpf.NetIPv4(peerNode), e))
}

func TestEgressFastPathHitEncapsulates(t *testing.T) {
	d := open(t)
	established(t, d)
	pkt := frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 100)
	ret, out := run(t, d.progs.OncEgressFast, pkt, 0)
	if ret != actRedirect || stat(t, d, "egress_hit") != 1 {
		t.Fatalf("verdict %d, hits %d; want redirect and one hit", ret, stat(t, d, "egress_hit"))
	}
	if len(out) != len(pkt)+50 {
		t.Fatalf("encapsulated length %d, want %d", len(out), len(pkt)+50)
	}
	oip := out[14:34]
	if netip.AddrFrom4([4]byte(oip[16:20])) != peerNode || netip.AddrFrom4([4]byte(oip[12:16])) != localNode {
		t.Fatalf("outer IPs %v -> %v", oip[12:16], oip[16:20])
	}
	if int(binary.BigEndian.Uint16(oip[2:])) != len(out)-14 || binary.BigEndian.Uint16(oip[10:]) != ipsum(oip) {
		t.Fatal("outer IP length or checksum wrong")
	}
	udp := out[34:42]
	if sp := binary.BigEndian.Uint16(udp[0:]); sp < 49152 {
		t.Fatalf("outer UDP source port %d not from the flow-hash range", sp)
	}
	if binary.BigEndian.Uint16(udp[2:]) != 4789 || int(binary.BigEndian.Uint16(udp[4:])) != len(out)-34 || binary.BigEndian.Uint16(udp[6:]) != 0 {
		t.Fatalf("outer UDP header %x", udp)
	}
	if net.HardwareAddr(out[50:56]).String() != vtepPeer.String() || net.HardwareAddr(out[56:62]).String() != vtepLocal.String() {
		t.Fatal("inner MACs are not the VTEP MACs the slow path uses")
	}
	inner := out[64:84]
	if inner[8] != 63 || binary.BigEndian.Uint16(inner[10:]) != ipsum(inner) {
		t.Fatalf("inner TTL %d (want 63) or checksum wrong", inner[8])
	}
}

// The outer ECN follows each inner packet, as the kernel's VXLAN device
// sets it: not the ECN of whatever packet the header was learned from.
func TestEgressOuterECN(t *testing.T) {
	d := open(t)
	established(t, d)
	for _, c := range []struct{ inner, outer byte }{{0, 0}, {1, 1}, {2, 2}, {3, 2}} { // CE is sent as ECT(0)
		pkt := frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 100)
		pkt[15] = 0x20 | c.inner // DSCP kept, ECN varied
		binary.BigEndian.PutUint16(pkt[24:], 0)
		binary.BigEndian.PutUint16(pkt[24:], ipsum(pkt[14:34]))
		ret, out := run(t, d.progs.OncEgressFast, pkt, 0)
		if ret != actRedirect {
			t.Fatalf("inner ECN %d: verdict %d", c.inner, ret)
		}
		if got := out[15] & 3; got != c.outer || binary.BigEndian.Uint16(out[24:]) != ipsum(out[14:34]) {
			t.Errorf("inner ECN %d: outer ECN %d (want %d) or outer checksum wrong", c.inner, got, c.outer)
		}
	}
}

func TestEgressMissReasons(t *testing.T) {
	d := open(t)
	established(t, d)
	flow := func(src, dst netip.Addr, flags byte) []byte {
		return frame(hostMAC, podMAC, src, dst, unix.IPPROTO_TCP, 40000, 80, flags, 10)
	}
	arp := flow(localPod, remotePod, 0)
	binary.BigEndian.PutUint16(arp[12:], 0x0806)
	cases := []struct {
		name, counter string
		pkt           []byte
		setup         func()
	}{
		{"ARP", "egress_miss_not_ip", arp, nil},
		// Another connection's SYN: one on the established flow's ports
		// would forget it (TestSYNForgetsTheCachedFlow).
		{"SYN", "egress_miss_tcp_flags", frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40002, 80, 0x02, 10), nil},
		{"FIN", "egress_miss_tcp_flags", flow(localPod, remotePod, 0x01), nil},
		{"RST", "egress_miss_tcp_flags", flow(localPod, remotePod, 0x04), nil},
		{"to a node address (onc_hosts)", "egress_miss_host", flow(localPod, netip.MustParseAddr("10.244.2.1"), 0),
			func() { testutil.Must(t, d.SetHosts([]netip.Addr{netip.MustParseAddr("10.244.2.1")}, false)) }},
		{"not a fast-path peer", "egress_miss_no_peer", flow(localPod, netip.MustParseAddr("10.244.9.9"), 0), nil},
		{"unlearned flow", "egress_miss_flow", frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40001, 80, 0, 10), nil},
		{"stale destination (CIDR moved to another node)", "egress_miss_dest", flow(localPod, remotePod, 0),
			func() {
				testutil.Must(t, d.maps.OncPeers.Put(cidrKey{Prefixlen: 24, Addr: bpf.NetIPv4(peerCIDR.Addr())}, cidrVal{NodeIp: bpf.NetIPv4(otherNode)}))
			}},
		{"an address no local pod has", "egress_miss_spoof", flow(netip.MustParseAddr("10.244.1.10"), remotePod, 0), nil},
		// An established flow, sent from another veth than its pod's.
		{"another pod's address (spoofed)", "egress_miss_spoof", flow(localPod, remotePod, 0),
			func() { testutil.Must(t, d.SetLocalPod(localPod, 99, podMAC, hostMAC)) }},
		{"disabled", "egress_miss_disabled", flow(localPod, remotePod, 0), func() {
			testutil.Must(t, d.SetLocalPod(localPod, loIndex, podMAC, hostMAC))
			testutil.Must(t, d.Configure(false))
		}},
	}
	for _, c := range cases {
		if c.setup != nil {
			c.setup()
		}
		before := stat(t, d, c.counter)
		if ret, out := run(t, d.progs.OncEgressFast, c.pkt, 0); ret != actOK || len(out) != len(c.pkt) {
			t.Errorf("%s: verdict %d, len %d; want pass-through unchanged", c.name, ret, len(out))
		}
		if stat(t, d, c.counter) != before+1 {
			t.Errorf("%s: counter %s did not count it", c.name, c.counter)
		}
	}
	if stat(t, d, "egress_hit") != 0 {
		t.Fatal("a miss case took the fast path")
	}
}

func TestIngressFastPathHitDecapsulates(t *testing.T) {
	d := open(t)
	established(t, d)
	inner := frame(vtepLocal, vtepPeer, remotePod, localPod, unix.IPPROTO_TCP, 80, 40000, 0, 100)
	ret, out := run(t, d.progs.OncIngressFast, vxlan(inner, peerNode, localNode, 1), 0)
	if ret != actRedirect || stat(t, d, "ingress_hit") != 1 {
		t.Fatalf("verdict %d; want redirect (hits %d)", ret, stat(t, d, "ingress_hit"))
	}
	if len(out) != len(inner) {
		t.Fatalf("decapsulated length %d, want %d", len(out), len(inner))
	}
	if net.HardwareAddr(out[0:6]).String() != podMAC.String() || net.HardwareAddr(out[6:12]).String() != hostMAC.String() {
		t.Fatalf("MACs %x, want pod's and host veth's", out[0:12])
	}
	if out[14+8] != 63 || binary.BigEndian.Uint16(out[24:]) != ipsum(out[14:34]) {
		t.Fatal("inner TTL not decremented or checksum wrong")
	}
}

func TestIngressMissReasons(t *testing.T) {
	d := open(t)
	established(t, d)
	testutil.Must(t, d.SetHosts([]netip.Addr{netip.MustParseAddr("10.244.2.1")}, false))
	testutil.Must(t, d.SyncSenders([]Sender{peerSender, otherSender}, false))
	in := func(src, dst netip.Addr, flags byte) []byte {
		return frame(vtepLocal, vtepPeer, src, dst, unix.IPPROTO_TCP, 80, 40000, flags, 10)
	}
	cases := []struct {
		name, counter string
		pkt           []byte
	}{
		{"plain UDP", "ingress_miss_not_vxlan", frame(nicLocal, nicPeer, peerNode, localNode, unix.IPPROTO_UDP, 1, 53, 0, 10)},
		{"SYN", "ingress_miss_tcp_flags", vxlan(in(remotePod, localPod, 0x02), peerNode, localNode, 1)},
		{"from a peer that does not run the fast path", "ingress_miss_no_peer", vxlan(in(otherPod, localPod, 0), otherNode, localNode, 1)},
		{"from a node address (onc_hosts)", "ingress_miss_host", vxlan(in(netip.MustParseAddr("10.244.2.1"), localPod, 0), peerNode, localNode, 1)},
		{"to no local pod", "ingress_miss_no_pod", vxlan(in(remotePod, netip.MustParseAddr("10.244.1.99"), 0), peerNode, localNode, 1)},
		{"unlearned flow", "ingress_miss_flow", vxlan(frame(vtepLocal, vtepPeer, remotePod, localPod, unix.IPPROTO_UDP, 80, 40000, 0, 10), peerNode, localNode, 1)},
	}
	for _, c := range cases {
		before := stat(t, d, c.counter)
		if ret, out := run(t, d.progs.OncIngressFast, c.pkt, 0); ret != actOK || len(out) != len(c.pkt) {
			t.Errorf("%s: verdict %d; want pass-through unchanged", c.name, ret)
		}
		if stat(t, d, c.counter) != before+1 {
			t.Errorf("%s: counter %s did not count it", c.name, c.counter)
		}
	}
}

func TestLearningNeedsTheEstablishedMark(t *testing.T) {
	d := open(t)
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}, false))
	testutil.Must(t, d.SyncSenders([]Sender{peerSender}, false))
	testutil.Must(t, d.SetLocalPod(localPod, loIndex, podMAC, hostMAC))
	out := vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_UDP, 40000, 53, 0, 10), localNode, peerNode, 1)
	back := frame(podMAC, hostMAC, remotePod, localPod, unix.IPPROTO_UDP, 53, 40000, 0, 10)

	run(t, d.progs.OncLearnEgress, out, 0)
	run(t, d.progs.OncLearnIngress, back, 0)
	if f, _ := d.Flows(); len(f) != 0 {
		t.Fatalf("learned without the ESTABLISHED mark: %+v", f)
	}
	syn := vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_TCP, 1, 2, 0x02, 0), localNode, peerNode, 1)
	run(t, d.progs.OncLearnEgress, syn, mark)
	if f, _ := d.Flows(); len(f) != 0 {
		t.Fatal("learned from a SYN")
	}

	run(t, d.progs.OncLearnEgress, out, mark)
	run(t, d.progs.OncLearnIngress, back, mark)
	flows, _ := d.Flows()
	if len(flows) != 1 || !flows[0].Egress || !flows[0].Ingress || !flows[0].Live ||
		flows[0].Local != netip.AddrPortFrom(localPod, 40000) || flows[0].Remote != netip.AddrPortFrom(remotePod, 53) {
		t.Fatalf("flows = %+v", flows)
	}
	dests, _ := d.Dests()
	encaps, _ := d.Encaps()
	if len(dests) != 1 || dests[0].Node != peerNode || len(encaps) != 1 || encaps[0].OuterDstIP != peerNode || encaps[0].InnerDst.String() != vtepPeer.String() {
		t.Fatalf("dests %+v encaps %+v", dests, encaps)
	}
	// Now the egress fast path takes the flow.
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_UDP, 40000, 53, 0, 10), 0); ret != actRedirect {
		t.Fatalf("learned flow not fast-pathed: %d", ret)
	}

	// A flush is one epoch step: the flow is void at once, and the flow
	// records hear of it.
	before, _ := d.config()
	told := telling(d)
	testutil.Must(t, d.Flush())
	if want := fmt.Sprint(Eviction{netip.AddrPortFrom(localPod, 40000), netip.AddrPortFrom(remotePod, 53), unix.IPPROTO_UDP, EvictFlush}); len(*told) != 1 || (*told)[0] != want {
		t.Fatalf("a flush told of %q, want %q", *told, want)
	}
	if after, _ := d.config(); after.Epoch != before.Epoch+1 || after.Learning != 1 {
		t.Fatalf("after a flush: epoch %d → %d, learning %d; want one epoch step and learning on", before.Epoch, after.Epoch, after.Learning)
	}
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_UDP, 40000, 53, 0, 10), 0); ret != actOK {
		t.Fatal("flow still fast-pathed after a flush")
	}
}

// TestLearningWritesOnlyChanges: every marked packet of a flow reaches
// the learning programs; once the flow is learned they write nothing (the
// outer header's per-packet fields do not count as a change), a changed
// header is written again, and with the fast path off nothing is learned.
func TestLearningWritesOnlyChanges(t *testing.T) {
	d := open(t)
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}, false))
	testutil.Must(t, d.SyncSenders([]Sender{peerSender}, false))
	testutil.Must(t, d.SetLocalPod(localPod, loIndex, podMAC, hostMAC))
	out := vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_UDP, 40000, 53, 0, 10), localNode, peerNode, 1)
	back := frame(podMAC, hostMAC, remotePod, localPod, unix.IPPROTO_UDP, 53, 40000, 0, 10)
	run(t, d.progs.OncLearnEgress, out, mark)
	run(t, d.progs.OncLearnIngress, back, mark)
	if stat(t, d, "learn_egress") != 1 || stat(t, d, "learn_ingress") != 1 || stat(t, d, "learn_known") != 0 {
		t.Fatal("the first packets did not teach the cache")
	}

	// The same flow again, with what the kernel varies per packet varied:
	// outer ECN, IP id and UDP source port.
	again := slices.Clone(out)
	again[15] |= 2                                 // outer ECN: ECT(0), copied from an inner packet
	binary.BigEndian.PutUint16(again[18:], 0x4242) // outer IP id
	binary.BigEndian.PutUint16(again[34:], 61000)  // outer UDP source
	for range 3 {
		run(t, d.progs.OncLearnEgress, again, mark)
		run(t, d.progs.OncLearnIngress, back, mark)
	}
	if stat(t, d, "learn_egress") != 1 || stat(t, d, "learn_ingress") != 1 || stat(t, d, "learn_known") != 6 {
		t.Fatalf("a learned flow was written again: learn_egress %d, learn_ingress %d, learn_known %d",
			stat(t, d, "learn_egress"), stat(t, d, "learn_ingress"), stat(t, d, "learn_known"))
	}

	// The peer's VTEP moved (another MAC): a real change is written.
	moved := slices.Clone(out)
	copy(moved[0:6], net.HardwareAddr{2, 0, 0, 0, 0xb, 9})
	run(t, d.progs.OncLearnEgress, moved, mark)
	encaps, _ := d.Encaps()
	if stat(t, d, "learn_egress") != 2 || len(encaps) != 1 || encaps[0].OuterDst.String() != "02:00:00:00:0b:09" {
		t.Fatalf("a changed header was not written: learn_egress %d, encaps %+v", stat(t, d, "learn_egress"), encaps)
	}

	// Off, the fast path learns nothing, even from marked packets.
	testutil.Must(t, d.Configure(false))
	other := vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_UDP, 40001, 53, 0, 10), localNode, peerNode, 1)
	before := stat(t, d, "learn_egress") + stat(t, d, "learn_known")
	run(t, d.progs.OncLearnEgress, other, mark)
	if flows, _ := d.Flows(); len(flows) != 1 || stat(t, d, "learn_egress")+stat(t, d, "learn_known") != before {
		t.Fatalf("learned with the fast path off: %+v", flows)
	}
}

// TestSYNACKTeachesTheReplyDirection: conntrack marks a SYN-ACK
// ESTABLISHED, so it teaches its direction on both nodes; the handshake's
// last ACK still takes the slow path (each node's conntrack sees the whole
// handshake) and teaches the other direction; the connection's first
// request and response then hit. SYN, FIN and RST teach nothing.
func TestSYNACKTeachesTheReplyDirection(t *testing.T) {
	const synAck, ack, finAck, rst = 0x12, 0x10, 0x11, 0x04
	toPeer := func(sport, dport uint16, flags byte) []byte { // as the uplink sends it
		return vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_TCP, sport, dport, flags, 0), localNode, peerNode, 1)
	}
	fromPod := func(sport, dport uint16, flags byte) []byte { // as the pod's veth gets it
		return frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, sport, dport, flags, 10)
	}
	fromPeer := func(sport, dport uint16, flags byte) []byte { // as the uplink gets it
		return vxlan(frame(vtepLocal, vtepPeer, remotePod, localPod, unix.IPPROTO_TCP, sport, dport, flags, 10), peerNode, localNode, 1)
	}
	toPod := func(sport, dport uint16, flags byte) []byte { // as the pod's veth sends it
		return frame(podMAC, hostMAC, remotePod, localPod, unix.IPPROTO_TCP, sport, dport, flags, 0)
	}
	ready := func(t *testing.T) *Datapath {
		d := open(t)
		testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}, false))
		testutil.Must(t, d.SyncSenders([]Sender{peerSender}, false))
		testutil.Must(t, d.SetLocalPod(localPod, loIndex, podMAC, hostMAC))
		return d
	}
	verdict := func(t *testing.T, p *ebpf.Program, pkt []byte, want uint32, what string) {
		t.Helper()
		if ret, _ := run(t, p, pkt, 0); ret != want {
			t.Fatalf("%s: verdict %d, want %d", what, ret, want)
		}
	}

	t.Run("server's node", func(t *testing.T) { // the local pod accepted on :80
		d := ready(t)
		run(t, d.progs.OncLearnEgress, toPeer(80, 40000, synAck), mark)
		if stat(t, d, "learn_egress") != 1 {
			t.Fatal("the SYN-ACK taught nothing")
		}
		verdict(t, d.progs.OncIngressFast, fromPeer(40000, 80, ack), actOK, "the handshake's last ACK")
		if stat(t, d, "ingress_miss_flow") != 1 {
			t.Fatal("the last ACK missed for another reason than the unlearned direction")
		}
		run(t, d.progs.OncLearnIngress, toPod(40000, 80, ack), mark)
		verdict(t, d.progs.OncIngressFast, fromPeer(40000, 80, 0), actRedirect, "the request")
		verdict(t, d.progs.OncEgressFast, fromPod(80, 40000, 0), actRedirect, "the response")
	})
	t.Run("client's node", func(t *testing.T) { // the local pod connected from :40000
		d := ready(t)
		run(t, d.progs.OncLearnIngress, toPod(80, 40000, synAck), mark)
		if stat(t, d, "learn_ingress") != 1 {
			t.Fatal("the SYN-ACK taught nothing")
		}
		verdict(t, d.progs.OncEgressFast, fromPod(40000, 80, ack), actOK, "the handshake's last ACK")
		run(t, d.progs.OncLearnEgress, toPeer(40000, 80, ack), mark)
		verdict(t, d.progs.OncEgressFast, fromPod(40000, 80, 0), actRedirect, "the request")
		verdict(t, d.progs.OncIngressFast, fromPeer(80, 40000, 0), actRedirect, "the response")
	})
	t.Run("SYN, FIN and RST", func(t *testing.T) {
		d := ready(t)
		for i, flags := range []byte{0x02, finAck, rst, 0x13} {
			port := uint16(41000 + i)
			run(t, d.progs.OncLearnEgress, toPeer(port, 80, flags), mark)
			run(t, d.progs.OncLearnIngress, toPod(80, port, flags), mark)
		}
		if f, _ := d.Flows(); len(f) != 0 {
			t.Fatalf("learned from SYN, FIN or RST: %+v", f)
		}
	})
}

func TestCoherency(t *testing.T) {
	d := open(t)
	established(t, d)
	told := telling(d)
	// The peer leaves: its CIDR, destinations, header and flows go, and
	// the flow records hear of each flow.
	testutil.Must(t, d.SyncPeers(nil, false))
	flows, _ := d.Flows()
	dests, _ := d.Dests()
	encaps, _ := d.Encaps()
	if len(flows)+len(dests)+len(encaps) != 0 {
		t.Fatalf("after the peer left: flows %v dests %v encaps %v", flows, dests, encaps)
	}
	told.is(t, EvictPeer)
	// A local pod deleted: its flows go with it.
	established(t, d)
	testutil.Must(t, d.DeleteLocalPod(localPod))
	if flows, _ := d.Flows(); len(flows) != 0 {
		t.Fatalf("flows of a deleted pod remain: %v", flows)
	}
	told.is(t, EvictPod)
	if l, _ := d.Locals(); len(l) != 0 {
		t.Fatal("deleted pod still local")
	}
	// While learning is paused nothing is learned.
	established(t, d)
	c, _ := d.config()
	c.Learning = 0
	testutil.Must(t, d.maps.OncCfg.Put(uint32(0), c))
	out := vxlan(frame(vtepPeer, vtepLocal, localPod, remotePod, unix.IPPROTO_UDP, 1, 2, 0, 0), localNode, peerNode, 1)
	run(t, d.progs.OncLearnEgress, out, mark)
	if stat(t, d, "learn_paused") != 1 || stat(t, d, "learn_egress") != 0 {
		t.Fatal("learning went on while paused")
	}
}

func TestEvictFlowsKeepsOnlyWhatDecideKeeps(t *testing.T) {
	d := open(t)
	established(t, d) // localPod:40000 <-> remotePod:80
	other := FlowKey{LocalIp: bpf.NetIPv4(localPod), RemoteIp: bpf.NetIPv4(remotePod), LocalPort: bpf.NetPort(uint16(40001)), RemotePort: bpf.NetPort(uint16(80)), Proto: unix.IPPROTO_TCP}
	testutil.Must(t, d.maps.OncFilter.Put(other, FlowVal{Egress: 1, Ingress: 1}))
	kept := netip.AddrPortFrom(localPod, 40000)
	told := telling(d)
	var learning uint8 = 1
	testutil.Must(t, d.EvictFlows(map[netip.Addr]bool{localPod: true}, func([]Conn) (func(local, remote netip.AddrPort, proto uint8, _ Opener) Verdict, error) {
		c, _ := d.config()
		learning = c.Learning
		return func(local, remote netip.AddrPort, proto uint8, _ Opener) Verdict {
			if local == kept && remote == netip.AddrPortFrom(remotePod, 80) && proto == unix.IPPROTO_TCP {
				return Keep
			}
			return Evict
		}, nil
	}))
	if learning != 0 {
		t.Error("decide ran with learning on: a connection it ends could be learned again")
	}
	flows, _ := d.Flows()
	if len(flows) != 1 || flows[0].Local != kept {
		t.Fatalf("flows after eviction: %v, want only %v's", flows, kept)
	}
	if want := fmt.Sprint(Eviction{netip.AddrPortFrom(localPod, 40001), netip.AddrPortFrom(remotePod, 80), unix.IPPROTO_TCP, EvictPolicy}); len(*told) != 1 || (*told)[0] != want {
		t.Fatalf("OnEvict told of %q, want the one evicted flow %q", *told, want)
	}
	// Pods not named are untouched; a failing decide deletes nothing.
	testutil.Must(t, d.EvictFlows(map[netip.Addr]bool{remotePod: true}, func([]Conn) (func(local, remote netip.AddrPort, proto uint8, _ Opener) Verdict, error) {
		return func(netip.AddrPort, netip.AddrPort, uint8, Opener) Verdict { return Evict }, nil
	}))
	if err := d.EvictFlows(map[netip.Addr]bool{localPod: true}, func([]Conn) (func(local, remote netip.AddrPort, proto uint8, _ Opener) Verdict, error) {
		return nil, errors.New("conntrack failed")
	}); err == nil {
		t.Fatal("EvictFlows hid decide's error")
	}
	if flows, _ := d.Flows(); len(flows) != 1 {
		t.Fatalf("flows after evictions that must not delete: %v", flows)
	}
	if c, _ := d.config(); c.Learning != 1 {
		t.Fatal("learning not resumed after a failed eviction")
	}
}

// A SYN on a cached flow's addresses and ports starts a new connection,
// which conntrack may NAT differently from the old one (a clashing source
// port remapped, a Service connection DNATed): the entry goes, and the new
// connection takes the slow path until it is learned itself.
func TestSYNForgetsTheCachedFlow(t *testing.T) {
	egressData := frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 100)
	for _, c := range []struct {
		name string
		prog func(d *Datapath) *ebpf.Program
		syn  []byte
	}{
		{"a SYN from the pod", func(d *Datapath) *ebpf.Program { return d.progs.OncEgressFast },
			frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0x02, 0)},
		{"a SYN-ACK to the pod", func(d *Datapath) *ebpf.Program { return d.progs.OncIngressFast },
			vxlan(frame(vtepLocal, vtepPeer, remotePod, localPod, unix.IPPROTO_TCP, 80, 40000, 0x12, 0), peerNode, localNode, 1)},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := open(t)
			established(t, d)
			if ret, _ := run(t, c.prog(d), c.syn, 0); ret != actOK {
				t.Fatalf("verdict %d for the SYN; want the slow path", ret)
			}
			if ret, _ := run(t, d.progs.OncEgressFast, egressData, 0); ret != actOK || stat(t, d, "egress_miss_flow") != 1 {
				t.Fatalf("after the SYN the old connection's entry still carried data (verdict %d)", ret)
			}
		})
	}
}

// EvictEncaps removes exactly the headers the predicate calls stale and
// resumes learning; the flow whose header went takes the slow path until
// it learns the new one.
func TestEvictEncapsRemovesOnlyStale(t *testing.T) {
	d := open(t)
	established(t, d) // a header to peerNode
	var e EncapVal
	e.Ifindex = 7
	testutil.Must(t, d.maps.OncEncap.Put(bpf.NetIPv4(otherNode), e))
	told := telling(d)
	n, err := d.EvictEncaps(func(e Encap) bool { return e.Node == peerNode })
	if err != nil || n != 1 {
		t.Fatalf("EvictEncaps = %d, %v; want 1 evicted", n, err)
	}
	told.is(t, EvictUnderlay)
	if encaps, _ := d.Encaps(); len(encaps) != 1 || encaps[0].Node != otherNode {
		t.Fatalf("headers left: %+v; want only %s's", encaps, otherNode)
	}
	if c, _ := d.config(); c.Learning != 1 {
		t.Fatal("learning not resumed after the eviction")
	}
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 10), 0); ret != actOK || stat(t, d, "egress_miss_encap") != 1 {
		t.Fatalf("verdict %d after its header was evicted; want the slow path (miss_encap)", ret)
	}
	if n, err := d.EvictEncaps(func(Encap) bool { return false }); n != 0 || err != nil {
		t.Fatalf("nothing stale: EvictEncaps = %d, %v", n, err)
	}
}
