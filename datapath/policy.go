package datapath

import (
	"net/netip"

	"github.com/onc-net/onc/datapath/netpol"
)

// PolicyChange is what one EnforcePolicy did.
type PolicyChange struct {
	Pods  []string // keys of the pods whose rules changed (added, changed or gone)
	Ended int      // connections ended in conntrack because rs no longer allows them
}

// EnforcePolicy makes the kernel enforce rs (datapath/netpol). The rules
// change in one transaction. Then, for the pods whose rules changed, the
// connections rs no longer allows end in conntrack and the pods' cached
// verdicts leave the flow cache, with learning paused in between so that
// none is learned again. It returns when all of that is done, so the
// caller may report the change applied. With checkKernel the whole table
// is rewritten, repairing drift.
func (n *Node) EnforcePolicy(rs netpol.Ruleset, checkKernel bool) (PolicyChange, error) {
	n.mu.Lock()
	if n.policy == nil {
		e, err := netpol.NewEnforcer()
		if err != nil {
			n.mu.Unlock()
			return PolicyChange{}, err
		}
		n.policy = e
	}
	e, fp, hosts := n.policy, n.fp, n.hostAddrs()
	n.mu.Unlock()

	var ch PolicyChange
	var err error
	if ch.Pods, err = e.Apply(rs, checkKernel); err != nil || len(ch.Pods) == 0 {
		return ch, err
	}
	revoke := func() (err error) {
		ch.Ended, err = e.Revoke(rs, ch.Pods, hosts)
		return err
	}
	if fp == nil {
		return ch, revoke()
	}
	ips := make(map[netip.Addr]bool)
	for _, key := range ch.Pods {
		if p := rs.Pod(key); p != nil {
			ips[p.IP] = true
		}
	}
	return ch, fp.EvictFlows(ips, revoke)
}

// PolicyCounters are the connections each local pod's rules allowed and
// denied, by pod key; empty before the first EnforcePolicy.
func (n *Node) PolicyCounters() (map[string]netpol.Counters, error) {
	n.mu.Lock()
	e := n.policy
	n.mu.Unlock()
	if e == nil {
		return map[string]netpol.Counters{}, nil
	}
	return e.Counters()
}

// hostAddrs are this node's own addresses: connections from them are never
// policed (kubelet probes). Called with n.mu held.
func (n *Node) hostAddrs() []netip.Addr {
	addrs := []netip.Addr{n.up.NodeIP}
	if n.gateway.IsValid() {
		addrs = append(addrs, n.gateway)
	}
	return addrs
}
