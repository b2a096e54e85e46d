package agent

import (
	"net/netip"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onc-net/onc/agent/flows"
	dppolicy "github.com/onc-net/onc/datapath/policy"
	"github.com/onc-net/onc/internal/testutil"
)

// A drop naming pod c of this node, count times.
func (ta *testAgent) drops(t *testing.T, c string, count int) {
	t.Helper()
	pod := flows.Endpoint{Kind: flows.KindPod, Namespace: "default", Name: c, Node: self, Addr: netip.AddrPortFrom(ta.podIP(t, c), 80)}
	for range count {
		ta.flows.Add(flows.Record{Time: time.Now(), Event: flows.EventPolicy, Verdict: flows.VerdictDenied, Direction: "ingress", Dst: pod,
			Src: flows.Endpoint{Kind: flows.KindIP, Addr: netip.MustParseAddrPort("192.0.2.9:40000")}})
	}
	ta.flows.Add(flows.Record{Time: time.Now(), Event: flows.EventDrop, Verdict: flows.VerdictDropped, Cause: "spoof", Src: pod})
}

// onc_pod_drops_total names at most --flows-top-pods pods, those with
// the most drops, by reason; a pod that went leaves its place.
func TestPodDropsTopN(t *testing.T) {
	ta := newTestAgent(t, func(c *Config) { c.FlowsBuffer, c.FlowsTopPods = 64, 2 })
	ta.bringUp(t, "10.244.7.0/24")
	for i, c := range []string{"c1", "c2", "c3"} {
		ta.mustAdd(t, c, "/ns/"+c)
		ta.drops(t, c, i+1)
	}
	mfs := ta.scrape(t)
	if n := len(mfs["onc_pod_drops_total"].GetMetric()); n != 4 {
		t.Fatalf("%d series of 3 pods dropping, want 4: 2 pods, 2 reasons each", n)
	}
	want(t, mfs, "onc_pod_drops_total", 3, "namespace", "default", "pod", "c3", "reason", "policy")
	want(t, mfs, "onc_pod_drops_total", 1, "namespace", "default", "pod", "c3", "reason", "spoof")
	want(t, mfs, "onc_pod_drops_total", 2, "namespace", "default", "pod", "c2", "reason", "policy")
	if r, err := ta.cni.Del(ctx(t), req("c3", "/ns/c3")); code(t, r, err) != 0 {
		t.Fatal("DEL c3")
	}
	mfs = ta.scrape(t)
	want(t, mfs, "onc_pod_drops_total", 1, "namespace", "default", "pod", "c1", "reason", "policy")
	if v, ok := testutil.MetricValue(mfs, "onc_pod_drops_total", map[string]string{"namespace": "default", "pod": "c3", "reason": "policy"}); ok {
		t.Fatalf("c3 went, yet its drops are served: %v", v)
	}
}

// The flow events name an address of this node's pod as that pod, though
// the cluster's pods still show another node's terminating pod there.
func TestFlowEventsNameLocalPodsFirst(t *testing.T) {
	ta := newTestAgent(t, func(c *Config) { c.FlowsBuffer = 8 })
	ta.bringUp(t, "10.244.7.0/24")
	ta.mustAdd(t, "c1", "/ns/1")
	ip := ta.podIP(t, "c1")
	gone := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "old", Name: "gone", DeletionTimestamp: &metav1.Time{Time: time.Now()}},
		Spec: corev1.PodSpec{NodeName: "n2"}, Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip.String()}}}}
	ta.recorder = flows.NewRecorder(ta.flows, self, func() dppolicy.Ruleset { return dppolicy.Ruleset{} }, nil, func() []*corev1.Pod { return []*corev1.Pod{gone} })
	res := ta.flowResolver()
	if e, ok := res.Pod(ip); !ok || e.Namespace != "default" || e.Name != "c1" || e.Node != self {
		t.Fatalf("%s named %+v, want this node's default/c1", ip, e)
	}
	if r, err := ta.cni.Del(ctx(t), req("c1", "/ns/1")); code(t, r, err) != 0 {
		t.Fatal("DEL c1")
	}
	if e, ok := res.Pod(ip); !ok || e.Name != "gone" {
		t.Fatalf("after c1 went: %+v, want the cluster's old/gone", e)
	}
}
