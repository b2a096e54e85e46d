// Package watch is the reconcile loop every watcher of the agent runs
// (docs/architecture.md, "Watchers").
package watch

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// Watcher runs one capability's reconcile loop, the pattern every watcher
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
type Watcher struct {
	name      string
	resync    time.Duration
	reconcile func(ctx context.Context, resync bool) error

	mu     sync.Mutex
	status Status
	// queued is when the oldest signal no reconcile has read yet came;
	// inflight is the oldest one the running (or last failed) reconcile
	// covers. Status.Pending is the older of the two.
	queued, inflight time.Time
}

// Status is what a watcher reports.
type Status struct {
	Name string
	// Seen counts input signals; Applied is the Seen value that the last
	// successful reconcile covered (it read the state after that signal).
	Seen, Applied uint64
	LastApplied   time.Time
	LastError     string // of the last reconcile; "" if it succeeded
	// Pending is when the oldest signal not yet applied came; zero when
	// every signal is applied. A watcher that keeps up resets it at each
	// reconcile however busy its input, one that fails or hangs does not.
	Pending time.Time
}

const (
	// RetryFirst and RetryMax bound the backoff of a failing reconcile.
	RetryFirst = 200 * time.Millisecond
	RetryMax   = 30 * time.Second
)

// New is a watcher named name that runs reconcile.
func New(name string, resync time.Duration, reconcile func(ctx context.Context, resync bool) error) *Watcher {
	return &Watcher{name: name, resync: resync, reconcile: reconcile, status: Status{Name: name}}
}

// Run reconciles on every signal of trigger, on every resync period and on
// retries, until ctx ends or trigger is closed. The first reconcile and
// those of a resync are full ones (reconcile's resync argument): they
// re-check the kernel, not only what changed.
func (w *Watcher) Run(ctx context.Context, trigger <-chan struct{}) {
	resync := time.NewTicker(w.resync)
	defer resync.Stop()
	var retry <-chan time.Time
	backoff := RetryFirst
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
			if w.queued.IsZero() {
				w.queued = time.Now()
			}
			w.mu.Unlock()
		case <-resync.C:
			full = true
		case <-retry:
		}
		if w.apply(ctx, full) {
			retry, backoff, full = nil, RetryFirst, false
			continue
		}
		if ctx.Err() != nil {
			return
		}
		retry = time.After(backoff)
		backoff = min(2*backoff, RetryMax)
	}
}

// apply runs reconcile once and records the outcome; true on success.
func (w *Watcher) apply(ctx context.Context, full bool) bool {
	w.mu.Lock()
	gen := w.status.Seen
	if w.inflight.IsZero() { // else a failed attempt's signals, older
		w.inflight = w.queued
	}
	w.queued = time.Time{}
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
	w.inflight = time.Time{}
	return true
}

// Await calls signal and waits until a reconcile that read the state after
// the call has succeeded. If ctx ends first, the error says why, with the
// last reconcile's error if there was one.
func (w *Watcher) Await(ctx context.Context, signal func()) error {
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
func (w *Watcher) Status() Status {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.status
	st.Pending = w.inflight
	if st.Pending.IsZero() {
		st.Pending = w.queued
	}
	return st
}

// Informed is a watcher signalled by callbacks (informer events, CNI
// verbs) instead of a channel it is handed; the watchers of Kubernetes
// objects use it. Signals coalesce into one pending reconcile.
type Informed struct {
	w       *Watcher
	trigger chan struct{}
}

// NewInformed is an informed watcher named name that runs reconcile.
func NewInformed(name string, resync time.Duration, reconcile func(ctx context.Context, resync bool) error) *Informed {
	return &Informed{w: New(name, resync, reconcile), trigger: make(chan struct{}, 1)}
}

// Run reconciles on every Signal until ctx ends.
func (i *Informed) Run(ctx context.Context) { i.w.Run(ctx, i.trigger) }

// Signal asks for a reconcile.
func (i *Informed) Signal() {
	select {
	case i.trigger <- struct{}{}:
	default:
	}
}

// Await signals and waits until a reconcile that read the state after the
// signal has succeeded (Watcher.Await).
func (i *Informed) Await(ctx context.Context) error { return i.w.Await(ctx, i.Signal) }

// Loop is the watcher underneath, for status.
func (i *Informed) Loop() *Watcher { return i.w }
