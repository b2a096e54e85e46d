package lab

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/onc-net/onc/internal/netns"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// ProbePort is where the matrix's TCP and UDP echo servers listen.
const ProbePort = 7777

// Endpoint is something the matrix sends from or to: a pod or a node.
type Endpoint struct {
	Name  string
	Netns string
	IP    netip.Addr
	IPv6  netip.Addr // a dual-stack pod's IPv6 address; invalid for nodes
	Node  string     // the node it is on (itself for a node)
	IsPod bool
}

// Endpoints lists every node and pod of the lab. In an IPv6 lab IP is
// the IPv6 address of each (the node's tunnel endpoint), and IPv6 unset:
// there is one family to probe.
func (l *Lab) Endpoints() []Endpoint {
	var eps []Endpoint
	for _, n := range l.Nodes {
		eps = append(eps, Endpoint{Name: n.Name, Netns: n.Netns, IP: l.TunnelIP(n), Node: n.Name})
		for _, p := range n.Pods {
			ep := Endpoint{Name: p.Netns, Netns: p.Netns, IP: p.IP, IPv6: p.IPv6, Node: n.Name, IsPod: true}
			if l.IPFamily == IPFamilyIPv6 {
				ep.IPv6 = netip.Addr{}
			}
			eps = append(eps, ep)
		}
	}
	return eps
}

// Kind of a pair, as the matrix groups them.
func Kind(from, to Endpoint) string {
	switch {
	case from.IsPod && to.IsPod && from.Node == to.Node:
		return "pod→pod same node"
	case from.IsPod && to.IsPod:
		return "pod→pod cross node"
	case !from.IsPod && to.IsPod:
		return "node→pod"
	case from.IsPod && !to.IsPod:
		return "pod→node"
	}
	return "node→node"
}

// Result of one pair in one family: an error per protocol, nil when it
// worked.
type Result struct {
	From, To Endpoint
	IPv6     bool // probed To.IPv6
	ICMP     error
	TCP      error
	UDP      error
}

// dst is the address the result probed.
func (r Result) dst() netip.Addr {
	if r.IPv6 {
		return r.To.IPv6
	}
	return r.To.IP
}

// OK reports whether every protocol worked.
func (r Result) OK() bool { return r.ICMP == nil && r.TCP == nil && r.UDP == nil }

// matrixExchanges is how many echo exchanges each of the matrix's TCP and
// UDP probes does: the slow path learns a TCP flow in its first exchange
// and a UDP flow in its first two, so the rest show the fast path at work.
const matrixExchanges = 5

// Matrix probes every pair except node→node with ICMP, TCP and UDP; in a
// dual-stack lab, pod and node→pod pairs in IPv6 too (pods are a node's
// only IPv6 addresses: pod→node is IPv4's).
func (l *Lab) Matrix(ctx context.Context) ([]Result, error) {
	eps := l.Endpoints()
	stop, err := serve(eps)
	if err != nil {
		return nil, err
	}
	defer stop()
	var out []Result
	for _, from := range eps {
		for _, to := range eps {
			if from.Name == to.Name || (!from.IsPod && !to.IsPod) {
				continue
			}
			families := []bool{false}
			if to.IPv6.IsValid() && (from.IPv6.IsValid() || !from.IsPod) {
				families = append(families, true)
			}
			for _, v6 := range families {
				r := Result{From: from, To: to, IPv6: v6}
				dst := r.dst()
				r.ICMP = InNetns(from.Netns, func() error { return pingOnce(dst) })
				_, r.TCP = probe(from.Netns, "tcp", dst, ProbePort, 3*time.Second, matrixExchanges)
				_, r.UDP = probe(from.Netns, "udp", dst, ProbePort, 3*time.Second, matrixExchanges)
				out = append(out, r)
			}
		}
	}
	return out, ctx.Err()
}

