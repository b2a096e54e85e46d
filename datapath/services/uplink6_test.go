//go:build privileged

package services

// IPv6 from outside on the uplink (include/services_uplink6.h): run with
// BPF_PROG_RUN on crafted frames against real maps (the packet left, its
// checksum recomputed over the pseudo-header, the skb's mark, the flows),
// and a bed of namespaces that carries real traffic through the programs,
// the stack and ip6tables' rules.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net/netip"
	"os/exec"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/netfilter"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

var (
	nodeIP6     = netip.MustParseAddr("2001:db8::1")
	clientIP6   = netip.MustParseAddr("2001:db8::2")
	externalIP6 = netip.MustParseAddr("2001:db8:ff::10")  // routed to the node, not its own
	spoofIP6    = netip.MustParseAddr("fd00:10:244:9::9") // a pod address, claimed from outside
	localBE6    = netip.AddrPortFrom(netip.MustParseAddr("fd00:10:244:1::2"), 8080)
	remoteBE6   = netip.AddrPortFrom(netip.MustParseAddr("fd00:10:244:2::2"), 8080)
	remoteGW6   = netip.MustParseAddr("fd00:10:244:2::1") // the node's address toward the remote backend
	podCIDR6    = netip.MustParsePrefix("fd00:10:244::/56")
	localPods6  = netip.MustParsePrefix("fd00:10:244:1::/64")
	client6     = netip.AddrPortFrom(clientIP6, 40000)
	nodePort6   = netip.AddrPortFrom(nodeIP6, nodePort)
)

const (
	tcp6 = uint8(unix.IPPROTO_TCP)
	udp6 = uint8(unix.IPPROTO_UDP)
	syn  = 0x02
)

// uplink6LB loads the programs with their maps pinned in a fresh
// directory, with the fast path's (on, as the agent loads them), the
// node's internal prefixes set in both families.
func uplink6LB(t *testing.T) *LB {
	t.Helper()
	lb, _ := uplink6Node(t)
	return lb
}

// uplink6Node is uplink6LB's and the fast path it shares maps with.
func uplink6Node(t *testing.T) (*LB, *fastpath.Datapath) {
	t.Helper()
	return uplink6NodeOver(t, nodeIP)
}

// uplink6NodeOver is uplink6Node on the underlay of endpoint, the node's
// tunnel endpoint: nodeIP (a dual-stack node's IPv4 underlay) or nodeIP6
// (an IPv6 underlay).
func uplink6NodeOver(t *testing.T, endpoint netip.Addr) (*LB, *fastpath.Datapath) {
	t.Helper()
	return uplink6NodeWith(t, endpoint, fastpath.SetupOff)
}

// uplink6NodeWith is uplink6NodeOver with connection setup on the fast
// path as setup says.
func uplink6NodeWith(t *testing.T, endpoint netip.Addr, setup fastpath.ConnSetup) (*LB, *fastpath.Datapath) {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	fp, err := fastpath.Open(fastpath.Options{PinDir: dir, VNI: 1, Port: vxlanPort, Mark: fastPathMark, NodeIP: endpoint,
		PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), PodCIDRv6: localPods6, ConnSetup: setup})
	testutil.Must(t, err)
	t.Cleanup(func() { fp.Close() })
	testutil.Must(t, fp.Configure(true))
	lb, err := Open(Options{PinDir: dir, IPv6: true, FlowCache: fp.FlowCache()})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	testutil.Must(t, lb.SetInternal([]netip.Prefix{podCIDR, netip.PrefixFrom(nodeIP, 32), podCIDR6, netip.PrefixFrom(nodeIP6, 128)}))
	return lb, fp
}

// frame6 is a TCP or UDP frame from src to dst with a payload and a right
// checksum; TCP with flags (a lone SYN, else with an ACK).
func frame6(src, dst netip.AddrPort, proto uint8, flags byte) []byte {
	const payload = 11
	b := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, src.Addr(), dst.Addr(), proto, src.Port(), dst.Port(), flags, payload)
	for i := len(b) - payload; i < len(b); i++ {
		b[i] = byte(0x5a + 7*i)
	}
	bpftest.SetL4Checksum6(b)
	return b
}

// Where a frame6 holds its addresses and ports.
const (
	off6Src   = 22
	off6Dst   = 38
	off6Sport = 54
	off6Dport = 56
)

// checkRewritten checks that out is in with its destination (dst) or
// source now to, its checksum right over the pseudo-header, and nothing
// else changed.
func checkRewritten(t *testing.T, what string, in, out []byte, dst bool, to netip.AddrPort) {
	t.Helper()
	want := slices.Clone(in)
	a, p := off6Src, off6Sport
	if dst {
		a, p = off6Dst, off6Dport
	}
	ip := to.Addr().As16()
	copy(want[a:], ip[:])
	binary.BigEndian.PutUint16(want[p:], to.Port())
	if len(out) != len(in) {
		t.Fatalf("%s: %d bytes left, want %d", what, len(out), len(in))
	}
	csum := 54 + 16
	if in[20] == udp6 {
		csum = 54 + 6
	}
	got := slices.Clone(out)
	copy(got[csum:csum+2], want[csum:csum+2])
	if !bytes.Equal(got, want) {
		t.Errorf("%s: left\n%x\nwant (the checksum aside)\n%x", what, out, want)
	}
	if !bpftest.L4Checksum6OK(out) {
		t.Errorf("%s: checksum %#04x is wrong over the IPv6 pseudo-header", what, binary.BigEndian.Uint16(out[csum:]))
	}
}

