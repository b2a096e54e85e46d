package services

import (
	"net/netip"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bpf"
)

// An IPv6 address goes into a map as the program holds it (__be32[4],
// network order in memory) and comes back the same.
func TestIPv6InMaps(t *testing.T) {
	a := netip.MustParseAddr("fd00:10:96::a")
	w := bpf.NetIPv6(a)
	if w[0] != 0x1000_00fd || w[3] != 0x0a00_0000 {
		t.Fatalf("fd00:10:96::a as %#x, want the bytes fd 00 00 10 first", w)
	}
	if bpf.IPv6(w) != a {
		t.Fatalf("back as %s", bpf.IPv6(w))
	}
	k := Key{VIP: a, Port: 443, Proto: UDP}
	if got := keyOf6(k.mapKey().(svc6Key)); got != k {
		t.Fatalf("key %v back as %v", k, got)
	}
	be := netip.MustParseAddrPort("[fd00:10:244::7]:8443")
	if got := backendAddr6(backendValue(be).(lb6Addr)); got != be {
		t.Fatalf("backend %s back as %s", be, got)
	}
}

// What no map can hold is refused before anything is written.
func TestCheckFamilies(t *testing.T) {
	be := func(s string) []Backend { return []Backend{{Addr: netip.MustParseAddrPort(s)}} }
	for _, c := range []struct {
		s  Service
		ok bool
	}{
		{Service{VIP: netip.MustParseAddr("10.96.0.1"), Backends: be("10.0.0.1:80")}, true},
		{Service{VIP: netip.MustParseAddr("fd00::1"), Backends: be("[fd00::2]:80")}, true},
		{Service{VIP: netip.MustParseAddr("fd00::1"), Backends: be("10.0.0.1:80")}, false},
		{Service{VIP: netip.MustParseAddr("10.96.0.1"), Backends: be("[fd00::2]:80")}, false},
		{Service{VIP: netip.MustParseAddr("::ffff:10.96.0.1"), Backends: be("[::ffff:10.0.0.1]:80")}, false},
		{Service{VIP: netip.MustParseAddr("fd00::1"), Backends: be("[::ffff:10.0.0.1]:80")}, false},
		{Service{VIP: netip.MustParseAddr("fd00::1"), Scope: Uplink, Backends: be("[fd00::2]:80")}, true},
		{Service{VIP: netip.MustParseAddr("fd00::1"), Scope: Uplink, Backends: be("10.0.0.1:80")}, false},
		{Service{VIP: netip.MustParseAddr("fe80::1%eth0"), Scope: Uplink}, false},
		{Service{VIP: netip.MustParseAddr("10.96.0.1"), Scope: Uplink}, true},
	} {
		if err := checkFamilies(c.s); (err == nil) != c.ok {
			t.Errorf("%+v: %v", c.s, err)
		}
	}
}

// An IPv6 affinity entry reads with its IPv6 backend.
func TestAffinity6Decodes(t *testing.T) {
	svc := Key{netip.MustParseAddr("fd00:10:96::10"), 80, TCP, Socket}
	byID := map[uint32]affinityService{3: {svc, time.Minute}}
	pod := netip.MustParseAddr("10.244.0.9")
	be := netip.MustParseAddrPort("[fd00:10:244::9]:8080")
	a, live := affinityAt(bpf.ServicesLbAffKey{Netns: 7, SvcId: 3}, be, 100, 100+uint64(time.Second), byID, map[uint64]netip.Addr{7: pod})
	if want := (Affinity{Netns: 7, Pod: pod, Service: svc, Backend: be, Age: time.Second}); !live || a != want {
		t.Fatalf("%+v (%v), want %+v", a, live, want)
	}
}

// An entry of the uplink's IPv6 affinity reads with its client's address,
// for an uplink service only, within its timeout.
func TestUplinkAffinity6Decodes(t *testing.T) {
	svc := Key{netip.MustParseAddr("2001:db8::1"), 30080, TCP, Uplink}
	sock := Key{netip.MustParseAddr("fd00:10:96::10"), 80, TCP, Socket}
	byID := map[uint32]affinityService{3: {svc, time.Minute}, 4: {sock, time.Minute}}
	client := netip.MustParseAddr("2001:db8:1::7")
	be := netip.MustParseAddrPort("[fd00:10:244::9]:8080")
	v := bpf.ServicesLb6Aff{Be: addr6OfBackend(be), LastNs: 100}
	k := bpf.ServicesLb6UplinkAffKey{Client: bpf.NetIPv6(client), SvcId: 3}
	a, live := uplinkAffinity6(k, v, 100+uint64(time.Second), byID)
	if want := (Affinity{Pod: client, Service: svc, Backend: be, Age: time.Second}); !live || a != want {
		t.Fatalf("%+v (%v), want %+v", a, live, want)
	}
	if _, live := uplinkAffinity6(k, v, 100+uint64(2*time.Minute), byID); live {
		t.Error("an entry past its timeout reads as live")
	}
	k.SvcId = 4
	if _, live := uplinkAffinity6(k, v, 100, byID); live {
		t.Error("an entry of a socket service reads as the uplink's")
	}
}
