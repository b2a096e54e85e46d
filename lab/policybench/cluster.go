// Package policybench measures ONC's NetworkPolicy and
// ClusterNetworkPolicy (docs/policy.md), the benchmark issues 11 and 30
// ask for, not a timed test:
//
//   - programming: how long the agent's compiler (agent/policy) and the
//     enforcer (datapath/policy) take to program a node, first in full and
//     then for a change of one policy (and of one cluster policy), and
//     what that holds in memory, for synthetic clusters of 100, 1,000 and
//     5,000 pods × 10, 100 and 1,000 policies × none or 1,000 cluster
//     policies, each in a throwaway network namespace;
//   - TCP_CRR through a 2-node lab in Kubernetes mode, with no policy
//     versus 1,000 policies and 1,000 cluster policies selecting both
//     ends, measured in interleaved runs so that the ratio holds on a
//     shared machine.
package policybench

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"

	"github.com/onc-net/onc/agent/policy"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The synthetic cluster's shape.
const (
	// ClusterNamespaces is how many namespaces the pods and policies are
	// spread over.
	ClusterNamespaces = 10
	// ClusterApps is how many values the pods' app label takes.
	ClusterApps = 20
	// MaxLocalPods is how many pods the node under test holds at most:
	// kubelet's default max-pods, a full node.
	MaxLocalPods = 110
)

var tiers = []string{"web", "api", "db"}

// Cluster is a synthetic cluster as the agent's informers would hold it
// (only what the compiler reads), and the pods of the node under test.
type Cluster struct {
	Snapshot policy.Snapshot
	Local    []policy.LocalPod
}

// NewCluster makes a cluster of pods pods and policies policies; the node
// under test holds the first min(pods, MaxLocalPods) pods, which are spread
// over every namespace and app.
//
// Pod i is p-i in namespace ns-(i mod 10), labelled app=a(i mod 20) and
// tier=web|api|db, with the named container ports http (TCP 8080-8083,
// depending on the app, so named ports resolve differently on different
// pods), metrics (TCP 9090) and, on api pods, dns (UDP 53). Namespace k is
// labelled team=t(k mod 3) and env=prod|dev. Policy j is np-j in namespace
// ns-(j mod 10) and, but for shape 7 (every pod of its namespace), selects
// app=a(j mod 20): the pods of one app, 1 in 20. Its shape is j mod 8:
//
//	0 ingress from podSelector app (another app of its namespace), TCP 80
//	1 ingress from namespaceSelector team, named port http
//	2 ingress from namespaceSelector env + podSelector tier, TCP 8000-8100 (endPort)
//	3 ingress from ipBlock 10.244.0.0/16 except a /24 (holding pod IPs) and a 192.168 /24, TCP 443
//	4 egress to podSelector tier=db TCP 5432, and to every namespace's api pods on named port dns (UDP)
//	5 egress to the internet: ipBlock 0.0.0.0/0 except the private ranges; selector app + tier In (web, api)
//	6 ingress from tier In (web, api) on named port metrics, egress to env NotIn (dev) on TCP 8080-8090
//	7 ingress from a /24 of its own in 172.16.0.0/12, TCP and UDP on one port; selects the whole namespace
func NewCluster(pods, policies int) Cluster {
	var c Cluster
	for k := 0; k < ClusterNamespaces; k++ {
		env := "prod"
		if k%2 == 1 {
			env = "dev"
		}
		name := fmt.Sprintf("ns-%d", k)
		c.Snapshot.Namespaces = append(c.Snapshot.Namespaces, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name,
			Labels: map[string]string{"kubernetes.io/metadata.name": name, "team": fmt.Sprintf("t%d", k%3), "env": env}}})
	}
	local := min(pods, MaxLocalPods)
	for i := 0; i < pods; i++ {
		p := synthPod(i, local)
		c.Snapshot.Pods = append(c.Snapshot.Pods, p)
		if i < local {
			c.Local = append(c.Local, policy.LocalPod{Namespace: p.Namespace, Name: p.Name,
				Iface: fmt.Sprintf("lxc%05d", i), IPs: []netip.Addr{netip.MustParseAddr(p.Status.PodIP)}})
		}
	}
	for j := 0; j < policies; j++ {
		c.Snapshot.Policies = append(c.Snapshot.Policies, synthPolicy(j))
	}
	return c
}

// podIP of pod i: 250 pods per /24 of 10.244.0.0/16 (the node under test
// has 10.244.0.0/24).
func podIP(i int) string { return fmt.Sprintf("10.244.%d.%d", i/250, i%250+2) }

func synthPod(i, local int) *corev1.Pod {
	app := i % ClusterApps
	tier := tiers[i%len(tiers)]
	ports := []corev1.ContainerPort{
		{Name: "http", ContainerPort: int32(8080 + app%4), Protocol: corev1.ProtocolTCP},
		{Name: "metrics", ContainerPort: 9090, Protocol: corev1.ProtocolTCP},
	}
	if tier == "api" {
		ports = append(ports, corev1.ContainerPort{Name: "dns", ContainerPort: 53, Protocol: corev1.ProtocolUDP})
	}
	node := "node-0"
	if i >= local {
		node = fmt.Sprintf("node-%d", 1+(i-local)/MaxLocalPods)
	}
	ip := podIP(i)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%d", i), Namespace: fmt.Sprintf("ns-%d", i%ClusterNamespaces),
			Labels: map[string]string{"app": fmt.Sprintf("a%d", app), "tier": tier}},
		Spec:   corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Ports: ports}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}},
	}
}

