package flows

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	corev1 "k8s.io/api/core/v1"

	agentpolicy "github.com/onc-net/onc/agent/policy"
	dpflows "github.com/onc-net/onc/datapath/flows"
	"github.com/onc-net/onc/datapath/policy"
)

// Recorder turns what the policy table logs into records: the local pod
// by its chain's id (or, for the base chains' drops, by its veth) among
// the rules as last enforced, the rules its chain enforced by their
// fingerprint, and the other end among the cluster's pods.
type Recorder struct {
	store  *Store
	node   string
	rules  func() policy.Ruleset // this node's pods, as last enforced
	logged Logged
	pods   func() []*corev1.Pod // the cluster's, as the policy informers hold them

	// cluster is the cluster's pods by address, read again, at most once
	// a second (reindex), once they changed (stale): by one reader at a
	// time (indexing), while the others use the last index.
	cluster  atomic.Pointer[clusterIndex]
	stale    atomic.Bool
	indexing sync.Mutex
	reindex  time.Duration

	mu sync.Mutex
	// local, byIface and byAddr are the local pods by chain id, by
	// interface and by address, for the rules whose pod list localOf is.
	local   map[string]localPodOf
	byIface map[string]localPodOf
	byAddr  map[netip.Addr]localPodOf
	localOf *policy.Pod
	lost    atomic.Uint64
}

// clusterIndex is the cluster's pods by address, as read at built.
type clusterIndex struct {
	pods  map[netip.Addr]Endpoint
	built time.Time
}

// Logged is what a fingerprint in a pod chain's log prefix stands for
// (datapath/policy Enforcer.Logged).
type Logged func(id string, ingress bool, fp string) (policy.Logged, bool)

// NewRecorder records into store for node.
func NewRecorder(store *Store, node string, rules func() policy.Ruleset, logged Logged, pods func() []*corev1.Pod) *Recorder {
	r := &Recorder{store: store, node: node, rules: rules, logged: logged, pods: pods, reindex: time.Second}
	r.stale.Store(true)
	return r
}

// PodsChanged says the cluster's pods may have changed: a record a second
// after the last reading of them or later reads them again.
func (r *Recorder) PodsChanged() { r.stale.Store(true) }

// Lost is how many logged packets were lost before they became records.
func (r *Recorder) Lost() uint64 { return r.lost.Load() }

// Run reads the policy table's log group (datapath/flows) until ctx ends.
func (r *Recorder) Run(ctx context.Context, group uint16) error {
	rd, err := dpflows.Open(group)
	if err != nil {
		return err
	}
	return rd.Run(ctx, r.Packet, func(n int) { r.lost.Add(uint64(n)) })
}

// Packet records one packet the policy table logged.
func (r *Recorder) Packet(p dpflows.Packet) {
	rec := Record{Time: p.Time, Node: r.node, Event: EventPolicy, Proto: p.Proto, Path: "slow",
		Direction: "egress", Src: Endpoint{Kind: KindIP, Addr: p.Src}, Dst: Endpoint{Kind: KindIP, Addr: p.Dst}}
	local, remote := &rec.Src, &rec.Dst
	if p.Ingress {
		rec.Direction, local, remote = "ingress", &rec.Dst, &rec.Src
	}
	if p.Verdict == dpflows.VerdictDropped {
		r.dropped(&rec, p, local)
	} else {
		r.judged(&rec, p, local, remote.Addr.Addr())
	}
	if e, ok := r.clusterPod(remote.Addr.Addr()); ok {
		e.Addr = remote.Addr
		*remote = e
	}
	r.store.Add(rec)
}

