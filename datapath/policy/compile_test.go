package policy

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strconv"
	"testing"

	"github.com/onc-net/onc/internal/netaddr"
)

// allows is the verdict of the compiled sets, as nft reaches it.
func (el elements) allows(ip netip.Addr, proto Proto, port uint16) bool {
	for _, p := range el.all {
		if p.Contains(ip) {
			return true
		}
	}
	for _, e := range el.ports {
		if e.peer.Contains(ip) && e.proto == proto && port >= e.first && port <= e.last {
			return true
		}
	}
	return false
}

// checkDisjoint fails when two elements of a set overlap, as nft would.
func checkDisjoint(t *testing.T, name string, el elements) {
	t.Helper()
	bad := func(r addrRange) bool { return r.first.Is4() != r.last.Is4() || r.last.Less(r.first) }
	for i, a := range el.all {
		if bad(a) {
			t.Errorf("%s: element %v is no range", name, a)
		}
		for _, b := range el.all[i+1:] {
			if a.Overlaps(b) {
				t.Errorf("%s: all-set elements %v and %v overlap", name, a, b)
			}
		}
	}
	for i, a := range el.ports {
		if a.first > a.last || bad(a.peer) {
			t.Errorf("%s: bad element %v", name, a.key())
		}
		for _, b := range el.ports[i+1:] {
			if a.proto == b.proto && a.first <= b.last && b.first <= a.last && a.peer.Overlaps(b.peer) {
				t.Errorf("%s: ports-set elements %v and %v overlap", name, a.key(), b.key())
			}
		}
	}
}

var (
	basePeers = []string{
		"0.0.0.0/0", "10.0.0.0/8", "10.1.0.0/16", "10.1.2.0/24", "10.1.2.0/25", "10.1.2.128/25",
		"10.1.2.3/32", "10.1.2.4/32", "10.1.2.5/32", "10.1.3.0/24", "192.168.0.0/16", "192.168.7.7/32",
		"10.1.2.3/24", // not masked
		"255.255.255.255/32", "0.0.0.0/32", "128.0.0.0/1", "0.0.0.0/1",
	}
	basePeers6 = []string{
		"::/0", "fd00::/8", "fd00::/120", "fd00::80/121", "fd00::3/128", "fd00::3/120", // not masked
		"::ffff:10.1.2.0/120", // IPv4-mapped: matches no IPv4 packet
		"8000::/1", "::/1",
	}
	basePorts = []uint16{0, 1, 2, 52, 53, 54, 79, 80, 81, 443, 1000, 1024, 8080, 32767, 32768, 65534, 65535}
)

func randRule(r *rand.Rand) Rule {
	var rule Rule
	for range r.IntN(4) {
		p := netip.MustParsePrefix(basePeers[r.IntN(len(basePeers))])
		if r.IntN(4) == 0 {
			// A random prefix around the interesting addresses.
			a := netip.AddrFrom4([4]byte{10, 1, 2, byte(r.IntN(256))})
			p = netip.PrefixFrom(a, 24+r.IntN(9))
		}
		rule.Peers = append(rule.Peers, p)
	}
	if r.IntN(3) == 0 {
		p := netip.MustParsePrefix(basePeers6[r.IntN(len(basePeers6))])
		if r.IntN(3) == 0 {
			// A random prefix around the interesting addresses.
			p = netip.PrefixFrom(netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(r.IntN(256))}), 120+r.IntN(9))
		}
		rule.Peers = append(rule.Peers, p)
	}
	if r.IntN(3) == 0 {
		return rule // every port
	}
	rule.Ports = []PortRange{}
	for range r.IntN(4) {
		proto := []Proto{TCP, UDP, SCTP}[r.IntN(3)]
		a, b := basePorts[r.IntN(len(basePorts))], basePorts[r.IntN(len(basePorts))]
		if r.IntN(3) == 0 {
			b = a
		}
		if a > b && r.IntN(4) != 0 {
			a, b = b, a // otherwise an empty range
		}
		rule.Ports = append(rule.Ports, PortRange{proto, a, b})
	}
	return rule
}

