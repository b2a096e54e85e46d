//go:build privileged

package fastpath

// Connection setup on the fast path (setup.go, flow_setup in fastpath.c):
// BPF_PROG_RUN on each node's side of a TCP connection, the refusals, and
// the hand-over to a real conntrack in a throwaway namespace.

import (
	"encoding/binary"
	"net/netip"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

const (
	syn, synAck, ack, finAck, rstAck = 0x02, 0x12, 0x10, 0x11, 0x14
	clientPort                       = 41000
)

// The packets of localPod:port <-> remotePod:80, or the other way round
// with the server on this node, as each program sees them.
func podSends(sport, dport uint16, flags byte) []byte { // the local pod's veth
	return frame(hostMAC, podMAC, localPod, remotePod, unix.IPPROTO_TCP, sport, dport, flags, 10)
}

func peerSends(sport, dport uint16, flags byte) []byte { // the uplink
	return vxlan(frame(vtepLocal, vtepPeer, remotePod, localPod, unix.IPPROTO_TCP, sport, dport, flags, 10), peerNode, localNode, 1)
}

// setupNode is a node with connection setup on whose local pod no policy
// isolates if open, knowing the peer and the header to it (from earlier
// connections), and, with dest, where remotePod is.
func setupNode(t *testing.T, open, dest bool) *Datapath {
	d := openWith(t, Options{ConnSetup: SetupOpenPods})
	established(t, d)
	testutil.Must(t, d.maps.OncFilter.Delete(FlowKey{LocalIp: bpf.NetIPv4(localPod), RemoteIp: bpf.NetIPv4(remotePod),
		LocalPort: bpf.NetPort(uint16(40000)), RemotePort: bpf.NetPort(uint16(80)), Proto: unix.IPPROTO_TCP}))
	if !dest {
		testutil.Must(t, d.maps.OncEgress.Delete(bpf.NetIPv4(remotePod)))
	}
	testutil.Must(t, d.SetOpen(map[netip.Addr]bool{localPod: open}, false))
	return d
}

func verdictIs(t *testing.T, d *Datapath, p *ebpf.Program, pkt []byte, want uint32, what string) {
	t.Helper()
	if ret, _ := run(t, p, pkt, 0); ret != want {
		t.Fatalf("%s: verdict %d, want %d", what, ret, want)
	}
}

func onlyFlow(t *testing.T, d *Datapath) Flow {
	t.Helper()
	flows, err := d.Flows()
	testutil.Must(t, err)
	if len(flows) != 1 {
		t.Fatalf("flows %+v, want one", flows)
	}
	return flows[0]
}

// A connection no policy can deny on either node opens, runs and closes on
// the fast path: on the client's node from its SYN, on the server's from
// the SYN it receives; every packet of it is redirected.
func TestConnectionSetupOnTheFastPath(t *testing.T) {
	t.Run("client's node", func(t *testing.T) {
		d := setupNode(t, true, false) // no learned destination: the peer's CIDR says where
		verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, syn), actRedirect, "the SYN")
		if stat(t, d, "egress_open") != 1 || stat(t, d, "egress_miss_tcp_flags") != 0 {
			t.Fatal("the SYN was not counted as opening its connection")
		}
		if f := onlyFlow(t, d); f.Opener != OpenedByLocal || !f.Egress || !f.Ingress || !f.Live || f.Closing ||
			f.Local != netip.AddrPortFrom(localPod, clientPort) || f.Remote != netip.AddrPortFrom(remotePod, 80) {
			t.Fatalf("flow %+v, want one opened by the local pod, both ways", f)
		}
		verdictIs(t, d, d.progs.OncIngressFast, peerSends(80, clientPort, synAck), actRedirect, "the SYN-ACK")
		verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, ack), actRedirect, "the handshake's last ACK")
		// Sequence numbers from here on (each segment carries 10 bytes):
		// the client's next is 111, the server's 501.
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(clientPort, 80, finAck), 111, 501), actRedirect, "the client's FIN")
		if !onlyFlow(t, d).Closing {
			t.Fatal("a FIN went by, but the flow is not closing")
		}
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(80, clientPort, finAck), 501, 122), actRedirect, "the server's FIN")
		if f := onlyFlow(t, d); f.Opener != OpenedByLocal {
			t.Fatalf("flow %+v after both FINs; want it kept for the last ACK", f)
		}
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(clientPort, 80, ack), 122, 512), actRedirect, "the last ACK")
		if n := stat(t, d, "egress_miss_tcp_flags") + stat(t, d, "ingress_miss_tcp_flags"); n != 0 {
			t.Fatalf("%d packets of the connection took the slow path", n)
		}
		noFlows(t, d, "the last ACK went by")
	})
	// The client half-closes, the server sends on, then closes; an ACK of
	// the server's data crosses its FIN and must not pass for the last ACK.
	t.Run("server's node, a half-close", func(t *testing.T) {
		d := openedByPeer(t)
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, finAck), 111, 501), actRedirect, "the client's FIN")
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, ack), 501, 122), actRedirect, "the server's data after it")
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, finAck), 511, 122), actRedirect, "the server's FIN")
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, ack), 122, 511), actRedirect, "an ACK of the data, after the FIN")
		if f := onlyFlow(t, d); f.Opener != OpenedByRemote {
			t.Fatalf("flow %+v after an ACK that does not cover the server's FIN; want it kept", f)
		}
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, ack), 122, 522), actRedirect, "the last ACK")
		noFlows(t, d, "the last ACK came in")
	})
	// Both FINs cross; each end acknowledges the other's.
	t.Run("server's node, a simultaneous close", func(t *testing.T) {
		d := openedByPeer(t)
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, finAck), 111, 501), actRedirect, "the client's FIN")
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, finAck), 501, 111), actRedirect, "the server's FIN")
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, ack), 512, 122), actRedirect, "the server's ACK of the client's FIN")
		onlyFlow(t, d)
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, ack), 122, 512), actRedirect, "the client's ACK of the server's FIN")
		noFlows(t, d, "both FINs were acknowledged")
	})
	t.Run("server's node, the server resetting", func(t *testing.T) {
		d := openedByPeer(t)
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, finAck), 111, 501), actRedirect, "the client's FIN")
		verdictIs(t, d, d.progs.OncEgressFast, podSends(80, clientPort, rstAck), actRedirect, "the server's RST")
		noFlows(t, d, "the server reset the connection")
	})
	// A FIN forged from outside (the client's address, a sequence number
	// the pod does not expect) after the server's FIN was acknowledged:
	// the pod's duplicate ACK carries what it really expects, and the
	// connection goes on.
	t.Run("server's node, a forged FIN", func(t *testing.T) {
		d := openedByPeer(t)
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, finAck), 501, 111), actRedirect, "the server's FIN")
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, ack), 111, 512), actRedirect, "the client's ACK of it")
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, finAck), 50, 512), actRedirect, "a forged FIN, behind the window")
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, ack), 512, 121), actRedirect, "the pod's duplicate ACK")
		if f := onlyFlow(t, d); f.Opener != OpenedByRemote {
			t.Fatalf("flow %+v after a forged FIN; want the connection kept", f)
		}
		verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, finAck), 121, 512), actRedirect, "the client's FIN")
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, ack), 512, 132), actRedirect, "the last ACK")
		noFlows(t, d, "the last ACK went out")
	})
	// A reset from the other end may be forged (the pod's stack ignores
	// one outside its window): it closes nothing here, and the pod's next
	// packet, which says the connection lives, takes the mark off.
	t.Run("server's node, a reset from the client", func(t *testing.T) {
		d := openedByPeer(t)
		verdictIs(t, d, d.progs.OncIngressFast, peerSends(clientPort, 80, rstAck), actRedirect, "the client's RST")
		if f := onlyFlow(t, d); f.Opener != OpenedByRemote || !f.Closing {
			t.Fatalf("flow %+v after the client's RST; want it kept, closing", f)
		}
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, ack), 501, 111), actRedirect, "the pod's challenge ACK")
		if f := onlyFlow(t, d); f.Opener != OpenedByRemote || f.Closing {
			t.Fatalf("flow %+v after the pod answered; want it kept, not closing", f)
		}
	})
	// The pod's bare RST (no ACK) after its FIN answers a late packet: its
	// socket is gone, the connection over.
	t.Run("server's node, the server's bare RST after its FIN", func(t *testing.T) {
		d := openedByPeer(t)
		verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, finAck), 501, 111), actRedirect, "the server's FIN")
		verdictIs(t, d, d.progs.OncEgressFast, bare(podSends(80, clientPort, rstAck)), actRedirect, "its bare RST")
		noFlows(t, d, "the server reset the connection after its FIN")
	})
}

