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
// is started again if its subscription fails.
func (u *underlayWatcher) run(ctx context.Context) {
	go func() {
		for ctx.Err() == nil {
			if err := u.a.dp.WatchUnderlay(ctx, u.signal); err != nil {
				slog.Warn("watching the underlay; retrying", "err", err)
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
		}
	}()
	u.informed.run(ctx)
}
