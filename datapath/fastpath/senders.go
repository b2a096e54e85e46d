package fastpath

import (
	"fmt"
	"net/netip"

	"github.com/onc-net/onc/datapath/bpf"
)

// Sender is a peer the overlay guard accepts VXLAN frames from: its tunnel
// endpoint, and the inner source prefixes it may speak for.
type Sender struct {
	NodeIP  netip.Addr
	Sources []netip.Prefix
}

// SyncSenders makes the overlay guard's sender set exactly senders, writing
// only what differs (see mirror). A sender that is gone, or a source it
// lost, is refused from the moment its entry is deleted.
func (d *Datapath) SyncSenders(senders []Sender, checkKernel bool) error {
	want := map[senderKey]senderVal{}
	for _, s := range senders {
		if !s.NodeIP.Is4() {
			return fmt.Errorf("overlay sender %s: not an IPv4 tunnel endpoint", s.NodeIP)
		}
		peer := bpf.NetIPv4(s.NodeIP)
		// The endpoint alone: a frame from it with a source it may not
		// speak for is told apart from one from an unknown host.
		want[senderKey{Prefixlen: 32, Peer: peer}] = senderVal{MaySend: 0}
		for _, p := range s.Sources {
			if !p.Addr().Is4() {
				return fmt.Errorf("overlay sender %s: source %s is not IPv4", s.NodeIP, p)
			}
			want[senderKey{Prefixlen: 32 + uint32(p.Bits()), Peer: peer, Inner: bpf.NetIPv4(p.Masked().Addr())}] = senderVal{MaySend: 1}
		}
	}
	return d.senders.sync(d.maps.OncSenders, want, checkKernel, func(have map[senderKey]senderVal) error {
		return putThenDelete(d.maps.OncSenders, have, want, d.peerWrite)
	})
}
