//go:build e2e

package e2e

import (
	"context"
	"net/netip"
	"slices"
	"sort"
	"testing"

	agentpolicy "github.com/onc-net/onc/agent/policy"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
)

// ClusterNetworkPolicy (policy.networking.k8s.io) in the truth table: the
// steps of tierSteps put ClusterNetworkPolicies in force beside
// NetworkPolicies, and the oracle below judges each direction tier by tier
// from the objects, as docs/policy.md states the semantics:
//   - Admin: the policies whose subject selects the pod, by priority then
//     name, each rule in order; the first matching rule decides (Accept,
//     Deny) or passes the decision on (Pass);
//   - then NetworkPolicy, if one isolates the pod in that direction;
//   - else Baseline, the same way (a Pass allows);
//   - else allowed.

var cnpResource = agentpolicy.CNPGroupVersion.WithResource(agentpolicy.CNPResource)

// tierDecision is one direction's verdict and what made it: tier
// "Admin" or "Baseline" and the deciding policy; "NetworkPolicy" when a
// NetworkPolicy isolates the pod; "" when nothing decided (allowed).
type tierDecision struct {
	allowed bool
	tier    string
	policy  string
}

// decide is the verdict on ce in one direction: the destination's ingress
// or the source's egress.
func (c *policyCluster) decide(pols []*networkingv1.NetworkPolicy, ce cell, ingress bool) tierDecision {
	pod := ce.src
	if ingress {
		pod = ce.dst
	}
	d, passed := c.tierVerdict("Admin", pod, ce, ingress)
	if d.tier != "" && !passed {
		return d
	}
	if isolated, allowed := c.npVerdict(pols, ce, ingress); isolated {
		return tierDecision{allowed: allowed, tier: "NetworkPolicy"}
	}
	if d, _ := c.tierVerdict("Baseline", pod, ce, ingress); d.tier != "" {
		return d
	}
	return tierDecision{allowed: true}
}

// tierVerdict is the first rule of tier's policies selecting pod that
// matches ce in the direction: its decision, or passed if it passes.
func (c *policyCluster) tierVerdict(tier string, pod *tpod, ce cell, ingress bool) (d tierDecision, passed bool) {
	for _, p := range c.tierPolicies(tier, pod) {
		// Each rule of the direction: its action, and whether it matches.
		var actions []string
		var matches []bool
		if ingress {
			for _, r := range p.Spec.Ingress {
				actions = append(actions, r.Action)
				matches = append(matches, c.ingressPeersMatch(r.From, ce.src) && protocolsMatch(r.Protocols, ce.dst, ce.k))
			}
		} else {
			for _, r := range p.Spec.Egress {
				actions = append(actions, r.Action)
				matches = append(matches, c.egressPeersMatch(r.To, ce) && protocolsMatch(r.Protocols, ce.dst, ce.k))
			}
		}
		for i, action := range actions {
			if !matches[i] {
				continue
			}
			if action == "Pass" {
				return tierDecision{allowed: tier == "Baseline", tier: tier, policy: p.Name}, tier == "Admin"
			}
			return tierDecision{allowed: action == "Accept", tier: tier, policy: p.Name}, false
		}
	}
	return tierDecision{}, false
}

// tierPolicies are tier's policies in force whose subject selects pod, in
// the order they judge.
func (c *policyCluster) tierPolicies(tier string, pod *tpod) []*agentpolicy.ClusterNetworkPolicy {
	var out []*agentpolicy.ClusterNetworkPolicy
	for _, p := range c.cnps {
		if p.Spec.Tier == tier && c.subjectSelects(p.Spec.Subject, pod) {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Spec.Priority != out[j].Spec.Priority {
			return out[i].Spec.Priority < out[j].Spec.Priority
		}
		return out[i].Name < out[j].Name
	})
	return out
}

func (c *policyCluster) subjectSelects(s agentpolicy.CNPSubject, pod *tpod) bool {
	if s.Namespaces != nil {
		return labelsMatch(s.Namespaces, c.namespaceLabels(pod.ns))
	}
	return c.namespacedPodMatches(s.Pods, pod)
}

func (c *policyCluster) namespacedPodMatches(np *agentpolicy.CNPNamespacedPod, pod *tpod) bool {
	return np != nil && labelsMatch(&np.NamespaceSelector, c.namespaceLabels(pod.ns)) && labelsMatch(&np.PodSelector, pod.labels)
}

