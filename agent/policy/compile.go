package policy

import (
	"cmp"
	"maps"
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
	IPs                    []netip.Addr // one per family
}

func (lp LocalPod) key() string { return lp.Namespace + "/" + lp.Name }

// everywhere is what a rule with no peers allows: every address.
var everywhere = []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}

// Compile resolves the NetworkPolicies and ClusterNetworkPolicies of s
// into the rules of the local pods. It is deterministic, so callers can
// compare two rulesets with reflect.DeepEqual. Rules of different pods may
// share slices: the result is read-only.
//
// A local pod the snapshot does not hold yet has no labels to select it
// by, so it is not isolated until the informer sees it (and a recompile
// follows).
//
// Compile is the reference Incremental is tested against.
func Compile(s Snapshot, local []LocalPod) policy.Ruleset {
	c := newCompiler(s, local, nil)
	rs := policy.Ruleset{Pods: make([]policy.Pod, 0, len(local))}
	for _, lp := range local {
		p, _ := c.compileLocal(lp)
		rs.Pods = append(rs.Pods, withTiers(p, c.compileTiers(lp)))
	}
	sortPods(rs.Pods)
	return rs
}

func sortPods(pods []policy.Pod) {
	slices.SortFunc(pods, func(a, b policy.Pod) int { return cmp.Compare(a.Key, b.Key) })
}

// compiler is one snapshot's inputs, indexed.
type compiler struct {
	namespaces map[string]labels.Set
	pods       map[string]*corev1.Pod  // every pod of the snapshot, by namespace/name
	localIP    map[string][]netip.Addr // the local pods' addresses, by namespace/name
	peers      []peerPod               // the pods a rule can select
	policies   []*networkPolicy        // sorted by key
	policy     map[string]*networkPolicy
	cnps       []*clusterPolicy // in judging order (compareCNPs)
	cnp        map[string]*clusterPolicy
	cnpRules   map[*clusterPolicy]*resolvedCNP // resolved in this compile, or kept (keepResolved)
	// tierPeerSets are the peers resolved in this compile, by peersKey.
	tierPeerSets map[string]peerSet
	nodes        []*corev1.Node
	node         map[string]*corev1.Node
}

// peerPod is a pod that can be a rule's peer: it has an IPv4 address and
// its own (not the node's) network.
type peerPod struct {
	pod   *corev1.Pod
	addrs []netip.Prefix // its /32s
}

// networkPolicy is a policy parsed, and its rules once resolved. It
// depends only on its object, and its resolved rules on the pods they
// select: Incremental carries it from one compile to the next while the
// object is the same, patching the resolved rules when a pod they
// selected or select changes.
type networkPolicy struct {
	np              *networkingv1.NetworkPolicy
	key             string
	selector        labels.Selector
	ingress, egress bool        // the directions it isolates
	from, to        []rulePeers // of each ingress and egress rule
	rules           *resolved   // nil until a local pod it selects needs them
	// audit: the policy is audited, not enforced (ModeAnnotation);
	// badMode is the annotation's value when it names no mode (the policy
	// is then enforced).
	audit   bool
	badMode string
}

// resolved is a policy's rules with their peers resolved, for the
// directions it isolates. Neither depends on the pod selected (ingress
// named ports, which do, are resolved per pod).
type resolved struct {
	ingressPeers [][]netip.Prefix // of each ingress rule
	egress       []egressRule     // of each egress rule
}

// egressRule is an egress rule resolved. Its named ports are each
// destination pod's: it compiles to one rule for its numeric ports, for
// every peer, and one per number its named ports resolve to, for the pods
// that resolve them to it. The first is left out when only named ports
// resolved.
type egressRule struct {
	peers []netip.Prefix                      // sorted, unique; nil: nothing
	named map[policy.PortRange][]netip.Prefix // the peers whose named ports resolve to each number, sorted
	rules []policy.Rule                       // compiled from the above
}

// rulePeers is a rule's peer list, parsed.
type rulePeers struct {
	everyone  bool           // an empty list: every address, every pod
	blocks    []netip.Prefix // its ipBlocks
	selectors []peerSelector
	// namedPorts: an egress rule whose ports name container ports, so
	// that its rules depend on its peers' ports, not only their addresses.
	namedPorts bool
}

