// Package underlay keeps the fast path's learned outer headers true to the
// underlay: it watches routes, the uplink and its neighbours, and evicts
// the headers that no longer match.
package underlay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"sync"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/pods"
	"github.com/onc-net/onc/internal/netaddr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A learned outer header freezes the underlay as it was when it was learned:
// the uplink and its MAC, the next hop's MAC, and the peer's VTEP MAC. The
// kernel keeps its own view current (ARP, routes), but fast-path hits never
// consult it, so a header that no longer matches would black-hole its
// flows. The agent watches the underlay (Watch) and evicts exactly the
// headers that no longer match (EvictStaleHeaders); their flows take the
// slow path once and learn the new header from the kernel.

// Node is a node's underlay as the fast path depends on it.
type Node struct {
	uplink   int                       // the uplink's ifindex
	family   int                       // the underlay's address family (the node IP's)
	fastPath func() *fastpath.Datapath // nil when not loaded

	mu    sync.Mutex
	vteps map[netip.Addr]net.HardwareAddr // each peer's VTEP MAC, by node IP, as last set
}

// NewNode is the underlay of the node whose uplink has ifindex uplink and
// whose tunnel endpoint is nodeIP; fastPath returns the flow cache (nil
// when not loaded).
func NewNode(uplink int, nodeIP netip.Addr, fastPath func() *fastpath.Datapath) *Node {
	return &Node{uplink: uplink, family: netaddr.Family(nodeIP), fastPath: fastPath}
}

// SetPeers records each peer's VTEP MAC (by node IP), which a learned
// header must carry, and evicts the headers it made stale: a peer on a
// new machine (same name and IP, new VTEP MAC) needs its header
// relearned, like an underlay change. Unchanged, it does nothing.
func (n *Node) SetPeers(vteps map[netip.Addr]net.HardwareAddr) error {
	n.mu.Lock()
	changed := !maps.EqualFunc(n.vteps, vteps, func(a, b net.HardwareAddr) bool { return bytes.Equal(a, b) })
	n.vteps = vteps
	n.mu.Unlock()
	if !changed {
		return nil
	}
	_, err := n.EvictStaleHeaders()
	return err
}

// Watch calls changed after each change in the node's network
// namespace that can make a learned header stale: a route other than ONC's
// own (pod and overlay routes) changed, the uplink changed, or a neighbour
// on the uplink got another address, failed or went away. It returns when
// ctx ends (nil) or a subscription fails.
func (n *Node) Watch(ctx context.Context, changed func()) error {
	done := make(chan struct{})
	neighs := make(chan netlink.NeighUpdate, 256)
	routes := make(chan netlink.RouteUpdate, 256)
	links := make(chan netlink.LinkUpdate, 16)
	defer func() {
		close(done)
		// The subscriptions' goroutines may be blocked sending: let them
		// finish (they close their channels when they see done).
		go func() {
			for range neighs {
			}
		}()
		go func() {
			for range routes {
			}
		}()
		go func() {
			for range links {
			}
		}()
	}()
	failed := make(chan error, 3)
	onErr := func(err error) {
		select {
		case failed <- err:
		default:
		}
	}
	if err := netlink.NeighSubscribeWithOptions(neighs, done, netlink.NeighSubscribeOptions{ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("watch neighbours: %w", err)
	}
	if err := netlink.RouteSubscribeWithOptions(routes, done, netlink.RouteSubscribeOptions{ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("watch routes: %w", err)
	}
	if err := netlink.LinkSubscribeWithOptions(links, done, netlink.LinkSubscribeOptions{ErrorCallback: onErr}); err != nil {
		return fmt.Errorf("watch links: %w", err)
	}
	// A neighbour's state moves between REACHABLE and STALE all the time;
	// only another address, a failure or a removal matters.
	have, err := netlink.NeighList(n.uplink, n.family)
	if err != nil {
		return fmt.Errorf("list the uplink's neighbours: %w", err)
	}
	seen := map[netip.Addr]string{}
	for _, nb := range have {
		if ip, ok := netip.AddrFromSlice(nb.IP); ok && nb.HardwareAddr != nil {
			seen[ip.Unmap()] = nb.HardwareAddr.String()
		}
	}
	changed() // what happened before the subscriptions
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return fmt.Errorf("underlay watch: %w", err)
		case u, ok := <-neighs:
			if !ok {
				return errors.New("underlay watch: neighbour subscription closed")
			}
			if ip, ok := netip.AddrFromSlice(u.IP); ok && u.LinkIndex == n.uplink && u.Family == n.family &&
				neighbourChanged(seen, ip.Unmap(), u) {
				changed()
			}
		case u, ok := <-routes:
			if !ok {
				return errors.New("underlay watch: route subscription closed")
			}
			if u.Family == n.family && u.Protocol != pods.RouteProtocol {
				changed()
			}
		case u, ok := <-links:
			if !ok {
				return errors.New("underlay watch: link subscription closed")
			}
			if int(u.Index) == n.uplink {
				changed()
			}
		}
	}
}

