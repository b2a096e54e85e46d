package policy

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/vishvananda/netlink"
)

// A server pod on this node and a client pod on another; the server's
// ingress allows the client on port 80 only.
var (
	server   = netip.MustParseAddr("10.244.1.5")
	client   = netip.MustParseAddr("10.244.2.7")
	webOnly  = &Direction{Policies: []string{"x/web"}, Rules: []Rule{{Policy: "x/web", Peers: []netip.Prefix{netip.PrefixFrom(client, 32)}, Ports: []PortRange{{TCP, 80, 80}}}}}
	isolated = Ruleset{Pods: []Pod{{Key: "x/server", IPs: []netip.Addr{server}, Ingress: webOnly}}}
	open     = Ruleset{Pods: []Pod{{Key: "x/server", IPs: []netip.Addr{server}}}}
)

func ap(a netip.Addr, port uint16) netip.AddrPort { return netip.AddrPortFrom(a, port) }

// A connection the fast path opened is judged as the connection it is,
// whichever end conntrack took for its client when the slow path picked
// it up mid-way.
func TestRevokeJudgesAPickedUpConnectionAsTheFastPathOpenedIt(t *testing.T) {
	// The server spoke first after the flow left the cache: conntrack has
	// server:22 -> client:41000, which no policy of this node isolates.
	pickedUp := &netlink.ConntrackFlow{
		Forward: netlink.IPTuple{SrcIP: net.IP(server.AsSlice()), DstIP: net.IP(client.AsSlice()), SrcPort: 22, DstPort: 41000, Protocol: uint8(TCP)},
		Reverse: netlink.IPTuple{SrcIP: net.IP(client.AsSlice()), DstIP: net.IP(server.AsSlice()), SrcPort: 41000, DstPort: 22, Protocol: uint8(TCP)},
	}
	opened := fastpath.Conn{Client: ap(client, 41000), Server: ap(server, 22), Proto: uint8(TCP)}
	filter := func(opened ...fastpath.Conn) *revokeFilter {
		f := &revokeFilter{rs: &isolated, pods: map[netip.Addr]bool{server: true}, host: map[netip.Addr]bool{},
			kept: map[flowID]bool{}, opened: map[flowID]Connection{}, ended: map[flowID]bool{}}
		for _, c := range opened {
			f.opened[newFlowID(c.Client, c.Server, Proto(c.Proto))] = openedConnection(c)
		}
		return f
	}
	if filter().MatchConntrackFlow(pickedUp) {
		t.Fatal("without the fast path's record the entry reads as the server's own connection, which policy allows")
	}
	f := filter(opened)
	if !f.MatchConntrackFlow(pickedUp) {
		t.Fatal("the client's connection to port 22, which policy denies, kept its conntrack entry")
	}
	if !f.ended[newFlowID(opened.Client, opened.Server, TCP)] {
		t.Fatal("the ended connection is not recorded, so the flow cache would count it again")
	}
}

// Conntrack entries of a pod whose rules changed: a TCP connection its
// rules deny ends, one they allow stays; an ICMP echo's ends where only
// rules with ports allow the peer (the chains judge ICMP by the rules
// without ports); an SCTP association stays, as netlink reads no SCTP
// ports to judge it by.
func TestRevokeFilter(t *testing.T) {
	entry := func(proto uint8, port uint16) *netlink.ConntrackFlow {
		f := &netlink.ConntrackFlow{}
		f.Forward = netlink.IPTuple{SrcIP: client.AsSlice(), DstIP: server.AsSlice(), Protocol: proto, SrcPort: 40000, DstPort: port}
		f.Reverse = netlink.IPTuple{SrcIP: server.AsSlice(), DstIP: client.AsSlice(), Protocol: proto, SrcPort: port, DstPort: 40000}
		if proto != uint8(TCP) && proto != uint8(UDP) {
			f.Forward.SrcPort, f.Forward.DstPort, f.Reverse.SrcPort, f.Reverse.DstPort = 0, 0, 0, 0
		}
		return f
	}
	for _, c := range []struct {
		name string
		flow *netlink.ConntrackFlow
		ends bool
	}{
		{"TCP to the port its rules allow", entry(uint8(TCP), 80), false},
		{"TCP to another port", entry(uint8(TCP), 22), true},
		{"an ICMP echo", entry(1, 0), true},
		{"an SCTP association", entry(uint8(SCTP), 80), false},
	} {
		f := &revokeFilter{rs: &isolated, pods: map[netip.Addr]bool{server: true}, host: map[netip.Addr]bool{},
			kept: map[flowID]bool{}, opened: map[flowID]Connection{}, ended: map[flowID]bool{}}
		if got := f.MatchConntrackFlow(c.flow); got != c.ends {
			t.Errorf("%s: ended %v, want %v", c.name, got, c.ends)
		}
	}
}

