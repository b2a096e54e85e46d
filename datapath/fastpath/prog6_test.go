//go:build privileged

package fastpath

// BPF_PROG_RUN tests of the programs' IPv6 paths: a dual-stack node's
// IPv6 flows over the IPv4 tunnel, in their own maps and counters.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// The pods and CIDRs are senders_test.go's.

// open6 is open on a dual-stack node.
func open6(t *testing.T) *Datapath { return openWith(t, Options{PodCIDRv6: localCIDR6}) }

// stat6 is stat of the IPv6 counters.
func stat6(t *testing.T, d *Datapath, name string) uint64 {
	t.Helper()
	st, err := d.Stats()
	testutil.Must(t, err)
	for _, s := range st {
		if s.Name == name && s.Family == "ipv6" {
			return s.Value
		}
	}
	t.Fatalf("no IPv6 counter %s", name)
	return 0
}

// flowKey6 is the IPv6 flow key of local:lport <-> remote:rport.
func flowKey6(local, remote netip.Addr, lport, rport uint16, proto uint8) FlowKey6 {
	return FlowKey6{LocalIp: local.As16(), RemoteIp: remote.As16(), LocalPort: bpf.NetPort(lport), RemotePort: bpf.NetPort(rport), Proto: proto}
}

// established6 fills the maps as learning would for
// [localPod6]:40000 <-> [remotePod6]:80, with the peer's header learned
// from an IPv4 packet: one header per node serves both families.
func established6(t *testing.T, d *Datapath) {
	t.Helper()
	established(t, d)
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}, {PodCIDR: peerCIDR6, NodeIP: peerNode}}, false))
	testutil.Must(t, d.SyncSenders([]Sender{peerSender6}, false))
	testutil.Must(t, d.SetLocalPod(localPod6, loIndex, podMAC, hostMAC))
	testutil.Must(t, d.maps.OncFilter6.Put(flowKey6(localPod6, remotePod6, 40000, 80, unix.IPPROTO_TCP), FlowVal{Egress: 1, Ingress: 1}))
	testutil.Must(t, d.maps.OncEgress6.Put(addr6{Addr: remotePod6.As16()}, EgressVal{NodeIp: bpf.NetIPv4(peerNode)}))
}

func TestEgress6FastPathHitEncapsulates(t *testing.T) {
	d := open6(t)
	established6(t, d)
	pkt := frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0, 100)
	pkt[14], pkt[15] = 0x6b, 0x80 // traffic class 0xb8: DSCP 46, ECN 0 (not this test's)
	pkt[15] |= 3 << 4             // ECN CE
	ret, out := run(t, d.progs.OncEgressFast, pkt, 0)
	if ret != actRedirect || stat6(t, d, "egress_hit") != 1 || stat(t, d, "egress_hit") != 0 {
		t.Fatalf("verdict %d, IPv6 hits %d, IPv4 hits %d; want redirect and one IPv6 hit", ret, stat6(t, d, "egress_hit"), stat(t, d, "egress_hit"))
	}
	if len(out) != len(pkt)+50 {
		t.Fatalf("encapsulated length %d, want %d", len(out), len(pkt)+50)
	}
	oip := out[14:34]
	if binary.BigEndian.Uint16(out[12:]) != 0x0800 || netip.AddrFrom4([4]byte(oip[16:20])) != peerNode || netip.AddrFrom4([4]byte(oip[12:16])) != localNode {
		t.Fatalf("outer header %x: want IPv4 from this node to the peer", out[12:34])
	}
	if int(binary.BigEndian.Uint16(oip[2:])) != len(out)-14 || binary.BigEndian.Uint16(oip[10:]) != ipsum(oip) {
		t.Fatal("outer IP length or checksum wrong")
	}
	if got := oip[1] & 3; got != 2 { // CE is sent as ECT(0), as for IPv4
		t.Errorf("outer ECN %d, want 2 from the inner traffic class", got)
	}
	if net.HardwareAddr(out[50:56]).String() != vtepPeer.String() || binary.BigEndian.Uint16(out[62:]) != 0x86dd {
		t.Fatalf("inner Ethernet header %x: want the peer's VTEP MAC and IPv6's type", out[50:64])
	}
	if inner := out[64:104]; inner[7] != 63 || netip.AddrFrom16([16]byte(inner[24:40])) != remotePod6 {
		t.Fatalf("inner hop limit %d (want 63) or destination %x", inner[7], inner[24:40])
	}
	// The IPv4 flow still gets IPv4's inner type from the shared header.
	_, out = run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 10), 0)
	if len(out) < 64 || binary.BigEndian.Uint16(out[62:]) != 0x0800 {
		t.Fatal("an IPv4 packet after an IPv6 one left with another inner type")
	}
}

