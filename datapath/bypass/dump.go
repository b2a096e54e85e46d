package bypass

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/onc-net/onc/datapath/bpf"
	"golang.org/x/sys/unix"
)

// Conn is one bypassed connection: its two sockets in the map, or one,
// when the other end has not been recorded (a connection still starting,
// or one this node cannot pair: its sends take the stack).
type Conn struct {
	Client, Server netip.AddrPort
	// ClientCookie and ServerCookie name each end's socket; 0 for an end
	// not in the map.
	ClientCookie, ServerCookie uint64
	Age                        time.Duration
}

// Paired reports whether both ends are in the map, so sends are bypassed.
func (c Conn) Paired() bool { return c.ClientCookie != 0 && c.ServerCookie != 0 }

// socket is one entry of the map with its metadata.
type socket struct {
	local, remote netip.AddrPort
	cookie        uint64
	role          uint8 // enum bp_role
	since         uint64
}

const roleServer = 2 // enum bp_role

// Conns lists the open connections in the map, sorted by client then
// server. A socket that has reached CLOSE (reset, aborted) is left out:
// the kernel unlinks it only when its file is closed.
func (b *Bypass) Conns() ([]Conn, error) {
	socks, err := b.sockets()
	if err != nil {
		return nil, err
	}
	now, err := monotonicNow()
	if err != nil {
		return nil, err
	}
	return pairConns(socks, now), nil
}

// pairConns pairs the sockets of each connection, by their role: an
// address comparison would take a server socket whose two ends are equal
// for a client.
func pairConns(socks []socket, now uint64) []Conn {
	type pair struct{ client, server netip.AddrPort }
	byPair := map[pair]*Conn{}
	var order []pair
	for _, s := range socks {
		p := pair{s.local, s.remote}
		if s.role == roleServer {
			p = pair{s.remote, s.local}
		}
		c := byPair[p]
		if c == nil {
			c = &Conn{Client: p.client, Server: p.server}
			byPair[p] = c
			order = append(order, p)
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
	out := make([]Conn, 0, len(order))
	for _, p := range order {
		out = append(out, *byPair[p])
	}
	slices.SortFunc(out, func(a, b Conn) int {
		if c := a.Client.Compare(b.Client); c != 0 {
			return c
		}
		return a.Server.Compare(b.Server)
	})
	return out
}

// sockets are the open sockets of both families' maps.
func (b *Bypass) sockets() ([]socket, error) {
	v4, err := familySockets(b.maps.OncBpSock, b.maps.OncBpConn, func(k bpf.BypassBpKey) (netip.AddrPort, netip.AddrPort) {
		return netip.AddrPortFrom(bpf.IPv4(k.LocalIp), bpf.NetPort(k.LocalPort)),
			netip.AddrPortFrom(bpf.IPv4(k.RemoteIp), bpf.NetPort(k.RemotePort))
	})
	if err != nil {
		return nil, err
	}
	v6, err := familySockets(b.maps.OncBpSock6, b.maps.OncBpConn6, func(k bpf.BypassBpKey6) (netip.AddrPort, netip.AddrPort) {
		return netip.AddrPortFrom(bpf.IPv6(k.LocalIp), bpf.NetPort(k.LocalPort)),
			netip.AddrPortFrom(bpf.IPv6(k.RemoteIp), bpf.NetPort(k.RemotePort))
	})
	return append(v4, v6...), err
}

// familySockets are the open sockets of one family's SOCKHASH socks, with
// their metadata in conns; ends decodes a key.
func familySockets[K any](socks, conns *ebpf.Map, ends func(K) (local, remote netip.AddrPort)) ([]socket, error) {
	var key K
	var keys []K
	it := socks.Iterate()
	var cookie uint64
	for it.Next(&key, &cookie) {
		keys = append(keys, key)
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("bypass map: %w", err)
	}
	out := make([]socket, 0, len(keys))
	for _, k := range keys {
		var s socket
		s.local, s.remote = ends(k)
		// A socket closing meanwhile is gone: skip it.
		if err := socks.Lookup(k, &s.cookie); err != nil {
			if isNotExist(err) {
				continue
			}
			return nil, fmt.Errorf("bypass map: %w", err)
		}
		// The metadata goes when the socket reaches CLOSE; the entry only
		// when its file is closed, which may be much later.
		var meta bpf.BypassBpConn
		if err := conns.Lookup(k, &meta); isNotExist(err) || meta.Cookie != s.cookie {
			continue
		} else if err != nil {
			return nil, fmt.Errorf("bypass metadata: %w", err)
		}
		s.role, s.since = meta.Role, meta.SinceNs
		out = append(out, s)
	}
	return out, nil
}

// Stats are the programs' counters, named as in enum bp_stat.
func (b *Bypass) Stats() ([]bpf.Counter, error) {
	return b.counters.Read()
}

func isNotExist(err error) bool { return errors.Is(err, ebpf.ErrKeyNotExist) }

// monotonicNow is bpf_ktime_get_ns()'s clock.
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()), nil
}
