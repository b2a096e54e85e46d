// Package policy enforces compiled NetworkPolicy rules in the kernel: an
// nftables table whose per-pod chains judge the first packet of every
// connection to or from a local pod, conntrack revocation of connections a
// change no longer allows, and the per-pod counters onctl shows.
//
// This file is the model: what the agent's compiler (agent/policy) hands
// down, already resolved to IPs and port numbers. It knows nothing of
// Kubernetes.
package policy

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/onc-net/onc/datapath/l4"
)

// Proto is an IP protocol number a policy port can name.
type Proto = l4.Proto

// The protocols NetworkPolicy ports can name.
const (
	TCP  = l4.TCP
	UDP  = l4.UDP
	SCTP = l4.SCTP
)

// PortRange is a protocol and an inclusive port range; First == Last for
// one port, 1..65535 for every port of the protocol.
type PortRange struct {
	Proto       Proto
	First, Last uint16
}

func (r PortRange) String() string {
	switch {
	case r.First <= 1 && r.Last == 65535:
		return r.Proto.String()
	case r.First == r.Last:
		return fmt.Sprintf("%s/%d", r.Proto, r.First)
	}
	return fmt.Sprintf("%s/%d-%d", r.Proto, r.First, r.Last)
}

// Contains reports whether the range holds proto/port.
func (r PortRange) Contains(proto Proto, port uint16) bool {
	return r.Proto == proto && port >= r.First && port <= r.Last
}

// Rule allows traffic between the pod and Peers on Ports. It is one rule
// of one policy, or a part of one: a named port that resolves to different
// numbers on different peer pods splits into one Rule per number.
type Rule struct {
	Policy string         // namespace/name of the NetworkPolicy
	Index  int            // the rule's position in the policy's ingress or egress list
	Peers  []netip.Prefix // nil: no peer (the rule allows nothing)
	Ports  []PortRange    // nil: every protocol and port
}

// Allows reports whether the rule lets ip talk to the pod on proto/port
// (for ingress, the pod's port; for egress, the peer's).
func (r Rule) Allows(ip netip.Addr, proto Proto, port uint16) bool {
	if !containsAddr(r.Peers, ip) {
		return false
	}
	if r.Ports == nil {
		return true
	}
	for _, p := range r.Ports {
		if p.Contains(proto, port) {
			return true
		}
	}
	return false
}

func containsAddr(prefixes []netip.Prefix, ip netip.Addr) bool {
	for _, p := range prefixes {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// Direction is what a pod may do in one direction once isolated in it: the
// union of Rules. A pod isolated with no rules allows nothing. Around
// them, the ClusterNetworkPolicy rules that apply to the pod here judge
// first (Admin) and, if no NetworkPolicy isolates it (ClusterOnly), last
// (Baseline): Judge, tiers.go.
type Direction struct {
	Policies []string // namespace/name of every policy isolating the pod here, sorted
	Rules    []Rule
	// ClusterOnly: no NetworkPolicy isolates the pod here (Policies and
	// Rules are empty); the direction is there for its Admin and Baseline
	// rules.
	ClusterOnly bool
	// Admin and Baseline are the ClusterNetworkPolicy rules of each tier
	// that apply here, in the order they judge: by priority, then policy
	// name, then each policy's rules in its order.
	Admin, Baseline []TierRule
}

// Allows is the direction's verdict on a new connection with the peer ip.
func (d *Direction) Allows(ip netip.Addr, proto Proto, port uint16) bool {
	return d.Judge(ip, proto, port).Allowed
}

// Pod is the policy of one local pod.
type Pod struct {
	Key   string       // namespace/name
	Iface string       // host-side veth
	IPs   []netip.Addr // the pod's addresses: at most one per family
	// Ingress and Egress are nil when no policy isolates the pod in that
	// direction: then everything is allowed. They hold the enforcing
	// policies only: everything that judges, revokes or caches a verdict
	// reads them alone.
	Ingress, Egress *Direction
	// AuditIngress and AuditEgress are the audited policies selecting the
	// pod in that direction (annotation onc.io/policy-mode: audit), nil if
	// none: the table reports what they would deny (no enforcing policy
	// isolates the direction) or allow (one does), and enforces nothing
	// of theirs.
	AuditIngress, AuditEgress *Direction
}

// Has reports whether ip is one of the pod's addresses.
func (p *Pod) Has(ip netip.Addr) bool { return slices.Contains(p.IPs, ip) }

// Isolated reports whether any enforcing policy selects the pod.
func (p *Pod) Isolated() bool { return p.Ingress != nil || p.Egress != nil }

// Audited reports whether any audited policy selects the pod.
func (p *Pod) Audited() bool { return p.AuditIngress != nil || p.AuditEgress != nil }

// Ruleset is the whole desired policy state of one node: every local pod,
// isolated or not, sorted by Key.
type Ruleset struct {
	Pods []Pod
}

// Pod returns the pod with key, or nil.
func (rs *Ruleset) Pod(key string) *Pod {
	for i := range rs.Pods {
		if rs.Pods[i].Key == key {
			return &rs.Pods[i]
		}
	}
	return nil
}

// Connection is a connection as conntrack or the flow cache knows it: the
// side that opened it and the side that accepted it, after any DNAT.
type Connection struct {
	Client, Server netip.Addr
	Proto          Proto
	Port           uint16 // the server's port
}

func (c Connection) String() string {
	return fmt.Sprintf("%s %s -> %s:%d", c.Proto, c.Client, c.Server, c.Port)
}

// Allows is the ruleset's verdict on c at this node: the egress of a local
// client and the ingress of a local server must both allow it. Peers that
// are not local pods are judged by their own node.
func (rs *Ruleset) Allows(c Connection) bool {
	for i := range rs.Pods {
		p := &rs.Pods[i]
		if p.Egress != nil && p.Has(c.Client) && !p.Egress.Allows(c.Server, c.Proto, c.Port) {
			return false
		}
		if p.Ingress != nil && p.Has(c.Server) && !p.Ingress.Allows(c.Client, c.Proto, c.Port) {
			return false
		}
	}
	return true
}

// String renders a direction's rules for logs and tests.
func (d *Direction) String() string {
	if d == nil {
		return "not isolated"
	}
	var b strings.Builder
	if d.ClusterOnly {
		b.WriteString("no NetworkPolicy isolates it:")
	} else {
		fmt.Fprintf(&b, "isolated by %s:", strings.Join(d.Policies, ","))
	}
	for _, r := range d.Rules {
		fmt.Fprintf(&b, " [%s#%d peers=%v ports=%v]", r.Policy, r.Index, r.Peers, r.Ports)
	}
	for _, tier := range tierLists(d.Admin, d.Baseline) {
		for _, r := range tier.rules {
			fmt.Fprintf(&b, " [%s %s#%d", tier.tier, r.Policy, r.Index)
			if r.Name != "" {
				fmt.Fprintf(&b, " %q", r.Name)
			}
			fmt.Fprintf(&b, " priority=%d %s peers=%v ports=%v]", r.Priority, r.Action, r.Peers, r.Ports)
		}
	}
	return b.String()
}
