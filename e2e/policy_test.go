//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	agentpolicy "github.com/onc-net/onc/agent/policy"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
)

// NetworkPolicy end to end, in the lab's Kubernetes mode on two nodes,
// dual-stack: three namespaces, seven labelled pods with named container
// ports and an address of each family, both same-node and cross-node
// pairs. One lab serves every subtest:
//
//   - TruthTable: a sequence of policy sets (and label changes), each
//     followed by a probe of every ordered pod pair over TCP and UDP in
//     IPv4, compared with an oracle written here from the Kubernetes
//     semantics (not from agent/policy); with the fast path on, the flow
//     cache must never hold a usable entry for a denied flow; and onctl
//     trace of every probe must give the verdict the probe met, naming the
//     policies the oracle names (e2e/trace_test.go). Then again with the
//     fast path off.
//   - TruthTable/IPv6: the same steps with the fast path on, every pair
//     probed at the destination's IPv6 address; the oracle judges an
//     ipBlock by the probe's family (an IPv4 block matches no IPv6 peer),
//     a peer pod by either of its addresses. TruthTable/IPv6/FastPathOff
//     and TruthTable/IPv6/BypassOn: the same with the fast path off, and
//     with the intra-node bypass on.
//   - Trace: the onctl binary prints traces and refuses a source of
//     another node.
//   - Onctl: `onctl policy` shows an isolated pod, its policies, rules and
//     counters.
//   - Flows and Export (e2e/flows_test.go, e2e/export_test.go): onctl
//     flows shows denied connections; the export delivers them intact to
//     a real OpenTelemetry Collector and a JSON-lines file.
//   - StrictRevocation: a policy that denies a running connection ends it
//     on the fast path within 1 s of the agents applying it.
//   - ConnectionSetup: a connection the fast path opened (no policy
//     isolating either pod) is handed over to conntrack when a policy that
//     allows it isolates its server, lives on, and ends when one denies it.
//   - AgentRestart: with policies in place, restarted agents keep denied
//     denied and allowed allowed, also while they are down, and an
//     established allowed connection lives on.
//   - TruthTable/BypassOn, StrictRevocation/Bypassed, Bypass and
//     Bypass/SameAsStack: the intra-node bypass (e2e/bypass_test.go).
func TestPolicy(t *testing.T) {
	c := newPolicyCluster(t)
	t.Run("TruthTable/FastPathOn", func(t *testing.T) { c.truthTable(t, true, false, probeIPv4) })
	t.Run("TruthTable/IPv6", func(t *testing.T) { c.truthTable(t, true, false, probeIPv6) })
	t.Run("TruthTable/FastPathOff", func(t *testing.T) {
		c.setFastPath(t, false)
		defer c.setFastPath(t, true)
		c.truthTable(t, false, false, probeIPv4)
	})
	t.Run("TruthTable/BypassOn", func(t *testing.T) {
		c.setBypass(t, "on")
		defer c.setBypass(t, "off")
		c.truthTable(t, true, true, probeIPv4)
	})
	t.Run("TruthTable/IPv6/FastPathOff", func(t *testing.T) {
		c.setFastPath(t, false)
		defer c.setFastPath(t, true)
		c.truthTable(t, false, false, probeIPv6)
	})
	t.Run("TruthTable/IPv6/BypassOn", func(t *testing.T) {
		c.setBypass(t, "on")
		defer c.setBypass(t, "off")
		c.truthTable(t, true, true, probeIPv6)
	})
	t.Run("OverlayInjection", c.overlayInjection)
	t.Run("Onctl", c.onctl)
	t.Run("Flows", c.flows)
	t.Run("Flows/Audit", c.flowsAudit)
	t.Run("Export", c.export)
	t.Run("Trace", c.trace)
	t.Run("StrictRevocation", c.strictRevocation)
	t.Run("StrictRevocation/Bypassed", c.strictRevocationBypassed)
	t.Run("ConnectionSetup", c.connectionSetup)
	t.Run("Bypass", c.bypassed)
	t.Run("Bypass/SameAsStack", c.bypassSameAsStack)
	t.Run("AgentRestart", c.agentRestart)
}

// probeTimeout bounds one probe: a denied TCP connect or UDP echo fails
// after it.
const probeTimeout = time.Second

// Every pod serves these, and every probe round tries each of them.
var (
	tcpPorts = []int{80, 81, 82}
	udpPorts = []int{80, 81}
	probes   = []probeKind{{corev1.ProtocolTCP, 80}, {corev1.ProtocolTCP, 81}, {corev1.ProtocolTCP, 82},
		{corev1.ProtocolUDP, 80}, {corev1.ProtocolUDP, 81}}
)

type probeKind struct {
	proto corev1.Protocol
	port  int
}

func (k probeKind) String() string { return fmt.Sprintf("%s/%d", k.proto, k.port) }

// probeFamily is the IP family a probe runs in: from the source pod's
// address of it to the destination's.
type probeFamily int

const (
	probeIPv4 probeFamily = 4
	probeIPv6 probeFamily = 6
)

func (f probeFamily) String() string { return fmt.Sprintf("IPv%d", int(f)) }

// tpod is a pod of the test: what the oracle knows of it, and the lab pod.
type tpod struct {
	ns, name string
	node     int // index in l.Nodes
	labels   map[string]string
	ports    []corev1.ContainerPort
	lp       *lab.Pod
}

func (p *tpod) key() string { return p.ns + "/" + p.name }

// addr is p's address of family f.
func (p *tpod) addr(f probeFamily) netip.Addr {
	if f == probeIPv6 {
		return p.lp.IPv6
	}
	return p.lp.IP
}

type policyCluster struct {
	l        *lab.Lab
	kube     kubernetes.Interface
	pods     []*tpod
	byKey    map[string]*tpod
	nsLabels map[string]map[string]string // as the oracle sees them
	cidr     netip.Prefix                 // the cluster CIDR: every pod IP
	cidr6    netip.Prefix                 // the IPv6 one: every pod IPv6
	// cnps are the ClusterNetworkPolicies in force (apply puts them in
	// the API), as the oracle judges them: the truth table's steps set
	// them, everything else leaves them none.
	cnps   []*agentpolicy.ClusterNetworkPolicy
	cnpAPI dynamic.ResourceInterface // where apply puts them
}

