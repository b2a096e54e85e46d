//go:build privileged

package policy

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/flows"
	"golang.org/x/sys/unix"
)

// logged collects what a reader of the policy table's log group reads in
// the node namespace, until the test ends.
type logged struct {
	mu      sync.Mutex
	packets []flows.Packet
	lost    int
}

func (tp *topo) readLog(group uint16) *logged {
	tp.t.Helper()
	var r *flows.Reader
	tp.in(tp.nodeNS, func() (err error) {
		r, err = flows.Open(group)
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	l := &logged{}
	done := make(chan error, 1)
	go func() {
		done <- r.Run(ctx, func(p flows.Packet) {
			l.mu.Lock()
			l.packets = append(l.packets, p)
			l.mu.Unlock()
		}, func(n int) {
			l.mu.Lock()
			l.lost += n
			l.mu.Unlock()
		})
	}()
	tp.t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tp.t.Error(err)
		}
	})
	return l
}

// of are the packets read so far with verdict of proto from src to dst
// (an empty verdict, a zero protocol, address or port: any).
func (l *logged) of(verdict string, proto uint8, src netip.Addr, dst netip.AddrPort) []flows.Packet {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []flows.Packet
	for _, p := range l.packets {
		if (verdict == "" || p.Verdict == verdict) && (proto == 0 || p.Proto == proto) && (!src.IsValid() || p.Src.Addr() == src) &&
			(!dst.Addr().IsValid() || p.Dst.Addr() == dst.Addr()) && (dst.Port() == 0 || p.Dst.Port() == dst.Port()) {
			out = append(out, p)
		}
	}
	return out
}

// waitFor waits up to 1 s (the bound docs/observability.md gives) for a
// logged packet with verdict between src and dst.
func (l *logged) waitFor(verdict string, proto uint8, src netip.Addr, dst netip.AddrPort) []flows.Packet {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		if got := l.of(verdict, proto, src, dst); len(got) > 0 || time.Now().After(deadline) {
			return got
		}
	}
}

