//go:build privileged

package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
	"sigs.k8s.io/knftables"
)

func TestEnforce(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	for _, p := range tp.pods {
		tp.serve(p.ns, []int{80, 8080, 8500}, []int{53})
	}
	tp.serve(tp.nodeNS, []int{9000, 9001}, nil)
	e := tp.enforcer()
	a, b := tp.pods["a"], tp.pods["b"]

	// Nobody isolated: everything works.
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", nil, nil), tp.pod("c", nil, nil)}}, "ns/a", "ns/b", "ns/c")
	tp.expect(
		probe{"a", "tcp", "b", 80, true},
		probe{"a", "udp", "b", 53, true},
		probe{"c", "tcp", "a", 8080, true},
		probe{"a", "tcp", "node", 9000, true},
	)

	// b denies all ingress; the node (kubelet probes) still gets through.
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", isolate(), nil), tp.pod("c", nil, nil)}}, "ns/b")
	tp.expect(
		probe{"a", "tcp", "b", 80, false},
		probe{"c", "udp", "b", 53, false},
		probe{"node", "tcp", "b", 80, true},
		probe{"b", "tcp", "a", 80, true},
		probe{"a", "tcp", "c", 80, true},
	)
	if c := tp.counters(e).Pods["ns/b"]; c.IngressDenied < 2 || c.IngressAllowed != 0 || c.EgressDenied != 0 {
		t.Errorf("counters of b after deny-all: %+v", c)
	}

	// b allows a on TCP 80 only.
	bIn := isolate(allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 80, 80}))
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", bIn, nil), tp.pod("c", nil, nil)}}, "ns/b")
	before := tp.counters(e).Pods["ns/b"]
	tp.expect(
		probe{"a", "tcp", "b", 80, true},
		probe{"a", "tcp", "b", 8080, false},
		probe{"c", "tcp", "b", 80, false},
		probe{"a", "udp", "b", 53, false},
	)
	if c := tp.counters(e).Pods["ns/b"]; c.IngressAllowed != before.IngressAllowed+1 || c.IngressDenied < before.IngressDenied+3 {
		t.Errorf("counters of b: %+v, before %+v: want one more allowed, three more denied", c, before)
	}

	// a may only reach c on UDP 53 and the node on TCP 9000.
	aEg := isolate(
		allow(prefixes("10.99.0.3/32"), PortRange{UDP, 53, 53}),
		allow(prefixes(nodeAddr.String()+"/32"), PortRange{TCP, 9000, 9000}),
	)
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, aEg), tp.pod("b", bIn, nil), tp.pod("c", nil, nil)}}, "ns/a")
	tp.expect(
		probe{"a", "udp", "c", 53, true},
		probe{"a", "tcp", "c", 80, false},
		probe{"a", "tcp", "node", 9000, true},
		probe{"a", "tcp", "node", 9001, false},
		probe{"a", "tcp", "b", 80, false}, // b's ingress allows it, a's egress does not
		probe{"b", "tcp", "a", 80, true},  // a's ingress is not isolated
	)
	if c := tp.counters(e).Pods["ns/a"]; c.EgressAllowed < 2 || c.EgressDenied < 3 || c.IngressAllowed+c.IngressDenied != 0 {
		t.Errorf("counters of a: %+v", c)
	}

	// c: 10.99.0.0/24 except b on TCP 8000-8100, a alone on 8050-9000
	// (overlapping), b on UDP 50-60. a's egress is lifted.
	cIn := isolate(
		allow(prefixes("10.99.0.0/31", "10.99.0.3/32", "10.99.0.4/30", "10.99.0.8/29", "10.99.0.16/28", "10.99.0.32/27", "10.99.0.64/26", "10.99.0.128/25"), PortRange{TCP, 8000, 8100}),
		allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 8050, 9000}),
		allow(prefixes(b.ip.String()+"/32"), PortRange{UDP, 50, 60}),
	)
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", bIn, nil), tp.pod("c", cIn, nil)}}, "ns/a", "ns/c")
	tp.expect(
		probe{"a", "tcp", "c", 8080, true},
		probe{"a", "tcp", "c", 8500, true},
		probe{"a", "tcp", "c", 80, false},
		probe{"b", "tcp", "c", 8080, false},
		probe{"b", "tcp", "c", 8500, false},
		probe{"b", "udp", "c", 53, true},
		probe{"a", "udp", "c", 53, false},
		probe{"a", "tcp", "b", 80, true},
	)

	// Removing the table lifts every policy.
	tp.in(tp.nodeNS, e.Remove)
	if out, err := tp.nft("list", "table", "inet", Table); err == nil {
		t.Fatalf("table still there after Remove:\n%s", out)
	}
	tp.expect(probe{"c", "tcp", "b", 8080, true}, probe{"b", "tcp", "c", 80, true})
}

