package datapath

import (
	"errors"
	"net/netip"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datastore"
)

// SyncPeers programs every other node that has a pod CIDR as an overlay
// peer, and gives the fast path the peers that run it and every node and
// gateway address (host traffic stays on the slow path). Only what differs
// from what was programmed last is written; checkKernel also reads the
// kernel's entries back and repairs what drifted.
func (n *Node) SyncPeers(self string, nodes []datastore.Node, checkKernel bool) error {
	n.mu.Lock()
	ovl, fp := n.ovl, n.fp
	n.mu.Unlock()
	if ovl == nil {
		return errNotUp
	}
	want := peersOf(self, nodes)
	err := ovl.Sync(want.overlay, checkKernel)
	if fp != nil {
		err = errors.Join(err, fp.SetHosts(want.hosts), fp.SyncPeers(want.fastPath))
	}
	return err
}

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

// KernelWrites counts the writes made to program peers since start:
// netlink messages of the overlay and BPF map updates and deletes of the
// fast path's peer and host maps.
func (n *Node) KernelWrites() uint64 {
	n.mu.Lock()
	ovl, fp := n.ovl, n.fp
	n.mu.Unlock()
	var w uint64
	if ovl != nil {
		w += ovl.Writes()
	}
	if fp != nil {
		w += fp.PeerWrites()
	}
	return w
}

// ProgrammedPeers names the peers whose overlay entries are in place.
func (n *Node) ProgrammedPeers() map[string]bool {
	n.mu.Lock()
	ovl := n.ovl
	n.mu.Unlock()
	out := map[string]bool{}
	if ovl != nil {
		for name := range ovl.Programmed() {
			out[name] = true
		}
	}
	return out
}