// PrintMatrix writes one row per pair and a summary per kind; it returns
// how many pairs failed.
func PrintMatrix(w io.Writer, results []Result) int {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tFROM\tTO\tICMP\tTCP\tUDP")
	type count struct{ ok, all int }
	kinds := map[string]*count{}
	var order []string
	failed := 0
	for _, r := range results {
		k := Kind(r.From, r.To)
		if r.IPv6 {
			k += " IPv6"
		}
		if kinds[k] == nil {
			kinds[k] = &count{}
			order = append(order, k)
		}
		kinds[k].all++
		if r.OK() {
			kinds[k].ok++
		} else {
			failed++
		}
		fmt.Fprintf(tw, "%s\t%s\t%s (%s)\t%s\t%s\t%s\n", k, r.From.Name, r.To.Name, r.dst(), mark(r.ICMP), mark(r.TCP), mark(r.UDP))
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, k := range order {
		fmt.Fprintf(w, "%-25s %d/%d pairs pass\n", k, kinds[k].ok, kinds[k].all)
	}
	for _, r := range results {
		for proto, err := range map[string]error{"ICMP": r.ICMP, "TCP": r.TCP, "UDP": r.UDP} {
			if err != nil {
				fmt.Fprintf(w, "FAIL %s %s → %s (%s): %v\n", proto, r.From.Name, r.To.Name, r.dst(), err)
			}
		}
	}
	return failed
}

func mark(err error) string {
	if err == nil {
		return "ok"
	}
	return "FAIL"
}

// InNetns runs fn inside the named namespace (sockets made there stay there).
func InNetns(name string, fn func() error) error {
	ns, err := netns.Open(NetnsPath(name))
	if err != nil {
		return err
	}
	defer ns.Close()
	return netns.Do(ns, fn)
}

func token() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "onc-probe-" + hex.EncodeToString(b)
}

func pingOnce(dst netip.Addr) error {
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var request, reply icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if dst.Is6() {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		request, reply = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	c, err := icmp.ListenPacket(network, listen)
	if err != nil {
		return err
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	for seq := 1; seq <= 3; seq++ {
		msg := icmp.Message{Type: request, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("onc")}}
		b, _ := msg.Marshal(nil)
		if _, err := c.WriteTo(b, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		deadline := time.Now().Add(time.Second)
		_ = c.SetReadDeadline(deadline)
		buf := make([]byte, 1500)
		for time.Now().Before(deadline) {
			n, peer, err := c.ReadFrom(buf)
			if err != nil {
				break
			}
			m, err := icmp.ParseMessage(proto, buf[:n])
			if err != nil || m.Type != reply {
				continue
			}
			if e, ok := m.Body.(*icmp.Echo); ok && e.ID == id && e.Seq == seq && peer.String() == dst.String() {
				return nil
			}
		}
	}
	return errors.New("no ICMP echo reply in 3 tries")
}

// serve starts TCP and UDP echo servers on ProbePort in every endpoint's
// namespace, in IPv6 too where it has an IPv6 address.
func serve(eps []Endpoint) (func(), error) {
	var names, names6 []string
	for _, ep := range eps {
		if ep.IP.Is4() {
			names = append(names, ep.Netns)
		}
		if ep.IPv6.IsValid() || ep.IP.Is6() {
			names6 = append(names6, ep.Netns)
		}
	}
	stop, err := ServeEcho(names, []int{ProbePort}, []int{ProbePort})
	if err != nil {
		return nil, err
	}
	stop6, err := ServeEcho6(names6, []int{ProbePort}, []int{ProbePort})
	if err != nil {
		stop()
		return nil, err
	}
	return func() { stop(); stop6() }, nil
}

// ServeEcho starts echo servers in every namespace of netnses: TCP on
// tcpPorts (each connection gets back all it sends) and UDP on udpPorts
// (each datagram comes back), on every IPv4 address. stop closes them
// all.
func ServeEcho(netnses []string, tcpPorts, udpPorts []int) (stop func(), err error) {
	return serveEcho(netnses, "4", tcpPorts, udpPorts)
}

// ServeEcho6 is ServeEcho on every IPv6 address.
func ServeEcho6(netnses []string, tcpPorts, udpPorts []int) (stop func(), err error) {
	return serveEcho(netnses, "6", tcpPorts, udpPorts)
}

// serveEcho is ServeEcho in family "4" or "6" (IPv6 only: an IPv4
// client of a dual-stack socket would be an IPv4-mapped IPv6 one to the
// socket programs).
func serveEcho(netnses []string, family string, tcpPorts, udpPorts []int) (stop func(), err error) {
	var closers []io.Closer
	var wg sync.WaitGroup
	stop = func() {
		for _, c := range closers {
			c.Close()
		}
		wg.Wait()
	}
	for _, netns := range netnses {
		var tls []net.Listener
		var uls []net.PacketConn
		err := InNetns(netns, func() error {
			for _, port := range tcpPorts {
				l, err := net.Listen("tcp"+family, fmt.Sprintf(":%d", port))
				if err != nil {
					return err
				}
				tls, closers = append(tls, l), append(closers, l)
			}
			for _, port := range udpPorts {
				c, err := net.ListenPacket("udp"+family, fmt.Sprintf(":%d", port))
				if err != nil {
					return err
				}
				uls, closers = append(uls, c), append(closers, c)
			}
			return nil
		})
		if err != nil {
			stop()
			return nil, fmt.Errorf("echo server in %s: %w", netns, err)
		}
		for _, tl := range tls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					c, err := tl.Accept()
					if err != nil {
						return
					}
					go func() {
						defer c.Close()
						_ = c.SetDeadline(time.Now().Add(5 * time.Second))
						// Not io.Copy(c, c): that splices, and splice(2)
						// does not see bytes the intra-node bypass carried.
						_, _ = io.Copy(c, struct{ io.Reader }{c})
					}()
				}
			}()
		}
		for _, ul := range uls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				EchoUDP(ul, nil)
			}()
		}
	}
	return stop, nil
}

