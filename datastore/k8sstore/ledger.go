package k8sstore

// Cluster config and ledger: the onc-ipam ConfigMap, updated by
// compare-and-swap, which records the config and every allocated block.

import (
	"context"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/onc-net/onc/datastore"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/util/retry"
)

// LedgerName is the ConfigMap holding the cluster config and allocations.
const LedgerName = "onc-ipam"

// Ledger keys: the config, and one "block.<a.b.c.d-len>" = node per block.
const (
	keyClusterCIDR   = "clusterCIDR"
	keyNodePrefixLen = "nodePrefixLen"
	blockKeyPrefix   = "block."
)

func blockKey(p netip.Prefix) string {
	return blockKeyPrefix + strings.Replace(p.String(), "/", "-", 1)
}

func parseBlockKey(k string) (netip.Prefix, bool) {
	rest, ok := strings.CutPrefix(k, blockKeyPrefix)
	if !ok {
		return netip.Prefix{}, false
	}
	p, err := netip.ParsePrefix(strings.Replace(rest, "-", "/", 1))
	return p, err == nil
}

// ledgerData is the ledger's data (nil if none): from the controller's
// cache, or read when asked by an agent's store, which never watches it.
// The ledger holds every block, and each claim rewrites it: watched by
// every agent, a cluster's start would fan out N writes of O(N) bytes to N
// agents.
func (s *Store) ledgerData(ctx context.Context) (map[string]string, error) {
	if s.ledger == nil {
		cm, err := s.kube.CoreV1().ConfigMaps(s.ns).Get(ctx, LedgerName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s: %w", s.ns, LedgerName, err)
		}
		return cm.Data, nil
	}
	obj, ok, _ := s.ledger.GetStore().GetByKey(s.ns + "/" + LedgerName)
	if !ok {
		return nil, nil
	}
	return obj.(*corev1.ConfigMap).Data, nil
}

// ledgerBackoff paces the retries of a ledger update that lost its
// compare-and-swap. Replicas overlap only during a leader change, but then
// both write batches back to back for a while: a retry costs one read, and
// giving up fails a whole reconcile.
var ledgerBackoff = wait.Backoff{Steps: 10, Duration: 10 * time.Millisecond, Factor: 2, Jitter: 0.5, Cap: time.Second}

// updateLedger applies fn to a fresh copy of the ledger and writes it back
// if fn reports a change, retrying on conflicts: a compare-and-swap on the
// ConfigMap's resourceVersion. It returns once the cache holds what it
// read or wrote last, so a caller that lost a block to another writer
// reads that writer's claim when it reads the ledger again.
func (s *Store) updateLedger(ctx context.Context, fn func(data map[string]string) (bool, error)) error {
	cms := s.kube.CoreV1().ConfigMaps(s.ns)
	var seen string // the resourceVersion read or written last
	err := retry.RetryOnConflict(ledgerBackoff, func() error {
		cm, err := cms.Get(ctx, LedgerName, metav1.GetOptions{})
		create := apierrors.IsNotFound(err)
		if create {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: LedgerName, Namespace: s.ns,
				Labels: map[string]string{"app.kubernetes.io/part-of": "onc"}}}
		} else if err != nil {
			return err
		}
		seen = cm.ResourceVersion
		data := make(map[string]string, len(cm.Data)+1)
		for k, v := range cm.Data {
			data[k] = v
		}
		changed, err := fn(data)
		if err != nil || !changed {
			return err
		}
		cm.Data = data
		if create {
			cm, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), LedgerName, err)
			}
		} else {
			cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err == nil {
			seen = cm.ResourceVersion
		}
		return err
	})
	if err != nil || seen == "" || s.ledger == nil {
		return err
	}
	return s.awaitCache(ctx, s.ledger, s.ns+"/"+LedgerName, seen)
}

