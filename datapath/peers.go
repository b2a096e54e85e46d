package datapath

import (
	"net/netip"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datastore"
)

// peerSet is what the pieces program for a node list.
type peerSet struct {
	overlay  []overlay.Peer
	fastPath []fastpath.Peer
	hosts    []netip.Addr // node and gateway addresses: never fast-pathed
}

// peersOf is the one place datastore nodes become peers.
func peersOf(self string, nodes []datastore.Node) peerSet {
	var s peerSet
	for _, nd := range nodes {
		s.hosts = append(s.hosts, nd.IP)
		if !nd.PodCIDR.IsValid() {
			continue
		}
		s.hosts = append(s.hosts, Gateway(nd.PodCIDR))
		if nd.Name == self {
			continue
		}
		s.overlay = append(s.overlay, overlay.Peer{Name: nd.Name, NodeIP: nd.IP, VTEPMAC: nd.VTEPMAC, PodCIDR: nd.PodCIDR})
		if nd.FastPath {
			s.fastPath = append(s.fastPath, fastpath.Peer{PodCIDR: nd.PodCIDR, NodeIP: nd.IP})
		}
	}
	return s
}
