//go:build e2e

// Package e2e holds ONC's end-to-end tests on the lab (see lab).
package e2e

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	policytable "github.com/onc-net/onc/datapath/policy"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	"golang.org/x/sys/unix"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The lab's matrix — pod↔pod on one node and across nodes, node→pod,
// pod→node, each with ICMP, TCP and UDP — passes on 3 nodes × 2 pods with
// the fast path on (so host↔pod traffic works beside it), on each
// datastore. Then a node is removed: its route, neighbour and FDB entry
// vanish on the others and the rest keep working. On etcd the node timeout
// removes it; on Kubernetes deleting its Node object does, at once. Each
// time most of the matrix's own pod↔pod packets hit the fast path.
func TestLabMatrixAndNodeRemoval(t *testing.T) {
	t.Run("etcd", func(t *testing.T) {
		// An hour: the removal is onc-controller remove-node's, not the timeout's.
		labMatrixAndNodeRemoval(t, labtest.Lab(t, lab.Options{Nodes: 3, PodsPerNode: 2, NodeTimeout: time.Hour}))
	})
	t.Run("kubernetes", func(t *testing.T) {
		l := labtest.Lab(t, lab.Options{Nodes: 3, PodsPerNode: 2, NodeTimeout: time.Hour, Datastore: "kubernetes"})
		kube := kubernetes.NewForConfigOrDie(l.APIServer.RESTConfig())
		for _, n := range l.Nodes {
			st, err := n.Status(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			node, err := kube.CoreV1().Nodes().Get(context.Background(), n.Name, metav1.GetOptions{})
			if err != nil || node.Spec.PodCIDR != st.PodCidr {
				t.Fatalf("Node %s spec.podCIDR = %q (%v); its agent uses %s", n.Name, node.Spec.PodCIDR, err, st.PodCidr)
			}
		}
		podPhases(t, l, l.Nodes[0])
		labMatrixAndNodeRemoval(t, l)
	})
}

// With Kubernetes the agent watches its node's pods: `onctl pods` shows
// each attachment's pod phase (the lab writes Running, as a kubelet would),
// and "gone" for one the API does not have (a runtime that never called
// DEL leaked it).
func podPhases(t *testing.T, l *lab.Lab, n *lab.Node) {
	ctx := context.Background()
	known, leaked := n.Pods[0], n.Pods[1]
	if err := l.DeletePodObject(ctx, leaked); err != nil {
		t.Fatal(err)
	}
	agent, conn, err := n.AgentAPI()
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	phases := func() map[string]string {
		resp, err := agent.ListPods(ctx, &apiv1.ListPodsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		for _, p := range resp.Pods {
			out[p.K8SNamespace+"/"+p.K8SName] = p.K8SPhase
		}
		return out
	}
	testutil.WaitFor(t, "the agent to see the pod Running", 15*time.Second, func() bool { return phases()[known.Key()] == "Running" })
	testutil.WaitFor(t, "the agent to see the leaked attachment's pod gone", 15*time.Second, func() bool { return phases()[leaked.Key()] == "gone" })
}

func labMatrixAndNodeRemoval(t *testing.T, l *lab.Lab) {
	ctx := context.Background()
	for _, n := range l.Nodes {
		if st, err := n.Status(ctx); err != nil || !st.FastPath {
			t.Fatalf("%s: fast path not on (%v): the matrix must run beside it", n.Name, err)
		}
	}
	matrix(t, l)

	gone := l.Nodes[2]
	st, err := gone.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes[:2] {
		if e := tunnelEntries(t, n, st.PodCidr, st.Gateway, st.VtepMac); e != (entries{true, true, true}) {
			t.Fatalf("%s lacks entries for %s before removal: %+v", n.Name, gone.Name, e)
		}
	}
	if err := l.RemoveNode(ctx, gone); err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes {
		deadline := time.Now().Add(30 * time.Second)
		for tunnelEntries(t, n, st.PodCidr, st.Gateway, st.VtepMac) != (entries{}) {
			if time.Now().After(deadline) {
				t.Fatalf("%s still has tunnel entries for removed %s: %+v", n.Name, gone.Name,
					tunnelEntries(t, n, st.PodCidr, st.Gateway, st.VtepMac))
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	// Its pod CIDR is free again: the controller counts one block per node left.
	targets, err := l.MetricsTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantValues(t, "controller", scrape(t, targets[len(targets)-1]), []metricWant{
		{"onc_controller_cidrs", map[string]string{"family": "ipv4", "state": "allocated"}, float64(len(l.Nodes))},
	})
	matrix(t, l)
}

// matrix runs the lab's matrix, which must pass on every pair and, with
// its own traffic, show make lab's user the fast path at work: on every
// node more hits than misses of flows not learned yet, both ways.
func matrix(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx := context.Background()
	before, err := l.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	allPairsPass(t, l, "the matrix")
	after, err := l.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	deltas := lab.StatsDelta(before, after)
	grew := map[string]uint64{} // by "node program counter"
	for _, d := range deltas {
		grew[d.Node+" "+d.Program+" "+d.Counter] = d.Delta
	}
	for _, n := range l.Nodes {
		for _, prog := range []string{"egress", "ingress"} {
			if hits, unlearned := grew[n.Name+" "+prog+" hit"], grew[n.Name+" "+prog+" miss_flow"]; hits <= unlearned {
				var out strings.Builder
				lab.PrintStatsDelta(&out, deltas)
				t.Fatalf("%s %s: %d hits, %d misses of flows not learned yet: most of the matrix's pod↔pod packets should hit:\n%s",
					n.Name, prog, hits, unlearned, out.String())
			}
		}
	}
}

// allPairsPass runs the lab's matrix and fails unless it probed every pair
// (pod↔pod, node→pod, pod→node) and each one worked.
func allPairsPass(t *testing.T, l *lab.Lab, when string) {
	t.Helper()
	results, err := l.Matrix(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	failed := lab.PrintMatrix(&out, results)
	pods, pods6 := 0, 0
	for _, n := range l.Nodes {
		for _, p := range n.Pods {
			pods++
			if p.IPv6.IsValid() && p.IPv6 != p.IP { // a second family to probe
				pods6++
			}
		}
	}
	// The first family (IPv4, or IPv6 in an IPv6 lab): pod↔pod, node→pod,
	// pod→node; a dual-stack lab's IPv6: pod↔pod, node→pod.
	want := pods*(pods-1) + 2*pods*len(l.Nodes) + pods6*(pods6-1) + pods6*len(l.Nodes)
	if failed > 0 || len(results) != want {
		t.Fatalf("%s: %d of %d pairs failed (want %d pairs):\n%s", when, failed, len(results), want, out.String())
	}
}

type entries struct{ route, neigh, fdb bool }

// tunnelEntries reports which of a peer's entries exist on node n.
func tunnelEntries(t *testing.T, n *lab.Node, cidr, gw, mac string) entries {
	t.Helper()
	h := testutil.NetlinkAt(t, n.Netns)
	link, err := h.LinkByName("onc.vxlan")
	if err != nil {
		t.Fatal(err)
	}
	var e entries
	routes, _ := h.RouteList(link, unix.AF_INET)
	for _, r := range routes {
		if r.Dst != nil && r.Dst.String() == cidr {
			e.route = true
		}
	}
	neighs, _ := h.NeighList(link.Attrs().Index, unix.AF_INET)
	for _, nb := range neighs {
		if nb.IP.String() == gw {
			e.neigh = true
		}
	}
	fdb, _ := h.NeighList(link.Attrs().Index, unix.AF_BRIDGE)
	for _, f := range fdb {
		if f.HardwareAddr.String() == mac {
			e.fdb = true
		}
	}
	return e
}

// 200 pods are added, then deleted, in parallel on one node, three times
// over, each made isolated by a NetworkPolicy: afterwards no address, veth,
// route, neighbour, fast-path cache entry or policy chain is left.
func TestChurnLeavesNothing(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 1, Datastore: "kubernetes"})
	n := l.Nodes[0]
	ctx := context.Background()
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetNamespace(ctx, lab.DefaultNamespace, nil); err != nil {
		t.Fatal(err)
	}
	// Every pod of the namespace isolated both ways: each gets its chains.
	everyPod := []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
	isolate := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "churn", Namespace: lab.DefaultNamespace},
		Spec: networkingv1.NetworkPolicySpec{
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: everyPod}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: everyPod}},
		}}
	if _, err := kube.NetworkingV1().NetworkPolicies(lab.DefaultNamespace).Create(ctx, isolate, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	client, closer, err := n.AgentAPI()
	if err != nil {
		t.Fatal(err)
	}
	defer closer.Close()
	const pods = 200
	for round := 1; round <= 3; round++ {
		added := make([]*lab.Pod, pods)
		parallel(t, fmt.Sprintf("round %d ADD", round), pods, func(i int) (err error) {
			added[i], err = l.AddPod(ctx, n)
			return err
		})
		seen := map[string]bool{}
		for _, p := range added {
			if seen[p.IP.String()] {
				t.Fatalf("round %d: %s given twice", round, p.IP)
			}
			seen[p.IP.String()] = true
		}
		// The state the check below must find gone is there.
		waitPodEntries(t, client, n, fmt.Sprintf("round %d, %d pods", round, pods), podEntries{pods, pods, 2 * pods})
		parallel(t, fmt.Sprintf("round %d DEL", round), pods, func(i int) error { return l.DelPod(ctx, n, added[i]) })
		assertNodeClean(t, n)
		waitPodEntries(t, client, n, fmt.Sprintf("round %d, every pod deleted", round), podEntries{})
	}
}

