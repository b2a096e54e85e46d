package fastpath

import (
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Sender is a peer the overlay guard accepts VXLAN frames from: its tunnel
// endpoint, IPv4 or IPv6 (the underlay's family), and the inner source
// prefixes it may speak for, IPv4 or IPv6.
type Sender struct {
	NodeIP  netip.Addr
	Sources []netip.Prefix
}

// senderSets are the entries of the overlay guard's four sender maps, by
// the family of the tunnel endpoint and of the inner source.
type senderSets struct {
	v4   map[senderKey]senderVal    // onc_senders: IPv4 endpoint, IPv4 source
	v6   map[sender6Key]senderVal   // onc_senders6: IPv4 endpoint, IPv6 source
	u6v4 map[senderU6Key]senderVal  // onc_senders_u6: IPv6 endpoint, IPv4 source
	u6v6 map[sender6U6Key]senderVal // onc_senders6_u6: IPv6 endpoint, IPv6 source
}

// add puts s's entries in w, or says why the guard cannot hold s.
func (w *senderSets) add(s Sender) error {
	switch {
	case !s.NodeIP.IsValid():
		return errors.New("overlay sender without a tunnel endpoint")
	case s.NodeIP.Is4In6():
		// Frames from an IPv4 endpoint carry an IPv4 outer header: such
		// entries would never match, and hide a caller's mistake.
		return fmt.Errorf("overlay sender %s: the tunnel endpoint is IPv4-mapped; give it as IPv4", s.NodeIP)
	}
	for _, p := range s.Sources {
		switch {
		case !p.IsValid():
			return fmt.Errorf("overlay sender %s: a source that is no prefix (%s)", s.NodeIP, p)
		case p.Masked().Addr().Is4In6():
			// Frames carry IPv4 sources in IPv4 headers, as above.
			return fmt.Errorf("overlay sender %s: source %s is IPv4-mapped; give it as IPv4", s.NodeIP, p)
		}
	}
	known, may := senderVal{MaySend: 0}, senderVal{MaySend: 1}
	if s.NodeIP.Is4() {
		peer := bpf.NetIPv4(s.NodeIP)
		w.v4[senderKey{Prefixlen: 32, Peer: peer}] = known
		w.v6[sender6Key{Prefixlen: 32, Peer: peer}] = known
		for _, p := range s.Sources {
			if inner := p.Masked().Addr(); inner.Is4() {
				w.v4[senderKey{Prefixlen: 32 + uint32(p.Bits()), Peer: peer, Inner: bpf.NetIPv4(inner)}] = may
			} else {
				w.v6[sender6Key{Prefixlen: 32 + uint32(p.Bits()), Peer: peer, Inner: inner.As16()}] = may
			}
		}
		return nil
	}
	peer := s.NodeIP.As16()
	w.u6v4[senderU6Key{Prefixlen: 128, Peer: peer}] = known
	w.u6v6[sender6U6Key{Prefixlen: 128, Peer: peer}] = known
	for _, p := range s.Sources {
		if inner := p.Masked().Addr(); inner.Is4() {
			w.u6v4[senderU6Key{Prefixlen: 128 + uint32(p.Bits()), Peer: peer, Inner: bpf.NetIPv4(inner)}] = may
		} else {
			w.u6v6[sender6U6Key{Prefixlen: 128 + uint32(p.Bits()), Peer: peer, Inner: inner.As16()}] = may
		}
	}
	return nil
}

// SyncSenders makes the overlay guard's sender set exactly senders, writing
// only what differs (see mirror). A sender that is gone, or a source it
// lost, is refused from the moment its entry is deleted. A sender with an
// IPv4 endpoint has its IPv4 sources in onc_senders and its IPv6 ones in
// onc_senders6; one with an IPv6 endpoint (an IPv6 underlay) in
// onc_senders_u6 and onc_senders6_u6. Its endpoint alone goes to both of
// its maps, so that either tells an unknown sender from a known one
// speaking for others. A sender without an endpoint, with an IPv4-mapped
// one, or with a source that is no prefix or an IPv4-mapped IPv6 one, is
// refused before anything is written.
func (d *Datapath) SyncSenders(senders []Sender, checkKernel bool) error {
	w := senderSets{v4: map[senderKey]senderVal{}, v6: map[sender6Key]senderVal{},
		u6v4: map[senderU6Key]senderVal{}, u6v6: map[sender6U6Key]senderVal{}}
	for _, s := range senders {
		if err := w.add(s); err != nil {
			return err
		}
	}
	if err := syncSenderMap(d, &d.senders, d.maps.OncSenders, w.v4, checkKernel); err != nil {
		return err
	}
	if err := syncSenderMap(d, &d.senders6, d.maps.OncSenders6, w.v6, checkKernel); err != nil {
		return err
	}
	if err := syncSenderMap(d, &d.sendersU6, d.maps.OncSendersU6, w.u6v4, checkKernel); err != nil {
		return err
	}
	return syncSenderMap(d, &d.senders6U6, d.maps.OncSenders6U6, w.u6v6, checkKernel)
}

// syncSenderMap is SyncSenders for one sender map.
func syncSenderMap[K comparable](d *Datapath, m *mirror[K, senderVal], lpm *ebpf.Map, want map[K]senderVal, checkKernel bool) error {
	return m.sync(lpm, want, checkKernel, func(have map[K]senderVal) error {
		return putThenDelete(lpm, have, want, d.peerWrite)
	})
}
