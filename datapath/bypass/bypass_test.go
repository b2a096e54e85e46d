//go:build privileged

package bypass

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/pods"

	"github.com/onc-net/onc/internal/netns"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// bed is one dual-stack node as ONC wires it: a node namespace that
// routes between pod namespaces over veths (pods.Setup), a bypass loaded
// on a private bpffs and attached to a throwaway cgroup this test process
// joins, so it acts on the test's sockets only. Its helpers connect pods
// over IPv4, or over IPv6 in a bed of newBed6.
type bed struct {
	t      *testing.T
	prefix string
	node   string                // node namespace path
	pods   map[string]netip.Addr // IPv4 addresses
	pods6  map[string]netip.Addr // IPv6 addresses
	netns  map[string]string     // pod → namespace path
	v6     bool                  // the helpers' connections are IPv6
	pinDir string
	cgroup string
	bp     *Bypass
	events *bpf.FlowCache // the fast path's, whose flow events the bypass shares; nil: none
}

var (
	gateway  = netip.MustParseAddr("10.77.0.1")
	gateway6 = netip.MustParseAddr("fd77::1")
)

func newBed(t *testing.T, names ...string) *bed {
	t.Helper()
	b := newPods(t, names...)
	b.pinDir = pinDir(t)
	b.bp = b.open()
	testutil.Must(t, b.bp.SetConfig(Config{Mode: On}))
	b.ownAll(b.bp)
	return b
}

// newBed6 is newBed whose helpers connect the pods over IPv6.
func newBed6(t *testing.T, names ...string) *bed {
	t.Helper()
	b := newBed(t, names...)
	b.v6 = true
	return b
}

// families runs test with an IPv4 bed and an IPv6 one.
func families(t *testing.T, test func(t *testing.T, newBed func(*testing.T, ...string) *bed)) {
	t.Run("ipv4", func(t *testing.T) { test(t, newBed) })
	t.Run("ipv6", func(t *testing.T) { test(t, newBed6) })
}

// newPods is a bed without a bypass.
func newPods(t *testing.T, names ...string) *bed {
	t.Helper()
	testutil.Privileged(t)
	b := &bed{t: t, prefix: testutil.Prefix(), pods: map[string]netip.Addr{}, pods6: map[string]netip.Addr{}, netns: map[string]string{}}
	b.cgroup = bpftest.Cgroup(t)
	bpftest.JoinCgroup(t, b.cgroup)
	b.node = testutil.Netns(t, b.prefix+"-node")
	run(t, "ip", "netns", "exec", b.prefix+"-node", "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1")
	run(t, "ip", "-n", b.prefix+"-node", "link", "set", "lo", "up")
	for i, name := range names {
		ip := netip.AddrFrom4([4]byte{10, 77, 0, byte(2 + i)})
		ip6 := netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x77, 15: byte(2 + i)})
		ns := testutil.Netns(t, b.prefix+"-"+name)
		b.inNetns(b.node, func() error {
			_, err := pods.Setup(pods.Pod{Netns: ns, IfName: "eth0", HostIface: b.prefix + name,
				IPs: []netip.Addr{ip, ip6}, Gateways: []netip.Addr{gateway, gateway6}, MTU: 1500})
			return err
		})
		b.pods[name], b.pods6[name], b.netns[name] = ip, ip6, ns
	}
	return b
}

