//go:build privileged

package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os/exec"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onc-net/onc/internal/netns"
	"github.com/onc-net/onc/internal/testutil"
)

// Addresses of the test topology: pods are 10.99.0.<n>/32 and
// fd99::<n>/128 behind veths whose node ends answer for the gateways
// 169.254.1.1 and fe80::1; the node itself is also 10.99.1.1 (on lo).
var (
	nodeAddr = netip.MustParseAddr("10.99.1.1")
	gwAddr   = netip.MustParseAddr("169.254.1.1")
)

// topo is a throwaway "node" namespace with "pod" namespaces behind veths.
type topo struct {
	t      *testing.T
	node   string // netns name
	nodeNS netns.Handle
	pods   map[string]*tpod // by pod name
}

type tpod struct {
	key   string
	netns string
	ns    netns.Handle
	iface string // host side
	ip    netip.Addr
	ip6   netip.Addr
}

func privileged(t *testing.T) {
	t.Helper()
	testutil.Privileged(t)
	_, err := exec.LookPath("nft")
	testutil.Require(t, err == nil, "nft not installed (make prereqs)")
}

func run(t *testing.T, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func openNS(t *testing.T, path string) netns.Handle {
	t.Helper()
	h, err := netns.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return h
}

// newTopo builds the node namespace and one pod namespace per name.
func newTopo(t *testing.T, names ...string) *topo {
	t.Helper()
	privileged(t)
	pre := testutil.Prefix()
	tp := &topo{t: t, node: pre + "-node", pods: map[string]*tpod{}}
	tp.nodeNS = openNS(t, testutil.Netns(t, tp.node))
	run(t, "ip", "-n", tp.node, "link", "set", "lo", "up")
	run(t, "ip", "-n", tp.node, "addr", "add", nodeAddr.String()+"/32", "dev", "lo")
	// No duplicate address detection: addresses work at once.
	run(t, "ip", "netns", "exec", tp.node, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1", "net.ipv6.conf.default.accept_dad=0")
	for i, name := range names {
		ns := pre + "-" + name
		p := &tpod{
			key:   "ns/" + name,
			netns: ns,
			ns:    openNS(t, testutil.Netns(t, ns)),
			iface: fmt.Sprintf("%sv%d", pre, i),
			ip:    netip.AddrFrom4([4]byte{10, 99, 0, byte(i + 1)}),
			ip6:   netip.AddrFrom16([16]byte{0: 0xfd, 1: 0x99, 15: byte(i + 1)}),
		}
		run(t, "ip", "-n", tp.node, "link", "add", p.iface, "type", "veth", "peer", "name", "eth0", "netns", ns)
		run(t, "ip", "-n", tp.node, "addr", "add", gwAddr.String()+"/32", "dev", p.iface)
		run(t, "ip", "-n", tp.node, "link", "set", p.iface, "up")
		run(t, "ip", "-n", tp.node, "addr", "add", "fe80::1/64", "dev", p.iface)
		run(t, "ip", "-n", tp.node, "route", "add", p.ip.String()+"/32", "dev", p.iface)
		run(t, "ip", "-n", tp.node, "route", "add", p.ip6.String()+"/128", "dev", p.iface)
		run(t, "ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.eth0.accept_dad=0")
		run(t, "ip", "-n", ns, "link", "set", "lo", "up")
		run(t, "ip", "-n", ns, "addr", "add", p.ip.String()+"/32", "dev", "eth0")
		run(t, "ip", "-n", ns, "addr", "add", p.ip6.String()+"/128", "dev", "eth0")
		run(t, "ip", "-n", ns, "link", "set", "eth0", "up")
		run(t, "ip", "-n", ns, "route", "add", gwAddr.String(), "dev", "eth0", "scope", "link")
		run(t, "ip", "-n", ns, "route", "add", "default", "via", gwAddr.String(), "dev", "eth0")
		run(t, "ip", "-n", ns, "route", "add", "default", "via", "fe80::1", "dev", "eth0")
		tp.pods[name] = p
	}
	return tp
}

// in runs fn on a thread inside ns.
func (tp *topo) in(ns netns.Handle, fn func() error) {
	tp.t.Helper()
	if err := netns.Do(ns, fn); err != nil {
		tp.t.Fatal(err)
	}
}

// testLogGroup is the NFLOG group the tests' Enforcers log denied packets
// to, so that every change they make writes the log rules too.
const testLogGroup = 1707

// enforcer starts an Enforcer in the node namespace, logging to
// testLogGroup.
func (tp *topo) enforcer() *Enforcer { return tp.enforcerLogging(testLogGroup) }

// enforcerLogging starts an Enforcer in the node namespace, logging to
// group (0: not at all).
func (tp *topo) enforcerLogging(group uint16) *Enforcer {
	tp.t.Helper()
	var e *Enforcer
	tp.in(tp.nodeNS, func() (err error) {
		e, err = NewEnforcer(group)
		return err
	})
	tp.t.Cleanup(func() { e.Close() })
	return e
}

// apply applies rs in the node namespace and checks the keys it reports
// changed.
func (tp *topo) apply(e *Enforcer, rs Ruleset, wantChanged ...string) {
	tp.t.Helper()
	var changed []string
	tp.in(tp.nodeNS, func() (err error) {
		changed, err = e.Apply(rs, false)
		return err
	})
	if fmt.Sprint(changed) != fmt.Sprint(wantChanged) {
		tp.t.Fatalf("Apply changed %v, want %v", changed, wantChanged)
	}
}

func (tp *topo) counters(e *Enforcer) Counts {
	tp.t.Helper()
	var c Counts
	tp.in(tp.nodeNS, func() (err error) {
		c, err = e.Counters()
		return err
	})
	return c
}

func (tp *topo) revoke(e *Enforcer, rs Ruleset, keys ...string) Revoked {
	tp.t.Helper()
	var r Revoked
	tp.in(tp.nodeNS, func() (err error) {
		r, err = e.Revoke(rs, keys, []netip.Addr{nodeAddr, gwAddr}, nil)
		return err
	})
	return r
}

// keeps asks r whether the flow cache may keep c's flow (client to server
// as the client sees it; the flow cache sees the server's end).
func keeps(r Revoked, client, server net.Conn) bool {
	local := netip.MustParseAddrPort(server.LocalAddr().String())
	remote := netip.MustParseAddrPort(client.LocalAddr().String())
	return r.Keeps(local, remote, TCP) && r.Keeps(remote, local, TCP)
}

// nft runs nft in the node namespace.
func (tp *topo) nft(args ...string) (string, error) {
	out, err := exec.Command("ip", append([]string{"netns", "exec", tp.node, "nft"}, args...)...).CombinedOutput()
	return string(out), err
}

var counterValues = regexp.MustCompile(`packets \d+ bytes \d+`)

// listing is `nft list table` with counter values blanked.
func (tp *topo) listing() string {
	tp.t.Helper()
	out, err := tp.nft("list", "table", "inet", Table)
	if err != nil {
		tp.t.Fatalf("nft list table: %v: %s", err, out)
	}
	return deniedElements.ReplaceAllString(counterValues.ReplaceAllString(out, "packets N bytes N"), "$1")
}

// deniedElements are the connections whose drops were logged lately
// (deniedSets): the packets' state, not the rules.
var deniedElements = regexp.MustCompile(`(?s)(set flows-denied6? \{[^}]*?timeout 1m\n)\s*elements = \{[^}]*\}\n`)

// expectIngressSets checks that the ingress sets of the pod name, read
// back from the kernel, hold exactly in's elements, and tells whether they
// are the second pair (setNames).
func (tp *topo) expectIngressSets(name string, in *Direction) (second bool) {
	tp.t.Helper()
	return tp.expectSets(ingress.chain(PodID(tp.pods[name].key)), in)
}

// expectSets checks that the sets named from base (setNames), read back
// from the kernel, hold exactly in's elements, and tells whether they are
// the second pair.
func (tp *topo) expectSets(base string, in *Direction) (second bool) {
	tp.t.Helper()
	names := regexp.MustCompile(`^` + regexp.QuoteMeta(base) + `-(ports|all)6?(-b)?$`)
	out, err := tp.nft("-j", "list", "table", "inet", Table)
	if err != nil {
		tp.t.Fatalf("nft list table: %v: %s", err, out)
	}
	var doc struct {
		Nftables []struct {
			Set *struct {
				Name string
				Elem []any
			}
		}
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		tp.t.Fatal(err)
	}
	got := map[string][]string{}
	for _, o := range doc.Nftables {
		if o.Set != nil && names.MatchString(o.Set.Name) {
			got[o.Set.Name] = []string{}
			for _, el := range o.Set.Elem {
				got[o.Set.Name] = append(got[o.Set.Name], elemKey(el))
			}
			slices.Sort(got[o.Set.Name])
		}
	}
	second = !slices.ContainsFunc(slices.Collect(maps.Keys(got)), func(s string) bool { return !strings.HasSuffix(s, "-b") })
	if want := wantSets(base, second, in); !reflect.DeepEqual(got, want) {
		tp.t.Fatalf("the sets of %s in the kernel:\n%v\nwant:\n%v", base, got, want)
	}
	return second
}

// elemKey renders a set element of nft's JSON listing as knftables writes
// it (portElem.key): a prefix, or prefix . protocol number . port range.
func elemKey(el any) string {
	switch v := el.(type) {
	case string: // an address, or a protocol by name
		if p, ok := map[string]Proto{"tcp": TCP, "udp": UDP, "sctp": SCTP}[v]; ok {
			return strconv.Itoa(int(p))
		}
		if strings.Contains(v, ":") {
			return v + "/128"
		}
		return v + "/32"
	case float64: // a port, or a protocol by number
		return strconv.Itoa(int(v))
	case map[string]any:
		if p, ok := v["prefix"].(map[string]any); ok {
			return fmt.Sprintf("%v/%v", p["addr"], p["len"])
		}
		if r, ok := v["range"].([]any); ok && len(r) == 2 {
			return elemKey(r[0]) + "-" + elemKey(r[1])
		}
		if c, ok := v["concat"].([]any); ok {
			parts := make([]string, len(c))
			for i, x := range c {
				parts[i] = elemKey(x)
			}
			return strings.Join(parts, " . ")
		}
	}
	return fmt.Sprintf("unknown %v", el)
}

// pod is the model of a test pod with the given directions.
func (tp *topo) pod(name string, in, eg *Direction) Pod {
	p := tp.pods[name]
	return Pod{Key: p.key, Iface: p.iface, IPs: []netip.Addr{p.ip, p.ip6}, Ingress: in, Egress: eg}
}

// serve runs TCP echo servers on the ports and UDP echo servers on the
// udp ports, all addresses of ns (both families), until the test ends.
func (tp *topo) serve(ns netns.Handle, tcp []int, udp []int) {
	tp.t.Helper()
	tp.in(ns, func() error {
		for _, port := range tcp {
			l, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			var mu sync.Mutex
			var conns []net.Conn
			tp.t.Cleanup(func() {
				l.Close()
				mu.Lock()
				defer mu.Unlock()
				for _, c := range conns {
					c.Close()
				}
			})
			go func() {
				for {
					c, err := l.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					conns = append(conns, c)
					mu.Unlock()
					go func() { _, _ = io.Copy(c, c) }()
				}
			}()
		}
		for _, port := range udp {
			pc, err := net.ListenPacket("udp", fmt.Sprintf(":%d", port))
			if err != nil {
				return err
			}
			tp.t.Cleanup(func() { pc.Close() })
			go func() {
				buf := make([]byte, 1500)
				for {
					n, from, err := pc.ReadFrom(buf)
					if err != nil {
						return
					}
					_, _ = pc.WriteTo(buf[:n], from)
				}
			}()
		}
		return nil
	})
}

// dropWait is how long a probe waits for an answer before calling the
// packet dropped (the namespaces answer in well under a millisecond).
const dropWait = 400 * time.Millisecond

// dial opens a TCP connection from ns to dst, nil if it is not answered.
func (tp *topo) dial(ns netns.Handle, dst netip.AddrPort) net.Conn {
	tp.t.Helper()
	var c net.Conn
	tp.in(ns, func() error {
		var err error
		c, err = net.DialTimeout("tcp", dst.String(), dropWait)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil
		}
		return err
	})
	if c != nil {
		tp.t.Cleanup(func() { c.Close() })
	}
	return c
}

// echoes reports whether c's peer echoes a message within dropWait.
func echoes(c net.Conn) bool {
	msg := []byte("ping")
	if _, err := c.Write(msg); err != nil {
		return false
	}
	_ = c.SetReadDeadline(time.Now().Add(dropWait))
	buf := make([]byte, len(msg))
	_, err := io.ReadFull(c, buf)
	return err == nil
}

// pair opens a TCP connection from ns to dst, which leads to the pod's
// port, and returns both ends.
func (tp *topo) pair(from netns.Handle, dst netip.AddrPort, to *tpod, port uint16) (client, server net.Conn) {
	tp.t.Helper()
	var l net.Listener
	tp.in(to.ns, func() (err error) {
		l, err = net.Listen("tcp", fmt.Sprintf(":%d", port))
		return err
	})
	defer l.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		accepted <- c
	}()
	client = tp.dial(from, dst)
	if client == nil {
		tp.t.Fatalf("cannot connect to %s", dst)
	}
	server = <-accepted
	tp.t.Cleanup(func() { server.Close() })
	return client, server
}

