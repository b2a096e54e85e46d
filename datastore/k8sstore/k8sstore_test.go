//go:build privileged

package k8sstore_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onc-net/onc/controller/nodeipam"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/k8sstore"
	"github.com/onc-net/onc/datastore/storetest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/manifests"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

const (
	agentSA      = "onc-system:onc-agent"
	controllerSA = "onc-system:onc-controller"
)

// One real kube-apiserver for the whole package: starting one takes seconds.
func TestKubernetesBackend(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	admin := api.RESTConfig()
	ctx := context.Background()
	// Exactly what users install, less the workloads (no kubelet here).
	err := manifests.Apply(ctx, admin, manifests.NotWorkloads)
	if err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(admin)
	dyn := dynamic.NewForConfigOrDie(admin)

	// The suite runs on the store as the controller opens it (Liveness from
	// its Lease cache) and as an agent does (Liveness lists the Leases).
	n := 0
	for _, role := range []struct {
		name  string
		agent bool
	}{{"Suite", false}, {"SuiteAsAgent", true}} {
		t.Run(role.name, func(t *testing.T) {
			storetest.Run(t, func(t *testing.T) (datastore.Store, storetest.Older) {
				// A fresh ledger namespace and no ONCNodes: an empty store.
				n++
				ns := fmt.Sprintf("suite-%d", n)
				if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
				if err := dyn.Resource(k8sstore.ONCNodes).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
					t.Fatal(err)
				}
				return openWith(t, k8sstore.Options{Config: admin, Namespace: ns, LeaseNamespace: ns, Agent: role.agent}), older{kube.CoreV1().ConfigMaps(ns)}
			})
		})
	}
	t.Run("ConcurrentAllocatorsNeverShareABlock", func(t *testing.T) {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "race"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		concurrentAllocators(t, func() datastore.Store { return open(t, admin, "race") })
	})
	t.Run("LeastPrivilegeRBAC", func(t *testing.T) {
		leastPrivilege(t, api.ServiceAccountOnNode(agentSA, "rbac-node"), api.ServiceAccountConfig(controllerSA))
	})
	t.Run("AgentWritesOnlyItsOwnONCNodeAndLease", func(t *testing.T) { agentWritesOnlyItsOwnONCNodeAndLease(t, api) })
	t.Run("NodePodCIDRWrittenOnceAndAdopted", func(t *testing.T) { nodePodCIDR(t, kube, open(t, admin, "onc-system")) })
	t.Run("NodePodCIDRsOfBothFamiliesAtOnce", func(t *testing.T) {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dual"}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		nodePodCIDRs(t, kube, open(t, admin, "dual"))
	})
	t.Run("NodeIPOfEitherFamily", func(t *testing.T) { nodeIPOfEitherFamily(t, dyn, open(t, admin, "onc-system")) })
	t.Run("LeaseRenewedAfterAConflict", func(t *testing.T) { leaseRenewedAfterAConflict(t, kube, admin) })
	t.Run("MissingCRDIsNamed", func(t *testing.T) {
		cfg := api.ServiceAccountConfig("default:nobody")
		_, err := k8sstore.New(ctx, k8sstore.Options{Config: cfg, SyncWait: 2 * time.Second})
		if err == nil || !strings.Contains(err.Error(), "onc.yaml") {
			t.Fatalf("store without RBAC: err = %v, want one pointing at the manifest", err)
		}
	})
}

// older is the ledger's config as releases before IPv6 wrote and read it:
// two keys of the ConfigMap onc-ipam.
type older struct {
	cms typedcorev1.ConfigMapInterface
}

func (o older) PutConfig(ctx context.Context, cidr netip.Prefix, bits int) error {
	_, err := o.cms.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: k8sstore.LedgerName},
		Data: map[string]string{"clusterCIDR": cidr.String(), "nodePrefixLen": strconv.Itoa(bits)}}, metav1.CreateOptions{})
	return err
}

func (o older) Config(ctx context.Context) (netip.Prefix, int, error) {
	cm, err := o.cms.Get(ctx, k8sstore.LedgerName, metav1.GetOptions{})
	if err != nil {
		return netip.Prefix{}, 0, err
	}
	p, err := netip.ParsePrefix(cm.Data["clusterCIDR"])
	if err != nil {
		return p, 0, err
	}
	n, err := strconv.Atoi(cm.Data["nodePrefixLen"])
	return p, n, err
}

