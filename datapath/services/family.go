package services

import (
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Each family's entries are in maps of their own (include/services.h):
// onc_lb_* keyed by IPv4 addresses, onc_lb6_* by IPv6 ones, so that the
// IPv4 maps kept their layout when IPv6 came and an upgrade adopts them.
// Service ids are one pool for both, so onc_lb_svc_stats (by id) serves
// both. What follows turns the model's addresses into either family's
// keys and values.

type (
	svc6Key    = bpf.ServicesLb6SvcKey
	lb6Addr    = bpf.ServicesLb6Addr
	member6Key = bpf.ServicesLb6MemberKey
)

// family is one address family's maps.
type family struct {
	is6                        bool
	svc, backend, member, gone *ebpf.Map
}

// families are the IPv4 maps, then the IPv6 ones.
func (lb *LB) families() [2]family {
	m := lb.maps
	return [2]family{
		{svc: m.OncLbSvc, backend: m.OncLbBackend, member: m.OncLbMember, gone: m.OncLbGone},
		{is6: true, svc: m.OncLb6Svc, backend: m.OncLb6Backend, member: m.OncLb6Member, gone: m.OncLb6Gone},
	}
}

// familyOf is the family whose maps hold entries of a.
func (lb *LB) familyOf(a netip.Addr) family {
	f := lb.families()
	if a.Is4() {
		return f[0]
	}
	return f[1]
}

// checkFamilies reports what no map of either family can hold: a frontend
// and backends of different families, and an IPv4-mapped IPv6 address (the
// programs key such a socket's calls by the IPv4 address). Either family
// serves either scope, and direct server return in either family
// (include/services_dsr6.h for IPv6).
func checkFamilies(s Service) error {
	if s.VIP.Is4In6() || !s.VIP.IsValid() || s.VIP.Zone() != "" {
		return fmt.Errorf("frontend %s: want an IPv4 or IPv6 address", s.VIP)
	}
	for _, b := range s.Backends {
		if b.Addr.Addr().Is4() != s.VIP.Is4() || b.Addr.Addr().Is4In6() {
			return fmt.Errorf("backend %s: not of the frontend's family", b.Addr)
		}
	}
	return nil
}

// mapKey is k as its family's service map keys it.
func (k Key) mapKey() any {
	port, proto, scope := bpf.NetPort(k.Port), uint8(k.Proto), uint8(k.Scope)
	if k.VIP.Is4() {
		return svcKey{Vip: bpf.NetIPv4(k.VIP), Port: port, Proto: proto, Scope: scope}
	}
	return svc6Key{Vip: bpf.NetIPv6(k.VIP), Port: port, Proto: proto, Scope: scope}
}

func keyOf(k svcKey) Key {
	return Key{VIP: bpf.IPv4(k.Vip), Port: bpf.NetPort(k.Port), Proto: Proto(k.Proto), Scope: Scope(k.Scope)}
}

func keyOf6(k svc6Key) Key {
	return Key{VIP: bpf.IPv6(k.Vip), Port: bpf.NetPort(k.Port), Proto: Proto(k.Proto), Scope: Scope(k.Scope)}
}

func addrOfBackend(a netip.AddrPort) lbAddr {
	return lbAddr{Ip: bpf.NetIPv4(a.Addr()), Port: bpf.NetPort(a.Port())}
}

func addr6OfBackend(a netip.AddrPort) lb6Addr {
	return lb6Addr{Ip: bpf.NetIPv6(a.Addr()), Port: bpf.NetPort(a.Port())}
}

func backendAddr(a lbAddr) netip.AddrPort {
	return netip.AddrPortFrom(bpf.IPv4(a.Ip), bpf.NetPort(a.Port))
}

func backendAddr6(a lb6Addr) netip.AddrPort {
	return netip.AddrPortFrom(bpf.IPv6(a.Ip), bpf.NetPort(a.Port))
}

// backendValue is a backend as its family's backend map holds it.
func backendValue(a netip.AddrPort) any {
	if a.Addr().Is4() {
		return addrOfBackend(a)
	}
	return addr6OfBackend(a)
}

// memberOf is (service id, backend) as its family's member and gone maps
// key it.
func memberOf(id uint32, a netip.AddrPort) any {
	if a.Addr().Is4() {
		return memberKey{SvcId: id, Be: addrOfBackend(a)}
	}
	return member6Key{SvcId: id, Be: addr6OfBackend(a)}
}

// backendAt is the backend in a slot of f's backend map.
func (f family) backendAt(k backendKey) (netip.AddrPort, error) {
	if f.is6 {
		var a lb6Addr
		err := f.backend.Lookup(k, &a)
		return backendAddr6(a), err
	}
	var a lbAddr
	err := f.backend.Lookup(k, &a)
	return backendAddr(a), err
}

// eachService calls fn with every entry of f's service map.
func (f family) eachService(fn func(Key, svcVal)) error {
	if f.is6 {
		return each(f.svc, func(k svc6Key, v svcVal) { fn(keyOf6(k), v) })
	}
	return each(f.svc, func(k svcKey, v svcVal) { fn(keyOf(k), v) })
}

// eachMember calls fn with every (service id, backend) of f's member map.
func (f family) eachMember(fn func(uint32, netip.AddrPort)) error {
	if f.is6 {
		return each(f.member, func(k member6Key, _ uint8) { fn(k.SvcId, backendAddr6(k.Be)) })
	}
	return each(f.member, func(k memberKey, _ uint8) { fn(k.SvcId, backendAddr(k.Be)) })
}

// each calls fn with every entry of m.
func each[K, V any](m *ebpf.Map, fn func(K, V)) error {
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		fn(k, v)
	}
	return it.Err()
}
