package policy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/fastpath"
)

// lookup is the verdict of a pod chain on el, as nft reaches it: the
// ports set by peer, protocol and port, the all set by peer, and for a
// packet of any protocol but TCP, UDP and SCTP the other set by peer.
func (el elements) lookup(ip netip.Addr, proto Proto, port uint16) bool {
	if el.allows(ip, proto, port) {
		return true
	}
	return !slices.Contains(portProtos, proto) && containsAddr(el.other, ip)
}

// checkTierElements fails when two elements of a set overlap, as nft
// would, and, for a direction with tiers, when an element of ports or
// other repeats what all holds (compile, without tiers, leaves those).
func checkTierElements(t *testing.T, name string, el elements, tiered bool) {
	t.Helper()
	checkDisjoint(t, name, el)
	checkDisjoint(t, name+" (other)", elements{all: el.other})
	if !tiered {
		return
	}
	for _, p := range el.other {
		if slices.ContainsFunc(el.all, p.Overlaps) {
			t.Errorf("%s: other-set element %v overlaps the all set", name, p)
		}
	}
	for _, e := range el.ports {
		if slices.ContainsFunc(el.all, e.peer.Overlaps) {
			t.Errorf("%s: ports-set element %v overlaps the all set", name, e.key())
		}
	}
}

func randTierRule(r *rand.Rand, i int) TierRule {
	rule := randRule(r)
	return TierRule{Policy: fmt.Sprintf("cnp%d", i), Index: i, Action: []Action{Accept, Deny, Pass}[r.IntN(3)], Peers: rule.Peers, Ports: rule.Ports}
}

// randTiered is a direction with random tiers: overlapping prefixes of
// both families, ports and ranges of the three protocols or none, every
// action, and either NetworkPolicy rules or none isolating (ClusterOnly).
// Baseline rules come with NetworkPolicy ones too: they must not count.
func randTiered(r *rand.Rand) *Direction {
	d := &Direction{ClusterOnly: r.IntN(2) == 0}
	for i := range r.IntN(5) {
		d.Admin = append(d.Admin, randTierRule(r, i))
	}
	for i := range r.IntN(5) {
		d.Baseline = append(d.Baseline, randTierRule(r, i))
	}
	if !d.ClusterOnly {
		d.Policies = []string{"ns/p"}
		for range r.IntN(4) {
			d.Rules = append(d.Rules, randRule(r))
		}
	}
	return d
}

// flat is d's rules, tiers' too, as NetworkPolicy rules: where to sample.
func flat(d *Direction) *Direction {
	out := &Direction{Rules: slices.Clone(d.Rules)}
	for _, r := range slices.Concat(d.Admin, d.Baseline) {
		out.Rules = append(out.Rules, Rule{Peers: r.Peers, Ports: r.Ports})
	}
	return out
}

func checkTiersEquivalent(t *testing.T, name string, r *rand.Rand, d *Direction) elements {
	t.Helper()
	el := compileDirection(d)
	checkTierElements(t, name, el, d.Tiered() || d.ClusterOnly)
	ports := samplePorts(r, flat(d))
	for _, ip := range sampleAddrs(r, flat(d)) {
		if !ip.IsValid() { // before 0.0.0.0: no packet has it
			continue
		}
		for _, proto := range []Proto{TCP, UDP, SCTP, 1, 58} {
			ports := ports
			if proto == 1 || proto == 58 {
				ports = ports[:3] // no port to match: a few will do
			}
			for _, port := range ports {
				if want, got := d.Allows(ip, proto, port), el.lookup(ip, proto, port); want != got {
					t.Fatalf("%s: %v %v/%d: Judge says %v, sets say %v\nrules: %v\nall: %v\nports: %v\nother: %v",
						name, ip, proto, port, want, got, d, el.all, el.ports, el.other)
				}
			}
		}
	}
	return el
}

