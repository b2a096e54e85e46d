package fastpath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Stat is one counter, named as in the C enum onc_stat without "STAT_",
// in lower case (egress_hit, egress_miss_flow, ...), with the family of
// the packets it counted: "ipv4" or "ipv6", and "" for the overlay
// guard's drops, which judge frames (overlay_drop_<reason>).
type Stat = bpf.Counter

// Stats sums every counter over the CPUs, by family.
func (d *Datapath) Stats() ([]Stat, error) {
	v4, err := d.counters.Read()
	if err != nil {
		return nil, err
	}
	v6, err := d.counters6.Read()
	if err != nil {
		return nil, err
	}
	out := make([]Stat, 0, len(v4)+len(v6))
	for _, c := range v4 {
		c.Family = "ipv4"
		if strings.HasPrefix(c.Name, "overlay_") {
			c.Family = ""
		}
		out = append(out, c)
	}
	for _, c := range v6 {
		if !strings.HasPrefix(c.Name, "overlay_") { // the guard counts in onc_stats
			c.Family = "ipv6"
			out = append(out, c)
		}
	}
	return out, nil
}

// CacheEntries counts the entries of each cache map, by its name without
// "onc_": filter (flows), egress (remote pods), encap (headers), local
// (local pods), and filter6, egress6 and local6 for IPv6; egress6_u6 and
// encap_u6 on an IPv6 underlay.
func (d *Datapath) CacheEntries() (map[string]int, error) {
	out := map[string]int{}
	for name, count := range map[string]func() (int, error){
		"filter":     func() (int, error) { return entries[FlowKey, FlowVal](d.maps.OncFilter) },
		"egress":     func() (int, error) { return entries[uint32, EgressVal](d.maps.OncEgress) },
		"encap":      func() (int, error) { return entries[uint32, EncapVal](d.maps.OncEncap) },
		"local":      func() (int, error) { return entries[uint32, LocalPod](d.maps.OncLocal) },
		"filter6":    func() (int, error) { return entries[FlowKey6, FlowVal](d.maps.OncFilter6) },
		"egress6":    func() (int, error) { return entries[addr6, EgressVal](d.maps.OncEgress6) },
		"egress6_u6": func() (int, error) { return entries[addr6, addr6](d.maps.OncEgress6U6) },
		"encap_u6":   func() (int, error) { return entries[addr6, Encap6Val](d.maps.OncEncapU6) },
		"local6":     func() (int, error) { return entries[addr6, LocalPod](d.maps.OncLocal6) },
	} {
		n, err := count()
		if err != nil {
			return nil, fmt.Errorf("count the entries of onc_%s: %w", name, err)
		}
		out[name] = n
	}
	return out, nil
}

// entries counts m's entries in batches: unlike key-by-key iteration,
// which restarts when its cursor key is deleted meanwhile, it cannot count
// an entry twice while the datapath learns and evicts.
func entries[K, V any](m *ebpf.Map) (int, error) {
	keys, vals := make([]K, 256), make([]V, 256)
	var cursor ebpf.MapBatchCursor
	total := 0
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		total += n
		switch {
		case errors.Is(err, ebpf.ErrKeyNotExist): // the end
			return total, nil
		case err != nil:
			return 0, err
		}
	}
}

// Flow is a decoded filter entry.
type Flow struct {
	Local, Remote         netip.AddrPort
	Proto                 string
	Egress, Ingress, Live bool // Live: of the current epoch
	Opener                Opener
	Closing               bool // a FIN or RST of a connection the fast path opened went by
}

// Dest is a decoded egress entry: a remote pod and the node behind it.
type Dest struct {
	Pod, Node netip.Addr
}

// Encap is a decoded header entry.
type Encap struct {
	Node                   netip.Addr
	Ifindex                int
	OuterSrc, OuterDst     net.HardwareAddr
	InnerSrc, InnerDst     net.HardwareAddr
	OuterSrcIP, OuterDstIP netip.Addr
}

// Local is a decoded local-pod entry.
type Local struct {
	Pod             netip.Addr
	Ifindex         int
	PodMAC, HostMAC net.HardwareAddr
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "tcp"
	case 17:
		return "udp"
	}
	return fmt.Sprint(p)
}

// Flows lists the filter cache.
func (d *Datapath) Flows() ([]Flow, error) {
	c, err := d.config()
	if err != nil {
		return nil, err
	}
	out, err := appendEach(nil, d.maps.OncFilter, func(k FlowKey, v *FlowVal) Flow { return decodeFlow(k, *v, c.Epoch) })
	if err != nil {
		return nil, err
	}
	return appendEach(out, d.maps.OncFilter6, func(k FlowKey6, v *FlowVal) Flow { return decodeFlow6(k, *v, c.Epoch) })
}

// appendEach appends to out each entry of m as decode makes it.
func appendEach[K, V, T any](out []T, m *ebpf.Map, decode func(K, *V) T) ([]T, error) {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		out = append(out, decode(k, &v))
	}
	return out, it.Err()
}

