package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/onc-net/onc/datapath/policy"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cluster is a random cluster that changes as informers see changes: an
// update replaces an object, never modifies it.
type cluster struct {
	r          *rand.Rand
	namespaces map[string]*corev1.Namespace
	pods       map[string]*corev1.Pod
	policies   map[string]*networkingv1.NetworkPolicy
	cnps       map[string]*ClusterNetworkPolicy
	nodes      map[string]*corev1.Node
	local      map[string]LocalPod
}

// Small pools, so that selectors often match, addresses collide and
// objects come and go.
var (
	randNamespaces = []string{"a", "b", "c"}
	randPodNames   = []string{"p0", "p1", "p2", "p3", "p4"}
	randPolicies   = []string{"np0", "np1", "np2", "np3"}
	randCNPs       = []string{"cnp0", "cnp1", "cnp2"}
	randNodes      = []string{"n0", "n1"}
)

func (c *cluster) pick(vs ...string) string { return vs[c.r.IntN(len(vs))] }

// labels is a random label set over a small vocabulary; nil sometimes.
func (c *cluster) labels(keys ...string) map[string]string {
	if c.r.IntN(5) == 0 {
		return nil
	}
	l := map[string]string{}
	for _, k := range keys {
		if c.r.IntN(3) > 0 {
			l[k] = c.pick("x", "y")
		}
	}
	return l
}

func (c *cluster) ip() string {
	switch c.r.IntN(8) {
	case 0:
		return ""
	case 1:
		return "fd00::1"
	}
	return fmt.Sprintf("10.0.%d.%d", c.r.IntN(2), c.r.IntN(4))
}

func (c *cluster) namespace(name string) *corev1.Namespace {
	return namespace(name, c.labels("team", "env"))
}

func (c *cluster) pod(ns, name string) *corev1.Pod {
	var ports []corev1.ContainerPort
	for range c.r.IntN(3) {
		ports = append(ports, cport(c.pick("http", "dns"), []corev1.Protocol{"", protoTCP, protoUDP}[c.r.IntN(3)], int32(80+c.r.IntN(3))))
	}
	p := pod(ns, name, c.ip(), c.labels("app", "tier"), ports...)
	switch c.r.IntN(12) {
	case 0:
		p.Status.Phase = corev1.PodSucceeded
	case 1:
		p.Spec.HostNetwork = true
	case 2:
		p.Status.PodIPs = nil // PodIP only
	}
	return p
}

// selector is nil sometimes (only where the caller allows), else a
// random label selector, empty sometimes, with an expression sometimes.
func (c *cluster) selector(keys ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: c.labels(keys...)}
	if c.r.IntN(4) == 0 {
		op := []metav1.LabelSelectorOperator{metav1.LabelSelectorOpIn, metav1.LabelSelectorOpNotIn, metav1.LabelSelectorOpExists}[c.r.IntN(3)]
		var values []string
		if op != metav1.LabelSelectorOpExists {
			values = []string{c.pick("x", "y")}
		}
		s.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: c.pick(keys...), Operator: op, Values: values}}
	}
	return s
}

func (c *cluster) peers() []networkingv1.NetworkPolicyPeer {
	var peers []networkingv1.NetworkPolicyPeer
	for range c.r.IntN(3) {
		switch c.r.IntN(4) {
		case 0:
			peers = append(peers, podPeer(c.selector("app", "tier")))
		case 1:
			peers = append(peers, nsPeer(c.selector("team", "env")))
		case 2:
			peers = append(peers, networkingv1.NetworkPolicyPeer{PodSelector: c.selector("app", "tier"), NamespaceSelector: c.selector("team", "env")})
		default:
			peers = append(peers, block(fmt.Sprintf("10.0.%d.0/24", c.r.IntN(2)), fmt.Sprintf("10.0.0.%d/32", c.r.IntN(4))))
		}
	}
	return peers
}

