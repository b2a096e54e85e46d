package policy

// The ClusterNetworkPolicy compiler against the cluster of compile_test.go:
// which local pods each policy's subject selects, what its peers and ports
// resolve to, the order the rules judge in, and what it does with what it
// cannot honour.

import (
	"fmt"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onc-net/onc/datapath/policy"
)

// The nodes: n1 (role=db) and n2 (role=web, dual-stack).
var nodes = []*corev1.Node{
	node("n1", map[string]string{"role": "db"}, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.1"},
		corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "203.0.113.1"}, corev1.NodeAddress{Type: corev1.NodeHostName, Address: "n1"}),
	node("n2", map[string]string{"role": "web"}, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "192.168.1.2"},
		corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: "fd00:1::2"}),
}

func node(name string, labels map[string]string, addrs ...corev1.NodeAddress) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Status: corev1.NodeStatus{Addresses: addrs}}
}

func cnpObj(name, tier string, priority int32, subject CNPSubject, ingress []CNPIngressRule, egress []CNPEgressRule) *ClusterNetworkPolicy {
	return &ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: CNPSpec{Tier: tier, Priority: priority, Subject: subject, Ingress: ingress, Egress: egress}}
}

func nsSubject(s *metav1.LabelSelector) CNPSubject { return CNPSubject{Namespaces: s} }

func podSubject(ns, pods *metav1.LabelSelector) CNPSubject {
	return CNPSubject{Pods: &CNPNamespacedPod{NamespaceSelector: *ns, PodSelector: *pods}}
}

func fromNamespaces(s *metav1.LabelSelector) CNPIngressPeer { return CNPIngressPeer{Namespaces: s} }

func fromPods(ns, pods *metav1.LabelSelector) CNPIngressPeer {
	return CNPIngressPeer{Pods: &CNPNamespacedPod{NamespaceSelector: *ns, PodSelector: *pods}}
}

func toNamespaces(s *metav1.LabelSelector) CNPEgressPeer { return CNPEgressPeer{Namespaces: s} }

func toPods(ns, pods *metav1.LabelSelector) CNPEgressPeer {
	return CNPEgressPeer{Pods: &CNPNamespacedPod{NamespaceSelector: *ns, PodSelector: *pods}}
}

func tcpPort(n int32) CNPProtocol {
	return CNPProtocol{TCP: &CNPProtocolPort{DestinationPort: &CNPPort{Number: n}}}
}

func namedPortP(name string) CNPProtocol { return CNPProtocol{DestinationNamedPort: name} }

func compileCNPs(cnps []*ClusterNetworkPolicy, nps ...*networkingv1.NetworkPolicy) policy.Ruleset {
	return Compile(Snapshot{Pods: pods, Namespaces: namespaces, Policies: nps, ClusterPolicies: cnps, Nodes: nodes}, local)
}

func checkTierRules(t *testing.T, what string, got, want []policy.TierRule) {
	t.Helper()
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}

// judged is a connection a direction must judge so: allowed or not, by
// the rule of policy and index at tier (policy "" for no rule).
type judged struct {
	ip     netip.Addr
	proto  policy.Proto
	port   uint16
	allow  bool
	tier   policy.Tier
	policy string
	index  int
}

func checkJudged(t *testing.T, what string, d *policy.Direction, js []judged) {
	t.Helper()
	if d == nil {
		t.Fatalf("%s: no direction", what)
	}
	for _, j := range js {
		v := d.Judge(j.ip, j.proto, j.port)
		if v.Allowed != j.allow || v.Tier != j.tier || v.Policy != j.policy || v.Index != j.index {
			t.Errorf("%s judges %s %s/%d: allowed %v by %s %s#%d, want %v by %s %s#%d", what, j.ip, j.proto, j.port,
				v.Allowed, v.Tier, v.Policy, v.Index, j.allow, j.tier, j.policy, j.index)
		}
	}
}