func labels(kv ...string) *metav1.LabelSelector {
	s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
	for i := 0; i+1 < len(kv); i += 2 {
		s.MatchLabels[kv[i]] = kv[i+1]
	}
	return s
}

func tcp(port int) networkingv1.NetworkPolicyPort {
	return npPort(corev1.ProtocolTCP, intstr.FromInt32(int32(port)), 0)
}

func npPort(proto corev1.Protocol, port intstr.IntOrString, end int32) networkingv1.NetworkPolicyPort {
	p := networkingv1.NetworkPolicyPort{Protocol: &proto, Port: &port}
	if end != 0 {
		p.EndPort = &end
	}
	return p
}

var (
	ingressOnly = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}
	egressOnly  = []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}
	bothWays    = []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}
	webOrAPI    = metav1.LabelSelectorRequirement{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "api"}}
)

func synthPolicy(j int) *networkingv1.NetworkPolicy {
	app := fmt.Sprintf("a%d", j%ClusterApps)
	np := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("np-%d", j), Namespace: fmt.Sprintf("ns-%d", j%ClusterNamespaces)}}
	s := &np.Spec
	s.PodSelector = *labels("app", app)
	switch j % 8 {
	case 0:
		s.PolicyTypes = ingressOnly
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: labels("app", fmt.Sprintf("a%d", (j+10)%ClusterApps))}},
			Ports: []networkingv1.NetworkPolicyPort{tcp(80)},
		}}
	case 1:
		s.PolicyTypes = ingressOnly
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labels("team", fmt.Sprintf("t%d", j%3))}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromString("http"), 0)},
		}}
	case 2:
		s.PolicyTypes = ingressOnly
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{NamespaceSelector: labels("env", "prod"), PodSelector: labels("tier", tiers[j%3])}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromInt32(8000), 8100)},
		}}
	case 3:
		s.PolicyTypes = ingressOnly
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{
				{IPBlock: &networkingv1.IPBlock{CIDR: "10.244.0.0/16", Except: []string{fmt.Sprintf("10.244.%d.0/24", j%20)}}},
				{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("192.168.%d.0/24", j%256)}},
			},
			Ports: []networkingv1.NetworkPolicyPort{tcp(443)},
		}}
	case 4:
		s.PolicyTypes = egressOnly
		s.Egress = []networkingv1.NetworkPolicyEgressRule{
			{To: []networkingv1.NetworkPolicyPeer{{PodSelector: labels("tier", "db")}}, Ports: []networkingv1.NetworkPolicyPort{tcp(5432)}},
			{To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{}, PodSelector: labels("tier", "api")}},
				Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolUDP, intstr.FromString("dns"), 0)}},
		}
	case 5:
		s.PolicyTypes = egressOnly
		s.PodSelector.MatchExpressions = []metav1.LabelSelectorRequirement{webOrAPI}
		s.Egress = []networkingv1.NetworkPolicyEgressRule{{To: []networkingv1.NetworkPolicyPeer{
			{IPBlock: &networkingv1.IPBlock{CIDR: "0.0.0.0/0", Except: []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"}}},
		}}}
	case 6:
		s.PolicyTypes = bothWays
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{webOrAPI}}}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromString("metrics"), 0)},
		}}
		s.Egress = []networkingv1.NetworkPolicyEgressRule{{
			To: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "env", Operator: metav1.LabelSelectorOpNotIn, Values: []string{"dev"}}}}}},
			Ports: []networkingv1.NetworkPolicyPort{npPort(corev1.ProtocolTCP, intstr.FromInt32(8080), 8090)},
		}}
	case 7:
		s.PodSelector = metav1.LabelSelector{}
		s.PolicyTypes = ingressOnly
		port := intstr.FromInt32(int32(1000 + j%5000))
		s.Ingress = []networkingv1.NetworkPolicyIngressRule{{
			From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: fmt.Sprintf("172.%d.%d.0/24", 16+(j/256)%16, j%256)}}},
			Ports: []networkingv1.NetworkPolicyPort{
				npPort(corev1.ProtocolTCP, port, 0), npPort(corev1.ProtocolUDP, port, 0)},
		}}
	}
	return np
}

// Changed returns np-0 (shape 0) as the change the benchmark times: its
// peers become the pods of app=a0 instead of a10 (both in its namespace)
// and it allows TCP 8443 besides 80. It changes the rules of the local
// pods np-0 selects (app=a0), about 1 in 20.
func Changed(c Cluster) *networkingv1.NetworkPolicy {
	np := c.Snapshot.Policies[0].DeepCopy()
	np.Spec.Ingress[0].From[0].PodSelector = labels("app", "a0")
	np.Spec.Ingress[0].Ports = append(np.Spec.Ingress[0].Ports, tcp(8443))
	return np
}