// Probe does one echo exchange from the namespace netns with an echo
// server (ServeEcho) at ip:port over network "tcp" or "udp", all within
// timeout, and returns nil if the echo came back. A TCP probe fails when
// it cannot connect within timeout; a UDP probe sends its datagram three
// times in timeout and fails if no echo came back. local is the probe's
// own address, also when it failed (invalid if it never had one): with ip
// and port it names the flow, e.g. in the flow cache.
func Probe(netns, network string, ip netip.Addr, port int, timeout time.Duration) (local netip.AddrPort, err error) {
	return probe(netns, network, ip, port, timeout, 1)
}

// probe is Probe doing exchanges echo exchanges, one after the other, on
// the one connection or socket.
func probe(netns, network string, ip netip.Addr, port int, timeout time.Duration, exchanges int) (local netip.AddrPort, err error) {
	deadline := time.Now().Add(timeout)
	d := net.Dialer{Deadline: deadline}
	family, wildcard := "4", unix.Sockaddr(&unix.SockaddrInet4{})
	if ip.Is6() {
		family, wildcard = "6", &unix.SockaddrInet6{}
	}
	if network == "tcp" {
		// Bind before connect, so the source port is known even if the
		// connection never comes up.
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var err error
			cerr := rc.Control(func(fd uintptr) {
				if err = unix.Bind(int(fd), wildcard); err != nil {
					return
				}
				var sa unix.Sockaddr
				if sa, err = unix.Getsockname(int(fd)); err == nil {
					switch sa := sa.(type) {
					case *unix.SockaddrInet4:
						local = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port))
					case *unix.SockaddrInet6:
						local = netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port))
					}
				}
			})
			return errors.Join(cerr, err)
		}
	}
	var c net.Conn
	err = InNetns(netns, func() (err error) {
		c, err = d.Dial(network+family, netip.AddrPortFrom(ip, uint16(port)).String())
		return err
	})
	if err != nil {
		return local, err
	}
	defer c.Close()
	if a, ok := c.LocalAddr().(interface{ AddrPort() netip.AddrPort }); ok {
		local = a.AddrPort()
		local = netip.AddrPortFrom(local.Addr().Unmap(), local.Port())
	}
	_ = c.SetDeadline(deadline)
	if network == "tcp" {
		r := bufio.NewReader(c)
		for range exchanges {
			msg := token()
			if _, err := fmt.Fprintln(c, msg); err != nil {
				return local, err
			}
			got, err := r.ReadString('\n')
			if err != nil {
				return local, err
			}
			if strings.TrimSpace(got) != msg {
				return local, fmt.Errorf("echo mismatch: sent %q, got %q", msg, got)
			}
		}
		return local, nil
	}
	for range exchanges {
		if err := echoUDP(c, token(), timeout, deadline); err != nil {
			return local, err
		}
	}
	return local, nil
}

