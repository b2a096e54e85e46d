//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The intra-node bypass (docs/bypass.md) in the policy lab: the truth
// table with it on (TestPolicy's TruthTable/BypassOn, checked here by
// checkBypassed), strict revocation of a bypassed connection, and a
// bypassed connection in onctl and across an agent restart; and in a
// dual-stack lab, IPv6 connections (TestBypassIPv6).

// setBypass switches every node's bypass at runtime.
func (c *policyCluster) setBypass(t *testing.T, mode string) {
	t.Helper()
	for _, n := range c.l.Nodes {
		resp, err := agent(t, n).SetBypass(context.Background(), &apiv1.SetBypassRequest{Mode: mode})
		if err != nil {
			t.Fatalf("%s: set bypass %s: %v", n.Name, mode, err)
		}
		if resp.State.GetMode() != mode {
			t.Fatalf("%s: bypass is %q after setting it %s", n.Name, resp.State.GetMode(), mode)
		}
	}
}

func listBypass(t *testing.T, n *lab.Node) *apiv1.ListBypassResponse {
	t.Helper()
	resp, err := agent(t, n).ListBypass(context.Background(), &apiv1.ListBypassRequest{})
	if err != nil {
		t.Fatalf("%s: list bypass: %v", n.Name, err)
	}
	return resp
}

// bypassCounter reads one bypass counter on every node.
func (c *policyCluster) bypassCounter(t *testing.T, name string) map[*lab.Node]uint64 {
	t.Helper()
	out := map[*lab.Node]uint64{}
	for _, n := range c.l.Nodes {
		found := false
		for _, ctr := range listBypass(t, n).Counters {
			if ctr.Name == name {
				out[n], found = ctr.Value, true
			}
		}
		if !found {
			t.Fatalf("%s: no bypass counter %s", n.Name, name)
		}
	}
	return out
}

// checkBypassed: in one probe round, each node recorded exactly both ends
// of every same-node TCP probe that got through, and nothing else: a
// connection the policy denies never reaches ESTABLISHED, so never enters
// the map. It returns how many sockets were to be recorded.
func (c *policyCluster) checkBypassed(t *testing.T, s policyStep, cells []cell, got, again map[cell]outcome, before map[*lab.Node]uint64) int {
	t.Helper()
	want := map[*lab.Node]uint64{}
	total := 0
	for _, ce := range cells {
		if ce.k.proto != corev1.ProtocolTCP || ce.src == ce.dst || ce.src.node != ce.dst.node {
			continue
		}
		established := got[ce].err == nil
		if r, ok := again[ce]; ok && r.err == nil {
			established = true
		}
		if established {
			want[c.node(ce.src)] += 2
			total += 2
		}
	}
	after := c.bypassCounter(t, "recorded")
	for _, n := range c.l.Nodes {
		if d := after[n] - before[n]; d != want[n] {
			t.Errorf("step %q: %s recorded %d sockets in the bypass map, want %d (both ends of each same-node TCP probe that got through)",
				s.name, n.Name, d, want[n])
		}
	}
	return total
}

// bypassConn finds the map's entry for the connection p runs.
func bypassConn(t *testing.T, n *lab.Node, p *pinger) *apiv1.BypassConn {
	t.Helper()
	return bypassEntry(t, n, p.conn)
}

// bypassEntry finds the map's entry for the connection whose client end
// is c.
func bypassEntry(t *testing.T, n *lab.Node, c net.Conn) *apiv1.BypassConn {
	t.Helper()
	client := c.LocalAddr().String()
	for _, bc := range listBypass(t, n).Conns {
		if bc.Client == client {
			return bc
		}
	}
	return nil
}

// strictRevocationBypassed: a policy that denies a bypassed same-node
// connection ends it within 1 s of the agents applying it.
func (c *policyCluster) strictRevocationBypassed(t *testing.T) {
	a, b := c.pod("x/a"), c.pod("x/c") // both on node 1
	c.setBypass(t, "on")
	defer c.setBypass(t, "off")
	n := c.node(a)
	c.revokeRunning(t, a, b, 92, func(p *pinger) {
		if bc := bypassConn(t, n, p); bc == nil || !bc.Paired {
			t.Fatalf("the connection is not bypassed (map entry %v): the test would prove nothing", bc)
		}
		before := c.bypassCounter(t, "redirected_msgs")[n]
		p.waitEchoes(t, 100, 5*time.Second)
		if got := c.bypassCounter(t, "redirected_msgs")[n] - before; got < 100 {
			t.Fatalf("100 echoes took only %d redirected messages", got)
		}
	}, func(p *pinger) {
		// Its files are still open: only an aborted socket leaves the list.
		if bc := bypassConn(t, n, p); bc != nil {
			t.Errorf("the revoked connection is still bypassed: %v", bc)
		}
		if err := p.failed(); err == nil {
			t.Error("the revoked connection's calls did not fail")
		}
	})
}

