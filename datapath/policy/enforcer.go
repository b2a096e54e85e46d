package policy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os/exec"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/onc-net/onc/datapath/flows"
	"sigs.k8s.io/knftables"
)

// Table is the nftables table (family inet: both IP families) the Enforcer
// owns. It coexists with ONC's iptables-nft rules: a drop here is final, an
// accept is not, so it drops what policy denies and lets everything else
// fall through.
const Table = "onc-policy"

// nftTimeout bounds one nft command.
const nftTimeout = 30 * time.Second

// Enforcer keeps the table in line with the Ruleset it is given.
//
// The table has two base chains, forward and input (priority filter), that
// drop packets from a pod veth whose source is not that pod's address of
// the packet's family (sets pod-addrs and pod-addrs6: no pod can pass for
// an allowed peer, and one without an address of a family sends nothing
// in it beyond its link), accept neighbour discovery with the node
// (input), accept established and related packets, drop invalid ones to
// or from a pod veth (set pod-ifaces) and TCP ones that would start a
// connection without a SYN to or from an isolated pod's (set isolated), and
// jump through the verdict maps egress (keyed by iifname) and ingress
// (keyed by oifname) to the chain of the isolated pod the packet leaves or
// reaches. Those chains, in-<id> and eg-<id>, return when the set
// <chain>-ports (peer . proto . port) or <chain>-all (peer) holds the
// packet (IPv4; <chain>-ports6 and <chain>-all6 for IPv6, made only when
// the rules allow an IPv6 peer) or, in a direction with
// ClusterNetworkPolicy tiers, <chain>-other (peer, for a packet of any
// protocol but TCP, UDP and SCTP; made only when it allows such a peer
// that -all does not: tiercompile.go), or their second pair,
// <chain>-ports-b and so on (changeSets), and drop otherwise, counting
// both with the named counters <chain>-allow and <chain>-deny. With a
// log group, a pod's chain also logs what it drops (NFLOG, the prefix naming the verdict, the
// direction, the pod's id and the fingerprint of its rules:
// datapath/flows), at most 20 packets a second per chain and, of those, 3
// at once and then 1 a second per connection (sets flows-denied and
// flows-denied6 hold each connection's budget until it has been quiet for
// a minute), and goes to its allow-log chain instead of returning, which
// logs the new connections it allows, each once (a conntrack label,
// verdicts.go); the base chains' drops
// go to chains that count, log and drop them. Audited policies add their
// own sets and rules, which report and count and never change a verdict
// (audit.go). Returning instead of accepting lets same-node traffic pass
// the sender's egress and then the receiver's ingress chain. Traffic from
// the node to its pods leaves by OUTPUT and is
// never policed.
//
// Every Apply is one nft transaction, so the kernel never sees a partial
// policy. Methods run nft (forked from the calling thread) and netlink in
// the network namespace of the calling thread: a caller in another
// namespace must lock its goroutine to a thread there.
type Enforcer struct {
	mu  sync.Mutex
	nft knftables.Interface
	// nftPath is the nft command Commit runs its transactions through
	// (runBatched); none for knftables' fake, in tests.
	nftPath string
	synced  bool                // the table holds exactly pods: false until the first Apply, and after a failed one
	pods    map[string]applied  // by pod key: what the table holds
	gone    map[string]podAddrs // removed pods' last IPs, until Revoke has seen them
	// legacy is the table as agents before IPv6 wrote it (family ip),
	// deleted after the first rewrite of this one; nil once done.
	legacy knftables.Interface
	// compiled is the last Apply's set elements, by pod key and direction
	// (dir.key): what the sets of the pods in pods hold.
	compiled map[string]*compiled
	owned    ownership // whether the kernel's table is still the one last written
	commits  uint64    // Commits so far: what a Prepared was compiled against
	logGroup uint16    // where the chains log their verdicts; 0: they do not
	logged   logHistory
}

// Log rates (docs/observability.md): per pod chain, so that a flood of
// new connections to one pod costs the agent a bounded number of messages
// and fills the sets of connections slowly; per connection, so that one
// noisy connection does not use up its pod's.
const (
	chainLogRate = "limit rate 20/second burst 50 packets"
	connLogRate  = "limit rate 1/second burst 3 packets"
)

// applied is what the table holds for one pod.
type applied struct {
	id     string // the pod key's short hash, in its chain, set and counter names
	iface  string
	addrs  podAddrs
	in, eg string // fingerprint of each direction's sets; "" when not isolated
	// auIn, auEg: the same of the audited policies' sets; "" when none
	// audits the direction.
	auIn, auEg string
	// inLog and egLog are the fingerprints of each direction's enforcing
	// rules its log prefixes carry (logFingerprint), auInLog and auEgLog
	// those of its audited ones; "" when there are none or the table
	// does not log. Rules can change without changing the sets.
	inLog, egLog, auInLog, auEgLog string
}

// sameEnforcement reports whether a and b enforce the same: only their
// log prefixes and their audited policies may differ, which never change
// a verdict (so never revoke a connection).
func (a applied) sameEnforcement(b applied) bool {
	return a.id == b.id && a.iface == b.iface && a.addrs == b.addrs && a.in == b.in && a.eg == b.eg
}

// podAddrs are a pod's addresses by family (ipv4, ipv6); invalid where it
// has none.
type podAddrs [2]netip.Addr

func newPodAddrs(key string, ips []netip.Addr) (podAddrs, error) {
	var a podAddrs
	for _, ip := range ips {
		f := familyOf(ip)
		if !ip.IsValid() || ip.Is4In6() {
			return a, fmt.Errorf("pod %s: address %q is not one a pod can have", key, ip)
		}
		if a[f].IsValid() {
			return a, fmt.Errorf("pod %s has two %s addresses, %s and %s", key, families[f].name, a[f], ip)
		}
		a[f] = ip
	}
	if !a[ipv4].IsValid() && !a[ipv6].IsValid() {
		return a, fmt.Errorf("pod %s has no address", key)
	}
	return a, nil
}

// family is an IP family as the table writes it.
type family struct {
	name     string // for errors
	expr     string // the packet's header in rules: ip, ip6
	addrType string // of set keys
	suffix   string // of the names of a chain's sets of this family
	version  string // of its header
}

