package k8sstore

import (
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group and version of ONC's custom resources (manifests/onc.yaml).
const (
	Group   = "onc.io"
	Version = "v1alpha1"
)

// oncNodes is the ONCNode resource: one cluster-scoped object per node,
// named after it, holding its tunnel endpoint.
var oncNodes = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "oncnodes"}

// oncNode mirrors the CRD's schema. The agent writes nodeIP, vtepMAC and
// fastPath and the heartbeat; the controller writes podCIDR.
type oncNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              oncNodeSpec   `json:"spec"`
	Status            oncNodeStatus `json:"status"`
}

type oncNodeSpec struct {
	NodeIP   string `json:"nodeIP,omitempty"`
	VTEPMAC  string `json:"vtepMAC,omitempty"`
	PodCIDR  string `json:"podCIDR,omitempty"`
	FastPath bool   `json:"fastPath"`
}

type oncNodeStatus struct {
	// HeartbeatTime (RFC 3339) is renewed by the node's agent; the node
	// counts as alive until HeartbeatTime + HeartbeatTTLSeconds.
	HeartbeatTime       string `json:"heartbeatTime,omitempty"`
	HeartbeatTTLSeconds int64  `json:"heartbeatTTLSeconds,omitempty"`
}

func (n *oncNode) alive(now time.Time) bool {
	exp, ok := n.expiry()
	return ok && now.Before(exp)
}

// expiry is when the node's heartbeat runs out; false if it has none.
func (n *oncNode) expiry() (time.Time, bool) {
	t, err := time.Parse(time.RFC3339Nano, n.Status.HeartbeatTime)
	if err != nil || n.Status.HeartbeatTTLSeconds <= 0 {
		return time.Time{}, false
	}
	return t.Add(time.Duration(n.Status.HeartbeatTTLSeconds) * time.Second), true
}

func fromUnstructured(obj any) (*oncNode, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, fmt.Errorf("unexpected %T in the ONCNode cache", obj)
	}
	n := &oncNode{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, n); err != nil {
		return nil, fmt.Errorf("ONCNode %s: %w", u.GetName(), err)
	}
	return n, nil
}

func toUnstructured(n *oncNode) (*unstructured.Unstructured, error) {
	n.APIVersion, n.Kind = Group+"/"+Version, "ONCNode"
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(n)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}
