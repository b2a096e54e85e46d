package agent

import (
	"context"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/datapath/policy"
	dpservices "github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/internal/metrics"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
)

// DefaultMetricsAddr is where the agent serves /metrics unless
// --metrics-addr says otherwise (docs/metrics.md). The agent runs in the
// host network: 9967 is clear of kube-proxy's, node-exporter's and
// Cilium's ports.
const DefaultMetricsAddr = ":9967"

// The agent's metrics (docs/metrics.md lists them). Everything but the CNI
// server's counters is read when scraped, so nothing polls and nothing
// can be stale.
var (
	descReady = prometheus.NewDesc("onc_agent_ready",
		"1 if the agent is ready to serve pods (onctl ready), else 0.", nil, nil)
	descPods = prometheus.NewDesc("onc_pods",
		"Pod attachments on this node.", nil, nil)
	descPeers = prometheus.NewDesc("onc_peers",
		"Other nodes by state: programmed (their routes and tunnel entries are in place), pending (registered, not programmed: no pod CIDR yet, or programming failed).",
		[]string{"state"}, nil)
	descFastPathPackets = prometheus.NewDesc("onc_fastpath_packets_total",
		"Packets the fast-path programs saw, by program (egress: from pods, ingress: from the uplink), result (hit; open: a SYN that opened its connection on the fast path; miss; error), reason of a miss, and family (ipv4, ipv6).",
		[]string{"program", "result", "reason", "family"}, nil)
	descOverlayDrops = prometheus.NewDesc("onc_overlay_dropped_packets_total",
		"VXLAN frames the overlay guard dropped, by reason: unknown_sender (not from a peer's tunnel endpoint), inner_source (a peer speaking for a source not its own), inner_destination (to neither a pod of this node nor the node), malformed (a fragment, IP options, a VLAN tag, another VNI or destination, an inner packet neither IPv4 nor IPv6), from_pod (a pod sending to the VXLAN port), other_interface (by another interface than the uplink), translated (led to the VXLAN port by address translation), forwarded (a VXLAN datagram this node would forward).",
		[]string{"reason"}, nil)
	descFastPathLearn = prometheus.NewDesc("onc_fastpath_learn_total",
		"Packets the learning programs saw, by event: egress and ingress taught the cache something, known were of a flow already learned, paused came while an eviction (a policy change, a peer or pod that went, a changed underlay, a flush) held learning; and by family (ipv4, ipv6).",
		[]string{"event", "family"}, nil)
	descCacheEntries = prometheus.NewDesc("onc_fastpath_cache_entries",
		"Entries of each fast-path cache map: filter (flows), egress (remote pods), encap (headers per node), local (local pods); filter6, egress6 and local6 the same for IPv6; egress6_u6 and encap_u6 over an IPv6 underlay.",
		[]string{"map"}, nil)
	descPolicy = prometheus.NewDesc("onc_policy_connections_total",
		"Connections this node's NetworkPolicy rules judged, by direction and verdict (each retransmitted attempt of a denied one counts).",
		[]string{"direction", "verdict"}, nil)
	descPolicyAudit = prometheus.NewDesc("onc_policy_audit_packets_total",
		"Packets audited NetworkPolicies (annotation onc.io/policy-mode: audit) would have treated otherwise, by the policy's namespace and name, direction and verdict: would_deny, let through and the audited policies would deny it (no enforcing policy isolates the pod there); would_allow, denied and a rule of the audited policies would allow it. A pod's packet counts for each audited policy of its direction; a policy's series goes when it audits no pod of this node.",
		[]string{"namespace", "policy", "direction", "verdict"}, nil)
	descPolicyDenied = prometheus.NewDesc("onc_policy_denied_packets_total",
		"Packets the rules of this node's pods denied (each retransmission counts), by each policy that can deny the pod's packets in that direction: its namespace (empty for a ClusterNetworkPolicy) and name, its tier (NetworkPolicy: one isolating the pod; Admin, Baseline: a ClusterNetworkPolicy with a Deny rule for the pod, Baseline's only where no NetworkPolicy isolates it), and direction: a packet counts once for each such policy. A series goes when its policy can deny no pod of this node.",
		[]string{"namespace", "policy", "tier", "direction"}, nil)
	descPolicyDropped = prometheus.NewDesc("onc_policy_dropped_packets_total",
		"Packets the policy table dropped before any pod's rules, by reason: spoof (from a pod, with a source address not its own), invalid (conntrack state invalid, to or from a pod), nosyn (a new TCP connection without a SYN, to or from an isolated pod).",
		[]string{"reason"}, nil)
	descServicesTranslations = prometheus.NewDesc("onc_services_translations_total",
		"Calls whose ClusterIP the socket load balancer translated to a backend, by hook (connect, sendmsg; connect6, sendmsg6 for AF_INET6 sockets).",
		[]string{"hook"}, nil)
	descServicesRefusals = prometheus.NewDesc("onc_services_refusals_total",
		"Calls the socket load balancer refused with ECONNREFUSED because the Service had no backend, by hook (connect, sendmsg; connect6, sendmsg6 for AF_INET6 sockets).",
		[]string{"hook"}, nil)
	descFrontends = prometheus.NewDesc("onc_services_frontends",
		"Service frontends this node serves, by type (ClusterIP, NodePort, ExternalIP, LoadBalancer, HostPort) and scope (socket: this node's clients; uplink: clients outside the cluster).",
		[]string{"frontend", "scope"}, nil)
	descFrontendConnections = prometheus.NewDesc("onc_services_frontend_connections_total",
		"Connections (and unconnected datagrams) to Service frontends, by frontend type, scope and outcome: translated to a backend, or refused for want of one.",
		[]string{"frontend", "scope", "outcome"}, nil)
	descUplinkFast = prometheus.NewDesc("onc_services_uplink_fast_packets_total",
		"Packets of flows from outside the cluster that skipped the node's stack, by direction: to_pod (handed into a backend's pod on this node), reply (its reply, sent out of the uplink), to_remote (sent over the overlay to a backend on another node), from_remote (that backend's reply, decapsulated and sent out of the uplink); and family (ipv4, ipv6).",
		[]string{"direction", "family"}, nil)
	descDSRPackets = prometheus.NewDesc("onc_services_dsr_packets_total",
		"Packets of flows from outside the cluster sent by direct server return, by event: sent (to a backend's node, by the node the client chose), received (by the backend's node), too_big, no_route and ttl_expired (dropped by the sender), drop_<reason> (a peer's frame refused: malformed, sender, client, backend, frontend); and by the client's family (ipv4, ipv6).",
		[]string{"event", "family"}, nil)
	descFlowRecords = prometheus.NewDesc("onc_flows_records_total",
		"Flow records the agent made (docs/observability.md): packets NetworkPolicy denied, and what audited policies would deny or allow, as the policy table logged them within its rates, and the eBPF programs' events.", nil, nil)
	descFlowEvents = prometheus.NewDesc("onc_flows_events_total",
		"The eBPF programs' flow events (docs/observability.md), by outcome: emitted (sent to the agent), suppressed (held back by --flows-events-rate), deduped (a drop of a flow and reason already reported within the second), lost (the ring was full: the agent fell behind).",
		[]string{"outcome"}, nil)
	descPodDrops = prometheus.NewDesc("onc_pod_drops_total",
		"Dropped packets of this node's pods as the flow records count them (docs/observability.md), for the --flows-top-pods pods with the most (the others left out until they are among them), by reason: policy (denied by NetworkPolicy), spoof, invalid, nosyn (the policy table's drops before any pod's rules), or the drop reason of an eBPF program, as its flow records name it.",
		[]string{"namespace", "pod", "reason"}, nil)
	descFlowsLost = prometheus.NewDesc("onc_flows_lost_total",
		"Times logged packets were lost before they became flow records: the kernel could not queue them to the agent (it fell behind; how many each time it does not say), or they (or the eBPF programs' events) could not be decoded. Normally 0.", nil, nil)
	descFlowsExported = prometheus.NewDesc("onc_flows_exported_total",
		"Flow records the export delivered, by exporter: file (JSON lines, or stdout), otlp (accepted by the OTLP receiver).",
		[]string{"exporter"}, nil)
	descFlowsExportLost = prometheus.NewDesc("onc_flows_export_lost_total",
		"Flow records the export lost, by exporter (file, otlp) and reason: queue_full (the exporter fell behind by a full queue of 4096), failed (the write failed, or the receiver refused them or stayed unavailable through 30 s of retries).",
		[]string{"exporter", "reason"}, nil)
	descBypassMessages = prometheus.NewDesc("onc_bypass_redirected_messages_total",
		"Messages the intra-node bypass queued straight onto the peer socket.", nil, nil)
	descBypassBytes = prometheus.NewDesc("onc_bypass_redirected_bytes_total",
		"Bytes the intra-node bypass queued straight onto the peer socket.", nil, nil)
	descBypassFallbacks = prometheus.NewDesc("onc_bypass_fallbacks_total",
		"Directions of bypass-recorded connections that took the TCP/IP stack, by reason (docs/bypass.md).",
		[]string{"reason"}, nil)
)

