package agent

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/onc-net/onc/agent/ipam"
	"github.com/onc-net/onc/agent/policy"
	dppolicy "github.com/onc-net/onc/datapath/policy"
)

// PolicyInputs are the Kubernetes objects NetworkPolicy is about
// (*policy.Inputs: informers on pods, namespaces and policies).
type PolicyInputs interface {
	Snapshot() policy.Snapshot
	// OnChange registers fn, called after any of them changes.
	OnChange(fn func())
	// HasPod reports whether the pod is in the inputs yet.
	HasPod(namespace, name string) bool
}

// policyNeedsKubernetes is what the agent says about policy on etcd.
const policyNeedsKubernetes = "not enforced: NetworkPolicy needs the Kubernetes datastore (--datastore=kubernetes)"

// policyWatcher keeps the kernel enforcing the NetworkPolicies of this
// node's pods. Its input is level-triggered like every watcher's: an
// informer event or a pod attached or detached here only signals, and each
// reconcile compiles the whole ruleset from the informers' caches; the
// datapath writes only what changed.
type policyWatcher struct {
	a      *Agent
	inputs PolicyInputs
	*informed

	mu    sync.Mutex
	rules dppolicy.Ruleset // as last enforced
}

func newPolicyWatcher(a *Agent, in PolicyInputs) *policyWatcher {
	p := &policyWatcher{a: a, inputs: in}
	p.informed = newInformed("policy", a.cfg.Resync, p.reconcile)
	in.OnChange(p.signal)
	return p
}

// policyWait bounds how long CNI ADD waits for the new pod's rules (a
// variable for the tests).
var policyWait = 10 * time.Second

// errPolicyPending: a new pod's rules could not be enforced in time.
var errPolicyPending = errors.New("network policy not enforced")

// await waits until the pod namespace/name is in the inputs (its labels
// decide which policies select it) and a reconcile that read the state
// after that has been enforced: CNI ADD calls it so that a pod some policy
// isolates never starts unprotected.
func (p *policyWatcher) await(ctx context.Context, namespace, name string) error {
	ctx, cancel := context.WithTimeout(ctx, policyWait)
	defer cancel()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !p.inputs.HasPod(namespace, name) {
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: pod %s/%s not in the API after %v", errPolicyPending, namespace, name, policyWait)
		case <-tick.C:
		}
	}
	if err := p.w.await(ctx, p.signal); err != nil {
		return fmt.Errorf("%w after %v: %w", errPolicyPending, policyWait, err)
	}
	return nil
}

func (p *policyWatcher) reconcile(ctx context.Context, full bool) error {
	pool, _ := p.a.readyPool()
	if pool == nil {
		return nil // no pods before the node is up; bringUp signals
	}
	// A pod's first attachment is compiled; any other (a second interface,
	// or a new sandbox while the old one's DEL is pending) gets the same
	// rules under its own key, so that every interface of the pod is
	// policed.
	var local []policy.LocalPod
	var extra []ipam.Attachment
	seen := make(map[string]bool)
	for _, att := range pool.List() {
		key := att.K8sNamespace + "/" + att.K8sName
		switch {
		case att.K8sName == "":
			continue // not a Kubernetes pod
		case seen[key]:
			extra = append(extra, att)
			continue
		}
		seen[key] = true
		local = append(local, policy.LocalPod{Namespace: att.K8sNamespace, Name: att.K8sName, Iface: att.HostIface, IP: att.IP})
	}
	rs := policy.Compile(p.inputs.Snapshot(), local)
	for _, att := range extra {
		pod := *rs.Pod(att.K8sNamespace + "/" + att.K8sName)
		pod.Key = fmt.Sprintf("%s (%s/%s)", pod.Key, att.ContainerID[:min(12, len(att.ContainerID))], att.IfName)
		pod.Iface, pod.IP = att.HostIface, att.IP
		rs.Pods = append(rs.Pods, pod)
	}
	slices.SortFunc(rs.Pods, func(a, b dppolicy.Pod) int { return cmp.Compare(a.Key, b.Key) })
	ch, err := p.a.dp.EnforcePolicy(rs, full)
	if err != nil {
		return err
	}
	if len(ch.Pods) > 0 {
		slog.Info("network policy enforced", "podsChanged", len(ch.Pods), "connectionsEnded", ch.Ended)
	}
	p.mu.Lock()
	p.rules = rs
	p.mu.Unlock()
	return nil
}

// enforced is the ruleset as last enforced.
func (p *policyWatcher) enforced() dppolicy.Ruleset {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rules
}
