//go:build privileged

package fastpath

// Connection setup on the fast path in IPv6 (setup.go, flow6_setup in
// fastpath.c), over both underlays: BPF_PROG_RUN on each node's side of
// a TCP connection between IPv6 pods, the refusals, and the hand-over of
// such connections to a real conntrack in a throwaway namespace. The
// IPv4 twins are in setup_test.go.

import (
	"encoding/binary"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// The underlays a node's IPv6 pods talk over: IPv4 tunnels (a dual-stack
// node) or IPv6 ones.
var underlays6 = []struct {
	name string
	u6   bool
}{{"IPv4 underlay", false}, {"IPv6 underlay", true}}

// setupNode6 is setupNode for [localPod6] <-> [remotePod6] over the
// underlay u6 says: a node with connection setup on, whose local IPv6 pod
// no policy isolates if open, knowing the peer and the header to its
// node, and, with dest, where remotePod6 is. Its cache holds no flow.
func setupNode6(t *testing.T, u6, open, dest bool) *Datapath {
	return setupNode6With(t, u6, SetupOpenPods, map[netip.Addr]bool{localPod6: open}, dest)
}

func setupNode6With(t *testing.T, u6 bool, setup ConnSetup, open map[netip.Addr]bool, dest bool) *Datapath {
	t.Helper()
	var d *Datapath
	if u6 {
		d = openNode(t, Options{NodeIP: localNode6, PodCIDRv6: localCIDR6, ConnSetup: setup})
		testutil.Must(t, d.Configure(true))
		establishedU6(t, d)
		if !dest {
			testutil.Must(t, d.maps.OncEgress6U6.Delete(addr6{Addr: remotePod6.As16()}))
		}
	} else {
		d = openWith(t, Options{PodCIDRv6: localCIDR6, ConnSetup: setup})
		established6(t, d)
		testutil.Must(t, d.maps.OncFilter.Delete(FlowKey{LocalIp: bpf.NetIPv4(localPod), RemoteIp: bpf.NetIPv4(remotePod),
			LocalPort: bpf.NetPort(uint16(40000)), RemotePort: bpf.NetPort(uint16(80)), Proto: unix.IPPROTO_TCP}))
		if !dest {
			testutil.Must(t, d.maps.OncEgress6.Delete(addr6{Addr: remotePod6.As16()}))
		}
	}
	testutil.Must(t, d.maps.OncFilter6.Delete(flowKey6(localPod6, remotePod6, 40000, 80, unix.IPPROTO_TCP)))
	testutil.Must(t, d.SetOpen(open, false))
	return d
}

// pod6Sends is a packet of [localPod6]:sport -> [remotePod6]:dport on the
// local pod's veth.
func pod6Sends(sport, dport uint16, flags byte) []byte {
	return frame(hostMAC, podMAC, localPod6, remotePod6, unix.IPPROTO_TCP, sport, dport, flags, 10)
}

// peer6Sends is a packet of [remotePod6]:sport -> [localPod6]:dport as
// the peer's node sends it over the underlay u6 says.
func peer6Sends(u6 bool, sport, dport uint16, flags byte) []byte {
	inner := frame(vtepLocal, vtepPeer, remotePod6, localPod6, unix.IPPROTO_TCP, sport, dport, flags, 10)
	if u6 {
		return vxlan6(inner, peerNode6, localNode6, 1)
	}
	return vxlan(inner, peerNode, localNode, 1)
}

// seg6 is seg for an IPv6 pod's frame, bare or in a tunnel of either
// family.
func seg6(pkt []byte, seq, ack uint32) []byte {
	tcp := 14 + 40
	switch {
	case binary.BigEndian.Uint16(pkt[12:]) == 0x0800:
		tcp += 50 // an IPv4 tunnel's headers first
	case pkt[14+6] == unix.IPPROTO_UDP:
		tcp += 70 // an IPv6 tunnel's
	}
	binary.BigEndian.PutUint32(pkt[tcp+4:], seq)
	binary.BigEndian.PutUint32(pkt[tcp+8:], ack)
	return pkt
}

// bare6 clears the ACK bit of an IPv6 pod's TCP segment.
func bare6(pkt []byte) []byte {
	pkt[14+40+13] &^= ack
	return pkt
}

// onlyFlow6 is the one flow in the cache, an IPv6 one.
func onlyFlow6(t *testing.T, d *Datapath) Flow {
	t.Helper()
	f := onlyFlow(t, d)
	if !f.Local.Addr().Is6() {
		t.Fatalf("flow %+v, want an IPv6 one", f)
	}
	return f
}

// noFlows6 fails unless the cache holds no flow and follows no close, in
// either family.
func noFlows6(t *testing.T, d *Datapath, after string) {
	t.Helper()
	noFlows(t, d, after)
	if n := bpftest.Entries(t, d.maps.OncFin6); n != 0 {
		t.Fatalf("%s: %d closes still followed in onc_fin6; want the connection forgotten", after, n)
	}
}

// An IPv6 connection no policy can deny on either node opens, runs and
// closes on the fast path as an IPv4 one does, over either underlay.
func TestConnectionSetup6OnTheFastPath(t *testing.T) {
	for _, u := range underlays6 {
		t.Run(u.name, func(t *testing.T) {
			t.Run("client's node", func(t *testing.T) {
				d := setupNode6(t, u.u6, true, false) // no learned destination: the peer's CIDR says where
				verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), actRedirect, "the SYN")
				if stat6(t, d, "egress_open") != 1 || stat6(t, d, "egress_miss_tcp_flags") != 0 || stat(t, d, "egress_open") != 0 {
					t.Fatal("the SYN was not counted as opening its IPv6 connection")
				}
				if f := onlyFlow6(t, d); f.Opener != OpenedByLocal || !f.Egress || !f.Ingress || !f.Live || f.Closing ||
					f.Local != netip.AddrPortFrom(localPod6, clientPort) || f.Remote != netip.AddrPortFrom(remotePod6, 80) {
					t.Fatalf("flow %+v, want one opened by the local pod, both ways", f)
				}
				verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(u.u6, 80, clientPort, synAck), actRedirect, "the SYN-ACK")
				verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, ack), actRedirect, "the handshake's last ACK")
				verdictIs(t, d, d.progs.OncEgressFast, seg6(pod6Sends(clientPort, 80, finAck), 111, 501), actRedirect, "the client's FIN")
				if !onlyFlow6(t, d).Closing || bpftest.Entries(t, d.maps.OncFin6) != 1 || bpftest.Entries(t, d.maps.OncFin) != 0 {
					t.Fatal("a FIN went by, but the flow is not closing, or its close is not followed in onc_fin6")
				}
				verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u.u6, 80, clientPort, finAck), 501, 122), actRedirect, "the server's FIN")
				if f := onlyFlow6(t, d); f.Opener != OpenedByLocal {
					t.Fatalf("flow %+v after both FINs; want it kept for the last ACK", f)
				}
				verdictIs(t, d, d.progs.OncEgressFast, seg6(pod6Sends(clientPort, 80, ack), 122, 512), actRedirect, "the last ACK")
				if n := stat6(t, d, "egress_miss_tcp_flags") + stat6(t, d, "ingress_miss_tcp_flags"); n != 0 {
					t.Fatalf("%d packets of the connection took the slow path", n)
				}
				if stat6(t, d, "egress_hit") != 3 || stat6(t, d, "ingress_hit") != 2 {
					t.Fatalf("egress hits %d, ingress hits %d; want the connection's other packets counted as hits", stat6(t, d, "egress_hit"), stat6(t, d, "ingress_hit"))
				}
				noFlows6(t, d, "the last ACK went by")
			})
			t.Run("server's node, a half-close", func(t *testing.T) {
				d := openedByPeer6(t, u.u6)
				verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u.u6, clientPort, 80, finAck), 111, 501), actRedirect, "the client's FIN")
				verdictIs(t, d, d.progs.OncEgressFast, seg6(pod6Sends(80, clientPort, ack), 501, 122), actRedirect, "the server's data after it")
				verdictIs(t, d, d.progs.OncEgressFast, seg6(pod6Sends(80, clientPort, finAck), 511, 122), actRedirect, "the server's FIN")
				verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u.u6, clientPort, 80, ack), 122, 511), actRedirect, "an ACK of the data, after the FIN")
				if f := onlyFlow6(t, d); f.Opener != OpenedByRemote {
					t.Fatalf("flow %+v after an ACK that does not cover the server's FIN; want it kept", f)
				}
				verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u.u6, clientPort, 80, ack), 122, 522), actRedirect, "the last ACK")
				noFlows6(t, d, "the last ACK came in")
			})
			// A reset from the other end may be forged: it ends nothing,
			// and the pod's next packet takes the mark off.
			t.Run("server's node, a reset from the client", func(t *testing.T) {
				d := openedByPeer6(t, u.u6)
				verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(u.u6, clientPort, 80, rstAck), actRedirect, "the client's RST")
				if f := onlyFlow6(t, d); f.Opener != OpenedByRemote || !f.Closing {
					t.Fatalf("flow %+v after the client's RST; want it kept, closing", f)
				}
				verdictIs(t, d, d.progs.OncEgressFast, seg6(pod6Sends(80, clientPort, ack), 501, 111), actRedirect, "the pod's challenge ACK")
				if f := onlyFlow6(t, d); f.Opener != OpenedByRemote || f.Closing {
					t.Fatalf("flow %+v after the pod answered; want it kept, not closing", f)
				}
			})
			t.Run("server's node, the server resetting", func(t *testing.T) {
				d := openedByPeer6(t, u.u6)
				verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u.u6, clientPort, 80, finAck), 111, 501), actRedirect, "the client's FIN")
				verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(80, clientPort, rstAck), actRedirect, "the server's RST")
				noFlows6(t, d, "the server reset the connection")
			})
			// SYN_SENT's bare RST to a bad SYN-ACK keeps the connection;
			// the real SYN-ACK still rides.
			t.Run("client's node, a bare RST in the handshake", func(t *testing.T) {
				d := setupNode6(t, u.u6, true, true)
				verdictIs(t, d, d.progs.OncEgressFast, seg6(pod6Sends(clientPort, 80, syn), 100, 0), actRedirect, "the client's SYN")
				verdictIs(t, d, d.progs.OncEgressFast, bare6(seg6(pod6Sends(clientPort, 80, rstAck), 7, 0)), actRedirect, "its bare RST to a forged SYN-ACK")
				if f := onlyFlow6(t, d); f.Opener != OpenedByLocal || f.Closing {
					t.Fatalf("flow %+v after the bare RST; want the connection kept, not closing", f)
				}
				verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u.u6, 80, clientPort, synAck), 500, 101), actRedirect, "the real SYN-ACK")
			})
		})
	}
}

