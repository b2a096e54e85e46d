package policy

import (
	"context"
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"
)

func prefixes(ss ...string) []netip.Prefix {
	out := make([]netip.Prefix, len(ss))
	for i, s := range ss {
		out[i] = netip.MustParsePrefix(s)
	}
	return out
}

func allow(peers []netip.Prefix, ports ...PortRange) Rule {
	return Rule{Policy: "ns/p", Peers: peers, Ports: ports}
}

func isolate(rules ...Rule) *Direction {
	return &Direction{Policies: []string{"ns/p"}, Rules: rules}
}

// fakeEnforcer is an Enforcer on knftables' fake, which keeps the table
// and the last transaction run. The table is there from the start: the
// fake cannot list the counters of a missing one.
func fakeEnforcer(t *testing.T) (*Enforcer, *knftables.Fake) {
	nft := knftables.NewFake(knftables.InetFamily, Table)
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return &Enforcer{nft: nft, pods: map[string]applied{}, gone: map[string]podAddrs{}}, nft
}

// hosts are n /32 peers from 10.98.0.0, none two siblings (disjoint
// would merge those into one element).
func hosts(first, n int) []netip.Prefix {
	out := make([]netip.Prefix, n)
	for i := range out {
		k := 4 * (first + i)
		out[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 98, byte(k >> 8), byte(k)}), 32)
	}
	return out
}

// elementKeys are the elements of set name in the fake's table, as
// knftables writes them.
func elementKeys(t *testing.T, nft *knftables.Fake, name string) []string {
	t.Helper()
	list, err := nft.ListElements(context.Background(), "set", name)
	if err != nil {
		t.Fatalf("set %s: %v", name, err)
	}
	var out []string
	for _, el := range list {
		out = append(out, strings.Join(el.Key, " . "))
	}
	slices.Sort(out)
	return out
}

// wantSets are the sets of chain, a pod's chain holding d's compiled
// elements in the pair second names, and their elements, as knftables
// writes them.
func wantSets(chain string, second bool, d *Direction) map[string][]string {
	c := &compiled{el: compile(d), second: second}
	out := map[string][]string{}
	for _, f := range c.setFamilies() {
		ports, all := setNames(chain, f, second)
		out[ports], out[all] = []string{}, []string{}
	}
	for _, p := range c.el.all {
		set := allElem(chain, second, p).Set
		out[set] = append(out[set], p.String())
	}
	for _, pe := range c.el.ports {
		set := portsElem(chain, second, pe).Set
		out[set] = append(out[set], strings.Join(pe.key(), " . "))
	}
	for _, keys := range out {
		slices.Sort(keys)
	}
	return out
}