// On a kernel that cannot set an IPv6 protocol on decapsulation (before
// 6.3) the packet goes through the pod's veth instead, as rewritten.
func TestIngress6FastPathHitDecapsulates(t *testing.T) {
	t.Run("Linux 6.3 on", func(t *testing.T) { ingress6Hit(t) })
	t.Run("older kernels", func(t *testing.T) {
		defer func(p func() (bool, error)) { decapProbe = p }(decapProbe)
		decapProbe = func() (bool, error) { return false, nil }
		ingress6Hit(t)
	})
}

// The objects that share the flow cache get the fast path's constants as
// its programs have them, the kernel's probed answer among them: the
// uplink's IPv6 overlay reply decapsulates out of an IPv4 tunnel only
// where onc_decap_ipv6 says the kernel sets the skb's protocol.
func TestFlowCacheConstantsCarryTheProbe(t *testing.T) {
	for _, probed := range []bool{true, false} {
		func() {
			defer func(p func() (bool, error)) { decapProbe = p }(decapProbe)
			decapProbe = func() (bool, error) { return probed, nil }
			d := open6(t)
			if got, want := d.FlowCache().Constants["onc_decap_ipv6"], b2u(probed); got != want {
				t.Errorf("probed %v: the flow cache's onc_decap_ipv6 is %v, want %v", probed, got, want)
			}
		}()
	}
}

func ingress6Hit(t *testing.T) {
	d := open6(t)
	established6(t, d)
	inner := frame(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, 80, 40000, 0, 100)
	ret, out := run(t, d.progs.OncIngressFast, vxlan(inner, peerNode, localNode, 1), 0)
	if ret != actRedirect || stat6(t, d, "ingress_hit") != 1 {
		t.Fatalf("verdict %d, IPv6 hits %d; want redirect and one hit", ret, stat6(t, d, "ingress_hit"))
	}
	if len(out) != len(inner) {
		t.Fatalf("decapsulated length %d, want %d", len(out), len(inner))
	}
	if net.HardwareAddr(out[0:6]).String() != podMAC.String() || net.HardwareAddr(out[6:12]).String() != hostMAC.String() || binary.BigEndian.Uint16(out[12:]) != 0x86dd {
		t.Fatalf("Ethernet header %x, want the pod's and host veth's MACs and IPv6's type", out[0:14])
	}
	if out[14+7] != 63 {
		t.Fatalf("hop limit %d, want 63", out[14+7])
	}
}

