// Package nodeipam splits the cluster CIDR into per-node blocks and hands
// them out through the datastore, which makes each claim atomic.
package nodeipam

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"net/netip"

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

// Allocate returns node's block, claiming one if it has none: prefer if it
// is a free block of the cluster CIDR (a pod CIDR the node already carries),
// else the first free one. Concurrent callers, in this process or others,
// never get the same block, and the same node always gets the same block
// until it is released.
func (a *Allocator) Allocate(ctx context.Context, node string, prefer netip.Prefix) (netip.Prefix, error) {
	if a.IsBlock(prefer) {
		got, err := a.store.ClaimCIDR(ctx, node, prefer)
		if !errors.Is(err, datastore.ErrCIDRTaken) {
			return got, err
		}
	}
	for {
		taken, err := a.store.Allocations(ctx)
		if err != nil {
			return netip.Prefix{}, err
		}
		for p, owner := range taken {
			if owner == node {
				return p, nil
			}
		}
		free, ok := a.firstFree(taken)
		if !ok {
			return netip.Prefix{}, fmt.Errorf("node %s: %w: all %s blocks of /%d in %s are allocated",
				node, ErrExhausted, a.Blocks(), a.cfg.NodePrefixLen, a.cfg.ClusterCIDR)
		}
		got, err := a.store.ClaimCIDR(ctx, node, free)
		if errors.Is(err, datastore.ErrCIDRTaken) {
			continue // lost a race for this block: read again
		}
		return got, err
	}
}

func (a *Allocator) firstFree(taken map[netip.Prefix]string) (netip.Prefix, bool) {
	n := a.Blocks()
	for i := uint64(0); n.Cmp(new(big.Int).SetUint64(i)) > 0; i++ {
		if p := a.block(i); taken[p] == "" {
			return p, true
		}
	}
	return netip.Prefix{}, false
}
