package bpf

import (
	"fmt"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
)

// Counter is one per-CPU counter summed over the CPUs, named as in its C
// enum without the prefix up to "STAT_", in lower case (egress_hit,
// connect_refused, redirected_msgs).
type Counter struct {
	Name string
	// Family is the address family of the packets counted, "ipv4" or
	// "ipv6", where a feature counts them apart (the fast path); else "".
	Family string
	Value  uint64
}

// Counters are a feature's counters: the per-CPU array ONC_COUNTERS
// declares (include/common.h), one counter per value of the C enum that
// is its key.
type Counters struct {
	m     *ebpf.Map
	names []string
}

// NewCounters reads the counters' names from the BTF of m's spec, so they
// never drift from the C.
func NewCounters(m *ebpf.Map, spec *ebpf.MapSpec) (*Counters, error) {
	names, err := CounterNames(spec)
	if err != nil {
		return nil, err
	}
	return &Counters{m: m, names: names}, nil
}

// CounterNames names the counters of a counters map's spec, in index order.
func CounterNames(spec *ebpf.MapSpec) ([]string, error) {
	e, ok := btf.UnderlyingType(spec.Key).(*btf.Enum)
	if !ok {
		return nil, fmt.Errorf("counters %s: the key is %v, not an enum", spec.Name, spec.Key)
	}
	names, err := enumNames(e, int(spec.MaxEntries), "STAT_")
	if err != nil {
		return nil, fmt.Errorf("counters %s: %w", spec.Name, err)
	}
	return names, nil
}

// enumNames names the first n values of e, each ..<sep><name>, in lower
// case; every one of them must have a name.
func enumNames(e *btf.Enum, n int, sep string) ([]string, error) {
	names := make([]string, n)
	for _, v := range e.Values {
		// A value past them (..._MAX) is the count, not a name.
		if v.Value >= uint64(n) {
			continue
		}
		_, name, ok := strings.Cut(v.Name, sep)
		if !ok {
			return nil, fmt.Errorf("%s is not named ..%s<name>", v.Name, sep)
		}
		names[v.Value] = strings.ToLower(name)
	}
	for i, n := range names {
		if n == "" {
			return nil, fmt.Errorf("enum %s: no name for %d", e.Name, i)
		}
	}
	return names, nil
}

// Read sums every counter over the CPUs.
func (c *Counters) Read() ([]Counter, error) {
	out := make([]Counter, len(c.names))
	for i, n := range c.names {
		var per []uint64
		if err := c.m.Lookup(uint32(i), &per); err != nil {
			return nil, fmt.Errorf("counter %s: %w", n, err)
		}
		out[i].Name = n
		for _, v := range per {
			out[i].Value += v
		}
	}
	return out, nil
}