// A client in SYN_SENT answers a SYN-ACK with a bad ACK (anyone's to
// forge) with a bare RST and waits on: the connection stays, and the real
// SYN-ACK still rides the fast path it opened on.
func TestConnectionSetupBareRSTInTheHandshake(t *testing.T) {
	d := setupNode(t, true, true)
	verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(clientPort, 80, syn), 100, 0), actRedirect, "the client's SYN")
	verdictIs(t, d, d.progs.OncEgressFast, bare(seg(podSends(clientPort, 80, rstAck), 7, 0)), actRedirect, "its bare RST to a forged SYN-ACK")
	if f := onlyFlow(t, d); f.Opener != OpenedByLocal || f.Closing {
		t.Fatalf("flow %+v after the bare RST; want the connection kept, not closing", f)
	}
	verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(80, clientPort, synAck), 500, 101), actRedirect, "the real SYN-ACK")
	// With ACK, the pod's RST aborts the connection.
	verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(clientPort, 80, rstAck), 101, 501), actRedirect, "the client's RST")
	noFlows(t, d, "the client aborted")
}

// bare clears the ACK bit of a pod's TCP segment (the builder sets it on
// every segment but a SYN).
func bare(pkt []byte) []byte {
	pkt[14+20+13] &^= ack
	return pkt
}

