package policy

// ClusterNetworkPolicy: each local pod's Admin and Baseline rules, in the
// order they judge (datapath/policy tiers.go), resolved to prefixes and
// port numbers like NetworkPolicy's rules.

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/onc-net/onc/datapath/policy"
)

// clusterPolicy is a ClusterNetworkPolicy parsed. It depends on its
// object only, so Incremental carries it over while the object stays.
type clusterPolicy struct {
	obj             *ClusterNetworkPolicy
	tier            policy.Tier
	subject         *podSelector
	ingress, egress []tierRule
	// problems is what this agent cannot honour as written, and how it
	// fails closed instead: logged once per version of the policy.
	problems []string
	// closed: the policy as a whole could not be honoured (denyAll).
	closed bool
}

// podSelector selects pods by their namespace's labels and, if pods is
// not nil, their own.
type podSelector struct {
	namespaces, pods labels.Selector
}

func (s *podSelector) matches(pod *corev1.Pod, nsLabels labels.Set) bool {
	return s.namespaces.Matches(nsLabels) && (s.pods == nil || s.pods.Matches(labels.Set(pod.Labels)))
}

// namespacesOnly selects every pod of the namespaces ls selects. The CRD
// does not validate label selectors (an operator "in", or In without
// values, is accepted): an invalid one is an error, never a selector of
// nothing, which would fail open in a subject or a Deny peer.
func namespacesOnly(ls *metav1.LabelSelector) (podSelector, error) {
	ns, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return podSelector{}, fmt.Errorf("namespaces: %w", err)
	}
	return podSelector{namespaces: ns}, nil
}

// namespacedPod selects pods by both of np's selectors; an error as
// namespacesOnly.
func namespacedPod(np *CNPNamespacedPod) (podSelector, error) {
	ns, err := metav1.LabelSelectorAsSelector(&np.NamespaceSelector)
	if err != nil {
		return podSelector{}, fmt.Errorf("pods: namespaceSelector: %w", err)
	}
	pods, err := metav1.LabelSelectorAsSelector(&np.PodSelector)
	if err != nil {
		return podSelector{}, fmt.Errorf("pods: podSelector: %w", err)
	}
	return podSelector{namespaces: ns, pods: pods}, nil
}

// peerPods is the pods a namespaces or pods peer, or subject, selects; an
// error for an invalid selector or a peer of neither kind.
func peerPods(p CNPEgressPeer) (podSelector, error) {
	switch {
	case p.Namespaces != nil:
		return namespacesOnly(p.Namespaces)
	case p.Pods != nil:
		return namespacedPod(p.Pods)
	}
	return podSelector{}, errors.New("of no known kind")
}

// tierRule is one ingress or egress rule of a ClusterNetworkPolicy, parsed.
type tierRule struct {
	name     string
	action   policy.Action
	pods     []podSelector     // its namespaces and pods peers
	nodes    []labels.Selector // its nodes peers (egress)
	networks []netip.Prefix    // its networks peers (egress)
	// everything: the rule matches every address (a Deny or Pass rule
	// with something this agent cannot honour: it denies everything).
	everything bool
	ports      []policy.PortRange // its numeric ports; nil: no protocols, every protocol and port
	named      []string           // its destinationNamedPorts
	// peersKey is its peers as written: the rules with the same ones
	// share one resolved list (tierPeers), which the datapath then
	// compiles once for them all.
	peersKey string
}