func newPolicyCluster(t *testing.T) *policyCluster {
	ctx := context.Background()
	l := labtest.Lab(t, lab.Options{Nodes: 2, Datastore: "kubernetes", IPFamily: lab.IPFamilyDual})
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(l.APIServer.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	c := &policyCluster{l: l, kube: kube, byKey: map[string]*tpod{}, nsLabels: map[string]map[string]string{}, cnpAPI: dyn.Resource(cnpResource)}
	for _, ns := range []string{"x", "y", "z"} {
		c.nsLabels[ns] = map[string]string{"ns": ns}
		if err := l.SetNamespace(ctx, ns, c.nsLabels[ns]); err != nil {
			t.Fatal(err)
		}
	}
	// Every pod names its ports serve-<port>-<proto>; "web" is TCP 80 in
	// x, TCP 81 in y and absent in z, so a named port resolves per pod.
	ports := func(ns string) []corev1.ContainerPort {
		var out []corev1.ContainerPort
		for _, k := range probes {
			out = append(out, corev1.ContainerPort{Name: fmt.Sprintf("serve-%d-%s", k.port, strings.ToLower(string(k.proto))),
				ContainerPort: int32(k.port), Protocol: k.proto})
		}
		switch ns {
		case "x":
			out = append(out, corev1.ContainerPort{Name: "web", ContainerPort: 80, Protocol: corev1.ProtocolTCP})
		case "y":
			out = append(out, corev1.ContainerPort{Name: "web", ContainerPort: 81, Protocol: corev1.ProtocolTCP})
		}
		return out
	}
	for _, p := range []*tpod{
		{ns: "x", name: "a", node: 0, labels: map[string]string{"app": "a", "tier": "web"}},
		{ns: "x", name: "b", node: 1, labels: map[string]string{"app": "b", "tier": "db"}},
		{ns: "x", name: "c", node: 0, labels: map[string]string{"app": "c"}},
		{ns: "y", name: "a", node: 1, labels: map[string]string{"app": "a", "tier": "web"}},
		{ns: "y", name: "b", node: 0, labels: map[string]string{"app": "b"}},
		{ns: "z", name: "a", node: 0, labels: map[string]string{"app": "a"}},
		{ns: "z", name: "c", node: 1, labels: map[string]string{"app": "c", "tier": "db"}},
	} {
		p.ports = ports(p.ns)
		p.lp, err = l.AddPodSpec(ctx, l.Nodes[p.node], lab.PodSpec{Namespace: p.ns, Name: p.name, Labels: p.labels, Ports: p.ports})
		if err != nil {
			t.Fatal(err)
		}
		c.pods = append(c.pods, p)
		c.byKey[p.key()] = p
	}
	var netnses []string
	for _, p := range c.pods {
		netnses = append(netnses, p.lp.Netns)
	}
	for _, serve := range []func([]string, []int, []int) (func(), error){lab.ServeEcho, lab.ServeEcho6} {
		stop, err := serve(netnses, tcpPorts, udpPorts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	st, err := l.Nodes[0].Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.cidr, err = netip.ParsePrefix(st.ClusterCidr); err != nil {
		t.Fatalf("cluster CIDR %q: %v", st.ClusterCidr, err)
	}
	for _, cidr := range strings.Split(lab.ClusterCIDRs, ",") {
		if p := netip.MustParsePrefix(cidr); p.Addr().Is6() {
			c.cidr6 = p
		}
	}
	for _, p := range c.pods {
		if !c.cidr.Contains(p.lp.IP) || !c.cidr6.Contains(p.lp.IPv6) {
			t.Fatalf("%s has %s and %s: want an address of %s and one of %s", p.key(), p.lp.IP, p.lp.IPv6, c.cidr, c.cidr6)
		}
	}
	return c
}

func (c *policyCluster) pod(key string) *tpod {
	p := c.byKey[key]
	if p == nil {
		panic("no test pod " + key)
	}
	return p
}

func (c *policyCluster) node(p *tpod) *lab.Node { return c.l.Nodes[p.node] }

// setFastPath switches every node's fast path and waits until each node
// sees the others' new state.
func (c *policyCluster) setFastPath(t *testing.T, on bool) {
	t.Helper()
	for _, n := range c.l.Nodes {
		setFastPath(t, n, on)
	}
	for _, n := range c.l.Nodes {
		for _, m := range c.l.Nodes {
			if m != n {
				waitPeerFlag(t, n, m.Name, on)
			}
		}
	}
}

// ---------------------------------------------------------------------
// The oracle: NetworkPolicy semantics (networking.k8s.io/v1), evaluated
// directly on the objects the test creates, for pods whose labels,
// namespaces, IPs and container ports the test knows.

// allowed is the verdict on a new connection of ce, from its source to
// its destination's port in its family: the destination's ingress and the
// source's egress must both allow it, each judged tier by tier with the
// ClusterNetworkPolicies in force (decide, policy_tiers_test.go).
func (c *policyCluster) allowed(pols []*networkingv1.NetworkPolicy, ce cell) bool {
	return c.ingressAllows(pols, ce) && c.egressAllows(pols, ce)
}

func (c *policyCluster) ingressAllows(pols []*networkingv1.NetworkPolicy, ce cell) bool {
	return c.decide(pols, ce, true).allowed
}

func (c *policyCluster) egressAllows(pols []*networkingv1.NetworkPolicy, ce cell) bool {
	return c.decide(pols, ce, false).allowed
}

// npVerdict is NetworkPolicy's on ce in one direction: a pod no enforcing
// policy selects in it is not isolated; an isolated one allows the union
// of its enforcing policies' rules there (egress named ports resolve on
// the destination pod). Audited policies enforce nothing.
func (c *policyCluster) npVerdict(pols []*networkingv1.NetworkPolicy, ce cell, ingress bool) (isolated, allowed bool) {
	for _, p := range pols {
		ing, eg := policyTypes(p)
		if audited(p) || (ingress && (!ing || !c.selects(p, ce.dst))) || (!ingress && (!eg || !c.selects(p, ce.src))) {
			continue
		}
		isolated = true
		if ingress {
			for _, r := range p.Spec.Ingress {
				if c.peersMatch(p.Namespace, r.From, ce.src, ce.fam) && portsMatch(r.Ports, ce.dst, ce.k) {
					return true, true
				}
			}
			continue
		}
		for _, r := range p.Spec.Egress {
			if c.peersMatch(p.Namespace, r.To, ce.dst, ce.fam) && portsMatch(r.Ports, ce.dst, ce.k) {
				return true, true
			}
		}
	}
	return isolated, !isolated
}

// isolatedBy lists (sorted) the enforcing policies that isolate pod in a
// direction.
func (c *policyCluster) isolatedBy(pols []*networkingv1.NetworkPolicy, pod *tpod, ingress bool) []string {
	return c.selectedBy(pols, pod, ingress, false)
}

// auditAnnotation marks a policy audited (docs/policy.md).
const auditAnnotation = "onc.io/policy-mode"

func audited(p *networkingv1.NetworkPolicy) bool { return p.Annotations[auditAnnotation] == "audit" }

// selectedBy lists (sorted) the policies, audited or enforcing, that
// select pod in a direction.
func (c *policyCluster) selectedBy(pols []*networkingv1.NetworkPolicy, pod *tpod, ingress, audit bool) []string {
	var out []string
	for _, p := range pols {
		ing, eg := policyTypes(p)
		if audited(p) == audit && ((ingress && ing) || (!ingress && eg)) && c.selects(p, pod) {
			out = append(out, p.Namespace+"/"+p.Name)
		}
	}
	sort.Strings(out)
	return out
}

// policyTypes: without policyTypes a policy is for ingress, and also for
// egress if it has egress rules.
func policyTypes(p *networkingv1.NetworkPolicy) (ingress, egress bool) {
	if len(p.Spec.PolicyTypes) == 0 {
		return true, len(p.Spec.Egress) > 0
	}
	for _, ty := range p.Spec.PolicyTypes {
		ingress = ingress || ty == networkingv1.PolicyTypeIngress
		egress = egress || ty == networkingv1.PolicyTypeEgress
	}
	return ingress, egress
}

// selects: the policy's podSelector, in the policy's own namespace.
func (c *policyCluster) selects(p *networkingv1.NetworkPolicy, pod *tpod) bool {
	return p.Namespace == pod.ns && labelsMatch(&p.Spec.PodSelector, pod.labels)
}

// peersMatch: no peers means every peer; otherwise any one of them. An
// ipBlock matches pod's address of the connection's family f only (an
// IPv4 CIDR holds no IPv6 address); a pod peer is the pod in either.
func (c *policyCluster) peersMatch(policyNS string, peers []networkingv1.NetworkPolicyPeer, pod *tpod, f probeFamily) bool {
	if len(peers) == 0 {
		return true
	}
	ip := pod.addr(f)
	for _, peer := range peers {
		if b := peer.IPBlock; b != nil {
			if prefixHas(b.CIDR, ip) && !slices.ContainsFunc(b.Except, func(e string) bool { return prefixHas(e, ip) }) {
				return true
			}
			continue
		}
		// namespaceSelector absent: the policy's namespace; present (even
		// empty): the namespaces it selects. podSelector absent: every pod
		// there.
		nsOK := pod.ns == policyNS
		if peer.NamespaceSelector != nil {
			nsOK = labelsMatch(peer.NamespaceSelector, c.namespaceLabels(pod.ns))
		}
		if nsOK && (peer.PodSelector == nil || labelsMatch(peer.PodSelector, pod.labels)) {
			return true
		}
	}
	return false
}

// namespaceLabels are the labels a namespace has in the API: ours and the
// one the API server adds.
func (c *policyCluster) namespaceLabels(ns string) map[string]string {
	out := map[string]string{"kubernetes.io/metadata.name": ns}
	for k, v := range c.nsLabels[ns] {
		out[k] = v
	}
	return out
}

func prefixHas(cidr string, ip netip.Addr) bool {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		panic(err)
	}
	return p.Contains(ip)
}

// portsMatch: no ports means every port of every protocol; a port without
// a number every port of its protocol (TCP by default); a number up to
// endPort; a name, the destination pod's container port of that name and
// protocol.
func portsMatch(ports []networkingv1.NetworkPolicyPort, dst *tpod, k probeKind) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		proto := corev1.ProtocolTCP
		if pp.Protocol != nil {
			proto = *pp.Protocol
		}
		if proto != k.proto {
			continue
		}
		switch {
		case pp.Port == nil:
			return true
		case pp.Port.Type == intstr.Int:
			last := pp.Port.IntVal
			if pp.EndPort != nil {
				last = *pp.EndPort
			}
			if int32(k.port) >= pp.Port.IntVal && int32(k.port) <= last {
				return true
			}
		default:
			for _, cp := range dst.ports {
				cproto := cp.Protocol
				if cproto == "" {
					cproto = corev1.ProtocolTCP
				}
				if cp.Name == pp.Port.StrVal && cproto == k.proto && int(cp.ContainerPort) == k.port {
					return true
				}
			}
		}
	}
	return false
}

