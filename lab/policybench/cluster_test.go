package policybench

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onc-net/onc/agent/policy"
	dppolicy "github.com/onc-net/onc/datapath/policy"
)

// The synthetic cluster exercises what the benchmark says it does: local
// pods isolated both ways, and a change of np-0 that rewrites some of
// their rules and not all.
func TestCluster(t *testing.T) {
	c := NewCluster(1000, 100)
	if len(c.Local) != MaxLocalPods || len(c.Snapshot.Pods) != 1000 || len(c.Snapshot.Policies) != 100 {
		t.Fatalf("%d local, %d pods, %d policies", len(c.Local), len(c.Snapshot.Pods), len(c.Snapshot.Policies))
	}
	rs := policy.Compile(c.Snapshot, c.Local)
	var in, eg int
	for _, p := range rs.Pods {
		if p.Ingress != nil {
			in++
		}
		if p.Egress != nil {
			eg++
		}
	}
	if in == 0 || eg == 0 || in == len(rs.Pods) && eg == len(rs.Pods) {
		t.Errorf("isolated: %d ingress, %d egress of %d", in, eg, len(rs.Pods))
	}
	c.Snapshot.Policies[0] = Changed(c)
	rs2 := policy.Compile(c.Snapshot, c.Local)
	changed := 0
	for i := range rs.Pods {
		if reflect.DeepEqual(rs.Pods[i], rs2.Pods[i]) {
			continue
		}
		changed++
		// The enforcer sees a change only in the peers and ports: np-0's
		// must select pods in both versions, different ones.
		peers := func(p dppolicy.Pod) []netip.Prefix {
			for _, r := range p.Ingress.Rules {
				if r.Policy == "ns-0/np-0" {
					return r.Peers
				}
			}
			return nil
		}
		before, after := peers(rs.Pods[i]), peers(rs2.Pods[i])
		if len(before) == 0 || len(after) == 0 || reflect.DeepEqual(before, after) {
			t.Errorf("%s: np-0's peers %v before the change, %v after", rs.Pods[i].Key, before, after)
		}
	}
	if changed == 0 || changed == len(rs.Pods) {
		t.Errorf("the change rewrote %d of %d pods' rules", changed, len(rs.Pods))
	}
	t.Logf("isolated: %d ingress, %d egress of %d; change rewrites %d", in, eg, len(rs.Pods), changed)
}

// BenchPolicy 0 lets the client reach the server, the others not.
func TestBenchPolicy(t *testing.T) {
	if len(BenchPolicy(0).Spec.Ingress) != 3 || len(BenchPolicy(1).Spec.Ingress) != 2 {
		t.Error("only policy 0 allows netperf")
	}
}

// The agent's compile of a change, in process (make bench-policy times a
// policy change with the enforcer's apply): in full, and incrementally for
// a change of each kind, each object alternating between two versions
// (np-0 as the benchmark changes it; a remote pod's labels; a namespace's
// labels), and for a resync of unchanged inputs. cpu-ms/op is the
// process's CPU, GC included: steadier than wall time on a shared machine.
func BenchmarkCompile(b *testing.B) {
	for _, size := range []struct{ pods, policies int }{{1000, 1000}, {5000, 1000}} {
		c := NewCluster(size.pods, size.policies)
		b.Run(fmt.Sprintf("full/%dx%d", size.pods, size.policies), func(b *testing.B) {
			defer reportCPU(b)()
			for b.Loop() {
				policy.Compile(c.Snapshot, c.Local)
			}
		})
		s := &c.Snapshot
		np, pod, ns := Changed(c), s.Pods[len(c.Local)].DeepCopy(), s.Namespaces[1].DeepCopy()
		pod.Labels = map[string]string{"app": "a1", "tier": "db"}
		ns.Labels = map[string]string{"team": "t0", "env": "prod"}
		var inc policy.Incremental
		inc.Compile(c.Snapshot, c.Local)
		for _, change := range []struct {
			name string
			swap func()
		}{
			{"policy", func() { s.Policies[0], np = np, s.Policies[0] }},
			{"pod-labels", func() { s.Pods[len(c.Local)], pod = pod, s.Pods[len(c.Local)] }},
			{"namespace-labels", func() { s.Namespaces[1], ns = ns, s.Namespaces[1] }},
			{"unchanged", func() {}},
		} {
			b.Run(fmt.Sprintf("%s/%dx%d", change.name, size.pods, size.policies), func(b *testing.B) {
				defer reportCPU(b)()
				for b.Loop() {
					change.swap()
					inc.Compile(c.Snapshot, c.Local)
				}
			})
		}
	}
}

// reportCPU starts counting the process's CPU; the function it returns
// reports it per op.
func reportCPU(b *testing.B) func() {
	start := cpuTime()
	return func() { b.ReportMetric(float64((cpuTime()-start).Microseconds())/1000/float64(b.N), "cpu-ms/op") }
}

