package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// watcher runs one capability's reconcile loop, the pattern every watcher
// of the agent follows (docs/architecture.md):
//   - its input is level-triggered: a signal (datastore Changes, informer
//     events) says only "something changed", and reconcile reads the whole
//     desired state itself, so coalesced or repeated signals lose nothing;
//   - reconcile is idempotent: it makes the kernel match the desired state
//     and may run any number of times;
//   - a periodic resync runs reconcile anyway, as insurance against a missed
//     signal or drift in the kernel;
//   - a failed reconcile is retried with backoff, not left until the next
//     change;
//   - it reports the generation of input it has seen and the one it has
//     applied (onctl status), so an operator sees a watcher that lags.
type watcher struct {
	name      string
	resync    time.Duration
	reconcile func(ctx context.Context, resync bool) error

	mu     sync.Mutex
	status WatcherStatus
}

// WatcherStatus is what a watcher reports.
type WatcherStatus struct {
	Name string
	// Seen counts input signals; Applied is the Seen value that the last
	// successful reconcile covered (it read the state after that signal).
	Seen, Applied uint64
	LastApplied   time.Time
	LastError     string // of the last reconcile; "" if it succeeded
}

const (
	retryFirst = 200 * time.Millisecond
	retryMax   = 30 * time.Second
)

func newWatcher(name string, resync time.Duration, reconcile func(ctx context.Context, resync bool) error) *watcher {
	return &watcher{name: name, resync: resync, reconcile: reconcile, status: WatcherStatus{Name: name}}
}

// run reconciles on every signal of trigger, on every resync period and on
// retries, until ctx ends or trigger is closed. The first reconcile and
// those of a resync are full ones (reconcile's resync argument): they
// re-check the kernel, not only what changed.
func (w *watcher) run(ctx context.Context, trigger <-chan struct{}) {
	resync := time.NewTicker(w.resync)
	defer resync.Stop()
	var retry <-chan time.Time
	backoff := retryFirst
	full := true
	for {
		select {
		case <-ctx.Done():
			return
		case _, ok := <-trigger:
			if !ok {
				return
			}
			w.mu.Lock()
			w.status.Seen++
			w.mu.Unlock()
		case <-resync.C:
			full = true
		case <-retry:
		}
		if w.apply(ctx, full) {
			retry, backoff, full = nil, retryFirst, false
			continue
		}
		if ctx.Err() != nil {
			return
		}
		retry = time.After(backoff)
		backoff = min(2*backoff, retryMax)
	}
}

// apply runs reconcile once and records the outcome; true on success.
func (w *watcher) apply(ctx context.Context, full bool) bool {
	w.mu.Lock()
	gen := w.status.Seen
	w.mu.Unlock()
	err := w.reconcile(ctx, full)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		if ctx.Err() == nil {
			if w.status.LastError != err.Error() {
				slog.Error("reconcile failed; retrying", "watcher", w.name, "err", err)
			}
			w.status.LastError = err.Error()
		}
		return false
	}
	w.status.Applied, w.status.LastApplied, w.status.LastError = gen, time.Now(), ""
	return true
}

// await calls signal and waits until a reconcile that read the state after
// the call has succeeded. If ctx ends first, the error says why, with the
// last reconcile's error if there was one.
func (w *watcher) await(ctx context.Context, signal func()) error {
	w.mu.Lock()
	target := w.status.Seen + 1 // the signal's, or a pending one's: both reconcile after now
	w.mu.Unlock()
	signal()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		st := w.Status()
		if st.Applied >= target {
			return nil
		}
		select {
		case <-ctx.Done():
			if st.LastError != "" {
				return fmt.Errorf("%w; last error: %s", ctx.Err(), st.LastError)
			}
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// Status reports the watcher's progress.
func (w *watcher) Status() WatcherStatus {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.status
}

// informed is a watcher signalled by callbacks (informer events, CNI
// verbs) instead of a channel it is handed; the watchers of Kubernetes
// objects embed it. Signals coalesce into one pending reconcile.
type informed struct {
	w       *watcher
	trigger chan struct{}
}

func newInformed(name string, resync time.Duration, reconcile func(ctx context.Context, resync bool) error) *informed {
	return &informed{w: newWatcher(name, resync, reconcile), trigger: make(chan struct{}, 1)}
}

func (i *informed) run(ctx context.Context) { i.w.run(ctx, i.trigger) }

// signal asks for a reconcile.
func (i *informed) signal() {
	select {
	case i.trigger <- struct{}{}:
	default:
	}
}
