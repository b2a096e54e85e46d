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
	"slices"
	"strings"
	"time"
)

// ErrNotFound is returned when a node or the cluster config does not exist.
var ErrNotFound = errors.New("not found")

// ErrCIDRTaken is returned by ClaimCIDR when another node holds the block.
var ErrCIDRTaken = errors.New("CIDR already allocated to another node")

// Family is an address family: IPv4 or IPv6.
type Family int

const (
	IPv4 Family = 4
	IPv6 Family = 6
)

// Families are both families, IPv4 first.
var Families = [...]Family{IPv4, IPv6}

// FamilyOf is p's family. An IPv4-mapped IPv6 prefix is IPv6, as its
// bits are (nodeipam refuses one as a pool).
func FamilyOf(p netip.Prefix) Family {
	if p.Addr().Is4() {
		return IPv4
	}
	return IPv6
}

// String is the family's name as flags, logs and metric labels show it.
func (f Family) String() string {
	if f == IPv4 {
		return "ipv4"
	}
	return "ipv6"
}

// Pool is one family's range of pod addresses, split into node blocks.
type Pool struct {
	CIDR          netip.Prefix
	NodePrefixLen int
}

func (p Pool) String() string {
	return fmt.Sprintf("cluster CIDR %s in /%d node blocks", p.CIDR, p.NodePrefixLen)
}

// ClusterConfig is written by the controller and read by every agent:
// at most one pool per family, in the cluster's family order (the
// primary first), as kube-controller-manager's --cluster-cidr.
type ClusterConfig struct {
	Pools []Pool
}

// IPv4 is the IPv4 pool; the zero Pool if the cluster has none.
func (c ClusterConfig) IPv4() Pool { return c.PoolOf(IPv4) }

// PoolOf is the pool of family f; the zero Pool if the cluster has none.
func (c ClusterConfig) PoolOf(f Family) Pool {
	for _, p := range c.Pools {
		if FamilyOf(p.CIDR) == f {
			return p
		}
	}
	return Pool{}
}

func (c ClusterConfig) Equal(o ClusterConfig) bool { return slices.Equal(c.Pools, o.Pools) }

func (c ClusterConfig) String() string {
	var s []string
	for _, p := range c.Pools {
		s = append(s, p.String())
	}
	if len(s) == 0 {
		return "no pool"
	}
	return strings.Join(s, " and ")
}

// Extend returns the configuration to record when want is put over c,
// the recorded one (where says where it is): want itself if c is empty
// or a start of it, so that a single-stack cluster may add the other
// family, as Kubernetes allows. A recorded pool never changes, nor the
// family order: nodes hold blocks of it.
func (c ClusterConfig) Extend(want ClusterConfig, where string) (ClusterConfig, error) {
	if len(want.Pools) >= len(c.Pools) && slices.Equal(c.Pools, want.Pools[:len(c.Pools)]) {
		return want, nil
	}
	return c, fmt.Errorf("the cluster was set up with %s (%s); this controller is configured for %s: the cluster CIDR cannot change under a running cluster (only the other family may be added)",
		c, where, want)
}

// InFamilyOrder sorts blocks, at most one per family, in the cluster's
// family order: the primary pool's family first, IPv4 first if the
// cluster has no pool yet.
func (c ClusterConfig) InFamilyOrder(blocks []netip.Prefix) []netip.Prefix {
	first := IPv4
	if len(c.Pools) > 0 {
		first = FamilyOf(c.Pools[0].CIDR)
	}
	rank := func(p netip.Prefix) int {
		if FamilyOf(p) == first {
			return 0
		}
		return 1
	}
	return slices.SortedStableFunc(slices.Values(blocks), func(a, b netip.Prefix) int { return rank(a) - rank(b) })
}

// BlockOf returns the block of family f among blocks, if any.
func BlockOf(blocks []netip.Prefix, f Family) netip.Prefix {
	for _, p := range blocks {
		if FamilyOf(p) == f {
			return p
		}
	}
	return netip.Prefix{}
}