func (c *policyCluster) ingressPeersMatch(peers []agentpolicy.CNPIngressPeer, src *tpod) bool {
	for _, p := range peers {
		if (p.Namespaces != nil && labelsMatch(p.Namespaces, c.namespaceLabels(src.ns))) || c.namespacedPodMatches(p.Pods, src) {
			return true
		}
	}
	return false
}

// egressPeersMatch: the destination pod by its namespace and labels, or
// its address of the probe's family in a network.
func (c *policyCluster) egressPeersMatch(peers []agentpolicy.CNPEgressPeer, ce cell) bool {
	for _, p := range peers {
		if (p.Namespaces != nil && labelsMatch(p.Namespaces, c.namespaceLabels(ce.dst.ns))) || c.namespacedPodMatches(p.Pods, ce.dst) ||
			slices.ContainsFunc(p.Networks, func(n string) bool { return prefixHas(n, ce.dst.addr(ce.fam)) }) {
			return true
		}
	}
	return false
}

// protocolsMatch: none means every protocol and port; a number or range
// of the probe's protocol; a named port, the destination pod's container
// port of that name with the probe's protocol and port.
func protocolsMatch(protocols []agentpolicy.CNPProtocol, dst *tpod, k probeKind) bool {
	if len(protocols) == 0 {
		return true
	}
	for _, p := range protocols {
		if p.DestinationNamedPort != "" {
			if slices.ContainsFunc(dst.ports, func(cp corev1.ContainerPort) bool {
				return cp.Name == p.DestinationNamedPort && cp.Protocol == k.proto && int(cp.ContainerPort) == k.port
			}) {
				return true
			}
			continue
		}
		pp := p.TCP
		if k.proto == corev1.ProtocolUDP {
			pp = p.UDP
		}
		switch {
		case pp == nil:
		case pp.DestinationPort.Range != nil:
			if r := pp.DestinationPort.Range; int32(k.port) >= r.Start && int32(k.port) <= r.End {
				return true
			}
		case int32(k.port) == pp.DestinationPort.Number:
			return true
		}
	}
	return false
}

// tiersOf lists (sorted) the ClusterNetworkPolicies whose rules the
// agent must hold for the pod's direction: those whose subject selects
// it with a rule in the direction.
func (c *policyCluster) tiersOf(pod *tpod, ingress bool) []string {
	var out []string
	for _, p := range c.cnps {
		if c.subjectSelects(p.Spec.Subject, pod) && ((ingress && len(p.Spec.Ingress) > 0) || (!ingress && len(p.Spec.Egress) > 0)) {
			out = append(out, p.Name)
		}
	}
	sort.Strings(out)
	return out
}

// applyTiers makes c.cnps the ClusterNetworkPolicies in the API, as apply
// does NetworkPolicies, and reports whether it changed anything.
func (c *policyCluster) applyTiers(t *testing.T) (changed bool) {
	t.Helper()
	ctx := context.Background()
	api := c.cnpAPI
	have, err := api.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]*agentpolicy.ClusterNetworkPolicy{}
	for _, p := range c.cnps {
		want[p.Name] = p
	}
	for _, h := range have.Items {
		w := want[h.GetName()]
		delete(want, h.GetName())
		var got agentpolicy.ClusterNetworkPolicy
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(h.Object, &got); err != nil {
			t.Fatal(err)
		}
		switch {
		case w == nil:
			err = api.Delete(ctx, h.GetName(), metav1.DeleteOptions{})
		case !equality.Semantic.DeepEqual(got.Spec, w.Spec):
			u := unstructuredCNP(t, w)
			u.SetResourceVersion(h.GetResourceVersion())
			_, err = api.Update(ctx, u, metav1.UpdateOptions{})
		default:
			continue
		}
		if err != nil && !apierrors.IsNotFound(err) {
			t.Fatalf("ClusterNetworkPolicy %s: %v", h.GetName(), err)
		}
		changed = true
	}
	for _, p := range want {
		if _, err := api.Create(ctx, unstructuredCNP(t, p), metav1.CreateOptions{}); err != nil {
			t.Fatalf("create ClusterNetworkPolicy %s: %v", p.Name, err)
		}
		changed = true
	}
	// Read back, as the API server keeps them: a field it pruned (a wrong
	// JSON name in the agent's mirror of the types, which builds these
	// objects) would otherwise go unseen by agent and test alike.
	for _, p := range c.cnps {
		u, err := api.Get(ctx, p.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		spec, _, err := unstructured.NestedMap(u.Object, "spec")
		if err != nil {
			t.Fatal(err)
		}
		if sent := unstructuredCNP(t, p).Object["spec"]; !equality.Semantic.DeepEqual(spec, sent) {
			t.Fatalf("ClusterNetworkPolicy %s: the API server keeps spec %v, the test sent %v", p.Name, spec, sent)
		}
	}
	return changed
}

