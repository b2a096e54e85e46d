package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
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
	return !slices.Contains(portProtos, proto) && slices.ContainsFunc(el.other, func(r addrRange) bool { return r.Contains(ip) })
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
		if e.first == 1 || e.last == 0 {
			t.Errorf("%s: ports-set element %v: port 0 in a segment of its own", name, e.key())
		}
	}
}

// rangeEdges are the addresses at and around the ends of el's ranges,
// where a range's membership changes.
func rangeEdges(el elements) []netip.Addr {
	var out []netip.Addr
	for _, r := range slices.Concat(el.all, el.other) {
		out = append(out, r.first, r.first.Prev(), r.last, r.last.Next())
	}
	for _, e := range el.ports {
		out = append(out, e.peer.first, e.peer.first.Prev(), e.peer.last, e.peer.last.Next())
	}
	return out
}

func randTierRule(r *rand.Rand, i int) TierRule {
	rule := randRule(r)
	return TierRule{Policy: fmt.Sprintf("cnp%d", i), Index: i, Action: []Action{Accept, Deny, Pass}[r.IntN(3)], Peers: rule.Peers, Ports: rule.Ports}
}

// randTiered is a direction with random tiers: overlapping prefixes of
// both families, ports and ranges of the three protocols or none, every
// action, and either NetworkPolicy rules or none isolating (ClusterOnly).
// Baseline rules come with NetworkPolicy ones too: they must not count.
// Some tier rules have the very peers (the same list) of an earlier one,
// as the agent hands the rules of policies with the same peers.
func randTiered(r *rand.Rand) *Direction {
	d := &Direction{ClusterOnly: r.IntN(2) == 0}
	var shared [][]netip.Prefix
	tierRule := func(i int) TierRule {
		tr := randTierRule(r, i)
		if len(shared) > 0 && r.IntN(3) == 0 {
			tr.Peers = shared[r.IntN(len(shared))]
		} else if len(tr.Peers) > 0 {
			shared = append(shared, tr.Peers)
		}
		return tr
	}
	for i := range r.IntN(5) {
		d.Admin = append(d.Admin, tierRule(i))
	}
	for i := range r.IntN(5) {
		d.Baseline = append(d.Baseline, tierRule(i))
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
	// As an Apply compiles: peer lists once each (rangeMemo).
	el := compileDirection(d, rangeMemo{})
	if alone := compileDirection(d, nil); !reflect.DeepEqual(el, alone) {
		t.Fatalf("%s: compiled with a memo to %+v, without one to %+v", name, el, alone)
	}
	checkTierElements(t, name, el, d.Tiered() || d.ClusterOnly)
	ports := samplePorts(r, flat(d))
	for _, ip := range slices.Concat(sampleAddrs(r, flat(d)), rangeEdges(el)) {
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
	others, joins := 0, 0
	for i := range 1000 {
		el := checkTiersEquivalent(t, fmt.Sprintf("case %d", i), r, randTiered(r))
		if len(el.other) > 0 {
			others++
		}
		if joinsPrefixes(el) {
			joins++
		}
		if t.Failed() {
			return
		}
	}
	// The other set, and ranges that are no prefix, are what the random
	// cases must exercise too.
	if others < 50 || joins < 50 {
		t.Errorf("of 1000 random directions, only %d have an other set and %d a range that is no prefix", others, joins)
	}
}

// joinsPrefixes reports whether any of el's ranges is no prefix.
func joinsPrefixes(el elements) bool {
	notPrefix := func(r addrRange) bool { return strings.Contains(r.String(), "-") }
	return slices.ContainsFunc(el.all, notPrefix) || slices.ContainsFunc(el.other, notPrefix) ||
		slices.ContainsFunc(el.ports, func(e portElem) bool { return notPrefix(e.peer) })
}

func TestCompileTiersEdgeCases(t *testing.T) {
	a, a6 := prefixes("10.1.0.1/32"), prefixes("fd00::1/128")
	aBoth := slices.Concat(a, a6)
	everyone := prefixes("0.0.0.0/0", "::/0")
	portElems := func(peer string, ranges ...PortRange) []portElem {
		var out []portElem
		for _, pr := range ranges {
			out = append(out, portElem{rangeOf(netip.MustParsePrefix(peer)), pr.Proto, pr.First, pr.Last})
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
		{"a baseline deny of TCP, every port: port 0 with them, no element of its own",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("x", Deny, a, PortRange{TCP, 1, 65535})}}, nil,
			portElems("10.1.0.1/32", PortRange{UDP, 0, 65535}, PortRange{SCTP, 0, 65535}), a},
		{"an admin deny of TCP and UDP, then an accept of the rest",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{allow(a)}, Admin: []TierRule{tierRule("x", Deny, a, PortRange{TCP, 0, 65535}, PortRange{UDP, 0, 65535}), tierRule("y", Accept, a)}},
			[]netip.Prefix{}, portElems("10.1.0.1/32", PortRange{SCTP, 0, 65535}), a},
	}
	r := rand.New(rand.NewPCG(9, 10))
	for _, c := range cases {
		el := checkTiersEquivalent(t, c.name, r, &c.d)
		if c.all != nil && !slices.Equal(el.all, prefixRanges(c.all)) {
			t.Errorf("%s: all %v, want %v", c.name, el.all, c.all)
		}
		if !slices.Equal(el.ports, c.ports) {
			t.Errorf("%s: ports %v, want %v", c.name, el.ports, c.ports)
		}
		if !slices.Equal(el.other, prefixRanges(c.other)) {
			t.Errorf("%s: other %v, want %v", c.name, el.other, c.other)
		}
	}
}