// openedByPeer6 is openedByPeer in IPv6: a server's node with a
// connection the client's SYN opened on the fast path, its handshake done
// (the client's next sequence number is 111, the server's 501).
func openedByPeer6(t *testing.T, u6 bool) *Datapath {
	t.Helper()
	d := setupNode6(t, u6, true, false) // no packet went to the client's pod before
	verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u6, clientPort, 80, syn), 100, 0), actRedirect, "the SYN")
	if stat6(t, d, "ingress_open") != 1 || stat(t, d, "ingress_open") != 0 {
		t.Fatal("the SYN was not counted as opening its IPv6 connection")
	}
	if f := onlyFlow6(t, d); f.Opener != OpenedByRemote || f.Local != netip.AddrPortFrom(localPod6, 80) || f.Remote != netip.AddrPortFrom(remotePod6, clientPort) {
		t.Fatalf("flow %+v, want one opened by the remote pod", f)
	}
	// The way back is the client's CIDR's owner, learned or not.
	verdictIs(t, d, d.progs.OncEgressFast, seg6(pod6Sends(80, clientPort, synAck), 490, 101), actRedirect, "the SYN-ACK")
	verdictIs(t, d, d.progs.OncIngressFast, seg6(peer6Sends(u6, clientPort, 80, ack), 101, 501), actRedirect, "the handshake's last ACK")
	return d
}

