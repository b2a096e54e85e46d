//go:build privileged

package services

// Direct server return for IPv6 frontends (include/services_dsr6.h), run
// with BPF_PROG_RUN on crafted packets against real maps, over both
// underlays: an IPv4 one (a dual-stack cluster's tunnels) and an IPv6
// one. The frame the balancing node sends, byte by byte, and what the
// backend's node takes from whom.

import (
	"bytes"
	"encoding/binary"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"testing"

	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// dsr6Underlay is one of the lab's two ways to carry IPv6 pods: tunnel
// endpoints (node 0's, the backend's node 1's, and a node that is no peer)
// and the nodes' IPv6 addresses their NodePorts are served on (on an IPv6
// underlay, the endpoints themselves).
type dsr6Underlay struct {
	name                string
	node0, node1, other netip.Addr // tunnel endpoints
	np0, np1            netip.Addr // IPv6 NodePort addresses
}

var (
	dsr6Underlays = []dsr6Underlay{
		{"ipv4 underlay", dsrNode0, dsrNode1, dsrOther, netip.MustParseAddr("fd00:192::1"), netip.MustParseAddr("fd00:192::2")},
		{"ipv6 underlay", netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2"), netip.MustParseAddr("2001:db8:1::9"),
			netip.MustParseAddr("2001:db8:1::1"), netip.MustParseAddr("2001:db8:1::2")},
	}
	dsr6Cluster = netip.MustParsePrefix("fd00:10:244::/56")
	dsr6Pods0   = netip.MustParsePrefix("fd00:10:244:1::/64")
	dsr6Pods1   = netip.MustParsePrefix("fd00:10:244:2::/64")
	dsr6Backend = netip.AddrPortFrom(netip.MustParseAddr("fd00:10:244:2::3"), 8080)
	dsr6Client  = netip.AddrPortFrom(netip.MustParseAddr("2001:db8:c::7"), 40000)
	dsr6ExtIP   = netip.MustParseAddr("2001:db8:e::10")
)

func (u dsr6Underlay) ipv6() bool { return u.node0.Is6() }

// node loads the fast path and the services programs of node 0 or 1 of a
// two-node cluster with IPv6 pods, as the agent fills their maps, flow
// events on.
func (u dsr6Underlay) node(t *testing.T, one bool) (*LB, *fastpath.Datapath) {
	t.Helper()
	self, peer, pods, peerPods := u.node0, u.node1, dsr6Pods0, dsr6Pods1
	pods4, peerPods4 := dsrPods0, dsrPods1
	if one {
		self, peer, pods, peerPods = u.node1, u.node0, dsr6Pods1, dsr6Pods0
		pods4, peerPods4 = dsrPods1, dsrPods0
	}
	opts := fastpath.Options{VNI: 1, Port: vxlanPort, Mark: fastPathMark, NodeIP: self, PodCIDRv6: pods, EventsPerSecond: 1000}
	peers := []fastpath.Peer{{PodCIDR: peerPods, NodeIP: peer}}
	sender := fastpath.Sender{NodeIP: peer, Sources: []netip.Prefix{peerPods, netip.PrefixFrom(peer, peer.BitLen())}}
	internal := []netip.Prefix{dsr6Cluster, netip.PrefixFrom(self, self.BitLen())}
	if !u.ipv6() { // dual-stack: IPv4 pods too
		opts.PodCIDR = pods4
		peers = append(peers, fastpath.Peer{PodCIDR: peerPods4, NodeIP: peer})
		sender.Sources = append(sender.Sources, peerPods4)
		internal = append(internal, netip.MustParsePrefix("10.244.0.0/16"))
	}
	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	opts.PinDir = dir
	fp, err := fastpath.Open(opts)
	testutil.Must(t, err)
	t.Cleanup(func() { fp.Close() })
	testutil.Must(t, fp.Configure(true))
	testutil.Must(t, fp.SyncPeers(peers, false))
	testutil.Must(t, fp.SyncSenders([]fastpath.Sender{sender}, false))
	testutil.Must(t, fp.SetHosts([]netip.Addr{u.node0, u.node1, u.other}, false))
	lb, err := Open(Options{PinDir: dir, IPv6: true, FlowCache: fp.FlowCache()})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	testutil.Must(t, lb.SetInternal(internal))
	if one {
		testutil.Must(t, fp.SetLocalPod(dsr6Backend.Addr(), 1, net.HardwareAddr{2, 0, 0, 0, 2, 3}, net.HardwareAddr{2, 0, 0, 0, 2, 1}))
	}
	return lb, fp
}

// dsr6Services is a NodePort of np and an IPv6 externalIP, each with the
// one backend on node 1, with direct return.
func dsr6Services(np netip.Addr) []Service {
	nps := uplinkService(np, TCP, dsr6Backend)
	ext := uplinkService(dsr6ExtIP, TCP, dsr6Backend)
	ext.Frontend, ext.Port = ExternalIP, 80
	nps.DSR, ext.DSR = true, true
	return []Service{nps, ext}
}

// vxlan6 wraps an inner frame in IPv6, UDP (checksum 0) and VXLAN, as the
// kernel's VXLAN device over an IPv6 underlay would.
func vxlan6(inner []byte, outerSrc, outerDst netip.Addr, vni uint32) []byte {
	b := make([]byte, 70, 70+len(inner))
	copy(b[0:6], bpftest.NICPeer)
	copy(b[6:12], bpftest.NICLocal)
	binary.BigEndian.PutUint16(b[12:], 0x86dd)
	ip := b[14:54]
	ip[0], ip[6], ip[7] = 0x60, unix.IPPROTO_UDP, 64
	binary.BigEndian.PutUint16(ip[4:], uint16(16+len(inner)))
	copy(ip[8:24], outerSrc.AsSlice())
	copy(ip[24:40], outerDst.AsSlice())
	binary.BigEndian.PutUint16(b[54:], 50000)
	binary.BigEndian.PutUint16(b[56:], vxlanPort)
	binary.BigEndian.PutUint16(b[58:], uint16(16+len(inner)))
	b[62] = 0x08
	binary.BigEndian.PutUint32(b[66:], vni<<8)
	return append(b, inner...)
}

// encap is a frame from outerSrc to outerDst (IPv4 or IPv6) around inner;
// the offset of its UDP header.
func encap(inner []byte, outerSrc, outerDst netip.Addr) ([]byte, int) {
	if outerSrc.Is6() {
		return vxlan6(inner, outerSrc, outerDst, 1), 54
	}
	return bpftest.VXLAN(inner, outerSrc, outerDst, 1), 34
}

// dsr6Frame is a DSR frame from outerSrc to outerDst for frontend fe, with
// the client's inner packet from src to dst: fe's port as the outer
// source port, its first 32 bits in VXLAN's reserved bits, its other 96
// as the inner Ethernet addresses.
func dsr6Frame(outerSrc, outerDst netip.Addr, fe netip.AddrPort, src, dst netip.AddrPort, proto uint8) []byte {
	inner := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, src.Addr(), dst.Addr(), proto, src.Port(), dst.Port(), 0, 10)
	if src.Addr().Is6() && proto != unix.IPPROTO_ICMPV6 {
		bpftest.SetL4Checksum6(inner)
	}
	b, udp := encap(inner, outerSrc, outerDst)
	a := fe.Addr().As16()
	if fe.Addr().Is4() {
		a4 := fe.Addr().As4()
		copy(a[:], a4[:])
	}
	binary.BigEndian.PutUint16(b[udp:], fe.Port())
	copy(b[udp+9:udp+12], a[:3])
	b[udp+15] = a[3]
	if fe.Addr().Is6() {
		copy(b[udp+16:udp+28], a[4:])
	}
	return b
}