// parseCNP parses a ClusterNetworkPolicy. One whose tier or subject it
// cannot read fails closed as a whole (denyAll).
func parseCNP(obj *ClusterNetworkPolicy) *clusterPolicy {
	cp := &clusterPolicy{obj: obj}
	var whole []string // why the policy cannot be honoured at all
	switch obj.Spec.Tier {
	case "Admin":
		cp.tier = policy.TierAdmin
	case "Baseline":
		cp.tier = policy.TierBaseline
	default:
		cp.tier = policy.TierAdmin
		whole = append(whole, fmt.Sprintf("unknown tier %q, taken as Admin", obj.Spec.Tier))
	}
	subject, err := peerPods(CNPEgressPeer{Namespaces: obj.Spec.Subject.Namespaces, Pods: obj.Spec.Subject.Pods})
	if err != nil {
		whole = append(whole, "subject "+err.Error())
	}
	if len(whole) > 0 {
		cp.denyAll(whole)
		return cp
	}
	cp.subject = &subject
	for ri, r := range obj.Spec.Ingress {
		peers := make([]CNPEgressPeer, len(r.From))
		for i, p := range r.From {
			peers[i] = CNPEgressPeer{Namespaces: p.Namespaces, Pods: p.Pods}
		}
		cp.ingress = append(cp.ingress, cp.parseRule(fmt.Sprintf("ingress rule %d", ri), r.Name, r.Action, peers, r.Protocols))
	}
	for ri, r := range obj.Spec.Egress {
		cp.egress = append(cp.egress, cp.parseRule(fmt.Sprintf("egress rule %d", ri), r.Name, r.Action, r.To, r.Protocols))
	}
	return cp
}

// denyAll makes cp, which cannot be honoured at all (why), fail closed:
// which pods it was meant for is unknown, or where it judges, so it
// selects every pod (but those on their node's network, as any subject)
// and each of its rules denies everything in its direction. Its priority
// and rule indexes stay, so that verdicts name it.
func (cp *clusterPolicy) denyAll(why []string) {
	cp.closed = true
	cp.subject = &podSelector{namespaces: labels.Everything()}
	for _, r := range cp.obj.Spec.Ingress {
		cp.ingress = append(cp.ingress, denyEverything(r.Name))
	}
	for _, r := range cp.obj.Spec.Egress {
		cp.egress = append(cp.egress, denyEverything(r.Name))
	}
	cp.problems = append(cp.problems, strings.Join(why, "; ")+": the policy selects every pod, and each of its rules denies everything")
}

// denyEverything is a rule that denies every address, protocol and port.
func denyEverything(name string) tierRule {
	return tierRule{name: name, action: policy.Deny, everything: true, peersKey: "everything"}
}

// parseRule parses a rule, where names it for problems. Whatever it cannot
// honour (a peer or protocol of no known kind, domainNames, a network that
// does not parse, an invalid label selector) fails closed as the API
// defines it: in an Accept rule it matches nothing; a Deny or Pass rule
// with one is a rule that denies everything.
func (cp *clusterPolicy) parseRule(where, name, action string, peers []CNPEgressPeer, protocols []CNPProtocol) tierRule {
	tr := tierRule{name: name}
	if b, err := json.Marshal(peers); err == nil {
		tr.peersKey = string(b)
	}
	switch action {
	case "Accept":
		tr.action = policy.Accept
	case "Deny":
		tr.action = policy.Deny
	case "Pass":
		tr.action = policy.Pass
	default:
		tr.action = policy.Deny
		cp.problems = append(cp.problems, fmt.Sprintf("%s: unknown action %q, taken as Deny", where, action))
	}
	var unknown []string
	for _, peer := range peers {
		switch {
		case peer.Namespaces != nil, peer.Pods != nil:
			if sel, err := peerPods(peer); err != nil {
				unknown = append(unknown, "a peer's invalid selector: "+err.Error())
			} else {
				tr.pods = append(tr.pods, sel)
			}
		case peer.Nodes != nil:
			if sel, err := metav1.LabelSelectorAsSelector(peer.Nodes); err != nil {
				unknown = append(unknown, "a peer's invalid selector: nodes: "+err.Error())
			} else {
				tr.nodes = append(tr.nodes, sel)
			}
		case len(peer.Networks) > 0:
			for _, n := range peer.Networks {
				if p, err := netip.ParsePrefix(n); err == nil {
					tr.networks = append(tr.networks, p.Masked())
				} else {
					unknown = append(unknown, fmt.Sprintf("the network %q", n))
				}
			}
		case len(peer.DomainNames) > 0:
			unknown = append(unknown, "a domainNames peer (not supported)")
		default:
			unknown = append(unknown, "a peer of no known kind")
		}
	}
	if len(protocols) > 0 {
		tr.ports = []policy.PortRange{} // not nil: the rule matches these ports only
	}
	for _, p := range protocols {
		var ranges []policy.PortRange
		ok := true
		switch {
		case p.TCP != nil:
			ranges, ok = portRanges(policy.TCP, p.TCP.DestinationPort)
		case p.UDP != nil:
			ranges, ok = portRanges(policy.UDP, p.UDP.DestinationPort)
		case p.SCTP != nil:
			ranges, ok = portRanges(policy.SCTP, p.SCTP.DestinationPort)
		case p.DestinationNamedPort != "":
			tr.named = append(tr.named, p.DestinationNamedPort)
		default:
			ok = false
		}
		if ok {
			tr.ports = append(tr.ports, ranges...)
		} else {
			unknown = append(unknown, "a protocol of no known kind")
		}
	}
	switch {
	case len(unknown) == 0:
	case tr.action == policy.Accept:
		cp.problems = append(cp.problems, fmt.Sprintf("%s: %s: matches nothing", where, strings.Join(unknown, ", ")))
	default:
		cp.problems = append(cp.problems, fmt.Sprintf("%s: %s: the rule denies everything", where, strings.Join(unknown, ", ")))
		tr = denyEverything(name)
	}
	return tr
}