// bypassed: a bypassed connection shows in onctl bypass with both pods
// named, and in onctl flows as paired (one record) and, once the bypass is
// switched off, as sent by the stack; it lives through an agent restart
// without losing an echo, and is gone from the map once closed.
func (c *policyCluster) bypassed(t *testing.T) {
	a, b := c.pod("x/a"), c.pod("y/b") // both on node 1
	n := c.node(a)
	c.set(t, nil)
	c.setBypass(t, "on")
	defer c.setBypass(t, "off")
	bypasstest.ServeEcho(listenTCP(t, b.lp.Netns, 93))
	p := startPinger(t, a, b.lp.IP, 93)
	p.waitEchoes(t, 20, 5*time.Second)
	bc := bypassConn(t, n, p)
	if bc == nil || !bc.Paired || bc.ClientPod != a.key() || bc.ServerPod != b.key() {
		t.Fatalf("onctl's view of the connection: %v; want paired, %s → %s", bc, a.key(), b.key())
	}
	out, err := exec.Command(c.l.BinDir+"/onctl", "--socket", n.AgentSocket(), "bypass").CombinedOutput()
	if err != nil {
		t.Fatalf("onctl bypass: %v\n%s", err, out)
	}
	for _, want := range []string{a.key(), b.key(), bc.Client, bc.Server, "redirected"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("onctl bypass lacks %q:\n%s", want, out)
		}
	}
	client := netip.MustParseAddrPort(bc.Client)
	end := func(p *tpod, at netip.AddrPort) *apiv1.FlowEndpoint {
		return &apiv1.FlowEndpoint{Kind: "pod", Namespace: p.ns, Name: p.name, Node: n.Name, Ip: at.Addr().String(), Port: uint32(at.Port())}
	}
	ofConn := func(r *apiv1.FlowRecord) bool { // its client to server direction
		return r.Source.GetPort() == uint32(client.Port()) && r.Destination.GetPort() == 93
	}
	paired := waitRecord(t, c.l, n, "pair", ofConn)
	sameRecord(t, paired, &apiv1.FlowRecord{Event: "pair", Verdict: "bypassed", Path: "bypass", Protocol: "TCP",
		Source: end(a, client), Destination: end(b, netip.AddrPortFrom(b.lp.IP, 93))})
	if recs := onctlFlowRecords(t, c.l, n, "--event", "pair"); len(slices.DeleteFunc(recs, func(r *apiv1.FlowRecord) bool { return !ofConn(r) })) != 1 {
		t.Errorf("pair records of the connection: %v, want one", recs)
	}

	// A large transfer arrives intact, and through the bypass.
	const size = 64 << 20
	sent := c.bypassCounter(t, "redirected_bytes")[n]
	sink(listenTCP(t, b.lp.Netns, 94))
	if err := transfer(t, a.lp.Netns, b.lp.IP, 94, size, nil); err != nil {
		t.Fatal(err)
	}
	if got := c.bypassCounter(t, "redirected_bytes")[n] - sent; got < size {
		t.Errorf("the bypass carried %d of the %d bytes transferred", got, size)
	}

	// The agent restarts (keeping the bypass on) while the pinger runs.
	c.restartAgent(t, n, nil, "--bypass=on")
	p.waitEchoes(t, 100, 10*time.Second)
	if err := p.failed(); err != nil {
		t.Fatalf("the connection broke across the agent restart: %v", err)
	}
	if p.maxGap.Load() > int64(time.Second) {
		t.Errorf("echoes stalled %v across the restart", time.Duration(p.maxGap.Load()))
	}
	if bc := bypassConn(t, n, p); bc == nil || !bc.Paired {
		t.Fatalf("after the restart the connection is not in the map: %v", bc)
	}
	before := c.bypassCounter(t, "redirected_msgs")[n]
	p.waitEchoes(t, 50, 5*time.Second)
	if c.bypassCounter(t, "redirected_msgs")[n] == before {
		t.Error("after the restart the connection's messages are no longer redirected")
	}

	// Switched off mid-stream with onctl: the connection goes on, by the
	// stack from its next message.
	if out, err := exec.Command(c.l.BinDir+"/onctl", "--socket", n.AgentSocket(), "bypass", "off").CombinedOutput(); err != nil {
		t.Fatalf("onctl bypass off: %v\n%s", err, out)
	}
	redirected, stack := c.bypassCounter(t, "redirected_msgs")[n], c.bypassCounter(t, "stack_msgs")[n]
	p.waitEchoes(t, 50, 5*time.Second)
	if err := p.failed(); err != nil {
		t.Fatalf("the connection broke when the bypass went off: %v", err)
	}
	if c.bypassCounter(t, "redirected_msgs")[n] != redirected || c.bypassCounter(t, "stack_msgs")[n] < stack+100 {
		t.Error("after onctl bypass off the connection's messages are still redirected, or not sent by the stack")
	}
	back := waitRecord(t, c.l, n, "fallback", ofConn)
	sameRecord(t, back, &apiv1.FlowRecord{Event: "fallback", Verdict: "to-stack", Path: "bypass", Protocol: "TCP", Reason: "fallback_off",
		Source: end(a, client), Destination: end(b, netip.AddrPortFrom(b.lp.IP, 93))})

	p.stop()
	deadline := time.Now().Add(5 * time.Second)
	for bypassConn(t, n, p) != nil {
		if time.Now().After(deadline) {
			t.Fatal("the closed connection is still in the map")
		}
		time.Sleep(100 * time.Millisecond)
	}
	// The restarted agent runs with --bypass=on; the others were switched
	// at runtime: make every node's setting what the other subtests expect.
	c.restartAgent(t, n, nil)
}

