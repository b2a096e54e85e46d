//go:build privileged

package netfilter

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/coreos/go-iptables/iptables"
	"github.com/onc-net/onc/internal/testutil"
)

// The uplink marks' old chain, which agents of 6365723..087c936 left
// jumped to from mangle FORWARD, goes with the next EnsureUplinkLB, which
// stays idempotent.
func TestEnsureUplinkLBRemovesTheOldMarkChain(t *testing.T) {
	testutil.InNewNetns(t, "nf", func() {
		ipt, err := newIPv4()
		testutil.Must(t, err)
		testutil.Must(t, fill(ipt, "mangle", "ONC-LB-MARK", "FORWARD", [][]string{{"-j", "MARK", "--or-mark", "0x40000"}}))
		for range 2 {
			testutil.Must(t, EnsureUplinkLB(UplinkLB{}))
		}
		if ok, err := ipt.ChainExists("mangle", "ONC-LB-MARK"); err != nil || ok {
			t.Fatalf("ONC-LB-MARK still there (%v)", err)
		}
		rules, err := ipt.List("mangle", "FORWARD")
		testutil.Must(t, err)
		for _, r := range rules {
			if r != "-P FORWARD ACCEPT" {
				t.Fatalf("mangle FORWARD still holds %q", r)
			}
		}
	})
}

// ovl4 and ovl6 are the overlay on an IPv4 and on an IPv6 underlay.
var (
	ovl4 = Overlay{Device: "onc.vxlan", Uplink: "eth0", Port: 4789, PeerHostMark: 0x200000}
	ovl6 = Overlay{Device: "onc.vxlan", Uplink: "eth0", Port: 4789, PeerHostMark: 0x200000, IPv6: true}
)

// IPv6 pods get the IPv4 ones' masquerade and FORWARD accepts in
// ip6tables, in ONC's chains jumped to first; without an IPv6 cluster CIDR
// the chains are emptied. Idempotent both ways. A node that never had IPv6
// pods gets nothing in ip6tables.
func TestEnsureIPv6(t *testing.T) {
	testutil.InNewNetns(t, "nf6", func() {
		ipt, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6))
		testutil.Must(t, err)
		testutil.Must(t, EnsureIPv6(netip.Prefix{}, ovl4, ""))
		for table, chain := range map[string]string{"nat": natChain, "filter": forwardChain} {
			if ok, err := ipt.ChainExists(table, chain); err != nil || ok {
				t.Fatalf("an IPv4-only node made ip6tables %s %s (%v)", table, chain, err)
			}
		}
		rules := func(table, chain string) []string {
			t.Helper()
			r, err := ipt.List(table, chain)
			testutil.Must(t, err)
			return r
		}
		cidr := netip.MustParsePrefix("fd00:10:244::/56")
		for range 2 {
			testutil.Must(t, EnsureIPv6(cidr, ovl4, ""))
		}
		nat := strings.Join(rules("nat", natChain), "\n")
		for _, want := range []string{
			`-A ONC-POSTROUTING -s fd00:10:244::/56 -d fd00:10:244::/56 -m comment --comment "onc: pod to pod, no NAT" -j RETURN`,
			`-A ONC-POSTROUTING -s fd00:10:244::/56 ! -d ff00::/8 -m comment --comment "onc: pod to outside" -j MASQUERADE --random-fully`,
		} {
			if !strings.Contains(nat, want) {
				t.Errorf("nat %s lacks %q:\n%s", natChain, want, nat)
			}
		}
		if fwd := rules("filter", forwardChain); len(fwd) != 3 {
			t.Errorf("filter %s: %v, want the chain and 2 accepts", forwardChain, fwd)
		}
		// With the uplink translating IPv6, pods' TCP and UDP keep clear of
		// the ports it serves.
		testutil.Must(t, EnsureIPv6(cidr, ovl4, "32768-60999"))
		nat = strings.Join(rules("nat", natChain), "\n")
		for _, proto := range []string{"tcp", "udp"} {
			if want := `-p ` + proto + ` -m comment --comment "onc: pod to outside" -j MASQUERADE --to-ports 32768-60999 --random-fully`; !strings.Contains(nat, want) {
				t.Errorf("nat %s lacks %q:\n%s", natChain, want, nat)
			}
		}
		testutil.Must(t, EnsureIPv6(cidr, ovl4, ""))
		for table, parent := range map[string]string{"nat": "POSTROUTING", "filter": "FORWARD"} {
			if r := rules(table, parent); len(r) != 2 || !strings.Contains(r[1], "-j ONC-") {
				t.Errorf("%s %s: %v, want one jump to ONC's chain first", table, parent, r)
			}
		}
		testutil.Must(t, EnsureIPv6(netip.Prefix{}, ovl4, ""))
		if r := rules("nat", natChain); len(r) != 1 {
			t.Errorf("nat %s after IPv6 went: %v", natChain, r)
		}
	})
}

