//go:build privileged

package policy

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/flows"
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

// of are the packets read so far of proto from src to dst (a zero
// protocol, address or port: any).
func (l *logged) of(proto uint8, src netip.Addr, dst netip.AddrPort) []flows.Packet {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []flows.Packet
	for _, p := range l.packets {
		if (proto == 0 || p.Proto == proto) && (!src.IsValid() || p.Src.Addr() == src) &&
			(!dst.Addr().IsValid() || p.Dst.Addr() == dst.Addr()) && (dst.Port() == 0 || p.Dst.Port() == dst.Port()) {
			out = append(out, p)
		}
	}
	return out
}

// waitFor waits up to 1 s (the bound docs/observability.md gives) for a
// logged packet between src and dst.
func (l *logged) waitFor(proto uint8, src netip.Addr, dst netip.AddrPort) []flows.Packet {
	for deadline := time.Now().Add(time.Second); ; time.Sleep(10 * time.Millisecond) {
		if got := l.of(proto, src, dst); len(got) > 0 || time.Now().After(deadline) {
			return got
		}
	}
}

// The pods' chains log each packet they drop, in both families and
// directions, with the pod's id and the direction, and only those: an
// allowed packet is not logged. One connection's drops are logged at
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
		got := l.waitFor(c.proto, c.src, c.dst)
		if len(got) == 0 {
			t.Errorf("%s: no logged packet within 1 s; the log holds %+v", c.what, l.of(0, netip.Addr{}, netip.AddrPort{}))
			continue
		}
		if p := got[0]; p.Verdict != flows.VerdictDenied || p.Ingress != c.ingress || p.PodID != PodID(c.pod) {
			t.Errorf("%s: logged %+v, want verdict %s, ingress %v, pod id %s (%s)", c.what, p, flows.VerdictDenied, c.ingress, PodID(c.pod), c.pod)
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

	if got := l.of(6, a.ip, netip.AddrPortFrom(b.ip, 80)); len(got) != 0 {
		t.Errorf("allowed a → b TCP 80 logged: %+v", got)
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
	if got, most := len(l.of(17, a.ip, dst)), 3+int(sent/time.Second)+1; got < 3 || got > most {
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
	if got, most := len(l.of(17, a.ip, dst)), 50+20*int(sent/time.Second+1); got < 50 || got > most {
		t.Errorf("300 dropped datagrams of as many connections to b in %v: %d logged, want 50 to %d", sent, got, most)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.lost != 0 {
		t.Errorf("the reader lost %d messages", l.lost)
	}
}
