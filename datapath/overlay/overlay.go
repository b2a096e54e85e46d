// Package overlay runs the slow path: one kernel VXLAN device and, per
// remote node, Flannel-style static entries — a neighbour (remote gateway →
// remote VTEP MAC), an FDB entry (remote VTEP MAC → remote node IP) and an
// onlink route (remote pod CIDR via remote gateway), the route added last
// and removed first so no packet is routed to an unresolvable next hop.
package overlay

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"sync"

	"github.com/onc-net/onc/datapath/podnet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// DeviceName is the VXLAN device ONC owns.
const DeviceName = "onc.vxlan"

// Overhead is what VXLAN over IPv4 adds to a frame.
const Overhead = 50

// Config of the VXLAN device.
type Config struct {
	VNI     int
	Port    int
	LocalIP netip.Addr // the node IP; outer source
	Uplink  int        // ifindex the outer packets leave by
	MAC     net.HardwareAddr
	MTU     int        // uplink MTU − Overhead
	Gateway netip.Addr // this node's gateway, set on the device as /32
}

// Peer is a remote node as the overlay needs it.
type Peer struct {
	Name    string
	NodeIP  netip.Addr
	VTEPMAC net.HardwareAddr
	PodCIDR netip.Prefix
}

// Gateway of a pod CIDR: its first usable address.
func Gateway(cidr netip.Prefix) netip.Addr { return cidr.Masked().Addr().Next() }

// Overlay owns the device and its peer entries.
type Overlay struct {
	cfg   Config
	link  netlink.Link
	mu    sync.Mutex
	peers map[string]Peer // programmed, by name
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
	if err := netlink.AddrReplace(l, &netlink.Addr{IPNet: &net.IPNet{IP: cfg.Gateway.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		return nil, fmt.Errorf("gateway address %s on %s: %w", cfg.Gateway, DeviceName, err)
	}
	if err := removeOtherAddrs(l, cfg.Gateway); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(l); err != nil {
		return nil, fmt.Errorf("%s up: %w", DeviceName, err)
	}
	return &Overlay{cfg: cfg, link: l, peers: map[string]Peer{}}, nil
}

func matches(l netlink.Link, cfg Config) bool {
	v, ok := l.(*netlink.Vxlan)
	return ok && v.VxlanId == cfg.VNI && v.Port == cfg.Port && v.VtepDevIndex == cfg.Uplink &&
		v.SrcAddr.Equal(cfg.LocalIP.AsSlice()) && !v.Learning && !v.UDPCSum && v.HardwareAddr.String() == cfg.MAC.String()
}

// removeOtherAddrs drops a gateway left from an earlier pod CIDR.
func removeOtherAddrs(l netlink.Link, keep netip.Addr) error {
	addrs, err := netlink.AddrList(l, unix.AF_INET)
	if err != nil {
		return err
	}
	for _, a := range addrs {
		if ip, _ := netip.AddrFromSlice(a.IP); ip.Unmap() != keep {
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

// Sync makes the device's routes, neighbours and FDB entries exactly those
// of peers: new peers are added, changed ones replaced, and anything else
// found on the device (peers that left, also while the agent was down) is
// removed. It returns the first error but carries on with the other peers.
func (o *Overlay) Sync(peers []Peer) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	var errs []error
	want := map[string]Peer{}
	for _, p := range peers {
		want[p.Name] = p
	}
	// Remove what the kernel has and we do not want: first routes, then
	// neighbours and FDB entries.
	if err := o.pruneRoutes(want); err != nil {
		errs = append(errs, err)
	}
	for name, have := range o.peers {
		if p, ok := want[name]; !ok || !samePeer(p, have) {
			delete(o.peers, name)
		}
	}
	if err := o.pruneNeighbours(want); err != nil {
		errs = append(errs, err)
	}
	names := make([]string, 0, len(want))
	for n := range want {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		p := want[n]
		if err := o.add(p); err != nil {
			errs = append(errs, fmt.Errorf("peer %s: %w", p.Name, err))
			continue
		}
		o.peers[p.Name] = p
	}
	return errors.Join(errs...)
}

func samePeer(a, b Peer) bool {
	return a.NodeIP == b.NodeIP && a.PodCIDR == b.PodCIDR && a.VTEPMAC.String() == b.VTEPMAC.String()
}

func (o *Overlay) add(p Peer) error {
	idx := o.link.Attrs().Index
	gw := Gateway(p.PodCIDR)
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_INET, State: netlink.NUD_PERMANENT,
		IP: gw.AsSlice(), HardwareAddr: p.VTEPMAC}); err != nil {
		return fmt.Errorf("neighbour %s: %w", gw, err)
	}
	if err := netlink.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
		Flags: netlink.NTF_SELF, IP: p.NodeIP.AsSlice(), HardwareAddr: p.VTEPMAC}); err != nil {
		return fmt.Errorf("fdb %s: %w", p.VTEPMAC, err)
	}
	if err := netlink.RouteReplace(o.route(p)); err != nil {
		return fmt.Errorf("route %s: %w", p.PodCIDR, err)
	}
	return nil
}

func (o *Overlay) route(p Peer) *netlink.Route {
	return &netlink.Route{
		LinkIndex: o.link.Attrs().Index,
		Dst:       &net.IPNet{IP: p.PodCIDR.Addr().AsSlice(), Mask: net.CIDRMask(p.PodCIDR.Bits(), 32)},
		Gw:        Gateway(p.PodCIDR).AsSlice(),
		Flags:     int(netlink.FLAG_ONLINK),
		Protocol:  podnet.RouteProtocol,
	}
}

func (o *Overlay) pruneRoutes(want map[string]Peer) error {
	routes, err := netlink.RouteListFiltered(unix.AF_INET, &netlink.Route{LinkIndex: o.link.Attrs().Index}, netlink.RT_FILTER_OIF)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, p := range want {
		keep[o.route(p).Dst.String()+"|"+Gateway(p.PodCIDR).String()] = true
	}
	var errs []error
	for _, r := range routes {
		if r.Dst == nil || r.Gw == nil || r.Protocol != podnet.RouteProtocol {
			continue // kernel routes of the device's own address
		}
		if keep[r.Dst.String()+"|"+r.Gw.String()] {
			continue
		}
		if err := netlink.RouteDel(&r); err != nil {
			errs = append(errs, fmt.Errorf("delete route %s: %w", r.Dst, err))
		}
	}
	return errors.Join(errs...)
}

func (o *Overlay) pruneNeighbours(want map[string]Peer) error {
	idx := o.link.Attrs().Index
	gws, fdb := map[string]bool{}, map[string]bool{}
	for _, p := range want {
		gws[Gateway(p.PodCIDR).String()+"|"+p.VTEPMAC.String()] = true
		fdb[p.VTEPMAC.String()+"|"+p.NodeIP.String()] = true
	}
	var errs []error
	neighs, err := netlink.NeighList(idx, unix.AF_INET)
	if err != nil {
		return err
	}
	for _, n := range neighs {
		if !gws[n.IP.String()+"|"+n.HardwareAddr.String()] {
			if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete neighbour %s: %w", n.IP, err))
			}
		}
	}
	entries, err := netlink.NeighList(idx, unix.AF_BRIDGE)
	if err != nil {
		return err
	}
	for _, n := range entries {
		if n.IP == nil || !fdb[n.HardwareAddr.String()+"|"+n.IP.String()] {
			n.Flags |= netlink.NTF_SELF
			if err := netlink.NeighDel(&n); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("delete fdb %s: %w", n.HardwareAddr, err))
			}
		}
	}
	return errors.Join(errs...)
}