// A change of a pod's rules leaves the kernel's sets holding exactly the
// new elements, whether written in place or to a fresh pair of sets: also
// where an element that leaves overlaps one that comes (a CIDR by a wider
// one, a port range by one that overlaps it), which nft rejects while
// both are in a set. Connections follow, and a rewrite (a drift repair, a
// restarted agent) leaves the same elements.
func TestChangeKeepsSetsExact(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	tp.serve(tp.pods["b"].ns, []int{80, 8080, 8150}, nil)
	e := tp.enforcer()
	rs := func(in *Direction) Ruleset {
		return Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", in, nil), tp.pod("c", nil, nil)}}
	}
	// b's ingress: fillers (peers off the topology) on TCP 80, a on a
	// port range, and c, or b and c, on every port.
	version := func(fillers int, a, all string, first, last uint16) *Direction {
		return isolate(
			allow(hosts(fillers, 40), PortRange{TCP, 80, 80}),
			allow(prefixes(a), PortRange{TCP, first, last}),
			allow(prefixes(all)),
		)
	}
	v1 := version(0, "10.99.0.1/32", "10.99.0.3/32", 8000, 8100)
	v2 := version(0, "10.99.0.0/31", "10.99.0.2/31", 8050, 8200)
	v3 := version(100, "10.99.0.1/32", "10.99.0.3/32", 8000, 8100)
	v4 := version(100, "10.99.0.0/31", "10.99.0.2/31", 8050, 8200)
	inV1 := []probe{{"a", "tcp", "b", 8080, true}, {"a", "tcp", "b", 8150, false}, {"a", "tcp", "b", 80, false}, {"c", "tcp", "b", 80, true}}
	inV2 := []probe{{"a", "tcp", "b", 8080, true}, {"a", "tcp", "b", 8150, true}, {"a", "tcp", "b", 80, false}, {"c", "tcp", "b", 8150, true}}

	tp.apply(e, rs(v1), "ns/a", "ns/b", "ns/c")
	tp.expectIngressSets("b", v1)
	tp.expect(inV1...)
	for _, step := range []struct {
		name   string
		in     *Direction
		second bool // the sets are the second pair: refilled from the first, or changed in place there
		probes []probe
	}{
		{"overlapping elements swapped in place", v2, false, inV2},
		{"and back", v1, false, inV1},
		{"every filler replaced", v3, true, inV1},
		{"overlapping elements swapped in the second pair", v4, true, inV2},
		{"and back", v3, true, inV1},
		{"back to v1, every filler replaced", v1, false, inV1},
	} {
		tp.apply(e, rs(step.in), "ns/b")
		if second := tp.expectIngressSets("b", step.in); second != step.second {
			t.Errorf("%s: the sets are the second pair: %v, want %v", step.name, second, step.second)
		}
		tp.expect(step.probes...)
	}

	// In the second pair, a drift repair and a new agent's takeover.
	tp.apply(e, rs(v3), "ns/b")
	if out, err := tp.nft("add", "table", "ip", "onc-test-other"); err != nil {
		t.Fatalf("another program's commit: %v: %s", err, out)
	}
	tp.in(tp.nodeNS, func() error { _, err := e.Apply(rs(v3), true); return err })
	tp.expectIngressSets("b", v3)
	tp.apply(tp.enforcer(), rs(v3), "ns/a", "ns/b", "ns/c")
	tp.expectIngressSets("b", v3)
	tp.expect(inV1...)
}

