//go:build e2e

package e2e

// The overlay guard in the lab: VXLAN frames crafted in user space and sent
// with an ordinary UDP socket, as any pod or host could, from a pod, from a
// host on the underlay that is no node, and from a real peer speaking for
// another node's address. None may be delivered, each is counted by its
// reason; a real peer speaking for its own pod still is.

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	networkingv1 "k8s.io/api/networking/v1"
)

// The lab's VXLAN port and VNI (the agent's defaults).
const (
	vxlanPort = 4789
	vxlanVNI  = 1
	// injectPort is where the target pod listens for injected datagrams.
	injectPort = 7999
)

// vxlanFrame is the payload of a VXLAN datagram as a peer's kernel would
// build it: the VXLAN header, then an Ethernet frame to the receiving
// node's VTEP MAC carrying a UDP datagram from src to dst:injectPort, in
// IPv4 or IPv6 (src's family).
func vxlanFrame(vtep net.HardwareAddr, src, dst netip.Addr, payload string) []byte {
	ipLen := 20
	if src.Is6() {
		ipLen = 40
	}
	b := make([]byte, 8+14+ipLen+8+len(payload))
	b[0] = 0x08 // a VNI is present
	binary.BigEndian.PutUint32(b[4:], vxlanVNI<<8)
	eth := b[8:]
	copy(eth[0:6], vtep)
	copy(eth[6:12], net.HardwareAddr{0x02, 0xbe, 0xef, 0, 0, 1})
	ip, udp := eth[14:14+ipLen], eth[14+ipLen:]
	binary.BigEndian.PutUint16(udp[0:], 40000)
	binary.BigEndian.PutUint16(udp[2:], injectPort)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	copy(udp[8:], payload)
	if src.Is6() {
		binary.BigEndian.PutUint16(eth[12:], 0x86dd)
		ip[0], ip[6], ip[7] = 0x60, 17, 64
		binary.BigEndian.PutUint16(ip[4:], uint16(8+len(payload)))
		copy(ip[8:24], src.AsSlice())
		copy(ip[24:40], dst.AsSlice())
		// IPv6 requires the UDP checksum: over the pseudo-header (the
		// addresses, length and next header) and the datagram.
		pseudo := slices.Concat(ip[8:40], []byte{0, 0, byte(len(udp) >> 8), byte(len(udp)), 0, 0, 0, 17}, udp)
		binary.BigEndian.PutUint16(udp[6:], checksum(pseudo))
		return b
	}
	binary.BigEndian.PutUint16(eth[12:], 0x0800)
	ip[0], ip[8], ip[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	copy(ip[12:16], src.AsSlice())
	copy(ip[16:20], dst.AsSlice())
	binary.BigEndian.PutUint16(ip[10:], checksum(ip)) // UDP checksum 0: none
	return b
}

// checksum is the Internet checksum of b.
func checksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// injector sends crafted frames to a target pod and sees which arrive.
type injector struct {
	target   *lab.Pod
	node     *lab.Node  // the target's node
	endpoint netip.Addr // its tunnel endpoint
	vtep     net.HardwareAddr
	mu       sync.Mutex
	got      map[string]bool // payloads the target received
}

// newInjector listens on injectPort in target's namespace.
func newInjector(t *testing.T, l *lab.Lab, node *lab.Node, target *lab.Pod) *injector {
	t.Helper()
	link, err := testutil.NetlinkAt(t, node.Netns).LinkByName(datapath.DeviceName)
	if err != nil {
		t.Fatal(err)
	}
	in := &injector{target: target, node: node, endpoint: l.TunnelIP(node), vtep: link.Attrs().HardwareAddr, got: map[string]bool{}}
	c := listenPacketOn(t, target.Netns, "udp", injectPort) // either family
	go func() {
		buf := make([]byte, 2048)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			in.mu.Lock()
			in.got[string(buf[:n])] = true
			in.mu.Unlock()
		}
	}()
	return in
}

