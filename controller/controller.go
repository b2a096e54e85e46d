// Package controller is onc-controller: cluster NodeIPAM. It gives every
// registered node a pod CIDR of each of the cluster's pools (one per
// family), frees the CIDRs of a node that is removed, and removes nodes
// whose agent has been gone for longer than NodeTimeout or, on
// Kubernetes, whose Node object was deleted.
package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"time"

	"github.com/onc-net/onc/controller/nodeipam"
	"github.com/onc-net/onc/datastore"
)

// Config of the controller.
type Config struct {
	Cluster datastore.ClusterConfig
	// NodeTimeout: a node whose agent has not held its liveness lease for
	// this long is deleted and its CIDRs freed. 0 keeps nodes forever.
	NodeTimeout time.Duration
	// Resync is how often the controller re-reads everything even without
	// a change notification (liveness timeouts need a clock).
	Resync time.Duration
	// Metrics are where it reports (NewMetrics); nil: metrics of its own,
	// served nowhere.
	Metrics *Metrics
}

// Controller reconciles node CIDRs.
type Controller struct {
	cfg      Config
	store    datastore.Store
	allocs   []*nodeipam.Allocator // one per pool, in the cluster's family order
	lastSeen map[string]time.Time  // last seen alive, or first seen
	// nextExpiry is when the first node not seen alive would time out: the
	// clock, not the datastore, says when to look again.
	nextExpiry time.Time
}

// New validates cfg and records the cluster configuration in the store
// (or checks it matches what is there, or adds the other family to it).
func New(ctx context.Context, cfg Config, store datastore.Store) (*Controller, error) {
	allocs, err := allocators(cfg.Cluster, store)
	if err != nil {
		return nil, err
	}
	if err := store.PutClusterConfig(ctx, cfg.Cluster); err != nil {
		return nil, err
	}
	if cfg.Resync == 0 {
		cfg.Resync = 30 * time.Second
	}
	if cfg.Metrics == nil {
		if cfg.Metrics, err = NewMetrics(cfg.Cluster, store); err != nil {
			return nil, err
		}
	}
	return &Controller{cfg: cfg, store: store, allocs: allocs, lastSeen: map[string]time.Time{}}, nil
}

// allocators validates cluster and makes an allocator of each pool.
func allocators(cluster datastore.ClusterConfig, store datastore.Store) ([]*nodeipam.Allocator, error) {
	if err := nodeipam.Validate(cluster); err != nil {
		return nil, err
	}
	var allocs []*nodeipam.Allocator
	for _, p := range cluster.Pools {
		a, err := nodeipam.New(p, store)
		if err != nil {
			return nil, err
		}
		allocs = append(allocs, a)
	}
	return allocs, nil
}

// Run reconciles until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.cfg.Metrics.leader.Set(1)
	defer c.cfg.Metrics.leader.Set(0)
	changes := c.store.Changes(ctx)
	tick := time.NewTicker(c.cfg.Resync)
	defer tick.Stop()
	expiry := time.NewTimer(time.Hour)
	defer expiry.Stop()
	for {
		if err := c.Reconcile(ctx); err != nil && ctx.Err() == nil {
			c.cfg.Metrics.storeErrors.Inc()
			slog.Error("reconcile failed; retrying", "err", err)
		}
		next := c.cfg.Resync
		if !c.nextExpiry.IsZero() {
			next = min(next, time.Until(c.nextExpiry)+10*time.Millisecond)
		}
		expiry.Reset(next)
		select {
		case <-ctx.Done():
			return nil
		case <-changes:
		case <-tick.C:
		case <-expiry.C:
		}
	}
}