// judged fills in the record of a pod chain's verdict: the local pod, and
// the rules its chain enforced (D, A) or audited (W, U), which the
// prefix's fingerprint names (in a D prefix without one, of an agent
// before them, the rules now).
func (r *Recorder) judged(rec *Record, p dpflows.Packet, local *Endpoint, peer netip.Addr) {
	rec.Verdict, rec.Audit = chainVerdicts[p.Verdict], chainAudits[p.Verdict]
	verdict := verdictWords[p.Verdict]
	var l policy.Logged
	logged := false
	if p.Fingerprint != "" {
		l, logged = r.logged(p.PodID, p.Ingress, p.Fingerprint)
	}
	if !logged {
		l.Pod, l.Direction, _ = r.enforcedNow(p.PodID, p.Ingress)
	}
	if l.Pod != "" {
		r.setPod(local, l.Pod)
	}
	d := l.Direction
	switch {
	case l.Pod == "":
		rec.Reason = verdict + " of a pod this agent's rules do not hold (new, or gone)"
	case p.Fingerprint != "" && !logged:
		rec.Reason = fmt.Sprintf("%s by %s rules this agent no longer holds (fingerprint %s)", verdict, rec.Direction, p.Fingerprint)
	case d == nil:
		rec.Reason = fmt.Sprintf("%s: %s was %s isolated then, and is not now", verdict, *local, rec.Direction)
	case p.Verdict == dpflows.VerdictAllowed, p.Verdict == dpflows.VerdictDenied:
		dec := Judge(d, rec.Direction, peer, policy.Proto(p.Proto), p.Dst.Port(), "this")
		rec.Policies = dec.Policies
		if dec.Allowed != (p.Verdict == dpflows.VerdictAllowed) {
			rec.Reason = fmt.Sprintf("%s, yet as the agent read the %s rules: %s", rec.Verdict, rec.Direction, dec.Reason)
			break
		}
		rec.Tier, rec.Rule, rec.RuleName, rec.Reason = dec.Tier, dec.Rule, dec.Name, dec.Reason
	case p.Verdict == dpflows.VerdictWouldDeny:
		rec.Policies = d.Policies
		rec.Reason = fmt.Sprintf("audit would deny: %s audited by %s, no enforcing policy isolates it, and no rule of the audited ones allows this; not enforced",
			rec.Direction, strings.Join(d.Policies, ", "))
		// The table logs W only where no rule of any tier judges the
		// direction: one that is tiered now was logged before.
		if _, now, ok := r.enforcedNow(p.PodID, p.Ingress); ok && now != nil && now.Tiered() {
			dec := Judge(now, rec.Direction, peer, policy.Proto(p.Proto), p.Dst.Port(), "this")
			rec.Reason += fmt.Sprintf(" (logged before ClusterNetworkPolicy rules applied to the %s, where audit reports no would-deny; as they judge it now: %s)", rec.Direction, dec.Reason)
		}
	case p.Verdict == dpflows.VerdictWouldAllow:
		var enforcing *policy.Direction // nil: not held, or an agent before the prefix named it
		if e, ok := r.logged(p.PodID, p.Ingress, p.EnforcingFingerprint); ok && p.EnforcingFingerprint != "" {
			enforcing = e.Direction
		}
		r.wouldAllow(rec, enforcing, d, peer, p)
	}
}

// wouldAllow fills in the reason of a U record: the enforcing rules'
// decision, and the audited policies that would allow the packet.
func (r *Recorder) wouldAllow(rec *Record, enforcing, audited *policy.Direction, peer netip.Addr, p dpflows.Packet) {
	if enforcing == nil {
		rec.Reason = fmt.Sprintf("default deny by %s rules this agent no longer holds", rec.Direction)
	} else {
		dec := Judge(enforcing, rec.Direction, peer, policy.Proto(p.Proto), p.Dst.Port(), "this")
		rec.Policies, rec.Reason = dec.Policies, dec.Reason
		if dec.Allowed {
			rec.Reason = fmt.Sprintf("%s, yet as the agent read the %s rules: %s", rec.Verdict, rec.Direction, dec.Reason)
		} else {
			rec.Tier, rec.Rule, rec.RuleName = dec.Tier, dec.Rule, dec.Name
		}
	}
	allowing := allowedBy(audited, peer, p.Proto, p.Dst.Port())
	rec.Policies = append(slices.Clone(rec.Policies), allowing...)
	if len(allowing) == 0 {
		rec.Reason += fmt.Sprintf("; yet no rule of the audited %s allows it as the agent read it", strings.Join(audited.Policies, ", "))
	} else {
		rec.Reason += fmt.Sprintf("; audited %s would allow it", strings.Join(allowing, ", "))
	}
}

// chainVerdicts are the records' verdicts of the pod chains': what
// happened to the packet, audited or not (chainAudits).
var chainVerdicts = map[string]string{
	dpflows.VerdictDenied:     VerdictDenied,
	dpflows.VerdictAllowed:    VerdictAllowed,
	dpflows.VerdictWouldDeny:  VerdictAllowed,
	dpflows.VerdictWouldAllow: VerdictDenied,
}

// chainAudits are the records' audits of the pod chains' verdicts.
var chainAudits = map[string]string{
	dpflows.VerdictWouldDeny:  AuditWouldDeny,
	dpflows.VerdictWouldAllow: AuditWouldAllow,
}

// verdictWords start the reasons of the pod chains' verdicts.
var verdictWords = map[string]string{
	dpflows.VerdictDenied:     "default deny",
	dpflows.VerdictAllowed:    "allowed",
	dpflows.VerdictWouldDeny:  "audit would deny (not enforced)",
	dpflows.VerdictWouldAllow: "default deny, audit would allow",
}

// allowedBy is the policies of the audited direction d with a rule
// allowing peer on proto/port, each once.
func allowedBy(d *policy.Direction, peer netip.Addr, proto uint8, port uint16) []string {
	var out []string
	for _, rule := range d.Rules {
		if rule.Allows(peer, policy.Proto(proto), port) && !slices.Contains(out, rule.Policy) {
			out = append(out, rule.Policy)
		}
	}
	return out
}

