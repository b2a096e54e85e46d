//go:build privileged

package services

// Direct server return (include/services_dsr.h), run with BPF_PROG_RUN on
// crafted packets against real maps: the frame the balancing node sends,
// byte by byte, and what the backend's node takes from whom.

import (
	"bytes"
	"encoding/binary"
	"net"
	"net/netip"
	"os/exec"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

const (
	actShot     = 2
	actRedirect = 7
	actNext     = 0xffffffff // TC_ACT_UNSPEC: the next program on the link
	vxlanPort   = 4789
)

var (
	dsrNode0   = netip.MustParseAddr("192.0.2.1") // the node the client chose
	dsrNode1   = netip.MustParseAddr("192.0.2.2") // the backend's
	dsrOther   = netip.MustParseAddr("192.0.2.9") // a node that is no peer of node 1
	dsrPods0   = netip.MustParsePrefix("10.244.1.0/24")
	dsrPods1   = netip.MustParsePrefix("10.244.2.0/24")
	dsrBackend = netip.AddrPortFrom(netip.MustParseAddr("10.244.2.3"), 8080)
	dsrClient  = netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), 40000)
	dsrExtIP   = netip.MustParseAddr("203.0.113.10")
)

// dsrNode loads the fast path and the services programs of a node of a
// two-node cluster, as the agent fills their maps.
func dsrNode(t *testing.T, self, peer netip.Addr, pods, peerPods netip.Prefix) (*LB, *fastpath.Datapath) {
	t.Helper()
	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	fp, err := fastpath.Open(fastpath.Options{PinDir: dir, VNI: 1, Port: vxlanPort, Mark: fastPathMark, NodeIP: self, PodCIDR: pods})
	testutil.Must(t, err)
	t.Cleanup(func() { fp.Close() })
	testutil.Must(t, fp.Configure(true))
	testutil.Must(t, fp.SyncPeers([]fastpath.Peer{{PodCIDR: peerPods, NodeIP: peer}}, false))
	testutil.Must(t, fp.SyncSenders([]fastpath.Sender{{NodeIP: peer, Sources: []netip.Prefix{peerPods, netip.PrefixFrom(peer, 32)}}}, false))
	testutil.Must(t, fp.SetHosts([]netip.Addr{dsrNode0, dsrNode1, dsrOther}, false))
	lb, err := Open(Options{PinDir: dir, FlowCache: fp.FlowCache()})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	testutil.Must(t, lb.SetInternal([]netip.Prefix{netip.MustParsePrefix("10.244.0.0/16"), netip.PrefixFrom(self, 32)}))
	if pods == dsrPods1 {
		testutil.Must(t, fp.SetLocalPod(dsrBackend.Addr(), 1, net.HardwareAddr{2, 0, 0, 0, 2, 3}, net.HardwareAddr{2, 0, 0, 0, 2, 1}))
	}
	return lb, fp
}

// dsrServices is a NodePort of node's address and an externalIP, each with
// the one backend on node 1, with direct return.
func dsrServices(node netip.Addr) []Service {
	np := uplinkService(node, TCP, dsrBackend)
	ext := uplinkService(dsrExtIP, TCP, dsrBackend)
	ext.Frontend, ext.Port = ExternalIP, 80
	np.DSR, ext.DSR = true, true
	return []Service{np, ext}
}

