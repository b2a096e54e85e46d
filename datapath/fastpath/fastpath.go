// Package fastpath loads and drives ONC's eBPF flow cache (datapath/bpf):
// it pins the maps and links under a bpffs directory so forwarding survives
// agent restarts (a restarted agent adopts them), attaches the programs to
// the uplink and to each pod's host veth (tcx, or clsact where the kernel
// has no tcx), and keeps the control-plane maps — local pods, fast-path
// peers, host addresses, configuration — in step with the agent.
package fastpath

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Map value and key types, as the C headers define them.
type (
	FlowKey      = bpf.FastpathFlowKey
	FlowKey6     = bpf.FastpathFlowKey6
	FlowVal      = bpf.FastpathFlowVal
	EgressVal    = bpf.FastpathEgressVal
	EncapVal     = bpf.FastpathEncapVal
	Encap6Val    = bpf.FastpathEncap6Val
	LocalPod     = bpf.FastpathLocalPod
	cidrKey      = bpf.FastpathCidrKey
	cidrVal      = bpf.FastpathCidrVal
	cidr6Key     = bpf.FastpathCidr6Key
	addr6        = bpf.FastpathOncIn6
	senderKey    = bpf.FastpathSenderKey
	sender6Key   = bpf.FastpathSender6Key
	senderU6Key  = bpf.FastpathSenderU6Key
	sender6U6Key = bpf.FastpathSender6U6Key
	senderVal    = bpf.FastpathSenderVal
	config       = bpf.FastpathOncConfig
)

// Options of the datapath. All but PinDir and Mode are constants of the
// programs, fixed when Open loads them.
type Options struct {
	PinDir string // on a bpffs; mounted there if it is not
	VNI    int
	Port   int
	Mark   uint32 // the skb->mark bit the slow path sets on ESTABLISHED pod traffic
	Mode   Mode   // how programs attach; ModeAuto picks tcx when the kernel has it
	// NodeIP is this node's tunnel endpoint, IPv4 or IPv6 (the
	// underlay's family; not IPv4-mapped): the only outer destination the
	// overlay guard lets frames have, and with the pod CIDR of its family
	// the only inner one. On an IPv6 underlay only IPv6 pods' flows take
	// the fast path.
	NodeIP netip.Addr
	// PodCIDR is this node's IPv4 pod CIDR, zero when it has none (an
	// IPv6-only node): the only inner destination, with an IPv4 NodeIP,
	// of the IPv4 frames the guard lets on (none without either).
	PodCIDR netip.Prefix
	// PodCIDRv6 is this node's IPv6 pod CIDR, zero when it has none: the
	// only inner destination, with an IPv6 NodeIP, of the IPv6 frames the
	// guard lets on. A node has a pod CIDR of at least one family.
	PodCIDRv6 netip.Prefix
	// ConnSetup says which TCP connections may open and close on the fast
	// path (setup.go).
	ConnSetup ConnSetup
	// EventsPerSecond is the flow events' budget (include/flows.h): of
	// each class, on each CPU, on average (twice that at once); 0, none.
	// The services object, sharing the flow cache, has the same.
	EventsPerSecond uint32

	decapIPv6 bool // DecapSetsIPv6, probed by Open
}

// Datapath is the loaded flow cache.
type Datapath struct {
	opts       Options
	mode       Mode
	objs       bpf.FastpathObjects
	maps       *bpf.FastpathMaps
	progs      *bpf.FastpathPrograms
	counters   *bpf.Counters // IPv4 packets', and the overlay guard's drops
	counters6  *bpf.Counters // IPv6 packets'
	evCounters *bpf.Counters // what became of the flow events
	mu         sync.Mutex    // serialises configuration writes and evictions
	// peerWrites counts SyncPeers' and SetHosts' map writes.
	peerWrites atomic.Uint64
	peers      mirror[cidrKey, cidrVal]        // onc_peers as SyncPeers last wrote it
	peers6     mirror[cidr6Key, cidrVal]       // onc_peers6 as SyncPeers last wrote it
	peers6U6   mirror[cidr6Key, addr6]         // onc_peers6_u6 as SyncPeers last wrote it
	hosts      mirror[uint32, uint8]           // onc_hosts as SetHosts last wrote it
	senders    mirror[senderKey, senderVal]    // onc_senders as SyncSenders last wrote it
	senders6   mirror[sender6Key, senderVal]   // onc_senders6 as SyncSenders last wrote it
	sendersU6  mirror[senderU6Key, senderVal]  // onc_senders_u6 as SyncSenders last wrote it
	senders6U6 mirror[sender6U6Key, senderVal] // onc_senders6_u6 as SyncSenders last wrote it
	open       mirror[uint32, uint8]           // onc_open as SetOpen or NarrowOpen last wrote it
	open6      mirror[addr6, uint8]            // onc_open6 as SetOpen or NarrowOpen last wrote it
	// onEvict, if set, is told of each flow an eviction takes off the
	// fast path (the flow records, agent/flows); under mu.
	onEvict func(Eviction)
}

