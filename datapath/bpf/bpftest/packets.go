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

// run runs p on pkt with the struct __sk_buff that set writes.
func run(t *testing.T, p *ebpf.Program, pkt []byte, set func(ctx []byte)) (uint32, []byte) {
	t.Helper()
	out := make([]byte, len(pkt)+256)
	ctx := make([]byte, 4*48) // struct __sk_buff
	set(ctx)
	opts := &ebpf.RunOptions{Data: pkt, DataOut: out, Context: ctx}
	ret, err := p.Run(opts)
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, opts.DataOut
}