// pinDir is a private bpffs, one agent's.
func pinDir(t *testing.T) string {
	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// own registers pod's address ip with bp, as the node does at CNI ADD.
func (b *bed) own(bp *Bypass, pod string, ip netip.Addr) {
	b.t.Helper()
	cookie, err := netns.Cookie(b.netns[pod])
	testutil.Must(b.t, err)
	testutil.Must(b.t, bp.OwnPod(ip, b.netns[pod], cookie))
}

// ownAll registers every pod with bp by both its addresses.
func (b *bed) ownAll(bp *Bypass) {
	b.t.Helper()
	for name := range b.netns {
		b.own(bp, name, b.pods[name])
		b.own(bp, name, b.pods6[name])
	}
}

// ip is pod's address in the bed's family.
func (b *bed) ip(pod string) netip.Addr {
	if b.v6 {
		return b.pods6[pod]
	}
	return b.pods[pod]
}

// gw is the node's gateway address in the bed's family.
func (b *bed) gw() netip.Addr {
	if b.v6 {
		return gateway6
	}
	return gateway
}

// network is the bed's family as net.Dial names it.
func (b *bed) network() string {
	if b.v6 {
		return "tcp6"
	}
	return "tcp4"
}

// hostAddr gives the node namespace the gateway address as the node's
// own, for connections between the host and a pod.
func (b *bed) hostAddr() {
	b.t.Helper()
	run(b.t, "ip", "-n", b.prefix+"-node", "addr", "add", netip.PrefixFrom(b.gw(), b.gw().BitLen()).String(), "dev", "lo")
}

// iptables runs iptables, or ip6tables in an IPv6 bed, in the node.
func (b *bed) iptables(args ...string) {
	b.t.Helper()
	cmd := "iptables"
	if b.v6 {
		cmd = "ip6tables"
	}
	run(b.t, "ip", append([]string{"netns", "exec", b.prefix + "-node", cmd}, args...)...)
}

// open loads and attaches a bypass on the bed's pins, as an agent does.
func (b *bed) open() *Bypass {
	b.t.Helper()
	bp, err := Open(Options{PinDir: b.pinDir, Cgroup: b.cgroup, Events: b.events})
	testutil.Must(b.t, err)
	b.t.Cleanup(func() { bp.Close() })
	testutil.Must(b.t, bp.Attach())
	return bp
}

// readEvents loads the fast path on the bed's pins with flow events on and
// opens the bypass again sharing their ring, as a restarted agent does,
// and reads the events.
func (b *bed) readEvents() *bpftest.Events {
	b.t.Helper()
	fp, err := fastpath.Open(fastpath.Options{PinDir: b.pinDir, VNI: 1, Port: 4789, Mark: 0x4000, NodeIP: netip.MustParseAddr("192.0.2.1"),
		PodCIDR: netip.MustParsePrefix("10.77.0.0/24"), EventsPerSecond: 1000})
	testutil.Must(b.t, err)
	b.t.Cleanup(func() { fp.Close() })
	testutil.Must(b.t, b.bp.Close())
	b.events = fp.FlowCache()
	b.bp = b.open()
	return bpftest.ReadEvents(b.t, fp.Events())
}

func (b *bed) inNetns(path string, fn func() error) {
	b.t.Helper()
	ns, err := netns.Open(path)
	testutil.Must(b.t, err)
	defer ns.Close()
	testutil.Must(b.t, netns.Do(ns, fn))
}

// listen opens a TCP listener in pod's namespace on port (0: any).
func (b *bed) listen(pod string, port int) *net.TCPListener {
	b.t.Helper()
	var l net.Listener
	b.inNetns(b.netns[pod], func() (err error) {
		l, err = net.Listen(b.network(), netip.AddrPortFrom(b.ip(pod), uint16(port)).String())
		return err
	})
	b.t.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

// dial connects from the namespace at path to addr.
func (b *bed) dial(path string, addr net.Addr) *net.TCPConn {
	b.t.Helper()
	var c net.Conn
	b.inNetns(path, func() (err error) {
		c, err = net.DialTimeout(b.network(), addr.String(), 5*time.Second)
		return err
	})
	b.t.Cleanup(func() { c.Close() })
	return c.(*net.TCPConn)
}

// pair is a connection from pod a to a listener in pod b: client end,
// accepted end.
func (b *bed) pair(from, to string) (*net.TCPConn, *net.TCPConn) {
	b.t.Helper()
	l := b.listen(to, 0)
	c := b.dial(b.netns[from], l.Addr())
	s, err := l.AcceptTCP()
	testutil.Must(b.t, err)
	b.t.Cleanup(func() { s.Close() })
	return c, s
}

func (b *bed) stat(name string) uint64 {
	b.t.Helper()
	return bpftest.Counter(b.t, b.bp.Stats, name)
}

// conn is the map's entry for the connection with client end c, if any.
func (b *bed) conn(c *net.TCPConn) (Conn, bool) {
	b.t.Helper()
	conns, err := b.bp.Conns()
	testutil.Must(b.t, err)
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	for _, x := range conns {
		if x.Client == client {
			return x, true
		}
	}
	return Conn{}, false
}

func (b *bed) waitGone(c *net.TCPConn) {
	b.t.Helper()
	testutil.WaitFor(b.t, "connection gone from the bypass map", 5*time.Second, func() bool {
		_, ok := b.conn(c)
		return !ok
	})
}

// TestTransferIntact: a connection between two pods, in each family, is
// in the map with both ends, and its bytes arrive intact both ways, every
// one redirected.
func TestTransferIntact(t *testing.T) {
	families(t, func(t *testing.T, newBed func(*testing.T, ...string) *bed) {
		b := newBed(t, "a", "b")
		c, s := b.pair("a", "b")
		conn, ok := b.conn(c)
		if !ok || !conn.Paired() {
			t.Fatalf("connection %s -> %s not paired in the map: %+v (ok=%v)", c.LocalAddr(), c.RemoteAddr(), conn, ok)
		}
		if conn.Client.Addr() != b.ip("a") || conn.Server != s.LocalAddr().(*net.TCPAddr).AddrPort() {
			t.Fatalf("connection decoded as %s -> %s, want %s -> %s", conn.Client, conn.Server, c.LocalAddr(), s.LocalAddr())
		}
		const size, back = 256 << 20, 64 << 20
		before := b.stat("redirected_bytes")
		for _, d := range []struct {
			w, r *net.TCPConn
			size int
		}{{c, s, size}, {s, c, back}} {
			if sent, got := transfer(t, d.w, d.r, d.size, nil); sent != got {
				t.Fatalf("%s -> %s: sha256 differs: sent %x, received %x", d.w.LocalAddr(), d.r.LocalAddr(), sent, got)
			}
		}
		if n := b.stat("redirected_bytes") - before; n < size+back {
			t.Fatalf("only %d of %d bytes redirected", n, size+back)
		}
		c.Close()
		s.Close()
		b.waitGone(c)
	})
}

// transfer sends size random bytes from w to r (closing w's write side at
// the end) and returns the sha256 of what was sent and of what was read;
// midway calls at half the size, while the stream runs.
func transfer(t *testing.T, w, r *net.TCPConn, size int, midway func()) (sent, got [32]byte) {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		h := sha256.New()
		_, err := io.Copy(h, r)
		copy(got[:], h.Sum(nil))
		done <- err
	}()
	h := sha256.New()
	buf := make([]byte, 64<<10)
	for n := 0; n < size; n += len(buf) {
		if _, err := rand.Read(buf); err != nil {
			t.Fatal(err)
		}
		if n == size/2 && midway != nil {
			midway()
		}
		h.Write(buf)
		if _, err := w.Write(buf); err != nil {
			t.Fatalf("write at %d: %v", n, err)
		}
	}
	copy(sent[:], h.Sum(nil))
	testutil.Must(t, w.CloseWrite())
	select {
	case err := <-done:
		testutil.Must(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("reader stalled")
	}
	return sent, got
}

func TestSwitchedOffMidStream(t *testing.T) {
	b := newBed(t, "a", "b")
	c, s := b.pair("a", "b")
	var redirected, stack uint64
	sent, got := transfer(t, c, s, 64<<20, func() {
		redirected = b.stat("redirected_msgs")
		testutil.Must(t, b.bp.SetConfig(Config{Mode: Off}))
		stack = b.stat("stack_msgs")
	})
	if sent != got {
		t.Fatal("sha256 differs after switching the bypass off mid-stream")
	}
	if redirected == 0 || b.stat("stack_msgs") == stack {
		t.Fatalf("the stream should have gone from the bypass (%d messages) to the stack (none after the switch)", redirected)
	}
	if b.stat("fallback_off") == 0 {
		t.Fatal("fallback_off not counted")
	}
	// New connections stay on the stack.
	c2, _ := b.pair("a", "b")
	if _, ok := b.conn(c2); ok {
		t.Fatal("a connection opened with the bypass off is in the map")
	}
}

func TestRestartMidStream(t *testing.T) {
	b := newBed(t, "a", "b")
	c, s := b.pair("a", "b")
	sent, got := transfer(t, c, s, 64<<20, func() {
		// The agent goes away and a new one adopts the pins.
		testutil.Must(t, b.bp.Close())
		b.bp = b.open()
		b.ownAll(b.bp)
	})
	if sent != got {
		t.Fatal("sha256 differs across an agent restart")
	}
	if b.bp.Config().Mode != On {
		t.Fatalf("restart lost the setting: %s", b.bp.Config())
	}
	c2, s2 := b.pair("a", "b")
	if conn, ok := b.conn(c2); !ok || !conn.Paired() {
		t.Fatal("a connection opened after the restart is not bypassed")
	}
	before := b.stat("redirected_msgs")
	echo(t, c2, s2, []byte("after restart"))
	if b.stat("redirected_msgs") == before {
		t.Fatal("sends after the restart not redirected")
	}
}

// An agent of this version on a v0 agent's pins (one object per
// program): the maps kept their layout and are adopted, so a connection
// the v0 programs bypass streams on intact across the upgrade and stays
// in the map, the setting carries over, and new connections are bypassed
// by the new programs.
func TestUpgradeFromV0MidStream(t *testing.T) {
	b := newPods(t, "a", "b")
	b.pinDir = pinDir(t)
	testutil.Must(t, bpf.EnsurePinDir(b.pinDir))
	// The v0 agent, attached and switched on.
	ops, msg := bpftest.LoadV0(t, bpftest.V0SockOps, b.pinDir), bpftest.LoadV0(t, bpftest.V0SkMsg, b.pinDir)
	testutil.Must(t, bpf.AttachCgroup(sockopsPin(b.pinDir), b.cgroup, ebpf.AttachCGroupSockOps, ops.Programs["onc_sock_ops"]))
	testutil.Must(t, link.RawAttachProgram(link.RawAttachProgramOptions{Target: ops.Maps["onc_bp_sock"].FD(),
		Program: msg.Programs["onc_sk_msg"], Attach: ebpf.AttachSkMsgVerdict}))
	limit, err := maxQueued()
	testutil.Must(t, err)
	testutil.Must(t, ops.Maps["onc_bp_cfg"].Put(uint32(0), bpf.BypassBpCfg{Mode: modeValue[On], MaxQueued: limit}))
	for name, ip := range b.pods {
		cookie, err := netns.Cookie(b.netns[name])
		testutil.Must(t, err)
		testutil.Must(t, ops.Maps["onc_bp_pods"].Put(bpf.NetIPv4(ip), cookie))
	}
	sockops := sockopsLinkID(t, b.pinDir)

	c, s := b.pair("a", "b")
	if n := bpftest.Entries(t, ops.Maps["onc_bp_conn"]); n != 2 {
		t.Fatalf("the v0 programs recorded %d sockets, want both ends", n)
	}
	sent, got := transfer(t, c, s, 64<<20, func() {
		ops.Close()
		msg.Close()
		b.bp = b.open()
		b.ownAll(b.bp)
	})
	if sent != got {
		t.Fatal("sha256 differs across the upgrade")
	}
	if b.bp.Config().Mode != On {
		t.Fatalf("the upgrade lost the setting: %s", b.bp.Config())
	}
	if conn, ok := b.conn(c); !ok || !conn.Paired() {
		t.Fatal("the connection the v0 programs recorded is gone from the map")
	}
	if sockopsLinkID(t, b.pinDir) != sockops {
		t.Fatal("the upgrade attached a new sockops link, want the v0 one adopted")
	}
	c2, s2 := b.pair("a", "b")
	if conn, ok := b.conn(c2); !ok || !conn.Paired() {
		t.Fatal("a connection opened after the upgrade is not bypassed")
	}
	before := b.stat("redirected_msgs")
	echo(t, c2, s2, []byte("after the upgrade"))
	if b.stat("redirected_msgs") == before {
		t.Fatal("sends after the upgrade not redirected")
	}
}

func sockopsLinkID(t *testing.T, pinDir string) link.ID {
	t.Helper()
	l, err := link.LoadPinnedLink(sockopsPin(pinDir), nil)
	testutil.Must(t, err)
	defer l.Close()
	info, err := l.Info()
	testutil.Must(t, err)
	return info.ID
}

// echo writes msg on c and expects to read it on s, then the other way.
func echo(t *testing.T, c, s *net.TCPConn, msg []byte) {
	t.Helper()
	for _, p := range [][2]*net.TCPConn{{c, s}, {s, c}} {
		if _, err := p[0].Write(msg); err != nil {
			t.Fatal(err)
		}
		got := make([]byte, len(msg))
		testutil.Must(t, p[1].SetReadDeadline(time.Now().Add(5*time.Second)))
		if _, err := io.ReadFull(p[1], got); err != nil || !bytes.Equal(got, msg) {
			t.Fatalf("read %q, %v; want %q", got, err, msg)
		}
	}
}

// both runs a scenario with the bypass off and on and requires the same
// outcome, and that the bypass carried bytes when on.
func both(t *testing.T, scenario func(testing.TB, bypasstest.Pair) bypasstest.Outcome) {
	t.Helper()
	var off, on bypasstest.Outcome
	t.Run("off", func(t *testing.T) {
		b := newBed(t, "a", "b")
		testutil.Must(t, b.bp.SetConfig(Config{Mode: Off}))
		off = scenario(t, func() (*net.TCPConn, *net.TCPConn) { return b.pair("a", "b") })
		if n := b.stat("redirected_msgs"); n != 0 {
			t.Fatalf("%d messages redirected with the bypass off", n)
		}
	})
	t.Run("on", func(t *testing.T) {
		b := newBed(t, "a", "b")
		on = scenario(t, func() (*net.TCPConn, *net.TCPConn) { return b.pair("a", "b") })
		if b.stat("redirected_msgs") == 0 {
			t.Fatal("nothing redirected with the bypass on")
		}
	})
	if fmt.Sprint(off) != fmt.Sprint(on) {
		t.Fatalf("outcomes differ:\n off: %v\n on:  %v", off, on)
	}
	t.Logf("outcome: %v", on)
}

func TestHalfClose(t *testing.T) { both(t, bypasstest.HalfClose) }

func TestPeerDiesMidStream(t *testing.T) { both(t, bypasstest.PeerDies) }

func TestManyConnections(t *testing.T) {
	b := newBed(t, "a", "b")
	l := b.listen("b", 0)
	bypasstest.ServeEcho(l)
	const n = 200
	before := b.stat("recorded")
	bypasstest.EchoMany(t, n, func() *net.TCPConn { return b.dial(b.netns["a"], l.Addr()) })
	if rec := b.stat("recorded") - before; rec < 2*n {
		t.Fatalf("%d sockets recorded for %d connections, want both ends of each", rec, n)
	}
}

// TestOnlyPodsOfThisNode: connections with the host, with another node's
// pods (another agent's, sharing the kernel) and of a pod with itself
// never enter the map, and are not disturbed; in each family.
func TestOnlyPodsOfThisNode(t *testing.T) {
	families(t, func(t *testing.T, newBed func(*testing.T, ...string) *bed) {
		b := newBed(t, "a", "b", "c")
		// c is another node's pod: a second agent owns it.
		other, err := Open(Options{PinDir: pinDir(t), Cgroup: b.cgroup})
		testutil.Must(t, err)
		t.Cleanup(func() { other.Close() })
		testutil.Must(t, b.bp.ForgetPods(func(a netip.Addr) bool { return a != b.pods["c"] && a != b.pods6["c"] }))
		testutil.Must(t, other.Attach())
		testutil.Must(t, other.SetConfig(Config{Mode: On}))
		b.own(other, "c", b.ip("c"))

		check := func(what string, c, s *net.TCPConn) {
			t.Helper()
			echo(t, c, s, []byte(what))
			for _, bp := range []*Bypass{b.bp, other} {
				conns, err := bp.Conns()
				testutil.Must(t, err)
				if len(conns) != 0 {
					t.Fatalf("%s: in the map: %+v", what, conns)
				}
			}
		}
		c, s := b.pair("a", "c")
		check("pod to another node's pod", c, s)
		c, s = b.pair("c", "b")
		check("another node's pod to a pod", c, s)

		// The host to a pod and back.
		b.hostAddr()
		l := b.listen("a", 0)
		hc := b.dial(b.node, l.Addr())
		hs, err := l.AcceptTCP()
		testutil.Must(t, err)
		check("host to pod", hc, hs)
		var hl net.Listener
		b.inNetns(b.node, func() (err error) {
			hl, err = net.Listen(b.network(), netip.AddrPortFrom(b.gw(), 0).String())
			return err
		})
		t.Cleanup(func() { hl.Close() })
		pc := b.dial(b.netns["a"], hl.Addr())
		ps, err := hl.Accept()
		testutil.Must(t, err)
		check("pod to host", pc, ps.(*net.TCPConn))

		// A pod with itself goes over lo.
		self := b.listen("a", 0)
		sc := b.dial(b.netns["a"], self.Addr())
		ss, err := self.AcceptTCP()
		testutil.Must(t, err)
		check("pod to itself", sc, ss)
		if b.stat("skip_remote") == 0 {
			t.Fatal("skip_remote not counted")
		}
	})
}

// TestOnlyThePodsNamespace: a socket with a pod's address in a namespace
// that is not the pod's (as a hostNetwork pod's, or one that took the
// address) is never recorded, in each family: here c's addresses are
// registered with a's namespace. The other end, a pod's, is recorded
// alone, and its sends miss and take the stack.
func TestOnlyThePodsNamespace(t *testing.T) {
	families(t, func(t *testing.T, newBed func(*testing.T, ...string) *bed) {
		b := newBed(t, "a", "b", "c")
		testutil.Must(t, b.bp.ForgetPods(func(a netip.Addr) bool { return a != b.pods["c"] && a != b.pods6["c"] }))
		cookie, err := netns.Cookie(b.netns["a"])
		testutil.Must(t, err)
		testutil.Must(t, b.bp.OwnPod(b.ip("c"), b.netns["a"], cookie))
		c, s := b.pair("c", "b")
		redirected := b.stat("redirected_msgs")
		echo(t, c, s, []byte("not the pod's namespace"))
		conn, ok := b.conn(c)
		if !ok || conn.ClientCookie != 0 || conn.ServerCookie == 0 {
			t.Fatalf("want only the server end in the map, have %+v (ok=%v)", conn, ok)
		}
		if b.stat("redirected_msgs") != redirected || b.stat("fallback_miss") != 1 {
			t.Fatalf("redirected %d messages, fallback_miss %d: want none, and the server's first send a miss",
				b.stat("redirected_msgs")-redirected, b.stat("fallback_miss"))
		}
	})
}

// TestSplice records the kernel limit that keeps the bypass off by
// default (docs/bypass.md): splice(2) reads a socket's TCP receive queue
// only, so a relay that splices (Go's io.Copy from one TCP connection to
// another, haproxy) never sees bypassed bytes, and reads the FIN as the
// end of an empty stream. When a kernel lifts it, this test fails, and
// the docs and the default are to be revisited.
func TestSplice(t *testing.T) {
	relayed := map[Mode]int64{}
	for _, mode := range []Mode{Off, On} {
		b := newBed(t, "a", "b")
		testutil.Must(t, b.bp.SetConfig(Config{Mode: mode}))
		c, s := b.pair("a", "b")
		out, sink := b.pair("b", "a")
		go func() { _, _ = io.Copy(io.Discard, sink) }()
		_, err := c.Write([]byte("through a splicing relay"))
		testutil.Must(t, err)
		testutil.Must(t, c.CloseWrite())
		n, err := io.Copy(out, s) // splices s into out
		testutil.Must(t, err)
		relayed[mode] = n
	}
	if relayed[Off] != 24 || relayed[On] != 0 {
		t.Fatalf("relayed %d bytes with the bypass off, %d with it on; the kernel's splice limit (24, 0) changed", relayed[Off], relayed[On])
	}
}

// TestStalledReader: a receiver that stops reading holds back its peer,
// as TCP's flow control does, instead of letting it queue without bound;
// when it reads again, every byte arrives in order.
func TestStalledReader(t *testing.T) {
	b := newBed(t, "a", "b")
	limit, err := maxQueued()
	testutil.Must(t, err)
	c, s := b.pair("a", "b")
	const size = 256 << 20
	var sent atomic.Int64
	sum := make(chan []byte, 1)
	go func() {
		h := sha256.New()
		buf := make([]byte, 64<<10)
		for sent.Load() < size {
			_, _ = rand.Read(buf)
			h.Write(buf)
			if _, err := c.Write(buf); err != nil {
				break
			}
			sent.Add(int64(len(buf)))
		}
		_ = c.CloseWrite()
		sum <- h.Sum(nil)
	}()
	testutil.WaitFor(t, "the receiver's queue to reach its bound", 10*time.Second, func() bool {
		return b.stat("fallback_peer_full") > 0
	})
	// Then the stack's flow control holds the writer back.
	last := int64(-1)
	for sent.Load() != last {
		last = sent.Load()
		time.Sleep(300 * time.Millisecond)
	}
	// The receiver's bypass queue, plus what the stack then buffers in
	// both sockets.
	if bound := int64(limit) + 16<<20; last > bound {
		t.Fatalf("a stalled reader let its peer queue %d MiB (bound %d MiB)", last>>20, bound>>20)
	}
	got := sha256.New()
	n, err := io.Copy(got, s)
	testutil.Must(t, err)
	if want := <-sum; n != size || !bytes.Equal(got.Sum(nil), want) {
		t.Fatalf("read %d bytes (want %d), sha256 equal: %v", n, size, bytes.Equal(got.Sum(nil), want))
	}
	if n := b.stat("fallback_peer_full"); n != 1 {
		t.Fatalf("fallback_peer_full = %d, want 1", n)
	}
	t.Logf("writer held back after %d MiB (limit %d MiB)", last>>20, limit>>20)
}

// TestDualStackServer: a server listening on a dual-stack socket (Go's
// net.Listen("tcp", ":port")) talks IPv4 through v4-mapped addresses; its
// connections are bypassed, and ended, like AF_INET ones; its IPv6 ones
// are bypassed as IPv6.
func TestDualStackServer(t *testing.T) {
	b := newBed(t, "a", "b")
	var l net.Listener
	b.inNetns(b.netns["b"], func() (err error) { l, err = net.Listen("tcp", ":0"); return err })
	t.Cleanup(func() { l.Close() })
	port := l.Addr().(*net.TCPAddr).Port
	c := b.dial(b.netns["a"], &net.TCPAddr{IP: b.pods["b"].AsSlice(), Port: port})
	sc, err := l.Accept()
	testutil.Must(t, err)
	s := sc.(*net.TCPConn)
	t.Cleanup(func() { s.Close() })
	if !s.LocalAddr().(*net.TCPAddr).AddrPort().Addr().Is4In6() {
		t.Fatalf("the accepted socket is not dual-stack: %s", s.LocalAddr())
	}
	conn, ok := b.conn(c)
	if !ok || !conn.Paired() || conn.Server != netip.AddrPortFrom(b.pods["b"], uint16(port)) {
		t.Fatalf("dual-stack connection not paired in the map: %+v (ok=%v)", conn, ok)
	}
	before := b.stat("redirected_msgs")
	echo(t, c, s, []byte("both ways"))
	if b.stat("redirected_msgs")-before != 2 {
		t.Fatal("the dual-stack connection's sends are not both redirected")
	}
	sent, got := transfer(t, c, s, 16<<20, nil)
	if sent != got {
		t.Fatal("sha256 differs")
	}
	testutil.Must(t, b.bp.Destroy(conn))
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Fatal("the dual-stack end survived Destroy")
	}

	// The same listener's IPv6 connections are bypassed in IPv6's maps.
	b.v6 = true
	c6 := b.dial(b.netns["a"], &net.TCPAddr{IP: b.pods6["b"].AsSlice(), Port: port})
	sc6, err := l.Accept()
	testutil.Must(t, err)
	s6 := sc6.(*net.TCPConn)
	t.Cleanup(func() { s6.Close() })
	conn, ok = b.conn(c6)
	if !ok || !conn.Paired() || conn.Server != netip.AddrPortFrom(b.pods6["b"], uint16(port)) {
		t.Fatalf("IPv6 connection to the dual-stack listener not paired in the map: %+v (ok=%v)", conn, ok)
	}
	before = b.stat("redirected_msgs")
	echo(t, c6, s6, []byte("both ways in IPv6"))
	if b.stat("redirected_msgs")-before != 2 {
		t.Fatal("the IPv6 connection's sends are not both redirected")
	}
}

// TestConntrackKept: a bypassed connection passes no packet through
// conntrack, so without KeepConntrack its entry expires and the FIN that
// ends it is INVALID, which policy drops: the peer would never see EOF.
// In each family.
func TestConntrackKept(t *testing.T) {
	families(t, func(t *testing.T, newBed func(*testing.T, ...string) *bed) {
		for _, keep := range []bool{false, true} {
			t.Run(fmt.Sprintf("keep=%v", keep), func(t *testing.T) {
				b := newBed(t, "a", "b")
				b.iptables("-A", "FORWARD", "-m", "conntrack", "--ctstate", "INVALID", "-j", "DROP")
				run(t, "ip", "netns", "exec", b.prefix+"-node", "sysctl", "-qw", "net.netfilter.nf_conntrack_tcp_timeout_established=2")
				c, s := b.pair("a", "b")
				echo(t, c, s, []byte("bypassed"))
				for range 8 { // 4 s: twice the timeout
					if keep {
						b.inNetns(b.node, func() error {
							n, err := b.bp.KeepConntrack()
							if err == nil && n != 1 {
								err = fmt.Errorf("refreshed %d entries, want 1", n)
							}
							return err
						})
					}
					time.Sleep(500 * time.Millisecond)
				}
				echo(t, c, s, []byte("still bypassed"))
				c.Close()
				testutil.Must(t, s.SetReadDeadline(time.Now().Add(3*time.Second)))
				_, err := s.Read(make([]byte, 1))
				if keep && !errors.Is(err, io.EOF) {
					t.Fatalf("the peer read %v, want EOF", err)
				}
				if !keep && !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Fatalf("without refreshing, the FIN still arrived (%v): the test proves nothing", err)
				}
			})
		}
	})
}