// A namespaces subject selects every pod of its namespaces, a pods subject
// the pods its two selectors both select; a pod on its node's network is
// no subject, and a direction no policy has rules for stays as it was.
func TestCNPSubjects(t *testing.T) {
	cnps := []*ClusterNetworkPolicy{
		cnpObj("ns", "Admin", 1, nsSubject(labelsel("team", "a")),
			[]CNPIngressRule{{Action: "Deny", From: []CNPIngressPeer{fromNamespaces(labelsel("team", "b"))}}}, nil),
		cnpObj("pods", "Baseline", 1, podSubject(labelsel("team", "a"), labelsel("app", "web")),
			nil, []CNPEgressRule{{Action: "Deny", To: []CNPEgressPeer{toNamespaces(labelsel("team", "b"))}}}),
		cnpObj("elsewhere", "Admin", 0, nsSubject(labelsel("team", "b")),
			[]CNPIngressRule{{Action: "Deny", From: []CNPIngressPeer{fromNamespaces(&all)}}}, nil),
		cnpObj("pods-elsewhere", "Admin", 0, podSubject(labelsel("team", "b"), labelsel("app", "web")),
			[]CNPIngressRule{{Action: "Deny", From: []CNPIngressPeer{fromNamespaces(&all)}}}, nil),
	}
	hostLocal := append(local[:len(local):len(local)], LocalPod{Namespace: "app", Name: "host", Iface: "veth-host", IPs: []netip.Addr{host}})
	rs := Compile(Snapshot{Pods: pods, Namespaces: namespaces, ClusterPolicies: cnps, Nodes: nodes}, hostLocal)
	fromB := prefixes("10.0.3.30/32", "10.0.3.31/32")
	nsRule := []policy.TierRule{{Policy: "ns", Priority: 1, Action: policy.Deny, Peers: fromB}}
	for _, key := range []string{webKey, dbKey, newKey} {
		p := rs.Pod(key)
		if p.Ingress == nil || !p.Ingress.ClusterOnly || len(p.Ingress.Policies) > 0 || p.Ingress.Baseline != nil {
			t.Fatalf("%s ingress: %+v, want ClusterOnly with the Admin rules of ns", key, p.Ingress)
		}
		checkTierRules(t, key+" ingress Admin", p.Ingress.Admin, nsRule)
		checkJudged(t, key+" ingress", p.Ingress, []judged{
			{client, tcp, 80, false, policy.TierAdmin, "ns", 0},
			{api, tcp, 80, true, policy.TierNetworkPolicy, "", 0},
		})
	}
	if p := rs.Pod(webKey); p.Egress == nil || !p.Egress.ClusterOnly || p.Egress.Admin != nil {
		t.Errorf("web egress: %+v, want ClusterOnly with the Baseline rules of pods", p.Egress)
	} else {
		checkTierRules(t, "web egress Baseline", p.Egress.Baseline, []policy.TierRule{{Policy: "pods", Priority: 1, Action: policy.Deny, Peers: fromB}})
		checkJudged(t, "web egress", p.Egress, []judged{
			{otherWeb, udp, 53, false, policy.TierBaseline, "pods", 0},
			{db, tcp, 5432, true, policy.TierNetworkPolicy, "", 0},
		})
	}
	for _, key := range []string{dbKey, newKey} {
		if p := rs.Pod(key); p.Egress != nil {
			t.Errorf("%s egress %+v: no egress rule selects it", key, p.Egress)
		}
	}
	if p := rs.Pod("app/host"); p.Ingress != nil || p.Egress != nil {
		t.Errorf("the host-network pod is a subject: ingress %+v, egress %+v", p.Ingress, p.Egress)
	}
}