// openedByPeer is a server's node with a connection the client's SYN
// opened on the fast path, its handshake done: the client's next sequence
// number is 111, the server's 501.
func openedByPeer(t *testing.T) *Datapath {
	t.Helper()
	d := setupNode(t, true, false) // no packet went to the client's pod before
	verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, syn), 100, 0), actRedirect, "the SYN")
	if stat(t, d, "ingress_open") != 1 {
		t.Fatal("the SYN was not counted as opening its connection")
	}
	if f := onlyFlow(t, d); f.Opener != OpenedByRemote || f.Local != netip.AddrPortFrom(localPod, 80) {
		t.Fatalf("flow %+v, want one opened by the remote pod", f)
	}
	// The way back is the client's CIDR's owner, learned or not.
	verdictIs(t, d, d.progs.OncEgressFast, seg(podSends(80, clientPort, synAck), 490, 101), actRedirect, "the SYN-ACK")
	verdictIs(t, d, d.progs.OncIngressFast, seg(peerSends(clientPort, 80, ack), 101, 501), actRedirect, "the handshake's last ACK")
	return d
}

// seg sets the sequence and acknowledgement numbers of the TCP segment in
// pkt, a pod's frame or a peer's VXLAN frame.
func seg(pkt []byte, seq, ack uint32) []byte {
	tcp := 14 + 20
	if len(pkt) > 50+tcp && binary.BigEndian.Uint16(pkt[12:]) == 0x0800 && pkt[14+9] == unix.IPPROTO_UDP {
		tcp += 50 // the inner frame's, after the outer headers
	}
	binary.BigEndian.PutUint32(pkt[tcp+4:], seq)
	binary.BigEndian.PutUint32(pkt[tcp+8:], ack)
	return pkt
}