// Sources of onc_scrape_errors_total (metrics.NewScrapeErrors).
const (
	sourceFastPath = "fastpath"
	sourceCache    = "fastpath_cache"
	sourceServices = "services"
	sourceBypass   = "bypass"
	sourcePolicy   = "policy"
	sourceEvents   = "flow_events"
)

// agentMetrics is the agent's Prometheus side: its own registry, the CNI
// server's counters, and a collector for everything else.
type agentMetrics struct {
	a            *Agent
	reg          *prometheus.Registry
	cniRequests  *prometheus.CounterVec
	cniDuration  *prometheus.HistogramVec
	scrapeErrors *prometheus.CounterVec
	policy       sums[string, int] // by pod, of policySeries
	denied       byPolicy
	audit        byPolicy
	services     sums[dpservices.Key, frontendSeries]
	// registeredPeers is how many other nodes the peer watcher's last
	// reconcile read from the datastore.
	registeredPeers atomic.Int64

	mu   sync.Mutex
	addr string // where ServeMetrics listens; "" when it does not
}

func newAgentMetrics(a *Agent) *agentMetrics {
	m := &agentMetrics{a: a, reg: metrics.NewRegistry(), denied: byPolicy{counters: deniedCounters}, audit: byPolicy{counters: auditCounters},
		cniRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "onc_cni_requests_total",
			Help: "CNI requests the agent answered, by verb and CNI result code (0: success; docs/cni.md lists the others)."},
			[]string{"verb", "code"}),
		cniDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "onc_cni_request_duration_seconds",
			Help: "How long the agent took to answer a CNI request, by verb.",
			// ADD may wait up to 10 s for the pod's policy.
			Buckets: []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}},
			[]string{"verb"}),
		scrapeErrors: metrics.NewScrapeErrors(sourceFastPath, sourceCache, sourceServices, sourceBypass, sourcePolicy, sourceEvents),
	}
	m.reg.MustRegister(m, m.cniRequests, m.cniDuration)
	if a.peerCounts != nil {
		m.reg.MustRegister(a.peerCounts)
	}
	return m
}

