// Package policy compiles the cluster's NetworkPolicies and
// ClusterNetworkPolicies into the rules of the pods attached on this node
// (datapath/policy's model): informers on the inputs, and a compiler from
// a snapshot of them: in full (Compile), or from the last compile,
// recompiling what changed (Incremental).
package policy

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
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
	// ClusterPolicies are ordered by name; none where the API does not
	// serve them.
	ClusterPolicies []*ClusterNetworkPolicy
	Nodes           []*corev1.Node
}

// Inputs is informer caches of every pod, namespace, NetworkPolicy,
// ClusterNetworkPolicy and node of the cluster: peers are selected
// cluster-wide, not only on this node.
type Inputs struct {
	set                               *kubeinformer.Set
	pods, namespaces, policies, nodes cache.Store
	cancel                            context.CancelFunc

	mu        sync.Mutex
	cnps      *kubeinformer.Set // nil until the API serves ClusterNetworkPolicies and the cache is filled
	callbacks []func()
	done      chan struct{} // closed when watchCNPs returns
}

// CNPRetry is how often the inputs look again for ClusterNetworkPolicies
// while the API does not serve them (a variable for the tests).
var CNPRetry = time.Minute

// Watch starts the informers and waits until their caches are filled.
// ClusterNetworkPolicies are watched apart, once the API serves them: a
// cluster without their CRD (or an agent without the RBAC to read them)
// still has NetworkPolicy.
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
		kubeinformer.Source{Client: netv1, Resource: "networkpolicies", Object: &networkingv1.NetworkPolicy{}, Trim: kubeinformer.Trim(trimPolicy)},
		kubeinformer.Source{Client: core, Resource: "nodes", Object: &corev1.Node{}, Trim: kubeinformer.Trim(trimNode)})
	if err != nil {
		return nil, err
	}
	in := &Inputs{set: set, pods: set.Store(0), namespaces: set.Store(1), policies: set.Store(2), nodes: set.Store(3),
		done: make(chan struct{})}
	// Where the API serves them, the policies are in the caches before the
	// first pod is compiled: none starts without its tier rules.
	cnpCtx, cancel := context.WithCancel(ctx)
	in.cancel = cancel
	disc := kube.Discovery()
	if in.cnps, err = startCNPs(cnpCtx, cfg, disc); err == nil {
		logWatchingCNPs()
		close(in.done)
	} else {
		go in.watchCNPs(cnpCtx, cfg, disc, err)
	}
	return in, nil
}

// watchCNPs starts the ClusterNetworkPolicy informer, which failed to
// start with err, once discovery shows the API serves the resource and
// the agent may read it, looking again every CNPRetry until then. It says
// why it waits once per reason.
func (in *Inputs) watchCNPs(ctx context.Context, cfg *rest.Config, disc discovery.DiscoveryInterface, err error) {
	defer close(in.done)
	said := ""
	for err != nil {
		if err.Error() != said {
			slog.Warn("network policy: ClusterNetworkPolicies not enforced; looking again later", "retry", CNPRetry, "why", err)
			said = err.Error()
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(CNPRetry):
		}
		var set *kubeinformer.Set
		if set, err = startCNPs(ctx, cfg, disc); err == nil {
			logWatchingCNPs()
			in.mu.Lock()
			in.cnps = set
			for _, fn := range in.callbacks {
				set.OnChange(fn)
			}
			in.mu.Unlock()
		}
	}
}

func logWatchingCNPs() {
	slog.Info("network policy: watching ClusterNetworkPolicies", "api", CNPGroupVersion.String())
}

// errCNPNotServed: discovery does not list the resource (no CRD).
type errCNPNotServed struct{}

func (errCNPNotServed) Error() string {
	return "the API does not serve " + CNPResource + "." + CNPGroupVersion.Group + "/" + CNPGroupVersion.Version +
		" (apply manifests/onc.yaml, which installs its CRD)"
}

func startCNPs(ctx context.Context, cfg *rest.Config, disc discovery.DiscoveryInterface) (*kubeinformer.Set, error) {
	list, err := disc.ServerResourcesForGroupVersion(CNPGroupVersion.String())
	switch {
	case apierrors.IsNotFound(err):
		return nil, errCNPNotServed{}
	case err != nil:
		return nil, err
	case !slices.ContainsFunc(list.APIResources, func(r metav1.APIResource) bool { return r.Name == CNPResource }):
		return nil, errCNPNotServed{}
	}
	client, err := cnpClient(cfg)
	if err != nil {
		return nil, err
	}
	return kubeinformer.Start(ctx,
		kubeinformer.Source{Client: client, Resource: CNPResource, Object: &ClusterNetworkPolicy{}, Trim: kubeinformer.Trim(trimCNP)})
}

// OnChange registers fn, called after any input changes (and once now).
func (in *Inputs) OnChange(fn func()) {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.callbacks = append(in.callbacks, fn)
	if in.cnps != nil {
		in.cnps.OnChange(fn)
	}
	in.set.OnChange(fn)
}

// Close stops the informers (and the search for ClusterNetworkPolicies).
func (in *Inputs) Close() {
	in.cancel()
	<-in.done
	in.set.Close()
	if in.cnps != nil {
		in.cnps.Close()
	}
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

// trimNode keeps what a nodes peer selects and reaches: the labels and
// the internal and external addresses.
func trimNode(n *corev1.Node) *corev1.Node {
	var addrs []corev1.NodeAddress
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP || a.Type == corev1.NodeExternalIP {
			addrs = append(addrs, a)
		}
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, Labels: n.Labels, ResourceVersion: n.ResourceVersion},
		Status: corev1.NodeStatus{Addresses: addrs}}
}

// trimCNP keeps the spec, and the generation (which changes with it
// alone: a status update does not signal).
func trimCNP(p *ClusterNetworkPolicy) *ClusterNetworkPolicy {
	return &ClusterNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: p.Name, ResourceVersion: p.ResourceVersion, Generation: p.Generation},
		Spec: p.Spec}
}

// Snapshot copies the lists of the caches.
func (in *Inputs) Snapshot() Snapshot {
	s := Snapshot{
		Pods:       kubeinformer.List[*corev1.Pod](in.pods),
		Namespaces: kubeinformer.List[*corev1.Namespace](in.namespaces),
		Policies:   kubeinformer.List[*networkingv1.NetworkPolicy](in.policies),
		Nodes:      kubeinformer.List[*corev1.Node](in.nodes),
	}
	in.mu.Lock()
	cnps := in.cnps
	in.mu.Unlock()
	if cnps != nil {
		s.ClusterPolicies = kubeinformer.List[*ClusterNetworkPolicy](cnps.Store(0))
	}
	return s
}

// HasPod reports whether the pod cache holds the pod.
func (in *Inputs) HasPod(namespace, name string) bool {
	_, ok, _ := in.pods.GetByKey(namespace + "/" + name)
	return ok
}
