// Package k8sstore is the Kubernetes backend of the datastore. It keeps
//
//   - one ONCNode (cluster-scoped custom resource) per node: the tunnel
//     endpoint its agent publishes and the pod CIDRs; it changes only when
//     a tunnel endpoint does;
//   - one coordination.k8s.io Lease per node in a namespace of their own
//     (onc-node-lease), renewed by its agent: liveness, which no agent
//     watches, so a heartbeat wakes nobody (as kubelets' node Leases);
//   - the ConfigMap <namespace>/onc-ipam: the cluster configuration and the
//     ledger of allocated IPv4 blocks; onc-ipam-ipv6, the IPv6 blocks'.
//     Every batch of claims is one compare-and-swap update of its
//     family's ledger, so a block is never handed out twice and a node
//     never gets two of a family, even while two controllers overlap
//     during a leader change;
//   - Node.spec.podCIDR(s), written once when a node has a block of every
//     pool, for kube-proxy and anything else that reads it.
//
// Reads come from informer caches; every write waits until the cache has
// seen it, so a caller reads its own writes.
package k8sstore

// This file holds the Store itself: Options, New and the informer
// plumbing with its change signals (Changes), Describe, Close and
// awaitCache (read-your-writes for writers).

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/onc-net/onc/datastore"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/flowcontrol"
)

// Options configure the backend.
type Options struct {
	Config    *rest.Config
	Namespace string // where the ledger lives; default "onc-system"
	// LeaseNamespace holds the nodes' liveness Leases; default
	// DefaultLeaseNamespace. Apart from Namespace, so the agents' right to
	// write them cannot reach the controllers' leader Lease.
	LeaseNamespace string
	SyncWait       time.Duration // how long New waits for the caches; default 60s
	// Agent opens the store for an agent: it follows ONCNodes only (they
	// carry each node's pod CIDRs). The ledgers, the cluster's Nodes and
	// the liveness Leases, which only the controller follows, are read
	// when asked instead.
	Agent bool
}

// Store implements datastore.Store on the Kubernetes API.
type Store struct {
	kube     kubernetes.Interface
	dyn      dynamic.Interface
	ns       string // the ledger's
	leaseNS  string // the liveness Leases'
	desc     string
	stop     chan struct{}
	oncInf   cache.SharedIndexInformer
	ledgers  map[datastore.Family]cache.SharedIndexInformer // nil for an agent
	nodeInf  cache.SharedIndexInformer                      // nil for an agent
	leaseInf cache.SharedIndexInformer                      // nil for an agent

	mu   sync.Mutex
	subs map[chan struct{}]struct{}
}

var (
	_ datastore.Store               = (*Store)(nil)
	_ datastore.Membership          = (*Store)(nil)
	_ datastore.CachedRegistrations = (*Store)(nil)
)

