package policy

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onc-net/onc/agent/ipam"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/policy"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// fakeDatapath is the kernel's enforcement: the rulesets enforced, in order.
type fakeDatapath struct {
	mu       sync.Mutex
	enforced []policy.Ruleset
	fail     error
}

func (f *fakeDatapath) Enforce(rs policy.Ruleset, _ bool) (policy.Change, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return policy.Change{}, f.fail
	}
	f.enforced = append(f.enforced, rs)
	return policy.Change{}, nil
}

func (f *fakeDatapath) Logged(string, bool, string) (policy.Logged, bool) {
	return policy.Logged{}, false
}

func (f *fakeDatapath) Counters() (policy.Counts, error) {
	return policy.Counts{Pods: map[string]policy.Counters{"db/db-0": {IngressDenied: 3, IngressWouldDeny: 17, EgressWouldAllow: 2}}}, nil
}

// staticSources is a snapshot that never changes.
type staticSources struct{ snap Snapshot }

func (s staticSources) Snapshot() Snapshot { return s.snap }
func (s staticSources) OnChange(func())    {}
func (s staticSources) HasPod(namespace, name string) bool {
	for _, p := range s.snap.Pods {
		if p.Namespace == namespace && p.Name == name {
			return true
		}
	}
	return false
}

// denyAllTo isolates pod db/db-0 for ingress.
var denyAllTo = Snapshot{
	Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "db"}}},
	Pods:       []*corev1.Pod{{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "db-0"}}},
	Policies: []*networkingv1.NetworkPolicy{{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "deny"},
		Spec: networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}},
}

func attachment(container, ifname, ip string) ipam.Attachment {
	return ipam.Attachment{Key: ipam.Key{ContainerID: container, IfName: ifname}, IPs: []netip.Addr{netip.MustParseAddr(ip)},
		HostIface: "onc" + container, K8sNamespace: "db", K8sName: "db-0"}
}

