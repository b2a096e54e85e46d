package fastpath

import (
	"maps"
	"net/netip"
	"testing"
)

// peerWrites runs fn and returns how many peer- and host-map writes it made.
func peerWrites(t *testing.T, d *Datapath, fn func() error) uint64 {
	t.Helper()
	before := d.PeerWrites()
	must(t, fn())
	return d.PeerWrites() - before
}

func expectPeerWrites(t *testing.T, what string, got, want uint64) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: %d map writes, want %d", what, got, want)
	}
}

// expectMap checks that have reads exactly want.
func expectMap[K, V comparable](t *testing.T, what string, have func() (map[K]V, error), want map[K]V) {
	t.Helper()
	got, err := have()
	must(t, err)
	if !maps.Equal(got, want) {
		t.Fatalf("%s: map holds %v, want %v", what, got, want)
	}
}

// Only what differs from the maps is written: at steady state nothing, and
// a changed peer costs its own entry, evicting nothing learned of others.
func TestSyncPeersAndSetHostsWriteOnlyWhatDiffers(t *testing.T) {
	d := open(t)
	established(t, d) // peerCIDR via peerNode, with a learned flow
	peers := []Peer{{PodCIDR: peerCIDR, NodeIP: peerNode}}
	var hosts []netip.Addr
	for i := range 200 {
		node := netip.AddrFrom4([4]byte{198, 18, byte(i / 256), byte(i)})
		peers = append(peers, Peer{PodCIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(i), 0}), 24), NodeIP: node})
		hosts = append(hosts, node, netip.AddrFrom4([4]byte{10, 245, byte(i), 1}))
	}
	wantPeers := func() map[cidrKey]cidrVal {
		m := map[cidrKey]cidrVal{}
		for _, p := range peers {
			m[cidrKey{Prefixlen: uint32(p.PodCIDR.Bits()), Addr: be32(p.PodCIDR.Addr())}] = cidrVal{NodeIp: be32(p.NodeIP)}
		}
		return m
	}
	wantHosts := func() map[uint32]uint8 {
		m := map[uint32]uint8{}
		for _, h := range hosts {
			m[be32(h)] = 1
		}
		return m
	}
	havePeers := func() (map[cidrKey]cidrVal, error) { return contents[cidrKey, cidrVal](d.maps.OncPeers) }
	haveHosts := func() (map[uint32]uint8, error) { return contents[uint32, uint8](d.maps.OncHosts) }
	syncPeers := func() error { return d.SyncPeers(peers) }
	setHosts := func() error { return d.SetHosts(hosts) }

	expectPeerWrites(t, "first SyncPeers", peerWrites(t, d, syncPeers), 200) // peerCIDR is in already
	expectMap(t, "peers", havePeers, wantPeers())
	expectPeerWrites(t, "first SetHosts", peerWrites(t, d, setHosts), 400)
	expectMap(t, "hosts", haveHosts, wantHosts())
	expectPeerWrites(t, "SyncPeers again", peerWrites(t, d, syncPeers), 0)
	expectPeerWrites(t, "SetHosts again", peerWrites(t, d, setHosts), 0)

	peers[5].NodeIP = otherNode
	expectPeerWrites(t, "a peer's node IP changed", peerWrites(t, d, syncPeers), 2) // out, then in
	expectMap(t, "peers after a change", havePeers, wantPeers())
	peers = append(peers[:6], peers[7:]...)
	expectPeerWrites(t, "a peer left", peerWrites(t, d, syncPeers), 1)
	expectMap(t, "peers after one left", havePeers, wantPeers())
	if flows, _ := d.Flows(); len(flows) != 1 {
		t.Fatalf("flows of an unchanged peer: %v, want the learned one kept", flows)
	}

	hosts = append(hosts[1:], otherNode)
	expectPeerWrites(t, "a host left, one came", peerWrites(t, d, setHosts), 2)
	expectMap(t, "hosts after a change", haveHosts, wantHosts())
}

// The per-node maps hold a cluster of the size ONC is built for (the scale
// bench runs 5,000 nodes): a peer CIDR per node and two host addresses.
func TestMapsHoldFiveThousandNodes(t *testing.T) {
	d := open(t)
	var peers []Peer
	var hosts []netip.Addr
	for i := range 5000 {
		node := netip.AddrFrom4([4]byte{100, 64 + byte(i>>16), byte(i >> 8), byte(i)})
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i >> 8), byte(i), 0}), 24)
		peers = append(peers, Peer{PodCIDR: cidr, NodeIP: node})
		hosts = append(hosts, node, cidr.Addr().Next())
	}
	must(t, d.SyncPeers(peers))
	must(t, d.SetHosts(hosts))
	expectPeerWrites(t, "5,000 peers again", peerWrites(t, d, func() error { return d.SyncPeers(peers) }), 0)
}
