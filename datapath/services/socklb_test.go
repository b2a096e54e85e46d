//go:build privileged

package services

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/netns"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The client runs as a child process placed in the test's cgroup (only
// sockets made there are balanced) and in the test's network namespace:
// the test binary itself, told what to do through the environment.
const clientEnv = "ONC_SOCKLB_CLIENT"

func TestMain(m *testing.M) {
	if req := os.Getenv(clientEnv); req != "" {
		os.Exit(runClient(req))
	}
	os.Exit(m.Run())
}

var (
	vip      = netip.MustParseAddr("10.96.0.10")
	backends = []netip.Addr{netip.MustParseAddr("10.250.0.1"), netip.MustParseAddr("10.250.0.2"), netip.MustParseAddr("10.250.0.3")}
	// The IPv6 family's, in the same bed.
	vip6      = netip.MustParseAddr("fd00:10:96::10")
	backends6 = []netip.Addr{netip.MustParseAddr("fd00:10:250::1"), netip.MustParseAddr("fd00:10:250::2"), netip.MustParseAddr("fd00:10:250::3")}
)

const (
	svcPort   = 8080 // balanced
	otherPort = 9090 // served on the VIP itself, never a Service
)

// clientReq is one client run: Op on Addr, N times, from an AF_INET
// socket for an IPv4 Addr and an AF_INET6 one for an IPv6 Addr.
type clientReq struct {
	// tcp, udp (unconnected), udp3 (three datagrams, unconnected),
	// udpconn; hold (tcp) and udphold
	// (connected udp): kept open until stdin closes
	Op   string
	Addr string
	N    int
	// Mapped: a dual-stack (AF_INET6) socket dials the IPv4 Addr
	// IPv4-mapped (::ffff:a.b.c.d).
	Mapped bool
}

// clientRes is one attempt: the peer as getpeername() or recvfrom() gave
// it, the server's own address as it sent it, or the error's name.
type clientRes struct {
	Peer, Served, Err string
}

func runClient(raw string) int {
	var req clientReq
	if err := json.Unmarshal([]byte(raw), &req); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	dst := netip.MustParseAddrPort(req.Addr)
	var sa unix.Sockaddr = &unix.SockaddrInet6{Addr: dst.Addr().As16(), Port: int(dst.Port())}
	if dst.Addr().Is4() && !req.Mapped {
		sa = &unix.SockaddrInet4{Addr: dst.Addr().As4(), Port: int(dst.Port())}
	}
	enc := json.NewEncoder(os.Stdout)
	for range req.N {
		enc.Encode(attempt(req.Op, sa))
	}
	return 0
}

func attempt(op string, sa unix.Sockaddr) (r clientRes) {
	typ, family := unix.SOCK_STREAM, unix.AF_INET
	if strings.HasPrefix(op, "udp") {
		typ = unix.SOCK_DGRAM
	}
	if _, ok := sa.(*unix.SockaddrInet6); ok {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, typ|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return clientRes{Err: errName(err)}
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 3})
	if op == "udp" || op == "udp3" {
		sends := 1
		if op == "udp3" {
			sends = 3 // from the one socket
		}
		for range sends {
			if err := unix.Sendto(fd, []byte("hi"), 0, sa); err != nil {
				return clientRes{Err: errName(err)}
			}
			buf := make([]byte, 64)
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return clientRes{Err: errName(err)}
			}
			r = clientRes{Peer: sockaddrString(from), Served: string(buf[:n])}
		}
		return r
	}
	if err := unix.Connect(fd, sa); err != nil {
		return clientRes{Err: errName(err)}
	}
	peer, err := unix.Getpeername(fd)
	if err != nil {
		return clientRes{Err: errName(err)}
	}
	r.Peer = sockaddrString(peer)
	if err := exchange(fd, op != "tcp" && op != "hold", &r); err != nil {
		return clientRes{Peer: r.Peer, Err: errName(err)}
	}
	if op == "hold" || op == "udphold" {
		// Report, then wait for the test to change the programs or the
		// Service, then use the same socket again.
		json.NewEncoder(os.Stdout).Encode(r)
		_, _ = io.ReadAll(os.Stdin)
		return again(fd, op)
	}
	return r
}

