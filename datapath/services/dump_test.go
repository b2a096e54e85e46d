package services

import (
	"net/netip"
	"testing"
	"time"

	"github.com/onc-net/onc/datapath/bpf"
)

// Found by FuzzDecodeAffinity: an entry a program stamped after onctl read
// the clock (a connection meanwhile) showed a negative age.
func TestAffinityStampedAfterNowHasNoAge(t *testing.T) {
	byID := map[uint32]affinityService{1: {Key{netip.MustParseAddr("10.96.0.10"), 8080, TCP, Socket}, time.Hour}}
	a, live := decodeAffinity(bpf.ServicesLbAffKey{SvcId: 1}, bpf.ServicesLbAff{LastNs: 1001}, 1000, byID, nil)
	if !live || a.Age != 0 {
		t.Fatalf("an entry stamped 1 ns after now: %+v, shown %v; want shown with age 0", a, live)
	}
}