func TestJudgeFlow(t *testing.T) {
	kept := Revoked{kept: map[flowID]bool{newFlowID(ap(server, 80), ap(client, 40000), TCP): true}, ended: map[flowID]bool{}}
	endedInConntrack := Revoked{ended: map[flowID]bool{newFlowID(ap(server, 22), ap(client, 41000), TCP): true}}
	cases := []struct {
		name          string
		rs            Ruleset
		r             Revoked
		local, remote netip.AddrPort
		opener        fastpath.Opener
		want          fastpath.Verdict
		ended         bool
		audit         bool // the server's enforcement is unchanged; an audit closed it (Prepared.Audited)
	}{
		{"opened by the slow path, still allowed in conntrack", isolated, kept, ap(server, 80), ap(client, 40000), fastpath.OpenedBySlowPath, fastpath.Keep, false, false},
		{"opened by the slow path, gone from conntrack", isolated, kept, ap(server, 80), ap(client, 40001), fastpath.OpenedBySlowPath, fastpath.Evict, false, false},
		{"opened by the fast path, allowed, the server now isolated", isolated, kept, ap(server, 80), ap(client, 41000), fastpath.OpenedByRemote, fastpath.HandOver, false, false},
		{"opened by the fast path, the server still open", open, kept, ap(server, 22), ap(client, 41000), fastpath.OpenedByRemote, fastpath.Keep, false, false},
		{"opened by the fast path, the server now isolated only for egress", Ruleset{Pods: []Pod{{Key: "x/server", IPs: []netip.Addr{server}, Egress: &Direction{}}}}, kept, ap(server, 22), ap(client, 41000), fastpath.OpenedByRemote, fastpath.HandOver, false, false},
		{"opened by the fast path, now denied", isolated, kept, ap(server, 22), ap(client, 41000), fastpath.OpenedByRemote, fastpath.Evict, true, false},
		{"opened by the fast path, denied, already ended in conntrack", isolated, endedInConntrack, ap(server, 22), ap(client, 41000), fastpath.OpenedByRemote, fastpath.Evict, false, false},
		// The server's own connection out to the client's port 22: its
		// ingress rules do not judge it, but the pod is isolated now.
		{"opened by the local pod, allowed, the pod now isolated the other way", isolated, kept, ap(server, 41000), ap(client, 22), fastpath.OpenedByLocal, fastpath.HandOver, false, false},
		// An audit never ends a connection: a flow of a pod it closed is
		// handed over (the fast path's) or kept (the slow path's), even
		// one the rules in force would deny (they did before, unchanged).
		{"audited, opened by the fast path", open, kept, ap(server, 22), ap(client, 41000), fastpath.OpenedByRemote, fastpath.HandOver, false, true},
		{"audited, opened by the fast path, denied", isolated, kept, ap(server, 22), ap(client, 41000), fastpath.OpenedByRemote, fastpath.HandOver, false, true},
		{"audited, opened by the slow path, unknown to Revoke", isolated, kept, ap(server, 80), ap(client, 40001), fastpath.OpenedBySlowPath, fastpath.Keep, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			revoked := map[netip.Addr]bool{server: !c.audit}
			v, ended := judgeFlow(c.rs, openPods(c.rs), c.r, revoked, c.local, c.remote, uint8(TCP), c.opener)
			if v != c.want || ended != c.ended {
				t.Fatalf("verdict %d, ended %v; want %d, %v", v, ended, c.want, c.ended)
			}
		})
	}
}