// noFlows fails unless the cache holds no flow: a connection the fast path
// opened is forgotten by the packet that ends it, so that closed
// connections never crowd a live one out of the LRU map.
func noFlows(t *testing.T, d *Datapath, after string) {
	t.Helper()
	flows, err := d.Flows()
	testutil.Must(t, err)
	if len(flows) != 0 {
		t.Fatalf("%s: flows %+v; want the connection forgotten", after, flows)
	}
	var k FlowKey
	var v []byte
	if it := d.maps.OncFin.Iterate(); it.Next(&k, &v) {
		t.Fatalf("%s: the close of %+v still followed (onc_fin); want it forgotten", after, k)
	}
}

// Whatever policy could deny, or the fast path could not carry whole, opens
// through conntrack as before, and leaves nothing in the cache.
func TestConnectionSetupRefusals(t *testing.T) {
	cases := []struct {
		name    string
		open    bool
		prepare func(t *testing.T, d *Datapath)
		ingress bool // the SYN comes from the peer
		counter string
	}{
		{"the client's pod isolated", false, nil, false, "egress_miss_tcp_flags"},
		{"the server's pod isolated", false, nil, true, "ingress_miss_tcp_flags"},
		{"learning paused (an eviction runs)", true, func(t *testing.T, d *Datapath) {
			c, err := d.config()
			testutil.Must(t, err)
			c.Learning = 0
			testutil.Must(t, d.maps.OncCfg.Put(uint32(0), c))
		}, false, "egress_miss_tcp_flags"},
		{"the fast path off", true, func(t *testing.T, d *Datapath) {
			c, err := d.config()
			testutil.Must(t, err)
			c.Enabled = 0
			testutil.Must(t, d.maps.OncCfg.Put(uint32(0), c))
		}, true, "ingress_miss_tcp_flags"},
		{"another pod's address (spoofed)", true, func(t *testing.T, d *Datapath) {
			testutil.Must(t, d.SetLocalPod(localPod, 99, podMAC, hostMAC))
		}, false, "egress_miss_spoof"},
		{"no header to the server's node", true, func(t *testing.T, d *Datapath) {
			testutil.Must(t, d.maps.OncEncap.Delete(bpf.NetIPv4(peerNode)))
		}, false, "egress_miss_encap"},
		{"no header back to the client's node", true, func(t *testing.T, d *Datapath) {
			testutil.Must(t, d.maps.OncEncap.Delete(bpf.NetIPv4(peerNode)))
		}, true, "ingress_miss_reply"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := setupNode(t, c.open, !c.ingress)
			if c.prepare != nil {
				c.prepare(t, d)
			}
			prog, pkt := d.progs.OncEgressFast, podSends(clientPort, 80, syn)
			if c.ingress {
				prog, pkt = d.progs.OncIngressFast, peerSends(clientPort, 80, syn)
			}
			if ret, out := run(t, prog, pkt, 0); ret != actOK || len(out) != len(pkt) {
				t.Fatalf("verdict %d; want the SYN on the slow path, unchanged", ret)
			}
			if stat(t, d, c.counter) != 1 || stat(t, d, "egress_open")+stat(t, d, "ingress_open") != 0 {
				t.Fatalf("counter %s did not count the SYN, or it counted as opened", c.counter)
			}
			if flows, _ := d.Flows(); len(flows) != 0 {
				t.Fatalf("the refused SYN left flows %+v", flows)
			}
		})
	}
	// Without the switch the fast path never opens a connection.
	d := open(t)
	established(t, d)
	testutil.Must(t, d.SetOpen(map[netip.Addr]bool{localPod: true}, false))
	if ret, _ := run(t, d.progs.OncEgressFast, podSends(clientPort, 80, syn), 0); ret != actOK || stat(t, d, "egress_open") != 0 {
		t.Fatal("a SYN took the fast path with connection setup off")
	}
}

// Where no NetworkPolicy runs (an etcd cluster), every pod is open.
func TestConnectionSetupForEveryPodWithoutPolicy(t *testing.T) {
	d := openWith(t, Options{ConnSetup: SetupEveryPod})
	established(t, d)
	if ret, _ := run(t, d.progs.OncEgressFast, podSends(clientPort, 80, syn), 0); ret != actRedirect || stat(t, d, "egress_open") != 1 {
		t.Fatalf("verdict %d: the SYN of a pod no policy can isolate did not open on the fast path", ret)
	}
}