// AddClusterPolicies adds n ClusterNetworkPolicies. Policy j is cnp-j, of
// priority j mod 1000 (the API's range; names order the equal ones); its
// shape is j mod 4, and k = j / 4 its place among its shape's:
//
//	0 Admin, subject the namespaces of team t(k mod 3): Deny ingress from
//	  the env=dev namespaces on TCP port 1000+j (a port of its own)
//	1 Admin, subject app=a(k mod 20) in every namespace: Accept egress to
//	  the network 10.(k mod 256).0.0/16 on TCP 443 and 8000-8999
//	2 Baseline, subject namespace ns-(k mod 10): Deny ingress from app
//	  a(k mod 20) in every namespace
//	3 Admin, subject the namespaces of team t(k mod 3): Pass ingress from
//	  the namespaces of the next team on TCP 8080, to NetworkPolicy
//
// So a pod is the subject of about a fifth of them: a third of shapes 0
// and 3, a twentieth of 1, a tenth of 2.
func (c *Cluster) AddClusterPolicies(n int) {
	for j := 0; j < n; j++ {
		c.Snapshot.ClusterPolicies = append(c.Snapshot.ClusterPolicies, synthClusterPolicy(j))
	}
	slices.SortFunc(c.Snapshot.ClusterPolicies, func(a, b *policy.ClusterNetworkPolicy) int { return cmp.Compare(a.Name, b.Name) })
}

func synthClusterPolicy(j int) *policy.ClusterNetworkPolicy {
	team := func(k int) *metav1.LabelSelector { return labels("team", fmt.Sprintf("t%d", k%3)) }
	anyPodOf := func(app string) *policy.CNPNamespacedPod {
		return &policy.CNPNamespacedPod{PodSelector: *labels("app", app)}
	}
	cnp := &policy.ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cnp-%d", j)}}
	s := &cnp.Spec
	s.Tier, s.Priority = "Admin", int32(j%1000)
	k := j / 4
	switch j % 4 {
	case 0:
		s.Subject.Namespaces = team(k)
		s.Ingress = []policy.CNPIngressRule{{Action: "Deny", From: []policy.CNPIngressPeer{{Namespaces: labels("env", "dev")}},
			Protocols: tcpPorts(policy.CNPPort{Number: int32(1000 + j)})}}
	case 1:
		s.Subject.Pods = anyPodOf(fmt.Sprintf("a%d", k%ClusterApps))
		s.Egress = []policy.CNPEgressRule{{Action: "Accept", To: []policy.CNPEgressPeer{{Networks: []string{fmt.Sprintf("10.%d.0.0/16", k%256)}}},
			Protocols: tcpPorts(policy.CNPPort{Number: 443}, policy.CNPPort{Range: &policy.CNPPortRange{Start: 8000, End: 8999}})}}
	case 2:
		s.Tier = "Baseline"
		s.Subject.Namespaces = labels("kubernetes.io/metadata.name", fmt.Sprintf("ns-%d", k%ClusterNamespaces))
		s.Ingress = []policy.CNPIngressRule{{Action: "Deny", From: []policy.CNPIngressPeer{{Pods: anyPodOf(fmt.Sprintf("a%d", k%ClusterApps))}}}}
	case 3:
		s.Subject.Namespaces = team(k)
		s.Ingress = []policy.CNPIngressRule{{Action: "Pass", From: []policy.CNPIngressPeer{{Namespaces: team(k + 1)}},
			Protocols: tcpPorts(policy.CNPPort{Number: 8080})}}
	}
	return cnp
}

// ChangedClusterPolicy returns cnp-0 (shape 0) changed as the benchmark
// times it: it accepts what it denied, the env=dev namespaces on its
// port, and TCP 2000 besides, over the NetworkPolicies that isolate its
// subjects: the pods of team t0's four namespaces, two fifths of them.
func ChangedClusterPolicy(c Cluster) *policy.ClusterNetworkPolicy {
	i := slices.IndexFunc(c.Snapshot.ClusterPolicies, func(p *policy.ClusterNetworkPolicy) bool { return p.Name == "cnp-0" })
	cnp := *c.Snapshot.ClusterPolicies[i]
	rule := cnp.Spec.Ingress[0]
	rule.Action = "Accept"
	rule.Protocols = append(slices.Clone(rule.Protocols), tcpPorts(policy.CNPPort{Number: 2000})...)
	cnp.Spec.Ingress = []policy.CNPIngressRule{rule}
	return &cnp
}

// tcpPorts is a ClusterNetworkPolicy rule's protocols: TCP on each port.
func tcpPorts(ports ...policy.CNPPort) []policy.CNPProtocol {
	var out []policy.CNPProtocol
	for _, p := range ports {
		out = append(out, policy.CNPProtocol{TCP: &policy.CNPProtocolPort{DestinationPort: &p}})
	}
	return out
}
