package k8sstore

import (
	"maps"
	"net/netip"
	"testing"

	"github.com/onc-net/onc/datastore"
	"k8s.io/apimachinery/pkg/util/validation"
)

// An IPv4 cluster's config keys in onc-ipam are exactly the two every
// release wrote; the IPv6 pool goes in keys of its own, and both read back.
func TestConfigKeys(t *testing.T) {
	v4 := datastore.Pool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	v6 := datastore.Pool{CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64}
	for _, c := range []struct {
		cfg  datastore.ClusterConfig
		data map[string]string
	}{
		{datastore.ClusterConfig{Pools: []datastore.Pool{v4}}, map[string]string{"clusterCIDR": "10.244.0.0/16", "nodePrefixLen": "24"}},
		{datastore.ClusterConfig{Pools: []datastore.Pool{v4, v6}}, map[string]string{"clusterCIDR": "10.244.0.0/16", "nodePrefixLen": "24",
			"secondaryClusterCIDR": "fd00:10:244::/56", "secondaryNodePrefixLen": "64"}},
	} {
		if got := configData(c.cfg); !maps.Equal(got, c.data) {
			t.Errorf("%v is written %v, want %v", c.cfg, got, c.data)
		}
		withBlocks := maps.Clone(c.data)
		withBlocks[blockKey(netip.MustParsePrefix("10.244.1.0/24"))] = "a"
		if got, err := configOf(withBlocks); err != nil || !got.Equal(c.cfg) {
			t.Errorf("%v reads as %v, %v; want %v", c.data, got, err, c.cfg)
		}
	}
	if got, err := configOf(map[string]string{"clusterCIDR": "10.244.0.0/16", "nodePrefixLen": "x"}); err == nil {
		t.Errorf("a malformed nodePrefixLen reads as %v", got)
	}
}

// Block keys are valid ConfigMap keys and read back; IPv4's are what
// every release wrote.
func TestBlockKeys(t *testing.T) {
	if k := blockKey(netip.MustParsePrefix("10.244.1.0/24")); k != "block.10.244.1.0-24" {
		t.Errorf("IPv4 block key %q, want block.10.244.1.0-24", k)
	}
	for _, s := range []string{"::/64", "fd00:10:244:1::/64", "2001:db8::1:0:0/96", "::ffff:10.0.0.0/120"} {
		p := netip.MustParsePrefix(s)
		k := blockKey(p)
		if errs := validation.IsConfigMapKey(k); len(errs) > 0 {
			t.Errorf("block key %q of %s: %v", k, s, errs)
		}
		if back, ok := parseBlockKey(k); !ok || back != p {
			t.Errorf("block key %q reads as %v, %v; want %v", k, back, ok, p)
		}
	}
	if _, ok := parseBlockKey(keyClusterCIDR); ok {
		t.Error("a config key read as a block")
	}
}
