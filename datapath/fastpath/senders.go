package fastpath

import (
	"fmt"
	"net/netip"

	"github.com/onc-net/onc/datapath/bpf"
)

// Sender is a peer the overlay guard accepts VXLAN frames from: its tunnel
// endpoint (IPv4), and the inner source prefixes it may speak for, IPv4
// or IPv6.
type Sender struct {
	NodeIP  netip.Addr
	Sources []netip.Prefix
}

// SyncSenders makes the overlay guard's sender set exactly senders, writing
// only what differs (see mirror). A sender that is gone, or a source it
// lost, is refused from the moment its entry is deleted. Its IPv4 sources
// go to onc_senders and its IPv6 ones to onc_senders6, its endpoint alone
// to both, so that either map tells an unknown sender from a known one
// speaking for others. A sender without an IPv4 endpoint, or with a source
// that is no prefix or an IPv4-mapped IPv6 one, is refused before anything
// is written.
func (d *Datapath) SyncSenders(senders []Sender, checkKernel bool) error {
	want4 := map[senderKey]senderVal{}
	want6 := map[sender6Key]senderVal{}
	for _, s := range senders {
		if !s.NodeIP.Is4() {
			return fmt.Errorf("overlay sender %s: not an IPv4 tunnel endpoint", s.NodeIP)
		}
		peer := bpf.NetIPv4(s.NodeIP)
		want4[senderKey{Prefixlen: 32, Peer: peer}] = senderVal{MaySend: 0}
		want6[sender6Key{Prefixlen: 32, Peer: peer}] = senderVal{MaySend: 0}
		for _, p := range s.Sources {
			inner := p.Masked().Addr()
			switch {
			case !p.IsValid():
				return fmt.Errorf("overlay sender %s: a source that is no prefix (%s)", s.NodeIP, p)
			case inner.Is4():
				want4[senderKey{Prefixlen: 32 + uint32(p.Bits()), Peer: peer, Inner: bpf.NetIPv4(inner)}] = senderVal{MaySend: 1}
			case inner.Is4In6():
				// Frames carry IPv4 sources in IPv4 headers: such an
				// entry would never match, and hides a caller's mistake.
				return fmt.Errorf("overlay sender %s: source %s is IPv4-mapped; give it as IPv4", s.NodeIP, p)
			default:
				want6[sender6Key{Prefixlen: 32 + uint32(p.Bits()), Peer: peer, Inner: inner.As16()}] = senderVal{MaySend: 1}
			}
		}
	}
	err := d.senders.sync(d.maps.OncSenders, want4, checkKernel, func(have map[senderKey]senderVal) error {
		return putThenDelete(d.maps.OncSenders, have, want4, d.peerWrite)
	})
	if err != nil {
		return err
	}
	return d.senders6.sync(d.maps.OncSenders6, want6, checkKernel, func(have map[sender6Key]senderVal) error {
		return putThenDelete(d.maps.OncSenders6, have, want6, d.peerWrite)
	})
}
