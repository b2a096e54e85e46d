//go:build privileged

package trace

import (
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/l4"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
)

// TestSend: a probe made in a namespace meets what the namespace's
// stack gives: a listener connects, a closed port refuses, a destination
// whose packets vanish times out; a UDP echo replies, a closed UDP port
// refuses (ICMP), a vanishing one gets no reply.
func TestSend(t *testing.T) {
	testutil.Privileged(t)
	name, sink := testutil.Prefix()+"-probe", testutil.Prefix()+"-sink"
	path := testutil.Netns(t, name)
	testutil.Netns(t, sink)
	// The sink drops whatever reaches it, as a policy drop would.
	for _, cmd := range [][]string{
		{"ip", "-n", name, "link", "set", "lo", "up"},
		{"ip", "-n", name, "link", "add", "p0", "type", "veth", "peer", "name", "p1", "netns", sink},
		{"ip", "-n", name, "addr", "add", "192.0.2.1/24", "dev", "p0"},
		{"ip", "-n", name, "link", "set", "p0", "up"},
		{"ip", "-n", sink, "addr", "add", "192.0.2.9/24", "dev", "p1"},
		{"ip", "-n", sink, "link", "set", "p1", "up"},
		{"ip", "netns", "exec", sink, "nft", "add table inet t; add chain inet t in { type filter hook input priority 0; policy drop; }"},
	} {
		if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", cmd, err, out)
		}
	}
	ns, err := netns.Open(path)
	testutil.Must(t, err)
	defer ns.Close()
	var tcp net.Listener
	var udp net.PacketConn
	testutil.Must(t, netns.Do(ns, func() (err error) {
		if tcp, err = net.Listen("tcp4", "127.0.0.1:0"); err != nil {
			return err
		}
		udp, err = net.ListenPacket("udp4", "127.0.0.1:0")
		return err
	}))
	defer tcp.Close()
	defer udp.Close()
	go func() {
		for {
			c, err := tcp.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	go func() {
		b := make([]byte, 64)
		for {
			n, from, err := udp.ReadFrom(b)
			if err != nil {
				return
			}
			_, _ = udp.WriteTo(b[:n], from)
		}
	}()
	lo := netip.MustParseAddr("127.0.0.1")
	port := func(a net.Addr) uint16 { return uint16(netip.MustParseAddrPort(a.String()).Port()) }
	closed := uint16(testutil.FreePort(t))
	vanish := netip.MustParseAddrPort("192.0.2.9:80") // the sink: no answer
	for _, tc := range []struct {
		name  string
		proto l4.Proto
		from  netip.Addr
		dst   netip.AddrPort
		want  string
	}{
		{"tcp listener", l4.TCP, lo, netip.AddrPortFrom(lo, port(tcp.Addr())), Connected},
		{"tcp closed port", l4.TCP, lo, netip.AddrPortFrom(lo, closed), Refused},
		{"tcp vanishing", l4.TCP, netip.MustParseAddr("192.0.2.1"), vanish, TimedOut},
		{"udp echo", l4.UDP, lo, netip.AddrPortFrom(lo, port(udp.LocalAddr())), Replied},
		{"udp closed port", l4.UDP, lo, netip.AddrPortFrom(lo, closed), Refused},
		{"udp vanishing", l4.UDP, netip.MustParseAddr("192.0.2.1"), vanish, NoReply},
	} {
		s, err := send(path, tc.proto, tc.from, tc.dst, 500*time.Millisecond)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		if s.outcome != tc.want || s.local.Addr() != tc.from || s.local.Port() == 0 {
			t.Errorf("%s: %s from %s (%v), want %s from %s:*", tc.name, s.outcome, s.local, s.err, tc.want, tc.from)
		}
	}
	if _, err := send("/run/netns/"+name+"-gone", l4.TCP, lo, netip.AddrPortFrom(lo, closed), time.Second); err == nil {
		t.Error("a probe from a namespace that does not exist: no error")
	}
}
