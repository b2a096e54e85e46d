package policy

// ClusterNetworkPolicy (policy.networking.k8s.io/v1alpha2, the
// network-policy-api bundle v0.3.0, experimental channel:
// manifests/onc.yaml), mirrored by hand as ONCNode is
// (datastore/k8sstore): the project's own module needs a newer client-go
// than ONC's. The JSON names are the CRD's; fields this agent does not
// know decode to nothing, which the compiler fails closed on (cnp.go).

import (
	"encoding/json"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/client-go/rest"
)

// CNPGroupVersion is the API the agent watches ClusterNetworkPolicies in
// (served beside v1beta1, the storage version, with the same schema).
var CNPGroupVersion = schema.GroupVersion{Group: "policy.networking.k8s.io", Version: "v1alpha2"}

// CNPResource is the resource's plural name.
const CNPResource = "clusternetworkpolicies"

// ClusterNetworkPolicy is a cluster-scoped policy of the Admin or the
// Baseline tier.
type ClusterNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              CNPSpec `json:"spec"`
}

// ClusterNetworkPolicyList is a list of them, as the API returns it.
type ClusterNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ClusterNetworkPolicy `json:"items"`
}

// CNPSpec is a ClusterNetworkPolicy's spec.
type CNPSpec struct {
	Tier     string           `json:"tier"` // Admin or Baseline
	Priority int32            `json:"priority"`
	Subject  CNPSubject       `json:"subject"`
	Ingress  []CNPIngressRule `json:"ingress,omitempty"`
	Egress   []CNPEgressRule  `json:"egress,omitempty"`
}

// CNPSubject is the pods a policy applies to: exactly one field is set.
type CNPSubject struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *CNPNamespacedPod     `json:"pods,omitempty"`
}

// CNPNamespacedPod selects pods by their namespace's labels and their own.
type CNPNamespacedPod struct {
	NamespaceSelector metav1.LabelSelector `json:"namespaceSelector"`
	PodSelector       metav1.LabelSelector `json:"podSelector"`
}

// CNPIngressRule is an ingress rule: Action on traffic from From.
type CNPIngressRule struct {
	Name      string           `json:"name,omitempty"`
	Action    string           `json:"action"` // Accept, Deny or Pass
	From      []CNPIngressPeer `json:"from"`
	Protocols []CNPProtocol    `json:"protocols,omitempty"`
}

// CNPEgressRule is an egress rule: Action on traffic to To.
type CNPEgressRule struct {
	Name      string          `json:"name,omitempty"`
	Action    string          `json:"action"`
	To        []CNPEgressPeer `json:"to"`
	Protocols []CNPProtocol   `json:"protocols,omitempty"`
}

// CNPIngressPeer is one source: exactly one field is set.
type CNPIngressPeer struct {
	Namespaces *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods       *CNPNamespacedPod     `json:"pods,omitempty"`
}

// CNPEgressPeer is one destination: exactly one field is set. Nodes and
// DomainNames are experimental; DomainNames is not supported here.
type CNPEgressPeer struct {
	Namespaces  *metav1.LabelSelector `json:"namespaces,omitempty"`
	Pods        *CNPNamespacedPod     `json:"pods,omitempty"`
	Nodes       *metav1.LabelSelector `json:"nodes,omitempty"`
	Networks    []string              `json:"networks,omitempty"`
	DomainNames []string              `json:"domainNames,omitempty"`
}

// CNPProtocol is one protocol a rule matches: exactly one field is set.
// DestinationNamedPort (experimental) is a container port's name, of any
// protocol.
type CNPProtocol struct {
	TCP                  *CNPProtocolPort `json:"tcp,omitempty"`
	UDP                  *CNPProtocolPort `json:"udp,omitempty"`
	SCTP                 *CNPProtocolPort `json:"sctp,omitempty"`
	DestinationNamedPort string           `json:"destinationNamedPort,omitempty"`
}

// CNPProtocolPort is the destination port of a protocol.
type CNPProtocolPort struct {
	DestinationPort *CNPPort `json:"destinationPort,omitempty"`
}

// CNPPort is a port number or an inclusive range: exactly one is set.
type CNPPort struct {
	Number int32         `json:"number,omitempty"`
	Range  *CNPPortRange `json:"range,omitempty"`
}

// CNPPortRange is an inclusive port range, Start < End.
type CNPPortRange struct {
	Start int32 `json:"start"`
	End   int32 `json:"end"`
}

// DeepCopyObject copies p through JSON: only the informer's update check
// (kubeinformer.SameButVersion) copies, once per update of a policy.
func (p *ClusterNetworkPolicy) DeepCopyObject() runtime.Object {
	return jsonCopy(p, &ClusterNetworkPolicy{})
}

// DeepCopyObject copies l through JSON.
func (l *ClusterNetworkPolicyList) DeepCopyObject() runtime.Object {
	return jsonCopy(l, &ClusterNetworkPolicyList{})
}

func jsonCopy[T runtime.Object](in, out T) runtime.Object {
	b, err := json.Marshal(in)
	if err == nil {
		err = json.Unmarshal(b, out)
	}
	if err != nil {
		panic(err) // the types are plain data: they always round-trip
	}
	return out
}

// Unstructured is p as a dynamic client writes it, with its API version
// and kind.
func (p *ClusterNetworkPolicy) Unstructured() (*unstructured.Unstructured, error) {
	obj := p.DeepCopyObject().(*ClusterNetworkPolicy)
	obj.APIVersion, obj.Kind = CNPGroupVersion.String(), "ClusterNetworkPolicy"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	return &unstructured.Unstructured{Object: m}, err
}

// cnpClient is a REST client of CNPGroupVersion that decodes into the
// types above.
func cnpClient(cfg *rest.Config) (rest.Interface, error) {
	s := runtime.NewScheme()
	s.AddKnownTypes(CNPGroupVersion, &ClusterNetworkPolicy{}, &ClusterNetworkPolicyList{})
	metav1.AddToGroupVersion(s, CNPGroupVersion)
	c := rest.CopyConfig(cfg)
	c.GroupVersion, c.APIPath = &CNPGroupVersion, "/apis"
	// Custom resources have no protobuf form.
	c.ContentType, c.AcceptContentTypes = runtime.ContentTypeJSON, runtime.ContentTypeJSON
	c.NegotiatedSerializer = serializer.NewCodecFactory(s).WithoutConversion()
	return rest.RESTClientFor(c)
}
