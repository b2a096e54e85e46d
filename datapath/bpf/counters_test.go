package bpf_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
)

// Each feature's counters are named from its enum, in index order.
func TestCounterNames(t *testing.T) {
	for _, c := range []struct {
		spec        func() (*ebpf.CollectionSpec, error)
		m           string
		first, last string
	}{
		{bpf.LoadFastpath, bpf.FastpathMapOncStats, "egress_hit", "ingress_miss_reply"},
		{bpf.LoadServices, bpf.ServicesMapOncLbStats, "connect_translated", "released"},
		{bpf.LoadServices, bpf.ServicesMapOncLb6Stats, "connect6_translated", "released6"},
		{bpf.LoadServices, bpf.ServicesMapOncLbUplinkStats, "uplink_translated", "uplink_open"},
		{bpf.LoadServices, bpf.ServicesMapOncLb6UplinkStats, "uplink6_translated", "uplink6_error"},
		{bpf.LoadBypass, bpf.BypassMapOncBpStats, "recorded", "fallback_peer_full"},
	} {
		s, err := c.spec()
		if err != nil {
			t.Fatal(err)
		}
		names, err := bpf.CounterNames(s.Maps[c.m])
		if err != nil {
			t.Fatal(err)
		}
		if len(names) != int(s.Maps[c.m].MaxEntries) || names[0] != c.first || names[len(names)-1] != c.last {
			t.Errorf("%s: %q, want %d names from %s to %s", c.m, names, s.Maps[c.m].MaxEntries, c.first, c.last)
		}
	}
}
