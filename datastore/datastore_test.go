package datastore

import (
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Block keys are ConfigMap keys ([-._a-zA-Z0-9]) that read back as the
// block they name, in every textual form of IPv6; an IPv4 block's key is
// the one every release wrote.
func TestBlockKeys(t *testing.T) {
	configMapKey := regexp.MustCompile(`^[-._a-zA-Z0-9]+$`)
	for p, want := range map[string]string{
		"10.244.1.0/24":            "10.244.1.0-24",
		"::/64":                    "__-64",
		"fd00::/64":                "fd00__-64",
		"fd00:0:0:1::/64":          "fd00_0_0_1__-64",
		"2001:db8::1:0:0/96":       "2001_db8__1_0_0-96",
		"2001:db8:1:2:3:4:5:0/112": "2001_db8_1_2_3_4_5_0-112",
		"::ffff:10.0.0.0/120":      "__ffff_10.0.0.0-120",
	} {
		block := netip.MustParsePrefix(p)
		key := EncodeBlock(block)
		if key != want || !configMapKey.MatchString(key) {
			t.Errorf("EncodeBlock(%s) = %q, want %q", p, key, want)
		}
		if back, err := ParseBlock(key); err != nil || back != block {
			t.Errorf("ParseBlock(%q) = %v, %v; want %v", key, back, err, block)
		}
	}
	for _, bad := range []string{"fd00__", "10.244.1.0", "x-24"} {
		if p, err := ParseBlock(bad); err == nil {
			t.Errorf("ParseBlock(%q) = %v, want an error", bad, p)
		}
	}
}

func TestExtend(t *testing.T) {
	v4 := Pool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	v6 := Pool{CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64}
	cfg := func(p ...Pool) ClusterConfig { return ClusterConfig{Pools: p} }
	for _, c := range []struct {
		have, want ClusterConfig
		ok         bool
	}{
		{cfg(), cfg(v4), true},
		{cfg(v4), cfg(v4), true},
		{cfg(v4), cfg(v4, v6), true}, // a single-stack cluster becomes dual-stack
		{cfg(v6), cfg(v6, v4), true},
		{cfg(v4, v6), cfg(v4, v6), true},
		{cfg(v4, v6), cfg(v4), false}, // a family dropped
		{cfg(v4), cfg(v6, v4), false}, // the primary family changed
		{cfg(v4, v6), cfg(v6, v4), false},
		{cfg(v4), cfg(Pool{CIDR: v4.CIDR, NodePrefixLen: 26}), false},
		{cfg(v4, v6), cfg(v4, Pool{CIDR: v6.CIDR, NodePrefixLen: 80}), false},
	} {
		got, err := c.have.Extend(c.want, "here")
		switch {
		case c.ok && (err != nil || !got.Equal(c.want)):
			t.Errorf("%v over %v: %v, %v; want it recorded", c.want, c.have, got, err)
		case !c.ok && (err == nil || !got.Equal(c.have) || !strings.Contains(err.Error(), c.have.String()+" (here)")):
			t.Errorf("%v over %v: %v, %v; want it refused, naming what is recorded where", c.want, c.have, got, err)
		}
	}
}

func TestInFamilyOrder(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00::/64")
	pool := func(p string) Pool { return Pool{CIDR: netip.MustParsePrefix(p)} }
	for _, c := range []struct {
		cfg  ClusterConfig
		want []netip.Prefix
	}{
		{ClusterConfig{}, []netip.Prefix{v4, v6}},
		{ClusterConfig{Pools: []Pool{pool("10.244.0.0/16"), pool("fd00::/56")}}, []netip.Prefix{v4, v6}},
		{ClusterConfig{Pools: []Pool{pool("fd00::/56"), pool("10.244.0.0/16")}}, []netip.Prefix{v6, v4}},
		{ClusterConfig{Pools: []Pool{pool("fd00::/56")}}, []netip.Prefix{v6, v4}},
	} {
		for _, in := range [][]netip.Prefix{{v4, v6}, {v6, v4}} {
			if got := c.cfg.InFamilyOrder(in); !slices.Equal(got, c.want) {
				t.Errorf("%v orders %v as %v, want %v", c.cfg, in, got, c.want)
			}
		}
	}
	n := Node{PodCIDRs: []netip.Prefix{v6, v4}}
	if n.IPv4PodCIDR() != v4 || (Node{PodCIDRs: []netip.Prefix{v6}}).IPv4PodCIDR().IsValid() {
		t.Errorf("IPv4PodCIDR of %v = %v", n.PodCIDRs, n.IPv4PodCIDR())
	}
}