// dsr6Bed is a network namespace where node 0's uplink d0 has its tunnel
// endpoint and a neighbour entry for node 1's, forwarding on: what the
// sending node's FIB lookup and MTU check read.
func dsr6Bed(t *testing.T, u dsr6Underlay) netns.Handle {
	t.Helper()
	ns := testutil.Prefix() + "-dsr6"
	testutil.Netns(t, ns)
	bits := "/24"
	if u.ipv6() {
		bits = "/64"
	}
	for _, args := range [][]string{
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"addr", "add", u.node0.String() + bits, "dev", "d0", "nodad"},
		{"link", "set", "d0", "up"},
		{"link", "set", "d1", "up"},
		{"link", "set", "lo", "up"},
		{"neigh", "add", u.node1.String(), "lladdr", bpftest.NICPeer.String(), "dev", "d0"},
	} {
		if !u.ipv6() && len(args) > 5 && args[5] == "nodad" {
			args = args[:5]
		}
		ipIn(t, ns, args...)
	}
	for _, sysctl := range []string{"net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"} {
		if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", sysctl).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", sysctl, err, out)
		}
	}
	h, err := netns.Open("/run/netns/" + ns)
	testutil.Must(t, err)
	t.Cleanup(func() { h.Close() })
	return h
}

// On node 0 an IPv6 client's SYN to its IPv6 NodePort leaves as a VXLAN
// frame to node 1 over either underlay, the frontend in the headers (its
// port as the outer source port, its address in the reserved bits and
// the inner Ethernet addresses), the inner packet to the backend with the
// client's address, one hop older, its checksum right; and no reply entry.
// Too big for the overlay, or at the end of its hop limit, a packet is
// dropped; once the backend's node left the peers, so is the flow's next
// packet, and the flow is forgotten, to pick afresh. A frontend in ::/32,
// and on an IPv6 underlay a peer's endpoint as the client, go through the
// stack instead (SNAT).
func TestDSR6SendsTheFrontendToTheBackendsNode(t *testing.T) {
	testutil.Privileged(t)
	for _, u := range dsr6Underlays {
		t.Run(u.name, func(t *testing.T) {
			h := dsr6Bed(t, u)
			testutil.Must(t, netns.Do(h, func() error {
				uplink, err := net.InterfaceByName("d0")
				if err != nil {
					return err
				}
				lb, fp := u.node(t, false)
				ev := bpftest.ReadEvents(t, fp.Events())
				low := uplinkService(netip.MustParseAddr("::5:1"), TCP, dsr6Backend) // in ::/32
				low.Frontend, low.Port, low.DSR = ExternalIP, 80, true
				testutil.Must(t, lb.Sync(append(dsr6Services(u.np0), low), false))
				front := netip.AddrPortFrom(u.np0, nodePort)
				run := func(pkt []byte) (uint32, []byte) {
					return bpftest.RunFrom(t, lb.objs.OncUplinkLbIngress, pkt, uplink.Index)
				}
				first := frame6(dsr6Client, front, tcp6, syn)
				sent := counter(t, lb, "dsr6_sent")
				ret, out := run(first)
				if ret != actRedirect {
					t.Fatalf("SYN: verdict %d, want redirected (%d); dsr6_no_route %d, dsr6_too_big %d", ret, actRedirect,
						counter(t, lb, "dsr6_no_route"), counter(t, lb, "dsr6_too_big"))
				}
				if d := counter(t, lb, "dsr6_sent") - sent; d != 1 {
					t.Errorf("dsr6_sent grew by %d, want 1", d)
				}
				hdr := 50
				if u.ipv6() {
					hdr = 70
				}
				out = out[:len(first)+hdr]
				udp := hdr - 16
				if u.ipv6() {
					outer := out[14:54]
					src, dst := netip.AddrFrom16([16]byte(outer[8:24])), netip.AddrFrom16([16]byte(outer[24:40]))
					if outer[0]>>4 != 6 || outer[6] != unix.IPPROTO_UDP || src != u.node0 || dst != u.node1 ||
						int(binary.BigEndian.Uint16(outer[4:])) != len(out)-54 {
						t.Errorf("outer IPv6 header %x: want UDP from %s to %s, payload %d", outer, u.node0, u.node1, len(out)-54)
					}
					if sum := binary.BigEndian.Uint16(out[udp+6:]); sum != 0 {
						t.Errorf("outer UDP checksum %#x, want 0 (as the VXLAN device sends, udp6zerocsumrx)", sum)
					}
				} else {
					outer := out[14:34]
					if src, dst := netip.AddrFrom4([4]byte(outer[12:16])), netip.AddrFrom4([4]byte(outer[16:20])); src != u.node0 || dst != u.node1 ||
						outer[9] != unix.IPPROTO_UDP || bpftest.IPChecksum(outer) != binary.BigEndian.Uint16(outer[10:]) {
						t.Errorf("outer IPv4 header %x: want UDP from %s to %s with a right checksum", outer, u.node0, u.node1)
					}
				}
				if sport, dport := binary.BigEndian.Uint16(out[udp:]), binary.BigEndian.Uint16(out[udp+2:]); sport != nodePort || dport != vxlanPort {
					t.Errorf("outer UDP %d → %d, want the frontend's port %d → %d", sport, dport, nodePort, vxlanPort)
				}
				fe := front.Addr().As16()
				// Flags I, the address's first three bytes; VNI 1, its fourth.
				if want := []byte{0x08, fe[0], fe[1], fe[2], 0, 0, 1, fe[3]}; !bytes.Equal(out[udp+8:udp+16], want) {
					t.Errorf("VXLAN header %x, want %x", out[udp+8:udp+16], want)
				}
				if eth := out[hdr : hdr+14]; !bytes.Equal(eth[:12], fe[4:]) || binary.BigEndian.Uint16(eth[12:]) != 0x86dd {
					t.Errorf("inner Ethernet header %x, want the frontend's last 12 bytes %x, type IPv6", eth, fe[4:])
				}
				inner := out[hdr:]
				if src, dst := netip.AddrFrom16([16]byte(inner[22:38])), netip.AddrFrom16([16]byte(inner[38:54])); src != dsr6Client.Addr() ||
					dst != dsr6Backend.Addr() || binary.BigEndian.Uint16(inner[56:]) != dsr6Backend.Port() || inner[21] != 63 {
					t.Errorf("inner packet %s → %s:%d, hop limit %d; want %s → %s, 63", src, dst, binary.BigEndian.Uint16(inner[56:]), inner[21],
						dsr6Client.Addr(), dsr6Backend)
				}
				if !bpftest.L4Checksum6OK(inner) {
					t.Error("the inner TCP checksum is wrong")
				}
				if _, _, ok := flow6(lb, dsr6Backend, dsr6Client, tcp6, 1); ok {
					t.Error("node 0 wrote a reply entry for a DSR flow")
				}

				big := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, dsr6Client.Addr(), front.Addr(), tcp6, dsr6Client.Port()+1, front.Port(), syn, 1500-40-20-10)
				if ret, _ := run(big); ret != actShot || counter(t, lb, "dsr6_too_big") != 1 {
					t.Errorf("a packet too big for the overlay: verdict %d, dsr6_too_big %d; want dropped, counted", ret, counter(t, lb, "dsr6_too_big"))
				}
				last := frame6(netip.AddrPortFrom(dsr6Client.Addr(), dsr6Client.Port()+2), front, tcp6, syn)
				last[21] = 1 // hop limit
				if ret, _ := run(last); ret != actShot || counter(t, lb, "dsr6_ttl_expired") != 1 {
					t.Errorf("a packet at the end of its hop limit: verdict %d, dsr6_ttl_expired %d; want dropped, counted", ret, counter(t, lb, "dsr6_ttl_expired"))
				}

				// Served by SNAT: a frontend a frame cannot carry, and on an
				// IPv6 underlay another node's host (the backend's node would
				// deliver the replies to itself).
				snat := []struct {
					name string
					pkt  []byte
				}{{"a frontend in ::/32", frame6(dsr6Client, netip.AddrPortFrom(low.VIP, 80), tcp6, syn)}}
				if u.ipv6() {
					snat = append(snat, struct {
						name string
						pkt  []byte
					}{"a SYN from node 1's host", frame6(netip.AddrPortFrom(u.node1, 40000), front, tcp6, syn)})
				}
				for _, c := range snat {
					sent = counter(t, lb, "dsr6_sent")
					ret, _, mark := bpftest.RunMarked(t, lb.objs.OncUplinkLbIngress, c.pkt, 0)
					if ret != actNext || mark != SNATMark || counter(t, lb, "dsr6_sent") != sent {
						t.Errorf("%s: verdict %d, mark %#x, dsr6_sent grew by %d; want passed on to the stack, masqueraded, none sent directly",
							c.name, ret, mark, counter(t, lb, "dsr6_sent")-sent)
					}
				}

				testutil.Must(t, fp.SyncPeers(nil, false))
				ack := frame6(dsr6Client, front, tcp6, 0)
				if ret, _ := run(ack); ret != actShot || counter(t, lb, "dsr6_no_route") != 1 {
					t.Errorf("the flow's next packet with its backend's node gone: verdict %d, dsr6_no_route %d; want dropped, counted", ret, counter(t, lb, "dsr6_no_route"))
				}
				if be, _, ok := flow6(lb, dsr6Client, front, tcp6, 0); ok {
					t.Errorf("the flow is still remembered (to %s): its next packet would meet the gone node again", be)
				}
				// Each drop is reported as IPv4's are, by the counter it
				// counted in, with the client's packet.
				var got []string
				for _, e := range ev.Collect("drop") {
					got = append(got, e.Reason)
					if e.Counters != "lb6_dsr_stat" || e.Src.Addr() != dsr6Client.Addr() || e.Dst != front {
						t.Errorf("drop event %+v, want of lb6_dsr_stat, from %s to %s", e, dsr6Client.Addr(), front)
					}
				}
				if want := []string{"dsr6_too_big", "dsr6_ttl_expired", "dsr6_no_route"}; !slices.Equal(got, want) {
					t.Errorf("drop events %q, want %q", got, want)
				}
				return nil
			}))
		})
	}
}

