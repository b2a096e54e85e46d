package services

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/vishvananda/netlink"
)

// The skb->mark bits the uplink programs set for netfilter, as
// include/services_uplink.h defines them: SNATMark on packets sent to a
// backend without KeepClient (masqueraded unless they go to a pod of this
// node), RejectMark on packets to a service without backends (refused).
const (
	SNATMark   = 0x80000
	RejectMark = 0x100000
)

// MasqueradePorts are the source ports pods' traffic to outside gets when
// the uplink load balancer runs: the kernel's default ephemeral range,
// above the default NodePort range (30000-32767) and common hostPorts. The
// programs take a UDP packet to a frontend's port for a new flow, so a
// reply to a masqueraded pod must not come back to one.
const MasqueradePorts = "32768-60999"

const flagSourceRanges = 2 // LB_SVC_SOURCE_RANGES

type (
	srcKey       = bpf.ServicesLbSrcKey
	src6Key      = bpf.ServicesLb6SrcKey
	internalKey  = bpf.ServicesLbInternalKey
	internal6Key = bpf.ServicesLb6InternalKey
)

// uplinkHook is one uplink program and the tcx hook it serves.
type uplinkHook struct {
	name   string
	attach ebpf.AttachType
	prog   *ebpf.Program
}

func (lb *LB) uplinkHooks() []uplinkHook {
	p := &lb.objs.ServicesPrograms
	return []uplinkHook{
		{uplinkHookNames[0], ebpf.AttachTCXIngress, p.OncUplinkLbIngress},
		{uplinkHookNames[1], ebpf.AttachTCXEgress, p.OncUplinkLbEgress},
	}
}

// uplinkHookNames name the uplink link pins, in the order of uplinkHooks.
var uplinkHookNames = []string{"ingress", "egress"}

func uplinkPin(pinDir, hook string) string { return filepath.Join(pinDir, "link_uplink_lb_"+hook) }

// AttachUplink puts the uplink programs first on ifname's tcx ingress and
// egress, adopting an earlier agent's pinned links, and gives the fast
// path's programs the ones they pass replies on to (FlowCache.Hooks).
// First, because the fast path's programs end the chain on every packet
// they let through; ours let every packet they do not send past the stack
// on to them. Needs tcx (Linux 6.6).
func (lb *LB) AttachUplink(ifname string) error {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("uplink load balancer: %w", err)
	}
	for _, h := range lb.uplinkHooks() {
		if err := attachFirst(l.Attrs().Index, uplinkPin(lb.opts.PinDir, h.name), h.attach, h.prog); err != nil {
			return fmt.Errorf("uplink load balancer on %s %s: %w", ifname, h.name, err)
		}
	}
	if lb.opts.FlowCache == nil {
		return nil
	}
	// Only now: without the uplink programs, flows in a pinned table of
	// an earlier agent's are nobody's to send past the stack.
	return lb.fillHooks(lb.opts.FlowCache.Hooks)
}

// attachFirst swaps prog into the link pinned at pin when that link is on
// ifindex and still first (atomic: no packet misses a program); otherwise
// it attaches prog afresh at the head and pins it.
func attachFirst(ifindex int, pin string, at ebpf.AttachType, prog *ebpf.Program) error {
	info, err := prog.Info()
	if err != nil {
		return err
	}
	id, _ := info.ID()
	if old, err := link.LoadPinnedLink(pin, nil); err == nil {
		li, err := old.Info()
		if err == nil && li.TCX() != nil && int(li.TCX().Ifindex) == ifindex && old.Update(prog) == nil {
			if first, err := firstProgram(ifindex, at); err == nil && first == id {
				return old.Close()
			}
		}
		// Behind another program (one attached afresh at the head since),
		// or elsewhere: detached now, as the attach below would otherwise
		// find this program still on the hook.
		_ = old.Detach()
		old.Close()
		if err := os.Remove(pin); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: link.Head()})
	if err != nil {
		return fmt.Errorf("tcx on ifindex %d: %w", ifindex, err)
	}
	defer l.Close()
	if err := l.Pin(pin); err != nil {
		_ = l.Detach()
		return fmt.Errorf("pin %s: %w", pin, err)
	}
	return nil
}

func firstProgram(ifindex int, at ebpf.AttachType) (ebpf.ProgramID, error) {
	res, err := link.QueryPrograms(link.QueryOptions{Target: ifindex, Attach: at})
	if err != nil {
		return 0, err
	}
	if len(res.Programs) == 0 {
		return 0, errors.New("no program attached")
	}
	return res.Programs[0].ID, nil
}

