package k8sstore

// The mirrors of the ledgers: each node's blocks copied into its ONCNode,
// and into Node.spec.podCIDR(s) once the node has a block of every pool;
// a slim cache of Nodes.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sync"

	"github.com/onc-net/onc/datastore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
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

// mirrorCIDRs mirrors every node's block of family f (mirrorCIDR),
// mirrorWorkers at a time, then waits until the caches show every write:
// once for the batch, not after each write, so that no worker idles while
// a watch delivers. A failed mirror leaves the ledger as it is: the
// controller's next reconcile sees the record differ and writes it again.
func (s *Store) mirrorCIDRs(ctx context.Context, f datastore.Family, blocks map[string]netip.Prefix) error {
	cfg, err := s.ClusterConfig(ctx)
	if err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return err
	}
	var held map[string][]netip.Prefix // by the ledgers: what a Node gets
	if s.nodeInf != nil {
		if held, err = s.heldBlocks(ctx); err != nil {
			return err
		}
	}
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
				w, err := s.mirrorCIDR(ctx, cfg, node, blocks[node], held[node])
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
	err = s.awaitAll(ctx, waits)
	if failed > 0 {
		return errors.Join(fmt.Errorf("copying the %s pod CIDR of %d of %d nodes to their records failed; the first: %w", f, failed, len(blocks), first), err)
	}
	return err
}

// heldBlocks maps every node that holds a block to its blocks.
func (s *Store) heldBlocks(ctx context.Context) (map[string][]netip.Prefix, error) {
	allocs, err := s.Allocations(ctx)
	if err != nil {
		return nil, err
	}
	held := map[string][]netip.Prefix{}
	for p, node := range allocs {
		held[node] = append(held[node], p)
	}
	return held, nil
}

// mirrorCIDR copies block p into the node's ONCNode (what agents read) in
// the place of the record's block of p's family, and, once, the node's
// blocks (held, by the ledgers) into Node.spec.podCIDR(s), which
// Kubernetes never lets change. It returns what the caches must show for
// the caller to read its writes.
func (s *Store) mirrorCIDR(ctx context.Context, cfg datastore.ClusterConfig, node string, p netip.Prefix, held []netip.Prefix) ([]cacheWait, error) {
	waits, err := s.mirrorONCNode(ctx, node, cfg, func(have []netip.Prefix) []netip.Prefix {
		others := slices.DeleteFunc(slices.Clone(have), func(q netip.Prefix) bool { return datastore.FamilyOf(q) == datastore.FamilyOf(p) })
		return append(others, p)
	})
	if err != nil || s.nodeInf == nil { // an agent's store claims nothing
		return waits, err
	}
	w, err := s.mirrorNode(ctx, cfg, node, cfg.InFamilyOrder(held))
	return append(waits, w...), err
}

// mirrorONCNode makes the node's ONCNode show edit(the blocks it shows),
// in the cluster's family order, unless it does already. Each family's
// claims edit their own entry of the one list, maybe from two controllers
// at once during a leader change: so the patch holds on to the
// resourceVersion it edited, and a conflict edits the record afresh.
func (s *Store) mirrorONCNode(ctx context.Context, node string, cfg datastore.ClusterConfig, edit func([]netip.Prefix) []netip.Prefix) ([]cacheWait, error) {
	obj, ok, _ := s.oncInf.GetStore().GetByKey(node)
	if !ok {
		return nil, nil
	}
	n, err := cachedONCNode(obj)
	if err != nil {
		return nil, err
	}
	var waits []cacheWait
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		if n == nil { // after a conflict: read it past the cache
			fresh, err := s.getONCNode(ctx, node)
			if fresh == nil || err != nil {
				return err
			}
			n = fresh
		}
		have, _ := podCIDRsOf(n.Spec) // a malformed copy is overwritten
		want := cfg.InFamilyOrder(edit(have))
		if slices.Equal(have, want) {
			return nil
		}
		spec := map[string]any{"podCIDR": nil, "podCIDRs": nil} // null removes the copy
		if len(want) > 0 {
			spec["podCIDR"], spec["podCIDRs"] = want[0].String(), prefixStrings(want)
		}
		rv, err := s.patchONCNode(ctx, node, map[string]any{"metadata": map[string]any{"resourceVersion": n.ResourceVersion}, "spec": spec})
		n = nil
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return err
		default:
			waits = append(waits, cacheWait{s.oncInf, node, rv})
		}
		return nil
	})
	return waits, err
}

// mirrorNode writes blocks, the node's blocks in family order, into its
// Node, unless the Node has some already (Kubernetes never lets them
// change) or the node has not got a block of every pool yet: the Node
// gets them all at once or it could never get the others.
func (s *Store) mirrorNode(ctx context.Context, cfg datastore.ClusterConfig, node string, blocks []netip.Prefix) ([]cacheWait, error) {
	if len(blocks) == 0 {
		return nil, nil
	}
	for _, pool := range cfg.Pools {
		if !datastore.BlockOf(blocks, datastore.FamilyOf(pool.CIDR)).IsValid() {
			return nil, nil
		}
	}
	obj, ok, _ := s.nodeInf.GetStore().GetByKey(node)
	if !ok {
		return nil, nil
	}
	have, want := nodePodCIDRs(obj.(*corev1.Node)), prefixStrings(blocks)
	switch {
	case slices.Equal(have, want):
	case len(have) == 0:
		patch, _ := json.Marshal(map[string]any{"spec": map[string]any{"podCIDR": want[0], "podCIDRs": want}})
		n, err := s.kube.CoreV1().Nodes().Patch(ctx, node, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
		switch {
		case apierrors.IsNotFound(err):
		case err != nil:
			return nil, fmt.Errorf("node %s: setting spec.podCIDRs: %w", node, err)
		default: // the controller claims again for a Node its cache shows without
			return []cacheWait{{s.nodeInf, node, n.ResourceVersion}}, nil
		}
	case len(have) < len(want) && slices.Equal(have, want[:len(have)]):
		// A Node of the cluster before it became dual-stack keeps its one.
	default:
		slog.Warn("the Node already has other pod CIDRs, which Kubernetes does not let change; ONC routes its pods by ONC's",
			"node", node, "node.spec.podCIDRs", have, "onc", want)
	}
	return nil, nil
}

// nodePodCIDRs are the pod CIDRs a Node carries.
func nodePodCIDRs(n *corev1.Node) []string {
	if len(n.Spec.PodCIDRs) == 0 && n.Spec.PodCIDR != "" {
		return []string{n.Spec.PodCIDR}
	}
	return n.Spec.PodCIDRs
}

func prefixStrings(ps []netip.Prefix) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// ClusterNodes lists the cluster's Nodes and the pod CIDRs each carries.
func (s *Store) ClusterNodes(context.Context) (map[string][]netip.Prefix, error) {
	if s.nodeInf == nil {
		return nil, errors.New("this store was opened for an agent, which does not follow the cluster's Nodes")
	}
	out := map[string][]netip.Prefix{}
	for _, obj := range s.nodeInf.GetStore().List() {
		n := obj.(*corev1.Node)
		var blocks []netip.Prefix
		for _, c := range nodePodCIDRs(n) {
			if p, err := netip.ParsePrefix(c); err == nil {
				blocks = append(blocks, p)
			}
		}
		out[n.Name] = blocks
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