// Before the node is up nothing is enforced; after, every interface of a
// pod gets the pod's rules under its own key, and onctl policy reads
// them with the kernel's counters.
func TestWatcherPolicesEveryAttachment(t *testing.T) {
	dp := &fakeDatapath{}
	var atts []ipam.Attachment // nil: the node is not up
	w := NewWatcher(dp, staticSources{denyAllTo}, func() []ipam.Attachment { return atts }, time.Hour)
	if err := w.reconcile(context.Background(), true); err != nil || len(dp.enforced) != 0 {
		t.Fatalf("before the node is up: %v, %d rulesets enforced; want none", err, len(dp.enforced))
	}
	atts = []ipam.Attachment{attachment("sandbox1", "eth0", "10.244.1.2"), attachment("sandbox2", "eth0", "10.244.1.3")}
	if err := w.reconcile(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	rs := dp.enforced[len(dp.enforced)-1]
	if len(rs.Pods) != 2 {
		t.Fatalf("enforced %v, want both sandboxes' interfaces", rs.Pods)
	}
	for _, p := range rs.Pods {
		if p.Ingress == nil {
			t.Errorf("%s (%s) is not isolated", p.Key, p.Iface)
		}
	}
	resp, err := w.List(&apiv1.ListPolicyRequest{Pod: "db/db-0"})
	if err != nil || len(resp.Pods) != 1 || !resp.Pods[0].Ingress.Isolated || resp.Pods[0].Ingress.Denied != 3 {
		t.Fatalf("onctl policy db/db-0: %v, %v", resp, err)
	}
	if _, err := w.List(&apiv1.ListPolicyRequest{Pod: "web"}); status.Code(err) != codes.NotFound {
		t.Errorf("onctl policy of a pod not here: %v, want NotFound", err)
	}
}

// A pod waits for its rules; when they cannot be enforced, it is told
// so, with the kernel's error.
func TestAwaitPodReportsWhatFailed(t *testing.T) {
	defer func(d time.Duration) { Wait = d }(Wait)
	Wait = 200 * time.Millisecond
	dp := &fakeDatapath{fail: errors.New("nft: no such table")}
	atts := []ipam.Attachment{attachment("sandbox1", "eth0", "10.244.1.2")}
	w := NewWatcher(dp, staticSources{denyAllTo}, func() []ipam.Attachment { return atts }, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	err := w.AwaitPod(context.Background(), "db", "db-0")
	if !errors.Is(err, ErrPending) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "nft: no such table") {
		t.Fatalf("AwaitPod: %v, want ErrPending after the deadline, naming the kernel's error", err)
	}
	dp.mu.Lock()
	dp.fail = nil
	dp.mu.Unlock()
	if err := w.AwaitPod(context.Background(), "db", "db-0"); err != nil {
		t.Fatalf("AwaitPod once the kernel takes the rules: %v", err)
	}
}

// A reconcile recompiles only what changed: a resync of the same informer
// objects and local pods compiles no pod again; an update (informers
// replace an object, never change it) does.
func TestWatcherCompilesOnlyChangedInputs(t *testing.T) {
	dp := &fakeDatapath{}
	atts := []ipam.Attachment{attachment("sandbox1", "eth0", "10.244.1.2")}
	w := NewWatcher(dp, staticSources{denyAllTo}, func() []ipam.Attachment { return atts }, time.Hour)
	ctx := context.Background()
	for _, full := range []bool{false, true} {
		if err := w.reconcile(ctx, full); err != nil {
			t.Fatal(err)
		}
	}
	if len(dp.enforced) != 2 || dp.enforced[1].Pods[0].Ingress == nil {
		t.Fatalf("enforced %+v; want db-0 isolated twice", dp.enforced)
	}
	if dp.enforced[1].Pods[0].Ingress != dp.enforced[0].Pods[0].Ingress {
		t.Error("a resync of unchanged inputs compiled db-0 again")
	}

	// The policy deleted: db-0 no longer isolated.
	w.inputs = staticSources{Snapshot{Namespaces: denyAllTo.Namespaces, Pods: denyAllTo.Pods}}
	if err := w.reconcile(ctx, true); err != nil {
		t.Fatal(err)
	}
	if len(dp.enforced) != 3 || dp.enforced[2].Pods[0].Ingress != nil {
		t.Errorf("after the policy went: enforced %+v; want db-0 not isolated", dp.enforced[len(dp.enforced)-1])
	}
}

// onctl policy shows a pod's audited policies, their rules and what they
// would have done, apart from the enforcing ones.
func TestWatcherListsAudit(t *testing.T) {
	audited := denyAllTo
	np := audited.Policies[0].DeepCopy()
	np.Annotations = map[string]string{ModeAnnotation: "audit"}
	np.Spec.Ingress = []networkingv1.NetworkPolicyIngressRule{{}}
	audited.Policies = []*networkingv1.NetworkPolicy{np}
	dp := &fakeDatapath{}
	atts := []ipam.Attachment{attachment("sandbox1", "eth0", "10.244.1.2")}
	w := NewWatcher(dp, staticSources{audited}, func() []ipam.Attachment { return atts }, time.Hour)
	if err := w.reconcile(context.Background(), false); err != nil {
		t.Fatal(err)
	}
	resp, err := w.List(&apiv1.ListPolicyRequest{Pod: "db/db-0"})
	if err != nil || len(resp.Pods) != 1 {
		t.Fatalf("onctl policy db/db-0: %v, %v", resp, err)
	}
	in, eg := resp.Pods[0].Ingress, resp.Pods[0].Egress
	if in.Isolated || len(in.Policies) != 0 || len(in.Rules) != 0 {
		t.Errorf("ingress: %v, want not isolated: the policy is audited", in)
	}
	if !slices.Equal(in.AuditPolicies, []string{"db/deny"}) || len(in.AuditRules) != 1 || in.AuditRules[0].Policy != "db/deny" ||
		!slices.Equal(in.AuditRules[0].Peers, []string{"0.0.0.0/0", "::/0"}) {
		t.Errorf("ingress audit: %v %v, want db/deny's rule from everyone", in.AuditPolicies, in.AuditRules)
	}
	if in.WouldDeny != 17 || in.WouldAllow != 0 || in.Denied != 3 || eg.WouldAllow != 2 || eg.WouldDeny != 0 || len(eg.AuditPolicies) != 0 {
		t.Errorf("counters: ingress %v, egress %v", in, eg)
	}
}

// onctl policy shows the ClusterNetworkPolicy rules of both tiers with
// their priority, name and action, and a direction no NetworkPolicy
// isolates as not isolated, its tiers' rules shown all the same.
func TestDirectionListsTiers(t *testing.T) {
	admin := policy.TierRule{Policy: "deny-all", Priority: 10, Index: 1, Name: "no-egress", Action: policy.Deny,
		Peers: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, Ports: []policy.PortRange{{Proto: policy.TCP, First: 80, Last: 80}}}
	baseline := policy.TierRule{Policy: "default", Priority: 3, Action: policy.Pass, Peers: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}
	np := policy.Rule{Policy: "ns/web", Peers: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}}
	want := func(r policy.TierRule, ports []string) *apiv1.PolicyRule {
		return &apiv1.PolicyRule{Policy: r.Policy, Index: int32(r.Index), Peers: []string{r.Peers[0].String()}, Ports: ports,
			Priority: r.Priority, Name: r.Name, Action: r.Action.String()}
	}
	isolated := direction(&policy.Direction{Policies: []string{"ns/web"}, Rules: []policy.Rule{np}, Admin: []policy.TierRule{admin}}, nil)
	if !isolated.Isolated || len(isolated.Rules) != 1 || len(isolated.Admin) != 1 || len(isolated.Baseline) != 0 ||
		!proto.Equal(isolated.Admin[0], want(admin, []string{"TCP/80"})) {
		t.Errorf("isolated by ns/web with an admin rule: %v", isolated)
	}
	only := direction(&policy.Direction{ClusterOnly: true, Admin: []policy.TierRule{admin}, Baseline: []policy.TierRule{baseline}}, nil)
	if only.Isolated || len(only.Policies) != 0 || len(only.Rules) != 0 || len(only.Admin) != 1 || len(only.Baseline) != 1 ||
		!proto.Equal(only.Baseline[0], want(baseline, nil)) {
		t.Errorf("cluster policies only: %v", only)
	}
}
