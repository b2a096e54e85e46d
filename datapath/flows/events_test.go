package flows

import (
	"encoding/binary"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/onc-net/onc/datapath/bpf"
)

// The decoder reads struct flow_event where the compiler put its fields.
func TestEventLayoutMatchesBTF(t *testing.T) {
	spec, err := bpf.LoadFastpath()
	if err != nil {
		t.Fatal(err)
	}
	var ev, tuple *btf.Struct
	if err := spec.Types.TypeByName("flow_event", &ev); err != nil {
		t.Fatal(err)
	}
	if err := spec.Types.TypeByName("flow_tuple", &tuple); err != nil {
		t.Fatal(err)
	}
	if ev.Size != EventSize {
		t.Errorf("struct flow_event is %d bytes, the decoder reads %d", ev.Size, EventSize)
	}
	want := map[string]int{"saddr": evSaddr, "daddr": evDaddr, "sport": evSport, "dport": evDport, "reason": evReason,
		"family": evFamily, "proto": evProto, "table": evTable, "xaddr": evXaddr, "xport": evXport, "xfamily": evXfamily,
		"class": evClass, "ifindex": evIfindex, "suppressed": evSuppressed, "cookie": evCookie, "ts_ns": evTs}
	got := map[string]int{}
	for _, m := range tuple.Members {
		got[m.Name] = int(m.Offset.Bytes())
	}
	for _, m := range ev.Members {
		got[m.Name] = int(m.Offset.Bytes())
		if key, ok := m.Type.(*btf.Struct); ok { // k: the dedupe key
			for _, km := range key.Members {
				got[km.Name] = int(m.Offset.Bytes() + km.Offset.Bytes())
			}
		}
	}
	for name, off := range want {
		if o, ok := got[name]; !ok || o != off {
			t.Errorf("field %s at %d (present: %v), the decoder reads %d", name, o, ok, off)
		}
	}
}

// An event decodes with its class, its reason named from its table, and
// its ends in their families.
func TestDecodeEvent(t *testing.T) {
	names, err := bpf.LoadEventNames()
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, EventSize)
	le := binary.LittleEndian
	copy(raw[evSaddr:], []byte{10, 244, 9, 3})
	copy(raw[evDaddr:], []byte{10, 244, 1, 2})
	binary.BigEndian.PutUint16(raw[evSport:], 80)
	binary.BigEndian.PutUint16(raw[evDport:], 40000)
	raw[evFamily], raw[evProto], raw[evClass], raw[evTable] = afInet, 6, 0, 0
	le.PutUint16(raw[evReason:], 27) // STAT_OVERLAY_DROP_INNER_SOURCE
	v6 := netip.MustParseAddr("2001:db8::2").As16()
	copy(raw[evXaddr:], v6[:])
	raw[evXfamily] = afInet6
	le.PutUint32(raw[evSuppressed:], 7)
	le.PutUint64(raw[evTs:], 5)
	e, err := DecodeEvent(raw, names, func(mono uint64) time.Time { return time.Unix(0, int64(mono)) })
	if err != nil {
		t.Fatal(err)
	}
	want := Event{Time: time.Unix(0, 5), Class: "drop", Reason: "overlay_drop_inner_source", Counters: "onc_stat", Proto: 6,
		Src: netip.MustParseAddrPort("10.244.9.3:80"), Dst: netip.MustParseAddrPort("10.244.1.2:40000"),
		Via: netip.MustParseAddrPort("[2001:db8::2]:0"), Suppressed: 7}
	if e != want {
		t.Fatalf("decoded %+v, want %+v", e, want)
	}
	if _, err := DecodeEvent(raw[:EventSize-1], names, nil); err == nil {
		t.Error("a short event decoded")
	}
	raw[evClass] = 3 // translate: no reason
	if e, _ := DecodeEvent(raw, names, func(uint64) time.Time { return time.Time{} }); e.Class != "translate" || e.Reason != "" {
		t.Errorf("class %q reason %q, want translate and none", e.Class, e.Reason)
	}
	// A fallback names its reason from the bypass's counters.
	raw[evClass], raw[evTable] = 7, 7
	le.PutUint16(raw[evReason:], 14) // BP_STAT_FALLBACK_PEER_FULL
	if e, _ := DecodeEvent(raw, names, func(uint64) time.Time { return time.Time{} }); e.Class != "fallback" || e.Reason != "fallback_peer_full" || e.Counters != "bp_stat" {
		t.Errorf("class %q reason %q of %q, want fallback, fallback_peer_full of bp_stat", e.Class, e.Reason, e.Counters)
	}
}

// Every class and table is named from BTF, a reason as its counter.
func TestEventNames(t *testing.T) {
	n, err := bpf.LoadEventNames()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"drop", "open", "learn", "translate", "uplink", "refuse", "pair", "fallback"}; !slices.Equal(n.Classes, want) {
		t.Fatalf("classes %q, want %q", n.Classes, want)
	}
	if got := n.Reason(0, 30); got != "overlay_drop_from_pod" {
		t.Errorf("onc_stat 30 is %q, want overlay_drop_from_pod", got)
	}
	if got := n.Reason(6, 1); got != "dsr6_too_big" {
		t.Errorf("lb6_dsr_stat 1 is %q, want dsr6_too_big", got)
	}
	if got := n.Reason(99, 0); got != "reason 0 of table 99" {
		t.Errorf("an unknown table names %q", got)
	}
}