// neighbourChanged records u in seen (each neighbour's last address) and
// says whether it can make a header stale: another address than seen, a
// failure or a removal. State changes alone (REACHABLE, STALE, a probe
// under way) cannot.
func neighbourChanged(seen map[netip.Addr]string, ip netip.Addr, u netlink.NeighUpdate) bool {
	switch {
	case u.Type == unix.RTM_DELNEIGH || u.State&netlink.NUD_FAILED != 0:
		delete(seen, ip)
		return true
	case u.HardwareAddr == nil: // being resolved: no address yet
		return false
	case seen[ip] == u.HardwareAddr.String():
		return false
	}
	seen[ip] = u.HardwareAddr.String()
	return true
}

// EvictStaleHeaders removes the learned outer headers that no longer match
// the underlay or the peers: the route to the peer's node IP leaves by
// another interface, the uplink's MAC or the next hop's changed, the next
// hop failed to resolve, or the peer's VTEP MAC is not the one its record
// has now. A next hop the kernel holds no entry for (its idle entries are
// garbage-collected) keeps its header: the pass asks the kernel to resolve
// it (NTF_USE), and the answer, if it is another MAC, is a change that
// evicts. It returns how many headers it removed.
func (n *Node) EvictStaleHeaders() (int, error) {
	fp := n.fastPath()
	if fp == nil {
		return 0, nil
	}
	n.mu.Lock()
	vteps := n.vteps
	n.mu.Unlock()
	view := newUnderlayView()
	var reborn []netip.Addr // peers on a new machine: their old neighbour entry is stale too
	evicted, err := fp.EvictEncaps(func(e fastpath.Encap) bool {
		stale, moved := view.headerStale(e, vteps[e.Node])
		if moved {
			reborn = append(reborn, e.Node)
		}
		return stale
	})
	for _, ip := range reborn {
		view.forgetNeighbour(ip)
	}
	return evicted, err
}

// underlayView is the kernel's links and neighbours as one pass reads them:
// each link's neighbour table of a family is dumped once, however many
// headers use it.
type underlayView struct {
	links  map[int]net.HardwareAddr
	neighs map[neighTable]map[netip.Addr]netlink.Neigh
}

// neighTable is one link's neighbours of one family (ARP's or NDP's).
type neighTable struct {
	ifindex, family int
}

func newUnderlayView() *underlayView {
	return &underlayView{links: map[int]net.HardwareAddr{}, neighs: map[neighTable]map[netip.Addr]netlink.Neigh{}}
}

