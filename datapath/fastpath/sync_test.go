//go:build privileged

package fastpath

import (
	"maps"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
)

// peerWrites runs fn and returns how many peer- and host-map writes it made.
func peerWrites(t *testing.T, d *Datapath, fn func() error) uint64 {
	t.Helper()
	before := d.PeerWrites()
	testutil.Must(t, fn())
	return d.PeerWrites() - before
}

func expectPeerWrites(t *testing.T, what string, got, want uint64) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: %d map writes, want %d", what, got, want)
	}
}

// readBacks counts the times SyncPeers and SetHosts have read their maps.
func readBacks(d *Datapath) int { return d.peers.reads + d.hosts.reads }

// expectSync runs fn and checks the map writes and read-backs it made.
func expectSync(t *testing.T, what string, d *Datapath, fn func() error, writes uint64, reads int) {
	t.Helper()
	before := readBacks(d)
	expectPeerWrites(t, what, peerWrites(t, d, fn), writes)
	if got := readBacks(d) - before; got != reads {
		t.Fatalf("%s: %d map read-backs, want %d", what, got, reads)
	}
}

func peerEntries(peers []Peer) map[cidrKey]cidrVal {
	m := map[cidrKey]cidrVal{}
	for _, p := range peers {
		m[cidrKey{Prefixlen: uint32(p.PodCIDR.Bits()), Addr: bpf.NetIPv4(p.PodCIDR.Addr())}] = cidrVal{NodeIp: bpf.NetIPv4(p.NodeIP)}
	}
	return m
}

func hostEntries(hosts []netip.Addr) map[uint32]uint8 {
	m := map[uint32]uint8{}
	for _, h := range hosts {
		m[bpf.NetIPv4(h)] = 1
	}
	return m
}

// expectMap checks that have reads exactly want.
func expectMap[K, V comparable](t *testing.T, what string, have func() (map[K]V, error), want map[K]V) {
	t.Helper()
	got, err := have()
	testutil.Must(t, err)
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
	wantPeers := func() map[cidrKey]cidrVal { return peerEntries(peers) }
	wantHosts := func() map[uint32]uint8 { return hostEntries(hosts) }
	havePeers := func() (map[cidrKey]cidrVal, error) { return contents[cidrKey, cidrVal](d.maps.OncPeers) }
	haveHosts := func() (map[uint32]uint8, error) { return contents[uint32, uint8](d.maps.OncHosts) }
	syncPeers := func() error { return d.SyncPeers(peers, false) }
	setHosts := func() error { return d.SetHosts(hosts, false) }

	expectPeerWrites(t, "first SyncPeers", peerWrites(t, d, syncPeers), 200) // peerCIDR is in already
	expectMap(t, "peers", havePeers, wantPeers())
	expectPeerWrites(t, "first SetHosts", peerWrites(t, d, setHosts), 400)
	expectMap(t, "hosts", haveHosts, wantHosts())
	expectPeerWrites(t, "SyncPeers again", peerWrites(t, d, syncPeers), 0)
	expectPeerWrites(t, "SetHosts again", peerWrites(t, d, setHosts), 0)
	// Without checkKernel an unchanged set costs no syscall at all.
	expectSync(t, "SyncPeers once more", d, syncPeers, 0, 0)
	expectSync(t, "SetHosts once more", d, setHosts, 0, 0)

	peers[5].NodeIP = otherNode
	expectPeerWrites(t, "a peer's node IP changed", peerWrites(t, d, syncPeers), 2) // out, then in
	if readBacks(d) != 2 {
		t.Fatalf("%d map read-backs, want only the first SyncPeers' and SetHosts'", readBacks(d))
	}
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
	testutil.Must(t, d.SyncPeers(peers, false))
	testutil.Must(t, d.SetHosts(hosts, false))
	expectPeerWrites(t, "5,000 peers again", peerWrites(t, d, func() error { return d.SyncPeers(peers, false) }), 0)
	expectPeerWrites(t, "5,000 peers read back", peerWrites(t, d, func() error { return d.SyncPeers(peers, true) }), 0)
}

// cluster is n peers and their node and gateway addresses.
func cluster(n int) ([]Peer, []netip.Addr) {
	var peers []Peer
	var hosts []netip.Addr
	for i := range n {
		node := netip.AddrFrom4([4]byte{198, 18, 0, byte(i)})
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 245, byte(i), 0}), 24)
		peers = append(peers, Peer{PodCIDR: cidr, NodeIP: node})
		hosts = append(hosts, node, cidr.Addr().Next())
	}
	return peers, hosts
}

