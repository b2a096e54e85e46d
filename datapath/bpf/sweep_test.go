//go:build privileged

package bpf_test

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/onc-net/onc/internal/testutil"
)

func TestDeleteIf(t *testing.T) {
	testutil.Privileged(t)
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Hash, KeySize: 4, ValueSize: 8, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for k := uint32(1); k <= 6; k++ {
		if err := m.Put(k, uint64(k)*10); err != nil {
			t.Fatal(err)
		}
	}
	// By key or by value, as ForgetPods sweeps ip → cookie and cookie → ip.
	gone, err := bpf.DeleteIf(m, func(k uint32, v uint64) bool { return k%2 == 0 || v == 50 })
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(gone)
	if want := []uint32{2, 4, 5, 6}; !slices.Equal(gone, want) {
		t.Errorf("deleted %v, want %v", gone, want)
	}
	var left []uint32
	var k uint32
	var v uint64
	for it := m.Iterate(); it.Next(&k, &v); {
		left = append(left, k)
	}
	slices.Sort(left)
	if want := []uint32{1, 3}; !slices.Equal(left, want) {
		t.Errorf("left %v, want %v", left, want)
	}
}