// The indexes of families.
const (
	ipv4 = iota
	ipv6
)

var families = [2]family{
	ipv4: {"IPv4", "ip", "ipv4_addr", "", "4"},
	ipv6: {"IPv6", "ip6", "ipv6_addr", "6", "6"},
}

func familyOf(a netip.Addr) int {
	if a.Is4() {
		return ipv4
	}
	return ipv6
}

func (a applied) isolated() bool { return a.in != "" || a.eg != "" }

func (a applied) audited() bool { return a.auIn != "" || a.auEg != "" }

// NewEnforcer checks that nft works here. It does not touch the table
// until the first Apply. The pods' chains log what they drop to NFLOG
// group logGroup, unless it is 0 or the kernel cannot (then they log
// nothing, and a warning says why): logging must never stop policy.
func NewEnforcer(logGroup uint16) (*Enforcer, error) {
	path, err := exec.LookPath("nft")
	if err != nil {
		return nil, fmt.Errorf("NetworkPolicy needs the nft command (install the nftables package): %w", err)
	}
	nft, err := knftables.New(knftables.InetFamily, Table)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	legacy, err := knftables.New(knftables.IPv4Family, Table)
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	e := &Enforcer{nft: nft, nftPath: path, legacy: legacy, pods: map[string]applied{}, gone: map[string]podAddrs{}, logGroup: logGroup}
	if logGroup != 0 {
		if err := e.checkLog(); err != nil {
			slog.Warn("network policy: denied packets are not logged (no flow records): the kernel refuses the log rules", "err", err)
			e.logGroup = 0
		}
	}
	return e, nil
}

// checkLog asks the kernel (a transaction checked, never committed)
// whether it takes the log rules: they need nft's log, limit and dynamic
// set expressions, conntrack labels and nfnetlink_log.
func (e *Enforcer) checkLog() error {
	tx := e.nft.NewTransaction()
	tx.Add(&knftables.Table{})
	addDeniedSets(tx)
	tx.Add(&knftables.Chain{Name: "log-check"})
	addLogRules(tx, e.logGroup, "log-check", flows.PolicyPrefix(flows.VerdictDenied, true, "check", "check"))
	addAllowLogRules(tx, e.logGroup, ingress, "log-check", flows.PolicyPrefix(flows.VerdictAllowed, true, "check", "check"))
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	return e.nft.Check(ctx, tx)
}

// run runs a transaction of Commit's: through nft with its element
// commands batched (runBatched), or through a fake.
func (e *Enforcer) run(ctx context.Context, tx *knftables.Transaction) error {
	if e.nftPath == "" {
		return e.nft.Run(ctx, tx)
	}
	return runBatched(ctx, e.nftPath, tx)
}

// Close releases the Enforcer. The table stays, enforcing the last Ruleset
// applied, for the next agent to take over.
func (e *Enforcer) Close() error { return nil }

// dir is a direction: ingress or egress.
type dir struct {
	prefix string // of chain, set and counter names
	vmap   string // the verdict map jumping to the pod's chain
	peer   string // the packet's peer address field
}

var (
	ingress = dir{"in", "ingress", "saddr"}
	egress  = dir{"eg", "egress", "daddr"}
)

func (d dir) chain(id string) string { return d.prefix + "-" + id }

// key names the direction of the pod with key pod in Enforcer.compiled.
func (d dir) key(pod string) string { return pod + " " + d.prefix }

// fingerprint picks a's fingerprint in direction d.
func (d dir) fingerprint(a applied) string {
	if d == ingress {
		return a.in
	}
	return a.eg
}

// hasChain reports whether a has a chain in direction d: some policy,
// enforcing or audited, selects it there.
func (d dir) hasChain(a applied) bool { return d.fingerprint(a) != "" || d.auditFingerprint(a) != "" }

// logFingerprint picks a's log fingerprint of the enforcing rules in
// direction d.
func (d dir) logFingerprint(a applied) string {
	if d == ingress {
		return a.inLog
	}
	return a.egLog
}

// sameDir reports whether a and b have the same chain in direction d:
// the same sets and the same log prefixes.
func (d dir) sameDir(a, b applied) bool {
	return d.fingerprint(a) == d.fingerprint(b) && d.auditFingerprint(a) == d.auditFingerprint(b) &&
		d.logFingerprint(a) == d.logFingerprint(b) && d.auditLogFingerprint(a) == d.auditLogFingerprint(b)
}

// plan is the desired state of one pod.
type plan struct {
	applied
	key                string
	inSets, egSets     *compiled  // nil when not isolated
	auInSets, auEgSets *compiled  // nil when not audited
	inDir, egDir       *Direction // the rules they come from
	auInDir, auEgDir   *Direction
}

func (p *plan) sets(d dir) dirSets {
	if d == ingress {
		return dirSets{p.inSets, p.auInSets, p.inLog, p.auInLog}
	}
	return dirSets{p.egSets, p.auEgSets, p.egLog, p.auEgLog}
}

// dirSets are what a pod's chain in one direction looks up: the sets of
// the enforcing policies and of the audited ones, nil where none, and the
// fingerprints of their rules its log prefixes carry (A and D the
// enforcing ones', W and U the audited ones').
type dirSets struct {
	enforce, audit    *compiled
	logFP, auditLogFP string
}

func (s dirSets) none() bool { return s.enforce == nil && s.audit == nil }

// setsOf are the sets of the last Apply of the pod with key in direction
// d (without fingerprints: what to delete or change).
func (e *Enforcer) setsOf(d dir, key string) dirSets {
	return dirSets{enforce: e.compiled[d.key(key)], audit: e.compiled[d.auditKey(key)]}
}

func (p *plan) rules(d dir) *Direction {
	if d == ingress {
		return p.inDir
	}
	return p.egDir
}

func (p *plan) auditRules(d dir) *Direction {
	if d == ingress {
		return p.auInDir
	}
	return p.auEgDir
}

// PodID is a short stable id for a pod key, in the names of its chains,
// sets and counters and in its chains' log prefixes: nft names are at most
// 31 characters ("in-<id>-ports" is 19, the longest, "in-<id>-would-allow",
// 25).
func PodID(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:5])
}

