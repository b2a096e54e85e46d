package controller_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
)

var (
	pool4 = datastore.Pool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}
	pool6 = datastore.Pool{CIDR: netip.MustParsePrefix("fd00:10:244::/56"), NodePrefixLen: 64}
)

func cluster(pools ...datastore.Pool) datastore.ClusterConfig {
	return datastore.ClusterConfig{Pools: pools}
}

// setup is a controller of an IPv4 cluster on a fresh etcd.
func setup(t *testing.T, timeout time.Duration) (datastore.Store, *controller.Controller) {
	return setupCluster(t, cluster(pool4), timeout)
}

func setupCluster(t *testing.T, cfg datastore.ClusterConfig, timeout time.Duration) (datastore.Store, *controller.Controller) {
	e := etcdtest.Embedded(t, "")
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{e.ClientURL}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c, err := controller.New(context.Background(), controller.Config{Cluster: cfg, NodeTimeout: timeout}, s)
	if err != nil {
		t.Fatal(err)
	}
	return s, c
}

func blocks(s ...string) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range s {
		out = append(out, netip.MustParsePrefix(p))
	}
	return out
}

// podCIDRs is every node's pod CIDRs, as its record shows them.
func podCIDRs(t *testing.T, s datastore.Store) map[string][]netip.Prefix {
	t.Helper()
	nodes, err := s.Nodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]netip.Prefix{}
	for _, n := range nodes {
		out[n.Name] = n.PodCIDRs
	}
	return out
}

// A dual-stack cluster, either family first, or an IPv6-only one: every
// node gets a block of each pool in one reconcile, the lowest free
// first, listed in the cluster's family order; a removed node's blocks
// are all freed.
func TestAllocatesABlockOfEveryPool(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  datastore.ClusterConfig
		want map[string][]netip.Prefix
	}{
		{"DualStack", cluster(pool4, pool6), map[string][]netip.Prefix{
			"a": blocks("10.244.0.0/24", "fd00:10:244::/64"), "b": blocks("10.244.1.0/24", "fd00:10:244:1::/64")}},
		{"IPv6First", cluster(pool6, pool4), map[string][]netip.Prefix{
			"a": blocks("fd00:10:244::/64", "10.244.0.0/24"), "b": blocks("fd00:10:244:1::/64", "10.244.1.0/24")}},
		{"IPv6Only", cluster(pool6), map[string][]netip.Prefix{"a": blocks("fd00:10:244::/64"), "b": blocks("fd00:10:244:1::/64")}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, ctl := setupCluster(t, c.cfg, 0)
			ctx := context.Background()
			register(t, s, "a")
			if err := ctl.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			register(t, s, "b")
			if err := ctl.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			if got := podCIDRs(t, s); fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Fatalf("pod CIDRs %v, want %v", got, c.want)
			}
			if err := s.DeleteNode(ctx, "a"); err != nil {
				t.Fatal(err)
			}
			if _, err := datastore.ClaimCIDR(ctx, s, "orphan", netip.MustParsePrefix("fd00:10:244:ff::/64")); err != nil {
				t.Fatal(err)
			}
			if err := ctl.Reconcile(ctx); err != nil {
				t.Fatal(err)
			}
			want := map[netip.Prefix]string{}
			for _, p := range c.want["b"] {
				want[p] = "b"
			}
			if allocs, _ := s.Allocations(ctx); !maps.Equal(allocs, want) {
				t.Fatalf("allocations after removals = %v, want only b's %v", allocs, c.want["b"])
			}
		})
	}
}

// An IPv4 cluster becomes dual-stack as Kubernetes allows: a controller
// with the IPv6 pool added starts on the IPv4 one's datastore, and gives
// every node, old and new, an IPv6 block, each keeping its IPv4 one.
// Neither pool may change after.
func TestSecondFamilyAddedToARunningCluster(t *testing.T) {
	s, v4only := setup(t, 0)
	ctx := context.Background()
	register(t, s, "old")
	if err := v4only.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	dual, err := controller.New(ctx, controller.Config{Cluster: cluster(pool4, pool6)}, s)
	if err != nil {
		t.Fatalf("adding the IPv6 pool to a running IPv4 cluster: %v", err)
	}
	register(t, s, "new")
	if err := dual.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	// One batch gives new, then old (by name), their IPv6 blocks.
	want := map[string][]netip.Prefix{"new": blocks("10.244.1.0/24", "fd00:10:244::/64"), "old": blocks("10.244.0.0/24", "fd00:10:244:1::/64")}
	if got := podCIDRs(t, s); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("pod CIDRs %v, want %v", got, want)
	}
	for _, refused := range []datastore.ClusterConfig{
		cluster(pool4),
		cluster(pool4, datastore.Pool{CIDR: netip.MustParsePrefix("fd00:99::/56"), NodePrefixLen: 64}),
	} {
		if _, err := controller.New(ctx, controller.Config{Cluster: refused}, s); err == nil || !strings.Contains(err.Error(), "cannot change") {
			t.Errorf("a controller of %v on the dual-stack datastore: %v, want a refusal", refused, err)
		}
	}
}

