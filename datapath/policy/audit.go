package policy

// Audit mode: the chain rules of audited policies (Pod.AuditIngress,
// Pod.AuditEgress). They report, and count, what the audited policies
// would change, and never change a verdict:
//   - a direction no enforcing policy isolates, but an audited one does,
//     gets a chain of the audited policies' sets whose end logs the packet
//     as "would deny" (W), counts it in <chain>-would-deny and returns: the
//     packet passes, as it would with no chain. The pod stays out of the
//     set isolated (the no-SYN drop is enforcement's);
//   - a direction an enforcing policy isolates looks the packet up in the
//     audited policies' sets just before its drop: one they hold goes to
//     the chain <chain>-would-allow, which counts it in the counter of the
//     same name, logs it as "would allow" (U, with the fingerprints of
//     both the audited and the enforcing rules) and drops it as the chain
//     would have.
//
// The audited policies' sets are a pair like the enforcing ones', named
// from <chain>-a (auditSets). The four counters live with the pod while
// some audited policy selects it.

import (
	"fmt"

	"github.com/onc-net/onc/datapath/flows"
	"sigs.k8s.io/knftables"
)

// Suffixes of the audit counters' names, after the chain's name.
const (
	wouldDeny  = "-would-deny"
	wouldAllow = "-would-allow"
)

// auditKey names the audited direction of the pod with key pod in
// Enforcer.compiled.
func (d dir) auditKey(pod string) string { return d.key(pod) + " audit" }

// auditFingerprint picks a's fingerprint of the audited policies' sets in
// direction d.
func (d dir) auditFingerprint(a applied) string {
	if d == ingress {
		return a.auIn
	}
	return a.auEg
}

// auditLogFingerprint picks a's log fingerprint of the audited rules in
// direction d.
func (d dir) auditLogFingerprint(a applied) string {
	if d == ingress {
		return a.auInLog
	}
	return a.auEgLog
}

// auditedSets is what the audited policies' sets of a direction hold,
// audited by a and enforced as e: the chain looks them up only where e
// denies, so a's rules, but after e's Admin rules where it has some:
// what an Admin Deny denies, which enforcing a would not change, is no
// would-allow (and what an Admin Accept allows never gets there).
func auditedSets(e, a *Direction) *Direction {
	if a == nil || e == nil || len(e.Admin) == 0 {
		return a
	}
	return &Direction{Policies: a.Policies, Rules: a.Rules, Admin: e.Admin}
}

// auditSets is the base of the names of the audited policies' sets of
// chain (setNames).
func auditSets(chain string) string { return chain + "-a" }

// wouldAllowChain is the chain a packet the enforcing policies drop and
// an audited one allows goes to.
func wouldAllowChain(chain string) string { return chain + wouldAllow }

// addWouldDenyRules adds the rules of the chain of pod id in direction d
// that no enforcing policy isolates: return what c's sets hold, and log
// (to logGroup, unless 0, with the audited rules' fingerprint fp) and
// count the rest, which returns too.
func addWouldDenyRules(tx *knftables.Transaction, logGroup uint16, d dir, id string, c *compiled, fp string) {
	chain := d.chain(id)
	addLookups(tx, d, chain, auditSets(chain), c, "return")
	if logGroup != 0 {
		addLogRules(tx, logGroup, chain, flows.PolicyPrefix(flows.VerdictWouldDeny, d == ingress, id, fp))
	}
	tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("counter name %q", chain+wouldDeny)})
}

// addWouldAllow adds the chain of pod id in direction d that counts, logs
// (with the fingerprints of s, the audited rules' and the enforcing
// ones') and drops what the enforcing policies drop and an audited one
// allows.
func addWouldAllow(tx *knftables.Transaction, logGroup uint16, d dir, id string, s dirSets) {
	tx.Add(&knftables.Chain{Name: wouldAllowChain(d.chain(id))})
	addWouldAllowRules(tx, logGroup, d, id, s)
}

// rewriteWouldAllow replaces the rules of the would-allow chain of pod id
// in direction d, for new fingerprints.
func rewriteWouldAllow(tx *knftables.Transaction, logGroup uint16, d dir, id string, s dirSets) {
	tx.Flush(&knftables.Chain{Name: wouldAllowChain(d.chain(id))})
	addWouldAllowRules(tx, logGroup, d, id, s)
}

func addWouldAllowRules(tx *knftables.Transaction, logGroup uint16, d dir, id string, s dirSets) {
	chain := d.chain(id)
	name := wouldAllowChain(chain)
	tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("counter name %q", chain+wouldAllow)})
	if logGroup != 0 {
		addLogRules(tx, logGroup, name, flows.WouldAllowPrefix(d == ingress, id, s.auditLogFP, s.logFP))
	}
	tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("counter name %q drop", chain+"-deny")})
}

// removeWouldAllow deletes chain's would-allow chain, once no rule jumps
// to it.
func removeWouldAllow(tx *knftables.Transaction, chain string) {
	name := wouldAllowChain(chain)
	tx.Flush(&knftables.Chain{Name: name})
	tx.Delete(&knftables.Chain{Name: name})
}

// addAuditCounters adds the audit counters of pod id, with the values of
// the ones kept holds (a rewrite's).
func addAuditCounters(tx *knftables.Transaction, id string, kept map[string]*knftables.Counter) {
	for _, d := range []dir{ingress, egress} {
		tx.Add(keptCounter(d.chain(id)+wouldDeny, kept))
		tx.Add(keptCounter(d.chain(id)+wouldAllow, kept))
	}
}

// removeAuditCounters deletes the audit counters of pod id, once no rule
// counts in them.
func removeAuditCounters(tx *knftables.Transaction, id string) {
	for _, d := range []dir{ingress, egress} {
		tx.Delete(&knftables.Counter{Name: d.chain(id) + wouldDeny})
		tx.Delete(&knftables.Counter{Name: d.chain(id) + wouldAllow})
	}
}