// passes reports whether a message written to w arrives at r within
// dropWait.
func passes(w, r net.Conn) bool {
	msg := []byte("ping")
	if _, err := w.Write(msg); err != nil {
		return false
	}
	_ = r.SetReadDeadline(time.Now().Add(dropWait))
	_, err := io.ReadFull(r, make([]byte, len(msg)))
	return err == nil
}

// udpEchoes reports whether a UDP datagram from ns to dst is echoed.
func (tp *topo) udpEchoes(ns netns.Handle, dst netip.AddrPort) bool {
	tp.t.Helper()
	var c net.Conn
	tp.in(ns, func() (err error) {
		c, err = net.Dial("udp", dst.String())
		return err
	})
	defer c.Close()
	return echoes(c)
}

// tcpOK reports whether a new TCP connection from ns to dst is echoed.
func (tp *topo) tcpOK(ns netns.Handle, dst netip.AddrPort) bool {
	tp.t.Helper()
	c := tp.dial(ns, dst)
	if c == nil {
		return false
	}
	defer c.Close()
	return echoes(c)
}

// expect checks connectivity: each check is "from", "proto", "to", "port"
// and whether it must work.
type probe struct {
	from  string // pod name or "node"
	proto string // "tcp" or "udp" over IPv4, "tcp6" or "udp6" over IPv6
	to    string // pod name or "node"
	port  uint16
	ok    bool
}

