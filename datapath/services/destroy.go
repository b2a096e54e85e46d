package services

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/netns"
)

// A connected UDP socket keeps the backend it was translated to at
// connect() for as long as it lives. When that backend leaves its Service,
// kube-proxy deletes the conntrack entries so the client's next datagram
// is balanced again; here the iterator onc_sock_udp_destroy ends the
// socket (ECONNABORTED) so the client connects again and is balanced
// again. TCP is left to finish, as kube-proxy leaves it.

// udpEnder ends connected UDP sockets whose backend left.
type udpEnder struct {
	iter *link.Iter // nil: the kernel cannot end sockets (no bpf_sock_destroy)
	// pending are the left backends whose sockets an earlier Sync failed
	// to end in some namespace; the next Sync tries again.
	pending  map[departure]bool
	counters *bpf.Counters
}

// departure is a backend that left a service, of either family.
type departure struct {
	id uint32
	be netip.AddrPort
}

// openUDPEnder readies the iterator where the kernel has bpf_sock_destroy
// (Linux 6.5); elsewhere the program loads (its kfunc is weak) and is
// never run, and connected UDP sockets keep their backend until they close.
func (lb *LB) openUDPEnder(counters *ebpf.MapSpec) error {
	var err error
	lb.udp.pending = map[departure]bool{}
	if lb.udp.counters, err = bpf.NewCounters(lb.maps.OncLbDestroyStats, counters); err != nil {
		return err
	}
	if err := sockDestroySupported(); err != nil {
		slog.Warn("connected UDP sockets keep sending to a backend that left their Service until they close", "reason", err)
		return nil
	}
	lb.udp.iter, err = link.AttachIter(link.IterOptions{Program: lb.objs.OncSockUdpDestroy})
	if err != nil {
		return fmt.Errorf("UDP socket iterator: %w", err)
	}
	return nil
}

func sockDestroySupported() error {
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		return fmt.Errorf("kernel BTF: %w", err)
	}
	var fn *btf.Func
	if err := spec.TypeByName("bpf_sock_destroy", &fn); err != nil {
		return fmt.Errorf("the kernel has no bpf_sock_destroy (Linux 6.5): %w", err)
	}
	return nil
}

// udpBefore is what each UDP service that may lose backends in this Sync
// balances now: by key, its id and backends.
type udpBefore map[Key]memberSet

type memberSet struct {
	id  uint32
	bes []netip.AddrPort
}

// udpBackendsBefore records, before Sync writes, the backends of each UDP
// service whose set changes or that goes. A service adopted from an
// earlier agent (or drifted) is read from the kernel: its backends may
// have left while no agent ran.
func (lb *LB) udpBackendsBefore(want map[Key]Service) udpBefore {
	before := udpBefore{}
	for k, p := range lb.services {
		s, kept := want[k]
		if k.Proto != UDP || (kept && !p.adopted && slices.Equal(p.svc.Backends, s.Backends)) {
			continue
		}
		set := memberSet{id: p.id}
		if p.adopted {
			set.bes = lb.liveBackends(k)
		} else {
			for _, b := range p.svc.Backends {
				set.bes = append(set.bes, b.Addr)
			}
		}
		before[k] = set
	}
	return before
}

// liveBackends are the backends the kernel balances k to; what cannot be
// read is left out (a socket it misses closes in its own time).
func (lb *LB) liveBackends(k Key) []netip.AddrPort {
	f := lb.familyOf(k.VIP)
	var v svcVal
	if f.svc.Lookup(k.mapKey(), &v) != nil {
		return nil
	}
	var out []netip.AddrPort
	for i := range v.Count {
		if a, err := f.backendAt(backendKey{SvcId: v.Id, Slot: i, Bank: v.Bank}); err == nil {
			out = append(out, a)
		}
	}
	return out
}