// ingress6 runs the uplink's ingress program on pkt: its verdict, the
// packet it left and the skb's mark.
func ingress6(t *testing.T, lb *LB, pkt []byte) (uint32, []byte, uint32) {
	t.Helper()
	return bpftest.RunMarked(t, lb.objs.OncUplinkLbIngress, pkt, 0)
}

func egress6(t *testing.T, lb *LB, pkt []byte) (uint32, []byte, uint32) {
	t.Helper()
	return bpftest.RunMarked(t, lb.objs.OncUplinkLbEgress, pkt, 0)
}

// counters reads the named counters.
func counters(t *testing.T, lb *LB, names ...string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, n := range names {
		out[n] = counter(t, lb, n)
	}
	return out
}

// grew runs fn and says by how much each named counter grew.
func grew(t *testing.T, lb *LB, fn func(), names ...string) map[string]uint64 {
	t.Helper()
	before := counters(t, lb, names...)
	fn()
	after := counters(t, lb, names...)
	for n := range after {
		after[n] -= before[n]
	}
	return after
}

// flow6 is the flow entry of the uplink's IPv6 flows for a packet from src
// to dst, in direction dir (0 in, 1 out).
func flow6(lb *LB, src, dst netip.AddrPort, proto, dir uint8) (netip.AddrPort, uint32, bool) {
	var v bpf.ServicesLb6Flow
	k := bpf.ServicesLb6FlowKey{Saddr: bpf.NetIPv6(src.Addr()), Daddr: bpf.NetIPv6(dst.Addr()),
		Sport: bpf.NetPort(src.Port()), Dport: bpf.NetPort(dst.Port()), Proto: proto, Dir: dir}
	if lb.maps.OncLb6Flows.Lookup(k, &v) != nil {
		return netip.AddrPort{}, 0, false
	}
	return netip.AddrPortFrom(bpf.IPv6(v.Ip), bpf.NetPort(v.Port)), v.SvcId, true
}

var uplink6Counters = []string{"uplink6_translated", "uplink6_new_flow", "uplink6_reversed", "uplink_translated", "uplink_new_flow"}

// A new flow to an IPv6 NodePort or externalIP gets its backend, local or
// remote: the destination's address and port rewritten, the checksum
// right over the pseudo-header (UDP's too, never 0), the SNAT mark unless
// the entry keeps the client, the flow remembered both ways; its next
// packet goes to the same backend. The backend's reply leaves from the
// frontend. The IPv4 counters stay put.
func TestUplink6TranslatesNewFlows(t *testing.T) {
	lb := uplink6LB(t)
	ext := netip.AddrPortFrom(externalIP6, 80)
	keep := netip.AddrPortFrom(nodeIP6, nodePort+1)
	npTCP := uplinkService(nodeIP6, TCP, localBE6)
	npUDP := uplinkService(nodeIP6, UDP, remoteBE6)
	extTCP := uplinkService(externalIP6, TCP, remoteBE6)
	extTCP.Frontend, extTCP.Port = ExternalIP, ext.Port()
	kept := uplinkService(nodeIP6, UDP, localBE6)
	kept.Port, kept.KeepClient = keep.Port(), true
	testutil.Must(t, lb.Sync([]Service{npTCP, npUDP, extTCP, kept}, false))
	for _, c := range []struct {
		name  string
		front netip.AddrPort
		proto uint8
		be    netip.AddrPort
		snat  bool
	}{
		{"TCP to the NodePort, a local backend", nodePort6, tcp6, localBE6, true},
		{"UDP to the NodePort, a remote backend", nodePort6, udp6, remoteBE6, true},
		{"TCP to the externalIP, a remote backend", ext, tcp6, remoteBE6, true},
		{"UDP to a NodePort that keeps the client", keep, udp6, localBE6, false},
	} {
		first := frame6(client6, c.front, c.proto, syn)
		var ret, mark uint32
		var out []byte
		got := grew(t, lb, func() { ret, out, mark = ingress6(t, lb, first) }, uplink6Counters...)
		if ret != actNext {
			t.Errorf("%s: verdict %d, want passed on", c.name, ret)
		}
		checkRewritten(t, c.name, first, out, true, c.be)
		if wantMark := map[bool]uint32{true: SNATMark, false: 0}[c.snat]; mark != wantMark {
			t.Errorf("%s: mark %#x, want %#x", c.name, mark, wantMark)
		}
		if got["uplink6_new_flow"] != 1 || got["uplink6_translated"] != 1 || got["uplink_translated"] != 0 || got["uplink_new_flow"] != 0 {
			t.Errorf("%s: counters grew %v", c.name, got)
		}
		if be, _, ok := flow6(lb, client6, c.front, c.proto, 0); !ok || be != c.be {
			t.Errorf("%s: flow entry %s (%v), want %s", c.name, be, ok, c.be)
		}
		if fe, _, ok := flow6(lb, c.be, client6, c.proto, 1); !ok || fe != c.front {
			t.Errorf("%s: reply entry %s (%v), want %s", c.name, fe, ok, c.front)
		}
		// The flow's next packet, no new flow.
		next := frame6(client6, c.front, c.proto, 0)
		got = grew(t, lb, func() { ret, out, _ = ingress6(t, lb, next) }, uplink6Counters...)
		checkRewritten(t, c.name+", next packet", next, out, true, c.be)
		if ret != actNext || got["uplink6_new_flow"] != 0 || got["uplink6_translated"] != 1 {
			t.Errorf("%s, next packet: verdict %d, counters grew %v", c.name, ret, got)
		}
		// The reply, from the frontend.
		reply := frame6(c.be, client6, c.proto, 0)
		got = grew(t, lb, func() { ret, out, mark = egress6(t, lb, reply) }, uplink6Counters...)
		checkRewritten(t, c.name+", reply", reply, out, false, c.front)
		if ret != actNext || mark != 0 || got["uplink6_reversed"] != 1 {
			t.Errorf("%s, reply: verdict %d, mark %#x, counters grew %v", c.name, ret, mark, got)
		}
	}
	// A packet of no flow leaves as it came: a backend's own connection
	// out, another port of the client.
	other := frame6(localBE6, netip.AddrPortFrom(clientIP6, 40001), tcp6, 0)
	if ret, out, _ := egress6(t, lb, other); ret != actNext || !bytes.Equal(out, other) {
		t.Errorf("a packet of no flow out: verdict %d, changed %v", ret, !bytes.Equal(out, other))
	}
	// A TCP packet without SYN of no flow is no new flow: a reply to the
	// node's own connection, say.
	ack := frame6(netip.AddrPortFrom(clientIP6, 40002), nodePort6, tcp6, 0)
	if ret, out, mark := ingress6(t, lb, ack); ret != actNext || mark != 0 || !bytes.Equal(out, ack) {
		t.Errorf("an ACK of no flow: verdict %d, mark %#x, changed %v", ret, mark, !bytes.Equal(out, ack))
	}
}