func (tp *topo) ns(name string) netns.Handle {
	if name == "node" {
		return tp.nodeNS
	}
	return tp.pods[name].ns
}

func (tp *topo) addr(name string, ipv6 bool) netip.Addr {
	switch {
	case name == "node":
		return nodeAddr
	case ipv6:
		return tp.pods[name].ip6
	}
	return tp.pods[name].ip
}

func (tp *topo) expect(probes ...probe) {
	tp.t.Helper()
	for _, p := range probes {
		dst := netip.AddrPortFrom(tp.addr(p.to, strings.HasSuffix(p.proto, "6")), p.port)
		var got bool
		if strings.HasPrefix(p.proto, "udp") {
			got = tp.udpEchoes(tp.ns(p.from), dst)
		} else {
			got = tp.tcpOK(tp.ns(p.from), dst)
		}
		if got != p.ok {
			tp.t.Errorf("%s %s -> %s:%d: works=%v, want %v", p.proto, p.from, p.to, p.port, got, p.ok)
		}
	}
	if tp.t.Failed() {
		out, _ := tp.nft("list", "table", "inet", Table)
		tp.t.Fatalf("table:\n%s", out)
	}
}

// sameAsFresh fails the test unless the table in namespace inc, after
// step, is the one a fresh Enforcer writes for rs in ref (refNS).
func (tp *topo) sameAsFresh(step int, rs Ruleset, inc, ref string, refNS netns.Handle) {
	tp.t.Helper()
	tp.in(refNS, func() error {
		fresh, err := NewEnforcer(testLogGroup)
		if err != nil {
			return err
		}
		if err := fresh.Remove(); err != nil {
			return err
		}
		_, err = fresh.Apply(rs, false)
		return err
	})
	if got, want := normalized(tp.t, inc), normalized(tp.t, ref); got != want {
		tp.t.Fatalf("step %d: incremental table\n%s\ndiffers from fresh\n%s", step, got, want)
	}
}
