//go:build privileged

package policy

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/flows"
)

// Audit mode in the kernel: an audited deny-all drops nothing, and logs
// and counts what it would deny; beside an enforcing policy, an audited
// rule that would allow a dropped packet logs and counts it, and the
// packet still drops. Switching a policy from audit to enforce ends the
// connections it denies, as any change does; from enforce to audit ends
// none. A rewrite keeps the audit counters.
func TestAudit(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	tp.serve(tp.pods["b"].ns, []int{80, 8080}, nil)
	e := tp.enforcer()
	l := tp.readLog(testLogGroup)
	a, b, c := tp.pods["a"], tp.pods["b"], tp.pods["c"]
	rs := func(b Pod) Ruleset { return Ruleset{Pods: []Pod{tp.pod("a", nil, nil), b, tp.pod("c", nil, nil)}} }
	withAudit := func(p Pod, in *Direction) Pod { p.AuditIngress = in; return p }
	// logged waits for the log of a packet from src to b's port with
	// verdict, and checks that it is b's ingress chain's and that its
	// fingerprint names the rules of policy (the audited ones for W and
	// U).
	logged := func(what string, src netip.Addr, port uint16, verdict, policy string) {
		t.Helper()
		got := l.waitFor(verdict, 6, src, netip.AddrPortFrom(b.ip, port))
		if len(got) == 0 {
			t.Fatalf("%s: no %s logged within 1 s; the log holds %+v", what, verdict, l.of("", 0, netip.Addr{}, netip.AddrPort{}))
		}
		p := got[len(got)-1]
		if !p.Ingress || p.PodID != PodID("ns/b") {
			t.Errorf("%s: logged %+v, want b's ingress (%s)", what, p, PodID("ns/b"))
		}
		if r, ok := e.Logged(p.PodID, true, p.Fingerprint); !ok || !slices.Equal(r.Direction.Policies, []string{policy}) {
			t.Errorf("%s: fingerprint %q stands for %+v, %v; want the rules of %s", what, p.Fingerprint, r, ok, policy)
		}
	}
	tp.apply(e, rs(tp.pod("b", nil, nil)), "ns/a", "ns/b", "ns/c")

	// b's ingress audited by a deny-all: everything passes, is logged as
	// what audit would deny, and counted so; b is not isolated.
	// An audit alone changes no pod's enforcement: nothing to revoke.
	// A connection conntrack knows as established before the audit (as
	// the fast path's are once handed over, node.go) goes on, unjudged:
	// no false would-deny either way.
	early, earlyServer := tp.pair(a.ns, netip.AddrPortFrom(b.ip, 9002), b, 9002)
	auditDenyAll := rs(withAudit(tp.pod("b", nil, nil), audited()))
	tp.apply(e, auditDenyAll)
	if !passes(early, earlyServer) || !passes(earlyServer, early) {
		t.Error("a → b TCP/9002, established before the audit, stopped when it began")
	}
	tp.expect(probe{"a", "tcp", "b", 80, true}, probe{"c", "tcp", "b", 8080, true}, probe{"a", "tcp6", "b", 80, true})
	logged("a → b TCP/80, audited deny-all", a.ip, 80, "W", "ns/audit")
	if got := append(l.of("W", 6, a.ip, netip.AddrPortFrom(b.ip, 9002)), l.of("W", 6, b.ip, netip.MustParseAddrPort(early.LocalAddr().String()))...); len(got) != 0 {
		t.Errorf("a → b TCP/9002, established before the audit: logged %+v, want no would-deny", got)
	}
	if got := l.waitFor("W", 6, a.ip6, netip.AddrPortFrom(b.ip6, 80)); len(got) == 0 {
		t.Errorf("a → b TCP/80 in IPv6, audited deny-all: logged %+v, want W", got)
	}
	if got := tp.counters(e).Pods["ns/b"]; got.IngressWouldDeny < 3 || got.IngressDenied != 0 || got.IngressAllowed != 0 || got.IngressWouldAllow != 0 {
		t.Errorf("b's counters: %+v, want 3 or more would-deny, nothing else", got)
	}
	if out, err := tp.nft("list", "set", "inet", Table, "isolated"); err != nil || strings.Contains(out, b.iface) {
		t.Errorf("an audited pod is in the set isolated (%v):\n%s", err, out)
	}

	// An audited policy beside an enforcing deny-all: what it would allow
	// (a on TCP/80) is dropped, logged and counted as such; what it would
	// not (c) is an ordinary denial.
	before := tp.counters(e).Pods["ns/b"]
	both := rs(withAudit(tp.pod("b", isolate(), nil), audited(allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 80, 80}))))
	tp.apply(e, both, "ns/b")
	tp.expect(probe{"a", "tcp", "b", 80, false}, probe{"c", "tcp", "b", 80, false})
	logged("a → b TCP/80, enforced deny-all, audited allow", a.ip, 80, "U", "ns/audit")
	for _, p := range l.of("U", 6, a.ip, netip.AddrPortFrom(b.ip, 80)) {
		if r, ok := e.Logged(p.PodID, true, p.EnforcingFingerprint); !ok || !slices.Equal(r.Direction.Policies, []string{"ns/p"}) {
			t.Errorf("a → b TCP/80, U: enforcing fingerprint %q stands for %+v, %v; want the rules of ns/p", p.EnforcingFingerprint, r, ok)
		}
	}
	logged("c → b TCP/80, enforced deny-all, audited allow of a", c.ip, 80, "D", "ns/p")
	got := tp.counters(e).Pods["ns/b"]
	if got.IngressWouldAllow < 1 || got.IngressDenied < 2 || got.IngressWouldDeny != before.IngressWouldDeny {
		t.Errorf("b's counters: %+v, before %+v: want a would-allow, both denied, no new would-deny", got, before)
	}
	// A new agent's rewrite keeps the audit counters.
	e = tp.enforcer()
	tp.apply(e, both, "ns/a", "ns/b", "ns/c")
	if after := tp.counters(e).Pods["ns/b"]; !reflect.DeepEqual(after, got) {
		t.Errorf("b's counters after a rewrite: %+v, before %+v", after, got)
	}

	// Audit to enforce: an ordinary change, the connection it denies ends.
	tp.apply(e, auditDenyAll, "ns/b")
	client, server := tp.pair(a.ns, netip.AddrPortFrom(b.ip, 9000), b, 9000)
	if !passes(client, server) {
		t.Fatal("a → b TCP/9000 does not carry data under an audited deny-all")
	}
	enforced := rs(tp.pod("b", isolate(), nil))
	tp.apply(e, enforced, "ns/b")
	if r := tp.revoke(e, enforced, "ns/b"); r.Ended < 1 {
		t.Errorf("audit to enforce ended %d connections, want it among them", r.Ended)
	}
	if passes(client, server) || passes(server, client) {
		t.Error("a → b TCP/9000 still carries data after its policy went from audit to enforce")
	}

	// Enforce to audit: nothing ends.
	allowA := rs(tp.pod("b", isolate(allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 9001, 9001})), nil))
	tp.apply(e, allowA, "ns/b")
	client, server = tp.pair(a.ns, netip.AddrPortFrom(b.ip, 9001), b, 9001)
	auditAllowA := rs(withAudit(tp.pod("b", nil, nil), audited(allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 9001, 9001}))))
	tp.apply(e, auditAllowA, "ns/b")
	if r := tp.revoke(e, auditAllowA, "ns/b"); r.Ended != 0 {
		t.Errorf("enforce to audit ended %d connections, want none", r.Ended)
	}
	if !passes(client, server) || !passes(server, client) {
		t.Error("a → b TCP/9001 stopped when its policy went from enforce to audit")
	}
	tp.expect(probe{"c", "tcp", "b", 8080, true})

	// The audit goes: so do its chain, sets and counters.
	tp.apply(e, rs(tp.pod("b", nil, nil)))
	if listing := tp.listing(); strings.Contains(listing, "would") || strings.Contains(listing, "chain "+ingress.chain(PodID("ns/b"))) {
		t.Errorf("b's audit objects outlive its audit:\n%s", listing)
	}
}

