// Package policy compiles the cluster's NetworkPolicies into the rules of
// the pods attached on this node (datapath/policy's model): informers on
// the inputs, and a compiler from a snapshot of them: in full (Compile), or
// from the last compile, recompiling what changed (Incremental).
package policy

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/onc-net/onc/agent/kubeinformer"
)

// Snapshot is a copy of the policy inputs, each list ordered by namespace
// and name. Its objects may be shared with the informer caches: read them,
// never modify them.
type Snapshot struct {
	Pods       []*corev1.Pod
	Namespaces []*corev1.Namespace
	Policies   []*networkingv1.NetworkPolicy
}

// Inputs is informer caches of every pod, namespace and NetworkPolicy of
// the cluster: peers are selected cluster-wide, not only on this node.
// OnChange and Close are the informer set's.
type Inputs struct {
	*kubeinformer.Set
	pods, namespaces, policies cache.Store
}

// Watch starts the informers and waits until their caches are filled.
func Watch(ctx context.Context, cfg *rest.Config) (*Inputs, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	core, netv1 := kube.CoreV1().RESTClient(), kube.NetworkingV1().RESTClient()
	// Keep only what the compiler reads: a cluster has many pods.
	set, err := kubeinformer.Start(ctx,
		kubeinformer.Source{Client: core, Resource: "pods", Object: &corev1.Pod{}, Trim: kubeinformer.Trim(trimPod)},
		kubeinformer.Source{Client: core, Resource: "namespaces", Object: &corev1.Namespace{}, Trim: kubeinformer.Trim(trimNamespace)},
		kubeinformer.Source{Client: netv1, Resource: "networkpolicies", Object: &networkingv1.NetworkPolicy{}, Trim: kubeinformer.Trim(trimPolicy)})
	if err != nil {
		return nil, err
	}
	return &Inputs{Set: set, pods: set.Store(0), namespaces: set.Store(1), policies: set.Store(2)}, nil
}

func trimPod(p *corev1.Pod) *corev1.Pod {
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
	}
}

func trimNamespace(ns *corev1.Namespace) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns.Name, Labels: ns.Labels, ResourceVersion: ns.ResourceVersion}}
}

// trimPolicy keeps the mode annotation with the spec: without it, an
// update of the annotation alone would look like no change at all
// (kubeinformer.SameButVersion).
func trimPolicy(np *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
	meta := metav1.ObjectMeta{Name: np.Name, Namespace: np.Namespace, ResourceVersion: np.ResourceVersion}
	if mode, ok := np.Annotations[ModeAnnotation]; ok {
		meta.Annotations = map[string]string{ModeAnnotation: mode}
	}
	return &networkingv1.NetworkPolicy{ObjectMeta: meta, Spec: np.Spec}
}

// Snapshot copies the lists of the three caches.
func (in *Inputs) Snapshot() Snapshot {
	return Snapshot{
		Pods:       kubeinformer.List[*corev1.Pod](in.pods),
		Namespaces: kubeinformer.List[*corev1.Namespace](in.namespaces),
		Policies:   kubeinformer.List[*networkingv1.NetworkPolicy](in.policies),
	}
}

// HasPod reports whether the pod cache holds the pod.
func (in *Inputs) HasPod(namespace, name string) bool {
	_, ok, _ := in.pods.GetByKey(namespace + "/" + name)
	return ok
}