// portRanges is a protocol's destination port as a range: every port
// without one; false if it is neither a valid number nor a valid range.
func portRanges(proto policy.Proto, p *CNPPort) ([]policy.PortRange, bool) {
	switch {
	case p == nil:
		return []policy.PortRange{{Proto: proto, First: 1, Last: 65535}}, true
	case p.Range != nil && p.Range.Start >= 1 && p.Range.Start <= p.Range.End && p.Range.End <= 65535:
		return []policy.PortRange{{Proto: proto, First: uint16(p.Range.Start), Last: uint16(p.Range.End)}}, true
	case p.Range == nil && p.Number >= 1 && p.Number <= 65535:
		return []policy.PortRange{{Proto: proto, First: uint16(p.Number), Last: uint16(p.Number)}}, true
	}
	return nil, false
}

// compareCNPs orders policies as they judge: by tier, priority, then name
// (the API leaves equal priorities unordered; kube-network-policies breaks
// ties by name too).
func compareCNPs(a, b *clusterPolicy) int {
	return cmp.Or(cmp.Compare(a.tier, b.tier), cmp.Compare(a.obj.Spec.Priority, b.obj.Spec.Priority), cmp.Compare(a.obj.Name, b.obj.Name))
}

// resolvedCNP is a policy's rules resolved against one snapshot: what does
// not depend on the subject pod (ingress named ports do).
type resolvedCNP struct {
	ingressPeers [][]netip.Prefix    // of each ingress rule
	egress       [][]policy.TierRule // of each egress rule: one per number its named ports resolve to, as egressRule
}

// podTiers is a local pod's Admin ([0]) and Baseline ([1]) rules in each
// direction.
type podTiers struct {
	ingress, egress [2][]policy.TierRule
}

// compileTiers is lp's tier rules: those of the ClusterNetworkPolicies
// whose subject selects it, in judging order. A pod on its node's network
// (or finished) is no policy's subject.
func (c *compiler) compileTiers(lp LocalPod) podTiers {
	var t podTiers
	pod := c.pods[lp.key()]
	if pod == nil || !policed(pod) {
		return t
	}
	nsLabels := c.namespaces[pod.Namespace]
	for _, cp := range c.cnps {
		if !cp.subject.matches(pod, nsLabels) {
			continue
		}
		res, slot := c.resolveCNP(cp), 0
		if cp.tier == policy.TierBaseline {
			slot = 1
		}
		for ri := range cp.ingress {
			t.ingress[slot] = append(t.ingress[slot], cp.ingressRule(ri, res.ingressPeers[ri], pod))
		}
		for _, rules := range res.egress {
			t.egress[slot] = append(t.egress[slot], rules...)
		}
	}
	return t
}

