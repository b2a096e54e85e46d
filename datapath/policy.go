package datapath

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"

	"github.com/onc-net/onc/datapath/bypass"

	"github.com/onc-net/onc/datapath/policy"
	"github.com/vishvananda/netlink"
)

// PolicyChange is what one EnforcePolicy did.
type PolicyChange struct {
	Pods  []string // keys of the pods whose rules changed (added, changed or gone)
	Ended int      // connections ended (in conntrack, or bypassed ones aborted) because rs no longer allows them
}

// EnforcePolicy makes the kernel enforce rs (datapath/policy). The rules
// change in one transaction. Then, for the pods whose rules changed, the
// connections rs no longer allows end: in conntrack, and bypassed ones
// (datapath/bypass) by aborting their sockets. The flow cache forgets
// those pods' flows except the ones conntrack knows and rs still allows,
// with learning paused in between so that no ended connection is learned
// again; the bypass records no new socket meanwhile. It returns when all
// of that is done, so the caller may report the change applied; pods
// whose revocation failed are revoked again on the next call. With
// checkKernel the whole table is rewritten, repairing drift.
func (n *Node) EnforcePolicy(rs policy.Ruleset, checkKernel bool) (PolicyChange, error) {
	n.mu.Lock()
	if n.policy == nil {
		e, err := policy.NewEnforcer()
		if err != nil {
			n.mu.Unlock()
			return PolicyChange{}, err
		}
		n.policy = e
	}
	e, bp := n.policy, n.bp
	n.mu.Unlock()
	if bp == nil {
		return n.enforcePolicy(e, nil, rs, checkKernel)
	}
	var ch PolicyChange
	var err error
	perr := bp.Paused(func() error {
		ch, err = n.enforcePolicy(e, bp, rs, checkKernel)
		return nil
	})
	if perr != nil && err == nil {
		// The rules are in force (or were never stopped from being); only
		// the pause around them failed. Revoke again on the next call.
		slog.Error("intra-node bypass: pausing recording around a policy change failed", "err", perr)
		for _, key := range ch.Pods {
			n.revokePending[key] = true
		}
	}
	return ch, err
}

func (n *Node) enforcePolicy(e *policy.Enforcer, bp *bypass.Bypass, rs policy.Ruleset, checkKernel bool) (PolicyChange, error) {
	var ch PolicyChange
	var err error
	if ch.Pods, err = e.Apply(rs, checkKernel); err != nil {
		return ch, err
	}
	for _, key := range ch.Pods {
		n.revokePending[key] = true
	}
	if len(n.revokePending) == 0 {
		return ch, nil
	}
	pods := slices.Sorted(maps.Keys(n.revokePending))
	hosts, err := hostAddrs()
	if err != nil {
		return ch, err
	}
	ips := make(map[netip.Addr]bool)
	for _, key := range pods {
		if p := rs.Pod(key); p != nil {
			ips[p.IP] = true
		}
	}
	var r policy.Revoked
	revoke := func() (err error) {
		r, err = e.Revoke(rs, pods, hosts)
		ch.Ended = r.Ended
		if err != nil || bp == nil {
			return err
		}
		ended, err := endDeniedBypassed(bp, rs, ips)
		ch.Ended += ended
		return err
	}
	if fp := n.fastPath(); fp == nil {
		err = revoke()
	} else {
		err = fp.EvictFlows(ips, func() (func(local, remote netip.AddrPort, proto uint8) bool, error) {
			if err := revoke(); err != nil {
				return nil, err
			}
			return func(local, remote netip.AddrPort, proto uint8) bool {
				return r.Keeps(local, remote, policy.Proto(proto))
			}, nil
		})
	}
	if err != nil {
		return ch, err
	}
	clear(n.revokePending)
	return ch, nil
}

// PolicyCounters are the connections each local pod's rules allowed and
// denied, by pod key; empty before the first EnforcePolicy.
func (n *Node) PolicyCounters() (map[string]policy.Counters, error) {
	n.mu.Lock()
	e := n.policy
	n.mu.Unlock()
	if e == nil {
		return map[string]policy.Counters{}, nil
	}
	return e.Counters()
}

// hostAddrs are the node's own IPv4 addresses: connections it opens leave
// by OUTPUT, are never policed, and are never ended.
func hostAddrs() ([]netip.Addr, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	addrs := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok {
			addrs = append(addrs, ip)
		}
	}
	return addrs, nil
}