// plans turns rs into the desired state of each pod, and the set elements
// of each isolated direction, by dir.key. A direction whose rules are
// those of the last Apply reuses its elements: turning rules into disjoint
// set elements is most of an Apply's own work, and a change usually
// touches a few pods.
func (e *Enforcer) plans(rs Ruleset) ([]plan, map[string]*compiled, error) {
	out := make([]plan, 0, len(rs.Pods))
	next := make(map[string]*compiled, 2*len(rs.Pods))
	keys := map[string]bool{}
	ids := map[string]string{}
	ifaces := map[string]string{}
	memo := rangeMemo{}
	for _, p := range rs.Pods {
		if keys[p.Key] {
			return nil, nil, fmt.Errorf("pod %s twice in the ruleset", p.Key)
		}
		keys[p.Key] = true
		id := PodID(p.Key)
		if other, dup := ids[id]; dup {
			return nil, nil, fmt.Errorf("pods %s and %s hash to the same id %s", other, p.Key, id)
		}
		ids[id] = p.Key
		if p.Iface == "" {
			return nil, nil, fmt.Errorf("pod %s has no interface", p.Key)
		}
		if other, dup := ifaces[p.Iface]; dup {
			return nil, nil, fmt.Errorf("pods %s and %s have the same interface %s", other, p.Key, p.Iface)
		}
		ifaces[p.Iface] = p.Key
		addrs, err := newPodAddrs(p.Key, p.IPs)
		if err != nil {
			return nil, nil, err
		}
		pl := plan{key: p.Key, applied: applied{id: id, iface: p.Iface, addrs: addrs}}
		for _, side := range []struct {
			d              *Direction // the rules
			setsOf         *Direction // what the sets hold
			key, tag       string
			sets           **compiled
			fingerprint    *string
			logFingerprint *string
			rules          **Direction
		}{
			{p.Ingress, p.Ingress, ingress.key(p.Key), "in:", &pl.inSets, &pl.in, &pl.inLog, &pl.inDir},
			{p.Egress, p.Egress, egress.key(p.Key), "eg:", &pl.egSets, &pl.eg, &pl.egLog, &pl.egDir},
			{p.AuditIngress, auditedSets(p.Ingress, p.AuditIngress), ingress.auditKey(p.Key), "ai:", &pl.auInSets, &pl.auIn, &pl.auInLog, &pl.auInDir},
			{p.AuditEgress, auditedSets(p.Egress, p.AuditEgress), egress.auditKey(p.Key), "ae:", &pl.auEgSets, &pl.auEg, &pl.auEgLog, &pl.auEgDir},
		} {
			if side.d != nil {
				*side.sets = e.elementsOf(side.key, side.setsOf, next, memo)
				*side.fingerprint = side.tag + (*side.sets).fingerprint
				*side.logFingerprint = e.logFingerprint(side.d, *side.sets)
				*side.rules = side.d
			}
		}
		out = append(out, pl)
	}
	return out, next, nil
}

// from reports whether c was compiled from d's very rules.
func (c *compiled) from(d *Direction) bool {
	return (identical(c.rules, d.Rules) || slices.EqualFunc(c.rules, d.Rules, sameRule)) &&
		c.clusterOnly == d.ClusterOnly && EqualTierRules(c.admin, d.Admin) && EqualTierRules(c.baseline, d.Baseline)
}

// sameRule compares two rules field by field (reflect.DeepEqual would take
// most of an Apply on rules with thousands of peers).
func sameRule(a, b Rule) bool {
	return a.Policy == b.Policy && a.Index == b.Index && (identical(a.Peers, b.Peers) || slices.Equal(a.Peers, b.Peers)) &&
		slices.Equal(a.Ports, b.Ports) && (a.Ports == nil) == (b.Ports == nil)
}

// listID is a list by identity: rules are read-only, and a caller that
// recompiles only what changed (agent/policy.Incremental) hands back the
// last Ruleset's rules and peers for the rest, so the same array and
// length are the same list, equal without reading it.
type listID[E any] struct {
	first *E
	n     int
}

func idOf[E any](s []E) listID[E] {
	if len(s) == 0 {
		return listID[E]{}
	}
	return listID[E]{&s[0], len(s)}
}

// identical reports whether a and b are the very same list.
func identical[E any](a, b []E) bool { return idOf(a) == idOf(b) }

// compiled is a direction's rules, the set elements they make, and which
// of the direction's two pairs of sets holds them (setNames).
type compiled struct {
	rules           []Rule
	admin, baseline []TierRule
	clusterOnly     bool
	el              elements
	fingerprint     string
	second          bool
	rulesHash       []byte // of the rules and tiers, once a log fingerprint needed it (logFingerprint)
}

// elementsOf compiles d, or reuses what the last Apply compiled for key
// from the same rules, and records it in next. New elements start in the
// pair of sets that holds the last ones: update changes those in place, or
// fills the other pair.
func (e *Enforcer) elementsOf(key string, d *Direction, next map[string]*compiled, memo rangeMemo) *compiled {
	c := e.compiled[key]
	if c == nil || !c.from(d) {
		el := compileDirection(d, memo)
		c = &compiled{rules: d.Rules, admin: d.Admin, baseline: d.Baseline, clusterOnly: d.ClusterOnly,
			el: el, fingerprint: el.fingerprint(), second: c != nil && c.second}
	}
	next[key] = c
	return c
}

// Apply makes the table enforce rs and returns the keys of the pods whose
// enforcement changed (added, rules changed, removed), sorted: the caller
// should Revoke their connections. It is Prepare then Commit.
func (e *Enforcer) Apply(rs Ruleset, checkKernel bool) ([]string, error) {
	p, err := e.Prepare(rs)
	if err != nil {
		return nil, err
	}
	return p.Changed, e.Commit(p, checkKernel)
}

// Prepared is a ruleset compiled against what the table holds, for
// Commit. Changed is known before anything is written, so that a caller
// can make ready for a change (or skip that when there is none).
type Prepared struct {
	// Changed are the keys of the pods whose enforcement changes (added,
	// rules changed, removed), sorted.
	Changed []string
	// Audited are the keys of the pods an audit closes to the fast path
	// (openPods) with their enforcement unchanged: no policy selected
	// them, and an audited one does now. The caller hands the connections
	// the fast path opened of theirs over to conntrack, as it does an
	// isolated pod's, and revokes none. Sorted.
	Audited  []string
	want     []plan
	compiled map[string]*compiled
	commits  uint64 // e.commits when prepared
}