// A Baseline Deny of many scattered pods leaves the rest of the address
// space allowed: a complement, which as prefixes took up to one element
// per bit of each pod's address (66,339 in the all set for these 1000
// pods of each family, and 5,952 in ports with TCP port 0 apart), and as
// ranges one per pod and family; port 0 adds none of its own.
func TestCompileTiersComplementSize(t *testing.T) {
	const n = 1000
	// Scattered as pods are over a cluster's pod CIDRs.
	r := rand.New(rand.NewPCG(13, 14))
	var pods []netip.Prefix
	for range n {
		v6 := [16]byte{0xfd, 0, 0, 0x10, 0x02, 0x44}
		for i := 7; i < 16; i++ {
			v6[i] = byte(r.IntN(256))
		}
		pods = append(pods, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(r.IntN(256)), byte(r.IntN(256))}), 32),
			netip.PrefixFrom(netip.AddrFrom16(v6), 128))
	}
	perFamily := func(rs []addrRange) (v4, v6 int) {
		for _, r := range rs {
			if r.is6() {
				v6++
			} else {
				v4++
			}
		}
		return v4, v6
	}
	for _, c := range []struct {
		name                string
		ports               []PortRange
		maxPorts, maxOthers int // per family
	}{
		{"every protocol", nil, 0, 0},
		// The pods are allowed on UDP and SCTP, and on the other
		// protocols: one ports element per pod and protocol, none for
		// TCP port 0.
		{"TCP alone", []PortRange{{TCP, 1, 65535}}, 2 * n, n},
	} {
		d := &Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("deny-pods", Deny, pods, c.ports...)}}
		el := compileDirection(d, nil)
		checkTierElements(t, c.name, el, true)
		if v4, v6 := perFamily(el.all); v4 > n+1 || v6 > n+1 {
			t.Errorf("%s: %d IPv4 and %d IPv6 elements in all, want at most %d each", c.name, v4, v6, n+1)
		}
		var peers []addrRange
		for _, e := range el.ports {
			peers = append(peers, e.peer)
		}
		if v4, v6 := perFamily(peers); v4 > c.maxPorts || v6 > c.maxPorts {
			t.Errorf("%s: %d IPv4 and %d IPv6 elements in ports, want at most %d each", c.name, v4, v6, c.maxPorts)
		}
		if v4, v6 := perFamily(el.other); v4 > c.maxOthers || v6 > c.maxOthers {
			t.Errorf("%s: %d IPv4 and %d IPv6 elements in other, want at most %d each", c.name, v4, v6, c.maxOthers)
		}
		// The sets still say what Judge says, at and beside every pod.
		for _, p := range pods {
			for _, ip := range []netip.Addr{p.Addr(), p.Addr().Prev(), p.Addr().Next()} {
				for _, pp := range []struct {
					proto Proto
					port  uint16
				}{{TCP, 0}, {TCP, 80}, {UDP, 53}, {SCTP, 1}, {1, 0}} {
					if want, got := d.Allows(ip, pp.proto, pp.port), el.lookup(ip, pp.proto, pp.port); want != got {
						t.Fatalf("%s: %v %v/%d: Judge says %v, sets say %v", c.name, ip, pp.proto, pp.port, want, got)
					}
				}
			}
		}
	}
}

