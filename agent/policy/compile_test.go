package policy

// The compiler against hand-built snapshots: each case states a policy set
// and checks the verdicts users rely on (Direction.Allows, Ruleset.Allows)
// and, where the shape matters to onctl or to the datapath, the exact rules.

import (
	"net/netip"
	"reflect"
	"slices"
	"testing"

	"github.com/onc-net/onc/datapath/policy"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The cluster: namespaces app (local pods web, db, new), other and third.
var (
	namespaces = []*corev1.Namespace{
		namespace("app", map[string]string{"team": "a", "env": "prod"}),
		namespace("other", map[string]string{"team": "b", "env": "dev"}),
		namespace("third", nil),
	}
	pods = []*corev1.Pod{
		pod("app", "web", "10.0.1.10", map[string]string{"app": "web", "tier": "front"},
			cport("http", corev1.ProtocolTCP, 8080), cport("dns", corev1.ProtocolUDP, 53), cport("sig", corev1.ProtocolSCTP, 3868),
			cport("bad", corev1.ProtocolTCP, 70000), cport("zero", corev1.ProtocolTCP, 0)), // the API rejects these two
		pod("app", "db", "10.0.1.11", map[string]string{"app": "db"}, cport("http", "", 8081), cport("pg", corev1.ProtocolTCP, 5432)),
		pod("app", "new", "", map[string]string{"app": "new"}), // local, the API has no IP yet
		pod("app", "api", "10.0.2.20", map[string]string{"app": "api", "tier": "back"}, cport("http", corev1.ProtocolTCP, 8080)),
		pod("other", "client", "10.0.3.30", map[string]string{"app": "client"}, cport("http", corev1.ProtocolTCP, 9000)),
		pod("other", "web", "10.0.3.31", map[string]string{"app": "web"}),
		pod("third", "x", "10.0.4.40", map[string]string{"app": "x"}),
		with(pod("app", "host", "192.168.0.5", map[string]string{"app": "web"}), func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		with(pod("app", "done", "10.0.1.99", map[string]string{"app": "web"}), func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }),
		with(pod("app", "failed", "10.0.1.98", map[string]string{"app": "web"}), func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }),
		pod("app", "pending", "", map[string]string{"app": "web"}),
		with(pod("app", "dual", "", map[string]string{"app": "dual"}), func(p *corev1.Pod) {
			p.Status.PodIPs = []corev1.PodIP{{IP: "fd00::21"}, {IP: "10.0.2.21"}}
		}),
		with(pod("app", "legacy", "", map[string]string{"app": "legacy"}), func(p *corev1.Pod) { p.Status.PodIP = "10.0.2.22" }),
	}
	local = []LocalPod{
		{Namespace: "app", Name: "web", Iface: "veth-web", IPs: []netip.Addr{addr("10.0.1.10")}},
		{Namespace: "app", Name: "db", Iface: "veth-db", IPs: []netip.Addr{addr("10.0.1.11")}},
		{Namespace: "app", Name: "new", Iface: "veth-new", IPs: []netip.Addr{addr("10.0.1.12")}},
	}
)

// Addresses of the pods above, by name.
var (
	web, db, newPod, api       = addr("10.0.1.10"), addr("10.0.1.11"), addr("10.0.1.12"), addr("10.0.2.20")
	client, otherWeb, thirdX   = addr("10.0.3.30"), addr("10.0.3.31"), addr("10.0.4.40")
	dual, legacy, host, done   = addr("10.0.2.21"), addr("10.0.2.22"), addr("192.168.0.5"), addr("10.0.1.99")
	failed, outside, inExcept  = addr("10.0.1.98"), addr("8.8.8.8"), addr("10.1.2.3")
	webKey, dbKey, newKey      = "app/web", "app/db", "app/new"
	tcp, udp, sctp             = policy.TCP, policy.UDP, policy.SCTP
	protoTCP, protoUDP, protoS = corev1.ProtocolTCP, corev1.ProtocolUDP, corev1.ProtocolSCTP
)

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func prefixes(ss ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, s := range ss {
		out = append(out, netip.MustParsePrefix(s))
	}
	return out
}

func namespace(name string, labels map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
}

func pod(ns, name, ip string, labels map[string]string, ports ...corev1.ContainerPort) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Ports: ports}}},
		Status:     corev1.PodStatus{Phase: corev1.PodRunning},
	}
	if ip != "" {
		p.Status.PodIP = ip
		p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	}
	return p
}

func with(p *corev1.Pod, f func(*corev1.Pod)) *corev1.Pod {
	f(p)
	return p
}

func cport(name string, proto corev1.Protocol, n int32) corev1.ContainerPort {
	return corev1.ContainerPort{Name: name, Protocol: proto, ContainerPort: n}
}

func netPolicy(name string, spec networkingv1.NetworkPolicySpec) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: name}, Spec: spec}
}

func labelsel(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func expr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func podPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{PodSelector: s}
}

func nsPeer(s *metav1.LabelSelector) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{NamespaceSelector: s}
}

func block(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
	return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
}

func port(proto corev1.Protocol, p intstr.IntOrString) networkingv1.NetworkPolicyPort {
	return networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &p}
}

func num(n int) intstr.IntOrString                                 { return intstr.FromInt32(int32(n)) }
func named(s string) intstr.IntOrString                            { return intstr.FromString(s) }
func types(t ...networkingv1.PolicyType) []networkingv1.PolicyType { return t }