// On node 0 a client's SYN to its NodePort leaves as a VXLAN frame to node
// 1 carrying the frontend: address in the reserved bits, port as the outer
// source port; the inner packet goes to the backend with the client's
// address, one hop older. Too big for the overlay, or at the end of its
// TTL, a packet is dropped; once the backend's node left the peers, so
// is the flow's next packet, and the flow is forgotten, to pick afresh. A
// node's host as the client goes through the stack instead.
func TestDSRSendsTheFrontendToTheBackendsNode(t *testing.T) {
	testutil.Privileged(t)
	ns := testutil.Prefix() + "-dsr"
	testutil.Netns(t, ns)
	for _, args := range [][]string{
		{"link", "add", "d0", "type", "veth", "peer", "name", "d1"},
		{"addr", "add", dsrNode0.String() + "/24", "dev", "d0"},
		{"link", "set", "d0", "up"},
		{"link", "set", "d1", "up"},
		{"link", "set", "lo", "up"},
		{"neigh", "add", dsrNode1.String(), "lladdr", bpftest.NICPeer.String(), "dev", "d0"},
	} {
		ipIn(t, ns, args...)
	}
	if out, err := exec.Command("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("ip_forward: %v: %s", err, out)
	}
	h, err := netns.Open("/run/netns/" + ns)
	testutil.Must(t, err)
	defer h.Close()
	testutil.Must(t, netns.Do(h, func() error {
		uplink, err := net.InterfaceByName("d0")
		if err != nil {
			return err
		}
		lb, fp := dsrNode(t, dsrNode0, dsrNode1, dsrPods0, dsrPods1)
		testutil.Must(t, lb.Sync(dsrServices(dsrNode0), false))
		front := netip.AddrPortFrom(dsrNode0, nodePort)
		syn := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, dsrClient.Addr(), front.Addr(), unix.IPPROTO_TCP,
			dsrClient.Port(), front.Port(), 0x02, 0)
		sent := counter(t, lb, "dsr_sent")
		ret, out := bpftest.RunFrom(t, lb.objs.OncUplinkLbIngress, syn, uplink.Index)
		if ret != actRedirect {
			t.Fatalf("SYN: verdict %d, want redirected (%d); dsr_no_route %d", ret, actRedirect, counter(t, lb, "dsr_no_route"))
		}
		if d := counter(t, lb, "dsr_sent") - sent; d != 1 {
			t.Errorf("dsr_sent grew by %d, want 1", d)
		}
		out = out[:len(syn)+50]
		outer, udp, vx, inner := out[14:34], out[34:42], out[42:50], out[64:]
		if got := netip.AddrFrom4([4]byte(outer[12:16])); got != dsrNode0 {
			t.Errorf("outer source %s, want %s", got, dsrNode0)
		}
		if got := netip.AddrFrom4([4]byte(outer[16:20])); got != dsrNode1 {
			t.Errorf("outer destination %s, want the backend's node %s", got, dsrNode1)
		}
		if outer[9] != unix.IPPROTO_UDP || bpftest.IPChecksum(outer) != binary.BigEndian.Uint16(outer[10:]) {
			t.Errorf("outer header %x: not UDP with a right checksum", outer)
		}
		if sport, dport := binary.BigEndian.Uint16(udp), binary.BigEndian.Uint16(udp[2:]); sport != nodePort || dport != vxlanPort {
			t.Errorf("outer UDP %d → %d, want the frontend's port %d → %d", sport, dport, nodePort, vxlanPort)
		}
		// Flags I, the address's first three bytes; VNI 1, its last.
		if want := []byte{0x08, 192, 0, 2, 0, 0, 1, 1}; !bytes.Equal(vx, want) {
			t.Errorf("VXLAN header %x, want %x", vx, want)
		}
		if src, dst := netip.AddrFrom4([4]byte(inner[12:16])), netip.AddrFrom4([4]byte(inner[16:20])); src != dsrClient.Addr() || dst != dsrBackend.Addr() ||
			binary.BigEndian.Uint16(inner[22:]) != dsrBackend.Port() || inner[8] != 63 {
			t.Errorf("inner packet %s → %s:%d, TTL %d; want %s → %s, TTL 63", src, dst, binary.BigEndian.Uint16(inner[22:]), inner[8], dsrClient.Addr(), dsrBackend)
		}
		// Its replies never come back here: no reply entry.
		var rev bpf.ServicesLbFlow
		key := bpf.ServicesLbFlowKey{Saddr: bpf.NetIPv4(dsrBackend.Addr()), Daddr: bpf.NetIPv4(dsrClient.Addr()),
			Sport: bpf.NetPort(dsrBackend.Port()), Dport: bpf.NetPort(dsrClient.Port()), Proto: unix.IPPROTO_TCP, Dir: 1}
		if err := lb.maps.OncLbFlows.Lookup(key, &rev); err == nil {
			t.Errorf("node 0 wrote a reply entry %+v for a DSR flow", rev)
		}

		big := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, dsrClient.Addr(), front.Addr(), unix.IPPROTO_TCP,
			dsrClient.Port()+1, front.Port(), 0x02, 1500-20-20-10)
		if ret, _ := bpftest.RunFrom(t, lb.objs.OncUplinkLbIngress, big, uplink.Index); ret != actShot || counter(t, lb, "dsr_too_big") != 1 {
			t.Errorf("a packet too big for the overlay: verdict %d, dsr_too_big %d; want dropped, counted", ret, counter(t, lb, "dsr_too_big"))
		}
		last := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, dsrClient.Addr(), front.Addr(), unix.IPPROTO_TCP,
			dsrClient.Port()+2, front.Port(), 0x02, 0)
		last[22] = 1 // TTL
		binary.BigEndian.PutUint16(last[24:], bpftest.IPChecksum(last[14:34]))
		if ret, _ := bpftest.RunFrom(t, lb.objs.OncUplinkLbIngress, last, uplink.Index); ret != actShot || counter(t, lb, "dsr_ttl_expired") != 1 {
			t.Errorf("a packet at the end of its TTL: verdict %d, dsr_ttl_expired %d; want dropped, counted", ret, counter(t, lb, "dsr_ttl_expired"))
		}

		// Another node's host is no client to answer directly: its
		// connection goes through the stack, masqueraded.
		fromNode := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, dsrNode1, front.Addr(), unix.IPPROTO_TCP, 40000, front.Port(), 0x02, 0)
		sent = counter(t, lb, "dsr_sent")
		if ret, _ := bpftest.RunFrom(t, lb.objs.OncUplinkLbIngress, fromNode, uplink.Index); ret != actNext || counter(t, lb, "dsr_sent") != sent {
			t.Errorf("a SYN from node 1's host: verdict %d, dsr_sent grew by %d; want it passed on to the stack, none sent directly", ret, counter(t, lb, "dsr_sent")-sent)
		}

		testutil.Must(t, fp.SyncPeers(nil, false))
		ack := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, dsrClient.Addr(), front.Addr(), unix.IPPROTO_TCP,
			dsrClient.Port(), front.Port(), 0, 0)
		if ret, _ := bpftest.RunFrom(t, lb.objs.OncUplinkLbIngress, ack, uplink.Index); ret != actShot || counter(t, lb, "dsr_no_route") != 1 {
			t.Errorf("the flow's next packet with its backend's node gone: verdict %d, dsr_no_route %d; want dropped, counted", ret, counter(t, lb, "dsr_no_route"))
		}
		var fwd bpf.ServicesLbFlow
		in := bpf.ServicesLbFlowKey{Saddr: bpf.NetIPv4(dsrClient.Addr()), Daddr: bpf.NetIPv4(front.Addr()),
			Sport: bpf.NetPort(dsrClient.Port()), Dport: bpf.NetPort(front.Port()), Proto: unix.IPPROTO_TCP}
		if err := lb.maps.OncLbFlows.Lookup(in, &fwd); err == nil {
			t.Errorf("the flow is still remembered (%+v): its next packet would meet the gone node again", fwd)
		}
		return nil
	}))
}

