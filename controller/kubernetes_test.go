//go:build privileged

package controller_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/backend"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/k8sstore"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/manifests"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Two real onc-controller replicas, running as the manifest's service
// account against a real kube-apiserver: one leads; it adopts a pod CIDR a
// Node already has and allocates the others; when it dies the standby
// takes over; a deleted Node's CIDR is freed.
func TestKubernetesControllerReplicas(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	bins := testutil.Binaries(t)
	ctx := context.Background()
	if err := manifests.Apply(ctx, api.RESTConfig(), manifests.NotWorkloads); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(api.RESTConfig())
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "controller.kubeconfig")
	if err := api.WriteKubeconfig(kubeconfig, "onc-system:onc-controller", ""); err != nil {
		t.Fatal(err)
	}
	// The agents' side as onctl reads it, as the agent service account.
	agents, err := k8sstore.New(ctx, k8sstore.Options{Config: api.ServiceAccountConfig("onc-system:onc-agent"), Agent: true})
	if err != nil {
		t.Fatal(err)
	}
	defer agents.Close()
	join := func(name, podCIDR string, i int) {
		t.Helper()
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if podCIDR != "" {
			n.Spec.PodCIDR, n.Spec.PodCIDRs = podCIDR, []string{podCIDR}
		}
		if _, err := kube.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		spec := datastore.NodeSpec{Name: name, IP: netip.AddrFrom4([4]byte{192, 0, 2, byte(i)}), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(i)}}
		// The node's own agent: ONC's admission policy lets it write only its ONCNode.
		agent, err := k8sstore.New(ctx, k8sstore.Options{Config: api.ServiceAccountOnNode("onc-system:onc-agent", name), Agent: true})
		if err != nil {
			t.Fatal(err)
		}
		defer agent.Close()
		if err := agent.RegisterNode(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	cidrOf := func(name string) netip.Prefix { n, _ := agents.Node(ctx, name); return n.IPv4PodCIDR() }

	join("n1", "", 1)
	join("n2", "10.244.42.0/24", 2) // e.g. given by kube-controller-manager before ONC
	replicas := map[string]*os.Process{}
	for _, id := range []string{"c1", "c2"} {
		cmd := testutil.Start(t, filepath.Join(dir, id+".log"), filepath.Join(bins, "onc-controller"),
			"--datastore=kubernetes", "--kubeconfig", kubeconfig, "--leader-elect-identity", id,
			"--leader-elect-lease-duration=4s", "--leader-elect-renew-deadline=3s", "--leader-elect-retry-period=500ms",
			"--cluster-cidr=10.244.0.0/16", "--node-prefix-len=24",
			"--metrics-addr=127.0.0.1:0") // both replicas share this host's network
		replicas[id] = cmd.Process
	}
	testutil.WaitFor(t, "n1 and n2 allocated", 30*time.Second, func() bool { return cidrOf("n1").IsValid() && cidrOf("n2").IsValid() })
	if got := cidrOf("n2"); got != netip.MustParsePrefix("10.244.42.0/24") {
		t.Fatalf("n2 got %v; want the pod CIDR its Node already had", got)
	}
	// The Node's spec.podCIDR is written after the ONCNode's copy.
	testutil.WaitFor(t, "Node n1's spec.podCIDR", 30*time.Second, func() bool {
		n1, err := kube.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
		return err == nil && n1.Spec.PodCIDR == cidrOf("n1").String()
	})

	leader := holder(t, kube)
	t.Logf("leader %s; killing it without a chance to hand over", leader)
	if err := replicas[leader].Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	join("n3", "", 3)
	testutil.WaitFor(t, "the standby to take over and allocate n3", 30*time.Second, func() bool { return cidrOf("n3").IsValid() })
	if now := holder(t, kube); now == leader {
		t.Fatalf("lease still held by the dead %s", leader)
	}

	// Agents read pod CIDRs from the ONCNodes' copy, never the ledger: a
	// copy lost (say, a controller killed between the two writes) is
	// restored from the ledger, and nothing new is taken.
	n3 := cidrOf("n3")
	if _, err := dynamic.NewForConfigOrDie(api.RESTConfig()).Resource(k8sstore.ONCNodes).Patch(ctx, "n3", types.MergePatchType,
		[]byte(`{"spec":{"podCIDR":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "n3's pod CIDR restored on its ONCNode", 30*time.Second, func() bool { return cidrOf("n3") == n3 })
	if allocs, _ := agents.Allocations(ctx); len(allocs) != 3 {
		t.Fatalf("allocations after restoring n3's copy: %v, want n1, n2 and n3's", allocs)
	}

	gone := cidrOf("n1")
	if err := kube.CoreV1().Nodes().Delete(ctx, "n1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "n1's registration and CIDR to go", 30*time.Second, func() bool {
		allocs, _ := agents.Allocations(ctx)
		_, err := agents.Node(ctx, "n1")
		return allocs[gone] == "" && err != nil
	})
	got := map[netip.Prefix]bool{}
	for _, n := range []string{"n2", "n3"} {
		if p := cidrOf(n); !p.IsValid() || got[p] {
			t.Fatalf("%s has %v after the failover; blocks %v", n, p, got)
		} else {
			got[p] = true
		}
	}
}

// A dual-stack controller on Kubernetes, as the manifest's service
// account: in one reconcile every node gets a block of each family, the
// one its Node carries when that is free; its ONCNode lists them in family
// order, and so does its Node, once, unless it carried one already (a
// Node of the cluster before it became dual-stack keeps its one); a
// deleted Node's blocks are all freed.
func TestKubernetesDualStack(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := manifests.Apply(ctx, api.RESTConfig(), manifests.NotWorkloads); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(api.RESTConfig())
	agents := openK8sStore(ctx, t, api.RESTConfig(), true)
	for i, n := range []struct{ name, carries string }{
		{"fresh", ""},
		{"preset", "10.244.42.0/24,fd00:10:244:42::/64"}, // by kube-controller-manager, say
		{"older", "10.244.43.0/24"},                      // from before the cluster became dual-stack
	} {
		node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
		if n.carries != "" {
			node.Spec.PodCIDRs = strings.Split(n.carries, ",")
			node.Spec.PodCIDR = node.Spec.PodCIDRs[0]
		}
		if _, err := kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		spec := datastore.NodeSpec{Name: n.name, IP: netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, byte(i + 1)}}
		if err := agents.RegisterNode(ctx, spec); err != nil {
			t.Fatal(err)
		}
	}
	ctl := openK8sStore(ctx, t, api.ServiceAccountConfig("onc-system:onc-controller"), false)
	c, err := controller.New(ctx, controller.Config{Cluster: datastore.ClusterConfig{Pools: []datastore.Pool{
		{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}, {CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64}}}}, ctl)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()

	want := map[string]string{
		"fresh":  "[10.244.0.0/24 fd00:10:244::/64]",
		"preset": "[10.244.42.0/24 fd00:10:244:42::/64]",
		"older":  "[10.244.43.0/24 fd00:10:244:1::/64]",
	}
	wantNode := maps.Clone(want)
	wantNode["older"] = "[10.244.43.0/24]" // Kubernetes never lets a Node's pod CIDRs change
	shown := func() (onc, node map[string]string) {
		onc, node = map[string]string{}, map[string]string{}
		for name := range want {
			n, _ := agents.Node(ctx, name)
			onc[name] = fmt.Sprint(n.PodCIDRs)
			if kn, err := kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{}); err == nil && len(kn.Spec.PodCIDRs) > 0 && kn.Spec.PodCIDR == kn.Spec.PodCIDRs[0] {
				node[name] = fmt.Sprint(kn.Spec.PodCIDRs)
			}
		}
		return onc, node
	}
	var onc, node map[string]string
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if onc, node = shown(); maps.Equal(onc, want) && maps.Equal(node, wantNode) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("ONCNodes' pod CIDRs %v, Nodes' %v; want %v and %v", onc, node, want, wantNode)
		}
	}

	if err := kube.CoreV1().Nodes().Delete(ctx, "fresh", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "fresh's blocks freed", 30*time.Second, func() bool {
		allocs, _ := agents.Allocations(ctx)
		return len(allocs) == 4 && allocs[netip.MustParsePrefix("10.244.0.0/24")] == "" && allocs[netip.MustParsePrefix("fd00:10:244::/64")] == ""
	})
}

func holder(t *testing.T, kube kubernetes.Interface) string {
	t.Helper()
	var id string
	testutil.WaitFor(t, "a leader", 30*time.Second, func() bool {
		l, err := kube.CoordinationV1().Leases("onc-system").Get(context.Background(), controller.LeaseName, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
			return false
		}
		id = *l.Spec.HolderIdentity
		return true
	})
	return id
}

// Two controllers on one kube-apiserver, as the manifest's service account
// with the default client limits, each with its own store (clients and
// caches) and no election between them, in a dual-stack cluster: every
// claim batch is one compare-and-swap of its family's ledger, and every
// node's ONCNode and Node show its two blocks, though the two controllers
// may write a node's two families at once.
func TestTwoControllersGiveEveryNodeOneBlockOnKubernetes(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	ctx := context.Background()
	if err := manifests.Apply(ctx, api.RESTConfig(), manifests.NotWorkloads); err != nil {
		t.Fatal(err)
	}
	ctl := func() datastore.Store {
		cfg := api.ServiceAccountConfig("onc-system:onc-controller")
		cfg.QPS, cfg.Burst = backend.ControllerQPS, backend.ControllerBurst
		return openK8sStore(ctx, t, cfg, false)
	}
	// The nodes' side (kubelets, agents) is not what is measured: no client limit.
	admin := api.RESTConfig()
	admin.QPS, admin.Burst = 100_000, 100_000
	kube := kubernetes.NewForConfigOrDie(admin)
	agents := openK8sStore(ctx, t, admin, true)
	race{
		cluster: datastore.ClusterConfig{Pools: []datastore.Pool{
			{CIDR: netip.MustParsePrefix("10.0.0.0/8"), NodePrefixLen: 24}, {CIDR: netip.MustParsePrefix("fd00::/32"), NodePrefixLen: 64}}},
		stores: [2]datastore.Store{ctl(), ctl()},
		register: func(ctx context.Context, spec datastore.NodeSpec) error {
			if _, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: spec.Name}}, metav1.CreateOptions{}); err != nil {
				return err
			}
			return agents.RegisterNode(ctx, spec)
		},
		mirrored: func(ctx context.Context, blocks map[string][]netip.Prefix) ([]string, error) {
			nodes, err := kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
			if err != nil {
				return nil, err
			}
			var stale []string
			for _, n := range nodes.Items {
				if want := blocks[n.Name]; len(want) == 0 || n.Spec.PodCIDR != want[0].String() || fmt.Sprint(n.Spec.PodCIDRs) != fmt.Sprint(want) {
					stale = append(stale, n.Name)
				}
			}
			return stale, nil
		},
	}.run(t)
}

// openK8sStore opens a Kubernetes store as cfg's user, an agent's or the
// controller's, closed when the test ends.
func openK8sStore(ctx context.Context, t *testing.T, cfg *rest.Config, agent bool) datastore.Store {
	t.Helper()
	s, err := k8sstore.New(ctx, k8sstore.Options{Config: cfg, Agent: agent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