var (
	ingressT, egressT = networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress
	all               = metav1.LabelSelector{}
)

func ingressFrom(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyIngressRule {
	return networkingv1.NetworkPolicyIngressRule{From: peers}
}

func egressTo(peers ...networkingv1.NetworkPolicyPeer) networkingv1.NetworkPolicyEgressRule {
	return networkingv1.NetworkPolicyEgressRule{To: peers}
}

// verdict is one connection a direction must allow or deny.
type verdict struct {
	ip    netip.Addr
	proto policy.Proto
	port  uint16
	allow bool
}

func checkVerdicts(t *testing.T, what string, d *policy.Direction, vs []verdict) {
	t.Helper()
	if d == nil {
		t.Fatalf("%s: not isolated", what)
	}
	for _, v := range vs {
		if got := d.Allows(v.ip, v.proto, v.port); got != v.allow {
			t.Errorf("%s allows %s %s/%d = %v, want %v (%s)", what, v.ip, v.proto, v.port, got, v.allow, d)
		}
	}
}

// decision is the rule that must allow a connection (Direction.Judge):
// the first that does, of policy's rule index; "" for none.
type decision struct {
	ip     netip.Addr
	proto  policy.Proto
	port   uint16
	policy string
	index  int
}

func checkDecisions(t *testing.T, what string, d *policy.Direction, ds []decision) {
	t.Helper()
	for _, want := range ds {
		r := d.Judge(want.ip, want.proto, want.port)
		ok := r.Allowed
		if got := (decision{want.ip, want.proto, want.port, r.Policy, r.Index}); ok != (want.policy != "") || ok && got != want {
			t.Errorf("%s decides %s %s/%d: %s rule %d (allowed %v), want %s rule %d (%s)", what, want.ip, want.proto, want.port,
				r.Policy, r.Index, ok, want.policy, want.index, d)
		}
	}
}

func checkRules(t *testing.T, what string, d *policy.Direction, want []policy.Rule) {
	t.Helper()
	if d == nil {
		t.Fatalf("%s: not isolated", what)
	}
	if !reflect.DeepEqual(d.Rules, want) {
		t.Errorf("%s rules:\n got %s\nwant %s", what, d, &policy.Direction{Policies: d.Policies, Rules: want})
	}
}

func compile(policies ...*networkingv1.NetworkPolicy) policy.Ruleset {
	return Compile(Snapshot{Pods: pods, Namespaces: namespaces, Policies: policies}, local)
}

func TestCompile(t *testing.T) {
	b := netPolicy("b", networkingv1.NetworkPolicySpec{PodSelector: *labelsel("app", "web"), PolicyTypes: types(ingressT, egressT),
		Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(podPeer(labelsel("app", "db"))), ingressFrom(podPeer(labelsel("app", "api")))},
		Egress:  []networkingv1.NetworkPolicyEgressRule{egressTo(podPeer(labelsel("app", "api")))}})
	for _, tc := range []struct {
		name     string
		policies []*networkingv1.NetworkPolicy
		check    func(t *testing.T, rs policy.Ruleset)
	}{{
		name: "no policy isolates nothing",
		check: func(t *testing.T, rs policy.Ruleset) {
			want := []policy.Pod{
				{Key: dbKey, Iface: "veth-db", IPs: []netip.Addr{db}},
				{Key: newKey, Iface: "veth-new", IPs: []netip.Addr{newPod}},
				{Key: webKey, Iface: "veth-web", IPs: []netip.Addr{web}},
			}
			if !reflect.DeepEqual(rs.Pods, want) {
				t.Errorf("got %+v, want %+v", rs.Pods, want)
			}
		},
	}, {
		name: "deny-all ingress with empty podSelector",
		policies: []*networkingv1.NetworkPolicy{netPolicy("deny", networkingv1.NetworkPolicySpec{
			PodSelector: all, PolicyTypes: types(ingressT)})},
		check: func(t *testing.T, rs policy.Ruleset) {
			for _, key := range []string{webKey, dbKey, newKey} {
				p := rs.Pod(key)
				if p.Egress != nil || !reflect.DeepEqual(p.Ingress, &policy.Direction{Policies: []string{"app/deny"}}) {
					t.Errorf("%s: ingress %s, egress %s", key, p.Ingress, p.Egress)
				}
				checkVerdicts(t, key, p.Ingress, []verdict{{api, tcp, 80, false}, {web, udp, 53, false}})
			}
			if !rs.Allows(policy.Connection{Client: web, Server: outside, Proto: tcp, Port: 443}) {
				t.Error("egress of web denied though only ingress is isolated")
			}
		},
	}, {
		name: "no policyTypes and ingress rules only: ingress only",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: all, Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(podPeer(labelsel("app", "api")))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			p := rs.Pod(webKey)
			if p.Egress != nil {
				t.Errorf("egress isolated: %s", p.Egress)
			}
			checkVerdicts(t, "ingress", p.Ingress, []verdict{{api, tcp, 80, true}, {client, tcp, 80, false}})
		},
	}, {
		name: "no policyTypes and no rules at all: ingress deny-all",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: all})},
		check: func(t *testing.T, rs policy.Ruleset) {
			p := rs.Pod(webKey)
			if p.Egress != nil || p.Ingress == nil || len(p.Ingress.Rules) != 0 {
				t.Errorf("got ingress %s, egress %s", p.Ingress, p.Egress)
			}
		},
	}, {
		name: "no policyTypes and egress rules: both directions",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: all, Egress: []networkingv1.NetworkPolicyEgressRule{egressTo(podPeer(labelsel("app", "api")))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			p := rs.Pod(webKey)
			checkVerdicts(t, "ingress", p.Ingress, []verdict{{api, tcp, 80, false}})
			checkVerdicts(t, "egress", p.Egress, []verdict{{api, tcp, 80, true}, {outside, udp, 53, false}})
		},
	}, {
		name: "explicit Egress only ignores the ingress rules",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: all, PolicyTypes: types(egressT),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{}},
		})},
		check: func(t *testing.T, rs policy.Ruleset) {
			p := rs.Pod(webKey)
			if p.Ingress != nil {
				t.Errorf("ingress isolated: %s", p.Ingress)
			}
			if !reflect.DeepEqual(p.Egress, &policy.Direction{Policies: []string{"app/p"}}) {
				t.Errorf("egress %s, want deny-all", p.Egress)
			}
			if rs.Allows(policy.Connection{Client: web, Server: db, Proto: tcp, Port: 5432}) {
				t.Error("web -> db allowed by a deny-all egress")
			}
		},
	}, {
		name: "explicit Ingress and Egress without rules: deny all both ways",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: all, PolicyTypes: types(ingressT, egressT)})},
		check: func(t *testing.T, rs policy.Ruleset) {
			p := rs.Pod(dbKey)
			checkVerdicts(t, "ingress", p.Ingress, []verdict{{web, tcp, 5432, false}})
			checkVerdicts(t, "egress", p.Egress, []verdict{{web, tcp, 8080, false}})
		},
	}, {
		name: "podSelector selects some local pods only",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), PolicyTypes: types(ingressT)})},
		check: func(t *testing.T, rs policy.Ruleset) {
			if rs.Pod(webKey).Ingress == nil {
				t.Error("web not isolated")
			}
			if rs.Pod(dbKey).Isolated() || rs.Pod(newKey).Isolated() {
				t.Error("db or new isolated by a policy that does not select them")
			}
		},
	}, {
		name: "a policy of another namespace does not select local pods",
		policies: []*networkingv1.NetworkPolicy{inNamespace(netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: all, PolicyTypes: types(ingressT, egressT)}), "other")},
		check: func(t *testing.T, rs policy.Ruleset) {
			for _, p := range rs.Pods {
				if p.Isolated() {
					t.Errorf("%s isolated by other/p", p.Key)
				}
			}
		},
	}, {
		name: "invalid podSelector selects nothing",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *expr("app", "Bogus", "web"), PolicyTypes: types(ingressT)})},
		check: func(t *testing.T, rs policy.Ruleset) {
			for _, p := range rs.Pods {
				if p.Isolated() {
					t.Errorf("%s isolated by an invalid selector", p.Key)
				}
			}
		},
	}, {
		name: "matchExpressions on the policy's podSelector",
		policies: []*networkingv1.NetworkPolicy{
			netPolicy("in", networkingv1.NetworkPolicySpec{PodSelector: *expr("app", metav1.LabelSelectorOpIn, "web", "x"), PolicyTypes: types(ingressT)}),
			netPolicy("notin", networkingv1.NetworkPolicySpec{PodSelector: *expr("app", metav1.LabelSelectorOpNotIn, "web"), PolicyTypes: types(ingressT)}),
			netPolicy("exists", networkingv1.NetworkPolicySpec{PodSelector: *expr("tier", metav1.LabelSelectorOpExists), PolicyTypes: types(egressT)}),
			netPolicy("doesnotexist", networkingv1.NetworkPolicySpec{PodSelector: *expr("tier", metav1.LabelSelectorOpDoesNotExist), PolicyTypes: types(egressT)}),
		},
		check: func(t *testing.T, rs policy.Ruleset) {
			for key, want := range map[string][2][]string{
				webKey: {{"app/in"}, {"app/exists"}},
				dbKey:  {{"app/notin"}, {"app/doesnotexist"}},
				newKey: {{"app/notin"}, {"app/doesnotexist"}},
			} {
				p := rs.Pod(key)
				if p.Ingress == nil || p.Egress == nil || !slices.Equal(p.Ingress.Policies, want[0]) || !slices.Equal(p.Egress.Policies, want[1]) {
					t.Errorf("%s: ingress %s, egress %s; want policies %v", key, p.Ingress, p.Egress, want)
				}
			}
		},
	}, {
		name: "absent from allows every address",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), Ingress: []networkingv1.NetworkPolicyIngressRule{{}}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			d := rs.Pod(webKey).Ingress
			checkRules(t, "ingress", d, []policy.Rule{{Policy: "app/p", Index: 0, Peers: prefixes("0.0.0.0/0", "::/0")}})
			checkVerdicts(t, "ingress", d, []verdict{{outside, udp, 1, true}, {client, sctp, 9, true}})
		},
	}, {
		name: "empty from list allows every address",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"),
			Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{}}},
			Egress:      []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{}}}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			p := rs.Pod(webKey)
			checkRules(t, "ingress", p.Ingress, []policy.Rule{{Policy: "app/p", Index: 0, Peers: prefixes("0.0.0.0/0", "::/0")}})
			checkRules(t, "egress", p.Egress, []policy.Rule{{Policy: "app/p", Index: 0, Peers: prefixes("0.0.0.0/0", "::/0")}})
		},
	}, {
		name: "podSelector peer: pods of the policy's namespace",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "db"), Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(podPeer(labelsel("app", "web")))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			d := rs.Pod(dbKey).Ingress
			// Not other/web, nor the host-network, finished or address-less app=web pods.
			checkRules(t, "ingress", d, []policy.Rule{{Policy: "app/p", Peers: prefixes("10.0.1.10/32")}})
			checkVerdicts(t, "ingress", d, []verdict{{web, tcp, 5432, true}, {otherWeb, tcp, 5432, false},
				{host, tcp, 5432, false}, {done, tcp, 5432, false}, {failed, tcp, 5432, false}})
			if !rs.Allows(policy.Connection{Client: web, Server: db, Proto: tcp, Port: 5432}) {
				t.Error("web -> db denied")
			}
		},
	}, {
		name: "empty podSelector peer: every pod of the namespace, both families and podIP fallbacks",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "db"), Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(podPeer(&all))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			// new has no API address: its LocalPod one; dual: both; legacy: status.podIP.
			checkRules(t, "ingress", rs.Pod(dbKey).Ingress, []policy.Rule{{Policy: "app/p",
				Peers: prefixes("10.0.1.10/32", "10.0.1.11/32", "10.0.1.12/32", "10.0.2.20/32", "10.0.2.21/32", "10.0.2.22/32", "fd00::21/128")}})
			checkVerdicts(t, "ingress", rs.Pod(dbKey).Ingress, []verdict{{dual, tcp, 1, true}, {addr("fd00::21"), tcp, 1, true}, {addr("fd00::22"), tcp, 1, false},
				{legacy, tcp, 1, true}, {newPod, tcp, 1, true}, {otherWeb, tcp, 1, false}})
		},
	}, {
		name: "peer selecting nothing allows nothing but is kept",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), Ingress: []networkingv1.NetworkPolicyIngressRule{
				ingressFrom(podPeer(labelsel("app", "nope"))),
				ingressFrom(podPeer(expr("app", "Bogus"))), // invalid
				ingressFrom(podPeer(labelsel("app", "pending"))),
				ingressFrom(networkingv1.NetworkPolicyPeer{}), // the API rejects it
			}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			d := rs.Pod(webKey).Ingress
			checkRules(t, "ingress", d, []policy.Rule{{Policy: "app/p", Index: 0}, {Policy: "app/p", Index: 1}, {Policy: "app/p", Index: 2}, {Policy: "app/p", Index: 3}})
			checkVerdicts(t, "ingress", d, []verdict{{db, tcp, 80, false}, {outside, tcp, 80, false}})
		},
	}, {
		name: "overlapping peers are de-duplicated",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "db"), Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(
				podPeer(labelsel("app", "web")), podPeer(labelsel("tier", "front")), block("10.0.1.10/32"), block("10.0.1.10/31", "10.0.1.11/32"))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			checkRules(t, "ingress", rs.Pod(dbKey).Ingress, []policy.Rule{{Policy: "app/p", Peers: prefixes("10.0.1.10/32")}})
		},
	}, {
		name: "namespaceSelector peer: every pod of the matching namespaces",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(nsPeer(labelsel("team", "b")))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			checkRules(t, "ingress", rs.Pod(webKey).Ingress, []policy.Rule{{Policy: "app/p", Peers: prefixes("10.0.3.30/32", "10.0.3.31/32")}})
		},
	}, {
		name: "empty namespaceSelector peer: every pod of every namespace",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(nsPeer(&all))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			d := rs.Pod(webKey).Ingress
			checkRules(t, "ingress", d, []policy.Rule{{Policy: "app/p", Peers: prefixes("10.0.1.10/32", "10.0.1.11/32", "10.0.1.12/32",
				"10.0.2.20/32", "10.0.2.21/32", "10.0.2.22/32", "10.0.3.30/32", "10.0.3.31/32", "10.0.4.40/32", "fd00::21/128")}})
			checkVerdicts(t, "ingress", d, []verdict{{thirdX, tcp, 80, true}, {outside, tcp, 80, false}, {host, tcp, 80, false}})
		},
	}, {
		name: "namespaceSelector and podSelector in one peer",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "db"), Ingress: []networkingv1.NetworkPolicyIngressRule{
				ingressFrom(networkingv1.NetworkPolicyPeer{NamespaceSelector: labelsel("env", "dev"), PodSelector: labelsel("app", "web")})}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			checkRules(t, "ingress", rs.Pod(dbKey).Ingress, []policy.Rule{{Policy: "app/p", Peers: prefixes("10.0.3.31/32")}})
		},
	}, {
		name: "matchExpressions on peers",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "db"), Ingress: []networkingv1.NetworkPolicyIngressRule{
				ingressFrom(podPeer(expr("app", metav1.LabelSelectorOpIn, "api", "legacy"))),
				ingressFrom(nsPeer(expr("team", metav1.LabelSelectorOpNotIn, "a", "b"))), // third: no labels at all
				ingressFrom(podPeer(expr("tier", metav1.LabelSelectorOpExists))),
				ingressFrom(networkingv1.NetworkPolicyPeer{NamespaceSelector: expr("team", metav1.LabelSelectorOpExists),
					PodSelector: expr("app", metav1.LabelSelectorOpDoesNotExist)}),
			}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			checkRules(t, "ingress", rs.Pod(dbKey).Ingress, []policy.Rule{
				{Policy: "app/p", Index: 0, Peers: prefixes("10.0.2.20/32", "10.0.2.22/32")},
				{Policy: "app/p", Index: 1, Peers: prefixes("10.0.4.40/32")},
				{Policy: "app/p", Index: 2, Peers: prefixes("10.0.1.10/32", "10.0.2.20/32")},
				{Policy: "app/p", Index: 3},
			})
		},
	}, {
		name: "ipBlock with except",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), PolicyTypes: types(egressT),
			Egress: []networkingv1.NetworkPolicyEgressRule{egressTo(block("10.0.0.0/8", "10.1.0.0/16"))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			d := rs.Pod(webKey).Egress
			checkRules(t, "egress", d, []policy.Rule{{Policy: "app/p", Peers: prefixes("10.0.0.0/16", "10.2.0.0/15", "10.4.0.0/14",
				"10.8.0.0/13", "10.16.0.0/12", "10.32.0.0/11", "10.64.0.0/10", "10.128.0.0/9")}})
			checkVerdicts(t, "egress", d, []verdict{{inExcept, tcp, 80, false}, {addr("10.1.0.0"), tcp, 80, false},
				{addr("10.1.255.255"), tcp, 80, false}, {addr("10.0.255.255"), tcp, 80, true}, {addr("10.2.0.0"), tcp, 80, true},
				{addr("10.255.255.255"), udp, 1, true}, {db, tcp, 5432, true}, {outside, tcp, 80, false}})
		},
	}, {
		name: "ipBlock edge cases",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), PolicyTypes: types(egressT),
			Egress: []networkingv1.NetworkPolicyEgressRule{
				// Excepts nested, overlapping and of the other family; an unmasked CIDR.
				egressTo(block("192.168.1.7/24", "192.168.1.128/25", "192.168.1.192/26", "192.168.1.0/26", "fd00::/8")),
				egressTo(block("10.0.0.0/24", "10.0.0.0/16")), // except covers it all
				// IPv6 with an except; the other family's except ignored;
				// IPv4-mapped kept as IPv6 (no such source is ever received).
				egressTo(block("fd00::/8", "fd00::/9", "10.0.0.0/8"), block("not-a-cidr"), block("::ffff:10.0.0.0/104")),
				egressTo(block("172.16.0.1/32", "172.16.0.1/32")),
				egressTo(block("0.0.0.0/0", "0.0.0.0/1")),
			}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			checkRules(t, "egress", rs.Pod(webKey).Egress, []policy.Rule{
				{Policy: "app/p", Index: 0, Peers: prefixes("192.168.1.64/26")},
				{Policy: "app/p", Index: 1},
				{Policy: "app/p", Index: 2, Peers: prefixes("::ffff:10.0.0.0/104", "fd80::/9")},
				{Policy: "app/p", Index: 3},
				{Policy: "app/p", Index: 4, Peers: prefixes("128.0.0.0/1")},
			})
		},
	}, {
		name: "ipBlock containing pod IPs applies to them like any address",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "db"), Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(block("10.0.1.0/24", "10.0.1.12/32"))}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			for _, v := range []struct {
				client netip.Addr
				allow  bool
			}{{web, true}, {newPod, false}, {api, false}} {
				if got := rs.Allows(policy.Connection{Client: v.client, Server: db, Proto: tcp, Port: 5432}); got != v.allow {
					t.Errorf("%s -> db: %v, want %v", v.client, got, v.allow)
				}
			}
		},
	}, {
		name: "numeric ports, protocols, endPort",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "web"), Ingress: []networkingv1.NetworkPolicyIngressRule{{
				Ports: []networkingv1.NetworkPolicyPort{
					{Port: ptr(num(80))}, // protocol defaults to TCP
					port(protoUDP, num(53)),
					port(protoS, num(3868)),
					{Protocol: &protoUDP},                    // every UDP port
					withEnd(port(protoTCP, num(8000)), 8100), // a range
				}}, {
				Ports: []networkingv1.NetworkPolicyPort{
					withEnd(port(protoTCP, num(9000)), 8999), // endPort < port
					port("ICMP", num(1)),                     // unknown protocol
				}}}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			d := rs.Pod(webKey).Ingress
			checkRules(t, "ingress", d, []policy.Rule{{Policy: "app/p", Index: 0, Peers: prefixes("0.0.0.0/0", "::/0"), Ports: []policy.PortRange{
				{Proto: tcp, First: 80, Last: 80}, {Proto: udp, First: 53, Last: 53}, {Proto: sctp, First: 3868, Last: 3868},
				{Proto: udp, First: 1, Last: 65535}, {Proto: tcp, First: 8000, Last: 8100},
			}}, {Policy: "app/p", Index: 1, Peers: prefixes("0.0.0.0/0", "::/0"), Ports: []policy.PortRange{}}})
			checkVerdicts(t, "ingress", d, []verdict{
				{api, tcp, 80, true}, {api, tcp, 81, false}, {api, udp, 80, true}, {api, sctp, 3868, true}, {api, sctp, 53, false},
				{api, tcp, 7999, false}, {api, tcp, 8000, true}, {api, tcp, 8100, true}, {api, tcp, 8101, false},
				{api, tcp, 8999, false}, {api, tcp, 9000, false}, {api, 1, 1, false},
			})
			checkDecisions(t, "ingress", d, []decision{{api, tcp, 8050, "app/p", 0}, {api, udp, 9, "app/p", 0}, {api, tcp, 9000, "", 0}})
		},
	}, {
		name: "named ports on ingress resolve against each local pod",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: all, Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From: []networkingv1.NetworkPolicyPeer{podPeer(labelsel("app", "api"))},
				Ports: []networkingv1.NetworkPolicyPort{
					{Port: ptr(named("http"))},
					port(protoUDP, named("dns")),
					port(protoTCP, named("sig")), // sig is SCTP: no match
					port(protoTCP, named("nope")),
					port(protoTCP, named("bad")), // must not wrap to 4464
					port(protoTCP, named("zero")),
				}}}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			peers := prefixes("10.0.2.20/32")
			checkRules(t, "web", rs.Pod(webKey).Ingress, []policy.Rule{{Policy: "app/p", Peers: peers,
				Ports: []policy.PortRange{{Proto: tcp, First: 8080, Last: 8080}, {Proto: udp, First: 53, Last: 53}}}})
			checkRules(t, "db", rs.Pod(dbKey).Ingress, []policy.Rule{{Policy: "app/p", Peers: peers,
				Ports: []policy.PortRange{{Proto: tcp, First: 8081, Last: 8081}}}})
			checkRules(t, "new", rs.Pod(newKey).Ingress, []policy.Rule{{Policy: "app/p", Peers: peers, Ports: []policy.PortRange{}}})
			checkVerdicts(t, "web", rs.Pod(webKey).Ingress, []verdict{{api, tcp, 8080, true}, {api, tcp, 8081, false},
				{api, udp, 53, true}, {api, sctp, 3868, false}, {api, tcp, 4464, false}})
			checkVerdicts(t, "new", rs.Pod(newKey).Ingress, []verdict{{api, tcp, 8080, false}})
		},
	}, {
		name: "named ports on egress resolve per destination pod",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "new"), PolicyTypes: types(egressT), Egress: []networkingv1.NetworkPolicyEgressRule{{
				To:    []networkingv1.NetworkPolicyPeer{nsPeer(&all), block("192.0.2.0/24")},
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(named("http"))}},
			}, {
				To:    []networkingv1.NetworkPolicyPeer{podPeer(labelsel("app", "api")), block("192.0.2.0/24")},
				Ports: []networkingv1.NetworkPolicyPort{port(protoTCP, num(443)), port(protoTCP, named("http"))},
			}, {
				To:    []networkingv1.NetworkPolicyPeer{block("192.0.2.0/24")},
				Ports: []networkingv1.NetworkPolicyPort{port(protoTCP, named("http"))},
			}, {
				To:    []networkingv1.NetworkPolicyPeer{podPeer(labelsel("app", "web"))},
				Ports: []networkingv1.NetworkPolicyPort{port(protoUDP, named("dns")), port(protoS, named("sig"))},
			}}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			d := rs.Pod(newKey).Egress
			checkRules(t, "egress", d, []policy.Rule{
				{Policy: "app/p", Index: 0, Peers: prefixes("10.0.1.10/32", "10.0.2.20/32"), Ports: []policy.PortRange{{Proto: tcp, First: 8080, Last: 8080}}},
				{Policy: "app/p", Index: 0, Peers: prefixes("10.0.1.11/32"), Ports: []policy.PortRange{{Proto: tcp, First: 8081, Last: 8081}}},
				{Policy: "app/p", Index: 0, Peers: prefixes("10.0.3.30/32"), Ports: []policy.PortRange{{Proto: tcp, First: 9000, Last: 9000}}},
				{Policy: "app/p", Index: 1, Peers: prefixes("10.0.2.20/32", "192.0.2.0/24"), Ports: []policy.PortRange{{Proto: tcp, First: 443, Last: 443}}},
				{Policy: "app/p", Index: 1, Peers: prefixes("10.0.2.20/32"), Ports: []policy.PortRange{{Proto: tcp, First: 8080, Last: 8080}}},
				{Policy: "app/p", Index: 2, Peers: prefixes("192.0.2.0/24"), Ports: []policy.PortRange{}},
				{Policy: "app/p", Index: 3, Peers: prefixes("10.0.1.10/32"), Ports: []policy.PortRange{{Proto: udp, First: 53, Last: 53}}},
				{Policy: "app/p", Index: 3, Peers: prefixes("10.0.1.10/32"), Ports: []policy.PortRange{{Proto: sctp, First: 3868, Last: 3868}}},
			})
			checkVerdicts(t, "egress", d, []verdict{
				{db, tcp, 8081, true}, {db, tcp, 8080, false}, {client, tcp, 9000, true}, {client, tcp, 8080, false},
				{addr("192.0.2.1"), tcp, 8080, false}, {addr("192.0.2.1"), tcp, 443, true}, {web, tcp, 443, false},
			})
			// Named ports as compiled: one rule per number, each with its
			// policy's index; the first rule that allows wins.
			checkDecisions(t, "egress", d, []decision{
				{api, tcp, 8080, "app/p", 0}, {api, tcp, 443, "app/p", 1}, {db, tcp, 8081, "app/p", 0}, {web, udp, 53, "app/p", 3},
				{web, sctp, 3868, "app/p", 3}, {addr("192.0.2.1"), tcp, 443, "app/p", 1}, {addr("192.0.2.1"), tcp, 8080, "", 0},
			})
		},
	}, {
		name: "named port with no to resolves against every pod",
		policies: []*networkingv1.NetworkPolicy{netPolicy("p", networkingv1.NetworkPolicySpec{
			PodSelector: *labelsel("app", "db"), PolicyTypes: types(egressT), Egress: []networkingv1.NetworkPolicyEgressRule{{
				Ports: []networkingv1.NetworkPolicyPort{{Port: ptr(named("http"))}}}}})},
		check: func(t *testing.T, rs policy.Ruleset) {
			checkVerdicts(t, "egress", rs.Pod(dbKey).Egress, []verdict{
				{web, tcp, 8080, true}, {api, tcp, 8080, true}, {client, tcp, 9000, true}, {db, tcp, 8081, true},
				{client, tcp, 8080, false}, {outside, tcp, 8080, false}, {thirdX, tcp, 8080, false},
			})
		},
	}, {
		name: "several policies: union of their rules, sorted",
		policies: []*networkingv1.NetworkPolicy{
			b, // and b again below: de-duplicated
			netPolicy("a", networkingv1.NetworkPolicySpec{PodSelector: all,
				Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{nsPeer(labelsel("team", "b"))},
					Ports: []networkingv1.NetworkPolicyPort{port(protoTCP, num(80))}}},
				Egress: []networkingv1.NetworkPolicyEgressRule{egressTo(block("192.0.2.0/24"))}}),
			b,
		},
		check: func(t *testing.T, rs policy.Ruleset) {
			p := rs.Pod(webKey)
			if !slices.Equal(p.Ingress.Policies, []string{"app/a", "app/b"}) || !slices.Equal(p.Egress.Policies, []string{"app/a", "app/b"}) {
				t.Errorf("policies: ingress %v, egress %v", p.Ingress.Policies, p.Egress.Policies)
			}
			checkRules(t, "ingress", p.Ingress, []policy.Rule{
				{Policy: "app/a", Index: 0, Peers: prefixes("10.0.3.30/32", "10.0.3.31/32"), Ports: []policy.PortRange{{Proto: tcp, First: 80, Last: 80}}},
				{Policy: "app/b", Index: 0, Peers: prefixes("10.0.1.11/32")},
				{Policy: "app/b", Index: 1, Peers: prefixes("10.0.2.20/32")},
			})
			checkVerdicts(t, "ingress", p.Ingress, []verdict{{client, tcp, 80, true}, {client, tcp, 81, false},
				{db, udp, 5, true}, {api, tcp, 81, true}, {thirdX, tcp, 80, false}})
			checkDecisions(t, "ingress", p.Ingress, []decision{{client, tcp, 80, "app/a", 0}, {api, tcp, 81, "app/b", 1},
				{db, udp, 5, "app/b", 0}, {thirdX, tcp, 80, "", 0}})
			checkRules(t, "egress", p.Egress, []policy.Rule{
				{Policy: "app/a", Index: 0, Peers: prefixes("192.0.2.0/24")},
				{Policy: "app/b", Index: 0, Peers: prefixes("10.0.2.20/32")},
			})
			checkRules(t, "db egress", rs.Pod(dbKey).Egress, []policy.Rule{{Policy: "app/a", Index: 0, Peers: prefixes("192.0.2.0/24")}})
			if !slices.Equal(rs.Pod(dbKey).Ingress.Policies, []string{"app/a"}) {
				t.Errorf("db policies %v", rs.Pod(dbKey).Ingress.Policies)
			}
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rs := compile(tc.policies...)
			if len(rs.Pods) != len(local) {
				t.Fatalf("%d pods, want %d", len(rs.Pods), len(local))
			}
			tc.check(t, rs)
			// Deterministic whatever the order of the inputs.
			rev := slices.Clone(tc.policies)
			slices.Reverse(rev)
			again := Compile(Snapshot{Pods: reversed(pods), Namespaces: reversed(namespaces), Policies: rev}, reversed(local))
			if !reflect.DeepEqual(rs, again) {
				t.Errorf("not deterministic:\n%+v\n%+v", rs, again)
			}
		})
	}
}

