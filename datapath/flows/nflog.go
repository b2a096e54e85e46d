// Package flows reads what the datapath reports about single packets: the
// verdicts the policy table logs (NFLOG). The agent (agent/flows) turns
// them into flow records.
package flows

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/florianl/go-nflog/v2"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// PrefixVersion starts every log prefix ONC writes, so that a reader
// tells ONC's messages (and their grammar) from anyone else's in the group.
const PrefixVersion = "onc1"

// Verdicts a log prefix names.
const (
	VerdictDenied  = "D" // the pod's chain dropped it: no rule of the policies isolating it allows it
	VerdictAllowed = "A" // the pod's chain let it start a connection: a rule allows it
	VerdictDropped = "X" // a base chain dropped it, for Why
	// Audit (policies annotated onc.io/policy-mode: audit):
	VerdictWouldDeny  = "W" // let through: no enforcing policy isolates the pod here, and no rule of the audited ones allows it
	VerdictWouldAllow = "U" // dropped as D, but a rule of an audited policy allows it
)

// Why a base chain dropped a packet (VerdictDropped).
const (
	DropSpoof   = "spoof"   // from a pod, with a source address not its own
	DropInvalid = "invalid" // conntrack's state invalid, to or from a pod
	DropNoSYN   = "nosyn"   // a new TCP connection without a SYN, to or from an isolated pod
)

// Packet is one packet the policy table logged.
type Packet struct {
	Time    time.Time // when the agent read it (the kernel does not stamp forwarded packets)
	Verdict string    // VerdictDenied, VerdictAllowed, VerdictDropped, VerdictWouldDeny or VerdictWouldAllow
	Ingress bool      // the verdict is on the pod's ingress (else egress)
	PodID   string    // the chain's pod id (datapath/policy PodID); "" for VerdictDropped
	// Fingerprint names the rules the chain enforced (D, A) or audited
	// (W, U) (datapath/policy Enforcer.Logged); "" for VerdictDropped,
	// and in the prefixes of agents before it.
	Fingerprint string
	// EnforcingFingerprint names, for VerdictWouldAllow, the enforcing
	// rules that dropped the packet, as they were when it was logged; ""
	// for the other verdicts, and in the prefixes of agents before it.
	EnforcingFingerprint string
	Why                  string // VerdictDropped: DropSpoof, DropInvalid or DropNoSYN
	// Iface is the host side of the pod's veth the packet came from
	// (egress) or went to (ingress), for VerdictDropped; "" if gone.
	Iface string
	Proto uint8 // IP protocol number
	Src   netip.AddrPort
	Dst   netip.AddrPort
}

// The prefix grammar, version PrefixVersion (docs/observability.md):
//
//	onc1 D <dir> <id> [<fp>]   a pod chain's drop (no fp: agents before fingerprints)
//	onc1 A <dir> <id> <fp>     a pod chain's allowed new connection
//	onc1 W <dir> <id> <afp>    let through, audited policies would deny it
//	onc1 U <dir> <id> <afp> [<fp>]  dropped, an audited policy would allow it (no fp: agents before it)
//	onc1 X <why> <dir>         a base chain's drop
//
// dir is in or eg; id the pod's PodID; fp the fingerprint of the rules the
// chain enforces, afp of those it audits. The longest, U's, is 38
// characters; nft takes up to 127 (NF_LOG_PREFIXLEN).

// PolicyPrefix is the log prefix of verdict (VerdictDenied,
// VerdictAllowed, VerdictWouldDeny or VerdictWouldAllow) for the chain of
// pod id in a direction, of the rules (enforced, or audited for W and U)
// of fingerprint fp.
func PolicyPrefix(verdict string, ingress bool, id, fp string) string {
	return strings.Join([]string{PrefixVersion, verdict, dirName(ingress), id, fp}, " ")
}

// WouldAllowPrefix is the log prefix of VerdictWouldAllow for the chain
// of pod id in a direction, of the audited rules of fingerprint afp and
// the enforcing ones of fingerprint fp: both as they are when the packet
// is logged, so that the record names the rules that dropped it even if
// they change before it is read.
func WouldAllowPrefix(ingress bool, id, afp, fp string) string {
	return PolicyPrefix(VerdictWouldAllow, ingress, id, afp) + " " + fp
}

