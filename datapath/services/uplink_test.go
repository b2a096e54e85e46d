//go:build privileged

package services

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/netfilter"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The uplink bed: a client namespace on the "underlay", a node namespace
// whose uplink (n0) carries the programs, a local backend behind a veth
// (oncb0, named as a pod's host veth) and a "remote" one behind another
// veth (r0), which stands in for the overlay device: the MASQUERADE rule
// is given r0 as that device.
var (
	nodeIP     = netip.MustParseAddr("192.0.2.1")
	clientIP   = netip.MustParseAddr("192.0.2.2")
	externalIP = netip.MustParseAddr("203.0.113.10") // routed to the node, not its own
	spoofIP    = netip.MustParseAddr("10.244.9.9")   // a pod address, claimed from outside
	localBE    = netip.AddrPortFrom(netip.MustParseAddr("10.244.1.2"), 8080)
	remoteBE   = netip.AddrPortFrom(netip.MustParseAddr("10.244.2.2"), 8080)
	remoteGW   = netip.MustParseAddr("10.244.2.1") // the node's address toward the remote backend
	podCIDR    = netip.MustParsePrefix("10.244.0.0/16")
)

const nodePort = 30080

type uplinkBed struct {
	t                     *testing.T
	client, node, be, rbe string // namespace names
	lb                    *LB
	fp                    *fastpath.Datapath // newFastUplinkBed's
	fpOpts                fastpath.Options   // what fp was opened with
}

// fastPathMark is the bed's ESTABLISHED bit (the agent's default).
const fastPathMark = 0x40000

func ipIn(t *testing.T, ns string, args ...string) {
	t.Helper()
	if out, err := exec.Command("ip", append([]string{"-n", ns}, args...)...).CombinedOutput(); err != nil {
		t.Fatalf("ip -n %s %s: %v: %s", ns, strings.Join(args, " "), err, out)
	}
}

func in(t *testing.T, ns string, fn func() error) {
	t.Helper()
	h, err := netns.Open("/run/netns/" + ns)
	testutil.Must(t, err)
	defer h.Close()
	testutil.Must(t, netns.Do(h, fn))
}

// veth joins namespaces a and b with a/an (addr aAddr) and b/bn (bAddr).
func veth(t *testing.T, a, an, aAddr, b, bn, bAddr string) {
	t.Helper()
	ipIn(t, a, "link", "add", an, "type", "veth", "peer", "name", bn, "netns", b)
	ipIn(t, a, "addr", "add", aAddr, "dev", an)
	ipIn(t, b, "addr", "add", bAddr, "dev", bn)
	ipIn(t, a, "link", "set", an, "up")
	ipIn(t, b, "link", "set", bn, "up")
}

func newUplinkBed(t *testing.T) *uplinkBed {
	t.Helper()
	return buildUplinkBed(t, false, fastpath.SetupOff)
}

// newFastUplinkBed is the bed with the node's fast path: its programs on
// the uplink and on the local backend's veth, the backend its local pod,
// and netfilter marking flows from outside ESTABLISHED.
func newFastUplinkBed(t *testing.T) *uplinkBed {
	t.Helper()
	return buildUplinkBed(t, true, fastpath.SetupOff)
}

// newOpeningUplinkBed is newFastUplinkBed's bed with connection setup on
// the fast path for the pods onc_open holds (none at first), as the agent
// runs it with NetworkPolicy and the kube-proxy replacement.
func newOpeningUplinkBed(t *testing.T) *uplinkBed {
	t.Helper()
	return buildUplinkBed(t, true, fastpath.SetupOpenPods)
}

// newOpeningEchoBed is newOpeningUplinkBed's bed with an echo server on
// the local backend behind the NodePort, and the server's address.
func newOpeningEchoBed(t *testing.T) (*uplinkBed, netip.AddrPort) {
	t.Helper()
	b := newOpeningUplinkBed(t)
	echo := netip.AddrPortFrom(localBE.Addr(), 8081)
	serveEcho(t, b.be, echo)
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, echo)}, false))
	return b, echo
}

