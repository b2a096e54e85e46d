package testutil

import (
	"encoding/binary"
	"testing"
)

// MapEntry is b as an eBPF map key or value of type T, as the kernel hands
// it over (zero-padded or cut to T's size), and T decoded from it as
// cilium/ebpf decodes it: for fuzzing decoders with any bytes.
func MapEntry[T any](tb testing.TB, b []byte) ([]byte, T) {
	tb.Helper()
	var v T
	entry := make([]byte, binary.Size(v))
	copy(entry, b)
	if _, err := binary.Decode(entry, binary.NativeEndian, &v); err != nil {
		tb.Fatalf("decode %d bytes into %T: %v", len(entry), v, err)
	}
	return entry, v
}
