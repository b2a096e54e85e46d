package controller

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/onc-net/onc/datastore"
)

// ErrNodeAlive is RemoveNode's refusal of a node whose agent still holds
// its liveness lease: that agent would register the node again at once,
// without its liveness record, and the controller would then expire a
// running node.
var ErrNodeAlive = errors.New("its agent is alive and would register it again: stop the agent first")

// Revoker is the embedded etcd's root (etcdstore.Store): it revokes a
// node's datastore credentials (its per-node user) and ends its liveness
// (revokes its lease), whoever keeps that alive.
type Revoker interface {
	RevokeNode(ctx context.Context, node string) error
	EndLiveness(ctx context.Context, node string) error
}

// RemoveNode is the operator's removal of a node on the etcd datastore (on
// Kubernetes, deleting the Node does it): its registration, liveness and
// pod CIDRs go in one transaction, and every agent, watching, takes it off
// its peers; then creds, if not nil, revokes the node's credentials. It
// returns the CIDRs it released (none if it had none). A node that is
// neither registered nor holds a CIDR is datastore.ErrNotFound (its
// credentials are revoked all the same); a live one is refused.
func RemoveNode(ctx context.Context, store datastore.Store, creds Revoker, name string) ([]netip.Prefix, error) {
	cidr, err := removeRecords(ctx, store, name)
	if creds == nil || err != nil && !errors.Is(err, datastore.ErrNotFound) {
		return cidr, err
	}
	if rerr := creds.RevokeNode(ctx, name); rerr != nil {
		return cidr, errors.Join(err, fmt.Errorf("node %s: revoke its datastore credentials: %w", name, rerr))
	}
	return cidr, err
}

// RemoveNodeEvenIfAlive is RemoveNode for a node that may look alive:
// anyone may renew a node's liveness lease (etcd checks no permission on
// renewal), so another node, or a revoked certificate, can keep it alive.
// creds, required, first revokes the node's credentials, so that its own
// agent, if it runs, can write nothing from then on; then ends its
// liveness; then its records go and its CIDRs are released as in RemoveNode.
func RemoveNodeEvenIfAlive(ctx context.Context, store datastore.Store, creds Revoker, name string) ([]netip.Prefix, error) {
	if creds == nil {
		return nil, errors.New("removing a node even if it is alive needs the embedded etcd's root credentials")
	}
	if err := requireName(name); err != nil {
		return nil, err
	}
	if err := creds.RevokeNode(ctx, name); err != nil {
		return nil, fmt.Errorf("node %s: revoke its datastore credentials: %w", name, err)
	}
	if err := creds.EndLiveness(ctx, name); err != nil {
		return nil, fmt.Errorf("node %s: end its liveness: %w", name, err)
	}
	return removeRecords(ctx, store, name)
}

func requireName(name string) error {
	if name == "" {
		return errors.New("node name is required")
	}
	return nil
}

// removeRecords is RemoveNode's datastore side.
func removeRecords(ctx context.Context, store datastore.Store, name string) ([]netip.Prefix, error) {
	if err := requireName(name); err != nil {
		return nil, err
	}
	var cidrs []netip.Prefix
	n, err := store.Node(ctx, name)
	switch {
	case err == nil:
		cidrs = n.PodCIDRs
	case !errors.Is(err, datastore.ErrNotFound):
		return nil, err
	default: // not registered: maybe only its blocks are left
		allocs, err := store.Allocations(ctx)
		if err != nil {
			return nil, err
		}
		for p, owner := range allocs {
			if owner == name {
				cidrs = append(cidrs, p)
			}
		}
		slices.SortFunc(cidrs, netip.Prefix.Compare) // IPv4 first
		if len(cidrs) == 0 {
			return nil, fmt.Errorf("node %s: %w: neither registered nor holding a pod CIDR", name, datastore.ErrNotFound)
		}
	}
	live, err := store.Liveness(ctx)
	if err != nil {
		return nil, err
	}
	if live[name] {
		return nil, fmt.Errorf("node %s: %w", name, ErrNodeAlive)
	}
	if err := store.DeleteNode(ctx, name); err != nil {
		return nil, fmt.Errorf("remove node %s: %w", name, err)
	}
	return cidrs, nil
}
