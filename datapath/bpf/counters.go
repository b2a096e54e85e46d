package bpf

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Counter is one per-CPU counter summed over the CPUs, named as in its C
// enum without the prefix, in lower case (egress_hit, connect_refused).
type Counter struct {
	Name  string
	Value uint64
}

// counterNames reads the names of a counter enum from a program's BTF, so
// they never drift from the C; the last value (prefix + "MAX") is the
// count, not a counter.
func counterNames(spec *ebpf.CollectionSpec, enum, prefix string) ([]string, error) {
	var e *btf.Enum
	if err := spec.Types.TypeByName(enum, &e); err != nil {
		return nil, fmt.Errorf("counter names: %w", err)
	}
	names := make([]string, 0, len(e.Values))
	for _, v := range e.Values {
		if v.Name == prefix+"MAX" {
			continue
		}
		names = append(names, strings.ToLower(strings.TrimPrefix(v.Name, prefix)))
	}
	return names, nil
}

// ReadCounters sums the per-CPU array m, one counter per value of the C
// enum named in the BTF of the object load returns (prefix + "MAX" ends it).
func ReadCounters(m *ebpf.Map, load func() (*ebpf.CollectionSpec, error), enum, prefix string) ([]Counter, error) {
	spec, err := load()
	if err != nil {
		return nil, err
	}
	names, err := counterNames(spec, enum, prefix)
	if err != nil {
		return nil, err
	}
	return sumCounters(m, names)
}

func sumCounters(m *ebpf.Map, names []string) ([]Counter, error) {
	out := make([]Counter, len(names))
	for i, n := range names {
		var per []uint64
		if err := m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("counter %s: %w", n, err)
		}
		out[i].Name = n
		for _, v := range per {
			out[i].Value += v
		}
	}
	return out, nil
}
