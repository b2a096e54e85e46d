package policy

import (
	"cmp"
	"net/netip"
	"slices"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/onc-net/onc/datapath/policy"
)

// LocalPod is a pod attached on this node, as the agent knows it.
type LocalPod struct {
	Namespace, Name, Iface string
	IP                     netip.Addr
}

// everywhere is what a rule with no peers allows: every IPv4 address.
var everywhere = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}

// Compile resolves the NetworkPolicies of s into the rules of the local
// pods. It is deterministic, so callers can compare two rulesets with
// reflect.DeepEqual. Rules of different pods may share slices: the result
// is read-only.
//
// A local pod the snapshot does not hold yet has no labels to select it
// by, so it is not isolated until the informer sees it (and a recompile
// follows).
func Compile(s Snapshot, local []LocalPod) policy.Ruleset {
	c := newCompiler(s, local)
	rs := policy.Ruleset{Pods: make([]policy.Pod, 0, len(local))}
	for _, lp := range local {
		p := policy.Pod{Key: lp.Namespace + "/" + lp.Name, Iface: lp.Iface, IP: lp.IP}
		if pod := c.pods[p.Key]; pod != nil {
			c.compilePod(&p, pod)
		}
		rs.Pods = append(rs.Pods, p)
	}
	slices.SortFunc(rs.Pods, func(a, b policy.Pod) int { return cmp.Compare(a.Key, b.Key) })
	return rs
}

type compiler struct {
	namespaces map[string]labels.Set
	pods       map[string]*corev1.Pod // every pod of the snapshot, by namespace/name
	peers      []peerPod              // the pods a rule can select
	policies   []networkPolicy        // sorted by namespace/name

	// Peers and egress rules do not depend on the local pod: memoized by
	// policy and rule index.
	ingressPeers map[[2]int][]netip.Prefix
	egressRules  map[[2]int][]policy.Rule
}

// peerPod is a pod that can be a rule's peer: it has an IPv4 address and
// its own (not the node's) network.
type peerPod struct {
	pod   *corev1.Pod
	addrs []netip.Prefix // its /32s
}

type networkPolicy struct {
	np              *networkingv1.NetworkPolicy
	key             string
	selector        labels.Selector
	ingress, egress bool // the directions it isolates
}

func newCompiler(s Snapshot, local []LocalPod) *compiler {
	c := &compiler{
		namespaces:   make(map[string]labels.Set, len(s.Namespaces)),
		pods:         make(map[string]*corev1.Pod, len(s.Pods)),
		ingressPeers: map[[2]int][]netip.Prefix{},
		egressRules:  map[[2]int][]policy.Rule{},
	}
	for _, ns := range s.Namespaces {
		c.namespaces[ns.Name] = ns.Labels
	}
	localIP := make(map[string]netip.Addr, len(local))
	for _, lp := range local {
		localIP[lp.Namespace+"/"+lp.Name] = lp.IP
	}
	for _, pod := range s.Pods {
		key := pod.Namespace + "/" + pod.Name
		c.pods[key] = pod
		if pod.Spec.HostNetwork || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			continue
		}
		if addrs := podAddrs(pod, localIP[key]); len(addrs) > 0 {
			c.peers = append(c.peers, peerPod{pod: pod, addrs: addrs})
		}
	}
	for _, np := range s.Policies {
		in, eg := isolates(&np.Spec)
		c.policies = append(c.policies, networkPolicy{
			np: np, key: np.Namespace + "/" + np.Name, selector: selector(&np.Spec.PodSelector), ingress: in, egress: eg,
		})
	}
	slices.SortFunc(c.policies, func(a, b networkPolicy) int { return cmp.Compare(a.key, b.key) })
	c.policies = slices.CompactFunc(c.policies, func(a, b networkPolicy) bool { return a.key == b.key })
	return c
}

// podAddrs is the pod's IPv4 addresses as /32s; the agent's own record of
// a local pod stands in until the API shows an address.
func podAddrs(pod *corev1.Pod, local netip.Addr) []netip.Prefix {
	ips := pod.Status.PodIPs
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	var addrs []netip.Prefix
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() {
			addrs = append(addrs, netip.PrefixFrom(a, 32))
		}
	}
	if len(addrs) == 0 && local.Unmap().Is4() {
		addrs = append(addrs, netip.PrefixFrom(local.Unmap(), 32))
	}
	return addrs
}

// isolates is the directions a policy isolates. Without policyTypes:
// ingress always, egress if it has egress rules (the API's documented
// default).
func isolates(spec *networkingv1.NetworkPolicySpec) (ingress, egress bool) {
	if len(spec.PolicyTypes) == 0 {
		return true, len(spec.Egress) > 0
	}
	for _, t := range spec.PolicyTypes {
		switch t {
		case networkingv1.PolicyTypeIngress:
			ingress = true
		case networkingv1.PolicyTypeEgress:
			egress = true
		}
	}
	return ingress, egress
}