// Eviction is a flow an eviction took off the fast path, and why.
type Eviction struct {
	Local, Remote netip.AddrPort
	Proto         uint8
	Why           EvictReason
}

// EvictReason is why a flow left the fast path.
type EvictReason uint8

// The reasons of evictions.
const (
	EvictPolicy   EvictReason = iota // a NetworkPolicy change revoked it (EvictFlows)
	EvictFlush                       // the cache was flushed (Flush)
	EvictUnderlay                    // its node's learned header went: the underlay changed (EvictEncaps)
	EvictPeer                        // its peer node left, or changed (SyncPeers)
	EvictPod                         // its local pod went (DeleteLocalPod)
)

// Open loads the programs, creating or reusing the pinned maps.
func Open(o Options) (*Datapath, error) {
	if err := bpf.EnsurePinDir(o.PinDir); err != nil {
		return nil, err
	}
	if err := o.checkGuard(); err != nil {
		return nil, err
	}
	d := &Datapath{opts: o}
	mode, err := resolveMode(o.Mode)
	if err != nil {
		return nil, err
	}
	d.mode = mode
	spec, err := bpf.LoadFastpath()
	if err != nil {
		return nil, err
	}
	if o.decapIPv6, err = decapProbe(); err != nil {
		return nil, err
	}
	d.opts = o // with the probe's answer, which FlowCache's constants carry
	if err := bpf.SetConstants(spec, o.constants()); err != nil {
		return nil, err
	}
	if err := bpf.SetConstants(spec, o.guardConstants()); err != nil {
		return nil, err
	}
	// An upgrade that changed a map's layout starts the caches afresh:
	// flows re-learn through the slow path. The agent puts the local pods
	// and peers back (AdoptPod, SyncPeers), and attaches the uplink's
	// program, the overlay guard, only once it knows the peers. The old
	// maps are switched off first: a veth the agent cannot adopt keeps the
	// old programs, which must then not serve flows from a cache no
	// eviction reaches any more.
	if err := bpf.LoadPinned("fast path", spec, o.PinDir, &d.objs, nil, func() error { return switchOffPinned(o.PinDir) }); err != nil {
		return nil, err
	}
	d.maps, d.progs = &d.objs.FastpathMaps, &d.objs.FastpathPrograms
	if d.counters, err = bpf.NewCounters(d.maps.OncStats, spec.Maps[bpf.FastpathMapOncStats]); err != nil {
		d.Close()
		return nil, err
	}
	if d.counters6, err = bpf.NewCounters(d.maps.OncStats6, spec.Maps[bpf.FastpathMapOncStats6]); err != nil {
		d.Close()
		return nil, err
	}
	if d.evCounters, err = bpf.NewCounters(d.maps.OncEvStats, spec.Maps[bpf.FastpathMapOncEvStats]); err != nil {
		d.Close()
		return nil, err
	}
	// Connection setup off: what an earlier agent's fast path opened goes
	// to conntrack, as the new programs close no connection on the fast path.
	if o.ConnSetup == SetupOff {
		if err := d.evict(func() error { return d.handOver(everyFlow) }); err != nil {
			d.Close()
			return nil, fmt.Errorf("hand the connections the fast path opened over to conntrack: %w", err)
		}
	}
	return d, nil
}

// checkGuard refuses the settings the overlay guard cannot hold: the
// programs read an all-zero endpoint or mask as none, so an unspecified
// endpoint and a /0 pod CIDR would look like none, and an IPv4-mapped
// endpoint or CIDR would never match a frame. An IPv6 link-local
// endpoint has no meaning off its link's zone, which the programs do not
// see (the agent refuses one at start too).
func (o Options) checkGuard() error {
	switch ip := o.NodeIP; {
	case !ip.IsValid() || ip.IsUnspecified():
		return fmt.Errorf("node IP %v: the overlay guard needs this node's tunnel endpoint", ip)
	case ip.Is4In6():
		return fmt.Errorf("node IP %v: an IPv4-mapped tunnel endpoint; give it as IPv4", ip)
	case ip.Is6() && (ip.IsLinkLocalUnicast() || ip.Zone() != ""):
		return fmt.Errorf("node IP %v: an IPv6 link-local or zoned tunnel endpoint; give a global one", ip)
	}
	if v4 := o.PodCIDR; v4.IsValid() && (!v4.Addr().Is4() || v4.Bits() == 0) {
		return fmt.Errorf("pod CIDR %v: not an IPv4 prefix of at least one bit", v4)
	}
	if v6 := o.PodCIDRv6; v6.IsValid() && (!v6.Addr().Is6() || v6.Addr().Is4In6() || v6.Bits() == 0) {
		return fmt.Errorf("IPv6 pod CIDR %v: not an IPv6 prefix of at least one bit", v6)
	}
	if !o.PodCIDR.IsValid() && !o.PodCIDRv6.IsValid() {
		return errors.New("no pod CIDR: the overlay guard needs this node's pod CIDR of at least one family")
	}
	return nil
}