// Peers: namespaces and pods select pods (every address, never one on its
// node's network or finished), networks are CIDRs, nodes their internal
// and external addresses.
func TestCNPPeers(t *testing.T) {
	cnp := cnpObj("peers", "Admin", 3, nsSubject(labelsel("team", "a")), []CNPIngressRule{
		{Name: "from-b", Action: "Accept", From: []CNPIngressPeer{fromNamespaces(labelsel("team", "b"))}},
		{Action: "Deny", From: []CNPIngressPeer{fromPods(&all, labelsel("app", "web"))}},
		{Action: "Pass", From: []CNPIngressPeer{fromPods(labelsel("team", "a"), labelsel("app", "dual"))}},
		{Action: "Accept", From: []CNPIngressPeer{fromPods(&all, labelsel("app", "new"))}},
	}, []CNPEgressRule{
		{Action: "Accept", To: []CNPEgressPeer{{Networks: []string{"10.9.0.0/16", "2001:db8::/32"}}}},
		{Action: "Deny", To: []CNPEgressPeer{{Nodes: labelsel("role", "db")}}},
		{Action: "Accept", To: []CNPEgressPeer{{Nodes: &all}}},
		{Action: "Accept", To: []CNPEgressPeer{toNamespaces(labelsel("team", "b")), {Networks: []string{"10.0.1.0/24"}}}},
	})
	rs := compileCNPs([]*ClusterNetworkPolicy{cnp})
	p := rs.Pod(webKey)
	rule := func(i int, name string, action policy.Action, peers []netip.Prefix) policy.TierRule {
		return policy.TierRule{Policy: "peers", Priority: 3, Index: i, Name: name, Action: action, Peers: peers}
	}
	checkTierRules(t, "ingress", p.Ingress.Admin, []policy.TierRule{
		rule(0, "from-b", policy.Accept, prefixes("10.0.3.30/32", "10.0.3.31/32")),
		rule(1, "", policy.Deny, prefixes("10.0.1.10/32", "10.0.3.31/32")), // not host, done, failed or pending
		rule(2, "", policy.Pass, prefixes("10.0.2.21/32", "fd00::21/128")),
		rule(3, "", policy.Accept, prefixes("10.0.1.12/32")), // the local pod's address while the API has none
	})
	checkTierRules(t, "egress", p.Egress.Admin, []policy.TierRule{
		rule(0, "", policy.Accept, prefixes("10.9.0.0/16", "2001:db8::/32")),
		rule(1, "", policy.Deny, prefixes("192.168.1.1/32", "203.0.113.1/32")),
		rule(2, "", policy.Accept, prefixes("192.168.1.1/32", "192.168.1.2/32", "203.0.113.1/32", "fd00:1::2/128")),
		rule(3, "", policy.Accept, prefixes("10.0.1.0/24", "10.0.3.30/32", "10.0.3.31/32")),
	})
}

// Ports: numbers and ranges per protocol; named ports are the subject
// pod's (ingress) or each peer's (egress, one rule per number), of the
// container port's protocol; a rule whose ports resolve to none matches
// nothing, one without protocols every port.
func TestCNPPorts(t *testing.T) {
	everyone := []CNPIngressPeer{fromNamespaces(&all)}
	cnp := cnpObj("ports", "Admin", 0, podSubject(&all, labelsel("app", "web")), []CNPIngressRule{
		{Action: "Accept", From: everyone, Protocols: []CNPProtocol{tcpPort(80),
			{UDP: &CNPProtocolPort{DestinationPort: &CNPPort{Range: &CNPPortRange{Start: 1000, End: 2000}}}},
			{SCTP: &CNPProtocolPort{DestinationPort: &CNPPort{Number: 9}}}}},
		{Action: "Accept", From: everyone, Protocols: []CNPProtocol{namedPortP("http"), namedPortP("dns"), namedPortP("missing")}},
		{Action: "Deny", From: everyone, Protocols: []CNPProtocol{namedPortP("missing")}},
		{Action: "Deny", From: everyone},
	}, []CNPEgressRule{
		{Action: "Accept", To: []CNPEgressPeer{toPods(&all, expr("app", metav1.LabelSelectorOpIn, "api", "client", "db"))},
			Protocols: []CNPProtocol{tcpPort(443), namedPortP("http")}},
		{Action: "Accept", To: []CNPEgressPeer{toPods(&all, labelsel("app", "db"))}, Protocols: []CNPProtocol{namedPortP("pg")}},
		{Action: "Accept", To: []CNPEgressPeer{toPods(&all, labelsel("app", "x"))}, Protocols: []CNPProtocol{namedPortP("pg")}},
	})
	rs := compileCNPs([]*ClusterNetworkPolicy{cnp})
	if p := rs.Pod(dbKey); p.Ingress != nil || p.Egress != nil {
		t.Errorf("db, not a subject, has tier rules: %+v %+v", p.Ingress, p.Egress)
	}
	p := rs.Pod(webKey)
	rule := func(i int, action policy.Action, peers []netip.Prefix, ports []policy.PortRange) policy.TierRule {
		return policy.TierRule{Policy: "ports", Index: i, Action: action, Peers: peers, Ports: ports}
	}
	peers := sortPrefixes(prefixes("10.0.1.10/32", "10.0.1.11/32", "10.0.1.12/32", "10.0.2.20/32", "10.0.2.21/32", "fd00::21/128",
		"10.0.2.22/32", "10.0.3.30/32", "10.0.3.31/32", "10.0.4.40/32"))
	checkTierRules(t, "ingress", p.Ingress.Admin, []policy.TierRule{
		rule(0, policy.Accept, peers, []policy.PortRange{{Proto: tcp, First: 80, Last: 80}, {Proto: udp, First: 1000, Last: 2000}, {Proto: sctp, First: 9, Last: 9}}),
		rule(1, policy.Accept, peers, []policy.PortRange{{Proto: tcp, First: 8080, Last: 8080}, {Proto: udp, First: 53, Last: 53}}),
		rule(2, policy.Deny, peers, []policy.PortRange{}),
		rule(3, policy.Deny, peers, nil),
	})
	checkJudged(t, "ingress", p.Ingress, []judged{
		{api, udp, 1500, true, policy.TierAdmin, "ports", 0},
		{api, udp, 999, false, policy.TierAdmin, "ports", 3},
		{api, tcp, 8080, true, policy.TierAdmin, "ports", 1},
		{api, tcp, 53, false, policy.TierAdmin, "ports", 3},
		{outside, tcp, 80, true, policy.TierNetworkPolicy, "", 0}, // not a pod: no peer
	})
	one := func(proto policy.Proto, n uint16) []policy.PortRange {
		return []policy.PortRange{{Proto: proto, First: n, Last: n}}
	}
	checkTierRules(t, "egress", p.Egress.Admin, []policy.TierRule{
		rule(0, policy.Accept, prefixes("10.0.1.11/32", "10.0.2.20/32", "10.0.3.30/32"), one(tcp, 443)),
		rule(0, policy.Accept, prefixes("10.0.2.20/32"), one(tcp, 8080)),
		rule(0, policy.Accept, prefixes("10.0.1.11/32"), one(tcp, 8081)), // its port has no protocol: TCP
		rule(0, policy.Accept, prefixes("10.0.3.30/32"), one(tcp, 9000)),
		rule(1, policy.Accept, prefixes("10.0.1.11/32"), one(tcp, 5432)), // only named ports, resolved: no rule of numbers
		rule(2, policy.Accept, prefixes("10.0.4.40/32"), []policy.PortRange{}),
	})
}