// peerSelector is a peer that selects pods.
type peerSelector struct {
	pods       labels.Selector
	namespaces labels.Selector // nil: the policy's namespace
}

func newCompiler(s Snapshot, local []LocalPod, prev *compiler) *compiler {
	c := &compiler{
		namespaces:   make(map[string]labels.Set, len(s.Namespaces)),
		pods:         make(map[string]*corev1.Pod, len(s.Pods)),
		localIP:      make(map[string][]netip.Addr, len(local)),
		policy:       make(map[string]*networkPolicy, len(s.Policies)),
		cnp:          make(map[string]*clusterPolicy, len(s.ClusterPolicies)),
		cnpRules:     map[*clusterPolicy]*resolvedCNP{},
		tierPeerSets: map[string]peerSet{},
		nodes:        s.Nodes,
		node:         make(map[string]*corev1.Node, len(s.Nodes)),
	}
	for _, n := range s.Nodes {
		c.node[n.Name] = n
	}
	for _, obj := range s.ClusterPolicies {
		if prev != nil && prev.cnp[obj.Name] != nil && prev.cnp[obj.Name].obj == obj {
			c.cnp[obj.Name] = prev.cnp[obj.Name]
		} else {
			c.cnp[obj.Name] = parseCNP(obj)
		}
	}
	c.cnps = slices.SortedFunc(maps.Values(c.cnp), compareCNPs)
	for _, ns := range s.Namespaces {
		c.namespaces[ns.Name] = ns.Labels
	}
	for _, lp := range local {
		c.localIP[lp.key()] = lp.IPs
	}
	for _, pod := range s.Pods {
		key := pod.Namespace + "/" + pod.Name
		c.pods[key] = pod
		if addrs := peerAddrs(pod, c.localIP[key]); addrs != nil {
			c.peers = append(c.peers, peerPod{pod: pod, addrs: addrs})
		}
	}
	for _, np := range s.Policies {
		key := np.Namespace + "/" + np.Name
		if pol := prev.reusable(key, np); pol != nil {
			c.policies = append(c.policies, pol)
		} else {
			c.policies = append(c.policies, parsePolicy(key, np))
		}
	}
	slices.SortFunc(c.policies, func(a, b *networkPolicy) int { return cmp.Compare(a.key, b.key) })
	c.policies = slices.CompactFunc(c.policies, func(a, b *networkPolicy) bool { return a.key == b.key })
	for _, pol := range c.policies {
		c.policy[pol.key] = pol
	}
	return c
}

// reusable is the parsed policy key of c if it is np's, else nil (also
// when c is nil: no earlier compile).
func (c *compiler) reusable(key string, np *networkingv1.NetworkPolicy) *networkPolicy {
	if c == nil {
		return nil
	}
	if pol := c.policy[key]; pol != nil && pol.np == np {
		return pol
	}
	return nil
}

// ModeAnnotation on a NetworkPolicy says whether it is enforced (its
// value "enforce", or no annotation) or audited ("audit": the datapath
// reports what it would deny or allow and enforces nothing of it). Any
// other value is enforced: a typo must not lift a policy.
const ModeAnnotation = "onc.io/policy-mode"

func parsePolicy(key string, np *networkingv1.NetworkPolicy) *networkPolicy {
	pol := &networkPolicy{np: np, key: key, selector: selector(&np.Spec.PodSelector)}
	switch mode, ok := np.Annotations[ModeAnnotation]; {
	case mode == "audit":
		pol.audit = true
	case ok && mode != "enforce":
		pol.badMode = mode
	}
	pol.ingress, pol.egress = isolates(&np.Spec)
	for _, r := range np.Spec.Ingress {
		pol.from = append(pol.from, parsePeers(r.From))
	}
	for _, r := range np.Spec.Egress {
		rp := parsePeers(r.To)
		_, named := splitPorts(r.Ports)
		rp.namedPorts = len(named) > 0
		pol.to = append(pol.to, rp)
	}
	return pol
}