// RemoveUplink detaches the uplink programs an agent pinned under pinDir
// and empties the fast path's slots for their reply programs (onc_hooks),
// from the pins alone: with the kube-proxy replacement off, no program may
// go on translating with service entries nobody updates. Idempotent.
func RemoveUplink(pinDir string) error {
	errs := []error{clearHooks(pinDir)}
	for _, h := range uplinkHookNames {
		pin := uplinkPin(pinDir, h)
		old, err := link.LoadPinnedLink(pin, nil)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err == nil {
			// Detached at once, not when the kernel drops the last reference.
			err = old.Detach()
			old.Close()
		}
		if rerr := os.Remove(pin); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			err = errors.Join(err, rerr)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove uplink load balancer %s: %w", h, err))
		}
	}
	return errors.Join(errs...)
}

// clearHooks empties the pinned onc_hooks under pinDir, if it is there.
func clearHooks(pinDir string) error {
	hooks, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, bpf.FastpathMapOncHooks), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("fast path hooks: %w", err)
	}
	defer hooks.Close()
	for _, slot := range []uint32{bpf.HookPodToNoPeer, bpf.HookOverlayToNoPod} {
		if err := hooks.Delete(slot); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("fast path hook %d: %w", slot, err)
		}
	}
	return nil
}

// SetInternal makes the uplink programs drop, as spoofed, packets to a
// service whose source is in one of prefixes: the cluster's pod CIDRs and
// this node's addresses, which nobody outside may speak for. Prefixes of
// either family: each goes into its family's map (onc_lb_internal,
// onc_lb6_internal), and what either map holds beyond them goes.
func (lb *LB) SetInternal(prefixes []netip.Prefix) error {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	want4 := map[internalKey]bool{}
	want6 := map[internal6Key]bool{}
	for _, p := range prefixes {
		if !p.IsValid() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			return fmt.Errorf("internal prefix %s: want an IPv4 or IPv6 prefix", p)
		}
		p = p.Masked()
		if p.Addr().Is4() {
			want4[internalKey{Prefixlen: uint32(p.Bits()), Ip: bpf.NetIPv4(p.Addr())}] = true
		} else {
			want6[internal6Key{Prefixlen: uint32(p.Bits()), Ip: bpf.NetIPv6(p.Addr())}] = true
		}
	}
	if err := setAll(lb.maps.OncLbInternal, want4, internalPrefix); err != nil {
		return err
	}
	return setAll(lb.maps.OncLb6Internal, want6, internal6Prefix)
}

// setAll makes m, an internal prefix map, hold exactly want.
func setAll[K comparable](m *ebpf.Map, want map[K]bool, prefix func(K) netip.Prefix) error {
	for k := range want {
		if err := m.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("internal prefix %s: %w", prefix(k), err)
		}
	}
	_, err := bpf.DeleteIf(m, func(k K, _ uint8) bool { return !want[k] })
	return err
}

func internalPrefix(k internalKey) netip.Prefix {
	return netip.PrefixFrom(bpf.IPv4(k.Ip), int(k.Prefixlen))
}

func internal6Prefix(k internal6Key) netip.Prefix {
	return netip.PrefixFrom(bpf.IPv6(k.Ip), int(k.Prefixlen))
}

// srcRange is a service's source range as the maps hold it: the service's
// id and the prefix, masked.
type srcRange struct {
	id     uint32
	prefix netip.Prefix
}

// mapKey is r as its family's source range map keys it.
func (r srcRange) mapKey() any {
	bits := uint32(r.prefix.Bits())
	if r.prefix.Addr().Is4() {
		return srcKey{Prefixlen: 32 + bits, SvcId: r.id, Ip: bpf.NetIPv4(r.prefix.Addr())}
	}
	return src6Key{Prefixlen: 32 + bits, SvcId: r.id, Ip: bpf.NetIPv6(r.prefix.Addr())}
}

func rangeOf(k srcKey) srcRange {
	return srcRange{k.SvcId, netip.PrefixFrom(bpf.IPv4(k.Ip), int(k.Prefixlen)-32)}
}

func rangeOf6(k src6Key) srcRange {
	return srcRange{k.SvcId, netip.PrefixFrom(bpf.IPv6(k.Ip), int(k.Prefixlen)-32)}
}

// rangeMap is the source range map of a's family.
func (lb *LB) rangeMap(a netip.Addr) *ebpf.Map {
	if a.Is4() {
		return lb.maps.OncLbSourceRanges
	}
	return lb.maps.OncLb6SourceRanges
}

