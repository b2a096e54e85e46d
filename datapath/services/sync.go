package services

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Map value and key types, as datapath/bpf/include/services.h defines them.
type (
	svcKey     = bpf.ServicesLbSvcKey
	svcVal     = bpf.ServicesLbSvc
	backendKey = bpf.ServicesLbBackendKey
	lbAddr     = bpf.ServicesLbAddr
	memberKey  = bpf.ServicesLbMemberKey
	svcStat    = bpf.ServicesLbSvcStat
)

const (
	flagAffinity      = 1              // LB_SVC_AFFINITY
	flagKeepClient    = 4              // LB_SVC_KEEP_CLIENT
	flagDropWhenEmpty = 8              // LB_SVC_DROP_WHEN_EMPTY
	flagDSR           = 16             // LB_SVC_DSR
	maxServices       = 65536          // LB_MAX_SERVICES
	maxBackends       = math.MaxUint16 // lb_svc.count is 16 bits
)

// programmed is a service as this agent last wrote it.
type programmed struct {
	svc  Service
	id   uint32
	bank uint8 // the live bank
	// banks counts the slots written in each bank, so a rewrite or a
	// removal deletes exactly those beyond the new set.
	banks   [2]uint16
	members map[netip.AddrPort]bool // affinity membership entries written
	ranges  map[netip.Prefix]bool   // source range entries written (masked)
	adopted bool                    // found pinned at start, or drifted: rewritten on the next Sync
	flipped time.Time               // when the live bank last changed
}

// bankGrace is how long a bank stays untouched after the service flips
// away from it: a program that read the service entry just before the
// flip may still look up a slot of the old bank. Programs run for
// microseconds; a service updated again sooner waits out the rest.
const bankGrace = 50 * time.Millisecond

// adopt reads what an earlier agent left in the pinned maps of both
// families, so ids and banks carry on and stale entries can be removed.
func (lb *LB) adopt() error {
	var errs []error
	for _, f := range lb.families() {
		byID, err := lb.adoptFamily(f)
		if err != nil {
			return err
		}
		errs = append(errs, lb.adoptRanges(f, byID))
	}
	return errors.Join(errs...)
}

// adoptFamily adopts f's services, and deletes its backends and members
// of no service of f; it returns f's services by id.
func (lb *LB) adoptFamily(f family) (map[uint32]*programmed, error) {
	byID := map[uint32]*programmed{}
	if err := f.eachService(func(k Key, v svcVal) {
		p := &programmed{id: v.Id, bank: v.Bank, members: map[netip.AddrPort]bool{}, ranges: map[netip.Prefix]bool{}, adopted: true}
		lb.services[k] = p
		byID[v.Id] = p
		lb.ids.used(v.Id)
	}); err != nil {
		return nil, fmt.Errorf("read service map: %w", err)
	}
	var orphans []backendKey
	if err := each(f.backend, func(bk backendKey, _ []byte) {
		p := byID[bk.SvcId]
		if p == nil {
			orphans = append(orphans, bk)
			return
		}
		p.banks[bk.Bank&1] = max(p.banks[bk.Bank&1], bk.Slot+1)
	}); err != nil {
		return nil, fmt.Errorf("read backend map: %w", err)
	}
	var strays []any
	if err := f.eachMember(func(id uint32, be netip.AddrPort) {
		if p := byID[id]; p != nil {
			p.members[be] = true
		} else {
			strays = append(strays, memberOf(id, be))
		}
	}); err != nil {
		return nil, fmt.Errorf("read member map: %w", err)
	}
	return byID, errors.Join(deleteAll(f.backend, orphans), deleteAll(f.member, strays))
}

func deleteAll[K any](m *ebpf.Map, keys []K) error {
	for _, k := range keys {
		if err := m.Delete(k); err != nil && !isNotExist(err) {
			return err
		}
	}
	return nil
}

func isNotExist(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

// Sync makes the maps balance exactly svcs, writing only the services
// that changed; with verify it also reads every service's entries back and
// rewrites those that drifted. A failed service is reported and the others
// still written; the caller retries.
func (lb *LB) Sync(svcs []Service, verify bool) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	defer lb.publishServices()
	if verify {
		lb.markDrifted()
		lb.nodePort6Set = false
	}
	want := make(map[Key]Service, len(svcs))
	for _, s := range svcs {
		want[s.Key()] = s
		lb.warnSmall6(s)
	}
	before := lb.udpBackendsBefore(want)
	var errs []error
	for k, p := range lb.services {
		if _, ok := want[k]; !ok {
			if err := lb.remove(k, p); err != nil {
				errs = append(errs, fmt.Errorf("remove service %s: %w", k, err))
			}
		}
	}
	for k, s := range want {
		p := lb.services[k]
		if p != nil && !p.adopted && sameService(p.svc, s) {
			continue
		}
		if err := lb.write(k, p, s); err != nil {
			errs = append(errs, fmt.Errorf("service %s (%s): %w", k, s.Name, err))
		}
	}
	errs = append(errs, lb.setNodePort6(svcs), lb.endLeftUDP(before))
	return errors.Join(errs...)
}

