package nodeipam_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/onc-net/onc/controller/nodeipam"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
)

func store(t *testing.T, url string) datastore.Store {
	t.Helper()
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{url}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func pool(cidr string, bits int) datastore.Pool {
	return datastore.Pool{CIDR: netip.MustParsePrefix(cidr), NodePrefixLen: bits}
}

func cluster(pools ...datastore.Pool) datastore.ClusterConfig {
	return datastore.ClusterConfig{Pools: pools}
}

// allocate is a batch of one.
func allocate(ctx context.Context, a *nodeipam.Allocator, node string, prefer netip.Prefix) (netip.Prefix, error) {
	got, err := a.Allocate(ctx, []nodeipam.Request{{Node: node, Prefer: prefer}})
	return got[node], err
}

// 100 allocators, each with its own etcd client as separate controllers
// would have, race for blocks: every node gets one, no block twice.
func TestConcurrentAllocatorsNeverShareABlock(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	ctx := context.Background()
	const n = 100
	got := make([]netip.Prefix, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		a, err := nodeipam.New(pool("10.244.0.0/16", 24), store(t, e.ClientURL))
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = allocate(ctx, a, fmt.Sprintf("node-%d", i), netip.Prefix{})
		}()
	}
	wg.Wait()
	seen := map[netip.Prefix]int{}
	for i, p := range got {
		if errs[i] != nil {
			t.Fatalf("node-%d: %v", i, errs[i])
		}
		if j, dup := seen[p]; dup {
			t.Fatalf("block %s given to node-%d and node-%d", p, j, i)
		}
		seen[p] = i
	}
}

