package policy

import (
	"net/netip"
	"slices"

	"github.com/onc-net/onc/internal/netaddr"
)

// This file compiles a direction with ClusterNetworkPolicy rules (tiers.go)
// into the same allow sets as a NetworkPolicy-only one: the chain still
// only returns what its sets hold and drops the rest, so the sets must
// hold exactly the points (peer, protocol, port) where Judge allows. The
// tiers are resolved here, by set algebra on prefixes, rather than in the
// kernel: one lookup per set whatever the tiers, and revocation, the flow
// cache and the bypass already judge by Judge.

// portProtos are the protocols ports can name. Every other protocol
// (ICMP, ICMPv6, ...) is matched only by rules without ports, so they all
// judge alike: the other-protocols class, the set <chain>-other.
var portProtos = []Proto{TCP, UDP, SCTP}

// universe is every address of both families.
var universe = []netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 0), netip.PrefixFrom(netip.IPv6Unspecified(), 0)}

// tierList is one tier's rules, in the order they judge.
type tierList struct {
	tier  Tier
	rules []TierRule
}

// tierLists are a direction's tiers of rules, in the order they judge.
func tierLists(admin, baseline []TierRule) []tierList {
	return []tierList{{TierAdmin, admin}, {TierBaseline, baseline}}
}

// region is a rule as the algebra reads it (a tier rule's peers disjoint).
type region struct {
	peers  []netip.Prefix
	ports  []PortRange // nil: every protocol and port
	action Action      // of a TierRule; 0 for a NetworkPolicy rule
}

// class is a protocol's port segment, inside or outside every rule's
// ranges, or with proto 0 the other protocols.
type class struct {
	proto       Proto
	first, last uint16
}

// matches reports whether a rule with ports judges the connections of c.
func (c class) matches(ports []PortRange) bool {
	if ports == nil {
		return true
	}
	for _, p := range ports {
		if c.proto != 0 && p.Proto == c.proto && p.First <= c.first && c.last <= p.Last {
			return true
		}
	}
	return false
}

// compileDirection is d's set elements.
func compileDirection(d *Direction) elements {
	if d.Tiered() || d.ClusterOnly {
		return compileTiers(d)
	}
	return compile(d)
}

