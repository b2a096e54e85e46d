// Package nodeipam splits each pool of the cluster (one per family) into
// per-node blocks and hands them out through the datastore, which makes
// each batch of claims atomic.
package nodeipam

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/big"
	"net/netip"
	"strings"

	"github.com/onc-net/onc/datastore"
)

// ErrExhausted is returned when every block of the cluster CIDR is taken.
var ErrExhausted = errors.New("cluster CIDR exhausted")

// Allocator hands out node blocks of pool.NodePrefixLen from pool.CIDR.
type Allocator struct {
	pool  datastore.Pool
	base  *big.Int // the pool's first address
	store datastore.Store
}

// Validate checks a cluster configuration: a pool or two, of different
// families. Its errors name the flags (and onc-config keys) that set it.
func Validate(cfg datastore.ClusterConfig) error {
	if len(cfg.Pools) == 0 {
		return errors.New("--cluster-cidr: no range given")
	}
	seen := map[datastore.Family]netip.Prefix{}
	for _, p := range cfg.Pools {
		if err := validatePool(p); err != nil {
			return err
		}
		f := datastore.FamilyOf(p.CIDR)
		if other, dup := seen[f]; dup {
			return fmt.Errorf("--cluster-cidr %s,%s: two %s ranges; give at most one per family", other, p.CIDR, f)
		}
		seen[f] = p.CIDR
	}
	return nil
}

// Each family's smallest node block: room for a few pods besides the
// gateway (IPv4 also loses the network and broadcast addresses).
const (
	longestIPv4NodePrefix = 30
	longestIPv6NodePrefix = 120
)

func validatePool(p datastore.Pool) error {
	c := p.CIDR
	switch {
	case !c.IsValid():
		return errors.New("--cluster-cidr: not a prefix")
	case c.Addr().Is4In6():
		return fmt.Errorf("--cluster-cidr %s: an IPv4-mapped IPv6 range; give an IPv4 range in IPv4 form", c)
	case c.Masked() != c:
		return fmt.Errorf("--cluster-cidr %s: host bits set (did you mean %s?)", c, c.Masked())
	}
	flag, longest := "--node-prefix-len", longestIPv4NodePrefix
	if datastore.FamilyOf(c) == datastore.IPv6 {
		flag, longest = "--node-prefix-len-ipv6", longestIPv6NodePrefix
	}
	if p.NodePrefixLen < c.Bits() || p.NodePrefixLen > longest {
		return fmt.Errorf("%s /%d: must be between the cluster CIDR %s's /%d and /%d", flag, p.NodePrefixLen, c, c.Bits(), longest)
	}
	return nil
}

// New returns an allocator of one pool of the cluster; pool must be valid.
func New(pool datastore.Pool, store datastore.Store) (*Allocator, error) {
	if err := validatePool(pool); err != nil {
		return nil, err
	}
	return &Allocator{pool: pool, base: new(big.Int).SetBytes(pool.CIDR.Addr().AsSlice()), store: store}, nil
}

// Family is the family of the pool's blocks.
func (a *Allocator) Family() datastore.Family { return datastore.FamilyOf(a.pool.CIDR) }

// Blocks is how many node blocks the pool holds: up to 2^120 in IPv6.
func (a *Allocator) Blocks() *big.Int {
	return new(big.Int).Lsh(big.NewInt(1), uint(a.pool.NodePrefixLen-a.pool.CIDR.Bits()))
}

// Usage counts the pool's node blocks that are allocated in taken (to
// any node, registered or not) and free, as metrics do: in float64,
// which holds the count of a /8's /120 blocks as well as it can.
func (a *Allocator) Usage(taken map[netip.Prefix]string) (allocated, free float64) {
	n := 0
	for p := range taken {
		if a.IsBlock(p) {
			n++
		}
	}
	f, _ := new(big.Int).Sub(a.Blocks(), big.NewInt(int64(n))).Float64()
	return float64(n), f
}

// IsBlock reports whether p is one of the pool's node blocks.
func (a *Allocator) IsBlock(p netip.Prefix) bool {
	return p.IsValid() && p.Bits() == a.pool.NodePrefixLen && p.Masked() == p && a.pool.CIDR.Contains(p.Addr())
}

// block returns the i-th node block (i < Blocks()). The offset is i
// shifted by the block's host bits: 2^64 and beyond for IPv6 /64 blocks,
// so the sum is a big.Int.
func (a *Allocator) block(i uint64) netip.Prefix {
	bits := a.pool.CIDR.Addr().BitLen()
	v := new(big.Int).Lsh(new(big.Int).SetUint64(i), uint(bits-a.pool.NodePrefixLen))
	addr, _ := netip.AddrFromSlice(v.Add(v, a.base).FillBytes(make([]byte, bits/8)))
	return netip.PrefixFrom(addr, a.pool.NodePrefixLen)
}

// Request is a node that needs its block, and the block it would rather
// have if that is free: a pod CIDR its Kubernetes Node already carries.
type Request struct {
	Node   string
	Prefer netip.Prefix
}

// Allocate gives every requesting node its block of the pool's family:
// the one it holds, else
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
		return out, fmt.Errorf("no %s pod CIDR for %s: %w: all %s blocks of /%d in %s are allocated",
			a.Family(), nodeNames(full), ErrExhausted, a.Blocks(), a.pool.NodePrefixLen, a.pool.CIDR)
	}
	return out, nil
}

// pick chooses every request's block from one read of the allocations:
// the block of the pool's family the node holds, else its preferred block
// if free, else the lowest free ones in turn. Preferences go first, so
// that no other node of the batch takes a block a node already carries.
// It returns node → block and the requests left without one (every block
// is taken).
func (a *Allocator) pick(taken map[netip.Prefix]string, reqs []Request) (map[string]netip.Prefix, []Request) {
	held := make(map[string]netip.Prefix, len(taken))
	for p, owner := range taken {
		if datastore.FamilyOf(p) == a.Family() {
			held[owner] = p
		}
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
	// The scan stops at the first free block, so it never counts past
	// the taken ones: a uint64 index is plenty, even where the pool holds
	// more blocks than that counts.
	next, n := uint64(0), uint64(math.MaxUint64)
	if b := a.Blocks(); b.IsUint64() {
		n = b.Uint64()
	}
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