// TestPaused: while a policy change is applied, no new connection is
// recorded; one opened meanwhile stays on the stack for good.
func TestPaused(t *testing.T) {
	b := newBed(t, "a", "b")
	var during *net.TCPConn
	testutil.Must(t, b.bp.Paused(func() error {
		var s *net.TCPConn
		during, s = b.pair("a", "b")
		echo(t, during, s, []byte("paused"))
		return nil
	}))
	if _, ok := b.conn(during); ok {
		t.Fatal("a connection opened while paused is in the map")
	}
	if b.stat("skip_paused") != 2 {
		t.Fatalf("skip_paused = %d, want both ends", b.stat("skip_paused"))
	}
	after, _ := b.pair("a", "b")
	if conn, ok := b.conn(after); !ok || !conn.Paired() {
		t.Fatal("recording did not resume")
	}
}

// TestUpgradeIncompatiblePins: maps pinned by a version with another
// layout are replaced, and the old setting is switched off first, so the
// connections they carry send by the stack rather than by a setting
// nobody controls.
func TestUpgradeIncompatiblePins(t *testing.T) {
	dir := pinDir(t)
	testutil.Must(t, bpf.EnsurePinDir(dir))
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "onc_bp_cfg", Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	testutil.Must(t, err)
	t.Cleanup(func() { old.Close() })
	testutil.Must(t, old.Put(uint32(0), uint32(1))) // mode on
	testutil.Must(t, old.Pin(filepath.Join(dir, "onc_bp_cfg")))
	bp, err := Open(Options{PinDir: dir, Cgroup: bpftest.Cgroup(t)})
	testutil.Must(t, err)
	t.Cleanup(func() { bp.Close() })
	var v uint32
	testutil.Must(t, old.Lookup(uint32(0), &v))
	if v != 0 {
		t.Fatalf("the old pinned setting is %d, want 0 (off)", v)
	}
	if bp.Config().Mode != Off {
		t.Fatalf("the new bypass starts %s, want off until set", bp.Config())
	}
}

