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
	"golang.org/x/sys/unix"
)

// ProbePort is where the matrix's TCP and UDP echo servers listen.
const ProbePort = 7777

// Endpoint is something the matrix sends from or to: a pod or a node.
type Endpoint struct {
	Name  string
	Netns string
	IP    netip.Addr
	Node  string // the node it is on (itself for a node)
	IsPod bool
}

// Endpoints lists every node and pod of the lab.
func (l *Lab) Endpoints() []Endpoint {
	var eps []Endpoint
	for _, n := range l.Nodes {
		eps = append(eps, Endpoint{Name: n.Name, Netns: n.Netns, IP: n.IP, Node: n.Name})
		for _, p := range n.Pods {
			eps = append(eps, Endpoint{Name: p.Netns, Netns: p.Netns, IP: p.IP, Node: n.Name, IsPod: true})
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

// Result of one pair: an error per protocol, nil when it worked.
type Result struct {
	From, To Endpoint
	ICMP     error
	TCP      error
	UDP      error
}

// OK reports whether every protocol worked.
func (r Result) OK() bool { return r.ICMP == nil && r.TCP == nil && r.UDP == nil }

// matrixExchanges is how many echo exchanges each of the matrix's TCP and
// UDP probes does: the slow path learns a TCP flow in its first exchange
// and a UDP flow in its first two, so the rest show the fast path at work.
const matrixExchanges = 5

// Matrix probes every pair except node→node with ICMP, TCP and UDP.
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
			r := Result{From: from, To: to}
			r.ICMP = InNetns(from.Netns, func() error { return pingOnce(to.IP) })
			_, r.TCP = probe(from.Netns, "tcp", to.IP, ProbePort, 3*time.Second, matrixExchanges)
			_, r.UDP = probe(from.Netns, "udp", to.IP, ProbePort, 3*time.Second, matrixExchanges)
			out = append(out, r)
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
		fmt.Fprintf(tw, "%s\t%s (%s)\t%s (%s)\t%s\t%s\t%s\n", k, r.From.Name, r.From.IP, r.To.Name, r.To.IP, mark(r.ICMP), mark(r.TCP), mark(r.UDP))
	}
	tw.Flush()
	fmt.Fprintln(w)
	for _, k := range order {
		fmt.Fprintf(w, "%-20s %d/%d pairs pass\n", k, kinds[k].ok, kinds[k].all)
	}
	for _, r := range results {
		for proto, err := range map[string]error{"ICMP": r.ICMP, "TCP": r.TCP, "UDP": r.UDP} {
			if err != nil {
				fmt.Fprintf(w, "FAIL %s %s → %s: %v\n", proto, r.From.Name, r.To.Name, err)
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
	c, err := icmp.ListenPacket("ip4:icmp", "0.0.0.0")
	if err != nil {
		return err
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	for seq := 1; seq <= 3; seq++ {
		msg := icmp.Message{Type: ipv4.ICMPTypeEcho, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("onc")}}
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
			m, err := icmp.ParseMessage(1, buf[:n])
			if err != nil || m.Type != ipv4.ICMPTypeEchoReply {
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
// namespace.
func serve(eps []Endpoint) (func(), error) {
	var names []string
	for _, ep := range eps {
		names = append(names, ep.Netns)
	}
	return ServeEcho(names, []int{ProbePort}, []int{ProbePort})
}

// ServeEcho starts echo servers in every namespace of netnses: TCP on
// tcpPorts (each connection gets back all it sends) and UDP on udpPorts
// (each datagram comes back), on every address. stop closes them all.
func ServeEcho(netnses []string, tcpPorts, udpPorts []int) (stop func(), err error) {
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
				l, err := net.Listen("tcp4", fmt.Sprintf(":%d", port))
				if err != nil {
					return err
				}
				tls, closers = append(tls, l), append(closers, l)
			}
			for _, port := range udpPorts {
				c, err := net.ListenPacket("udp4", fmt.Sprintf(":%d", port))
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
	if network == "tcp" {
		// Bind before connect, so the source port is known even if the
		// connection never comes up.
		d.Control = func(_, _ string, rc syscall.RawConn) error {
			var err error
			cerr := rc.Control(func(fd uintptr) {
				if err = unix.Bind(int(fd), &unix.SockaddrInet4{}); err != nil {
					return
				}
				var sa unix.Sockaddr
				if sa, err = unix.Getsockname(int(fd)); err == nil {
					if sa4, ok := sa.(*unix.SockaddrInet4); ok {
						local = netip.AddrPortFrom(netip.AddrFrom4(sa4.Addr), uint16(sa4.Port))
					}
				}
			})
			return errors.Join(cerr, err)
		}
	}
	var c net.Conn
	err = InNetns(netns, func() (err error) {
		c, err = d.Dial(network+"4", netip.AddrPortFrom(ip, uint16(port)).String())
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
// the direct underlay).
func EchoUDP(c net.PacketConn, received *atomic.Int64) {
	pc := ipv4.NewPacketConn(c)
	withDst := pc.SetControlMessage(ipv4.FlagDst, true) == nil
	buf := make([]byte, 65536)
	for {
		n, cm, addr, err := pc.ReadFrom(buf)
		if err != nil {
			return
		}
		if received != nil {
			received.Add(1)
		}
		var reply *ipv4.ControlMessage
		if withDst && cm != nil {
			reply = &ipv4.ControlMessage{Src: cm.Dst}
		}
		_, _ = pc.WriteTo(buf[:n], reply, addr)
	}
}
