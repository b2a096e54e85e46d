package policy

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net/netip"
	"sync"
	"time"

	"github.com/onc-net/onc/datapath/flows"
	"sigs.k8s.io/knftables"
)

// This file is how the table reports its verdicts (docs/observability.md),
// besides the denied packets addRules logs: the new connections a pod's
// chain allows, with a fingerprint of the rules it enforced that Logged
// turns back into those rules, and the base chains' own drops.

// allowLogRate bounds the allowed-new records of one pod chain: a burst
// of new connections (TCP_CRR) costs the agent at most this many
// messages. The chain's -allow counter still counts every one.
const allowLogRate = "limit rate 100/second burst 200 packets"

// allowLog is the chain the allow rules of the chain of pod id in
// direction d go to when the table logs: it logs the packet and ends,
// returning to the base chain. The limit sits there, in a rule without a
// verdict: over it, the packet is allowed all the same, unlogged.
func (d dir) allowLog(id string) string { return "al-" + d.chain(id) }

// loggedLabel is the conntrack label bit an allow-log chain of direction
// d sets on the connection it logs, so that it logs each connection once:
// a UDP flow whose peer never answers stays new to conntrack, and each of
// its datagrams would otherwise be a record (up to the chain's rate,
// crowding denials out of the agent's ring). The bit lives on the
// connection's own conntrack entry, which the packet already carries: no
// set to look up, size or expire (as flows-denied must), and it goes with
// the connection (a revoked one is logged anew when it starts again). A
// label, not the mark: ONC's and others' skb->mark bits are copied to and
// from the mark. One bit per direction: a connection between two pods of
// the node passes the sender's egress chain and the receiver's ingress
// chain, and each logs it.
func (d dir) loggedLabel() int {
	if d == ingress {
		return 127
	}
	return 126
}

// addAllowLogRules adds the rules of the allow-log chain of pod id in
// direction d: end if the connection was logged, else log it with
// prefix, within the chain's rate, and mark it logged. Over the rate it
// is not marked, so a later packet of it may still be logged.
func addAllowLogRules(tx *knftables.Transaction, logGroup uint16, d dir, chain, prefix string) {
	tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("ct label %d return", d.loggedLabel())})
	tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("%s ct label set %d log prefix %q group %d", allowLogRate, d.loggedLabel(), prefix, logGroup)})
}

// logFingerprint is the fingerprint the log prefixes of a pod's chain
// enforcing (or auditing) d (compiled into c) carry: of its policies and
// rules, its tiers' included, so it changes whenever they do, even where
// the sets stay the same (the flow recorder names the deciding rule from
// the Direction it stands for); "" when the table does not log.
func (e *Enforcer) logFingerprint(d *Direction, c *compiled) string {
	if e.logGroup == 0 {
		return ""
	}
	if c.rulesHash == nil {
		c.rulesHash = c.hash()
	}
	h := sha256.New()
	for _, p := range d.Policies {
		fmt.Fprintln(h, p)
	}
	h.Write(c.rulesHash)
	return hex.EncodeToString(h.Sum(nil)[:4])
}

// hash is of c's rules, of a direction without tiers as it always was
// (an upgrade keeps its fingerprints).
func (c *compiled) hash() []byte {
	h := sha256.New()
	for _, r := range c.rules {
		fmt.Fprintf(h, "%s %d %t %v:", r.Policy, r.Index, r.Ports == nil, r.Ports)
		hashPeers(h, r.Peers)
	}
	if !c.clusterOnly && len(c.admin)+len(c.baseline) == 0 {
		return h.Sum(nil)
	}
	fmt.Fprintf(h, "cluster-only %t\n", c.clusterOnly)
	for _, tier := range tierLists(c.admin, c.baseline) {
		for _, r := range tier.rules {
			fmt.Fprintf(h, "%s %q %d %d %q %s %t %v:", tier.tier, r.Policy, r.Priority, r.Index, r.Name, r.Action, r.Ports == nil, r.Ports)
			hashPeers(h, r.Peers)
		}
	}
	return h.Sum(nil)
}

// hashPeers writes peers to h, and ends the line.
func hashPeers(h io.Writer, peers []netip.Prefix) {
	var b []byte
	for _, p := range peers {
		b = append(p.AppendTo(b[:0]), ' ')
		h.Write(b)
	}
	h.Write([]byte{'\n'})
}