// A local pod the API does not show yet cannot be selected.
func TestCompileUnknownLocalPod(t *testing.T) {
	rs := Compile(Snapshot{Namespaces: namespaces, Policies: []*networkingv1.NetworkPolicy{
		netPolicy("deny", networkingv1.NetworkPolicySpec{PodSelector: all, PolicyTypes: types(ingressT, egressT)})}},
		[]LocalPod{{Namespace: "app", Name: "ghost", Iface: "veth-ghost", IPs: []netip.Addr{addr("10.0.1.50")}}})
	want := []policy.Pod{{Key: "app/ghost", Iface: "veth-ghost", IPs: []netip.Addr{addr("10.0.1.50")}}}
	if !reflect.DeepEqual(rs.Pods, want) {
		t.Errorf("got %+v, want %+v", rs.Pods, want)
	}
}

func ptr[T any](v T) *T { return &v }

func withEnd(p networkingv1.NetworkPolicyPort, end int32) networkingv1.NetworkPolicyPort {
	p.EndPort = &end
	return p
}

func inNamespace(np *networkingv1.NetworkPolicy, ns string) *networkingv1.NetworkPolicy {
	np.Namespace = ns
	return np
}

func reversed[T any](s []T) []T {
	r := slices.Clone(s)
	slices.Reverse(r)
	return r
}