func (c *cluster) ports() []networkingv1.NetworkPolicyPort {
	var ports []networkingv1.NetworkPolicyPort
	for range c.r.IntN(3) {
		proto := []corev1.Protocol{protoTCP, protoUDP}[c.r.IntN(2)]
		switch c.r.IntN(3) {
		case 0:
			ports = append(ports, port(proto, named(c.pick("http", "dns"))))
		case 1:
			ports = append(ports, withEnd(port(proto, num(80)), 90))
		default:
			ports = append(ports, port(proto, num(80+c.r.IntN(3))))
		}
	}
	return ports
}

func (c *cluster) policy(ns, name string) *networkingv1.NetworkPolicy {
	spec := networkingv1.NetworkPolicySpec{PodSelector: *c.selector("app", "tier")}
	switch c.r.IntN(4) {
	case 1:
		spec.PolicyTypes = types(ingressT)
	case 2:
		spec.PolicyTypes = types(egressT)
	case 3:
		spec.PolicyTypes = types(ingressT, egressT)
	}
	for range c.r.IntN(3) {
		spec.Ingress = append(spec.Ingress, networkingv1.NetworkPolicyIngressRule{From: c.peers(), Ports: c.ports()})
	}
	for range c.r.IntN(3) {
		spec.Egress = append(spec.Egress, networkingv1.NetworkPolicyEgressRule{To: c.peers(), Ports: c.ports()})
	}
	np := inNamespace(netPolicy(name, spec), ns)
	c.setMode(np)
	return np
}

// setMode gives np a random mode annotation: none mostly, audit often,
// enforce or a value naming no mode now and then.
func (c *cluster) setMode(np *networkingv1.NetworkPolicy) {
	switch c.r.IntN(6) {
	case 0, 1:
		np.Annotations = map[string]string{ModeAnnotation: "audit"}
	case 2:
		np.Annotations = map[string]string{ModeAnnotation: c.pick("enforce", "dry-run")}
	default:
		np.Annotations = nil
	}
}

// cnp is a random ClusterNetworkPolicy: either tier, clashing
// priorities, peers and ports of every kind, now and then one it cannot
// honour.
func (c *cluster) cnp(name string) *ClusterNetworkPolicy {
	spec := CNPSpec{Tier: c.pick("Admin", "Baseline"), Priority: int32(c.r.IntN(2))}
	if c.r.IntN(2) == 0 {
		spec.Subject.Namespaces = c.selector("team", "env")
	} else {
		spec.Subject.Pods = &CNPNamespacedPod{NamespaceSelector: *c.selector("team", "env"), PodSelector: *c.selector("app", "tier")}
	}
	for range c.r.IntN(3) {
		var from []CNPIngressPeer
		for _, p := range c.cnpPeers(2) {
			from = append(from, CNPIngressPeer{Namespaces: p.Namespaces, Pods: p.Pods})
		}
		spec.Ingress = append(spec.Ingress, CNPIngressRule{Name: c.pick("", "r"), Action: c.pick("Accept", "Deny", "Pass"),
			From: from, Protocols: c.cnpProtocols()})
	}
	for range c.r.IntN(3) {
		spec.Egress = append(spec.Egress, CNPEgressRule{Action: c.pick("Accept", "Deny", "Pass"), To: c.cnpPeers(6), Protocols: c.cnpProtocols()})
	}
	return &ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: spec}
}

// cnpPeers is 1-2 random peers of the first kinds: namespaces, pods,
// networks, nodes, domainNames, none known.
func (c *cluster) cnpPeers(kinds int) []CNPEgressPeer {
	var peers []CNPEgressPeer
	for range 1 + c.r.IntN(2) {
		switch c.r.IntN(kinds) {
		case 0:
			peers = append(peers, CNPEgressPeer{Namespaces: c.selector("team", "env")})
		case 1:
			peers = append(peers, CNPEgressPeer{Pods: &CNPNamespacedPod{NamespaceSelector: *c.selector("team", "env"), PodSelector: *c.selector("app", "tier")}})
		case 2:
			peers = append(peers, CNPEgressPeer{Networks: []string{fmt.Sprintf("10.0.%d.0/24", c.r.IntN(2)), "fd00::/64"}})
		case 3:
			peers = append(peers, CNPEgressPeer{Nodes: c.selector("role")})
		case 4:
			peers = append(peers, CNPEgressPeer{DomainNames: []string{"example.com"}})
		default:
			peers = append(peers, CNPEgressPeer{})
		}
	}
	return peers
}