// TestReusedTuple: a socket reset while its application keeps the file
// open stays in the map (the kernel unlinks it at close), and its address
// and port pair is free again. A new connection with the same pair must
// take its place: a send to the dead socket would be lost.
func TestReusedTuple(t *testing.T) {
	b := newBed(t, "a", "b")
	l := b.listen("b", 0)
	var port int
	b.inNetns(b.netns["a"], func() error {
		probe, err := net.Listen("tcp4", b.pods["a"].String()+":0")
		port = probe.Addr().(*net.TCPAddr).Port
		probe.Close()
		return err
	})
	dialFrom := func() *net.TCPConn {
		var c net.Conn
		b.inNetns(b.netns["a"], func() (err error) {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: b.pods["a"].AsSlice(), Port: port}, Timeout: 5 * time.Second}
			c, err = d.Dial("tcp4", l.Addr().String())
			return err
		})
		return c.(*net.TCPConn)
	}
	c1 := dialFrom()
	zombie, err := l.AcceptTCP()
	testutil.Must(t, err)
	t.Cleanup(func() { zombie.Close() })
	echo(t, c1, zombie, []byte("first"))
	testutil.Must(t, c1.SetLinger(0))
	c1.Close() // a reset: zombie is dead but its file stays open
	_, err = zombie.Read(make([]byte, 1))
	if err == nil {
		t.Fatal("the reset did not reach the server")
	}
	c2 := dialFrom()
	t.Cleanup(func() { c2.Close() })
	s2, err := l.AcceptTCP()
	testutil.Must(t, err)
	t.Cleanup(func() { s2.Close() })
	if s2.RemoteAddr().String() != zombie.RemoteAddr().String() {
		t.Fatalf("the new connection's pair %s differs from the dead one's %s", s2.RemoteAddr(), zombie.RemoteAddr())
	}
	echo(t, c2, s2, []byte("second"))
	if conn, ok := b.conn(c2); !ok || !conn.Paired() {
		t.Fatalf("the new connection is not bypassed: %+v", conn)
	}
}

