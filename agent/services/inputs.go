// Package services compiles the cluster's Services and EndpointSlices into
// the table the socket load balancer serves on this node (datapath/services's
// model), as kube-proxy's iptables mode would for ClusterIP traffic:
// informers on the inputs, and a pure compiler from a snapshot of them.
package services

import (
	"context"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/onc-net/onc/agent/kubeinformer"
)

// Snapshot is a copy of the Service inputs, each list ordered by namespace
// and name. Its objects may be shared with the informer caches: read them,
// never modify them.
type Snapshot struct {
	Services       []*corev1.Service
	EndpointSlices []*discoveryv1.EndpointSlice
	// Node is this node's Node object (its zone and addresses), nil until
	// the API has one.
	Node *corev1.Node
}

// Inputs is informer caches of the cluster's Services and EndpointSlices,
// those kube-proxy watches, and of this node's Node. OnChange and Close are
// the informer set's.
type Inputs struct {
	*kubeinformer.Set
	services, slices, node cache.Store
	events                 record.EventBroadcaster
	recorder               record.EventRecorder
}

// proxied selects what kube-proxy watches (cmd/kube-proxy/app/server.go):
// not what asks for another proxy (service.kubernetes.io/service-proxy-name),
// not the EndpointSlices of headless Services, whose traffic DNS sends
// straight to the pods.
const proxied = "!service.kubernetes.io/service-proxy-name,!" + corev1.IsHeadlessService

// Watch starts the informers of node's inputs and waits until their caches
// are filled.
func Watch(ctx context.Context, cfg *rest.Config, node string) (*Inputs, error) {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	set, err := kubeinformer.Start(ctx,
		kubeinformer.Source{Client: kube.CoreV1().RESTClient(), Resource: "services", Object: &corev1.Service{}, Trim: kubeinformer.Trim(trimService),
			Select: func(o *metav1.ListOptions) {
				o.LabelSelector = proxied
				o.FieldSelector = fields.OneTermNotEqualSelector("spec.clusterIP", corev1.ClusterIPNone).String()
			}},
		kubeinformer.Source{Client: kube.DiscoveryV1().RESTClient(), Resource: "endpointslices", Object: &discoveryv1.EndpointSlice{}, Trim: kubeinformer.Trim(trimSlice),
			Select: func(o *metav1.ListOptions) { o.LabelSelector = proxied }},
		kubeinformer.Source{Client: kube.CoreV1().RESTClient(), Resource: "nodes", Object: &corev1.Node{}, Trim: kubeinformer.Trim(trimNode),
			Select: func(o *metav1.ListOptions) {
				o.FieldSelector = fields.OneTermEqualSelector("metadata.name", node).String()
			}})
	if err != nil {
		return nil, err
	}
	events := record.NewBroadcaster(record.WithContext(ctx))
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: kube.CoreV1().Events("")})
	return &Inputs{Set: set, services: set.Store(0), slices: set.Store(1), node: set.Store(2), events: events,
		recorder: events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "onc-agent", Host: node})}, nil
}

// Warn records a Warning event on svc, as kubectl describe shows it.
func (in *Inputs) Warn(svc *corev1.Service, reason, message string) {
	in.recorder.Event(svc, corev1.EventTypeWarning, reason, message)
}

// Close stops the informers and the event sink.
func (in *Inputs) Close() {
	in.Set.Close()
	in.events.Shutdown()
}

// trimNode keeps the zone label and the addresses: a kubelet's status
// heartbeat then changes nothing the compiler reads.
func trimNode(n *corev1.Node) *corev1.Node {
	var labels map[string]string
	if z, ok := n.Labels[corev1.LabelTopologyZone]; ok {
		labels = map[string]string{corev1.LabelTopologyZone: z}
	}
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, ResourceVersion: n.ResourceVersion, Labels: labels},
		Status: corev1.NodeStatus{Addresses: n.Status.Addresses}}
}

// trimService keeps what Compile and the health checks read: not target
// ports (EndpointSlices carry the resolved numbers) nor other annotations.
func trimService(s *corev1.Service) *corev1.Service {
	ports := make([]corev1.ServicePort, len(s.Spec.Ports))
	for i, p := range s.Spec.Ports {
		ports[i] = corev1.ServicePort{Name: p.Name, Protocol: p.Protocol, Port: p.Port, NodePort: p.NodePort}
	}
	var annotations map[string]string
	for _, a := range []string{corev1.AnnotationTopologyMode, corev1.DeprecatedAnnotationTopologyAwareHints} {
		if v, ok := s.Annotations[a]; ok {
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[a] = v
		}
	}
	return &corev1.Service{
		// The UID names the Service in the events Warn records.
		ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, UID: s.UID, ResourceVersion: s.ResourceVersion, Annotations: annotations},
		Spec: corev1.ServiceSpec{Type: s.Spec.Type, ClusterIP: s.Spec.ClusterIP, ClusterIPs: s.Spec.ClusterIPs, IPFamilies: s.Spec.IPFamilies,
			Ports: ports, SessionAffinity: s.Spec.SessionAffinity, SessionAffinityConfig: s.Spec.SessionAffinityConfig,
			InternalTrafficPolicy: s.Spec.InternalTrafficPolicy, ExternalTrafficPolicy: s.Spec.ExternalTrafficPolicy,
			ExternalIPs: s.Spec.ExternalIPs, LoadBalancerSourceRanges: s.Spec.LoadBalancerSourceRanges,
			HealthCheckNodePort: s.Spec.HealthCheckNodePort, TrafficDistribution: s.Spec.TrafficDistribution},
		Status: corev1.ServiceStatus{LoadBalancer: s.Status.LoadBalancer},
	}
}

// trimSlice keeps what Compile reads: not zones or hostnames, so that
// changes to them do not signal.
func trimSlice(es *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	var labels map[string]string
	if svc, ok := es.Labels[discoveryv1.LabelServiceName]; ok {
		labels = map[string]string{discoveryv1.LabelServiceName: svc}
	}
	eps := make([]discoveryv1.Endpoint, len(es.Endpoints))
	for i, ep := range es.Endpoints {
		eps[i] = discoveryv1.Endpoint{Addresses: ep.Addresses, Conditions: ep.Conditions, NodeName: ep.NodeName, Hints: ep.Hints}
		if ref := ep.TargetRef; ref != nil {
			eps[i].TargetRef = &corev1.ObjectReference{Kind: ref.Kind, Namespace: ref.Namespace, Name: ref.Name}
		}
	}
	ports := make([]discoveryv1.EndpointPort, len(es.Ports))
	for i, p := range es.Ports {
		ports[i] = discoveryv1.EndpointPort{Name: p.Name, Protocol: p.Protocol, Port: p.Port}
	}
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: es.Name, Namespace: es.Namespace, ResourceVersion: es.ResourceVersion, Labels: labels},
		AddressType: es.AddressType, Endpoints: eps, Ports: ports,
	}
}

// Snapshot copies the lists of both caches.
func (in *Inputs) Snapshot() Snapshot {
	return Snapshot{
		Services:       kubeinformer.List[*corev1.Service](in.services),
		EndpointSlices: kubeinformer.List[*discoveryv1.EndpointSlice](in.slices),
		Node:           first(kubeinformer.List[*corev1.Node](in.node)),
	}
}

func first[T any](l []T) (zero T) {
	if len(l) > 0 {
		return l[0]
	}
	return zero
}