// Whatever policy could deny, or the fast path could not carry whole,
// opens through conntrack, and leaves nothing in the cache.
func TestConnectionSetup6Refusals(t *testing.T) {
	cases := []struct {
		name    string
		open    map[netip.Addr]bool
		prepare func(t *testing.T, d *Datapath, u6 bool)
		ingress bool // the SYN comes from the peer
		counter string
	}{
		{"the client's pod isolated", map[netip.Addr]bool{localPod6: false}, nil, false, "egress_miss_tcp_flags"},
		{"the server's pod isolated", map[netip.Addr]bool{localPod6: false}, nil, true, "ingress_miss_tcp_flags"},
		// A pod's IPv4 address open says nothing of its IPv6 one.
		{"only the pod's IPv4 address open", map[netip.Addr]bool{localPod: true}, nil, false, "egress_miss_tcp_flags"},
		{"only the server's IPv4 address open", map[netip.Addr]bool{localPod: true}, nil, true, "ingress_miss_tcp_flags"},
		{"learning paused (an eviction runs)", map[netip.Addr]bool{localPod6: true}, func(t *testing.T, d *Datapath, _ bool) {
			c, err := d.config()
			testutil.Must(t, err)
			c.Learning = 0
			testutil.Must(t, d.maps.OncCfg.Put(uint32(0), c))
		}, true, "ingress_miss_tcp_flags"},
		{"another pod's address (spoofed)", map[netip.Addr]bool{localPod6: true}, func(t *testing.T, d *Datapath, _ bool) {
			testutil.Must(t, d.SetLocalPod(localPod6, 99, podMAC, hostMAC))
		}, false, "egress_miss_spoof"},
		{"no header to the server's node", map[netip.Addr]bool{localPod6: true}, deleteHeader6, false, "egress_miss_encap"},
		{"no header back to the client's node", map[netip.Addr]bool{localPod6: true}, deleteHeader6, true, "ingress_miss_reply"},
	}
	for _, u := range underlays6 {
		for _, c := range cases {
			t.Run(u.name+"/"+c.name, func(t *testing.T) {
				d := setupNode6With(t, u.u6, SetupOpenPods, c.open, !c.ingress)
				if c.prepare != nil {
					c.prepare(t, d, u.u6)
				}
				prog, pkt := d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn)
				if c.ingress {
					prog, pkt = d.progs.OncIngressFast, peer6Sends(u.u6, clientPort, 80, syn)
				}
				if ret, out := run(t, prog, pkt, 0); ret != actOK || string(out) != string(pkt) {
					t.Fatalf("verdict %d; want the SYN on the slow path, unchanged", ret)
				}
				if stat6(t, d, c.counter) != 1 || stat6(t, d, "egress_open")+stat6(t, d, "ingress_open") != 0 {
					t.Fatalf("counter %s did not count the SYN, or it counted as opened", c.counter)
				}
				if flows, err := d.Flows(); err != nil || len(flows) != 0 {
					t.Fatalf("the refused SYN left flows %+v (%v)", flows, err)
				}
			})
		}
	}
	// Without the switch the fast path never opens an IPv6 connection.
	t.Run("connection setup off", func(t *testing.T) {
		d := setupNode6With(t, false, SetupOff, map[netip.Addr]bool{localPod6: true}, true)
		if ret, _ := run(t, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), 0); ret != actOK || stat6(t, d, "egress_open") != 0 {
			t.Fatal("an IPv6 SYN took the fast path with connection setup off")
		}
	})
}