// setNodePort6 writes onc_lb6_dsr_nodeport: an IPv6 address svcs serve
// NodePorts on from outside (the least, so that it changes only when that
// one goes), or none. A peer's IPv6 DSR frame through its own NodePort is
// taken if this node serves the same port there: every node address gets
// every NodePort, and no node knows another's IPv6 addresses.
func (lb *LB) setNodePort6(svcs []Service) error {
	var addr netip.Addr
	for _, s := range svcs {
		if s.Frontend == NodePort && s.Scope == Uplink && s.VIP.Is6() && !s.VIP.Is4In6() &&
			(!addr.IsValid() || s.VIP.Less(addr)) {
			addr = s.VIP
		}
	}
	if lb.nodePort6Set && addr == lb.nodePort6 {
		return nil
	}
	var v [16]byte
	if addr.IsValid() {
		v = addr.As16()
	}
	if err := lb.maps.OncLb6DsrNodeport.Put(uint32(0), v); err != nil {
		lb.nodePort6Set = false
		return fmt.Errorf("IPv6 NodePort address for direct server return: %w", err)
	}
	lb.nodePort6, lb.nodePort6Set = addr, true
	return nil
}

// warnSmall6 warns, once, of an IPv6 Service with endpoints on a node
// loaded without IPv6 (lru6Small).
func (lb *LB) warnSmall6(s Service) {
	if lb.opts.IPv6 || lb.warned6 || !s.VIP.Is6() || len(s.Backends) == 0 {
		return
	}
	lb.warned6 = true
	slog.Warn("an IPv6 Service has endpoints, but the node's cluster has no IPv6 pods: its sockets' reverse translation and affinity, and the uplink's IPv6 flows and affinity, get small maps; once they fill, getpeername() and UDP replies may show a backend's address, and flows from outside may lose their backend",
		"service", s.Name, "entries", lru6Small)
}

// markDrifted marks for rewriting every service whose entry (its
// backends' count and bank, flags, affinity timeout), live backends,
// affinity members or source ranges differ from what was written. A
// member or range that vanished is forgotten as written, so the rewrite
// puts it back.
func (lb *LB) markDrifted() {
	ranges, err := lb.readRanges()
	rangesRead := err == nil
	var one uint8
	for k, p := range lb.services {
		if p.adopted {
			continue
		}
		f := lb.familyOf(k.VIP)
		var v svcVal
		if f.svc.Lookup(k.mapKey(), &v) != nil || v.Id != p.id || v.Bank != p.bank || int(v.Count) != len(p.svc.Backends) ||
			v.Flags != flagsOf(p.svc) || v.AffTimeout != affTimeoutOf(p.svc) {
			p.adopted = true
			continue
		}
		for i, b := range p.svc.Backends {
			if a, err := f.backendAt(backendKey{SvcId: p.id, Slot: uint16(i), Bank: p.bank}); err != nil || a != b.Addr {
				p.adopted = true
				break
			}
		}
		for m := range p.members {
			if f.member.Lookup(memberOf(p.id, m), &one) != nil {
				delete(p.members, m)
				p.adopted = true
			}
		}
		for r := range p.ranges {
			if !rangesRead || !ranges[srcRange{p.id, r}] {
				delete(p.ranges, r)
				p.adopted = true
			}
		}
	}
}

// flagsOf is lb_svc.flags for s.
func flagsOf(s Service) uint8 {
	var flags uint8
	if s.DropWhenEmpty {
		flags |= flagDropWhenEmpty
	}
	if s.KeepClient {
		flags |= flagKeepClient
	}
	if s.DSR {
		flags |= flagDSR
	}
	if len(s.SourceRanges) > 0 {
		flags |= flagSourceRanges
	}
	if s.Affinity > 0 {
		flags |= flagAffinity
	}
	return flags
}

func affTimeoutOf(s Service) uint32 { return uint32(min(s.Affinity.Seconds(), math.MaxUint32)) }

func sameService(a, b Service) bool {
	return a.Name == b.Name && a.Frontend == b.Frontend && a.Affinity == b.Affinity && a.DropWhenEmpty == b.DropWhenEmpty &&
		a.KeepClient == b.KeepClient && a.DSR == b.DSR && slices.Equal(a.SourceRanges, b.SourceRanges) && slices.Equal(a.Backends, b.Backends)
}

