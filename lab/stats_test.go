package lab

import (
	"slices"
	"strings"
	"testing"
)

func TestStatsDelta(t *testing.T) {
	before := []NodeStats{
		{Node: "n2", Counters: map[string]uint64{"egress_hit": 10, "egress_miss_flow": 3, "ingress_hit": 7, "learn_egress": 1}},
		{Node: "n10", Counters: map[string]uint64{"egress_hit": 50, "ingress_error": 0}},
	}
	after := []NodeStats{
		{Node: "n2", Counters: map[string]uint64{"egress_hit": 14, "egress_miss_flow": 5, "egress_miss_host": 2, "egress_error": 1, "ingress_hit": 7, "learn_egress": 2}},
		// Its map was made anew (a lower value), and it gained an error.
		{Node: "n10", Counters: map[string]uint64{"egress_hit": 4, "ingress_error": 1}},
	}
	got := StatsDelta(before, after)
	want := []CounterDelta{
		{"n2", "egress", "hit", 4},
		{"n2", "egress", "miss_flow", 2},
		{"n2", "egress", "miss_host", 2},
		{"n2", "egress", "error", 1},
		{"n10", "ingress", "error", 1},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("StatsDelta = %v, want %v", got, want)
	}

	var out strings.Builder
	PrintStatsDelta(&out, got)
	table := strings.Join(strings.Split(out.String(), "\n")[:6], "\n")
	wantTable := `NODE  PROGRAM  COUNTER    DELTA
n2    egress   hit        4
      egress   miss_flow  2
      egress   miss_host  2
      egress   error      1
n10   ingress  error      1`
	if table != wantTable {
		t.Fatalf("PrintStatsDelta wrote\n%s\nwant\n%s", out.String(), wantTable)
	}
	if !strings.Contains(out.String(), "which learns the flow") {
		t.Fatalf("PrintStatsDelta does not say what the counters mean:\n%s", out.String())
	}

	out.Reset()
	PrintStatsDelta(&out, []CounterDelta{{"n2", "egress", "miss_disabled", 9}})
	if !strings.Contains(out.String(), "No hits") || strings.Contains(out.String(), "learns") {
		t.Fatalf("PrintStatsDelta without hits wrote\n%s", out.String())
	}

	out.Reset()
	PrintStatsDelta(&out, nil)
	if !strings.Contains(out.String(), "No fast-path counter moved") {
		t.Fatalf("PrintStatsDelta(nil) = %q", out.String())
	}
}