// deleteHeader6 deletes the learned header to the peer's node.
func deleteHeader6(t *testing.T, d *Datapath, u6 bool) {
	if u6 {
		testutil.Must(t, d.maps.OncEncapU6.Delete(addr6{Addr: peerNode6.As16()}))
		return
	}
	testutil.Must(t, d.maps.OncEncap.Delete(bpf.NetIPv4(peerNode)))
}

// Where no NetworkPolicy runs, every IPv6 pod is open too.
func TestConnectionSetup6ForEveryPodWithoutPolicy(t *testing.T) {
	for _, u := range underlays6 {
		t.Run(u.name, func(t *testing.T) {
			d := setupNode6With(t, u.u6, SetupEveryPod, nil, true)
			if ret, _ := run(t, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), 0); ret != actRedirect || stat6(t, d, "egress_open") != 1 {
				t.Fatalf("verdict %d: the IPv6 SYN of a pod no policy can isolate did not open on the fast path", ret)
			}
		})
	}
}

// A connection the slow path opened closes through conntrack, and a
// SYN-ACK rides only as the answer to the SYN that opened its IPv6
// connection; one opened in an earlier epoch is no longer the fast path's.
func TestConnectionSetup6OnlyForWhatTheFastPathOpened(t *testing.T) {
	d := setupNode6(t, false, true, true)
	key := flowKey6(localPod6, remotePod6, clientPort, 80, unix.IPPROTO_TCP)
	testutil.Must(t, d.maps.OncFilter6.Put(key, FlowVal{Egress: 1, Ingress: 1})) // learned from the slow path
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, 0), actRedirect, "data of the learned flow")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, finAck), actOK, "its FIN")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, 80, clientPort, synAck), actOK, "a SYN-ACK on its ports")
	if flows, _ := d.Flows(); len(flows) != 0 {
		t.Fatal("a SYN-ACK of a connection conntrack opened did not forget the cached flow")
	}
	testutil.Must(t, d.maps.OncFilter6.Put(key, FlowVal{Egress: 1, Ingress: 1, Opener: uint8(OpenedByRemote)}))
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, 80, clientPort, synAck), actOK, "a SYN-ACK to the local pod on the entry of one the remote pod opened")
	testutil.Must(t, d.maps.OncFilter6.Put(key, FlowVal{Egress: 1, Ingress: 1, Opener: uint8(OpenedByLocal)}))
	c, err := d.config()
	testutil.Must(t, err)
	c.Epoch++
	testutil.Must(t, d.maps.OncCfg.Put(uint32(0), c))
	// Refused by connection setup itself (a FIN that must take the stack),
	// not merely by the flow check further on.
	flags, flow := stat6(t, d, "egress_miss_tcp_flags"), stat6(t, d, "egress_miss_flow")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, finAck), actOK, "a FIN of a connection opened in an earlier epoch")
	if stat6(t, d, "egress_miss_tcp_flags") != flags+1 || stat6(t, d, "egress_miss_flow") != flow {
		t.Fatal("the FIN of an earlier epoch's connection was not sent to the stack as a FIN")
	}
}

