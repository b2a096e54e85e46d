package services

import (
	"errors"
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
		s.VIP, s.Port, s.Proto, s.Scope = k.VIP, k.Port, k.Proto, k.Scope
		out = append(out, ServiceState{Service: s, Translated: st.Translated, Refused: st.Refused})
	}
	slices.SortFunc(out, func(a, b ServiceState) int { return a.Key().Compare(b.Key()) })
	return out, nil
}

// Affinity is a ClientIP affinity entry.
type Affinity struct {
	Netns uint64
	// Pod is the client pod, the zero Addr for the host, or for a
	// service of the uplink scope the client's address (Netns is then
	// 0); Gone: the namespace is no longer this node's (the pod was
	// deleted).
	Pod     netip.Addr
	Gone    bool
	Service Key
	Backend netip.AddrPort
	Age     time.Duration // since the client's last connection
}

// Affinities lists the live affinity entries (of services that exist,
// within their timeout).
func (lb *LB) Affinities() ([]Affinity, error) {
	owned, err := lb.Owned()
	if err != nil {
		return nil, err
	}
	lb.mu.Lock()
	byID := make(map[uint32]affinityService, len(lb.services))
	for k, p := range lb.services {
		byID[p.id] = affinityService{k, p.svc.Affinity}
	}
	lb.mu.Unlock()
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, err
	}
	now := uint64(ts.Nano())
	var out []Affinity
	keep := func(a Affinity, live bool) {
		if live {
			out = append(out, a)
		}
	}
	err4 := each(lb.maps.OncLbAff, func(k bpf.ServicesLbAffKey, v bpf.ServicesLbAff) {
		keep(decodeAffinity(k, v, now, byID, owned))
	})
	err6 := each(lb.maps.OncLb6Aff, func(k bpf.ServicesLbAffKey, v bpf.ServicesLb6Aff) {
		keep(affinityAt(k, backendAddr6(v.Be), v.LastNs, now, byID, owned))
	})
	errUp6 := each(lb.maps.OncLb6UplinkAff, func(k bpf.ServicesLb6UplinkAffKey, v bpf.ServicesLb6Aff) {
		keep(uplinkAffinity6(k, v, now, byID))
	})
	return out, errors.Join(err4, err6, errUp6)
}

// uplinkAffinity6 is an entry of onc_lb6_uplink_aff, the uplink's ClientIP
// affinity in IPv6, keyed by the client's address, as decodeAffinity
// reads the others.
func uplinkAffinity6(k bpf.ServicesLb6UplinkAffKey, v bpf.ServicesLb6Aff, now uint64, byID map[uint32]affinityService) (Affinity, bool) {
	a, live := affinityAt(bpf.ServicesLbAffKey{SvcId: k.SvcId}, backendAddr6(v.Be), v.LastNs, now, byID, nil)
	if !live || a.Service.Scope != Uplink {
		return Affinity{}, false
	}
	a.Pod = bpf.IPv6(k.Client)
	return a, true
}

// affinityService is what an affinity entry's service id names.
type affinityService struct {
	service Key
	timeout time.Duration
}

// decodeAffinity is an affinity entry as onctl shows it, read at now;
// live is false for one of no service, or past its service's timeout. A
// program may have stamped it after now was read: its age is then 0.
func decodeAffinity(k bpf.ServicesLbAffKey, v bpf.ServicesLbAff, now uint64, byID map[uint32]affinityService,
	owned map[uint64]netip.Addr) (a Affinity, live bool) {
	return affinityAt(k, backendAddr(v.Be), v.LastNs, now, byID, owned)
}

// affinityAt is decodeAffinity of an entry of either family: its key, its
// backend and the time of its last connection.
func affinityAt(k bpf.ServicesLbAffKey, be netip.AddrPort, last, now uint64, byID map[uint32]affinityService,
	owned map[uint64]netip.Addr) (a Affinity, live bool) {
	of, ok := byID[k.SvcId]
	var age time.Duration
	if now > last {
		age = time.Duration(now - last)
	}
	if !ok || age > of.timeout {
		return Affinity{}, false
	}
	if of.service.Scope == Uplink { // keyed by the client's address (services_uplink.h)
		return Affinity{Pod: bpf.IPv4(uint32(k.Netns)), Service: of.service, Backend: be, Age: age}, true
	}
	pod, mine := owned[k.Netns]
	return Affinity{Netns: k.Netns, Pod: pod, Gone: !mine, Service: of.service, Backend: be, Age: age}, true
}

// Stats sums the programs' counters over the CPUs: the cgroup programs'
// (the IPv4 hooks', then the IPv6 hooks', named with a 6), the UDP socket
// iterator's, then the uplink programs' (named uplink_*; in IPv6
// uplink6_*, their fast path's too) and their direct server return's
// (dsr_*; in IPv6 dsr6_*).
func (lb *LB) Stats() ([]bpf.Counter, error) {
	var all []bpf.Counter
	for _, c := range []*bpf.Counters{lb.counters, lb.counters6, lb.udp.counters, lb.uplink, lb.uplink6, lb.uplink6f, lb.dsr, lb.dsr6} {
		st, err := c.Read()
		if err != nil {
			return nil, err
		}
		all = append(all, st...)
	}
	return all, nil
}
