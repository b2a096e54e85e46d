package socklb

import (
	"net/netip"
	"slices"
	"time"

	"github.com/onc-net/onc/datapath/bpf"
	"golang.org/x/sys/unix"
)

// ServiceState is a service as programmed, with its counters.
type ServiceState struct {
	Service
	// Translated counts connect()s and sendmsg()s sent to a backend;
	// Refused those failed with ECONNREFUSED for want of one.
	Translated, Refused uint64
}

// Services lists what the programs balance, in key order. A service
// adopted from an earlier agent and not yet rewritten shows no backends.
func (lb *LB) Services() ([]ServiceState, error) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	out := make([]ServiceState, 0, len(lb.services))
	for k, p := range lb.services {
		var st svcStat
		if err := lb.maps.OncLbSvcStats.Lookup(p.id, &st); err != nil {
			return nil, err
		}
		s := p.svc
		s.VIP, s.Port, s.Proto = k.VIP, k.Port, k.Proto
		out = append(out, ServiceState{Service: s, Translated: st.Translated, Refused: st.Refused})
	}
	slices.SortFunc(out, func(a, b ServiceState) int { return a.Key().Compare(b.Key()) })
	return out, nil
}

// Affinity is a ClientIP affinity entry.
type Affinity struct {
	Netns   uint64
	Pod     netip.Addr // the client pod; the zero Addr for the host or an unknown namespace
	Service Key
	Backend netip.AddrPort
	Age     time.Duration // since the client's last connection
}

// Affinities lists the affinity entries of services that still exist.
func (lb *LB) Affinities() ([]Affinity, error) {
	owned, err := lb.Owned()
	if err != nil {
		return nil, err
	}
	lb.mu.Lock()
	byID := make(map[uint32]Key, len(lb.services))
	for k, p := range lb.services {
		byID[p.id] = k
	}
	lb.mu.Unlock()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, err
	}
	now := uint64(ts.Nano())
	var out []Affinity
	var k bpf.SockConnect4LbAffKey
	var v bpf.SockConnect4LbAff
	it := lb.maps.OncLbAff.Iterate()
	for it.Next(&k, &v) {
		key, ok := byID[k.SvcId]
		if !ok {
			continue
		}
		out = append(out, Affinity{Netns: k.Netns, Pod: owned[k.Netns], Service: key,
			Backend: backendAddr(v.Be), Age: time.Duration(now - v.LastNs)})
	}
	return out, it.Err()
}

// RevNAT is a socket's reverse translation: replies from Backend read as
// from Service.
type RevNAT struct {
	Socket  uint64 // the socket's cookie
	Backend netip.AddrPort
	Service netip.AddrPort
	Proto   Proto
}

// RevNATs lists the reverse translations of open (or recently closed
// unconnected UDP) sockets.
func (lb *LB) RevNATs() ([]RevNAT, error) {
	var out []RevNAT
	var k bpf.SockConnect4LbRevnatKey
	var v bpf.SockConnect4LbRevnat
	it := lb.maps.OncLbRevnat.Iterate()
	for it.Next(&k, &v) {
		out = append(out, RevNAT{Socket: k.Sock, Backend: backendAddr(k.Be), Service: backendAddr(v.Vip), Proto: Proto(k.Proto)})
	}
	return out, it.Err()
}

// Stats sums the programs' counters over the CPUs.
func (lb *LB) Stats() ([]bpf.Counter, error) {
	return bpf.ReadCounters(lb.maps.OncLbStats, bpf.LoadSockConnect4, "lb_stat", "LB_STAT_")
}