// exchange reads what the server sent, having sent first for UDP.
func exchange(fd int, send bool, r *clientRes) error {
	if send {
		if _, err := unix.Write(fd, []byte("hi")); err != nil {
			return err
		}
	}
	buf := make([]byte, 64)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return err
	}
	r.Served = string(buf[:n])
	return nil
}

// again is a held socket's second report: the peer again for TCP; for UDP
// an error the socket holds (ECONNABORTED when it was ended), else a new
// exchange.
func again(fd int, op string) clientRes {
	var r clientRes
	peer, err := unix.Getpeername(fd)
	if err == nil {
		r.Peer = sockaddrString(peer)
	}
	if op == "hold" {
		if err != nil {
			return clientRes{Err: errName(err)}
		}
		return r
	}
	if _, _, err := unix.Recvfrom(fd, make([]byte, 64), unix.MSG_DONTWAIT); err != unix.EAGAIN {
		if err == nil {
			return clientRes{Err: "a datagram nobody asked for"}
		}
		return clientRes{Err: errName(err)}
	}
	if err := exchange(fd, true, &r); err != nil {
		return clientRes{Peer: r.Peer, Err: errName(err)}
	}
	return r
}

func errName(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return unix.ErrnoName(errno)
	}
	return err.Error()
}

func sockaddrString(sa unix.Sockaddr) string {
	switch in := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(in.Addr), uint16(in.Port)).String()
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(in.Addr), uint16(in.Port)).String()
	}
	return fmt.Sprintf("%v", sa)
}

// bed is one network namespace with the backends and the VIP of each
// family on its loopback, each serving TCP and UDP with its own address as
// the reply.
type bed struct {
	t      *testing.T
	ns     string // name under /run/netns
	path   string
	cookie uint64
	cgroup string
}

func newBed(t *testing.T, cgroup string) *bed {
	t.Helper()
	b := &bed{t: t, ns: testutil.Prefix() + "-lb", cgroup: cgroup}
	b.path = testutil.Netns(t, b.ns)
	h := testutil.NetlinkAt(t, b.ns)
	lo, err := h.LinkByName("lo")
	testutil.Must(t, err)
	testutil.Must(t, h.LinkSetUp(lo))
	addrs := append(append([]netip.Addr{vip, vip6}, backends...), backends6...)
	for _, a := range addrs {
		testutil.Must(t, h.AddrAdd(lo, &netlink.Addr{IPNet: &net.IPNet{IP: a.AsSlice(), Mask: net.CIDRMask(a.BitLen(), a.BitLen())},
			Flags: unix.IFA_F_NODAD}))
	}
	// The kernel inserts an IPv6 address's local route from a work queue,
	// a moment after the address: until then a datagram to it is lost.
	testutil.WaitFor(t, "the IPv6 addresses' local routes", 5*time.Second, func() bool {
		for _, a := range addrs {
			if rs, err := h.RouteGet(a.AsSlice()); a.Is6() && (err != nil || len(rs) == 0 || rs[0].Type != unix.RTN_LOCAL) {
				return false
			}
		}
		return true
	})
	ns, err := netns.Open(b.path)
	testutil.Must(t, err)
	defer ns.Close()
	testutil.Must(t, netns.Do(ns, func() error {
		for _, a := range addrs {
			for _, port := range []uint16{svcPort, otherPort} {
				serve(t, netip.AddrPortFrom(a, port))
			}
		}
		return nil
	}))
	b.cookie, err = netns.Cookie(b.path)
	testutil.Must(t, err)
	return b
}

// serve answers on addr over TCP (writes addr, closes) and UDP (echoes addr).
func serve(t *testing.T, addr netip.AddrPort) {
	answer := []byte(addr.String())
	testutil.Must(t, serveBoth(t, addr, func(c net.Conn) { _, _ = c.Write(answer) },
		func([]byte, net.Addr) []byte { return answer }))
}

// serveBoth serves addr, in the calling goroutine's network namespace,
// until the test ends: over TCP each connection by conn (then closed), in
// a goroutine of its own; over UDP each datagram with reply's answer.
func serveBoth(t *testing.T, addr netip.AddrPort, conn func(net.Conn), reply func(msg []byte, from net.Addr) []byte) error {
	family := "4"
	if addr.Addr().Is6() {
		family = "6"
	}
	l, err := net.Listen("tcp"+family, addr.String())
	if err != nil {
		return err
	}
	u, err := net.ListenPacket("udp"+family, addr.String())
	if err != nil {
		l.Close()
		return err
	}
	t.Cleanup(func() { l.Close(); u.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() { conn(c); c.Close() }()
		}
	}()
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := u.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = u.WriteTo(reply(buf[:n], from), from)
		}
	}()
	return nil
}