// cnpProtocols is none sometimes, else numbers, ranges and named ports.
func (c *cluster) cnpProtocols() []CNPProtocol {
	var protos []CNPProtocol
	for range c.r.IntN(3) {
		port := &CNPProtocolPort{DestinationPort: &CNPPort{Number: int32(80 + c.r.IntN(3))}}
		switch c.r.IntN(4) {
		case 0:
			protos = append(protos, CNPProtocol{DestinationNamedPort: c.pick("http", "dns")})
		case 1:
			protos = append(protos, CNPProtocol{UDP: &CNPProtocolPort{DestinationPort: &CNPPort{Range: &CNPPortRange{Start: 80, End: 90}}}})
		case 2:
			protos = append(protos, CNPProtocol{UDP: port})
		default:
			protos = append(protos, CNPProtocol{TCP: port})
		}
	}
	return protos
}

func (c *cluster) node(name string) *corev1.Node {
	addrs := []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.0.%d.%d", c.r.IntN(2), c.r.IntN(4))}}
	if c.r.IntN(2) == 0 {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: "fd00::" + c.pick("1", "2")})
	}
	return node(name, c.labels("role"), addrs...)
}

// change makes one random change and says what it was.
func (c *cluster) change() string {
	ns, name := c.pick(randNamespaces...), c.pick(randPodNames...)
	key := ns + "/" + name
	switch c.r.IntN(14) {
	case 10, 11:
		cnp := c.pick(randCNPs...)
		if c.r.IntN(3) == 0 {
			delete(c.cnps, cnp)
			return "cluster policy deleted " + cnp
		}
		c.cnps[cnp] = c.cnp(cnp)
		return "cluster policy set " + cnp
	case 12:
		n := c.pick(randNodes...)
		if c.r.IntN(3) == 0 {
			delete(c.nodes, n)
			return "node deleted " + n
		}
		c.nodes[n] = c.node(n)
		return fmt.Sprintf("node %s labels %v addresses %v", n, c.nodes[n].Labels, c.nodes[n].Status.Addresses)
	case 0, 1:
		np := c.pick(randPolicies...)
		if c.r.IntN(3) == 0 {
			delete(c.policies, ns+"/"+np)
			return "policy deleted " + ns + "/" + np
		}
		c.policies[ns+"/"+np] = c.policy(ns, np)
		return "policy set " + ns + "/" + np
	case 2:
		if c.r.IntN(3) == 0 {
			delete(c.pods, key)
			return "pod deleted " + key
		}
		c.pods[key] = c.pod(ns, name)
		return "pod set " + key
	case 3:
		if p := c.pods[key]; p != nil {
			p = p.DeepCopy()
			p.Labels = c.labels("app", "tier")
			c.pods[key] = p
			return fmt.Sprintf("pod %s labels %v", key, p.Labels)
		}
		return "none"
	case 4:
		if p := c.pods[key]; p != nil {
			p = p.DeepCopy()
			p.Status.PodIP = c.ip()
			p.Status.PodIPs = nil
			c.pods[key] = p
			return fmt.Sprintf("pod %s ip %q", key, p.Status.PodIP)
		}
		return "none"
	case 5:
		if c.r.IntN(4) == 0 {
			delete(c.namespaces, ns)
			return "namespace deleted " + ns
		}
		c.namespaces[ns] = c.namespace(ns)
		return fmt.Sprintf("namespace %s labels %v", ns, c.namespaces[ns].Labels)
	case 6:
		if c.r.IntN(2) == 0 {
			delete(c.local, key)
			return "local pod removed " + key
		}
		c.local[key] = LocalPod{Namespace: ns, Name: name, Iface: "veth-" + ns + "-" + name,
			IPs: [][]netip.Addr{
				{netip.AddrFrom4([4]byte{10, 0, byte(c.r.IntN(2)), byte(c.r.IntN(4))})},
				{netip.AddrFrom4([4]byte{10, 0, byte(c.r.IntN(2)), byte(c.r.IntN(4))}), netip.AddrFrom16([16]byte{0: 0xfd, 14: byte(c.r.IntN(2)), 15: byte(c.r.IntN(4))})},
			}[c.r.IntN(2)]}
		return fmt.Sprintf("local pod %s at %s", key, c.local[key].IPs)
	case 8:
		// A new sandbox of the pod: its address changes, which stands in for
		// the pod's while the API shows none.
		if lp, ok := c.local[key]; ok {
			lp.IPs = []netip.Addr{netip.AddrFrom4([4]byte{10, 0, 2, byte(c.r.IntN(4))})}
			c.local[key] = lp
			return fmt.Sprintf("local pod %s at %s", key, lp.IPs)
		}
		return "none"
	case 9:
		// The mode annotation alone changes.
		np := c.pick(randPolicies...)
		if p := c.policies[ns+"/"+np]; p != nil {
			p = p.DeepCopy()
			c.setMode(p)
			c.policies[ns+"/"+np] = p
			return fmt.Sprintf("policy %s/%s annotations %v", ns, np, p.Annotations)
		}
		return "none"
	case 7:
		// The same content, a new object (a resync or a status update).
		if p := c.pods[key]; p != nil {
			c.pods[key] = p.DeepCopy()
			return "pod copied " + key
		}
		return "none"
	}
	return "none" // a resync: nothing changed
}