// The ClusterNetworkPolicies give every local pod tier rules, and the
// change of cnp-0 rewrites the rules of its subjects (team t0's pods)
// and no others.
func TestClusterPolicies(t *testing.T) {
	c := NewCluster(1000, 100)
	c.AddClusterPolicies(100)
	rs := policy.Compile(c.Snapshot, c.Local)
	for _, p := range rs.Pods {
		if p.Ingress == nil || !p.Ingress.Tiered() {
			t.Fatalf("%s: no tier rules in ingress", p.Key)
		}
	}
	i := slices.IndexFunc(c.Snapshot.ClusterPolicies, func(p *policy.ClusterNetworkPolicy) bool { return p.Name == "cnp-0" })
	c.Snapshot.ClusterPolicies[i] = ChangedClusterPolicy(c)
	rs2 := policy.Compile(c.Snapshot, c.Local)
	changed := 0
	for k := range rs.Pods {
		pod := c.Snapshot.Pods[slices.IndexFunc(c.Snapshot.Pods, func(p *corev1.Pod) bool { return p.Namespace+"/"+p.Name == rs.Pods[k].Key })]
		subject := slices.Contains([]string{"ns-0", "ns-3", "ns-6", "ns-9"}, pod.Namespace) // team t0
		if differ := !reflect.DeepEqual(rs.Pods[k], rs2.Pods[k]); differ != subject {
			t.Errorf("%s (subject of cnp-0: %v): rules changed %v", pod.Namespace+"/"+pod.Name, subject, differ)
		}
		if subject {
			changed++
		}
	}
	if changed == 0 || changed == len(rs.Pods) {
		t.Errorf("the change rewrote %d of %d pods' rules", changed, len(rs.Pods))
	}
}

// The CRR benchmark's cluster policies select the client and the server
// and judge every connection through both tiers: the client's to the
// server on netperf's ports passes (bench-0000) to the NetworkPolicies,
// which allow it; a peer on a port of another's rule is denied at Admin.
func TestBenchClusterPolicy(t *testing.T) {
	ns := func(name string, labels map[string]string) *corev1.Namespace {
		labels["kubernetes.io/metadata.name"] = name
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	pod := func(ns, name, ip string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
			Spec:   corev1.PodSpec{NodeName: "n", Containers: []corev1.Container{{Name: "c", Ports: ports}}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}}
	}
	s := policy.Snapshot{
		Namespaces: []*corev1.Namespace{ns(benchNS, map[string]string{"purpose": "bench"}), ns(peersNS, map[string]string{"team": "peers"})},
		Pods: []*corev1.Pod{
			pod(benchNS, "client", "10.244.0.2", map[string]string{"app": "client"}),
			pod(benchNS, "server", "10.244.0.3", map[string]string{"app": "server"},
				corev1.ContainerPort{Name: "np-ctl", ContainerPort: ctlPort, Protocol: corev1.ProtocolTCP},
				corev1.ContainerPort{Name: "np-data", ContainerPort: dataPort, Protocol: corev1.ProtocolTCP}),
			pod(peersNS, "peer-1", "10.244.0.4", map[string]string{"role": "peer-1"}),
		},
	}
	const n = 10
	for i := 0; i < n; i++ {
		s.Policies = append(s.Policies, BenchPolicy(i))
		s.ClusterPolicies = append(s.ClusterPolicies, BenchClusterPolicy(i))
	}
	local := []policy.LocalPod{
		{Namespace: benchNS, Name: "client", Iface: "c", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.2")}},
		{Namespace: benchNS, Name: "server", Iface: "s", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.3")}},
	}
	rs := policy.Compile(s, local)
	client, server := rs.Pods[0], rs.Pods[1]
	for _, d := range []*dppolicy.Direction{client.Egress, server.Ingress} {
		if names := tierPolicies(d.Admin); len(names) != n {
			t.Fatalf("admin rules of %d cluster policies, want %d", len(names), n)
		}
	}
	for _, c := range []struct {
		what string
		d    *dppolicy.Direction
		peer string
		port uint16
		want dppolicy.Verdict
	}{
		{"server ingress from the client", server.Ingress, "10.244.0.2", ctlPort, dppolicy.Verdict{Allowed: true, Policy: "bench/bench-0000", Index: 2}},
		{"client egress to the server", client.Egress, "10.244.0.3", dataPort, dppolicy.Verdict{Allowed: true, Policy: "bench/bench-0000", Index: 1}},
		{"server ingress from a peer", server.Ingress, "10.244.0.4", 3001,
			dppolicy.Verdict{Tier: dppolicy.TierAdmin, Policy: "bench-0001", Action: dppolicy.Deny}},
	} {
		v := c.d.Judge(netip.MustParseAddr(c.peer), dppolicy.TCP, c.port)
		passed := v.Passed != nil && v.Passed.Policy == "bench-0000"
		v.Passed = nil
		if v != c.want || passed != (c.want.Tier == dppolicy.TierNetworkPolicy) {
			t.Errorf("%s: %+v (passed by bench-0000: %v), want %+v", c.what, v, passed, c.want)
		}
	}
}

func tierPolicies(rules []dppolicy.TierRule) map[string]bool {
	out := map[string]bool{}
	for _, r := range rules {
		out[r.Policy] = true
	}
	return out
}