// Logged is what a fingerprint in a pod chain's log prefix stands for.
type Logged struct {
	Pod string // the pod's key
	// Direction is the rules its chain enforced, or audited (W, U)
	// (read-only). A U prefix carries the enforcing rules' fingerprint
	// beside the audited ones' (flows.WouldAllowPrefix): what dropped the
	// packet, as it was then.
	Direction *Direction
}

// Logged still knows a superseded fingerprint for keptRulesets rulesets
// and keptFor after it was last in force, whichever is later, as long as
// it knows fewer than maxLogged: a packet logged just before a change may
// be read after it, and changes come in bursts when pods churn.
const (
	keptRulesets = 4
	keptFor      = time.Minute
	maxLogged    = 1 << 16
)

// logHistory is what the fingerprints of the current and the recent
// rulesets stand for. Its own lock: the recorder asks while an Apply
// runs.
type logHistory struct {
	mu  sync.Mutex
	gen uint64 // transactions recorded
	m   map[logKey]loggedAt
	now func() time.Time // time.Now; a test's clock
}

// logKey names a chain's rules as its log prefixes do.
type logKey struct {
	id      string
	ingress bool
	fp      string
}

type loggedAt struct {
	Logged
	gen uint64    // the last transaction whose ruleset had it
	at  time.Time // when that was recorded
}

// record adds the fingerprints of want, about to be committed, and
// forgets those superseded long enough ago (keptRulesets, keptFor).
func (h *logHistory) record(want []plan) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[logKey]loggedAt{}
	}
	if h.now == nil {
		h.now = time.Now
	}
	h.gen++
	now := h.now()
	for i := range want {
		p := &want[i]
		for _, d := range []dir{ingress, egress} {
			if fp := d.logFingerprint(p.applied); fp != "" {
				h.m[logKey{p.id, d == ingress, fp}] = loggedAt{Logged{Pod: p.key, Direction: p.rules(d)}, h.gen, now}
			}
			// W and U carry the audited rules' fingerprint: their
			// policies are other than the enforcing ones, so the two
			// share a key only when they share the rules too.
			if fp := d.auditLogFingerprint(p.applied); fp != "" {
				h.m[logKey{p.id, d == ingress, fp}] = loggedAt{Logged{Pod: p.key, Direction: p.auditRules(d)}, h.gen, now}
			}
		}
	}
	full := len(h.m) > maxLogged
	for k, l := range h.m {
		if l.gen+keptRulesets < h.gen && (full || now.Sub(l.at) > keptFor) {
			delete(h.m, k)
		}
	}
}

// Logged is what the fingerprint fp of the chain of pod id (PodID) in a
// direction stands for, if it is one of the current or the last few
// rulesets'.
func (e *Enforcer) Logged(id string, ingress bool, fp string) (Logged, bool) {
	e.logged.mu.Lock()
	defer e.logged.mu.Unlock()
	l, ok := e.logged.m[logKey{id, ingress, fp}]
	return l.Logged, ok
}

// dropReasons are the base chains' drops, each with its counter.
var dropReasons = []string{flows.DropSpoof, flows.DropInvalid, flows.DropNoSYN}

func dropCounter(why string) string { return "drop-" + why }

// dropChain counts, logs and drops what a base chain drops for why, of
// packets from a pod (egress) or to one (ingress).
func dropChain(why string, d dir) string { return "drop-" + why + "-" + d.prefix }

// dropVerdict ends a base chain's rule dropping for why.
func dropVerdict(why string, d dir) string { return "goto " + dropChain(why, d) }

// addDropChains adds the counters and the chains of the base chains'
// drops (spoofing only egress: a pod's own), the counters with the values
// of the ones kept holds.
func addDropChains(tx *knftables.Transaction, logGroup uint16, kept map[string]*knftables.Counter) {
	for _, why := range dropReasons {
		tx.Add(keptCounter(dropCounter(why), kept))
		for _, d := range []dir{ingress, egress} {
			if why == flows.DropSpoof && d == ingress {
				continue
			}
			chain := dropChain(why, d)
			tx.Add(&knftables.Chain{Name: chain})
			if logGroup != 0 {
				addLogRules(tx, logGroup, chain, flows.DropPrefix(why, d == ingress))
			}
			tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("counter name %q drop", dropCounter(why))})
		}
	}
}

// keptCounter is the named counter name, with the values of kept's.
func keptCounter(name string, kept map[string]*knftables.Counter) *knftables.Counter {
	c := &knftables.Counter{Name: name}
	if old := kept[name]; old != nil && old.Packets != nil && old.Bytes != nil {
		c.Packets, c.Bytes = old.Packets, old.Bytes
	}
	return c
}