// withTiers is p with its tier rules: a direction that has some keeps its
// NetworkPolicy isolation, or is ClusterOnly without one. p's own
// directions are left as they are (the last ruleset may hold them).
func withTiers(p policy.Pod, t podTiers) policy.Pod {
	p.Ingress, p.Egress = withTier(p.Ingress, t.ingress), withTier(p.Egress, t.egress)
	return p
}

func withTier(d *policy.Direction, rules [2][]policy.TierRule) *policy.Direction {
	if len(rules[0]) == 0 && len(rules[1]) == 0 {
		return d
	}
	nd := policy.Direction{ClusterOnly: true}
	if d != nil {
		nd = *d
	}
	nd.Admin, nd.Baseline = rules[0], rules[1]
	return &nd
}

// rule is the TierRule of cp's rule ri before its peers and ports.
func (cp *clusterPolicy) rule(ri int, tr *tierRule) policy.TierRule {
	return policy.TierRule{Policy: cp.obj.Name, Priority: cp.obj.Spec.Priority, Index: ri, Name: tr.name, Action: tr.action}
}

// ingressRule is ingress rule ri of cp for the subject pod: its named
// ports are the pod's own container ports of those names, of any
// protocol.
func (cp *clusterPolicy) ingressRule(ri int, peers []netip.Prefix, pod *corev1.Pod) policy.TierRule {
	tr := &cp.ingress[ri]
	r := cp.rule(ri, tr)
	r.Peers, r.Ports = peers, tr.ports
	if len(tr.named) > 0 {
		r.Ports = append(slices.Clone(tr.ports), resolveNames(tr.named, pod)...)
	}
	return r
}

// resolveCNP is cp's rules resolved, once per compile.
func (c *compiler) resolveCNP(cp *clusterPolicy) *resolvedCNP {
	if res := c.cnpRules[cp]; res != nil {
		return res
	}
	res := &resolvedCNP{}
	for ri := range cp.ingress {
		res.ingressPeers = append(res.ingressPeers, c.tierPeers(&cp.ingress[ri]).prefixes)
	}
	for ri := range cp.egress {
		res.egress = append(res.egress, c.egressTierRules(cp, ri))
	}
	c.cnpRules[cp] = res
	return res
}

// egressTierRules is egress rule ri of cp: its named ports are each peer
// pod's, so it splits as a NetworkPolicy egress rule does
// (splitByNamedPort).
func (c *compiler) egressTierRules(cp *clusterPolicy, ri int) []policy.TierRule {
	tr := &cp.egress[ri]
	peers := c.tierPeers(tr)
	base := cp.rule(ri, tr)
	base.Peers, base.Ports = peers.prefixes, tr.ports
	if len(tr.named) == 0 {
		return []policy.TierRule{base}
	}
	named := peersByNamedPort(peers.pods, func(pod *corev1.Pod) []policy.PortRange { return resolveNames(tr.named, pod) })
	var rules []policy.TierRule
	splitByNamedPort(base.Peers, base.Ports, named, func(peers []netip.Prefix, ports []policy.PortRange) {
		r := base
		r.Peers, r.Ports = peers, ports
		rules = append(rules, r)
	})
	return rules
}

// tierPeers resolves a rule's peers: the pods it selects (never one on its
// node's network: see peerAddrs), its nodes' addresses and its networks.
func (c *compiler) tierPeers(tr *tierRule) peerSet {
	if ps, ok := c.tierPeerSets[tr.peersKey]; ok {
		return ps
	}
	ps := c.resolveTierPeers(tr)
	if tr.peersKey != "" {
		c.tierPeerSets[tr.peersKey] = ps
	}
	return ps
}

func (c *compiler) resolveTierPeers(tr *tierRule) peerSet {
	if tr.everything {
		return peerSet{prefixes: slices.Clone(everywhere)}
	}
	ps := peerSet{prefixes: slices.Clone(tr.networks)}
	for _, n := range c.nodes {
		if slices.ContainsFunc(tr.nodes, func(s labels.Selector) bool { return s.Matches(labels.Set(n.Labels)) }) {
			ps.prefixes = append(ps.prefixes, nodeAddrs(n)...)
		}
	}
	if len(tr.pods) > 0 {
		for i := range c.peers {
			pp := &c.peers[i]
			nsLabels := c.namespaces[pp.pod.Namespace]
			if slices.ContainsFunc(tr.pods, func(s podSelector) bool { return s.matches(pp.pod, nsLabels) }) {
				ps.prefixes = append(ps.prefixes, pp.addrs...)
				ps.pods = append(ps.pods, pp)
			}
		}
	}
	ps.prefixes = sortPrefixes(ps.prefixes)
	return ps
}