// selector converts a label selector; an invalid one selects nothing.
func selector(ls *metav1.LabelSelector) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return labels.Nothing()
	}
	return sel
}

func (c *compiler) compilePod(p *policy.Pod, pod *corev1.Pod) {
	for pi := range c.policies {
		pol := &c.policies[pi]
		if pol.np.Namespace != pod.Namespace || !pol.selector.Matches(labels.Set(pod.Labels)) {
			continue
		}
		if pol.ingress {
			p.Ingress = isolate(p.Ingress, pol.key)
			for ri := range pol.np.Spec.Ingress {
				p.Ingress.Rules = append(p.Ingress.Rules, c.ingressRule(pi, ri, pod))
			}
		}
		if pol.egress {
			p.Egress = isolate(p.Egress, pol.key)
			for ri := range pol.np.Spec.Egress {
				p.Egress.Rules = append(p.Egress.Rules, c.egressRule(pi, ri)...)
			}
		}
	}
}

// isolate adds a policy to a direction, isolating it if it was not.
// Policies come sorted and unique, so the list stays so.
func isolate(d *policy.Direction, key string) *policy.Direction {
	if d == nil {
		d = &policy.Direction{}
	}
	d.Policies = append(d.Policies, key)
	return d
}

// ingressRule compiles ingress rule ri of policy pi for pod: its named
// ports are the pod's own.
func (c *compiler) ingressRule(pi, ri int, pod *corev1.Pod) policy.Rule {
	pol := &c.policies[pi]
	rule := &pol.np.Spec.Ingress[ri]
	peers, ok := c.ingressPeers[[2]int{pi, ri}]
	if !ok {
		peers = c.selectPeers(pol.np.Namespace, rule.From).prefixes
		c.ingressPeers[[2]int{pi, ri}] = peers
	}
	r := policy.Rule{Policy: pol.key, Index: ri, Peers: peers}
	if len(rule.Ports) > 0 {
		ranges, named := splitPorts(rule.Ports)
		r.Ports = append(ranges, resolve(named, pod)...)
	}
	return r
}

// egressRule compiles egress rule ri of policy pi. Its named ports are
// each destination pod's: the rule splits into one rule for its numeric
// ports, for every peer, and one per resolved port, for the pods that
// resolve to it. The first is left out when only named ports resolved.
func (c *compiler) egressRule(pi, ri int) []policy.Rule {
	if rules, ok := c.egressRules[[2]int{pi, ri}]; ok {
		return rules
	}
	pol := &c.policies[pi]
	rule := &pol.np.Spec.Egress[ri]
	peers := c.selectPeers(pol.np.Namespace, rule.To)
	var rules []policy.Rule
	if len(rule.Ports) == 0 {
		rules = []policy.Rule{{Policy: pol.key, Index: ri, Peers: peers.prefixes}}
	} else {
		ranges, named := splitPorts(rule.Ports)
		groups := map[policy.PortRange][]netip.Prefix{}
		if len(named) > 0 {
			for _, pp := range peers.pods {
				for _, pr := range resolve(named, pp.pod) {
					groups[pr] = append(groups[pr], pp.addrs...)
				}
			}
		}
		if len(ranges) > 0 || len(groups) == 0 {
			rules = append(rules, policy.Rule{Policy: pol.key, Index: ri, Peers: peers.prefixes, Ports: ranges})
		}
		resolved := make([]policy.PortRange, 0, len(groups))
		for pr := range groups {
			resolved = append(resolved, pr)
		}
		slices.SortFunc(resolved, comparePorts)
		for _, pr := range resolved {
			rules = append(rules, policy.Rule{Policy: pol.key, Index: ri, Peers: sortPrefixes(groups[pr]), Ports: []policy.PortRange{pr}})
		}
	}
	c.egressRules[[2]int{pi, ri}] = rules
	return rules
}

// peerSet is what a rule's peer list selects: addresses, and the pods
// among them (for egress named ports).
type peerSet struct {
	prefixes []netip.Prefix // sorted, unique; nil: nothing
	pods     []*peerPod
}