func (c *cluster) snapshot() (Snapshot, []LocalPod) {
	var s Snapshot
	for _, key := range slices.Sorted(maps.Keys(c.namespaces)) {
		s.Namespaces = append(s.Namespaces, c.namespaces[key])
	}
	for _, key := range slices.Sorted(maps.Keys(c.pods)) {
		s.Pods = append(s.Pods, c.pods[key])
	}
	for _, key := range slices.Sorted(maps.Keys(c.policies)) {
		s.Policies = append(s.Policies, c.policies[key])
	}
	for _, key := range slices.Sorted(maps.Keys(c.cnps)) {
		s.ClusterPolicies = append(s.ClusterPolicies, c.cnps[key])
	}
	for _, key := range slices.Sorted(maps.Keys(c.nodes)) {
		s.Nodes = append(s.Nodes, c.nodes[key])
	}
	var local []LocalPod
	for _, key := range slices.Sorted(maps.Keys(c.local)) {
		local = append(local, c.local[key])
	}
	// The watcher's order is its attachments', not sorted.
	c.r.Shuffle(len(local), func(i, j int) { local[i], local[j] = local[j], local[i] })
	return s, local
}

// Incremental compiles of random sequences of changes are always what a
// full compile of the same inputs is, and never write into a ruleset they
// returned before: the enforcer keeps the last one and takes the very
// same slices as unchanged without reading them.
func TestIncrementalIsCompile(t *testing.T) {
	const sequences, steps = 300, 60
	for seed := range uint64(sequences) {
		c := &cluster{r: rand.New(rand.NewPCG(seed, 31)), namespaces: map[string]*corev1.Namespace{},
			pods: map[string]*corev1.Pod{}, policies: map[string]*networkingv1.NetworkPolicy{}, local: map[string]LocalPod{},
			cnps: map[string]*ClusterNetworkPolicy{}, nodes: map[string]*corev1.Node{}}
		for _, ns := range randNamespaces {
			c.namespaces[ns] = c.namespace(ns)
			for _, name := range randPodNames[:3] {
				c.pods[ns+"/"+name] = c.pod(ns, name)
			}
		}
		var inc Incremental
		var history []string
		var last, lastCopy policy.Ruleset
		for step := range steps {
			history = append(history, c.change())
			s, local := c.snapshot()
			got, want := inc.Compile(s, local), Compile(s, local)
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("seed %d, step %d: incremental compile differs from a full one after\n  %s\ngot  %s\nwant %s",
					seed, step, strings.Join(history, "\n  "), describe(got), describe(want))
			}
			if !reflect.DeepEqual(last, lastCopy) {
				t.Fatalf("seed %d, step %d: the compile wrote into the ruleset it returned before, after\n  %s",
					seed, step, strings.Join(history, "\n  "))
			}
			for _, pol := range inc.last.policies {
				if pol.rules != nil && !slices.ContainsFunc(local, func(lp LocalPod) bool {
					return slices.Contains(inc.local[lp.key()].selectedBy, pol.key)
				}) {
					t.Fatalf("seed %d, step %d: policy %s keeps its resolved rules, but no local pod selects it", seed, step, pol.key)
				}
			}
			// A full compile shares nothing with got: a copy of it.
			last, lastCopy = got, Compile(s, local)
		}
	}
}