func buildUplinkBed(t *testing.T, fast bool, setup fastpath.ConnSetup) *uplinkBed {
	t.Helper()
	p := testutil.Prefix()
	b := &uplinkBed{t: t, client: p + "-cl", node: p + "-nd", be: p + "-be", rbe: p + "-rb"}
	for _, ns := range []string{b.client, b.node, b.be, b.rbe} {
		testutil.Netns(t, ns)
		ipIn(t, ns, "link", "set", "lo", "up")
	}
	veth(t, b.node, "n0", nodeIP.String()+"/24", b.client, "c0", clientIP.String()+"/24")
	veth(t, b.node, "oncb0", "10.244.1.1/24", b.be, "b1", localBE.Addr().String()+"/24")
	veth(t, b.node, "r0", remoteGW.String()+"/24", b.rbe, "r1", remoteBE.Addr().String()+"/24")
	ipIn(t, b.client, "addr", "add", spoofIP.String()+"/32", "dev", "c0")
	ipIn(t, b.client, "route", "add", externalIP.String()+"/32", "via", nodeIP.String())
	ipIn(t, b.be, "route", "add", "default", "via", "10.244.1.1")
	ipIn(t, b.rbe, "route", "add", "default", "via", remoteGW.String())
	// The node forwards what is not its own back to the underlay, as a
	// node's default route does: an externalIP without backends is
	// refused in FORWARD, not lost to a missing route.
	ipIn(t, b.node, "route", "add", "default", "via", clientIP.String())
	if out, err := exec.Command("ip", "netns", "exec", b.node, "sysctl", "-qw", "net.ipv4.ip_forward=1").CombinedOutput(); err != nil {
		t.Fatalf("ip_forward: %v: %s", err, out)
	}
	serveWho(t, b.be, localBE)
	serveWho(t, b.rbe, remoteBE)

	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	rules := netfilter.UplinkLB{SNATMark: SNATMark, RejectMark: RejectMark, LocalPods: netip.MustParsePrefix("10.244.1.0/24")}
	var cache *bpf.FlowCache
	if fast {
		b.fpOpts = fastpath.Options{PinDir: dir, VNI: 1, Port: 8472, Mark: fastPathMark,
			NodeIP: nodeIP, PodCIDR: netip.MustParsePrefix("10.244.1.0/24"), ConnSetup: setup}
		fp, err := fastpath.Open(b.fpOpts)
		testutil.Must(t, err)
		t.Cleanup(func() { fp.Close() })
		testutil.Must(t, fp.Configure(true))
		b.fp, cache = fp, fp.FlowCache()
		// As the agent sets it: conntrack's window falls behind the
		// packets the fast path carries.
		if out, err := exec.Command("ip", "netns", "exec", b.node, "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_be_liberal=1").CombinedOutput(); err != nil {
			t.Fatalf("be_liberal: %v: %s", err, out)
		}
	}
	lb, err := Open(Options{PinDir: dir, FlowCache: cache})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	b.lb = lb
	testutil.Must(t, lb.SetInternal([]netip.Prefix{podCIDR, netip.PrefixFrom(nodeIP, 32)}))
	var podMAC net.HardwareAddr
	in(t, b.be, func() error {
		pod, err := netlink.LinkByName("b1")
		if err == nil {
			podMAC = pod.Attrs().HardwareAddr
		}
		return err
	})
	in(t, b.node, func() error {
		if err := netfilter.EnsureUplinkLB(rules); err != nil {
			return err
		}
		if b.fp != nil {
			if err := netfilter.EnsureMark("onc.vxlan", netfilter.Marking{Mark: fastPathMark, Uplink: "n0"}); err != nil {
				return err
			}
			if err := b.addLocalPod(podMAC); err != nil {
				return err
			}
		}
		return lb.AttachUplink("n0")
	})
	return b
}

// addLocalPod gives the fast path its programs on the uplink and on the
// local backend's veth, and the backend as its pod (what the agent does
// at CNI ADD); in the node's namespace.
func (b *uplinkBed) addLocalPod(podMAC net.HardwareAddr) error {
	host, err := netlink.LinkByName("oncb0")
	if err != nil {
		return err
	}
	if err := b.fp.AttachUplink("n0"); err != nil {
		return err
	}
	if err := b.fp.AttachPod("oncb0"); err != nil {
		return err
	}
	return b.fp.SetLocalPod(localBE.Addr(), host.Attrs().Index, podMAC, host.Attrs().HardwareAddr)
}

// serveWho answers TCP and UDP on addr, in namespace ns, with
// "<addr> <the peer it saw>".
func serveWho(t *testing.T, ns string, addr netip.AddrPort) {
	t.Helper()
	in(t, ns, func() error {
		return serveBoth(t, addr, func(c net.Conn) { _, _ = fmt.Fprintf(c, "%s %s", addr, c.RemoteAddr()) },
			func(_ []byte, from net.Addr) []byte { return []byte(fmt.Sprintf("%s %s", addr, from)) })
	})
}

// answer is what a client got: the backend that served it and the peer
// that backend saw, the address the reply came from, or the error.
type answer struct {
	Backend, SeenAs, From string
	Err                   error
}

func parseAnswer(reply string, from net.Addr) answer {
	be, seen, _ := strings.Cut(reply, " ")
	seenAddr, _, _ := net.SplitHostPort(seen)
	return answer{Backend: be, SeenAs: seenAddr, From: from.String()}
}

// network is "tcp4" or "udp4" (proto "tcp", "udp") for an IPv4 dst, else
// "tcp6" or "udp6".
func network(proto string, dst netip.AddrPort) string {
	if dst.Addr().Is4() {
		return proto + "4"
	}
	return proto + "6"
}

// tcp connects from the client namespace (from src, if valid) to dst and
// reads the backend's answer; a successful handshake with dst shows the
// node's replies came from dst.
func (b *uplinkBed) tcp(src netip.Addr, dst netip.AddrPort) (a answer) {
	b.t.Helper()
	in(b.t, b.client, func() error {
		d := net.Dialer{Timeout: 1500 * time.Millisecond}
		if src.IsValid() {
			d.LocalAddr = &net.TCPAddr{IP: src.AsSlice()}
		}
		c, err := d.Dial(network("tcp", dst), dst.String())
		if err != nil {
			a.Err = err
			return nil
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 128)
		n, err := c.Read(buf)
		if err != nil {
			a.Err = err
			return nil
		}
		a = parseAnswer(string(buf[:n]), c.RemoteAddr())
		return nil
	})
	return a
}

