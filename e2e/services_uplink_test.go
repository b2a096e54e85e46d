//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// NodePorts from outside the cluster, balanced on node 0's uplink, with
// the agents replacing kube-proxy (none runs): from the lab's external
// client to node 0's NodePort, over TCP and UDP, reaching a backend on
// node 0 (which sees the client) and one on node 1 (which sees node 0:
// SNAT), replies coming from the NodePort; externalTrafficPolicy Local
// keeps to node 0's backend and the client's address; a Service without
// endpoints is refused. Every path is checked by node 0's counters.
func TestServicesFromOutside(t *testing.T) {
	ctx := context.Background()
	l, kube := serviceLab(t, lab.Options{Nodes: 2, ExternalClient: true, AgentArgs: []string{"--kube-proxy-replacement"}})
	var backends []*lab.Pod
	for i := range l.Nodes {
		p, err := l.AddPodSpec(ctx, l.Nodes[i], lab.PodSpec{Namespace: svcNS, Name: fmt.Sprintf("web-%d", i),
			Labels: map[string]string{"app": "web"}})
		if err != nil {
			t.Fatal(err)
		}
		serveWhoSaw(t, p.Netns, p.Name)
		backends = append(backends, p)
	}
	node0 := l.Nodes[0]
	tcpFront, udpFront := netip.AddrPortFrom(node0.IP, 30080), netip.AddrPortFrom(node0.IP, 30053)
	svc := nodePortService("web", 30080, 30053)
	if _, err := kube.CoreV1().Services(svcNS).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	writeEndpoints(t, kube, "web", backends, nil)
	waitFrontend(t, node0, tcpFront, "TCP", "uplink", 2)

	client := l.ExternalClient
	counters := func() map[string]uint64 { return lbCounters(t, node0) }
	// reversed counts the replies given their frontend's address, on the
	// slow path or the fast.
	reversed := func(c map[string]uint64) uint64 {
		return c["uplink_reversed"] + c["uplink_fast_reply"] + c["uplink_fast_from_remote"]
	}

	t.Run("TCPToLocalAndRemote", func(t *testing.T) {
		before := counters()
		seen := map[string]int{}
		for range 30 {
			name, saw, from, err := askTCP(client, tcpFront)
			if err != nil {
				t.Fatalf("TCP to %s from outside: %v", tcpFront, err)
			}
			if from != tcpFront.String() {
				t.Fatalf("TCP reply from %s, want %s", from, tcpFront)
			}
			seen[name]++
			// The local backend sees the client; the remote one node 0
			// (its gateway address, which the overlay carries).
			if want := lab.ExternalClientIP.String(); (name == backends[0].Name) != (saw == want) {
				t.Fatalf("%s saw the client as %s (client %s)", name, saw, want)
			}
		}
		if seen[backends[0].Name] == 0 || seen[backends[1].Name] == 0 {
			t.Fatalf("backends reached: %v; want both", seen)
		}
		after := counters()
		if d := after["uplink_new_flow"] - before["uplink_new_flow"]; d != 30 {
			t.Errorf("uplink_new_flow grew by %d, want 30", d)
		}
		// A local backend's connections open on the fast path (below),
		// their replies reversed there.
		if d := reversed(after) - reversed(before); d < 30 {
			t.Errorf("replies reversed grew by %d (uplink_reversed, uplink_fast_reply, uplink_fast_from_remote), want ≥ 30", d)
		}
	})

	t.Run("UDP", func(t *testing.T) {
		before := counters()
		seen := map[string]int{}
		for range 20 {
			name, from, err := askUDP(client, udpFront)
			if err != nil {
				t.Fatalf("UDP to %s from outside: %v", udpFront, err)
			}
			if from != udpFront.String() {
				t.Fatalf("UDP reply from %s, want %s", from, udpFront)
			}
			seen[name]++
		}
		if len(seen) != 2 {
			t.Errorf("backends reached: %v; want both", seen)
		}
		// Each reply given the frontend's address, on the slow path or, for
		// a client port reused while its flow is still cached, the fast.
		after := counters()
		if d := reversed(after) - reversed(before); d < 20 {
			t.Errorf("replies reversed grew by %d (uplink_reversed, uplink_fast_reply, uplink_fast_from_remote), want ≥ 20", d)
		}
	})

	// A flow to node 1's backend skips node 0's stack both ways once
	// conntrack holds it established and masqueraded: sent over the
	// overlay with its masqueraded source, the replies decapsulated and
	// reversed on the uplink; node 1 carries it on its fast path too (the
	// source is node 0's gateway address). A policy at node 1 then shuts
	// it out there.
	t.Run("FastPathToAnotherNode", func(t *testing.T) {
		var ask func() error
		var from netip.AddrPort
		testutil.WaitFor(t, "a flow to node 1's backend", 10*time.Second, func() bool {
			ask, from = dialUDP(t, client, udpFront, backends[1].Name)
			return ask() == nil
		})
		fastExchanges(t, node0, from, ask, counters, "uplink_fast_to_remote", "uplink_fast_from_remote")
		before1 := stats(t, l.Nodes[1])
		for range 30 {
			if err := ask(); err != nil {
				t.Fatalf("exchange: %v", err)
			}
		}
		after1 := stats(t, l.Nodes[1])
		for _, c := range []string{"ingress_hit", "egress_hit"} {
			if d := after1[c] - before1[c]; d < 30 {
				t.Errorf("node 1's %s grew by %d over 30 exchanges, want ≥ 30", c, d)
			}
		}
		// Node 0 sends on, knowing no policy of node 1's; node 1 drops,
		// its fast path no longer carrying the flow.
		revoke(t, kube, ask, func() uint64 { return stats(t, l.Nodes[1])["ingress_hit"] })
	})

	t.Run("ExternalTrafficPolicyLocal", func(t *testing.T) {
		cur, err := kube.CoreV1().Services(svcNS).Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		if _, err := kube.CoreV1().Services(svcNS).Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		waitFrontend(t, node0, tcpFront, "TCP", "uplink", 1)
		for range 10 {
			name, saw, _, err := askTCP(client, tcpFront)
			if err != nil || name != backends[0].Name || saw != lab.ExternalClientIP.String() {
				t.Fatalf("externalTrafficPolicy Local: %s saw %s (%v); want %s seeing %s", name, saw, err, backends[0].Name, lab.ExternalClientIP)
			}
		}
	})

	// An agent restart under a connection from outside to a backend on
	// the node, one the uplink opened on the fast path (so conntrack has
	// no entry of it): every message echoed across it.
	t.Run("ConnectionSurvivesAgentRestart", func(t *testing.T) {
		echo, err := l.AddPodSpec(ctx, node0, lab.PodSpec{Namespace: svcNS, Name: "echo-0", Labels: map[string]string{"app": "echo"}})
		if err != nil {
			t.Fatal(err)
		}
		bypasstest.ServeEcho(listenTCP(t, echo.Netns, 8080))
		if _, err := kube.CoreV1().Services(svcNS).Create(ctx, nodePortService("echo", 30090, 30055), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		writeEndpoints(t, kube, "echo", []*lab.Pod{echo}, nil)
		front := netip.AddrPortFrom(node0.IP, 30090)
		waitFrontend(t, node0, front, "TCP", "uplink", 1)
		opened := counters()["uplink_open"]
		c := dial(t, client, "tcp4", front.Addr(), int(front.Port()))
		if err := rr(c, 10); err != nil {
			t.Fatal(err)
		}
		if d := counters()["uplink_open"] - opened; d != 1 {
			t.Fatalf("uplink_open grew by %d; want the connection opened on the fast path", d)
		}
		stop := exchanges(t, c, 10, func() {})
		if err := l.RestartAgent(ctx, node0, "--kube-proxy-replacement"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(500 * time.Millisecond)
		if err := stop(); err != nil {
			t.Fatalf("the connection across the agent's restart: %v", err)
		}
	})

	// Every backend now on node 0, none isolated by a policy: each TCP
	// connection from outside opens, runs and closes on node 0's fast
	// path, and conntrack never sees it. (PolicyAppliesToTheClient below
	// isolates the backend: its connections then open through the stack.)
	t.Run("ConnectionsOpenOnTheFastPath", func(t *testing.T) {
		const n = 20
		dropConntrack(t, node0, backends[0].IP, 8080)
		before := counters()
		for range n {
			if name, _, _, err := askTCP(client, tcpFront); err != nil || name != backends[0].Name {
				t.Fatalf("TCP to %s from outside: %s (%v); want %s", tcpFront, name, err, backends[0].Name)
			}
		}
		after := counters()
		if d := after["uplink_open"] - before["uplink_open"]; d != n {
			t.Errorf("uplink_open grew by %d over %d connections, want %d", d, n, n)
		}
		if d := after["uplink_reversed"] - before["uplink_reversed"]; d != 0 {
			t.Errorf("uplink_reversed grew by %d: replies took the stack", d)
		}
		if lines := conntrackTo(t, node0, backends[0].IP, 8080); len(lines) != 0 {
			t.Errorf("node 0's conntrack saw connections the fast path opened: %q", lines)
		}
	})

	// An established flow to node 0's backend skips node 0's stack both
	// ways once netfilter saw it so (the uplink's fast counters take its
	// datagrams), until a policy shuts its client out: then not one more
	// datagram reaches the pod.
	t.Run("FastPathUntilRevoked", func(t *testing.T) {
		ask, from := dialUDP(t, client, udpFront, backends[0].Name)
		fastExchanges(t, node0, from, ask, counters, "uplink_fast_to_pod", "uplink_fast_reply")
		revoke(t, kube, ask, func() uint64 { return counters()["uplink_fast_to_pod"] })
	})

	// NetworkPolicy judges translated traffic at the backend pod, from the
	// real client (kept with externalTrafficPolicy Local): a policy
	// admitting other addresses only shuts the client out, one admitting
	// the client lets it in again.
	t.Run("PolicyAppliesToTheClient", func(t *testing.T) {
		judgesTheClient(t, kube, client, tcpFront, netip.MustParsePrefix("192.0.2.0/24"), backends[0].Name)
	})

	t.Run("NoEndpointsRefused", func(t *testing.T) {
		if _, err := kube.CoreV1().Services(svcNS).Create(ctx, nodePortService("empty", 30081, 30054), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		front := netip.AddrPortFrom(node0.IP, 30081)
		waitFrontend(t, node0, front, "TCP", "uplink", 0)
		before := counters()
		start := time.Now()
		if _, _, _, err := askTCP(client, front); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("TCP to %s without endpoints: %v, want ECONNREFUSED", front, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Errorf("refused after %v", d)
		}
		if d := counters()["uplink_refused"] - before["uplink_refused"]; d != 1 {
			t.Errorf("uplink_refused grew by %d, want 1", d)
		}
	})
}

// judgesTheClient checks that NetworkPolicy judges the client outside
// (the lab's external client, in netns client) by its own address at the
// web pods behind front: a policy admitting only other (no address of the
// client's) shuts it out, one admitting the client lets it in again,
// answered by backend seeing the client. The policy goes when t ends.
func judgesTheClient(t *testing.T, kube kubernetes.Interface, client string, front netip.AddrPort, other netip.Prefix, backend string) {
	t.Helper()
	ctx := context.Background()
	pols := kube.NetworkingV1().NetworkPolicies(svcNS)
	t.Cleanup(func() { _ = pols.Delete(ctx, "from-outside", metav1.DeleteOptions{}) })
	admit := func(cidr netip.Prefix) {
		t.Helper()
		pol := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "from-outside", Namespace: svcNS},
			Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
				PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
				Ingress:     []networkingv1.NetworkPolicyIngressRule{{From: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: cidr.String()}}}}}}}
		if _, err := pols.Update(ctx, pol, metav1.UpdateOptions{}); err != nil {
			if _, err := pols.Create(ctx, pol, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	admit(other)
	testutil.WaitFor(t, "the client shut out", 10*time.Second, func() bool {
		_, _, _, err := askTCP(client, front)
		return err != nil
	})
	admit(netip.PrefixFrom(lab.ExternalClientIP, 32))
	testutil.WaitFor(t, "the client let in", 10*time.Second, func() bool {
		name, saw, _, err := askTCP(client, front)
		return err == nil && name == backend && saw == lab.ExternalClientIP.String()
	})
}

// lbCounters reads a node's services counters (socket, uplink and DSR) by
// name.
func lbCounters(t *testing.T, n *lab.Node) map[string]uint64 {
	t.Helper()
	resp, err := agent(t, n).ListServices(context.Background(), &apiv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]uint64{}
	for _, c := range resp.Counters {
		out[c.Name] = c.Value
	}
	return out
}

func nodePortService(name string, tcpPort, udpPort int32) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svcNS}, Spec: corev1.ServiceSpec{
		Type:     corev1.ServiceTypeNodePort,
		Selector: map[string]string{"app": name},
		Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080), NodePort: tcpPort},
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(8053), NodePort: udpPort},
		}}}
}