// Prepare compiles rs against what the table holds; nothing is written.
func (e *Enforcer) Prepare(rs Ruleset) (*Prepared, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	want, compiled, err := e.plans(rs)
	if err != nil {
		return nil, err
	}
	p := &Prepared{want: want, compiled: compiled, commits: e.commits}
	seen := make(map[string]bool, len(want))
	for _, w := range want {
		switch old, ok := e.pods[w.key]; {
		case !ok || !old.sameEnforcement(w.applied):
			p.Changed = append(p.Changed, w.key)
		case w.audited() && !old.audited() && !old.isolated():
			p.Audited = append(p.Audited, w.key)
		}
		seen[w.key] = true
	}
	for key := range e.pods {
		if !seen[key] {
			p.Changed = append(p.Changed, key)
		}
	}
	sort.Strings(p.Changed)
	sort.Strings(p.Audited)
	return p, nil
}

// Commit makes the table enforce what p was prepared from. On the first
// Commit and the first after a failure, it rewrites the whole table,
// taking over one an earlier agent left with no gap and keeping the
// counters; with checkKernel too if the table may have drifted from what
// it last wrote (drift.go), repairing it; otherwise it touches only
// p.Changed, and makes no transaction if that is empty. Either way it is
// at most one nft transaction. p must be the last one prepared since the
// last Commit: the table's state it was compiled against must still hold.
func (e *Enforcer) Commit(p *Prepared, checkKernel bool) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if p.commits != e.commits {
		return errors.New("network policy: a ruleset prepared before another was committed")
	}
	e.commits++
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	// A resync rewrites the table only if it may have drifted from what
	// was last written (drift.go); the update then writes what rs changes.
	rewrite := !e.synced || checkKernel && e.owned.drifted()
	var tx *knftables.Transaction
	var err error
	if !rewrite {
		tx = e.update(p.want)
	} else if tx, err = e.rebuild(ctx, p.want); err != nil {
		return err
	}
	if tx.NumOperations() > 0 {
		// Before the commit: a packet logged right after it finds its
		// fingerprint.
		if e.logGroup != 0 {
			e.logged.record(p.want)
		}
		before, berr := RulesetGeneration()
		if err := e.run(ctx, tx); err != nil {
			e.synced = false
			return fmt.Errorf("nft: %w", err)
		}
		if rewrite {
			e.retireLegacy(ctx)
		}
		after, aerr := RulesetGeneration()
		e.owned.wrote(before, after, berr == nil && aerr == nil, rewrite)
	}
	e.synced = true
	e.compiled = p.compiled

	next := make(map[string]applied, len(p.want))
	for _, w := range p.want {
		next[w.key] = w.applied
		delete(e.gone, w.key)
	}
	for key, old := range e.pods {
		if _, ok := next[key]; !ok {
			e.gone[key] = old.addrs
		}
	}
	e.pods = next
	return nil
}

// retireLegacy deletes the table as agents before IPv6 wrote it, family
// ip, now that this one enforces (an upgrade: until now both did, the old
// one the old rules). Its own transaction makes the next resync rewrite
// once (drift.go), at the upgrade only.
func (e *Enforcer) retireLegacy(ctx context.Context) {
	if e.legacy == nil {
		return
	}
	if _, err := e.legacy.List(ctx, "chains"); knftables.IsNotFound(err) {
		e.legacy = nil
		return
	}
	tx := e.legacy.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := e.legacy.Run(ctx, tx); err != nil {
		slog.Warn("network policy: cannot delete the table of an earlier version; it keeps enforcing its rules", "table", "ip "+Table, "err", err)
		return
	}
	slog.Info("network policy: deleted the table of an earlier version", "table", "ip "+Table)
	e.legacy = nil
}

// rebuild writes the whole table anew: deleted and added again in one
// transaction, so that the kernel never sees it missing or half written.
// Deleting it first, rather than flushing its sets, spares nft matching
// every new interval element against the old ones: a rewrite of 200,000
// elements took minutes that way, and seconds this way. The named
// counters of the pods it keeps get their values back.
func (e *Enforcer) rebuild(ctx context.Context, want []plan) (*knftables.Transaction, error) {
	kept := map[string]*knftables.Counter{}
	list, err := e.nft.ListCounters(ctx)
	if err != nil && !knftables.IsNotFound(err) {
		return nil, fmt.Errorf("list the counters of table %s: %w", Table, err)
	}
	for _, c := range list {
		kept[c.Name] = c
	}
	tx := e.nft.NewTransaction()
	tx.Add(&knftables.Table{}) // so that the delete finds one
	tx.Delete(&knftables.Table{})
	tx.Add(&knftables.Table{})
	addBase(tx, e.logGroup, kept)
	for i := range want {
		p := &want[i]
		addPod(tx, p, kept)
		if p.audited() {
			addAuditCounters(tx, p.id, kept)
		}
		if p.isolated() {
			tx.Add(isolatedElem(p.iface))
		}
		for _, d := range []dir{ingress, egress} {
			if s := p.sets(d); !s.none() {
				addDir(tx, e.logGroup, d, p.id, p.iface, s)
			}
		}
	}
	return tx, nil
}