// udp sends a datagram from the client namespace to dst on an unconnected
// socket (the answer's source is then the kernel's, unfiltered), or on a
// connected one (which sees ICMP errors).
func (b *uplinkBed) udp(connected bool, dst netip.AddrPort) (a answer) {
	b.t.Helper()
	in(b.t, b.client, func() error {
		buf := make([]byte, 128)
		if connected {
			c, err := net.Dial(network("udp", dst), dst.String())
			if err != nil {
				a.Err = err
				return nil
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
			if _, err := c.Write([]byte("hi")); err != nil {
				a.Err = err
				return nil
			}
			n, err := c.Read(buf)
			if err != nil {
				a.Err = err
				return nil
			}
			a = parseAnswer(string(buf[:n]), c.RemoteAddr())
			return nil
		}
		c, err := net.ListenPacket(network("udp", dst), ":0")
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
		if _, err := c.WriteTo([]byte("hi"), net.UDPAddrFromAddrPort(dst)); err != nil {
			return err
		}
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			a.Err = err
			return nil
		}
		a = parseAnswer(string(buf[:n]), from)
		return nil
	})
	return a
}

func uplinkService(vip netip.Addr, proto Proto, bes ...netip.AddrPort) Service {
	s := Service{Name: "default/np:p", Frontend: NodePort, Scope: Uplink, VIP: vip, Port: nodePort, Proto: proto}
	for _, a := range bes {
		s.Backends = append(s.Backends, Backend{Addr: a, Ready: true})
	}
	return s
}

// delta runs fn and returns how much each named uplink counter grew.
func (b *uplinkBed) delta(fn func(), names ...string) map[string]uint64 {
	b.t.Helper()
	before := map[string]uint64{}
	for _, n := range names {
		before[n] = counter(b.t, b.lb, n)
	}
	fn()
	out := map[string]uint64{}
	for _, n := range names {
		out[n] = counter(b.t, b.lb, n) - before[n]
	}
	return out
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// A NodePort and an externalIP reach a backend on the node over TCP and
// UDP: the backend sees the client, the client sees the frontend answer.
func TestUplinkToALocalBackend(t *testing.T) {
	b := newUplinkBed(t)
	testutil.Must(t, b.lb.Sync([]Service{
		uplinkService(nodeIP, TCP, localBE), uplinkService(nodeIP, UDP, localBE),
		uplinkService(externalIP, TCP, localBE), uplinkService(externalIP, UDP, localBE),
	}, false))
	for _, vip := range []netip.Addr{nodeIP, externalIP} {
		front := netip.AddrPortFrom(vip, nodePort)
		got := b.delta(func() {
			for _, a := range []answer{b.tcp(netip.Addr{}, front), b.udp(false, front)} {
				if a.Err != nil || a.Backend != localBE.String() || a.SeenAs != clientIP.String() || a.From != front.String() {
					t.Errorf("to %s: %+v; want served by %s, seen as %s, from %s", front, a, localBE, clientIP, front)
				}
			}
		}, "uplink_translated", "uplink_new_flow", "uplink_reversed")
		// TCP: SYN, ACK, data/ACK, FIN...; UDP: one each way.
		if got["uplink_new_flow"] != 2 || got["uplink_translated"] < 4 || got["uplink_reversed"] < 3 {
			t.Errorf("to %s: counters %v", front, got)
		}
	}
}

// A backend on another node sees this node's address (SNAT), unless the
// service keeps the client; a local backend always sees the client.
func TestUplinkSNATToARemoteBackend(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	for _, tc := range []struct {
		be         netip.AddrPort
		keepClient bool
		seenAs     netip.Addr
	}{
		{remoteBE, false, remoteGW},
		{localBE, false, clientIP},
		{localBE, true, clientIP},
	} {
		tcpSvc, udpSvc := uplinkService(nodeIP, TCP, tc.be), uplinkService(nodeIP, UDP, tc.be)
		tcpSvc.KeepClient, udpSvc.KeepClient = tc.keepClient, tc.keepClient
		testutil.Must(t, b.lb.Sync([]Service{tcpSvc, udpSvc}, false))
		for _, a := range []answer{b.tcp(netip.Addr{}, front), b.udp(false, front)} {
			if a.Err != nil || a.Backend != tc.be.String() || a.SeenAs != tc.seenAs.String() || a.From != front.String() {
				t.Errorf("backend %s, keep client %v: %+v; want seen as %s, from %s", tc.be, tc.keepClient, a, tc.seenAs, front)
			}
		}
	}
}

// Without backends TCP is reset and UDP gets a port unreachable at once;
// with DropWhenEmpty both time out.
func TestUplinkWithoutBackends(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	// The node's own address would be refused by its stack anyway (no
	// socket there); an externalIP only by ONC's REJECT rule.
	for _, vip := range []netip.Addr{nodeIP, externalIP} {
		testutil.Must(t, b.lb.Sync([]Service{uplinkService(vip, TCP), uplinkService(vip, UDP)}, false))
		to := netip.AddrPortFrom(vip, nodePort)
		got := b.delta(func() {
			start := time.Now()
			if a := b.tcp(netip.Addr{}, to); !errors.Is(a.Err, syscall.ECONNREFUSED) {
				t.Errorf("TCP to %s: %+v, want ECONNREFUSED", to, a)
			}
			if a := b.udp(true, to); !errors.Is(a.Err, syscall.ECONNREFUSED) {
				t.Errorf("UDP to %s: %+v, want ECONNREFUSED", to, a)
			}
			if d := time.Since(start); d > time.Second {
				t.Errorf("refusals took %v", d)
			}
		}, "uplink_refused", "uplink_translated")
		if got["uplink_refused"] != 2 || got["uplink_translated"] != 0 {
			t.Errorf("refused to %s: counters %v", to, got)
		}
	}

	tcpSvc, udpSvc := uplinkService(nodeIP, TCP), uplinkService(nodeIP, UDP)
	tcpSvc.DropWhenEmpty, udpSvc.DropWhenEmpty = true, true
	testutil.Must(t, b.lb.Sync([]Service{tcpSvc, udpSvc}, false))
	got := b.delta(func() {
		if a := b.tcp(netip.Addr{}, front); !isTimeout(a.Err) {
			t.Errorf("TCP, drop when empty: %+v, want a timeout", a)
		}
		if a := b.udp(true, front); !isTimeout(a.Err) {
			t.Errorf("UDP, drop when empty: %+v, want a timeout", a)
		}
	}, "uplink_no_endpoints_drop", "uplink_refused")
	if got["uplink_no_endpoints_drop"] < 2 || got["uplink_refused"] != 0 {
		t.Errorf("drop when empty: counters %v", got)
	}
}

// loadBalancerSourceRanges: a client outside them is dropped; one inside
// is served; the ranges follow the service's updates.
func TestUplinkSourceRanges(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	svc := uplinkService(nodeIP, TCP, localBE)
	svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	testutil.Must(t, b.lb.Sync([]Service{svc}, false))
	got := b.delta(func() {
		if a := b.tcp(netip.Addr{}, front); !isTimeout(a.Err) {
			t.Errorf("outside the ranges: %+v, want a timeout", a)
		}
	}, "uplink_source_range_drop", "uplink_translated")
	if got["uplink_source_range_drop"] < 1 || got["uplink_translated"] != 0 {
		t.Errorf("outside the ranges: counters %v", got)
	}
	svc.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("192.0.2.0/28")}
	testutil.Must(t, b.lb.Sync([]Service{svc}, false))
	if a := b.tcp(netip.Addr{}, front); a.Err != nil || a.Backend != localBE.String() {
		t.Errorf("inside the ranges: %+v", a)
	}
	testutil.Must(t, b.lb.Sync(nil, false))
	if n := bpftest.Entries(t, b.lb.maps.OncLbSourceRanges); n != 0 {
		t.Errorf("%d source ranges left after the service went", n)
	}
}

