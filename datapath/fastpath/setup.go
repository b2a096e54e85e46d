package fastpath

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// Connection setup on the fast path (include/fastpath.h, flow_setup): a
// TCP connection whose SYN no policy can deny on this node opens, runs and
// closes on the fast path, and conntrack never sees it. The cached flow
// then holds the connection's only record (its Opener). Whenever the fast
// path stops carrying such a connection while it may still be alive — the
// fast path switched off, a flush, its peer gone from the fast path, a
// policy change that concerns its pod — it is handed over to conntrack
// first, as the ESTABLISHED connection it is, so that the slow path
// carries it on instead of finding its packets invalid.

// ConnSetup says which connections may open on the fast path, as the
// programs' constant onc_conn_setup.
type ConnSetup uint8

const (
	SetupOff      ConnSetup = iota // every SYN, FIN and RST takes the slow path
	SetupOpenPods                  // those of pods open that way (SetOpen)
	SetupEveryPod                  // every local pod's: no NetworkPolicy runs on this node
)

func (s ConnSetup) String() string {
	switch s {
	case SetupOff:
		return "off"
	case SetupOpenPods:
		return "pods no policy isolates"
	case SetupEveryPod:
		return "every pod (no NetworkPolicy)"
	}
	return fmt.Sprintf("ConnSetup(%d)", uint8(s))
}

// Openness says in which directions no NetworkPolicy isolates a local pod
// (OpenIngress, OpenEgress): new connections it takes or makes that way
// may be opened on the fast path.
type Openness uint8

const (
	OpenIngress Openness = 1 // as OPEN_INGRESS
	OpenEgress  Openness = 2 // as OPEN_EGRESS
)

// Opener is who opened a cached flow.
type Opener uint8

const (
	OpenedBySlowPath Opener = iota // conntrack saw it open
	OpenedByLocal                  // its SYN left a local pod on the fast path (FLOW_OPENED_BY_LOCAL)
	OpenedByRemote                 // its SYN came to a local pod on the fast path (FLOW_OPENED_BY_REMOTE)
)

func (o Opener) String() string {
	switch o {
	case OpenedBySlowPath:
		return "slow path"
	case OpenedByLocal:
		return "local"
	case OpenedByRemote:
		return "remote"
	}
	return fmt.Sprintf("opener(%d)", uint8(o))
}

// NarrowOpen takes from the open pods what want does not grant, and
// SetOpen makes them exactly want. Policy narrows before its rules that
// isolate a pod take effect and sets after, so no SYN takes the fast path
// while the rules in force could deny it.
func (d *Datapath) NarrowOpen(want map[netip.Addr]Openness) error {
	narrow := func(have map[uint32]uint8) map[uint32]uint8 {
		narrowed := map[uint32]uint8{}
		for k, v := range have {
			if n := v & uint8(want[bpf.IPv4(k)]); n != 0 {
				narrowed[k] = n
			}
		}
		return narrowed
	}
	return d.open.syncTo(d.maps.OncOpen, false, narrow, func(have, narrowed map[uint32]uint8) error {
		return putThenDelete(d.maps.OncOpen, have, narrowed, noteWrite)
	})
}

// SetOpen makes the open pods exactly want (see NarrowOpen).
func (d *Datapath) SetOpen(want map[netip.Addr]Openness, checkKernel bool) error {
	w := map[uint32]uint8{}
	for ip, o := range want {
		if o != 0 && ip.Is4() {
			w[bpf.NetIPv4(ip)] = uint8(o)
		}
	}
	return d.open.sync(d.maps.OncOpen, w, checkKernel, func(have map[uint32]uint8) error {
		return putThenDelete(d.maps.OncOpen, have, w, noteWrite)
	})
}

// noteWrite passes a write's error on, uncounted.
func noteWrite(err error) error { return err }

// Verdict is what EvictFlows does with a cached flow.
type Verdict uint8

const (
	Evict    Verdict = iota // forget it: the connection ended, or the slow path learns it again
	Keep                    // leave it as it is
	HandOver                // keep it, but hand a connection the fast path opened over to conntrack
)

