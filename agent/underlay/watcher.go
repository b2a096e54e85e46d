// Package underlay is the agent's underlay watcher: it keeps the fast
// path's learned outer headers true to the underlay.
package underlay

import (
	"context"
	"log/slog"
	"time"

	"github.com/onc-net/onc/agent/watch"
)

// Datapath is what the underlay watcher needs of the kernel;
// *datapath/underlay.Node implements it.
type Datapath interface {
	// Watch calls changed after each route, uplink or neighbour
	// change that can make a learned outer header stale, until ctx ends or
	// its subscription fails.
	Watch(ctx context.Context, changed func()) error
	// EvictStaleHeaders removes the learned outer headers that no longer
	// match the underlay or the peers; it returns how many.
	EvictStaleHeaders() (int, error)
}

// Watcher evicts, on every route, uplink or neighbour change the datapath
// reports (and on every resync), the learned headers that no longer match,
// so their flows relearn through the slow path instead of being
// black-holed (docs/datapath.md, "Coherency").
type Watcher struct {
	*watch.Informed
	dp Datapath
}

// NewWatcher is the underlay watcher.
func NewWatcher(dp Datapath, resync time.Duration) *Watcher {
	w := &Watcher{dp: dp}
	w.Informed = watch.NewInformed("underlay", resync, w.reconcile)
	return w
}

func (w *Watcher) reconcile(context.Context, bool) error {
	n, err := w.dp.EvictStaleHeaders()
	if n > 0 {
		slog.Info("fast path: the underlay changed; evicted learned headers", "headers", n)
	}
	return err
}

// Run reconciles until ctx ends, fed by the datapath's netlink watch, which
// is started again (with backoff) if its subscription fails.
func (w *Watcher) Run(ctx context.Context) {
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		for backoff := watch.RetryFirst; ctx.Err() == nil; backoff = min(2*backoff, watch.RetryMax) {
			start := time.Now()
			err := w.dp.Watch(ctx, w.Signal)
			if err == nil {
				return // ctx ended
			}
			if time.Since(start) > watch.RetryMax {
				backoff = watch.RetryFirst // it had been working: a new failure
			}
			slog.Warn("watching the underlay; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
		}
	}()
	w.Informed.Run(ctx)
	<-watching
}