// A packet from outside claiming a pod's address is dropped as spoofed.
func TestUplinkSpoofedSourceDropped(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, localBE)}, false))
	got := b.delta(func() {
		if a := b.tcp(spoofIP, front); !isTimeout(a.Err) {
			t.Errorf("from %s: %+v, want a timeout", spoofIP, a)
		}
	}, "uplink_spoofed", "uplink_translated")
	if got["uplink_spoofed"] < 1 || got["uplink_translated"] != 0 {
		t.Errorf("spoofed: counters %v", got)
	}
}

// Without affinity new flows spread over the backends, and each flow keeps
// the backend its first packet got.
func TestUplinkFlowsKeepTheirBackend(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, localBE, remoteBE)}, false))
	seen := map[string]int{}
	for range 20 {
		a := b.tcp(netip.Addr{}, front)
		if a.Err != nil {
			t.Fatalf("TCP to %s: %v", front, a.Err)
		}
		seen[a.Backend]++
	}
	if len(seen) != 2 {
		t.Errorf("backends %v; want both", seen)
	}
}

// A backend that is no pod of this node nor reached by the overlay (a
// host-network endpoint, an external one: here an address of the
// underlay, reached back by the uplink) still answers through this node:
// the packet is masqueraded, as kube-proxy masquerades it.
func TestUplinkBackendByTheUplinkIsMasqueraded(t *testing.T) {
	b := newUplinkBed(t)
	hostBE := netip.AddrPortFrom(netip.MustParseAddr("192.0.2.9"), 8080)
	ipIn(t, b.client, "addr", "add", hostBE.Addr().String()+"/32", "dev", "c0")
	in(t, b.node, func() error {
		return exec.Command("ip", "route", "add", hostBE.Addr().String()+"/32", "dev", "n0").Run()
	})
	serveWho(t, b.client, hostBE)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, hostBE)}, false))
	if a := b.tcp(netip.Addr{}, front); a.Err != nil || a.Backend != hostBE.String() || a.SeenAs != nodeIP.String() || a.From != front.String() {
		t.Fatalf("to %s through %s: %+v, want it answering the node %s, from the frontend", hostBE, front, a, nodeIP)
	}
}

// A reply to the node's own connection whose local port is a frontend's
// (as a masqueraded pod's may be) reaches the node, untranslated: a TCP
// flow starts only at a SYN. With no backends it is not refused either.
func TestUplinkRepliesToTheNodeAreNotFrontends(t *testing.T) {
	b := newUplinkBed(t)
	for i, backends := range [][]netip.AddrPort{{localBE}, nil} {
		testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, backends...)}, false))
		// Another server port each time: the node's port stays the
		// frontend's, and the previous connection may still hold its
		// 4-tuple in TIME_WAIT.
		server := netip.AddrPortFrom(clientIP, uint16(9999-i))
		var l net.Listener
		in(t, b.client, func() (err error) { l, err = net.Listen("tcp4", server.String()); return err })
		go func() {
			if c, err := l.Accept(); err == nil {
				_, _ = c.Write([]byte("client"))
				c.Close()
			}
		}()
		got := b.delta(func() {
			in(t, b.node, func() error {
				d := net.Dialer{Timeout: 1500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: nodeIP.AsSlice(), Port: nodePort},
					Control: reuseAddr}
				c, err := d.Dial("tcp4", server.String())
				if err != nil {
					t.Errorf("from the node's port %d, backends %v: %v", nodePort, backends, err)
					return nil
				}
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				buf := make([]byte, 16)
				if n, err := c.Read(buf); err != nil || string(buf[:n]) != "client" {
					t.Errorf("from the node's port %d, backends %v: read %q, %v", nodePort, backends, buf[:n], err)
				}
				return nil
			})
		}, "uplink_translated", "uplink_refused")
		l.Close()
		if got["uplink_translated"] != 0 || got["uplink_refused"] != 0 {
			t.Errorf("backends %v: the replies were taken for a frontend's: %v", backends, got)
		}
	}
}

