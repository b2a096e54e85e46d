package fastpath

import (
	"errors"
	"fmt"
	"maps"
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

// Connection setup on the fast path (fastpath.c, flow_setup): a
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

// NarrowOpen removes from the open pods (onc_open for IPv4 addresses,
// onc_open6 for IPv6 ones: those no NetworkPolicy isolates) the ones want
// does not hold, and SetOpen makes them exactly want. Policy narrows
// before its rules that isolate a pod take effect and sets after, so no
// SYN takes the fast path while the rules in force could deny it. Both
// families are narrowed (or set) even if one fails.
func (d *Datapath) NarrowOpen(want map[netip.Addr]bool) error {
	return errors.Join(
		narrowOpen(&d.open, d.maps.OncOpen, want, bpf.IPv4),
		narrowOpen(&d.open6, d.maps.OncOpen6, want, func(k addr6) netip.Addr { return netip.AddrFrom16(k.Addr) }))
}

// narrowOpen is NarrowOpen for one family's map m of open pods, whose
// key addr makes an address of.
func narrowOpen[K comparable](s *mirror[K, uint8], m *ebpf.Map, want map[netip.Addr]bool, addr func(K) netip.Addr) error {
	narrow := func(have map[K]uint8) map[K]uint8 {
		narrowed := map[K]uint8{}
		for k, v := range have {
			if want[addr(k)] {
				narrowed[k] = v
			}
		}
		return narrowed
	}
	return s.syncTo(m, false, narrow, func(have, narrowed map[K]uint8) error {
		return putThenDelete(m, have, narrowed, noteWrite)
	})
}

// SetOpen makes the open pods exactly want (see NarrowOpen).
func (d *Datapath) SetOpen(want map[netip.Addr]bool, checkKernel bool) error {
	w4, w6 := map[uint32]uint8{}, map[addr6]uint8{}
	for ip, open := range want {
		switch {
		case !open:
		case ip.Is4():
			w4[bpf.NetIPv4(ip)] = 1
		case ip.Is6():
			w6[addr6{Addr: ip.As16()}] = 1
		}
	}
	return errors.Join(setOpen(&d.open, d.maps.OncOpen, w4, checkKernel), setOpen(&d.open6, d.maps.OncOpen6, w6, checkKernel))
}

// setOpen is SetOpen for one family's map m of open pods.
func setOpen[K comparable](s *mirror[K, uint8], m *ebpf.Map, want map[K]uint8, checkKernel bool) error {
	return s.sync(m, want, checkKernel, func(have map[K]uint8) error {
		return putThenDelete(m, have, want, noteWrite)
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
// and are not over, of both families, and marks their flows opened by the
// slow path: from then on their SYN-ACK, FIN and RST go through
// conntrack, which knows them. A reset one (Conn.Reset) leaves the cache
// instead. Each family on its own, so that one's failure leaves the
// other's handed over. The caller holds learning paused (evict).
func (d *Datapath) handOver(match func(flowEnds, FlowVal) bool) error {
	return errors.Join(handOverFamily[FlowKey](d.maps.OncFilter, d.maps.OncFin, match),
		handOverFamily[FlowKey6](d.maps.OncFilter6, d.maps.OncFin6, match))
}

// handOverFamily is handOver for one family's filter and fin maps.
func handOverFamily[K flowKey](filter, fin *ebpf.Map, match func(flowEnds, FlowVal) bool) error {
	opened, err := openedFlows[K](filter, match)
	if err != nil || len(opened) == 0 {
		return err
	}
	if err := conntrackEstablish(connsOf(opened)); err != nil {
		return err
	}
	return handedOver(filter, fin, opened)
}

// openedFlows are the flows of filter (onc_filter, or onc_filter6) that
// the fast path opened, that are not over and that match.
func openedFlows[K flowKey](filter *ebpf.Map, match func(flowEnds, FlowVal) bool) (map[K]FlowVal, error) {
	opened, err := contents[K, FlowVal](filter)
	if err != nil {
		return nil, err
	}
	maps.DeleteFunc(opened, func(k K, v FlowVal) bool {
		return Opener(v.Opener) == OpenedBySlowPath || closed(v) || !match(endsOf(k), v)
	})
	return opened, nil
}

// connsOf are the connections of flows the fast path opened.
func connsOf[K flowKey](opened map[K]FlowVal) []Conn {
	conns := make([]Conn, 0, len(opened))
	for k, v := range opened {
		conns = append(conns, connOf(endsOf(k), v))
	}
	return conns
}

// handedOver marks the flows of filter whose connections conntrack now
// has as the slow path's, and forgets what fin followed of their close
// (no program reads it for such a flow); a reset one leaves filter.
func handedOver[K flowKey](filter, fin *ebpf.Map, opened map[K]FlowVal) error {
	var errs []error
	for k, v := range opened {
		var err error
		if v.Closing&closingRemoteRST != 0 {
			// Its short conntrack entry is refreshed only by packets the
			// slow path carries: let it carry them.
			err = filter.Delete(k)
		} else {
			v.Opener, v.Closing = uint8(OpenedBySlowPath), 0
			err = filter.Update(k, v, ebpf.UpdateExist)
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
		if err := fin.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// flowKey is the key of a filter map: onc_filter's or onc_filter6's.
type flowKey interface{ FlowKey | FlowKey6 }

// flowEnds is a cached flow's two ends, of either family, and its
// protocol: what its key says.
type flowEnds struct {
	local, remote netip.AddrPort
	proto         uint8
}

// endsOf is what k says.
func endsOf[K flowKey](k K) flowEnds {
	switch k := any(k).(type) {
	case FlowKey:
		return flowEnds{netip.AddrPortFrom(bpf.IPv4(k.LocalIp), bpf.NetPort(k.LocalPort)),
			netip.AddrPortFrom(bpf.IPv4(k.RemoteIp), bpf.NetPort(k.RemotePort)), k.Proto}
	case FlowKey6:
		return flowEnds{netip.AddrPortFrom(netip.AddrFrom16(k.LocalIp), bpf.NetPort(k.LocalPort)),
			netip.AddrPortFrom(netip.AddrFrom16(k.RemoteIp), bpf.NetPort(k.RemotePort)), k.Proto}
	}
	panic("unreachable")
}

// forgetFlows deletes the flows of filter that match, with what fin (the
// closes of filter's family) followed of them.
func forgetFlows[K flowKey](filter, fin *ebpf.Map, match func(flowEnds, FlowVal) bool) error {
	gone, err := bpf.DeleteIf(filter, func(k K, v FlowVal) bool { return match(endsOf(k), v) })
	errs := []error{err}
	for _, k := range gone {
		if err := fin.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
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
	// Reset: the remote end sent an RST, and the local pod has sent
	// nothing since. It may be over, or the RST forged and ignored.
	Reset bool
}

// connOf is the connection of a flow the fast path opened.
func connOf(e flowEnds, v FlowVal) Conn {
	reset := v.Closing&closingRemoteRST != 0
	if Opener(v.Opener) == OpenedByRemote {
		return Conn{e.remote, e.local, e.proto, reset}
	}
	return Conn{e.local, e.remote, e.proto, reset}
}

// closed reports whether a connection the fast path opened is over: a FIN
// went each way (only its last ACK may be left, which conntrack would pick
// up as a new connection, and the flow's cache entry carries). A local
// pod's RST that ends one forgets it in the programs; a remote RST does
// not make it over (Conn.Reset).
func closed(v FlowVal) bool {
	const bothFINs = closingLocalFIN | closingRemoteFIN
	return v.Closing&bothFINs == bothFINs
}

// As FLOW_CLOSING_* (include/flow_cache.h).
const (
	closingLocalFIN  = 1
	closingRemoteFIN = 2
	closingRemoteRST = 4
)

// resetTimeout is the conntrack timeout of a handed-over connection that
// the remote end reset (Conn.Reset), in seconds: most are over, and 5 days
// of ESTABLISHED each would fill the table; one that lives on refreshes
// its entry with each packet the slow path carries, which handOver leaves
// it to.
const resetTimeout = 300

// conntrackEstablish puts conns into conntrack as the connections they
// are: ESTABLISHED from their client, a reply seen (so that the policy
// table's rule for a connection that starts without a SYN never takes one
// of their packets for a new connection), windows tracked liberally as a
// picked-up connection's are. An entry conntrack already has for one of
// them (the slow path picked it up mid-way, perhaps from its server) goes
// first: a change could not turn it around.
func conntrackEstablish(conns []Conn) error {
	ends := map[[2]netip.AddrPort]bool{}
	families := map[netlink.InetFamily]bool{}
	for _, c := range conns {
		ends[[2]netip.AddrPort{c.Client, c.Server}] = true
		ends[[2]netip.AddrPort{c.Server, c.Client}] = true
		families[familyOf(c)] = true
	}
	for _, family := range []netlink.InetFamily{unix.AF_INET, unix.AF_INET6} {
		if !families[family] {
			continue
		}
		var err error
		for range 3 { // a dump interrupted by concurrent changes may miss entries
			_, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, family, conntrackEnds(ends))
			if !errors.Is(err, netlink.ErrDumpInterrupted) {
				break
			}
		}
		if err != nil {
			return fmt.Errorf("conntrack: clear the way for %d connections the fast path opened: %w", len(conns), err)
		}
	}
	established := establishedTimeout()
	var errs []error
	for _, c := range conns {
		timeout := established
		if c.Reset {
			timeout = resetTimeout
		}
		req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
		req.AddData(&nl.Nfgenmsg{NfgenFamily: uint8(familyOf(c)), Version: nl.NFNETLINK_V0})
		req.AddData(tupleAttr(nl.CTA_TUPLE_ORIG, c.Client, c.Server, c.Proto))
		req.AddData(tupleAttr(nl.CTA_TUPLE_REPLY, c.Server, c.Client, c.Proto))
		req.AddData(nl.NewRtAttr(nl.CTA_STATUS, nl.BEUint32Attr(ipsSeenReply|ipsAssured|ipsConfirmed)))
		req.AddData(nl.NewRtAttr(nl.CTA_TIMEOUT, nl.BEUint32Attr(timeout)))
		info := nl.NewRtAttr(unix.NLA_F_NESTED|nl.CTA_PROTOINFO, nil)
		tcp := info.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_PROTOINFO_TCP, nil)
		tcp.AddRtAttr(nl.CTA_PROTOINFO_TCP_STATE, []byte{nl.TCP_CONNTRACK_ESTABLISHED})
		flags := []byte{tcpFlagSACKPerm | tcpFlagBeLiberal, tcpFlagSACKPerm | tcpFlagBeLiberal} // struct nf_ct_tcp_flags: flags, mask
		tcp.AddRtAttr(nl.CTA_PROTOINFO_TCP_FLAGS_ORIGINAL, flags)
		tcp.AddRtAttr(nl.CTA_PROTOINFO_TCP_FLAGS_REPLY, flags)
		req.AddData(info)
		// EEXIST: the slow path took it up again since the deletion.
		if _, err := req.Execute(unix.NETLINK_NETFILTER, 0); err != nil && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("hand %s -> %s over to conntrack: %w", c.Client, c.Server, err))
		}
	}
	return errors.Join(errs...)
}

// familyOf is the address family of c, AF_INET or AF_INET6, as conntrack
// keeps it.
func familyOf(c Conn) netlink.InetFamily {
	if c.Client.Addr().Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// Conntrack's status bits and TCP flags (linux/netfilter/nf_conntrack_common.h,
// nf_conntrack_tcp.h) that conntrackEstablish sets.
const (
	ipsSeenReply     = 1 << 1
	ipsAssured       = 1 << 2
	ipsConfirmed     = 1 << 3 // set on every entry ctnetlink creates: a status without it is refused
	tcpFlagSACKPerm  = 0x02
	tcpFlagBeLiberal = 0x08
)

// conntrackEnds matches the conntrack entries whose original direction
// goes between two ends of the set.
type conntrackEnds map[[2]netip.AddrPort]bool

func (e conntrackEnds) MatchConntrackFlow(f *netlink.ConntrackFlow) bool {
	src, _ := netip.AddrFromSlice(f.Forward.SrcIP)
	dst, _ := netip.AddrFromSlice(f.Forward.DstIP)
	return f.Forward.Protocol == unix.IPPROTO_TCP &&
		e[[2]netip.AddrPort{netip.AddrPortFrom(src.Unmap(), f.Forward.SrcPort), netip.AddrPortFrom(dst.Unmap(), f.Forward.DstPort)}]
}

// tupleAttr is a nested conntrack tuple attribute (CTA_TUPLE_ORIG or
// CTA_TUPLE_REPLY) from src to dst, both IPv4 or both IPv6.
func tupleAttr(kind int, src, dst netip.AddrPort, proto uint8) *nl.RtAttr {
	t := nl.NewRtAttr(unix.NLA_F_NESTED|kind, nil)
	ip := t.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	srcAttr, dstAttr := nl.CTA_IP_V4_SRC, nl.CTA_IP_V4_DST
	if src.Addr().Is6() {
		srcAttr, dstAttr = nl.CTA_IP_V6_SRC, nl.CTA_IP_V6_DST
	}
	ip.AddRtAttr(srcAttr, src.Addr().AsSlice())
	ip.AddRtAttr(dstAttr, dst.Addr().AsSlice())
	pr := t.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_PROTO, nil)
	pr.AddRtAttr(nl.CTA_PROTO_NUM, []byte{proto})
	pr.AddRtAttr(nl.CTA_PROTO_SRC_PORT, nl.BEUint16Attr(src.Port()))
	pr.AddRtAttr(nl.CTA_PROTO_DST_PORT, nl.BEUint16Attr(dst.Port()))
	return t
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
