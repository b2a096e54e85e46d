package policy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/agent/watch"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/policy"
	"github.com/onc-net/onc/internal/netaddr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// NeedsKubernetes is what the agent says about policy on etcd.
const NeedsKubernetes = "not enforced: NetworkPolicy needs the Kubernetes datastore (--datastore=kubernetes)"

// Datapath is what the policy watcher needs of the kernel;
// *datapath/policy.Node implements it.
type Datapath interface {
	// Enforce makes the kernel enforce rs, ending the connections and
	// cached verdicts it no longer allows before it returns; checkKernel
	// rewrites every rule, repairing drift.
	Enforce(rs policy.Ruleset, checkKernel bool) (policy.Change, error)
	// Counters are each local pod's allowed and denied connections, and
	// the drops of the checks before any pod's rules.
	Counters() (policy.Counts, error)
	// Logged is what a fingerprint in the policy table's log prefixes
	// stands for, for flow records (datapath/policy Enforcer.Logged).
	Logged(id string, ingress bool, fp string) (policy.Logged, bool)
}

// Sources are the Kubernetes objects NetworkPolicy is about (*Inputs:
// informers on pods, namespaces and policies).
type Sources interface {
	Snapshot() Snapshot
	// OnChange registers fn, called after any of them changes.
	OnChange(fn func())
	// HasPod reports whether the pod is in the inputs yet.
	HasPod(namespace, name string) bool
}

// Watcher keeps the kernel enforcing the NetworkPolicies of this node's
// pods. Its input is level-triggered like every watcher's: an informer
// event or a pod attached or detached here only signals, and each
// reconcile compiles the ruleset from the informers' caches, recompiling
// only what changed since the last (Incremental); the datapath writes only
// what changed.
type Watcher struct {
	*watch.Informed
	dp     Datapath
	inputs Sources
	pods   func() []ipam.Attachment // this node's; nil until it is up

	mu    sync.Mutex
	rules policy.Ruleset // as last enforced

	// compiler keeps the last compile's state, so that a reconcile
	// recompiles only what changed since (only reconcile uses it).
	compiler Incremental
}

// NewWatcher is the policy watcher; pods lists the node's attachments, nil
// before the node is up.
func NewWatcher(dp Datapath, in Sources, pods func() []ipam.Attachment, resync time.Duration) *Watcher {
	w := &Watcher{dp: dp, inputs: in, pods: pods}
	w.Informed = watch.NewInformed("policy", resync, w.reconcile)
	in.OnChange(w.Signal)
	return w
}

// Wait bounds how long CNI ADD waits for the new pod's rules (a variable
// for the tests).
var Wait = 10 * time.Second

// ErrPending: a new pod's rules could not be enforced in time.
var ErrPending = errors.New("network policy not enforced")

// AwaitPod waits until the pod namespace/name is in the inputs (its labels
// decide which policies select it) and a reconcile that read the state
// after that has been enforced: CNI ADD calls it so that a pod some policy
// isolates never starts unprotected.
func (w *Watcher) AwaitPod(ctx context.Context, namespace, name string) error {
	ctx, cancel := context.WithTimeout(ctx, Wait)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !w.inputs.HasPod(namespace, name) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: pod %s/%s not in the API after %v", ErrPending, namespace, name, Wait)
		case <-tick.C:
		}
	}
	if err := w.Await(ctx); err != nil {
		return fmt.Errorf("%w after %v: %w", ErrPending, Wait, err)
	}
	return nil
}

func (w *Watcher) reconcile(ctx context.Context, full bool) error {
	atts := w.pods()
	if atts == nil {
		return nil // no pods before the node is up; the agent signals then
	}
	// A pod's first attachment is compiled; any other (a second interface,
	// or a new sandbox while the old one's DEL is pending) gets the same
	// rules under its own key, so that every interface of the pod is
	// policed.
	var local []LocalPod
	var extra []ipam.Attachment
	seen := make(map[string]bool)
	for _, att := range atts {
		key := att.K8sNamespace + "/" + att.K8sName
		switch {
		case att.K8sName == "":
			continue // not a Kubernetes pod
		case seen[key]:
			extra = append(extra, att)
			continue
		}
		seen[key] = true
		local = append(local, LocalPod{Namespace: att.K8sNamespace, Name: att.K8sName, Iface: att.HostIface, IPs: att.IPs})
	}
	rs := w.compiler.Compile(w.inputs.Snapshot(), local)
	for _, att := range extra {
		pod := *rs.Pod(att.K8sNamespace + "/" + att.K8sName)
		pod.Key = fmt.Sprintf("%s (%s/%s)", pod.Key, att.ContainerID[:min(12, len(att.ContainerID))], att.IfName)
		pod.Iface, pod.IPs = att.HostIface, att.IPs
		rs.Pods = append(rs.Pods, pod)
	}
	sortPods(rs.Pods)
	ch, err := w.dp.Enforce(rs, full)
	if err != nil {
		return err
	}
	if len(ch.Pods) > 0 {
		slog.Info("network policy enforced", "podsChanged", len(ch.Pods), "connectionsEnded", ch.Ended)
	}
	w.mu.Lock()
	w.rules = rs
	w.mu.Unlock()
	return nil
}