// The compiled sets of a direction with tiers allow exactly what Judge
// allows, on random tiers at many random and boundary points.
func TestCompileTiersEquivalentRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	others := 0
	for i := range 1000 {
		if el := checkTiersEquivalent(t, fmt.Sprintf("case %d", i), r, randTiered(r)); len(el.other) > 0 {
			others++
		}
		if t.Failed() {
			return
		}
	}
	// The other set is what the random cases must exercise too.
	if others < 50 {
		t.Errorf("only %d of 1000 random directions have an other set", others)
	}
}

func TestCompileTiersEdgeCases(t *testing.T) {
	a, a6 := prefixes("10.1.0.1/32"), prefixes("fd00::1/128")
	aBoth := slices.Concat(a, a6)
	everyone := prefixes("0.0.0.0/0", "::/0")
	portElems := func(peer string, ranges ...PortRange) []portElem {
		var out []portElem
		for _, pr := range ranges {
			out = append(out, portElem{netip.MustParsePrefix(peer), pr.Proto, pr.First, pr.Last})
		}
		return out
	}
	cases := []struct {
		name  string
		d     Direction
		all   []netip.Prefix // nil: not checked
		ports []portElem
		other []netip.Prefix
	}{
		{"only cluster policies, none matching: everything", Direction{ClusterOnly: true}, everyone, nil, nil},
		{"an admin deny of everyone: nothing", Direction{ClusterOnly: true, Admin: []TierRule{tierRule("x", Deny, everyone)}}, []netip.Prefix{}, nil, nil},
		{"an admin accept beside a NetworkPolicy default deny",
			Direction{Policies: []string{"ns/deny"}, Admin: []TierRule{tierRule("x", Accept, a)}}, a, nil, nil},
		{"an admin pass to a NetworkPolicy default deny: nothing",
			Direction{Policies: []string{"ns/deny"}, Admin: []TierRule{tierRule("x", Pass, everyone)}}, []netip.Prefix{}, nil, nil},
		{"a baseline deny of TCP 80: a peer allowed on the rest, ICMP in the other set",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("x", Deny, a, PortRange{TCP, 80, 80})}}, nil,
			portElems("10.1.0.1/32", PortRange{TCP, 0, 79}, PortRange{TCP, 81, 65535}, PortRange{UDP, 0, 65535}, PortRange{SCTP, 0, 65535}),
			a},
		{"an admin accept of UDP 53 over a NetworkPolicy default deny: no other set",
			Direction{Policies: []string{"ns/deny"}, Admin: []TierRule{tierRule("x", Accept, aBoth, PortRange{UDP, 53, 53})}}, []netip.Prefix{},
			slices.Concat(portElems("10.1.0.1/32", PortRange{UDP, 53, 53}), portElems("fd00::1/128", PortRange{UDP, 53, 53})), nil},
		{"an admin deny of TCP and UDP, then an accept of the rest",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{allow(a)}, Admin: []TierRule{tierRule("x", Deny, a, PortRange{TCP, 0, 65535}, PortRange{UDP, 0, 65535}), tierRule("y", Accept, a)}},
			[]netip.Prefix{}, portElems("10.1.0.1/32", PortRange{SCTP, 0, 65535}), a},
	}
	r := rand.New(rand.NewPCG(9, 10))
	for _, c := range cases {
		el := checkTiersEquivalent(t, c.name, r, &c.d)
		if c.all != nil && !slices.Equal(el.all, c.all) {
			t.Errorf("%s: all %v, want %v", c.name, el.all, c.all)
		}
		if !slices.Equal(el.ports, c.ports) {
			t.Errorf("%s: ports %v, want %v", c.name, el.ports, c.ports)
		}
		if !slices.Equal(el.other, c.other) {
			t.Errorf("%s: other %v, want %v", c.name, el.other, c.other)
		}
	}
}

// A direction without tiers compiles as it always did, its fingerprint
// included.
func TestCompileWithoutTiersUnchanged(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for range 200 {
		d := isolate(randRule(r), randRule(r))
		if got, want := compileDirection(d), compile(d); got.fingerprint() != want.fingerprint() || len(got.other) > 0 {
			t.Fatalf("%s compiled to %+v, want %+v", d, got, want)
		}
	}
}

