// Package datastore is the control plane's state: cluster configuration,
// node registrations (tunnel endpoints), per-node pod CIDRs and node
// liveness. The controller allocates CIDRs through it; agents register
// their node and watch their peers through it. Backends: etcd (etcdstore)
// and Kubernetes (k8sstore).
package datastore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"
)

// ErrNotFound is returned when a node or the cluster config does not exist.
var ErrNotFound = errors.New("not found")

// ErrCIDRTaken is returned by ClaimCIDR when another node holds the block.
var ErrCIDRTaken = errors.New("CIDR already allocated to another node")

// ClusterConfig is written once by the controller and read by every agent.
type ClusterConfig struct {
	ClusterCIDR   netip.Prefix `json:"clusterCIDR"`
	NodePrefixLen int          `json:"nodePrefixLen"`
}

// NodeSpec is what an agent publishes about its node.
type NodeSpec struct {
	Name     string           `json:"name"`
	IP       netip.Addr       `json:"ip"`
	VTEPMAC  net.HardwareAddr `json:"-"`
	FastPath bool             `json:"fastPath"`
}

// Node is a node's full tunnel-endpoint record: its spec and the pod CIDR
// the controller gave it (invalid until allocated). Liveness is not part of
// it: a record changes only when a tunnel endpoint does, so an agent's
// heartbeat never wakes the other agents.
type Node struct {
	NodeSpec
	PodCIDR netip.Prefix
}

// Store is the datastore. Every method is safe for concurrent use.
type Store interface {
	// PutClusterConfig stores cfg, or verifies that the stored one equals
	// it: the cluster CIDR cannot change under a running cluster.
	PutClusterConfig(ctx context.Context, cfg ClusterConfig) error
	ClusterConfig(ctx context.Context) (ClusterConfig, error)

	// RegisterNode creates or updates the node's spec. It leaves the node's
	// pod CIDR alone.
	RegisterNode(ctx context.Context, spec NodeSpec) error
	// KeepAlive marks the node alive until ctx ends or the process dies
	// (plus ttl). It blocks; it returns ctx.Err() or a datastore error.
	// Renewals are not changes: they signal nobody.
	KeepAlive(ctx context.Context, name string, ttl time.Duration) error
	// Liveness reports which nodes' agents hold their liveness lease now.
	// It is read on demand (onctl peers, the controller's node timeout).
	Liveness(ctx context.Context) (map[string]bool, error)
	// DeleteNode removes the node's registration, liveness and CIDR.
	DeleteNode(ctx context.Context, name string) error

	// ClaimCIDRs makes a batch of claims (node → block) atomically, each
	// as ClaimCIDR would: a node that has a CIDR keeps it, a block another
	// node holds stays that node's, the others are given. It returns the
	// CIDR each claimed node holds afterwards; a node whose block was taken
	// is absent. A batch costs what one claim does: one compare-and-swap of
	// the Kubernetes ledger, one etcd transaction per 64 claims.
	ClaimCIDRs(ctx context.Context, claims map[string]netip.Prefix) (map[string]netip.Prefix, error)
	// ClaimCIDR atomically gives cidr to node if neither the node nor the
	// block has an allocation. If the node already has a CIDR it returns
	// that one (allocation is idempotent); if the block is another node's
	// it returns ErrCIDRTaken.
	ClaimCIDR(ctx context.Context, node string, cidr netip.Prefix) (netip.Prefix, error)
	// ReleaseCIDR frees the node's CIDR, if it has one.
	ReleaseCIDR(ctx context.Context, node string) error
	// Allocations maps every allocated block to its node, registered or not.
	Allocations(ctx context.Context) (map[netip.Prefix]string, error)

	// Nodes lists every registered node.
	Nodes(ctx context.Context) ([]Node, error)
	// Node returns one registered node or ErrNotFound.
	Node(ctx context.Context, name string) (Node, error)
	// Changes signals (coalesced, never blocking the store) whenever any
	// node record or allocation changes, and once as soon as it watches:
	// every change after that first signal is signalled. Liveness does not
	// signal. It is closed when ctx ends. Consumers re-read what they need:
	// it is a level trigger.
	Changes(ctx context.Context) <-chan struct{}

	// Describe names the backend and where it is, for status output.
	Describe() string
	Close() error
}

// ClaimOne is ClaimCIDR made of a backend's ClaimCIDRs.
func ClaimOne(ctx context.Context, s interface {
	ClaimCIDRs(context.Context, map[string]netip.Prefix) (map[string]netip.Prefix, error)
}, node string, cidr netip.Prefix) (netip.Prefix, error) {
	got, err := s.ClaimCIDRs(ctx, map[string]netip.Prefix{node: cidr})
	if p, ok := got[node]; ok || err != nil {
		return p, err
	}
	return netip.Prefix{}, fmt.Errorf("%s for %s: %w", cidr, node, ErrCIDRTaken)
}

// CachedRegistrations is implemented by backends whose Nodes reads a cache
// that can lag behind Allocations (Kubernetes: each resource has a watch of
// its own, so a block claimed for a node that registered a moment ago can
// show before the node does). The controller frees the block of a node
// Nodes does not list only once Unregistered confirms it past the cache.
type CachedRegistrations interface {
	Unregistered(ctx context.Context, name string) (bool, error)
}

// Membership is implemented by backends that know the cluster's nodes apart
// from ONC's registrations (Kubernetes Nodes). The controller deletes the
// registration and CIDR of a node that left the cluster at once, instead of
// after the node timeout, and gives a node the pod CIDR it already carries
// (set before ONC was installed) when that block is free.
type Membership interface {
	// ClusterNodes maps every node of the cluster to the pod CIDR it
	// carries (the zero Prefix if none).
	ClusterNodes(ctx context.Context) (map[string]netip.Prefix, error)
	// NodeGone confirms, past any cache, that the cluster has no node
	// name: ClusterNodes may not show a node created a moment ago.
	NodeGone(ctx context.Context, name string) (bool, error)
}
