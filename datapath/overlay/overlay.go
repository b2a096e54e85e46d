// Package overlay runs the slow path: one kernel VXLAN device and, per
// remote node, Flannel-style static entries — a neighbour (remote gateway →
// remote VTEP MAC), an FDB entry (remote VTEP MAC → remote node IP) and an
// onlink route (remote pod CIDR via remote gateway), the route added last
// and removed first so no packet is routed to an unresolvable next hop.
// A node has a pod CIDR of one family or of both, and the overlay carries
// each family both nodes have over the same FDB entry, in frames between
// tunnel endpoints of the underlay's family: IPv4, or IPv6 (then every
// node's endpoint is IPv6).
package overlay

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/onc-net/onc/datapath/pods"
	"github.com/onc-net/onc/internal/netaddr"
	"github.com/onc-net/onc/internal/sysctl"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
	"k8s.io/utils/ptr"
)

// DeviceName is the VXLAN device ONC owns.
const DeviceName = "onc.vxlan"

// OverheadOf is what VXLAN between tunnel endpoints of local's family adds
// to a frame: outer IPv4 (20 bytes) or IPv6 (40), UDP, VXLAN and the
// inner Ethernet header.
func OverheadOf(local netip.Addr) int {
	if local.Is6() {
		return 70
	}
	return 50
}

// Config of the VXLAN device.
type Config struct {
	VNI     int
	Port    int
	LocalIP netip.Addr // the node IP; outer source, IPv4 or IPv6
	Uplink  int        // ifindex the outer packets leave by
	MAC     net.HardwareAddr
	MTU     int // uplink MTU − OverheadOf(LocalIP)
	// Gateway and Gateway6 are this node's gateways, set on the device as
	// /32 and /128; invalid when the node has no pod CIDR of that family.
	Gateway  netip.Addr
	Gateway6 netip.Addr
	ProcSys  string // where the node's sysctls are, "" = /proc/sys
}

// A peer's host reaches this node's pods over the overlay from its node
// address too (a process bound to it), which the underlay otherwise
// routes: such a connection's packets carry PeerHostMark (netfilter
// marks them, datapath/netfilter), and the rule at PeerHostRulePriority
// looks marked packets up in PeerHostTable, which routes each peer's
// node address via its gateway on the device. So the pod's replies go
// back over the overlay, not by the underlay with the pod's address as
// source, and both nodes' strict reverse-path filters (which use the mark
// on the device: src_valid_mark) find the overlay the way back.
const (
	PeerHostMark         = 0x200000
	PeerHostTable        = 183
	PeerHostRulePriority = 2000
)

// Peer is a remote node as the overlay needs it.
type Peer struct {
	Name     string
	NodeIP   netip.Addr
	VTEPMAC  net.HardwareAddr
	PodCIDR  netip.Prefix // invalid when it has none (an IPv6-only node)
	PodCIDR6 netip.Prefix // invalid when it has none
}

// podCIDRs are the pod CIDRs of p reached over the device: those of a
// family both nodes have pods of (a node without has no address of that
// family on the device).
func (o *Overlay) podCIDRs(p Peer) []netip.Prefix {
	var out []netip.Prefix
	if p.PodCIDR.IsValid() && o.cfg.Gateway.IsValid() {
		out = append(out, p.PodCIDR)
	}
	if p.PodCIDR6.IsValid() && o.cfg.Gateway6.IsValid() {
		out = append(out, p.PodCIDR6)
	}
	return out
}

// Gateway of a pod CIDR: its first usable address; invalid for an
// invalid prefix (a node without a block of that family).
func Gateway(cidr netip.Prefix) netip.Addr { return cidr.Masked().Addr().Next() }

// Overlay owns the device and its peer entries.
type Overlay struct {
	cfg   Config
	link  netlink.Link
	mu    sync.Mutex
	peers map[string]Peer // programmed, by name
	// inSync holds while peers is what the kernel has: false after Ensure
	// and after a failed write, when what the kernel holds is unknown, so
	// the next Sync reads it back; set by a Sync whose writes all succeeded.
	inSync bool
	writes atomic.Uint64 // netlink writes made by Sync
}