// client runs a client in the bed's namespace and the test cgroup.
func (b *bed) client(op string, addr netip.AddrPort, n int) []clientRes {
	b.t.Helper()
	return b.run(clientReq{Op: op, Addr: addr.String(), N: n})
}

// mappedClient runs a dual-stack client: an AF_INET6 socket dialling the
// IPv4 addr IPv4-mapped.
func (b *bed) mappedClient(op string, addr netip.AddrPort, n int) []clientRes {
	b.t.Helper()
	return b.run(clientReq{Op: op, Addr: addr.String(), N: n, Mapped: true})
}

func (b *bed) run(req clientReq) []clientRes {
	b.t.Helper()
	op, addr, n := req.Op, req.Addr, req.N
	cmd, out := b.clientCmd(req)
	testutil.Must(b.t, cmd.Start())
	var res []clientRes
	dec := json.NewDecoder(out)
	for {
		var r clientRes
		if err := dec.Decode(&r); err != nil {
			break
		}
		res = append(res, r)
	}
	if err := cmd.Wait(); err != nil {
		b.t.Fatalf("client %s %s: %v", op, addr, err)
	}
	if len(res) != n {
		b.t.Fatalf("client %s %s: %d results, want %d", op, addr, len(res), n)
	}
	return res
}

func (b *bed) clientCmd(r clientReq) (*exec.Cmd, io.Reader) {
	b.t.Helper()
	req, _ := json.Marshal(r)
	cg, err := os.Open(b.cgroup)
	testutil.Must(b.t, err)
	b.t.Cleanup(func() { cg.Close() })
	cmd := exec.Command("ip", "netns", "exec", b.ns, os.Args[0])
	cmd.Env = append(os.Environ(), clientEnv+"="+string(req))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: int(cg.Fd())}
	out, err := cmd.StdoutPipe()
	testutil.Must(b.t, err)
	return cmd, out
}

// hold runs a hold or udphold client: its first report, and release,
// which lets it use its socket again and returns its second report.
func (b *bed) hold(op string, addr netip.AddrPort) (first clientRes, release func() clientRes) {
	b.t.Helper()
	return b.holdReq(clientReq{Op: op, Addr: addr.String(), N: 1})
}

func (b *bed) holdReq(req clientReq) (first clientRes, release func() clientRes) {
	b.t.Helper()
	cmd, out := b.clientCmd(req)
	stdin, err := cmd.StdinPipe()
	testutil.Must(b.t, err)
	testutil.Must(b.t, cmd.Start())
	b.t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	dec := json.NewDecoder(bufio.NewReader(out))
	testutil.Must(b.t, dec.Decode(&first))
	return first, func() clientRes {
		b.t.Helper()
		stdin.Close()
		var r clientRes
		testutil.Must(b.t, dec.Decode(&r))
		testutil.Must(b.t, cmd.Wait())
		return r
	}
}

// openLB loads a balancer (one agent's, of a dual-stack cluster) pinned
// on a private bpffs and attached to cgroup.
func openLB(t *testing.T, cgroup string) *LB {
	t.Helper()
	dir := t.TempDir()
	lb, err := Open(Options{PinDir: dir, Cgroup: cgroup, IPv6: true})
	testutil.Must(t, err)
	t.Cleanup(func() {
		lb.Close()
		_ = unix.Unmount(dir, unix.MNT_DETACH)
	})
	testutil.Must(t, lb.Attach())
	return lb
}

func service(port uint16, proto Proto, bes ...netip.Addr) Service {
	return serviceAt(vip, port, proto, bes...)
}

func serviceAt(vip netip.Addr, port uint16, proto Proto, bes ...netip.Addr) Service {
	s := Service{Name: "default/svc:p", VIP: vip, Port: port, Proto: proto}
	for _, a := range bes {
		s.Backends = append(s.Backends, Backend{Addr: netip.AddrPortFrom(a, port), Ready: true})
	}
	return s
}