// decodeFlow is a filter entry as onctl shows it; a direction is learned
// when its byte is not 0, as the programs read it (include/fastpath.h, flow_allowed).
func decodeFlow(k FlowKey, v FlowVal, epoch uint32) Flow {
	return flowOf(bpf.IPv4(k.LocalIp), bpf.IPv4(k.RemoteIp), k.LocalPort, k.RemotePort, k.Proto, v, epoch)
}

func decodeFlow6(k FlowKey6, v FlowVal, epoch uint32) Flow {
	return flowOf(netip.AddrFrom16(k.LocalIp), netip.AddrFrom16(k.RemoteIp), k.LocalPort, k.RemotePort, k.Proto, v, epoch)
}

// flowOf is a filter entry of either family (ports in network order).
func flowOf(local, remote netip.Addr, localPort, remotePort uint16, proto uint8, v FlowVal, epoch uint32) Flow {
	return Flow{
		Local:  netip.AddrPortFrom(local, bpf.NetPort(localPort)),
		Remote: netip.AddrPortFrom(remote, bpf.NetPort(remotePort)),
		Proto:  protoName(proto), Egress: v.Egress != 0, Ingress: v.Ingress != 0, Live: v.Epoch == epoch,
		Opener: Opener(v.Opener), Closing: v.Closing != 0,
	}
}

// Dests lists the egress cache: remote pods of either family and the
// node each was last seen behind, by its endpoint of either family.
func (d *Datapath) Dests() ([]Dest, error) {
	out, err := appendEach(nil, d.maps.OncEgress, func(k uint32, v *EgressVal) Dest { return decodeDest(k, *v) })
	if err != nil {
		return nil, err
	}
	out, err = appendEach(out, d.maps.OncEgress6, func(k addr6, v *EgressVal) Dest {
		return Dest{Pod: netip.AddrFrom16(k.Addr), Node: bpf.IPv4(v.NodeIp)}
	})
	if err != nil {
		return nil, err
	}
	return appendEach(out, d.maps.OncEgress6U6, func(k addr6, v *addr6) Dest {
		return Dest{Pod: netip.AddrFrom16(k.Addr), Node: netip.AddrFrom16(v.Addr)}
	})
}

func decodeDest(k uint32, v EgressVal) Dest {
	return Dest{Pod: bpf.IPv4(k), Node: bpf.IPv4(v.NodeIp)}
}

// Encaps lists the learned headers, to IPv4 endpoints and to IPv6 ones.
func (d *Datapath) Encaps() ([]Encap, error) {
	out, err := appendEach(nil, d.maps.OncEncap, decodeEncap)
	if err != nil {
		return nil, err
	}
	return appendEach(out, d.maps.OncEncapU6, decodeEncap6)
}

func decodeEncap(k uint32, v *EncapVal) Encap {
	h := v.Hdr[:]
	return Encap{
		Node: bpf.IPv4(k), Ifindex: int(v.Ifindex),
		OuterDst: net.HardwareAddr(append([]byte(nil), h[0:6]...)), OuterSrc: net.HardwareAddr(append([]byte(nil), h[6:12]...)),
		OuterSrcIP: netip.AddrFrom4([4]byte(h[26:30])), OuterDstIP: netip.AddrFrom4([4]byte(h[30:34])),
		InnerDst: net.HardwareAddr(append([]byte(nil), h[50:56]...)), InnerSrc: net.HardwareAddr(append([]byte(nil), h[56:62]...)),
	}
}

// decodeEncap6 is decodeEncap for a header to an IPv6 endpoint (outer
// IPv6 addresses at 22 and 38, the inner Ethernet header at 70).
func decodeEncap6(k addr6, v *Encap6Val) Encap {
	h := v.Hdr[:]
	return Encap{
		Node: netip.AddrFrom16(k.Addr), Ifindex: int(v.Ifindex),
		OuterDst: net.HardwareAddr(append([]byte(nil), h[0:6]...)), OuterSrc: net.HardwareAddr(append([]byte(nil), h[6:12]...)),
		OuterSrcIP: netip.AddrFrom16([16]byte(h[22:38])), OuterDstIP: netip.AddrFrom16([16]byte(h[38:54])),
		InnerDst: net.HardwareAddr(append([]byte(nil), h[70:76]...)), InnerSrc: net.HardwareAddr(append([]byte(nil), h[76:82]...)),
	}
}

// Locals lists the local pods the ingress fast path delivers to.
func (d *Datapath) Locals() ([]Local, error) {
	out, err := appendEach(nil, d.maps.OncLocal, func(k uint32, v *LocalPod) Local { return decodeLocal(bpf.IPv4(k), v) })
	if err != nil {
		return nil, err
	}
	return appendEach(out, d.maps.OncLocal6, func(k addr6, v *LocalPod) Local { return decodeLocal(netip.AddrFrom16(k.Addr), v) })
}

func decodeLocal(pod netip.Addr, v *LocalPod) Local {
	return Local{Pod: pod, Ifindex: int(v.Ifindex),
		PodMAC: net.HardwareAddr(append([]byte(nil), v.PodMac[:]...)), HostMAC: net.HardwareAddr(append([]byte(nil), v.HostMac[:]...))}
}