// labelsMatch evaluates a label selector: every matchLabels pair and
// every matchExpressions requirement must hold; an empty one matches all.
func labelsMatch(s *metav1.LabelSelector, labels map[string]string) bool {
	for k, v := range s.MatchLabels {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	for _, e := range s.MatchExpressions {
		v, ok := labels[e.Key]
		in := ok && slices.Contains(e.Values, v)
		switch e.Operator {
		case metav1.LabelSelectorOpIn:
			if !in {
				return false
			}
		case metav1.LabelSelectorOpNotIn:
			if in {
				return false
			}
		case metav1.LabelSelectorOpExists:
			if !ok {
				return false
			}
		case metav1.LabelSelectorOpDoesNotExist:
			if ok {
				return false
			}
		default:
			panic("operator " + e.Operator)
		}
	}
	return true
}

// ---------------------------------------------------------------------
// Building policies.

func netpol(ns, name string, pods metav1.LabelSelector, types []networkingv1.PolicyType,
	ingress []networkingv1.NetworkPolicyIngressRule, egress []networkingv1.NetworkPolicyEgressRule) *networkingv1.NetworkPolicy {
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: pods, PolicyTypes: types, Ingress: ingress, Egress: egress}}
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	bothTypes   = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
)

// sel is a matchLabels selector of key, value pairs (none: everything).
func sel(kv ...string) metav1.LabelSelector {
	s := metav1.LabelSelector{}
	for i := 0; i+1 < len(kv); i += 2 {
		if s.MatchLabels == nil {
			s.MatchLabels = map[string]string{}
		}
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func selp(kv ...string) *metav1.LabelSelector { s := sel(kv...); return &s }

func expr(key string, op metav1.LabelSelectorOperator, values ...string) *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: op, Values: values}}}
}

func port(proto corev1.Protocol, p any, endPort ...int32) networkingv1.NetworkPolicyPort {
	out := networkingv1.NetworkPolicyPort{Protocol: &proto}
	switch v := p.(type) {
	case int:
		ip := intstr.FromInt32(int32(v))
		out.Port = &ip
	case string:
		sp := intstr.FromString(v)
		out.Port = &sp
	case nil:
	default:
		panic(fmt.Sprintf("port %v", p))
	}
	if len(endPort) == 1 {
		out.EndPort = &endPort[0]
	}
	return out
}

func from(peers ...networkingv1.NetworkPolicyPeer) []networkingv1.NetworkPolicyPeer { return peers }

func ingressRule(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyIngressRule {
	return []networkingv1.NetworkPolicyIngressRule{{From: peers, Ports: ports}}
}

func egressRule(peers []networkingv1.NetworkPolicyPeer, ports ...networkingv1.NetworkPolicyPort) []networkingv1.NetworkPolicyEgressRule {
	return []networkingv1.NetworkPolicyEgressRule{{To: peers, Ports: ports}}
}

// policyStep is one row of the truth table: the complete set of policies
// (NetworkPolicies and ClusterNetworkPolicies) in force, and optionally a label change made after they are applied
// (undone by revert once the table is done).
type policyStep struct {
	name   string
	pols   []*networkingv1.NetworkPolicy
	cnps   []*agentpolicy.ClusterNetworkPolicy
	change func(t *testing.T)
	revert func(t *testing.T)
}

func (c *policyCluster) steps() []policyStep {
	ctx := context.Background()
	tcp, udp := corev1.ProtocolTCP, corev1.ProtocolUDP
	denyX := netpol("x", "deny-ingress", sel(), ingressOnly, nil, nil)
	allowPod := netpol("x", "allow-a-from-b", sel("app", "a"), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "b")})), nil)
	allowNS := netpol("x", "allow-from-ns-y", sel(), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: selp("ns", "y")})), nil)
	xA, xB, yA, yB := c.pod("x/a"), c.pod("x/b"), c.pod("y/a"), c.pod("y/b")
	node2v6, err := xB.lp.IPv6.Prefix(64) // node 2's IPv6 block
	if err != nil {
		panic(err)
	}
	// host is p's address of family f as a CIDR.
	host := func(p *tpod, f probeFamily) string {
		ip := p.addr(f)
		return netip.PrefixFrom(ip, ip.BitLen()).String()
	}
	block := func(cidr string, except ...string) networkingv1.NetworkPolicyPeer {
		return networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: cidr, Except: except}}
	}
	return append([]policyStep{
		{name: "none", pols: nil},
		{name: "default-deny ingress in x", pols: []*networkingv1.NetworkPolicy{denyX}},
		{name: "allow by pod selector", pols: []*networkingv1.NetworkPolicy{denyX, allowPod}},
		{name: "allow by namespace selector", pols: []*networkingv1.NetworkPolicy{denyX, allowNS}},
		{name: "allow by namespace and pod selector", pols: []*networkingv1.NetworkPolicy{denyX,
			netpol("x", "allow-app-a-from-y-z", sel(), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{
				NamespaceSelector: expr("ns", metav1.LabelSelectorOpIn, "y", "z"), PodSelector: selp("app", "a")})), nil)}},
		{name: "ipBlock with except", pols: []*networkingv1.NetworkPolicy{
			netpol("x", "ipblock", sel("app", "a"), ingressOnly, ingressRule(from(block(c.cidr.String(), host(yA, probeIPv4)))), nil),
			netpol("z", "ipblock-one", sel("app", "c"), ingressOnly, ingressRule(from(block(host(xB, probeIPv4)))), nil)}},
		// The same in IPv6, and an egress one: these admit no IPv4 peer.
		{name: "IPv6 ipBlock with except", pols: []*networkingv1.NetworkPolicy{
			netpol("x", "ipblock6", sel("app", "a"), ingressOnly, ingressRule(from(block(c.cidr6.String(), host(yA, probeIPv6)))), nil),
			netpol("z", "ipblock6-one", sel("app", "c"), ingressOnly, ingressRule(from(block(host(xB, probeIPv6)))), nil),
			netpol("y", "b-to-node-1-ipv6", sel("app", "b"), egressOnly, nil, egressRule(from(block(c.cidr6.String(), node2v6.String()))))}},
		// Each family's whole range admits nothing of the other; in one
		// rule, a pod named by its IPv4 block, one by its IPv6 block and
		// one by its labels (in either family).
		{name: "ipBlocks of both families", pols: []*networkingv1.NetworkPolicy{
			netpol("x", "c-from-any-ipv4", sel("app", "c"), ingressOnly, ingressRule(from(block("0.0.0.0/0"))), nil),
			netpol("y", "a-from-any-ipv6", sel("app", "a"), ingressOnly, ingressRule(from(block("::/0", host(xB, probeIPv6))), port(tcp, 80, 81)), nil),
			netpol("z", "a-to-mixed", sel("app", "a"), egressOnly, nil, egressRule(from(block(host(xA, probeIPv4)), block(host(xB, probeIPv6)),
				networkingv1.NetworkPolicyPeer{NamespaceSelector: selp("ns", "y"), PodSelector: selp("app", "b")}))),
			netpol("z", "c-from-mixed", sel("app", "c"), ingressOnly, ingressRule(from(block(host(yB, probeIPv4)),
				networkingv1.NetworkPolicyPeer{NamespaceSelector: selp("ns", "x"), PodSelector: selp("tier", "web")})), nil)}},
		{name: "named ports", pols: []*networkingv1.NetworkPolicy{
			netpol("x", "named", sel(), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp(), NamespaceSelector: selp()}),
				port(tcp, "serve-81-tcp"), port(udp, "serve-80-udp")), nil),
			netpol("y", "web-in", sel(), ingressOnly, ingressRule(nil, port(tcp, "web")), nil),
			netpol("z", "web-out", sel("app", "c"), egressOnly, nil, egressRule(nil, port(tcp, "web")))}},
		{name: "endPort and protocol-only ports", pols: []*networkingv1.NetworkPolicy{
			netpol("x", "tcp-80-81", sel(), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: selp()}), port(tcp, 80, 81)), nil),
			netpol("y", "udp-80-81", sel("app", "a"), ingressOnly, ingressRule(nil, port(udp, 80, 81)), nil),
			netpol("z", "all-udp", sel(), ingressOnly, ingressRule(nil, port(udp, nil)), nil)}},
		{name: "egress only", pols: []*networkingv1.NetworkPolicy{
			netpol("y", "deny-egress", sel(), egressOnly, nil, nil),
			netpol("y", "a-to-x-udp-81", sel("app", "a"), egressOnly, nil, egressRule(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: selp("ns", "x")}), port(udp, 81)))}},
		{name: "several policies on one pod", pols: []*networkingv1.NetworkPolicy{
			netpol("x", "a-from-b-tcp-80", sel("app", "a"), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "b")}), port(tcp, 80)), nil),
			netpol("x", "a-from-z-udp-81", sel("app", "a"), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: selp("ns", "z")}), port(udp, 81)), nil),
			netpol("x", "a-to-y", sel("app", "a"), bothTypes, nil, egressRule(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: selp("ns", "y")}))),
			// No policyTypes, egress rules: ingress and egress.
			netpol("z", "c-default-types", sel("app", "c"), nil, nil, egressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp()}))),
			// NotIn selects pods without the label too; Exists does not.
			netpol("y", "untiered-from-tiered", *expr("tier", metav1.LabelSelectorOpNotIn, "web"), ingressOnly,
				ingressRule(from(networkingv1.NetworkPolicyPeer{NamespaceSelector: selp(), PodSelector: expr("tier", metav1.LabelSelectorOpExists)})), nil)}},
		{name: "namespace label change (z becomes ns=y)", pols: []*networkingv1.NetworkPolicy{denyX, allowNS},
			change: func(t *testing.T) { c.setNamespaceLabels(t, ctx, "z", map[string]string{"ns": "y"}) },
			revert: func(t *testing.T) { c.setNamespaceLabels(t, ctx, "z", map[string]string{"ns": "z"}) }},
		{name: "pod label change (x/c becomes app=b)", pols: []*networkingv1.NetworkPolicy{denyX, allowPod},
			change: func(t *testing.T) { c.setPodLabels(t, ctx, c.pod("x/c"), map[string]string{"app": "b"}) },
			revert: func(t *testing.T) { c.setPodLabels(t, ctx, c.pod("x/c"), map[string]string{"app": "c"}) }},
	}, c.tierSteps(denyX, allowNS)...)
}