// On an IPv6 underlay the overlay guard's rules and the peer host's marks
// are ip6tables' (the kernel's VXLAN socket is IPv6's), iptables' chains
// for them stay empty, and GuardDrops reads ip6tables; moved back to an
// IPv4 underlay, each family's chains swap again. An IPv6-only node has
// no IPv4 pod rules.
func TestGuardFollowsTheUnderlayFamily(t *testing.T) {
	testutil.InNewNetns(t, "nfu", func() {
		ipt4, err := newIPv4()
		testutil.Must(t, err)
		ipt6, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6))
		testutil.Must(t, err)
		count := func(ipt *iptables.IPTables, table, chain string) int {
			t.Helper()
			r, err := ipt.List(table, chain)
			testutil.Must(t, err)
			return len(r) - 1 // less the chain itself
		}
		cidr6 := netip.MustParsePrefix("fd00:10:244::/56")
		ensure := func(cidr4 netip.Prefix, ovl Overlay) {
			t.Helper()
			testutil.Must(t, Ensure(cidr4, ovl, Marking{}, ""))
			testutil.Must(t, EnsureIPv6(cidr6, ovl, ""))
		}
		ensure(netip.Prefix{}, ovl6)
		for _, c := range []struct {
			ipt          *iptables.IPTables
			table, chain string
			want         int
		}{
			{ipt6, "mangle", guardInputChain, 2}, {ipt6, "mangle", guardForwardChain, 1},
			{ipt6, "mangle", peerHostChain, 2}, {ipt6, "mangle", peerHostOutChain, 1},
			{ipt4, "mangle", guardInputChain, 0}, {ipt4, "mangle", guardForwardChain, 0},
			{ipt4, "mangle", peerHostChain, 0}, {ipt4, "nat", natChain, 0},
		} {
			if got := count(c.ipt, c.table, c.chain); got != c.want {
				t.Errorf("IPv6 underlay: %v %s %s holds %d rules, want %d", c.ipt.Proto(), c.table, c.chain, got, c.want)
			}
		}
		drops, err := GuardDrops(ovl6)
		testutil.Must(t, err)
		if len(drops) != 3 {
			t.Errorf("guard drops on an IPv6 underlay: %v, want the 3 rules' counters", drops)
		}
		if _, err := GuardDrops(ovl4); err == nil {
			t.Error("GuardDrops read an IPv4 guard that is not there")
		}
		ensure(netip.MustParsePrefix("10.244.0.0/16"), ovl4)
		for _, c := range []struct {
			ipt  *iptables.IPTables
			want int
		}{{ipt4, 2}, {ipt6, 0}} {
			if got := count(c.ipt, "mangle", guardInputChain); got != c.want {
				t.Errorf("back on IPv4: %v guard input holds %d rules, want %d", c.ipt.Proto(), got, c.want)
			}
		}
		// And without IPv6 pods as well: ip6tables is only emptied.
		ensure(netip.MustParsePrefix("10.244.0.0/16"), ovl6) // refill ip6tables' chains first
		testutil.Must(t, Ensure(netip.MustParsePrefix("10.244.0.0/16"), ovl4, Marking{}, ""))
		testutil.Must(t, EnsureIPv6(netip.Prefix{}, ovl4, ""))
		for _, chain := range []string{guardInputChain, guardForwardChain, peerHostChain, peerHostOutChain} {
			if got := count(ipt6, "mangle", chain); got != 0 {
				t.Errorf("an IPv4 node without IPv6 pods: ip6tables mangle %s holds %d rules, want none", chain, got)
			}
		}
	})
}

