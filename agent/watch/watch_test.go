package watch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// watcherRun runs a watcher with reconcile until the test ends; it returns
// the trigger and a wait for the watcher's status.
func watcherRun(t *testing.T, resync time.Duration, reconcile func(context.Context, bool) error) (*Watcher, chan struct{}, func(string, func(Status) bool)) {
	w := New("test", resync, reconcile)
	trigger := make(chan struct{}, 1)
	c, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(c, trigger); close(done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(2 * time.Second):
			t.Error("the watcher did not stop with its context")
		}
	})
	waitFor := func(what string, cond func(Status) bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !cond(w.Status()); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: status %+v", what, w.Status())
			}
		}
	}
	return w, trigger, waitFor
}

// Every resync period reconciles, fully, without a signal.
func TestWatcherResyncs(t *testing.T) {
	var calls, full atomic.Int32
	_, trigger, waitFor := watcherRun(t, 100*time.Millisecond, func(_ context.Context, resync bool) error {
		calls.Add(1)
		if resync {
			full.Add(1)
		}
		return nil
	})
	trigger <- struct{}{}
	waitFor("first signal applied", func(s Status) bool { return s.Seen == 1 && s.Applied == 1 })
	waitFor("three resyncs", func(Status) bool { return calls.Load() >= 4 })
	if c, f := calls.Load(), full.Load(); c != f {
		t.Errorf("%d reconciles, %d full: the first and every resync must be full", c, f)
	}
}

// A failed reconcile is retried with backoff, not left to the next signal
// or resync (an hour away here), and the generations say what was applied.
func TestWatcherRetries(t *testing.T) {
	var calls atomic.Int32
	var failing atomic.Bool
	_, trigger, waitFor := watcherRun(t, time.Hour, func(context.Context, bool) error {
		calls.Add(1)
		if failing.Load() {
			return errors.New("kernel said no")
		}
		return nil
	})
	trigger <- struct{}{}
	waitFor("first signal applied", func(s Status) bool { return s.Seen == 1 && s.Applied == 1 && s.LastError == "" })
	failing.Store(true)
	trigger <- struct{}{}
	waitFor("failure recorded", func(s Status) bool { return s.Seen == 2 && s.Applied == 1 && s.LastError == "kernel said no" })
	waitFor("a retry", func(Status) bool { return calls.Load() >= 3 })
	failing.Store(false)
	waitFor("retried until it worked", func(s Status) bool { return s.Seen == 2 && s.Applied == 2 && s.LastError == "" })
}

// Only the first reconcile and resyncs re-check the kernel; a signal asks
// for what changed.
func TestWatcherSignalsAreIncremental(t *testing.T) {
	var full []bool
	var mu sync.Mutex
	_, trigger, waitFor := watcherRun(t, time.Hour, func(_ context.Context, resync bool) error {
		mu.Lock()
		full = append(full, resync)
		mu.Unlock()
		return nil
	})
	for i := uint64(1); i <= 3; i++ {
		trigger <- struct{}{}
		waitFor(fmt.Sprintf("signal %d applied", i), func(s Status) bool { return s.Applied == i })
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(full) != "[true false false]" {
		t.Errorf("full reconciles per signal: %v, want [true false false]", full)
	}
}

// Pending dates the oldest signal not yet applied: it holds across failed
// retries and later signals, and clears when a reconcile succeeds.
func TestWatcherPending(t *testing.T) {
	var failing atomic.Bool
	w, trigger, waitFor := watcherRun(t, time.Hour, func(context.Context, bool) error {
		if failing.Load() {
			return errors.New("kernel said no")
		}
		return nil
	})
	trigger <- struct{}{}
	waitFor("first signal applied", func(s Status) bool { return s.Applied == 1 && s.Pending.IsZero() })

	failing.Store(true)
	before := time.Now()
	trigger <- struct{}{}
	waitFor("failure recorded", func(s Status) bool { return s.LastError != "" })
	first := w.Status().Pending
	if first.Before(before) || first.After(time.Now()) {
		t.Fatalf("pending since %v, want the second signal's time (after %v)", first, before)
	}
	trigger <- struct{}{}
	waitFor("third signal seen", func(s Status) bool { return s.Seen == 3 })
	time.Sleep(3 * RetryFirst) // retries, all failing
	if got := w.Status().Pending; !got.Equal(first) {
		t.Fatalf("pending since %v after retries and a later signal, want the oldest, %v", got, first)
	}
	failing.Store(false)
	waitFor("everything applied", func(s Status) bool { return s.Applied == 3 && s.Pending.IsZero() })
}