// reuseAddr lets a dialer bind a local port a closed connection still
// holds in TIME_WAIT.
func reuseAddr(_, _ string, c syscall.RawConn) error {
	return c.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1) })
}

// A SYN always picks afresh: a client reusing its 5-tuple after its
// backend left meets one that is still there.
func TestUplinkSYNPicksAfresh(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	dial := func() answer {
		t.Helper()
		var a answer
		in(t, b.client, func() error {
			d := net.Dialer{Timeout: 1500 * time.Millisecond, LocalAddr: &net.TCPAddr{IP: clientIP.AsSlice(), Port: 40404},
				Control: reuseAddr}
			c, err := d.Dial("tcp4", front.String())
			if err != nil {
				a.Err = err
				return nil
			}
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 128)
			n, err := c.Read(buf)
			a = parseAnswer(string(buf[:n]), c.RemoteAddr())
			a.Err = err
			// Closed by the client after the server: no TIME_WAIT here to
			// keep the port.
			return nil
		})
		return a
	}
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, localBE)}, false))
	if a := dial(); a.Err != nil || a.Backend != localBE.String() {
		t.Fatalf("first connection: %+v", a)
	}
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, remoteBE)}, false))
	if a := dial(); a.Err != nil || a.Backend != remoteBE.String() {
		t.Fatalf("the same 5-tuple after %s left: %+v, want %s", localBE, a, remoteBE)
	}
}

// A UDP flow whose backend leaves its Service picks again with its next
// datagram (kube-proxy deletes such conntrack entries); the entries of the
// flow are gone both ways.
func TestUplinkUDPFlowMovesWhenItsBackendLeaves(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, UDP, localBE, remoteBE)}, false))
	var c *net.UDPConn
	in(t, b.client, func() (err error) { c, err = net.ListenUDP("udp4", nil); return err })
	defer c.Close()
	ask := func() answer {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(1500 * time.Millisecond))
		if _, err := c.WriteToUDPAddrPort([]byte("hi"), front); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 128)
		n, from, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("UDP to %s: %v", front, err)
		}
		return parseAnswer(string(buf[:n]), net.UDPAddrFromAddrPort(from))
	}
	first := ask()
	for range 3 {
		if again := ask(); again.Backend != first.Backend {
			t.Fatalf("one flow met %s, then %s", first.Backend, again.Backend)
		}
	}
	stays := remoteBE
	if first.Backend == remoteBE.String() {
		stays = localBE
	}
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, UDP, stays)}, false))
	if moved := ask(); moved.Backend == first.Backend || moved.From != front.String() {
		t.Fatalf("after %s left, the flow met %s (from %s)", first.Backend, moved.Backend, moved.From)
	}
}

// ClientIP affinity: a client's new flows meet the backend it met first.
func TestUplinkAffinity(t *testing.T) {
	b := newUplinkBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	svc := uplinkService(nodeIP, TCP, localBE, remoteBE)
	svc.Affinity = time.Minute
	testutil.Must(t, b.lb.Sync([]Service{svc}, false))
	seen := map[string]int{}
	got := b.delta(func() {
		for range 8 {
			seen[b.tcp(netip.Addr{}, front).Backend]++
		}
	}, "uplink_affinity_hit")
	if len(seen) != 1 || got["uplink_affinity_hit"] != 7 {
		t.Errorf("backends %v, affinity hits %v; want one backend, 7 hits", seen, got)
	}
	affs, err := b.lb.Affinities()
	testutil.Must(t, err)
	if len(affs) != 1 || affs[0].Pod != clientIP {
		t.Errorf("affinities %+v; want one, of client %s", affs, clientIP)
	}
}

// The programs stay first on the uplink: after another program took the
// head, attaching again puts them back before it; RemoveUplink takes them
// off.
func TestUplinkAttachStaysFirst(t *testing.T) {
	b := newUplinkBed(t)
	other, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}})
	testutil.Must(t, err)
	defer other.Close()
	var ifindex int
	in(t, b.node, func() error {
		i, err := net.InterfaceByName("n0")
		if err != nil {
			return err
		}
		ifindex = i.Index
		l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: other, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
		if err != nil {
			return err
		}
		t.Cleanup(func() { l.Close() })
		return b.lb.AttachUplink("n0")
	})
	info, err := b.lb.objs.OncUplinkLbIngress.Info()
	testutil.Must(t, err)
	want, _ := info.ID()
	in(t, b.node, func() error {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
			res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
			if err != nil {
				return err
			}
			if at == ebpf.AttachTCXIngress && (len(res.Programs) != 2 || res.Programs[0].ID != want) {
				t.Errorf("ingress programs %v; want ours (%d) first of two", res.Programs, want)
			}
			if at == ebpf.AttachTCXEgress && len(res.Programs) != 1 {
				t.Errorf("egress programs %v; want ours alone", res.Programs)
			}
		}
		if err := RemoveUplink(b.lb.opts.PinDir); err != nil {
			return err
		}
		res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: ebpf.AttachTCXIngress})
		if err != nil {
			return err
		}
		if len(res.Programs) != 1 || res.Programs[0].ID == want {
			t.Errorf("after RemoveUplink, ingress programs %v; want only the other", res.Programs)
		}
		return nil
	})
}