func (c *policyCluster) setNamespaceLabels(t *testing.T, ctx context.Context, ns string, labels map[string]string) {
	t.Helper()
	if err := c.l.SetNamespace(ctx, ns, labels); err != nil {
		t.Fatal(err)
	}
	c.nsLabels[ns] = labels
}

func (c *policyCluster) setPodLabels(t *testing.T, ctx context.Context, p *tpod, labels map[string]string) {
	t.Helper()
	if err := c.l.SetPodLabels(ctx, p.lp, labels); err != nil {
		t.Fatal(err)
	}
	p.labels = labels
}

// ---------------------------------------------------------------------
// Applying policies and waiting for the agents.

// apply makes pols the complete set of NetworkPolicies in the API, and
// c.cnps that of ClusterNetworkPolicies: others are deleted, changed ones
// updated, new ones created. It reports whether it changed anything.
func (c *policyCluster) apply(t *testing.T, pols []*networkingv1.NetworkPolicy) (changed bool) {
	t.Helper()
	ctx := context.Background()
	have, err := c.kube.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*networkingv1.NetworkPolicy{}
	for _, p := range pols {
		want[p.Namespace+"/"+p.Name] = p
	}
	for i := range have.Items {
		h := &have.Items[i]
		w, keep := want[h.Namespace+"/"+h.Name]
		switch {
		case !keep:
			changed = true
			err = c.kube.NetworkingV1().NetworkPolicies(h.Namespace).Delete(ctx, h.Name, metav1.DeleteOptions{})
		case !equality.Semantic.DeepEqual(h.Spec, w.Spec) || h.Annotations[auditAnnotation] != w.Annotations[auditAnnotation]:
			changed = true
			u := h.DeepCopy()
			u.Spec = *w.Spec.DeepCopy()
			u.Annotations = w.Annotations
			_, err = c.kube.NetworkingV1().NetworkPolicies(h.Namespace).Update(ctx, u, metav1.UpdateOptions{})
		}
		if err != nil {
			t.Fatalf("policy %s/%s: %v", h.Namespace, h.Name, err)
		}
		delete(want, h.Namespace+"/"+h.Name)
	}
	for _, p := range pols {
		if want[p.Namespace+"/"+p.Name] == nil {
			continue
		}
		changed = true
		if _, err := c.kube.NetworkingV1().NetworkPolicies(p.Namespace).Create(ctx, p.DeepCopy(), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create policy %s/%s: %v", p.Namespace, p.Name, err)
		}
	}
	return c.applyTiers(t) || changed
}

// set makes pols the policies in force and, if that changed anything,
// waits until every agent has applied them.
func (c *policyCluster) set(t *testing.T, pols []*networkingv1.NetworkPolicy) {
	t.Helper()
	before := c.seenGenerations(t)
	if c.apply(t, pols) {
		c.waitApplied(t, before, pols)
	}
}

// policyWatcher returns a node's watcher named "policy" from its status.
func policyWatcher(ctx context.Context, n *lab.Node) (*apiv1.Watcher, error) {
	st, err := n.Status(ctx)
	if err != nil {
		return nil, err
	}
	for _, w := range st.Watchers {
		if w.Name == "policy" {
			return w, nil
		}
	}
	return nil, fmt.Errorf("%s: no watcher named policy in status (watchers %v, policy %q)", n.Name, st.Watchers, st.Policy)
}

// seenGenerations is every node's policy watcher's seen generation: take
// it before a change, then waitApplied.
func (c *policyCluster) seenGenerations(t *testing.T) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, n := range c.l.Nodes {
		w, err := policyWatcher(context.Background(), n)
		if err != nil {
			t.Fatal(err)
		}
		out[n.Name] = w.Seen
	}
	return out
}

