// Package netaddr has what net/netip lacks for prefixes and for lists
// of addresses of both families.
package netaddr

import "net/netip"

// Last is the last address of p, of either family.
func Last(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < 8*len(b); i++ {
		b[i/8] |= 0x80 >> (i % 8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// IPv4 is the first IPv4 address of ips (a dual-stack pod's, say);
// invalid when there is none.
func IPv4(ips []netip.Addr) netip.Addr {
	for _, ip := range ips {
		if ip.Is4() {
			return ip
		}
	}
	return netip.Addr{}
}