// serveEcho echoes every TCP connection's and UDP datagram's bytes back,
// on addr in namespace ns.
func serveEcho(t *testing.T, ns string, addr netip.AddrPort) {
	t.Helper()
	in(t, ns, func() error {
		return serveBoth(t, addr, func(c net.Conn) { _, _ = io.Copy(c, c) }, func(msg []byte, _ net.Addr) []byte { return msg })
	})
}

// dialClient opens a connection from the client namespace.
func (b *uplinkBed) dialClient(network string, dst netip.AddrPort) net.Conn {
	b.t.Helper()
	var c net.Conn
	in(b.t, b.client, func() (err error) {
		c, err = net.DialTimeout(network, dst.String(), 2*time.Second)
		return err
	})
	b.t.Cleanup(func() { c.Close() })
	return c
}

// roundTrips sends n messages on c and reads each echo, returning the
// first failure.
func roundTrips(c net.Conn, n int) error {
	buf := make([]byte, 64)
	for i := range n {
		msg := fmt.Sprintf("message %d", i)
		_ = c.SetDeadline(time.Now().Add(time.Second))
		if _, err := c.Write([]byte(msg)); err != nil {
			return err
		}
		got, err := io.ReadAtLeast(c, buf, len(msg))
		if err != nil {
			return err
		}
		if string(buf[:got]) != msg {
			return fmt.Errorf("sent %q, got %q back", msg, buf[:got])
		}
	}
	return nil
}

// With the fast path, an established flow from outside to a backend on
// the node skips the stack both ways (the uplink's fast counters take
// every packet after the first few), bytes intact, conntrack's entry kept
// alive; a closed connection is left to conntrack; evicted, as a policy
// change evicts it, a flow is judged by netfilter again.
func TestUplinkFastPathToALocalBackend(t *testing.T) {
	b := newFastUplinkBed(t)
	echo := netip.AddrPortFrom(localBE.Addr(), 8081)
	serveEcho(t, b.be, echo)
	testutil.Must(t, b.lb.Sync([]Service{uplinkService(nodeIP, TCP, echo), uplinkService(nodeIP, UDP, echo)}, false))
	front := netip.AddrPortFrom(nodeIP, nodePort)
	const n = 40
	for _, network := range []string{"tcp4", "udp4"} {
		got := b.delta(func() {
			if err := roundTrips(b.dialClient(network, front), n); err != nil {
				t.Fatalf("%s: %v", network, err)
			}
		}, "uplink_fast_to_pod", "uplink_fast_reply", "uplink_learned")
		// The slow path carries a flow until it has seen it established
		// both ways: a handful of packets.
		if got["uplink_learned"] != 1 || got["uplink_fast_to_pod"] < n-3 || got["uplink_fast_reply"] < n-3 {
			t.Errorf("%s: counters %v; want 1 flow learned and ≥ %d packets fast each way", network, got, n-3)
		}
	}

	// Closed, a connection's last packets take the stack: conntrack
	// closes it with its own short timeouts, not the fast path's
	// established one.
	c := b.dialClient("tcp4", front)
	testutil.Must(t, roundTrips(c, 5))
	local := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if s, ok := b.conntrack(local, echo); !ok || s < time.Hour {
		t.Fatalf("open: conntrack timeout %v (entry %v); want an established entry's", s, ok)
	}
	c.Close()
	testutil.WaitFor(t, "conntrack closing the connection", 5*time.Second, func() bool {
		s, ok := b.conntrack(local, echo)
		return !ok || s < 5*time.Minute
	})

	// A policy that now denies the flow: netfilter drops it, and the
	// eviction that comes with every policy change sends it back there.
	c = b.dialClient("tcp4", front)
	testutil.Must(t, roundTrips(c, 5))
	in(t, b.node, func() error {
		return exec.Command("iptables", "-I", "FORWARD", "-d", echo.Addr().String(), "-p", "tcp", "-j", "DROP").Run()
	})
	testutil.Must(t, b.fp.EvictFlows(map[netip.Addr]bool{echo.Addr(): true},
		func([]fastpath.Conn) (func(local, remote netip.AddrPort, proto uint8, _ fastpath.Opener) fastpath.Verdict, error) {
			return func(netip.AddrPort, netip.AddrPort, uint8, fastpath.Opener) fastpath.Verdict { return fastpath.Evict }, nil
		}))
	got := b.delta(func() {
		if err := roundTrips(c, 1); err == nil {
			t.Error("a flow netfilter now drops still reached its backend")
		}
	}, "uplink_fast_to_pod", "uplink_fast_reply")
	if got["uplink_fast_to_pod"] != 0 || got["uplink_fast_reply"] != 0 {
		t.Errorf("evicted flow still fast: %v", got)
	}
}

