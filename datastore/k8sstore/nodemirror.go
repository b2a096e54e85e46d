package k8sstore

// The Kubernetes Node mirror: a slim cache of Nodes, and the pod CIDR
// copied into Node.spec.podCIDR(s) once a node gets its block.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
)

func slimNode(obj any) (any, error) {
	n, ok := obj.(*corev1.Node)
	if !ok {
		return obj, nil // a tombstone
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, UID: n.UID},
		Spec:       corev1.NodeSpec{PodCIDR: n.Spec.PodCIDR, PodCIDRs: n.Spec.PodCIDRs},
	}, nil
}

// nodeChanges signals a Node's arrival, departure and pod CIDR changes,
// not its status updates, which kubelets make all the time.
func nodeChanges(notify func()) cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc: func(any) { notify() },
		UpdateFunc: func(old, cur any) {
			o, ok1 := old.(*corev1.Node)
			c, ok2 := cur.(*corev1.Node)
			if !ok1 || !ok2 || o.Spec.PodCIDR != c.Spec.PodCIDR {
				notify()
			}
		},
		DeleteFunc: func(any) { notify() },
	}
}

// mirrorCIDR copies a node's block into its ONCNode (for kubectl get) and,
// once, into Node.spec.podCIDR(s), which Kubernetes never lets change.
func (s *Store) mirrorCIDR(ctx context.Context, node string, p netip.Prefix) error {
	if _, ok, _ := s.oncInf.GetStore().GetByKey(node); ok {
		var v any
		if p.IsValid() {
			v = p.String()
		}
		if err := s.patchONCNode(ctx, node, map[string]any{"spec": map[string]any{"podCIDR": v}}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	if !p.IsValid() || s.nodeInf == nil { // an agent's store claims nothing
		return nil
	}
	obj, ok, _ := s.nodeInf.GetStore().GetByKey(node)
	if !ok {
		return nil
	}
	switch have := obj.(*corev1.Node).Spec.PodCIDR; have {
	case p.String():
		return nil
	case "":
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"podCIDR": p.String(), "podCIDRs": []string{p.String()}}})
		_, err := s.kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("node %s: setting spec.podCIDR: %w", node, err)
		}
	default:
		slog.Warn("the Node already has another pod CIDR, which Kubernetes does not let change; ONC routes its pods by ONC's",
			"node", node, "node.spec.podCIDR", have, "onc", p)
	}
	return nil
}

// ClusterNodes lists the cluster's Nodes and the pod CIDR each carries.
func (s *Store) ClusterNodes(context.Context) (map[string]netip.Prefix, error) {
	if s.nodeInf == nil {
		return nil, errors.New("this store was opened for an agent, which does not follow the cluster's Nodes")
	}
	out := map[string]netip.Prefix{}
	for _, obj := range s.nodeInf.GetStore().List() {
		n := obj.(*corev1.Node)
		p, _ := netip.ParsePrefix(n.Spec.PodCIDR)
		out[n.Name] = p
	}
	return out, nil
}

// NodeGone reads the Node from the API server itself: the Node cache can
// lag behind an ONCNode created right after its Node.
func (s *Store) NodeGone(ctx context.Context, name string) (bool, error) {
	_, err := s.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get node %s: %w", name, err)
	}
	return false, nil
}
