package datapath

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datastore"
)

// peerSet is what the pieces program for a node list.
type peerSet struct {
	overlay  []overlay.Peer
	fastPath []fastpath.Peer
	// hosts are the nodes' own IPv4 addresses: never fast-pathed, even if
	// one lay in a peer's pod CIDR (none on an IPv6 underlay, where the
	// fast path is off). A peer's gateway address is not one: it
	// is what the peer's host, and its masquerade of a flow from outside
	// to a backend here, send from over the overlay, like a pod of it.
	hosts []netip.Addr
	// senders are the peers the overlay guard accepts frames from, each
	// speaking for its pod CIDRs (of one family or both) and its node
	// address.
	senders []fastpath.Sender
	// conflicts are the nodes left out because a pod CIDR, gateway or
	// VTEP MAC of theirs is this node's or an earlier one's (by name):
	// programming both would send one CIDR's packets two ways, and the
	// guard would let a peer speak for another's pods; and those whose
	// address is not of this node's family (the underlay's) or whose IPv6
	// pod CIDR is IPv4-mapped.
	conflicts []string
}

// peersOf is the one place datastore nodes become peers, for the slow and
// the fast path alike; local is this node's tunnel endpoint, whose family
// every peer's must be.
func peersOf(self string, local netip.Addr, nodes []datastore.Node) peerSet {
	nodes = slices.SortedFunc(slices.Values(nodes), func(a, b datastore.Node) int {
		switch {
		case a.Name == self:
			return -1 // this node keeps what is its own
		case b.Name == self:
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	var s peerSet
	owner := map[any]string{}
	underlay4 := local.Is4()
	for _, nd := range nodes {
		// One record with an address of the other family (or none) must
		// not stop every peer's programming: the tunnel's endpoints are
		// all of one family.
		if !nd.IP.IsValid() || nd.IP.Is4() != underlay4 || nd.IP.Is4In6() {
			s.conflicts = append(s.conflicts, fmt.Sprintf("node %s left out: its address %s is not of this node's underlay family", nd.Name, nd.IP))
			continue
		}
		if nd.IP.Is4() { // the flow cache's host map is IPv4's, as its tunnels
			s.hosts = append(s.hosts, nd.IP)
		}
		podCIDR := nd.IPv4PodCIDR().Masked()
		podCIDR6 := datastore.BlockOf(nd.PodCIDRs, datastore.IPv6).Masked()
		if !podCIDR.IsValid() && !podCIDR6.IsValid() {
			continue
		}
		if podCIDR6.IsValid() && podCIDR6.Addr().Is4In6() {
			s.conflicts = append(s.conflicts, fmt.Sprintf("node %s left out: its IPv6 pod CIDR %s is IPv4-mapped", nd.Name, podCIDR6))
			continue
		}
		keys := map[any]string{nd.VTEPMAC.String(): "VTEP MAC " + nd.VTEPMAC.String()}
		sources := []netip.Prefix{netip.PrefixFrom(nd.IP, nd.IP.BitLen())}
		var cidrs []netip.Prefix
		for _, c := range []netip.Prefix{podCIDR, podCIDR6} {
			if c.IsValid() {
				gw := Gateway(c)
				keys[c], keys[gw] = familyWord(c)+"pod CIDR "+c.String(), "gateway "+gw.String()
				cidrs = append(cidrs, c)
			}
		}
		sources = append(cidrs, sources...)
		if why := conflict(owner, keys); why != "" {
			s.conflicts = append(s.conflicts, fmt.Sprintf("node %s left out: %s", nd.Name, why))
			continue
		}
		for k := range keys {
			owner[k] = nd.Name
		}
		if nd.Name == self {
			continue
		}
		s.overlay = append(s.overlay, overlay.Peer{Name: nd.Name, NodeIP: nd.IP, VTEPMAC: nd.VTEPMAC, PodCIDR: podCIDR, PodCIDR6: podCIDR6})
		s.senders = append(s.senders, fastpath.Sender{NodeIP: nd.IP, Sources: sources})
		if nd.FastPath { // over an IPv6 underlay its IPv4 CIDR is left out (fastpath.SyncPeers)
			for _, c := range cidrs {
				s.fastPath = append(s.fastPath, fastpath.Peer{PodCIDR: c, NodeIP: nd.IP})
			}
		}
	}
	return s
}

// familyWord names an IPv6 prefix's family in a conflict ("" for IPv4's,
// the older and usual one).
func familyWord(p netip.Prefix) string {
	if p.Addr().Is6() {
		return "IPv6 "
	}
	return ""
}

// conflict says which of keys another node owns already, "" if none.
func conflict(owner, keys map[any]string) string {
	var taken []string
	for k, what := range keys {
		if other, ok := owner[k]; ok {
			taken = append(taken, fmt.Sprintf("its %s is node %s's", what, other))
		}
	}
	slices.Sort(taken)
	return strings.Join(taken, ", ")
}