// update returns a transaction taking the table from e.pods to want. It
// deletes before it adds, so an interface moving between pods is free
// before it is reused.
func (e *Enforcer) update(want []plan) *knftables.Transaction {
	tx := e.nft.NewTransaction()
	byKey := make(map[string]*plan, len(want))
	for i := range want {
		byKey[want[i].key] = &want[i]
	}
	oldKeys := make([]string, 0, len(e.pods))
	for key := range e.pods {
		oldKeys = append(oldKeys, key)
	}
	sort.Strings(oldKeys)
	for _, key := range oldKeys {
		old, p := e.pods[key], byKey[key]
		if p != nil && p.applied == old {
			continue
		}
		for _, d := range []dir{ingress, egress} {
			was := d.hasChain(old)
			switch {
			case was && (p == nil || p.sets(d).none()):
				removeDir(tx, e.logGroup, d, old.id, old.iface, e.setsOf(d, key))
			case was && p.iface != old.iface:
				tx.Delete(&knftables.Element{Map: d.vmap, Key: []string{ifname(old.iface)}})
			}
		}
		if old.isolated() && (p == nil || !p.isolated() || p.iface != old.iface) {
			tx.Delete(isolatedElem(old.iface))
		}
		switch {
		case p == nil:
			removePod(tx, old)
			if old.audited() {
				removeAuditCounters(tx, old.id)
			}
		case p.iface != old.iface:
			tx.Delete(&knftables.Element{Set: "pod-ifaces", Key: []string{ifname(old.iface)}})
			deletePodAddrs(tx, old, applied{})
		default:
			deletePodAddrs(tx, old, p.applied)
		}
	}

	for i := range want {
		p := &want[i]
		old, had := e.pods[p.key]
		if had && p.applied == old {
			continue
		}
		switch {
		case !had:
			addPod(tx, p, nil)
		case p.iface != old.iface:
			tx.Add(&knftables.Element{Set: "pod-ifaces", Key: []string{ifname(p.iface)}})
			addPodAddrs(tx, p.applied, applied{})
		default:
			addPodAddrs(tx, p.applied, old)
		}
		if p.isolated() && (!had || !old.isolated() || p.iface != old.iface) {
			tx.Add(isolatedElem(p.iface))
		}
		// The audit counters come before the rules that count in them,
		// and go after the rules that did are rewritten.
		if p.audited() && (!had || !old.audited()) {
			addAuditCounters(tx, p.id, nil)
		}
		for _, d := range []dir{ingress, egress} {
			now := p.sets(d)
			was := had && d.hasChain(old)
			switch {
			case now.none():
			case !was:
				addDir(tx, e.logGroup, d, p.id, p.iface, now)
			default:
				if !d.sameDir(p.applied, old) {
					changeDir(tx, e.logGroup, d, p.id, e.setsOf(d, p.key), now)
				}
				if p.iface != old.iface {
					tx.Add(&knftables.Element{Map: d.vmap, Key: []string{ifname(p.iface)}, Value: []string{"jump " + d.chain(p.id)}})
				}
			}
		}
		if had && old.audited() && !p.audited() {
			removeAuditCounters(tx, p.id)
		}
	}
	return tx
}

func ifname(name string) string { return fmt.Sprintf("%q", name) }

// podAddrSets are the sets of each family's pod interface and the one
// source address it may use.
var podAddrSets = [2]string{ipv4: "pod-addrs", ipv6: "pod-addrs6"}

// addPodAddrs adds a's interface and source addresses, except those
// except holds already (same interface and address).
func addPodAddrs(tx *knftables.Transaction, a, except applied) {
	for f, ip := range a.addrs {
		if ip.IsValid() && (except.iface != a.iface || except.addrs[f] != ip) {
			tx.Add(&knftables.Element{Set: podAddrSets[f], Key: []string{ifname(a.iface), ip.String()}})
		}
	}
}

// deletePodAddrs deletes a's interface and source addresses, except those
// keep holds.
func deletePodAddrs(tx *knftables.Transaction, a, keep applied) {
	for f, ip := range a.addrs {
		if ip.IsValid() && (keep.iface != a.iface || keep.addrs[f] != ip) {
			tx.Delete(&knftables.Element{Set: podAddrSets[f], Key: []string{ifname(a.iface), ip.String()}})
		}
	}
}

// isolatedElem is a pod's interface in the set of isolated pods'.
func isolatedElem(iface string) *knftables.Element {
	return &knftables.Element{Set: "isolated", Key: []string{ifname(iface)}}
}

// deniedSets are, by family, the sets of connections whose drops a pod's
// chain logged lately, each with its own rate limit.
var deniedSets = [2]string{ipv4: "flows-denied", ipv6: "flows-denied6"}

// addDeniedSets adds the sets of connections whose drops were logged
// lately: a connection leaves its set after a minute without a logged
// packet, and a full set logs no new connection until one leaves.
func addDeniedSets(tx *knftables.Transaction) {
	for f, set := range deniedSets {
		a := families[f].addrType
		tx.Add(&knftables.Set{Name: set, Type: a + " . " + a + " . inet_proto . inet_service . inet_service",
			Flags: []knftables.SetFlag{knftables.DynamicFlag, knftables.TimeoutFlag},
			Size:  knftables.PtrTo[uint64](65536), Timeout: knftables.PtrTo(time.Minute)})
	}
}

// addBase adds the base chains and the maps, sets, chains and counters
// they use, the counters with the values of the ones kept holds (a
// rewrite's).
func addBase(tx *knftables.Transaction, logGroup uint16, kept map[string]*knftables.Counter) {
	tx.Add(&knftables.Set{Name: "pod-ifaces", Type: "ifname"})
	if logGroup != 0 {
		addDeniedSets(tx)
	}
	addDropChains(tx, logGroup, kept)
	for f, set := range podAddrSets {
		tx.Add(&knftables.Set{Name: set, Type: "ifname . " + families[f].addrType})
	}
	tx.Add(&knftables.Set{Name: "isolated", Type: "ifname"})
	for _, d := range []dir{ingress, egress} {
		tx.Add(&knftables.Map{Name: d.vmap, Type: "ifname : verdict"})
	}
	for _, hook := range []knftables.BaseChainHook{knftables.ForwardHook, knftables.InputHook} {
		name := string(hook)
		tx.Add(&knftables.Chain{
			Name:     name,
			Type:     knftables.PtrTo(knftables.FilterType),
			Hook:     knftables.PtrTo(hook),
			Priority: knftables.PtrTo(knftables.FilterPriority),
			Policy:   knftables.PtrTo(knftables.AcceptPolicy),
		})
		// First, even before conntrack's verdict: a pod sending with
		// another's address could pass for an allowed peer, or inject
		// into that peer's connections. IPv6 link-local sources (and
		// the unspecified one of duplicate address detection) reach
		// no further than the pod's link, the node.
		tx.Add(&knftables.Rule{Chain: name, Rule: "iifname @pod-ifaces iifname . ip saddr != @pod-addrs " + dropVerdict(flows.DropSpoof, egress)})
		tx.Add(&knftables.Rule{Chain: name, Rule: "iifname @pod-ifaces ip6 saddr != { ::, fe80::/10 } iifname . ip6 saddr != @pod-addrs6 " + dropVerdict(flows.DropSpoof, egress)})
		// Neighbour discovery with the node, which conntrack does not
		// track: ONC gives pods a permanent entry for their gateway, but
		// a pod may still solicit the node (its link-local address, an
		// entry it flushed) whatever its egress policy, as it may ARP.
		// Hop limit 255: sent on the link, so it reaches input only.
		if hook == knftables.InputHook {
			tx.Add(&knftables.Rule{Chain: name, Rule: "iifname @pod-ifaces icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert } ip6 hoplimit 255 accept"})
		}
		// Only the first packet of a connection is judged; Revoke ends
		// connections a change denies.
		tx.Add(&knftables.Rule{Chain: name, Rule: "ct state established,related accept"})
		// Conntrack picks up a TCP connection it does not know (as after
		// Revoke) from any packet, so one from the server would revive it
		// with the roles swapped, judged as the server's: to or from an
		// isolated pod, only a SYN may start one.
		for _, drop := range [][3]string{{"ct state invalid", "pod-ifaces", flows.DropInvalid}, {"ct state new tcp flags & (fin|syn|rst|ack) != syn", "isolated", flows.DropNoSYN}} {
			tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("%s iifname @%s %s", drop[0], drop[1], dropVerdict(drop[2], egress))})
			if hook == knftables.ForwardHook {
				tx.Add(&knftables.Rule{Chain: name, Rule: fmt.Sprintf("%s oifname @%s %s", drop[0], drop[1], dropVerdict(drop[2], ingress))})
			}
		}
		// A pod's egress to the node itself arrives at input.
		tx.Add(&knftables.Rule{Chain: name, Rule: "iifname vmap @" + egress.vmap})
		if hook == knftables.ForwardHook {
			tx.Add(&knftables.Rule{Chain: name, Rule: "oifname vmap @" + ingress.vmap})
		}
	}
}