// ServeMetrics serves the agent's metrics on addr until ctx ends
// (docs/metrics.md); "" serves none.
func (a *Agent) ServeMetrics(ctx context.Context, addr string) error {
	if addr == "" {
		return nil
	}
	bound, err := metrics.Serve(ctx, addr, a.metrics.reg)
	if err != nil {
		return err
	}
	a.metrics.mu.Lock()
	a.metrics.addr = bound
	a.metrics.mu.Unlock()
	slog.Info("serving metrics", "addr", bound)
	return nil
}

// address is where the metrics are served, for onctl status.
func (m *agentMetrics) address() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.addr
}

// observeCNI counts and times every CNI request, as the CNI server's
// interceptor.
func (m *agentMetrics) observeCNI(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	verb := strings.ToUpper(path.Base(info.FullMethod)) // "/onc.v1.CNI/Add": ADD
	m.cniDuration.WithLabelValues(verb).Observe(time.Since(start).Seconds())
	m.cniRequests.WithLabelValues(verb, cniCode(resp, err)).Inc()
	return resp, err
}

// cniCode is the CNI result code of a response, or rpc_error when the
// handler failed without one.
func cniCode(resp any, err error) string {
	if err != nil {
		return "rpc_error"
	}
	if r, ok := resp.(*apiv1.CNIResponse); ok && r.GetError() != nil {
		return strconv.FormatUint(uint64(r.GetError().GetCode()), 10)
	}
	return "0"
}