// bypassSameAsStack: through real agents, half-close and a peer dying
// mid-stream end the same with the bypass off and on, and 100 connections
// open at once all echo intact through it.
func (c *policyCluster) bypassSameAsStack(t *testing.T) {
	a, b := c.pod("x/a"), c.pod("x/c") // both on node 1
	n := c.node(a)
	c.set(t, nil)
	defer c.setBypass(t, "off")
	l := listenTCP(t, b.lp.Netns, 0)
	port := l.Addr().(*net.TCPAddr).Port
	pair := func() (*net.TCPConn, *net.TCPConn) {
		cl := dial(t, a.lp.Netns, "tcp4", b.lp.IP, port).(*net.TCPConn)
		s, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return cl, s.(*net.TCPConn)
	}
	for _, sc := range []struct {
		name string
		run  func(testing.TB, bypasstest.Pair) bypasstest.Outcome
	}{{"half-close", bypasstest.HalfClose}, {"peer dies mid-stream", bypasstest.PeerDies}} {
		c.setBypass(t, "off")
		off := sc.run(t, pair)
		c.setBypass(t, "on")
		// A connection whose first message goes before its peer's socket is
		// recorded sends by the stack for good (fallback_miss): that run
		// compares nothing, so it is tried again, up to three times; every
		// run's outcome must match.
		redirected := false
		for try := 0; try < 3 && !redirected; try++ {
			before := c.bypassCounter(t, "redirected_msgs")[n]
			on := sc.run(t, pair)
			redirected = c.bypassCounter(t, "redirected_msgs")[n] != before
			if fmt.Sprint(off) != fmt.Sprint(on) {
				t.Errorf("%s: outcomes differ:\n off: %v\n on:  %v", sc.name, off, on)
			}
		}
		if !redirected {
			t.Errorf("%s: nothing redirected with the bypass on in 3 runs (fallback_miss %d, skip_paused %d): the comparison proves nothing",
				sc.name, c.bypassCounter(t, "fallback_miss")[n], c.bypassCounter(t, "skip_paused")[n])
		}
	}

	echo := listenTCP(t, b.lp.Netns, 0)
	bypasstest.ServeEcho(echo)
	const conns = 100
	before := c.bypassCounter(t, "recorded")[n]
	bypasstest.EchoMany(t, conns, func() *net.TCPConn {
		return dial(t, a.lp.Netns, "tcp4", b.lp.IP, echo.Addr().(*net.TCPAddr).Port).(*net.TCPConn)
	})
	if got := c.bypassCounter(t, "recorded")[n] - before; got < 2*conns {
		t.Errorf("%d sockets recorded for %d connections, want both ends of each", got, conns)
	}
}

