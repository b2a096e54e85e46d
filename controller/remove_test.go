package controller_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdserver/etcdtest"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RemoveNode (onc-controller remove-node) on a real etcd: a stopped node's
// registration and pod CIDR go in one step; a live one is refused; a block
// left without a registration is released; an unknown name is ErrNotFound;
// a removed name registered again later is a new node, not an expired one.
func TestRemoveNode(t *testing.T) {
	s, c := setup(t, 0)
	ctx := context.Background()
	register(t, s, "stopped")
	register(t, s, "live")
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	stopped, _ := s.Node(ctx, "stopped")
	alive, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = s.KeepAlive(alive, "live", time.Minute) }()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if live, _ := s.Liveness(ctx); live["live"] {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the live node never held its lease")
		}
	}

	got, err := controller.RemoveNode(ctx, s, nil, "stopped")
	if err != nil || !slices.Equal(got, stopped.PodCIDRs) || len(got) == 0 {
		t.Fatalf("RemoveNode(stopped) = %v, %v; want its CIDRs %v released", got, err, stopped.PodCIDRs)
	}
	if _, err := s.Node(ctx, "stopped"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("the removed node is still registered (%v)", err)
	}
	if allocs, _ := s.Allocations(ctx); allocs[stopped.IPv4PodCIDR()] != "" {
		t.Fatalf("its CIDR is still allocated: %v", allocs)
	}
	if _, err := controller.RemoveNode(ctx, s, nil, "stopped"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("removing it again: %v, want ErrNotFound", err)
	}

	if _, err := controller.RemoveNode(ctx, s, nil, "live"); !errors.Is(err, controller.ErrNodeAlive) {
		t.Fatalf("removing a live node: %v, want ErrNodeAlive", err)
	}
	if _, err := s.Node(ctx, "live"); err != nil {
		t.Fatalf("a refused removal removed the node: %v", err)
	}

	orphans := []netip.Prefix{netip.MustParsePrefix("10.244.200.0/24"), netip.MustParsePrefix("fd00:10:244:200::/64")}
	for _, p := range orphans {
		if _, err := datastore.ClaimCIDR(ctx, s, "ghost", p); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := controller.RemoveNode(ctx, s, nil, "ghost"); err != nil || !slices.Equal(got, orphans) {
		t.Fatalf("RemoveNode(ghost) = %v, %v; want its blocks %v released", got, err, orphans)
	}
	if allocs, _ := s.Allocations(ctx); len(allocs) != 1 || allocs[orphans[0]] != "" {
		t.Fatalf("allocations left: %v, want only the live node's", allocs)
	}
}