// Audit without a log group (flow records off, or a kernel that refuses
// the log rules): the audit chains count as they do with one and change
// no verdict, and nothing logs: no log rule, no allow-log chain, no
// connection sets, nothing read in the group.
func TestAuditWithoutLog(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	tp.serve(tp.pods["b"].ns, []int{80, 8080}, nil)
	e := tp.enforcerLogging(0)
	l := tp.readLog(testLogGroup)
	a := tp.pods["a"]
	rs := func(in, au *Direction) Ruleset {
		b := tp.pod("b", in, nil)
		b.AuditIngress = au
		return Ruleset{Pods: []Pod{tp.pod("a", nil, nil), b, tp.pod("c", nil, nil)}}
	}
	tp.apply(e, rs(nil, audited()), "ns/a", "ns/b", "ns/c")
	tp.expect(probe{"a", "tcp", "b", 80, true}, probe{"c", "tcp", "b", 8080, true})
	got := tp.counters(e).Pods["ns/b"]
	if got.IngressWouldDeny < 2 || got.IngressDenied != 0 || got.IngressAllowed != 0 || got.IngressWouldAllow != 0 {
		t.Errorf("b's counters under an audited deny-all: %+v, want 2 or more would-deny, nothing else", got)
	}
	tp.apply(e, rs(isolate(), audited(allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 80, 80}))), "ns/b")
	tp.expect(probe{"a", "tcp", "b", 80, false}, probe{"c", "tcp", "b", 80, false})
	before := got
	got = tp.counters(e).Pods["ns/b"]
	if got.IngressWouldAllow < 1 || got.IngressDenied < 2 || got.IngressWouldDeny != before.IngressWouldDeny {
		t.Errorf("b's counters beside an enforcing deny-all: %+v, before %+v: want a would-allow, both denied, no new would-deny", got, before)
	}
	out, err := tp.nft("list", "table", "inet", Table)
	if err != nil {
		t.Fatalf("nft list table: %v: %s", err, out)
	}
	for _, logging := range []string{"log prefix", "chain al-", "flows-denied"} {
		if strings.Contains(out, logging) {
			t.Errorf("a table without a log group has %q:\n%s", logging, out)
		}
	}
	time.Sleep(200 * time.Millisecond) // a record would have come by now
	if got := l.of("", 0, netip.Addr{}, netip.AddrPort{}); len(got) != 0 {
		t.Errorf("a table without a log group logged %+v", got)
	}
}