// waitApplied waits until every agent has applied a change made after
// before was taken: its policy watcher has seen a newer generation,
// applied all it has seen, without error, and (with pols) `onctl policy`
// shows each local test pod isolated by exactly the policies the oracle
// says. It returns when the last agent got there.
func (c *policyCluster) waitApplied(t *testing.T, before map[string]uint64, pols []*networkingv1.NetworkPolicy) time.Time {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range c.l.Nodes {
		client := agent(t, n)
		last := ""
		for {
			w, err := policyWatcher(ctx, n)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case w.Seen <= before[n.Name]:
				last = fmt.Sprintf("seen generation %d, not past %d from before the change", w.Seen, before[n.Name])
			case w.Applied != w.Seen:
				last = fmt.Sprintf("applied %d of %d (last error %q)", w.Applied, w.Seen, w.LastError)
			case w.LastError != "":
				last = "last error " + w.LastError
			default:
				last = c.enforcedDiff(ctx, client, n, pols)
			}
			if last == "" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never applied the policy change: %s", n.Name, last)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return time.Now()
}

// restartAgent restarts n's agent with extra flags and waits until it has
// enforced pols (the policies in force). A new agent's first enforcement
// counts every local pod as changed, so it revokes with the bypass paused
// and the fast path narrowed: a subtest starting before it ends measures
// that, not the state it set.
func (c *policyCluster) restartAgent(t *testing.T, n *lab.Node, pols []*networkingv1.NetworkPolicy, extra ...string) {
	t.Helper()
	if err := c.l.RestartAgent(context.Background(), n, extra...); err != nil {
		t.Fatal(err)
	}
	c.waitApplied(t, map[string]uint64{}, pols)
}

// enforcedDiff compares the isolation the agent on n reports for its
// local test pods with the oracle's, and the ClusterNetworkPolicies whose
// rules it holds for them; "" when they agree (so not before the agent
// enforces anything for each of them).
func (c *policyCluster) enforcedDiff(ctx context.Context, client apiv1.AgentClient, n *lab.Node, pols []*networkingv1.NetworkPolicy) string {
	resp, err := client.ListPolicy(ctx, &apiv1.ListPolicyRequest{})
	if err != nil {
		return fmt.Sprintf("ListPolicy: %v", err)
	}
	got := map[string]*apiv1.PolicyPod{}
	for _, p := range resp.Pods {
		got[p.Key] = p
	}
	var diffs []string
	for _, p := range c.pods {
		if c.node(p) != n {
			continue
		}
		if got[p.key()] == nil {
			// Not enforced yet: an agent just started lists none.
			diffs = append(diffs, p.key()+" not among the pods the agent enforces policy for")
			continue
		}
		for _, ingress := range []bool{true, false} {
			want, wantAudit := c.isolatedBy(pols, p, ingress), c.selectedBy(pols, p, ingress, true)
			wantTiers := c.tiersOf(p, ingress)
			var have, haveAudit, haveTiers []string
			d := got[p.key()].Egress
			if ingress {
				d = got[p.key()].Ingress
			}
			for _, r := range append(slices.Clone(d.GetAdmin()), d.GetBaseline()...) {
				if !slices.Contains(haveTiers, r.Policy) {
					haveTiers = append(haveTiers, r.Policy)
				}
			}
			if d.GetIsolated() {
				have = slices.Sorted(slices.Values(d.Policies))
				if len(have) == 0 {
					have = []string{"(isolated by no policy)"}
				}
			}
			if len(d.GetAuditPolicies()) > 0 {
				haveAudit = slices.Sorted(slices.Values(d.AuditPolicies))
			}
			if !slices.Equal(want, have) {
				diffs = append(diffs, fmt.Sprintf("%s %s isolated by %v, want %v", p.key(), dirName(ingress), have, want))
			}
			if !slices.Equal(wantAudit, haveAudit) {
				diffs = append(diffs, fmt.Sprintf("%s %s audited by %v, want %v", p.key(), dirName(ingress), haveAudit, wantAudit))
			}
			if sort.Strings(haveTiers); !slices.Equal(wantTiers, haveTiers) {
				diffs = append(diffs, fmt.Sprintf("%s %s has ClusterNetworkPolicy rules of %v, want %v", p.key(), dirName(ingress), haveTiers, wantTiers))
			}
		}
	}
	return strings.Join(diffs, "; ")
}

func dirName(ingress bool) string {
	if ingress {
		return "ingress"
	}
	return "egress"
}

// ---------------------------------------------------------------------
// Probing.

// cell is one probe: from src to dst's port k in family fam.
type cell struct {
	src, dst *tpod
	k        probeKind
	fam      probeFamily
}

type outcome struct {
	err   error // nil: the echo came back
	local netip.AddrPort
}

// probe runs each cell's probe, all in parallel.
func (c *policyCluster) probe(cells []cell, timeout time.Duration) map[cell]outcome {
	out := make(map[cell]outcome, len(cells))
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 128)
	for _, ce := range cells {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			local, err := lab.Probe(ce.src.lp.Netns, strings.ToLower(string(ce.k.proto)), ce.dst.addr(ce.fam), ce.k.port, timeout)
			mu.Lock()
			out[ce] = outcome{err: err, local: local}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return out
}

// allCells is every ordered pair of distinct test pods with every probe,
// in family f.
func (c *policyCluster) allCells(f probeFamily) []cell {
	var cells []cell
	for _, src := range c.pods {
		for _, dst := range c.pods {
			if src == dst {
				continue
			}
			for _, k := range probes {
				cells = append(cells, cell{src, dst, k, f})
			}
		}
	}
	return cells
}

// tableStats counts, over a whole truth table, the flows the cache check
// found learned: if no allowed flow is ever found, the check proves
// nothing.
type tableStats struct {
	learnedAllowed int
}

// truthTable runs every step, probing in family f.
func (c *policyCluster) truthTable(t *testing.T, fastPath, bypass bool, f probeFamily) {
	for _, n := range c.l.Nodes {
		st, err := n.Status(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.FastPath != fastPath {
			t.Fatalf("%s: fast path %v, want %v", n.Name, st.FastPath, fastPath)
		}
	}
	var ts tableStats
	bypassed := 0 // sockets the bypass had to record, over every step
	start := time.Now()
	steps := c.steps()
	defer func() {
		// Undo label changes and take the ClusterNetworkPolicies away, so
		// the next table (or subtest) starts from the same world.
		for _, s := range steps {
			if s.revert != nil {
				s.revert(t)
			}
		}
		c.cnps = nil
		c.set(t, nil)
	}()
	for i, s := range steps {
		stepStart := time.Now()
		c.cnps = s.cnps
		c.set(t, s.pols)
		if s.change != nil {
			before := c.seenGenerations(t)
			s.change(t)
			c.waitApplied(t, before, s.pols)
		}
		applied := time.Since(stepStart)
		cells := c.allCells(f)
		var recorded map[*lab.Node]uint64
		if bypass {
			recorded = c.bypassCounter(t, "recorded")
		}
		var before map[*lab.Node]map[string]bool
		if fastPath {
			before = c.cachedFlows(t)
		}
		got := c.probe(cells, probeTimeout)
		// A probe the oracle allows must get through at once. One that did
		// not is tried again, more patiently, only to tell a slow or lossy
		// path from a denial in the report: it is a difference either way.
		var retry []cell
		for _, ce := range cells {
			if got[ce].err != nil && c.allowed(s.pols, ce) {
				retry = append(retry, ce)
			}
		}
		again := c.probe(retry, 3*probeTimeout)
		report, bad := c.matrix(s.pols, f, got, again)
		denied := 0
		for _, ce := range cells {
			if !c.allowed(s.pols, ce) {
				denied++
			}
		}
		t.Logf("step %d %q: applied in %v, %d %s probes (%d denied by the oracle) in %v, %d differ from the oracle", i, s.name,
			applied.Round(time.Millisecond), len(cells), f, denied, (time.Since(stepStart) - applied).Round(time.Millisecond), bad)
		if bad > 0 {
			t.Errorf("step %d %q (fast path %v, %s): %d of %d probes differ from the oracle\n%s", i, s.name, fastPath, f, bad, len(cells), report)
		}
		if len(s.cnps) > 0 && denied == 0 {
			t.Errorf("step %d %q: the oracle denies nothing: its ClusterNetworkPolicies select no pod, and the step proves nothing", i, s.name)
		}
		c.checkTrace(t, s, cells, got, again)
		if fastPath {
			c.checkCache(t, s, got, before, &ts)
		}
		if bypass {
			bypassed += c.checkBypassed(t, s, cells, got, again, recorded)
		}
	}
	t.Logf("truth table (fast path %v, %s): %d steps in %v", fastPath, f, len(steps), time.Since(start).Round(time.Millisecond))
	if bypass && bypassed == 0 {
		t.Error("no same-node TCP probe ever got through: the bypass checks prove nothing")
	}
	if fastPath {
		t.Logf("the flow cache held %d of the allowed %s probes' flows when checked", ts.learnedAllowed, f)
		if ts.learnedAllowed == 0 {
			t.Errorf("no allowed %s probe's flow was ever in the flow cache: the check that denied flows are never learned proves nothing", f)
		}
	}
}

// matrix renders the result of the probes in family f against the oracle
// as one grid per pair and counts the probes that differ. Each cell has
// one character per probe.
func (c *policyCluster) matrix(pols []*networkingv1.NetworkPolicy, f probeFamily, got, retried map[cell]outcome) (string, int) {
	var b strings.Builder
	var kinds []string
	for _, k := range probes {
		kinds = append(kinds, k.String())
	}
	fmt.Fprintf(&b, "%s probes; each cell is %s; '.' allowed and the oracle allows, 'x' denied and the oracle denies,\n", f, strings.Join(kinds, " "))
	b.WriteString("'A' ALLOWED BUT THE ORACLE DENIES, 'D' DENIED BUT THE ORACLE ALLOWS; rows: from, columns: to\n")
	name := func(p *tpod) string { return fmt.Sprintf("%s(n%d)", p.key(), p.node+1) }
	fmt.Fprintf(&b, "%-10s", "")
	for _, dst := range c.pods {
		fmt.Fprintf(&b, " %-8s", name(dst))
	}
	b.WriteString("\n")
	bad := 0
	var details []string
	for _, src := range c.pods {
		fmt.Fprintf(&b, "%-10s", name(src))
		for _, dst := range c.pods {
			s := ""
			for _, k := range probes {
				if src == dst {
					s += "-"
					continue
				}
				ce := cell{src, dst, k, f}
				want, o := c.allowed(pols, ce), got[ce]
				switch {
				case want && o.err == nil:
					s += "."
				case !want && o.err != nil:
					s += "x"
				case want:
					s += "D"
					bad++
					again := "denied again on a retry with a 3s timeout"
					if r, ok := retried[ce]; ok && r.err == nil {
						again = "but got through on a retry with a 3s timeout: slow, or its first packets were lost"
					}
					details = append(details, fmt.Sprintf("  %s → %s %s: denied (%v), the oracle allows; %s", src.key(), dst.key(), k, o.err, again))
				default:
					s += "A"
					bad++
					details = append(details, fmt.Sprintf("  %s → %s %s: allowed, the oracle denies", src.key(), dst.key(), k))
				}
			}
			fmt.Fprintf(&b, " %-8s", s)
		}
		b.WriteString("\n")
	}
	b.WriteString(strings.Join(details, "\n"))
	return b.String(), bad
}

// checkCache reads every node's flow cache after a step's probes:
//   - no probe the oracle denies may have made a usable flow there (live,
//     both directions learned): the fast path never learns a denied flow.
//     One direction alone is inert, and can happen: a client's node whose
//     conntrack still holds an earlier, allowed exchange on the same ports
//     marks the client's packets ESTABLISHED and learns their direction,
//     while the server's node, whose policy denies, never answers. A flow
//     the cache held before the probes (before: either direction, or
//     both) is not the probe's: the kernel may give a probe the source
//     port of an earlier step's allowed exchange, whose flow (its reply
//     learned) the client's node keeps while its own pod's rules allow
//     it, and the probe's ESTABLISHED packet then learns the other
//     direction there; the server's node revoked its side when its pod's
//     rules changed, which the next check judges;
//   - no cached verdict may be one that the current policies deny to its
//     local pod (its egress as the client, its ingress as the server):
//     a change revokes cached verdicts before it is reported applied.
//
// Both hold for the flows of either family, whichever the step probed.
func (c *policyCluster) checkCache(t *testing.T, s policyStep, got map[cell]outcome, before map[*lab.Node]map[string]bool, ts *tableStats) {
	t.Helper()
	type tuple struct {
		proto          string
		client, server netip.AddrPort
	}
	probed := map[tuple]cell{}
	for ce, o := range got {
		if o.local.IsValid() {
			probed[tuple{strings.ToLower(string(ce.k.proto)), o.local, netip.AddrPortFrom(ce.dst.addr(ce.fam), uint16(ce.k.port))}] = ce
		}
	}
	byIP := map[netip.Addr]*tpod{}
	for _, p := range c.pods {
		byIP[p.lp.IP], byIP[p.lp.IPv6] = p, p
	}
	serverPort := func(p uint16) bool { return slices.Contains(tcpPorts, int(p)) || slices.Contains(udpPorts, int(p)) }
	for _, n := range c.l.Nodes {
		resp, err := agent(t, n).ListCache(context.Background(), &apiv1.ListCacheRequest{Table: "filter"})
		if err != nil {
			t.Fatalf("%s: cache list filter: %v", n.Name, err)
		}
		for _, f := range resp.Filter {
			local, err1 := netip.ParseAddrPort(f.Local)
			remote, err2 := netip.ParseAddrPort(f.Remote)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: filter entry %v: addresses %v %v", n.Name, f, err1, err2)
			}
			proto := strings.ToLower(f.Proto)
			for _, tu := range []tuple{{proto, local, remote}, {proto, remote, local}} {
				ce, ok := probed[tu]
				if !ok {
					continue
				}
				if c.allowed(s.pols, ce) {
					ts.learnedAllowed++
				} else if usable(f) && before[n][flowID(f)] {
					t.Logf("step %q: %s's flow cache held %s %s → %s %s (now %v) before the probes: an earlier exchange on the same ports",
						s.name, n.Name, ce.k, ce.src.key(), ce.dst.key(), tu.server, f)
				} else if usable(f) {
					t.Errorf("step %q: %s's flow cache holds %s %s → %s %s (entry %v), a flow the oracle denies: the fast path would carry it",
						s.name, n.Name, ce.k, ce.src.key(), ce.dst.key(), tu.server, f)
				}
			}
			lp, rp := byIP[local.Addr()], byIP[remote.Addr()]
			if !f.Live || lp == nil || rp == nil {
				continue
			}
			fam := probeIPv4
			if local.Addr().Is6() {
				fam = probeIPv6
			}
			switch {
			case serverPort(local.Port()) && !serverPort(remote.Port()):
				k := probeKind{corev1.Protocol(strings.ToUpper(proto)), int(local.Port())}
				if !c.ingressAllows(s.pols, cell{rp, lp, k, fam}) {
					t.Errorf("step %q: %s's flow cache holds %v: %s → %s %s, which %s's ingress policy denies now (not revoked)",
						s.name, n.Name, f, rp.key(), lp.key(), k, lp.key())
				}
			case serverPort(remote.Port()) && !serverPort(local.Port()):
				k := probeKind{corev1.Protocol(strings.ToUpper(proto)), int(remote.Port())}
				if !c.egressAllows(s.pols, cell{lp, rp, k, fam}) {
					t.Errorf("step %q: %s's flow cache holds %v: %s → %s %s, which %s's egress policy denies now (not revoked)",
						s.name, n.Name, f, lp.key(), rp.key(), k, lp.key())
				}
			}
		}
	}
}

// cachedFlows are, by node, the flows (flowID) its cache holds now, in
// either direction or both.
func (c *policyCluster) cachedFlows(t *testing.T) map[*lab.Node]map[string]bool {
	t.Helper()
	out := map[*lab.Node]map[string]bool{}
	for _, n := range c.l.Nodes {
		resp, err := agent(t, n).ListCache(context.Background(), &apiv1.ListCacheRequest{Table: "filter"})
		if err != nil {
			t.Fatalf("%s: cache list filter: %v", n.Name, err)
		}
		out[n] = map[string]bool{}
		for _, f := range resp.Filter {
			out[n][flowID(f)] = true
		}
	}
	return out
}

// usable: the fast path carries f's packets both ways.
func usable(f *apiv1.FlowEntry) bool { return f.Live && f.Egress && f.Ingress }

// flowID names a cached flow by its protocol and ends.
func flowID(f *apiv1.FlowEntry) string { return f.Proto + " " + f.Local + " " + f.Remote }

// ---------------------------------------------------------------------
// onctl policy.

// onctlJSON runs the onctl binary against n's agent with -o json and
// decodes its output into v, the API message it prints.
func (c *policyCluster) onctlJSON(t *testing.T, n *lab.Node, v proto.Message, args ...string) {
	t.Helper()
	args = append([]string{"--socket", n.AgentSocket(), "-o", "json"}, args...)
	out, err := exec.Command(filepath.Join(c.l.BinDir, "onctl"), args...).Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("onctl %s: %v: %s%s", strings.Join(args, " "), err, out, stderr)
	}
	if err := protojson.Unmarshal(out, v); err != nil {
		t.Fatalf("onctl %s: %v in:\n%s", strings.Join(args, " "), err, out)
	}
}