func TestSetAlgebra(t *testing.T) {
	for _, c := range []struct {
		a, b, and, minus []netip.Prefix
	}{
		{prefixes("0.0.0.0/0", "::/0"), prefixes("10.0.0.0/8", "fd00::/8"), prefixes("10.0.0.0/8", "fd00::/8"),
			prefixes("0.0.0.0/5", "8.0.0.0/7", "11.0.0.0/8", "12.0.0.0/6", "16.0.0.0/4", "32.0.0.0/3", "64.0.0.0/2", "128.0.0.0/1",
				"::/1", "8000::/2", "c000::/3", "e000::/4", "f000::/5", "f800::/6", "fc00::/8", "fe00::/7")},
		{prefixes("10.0.0.0/24", "10.0.2.0/24"), prefixes("10.0.0.128/25", "10.0.1.0/24", "10.0.2.0/23"),
			prefixes("10.0.0.128/25", "10.0.2.0/24"), prefixes("10.0.0.0/25")},
		{prefixes("10.0.0.0/30"), prefixes("10.0.0.0/32", "10.0.0.3/32"), prefixes("10.0.0.0/32", "10.0.0.3/32"), prefixes("10.0.0.1/32", "10.0.0.2/32")},
		{prefixes("10.0.0.0/8"), nil, nil, prefixes("10.0.0.0/8")},
		{nil, prefixes("10.0.0.0/8"), nil, nil},
	} {
		if got := intersect(c.a, c.b); !slices.Equal(got, c.and) {
			t.Errorf("%v ∩ %v = %v, want %v", c.a, c.b, got, c.and)
		}
		if got := subtract(c.a, c.b); !slices.Equal(got, c.minus) {
			t.Errorf("%v − %v = %v, want %v", c.a, c.b, got, c.minus)
		}
	}
}