// Every way an IPv6 packet misses leaves it to the slow path untouched and
// counts its reason in the IPv6 counters.
func TestFastPath6MissReasons(t *testing.T) {
	d := open6(t)
	established6(t, d)
	testutil.Must(t, d.SyncSenders([]Sender{peerSender6, otherSender}, false))
	out := func(src, dst netip.Addr, sport uint16, flags byte) []byte {
		return frame(hostMAC, podMAC, src, dst, unix.IPPROTO_TCP, sport, 80, flags, 10)
	}
	in := func(src, dst netip.Addr, flags byte) []byte {
		return vxlan(frame(vtepLocal, vtepPeer, src, dst, unix.IPPROTO_TCP, 80, 40000, flags, 10), peerNode, localNode, 1)
	}
	icmp := out(localPod6, remotePod6, 40000, 0)
	icmp[14+6] = unix.IPPROTO_ICMPV6
	notMine := netip.MustParseAddr("fd00:10:244:1::99")
	for _, c := range []struct {
		name, counter string
		pkt           []byte
		ingress       bool
	}{
		{"ICMPv6", "egress_miss_not_ip", icmp, false},
		{"SYN", "egress_miss_tcp_flags", out(localPod6, remotePod6, 40002, 0x02), false},
		{"FIN", "egress_miss_tcp_flags", out(localPod6, remotePod6, 40000, 0x01), false},
		{"RST", "egress_miss_tcp_flags", out(localPod6, remotePod6, 40000, 0x04), false},
		{"another pod's source", "egress_miss_spoof", out(notMine, remotePod6, 40000, 0), false},
		{"not a fast-path peer", "egress_miss_no_peer", out(localPod6, netip.MustParseAddr("fd00:10:244:9::3"), 40000, 0), false},
		{"unlearned flow", "egress_miss_flow", out(localPod6, remotePod6, 40001, 0), false},
		// Another connection's SYN: this one's would forget the flow.
		{"SYN in", "ingress_miss_tcp_flags", vxlan(frame(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, 81, 40000, 0x02, 0), peerNode, localNode, 1), true},
		{"to no local pod", "ingress_miss_no_pod", in(remotePod6, notMine, 0), true},
		{"unlearned flow in", "ingress_miss_flow", vxlan(frame(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_UDP, 80, 40000, 0, 10), peerNode, localNode, 1), true},
	} {
		prog := d.progs.OncEgressFast
		if c.ingress {
			prog = d.progs.OncIngressFast
		}
		before := stat6(t, d, c.counter)
		if ret, left := run(t, prog, c.pkt, 0); ret != actOK || len(left) != len(c.pkt) {
			t.Errorf("%s: verdict %d, %d bytes; want the slow path, untouched", c.name, ret, len(left))
		}
		if stat6(t, d, c.counter) != before+1 {
			t.Errorf("%s: %s did not count", c.name, c.counter)
		}
	}
	// A destination learned behind another node than its CIDR's owner.
	testutil.Must(t, d.maps.OncEgress6.Put(addr6{Addr: remotePod6.As16()}, EgressVal{NodeIp: bpf.NetIPv4(otherNode)}))
	if ret, _ := run(t, d.progs.OncEgressFast, out(localPod6, remotePod6, 40000, 0), 0); ret != actOK || stat6(t, d, "egress_miss_dest") != 1 {
		t.Errorf("stale destination: verdict %d, miss_dest %d", ret, stat6(t, d, "egress_miss_dest"))
	}
	// Off, nothing takes the fast path.
	testutil.Must(t, d.Configure(false))
	if ret, _ := run(t, d.progs.OncIngressFast, in(remotePod6, localPod6, 0), 0); ret != actOK || stat6(t, d, "ingress_miss_disabled") != 1 {
		t.Errorf("disabled: verdict %d, miss_disabled %d", ret, stat6(t, d, "ingress_miss_disabled"))
	}
}

// The slow path's ESTABLISHED mark teaches IPv6 flows as it does IPv4's,
// into the IPv6 maps; the header learned from an IPv6 frame is stored as
// the node's one header, with IPv4's inner type.
func TestLearning6(t *testing.T) {
	d := open6(t)
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR6, NodeIP: peerNode}}, false))
	testutil.Must(t, d.SetLocalPod(localPod6, loIndex, podMAC, hostMAC))
	sent := vxlan(frame(vtepPeer, vtepLocal, localPod6, remotePod6, unix.IPPROTO_UDP, 40000, 53, 0, 10), localNode, peerNode, 1)
	back := frame(podMAC, hostMAC, remotePod6, localPod6, unix.IPPROTO_UDP, 53, 40000, 0, 10)
	run(t, d.progs.OncLearnEgress, sent, 0)
	run(t, d.progs.OncLearnIngress, back, 0)
	if f, _ := d.Flows(); len(f) != 0 {
		t.Fatalf("learned without the ESTABLISHED mark: %+v", f)
	}
	run(t, d.progs.OncLearnEgress, sent, mark)
	run(t, d.progs.OncLearnIngress, back, mark)
	flows, _ := d.Flows()
	if len(flows) != 1 || !flows[0].Egress || !flows[0].Ingress || !flows[0].Live ||
		flows[0].Local != netip.AddrPortFrom(localPod6, 40000) || flows[0].Remote != netip.AddrPortFrom(remotePod6, 53) {
		t.Fatalf("flows = %+v", flows)
	}
	if stat6(t, d, "learn_egress") != 1 || stat6(t, d, "learn_ingress") != 1 || stat(t, d, "learn_egress") != 0 {
		t.Error("the learning was not counted as IPv6's")
	}
	dests, _ := d.Dests()
	if len(dests) != 1 || dests[0].Pod != remotePod6 || dests[0].Node != peerNode {
		t.Fatalf("dests %+v", dests)
	}
	var e EncapVal
	testutil.Must(t, d.maps.OncEncap.Lookup(bpf.NetIPv4(peerNode), &e))
	if binary.BigEndian.Uint16(e.Hdr[62:]) != 0x0800 {
		t.Fatalf("stored inner type %#x, want IPv4's", binary.BigEndian.Uint16(e.Hdr[62:]))
	}
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_UDP, 40000, 53, 0, 10), 0); ret != actRedirect {
		t.Fatalf("learned IPv6 flow not fast-pathed: %d", ret)
	}
	// A flush voids it.
	testutil.Must(t, d.Flush())
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_UDP, 40000, 53, 0, 10), 0); ret != actOK {
		t.Fatal("IPv6 flow still fast-pathed after a flush")
	}
	if n, _ := d.CacheEntries(); n["filter6"] != 0 || n["egress6"] != 0 || n["local6"] != 1 {
		t.Fatalf("after a flush: %v, want no IPv6 flow or destination, the local pod kept", n)
	}
}