// Audited rules that change enough are refilled into the other pair of
// audit sets (changeSets), as enforcing ones are: the lookups of the
// would-deny chain (audit alone) and of the chain beside an enforcing
// policy follow to the new pair, the old one goes, and the verdicts,
// counts and records are the new rules'. Without a log group too, where
// only a refill rewrites the chain's rules.
func TestAuditRefill(t *testing.T) {
	for _, group := range []uint16{testLogGroup, 0} {
		t.Run(fmt.Sprintf("log group %d", group), func(t *testing.T) { auditRefill(t, group) })
	}
}

func auditRefill(t *testing.T, group uint16) {
	tp := newTopo(t, "a", "b", "c")
	tp.serve(tp.pods["b"].ns, []int{80}, nil)
	e := tp.enforcerLogging(group)
	l := tp.readLog(testLogGroup)
	a, b, c := tp.pods["a"], tp.pods["b"], tp.pods["c"]
	sets := auditSets(ingress.chain(PodID("ns/b")))
	// version audits fillers (peers off the topology) and peer on TCP/80.
	version := func(fillers int, peer netip.Addr) *Direction {
		return audited(allow(hosts(fillers, 40), PortRange{TCP, 80, 80}), allow(prefixes(peer.String()+"/32"), PortRange{TCP, 80, 80}))
	}
	v1, v2 := version(0, a.ip), version(100, c.ip)
	rs := func(in, au *Direction) Ruleset {
		b := tp.pod("b", in, nil)
		b.AuditIngress = au
		return Ruleset{Pods: []Pod{tp.pod("a", nil, nil), b, tp.pod("c", nil, nil)}}
	}
	to80 := netip.AddrPortFrom(b.ip, 80)
	// audits probes b's TCP/80 from each pod, which passes if pass, and
	// checks that the audit counter counted only want's packets, and
	// (with a log group) that want alone has a record with verdict.
	audits := func(what string, pass bool, counter func(Counters) uint64, verdict, want string) {
		t.Helper()
		logged := len(l.of(verdict, 6, netip.Addr{}, to80))
		for _, from := range []string{"a", "c"} {
			before := counter(tp.counters(e).Pods["ns/b"])
			tp.expect(probe{from, "tcp", "b", 80, pass})
			if n := counter(tp.counters(e).Pods["ns/b"]) - before; (n > 0) != (from == want) {
				t.Errorf("%s: %s counted %d times, want it counted only for %s", what, from, n, want)
			}
		}
		if group == 0 {
			return
		}
		src := tp.pods[want].ip
		l.waitFor(verdict, 6, src, to80)
		time.Sleep(100 * time.Millisecond)
		got := l.of(verdict, 6, netip.Addr{}, to80)[logged:]
		if len(got) == 0 || slices.ContainsFunc(got, func(p flows.Packet) bool { return p.Src.Addr() != src }) {
			t.Errorf("%s: %s records %+v, want %s's alone", what, verdict, got, want)
		}
	}
	wouldDeny := func(c Counters) uint64 { return c.IngressWouldDeny }
	wouldAllow := func(c Counters) uint64 { return c.IngressWouldAllow }

	// Audited alone: both pass; c, then a, is what the audit would deny.
	tp.apply(e, rs(nil, v1), "ns/a", "ns/b", "ns/c")
	if tp.expectSets(sets, v1) {
		t.Error("the first audited rules are in the second pair of sets")
	}
	audits("v1 audited alone", true, wouldDeny, "W", "c")
	tp.apply(e, rs(nil, v2))
	if !tp.expectSets(sets, v2) {
		t.Error("every audited filler replaced, and the sets are not the second pair")
	}
	audits("v2 audited alone, refilled", true, wouldDeny, "W", "a")

	// Beside an enforcing deny-all, refilled back into the first pair:
	// both drop, and a is what v1 would allow.
	tp.apply(e, rs(isolate(), v2), "ns/b")
	tp.apply(e, rs(isolate(), v1))
	if tp.expectSets(sets, v1) {
		t.Error("every audited filler replaced again, and the sets are not the first pair")
	}
	tp.expectIngressSets("b", isolate())
	audits("v1 beside a deny-all, refilled", false, wouldAllow, "U", "a")
	for _, p := range l.of("U", 6, a.ip, to80) {
		if r, ok := e.Logged(p.PodID, true, p.Fingerprint); !ok || r.Direction != v1 {
			t.Errorf("U of a: fingerprint %s stands for %+v, %v; want v1", p.Fingerprint, r, ok)
		}
	}
}

