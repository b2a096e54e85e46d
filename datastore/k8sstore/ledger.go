package k8sstore

// Cluster config and ledgers: one ConfigMap per family, each updated by
// compare-and-swap, which records every allocated block of its family;
// the IPv4 one, onc-ipam, also holds the cluster config.

import (
	"context"
	"fmt"
	"maps"
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

// LedgerName is the ConfigMap holding the cluster config and the IPv4
// allocations: the ledger every release before IPv6 kept, unchanged.
const LedgerName = "onc-ipam"

// IPv6LedgerName is the ConfigMap holding the IPv6 allocations. A ledger
// per family: an older controller, overlapping a newer one during an
// upgrade, reads and rewrites onc-ipam without knowing of IPv6 blocks.
const IPv6LedgerName = "onc-ipam-ipv6"

// ledgerNames are the ledgers' ConfigMaps by family.
var ledgerNames = map[datastore.Family]string{datastore.IPv4: LedgerName, datastore.IPv6: IPv6LedgerName}

// Ledger keys: the config (in onc-ipam: the primary pool in the keys
// every release wrote, the secondary in keys an older reader ignores),
// and one "block.<datastore.EncodeBlock>" = node per block.
const (
	keyClusterCIDR            = "clusterCIDR"
	keyNodePrefixLen          = "nodePrefixLen"
	keySecondaryClusterCIDR   = "secondaryClusterCIDR"
	keySecondaryNodePrefixLen = "secondaryNodePrefixLen"
	blockKeyPrefix            = "block."
)

func blockKey(p netip.Prefix) string { return blockKeyPrefix + datastore.EncodeBlock(p) }

func parseBlockKey(k string) (netip.Prefix, bool) {
	rest, ok := strings.CutPrefix(k, blockKeyPrefix)
	if !ok {
		return netip.Prefix{}, false
	}
	p, err := datastore.ParseBlock(rest)
	return p, err == nil
}

// ledgerData is the data of family f's ledger (nil if none): from the
// controller's cache, or read when asked by an agent's store, which never
// watches it. A ledger holds every block of its family, and each claim
// rewrites it: watched by every agent, a cluster's start would fan out N
// writes of O(N) bytes to N agents.
func (s *Store) ledgerData(ctx context.Context, f datastore.Family) (map[string]string, error) {
	name := ledgerNames[f]
	if s.ledgers == nil {
		cm, err := s.kube.CoreV1().ConfigMaps(s.ns).Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("ConfigMap %s/%s: %w", s.ns, name, err)
		}
		return cm.Data, nil
	}
	obj, ok, _ := s.ledgers[f].GetStore().GetByKey(s.ns + "/" + name)
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

// updateLedger applies fn to a fresh copy of family f's ledger and writes
// it back if fn reports a change, retrying on conflicts: a
// compare-and-swap on the ConfigMap's resourceVersion. It returns once the
// cache holds what it read or wrote last, so a caller that lost a block
// to another writer reads that writer's claim when it reads the ledger
// again.
func (s *Store) updateLedger(ctx context.Context, f datastore.Family, fn func(data map[string]string) (bool, error)) error {
	name := ledgerNames[f]
	cms := s.kube.CoreV1().ConfigMaps(s.ns)
	var seen string // the resourceVersion read or written last
	err := retry.RetryOnConflict(ledgerBackoff, func() error {
		cm, err := cms.Get(ctx, name, metav1.GetOptions{})
		create := apierrors.IsNotFound(err)
		if create {
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: s.ns,
				Labels: map[string]string{"app.kubernetes.io/part-of": "onc"}}}
		} else if err != nil {
			return err
		}
		seen = cm.ResourceVersion
		data := make(map[string]string, len(cm.Data)+1)
		maps.Copy(data, cm.Data)
		changed, err := fn(data)
		if err != nil || !changed {
			return err
		}
		cm.Data = data
		if create {
			cm, err = cms.Create(ctx, cm, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				return apierrors.NewConflict(corev1.Resource("configmaps"), name, err)
			}
		} else {
			cm, err = cms.Update(ctx, cm, metav1.UpdateOptions{})
		}
		if err == nil {
			seen = cm.ResourceVersion
		}
		return err
	})
	if err != nil || seen == "" || s.ledgers == nil {
		return err
	}
	return s.awaitCache(ctx, s.ledgers[f], s.ns+"/"+name, seen)
}

