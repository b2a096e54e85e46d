// Package nodeipam splits the cluster CIDR into per-node blocks and hands
// them out through the datastore, which makes each batch of claims atomic.
package nodeipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"net/netip"
	"strings"

	"github.com/onc-net/onc/datastore"
)

// ErrExhausted is returned when every block of the cluster CIDR is taken.
var ErrExhausted = errors.New("cluster CIDR exhausted")

// Allocator hands out node blocks of cfg.NodePrefixLen from cfg.ClusterCIDR.
type Allocator struct {
	cfg   datastore.ClusterConfig
	store datastore.Store
}

// Validate checks a cluster configuration.
func Validate(cfg datastore.ClusterConfig) error {
	p := cfg.ClusterCIDR
	if !p.IsValid() || !p.Addr().Is4() {
		return fmt.Errorf("cluster CIDR %q: must be an IPv4 prefix", p)
	}
	if p.Masked() != p {
		return fmt.Errorf("cluster CIDR %s: host bits set (did you mean %s?)", p, p.Masked())
	}
	if cfg.NodePrefixLen < p.Bits() || cfg.NodePrefixLen > 30 {
		return fmt.Errorf("node prefix length /%d: must be between the cluster CIDR's /%d and /30", cfg.NodePrefixLen, p.Bits())
	}
	return nil
}

// New returns an allocator; cfg must be valid.
func New(cfg datastore.ClusterConfig, store datastore.Store) (*Allocator, error) {
	if err := Validate(cfg); err != nil {
		return nil, err
	}
	return &Allocator{cfg: cfg, store: store}, nil
}

// Blocks is how many node blocks the cluster CIDR holds.
func (a *Allocator) Blocks() *big.Int {
	return new(big.Int).Lsh(big.NewInt(1), uint(a.cfg.NodePrefixLen-a.cfg.ClusterCIDR.Bits()))
}

// Usage counts the cluster CIDR's node blocks that are allocated (to any
// node, registered or not) and free.
func (a *Allocator) Usage(ctx context.Context) (allocated, free uint64, err error) {
	taken, err := a.store.Allocations(ctx)
	if err != nil {
		return 0, 0, err
	}
	for p := range taken {
		if a.IsBlock(p) {
			allocated++
		}
	}
	return allocated, a.Blocks().Uint64() - allocated, nil
}

// IsBlock reports whether p is one of the cluster CIDR's node blocks.
func (a *Allocator) IsBlock(p netip.Prefix) bool {
	return p.IsValid() && p.Bits() == a.cfg.NodePrefixLen && p.Masked() == p && a.cfg.ClusterCIDR.Contains(p.Addr())
}

// block returns the i-th node block.
func (a *Allocator) block(i uint64) netip.Prefix {
	base := a.cfg.ClusterCIDR.Addr().As4()
	v := uint64(base[0])<<24 | uint64(base[1])<<16 | uint64(base[2])<<8 | uint64(base[3])
	v += i << (32 - a.cfg.NodePrefixLen)
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)}), a.cfg.NodePrefixLen)
}

// Request is a node that needs its block, and the block it would rather
// have if that is free: a pod CIDR its Kubernetes Node already carries.
type Request struct {
	Node   string
	Prefer netip.Prefix
}

// Allocate gives every requesting node its block: the one it holds, else
// its preferred block if that is a free block of the cluster CIDR, else a
// free one, the lowest first. Each round picks blocks for every node from
// one read of the allocations and claims them in one batch (ClaimCIDRs); a
// block another allocator, here or in another controller, took meanwhile
// is picked again from a fresh read. So concurrent allocators never give
// one block twice, and a node keeps its block until it is released.
// It returns each node's block, and an ErrExhausted error naming the nodes
// left without one.
func (a *Allocator) Allocate(ctx context.Context, reqs []Request) (map[string]netip.Prefix, error) {
	out := make(map[string]netip.Prefix, len(reqs))
	var full []Request
	for len(reqs) > 0 {
		taken, err := a.store.Allocations(ctx)
		if err != nil {
			return out, err
		}
		claims, none := a.pick(taken, reqs)
		full = append(full, none...)
		if len(claims) == 0 {
			break
		}
		got, err := a.store.ClaimCIDRs(ctx, claims)
		maps.Copy(out, got)
		if err != nil {
			return out, err
		}
		var lost []Request
		for _, r := range reqs {
			_, claimed := claims[r.Node]
			if _, ok := got[r.Node]; claimed && !ok {
				lost = append(lost, r)
			}
		}
		reqs = lost
	}
	if len(full) > 0 {
		return out, fmt.Errorf("no pod CIDR for %s: %w: all %s blocks of /%d in %s are allocated",
			nodeNames(full), ErrExhausted, a.Blocks(), a.cfg.NodePrefixLen, a.cfg.ClusterCIDR)
	}
	return out, nil
}

// pick chooses every request's block from one read of the allocations:
// the block the node holds, else its preferred block if free, else the
// lowest free ones in turn. Preferences go first, so that no other node of
// the batch takes a block a node already carries. It returns node → block
// and the requests left without one (every block is taken).
func (a *Allocator) pick(taken map[netip.Prefix]string, reqs []Request) (map[string]netip.Prefix, []Request) {
	held := make(map[string]netip.Prefix, len(taken))
	for p, owner := range taken {
		held[owner] = p
	}
	picked := map[netip.Prefix]bool{}
	free := func(p netip.Prefix) bool { _, t := taken[p]; return !t && !picked[p] }
	claims := make(map[string]netip.Prefix, len(reqs))
	var rest, none []Request
	for _, r := range reqs {
		if p, ok := held[r.Node]; ok {
			claims[r.Node] = p
		} else if a.IsBlock(r.Prefer) && free(r.Prefer) {
			claims[r.Node], picked[r.Prefer] = r.Prefer, true
		} else {
			rest = append(rest, r)
		}
	}
	next, n := uint64(0), a.Blocks().Uint64()
	for _, r := range rest {
		for next < n && !free(a.block(next)) {
			next++
		}
		if next == n {
			none = append(none, r)
			continue
		}
		claims[r.Node], picked[a.block(next)] = a.block(next), true
	}
	return claims, none
}

// nodeNames names the nodes of reqs, the first few of many.
func nodeNames(reqs []Request) string {
	const most = 5
	var names []string
	for _, r := range reqs[:min(len(reqs), most)] {
		names = append(names, r.Node)
	}
	switch {
	case len(reqs) == 1:
		return "node " + names[0]
	case len(reqs) > most:
		return fmt.Sprintf("%d nodes (%s, …)", len(reqs), strings.Join(names, ", "))
	}
	return "nodes " + strings.Join(names, ", ")
}
