//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"math/rand"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

func agent(t *testing.T, n *lab.Node) apiv1.AgentClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+n.AgentSocket(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return apiv1.NewAgentClient(conn)
}

// stats reads a node's fast-path counters as "program_name" -> value.
func stats(t *testing.T, n *lab.Node) map[string]uint64 {
	t.Helper()
	s, err := n.Stats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// nodeStatus is n's agent's status.
func nodeStatus(t *testing.T, n *lab.Node) *apiv1.NodeStatus {
	t.Helper()
	st, err := n.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// settled returns n's counters once its fast path has carried nothing for
// 300 ms, so that a late packet of an earlier flow (a delayed ACK waits up
// to 200 ms) does not count towards the next measurement.
func settled(t *testing.T, n *lab.Node) map[string]uint64 {
	t.Helper()
	prev, deadline := stats(t, n), time.Now().Add(10*time.Second)
	for {
		time.Sleep(300 * time.Millisecond)
		cur := stats(t, n)
		if cur["ingress_hit"] == prev["ingress_hit"] && cur["egress_hit"] == prev["egress_hit"] &&
			cur["ingress6_hit"] == prev["ingress6_hit"] && cur["egress6_hit"] == prev["egress6_hit"] {
			return cur
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: the fast path never went quiet", n.Name)
		}
		prev = cur
	}
}

func setFastPath(t *testing.T, n *lab.Node, on bool) {
	t.Helper()
	if _, err := agent(t, n).SetFastPath(context.Background(), &apiv1.SetFastPathRequest{Enabled: on}); err != nil {
		t.Fatal(err)
	}
}

// listenTCP and listenUDP listen on an IPv4 port in a namespace.
func listenTCP(t *testing.T, netns string, port int) net.Listener {
	return listenOn(t, netns, "tcp4", port)
}

// listenOn listens on port in netns, network tcp4 or tcp6.
func listenOn(t *testing.T, netns, network string, port int) net.Listener {
	t.Helper()
	var l net.Listener
	if err := lab.InNetns(netns, func() (err error) { l, err = net.Listen(network, fmt.Sprintf(":%d", port)); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func listenUDP(t *testing.T, netns string, port int) net.PacketConn {
	return listenPacketOn(t, netns, "udp4", port)
}

// listenPacketOn listens on port in netns, network udp4 or udp6.
func listenPacketOn(t *testing.T, netns, network string, port int) net.PacketConn {
	t.Helper()
	var c net.PacketConn
	if err := lab.InNetns(netns, func() (err error) { c, err = net.ListenPacket(network, fmt.Sprintf(":%d", port)); return }); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func dial(t *testing.T, netns, network string, dst netip.Addr, port int) net.Conn {
	t.Helper()
	var c net.Conn
	err := lab.InNetns(netns, func() (err error) {
		c, err = net.DialTimeout(network, netip.AddrPortFrom(dst, uint16(port)).String(), 3*time.Second)
		return
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func echoUDP(c net.PacketConn) { go lab.EchoUDP(c, nil) }

// rr does n request/response exchanges of 100 bytes on c.
func rr(c net.Conn, n int) error {
	buf := make([]byte, 100)
	for i := 0; i < n; i++ {
		_ = c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write(buf); err != nil {
			return fmt.Errorf("exchange %d: %w", i, err)
		}
		if _, err := io.ReadFull(c, buf); err != nil {
			return fmt.Errorf("exchange %d: %w", i, err)
		}
	}
	return nil
}

// udpRR does n exchanges; a lost datagram is retried, up to n losses.
func udpRR(c net.Conn, n int) error {
	buf := make([]byte, 100)
	lost := 0
	for i := 0; i < n; i++ {
		_ = c.SetDeadline(time.Now().Add(500 * time.Millisecond))
		if _, err := c.Write(buf); err != nil {
			return err
		}
		if _, err := c.Read(buf); err != nil {
			if lost++; lost > n {
				return fmt.Errorf("more than %d UDP losses", n)
			}
			i--
		}
	}
	return nil
}

// exchanges runs rr(c, batch) back to back in the background, calling
// each after every batch, until the returned stop (also run at the test's
// end), which says how the exchanges ended.
func exchanges(t *testing.T, c net.Conn, batch int, each func()) (stop func() error) {
	errc := make(chan error, 1)
	quit := make(chan struct{})
	go func() {
		for {
			select {
			case <-quit:
				errc <- nil
				return
			default:
			}
			if err := rr(c, batch); err != nil {
				errc <- err
				return
			}
			each()
		}
	}()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() { close(quit); err = <-errc })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func twoNodes(t *testing.T) (*lab.Lab, *lab.Pod, *lab.Pod) {
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1})
	return l, l.Nodes[0].Pods[0], l.Nodes[1].Pods[0]
}

// After the handshake, TCP and UDP between pods on different nodes are
// carried by the fast path in both directions, and so is another node's
// host talking to a pod, on the pod's node.
func TestFastPathCarriesTCPAndUDP(t *testing.T) {
	l, a, b := twoNodes(t)
	n1, n2 := l.Nodes[0], l.Nodes[1]
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9000))
	echoUDP(listenUDP(t, b.Netns, 9001))

	before1, before2 := stats(t, n1), stats(t, n2)
	if err := rr(dial(t, a.Netns, "tcp4", b.IP, 9000), 2000); err != nil {
		t.Fatal(err)
	}
	if err := udpRR(dial(t, a.Netns, "udp4", b.IP, 9001), 2000); err != nil {
		t.Fatal(err)
	}
	after1, after2 := stats(t, n1), stats(t, n2)
	// 4000 exchanges each way; the first packets of each flow learn.
	for _, c := range []struct {
		node    string
		counter string
		got     uint64
	}{
		{n1.Name, "egress_hit", after1["egress_hit"] - before1["egress_hit"]},
		{n1.Name, "ingress_hit", after1["ingress_hit"] - before1["ingress_hit"]},
		{n2.Name, "egress_hit", after2["egress_hit"] - before2["egress_hit"]},
		{n2.Name, "ingress_hit", after2["ingress_hit"] - before2["ingress_hit"]},
	} {
		if c.got < 3900 {
			t.Errorf("%s %s = %d for 4000 exchanges; want nearly all on the fast path", c.node, c.counter, c.got)
		}
	}
	for _, s := range []map[string]uint64{after1, after2} {
		if s["egress_error"]+s["ingress_error"] != 0 {
			t.Fatalf("fast-path errors: %v", s)
		}
	}

	// Another node's host to a pod: it sends from its gateway address
	// over the overlay, a source the peer may speak for like its pods',
	// so the pod's node carries it on its fast path both ways.
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9002))
	before2 = settled(t, n2)
	if err := rr(dial(t, n1.Netns, "tcp4", b.IP, 9002), 500); err != nil {
		t.Fatal(err)
	}
	after2 = stats(t, n2)
	for _, c := range []string{"ingress_hit", "egress_hit"} {
		if d := after2[c] - before2[c]; d < 450 {
			t.Errorf("node→pod traffic: %s's %s grew by %d over 500 exchanges; want nearly all", n2.Name, c, d)
		}
	}
}

// pattern is a deterministic stream of n bytes and its hash.
func pattern(n int64) (io.Reader, [32]byte) {
	h := sha256.New()
	_, _ = io.Copy(h, io.LimitReader(rand.New(rand.NewSource(42)), n))
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return io.LimitReader(rand.New(rand.NewSource(42)), n), sum
}

// sink hashes everything one connection sends and writes the hash back.
func sink(l net.Listener) {
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				h := sha256.New()
				_, _ = io.Copy(h, c)
				_, _ = c.Write(h.Sum(nil))
			}()
		}
	}()
}