func sampleAddrs(r *rand.Rand, d *Direction) []netip.Addr {
	var out []netip.Addr
	for _, s := range []string{"0.0.0.0", "255.255.255.255", "10.1.2.3", "10.1.2.127", "10.1.2.128", "10.1.2.255", "10.1.3.0", "10.2.0.0", "9.255.255.255", "127.0.0.1",
		"::", "::1", "fd00::", "fd00::3", "fd00::ff", "fd00::100", "fe80::1", "::ffff:10.1.2.3", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"} {
		out = append(out, netip.MustParseAddr(s))
	}
	for _, rule := range d.Rules {
		for _, p := range rule.Peers {
			m := p.Masked()
			b := m.Addr().AsSlice()
			out = append(out, m.Addr(), m.Addr().Prev(), netaddr.Last(m), netaddr.Last(m).Next())
			b[len(b)-1] ^= byte(r.IntN(256))
			a, _ := netip.AddrFromSlice(b)
			out = append(out, a)
		}
	}
	for range 10 {
		out = append(out, netip.AddrFrom4([4]byte{10, 1, byte(r.IntN(4)), byte(r.IntN(256))}),
			netip.AddrFrom16([16]byte{0: 0xfd, 14: byte(r.IntN(2)), 15: byte(r.IntN(256))}))
	}
	return out
}

func samplePorts(r *rand.Rand, d *Direction) []uint16 {
	out := append([]uint16{}, basePorts...)
	for _, rule := range d.Rules {
		for _, pr := range rule.Ports {
			out = append(out, pr.First, pr.Last, pr.First-1, pr.Last+1)
		}
	}
	for range 5 {
		out = append(out, uint16(r.IntN(65536)))
	}
	return out
}

func checkEquivalent(t *testing.T, name string, r *rand.Rand, d *Direction) {
	t.Helper()
	el := compile(d)
	checkDisjoint(t, name, el)
	ports := samplePorts(r, d)
	for _, ip := range sampleAddrs(r, d) {
		for _, proto := range []Proto{TCP, UDP, SCTP, 1} {
			for _, port := range ports {
				if want, got := d.Allows(ip, proto, port), el.allows(ip, proto, port); want != got {
					t.Fatalf("%s: %v %v/%d: model says %v, sets say %v\nrules: %v\nall: %v\nports: %v",
						name, ip, proto, port, want, got, d, el.all, el.ports)
				}
			}
		}
	}
}

func TestCompileEquivalentRandom(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		d := &Direction{}
		for range r.IntN(6) {
			d.Rules = append(d.Rules, randRule(r))
		}
		checkEquivalent(t, fmt.Sprintf("case %d", i), r, d)
		if t.Failed() {
			return
		}
	}
}

func TestCompileEdgeCases(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	cases := map[string]struct {
		d         Direction
		all       int // expected element counts, -1 to skip
		portElems int
	}{
		"no rules (deny all)":       {Direction{}, 0, 0},
		"no peers":                  {Direction{Rules: []Rule{{Ports: []PortRange{{TCP, 80, 80}}}}}, 0, 0},
		"empty ports allow nothing": {Direction{Rules: []Rule{{Peers: pfx("0.0.0.0/0"), Ports: []PortRange{}}}}, 0, 0},
		"allow all":                 {Direction{Rules: []Rule{{Peers: pfx("0.0.0.0/0")}}}, 1, 0},
		"contained and duplicate peers": {Direction{Rules: []Rule{
			{Peers: pfx("10.0.0.0/8", "10.1.0.0/16", "10.1.2.3/32", "10.0.0.0/8")},
		}}, 1, 0},
		"siblings merge": {Direction{Rules: []Rule{
			{Peers: pfx("10.1.2.0/25", "10.1.2.128/26", "10.1.2.192/26")},
		}}, 1, 0},
		"except-style disjoint": {Direction{Rules: []Rule{
			// 10.0.0.0/8 except 10.1.0.0/16, as the compiler splits it.
			{Peers: pfx("10.0.0.0/16", "10.2.0.0/15", "10.4.0.0/14", "10.8.0.0/13", "10.16.0.0/12", "10.32.0.0/11", "10.64.0.0/10", "10.128.0.0/9"), Ports: []PortRange{{TCP, 80, 80}}},
		}}, 0, 8},
		"overlapping port ranges": {Direction{Rules: []Rule{
			{Peers: pfx("10.1.2.3/32"), Ports: []PortRange{{TCP, 1000, 2000}}},
			{Peers: pfx("10.1.2.0/24"), Ports: []PortRange{{TCP, 1500, 2500}, {UDP, 53, 53}}},
		}}, 0, 3}, // tcp 1000-1499 .3, tcp 1500-2500 /24, udp 53 /24
		"adjacent ranges merge": {Direction{Rules: []Rule{
			{Peers: pfx("10.1.2.3/32"), Ports: []PortRange{{TCP, 1, 100}, {TCP, 101, 200}}},
			{Peers: pfx("10.1.2.3/32"), Ports: []PortRange{{TCP, 150, 65535}}},
		}}, 0, 1},
		"full range and port 0": {Direction{Rules: []Rule{
			{Peers: pfx("0.0.0.0/0"), Ports: []PortRange{{SCTP, 0, 65535}, {TCP, 65535, 65535}, {UDP, 0, 0}}},
		}}, 0, 3},
		"reversed range matches nothing": {Direction{Rules: []Rule{
			{Peers: pfx("0.0.0.0/0"), Ports: []PortRange{{TCP, 90, 80}}},
		}}, 0, 0},
		"both families, apart": {Direction{Rules: []Rule{{Peers: pfx("::/0", "0.0.0.0/0", "fd00::/8")}}}, 2, 0},
		"IPv6 siblings merge": {Direction{Rules: []Rule{
			{Peers: pfx("fd00::/121", "fd00::80/122", "fd00::c0/122"), Ports: []PortRange{{UDP, 53, 53}}},
		}}, 0, 1},
	}
	r := rand.New(rand.NewPCG(3, 4))
	for name, c := range cases {
		checkEquivalent(t, name, r, &c.d)
		el := compile(&c.d)
		if len(el.all) != c.all || len(el.ports) != c.portElems {
			t.Errorf("%s: %d all and %d ports elements (%v %v), want %d and %d", name, len(el.all), len(el.ports), el.all, el.ports, c.all, c.portElems)
		}
	}
}

