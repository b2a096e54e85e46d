package policy

import (
	"net/netip"
	"slices"
)

// This file compiles a direction with ClusterNetworkPolicy rules (tiers.go)
// into the same allow sets as a NetworkPolicy-only one: the chain still
// only returns what its sets hold and drops the rest, so the sets must
// hold exactly the points (peer, protocol, port) where Judge allows. The
// tiers are resolved here, by set algebra on address ranges, rather than
// in the kernel: one lookup per set whatever the tiers, and revocation,
// the flow cache and the bypass already judge by Judge.

// portProtos are the protocols ports can name. Every other protocol
// (ICMP, ICMPv6, ...) is matched only by rules without ports, so they all
// judge alike: the other-protocols class, the set <chain>-other.
var portProtos = []Proto{TCP, UDP, SCTP}

// universe is every address of both families.
var universe = toRanges([]netip.Prefix{netip.PrefixFrom(netip.IPv4Unspecified(), 0), netip.PrefixFrom(netip.IPv6Unspecified(), 0)})

// tierList is one tier's rules, in the order they judge.
type tierList struct {
	tier  Tier
	rules []TierRule
}

// tierLists are a direction's tiers of rules, in the order they judge.
func tierLists(admin, baseline []TierRule) []tierList {
	return []tierList{{TierAdmin, admin}, {TierBaseline, baseline}}
}

// region is a rule as the algebra reads it.
type region struct {
	peers  []addrRange // toRanges'
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
			out[i] = region{toRanges(r.Peers), judgedPorts(r.Ports), r.Action}
		}
		return out
	}
	admin, baseline := regions(d.Admin), regions(d.Baseline)
	np := make([]region, len(d.Rules))
	for i, r := range d.Rules {
		np[i] = region{peers: toRanges(r.Peers), ports: judgedPorts(r.Ports)}
	}
	allowed := func(c class) []addrRange {
		return judgeRegion(admin, np, baseline, d.ClusterOnly, c)
	}

	type segment struct {
		class
		allowed []addrRange
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
		var run []addrRange
		var runFirst, runLast uint16
		flush := func() {
			for _, r := range run {
				el.ports = append(el.ports, portElem{r, proto, runFirst, runLast})
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
	el.has6 = slices.ContainsFunc(el.all, addrRange.is6) || slices.ContainsFunc(el.other, addrRange.is6) ||
		slices.ContainsFunc(el.ports, func(e portElem) bool { return e.peer.is6() })
	return el
}

// judgedPorts are ports as Judge reads them where tiers apply, port 0
// judged as port 1 (tiers.go): a range holding 1 holds 0 too, and one of
// port 0 alone holds nothing. So no boundary falls between 0 and 1, and
// port 0 makes no segment of its own, with its own elements, beside the
// 1-65535 of every rule naming a protocol alone.
func judgedPorts(ports []PortRange) []PortRange {
	if ports == nil {
		return nil
	}
	out := make([]PortRange, len(ports))
	for i, pr := range ports {
		switch {
		case pr.First <= 1 && 1 <= pr.Last:
			pr.First = 0
		case pr.First == 0:
			pr.First, pr.Last = 1, 0 // empty
		}
		out[i] = pr
	}
	return out
}

// judgeRegion is the region of peers Judge allows in class c, walking the
// tiers as Judge does, over every peer at once: the Admin rules take what
// they match (Pass hands it to NetworkPolicy); then the NetworkPolicy
// rules' union if they isolate, else the Baseline rules likewise, and
// what no rule took is allowed.
func judgeRegion(admin, np, baseline []region, clusterOnly bool, c class) []addrRange {
	allowed, passed, remaining := firstMatches(admin, c, universe)
	remaining = union(remaining, passed)
	if !clusterOnly {
		var peers []addrRange
		for _, r := range np {
			if c.matches(r.ports) {
				peers = append(peers, r.peers...)
			}
		}
		return union(allowed, intersect(remaining, union(peers)))
	}
	accepted, passed, remaining := firstMatches(baseline, c, remaining)
	return union(allowed, accepted, passed, remaining)
}

// firstMatches walks one tier's rules in order over the peers from: each
// rule of class c takes what is left of its peers, Accept's into
// accepted, Pass's into passed, Deny's nowhere; left is what none took.
func firstMatches(rules []region, c class, from []addrRange) (accepted, passed, left []addrRange) {
	left = from
	for _, r := range rules {
		if !c.matches(r.ports) {
			continue
		}
		m := intersect(left, r.peers)
		switch r.action {
		case Pass:
			passed = append(passed, m...)
		case Deny:
		default:
			accepted = append(accepted, m...)
		}
		left = subtract(left, m)
	}
	return accepted, passed, left
}

// The algebra's sets of addresses are sorted lists of disjoint ranges,
// none next to another: the fewest ranges (of both families: an IPv4
// range never runs into IPv6, Next keeps the family).

// toRanges is the addresses of ps (the valid ones, masked).
func toRanges(ps []netip.Prefix) []addrRange {
	return union(prefixRanges(masked(ps)))
}

// union is the addresses any of the lists of ranges holds.
func union(lists ...[]addrRange) []addrRange {
	all := slices.Concat(lists...)
	slices.SortFunc(all, func(a, b addrRange) int { return a.first.Compare(b.first) })
	var out []addrRange
	for _, r := range all {
		n := len(out)
		if n == 0 || out[n-1].last.Less(r.first) && out[n-1].last.Next() != r.first {
			out = append(out, r)
			continue
		}
		if out[n-1].last.Less(r.last) {
			out[n-1].last = r.last
		}
	}
	return out
}

// intersect is the addresses both a and b hold.
func intersect(a, b []addrRange) []addrRange {
	var out []addrRange
	for i, j := 0, 0; i < len(a) && j < len(b); {
		p, q := a[i], b[j]
		if p.Overlaps(q) {
			out = append(out, addrRange{maxAddr(p.first, q.first), minAddr(p.last, q.last)})
		}
		// The one ending first overlaps nothing further on.
		if p.last.Less(q.last) {
			i++
		} else {
			j++
		}
	}
	return out
}

// subtract is the addresses of a that b does not hold.
func subtract(a, b []addrRange) []addrRange {
	var out []addrRange
	j := 0
	for _, p := range a {
		// b's ranges before p are before every later one too.
		for j < len(b) && b[j].last.Less(p.first) {
			j++
		}
		next := p.first // the first address of p b may not hold
		covered := false
		for k := j; k < len(b) && !p.last.Less(b[k].first); k++ {
			if next.Less(b[k].first) {
				out = append(out, addrRange{next, b[k].first.Prev()})
			}
			if !b[k].last.Less(p.last) {
				covered = true // also when b[k] ends at the family's last address
				break
			}
			next = b[k].last.Next()
		}
		if !covered {
			out = append(out, addrRange{next, p.last})
		}
	}
	return out
}

func maxAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return b
	}
	return a
}

func minAddr(a, b netip.Addr) netip.Addr {
	if a.Less(b) {
		return a
	}
	return b
}