// switchOffPinned turns the pinned config's enabled and learning switches
// off, leaving the rest of it (an earlier version kept its settings
// there, its overlay guard's among them) as it is. Both switches sit at
// the same offsets in every version: after the 4-byte epoch.
func switchOffPinned(pinDir string) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, bpf.FastpathMapOncCfg), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("pinned fast-path config: %w", err)
	}
	defer m.Close()
	v := make([]byte, m.ValueSize())
	if err := m.Lookup(uint32(0), &v); err != nil {
		return fmt.Errorf("pinned fast-path config: %w", err)
	}
	if len(v) < 6 {
		return fmt.Errorf("pinned fast-path config: %d bytes, too short to switch off", len(v))
	}
	v[4], v[5] = 0, 0 // enabled, learning
	if err := m.Put(uint32(0), v); err != nil {
		return fmt.Errorf("switch the pinned fast path off: %w", err)
	}
	return nil
}

// constants are this node's settings as the programs' constants
// (include/fastpath.h), which every object sharing the flow cache gets.
// onc_node_ip is the IPv4 tunnel endpoint, zero on an IPv6 underlay.
func (o Options) constants() map[string]any {
	podNet, podMask := o.podNet()
	pod6Net, pod6Mask := o.podNet6()
	var nodeIP uint32
	if o.NodeIP.Is4() {
		nodeIP = bpf.NetIPv4(o.NodeIP)
	}
	c := map[string]any{
		"onc_vni":        uint32(o.VNI),
		"onc_vxlan_port": bpf.NetPort(uint16(o.Port)),
		"onc_mark":       o.Mark,
		"onc_node_ip":    nodeIP,
		"onc_pod_net":    podNet,
		"onc_pod_mask":   podMask,
		"onc_pod6_net":   pod6Net,
		"onc_pod6_mask":  pod6Mask,
		"onc_conn_setup": uint8(o.ConnSetup),
		"onc_decap_ipv6": b2u(o.decapIPv6),
	}
	maps.Copy(c, bpf.EventConstants(o.EventsPerSecond))
	return c
}

// guardConstants are the overlay guard's own constants
// (include/overlay.h), which the fast path's object has and the services
// one (FlowCache), but not every object that shares the flow cache: the
// IPv6 tunnel endpoint, all zeros on an IPv4 underlay.
func (o Options) guardConstants() map[string]any {
	var nodeIP6 [16]byte
	if o.NodeIP.Is6() {
		nodeIP6 = o.NodeIP.As16()
	}
	return map[string]any{"onc_node_ip6": nodeIP6}
}

// podNet is the pod CIDR's address and mask, in network order; zeros
// without one.
func (o Options) podNet() (addr, mask uint32) {
	if !o.PodCIDR.IsValid() {
		return 0, 0
	}
	return bpf.NetIPv4(o.PodCIDR.Masked().Addr()), bpf.NetIPv4(netip.AddrFrom4([4]byte(net.CIDRMask(o.PodCIDR.Bits(), 32))))
}

// podNet6 is the IPv6 pod CIDR's address and mask, in network order; all
// zeros without one.
func (o Options) podNet6() (addr, mask [16]byte) {
	if !o.PodCIDRv6.IsValid() {
		return addr, mask
	}
	return o.PodCIDRv6.Masked().Addr().As16(), [16]byte(net.CIDRMask(o.PodCIDRv6.Bits(), 128))
}

// FlowCache is the flow cache as the uplink load balancer's programs share
// it (bpf.FlowCache), with the guard's constants too: IPv6's direct server
// return sends from, and takes frames to, the IPv6 tunnel endpoint. On an
// IPv6 underlay its onc_node_ip is zero: the uplink's IPv4 path (fast
// path, DSR) does not run there.
func (d *Datapath) FlowCache() *bpf.FlowCache {
	c := d.opts.constants()
	maps.Copy(c, d.opts.guardConstants())
	return bpf.NewFlowCache(d.maps, c)
}

// Events is the ring of flow events (include/flows.h), the fast path's
// and the services object's.
func (d *Datapath) Events() *ebpf.Map { return d.maps.OncEvents }

// EventStats are what became of the flow events: emitted, suppressed (by
// the budget), deduped (a drop of a flow and reason within the second),
// lost (the ring was full).
func (d *Datapath) EventStats() ([]Stat, error) { return d.evCounters.Read() }

// Mode reports how programs are attached.
func (d *Datapath) Mode() Mode { return d.mode }

// ConnSetup reports which connections may open on the fast path.
func (d *Datapath) ConnSetup() ConnSetup { return d.opts.ConnSetup }

// Close releases this process's handles; the pinned maps and links stay,
// so forwarding continues until their pins are removed.
func (d *Datapath) Close() error {
	return d.objs.Close()
}