// A resync rewrites the table only if it may have drifted from what the
// Enforcer last wrote: with nothing committed to nftables since, it
// commits nothing; after any other commit (a rule deleted by hand, another
// program's table) it rewrites, and a deleted rule is back.
func TestResyncRewritesOnlyADriftedTable(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	for _, p := range tp.pods {
		tp.serve(p.ns, []int{80}, nil)
	}
	e := tp.enforcer()
	rs := Ruleset{Pods: []Pod{tp.pod("a", nil, nil),
		tp.pod("b", isolate(allow(prefixes(tp.pods["a"].ip.String()+"/32"), PortRange{TCP, 80, 80})), nil),
		tp.pod("c", nil, nil)}}
	tp.apply(e, rs, "ns/a", "ns/b", "ns/c")
	want := tp.listing()

	// resync runs one and reports whether it committed a transaction.
	resync := func() (committed bool) {
		t.Helper()
		tp.in(tp.nodeNS, func() error {
			before, err := RulesetGeneration()
			if err != nil {
				return err
			}
			changed, err := e.Apply(rs, true)
			if err != nil {
				return err
			}
			if len(changed) != 0 {
				t.Errorf("a resync of the same rules changed %v", changed)
			}
			after, err := RulesetGeneration()
			committed = after != before
			return err
		})
		return committed
	}
	commitElsewhere := func(table string) {
		t.Helper()
		if out, err := tp.nft("add", "table", "ip", table); err != nil {
			t.Fatalf("another program's commit: %v: %s", err, out)
		}
	}
	// deleteDrop deletes b's ingress drop rule by hand: c gets in.
	deleteDrop := func() {
		t.Helper()
		chain := ingress.chain(PodID("ns/b"))
		out, err := tp.nft("-a", "list", "chain", "inet", Table, chain)
		m := regexp.MustCompile(`drop # handle (\d+)`).FindStringSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("chain %s: no drop rule (%v):\n%s", chain, err, out)
		}
		if out, err := tp.nft("delete", "rule", "inet", Table, chain, "handle", m[1]); err != nil {
			t.Fatalf("delete the drop rule: %v: %s", err, out)
		}
		tp.expect(probe{"c", "tcp", "b", 80, true})
	}
	repaired := func(when string) {
		t.Helper()
		if !resync() {
			t.Fatalf("%s: the resync committed nothing", when)
		}
		tp.expect(probe{"c", "tcp", "b", 80, false}, probe{"a", "tcp", "b", 80, true})
		if got := tp.listing(); got != want {
			t.Errorf("%s: the table after the resync:\n%s\nwant:\n%s", when, got, want)
		}
	}

	if resync() {
		t.Error("nothing committed since the last Apply: the resync rewrote the table")
	}
	deleteDrop()
	repaired("a rule deleted by hand")
	if resync() {
		t.Error("nothing committed since the repair: the resync rewrote the table")
	}

	// A hand edit, then a change the watcher applies: the resync after
	// still finds the edit.
	deleteDrop()
	tp.apply(e, Ruleset{Pods: []Pod{rs.Pods[0], rs.Pods[1], tp.pod("c", nil, isolate())}}, "ns/c")
	tp.apply(e, rs, "ns/c")
	repaired("a rule deleted by hand, then a change")

	commitElsewhere("onc-test-other")
	if !resync() {
		t.Error("another program committed: the resync did not rewrite")
	}
	if got := tp.listing(); got != want {
		t.Errorf("after another program's commit, the table:\n%s\nwant:\n%s", got, want)
	}
	if resync() {
		t.Error("nothing committed since that rewrite: the resync rewrote the table")
	}
}