// onctl: `onctl status` shows the policy watcher and that policy is
// enforced; `onctl policy` shows an isolated pod with its policy and its
// resolved rule; its counters count an allowed and a denied connection.
func (c *policyCluster) onctl(t *testing.T) {
	a, b, yb := c.pod("x/a"), c.pod("x/b"), c.pod("y/b")
	nb := c.node(b)
	pol := netpol("x", "b-from-a-tcp-80", sel("app", "b"), ingressOnly,
		ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "a")}), port(corev1.ProtocolTCP, 80)), nil)
	pols := []*networkingv1.NetworkPolicy{pol}
	c.set(t, pols)

	var st apiv1.NodeStatus
	c.onctlJSON(t, nb, &st, "status")
	if st.Policy != "enforced" {
		t.Errorf("onctl status: policy %q, want enforced", st.Policy)
	}
	found := false
	for _, w := range st.Watchers {
		if w.Name == "policy" {
			found = true
			if w.Seen == 0 || w.Applied != w.Seen || w.LastError != "" {
				t.Errorf("onctl status: policy watcher %+v, want applied == seen > 0 and no error", w)
			}
		}
	}
	if !found {
		t.Errorf("onctl status -o json: no watcher named policy in %+v", st.Watchers)
	}

	var all apiv1.ListPolicyResponse
	c.onctlJSON(t, nb, &all, "policy")
	if all.Seen == 0 || all.Applied != all.Seen {
		t.Errorf("onctl policy: generation applied %d of %d", all.Applied, all.Seen)
	}
	keys := map[string]bool{}
	for _, p := range all.Pods {
		keys[p.Key] = true
	}
	for _, p := range c.pods {
		if c.node(p) == nb && !keys[p.key()] {
			t.Errorf("onctl policy on %s does not list its pod %s (lists %v)", nb.Name, p.key(), keys)
		}
		if c.node(p) != nb && keys[p.key()] {
			t.Errorf("onctl policy on %s lists %s, a pod of another node", nb.Name, p.key())
		}
	}

	detail := func() *apiv1.PolicyDirection {
		var one apiv1.ListPolicyResponse
		c.onctlJSON(t, nb, &one, "policy", b.key())
		if len(one.Pods) != 1 || one.Pods[0].Key != b.key() {
			t.Fatalf("onctl policy %s: %+v", b.key(), &one)
		}
		if ips := b.lp.IP.String() + "," + b.lp.IPv6.String(); one.Pods[0].Ip != b.lp.IP.String() || strings.Join(one.Pods[0].Ips, ",") != ips || one.Pods[0].Egress.Isolated {
			t.Errorf("onctl policy %s: ip %s, ips %v, egress %+v; want %s first of %s, not isolated", b.key(), one.Pods[0].Ip, one.Pods[0].Ips, one.Pods[0].Egress, b.lp.IP, ips)
		}
		return one.Pods[0].Ingress
	}
	in := detail()
	// x/a is a peer by both its addresses.
	peers := []string{netip.PrefixFrom(a.lp.IP, 32).String(), netip.PrefixFrom(a.lp.IPv6, 128).String()}
	if !in.Isolated || !slices.Equal(in.Policies, []string{"x/b-from-a-tcp-80"}) || len(in.Rules) != 1 ||
		!slices.Equal(slices.Sorted(slices.Values(in.Rules[0].Peers)), peers) || !slices.Equal(in.Rules[0].Ports, []string{"TCP/80"}) {
		t.Errorf("onctl policy %s: ingress %+v; want isolated by x/b-from-a-tcp-80, one rule from %v on TCP/80", b.key(), in, peers)
	}
	if _, err := lab.Probe(yb.lp.Netns, "tcp", b.lp.IP, 80, probeTimeout); err == nil {
		t.Fatalf("%s → %s TCP/80 got through", yb.key(), b.key())
	}
	if _, err := lab.Probe(a.lp.Netns, "tcp", b.lp.IP, 80, 3*probeTimeout); err != nil {
		t.Fatalf("%s → %s TCP/80: %v", a.key(), b.key(), err)
	}
	var now *apiv1.PolicyDirection
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		now = detail()
		if now.Denied > in.Denied && now.Allowed > in.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("onctl policy %s: ingress counters allowed %d → %d, denied %d → %d after an allowed and a denied connection",
				b.key(), in.Allowed, now.Allowed, in.Denied, now.Denied)
		}
	}
	t.Logf("onctl policy %s: ingress allowed %d → %d, denied %d → %d", b.key(), in.Allowed, now.Allowed, in.Denied, now.Denied)
}

