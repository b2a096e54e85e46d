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

// NarrowOpen removes from the open pods (onc_open: those no NetworkPolicy
// isolates) the ones want does not hold, and SetOpen makes them exactly
// want. Policy narrows before its rules that isolate a pod take effect and
// sets after, so no SYN takes the fast path while the rules in force could
// deny it.
func (d *Datapath) NarrowOpen(want map[netip.Addr]bool) error {
	narrow := func(have map[uint32]uint8) map[uint32]uint8 {
		narrowed := map[uint32]uint8{}
		for k, v := range have {
			if want[bpf.IPv4(k)] {
				narrowed[k] = v
			}
		}
		return narrowed
	}
	return d.open.syncTo(d.maps.OncOpen, false, narrow, func(have, narrowed map[uint32]uint8) error {
		return putThenDelete(d.maps.OncOpen, have, narrowed, noteWrite)
	})
}

// SetOpen makes the open pods exactly want (see NarrowOpen).
func (d *Datapath) SetOpen(want map[netip.Addr]bool, checkKernel bool) error {
	w := map[uint32]uint8{}
	for ip, open := range want {
		if open && ip.Is4() {
			w[bpf.NetIPv4(ip)] = 1
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
// and are not over, and marks their flows opened by the slow path: from
// then on their SYN-ACK, FIN and RST go through conntrack, which knows
// them. A reset one (Conn.Reset) leaves the cache instead. The caller
// holds learning paused (evict).
func (d *Datapath) handOver(match func(FlowKey, FlowVal) bool) error {
	opened, err := contents[FlowKey, FlowVal](d.maps.OncFilter)
	if err != nil {
		return err
	}
	maps.DeleteFunc(opened, func(k FlowKey, v FlowVal) bool {
		return Opener(v.Opener) == OpenedBySlowPath || closed(v) || !match(k, v)
	})
	if len(opened) == 0 {
		return nil
	}
	conns := make([]Conn, 0, len(opened))
	for k, v := range opened {
		conns = append(conns, connOf(k, v))
	}
	if err := conntrackEstablish(conns); err != nil {
		return err
	}
	var errs []error
	for k, v := range opened {
		var err error
		if v.Closing&closingRemoteRST != 0 {
			// Its short conntrack entry is refreshed only by packets the
			// slow path carries: let it carry them.
			err = d.maps.OncFilter.Delete(k)
		} else {
			v.Opener, v.Closing = uint8(OpenedBySlowPath), 0
			err = d.maps.OncFilter.Update(k, v, ebpf.UpdateExist)
		}
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
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
func connOf(k FlowKey, v FlowVal) Conn {
	local := netip.AddrPortFrom(bpf.IPv4(k.LocalIp), bpf.NetPort(k.LocalPort))
	remote := netip.AddrPortFrom(bpf.IPv4(k.RemoteIp), bpf.NetPort(k.RemotePort))
	reset := v.Closing&closingRemoteRST != 0
	if Opener(v.Opener) == OpenedByRemote {
		return Conn{remote, local, k.Proto, reset}
	}
	return Conn{local, remote, k.Proto, reset}
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
	for _, c := range conns {
		ends[[2]netip.AddrPort{c.Client, c.Server}] = true
		ends[[2]netip.AddrPort{c.Server, c.Client}] = true
	}
	var err error
	for range 3 { // a dump interrupted by concurrent changes may miss entries
		_, err = netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, conntrackEnds(ends))
		if !errors.Is(err, netlink.ErrDumpInterrupted) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("conntrack: clear the way for %d connections the fast path opened: %w", len(conns), err)
	}
	established := establishedTimeout()
	var errs []error
	for _, c := range conns {
		timeout := established
		if c.Reset {
			timeout = resetTimeout
		}
		req := nl.NewNetlinkRequest(int(netlink.ConntrackTable)<<8|nl.IPCTNL_MSG_CT_NEW, unix.NLM_F_ACK|unix.NLM_F_CREATE|unix.NLM_F_EXCL)
		req.AddData(&nl.Nfgenmsg{NfgenFamily: unix.AF_INET, Version: nl.NFNETLINK_V0})
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
// CTA_TUPLE_REPLY) from src to dst.
func tupleAttr(kind int, src, dst netip.AddrPort, proto uint8) *nl.RtAttr {
	t := nl.NewRtAttr(unix.NLA_F_NESTED|kind, nil)
	ip := t.AddRtAttr(unix.NLA_F_NESTED|nl.CTA_TUPLE_IP, nil)
	ip.AddRtAttr(nl.CTA_IP_V4_SRC, src.Addr().AsSlice())
	ip.AddRtAttr(nl.CTA_IP_V4_DST, dst.Addr().AsSlice())
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