// describe renders rs for a failure (nil and empty lists print alike:
// DeepEqual tells them apart).
func describe(rs policy.Ruleset) string {
	var b strings.Builder
	tiers := func(d *policy.Direction) string {
		if d == nil {
			return ""
		}
		return fmt.Sprintf(" (cluster only %v, Admin %+v, Baseline %+v)", d.ClusterOnly, d.Admin, d.Baseline)
	}
	for _, p := range rs.Pods {
		fmt.Fprintf(&b, "\n    %s %s %s: ingress %s%s; egress %s%s; audited ingress %s; audited egress %s",
			p.Key, p.Iface, p.IPs, p.Ingress, tiers(p.Ingress), p.Egress, tiers(p.Egress), p.AuditIngress, p.AuditEgress)
	}
	return b.String()
}

// Each kind of change recompiles the local pods it can affect and no
// other: web's policy allows app=api pods of its namespace, db's the pods
// of team=b namespaces.
func TestIncrementalRecompilesOnlyAffected(t *testing.T) {
	webPolicy := func(p int) *networkingv1.NetworkPolicy {
		return netPolicy("w", networkingv1.NetworkPolicySpec{PodSelector: *labelsel("app", "web"),
			Ingress: []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{podPeer(labelsel("app", "api"))},
				Ports: []networkingv1.NetworkPolicyPort{port(protoTCP, num(p))}}}})
	}
	dbPolicy := netPolicy("d", networkingv1.NetworkPolicySpec{PodSelector: *labelsel("app", "db"),
		Ingress: []networkingv1.NetworkPolicyIngressRule{ingressFrom(nsPeer(labelsel("team", "b")))}})
	s := Snapshot{Namespaces: slices.Clone(namespaces), Pods: slices.Clone(pods), Policies: []*networkingv1.NetworkPolicy{dbPolicy, webPolicy(80)}}
	var inc Incremental
	last := inc.Compile(s, local)
	for _, step := range []struct {
		change     func()
		recompiled []string
	}{{
		change:     func() { s.Policies[1] = webPolicy(81) },
		recompiled: []string{webKey},
	}, {
		change:     func() { s.Namespaces[1] = namespace("other", map[string]string{"team": "c"}) },
		recompiled: []string{dbKey},
	}, {
		change: func() {
			i := slices.IndexFunc(s.Pods, func(p *corev1.Pod) bool { return p.Name == "api" })
			s.Pods[i] = with(s.Pods[i].DeepCopy(), func(p *corev1.Pod) { p.Labels = map[string]string{"app": "apix"} })
		},
		recompiled: []string{webKey},
	}, {
		change: func() {}, // a resync
	}} {
		step.change()
		rs := inc.Compile(s, local)
		if want := Compile(s, local); !reflect.DeepEqual(rs, want) {
			t.Fatalf("got %s\nwant %s", describe(rs), describe(want))
		}
		var recompiled []string
		for i, p := range rs.Pods {
			if p.Ingress != last.Pods[i].Ingress {
				recompiled = append(recompiled, p.Key)
			}
		}
		if !slices.Equal(recompiled, step.recompiled) {
			t.Errorf("recompiled %v, want %v", recompiled, step.recompiled)
		}
		last = rs
	}
}