// dsrFrame is a DSR frame from outerSrc to node 1 for frontend fe, with
// the client's inner packet from src to dst.
func dsrFrame(outerSrc netip.Addr, fe netip.AddrPort, src, dst netip.AddrPort, proto uint8) []byte {
	inner := bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, src.Addr(), dst.Addr(), proto, src.Port(), dst.Port(), 0, 10)
	b := bpftest.VXLAN(inner, outerSrc, dsrNode1, 1)
	a := fe.Addr().As4()
	copy(b[43:46], a[:3])
	b[49] = a[3]
	binary.BigEndian.PutUint16(b[34:], fe.Port())
	return b
}

// Node 1 takes a peer's DSR frame for a client outside to its pod through
// a frontend it serves too: decapsulated for its stack, the reply's
// frontend recorded. Everything else it drops, counting why; an ordinary
// frame it leaves to the overlay guard.
func TestDSRReceiveTakesOnlyWhatAPeerMaySend(t *testing.T) {
	lb, _ := dsrNode(t, dsrNode1, dsrNode0, dsrPods1, dsrPods0)
	testutil.Must(t, lb.Sync(dsrServices(dsrNode1), false))
	nodePortOf0 := netip.AddrPortFrom(dsrNode0, nodePort)
	// Its ExternalIP, say: no node knows another's addresses but the
	// tunnel endpoint, so any address outside the cluster may front a
	// NodePort this node serves too.
	otherAddrOf0 := netip.AddrPortFrom(netip.MustParseAddr("198.51.100.99"), nodePort)
	ext := netip.AddrPortFrom(dsrExtIP, 80)
	tcp := uint8(unix.IPPROTO_TCP)
	withVNI := func(b []byte, vni uint32) []byte {
		b[46], b[47], b[48] = byte(vni>>16), byte(vni>>8), byte(vni)
		return b
	}
	withFlags := func(b []byte, f byte) []byte { b[42] = f; return b }
	for _, c := range []struct {
		name string
		pkt  []byte
		drop string         // the counter of its drop; "" when taken
		fe   netip.AddrPort // taken: the reply's frontend
	}{
		{"node 0's NodePort", dsrFrame(dsrNode0, nodePortOf0, dsrClient, dsrBackend, tcp), "", nodePortOf0},
		{"an externalIP", dsrFrame(dsrNode0, ext, dsrClient, dsrBackend, tcp), "", ext},
		{"a frontend nobody serves", dsrFrame(dsrNode0, netip.AddrPortFrom(dsrExtIP, 81), dsrClient, dsrBackend, tcp), "dsr_drop_frontend", netip.AddrPort{}},
		{"a NodePort on another address of node 0's", dsrFrame(dsrNode0, otherAddrOf0, dsrClient, dsrBackend, tcp), "", otherAddrOf0},
		{"a port no NodePort has", dsrFrame(dsrNode0, netip.AddrPortFrom(dsrNode0, nodePort+1), dsrClient, dsrBackend, tcp), "dsr_drop_frontend", netip.AddrPort{}},
		{"a frontend in the pod CIDR", dsrFrame(dsrNode0, netip.AddrPortFrom(netip.MustParseAddr("10.244.1.5"), nodePort), dsrClient, dsrBackend, tcp), "dsr_drop_frontend", netip.AddrPort{}},
		{"a host that is no peer", dsrFrame(netip.MustParseAddr("198.51.100.50"), nodePortOf0, dsrClient, dsrBackend, tcp), "dsr_drop_sender", netip.AddrPort{}},
		{"a node that is no peer", dsrFrame(dsrOther, nodePortOf0, dsrClient, dsrBackend, tcp), "dsr_drop_sender", netip.AddrPort{}},
		{"for a pod of the peer", dsrFrame(dsrNode0, nodePortOf0, netip.AddrPortFrom(netip.MustParseAddr("10.244.1.5"), 40000), dsrBackend, tcp), "dsr_drop_client", netip.AddrPort{}},
		{"for a pod of another node", dsrFrame(dsrNode0, nodePortOf0, netip.AddrPortFrom(netip.MustParseAddr("10.244.9.5"), 40000), dsrBackend, tcp), "dsr_drop_client", netip.AddrPort{}},
		{"for a node", dsrFrame(dsrNode0, nodePortOf0, netip.AddrPortFrom(dsrOther, 40000), dsrBackend, tcp), "dsr_drop_client", netip.AddrPort{}},
		{"for this node", dsrFrame(dsrNode0, nodePortOf0, netip.AddrPortFrom(dsrNode1, 40000), dsrBackend, tcp), "dsr_drop_client", netip.AddrPort{}},
		{"to no pod of this node", dsrFrame(dsrNode0, nodePortOf0, dsrClient, netip.AddrPortFrom(netip.MustParseAddr("10.244.2.99"), 8080), tcp), "dsr_drop_backend", netip.AddrPort{}},
		{"to the peer's pod (a relay)", dsrFrame(dsrNode0, nodePortOf0, dsrClient, netip.AddrPortFrom(netip.MustParseAddr("10.244.1.5"), 8080), tcp), "dsr_drop_backend", netip.AddrPort{}},
		{"another VNI", withVNI(dsrFrame(dsrNode0, nodePortOf0, dsrClient, dsrBackend, tcp), 2), "dsr_drop_malformed", netip.AddrPort{}},
		{"other VXLAN flags", withFlags(dsrFrame(dsrNode0, nodePortOf0, dsrClient, dsrBackend, tcp), 0x88), "dsr_drop_malformed", netip.AddrPort{}},
		{"ICMP inside", dsrFrame(dsrNode0, nodePortOf0, dsrClient, dsrBackend, unix.IPPROTO_ICMP), "dsr_drop_malformed", netip.AddrPort{}},
	} {
		before := map[string]uint64{}
		names := []string{"dsr_received", "dsr_drop_malformed", "dsr_drop_sender", "dsr_drop_client", "dsr_drop_backend", "dsr_drop_frontend"}
		for _, n := range names {
			before[n] = counter(t, lb, n)
		}
		ret, out := bpftest.Run(t, lb.objs.OncUplinkLbIngress, c.pkt, 0)
		want := "dsr_received"
		if c.drop != "" {
			want = c.drop
			if ret != actShot {
				t.Errorf("%s: verdict %d, want dropped", c.name, ret)
			}
		} else {
			if ret != actNext {
				t.Errorf("%s: verdict %d, want passed on to the stack", c.name, ret)
			}
			// The outer Ethernet header, then the client's packet.
			if got := out[14:34]; !bytes.Equal(got, c.pkt[64:84]) {
				t.Errorf("%s: left %x after the Ethernet header, want the inner IPv4 header %x", c.name, got, c.pkt[64:84])
			}
			var rev bpf.ServicesLbFlow
			key := bpf.ServicesLbFlowKey{Saddr: bpf.NetIPv4(dsrBackend.Addr()), Daddr: bpf.NetIPv4(dsrClient.Addr()),
				Sport: bpf.NetPort(dsrBackend.Port()), Dport: bpf.NetPort(dsrClient.Port()), Proto: tcp, Dir: 1}
			if err := lb.maps.OncLbFlows.Lookup(key, &rev); err != nil || rev.Ip != bpf.NetIPv4(c.fe.Addr()) || rev.Port != bpf.NetPort(c.fe.Port()) {
				t.Errorf("%s: reply entry %+v (%v), want the frontend %s", c.name, rev, err, c.fe)
			}
		}
		for _, n := range names {
			d := counter(t, lb, n) - before[n]
			if (n == want) != (d == 1) || d > 1 {
				t.Errorf("%s: %s grew by %d", c.name, n, d)
			}
		}
	}
	// No frontend in it: the guard's and the VXLAN device's, untouched.
	plain := bpftest.VXLAN(bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, netip.MustParseAddr("10.244.1.5"), dsrBackend.Addr(), tcp, 40000, 8080, 0, 10), dsrNode0, dsrNode1, 1)
	if ret, out := bpftest.Run(t, lb.objs.OncUplinkLbIngress, plain, 0); ret != actNext || !bytes.Equal(out[:len(plain)], plain) {
		t.Errorf("an ordinary frame: verdict %d, changed %v; want passed on as it is", ret, !bytes.Equal(out[:len(plain)], plain))
	}
}
