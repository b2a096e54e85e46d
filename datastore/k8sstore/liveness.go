package k8sstore

// Liveness. Each agent renews a coordination.k8s.io Lease of its own in
// ONC's lease namespace, as kubelets do in kube-node-lease. No agent
// watches the Leases, so a renewal wakes nobody; the controller's store
// caches them for its node timeout, and an agent's lists them on demand
// (onctl peers).

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
)

// DefaultLeaseNamespace holds the liveness Leases (manifests/onc.yaml).
const DefaultLeaseNamespace = "onc-node-lease"

const (
	// leasePrefix + node name is a node's liveness Lease.
	leasePrefix = "onc-node-"
	// livenessLabel marks them, should the namespace hold other Leases.
	livenessLabel = "onc.io/liveness"
)

func leaseName(node string) (string, error) {
	if err := validName(node); err != nil {
		return "", err
	}
	if n := leasePrefix + node; len(n) <= 253 {
		return n, nil
	}
	return "", fmt.Errorf("node name %q: longer than the %d characters its liveness Lease's name leaves", node, 253-len(leasePrefix))
}

// RenewInterval is how often KeepAlive renews a Lease of ttl: every 30 %
// of it (12 s of the default 40 s), so a node survives two lost renewals
// and N nodes write N ÷ 12 times a second, under the N ÷ 10 a datastore can
// be asked to carry.
func RenewInterval(ttl time.Duration) time.Duration {
	return max(ttl.Truncate(time.Second)*3/10, time.Second)
}

// KeepAlive renews the node's Lease every RenewInterval, and deletes it
// when ctx ends so the node is seen gone at once, not after ttl.
func (s *Store) KeepAlive(ctx context.Context, name string, ttl time.Duration) error {
	lease, err := leaseName(name)
	if err != nil {
		return err
	}
	secs := int32(max(ttl/time.Second, 1))
	every := RenewInterval(ttl)
	defer func() {
		cctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = s.deleteLease(cctx, name)
	}()
	var held *coordinationv1.Lease
	for {
		wait := every
		if held, err = s.renew(ctx, held, lease, name, secs); err != nil {
			// client-go returns an empty Lease beside the error: holding
			// it would fail every later renewal ("resource name may not
			// be empty"). The next one starts from the API's copy.
			held = nil
			if ctx.Err() == nil {
				slog.Warn("node liveness lease renewal failed; retrying", "node", name, "err", err)
				wait = time.Second
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// deleteLease removes a node's Lease: the node is seen gone at once, by
// this store's Liveness too (it waits for its cache, if it has one).
func (s *Store) deleteLease(ctx context.Context, node string) error {
	lease, err := leaseName(node)
	if err != nil {
		return err
	}
	err = s.kube.CoordinationV1().Leases(s.leaseNS).Delete(ctx, lease, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete Lease %s/%s: %w", s.leaseNS, lease, err)
	}
	if s.leaseInf == nil {
		return nil
	}
	return s.awaitCache(ctx, s.leaseInf, s.leaseNS+"/"+lease, "")
}

// renew writes the Lease once: an update of the one it holds (nil: fetch
// or create it first).
func (s *Store) renew(ctx context.Context, held *coordinationv1.Lease, lease, node string, secs int32) (*coordinationv1.Lease, error) {
	leases := s.kube.CoordinationV1().Leases(s.leaseNS)
	now := metav1.NewMicroTime(time.Now())
	if held == nil {
		got, err := leases.Get(ctx, lease, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return leases.Create(ctx, &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: lease, Namespace: s.leaseNS,
					Labels: map[string]string{"app.kubernetes.io/part-of": "onc", livenessLabel: "node"}},
				Spec: coordinationv1.LeaseSpec{HolderIdentity: &node, LeaseDurationSeconds: &secs, AcquireTime: &now, RenewTime: &now},
			}, metav1.CreateOptions{})
		}
		if err != nil {
			return nil, err
		}
		held = got
		held.Spec.HolderIdentity, held.Spec.AcquireTime = &node, &now
	}
	l := held.DeepCopy()
	l.Spec.RenewTime, l.Spec.LeaseDurationSeconds = &now, &secs
	return leases.Update(ctx, l, metav1.UpdateOptions{})
}

// Liveness reads the Leases: from the controller's cache, or listed.
func (s *Store) Liveness(ctx context.Context) (map[string]bool, error) {
	var leases []*coordinationv1.Lease
	if s.leaseInf != nil {
		for _, obj := range s.leaseInf.GetStore().List() {
			leases = append(leases, obj.(*coordinationv1.Lease))
		}
	} else {
		list, err := s.kube.CoordinationV1().Leases(s.leaseNS).List(ctx, metav1.ListOptions{LabelSelector: livenessLabel})
		if err != nil {
			return nil, fmt.Errorf("list liveness Leases in %s: %w", s.leaseNS, err)
		}
		for i := range list.Items {
			leases = append(leases, &list.Items[i])
		}
	}
	now := time.Now()
	out := map[string]bool{}
	for _, l := range leases {
		if h := l.Spec.HolderIdentity; h != nil && leaseAlive(l, now) {
			out[*h] = true
		}
	}
	return out, nil
}

func leaseAlive(l *coordinationv1.Lease, now time.Time) bool {
	r, d := l.Spec.RenewTime, l.Spec.LeaseDurationSeconds
	return r != nil && d != nil && now.Before(r.Add(time.Duration(*d)*time.Second))
}

func (s *Store) newLeaseInformer() cache.SharedIndexInformer {
	lw := cache.NewFilteredListWatchFromClient(s.kube.CoordinationV1().RESTClient(), "leases", s.leaseNS,
		func(o *metav1.ListOptions) { o.LabelSelector = livenessLabel })
	return cache.NewSharedIndexInformer(lw, &coordinationv1.Lease{}, 0, cache.Indexers{})
}