// Many allocators for the same node agree on one block.
func TestSameNodeConcurrentlyGetsOneBlock(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	var wg sync.WaitGroup
	got := make([]netip.Prefix, 20)
	for i := range got {
		a, _ := nodeipam.New(pool("10.244.0.0/16", 24), store(t, e.ClientURL))
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if got[i], err = allocate(context.Background(), a, "same", netip.Prefix{}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	for _, p := range got {
		if p != got[0] {
			t.Fatalf("same node got %s and %s", got[0], p)
		}
	}
	allocs, _ := store(t, e.ClientURL).Allocations(context.Background())
	if len(allocs) != 1 {
		t.Fatalf("%d blocks allocated for one node: %v", len(allocs), allocs)
	}
}

// Restarting etcd and the allocator on the same data keeps every node's block.
func TestRestartKeepsBlocks(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	want := map[string]netip.Prefix{}
	func() {
		e := etcdtest.Embedded(t, dir)
		a, _ := nodeipam.New(pool("10.244.0.0/16", 24), store(t, e.ClientURL))
		for _, n := range []string{"a", "b", "c"} {
			p, err := allocate(ctx, a, n, netip.Prefix{})
			if err != nil {
				t.Fatal(err)
			}
			want[n] = p
		}
		e.Close()
	}()
	e := etcdtest.Embedded(t, dir)
	a, _ := nodeipam.New(pool("10.244.0.0/16", 24), store(t, e.ClientURL))
	for _, n := range []string{"c", "b", "a"} { // other order: must not matter
		if p, err := allocate(ctx, a, n, netip.Prefix{}); err != nil || p != want[n] {
			t.Fatalf("after restart %s got %v, %v; want %v", n, p, err, want[n])
		}
	}
}

func TestExhaustionIsAClearError(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	ctx := context.Background()
	for _, p := range []datastore.Pool{pool("10.9.0.0/28", 30), pool("fd00:9::/118", 120)} { // 4 blocks each
		a, _ := nodeipam.New(p, store(t, e.ClientURL))
		seen := map[netip.Prefix]bool{}
		for i := range 4 {
			b, err := allocate(ctx, a, fmt.Sprint("n", i), netip.Prefix{})
			if err != nil {
				t.Fatal(err)
			}
			seen[b] = true
		}
		if len(seen) != 4 {
			t.Fatalf("4 nodes got %d distinct blocks of %v", len(seen), p)
		}
		_, err := allocate(ctx, a, "n4", netip.Prefix{})
		if !errors.Is(err, nodeipam.ErrExhausted) || !strings.Contains(err.Error(), p.CIDR.String()) {
			t.Fatalf("5th node of %v: err = %v, want ErrExhausted naming the pool", p, err)
		}
		t.Logf("exhaustion error: %v", err)
	}
}

// Every error names the flag (and onc-config key) to fix.
func TestValidate(t *testing.T) {
	v4, v6 := pool("10.244.0.0/16", 24), pool("fd00:10:244::/56", 64)
	for _, c := range []struct {
		cfg  datastore.ClusterConfig
		want string
	}{
		{cluster(), "--cluster-cidr: no range"},
		{cluster(pool("10.244.0.0/16", 8)), "--node-prefix-len /8: must be between the cluster CIDR 10.244.0.0/16's /16 and /30"},
		{cluster(pool("10.244.0.0/16", 31)), "--node-prefix-len /31"},
		{cluster(pool("10.244.1.0/16", 24)), "--cluster-cidr 10.244.1.0/16: host bits set (did you mean 10.244.0.0/16?)"},
		{cluster(v4, pool("fd00:10:244::/56", 48)), "--node-prefix-len-ipv6 /48: must be between the cluster CIDR fd00:10:244::/56's /56 and /120"},
		{cluster(pool("fd00::/64", 121)), "--node-prefix-len-ipv6 /121"},
		{cluster(pool("fd00::/64", 24)), "--node-prefix-len-ipv6 /24"}, // the IPv4 length given to IPv6
		{cluster(pool("fd00::1/64", 120)), "--cluster-cidr fd00::1/64: host bits set (did you mean fd00::/64?)"},
		{cluster(v4, pool("10.245.0.0/16", 24)), "--cluster-cidr 10.244.0.0/16,10.245.0.0/16: two ipv4 ranges"},
		{cluster(v6, v4, pool("fd00:99::/56", 64)), "--cluster-cidr fd00:10:244::/56,fd00:99::/56: two ipv6 ranges"},
		{cluster(pool("::ffff:10.0.0.0/104", 120)), "--cluster-cidr ::ffff:10.0.0.0/104: an IPv4-mapped IPv6 range"},
		{cluster(datastore.Pool{NodePrefixLen: 24}), "--cluster-cidr: not a prefix"},
	} {
		if err := nodeipam.Validate(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Validate(%v) = %v, want an error with %q", c.cfg, err, c.want)
		}
	}
	for _, ok := range []datastore.ClusterConfig{
		cluster(v4), cluster(v6), cluster(v4, v6), cluster(v6, v4),
		cluster(pool("10.244.0.0/16", 30), pool("fd00::/8", 120)), cluster(pool("::/0", 64)),
	} {
		if err := nodeipam.Validate(ok); err != nil {
			t.Errorf("Validate(%v): %v", ok, err)
		}
	}
}

// A node that already carries a pod CIDR (Kubernetes Node.spec.podCIDR set
// before ONC) keeps it when it is a free block; otherwise it gets a free one.
func TestAllocatePrefersTheNodesOwnFreeBlock(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	a, _ := nodeipam.New(pool("10.244.0.0/16", 24), store(t, e.ClientURL))
	ctx := context.Background()
	own := netip.MustParsePrefix("10.244.77.0/24")
	if p, err := allocate(ctx, a, "kept", own); err != nil || p != own {
		t.Fatalf("node carrying free %v got %v, %v", own, p, err)
	}
	for _, prefer := range []string{"10.244.77.0/24", "10.99.0.0/24", "10.244.5.0/25", "10.244.5.1/24"} {
		p, err := allocate(ctx, a, "other-"+prefer, netip.MustParsePrefix(prefer))
		if err != nil || p == own || !a.IsBlock(p) || p.String() == prefer {
			t.Fatalf("node preferring unusable %s got %v, %v; want another free block", prefer, p, err)
		}
	}
}

// Five allocators, each with its own etcd client, allocate overlapping
// batches of 100 nodes at once (node n is in the batches of allocators
// n/50 - 1 and n/50): every node gets one block, the same from both of its
// allocators, and no block goes to two nodes.
func TestConcurrentBatchesGiveEachNodeOneBlock(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	ctx := context.Background()
	const allocators, batch = 5, 100
	got := make([]map[string]netip.Prefix, allocators)
	errs := make([]error, allocators)
	var wg sync.WaitGroup
	for i := range allocators {
		a, err := nodeipam.New(pool("10.0.0.0/8", 24), store(t, e.ClientURL))
		if err != nil {
			t.Fatal(err)
		}
		var reqs []nodeipam.Request
		for n := i * batch / 2; n < i*batch/2+batch; n++ {
			reqs = append(reqs, nodeipam.Request{Node: fmt.Sprint("node-", n)})
		}
		wg.Go(func() { got[i], errs[i] = a.Allocate(ctx, reqs) })
	}
	wg.Wait()
	blockOf, owner := map[string]netip.Prefix{}, map[netip.Prefix]string{}
	for i := range allocators {
		if errs[i] != nil {
			t.Fatalf("allocator %d: %v", i, errs[i])
		}
		if len(got[i]) != batch {
			t.Fatalf("allocator %d gave %d of its %d nodes a block", i, len(got[i]), batch)
		}
		for node, p := range got[i] {
			if had, ok := blockOf[node]; ok && had != p {
				t.Fatalf("%s got %v from one allocator and %v from another", node, had, p)
			}
			if o, ok := owner[p]; ok && o != node {
				t.Fatalf("block %v given to %s and %s", p, o, node)
			}
			blockOf[node], owner[p] = p, node
		}
	}
	allocs, err := store(t, e.ClientURL).Allocations(ctx)
	if err != nil || len(allocs) != len(blockOf) {
		t.Fatalf("%d blocks allocated for %d nodes (%v)", len(allocs), len(blockOf), err)
	}
}

// A batch larger than the free blocks: those that fit are allocated, and
// the error names the others.
func TestBatchBeyondTheClusterCIDRNamesWhoGotNone(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	a, _ := nodeipam.New(pool("10.9.0.0/28", 30), store(t, e.ClientURL)) // 4 blocks
	got, err := a.Allocate(context.Background(), []nodeipam.Request{{Node: "a"}, {Node: "b"}, {Node: "c"}, {Node: "d"}, {Node: "e"}, {Node: "f"}})
	if !errors.Is(err, nodeipam.ErrExhausted) || !strings.Contains(err.Error(), "nodes e, f") {
		t.Fatalf("err = %v, want ErrExhausted naming e and f", err)
	}
	if len(got) != 4 {
		t.Fatalf("%d nodes allocated, want 4: %v", len(got), got)
	}
}