// echoUDP sends msg on c, again every timeout/3, until its echo comes back
// or deadline passes.
func echoUDP(c net.Conn, msg string, timeout time.Duration, deadline time.Time) error {
	got := make(chan error, 1)
	go func() {
		buf := make([]byte, 256)
		for {
			n, err := c.Read(buf)
			if err != nil {
				got <- err
				return
			}
			if string(buf[:n]) == msg {
				got <- nil
				return
			}
		}
	}()
	resend := time.NewTicker(timeout / 3)
	defer resend.Stop()
	for {
		if _, err := c.Write([]byte(msg)); err != nil && time.Now().After(deadline) {
			// Past the deadline the reader has its answer too.
			break
		}
		select {
		case err := <-got:
			if err != nil {
				return fmt.Errorf("no UDP echo in %v: %w", timeout, err)
			}
			return nil
		case <-resend.C:
		}
	}
	if err := <-got; err != nil {
		return fmt.Errorf("no UDP echo in %v: %w", timeout, err)
	}
	return nil
}

// EchoUDP answers every datagram on c with itself until c is closed,
// counting them in received if it is not nil. The answer leaves from the
// address the datagram came to, as a connected client needs when c is
// bound to every address of a node with more than one (ctl0 and eth0 on
// the direct underlay; in IPv6 the kernel would pick the address sharing
// the longest prefix with the client, a pod's gateway for a pod).
func EchoUDP(c net.PacketConn, received *atomic.Int64) {
	if a, ok := c.LocalAddr().(*net.UDPAddr); ok && a.IP.To4() == nil && a.IP != nil {
		pc := ipv6.NewPacketConn(c)
		withDst := pc.SetControlMessage(ipv6.FlagDst, true) == nil
		echo(received, func(buf []byte) (int, func([]byte), error) {
			n, cm, addr, err := pc.ReadFrom(buf)
			var reply *ipv6.ControlMessage
			if withDst && cm != nil {
				reply = &ipv6.ControlMessage{Src: cm.Dst}
			}
			return n, func(b []byte) { _, _ = pc.WriteTo(b, reply, addr) }, err
		})
		return
	}
	pc := ipv4.NewPacketConn(c)
	withDst := pc.SetControlMessage(ipv4.FlagDst, true) == nil
	echo(received, func(buf []byte) (int, func([]byte), error) {
		n, cm, addr, err := pc.ReadFrom(buf)
		var reply *ipv4.ControlMessage
		if withDst && cm != nil {
			reply = &ipv4.ControlMessage{Src: cm.Dst}
		}
		return n, func(b []byte) { _, _ = pc.WriteTo(b, reply, addr) }, err
	})
}

// echo reads datagrams with read and answers each with itself through the
// answer read returned, counting them in received if it is not nil, until
// read fails.
func echo(received *atomic.Int64, read func([]byte) (int, func([]byte), error)) {
	buf := make([]byte, 65536)
	for {
		n, answer, err := read(buf)
		if err != nil {
			return
		}
		if received != nil {
			received.Add(1)
		}
		answer(buf[:n])
	}
}