// Flows spread over the backends, and each keeps the backend its first
// packet got. A UDP flow whose backend leaves is forgotten both ways, to
// pick again.
func TestUplink6FlowsKeepTheirBackend(t *testing.T) {
	lb := uplink6LB(t)
	svc := uplinkService(nodeIP6, UDP, localBE6, remoteBE6)
	testutil.Must(t, lb.Sync([]Service{svc, uplinkService(nodeIP6, TCP, localBE6, remoteBE6)}, false))
	seen := map[netip.AddrPort]int{}
	for i := range 20 {
		client := netip.AddrPortFrom(clientIP6, uint16(41000+i))
		_, out, _ := ingress6(t, lb, frame6(client, nodePort6, udp6, 0))
		be := netip.AddrPortFrom(netip.AddrFrom16([16]byte(out[off6Dst:off6Dst+16])), binary.BigEndian.Uint16(out[off6Dport:]))
		seen[be]++
		for range 3 {
			_, again, _ := ingress6(t, lb, frame6(client, nodePort6, udp6, 0))
			if !bytes.Equal(again[off6Dst:off6Dport+2], out[off6Dst:off6Dport+2]) {
				t.Fatalf("flow %s moved from %s", client, be)
			}
		}
	}
	if len(seen) != 2 {
		t.Errorf("20 flows reached %v, want both backends", seen)
	}
	// The UDP flows of the backend that leaves go, both ways; the others stay.
	before := bpftest.Entries(t, lb.maps.OncLb6Flows)
	svc.Backends = svc.Backends[:1]
	testutil.Must(t, lb.Sync([]Service{svc, uplinkService(nodeIP6, TCP, localBE6, remoteBE6)}, false))
	if n := bpftest.Entries(t, lb.maps.OncLb6Flows); n != before-2*seen[remoteBE6] {
		t.Errorf("%d flow entries after %s left, want %d", n, remoteBE6, before-2*seen[remoteBE6])
	}
	for i := range 20 {
		client := netip.AddrPortFrom(clientIP6, uint16(41000+i))
		if be, _, ok := flow6(lb, client, nodePort6, udp6, 0); ok && be == remoteBE6 {
			t.Errorf("flow %s still goes to %s, which left", client, remoteBE6)
		}
	}
}

