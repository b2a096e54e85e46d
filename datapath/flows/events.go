package flows

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/onc-net/onc/datapath/bpf"
)

// Event is one flow event of the eBPF programs (include/flows.h).
type Event struct {
	Time time.Time
	// drop, open, learn, translate, uplink, refuse, pair, fallback (enum
	// onc_ev_class)
	Class string
	// Reason is, for a drop, a refusal or a fallback, the counter it
	// counted in (overlay_drop_inner_source, connect_refused,
	// fallback_peer_full, ...).
	Reason string
	// Counters is the counters enum of the reason: onc_stat (the fast
	// path), lb_stat or lb6_stat (the socket LB), lb_uplink_stat,
	// lb6_uplink_stat, lb_dsr_stat or lb6_dsr_stat (the uplink LB),
	// bp_stat (the bypass).
	Counters string
	Proto    uint8
	Src, Dst netip.AddrPort
	// Via is the third end, if any: the backend chosen (translate,
	// uplink) or the node that sent the frame (overlay drops).
	Via     netip.AddrPort
	Ifindex uint32 // the interface the packet came in by (tc programs)
	Netns   uint64 // the socket's network namespace cookie (socket LB)
	// Suppressed is how many events of this class the budget held back on
	// this CPU since the last one it let through.
	Suppressed uint32
}

// EventSize is the size of struct flow_event, which DecodeEvent reads
// (its test checks it against the BTF).
const EventSize = 88

// The offsets of struct flow_event's fields.
const (
	evSaddr, evDaddr, evSport, evDport = 0, 16, 32, 34
	evReason, evFamily, evProto        = 36, 38, 39
	evTable, evIfindex, evCookie       = 40, 44, 48
	evXaddr, evXport, evXfamily        = 56, 72, 74
	evClass, evSuppressed, evTs        = 75, 76, 80
)

// Address families as the programs write them.
const (
	afInet  = 2
	afInet6 = 10
)

// DecodeEvent decodes raw, one struct flow_event, naming its class and
// reason by names; ts is its time (raw has the kernel's monotonic clock).
func DecodeEvent(raw []byte, names *bpf.EventNames, ts func(mono uint64) time.Time) (Event, error) {
	if len(raw) < EventSize {
		return Event{}, fmt.Errorf("flow event of %d bytes, want %d", len(raw), EventSize)
	}
	le := binary.LittleEndian
	e := Event{
		Time:       ts(le.Uint64(raw[evTs:])),
		Class:      names.Class(raw[evClass]),
		Proto:      raw[evProto],
		Ifindex:    le.Uint32(raw[evIfindex:]),
		Netns:      le.Uint64(raw[evCookie:]),
		Suppressed: le.Uint32(raw[evSuppressed:]),
	}
	if e.Class == "drop" || e.Class == "refuse" || e.Class == "fallback" {
		e.Reason = names.Reason(raw[evTable], le.Uint16(raw[evReason:]))
		e.Counters = names.Table(raw[evTable])
	}
	fam := raw[evFamily]
	e.Src = addrPort(fam, raw[evSaddr:evSaddr+16], raw[evSport:])
	e.Dst = addrPort(fam, raw[evDaddr:evDaddr+16], raw[evDport:])
	e.Via = addrPort(raw[evXfamily], raw[evXaddr:evXaddr+16], raw[evXport:])
	return e, nil
}

// addrPort is the address of family fam in a (IPv4 in its first 4
// bytes) with the port in network order at port; zero for no family.
func addrPort(fam uint8, a, port []byte) netip.AddrPort {
	var ip netip.Addr
	switch fam {
	case afInet:
		ip = netip.AddrFrom4([4]byte(a[:4]))
	case afInet6:
		ip = netip.AddrFrom16([16]byte(a[:16]))
	default:
		return netip.AddrPort{}
	}
	return netip.AddrPortFrom(ip, binary.BigEndian.Uint16(port))
}

// EventReader reads the flow events of one ring (onc_events).
type EventReader struct {
	rd    *ringbuf.Reader
	names *bpf.EventNames
	// offset turns the kernel's monotonic clock into wall time; measured
	// again every minute, as the wall clock may be stepped.
	offset   time.Duration
	measured time.Time
}

// pollEvery bounds how long an event waits in the ring: the programs
// wake the reader only when much is queued (EV_WAKEUP_BYTES).
const pollEvery = 100 * time.Millisecond

// OpenEvents reads ring, an onc_events map, naming events by names.
func OpenEvents(ring *ebpf.Map, names *bpf.EventNames) (*EventReader, error) {
	rd, err := ringbuf.NewReader(ring)
	if err != nil {
		return nil, fmt.Errorf("flow events: %w", err)
	}
	return &EventReader{rd: rd, names: names}, nil
}

// Run hands each event to emit until ctx ends, then closes the reader.
// A record it cannot decode (a program of another version writing into
// a pinned ring during an upgrade, say) goes to bad, and reading goes on.
// Reading allocates nothing per event.
func (r *EventReader) Run(ctx context.Context, emit func(Event), bad func(error)) error {
	stop := context.AfterFunc(ctx, func() { r.rd.Close() })
	defer stop()
	defer r.rd.Close()
	var rec ringbuf.Record
	for {
		r.rd.SetDeadline(time.Now().Add(pollEvery))
		err := r.rd.ReadInto(&rec)
		switch {
		case errors.Is(err, os.ErrDeadlineExceeded):
			continue
		case errors.Is(err, ringbuf.ErrClosed):
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("flow events: %w", err)
		}
		e, err := DecodeEvent(rec.RawSample, r.names, r.wallTime)
		if err != nil {
			bad(err)
			continue
		}
		emit(e)
	}
}

// wallTime is the wall-clock time of mono, a bpf_ktime_get_ns reading.
func (r *EventReader) wallTime(mono uint64) time.Time {
	now := time.Now()
	if now.Sub(r.measured) > time.Minute {
		var ts unix.Timespec
		if unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) == nil {
			r.offset = time.Duration(now.UnixNano() - ts.Nano())
		}
		r.measured = now
	}
	return time.Unix(0, int64(mono)+int64(r.offset))
}