func TestOpenPods(t *testing.T) {
	rs := Ruleset{Pods: []Pod{
		{Key: "x/open", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.2")}},
		{Key: "x/in", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.3")}, Ingress: &Direction{}},
		{Key: "x/out", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.4")}, Egress: &Direction{}},
		// Two attachments of one address, one of them isolated.
		{Key: "x/new", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}},
		{Key: "x/old", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}, Ingress: &Direction{}},
		// Dual-stack pods: both addresses go to the fast path (SetOpen
		// puts the IPv6 ones in onc_open6).
		{Key: "x/dual", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.6"), netip.MustParseAddr("fd00:10:244:1::6")}},
		{Key: "x/dual-in", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.7"), netip.MustParseAddr("fd00:10:244:1::7")}, Ingress: &Direction{}},
		// Audited only, in either direction: its new connections must meet
		// the table, which reports what audit would deny.
		{Key: "x/audit-in", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.8")}, AuditIngress: &Direction{}},
		{Key: "x/audit-eg", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.9")}, AuditEgress: &Direction{}},
	}}
	want := map[string]bool{"10.244.1.2": true, "10.244.1.3": false, "10.244.1.4": false, "10.244.1.5": false,
		"10.244.1.6": true, "fd00:10:244:1::6": true, "10.244.1.7": false, "fd00:10:244:1::7": false,
		"10.244.1.8": false, "10.244.1.9": false}
	check := func(rs Ruleset, want map[string]bool) {
		t.Helper()
		got := openPods(rs)
		for ip, o := range want {
			if v, ok := got[netip.MustParseAddr(ip)]; v != o || !ok {
				t.Errorf("%s: open %v, want %v", ip, got[netip.MustParseAddr(ip)], o)
			}
		}
	}
	check(rs, want)
	// The audit annotation goes: the pods rejoin.
	rs.Pods[7].AuditIngress, rs.Pods[8].AuditEgress = nil, nil
	want["10.244.1.8"], want["10.244.1.9"] = true, true
	check(rs, want)
}

// A pod an audit closes to the flow cache, its enforcement unchanged, is
// in Prepared.Audited (to have the connections the fast path opened
// handed over), not in Changed (nothing is revoked); one already closed,
// by an audit or by isolation, or whose enforcement changes too, is not.
func TestPrepareReportsThePodsAnAuditCloses(t *testing.T) {
	e, _ := fakeEnforcer(t)
	pod := func(key, iface, ip string, in, auditIn, auditEg *Direction) Pod {
		return Pod{Key: key, Iface: iface, IPs: []netip.Addr{netip.MustParseAddr(ip)}, Ingress: in, AuditIngress: auditIn, AuditEgress: auditEg}
	}
	rs := func(a, b, c Pod) Ruleset { return Ruleset{Pods: []Pod{a, b, c}} }
	open := rs(pod("ns/a", "vetha", "10.99.0.1", nil, nil, nil), pod("ns/b", "vethb", "10.99.0.2", nil, nil, nil), pod("ns/c", "vethc", "10.99.0.3", isolate(), nil, nil))
	step := func(what string, next Ruleset, changed, audited []string) {
		t.Helper()
		p, err := e.Prepare(next)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p.Changed, changed) || !slices.Equal(p.Audited, audited) {
			t.Errorf("%s: changed %v, audited %v; want %v, %v", what, p.Changed, p.Audited, changed, audited)
		}
		if err := e.Commit(p, false); err != nil {
			t.Fatal(err)
		}
	}
	step("first", open, []string{"ns/a", "ns/b", "ns/c"}, nil)
	// a and b audited, c (isolated) too: only a and b were open.
	step("audit starts", rs(pod("ns/a", "vetha", "10.99.0.1", nil, audited(), nil), pod("ns/b", "vethb", "10.99.0.2", nil, nil, audited()),
		pod("ns/c", "vethc", "10.99.0.3", isolate(), audited(), nil)), nil, []string{"ns/a", "ns/b"})
	// Audited in the other direction too, or by other rules: already closed.
	step("audit grows", rs(pod("ns/a", "vetha", "10.99.0.1", nil, audited(), audited()), pod("ns/b", "vethb", "10.99.0.2", nil, nil,
		audited(allow(prefixes("10.0.0.0/8")))), pod("ns/c", "vethc", "10.99.0.3", isolate(), audited(), nil)), nil, nil)
	step("audit ends", open, nil, nil)
	// Isolated and audited at once: a change of enforcement, revoked.
	step("isolated and audited", rs(pod("ns/a", "vetha", "10.99.0.1", isolate(), audited(), nil), open.Pods[1], open.Pods[2]), []string{"ns/a"}, nil)
}