func parsePeers(list []networkingv1.NetworkPolicyPeer) rulePeers {
	rp := rulePeers{everyone: len(list) == 0}
	for _, peer := range list {
		if peer.IPBlock != nil {
			rp.blocks = append(rp.blocks, ipBlock(peer.IPBlock)...)
			continue
		}
		if peer.PodSelector == nil && peer.NamespaceSelector == nil {
			continue // the API rejects an empty peer
		}
		ps := peerSelector{pods: labels.Everything()}
		if peer.PodSelector != nil {
			ps.pods = selector(peer.PodSelector)
		}
		if peer.NamespaceSelector != nil {
			ps.namespaces = selector(peer.NamespaceSelector)
		}
		rp.selectors = append(rp.selectors, ps)
	}
	return rp
}

// selects reports whether the peer list of a rule of a policy in
// namespace ns selects pod, whose namespace has nsLabels (pod must be a
// peer at all: see peerAddrs).
func (rp *rulePeers) selects(ns string, pod *corev1.Pod, nsLabels labels.Set) bool {
	if rp.everyone {
		return true
	}
	for _, s := range rp.selectors {
		if (s.namespaces == nil && pod.Namespace == ns || s.namespaces != nil && s.namespaces.Matches(nsLabels)) &&
			s.pods.Matches(labels.Set(pod.Labels)) {
			return true
		}
	}
	return false
}

// PodAddrs is a pod's own addresses, those a policy can name it by
// (status.podIPs, else status.podIP): none for a pod on its node's
// network or one that finished.
func PodAddrs(pod *corev1.Pod) []netip.Addr {
	if !policed(pod) {
		return nil
	}
	ips := pod.Status.PodIPs
	if len(ips) == 0 && pod.Status.PodIP != "" {
		ips = []corev1.PodIP{{IP: pod.Status.PodIP}}
	}
	var addrs []netip.Addr
	for _, ip := range ips {
		if a, err := netip.ParseAddr(ip.IP); err == nil {
			addrs = append(addrs, a.Unmap())
		}
	}
	return addrs
}

// PodsByAddr indexes pods by every address PodAddrs gives them. Where two
// share one (an address reused while the old pod terminates, or an
// informer not caught up yet), the one not terminating holds it, else
// the newer.
func PodsByAddr(pods []*corev1.Pod) map[netip.Addr]*corev1.Pod {
	out := map[netip.Addr]*corev1.Pod{}
	for _, p := range pods {
		for _, ip := range PodAddrs(p) {
			if cur := out[ip]; cur == nil || rather(p, cur) {
				out[ip] = p
			}
		}
	}
	return out
}

// rather says whether p holds an address it shares with cur rather than
// cur: it is not terminating and cur is, or, both alike, it is newer.
func rather(p, cur *corev1.Pod) bool {
	if (p.DeletionTimestamp == nil) != (cur.DeletionTimestamp == nil) {
		return p.DeletionTimestamp == nil
	}
	return cur.CreationTimestamp.Before(&p.CreationTimestamp)
}

// policed says whether NetworkPolicy sees the pod: not on its node's
// network, not finished.
func policed(pod *corev1.Pod) bool {
	return !pod.Spec.HostNetwork && pod.Status.Phase != corev1.PodSucceeded && pod.Status.Phase != corev1.PodFailed
}

// peerAddrs is the pod's addresses as /32s and /128s, nil if it cannot be
// a peer (host network, finished, or no address). The agent's own record
// of a local pod stands in until the API shows an address.
func peerAddrs(pod *corev1.Pod, local []netip.Addr) []netip.Prefix {
	if !policed(pod) {
		return nil
	}
	addrs := PodAddrs(pod)
	if len(addrs) == 0 {
		addrs = local
	}
	var out []netip.Prefix
	for _, a := range addrs {
		out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
	}
	return out
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

// selector converts a NetworkPolicy's label selector, which the API server
// validates; an invalid one selects nothing. ClusterNetworkPolicy's, which
// its CRD does not validate, fail closed instead (cnp.go).
func selector(ls *metav1.LabelSelector) labels.Selector {
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return labels.Nothing()
	}
	return sel
}

// selects reports whether pol applies to pod.
func (pol *networkPolicy) selects(pod *corev1.Pod) bool {
	return pol.np.Namespace == pod.Namespace && pol.selector.Matches(labels.Set(pod.Labels))
}

