package policy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Revoked is what one Revoke did.
type Revoked struct {
	Ended int // connections ended
	kept  map[flowID]bool
	ended map[flowID]bool // connections the fast path opened whose conntrack entries it deleted
}

// flowID is a connection's two ends as they appear on the wire (after
// DNAT), in either order.
type flowID struct {
	lo, hi netip.AddrPort
	proto  Proto
}

func newFlowID(a, b netip.AddrPort, proto Proto) flowID {
	if b.Compare(a) < 0 {
		a, b = b, a
	}
	return flowID{a, b, proto}
}

// Keeps reports whether a connection between local and remote may stay in
// the flow cache: conntrack knows it, Revoke judged it, and the ruleset
// still allows it. A cached flow conntrack no longer knows cannot be judged
// (its orientation is unknown), so it goes and is learned again from the
// slow path's verdict.
func (r Revoked) Keeps(local, remote netip.AddrPort, proto Proto) bool {
	return r.kept[newFlowID(local, remote, proto)]
}

// Revoke ends the connections of pods that rs no longer allows, by deleting
// their conntrack entries: the next packet of such a connection is judged
// as new, and dropped (kube-network-policies' "strict mode"). pods are the
// keys Apply returned; a pod no longer in rs is looked up by the IP it last
// had. Connections from hostAddrs (the node's own addresses, always
// allowed) are left alone, and so are SCTP's: netlink reads no SCTP
// ports, and judged on port 0 an association a port allows would end.
// Those of protocols without ports (ICMP, ...: conntrack keeps an echo's
// for 30 s, and its id's next request rides it) are judged as the chains
// judge them, by the rules without ports.
// The connections of pods it leaves in place are in the result's Keeps.
// opened are connections the fast path opened: conntrack knows those only
// if the slow path picked one up mid-way, perhaps from its server, so each
// is judged as opened says it is.
func (e *Enforcer) Revoke(rs Ruleset, pods []string, hostAddrs []netip.Addr, opened []fastpath.Conn) (Revoked, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := &revokeFilter{rs: &rs, pods: map[netip.Addr]bool{}, host: map[netip.Addr]bool{}, kept: map[flowID]bool{},
		opened: map[flowID]Connection{}, ended: map[flowID]bool{}}
	for _, c := range opened {
		f.opened[newFlowID(c.Client, c.Server, Proto(c.Proto))] = openedConnection(c)
	}
	for _, key := range pods {
		var ips []netip.Addr
		if p := rs.Pod(key); p != nil {
			ips = p.IPs
		} else if addrs, ok := e.gone[key]; ok {
			ips = addrs[:]
		}
		for _, ip := range ips {
			if ip.IsValid() {
				f.pods[ip.Unmap()] = true
			}
		}
	}
	if len(f.pods) == 0 {
		return Revoked{}, nil
	}
	for _, a := range hostAddrs {
		f.host[a.Unmap()] = true
	}
	var ended uint
	for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		var err error
		// A dump interrupted by concurrent changes may miss entries: go
		// again.
		for range 3 {
			var n uint
			n, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, f)
			ended += n
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return Revoked{Ended: int(ended)}, fmt.Errorf("conntrack: %w", err)
		}
	}
	for _, key := range pods {
		delete(e.gone, key)
	}
	return Revoked{Ended: int(ended), kept: f.kept, ended: f.ended}, nil
}

// revokeFilter matches the conntrack entries of pods that rs denies, and
// records the ones of those pods it keeps.
type revokeFilter struct {
	rs     *Ruleset
	pods   map[netip.Addr]bool
	host   map[netip.Addr]bool
	kept   map[flowID]bool
	opened map[flowID]Connection
	ended  map[flowID]bool
}

func (f *revokeFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	c := Connection{
		Client: addr(flow.Forward.SrcIP),
		// The reply comes from the server after any DNAT.
		Server: addr(flow.Reverse.SrcIP),
		Proto:  Proto(flow.Forward.Protocol),
		Port:   flow.Reverse.SrcPort,
	}
	// On the wire, after DNAT: the reply's two ends.
	id := newFlowID(netip.AddrPortFrom(c.Server, c.Port), netip.AddrPortFrom(addr(flow.Reverse.DstIP), flow.Reverse.DstPort), c.Proto)
	o, opened := f.opened[id]
	if opened {
		c = o
	}
	if !f.pods[c.Client] && !f.pods[c.Server] {
		return false
	}
	if f.host[c.Client] || c.Proto == SCTP || f.rs.Allows(c) {
		f.kept[id] = true
		return false
	}
	if opened {
		f.ended[id] = true
	}
	return true
}

// openedConnection is a connection the fast path opened, as policy judges it.
func openedConnection(c fastpath.Conn) Connection {
	return Connection{Client: c.Client.Addr(), Server: c.Server.Addr(), Proto: Proto(c.Proto), Port: c.Server.Port()}
}

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
