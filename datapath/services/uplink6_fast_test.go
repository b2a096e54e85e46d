//go:build privileged

package services

// The IPv6 fast path from outside (include/services_uplink6.h,
// lb6_uplink_fast and lb6_uplink_reply): BPF_PROG_RUN on crafted frames
// for who may ride it, and the bed of uplink6_test.go with the fast path
// on, over an IPv4 and an IPv6 underlay, for real flows riding it.

import (
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// linkMAC is the MAC address of link name in namespace ns.
func linkMAC(t *testing.T, ns, name string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	in(t, ns, func() error {
		l, err := netlink.LinkByName(name)
		if err == nil {
			mac = l.Attrs().HardwareAddr
		}
		return err
	})
	return mac
}

// cacheKey6 is the flow cache's key of the flow between the local pod pod
// and the client outside.
func cacheKey6(pod, client netip.AddrPort, proto uint8) bpf.FastpathFlowKey6 {
	return bpf.FastpathFlowKey6{LocalIp: pod.Addr().As16(), RemoteIp: client.Addr().As16(),
		LocalPort: bpf.NetPort(pod.Port()), RemotePort: bpf.NetPort(client.Port()), Proto: proto}
}

// epoch is the flow cache's epoch.
func epoch(t *testing.T, fp *fastpath.Datapath) uint32 {
	t.Helper()
	var cfg bpf.FastpathOncConfig
	testutil.Must(t, fp.FlowCache().Maps[bpf.FastpathMapOncCfg].Lookup(uint32(0), &cfg))
	return cfg.Epoch
}

// actOK is TC_ACT_OK: the hook programs leave a packet they do not send
// to the stack.
const actOK = 0

var fast6Counters = []string{"uplink6_fast_to_pod", "uplink6_fast_reply", "uplink6_learned", "uplink6_translated",
	"uplink_fast_to_pod", "uplink_fast_reply"}

// Only a flow the flow cache holds established both ways in this epoch,
// to a backend that is a local pod, rides into the pod: the packet
// translated, its hop limit lowered, the pod's MACs on it. What the slow
// path must see goes there, translated: a SYN, FIN or RST; a flow
// learned one way, of another epoch, or not learned; a hop limit that
// would run out; UDP that conntrack does not hold established; a remote
// backend. A packet to the backend's own address is no frontend's and
// goes on untouched; the reply program likewise sends only the replies
// of a flow established both ways whose device is known.
func TestUplink6FastPathRefusals(t *testing.T) {
	lb, fp := uplink6Node(t)
	testutil.Must(t, lb.Sync([]Service{uplinkService(nodeIP6, TCP, localBE6), uplinkService(nodeIP6, UDP, localBE6),
		uplinkService(externalIP6, TCP, remoteBE6)}, false))
	podMAC, hostMAC := net.HardwareAddr{2, 0, 0, 0, 0xc, 1}, net.HardwareAddr{2, 0, 0, 0, 0xc, 2}
	testutil.Must(t, fp.SetLocalPod(localBE6.Addr(), 1, podMAC, hostMAC))
	filter := fp.FlowCache().Maps[bpf.FastpathMapOncFilter6]
	now := epoch(t, fp)
	learn := func(proto uint8, v bpf.FastpathFlowVal) {
		t.Helper()
		testutil.Must(t, filter.Put(cacheKey6(localBE6, client6, proto), v))
	}
	both := bpf.FastpathFlowVal{Epoch: now, Egress: 1, Ingress: 1}
	// The flows' first packets, on the slow path: their backends picked.
	ingress6(t, lb, frame6(client6, nodePort6, tcp6, syn))
	ingress6(t, lb, frame6(client6, nodePort6, udp6, 0))
	ingress6(t, lb, frame6(client6, netip.AddrPortFrom(externalIP6, nodePort), tcp6, syn))

	data := frame6(client6, nodePort6, tcp6, 0)
	learn(tcp6, both)
	var ret uint32
	var out []byte
	got := grew(t, lb, func() { ret, out, _ = ingress6(t, lb, data) }, fast6Counters...)
	if ret != actRedirect || got["uplink6_fast_to_pod"] != 1 || got["uplink6_translated"] != 1 || got["uplink_fast_to_pod"] != 0 {
		t.Fatalf("an established flow: verdict %d, counters grew %v; want redirected into the pod", ret, got)
	}
	want := frame6(client6, localBE6, tcp6, 0)
	want[21]-- // the hop limit
	copy(want[0:], podMAC)
	copy(want[6:], hostMAC)
	if string(out) != string(want) {
		t.Errorf("into the pod: left\n%x\nwant (checksum included)\n%x", out, want)
	}

	hop1 := frame6(client6, nodePort6, tcp6, 0)
	hop1[21] = 1
	for _, c := range []struct {
		name string
		flow *bpf.FastpathFlowVal // nil: none
		pkt  []byte
	}{
		{"a FIN", &both, frame6(client6, nodePort6, tcp6, 0x01)},
		{"an RST", &both, frame6(client6, nodePort6, tcp6, 0x04)},
		{"a SYN", &both, frame6(client6, nodePort6, tcp6, syn)},
		{"a flow learned coming in only", &bpf.FastpathFlowVal{Epoch: now, Ingress: 1}, data},
		{"a flow learned going out only", &bpf.FastpathFlowVal{Epoch: now, Egress: 1}, data},
		{"a flow of another epoch", &bpf.FastpathFlowVal{Epoch: now + 1, Egress: 1, Ingress: 1}, data},
		{"a flow not learned", nil, data},
		{"a hop limit of 1", &both, hop1},
	} {
		_ = filter.Delete(cacheKey6(localBE6, client6, tcp6)) // a SYN forgot it
		if c.flow != nil {
			learn(tcp6, *c.flow)
		}
		got := grew(t, lb, func() { ret, _, _ = ingress6(t, lb, c.pkt) }, fast6Counters...)
		if ret != actNext || got["uplink6_fast_to_pod"] != 0 || got["uplink6_translated"] != 1 {
			t.Errorf("%s: verdict %d, counters grew %v; want translated, to the stack", c.name, ret, got)
		}
	}
	// Nothing in conntrack (BPF_PROG_RUN's packet never met the stack).
	learn(udp6, both)
	got = grew(t, lb, func() { ret, _, _ = ingress6(t, lb, frame6(client6, nodePort6, udp6, 0)) }, fast6Counters...)
	if ret != actNext || got["uplink6_fast_to_pod"] != 0 {
		t.Errorf("UDP conntrack does not hold: verdict %d, counters grew %v; want the stack", ret, got)
	}
	testutil.Must(t, filter.Put(cacheKey6(remoteBE6, client6, tcp6), both))
	got = grew(t, lb, func() {
		ret, _, _ = ingress6(t, lb, frame6(client6, netip.AddrPortFrom(externalIP6, nodePort), tcp6, 0))
	}, fast6Counters...)
	if ret != actNext || got["uplink6_fast_to_pod"] != 0 || got["uplink6_translated"] != 1 {
		t.Errorf("a remote backend: verdict %d, counters grew %v; want translated, to the stack", ret, got)
	}
	learn(tcp6, both)
	direct := frame6(client6, localBE6, tcp6, 0)
	got = grew(t, lb, func() { ret, out, _ = ingress6(t, lb, direct) }, fast6Counters...)
	if ret != actNext || string(out) != string(direct) || got["uplink6_fast_to_pod"]+got["uplink6_translated"] != 0 {
		t.Errorf("to the backend's address: verdict %d, counters grew %v; want untouched, to the stack", ret, got)
	}

	// The reply program: the flow's device unknown until a reply the
	// slow path marked ESTABLISHED went out by it.
	reply := func(flags byte) (uint32, []byte) {
		ret, out := bpftest6Run(t, lb.objs.OncUplinkLbReply, frame6(localBE6, client6, tcp6, flags))
		return ret, out
	}
	if ret, _ := reply(0); ret != actOK {
		t.Errorf("a reply, its device unknown: verdict %d, want the stack", ret)
	}
	testutil.Must(t, filter.Delete(cacheKey6(localBE6, client6, tcp6)))
	learn(tcp6, bpf.FastpathFlowVal{Epoch: now, Ingress: 1})
	got = grew(t, lb, func() {
		ret, _, _ = bpftest.RunMarked(t, lb.objs.OncUplinkLbEgress, frame6(localBE6, client6, tcp6, 0), fastPathMark)
	},
		fast6Counters...)
	if ret != actNext || got["uplink6_learned"] != 1 {
		t.Fatalf("a marked reply: verdict %d, counters grew %v; want the flow learned going out", ret, got)
	}
	var v bpf.FastpathFlowVal
	if err := filter.Lookup(cacheKey6(localBE6, client6, tcp6), &v); err != nil || v.Egress != 1 || v.Ingress != 1 {
		t.Fatalf("after the marked reply: flow %+v (%v); want established both ways", v, err)
	}
	got = grew(t, lb, func() { ret, out = reply(0) }, fast6Counters...)
	if ret != actRedirect || got["uplink6_fast_reply"] != 1 || got["uplink_fast_reply"] != 0 {
		t.Fatalf("an established flow's reply: verdict %d, counters grew %v; want sent out", ret, got)
	}
	wantReply := frame6(nodePort6, client6, tcp6, 0)
	wantReply[21]--
	if string(out) != string(wantReply) {
		t.Errorf("the reply: left\n%x\nwant (checksum included)\n%x", out, wantReply)
	}
	for _, c := range []struct {
		name string
		pkt  []byte
	}{
		{"a FIN", frame6(localBE6, client6, tcp6, 0x01)},
		{"an RST", frame6(localBE6, client6, tcp6, 0x04)},
		{"a SYN-ACK", frame6(localBE6, client6, tcp6, 0x12)},
		{"to another client", frame6(localBE6, netip.AddrPortFrom(clientIP6, 40001), tcp6, 0)},
		{"from another port", frame6(netip.AddrPortFrom(localBE6.Addr(), 8081), client6, tcp6, 0)},
	} {
		got := grew(t, lb, func() { ret, _ = bpftest6Run(t, lb.objs.OncUplinkLbReply, c.pkt) }, fast6Counters...)
		if ret != actOK || got["uplink6_fast_reply"] != 0 {
			t.Errorf("reply %s: verdict %d, counters grew %v; want the stack", c.name, ret, got)
		}
	}
	testutil.Must(t, filter.Put(cacheKey6(localBE6, client6, tcp6), bpf.FastpathFlowVal{Epoch: now + 1, Egress: 1, Ingress: 1}))
	if ret, _ := reply(0); ret != actOK {
		t.Errorf("a reply of a flow of another epoch: verdict %d, want the stack", ret)
	}
}

// With the fast path, an established IPv6 flow from outside to a backend
// on the node skips the stack both ways, over either underlay (the
// fast path's egress program passes the pod's replies on from either
// way of sending, egress_fast6 and egress6_send_u6): bytes intact, each
// packet after the first few counted fast, conntrack's entry kept alive
// while the connection lives and closed by the stack after; evicted, as
// a policy change evicts it, a flow ip6tables now drops goes back to
// ip6tables and stays there.
func TestUplink6FastPathToALocalBackend(t *testing.T) {
	for _, u := range []struct {
		name     string
		endpoint netip.Addr
	}{{"IPv4 underlay", nodeIP}, {"IPv6 underlay", nodeIP6}} {
		t.Run(u.name, func(t *testing.T) {
			b := newFastUplink6Bed(t, u.endpoint)
			echo := netip.AddrPortFrom(localBE6.Addr(), 8081)
			serveEcho(t, b.be, echo)
			testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP6, TCP, echo), uplinkService(nodeIP6, UDP, echo)}, false))
			const n = 40
			for _, network := range []string{"tcp6", "udp6"} {
				got := b.delta(func() {
					if err := roundTrips(b.dialClient(network, nodePort6), n); err != nil {
						t.Fatalf("%s: %v", network, err)
					}
				}, fast6Counters...)
				if got["uplink6_learned"] != 1 || got["uplink6_fast_to_pod"] < n-3 || got["uplink6_fast_reply"] < n-3 ||
					got["uplink_fast_to_pod"]+got["uplink_fast_reply"] != 0 {
					t.Errorf("%s: counters %v; want 1 flow learned and ≥ %d packets fast each way, in IPv6's counters", network, got, n-3)
				}
			}

			c := b.dialClient("tcp6", nodePort6)
			testutil.Must(t, roundTrips(c, 5))
			local := c.LocalAddr().(*net.TCPAddr).AddrPort()
			time.Sleep(100 * time.Millisecond)
			if s, ok := b.conntrack6(local, echo); !ok || s < time.Hour {
				t.Fatalf("open: conntrack timeout %v (entry %v); want an established entry's", s, ok)
			}
			c.Close()
			testutil.WaitFor(t, "conntrack closing the connection", 5*time.Second, func() bool {
				s, ok := b.conntrack6(local, echo)
				return !ok || s < 5*time.Minute
			})

			c = b.dialClient("tcp6", nodePort6)
			testutil.Must(t, roundTrips(c, 5))
			in(t, b.node, func() error {
				return exec.Command("ip6tables", "-I", "FORWARD", "-d", echo.Addr().String(), "-p", "tcp", "-j", "DROP").Run()
			})
			testutil.Must(t, b.fp.EvictFlows(map[netip.Addr]bool{echo.Addr(): true},
				func([]fastpath.Conn) (func(local, remote netip.AddrPort, proto uint8, _ fastpath.Opener) fastpath.Verdict, error) {
					return func(netip.AddrPort, netip.AddrPort, uint8, fastpath.Opener) fastpath.Verdict { return fastpath.Evict }, nil
				}))
			got := b.delta(func() {
				if err := roundTrips(c, 1); err == nil {
					t.Error("a flow ip6tables now drops still reached its backend")
				}
			}, fast6Counters...)
			if got["uplink6_fast_to_pod"] != 0 || got["uplink6_fast_reply"] != 0 {
				t.Errorf("evicted flow still fast: %v", got)
			}
		})
	}
}