// compileLocal is lp's rules and the keys of the policies that select it.
func (c *compiler) compileLocal(lp LocalPod) (p policy.Pod, selectedBy []string) {
	p = policy.Pod{Key: lp.key(), Iface: lp.Iface, IPs: lp.IPs}
	if pod := c.pods[p.Key]; pod != nil {
		selectedBy = c.compilePod(&p, pod)
	}
	return p, selectedBy
}

func (c *compiler) compilePod(p *policy.Pod, pod *corev1.Pod) (selectedBy []string) {
	for _, pol := range c.policies {
		if !pol.selects(pod) {
			continue
		}
		selectedBy = append(selectedBy, pol.key)
		if !pol.ingress && !pol.egress {
			continue
		}
		rules := c.rulesOf(pol)
		// Enforcing and audited policies make separate directions: the
		// union of the enforcing ones' rules is what is enforced.
		ingress, egress := &p.Ingress, &p.Egress
		if pol.audit {
			ingress, egress = &p.AuditIngress, &p.AuditEgress
		}
		if pol.ingress {
			*ingress = isolate(*ingress, pol.key)
			for ri, peers := range rules.ingressPeers {
				(*ingress).Rules = append((*ingress).Rules, ingressRule(pol, ri, peers, pod))
			}
		}
		if pol.egress {
			*egress = isolate(*egress, pol.key)
			for _, er := range rules.egress {
				(*egress).Rules = append((*egress).Rules, er.rules...)
			}
		}
	}
	return selectedBy
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

// rulesOf is pol's resolved rules, resolving them if it has none.
func (c *compiler) rulesOf(pol *networkPolicy) *resolved {
	if pol.rules != nil {
		return pol.rules
	}
	r := &resolved{}
	if pol.ingress {
		for ri := range pol.from {
			r.ingressPeers = append(r.ingressPeers, c.selectPeers(pol.np.Namespace, &pol.from[ri]).prefixes)
		}
	}
	if pol.egress {
		for ri := range pol.to {
			r.egress = append(r.egress, c.egressRule(pol, ri))
		}
	}
	pol.rules = r
	return r
}

// ingressRule is ingress rule ri of pol, with peers, for pod: its named
// ports are the pod's own.
func ingressRule(pol *networkPolicy, ri int, peers []netip.Prefix, pod *corev1.Pod) policy.Rule {
	r := policy.Rule{Policy: pol.key, Index: ri, Peers: peers}
	if ports := pol.np.Spec.Ingress[ri].Ports; len(ports) > 0 {
		ranges, named := splitPorts(ports)
		r.Ports = append(ranges, resolve(named, pod)...)
	}
	return r
}

// egressRule resolves egress rule ri of pol.
func (c *compiler) egressRule(pol *networkPolicy, ri int) egressRule {
	peers := c.selectPeers(pol.np.Namespace, &pol.to[ri])
	er := egressRule{peers: peers.prefixes}
	if _, named := splitPorts(pol.np.Spec.Egress[ri].Ports); len(named) > 0 {
		er.named = peersByNamedPort(peers.pods, func(pod *corev1.Pod) []policy.PortRange { return resolve(named, pod) })
	}
	er.rules = er.compile(pol, ri)
	return er
}

// peersByNamedPort is, for an egress rule with named ports, the addresses
// of the peer pods by each number resolve gives their named ports, sorted.
func peersByNamedPort(pods []*peerPod, resolve func(*corev1.Pod) []policy.PortRange) map[policy.PortRange][]netip.Prefix {
	named := map[policy.PortRange][]netip.Prefix{}
	for _, pp := range pods {
		for _, pr := range resolve(pp.pod) {
			named[pr] = append(named[pr], pp.addrs...)
		}
	}
	for pr, addrs := range named {
		named[pr] = sortPrefixes(addrs)
	}
	return named
}

// splitByNamedPort is how an egress rule with named ports compiles, for
// NetworkPolicy and ClusterNetworkPolicy alike: emit is called for its
// numeric ports with every peer (left out when only named ports resolved),
// then for each number its named ports resolve to, in port order, with the
// peers that resolve them to it.
func splitByNamedPort(peers []netip.Prefix, numeric []policy.PortRange, named map[policy.PortRange][]netip.Prefix,
	emit func(peers []netip.Prefix, ports []policy.PortRange)) {
	if len(numeric) > 0 || len(named) == 0 {
		emit(peers, numeric)
	}
	for _, pr := range slices.SortedFunc(maps.Keys(named), comparePorts) {
		emit(named[pr], []policy.PortRange{pr})
	}
}

// compile is er's rules; pol's egress rule ri is er.
func (er *egressRule) compile(pol *networkPolicy, ri int) []policy.Rule {
	ports := pol.np.Spec.Egress[ri].Ports
	if len(ports) == 0 {
		return []policy.Rule{{Policy: pol.key, Index: ri, Peers: er.peers}}
	}
	var rules []policy.Rule
	ranges, _ := splitPorts(ports)
	splitByNamedPort(er.peers, ranges, er.named, func(peers []netip.Prefix, ports []policy.PortRange) {
		rules = append(rules, policy.Rule{Policy: pol.key, Index: ri, Peers: peers, Ports: ports})
	})
	return rules
}

// peerSet is what a rule's peer list selects: addresses, and the pods
// among them (for egress named ports).
type peerSet struct {
	prefixes []netip.Prefix // sorted, unique; nil: nothing
	pods     []*peerPod
}

// selectPeers resolves the peer list of a rule of a policy in namespace ns.
func (c *compiler) selectPeers(ns string, rp *rulePeers) peerSet {
	var ps peerSet
	if rp.everyone {
		ps.prefixes = slices.Clone(everywhere) // not the package's own: the result may outlive this call
		for i := range c.peers {
			ps.pods = append(ps.pods, &c.peers[i])
		}
		return ps
	}
	ps.prefixes = slices.Clone(rp.blocks) // the policy's own stays as parsed
	if len(rp.selectors) > 0 {
		for i := range c.peers {
			pp := &c.peers[i]
			if rp.selects(ns, pp.pod, c.namespaces[pp.pod.Namespace]) {
				ps.prefixes = append(ps.prefixes, pp.addrs...)
				ps.pods = append(ps.pods, pp)
			}
		}
	}
	ps.prefixes = sortPrefixes(ps.prefixes)
	return ps
}

func sortPrefixes(ps []netip.Prefix) []netip.Prefix {
	slices.SortFunc(ps, netip.Prefix.Compare)
	return slices.Compact(ps)
}

// ipBlock is the block's CIDR minus its excepts (those of its family), as
// disjoint prefixes. An unparsable CIDR is nothing.
func ipBlock(b *networkingv1.IPBlock) []netip.Prefix {
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return nil
	}
	var except []netip.Prefix
	for _, e := range b.Except {
		if p, err := netip.ParsePrefix(e); err == nil && p.Addr().Is4() == cidr.Addr().Is4() {
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
	// An except lies strictly inside p, so p is shorter than a host.
	bits := p.Bits() + 1
	b := p.Addr().AsSlice()
	b[p.Bits()/8] |= 0x80 >> (p.Bits() % 8)
	hi, _ := netip.AddrFromSlice(b)
	return append(subtract(netip.PrefixFrom(p.Addr(), bits), except),
		subtract(netip.PrefixFrom(hi, bits), except)...)
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
		for _, pr := range portsNamed(pod, np.name) {
			if pr.Proto == np.proto {
				out = append(out, pr)
			}
		}
	}
	return out
}

// portsNamed is the numbers of pod's container ports named name, each
// with its protocol.
func portsNamed(pod *corev1.Pod, name string) []policy.PortRange {
	var out []policy.PortRange
	for _, ctr := range pod.Spec.Containers {
		for _, cp := range ctr.Ports {
			p, ok := protocol(&cp.Protocol)
			if ok && cp.Name == name && cp.ContainerPort >= 1 && cp.ContainerPort <= 65535 {
				out = append(out, policy.PortRange{Proto: p, First: uint16(cp.ContainerPort), Last: uint16(cp.ContainerPort)})
			}
		}
	}
	return out
}

func comparePorts(a, b policy.PortRange) int {
	return cmp.Or(cmp.Compare(a.Proto, b.Proto), cmp.Compare(a.First, b.First), cmp.Compare(a.Last, b.Last))
}