func served(res []clientRes) map[string]int {
	seen := map[string]int{}
	for _, r := range res {
		seen[r.Served]++
	}
	return seen
}

func checkAll(t *testing.T, what string, res []clientRes, ok func(clientRes) bool) {
	t.Helper()
	for _, r := range res {
		if !ok(r) {
			t.Fatalf("%s: %+v", what, r)
		}
	}
}

func isBackend(served string, port uint16) bool { return isBackendOf(backends, served, port) }

func isBackendOf(backends []netip.Addr, served string, port uint16) bool {
	for _, b := range backends {
		if served == netip.AddrPortFrom(b, port).String() {
			return true
		}
	}
	return false
}

func counter(t *testing.T, lb *LB, name string) uint64 {
	t.Helper()
	return bpftest.Counter(t, lb.Stats, name)
}

// TCP to a ClusterIP reaches every backend, getpeername() shows the
// ClusterIP, and everything else — another port of the same address, a
// backend dialled directly — is left as it is.
func TestConnectTranslatesToEveryBackend(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnPod(b.cookie, netip.MustParseAddr("10.244.0.5"), b.path))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, TCP, backends...)}, false))

	svc := netip.AddrPortFrom(vip, svcPort)
	res := b.client("tcp", svc, 30)
	checkAll(t, "balanced connection", res, func(r clientRes) bool {
		return r.Err == "" && r.Peer == svc.String() && isBackend(r.Served, svcPort)
	})
	if seen := served(res); len(seen) != len(backends) {
		t.Fatalf("30 connections reached %v, want all %d backends", seen, len(backends))
	}
	states, err := lb.Services()
	testutil.Must(t, err)
	if len(states) != 1 || states[0].Translated != 30 {
		t.Fatalf("service counters %+v, want 30 translated", states)
	}

	other := netip.AddrPortFrom(vip, otherPort)
	checkAll(t, "another port of the ClusterIP", b.client("tcp", other, 3), func(r clientRes) bool {
		return r.Peer == other.String() && r.Served == other.String()
	})
	direct := netip.AddrPortFrom(backends[1], svcPort)
	checkAll(t, "a backend dialled directly", b.client("tcp", direct, 3), func(r clientRes) bool {
		return r.Peer == direct.String() && r.Served == direct.String()
	})
	// UDP to a TCP-only Service is not translated: the VIP answers itself.
	checkAll(t, "UDP to a TCP service port", b.client("udp", svc, 2), func(r clientRes) bool {
		return r.Peer == svc.String() && r.Served == svc.String()
	})
	if got := counter(t, lb, "connect_translated"); got != 30 {
		t.Fatalf("connect_translated %d, want 30", got)
	}
}

// A Service without backends refuses at once, for TCP and UDP alike, as
// kube-proxy's REJECT does; without the programs the VIP itself would answer.
func TestNoBackendRefuses(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnHost(b.cookie))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, TCP), service(svcPort, UDP)}, false))
	svc := netip.AddrPortFrom(vip, svcPort)
	for _, op := range []string{"tcp", "udpconn", "udp"} {
		checkAll(t, op+" to a service without backends", b.client(op, svc, 2), func(r clientRes) bool {
			return r.Err == "ECONNREFUSED"
		})
	}
	if got := counter(t, lb, "connect_refused"); got != 4 {
		t.Fatalf("connect_refused %d, want 4", got)
	}
	if got := counter(t, lb, "sendmsg_refused"); got != 2 {
		t.Fatalf("sendmsg_refused %d, want 2", got)
	}
}

// UDP, unconnected and connected: datagrams reach backends, and replies
// read as coming from the ClusterIP:port.
func TestUDPRepliesComeFromTheClusterIP(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnPod(b.cookie, netip.MustParseAddr("10.244.0.5"), b.path))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, UDP, backends...)}, false))
	svc := netip.AddrPortFrom(vip, svcPort)
	for _, op := range []string{"udp", "udpconn"} {
		res := b.client(op, svc, 30)
		checkAll(t, op, res, func(r clientRes) bool {
			return r.Err == "" && r.Peer == svc.String() && isBackend(r.Served, svcPort)
		})
		if seen := served(res); len(seen) < 2 {
			t.Fatalf("%s: 30 sockets reached only %v", op, seen)
		}
	}
	if counter(t, lb, "recvmsg_reversed") < 30 || counter(t, lb, "getpeername_reversed") < 30 {
		t.Fatal("reverse translation counters did not rise")
	}
	// Connected sockets took their reverse entries with them when they
	// closed; the unconnected ones' wait for the LRU.
	if n := bpftest.Entries(t, lb.maps.OncLbRevnat); n != 30 {
		t.Fatalf("%d reverse entries after the clients exited, want the 30 of unconnected sockets", n)
	}
}