// addPod adds what every pod has: its interface in pod-ifaces and its
// counters (kept while the pod stays, isolated or not), with the values
// of the ones kept holds (a rewrite's).
func addPod(tx *knftables.Transaction, p *plan, kept map[string]*knftables.Counter) {
	tx.Add(&knftables.Element{Set: "pod-ifaces", Key: []string{ifname(p.iface)}})
	addPodAddrs(tx, p.applied, applied{})
	for _, d := range []dir{ingress, egress} {
		for _, name := range []string{d.chain(p.id) + "-allow", d.chain(p.id) + "-deny"} {
			tx.Add(keptCounter(name, kept))
		}
	}
}

func removePod(tx *knftables.Transaction, a applied) {
	tx.Delete(&knftables.Element{Set: "pod-ifaces", Key: []string{ifname(a.iface)}})
	deletePodAddrs(tx, a, applied{})
	for _, d := range []dir{ingress, egress} {
		tx.Delete(&knftables.Counter{Name: d.chain(a.id) + "-allow"})
		tx.Delete(&knftables.Counter{Name: d.chain(a.id) + "-deny"})
	}
}

// addDir adds the chain of a pod in direction d, its sets holding s's
// elements, its log prefixes carrying s's fingerprints, and the map
// element jumping to it.
func addDir(tx *knftables.Transaction, logGroup uint16, d dir, id, iface string, s dirSets) {
	chain := d.chain(id)
	if s.enforce != nil {
		addSets(tx, chain, s.enforce)
	}
	if s.audit != nil {
		addSets(tx, auditSets(chain), s.audit)
	}
	if s.enforce != nil && s.audit != nil {
		addWouldAllow(tx, logGroup, d, id, s)
	}
	tx.Add(&knftables.Chain{Name: chain})
	if logGroup != 0 {
		tx.Add(&knftables.Chain{Name: d.allowLog(id)})
	}
	addRules(tx, logGroup, d, id, s)
	tx.Add(&knftables.Element{Map: d.vmap, Key: []string{ifname(iface)}, Value: []string{"jump " + chain}})
}

// setNames are the names of chain's sets of family f: <chain>-ports and
// <chain>-all (IPv4; -ports6 and -all6 for IPv6), or the second pair, with
// "-b" (changeSets).
func setNames(chain string, f int, second bool) (ports, all string) {
	ports, all = chain+"-ports"+families[f].suffix, chain+"-all"+families[f].suffix
	if second {
		return ports + "-b", all + "-b"
	}
	return ports, all
}

// otherSet is the name of chain's third set of family f, of the peers
// allowed on every protocol but TCP, UDP and SCTP: <chain>-other (-other6;
// "-b" in the second pair). Only a direction with tiers can need it
// (elements.other), and it has it only then.
func otherSet(chain string, f int, second bool) string {
	name := chain + "-other" + families[f].suffix
	if second {
		return name + "-b"
	}
	return name
}

// setFamilies are the families c has sets for: IPv4 always (its sets
// exist, empty, even for a pod without IPv4, as they did before IPv6),
// IPv6 when it allows an IPv6 peer.
func (c *compiled) setFamilies() []int {
	if c.el.has6 {
		return []int{ipv4, ipv6}
	}
	return []int{ipv4}
}

// addSets adds chain's sets of the pair c.second names, holding c's
// elements.
func addSets(tx *knftables.Transaction, chain string, c *compiled) {
	for _, f := range c.setFamilies() {
		ports, all := setNames(chain, f, c.second)
		addr := families[f].addrType
		tx.Add(&knftables.Set{Name: ports, Type: addr + " . inet_proto . inet_service", Flags: []knftables.SetFlag{knftables.IntervalFlag}})
		tx.Add(&knftables.Set{Name: all, Type: addr, Flags: []knftables.SetFlag{knftables.IntervalFlag}})
		if c.hasOther() {
			tx.Add(&knftables.Set{Name: otherSet(chain, f, c.second), Type: addr, Flags: []knftables.SetFlag{knftables.IntervalFlag}})
		}
	}
	for _, p := range c.el.all {
		tx.Add(allElem(chain, c.second, p))
	}
	for _, pe := range c.el.ports {
		tx.Add(portsElem(chain, c.second, pe))
	}
	for _, p := range c.el.other {
		tx.Add(otherElem(chain, c.second, p))
	}
}

// hasOther reports whether c has sets of peers allowed on the protocols
// without ports.
func (c *compiled) hasOther() bool { return len(c.el.other) > 0 }

