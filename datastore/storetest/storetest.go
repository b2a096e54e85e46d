// Package storetest is the behaviour every datastore backend must have,
// as a suite each backend's tests run against a real server.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/internal/testutil"
)

// Older is a store as a release before IPv6 read and wrote its cluster
// config: one pool, in the record's format of that release.
type Older interface {
	PutConfig(ctx context.Context, cidr netip.Prefix, nodePrefixLen int) error
	Config(ctx context.Context) (cidr netip.Prefix, nodePrefixLen int, err error)
}

// Run runs the suite; newStore returns a fresh, empty store each call,
// and that store as an older release sees it.
func Run(t *testing.T, newStore func(t *testing.T) (datastore.Store, Older)) {
	store := func(t *testing.T) datastore.Store { s, _ := newStore(t); return s }
	t.Run("ClusterConfigIsWrittenOnceAndChecked", func(t *testing.T) { s, o := newStore(t); clusterConfig(t, s, o) })
	t.Run("ConfigOfAnOlderReleaseGetsTheOtherFamily", func(t *testing.T) { s, o := newStore(t); olderConfig(t, s, o) })
	t.Run("RegisterAndReadNodes", func(t *testing.T) { registerNodes(t, store(t)) })
	t.Run("ClaimIsAtomicAndIdempotent", func(t *testing.T) { claim(t, store(t)) })
	t.Run("BatchSettlesEveryClaimAsOneWould", func(t *testing.T) { claimBatch(t, store(t)) })
	t.Run("ClaimsArePerFamily", func(t *testing.T) { twoFamilies(t, store(t)) })
	t.Run("BlocksInTheClustersFamilyOrder", func(t *testing.T) { familyOrder(t, store(t)) })
	t.Run("IPv6BlocksReadBackExactly", func(t *testing.T) { ipv6Keys(t, store(t)) })
	t.Run("DeleteNodeReleasesItsCIDR", func(t *testing.T) { deleteNode(t, store(t)) })
	t.Run("KeepAliveMarksAliveUntilCancelled", func(t *testing.T) { keepAlive(t, store(t)) })
	t.Run("LivenessSignalsNobody", func(t *testing.T) { livenessIsQuiet(t, store(t)) })
	t.Run("ChangesSignalsOnEveryKindOfChange", func(t *testing.T) { changes(t, store(t)) })
	t.Run("ChangesMissesNothingAfterTheFirstSignal", func(t *testing.T) { changesFromTheStart(t, store(t)) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var (
	pool4 = datastore.Pool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	pool6 = datastore.Pool{CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64}
	cfg   = config(pool4)
	mac1  = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
)

func config(pools ...datastore.Pool) datastore.ClusterConfig {
	return datastore.ClusterConfig{Pools: pools}
}

func prefixes(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

func spec(name, ip string) datastore.NodeSpec {
	return datastore.NodeSpec{Name: name, IP: netip.MustParseAddr(ip), VTEPMAC: mac1}
}

// An IPv4 cluster's config is written as every release wrote it, so an
// older agent reads it during an upgrade.
func clusterConfig(t *testing.T, s datastore.Store, older Older) {
	c := ctx(t)
	if _, err := s.ClusterConfig(c); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("empty store: ClusterConfig err = %v, want ErrNotFound", err)
	}
	if err := s.PutClusterConfig(c, cfg); err != nil {
		t.Fatal(err)
	}
	if err := s.PutClusterConfig(c, cfg); err != nil {
		t.Fatalf("same config again: %v", err)
	}
	other := config(datastore.Pool{CIDR: pool4.CIDR, NodePrefixLen: 26})
	if err := s.PutClusterConfig(c, other); err == nil || !strings.Contains(err.Error(), "10.244.0.0/16 in /24") {
		t.Fatalf("a different cluster config over the stored one: err = %v, want one naming the recorded pool", err)
	}
	got, err := s.ClusterConfig(c)
	if err != nil || !got.Equal(cfg) {
		t.Fatalf("ClusterConfig = %+v, %v; want %+v", got, err, cfg)
	}
	if cidr, bits, err := older.Config(c); err != nil || cidr != pool4.CIDR || bits != pool4.NodePrefixLen {
		t.Fatalf("an older release reads %v /%d, %v; want %v", cidr, bits, err, pool4)
	}
}

// A cluster set up by an older release becomes dual-stack: its record
// reads as its one pool, the other family may be added, and an older
// agent still reads the IPv4 pool; a recorded pool never changes.
func olderConfig(t *testing.T, s datastore.Store, older Older) {
	c := ctx(t)
	if err := older.PutConfig(c, pool4.CIDR, pool4.NodePrefixLen); err != nil {
		t.Fatal(err)
	}
	// Another writer's: a store that reads a cache may see it a moment later.
	testutil.WaitFor(t, "an older release's config read as one pool", 10*time.Second, func() bool {
		got, err := s.ClusterConfig(c)
		return err == nil && got.Equal(cfg)
	})
	dual := config(pool4, pool6)
	if err := s.PutClusterConfig(c, dual); err != nil {
		t.Fatalf("adding IPv6 to an IPv4 cluster: %v", err)
	}
	if err := s.PutClusterConfig(c, dual); err != nil {
		t.Fatalf("the dual-stack config again: %v", err)
	}
	for _, refused := range []datastore.ClusterConfig{
		cfg,                  // a family dropped
		config(pool6, pool4), // the primary family changed
		config(pool4, datastore.Pool{CIDR: netip.MustParsePrefix("fd00:99::/56"), NodePrefixLen: 64}), // another IPv6 pool
		config(datastore.Pool{CIDR: pool4.CIDR, NodePrefixLen: 25}, pool6),                            // another IPv4 block size
	} {
		err := s.PutClusterConfig(c, refused)
		if err == nil || !strings.Contains(err.Error(), "fd00:10:244::/56 in /64") {
			t.Errorf("%v over %v: err = %v, want one naming the recorded pools", refused, dual, err)
		}
	}
	if got, err := s.ClusterConfig(c); err != nil || !got.Equal(dual) {
		t.Fatalf("ClusterConfig = %+v, %v; want %+v", got, err, dual)
	}
	if cidr, bits, err := older.Config(c); err != nil || cidr != pool4.CIDR || bits != pool4.NodePrefixLen {
		t.Fatalf("an older release reads %v /%d, %v from the dual-stack config; want %v", cidr, bits, err, pool4)
	}
}

func registerNodes(t *testing.T, s datastore.Store) {
	c := ctx(t)
	if err := s.RegisterNode(c, spec("a", "192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterNode(c, datastore.NodeSpec{Name: "bad/name"}); err == nil {
		t.Fatal("node name with '/' accepted")
	}
	upd := spec("a", "192.0.2.9")
	upd.FastPath, upd.PeerPin = true, "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU="
	if err := s.RegisterNode(c, upd); err != nil {
		t.Fatal(err)
	}
	n, err := s.Node(c, "a")
	if err != nil {
		t.Fatal(err)
	}
	if n.IP != upd.IP || !n.FastPath || n.PeerPin != upd.PeerPin || n.VTEPMAC.String() != mac1.String() || len(n.PodCIDRs) > 0 {
		t.Fatalf("Node(a) = %+v, want the updated spec, no CIDR", n)
	}
	if alive(t, s, "a") {
		t.Fatal("a node whose agent never took its lease is alive")
	}
	if _, err := s.Node(c, "nope"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("Node(nope) err = %v, want ErrNotFound", err)
	}
	nodes, err := s.Nodes(c)
	if err != nil || len(nodes) != 1 || nodes[0].Name != "a" {
		t.Fatalf("Nodes = %+v, %v", nodes, err)
	}
}

func claim(t *testing.T, s datastore.Store) {
	c := ctx(t)
	p1, p2 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("10.244.2.0/24")
	if got, err := datastore.ClaimCIDR(c, s, "a", p1); err != nil || got != p1 {
		t.Fatalf("claim p1 for a = %v, %v", got, err)
	}
	if got, err := datastore.ClaimCIDR(c, s, "a", p2); err != nil || got != p1 {
		t.Fatalf("a claiming a second block got %v, %v; want its first, %v", got, err, p1)
	}
	if _, err := datastore.ClaimCIDR(c, s, "b", p1); !errors.Is(err, datastore.ErrCIDRTaken) {
		t.Fatalf("b claiming a's block: err = %v, want ErrCIDRTaken", err)
	}
	allocs, err := s.Allocations(c)
	if err != nil || len(allocs) != 1 || allocs[p1] != "a" {
		t.Fatalf("Allocations = %v, %v", allocs, err)
	}
	if err := s.ReleaseCIDR(c, "a"); err != nil {
		t.Fatal(err)
	}
	if err := s.ReleaseCIDR(c, "a"); err != nil {
		t.Fatalf("releasing twice: %v", err)
	}
	if got, err := datastore.ClaimCIDR(c, s, "b", p1); err != nil || got != p1 {
		t.Fatalf("b claiming the released block = %v, %v", got, err)
	}
}

// A batch settles each claim as ClaimCIDR would, however many it holds
// (etcd takes them in several transactions), and again is idempotent; an
// IPv6 batch for the same nodes as well, each node keeping its IPv4 block.
func claimBatch(t *testing.T, s datastore.Store) {
	c := ctx(t)
	want := map[netip.Prefix]string{}
	for _, block := range []func(int) netip.Prefix{
		func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24) },
		func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 7: byte(i)}), 64) },
	} {
		t.Logf("blocks like %v", block(1))
		for node, p := range map[string]netip.Prefix{"holder": block(0), "owner": block(1)} {
			if _, err := datastore.ClaimCIDR(c, s, node, p); err != nil {
				t.Fatal(err)
			}
			want[p] = node
		}
		claims := map[string]netip.Prefix{
			"holder": block(2),                    // keeps block 0
			"late":   block(1),                    // owner's: not given
			"dup-a":  block(3), "dup-b": block(3), // one block twice: one of them gets it
		}
		given := map[string]netip.Prefix{"holder": block(0)}
		for i := range 150 {
			name := fmt.Sprintf("n%03d", i)
			claims[name], given[name] = block(10+i), block(10+i)
		}
		for try := range 2 {
			got, err := s.ClaimCIDRs(c, claims)
			if err != nil {
				t.Fatalf("try %d: %v", try, err)
			}
			a, aok := got["dup-a"]
			b, bok := got["dup-b"]
			if aok == bok || a != block(3) && b != block(3) {
				t.Fatalf("try %d: one block claimed twice: dup-a got %v (%v), dup-b %v (%v); want exactly one of them", try, a, aok, b, bok)
			}
			want[block(3)] = "dup-b"
			if aok {
				want[block(3)] = "dup-a"
			}
			delete(got, "dup-a")
			delete(got, "dup-b")
			if !maps.Equal(got, given) {
				t.Fatalf("try %d: got %v, want %v (late, whose block is owner's, none)", try, got, given)
			}
		}
		for node, p := range given {
			want[p] = node
		}
	}
	if allocs, err := s.Allocations(c); err != nil || !maps.Equal(allocs, want) {
		t.Fatalf("allocations after the batches: %v, %v; want %v", allocs, err, want)
	}
}