// TestBypassIPv6: in a dual-stack lab, two pods of one node talking TCP
// over IPv6 with the bypass on are carried by it: onctl bypass lists the
// connection by the pods' IPv6 addresses and names, and the bytes of its
// exchanges are all redirected. A NetworkPolicy that lets the client in
// over IPv4 only ends the bypassed IPv6 connection (its bytes never pass
// netfilter: the agent aborts its sockets) and leaves a bypassed IPv4 one
// between the same pods running.
func TestBypassIPv6(t *testing.T) {
	l := labtest.Lab(t, lab.Options{Nodes: 1, IPFamily: lab.IPFamilyDual, Datastore: "kubernetes", AgentArgs: []string{"--bypass=on"}})
	ctx := context.Background()
	n, api := l.Nodes[0], agent(t, l.Nodes[0])
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	const ns, srvPort = "bypass6", 9400
	client, server := clientServer(t, l, n, ns)
	if !client.IPv6.IsValid() || !server.IPv6.IsValid() {
		t.Fatalf("pods without IPv6 addresses: %s, %s", client.IPv6, server.IPv6)
	}
	bypasstest.ServeEcho(listenOn(t, server.Netns, "tcp", srvPort)) // both families

	c6 := dial(t, client.Netns, "tcp6", server.IPv6, srvPort)
	c4 := dial(t, client.Netns, "tcp4", server.IP, srvPort)
	for _, c := range []net.Conn{c6, c4} {
		if err := rr(c, 1); err != nil {
			t.Fatal(err)
		}
	}
	bc := bypassEntry(t, n, c6)
	wantServer := netip.AddrPortFrom(server.IPv6, srvPort).String()
	if bc == nil || !bc.Paired || bc.Server != wantServer || bc.ClientPod != client.Key() || bc.ServerPod != server.Key() {
		t.Fatalf("onctl's view of the IPv6 connection: %v; want paired, %s → %s (%s)", bc, client.Key(), server.Key(), wantServer)
	}
	if bc4 := bypassEntry(t, n, c4); bc4 == nil || !bc4.Paired {
		t.Fatalf("the IPv4 connection between the same pods is not bypassed: %v", bc4)
	}
	out, err := exec.Command(l.BinDir+"/onctl", "--socket", n.AgentSocket(), "bypass").CombinedOutput()
	if err != nil {
		t.Fatalf("onctl bypass: %v\n%s", err, out)
	}
	for _, want := range []string{client.Key(), server.Key(), bc.Client, bc.Server} {
		if !strings.Contains(string(out), want) {
			t.Errorf("onctl bypass lacks %q:\n%s", want, out)
		}
	}
	counter := func(name string) uint64 {
		t.Helper()
		for _, ctr := range listBypass(t, n).Counters {
			if ctr.Name == name {
				return ctr.Value
			}
		}
		t.Fatalf("no bypass counter %s", name)
		return 0
	}
	const exchanges = 200
	before := counter("redirected_bytes")
	if err := rr(c6, exchanges); err != nil {
		t.Fatal(err)
	}
	if got := counter("redirected_bytes") - before; got < 2*exchanges*100 {
		t.Fatalf("the bypass carried %d of the %d bytes exchanged over IPv6", got, 2*exchanges*100)
	}

	// The server now lets the client in over IPv4 alone.
	pol := netpol(ns, "server", sel("app", "server"), ingressOnly,
		ingressRule(from(networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: client.IP.String() + "/32"}}),
			port(corev1.ProtocolTCP, srvPort)), nil)
	if _, err := kube.NetworkingV1().NetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the server isolated for ingress", 15*time.Second, func() bool {
		resp, err := api.ListPolicy(ctx, &apiv1.ListPolicyRequest{Pod: server.Key()})
		return err == nil && len(resp.Pods) == 1 && resp.Pods[0].Ingress.GetIsolated()
	})
	var ended error
	testutil.WaitFor(t, "the denied bypassed IPv6 connection ended", 2*time.Second, func() bool {
		ended = rr(c6, 1)
		return ended != nil
	})
	if errors.Is(ended, os.ErrDeadlineExceeded) {
		t.Fatalf("the denied IPv6 connection stalled (%v) instead of being aborted", ended)
	}
	if bc := bypassEntry(t, n, c6); bc != nil {
		t.Errorf("the ended IPv6 connection is still listed: %v", bc)
	}
	if err := rr(c4, 10); err != nil {
		t.Fatalf("the allowed IPv4 connection broke: %v", err)
	}
	if bc4 := bypassEntry(t, n, c4); bc4 == nil || !bc4.Paired {
		t.Errorf("the allowed IPv4 connection is no longer bypassed: %v", bc4)
	}
	if _, err := lab.Probe(client.Netns, "tcp", server.IPv6, srvPort, time.Second); err == nil {
		t.Error("a new IPv6 connection got through the policy")
	}
}

// clientServer adds a namespace ns and, on node n, its pods "client" and
// "server" (labelled app=server).
func clientServer(t *testing.T, l *lab.Lab, n *lab.Node, ns string) (client, server *lab.Pod) {
	t.Helper()
	ctx := context.Background()
	if err := l.SetNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	client, err := l.AddPodSpec(ctx, n, lab.PodSpec{Namespace: ns, Name: "client"})
	if err != nil {
		t.Fatal(err)
	}
	server, err = l.AddPodSpec(ctx, n, lab.PodSpec{Namespace: ns, Name: "server", Labels: map[string]string{"app": "server"}})
	if err != nil {
		t.Fatal(err)
	}
	return client, server
}