// TestPairEvent: a connection between two pods gives one pair event,
// client to server, however many messages it carries, in each family; a
// connection from the node to a pod, never recorded, gives none.
func TestPairEvent(t *testing.T) {
	families(t, func(t *testing.T, newBed func(*testing.T, ...string) *bed) {
		b := newBed(t, "a", "b")
		ev := b.readEvents()
		c, s := b.pair("a", "b")
		for range 3 {
			echo(t, c, s, []byte("hello"))
		}
		client, server := c.LocalAddr().(*net.TCPAddr).AddrPort(), s.LocalAddr().(*net.TCPAddr).AddrPort()
		evs := ev.Collect("")
		if len(evs) != 1 || evs[0].Class != "pair" || evs[0].Src != client || evs[0].Dst != server || evs[0].Proto != unix.IPPROTO_TCP {
			t.Fatalf("events %+v, want one pair event from %s to %s", evs, client, server)
		}

		b.hostAddr()
		l := b.listen("b", 0)
		host := b.dial(b.node, l.Addr())
		hs, err := l.AcceptTCP()
		testutil.Must(t, err)
		t.Cleanup(func() { hs.Close() })
		echo(t, host, hs, []byte("hello"))
		if evs := ev.Collect(""); len(evs) != 0 {
			t.Fatalf("a connection from the node gave events %+v, want none", evs)
		}
	})
}

