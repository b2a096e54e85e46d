package agent

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/onc-net/onc/agent/policy"
	apiv1 "github.com/onc-net/onc/api/v1"
	dppolicy "github.com/onc-net/onc/datapath/policy"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeInputs stands in for the informers: a snapshot the test sets.
type fakeInputs struct {
	mu       sync.Mutex
	snap     policy.Snapshot
	onChange func()
}

func (f *fakeInputs) Snapshot() policy.Snapshot {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.snap
}

func (f *fakeInputs) OnChange(fn func()) { f.onChange = fn }

func (f *fakeInputs) HasPod(namespace, name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.snap.Pods {
		if p.Namespace == namespace && p.Name == name {
			return true
		}
	}
	return false
}

// denyIngressTo is a snapshot whose one policy denies all ingress to the
// default namespace's pods labelled app=db; the pods are the test's.
func denyIngressTo(pods ...string) policy.Snapshot {
	s := policy.Snapshot{
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "default"}}},
		Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "deny-db"},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}},
	}
	for _, name := range pods {
		s.Pods = append(s.Pods, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, Labels: map[string]string{"app": "db"}}})
	}
	return s
}

// newPolicyAgent is a ready agent with policy inputs and its policy
// watcher running.
func newPolicyAgent(t *testing.T, snap policy.Snapshot) (*testAgent, *fakeInputs) {
	in := &fakeInputs{snap: snap}
	ta := newTestAgent(t, func(c *Config) { c.Policy = in })
	ta.bringUp(t, "10.244.7.0/24")
	run, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { ta.policy.Run(run); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	return ta, in
}

// fakePolicy is the kernel's policy enforcement: the ruleset last
// enforced, or the error the test makes it fail with.
type fakePolicy struct {
	mu     sync.Mutex
	rules  dppolicy.Ruleset
	fail   error
	counts dppolicy.Counts // what Counters returns
}

func (f *fakePolicy) Enforce(rs dppolicy.Ruleset, checkKernel bool) (dppolicy.Change, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return dppolicy.Change{}, f.fail
	}
	f.rules = rs
	return dppolicy.Change{}, nil
}

func (f *fakePolicy) Logged(string, bool, string) (dppolicy.Logged, bool) {
	return dppolicy.Logged{}, false
}

func (f *fakePolicy) Counters() (dppolicy.Counts, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.counts, nil
}

func (f *fakePolicy) setFail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fail = err
}

func (f *fakePolicy) enforced(key string) (isolatedIngress, present bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.rules.Pod(key)
	return p != nil && p.Ingress != nil, p != nil
}