func open(t *testing.T, cfg *rest.Config, ns string) *k8sstore.Store {
	t.Helper()
	return openWith(t, k8sstore.Options{Config: cfg, Namespace: ns})
}

func openWith(t *testing.T, o k8sstore.Options) *k8sstore.Store {
	t.Helper()
	s, err := k8sstore.New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// The manifest's RBAC is enough for each component's job and no more: the
// agent cannot take a CIDR or delete a node.
func leastPrivilege(t *testing.T, agentCfg, ctlCfg *rest.Config) {
	ctx := context.Background()
	ctl := open(t, ctlCfg, "onc-system")
	cfg := datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}}}
	if err := ctl.PutClusterConfig(ctx, cfg); err != nil {
		t.Fatalf("controller writing the cluster config: %v", err)
	}
	agent := openWith(t, k8sstore.Options{Config: agentCfg, Namespace: "onc-system", Agent: true})
	if got, err := agent.ClusterConfig(ctx); err != nil || !got.Equal(cfg) {
		t.Fatalf("agent reading the cluster config: %+v, %v", got, err)
	}
	spec := datastore.NodeSpec{Name: "rbac-node", IP: netip.MustParseAddr("192.0.2.50"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x50}, FastPath: true}
	if err := agent.RegisterNode(ctx, spec); err != nil {
		t.Fatalf("agent registering: %v", err)
	}
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = agent.KeepAlive(kctx, spec.Name, 10*time.Second) }()
	testutil.WaitFor(t, "liveness seen by the controller", 15*time.Second, func() bool { l, _ := ctl.Liveness(ctx); return l[spec.Name] })
	if l, err := agent.Liveness(ctx); err != nil || !l[spec.Name] {
		t.Fatalf("agent listing liveness (onctl peers): %v, %v", l, err)
	}
	p := netip.MustParsePrefix("10.244.50.0/24")
	if _, err := datastore.ClaimCIDR(ctx, agent, spec.Name, p); !apierrors.IsForbidden(err) {
		t.Fatalf("agent claiming a CIDR: err = %v, want Forbidden", err)
	}
	if got, err := datastore.ClaimCIDR(ctx, ctl, spec.Name, p); err != nil || got != p {
		t.Fatalf("controller claiming: %v, %v", got, err)
	}
	testutil.WaitFor(t, "agent sees its CIDR", 15*time.Second, func() bool { n, _ := agent.Node(ctx, spec.Name); return n.IPv4PodCIDR() == p })
	if err := agent.DeleteNode(ctx, spec.Name); !apierrors.IsForbidden(err) {
		t.Fatalf("agent deleting a node: err = %v, want Forbidden", err)
	}
	if _, err := ctl.ClusterNodes(ctx); err != nil {
		t.Fatal(err)
	}
	// The agent reads Nodes (its own: zone, addresses, deletion, for the
	// Service compiler and /healthz) but never writes one.
	nodes := kubernetes.NewForConfigOrDie(agentCfg).CoreV1().Nodes()
	if _, err := nodes.List(ctx, metav1.ListOptions{}); err != nil {
		t.Fatalf("agent listing Nodes: %v", err)
	}
	if _, err := nodes.Patch(ctx, spec.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"x":"y"}}}`), metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("agent patching a Node: err = %v, want Forbidden", err)
	}
	if err := ctl.DeleteNode(ctx, spec.Name); err != nil {
		t.Fatalf("controller deleting a node: %v", err)
	}
}

// A claim writes Node.spec.podCIDR(s) once; ClusterNodes reports the
// CIDR a Node already carries so the controller can adopt it.
func nodePodCIDR(t *testing.T, kube kubernetes.Interface, s *k8sstore.Store) {
	ctx := context.Background()
	mk := func(name, cidr string) {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDR: cidr}}
		if cidr != "" {
			n.Spec.PodCIDRs = []string{cidr}
		}
		if _, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	mk("fresh", "")
	// Right after its creation the cache may not show a Node yet; NodeGone
	// asks the API server, so it never takes a new node for a gone one.
	if gone, err := s.NodeGone(ctx, "fresh"); gone || err != nil {
		t.Fatalf("NodeGone(fresh) right after its creation = %v, %v", gone, err)
	}
	if gone, err := s.NodeGone(ctx, "never-was"); !gone || err != nil {
		t.Fatalf("NodeGone(never-was) = %v, %v", gone, err)
	}
	mk("preset", "10.244.99.0/24")
	testutil.WaitFor(t, "nodes in the cache", 15*time.Second, func() bool { m, _ := s.ClusterNodes(ctx); return len(m) >= 2 })
	members, err := s.ClusterNodes(ctx)
	if err != nil || !slices.Equal(members["preset"], []netip.Prefix{netip.MustParsePrefix("10.244.99.0/24")}) || len(members["fresh"]) > 0 {
		t.Fatalf("ClusterNodes = %v, %v", members, err)
	}
	p := netip.MustParsePrefix("10.244.60.0/24")
	if _, err := datastore.ClaimCIDR(ctx, s, "fresh", p); err != nil {
		t.Fatal(err)
	}
	n, err := kube.CoreV1().Nodes().Get(ctx, "fresh", metav1.GetOptions{})
	if err != nil || n.Spec.PodCIDR != p.String() || len(n.Spec.PodCIDRs) != 1 || n.Spec.PodCIDRs[0] != p.String() {
		t.Fatalf("Node fresh spec = %+v, %v; want podCIDR(s) %v", n.Spec, err, p)
	}
	// Kubernetes keeps a Node's podCIDR forever; a release leaves it and
	// the next claim of the same block for it needs no write.
	if err := s.ReleaseCIDR(ctx, "fresh"); err != nil {
		t.Fatal(err)
	}
	if _, err := datastore.ClaimCIDR(ctx, s, "fresh", p); err != nil {
		t.Fatalf("re-claiming the Node's own block: %v", err)
	}
	for _, name := range []string{"fresh", "preset"} {
		if err := kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.DeleteNode(ctx, "fresh"); err != nil {
		t.Fatal(err)
	}
}

// In a dual-stack cluster a Node gets its pod CIDRs, in family order, once
// it has a block of each family: Kubernetes lets them be set only once. A
// Node that got its IPv4 one before the cluster became dual-stack keeps
// it alone; the node's ONCNode lists both.
func nodePodCIDRs(t *testing.T, kube kubernetes.Interface, s *k8sstore.Store) {
	ctx := context.Background()
	dual := datastore.ClusterConfig{Pools: []datastore.Pool{
		{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}, {CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64}}}
	if err := s.PutClusterConfig(ctx, dual); err != nil {
		t.Fatal(err)
	}
	v4, v6 := netip.MustParsePrefix("10.244.61.0/24"), netip.MustParsePrefix("fd00:10:244:61::/64")
	old4, old6 := netip.MustParsePrefix("10.244.62.0/24"), netip.MustParsePrefix("fd00:10:244:62::/64")
	for name, cidrs := range map[string][]string{"dual-new": nil, "dual-old": {old4.String()}} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: corev1.NodeSpec{PodCIDRs: cidrs}}
		if len(cidrs) > 0 {
			n.Spec.PodCIDR = cidrs[0]
		}
		if _, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = kube.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{}) })
		if err := s.RegisterNode(ctx, datastore.NodeSpec{Name: name, IP: netip.MustParseAddr("192.0.2.61"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 0x61}}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, "the Nodes in the cache", 15*time.Second, func() bool {
		m, _ := s.ClusterNodes(ctx)
		_, fresh := m["dual-new"]
		return fresh && len(m["dual-old"]) == 1
	})
	nodeCIDRs := func(name string) []string {
		t.Helper()
		n, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(n.Spec.PodCIDRs) > 0 && n.Spec.PodCIDR != n.Spec.PodCIDRs[0] {
			t.Fatalf("Node %s: spec.podCIDR %s, spec.podCIDRs %v", name, n.Spec.PodCIDR, n.Spec.PodCIDRs)
		}
		return n.Spec.PodCIDRs
	}
	for _, claim := range []struct {
		node  string
		block netip.Prefix
	}{{"dual-new", v6}, {"dual-old", old4}, {"dual-old", old6}} {
		if _, err := datastore.ClaimCIDR(ctx, s, claim.node, claim.block); err != nil {
			t.Fatal(err)
		}
	}
	if got := nodeCIDRs("dual-new"); len(got) > 0 {
		t.Fatalf("Node dual-new got pod CIDRs %v with its IPv6 block alone: it could never get the IPv4 one", got)
	}
	if _, err := datastore.ClaimCIDR(ctx, s, "dual-new", v4); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]netip.Prefix{"dual-new": {v4, v6}, "dual-old": {old4}} {
		if got := nodeCIDRs(name); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("Node %s spec.podCIDRs = %v, want %v", name, got, want)
		}
	}
	for name, want := range map[string][]netip.Prefix{"dual-new": {v4, v6}, "dual-old": {old4, old6}} {
		if n, err := s.Node(ctx, name); err != nil || !slices.Equal(n.PodCIDRs, want) {
			t.Errorf("ONCNode %s = %+v, %v; want pod CIDRs %v", name, n, err, want)
		}
	}
	for _, name := range []string{"dual-new", "dual-old"} {
		if err := s.DeleteNode(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if allocs, err := s.Allocations(ctx); err != nil || len(allocs) != 0 {
		t.Fatalf("allocations after deleting both: %v, %v", allocs, err)
	}
}

// Ten controllers, each with its own client, allocate at once: the
// ledger's compare-and-swap gives every node its own block.
func concurrentAllocators(t *testing.T, newStore func() datastore.Store) {
	const n = 10
	pool := datastore.Pool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	got := make([]netip.Prefix, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		a, err := nodeipam.New(pool, newStore())
		if err != nil {
			t.Fatal(err)
		}
		node := fmt.Sprint("node-", i)
		wg.Go(func() {
			var blocks map[string]netip.Prefix
			blocks, errs[i] = a.Allocate(context.Background(), []nodeipam.Request{{Node: node}})
			got[i] = blocks[node]
		})
	}
	wg.Wait()
	seen := map[netip.Prefix]int{}
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("node-%d: %v", i, errs[i])
		}
		if j, dup := seen[got[i]]; dup {
			t.Fatalf("node-%d and node-%d both got %v", i, j, got[i])
		}
		seen[got[i]] = i
	}
}

// A renewal that fails (here a conflict: someone else wrote the Lease) does
// not stop the next ones: the node stays alive.
func leaseRenewedAfterAConflict(t *testing.T, kube kubernetes.Interface, admin *rest.Config) {
	ctx := context.Background()
	const ns, node = "renewal", "renewal-node"
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s := openWith(t, k8sstore.Options{Config: admin, Namespace: ns, LeaseNamespace: ns, Agent: true})
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = s.KeepAlive(kctx, node, 2*time.Second) }() // renewed every second
	leases := kube.CoordinationV1().Leases(ns)
	renewed := func() time.Time {
		l, err := leases.Get(ctx, "onc-node-"+node, metav1.GetOptions{})
		if err != nil || l.Spec.RenewTime == nil {
			return time.Time{}
		}
		return l.Spec.RenewTime.Time
	}
	testutil.WaitFor(t, "the Lease", 10*time.Second, func() bool { return !renewed().IsZero() })
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		l, err := leases.Get(ctx, "onc-node-"+node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		l.Annotations = map[string]string{"touched-by": "someone else"}
		_, err = leases.Update(ctx, l, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	touched := time.Now()
	testutil.WaitFor(t, "renewals after the conflict", 10*time.Second, func() bool { return renewed().After(touched.Add(time.Second)) })
}

// nodeIPOfEitherFamily: an ONCNode's nodeIP, the tunnel endpoint, may be
// IPv4 or IPv6 (an IPv6 underlay) and reads back as written; anything
// else the API server refuses, naming the field (the schema's anyOf of
// the two formats).
func nodeIPOfEitherFamily(t *testing.T, dyn dynamic.Interface, s *k8sstore.Store) {
	ctx := context.Background()
	spec := datastore.NodeSpec{Name: "v6-node", IP: netip.MustParseAddr("fd00:172::7"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 7}}
	if err := s.RegisterNode(ctx, spec); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the IPv6 registration read back", 10*time.Second, func() bool {
		n, err := s.Node(ctx, spec.Name)
		return err == nil && n.IP == spec.IP
	})
	for _, bad := range []string{"10.0.0.300", "fd00::1::2", "node-1"} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "onc.io/v1alpha1", "kind": "ONCNode",
			"metadata": map[string]any{"name": "bad-node"}, "spec": map[string]any{"nodeIP": bad, "vtepMAC": "02:00:00:00:00:08"}}}
		_, err := dyn.Resource(k8sstore.ONCNodes).Create(ctx, u, metav1.CreateOptions{})
		if err == nil || !strings.Contains(err.Error(), `"spec.nodeIP" must validate at least one schema`) {
			t.Errorf("nodeIP %q: err = %v, want a refusal naming spec.nodeIP", bad, err)
			_ = dyn.Resource(k8sstore.ONCNodes).Delete(ctx, "bad-node", metav1.DeleteOptions{})
		}
	}
}