// TestFallbackEvent: a direction sent by the stack for good gives one
// fallback event naming it and why; the bypassed one gives none.
func TestFallbackEvent(t *testing.T) {
	b := newBed(t, "a", "b")
	ev := b.readEvents()
	testutil.Must(t, b.bp.SetConfig(Config{Mode: Size, MinSize: 1024}))
	c, s := b.pair("a", "b")
	small, large := []byte("ping"), make([]byte, 4096)
	echoSizes(t, c, s, small, large)
	echoSizes(t, c, s, small, large)
	client, server := c.LocalAddr().(*net.TCPAddr).AddrPort(), s.LocalAddr().(*net.TCPAddr).AddrPort()
	evs := ev.Collect("fallback")
	if len(evs) != 1 || evs[0].Src != client || evs[0].Dst != server || evs[0].Reason != "fallback_small" || evs[0].Counters != "bp_stat" {
		t.Fatalf("fallback events %+v, want one from %s to %s, fallback_small", evs, client, server)
	}
}

func TestSizeThreshold(t *testing.T) {
	b := newBed(t, "a", "b")
	testutil.Must(t, b.bp.SetConfig(Config{Mode: Size, MinSize: 1024}))
	c, s := b.pair("a", "b")
	// The client's first message is small: its direction stays on the
	// stack for good; the server's first is large: bypassed.
	small, large := []byte("ping"), make([]byte, 4096)
	redirected := b.stat("redirected_msgs")
	echoSizes(t, c, s, small, large)
	echoSizes(t, c, s, large, large)
	if n := b.stat("redirected_msgs") - redirected; n != 2 {
		t.Fatalf("%d messages redirected, want the server's 2", n)
	}
	if b.stat("fallback_small") != 1 {
		t.Fatalf("fallback_small = %d, want 1", b.stat("fallback_small"))
	}
}