// A node holds one block per family: a claim keeps the block of its
// family the node holds, whatever it holds of the other; a block another
// node holds is taken in either family; a release frees both.
func twoFamilies(t *testing.T, s datastore.Store) {
	c := ctx(t)
	for _, n := range []string{"a", "b"} {
		if err := s.RegisterNode(c, spec(n, "192.0.2.1")); err != nil {
			t.Fatal(err)
		}
	}
	ps := prefixes("10.244.1.0/24", "fd00:10:244:1::/64", "10.244.2.0/24", "fd00:10:244:2::/64", "fd00:10:244:3::/64")
	a4, a6, b4, b6, c6 := ps[0], ps[1], ps[2], ps[3], ps[4]
	for _, cl := range []struct {
		node        string
		claim, want netip.Prefix
	}{
		{"a", a4, a4},
		{"a", a6, a6}, // a second family: given
		{"a", b4, a4}, // one of each family only: it keeps its own
		{"a", b6, a6},
		{"b", b6, b6}, // a6 is not the only IPv6 block there is
	} {
		if got, err := datastore.ClaimCIDR(c, s, cl.node, cl.claim); err != nil || got != cl.want {
			t.Fatalf("%s claiming %v got %v, %v; want %v", cl.node, cl.claim, got, err, cl.want)
		}
	}
	for _, p := range []netip.Prefix{a4, a6} {
		if _, err := datastore.ClaimCIDR(c, s, "c", p); !errors.Is(err, datastore.ErrCIDRTaken) {
			t.Fatalf("c claiming a's %v: err = %v, want ErrCIDRTaken", p, err)
		}
	}
	// One batch of both families.
	batch := map[string]netip.Prefix{"b": b4, "c": c6}
	if got, err := s.ClaimCIDRs(c, batch); err != nil || !maps.Equal(got, batch) {
		t.Fatalf("a batch of both families: %v, %v", got, err)
	}
	want := map[netip.Prefix]string{a4: "a", a6: "a", b4: "b", b6: "b", c6: "c"}
	if allocs, err := s.Allocations(c); err != nil || !maps.Equal(allocs, want) {
		t.Fatalf("Allocations = %v, %v; want %v", allocs, err, want)
	}
	for node, blocks := range map[string][]netip.Prefix{"a": {a4, a6}, "b": {b4, b6}} {
		if n, err := s.Node(c, node); err != nil || !slices.Equal(n.PodCIDRs, blocks) || n.IPv4PodCIDR() != blocks[0] {
			t.Fatalf("Node(%s) = %+v, %v; want pod CIDRs %v, IPv4 first (no config)", node, n, err, blocks)
		}
	}
	if err := s.ReleaseCIDR(c, "a"); err != nil {
		t.Fatal(err)
	}
	delete(want, a4)
	delete(want, a6)
	if allocs, err := s.Allocations(c); err != nil || !maps.Equal(allocs, want) {
		t.Fatalf("Allocations after a's release = %v, %v; want %v", allocs, err, want)
	}
	if n, err := s.Node(c, "a"); err != nil || len(n.PodCIDRs) > 0 || n.IPv4PodCIDR().IsValid() {
		t.Fatalf("Node(a) after its release = %+v, %v; want no pod CIDR", n, err)
	}
	if got, err := datastore.ClaimCIDR(c, s, "d", a6); err != nil || got != a6 {
		t.Fatalf("d claiming a's released IPv6 block: %v, %v", got, err)
	}
}

