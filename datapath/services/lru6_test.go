//go:build privileged

package services

import (
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bpf/bpftest"
	"github.com/onc-net/onc/internal/testutil"
	"golang.org/x/sys/unix"
)

// The IPv6 LRU maps' size follows the node's families (lru6.go): small on
// a node of a cluster without IPv6 pods, full with them; a restart of the
// same family adopts them with their entries, a switch replaces them (and
// only them).

// fullSize is a map's size as services.h declares it.
func fullSize(t *testing.T, name string) uint32 {
	t.Helper()
	spec, err := bpf.LoadServices()
	testutil.Must(t, err)
	return spec.Maps[name].MaxEntries
}

// pinned is what the pin of a map in dir says: its size and id.
func pinned(t *testing.T, dir, name string) (uint32, ebpf.MapID) {
	t.Helper()
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), &ebpf.LoadPinOptions{ReadOnly: true})
	testutil.Must(t, err)
	defer m.Close()
	info, err := m.Info()
	testutil.Must(t, err)
	id, _ := info.ID()
	return m.MaxEntries(), id
}

// pinDir is a private bpffs for one node's pins, across its agents.
func pinDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	testutil.Must(t, bpf.EnsurePinDir(dir))
	t.Cleanup(func() { _ = unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// openFamily loads an agent's balancer of a node with or without IPv6
// pods on dir (not attached).
func openFamily(t *testing.T, dir string, ipv6 bool) *LB {
	t.Helper()
	lb, err := Open(Options{PinDir: dir, IPv6: ipv6})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	return lb
}

// requireSizes checks the pinned sizes of the IPv6 LRU maps, and that
// the IPv4 ones keep their full size either way.
func requireSizes(t *testing.T, when, dir string, ipv6 bool) {
	t.Helper()
	for _, name := range lru6Maps {
		want := uint32(lru6Small)
		if ipv6 {
			want = fullSize(t, name)
		}
		if got, _ := pinned(t, dir, name); got != want {
			t.Fatalf("%s: %s has %d entries, want %d", when, name, got, want)
		}
	}
	for _, name := range []string{bpf.ServicesMapOncLbRevnat, bpf.ServicesMapOncLbAff} {
		if got, _ := pinned(t, dir, name); got != fullSize(t, name) {
			t.Fatalf("%s: %s has %d entries, want its full %d", when, name, got, fullSize(t, name))
		}
	}
}

// An entry in each LRU map of either family, as a socket's connect
// writes them.
var (
	revnat6Key = bpf.ServicesLb6RevnatKey{Sock: 7, Be: bpf.ServicesLb6Addr{Ip: bpf.NetIPv6(backends6[0]), Port: bpf.NetPort(svcPort)}, Proto: uint8(TCP)}
	revnat6Val = bpf.ServicesLb6Revnat{Vip: bpf.ServicesLb6Addr{Ip: bpf.NetIPv6(vip6), Port: bpf.NetPort(svcPort)}, SvcId: 3}
	aff6Key    = bpf.ServicesLbAffKey{Netns: 9, SvcId: 3}
	aff6Val    = bpf.ServicesLb6Aff{Be: revnat6Key.Be, LastNs: 1}
	revnatKey  = bpf.ServicesLbRevnatKey{Sock: 7, Be: bpf.ServicesLbAddr{Ip: bpf.NetIPv4(backends[0]), Port: bpf.NetPort(svcPort)}, Proto: uint8(TCP)}
	revnatVal  = bpf.ServicesLbRevnat{Vip: bpf.ServicesLbAddr{Ip: bpf.NetIPv4(vip), Port: bpf.NetPort(svcPort)}, SvcId: 4}
)

func put6(t *testing.T, lb *LB) {
	t.Helper()
	testutil.Must(t, lb.maps.OncLb6Revnat.Put(revnat6Key, revnat6Val))
	testutil.Must(t, lb.maps.OncLb6Aff.Put(aff6Key, aff6Val))
}

// has6 says whether the entries put6 wrote are there.
func has6(t *testing.T, lb *LB) bool {
	t.Helper()
	var rv bpf.ServicesLb6Revnat
	var av bpf.ServicesLb6Aff
	r, a := lb.maps.OncLb6Revnat.Lookup(revnat6Key, &rv), lb.maps.OncLb6Aff.Lookup(aff6Key, &av)
	if (r == nil) != (a == nil) {
		t.Fatalf("one IPv6 LRU map kept its entry, the other not: %v, %v", r, a)
	}
	return r == nil && rv == revnat6Val && av == aff6Val
}

func TestIPv6LRUMapsSizedByFamily(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		dir := pinDir(t)
		openFamily(t, dir, ipv6)
		requireSizes(t, map[bool]string{false: "IPv4-only", true: "dual-stack"}[ipv6], dir, ipv6)
	}
}

// An agent restarted on a node of the same families adopts the IPv6 LRU
// maps, entries and all.
func TestRestartOfTheSameFamilyAdoptsIPv6LRUMaps(t *testing.T) {
	for _, ipv6 := range []bool{false, true} {
		dir := pinDir(t)
		lb := openFamily(t, dir, ipv6)
		put6(t, lb)
		ids := map[string]ebpf.MapID{}
		for _, name := range lru6Maps {
			_, ids[name] = pinned(t, dir, name)
		}
		lb.Close()

		again := openFamily(t, dir, ipv6)
		requireSizes(t, "after the restart", dir, ipv6)
		for _, name := range lru6Maps {
			if _, id := pinned(t, dir, name); id != ids[name] {
				t.Fatalf("ipv6 %v: the restart replaced %s (map %d, was %d)", ipv6, name, id, ids[name])
			}
		}
		if !has6(t, again) {
			t.Fatalf("ipv6 %v: the IPv6 LRU entries written before the restart are gone", ipv6)
		}
	}
}

// A node whose cluster gained IPv6 pods, then lost them, gets the IPv6
// LRU maps at the new size on each restart; every other map is adopted
// with what it holds (an IPv4 socket's reverse entry, a Service).
func TestFamilySwitchResizesOnlyTheIPv6LRUMaps(t *testing.T) {
	dir := pinDir(t)
	lb := openFamily(t, dir, false)
	s := service(svcPort, TCP, backends...)
	testutil.Must(t, lb.Sync([]Service{s}, false))
	testutil.Must(t, lb.maps.OncLbRevnat.Put(revnatKey, revnatVal))
	put6(t, lb)
	_, svcMap := pinned(t, dir, bpf.ServicesMapOncLbSvc)
	lb.Close()

	for _, ipv6 := range []bool{true, false} {
		again := openFamily(t, dir, ipv6)
		requireSizes(t, "after the switch", dir, ipv6)
		if has6(t, again) {
			t.Fatalf("ipv6 %v: the IPv6 LRU maps were adopted at the other size", ipv6)
		}
		if _, id := pinned(t, dir, bpf.ServicesMapOncLbSvc); id != svcMap {
			t.Fatalf("ipv6 %v: the service map was replaced", ipv6)
		}
		var v bpf.ServicesLbRevnat
		testutil.Must(t, again.maps.OncLbRevnat.Lookup(revnatKey, &v))
		if p := again.services[s.Key()]; p == nil || !p.adopted {
			t.Fatalf("ipv6 %v: the IPv4 Service was not adopted", ipv6)
		}
		put6(t, again)
		again.Close()
	}
}

// A pinned IPv6 LRU map that differs in more than its size (an upgrade
// changed its layout) is left to bpf.LoadPinned, which replaces every map
// of the object together.
func TestIPv6LRUMapOfAnotherLayoutReplacesEveryMap(t *testing.T) {
	dir := pinDir(t)
	lb := openFamily(t, dir, true)
	testutil.Must(t, lb.Sync([]Service{service(svcPort, TCP, backends...)}, false))
	lb.Close()
	pin := filepath.Join(dir, bpf.ServicesMapOncLb6Revnat)
	testutil.Must(t, unix.Unlink(pin))
	old, err := ebpf.NewMap(&ebpf.MapSpec{Name: "onc_lb6_revnat", Type: ebpf.LRUHash, KeySize: 16, ValueSize: 24, MaxEntries: 1024})
	testutil.Must(t, err)
	testutil.Must(t, old.Pin(pin))
	old.Close()

	again := openFamily(t, dir, false)
	requireSizes(t, "after the layout change", dir, false)
	if n := bpftest.Entries(t, again.maps.OncLbSvc); n != 0 {
		t.Fatalf("%d entries in the service map: the object's maps were not replaced together", n)
	}
}

// On a node without IPv6 pods the programs load with the small maps and
// balance as ever: IPv4, and an IPv6 Service with endpoints all the same
// (the exception lru6Small is sized for), its reverse entries in the
// small map.
func TestIPv4OnlyNodeBalancesWithSmallIPv6Maps(t *testing.T) {
	cg := bpftest.Cgroup(t)
	dir := pinDir(t)
	lb, err := Open(Options{PinDir: dir, Cgroup: cg})
	testutil.Must(t, err)
	t.Cleanup(func() { lb.Close() })
	testutil.Must(t, lb.Attach())
	b := newBed(t, cg)
	testutil.Must(t, lb.OwnPod(b.cookie, podIP, b.path))
	testutil.Must(t, lb.Sync([]Service{service(svcPort, UDP, backends...), serviceAt(vip6, svcPort, UDP, backends6...)}, false))
	for _, svc := range []netip.AddrPort{netip.AddrPortFrom(vip, svcPort), svc6} {
		checkAll(t, "unconnected UDP to "+svc.String(), b.client("udp", svc, 20), func(r clientRes) bool {
			return r.Err == "" && r.Peer == svc.String() && (isBackend(r.Served, svcPort) || isBackend6(r.Served))
		})
	}
	if n := bpftest.Entries(t, lb.maps.OncLb6Revnat); n != 20 {
		t.Fatalf("%d entries in the small IPv6 reverse map, want the 20 sockets'", n)
	}
	requireSizes(t, "IPv4-only", dir, false)
}