func echoSizes(t *testing.T, c, s *net.TCPConn, req, rep []byte) {
	t.Helper()
	_, err := c.Write(req)
	testutil.Must(t, err)
	_, err = io.ReadFull(s, make([]byte, len(req)))
	testutil.Must(t, err)
	_, err = s.Write(rep)
	testutil.Must(t, err)
	_, err = io.ReadFull(c, make([]byte, len(rep)))
	testutil.Must(t, err)
}

// TestPolicyJudgesTheHandshake: a connection netfilter drops in the node
// never reaches ESTABLISHED, so never enters the map; in each family.
func TestPolicyJudgesTheHandshake(t *testing.T) {
	families(t, func(t *testing.T, newBed func(*testing.T, ...string) *bed) {
		b := newBed(t, "a", "b")
		l := b.listen("b", 0)
		port := fmt.Sprint(l.Addr().(*net.TCPAddr).Port)
		b.iptables("-I", "FORWARD", "-p", "tcp", "--dport", port, "-j", "DROP")
		b.inNetns(b.netns["a"], func() error {
			_, err := net.DialTimeout(b.network(), l.Addr().String(), 500*time.Millisecond)
			if err == nil {
				t.Fatal("connected through a DROP rule")
			}
			return nil
		})
		conns, err := b.bp.Conns()
		testutil.Must(t, err)
		if len(conns) != 0 || b.stat("recorded") != 0 {
			t.Fatalf("a denied connection is in the map: %+v", conns)
		}
	})
}