func TestAddReturnsOnlyOnceThePodsPolicyIsEnforced(t *testing.T) {
	ta, _ := newPolicyAgent(t, denyIngressTo("c1"))
	ta.mustAdd(t, "c1", "/ns/1")
	// No waiting: ADD itself waited for the policy watcher.
	if isolated, present := ta.policyDP.enforced("default/c1"); !present || !isolated {
		t.Fatalf("after ADD the datapath has pod default/c1 present=%v isolated=%v; want its deny-all enforced", present, isolated)
	}

	resp, err := ta.ctl.ListPolicy(ctx(t), &apiv1.ListPolicyRequest{Pod: "c1"})
	if err != nil {
		t.Fatal(err)
	}
	in := resp.Pods[0].Ingress
	if resp.Pods[0].Key != "default/c1" || !in.Isolated || len(in.Policies) != 1 || in.Policies[0] != "default/deny-db" || resp.Pods[0].Egress.Isolated {
		t.Errorf("onctl policy c1: %v", resp.Pods[0])
	}
	if resp.Applied < 1 || resp.Applied != resp.Seen {
		t.Errorf("generation applied %d of %d after ADD returned", resp.Applied, resp.Seen)
	}
	if _, err := ta.ctl.ListPolicy(ctx(t), &apiv1.ListPolicyRequest{Pod: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("onctl policy of an unknown pod: %v, want NotFound", err)
	}

	// DEL takes the pod's rules away.
	if r, err := ta.cni.Del(ctx(t), req("c1", ta.netns("/ns/1"))); code(t, r, err) != 0 {
		t.Fatalf("DEL: %v", r.Error)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, present := ta.policyDP.enforced("default/c1"); present; _, present = ta.policyDP.enforced("default/c1") {
		if time.Now().After(deadline) {
			t.Fatal("the deleted pod's rules are still enforced")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAddFailsAndRollsBackWhenPolicyCannotBeEnforced(t *testing.T) {
	defer func(d time.Duration) { policy.Wait = d }(policy.Wait)
	policy.Wait = 300 * time.Millisecond
	ta, _ := newPolicyAgent(t, denyIngressTo("c1"))
	ta.policyDP.setFail(errors.New("nft: no such table"))
	for _, pod := range []string{"c1", "not-in-the-api"} {
		r, c := ta.add(t, pod, "/ns/"+pod)
		if c != errTryAgainLater {
			t.Fatalf("ADD %s: code %d (%v), want %d: a pod whose policy is not enforced must not start", pod, c, r.Error, errTryAgainLater)
		}
		if left := ta.leftovers(t, pod); len(left) > 0 {
			t.Fatalf("the failed ADD of %s left %v behind", pod, left)
		}
	}
	ta.policyDP.setFail(nil)
	ta.mustAdd(t, "c1", "/ns/c1")
}

func TestInformerChangesReachTheDatapath(t *testing.T) {
	noPolicy := denyIngressTo("c1")
	noPolicy.Policies = nil
	ta, in := newPolicyAgent(t, noPolicy)
	ta.mustAdd(t, "c1", "/ns/1")
	if isolated, _ := ta.policyDP.enforced("default/c1"); isolated {
		t.Fatal("isolated with no policy")
	}
	in.mu.Lock()
	in.snap = denyIngressTo("c1")
	in.mu.Unlock()
	in.onChange()
	deadline := time.Now().Add(5 * time.Second)
	for isolated, _ := ta.policyDP.enforced("default/c1"); !isolated; isolated, _ = ta.policyDP.enforced("default/c1") {
		if time.Now().After(deadline) {
			t.Fatal("a new policy did not reach the datapath")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestPolicyOnEtcdSaysItNeedsKubernetes(t *testing.T) {
	ta := newTestAgent(t)
	if _, err := ta.ctl.ListPolicy(ctx(t), &apiv1.ListPolicyRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Errorf("onctl policy on etcd: %v, want FailedPrecondition", err)
	}
	st, err := ta.ctl.GetStatus(ctx(t), &apiv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Policy != policy.NeedsKubernetes {
		t.Errorf("status policy %q, want %q", st.Policy, policy.NeedsKubernetes)
	}
}

// A new sandbox of a pod whose old one is not yet deleted is policed too.
func TestEveryAttachmentOfAPodIsPoliced(t *testing.T) {
	ta, _ := newPolicyAgent(t, denyIngressTo("web"))
	for _, container := range []string{"sandbox1", "sandbox2"} {
		r := &apiv1.CNIRequest{ContainerId: container, Netns: ta.netns("/ns/" + container), Ifname: "eth0",
			Args: "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web", Config: []byte(conf)}
		if resp, err := ta.cni.Add(ctx(t), r); code(t, resp, err) != 0 {
			t.Fatalf("ADD %s: %v", container, resp.Error)
		}
	}
	ta.policyDP.mu.Lock()
	defer ta.policyDP.mu.Unlock()
	ifaces := map[string]bool{}
	for _, p := range ta.policyDP.rules.Pods {
		if p.Ingress == nil {
			t.Errorf("%s (%s) is not isolated", p.Key, p.Iface)
		}
		ifaces[p.Iface] = true
	}
	if len(ifaces) != 2 {
		t.Fatalf("enforced pods %v: want both sandboxes' interfaces", ta.policyDP.rules.Pods)
	}
}