func (m *agentMetrics) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descReady, descPods, descPeers, descFastPathPackets, descOverlayDrops, descFastPathLearn, descCacheEntries,
		descPolicy, descPolicyDenied, descPolicyDropped, descPolicyAudit, descFlowRecords, descPodDrops, descFlowsLost, descServicesTranslations, descServicesRefusals, descFrontends, descFrontendConnections, descUplinkFast, descDSRPackets, descBypassMessages, descBypassBytes, descBypassFallbacks, descFlowsExported, descFlowsExportLost} {
		ch <- d
	}
	m.scrapeErrors.Describe(ch)
}

// Collect reads the agent's state and the kernel's counters now. A source
// that is not loaded, or whose read fails, contributes nothing: a missing
// series, never a wrong number.
func (m *agentMetrics) Collect(ch chan<- prometheus.Metric) {
	a := m.a
	pool, notReady := a.readyPool()
	ch <- gauge(descReady, b2f(notReady == ""))
	if pool != nil {
		ch <- gauge(descPods, float64(len(pool.List())))
	}
	programmed := int64(len(a.dp.Node.ProgrammedPeers()))
	ch <- gauge(descPeers, float64(programmed), "programmed")
	ch <- gauge(descPeers, float64(max(0, m.registeredPeers.Load()-programmed)), "pending")

	var sources []counterSource
	if fp := a.dp.Node.FastPath(); fp != nil {
		sources = append(sources, counterSource{sourceFastPath, fp.Stats, fastPathSample},
			counterSource{sourceEvents, fp.EventStats, flowEventsSample})
		if n, err := fp.CacheEntries(); m.ok(sourceCache, err) {
			for name, v := range n {
				ch <- gauge(descCacheEntries, float64(v), name)
			}
		}
	}
	if lb := a.dp.Services.Tables(); lb != nil {
		sources = append(sources, counterSource{sourceServices, lb.Stats, servicesSample})
		if svcs, err := lb.Services(); m.ok(sourceServices, err) {
			m.collectFrontends(ch, svcs)
		}
	}
	if bp := a.dp.Bypass.Controls(); bp != nil {
		sources = append(sources, counterSource{sourceBypass, bp.Stats, bypassSample})
	}
	for _, s := range sources {
		if counters, err := s.read(); m.ok(s.name, err) {
			for _, c := range counters {
				if desc, labels := s.sample(c); desc != nil {
					ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(c.Value), labels...)
				}
			}
		}
	}
	if a.policy != nil {
		if counts, err := a.dp.Policy.Counters(); m.ok(sourcePolicy, err) {
			byPod := make(map[string]map[int]uint64, len(counts.Pods))
			for pod, c := range counts.Pods {
				byPod[pod] = map[int]uint64{}
				for i, s := range policySeries {
					byPod[pod][i] = s.of(c)
				}
			}
			totals := m.policy.add(byPod)
			for i, s := range policySeries {
				ch <- prometheus.MustNewConstMetric(descPolicy, prometheus.CounterValue, float64(totals[i]), s.direction, s.verdict)
			}
			for s, v := range m.denied.add(a.policy.Enforced(), counts.Pods) {
				ch <- prometheus.MustNewConstMetric(descPolicyDenied, prometheus.CounterValue, float64(v), s.namespace, s.policy, s.tier, s.direction)
			}
			for s, v := range m.audit.add(a.policy.Enforced(), counts.Pods) {
				ch <- prometheus.MustNewConstMetric(descPolicyAudit, prometheus.CounterValue, float64(v), s.namespace, s.policy, s.direction, s.verdict)
			}
			for why, v := range counts.Drops {
				ch <- prometheus.MustNewConstMetric(descPolicyDropped, prometheus.CounterValue, float64(v), why)
			}
		}
	}
	if a.flows != nil {
		ch <- prometheus.MustNewConstMetric(descFlowRecords, prometheus.CounterValue, float64(a.flows.Added()))
	}
	if a.drops != nil {
		a.keepDrops()
		for _, p := range a.drops.Top(a.cfg.FlowsTopPods) {
			for cause, v := range p.Causes {
				ch <- prometheus.MustNewConstMetric(descPodDrops, prometheus.CounterValue, float64(v), p.Namespace, p.Name, cause)
			}
		}
	}
	if a.recorder != nil || a.events != nil {
		var lost uint64
		if a.recorder != nil {
			lost += a.recorder.Lost()
		}
		if a.events != nil {
			lost += a.events.Lost()
		}
		ch <- prometheus.MustNewConstMetric(descFlowsLost, prometheus.CounterValue, float64(lost))
	}
	for _, e := range a.exports {
		ch <- prometheus.MustNewConstMetric(descFlowsExported, prometheus.CounterValue, float64(e.Exported()), e.Name)
		for reason, n := range e.Lost() {
			ch <- prometheus.MustNewConstMetric(descFlowsExportLost, prometheus.CounterValue, float64(n), e.Name, reason)
		}
	}
	m.scrapeErrors.Collect(ch)
}

