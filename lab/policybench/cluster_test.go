package policybench

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"

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
// change of cnp-0 rewrites the rules of its subjects (a third of the
// pods) and no others.
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