// A SYN picks afresh, even of a 5-tuple that had a backend; the same SYN
// sent again (its sequence number repeated: the SYN-ACK was lost) keeps
// the backend it got, so that one connection never meets two backends.
// Both families.
func TestUplinkSYNSentAgainKeepsItsBackend(t *testing.T) {
	for _, fam := range []struct {
		name                  string
		client, node          netip.Addr
		local, remote         netip.AddrPort
		newFlow               string
		offDst, offDport, len int
	}{
		{"IPv4", clientIP, nodeIP, localBE, remoteBE, "uplink_new_flow", 30, 36, 4},
		{"IPv6", clientIP6, nodeIP6, localBE6, remoteBE6, "uplink6_new_flow", off6Dst, off6Dport, 16},
	} {
		t.Run(fam.name, func(t *testing.T) {
			lb := uplink6LB(t)
			proto := TCP
			testutil.Must(t, lb.Sync([]Service{uplinkService(fam.node, proto, fam.local, fam.remote)}, false))
			client := netip.AddrPortFrom(fam.client, 42000)
			front := netip.AddrPortFrom(fam.node, nodePort)
			synWith := func(seq uint32) netip.AddrPort {
				t.Helper()
				f := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, client.Addr(), front.Addr(), tcp6, client.Port(), front.Port(), syn, 0)
				binary.BigEndian.PutUint32(f[fam.offDport+2:], seq)
				if fam.client.Is6() {
					bpftest.SetL4Checksum6(f)
				}
				_, out, _ := ingress6(t, lb, f)
				dst, _ := netip.AddrFromSlice(out[fam.offDst : fam.offDst+fam.len])
				return netip.AddrPortFrom(dst, binary.BigEndian.Uint16(out[fam.offDport:]))
			}
			seen := map[netip.AddrPort]int{}
			var be netip.AddrPort
			for i := range 20 {
				be = synWith(uint32(1000 + i))
				seen[be]++
				for range 3 {
					if again := synWith(uint32(1000 + i)); again != be {
						t.Fatalf("SYN %d sent again went to %s, first to %s", 1000+i, again, be)
					}
				}
			}
			if len(seen) != 2 {
				t.Errorf("20 SYNs of one 5-tuple reached %v, want both backends", seen)
			}
			if got := counter(t, lb, fam.newFlow); got != 20 {
				t.Errorf("%s %d, want 20: every SYN a new flow, none sent again", fam.newFlow, got)
			}
		})
	}
}

// A UDP datagram whose checksum is 0 (none: IPv6 forbids it) never leaves
// translated with 0, which would read as none again.
func TestUplink6UDPChecksumNeverZero(t *testing.T) {
	lb := uplink6LB(t)
	testutil.Must(t, lb.Sync([]Service{uplinkService(nodeIP6, UDP, localBE6)}, false))
	pkt := frame6(client6, nodePort6, udp6, 0)
	pkt[60], pkt[61] = 0, 0
	ret, out, _ := ingress6(t, lb, pkt)
	if ret != actNext || !bytes.Equal(out[off6Dst:off6Dst+16], localBE6.Addr().AsSlice()) {
		t.Fatalf("verdict %d, destination %x; want translated to %s", ret, out[off6Dst:off6Dst+16], localBE6)
	}
	if out[60] == 0 && out[61] == 0 {
		t.Error("translated with a UDP checksum of 0")
	}
}

// ClientIP affinity: a client's new flows meet the backend it met last,
// within the timeout and while that backend serves; onctl's affinities
// list the client.
func TestUplink6Affinity(t *testing.T) {
	lb := uplink6LB(t)
	svc := uplinkService(nodeIP6, TCP, localBE6, remoteBE6)
	svc.Affinity = time.Hour
	testutil.Must(t, lb.Sync([]Service{svc}, false))
	var first netip.AddrPort
	got := grew(t, lb, func() {
		for i := range 10 {
			_, out, _ := ingress6(t, lb, frame6(netip.AddrPortFrom(clientIP6, uint16(43000+i)), nodePort6, tcp6, syn))
			be := netip.AddrPortFrom(netip.AddrFrom16([16]byte(out[off6Dst:off6Dst+16])), binary.BigEndian.Uint16(out[off6Dport:]))
			if i == 0 {
				first = be
			} else if be != first {
				t.Fatalf("flow %d of the client went to %s, its first to %s", i, be, first)
			}
		}
	}, "uplink6_affinity_hit", "uplink6_new_flow", "uplink_affinity_hit")
	if got["uplink6_affinity_hit"] != 9 || got["uplink6_new_flow"] != 10 || got["uplink_affinity_hit"] != 0 {
		t.Errorf("counters grew %v, want 9 affinity hits in 10 new flows", got)
	}
	affs, err := lb.Affinities()
	testutil.Must(t, err)
	if len(affs) != 1 || affs[0].Pod != clientIP6 || affs[0].Backend != first || affs[0].Service != svc.Key() || affs[0].Netns != 0 {
		t.Errorf("affinities %+v, want the client %s with %s", affs, clientIP6, first)
	}
	// The remembered backend leaves: the next flow meets the other.
	var other netip.AddrPort
	for _, b := range svc.Backends {
		if b.Addr != first {
			other = b.Addr
			svc.Backends = []Backend{b}
		}
	}
	testutil.Must(t, lb.Sync([]Service{svc}, false))
	_, out, _ := ingress6(t, lb, frame6(netip.AddrPortFrom(clientIP6, 43100), nodePort6, tcp6, syn))
	checkRewritten(t, "after the remembered backend left", frame6(netip.AddrPortFrom(clientIP6, 43100), nodePort6, tcp6, syn), out, true, other)
}