// transfer sends size bytes from src to dst:port and returns an error
// unless dst hashed exactly what was sent.
func transfer(t *testing.T, srcNetns string, dst netip.Addr, port int, size int64, during func()) error {
	c := dial(t, srcNetns, "tcp4", dst, port).(*net.TCPConn)
	data, want := pattern(size)
	done := make(chan error, 1)
	go func() {
		_, err := io.Copy(c, data)
		if err == nil {
			err = c.CloseWrite()
		}
		done <- err
	}()
	if during != nil {
		during()
	}
	if err := <-done; err != nil {
		return err
	}
	_ = c.SetReadDeadline(time.Now().Add(30 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if !bytes.Equal(got, want[:]) {
		return fmt.Errorf("receiver's sha256 %x, sent %x", got, want)
	}
	return nil
}

// A 200 MB transfer arrives intact with the fast path on and off.
func TestBulkTransferIntegrity(t *testing.T) {
	l, a, b := twoNodes(t)
	sink(listenTCP(t, b.Netns, 9100))
	const size = 200 << 20
	before := stats(t, l.Nodes[0])
	if err := transfer(t, a.Netns, b.IP, 9100, size, nil); err != nil {
		t.Fatalf("fast path on: %v", err)
	}
	if hits := stats(t, l.Nodes[0])["egress_hit"] - before["egress_hit"]; hits < 100 {
		t.Fatalf("200 MB with the fast path on took only %d egress hits", hits)
	}
	for _, n := range l.Nodes {
		setFastPath(t, n, false)
	}
	before = stats(t, l.Nodes[0])
	if err := transfer(t, a.Netns, b.IP, 9100, size, nil); err != nil {
		t.Fatalf("fast path off: %v", err)
	}
	if hits := stats(t, l.Nodes[0])["egress_hit"] - before["egress_hit"]; hits != 0 {
		t.Fatalf("%d egress hits with the fast path off", hits)
	}
}

// established lists the node's ESTABLISHED TCP conntrack entries to ip:port.
func established(t *testing.T, n *lab.Node, ip netip.Addr, port int) string {
	t.Helper()
	return strings.Join(conntrackTo(t, n, ip, port, "--state", "ESTABLISHED"), "\n")
}

// conntrackTo lists node n's conntrack entries of TCP connections to
// ip:port (filtered further by extra conntrack flags), one line each.
func conntrackTo(t *testing.T, n *lab.Node, ip netip.Addr, port int, extra ...string) []string {
	t.Helper()
	var lines []string
	for _, line := range strings.Split(conntrackTCP(t, n, "-L", ip, port, extra...), "\n") {
		if strings.HasPrefix(line, "tcp") {
			lines = append(lines, line)
		}
	}
	return lines
}

// dropConntrack deletes a node's conntrack entries of TCP connections to
// ip:port.
func dropConntrack(t *testing.T, n *lab.Node, ip netip.Addr, port int) {
	t.Helper()
	conntrackTCP(t, n, "-D", ip, port)
}

// conntrackTCP runs conntrack's command op (-L, -D) on a node's entries of
// TCP connections to ip:port, returning its output.
func conntrackTCP(t *testing.T, n *lab.Node, op string, ip netip.Addr, port int, extra ...string) string {
	t.Helper()
	args := append([]string{"netns", "exec", n.Netns, "conntrack", op, "-p", "tcp", "--orig-dst", ip.String(), "--dport", fmt.Sprint(port)}, extra...)
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil && !strings.Contains(string(out), "0 flow entries") {
		t.Fatalf("%s: conntrack %s: %v: %s", n.Name, op, err, out)
	}
	return string(out)
}

// With connection setup on the slow path, FIN and RST take it too, so
// conntrack on both nodes sees a closed connection close. (A connection
// the fast path opens conntrack never sees: TestConnectionSetup.)
func TestClosedConnectionLeavesNoEstablishedConntrack(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1, AgentArgs: []string{"--fast-path-connection-setup=false"}})
	a, b := l.Nodes[0].Pods[0], l.Nodes[1].Pods[0]
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9200))
	c := dial(t, a.Netns, "tcp4", b.IP, 9200)
	if err := rr(c, 500); err != nil {
		t.Fatal(err)
	}
	for _, n := range l.Nodes {
		if established(t, n, b.IP, 9200) == "" {
			t.Fatalf("%s: no ESTABLISHED entry while the connection is open (the test would prove nothing)", n.Name)
		}
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for _, n := range l.Nodes {
		for e := established(t, n, b.IP, 9200); e != ""; e = established(t, n, b.IP, 9200) {
			if time.Now().After(deadline) {
				t.Fatalf("%s still has an ESTABLISHED entry after close:\n%s", n.Name, e)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// A node with the fast path off and one with it on talk both ways, and
// the one that is on never fast-paths to the one that is off.
func TestMixedCluster(t *testing.T) {
	l, a, b := twoNodes(t)
	n1, n2 := l.Nodes[0], l.Nodes[1]
	setFastPath(t, n2, false)
	waitPeerFlag(t, n1, n2.Name, false)
	bypasstest.ServeEcho(listenTCP(t, a.Netns, 9300))
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9300))
	echoUDP(listenUDP(t, a.Netns, 9301))
	echoUDP(listenUDP(t, b.Netns, 9301))
	before1, before2 := stats(t, n1), stats(t, n2)
	for _, pair := range [][2]*lab.Pod{{a, b}, {b, a}} {
		if err := rr(dial(t, pair[0].Netns, "tcp4", pair[1].IP, 9300), 300); err != nil {
			t.Fatalf("%s → %s TCP: %v", pair[0].Name, pair[1].Name, err)
		}
		if err := udpRR(dial(t, pair[0].Netns, "udp4", pair[1].IP, 9301), 300); err != nil {
			t.Fatalf("%s → %s UDP: %v", pair[0].Name, pair[1].Name, err)
		}
	}
	after1, after2 := stats(t, n1), stats(t, n2)
	if after1["egress_hit"] != before1["egress_hit"] || after1["ingress_hit"] != before1["ingress_hit"] {
		t.Fatal("the fast-path node used the fast path towards a slow-path node")
	}
	if after1["egress_miss_no_peer"]-before1["egress_miss_no_peer"] < 600 {
		t.Fatal("the fast-path node did not see the slow-path node's pods as outside the fast path")
	}
	if after2["egress_hit"] != before2["egress_hit"] {
		t.Fatal("the node with the fast path off used it")
	}
}

func waitPeerFlag(t *testing.T, n *lab.Node, peer string, fast bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := agent(t, n).ListPeers(context.Background(), &apiv1.ListPeersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range resp.Peers {
			if p.NodeName == peer && p.FastPath == fast {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never saw %s with fast path %v", n.Name, peer, fast)
		}
	}
}

// An agent restart during a running TCP stream loses no byte and resets
// nothing, and the fast path still hits afterwards.
func TestAgentRestartDuringStream(t *testing.T) {
	l, a, b := twoNodes(t)
	n1 := l.Nodes[0]
	sink(listenTCP(t, b.Netns, 9400))
	err := transfer(t, a.Netns, b.IP, 9400, 300<<20, func() {
		time.Sleep(200 * time.Millisecond)
		n1.Agent.Stop()
		if err := l.StartAgent(n1); err != nil {
			t.Error(err)
		}
		if err := l.WaitReady(context.Background(), n1); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatalf("stream across the restart: %v", err)
	}
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9401))
	before := stats(t, n1)
	if err := rr(dial(t, a.Netns, "tcp4", b.IP, 9401), 500); err != nil {
		t.Fatal(err)
	}
	if hits := stats(t, n1)["egress_hit"] - before["egress_hit"]; hits < 450 {
		t.Fatalf("after the restart only %d of 500 exchanges hit the fast path", hits)
	}
}

// Turning the fast path off and on under a running flow keeps the flow.
func TestToggleMidFlow(t *testing.T) {
	l, a, b := twoNodes(t)
	n1 := l.Nodes[0]
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9500))
	c := dial(t, a.Netns, "tcp4", b.IP, 9500)
	var done atomic.Int64
	stop := exchanges(t, c, 10, func() { done.Add(10) })
	step := func(on bool) {
		mark := done.Load()
		setFastPath(t, n1, on)
		for deadline := time.Now().Add(5 * time.Second); done.Load() < mark+200; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("flow stalled after switching the fast path %v", on)
			}
		}
	}
	step(false)
	// Off, nothing marks the slow path's packets and nothing learns.
	if r := markRules(t, n1); r != 0 {
		t.Errorf("%d ESTABLISHED mark rules with the fast path off, want none", r)
	}
	learned := learnCounters(stats(t, n1))
	step(false) // 200 more exchanges, off
	if got := learnCounters(stats(t, n1)); got != learned {
		t.Errorf("the learning programs ran with the fast path off: %d → %d packets", learned, got)
	}
	before := stats(t, n1)
	step(true)
	if r := markRules(t, n1); r != 2 {
		t.Errorf("%d ESTABLISHED mark rules with the fast path on, want 2", r)
	}
	time.Sleep(200 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatalf("flow broke: %v", err)
	}
	if hits := stats(t, n1)["egress_hit"] - before["egress_hit"]; hits == 0 {
		t.Fatal("the flow did not return to the fast path after switching it back on")
	}
}

