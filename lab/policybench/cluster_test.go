package policybench

import (
	"net/netip"
	"reflect"
	"testing"

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
