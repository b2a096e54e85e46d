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
		// What bp_role says: a client socket's local end is the client.
		type ends struct{ client, server netip.AddrPort }
		want := map[ends]*Conn{}
		for _, s := range socks {
			e := ends{s.local, s.remote}
			if s.role == roleServer {
				e = ends{s.remote, s.local}
			}
			c := want[e]
			if c == nil {
				c = &Conn{Client: e.client, Server: e.server}
				want[e] = c
			}
			if s.role == roleServer {
				c.ServerCookie = s.cookie
			} else {
				c.ClientCookie = s.cookie
			}
			if now > s.since {
				c.Age = max(c.Age, time.Duration(now-s.since))
			}
		}
		if len(conns) != len(want) {
			t.Fatalf("%d connections from sockets %v, want %d: %v", len(conns), describeSockets(socks), len(want), conns)
		}
		for _, c := range conns {
			switch w := want[ends{c.Client, c.Server}]; {
			case w == nil:
				t.Fatalf("sockets %v: connection %s has none of them", describeSockets(socks), describe(c))
			case c != *w:
				t.Fatalf("sockets %v: connection %s, want %s", describeSockets(socks), describe(c), describe(*w))
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
