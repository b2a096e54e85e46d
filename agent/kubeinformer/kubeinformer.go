// Package kubeinformer runs the cluster-wide informers whose caches the
// agent's pure compilers read (agent/policy, agent/services): each cache
// trimmed to what its compiler uses, and one signal for any change that
// matters to it.
package kubeinformer

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Source is one resource to watch in every namespace.
type Source struct {
	Client   rest.Interface // the REST client of the resource's API group
	Resource string         // plural, e.g. "pods"
	Object   runtime.Object // an empty object of its type
	// Trim keeps what the compiler reads, and the resourceVersion (see
	// the function Trim).
	Trim cache.TransformFunc
	// Select, if not nil, narrows what is listed and watched.
	Select func(*metav1.ListOptions)
}

// Set is the informers of some sources, started together.
type Set struct {
	stores []cache.Store
	stop   chan struct{}

	mu        sync.Mutex
	callbacks []func()
}

// Start starts an informer per source and waits until their caches are
// filled.
func Start(ctx context.Context, sources ...Source) (*Set, error) {
	s := &Set{stop: make(chan struct{})}
	synced := make([]cache.InformerSynced, len(sources))
	informers := make([]cache.SharedIndexInformer, len(sources))
	names := make([]string, len(sources))
	for i, src := range sources {
		inf := cache.NewSharedIndexInformer(
			cache.NewFilteredListWatchFromClient(src.Client, src.Resource, metav1.NamespaceAll, func(o *metav1.ListOptions) {
				if src.Select != nil {
					src.Select(o)
				}
			}),
			src.Object, 0, cache.Indexers{})
		if err := inf.SetTransform(src.Trim); err != nil {
			return nil, err
		}
		// Handlers are added before Run, so no event is missed.
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { s.notify() },
			UpdateFunc: func(old, cur any) {
				if !SameButVersion(old, cur) {
					s.notify()
				}
			},
			DeleteFunc: func(any) { s.notify() },
		}); err != nil {
			return nil, err
		}
		informers[i], synced[i], names[i] = inf, inf.HasSynced, src.Resource
		s.stores = append(s.stores, inf.GetStore())
	}
	for _, inf := range informers {
		go inf.Run(s.stop)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), synced...) {
		s.Close()
		return nil, fmt.Errorf("cannot list and watch %s (RBAC: list and watch on each)", strings.Join(names, ", "))
	}
	return s, nil
}

// Store is the cache of the i-th source.
func (s *Set) Store(i int) cache.Store { return s.stores[i] }

// OnChange registers fn to be called on every change of any source. fn
// must not block (signal a channel). It is also called once now, for the
// changes that happened before it was registered.
func (s *Set) OnChange(fn func()) {
	s.mu.Lock()
	s.callbacks = append(s.callbacks, fn)
	s.mu.Unlock()
	fn()
}

func (s *Set) notify() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, fn := range s.callbacks {
		fn()
	}
}

// Close stops the informers.
func (s *Set) Close() { close(s.stop) }

// Trim makes a cache transform of trim, which keeps what a compiler
// reads of an object, and its resourceVersion: a cache of many objects
// then holds little, and SameButVersion sees the updates that matter.
// Anything else (a tombstone) passes through.
func Trim[T runtime.Object](trim func(T) T) cache.TransformFunc {
	return func(obj any) (any, error) {
		if o, ok := obj.(T); ok {
			return trim(o), nil
		}
		return obj, nil
	}
}

// List copies a store's objects, ordered by namespace and name so that a
// compiler's input does not depend on map order.
func List[T metav1.Object](store cache.Store) []T {
	var out []T
	for _, o := range store.List() {
		out = append(out, o.(T))
	}
	slices.SortFunc(out, func(a, b T) int {
		return cmp.Or(cmp.Compare(a.GetNamespace(), b.GetNamespace()), cmp.Compare(a.GetName(), b.GetName()))
	})
	return out
}

// SameButVersion reports whether two trimmed versions of an object differ
// in their resourceVersion only: the change was to something the compiler
// does not read (a pod's conditions, managedFields), so it does not signal.
func SameButVersion(old, cur any) bool {
	o, ok1 := old.(metav1.Object)
	c, ok2 := cur.(metav1.Object)
	if !ok1 || !ok2 || o.GetResourceVersion() == c.GetResourceVersion() {
		return ok1 && ok2 // a resync's update, or not an object: nothing new
	}
	oc := old.(runtime.Object).DeepCopyObject().(metav1.Object)
	oc.SetResourceVersion(c.GetResourceVersion())
	return equality.Semantic.DeepEqual(oc, cur)
}