// ListensOn says whether the device exists with local as its tunnel
// endpoint: otherwise nothing listens on the VXLAN port at that address
// yet (a fresh node, or one whose underlay address or family changed).
func ListensOn(local netip.Addr) bool {
	l, err := netlink.LinkByName(DeviceName)
	if err != nil {
		return false
	}
	v, ok := l.(*netlink.Vxlan)
	return ok && v.SrcAddr.Equal(local.AsSlice())
}

// Ensure creates the device, or adopts an existing one whose settings
// match (a restarted agent keeps forwarding), or replaces one that does not.
func Ensure(cfg Config) (*Overlay, error) {
	if l, err := netlink.LinkByName(DeviceName); err == nil {
		if matches(l, cfg) {
			slog.Info("adopting existing VXLAN device", "dev", DeviceName)
		} else {
			slog.Info("VXLAN device settings changed; recreating it", "dev", DeviceName)
			if err := netlink.LinkDel(l); err != nil {
				return nil, fmt.Errorf("delete stale %s: %w", DeviceName, err)
			}
		}
	}
	if _, err := netlink.LinkByName(DeviceName); err != nil {
		if err := createVXLAN(cfg); err != nil {
			return nil, err
		}
	}
	l, err := netlink.LinkByName(DeviceName)
	if err != nil {
		return nil, err
	}
	if l.Attrs().MTU != cfg.MTU {
		if err := netlink.LinkSetMTU(l, cfg.MTU); err != nil {
			return nil, fmt.Errorf("%s MTU %d: %w", DeviceName, cfg.MTU, err)
		}
	}
	if cfg.Gateway6.IsValid() {
		// No link-local address (the device would solicit routers and
		// join groups over the overlay), and IPv6 on even where new
		// interfaces start without it.
		if err := sysctl.WriteIPv6Conf(cfg.ProcSys, DeviceName, "addr_gen_mode=1", "disable_ipv6=0"); err != nil {
			return nil, err
		}
	}
	for _, gw := range []netip.Addr{cfg.Gateway, cfg.Gateway6} {
		if !gw.IsValid() {
			continue
		}
		if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: netaddr.HostPrefix(gw), Flags: unix.IFA_F_NODAD}); err != nil {
			return nil, fmt.Errorf("gateway address %s on %s: %w", gw, DeviceName, err)
		}
	}
	if err := removeOtherAddrs(l, cfg.Gateway6.IsValid(), cfg.Gateway, cfg.Gateway6); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("%s up: %w", DeviceName, err)
	}
	if err := ensurePeerHostRule(netaddr.Family(cfg.LocalIP)); err != nil {
		return nil, err
	}
	return &Overlay{cfg: cfg, link: l, peers: map[string]Peer{}}, nil
}

// ensurePeerHostRule adds the rule that routes PeerHostMark'ed packets by
// PeerHostTable, in the family of the node addresses (the underlay's),
// unless it is there.
func ensurePeerHostRule(family int) error {
	want := netlink.NewRule()
	want.Family = family
	want.Priority, want.Table = PeerHostRulePriority, PeerHostTable
	want.Mark, want.Mask = PeerHostMark, ptr.To(uint32(PeerHostMark))
	rules, err := netlink.RuleListFiltered(family, want, netlink.RT_FILTER_PRIORITY)
	if err != nil {
		return fmt.Errorf("list ip rules: %w", err)
	}
	for _, r := range rules {
		if r.Table == want.Table && r.Mark == want.Mark && r.Mask != nil && *r.Mask == *want.Mask {
			return nil
		}
	}
	if err := netlink.RuleAdd(want); err != nil {
		return fmt.Errorf("ip rule fwmark 0x%x lookup %d: %w", PeerHostMark, PeerHostTable, err)
	}
	return nil
}

