// Package bpftest holds what tests of the eBPF programs share: a
// throwaway cgroup for the cgroup-attached ones (cgroup.go), a reader of
// their flow events (events.go), and the objects of an earlier ONC for
// upgrade tests, since an agent must adopt, or safely replace, what they
// pinned.
package bpftest

import (
	"bytes"
	"embed"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/onc-net/onc/datapath/bpf"
)

// v0 holds objects of the version with one object per attach point (up to
// commit e9d4f8c), built as `make generate` built them then: the fast
// path's egress and ingress-learning programs (every fast-path map,
// onc_cfg with the VNI, port, mark and addresses in it), the socket LB's
// connect4 and getpeername4 (every socket-LB map), the bypass's sockops
// and sk_msg (every bypass map).
//
//go:embed v0/*.o
var v0 embed.FS

// V0 objects, by the name of their bpf2go binding then.
const (
	V0EgressFast       = "egressfast"
	V0LearnIngress     = "learningress"
	V0SockConnect4     = "sockconnect4"
	V0SockGetpeername4 = "sockgetpeername4"
	V0SockOps          = "sockops"
	V0SkMsg            = "skmsg"
)

// LoadV0 loads a v0 object with its maps pinned by name in dir, creating
// or adopting them as a v0 agent did; the test's end closes it (its pins
// stay).
func LoadV0(t testing.TB, name, dir string) *ebpf.Collection {
	t.Helper()
	obj, err := v0.ReadFile("v0/" + name + "_bpfel.o")
	if err != nil {
		t.Fatal(err)
	}
	spec, err := ebpf.LoadCollectionSpecFromReader(bytes.NewReader(obj))
	if err != nil {
		t.Fatal(err)
	}
	c, err := ebpf.NewCollectionWithOptions(spec, ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: dir}})
	if err != nil {
		t.Fatalf("load v0 %s: %v", name, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// Entries counts m's entries.
func Entries(t testing.TB, m *ebpf.Map) int {
	t.Helper()
	var k, v []byte
	n := 0
	it := m.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// Counter is the value of the counter name among those read returns (a
// feature's Stats): the first of that name, whatever its family. A
// counter that is not there fails t.
func Counter(t testing.TB, read func() ([]bpf.Counter, error), name string) uint64 {
	t.Helper()
	counters, err := read()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range counters {
		if c.Name == name {
			return c.Value
		}
	}
	t.Fatalf("no counter %s in %v", name, counters)
	return 0
}