// ctEntry is a TCP connection in conntrack, as `conntrack -L` lists it:
// its original direction ("src -> dst"), timeout and line.
type ctEntry struct {
	conn    string
	timeout int
	line    string
}

// conntrackTCP lists the TCP connections of family ("ipv4" or "ipv6") in
// the current network namespace's conntrack.
func conntrackTCP(t *testing.T, family string) map[string]ctEntry {
	t.Helper()
	out, err := exec.Command("conntrack", "-L", "-f", family, "-p", "tcp").CombinedOutput()
	if err != nil {
		t.Fatalf("conntrack -L -f %s: %v: %s", family, err, out)
	}
	entries := map[string]ctEntry{}
	for _, line := range strings.Split(string(out), "\n") {
		if !strings.HasPrefix(line, "tcp") {
			continue
		}
		timeout, _ := strconv.Atoi(strings.Fields(line)[2])
		var src, dst netip.Addr
		var sport, dport uint16
		for _, f := range strings.Fields(line) {
			k, v, _ := strings.Cut(f, "=")
			switch {
			case k == "src" && !src.IsValid():
				src = netip.MustParseAddr(v)
			case k == "dst" && !dst.IsValid():
				dst = netip.MustParseAddr(v)
			case k == "sport" && sport == 0:
				n, _ := strconv.Atoi(v)
				sport = uint16(n)
			case k == "dport" && dport == 0:
				n, _ := strconv.Atoi(v)
				dport = uint16(n)
			}
		}
		conn := connString(netip.AddrPortFrom(src, sport), netip.AddrPortFrom(dst, dport))
		entries[conn] = ctEntry{conn, timeout, line}
	}
	return entries
}

func connString(client, server netip.AddrPort) string {
	return client.String() + " -> " + server.String()
}

// expectHandedOver fails unless conntrack (entries, from conntrackTCP)
// has exactly the connections want, each ESTABLISHED, replied and
// assured; those of short with the reset connection's timeout.
func expectHandedOver(t *testing.T, entries map[string]ctEntry, want []string, short ...string) {
	t.Helper()
	for _, conn := range want {
		e, ok := entries[conn]
		if !ok {
			t.Errorf("%s not handed over to conntrack", conn)
			continue
		}
		if !strings.Contains(e.line, "ESTABLISHED") || !strings.Contains(e.line, "[ASSURED]") || strings.Contains(e.line, "UNREPLIED") {
			t.Errorf("conntrack has %q; want it ESTABLISHED, replied, assured", e.line)
		}
		if s := slices.Contains(short, conn); s != (e.timeout <= resetTimeout) {
			t.Errorf("conntrack has %q with timeout %d s: want at most %d s only for a reset connection", e.line, e.timeout, resetTimeout)
		}
	}
	for conn, e := range entries {
		if !slices.Contains(want, conn) {
			t.Errorf("conntrack has %q; want only %v", e.line, want)
		}
	}
}