// ok counts a failed read of source, logging it, and reports success.
func (m *agentMetrics) ok(source string, err error) bool {
	if err != nil {
		m.scrapeErrors.WithLabelValues(source).Inc()
		slog.Warn("metrics: left out of this scrape", "source", source, "err", err)
	}
	return err == nil
}

func gauge(d *prometheus.Desc, v float64, labels ...string) prometheus.Metric {
	return prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// counterSource is a set of eBPF programs' per-CPU counters, summed over
// the CPUs and named by their C enum (bpf.Counter).
type counterSource struct {
	name   string // of onc_scrape_errors_total
	read   func() ([]bpf.Counter, error)
	sample func(bpf.Counter) (*prometheus.Desc, []string)
}

// The sample functions are the one place counter names become metrics: the
// metric and label values of a counter, or a nil Desc for one not exported.

// flowEventsSample maps enum flows_stat: one outcome each.
func flowEventsSample(c bpf.Counter) (*prometheus.Desc, []string) {
	return descFlowEvents, []string{c.Name}
}

// fastPathSample maps enum onc_stat: <program>_hit, <program>_open, <program>_error,
// <program>_miss_<reason>, learn_<event> (each by family) and the overlay
// guard's overlay_drop_<reason>.
func fastPathSample(c bpf.Counter) (*prometheus.Desc, []string) {
	prog, rest, _ := strings.Cut(c.Name, "_")
	switch {
	case prog == "learn":
		return descFastPathLearn, []string{rest, c.Family}
	case prog == "overlay" && strings.HasPrefix(rest, "drop_"):
		return descOverlayDrops, []string{strings.TrimPrefix(rest, "drop_")}
	case rest == "hit" || rest == "open" || rest == "error":
		return descFastPathPackets, []string{prog, rest, "", c.Family}
	case strings.HasPrefix(rest, "miss_"):
		return descFastPathPackets, []string{prog, "miss", strings.TrimPrefix(rest, "miss_"), c.Family}
	}
	return nil, nil
}

// servicesSample maps enum lb_stat's and lb6_stat's <hook>_translated and
// <hook>_refused of the socket hooks (calls), enum lb_uplink_stat's uplink_fast_<direction>
// (enum lb6_uplink_fast_stat's uplink6_fast_<direction> in IPv6),
// enum lb_dsr_stat's dsr_<event> and lb6_dsr_stat's dsr6_<event>. The uplink's other counters count
// packets; its flows are onc_services_frontend_connections_total's, by
// scope.
func servicesSample(c bpf.Counter) (*prometheus.Desc, []string) {
	if dir, ok := strings.CutPrefix(c.Name, "uplink_fast_"); ok {
		return descUplinkFast, []string{dir, "ipv4"}
	}
	if dir, ok := strings.CutPrefix(c.Name, "uplink6_fast_"); ok {
		return descUplinkFast, []string{dir, "ipv6"}
	}
	if event, ok := strings.CutPrefix(c.Name, "dsr_"); ok {
		return descDSRPackets, []string{event, "ipv4"}
	}
	if event, ok := strings.CutPrefix(c.Name, "dsr6_"); ok {
		return descDSRPackets, []string{event, "ipv6"}
	}
	hook, what, _ := strings.Cut(c.Name, "_")
	if hook != "connect" && hook != "sendmsg" && hook != "connect6" && hook != "sendmsg6" {
		return nil, nil
	}
	switch what {
	case "translated":
		return descServicesTranslations, []string{hook}
	case "refused":
		return descServicesRefusals, []string{hook}
	}
	return nil, nil
}

// bypassSample maps enum bp_stat's redirected_msgs, redirected_bytes and
// fallback_<reason>.
func bypassSample(c bpf.Counter) (*prometheus.Desc, []string) {
	switch {
	case c.Name == "redirected_msgs":
		return descBypassMessages, nil
	case c.Name == "redirected_bytes":
		return descBypassBytes, nil
	case strings.HasPrefix(c.Name, "fallback_"):
		return descBypassFallbacks, []string{strings.TrimPrefix(c.Name, "fallback_")}
	}
	return nil, nil
}

// policySeries are the series of onc_policy_connections_total, in the
// index of the policy sums' series.
var policySeries = [4]struct {
	direction, verdict string
	of                 func(policy.Counters) uint64
}{
	{"ingress", "allowed", func(c policy.Counters) uint64 { return c.IngressAllowed }},
	{"ingress", "denied", func(c policy.Counters) uint64 { return c.IngressDenied }},
	{"egress", "allowed", func(c policy.Counters) uint64 { return c.EgressAllowed }},
	{"egress", "denied", func(c policy.Counters) uint64 { return c.EgressDenied }},
}

// podCounter is a pod's counter that byPolicy sums by the policies it
// counts for: its direction, verdict (of audit's series), value, and the
// policies of the pod it counts for.
type podCounter struct {
	direction, verdict string
	of                 func(policy.Counters) uint64
	policies           func(*policy.Pod) []policyOf
}

// policyOf is a policy a pod's counter counts for: namespace "" and a
// tier for a ClusterNetworkPolicy; tier "" in audit's series.
type policyOf struct{ namespace, name, tier string }

// deniedCounters are summed into onc_policy_denied_packets_total, by the
// policies that can deny the pod's packets.
var deniedCounters = []podCounter{
	{"ingress", "", func(c policy.Counters) uint64 { return c.IngressDenied }, func(p *policy.Pod) []policyOf { return denying(p.Ingress) }},
	{"egress", "", func(c policy.Counters) uint64 { return c.EgressDenied }, func(p *policy.Pod) []policyOf { return denying(p.Egress) }},
}

// auditCounters are summed into onc_policy_audit_packets_total, by the
// policies auditing the pod.
var auditCounters = []podCounter{
	{"ingress", "would_deny", func(c policy.Counters) uint64 { return c.IngressWouldDeny }, func(p *policy.Pod) []policyOf { return auditing(p.AuditIngress) }},
	{"ingress", "would_allow", func(c policy.Counters) uint64 { return c.IngressWouldAllow }, func(p *policy.Pod) []policyOf { return auditing(p.AuditIngress) }},
	{"egress", "would_deny", func(c policy.Counters) uint64 { return c.EgressWouldDeny }, func(p *policy.Pod) []policyOf { return auditing(p.AuditEgress) }},
	{"egress", "would_allow", func(c policy.Counters) uint64 { return c.EgressWouldAllow }, func(p *policy.Pod) []policyOf { return auditing(p.AuditEgress) }},
}

// denying are the policies that can deny a packet in direction d (nil:
// none): the NetworkPolicies isolating it, and each ClusterNetworkPolicy
// with a Deny rule in it, Baseline's only where no NetworkPolicy isolates
// it (Direction.Judge reaches Baseline only then).
func denying(d *policy.Direction) []policyOf {
	if d == nil {
		return nil
	}
	var out []policyOf
	add := func(p policyOf) {
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	for _, r := range d.Admin {
		if r.Action == policy.Deny {
			add(policyOf{name: r.Policy, tier: policy.TierAdmin.String()})
		}
	}
	for _, pol := range d.Policies {
		ns, name, _ := strings.Cut(pol, "/")
		add(policyOf{ns, name, policy.TierNetworkPolicy.String()})
	}
	if d.ClusterOnly {
		for _, r := range d.Baseline {
			if r.Action == policy.Deny {
				add(policyOf{name: r.Policy, tier: policy.TierBaseline.String()})
			}
		}
	}
	return out
}

// auditing are the audited NetworkPolicies of direction d (nil: none).
func auditing(d *policy.Direction) []policyOf {
	if d == nil {
		return nil
	}
	out := make([]policyOf, 0, len(d.Policies))
	for _, pol := range d.Policies {
		ns, name, _ := strings.Cut(pol, "/")
		out = append(out, policyOf{namespace: ns, name: name})
	}
	return out
}

// byPolicy sums pods' counters by policy: what a pod's counter grew by
// since the scrape before counts for each policy of its direction now (at
// the first sight of a pod, its whole count; a counter that went down was
// reset, and grew by its value). A series is kept while its policy
// applies to a pod of this node; if it comes back, it starts again from 0
// (a counter reset).
type byPolicy struct {
	counters []podCounter
	mu       sync.Mutex
	last     map[podCounterKey]uint64 // each pod's counters at the scrape before
	totals   map[policyTotal]uint64
}

type podCounterKey struct {
	pod     string
	counter int // index in byPolicy.counters
}

// policyTotal is a series of byPolicy: verdict is "" in
// onc_policy_denied_packets_total's, tier "" in
// onc_policy_audit_packets_total's.
type policyTotal struct{ namespace, policy, tier, direction, verdict string }

// add sums the counters of the pods of rs, the ruleset enforced, and
// returns the totals.
func (b *byPolicy) add(rs policy.Ruleset, pods map[string]policy.Counters) map[policyTotal]uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.totals == nil {
		b.totals = map[policyTotal]uint64{}
	}
	last := make(map[podCounterKey]uint64, len(b.counters)*len(pods))
	live := map[policyTotal]bool{}
	for i := range rs.Pods {
		p := &rs.Pods[i]
		c, ok := pods[p.Key]
		if !ok {
			continue
		}
		for ci, pc := range b.counters {
			key, now := podCounterKey{p.Key, ci}, pc.of(c)
			last[key] = now
			grew := now
			if was, ok := b.last[key]; ok && was <= now {
				grew = now - was
			}
			for _, pol := range pc.policies(p) {
				s := policyTotal{pol.namespace, pol.name, pol.tier, pc.direction, pc.verdict}
				live[s] = true
				b.totals[s] += grew
			}
		}
	}
	b.last = last
	maps.DeleteFunc(b.totals, func(s policyTotal, _ uint64) bool { return !live[s] })
	return maps.Clone(b.totals)
}

// frontendSeries is a series of onc_services_frontend_connections_total.
type frontendSeries struct{ frontend, scope, outcome string }

// collectFrontends counts the frontends by type and scope, and sums their
// connections.
func (m *agentMetrics) collectFrontends(ch chan<- prometheus.Metric, svcs []dpservices.ServiceState) {
	type kind struct{ frontend, scope string }
	entries := map[kind]int{}
	byService := make(map[dpservices.Key]map[frontendSeries]uint64, len(svcs))
	for _, s := range svcs {
		k := kind{s.Frontend.String(), s.Scope.String()}
		entries[k]++
		byService[s.Key()] = map[frontendSeries]uint64{
			{k.frontend, k.scope, "translated"}: s.Translated,
			{k.frontend, k.scope, "refused"}:    s.Refused,
		}
	}
	for k, n := range entries {
		ch <- gauge(descFrontends, float64(n), k.frontend, k.scope)
	}
	for s, v := range m.services.add(byService) {
		ch <- prometheus.MustNewConstMetric(descFrontendConnections, prometheus.CounterValue, float64(v), s.frontend, s.scope, s.outcome)
	}
}

// sums adds the counters of things that come and go (pods, Services),
// each a set of series, into totals that never go down, as counters must.
// A thing's counters reset when it goes (or its id is reused): the values
// it last showed stay in gone; what it counted since the scrape before is
// lost.
type sums[K, S comparable] struct {
	mu   sync.Mutex
	last map[K]map[S]uint64 // by thing, as last scraped
	gone map[S]uint64
}

func (p *sums[K, S]) add(now map[K]map[S]uint64) map[S]uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gone == nil {
		p.gone = map[S]uint64{}
	}
	for key, was := range p.last {
		for s, v := range was {
			if now[key][s] < v {
				p.gone[s] += v
			}
		}
	}
	p.last = now
	totals := maps.Clone(p.gone)
	for _, series := range now {
		for s, v := range series {
			totals[s] += v
		}
	}
	return totals
}
