package agent

// The agent's metrics against the fake datapath: what each counter of the
// eBPF programs becomes, that a failed read leaves its metrics out, that
// policy totals never go down, and the CNI requests' counters.

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/onc-net/onc/agent/flows"
	"github.com/onc-net/onc/agent/policy"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/bypass"
	"github.com/onc-net/onc/datapath/fastpath"
	dppolicy "github.com/onc-net/onc/datapath/policy"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
)

// fakeFastPath has the counters and cache sizes a test gives it; err
// fails both reads.
type fakeFastPath struct {
	datapath.FastPath // the rest: the metrics call nothing else
	stats             []fastpath.Stat
	events            []fastpath.Stat // flows_stat
	entries           map[string]int
	err               error
}

func (f *fakeFastPath) Stats() ([]fastpath.Stat, error)       { return f.stats, f.err }
func (f *fakeFastPath) CacheEntries() (map[string]int, error) { return f.entries, f.err }
func (f *fakeFastPath) EventStats() ([]fastpath.Stat, error)  { return f.events, f.err }

// scrape serves the agent's metrics, as onc-agent does, and reads them
// over HTTP, parsed and checked by promtool.
func (ta *testAgent) scrape(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	if ta.metrics.address() == "" {
		if err := ta.ServeMetrics(t.Context(), "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	families := testutil.ScrapeMetrics(t, "http://"+ta.metrics.address()+"/metrics")
	// Served anyway, without what failed: gathering again says if anything did.
	if _, err := ta.metrics.reg.Gather(); err != nil {
		t.Fatalf("gathering failed: %v", err)
	}
	return families
}

// want checks one counter or gauge; labels alternate names and values.
func want(t *testing.T, mfs map[string]*dto.MetricFamily, family string, v float64, labels ...string) {
	t.Helper()
	ls := map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		ls[labels[i]] = labels[i+1]
	}
	if got, ok := testutil.MetricValue(mfs, family, ls); !ok || got != v {
		t.Errorf("%s%v = %v (present: %v), want %v", family, ls, got, ok, v)
	}
}

// enumCounters names the counters of a C enum as Stats does (bpf.Counter).
func enumCounters(t *testing.T, load func() (*ebpf.CollectionSpec, error), enum, prefix string) []string {
	t.Helper()
	spec, err := load()
	if err != nil {
		t.Fatal(err)
	}
	var e *btf.Enum
	if err := spec.Types.TypeByName(enum, &e); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range e.Values {
		if !strings.HasSuffix(v.Name, "_MAX") { // the count, not a counter
			names = append(names, strings.ToLower(strings.TrimPrefix(v.Name, prefix)))
		}
	}
	return names
}

type sampleFunc = func(bpf.Counter) (*prometheus.Desc, []string)

// Every counter of the fast path's enum becomes a sample; those of the
// socket LB and the bypass that docs/metrics.md lists do, and nothing else.
func TestMetricsMapTheProgramsCounters(t *testing.T) {
	for _, c := range []struct {
		sample  sampleFunc
		counter string
		desc    *prometheus.Desc
		labels  []string
	}{
		{fastPathSample, "egress_hit", descFastPathPackets, []string{"egress", "hit", "", "ipv4"}},
		{fastPathSample, "ingress_error", descFastPathPackets, []string{"ingress", "error", "", "ipv4"}},
		{fastPathSample, "egress_miss_tcp_flags", descFastPathPackets, []string{"egress", "miss", "tcp_flags", "ipv4"}},
		{fastPathSample, "ingress_miss_no_pod", descFastPathPackets, []string{"ingress", "miss", "no_pod", "ipv4"}},
		{fastPathSample, "learn_known", descFastPathLearn, []string{"known", "ipv4"}},
		{fastPathSample, "overlay_drop_inner_source", descOverlayDrops, []string{"inner_source"}},
		{fastPathSample, "overlay_drop_from_pod", descOverlayDrops, []string{"from_pod"}},
		{fastPathSample, "overlay_drop_other_interface", descOverlayDrops, []string{"other_interface"}},
		{fastPathSample, "overlay_drop_forwarded", descOverlayDrops, []string{"forwarded"}},
		{servicesSample, "connect_translated", descServicesTranslations, []string{"connect"}},
		{servicesSample, "sendmsg_refused", descServicesRefusals, []string{"sendmsg"}},
		{servicesSample, "connect6_translated", descServicesTranslations, []string{"connect6"}},
		{servicesSample, "sendmsg6_refused", descServicesRefusals, []string{"sendmsg6"}},
		{servicesSample, "recvmsg6_reversed", nil, nil},
		{servicesSample, "no_slot", nil, nil},
		{servicesSample, "recvmsg_reversed", nil, nil},
		{servicesSample, "uplink_fast_to_pod", descUplinkFast, []string{"to_pod", "ipv4"}},
		{servicesSample, "uplink6_fast_reply", descUplinkFast, []string{"reply", "ipv6"}},
		{servicesSample, "uplink6_learned", nil, nil},
		{servicesSample, "uplink_reversed", nil, nil},
		{servicesSample, "dsr_sent", descDSRPackets, []string{"sent", "ipv4"}},
		{servicesSample, "dsr6_drop_client", descDSRPackets, []string{"drop_client", "ipv6"}},
		{servicesSample, "uplink6_reversed", nil, nil},
		{bypassSample, "redirected_msgs", descBypassMessages, nil},
		{bypassSample, "redirected_bytes", descBypassBytes, nil},
		{bypassSample, "fallback_peer_full", descBypassFallbacks, []string{"peer_full"}},
		{bypassSample, "stack_msgs", nil, nil},
	} {
		family := ""
		if c.desc == descFastPathPackets || c.desc == descFastPathLearn {
			family = "ipv4"
		}
		if d, labels := c.sample(bpf.Counter{Name: c.counter, Family: family}); d != c.desc || !slices.Equal(labels, c.labels) {
			t.Errorf("%s: %v %q, want %v %q", c.counter, d, labels, c.desc, c.labels)
		}
	}

	// The enums as compiled: a counter added to the C is exported (the fast
	// path's) or must be looked at here.
	for _, name := range enumCounters(t, bpf.LoadFastpath, "onc_stat", "STAT_") {
		if d, _ := fastPathSample(bpf.Counter{Name: name}); d == nil {
			t.Errorf("fast-path counter %s is not exported", name)
		}
	}
	exported := map[*prometheus.Desc]int{}
	for _, src := range []struct {
		sample       sampleFunc
		load         func() (*ebpf.CollectionSpec, error)
		enum, prefix string
	}{
		{servicesSample, bpf.LoadServices, "lb_stat", "LB_STAT_"},
		{servicesSample, bpf.LoadServices, "lb6_stat", "LB_STAT_"},
		{servicesSample, bpf.LoadServices, "lb_uplink_stat", "LB_STAT_"},
		{servicesSample, bpf.LoadServices, "lb6_uplink_fast_stat", "LB_STAT_"},
		{servicesSample, bpf.LoadServices, "lb_dsr_stat", "LB_STAT_"},
		{servicesSample, bpf.LoadServices, "lb6_dsr_stat", "LB_STAT_"},
		{bypassSample, bpf.LoadBypass, "bp_stat", "BP_STAT_"},
	} {
		for _, name := range enumCounters(t, src.load, src.enum, src.prefix) {
			if d, _ := src.sample(bpf.Counter{Name: name}); d != nil {
				exported[d]++
			}
		}
	}
	for d, n := range map[*prometheus.Desc]int{descServicesTranslations: 4, descServicesRefusals: 4, descUplinkFast: 8, descDSRPackets: 20,
		descBypassMessages: 1, descBypassBytes: 1, descBypassFallbacks: 5} {
		if exported[d] != n {
			t.Errorf("%v: %d counters of the enums, want %d", d, exported[d], n)
		}
	}
}

func TestMetricsReadTheAgentAndTheKernelAtScrape(t *testing.T) {
	ta := newTestAgent(t)
	ta.addNode(t, "node-b", "192.0.2.2", "10.244.2.0/24", true)
	ta.addNode(t, "node-c", "192.0.2.3", "", true) // no pod CIDR yet: pending
	mfs := ta.scrape(t)
	want(t, mfs, "onc_agent_ready", 0)
	if _, ok := mfs["onc_pods"]; ok {
		t.Error("onc_pods before the pod state is loaded")
	}

	ta.bringUp(t, "10.244.1.0/24")
	ta.mustAdd(t, "c1", "/ns/c1")
	ta.dp.mu.Lock()
	ta.dp.fp = &fakeFastPath{
		stats: []fastpath.Stat{{Name: "egress_hit", Family: "ipv4", Value: 7}, {Name: "egress_miss_flow", Family: "ipv4", Value: 3},
			{Name: "learn_egress", Family: "ipv4", Value: 2}, {Name: "egress_hit", Family: "ipv6", Value: 5}},
		entries: map[string]int{"filter": 4, "egress": 1, "encap": 1, "local": 1},
		events:  []fastpath.Stat{{Name: "emitted", Value: 9}, {Name: "suppressed", Value: 4}},
	}
	ta.dp.mu.Unlock()
	bp := ta.withBypass(bypass.Config{})
	bp.stats = []bpf.Counter{{Name: "redirected_msgs", Value: 10}, {Name: "redirected_bytes", Value: 1000},
		{Name: "fallback_small", Value: 1}, {Name: "stack_msgs", Value: 5}}

	mfs = ta.scrape(t)
	want(t, mfs, "onc_agent_ready", 1)
	want(t, mfs, "onc_pods", 1)
	want(t, mfs, "onc_peers", 1, "state", "programmed")
	want(t, mfs, "onc_peers", 1, "state", "pending")
	want(t, mfs, "onc_fastpath_packets_total", 7, "program", "egress", "result", "hit", "reason", "", "family", "ipv4")
	want(t, mfs, "onc_fastpath_packets_total", 5, "program", "egress", "result", "hit", "reason", "", "family", "ipv6")
	want(t, mfs, "onc_fastpath_packets_total", 3, "program", "egress", "result", "miss", "reason", "flow", "family", "ipv4")
	want(t, mfs, "onc_fastpath_learn_total", 2, "event", "egress", "family", "ipv4")
	want(t, mfs, "onc_fastpath_cache_entries", 4, "map", "filter")
	want(t, mfs, "onc_flows_events_total", 9, "outcome", "emitted")
	want(t, mfs, "onc_flows_events_total", 4, "outcome", "suppressed")
	want(t, mfs, "onc_bypass_redirected_messages_total", 10)
	want(t, mfs, "onc_bypass_redirected_bytes_total", 1000)
	want(t, mfs, "onc_bypass_fallbacks_total", 1, "reason", "small")
	want(t, mfs, "onc_scrape_errors_total", 0, "source", sourceFastPath)
	for _, family := range []string{"onc_services_translations_total", "onc_policy_connections_total"} {
		if _, ok := mfs[family]; ok {
			t.Errorf("%s without the socket LB or policy", family)
		}
	}
	if _, ok := mfs["go_goroutines"]; !ok {
		t.Error("no Go runtime metrics")
	}
}

// A counter read that fails leaves out that source's metrics, and only
// those: never zeros in their place.
func TestMetricsFailedReadEmitsNothing(t *testing.T) {
	ta := newTestAgent(t)
	ta.bringUp(t, "10.244.1.0/24")
	ta.dp.mu.Lock()
	ta.dp.fp = &fakeFastPath{stats: []fastpath.Stat{{Name: "egress_hit", Value: 7}}, err: errors.New("map read failed")}
	ta.dp.mu.Unlock()
	ta.withBypass(bypass.Config{}).stats = []bpf.Counter{{Name: "redirected_msgs", Value: 10}}

	mfs := ta.scrape(t)
	for _, family := range []string{"onc_fastpath_packets_total", "onc_fastpath_learn_total", "onc_fastpath_cache_entries"} {
		if _, ok := mfs[family]; ok {
			t.Errorf("%s despite the failed read: %v", family, mfs[family])
		}
	}
	want(t, mfs, "onc_scrape_errors_total", 1, "source", sourceFastPath)
	want(t, mfs, "onc_scrape_errors_total", 1, "source", sourceCache)
	want(t, mfs, "onc_bypass_redirected_messages_total", 10)
	want(t, mfs, "onc_pods", 0)
}

// A thing's counters reset when it leaves (a pod, a Service); the totals
// go on.
func TestPolicyTotalsNeverGoDown(t *testing.T) {
	var p sums[string, string]
	steps := []struct {
		pods map[string]map[string]uint64
		want map[string]uint64
	}{
		{map[string]map[string]uint64{"a": {"in": 5, "out": 1}, "b": {"in": 2}}, map[string]uint64{"in": 7, "out": 1}},
		{map[string]map[string]uint64{"a": {"in": 6, "out": 1}}, map[string]uint64{"in": 8, "out": 1}},                        // b went
		{map[string]map[string]uint64{"a": {"in": 1}, "b": {"denied": 3}}, map[string]uint64{"in": 9, "out": 1, "denied": 3}}, // a came back anew
	}
	for i, s := range steps {
		if got := p.add(s.pods); !maps.Equal(got, s.want) {
			t.Errorf("step %d: totals %v, want %v", i, got, s.want)
		}
	}
}

// Audit counts go to the policies auditing the pod's direction when they
// were counted; a policy's series goes when it audits no pod.
func TestAuditTotalsFollowThePolicies(t *testing.T) {
	at := byPolicy{counters: auditCounters}
	pod := func(key string, in, eg []string) dppolicy.Pod {
		p := dppolicy.Pod{Key: key}
		if in != nil {
			p.AuditIngress = &dppolicy.Direction{Policies: in}
		}
		if eg != nil {
			p.AuditEgress = &dppolicy.Direction{Policies: eg}
		}
		return p
	}
	series := func(pol, dir, verdict string) policyTotal { return policyTotal{"x", pol, "", dir, verdict} }
	steps := []struct {
		pods     []dppolicy.Pod
		counters map[string]dppolicy.Counters
		want     map[policyTotal]uint64
	}{{
		pods:     []dppolicy.Pod{pod("x/a", []string{"x/p"}, nil), pod("x/b", []string{"x/p"}, []string{"x/q"})},
		counters: map[string]dppolicy.Counters{"x/a": {IngressWouldDeny: 5}, "x/b": {IngressWouldDeny: 2, EgressWouldAllow: 1, EgressDenied: 9}},
		want: map[policyTotal]uint64{series("p", "ingress", "would_deny"): 7, series("p", "ingress", "would_allow"): 0,
			series("q", "egress", "would_deny"): 0, series("q", "egress", "would_allow"): 1},
	}, {
		// x/r joins x/p on a: only what a counts from now on is x/r's.
		pods:     []dppolicy.Pod{pod("x/a", []string{"x/p", "x/r"}, nil), pod("x/b", []string{"x/p"}, []string{"x/q"})},
		counters: map[string]dppolicy.Counters{"x/a": {IngressWouldDeny: 8}, "x/b": {IngressWouldDeny: 2, EgressWouldAllow: 1}},
		want: map[policyTotal]uint64{series("p", "ingress", "would_deny"): 10, series("p", "ingress", "would_allow"): 0,
			series("r", "ingress", "would_deny"): 3, series("r", "ingress", "would_allow"): 0,
			series("q", "egress", "would_deny"): 0, series("q", "egress", "would_allow"): 1},
	}, {
		// b's egress audit goes (x/q with it), and b's counters reset
		// (it was recreated).
		pods:     []dppolicy.Pod{pod("x/a", []string{"x/p", "x/r"}, nil), pod("x/b", []string{"x/p"}, nil)},
		counters: map[string]dppolicy.Counters{"x/a": {IngressWouldDeny: 8}, "x/b": {IngressWouldDeny: 1}},
		want: map[policyTotal]uint64{series("p", "ingress", "would_deny"): 11, series("p", "ingress", "would_allow"): 0,
			series("r", "ingress", "would_deny"): 3, series("r", "ingress", "would_allow"): 0},
	}}
	for i, s := range steps {
		if got := at.add(dppolicy.Ruleset{Pods: s.pods}, s.counters); !maps.Equal(got, s.want) {
			t.Errorf("step %d: totals %v, want %v", i, got, s.want)
		}
	}
}

func TestMetricsCountCNIRequests(t *testing.T) {
	ta := newTestAgent(t)
	call := func(method string, r *apiv1.CNIRequest, h func(context.Context, *apiv1.CNIRequest) (*apiv1.CNIResponse, error)) {
		t.Helper()
		_, err := ta.metrics.observeCNI(ctx(t), r, &grpc.UnaryServerInfo{FullMethod: method},
			func(ctx context.Context, req any) (any, error) { return h(ctx, req.(*apiv1.CNIRequest)) })
		if err != nil {
			t.Fatal(err)
		}
	}
	call(apiv1.CNI_Add_FullMethodName, req("c1", ta.netns("/ns/c1")), ta.cni.Add) // not ready: 11
	ta.bringUp(t, "10.244.1.0/24")
	call(apiv1.CNI_Add_FullMethodName, req("c1", ta.netns("/ns/c1")), ta.cni.Add)
	call(apiv1.CNI_Del_FullMethodName, req("c1", "/ns/c1"), ta.cni.Del)

	mfs := ta.scrape(t)
	want(t, mfs, "onc_cni_requests_total", 1, "verb", "ADD", "code", "11")
	want(t, mfs, "onc_cni_requests_total", 1, "verb", "ADD", "code", "0")
	want(t, mfs, "onc_cni_requests_total", 1, "verb", "DEL", "code", "0")
	samples := map[string]uint64{}
	for _, m := range mfs["onc_cni_request_duration_seconds"].GetMetric() {
		samples[m.GetLabel()[0].GetValue()] = m.GetHistogram().GetSampleCount()
	}
	if want := map[string]uint64{"ADD": 2, "DEL": 1}; !maps.Equal(samples, want) {
		t.Errorf("onc_cni_request_duration_seconds samples by verb = %v, want %v", samples, want)
	}
}

func TestServeMetrics(t *testing.T) {
	ta := newTestAgent(t)
	st, err := ta.ctl.GetStatus(ctx(t), nil)
	if err != nil || st.MetricsAddr != "" || st.MetricsURL() != "" {
		t.Fatalf("status before ServeMetrics: %q %q %v", st.GetMetricsAddr(), st.MetricsURL(), err)
	}
	if err := ta.ServeMetrics(t.Context(), "127.0.0.1:0"); err != nil {
		t.Fatal(err)
	}
	st, _ = ta.ctl.GetStatus(ctx(t), nil)
	if !strings.HasPrefix(st.MetricsAddr, "127.0.0.1:") || st.MetricsAddr == "127.0.0.1:0" {
		t.Fatalf("status: metrics_addr %q, want the port bound", st.MetricsAddr)
	}
	resp, err := http.Get("http://" + st.MetricsAddr + "/healthz")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("/healthz: %v %v", resp, err)
	}
	resp.Body.Close()
	if err := ta.ServeMetrics(t.Context(), st.MetricsAddr); err == nil {
		t.Fatal("a second server on the same address started")
	}
}

