//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	dto "github.com/prometheus/client_model/go"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// After cross-node TCP, every agent's and the controller's /metrics,
// scraped from inside their namespaces, parse and pass promtool, and say
// what onctl stats and the lab say: each fast-path counter between two
// reads of onctl stats (the hits equal to both: nothing hits at rest), the
// lab's pods, peers and ADDs, and one allocated CIDR per node.
func TestMetricsInTheLab(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 3, PodsPerNode: 2})
	ctx := context.Background()
	a, b := l.Nodes[0].Pods[0], l.Nodes[1].Pods[0]
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9000))
	c := dial(t, a.Netns, "tcp4", b.IP, 9000)
	if err := rr(c, 1000); err != nil {
		t.Fatal(err)
	}
	c.Close()
	for _, n := range l.Nodes {
		settled(t, n)
	}

	targets, err := l.MetricsTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(targets) != len(l.Nodes)+1 {
		t.Fatalf("metrics targets %v: want every agent's and the controller's", targets)
	}
	for i, n := range l.Nodes {
		before := stats(t, n)
		mfs := scrape(t, targets[i])
		after := stats(t, n)
		got := fastPathCounters(t, mfs)
		between(t, n.Name, got, before, after)
		if len(got) != len(after) {
			t.Errorf("%s: %d fast-path counters in the metrics, onctl stats has %d", n.Name, len(got), len(after))
		}
		for _, name := range []string{"egress_hit", "ingress_hit", "egress_error", "ingress_error"} {
			if got[name] != before[name] || got[name] != after[name] {
				t.Errorf("%s: %s = %d in the metrics, onctl stats %d then %d: they must agree at rest", n.Name, name, got[name], before[name], after[name])
			}
		}
		pods := float64(len(n.Pods))
		wantValues(t, n.Name, mfs, []metricWant{
			{"onc_agent_ready", nil, 1},
			{"onc_pods", nil, pods},
			{"onc_peers", map[string]string{"state": "programmed"}, float64(len(l.Nodes) - 1)},
			{"onc_peers", map[string]string{"state": "pending"}, 0},
			{"onc_fastpath_cache_entries", map[string]string{"map": "local"}, pods},
			{"onc_cni_requests_total", map[string]string{"verb": "ADD", "code": "0"}, pods},
		})
	}
	// The flow's hits: both programs on both of its nodes.
	for _, n := range l.Nodes[:2] {
		if s := stats(t, n); s["egress_hit"] < 900 || s["ingress_hit"] < 900 {
			t.Errorf("%s: %d egress and %d ingress hits for 1000 exchanges", n.Name, s["egress_hit"], s["ingress_hit"])
		}
	}

	blocks := float64(1 << (24 - 16)) // the lab's 10.244.0.0/16 in /24s
	wantValues(t, "controller", scrape(t, targets[len(l.Nodes)]), []metricWant{
		{"onc_controller_cidrs", map[string]string{"family": "ipv4", "state": "allocated"}, float64(len(l.Nodes))},
		{"onc_controller_cidrs", map[string]string{"family": "ipv4", "state": "free"}, blocks - float64(len(l.Nodes))},
		{"onc_controller_leader", nil, 1},
		{"onc_controller_datastore_errors_total", nil, 0},
	})
}