// A direction without tiers compiles as it always did, its fingerprint
// included: the fingerprints of these 200 are those of the elements
// before address ranges (and before tiers), so an agent upgraded over
// its own table rewrites none of these chains.
func TestCompileWithoutTiersUnchanged(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	h := sha256.New()
	for range 200 {
		d := isolate(randRule(r), randRule(r))
		got, want := compileDirection(d, nil), compile(d)
		if got.fingerprint() != want.fingerprint() || len(got.other) > 0 {
			t.Fatalf("%s compiled to %+v, want %+v", d, got, want)
		}
		fmt.Fprintln(h, got.fingerprint())
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != "486847f5fe805e72a329d000b48d9ad44093058e0ce999c2021f7c783c90d956" {
		t.Errorf("the fingerprints of directions without tiers changed (their digest %s)", got)
	}
}

// addrRanges parses ranges written as nft reads them: a prefix or
// first-last.
func addrRanges(ss ...string) []addrRange {
	out := []addrRange{}
	for _, s := range ss {
		if first, last, ok := strings.Cut(s, "-"); ok {
			out = append(out, addrRange{netip.MustParseAddr(first), netip.MustParseAddr(last)})
		} else {
			out = append(out, rangeOf(netip.MustParsePrefix(s)))
		}
	}
	return out
}

func TestSetAlgebra(t *testing.T) {
	for _, c := range []struct {
		a, b, or []string
	}{
		{[]string{"0.0.0.0/0", "::/0"}, []string{"10.0.0.0/8", "fd00::/8"}, []string{"0.0.0.0/0", "::/0"}},
		{[]string{"10.0.0.0/24", "10.0.2.0/24"}, []string{"10.0.0.128/25", "10.0.1.0/24", "10.0.2.0/23"}, []string{"10.0.0.0-10.0.3.255"}},
		{[]string{"10.0.0.0/30"}, []string{"10.0.0.0/32", "10.0.0.3/32"}, []string{"10.0.0.0/30"}},
		// At the ends of the families: nothing after the last address.
		{[]string{"0.0.0.0/0", "::/0"}, []string{"0.0.0.0/32", "255.255.255.255/32", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128"},
			[]string{"0.0.0.0/0", "::/0"}},
		// The last IPv4 address does not run into the first IPv6 one.
		{[]string{"255.255.255.255/32"}, []string{"::/128"}, []string{"255.255.255.255/32", "::/128"}},
		{[]string{"10.0.0.1-10.0.0.3", "10.0.0.7-10.0.0.9", "10.0.1.0/24"}, []string{"10.0.0.2-10.0.0.8", "10.0.1.3/32", "10.0.1.9/32"},
			[]string{"10.0.0.1-10.0.0.9", "10.0.1.0/24"}},
		{[]string{"10.0.0.0/8"}, nil, []string{"10.0.0.0/8"}},
		{nil, []string{"10.0.0.0/8"}, []string{"10.0.0.0/8"}},
	} {
		a, b := addrRanges(c.a...), addrRanges(c.b...)
		if got, want := union(a, b), addrRanges(c.or...); !slices.Equal(got, want) {
			t.Errorf("%v ∪ %v = %v, want %v", a, b, got, want)
		}
	}
	// Prefixes, overlapping, contained and neighbouring, become the
	// fewest ranges; each a prefix renders as one.
	got := toRanges(prefixes("10.0.0.4/30", "10.0.0.0/30", "10.0.0.9/32", "10.0.0.8/29", "10.1.2.3/24", "fd00::1/128", "fd00::2/127"))
	want := addrRanges("10.0.0.0/28", "10.1.2.0/24", "fd00::1-fd00::3")
	if !slices.Equal(got, want) || fmt.Sprint(got) != "[10.0.0.0/28 10.1.2.0/24 fd00::1-fd00::3]" {
		t.Errorf("toRanges: %v, want %v", got, want)
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

// Contains reports whether ip is in r: how the tests look an address up
// in the compiled sets, as nft does.
func (r addrRange) Contains(ip netip.Addr) bool {
	return r.first.Compare(ip) <= 0 && ip.Compare(r.last) <= 0
}

// Overlaps reports whether r and o share an address.
func (r addrRange) Overlaps(o addrRange) bool {
	return r.first.Compare(o.last) <= 0 && o.first.Compare(r.last) <= 0
}