// A SYN on an IPv6 flow's addresses and ports forgets it, as in IPv4.
func TestSYNForgetsTheCachedFlow6(t *testing.T) {
	d := open6(t)
	established6(t, d)
	run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0x02, 0), 0)
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0, 10), 0); ret != actOK || stat6(t, d, "egress_miss_flow") != 1 {
		t.Fatalf("after the SYN the old connection's entry still carried data (verdict %d)", ret)
	}
}

// What goes in the control plane goes from the IPv6 maps: a peer's IPv6
// CIDR, a local pod's IPv6 address, a policy eviction of its flows.
func TestEvictions6(t *testing.T) {
	d := open6(t)
	established6(t, d)
	counts := func() map[string]int {
		n, err := d.CacheEntries()
		testutil.Must(t, err)
		return n
	}
	// A policy eviction reaches IPv6 flows of the named pods, and only
	// those decide evicts.
	kept := flowKey6(localPod6, remotePod6, 40001, 80, unix.IPPROTO_UDP)
	testutil.Must(t, d.maps.OncFilter6.Put(kept, FlowVal{Egress: 1, Ingress: 1}))
	testutil.Must(t, d.EvictFlows(map[netip.Addr]bool{localPod6: true}, func([]Conn) (func(local, remote netip.AddrPort, proto uint8, _ Opener) Verdict, error) {
		return func(local, _ netip.AddrPort, proto uint8, _ Opener) Verdict {
			if local == netip.AddrPortFrom(localPod6, 40001) && proto == unix.IPPROTO_UDP {
				return Keep
			}
			return Evict
		}, nil
	}))
	if flows, _ := d.Flows(); len(flows) != 2 || !hasFlow(flows, netip.AddrPortFrom(localPod6, 40001)) || !hasFlow(flows, netip.AddrPortFrom(localPod, 40000)) {
		t.Fatalf("flows after an IPv6 pod's eviction: %+v; want its kept flow and the IPv4 pod's", flows)
	}
	// The peer's IPv6 CIDR goes: its IPv6 destinations and flows go, its
	// IPv4 ones stay, and so does its node's header, which they (and the
	// connections the fast path opened to it) need.
	testutil.Must(t, d.SyncPeers([]Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}, false))
	if n := counts(); n["filter6"] != 0 || n["egress6"] != 0 || n["filter"] != 1 || n["egress"] != 1 || n["encap"] != 1 {
		t.Fatalf("after the peer's IPv6 CIDR went: %v", n)
	}
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, 40000, 80, 0, 10), 0); ret != actRedirect {
		t.Fatal("the peer's IPv4 flow left the fast path when its IPv6 CIDR went")
	}
	if ret, _ := run(t, d.progs.OncEgressFast, frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_TCP, 40000, 80, 0, 10), 0); ret != actOK || stat6(t, d, "egress_miss_no_peer") != 1 {
		t.Fatal("an IPv6 packet to a CIDR that left took the fast path")
	}
	// The pod's IPv6 address goes with its flows.
	testutil.Must(t, d.maps.OncFilter6.Put(kept, FlowVal{Egress: 1, Ingress: 1}))
	testutil.Must(t, d.DeleteLocalPod(localPod6))
	if n := counts(); n["local6"] != 0 || n["filter6"] != 0 || n["local"] != 1 {
		t.Fatalf("after the pod's IPv6 address went: %v", n)
	}
}

func hasFlow(flows []Flow, local netip.AddrPort) bool {
	for _, f := range flows {
		if f.Local == local {
			return true
		}
	}
	return false
}