// Configure writes the switches; learning resumes, the epoch is kept.
// Switched off, the fast path first hands the connections it opened over
// to conntrack, which carries them on.
func (d *Datapath) Configure(enabled bool) error {
	if !enabled {
		// Off before learning resumes: no SYN may open a connection
		// between the hand-over and the switch.
		err := d.evict(func() error {
			if err := d.handOver(everyFlow); err != nil {
				return err
			}
			c, err := d.config()
			if err != nil {
				return err
			}
			c.Enabled = 0
			return d.maps.OncCfg.Put(uint32(0), c)
		})
		if err != nil {
			return err
		}
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	c, err := d.config()
	if err != nil {
		return err
	}
	c.Enabled, c.Learning = b2u(enabled), 1
	return d.maps.OncCfg.Put(uint32(0), c)
}

func everyFlow(flowEnds, FlowVal) bool { return true }

// Switch turns the fast path on or off. Turning it on flushes first:
// verdicts learned while it was off may be stale.
func (d *Datapath) Switch(enabled bool) error {
	if enabled && !d.Enabled() {
		if err := d.Flush(); err != nil {
			return fmt.Errorf("flush: %w", err)
		}
	}
	return d.Configure(enabled)
}

func b2u(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

func (d *Datapath) config() (config, error) {
	var c config
	return c, d.maps.OncCfg.Lookup(uint32(0), &c)
}

// Enabled reports the fast-path switch.
func (d *Datapath) Enabled() bool {
	c, err := d.config()
	return err == nil && c.Enabled == 1
}

// SetLocalPod records a pod's address (of either family) on this node
// for the fast path.
func (d *Datapath) SetLocalPod(ip netip.Addr, ifindex int, podMAC, hostMAC net.HardwareAddr) error {
	v := LocalPod{Ifindex: uint32(ifindex)}
	copy(v.PodMac[:], podMAC)
	copy(v.HostMac[:], hostMAC)
	if ip.Is6() {
		return d.maps.OncLocal6.Put(addr6{Addr: ip.As16()}, v)
	}
	return d.maps.OncLocal.Put(bpf.NetIPv4(ip), v)
}

// DeleteLocalPod forgets a pod's address (of either family): it is no
// longer open, and every flow it had goes, with learning paused so no
// packet in flight can re-insert one.
func (d *Datapath) DeleteLocalPod(ip netip.Addr) error {
	mine := func(e flowEnds, _ FlowVal) bool { return e.local.Addr() == ip }
	if ip.Is6() {
		a := addr6{Addr: ip.As16()}
		if err := d.open6.delete(d.maps.OncOpen6, a); err != nil {
			return err
		}
		return d.evict(func() error {
			if err := d.maps.OncLocal6.Delete(a); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return err
			}
			return forgetFlows[FlowKey6](d.maps.OncFilter6, d.maps.OncFin6, d.telling(EvictPod, mine))
		})
	}
	if err := d.open.delete(d.maps.OncOpen, bpf.NetIPv4(ip)); err != nil {
		return err
	}
	return d.evict(func() error {
		if err := d.maps.OncLocal.Delete(bpf.NetIPv4(ip)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
		return forgetFlows[FlowKey](d.maps.OncFilter, d.maps.OncFin, d.telling(EvictPod, mine))
	})
}

// EvictFlows forgets the learned verdicts of the local pods ips (of
// either family) that the slow path may no longer allow. With learning
// paused it first runs decide with the connections of those pods the fast
// path opened (which conntrack may know only as the slow path picked them
// up mid-way, with the wrong end as client). decide ends connections in
// conntrack and returns the verdict on each of those pods' flows, given
// who opened it. Then EvictFlows hands over the ones to hand over (see
// handOver) and deletes the ones to evict. A packet of a connection
// decide ended cannot be learned again in between, since the slow path
// only learns what conntrack sees ESTABLISHED.
func (d *Datapath) EvictFlows(ips map[netip.Addr]bool, decide func(opened []Conn) (judge func(local, remote netip.AddrPort, proto uint8, opener Opener) Verdict, err error)) error {
	return d.evict(func() error {
		theirs := func(e flowEnds, v FlowVal) bool {
			return Opener(v.Opener) != OpenedBySlowPath && ips[e.local.Addr()]
		}
		opened4, err := openedConns[FlowKey](d.maps.OncFilter, theirs)
		if err != nil {
			return err
		}
		opened6, err := openedConns[FlowKey6](d.maps.OncFilter6, theirs)
		if err != nil {
			return err
		}
		judge, err := decide(slices.Concat(opened4, opened6))
		if err != nil {
			return err
		}
		// Judged once each: judge may count what it ends.
		verdicts := map[flowEnds]Verdict{}
		verdict := func(e flowEnds, v FlowVal) Verdict {
			if !ips[e.local.Addr()] {
				return Keep
			}
			if _, ok := verdicts[e]; !ok {
				verdicts[e] = judge(e.local, e.remote, e.proto, Opener(v.Opener))
			}
			return verdicts[e]
		}
		evicted := d.telling(EvictPolicy, func(e flowEnds, v FlowVal) bool { return verdict(e, v) == Evict })
		return errors.Join(
			d.handOver(func(e flowEnds, v FlowVal) bool { return verdict(e, v) == HandOver }),
			forgetFlows[FlowKey](d.maps.OncFilter, d.maps.OncFin, evicted),
			forgetFlows[FlowKey6](d.maps.OncFilter6, d.maps.OncFin6, evicted))
	})
}

// OnEvict has fn told of each flow an eviction takes off the fast path,
// from the next eviction on: a policy's (EvictFlows), a flush, a changed
// underlay's (EvictEncaps), a peer's (SyncPeers), a pod's
// (DeleteLocalPod). fn runs under the lock that serialises evictions,
// with learning paused: it must only queue or count.
func (d *Datapath) OnEvict(fn func(Eviction)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.onEvict = fn
}

// telling is match that tells onEvict of each flow it matches, for why
// (d.mu held).
func (d *Datapath) telling(why EvictReason, match func(flowEnds, FlowVal) bool) func(flowEnds, FlowVal) bool {
	if d.onEvict == nil {
		return match
	}
	return func(e flowEnds, v FlowVal) bool {
		if !match(e, v) {
			return false
		}
		d.onEvict(Eviction{Local: e.local, Remote: e.remote, Proto: e.proto, Why: why})
		return true
	}
}

// tellFlows tells onEvict of the flows of either family that match, for
// why, leaving them in place (d.mu held).
func (d *Datapath) tellFlows(why EvictReason, match func(flowEnds, FlowVal) bool) error {
	if d.onEvict == nil {
		return nil
	}
	tell := d.telling(why, match)
	return errors.Join(eachFlow[FlowKey](d.maps.OncFilter, tell), eachFlow[FlowKey6](d.maps.OncFilter6, tell))
}

// eachFlow runs fn on each flow of filter.
func eachFlow[K flowKey](filter *ebpf.Map, fn func(flowEnds, FlowVal) bool) error {
	var k K
	var v FlowVal
	it := filter.Iterate()
	for it.Next(&k, &v) {
		fn(endsOf(k), v)
	}
	return it.Err()
}

// openedConns are the connections of the flows of filter that match,
// whatever their state (see openedFlows for those still to hand over).
func openedConns[K flowKey](filter *ebpf.Map, match func(flowEnds, FlowVal) bool) ([]Conn, error) {
	var conns []Conn
	var k K
	var v FlowVal
	it := filter.Iterate()
	for it.Next(&k, &v) {
		if e := endsOf(k); match(e, v) {
			conns = append(conns, connOf(e, v))
		}
	}
	return conns, it.Err()
}

// Peer is a node running the fast path: one of its pod CIDRs, IPv4 or
// IPv6, and its tunnel endpoint, of the underlay's family (this node's
// NodeIP's). Over an IPv6 underlay only IPv6 pods' flows take the fast
// path: a peer's IPv4 CIDR is left out there.
type Peer struct {
	PodCIDR netip.Prefix
	NodeIP  netip.Addr
}

// SyncPeers makes the fast-path peer set exactly peers, writing only what
// differs (see mirror for what it diffs against, and when it reads the map
// back). A peer CIDR that left or changed loses its node's learned
// headers and its destinations and flows (learning paused meanwhile); it
// leaves the LPM map first, so from that moment no packet takes the fast
// path towards it. A peer whose endpoint is not of the underlay's family
// is refused before anything is written.
func (d *Datapath) SyncPeers(peers []Peer, checkKernel bool) error {
	want, want6, want6U6 := map[cidrKey]cidrVal{}, map[cidr6Key]cidrVal{}, map[cidr6Key]addr6{}
	staying := map[netip.Addr]bool{}
	underlay6 := d.opts.NodeIP.Is6()
	for _, p := range peers {
		node, a := p.NodeIP.Unmap(), p.PodCIDR.Masked().Addr()
		if node.Is6() != underlay6 {
			return fmt.Errorf("fast-path peer %s (%s): not of the underlay's family (this node's tunnel endpoint is %s)", p.NodeIP, p.PodCIDR, d.opts.NodeIP)
		}
		staying[node] = true
		k6 := cidr6Key{Prefixlen: uint32(p.PodCIDR.Bits()), Addr: a.As16()}
		switch {
		case underlay6 && a.Is6():
			want6U6[k6] = addr6{Addr: node.As16()}
		case underlay6: // IPv4 pods over IPv6 tunnels: the slow path
		case a.Is6():
			want6[k6] = cidrVal{NodeIp: bpf.NetIPv4(node)}
		default:
			want[cidrKey{Prefixlen: uint32(p.PodCIDR.Bits()), Addr: bpf.NetIPv4(a)}] = cidrVal{NodeIp: bpf.NetIPv4(node)}
		}
	}
	cidrOf6 := func(k cidr6Key) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom16(k.Addr), int(k.Prefixlen)) }
	nodeOf := func(v cidrVal) netip.Addr { return bpf.IPv4(v.NodeIp) }
	return errors.Join(
		syncPeerMap(d, &d.peers, d.maps.OncPeers, want, staying, checkKernel, func(k cidrKey) netip.Prefix {
			return netip.PrefixFrom(bpf.IPv4(k.Addr), int(k.Prefixlen))
		}, nodeOf),
		syncPeerMap(d, &d.peers6, d.maps.OncPeers6, want6, staying, checkKernel, cidrOf6, nodeOf),
		syncPeerMap(d, &d.peers6U6, d.maps.OncPeers6U6, want6U6, staying, checkKernel, cidrOf6, func(v addr6) netip.Addr {
			return netip.AddrFrom16(v.Addr)
		}))
}

