package bpf

import (
	"encoding/binary"
	"net/netip"
	"testing"
)

// FuzzByteOrder: an address or port a program stored in network order and
// Go read as a native integer converts to what those bytes say, and back.
func FuzzByteOrder(f *testing.F) {
	f.Add(uint32(0x0201f40a), uint16(0x901f)) // 10.244.1.2, 8080
	f.Add(uint32(0), uint16(0))
	f.Add(uint32(0xffffffff), uint16(0xff00))
	f.Fuzz(func(t *testing.T, v uint32, p uint16) {
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], v)
		if got, want := IPv4(v), netip.AddrFrom4(b); got != want || NetIPv4(got) != v {
			t.Fatalf("address bytes % x: IPv4 %s, want %s; back %#x", b, got, want, NetIPv4(got))
		}
		binary.NativeEndian.PutUint16(b[:], p)
		if got, want := NetPort(p), binary.BigEndian.Uint16(b[:]); got != want || NetPort(got) != p {
			t.Fatalf("port bytes % x: %d, want %d; back %#x", b[:2], got, want, NetPort(got))
		}
	})
}

// TestIPv6Words: a context's local_ip6[0] of fd00:10:244:1::5 holds the
// bytes fd 00 00 10, which a little-endian Go integer reads as 0x100000fd.
func TestIPv6Words(t *testing.T) {
	a := netip.MustParseAddr("fd00:10:244:1::5")
	want := [4]uint32{0x100000fd, 0x01004402, 0, 0x05000000}
	if got := NetIPv6(a); got != want || IPv6(got) != a {
		t.Fatalf("NetIPv6(%s) = %#x (back %s), want %#x", a, got, IPv6(got), want)
	}
}
