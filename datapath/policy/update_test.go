package policy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

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
	nft := knftables.NewFake(knftables.IPv4Family, Table)
	tx := nft.NewTransaction()
	tx.Add(&knftables.Table{})
	if err := nft.Run(context.Background(), tx); err != nil {
		t.Fatal(err)
	}
	return &Enforcer{nft: nft, pods: map[string]applied{}, gone: map[string]netip.Addr{}}, nft
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

// wantKeys are d's compiled elements of each set, as knftables writes
// them.
func wantKeys(d *Direction) (ports, all []string) {
	el := compile(d)
	for _, p := range el.all {
		all = append(all, p.String())
	}
	for _, pe := range el.ports {
		ports = append(ports, strings.Join(pe.key(), " . "))
	}
	slices.Sort(ports)
	slices.Sort(all)
	return ports, all
}

// A change of a pod's rules writes only what differs: it deletes the
// elements that left, before it adds the new ones, and flushes nothing;
// a change that would delete most of a set fills a fresh pair of sets
// instead, points the chain at it and deletes the old pair. Either way
// the sets hold exactly the new elements.
func TestChangeWritesOnlyTheDifference(t *testing.T) {
	e, nft := fakeEnforcer(t)
	chain := ingress.chain(podID("ns/b"))
	apply := func(in *Direction) []string {
		t.Helper()
		rs := Ruleset{Pods: []Pod{{Key: "ns/b", Iface: "vethb", IP: netip.MustParseAddr("10.99.0.2"), Ingress: in}}}
		if _, err := e.Apply(rs, false); err != nil {
			t.Fatal(err)
		}
		return strings.Split(strings.TrimSuffix(nft.LastTransaction.String(), "\n"), "\n")
	}
	// holds checks that the pair of sets second names holds in's
	// elements, and that the table has no other sets of chain.
	holds := func(in *Direction, second bool) {
		t.Helper()
		ports, all := setNames(chain, second)
		wantPorts, wantAll := wantKeys(in)
		if got := elementKeys(t, nft, ports); !slices.Equal(got, wantPorts) {
			t.Errorf("set %s holds %v, want %v", ports, got, wantPorts)
		}
		if got := elementKeys(t, nft, all); !slices.Equal(got, wantAll) {
			t.Errorf("set %s holds %v, want %v", all, got, wantAll)
		}
		sets, err := nft.List(context.Background(), "sets")
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range sets {
			if strings.HasPrefix(s, chain) && s != ports && s != all {
				t.Errorf("set %s is left over", s)
			}
		}
	}
	line := func(verb, set, key string) string {
		return fmt.Sprintf("%s element ip %s %s { %s }", verb, Table, set, key)
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
	ports, all := setNames(chain, false)
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
	newPorts, newAll := setNames(chain, true)
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