// markRules counts the rules of ONC's ESTABLISHED-mark chain on node n.
func markRules(t *testing.T, n *lab.Node) int {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", n.Netns, "iptables", "-t", "mangle", "-S", "ONC-MARK").CombinedOutput()
	if err != nil {
		t.Fatalf("iptables -t mangle -S ONC-MARK: %v: %s", err, out)
	}
	return strings.Count(string(out), "-A ONC-MARK")
}

// learnCounters sums every packet the learning programs looked at.
func learnCounters(s map[string]uint64) uint64 {
	return s["learn_egress"] + s["learn_ingress"] + s["learn_known"] + s["learn_paused"]
}

// countingEcho echoes UDP and counts what it received.
func countingEcho(c net.PacketConn) *atomic.Int64 {
	var n atomic.Int64
	go lab.EchoUDP(c, &n)
	return &n
}

// A pod IP that moves to another node (its node went, the CIDR was given
// to a new node) is never delivered to the old location, even from a
// socket whose flow the fast path had cached; the new pod is reachable.
// In both families, over both underlays: in a dual-stack lab the pod's
// IPv6 address moves with its node's IPv6 block (IPv4 tunnels), and in
// an IPv6 lab the fast path's IPv6 endpoint maps are the ones to heed.
func TestPodIPReuseOnAnotherNode(t *testing.T) {
	t.Run("dual", func(t *testing.T) { podIPReuseOnAnotherNode(t, lab.IPFamilyDual) })
	t.Run("ipv6", func(t *testing.T) { podIPReuseOnAnotherNode(t, lab.IPFamilyIPv6) })
}