// syncPeerMap is SyncPeers for one of the LPM maps of peer CIDRs (their
// keys K, each the CIDR cidrOf says; their values V, each the tunnel
// endpoint nodeOf says); staying are the nodes that remain peers in any.
func syncPeerMap[K, V comparable](d *Datapath, m *mirror[K, V], lpm *ebpf.Map, want map[K]V, staying map[netip.Addr]bool, checkKernel bool, cidrOf func(K) netip.Prefix, nodeOf func(V) netip.Addr) error {
	return m.sync(lpm, want, checkKernel, func(have map[K]V) error {
		added, changed, gone := diff(have, want)
		// A changed peer is evicted like one that left, then re-added.
		if stale := slices.Concat(changed, gone); len(stale) > 0 {
			err := d.evict(func() error {
				var evicted []Peer
				for _, k := range stale {
					evicted = append(evicted, Peer{PodCIDR: cidrOf(k), NodeIP: nodeOf(have[k])})
				}
				// While the fast path still carries them.
				if err := d.handOver(toAny(evicted)); err != nil {
					return err
				}
				for _, k := range stale {
					if err := d.peerWrite(lpm.Delete(k)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
						return err
					}
				}
				return d.forgetPeers(evicted, staying)
			})
			if err != nil {
				return err
			}
		}
		for _, k := range slices.Concat(added, changed) {
			if err := d.peerWrite(lpm.Put(k, want[k])); err != nil {
				return err
			}
		}
		return nil
	})
}