// parallel runs f(0) … f(count-1) at once and fails on the first error.
func parallel(t *testing.T, what string, count int, f func(i int) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, count)
	for i := range count {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(i); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("%s: %v", what, err)
	}
}

// podEntries counts a node's per-pod state outside the kernel's links and
// routes: fast-path ingress entries, pods the policy enforcer holds, and
// the nftables chains it made for them.
type podEntries struct{ Ingress, PolicyPods, PolicyChains int }

// waitPodEntries waits up to a minute for n's podEntries to be want: the
// policy enforcer follows pods through the API, a little behind CNI.
func waitPodEntries(t *testing.T, client apiv1.AgentClient, n *lab.Node, when string, want podEntries) {
	t.Helper()
	var got podEntries
	var err error
	for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if got, err = countPodEntries(client, n); err == nil && got == want {
			return
		}
	}
	t.Fatalf("%s: %+v (%v), want %+v", when, got, err, want)
}

// podChain is a pod's ingress or egress chain in `nft list table`.
var podChain = regexp.MustCompile(`(?m)^\s*chain (in|eg)-`)

func countPodEntries(client apiv1.AgentClient, n *lab.Node) (podEntries, error) {
	ctx := context.Background()
	cache, err := client.ListCache(ctx, &apiv1.ListCacheRequest{Table: "ingress"})
	if err != nil {
		return podEntries{}, err
	}
	pol, err := client.ListPolicy(ctx, &apiv1.ListPolicyRequest{})
	if err != nil {
		return podEntries{}, err
	}
	out, err := exec.Command("ip", "netns", "exec", n.Netns, "nft", "list", "table", "inet", policytable.Table).CombinedOutput()
	if err != nil {
		return podEntries{}, fmt.Errorf("nft list table: %w: %s", err, out)
	}
	chains := podChain.FindAll(out, -1)
	return podEntries{len(cache.Ingress), len(pol.Pods), len(chains)}, nil
}