func TestRevoke(t *testing.T) {
	tp := newTopo(t, "a", "b", "c", "d")
	tp.serve(tp.pods["b"].ns, []int{8080}, nil)
	e := tp.enforcer()
	a, b, c, d := tp.pods["a"], tp.pods["b"], tp.pods["c"], tp.pods["d"]
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", nil, nil), tp.pod("c", nil, nil), tp.pod("d", nil, nil)}}, "ns/a", "ns/b", "ns/c", "ns/d")

	// A Service address DNATed to b:80: conntrack's original tuple names
	// the Service, the reply tuple b.
	svc := netip.MustParseAddrPort("10.96.0.10:8000")
	if out, err := tp.nft("add table ip svc; add chain ip svc pre { type nat hook prerouting priority dstnat; }; add rule ip svc pre ip daddr 10.96.0.10 tcp dport 8000 dnat to 10.99.0.2:80"); err != nil {
		t.Fatalf("nft: %v: %s", err, out)
	}

	abClient, abServer := tp.pair(a.ns, netip.AddrPortFrom(b.ip, 80), b, 80)
	asClient, asServer := tp.pair(a.ns, svc, b, 80)
	acClient, acServer := tp.pair(a.ns, netip.AddrPortFrom(c.ip, 80), c, 80)
	nb := tp.dial(tp.nodeNS, netip.AddrPortFrom(b.ip, 8080))
	if nb == nil || !echoes(nb) || !passes(abClient, abServer) || !passes(asClient, asServer) || !passes(acClient, acServer) {
		t.Fatal("connections do not work before any policy")
	}

	// Still allowed: nothing ends.
	rs := Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", isolate(allow(prefixes("10.99.0.1/32"), PortRange{TCP, 80, 80})), nil), tp.pod("c", nil, nil), tp.pod("d", nil, nil)}}
	tp.apply(e, rs, "ns/b")
	r := tp.revoke(e, rs, "ns/b")
	if r.Ended != 0 || !passes(abClient, abServer) || !passes(abServer, abClient) || !passes(asClient, asServer) {
		t.Fatalf("revoke after a change that still allows a->b ended %d connections", r.Ended)
	}
	// The flow cache keeps what is still allowed, the Service's included
	// (it caches b's end, after DNAT); the node's connection is not
	// policed, so it stays too.
	if !keeps(r, abClient, abServer) || !keeps(r, asClient, asServer) ||
		!r.Keeps(netip.AddrPortFrom(b.ip, 8080), netip.MustParseAddrPort(nb.LocalAddr().String()), TCP) {
		t.Error("revoke does not let the flow cache keep connections still allowed")
	}

	// Denied: a's connection ends, whichever end talks first; the node's
	// stays.
	rs = Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", isolate(allow(prefixes("10.99.0.1/32"), PortRange{TCP, 81, 81})), nil), tp.pod("c", nil, nil), tp.pod("d", nil, nil)}}
	tp.apply(e, rs, "ns/b")
	r = tp.revoke(e, rs, "ns/b")
	if r.Ended != 2 {
		t.Errorf("revoke ended %d connections, want 2 (a->b, a->svc->b)", r.Ended)
	}
	if keeps(r, abClient, abServer) || keeps(r, asClient, asServer) {
		t.Error("revoke lets the flow cache keep connections it ended")
	}
	if passes(abServer, abClient) || passes(abClient, abServer) {
		t.Error("a->b still carries data after revoke")
	}
	if passes(asServer, asClient) || passes(asClient, asServer) {
		t.Error("a->svc->b still carries data after revoke")
	}
	if !echoes(nb) || !passes(acClient, acServer) {
		t.Error("revoke broke node->b or a->c")
	}

	// a leaves the ruleset while c stops allowing it: found by the IP a had.
	rs = Ruleset{Pods: []Pod{tp.pod("b", rs.Pods[1].Ingress, nil), tp.pod("c", isolate(allow(prefixes("10.99.0.1/32"), PortRange{TCP, 81, 81})), nil), tp.pod("d", nil, nil)}}
	tp.apply(e, rs, "ns/a", "ns/c")
	if n := tp.revoke(e, rs, "ns/a").Ended; n != 1 {
		t.Errorf("revoke of the removed pod a ended %d connections, want 1 (a->c)", n)
	}
	if passes(acServer, acClient) || passes(acClient, acServer) {
		t.Error("a->c still carries data after revoke")
	}
	if n := tp.revoke(e, rs, "ns/a").Ended; n != 0 {
		t.Errorf("second revoke of the removed pod a ended %d connections", n)
	}

	// Between pods not isolated, conntrack may still pick a stream up from
	// either end.
	adClient, adServer := tp.pair(a.ns, netip.AddrPortFrom(d.ip, 80), d, 80)
	run(t, "ip", "netns", "exec", tp.node, "conntrack", "-D", "-s", a.ip.String(), "-d", d.ip.String())
	if !passes(adServer, adClient) || !passes(adClient, adServer) {
		t.Error("a->d does not survive losing its conntrack entry")
	}
}

