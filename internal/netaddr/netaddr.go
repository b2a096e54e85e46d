// Package netaddr has what net/netip lacks for prefixes, lists of
// addresses of both families, and netlink's forms of an address.
package netaddr

import (
	"net"
	"net/netip"

	"golang.org/x/sys/unix"
)

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

// Strings are ips as text, in their order (onctl's lists of a pod's
// addresses).
func Strings(ips []netip.Addr) []string {
	out := make([]string, len(ips))
	for i, ip := range ips {
		out[i] = ip.String()
	}
	return out
}

// First is the first of ips as text, "" when there is none.
func First(ips []netip.Addr) string {
	if len(ips) == 0 {
		return ""
	}
	return ips[0].String()
}

// Family is ip's address family as netlink names it.
func Family(ip netip.Addr) int {
	if ip.Is4() {
		return unix.AF_INET
	}
	return unix.AF_INET6
}

// HostPrefix is ip as a /32 or /128.
func HostPrefix(ip netip.Addr) *net.IPNet {
	return &net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(ip.BitLen(), ip.BitLen())}
}