// New connects, starts the informers and waits until their caches are
// filled: a missing CRD or RBAC rule shows up here, named.
func New(ctx context.Context, o Options) (*Store, error) {
	if o.Config == nil {
		return nil, errors.New("kubernetes: no client config")
	}
	if o.Namespace == "" {
		o.Namespace = "onc-system"
	}
	if o.LeaseNamespace == "" {
		o.LeaseNamespace = DefaultLeaseNamespace
	}
	if o.SyncWait == 0 {
		o.SyncWait = 60 * time.Second
	}
	// One rate limit for both clients: QPS and Burst bound what the store
	// sends, not what each of its clients does.
	cfg := rest.CopyConfig(o.Config)
	if cfg.RateLimiter == nil && cfg.QPS > 0 {
		cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(cfg.QPS, cfg.Burst)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	s := &Store{
		kube: kube, dyn: dyn, ns: o.Namespace, leaseNS: o.LeaseNamespace,
		desc: fmt.Sprintf("kubernetes %s (ledger %s/%s)", o.Config.Host, o.Namespace, LedgerName),
		stop: make(chan struct{}), subs: map[chan struct{}]struct{}{},
	}
	s.oncInf = dynamicinformer.NewFilteredDynamicInformer(dyn, ONCNodes, "", 0, cache.Indexers{}, nil).Informer()
	if err := s.oncInf.SetTransform(typedONCNode); err != nil {
		return nil, err
	}
	notify := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { s.notify() },
		UpdateFunc: func(any, any) { s.notify() },
		DeleteFunc: func(any) { s.notify() },
	}
	infs := map[string]cache.SharedIndexInformer{"ONCNodes": s.oncInf}
	handlers := map[string]cache.ResourceEventHandler{"ONCNodes": notify}
	if !o.Agent {
		// A ledger each, by name: RBAC grants them by name, and a list
		// or watch needs the name's field selector for that.
		s.ledgers = map[datastore.Family]cache.SharedIndexInformer{}
		for f, name := range ledgerNames {
			s.ledgers[f] = cache.NewSharedIndexInformer(
				cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "configmaps", o.Namespace, fields.OneTermEqualSelector("metadata.name", name)),
				&corev1.ConfigMap{}, 0, cache.Indexers{})
			infs["ConfigMap "+name], handlers["ConfigMap "+name] = s.ledgers[f], notify
		}
		s.nodeInf = cache.NewSharedIndexInformer(
			cache.NewListWatchFromClient(kube.CoreV1().RESTClient(), "nodes", "", fields.Everything()),
			&corev1.Node{}, 0, cache.Indexers{})
		// Only the name and pod CIDRs of a Node matter here; drop the rest
		// (images, conditions) so big clusters cost little memory.
		if err := s.nodeInf.SetTransform(slimNode); err != nil {
			return nil, err
		}
		s.leaseInf = s.newLeaseInformer()
		infs["Nodes"], handlers["Nodes"] = s.nodeInf, nodeChanges(s.notify)
		infs["Leases"] = s.leaseInf // read by Liveness; renewals signal nothing
	}
	for name, inf := range infs {
		if h := handlers[name]; h != nil {
			if _, err := inf.AddEventHandler(h); err != nil {
				return nil, err
			}
		}
		inf.SetWatchErrorHandlerWithContext(watchErrorLogger(name))
		go inf.Run(s.stop)
	}
	sctx, cancel := context.WithTimeout(ctx, o.SyncWait)
	defer cancel()
	for name, inf := range infs {
		if !cache.WaitForCacheSync(sctx.Done(), inf.HasSynced) {
			close(s.stop)
			return nil, fmt.Errorf("kubernetes %s: cannot list and watch %s within %v: is manifests/onc.yaml applied (CRD, RBAC)? The log shows the API's answer",
				o.Config.Host, name, o.SyncWait)
		}
	}
	return s, nil
}

func watchErrorLogger(what string) cache.WatchErrorHandlerWithContext {
	return func(_ context.Context, _ *cache.Reflector, err error) {
		slog.Warn("kubernetes watch failed; retrying", "resource", what, "err", err)
	}
}

func (s *Store) Describe() string { return s.desc }

func (s *Store) Close() error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	return nil
}

// awaitCache waits until inf's cache holds key at resourceVersion rv or
// later, or (rv == "") no longer holds it.
func (s *Store) awaitCache(ctx context.Context, inf cache.SharedIndexInformer, key, rv string) error {
	return s.awaitCacheOf(ctx, inf, key, rv, false)
}

// awaitCacheOf is awaitCache; updated says the write changed an object
// the cache already held, so that its absence means it was deleted since
// (an autoscaler removing a Node just after its pod CIDR was copied) and
// there is nothing left to wait for.
func (s *Store) awaitCacheOf(ctx context.Context, inf cache.SharedIndexInformer, key, rv string, updated bool) error {
	want, _ := strconv.ParseUint(rv, 10, 64)
	for {
		obj, ok, _ := inf.GetStore().GetByKey(key)
		if !ok && (rv == "" || updated) {
			return nil
		}
		if ok && rv != "" {
			have := obj.(metav1.Object).GetResourceVersion()
			if n, err := strconv.ParseUint(have, 10, 64); have == rv || (err == nil && want > 0 && n >= want) {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the informer cache to see %s: %w", key, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// cacheWait is a write a cache must show before the call that made it
// returns.
type cacheWait struct {
	inf     cache.SharedIndexInformer
	key, rv string
}

// awaitAll waits until the caches show every write of waits, each an
// update of an object its cache held: one deleted since is not waited for.
func (s *Store) awaitAll(ctx context.Context, waits []cacheWait) error {
	for _, w := range waits {
		if err := s.awaitCacheOf(ctx, w.inf, w.key, w.rv, true); err != nil {
			return err
		}
	}
	return nil
}

// Changes signals every ONCNode change (and, for the controller, ledger and
// Node changes): the informers' handlers call notify.
func (s *Store) Changes(ctx context.Context) <-chan struct{} {
	ch := make(chan struct{}, 1)
	ch <- struct{}{}
	s.mu.Lock()
	s.subs[ch] = struct{}{}
	s.mu.Unlock()
	go func() {
		select {
		case <-ctx.Done():
		case <-s.stop:
		}
		s.mu.Lock()
		delete(s.subs, ch)
		close(ch)
		s.mu.Unlock()
	}()
	return ch
}

func (s *Store) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for ch := range s.subs {
		select {
		case ch <- struct{}{}:
		default:
		}
	}
}
