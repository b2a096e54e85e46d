package nodeipam

import (
	"maps"
	"math/big"
	"net/netip"
	"slices"
	"testing"

	"github.com/onc-net/onc/datastore"
)

// The batch picking, without a datastore: one read of the allocations in,
// every request's block out.
func TestPick(t *testing.T) {
	a, err := New(datastore.Pool{CIDR: netip.MustParsePrefix("10.9.0.0/28"), NodePrefixLen: 30}, nil) // 4 blocks
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
		{"a node's block of the other family is not its block of this one",
			map[netip.Prefix]string{netip.MustParsePrefix("fd00::/64"): "a"},
			[]Request{req("a", none)},
			map[string]netip.Prefix{"a": b(0)}, nil},
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

// IPv6 blocks lie 2^64 addresses and more apart: a /32 in /64 blocks holds
// 2^32 of them, picked lowest first like IPv4's; a /8 in /120 blocks holds
// more than a uint64 counts.
func TestPickIPv6(t *testing.T) {
	a, err := New(datastore.Pool{CIDR: netip.MustParsePrefix("fd00::/32"), NodePrefixLen: 64}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := big.NewInt(1 << 32); a.Blocks().Cmp(want) != 0 {
		t.Fatalf("%v blocks, want %v", a.Blocks(), want)
	}
	for i, want := range map[uint64]string{0: "fd00::/64", 1: "fd00:0:0:1::/64", 1 << 16: "fd00:0:1::/64", 1<<32 - 1: "fd00:0:ffff:ffff::/64"} {
		if got := a.block(i); got.String() != want || !a.IsBlock(got) {
			t.Errorf("block %d = %v, want %s", i, got, want)
		}
	}
	b := a.block
	taken := map[netip.Prefix]string{b(0): "x", b(2): "y", netip.MustParsePrefix("10.244.1.0/24"): "a"}
	claims, left := a.pick(taken, []Request{{Node: "a"}, {Node: "c"}, {Node: "high", Prefer: b(1<<32 - 1)}})
	if want := map[string]netip.Prefix{"a": b(1), "c": b(3), "high": b(1<<32 - 1)}; !maps.Equal(claims, want) || len(left) > 0 {
		t.Errorf("pick = %v, left %v; want %v", claims, left, want)
	}

	small, _ := New(datastore.Pool{CIDR: netip.MustParsePrefix("fd00::/62"), NodePrefixLen: 64}, nil) // 4 blocks
	full := map[netip.Prefix]string{}
	for i := range uint64(4) {
		full[small.block(i)] = "x"
	}
	if claims, left := small.pick(full, []Request{{Node: "a"}}); len(claims) > 0 || len(left) != 1 {
		t.Errorf("pick from a full pool = %v, left %v; want none", claims, left)
	}
	if allocated, free := small.Usage(full); allocated != 4 || free != 0 {
		t.Errorf("usage of a full pool: %v allocated, %v free", allocated, free)
	}

	huge, _ := New(datastore.Pool{CIDR: netip.MustParsePrefix("fd00::/8"), NodePrefixLen: 120}, nil)
	taken = map[netip.Prefix]string{huge.block(0): "x"}
	if claims, _ := huge.pick(taken, []Request{{Node: "a"}}); claims["a"].String() != "fd00::100/120" {
		t.Errorf("pick from 2^112 blocks = %v, want the second, fd00::100/120", claims)
	}
	if _, free := huge.Usage(taken); free != 0x1p112 {
		t.Errorf("%v free blocks of 2^112 with one taken", free)
	}
}