// serveWhoSaw answers TCP on 8080 with "name peer-address" and UDP on
// 8053 with name, over IPv4.
func serveWhoSaw(t *testing.T, netns, name string) {
	serveWhoSawOn(listenTCP(t, netns, 8080), name)
	serveNameUDP(t, netns, name)
}

// serveWhoSawOn answers every connection l accepts with "name
// peer-address".
func serveWhoSawOn(l net.Listener, name string) {
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(conn.RemoteAddr().String())
			_, _ = fmt.Fprintf(conn, "%s %s", name, host)
			conn.Close()
		}
	}()
}

// askTCP connects from netns to addr: the backend's name, the address it
// saw the client as, and the address the connection was made with.
func askTCP(netns string, addr netip.AddrPort) (name, saw, from string, err error) {
	var conn net.Conn
	if err := lab.InNetns(netns, func() (err error) {
		conn, err = net.DialTimeout("tcp"+family(addr.Addr()), addr.String(), 3*time.Second)
		return err
	}); err != nil {
		return "", "", "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 128)
	n, err := conn.Read(buf)
	name, saw, _ = strings.Cut(string(buf[:n]), " ")
	return name, saw, conn.RemoteAddr().String(), err
}

// askUDP sends one datagram from netns to addr on an unconnected socket:
// the backend's name and the address the reply came from.
func askUDP(netns string, addr netip.AddrPort) (name, from string, err error) {
	var c net.PacketConn
	if err := lab.InNetns(netns, func() (err error) { c, err = net.ListenPacket("udp"+family(addr.Addr()), ":0"); return err }); err != nil {
		return "", "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.WriteTo([]byte("hi"), net.UDPAddrFromAddrPort(addr)); err != nil {
		return "", "", err
	}
	buf := make([]byte, 64)
	n, src, err := c.ReadFrom(buf)
	if err != nil {
		return "", "", err
	}
	return string(buf[:n]), src.String(), nil
}

// dialUDP connects a UDP socket from netns to addr and returns a function
// that exchanges one datagram on it, failing unless want answers, and the
// socket's own address.
func dialUDP(t *testing.T, netns string, addr netip.AddrPort, want string) (func() error, netip.AddrPort) {
	t.Helper()
	var conn net.Conn
	network := "udp4"
	if addr.Addr().Is6() {
		network = "udp6"
	}
	if err := lab.InNetns(netns, func() (err error) {
		conn, err = net.Dial(network, addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return func() error {
		_ = conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write([]byte("hi")); err != nil {
			return err
		}
		buf := make([]byte, 64)
		n, err := conn.Read(buf)
		if err == nil && string(buf[:n]) != want {
			err = fmt.Errorf("answered by %q, want %s", buf[:n], want)
		}
		return err
	}, conn.LocalAddr().(*net.UDPAddr).AddrPort()
}

// fastExchanges exchanges with ask until the flow takes the fast path
// (the first counter in fast grows: a few datagrams, the slow path
// learning it), then 30 times more, which every counter in fast must
// count. On failure it logs why node's fast path did not take the flow
// from client: its learning counters and the flow cache's entries.
func fastExchanges(t *testing.T, node *lab.Node, client netip.AddrPort, ask func() error, counters func() map[string]uint64, fast ...string) {
	t.Helper()
	start := counters()[fast[0]]
	for i := 0; counters()[fast[0]] == start; i++ {
		if i == 20 {
			explainSlow(t, node, client)
			t.Fatalf("%s did not grow over 20 exchanges: the flow never took the fast path", fast[0])
		}
		if err := ask(); err != nil {
			t.Fatalf("exchange: %v", err)
		}
	}
	before := counters()
	for range 30 {
		if err := ask(); err != nil {
			t.Fatalf("exchange: %v", err)
		}
	}
	after := counters()
	for _, c := range fast {
		if d := after[c] - before[c]; d < 30 {
			t.Errorf("%s grew by %d over 30 exchanges, want ≥ 30", c, d)
		}
	}
	if t.Failed() {
		explainSlow(t, node, client)
	}
}

// explainSlow logs node's learning counters and the flow cache's entries
// for client.
func explainSlow(t *testing.T, node *lab.Node, client netip.AddrPort) {
	t.Helper()
	for name, v := range stats(t, node) {
		if strings.HasPrefix(name, "learn") || strings.Contains(name, "miss") {
			t.Logf("%s: %s = %d", node.Name, name, v)
		}
	}
	resp, err := agent(t, node).ListCache(context.Background(), &apiv1.ListCacheRequest{Table: "filter"})
	if err != nil {
		t.Fatalf("%s: cache list filter: %v", node.Name, err)
	}
	for _, f := range resp.Filter {
		if f.Remote == client.String() {
			t.Logf("%s: flow cache entry %v", node.Name, f)
		}
	}
}

// revoke puts a policy denying the web pods every ingress: the flow ask
// exchanges on must stop within 10 s, and then not one more datagram get
// through, nor the fast-path counter carried grow. It lifts the policy
// before it returns.
func revoke(t *testing.T, kube kubernetes.Interface, ask func() error, carried func() uint64) {
	t.Helper()
	ctx := context.Background()
	pols := kube.NetworkingV1().NetworkPolicies(svcNS)
	deny := &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Name: "deny-outside", Namespace: svcNS},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "web"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}}}
	if _, err := pols.Create(ctx, deny, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := pols.Delete(ctx, "deny-outside", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, "the policy lifted", 10*time.Second, func() bool { return ask() == nil })
	}()
	testutil.WaitFor(t, "the established flow revoked", 10*time.Second, func() bool { return ask() != nil })
	was := carried()
	for range 5 {
		if ask() == nil {
			t.Fatal("a datagram reached the pod past the policy")
		}
	}
	if d := carried() - was; d != 0 {
		t.Errorf("the fast path carried %d packets after the revocation", d)
	}
}
