package k8sstore

// Nodes: the ONCNode custom resource (one per node, holding its tunnel
// endpoint and pod CIDRs) and the reads and writes on it.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sort"
	"strings"

	"github.com/onc-net/onc/datastore"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Group and version of ONC's custom resources (manifests/onc.yaml).
const (
	Group   = "onc.io"
	Version = "v1alpha1"
)

// ONCNodes is the ONCNode resource: one cluster-scoped object per node,
// named after it, holding its tunnel endpoint.
var ONCNodes = schema.GroupVersionResource{Group: Group, Version: Version, Resource: "oncnodes"}

// oncNode mirrors the CRD's schema. The agent writes nodeIP, vtepMAC,
// fastPath and peerPin; the controller writes podCIDRs, one per family in the
// cluster's family order, and podCIDR, the first of them, which is all an
// agent before IPv6 reads. Liveness is in a Lease.
type oncNode struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              oncNodeSpec `json:"spec"`
}

type oncNodeSpec struct {
	NodeIP   string   `json:"nodeIP,omitempty"`
	VTEPMAC  string   `json:"vtepMAC,omitempty"`
	PodCIDR  string   `json:"podCIDR,omitempty"`
	PodCIDRs []string `json:"podCIDRs,omitempty"`
	FastPath bool     `json:"fastPath"`
	PeerPin  string   `json:"peerPin,omitempty"`
}

// podCIDRsOf reads a record's blocks: spec.podCIDRs while its first is
// spec.podCIDR, else spec.podCIDR alone, as a controller before IPv6,
// which knows only that field, left it.
func podCIDRsOf(spec oncNodeSpec) ([]netip.Prefix, error) {
	list := spec.PodCIDRs
	if len(list) == 0 || list[0] != spec.PodCIDR {
		list = nil
		if spec.PodCIDR != "" {
			list = []string{spec.PodCIDR}
		}
	}
	var out []netip.Prefix
	for _, c := range list {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return nil, fmt.Errorf("spec.podCIDRs: %w", err)
		}
		out = append(out, p)
	}
	return out, nil
}

// typedONCNode is the ONCNode informer's transform: each object is
// converted once, as it arrives, rather than at every read (the controller
// and every agent list them all at each reconcile: at 5,000 nodes a
// conversion of all costs some 30 ms). One that does not convert stays
// unstructured, and readers skip it, saying why.
func typedONCNode(obj any) (any, error) {
	if n, err := fromUnstructured(obj); err == nil {
		return n, nil
	}
	return obj, nil // malformed, or a tombstone
}

