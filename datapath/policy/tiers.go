package policy

import (
	"net/netip"
	"slices"
)

// This file is the model of ClusterNetworkPolicy (policy.networking.k8s.io):
// rules in two tiers around NetworkPolicy. A direction's verdict on a new
// connection is the first matching rule of the Admin tier; if none
// matches, or it says Pass, the pod's NetworkPolicies decide if any
// isolates the pod in that direction; if none does, the first matching
// rule of the Baseline tier; if none matches (or it says Pass), the
// connection is allowed.

// Tier is where a ClusterNetworkPolicy's rules are judged: Admin before
// NetworkPolicy, Baseline after it. The zero Tier is NetworkPolicy's own.
type Tier uint8

// The tiers, in the order they judge.
const (
	TierNetworkPolicy Tier = iota
	TierAdmin
	TierBaseline
)

func (t Tier) String() string {
	switch t {
	case TierAdmin:
		return "Admin"
	case TierBaseline:
		return "Baseline"
	}
	return "NetworkPolicy"
}

// Action is what a matching ClusterNetworkPolicy rule does.
type Action uint8

// The actions. Pass hands the decision to the next tier.
const (
	Accept Action = iota + 1
	Deny
	Pass
)

func (a Action) String() string {
	switch a {
	case Accept:
		return "Accept"
	case Deny:
		return "Deny"
	case Pass:
		return "Pass"
	}
	return "?"
}

// TierRule is one rule of one ClusterNetworkPolicy as it applies to one
// pod in one direction, resolved to prefixes and port numbers: a named
// port that resolves to different numbers on different peers splits into
// one TierRule per number, as Rule does.
type TierRule struct {
	Policy   string // the ClusterNetworkPolicy's name (cluster-scoped)
	Priority int32  // within its tier: lower judges first
	Index    int    // the rule's position in the policy's ingress or egress list
	Name     string // the rule's name, if it has one
	Action   Action
	Peers    []netip.Prefix // nil: no peer (the rule matches nothing)
	Ports    []PortRange    // nil: every protocol and port
}

// EqualTierRules reports whether a and b are the same rules, cheaply
// where their peers are the very same lists (as a compiler that reuses a
// policy's resolved peers hands them).
func EqualTierRules(a, b []TierRule) bool {
	return identical(a, b) || slices.EqualFunc(a, b, func(a, b TierRule) bool {
		return a.Policy == b.Policy && a.Priority == b.Priority && a.Index == b.Index && a.Name == b.Name && a.Action == b.Action &&
			sameRule(Rule{Peers: a.Peers, Ports: a.Ports}, Rule{Peers: b.Peers, Ports: b.Ports})
	})
}

// Matches reports whether the rule is about a connection with the peer ip
// on proto/port (the pod's port for ingress, the peer's for egress).
func (r TierRule) Matches(ip netip.Addr, proto Proto, port uint16) bool {
	return Rule{Peers: r.Peers, Ports: r.Ports}.Allows(ip, proto, port)
}

// Verdict is a direction's decision on a new connection and what made it.
type Verdict struct {
	Allowed bool
	// Tier is the tier that decided: TierNetworkPolicy when a
	// NetworkPolicy rule allowed, when the isolation's default denied, or
	// when nothing matched at all (allowed, Policy empty).
	Tier Tier
	// Policy and Index name the deciding rule (a NetworkPolicy's
	// namespace/name or a ClusterNetworkPolicy's name); Policy is empty
	// when no rule decided (the default of NetworkPolicy isolation, or of
	// no isolation).
	Policy string
	Index  int
	// Name and Action are the deciding ClusterNetworkPolicy rule's; a Pass
	// of the Baseline tier allows (nothing after it judges).
	Name   string
	Action Action
	// Passed names the Admin rule that passed the decision on, if one
	// did.
	Passed *TierRule
}

// Tiered reports whether any ClusterNetworkPolicy rule applies to d.
func (d *Direction) Tiered() bool { return len(d.Admin) > 0 || len(d.Baseline) > 0 }

// Judge is d's verdict on a new connection with the peer ip on proto/port,
// tier by tier (see the top of this file).
func (d *Direction) Judge(ip netip.Addr, proto Proto, port uint16) Verdict {
	if d.Tiered() {
		// Port 0, which no rule can name (the API's ports are 1-65535),
		// judges as port 1: so the compiled sets need no segment for it
		// (judgedPorts). Without tiers, the sets are compile's, as
		// ever, and port 0 is judged as itself.
		port = max(port, 1)
	}
	var passed *TierRule
	for i := range d.Admin {
		r := &d.Admin[i]
		if !r.Matches(ip, proto, port) {
			continue
		}
		if r.Action != Pass {
			return tierVerdict(TierAdmin, r)
		}
		passed = r
		break
	}
	if !d.ClusterOnly {
		for _, r := range d.Rules {
			if r.Allows(ip, proto, port) {
				return Verdict{Allowed: true, Policy: r.Policy, Index: r.Index, Passed: passed}
			}
		}
		return Verdict{Passed: passed}
	}
	for i := range d.Baseline {
		r := &d.Baseline[i]
		if r.Matches(ip, proto, port) {
			v := tierVerdict(TierBaseline, r)
			v.Passed = passed
			return v
		}
	}
	return Verdict{Allowed: true, Passed: passed}
}

func tierVerdict(t Tier, r *TierRule) Verdict {
	return Verdict{Allowed: r.Action != Deny, Tier: t, Policy: r.Policy, Index: r.Index, Name: r.Name, Action: r.Action}
}
