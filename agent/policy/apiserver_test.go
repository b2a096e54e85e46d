//go:build privileged

package policy

import (
	"context"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/manifests"
)

// The inputs against a real kube-apiserver, as the agent with the RBAC the
// manifest gives it: without the ClusterNetworkPolicy CRD NetworkPolicy's
// inputs start all the same; once the CRD is applied the agent finds it
// and watches the policies, written as v1beta1, read as v1alpha2, trimmed,
// signalling a change of spec and not one of status; nodes come with their
// labels and internal and external addresses. The agent cannot write a
// ClusterNetworkPolicy.
func TestInputsAgainstTheAPIServer(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	ctx := context.Background()
	admin := api.RESTConfig()
	kube := kubernetes.NewForConfigOrDie(admin)
	isCRD := func(u *unstructured.Unstructured) bool {
		return u.GetKind() == "CustomResourceDefinition" && u.GetName() == CNPResource+"."+CNPGroupVersion.Group
	}
	if err := manifests.Apply(ctx, admin, func(u *unstructured.Unstructured) bool { return manifests.NotWorkloads(u) && !isCRD(u) }); err != nil {
		t.Fatal(err)
	}
	n1, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Labels: map[string]string{"role": "db"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n1.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeHostName, Address: "n1"}, {Type: corev1.NodeInternalIP, Address: "192.0.2.1"},
		{Type: corev1.NodeExternalIP, Address: "2001:db8::1"}}
	if _, err := kube.CoreV1().Nodes().UpdateStatus(ctx, n1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	defer func(d time.Duration) { CNPRetry = d }(CNPRetry)
	CNPRetry = 100 * time.Millisecond
	agent := api.ServiceAccountConfig("onc-system:onc-agent")
	in, err := Watch(ctx, agent)
	if err != nil {
		t.Fatalf("without the ClusterNetworkPolicy CRD: %v", err)
	}
	defer in.Close()
	var signals atomic.Int64
	in.OnChange(func() { signals.Add(1) })
	testutil.WaitFor(t, "node n1 with its addresses", 10*time.Second, func() bool {
		n := in.Snapshot().Nodes
		return len(n) == 1 && len(n[0].Status.Addresses) > 0
	})
	snap := in.Snapshot()
	if n := snap.Nodes[0]; n.Name != "n1" || !reflect.DeepEqual(n.Labels, map[string]string{"role": "db"}) ||
		!reflect.DeepEqual(n.Status.Addresses, []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "192.0.2.1"}, {Type: corev1.NodeExternalIP, Address: "2001:db8::1"}}) {
		t.Errorf("node in the cache: %+v, want n1's labels and its internal and external addresses", n)
	}
	if snap.ClusterPolicies != nil {
		t.Errorf("cluster policies %v without their CRD", snap.ClusterPolicies)
	}

	if err := manifests.Apply(ctx, admin, isCRD); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(admin)
	cnps := dyn.Resource(CNPGroupVersion.WithResource(CNPResource))
	schemaV1beta1 := schema.GroupVersionResource{Group: CNPGroupVersion.Group, Version: "v1beta1", Resource: CNPResource}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": CNPGroupVersion.Group + "/v1beta1", "kind": "ClusterNetworkPolicy",
		"metadata": map[string]any{"name": "deny-db", "labels": map[string]any{"a": "b"}},
		"spec": map[string]any{"tier": "Admin", "priority": int64(3), "subject": map[string]any{"namespaces": map[string]any{}},
			"egress": []any{map[string]any{"name": "db", "action": "Deny", "to": []any{map[string]any{"nodes": map[string]any{"matchLabels": map[string]any{"role": "db"}}}},
				"protocols": []any{map[string]any{"tcp": map[string]any{"destinationPort": map[string]any{"number": int64(5432)}}}}}}}}}
	before := signals.Load()
	if _, err := dyn.Resource(schemaV1beta1).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the ClusterNetworkPolicy", 20*time.Second, func() bool { return len(in.Snapshot().ClusterPolicies) == 1 })
	if signals.Load() == before {
		t.Error("no signal for a new ClusterNetworkPolicy")
	}
	got := in.Snapshot().ClusterPolicies[0]
	want := &ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-db", ResourceVersion: got.ResourceVersion, Generation: 1},
		Spec: CNPSpec{Tier: "Admin", Priority: 3, Subject: CNPSubject{Namespaces: &metav1.LabelSelector{}},
			Egress: []CNPEgressRule{{Name: "db", Action: "Deny", To: []CNPEgressPeer{{Nodes: &metav1.LabelSelector{MatchLabels: map[string]string{"role": "db"}}}},
				Protocols: []CNPProtocol{{TCP: &CNPProtocolPort{DestinationPort: &CNPPort{Number: 5432}}}}}}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cluster policy in the cache:\n%+v\nwant\n%+v", got, want)
	}

	// A status update signals nothing; the spec change after it does, once.
	before = signals.Load()
	cur, err := cnps.Get(ctx, "deny-db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(cur.Object, []any{map[string]any{"type": "Ready", "status": "True", "reason": "Test",
		"message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"}}, "status", "conditions"); err != nil {
		t.Fatal(err)
	}
	if _, err := cnps.UpdateStatus(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	cur, err = cnps.Get(ctx, "deny-db", metav1.GetOptions{})
	if err == nil {
		err = unstructured.SetNestedField(cur.Object, int64(4), "spec", "priority")
	}
	if err == nil {
		_, err = cnps.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "priority 4", 10*time.Second, func() bool {
		p := in.Snapshot().ClusterPolicies
		return len(p) == 1 && p[0].Spec.Priority == 4
	})
	time.Sleep(200 * time.Millisecond)
	if n := signals.Load() - before; n != 1 {
		t.Errorf("%d signals for a status update and a spec update; want 1", n)
	}

	// The agent reads ClusterNetworkPolicies and writes none.
	_, err = dynamic.NewForConfigOrDie(agent).Resource(schemaV1beta1).Create(ctx, obj, metav1.CreateOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("the agent creates a ClusterNetworkPolicy: %v, want forbidden", err)
	}
}
