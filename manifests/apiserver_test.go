//go:build privileged

package manifests

import (
	"context"
	"reflect"
	"testing"

	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"

	"github.com/onc-net/onc/internal/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/utils/ptr"
)

// The API server accepts the DaemonSet and the Deployment as written (a
// dry run: this API server has no kubelets). It rejects, for example, a
// Bidirectional mount in a container that is not privileged.
func TestWorkloadsPassTheAPIServer(t *testing.T) {
	api := testutil.KubeAPIServer(t, etcdtest.Embedded(t, "").ClientURL)
	ctx := context.Background()
	if err := Apply(ctx, api.RESTConfig(), NotWorkloads); err != nil {
		t.Fatal(err)
	}
	workloads := func(u *unstructured.Unstructured) bool { return !NotWorkloads(u) }
	opts := metav1.PatchOptions{FieldManager: "onc", Force: ptr.To(true), DryRun: []string{metav1.DryRunAll}}
	if err := apply(ctx, api.RESTConfig(), workloads, opts); err != nil {
		t.Fatal(err)
	}
	clusterNetworkPolicies(t, ctx, dynamic.NewForConfigOrDie(api.RESTConfig()))
}

// The ClusterNetworkPolicy CRD applied with the rest is served: a policy
// written as v1beta1 (as the conformance suite writes them) reads back as
// v1alpha2 (what the agent watches) with its experimental fields, which a
// standard-channel CRD would prune; and its validation holds (a range
// whose start is not below its end is refused).
func clusterNetworkPolicies(t *testing.T, ctx context.Context, dyn dynamic.Interface) {
	gvr := func(v string) schema.GroupVersionResource {
		return schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: v, Resource: "clusternetworkpolicies"}
	}
	cnp := func(name string, ports map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "policy.networking.k8s.io/v1beta1", "kind": "ClusterNetworkPolicy", "metadata": map[string]any{"name": name},
			"spec": map[string]any{"tier": "Admin", "priority": int64(10), "subject": map[string]any{"namespaces": map[string]any{}},
				"egress": []any{
					map[string]any{"action": "Deny", "to": []any{map[string]any{"nodes": map[string]any{"matchLabels": map[string]any{"role": "db"}}}}},
					map[string]any{"action": "Accept", "to": []any{map[string]any{"pods": map[string]any{"namespaceSelector": map[string]any{}, "podSelector": map[string]any{}}}},
						"protocols": []any{map[string]any{"destinationNamedPort": "http"}, map[string]any{"tcp": map[string]any{"destinationPort": ports}}}},
				}}}}
	}
	if _, err := dyn.Resource(gvr("v1beta1")).Create(ctx, cnp("good", map[string]any{"range": map[string]any{"start": int64(80), "end": int64(90)}}), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := dyn.Resource(gvr("v1alpha2")).Get(ctx, "good", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	egress, _, _ := unstructured.NestedSlice(got.Object, "spec", "egress")
	if got.GetAPIVersion() != "policy.networking.k8s.io/v1alpha2" || len(egress) != 2 ||
		!reflect.DeepEqual(egress[0].(map[string]any)["to"], []any{map[string]any{"nodes": map[string]any{"matchLabels": map[string]any{"role": "db"}}}}) ||
		!reflect.DeepEqual(egress[1].(map[string]any)["protocols"].([]any)[0], map[string]any{"destinationNamedPort": "http"}) {
		t.Errorf("read back as %s: egress %v, want the nodes peer and the named port kept", got.GetAPIVersion(), egress)
	}
	bad := cnp("bad", map[string]any{"range": map[string]any{"start": int64(90), "end": int64(80)}})
	bad.SetAPIVersion("policy.networking.k8s.io/v1alpha2")
	_, err = dyn.Resource(gvr("v1alpha2")).Create(ctx, bad, metav1.CreateOptions{})
	if !apierrors.IsInvalid(err) {
		t.Errorf("a range 90-80: %v, want refused as invalid", err)
	}
}