// dropped fills in the record of a base chain's drop: the local pod by
// its veth.
func (r *Recorder) dropped(rec *Record, p dpflows.Packet, local *Endpoint) {
	rec.Event, rec.Verdict, rec.Cause = EventDrop, VerdictDropped, p.Why
	pod := "the pod behind " + p.Iface
	if p.Iface == "" {
		pod = "a pod whose veth is gone"
	}
	if lp, ok := r.podByIface(p.Iface); ok {
		r.setPod(local, lp.Key)
		pod = lp.ns + "/" + lp.name
	}
	switch {
	case p.Why == dpflows.DropSpoof:
		rec.Reason = fmt.Sprintf("spoofed source: %s is not the address of %s", p.Src.Addr(), pod)
	case p.Why == dpflows.DropInvalid:
		rec.Reason = "conntrack state invalid: the packet belongs to no connection conntrack can follow"
	case p.Ingress:
		rec.Reason = "a new TCP connection without a SYN, to an isolated pod"
	default:
		rec.Reason = "a new TCP connection without a SYN, from an isolated pod"
	}
}

// setPod makes e the local pod with key.
func (r *Recorder) setPod(e *Endpoint, key string) {
	e.Kind, e.Node = KindPod, r.node
	e.Namespace, e.Name = splitKey(key)
}

// splitKey is the namespace and name of a pod key: a pod's other
// attachments have "ns/name (container/ifname)" keys.
func splitKey(key string) (ns, name string) {
	key, _, _ = strings.Cut(key, " ")
	ns, name, _ = strings.Cut(key, "/")
	return ns, name
}

// localPodOf is a local pod as the rules know it.
type localPodOf struct {
	policy.Pod
	ns, name string
}

// enforcedNow is the pod of chain id and its enforcing direction (ingress
// or egress) among the rules as last enforced.
func (r *Recorder) enforcedNow(id string, ingress bool) (pod string, d *policy.Direction, ok bool) {
	lp, ok := r.localPod(id)
	if !ok {
		return "", nil, false
	}
	if ingress {
		return lp.Key, lp.Ingress, true
	}
	return lp.Key, lp.Egress, true
}

// localPod finds the pod of chain id among the rules as last enforced.
func (r *Recorder) localPod(id string) (localPodOf, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.indexLocal()
	p, ok := r.local[id]
	return p, ok
}

// podByIface finds the pod with host-side veth iface among the rules as
// last enforced.
func (r *Recorder) podByIface(iface string) (localPodOf, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.indexLocal()
	p, ok := r.byIface[iface]
	return p, ok
}

// indexLocal indexes the local pods, hashing their keys only when the
// rules changed (r.mu held).
func (r *Recorder) indexLocal() {
	pods := r.rules().Pods
	if first := unsafe.SliceData(pods); r.local != nil && first == r.localOf && len(pods) == len(r.local) {
		return
	}
	r.local, r.byIface, r.byAddr = make(map[string]localPodOf, len(pods)), make(map[string]localPodOf, len(pods)), make(map[netip.Addr]localPodOf, len(pods))
	r.localOf = unsafe.SliceData(pods)
	for _, p := range pods {
		ns, name := splitKey(p.Key)
		lp := localPodOf{Pod: p, ns: ns, name: name}
		r.local[policy.PodID(p.Key)], r.byIface[p.Iface] = lp, lp
		for _, ip := range p.IPs {
			r.byAddr[ip] = lp
		}
	}
}

// clusterPod finds the pod with address ip: this node's, among the rules
// as last enforced, before the cluster's (an address a pod of this node
// took may still be another node's terminating pod's, as the API has it).
func (r *Recorder) clusterPod(ip netip.Addr) (Endpoint, bool) {
	r.mu.Lock()
	r.indexLocal()
	lp, ok := r.byAddr[ip]
	r.mu.Unlock()
	if ok {
		return Endpoint{Kind: KindPod, Namespace: lp.ns, Name: lp.name, Node: r.node}, true
	}
	idx := r.cluster.Load()
	if r.stale.Load() && (idx == nil || time.Since(idx.built) >= r.reindex) && r.indexing.TryLock() {
		r.stale.Store(false) // before the read: a change during it reads again
		idx = indexPods(r.pods())
		r.cluster.Store(idx)
		r.indexing.Unlock()
	}
	if idx == nil {
		return Endpoint{}, false
	}
	e, ok := idx.pods[ip]
	return e, ok
}

// indexPods indexes pods by the addresses NetworkPolicy sees them at
// (agentpolicy.PodAddrs). Of two pods at one address (a terminating pod's,
// taken again), the one not terminating wins, else the newer.
func indexPods(pods []*corev1.Pod) *clusterIndex {
	idx := &clusterIndex{pods: map[netip.Addr]Endpoint{}, built: time.Now()}
	for ip, p := range agentpolicy.PodsByAddr(pods) {
		idx.pods[ip] = Endpoint{Kind: KindPod, Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName}
	}
	return idx
}
