// Package policy compiles the cluster's NetworkPolicies into the rules of
// the pods attached on this node (datapath/netpol's model): informers on
// the inputs, and a pure compiler from a snapshot of them.
package policy

import (
	"context"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// Snapshot is a copy of the policy inputs. Its objects may be shared with
// the informer caches: read them, never modify them.
type Snapshot struct {
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
}

// Inputs is informer caches of every pod, namespace and NetworkPolicy of
// the cluster: peers are selected cluster-wide, not only on this node.
type Inputs struct {
	pods, namespaces, policies cache.Store
	stop                       chan struct{}

	mu        sync.Mutex
	callbacks []func()
}

// Watch starts the informers and waits until their caches are filled.
func Watch(ctx context.Context, cfg *rest.Config) (*Inputs, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	in := &Inputs{stop: make(chan struct{})}
	core, netv1 := kube.CoreV1().RESTClient(), kube.NetworkingV1().RESTClient()
	informers := []cache.SharedIndexInformer{
		informer(core, "pods", &corev1.Pod{}),
		informer(core, "namespaces", &corev1.Namespace{}),
		informer(netv1, "networkpolicies", &networkingv1.NetworkPolicy{}),
	}
	// Keep only what the compiler reads: a cluster has many pods.
	for i, trim := range []cache.TransformFunc{trimPod, trimNamespace, trimPolicy} {
		if err := informers[i].SetTransform(trim); err != nil {
			return nil, err
		}
	}
	in.pods, in.namespaces, in.policies = informers[0].GetStore(), informers[1].GetStore(), informers[2].GetStore()
	synced := make([]cache.InformerSynced, len(informers))
	for i, inf := range informers {
		// Handlers are added before Run, so no event is missed.
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc: func(any) { in.notify() },
			UpdateFunc: func(old, cur any) {
				if !sameButVersion(old, cur) {
					in.notify()
				}
			},
			DeleteFunc: func(any) { in.notify() },
		}); err != nil {
			return nil, err
		}
		synced[i] = inf.HasSynced
	}
	for _, inf := range informers {
		go inf.Run(in.stop)
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(sctx.Done(), synced...) {
		in.Close()
		return nil, fmt.Errorf("cannot list and watch pods, namespaces and networkpolicies (RBAC: get/list/watch on each)")
	}
	return in, nil
}

// informer makes an all-namespaces informer: peers are selected
// cluster-wide.
func informer(client rest.Interface, resource string, obj runtime.Object) cache.SharedIndexInformer {
	return cache.NewSharedIndexInformer(
		cache.NewListWatchFromClient(client, resource, metav1.NamespaceAll, fields.Everything()),
		obj, 0, cache.Indexers{})
}

func trimPod(obj any) (any, error) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	containers := make([]corev1.Container, len(p.Spec.Containers))
	for i, c := range p.Spec.Containers {
		for _, port := range c.Ports {
			containers[i].Ports = append(containers[i].Ports,
				corev1.ContainerPort{Name: port.Name, ContainerPort: port.ContainerPort, Protocol: port.Protocol})
		}
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: p.Name, Namespace: p.Namespace, Labels: p.Labels, ResourceVersion: p.ResourceVersion},
		Spec:       corev1.PodSpec{NodeName: p.Spec.NodeName, HostNetwork: p.Spec.HostNetwork, Containers: containers},
		Status:     corev1.PodStatus{Phase: p.Status.Phase, PodIP: p.Status.PodIP, PodIPs: p.Status.PodIPs},
	}, nil
}

func trimNamespace(obj any) (any, error) {
	ns, ok := obj.(*corev1.Namespace)
	if !ok {
		return obj, nil
	}
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, Labels: ns.Labels, ResourceVersion: ns.ResourceVersion}}, nil
}

func trimPolicy(obj any) (any, error) {
	np, ok := obj.(*networkingv1.NetworkPolicy)
	if !ok {
		return obj, nil
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: np.Name, Namespace: np.Namespace, ResourceVersion: np.ResourceVersion},
		Spec:       np.Spec,
	}, nil
}

// OnChange registers fn to be called on every change of any input. fn must
// not block (signal a channel). It is also called once now, for the
// changes that happened before it was registered.
func (in *Inputs) OnChange(fn func()) {
	in.mu.Lock()
	in.callbacks = append(in.callbacks, fn)
	in.mu.Unlock()
	fn()
}

func (in *Inputs) notify() {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, fn := range in.callbacks {
		fn()
	}
}

// Snapshot copies the lists of the three caches.
func (in *Inputs) Snapshot() Snapshot {
	var s Snapshot
	for _, o := range in.pods.List() {
		s.Pods = append(s.Pods, o.(*corev1.Pod))
	}
	for _, o := range in.namespaces.List() {
		s.Namespaces = append(s.Namespaces, o.(*corev1.Namespace))
	}
	for _, o := range in.policies.List() {
		s.Policies = append(s.Policies, o.(*networkingv1.NetworkPolicy))
	}
	return s
}

// sameButVersion reports whether two trimmed versions of an object differ
// in their resourceVersion only: a pod's status updates (conditions, a
// container restart) change nothing policy reads.
func sameButVersion(old, cur any) bool {
	o, ok1 := old.(metav1.Object)
	c, ok2 := cur.(metav1.Object)
	if !ok1 || !ok2 || o.GetResourceVersion() == c.GetResourceVersion() {
		return ok1 && ok2 // a resync's update, or not an object: nothing new
	}
	oc := old.(runtime.Object).DeepCopyObject().(metav1.Object)
	oc.SetResourceVersion(c.GetResourceVersion())
	return equality.Semantic.DeepEqual(oc, cur)
}

// HasPod reports whether the pod cache holds the pod.
func (in *Inputs) HasPod(namespace, name string) bool {
	_, ok, _ := in.pods.GetByKey(namespace + "/" + name)
	return ok
}

// Close stops the informers.
func (in *Inputs) Close() { close(in.stop) }
