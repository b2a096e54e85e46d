package bpf

import (
	"errors"

	"github.com/cilium/ebpf"
)

// DeleteIf deletes the entries of m for which gone(key, value) holds and
// returns the keys it deleted, those before a failure too. It reads the
// whole map before it deletes: deleting under an iterator can make it
// restart or skip. An entry someone else deleted meanwhile counts as
// deleted.
func DeleteIf[K, V any](m *ebpf.Map, gone func(K, V) bool) ([]K, error) {
	var (
		k    K
		v    V
		keys []K
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if gone(k, v) {
			keys = append(keys, k)
		}
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	for i, k := range keys {
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return keys[:i], err
		}
	}
	return keys, nil
}