func matches(l netlink.Link, cfg Config) bool {
	v, ok := l.(*netlink.Vxlan)
	return ok && v.VxlanId == cfg.VNI && v.Port == cfg.Port && v.VtepDevIndex == cfg.Uplink &&
		v.SrcAddr.Equal(cfg.LocalIP.AsSlice()) && !v.Learning && !v.UDPCSum && v.UDP6ZeroCSumRx == cfg.LocalIP.Is6() &&
		v.HardwareAddr.String() == cfg.MAC.String()
}

// removeOtherAddrs drops a gateway left from an earlier pod CIDR, of
// either family, and with linkLocal the device's link-local address (one
// an earlier version's device got before addr_gen_mode said none).
func removeOtherAddrs(l netlink.Link, linkLocal bool, keep ...netip.Addr) error {
	addrs, err := netlink.AddrList(l, unix.AF_UNSPEC)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if ip, _ := netip.AddrFromSlice(a.IP); !slices.Contains(keep, ip.Unmap()) && (linkLocal || !ip.IsLinkLocalUnicast()) {
			if err := netlink.AddrDel(l, &a); err != nil {
				return fmt.Errorf("remove stale address %s from %s: %w", a.IPNet, DeviceName, err)
			}
		}
	}
	return nil
}

// Link is the VXLAN device.
func (o *Overlay) Link() netlink.Link { return o.link }

// Programmed lists the peers whose entries are in place.
func (o *Overlay) Programmed() map[string]Peer {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make(map[string]Peer, len(o.peers))
	for k, v := range o.peers {
		out[k] = v
	}
	return out
}

// Writes counts the netlink writes Sync has made; at steady state it stays put.
func (o *Overlay) Writes() uint64 { return o.writes.Load() }

// Sync makes the device's routes, neighbours and FDB entries exactly those
// of peers, writing only what differs. No two peers may share a pod CIDR,
// gateway or VTEP MAC (datapath.peersOf sees to it): they would overwrite
// each other's entries. Without checkKernel it compares peers
// with what it programmed last, and makes no syscall when nothing changed.
// With checkKernel — and on the first Sync after Ensure or after a failed
// write, whatever the flag — it reads the device's entries back and repairs
// what drifted: missing or wrong entries are rewritten, and anything of no
// current peer (peers that left, also while the agent was down) is removed.
// The kernel check repairs the peer-host rule too. It returns every error
// but carries on with the other peers.
func (o *Overlay) Sync(peers []Peer, checkKernel bool) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	want := o.entriesOf(peers)
	var have entries
	if checkKernel || !o.inSync {
		var err error
		if have, err = o.read(); err != nil {
			return err
		}
		if err := ensurePeerHostRule(netaddr.Family(o.cfg.LocalIP)); err != nil {
			return err
		}
	} else {
		have = o.entriesOf(slices.Collect(maps.Values(o.peers)))
	}
	failed := o.remove(have, want)
	programmed := make(map[string]Peer, len(peers))
	for _, p := range peers {
		if err := o.add(have, p); err != nil {
			failed = append(failed, fmt.Errorf("peer %s: %w", p.Name, err))
			continue
		}
		programmed[p.Name] = p
	}
	o.peers, o.inSync = programmed, len(failed) == 0
	return errors.Join(failed...)
}

// entries are peer entries of the device, each kind keyed as the kernel
// keys it: what Sync programmed, wants, or read back.
type entries struct {
	routes map[routeKey]netlink.Route
	neighs map[netip.Addr]netlink.Neigh // by gateway
	fdb    map[string]netlink.Neigh     // by VTEP MAC
	// strays are FDB entries without a remote, and the further remotes
	// of a MAC (the kernel appends them only to the all-zero and multicast
	// MACs of flood entries, which are no peer's): always removed.
	strays []netlink.Neigh
}

// routeKey is what tells routes apart.
type routeKey struct {
	table    int
	dst      netip.Prefix
	tos      int
	priority int
}

func keyOf(r netlink.Route) routeKey {
	table := r.Table
	if table == 0 {
		table = unix.RT_TABLE_MAIN
	}
	return routeKey{table: table, dst: prefixOf(r.Dst), tos: r.Tos, priority: r.Priority}
}

