package etcdstore

import (
	"net/netip"
	"testing"

	"github.com/onc-net/onc/datastore"
)

// An IPv4 cluster's config key is byte for byte what every release wrote;
// the IPv6 pool goes in fields of its own, and both read back.
func TestConfigRecord(t *testing.T) {
	v4 := datastore.Pool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	v6 := datastore.Pool{CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64}
	for _, c := range []struct {
		cfg  datastore.ClusterConfig
		json string
	}{
		{datastore.ClusterConfig{Pools: []datastore.Pool{v4}}, `{"clusterCIDR":"10.244.0.0/16","nodePrefixLen":24}`},
		{datastore.ClusterConfig{Pools: []datastore.Pool{v4, v6}},
			`{"clusterCIDR":"10.244.0.0/16","nodePrefixLen":24,"secondaryClusterCIDR":"fd00:10:244::/56","secondaryNodePrefixLen":64}`},
		{datastore.ClusterConfig{Pools: []datastore.Pool{v6}}, `{"clusterCIDR":"fd00:10:244::/56","nodePrefixLen":64}`},
	} {
		val, err := encodeConfig(c.cfg)
		if err != nil || string(val) != c.json {
			t.Errorf("%v is written %s, %v; want %s", c.cfg, val, err, c.json)
		}
		if got, err := decodeConfig([]byte(c.json)); err != nil || !got.Equal(c.cfg) {
			t.Errorf("%s reads as %v, %v; want %v", c.json, got, err, c.cfg)
		}
	}
}
