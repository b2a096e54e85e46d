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
	"sync"

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

// mirrorWorkers is how many nodes' mirror writes a batch has in flight.
// The client's rate limit (--kube-api-qps) sets the pace; the workers only
// keep enough requests waiting on the API server to reach it: at 300
// requests/s and some 50 ms per request under load, 15 in flight. As
// kube-controller-manager's node IPAM, which writes Node.spec.podCIDR
// with 30 workers.
const mirrorWorkers = 32

// mirrorCIDRs mirrors every node's block (mirrorCIDR), mirrorWorkers at a
// time, then waits until the caches show every write: once for the batch,
// not after each write, so that no worker idles while a watch delivers.
// A failed mirror leaves the ledger as it is: the controller's next
// reconcile sees the record differ and writes it again.
func (s *Store) mirrorCIDRs(ctx context.Context, blocks map[string]netip.Prefix) error {
	var (
		mu     sync.Mutex
		waits  []cacheWait
		failed int
		first  error
	)
	work := make(chan string)
	var wg sync.WaitGroup
	for range min(mirrorWorkers, len(blocks)) {
		wg.Go(func() {
			for node := range work {
				w, err := s.mirrorCIDR(ctx, node, blocks[node])
				mu.Lock()
				waits = append(waits, w...)
				if err != nil {
					if failed++; first == nil {
						first = err
					}
				}
				mu.Unlock()
			}
		})
	}
	for node := range blocks {
		work <- node
	}
	close(work)
	wg.Wait()
	err := s.awaitAll(ctx, waits)
	if failed > 0 {
		return errors.Join(fmt.Errorf("copying the pod CIDR of %d of %d nodes to their records failed; the first: %w", failed, len(blocks), first), err)
	}
	return err
}

// mirrorCIDR copies a node's block into its ONCNode (what agents read)
// unless it is there already, and, once, into Node.spec.podCIDR(s), which
// Kubernetes never lets change. It returns what the caches must show for
// the caller to read its writes.
func (s *Store) mirrorCIDR(ctx context.Context, node string, p netip.Prefix) ([]cacheWait, error) {
	var waits []cacheWait
	if obj, ok, _ := s.oncInf.GetStore().GetByKey(node); ok {
		n, err := cachedONCNode(obj)
		if err != nil {
			return nil, err
		}
		want, patch := "", map[string]any{"podCIDR": nil} // null removes the copy
		if p.IsValid() {
			want, patch["podCIDR"] = p.String(), p.String()
		}
		if n.Spec.PodCIDR != want {
			rv, err := s.patchONCNode(ctx, node, map[string]any{"spec": patch})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return nil, err
			default:
				waits = append(waits, cacheWait{s.oncInf, node, rv})
			}
		}
	}
	if !p.IsValid() || s.nodeInf == nil { // an agent's store claims nothing
		return waits, nil
	}
	obj, ok, _ := s.nodeInf.GetStore().GetByKey(node)
	if !ok {
		return waits, nil
	}
	switch have := obj.(*corev1.Node).Spec.PodCIDR; have {
	case p.String():
	case "":
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"podCIDR": p.String(), "podCIDRs": []string{p.String()}}})
		n, err := s.kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return waits, fmt.Errorf("node %s: setting spec.podCIDR: %w", node, err)
		default: // the controller claims again for a Node its cache shows without
			waits = append(waits, cacheWait{s.nodeInf, node, n.ResourceVersion})
		}
	default:
		slog.Warn("the Node already has another pod CIDR, which Kubernetes does not let change; ONC routes its pods by ONC's",
			"node", node, "node.spec.podCIDR", have, "onc", p)
	}
	return waits, nil
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
