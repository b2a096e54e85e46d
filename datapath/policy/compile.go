package policy

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"strconv"

	"github.com/onc-net/onc/internal/netaddr"
)

// elements are a Direction's rules as the contents of its nft sets: per
// family, one of peers, one of peer, protocol and port, and, for a
// direction with tiers (tiercompile.go), one of peers allowed on the
// protocols without ports. nft rejects overlapping elements (pipapo and
// the interval sets alike), so each list is disjoint: no address (or
// address, protocol and port) is in two elements. Each holds either
// family; the Enforcer puts each element in its family's set.
type elements struct {
	all   []addrRange // peers allowed on every protocol and port
	ports []portElem  // peer . protocol . port range
	other []addrRange // peers allowed on every protocol but TCP, UDP and SCTP, beyond all
	has6  bool        // whether any is an IPv6 peer (the direction then has IPv6 sets)
}

type portElem struct {
	peer        addrRange
	proto       Proto
	first, last uint16
}

// addrRange is the addresses first to last, of one family: an element of
// an interval set. compile's are each a prefix, as the rules name them;
// compileTiers' are the fewest ranges, as a complement ("all but these
// pods") takes one range per address left out, but as prefixes up to one
// per bit of it.
type addrRange struct{ first, last netip.Addr }

func rangeOf(p netip.Prefix) addrRange { return addrRange{p.Addr(), netaddr.Last(p)} }

// prefixRanges are ps, masked, one range each.
func prefixRanges(ps []netip.Prefix) []addrRange {
	out := make([]addrRange, len(ps))
	for i, p := range ps {
		out[i] = rangeOf(p)
	}
	return out
}

// String renders r as nft reads it in an interval set (concatenated or
// not): a prefix when r is exactly one, so compile's elements read as
// they always did, else first-last.
func (r addrRange) String() string {
	// The only prefix r can be is first and last's common one.
	a, b := r.first.As16(), r.last.As16()
	common := 0
	for i := range a {
		if x := a[i] ^ b[i]; x != 0 {
			common += bits.LeadingZeros8(x)
			break
		}
		common += 8
	}
	if r.first.Is4() {
		common -= 96 // As16 maps IPv4 into ::ffff:0:0/96
	}
	if p := netip.PrefixFrom(r.first, common); p.Masked().Addr() == r.first && netaddr.Last(p) == r.last {
		return p.String()
	}
	return r.first.String() + "-" + r.last.String()
}

// is6 reports whether r is of IPv6.
func (r addrRange) is6() bool { return r.first.Is6() }

// key renders e as an element of a set of type
// ipv4_addr (or ipv6_addr) . inet_proto . inet_service.
func (e portElem) key() []string {
	port := strconv.Itoa(int(e.first))
	if e.first != e.last {
		port += "-" + strconv.Itoa(int(e.last))
	}
	return []string{e.peer.String(), strconv.Itoa(int(e.proto)), port}
}

// compile normalizes d into disjoint set elements equivalent to d.Allows.
func compile(d *Direction) elements {
	type span struct {
		first, last uint16
		peers       []netip.Prefix
	}
	var all []netip.Prefix
	spans := map[Proto][]span{}
	for _, r := range d.Rules {
		peers := masked(r.Peers)
		if len(peers) == 0 {
			continue
		}
		if r.Ports == nil {
			all = append(all, peers...)
			continue
		}
		for _, pr := range r.Ports {
			if pr.First <= pr.Last {
				spans[pr.Proto] = append(spans[pr.Proto], span{pr.First, pr.Last, peers})
			}
		}
	}
	el := elements{all: prefixRanges(disjoint(all))}
	protos := make([]Proto, 0, len(spans))
	for p := range spans {
		protos = append(protos, p)
	}
	slices.Sort(protos)
	for _, proto := range protos {
		// Cut the port space at every range boundary: each elementary
		// segment is either inside or outside each range.
		var cuts []uint32
		for _, s := range spans[proto] {
			cuts = append(cuts, uint32(s.first), uint32(s.last)+1)
		}
		slices.Sort(cuts)
		cuts = slices.Compact(cuts)
		var segments []portSegment
		for i := 0; i+1 < len(cuts); i++ {
			lo, hi := uint16(cuts[i]), uint16(cuts[i+1]-1)
			var peers []netip.Prefix
			for _, s := range spans[proto] {
				if s.first <= lo && hi <= s.last {
					peers = append(peers, s.peers...)
				}
			}
			segments = append(segments, portSegment{lo, hi, prefixRanges(disjoint(peers))})
		}
		el.ports = appendRuns(el.ports, proto, segments)
	}
	el.has6 = el.anyIPv6()
	return el
}

// portSegment is the peers allowed on one segment of a protocol's ports.
type portSegment struct {
	first, last uint16
	peers       []addrRange
}

// appendRuns appends to ports the elements of proto's segments, in
// order and contiguous: neighbouring segments with the same peers become
// one port range.
func appendRuns(ports []portElem, proto Proto, segments []portSegment) []portElem {
	for i := 0; i < len(segments); {
		s := segments[i]
		last := s.last
		for i++; i < len(segments) && slices.Equal(segments[i].peers, s.peers); i++ {
			last = segments[i].last
		}
		for _, p := range s.peers {
			ports = append(ports, portElem{p, proto, s.first, last})
		}
	}
	return ports
}

// anyIPv6 reports whether any of el's peers is an IPv6 one.
func (el elements) anyIPv6() bool {
	return slices.ContainsFunc(el.all, addrRange.is6) || slices.ContainsFunc(el.other, addrRange.is6) ||
		slices.ContainsFunc(el.ports, func(e portElem) bool { return e.peer.is6() })
}

// masked returns the valid prefixes of ps, masked.
func masked(ps []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range ps {
		if p.IsValid() {
			out = append(out, p.Masked())
		}
	}
	return out
}

// disjoint returns the smallest sorted list of disjoint prefixes covering
// the same addresses as ps (masked, of either family: one never contains
// or neighbours the other's): contained prefixes are dropped and sibling
// pairs merged into their parent.
func disjoint(ps []netip.Prefix) []netip.Prefix {
	sorted := slices.Clone(ps)
	// By address, shorter first, so a prefix comes before those it contains.
	slices.SortFunc(sorted, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return cmp.Compare(a.Bits(), b.Bits())
	})
	var out []netip.Prefix
	for _, p := range sorted {
		if n := len(out); n > 0 && out[n-1].Bits() <= p.Bits() && out[n-1].Contains(p.Addr()) {
			continue
		}
		out = append(out, p)
		for n := len(out); n >= 2 && siblings(out[n-2], out[n-1]); n = len(out) {
			out = append(out[:n-2], parent(out[n-2]))
		}
	}
	return out
}

func parent(p netip.Prefix) netip.Prefix {
	return netip.PrefixFrom(p.Addr(), p.Bits()-1).Masked()
}

func siblings(a, b netip.Prefix) bool {
	return a.Bits() == b.Bits() && a.Bits() > 0 && parent(a) == parent(b)
}

// fingerprint identifies the compiled contents of a direction's sets.
func (el elements) fingerprint() string {
	h := sha256.New()
	for _, p := range el.all {
		fmt.Fprintln(h, p)
	}
	fmt.Fprintln(h, "ports")
	for _, e := range el.ports {
		fmt.Fprintln(h, e.key())
	}
	// Only where there is any, so a direction without tiers keeps its
	// fingerprint.
	if len(el.other) > 0 {
		fmt.Fprintln(h, "other")
		for _, p := range el.other {
			fmt.Fprintln(h, p)
		}
	}
	return hex.EncodeToString(h.Sum(nil))
}
