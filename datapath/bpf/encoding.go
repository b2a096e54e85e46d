package bpf

import "net/netip"

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