// handOver gives conntrack the connections the fast path opened that match
// and are not closed, as ESTABLISHED, and marks their flows opened by the
// slow path: from then on their SYN-ACK, FIN and RST go through conntrack,
// which knows them. The caller holds learning paused (evict). A connection
// conntrack already has (the slow path picked it up mid-way) stays as
// conntrack has it.
func (d *Datapath) handOver(match func(FlowKey, FlowVal) bool) error {
	var k FlowKey
	var v FlowVal
	type flow struct {
		k FlowKey
		v FlowVal
	}
	var opened []flow
	it := d.maps.OncFilter.Iterate()
	for it.Next(&k, &v) {
		if Opener(v.Opener) != OpenedBySlowPath && !closed(v) && match(k, v) {
			opened = append(opened, flow{k, v})
		}
	}
	if err := it.Err(); err != nil {
		return err
	}
	var errs []error
	for _, f := range opened {
		if err := conntrackEstablish(f.k, f.v); err != nil {
			errs = append(errs, err)
			continue
		}
		f.v.Opener, f.v.Closing = uint8(OpenedBySlowPath), 0
		if err := d.maps.OncFilter.Update(f.k, f.v, ebpf.UpdateExist); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Conn is a connection the fast path opened: the end that sent the SYN,
// and the one that took it.
type Conn struct {
	Client, Server netip.AddrPort
	Proto          uint8
}

// connOf is the connection of a flow the fast path opened.
func connOf(k FlowKey, v FlowVal) Conn {
	local := netip.AddrPortFrom(bpf.IPv4(k.LocalIp), bpf.NetPort(k.LocalPort))
	remote := netip.AddrPortFrom(bpf.IPv4(k.RemoteIp), bpf.NetPort(k.RemotePort))
	if Opener(v.Opener) == OpenedByRemote {
		return Conn{remote, local, k.Proto}
	}
	return Conn{local, remote, k.Proto}
}

// closed reports whether a connection the fast path opened is over: reset,
// or a FIN went each way (only its last ACK may be left, which conntrack
// would pick up as a new connection, and the flow's cache entry carries).
func closed(v FlowVal) bool {
	const bothFINs = closingLocalFIN | closingRemoteFIN
	return v.Closing&closingRST != 0 || v.Closing&bothFINs == bothFINs
}

// As FLOW_CLOSING_* (include/flow_cache.h).
const (
	closingLocalFIN  = 1
	closingRemoteFIN = 2
	closingRST       = 4
)

// conntrackEstablish creates the conntrack entry of a connection the fast
// path opened, oriented from the end that opened it.
func conntrackEstablish(k FlowKey, v FlowVal) error {
	c := connOf(k, v)
	client, server := c.Client, c.Server
	// Half closed, it is still ESTABLISHED to conntrack, which follows the
	// rest of the close.
	f := &netlink.ConntrackFlow{
		FamilyType: unix.AF_INET,
		Forward:    tuple(client, server, k.Proto),
		Reverse:    tuple(server, client, k.Proto),
		TimeOut:    establishedTimeout(),
		ProtoInfo:  &netlink.ProtoInfoTCP{State: nl.TCP_CONNTRACK_ESTABLISHED},
	}
	err := netlink.ConntrackCreate(netlink.ConntrackTable, unix.AF_INET, f)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("hand %s -> %s over to conntrack: %w", client, server, err)
	}
	return nil
}

func tuple(src, dst netip.AddrPort, proto uint8) netlink.IPTuple {
	return netlink.IPTuple{
		SrcIP: net.IP(src.Addr().AsSlice()), DstIP: net.IP(dst.Addr().AsSlice()),
		SrcPort: src.Port(), DstPort: dst.Port(), Protocol: proto,
	}
}

// establishedTimeout is conntrack's timeout of an ESTABLISHED TCP
// connection, in seconds, as the node sets it (5 days by default).
func establishedTimeout() uint32 {
	b, err := os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_established")
	if err == nil {
		if n, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 32); err == nil {
			return uint32(n)
		}
	}
	return 5 * 24 * 3600
}
