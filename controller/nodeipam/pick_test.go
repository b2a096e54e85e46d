package nodeipam

import (
	"maps"
	"net/netip"
	"slices"
	"testing"

	"github.com/onc-net/onc/datastore"
)

// The batch picking, without a datastore: one read of the allocations in,
// every request's block out.
func TestPick(t *testing.T) {
	a, err := New(datastore.ClusterConfig{ClusterCIDR: netip.MustParsePrefix("10.9.0.0/28"), NodePrefixLen: 30}, nil) // 4 blocks
	if err != nil {
		t.Fatal(err)
	}
	b := func(i int) netip.Prefix { return a.block(uint64(i)) }
	req := func(node string, prefer netip.Prefix) Request { return Request{Node: node, Prefer: prefer} }
	none := netip.Prefix{}
	for _, c := range []struct {
		name  string
		taken map[netip.Prefix]string
		reqs  []Request
		want  map[string]netip.Prefix
		full  []string
	}{
		{"the lowest free blocks in turn, around taken ones",
			map[netip.Prefix]string{b(0): "x", b(2): "y"},
			[]Request{req("a", none), req("b", none)},
			map[string]netip.Prefix{"a": b(1), "b": b(3)}, nil},
		{"a node that holds a block gets it, whatever it prefers",
			map[netip.Prefix]string{b(2): "a"},
			[]Request{req("a", b(0))},
			map[string]netip.Prefix{"a": b(2)}, nil},
		{"preferences before the rest: an earlier node does not take a later one's block",
			nil,
			[]Request{req("a", none), req("b", b(0))},
			map[string]netip.Prefix{"a": b(1), "b": b(0)}, nil},
		{"one preferred block for two nodes: the first gets it",
			nil,
			[]Request{req("a", b(3)), req("b", b(3))},
			map[string]netip.Prefix{"a": b(3), "b": b(0)}, nil},
		{"a preferred block that is taken, or not one of the cluster's, is not given",
			map[netip.Prefix]string{b(1): "x"},
			[]Request{req("taken", b(1)), req("outside", netip.MustParsePrefix("10.99.0.0/30")), req("host-bits", netip.MustParsePrefix("10.9.0.9/30"))},
			map[string]netip.Prefix{"taken": b(0), "outside": b(2), "host-bits": b(3)}, nil},
		{"a preferred prefix of another size is not a block",
			nil,
			[]Request{req("size", netip.MustParsePrefix("10.9.0.8/29"))},
			map[string]netip.Prefix{"size": b(0)}, nil},
		{"no free block left: the last requests get none",
			map[netip.Prefix]string{b(0): "x", b(3): "y"},
			[]Request{req("a", none), req("b", none), req("c", none), req("d", none)},
			map[string]netip.Prefix{"a": b(1), "b": b(2)}, []string{"c", "d"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			claims, left := a.pick(c.taken, c.reqs)
			var full []string
			for _, r := range left {
				full = append(full, r.Node)
			}
			if !maps.Equal(claims, c.want) || !slices.Equal(full, c.full) {
				t.Fatalf("pick = %v, left %v; want %v, left %v", claims, full, c.want, c.full)
			}
		})
	}
}