// A connection the slow path opened closes through conntrack, which saw it
// open; so does one the fast path opened in an earlier epoch (a flush). A
// SYN-ACK rides only as the answer to the SYN that opened its connection:
// an earlier connection's entry on the same addresses and ports carries no
// new one that netfilter translated onto them.
func TestConnectionSetupOnlyForWhatTheFastPathOpened(t *testing.T) {
	d := setupNode(t, true, true)
	key := FlowKey{LocalIp: bpf.NetIPv4(localPod), RemoteIp: bpf.NetIPv4(remotePod), LocalPort: bpf.NetPort(uint16(clientPort)), RemotePort: bpf.NetPort(uint16(80)), Proto: unix.IPPROTO_TCP}
	testutil.Must(t, d.maps.OncFilter.Put(key, FlowVal{Egress: 1, Ingress: 1})) // learned from the slow path
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, 0), actRedirect, "data of the learned flow")
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, finAck), actOK, "its FIN")
	verdictIs(t, d, d.progs.OncIngressFast, peerSends(80, clientPort, synAck), actOK, "a SYN-ACK on its ports")
	if flows, _ := d.Flows(); len(flows) != 0 {
		t.Fatal("a SYN-ACK of a connection conntrack opened did not forget the cached flow")
	}
	for _, c := range []struct {
		name string
		val  FlowVal
	}{
		{"an earlier connection's, closed", FlowVal{Egress: 1, Ingress: 1, Opener: uint8(OpenedByLocal), Closing: closingLocalFIN | closingRemoteFIN}},
		{"an earlier connection's, refused (reset by the other end)", FlowVal{Egress: 1, Ingress: 1, Opener: uint8(OpenedByLocal), Closing: closingRemoteRST}},
		{"one the remote pod opened", FlowVal{Egress: 1, Ingress: 1, Opener: uint8(OpenedByRemote)}},
	} {
		testutil.Must(t, d.maps.OncFilter.Put(key, c.val))
		verdictIs(t, d, d.progs.OncIngressFast, peerSends(80, clientPort, synAck), actOK, "a SYN-ACK to the local pod on the entry of "+c.name)
		if flows, _ := d.Flows(); len(flows) != 0 {
			t.Fatalf("a SYN-ACK on the entry of %s did not forget it", c.name)
		}
	}
	testutil.Must(t, d.maps.OncFilter.Put(key, FlowVal{Egress: 1, Ingress: 1, Opener: uint8(OpenedByLocal)}))
	c, err := d.config()
	testutil.Must(t, err)
	c.Epoch++
	testutil.Must(t, d.maps.OncCfg.Put(uint32(0), c))
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, finAck), actOK, "a FIN of a connection opened in an earlier epoch")
}

// A pod cannot close another's connection in its name: a FIN with another
// pod's address, from its own veth, changes nothing.
func TestConnectionSetupSpoofedCloseChangesNothing(t *testing.T) {
	d := setupNode(t, true, true)
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, syn), actRedirect, "the SYN")
	testutil.Must(t, d.SetLocalPod(localPod, 99, podMAC, hostMAC)) // the packets below come from another veth
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, rstAck), actOK, "a spoofed RST")
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, syn), actOK, "a spoofed SYN")
	if f := onlyFlow(t, d); f.Closing || f.Opener != OpenedByLocal {
		t.Fatalf("after spoofed packets the connection's flow is %+v", f)
	}
}