// endLeftUDP ends, after Sync wrote, the connected UDP sockets of every
// namespace this node balances whose backend left its service: those of
// before that the service no longer has (all of them when it went), and
// those an earlier Sync failed to end. A service that failed to write is
// not touched: it still balances to its old set. On failure the backends
// are kept for the next Sync.
func (lb *LB) endLeftUDP(before udpBefore) error {
	gone := lb.stillGone()
	for k, old := range before {
		now := map[netip.AddrPort]bool{}
		if p := lb.services[k]; p != nil {
			if p.adopted {
				continue
			}
			for _, b := range p.svc.Backends {
				now[b.Addr] = true
			}
		}
		for _, be := range old.bes {
			if !now[be] {
				gone[departure{old.id, be}] = true
			}
		}
	}
	if len(gone) == 0 {
		return nil
	}
	if err := lb.forgetUplinkFlows(gone); err != nil {
		return fmt.Errorf("forget the uplink's UDP flows to backends that left: %w", err)
	}
	if lb.udp.iter == nil {
		return nil
	}
	err := lb.endSockets(gone)
	if err != nil {
		lb.udp.pending = gone
		return fmt.Errorf("end connected UDP sockets whose backend left (retried on the next sync): %w", err)
	}
	clear(lb.udp.pending)
	return nil
}

// stillGone are the pending backends that have not come back to their
// service since.
func (lb *LB) stillGone() map[departure]bool {
	gone := map[departure]bool{}
	if len(lb.udp.pending) == 0 {
		return gone
	}
	live := map[departure]bool{}
	for _, p := range lb.services {
		for _, b := range p.svc.Backends {
			live[departure{p.id, b.Addr}] = true
		}
	}
	for m := range lb.udp.pending {
		if !live[m] {
			gone[m] = true
		}
	}
	return gone
}

// endSockets lists gone in onc_lb_gone and onc_lb6_gone, runs the
// iterator (which ends sockets of both families) in every namespace this
// node balances, and empties the maps again.
func (lb *LB) endSockets(gone map[departure]bool) error {
	var errs []error
	for d := range gone {
		if err := lb.familyOf(d.be.Addr()).gone.Put(memberOf(d.id, d.be), uint8(1)); err != nil {
			errs = append(errs, fmt.Errorf("list a backend that left: %w", err))
			break
		}
	}
	if len(errs) == 0 {
		var cookie uint64
		var name uint32
		it := lb.maps.OncLbNetns.Iterate()
		for it.Next(&cookie, &name) {
			if err := lb.endIn(cookie); err != nil {
				errs = append(errs, fmt.Errorf("netns %d (pod %s): %w", cookie, lb.podOf(cookie, name), err))
			}
		}
		if err := it.Err(); err != nil {
			errs = append(errs, fmt.Errorf("read the namespaces: %w", err))
		}
	}
	_, err4 := bpf.DeleteIf(lb.maps.OncLbGone, func(memberKey, uint8) bool { return true })
	_, err6 := bpf.DeleteIf(lb.maps.OncLb6Gone, func(member6Key, uint8) bool { return true })
	if err := errors.Join(err4, err6); err != nil {
		errs = append(errs, fmt.Errorf("empty the backends that left: %w", err))
	}
	return errors.Join(errs...)
}

// endIn runs the iterator in the namespace of cookie: a UDP iterator walks
// the sockets of the namespace its reader was in when it opened it.
func (lb *LB) endIn(cookie uint64) error {
	path, known := lb.netns[cookie]
	if !known {
		return errors.New("its path is not known yet (a pod not adopted since the agent started)")
	}
	if path == "" {
		return lb.runIter() // the agent's own: every thread outside netns.Do is there
	}
	ns, err := netns.Open(path)
	if errors.Is(err, netns.ErrNotExist) {
		return nil // the pod is gone, and its sockets with it
	}
	if err != nil {
		return err
	}
	defer ns.Close()
	return netns.Do(ns, lb.runIter)
}

func (lb *LB) runIter() error {
	r, err := lb.udp.iter.Open()
	if err != nil {
		return fmt.Errorf("open the UDP socket iterator: %w", err)
	}
	defer r.Close()
	if _, err := io.Copy(io.Discard, r); err != nil {
		return fmt.Errorf("run the UDP socket iterator: %w", err)
	}
	return nil
}