// Rules judge by tier, priority, policy name (equal priorities), then each
// policy's order; Pass hands over to NetworkPolicy where one isolates the
// pod, else to Baseline; Baseline judges only where none does.
func TestCNPOrder(t *testing.T) {
	cnps := []*ClusterNetworkPolicy{
		cnpObj("b", "Admin", 5, nsSubject(&all), []CNPIngressRule{
			{Action: "Accept", From: []CNPIngressPeer{fromNamespaces(labelsel("team", "b"))}, Protocols: []CNPProtocol{tcpPort(80)}},
			{Action: "Deny", From: []CNPIngressPeer{fromNamespaces(&all)}},
		}, nil),
		cnpObj("base", "Baseline", 0, nsSubject(&all), []CNPIngressRule{
			{Action: "Deny", From: []CNPIngressPeer{fromNamespaces(labelsel("team", "b"))}},
		}, nil),
		cnpObj("a", "Admin", 5, nsSubject(&all), []CNPIngressRule{
			{Action: "Deny", From: []CNPIngressPeer{fromPods(&all, labelsel("app", "api"))}},
		}, nil),
		cnpObj("z", "Admin", 1, nsSubject(&all), []CNPIngressRule{
			{Action: "Pass", From: []CNPIngressPeer{fromPods(&all, labelsel("app", "client"))}},
		}, nil),
	}
	np := netPolicy("np", networkingv1.NetworkPolicySpec{PodSelector: *labelsel("app", "web"), PolicyTypes: types(ingressT),
		Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{nsPeer(labelsel("team", "b"))},
			Ports: []networkingv1.NetworkPolicyPort{port(protoTCP, num(80))}}}})
	rs := compileCNPs(cnps, np)
	webIn, dbIn := rs.Pod(webKey).Ingress, rs.Pod(dbKey).Ingress
	var order []string
	for _, r := range webIn.Admin {
		order = append(order, fmt.Sprintf("%s#%d", r.Policy, r.Index))
	}
	if want := "z#0 a#0 b#0 b#1"; strings.Join(order, " ") != want {
		t.Errorf("Admin order %v, want %s", order, want)
	}
	if webIn.ClusterOnly || !reflect.DeepEqual(webIn.Policies, []string{"app/np"}) || len(webIn.Rules) != 1 || len(webIn.Baseline) != 1 {
		t.Errorf("web ingress %+v, want isolated by app/np with its rule, the Admin and the Baseline rules", webIn)
	}
	if !dbIn.ClusterOnly || len(dbIn.Policies) > 0 {
		t.Errorf("db ingress %+v, want ClusterOnly", dbIn)
	}
	checkJudged(t, "web ingress", webIn, []judged{
		{client, tcp, 80, true, policy.TierNetworkPolicy, "app/np", 0}, // z passes, the NetworkPolicy allows
		{client, tcp, 81, false, policy.TierNetworkPolicy, "", 0},      // z passes, the NetworkPolicy denies
		{otherWeb, tcp, 80, true, policy.TierAdmin, "b", 0},
		{api, tcp, 80, false, policy.TierAdmin, "a", 0}, // a before b: equal priorities, by name
		{thirdX, udp, 53, false, policy.TierAdmin, "b", 1},
		{outside, tcp, 80, false, policy.TierNetworkPolicy, "", 0}, // no tier rule: the NetworkPolicy denies
	})
	checkJudged(t, "db ingress", dbIn, []judged{
		{client, tcp, 80, false, policy.TierBaseline, "base", 0}, // z passes to Baseline: no NetworkPolicy isolates db
		{otherWeb, tcp, 80, true, policy.TierAdmin, "b", 0},
		{outside, tcp, 80, true, policy.TierNetworkPolicy, "", 0}, // nothing matches: allowed
	})
}