// Enforced is the ruleset as last enforced.
func (w *Watcher) Enforced() policy.Ruleset {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.rules
}

// List answers onctl policy: every local pod's isolation, rules and
// counters, or the one pod req names (namespace/name, or name if unique).
func (w *Watcher) List(req *apiv1.ListPolicyRequest) (*apiv1.ListPolicyResponse, error) {
	ws := w.Loop().Status()
	resp := &apiv1.ListPolicyResponse{Seen: ws.Seen, Applied: ws.Applied, LastError: ws.LastError}
	rs := w.Enforced()
	counters, err := w.dp.Counters()
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read the policy counters: %v", err)
	}
	for _, pod := range rs.Pods {
		if req.Pod != "" && pod.Key != req.Pod && !strings.HasSuffix(pod.Key, "/"+req.Pod) {
			continue
		}
		c := counters.Pods[pod.Key]
		ingress := direction(pod.Ingress, pod.AuditIngress)
		ingress.Allowed, ingress.Denied, ingress.WouldDeny, ingress.WouldAllow = c.IngressAllowed, c.IngressDenied, c.IngressWouldDeny, c.IngressWouldAllow
		egress := direction(pod.Egress, pod.AuditEgress)
		egress.Allowed, egress.Denied, egress.WouldDeny, egress.WouldAllow = c.EgressAllowed, c.EgressDenied, c.EgressWouldDeny, c.EgressWouldAllow
		resp.Pods = append(resp.Pods, &apiv1.PolicyPod{Key: pod.Key, Ip: netaddr.First(pod.IPs), Ips: netaddr.Strings(pod.IPs), HostIface: pod.Iface,
			Ingress: ingress, Egress: egress})
	}
	switch {
	case req.Pod != "" && len(resp.Pods) == 0:
		return nil, status.Errorf(codes.NotFound, "no pod %q on this node (onctl pods lists them)", req.Pod)
	case req.Pod != "" && len(resp.Pods) > 1:
		return nil, status.Errorf(codes.InvalidArgument, "%d pods are named %q here; give namespace/name", len(resp.Pods), req.Pod)
	}
	return resp, nil
}

// direction is a pod's direction as the enforcing policies d and the
// audited ones audit have it, without its counters: the
// ClusterNetworkPolicy rules of each tier, and the NetworkPolicies if
// they isolate it.
func direction(d, audit *policy.Direction) *apiv1.PolicyDirection {
	out := &apiv1.PolicyDirection{}
	if d != nil {
		if !d.ClusterOnly {
			out.Isolated, out.Policies, out.Rules = true, d.Policies, rules(d)
		}
		for _, tier := range []struct {
			rules []policy.TierRule
			out   *[]*apiv1.PolicyRule
		}{{d.Admin, &out.Admin}, {d.Baseline, &out.Baseline}} {
			for _, r := range tier.rules {
				pr := rule(r.Policy, r.Index, r.Peers, r.Ports)
				pr.Priority, pr.Name, pr.Action = r.Priority, r.Name, r.Action.String()
				*tier.out = append(*tier.out, pr)
			}
		}
	}
	if audit != nil {
		out.AuditPolicies, out.AuditRules = audit.Policies, rules(audit)
	}
	return out
}

func rules(d *policy.Direction) []*apiv1.PolicyRule {
	var out []*apiv1.PolicyRule
	for _, r := range d.Rules {
		out = append(out, rule(r.Policy, r.Index, r.Peers, r.Ports))
	}
	return out
}

// rule is a rule's peers and ports, of a NetworkPolicy or a tier.
func rule(name string, index int, peers []netip.Prefix, ports []policy.PortRange) *apiv1.PolicyRule {
	pr := &apiv1.PolicyRule{Policy: name, Index: int32(index), NoPort: ports != nil && len(ports) == 0}
	for _, peer := range peers {
		pr.Peers = append(pr.Peers, peer.String())
	}
	for _, port := range ports {
		pr.Ports = append(pr.Ports, port.String())
	}
	return pr
}