// write puts s's backends into the idle bank, then flips the service to
// it in one update; the old bank stays until the next write of s, and at
// least bankGrace, so a socket that read the old entry still finds its
// backend.
func (lb *LB) write(k Key, p *programmed, s Service) error {
	if len(s.Backends) > maxBackends {
		return fmt.Errorf("%d backends; at most %d are balanced", len(s.Backends), maxBackends)
	}
	if err := checkFamilies(s); err != nil {
		return err
	}
	f := lb.familyOf(k.VIP)
	if p == nil {
		id, err := lb.ids.take()
		if err != nil {
			return err
		}
		// The id may have served a removed service: its counters start afresh.
		if err := lb.maps.OncLbSvcStats.Put(id, svcStat{}); err != nil {
			lb.ids.release(id)
			return err
		}
		p = &programmed{id: id, bank: 1, members: map[netip.AddrPort]bool{}, ranges: map[netip.Prefix]bool{}}
		lb.services[k] = p
	}
	idle := p.bank ^ 1
	time.Sleep(time.Until(p.flipped.Add(bankGrace)))
	size := &p.banks
	// Counted before writing, so a write that fails halfway leaves no slot
	// the next write or a removal would not delete.
	written := size[idle]
	size[idle] = max(size[idle], uint16(len(s.Backends)))
	for i, b := range s.Backends {
		if err := f.backend.Put(backendKey{SvcId: p.id, Slot: uint16(i), Bank: idle}, backendValue(b.Addr)); err != nil {
			return err
		}
	}
	for i := len(s.Backends); i < int(written); i++ {
		if err := f.backend.Delete(backendKey{SvcId: p.id, Slot: uint16(i), Bank: idle}); err != nil && !isNotExist(err) {
			return err
		}
	}
	size[idle] = uint16(len(s.Backends))
	members := map[netip.AddrPort]bool{}
	if len(s.SourceRanges) > 0 {
		if err := lb.addRanges(p, s); err != nil {
			return err
		}
	}
	if s.Affinity > 0 {
		for _, b := range s.Backends {
			members[b.Addr] = true
		}
	}
	for m := range members {
		if !p.members[m] {
			if err := f.member.Put(memberOf(p.id, m), uint8(1)); err != nil {
				return err
			}
			p.members[m] = true
		}
	}
	v := svcVal{Id: p.id, Count: uint16(len(s.Backends)), Bank: idle, Flags: flagsOf(s), AffTimeout: affTimeoutOf(s)}
	if err := f.svc.Put(k.mapKey(), v); err != nil {
		return err
	}
	p.bank, p.flipped = idle, time.Now()
	for m := range p.members {
		if !members[m] {
			if err := f.member.Delete(memberOf(p.id, m)); err != nil && !isNotExist(err) {
				return err
			}
			delete(p.members, m)
		}
	}
	if err := lb.pruneRanges(p, s); err != nil {
		return err
	}
	p.svc = s
	p.svc.Backends = slices.Clone(s.Backends)
	p.adopted = false
	return nil
}

// remove deletes the service entry first, so no socket picks a slot of a
// bank that is going.
func (lb *LB) remove(k Key, p *programmed) error {
	f := lb.familyOf(k.VIP)
	if err := f.svc.Delete(k.mapKey()); err != nil && !isNotExist(err) {
		return err
	}
	for bank := range uint8(2) {
		for i := range p.banks[bank] {
			if err := f.backend.Delete(backendKey{SvcId: p.id, Slot: i, Bank: bank}); err != nil && !isNotExist(err) {
				return err
			}
		}
	}
	for m := range p.members {
		if err := f.member.Delete(memberOf(p.id, m)); err != nil && !isNotExist(err) {
			return err
		}
	}
	if err := lb.pruneRanges(p, Service{}); err != nil {
		return err
	}
	delete(lb.services, k)
	lb.ids.release(p.id)
	return nil
}

// idPool hands out service ids, 1 to maxServices-1; 0 is never used, so
// a zeroed entry names no service.
type idPool struct {
	taken map[uint32]bool
	next  uint32
}

func (p *idPool) used(id uint32) {
	if p.taken == nil {
		p.taken = map[uint32]bool{}
	}
	p.taken[id] = true
}

func (p *idPool) take() (uint32, error) {
	for range maxServices {
		p.next = p.next%(maxServices-1) + 1
		if !p.taken[p.next] {
			p.used(p.next)
			return p.next, nil
		}
	}
	return 0, fmt.Errorf("more than %d services", maxServices-1)
}

func (p *idPool) release(id uint32) { delete(p.taken, id) }

// Unbalance deletes one service's entry from the pinned service map, from
// the pin alone, before an agent has loaded anything: new connections to it
// go to kube-proxy until the next Sync writes it again. The agent does this
// for the API server's Service, which it dials through its ClusterIP while
// the entry an earlier agent left may name API servers that have moved.
func Unbalance(pinDir string, k Key) error {
	name := bpf.ServicesMapOncLbSvc
	if !k.VIP.Is4() {
		name = bpf.ServicesMapOncLb6Svc
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer m.Close()
	if err := m.Delete(k.mapKey()); err != nil && !isNotExist(err) {
		return err
	}
	return nil
}
