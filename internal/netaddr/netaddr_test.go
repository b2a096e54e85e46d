package netaddr

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func TestLast(t *testing.T) {
	for p, want := range map[string]string{
		"10.244.1.0/24": "10.244.1.255", "10.244.1.7/24": "10.244.1.255", "0.0.0.0/0": "255.255.255.255", "10.0.0.1/32": "10.0.0.1",
		"fd00::/120": "fd00::ff", "fd00:10:244:1::/64": "fd00:10:244:1:ffff:ffff:ffff:ffff", "::/0": "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff",
	} {
		if got := Last(netip.MustParsePrefix(p)); got.String() != want {
			t.Errorf("Last(%s) = %s, want %s", p, got, want)
		}
	}
}

func TestIPv4(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.244.1.2"), netip.MustParseAddr("fd00::2")
	for _, c := range []struct {
		ips  []netip.Addr
		want netip.Addr
	}{{nil, netip.Addr{}}, {[]netip.Addr{v6}, netip.Addr{}}, {[]netip.Addr{v6, v4}, v4}, {[]netip.Addr{v4, v6}, v4}} {
		if got := IPv4(c.ips); got != c.want {
			t.Errorf("IPv4(%v) = %v, want %v", c.ips, got, c.want)
		}
	}
}

func TestNetlinkForms(t *testing.T) {
	v4, v6 := netip.MustParseAddr("10.244.1.1"), netip.MustParseAddr("fd00::1")
	if Family(v4) != unix.AF_INET || Family(v6) != unix.AF_INET6 {
		t.Error("Family")
	}
	if HostPrefix(v4).String() != "10.244.1.1/32" || HostPrefix(v6).String() != "fd00::1/128" {
		t.Errorf("HostPrefix: %s, %s", HostPrefix(v4), HostPrefix(v6))
	}
}