// What the agent cannot honour fails closed, as the API defines it: an
// Accept rule's unknown or domainNames peer, bad network or unknown
// protocol matches nothing; a Deny or Pass rule with one denies
// everything. Each is a problem the agent logs.
func TestCNPFailClosed(t *testing.T) {
	toAPI := []CNPEgressPeer{toPods(&all, labelsel("app", "api"))}
	domains := CNPEgressPeer{DomainNames: []string{"example.com"}}
	fc := cnpObj("fc", "Admin", 0, nsSubject(labelsel("team", "a")), []CNPIngressRule{
		{Action: "Accept", From: []CNPIngressPeer{{}, fromPods(&all, labelsel("app", "api"))}},
	}, []CNPEgressRule{
		{Action: "Accept", To: []CNPEgressPeer{domains}},
		{Action: "Deny", To: []CNPEgressPeer{domains}},
		{Action: "Pass", To: []CNPEgressPeer{{}}, Protocols: []CNPProtocol{tcpPort(80)}},
		{Action: "Accept", To: []CNPEgressPeer{{Networks: []string{"bogus"}}, {Networks: []string{"10.9.0.0/16"}}}},
		{Action: "Deny", To: toAPI, Protocols: []CNPProtocol{{}}},
		{Action: "Accept", To: toAPI, Protocols: []CNPProtocol{{}, tcpPort(80)}},
		{Action: "Drop", To: toAPI},
	})
	rs := compileCNPs([]*ClusterNetworkPolicy{fc})
	p := rs.Pod(webKey)
	rule := func(i int, action policy.Action, peers []netip.Prefix, ports []policy.PortRange) policy.TierRule {
		return policy.TierRule{Policy: "fc", Index: i, Action: action, Peers: peers, Ports: ports}
	}
	checkTierRules(t, "ingress", p.Ingress.Admin, []policy.TierRule{rule(0, policy.Accept, prefixes("10.0.2.20/32"), nil)})
	everywhere := prefixes("0.0.0.0/0", "::/0")
	checkTierRules(t, "egress", p.Egress.Admin, []policy.TierRule{
		rule(0, policy.Accept, nil, nil),
		rule(1, policy.Deny, everywhere, nil),
		rule(2, policy.Deny, everywhere, nil), // a Pass
		rule(3, policy.Accept, prefixes("10.9.0.0/16"), nil),
		rule(4, policy.Deny, everywhere, nil),
		rule(5, policy.Accept, prefixes("10.0.2.20/32"), []policy.PortRange{{Proto: tcp, First: 80, Last: 80}}),
		rule(6, policy.Deny, prefixes("10.0.2.20/32"), nil),
	})
	checkJudged(t, "egress", p.Egress, []judged{
		{outside, tcp, 443, false, policy.TierAdmin, "fc", 1},
		{addr("2001:db8::1"), udp, 53, false, policy.TierAdmin, "fc", 1},
	})
	if got := len(parseCNP(fc).problems); got != 8 {
		t.Errorf("fc: %d problems %q, want 8", got, parseCNP(fc).problems)
	}
}