// loadBalancerSourceRanges in IPv6: a client outside them is dropped, one
// inside served; the ranges follow the service, come back when they
// drift, are adopted by the next agent, and must be of the frontend's
// family.
func TestUplink6SourceRanges(t *testing.T) {
	lb := uplink6LB(t)
	inside := netip.AddrPortFrom(netip.MustParseAddr("2001:db8:1::7"), 40000)
	svc := uplinkService(nodeIP6, TCP, localBE6)
	svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("2001:db8:1::/48"), netip.MustParsePrefix("2001:db8:1:8000::/49")}
	testutil.Must(t, lb.Sync([]Service{svc}, false))
	var ret uint32
	got := grew(t, lb, func() { ret, _, _ = ingress6(t, lb, frame6(client6, nodePort6, tcp6, syn)) },
		"uplink6_source_range_drop", "uplink6_translated")
	if ret != actShot || got["uplink6_source_range_drop"] != 1 || got["uplink6_translated"] != 0 {
		t.Errorf("outside the ranges: verdict %d, counters grew %v; want dropped", ret, got)
	}
	pkt := frame6(inside, nodePort6, tcp6, syn)
	ret, out, _ := ingress6(t, lb, pkt)
	if ret != actNext {
		t.Errorf("inside the ranges: verdict %d", ret)
	}
	checkRewritten(t, "inside the ranges", pkt, out, true, localBE6)
	states, err := lb.Services()
	testutil.Must(t, err)
	if len(states) != 1 || states[0].Translated != 1 || states[0].Refused != 1 {
		t.Errorf("service counters %+v, want 1 translated and 1 refused", states)
	}

	// Read back without drift, nothing is rewritten (the live bank stays);
	// the narrower range deleted behind the agent's back comes back.
	id, bank := lb.services[svc.Key()].id, lb.services[svc.Key()].bank
	testutil.Must(t, lb.Sync([]Service{svc}, true))
	if p := lb.services[svc.Key()]; p.bank != bank {
		t.Error("a service whose source ranges did not drift was rewritten")
	}
	testutil.Must(t, lb.maps.OncLb6SourceRanges.Delete(srcRange{id, svc.SourceRanges[1]}.mapKey()))
	testutil.Must(t, lb.Sync([]Service{svc}, true))
	if n := bpftest.Entries(t, lb.maps.OncLb6SourceRanges); n != 2 {
		t.Errorf("%d source ranges after the repair, want 2", n)
	}
	// The next agent adopts them, and deletes a stray one.
	testutil.Must(t, lb.maps.OncLb6SourceRanges.Put(srcRange{id + 100, netip.MustParsePrefix("2001:db8:9::/48")}.mapKey(), uint8(1)))
	again, err := Open(lb.opts)
	testutil.Must(t, err)
	defer again.Close()
	if p := again.services[svc.Key()]; p == nil || len(p.ranges) != 2 || bpftest.Entries(t, again.maps.OncLb6SourceRanges) != 2 {
		t.Fatalf("adopted %+v, %d ranges in the map; want the service's 2", p, bpftest.Entries(t, again.maps.OncLb6SourceRanges))
	}
	testutil.Must(t, again.Sync([]Service{svc}, false))

	// An IPv4 range of an IPv6 frontend is refused.
	bad := svc
	bad.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	if err := again.Sync([]Service{bad}, false); err == nil {
		t.Error("an IPv4 source range of an IPv6 frontend was taken")
	}
	svc.SourceRanges = nil
	testutil.Must(t, again.Sync([]Service{svc}, false))
	if n := bpftest.Entries(t, again.maps.OncLb6SourceRanges); n != 0 {
		t.Errorf("%d source ranges left after the service dropped them", n)
	}
	if ret, _, _ := bpftest.RunMarked(t, again.objs.OncUplinkLbIngress, frame6(client6, nodePort6, tcp6, syn), 0); ret != actNext {
		t.Errorf("without ranges: verdict %d, want served", ret)
	}
}

// A source in the cluster's IPv6 pod CIDR, or this node's IPv6 address,
// is dropped as spoofed; the internal prefixes follow SetInternal, in
// each family's map.
func TestUplink6SpoofedSourceDropped(t *testing.T) {
	lb := uplink6LB(t)
	testutil.Must(t, lb.Sync([]Service{uplinkService(nodeIP6, TCP, localBE6)}, false))
	for _, src := range []netip.Addr{spoofIP6, nodeIP6} {
		var ret uint32
		got := grew(t, lb, func() { ret, _, _ = ingress6(t, lb, frame6(netip.AddrPortFrom(src, 40000), nodePort6, tcp6, syn)) },
			"uplink6_spoofed", "uplink6_translated")
		if ret != actShot || got["uplink6_spoofed"] != 1 || got["uplink6_translated"] != 0 {
			t.Errorf("from %s: verdict %d, counters grew %v; want dropped as spoofed", src, ret, got)
		}
	}
	if n4, n6 := bpftest.Entries(t, lb.maps.OncLbInternal), bpftest.Entries(t, lb.maps.OncLb6Internal); n4 != 2 || n6 != 2 {
		t.Errorf("internal prefixes: %d IPv4, %d IPv6; want 2 each", n4, n6)
	}
	testutil.Must(t, lb.SetInternal([]netip.Prefix{podCIDR}))
	if n4, n6 := bpftest.Entries(t, lb.maps.OncLbInternal), bpftest.Entries(t, lb.maps.OncLb6Internal); n4 != 1 || n6 != 0 {
		t.Errorf("internal prefixes after SetInternal(IPv4 only): %d IPv4, %d IPv6; want 1 and 0", n4, n6)
	}
	if ret, _, _ := ingress6(t, lb, frame6(netip.AddrPortFrom(spoofIP6, 40000), nodePort6, tcp6, syn)); ret != actNext {
		t.Errorf("from %s once the IPv6 pod CIDR is not internal: verdict %d", spoofIP6, ret)
	}
	if err := lb.SetInternal([]netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}); err == nil {
		t.Error("an IPv4-mapped internal prefix was taken")
	}
}