func register(t *testing.T, s datastore.Store, name string) {
	err := s.RegisterNode(context.Background(), datastore.NodeSpec{Name: name, IP: netip.MustParseAddr("192.0.2.1"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}})
	if err != nil {
		t.Fatal(err)
	}
}

func TestAllocatesRegisteredNodesAndReleasesRemovedOnes(t *testing.T) {
	s, c := setup(t, 0)
	ctx := context.Background()
	register(t, s, "a")
	register(t, s, "b")
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	a, _ := s.Node(ctx, "a")
	b, _ := s.Node(ctx, "b")
	if !a.IPv4PodCIDR().IsValid() || !b.IPv4PodCIDR().IsValid() || a.IPv4PodCIDR() == b.IPv4PodCIDR() {
		t.Fatalf("CIDRs a=%v b=%v", a.PodCIDRs, b.PodCIDRs)
	}
	// A node record removed behind the controller's back: its block is freed.
	if err := s.DeleteNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := datastore.ClaimCIDR(ctx, s, "orphan", netip.MustParsePrefix("10.244.200.0/24")); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	allocs, _ := s.Allocations(ctx)
	if len(allocs) != 1 || allocs[b.IPv4PodCIDR()] != "b" {
		t.Fatalf("allocations after removal = %v, want only b's", allocs)
	}
}

func TestConfigMismatchRefusesToStart(t *testing.T) {
	s, _ := setup(t, 0)
	_, err := controller.New(context.Background(), controller.Config{
		Cluster: datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: netip.MustParsePrefix("10.99.0.0/16"), NodePrefixLen: 24}}}}, s)
	if err == nil {
		t.Fatal("a controller with another cluster CIDR started on the same datastore")
	}
}

func TestNodeGoneLongerThanTimeoutIsDeleted(t *testing.T) {
	s, c := setup(t, 2*time.Second)
	ctx := context.Background()
	register(t, s, "alive")
	register(t, s, "dead")
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = s.KeepAlive(kctx, "alive", 2*time.Second) }()
	testutil.WaitFor(t, "the lease of alive", 10*time.Second, func() bool { l, _ := s.Liveness(ctx); return l["alive"] })
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node(ctx, "dead"); err != nil {
		t.Fatal("node deleted before its timeout (counted from the controller's start)")
	}
	time.Sleep(2500 * time.Millisecond)
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Node(ctx, "dead"); err == nil {
		t.Fatal("node without liveness not deleted after the timeout")
	}
	if n, err := s.Node(ctx, "alive"); err != nil || !n.IPv4PodCIDR().IsValid() {
		t.Fatalf("live node: %+v, %v", n, err)
	}
	if allocs, _ := s.Allocations(ctx); len(allocs) != 1 {
		t.Fatalf("allocations = %v, want only the live node's", allocs)
	}
}

// A node that registers long after the controller started, and has not
// taken its liveness lease yet, gets its full timeout.
func TestNewNodeGetsItsFullTimeout(t *testing.T) {
	s, c := setup(t, 2*time.Second)
	ctx := context.Background()
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the controller has run longer than the timeout
	register(t, s, "late")
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	n, err := s.Node(ctx, "late")
	if err != nil || !n.IPv4PodCIDR().IsValid() {
		t.Fatalf("a new node was expired or not allocated on first sight: %+v, %v", n, err)
	}
}

// The controller looks again when a node would time out, not only at its
// resync (30 s by default): a timeout is kept to the second.
func TestRunExpiresANodeOnTime(t *testing.T) {
	s, c := setup(t, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	register(t, s, "dead")
	testutil.WaitFor(t, "a CIDR for dead", 5*time.Second, func() bool { n, _ := s.Node(ctx, "dead"); return n.IPv4PodCIDR().IsValid() })
	start := time.Now()
	testutil.WaitFor(t, "dead deleted", 10*time.Second, func() bool { _, err := s.Node(ctx, "dead"); return err != nil })
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("deleted %v after its 1s timeout", took)
	}
}

// failingRelease is a store whose releases fail, as with the API server
// away a moment.
type failingRelease struct{ datastore.Store }

func (failingRelease) ReleaseCIDR(context.Context, string) error { return errors.New("store away") }

// A release that fails is reported and retried, and keeps no new node
// from its block in the same pass.
func TestFailedReleaseDoesNotBlockAllocation(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{e.ClientURL}})
	testutil.Must(t, err)
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	c, err := controller.New(ctx, controller.Config{
		Cluster: datastore.ClusterConfig{Pools: []datastore.Pool{{CIDR: netip.MustParsePrefix("10.244.0.0/16"), NodePrefixLen: 24}}},
	}, failingRelease{s})
	testutil.Must(t, err)
	if _, err := datastore.ClaimCIDR(ctx, s, "orphan", netip.MustParsePrefix("10.244.200.0/24")); err != nil {
		t.Fatal(err)
	}
	register(t, s, "new")
	if err := c.Reconcile(ctx); err == nil || !strings.Contains(err.Error(), "orphan") {
		t.Errorf("Reconcile: %v; want the failed release of orphan's block reported", err)
	}
	if n, _ := s.Node(ctx, "new"); !n.IPv4PodCIDR().IsValid() {
		t.Errorf("the new node has no pod CIDR after a pass whose release failed")
	}
}