// Invalid label selectors, which the CRD accepts (In without values, an
// operator "in"), fail closed like any peer the agent cannot resolve: an
// Accept rule's peer matches nothing, a Deny or Pass rule with one denies
// everything. They never select nothing quietly.
func TestCNPInvalidPeerSelectors(t *testing.T) {
	noValues := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "env", Operator: metav1.LabelSelectorOpIn}}}
	lower := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: "in", Values: []string{"api"}}}}
	cnp := cnpObj("sel", "Admin", 2, nsSubject(labelsel("team", "a")), []CNPIngressRule{
		{Action: "Accept", From: []CNPIngressPeer{fromNamespaces(noValues), fromNamespaces(labelsel("team", "b"))}},
		{Action: "Deny", From: []CNPIngressPeer{fromPods(&all, lower)}},
		{Action: "Pass", From: []CNPIngressPeer{fromPods(lower, &all)}},
	}, []CNPEgressRule{
		{Action: "Deny", To: []CNPEgressPeer{{Nodes: noValues}}},
		{Action: "Accept", To: []CNPEgressPeer{{Nodes: lower}}},
	})
	rs := compileCNPs([]*ClusterNetworkPolicy{cnp})
	p := rs.Pod(webKey)
	rule := func(i int, action policy.Action, peers []netip.Prefix) policy.TierRule {
		return policy.TierRule{Policy: "sel", Priority: 2, Index: i, Action: action, Peers: peers}
	}
	everywhere := prefixes("0.0.0.0/0", "::/0")
	checkTierRules(t, "ingress", p.Ingress.Admin, []policy.TierRule{
		rule(0, policy.Accept, prefixes("10.0.3.30/32", "10.0.3.31/32")),
		rule(1, policy.Deny, everywhere),
		rule(2, policy.Deny, everywhere), // a Pass
	})
	checkTierRules(t, "egress", p.Egress.Admin, []policy.TierRule{rule(0, policy.Deny, everywhere), rule(1, policy.Accept, nil)})
	checkJudged(t, "ingress", p.Ingress, []judged{{api, tcp, 80, false, policy.TierAdmin, "sel", 1}})
	checkJudged(t, "egress", p.Egress, []judged{{addr("192.168.1.1"), tcp, 22, false, policy.TierAdmin, "sel", 0}})
	if got := parseCNP(cnp).problems; len(got) != 5 || !strings.Contains(strings.Join(got, ";"), "is not a valid label selector operator") {
		t.Errorf("problems %q: want 5, naming the invalid operator", got)
	}
}

// A policy the agent cannot honour at all (an unknown tier, a subject
// with an invalid selector or of no known kind) fails closed as a whole:
// it selects every pod, and each of its rules denies everything, at its
// priority in its tier (Admin for an unknown tier). It is never ignored.
func TestCNPFailClosedWhole(t *testing.T) {
	noValues := &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}}
	everyone := []CNPIngressPeer{fromNamespaces(&all)}
	cnps := []*ClusterNetworkPolicy{
		cnpObj("typo", "Middle", 4, nsSubject(labelsel("team", "b")), []CNPIngressRule{{Name: "open", Action: "Accept", From: everyone}}, nil),
		cnpObj("badsubject", "Baseline", 7, podSubject(&all, noValues), []CNPIngressRule{{Action: "Accept", From: everyone}},
			[]CNPEgressRule{{Action: "Pass", To: []CNPEgressPeer{toNamespaces(&all)}}, {Action: "Accept", To: []CNPEgressPeer{toNamespaces(&all)}}}),
		cnpObj("nokind", "Admin", 9, CNPSubject{}, nil, []CNPEgressRule{{Action: "Accept", To: []CNPEgressPeer{toNamespaces(&all)}}}),
	}
	rs := compileCNPs(cnps)
	everywhere := prefixes("0.0.0.0/0", "::/0")
	deny := func(name string, priority int32, i int, rule string) policy.TierRule {
		return policy.TierRule{Policy: name, Priority: priority, Index: i, Name: rule, Action: policy.Deny, Peers: everywhere}
	}
	for _, key := range []string{webKey, dbKey} {
		p := rs.Pod(key)
		if p.Ingress == nil || p.Egress == nil {
			t.Fatalf("%s: ingress %+v, egress %+v; want both judged by the failed policies", key, p.Ingress, p.Egress)
		}
		checkTierRules(t, key+" ingress Admin", p.Ingress.Admin, []policy.TierRule{deny("typo", 4, 0, "open")})
		checkTierRules(t, key+" ingress Baseline", p.Ingress.Baseline, []policy.TierRule{deny("badsubject", 7, 0, "")})
		checkTierRules(t, key+" egress Admin", p.Egress.Admin, []policy.TierRule{deny("nokind", 9, 0, "")})
		checkTierRules(t, key+" egress Baseline", p.Egress.Baseline, []policy.TierRule{deny("badsubject", 7, 0, ""), deny("badsubject", 7, 1, "")})
		checkJudged(t, key+" ingress", p.Ingress, []judged{{client, tcp, 80, false, policy.TierAdmin, "typo", 0}})
		checkJudged(t, key+" egress", p.Egress, []judged{{outside, udp, 53, false, policy.TierAdmin, "nokind", 0}})
	}
	for _, cnp := range cnps {
		if cp := parseCNP(cnp); !cp.closed || len(cp.problems) != 1 || !strings.Contains(cp.problems[0], "every pod") {
			t.Errorf("%s: closed %v, problems %q; want failed closed as a whole, said once", cnp.Name, cp.closed, cp.problems)
		}
	}
}