// conntrack6 is conntrack for an IPv6 connection.
func (b *uplinkBed) conntrack6(client, backend netip.AddrPort) (left time.Duration, ok bool) {
	b.t.Helper()
	in(b.t, b.node, func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET6)
		for _, f := range flows {
			if f.Forward.Protocol == unix.IPPROTO_TCP && f.Forward.SrcIP.Equal(client.Addr().AsSlice()) &&
				f.Forward.SrcPort == client.Port() && f.Forward.DstIP.Equal(backend.Addr().AsSlice()) &&
				f.Forward.DstPort == backend.Port() {
				left, ok = time.Duration(f.TimeOut)*time.Second, true
			}
		}
		return err
	})
	return left, ok
}

// bpftest6Run runs tc program p on pkt: its verdict and the packet it left.
func bpftest6Run(t *testing.T, p *ebpf.Program, pkt []byte) (uint32, []byte) {
	t.Helper()
	ret, out, _ := bpftest.RunMarked(t, p, pkt, 0)
	return ret, out
}

// With connection setup on the fast path, a client's IPv6 SYN to a
// backend on the node that no policy isolates opens its connection past
// the stack, over either underlay: every packet of it, both ways, SYN and
// FIN included, rides, conntrack never sees it, and its last ACK takes
// its records along. An isolated backend's connection opens through the
// stack; one the fast path lets go of is handed over to conntrack and
// goes on through the stack.
func TestUplink6OpensConnectionsToAnOpenBackend(t *testing.T) {
	for _, u := range []struct {
		name     string
		endpoint netip.Addr
	}{{"IPv4 underlay", nodeIP}, {"IPv6 underlay", nodeIP6}} {
		t.Run(u.name, func(t *testing.T) {
			b := newOpeningUplink6Bed(t, u.endpoint)
			echo := netip.AddrPortFrom(localBE6.Addr(), 8081)
			serveEcho(t, b.be, echo)
			testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP6, TCP, echo)}, false))
			const n = 20
			counters := []string{"uplink6_open", "uplink6_fast_to_pod", "uplink6_fast_reply", "uplink6_translated",
				"uplink6_reversed", "uplink_open"}
			exchange := func() (client netip.AddrPort) {
				c := b.dialClient("tcp6", nodePort6)
				if err := roundTrips(c, n); err != nil {
					t.Fatal(err)
				}
				client = c.LocalAddr().(*net.TCPAddr).AddrPort()
				c.Close()
				return client
			}

			open := map[netip.Addr]bool{localBE6.Addr(): true}
			testutil.Must(t, b.fp.SetOpen(open, false))
			var client netip.AddrPort
			got := b.delta(func() {
				client = exchange()
				testutil.WaitFor(t, "the close on the fast path", 2*time.Second, func() bool { return !b.remembers6(client) })
			}, counters...)
			if got["uplink6_open"] != 1 || got["uplink6_fast_to_pod"] < n+1 || got["uplink6_fast_reply"] < n+1 ||
				got["uplink6_translated"] != got["uplink6_open"]+got["uplink6_fast_to_pod"] || got["uplink6_reversed"] != 0 ||
				got["uplink_open"] != 0 {
				t.Errorf("an open backend: %v; want 1 connection opened and every packet fast, in IPv6's counters", got)
			}
			_, opened := b.conntrack6(client, echo)
			_, pickedUp := b.conntrack6(echo, client)
			if opened || pickedUp {
				t.Error("conntrack has an entry of a connection the fast path opened and closed")
			}

			testutil.Must(t, b.fp.SetOpen(nil, false))
			got = b.delta(func() { client = exchange() }, counters...)
			if got["uplink6_open"] != 0 {
				t.Errorf("a backend not open: %v; want no connection opened on the fast path", got)
			}
			if _, ok := b.conntrack6(client, echo); !ok {
				t.Error("a backend not open: conntrack has no entry of the connection")
			}

			// Handed over (as when a policy now isolates the backend but
			// allows the connection), it goes on through conntrack.
			testutil.Must(t, b.fp.SetOpen(open, false))
			c := b.dialClient("tcp6", nodePort6)
			testutil.Must(t, roundTrips(c, 3))
			client = c.LocalAddr().(*net.TCPAddr).AddrPort()
			if f, ok := b.flow(client); !ok || f.Opener != fastpath.OpenedByRemote {
				t.Fatalf("the connection to hand over: flow %+v (%v); want one the fast path opened", f, ok)
			}
			testutil.Must(t, b.fp.SetOpen(nil, false))
			in(t, b.node, func() error {
				return b.fp.EvictFlows(map[netip.Addr]bool{echo.Addr(): true},
					func([]fastpath.Conn) (func(local, remote netip.AddrPort, proto uint8, _ fastpath.Opener) fastpath.Verdict, error) {
						return func(netip.AddrPort, netip.AddrPort, uint8, fastpath.Opener) fastpath.Verdict {
							return fastpath.HandOver
						}, nil
					})
			})
			if left, ok := b.conntrack6(client, echo); !ok || left < time.Hour {
				t.Fatalf("handed over: conntrack timeout %v (entry %v); want an established entry's", left, ok)
			}
			if err := roundTrips(c, n); err != nil {
				t.Errorf("a connection handed over to conntrack: %v", err)
			}
		})
	}
}