// send sends a few frames (UDP may lose one) from netns, with the inner
// source src, to the VXLAN port of the target node's address to, and
// reports whether the target pod received any of them within a second.
func (in *injector) send(t *testing.T, netns string, src, to netip.Addr) bool {
	t.Helper()
	return in.sendTo(t, netns, src, netip.AddrPortFrom(to, vxlanPort))
}

// sendTo is send to any address and port.
func (in *injector) sendTo(t *testing.T, netns string, src netip.Addr, to netip.AddrPort) bool {
	t.Helper()
	payload := fmt.Sprintf("injected %s from %s %d", src, netns, time.Now().UnixNano())
	frame := vxlanFrame(in.vtep, src, in.target.IP, payload)
	return in.sendUntilArrived(t, netns, to, frame, payload)
}

// mustRun runs a command, failing the test if it fails.
func mustRun(t *testing.T, cmd []string) {
	t.Helper()
	if out, err := exec.Command(cmd[0], cmd[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%v: %v: %s", cmd, err, out)
	}
}

// secondCable joins namespace from to node's namespace with a veth pair of
// their own, /30 addresses on it, and returns node's end's address. The
// pair goes with from's namespace.
func secondCable(t *testing.T, from, node string) netip.Addr {
	t.Helper()
	nodeEnd := netip.MustParseAddr("172.31.252.2")
	for _, cmd := range [][]string{
		{"ip", "-n", from, "link", "add", "side0", "type", "veth", "peer", "name", "side1", "netns", node},
		{"ip", "-n", from, "addr", "add", "172.31.252.1/30", "dev", "side0"},
		{"ip", "-n", node, "addr", "add", nodeEnd.String() + "/30", "dev", "side1"},
		{"ip", "-n", from, "link", "set", "side0", "up"},
		{"ip", "-n", node, "link", "set", "side1", "up"},
	} {
		mustRun(t, cmd)
	}
	return nodeEnd
}

// sendPlain sends an ordinary datagram from netns to the target pod and
// reports whether it arrived within a second.
func (in *injector) sendPlain(t *testing.T, netns string) bool {
	t.Helper()
	payload := fmt.Sprintf("plain from %s %d", netns, time.Now().UnixNano())
	return in.sendUntilArrived(t, netns, netip.AddrPortFrom(in.target.IP, injectPort), []byte(payload), payload)
}

// sendUntilArrived sends msg from netns to dst every 100 ms for a second,
// or until the target received payload; it reports whether it did.
func (in *injector) sendUntilArrived(t *testing.T, netns string, dst netip.AddrPort, msg []byte, payload string) bool {
	t.Helper()
	var c net.Conn
	err := lab.InNetns(netns, func() (err error) {
		c, err = net.Dial("udp", dst.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		_, _ = c.Write(msg) // a refused send (ICMP unreachable back) is not delivered either
		in.mu.Lock()
		arrived := in.got[payload]
		in.mu.Unlock()
		if arrived {
			return true
		}
	}
	return false
}

// guardDrops reads a node's overlay guard counters by reason.
func guardDrops(t *testing.T, n *lab.Node) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for name, v := range stats(t, n) {
		if reason, ok := strings.CutPrefix(name, "overlay_drop_"); ok {
			out[reason] = v
		}
	}
	return out
}

// injection is one crafted-frame case: from a namespace, with an inner
// source, counted on a node under a reason.
type injection struct {
	name      string
	netns     string
	src       netip.Addr
	countedOn *lab.Node
	reason    string // "" for the control, which must arrive
}

// expectInjections sends every case to the target node's tunnel endpoint
// and checks what arrived and what each drop counted. The control cases go
// first: they show the frames are deliverable, so a missing one was dropped.
func expectInjections(t *testing.T, in *injector, cases []injection) {
	t.Helper()
	for _, c := range cases {
		expectInjection(t, in, c, in.endpoint, vxlanPort)
	}
}

// expectInjection sends c's frames to address to, port.
func expectInjection(t *testing.T, in *injector, c injection, to netip.Addr, port uint16) {
	t.Helper()
	var before map[string]uint64
	if c.countedOn != nil {
		before = guardDrops(t, c.countedOn)
	}
	arrived := in.sendTo(t, c.netns, c.src, netip.AddrPortFrom(to, port))
	switch {
	case c.reason == "" && !arrived:
		t.Errorf("%s: a frame a peer may send was not delivered", c.name)
	case c.reason != "" && arrived:
		t.Errorf("%s: the injected packet reached %s", c.name, in.target.IP)
	case c.reason != "":
		if after := guardDrops(t, c.countedOn); after[c.reason] <= before[c.reason] {
			t.Errorf("%s: %s counted no %s drop (before %v, after %v)", c.name, c.countedOn.Name, c.reason, before, after)
		}
	}
}

// TestOverlayGuard on the etcd datastore: three nodes with a pod each; the
// target is node 2's pod. With the fast path on and off, across the
// target's agent restart, and after node 3 leaves (an outside host that
// takes its address is refused at once).
func TestOverlayGuard(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 3, PodsPerNode: 1})
	n1, n2, n3 := l.Nodes[0], l.Nodes[1], l.Nodes[2]
	p1, p3 := n1.Pods[0], n3.Pods[0]
	in := newInjector(t, l, n2, n2.Pods[0])
	outsiderIP := netip.MustParseAddr("172.31.250.200")
	outsider, cleanup, err := l.AddOutsider(l.Prefix+"-out", outsiderIP)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cleanup)
	// The outsider also has a cable straight into node 2, whose kernel's
	// VXLAN socket listens on that address too.
	sideAddr := secondCable(t, outsider, n2.Netns)
	cases := []injection{
		{"a peer speaking for its own pod (control)", n1.Netns, p1.IP, nil, ""},
		{"a peer's host speaking for its node address (control)", n1.Netns, n1.IP, nil, ""},
		{"a pod, as its node's pod", p1.Netns, p1.IP, n1, "from_pod"},
		{"a pod, as another node's pod", p1.Netns, p3.IP, n1, "from_pod"},
		{"a host on the underlay that is no node", outsider, p1.IP, n2, "unknown_sender"},
		{"a peer speaking for another node's pod", n1.Netns, p3.IP, n2, "inner_source"},
		{"a peer speaking for the target node's own pod CIDR", n1.Netns, n2.Pods[0].IP.Next(), n2, "inner_source"},
		{"a peer speaking for an address outside the cluster", n1.Netns, netip.MustParseAddr("203.0.113.9"), n2, "inner_source"},
	}
	// A host by another interface than the uplink.
	elsewhere := injection{"a host by another interface than the uplink", outsider, p1.IP, n2, "other_interface"}
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("FastPath=%v", on), func(t *testing.T) {
			for _, n := range l.Nodes {
				setFastPath(t, n, on)
			}
			expectInjections(t, in, cases)
			expectInjection(t, in, elsewhere, sideAddr, vxlanPort)
		})
	}
	for _, n := range l.Nodes {
		setFastPath(t, n, true)
	}
	t.Run("AcrossAgentRestart", func(t *testing.T) {
		// While the agent is down, its pinned programs and map guard on.
		n2.Agent.Stop()
		if in.send(t, outsider, p1.IP, n2.IP) || in.send(t, n1.Netns, p3.IP, n2.IP) {
			t.Error("with the target's agent down, a frame the guard refuses was delivered")
		}
		if !in.send(t, n1.Netns, p1.IP, n2.IP) {
			t.Error("with the target's agent down, a peer's frame for its own pod was not delivered")
		}
		if err := l.RestartAgent(context.Background(), n2); err != nil {
			t.Fatal(err)
		}
		expectInjections(t, in, cases)
	})
	// Address translation (kube-proxy's NodePorts, externalIPs, Service
	// endpoints) may lead a datagram to a VXLAN port that the programs saw
	// going elsewhere: here a DNAT rule as a Service endpoint at a node's
	// VXLAN port would make.
	t.Run("AddressTranslation", func(t *testing.T) {
		translatedToTheVXLANPort(t, l, in, outsider, netip.MustParseAddr("172.31.253.9"))
	})
	t.Run("RemovedNodeRefusedAtOnce", func(t *testing.T) {
		ip := n3.IP
		if err := l.RemoveNode(context.Background(), n3); err != nil {
			t.Fatal(err)
		}
		waitPeerGone(t, n2, n3.Name)
		impostor, cleanup, err := l.AddOutsider(l.Prefix+"-imp", ip)
		if err != nil {
			t.Fatal(err)
		}
		defer cleanup()
		expectInjections(t, in, []injection{
			{"a peer speaking for its own pod (control)", n1.Netns, p1.IP, nil, ""},
			{"a host at a removed node's address, as its pod", impostor, p3.IP, n2, "unknown_sender"},
		})
	})
	// Everything legitimate still flows, every direction.
	allPairsPass(t, l, "with the overlay guard")
}