// ClientIP affinity keeps a client namespace on one backend, and moves it
// when that backend leaves the Service.
func TestAffinitySticksUntilTheBackendGoes(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	pod := netip.MustParseAddr("10.244.0.5")
	testutil.Must(t, lb.OwnPod(b.cookie, pod, b.path))
	s := service(svcPort, TCP, backends...)
	s.Affinity = time.Hour
	testutil.Must(t, lb.Sync([]Service{s}, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	seen := served(b.client("tcp", svc, 20))
	if len(seen) != 1 {
		t.Fatalf("affinity: 20 connections spread over %v", seen)
	}
	var first string
	for k := range seen {
		first = k
	}
	aff, err := lb.Affinities()
	testutil.Must(t, err)
	if len(aff) != 1 || aff[0].Pod != pod || aff[0].Backend.String() != first || aff[0].Netns != b.cookie {
		t.Fatalf("affinity entries %+v, want one for %s → %s", aff, pod, first)
	}

	var rest []netip.Addr
	for _, a := range backends {
		if netip.AddrPortFrom(a, svcPort).String() != first {
			rest = append(rest, a)
		}
	}
	s.Backends = service(svcPort, TCP, rest...).Backends
	testutil.Must(t, lb.Sync([]Service{s}, false))
	again := served(b.client("tcp", svc, 20))
	if len(again) != 1 || again[first] != 0 {
		t.Fatalf("after %s left: %v, want one other backend", first, again)
	}
}

// Several agents on one kernel share the cgroup root: each balances only
// the namespaces it owns, and a namespace no agent owns is untouched.
func TestAgentsActOnlyOnTheirOwnNamespaces(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lbA, lbB := openLB(t, cg), openLB(t, cg)
	bedA, bedB, stranger := newBed(t, cg), newBed(t, cg), newBed(t, cg)
	testutil.Must(t, lbA.OwnHost(bedA.cookie))
	testutil.Must(t, lbB.OwnPod(bedB.cookie, netip.MustParseAddr("10.244.1.5"), bedB.path))
	testutil.Must(t, lbA.Sync([]Service{service(svcPort, TCP, backends[0])}, false))
	testutil.Must(t, lbB.Sync([]Service{service(svcPort, TCP, backends[1])}, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	for _, c := range []struct {
		bed  *bed
		want netip.AddrPort
	}{
		{bedA, netip.AddrPortFrom(backends[0], svcPort)},
		{bedB, netip.AddrPortFrom(backends[1], svcPort)},
		{stranger, svc},
	} {
		checkAll(t, "client in "+c.bed.ns, c.bed.client("tcp", svc, 5), func(r clientRes) bool {
			return r.Served == c.want.String()
		})
	}
}

// A Service rewritten over and over while clients connect never fails a
// connection nor lets one through untranslated: backends are written to
// the idle bank before the service flips to it.
func TestUpdatesNeverExposeAHalfWrittenSet(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnHost(b.cookie))
	sets := [][]netip.Addr{backends[:2], backends[1:], backends[:1], backends}
	testutil.Must(t, lb.Sync([]Service{service(svcPort, TCP, sets[0]...)}, false))
	done := make(chan error)
	stop := make(chan struct{})
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			if err := lb.Sync([]Service{service(svcPort, TCP, sets[i%len(sets)]...)}, false); err != nil {
				done <- err
				return
			}
		}
	}()
	res := b.client("tcp", netip.AddrPortFrom(vip, svcPort), 200)
	close(stop)
	testutil.Must(t, <-done)
	checkAll(t, "connection during updates", res, func(r clientRes) bool {
		return r.Err == "" && isBackend(r.Served, svcPort)
	})
	if got := counter(t, lb, "no_slot"); got != 0 {
		t.Fatalf("no_slot %d: a socket found a service pointing at a missing backend", got)
	}
}

// A restarted agent adopts the pinned links (no second set of programs on
// the cgroup) and maps: a socket connected before still reports the
// ClusterIP, and new ones are still balanced.
func TestRestartChangesNothingForLiveSockets(t *testing.T) { liveSocketsAcrossRestart(t, false) }

// So does an agent of this version on a v0 agent's pins (one object per
// program): the maps kept their layout.
func TestUpgradeFromV0ChangesNothingForLiveSockets(t *testing.T) { liveSocketsAcrossRestart(t, true) }

func liveSocketsAcrossRestart(t *testing.T, fromV0 bool) {
	cg := bpftest.Cgroup(t)
	dir := t.TempDir()
	testutil.Must(t, bpf.EnsurePinDir(dir))
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	if fromV0 {
		// The v0 agent's programs, attached through pinned links, as
		// bpf.AttachCgroup did then (the maps it wrote are written below
		// through this version's code: their layout is the same).
		for hook, v0 := range map[string]struct {
			obj, prog string
			attach    ebpf.AttachType
		}{
			"connect4":     {bpftest.V0SockConnect4, "onc_sock_connect4", ebpf.AttachCGroupInet4Connect},
			"getpeername4": {bpftest.V0SockGetpeername4, "onc_sock_getpeername4", ebpf.AttachCgroupInet4GetPeername},
		} {
			c := bpftest.LoadV0(t, v0.obj, dir)
			testutil.Must(t, bpf.AttachCgroup(linkPin(dir, hook), cg, v0.attach, c.Programs[v0.prog]))
		}
	}
	lb, err := Open(Options{PinDir: dir, Cgroup: cg, IPv6: true})
	testutil.Must(t, err)
	if !fromV0 {
		testutil.Must(t, lb.Attach())
	}
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnHost(b.cookie))
	svcs := []Service{service(svcPort, TCP, backends...), serviceAt(vip6, svcPort, TCP, backends6...)}
	testutil.Must(t, lb.Sync(svcs, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	// A socket of each family (the v0 agent attached no IPv6 hook).
	type held struct {
		svc      netip.AddrPort
		backends []netip.Addr
		release  func() clientRes
	}
	hold := []held{{svc: svc, backends: backends}}
	if !fromV0 {
		hold = append(hold, held{svc: netip.AddrPortFrom(vip6, svcPort), backends: backends6})
	}
	for i, h := range hold {
		var before clientRes
		before, hold[i].release = b.hold("hold", h.svc)
		if before.Peer != h.svc.String() || !isBackendOf(h.backends, before.Served, svcPort) {
			t.Fatalf("before the restart: %+v", before)
		}
	}
	ids := linkIDs(t, dir)
	lb.Close()

	again, err := Open(Options{PinDir: dir, Cgroup: cg, IPv6: true})
	testutil.Must(t, err)
	defer again.Close()
	testutil.Must(t, again.Attach())
	for hook, id := range ids {
		if got := linkIDs(t, dir)[hook]; got != id {
			t.Fatalf("restart made a new %s link %v, want the pinned %v adopted", hook, got, id)
		}
	}
	for _, h := range again.progs {
		if n := attachedPrograms(t, cg, h.attach); n != 1 {
			t.Fatalf("%d %s programs on the cgroup after restart, want 1", n, h.name)
		}
	}
	testutil.Must(t, again.Sync(svcs, false))
	for _, h := range hold {
		if after := h.release(); after.Peer != h.svc.String() {
			t.Fatalf("a socket connected to %s before the restart now reports %+v", h.svc, after)
		}
	}
	for _, h := range []held{{svc: svc, backends: backends}, {svc: netip.AddrPortFrom(vip6, svcPort), backends: backends6}} {
		checkAll(t, "new connection after restart", b.client("tcp", h.svc, 5), func(r clientRes) bool {
			return r.Peer == h.svc.String() && isBackendOf(h.backends, r.Served, svcPort)
		})
	}

	// Remove (socket LB off, or failed to load) leaves the cgroup as it
	// was, from the pins alone: the ClusterIP answers itself. The kernel
	// releases an unpinned link after an RCU grace period, so the
	// programs leave the cgroup a moment after Remove returns.
	again.Close()
	testutil.Must(t, Remove(dir))
	for _, at := range []ebpf.AttachType{ebpf.AttachCGroupInet4Connect, ebpf.AttachCGroupUDP4Sendmsg,
		ebpf.AttachCGroupUDP4Recvmsg, ebpf.AttachCgroupInet4GetPeername, ebpf.AttachCgroupInetSockRelease,
		ebpf.AttachCGroupInet6Connect, ebpf.AttachCGroupUDP6Sendmsg, ebpf.AttachCGroupUDP6Recvmsg, ebpf.AttachCgroupInet6GetPeername} {
		for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
			n := attachedPrograms(t, cg, at)
			if n == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d programs of %s on the cgroup a second after Remove", n, at)
			}
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "onc_lb_svc")); !os.IsNotExist(err) {
		t.Fatalf("the service map's pin outlived Remove: %v", err)
	}
	checkAll(t, "after Remove", b.client("tcp", svc, 2), func(r clientRes) bool {
		return r.Served == svc.String()
	})
}