// Without backends a new flow is left to ip6tables' REJECT (marked,
// untouched), or dropped when the entry drops when empty.
func TestUplink6WithoutBackends(t *testing.T) {
	lb := uplink6LB(t)
	dropUDP := uplinkService(nodeIP6, UDP)
	dropUDP.DropWhenEmpty = true
	testutil.Must(t, lb.Sync([]Service{uplinkService(nodeIP6, TCP), dropUDP}, false))
	pkt := frame6(client6, nodePort6, tcp6, syn)
	var ret, mark uint32
	var out []byte
	got := grew(t, lb, func() { ret, out, mark = ingress6(t, lb, pkt) }, "uplink6_refused", "uplink6_no_endpoints_drop", "uplink_refused")
	if ret != actNext || mark != RejectMark || !bytes.Equal(out, pkt) || got["uplink6_refused"] != 1 || got["uplink_refused"] != 0 {
		t.Errorf("no backend: verdict %d, mark %#x, changed %v, counters grew %v; want marked for REJECT, untouched",
			ret, mark, !bytes.Equal(out, pkt), got)
	}
	got = grew(t, lb, func() { ret, _, mark = ingress6(t, lb, frame6(client6, nodePort6, udp6, 0)) }, "uplink6_refused", "uplink6_no_endpoints_drop")
	if ret != actShot || mark != 0 || got["uplink6_no_endpoints_drop"] != 1 || got["uplink6_refused"] != 0 {
		t.Errorf("no backend, drop when empty: verdict %d, mark %#x, counters grew %v; want dropped", ret, mark, got)
	}
}

// An IPv6 entry with direct server return whose backend is no fast-path
// peer's pod (this node knows no peer) is served as without: the packet
// translated for the stack and marked for SNAT, never wrapped
// (dsr6_test.go has the flows that are).
func TestUplink6DSRToNoPeerServedAsSNAT(t *testing.T) {
	lb := uplink6LB(t)
	svc := uplinkService(nodeIP6, TCP, remoteBE6)
	svc.DSR = true
	testutil.Must(t, lb.Sync([]Service{svc}, false))
	pkt := frame6(client6, nodePort6, tcp6, syn)
	ret, out, mark := ingress6(t, lb, pkt)
	checkRewritten(t, "DSR entry", pkt, out, true, remoteBE6)
	if ret != actNext || mark != SNATMark || counter(t, lb, "dsr6_sent") != 0 {
		t.Errorf("DSR entry: verdict %d, mark %#x, dsr6_sent %d; want the stack's, masqueraded", ret, mark, counter(t, lb, "dsr6_sent"))
	}
	if _, _, ok := flow6(lb, remoteBE6, client6, tcp6, 1); !ok {
		t.Error("no reply entry: the replies would come back untranslated")
	}
}

// What is not a TCP or UDP header right after the IPv6 header is never
// touched, either way: a fragment, a hop-by-hop option, ICMPv6 (neighbour
// discovery); nor a frame to the VXLAN port, the overlay guard's.
func TestUplink6LeavesOthersUntouched(t *testing.T) {
	lb := uplink6LB(t)
	vx := uplinkService(nodeIP6, UDP, localBE6)
	vx.Port = vxlanPort
	testutil.Must(t, lb.Sync([]Service{uplinkService(nodeIP6, TCP, localBE6), uplinkService(nodeIP6, UDP, localBE6), vx}, false))
	// Established first, so that a reply would be reversed.
	ingress6(t, lb, frame6(client6, nodePort6, tcp6, syn))
	ingress6(t, lb, frame6(client6, nodePort6, udp6, 0))
	icmp := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, clientIP6, nodeIP6, 58, 0, 0, 0, 24)
	icmp[54] = 135 // neighbour solicitation
	for _, c := range []struct {
		name string
		pkt  []byte
		out  bool // egress's
	}{
		{"a first fragment", withExt6(frame6(client6, nodePort6, udp6, 0), 44, []byte{udp6, 0, 0, 1, 0, 0, 0, 7}), false},
		{"a later fragment", withExt6(frame6(client6, nodePort6, udp6, 0), 44, []byte{udp6, 0, 0x05, 0x08, 0, 0, 0, 7}), false},
		{"a hop-by-hop option", withExt6(frame6(client6, nodePort6, tcp6, syn), 0, []byte{tcp6, 0, 1, 4, 0, 0, 0, 0}), false},
		{"a destination option", withExt6(frame6(client6, nodePort6, tcp6, 0), 60, []byte{tcp6, 0, 1, 4, 0, 0, 0, 0}), false},
		{"neighbour solicitation", icmp, false},
		{"the VXLAN port", frame6(client6, netip.AddrPortFrom(nodeIP6, vxlanPort), udp6, 0), false},
		{"a reply's fragment", withExt6(frame6(localBE6, client6, udp6, 0), 44, []byte{udp6, 0, 0, 1, 0, 0, 0, 7}), true},
		{"a reply with a destination option", withExt6(frame6(localBE6, client6, tcp6, 0), 60, []byte{tcp6, 0, 1, 4, 0, 0, 0, 0}), true},
		{"neighbour solicitation out", bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, nodeIP6, clientIP6, 58, 0, 0, 0, 24), true},
	} {
		run := ingress6
		if c.out {
			run = egress6
		}
		var ret, mark uint32
		var out []byte
		got := grew(t, lb, func() { ret, out, mark = run(t, lb, c.pkt) }, "uplink6_translated", "uplink6_reversed", "uplink6_new_flow")
		if ret != actNext || mark != 0 || !bytes.Equal(out, c.pkt) || got["uplink6_translated"]+got["uplink6_reversed"]+got["uplink6_new_flow"] != 0 {
			t.Errorf("%s: verdict %d, mark %#x, changed %v, counters grew %v; want passed on untouched", c.name, ret, mark, !bytes.Equal(out, c.pkt), got)
		}
	}
}