// With ClusterNetworkPolicies about, a pod's directions change only when
// its rules do: an update of what no rule reads (a pod's new object with
// the same content, as a readiness change leaves it; a node no rule
// selects) changes none, a policy's change those of its subjects.
func TestIncrementalTiers(t *testing.T) {
	fromB := func(port int32) []CNPIngressRule {
		return []CNPIngressRule{{Action: "Deny", From: []CNPIngressPeer{fromNamespaces(labelsel("team", "b"))}, Protocols: []CNPProtocol{tcpPort(port)}}}
	}
	s := Snapshot{Namespaces: slices.Clone(namespaces), Pods: slices.Clone(pods), Nodes: slices.Clone(nodes), ClusterPolicies: []*ClusterNetworkPolicy{
		cnpObj("c", "Admin", 0, podSubject(&all, labelsel("app", "web")), fromB(80), nil),
		cnpObj("d", "Baseline", 0, podSubject(&all, labelsel("app", "db")), fromB(5432), nil),
	}}
	var inc Incremental
	last := inc.Compile(s, local)
	for _, step := range []struct {
		what       string
		change     func()
		recompiled []string
	}{
		{"a pod copied", func() { s.Pods[3] = s.Pods[3].DeepCopy() }, nil},
		{"web's policy", func() {
			s.ClusterPolicies[0] = cnpObj("c", "Admin", 0, podSubject(&all, labelsel("app", "web")), fromB(81), nil)
		}, []string{webKey}},
		{"a node's labels", func() { s.Nodes[0] = node("n1", map[string]string{"role": "x"}, nodes[0].Status.Addresses...) }, nil},
		{"the peers' namespace", func() { s.Namespaces[1] = namespace("other", map[string]string{"team": "c"}) }, []string{dbKey, webKey}},
		{"web's policy deleted", func() { s.ClusterPolicies = s.ClusterPolicies[1:] }, []string{webKey}},
		{"a resync", func() {}, nil},
	} {
		step.change()
		rs := inc.Compile(s, local)
		if want := Compile(s, local); !reflect.DeepEqual(rs, want) {
			t.Fatalf("%s: got %s\nwant %s", step.what, describe(rs), describe(want))
		}
		var recompiled []string
		for i, p := range rs.Pods {
			if p.Ingress != last.Pods[i].Ingress {
				recompiled = append(recompiled, p.Key)
			}
		}
		if !slices.Equal(recompiled, step.recompiled) {
			t.Errorf("%s: new directions for %v, want %v", step.what, recompiled, step.recompiled)
		}
		last = rs
	}
}