// Switched off, the fast path hands the IPv6 connections it opened over
// to conntrack as it does IPv4's, both families at once: ESTABLISHED from
// the end that sent the SYN, a half-closed one too, a reset one with a
// short timeout, not one that is over; an IPv6 entry the slow path picked
// up with the roles swapped is replaced.
func TestHandOver6GivesConntrackTheConnections(t *testing.T) {
	d := setupNode6With(t, false, SetupOpenPods, map[netip.Addr]bool{localPod: true, localPod6: true}, true)
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), actRedirect, "the local pod's SYN")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, clientPort+1, 8080, syn), actRedirect, "the remote pod's SYN")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, clientPort+1, 8080, finAck), actRedirect, "the remote pod's FIN")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort+2, 80, syn), actRedirect, "a SYN of a connection reset next")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, 80, clientPort+2, rstAck), actRedirect, "its RST")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort+3, 80, syn), actRedirect, "a SYN of a connection closed next")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort+3, 80, finAck), actRedirect, "its FIN")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, 80, clientPort+3, finAck), actRedirect, "the FIN back")
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort+4, 80, syn), actRedirect, "an IPv4 connection's SYN")
	if bpftest.Entries(t, d.maps.OncFin6) == 0 {
		t.Fatal("no IPv6 close followed before the hand-over")
	}
	first := connString(netip.AddrPortFrom(localPod6, clientPort), netip.AddrPortFrom(remotePod6, 80))
	second := connString(netip.AddrPortFrom(remotePod6, clientPort+1), netip.AddrPortFrom(localPod6, 8080))
	reset := connString(netip.AddrPortFrom(localPod6, clientPort+2), netip.AddrPortFrom(remotePod6, 80))
	v4 := connString(netip.AddrPortFrom(localPod, clientPort+4), netip.AddrPortFrom(remotePod, 80))
	var ct4, ct6 map[string]ctEntry
	testutil.InNewNetns(t, "handover6", func() {
		// The first connection, as the slow path would pick it up from
		// its server.
		swapped := &netlink.ConntrackFlow{FamilyType: unix.AF_INET6, TimeOut: 60,
			Forward:   netlink.IPTuple{SrcIP: remotePod6.AsSlice(), DstIP: localPod6.AsSlice(), SrcPort: 80, DstPort: clientPort, Protocol: unix.IPPROTO_TCP},
			Reverse:   netlink.IPTuple{SrcIP: localPod6.AsSlice(), DstIP: remotePod6.AsSlice(), SrcPort: clientPort, DstPort: 80, Protocol: unix.IPPROTO_TCP},
			ProtoInfo: &netlink.ProtoInfoTCP{State: nl.TCP_CONNTRACK_ESTABLISHED}}
		testutil.Must(t, netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET6, swapped))
		testutil.Must(t, d.Configure(false))
		ct4, ct6 = conntrackTCP(t, "ipv4"), conntrackTCP(t, "ipv6")
	})
	expectHandedOver(t, ct6, []string{first, second, reset}, reset)
	expectHandedOver(t, ct4, []string{v4})
	flows, err := d.Flows()
	testutil.Must(t, err)
	handed := 0
	for _, f := range flows {
		if f.Opener == OpenedBySlowPath {
			handed++
		}
	}
	if handed != 3 || len(flows) != 4 {
		t.Errorf("flows after the hand-over %+v: want the three live ones (two IPv6, one IPv4) handed over, the reset one gone, the closed one left", flows)
	}
	if n := bpftest.Entries(t, d.maps.OncFin6); n != 1 {
		t.Errorf("%d closes followed after the hand-over; want only the closed connection's", n)
	}
}

// A policy change gives decide the IPv6 connections the fast path opened
// of the pods it concerns, and does with each what the verdict says: one
// handed over goes to conntrack and stays in the cache as the slow
// path's, one evicted leaves the cache with its close.
func TestEvictFlows6HandsOverTheConnectionsTheFastPathOpened(t *testing.T) {
	d := setupNode6(t, false, true, true)
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), actRedirect, "the local pod's SYN")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, clientPort+1, 8080, syn), actRedirect, "the remote pod's SYN")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(false, clientPort+1, 8080, finAck), actRedirect, "the remote pod's FIN")
	learned := flowKey6(localPod6, remotePod6, 40000, 80, unix.IPPROTO_TCP)
	testutil.Must(t, d.maps.OncFilter6.Put(learned, FlowVal{Egress: 1, Ingress: 1}))
	handed := Conn{Client: netip.AddrPortFrom(localPod6, clientPort), Server: netip.AddrPortFrom(remotePod6, 80), Proto: unix.IPPROTO_TCP}
	evicted := Conn{Client: netip.AddrPortFrom(remotePod6, clientPort+1), Server: netip.AddrPortFrom(localPod6, 8080), Proto: unix.IPPROTO_TCP}
	var got []Conn
	judged := map[netip.AddrPort]int{}
	var ct map[string]ctEntry
	testutil.InNewNetns(t, "evict6", func() {
		testutil.Must(t, d.EvictFlows(map[netip.Addr]bool{localPod6: true}, func(opened []Conn) (func(local, remote netip.AddrPort, proto uint8, opener Opener) Verdict, error) {
			got = opened
			return func(local, _ netip.AddrPort, _ uint8, opener Opener) Verdict {
				judged[local]++
				switch local.Port() {
				case clientPort:
					return HandOver
				case 8080:
					return Evict
				}
				return Keep
			}, nil
		}))
		ct = conntrackTCP(t, "ipv6")
	})
	slices.SortFunc(got, func(a, b Conn) int { return a.Client.Compare(b.Client) })
	if want := []Conn{handed, evicted}; !slices.Equal(got, want) {
		t.Fatalf("decide got %+v; want the IPv6 connections the fast path opened %+v", got, want)
	}
	for local, n := range judged {
		if n != 1 {
			t.Errorf("the flow of %s judged %d times; want once", local, n)
		}
	}
	expectHandedOver(t, ct, []string{connString(handed.Client, handed.Server)})
	flows, err := d.Flows()
	testutil.Must(t, err)
	if len(flows) != 2 || !slices.ContainsFunc(flows, func(f Flow) bool { return f.Local.Port() == clientPort && f.Opener == OpenedBySlowPath }) ||
		!slices.ContainsFunc(flows, func(f Flow) bool { return f.Local.Port() == 40000 }) {
		t.Fatalf("flows %+v; want the handed-over one, as the slow path's, and the learned one", flows)
	}
	if n := bpftest.Entries(t, d.maps.OncFin6); n != 0 {
		t.Fatalf("%d closes still followed; want the evicted connection's gone with it", n)
	}
}