// configData is cfg as ledger keys: a single pool's are the two every
// release wrote.
func configData(cfg datastore.ClusterConfig) map[string]string {
	d := map[string]string{}
	if len(cfg.Pools) > 0 {
		d[keyClusterCIDR], d[keyNodePrefixLen] = cfg.Pools[0].CIDR.String(), strconv.Itoa(cfg.Pools[0].NodePrefixLen)
	}
	if len(cfg.Pools) > 1 {
		d[keySecondaryClusterCIDR], d[keySecondaryNodePrefixLen] = cfg.Pools[1].CIDR.String(), strconv.Itoa(cfg.Pools[1].NodePrefixLen)
	}
	return d
}

// configOf reads the config configData wrote; none if d has none.
func configOf(d map[string]string) (datastore.ClusterConfig, error) {
	var cfg datastore.ClusterConfig
	for _, k := range [][2]string{{keyClusterCIDR, keyNodePrefixLen}, {keySecondaryClusterCIDR, keySecondaryNodePrefixLen}} {
		if d[k[0]] == "" {
			break
		}
		p, err := netip.ParsePrefix(d[k[0]])
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", k[0], err)
		}
		n, err := strconv.Atoi(d[k[1]])
		if err != nil {
			return cfg, fmt.Errorf("%s: %w", k[1], err)
		}
		cfg.Pools = append(cfg.Pools, datastore.Pool{CIDR: p, NodePrefixLen: n})
	}
	return cfg, nil
}

// PutClusterConfig records what ClusterConfig.Extend makes of the
// recorded config and cfg, if that differs.
func (s *Store) PutClusterConfig(ctx context.Context, cfg datastore.ClusterConfig) error {
	where := fmt.Sprintf("ConfigMap %s/%s", s.ns, LedgerName)
	return s.updateLedger(ctx, datastore.IPv4, func(d map[string]string) (bool, error) {
		have, err := configOf(d)
		if err != nil {
			return false, fmt.Errorf("%s: %w", where, err)
		}
		next, err := have.Extend(cfg, where)
		if err != nil || next.Equal(have) {
			return false, err
		}
		maps.Copy(d, configData(next))
		return true, nil
	})
}

func (s *Store) ClusterConfig(ctx context.Context) (datastore.ClusterConfig, error) {
	d, err := s.ledgerData(ctx, datastore.IPv4)
	if err != nil {
		return datastore.ClusterConfig{}, err
	}
	cfg, err := configOf(d)
	switch {
	case err != nil:
		return cfg, fmt.Errorf("ConfigMap %s/%s: %w", s.ns, LedgerName, err)
	case len(cfg.Pools) == 0:
		return cfg, datastore.ErrNotFound
	}
	return cfg, nil
}

// ClaimCIDRs records the claims of each family in one update of that
// family's ledger, then copies each claimed node's block into its
// ONCNode and Node (mirrorCIDRs).
func (s *Store) ClaimCIDRs(ctx context.Context, claims map[string]netip.Prefix) (map[string]netip.Prefix, error) {
	got := make(map[string]netip.Prefix, len(claims))
	for _, f := range datastore.Families {
		of := map[string]netip.Prefix{}
		for node, p := range claims {
			if datastore.FamilyOf(p) == f {
				of[node] = p
			}
		}
		if len(of) == 0 {
			continue
		}
		given, err := s.claimIn(ctx, f, of)
		if err != nil {
			return got, err
		}
		maps.Copy(got, given)
		if err := s.mirrorCIDRs(ctx, f, given); err != nil {
			return got, err
		}
	}
	return got, nil
}

// claimIn records claims, all of family f, in one update of its ledger.
func (s *Store) claimIn(ctx context.Context, f datastore.Family, claims map[string]netip.Prefix) (map[string]netip.Prefix, error) {
	var got map[string]netip.Prefix
	err := s.updateLedger(ctx, f, func(d map[string]string) (bool, error) {
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
	return got, err
}

// ReleaseCIDR frees the node's blocks in each ledger, then its ONCNode's
// copies.
func (s *Store) ReleaseCIDR(ctx context.Context, node string) error {
	for _, f := range datastore.Families {
		err := s.updateLedger(ctx, f, func(d map[string]string) (bool, error) {
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
	}
	w, err := s.mirrorONCNode(ctx, node, datastore.ClusterConfig{}, func([]netip.Prefix) []netip.Prefix { return nil })
	if err != nil {
		return err
	}
	return s.awaitAll(ctx, w)
}

// Allocations maps each allocated block of both ledgers to its node.
func (s *Store) Allocations(ctx context.Context) (map[netip.Prefix]string, error) {
	out := map[netip.Prefix]string{}
	for _, f := range datastore.Families {
		d, err := s.ledgerData(ctx, f)
		if err != nil {
			return nil, err
		}
		for k, owner := range d {
			if p, ok := parseBlockKey(k); ok {
				out[p] = owner
			}
		}
	}
	return out, nil
}