// The export's counters, by exporter and reason.
func TestMetricsCountTheExport(t *testing.T) {
	ta := newTestAgent(t)
	store := flows.NewStore(4)
	exports, err := flows.NewExporters(store, flows.ExportConfig{File: filepath.Join(t.TempDir(), "flows.jsonl")})
	if err != nil {
		t.Fatal(err)
	}
	ta.exports = exports
	go exports[0].Run(t.Context())
	store.Add(flows.Record{Time: time.Now(), Event: flows.EventPolicy})
	testutil.WaitFor(t, "the record exported", 5*time.Second, func() bool { return exports[0].Exported() == 1 })
	mfs := ta.scrape(t)
	want(t, mfs, "onc_flows_exported_total", 1, "exporter", "file")
	want(t, mfs, "onc_flows_export_lost_total", 0, "exporter", "file", "reason", "queue_full")
	want(t, mfs, "onc_flows_export_lost_total", 0, "exporter", "file", "reason", "failed")
}

// Denied packets count for each policy isolating the pod in that
// direction when scraped, from what the pod's counter grew by since the
// scrape before: a policy that comes later does not inherit the pod's
// earlier denials, and a series goes with the last pod its policy
// isolates.
func TestDeniedByPolicy(t *testing.T) {
	d := byPolicy{counters: deniedCounters}
	in := func(policies ...string) *dppolicy.Direction { return &dppolicy.Direction{Policies: policies} }
	steps := []struct {
		rs   dppolicy.Ruleset
		pods map[string]dppolicy.Counters
		want map[policyTotal]uint64
	}{
		{dppolicy.Ruleset{Pods: []dppolicy.Pod{{Key: "x/a", Ingress: in("x/p", "x/q")}, {Key: "x/b", Egress: in("x/p")}}},
			map[string]dppolicy.Counters{"x/a": {IngressDenied: 5, EgressDenied: 7}, "x/b": {EgressDenied: 2}},
			map[policyTotal]uint64{{"x", "p", "NetworkPolicy", "ingress", ""}: 5, {"x", "q", "NetworkPolicy", "ingress", ""}: 5, {"x", "p", "NetworkPolicy", "egress", ""}: 2}},
		// x/r isolates a's egress now: only what came since counts for it.
		{dppolicy.Ruleset{Pods: []dppolicy.Pod{{Key: "x/a", Ingress: in("x/p", "x/q"), Egress: in("x/r")}, {Key: "x/b", Egress: in("x/p")}}},
			map[string]dppolicy.Counters{"x/a": {IngressDenied: 6, EgressDenied: 10}, "x/b": {EgressDenied: 2}},
			map[policyTotal]uint64{{"x", "p", "NetworkPolicy", "ingress", ""}: 6, {"x", "q", "NetworkPolicy", "ingress", ""}: 6, {"x", "p", "NetworkPolicy", "egress", ""}: 2, {"x", "r", "NetworkPolicy", "egress", ""}: 3}},
		// b went, and a's counters reset (it left and came back).
		{dppolicy.Ruleset{Pods: []dppolicy.Pod{{Key: "x/a", Ingress: in("x/q")}}},
			map[string]dppolicy.Counters{"x/a": {IngressDenied: 1}},
			map[policyTotal]uint64{{"x", "q", "NetworkPolicy", "ingress", ""}: 7}},
	}
	for i, s := range steps {
		if got := d.add(s.rs, s.pods); !maps.Equal(got, s.want) {
			t.Errorf("step %d: %v, want %v", i, got, s.want)
		}
	}
}