func prefixOf(n *net.IPNet) netip.Prefix {
	bits, _ := n.Mask.Size()
	return netip.PrefixFrom(addrOf(n.IP), bits)
}

func addrOf(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}

func newEntries() entries {
	return entries{routes: map[routeKey]netlink.Route{}, neighs: map[netip.Addr]netlink.Neigh{}, fdb: map[string]netlink.Neigh{}}
}

// entriesOf returns the entries of peers.
func (o *Overlay) entriesOf(peers []Peer) entries {
	e := newEntries()
	for _, p := range peers {
		for _, r := range o.routes(p) {
			e.routes[keyOf(r)] = r
		}
		for _, n := range o.neighs(p) {
			e.neighs[addrOf(n.IP)] = n
		}
		e.fdb[p.VTEPMAC.String()] = o.fdb(p)
	}
	return e
}

// neighs are the peer's gateways at its VTEP MAC.
func (o *Overlay) neighs(p Peer) []netlink.Neigh {
	var out []netlink.Neigh
	for _, cidr := range o.podCIDRs(p) {
		gw := Gateway(cidr)
		out = append(out, netlink.Neigh{LinkIndex: o.link.Attrs().Index, Family: netaddr.Family(gw), State: netlink.NUD_PERMANENT,
			IP: gw.AsSlice(), HardwareAddr: p.VTEPMAC})
	}
	return out
}

func (o *Overlay) fdb(p Peer) netlink.Neigh {
	return netlink.Neigh{LinkIndex: o.link.Attrs().Index, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: p.NodeIP.AsSlice(), HardwareAddr: p.VTEPMAC}
}

// ip6DefaultMetric is the metric the kernel gives an IPv6 route added
// without one (IP6_RT_PRIO_USER).
const ip6DefaultMetric = 1024

// routes are a peer's routes via its gateways: its pod CIDRs, and in
// PeerHostTable its node address, via its gateway of that family (none
// when the two nodes have no pods of the underlay's family: a host then
// reaches pods from its device's gateway, never its node address).
func (o *Overlay) routes(p Peer) []netlink.Route {
	via := func(dst netip.Prefix, gw netip.Addr, table int) netlink.Route {
		priority := 0
		if gw.Is6() {
			priority = ip6DefaultMetric // as the kernel reads it back
		}
		return netlink.Route{
			Priority:  priority,
			LinkIndex: o.link.Attrs().Index,
			Dst:       &net.IPNet{IP: dst.Addr().AsSlice(), Mask: net.CIDRMask(dst.Bits(), dst.Addr().BitLen())},
			Gw:        gw.AsSlice(),
			Flags:     int(netlink.FLAG_ONLINK),
			Protocol:  pods.RouteProtocol,
			Table:     table,
			Family:    netaddr.Family(gw),
		}
	}
	var routes []netlink.Route
	for _, cidr := range o.podCIDRs(p) {
		gw := Gateway(cidr)
		routes = append(routes, via(cidr, gw, unix.RT_TABLE_MAIN))
		if cidr.Addr().Is4() == p.NodeIP.Is4() {
			routes = append(routes, via(netip.PrefixFrom(p.NodeIP, p.NodeIP.BitLen()), gw, PeerHostTable))
		}
	}
	return routes
}

