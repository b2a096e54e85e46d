package datapath

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A learned outer header freezes the underlay as it was when it was learned:
// the uplink and its MAC, the next hop's MAC, and the peer's VTEP MAC. The
// kernel keeps its own view current (ARP, routes), but fast-path hits never
// consult it, so a header that no longer matches would black-hole its
// flows. The agent watches the underlay (WatchUnderlay) and evicts exactly
// the headers that no longer match (EvictStaleHeaders); their flows take
// the slow path once and learn the new header from the kernel.

// WatchUnderlay calls changed after each change in the node's network
// namespace that can make a learned header stale: a route or the uplink
// changed, or a neighbour on the uplink changed its address, failed or went
// away. It returns when ctx ends (nil) or a subscription fails.
func (n *Node) WatchUnderlay(ctx context.Context, changed func()) error {
	done := make(chan struct{})
	defer close(done)
	neighs := make(chan netlink.NeighUpdate, 256)
	routes := make(chan netlink.RouteUpdate, 256)
	links := make(chan netlink.LinkUpdate, 16)
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
	// only a new address, a failure or a removal matters.
	seen := map[netip.Addr]string{}
	if have, err := netlink.NeighList(n.up.Index, unix.AF_INET); err == nil {
		for _, nb := range have {
			if ip, ok := netip.AddrFromSlice(nb.IP); ok {
				seen[ip.Unmap()] = nb.HardwareAddr.String()
			}
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
			ip, _ := netip.AddrFromSlice(u.IP)
			if u.LinkIndex != n.up.Index || !ip.Is4() && !ip.Is4In6() {
				continue
			}
			ip = ip.Unmap()
			mac, known := seen[ip]
			switch {
			case u.Type == unix.RTM_DELNEIGH:
				delete(seen, ip)
			case u.State&(netlink.NUD_FAILED|netlink.NUD_INCOMPLETE) != 0:
				delete(seen, ip)
			case known && mac == u.HardwareAddr.String():
				continue
			default:
				seen[ip] = u.HardwareAddr.String()
				if !known {
					continue // a neighbour resolved for the first time invalidates no header
				}
			}
			changed()
		case u, ok := <-routes:
			if !ok {
				return errors.New("underlay watch: route subscription closed")
			}
			// Pod and overlay routes (veths, onc.vxlan) do not carry headers.
			if u.LinkIndex == n.up.Index || u.LinkIndex == 0 {
				changed()
			}
		case u, ok := <-links:
			if !ok {
				return errors.New("underlay watch: link subscription closed")
			}
			if int(u.Index) == n.up.Index {
				changed()
			}
		}
	}
}

// EvictStaleHeaders removes the learned outer headers that no longer match
// the underlay or the peers: the route to the peer's node IP leaves by
// another interface, the uplink's MAC or the next hop's changed (or the next hop is unresolved), or the peer's VTEP MAC is
// not the one its record has now. It returns how many it removed.
func (n *Node) EvictStaleHeaders() (int, error) {
	fp := n.fastPath()
	if fp == nil {
		return 0, nil
	}
	n.mu.Lock()
	vteps := n.vteps
	n.mu.Unlock()
	var reborn []netip.Addr // peers on a new machine: their old neighbour entry is stale too
	evicted, err := fp.EvictEncaps(func(e fastpath.Encap) bool {
		stale, moved := headerStale(e, vteps[e.Node])
		if moved {
			reborn = append(reborn, e.Node)
		}
		return stale
	})
	for _, ip := range reborn {
		forgetNeighbour(ip)
	}
	return evicted, err
}

// headerStale says whether a learned header no longer matches how the
// kernel would send to its node now, and whether that is because the peer
// has a new VTEP MAC (vtep; nil if unknown), that is, it is a new machine.
func headerStale(e fastpath.Encap, vtep net.HardwareAddr) (stale, moved bool) {
	if vtep != nil && !bytes.Equal(vtep, e.InnerDst) {
		return true, true
	}
	want, err := underlayTo(e.Node)
	if err != nil {
		slog.Warn("fast path: evicting the header of a node the kernel has no usable next hop for", "node", e.Node, "err", err)
		return true, false
	}
	return want.ifindex != e.Ifindex || !bytes.Equal(want.src, e.OuterSrc) || !bytes.Equal(want.dst, e.OuterDst), false
}

// hop is how the kernel would send to a node now. (The outer source IP is
// the VXLAN device's fixed local address, whatever the route prefers.)
type hop struct {
	ifindex  int
	src, dst net.HardwareAddr
}

func underlayTo(node netip.Addr) (hop, error) {
	routes, err := netlink.RouteGet(node.AsSlice())
	if err != nil || len(routes) == 0 {
		return hop{}, fmt.Errorf("no route: %v", err)
	}
	r := routes[0]
	h := hop{ifindex: r.LinkIndex}
	link, err := netlink.LinkByIndex(r.LinkIndex)
	if err != nil {
		return hop{}, err
	}
	h.src = link.Attrs().HardwareAddr
	next := node
	if gw, ok := netip.AddrFromSlice(r.Gw); ok {
		next = gw.Unmap()
	}
	neighs, err := netlink.NeighList(r.LinkIndex, unix.AF_INET)
	if err != nil {
		return hop{}, err
	}
	for _, nb := range neighs {
		if ip, _ := netip.AddrFromSlice(nb.IP); ip.Unmap() == next && nb.State&usableNeighbour != 0 {
			h.dst = nb.HardwareAddr
			return h, nil
		}
	}
	return hop{}, fmt.Errorf("next hop %s unresolved", next)
}

const usableNeighbour = netlink.NUD_REACHABLE | netlink.NUD_STALE | netlink.NUD_DELAY | netlink.NUD_PROBE |
	netlink.NUD_PERMANENT | netlink.NUD_NOARP

// forgetNeighbour drops the kernel's learned (not permanent) neighbour entry
// for a node that moved to a new machine, so the slow path resolves the new
// machine's address at once instead of probing the old one for seconds.
func forgetNeighbour(node netip.Addr) {
	routes, err := netlink.RouteGet(node.AsSlice())
	if err != nil || len(routes) == 0 || routes[0].Gw != nil {
		return // behind a gateway: the gateway's entry is still right
	}
	neighs, err := netlink.NeighList(routes[0].LinkIndex, unix.AF_INET)
	if err != nil {
		return
	}
	for _, nb := range neighs {
		if ip, _ := netip.AddrFromSlice(nb.IP); ip.Unmap() == node && nb.State&(netlink.NUD_PERMANENT|netlink.NUD_NOARP) == 0 {
			if err := netlink.NeighDel(&nb); err != nil {
				slog.Warn("could not forget a moved node's neighbour entry", "node", node, "err", err)
			}
		}
	}
}