// otherElem is peer p in chain's set of peers allowed on the protocols
// without ports, of its family.
func otherElem(chain string, second bool, p addrRange) *knftables.Element {
	return &knftables.Element{Set: otherSet(chain, familyOf(p.first), second), Key: []string{p.String()}}
}

// allElem is peer p in chain's set of peers of its family.
func allElem(chain string, second bool, p addrRange) *knftables.Element {
	_, all := setNames(chain, familyOf(p.first), second)
	return &knftables.Element{Set: all, Key: []string{p.String()}}
}

// portsElem is pe in chain's set of peers, protocols and ports of its
// family.
func portsElem(chain string, second bool, pe portElem) *knftables.Element {
	ports, _ := setNames(chain, familyOf(pe.peer.first), second)
	return &knftables.Element{Set: ports, Key: pe.key()}
}

// addRules adds the rules of the chain of pod id in direction d, which
// look the packet up in the sets of s.enforce, and drop what they do not
// hold; before the drop, in the audited policies' sets, if any
// (audit.go). With a log group (unless 0), they log both, with s.logFP:
// what the enforcing sets hold by going to the chain's allow-log chain,
// which logs it and returns to the base chain, as return does without
// one. A chain of audited policies alone drops nothing, and logs only
// what they would deny (addWouldDenyRules): what it lets through no rule
// in force allows (the direction is not isolated), so it has no allowed
// record, as it would have none without the chain.
func addRules(tx *knftables.Transaction, logGroup uint16, d dir, id string, s dirSets) {
	chain := d.chain(id)
	if s.enforce == nil {
		addWouldDenyRules(tx, logGroup, d, id, s.audit, s.auditLogFP)
		return
	}
	allowed := "return"
	if logGroup != 0 {
		allowed = "goto " + d.allowLog(id)
		addAllowLogRules(tx, logGroup, d, d.allowLog(id), flows.PolicyPrefix(flows.VerdictAllowed, d == ingress, id, s.logFP))
	}
	addLookups(tx, d, chain, chain, s.enforce, fmt.Sprintf("counter name %q %s", chain+"-allow", allowed))
	if s.audit != nil {
		addLookups(tx, d, chain, auditSets(chain), s.audit, "goto "+wouldAllowChain(chain))
	}
	if logGroup != 0 {
		addLogRules(tx, logGroup, chain, flows.PolicyPrefix(flows.VerdictDenied, d == ingress, id, s.logFP))
	}
	tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("counter name %q drop", chain+"-deny")})
}

// addLookups adds to chain the rules looking the packet's peer (and
// protocol and port) up in c's sets, named from base, then doing what
// then says.
func addLookups(tx *knftables.Transaction, d dir, chain, base string, c *compiled, then string) {
	for _, f := range c.setFamilies() {
		ports, all := setNames(base, f, c.second)
		peer := families[f].expr + " " + d.peer
		tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("%s . meta l4proto . th dport @%s %s", peer, ports, then)})
		tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("%s @%s %s", peer, all, then)})
		if c.hasOther() {
			tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf("meta l4proto != { tcp, udp, sctp } %s @%s %s", peer, otherSet(base, f, c.second), then)})
		}
	}
}

// addLogRules adds to chain the rules logging a packet to logGroup with
// prefix, within the chain's and the connection's rates. A limit never
// sits in a rule with a verdict: over it, the rule would not match, and
// the packet would pass. Protocols without ports count each packet as a
// connection: the chain's rate bounds them.
func addLogRules(tx *knftables.Transaction, logGroup uint16, chain, prefix string) {
	for f, set := range deniedSets {
		h := families[f].expr
		tx.Add(&knftables.Rule{Chain: chain, Rule: fmt.Sprintf(
			"%s %s update @%s { %s saddr . %s daddr . meta l4proto . th sport . th dport %s } log prefix %q group %d",
			h+" version "+families[f].version, chainLogRate, set, h, h, connLogRate, prefix, logGroup)})
	}
}

func deleteSets(tx *knftables.Transaction, chain string, c *compiled) {
	for _, f := range c.setFamilies() {
		ports, all := setNames(chain, f, c.second)
		tx.Delete(&knftables.Set{Name: ports})
		tx.Delete(&knftables.Set{Name: all})
		if c.hasOther() {
			tx.Delete(&knftables.Set{Name: otherSet(chain, f, c.second)})
		}
	}
}

// removeDir undoes addDir for the sets of s (the counters stay with the
// pod).
func removeDir(tx *knftables.Transaction, logGroup uint16, d dir, id, iface string, s dirSets) {
	chain := d.chain(id)
	tx.Delete(&knftables.Element{Map: d.vmap, Key: []string{ifname(iface)}})
	tx.Flush(&knftables.Chain{Name: chain})
	tx.Delete(&knftables.Chain{Name: chain})
	if logGroup != 0 {
		tx.Flush(&knftables.Chain{Name: d.allowLog(id)})
		tx.Delete(&knftables.Chain{Name: d.allowLog(id)})
	}
	if s.enforce != nil && s.audit != nil {
		removeWouldAllow(tx, chain)
	}
	if s.enforce != nil {
		deleteSets(tx, chain, s.enforce)
	}
	if s.audit != nil {
		deleteSets(tx, auditSets(chain), s.audit)
	}
}