// read returns ONC's entries on the device as the kernel holds them.
func (o *Overlay) read() (entries, error) {
	idx := o.link.Attrs().Index
	e := newEntries()
	for _, fam := range []int{unix.AF_INET, unix.AF_INET6} {
		for _, table := range []int{unix.RT_TABLE_MAIN, PeerHostTable} {
			routes, err := netlink.RouteListFiltered(fam, &netlink.Route{LinkIndex: idx, Table: table},
				netlink.RT_FILTER_OIF|netlink.RT_FILTER_TABLE)
			if err != nil {
				return e, fmt.Errorf("list routes of %s in table %d: %w", DeviceName, table, err)
			}
			for _, r := range routes {
				if r.Dst != nil && r.Protocol == pods.RouteProtocol { // not the kernel's routes of the device's own address
					e.routes[keyOf(r)] = r
				}
			}
		}
		neighs, err := netlink.NeighList(idx, fam)
		if err != nil {
			return e, fmt.Errorf("list neighbours of %s: %w", DeviceName, err)
		}
		for _, n := range neighs {
			// IPv6's own entries (multicast groups: NOARP) are the
			// kernel's; ONC writes permanent ones.
			if fam == unix.AF_INET || n.State&netlink.NUD_PERMANENT != 0 {
				e.neighs[addrOf(n.IP)] = n
			}
		}
	}
	fdb, err := netlink.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return e, fmt.Errorf("list fdb of %s: %w", DeviceName, err)
	}
	for _, n := range fdb {
		n.Flags |= netlink.NTF_SELF // the VXLAN driver's own table, as written
		if _, dup := e.fdb[n.HardwareAddr.String()]; dup || n.IP == nil {
			e.strays = append(e.strays, n)
			continue
		}
		e.fdb[n.HardwareAddr.String()] = n
	}
	return e, nil
}

// remove deletes what have holds and want does not: routes first, then
// neighbours and FDB entries, so no route is left to a next hop that
// cannot be resolved.
func (o *Overlay) remove(have, want entries) []error {
	var errs []error
	for _, r := range extra(have.routes, want.routes) {
		if err := o.write(netlink.RouteDel(&r)); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r.Dst, err))
		}
	}
	for _, n := range slices.Concat(extra(have.neighs, want.neighs), extra(have.fdb, want.fdb), have.strays) {
		if err := o.write(netlink.NeighDel(&n)); err != nil && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("delete %s: %w", describe(n), err))
		}
	}
	return errs
}

// extra lists the values of have whose keys want lacks.
func extra[K comparable, V any](have, want map[K]V) []V {
	var out []V
	for k, v := range have {
		if _, ok := want[k]; !ok {
			out = append(out, v)
		}
	}
	return out
}

func describe(n netlink.Neigh) string {
	if n.Family == unix.AF_BRIDGE {
		return fmt.Sprintf("fdb %s dst %s", n.HardwareAddr, n.IP)
	}
	return fmt.Sprintf("neighbour %s", n.IP)
}

// add writes those of p's entries that have lacks or holds otherwise: the
// neighbour, the FDB entry, then the routes, so their next hop resolves
// before they exist.
func (o *Overlay) add(have entries, p Peer) error {
	for _, n := range o.neighs(p) {
		if h, ok := have.neighs[addrOf(n.IP)]; !ok || !sameNeigh(h, n) {
			if err := o.write(netlink.NeighSet(&n)); err != nil {
				return fmt.Errorf("neighbour %s: %w", n.IP, err)
			}
		}
	}
	f := o.fdb(p)
	if h, ok := have.fdb[p.VTEPMAC.String()]; !ok || !sameNeigh(h, f) {
		if err := o.write(netlink.NeighSet(&f)); err != nil {
			return fmt.Errorf("fdb %s: %w", p.VTEPMAC, err)
		}
	}
	for _, r := range o.routes(p) {
		if h, ok := have.routes[keyOf(r)]; !ok || !sameRoute(h, r) {
			if err := o.write(netlink.RouteReplace(&r)); err != nil {
				return fmt.Errorf("route %s (table %d): %w", r.Dst, r.Table, err)
			}
		}
	}
	return nil
}

// sameNeigh compares a neighbour or FDB entry with one of the same key.
func sameNeigh(a, b netlink.Neigh) bool {
	return a.IP.Equal(b.IP) && bytes.Equal(a.HardwareAddr, b.HardwareAddr) && a.State == b.State
}

// sameRoute compares a route with one of the same key.
func sameRoute(a, b netlink.Route) bool {
	onlink := int(netlink.FLAG_ONLINK)
	return a.Gw.Equal(b.Gw) && a.Flags&onlink == b.Flags&onlink && a.Protocol == b.Protocol
}

// write counts a netlink write and passes its error on.
func (o *Overlay) write(err error) error {
	o.writes.Add(1)
	return err
}