// Reconcile makes one pass: expire, release, allocate.
func (c *Controller) Reconcile(ctx context.Context) error {
	c.nextExpiry = time.Time{} // a failed pass waits for a change or the resync, not a stale expiry
	// The allocations before the nodes: a block is claimed only for a
	// registered node, so every owner read here registered before the
	// nodes are read, and no block is freed because its node was not read
	// yet (Kubernetes' caches can lag each other still: releasable
	// confirms).
	allocs, err := c.store.Allocations(ctx)
	if err != nil {
		return err
	}
	nodes, err := c.store.Nodes(ctx)
	if err != nil {
		return err
	}
	members, err := c.members(ctx)
	if err != nil {
		return err
	}
	alive, err := c.store.Liveness(ctx)
	if err != nil {
		return err
	}
	blocksOf := make(map[string][]netip.Prefix, len(allocs))
	for p, owner := range allocs {
		blocksOf[owner] = append(blocksOf[owner], p)
	}
	now := time.Now()
	registered, deleted := map[string]bool{}, map[string]bool{}
	reqs := make([][]nodeipam.Request, len(c.allocs)) // by pool
	for _, n := range nodes {
		registered[n.Name] = true
		gone, err := c.leftCluster(ctx, members, n.Name)
		if err != nil {
			return err
		}
		if gone {
			slog.Info("node left the cluster; deleting it", "node", n.Name)
			if err := c.store.DeleteNode(ctx, n.Name); err != nil {
				return err
			}
			delete(registered, n.Name) // and from lastSeen below
			deleted[n.Name] = true     // with its blocks
			continue
		}
		if _, known := c.lastSeen[n.Name]; alive[n.Name] || !known {
			c.lastSeen[n.Name] = now
		} else if c.expired(n.Name, now) {
			slog.Info("node gone longer than the node timeout; deleting it", "node", n.Name, "timeout", c.cfg.NodeTimeout)
			if err := c.store.DeleteNode(ctx, n.Name); err != nil {
				return err
			}
			delete(registered, n.Name) // and from lastSeen below
			deleted[n.Name] = true     // with its blocks
			continue
		}
		if !alive[n.Name] && c.cfg.NodeTimeout > 0 {
			if exp := c.lastSeen[n.Name].Add(c.cfg.NodeTimeout); c.nextExpiry.IsZero() || exp.Before(c.nextExpiry) {
				c.nextExpiry = exp
			}
		}
		for i, a := range c.allocs {
			f := a.Family()
			if c.needsClaim(n, f, datastore.BlockOf(blocksOf[n.Name], f), members) {
				reqs[i] = append(reqs[i], nodeipam.Request{Node: n.Name, Prefer: datastore.BlockOf(members[n.Name], f)})
			}
		}
	}
	// A node removed from outside (onc-controller remove-node, a deleted
	// record) is forgotten too: registered again later, it is a new node
	// with its full timeout, not one long gone.
	maps.DeleteFunc(c.lastSeen, func(name string, _ time.Time) bool { return !registered[name] })
	// A release that fails (the API server away a moment, or the
	// controller's role without get on oncnodes) is retried on the next
	// pass; it must not keep new nodes from their blocks in this one.
	var releaseErrs []error
	for owner, blocks := range blocksOf {
		if registered[owner] || deleted[owner] {
			continue
		}
		ok, err := c.releasable(ctx, owner)
		if err == nil && ok {
			slog.Info("releasing the pod CIDRs of a removed node", "node", owner, "cidrs", blocks)
			err = c.store.ReleaseCIDR(ctx, owner)
		}
		if err != nil {
			releaseErrs = append(releaseErrs, fmt.Errorf("release the pod CIDRs %v of removed node %s: %w", blocks, owner, err))
		}
	}
	for i, a := range c.allocs {
		c.allocate(ctx, a, reqs[i], blocksOf)
	}
	return errors.Join(releaseErrs...)
}

// needsClaim: n has no block of family f, or its record or its Kubernetes
// Node lacks the copy of it. A backend whose records carry a copy
// (Kubernetes) can miss a write of it; claiming the block again writes
// the copy without taking anything new. A Node that carries any pod CIDR
// has all it can get: Kubernetes never lets a Node's pod CIDRs change.
func (c *Controller) needsClaim(n datastore.Node, f datastore.Family, block netip.Prefix, members map[string][]netip.Prefix) bool {
	carried, member := members[n.Name]
	return !block.IsValid() || datastore.BlockOf(n.PodCIDRs, f) != block || member && len(carried) == 0
}

// releasable confirms past any cache that owner, whose block is in the
// ledger, is not registered.
func (c *Controller) releasable(ctx context.Context, owner string) (bool, error) {
	if cr, ok := c.store.(datastore.CachedRegistrations); ok {
		return cr.Unregistered(ctx, owner)
	}
	return true, nil
}

// allocate gives every node of reqs its block of a's pool in one batch
// and logs what is new (had: the blocks the nodes held before).
func (c *Controller) allocate(ctx context.Context, a *nodeipam.Allocator, reqs []nodeipam.Request, had map[string][]netip.Prefix) {
	if len(reqs) == 0 {
		return
	}
	got, err := a.Allocate(ctx, reqs)
	for _, r := range reqs {
		if p, ok := got[r.Node]; ok && !slices.Contains(had[r.Node], p) {
			slog.Info("allocated pod CIDR", "node", r.Node, "cidr", p)
		}
	}
	if err != nil {
		if !errors.Is(err, nodeipam.ErrExhausted) {
			c.cfg.Metrics.storeErrors.Inc()
		}
		slog.Error("cannot allocate every pod CIDR", "family", a.Family(), "nodes", len(reqs), "allocated", len(got), "err", err)
	}
}

// leftCluster reports whether the cluster no longer has node name. The
// members cache can miss a node created a moment ago, so its absence there
// is confirmed with the backend before a registration is deleted.
func (c *Controller) leftCluster(ctx context.Context, members map[string][]netip.Prefix, name string) (bool, error) {
	if _, in := members[name]; members == nil || in {
		return false, nil
	}
	return c.store.(datastore.Membership).NodeGone(ctx, name)
}

// members returns the cluster's nodes and their pod CIDRs when the backend
// knows them (Kubernetes), else nil.
func (c *Controller) members(ctx context.Context) (map[string][]netip.Prefix, error) {
	m, ok := c.store.(datastore.Membership)
	if !ok {
		return nil, nil
	}
	return m.ClusterNodes(ctx)
}

// expired: a node gets the full timeout from the last time this controller
// saw it alive, or first saw it at all — so neither a new node that has
// not taken its lease yet nor a restart of everything expires a node.
func (c *Controller) expired(name string, now time.Time) bool {
	return c.cfg.NodeTimeout > 0 && now.Sub(c.lastSeen[name]) > c.cfg.NodeTimeout
}