func unstructuredCNP(t *testing.T, p *agentpolicy.ClusterNetworkPolicy) *unstructured.Unstructured {
	t.Helper()
	u, err := p.Unstructured()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// ---------------------------------------------------------------------
// Building ClusterNetworkPolicies.

func cnp(tier string, priority int32, name string, subject agentpolicy.CNPSubject, ingress []agentpolicy.CNPIngressRule,
	egress []agentpolicy.CNPEgressRule) *agentpolicy.ClusterNetworkPolicy {
	return &agentpolicy.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: agentpolicy.CNPSpec{Tier: tier, Priority: priority, Subject: subject, Ingress: ingress, Egress: egress}}
}

// inNamespaces and fromNamespaces select namespaces by name (the label
// the API server gives each), not by the test's "ns" label, which an
// earlier step of the table changes; none selects every namespace.
func inNamespaces(names ...string) agentpolicy.CNPSubject {
	return agentpolicy.CNPSubject{Namespaces: namespacesNamed(names...)}
}

func namespacesNamed(names ...string) *metav1.LabelSelector {
	if len(names) == 0 {
		return selp()
	}
	return expr("kubernetes.io/metadata.name", metav1.LabelSelectorOpIn, names...)
}

func podsOf(ns, pods metav1.LabelSelector) *agentpolicy.CNPNamespacedPod {
	return &agentpolicy.CNPNamespacedPod{NamespaceSelector: ns, PodSelector: pods}
}

func fromNamespaces(names ...string) agentpolicy.CNPIngressPeer {
	return agentpolicy.CNPIngressPeer{Namespaces: namespacesNamed(names...)}
}

func tcpPort(n int32) agentpolicy.CNPProtocol {
	return agentpolicy.CNPProtocol{TCP: &agentpolicy.CNPProtocolPort{DestinationPort: &agentpolicy.CNPPort{Number: n}}}
}

func tcpRange(first, last int32) agentpolicy.CNPProtocol {
	return agentpolicy.CNPProtocol{TCP: &agentpolicy.CNPProtocolPort{DestinationPort: &agentpolicy.CNPPort{Range: &agentpolicy.CNPPortRange{Start: first, End: last}}}}
}

