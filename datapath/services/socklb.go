package services

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Options of the socket load balancer.
type Options struct {
	// PinDir is a directory on a bpffs (the fast path's): maps and links
	// are pinned there, so an agent restart changes nothing for sockets.
	PinDir string
	// Cgroup is the cgroup v2 directory the programs attach to; every
	// socket created in it or below is balanced. See bpf.ResolveCgroup.
	Cgroup string
	// FlowCache is the fast path's: with it, the uplink programs send an
	// established IPv4 flow past the stack, to a backend on this node or
	// over the overlay to another's. Nil: always through the stack (IPv6
	// flows always are).
	FlowCache *bpf.FlowCache
	// IPv6 says the node's cluster has IPv6 pods, so IPv6 Services have
	// endpoints: the IPv6 programs' LRU maps (reverse translation,
	// affinity, the uplink's flows) get their full size. Without it they get a token one,
	// which saves about 64 MB of kernel memory (see lru6Small); a pinned
	// map of the other size is replaced.
	IPv6 bool
}

// LB is the loaded socket load balancer.
type LB struct {
	opts      Options
	objs      bpf.ServicesObjects
	maps      *bpf.ServicesMaps
	progs     []hook
	counters  *bpf.Counters // the IPv4 hooks'
	counters6 *bpf.Counters // the IPv6 hooks'
	uplink    *bpf.Counters // the uplink programs' (IPv4)
	uplink6   *bpf.Counters // their IPv6 functions'
	uplink6f  *bpf.Counters // their IPv6 fast path's
	dsr       *bpf.Counters // their direct server return's
	dsr6      *bpf.Counters // its IPv6 twins

	mu       sync.Mutex // serialises Sync and the netns writes
	services map[Key]*programmed
	ids      idPool
	netns    map[uint64]string                     // owned namespaces: cookie → path, "" for the agent's own
	pods     map[uint64]netip.Addr                 // the pods' of them OwnPod was given: cookie → address
	podNames atomic.Pointer[map[uint64]netip.Addr] // lb.pods as the last change left it (publishPods)
	svcNames atomic.Pointer[map[Key]string]        // the Services' names (publishServices)
	udp      udpEnder
	warned6  bool // of an IPv6 Service on a node without IPv6 (warnSmall6)
	// nodePort6 is what onc_lb6_dsr_nodeport holds as Sync last wrote
	// it; nodePort6Set is false until then (a pin may hold anything).
	nodePort6    netip.Addr
	nodePort6Set bool
}

// hook is one program and the cgroup attach point it serves.
type hook struct {
	name   string
	attach ebpf.AttachType
	prog   *ebpf.Program
}

// Open loads the programs, creating or adopting the pinned maps; Attach
// puts them on the cgroup.
func Open(o Options) (*LB, error) {
	if err := bpf.EnsurePinDir(o.PinDir); err != nil {
		return nil, err
	}
	lb := &LB{opts: o, services: map[Key]*programmed{}, netns: map[uint64]string{}, pods: map[uint64]netip.Addr{}}
	spec, shared, err := loadSpec(o.FlowCache)
	if err != nil {
		return nil, err
	}
	if err := sizeLRU6(spec, o.PinDir, o.IPv6); err != nil {
		return nil, err
	}
	// An upgrade that changed a map's layout starts afresh: sockets already
	// connected keep their backends; getpeername on them and UDP replies
	// to them show backend addresses until they close.
	if err := bpf.LoadPinned("socket LB", spec, o.PinDir, &lb.objs, shared, nil); err != nil {
		return nil, err
	}
	lb.maps = &lb.objs.ServicesMaps
	p := &lb.objs.ServicesPrograms
	lb.progs = []hook{
		{hookNames[0], ebpf.AttachCGroupInet4Connect, p.OncSockConnect4},
		{hookNames[1], ebpf.AttachCGroupUDP4Sendmsg, p.OncSockSendmsg4},
		{hookNames[2], ebpf.AttachCGroupUDP4Recvmsg, p.OncSockRecvmsg4},
		{hookNames[3], ebpf.AttachCgroupInet4GetPeername, p.OncSockGetpeername4},
		{hookNames[4], ebpf.AttachCgroupInetSockRelease, p.OncSockRelease},
		{hookNames[5], ebpf.AttachCGroupInet6Connect, p.OncSockConnect6},
		{hookNames[6], ebpf.AttachCGroupUDP6Sendmsg, p.OncSockSendmsg6},
		{hookNames[7], ebpf.AttachCGroupUDP6Recvmsg, p.OncSockRecvmsg6},
		{hookNames[8], ebpf.AttachCgroupInet6GetPeername, p.OncSockGetpeername6},
	}
	if lb.counters, err = bpf.NewCounters(lb.maps.OncLbStats, spec.Maps[bpf.ServicesMapOncLbStats]); err == nil {
		lb.counters6, err = bpf.NewCounters(lb.maps.OncLb6Stats, spec.Maps[bpf.ServicesMapOncLb6Stats])
	}
	if err == nil {
		lb.uplink, err = bpf.NewCounters(lb.maps.OncLbUplinkStats, spec.Maps[bpf.ServicesMapOncLbUplinkStats])
	}
	if err == nil {
		lb.uplink6, err = bpf.NewCounters(lb.maps.OncLb6UplinkStats, spec.Maps[bpf.ServicesMapOncLb6UplinkStats])
	}
	if err == nil {
		lb.uplink6f, err = bpf.NewCounters(lb.maps.OncLb6UplinkFastStats, spec.Maps[bpf.ServicesMapOncLb6UplinkFastStats])
	}
	if err == nil {
		lb.dsr, err = bpf.NewCounters(lb.maps.OncLbDsrStats, spec.Maps[bpf.ServicesMapOncLbDsrStats])
	}
	if err == nil {
		lb.dsr6, err = bpf.NewCounters(lb.maps.OncLb6DsrStats, spec.Maps[bpf.ServicesMapOncLb6DsrStats])
	}
	if err == nil {
		err = lb.adopt()
		lb.publishPods()
		lb.publishServices()
	}
	if err == nil {
		err = lb.openUDPEnder(spec.Maps[bpf.ServicesMapOncLbDestroyStats])
	}

	if err != nil {
		lb.Close()
		return nil, err
	}
	return lb, nil
}

