package policy

import (
	"net/netip"
	"testing"
)

// tierRule is a ClusterNetworkPolicy rule of policy on peers and ports.
func tierRule(policy string, action Action, peers []netip.Prefix, ports ...PortRange) TierRule {
	return TierRule{Policy: policy, Action: action, Peers: peers, Ports: ports}
}

// Judge is the reference of every verdict on tiers: each semantic of the
// Admin and Baseline tiers around NetworkPolicy, as
// ClusterNetworkPolicy defines them.
func TestJudge(t *testing.T) {
	a, c := netip.MustParseAddr("10.1.0.1"), netip.MustParseAddr("10.1.0.3")
	a6 := netip.MustParseAddr("fd00::1")
	aNet, wide := prefixes("10.1.0.1/32", "fd00::1/128"), prefixes("10.1.0.0/16")
	withPorts := func(r TierRule, ports ...PortRange) TierRule { r.Ports = ports; return r }
	npAllowsA := Rule{Policy: "ns/np", Peers: aNet}
	const icmp, icmp6 Proto = 1, 58
	cases := []struct {
		name   string
		d      Direction
		peer   netip.Addr
		proto  Proto
		port   uint16
		want   Verdict
		passed bool // Verdict.Passed is set
	}{
		{"admin deny over an NetworkPolicy allow",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{tierRule("deny-a", Deny, aNet)}},
			a, TCP, 80, Verdict{Tier: TierAdmin, Policy: "deny-a", Action: Deny}, false},
		{"admin deny over a NetworkPolicy allow, IPv6",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{tierRule("deny-a", Deny, aNet)}},
			a6, UDP, 53, Verdict{Tier: TierAdmin, Policy: "deny-a", Action: Deny}, false},
		{"admin pass: the NetworkPolicy allows",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{tierRule("pass", Pass, wide), tierRule("deny", Deny, wide)}},
			a, TCP, 80, Verdict{Allowed: true, Policy: "ns/np"}, true},
		{"admin pass: the NetworkPolicy's default deny",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{tierRule("pass", Pass, wide)}},
			c, TCP, 80, Verdict{}, true},
		{"admin accept over a NetworkPolicy default deny",
			Direction{Policies: []string{"ns/deny"}, Admin: []TierRule{tierRule("ok", Accept, wide)}},
			c, TCP, 80, Verdict{Allowed: true, Tier: TierAdmin, Policy: "ok", Action: Accept}, false},
		{"no admin match: the NetworkPolicy decides, not the baseline",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{tierRule("deny-c", Deny, prefixes("10.1.0.3/32"))},
				Baseline: []TierRule{tierRule("base-deny", Deny, wide)}},
			a, TCP, 80, Verdict{Allowed: true, Policy: "ns/np"}, false},
		{"baseline ignored where a NetworkPolicy isolates",
			Direction{Policies: []string{"ns/deny"}, Baseline: []TierRule{tierRule("base-ok", Accept, wide)}},
			c, TCP, 80, Verdict{}, false},
		{"baseline deny when only cluster policies apply",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("base-deny", Deny, wide)}},
			c, TCP, 80, Verdict{Tier: TierBaseline, Policy: "base-deny", Action: Deny}, false},
		{"baseline pass allows",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("base-pass", Pass, wide), tierRule("base-deny", Deny, wide)}},
			c, TCP, 80, Verdict{Allowed: true, Tier: TierBaseline, Policy: "base-pass", Action: Pass}, false},
		{"baseline accept",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("base-ok", Accept, aNet), tierRule("base-deny", Deny, wide)}},
			a, UDP, 53, Verdict{Allowed: true, Tier: TierBaseline, Policy: "base-ok", Action: Accept}, false},
		{"admin pass to the baseline when only cluster policies apply",
			Direction{ClusterOnly: true, Admin: []TierRule{tierRule("pass", Pass, wide)}, Baseline: []TierRule{tierRule("base-deny", Deny, wide)}},
			a, TCP, 80, Verdict{Tier: TierBaseline, Policy: "base-deny", Action: Deny}, true},
		{"no match at all allows",
			Direction{ClusterOnly: true, Admin: []TierRule{tierRule("deny-c", Deny, prefixes("10.1.0.3/32"))}, Baseline: []TierRule{tierRule("base-deny", Deny, prefixes("10.2.0.0/16"))}},
			a, TCP, 80, Verdict{Allowed: true}, false},
		{"order within the admin tier: the first match decides",
			Direction{Policies: []string{"ns/deny"}, Admin: []TierRule{tierRule("first", Accept, aNet), tierRule("second", Deny, wide)}},
			a, TCP, 80, Verdict{Allowed: true, Tier: TierAdmin, Policy: "first", Action: Accept}, false},
		{"order within the admin tier: a deny first",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{tierRule("first", Deny, wide), tierRule("second", Accept, aNet)}},
			a, TCP, 80, Verdict{Tier: TierAdmin, Policy: "first", Action: Deny}, false},
		{"order within the baseline tier",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("first", Deny, aNet), tierRule("second", Accept, wide)}},
			a, TCP, 80, Verdict{Tier: TierBaseline, Policy: "first", Action: Deny}, false},
		{"a rule with ports does not match ICMP",
			Direction{ClusterOnly: true, Baseline: []TierRule{withPorts(tierRule("deny-tcp", Deny, wide), PortRange{TCP, 1, 65535})}},
			a, icmp, 0, Verdict{Allowed: true}, false},
		{"a rule with ports does not match ICMPv6",
			Direction{Policies: []string{"ns/deny"}, Admin: []TierRule{withPorts(tierRule("ok-tcp", Accept, aNet), PortRange{TCP, 0, 65535})}},
			a6, icmp6, 0, Verdict{}, false},
		{"a rule without ports matches ICMP",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("deny", Deny, wide)}},
			a, icmp, 0, Verdict{Tier: TierBaseline, Policy: "deny", Action: Deny}, false},
		{"a rule's ports: outside them it does not match",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{withPorts(tierRule("deny-80", Deny, aNet), PortRange{TCP, 80, 80})}},
			a, TCP, 81, Verdict{Allowed: true, Policy: "ns/np"}, false},
		{"a rule's ports: another protocol does not match",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{npAllowsA}, Admin: []TierRule{withPorts(tierRule("deny-80", Deny, aNet), PortRange{TCP, 80, 80})}},
			a, UDP, 80, Verdict{Allowed: true, Policy: "ns/np"}, false},
		{"port 0 judges as port 1: a rule naming the protocol alone matches it",
			Direction{ClusterOnly: true, Baseline: []TierRule{withPorts(tierRule("deny-tcp", Deny, wide), PortRange{TCP, 1, 65535})}},
			a, TCP, 0, Verdict{Tier: TierBaseline, Policy: "deny-tcp", Action: Deny}, false},
		{"port 0 judges as port 1: a NetworkPolicy's range from 2 does not match it",
			Direction{Policies: []string{"ns/np"}, Rules: []Rule{{Policy: "ns/np", Peers: aNet, Ports: []PortRange{{TCP, 2, 80}}}}, Admin: []TierRule{tierRule("deny-c", Deny, prefixes("10.1.0.3/32"))}},
			a, TCP, 0, Verdict{}, false},
		{"no peers matches nothing",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("nobody", Deny, nil)}},
			a, TCP, 80, Verdict{Allowed: true}, false},
		{"an IPv4 rule does not match IPv6",
			Direction{ClusterOnly: true, Baseline: []TierRule{tierRule("deny4", Deny, prefixes("0.0.0.0/0"))}},
			a6, TCP, 80, Verdict{Allowed: true}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.d.Judge(tc.peer, tc.proto, tc.port)
			if (got.Passed != nil) != tc.passed {
				t.Errorf("Passed %v, want passed=%v", got.Passed, tc.passed)
			}
			got.Passed = nil
			if got != tc.want {
				t.Errorf("Judge(%s, %s/%d) = %+v, want %+v\n%s", tc.peer, tc.proto, tc.port, got, tc.want, &tc.d)
			}
			if tc.d.Allows(tc.peer, tc.proto, tc.port) != tc.want.Allowed {
				t.Error("Allows disagrees with Judge")
			}
		})
	}
}