// translatedToTheVXLANPort: address translation (kube-proxy's NodePorts,
// externalIPs and Service endpoints) may lead a datagram to a VXLAN port
// that the programs saw going elsewhere; here a DNAT rule as a Service
// endpoint at a node's VXLAN port would make, in the underlay's family
// (iptables or ip6tables), with node 1's pod and outsider as senders to
// the target, node 2. elsewhere is an address outside the cluster that
// node 1 translates.
func translatedToTheVXLANPort(t *testing.T, l *lab.Lab, in *injector, outsider string, elsewhere netip.Addr) {
	t.Helper()
	const viaPort = 9999
	n1, p1 := l.Nodes[0], l.Nodes[0].Pods[0]
	tool := "iptables"
	if in.endpoint.Is6() {
		tool = "ip6tables"
	}
	dnat := func(netns string, match []string) {
		rule := append(append([]string{"-t", "nat", "-I", "PREROUTING"}, match...),
			"-p", "udp", "--dport", fmt.Sprint(viaPort), "-j", "DNAT", "--to-destination", netip.AddrPortFrom(in.endpoint, vxlanPort).String())
		mustRun(t, append([]string{"ip", "netns", "exec", netns, tool}, rule...))
		t.Cleanup(func() {
			rule[2] = "-D"
			mustRun(t, append([]string{"ip", "netns", "exec", netns, tool}, rule...))
		})
	}
	// A pod's datagram to an address its node translates to a peer's
	// VXLAN port would leave masqueraded as the node.
	dnat(n1.Netns, []string{"-s", p1.IP.String()})
	// An outside host's datagram to a port the target node translates
	// to its own VXLAN port would come by the uplink.
	dnat(in.node.Netns, []string{"-d", in.endpoint.String()})
	for _, c := range []struct {
		injection
		to netip.Addr
	}{
		{injection{"a pod, through its node's address translation", p1.Netns, p1.IP, n1, "forwarded"}, elsewhere},
		{injection{"a host that is no node, through the target's address translation", outsider, p1.IP, in.node, "translated"}, in.endpoint},
	} {
		expectInjection(t, in, c.injection, c.to, viaPort)
	}
}

