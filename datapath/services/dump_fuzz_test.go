package services

import (
	"encoding/binary"
	"math"
	"net/netip"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
)

// FuzzDecodeAffinity: struct lb_aff_key {__u64 netns; __u32 svc_id; pad}
// and struct lb_aff {struct lb_addr be {__be32 ip; __be16 port; pad};
// __u64 last_ns} (include/services.h) decode, read at now, into the entry of
// that service, client and backend, never older than now allows; one of
// no service or past its service's timeout is not shown.
func FuzzDecodeAffinity(f *testing.F) {
	f.Add([]byte{5, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0}, []byte{10, 250, 0, 1, 0x1f, 0x90, 0, 0, 0, 0xe4, 0x0b, 0x54, 2, 0, 0, 0}, uint64(20e9))
	f.Add([]byte{9, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0}, []byte{10, 250, 0, 2, 0, 53}, uint64(1))
	services := map[uint32]affinityService{
		1: {Key{netip.MustParseAddr("10.96.0.10"), 8080, TCP, Socket}, 3 * time.Hour},
		2: {Key{netip.MustParseAddr("10.96.0.53"), 53, UDP, Socket}, 0}, // affinity off since
	}
	owned := map[uint64]netip.Addr{1: {}, 5: netip.MustParseAddr("10.244.7.2")}
	f.Fuzz(func(t *testing.T, key, val []byte, now uint64) {
		now &= math.MaxInt64 // a monotonic clock in ns (292 years) stays below 2^63
		key, k := testutil.MapEntry[bpf.ServicesLbAffKey](t, key)
		val, v := testutil.MapEntry[bpf.ServicesLbAff](t, val)
		got, live := decodeAffinity(k, v, now, services, owned)
		netns, last := binary.NativeEndian.Uint64(key), binary.NativeEndian.Uint64(val[8:])
		svc, known := services[binary.NativeEndian.Uint32(key[8:])]
		age := time.Duration(0)
		if last < now {
			age = time.Duration(now - last)
		}
		if wantLive := known && age <= svc.timeout; live != wantLive {
			t.Fatalf("key % x, value % x at %d: shown %v, want %v", key, val, now, live, wantLive)
		}
		if !live {
			return
		}
		pod, mine := owned[netns]
		want := Affinity{Netns: netns, Pod: pod, Gone: !mine, Service: svc.service,
			Backend: netip.AddrPortFrom(netip.AddrFrom4([4]byte(val[0:4])), binary.BigEndian.Uint16(val[4:])), Age: age}
		if got != want {
			t.Fatalf("key % x, value % x at %d: decoded %+v, want %+v", key, val, now, got, want)
		}
	})
}