// A removed Service is no longer translated and leaves nothing in the
// maps; a full Sync repairs entries that drifted in the kernel.
func TestRemoveAndRepair(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnHost(b.cookie))
	s := service(svcPort, TCP, backends...)
	s.Affinity = time.Hour
	testutil.Must(t, lb.Sync([]Service{s}, false))
	svc := netip.AddrPortFrom(vip, svcPort)

	// Drift: the service's live backends vanish behind the agent's back.
	testutil.Must(t, lb.maps.OncLbBackend.Delete(backendKey{SvcId: lb.services[s.Key()].id, Slot: 0, Bank: lb.services[s.Key()].bank}))
	testutil.Must(t, lb.Sync([]Service{s}, false))
	if bpftest.Entries(t, lb.maps.OncLbBackend) != len(backends)-1 {
		t.Fatal("an incremental Sync rewrote an unchanged service")
	}
	testutil.Must(t, lb.Sync([]Service{s}, true))
	checkAll(t, "after repair", b.client("tcp", svc, 10), func(r clientRes) bool {
		return r.Err == "" && isBackend(r.Served, svcPort)
	})
	// Drift in the entry alone: its affinity switched off.
	var v svcVal
	testutil.Must(t, lb.maps.OncLbSvc.Lookup(s.Key().mapKey(), &v))
	v.Flags = 0
	testutil.Must(t, lb.maps.OncLbSvc.Put(s.Key().mapKey(), v))
	testutil.Must(t, lb.Sync([]Service{s}, true))
	testutil.Must(t, lb.maps.OncLbSvc.Lookup(s.Key().mapKey(), &v))
	if v.Flags != flagAffinity {
		t.Fatalf("flags %#x after the repair, want affinity's", v.Flags)
	}
	if got := counter(t, lb, "no_slot"); got != 0 {
		t.Fatalf("no_slot %d after the repair", got)
	}
	// Drift in the side maps: an affinity member, and a load balancer
	// IP's source range inside a wider one of its (which a lookup in the
	// trie would still match), deleted behind the agent's back.
	lbIP := service(svcPort, TCP, backends...)
	lbIP.Scope, lbIP.VIP = Uplink, netip.MustParseAddr("192.0.2.80")
	lbIP.SourceRanges = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24"), netip.MustParsePrefix("198.51.100.128/25")}
	testutil.Must(t, lb.Sync([]Service{s, lbIP}, false))
	members, ranges := bpftest.Entries(t, lb.maps.OncLbMember), bpftest.Entries(t, lb.maps.OncLbSourceRanges)
	testutil.Must(t, lb.maps.OncLbMember.Delete(memberKey{SvcId: lb.services[s.Key()].id, Be: addrOfBackend(s.Backends[0].Addr)}))
	testutil.Must(t, lb.maps.OncLbSourceRanges.Delete(srcRange{lb.services[lbIP.Key()].id, lbIP.SourceRanges[1]}.mapKey()))
	testutil.Must(t, lb.Sync([]Service{s, lbIP}, true))
	if m, r := bpftest.Entries(t, lb.maps.OncLbMember), bpftest.Entries(t, lb.maps.OncLbSourceRanges); m != members || r != ranges {
		t.Fatalf("after the repair %d members and %d source ranges, want %d and %d", m, r, members, ranges)
	}

	testutil.Must(t, lb.Sync(nil, false))
	checkAll(t, "after the Service is removed", b.client("tcp", svc, 3), func(r clientRes) bool {
		return r.Peer == svc.String() && r.Served == svc.String()
	})
	for name, m := range map[string]*ebpf.Map{"service": lb.maps.OncLbSvc, "backend": lb.maps.OncLbBackend, "member": lb.maps.OncLbMember} {
		if n := bpftest.Entries(t, m); n != 0 {
			t.Fatalf("%d %s entries left after the Service was removed", n, name)
		}
	}
}