// tierSteps are the truth table's steps with ClusterNetworkPolicies.
func (c *policyCluster) tierSteps(denyX, allowNS *networkingv1.NetworkPolicy) []policyStep {
	ctx := context.Background()
	xA := c.pod("x/a")
	host := func(ip netip.Addr) string { return netip.PrefixFrom(ip, ip.BitLen()).String() }
	// The API wants a port of a protocol: every one is a range.
	anyTCP := tcpRange(1, 65535)
	anyUDP := agentpolicy.CNPProtocol{UDP: &agentpolicy.CNPProtocolPort{DestinationPort: &agentpolicy.CNPPort{Range: &agentpolicy.CNPPortRange{Start: 1, End: 65535}}}}
	return []policyStep{
		// An Admin Deny beats the NetworkPolicy that allows y into x, on
		// TCP 80 only.
		{name: "Admin Deny over a NetworkPolicy allow", pols: []*networkingv1.NetworkPolicy{denyX, allowNS},
			cnps: []*agentpolicy.ClusterNetworkPolicy{cnp("Admin", 10, "y-not-to-x-80", inNamespaces("x"),
				[]agentpolicy.CNPIngressRule{{Name: "no-80", Action: "Deny", From: []agentpolicy.CNPIngressPeer{fromNamespaces("y")},
					Protocols: []agentpolicy.CNPProtocol{tcpPort(80)}}}, nil)}},
		// Pass hands app=b pods to x's default deny; Accept lets z in past
		// it; a later rule of the same policy is never reached for them.
		{name: "Admin Pass and Accept around a default deny", pols: []*networkingv1.NetworkPolicy{denyX},
			cnps: []*agentpolicy.ClusterNetworkPolicy{cnp("Admin", 20, "x-from-z", inNamespaces("x"),
				[]agentpolicy.CNPIngressRule{
					{Name: "b-to-netpol", Action: "Pass", From: []agentpolicy.CNPIngressPeer{{Pods: podsOf(sel(), sel("app", "b"))}}},
					{Name: "z-in", Action: "Accept", From: []agentpolicy.CNPIngressPeer{fromNamespaces("z")}},
				}, nil)}},
		// Baseline judges only directions no NetworkPolicy isolates: x
		// (isolated) keeps its NetworkPolicy verdicts; elsewhere UDP from y
		// is denied.
		{name: "Baseline Deny where no NetworkPolicy isolates", pols: []*networkingv1.NetworkPolicy{denyX, allowNS},
			cnps: []*agentpolicy.ClusterNetworkPolicy{cnp("Baseline", 10, "no-udp-from-y", inNamespaces(),
				[]agentpolicy.CNPIngressRule{{Action: "Deny", From: []agentpolicy.CNPIngressPeer{fromNamespaces("y")},
					Protocols: []agentpolicy.CNPProtocol{anyUDP}}}, nil)}},
		// Egress to networks: z's pods reach x/a alone, in both families; the
		// lower priority number judges first.
		{name: "Admin egress networks by priority", cnps: []*agentpolicy.ClusterNetworkPolicy{
			cnp("Admin", 5, "z-to-x-a", inNamespaces("z"), nil, []agentpolicy.CNPEgressRule{{Action: "Accept",
				To: []agentpolicy.CNPEgressPeer{{Networks: []string{host(xA.lp.IP), host(xA.lp.IPv6)}}}}}),
			cnp("Admin", 6, "z-to-no-pod", inNamespaces("z"), nil, []agentpolicy.CNPEgressRule{{Action: "Deny",
				To: []agentpolicy.CNPEgressPeer{{Networks: []string{c.cidr.String(), c.cidr6.String()}}}}}),
		}},
		// Equal priorities judge by name: a-... accepts TCP 80-81 into y
		// before b-... denies everything; a Baseline named port keeps x's
		// pods from every pod's "web" port (TCP 80 in x, 81 in y).
		{name: "equal priorities, a port range and a named port", cnps: []*agentpolicy.ClusterNetworkPolicy{
			cnp("Admin", 30, "a-y-tcp-80-81", inNamespaces("y"), []agentpolicy.CNPIngressRule{{Action: "Accept",
				From: []agentpolicy.CNPIngressPeer{fromNamespaces()}, Protocols: []agentpolicy.CNPProtocol{tcpRange(80, 81)}}}, nil),
			cnp("Admin", 30, "b-y-nothing", inNamespaces("y"), []agentpolicy.CNPIngressRule{{Action: "Deny",
				From: []agentpolicy.CNPIngressPeer{fromNamespaces()}}}, nil),
			cnp("Baseline", 1, "x-not-to-web", inNamespaces("x"), nil, []agentpolicy.CNPEgressRule{{Action: "Deny",
				To: []agentpolicy.CNPEgressPeer{{Pods: podsOf(sel(), sel())}}, Protocols: []agentpolicy.CNPProtocol{{DestinationNamedPort: "web"}}}}),
		}},
		// A Baseline Pass allows: TCP 80 into app=a pods, other TCP denied
		// everywhere; then x/c becomes app=a.
		{name: "Baseline Pass, and a pod moving into a subject", cnps: []*agentpolicy.ClusterNetworkPolicy{
			cnp("Baseline", 1, "a-80", agentpolicy.CNPSubject{Pods: podsOf(sel(), sel("app", "a"))}, []agentpolicy.CNPIngressRule{{Action: "Pass",
				From: []agentpolicy.CNPIngressPeer{fromNamespaces()}, Protocols: []agentpolicy.CNPProtocol{tcpPort(80)}}}, nil),
			cnp("Baseline", 2, "no-tcp", inNamespaces(), []agentpolicy.CNPIngressRule{{Action: "Deny",
				From: []agentpolicy.CNPIngressPeer{fromNamespaces()}, Protocols: []agentpolicy.CNPProtocol{anyTCP}}}, nil),
		},
			change: func(t *testing.T) { c.setPodLabels(t, ctx, c.pod("x/c"), map[string]string{"app": "a"}) },
			revert: func(t *testing.T) { c.setPodLabels(t, ctx, c.pod("x/c"), map[string]string{"app": "c"}) }},
	}
}
