//go:build privileged

package policy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/net/icmp"
	xipv4 "golang.org/x/net/ipv4"
	xipv6 "golang.org/x/net/ipv6"
)

// pingIDs count the echo requests sent: each has an id of its own, so
// that conntrack takes each for a new connection (an earlier answered one
// with the same id would still be established).
var pingIDs atomic.Uint32

// pings reports whether an ICMP (ICMPv6) echo request from ns to dst is
// answered within dropWait.
func (tp *topo) pings(ns netns.Handle, dst netip.Addr) bool {
	tp.t.Helper()
	return tp.pingsWithID(ns, dst, (os.Getpid()+int(pingIDs.Add(1)))&0xffff)
}

// pingsWithID is pings with the echo's id: conntrack takes a request with
// the id of an earlier answered one for that connection, established.
func (tp *topo) pingsWithID(ns netns.Handle, dst netip.Addr, id int) bool {
	tp.t.Helper()
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var request, reply icmp.Type = xipv4.ICMPTypeEcho, xipv4.ICMPTypeEchoReply
	if dst.Is6() {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		request, reply = xipv6.ICMPTypeEchoRequest, xipv6.ICMPTypeEchoReply
	}
	answered := false
	tp.in(ns, func() error {
		c, err := icmp.ListenPacket(network, listen)
		if err != nil {
			return err
		}
		defer c.Close()
		msg := icmp.Message{Type: request, Body: &icmp.Echo{ID: id, Seq: 1, Data: []byte("onc")}}
		b, _ := msg.Marshal(nil)
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(dropWait))
		buf := make([]byte, 1500)
		for {
			n, peer, err := c.ReadFrom(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return nil
			}
			if err != nil {
				return err
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply || peer.String() != dst.String() {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq == 1 {
				answered = true
				return nil
			}
		}
	})
	return answered
}

// expectPings checks ICMP echo from the pods from to the pod to, over both
// families.
func (tp *topo) expectPings(from, to string, ok bool) {
	tp.t.Helper()
	for _, dst := range []netip.Addr{tp.pods[to].ip, tp.pods[to].ip6} {
		if got := tp.pings(tp.ns(from), dst); got != ok {
			out, _ := tp.nft("list", "table", "inet", Table)
			tp.t.Fatalf("ping %s -> %s (%s): answered=%v, want %v; table:\n%s", from, to, dst, got, ok, out)
		}
	}
}

// ClusterNetworkPolicy tiers in the kernel: an Admin deny over a
// NetworkPolicy allow, an Admin pass to the NetworkPolicy's default deny,
// an Admin accept over it, a Baseline deny of a pod no NetworkPolicy
// isolates, ICMP allowed and denied through the other sets, and an
// established connection ended when an Admin deny arrives.
func TestTiers(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	for _, p := range tp.pods {
		tp.serve(p.ns, []int{80, 8080}, []int{53})
	}
	e := tp.enforcer()
	a, b, c := tp.pods["a"], tp.pods["b"], tp.pods["c"]
	aNet := prefixes(a.ip.String()+"/32", a.ip6.String()+"/128")
	cNet := prefixes(c.ip.String()+"/32", c.ip6.String()+"/128")
	everyone := prefixes("0.0.0.0/0", "::/0")
	rs := func(bIn *Direction) Ruleset {
		return Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", bIn, nil), tp.pod("c", nil, nil)}}
	}
	// b's NetworkPolicy lets a and c in on TCP 80; admin rules around it.
	np := func(admin ...TierRule) *Direction {
		return &Direction{Policies: []string{"ns/np"}, Rules: []Rule{allow(slices.Concat(aNet, cNet), PortRange{TCP, 80, 80})}, Admin: admin}
	}

	tp.apply(e, rs(np(tierRule("quarantine-a", Deny, aNet))), "ns/a", "ns/b", "ns/c")
	tp.expect(
		probe{"a", "tcp", "b", 80, false}, // the admin deny over the NetworkPolicy's allow
		probe{"a", "tcp6", "b", 80, false},
		probe{"c", "tcp", "b", 80, true},
		probe{"c", "tcp6", "b", 80, true},
		probe{"c", "tcp", "b", 8080, false}, // the NetworkPolicy's default deny
		probe{"node", "tcp", "b", 80, true},
	)
	tp.expectPings("a", "b", false)
	tp.expectPings("c", "b", false)

	// c passed to the NetworkPolicy (its default deny beyond TCP 80),
	// before an accept of everyone that lets a in on every port.
	tp.apply(e, rs(np(tierRule("pass-c", Pass, cNet), tierRule("open", Accept, everyone))), "ns/b")
	tp.expect(
		probe{"c", "tcp", "b", 80, true},
		probe{"c", "tcp", "b", 8080, false},
		probe{"c", "udp6", "b", 53, false},
		probe{"a", "tcp", "b", 8080, true}, // the admin accept over the default deny
		probe{"a", "udp", "b", 53, true},
		probe{"a", "tcp6", "b", 8080, true},
	)
	tp.expectPings("a", "b", true)
	tp.expectPings("c", "b", false)

	// No NetworkPolicy isolates b: Baseline rules decide, and a pod they
	// do not name is allowed. a is denied TCP 80 only: its ICMP goes by
	// the other sets. c is denied everything.
	base := &Direction{ClusterOnly: true, Baseline: []TierRule{
		tierRule("no-web-for-a", Deny, aNet, PortRange{TCP, 80, 80}),
		tierRule("no-c", Deny, cNet),
	}}
	tp.apply(e, rs(base), "ns/b")
	tp.expect(
		probe{"a", "tcp", "b", 80, false},
		probe{"a", "tcp6", "b", 80, false},
		probe{"a", "tcp", "b", 8080, true},
		probe{"a", "udp6", "b", 53, true},
		probe{"c", "tcp", "b", 8080, false},
		probe{"c", "udp", "b", 53, false},
		probe{"node", "tcp", "b", 80, true},
	)
	tp.expectPings("a", "b", true)
	tp.expectPings("c", "b", false)
	chain := ingress.chain(PodID(b.key))
	for f, want := range []string{a.ip.String(), a.ip6.String()} {
		// In whichever pair of sets the change filled.
		out, err := tp.nft("list", "set", "inet", Table, otherSet(chain, f, false))
		if err != nil {
			out, err = tp.nft("list", "set", "inet", Table, otherSet(chain, f, true))
		}
		if err != nil || !strings.Contains(out, want) {
			t.Errorf("the other set of family %d: %v\n%s\nwant %s in it", f, err, out, want)
		}
	}
	// The all sets hold every address but a's and c's as ranges, which
	// nft takes and lists back as written.
	all := compileDirection(base, nil).all
	if !slices.ContainsFunc(all, func(r addrRange) bool { return strings.Contains(r.String(), "-") }) {
		t.Errorf("all %v: want ranges that are no prefix", all)
	}
	for _, r := range all {
		out, err := tp.nft("list", "set", "inet", Table, allElem(chain, false, r).Set)
		if err != nil {
			out, err = tp.nft("list", "set", "inet", Table, allElem(chain, true, r).Set)
		}
		listed := r.String() // nft lists one address without its /32 or /128
		if r.first == r.last {
			listed = r.first.String()
		}
		if err != nil || !regexp.MustCompile(`[{ ]`+regexp.QuoteMeta(listed)+`[,\s]`).MatchString(out) {
			t.Errorf("the all set: %v\n%s\nwant %s in it", err, out, listed)
		}
	}
	// b's own egress is not isolated: its pings go out.
	tp.expectPings("b", "c", true)

	// An Admin deny arrives while a and c are connected: a's connection
	// ends, and its pings (ICMP too is judged again), c's stays.
	allowed := &Direction{Policies: []string{"ns/np"}, Rules: []Rule{allow(slices.Concat(aNet, cNet), PortRange{TCP, 9000, 9000}), allow(aNet)}}
	tp.apply(e, rs(allowed), "ns/b")
	aClient, aServer := tp.pair(a.ns, netip.AddrPortFrom(b.ip, 9000), b, 9000)
	cClient, cServer := tp.pair(c.ns, netip.AddrPortFrom(b.ip6, 9000), b, 9000)
	if !passes(aClient, aServer) || !passes(cClient, cServer) {
		t.Fatal("the allowed connections do not carry data")
	}
	pingID := (os.Getpid() + int(pingIDs.Add(1))) & 0xffff
	for _, dst := range []netip.Addr{b.ip, b.ip6} {
		if !tp.pingsWithID(a.ns, dst, pingID) {
			t.Fatalf("a's ping to %s is not answered before the Admin deny", dst)
		}
	}
	quarantined := &Direction{Policies: allowed.Policies, Rules: allowed.Rules, Admin: []TierRule{tierRule("quarantine-a", Deny, aNet)}}
	tp.apply(e, rs(quarantined), "ns/b")
	if r := tp.revoke(e, rs(quarantined), "ns/b"); r.Ended < 1 {
		t.Errorf("Revoke ended %d connections, want a's among them", r.Ended)
	}
	if passes(aClient, aServer) || passes(aServer, aClient) {
		t.Error("the connection the Admin deny denies still carries data")
	}
	for _, dst := range []netip.Addr{b.ip, b.ip6} {
		if tp.pingsWithID(a.ns, dst, pingID) {
			t.Errorf("a's ping to %s, established before the Admin deny, is still answered", dst)
		}
	}
	if !passes(cClient, cServer) || !passes(cServer, cClient) {
		t.Error("the connection still allowed was ended")
	}
}

// A run of Applies of random tiers, which make the other sets come, change
// and go (in place and in the other pair), leaves the table exactly as one
// Apply of the last Ruleset on a fresh table would.
func TestIncrementalTiers(t *testing.T) {
	privileged(t)
	pre := testutil.Prefix()
	inc, ref := pre+"-inc", pre+"-ref"
	incNS, refNS := openNS(t, testutil.Netns(t, inc)), openNS(t, testutil.Netns(t, ref))
	tp := &topo{t: t}
	var e *Enforcer
	tp.in(incNS, func() (err error) { e, err = NewEnforcer(testLogGroup); return err })
	r := rand.New(rand.NewPCG(13, 14))
	randDir := func(old *Direction) *Direction {
		switch r.IntN(4) {
		case 0:
			return nil
		case 1:
			return old
		}
		return randTiered(r)
	}
	var prev Ruleset
	others := 0
	for step := range 40 {
		var rs Ruleset
		for i := range 4 {
			p := Pod{Key: fmt.Sprintf("ns/k%d", i), Iface: fmt.Sprintf("veth%d", i),
				IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 0, byte(i)}), netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(i)})}}
			if old := prev.Pod(p.Key); old != nil {
				p.Ingress, p.Egress = old.Ingress, old.Egress
			}
			p.Ingress, p.Egress = randDir(p.Ingress), randDir(p.Egress)
			for _, d := range []*Direction{p.Ingress, p.Egress} {
				if d != nil && len(compileDirection(d, nil).other) > 0 {
					others++
				}
			}
			rs.Pods = append(rs.Pods, p)
		}
		tp.in(incNS, func() error { _, err := e.Apply(rs, false); return err })
		tp.sameAsFresh(step, rs, inc, ref, refNS)
		prev = rs
	}
	if others < 10 {
		t.Errorf("only %d directions with other sets in 40 steps: the test proves little", others)
	}
}