// ---------------------------------------------------------------------
// Long-lived connections.

// pinger sends 8 bytes every 10 ms on one TCP connection to an echo
// server and reads them back, recording each echo.
type pinger struct {
	conn   net.Conn
	echoes atomic.Int64
	last   atomic.Int64 // UnixNano of the last echo
	maxGap atomic.Int64 // longest time between two echoes, ns
	err    atomic.Pointer[error]
	done   chan struct{}
	wg     sync.WaitGroup
}

func startPinger(t *testing.T, src *tpod, dst netip.Addr, port int) *pinger {
	t.Helper()
	p := &pinger{conn: dial(t, src.lp.Netns, "tcp4", dst, port), done: make(chan struct{})}
	p.last.Store(time.Now().UnixNano())
	fail := func(err error) {
		select {
		case <-p.done:
		default:
			p.err.CompareAndSwap(nil, &err)
		}
	}
	p.wg.Add(2)
	go func() {
		defer p.wg.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-p.done:
				return
			case <-tick.C:
			}
			if _, err := p.conn.Write([]byte("ping1234")); err != nil {
				fail(err)
				return
			}
		}
	}()
	go func() {
		defer p.wg.Done()
		buf := make([]byte, 8)
		for {
			if _, err := io.ReadFull(p.conn, buf); err != nil {
				fail(err)
				return
			}
			now := time.Now().UnixNano()
			if gap := now - p.last.Swap(now); gap > p.maxGap.Load() {
				p.maxGap.Store(gap)
			}
			p.echoes.Add(1)
		}
	}()
	t.Cleanup(p.stop)
	return p
}

func (p *pinger) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	close(p.done)
	p.conn.Close()
	p.wg.Wait()
}

func (p *pinger) lastEcho() time.Time { return time.Unix(0, p.last.Load()) }

func (p *pinger) failed() error {
	if e := p.err.Load(); e != nil {
		return *e
	}
	return nil
}

// waitEchoes waits until the pinger has had n more echoes than now.
func (p *pinger) waitEchoes(t *testing.T, n int64, within time.Duration) {
	t.Helper()
	want := p.echoes.Load() + n
	for deadline := time.Now().Add(within); p.echoes.Load() < want; time.Sleep(10 * time.Millisecond) {
		if err := p.failed(); err != nil {
			t.Fatalf("the connection failed: %v", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the connection had %d of %d more echoes in %v", p.echoes.Load()-want+n, n, within)
		}
	}
}

func (c *policyCluster) fastPathHits(t *testing.T) uint64 {
	var sum uint64
	for _, n := range c.l.Nodes {
		s := stats(t, n)
		sum += s["egress_hit"] + s["ingress_hit"]
	}
	return sum
}

// strictRevocation: a cross-node connection running on the fast path
// stops delivering within 1 s of the agents reporting a policy that denies
// it applied, and a new connection fails; once the policy is deleted, new
// connections work again.
func (c *policyCluster) strictRevocation(t *testing.T) {
	a, b := c.pod("x/a"), c.pod("x/b") // nodes 1 and 2
	c.setFastPath(t, true)
	c.revokeRunning(t, a, b, 90, func(p *pinger) {
		hits := c.fastPathHits(t)
		p.waitEchoes(t, 100, 5*time.Second)
		if got := c.fastPathHits(t) - hits; got < 100 {
			t.Fatalf("100 echoes took only %d fast-path hits: the connection is not on the fast path (the test would prove nothing)", got)
		}
	}, nil)
}

// connectionSetup: with no policy, a connection from x/a to x/b opens on
// the fast path on both nodes, unseen by conntrack. A policy that isolates
// x/b but allows x/a hands it over to conntrack on x/b's node, with x/a as
// its client, and it lives on; new connections to x/b open through
// conntrack there. A policy that denies x/a then ends it within 1 s.
func (c *policyCluster) connectionSetup(t *testing.T) {
	a, b := c.pod("x/a"), c.pod("x/b")
	na, nb := c.node(a), c.node(b)
	const port = 93
	c.setFastPath(t, true)
	c.set(t, nil)
	bypasstest.ServeEcho(listenTCP(t, b.lp.Netns, port))
	// The first connection teaches both nodes the way to the other.
	if _, err := lab.Probe(a.lp.Netns, "tcp", b.lp.IP, port, 3*probeTimeout); err != nil {
		t.Fatal(err)
	}
	p := startPinger(t, a, b.lp.IP, port)
	p.waitEchoes(t, 20, 5*time.Second)
	client := netip.MustParseAddrPort(p.conn.LocalAddr().String())
	server := netip.AddrPortFrom(b.lp.IP, port)
	seen := func(n *lab.Node) string {
		for _, line := range conntrackTo(t, n, b.lp.IP, port) {
			if strings.Contains(line, fmt.Sprintf("sport=%d dport=%d", client.Port(), port)) {
				return line
			}
		}
		return ""
	}
	if f := cachedFlow(t, na, client, server); f == nil || f.OpenedBy != "local" {
		t.Fatalf("%s: flow %v; want the connection opened on the fast path by x/a", na.Name, f)
	}
	if f := cachedFlow(t, nb, server, client); f == nil || f.OpenedBy != "remote" {
		t.Fatalf("%s: flow %v; want the connection opened on the fast path by x/a", nb.Name, f)
	}
	if line := seen(nb); line != "" {
		t.Fatalf("%s: conntrack saw the connection the fast path opened: %s", nb.Name, line)
	}

	allow := netpol("x", "b-from-a", sel("app", "b"), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "a")})), nil)
	c.set(t, []*networkingv1.NetworkPolicy{allow})
	p.waitEchoes(t, 100, 5*time.Second)
	line := seen(nb)
	if !strings.Contains(line, "ESTABLISHED") || !strings.Contains(line, fmt.Sprintf("src=%s dst=%s", a.lp.IP, b.lp.IP)) {
		t.Errorf("%s: conntrack has %q; want the connection handed over, ESTABLISHED, from x/a", nb.Name, line)
	}
	if f := cachedFlow(t, nb, server, client); f == nil || f.OpenedBy != "slow path" || !f.Live {
		t.Errorf("%s: flow %v; want it kept, handed over", nb.Name, f)
	}
	before := stats(t, nb)
	if _, err := lab.Probe(a.lp.Netns, "tcp", b.lp.IP, port, 3*probeTimeout); err != nil {
		t.Fatalf("a new connection the policy allows failed: %v", err)
	}
	after := stats(t, nb)
	if after["ingress_open"] != before["ingress_open"] || after["ingress_miss_tcp_flags"] == before["ingress_miss_tcp_flags"] {
		t.Errorf("%s: a new connection to the isolated x/b opened on the fast path (open %d → %d, tcp_flags %d → %d)", nb.Name,
			before["ingress_open"], after["ingress_open"], before["ingress_miss_tcp_flags"], after["ingress_miss_tcp_flags"])
	}

	deny := netpol("x", "b-from-a", sel("app", "b"), ingressOnly, nil, nil)
	applying := c.seenGenerations(t)
	c.apply(t, []*networkingv1.NetworkPolicy{deny})
	applied := c.waitApplied(t, applying, []*networkingv1.NetworkPolicy{deny})
	time.Sleep(time.Until(applied.Add(1500 * time.Millisecond)))
	if last := p.lastEcho(); last.After(applied.Add(time.Second)) {
		t.Errorf("the denied connection still delivered %v after the policy was applied", last.Sub(applied))
	}
	p.stop()
	c.set(t, nil)
}