// waitPeerGone waits until n no longer lists peer.
func waitPeerGone(t *testing.T, n *lab.Node, peer string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := agent(t, n).ListPeers(context.Background(), &apiv1.ListPeersRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(resp.Peers, func(p *apiv1.Peer) bool { return p.NodeName == peer }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still lists %s as a peer", n.Name, peer)
		}
	}
}

// overlayInjection (TestPolicy, the Kubernetes datastore): x/b, a db pod,
// admits only web pods of namespace x. A client pod on the node of the web
// pod x/a, and a pod of another namespace, whose own packets the policy
// denies, write x/a's address as the inner source of crafted frames; an
// outside host and a real peer speaking for another node's pod try too.
// None reaches x/b, with the fast path on and off; x/a's node speaking for
// x/a does.
func (c *policyCluster) overlayInjection(t *testing.T) {
	web, db, client, otherNS := c.pod("x/a"), c.pod("x/b"), c.pod("x/c"), c.pod("y/b")
	webNode, dbNode := c.node(web), c.node(db)
	c.set(t, []*networkingv1.NetworkPolicy{netpol("x", "db-from-web", sel("tier", "db"), ingressOnly,
		ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("tier", "web")})), nil)})
	defer c.set(t, nil)
	in := newInjector(t, c.l, dbNode, db.lp)
	outsider, cleanup, err := c.l.AddOutsider(c.l.Prefix+"-out", netip.MustParseAddr("172.31.250.200"))
	if err != nil {
		t.Fatal(err)
	}
	defer cleanup()
	for _, on := range []bool{true, false} {
		t.Run(fmt.Sprintf("FastPath=%v", on), func(t *testing.T) {
			c.setFastPath(t, on)
			defer c.setFastPath(t, true)
			// The policy is in force: the client's own datagrams are denied.
			if in.sendPlain(t, client.lp.Netns) {
				t.Fatal("the client's own datagram reached the db pod: the policy is not in force, the test would prove nothing")
			}
			expectInjections(t, in, []injection{
				{"the web pod's node speaking for it (control)", webNode.Netns, web.lp.IP, nil, ""},
				{"a client pod on the web pod's node, as the web pod", client.lp.Netns, web.lp.IP, webNode, "from_pod"},
				{"a pod of another namespace, as the web pod", otherNS.lp.Netns, web.lp.IP, c.node(otherNS), "from_pod"},
				{"a host on the underlay that is no node, as the web pod", outsider, web.lp.IP, dbNode, "unknown_sender"},
				{"a peer speaking for the db node's web pod", webNode.Netns, c.pod("y/a").lp.IP, dbNode, "inner_source"},
			})
		})
	}
}