// withExt6 puts an extension header (next header value kind, its bytes
// ext, the first of which names what follows) between a frame6's IPv6
// header and its L4 header.
func withExt6(f []byte, kind uint8, ext []byte) []byte {
	b := slices.Concat(f[:54], ext, f[54:])
	b[20] = kind
	binary.BigEndian.PutUint16(b[18:], binary.BigEndian.Uint16(f[18:])+uint16(len(ext)))
	return b
}

// The bed of uplink_test.go in IPv6: a client namespace on the underlay,
// the node's with the programs on its uplink (n0, ahead of the fast
// path's) and ip6tables' rules, a local backend behind oncb0 and a
// "remote" one behind r0.
func newUplink6Bed(t *testing.T) *uplinkBed {
	t.Helper()
	return buildUplink6Bed(t, netip.Addr{}, fastpath.SetupOff)
}

// newFastUplink6Bed is newUplink6Bed's bed with the node's fast path over
// the underlay of endpoint (see uplink6NodeOver): its programs on the
// local backend's veth too, the backend its local pod, and ip6tables
// marking flows from outside ESTABLISHED, as the agent sets them up with
// the kube-proxy replacement.
func newFastUplink6Bed(t *testing.T, endpoint netip.Addr) *uplinkBed {
	t.Helper()
	return buildUplink6Bed(t, endpoint, fastpath.SetupOff)
}

// newOpeningUplink6Bed is newFastUplink6Bed's bed with connection setup on
// the fast path for the pods onc_open6 holds (none at first).
func newOpeningUplink6Bed(t *testing.T, endpoint netip.Addr) *uplinkBed {
	t.Helper()
	return buildUplink6Bed(t, endpoint, fastpath.SetupOpenPods)
}

// buildUplink6Bed builds the bed, with the fast path's marks and local pod
// over the underlay of endpoint when it is valid, connection setup as
// setup says.
func buildUplink6Bed(t *testing.T, endpoint netip.Addr, setup fastpath.ConnSetup) *uplinkBed {
	t.Helper()
	p := testutil.Prefix()
	b := &uplinkBed{t: t, client: p + "-cl", node: p + "-nd", be: p + "-be", rbe: p + "-rb"}
	for _, ns := range []string{b.client, b.node, b.be, b.rbe} {
		testutil.Netns(t, ns)
		ipIn(t, ns, "link", "set", "lo", "up")
		// Link-local addresses usable at once, as on a node up for a while:
		// the kernel solicits a neighbour for a forwarded packet only from
		// one (ndisc_send_ns).
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0", "net.ipv6.conf.all.accept_dad=0").CombinedOutput(); err != nil {
			t.Fatalf("accept_dad: %v: %s", err, out)
		}
	}
	veth6(t, b.node, "n0", nodeIP6.String()+"/64", b.client, "c0", clientIP6.String()+"/64")
	veth6(t, b.node, "oncb0", "fd00:10:244:1::1/64", b.be, "b1", localBE6.Addr().String()+"/64")
	veth6(t, b.node, "r0", remoteGW6.String()+"/64", b.rbe, "r1", remoteBE6.Addr().String()+"/64")
	ipIn(t, b.client, "-6", "route", "add", externalIP6.String()+"/128", "via", nodeIP6.String())
	ipIn(t, b.be, "-6", "route", "add", "default", "via", "fd00:10:244:1::1")
	ipIn(t, b.rbe, "-6", "route", "add", "default", "via", remoteGW6.String())
	ipIn(t, b.node, "-6", "route", "add", "default", "via", clientIP6.String())
	if out, err := exec.Command("ip", "netns", "exec", b.node, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1").CombinedOutput(); err != nil {
		t.Fatalf("forwarding: %v: %s", err, out)
	}
	serveWho(t, b.be, localBE6)
	serveWho(t, b.rbe, remoteBE6)
	fast := endpoint.IsValid()
	if !fast {
		endpoint = nodeIP
	}
	b.lb, b.fp = uplink6NodeWith(t, endpoint, setup)
	rules := netfilter.UplinkLB{SNATMark: SNATMark, RejectMark: RejectMark, LocalPods: netip.MustParsePrefix("10.244.1.0/24"), LocalPods6: localPods6}
	if fast {
		// As the agent sets it: conntrack's window falls behind the
		// packets the fast path carries.
		if out, err := exec.Command("ip", "netns", "exec", b.node, "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_be_liberal=1").CombinedOutput(); err != nil {
			t.Fatalf("be_liberal: %v: %s", err, out)
		}
	}
	podMAC := linkMAC(t, b.be, "b1")
	in(t, b.node, func() error {
		if err := netfilter.EnsureUplinkLB(rules); err != nil {
			return err
		}
		if fast {
			if err := netfilter.EnsureMark("onc.vxlan", netfilter.Marking{Mark: fastPathMark, Uplink: "n0", IPv6: true}); err != nil {
				return err
			}
			host, err := netlink.LinkByName("oncb0")
			if err != nil {
				return err
			}
			if err := b.fp.AttachPod("oncb0"); err != nil {
				return err
			}
			if err := b.fp.SetLocalPod(localBE6.Addr(), host.Attrs().Index, podMAC, host.Attrs().HardwareAddr); err != nil {
				return err
			}
		}
		// The fast path's programs behind ours, as on a node: they let
		// every packet that is no VXLAN frame on to the stack.
		if err := b.fp.AttachUplink("n0"); err != nil {
			return err
		}
		return b.lb.AttachUplink("n0")
	})
	return b
}