// closedConn6 opens a connection on clientPort+1 from the local IPv6 pod
// and sends a FIN each way: it is over, but for its last ACK, and its
// close is still followed. Nothing hands it over.
func closedConn6(t *testing.T, d *Datapath, u6 bool) {
	t.Helper()
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort+1, 80, syn), actRedirect, "a SYN of a connection closed next")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort+1, 80, finAck), actRedirect, "its FIN")
	verdictIs(t, d, d.progs.OncIngressFast, peer6Sends(u6, 80, clientPort+1, finAck), actRedirect, "the FIN back")
	if bpftest.Entries(t, d.maps.OncFin6) == 0 {
		t.Fatal("the close of a connection is not followed in onc_fin6")
	}
}

// A flush hands the IPv6 connections the fast path opened over before it
// forgets them, and forgets what it followed of their closes.
func TestFlush6HandsOverAndForgets(t *testing.T) {
	d := setupNode6(t, false, true, true)
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), actRedirect, "the SYN")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, finAck), actRedirect, "its FIN")
	closedConn6(t, d, false)
	var ct map[string]ctEntry
	testutil.InNewNetns(t, "flush6", func() {
		testutil.Must(t, d.Flush())
		ct = conntrackTCP(t, "ipv6")
	})
	expectHandedOver(t, ct, []string{connString(netip.AddrPortFrom(localPod6, clientPort), netip.AddrPortFrom(remotePod6, 80))})
	noFlows6(t, d, "a flush")
}

// A peer that leaves the fast path (its IPv6 CIDR gone), or whose header
// goes stale, has the IPv6 connections the fast path opened with its pods
// handed over to conntrack, over either underlay; a peer that leaves
// takes their flows and closes along.
func TestPeerEvictions6HandOver(t *testing.T) {
	for _, u := range underlays6 {
		t.Run(u.name+"/peer gone", func(t *testing.T) {
			d := setupNode6(t, u.u6, true, true)
			verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), actRedirect, "the SYN")
			verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, finAck), actRedirect, "its FIN")
			closedConn6(t, d, u.u6)
			var staying []Peer
			if !u.u6 {
				staying = []Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}
			}
			var ct map[string]ctEntry
			testutil.InNewNetns(t, "peer6", func() {
				testutil.Must(t, d.SyncPeers(staying, false))
				ct = conntrackTCP(t, "ipv6")
			})
			expectHandedOver(t, ct, []string{connString(netip.AddrPortFrom(localPod6, clientPort), netip.AddrPortFrom(remotePod6, 80))})
			noFlows6(t, d, "the peer's IPv6 CIDR went")
		})
		t.Run(u.name+"/header stale", func(t *testing.T) {
			d := setupNode6(t, u.u6, true, true)
			verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), actRedirect, "the SYN")
			node := peerNode
			if u.u6 {
				node = peerNode6
			}
			var ct map[string]ctEntry
			testutil.InNewNetns(t, "encap6", func() {
				n, err := d.EvictEncaps(func(e Encap) bool { return e.Node == node })
				if err != nil || n != 1 {
					t.Fatalf("evicted %d headers (%v), want the peer's", n, err)
				}
				ct = conntrackTCP(t, "ipv6")
			})
			expectHandedOver(t, ct, []string{connString(netip.AddrPortFrom(localPod6, clientPort), netip.AddrPortFrom(remotePod6, 80))})
			if f := onlyFlow6(t, d); f.Opener != OpenedBySlowPath {
				t.Fatalf("flow %+v after its header went; want it handed over", f)
			}
		})
	}
}

