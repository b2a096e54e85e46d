package bpftest

import (
	"context"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/onc-net/onc/datapath/bpf"
	dpflows "github.com/onc-net/onc/datapath/flows"
)

// Events reads a ring of flow events (onc_events) as the agent does,
// until the test ends.
type Events struct{ ch chan dpflows.Event }

// ReadEvents starts reading ring.
func ReadEvents(t testing.TB, ring *ebpf.Map) *Events {
	t.Helper()
	names, err := bpf.LoadEventNames()
	if err != nil {
		t.Fatal(err)
	}
	rd, err := dpflows.OpenEvents(ring, names)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e := &Events{ch: make(chan dpflows.Event, 1024)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = rd.Run(ctx, func(ev dpflows.Event) { e.ch <- ev }, func(err error) { t.Errorf("an event the reader cannot decode: %v", err) })
	}()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// Collect is the events of class ("": every class) that arrive within the
// reader's poll deadline and a margin.
func (e *Events) Collect(class string) []dpflows.Event {
	var out []dpflows.Event
	deadline := time.After(300 * time.Millisecond)
	for {
		select {
		case ev := <-e.ch:
			if class == "" || ev.Class == class {
				out = append(out, ev)
			}
		case <-deadline:
			return out
		}
	}
}