// cachedONCNode is an object of the ONCNode cache.
func cachedONCNode(obj any) (*oncNode, error) {
	if n, ok := obj.(*oncNode); ok {
		return n, nil
	}
	return fromUnstructured(obj)
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

func validName(name string) error {
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("invalid node name %q: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

func (s *Store) RegisterNode(ctx context.Context, spec datastore.NodeSpec) error {
	if err := validName(spec.Name); err != nil {
		return err
	}
	fields := map[string]any{"nodeIP": spec.IP.String(), "vtepMAC": spec.VTEPMAC.String(), "fastPath": spec.FastPath, "peerPin": spec.PeerPin}
	if spec.PeerPin == "" {
		fields["peerPin"] = nil // a merge patch's null removes it
	}
	// The cache says which write registers: a patch of the node's record,
	// or, on a node's first start, its creation (a cluster's start makes
	// thousands at once: no request spent on a patch that finds nothing).
	// One made or deleted meanwhile by another writer turns one into the
	// other.
	_, cached, _ := s.oncInf.GetStore().GetByKey(spec.Name)
	create := !cached
	for {
		var rv string
		var err error
		if create {
			rv, err = s.createONCNode(ctx, spec)
		} else {
			rv, err = s.patchONCNode(ctx, spec.Name, map[string]any{"spec": fields})
		}
		switch {
		case create && apierrors.IsAlreadyExists(err), !create && apierrors.IsNotFound(err):
			create = !create
		case err != nil:
			return err
		default:
			return s.awaitCache(ctx, s.oncInf, spec.Name, rv)
		}
	}
}

// createONCNode creates a node's record and returns its resourceVersion.
// A new record has no pod CIDR: the controller mirrors the node's blocks
// into it, also ones it had before.
func (s *Store) createONCNode(ctx context.Context, spec datastore.NodeSpec) (string, error) {
	n := &oncNode{ObjectMeta: metav1.ObjectMeta{Name: spec.Name, Labels: map[string]string{"app.kubernetes.io/part-of": "onc"}},
		Spec: oncNodeSpec{NodeIP: spec.IP.String(), VTEPMAC: spec.VTEPMAC.String(), FastPath: spec.FastPath, PeerPin: spec.PeerPin}}
	u, err := toUnstructured(n)
	if err != nil {
		return "", err
	}
	created, err := s.dyn.Resource(ONCNodes).Create(ctx, u, metav1.CreateOptions{})
	if err != nil {
		return "", err
	}
	return created.GetResourceVersion(), nil
}

// patchONCNode merge-patches an ONCNode and returns its resourceVersion.
func (s *Store) patchONCNode(ctx context.Context, name string, patch map[string]any) (string, error) {
	body, err := json.Marshal(patch)
	if err != nil {
		return "", err
	}
	u, err := s.dyn.Resource(ONCNodes).Patch(ctx, name, types.MergePatchType, body, metav1.PatchOptions{})
	if err != nil {
		return "", err
	}
	return u.GetResourceVersion(), nil
}

// getONCNode reads a node's record past the cache; nil if there is none.
func (s *Store) getONCNode(ctx context.Context, name string) (*oncNode, error) {
	u, err := s.dyn.Resource(ONCNodes).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("get ONCNode %s: %w", name, err)
	}
	return fromUnstructured(u)
}

func (s *Store) DeleteNode(ctx context.Context, name string) error {
	err := s.dyn.Resource(ONCNodes).Delete(ctx, name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	if err := s.awaitCache(ctx, s.oncInf, name, ""); err != nil {
		return err
	}
	if err := s.ReleaseCIDR(ctx, name); err != nil {
		return err
	}
	return s.deleteLease(ctx, name)
}

// Unregistered reads the ONCNode from the API server, past the cache,
// which can lag behind the ledger's: is it gone, or without the endpoint
// its agent publishes?
func (s *Store) Unregistered(ctx context.Context, name string) (bool, error) {
	u, err := s.dyn.Resource(ONCNodes).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return true, nil
	case err != nil:
		return false, fmt.Errorf("get ONCNode %s: %w", name, err)
	}
	ip, _, _ := unstructured.NestedString(u.Object, "spec", "nodeIP")
	return ip == "", nil
}

// Nodes lists the registered nodes: ONCNodes whose agent has published
// its endpoint (an ONCNode can exist with only pod CIDRs). The pod CIDRs
// are the ONCNode's copy, which the controller keeps equal to the ledgers'.
func (s *Store) Nodes(context.Context) ([]datastore.Node, error) {
	var out []datastore.Node
	for _, obj := range s.oncInf.GetStore().List() {
		n, err := cachedONCNode(obj)
		if err != nil {
			slog.Warn("ignoring malformed ONCNode", "err", err)
			continue
		}
		dn, err := toNode(n)
		if err != nil {
			slog.Warn("ignoring malformed ONCNode", "node", n.Name, "err", err)
			continue
		}
		if dn != nil {
			out = append(out, *dn)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (s *Store) Node(ctx context.Context, name string) (datastore.Node, error) {
	obj, ok, _ := s.oncInf.GetStore().GetByKey(name)
	if !ok {
		return datastore.Node{}, datastore.ErrNotFound
	}
	n, err := cachedONCNode(obj)
	if err != nil {
		return datastore.Node{}, err
	}
	dn, err := toNode(n)
	if err != nil {
		return datastore.Node{}, fmt.Errorf("ONCNode %s: %w", name, err)
	}
	if dn == nil {
		return datastore.Node{}, datastore.ErrNotFound
	}
	return *dn, nil
}

// toNode converts a registered ONCNode; nil if its agent never registered.
func toNode(n *oncNode) (*datastore.Node, error) {
	if n.Spec.NodeIP == "" {
		return nil, nil
	}
	cidrs, err := podCIDRsOf(n.Spec)
	if err != nil {
		return nil, err
	}
	ip, err := netip.ParseAddr(n.Spec.NodeIP)
	if err != nil {
		return nil, fmt.Errorf("spec.nodeIP: %w", err)
	}
	mac, err := net.ParseMAC(n.Spec.VTEPMAC)
	if err != nil {
		return nil, fmt.Errorf("spec.vtepMAC: %w", err)
	}
	return &datastore.Node{
		NodeSpec: datastore.NodeSpec{Name: n.Name, IP: ip, VTEPMAC: mac, FastPath: n.Spec.FastPath, PeerPin: n.Spec.PeerPin},
		PodCIDRs: cidrs,
	}, nil
}