// nodeAddrs is a node's internal and external addresses, as /32s and
// /128s: what a nodes peer reaches.
func nodeAddrs(n *corev1.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP && a.Type != corev1.NodeExternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil {
			ip = ip.Unmap()
			out = append(out, netip.PrefixFrom(ip, ip.BitLen()))
		}
	}
	return out
}

// resolveNames is the numbers of pod's container ports with these names,
// each with its own protocol.
func resolveNames(names []string, pod *corev1.Pod) []policy.PortRange {
	var out []policy.PortRange
	for _, name := range names {
		out = append(out, portsNamed(pod, name)...)
	}
	return out
}

// tierChanges reports what may make a local pod's tier rules differ
// between prev and next: the policies (one added, changed or removed),
// or what their peers resolve against (a node, a pod, a local pod's
// address, a namespace's labels). It is coarse: either recompiles the
// tier rules of every local pod. Updates of what the caches trim away (a
// pod's readiness) change nothing; nothing does while no
// ClusterNetworkPolicy exists.
func tierChanges(prev, next *compiler) (policies, peers bool) {
	if len(prev.cnps) == 0 && len(next.cnps) == 0 {
		return false, false
	}
	peers = len(changedKeys(prev.node, next.node, sameButVersion[*corev1.Node])) > 0 ||
		len(changedKeys(prev.pods, next.pods, sameButVersion[*corev1.Pod])) > 0 ||
		len(changedKeys(prev.localIP, next.localIP, slices.Equal[[]netip.Addr])) > 0 ||
		len(changedKeys(prev.namespaces, next.namespaces, maps.Equal)) > 0
	policies = len(changedKeys(prev.cnp, next.cnp, func(a, b *clusterPolicy) bool { return a == b })) > 0
	return policies, peers
}

// keepResolved gives c what prev resolved of the policies it keeps, and
// prev's resolved peer lists: while nothing they resolve against changed
// (tierChanges), each would resolve against every pod of the cluster to
// the same.
func (c *compiler) keepResolved(prev *compiler) {
	for cp, res := range prev.cnpRules {
		if c.cnp[cp.obj.Name] == cp {
			c.cnpRules[cp] = res
		}
	}
	maps.Copy(c.tierPeerSets, prev.tierPeerSets)
}

// equal reports whether t and o are the same rules (EqualTierRules).
func (t podTiers) equal(o podTiers) bool {
	for i := range t.ingress {
		if !policy.EqualTierRules(t.ingress[i], o.ingress[i]) || !policy.EqualTierRules(t.egress[i], o.egress[i]) {
			return false
		}
	}
	return true
}

// sameButVersion reports whether two versions of a trimmed object differ
// at most in their resourceVersion.
func sameButVersion[T interface {
	runtime.Object
	metav1.Object
}](a, b T) bool {
	if any(a) == any(b) {
		return true
	}
	ac := a.DeepCopyObject().(T)
	ac.SetResourceVersion(b.GetResourceVersion())
	return equality.Semantic.DeepEqual(ac, b)
}

// warnCNPs logs what each policy of next new or changed since prev asks
// that this agent cannot honour, once per version of the policy.
func warnCNPs(prev, next *compiler) {
	for _, cp := range next.cnps {
		if len(cp.problems) == 0 || prev != nil && prev.cnp[cp.obj.Name] == cp {
			continue
		}
		level := slog.LevelWarn
		if cp.closed { // it denies the whole cluster's pods: louder
			level = slog.LevelError
		}
		slog.Log(context.Background(), level, "cluster network policy: enforced failing closed", "policy", cp.obj.Name,
			"problems", strings.Join(cp.problems, "; "))
	}
}