// linkIDs are the links pinned in dir, by hook.
func linkIDs(t *testing.T, dir string) map[string]link.ID {
	t.Helper()
	ids := map[string]link.ID{}
	for _, h := range hookNames {
		l, err := link.LoadPinnedLink(linkPin(dir, h), nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		testutil.Must(t, err)
		info, err := l.Info()
		l.Close()
		testutil.Must(t, err)
		ids[h] = info.ID
	}
	return ids
}

func attachedPrograms(t *testing.T, cgroup string, at ebpf.AttachType) int {
	t.Helper()
	res, err := link.QueryPrograms(link.QueryOptions{Target: cgroupFD(t, cgroup), Attach: at})
	testutil.Must(t, err)
	return len(res.Programs)
}

func cgroupFD(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	testutil.Must(t, err)
	t.Cleanup(func() { f.Close() })
	return int(f.Fd())
}

// Unbalance, from the pin alone, leaves a Service untranslated until the
// next agent's first Sync writes it again.
func TestUnbalanceUntilTheNextSync(t *testing.T) {
	cg := bpftest.Cgroup(t)
	lb := openLB(t, cg)
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnHost(b.cookie))
	s := service(svcPort, TCP, backends...)
	testutil.Must(t, lb.Sync([]Service{s}, false))
	lb.Close()
	testutil.Must(t, Unbalance(lb.opts.PinDir, s.Key()))
	svc := netip.AddrPortFrom(vip, svcPort)
	checkAll(t, "unbalanced", b.client("tcp", svc, 2), func(r clientRes) bool { return r.Served == svc.String() })

	again, err := Open(lb.opts)
	testutil.Must(t, err)
	defer again.Close()
	testutil.Must(t, again.Attach())
	testutil.Must(t, again.Sync([]Service{s}, false))
	checkAll(t, "synced again", b.client("tcp", svc, 5), func(r clientRes) bool { return isBackend(r.Served, svcPort) })
}