// forgetPeers drops what was learned about the peers' CIDRs, and about
// their nodes unless staying says a node is still a peer (by its other
// family's CIDR): connections the fast path opened to it in that family
// need its header (one per node).
func (d *Datapath) forgetPeers(peers []Peer, staying map[netip.Addr]bool) error {
	nodes := map[netip.Addr]bool{}
	for _, p := range peers {
		node := p.NodeIP.Unmap()
		if staying[node] {
			continue
		}
		nodes[node] = true
		var err error
		if node.Is4() {
			err = d.maps.OncEncap.Delete(bpf.NetIPv4(node))
		} else {
			err = d.maps.OncEncapU6.Delete(addr6{Addr: node.As16()})
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return errors.Join(
		deleteWhere(d.maps.OncEgress, func(ip uint32, v EgressVal) bool {
			return nodes[bpf.IPv4(v.NodeIp)] || inAny(peers, bpf.IPv4(ip))
		}),
		deleteWhere(d.maps.OncEgress6, func(ip addr6, v EgressVal) bool {
			return nodes[bpf.IPv4(v.NodeIp)] || inAny(peers, netip.AddrFrom16(ip.Addr))
		}),
		deleteWhere(d.maps.OncEgress6U6, func(ip addr6, v addr6) bool {
			return nodes[netip.AddrFrom16(v.Addr)] || inAny(peers, netip.AddrFrom16(ip.Addr))
		}),
		forgetFlows[FlowKey](d.maps.OncFilter, d.maps.OncFin, d.telling(EvictPeer, toAny(peers))),
		forgetFlows[FlowKey6](d.maps.OncFilter6, d.maps.OncFin6, d.telling(EvictPeer, toAny(peers))))
}

// inAny reports whether a is in one of the peers' pod CIDRs.
func inAny(peers []Peer, a netip.Addr) bool {
	for _, p := range peers {
		if p.PodCIDR.Contains(a) {
			return true
		}
	}
	return false
}

// toAny matches the flows (of either family) with a pod of one of the
// peers.
func toAny(peers []Peer) func(flowEnds, FlowVal) bool {
	return func(e flowEnds, _ FlowVal) bool { return inAny(peers, e.remote.Addr()) }
}

// SetHosts makes the host-address set (node IPs) exactly addrs' IPv4
// ones, writing only what differs (see mirror). Additions go first, so a
// failure part-way leaves an address too many on the slow path, never one
// too few. IPv6 addresses (an IPv6 underlay's) are left out: only IPv4
// packets are looked up there.
func (d *Datapath) SetHosts(addrs []netip.Addr, checkKernel bool) error {
	want := map[uint32]uint8{}
	for _, a := range addrs {
		if a.Unmap().Is4() {
			want[bpf.NetIPv4(a)] = 1
		}
	}
	return d.hosts.sync(d.maps.OncHosts, want, checkKernel, func(have map[uint32]uint8) error {
		return putThenDelete(d.maps.OncHosts, have, want, d.peerWrite)
	})
}

// putThenDelete writes to m what want adds or changes against have, then
// deletes what want no longer holds, passing each write's error through
// note (peerWrite counts them).
func putThenDelete[K, V comparable](m *ebpf.Map, have, want map[K]V, note func(error) error) error {
	added, changed, gone := diff(have, want)
	for _, k := range slices.Concat(added, changed) {
		if err := note(m.Put(k, want[k])); err != nil {
			return err
		}
	}
	for _, k := range gone {
		if err := note(m.Delete(k)); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}

// mirror is what SyncPeers, SetHosts, SyncSenders or SetOpen last wrote to
// its map, so that a change signal costs O(changes) syscalls and none when
// nothing changed.
type mirror[K, V comparable] struct {
	// mu serialises syncs of the map. It is taken before Datapath.mu
	// (SyncPeers evicts while holding it), never after.
	mu sync.Mutex
	// have is what the map holds; nil when that is unknown — before the
	// first sync (pinned maps may hold a previous agent's entries) and
	// after a failed write — so the next sync reads the map back.
	have  map[K]V
	reads int // read-backs, for tests
}

// sync runs apply, which writes to m what differs between have and want,
// where have is the map's contents read back (with checkKernel, or while
// they are unknown) or else what the last sync wrote. want must not change
// afterwards: it becomes what the map holds.
func (s *mirror[K, V]) sync(m *ebpf.Map, want map[K]V, checkKernel bool, apply func(have map[K]V) error) error {
	return s.syncTo(m, checkKernel, func(map[K]V) map[K]V { return want }, func(have, _ map[K]V) error { return apply(have) })
}

// syncTo is sync towards what target makes of the map's contents.
func (s *mirror[K, V]) syncTo(m *ebpf.Map, checkKernel bool, target func(have map[K]V) map[K]V, apply func(have, want map[K]V) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if checkKernel || s.have == nil {
		s.reads++
		have, err := contents[K, V](m)
		if err != nil {
			s.have = nil
			return err
		}
		s.have = have
	}
	want := target(s.have)
	if err := apply(s.have, want); err != nil {
		s.have = nil // some writes may have landed: unknown until read back
		return err
	}
	s.have = want
	return nil
}

// delete removes k from m and from what the mirror holds.
func (s *mirror[K, V]) delete(m *ebpf.Map, k K) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		s.have = nil
		return err
	}
	delete(s.have, k)
	return nil
}

// diff sorts the keys of have and want: added are only in want, changed in
// both with different values, gone only in have.
func diff[K, V comparable](have, want map[K]V) (added, changed, gone []K) {
	for k, w := range want {
		if h, ok := have[k]; !ok {
			added = append(added, k)
		} else if h != w {
			changed = append(changed, k)
		}
	}
	for k := range have {
		if _, ok := want[k]; !ok {
			gone = append(gone, k)
		}
	}
	return added, changed, gone
}

// PeerWrites counts the updates and deletes SyncPeers, SetHosts and
// SyncSenders have made to the peer, host and sender maps; at steady state it stays put.
func (d *Datapath) PeerWrites() uint64 { return d.peerWrites.Load() }

// peerWrite counts a write to the peer or host map and passes its error on.
func (d *Datapath) peerWrite(err error) error {
	d.peerWrites.Add(1)
	return err
}

// contents reads all of m.
func contents[K comparable, V any](m *ebpf.Map) (map[K]V, error) {
	out := map[K]V{}
	var k K
	var v V
	it := m.Iterate()
	for it.Next(&k, &v) {
		out[k] = v
	}
	return out, it.Err()
}

// Flush forgets every learned verdict at once (a new epoch), then clears
// the learned maps.
func (d *Datapath) Flush() error {
	return d.evict(func() error {
		c, err := d.config()
		if err != nil {
			return err
		}
		if err := d.handOver(everyFlow); err != nil {
			return err
		}
		c.Epoch++
		if err := d.maps.OncCfg.Put(uint32(0), c); err != nil {
			return err
		}
		if err := d.tellFlows(EvictFlush, everyFlow); err != nil {
			return err
		}
		all := func([]byte, []byte) bool { return true }
		for _, m := range []*ebpf.Map{d.maps.OncEgress, d.maps.OncEgress6, d.maps.OncEgress6U6, d.maps.OncEncap, d.maps.OncEncapU6, d.maps.OncFilter, d.maps.OncFilter6, d.maps.OncFin, d.maps.OncFin6} {
			if err := deleteWhere(m, all); err != nil {
				return err
			}
		}
		return nil
	})
}

// EvictEncaps removes the learned headers stale says no longer hold (the
// underlay under them changed), with learning paused so that a packet
// encapsulated before the change cannot learn the old header back. Their
// flows take the slow path once and learn the current header. stale runs
// once per header; with none stale, learning is not paused.
func (d *Datapath) EvictEncaps(stale func(Encap) bool) (int, error) {
	headers := newHeaderJudge(d.maps.OncEncap, decodeEncap, stale)
	headers6 := newHeaderJudge(d.maps.OncEncapU6, decodeEncap6, stale)
	// A first look, unpaused: nothing stale, nothing to do.
	nodes, err := headers.staleNodes()
	if err != nil {
		return 0, err
	}
	nodes6, err := headers6.staleNodes()
	if err != nil || len(nodes)+len(nodes6) == 0 {
		return 0, err
	}
	// Paused, on the maps as they are then: a header learned since the
	// first look is judged too.
	evicted := 0
	err = d.evict(func() error {
		if nodes, err = headers.staleNodes(); err != nil {
			return err
		}
		if nodes6, err = headers6.staleNodes(); err != nil {
			return err
		}
		// The connections the fast path opened to pods behind those nodes
		// take the slow path until it learns the new headers, as every
		// flow to them does.
		behind := d.behind(nodes, nodes6)
		if err := d.handOver(behind); err != nil {
			return err
		}
		if err := d.tellFlows(EvictUnderlay, behind); err != nil {
			return err
		}
		n, err := deleteKeys(d.maps.OncEncap, nodes)
		evicted += n
		if err != nil {
			return err
		}
		n, err = deleteKeys(d.maps.OncEncapU6, nodes6)
		evicted += n
		return err
	})
	return evicted, err
}

// behind matches the flows to pods whose CIDR belongs to a fast-path peer
// at one of the tunnel endpoints nodes (IPv4 ones, onc_encap's keys) or
// nodes6 (IPv6 ones, onc_encap_u6's): IPv4 pods through onc_peers, IPv6
// pods through onc_peers6 or, on an IPv6 underlay, onc_peers6_u6.
func (d *Datapath) behind(nodes []uint32, nodes6 []addr6) func(flowEnds, FlowVal) bool {
	return func(e flowEnds, _ FlowVal) bool {
		remote := e.remote.Addr()
		var p cidrVal
		if remote.Is4() {
			return d.maps.OncPeers.Lookup(cidrKey{Prefixlen: 32, Addr: bpf.NetIPv4(remote)}, &p) == nil && slices.Contains(nodes, p.NodeIp)
		}
		k := cidr6Key{Prefixlen: 128, Addr: remote.As16()}
		if d.maps.OncPeers6.Lookup(k, &p) == nil && slices.Contains(nodes, p.NodeIp) {
			return true
		}
		var p6 addr6
		return d.maps.OncPeers6U6.Lookup(k, &p6) == nil && slices.Contains(nodes6, p6)
	}
}

// headerJudge judges the learned headers of one map (onc_encap, keyed by
// IPv4 endpoints, or onc_encap_u6), each header once.
type headerJudge[K, V comparable] struct {
	m        *ebpf.Map
	decode   func(K, *V) Encap
	stale    func(Encap) bool
	verdicts map[header[K, V]]bool
}

// header is a learned header as a map holds it: its node and value.
type header[K, V comparable] struct {
	node K
	val  V
}

func newHeaderJudge[K, V comparable](m *ebpf.Map, decode func(K, *V) Encap, stale func(Encap) bool) *headerJudge[K, V] {
	return &headerJudge[K, V]{m: m, decode: decode, stale: stale, verdicts: map[header[K, V]]bool{}}
}

// staleNodes lists the nodes whose header in the map is stale now.
func (j *headerJudge[K, V]) staleNodes() ([]K, error) {
	var out []K
	var k K
	var v V
	it := j.m.Iterate()
	for it.Next(&k, &v) {
		h := header[K, V]{k, v}
		s, ok := j.verdicts[h]
		if !ok {
			s = j.stale(j.decode(k, &v))
			j.verdicts[h] = s
		}
		if s {
			out = append(out, k)
		}
	}
	return out, it.Err()
}

// deleteKeys deletes keys from m: how many were there.
func deleteKeys[K any](m *ebpf.Map, keys []K) (int, error) {
	n := 0
	for _, k := range keys {
		err := m.Delete(k)
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			continue
		}
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// evict runs fn with learning paused: a packet that was being learned when
// fn starts has finished (programs run well under the grace period) before
// fn, and none can re-insert what fn removes.
func (d *Datapath) evict(fn func() error) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	c, err := d.config()
	if err != nil {
		return err
	}
	c.Learning = 0
	if err := d.maps.OncCfg.Put(uint32(0), c); err != nil {
		return err
	}
	time.Sleep(inFlightGrace)
	ferr := fn()
	// Re-read: fn may have changed the config (Flush moves the epoch).
	if c, err = d.config(); err == nil {
		c.Learning = 1
		err = d.maps.OncCfg.Put(uint32(0), c)
	}
	return errors.Join(ferr, err)
}

// inFlightGrace bounds how long one tc program run can take.
const inFlightGrace = 5 * time.Millisecond

// deleteWhere removes the entries of m that match (collected first: a map
// must not change under its iterator).
func deleteWhere[K, V any](m *ebpf.Map, match func(K, V) bool) error {
	var k K
	var v V
	var drop []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if match(k, v) {
			drop = append(drop, k)
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	for _, k := range drop {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return err
		}
	}
	return nil
}
