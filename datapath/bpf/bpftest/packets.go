package bpftest

// Packets for BPF_PROG_RUN tests of the tc programs: built by hand, run
// against real maps, the verdict and the packet left checked.

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// The outer MACs of VXLAN: this node's NIC and a peer's.
var (
	NICLocal = net.HardwareAddr{2, 0, 0, 0, 0xb, 1}
	NICPeer  = net.HardwareAddr{2, 0, 0, 0, 0xb, 2}
)

// Frame builds Ethernet/IPv4/TCP-or-UDP with valid IP checksum, or
// Ethernet/IPv6/TCP-or-UDP when src is IPv6 (hop limit 64, no extension
// header); TCP gets the ACK flag unless tcpFlags is a lone SYN.
func Frame(dstMAC, srcMAC net.HardwareAddr, src, dst netip.Addr, proto uint8, sport, dport uint16, tcpFlags byte, payload int) []byte {
	l4 := 8
	if proto == unix.IPPROTO_TCP {
		l4 = 20
	}
	l3 := 20
	if src.Is6() {
		l3 = 40
	}
	b := make([]byte, 14+l3+l4+payload)
	copy(b[0:6], dstMAC)
	copy(b[6:12], srcMAC)
	if src.Is6() {
		binary.BigEndian.PutUint16(b[12:], 0x86dd)
		ip := b[14:54]
		ip[0], ip[6], ip[7] = 0x60, proto, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(l4+payload))
		copy(ip[8:24], src.AsSlice())
		copy(ip[24:40], dst.AsSlice())
	} else {
		binary.BigEndian.PutUint16(b[12:], 0x0800)
		ip := b[14:34]
		ip[0], ip[8], ip[9] = 0x45, 64, proto
		binary.BigEndian.PutUint16(ip[2:], uint16(len(b)-14))
		copy(ip[12:16], src.AsSlice())
		copy(ip[16:20], dst.AsSlice())
		binary.BigEndian.PutUint16(ip[10:], IPChecksum(ip))
	}
	h := b[14+l3:]
	binary.BigEndian.PutUint16(h[0:], sport)
	binary.BigEndian.PutUint16(h[2:], dport)
	if proto == unix.IPPROTO_TCP {
		h[12] = 5 << 4
		h[13] = tcpFlags
		if tcpFlags != 0x02 { // every segment but a connection's SYN carries an ACK
			h[13] |= 0x10
		}
	} else {
		binary.BigEndian.PutUint16(h[4:], uint16(8+payload))
	}
	return b
}

// IPChecksum is the checksum of the IPv4 header h (20 bytes), its own
// field skipped.
func IPChecksum(h []byte) uint16 {
	var s uint32
	for i := 0; i < 20; i += 2 {
		if i != 10 {
			s += uint32(binary.BigEndian.Uint16(h[i:]))
		}
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}

// VXLAN wraps an inner frame as the kernel's VXLAN device would.
func VXLAN(inner []byte, outerSrc, outerDst netip.Addr, vni uint32) []byte {
	b := make([]byte, 50, 50+len(inner))
	copy(b[0:6], NICPeer)
	copy(b[6:12], NICLocal)
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(36+len(inner)))
	copy(ip[12:16], outerSrc.AsSlice())
	copy(ip[16:20], outerDst.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], IPChecksum(ip))
	binary.BigEndian.PutUint16(b[34:], 50000)
	binary.BigEndian.PutUint16(b[36:], 4789)
	binary.BigEndian.PutUint16(b[38:], uint16(16+len(inner)))
	b[42] = 0x08
	binary.BigEndian.PutUint32(b[46:], vni<<8)
	return append(b, inner...)
}

// Run runs tc program p on pkt, with skbMark as the skb's mark if not 0:
// its verdict and the packet it left.
func Run(t *testing.T, p *ebpf.Program, pkt []byte, skbMark uint32) (uint32, []byte) {
	t.Helper()
	return run(t, p, pkt, func(ctx []byte) { binary.LittleEndian.PutUint32(ctx[8:], skbMark) })
}

// RunFrom runs tc program p on pkt as received by interface ifindex (of
// the caller's network namespace), as the FIB helpers need it.
func RunFrom(t *testing.T, p *ebpf.Program, pkt []byte, ifindex int) (uint32, []byte) {
	t.Helper()
	return run(t, p, pkt, func(ctx []byte) {
		binary.LittleEndian.PutUint32(ctx[36:], uint32(ifindex)) // ingress_ifindex
		binary.LittleEndian.PutUint32(ctx[40:], uint32(ifindex)) // ifindex
	})
}

// RunMarked is Run that also returns the skb's mark as p left it.
func RunMarked(t *testing.T, p *ebpf.Program, pkt []byte, skbMark uint32) (ret uint32, out []byte, mark uint32) {
	t.Helper()
	ctxOut := make([]byte, skbLen)
	ret, out = runCtx(t, p, pkt, func(ctx []byte) { binary.LittleEndian.PutUint32(ctx[8:], skbMark) }, ctxOut)
	return ret, out, binary.LittleEndian.Uint32(ctxOut[8:])
}

// skbLen is the size of struct __sk_buff.
const skbLen = 4 * 48

// run runs p on pkt with the struct __sk_buff that set writes.
func run(t *testing.T, p *ebpf.Program, pkt []byte, set func(ctx []byte)) (uint32, []byte) {
	t.Helper()
	return runCtx(t, p, pkt, set, nil)
}

// runCtx is run that reads the struct __sk_buff p left into ctxOut, if
// not nil.
func runCtx(t *testing.T, p *ebpf.Program, pkt []byte, set func(ctx []byte), ctxOut []byte) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	ctx := make([]byte, skbLen)
	set(ctx)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx, ContextOut: ctxOut}
	ret, err := p.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}

// SetL4Checksum6 writes the TCP or UDP checksum of an Ethernet/IPv6 frame
// whose L4 header follows the IPv6 header (Frame's), over the IPv6
// pseudo-header; a UDP checksum that comes out 0 is written 0xffff.
func SetL4Checksum6(b []byte) {
	off := l4ChecksumOffset6(b)
	b[off], b[off+1] = 0, 0
	c := ^fold(sum6(b))
	if c == 0 && b[20] == unix.IPPROTO_UDP {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(b[off:], c)
}

// L4Checksum6OK says whether the TCP or UDP checksum of such a frame is
// right over the IPv6 pseudo-header (and, for UDP, not 0: none, which
// IPv6 forbids).
func L4Checksum6OK(b []byte) bool {
	if binary.BigEndian.Uint16(b[l4ChecksumOffset6(b):]) == 0 {
		return false
	}
	return fold(sum6(b)) == 0xffff
}

func l4ChecksumOffset6(b []byte) int {
	if b[20] == unix.IPPROTO_TCP {
		return 54 + 16
	}
	return 54 + 6
}

// sum6 is the one's complement sum, unfolded, of the pseudo-header (the
// addresses, the L4 length, the protocol) and the L4 segment of an
// Ethernet/IPv6 frame, the L4 length taken from the IPv6 header.
func sum6(b []byte) uint32 {
	l4len := int(binary.BigEndian.Uint16(b[18:]))
	var s uint32
	add := func(p []byte) {
		for i := 0; i+1 < len(p); i += 2 {
			s += uint32(binary.BigEndian.Uint16(p[i:]))
		}
		if len(p)%2 == 1 {
			s += uint32(p[len(p)-1]) << 8
		}
	}
	add(b[22:54]) // source and destination
	s += uint32(l4len) + uint32(b[20])
	add(b[54 : 54+l4len])
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}