// revokeRunning runs a connection from a to b's port, checks with onPath
// that it takes the path under test, then applies a policy denying b's
// ingress: the connection must stop within 1 s of the agents applying it,
// and new ones fail until the policy goes. ended, if not nil, checks the
// ended connection while its sockets are still open.
func (c *policyCluster) revokeRunning(t *testing.T, a, b *tpod, port int, onPath, ended func(*pinger)) {
	c.set(t, nil)
	bypasstest.ServeEcho(listenTCP(t, b.lp.Netns, port))
	p := startPinger(t, a, b.lp.IP, port)
	p.waitEchoes(t, 20, 5*time.Second)
	onPath(p)

	deny := netpol(b.ns, "deny-"+b.name, sel("app", b.labels["app"]), ingressOnly, nil, nil)
	before := c.seenGenerations(t)
	created := time.Now()
	c.apply(t, []*networkingv1.NetworkPolicy{deny})
	applied := c.waitApplied(t, before, []*networkingv1.NetworkPolicy{deny})
	t.Logf("policy applied on every node %v after its create", applied.Sub(created).Round(time.Millisecond))
	if applied.Sub(created) > 5*time.Second {
		t.Errorf("applying the policy took %v after its create; want < 5s", applied.Sub(created))
	}
	count := p.echoes.Load()
	time.Sleep(time.Until(applied.Add(1500 * time.Millisecond)))
	last := p.lastEcho()
	t.Logf("last echo %v after the create, %v after applied; %d echoes after applied; connection error: %v",
		last.Sub(created).Round(time.Millisecond), last.Sub(applied).Round(time.Millisecond), p.echoes.Load()-count, p.failed())
	if last.After(applied.Add(time.Second)) {
		t.Errorf("the denied connection still delivered %v after the policy was applied", last.Sub(applied))
	}
	if _, err := lab.Probe(a.lp.Netns, "tcp", b.lp.IP, 80, probeTimeout); err == nil {
		t.Error("a new connection got through the denying policy")
	}
	if _, err := lab.Probe(a.lp.Netns, "tcp", b.lp.IP, port, probeTimeout); err == nil {
		t.Error("a new connection to the pinged port got through the denying policy")
	}
	if ended != nil {
		ended(p)
	}
	p.stop()

	c.set(t, nil)
	if _, err := lab.Probe(a.lp.Netns, "tcp", b.lp.IP, 80, 3*probeTimeout); err != nil {
		t.Errorf("after the policy was deleted, a new connection failed: %v", err)
	}
	q := startPinger(t, a, b.lp.IP, port)
	q.waitEchoes(t, 20, 5*time.Second)
	q.stop()
}

// agentRestart: with a policy letting x/a reach x/b and nothing else,
// and an established x/a → x/b connection, both agents stop and start
// again. Denied stays denied and allowed allowed while they are down and
// after, and the connection never breaks.
func (c *policyCluster) agentRestart(t *testing.T) {
	ctx := context.Background()
	a, b := c.pod("x/a"), c.pod("x/b")
	denied := []*tpod{c.pod("x/c"), c.pod("z/c"), c.pod("y/a")} // x/b's node's z/c, other node's x/c
	pol := netpol("x", "b-from-a", sel("app", "b"), ingressOnly, ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "a")})), nil)
	pols := []*networkingv1.NetworkPolicy{pol}
	c.set(t, pols)
	bypasstest.ServeEcho(listenTCP(t, b.lp.Netns, 91))
	p := startPinger(t, a, b.lp.IP, 91)
	p.waitEchoes(t, 20, 5*time.Second)

	check := func(when string) {
		t.Helper()
		var cells []cell
		for _, k := range []probeKind{{corev1.ProtocolTCP, 80}, {corev1.ProtocolUDP, 81}} {
			cells = append(cells, cell{a, b, k, probeIPv4})
			for _, d := range denied {
				cells = append(cells, cell{d, b, k, probeIPv4})
			}
		}
		got := c.probe(cells, probeTimeout)
		for _, ce := range cells {
			want := c.allowed(pols, ce)
			if err := got[ce].err; want && err != nil {
				_, again := lab.Probe(ce.src.lp.Netns, strings.ToLower(string(ce.k.proto)), ce.dst.lp.IP, ce.k.port, 3*probeTimeout)
				t.Errorf("%s: %s → %s %s denied (%v; on a retry with a 3s timeout: %v); the policy allows it",
					when, ce.src.key(), ce.dst.key(), ce.k, err, again)
			} else if !want && err == nil {
				t.Errorf("%s: %s → %s %s got through; the policy denies it", when, ce.src.key(), ce.dst.key(), ce.k)
			}
		}
	}
	check("before the restart")
	for _, n := range c.l.Nodes {
		n.Agent.Stop()
	}
	check("agents down")
	p.waitEchoes(t, 20, 5*time.Second)
	restart := time.Now()
	for _, n := range c.l.Nodes {
		if err := c.l.StartAgent(n); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.l.Nodes {
		if err := c.l.WaitReady(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	zero := map[string]uint64{}
	c.waitApplied(t, zero, pols)
	t.Logf("agents ready and policy applied %v after the start", time.Since(restart).Round(time.Millisecond))
	check("after the restart")
	p.waitEchoes(t, 100, 5*time.Second)
	if err := p.failed(); err != nil {
		t.Fatalf("the established connection broke across the restart: %v", err)
	}
	t.Logf("established connection: %d echoes, longest gap %v", p.echoes.Load(), time.Duration(p.maxGap.Load()).Round(time.Millisecond))
	p.stop()
	c.set(t, nil)
}