// DropPrefix is the log prefix of a base chain's drop for why, of a
// packet to a pod (ingress) or from one.
func DropPrefix(why string, ingress bool) string {
	return strings.Join([]string{PrefixVersion, VerdictDropped, why, dirName(ingress)}, " ")
}

func dirName(ingress bool) string {
	if ingress {
		return "in"
	}
	return "eg"
}

// parseDir reads a prefix's direction.
func parseDir(s string) (ingress, ok bool) { return s == "in", s == "in" || s == "eg" }

// ErrNotOurs: a log message of another writer, or of a grammar this
// reader does not know.
var ErrNotOurs = errors.New("not a policy verdict of ONC's")

// ParsePacket decodes a log message: its prefix and the IP packet it
// carries (from its network header).
func ParsePacket(prefix string, payload []byte) (Packet, error) {
	p, ok := parsePrefix(strings.Fields(strings.TrimRight(prefix, "\x00")))
	if !ok {
		return p, fmt.Errorf("%w: prefix %q", ErrNotOurs, prefix)
	}
	var err error
	p.Proto, p.Src, p.Dst, err = parseIP(payload)
	return p, err
}

// parsePrefix reads a prefix's fields.
func parsePrefix(f []string) (p Packet, ok bool) {
	if len(f) < 4 || f[0] != PrefixVersion {
		return p, false
	}
	p.Verdict = f[1]
	switch p.Verdict {
	case VerdictDenied, VerdictAllowed, VerdictWouldDeny, VerdictWouldAllow:
		if len(f) >= 5 {
			p.Fingerprint = f[4]
		}
		if len(f) == 6 {
			p.EnforcingFingerprint = f[5]
		}
		p.Ingress, ok = parseDir(f[2])
		p.PodID = f[3]
		return p, ok && (len(f) == 5 || len(f) == 4 && p.Verdict == VerdictDenied || len(f) == 6 && p.Verdict == VerdictWouldAllow)
	case VerdictDropped:
		p.Why = f[2]
		p.Ingress, ok = parseDir(f[3])
		return p, ok && len(f) == 4 && (p.Why == DropSpoof || p.Why == DropInvalid || p.Why == DropNoSYN)
	}
	return p, false
}

// parseIP reads the addresses, protocol and ports of an IPv4 or IPv6
// packet. Ports are zero for protocols without them; an IPv6 packet with
// extension headers names its first one as its protocol.
func parseIP(b []byte) (proto uint8, src, dst netip.AddrPort, err error) {
	if len(b) < 1 {
		return 0, src, dst, errors.New("empty packet")
	}
	var s, d netip.Addr
	var l4 []byte
	switch b[0] >> 4 {
	case 4:
		ihl := int(b[0]&0x0f) * 4
		if len(b) < 20 || ihl < 20 || len(b) < ihl {
			return 0, src, dst, fmt.Errorf("IPv4 packet of %d bytes: truncated", len(b))
		}
		proto, s, d = b[9], netip.AddrFrom4([4]byte(b[12:16])), netip.AddrFrom4([4]byte(b[16:20]))
		if binary.BigEndian.Uint16(b[6:8])&0x1fff == 0 { // a first fragment, or none: it has the ports
			l4 = b[ihl:]
		}
	case 6:
		if len(b) < 40 {
			return 0, src, dst, fmt.Errorf("IPv6 packet of %d bytes: truncated", len(b))
		}
		s, d = netip.AddrFrom16([16]byte(b[8:24])), netip.AddrFrom16([16]byte(b[24:40]))
		proto, l4 = skipExtensions(b[6], b[40:])
	default:
		return 0, src, dst, fmt.Errorf("IP version %d", b[0]>>4)
	}
	var sp, dp uint16
	switch proto {
	case unix.IPPROTO_TCP, unix.IPPROTO_UDP, unix.IPPROTO_SCTP:
		if len(l4) >= 4 {
			sp, dp = binary.BigEndian.Uint16(l4[0:2]), binary.BigEndian.Uint16(l4[2:4])
		}
	}
	return proto, netip.AddrPortFrom(s, sp), netip.AddrPortFrom(d, dp), nil
}