// headerStale says whether a learned header no longer matches how the
// kernel would send to its node now, and whether that is because the peer
// has a new VTEP MAC (vtep; nil if unknown), that is, it is a new machine.
func (v *underlayView) headerStale(e fastpath.Encap, vtep net.HardwareAddr) (stale, moved bool) {
	if vtep != nil && !bytes.Equal(vtep, e.InnerDst) {
		return true, true
	}
	ifindex, next, err := nextHop(e.Node)
	if err != nil {
		slog.Warn("fast path: evicting the header of a node the kernel has no route to", "node", e.Node, "err", err)
		return true, false
	}
	if ifindex != e.Ifindex {
		return true, false
	}
	src, err := v.link(ifindex)
	if err != nil || !bytes.Equal(src, e.OuterSrc) {
		return true, false
	}
	nb, known, err := v.neighbour(ifindex, next)
	switch {
	case err != nil || known && nb.State&netlink.NUD_FAILED != 0:
		return true, false
	case !known || nb.State&usableNeighbour == 0: // collected, or being resolved
		resolve(ifindex, next)
		return false, false
	}
	return !bytes.Equal(nb.HardwareAddr, e.OuterDst), false
}

const usableNeighbour = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE |
	netlink.NUD_PERMANENT | netlink.NUD_NOARP

// nextHop is the interface and next hop (the gateway, or the node itself
// on-link) the kernel routes node by. (The outer source IP is the VXLAN
// device's fixed local address, whatever the route prefers.)
func nextHop(node netip.Addr) (int, netip.Addr, error) {
	routes, err := netlink.RouteGet(node.AsSlice())
	if err != nil {
		return 0, netip.Addr{}, err
	}
	if len(routes) == 0 {
		return 0, netip.Addr{}, errors.New("no route")
	}
	r := routes[0]
	if gw, ok := netip.AddrFromSlice(r.Gw); ok {
		return r.LinkIndex, gw.Unmap(), nil
	}
	if r.Via != nil {
		return 0, netip.Addr{}, fmt.Errorf("next hop %s is of another family than %s: not supported", r.Via, node)
	}
	return r.LinkIndex, node, nil
}

func (v *underlayView) link(ifindex int) (net.HardwareAddr, error) {
	if mac, ok := v.links[ifindex]; ok {
		return mac, nil
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	v.links[ifindex] = l.Attrs().HardwareAddr
	return v.links[ifindex], nil
}

func (v *underlayView) neighbour(ifindex int, ip netip.Addr) (netlink.Neigh, bool, error) {
	key := neighTable{ifindex, netaddr.Family(ip)}
	table, ok := v.neighs[key]
	if !ok {
		list, err := netlink.NeighList(ifindex, key.family)
		if err != nil {
			return netlink.Neigh{}, false, err
		}
		table = make(map[netip.Addr]netlink.Neigh, len(list))
		for _, nb := range list {
			if a, ok := netip.AddrFromSlice(nb.IP); ok {
				table[a.Unmap()] = nb
			}
		}
		v.neighs[key] = table
	}
	nb, known := table[ip]
	return nb, known, nil
}

// resolve asks the kernel to resolve a next hop the fast path sends to
// (NTF_USE), as slow-path traffic to it would: its entry is made or kept
// in use, and its address confirmed.
func resolve(ifindex int, ip netip.Addr) {
	err := netlink.NeighSet(&netlink.Neigh{LinkIndex: ifindex, Family: netaddr.Family(ip), IP: ip.AsSlice(), Flags: netlink.NTF_USE})
	if err != nil {
		slog.Warn("fast path: cannot ask the kernel to resolve a next hop", "ip", ip, "err", err)
	}
}

// forgetNeighbour drops the kernel's learned (not permanent) neighbour entry
// for a node that moved to a new machine, so the slow path resolves the new
// machine's address at once instead of probing the old one for seconds.
func (v *underlayView) forgetNeighbour(node netip.Addr) {
	ifindex, next, err := nextHop(node)
	if err != nil || next != node {
		return // behind a gateway: the gateway's entry is still right
	}
	nb, known, err := v.neighbour(ifindex, node)
	if err != nil || !known || nb.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) != 0 {
		return
	}
	if err := netlink.NeighDel(&nb); err != nil {
		slog.Warn("could not forget a moved node's neighbour entry", "node", node, "err", err)
	}
}
