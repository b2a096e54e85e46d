//go:build privileged

package k8sstore_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/k8sstore"
	"github.com/onc-net/onc/internal/kubeapiserver"
	authv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
)

// A node cannot redirect another node's traffic: the manifest's
// ValidatingAdmissionPolicy lets an agent write only its own node's ONCNode
// (the node claim of its token) and never a pod CIDR. Checked with a real
// token bound to a pod on the node, as a DaemonSet pod has, and with the
// impersonated claim the lab's agents use.
func agentWritesOnlyItsOwnONCNodeAndLease(t *testing.T, api *kubeapiserver.Server) {
	ctx := context.Background()
	spec := func(name string, i byte) datastore.NodeSpec {
		return datastore.NodeSpec{Name: name, IP: netip.AddrFrom4([4]byte{192, 0, 2, 100 + i}), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 1, i}}
	}
	agentOn := func(cfg *rest.Config) *k8sstore.Store {
		return openWith(t, k8sstore.Options{Config: cfg, Namespace: "onc-system", Agent: true})
	}
	forbidden := func(what string, err error, mentions string) {
		t.Helper()
		if !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), mentions) {
			t.Errorf("%s: err = %v; want Forbidden naming %q", what, err, mentions)
		}
	}

	// The token a DaemonSet pod on node vap-a gets: bound to the pod.
	kube := kubernetes.NewForConfigOrDie(api.RESTConfig())
	pod, err := kube.CoreV1().Pods("onc-system").Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "onc-agent-vap-a"},
		Spec: corev1.PodSpec{NodeName: "vap-a", ServiceAccountName: "onc-agent",
			Containers: []corev1.Container{{Name: "agent", Image: "onc:dev"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := kube.CoreV1().ServiceAccounts("onc-system").CreateToken(ctx, "onc-agent", &authv1.TokenRequest{
		Spec: authv1.TokenRequestSpec{BoundObjectRef: &authv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	podToken := rest.AnonymousClientConfig(api.RESTConfig())
	podToken.BearerToken = tok.Status.Token
	a := agentOn(podToken)

	if err := a.RegisterNode(ctx, spec("vap-a", 1)); err != nil {
		t.Fatalf("the agent on vap-a registering vap-a: %v", err)
	}
	if err := a.RegisterNode(ctx, spec("vap-a", 1)); err != nil {
		t.Fatalf("the agent on vap-a updating vap-a: %v", err)
	}
	b := agentOn(api.ServiceAccountOnNode(agentSA, "vap-b"))
	if err := b.RegisterNode(ctx, spec("vap-b", 2)); err != nil {
		t.Fatalf("the agent on vap-b registering vap-b: %v", err)
	}
	// vap-a's agent rewriting vap-b's tunnel endpoint (a patch), or making a
	// node that is not its own (a create).
	forbidden("the agent on vap-a patching vap-b", a.RegisterNode(ctx, spec("vap-b", 1)), "may write only ONCNode vap-a, not vap-b")
	forbidden("the agent on vap-a creating vap-c", a.RegisterNode(ctx, spec("vap-c", 3)), "not vap-c")
	// Nor pin its own peer key in vap-b's record: the peer API would take
	// vap-a for vap-b (agent/peer).
	pinned := spec("vap-b", 2)
	pinned.PeerPin = "LPJNul+wow4m6DsqxbninhsWHlwfp0JecwQzYpOLmCQ="
	forbidden("the agent on vap-a pinning its key in vap-b's record", a.RegisterNode(ctx, pinned), "may write only ONCNode vap-a, not vap-b")
	// A token without a node claim (not a pod's) writes nothing.
	forbidden("a token naming no node", agentOn(api.ServiceAccountConfig(agentSA)).RegisterNode(ctx, spec("vap-a", 1)), "names no node")

	// Its own ONCNode's pod CIDRs, either field, are the controller's to
	// write: an agent's IPv6 block in podCIDRs would draw another node's
	// IPv6 traffic as surely as its IPv4 one.
	oncnodes := dynamic.NewForConfigOrDie(podToken).Resource(k8sstore.ONCNodes)
	patch := func(c dynamic.ResourceInterface, spec string) error {
		_, err := c.Patch(ctx, "vap-a", types.MergePatchType, []byte(`{"spec":`+spec+`}`), metav1.PatchOptions{})
		return err
	}
	const both = `{"podCIDR":"10.244.77.0/24","podCIDRs":["10.244.77.0/24","fd00:10:244:77::/64"]}`
	forbidden("the agent setting its own pod CIDR", patch(oncnodes, `{"podCIDR":"10.244.77.0/24"}`), "may not set an ONCNode's pod CIDR")
	forbidden("the agent setting its own pod CIDRs", patch(oncnodes, `{"podCIDRs":["fd00:10:244:77::/64"]}`), "may not set an ONCNode's pod CIDR")
	forbidden("the agent setting both", patch(oncnodes, both), "may not set an ONCNode's pod CIDR")
	ctl := dynamic.NewForConfigOrDie(api.ServiceAccountConfig(controllerSA)).Resource(k8sstore.ONCNodes)
	if err := patch(ctl, both); err != nil {
		t.Fatalf("the controller setting pod CIDRs: %v", err)
	}
	// Once set, the agent's own updates, which leave them alone, still
	// pass; a change of one, or its removal, does not.
	if err := a.RegisterNode(ctx, spec("vap-a", 4)); err != nil {
		t.Fatalf("the agent on vap-a updating vap-a after its CIDRs were set: %v", err)
	}
	forbidden("the agent changing its IPv6 pod CIDR", patch(oncnodes, `{"podCIDRs":["10.244.77.0/24","fd00:10:244:78::/64"]}`), "may not set")
	forbidden("the agent removing its pod CIDRs", patch(oncnodes, `{"podCIDRs":null}`), "may not set")
	if n, err := a.Node(ctx, "vap-a"); err != nil || fmt.Sprint(n.PodCIDRs) != "[10.244.77.0/24 fd00:10:244:77::/64]" {
		t.Fatalf("vap-a after the refused writes: %+v, %v; want the controller's pod CIDRs", n, err)
	}
	// Nor may a node's agent create its record with pod CIDRs.
	d := api.ServiceAccountOnNode(agentSA, "vap-d")
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": k8sstore.Group + "/" + k8sstore.Version, "kind": "ONCNode",
		"metadata": map[string]any{"name": "vap-d"}, "spec": map[string]any{"nodeIP": "192.0.2.104", "podCIDRs": []any{"fd00:10:244:79::/64"}}}}
	_, err = dynamic.NewForConfigOrDie(d).Resource(k8sstore.ONCNodes).Create(ctx, u, metav1.CreateOptions{})
	forbidden("the agent on vap-d creating its record with pod CIDRs", err, "may not set")
	if n, err := b.Node(ctx, "vap-b"); err != nil || n.IP != spec("vap-b", 2).IP || n.PeerPin != "" {
		t.Fatalf("vap-b after the refused writes: %+v, %v; want its own endpoint", n, err)
	}

	// Liveness: its own Lease only, so it cannot make vap-b look dead (or
	// alive) either.
	leases := kubernetes.NewForConfigOrDie(podToken).CoordinationV1().Leases(k8sstore.DefaultLeaseNamespace)
	lease := func(node string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "onc-node-" + node}}
	}
	if _, err := leases.Create(ctx, lease("vap-a"), metav1.CreateOptions{}); err != nil {
		t.Fatalf("the agent on vap-a creating its Lease: %v", err)
	}
	if _, err := kube.CoordinationV1().Leases(k8sstore.DefaultLeaseNamespace).Create(ctx, lease("vap-b"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, err = leases.Create(ctx, lease("vap-c"), metav1.CreateOptions{})
	forbidden("the agent on vap-a creating vap-c's Lease", err, "may write only Lease onc-node-vap-a, not onc-node-vap-c")
	forbidden("the agent on vap-a deleting vap-b's Lease", leases.Delete(ctx, "onc-node-vap-b", metav1.DeleteOptions{}), "not onc-node-vap-b")
	b2, err := leases.Get(ctx, "onc-node-vap-b", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b2.Spec.HolderIdentity = ptr.To("vap-a")
	_, err = leases.Update(ctx, b2, metav1.UpdateOptions{})
	forbidden("the agent on vap-a renewing vap-b's Lease", err, "not onc-node-vap-b")
	if err := leases.Delete(ctx, "onc-node-vap-a", metav1.DeleteOptions{}); err != nil {
		t.Fatalf("the agent on vap-a deleting its Lease: %v", err)
	}
}
