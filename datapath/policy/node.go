package policy

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"

	"sync"

	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/vishvananda/netlink"
)

// Node is a node's policy enforcement: the nft table (Enforcer), and the
// revocation that goes with each change, across conntrack, the flow cache
// and the bypass.
type Node struct {
	fastPath func() *fastpath.Datapath // nil when not loaded
	bypass   func() *bypass.Bypass     // nil when not loaded
	logGroup uint16                    // NewEnforcer's

	mu sync.Mutex
	e  *Enforcer // nil until the first Enforce
	// revokePending are the pods whose rules changed and whose connections
	// are not yet revoked; handOverPending the pods an audit closed to the
	// fast path (Prepared.Audited) whose connections the fast path opened
	// are not yet handed over. Only Enforce (one watcher) uses them.
	revokePending, handOverPending map[string]bool
}

// NewNode is the node's policy; fastPath and bypass return those
// features' tables, or nil while they are not loaded. Pods' chains log
// what they drop to NFLOG group logGroup, unless it is 0.
func NewNode(fastPath func() *fastpath.Datapath, bypass func() *bypass.Bypass, logGroup uint16) *Node {
	return &Node{fastPath: fastPath, bypass: bypass, logGroup: logGroup, revokePending: map[string]bool{}, handOverPending: map[string]bool{}}
}

// Change is what one Enforce did.
type Change struct {
	Pods  []string // keys of the pods whose rules changed (added, changed or gone)
	Ended int      // connections ended (in conntrack, or bypassed ones aborted) because rs no longer allows them
}

