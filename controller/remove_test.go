package controller_test

import (
	"context"
	"errors"
	"net/netip"
	"testing"
	"time"

	"github.com/onc-net/onc/controller"
	"github.com/onc-net/onc/datastore"
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

	got, err := controller.RemoveNode(ctx, s, "stopped")
	if err != nil || got != stopped.PodCIDR || !got.IsValid() {
		t.Fatalf("RemoveNode(stopped) = %v, %v; want its CIDR %v released", got, err, stopped.PodCIDR)
	}
	if _, err := s.Node(ctx, "stopped"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("the removed node is still registered (%v)", err)
	}
	if allocs, _ := s.Allocations(ctx); allocs[stopped.PodCIDR] != "" {
		t.Fatalf("its CIDR is still allocated: %v", allocs)
	}
	if _, err := controller.RemoveNode(ctx, s, "stopped"); !errors.Is(err, datastore.ErrNotFound) {
		t.Fatalf("removing it again: %v, want ErrNotFound", err)
	}

	if _, err := controller.RemoveNode(ctx, s, "live"); !errors.Is(err, controller.ErrNodeAlive) {
		t.Fatalf("removing a live node: %v, want ErrNodeAlive", err)
	}
	if _, err := s.Node(ctx, "live"); err != nil {
		t.Fatalf("a refused removal removed the node: %v", err)
	}

	orphan := netip.MustParsePrefix("10.244.200.0/24")
	if _, err := s.ClaimCIDR(ctx, "ghost", orphan); err != nil {
		t.Fatal(err)
	}
	if got, err := controller.RemoveNode(ctx, s, "ghost"); err != nil || got != orphan {
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
	if _, err := controller.RemoveNode(ctx, s, "again"); err != nil {
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
