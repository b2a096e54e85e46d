package policy

import (
	"net/netip"
	"slices"
)

// This file compiles a direction with ClusterNetworkPolicy rules (tiers.go)
// into the same allow sets as a NetworkPolicy-only one: the chain still
// only returns what its sets hold and drops the rest, so the sets must
// hold exactly the points (peer, protocol, port) where Judge allows. The
// tiers are resolved here, over address ranges cut into atoms, rather
// than in the kernel: one lookup per set whatever the tiers, and revocation,
// the flow cache and the bypass already judge by Judge.

// portProtos are the protocols ports can name. Every other protocol
// (ICMP, ICMPv6, ...) is matched only by rules without ports, so they all
// judge alike: the other-protocols class, the set <chain>-other.
var portProtos = []Proto{TCP, UDP, SCTP}

// tierList is one tier's rules, in the order they judge.
type tierList struct {
	tier  Tier
	rules []TierRule
}

// tierLists are a direction's tiers of rules, in the order they judge.
func tierLists(admin, baseline []TierRule) []tierList {
	return []tierList{{TierAdmin, admin}, {TierBaseline, baseline}}
}

// region is a rule as the compiler reads it.
type region struct {
	peers  []addrRange // toRanges'
	ports  []PortRange // nil: every protocol and port
	tier   Tier
	action Action // of a TierRule; 0 for a NetworkPolicy rule
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

// compileDirection is d's set elements; memo, if not nil, keeps the
// ranges of peer lists across the directions of one Apply.
func compileDirection(d *Direction, memo rangeMemo) elements {
	if d.Tiered() || d.ClusterOnly {
		return compileTiers(d, memo)
	}
	return compile(d)
}

// rangeMemo is the ranges of peer lists by identity: the agent hands
// every pod a policy selects the same resolved peers, thousands of
// prefixes each, so one Apply sorts each list once.
type rangeMemo map[listID[netip.Prefix]][]addrRange

func (m rangeMemo) of(ps []netip.Prefix) []addrRange {
	if m == nil || len(ps) == 0 {
		return toRanges(ps)
	}
	id := idOf(ps)
	r, ok := m[id]
	if !ok {
		r = toRanges(ps)
		m[id] = r
	}
	return r
}

// compileTiers compiles d, with tiers, into disjoint set elements
// equivalent to d.Judge. It cuts the addresses into atoms, ranges inside
// which no rule's peers begin or end, and judges each distinct sequence
// of rules an atom lies in once, for every port class at once (a bit
// per class): the cost follows how many rules each peer meets, not
// classes × rules × addresses. The peers every class allows go to all,
// the rest to ports (per protocol, merged over neighbouring segments)
// and other.
func compileTiers(d *Direction, memo rangeMemo) elements {
	// The rules Judge can reach, in the order it walks them.
	var rules []region
	add := func(tier Tier, action Action, peers []netip.Prefix, ports []PortRange) {
		rules = append(rules, region{memo.of(peers), judgedPorts(ports), tier, action})
	}
	for _, r := range d.Admin {
		add(TierAdmin, r.Action, r.Peers, r.Ports)
	}
	if d.ClusterOnly {
		for _, r := range d.Baseline {
			add(TierBaseline, r.Action, r.Peers, r.Ports)
		}
	} else {
		for _, r := range d.Rules {
			add(TierNetworkPolicy, 0, r.Peers, r.Ports)
		}
	}

	classes := portClasses(rules)
	cover := make([]classSet, len(rules))
	for i, r := range rules {
		cover[i] = newClassSet(len(classes))
		for k, c := range classes {
			if c.matches(r.ports) {
				cover[i].add(k)
			}
		}
	}
	// Rules often share their peers (the same list, from one memo): each
	// distinct list is cut, and found among the atoms, once.
	var lists [][]addrRange
	listOf := make([]int, len(rules)) // index into lists; -1: no peers
	index := map[listID[addrRange]]int{}
	for i, r := range rules {
		listOf[i] = -1
		if len(r.peers) == 0 {
			continue
		}
		k, ok := index[idOf(r.peers)]
		if !ok {
			k = len(lists)
			index[idOf(r.peers)] = k
			lists = append(lists, r.peers)
		}
		listOf[i] = k
	}
	atoms, spans := cutAtoms(lists)
	met := make([][]int32, len(atoms)) // the rules each atom lies in, in order
	for i, k := range listOf {
		if k < 0 {
			continue
		}
		for _, span := range spans[k] {
			for a := span[0]; a <= span[1]; a++ {
				met[a] = append(met[a], int32(i))
			}
		}
	}
	// Each distinct sequence is judged once.
	verdicts := map[string]classSet{}
	allowed := make([]classSet, len(atoms))
	var key []byte
	for a, seq := range met {
		key = key[:0]
		for _, i := range seq {
			key = append(key, byte(i), byte(i>>8), byte(i>>16), byte(i>>24))
		}
		v, ok := verdicts[string(key)]
		if !ok {
			v = judgeClasses(rules, cover, seq, len(classes), d.ClusterOnly)
			verdicts[string(key)] = v
		}
		allowed[a] = v
	}

	everywhere := make([]bool, len(atoms))
	for a, v := range allowed {
		everywhere[a] = v.full(len(classes))
	}
	// The atoms where pick holds, as the fewest ranges.
	ranges := func(pick func(a int) bool) []addrRange {
		var out []addrRange
		for a := range atoms {
			if !pick(a) {
				continue
			}
			r := addrRange{atoms[a], atoms.last(a)}
			if n := len(out); n > 0 && out[n-1].last.Next() == r.first {
				out[n-1].last = r.last
				continue
			}
			out = append(out, r)
		}
		return out
	}
	el := elements{
		all:   ranges(func(a int) bool { return everywhere[a] }),
		other: ranges(func(a int) bool { return allowed[a].has(0) && !everywhere[a] }),
	}
	for _, proto := range portProtos {
		var segments []portSegment
		for k, c := range classes {
			if c.proto == proto {
				segments = append(segments, portSegment{c.first, c.last, ranges(func(a int) bool { return allowed[a].has(k) && !everywhere[a] })})
			}
		}
		el.ports = appendRuns(el.ports, proto, segments)
	}
	el.has6 = el.anyIPv6()
	return el
}

// portClasses are the other protocols (class 0) and, per protocol ports
// can name, the segments of 0-65535 the rules' port ranges cut.
func portClasses(rules []region) []class {
	classes := []class{{}}
	for _, proto := range portProtos {
		cuts := []uint32{0, 65536}
		for _, r := range rules {
			for _, pr := range r.ports {
				if pr.Proto == proto && pr.First <= pr.Last {
					cuts = append(cuts, uint32(pr.First), uint32(pr.Last)+1)
				}
			}
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		for i := 0; i+1 < len(cuts); i++ {
			classes = append(classes, class{proto, uint16(cuts[i]), uint16(cuts[i+1] - 1)})
		}
	}
	return classes
}

// judgeClasses is, per class, whether Judge allows a peer that lies in
// the rules seq (indices into rules, in order) and in no other, walking
// the tiers as Judge does: the Admin rules take the classes they match
// (Pass hands them to NetworkPolicy); then the NetworkPolicy rules'
// classes if they isolate, else the Baseline rules likewise, and what no
// rule took is allowed.
func judgeClasses(rules []region, cover []classSet, seq []int32, n int, clusterOnly bool) classSet {
	allowed, passed, undecided := newClassSet(n), newClassSet(n), newClassSet(n)
	for k := 0; k < n; k++ {
		undecided.add(k)
	}
	i := 0
	for ; i < len(seq) && rules[seq[i]].tier == TierAdmin; i++ {
		m := undecided.and(cover[seq[i]])
		switch rules[seq[i]].action {
		case Pass:
			passed.or(m)
		case Deny:
		default:
			allowed.or(m)
		}
		undecided.andNot(m)
	}
	undecided.or(passed)
	if !clusterOnly {
		np := newClassSet(n)
		for ; i < len(seq); i++ {
			np.or(cover[seq[i]])
		}
		allowed.or(undecided.and(np))
		return allowed
	}
	for ; i < len(seq); i++ {
		m := undecided.and(cover[seq[i]])
		if rules[seq[i]].action != Deny {
			allowed.or(m)
		}
		undecided.andNot(m)
	}
	allowed.or(undecided)
	return allowed
}

// classSet is a set of classes, by index.
type classSet []uint64

func newClassSet(n int) classSet  { return make(classSet, (n+63)/64) }
func (s classSet) add(k int)      { s[k/64] |= 1 << (k % 64) }
func (s classSet) has(k int) bool { return s[k/64]&(1<<(k%64)) != 0 }

// full reports whether s holds all n classes.
func (s classSet) full(n int) bool {
	for k := 0; k < n; k++ {
		if !s.has(k) {
			return false
		}
	}
	return true
}

func (s classSet) and(o classSet) classSet {
	out := make(classSet, len(s))
	for i := range s {
		out[i] = s[i] & o[i]
	}
	return out
}

func (s classSet) or(o classSet) {
	for i := range s {
		s[i] |= o[i]
	}
}

func (s classSet) andNot(o classSet) {
	for i := range s {
		s[i] &^= o[i]
	}
}

// atoms are the first addresses of ranges that tile both families, cut
// wherever a rule's peers begin or end: a peer range is a run of whole
// atoms.
type atoms []netip.Addr

// cutAtoms cuts both families wherever a range of lists begins or ends,
// and gives each list's ranges as spans of atoms, first to last.
func cutAtoms(lists [][]addrRange) (atoms, [][][2]int) {
	cuts := []netip.Addr{netip.IPv4Unspecified(), netip.IPv6Unspecified()}
	for _, list := range lists {
		for _, pr := range list {
			cuts = append(cuts, pr.first)
			if next := pr.last.Next(); next.IsValid() {
				cuts = append(cuts, next)
			}
		}
	}
	slices.SortFunc(cuts, netip.Addr.Compare)
	as := atoms(slices.Compact(cuts))
	spans := make([][][2]int, len(lists))
	for k, list := range lists {
		spans[k] = make([][2]int, 0, len(list))
		a := 0
		for _, pr := range list {
			a += as[a:].index(pr.first)
			first := a
			for a+1 < len(as) && !pr.last.Less(as[a+1]) {
				a++
			}
			spans[k] = append(spans[k], [2]int{first, a})
		}
	}
	return as, spans
}

// index is the atom that begins at first, a cut.
func (as atoms) index(first netip.Addr) int {
	i, _ := slices.BinarySearchFunc(as, first, netip.Addr.Compare)
	return i
}

// last is atom a's last address: before the next atom's first, or its
// family's last.
func (as atoms) last(a int) netip.Addr {
	if a+1 < len(as) && as[a+1].Is4() == as[a].Is4() {
		return as[a+1].Prev()
	}
	if as[a].Is4() {
		return lastIPv4
	}
	return lastIPv6
}

var (
	lastIPv4 = netip.AddrFrom4([4]byte{255, 255, 255, 255})
	lastIPv6 = netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
)

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

// Sets of addresses here are sorted lists of disjoint ranges, none next
// to another: the fewest ranges (of both families: an IPv4
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