// addRanges writes the source ranges of s that p lacks; before the service
// entry flips, so a client in a new range is never refused. Each range is
// of the frontend's family: the programs look a client up in its own
// family's map.
func (lb *LB) addRanges(p *programmed, s Service) error {
	for _, r := range s.SourceRanges {
		if !r.IsValid() || r.Addr().Is4() != s.VIP.Is4() || r.Addr().Is4In6() || r.Addr().Zone() != "" {
			return fmt.Errorf("source range %s: not of the frontend's family", r)
		}
		r = r.Masked()
		if p.ranges[r] {
			continue
		}
		if err := lb.rangeMap(r.Addr()).Put(srcRange{p.id, r}.mapKey(), uint8(1)); err != nil {
			return fmt.Errorf("source range %s: %w", r, err)
		}
		p.ranges[r] = true
	}
	return nil
}

// pruneRanges deletes the source ranges p has beyond s's; after the flip,
// so a service dropping its ranges never refuses a client meanwhile.
func (lb *LB) pruneRanges(p *programmed, s Service) error {
	keep := map[netip.Prefix]bool{}
	for _, r := range s.SourceRanges {
		keep[r.Masked()] = true
	}
	for r := range p.ranges {
		if keep[r] {
			continue
		}
		if err := lb.rangeMap(r.Addr()).Delete(srcRange{p.id, r}.mapKey()); err != nil && !isNotExist(err) {
			return fmt.Errorf("source range %s: %w", r, err)
		}
		delete(p.ranges, r)
	}
	return nil
}

// adoptRanges gives the services of f adopted from an earlier agent (byID)
// their source ranges, from f's map, and deletes those of services gone.
func (lb *LB) adoptRanges(f family, byID map[uint32]*programmed) error {
	keep := func(r srcRange) bool {
		p := byID[r.id]
		if p != nil {
			p.ranges[r.prefix] = true
		}
		return p != nil
	}
	var err error
	if f.is6 {
		_, err = bpf.DeleteIf(lb.maps.OncLb6SourceRanges, func(k src6Key, _ uint8) bool { return !keep(rangeOf6(k)) })
	} else {
		_, err = bpf.DeleteIf(lb.maps.OncLbSourceRanges, func(k srcKey, _ uint8) bool { return !keep(rangeOf(k)) })
	}
	if err != nil {
		return fmt.Errorf("read source range map: %w", err)
	}
	return nil
}

// readRanges reads both families' source range maps whole (a lookup in a
// trie matches the longest prefix, and would find a service's wider range
// for a narrower one gone).
func (lb *LB) readRanges() (map[srcRange]bool, error) {
	ranges := map[srcRange]bool{}
	err4 := each(lb.maps.OncLbSourceRanges, func(k srcKey, _ uint8) { ranges[rangeOf(k)] = true })
	err6 := each(lb.maps.OncLb6SourceRanges, func(k src6Key, _ uint8) { ranges[rangeOf6(k)] = true })
	return ranges, errors.Join(err4, err6)
}

// forgetUplinkFlows deletes the uplink's UDP flows to backends that left
// their service, both ways and in both families, so that the client's next
// datagram picks a backend still there, as kube-proxy deletes such
// conntrack entries. TCP flows keep their backend, as under kube-proxy: a
// terminating pod may still finish them.
func (lb *LB) forgetUplinkFlows(gone map[departure]bool) error {
	const in = 0 // enum lb_flow_dir: IN names the backend, OUT is keyed by it
	_, err4 := bpf.DeleteIf(lb.maps.OncLbFlows, func(k bpf.ServicesLbFlowKey, v bpf.ServicesLbFlow) bool {
		be := lbAddr{Ip: v.Ip, Port: v.Port}
		if k.Dir != in {
			be = lbAddr{Ip: k.Saddr, Port: k.Sport}
		}
		return k.Proto == uint8(UDP) && gone[departure{v.SvcId, backendAddr(be)}]
	})
	_, err6 := bpf.DeleteIf(lb.maps.OncLb6Flows, func(k bpf.ServicesLb6FlowKey, v bpf.ServicesLb6Flow) bool {
		be := lb6Addr{Ip: v.Ip, Port: v.Port}
		if k.Dir != in {
			be = lb6Addr{Ip: k.Saddr, Port: k.Sport}
		}
		return k.Proto == uint8(UDP) && gone[departure{v.SvcId, backendAddr6(be)}]
	})
	return errors.Join(err4, err6)
}