// skipExtensions follows an IPv6 packet's extension headers from next,
// the fixed header's next header, to its transport protocol and header
// (nil if the copy ends first, or a fragment header says it is not the
// first fragment).
func skipExtensions(next uint8, b []byte) (uint8, []byte) {
	for {
		switch next {
		case unix.IPPROTO_HOPOPTS, unix.IPPROTO_ROUTING, unix.IPPROTO_DSTOPTS:
			if len(b) < 8 || len(b) < 8+int(b[1])*8 {
				return next, nil
			}
			next, b = b[0], b[8+int(b[1])*8:]
		case unix.IPPROTO_FRAGMENT:
			if len(b) < 8 || binary.BigEndian.Uint16(b[2:4])&0xfff8 != 0 {
				return b0(b), nil
			}
			next, b = b[0], b[8:]
		default:
			return next, b
		}
	}
}

// b0 is b's first byte (the next header of an extension header), or
// IPPROTO_FRAGMENT when b is too short to say.
func b0(b []byte) uint8 {
	if len(b) == 0 {
		return unix.IPPROTO_FRAGMENT
	}
	return b[0]
}

// Reader reads the policy table's log group.
type Reader struct {
	nf    *nflog.Nflog
	group uint16
	links *netlink.Handle // in the namespace of the group: interface names
}

// Open takes NFLOG group group in the calling thread's network namespace
// (its socket stays there). Only one reader may hold a group.
func Open(group uint16) (*Reader, error) {
	nf, err := nflog.Open(&nflog.Config{
		Group:    group,
		Copymode: nflog.CopyPacket,
		Bufsize:  128, // headers only
		Timeout:  5,   // sent at least every 50 ms: a record within 1 s
		QThresh:  64,  // or every 64 messages, whichever first
	})
	if err != nil {
		return nil, fmt.Errorf("NFLOG group %d: %w", group, err)
	}
	if err := nf.Con.SetReadBuffer(1 << 20); err != nil {
		nf.Close()
		return nil, fmt.Errorf("NFLOG group %d: read buffer: %w", group, err)
	}
	links, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		nf.Close()
		return nil, fmt.Errorf("NFLOG group %d: netlink: %w", group, err)
	}
	return &Reader{nf: nf, group: group, links: links}, nil
}

// ifname is the name of the interface with index, or "" when there is
// none (a pod's veth may be gone by the time its packet is read).
func (r *Reader) ifname(index *uint32) string {
	if index == nil {
		return ""
	}
	l, err := r.links.LinkByIndex(int(*index))
	if err != nil {
		return ""
	}
	return l.Attrs().Name
}

// Run reads until ctx ends or reading fails, calling fn for each packet
// of ONC's; lost counts the messages that could not be decoded, and each
// time the kernel could not queue some (the reader fell behind: how many
// it does not say). It closes the reader.
func (r *Reader) Run(parent context.Context, fn func(Packet), lost func(n int)) error {
	defer r.nf.Close()
	defer r.links.Close()
	ctx, stop := context.WithCancelCause(parent)
	defer stop(nil)
	hook := func(a nflog.Attribute) int {
		if a.Prefix == nil || a.Payload == nil {
			return 0
		}
		p, err := ParsePacket(*a.Prefix, *a.Payload)
		if errors.Is(err, ErrNotOurs) {
			return 0
		}
		if err != nil {
			lost(1)
			return 0
		}
		p.Time = time.Now()
		if p.Verdict == VerdictDropped {
			// The pod's veth: the packet came from it, or was going to it.
			dev := a.InDev
			if p.Ingress {
				dev = a.OutDev
			}
			p.Iface = r.ifname(dev)
		}
		fn(p)
		return 0
	}
	// Messages the kernel dropped (ENOBUFS: the reader fell behind) are
	// gone: count that and read on. Any other error ends the run.
	errFn := func(err error) int {
		switch {
		case ctx.Err() != nil:
			return 1
		case errors.Is(err, unix.ENOBUFS):
			lost(1)
			return 0
		}
		stop(err)
		return 1
	}
	if err := r.nf.RegisterWithErrorFunc(ctx, hook, errFn); err != nil {
		// go-nflog keeps only the text of the kernel's EPERM.
		if errors.Is(err, unix.EPERM) || strings.Contains(err.Error(), unix.EPERM.Error()) {
			return fmt.Errorf("NFLOG group %d: another program of this network namespace reads it (pick another --flows-log-group): %w", r.group, err)
		}
		return fmt.Errorf("NFLOG group %d: %w", r.group, err)
	}
	<-ctx.Done()
	if parent.Err() != nil {
		return nil
	}
	return fmt.Errorf("NFLOG group %d: %w", r.group, context.Cause(ctx))
}