func TestRestart(t *testing.T) {
	tp := newTopo(t, "a", "b", "x")
	tp.serve(tp.pods["a"].ns, []int{80}, nil)
	tp.serve(tp.pods["b"].ns, []int{80}, nil)
	e := tp.enforcer()
	aIn := isolate(allow(prefixes("10.99.0.2/32"), PortRange{TCP, 80, 80}))
	rs := Ruleset{Pods: []Pod{tp.pod("a", aIn, nil), tp.pod("b", isolate(), isolate()), tp.pod("x", isolate(), nil)}}
	tp.apply(e, rs, "ns/a", "ns/b", "ns/x")
	tp.expect(probe{"a", "tcp", "b", 80, false}, probe{"b", "tcp", "a", 80, false}, probe{"x", "tcp", "a", 80, false})
	rs.Pods[1].Egress = nil
	tp.apply(e, rs, "ns/b")
	tp.expect(probe{"b", "tcp", "a", 80, true})
	before, counted := tp.listing(), tp.counters(e)

	// A new agent takes over the same table: same rules, same counters.
	e2 := tp.enforcer()
	tp.apply(e2, rs, "ns/a", "ns/b", "ns/x")
	if after := tp.listing(); after != before {
		t.Fatalf("table differs after restart:\n%s\nbefore:\n%s", after, before)
	}
	if c := tp.counters(e2); !reflect.DeepEqual(c, counted) {
		t.Fatalf("counters after restart %+v, before %+v", c, counted)
	}
	// b's egress counters outlived its egress isolation.
	if c := counted.Pods["ns/b"]; c.EgressDenied == 0 || c.IngressDenied == 0 {
		t.Errorf("counters of b: %+v", c)
	}
	tp.expect(probe{"a", "tcp", "b", 80, false}, probe{"b", "tcp", "a", 80, true})

	// Another takes over without x: x's objects go, the rest stays as a
	// fresh table would have it, with its counters.
	rs.Pods = rs.Pods[:2]
	e3 := tp.enforcer()
	tp.apply(e3, rs, "ns/a", "ns/b")
	got := tp.listing()
	if strings.Contains(got, PodID("ns/x")) || strings.Contains(got, tp.pods["x"].iface) {
		t.Errorf("x is still in the table:\n%s", got)
	}
	if c := tp.counters(e3); c.Pods["ns/b"].IngressDenied < counted.Pods["ns/b"].IngressDenied || len(c.Pods) != 2 {
		t.Errorf("counters after takeover without x: %+v, before %+v", c, counted)
	}
	tp.in(tp.nodeNS, e3.Remove)
	tp.apply(tp.enforcer(), rs, "ns/a", "ns/b")
	if fresh := tp.listing(); fresh != got {
		t.Errorf("taken-over table:\n%s\ndiffers from a fresh one:\n%s", got, fresh)
	}
}

// secondPair matches the names of a direction's second pair of sets.
var secondPair = regexp.MustCompile(`-(ports6?|all6?|other6?)-b\b`)