// compileTiers compiles d, with tiers, into disjoint set elements
// equivalent to d.Judge: per class, the region Judge allows; the peers
// every class allows go to all, the rest to ports (per protocol, merged
// over neighbouring segments) and other.
func compileTiers(d *Direction) elements {
	regions := func(rules []TierRule) []region {
		out := make([]region, len(rules))
		for i, r := range rules {
			out[i] = region{disjoint(masked(r.Peers)), r.Ports, r.Action}
		}
		return out
	}
	admin, baseline := regions(d.Admin), regions(d.Baseline)
	np := make([]region, len(d.Rules))
	for i, r := range d.Rules {
		np[i] = region{peers: masked(r.Peers), ports: r.Ports}
	}
	allowed := func(c class) []netip.Prefix {
		return judgeRegion(admin, np, baseline, d.ClusterOnly, c)
	}

	type segment struct {
		class
		allowed []netip.Prefix
	}
	other := allowed(class{})
	all := other
	segments := map[Proto][]segment{}
	for _, proto := range portProtos {
		cuts := []uint32{0, 65536}
		for _, rules := range [][]region{admin, np, baseline} {
			for _, r := range rules {
				for _, pr := range r.ports {
					if pr.Proto == proto && pr.First <= pr.Last {
						cuts = append(cuts, uint32(pr.First), uint32(pr.Last)+1)
					}
				}
			}
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		for i := 0; i+1 < len(cuts); i++ {
			c := class{proto, uint16(cuts[i]), uint16(cuts[i+1] - 1)}
			segments[proto] = append(segments[proto], segment{c, allowed(c)})
			all = intersect(all, segments[proto][i].allowed)
		}
	}

	el := elements{all: all, other: subtract(other, all)}
	for _, proto := range portProtos {
		// Neighbouring segments with the same peers become one range.
		var run []netip.Prefix
		var runFirst, runLast uint16
		flush := func() {
			for _, p := range run {
				el.ports = append(el.ports, portElem{p, proto, runFirst, runLast})
			}
		}
		for i, s := range segments[proto] {
			peers := subtract(s.allowed, all)
			if i > 0 && slices.Equal(run, peers) {
				runLast = s.last
				continue
			}
			flush()
			run, runFirst, runLast = peers, s.first, s.last
		}
		flush()
	}
	is6 := func(p netip.Prefix) bool { return p.Addr().Is6() }
	el.has6 = slices.ContainsFunc(el.all, is6) || slices.ContainsFunc(el.other, is6) ||
		slices.ContainsFunc(el.ports, func(e portElem) bool { return is6(e.peer) })
	return el
}

// judgeRegion is the region of peers Judge allows in class c, walking the
// tiers as Judge does, over every peer at once: each Admin rule takes what
// is left of its peers (Pass hands them to NetworkPolicy); then the
// NetworkPolicy rules' union if they isolate, else the Baseline rules
// likewise, and what no rule took is allowed.
func judgeRegion(admin, np, baseline []region, clusterOnly bool, c class) []netip.Prefix {
	remaining := universe
	var allowed, passed []netip.Prefix
	for _, r := range admin {
		if !c.matches(r.ports) {
			continue
		}
		m := intersect(remaining, r.peers)
		switch r.action {
		case Pass:
			passed = append(passed, m...)
		case Deny:
		default:
			allowed = append(allowed, m...)
		}
		remaining = subtract(remaining, m)
	}
	remaining = disjoint(slices.Concat(remaining, passed))
	if !clusterOnly {
		var peers []netip.Prefix
		for _, r := range np {
			if c.matches(r.ports) {
				peers = append(peers, r.peers...)
			}
		}
		return disjoint(append(allowed, intersect(remaining, disjoint(peers))...))
	}
	for _, r := range baseline {
		if !c.matches(r.ports) {
			continue
		}
		m := intersect(remaining, r.peers)
		if r.action != Deny {
			allowed = append(allowed, m...)
		}
		remaining = subtract(remaining, m)
	}
	return disjoint(append(allowed, remaining...))
}

// intersect is the addresses both a and b hold, both sorted lists of
// disjoint prefixes (disjoint's), as one.
func intersect(a, b []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for i, j := 0, 0; i < len(a) && j < len(b); {
		p, q := a[i], b[j]
		switch {
		case p.Overlaps(q):
			// One contains the other: the smaller is in both.
			if p.Bits() >= q.Bits() {
				out = append(out, p)
				i++
			} else {
				out = append(out, q)
				j++
			}
		case p.Addr().Less(q.Addr()):
			i++
		default:
			j++
		}
	}
	return out
}

// subtract is the addresses of a that b does not hold, both sorted lists
// of disjoint prefixes, as one.
func subtract(a, b []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	j := 0
	for _, p := range a {
		// b's prefixes before p are before every later one too.
		for j < len(b) && !b[j].Overlaps(p) && b[j].Addr().Less(p.Addr()) {
			j++
		}
		var inside []netip.Prefix
		covered := false
		for k := j; k < len(b) && b[k].Overlaps(p); k++ {
			if b[k].Bits() <= p.Bits() {
				covered = true
				break
			}
			inside = append(inside, b[k])
		}
		if !covered {
			out = cut(p, inside, out)
		}
	}
	return out
}

// cut appends to out p without inside, sorted disjoint prefixes within p:
// the halves of p, each without what it holds of inside.
func cut(p netip.Prefix, inside []netip.Prefix, out []netip.Prefix) []netip.Prefix {
	switch {
	case len(inside) == 0:
		return append(out, p)
	case inside[0] == p:
		return out
	}
	lo := netip.PrefixFrom(p.Addr(), p.Bits()+1)
	hi := netip.PrefixFrom(netaddr.Last(lo).Next(), p.Bits()+1)
	n := 0
	for n < len(inside) && lo.Contains(inside[n].Addr()) {
		n++
	}
	return cut(hi, inside[n:], cut(lo, inside[:n], out))
}