// veth6 is veth with IPv6 addresses, usable at once (no duplicate address
// detection).
func veth6(t *testing.T, a, an, aAddr, b, bn, bAddr string) {
	t.Helper()
	ipIn(t, a, "link", "add", an, "type", "veth", "peer", "name", bn, "netns", b)
	ipIn(t, a, "addr", "add", aAddr, "dev", an, "nodad")
	ipIn(t, b, "addr", "add", bAddr, "dev", bn, "nodad")
	ipIn(t, a, "link", "set", an, "up")
	ipIn(t, b, "link", "set", bn, "up")
}

// Real traffic over IPv6 to a NodePort and an externalIP, TCP and UDP: a
// local backend sees the client, a remote one this node (ip6tables'
// masquerade) unless the service keeps the client; the client sees the
// frontend answer. Neighbour discovery crosses the programs meanwhile.
func TestUplink6Bed(t *testing.T) {
	b := newUplink6Bed(t)
	for _, vip := range []netip.Addr{nodeIP6, externalIP6} {
		front := netip.AddrPortFrom(vip, nodePort)
		for _, c := range []struct {
			be         netip.AddrPort
			keepClient bool
			seenAs     netip.Addr
		}{
			{localBE6, false, clientIP6},
			{remoteBE6, false, remoteGW6},
			{localBE6, true, clientIP6},
		} {
			tcpSvc, udpSvc := uplinkService(vip, TCP, c.be), uplinkService(vip, UDP, c.be)
			tcpSvc.KeepClient, udpSvc.KeepClient = c.keepClient, c.keepClient
			testutil.Must(t, b.lb.Sync([]Service{tcpSvc, udpSvc}, false))
			got := b.delta(func() {
				for _, a := range []answer{b.tcp(netip.Addr{}, front), b.udp(false, front)} {
					if a.Err != nil || a.Backend != c.be.String() || a.SeenAs != c.seenAs.String() || a.From != front.String() {
						t.Errorf("to %s, backend %s, keep client %v: %+v; want seen as %s, from %s", front, c.be, c.keepClient, a, c.seenAs, front)
					}
				}
			}, "uplink6_new_flow", "uplink6_translated", "uplink6_reversed", "uplink_translated")
			if got["uplink6_new_flow"] != 2 || got["uplink6_translated"] < 4 || got["uplink6_reversed"] < 3 || got["uplink_translated"] != 0 {
				t.Errorf("to %s, backend %s: counters grew %v", front, c.be, got)
			}
		}
	}
}

// Over IPv6 without backends, TCP is reset and UDP gets a port unreachable
// (ip6tables' REJECT; for an externalIP nothing else would refuse); with
// DropWhenEmpty both time out.
func TestUplink6BedWithoutBackends(t *testing.T) {
	b := newUplink6Bed(t)
	for _, vip := range []netip.Addr{nodeIP6, externalIP6} {
		testutil.Must(t, b.lb.Sync([]Service{uplinkService(vip, TCP), uplinkService(vip, UDP)}, false))
		to := netip.AddrPortFrom(vip, nodePort)
		got := b.delta(func() {
			if a := b.tcp(netip.Addr{}, to); !errors.Is(a.Err, syscall.ECONNREFUSED) {
				t.Errorf("TCP to %s: %+v, want ECONNREFUSED", to, a)
			}
			if a := b.udp(true, to); !errors.Is(a.Err, syscall.ECONNREFUSED) {
				t.Errorf("UDP to %s: %+v, want ECONNREFUSED", to, a)
			}
		}, "uplink6_refused", "uplink6_translated")
		if got["uplink6_refused"] != 2 || got["uplink6_translated"] != 0 {
			t.Errorf("refused to %s: counters grew %v", to, got)
		}
	}
	tcpSvc, udpSvc := uplinkService(externalIP6, TCP), uplinkService(externalIP6, UDP)
	tcpSvc.DropWhenEmpty, udpSvc.DropWhenEmpty = true, true
	testutil.Must(t, b.lb.Sync([]Service{tcpSvc, udpSvc}, false))
	to := netip.AddrPortFrom(externalIP6, nodePort)
	if a := b.tcp(netip.Addr{}, to); !isTimeout(a.Err) {
		t.Errorf("TCP, drop when empty: %+v, want a timeout", a)
	}
	if a := b.udp(true, to); !isTimeout(a.Err) {
		t.Errorf("UDP, drop when empty: %+v, want a timeout", a)
	}
}
