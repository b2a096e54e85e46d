package underlay

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// flakyUnderlay's first subscription fails; the second reports one change
// and then holds until the context ends.
type flakyUnderlay struct {
	watches, evictions atomic.Int32
}

func (u *flakyUnderlay) Watch(ctx context.Context, changed func()) error {
	if u.watches.Add(1) == 1 {
		return errors.New("netlink subscription refused")
	}
	changed()
	<-ctx.Done()
	return nil
}

func (u *flakyUnderlay) EvictStaleHeaders() (int, error) {
	u.evictions.Add(1)
	return 1, nil
}

// A failed subscription is started again, and a change it reports
// evicts (besides the first, full reconcile's pass).
func TestWatcherResubscribesAndEvictsOnChange(t *testing.T) {
	u := &flakyUnderlay{}
	w := NewWatcher(u, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("the watcher did not stop with its context")
		}
	}()
	for deadline := time.Now().Add(5 * time.Second); u.evictions.Load() < 1 || w.Loop().Status().Applied < 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after %d subscriptions: %d evictions, status %+v; want the change applied", u.watches.Load(), u.evictions.Load(), w.Loop().Status())
		}
	}
	if n := u.watches.Load(); n != 2 {
		t.Errorf("%d subscriptions, want 2: the failed one and its retry", n)
	}
}
