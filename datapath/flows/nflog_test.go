package flows

import (
	"errors"
	"net/netip"
	"testing"
)

func ipv4TCP(src, dst [4]byte, sport, dport uint16, fragOff uint16) []byte {
	b := make([]byte, 40)
	b[0], b[6], b[7], b[9] = 0x45, byte(fragOff>>8), byte(fragOff), 6
	copy(b[12:], src[:])
	copy(b[16:], dst[:])
	b[20], b[21], b[22], b[23] = byte(sport>>8), byte(sport), byte(dport>>8), byte(dport)
	return b
}

func TestParsePacket(t *testing.T) {
	v6 := make([]byte, 48)
	v6[0], v6[6] = 0x60, 17
	v6[8], v6[23], v6[24], v6[39] = 0xfd, 1, 0xfd, 2
	v6[40], v6[41], v6[42], v6[43] = 0x9c, 0x40, 0, 53
	// The same UDP datagram behind a hop-by-hop and a destination options
	// header.
	ext := append(append([]byte{}, v6[:40]...), 60, 0, 0, 0, 0, 0, 0, 0, 17, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	ext[6] = 0
	ext = append(ext, v6[40:]...)
	frag := append(append([]byte{}, v6[:40]...), 17, 0, 0, 8, 0, 0, 0, 1) // a second fragment
	frag[6] = 44
	frag = append(frag, v6[40:]...)
	for _, c := range []struct {
		name, prefix string
		pkt          []byte
		want         Packet
		err          error // nil: no error; errAny: some error
	}{
		{"IPv4 TCP, ingress", "onc1 D in 0123456789", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 0),
			Packet{Verdict: VerdictDenied, Ingress: true, PodID: "0123456789", Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}, nil},
		{"IPv6 UDP, egress, NUL-terminated", "onc1 D eg abcdef0123\x00", v6,
			Packet{Verdict: VerdictDenied, PodID: "abcdef0123", Proto: 17,
				Src: netip.MustParseAddrPort("[fd00::1]:40000"), Dst: netip.MustParseAddrPort("[fd00::2]:53")}, nil},
		{"a later fragment has no ports", "onc1 D in 0123456789", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 185),
			Packet{Verdict: VerdictDenied, Ingress: true, PodID: "0123456789", Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:0"), Dst: netip.MustParseAddrPort("10.0.0.2:0")}, nil},
		{"IPv6 extension headers", "onc1 D eg abcdef0123", ext,
			Packet{Verdict: VerdictDenied, PodID: "abcdef0123", Proto: 17,
				Src: netip.MustParseAddrPort("[fd00::1]:40000"), Dst: netip.MustParseAddrPort("[fd00::2]:53")}, nil},
		{"an IPv6 later fragment has no ports", "onc1 D eg abcdef0123", frag,
			Packet{Verdict: VerdictDenied, PodID: "abcdef0123", Proto: 17,
				Src: netip.MustParseAddrPort("[fd00::1]:0"), Dst: netip.MustParseAddrPort("[fd00::2]:0")}, nil},
		{"audit would deny", "onc1 W in 0123456789 89abcdef", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 0),
			Packet{Verdict: VerdictWouldDeny, Ingress: true, PodID: "0123456789", Fingerprint: "89abcdef", Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}, nil},
		{"denied, audit would allow", "onc1 U eg 0123456789 89abcdef", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 0),
			Packet{Verdict: VerdictWouldAllow, PodID: "0123456789", Fingerprint: "89abcdef", Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}, nil},
		{"denied, audit would allow, with the enforcing rules' fingerprint", "onc1 U in 0123456789 89abcdef 01234567", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 0),
			Packet{Verdict: VerdictWouldAllow, Ingress: true, PodID: "0123456789", Fingerprint: "89abcdef", EnforcingFingerprint: "01234567", Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}, nil},
		{"with the rules' fingerprint", "onc1 D in 0123456789 89abcdef", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 0),
			Packet{Verdict: VerdictDenied, Ingress: true, PodID: "0123456789", Fingerprint: "89abcdef", Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}, nil},
		{"allowed, egress", "onc1 A eg 0123456789 89abcdef", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 0),
			Packet{Verdict: VerdictAllowed, PodID: "0123456789", Fingerprint: "89abcdef", Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}, nil},
		{"a base chain's drop", "onc1 X nosyn in", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 40000, 80, 0),
			Packet{Verdict: VerdictDropped, Why: DropNoSYN, Ingress: true, Proto: 6,
				Src: netip.MustParseAddrPort("10.0.0.1:40000"), Dst: netip.MustParseAddrPort("10.0.0.2:80")}, nil},
		{"allowed without a fingerprint", "onc1 A in 0123456789", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"a field too many", "onc1 D in 0123456789 89abcdef x", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"an unknown drop", "onc1 X martian eg", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"a drop without a direction", "onc1 X spoof", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"a drop with a pod id", "onc1 X spoof eg 0123456789", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"would deny without a fingerprint", "onc1 W in 0123456789", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"two fingerprints but for U", "onc1 W in 0123456789 89abcdef 01234567", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"denied with two fingerprints", "onc1 D in 0123456789 89abcdef 01234567", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"U with a field too many", "onc1 U in 0123456789 89abcdef 01234567 x", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"someone else's prefix", "IN=eth0 DROP", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"another grammar version", "onc2 D in 0123456789", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"an unknown verdict", "onc1 Q in 0123456789", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"an unknown direction", "onc1 D up 0123456789", ipv4TCP([4]byte{}, [4]byte{}, 1, 2, 0), Packet{}, ErrNotOurs},
		{"truncated IPv4", "onc1 D in 0123456789", []byte{0x45, 0, 0}, Packet{}, errAny},
		{"truncated IPv6", "onc1 D in 0123456789", v6[:30], Packet{}, errAny},
		{"not IP", "onc1 D in 0123456789", []byte{0x10}, Packet{}, errAny},
	} {
		got, err := ParsePacket(c.prefix, c.pkt)
		switch {
		case c.err == nil && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.err == errAny && err == nil, c.err != nil && c.err != errAny && !errors.Is(err, c.err):
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
		case c.err == nil && got != c.want:
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}

var errAny = errors.New("any error")

// The longest prefix, U's with both fingerprints, fits nft's log prefix
// (NF_LOG_PREFIXLEN, 128 bytes with the NUL), and reads back.
func TestWouldAllowPrefix(t *testing.T) {
	prefix := WouldAllowPrefix(true, "0123456789", "89abcdef", "01234567")
	if len(prefix) > 127 {
		t.Errorf("%q: %d characters, more than nft takes", prefix, len(prefix))
	}
	p, err := ParsePacket(prefix, ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 1, 2, 0))
	if err != nil || p.Verdict != VerdictWouldAllow || !p.Ingress || p.PodID != "0123456789" || p.Fingerprint != "89abcdef" || p.EnforcingFingerprint != "01234567" {
		t.Errorf("%q reads back as %+v, %v", prefix, p, err)
	}
}

func FuzzParsePacket(f *testing.F) {
	f.Add("onc1 D in 0123456789", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 1, 2, 0))
	f.Add("onc1 D eg 0123456789 89abcdef", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 1, 2, 0))
	f.Add("onc1 A in 0123456789 89abcdef", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 1, 2, 0))
	f.Add("onc1 U in 0123456789 89abcdef 01234567", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 1, 2, 0))
	f.Add("onc1 X spoof eg", ipv4TCP([4]byte{10, 0, 0, 1}, [4]byte{10, 0, 0, 2}, 1, 2, 0))
	f.Fuzz(func(t *testing.T, prefix string, pkt []byte) {
		p, err := ParsePacket(prefix, pkt)
		if err == nil && (!p.Src.Addr().IsValid() || p.Src.Addr().Is4() != p.Dst.Addr().Is4() ||
			(p.Verdict == VerdictDropped) != (p.PodID == "" && p.Fingerprint == "" && p.Why != "") ||
			p.Verdict == VerdictAllowed && p.Fingerprint == "" || p.EnforcingFingerprint != "" && p.Verdict != VerdictWouldAllow) {
			t.Fatalf("%q %x: %+v", prefix, pkt, p)
		}
	})
}