// normalized is the table as nft -j lists it, minus handles and counter
// values, with the second pair of sets named as the first (a fresh table
// has only those), in a canonical order (rules keep their order within a
// chain).
func normalized(t *testing.T, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "-j", "list", "table", "inet", Table).CombinedOutput()
	if err != nil {
		t.Fatalf("nft list: %v: %s", err, out)
	}
	out = secondPair.ReplaceAll(out, []byte("-$1"))
	var doc struct {
		Nftables []map[string]map[string]any `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		t.Fatal(err)
	}
	var lines []string
	rules := map[any]int{}
	for _, entry := range doc.Nftables {
		for typ, obj := range entry {
			if typ == "metainfo" {
				continue
			}
			delete(obj, "handle")
			if typ == "counter" {
				obj["packets"], obj["bytes"] = 0, 0
			}
			if elems, ok := obj["elem"].([]any); ok {
				slices.SortFunc(elems, func(a, b any) int { return strings.Compare(jsonString(a), jsonString(b)) })
			}
			prefix := typ
			if typ == "rule" {
				prefix = fmt.Sprintf("rule %v %03d", obj["chain"], rules[obj["chain"]])
				rules[obj["chain"]]++
			}
			lines = append(lines, prefix+" "+jsonString(obj))
		}
	}
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

func jsonString(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestIncremental checks that a run of Applies, each changing some pods,
// leaves the table exactly as one Apply of the last Ruleset on a fresh
// table would, log rules and their fingerprints included, and reports the
// right pods changed.
func TestIncremental(t *testing.T) {
	privileged(t)
	pre := testutil.Prefix()
	inc, ref := pre+"-inc", pre+"-ref"
	incNS, refNS := openNS(t, testutil.Netns(t, inc)), openNS(t, testutil.Netns(t, ref))
	tp := &topo{t: t}
	var e *Enforcer
	start := func() {
		tp.in(incNS, func() (err error) { e, err = NewEnforcer(testLogGroup); return err })
	}
	start()

	r := rand.New(rand.NewPCG(5, 6))
	keys := []string{"ns/k0", "ns/k1", "ns/k2", "ns/k3", "ns/k4", "ns/k5"}
	ifaces := []string{"veth0", "veth1", "veth2", "veth3", "veth4", "veth5", "veth6", "veth7"}
	randDir := func(old *Direction) *Direction {
		switch r.IntN(5) {
		case 0:
			return nil
		case 1, 2:
			return old
		case 3:
			// Another policy isolating it, with no rules: the same sets,
			// other log prefixes (and nothing for Revoke).
			if old != nil {
				return &Direction{Policies: append(slices.Clone(old.Policies), fmt.Sprintf("ns/p%d", r.IntN(100))), Rules: old.Rules}
			}
		}
		d := isolate()
		for range r.IntN(4) {
			d.Rules = append(d.Rules, randRule(r))
		}
		return d
	}
	var prev Ruleset
	for step := range 40 {
		var rs Ruleset
		used := map[string]bool{}
		for i, key := range keys {
			if r.IntN(10) < 3 {
				continue
			}
			v4 := netip.AddrFrom4([4]byte{10, 0, 0, byte(i)})
			v6 := netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(i)})
			p := Pod{Key: key, IPs: []netip.Addr{v4}}
			if old := prev.Pod(key); old != nil {
				p = *old
				p.IPs = slices.Clone(old.IPs)
			}
			// Addresses change, and so do families: IPv4, IPv6, both.
			switch r.IntN(8) {
			case 0:
				p.IPs[0] = p.IPs[0].Next()
			case 1:
				p.IPs = [][]netip.Addr{{v4}, {v6}, {v4, v6}}[r.IntN(3)]
			}
			if p.Iface == "" || used[p.Iface] || r.IntN(8) == 0 {
				free := slices.DeleteFunc(slices.Clone(ifaces), func(s string) bool { return used[s] })
				p.Iface = free[r.IntN(len(free))]
			}
			used[p.Iface] = true
			p.Ingress, p.Egress = randDir(p.Ingress), randDir(p.Egress)
			p.AuditIngress, p.AuditEgress = randDir(p.AuditIngress), randDir(p.AuditEgress)
			rs.Pods = append(rs.Pods, p)
		}
		// Pods removed, added, or differing in what they enforce: a
		// change of audited policies alone is none (audit never revokes),
		// though the table must follow it all the same.
		var want []string
		for _, key := range keys {
			o, n := prev.Pod(key), rs.Pod(key)
			switch {
			case o == nil && n == nil:
			case o == nil || n == nil || o.Iface != n.Iface || !slices.Equal(o.IPs, n.IPs) ||
				!sameCompiled(o.Ingress, n.Ingress) || !sameCompiled(o.Egress, n.Egress):
				want = append(want, key)
			}
		}
		if step%7 == 6 {
			start() // a restarted agent rebuilds the table it finds
			want = nil
			for _, p := range rs.Pods {
				want = append(want, p.Key)
			}
		}
		// Now and then the table drifts, and a rebuild repairs it.
		rebuild := step%5 == 4
		if rebuild {
			run(t, "ip", "netns", "exec", inc, "nft", "flush", "table", "inet", Table)
		}
		var changed []string
		tp.in(incNS, func() (err error) { changed, err = e.Apply(rs, rebuild); return err })
		if fmt.Sprint(changed) != fmt.Sprint(want) {
			t.Fatalf("step %d: Apply changed %v, want %v", step, changed, want)
		}
		tp.sameAsFresh(step, rs, inc, ref, refNS)
		prev = rs
	}

	// A bad Ruleset changes nothing.
	bad := Ruleset{Pods: slices.Clone(prev.Pods)}
	bad.Pods = append(bad.Pods, Pod{Key: "ns/zz", Iface: prev.Pods[0].Iface})
	before := normalized(t, inc)
	tp.in(incNS, func() error {
		if _, err := e.Apply(bad, false); err == nil {
			return fmt.Errorf("Apply accepted two pods with interface %s", prev.Pods[0].Iface)
		}
		return nil
	})
	if after := normalized(t, inc); after != before {
		t.Fatalf("a rejected Apply changed the table")
	}
}

func sameCompiled(a, b *Direction) bool {
	if a == nil || b == nil {
		return a == b
	}
	return reflect.DeepEqual(compile(a), compile(b))
}

// TestSpoofedSourceIsDropped: a pod sending with another pod's address
// (it has CAP_NET_RAW, or just adds the address) must not pass for that
// peer, in either family, whether the receiver is isolated or not. One-way
// UDP shows it: the reply would go to the real owner.
func TestSpoofedSourceIsDropped(t *testing.T) {
	for _, family := range []struct {
		name string
		addr func(*tpod) netip.Addr
	}{
		{"IPv4", func(p *tpod) netip.Addr { return p.ip }},
		{"IPv6", func(p *tpod) netip.Addr { return p.ip6 }},
	} {
		t.Run(family.name, func(t *testing.T) {
			tp := newTopo(t, "a", "b", "c")
			a, b, c := tp.pods["a"], tp.pods["b"], tp.pods["c"]
			var pc net.PacketConn
			tp.in(b.ns, func() (err error) {
				pc, err = net.ListenPacket("udp", ":5353")
				return err
			})
			defer pc.Close()
			// received reports whether b gets a datagram from ns sent from src.
			received := func(ns netns.Handle, src netip.Addr) bool {
				var conn net.Conn
				tp.in(ns, func() (err error) {
					d := net.Dialer{LocalAddr: &net.UDPAddr{IP: src.AsSlice()}}
					conn, err = d.Dial("udp", netip.AddrPortFrom(family.addr(b), 5353).String())
					return err
				})
				defer conn.Close()
				return testutil.Delivered(t, conn, pc, fmt.Sprintf("from %s via %s", src, conn.LocalAddr()))
			}
			// c also holds a's address, as a pod that added it to its eth0 would.
			aAddr := netip.PrefixFrom(family.addr(a), family.addr(a).BitLen())
			run(t, "ip", "-n", c.netns, "addr", "add", aAddr.String(), "dev", "eth0", "nodad")

			e := tp.enforcer()
			bIn := isolate(allow([]netip.Prefix{aAddr}, PortRange{UDP, 5353, 5353}))
			for i, rs := range []Ruleset{
				{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", nil, nil), tp.pod("c", nil, nil)}}, // nobody isolated
				{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", bIn, nil), tp.pod("c", nil, nil)}}, // b allows only a
			} {
				tp.apply(e, rs, [][]string{{"ns/a", "ns/b", "ns/c"}, {"ns/b"}}[i]...)
				if !received(a.ns, family.addr(a)) {
					t.Fatalf("b does not get a's own datagram (b %s)", rs.Pod("ns/b").Ingress)
				}
				if received(c.ns, family.addr(a)) {
					t.Fatalf("b got a datagram c sent with a's address (b %s)", rs.Pod("ns/b").Ingress)
				}
				if isolated := rs.Pod("ns/b").Ingress != nil; isolated == received(c.ns, family.addr(c)) {
					t.Fatalf("c's own datagram: received=%v with b isolated=%v", !isolated, isolated)
				}
			}
		})
	}
}

// IPv6 is policed from the same rules as IPv4: a pod's IPv6 peers and
// ports, in both directions; neighbour discovery with its gateway
// whatever its egress policy; nothing in IPv6 from or to a pod the
// ruleset gives no IPv6 address; and revocation of an IPv6 connection a
// change denies.
func TestIPv6(t *testing.T) {
	tp := newTopo(t, "a", "b", "c")
	for _, p := range tp.pods {
		tp.serve(p.ns, []int{80, 8080}, []int{53})
	}
	a, b := tp.pods["a"], tp.pods["b"]
	a6, b6 := prefixes(a.ip6.String()+"/128"), prefixes(b.ip6.String()+"/128")
	e := tp.enforcer()
	// b lets in only a, over IPv6, on port 80; a may reach only that.
	bIn := isolate(allow(a6, PortRange{TCP, 80, 80}))
	aEg := isolate(allow(b6, PortRange{TCP, 80, 80}))
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, aEg), tp.pod("b", bIn, nil), tp.pod("c", nil, nil)}}, "ns/a", "ns/b", "ns/c")
	// a has to solicit its gateway again, past its egress policy.
	run(t, "ip", "-n", a.netns, "neigh", "flush", "dev", "eth0")
	tp.expect(
		probe{"a", "tcp6", "b", 80, true},
		probe{"a", "tcp", "b", 80, false}, // IPv4: a's egress allows only b's IPv6 address
		probe{"a", "tcp6", "b", 8080, false},
		probe{"c", "tcp6", "b", 80, false},
		probe{"a", "tcp6", "c", 80, false},
		probe{"a", "udp6", "c", 53, false},
		probe{"c", "tcp6", "a", 80, true}, // a's ingress is open
		probe{"c", "udp6", "a", 53, true},
	)

	// c without an IPv6 address in the ruleset (an IPv4 pod that made one
	// up): its IPv6 goes nowhere, its IPv4 as before.
	c4 := tp.pod("c", nil, nil)
	c4.IPs = c4.IPs[:1]
	tp.apply(e, Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", nil, nil), c4}}, "ns/a", "ns/b", "ns/c")
	tp.expect(
		probe{"c", "tcp6", "a", 80, false},
		probe{"c", "udp6", "a", 53, false},
		probe{"b", "tcp6", "c", 80, false}, // c's answers are dropped
		probe{"c", "tcp", "a", 80, true},
		probe{"b", "tcp6", "a", 80, true},
	)

	// A change that denies an open IPv6 connection ends it.
	allowed := Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", isolate(allow(a6, PortRange{TCP, 9000, 9000})), nil), tp.pod("c", nil, nil)}}
	tp.apply(e, allowed, "ns/b", "ns/c")
	client, server := tp.pair(a.ns, netip.AddrPortFrom(b.ip6, 9000), b, 9000)
	if !passes(client, server) {
		t.Fatal("the allowed IPv6 connection does not carry data")
	}
	denied := Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", isolate(allow(prefixes(a.ip.String()+"/32"), PortRange{TCP, 9000, 9000})), nil), tp.pod("c", nil, nil)}}
	tp.apply(e, denied, "ns/b")
	if r := tp.revoke(e, denied, "ns/b"); r.Ended < 1 {
		t.Errorf("Revoke ended %d connections, want the IPv6 one among them", r.Ended)
	}
	if passes(client, server) || passes(server, client) {
		t.Fatal("the IPv6 connection the change denies still carries data")
	}
}

// An agent upgraded from a version before IPv6 finds the table that
// version wrote, family ip, enforcing the old rules: the first Apply
// deletes it, once the inet table enforces.
func TestUpgradeRetiresTheIPv4Table(t *testing.T) {
	tp := newTopo(t, "a", "b")
	tp.serve(tp.pods["b"].ns, []int{80}, nil)
	if out, err := tp.nft("add table ip " + Table + "; add chain ip " + Table + " forward { type filter hook forward priority filter; }; add rule ip " + Table + " forward tcp dport 80 drop"); err != nil {
		t.Fatalf("the old table: %v: %s", err, out)
	}
	tp.expect(probe{"a", "tcp", "b", 80, false})
	tp.apply(tp.enforcer(), Ruleset{Pods: []Pod{tp.pod("a", nil, nil), tp.pod("b", nil, nil)}}, "ns/a", "ns/b")
	if out, err := tp.nft("list", "table", "ip", Table); err == nil {
		t.Fatalf("the old table is still there:\n%s", out)
	}
	tp.expect(probe{"a", "tcp", "b", 80, true})
}

// Remove deletes the table, and with it all enforcement and counters (what
// an uninstall does by hand, docs/install.md).
func (e *Enforcer) Remove() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	tx := e.nft.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := e.nft.Run(ctx, tx); err != nil && !knftables.IsNotFound(err) {
		return fmt.Errorf("delete table %s: %w", Table, err)
	}
	for key, a := range e.pods {
		e.gone[key] = a.addrs
	}
	e.pods = map[string]applied{}
	e.synced = false
	return nil
}
