//go:build privileged

package policy

import (
	"fmt"
	"net"
	"net/netip"
	"testing"

	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// TestEnforceEndsDeniedBypassedIPv6: with the intra-node bypass on, a
// change that denies a bypassed IPv6 connection ends it (its bytes never
// pass netfilter, so only aborting its sockets does), and one it still
// allows stays bypassed.
func TestEnforceEndsDeniedBypassedIPv6(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	bp := tp.bypass()
	n := NewNode(func() *fastpath.Datapath { return nil }, func() *bypass.Bypass { return bp }, 0)
	t.Cleanup(func() { n.Close() })
	enforce := func(rs Ruleset) Change {
		t.Helper()
		var ch Change
		tp.in(tp.nodeNS, func() (err error) {
			ch, err = n.Enforce(rs, false)
			return err
		})
		return ch
	}
	a, b, c := tp.pods["a"], tp.pods["b"], tp.pods["c"]
	bIn := func(peers ...netip.Addr) Ruleset {
		var from []netip.Prefix
		for _, p := range peers {
			from = append(from, netip.PrefixFrom(p, p.BitLen()))
		}
		return Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", isolate(allow(from, PortRange{TCP, 9000, 9000})), nil), tp.pod("c", nil, nil)}}
	}
	enforce(bIn(a.ip6, c.ip6))
	denied, deniedServer := tp.pair(a.ns, netip.AddrPortFrom(b.ip6, 9000), b, 9000)
	kept, keptServer := tp.pair(c.ns, netip.AddrPortFrom(b.ip6, 9000), b, 9000)
	for _, conn := range [][2]string{{denied.LocalAddr().String(), deniedServer.LocalAddr().String()}, {kept.LocalAddr().String(), keptServer.LocalAddr().String()}} {
		if !bypassed(t, bp, netip.MustParseAddrPort(conn[0]), netip.MustParseAddrPort(conn[1])) {
			t.Fatalf("the IPv6 connection %s -> %s is not bypassed: the test would prove nothing", conn[0], conn[1])
		}
	}
	if !passes(denied, deniedServer) || !passes(keptServer, kept) {
		t.Fatal("the bypassed IPv6 connections do not carry data")
	}

	// b now lets in c alone, and a over IPv4 only.
	if ch := enforce(bIn(a.ip, c.ip6)); ch.Ended < 1 {
		t.Errorf("Enforce ended %d connections, want the bypassed IPv6 one", ch.Ended)
	}
	if passes(denied, deniedServer) || passes(deniedServer, denied) {
		t.Fatal("the bypassed IPv6 connection the change denies still carries data")
	}
	if bypassed(t, bp, netip.MustParseAddrPort(denied.LocalAddr().String()), netip.MustParseAddrPort(deniedServer.LocalAddr().String())) {
		t.Error("the ended IPv6 connection is still listed as bypassed")
	}
	if !passes(kept, keptServer) || !passes(keptServer, kept) {
		t.Error("the IPv6 connection the change still allows was ended")
	}
}

// bypass loads an intra-node bypass, on, on a private bpffs and a
// throwaway cgroup this test process joins, with every pod registered by
// both its addresses.
func (tp *topo) bypass() *bypass.Bypass {
	t := tp.t
	t.Helper()
	cgroup := bpftest.Cgroup(t)
	bpftest.JoinCgroup(t, cgroup)
	dir := t.TempDir()
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	bp, err := bypass.Open(bypass.Options{PinDir: dir, Cgroup: cgroup})
	testutil.Must(t, err)
	t.Cleanup(func() { bp.Close() })
	testutil.Must(t, bp.Attach())
	testutil.Must(t, bp.SetConfig(bypass.Config{Mode: bypass.On}))
	for _, p := range tp.pods {
		cookie, err := netns.CookieOf(p.ns)
		testutil.Must(t, err)
		for _, ip := range []netip.Addr{p.ip, p.ip6} {
			testutil.Must(t, bp.OwnPod(ip, "/run/netns/"+p.netns, cookie))
		}
	}
	return bp
}

// bypassed reports whether bp holds both ends of the connection client ->
// server.
func bypassed(t *testing.T, bp *bypass.Bypass, client, server netip.AddrPort) bool {
	t.Helper()
	conns, err := bp.Conns()
	testutil.Must(t, err)
	for _, c := range conns {
		if c.Client == client && c.Server == server {
			return c.Paired()
		}
	}
	return false
}

// TestResyncLeavesBypassRecording: a resync that changes no pod's rules
// does not pause the bypass, so connections opened while the agent
// resyncs are bypassed as any other (a pause there once sent a test's
// connection to the stack for good).
func TestResyncLeavesBypassRecording(t *testing.T) {
	tp := newTopo(t, "a", "b")
	bp := tp.bypass()
	n := NewNode(func() *fastpath.Datapath { return nil }, func() *bypass.Bypass { return bp }, 0)
	t.Cleanup(func() { n.Close() })
	a, b := tp.pods["a"], tp.pods["b"]
	rs := Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", isolate(allow([]netip.Prefix{netip.PrefixFrom(a.ip, 32)}, PortRange{TCP, 9000, 9000})), nil)}}
	tp.in(tp.nodeNS, func() error { _, err := n.Enforce(rs, true); return err })
	skipped := func() uint64 { return bpftest.Counter(t, bp.Stats, "skip_paused") }
	before := skipped()

	stop, done := make(chan struct{}), make(chan error, 1)
	resyncs := 0
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			var ch Change
			var err error
			tp.in(tp.nodeNS, func() error { ch, err = n.Enforce(rs, i%2 == 0); return nil })
			if err == nil && len(ch.Pods) > 0 {
				err = fmt.Errorf("resync %d changed %v", i, ch.Pods)
			}
			if err != nil {
				done <- err
				return
			}
			resyncs++
		}
	}()
	var conns [][2]net.Conn
	for range 20 {
		c, s := tp.pair(a.ns, netip.AddrPortFrom(b.ip, 9000), b, 9000)
		conns = append(conns, [2]net.Conn{c, s})
	}
	close(stop)
	testutil.Must(t, <-done)
	if resyncs < 10 {
		t.Fatalf("only %d resyncs ran beside the connections: the test would prove nothing", resyncs)
	}
	if got := skipped(); got != before {
		t.Errorf("skip_paused went from %d to %d over %d resyncs that changed nothing", before, got, resyncs)
	}
	for _, c := range conns {
		if !bypassed(t, bp, netip.MustParseAddrPort(c[0].LocalAddr().String()), netip.MustParseAddrPort(c[1].LocalAddr().String())) {
			t.Errorf("the connection %s -> %s, opened during resyncs, is not bypassed", c[0].LocalAddr(), c[1].LocalAddr())
		}
	}
}