// A pod with a Baseline Accept alone is isolated as any pod with tiers:
// out of the fast path's connection setup, in the set isolated. A fast-path
// flow an Admin Deny now denies is evicted and its connection ended.
func TestTiersCloseTheFastPath(t *testing.T) {
	baselineOnly := &Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("base", Accept, prefixes("0.0.0.0/0"))}}
	rs := Ruleset{Pods: []Pod{
		{Key: "x/open", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.2")}},
		{Key: "x/baseline", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.3"), netip.MustParseAddr("fd00::3")}, Egress: baselineOnly},
	}}
	open := openPods(rs)
	if !open[netip.MustParseAddr("10.244.1.2")] || open[netip.MustParseAddr("10.244.1.3")] || open[netip.MustParseAddr("fd00::3")] {
		t.Errorf("open pods %v: want only 10.244.1.2", open)
	}

	adminDeny := &Direction{Policies: []string{"x/web"}, Rules: webOnly.Rules, Admin: []TierRule{tierRule("quarantine", Deny, prefixes(client.String()+"/32"))}}
	denied := Ruleset{Pods: []Pod{{Key: "x/server", IPs: []netip.Addr{server}, Ingress: adminDeny}}}
	if denied.Allows(Connection{Client: client, Server: server, Proto: TCP, Port: 80}) {
		t.Fatal("the ruleset allows what an Admin Deny denies")
	}
	kept := Revoked{kept: map[flowID]bool{}, ended: map[flowID]bool{}}
	v, ended := judgeFlow(denied, openPods(denied), kept, map[netip.Addr]bool{server: true}, ap(server, 80), ap(client, 41000), uint8(TCP), fastpath.OpenedByRemote)
	if v != fastpath.Evict || !ended {
		t.Errorf("a fast-path flow an Admin Deny denies: verdict %d, ended %v; want evicted and ended", v, ended)
	}
}

// The table follows a direction's tiers: the other set comes and goes
// with the chain's rule looking it up (in the other pair of sets, as a
// change of families), every name fits nft's 31 characters, a change of
// the tiers that leaves the sets alone changes the log prefixes and
// nothing Revoke must see, and Logged maps each fingerprint back to the
// Direction, tiers and all.
func TestTierSetsAndLogPrefixes(t *testing.T) {
	e, nft := fakeEnforcer(t)
	e.logGroup = 1707
	id := PodID("ns/b")
	chain := ingress.chain(id)
	apply := func(in *Direction, wantChanged ...string) (tx, fp string) {
		t.Helper()
		rs := Ruleset{Pods: []Pod{{Key: "ns/b", Iface: "vethb", IPs: []netip.Addr{netip.MustParseAddr("10.99.0.2"), netip.MustParseAddr("fd99::2")}, Ingress: in}}}
		changed, err := e.Apply(rs, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(changed, wantChanged) {
			t.Errorf("Apply changed %v, want %v", changed, wantChanged)
		}
		return nft.LastTransaction.String(), e.pods["ns/b"].inLog
	}
	sets := func() []string {
		t.Helper()
		list, err := nft.List(context.Background(), "sets")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list {
			if len(s) > 31 {
				t.Errorf("set %s: a name longer than nft's 31 characters", s)
			}
		}
		return slices.DeleteFunc(list, func(s string) bool { return !strings.HasPrefix(s, chain) })
	}
	a := prefixes("10.99.0.1/32", "fd99::1/128")
	v1 := &Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("base", Deny, a, PortRange{TCP, 80, 80})}}
	tx, fp1 := apply(v1, "ns/b")
	other, other6 := otherSet(chain, ipv4, false), otherSet(chain, ipv6, false)
	if got := elementKeys(t, nft, other); !slices.Equal(got, []string{"10.99.0.1/32"}) {
		t.Errorf("%s holds %v, want a", other, got)
	}
	if got := elementKeys(t, nft, other6); !slices.Equal(got, []string{"fd99::1/128"}) {
		t.Errorf("%s holds %v, want a", other6, got)
	}
	for _, rule := range []string{"meta l4proto != { tcp, udp, sctp } ip saddr @" + other, "meta l4proto != { tcp, udp, sctp } ip6 saddr @" + other6} {
		if !strings.Contains(tx, rule) {
			t.Errorf("the chain does not look the other sets up (%s):\n%s", rule, tx)
		}
	}

	// The rule renamed: the same sets, a new fingerprint, nothing to revoke.
	v2 := &Direction{ClusterOnly: true, Baseline: []TierRule{v1.Baseline[0]}}
	v2.Baseline[0].Name = "renamed"
	tx, fp2 := apply(v2)
	if strings.Contains(tx, "element") || fp2 == fp1 || !strings.Contains(tx, fp2) {
		t.Errorf("a renamed tier rule wrote (fingerprints %s, %s):\n%s\nwant the chains' rules with the new fingerprint, no elements", fp1, fp2, tx)
	}
	for fp, want := range map[string]*Direction{fp1: v1, fp2: v2} {
		if l, ok := e.Logged(id, true, fp); !ok || l.Direction != want {
			t.Errorf("Logged(%s): %+v, %v; want %s", fp, l, ok, want)
		}
	}

	// No other set any more (an Admin deny of ICMP): the other pair, without.
	v3 := &Direction{ClusterOnly: true, Admin: []TierRule{tierRule("web", Accept, a, PortRange{TCP, 80, 80})}, Baseline: []TierRule{tierRule("base", Deny, a)}}
	apply(v3, "ns/b")
	if got := sets(); slices.ContainsFunc(got, func(s string) bool { return strings.Contains(s, "-other") }) || !slices.Contains(got, chain+"-all-b") {
		t.Errorf("sets %v: want the second pair, no other sets", got)
	}
	// And back: the other sets in the first pair.
	apply(v1, "ns/b")
	if got := sets(); !slices.Contains(got, other) || !slices.Contains(got, other6) || slices.ContainsFunc(got, func(s string) bool { return strings.HasSuffix(s, "-b") }) {
		t.Errorf("sets %v: want the first pair, with the other sets", got)
	}
}