func podIPReuseOnAnotherNode(t *testing.T, labFamily string) {
	ctx := context.Background()
	l := labtest.Lab(t, lab.Options{Nodes: 3, PodsPerNode: 1, NodeTimeout: 2 * time.Second, IPFamily: labFamily})
	n1, n2 := l.Nodes[0], l.Nodes[1]
	a, old := n1.Pods[0], n2.Pods[0]
	// One flow per family, each to the old pod's address of that family.
	families := []struct {
		name, udp, hits string
		addr            func(*lab.Pod) netip.Addr
	}{
		{"IPv4", "udp4", "egress_hit", func(p *lab.Pod) netip.Addr { return p.IP }},
		{"IPv6", "udp6", "egress6_hit", func(p *lab.Pod) netip.Addr { return p.IPv6 }},
	}
	if labFamily == lab.IPFamilyIPv6 {
		families = families[1:]
	}
	oldHits := map[string]*atomic.Int64{}
	cached := map[string]net.Conn{}
	for _, f := range families {
		oldHits[f.name] = countingEcho(listenPacketOn(t, old.Netns, f.udp, 9600))
		cached[f.name] = dial(t, a.Netns, f.udp, f.addr(old), 9600)
		before := stats(t, n1)
		if err := udpRR(cached[f.name], 200); err != nil {
			t.Fatal(err)
		}
		if stats(t, n1)[f.hits]-before[f.hits] < 150 {
			t.Fatalf("the %s flow to the old pod was not on the fast path (the test would prove nothing)", f.name)
		}
	}

	// The old node's agent stops; its pods and kernel state stay, so a
	// packet sent to the old location would still be answered there.
	n2.Agent.Stop()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		resp, err := agent(t, n1).ListPeers(ctx, &apiv1.ListPeersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		gone := true
		for _, p := range resp.Peers {
			gone = gone && p.NodeName != n2.Name
		}
		if gone {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never removed", n2.Name)
		}
	}
	n4, err := l.AddNode(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WaitReady(ctx, n4); err != nil {
		t.Fatal(err)
	}
	moved, err := l.AddPod(ctx, n4)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.addr(moved) != f.addr(old) {
			t.Fatalf("the new pod got %s, not the old pod's %s: the test would prove nothing", f.addr(moved), f.addr(old))
		}
	}
	for _, f := range families {
		newHits := countingEcho(listenPacketOn(t, moved.Netns, f.udp, 9600))
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			if waitErr := udpRR(dial(t, a.Netns, f.udp, f.addr(moved), 9600), 1); waitErr == nil {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("%s: new location never reachable: %v", f.name, waitErr)
			}
		}
		oldHits[f.name].Store(0)
		if err := udpRR(cached[f.name], 200); err != nil { // the socket of the cached flow
			t.Fatalf("%s: cached flow after the move: %v", f.name, err)
		}
		if err := udpRR(dial(t, a.Netns, f.udp, f.addr(moved), 9600), 200); err != nil {
			t.Fatalf("%s: new flow after the move: %v", f.name, err)
		}
		if got := oldHits[f.name].Load(); got != 0 {
			t.Fatalf("%s: %d packets reached the old location", f.name, got)
		}
		if got := newHits.Load(); got < 400 {
			t.Fatalf("%s: the new location got %d of 400 packets", f.name, got)
		}
	}
}