// A host process on one node bound to its node address (as a hostNetwork
// agent may be, or `curl --interface`) reaches a pod on another node and
// gets its replies, both nodes filtering reverse paths strictly (kind's
// and many distributions' default): the connection arrives over the
// overlay, so its replies go back over it, not by the underlay with the
// pod's address as source, which the client's node would drop. Unbound,
// the client speaks from its node's gateway, which the overlay carries
// either way.
func TestPeerHostFromItsNodeAddress(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1})
	n0, n1 := l.Nodes[0], l.Nodes[1]
	for _, n := range l.Nodes {
		for _, conf := range []string{"all", "default", "eth0"} { // eth0: the node's uplink
			if err := lab.InNetns(n.Netns, func() error {
				return os.WriteFile("/proc/sys/net/ipv4/conf/"+conf+"/rp_filter", []byte("1"), 0o644)
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	stop, err := lab.ServeEcho([]string{n0.Pods[0].Netns}, []int{8080}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	server := netip.AddrPortFrom(n0.Pods[0].IP, 8080)
	for _, from := range []netip.Addr{{}, n1.IP} {
		var conn net.Conn
		if err := lab.InNetns(n1.Netns, func() (err error) {
			d := net.Dialer{Timeout: 3 * time.Second}
			if from.IsValid() {
				d.LocalAddr = net.TCPAddrFromAddrPort(netip.AddrPortFrom(from, 0))
			}
			conn, err = d.Dial("tcp4", server.String())
			return err
		}); err != nil {
			t.Fatalf("%s's host (from %v) to %s: %v", n1.Name, from, server, err)
		}
		err := rr(conn, 20)
		conn.Close()
		if err != nil {
			t.Fatalf("%s's host (from %v) to %s: %v", n1.Name, from, server, err)
		}
	}
}
