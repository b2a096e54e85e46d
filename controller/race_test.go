package controller_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
)

// race is two controller replicas overlapping, as during a leader change
// but for the whole test: each on its own store (client, caches), both
// reconciling, while thousands of nodes register at once.
type race struct {
	cluster datastore.ClusterConfig
	stores  [2]datastore.Store
	// register brings a node up as its agent (and, on Kubernetes, its
	// kubelet) would.
	register func(ctx context.Context, spec datastore.NodeSpec) error
	// mirrored lists the nodes whose backend-specific copies of their
	// blocks (Node.spec.podCIDRs on Kubernetes) differ from blocks, each
	// node's in the cluster's family order.
	mirrored func(ctx context.Context, blocks map[string][]netip.Prefix) ([]string, error)
}

const raceNodes = 2000

func raceSpec(i int) datastore.NodeSpec {
	return datastore.NodeSpec{Name: fmt.Sprintf("race-%04d", i), IP: netip.AddrFrom4([4]byte{100, 64, byte(i >> 8), byte(i)}),
		VTEPMAC: net.HardwareAddr{0x0e, 0, 0, 0, byte(i >> 8), byte(i)}}
}

// run registers raceNodes nodes, 64 at a time, while both controllers
// run, and fails the test unless every node ends with one block of its
// own of each pool that its record (and its mirrors) show, no block was
// ever shown on two nodes or changed on one, and the ledgers hold
// nothing else.
func (r race) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // first
	for i, s := range r.stores {
		c, err := controller.New(ctx, controller.Config{Cluster: r.cluster}, s)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := c.Run(ctx); err != nil {
				t.Errorf("controller %d: %v", i, err)
			}
		})
	}
	watch := newWatcher(r.stores[0])
	wg.Go(func() { watch.run(ctx) })

	start := time.Now()
	sem := make(chan struct{}, 64)
	var regs sync.WaitGroup
	for i := range raceNodes {
		sem <- struct{}{}
		regs.Go(func() {
			defer func() { <-sem }()
			if err := r.register(ctx, raceSpec(i)); err != nil {
				t.Errorf("registering %s: %v", raceSpec(i).Name, err)
			}
		})
	}
	regs.Wait()
	t.Logf("%d nodes registered in %.1fs", raceNodes, time.Since(start).Seconds())
	if t.Failed() {
		return
	}
	var problems []string
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		if problems = r.check(ctx); len(problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	t.Logf("checked %.1fs after the first registration", time.Since(start).Seconds())
	cancel()
	problems = append(problems, watch.problems()...)
	if len(problems) > 0 {
		t.Fatalf("%d problems, the first ones:\n%s", len(problems), strings.Join(problems[:min(len(problems), 10)], "\n"))
	}
}

// check reads the ledger and the records once and says what is wrong.
func (r race) check(ctx context.Context) []string {
	allocs, err := r.stores[1].Allocations(ctx)
	if err != nil {
		return []string{err.Error()}
	}
	nodes, err := r.stores[1].Nodes(ctx)
	if err != nil {
		return []string{err.Error()}
	}
	var problems []string
	blocksOf := map[string][]netip.Prefix{}
	for p, owner := range allocs {
		if other := datastore.BlockOf(blocksOf[owner], datastore.FamilyOf(p)); other.IsValid() {
			problems = append(problems, fmt.Sprintf("%s holds two blocks of a family in the ledger, %v and %v", owner, other, p))
		}
		blocksOf[owner] = r.cluster.InFamilyOrder(append(blocksOf[owner], p))
	}
	if len(nodes) != raceNodes {
		problems = append(problems, fmt.Sprintf("%d nodes registered, want %d", len(nodes), raceNodes))
	}
	for _, n := range nodes {
		switch blocks := blocksOf[n.Name]; {
		case len(blocks) != len(r.cluster.Pools):
			problems = append(problems, fmt.Sprintf("%s has blocks %v in the ledger, want one of each pool", n.Name, blocks))
		case !slices.Equal(n.PodCIDRs, blocks):
			problems = append(problems, fmt.Sprintf("%s's record shows %v, the ledger %v", n.Name, n.PodCIDRs, blocks))
		}
	}
	for owner, blocks := range blocksOf {
		if !slices.ContainsFunc(nodes, func(n datastore.Node) bool { return n.Name == owner }) {
			problems = append(problems, fmt.Sprintf("the ledger gives %v to %s, which is not registered", blocks, owner))
		}
	}
	if len(problems) > 0 || r.mirrored == nil {
		return problems
	}
	stale, err := r.mirrored(ctx, blocksOf)
	if err != nil {
		return []string{err.Error()}
	}
	for _, n := range stale {
		problems = append(problems, fmt.Sprintf("%s's mirror is not its blocks %v", n, blocksOf[n]))
	}
	return problems
}

// watcher follows a store's records on every change signal while the
// controllers run: a node's block of a family, once shown, never changes,
// and no two nodes show one block at once.
type watcher struct {
	s    datastore.Store
	mu   sync.Mutex
	seen map[string][]netip.Prefix
	bad  []string
}

func newWatcher(s datastore.Store) *watcher {
	return &watcher{s: s, seen: map[string][]netip.Prefix{}}
}

func (w *watcher) run(ctx context.Context) {
	changes := w.s.Changes(ctx)
	for range changes {
		nodes, err := w.s.Nodes(ctx)
		if err != nil {
			continue // ctx ended
		}
		w.mu.Lock()
		shown := map[netip.Prefix]string{}
		for _, n := range nodes {
			for _, p := range n.PodCIDRs {
				if other, ok := shown[p]; ok {
					w.bad = append(w.bad, fmt.Sprintf("%v shown on %s and %s at once", p, other, n.Name))
				}
				shown[p] = n.Name
				if had := datastore.BlockOf(w.seen[n.Name], datastore.FamilyOf(p)); had.IsValid() && had != p {
					w.bad = append(w.bad, fmt.Sprintf("%s was given %v, then %v", n.Name, had, p))
				} else if !had.IsValid() {
					w.seen[n.Name] = append(w.seen[n.Name], p)
				}
			}
		}
		w.mu.Unlock()
		select { // at most ten reads a second: thousands of records each
		case <-ctx.Done():
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (w *watcher) problems() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.bad
}

// Two controllers on one etcd, each with its own client: every claim
// batch is a transaction requiring its nodes and blocks to be free, each
// family's apart, in a dual-stack cluster.
func TestTwoControllersGiveEveryNodeOneBlockOnEtcd(t *testing.T) {
	e := etcdtest.Embedded(t, "")
	open := func() datastore.Store {
		s, err := etcdstore.New(context.Background(), etcdstore.Options{Endpoints: []string{e.ClientURL}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	agents := open()
	race{
		cluster: datastore.ClusterConfig{Pools: []datastore.Pool{
			{CIDR: netip.MustParsePrefix("10.0.0.0/8"), NodePrefixLen: 24}, {CIDR: netip.MustParsePrefix("fd00::/32"), NodePrefixLen: 64}}},
		stores:   [2]datastore.Store{open(), open()},
		register: agents.RegisterNode,
	}.run(t)
}