var dsr6Names = []string{"dsr6_received", "dsr6_drop_malformed", "dsr6_drop_sender", "dsr6_drop_client", "dsr6_drop_backend", "dsr6_drop_frontend"}

// Node 1 takes a peer's IPv6 DSR frame, over either underlay, for a
// client outside to its pod through a frontend it serves too:
// decapsulated for its stack (the outer Ethernet header typed IPv6, the
// client's packet after it), the reply's frontend recorded. Everything
// else it drops, counting why, each refusal apart; an ordinary frame it
// leaves to the overlay guard.
func TestDSR6ReceiveTakesOnlyWhatAPeerMaySend(t *testing.T) {
	for _, u := range dsr6Underlays {
		t.Run(u.name, func(t *testing.T) {
			lb, fp := u.node(t, true)
			ev := bpftest.ReadEvents(t, fp.Events())
			testutil.Must(t, lb.Sync(dsr6Services(u.np1), false))
			np0 := netip.AddrPortFrom(u.np0, nodePort)
			// Any address outside the cluster may front a NodePort this
			// node serves too: no node knows another's IPv6 addresses.
			otherAddrOf0 := netip.AddrPortFrom(netip.MustParseAddr("2001:db8:99::99"), nodePort)
			ext := netip.AddrPortFrom(dsr6ExtIP, 80)
			tcp := tcp6
			peerPod := netip.MustParseAddr("fd00:10:244:1::5")
			stranger := netip.MustParseAddr("198.51.100.50")
			if u.ipv6() {
				stranger = netip.MustParseAddr("2001:db8:c::50")
			}
			frame := func(outerSrc netip.Addr, fe netip.AddrPort, src, dst netip.AddrPort, proto uint8) []byte {
				return dsr6Frame(outerSrc, u.node1, fe, src, dst, proto)
			}
			udp := 34
			if u.ipv6() {
				udp = 54
			}
			withVNI := func(b []byte, vni uint32) []byte {
				b[udp+12], b[udp+13], b[udp+14] = byte(vni>>16), byte(vni>>8), byte(vni)
				return b
			}
			withFlags := func(b []byte, f byte) []byte { b[udp+8] = f; return b }
			// Passed on to the stack; out of an IPv4 tunnel, on a kernel
			// whose decapsulation cannot say IPv6, taken in again by the
			// uplink, which reads the type from the Ethernet header.
			taken := uint32(actNext)
			if decap6, err := fastpath.DecapSetsIPv6(); err != nil {
				t.Fatal(err)
			} else if !u.ipv6() && !decap6 {
				taken = actRedirect
			}
			cases := []struct {
				name string
				pkt  []byte
				drop string         // the counter of its drop; "" when taken
				fe   netip.AddrPort // taken: the reply's frontend
			}{
				{"node 0's NodePort", frame(u.node0, np0, dsr6Client, dsr6Backend, tcp), "", np0},
				{"an externalIP", frame(u.node0, ext, dsr6Client, dsr6Backend, tcp), "", ext},
				{"a NodePort on another address of node 0's", frame(u.node0, otherAddrOf0, dsr6Client, dsr6Backend, tcp), "", otherAddrOf0},
				{"a frontend nobody serves", frame(u.node0, netip.AddrPortFrom(dsr6ExtIP, 81), dsr6Client, dsr6Backend, tcp), "dsr6_drop_frontend", netip.AddrPort{}},
				{"a port no NodePort has", frame(u.node0, netip.AddrPortFrom(u.np0, nodePort+1), dsr6Client, dsr6Backend, tcp), "dsr6_drop_frontend", netip.AddrPort{}},
				{"a frontend in the pod CIDR", frame(u.node0, netip.AddrPortFrom(peerPod, nodePort), dsr6Client, dsr6Backend, tcp), "dsr6_drop_frontend", netip.AddrPort{}},
				{"a host that is no peer", frame(stranger, np0, dsr6Client, dsr6Backend, tcp), "dsr6_drop_sender", netip.AddrPort{}},
				{"a node that is no peer", frame(u.other, np0, dsr6Client, dsr6Backend, tcp), "dsr6_drop_sender", netip.AddrPort{}},
				{"for a pod of the peer", frame(u.node0, np0, netip.AddrPortFrom(peerPod, 40000), dsr6Backend, tcp), "dsr6_drop_client", netip.AddrPort{}},
				{"for a pod of another node", frame(u.node0, np0, netip.AddrPortFrom(netip.MustParseAddr("fd00:10:244:9::5"), 40000), dsr6Backend, tcp), "dsr6_drop_client", netip.AddrPort{}},
				{"to no pod of this node", frame(u.node0, np0, dsr6Client, netip.AddrPortFrom(netip.MustParseAddr("fd00:10:244:2::99"), 8080), tcp), "dsr6_drop_backend", netip.AddrPort{}},
				{"to the peer's pod (a relay)", frame(u.node0, np0, dsr6Client, netip.AddrPortFrom(peerPod, 8080), tcp), "dsr6_drop_backend", netip.AddrPort{}},
				{"another VNI", withVNI(frame(u.node0, np0, dsr6Client, dsr6Backend, tcp), 2), "dsr6_drop_malformed", netip.AddrPort{}},
				{"other VXLAN flags", withFlags(frame(u.node0, np0, dsr6Client, dsr6Backend, tcp), 0x88), "dsr6_drop_malformed", netip.AddrPort{}},
				{"ICMPv6 inside", frame(u.node0, np0, dsr6Client, dsr6Backend, unix.IPPROTO_ICMPV6), "dsr6_drop_malformed", netip.AddrPort{}},
				{"to another endpoint", dsr6Frame(u.node0, u.other, np0, dsr6Client, dsr6Backend, tcp), "dsr6_drop_malformed", netip.AddrPort{}},
			}
			if u.ipv6() {
				cases = append(cases, []struct {
					name string
					pkt  []byte
					drop string
					fe   netip.AddrPort
				}{
					{"for a peer's host", frame(u.node0, np0, netip.AddrPortFrom(u.node0, 40000), dsr6Backend, tcp), "dsr6_drop_client", netip.AddrPort{}},
					{"for this node", frame(u.node0, np0, netip.AddrPortFrom(u.node1, 40000), dsr6Backend, tcp), "dsr6_drop_client", netip.AddrPort{}},
					// IPv4's direct return runs over an IPv4 underlay only.
					{"an IPv4 client's", dsr6Frame(u.node0, u.node1, netip.AddrPortFrom(dsrExtIP, 80), dsrClient, dsrBackend, tcp), "dsr6_drop_malformed", netip.AddrPort{}},
				}...)
			}
			for _, c := range cases {
				before := map[string]uint64{}
				for _, n := range dsr6Names {
					before[n] = counter(t, lb, n)
				}
				ret, out := bpftest.Run(t, lb.objs.OncUplinkLbIngress, c.pkt, 0)
				want := "dsr6_received"
				if c.drop != "" {
					want = c.drop
					if ret != actShot {
						t.Errorf("%s: verdict %d, want dropped", c.name, ret)
					}
				} else {
					if ret != taken {
						t.Errorf("%s: verdict %d, want %d", c.name, ret, taken)
					}
					// The outer Ethernet header, typed IPv6, then the client's packet.
					hdr := udp + 30
					if got := out[12:54]; binary.BigEndian.Uint16(got) != 0x86dd || !bytes.Equal(got[2:], c.pkt[hdr:hdr+40]) {
						t.Errorf("%s: left %x after the Ethernet addresses, want type IPv6 and the inner IPv6 header %x", c.name, got, c.pkt[hdr:hdr+40])
					}
					if fe, _, ok := flow6(lb, dsr6Backend, dsr6Client, tcp, 1); !ok || fe != c.fe {
						t.Errorf("%s: reply entry %s (%v), want the frontend %s", c.name, fe, ok, c.fe)
					}
				}
				for _, n := range dsr6Names {
					d := counter(t, lb, n) - before[n]
					if (n == want) != (d == 1) || d > 1 {
						t.Errorf("%s: %s grew by %d", c.name, n, d)
					}
				}
			}
			// Each refusal is reported, by its counter (one a second per
			// flow and reason: the cases share flows), with the peer.
			drops, reported := map[string]bool{}, map[string]bool{}
			for _, c := range cases {
				if c.drop != "" {
					drops[c.drop] = true
				}
			}
			for _, e := range ev.Collect("drop") {
				reported[e.Reason] = true
				if e.Counters != "lb6_dsr_stat" || !e.Via.IsValid() {
					t.Errorf("drop event %+v, want of lb6_dsr_stat, from the frame's sender", e)
				}
			}
			if !maps.Equal(drops, reported) {
				t.Errorf("drop events of %v, want of %v", slices.Sorted(maps.Keys(reported)), slices.Sorted(maps.Keys(drops)))
			}
			// No frontend in it: the guard's and the VXLAN device's, untouched.
			inner := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, peerPod, dsr6Backend.Addr(), tcp, 40000, 8080, 0, 10)
			plain, _ := encap(inner, u.node0, u.node1)
			if ret, out := bpftest.Run(t, lb.objs.OncUplinkLbIngress, plain, 0); ret != actNext || !bytes.Equal(out[:len(plain)], plain) {
				t.Errorf("an ordinary frame: verdict %d, changed %v; want passed on as it is", ret, !bytes.Equal(out[:len(plain)], plain))
			}
		})
	}
}