// The open pods of each family are kept in their own map: SetOpen and
// NarrowOpen take IPv6 addresses into onc_open6, a deleted pod leaves it,
// and a sync with checkKernel repairs drift in it.
func TestOpenPods6(t *testing.T) {
	d := openWith(t, Options{PodCIDRv6: localCIDR6, ConnSetup: SetupOpenPods})
	other6 := netip.MustParseAddr("fd00:10:244:1::3")
	expect := func(what string, want4, want6 []netip.Addr) {
		t.Helper()
		have4, err := contents[uint32, uint8](d.maps.OncOpen)
		testutil.Must(t, err)
		have6, err := contents[addr6, uint8](d.maps.OncOpen6)
		testutil.Must(t, err)
		var got4, got6 []netip.Addr
		for k := range have4 {
			got4 = append(got4, bpf.IPv4(k))
		}
		for k := range have6 {
			got6 = append(got6, netip.AddrFrom16(k.Addr))
		}
		slices.SortFunc(got4, netip.Addr.Compare)
		slices.SortFunc(got6, netip.Addr.Compare)
		if !slices.Equal(got4, want4) || !slices.Equal(got6, want6) {
			t.Fatalf("%s: open %v and %v; want %v and %v", what, got4, got6, want4, want6)
		}
	}
	testutil.Must(t, d.SetOpen(map[netip.Addr]bool{localPod: true, localPod6: true, other6: false}, false))
	expect("set", []netip.Addr{localPod}, []netip.Addr{localPod6})
	testutil.Must(t, d.NarrowOpen(map[netip.Addr]bool{localPod: true, other6: true}))
	expect("narrowed", []netip.Addr{localPod}, nil)
	testutil.Must(t, d.SetOpen(map[netip.Addr]bool{localPod6: true, other6: true}, false))
	expect("set again", nil, []netip.Addr{localPod6, other6})
	testutil.Must(t, d.DeleteLocalPod(localPod6))
	expect("the pod deleted", nil, []netip.Addr{other6})
	// Drift is repaired only when the kernel is checked.
	testutil.Must(t, d.maps.OncOpen6.Delete(addr6{Addr: other6.As16()}))
	testutil.Must(t, d.SetOpen(map[netip.Addr]bool{other6: true}, false))
	expect("drift, unchecked", nil, nil)
	testutil.Must(t, d.SetOpen(map[netip.Addr]bool{other6: true}, true))
	expect("drift, checked", nil, []netip.Addr{other6})
}

// A deleted IPv6 pod takes the connections the fast path opened with it,
// and what was followed of their closes.
func TestDeleteLocalPod6ForgetsItsConnections(t *testing.T) {
	d := setupNode6(t, false, true, true)
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), actRedirect, "the SYN")
	verdictIs(t, d, d.progs.OncEgressFast, pod6Sends(clientPort, 80, finAck), actRedirect, "its FIN")
	testutil.Must(t, d.DeleteLocalPod(localPod6))
	noFlows6(t, d, "the pod went")
	// A new pod at the address is not open until the policy says so.
	testutil.Must(t, d.SetLocalPod(localPod6, loIndex, podMAC, hostMAC))
	flags := stat6(t, d, "egress_miss_tcp_flags")
	if ret, _ := run(t, d.progs.OncEgressFast, pod6Sends(clientPort+1, 80, syn), 0); ret != actOK || stat6(t, d, "egress_miss_tcp_flags") != flags+1 {
		t.Fatal("a SYN from a new pod at the deleted pod's address took the fast path")
	}
}

// An agent of this version on the pins of the one before, which had no
// onc_fin6 or onc_open6: they are created beside the pinned maps, which
// are adopted, and the first SetOpen reads both open maps back.
func TestUpgradeAddsTheIPv6ConnectionSetupMaps(t *testing.T) {
	old := openWith(t, Options{PodCIDRv6: localCIDR6, ConnSetup: SetupOpenPods})
	established6(t, old)
	testutil.Must(t, old.Close())
	for _, m := range []string{bpf.FastpathMapOncFin6, bpf.FastpathMapOncOpen6} {
		testutil.Must(t, os.Remove(filepath.Join(old.opts.PinDir, m)))
	}
	d, err := Open(old.opts)
	testutil.Must(t, err)
	t.Cleanup(func() { d.Close() })
	if flows, err := d.Flows(); err != nil || len(flows) != 2 {
		t.Fatalf("flows %v (%v) after the upgrade, want the learned ones adopted", flows, err)
	}
	for _, m := range []string{bpf.FastpathMapOncFin6, bpf.FastpathMapOncOpen6} {
		if _, err := os.Stat(filepath.Join(old.opts.PinDir, m)); err != nil {
			t.Fatalf("%s not pinned after the upgrade: %v", m, err)
		}
	}
	reads := d.open.reads + d.open6.reads
	testutil.Must(t, d.SetOpen(map[netip.Addr]bool{localPod6: true}, false))
	if d.open.reads+d.open6.reads != reads+2 {
		t.Fatal("the first SetOpen did not read both open maps back")
	}
	testutil.Must(t, d.maps.OncFilter6.Delete(flowKey6(localPod6, remotePod6, 40000, 80, unix.IPPROTO_TCP)))
	if ret, _ := run(t, d.progs.OncEgressFast, pod6Sends(clientPort, 80, syn), 0); ret != actRedirect || stat6(t, d, "egress_open") != 1 {
		t.Fatalf("verdict %d: an IPv6 SYN did not open after the upgrade", ret)
	}
}
