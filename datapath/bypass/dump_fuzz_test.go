package bypass

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// fuzzSockets reads the bypass map's sockets out of b, 6 bytes each: local
// and remote end (from a few addresses and ports, so that ends meet),
// role, cookie and two bytes of since. As in the map, a (local, remote)
// key is there once.
func fuzzSockets(b []byte) []socket {
	end := func(x byte) netip.AddrPort {
		return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 7, x >> 4}), uint16(x&15))
	}
	var out []socket
	seen := map[[2]netip.AddrPort]bool{}
	for ; len(b) >= 6; b = b[6:] {
		s := socket{local: end(b[0]), remote: end(b[1]), role: b[2] % 3, cookie: uint64(b[3]), since: uint64(binary.BigEndian.Uint16(b[4:]))}
		if k := [2]netip.AddrPort{s.local, s.remote}; !seen[k] {
			seen[k] = true
			out = append(out, s)
		}
	}
	return out
}

// FuzzPairConns: each socket of the map is one end of exactly one
// connection, the end its role says, under its own cookie; no connection
// is listed twice or without a socket; the list is sorted; a connection's
// age is its older socket's.
func FuzzPairConns(f *testing.F) {
	f.Add([]byte{0x11, 0x22, 1, 7, 0, 10, 0x22, 0x11, 2, 9, 0, 20}, uint64(100))  // a paired connection
	f.Add([]byte{0x11, 0x22, 1, 7, 0, 10, 0x33, 0x22, 1, 8, 0, 200}, uint64(100)) // two clients of one server, one unpaired, one from the future
	f.Add([]byte{0x11, 0x11, 1, 7, 0, 1}, uint64(0))                              // a self-connect
	f.Fuzz(func(t *testing.T, raw []byte, now uint64) {
		now &= math.MaxInt64 // a monotonic clock in ns (292 years) stays below 2^63
		socks := fuzzSockets(raw)
		conns := pairConns(socks, now)
		if !slices.IsSortedFunc(conns, func(a, b Conn) int {
			if c := a.Client.Compare(b.Client); c != 0 {
				return c
			}
			return a.Server.Compare(b.Server)
		}) {
			t.Fatalf("not sorted: %v", conns)
		}
		// Checked socket by socket, not by pairing them again: each is the
		// end its role says of exactly one listed connection, under its
		// cookie, and no older than that connection's age says.
		index := map[[2]netip.AddrPort]int{}
		for i, c := range conns {
			k := [2]netip.AddrPort{c.Client, c.Server}
			if _, dup := index[k]; dup {
				t.Fatalf("connection %s listed twice", describe(c))
			}
			index[k] = i
		}
		witnessed := make([]bool, len(conns))
		for _, s := range socks {
			k, server := [2]netip.AddrPort{s.local, s.remote}, s.role == roleServer // bp_role: a client's local end is the client
			if server {
				k = [2]netip.AddrPort{s.remote, s.local}
			}
			i, ok := index[k]
			if !ok {
				t.Fatalf("sockets %v: %s is in no connection", describeSockets(socks), describeSockets([]socket{s}))
			}
			c := conns[i]
			if cookie := map[bool]uint64{true: c.ServerCookie, false: c.ClientCookie}[server]; cookie != s.cookie {
				t.Fatalf("sockets %v: connection %s does not carry %s's cookie", describeSockets(socks), describe(c), describeSockets([]socket{s}))
			}
			if now > s.since && c.Age < time.Duration(now-s.since) {
				t.Fatalf("connection %s younger than its socket %s", describe(c), describeSockets([]socket{s}))
			}
			if c.Age == 0 || now > s.since && c.Age == time.Duration(now-s.since) {
				witnessed[i] = true // the socket the age is from (or none is older than now)
			}
		}
		for i, c := range conns {
			if !witnessed[i] {
				t.Fatalf("sockets %v: connection %s has no socket of its age (or none at all)", describeSockets(socks), describe(c))
			}
		}
	})
}

func describe(c Conn) string {
	return fmt.Sprintf("%s->%s client %d server %d age %v", c.Client, c.Server, c.ClientCookie, c.ServerCookie, c.Age)
}

func describeSockets(socks []socket) []string {
	out := make([]string, len(socks))
	for i, s := range socks {
		out[i] = fmt.Sprintf("%s->%s role %d cookie %d since %d", s.local, s.remote, s.role, s.cookie, s.since)
	}
	return out
}
