package policy

import (
	"reflect"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/onc-net/onc/agent/kubeinformer"
)

// The caches keep exactly what the compiler reads.
func TestTrim(t *testing.T) {
	meta := metav1.ObjectMeta{Namespace: "app", Name: "web", ResourceVersion: "7", Labels: map[string]string{"app": "web"},
		Annotations: map[string]string{"big": "blob"}, UID: "u"}
	full := &corev1.Pod{ObjectMeta: meta,
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true, ServiceAccountName: "sa",
			Containers: []corev1.Container{{Name: "c", Image: "i", Ports: []corev1.ContainerPort{
				{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP, HostPort: 80}}}, {Name: "sidecar"}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}, HostIP: "192.168.0.1"}}
	want := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", ResourceVersion: "7", Labels: map[string]string{"app": "web"}},
		Spec: corev1.PodSpec{NodeName: "n1", HostNetwork: true,
			Containers: []corev1.Container{{Ports: []corev1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}}, {}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1", PodIPs: []corev1.PodIP{{IP: "10.0.0.1"}}}}
	if got := trimPod(full); !reflect.DeepEqual(got, want) {
		t.Errorf("pod:\n got %+v\nwant %+v", got, want)
	}

	ns := trimNamespace(&corev1.Namespace{ObjectMeta: meta, Spec: corev1.NamespaceSpec{Finalizers: []corev1.FinalizerName{"f"}}})
	if want := (&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "web", ResourceVersion: "7", Labels: meta.Labels}}); !reflect.DeepEqual(ns, want) {
		t.Errorf("namespace: got %+v", ns)
	}

	spec := networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: meta.Labels},
		Ingress: []networkingv1.NetworkPolicyIngressRule{{}}, PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}
	np := trimPolicy(&networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: spec})
	if want := (&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", ResourceVersion: "7"}, Spec: spec}); !reflect.DeepEqual(np, want) {
		t.Errorf("policy: got %+v", np)
	}
	// Of a policy's annotations, the mode alone.
	audited := meta
	audited.Annotations = map[string]string{"big": "blob", ModeAnnotation: "audit"}
	np = trimPolicy(&networkingv1.NetworkPolicy{ObjectMeta: audited, Spec: spec})
	if want := (&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "web", ResourceVersion: "7",
		Annotations: map[string]string{ModeAnnotation: "audit"}}, Spec: spec}); !reflect.DeepEqual(np, want) {
		t.Errorf("audited policy: got %+v", np)
	}

	// Of a node, its labels and its internal and external addresses.
	n := trimNode(&corev1.Node{ObjectMeta: meta, Spec: corev1.NodeSpec{PodCIDR: "10.0.0.0/24"}, Status: corev1.NodeStatus{
		Addresses: []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalIP, Address: "192.168.0.1"},
			{Type: corev1.NodeExternalIP, Address: "2001:db8::1"}, {Type: corev1.NodeInternalDNS, Address: "n1.local"}},
		Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}})
	if want := (&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "web", ResourceVersion: "7", Labels: meta.Labels},
		Status: corev1.NodeStatus{Addresses: []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.168.0.1"},
			{Type: corev1.NodeExternalIP, Address: "2001:db8::1"}}}}); !reflect.DeepEqual(n, want) {
		t.Errorf("node: got %+v", n)
	}

	// Of a ClusterNetworkPolicy, its spec and generation.
	cnpSpec := CNPSpec{Tier: "Admin", Priority: 1, Subject: CNPSubject{Namespaces: &metav1.LabelSelector{}}}
	withGen := meta
	withGen.Generation = 3
	if got, want := trimCNP(&ClusterNetworkPolicy{ObjectMeta: withGen, Spec: cnpSpec}),
		(&ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "web", ResourceVersion: "7", Generation: 3}, Spec: cnpSpec}); !reflect.DeepEqual(got, want) {
		t.Errorf("cluster policy: got %+v", got)
	}

	// Tombstones pass through.
	if got, _ := kubeinformer.Trim(trimPod)("tombstone"); got != "tombstone" {
		t.Errorf("tombstone: got %v", got)
	}
}

// Updates that change nothing the compiler reads do not signal.
func TestSameButVersion(t *testing.T) {
	pod := func(rv, ip string, labels map[string]string, cond corev1.ConditionStatus) any {
		return trimPod(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p", ResourceVersion: rv, Labels: labels},
			Status: corev1.PodStatus{PodIPs: []corev1.PodIP{{IP: ip}}, Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: cond}}}})
	}
	web := map[string]string{"app": "web"}
	base := pod("1", "10.0.0.1", web, corev1.ConditionFalse)
	for _, tc := range []struct {
		name string
		cur  any
		same bool
	}{
		{"readiness flips", pod("2", "10.0.0.1", web, corev1.ConditionTrue), true},
		{"resync", pod("1", "10.0.0.1", web, corev1.ConditionFalse), true},
		{"new address", pod("2", "10.0.0.2", web, corev1.ConditionFalse), false},
		{"new labels", pod("2", "10.0.0.1", map[string]string{"app": "db"}, corev1.ConditionFalse), false},
	} {
		if got := kubeinformer.SameButVersion(base, tc.cur); got != tc.same {
			t.Errorf("%s: SameButVersion = %v, want %v", tc.name, got, tc.same)
		}
	}

	// A policy's mode annotation changing alone is a change.
	policy := func(rv string, annotations map[string]string) any {
		return trimPolicy(&networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "a", Name: "p", ResourceVersion: rv, Annotations: annotations}})
	}
	enforced := policy("1", map[string]string{"note": "x"})
	if kubeinformer.SameButVersion(enforced, policy("2", map[string]string{"note": "x", ModeAnnotation: "audit"})) {
		t.Error("a policy's mode set to audit: SameButVersion, want a change")
	}
	if !kubeinformer.SameButVersion(enforced, policy("2", map[string]string{"note": "y"})) {
		t.Error("another annotation of a policy changed: a change, want SameButVersion")
	}

	// A ClusterNetworkPolicy's status update is none; a spec update is one.
	cnp := func(rv string, priority int32, status string) any {
		p := &ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "c", ResourceVersion: rv, Generation: int64(priority),
			Annotations: map[string]string{"status": status}},
			Spec: CNPSpec{Tier: "Admin", Priority: priority, Subject: CNPSubject{Pods: &CNPNamespacedPod{}},
				Egress: []CNPEgressRule{{Action: "Deny", To: []CNPEgressPeer{{Networks: []string{"10.0.0.0/8"}}},
					Protocols: []CNPProtocol{{TCP: &CNPProtocolPort{DestinationPort: &CNPPort{Range: &CNPPortRange{Start: 1, End: 2}}}}}}}}}
		return trimCNP(p)
	}
	if !kubeinformer.SameButVersion(cnp("1", 1, "a"), cnp("2", 1, "b")) {
		t.Error("a cluster policy's status changed: a change, want SameButVersion")
	}
	if kubeinformer.SameButVersion(cnp("1", 1, "a"), cnp("2", 2, "a")) {
		t.Error("a cluster policy's priority changed: SameButVersion, want a change")
	}
}