// Without checkKernel a sync trusts what it wrote last, so drift (here an
// entry deleted behind its back) stays until checkKernel reads the maps
// back and repairs it with exactly the missing entry.
func TestSyncRepairsDriftOnlyWithCheckKernel(t *testing.T) {
	d := open(t)
	peers, hosts := cluster(3)
	testutil.Must(t, d.SyncPeers(peers, false))
	testutil.Must(t, d.SetHosts(hosts, false))
	havePeers := func() (map[cidrKey]cidrVal, error) { return contents[cidrKey, cidrVal](d.maps.OncPeers) }
	haveHosts := func() (map[uint32]uint8, error) { return contents[uint32, uint8](d.maps.OncHosts) }

	lost := peerEntries(peers)
	delete(lost, cidrKey{Prefixlen: 24, Addr: bpf.NetIPv4(peers[1].PodCIDR.Addr())})
	testutil.Must(t, d.maps.OncPeers.Delete(cidrKey{Prefixlen: 24, Addr: bpf.NetIPv4(peers[1].PodCIDR.Addr())}))
	testutil.Must(t, d.maps.OncHosts.Delete(bpf.NetIPv4(hosts[1])))

	expectSync(t, "SyncPeers", d, func() error { return d.SyncPeers(peers, false) }, 0, 0)
	expectSync(t, "SetHosts", d, func() error { return d.SetHosts(hosts, false) }, 0, 0)
	expectMap(t, "peers without checkKernel", havePeers, lost)
	expectMap(t, "hosts without checkKernel", haveHosts, hostEntries(append(hosts[:1:1], hosts[2:]...)))

	expectSync(t, "SyncPeers checking the kernel", d, func() error { return d.SyncPeers(peers, true) }, 1, 1)
	expectSync(t, "SetHosts checking the kernel", d, func() error { return d.SetHosts(hosts, true) }, 1, 1)
	expectMap(t, "peers after checkKernel", havePeers, peerEntries(peers))
	expectMap(t, "hosts after checkKernel", haveHosts, hostEntries(hosts))
}

// A restarted agent's Datapath finds the pinned maps as the previous one
// left them: its first sync reads them back, so it rewrites nothing that
// is right and removes what no longer is (a node gone while it was down).
func TestFirstSyncAfterOpenReadsPinnedMapsBack(t *testing.T) {
	old := open(t)
	peers, hosts := cluster(3)
	testutil.Must(t, old.SyncPeers(peers, false))
	testutil.Must(t, old.SetHosts(hosts, false))
	testutil.Must(t, old.Close())

	reopen := func() *Datapath {
		t.Helper()
		d, err := Open(old.opts)
		testutil.Must(t, err)
		t.Cleanup(func() { d.Close() })
		return d
	}
	d := reopen()
	expectSync(t, "first SyncPeers", d, func() error { return d.SyncPeers(peers, false) }, 0, 1)
	expectSync(t, "first SetHosts", d, func() error { return d.SetHosts(hosts, false) }, 0, 1)
	expectSync(t, "second SyncPeers", d, func() error { return d.SyncPeers(peers, false) }, 0, 0)
	expectSync(t, "second SetHosts", d, func() error { return d.SetHosts(hosts, false) }, 0, 0)
	testutil.Must(t, d.Close())

	peers, hosts = peers[:2], hosts[:4] // the third node left meanwhile
	d = reopen()
	expectSync(t, "first SyncPeers after a node left", d, func() error { return d.SyncPeers(peers, false) }, 1, 1)
	expectSync(t, "first SetHosts after a node left", d, func() error { return d.SetHosts(hosts, false) }, 2, 1)
	expectMap(t, "peers", func() (map[cidrKey]cidrVal, error) { return contents[cidrKey, cidrVal](d.maps.OncPeers) }, peerEntries(peers))
	expectMap(t, "hosts", func() (map[uint32]uint8, error) { return contents[uint32, uint8](d.maps.OncHosts) }, hostEntries(hosts))
}

// After a failed write what the map holds is unknown, so the next sync
// reads it back even without checkKernel: here it restores an entry
// deleted behind its back meanwhile.
func TestSyncReadsBackAfterAFailedWrite(t *testing.T) {
	d := open(t)
	peers, hosts := cluster(3)
	testutil.Must(t, d.SyncPeers(peers, false))
	testutil.Must(t, d.SetHosts(hosts, false))
	// Writes through a read-only handle of the same map fail (EPERM).
	readOnly := func(m **ebpf.Map, pin string) (restore func()) {
		ro, err := ebpf.LoadPinnedMap(filepath.Join(d.opts.PinDir, pin), &ebpf.LoadPinOptions{ReadOnly: true})
		testutil.Must(t, err)
		rw := *m
		*m = ro
		return func() { *m = rw; ro.Close() }
	}

	restore := readOnly(&d.maps.OncPeers, "onc_peers")
	more, moreHosts := cluster(4)
	if err := d.SyncPeers(more, false); err == nil {
		t.Fatal("SyncPeers wrote through a read-only map")
	}
	restore()
	testutil.Must(t, d.maps.OncPeers.Delete(cidrKey{Prefixlen: 24, Addr: bpf.NetIPv4(peers[0].PodCIDR.Addr())}))
	expectSync(t, "SyncPeers after a failed write", d, func() error { return d.SyncPeers(more, false) }, 2, 1)
	expectMap(t, "peers", func() (map[cidrKey]cidrVal, error) { return contents[cidrKey, cidrVal](d.maps.OncPeers) }, peerEntries(more))
	expectSync(t, "SyncPeers again", d, func() error { return d.SyncPeers(more, false) }, 0, 0)

	restore = readOnly(&d.maps.OncHosts, "onc_hosts")
	if err := d.SetHosts(moreHosts, false); err == nil {
		t.Fatal("SetHosts wrote through a read-only map")
	}
	restore()
	testutil.Must(t, d.maps.OncHosts.Delete(bpf.NetIPv4(hosts[0])))
	expectSync(t, "SetHosts after a failed write", d, func() error { return d.SetHosts(moreHosts, false) }, 3, 1)
	expectMap(t, "hosts", func() (map[uint32]uint8, error) { return contents[uint32, uint8](d.maps.OncHosts) }, hostEntries(moreHosts))
	expectSync(t, "SetHosts again", d, func() error { return d.SetHosts(moreHosts, false) }, 0, 0)
}