// remembers6 is remembers for an IPv6 client: an entry of the uplink's
// IPv6 flows either way, or of the flow cache.
func (b *uplinkBed) remembers6(client netip.AddrPort) bool {
	b.t.Helper()
	if _, ok := b.flow(client); ok {
		return true
	}
	var (
		k bpf.ServicesLb6FlowKey
		v bpf.ServicesLb6Flow
	)
	ip, port := bpf.NetIPv6(client.Addr()), bpf.NetPort(client.Port())
	it := b.lb.maps.OncLb6Flows.Iterate()
	for it.Next(&k, &v) {
		if (k.Saddr == ip && k.Sport == port) || (k.Daddr == ip && k.Dport == port) {
			return true
		}
	}
	testutil.Must(b.t, it.Err())
	return false
}

// A peer's frame to no pod of this node carrying IPv6 is sent out of the
// uplink only as the reply of a flow conntrack holds established and
// masqueraded: a frame that claims to be one (a known flow's backend
// answering this node's gateway), but of no such conntrack entry, is left
// to the stack untouched, as are a FIN and a reply to an address outside
// the node's IPv6 pod CIDR. A frame carrying IPv4 takes the IPv4 path.
func TestUplink6OverlayReplyRefusals(t *testing.T) {
	lb, _ := uplink6Node(t)
	testutil.Must(t, lb.Sync([]Service{uplinkService(nodeIP6, UDP, remoteBE6), uplinkService(nodeIP6, TCP, remoteBE6)}, false))
	ingress6(t, lb, frame6(client6, nodePort6, udp6, 0))
	ingress6(t, lb, frame6(client6, nodePort6, tcp6, syn))
	gw := netip.AddrPortFrom(netip.MustParseAddr("fd00:10:244:1::1"), 40000) // the masquerade's source
	peer := netip.MustParseAddr("192.0.2.9")
	for _, c := range []struct {
		name  string
		inner []byte
	}{
		{"UDP conntrack does not hold", frame6(remoteBE6, gw, udp6, 0)},
		{"TCP conntrack does not hold", frame6(remoteBE6, gw, tcp6, 0)},
		{"a FIN", frame6(remoteBE6, gw, tcp6, 0x01)},
		{"to the client itself", frame6(remoteBE6, client6, udp6, 0)},
		{"IPv4", bpftest.Frame(bpftest.NICLocal, bpftest.NICPeer, remoteBE.Addr(), netip.MustParseAddr("10.244.1.1"), udp6, 8080, 40000, 0, 11)},
	} {
		frame := bpftest.VXLAN(c.inner, peer, nodeIP, 1)
		var ret uint32
		var out []byte
		got := grew(t, lb, func() { ret, out = bpftest6Run(t, lb.objs.OncUplinkLbOverlayReply, frame) },
			"uplink6_fast_from_remote", "uplink_fast_from_remote", "uplink6_error")
		if ret != actOK || string(out) != string(frame) || got["uplink6_fast_from_remote"]+got["uplink_fast_from_remote"]+got["uplink6_error"] != 0 {
			t.Errorf("%s: verdict %d, changed %v, counters grew %v; want the stack's, untouched", c.name, ret, string(out) != string(frame), got)
		}
	}
}