// A restarted agent's LB knows the namespaces an earlier one owned by
// their names alone: ForgetPods keeps those of the pods it is given, an
// IPv6-only pod's too (named by its address's low 32 bits), before any
// pod is owned again; ForgetPod removes one pod's.
func TestForgetPodsByName(t *testing.T) {
	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	v4, v6 := netip.MustParseAddr("10.244.0.5"), netip.MustParseAddr("fd00:10:244:1::5")
	before, err := Open(Options{PinDir: dir, IPv6: true})
	testutil.Must(t, err)
	testutil.Must(t, before.OwnPod(101, v4, "/run/netns/a"))
	testutil.Must(t, before.OwnPod(102, v6, "/run/netns/b"))
	before.Close()
	lb, err := Open(Options{PinDir: dir, IPv6: true})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	owned := func() []uint64 {
		t.Helper()
		m, err := lb.Owned()
		testutil.Must(t, err)
		return slices.Sorted(maps.Keys(m))
	}
	testutil.Must(t, lb.ForgetPods(v4, v6))
	if got := owned(); !slices.Equal(got, []uint64{101, 102}) {
		t.Fatalf("after keeping both pods: namespaces %v, want 101 and 102", got)
	}
	testutil.Must(t, lb.ForgetPods(v4))
	if got := owned(); !slices.Equal(got, []uint64{101}) {
		t.Fatalf("after keeping the IPv4 pod: namespaces %v, want 101", got)
	}
	testutil.Must(t, lb.ForgetPod(v4))
	if got := owned(); len(got) != 0 {
		t.Fatalf("after forgetting it: namespaces %v, want none", got)
	}
}