// With the intra-node bypass on, an Admin deny arriving ends the bypassed
// connection it denies (aborting its sockets: its bytes never pass
// netfilter) and leaves the one still allowed.
func TestAdminDenyEndsBypassed(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	bp := tp.bypass()
	n := NewNode(func() *fastpath.Datapath { return nil }, func() *bypass.Bypass { return bp }, 0)
	t.Cleanup(func() { n.Close() })
	a, b, c := tp.pods["a"], tp.pods["b"], tp.pods["c"]
	aNet := prefixes(a.ip.String() + "/32")
	bIn := &Direction{Policies: []string{"ns/np"}, Rules: []Rule{allow(slices.Concat(aNet, prefixes(c.ip.String()+"/32")), PortRange{TCP, 9000, 9000})}}
	enforce := func(bIn *Direction) Change {
		t.Helper()
		var ch Change
		tp.in(tp.nodeNS, func() (err error) {
			ch, err = n.Enforce(Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", bIn, nil), tp.pod("c", nil, nil)}}, false)
			return err
		})
		return ch
	}
	enforce(bIn)
	denied, deniedServer := tp.pair(a.ns, netip.AddrPortFrom(b.ip, 9000), b, 9000)
	kept, keptServer := tp.pair(c.ns, netip.AddrPortFrom(b.ip, 9000), b, 9000)
	ends := func(client, server net.Conn) [2]netip.AddrPort {
		return [2]netip.AddrPort{netip.MustParseAddrPort(client.LocalAddr().String()), netip.MustParseAddrPort(server.LocalAddr().String())}
	}
	for _, e := range [][2]netip.AddrPort{ends(denied, deniedServer), ends(kept, keptServer)} {
		if !bypassed(t, bp, e[0], e[1]) {
			t.Fatalf("the connection %s -> %s is not bypassed: the test would prove nothing", e[0], e[1])
		}
	}

	quarantined := &Direction{Policies: bIn.Policies, Rules: bIn.Rules, Admin: []TierRule{tierRule("quarantine-a", Deny, aNet)}}
	if ch := enforce(quarantined); ch.Ended < 1 || !slices.Equal(ch.Pods, []string{"ns/b"}) {
		t.Errorf("Enforce: %+v; want b changed and the bypassed connection ended", ch)
	}
	if passes(denied, deniedServer) || passes(deniedServer, denied) {
		t.Fatal("the bypassed connection the Admin deny denies still carries data")
	}
	if e := ends(denied, deniedServer); bypassed(t, bp, e[0], e[1]) {
		t.Error("the ended connection is still listed as bypassed")
	}
	if !passes(kept, keptServer) || !passes(keptServer, kept) {
		t.Error("the bypassed connection still allowed was ended")
	}
}
