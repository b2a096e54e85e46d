package bpf

import (
	"io"
	"log/slog"
	"sync"
)

// LoadOnce is a feature's programs as a node loads them: once, at
// bring-up, and a node whose feature cannot load still comes up without
// it. T is the loaded feature (*services.LB, *bypass.Bypass).
type LoadOnce[T io.Closer] struct {
	mu     sync.Mutex
	v      T
	ok     bool  // v is loaded
	err    error // why not, once Load ran
	loaded bool  // Load ran
}

// Load runs load the first time it is called; a failure is logged with
// unavailable, which says what the node does without the feature.
func (l *LoadOnce[T]) Load(unavailable string, load func() (T, bool, error)) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.loaded {
		return
	}
	l.loaded = true
	l.v, l.ok, l.err = load()
	if l.err != nil {
		slog.Error(unavailable, "err", l.err)
	}
}

// Get is the loaded feature and true, or false while it is not loaded.
func (l *LoadOnce[T]) Get() (T, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.v, l.ok
}

// Err is why Load loaded nothing: nil while it has not run, or loaded.
func (l *LoadOnce[T]) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Close releases the loaded feature's handles.
func (l *LoadOnce[T]) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.ok {
		return nil
	}
	var zero T
	err := l.v.Close()
	l.v, l.ok = zero, false
	return err
}