// Cgroup is where the programs attach.
func (lb *LB) Cgroup() string { return lb.opts.Cgroup }

// Attach puts every program on the cgroup, or swaps the new programs into
// the pinned links of an earlier agent. Other agents' programs on the same
// cgroup stay: each acts only on its own node's sockets.
func (lb *LB) Attach() error {
	for _, h := range lb.progs {
		if err := bpf.AttachCgroup(linkPin(lb.opts.PinDir, h.name), lb.opts.Cgroup, h.attach, h.prog); err != nil {
			return fmt.Errorf("%s: %w", h.name, err)
		}
	}
	return nil
}

// Remove takes a node's socket programs off their cgroup (and the uplink
// programs off the uplink) and drops their maps, from the pins alone (nothing is loaded, nothing mounted): for
// --services=off, and for a node whose programs failed to load, so that
// an earlier agent's programs do not go on translating with maps nobody
// updates. Connections go to ClusterIPs as they are, and kube-proxy
// balances them. Idempotent.
func Remove(pinDir string) error {
	var errs []error
	for _, h := range hookNames {
		// Unpinned, and held by no process, a link detaches.
		if err := os.Remove(linkPin(pinDir, h)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(append(errs, RemoveUplink(pinDir))...); err != nil {
		return err
	}
	spec, _, err := loadSpec(nil)
	if err != nil {
		return err
	}
	return bpf.RemoveMapPins(pinDir, spec)
}

// hookNames name the link pins, one per program, in the order of LB.progs
// (the IPv6 hooks last: they came later, and the names of the pins an
// earlier agent made stay).
var hookNames = []string{"connect4", "sendmsg4", "recvmsg4", "getpeername4", "sock_release",
	"connect6", "sendmsg6", "recvmsg6", "getpeername6"}

func linkPin(pinDir, hook string) string { return filepath.Join(pinDir, "link_cgroup_"+hook) }

// Close releases this process's handles; pinned maps and links stay.
func (lb *LB) Close() error {
	if lb.udp.iter != nil {
		lb.udp.iter.Close()
	}
	return lb.objs.Close()
}

// loadSpec is the services object's spec with the fast path's maps
// unpinned (never ours to pin or remove) and its constants set, and the
// replacements that share them (bpf.FlowCache.Share).
func loadSpec(cache *bpf.FlowCache) (*ebpf.CollectionSpec, map[string]*ebpf.Map, error) {
	spec, err := bpf.LoadServices()
	if err != nil {
		return nil, nil, err
	}
	shared := cache.Share(spec)
	if cache != nil {
		if err := cache.SetConstants(spec); err != nil {
			return nil, nil, err
		}
	}
	return spec, shared, nil
}

// fillHooks gives the fast path's programs ours to pass packets on to: a
// pod's reply to a client outside, and a backend's reply over the overlay
// to a flow this node masqueraded.
func (lb *LB) fillHooks(hooks *ebpf.Map) error {
	p := &lb.objs.ServicesPrograms
	for slot, prog := range map[uint32]*ebpf.Program{
		bpf.HookPodToNoPeer:    p.OncUplinkLbReply,
		bpf.HookOverlayToNoPod: p.OncUplinkLbOverlayReply,
	} {
		if err := hooks.Put(slot, prog); err != nil {
			return fmt.Errorf("uplink load balancer: fast path hook %d: %w", slot, err)
		}
	}
	return nil
}
