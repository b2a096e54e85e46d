package bpf_test

import (
	"errors"
	"testing"

	"github.com/onc-net/onc/datapath/bpf"
)

type feature struct{ closed int }

func (f *feature) Close() error { f.closed++; return nil }

// A feature loads once: a failure is remembered, not retried, and a
// loaded one is closed once.
func TestLoadOnce(t *testing.T) {
	var failed bpf.LoadOnce[*feature]
	calls := 0
	for range 2 {
		failed.Load("test feature unavailable", func() (*feature, bool, error) {
			calls++
			return nil, false, errors.New("no sockmap here")
		})
	}
	if _, ok := failed.Get(); ok || calls != 1 || failed.Err() == nil || failed.Err().Error() != "no sockmap here" {
		t.Fatalf("after a failed load: loaded %v, %d calls, err %v; want not loaded, 1 call, the error", ok, calls, failed.Err())
	}
	if err := failed.Close(); err != nil {
		t.Fatal(err)
	}

	var loaded bpf.LoadOnce[*feature]
	if _, ok := loaded.Get(); ok || loaded.Err() != nil {
		t.Fatal("loaded before Load")
	}
	f := &feature{}
	loaded.Load("test feature unavailable", func() (*feature, bool, error) { return f, true, nil })
	if got, ok := loaded.Get(); !ok || got != f || loaded.Err() != nil {
		t.Fatalf("after a load: %v %v %v", got, ok, loaded.Err())
	}
	for range 2 {
		if err := loaded.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, ok := loaded.Get(); ok || f.closed != 1 {
		t.Fatalf("after Close twice: loaded %v, closed %d times; want released, once", ok, f.closed)
	}
}