// TestDestroy: revocation ends a bypassed connection at once, both ends,
// in each family.
func TestDestroy(t *testing.T) {
	families(t, func(t *testing.T, newBed func(*testing.T, ...string) *bed) {
		b := newBed(t, "a", "b")
		c, s := b.pair("a", "b")
		echo(t, c, s, []byte("before"))
		conn, ok := b.conn(c)
		if !ok || !conn.Paired() {
			t.Fatal("connection not bypassed")
		}
		errs := make(chan error, 2)
		for _, x := range []*net.TCPConn{c, s} {
			go func() {
				_, err := x.Read(make([]byte, 1)) // blocked: nothing is sent
				errs <- err
			}()
		}
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		testutil.Must(t, b.bp.Destroy(conn))
		for range 2 {
			select {
			case err := <-errs:
				if err == nil || errors.Is(err, io.EOF) {
					t.Fatalf("a blocked read ended with %v, want an error", err)
				}
			case <-time.After(time.Second - time.Since(start)):
				t.Fatal("connection not ended within 1 s")
			}
		}
		if _, err := c.Write([]byte("after")); err == nil {
			t.Fatal("write after Destroy succeeded")
		}
		b.waitGone(c)
		// Gone already: fine.
		testutil.Must(t, b.bp.Destroy(conn))
	})
}

func TestRemove(t *testing.T) {
	b := newBed(t, "a", "b")
	c, s := b.pair("a", "b")
	echo(t, c, s, []byte("bypassed"))
	testutil.Must(t, b.bp.Close())
	testutil.Must(t, Remove(b.pinDir))
	testutil.Must(t, Remove(b.pinDir)) // idempotent
	// The open connection still works, by the stack now.
	echo(t, c, s, []byte("after remove"))
	// No sockops program of ours on the cgroup any more.
	out, err := exec.Command("bpftool", "cgroup", "show", b.cgroup).CombinedOutput()
	testutil.Must(t, err)
	if bytes.Contains(out, []byte("onc_sock_ops")) {
		testutil.WaitFor(t, "sockops program detached", 2*time.Second, func() bool {
			out, _ := exec.Command("bpftool", "cgroup", "show", b.cgroup).CombinedOutput()
			return !bytes.Contains(out, []byte("onc_sock_ops"))
		})
	}
}

func run(t *testing.T, name string, args ...string) {
	t.Helper()
	if out, err := exec.Command(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s %v: %v: %s", name, args, err, out)
	}
}
