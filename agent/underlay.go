package agent

import (
	"context"
	"log/slog"
	"time"
)

// underlayWatcher keeps the fast path's learned outer headers true to the
// underlay: on every route, uplink or neighbour change the datapath
// reports (and on every resync) it evicts the headers that no longer match,
// so their flows relearn through the slow path instead of being
// black-holed (docs/datapath.md, "Coherency").
type underlayWatcher struct {
	*informed
	a *Agent
}

func newUnderlayWatcher(a *Agent) *underlayWatcher {
	u := &underlayWatcher{a: a}
	u.informed = newInformed("underlay", a.cfg.Resync, u.reconcile)
	return u
}

func (u *underlayWatcher) reconcile(context.Context, bool) error {
	n, err := u.a.dp.EvictStaleHeaders()
	if n > 0 {
		slog.Info("fast path: the underlay changed; evicted learned headers", "headers", n)
	}
	return err
}

// run reconciles until ctx ends, fed by the datapath's netlink watch, which
// is started again (with backoff) if its subscription fails.
func (u *underlayWatcher) run(ctx context.Context) {
	watching := make(chan struct{})
	go func() {
		defer close(watching)
		for backoff := retryFirst; ctx.Err() == nil; backoff = min(2*backoff, retryMax) {
			start := time.Now()
			err := u.a.dp.WatchUnderlay(ctx, u.signal)
			if err == nil {
				return // ctx ended
			}
			if time.Since(start) > retryMax {
				backoff = retryFirst // it had been working: a new failure
			}
			slog.Warn("watching the underlay; retrying", "err", err, "in", backoff)
			select {
			case <-ctx.Done():
			case <-time.After(backoff):
			}
		}
	}()
	u.informed.run(ctx)
	<-watching
}