// With connection setup on the fast path, a client's SYN to a backend on
// the node that no policy isolates opens its connection past the stack:
// every packet of it, both ways, SYN and FIN included, rides, and
// conntrack never sees it. An isolated backend (not in onc_open) and a
// node as the client open through the stack; a connection the fast path
// lets go of is handed over to conntrack and goes on through the stack.
func TestUplinkOpensConnectionsToAnOpenBackend(t *testing.T) {
	b, echo := newOpeningEchoBed(t)
	front := netip.AddrPortFrom(nodeIP, nodePort)
	const n = 20
	counters := []string{"uplink_open", "uplink_fast_to_pod", "uplink_fast_reply"}

	// exchange opens a connection, makes n round trips on it and closes
	// it, returning the client's address.
	exchange := func() (client netip.AddrPort) {
		c := b.dialClient("tcp4", front)
		if err := roundTrips(c, n); err != nil {
			t.Fatal(err)
		}
		client = c.LocalAddr().(*net.TCPAddr).AddrPort()
		c.Close()
		return client
	}

	// Open (the first connection of the bed, so that no packet of an
	// earlier one is counted): every packet rides.
	open := map[netip.Addr]bool{localBE.Addr(): true}
	testutil.Must(t, b.fp.SetOpen(open, false))
	var client netip.AddrPort
	got := b.delta(func() {
		client = exchange()
		// The connection's last ACK takes its records along.
		testutil.WaitFor(t, "the close on the fast path", 2*time.Second, func() bool { return !b.remembers(client) })
	}, append(counters, "uplink_translated", "uplink_reversed")...)
	// In: the SYN, the handshake's ACK, n requests; out: the SYN-ACK, n
	// answers. None through the stack (translated there, reversed there).
	if got["uplink_open"] != 1 || got["uplink_fast_to_pod"] < n+1 || got["uplink_fast_reply"] < n+1 ||
		got["uplink_translated"] != got["uplink_open"]+got["uplink_fast_to_pod"] || got["uplink_reversed"] != 0 {
		t.Errorf("an open backend: %v; want 1 connection opened and every packet fast", got)
	}
	// Not even one picked up mid-stream, the ends swapped, from a packet
	// that fell to the stack.
	_, opened := b.conntrack(client, echo)
	_, pickedUp := b.conntrack(echo, client)
	if opened || pickedUp {
		t.Error("conntrack has an entry of a connection the fast path opened and closed")
	}

	// opensThroughTheStack checks that a connection opens through the
	// stack, so that conntrack sees it: not on the fast path.
	opensThroughTheStack := func(what string) {
		got := b.delta(func() { client = exchange() }, counters...)
		if got["uplink_open"] != 0 {
			t.Errorf("%s: %v; want no connection opened on the fast path", what, got)
		}
		if _, ok := b.conntrack(client, echo); !ok {
			t.Errorf("%s: conntrack has no entry of the connection", what)
		}
	}

	// A node's SYN opens through the stack: a reply to a node is the
	// stack's to deliver.
	testutil.Must(t, b.fp.SetHosts([]netip.Addr{clientIP}, false))
	opensThroughTheStack("a node as the client")
	testutil.Must(t, b.fp.SetHosts(nil, false))

	// Isolated (no longer open): conntrack sees the connection open.
	testutil.Must(t, b.fp.SetOpen(nil, false))
	opensThroughTheStack("a backend not open")

	// Handed over (as when a policy now isolates the backend but allows
	// the connection), it goes on through conntrack.
	testutil.Must(t, b.fp.SetOpen(open, false))
	c := b.dialClient("tcp4", front)
	testutil.Must(t, roundTrips(c, 3))
	client = c.LocalAddr().(*net.TCPAddr).AddrPort()
	if f, ok := b.flow(client); !ok || f.Opener != fastpath.OpenedByRemote {
		t.Fatalf("the connection to hand over: flow %+v (%v); want one the fast path opened", f, ok)
	}
	testutil.Must(t, b.fp.SetOpen(nil, false))
	in(t, b.node, func() error { // conntrack's entry is the node's
		return b.fp.EvictFlows(map[netip.Addr]bool{echo.Addr(): true},
			func([]fastpath.Conn) (func(local, remote netip.AddrPort, proto uint8, _ fastpath.Opener) fastpath.Verdict, error) {
				return func(netip.AddrPort, netip.AddrPort, uint8, fastpath.Opener) fastpath.Verdict {
					return fastpath.HandOver
				}, nil
			})
	})
	if left, ok := b.conntrack(client, echo); !ok || left < time.Hour {
		t.Fatalf("handed over: conntrack timeout %v (entry %v); want an established entry's", left, ok)
	}
	if err := roundTrips(c, n); err != nil {
		t.Errorf("a connection handed over to conntrack: %v", err)
	}
}