// A change of a pod's rules writes only what differs: it deletes the
// elements that left, before it adds the new ones, and flushes nothing;
// a change that would delete most of a set fills a fresh pair of sets
// instead, points the chain at it and deletes the old pair. Either way
// the sets hold exactly the new elements.
func TestChangeWritesOnlyTheDifference(t *testing.T) {
	e, nft := fakeEnforcer(t)
	chain := ingress.chain(PodID("ns/b"))
	apply := func(in *Direction) []string {
		t.Helper()
		rs := Ruleset{Pods: []Pod{{Key: "ns/b", Iface: "vethb", IPs: []netip.Addr{netip.MustParseAddr("10.99.0.2")}, Ingress: in}}}
		if _, err := e.Apply(rs, false); err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSuffix(nft.LastTransaction.String(), "\n"), "\n")
	}
	// holds checks that the table's sets of chain are the pair second
	// names, of the families in needs, holding in's elements.
	holds := func(in *Direction, second bool) {
		t.Helper()
		sets, err := nft.List(context.Background(), "sets")
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][]string{}
		for _, s := range sets {
			if strings.HasPrefix(s, chain) {
				got[s] = elementKeys(t, nft, s)
			}
		}
		if want := wantSets(chain, second, in); !reflect.DeepEqual(got, want) {
			t.Errorf("the sets of %s hold\n%v\nwant\n%v", chain, got, want)
		}
	}
	line := func(verb, set, key string) string {
		return fmt.Sprintf("%s element inet %s %s { %s }", verb, Table, set, key)
	}

	v1 := isolate(
		allow(hosts(0, 40), PortRange{TCP, 80, 80}),
		allow(prefixes("10.1.0.0/16")),
		allow(prefixes("10.9.9.9/32"), PortRange{TCP, 8000, 8100}),
	)
	apply(v1)
	holds(v1, false)

	// One peer leaves and one comes; a CIDR and a port range give way to
	// ones that overlap them.
	v2 := isolate(
		allow(hosts(1, 40), PortRange{TCP, 80, 80}),
		allow(prefixes("10.1.0.0/17", "10.2.0.0/16")),
		allow(prefixes("10.9.9.9/32"), PortRange{TCP, 8050, 8200}),
	)
	ports, all := setNames(chain, ipv4, false)
	got := apply(v2)
	deletes := []string{
		line("delete", all, "10.1.0.0/16"),
		line("delete", ports, "10.98.0.0/32 . 6 . 80"),
		line("delete", ports, "10.9.9.9/32 . 6 . 8000-8100"),
	}
	adds := []string{
		line("add", all, "10.1.0.0/17"),
		line("add", all, "10.2.0.0/16"),
		line("add", ports, "10.9.9.9/32 . 6 . 8050-8200"),
		line("add", ports, "10.98.0.160/32 . 6 . 80"),
	}
	if len(got) != len(deletes)+len(adds) || !slices.Equal(sorted(got[:len(deletes)]), sorted(deletes)) || !slices.Equal(sorted(got[len(deletes):]), sorted(adds)) {
		t.Errorf("the change's transaction:\n%s\nwant the deletes\n%s\nthen the adds\n%s",
			strings.Join(got, "\n"), strings.Join(deletes, "\n"), strings.Join(adds, "\n"))
	}
	holds(v2, false)

	// Every peer on port 80 replaced: a fresh pair of sets.
	v3 := isolate(
		allow(hosts(100, 40), PortRange{TCP, 80, 80}),
		allow(prefixes("10.1.0.0/17", "10.2.0.0/16")),
		allow(prefixes("10.9.9.9/32"), PortRange{TCP, 8050, 8200}),
	)
	got = apply(v3)
	for _, l := range got {
		if strings.HasPrefix(l, "delete element") || strings.HasPrefix(l, "flush set") {
			t.Errorf("a change refilling the sets wrote %q", l)
		}
	}
	holds(v3, true)
	newPorts, newAll := setNames(chain, ipv4, true)
	rules, err := nft.ListRules(context.Background(), chain)
	if err != nil || len(rules) != 3 || !strings.Contains(rules[0].Rule, "@"+newPorts+" ") || !strings.Contains(rules[1].Rule, "@"+newAll+" ") {
		t.Errorf("the chain's rules do not use the new sets (%v): %v", err, rules)
	}

	// In place again, in the second pair.
	v4 := isolate(
		allow(hosts(100, 40), PortRange{TCP, 80, 80}),
		allow(prefixes("10.1.0.0/16")),
		allow(prefixes("10.9.9.9/32"), PortRange{TCP, 8000, 8100}),
	)
	got = apply(v4)
	if len(got) != 5 {
		t.Errorf("the change's transaction:\n%s\nwant 3 deletes and 2 adds", strings.Join(got, "\n"))
	}
	holds(v4, true)

	// An IPv6 peer comes: the IPv6 sets with it, in a fresh pair (the
	// chain's rules change).
	v5 := isolate(append(slices.Clone(v4.Rules),
		allow(prefixes("fd00:1::/64", "fd00:2::5/128")),
		allow(prefixes("fd00:3::/120"), PortRange{UDP, 53, 53}))...)
	apply(v5)
	holds(v5, false)
	rules, err = nft.ListRules(context.Background(), chain)
	if err != nil || len(rules) != 5 || !strings.Contains(rules[2].Rule, "ip6 saddr . meta l4proto . th dport @"+chain+"-ports6 ") ||
		!strings.Contains(rules[3].Rule, "ip6 saddr @"+chain+"-all6 ") {
		t.Errorf("the chain's rules do not look up the IPv6 sets (%v): %v", err, rules)
	}
	// One IPv6 peer changes: in place, in the IPv6 set.
	v6 := isolate(append(slices.Clone(v4.Rules),
		allow(prefixes("fd00:1::/64", "fd00:2::6/128")),
		allow(prefixes("fd00:3::/120"), PortRange{UDP, 53, 53}))...)
	_, all6 := setNames(chain, ipv6, false)
	got = apply(v6)
	if want := []string{line("delete", all6, "fd00:2::5/128"), line("add", all6, "fd00:2::6/128")}; !slices.Equal(got, want) {
		t.Errorf("the change's transaction:\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	holds(v6, false)
	// The IPv6 peers go, and their sets.
	apply(v4)
	holds(v4, true)

	// The direction goes, with its sets.
	apply(nil)
	if sets, _ := nft.List(context.Background(), "sets"); slices.ContainsFunc(sets, func(s string) bool { return strings.HasPrefix(s, chain) }) {
		t.Errorf("sets of %s left after its direction went: %v", chain, sets)
	}
}

func sorted(ss []string) []string {
	out := slices.Clone(ss)
	slices.Sort(out)
	return out
}

// With a log group, a pod chain's log prefixes carry the fingerprint of
// its rules, rewritten in the transaction that changes the rules, sets
// in place or not, and also when only the rules' policies change (the
// sets the same: nothing to revoke). Logged says what the fingerprints of
// the current ruleset and of the last few stand for.
func TestLogPrefixesFollowTheRules(t *testing.T) {
	e, nft := fakeEnforcer(t)
	e.logGroup = 1707
	id := PodID("ns/b")
	chain := ingress.chain(id)
	// apply applies b's ingress in, and c's if other is not nil.
	apply := func(in, other *Direction, wantChanged ...string) (tx, fp string) {
		t.Helper()
		rs := Ruleset{Pods: []Pod{{Key: "ns/b", Iface: "vethb", IPs: []netip.Addr{netip.MustParseAddr("10.99.0.2")}, Ingress: in}}}
		if other != nil {
			rs.Pods = append(rs.Pods, Pod{Key: "ns/c", Iface: "vethc", IPs: []netip.Addr{netip.MustParseAddr("10.99.0.3")}, Ingress: other})
		}
		changed, err := e.Apply(rs, false)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(changed, wantChanged) {
			t.Errorf("Apply changed %v, want %v", changed, wantChanged)
		}
		return nft.LastTransaction.String(), e.pods["ns/b"].inLog
	}
	logPrefixes := func(fp string) []string {
		return []string{fmt.Sprintf("prefix %q", "onc1 A in "+id+" "+fp), fmt.Sprintf("prefix %q", "onc1 D in "+id+" "+fp)}
	}
	v1 := isolate(allow(hosts(0, 4), PortRange{TCP, 80, 80}), allow(prefixes("10.1.0.0/16")))
	tx, fp1 := apply(v1, nil, "ns/b")
	for _, p := range logPrefixes(fp1) {
		if !strings.Contains(tx, p) {
			t.Errorf("the first transaction has no %s:\n%s", p, tx)
		}
	}
	if rules, err := nft.ListRules(context.Background(), "al-"+chain); err != nil || len(rules) != 2 {
		t.Errorf("the allow-log chain: %v, %v; want its two rules (skip a connection logged, log and mark one)", rules, err)
	}

	// In place: the elements and the prefixes change together.
	v2 := isolate(allow(hosts(1, 4), PortRange{TCP, 80, 80}), allow(prefixes("10.1.0.0/16")))
	tx, fp2 := apply(v2, nil, "ns/b")
	ports, _ := setNames(chain, ipv4, false)
	for _, want := range append(logPrefixes(fp2), "delete element inet "+Table+" "+ports, "add element inet "+Table+" "+ports) {
		if !strings.Contains(tx, want) {
			t.Errorf("the change's transaction has no %s:\n%s", want, tx)
		}
	}
	// Another policy isolating b, with no rules: the same sets, new
	// prefixes, and nothing changed for Revoke.
	v3 := &Direction{Policies: []string{"ns/deny-all", "ns/p"}, Rules: slices.Clone(v2.Rules)}
	tx, fp3 := apply(v3, nil)
	if strings.Contains(tx, "element") || !strings.Contains(tx, logPrefixes(fp3)[0]) || !strings.Contains(tx, logPrefixes(fp3)[1]) {
		t.Errorf("a policy more wrote:\n%s\nwant the chains' rules with fingerprint %s, no elements", tx, fp3)
	}
	if fp1 == fp2 || fp2 == fp3 || fp1 == fp3 {
		t.Fatalf("fingerprints %s, %s, %s: want three", fp1, fp2, fp3)
	}
	for fp, want := range map[string]*Direction{fp1: v1, fp2: v2, fp3: v3} {
		if l, ok := e.Logged(id, true, fp); !ok || l.Pod != "ns/b" || l.Direction != want {
			t.Errorf("Logged(%s): %+v, %v; want ns/b's %s", fp, l, ok, want)
		}
	}
	if _, ok := e.Logged(id, false, fp3); ok {
		t.Errorf("Logged(%s) of the egress chain, which has no such rules", fp3)
	}
	// Four more rulesets (another pod changing) within a minute: fp2,
	// superseded five rulesets ago, is still known; once a minute has
	// passed too, it is forgotten. fp3 is still in force.
	clock := time.Now()
	e.logged.now = func() time.Time { return clock }
	for i := range keptRulesets {
		apply(v3, isolate(allow(hosts(10+i, 1))), "ns/c")
	}
	if _, ok := e.Logged(id, true, fp2); !ok {
		t.Errorf("Logged(%s) forgotten %d rulesets later, within a minute", fp2, keptRulesets+1)
	}
	clock = clock.Add(keptFor + time.Second)
	apply(v3, isolate(allow(hosts(20, 1))), "ns/c")
	if _, ok := e.Logged(id, true, fp2); ok {
		t.Errorf("Logged(%s) after %d more rulesets and a minute", fp2, keptRulesets+2)
	}
	if l, ok := e.Logged(id, true, fp3); !ok || l.Direction != v3 {
		t.Errorf("Logged(%s), in force: %+v, %v", fp3, l, ok)
	}
}
