package bpf

import (
	"encoding/binary"
	"net/netip"
)

// The programs hold IPv4 addresses and ports in network byte order; in a
// little-endian Go integer read from a map they look byte-swapped. These
// convert, so no caller swaps bytes by hand.

// NetIPv4 is a as a program stores it.
func NetIPv4(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// IPv4 is the address a program stored as v.
func IPv4(v uint32) netip.Addr {
	return netip.AddrFrom4([4]byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)})
}

// NetPort swaps a port to or from the network byte order a program uses.
func NetPort(p uint16) uint16 { return p>>8 | p<<8 }

// NetIPv6 is a as a program stores it in four 32-bit words (the words of
// a context's local_ip6 and remote_ip6), the bytes in network order.
func NetIPv6(a netip.Addr) (w [4]uint32) {
	b := a.As16()
	for i := range w {
		w[i] = binary.NativeEndian.Uint32(b[4*i:])
	}
	return w
}

// IPv6 is the address a program stored as the words w.
func IPv6(w [4]uint32) netip.Addr {
	var b [16]byte
	for i, v := range w {
		binary.NativeEndian.PutUint32(b[4*i:], v)
	}
	return netip.AddrFrom16(b)
}