// A node's blocks are listed in the cluster's family order, as
// Node.spec.podCIDRs: IPv6 first in an IPv6-first cluster, whichever
// family was claimed first.
func familyOrder(t *testing.T, s datastore.Store) {
	c := ctx(t)
	if err := s.PutClusterConfig(c, config(pool6, pool4)); err != nil {
		t.Fatal(err)
	}
	if err := s.RegisterNode(c, spec("a", "192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	want := prefixes("fd00:10:244:1::/64", "10.244.1.0/24")
	for _, p := range []netip.Prefix{want[1], want[0]} {
		if _, err := datastore.ClaimCIDR(c, s, "a", p); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Node(c, "a"); err != nil || !slices.Equal(n.PodCIDRs, want) || n.IPv4PodCIDR() != want[1] {
		t.Fatalf("Node(a) = %+v, %v; want pod CIDRs %v", n, err, want)
	}
	if nodes, err := s.Nodes(c); err != nil || len(nodes) != 1 || !slices.Equal(nodes[0].PodCIDRs, want) {
		t.Fatalf("Nodes = %+v, %v; want a with %v", nodes, err, want)
	}
}

// Ledger keys allow only [-._a-zA-Z0-9]: IPv6 blocks in every textual
// form (leading, inner and trailing "::", an IPv4-mapped tail) read back
// as they were claimed.
func ipv6Keys(t *testing.T, s datastore.Store) {
	c := ctx(t)
	want := map[netip.Prefix]string{}
	for i, p := range prefixes("::/64", "fd00::/64", "fd00:0:0:1::/64", "2001:db8::1:0:0/96", "2001:db8:1:2:3:4:5:0/112", "::ffff:10.0.0.0/120", "10.244.9.0/24") {
		node := fmt.Sprint("n", i)
		if got, err := datastore.ClaimCIDR(c, s, node, p); err != nil || got != p {
			t.Fatalf("claiming %v: %v, %v", p, got, err)
		}
		want[p] = node
	}
	if allocs, err := s.Allocations(c); err != nil || !maps.Equal(allocs, want) {
		t.Fatalf("Allocations = %v, %v; want %v", allocs, err, want)
	}
	for p := range want {
		if _, err := datastore.ClaimCIDR(c, s, "other", p); !errors.Is(err, datastore.ErrCIDRTaken) {
			t.Fatalf("claiming %v again: err = %v, want ErrCIDRTaken", p, err)
		}
		if err := s.ReleaseCIDR(c, want[p]); err != nil {
			t.Fatal(err)
		}
	}
	if allocs, err := s.Allocations(c); err != nil || len(allocs) != 0 {
		t.Fatalf("Allocations after every release = %v, %v", allocs, err)
	}
}

func deleteNode(t *testing.T, s datastore.Store) {
	c := ctx(t)
	p := netip.MustParsePrefix("10.244.7.0/24")
	if err := s.RegisterNode(c, spec("gone", "192.0.2.7")); err != nil {
		t.Fatal(err)
	}
	p6 := netip.MustParsePrefix("fd00:10:244:7::/64")
	for _, b := range []netip.Prefix{p, p6} {
		if _, err := datastore.ClaimCIDR(c, s, "gone", b); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.Node(c, "gone"); err != nil || !slices.Equal(n.PodCIDRs, []netip.Prefix{p, p6}) {
		t.Fatalf("Node(gone) = %+v, %v; want CIDRs %v and %v", n, err, p, p6)
	}
	kctx, cancel := context.WithCancel(c)
	defer cancel()
	go func() { _ = s.KeepAlive(kctx, "gone", 30*time.Second) }()
	testutil.WaitFor(t, "gone alive", 15*time.Second, func() bool { return alive(t, s, "gone") })
	if err := s.DeleteNode(c, "gone"); err != nil {
		t.Fatal(err)
	}
	if alive(t, s, "gone") {
		t.Fatal("a deleted node is still alive: its liveness must go with it")
	}
	if _, err := s.Node(c, "gone"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("deleted node still there: %v", err)
	}
	if allocs, _ := s.Allocations(c); len(allocs) != 0 {
		t.Fatalf("deleted node's CIDR still allocated: %v", allocs)
	}
	if err := s.DeleteNode(c, "gone"); err != nil {
		t.Fatalf("deleting twice: %v", err)
	}
}

func keepAlive(t *testing.T, s datastore.Store) {
	c := ctx(t)
	if err := s.RegisterNode(c, spec("live", "192.0.2.2")); err != nil {
		t.Fatal(err)
	}
	kctx, cancel := context.WithCancel(c)
	done := make(chan error, 1)
	go func() { done <- s.KeepAlive(kctx, "live", 2*time.Second) }()
	testutil.WaitFor(t, "node alive", 15*time.Second, func() bool { return alive(t, s, "live") })
	time.Sleep(3 * time.Second) // beyond the TTL: the lease must be renewed
	if !alive(t, s, "live") {
		t.Fatal("node not alive after one TTL although KeepAlive runs")
	}
	cancel()
	<-done
	// A clean stop ends the lease at once, well within the TTL.
	testutil.WaitFor(t, "node not alive after KeepAlive ended", time.Second, func() bool { return !alive(t, s, "live") })
}

func alive(t *testing.T, s datastore.Store, node string) bool {
	t.Helper()
	l, err := s.Liveness(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return l[node]
}

// Heartbeats must not fan out: neither taking the lease nor renewing it
// wakes a consumer of Changes (every agent is one).
func livenessIsQuiet(t *testing.T, s datastore.Store) {
	c := ctx(t)
	if err := s.RegisterNode(c, spec("quiet", "192.0.2.4")); err != nil {
		t.Fatal(err)
	}
	ch := s.Changes(c)
	<-ch
	kctx, cancel := context.WithCancel(c)
	defer cancel()
	go func() { _ = s.KeepAlive(kctx, "quiet", 2*time.Second) }()
	testutil.WaitFor(t, "node alive", 15*time.Second, func() bool { return alive(t, s, "quiet") })
	select {
	case <-ch:
		t.Fatal("taking a liveness lease signalled a change")
	case <-time.After(3 * time.Second): // at least two renewals
	}
	if !alive(t, s, "quiet") {
		t.Fatal("not alive after its renewals")
	}
}

func changes(t *testing.T, s datastore.Store) {
	c := ctx(t)
	ch := s.Changes(c)
	expect := func(what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("no change signal after %s", what)
		}
	}
	drain := func() {
		time.Sleep(100 * time.Millisecond)
		for {
			select {
			case <-ch:
			default:
				return
			}
		}
	}
	expect("start")
	drain()
	if err := s.RegisterNode(c, spec("w", "192.0.2.3")); err != nil {
		t.Fatal(err)
	}
	expect("register")
	drain()
	if _, err := datastore.ClaimCIDR(c, s, "w", netip.MustParsePrefix("10.244.3.0/24")); err != nil {
		t.Fatal(err)
	}
	expect("claim")
	drain()
	if err := s.DeleteNode(c, "w"); err != nil {
		t.Fatal(err)
	}
	expect("delete")
}

// A consumer reads the store on the first signal and waits for the next:
// a change made right after that read must be signalled, or the consumer
// waits for ever with stale state (an agent that never sees its CIDR).
// The window is short, so the suite tries it many times.
func changesFromTheStart(t *testing.T, s datastore.Store) {
	c := ctx(t)
	for i := range 20 {
		wctx, cancel := context.WithCancel(c)
		ch := s.Changes(wctx)
		<-ch
		if err := s.RegisterNode(c, spec(fmt.Sprintf("n%d", i), "192.0.2.3")); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatalf("try %d: a node registered right after the first signal was never signalled", i)
		}
		cancel()
	}
}