func assertNodeClean(t *testing.T, n *lab.Node) {
	t.Helper()
	st, err := n.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st.Pods != 0 {
		t.Fatalf("%d pod addresses still allocated", st.Pods)
	}
	if got := labtest.PodStateOf(t, n.Netns); got != (labtest.PodState{}) {
		t.Fatalf("leaked pod state: %+v", got)
	}
}

// Pod traffic leaving the cluster CIDR is masqueraded to the node's IP;
// pod-to-pod traffic keeps the pod's address.
func TestMasqueradeOnlyLeavingTheCluster(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1})
	n1, n2 := l.Nodes[0], l.Nodes[1]
	src := n1.Pods[0]
	cases := []struct {
		name, netns string
		dst         netip.Addr
		wantSrc     netip.Addr
	}{
		{"pod to remote node", n2.Netns, n2.IP, n1.IP},
		{"pod to remote pod", n2.Pods[0].Netns, n2.Pods[0].IP, src.IP},
	}
	for _, c := range cases {
		var ln net.Listener
		if err := lab.InNetns(c.netns, func() (err error) { ln, err = net.Listen("tcp4", ":7878"); return err }); err != nil {
			t.Fatal(err)
		}
		seen := make(chan netip.Addr, 1)
		go func() {
			conn, err := ln.Accept()
			if err != nil {
				close(seen)
				return
			}
			seen <- conn.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
			conn.Close()
		}()
		err := lab.InNetns(src.Netns, func() error {
			conn, err := net.DialTimeout("tcp4", netip.AddrPortFrom(c.dst, 7878).String(), 3*time.Second)
			if err == nil {
				conn.Close()
			}
			return err
		})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if got := <-seen; got != c.wantSrc {
			t.Errorf("%s: server saw source %s, want %s", c.name, got, c.wantSrc)
		}
		ln.Close()
	}
}