func (s *Store) PutClusterConfig(ctx context.Context, cfg datastore.ClusterConfig) error {
	want := map[string]string{keyClusterCIDR: cfg.ClusterCIDR.String(), keyNodePrefixLen: strconv.Itoa(cfg.NodePrefixLen)}
	return s.updateLedger(ctx, func(d map[string]string) (bool, error) {
		if d[keyClusterCIDR] == "" {
			for k, v := range want {
				d[k] = v
			}
			return true, nil
		}
		if d[keyClusterCIDR] != want[keyClusterCIDR] || d[keyNodePrefixLen] != want[keyNodePrefixLen] {
			return false, fmt.Errorf("the cluster was set up with cluster CIDR %s and node prefix /%s (ConfigMap %s/%s); they cannot change to %s and /%d under a running cluster",
				d[keyClusterCIDR], d[keyNodePrefixLen], s.ns, LedgerName, cfg.ClusterCIDR, cfg.NodePrefixLen)
		}
		return false, nil
	})
}

func (s *Store) ClusterConfig(ctx context.Context) (datastore.ClusterConfig, error) {
	d, err := s.ledgerData(ctx)
	if err != nil {
		return datastore.ClusterConfig{}, err
	}
	if d[keyClusterCIDR] == "" {
		return datastore.ClusterConfig{}, datastore.ErrNotFound
	}
	p, err := netip.ParsePrefix(d[keyClusterCIDR])
	if err != nil {
		return datastore.ClusterConfig{}, fmt.Errorf("ConfigMap %s/%s: %s: %w", s.ns, LedgerName, keyClusterCIDR, err)
	}
	n, err := strconv.Atoi(d[keyNodePrefixLen])
	if err != nil {
		return datastore.ClusterConfig{}, fmt.Errorf("ConfigMap %s/%s: %s: %w", s.ns, LedgerName, keyNodePrefixLen, err)
	}
	return datastore.ClusterConfig{ClusterCIDR: p, NodePrefixLen: n}, nil
}

// ClaimCIDRs records every claim it can in one update of the ledger, then
// copies each claimed node's block into its ONCNode and Node
// (mirrorCIDRs).
func (s *Store) ClaimCIDRs(ctx context.Context, claims map[string]netip.Prefix) (map[string]netip.Prefix, error) {
	var got map[string]netip.Prefix
	err := s.updateLedger(ctx, func(d map[string]string) (bool, error) {
		got = make(map[string]netip.Prefix, len(claims)) // afresh on each try
		held := map[string]netip.Prefix{}
		for k, owner := range d {
			if p, ok := parseBlockKey(k); ok {
				held[owner] = p
			}
		}
		changed := false
		for node, cidr := range claims {
			if p, ok := held[node]; ok {
				got[node] = p
				continue
			}
			if _, taken := d[blockKey(cidr)]; taken {
				continue
			}
			d[blockKey(cidr)] = node
			held[node], got[node] = cidr, cidr
			changed = true
		}
		return changed, nil
	})
	if err != nil {
		return nil, err
	}
	return got, s.mirrorCIDRs(ctx, got)
}

func (s *Store) ClaimCIDR(ctx context.Context, node string, cidr netip.Prefix) (netip.Prefix, error) {
	return datastore.ClaimOne(ctx, s, node, cidr)
}

func (s *Store) ReleaseCIDR(ctx context.Context, node string) error {
	err := s.updateLedger(ctx, func(d map[string]string) (bool, error) {
		changed := false
		for k, owner := range d {
			if _, ok := parseBlockKey(k); ok && owner == node {
				delete(d, k)
				changed = true
			}
		}
		return changed, nil
	})
	if err != nil {
		return err
	}
	waits, err := s.mirrorCIDR(ctx, node, netip.Prefix{})
	if err != nil {
		return err
	}
	return s.awaitAll(ctx, waits)
}

// Allocations maps each allocated block to its node.
func (s *Store) Allocations(ctx context.Context) (map[netip.Prefix]string, error) {
	d, err := s.ledgerData(ctx)
	if err != nil {
		return nil, err
	}
	out := map[netip.Prefix]string{}
	for k, owner := range d {
		if p, ok := parseBlockKey(k); ok {
			out[p] = owner
		}
	}
	return out, nil
}