// Enforce makes the kernel enforce rs. The rules
// change in one transaction. Then, for the pods whose rules changed, the
// connections rs no longer allows end: in conntrack, and bypassed ones
// (datapath/bypass) by aborting their sockets. The flow cache forgets
// those pods' flows except the ones conntrack knows and rs still allows,
// with learning paused in between so that no ended connection is learned
// again; the bypass records no new socket meanwhile (only then: a resync
// that changes no pod leaves the bypass recording). The pods an audit
// closes to the flow cache have the connections it opened handed over to
// conntrack, and none ended (audit never cuts a connection). It returns
// when all of that is done, so the caller may report the change applied;
// pods whose revocation (or hand-over) failed are revoked (or handed
// over) again on the next call. With
// checkKernel the table is checked for drift and rewritten if it drifted
// (Enforcer.Commit).
func (n *Node) Enforce(rs Ruleset, checkKernel bool) (Change, error) {
	n.mu.Lock()
	if n.e == nil {
		e, err := NewEnforcer(n.logGroup)
		if err != nil {
			n.mu.Unlock()
			return Change{}, err
		}
		n.e = e
	}
	e := n.e
	n.mu.Unlock()
	p, err := e.Prepare(rs)
	if err != nil {
		return Change{}, err
	}
	bp := n.bypass()
	if bp == nil || len(p.Changed) == 0 && len(n.revokePending) == 0 {
		return n.enforce(e, nil, rs, p, checkKernel)
	}
	var ch Change
	perr := bp.Paused(func() error {
		ch, err = n.enforce(e, bp, rs, p, checkKernel)
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

func (n *Node) enforce(e *Enforcer, bp *bypass.Bypass, rs Ruleset, p *Prepared, checkKernel bool) (Change, error) {
	var ch Change
	var err error
	fp := n.fastPath()
	open := openPods(rs)
	// No SYN may take the fast path while rules in force could deny it:
	// the pods rs isolates stop being open before the rules change.
	if fp != nil {
		if err := fp.NarrowOpen(open); err != nil {
			return ch, fmt.Errorf("fast path: close the pods policy isolates: %w", err)
		}
	}
	if err = e.Commit(p, checkKernel); err != nil {
		return ch, err
	}
	ch.Pods = p.Changed
	for _, key := range ch.Pods {
		n.revokePending[key] = true
	}
	for _, key := range p.Audited {
		n.handOverPending[key] = true
	}
	if fp != nil {
		if err := fp.SetOpen(open, checkKernel); err != nil {
			return ch, fmt.Errorf("fast path: open the pods no policy isolates: %w", err)
		}
	}
	if len(n.revokePending) == 0 && (fp == nil || len(n.handOverPending) == 0) {
		clear(n.handOverPending)
		return ch, nil
	}
	pods := slices.Sorted(maps.Keys(n.revokePending))
	hosts, err := hostAddrs()
	if err != nil {
		return ch, err
	}
	// The flow cache judges the flows of both (judgeFlow).
	ips, judged := podIPs(rs, n.revokePending), podIPs(rs, n.handOverPending)
	maps.Copy(judged, ips)
	var r Revoked
	revoke := func(opened []fastpath.Conn) (err error) {
		if len(pods) == 0 {
			return nil
		}
		r, err = e.Revoke(rs, pods, hosts, opened)
		ch.Ended = r.Ended
		if err != nil || bp == nil {
			return err
		}
		ended, err := endDeniedBypassed(bp, rs, ips)
		ch.Ended += ended
		return err
	}
	if fp == nil {
		err = revoke(nil)
	} else {
		err = fp.EvictFlows(judged, func(opened []fastpath.Conn) (func(local, remote netip.AddrPort, proto uint8, opener fastpath.Opener) fastpath.Verdict, error) {
			if err := revoke(opened); err != nil {
				return nil, err
			}
			return func(local, remote netip.AddrPort, proto uint8, opener fastpath.Opener) fastpath.Verdict {
				v, ended := judgeFlow(rs, open, r, ips, local, remote, proto, opener)
				if ended {
					ch.Ended++
				}
				return v
			}, nil
		})
	}
	if err != nil {
		return ch, err
	}
	clear(n.revokePending)
	clear(n.handOverPending)
	return ch, nil
}

// podIPs are the addresses in rs of the pods keys.
func podIPs(rs Ruleset, keys map[string]bool) map[netip.Addr]bool {
	ips := make(map[netip.Addr]bool)
	for key := range keys {
		if p := rs.Pod(key); p != nil {
			for _, ip := range p.IPs {
				ips[ip] = true
			}
		}
	}
	return ips
}

// handOverAudited is the verdict on a cached flow of a pod an audit
// closed to the fast path, its enforcement unchanged: one the fast path
// opened goes to conntrack, which then carries it past the audit's chain
// as established (picked up mid-stream instead, perhaps the wrong way
// round, it could give a false would-deny); one the slow path opened
// conntrack knows already. None ends: audit never cuts a connection.
func handOverAudited(opener fastpath.Opener) fastpath.Verdict {
	if opener == fastpath.OpenedBySlowPath {
		return fastpath.Keep
	}
	return fastpath.HandOver
}

// openPods are the pods of rs no policy selects, enforcing or audited, in
// either direction (by IP: two attachments of one address are open only if
// both are). An audited pod's connections must open through conntrack, or
// the table would never see them to report what audit would deny.
func openPods(rs Ruleset) map[netip.Addr]bool {
	open := map[netip.Addr]bool{}
	for _, p := range rs.Pods {
		for _, ip := range p.IPs {
			was, seen := open[ip]
			open[ip] = !p.Isolated() && !p.Audited() && (was || !seen)
		}
	}
	return open
}

// judgeFlow is the verdict on a cached flow of a pod whose rules changed
// (at revoked) or that an audit closed to the fast path (elsewhere), after
// Revoke (r), and whether that ends its connection. An audit's pod has its
// flows handed over (handOverAudited). A flow the slow
// path opened stays if conntrack still holds it allowed. One the fast path
// opened is judged as the connection it is: denied, it goes (and its
// connection ends, unless Revoke already ended it in conntrack); allowed,
// it stays where its pod is still open, and is handed over to conntrack
// where a policy isolates the pod now, so that the slow path carries it if
// ever it must.
func judgeFlow(rs Ruleset, open map[netip.Addr]bool, r Revoked, revoked map[netip.Addr]bool, local, remote netip.AddrPort, proto uint8, opener fastpath.Opener) (v fastpath.Verdict, ended bool) {
	if !revoked[local.Addr()] {
		return handOverAudited(opener), false
	}
	if opener == fastpath.OpenedBySlowPath {
		if r.Keeps(local, remote, Proto(proto)) {
			return fastpath.Keep, false
		}
		return fastpath.Evict, false
	}
	c := fastpath.Conn{Client: local, Server: remote, Proto: proto}
	if opener == fastpath.OpenedByRemote {
		c = fastpath.Conn{Client: remote, Server: local, Proto: proto}
	}
	switch {
	case !rs.Allows(openedConnection(c)):
		return fastpath.Evict, !r.ended[newFlowID(local, remote, Proto(proto))]
	case open[local.Addr()]:
		return fastpath.Keep, false
	}
	return fastpath.HandOver, false
}

// Counters are the connections each local pod's rules allowed and
// denied, by pod key, and the base chains' drops; empty before the first
// Enforce.
func (n *Node) Counters() (Counts, error) {
	e := n.enforcer()
	if e == nil {
		return Counts{Pods: map[string]Counters{}, Drops: map[string]uint64{}}, nil
	}
	return e.Counters()
}

// Logged is what a fingerprint in a log prefix stands for
// (Enforcer.Logged); nothing before the first Enforce.
func (n *Node) Logged(id string, ingress bool, fp string) (Logged, bool) {
	e := n.enforcer()
	if e == nil {
		return Logged{}, false
	}
	return e.Logged(id, ingress, fp)
}

// enforcer is the Enforcer, nil before the first Enforce.
func (n *Node) enforcer() *Enforcer {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.e
}

// Close lets go of the nft connection; the table stays in force.
func (n *Node) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.e == nil {
		return nil
	}
	err := n.e.Close()
	n.e = nil
	return err
}

// endDeniedBypassed ends the bypassed connections of the pods at ips
// that rs no longer allows: their bytes never pass netfilter, so deleting
// conntrack entries would not stop them. It returns how many it ended.
func endDeniedBypassed(bp *bypass.Bypass, rs Ruleset, ips map[netip.Addr]bool) (int, error) {
	conns, err := bp.Conns()
	if err != nil {
		return 0, err
	}
	ended := 0
	var errs []error
	for _, c := range conns {
		if !ips[c.Client.Addr()] && !ips[c.Server.Addr()] {
			continue
		}
		if rs.Allows(Connection{Client: c.Client.Addr(), Server: c.Server.Addr(), Proto: TCP, Port: c.Server.Port()}) {
			continue
		}
		// One that fails does not keep the others alive.
		if err := bp.Destroy(c); err != nil {
			errs = append(errs, err)
			continue
		}
		ended++
	}
	return ended, errors.Join(errs...)
}

// hostAddrs are the node's own addresses: connections it opens leave by
// OUTPUT, are never policed, and are never ended.
func hostAddrs() ([]netip.Addr, error) {
	list, err := netlink.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return nil, fmt.Errorf("list the node's addresses: %w", err)
	}
	addrs := make([]netip.Addr, 0, len(list))
	for _, a := range list {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			addrs = append(addrs, ip.Unmap())
		}
	}
	return addrs, nil
}