// EncodeBlock writes a block as a key: ConfigMap keys allow only
// [-._a-zA-Z0-9], so '/' becomes '-' and ':' '_' (neither appears in an
// address's text, so ParseBlock reads it back exactly). An IPv4 block's
// key is what every release wrote: 10.244.1.0-24.
func EncodeBlock(p netip.Prefix) string { return blockEncoder.Replace(p.String()) }

// ParseBlock reads a key EncodeBlock wrote.
func ParseBlock(key string) (netip.Prefix, error) {
	return netip.ParsePrefix(blockDecoder.Replace(key))
}

var (
	blockEncoder = strings.NewReplacer("/", "-", ":", "_")
	blockDecoder = strings.NewReplacer("-", "/", "_", ":")
)

// NodeSpec is what an agent publishes about its node.
type NodeSpec struct {
	Name     string           `json:"name"`
	IP       netip.Addr       `json:"ip"`
	VTEPMAC  net.HardwareAddr `json:"-"`
	FastPath bool             `json:"fastPath"`
	// PeerPin is the SHA-256 of the agent's peer key (its
	// SubjectPublicKeyInfo), base64: other agents accept that key, and
	// only it, as this node's on the peer API (agent/peer). Empty for an
	// agent without it.
	PeerPin string `json:"peerPin,omitempty"`
}

// Node is a node's full tunnel-endpoint record: its spec and the pod
// CIDRs the controller gave it, one per family in the cluster's family
// order, as Node.spec.podCIDRs (none until allocated). Liveness is not
// part of it: a record changes only when a tunnel endpoint does, so an
// agent's heartbeat never wakes the other agents.
type Node struct {
	NodeSpec
	PodCIDRs []netip.Prefix
}

// IPv4PodCIDR is the node's IPv4 block, invalid if it has none: what the
// agent and the datapath, IPv4 only so far, use.
func (n Node) IPv4PodCIDR() netip.Prefix { return BlockOf(n.PodCIDRs, IPv4) }

// Store is the datastore. Every method is safe for concurrent use.
type Store interface {
	// PutClusterConfig stores cfg, or verifies that the stored one is
	// cfg or a start of it (ClusterConfig.Extend): a pool cannot change
	// under a running cluster, but a single-stack one may add the other
	// family. It refuses a change naming what is recorded.
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
	// DeleteNode removes the node's registration, liveness and CIDRs.
	DeleteNode(ctx context.Context, name string) error

	// ClaimCIDRs makes a batch of claims (node → block) atomically per
	// family, each claim within its block's family: a node that holds a
	// block of that family keeps it, a block another node holds stays
	// that node's, the others are given. A node holds at most one block
	// per family. It returns the block of the claimed family each claimed
	// node holds afterwards; a node whose block was taken is absent. A
	// batch costs what one claim does: one compare-and-swap of each
	// family's Kubernetes ledger it touches, one etcd transaction per 64
	// claims.
	ClaimCIDRs(ctx context.Context, claims map[string]netip.Prefix) (map[string]netip.Prefix, error)
	// ReleaseCIDR frees all of the node's blocks, if it has any.
	ReleaseCIDR(ctx context.Context, node string) error
	// Allocations maps every allocated block, of both families, to its
	// node, registered or not.
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

// ClaimCIDR atomically gives cidr to node unless the node holds a block
// of cidr's family or the block is another node's: a batch of one. If
// the node holds a block of the family it returns that one (allocation
// is idempotent); if the block is another node's, ErrCIDRTaken.
func ClaimCIDR(ctx context.Context, s Store, node string, cidr netip.Prefix) (netip.Prefix, error) {
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
	// ClusterNodes maps every node of the cluster to the pod CIDRs it
	// carries (none if none), as Node.spec.podCIDRs.
	ClusterNodes(ctx context.Context) (map[string][]netip.Prefix, error)
	// NodeGone confirms, past any cache, that the cluster has no node
	// name: ClusterNodes may not show a node created a moment ago.
	NodeGone(ctx context.Context, name string) (bool, error)
}