// annotated is np with its mode annotation set to mode.
func annotated(np *networkingv1.NetworkPolicy, mode string) *networkingv1.NetworkPolicy {
	np.Annotations = map[string]string{ModeAnnotation: mode}
	return np
}

// Audited policies make the audited directions and leave the enforced
// ones (what every verdict, revocation and cache reads) as if they were
// not there; a mode annotation naming no mode is enforced.
func TestCompileAudit(t *testing.T) {
	denyIn := func(name string) *networkingv1.NetworkPolicy {
		return netPolicy(name, networkingv1.NetworkPolicySpec{PodSelector: *labelsel("app", "web"), PolicyTypes: types(ingressT)})
	}
	fromAPI := func(name string) *networkingv1.NetworkPolicy {
		return netPolicy(name, networkingv1.NetworkPolicySpec{PodSelector: *labelsel("app", "web"), PolicyTypes: types(ingressT, egressT),
			Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(podPeer(labelsel("app", "api")))},
			Egress:  []networkingv1.NetworkPolicyEgressRule{egressTo(podPeer(labelsel("app", "db")))}})
	}
	apiIn := []policy.Rule{{Policy: "app/allow", Index: 0, Peers: prefixes("10.0.2.20/32")}}
	dbOut := []policy.Rule{{Policy: "app/allow", Index: 0, Peers: prefixes("10.0.1.11/32")}}
	for _, tc := range []struct {
		name                string
		policies            []*networkingv1.NetworkPolicy
		in, eg, auIn, auEg  *policy.Direction
		clientToWebAllowed  bool // client → web TCP/80, as enforced
		webToOutsideAllowed bool // web → outside TCP/443, as enforced
	}{{
		name:               "audited deny-all ingress: enforced open, audited isolated",
		policies:           []*networkingv1.NetworkPolicy{annotated(denyIn("deny"), "audit")},
		auIn:               &policy.Direction{Policies: []string{"app/deny"}},
		clientToWebAllowed: true, webToOutsideAllowed: true,
	}, {
		name:     "audited allow in both directions beside an enforced deny-all ingress",
		policies: []*networkingv1.NetworkPolicy{denyIn("deny"), annotated(fromAPI("allow"), "audit")},
		in:       &policy.Direction{Policies: []string{"app/deny"}},
		auIn:     &policy.Direction{Policies: []string{"app/allow"}, Rules: apiIn},
		auEg:     &policy.Direction{Policies: []string{"app/allow"}, Rules: dbOut},
		// web's egress is audited only: open as enforced.
		webToOutsideAllowed: true,
	}, {
		name:     "enforced allow, audited deny-all: the enforced rules alone",
		policies: []*networkingv1.NetworkPolicy{fromAPI("allow"), annotated(denyIn("deny"), "audit")},
		in:       &policy.Direction{Policies: []string{"app/allow"}, Rules: apiIn},
		eg:       &policy.Direction{Policies: []string{"app/allow"}, Rules: dbOut},
		auIn:     &policy.Direction{Policies: []string{"app/deny"}},
	}, {
		name:     "mode enforce, spelled out",
		policies: []*networkingv1.NetworkPolicy{annotated(denyIn("deny"), "enforce")},
		in:       &policy.Direction{Policies: []string{"app/deny"}},
		// web's egress is not isolated.
		webToOutsideAllowed: true,
	}, {
		name:                "an unknown mode is enforced",
		policies:            []*networkingv1.NetworkPolicy{annotated(denyIn("deny"), "Audit")},
		in:                  &policy.Direction{Policies: []string{"app/deny"}},
		webToOutsideAllowed: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			rs := compile(tc.policies...)
			p := rs.Pod(webKey)
			for _, d := range []struct {
				name      string
				got, want *policy.Direction
			}{{"ingress", p.Ingress, tc.in}, {"egress", p.Egress, tc.eg}, {"audited ingress", p.AuditIngress, tc.auIn}, {"audited egress", p.AuditEgress, tc.auEg}} {
				if !reflect.DeepEqual(d.got, d.want) {
					t.Errorf("web's %s: %s, want %s", d.name, d.got, d.want)
				}
			}
			if got := rs.Allows(policy.Connection{Client: client, Server: web, Proto: tcp, Port: 80}); got != tc.clientToWebAllowed {
				t.Errorf("client → web TCP/80 allowed %v, want %v", got, tc.clientToWebAllowed)
			}
			if got := rs.Allows(policy.Connection{Client: web, Server: outside, Proto: tcp, Port: 443}); got != tc.webToOutsideAllowed {
				t.Errorf("web → outside TCP/443 allowed %v, want %v", got, tc.webToOutsideAllowed)
			}
			if db := rs.Pod(dbKey); db.Isolated() || db.Audited() {
				t.Errorf("db is selected by no policy, but %+v", db)
			}
		})
	}
}