// The NodePort address a peer's frame is checked against follows the
// Services: the least IPv6 address this node serves NodePorts on, none
// once it serves none, and back after a verifying sync finds the map
// changed behind the agent's back.
func TestDSR6NodePortAddressFollowsTheServices(t *testing.T) {
	lb, _ := dsr6Underlays[0].node(t, true)
	read := func() netip.Addr {
		var v [16]byte
		testutil.Must(t, lb.maps.OncLb6DsrNodeport.Lookup(uint32(0), &v))
		return netip.AddrFrom16(v)
	}
	hi, lo := netip.MustParseAddr("fd00:192::9"), netip.MustParseAddr("fd00:192::2")
	socket := uplinkService(netip.MustParseAddr("fd00:192::1"), TCP, dsr6Backend)
	socket.Scope = Socket
	testutil.Must(t, lb.Sync(append(dsr6Services(hi), dsr6Services(lo)[0], socket), false))
	if got := read(); got != lo {
		t.Errorf("with NodePorts on %s and %s: %s, want %s", hi, lo, got, lo)
	}
	testutil.Must(t, lb.Sync(dsr6Services(hi)[1:], false))
	if got := read(); got != netip.IPv6Unspecified() {
		t.Errorf("without NodePorts: %s, want none (::)", got)
	}
	testutil.Must(t, lb.Sync(dsr6Services(hi), false))
	testutil.Must(t, lb.maps.OncLb6DsrNodeport.Put(uint32(0), [16]byte{}))
	testutil.Must(t, lb.Sync(dsr6Services(hi), true))
	if got := read(); got != hi {
		t.Errorf("after a verifying sync: %s, want %s back", got, hi)
	}
}