// A node removed from outside and registered again later is a new node:
// the controller forgot when it last saw the old one, so it does not expire
// the new one at once.
func TestRemovedNodeRegisteredAgainIsNew(t *testing.T) {
	s, c := setup(t, 200*time.Millisecond)
	ctx := context.Background()
	register(t, s, "again")
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := controller.RemoveNode(ctx, s, nil, "again"); err != nil {
		t.Fatal(err)
	}
	if err := c.Reconcile(ctx); err != nil { // the removal's change signal
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // longer than the node timeout
	register(t, s, "again")
	if err := c.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := s.Node(ctx, "again"); err != nil || !n.IPv4PodCIDR().IsValid() {
		t.Fatalf("the node registered again: %+v, %v; want it kept and given a CIDR", n, err)
	}
}

// On the controller's embedded etcd, RemoveNode also deletes the node's
// etcd user and role: its certificate then reads and writes nothing. A
// node that never registered has its credentials revoked all the same; a
// live one keeps them.
func TestRemoveNodeRevokesItsCredentials(t *testing.T) {
	ctl, agent := secureEtcd(t)
	ctx := context.Background()
	gone, _ := agent("gone")
	never, _ := agent("never")
	live, _ := agent("live")
	register(t, gone, "gone")
	register(t, live, "live")
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = live.KeepAlive(kctx, "live", time.Minute) }()
	testutil.WaitFor(t, "live's lease", 10*time.Second, func() bool { l, _ := ctl.Liveness(ctx); return l["live"] })

	if _, err := controller.RemoveNode(ctx, ctl, ctl, "gone"); err != nil {
		t.Fatal(err)
	}
	if _, err := controller.RemoveNode(ctx, ctl, ctl, "never"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("removing a node that never registered: %v, want ErrNotFound", err)
	}
	if _, err := controller.RemoveNode(ctx, ctl, ctl, "live"); !errors.Is(err, controller.ErrNodeAlive) {
		t.Fatalf("removing a live node: %v, want ErrNodeAlive", err)
	}
	for name, s := range map[string]*etcdstore.Store{"gone": gone, "never": never} {
		if _, err := s.Nodes(ctx); err == nil {
			t.Errorf("%s's credentials still read after its removal", name)
		}
		if err := s.RegisterNode(ctx, datastore.NodeSpec{Name: name, IP: netip.MustParseAddr("192.0.2.1"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}); err == nil {
			t.Errorf("%s's credentials still write after its removal", name)
		}
	}
	if _, err := live.Nodes(ctx); err != nil {
		t.Fatalf("a refused removal took the live node's credentials: %v", err)
	}
}

// secureEtcd starts an etcd as the controller runs it and returns the
// controller's store on it (root), and agent, which makes a node's etcd
// user and returns its agent's store and a raw client with its
// certificate.
func secureEtcd(t *testing.T) (*etcdstore.Store, func(name string) (*etcdstore.Store, *clientv3.Client)) {
	e := etcdtest.Secure(t)
	return etcdtest.Store(t, e, e.PKI.Controller()), func(name string) (*etcdstore.Store, *clientv3.Client) {
		files := etcdtest.Node(t, e, name)
		return etcdtest.Store(t, e, files), etcdtest.Client(t, e, files)
	}
}

// revoker records the order of RemoveNodeEvenIfAlive's steps: each step
// must find the node's records still there (they go last), and the
// credentials must go before its liveness ends.
type revoker struct {
	controller.Revoker
	store datastore.Store
	t     *testing.T
	steps []string
}

func (r *revoker) step(ctx context.Context, name, what string) {
	if _, err := r.store.Node(ctx, name); err != nil {
		r.t.Errorf("%s: the node's records went before it (%v)", what, err)
	}
	r.steps = append(r.steps, what)
}

func (r *revoker) RevokeNode(ctx context.Context, name string) error {
	r.step(ctx, name, "revoke")
	return r.Revoker.RevokeNode(ctx, name)
}

func (r *revoker) EndLiveness(ctx context.Context, name string) error {
	r.step(ctx, name, "end liveness")
	return r.Revoker.EndLiveness(ctx, name)
}

// A node whose liveness lease another node keeps alive (etcd checks no
// permission on renewal) is refused by RemoveNode; RemoveNodeEvenIfAlive
// revokes its credentials, ends the lease and removes it. It removes a
// node that is not alive as well, and keeps a real agent that still runs
// from coming back; without the embedded etcd's credentials it is refused.
func TestRemoveNodeEvenIfAlive(t *testing.T) {
	ctl, agent := secureEtcd(t)
	ctx := context.Background()
	cidrOf := map[string]netip.Prefix{}
	node := func(name string, i int) (*etcdstore.Store, *clientv3.Client) {
		s, cli := agent(name)
		register(t, s, name)
		cidrOf[name] = netip.MustParsePrefix(fmt.Sprintf("10.244.%d.0/24", i))
		if _, err := datastore.ClaimCIDR(ctx, ctl, name, cidrOf[name]); err != nil {
			t.Fatal(err)
		}
		return s, cli
	}
	kept, keptCli := node("kept", 1)
	_, keeper := node("keeper", 2)
	idle, _ := node("idle", 3)
	live, _ := node("live", 4)
	untouched, _ := node("untouched", 5)

	// kept's agent takes its lease and goes without revoking it; keeper
	// renews it from then on, with its own certificate.
	lease, err := keptCli.Grant(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keptCli.Put(ctx, "/onc/alive/kept", "1", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	keptCli.Close()
	got, err := keeper.Get(ctx, "/onc/alive/kept")
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("keeper reads kept's liveness: %v, %v", got, err)
	}
	id := clientv3.LeaseID(got.Kvs[0].Lease)
	renew := func() error { _, err := keeper.KeepAliveOnce(ctx, id); return err }
	kctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for kctx.Err() == nil {
			_ = renew()
			time.Sleep(300 * time.Millisecond)
		}
	}()
	time.Sleep(3 * time.Second) // longer than the lease's TTL
	if l, _ := ctl.Liveness(ctx); !l["kept"] {
		t.Fatal("keeper did not keep kept's lease alive: the premise is gone")
	}

	if _, err := controller.RemoveNode(ctx, ctl, ctl, "kept"); !errors.Is(err, controller.ErrNodeAlive) {
		t.Fatalf("RemoveNode of a node kept alive: %v, want ErrNodeAlive", err)
	}
	r := &revoker{Revoker: ctl, store: ctl, t: t}
	if got, err := controller.RemoveNodeEvenIfAlive(ctx, ctl, r, "kept"); err != nil || !slices.Equal(got, []netip.Prefix{cidrOf["kept"]}) {
		t.Fatalf("RemoveNodeEvenIfAlive(kept) = %v, %v; want its CIDR %v released", got, err, cidrOf["kept"])
	}
	if want := []string{"revoke", "end liveness"}; !slices.Equal(r.steps, want) {
		t.Errorf("steps %q, want %q", r.steps, want)
	}
	if err := renew(); err == nil {
		t.Error("keeper still renews kept's lease after its removal")
	}

	if got, err := controller.RemoveNodeEvenIfAlive(ctx, ctl, ctl, "idle"); err != nil || !slices.Equal(got, []netip.Prefix{cidrOf["idle"]}) {
		t.Fatalf("RemoveNodeEvenIfAlive(idle), not alive = %v, %v; want its CIDR %v released", got, err, cidrOf["idle"])
	}

	lctx, lcancel := context.WithCancel(ctx)
	defer lcancel()
	go func() { _ = live.KeepAlive(lctx, "live", time.Minute) }()
	testutil.WaitFor(t, "live's lease", 10*time.Second, func() bool { l, _ := ctl.Liveness(ctx); return l["live"] })
	if got, err := controller.RemoveNodeEvenIfAlive(ctx, ctl, ctl, "live"); err != nil || !slices.Equal(got, []netip.Prefix{cidrOf["live"]}) {
		t.Fatalf("RemoveNodeEvenIfAlive(live), its agent running = %v, %v; want its CIDR %v released", got, err, cidrOf["live"])
	}
	time.Sleep(1500 * time.Millisecond) // the agent takes a new lease after a second

	for name, s := range map[string]*etcdstore.Store{"kept": kept, "idle": idle, "live": live} {
		if _, err := ctl.Node(ctx, name); !errors.Is(err, datastore.ErrNotFound) {
			t.Errorf("%s is still registered (%v)", name, err)
		}
		if l, _ := ctl.Liveness(ctx); l[name] {
			t.Errorf("%s still looks alive", name)
		}
		if allocs, _ := ctl.Allocations(ctx); allocs[cidrOf[name]] != "" {
			t.Errorf("%s's CIDR %v is still allocated", name, cidrOf[name])
		}
		if _, err := s.Nodes(ctx); err == nil {
			t.Errorf("%s's credentials still read after its removal", name)
		}
		if err := s.RegisterNode(ctx, datastore.NodeSpec{Name: name, IP: netip.MustParseAddr("192.0.2.1"), VTEPMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1}}); err == nil {
			t.Errorf("%s's credentials still write after its removal", name)
		}
	}

	if _, err := controller.RemoveNodeEvenIfAlive(ctx, ctl, nil, "untouched"); err == nil {
		t.Fatal("RemoveNodeEvenIfAlive without the embedded etcd's credentials: no error")
	}
	if _, err := ctl.Node(ctx, "untouched"); err != nil {
		t.Fatalf("a refused removal removed the node: %v", err)
	}
	if _, err := untouched.Nodes(ctx); err != nil {
		t.Fatalf("a refused removal took the node's credentials: %v", err)
	}
}