// The base chains' drops are served by reason.
func TestPolicyDropsServed(t *testing.T) {
	ta, _ := newPolicyAgent(t, policy.Snapshot{})
	ta.policyDP.mu.Lock()
	ta.policyDP.counts = dppolicy.Counts{Drops: map[string]uint64{"spoof": 3, "invalid": 0, "nosyn": 1}}
	ta.policyDP.mu.Unlock()
	mfs := ta.scrape(t)
	want(t, mfs, "onc_policy_dropped_packets_total", 3, "reason", "spoof")
	want(t, mfs, "onc_policy_dropped_packets_total", 0, "reason", "invalid")
	want(t, mfs, "onc_policy_dropped_packets_total", 1, "reason", "nosyn")
}

// A ClusterNetworkPolicy counts a pod's denied packets, named without a
// namespace and with its tier, where it has a Deny rule for the pod:
// Admin's always, Baseline's only where no NetworkPolicy isolates the pod
// (Judge never reaches them otherwise); Accept and Pass rules deny
// nothing, and a policy counts once however many rules it has.
func TestDeniedByClusterPolicy(t *testing.T) {
	d := byPolicy{counters: deniedCounters}
	rule := func(pol string, a dppolicy.Action) dppolicy.TierRule {
		return dppolicy.TierRule{Policy: pol, Action: a}
	}
	admin := []dppolicy.TierRule{rule("deny-all", dppolicy.Deny), rule("deny-all", dppolicy.Deny), rule("let", dppolicy.Accept), rule("pass", dppolicy.Pass)}
	baseline := []dppolicy.TierRule{rule("base-deny", dppolicy.Deny), rule("base-ok", dppolicy.Accept)}
	rs := dppolicy.Ruleset{Pods: []dppolicy.Pod{
		{Key: "x/a", Ingress: &dppolicy.Direction{ClusterOnly: true, Admin: admin, Baseline: baseline}},
		{Key: "x/b", Egress: &dppolicy.Direction{Policies: []string{"x/np"}, Admin: admin, Baseline: baseline}},
	}}
	got := d.add(rs, map[string]dppolicy.Counters{"x/a": {IngressDenied: 4}, "x/b": {EgressDenied: 3}})
	want := map[policyTotal]uint64{
		{"", "deny-all", "Admin", "ingress", ""}: 4, {"", "base-deny", "Baseline", "ingress", ""}: 4,
		{"", "deny-all", "Admin", "egress", ""}: 3, {"x", "np", "NetworkPolicy", "egress", ""}: 3,
	}
	if !maps.Equal(got, want) {
		t.Errorf("%v, want %v", got, want)
	}
}
