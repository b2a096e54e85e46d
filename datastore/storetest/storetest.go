// Package storetest is the behaviour every datastore backend must have,
// as a suite each backend's tests run against a real server.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/internal/testutil"
)

// Run runs the suite; newStore returns a fresh, empty store each call.
func Run(t *testing.T, newStore func(t *testing.T) datastore.Store) {
	t.Run("ClusterConfigIsWrittenOnceAndChecked", func(t *testing.T) { clusterConfig(t, newStore(t)) })
	t.Run("RegisterAndReadNodes", func(t *testing.T) { registerNodes(t, newStore(t)) })
	t.Run("ClaimIsAtomicAndIdempotent", func(t *testing.T) { claim(t, newStore(t)) })
	t.Run("BatchSettlesEveryClaimAsOneWould", func(t *testing.T) { claimBatch(t, newStore(t)) })
	t.Run("DeleteNodeReleasesItsCIDR", func(t *testing.T) { deleteNode(t, newStore(t)) })
	t.Run("KeepAliveMarksAliveUntilCancelled", func(t *testing.T) { keepAlive(t, newStore(t)) })
	t.Run("LivenessSignalsNobody", func(t *testing.T) { livenessIsQuiet(t, newStore(t)) })
	t.Run("ChangesSignalsOnEveryKindOfChange", func(t *testing.T) { changes(t, newStore(t)) })
	t.Run("ChangesMissesNothingAfterTheFirstSignal", func(t *testing.T) { changesFromTheStart(t, newStore(t)) })
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

var (
	cfg  = datastore.ClusterConfig{ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	mac1 = net.HardwareAddr{0x02, 0, 0, 0, 0, 1}
)

func spec(name, ip string) datastore.NodeSpec {
	return datastore.NodeSpec{Name: name, IP: netip.MustParseAddr(ip), VTEPMAC: mac1}
}

func clusterConfig(t *testing.T, s datastore.Store) {
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
	other := cfg
	other.NodePrefixLen = 26
	if err := s.PutClusterConfig(c, other); err == nil {
		t.Fatal("a different cluster config was accepted over the stored one")
	}
	got, err := s.ClusterConfig(c)
	if err != nil || got != cfg {
		t.Fatalf("ClusterConfig = %+v, %v; want %+v", got, err, cfg)
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
	upd.FastPath = true
	if err := s.RegisterNode(c, upd); err != nil {
		t.Fatal(err)
	}
	n, err := s.Node(c, "a")
	if err != nil {
		t.Fatal(err)
	}
	if n.IP != upd.IP || !n.FastPath || n.VTEPMAC.String() != mac1.String() || n.PodCIDR.IsValid() {
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
	if got, err := s.ClaimCIDR(c, "a", p1); err != nil || got != p1 {
		t.Fatalf("claim p1 for a = %v, %v", got, err)
	}
	if got, err := s.ClaimCIDR(c, "a", p2); err != nil || got != p1 {
		t.Fatalf("a claiming a second block got %v, %v; want its first, %v", got, err, p1)
	}
	if _, err := s.ClaimCIDR(c, "b", p1); !errors.Is(err, datastore.ErrCIDRTaken) {
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
	if got, err := s.ClaimCIDR(c, "b", p1); err != nil || got != p1 {
		t.Fatalf("b claiming the released block = %v, %v", got, err)
	}
}

// A batch settles each claim as ClaimCIDR would, however many it holds
// (etcd takes them in several transactions), and again is idempotent.
func claimBatch(t *testing.T, s datastore.Store) {
	c := ctx(t)
	block := func(i int) netip.Prefix { return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 24) }
	for node, p := range map[string]netip.Prefix{"holder": block(0), "owner": block(1)} {
		if _, err := s.ClaimCIDR(c, node, p); err != nil {
			t.Fatal(err)
		}
	}
	claims := map[string]netip.Prefix{
		"holder": block(2),                    // keeps block 0
		"late":   block(1),                    // owner's: not given
		"dup-a":  block(3), "dup-b": block(3), // one block twice: one of them gets it
	}
	want := map[string]netip.Prefix{"holder": block(0)}
	for i := range 150 {
		name := fmt.Sprintf("n%03d", i)
		claims[name], want[name] = block(10+i), block(10+i)
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
		delete(got, "dup-a")
		delete(got, "dup-b")
		if len(got) != len(want) {
			t.Fatalf("try %d: %d nodes got a block, want %d (late, whose block is owner's, none): %v", try, len(got), len(want), got)
		}
		for node, p := range want {
			if got[node] != p {
				t.Fatalf("try %d: %s got %v, want %v", try, node, got[node], p)
			}
		}
	}
	allocs, err := s.Allocations(c)
	if err != nil {
		t.Fatal(err)
	}
	if len(allocs) != len(want)+2 || allocs[block(1)] != "owner" || allocs[block(3)] == "" {
		t.Fatalf("%d allocations after the batch, want %d: %v", len(allocs), len(want)+2, allocs)
	}
	for node, p := range want {
		if allocs[p] != node {
			t.Fatalf("allocations give %v to %q, want %s", p, allocs[p], node)
		}
	}
}

func deleteNode(t *testing.T, s datastore.Store) {
	c := ctx(t)
	p := netip.MustParsePrefix("10.244.7.0/24")
	if err := s.RegisterNode(c, spec("gone", "192.0.2.7")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimCIDR(c, "gone", p); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Node(c, "gone"); err != nil || n.PodCIDR != p {
		t.Fatalf("Node(gone) = %+v, %v; want CIDR %v", n, err, p)
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
	if _, err := s.ClaimCIDR(c, "w", netip.MustParsePrefix("10.244.3.0/24")); err != nil {
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