// A peer node's uplink MAC changes under a flow the fast path carries (a
// new NIC, a VM moved): the learned header froze the old MAC, so the
// sender's agent evicts it and the flow relearns through the slow path
// within a second instead of being black-holed, then hits again.
func TestUnderlayMACChange(t *testing.T) {
	l, a, b := twoNodes(t)
	n1, n2 := l.Nodes[0], l.Nodes[1]
	bypasstest.ServeEcho(listenTCP(t, b.Netns, 9700))
	c := dial(t, a.Netns, "tcp4", b.IP, 9700)
	if err := rr(c, 100); err != nil {
		t.Fatal(err)
	}
	header := func() *apiv1.EncapEntry {
		t.Helper()
		resp, err := agent(t, n1).ListCache(context.Background(), &apiv1.ListCacheRequest{Table: "egress"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range resp.Encap {
			if e.NodeIp == n2.IP.String() {
				return e
			}
		}
		return nil
	}
	h := header()
	if h == nil {
		t.Fatalf("%s learned no header for %s", n1.Name, n2.Name)
	}
	oldMAC := h.OuterDstMac

	// Exchanges run back to back; the longest pause between two is the
	// outage the change caused.
	var (
		mu       sync.Mutex
		last     = time.Now()
		longest  time.Duration
		finished atomic.Int64
	)
	stop := exchanges(t, c, 1, func() {
		mu.Lock()
		longest, last = max(longest, time.Since(last)), time.Now()
		mu.Unlock()
		finished.Add(1)
	})
	time.Sleep(100 * time.Millisecond)
	mu.Lock()
	longest = 0
	mu.Unlock()
	const newMAC = "02:00:00:00:77:02"
	// The switch then drops frames to the old MAC, as a real one does once
	// no port has it (a veth would take them, and so hide a stale header).
	blackHole := fmt.Sprintf("add table bridge onctest\nadd chain bridge onctest blackhole { type filter hook forward priority 0 ; }\n"+
		"add rule bridge onctest blackhole ether daddr %s drop\n", oldMAC)
	nft := exec.Command("ip", "netns", "exec", l.UnderlayNetns(), "nft", "-f", "-")
	nft.Stdin = strings.NewReader(blackHole)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("dropping frames to the old MAC on the underlay: %v: %s", err, out)
	}
	if out, err := exec.Command("ip", "-n", n2.Netns, "link", "set", "eth0", "address", newMAC).CombinedOutput(); err != nil {
		t.Fatalf("changing %s's uplink MAC: %v: %s", n2.Name, err, out)
	}
	changed := finished.Load()
	for deadline := time.Now().Add(5 * time.Second); finished.Load() < changed+300; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the flow stalled after %s's uplink MAC changed (%d exchanges since)", n2.Name, finished.Load()-changed)
		}
	}
	before := stats(t, n1)
	time.Sleep(200 * time.Millisecond)
	if err := stop(); err != nil {
		t.Fatalf("flow broke: %v", err)
	}
	mu.Lock()
	outage := longest
	mu.Unlock()
	if outage > time.Second {
		t.Errorf("the flow paused %v after the MAC change; want under 1 s", outage)
	}
	if h = header(); h == nil || h.OuterDstMac != newMAC {
		t.Errorf("%s's header for %s after the change: %+v; want outer destination %s", n1.Name, n2.Name, h, newMAC)
	}
	if hits := stats(t, n1)["egress_hit"] - before["egress_hit"]; hits == 0 {
		t.Error("the flow did not return to the fast path after the change")
	}
	// n1's agent recorded that the flow left the fast path, and why.
	local := netip.MustParseAddrPort(c.LocalAddr().String())
	evicts := onctlFlowRecords(t, l, n1, "--event", "evict")
	if !slices.ContainsFunc(evicts, func(r *apiv1.FlowRecord) bool {
		return r.Source.GetPort() == uint32(local.Port()) && strings.HasPrefix(r.Reason, "the underlay changed")
	}) {
		t.Errorf("%s's evict records %v: none of the flow from port %d saying the underlay changed", n1.Name, evicts, local.Port())
	}
}