// Switched off, the fast path hands the connections it opened over to
// conntrack: ESTABLISHED from the end that sent the SYN, a reply seen,
// assured; a half-closed one too (conntrack follows the rest of its
// close), and one the remote end reset (perhaps forged: it may live on),
// with a short timeout; not one that is over. An entry the slow path
// picked up with the roles swapped is replaced. The slow path then
// carries them.
func TestHandOverGivesConntrackTheConnections(t *testing.T) {
	d := setupNode(t, true, true)
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, syn), actRedirect, "the local pod's SYN")
	verdictIs(t, d, d.progs.OncIngressFast, peerSends(clientPort+1, 8080, syn), actRedirect, "the remote pod's SYN")
	verdictIs(t, d, d.progs.OncIngressFast, peerSends(clientPort+1, 8080, finAck), actRedirect, "the remote pod's FIN")
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort+2, 80, syn), actRedirect, "a SYN of a connection reset next")
	verdictIs(t, d, d.progs.OncIngressFast, peerSends(80, clientPort+2, rstAck), actRedirect, "its RST")
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort+3, 80, syn), actRedirect, "a SYN of a connection closed next")
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort+3, 80, finAck), actRedirect, "its FIN")
	verdictIs(t, d, d.progs.OncIngressFast, peerSends(80, clientPort+3, finAck), actRedirect, "the FIN back")
	first := netip.AddrPortFrom(localPod, clientPort).String() + " -> " + netip.AddrPortFrom(remotePod, 80).String()
	second := netip.AddrPortFrom(remotePod, clientPort+1).String() + " -> " + netip.AddrPortFrom(localPod, 8080).String()
	reset := netip.AddrPortFrom(localPod, clientPort+2).String() + " -> " + netip.AddrPortFrom(remotePod, 80).String()
	var out []byte
	testutil.InNewNetns(t, "handover", func() {
		// The first connection, as the slow path would pick it up from
		// its server: remotePod:80 -> localPod:41000.
		swapped := &netlink.ConntrackFlow{FamilyType: unix.AF_INET, TimeOut: 60,
			Forward:   netlink.IPTuple{SrcIP: remotePod.AsSlice(), DstIP: localPod.AsSlice(), SrcPort: 80, DstPort: clientPort, Protocol: unix.IPPROTO_TCP},
			Reverse:   netlink.IPTuple{SrcIP: localPod.AsSlice(), DstIP: remotePod.AsSlice(), SrcPort: clientPort, DstPort: 80, Protocol: unix.IPPROTO_TCP},
			ProtoInfo: &netlink.ProtoInfoTCP{State: nl.TCP_CONNTRACK_ESTABLISHED}}
		testutil.Must(t, netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, swapped))
		testutil.Must(t, d.Configure(false))
		var err error
		if out, err = exec.Command("conntrack", "-L", "-p", "tcp").CombinedOutput(); err != nil {
			t.Fatalf("conntrack -L: %v: %s", err, out)
		}
	})
	want := map[string]bool{first: true, second: true, reset: true}
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
		conn := netip.AddrPortFrom(src, sport).String() + " -> " + netip.AddrPortFrom(dst, dport).String()
		if !want[conn] || !strings.Contains(line, "ESTABLISHED") || !strings.Contains(line, "[ASSURED]") || strings.Contains(line, "UNREPLIED") {
			t.Errorf("conntrack has %q; want only %s, %s and %s, ESTABLISHED, replied, assured", line, first, second, reset)
		}
		if short := conn == reset; short != (timeout <= resetTimeout) {
			t.Errorf("conntrack has %q with timeout %d s: want at most %d s only for the reset connection", line, timeout, resetTimeout)
		}
		delete(want, conn)
	}
	if len(want) != 0 {
		t.Fatalf("not handed over: %v (conntrack has:\n%s)", want, out)
	}
	flows, err := d.Flows()
	testutil.Must(t, err)
	handed := 0
	for _, f := range flows {
		if f.Opener == OpenedBySlowPath {
			handed++
		}
	}
	if handed != 2 || len(flows) != 3 {
		t.Errorf("flows after the hand-over %+v: want the two live ones handed over marked opened by the slow path, the reset one gone, the closed one left", flows)
	}
	// The fast path off, their FINs take the slow path, where conntrack has them.
	verdictIs(t, d, d.progs.OncEgressFast, podSends(clientPort, 80, finAck), actOK, "a FIN after the hand-over")
}