// A connection the uplink opened on the fast path outlives the agent:
// with the programs' handles closed, as when the agent exits, and while
// the next one loads and before it attaches, the pod's replies still
// leave through the uplink's reply program (onc_hooks is pinned), never
// through the stack, where conntrack would pick the connection up
// mid-stream (and the agent's rule for pods leaving the cluster would
// masquerade it). With the load balancer removed, the slots are empty.
func TestUplinkOpenedConnectionOutlivesTheAgent(t *testing.T) {
	b, echo := newOpeningEchoBed(t)
	testutil.Must(t, b.fp.SetOpen(map[netip.Addr]bool{localBE.Addr(): true}, false))
	c := b.dialClient("tcp4", netip.AddrPortFrom(nodeIP, nodePort))
	testutil.Must(t, roundTrips(c, 3))
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if f, ok := b.flow(client); !ok || f.Opener != fastpath.OpenedByRemote {
		t.Fatalf("flow %+v (%v); want one the fast path opened", f, ok)
	}
	pinDir := b.lb.opts.PinDir
	testutil.Must(t, errors.Join(b.lb.Close(), b.fp.Close()))
	if err := roundTrips(c, 20); err != nil {
		t.Fatalf("no agent: %v", err)
	}
	fp, err := fastpath.Open(b.fpOpts)
	testutil.Must(t, err)
	t.Cleanup(func() { fp.Close() })
	testutil.Must(t, fp.Configure(true))
	lb, err := Open(Options{PinDir: pinDir, FlowCache: fp.FlowCache()})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	if err := roundTrips(c, 20); err != nil {
		t.Fatalf("the next agent loaded, its uplink programs not attached: %v", err)
	}
	in(t, b.node, func() error { return lb.AttachUplink("n0") })
	if err := roundTrips(c, 20); err != nil {
		t.Fatalf("the next agent attached: %v", err)
	}
	_, opened := b.conntrack(client, echo)
	_, pickedUp := b.conntrack(echo, client)
	if opened || pickedUp {
		t.Errorf("conntrack has an entry of the connection (opened %v, picked up %v): a packet took the stack", opened, pickedUp)
	}

	testutil.Must(t, RemoveUplink(pinDir))
	hooks, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, bpf.FastpathMapOncHooks), nil)
	testutil.Must(t, err)
	defer hooks.Close()
	for _, slot := range []uint32{bpf.HookPodToNoPeer, bpf.HookOverlayToNoPod} {
		var id uint32
		if err := hooks.Lookup(slot, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
			t.Errorf("after RemoveUplink, hook %d: program %d (%v); want the slot empty", slot, id, err)
		}
	}
}

// Connections the fast path opened and saw close leave no record behind:
// none in the uplink's flows, none in the flow cache. Else a burst of
// short connections would fill both LRU maps and evict the only record of
// a long idle connection, whose next packets the stack cannot carry (it
// never saw the connection open). The idle one keeps its records and goes
// on. A reset from the client is not trusted to end a connection (one
// from outside may be forged): its records stay.
func TestUplinkForgetsConnectionsThatEnded(t *testing.T) {
	b, _ := newOpeningEchoBed(t)
	testutil.Must(t, b.fp.SetOpen(map[netip.Addr]bool{localBE.Addr(): true}, false))
	front := netip.AddrPortFrom(nodeIP, nodePort)
	idle := b.dialClient("tcp4", front)
	testutil.Must(t, roundTrips(idle, 1))
	idleClient := idle.LocalAddr().(*net.TCPAddr).AddrPort()

	const n = 400
	var clients []netip.AddrPort
	got := b.delta(func() {
		for range n {
			c := b.dialClient("tcp4", front)
			testutil.Must(t, roundTrips(c, 1))
			clients = append(clients, c.LocalAddr().(*net.TCPAddr).AddrPort())
			c.Close()
		}
	}, "uplink_open")
	if got["uplink_open"] != n {
		t.Fatalf("%v; want every connection opened on the fast path", got)
	}
	testutil.WaitFor(t, "the closed connections forgotten", 5*time.Second, func() bool {
		return !slices.ContainsFunc(clients, b.remembers)
	})
	if !b.remembers(idleClient) {
		t.Fatal("the idle connection's records went with the others")
	}
	if err := roundTrips(idle, 3); err != nil {
		t.Fatalf("the idle connection after %d others closed: %v", n, err)
	}

	reset := b.dialClient("tcp4", front)
	testutil.Must(t, roundTrips(reset, 1))
	resetClient := reset.LocalAddr().(*net.TCPAddr).AddrPort()
	testutil.Must(t, reset.(*net.TCPConn).SetLinger(0))
	reset.Close()
	time.Sleep(200 * time.Millisecond)
	if !b.remembers(resetClient) {
		t.Error("a reset from the client ended the connection's records; want them kept (it may be forged)")
	}
}

// remembers reports whether the node holds a record of the connection
// from client: an entry of the uplink's flows either way, or of the flow
// cache.
func (b *uplinkBed) remembers(client netip.AddrPort) bool {
	b.t.Helper()
	if _, ok := b.flow(client); ok {
		return true
	}
	var (
		k bpf.ServicesLbFlowKey
		v bpf.ServicesLbFlow
	)
	ip, port := bpf.NetIPv4(client.Addr()), bpf.NetPort(client.Port())
	it := b.lb.maps.OncLbFlows.Iterate()
	for it.Next(&k, &v) {
		if (k.Saddr == ip && k.Sport == port) || (k.Daddr == ip && k.Dport == port) {
			return true
		}
	}
	testutil.Must(b.t, it.Err())
	return false
}

// flow is the node's filter entry of the connection from client.
func (b *uplinkBed) flow(client netip.AddrPort) (fastpath.Flow, bool) {
	b.t.Helper()
	flows, err := b.fp.Flows()
	testutil.Must(b.t, err)
	for _, f := range flows {
		if f.Remote == client {
			return f, true
		}
	}
	return fastpath.Flow{}, false
}

// conntrack is the timeout left on the node's entry of the TCP connection
// from client to backend, if it has one.
func (b *uplinkBed) conntrack(client, backend netip.AddrPort) (left time.Duration, ok bool) {
	b.t.Helper()
	in(b.t, b.node, func() error {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
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
