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
	// hosts are the nodes' own addresses: never fast-pathed, even if one
	// lay in a peer's pod CIDR. A peer's gateway address is not one: it
	// is what the peer's host, and its masquerade of a flow from outside
	// to a backend here, send from over the overlay, like a pod of it.
	hosts []netip.Addr
	// senders are the peers the overlay guard accepts frames from, each
	// speaking for its pod CIDRs (IPv4, and IPv6 if it has one) and its
	// node address.
	senders []fastpath.Sender
	// conflicts are the nodes left out because a pod CIDR, gateway or
	// VTEP MAC of theirs is this node's or an earlier one's (by name):
	// programming both would send one CIDR's packets two ways, and the
	// guard would let a peer speak for another's pods; and those whose
	// address is not IPv4 or whose IPv6 pod CIDR is not IPv6.
	conflicts []string
}

// peersOf is the one place datastore nodes become peers, for the slow and
// the fast path alike.
func peersOf(self string, nodes []datastore.Node) peerSet {
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
	for _, nd := range nodes {
		// The overlay's tunnel endpoints, and so the guard's, are IPv4,
		// and a node needs an IPv4 pod CIDR so far (issue 28): one record
		// with another address must not stop every peer's programming.
		podCIDR := nd.IPv4PodCIDR()
		if !nd.IP.Is4() {
			s.conflicts = append(s.conflicts, fmt.Sprintf("node %s left out: its address %s or pod CIDR %s is not IPv4", nd.Name, nd.IP, podCIDR))
			continue
		}
		s.hosts = append(s.hosts, nd.IP)
		if !podCIDR.IsValid() {
			continue
		}
		// Its IPv6 pods, reached over the same tunnel.
		podCIDR6 := datastore.BlockOf(nd.PodCIDRs, datastore.IPv6).Masked()
		if podCIDR6.IsValid() && podCIDR6.Addr().Is4In6() {
			s.conflicts = append(s.conflicts, fmt.Sprintf("node %s left out: its IPv6 pod CIDR %s is IPv4-mapped", nd.Name, podCIDR6))
			continue
		}
		gw := Gateway(podCIDR)
		keys := map[any]string{podCIDR.Masked(): "pod CIDR " + podCIDR.String(), gw: "gateway " + gw.String(),
			nd.VTEPMAC.String(): "VTEP MAC " + nd.VTEPMAC.String()}
		sources := []netip.Prefix{podCIDR.Masked(), netip.PrefixFrom(nd.IP, 32)}
		if podCIDR6.IsValid() {
			keys[podCIDR6] = "IPv6 pod CIDR " + podCIDR6.String()
			sources = append(sources, podCIDR6)
		}
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
		if nd.FastPath {
			s.fastPath = append(s.fastPath, fastpath.Peer{PodCIDR: podCIDR, NodeIP: nd.IP})
			if podCIDR6.IsValid() {
				s.fastPath = append(s.fastPath, fastpath.Peer{PodCIDR: podCIDR6, NodeIP: nd.IP})
			}
		}
	}
	return s
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