func TestDisjoint(t *testing.T) {
	in := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/25"), netip.MustParsePrefix("10.0.0.128/26"),
		netip.MustParsePrefix("10.0.0.192/26"), netip.MustParsePrefix("10.0.1.0/24"),
		netip.MustParsePrefix("10.0.2.0/24"), netip.MustParsePrefix("10.0.2.7/32"),
	}
	got := disjoint(in)
	want := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/23"), netip.MustParsePrefix("10.0.2.0/24")}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("disjoint(%v) = %v, want %v", in, got, want)
	}
}

// Apply reuses a direction's elements only for the very same rules: "every
// port" (nil) and "no port" (empty) must not be mistaken for each other.
func TestElementsAreReusedOnlyForTheSameRules(t *testing.T) {
	peers := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}
	e := &Enforcer{}
	next := map[string]*compiled{}
	all := e.elementsOf("ns/a in", &Direction{Rules: []Rule{{Policy: "ns/p", Peers: peers}}}, next, nil)
	e.compiled, next = next, map[string]*compiled{}
	if again := e.elementsOf("ns/a in", &Direction{Rules: []Rule{{Policy: "ns/p", Peers: slices.Clone(peers)}}}, next, nil); again != all {
		t.Error("the same rules were compiled again")
	}
	e.compiled, next = next, map[string]*compiled{}
	none := e.elementsOf("ns/a in", &Direction{Rules: []Rule{{Policy: "ns/p", Peers: peers, Ports: []PortRange{}}}}, next, nil)
	if none == all || none.fingerprint == all.fingerprint {
		t.Fatal("a rule allowing no port reused the elements of one allowing every port")
	}
}

// What Apply's comparison of a node's unchanged rules with the last
// applied costs: the very slices handed back (as agent/policy.Incremental
// does for the pods a change does not touch), or equal copies (as a full
// compile makes). 110 pods, 70 rules each, of 2,500 peers.
func BenchmarkUnchangedRules(b *testing.B) {
	peers := make([]netip.Prefix, 2500)
	for i := range peers {
		peers[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i / 250), byte(i % 250)}), 32)
	}
	rules := make([]Rule, 70)
	for i := range rules {
		rules[i] = Rule{Policy: "ns/p", Index: i, Peers: peers, Ports: []PortRange{{TCP, 80, 80}}}
	}
	e := &Enforcer{compiled: map[string]*compiled{}}
	for k := range 110 {
		e.compiled[strconv.Itoa(k)] = &compiled{rules: rules}
	}
	for _, tc := range []struct {
		name  string
		rules []Rule
	}{{"same", rules}, {"copies", slices.Clone(rules)}} {
		for i := range tc.rules {
			if tc.name == "copies" {
				tc.rules[i].Peers = slices.Clone(peers)
			}
		}
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				next := make(map[string]*compiled, 110)
				for k := range 110 {
					e.elementsOf(strconv.Itoa(k), &Direction{Rules: tc.rules}, next, nil)
				}
			}
		})
	}
}