// selectPeers resolves the peer list of a rule of a policy in namespace ns.
func (c *compiler) selectPeers(ns string, list []networkingv1.NetworkPolicyPeer) peerSet {
	var ps peerSet
	if len(list) == 0 {
		ps.prefixes = slices.Clone(everywhere) // not the package's own: the result may outlive this call
		for i := range c.peers {
			ps.pods = append(ps.pods, &c.peers[i])
		}
		return ps
	}
	for _, peer := range list {
		if peer.IPBlock != nil {
			ps.prefixes = append(ps.prefixes, ipBlock(peer.IPBlock)...)
			continue
		}
		if peer.PodSelector == nil && peer.NamespaceSelector == nil {
			continue // the API rejects an empty peer
		}
		pods := labels.Everything()
		if peer.PodSelector != nil {
			pods = selector(peer.PodSelector)
		}
		var namespaces labels.Selector // nil: the policy's namespace
		if peer.NamespaceSelector != nil {
			namespaces = selector(peer.NamespaceSelector)
		}
		for i := range c.peers {
			pp := &c.peers[i]
			if namespaces == nil && pp.pod.Namespace != ns ||
				namespaces != nil && !namespaces.Matches(c.namespaces[pp.pod.Namespace]) ||
				!pods.Matches(labels.Set(pp.pod.Labels)) {
				continue
			}
			ps.prefixes = append(ps.prefixes, pp.addrs...)
			ps.pods = append(ps.pods, pp)
		}
	}
	ps.prefixes = sortPrefixes(ps.prefixes)
	return ps
}

func sortPrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, netip.Prefix.Compare)
	return slices.Compact(ps)
}

// ipBlock is the block's IPv4 CIDR minus its excepts, as disjoint
// prefixes. An IPv6 or unparsable CIDR is nothing.
func ipBlock(b *networkingv1.IPBlock) []netip.Prefix {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil || !cidr.Addr().Is4() {
		return nil
	}
	var except []netip.Prefix
	for _, e := range b.Except {
		if p, err := netip.ParsePrefix(e); err == nil && p.Addr().Is4() {
			except = append(except, p.Masked())
		}
	}
	return subtract(cidr.Masked(), except)
}

// subtract is p minus the except prefixes: p whole if none overlaps it,
// nothing if one covers it, else its two halves, each minus except.
func subtract(p netip.Prefix, except []netip.Prefix) []netip.Prefix {
	overlaps := false
	for _, e := range except {
		if e.Bits() <= p.Bits() && e.Contains(p.Addr()) {
			return nil
		}
		overlaps = overlaps || e.Overlaps(p)
	}
	if !overlaps {
		return []netip.Prefix{p}
	}
	// An except lies strictly inside p, so p is shorter than /32.
	bits := p.Bits() + 1
	hi := p.Addr().As4()
	hi[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	return append(subtract(netip.PrefixFrom(p.Addr(), bits), except),
		subtract(netip.PrefixFrom(netip.AddrFrom4(hi), bits), except)...)
}

// namedPort is a port a policy names rather than numbers, to resolve
// against a pod's container ports.
type namedPort struct {
	name  string
	proto policy.Proto
}

// splitPorts separates a rule's numeric ports, resolved to ranges, from
// its named ones. ranges is never nil: a nil Ports would allow every port.
// Ports that can match nothing (unknown protocol, bad range) are dropped.
func splitPorts(ports []networkingv1.NetworkPolicyPort) (ranges []policy.PortRange, named []namedPort) {
	ranges = []policy.PortRange{}
	for _, p := range ports {
		proto, ok := protocol(p.Protocol)
		switch {
		case !ok:
		case p.Port == nil:
			ranges = append(ranges, policy.PortRange{Proto: proto, First: 1, Last: 65535})
		case p.Port.Type == intstr.String:
			named = append(named, namedPort{name: p.Port.StrVal, proto: proto})
		default:
			first, last := p.Port.IntVal, p.Port.IntVal
			if p.EndPort != nil {
				last = *p.EndPort
			}
			if first >= 1 && first <= last && last <= 65535 {
				ranges = append(ranges, policy.PortRange{Proto: proto, First: uint16(first), Last: uint16(last)})
			}
		}
	}
	return ranges, named
}

// protocol maps a policy or container port's protocol, TCP if unset.
func protocol(p *corev1.Protocol) (policy.Proto, bool) {
	if p == nil {
		return policy.TCP, true
	}
	switch *p {
	case corev1.ProtocolTCP, "":
		return policy.TCP, true
	case corev1.ProtocolUDP:
		return policy.UDP, true
	case corev1.ProtocolSCTP:
		return policy.SCTP, true
	}
	return 0, false
}

// resolve is the numbers the named ports have among pod's container ports
// (name and protocol both match).
func resolve(named []namedPort, pod *corev1.Pod) []policy.PortRange {
	var out []policy.PortRange
	for _, np := range named {
		for _, ctr := range pod.Spec.Containers {
			for _, cp := range ctr.Ports {
				proto, ok := protocol(&cp.Protocol)
				if ok && cp.Name == np.name && proto == np.proto && cp.ContainerPort >= 1 && cp.ContainerPort <= 65535 {
					out = append(out, policy.PortRange{Proto: proto, First: uint16(cp.ContainerPort), Last: uint16(cp.ContainerPort)})
				}
			}
		}
	}
	return out
}

func comparePorts(a, b policy.PortRange) int {
	return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.First, b.First), cmp.Compare(a.Last, b.Last))
}