// The pods' chains log each packet they drop, in both families and
// directions, with the pod's id, the direction and the fingerprint of the
// rules that denied it. One connection's drops are logged at
// most 3 at once and then 1 a second, and one chain's 50 at once and then
// 20 a second, however fast they come.
func TestDeniedPacketsLogged(t *testing.T) {
	tp := newTopo(t, "a", "b")
	tp.serve(tp.pods["b"].ns, []int{80, 8080}, []int{53})
	tp.serve(tp.nodeNS, []int{9000}, nil)
	e := tp.enforcer()
	l := tp.readLog(testLogGroup)
	a, b := tp.pods["a"], tp.pods["b"]

	// b admits a on TCP 80 only; a may send to b alone (not the node).
	bIn := isolate(allow(prefixes(a.ip.String()+"/32", a.ip6.String()+"/128"), PortRange{TCP, 80, 80}))
	aEg := isolate(allow(prefixes(b.ip.String()+"/32", b.ip6.String()+"/128")))
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, aEg), tp.pod("b", bIn, nil)}}, "ns/a", "ns/b")
	tp.expect(
		probe{"a", "tcp", "b", 80, true},
		probe{"a", "tcp", "b", 8080, false},
		probe{"a", "udp6", "b", 53, false},
		probe{"a", "tcp", "node", 9000, false},
	)
	for _, c := range []struct {
		what    string
		proto   uint8
		src     netip.Addr
		dst     netip.AddrPort
		ingress bool
		pod     string
	}{
		{"a → b TCP 8080, b's ingress", 6, a.ip, netip.AddrPortFrom(b.ip, 8080), true, "ns/b"},
		{"a → b UDP 53 in IPv6, b's ingress", 17, a.ip6, netip.AddrPortFrom(b.ip6, 53), true, "ns/b"},
		{"a → the node TCP 9000, a's egress", 6, a.ip, netip.AddrPortFrom(nodeAddr, 9000), false, "ns/a"},
	} {
		got := l.waitFor(flows.VerdictDenied, c.proto, c.src, c.dst)
		if len(got) == 0 {
			t.Errorf("%s: no logged packet within 1 s; the log holds %+v", c.what, l.of("", 0, netip.Addr{}, netip.AddrPort{}))
			continue
		}
		p := got[0]
		if p.Ingress != c.ingress || p.PodID != PodID(c.pod) {
			t.Errorf("%s: logged %+v, want ingress %v, pod id %s (%s)", c.what, p, c.ingress, PodID(c.pod), c.pod)
		}
		want := aEg
		if c.ingress {
			want = bIn
		}
		if l, ok := e.Logged(p.PodID, p.Ingress, p.Fingerprint); !ok || l.Pod != c.pod || l.Direction != want {
			t.Errorf("%s: fingerprint %q stands for %+v (%v), want %s's rules %s", c.what, p.Fingerprint, l, ok, c.pod, want)
		}
	}
	// A second reader of the group (the first has read) is refused, and
	// told why.
	var second *flows.Reader
	tp.in(tp.nodeNS, func() (err error) { second, err = flows.Open(testLogGroup); return err })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := second.Run(ctx, func(flows.Packet) {}, func(int) {}); err == nil || !strings.Contains(err.Error(), "another program") {
		t.Errorf("a second reader of the group: %v, want an error saying another program reads it", err)
	}

	if got := l.of(flows.VerdictDenied, 6, a.ip, netip.AddrPortFrom(b.ip, 80)); len(got) != 0 {
		t.Errorf("allowed a → b TCP 80 logged as denied: %+v", got)
	}

	// 50 datagrams of one connection in under a second: 3, perhaps 4.
	var c net.Conn
	dst := netip.AddrPortFrom(b.ip, 54)
	tp.in(a.ns, func() (err error) { c, err = net.Dial("udp", dst.String()); return err })
	defer c.Close()
	start := time.Now()
	for range 50 {
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	sent := time.Since(start)
	time.Sleep(500 * time.Millisecond) // the reader's batches
	if got, most := len(l.of(flows.VerdictDenied, 17, a.ip, dst)), 3+int(sent/time.Second)+1; got < 3 || got > most {
		t.Errorf("50 dropped datagrams of one connection in %v: %d logged, want 3 to %d", sent, got, most)
	}

	// 300 new connections to b at once, once b's chain has its burst back
	// (the datagrams above used it): the chain logs its burst of 50 and at
	// most 20 a second after.
	time.Sleep(2600 * time.Millisecond)
	dst = netip.AddrPortFrom(b.ip, 55)
	start = time.Now()
	for range 300 {
		var c net.Conn
		tp.in(a.ns, func() (err error) { c, err = net.Dial("udp", dst.String()); return err })
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	sent = time.Since(start)
	time.Sleep(500 * time.Millisecond)
	if got, most := len(l.of(flows.VerdictDenied, 17, a.ip, dst)), 50+20*int(sent/time.Second+1); got < 50 || got > most {
		t.Errorf("300 dropped datagrams of as many connections to b in %v: %d logged, want 50 to %d", sent, got, most)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != 0 {
		t.Errorf("the reader lost %d messages", l.lost)
	}
}

// A pod's chain logs each new connection it allows, once (the rest of the
// connection is established), with the fingerprint of the rules in force,
// whose first allowing rule Judge names. A change of the rules changes
// the fingerprint the next connection is logged with, and the last one
// still says what it stood for. A burst of new connections is logged 200
// at once and then 100 a second, however fast they come.
func TestAllowedConnectionsLogged(t *testing.T) {
	tp := newTopo(t, "a", "b")
	tp.serve(tp.pods["b"].ns, []int{80, 8080, 9090}, []int{53})
	e := tp.enforcer()
	l := tp.readLog(testLogGroup)
	a, b := tp.pods["a"], tp.pods["b"]
	aHost := prefixes(a.ip.String() + "/32")
	v1 := &Direction{Policies: []string{"ns/db", "ns/web"}, Rules: []Rule{
		{Policy: "ns/web", Index: 0, Peers: aHost, Ports: []PortRange{{TCP, 80, 80}}},
		{Policy: "ns/web", Index: 1, Peers: aHost, Ports: []PortRange{{TCP, 8000, 8100}}},
		{Policy: "ns/db", Index: 0, Peers: aHost},
	}}
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", v1, nil)}}, "ns/a", "ns/b")

	// connect opens a connection from a to b on proto/port and carries
	// data both ways: its first packet is logged, none after.
	connect := func(proto string, port uint16) netip.AddrPort {
		t.Helper()
		var c net.Conn
		tp.in(a.ns, func() (err error) { c, err = net.Dial(proto, netip.AddrPortFrom(b.ip, port).String()); return err })
		defer c.Close()
		for range 3 {
			if !echoes(c) {
				t.Fatalf("a → b %s/%d: no echo", proto, port)
			}
		}
		return netip.MustParseAddrPort(c.LocalAddr().String())
	}
	// allowedBy checks the one record of the connection from src to b's
	// port: allowed by b's ingress with the rules of fingerprint fp (if
	// not "") which Judge says policy's rule index allowed; it returns
	// the fingerprint.
	allowedBy := func(src netip.AddrPort, port uint16, fp, policy string, index int) string {
		t.Helper()
		dst := netip.AddrPortFrom(b.ip, port)
		l.waitFor(flows.VerdictAllowed, 0, src.Addr(), dst)
		time.Sleep(200 * time.Millisecond) // any other would have come by now
		got := slices.DeleteFunc(l.of(flows.VerdictAllowed, 0, src.Addr(), dst), func(p flows.Packet) bool { return p.Src != src })
		if len(got) != 1 {
			t.Fatalf("%s → %s: %d allowed records, want 1: %+v", src, dst, len(got), got)
		}
		p := got[0]
		if !p.Ingress || p.PodID != PodID("ns/b") || fp != "" && p.Fingerprint != fp {
			t.Errorf("%s → %s: %+v, want b's ingress, fingerprint %q", src, dst, p, fp)
		}
		lg, ok := e.Logged(p.PodID, p.Ingress, p.Fingerprint)
		if !ok || lg.Pod != "ns/b" {
			t.Fatalf("%s → %s: fingerprint %s stands for %+v (%v)", src, dst, p.Fingerprint, lg, ok)
		}
		if r := lg.Direction.Judge(src.Addr(), Proto(p.Proto), dst.Port()); !r.Allowed || r.Policy != policy || r.Index != index {
			t.Errorf("%s → %s: decided by %s rule %d (%v), want %s rule %d", src, dst, r.Policy, r.Index, r.Allowed, policy, index)
		}
		return p.Fingerprint
	}
	fp1 := allowedBy(connect("tcp", 80), 80, "", "ns/web", 0)
	allowedBy(connect("tcp", 8080), 8080, fp1, "ns/web", 1)
	allowedBy(connect("udp", 53), 53, fp1, "ns/db", 0)
	if got := l.of(flows.VerdictDenied, 0, netip.Addr{}, netip.AddrPort{}); len(got) != 0 {
		t.Errorf("allowed connections logged as denied: %+v", got)
	}

	// The sets change in place (a rule for 9090 comes before the
	// catch-all): the next connection has the new fingerprint, and the
	// one before still resolves.
	v2 := &Direction{Policies: v1.Policies, Rules: []Rule{v1.Rules[0], v1.Rules[1],
		{Policy: "ns/web", Index: 2, Peers: aHost, Ports: []PortRange{{TCP, 9090, 9090}}}, v1.Rules[2]}}
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", v2, nil)}}, "ns/b")
	if fp2 := allowedBy(connect("tcp", 9090), 9090, "", "ns/web", 2); fp2 == fp1 {
		t.Errorf("fingerprint %s before and after the change", fp1)
	}
	if lg, ok := e.Logged(PodID("ns/b"), true, fp1); !ok || lg.Direction != v1 {
		t.Errorf("the fingerprint before the change, %s: %+v (%v)", fp1, lg, ok)
	}

	// 400 new connections at once: 200, and at most 100 a second more
	// logged, and all 400 reach b's socket: the log chain's limit must
	// not drop what the pod chain allowed (the -allow counter sits before
	// it, so only the socket tells).
	var srv net.PacketConn
	tp.in(b.ns, func() (err error) { srv, err = net.ListenPacket("udp", ":5353"); return err })
	defer srv.Close()
	var received atomic.Int64
	go func() {
		buf := make([]byte, 16)
		for {
			if _, _, err := srv.ReadFrom(buf); err != nil {
				return // closed
			}
			received.Add(1)
		}
	}()
	before := tp.counters(e).Pods["ns/b"].IngressAllowed
	start := time.Now()
	for range 400 {
		var c net.Conn
		tp.in(a.ns, func() (err error) { c, err = net.Dial("udp", netip.AddrPortFrom(b.ip, 5353).String()); return err })
		if _, err := c.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	sent := time.Since(start)
	time.Sleep(500 * time.Millisecond)
	if got, most := len(l.of(flows.VerdictAllowed, 17, a.ip, netip.AddrPortFrom(b.ip, 5353))), 200+100*int(sent/time.Second+1); got < 200 || got > most {
		t.Errorf("400 new connections to b in %v: %d logged, want 200 to %d", sent, got, most)
	}
	if n := tp.counters(e).Pods["ns/b"].IngressAllowed - before; n != 400 {
		t.Errorf("b's allow counter grew by %d, want 400: the log's limit must not stop the count", n)
	}
	if n := received.Load(); n != 400 {
		t.Errorf("b's socket received %d of the 400 datagrams: the log's limit must not drop any", n)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != 0 {
		t.Errorf("the reader lost %d messages", l.lost)
	}
}

// An allowed connection is recorded once per chain, however many of its
// packets are new to conntrack: a UDP flow whose peer never answers
// gives one record, not one a datagram; two such flows give two; a TCP
// connection one. Between two pods of the node, the sender's egress chain
// and the receiver's ingress chain each record it.
func TestAllowedLoggedOncePerConnection(t *testing.T) {
	tp := newTopo(t, "a", "b")
	tp.serve(tp.pods["b"].ns, []int{80}, nil)
	e := tp.enforcer()
	l := tp.readLog(testLogGroup)
	a, b := tp.pods["a"], tp.pods["b"]
	in := isolate(allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 80, 80}, PortRange{UDP, 5353, 5353}))
	eg := isolate(allow(prefixes(b.ip.String() + "/32")))
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, eg), tp.pod("b", in, nil)}}, "ns/a", "ns/b")
	var srv net.PacketConn // receives and never answers
	tp.in(b.ns, func() (err error) { srv, err = net.ListenPacket("udp", ":5353"); return err })
	defer srv.Close()
	dst := netip.AddrPortFrom(b.ip, 5353)
	// flow sends n datagrams from one socket, and returns its address.
	flow := func(n int) netip.AddrPort {
		t.Helper()
		var c net.Conn
		tp.in(a.ns, func() (err error) { c, err = net.Dial("udp", dst.String()); return err })
		defer c.Close()
		for range n {
			if _, err := c.Write([]byte("x")); err != nil {
				t.Fatal(err)
			}
		}
		return netip.MustParseAddrPort(c.LocalAddr().String())
	}
	// records checks that each chain recorded exactly one connection
	// from src, between src and dst.
	records := func(what string, src, dst netip.AddrPort, proto uint8) {
		t.Helper()
		l.waitFor(flows.VerdictAllowed, proto, src.Addr(), dst)
		time.Sleep(300 * time.Millisecond) // any other would have come by now
		for _, ingress := range []bool{true, false} {
			got := slices.DeleteFunc(l.of(flows.VerdictAllowed, proto, src.Addr(), dst), func(p flows.Packet) bool {
				return p.Src != src || p.Ingress != ingress
			})
			if len(got) != 1 {
				t.Errorf("%s, ingress %v: %d allowed records, want 1: %+v", what, ingress, len(got), got)
			}
		}
	}
	one := flow(400)
	records("400 datagrams of one unanswered UDP flow", one, dst, unix.IPPROTO_UDP)
	if n := len(l.of(flows.VerdictAllowed, unix.IPPROTO_UDP, a.ip, dst)); n != 2 {
		t.Errorf("one UDP flow: %d allowed records, want 2 (a's egress, b's ingress)", n)
	}
	two := flow(50)
	records("a second flow", two, dst, unix.IPPROTO_UDP)
	if n := len(l.of(flows.VerdictAllowed, unix.IPPROTO_UDP, a.ip, dst)); n != 4 {
		t.Errorf("two UDP flows: %d allowed records, want 4", n)
	}
	c := tp.dial(a.ns, netip.AddrPortFrom(b.ip, 80))
	for range 3 {
		if c == nil || !echoes(c) {
			t.Fatal("a → b TCP/80: no echo")
		}
	}
	records("a TCP connection", netip.MustParseAddrPort(c.LocalAddr().String()), netip.AddrPortFrom(b.ip, 80), unix.IPPROTO_TCP)
}