// The uplink load balancer's rules have an ip6tables twin for IPv6
// frontends: the masquerade of marked packets not to the node's IPv6 pods
// (every marked packet without an IPv6 pod CIDR), and the refusals with a
// TCP reset or an ICMPv6 port unreachable, in ONC's chains jumped to first.
// Idempotent; the zero value empties the chains, and on a node that never
// had them makes none.
func TestEnsureUplinkLB6(t *testing.T) {
	testutil.InNewNetns(t, "nflb6", func() {
		ipt4, err := newIPv4()
		testutil.Must(t, err)
		ipt6, err := iptables.New(iptables.IPFamily(iptables.ProtocolIPv6))
		testutil.Must(t, err)
		rules := func(ipt *iptables.IPTables, table, chain string) []string {
			t.Helper()
			r, err := ipt.List(table, chain)
			testutil.Must(t, err)
			return r
		}
		testutil.Must(t, EnsureUplinkLB(UplinkLB{}))
		for table, chain := range map[string]string{"nat": lbNATChain, "filter": lbInputChain} {
			if ok, err := ipt6.ChainExists(table, chain); err != nil || ok {
				t.Fatalf("the replacement off made ip6tables %s %s (%v)", table, chain, err)
			}
		}
		lb := UplinkLB{SNATMark: 0x80000, RejectMark: 0x100000, LocalPods: netip.MustParsePrefix("10.244.1.0/24"),
			LocalPods6: netip.MustParsePrefix("fd00:10:244:1::/64")}
		for range 2 {
			testutil.Must(t, EnsureUplinkLB(lb))
		}
		for _, c := range []struct {
			ipt          *iptables.IPTables
			table, chain string
			want         []string
		}{
			{ipt6, "nat", lbNATChain, []string{
				`-A ONC-LB-POSTROUTING ! -d fd00:10:244:1::/64 -m mark --mark 0x80000/0x80000 -m comment --comment "onc: service from outside, to another node" -j MASQUERADE --random-fully`}},
			{ipt6, "filter", lbInputChain, []string{
				`-A ONC-LB-INPUT -p tcp -m mark --mark 0x100000/0x100000 -m comment --comment "onc: service without endpoints" -j REJECT --reject-with tcp-reset`,
				`-A ONC-LB-INPUT -m mark --mark 0x100000/0x100000 -m comment --comment "onc: service without endpoints" -j REJECT --reject-with icmp6-port-unreachable`}},
			{ipt6, "filter", lbForwardChain, []string{
				`-A ONC-LB-FORWARD -p tcp -m mark --mark 0x100000/0x100000 -m comment --comment "onc: service without endpoints" -j REJECT --reject-with tcp-reset`,
				`-A ONC-LB-FORWARD -m mark --mark 0x100000/0x100000 -m comment --comment "onc: service without endpoints" -j REJECT --reject-with icmp6-port-unreachable`}},
			{ipt4, "nat", lbNATChain, []string{
				`-A ONC-LB-POSTROUTING ! -d 10.244.1.0/24 -m mark --mark 0x80000/0x80000 -m comment --comment "onc: service from outside, to another node" -j MASQUERADE --random-fully`}},
			{ipt4, "filter", lbForwardChain, []string{
				`-A ONC-LB-FORWARD -p tcp -m mark --mark 0x100000/0x100000 -m comment --comment "onc: service without endpoints" -j REJECT --reject-with tcp-reset`,
				`-A ONC-LB-FORWARD -m mark --mark 0x100000/0x100000 -m comment --comment "onc: service without endpoints" -j REJECT --reject-with icmp-port-unreachable`}},
		} {
			got := rules(c.ipt, c.table, c.chain)[1:] // less the chain itself
			if strings.Join(got, "\n") != strings.Join(c.want, "\n") {
				t.Errorf("%v %s %s:\n%s\nwant\n%s", c.ipt.Proto(), c.table, c.chain, strings.Join(got, "\n"), strings.Join(c.want, "\n"))
			}
		}
		for table, parent := range map[string]string{"nat": "POSTROUTING", "filter": "INPUT"} {
			if r := rules(ipt6, table, parent); len(r) != 2 || !strings.Contains(r[1], "-j ONC-LB-") {
				t.Errorf("ip6tables %s %s: %v, want one jump to ONC's chain first", table, parent, r)
			}
		}
		if r := rules(ipt6, "filter", "FORWARD"); len(r) != 2 || !strings.Contains(r[1], "-j "+lbForwardChain) {
			t.Errorf("ip6tables filter FORWARD: %v, want one jump to %s first", r, lbForwardChain)
		}
		// Without IPv6 pods of its own the node masquerades every marked
		// IPv6 packet.
		lb.LocalPods6 = netip.Prefix{}
		testutil.Must(t, EnsureUplinkLB(lb))
		if r := rules(ipt6, "nat", lbNATChain); len(r) != 2 || strings.Contains(r[1], "! -d") || !strings.Contains(r[1], "MASQUERADE") {
			t.Errorf("ip6tables nat %s without IPv6 pods: %v", lbNATChain, r)
		}
		testutil.Must(t, EnsureUplinkLB(UplinkLB{}))
		for _, c := range [][3]string{{"nat", lbNATChain}, {"filter", lbInputChain}, {"filter", lbForwardChain}} {
			if r := rules(ipt6, c[0], c[1]); len(r) != 1 {
				t.Errorf("ip6tables %s %s after the replacement went off: %v", c[0], c[1], r)
			}
		}
	})
}