// changeDir makes a pod's chain in direction d, which looks up was's
// sets, look up now's and log with now's fingerprints: each pair of sets
// changes (changeSets), comes or goes, and the chain's rules are
// rewritten if that changed which sets they name, or which of the
// enforcing and audited policies there are, and always with a log group
// (the caller calls it only for a change of the rules, so of some
// fingerprint the prefixes carry). The kernel sees it all at once, in the
// Apply's transaction.
func changeDir(tx *knftables.Transaction, logGroup uint16, d dir, id string, was, now dirSets) {
	chain := d.chain(id)
	wasBoth, nowBoth := was.enforce != nil && was.audit != nil, now.enforce != nil && now.audit != nil
	rewrite := logGroup != 0 || (was.enforce == nil) != (now.enforce == nil) || (was.audit == nil) != (now.audit == nil)
	type sets struct {
		base string
		c    *compiled
	}
	var stale []sets // to delete once no rule names them
	for _, pair := range []struct {
		base     string
		was, now *compiled
	}{{chain, was.enforce, now.enforce}, {auditSets(chain), was.audit, now.audit}} {
		switch {
		case pair.was == nil && pair.now == nil:
		case pair.was == nil:
			addSets(tx, pair.base, pair.now)
		case pair.now == nil:
			stale = append(stale, sets{pair.base, pair.was})
		case changeSets(tx, pair.base, pair.was, pair.now):
			rewrite = true
			stale = append(stale, sets{pair.base, pair.was})
		}
	}
	switch {
	case nowBoth && !wasBoth:
		addWouldAllow(tx, logGroup, d, id, now)
	case nowBoth && logGroup != 0:
		rewriteWouldAllow(tx, logGroup, d, id, now)
	}
	if rewrite {
		tx.Flush(&knftables.Chain{Name: chain})
		if logGroup != 0 {
			tx.Flush(&knftables.Chain{Name: d.allowLog(id)})
		}
		addRules(tx, logGroup, d, id, now)
	}
	if wasBoth && !nowBoth {
		removeWouldAllow(tx, chain)
	}
	for _, s := range stale {
		deleteSets(tx, s.base, s.c)
	}
}

// changeSets makes the sets named from base, which hold was's elements,
// hold now's: in place, deleting the elements that left and then adding
// the new ones (nft rejects an element that overlaps one still in the
// set), or, where that costs more, by filling the other pair of sets
// (always when the families of its sets change): then it reports true,
// and the caller points the chain's rules at the new pair and deletes the
// old one. Either way the kernel sees the whole change at once, in the
// Apply's transaction.
func changeSets(tx *knftables.Transaction, chain string, was, now *compiled) (refilled bool) {
	gonePorts, newPorts := diff(was.el.ports, now.el.ports)
	goneAll, newAll := diff(was.el.all, now.el.all)
	goneOther, newOther := diff(was.el.other, now.el.other)
	// What nft and the kernel take, in µs, as measured on kernel 6.18 and
	// nft 1.0.6 (docs/performance.md): a delete costs 6 per element of a
	// -ports set (the kernel's set for concatenated intervals, pipapo,
	// cuts the element out of every lookup bitmap) and 0.5 per element of
	// an -all (or -other) set (nft's own interval handling); an add, about
	// 15. A change of the families, or of whether there are -other sets,
	// changes the chain's rules: refilled.
	inPlace := 6*len(gonePorts)*len(was.el.ports) + len(goneAll)*len(was.el.all)/2 + len(goneOther)*len(was.el.other)/2 +
		15*(len(newPorts)+len(newAll)+len(newOther))
	if inPlace > 15*(len(now.el.ports)+len(now.el.all)+len(now.el.other)) || was.el.has6 != now.el.has6 || was.hasOther() != now.hasOther() {
		now.second = !was.second
		addSets(tx, chain, now)
		return true
	}
	for _, p := range goneAll {
		tx.Delete(allElem(chain, now.second, p))
	}
	for _, pe := range gonePorts {
		tx.Delete(portsElem(chain, now.second, pe))
	}
	for _, p := range goneOther {
		tx.Delete(otherElem(chain, now.second, p))
	}
	for _, p := range newAll {
		tx.Add(allElem(chain, now.second, p))
	}
	for _, pe := range newPorts {
		tx.Add(portsElem(chain, now.second, pe))
	}
	for _, p := range newOther {
		tx.Add(otherElem(chain, now.second, p))
	}
	return false
}

// diff returns the elements of was that now lacks and those of now that
// was lacks, each in its list's order.
func diff[E comparable](was, now []E) (gone, added []E) {
	left := make(map[E]bool, len(was))
	for _, x := range was {
		left[x] = true
	}
	for _, x := range now {
		if left[x] {
			delete(left, x)
		} else {
			added = append(added, x)
		}
	}
	for _, x := range was {
		if left[x] {
			gone = append(gone, x)
		}
	}
	return gone, added
}

// Counters are one pod's policy counters: packets its chains judged, which
// are only packets conntrack sees as NEW (the first of a connection, and
// every packet of a denied one, since a dropped packet leaves no
// connection behind) – so roughly connection attempts, counting each
// retransmission of a denied one. They survive rule changes and agent
// restarts, and reset when the pod leaves the ruleset.
type Counters struct {
	IngressAllowed, IngressDenied, EgressAllowed, EgressDenied uint64
	// What audited policies would have done (addAuditCounters): packets
	// let through that they would deny, and packets dropped that one of
	// them would allow.
	IngressWouldDeny, IngressWouldAllow, EgressWouldDeny, EgressWouldAllow uint64
}

// Counts are the table's counters.
type Counts struct {
	Pods map[string]Counters // by pod key: every pod of the last Ruleset applied
	// Drops are the packets the base chains dropped, by why
	// (flows.DropSpoof, DropInvalid, DropNoSYN); they survive agent
	// restarts.
	Drops map[string]uint64
}

// Counters returns the table's counters.
func (e *Enforcer) Counters() (Counts, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), nftTimeout)
	defer cancel()
	list, err := e.nft.ListCounters(ctx)
	if err != nil {
		return Counts{}, fmt.Errorf("list counters: %w", err)
	}
	packets := make(map[string]uint64, len(list))
	for _, c := range list {
		if c.Packets != nil {
			packets[c.Name] = *c.Packets
		}
	}
	out := Counts{Pods: make(map[string]Counters, len(e.pods)), Drops: make(map[string]uint64, len(dropReasons))}
	for key, a := range e.pods {
		in, eg := ingress.chain(a.id), egress.chain(a.id)
		out.Pods[key] = Counters{
			IngressAllowed:    packets[in+"-allow"],
			IngressDenied:     packets[in+"-deny"],
			EgressAllowed:     packets[eg+"-allow"],
			EgressDenied:      packets[eg+"-deny"],
			IngressWouldDeny:  packets[in+wouldDeny],
			IngressWouldAllow: packets[in+wouldAllow],
			EgressWouldDeny:   packets[eg+wouldDeny],
			EgressWouldAllow:  packets[eg+wouldAllow],
		}
	}
	for _, why := range dropReasons {
		out.Drops[why] = packets[dropCounter(why)]
	}
	return out, nil
}