// On Kubernetes, after a connection NetworkPolicy allows and one it denies
// (the allowed one carried by the intra-node bypass) and a connect() to a
// Service without endpoints, the policy, socket-LB and bypass metrics lie
// between two reads of onctl policy, services and bypass around the scrape.
func TestMetricsPolicyServicesBypass(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 1, Datastore: "kubernetes"})
	ctx := context.Background()
	n, api := l.Nodes[0], agent(t, l.Nodes[0])
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "metrics"
	client, server := clientServer(t, l, n, ns)
	bypasstest.ServeEcho(listenTCP(t, server.Netns, 9000))
	listenTCP(t, server.Netns, 9001)

	// The server takes TCP 9000 only.
	pol := netpol(ns, "server", sel("app", "server"), ingressOnly, ingressRule(nil, port(corev1.ProtocolTCP, 9000)), nil)
	if _, err := kube.NetworkingV1().NetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the server isolated for ingress", 15*time.Second, func() bool {
		resp, err := api.ListPolicy(ctx, &apiv1.ListPolicyRequest{Pod: server.Key()})
		return err == nil && len(resp.Pods) == 1 && resp.Pods[0].Ingress.GetIsolated()
	})
	if _, err := api.SetBypass(ctx, &apiv1.SetBypassRequest{Mode: "on"}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, client.Netns, "tcp4", server.IP, 9000)
	if err := rr(c, 100); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := lab.InNetns(client.Netns, func() error {
		c, err := net.DialTimeout("tcp4", netip.AddrPortFrom(server.IP, 9001).String(), 500*time.Millisecond)
		if err == nil {
			c.Close()
			return errors.New("the policy let a connection to port 9001 through")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	svc, err := kube.CoreV1().Services(ns).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "empty", Namespace: ns},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Protocol: corev1.ProtocolTCP, Port: 80}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	testutil.WaitFor(t, "the Service balanced", 15*time.Second, func() bool {
		resp, err := api.ListServices(ctx, &apiv1.ListServicesRequest{})
		return err == nil && findService(resp, vip.String(), "TCP") != nil
	})
	if _, _, err := connectTCP(client.Netns, vip); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("connect to a Service without endpoints: %v, want ECONNREFUSED", err)
	}

	// onctl's counters, named as the metrics' samples are below.
	read := func() map[string]uint64 {
		out := map[string]uint64{}
		pol, err := api.ListPolicy(ctx, &apiv1.ListPolicyRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range pol.Pods {
			for dir, d := range map[string]*apiv1.PolicyDirection{"ingress": p.Ingress, "egress": p.Egress} {
				out["policy_"+dir+"_allowed"] += d.GetAllowed()
				out["policy_"+dir+"_denied"] += d.GetDenied()
			}
		}
		svcs, err := api.ListServices(ctx, &apiv1.ListServicesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		bp, err := api.ListBypass(ctx, &apiv1.ListBypassRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, ctr := range append(svcs.Counters, bp.Counters...) {
			out[ctr.Program+"_"+ctr.Name] = ctr.Value
		}
		return out
	}
	targets, err := l.MetricsTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	before := read()
	mfs := scrape(t, targets[0])
	after := read()
	got := map[string]uint64{}
	samples(mfs, got, "onc_policy_connections_total", func(l map[string]string) string { return "policy_" + l["direction"] + "_" + l["verdict"] })
	samples(mfs, got, "onc_services_translations_total", func(l map[string]string) string { return "services_" + l["hook"] + "_translated" })
	samples(mfs, got, "onc_services_refusals_total", func(l map[string]string) string { return "services_" + l["hook"] + "_refused" })
	samples(mfs, got, "onc_bypass_redirected_messages_total", func(map[string]string) string { return "bypass_redirected_msgs" })
	samples(mfs, got, "onc_bypass_redirected_bytes_total", func(map[string]string) string { return "bypass_redirected_bytes" })
	samples(mfs, got, "onc_bypass_fallbacks_total", func(l map[string]string) string { return "bypass_fallback_" + l["reason"] })
	between(t, n.Name, got, before, after)
	for name, least := range map[string]uint64{"policy_ingress_allowed": 1, "policy_ingress_denied": 1,
		"services_connect_refused": 1, "bypass_redirected_msgs": 100, "bypass_redirected_bytes": 100 * 100} {
		if got[name] < least {
			t.Errorf("%s = %d in the metrics, want at least %d (onctl: %d)", name, got[name], least, after[name])
		}
	}
	// Policy 4; the socket LB's hooks connect, sendmsg, connect6 and
	// sendmsg6, translated and refused, 8; bypass 2 and 5.
	if len(got) != 4+8+2+5 {
		t.Errorf("policy, socket-LB and bypass samples: %v", got)
	}
}

// scrape reads and checks one daemon's metrics (testutil.ParseMetrics).
func scrape(t *testing.T, target lab.MetricsTarget) map[string]*dto.MetricFamily {
	t.Helper()
	body, err := target.Scrape(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return testutil.ParseMetrics(t, body)
}

type metricWant struct {
	family string
	labels map[string]string
	want   float64
}

func wantValues(t *testing.T, who string, mfs map[string]*dto.MetricFamily, wants []metricWant) {
	t.Helper()
	for _, w := range wants {
		if got, ok := testutil.MetricValue(mfs, w.family, w.labels); !ok || got != w.want {
			t.Errorf("%s: %s%v = %v (present: %v), want %v", who, w.family, w.labels, got, ok, w.want)
		}
	}
}

// samples adds each counter sample of family to into, under the name of
// the onctl counter it comes from (name, from its labels).
func samples(mfs map[string]*dto.MetricFamily, into map[string]uint64, family string, name func(labels map[string]string) string) {
	for _, m := range mfs[family].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		into[name(labels)] = uint64(m.GetCounter().GetValue())
	}
}

// fastPathCounters names each fast-path sample as onctl stats names its
// counter (egress_hit, ingress_miss_flow, learn_known, overlay_drop_from_pod).
func fastPathCounters(t *testing.T, mfs map[string]*dto.MetricFamily) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	samples(mfs, out, "onc_fastpath_packets_total", func(l map[string]string) string {
		if l["result"] == "miss" {
			return lab.CounterKey(l["family"], l["program"], "miss_"+l["reason"])
		}
		if l["reason"] != "" {
			t.Errorf("a %s sample with reason %q", l["result"], l["reason"])
		}
		return lab.CounterKey(l["family"], l["program"], l["result"])
	})
	samples(mfs, out, "onc_fastpath_learn_total", func(l map[string]string) string { return lab.CounterKey(l["family"], "learn", l["event"]) })
	samples(mfs, out, "onc_overlay_dropped_packets_total", func(l map[string]string) string { return "overlay_drop_" + l["reason"] })
	return out
}

// between checks that each counter of got is one of onctl's, between its
// value before and after the scrape.
func between(t *testing.T, who string, got, before, after map[string]uint64) {
	t.Helper()
	for name, v := range got {
		if _, ok := after[name]; !ok {
			t.Errorf("%s: %s = %d in the metrics, onctl has no such counter", who, name, v)
		} else if v < before[name] || v > after[name] {
			t.Errorf("%s: %s = %d in the metrics, %d and %d in onctl around the scrape", who, name, v, before[name], after[name])
		}
	}
}