// Tier rules are recompiled for what they read, not for every new object:
// a pod's or node's new object with the same content (a readiness or
// heartbeat update) is no change, a label is; nothing is one while no
// ClusterNetworkPolicy exists.
func TestTierChanges(t *testing.T) {
	cnps := []*ClusterNetworkPolicy{cnpObj("c", "Admin", 0, nsSubject(&all), nil, nil)}
	base := Snapshot{Namespaces: namespaces, Pods: slices.Clone(pods), Nodes: slices.Clone(nodes), ClusterPolicies: cnps}
	for _, tc := range []struct {
		what     string
		change   func(*Snapshot)
		want     bool
		noPolicy bool // none before the change either
	}{
		{"nothing", func(*Snapshot) {}, false, false},
		{"a pod copied", func(s *Snapshot) { s.Pods[0] = s.Pods[0].DeepCopy() }, false, false},
		{"a node copied", func(s *Snapshot) { s.Nodes[0] = s.Nodes[0].DeepCopy() }, false, false},
		{"a pod's labels", func(s *Snapshot) {
			s.Pods[0] = with(s.Pods[0].DeepCopy(), func(p *corev1.Pod) { p.Labels = map[string]string{"app": "x"} })
		}, true, false},
		{"a node's address", func(s *Snapshot) { s.Nodes[1] = node("n2", nodes[1].Labels) }, true, false},
		{"a policy", func(s *Snapshot) {
			s.ClusterPolicies = []*ClusterNetworkPolicy{cnpObj("c", "Admin", 1, nsSubject(&all), nil, nil)}
		}, true, false},
		{"a pod's labels, no policy", func(s *Snapshot) {
			s.Pods[0] = with(s.Pods[0].DeepCopy(), func(p *corev1.Pod) { p.Labels = nil })
		}, false, true},
	} {
		prev := base
		if tc.noPolicy {
			prev.ClusterPolicies = nil
		}
		next := prev
		next.Pods, next.Nodes = slices.Clone(prev.Pods), slices.Clone(prev.Nodes)
		tc.change(&next)
		before := newCompiler(prev, local, nil)
		if policies, peers := tierChanges(before, newCompiler(next, local, before)); (policies || peers) != tc.want {
			t.Errorf("%s: tierChanges %v, %v; want a change: %v", tc.what, policies, peers, tc.want)
		}
	}
}

// Rules with the same peers share one resolved list, which the datapath
// then cuts once for them all; a change of policies alone keeps the
// others' lists, and after any other the result is still Compile's.
func TestTierPeersResolvedOnce(t *testing.T) {
	fromB := func(port int32) []CNPIngressRule {
		return []CNPIngressRule{{Action: "Deny", From: []CNPIngressPeer{fromNamespaces(labelsel("team", "b"))}, Protocols: []CNPProtocol{tcpPort(port)}}}
	}
	web := podSubject(&all, labelsel("app", "web"))
	s := Snapshot{Namespaces: slices.Clone(namespaces), Pods: slices.Clone(pods), Nodes: slices.Clone(nodes), ClusterPolicies: []*ClusterNetworkPolicy{
		cnpObj("c", "Admin", 0, web, fromB(80), nil),
		cnpObj("d", "Baseline", 0, web, fromB(5432), nil),
		cnpObj("e", "Admin", 1, web, fromB(81), nil),
	}}
	peersOf := func(rs policy.Ruleset) [][]netip.Prefix {
		for _, p := range rs.Pods {
			if p.Key == webKey {
				return [][]netip.Prefix{p.Ingress.Admin[0].Peers, p.Ingress.Admin[1].Peers, p.Ingress.Baseline[0].Peers}
			}
		}
		t.Fatalf("no pod %s in %s", webKey, describe(rs))
		return nil
	}
	same := func(a, b []netip.Prefix) bool { return len(a) > 0 && len(a) == len(b) && &a[0] == &b[0] }
	var inc Incremental
	first := peersOf(inc.Compile(s, local))
	if !same(first[0], first[1]) || !same(first[0], first[2]) {
		t.Fatalf("the rules' equal peers are separate lists: %v", first)
	}
	s.ClusterPolicies[0] = cnpObj("c", "Admin", 0, web, fromB(82), nil)
	if again := peersOf(inc.Compile(s, local)); !same(again[0], first[0]) || !same(again[1], first[1]) || !same(again[2], first[2]) {
		t.Error("a change of one policy resolved peers again: its own, written as the others', or the others'")
	}
	s.Pods[3] = with(s.Pods[3].DeepCopy(), func(p *corev1.Pod) { p.Labels = map[string]string{"app": "x"} })
	rs := inc.Compile(s, local)
	if want := Compile(s, local); !reflect.DeepEqual(rs, want) {
		t.Fatalf("after a pod's labels changed: got %s\nwant %s", describe(rs), describe(want))
	}
}
