package fastpath

import (
	"fmt"
	"net"
	"net/netip"
	"strings"

	"github.com/cilium/ebpf/btf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Stat is one counter, named as in the C enum onc_stat without "STAT_",
// in lower case (egress_hit, egress_miss_flow, ...).
type Stat struct {
	Name  string
	Value uint64
}

// statNames reads the counter names from the programs' BTF, so they can
// never drift from the C enum.
func statNames() ([]string, error) {
	spec, err := bpf.LoadEgressFast()
	if err != nil {
		return nil, err
	}
	var enum *btf.Enum
	if err := spec.Types.TypeByName("onc_stat", &enum); err != nil {
		return nil, fmt.Errorf("counter names: %w", err)
	}
	names := make([]string, 0, len(enum.Values))
	for _, v := range enum.Values {
		if v.Name == "STAT_MAX" {
			continue
		}
		names = append(names, strings.ToLower(strings.TrimPrefix(v.Name, "STAT_")))
	}
	return names, nil
}

// Stats sums every counter over the CPUs.
func (d *Datapath) Stats() ([]Stat, error) {
	names, err := statNames()
	if err != nil {
		return nil, err
	}
	out := make([]Stat, len(names))
	for i, n := range names {
		var per []uint64
		if err := d.maps.OncStats.Lookup(uint32(i), &per); err != nil {
			return nil, err
		}
		out[i].Name = n
		for _, v := range per {
			out[i].Value += v
		}
	}
	return out, nil
}

// Flow is a decoded filter entry.
type Flow struct {
	Local, Remote         netip.AddrPort
	Proto                 string
	Egress, Ingress, Live bool // Live: of the current epoch
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

func port(p uint16) uint16 { return p>>8 | p<<8 }

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
	var out []Flow
	var k FlowKey
	var v FlowVal
	it := d.maps.OncFilter.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Flow{
			Local:  netip.AddrPortFrom(addrOf(k.LocalIp), port(k.LocalPort)),
			Remote: netip.AddrPortFrom(addrOf(k.RemoteIp), port(k.RemotePort)),
			Proto:  protoName(k.Proto), Egress: v.Egress == 1, Ingress: v.Ingress == 1, Live: v.Epoch == c.Epoch,
		})
	}
	return out, it.Err()
}

// Dests lists the egress cache.
func (d *Datapath) Dests() ([]Dest, error) {
	var out []Dest
	var k uint32
	var v EgressVal
	it := d.maps.OncEgress.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Dest{Pod: addrOf(k), Node: addrOf(v.NodeIp)})
	}
	return out, it.Err()
}

// Encaps lists the learned headers.
func (d *Datapath) Encaps() ([]Encap, error) {
	var out []Encap
	var k uint32
	var v EncapVal
	it := d.maps.OncEncap.Iterate()
	for it.Next(&k, &v) {
		h := v.Hdr[:]
		out = append(out, Encap{
			Node: addrOf(k), Ifindex: int(v.Ifindex),
			OuterDst: net.HardwareAddr(append([]byte(nil), h[0:6]...)), OuterSrc: net.HardwareAddr(append([]byte(nil), h[6:12]...)),
			OuterSrcIP: netip.AddrFrom4([4]byte(h[26:30])), OuterDstIP: netip.AddrFrom4([4]byte(h[30:34])),
			InnerDst: net.HardwareAddr(append([]byte(nil), h[50:56]...)), InnerSrc: net.HardwareAddr(append([]byte(nil), h[56:62]...)),
		})
	}
	return out, it.Err()
}

// Locals lists the local pods the ingress fast path delivers to.
func (d *Datapath) Locals() ([]Local, error) {
	var out []Local
	var k uint32
	var v LocalPod
	it := d.maps.OncLocal.Iterate()
	for it.Next(&k, &v) {
		out = append(out, Local{Pod: addrOf(k), Ifindex: int(v.Ifindex),
			PodMAC: net.HardwareAddr(append([]byte(nil), v.PodMac[:]...)), HostMAC: net.HardwareAddr(append([]byte(nil), v.HostMac[:]...))})
	}
	return out, it.Err()
}
