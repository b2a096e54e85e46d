package controller_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
	"github.com/onc-net/onc/datastore/etcdstore"
	"github.com/onc-net/onc/internal/testutil"
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
	if err != nil || got != stopped.PodCIDR || !got.IsValid() {
		t.Fatalf("RemoveNode(stopped) = %v, %v; want its CIDR %v released", got, err, stopped.PodCIDR)
	}
	if _, err := s.Node(ctx, "stopped"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("the removed node is still registered (%v)", err)
	}
	if allocs, _ := s.Allocations(ctx); allocs[stopped.PodCIDR] != "" {
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

	orphan := netip.MustParsePrefix("10.244.200.0/24")
	if _, err := s.ClaimCIDR(ctx, "ghost", orphan); err != nil {
		t.Fatal(err)
	}
	if got, err := controller.RemoveNode(ctx, s, nil, "ghost"); err != nil || got != orphan {
		t.Fatalf("RemoveNode(ghost) = %v, %v; want its block %v released", got, err, orphan)
	}
	if allocs, _ := s.Allocations(ctx); len(allocs) != 1 || allocs[orphan] != "" {
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
	if n, err := s.Node(ctx, "again"); err != nil || !n.PodCIDR.IsValid() {
		t.Fatalf("the node registered again: %+v, %v; want it kept and given a CIDR", n, err)
	}
}

// On the controller's embedded etcd, RemoveNode also deletes the node's
// etcd user and role: its certificate then reads and writes nothing. A
// node that never registered has its credentials revoked all the same; a
// live one keeps them.
func TestRemoveNodeRevokesItsCredentials(t *testing.T) {
	e := testutil.SecureEtcd(t)
	ctx := context.Background()
	open := func(files etcdstore.TLSFiles) *etcdstore.Store {
		s, err := etcdstore.New(ctx, etcdstore.Options{Endpoints: []string{e.ClientURL}, TLSFiles: files})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	ctl := open(e.PKI.Controller())
	agent := func(name string) *etcdstore.Store {
		if err := ctl.AuthorizeNode(ctx, name); err != nil {
			t.Fatal(err)
		}
		files, err := e.PKI.IssueNode(name, t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		return open(files)
	}
	gone, never, live := agent("gone"), agent("never"), agent("live")
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
