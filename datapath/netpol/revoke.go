package netpol

import (
	"errors"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Revoke ends the connections of pods that rs no longer allows, by deleting
// their conntrack entries: the next packet of such a connection is judged
// as new, and dropped (kube-network-policies' "strict mode"). pods are the
// keys Apply returned; a pod no longer in rs is looked up by the IP it last
// had. Connections from hostAddrs (the node's own addresses, always
// allowed) and of protocols other than TCP, UDP and SCTP are left alone.
// It returns how many connections it ended.
func (e *Enforcer) Revoke(rs Ruleset, pods []string, hostAddrs []netip.Addr) (int, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	f := &revokeFilter{rs: &rs, pods: map[netip.Addr]bool{}, host: map[netip.Addr]bool{}}
	for _, key := range pods {
		if p := rs.Pod(key); p != nil {
			f.pods[p.IP.Unmap()] = true
		} else if ip, ok := e.gone[key]; ok {
			f.pods[ip.Unmap()] = true
		}
	}
	if len(f.pods) == 0 {
		return 0, nil
	}
	for _, a := range hostAddrs {
		f.host[a.Unmap()] = true
	}
	var ended uint
	var err error
	// A dump interrupted by concurrent changes may miss entries: go again.
	for range 3 {
		var n uint
		n, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, f)
		ended += n
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return int(ended), fmt.Errorf("conntrack: %w", err)
	}
	for _, key := range pods {
		delete(e.gone, key)
	}
	return int(ended), nil
}

// revokeFilter matches the conntrack entries of pods that rs denies.
type revokeFilter struct {
	rs   *Ruleset
	pods map[netip.Addr]bool
	host map[netip.Addr]bool
}

func (f *revokeFilter) MatchConntrackFlow(flow *netlink.ConntrackFlow) bool {
	c := Connection{
		Client: addr(flow.Forward.SrcIP),
		// The reply comes from the server after any DNAT.
		Server: addr(flow.Reverse.SrcIP),
		Proto:  Proto(flow.Forward.Protocol),
		Port:   flow.Reverse.SrcPort,
	}
	switch {
	case c.Proto != TCP && c.Proto != UDP && c.Proto != SCTP:
		return false
	case !f.pods[c.Client] && !f.pods[c.Server]:
		return false
	case f.host[c.Client]:
		return false
	}
	return !f.rs.Allows(c)
}

func addr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
