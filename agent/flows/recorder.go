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

	dpflows "github.com/onc-net/onc/datapath/flows"
	"github.com/onc-net/onc/datapath/policy"
)

// Recorder turns what the policy table logs into records: the local pod
// by its chain's id among the rules as last enforced, the policies that
// isolate it, and the other end among the cluster's pods.
type Recorder struct {
	store *Store
	node  string
	rules func() policy.Ruleset // this node's pods, as last enforced
	pods  func() []*corev1.Pod  // the cluster's, as the policy informers hold them

	mu sync.Mutex
	// index is the cluster's pods by address, built at indexed and read
	// again, at most once a second, once they changed (stale).
	index   map[netip.Addr]Endpoint
	indexed time.Time
	stale   bool
	reindex time.Duration // at most this often
	// local is the local pods by chain id, for the rules whose pod list
	// localOf is.
	local   map[string]localPodOf
	localOf *policy.Pod
	lost    atomic.Uint64
}

// NewRecorder records into store for node.
func NewRecorder(store *Store, node string, rules func() policy.Ruleset, pods func() []*corev1.Pod) *Recorder {
	return &Recorder{store: store, node: node, rules: rules, pods: pods, stale: true, reindex: time.Second}
}

// PodsChanged says the cluster's pods may have changed: a record a second
// after the last reading of them or later reads them again.
func (r *Recorder) PodsChanged() {
	r.mu.Lock()
	r.stale = true
	r.mu.Unlock()
}

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

// Packet records one packet a pod's chain logged.
func (r *Recorder) Packet(p dpflows.Packet) {
	rec := Record{Time: p.Time, Node: r.node, Event: EventPolicy, Verdict: verdicts[p.Verdict], Proto: p.Proto, Path: "slow",
		Direction: "egress", Src: Endpoint{Kind: KindIP, Addr: p.Src}, Dst: Endpoint{Kind: KindIP, Addr: p.Dst}}
	local, remote := &rec.Src, &rec.Dst
	if p.Ingress {
		rec.Direction, local, remote = "ingress", &rec.Dst, &rec.Src
	}
	pod, found := r.localPod(p.PodID)
	if found {
		local.Kind, local.Namespace, local.Name, local.Node = KindPod, pod.ns, pod.name, r.node
	}
	if e, ok := r.clusterPod(remote.Addr.Addr()); ok {
		e.Addr = remote.Addr
		*remote = e
	}
	if !found {
		rec.Reason = "default deny of a pod this agent's rules do not hold (new, or gone)"
		if p.Verdict == dpflows.VerdictWouldDeny {
			rec.Reason = "audit would deny, at a pod this agent's rules do not hold (new, or gone); not enforced"
		}
		r.store.Add(rec)
		return
	}
	enforced, audited := pod.Egress, pod.AuditEgress
	if p.Ingress {
		enforced, audited = pod.Ingress, pod.AuditIngress
	}
	if p.Verdict == dpflows.VerdictWouldDeny {
		rec.Policies, rec.Reason = wouldDeny(rec.Direction, *local, audited)
	} else {
		rec.Policies, rec.Reason = defaultDeny(rec.Direction, *local, enforced)
	}
	if p.Verdict == dpflows.VerdictWouldAllow {
		allowing := allowedBy(audited, remote.Addr.Addr(), p.Proto, rec.Dst.Addr.Port())
		rec.Policies = append(slices.Clone(rec.Policies), allowing...)
		if len(allowing) > 0 {
			rec.Reason += fmt.Sprintf("; audited %s would allow it", strings.Join(allowing, ", "))
		} else {
			rec.Reason += "; an audited policy would have allowed it then, and none does now"
		}
	}
	r.store.Add(rec)
}

// verdicts are the records' verdicts of the policy table's.
var verdicts = map[string]string{
	dpflows.VerdictDenied:     VerdictDenied,
	dpflows.VerdictWouldDeny:  VerdictWouldDeny,
	dpflows.VerdictWouldAllow: VerdictWouldAllow,
}

// defaultDeny is why the enforcing policies d of local's direction
// dropped a packet, and the policies that says.
func defaultDeny(direction string, local Endpoint, d *policy.Direction) ([]string, string) {
	if d == nil {
		return nil, fmt.Sprintf("default deny: %s was %s isolated then, and is not now", local, direction)
	}
	return d.Policies, fmt.Sprintf("default deny: %s isolated by %s, and no rule of theirs allows this", direction, strings.Join(d.Policies, ", "))
}

// wouldDeny is why the audited policies d of local's direction would
// have dropped a packet they let through, and the policies that says.
func wouldDeny(direction string, local Endpoint, d *policy.Direction) ([]string, string) {
	if d == nil {
		return nil, fmt.Sprintf("audit would deny: %s was %s audited then, and is not now; not enforced", local, direction)
	}
	return d.Policies, fmt.Sprintf("audit would deny: %s audited by %s, no enforcing policy isolates it, and no rule of the audited ones allows this; not enforced",
		direction, strings.Join(d.Policies, ", "))
}

// allowedBy is the policies of the audited direction d (nil: none) with
// a rule allowing peer on proto/port, each once.
func allowedBy(d *policy.Direction, peer netip.Addr, proto uint8, port uint16) []string {
	if d == nil {
		return nil
	}
	var out []string
	for _, rule := range d.Rules {
		if rule.Allows(peer, policy.Proto(proto), port) && !slices.Contains(out, rule.Policy) {
			out = append(out, rule.Policy)
		}
	}
	return out
}

// localPodOf is a local pod as the rules know it.
type localPodOf struct {
	policy.Pod
	ns, name string
}

// localPod finds the pod of chain id among the rules as last enforced,
// hashing their keys only when the rules changed.
func (r *Recorder) localPod(id string) (localPodOf, bool) {
	pods := r.rules().Pods
	r.mu.Lock()
	defer r.mu.Unlock()
	if first := unsafe.SliceData(pods); r.local == nil || first != r.localOf || len(pods) != len(r.local) {
		r.local, r.localOf = make(map[string]localPodOf, len(pods)), first
		for _, p := range pods {
			// A pod's other attachments have "ns/name (container/ifname)" keys.
			key, _, _ := strings.Cut(p.Key, " ")
			ns, name, _ := strings.Cut(key, "/")
			r.local[policy.PodID(p.Key)] = localPodOf{Pod: p, ns: ns, name: name}
		}
	}
	p, ok := r.local[id]
	return p, ok
}

// clusterPod finds the pod of the cluster with address ip.
func (r *Recorder) clusterPod(ip netip.Addr) (Endpoint, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stale && time.Since(r.indexed) >= r.reindex {
		r.index, r.indexed, r.stale = map[netip.Addr]Endpoint{}, time.Now(), false
		for _, p := range r.pods() {
			if p.Spec.HostNetwork || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
				continue // a host-network pod's address is its node's
			}
			for _, a := range p.Status.PodIPs {
				if ip, err := netip.ParseAddr(a.IP); err == nil {
					r.index[ip] = Endpoint{Kind: KindPod, Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName}
				}
			}
		}
	}
	e, ok := r.index[ip]
	return e, ok
}