// Audit beside ClusterNetworkPolicy rules: what an Admin Deny denies is
// no would-allow, even where an audited rule allows it (enforcing that
// rule would change nothing: Admin judges first); what NetworkPolicy's
// default deny denies, and an audited rule allows, is.
func TestAuditBesideAnAdminDeny(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	tp.serve(tp.pods["b"].ns, []int{80}, nil)
	e := tp.enforcer()
	a, c := tp.pods["a"], tp.pods["c"]
	in := isolate()
	in.Admin = []TierRule{tierRule("quarantine-a", Deny, prefixes(a.ip.String()+"/32", a.ip6.String()+"/128"))}
	b := tp.pod("b", in, nil)
	b.AuditIngress = audited(allow(prefixes(a.ip.String()+"/32", c.ip.String()+"/32"), PortRange{TCP, 80, 80}))
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), b, tp.pod("c", nil, nil)}}, "ns/a", "ns/b", "ns/c")

	tp.expect(probe{"a", "tcp", "b", 80, false})
	if got := tp.counters(e).Pods["ns/b"]; got.IngressDenied == 0 || got.IngressWouldAllow != 0 {
		t.Errorf("after a → b TCP/80, which the Admin deny denies: counters %+v, want denied and no would-allow", got)
	}
	tp.expect(probe{"c", "tcp", "b", 80, false})
	if got := tp.counters(e).Pods["ns/b"]; got.IngressWouldAllow == 0 {
		t.Errorf("after c → b TCP/80, which the default deny denies and the audited rule allows: counters %+v, want a would-allow", got)
	}
}