// The base chains count and log what they drop before any pod's rules:
// a pod's spoofed source (at most 3 at once and then 1 a second per
// connection, all counted), a packet conntrack finds invalid, and a TCP
// packet that would start a connection to an isolated pod without a SYN;
// each names the pod's veth.
func TestBaseChainDropsLogged(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	tp.serve(tp.pods["b"].ns, []int{80}, []int{5353})
	e := tp.enforcer()
	l := tp.readLog(testLogGroup)
	a, b, c := tp.pods["a"], tp.pods["b"], tp.pods["c"]
	bIn := isolate(allow(prefixes(a.ip.String()+"/32", c.ip.String()+"/32")))
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", bIn, nil), tp.pod("c", nil, nil)}}, "ns/a", "ns/b", "ns/c")

	// c sends 50 datagrams of one flow with a's address.
	run(t, "ip", "-n", c.netns, "addr", "add", a.ip.String()+"/32", "dev", "eth0")
	dst := netip.AddrPortFrom(b.ip, 5353)
	var conn net.Conn
	tp.in(c.ns, func() (err error) {
		d := net.Dialer{LocalAddr: &net.UDPAddr{IP: a.ip.AsSlice(), Port: 40000}}
		conn, err = d.Dial("udp", dst.String())
		return err
	})
	defer conn.Close()
	for range 50 {
		if _, err := conn.Write([]byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	// Raw TCP from a to b: SYN and FIN at once (invalid), and an ACK alone
	// (a new connection without a SYN, to isolated b).
	sendTCP(t, tp, a, b.ip, 40001, 80, tcpSYN|tcpFIN)
	sendTCP(t, tp, a, b.ip, 40002, 80, tcpACK)

	for _, w := range []struct {
		why     string
		ingress bool
		src     netip.Addr
		port    uint16
		iface   string
		most    int
	}{
		{flows.DropSpoof, false, a.ip, 5353, c.iface, 4},
		{flows.DropInvalid, false, a.ip, 80, a.iface, 1},
		{flows.DropNoSYN, true, a.ip, 80, b.iface, 1},
	} {
		// invalid and nosyn share their ends: wait for the one of this why.
		var got []flows.Packet
		for deadline := time.Now().Add(time.Second); len(got) == 0 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			got = slices.DeleteFunc(l.of(flows.VerdictDropped, 0, w.src, netip.AddrPortFrom(b.ip, w.port)),
				func(p flows.Packet) bool { return p.Why != w.why })
		}
		if len(got) == 0 {
			t.Errorf("%s: no record within 1 s; the log holds %+v", w.why, l.of("", 0, netip.Addr{}, netip.AddrPort{}))
			continue
		}
		if p := got[0]; p.Ingress != w.ingress || p.Iface != w.iface || p.PodID != "" || p.Fingerprint != "" {
			t.Errorf("%s: %+v, want ingress %v, interface %s", w.why, p, w.ingress, w.iface)
		}
		if len(got) > w.most {
			t.Errorf("%s: %d records, want at most %d", w.why, len(got), w.most)
		}
	}
	drops := tp.counters(e).Drops
	if drops[flows.DropSpoof] != 50 || drops[flows.DropInvalid] != 1 || drops[flows.DropNoSYN] != 1 {
		t.Errorf("drop counters %v, want spoof 50, invalid 1, nosyn 1", drops)
	}
}

// TCP flags.
const (
	tcpFIN = 0x01
	tcpSYN = 0x02
	tcpACK = 0x10
)

// sendTCP sends one TCP segment with flags from pod p to dst:dport, from
// sport, through a raw socket in p's namespace.
func sendTCP(t *testing.T, tp *topo, p *tpod, dst netip.Addr, sport, dport uint16, flags byte) {
	t.Helper()
	seg := make([]byte, 20)
	binary.BigEndian.PutUint16(seg[0:], sport)
	binary.BigEndian.PutUint16(seg[2:], dport)
	binary.BigEndian.PutUint32(seg[4:], 1000)
	if flags&tcpACK != 0 {
		binary.BigEndian.PutUint32(seg[8:], 2000)
	}
	seg[12], seg[13] = 5<<4, flags
	binary.BigEndian.PutUint16(seg[14:], 65535)
	// The checksum over the pseudo-header and the segment.
	src4, dst4 := p.ip.As4(), dst.As4()
	pseudo := append(append(append(src4[:], dst4[:]...), 0, unix.IPPROTO_TCP, 0, byte(len(seg))), seg...)
	var sum uint32
	for i := 0; i < len(pseudo); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(pseudo[i:]))
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	binary.BigEndian.PutUint16(seg[16:], ^uint16(sum))
	tp.in(p.ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		return unix.Sendto(fd, seg, 0, &unix.SockaddrInet4{Addr: dst4})
	})
}
