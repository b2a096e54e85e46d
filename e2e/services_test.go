//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

// Services balanced at the socket, end to end, in the lab's Kubernetes
// mode on two nodes. The lab has no kube-proxy and no endpoint controller:
// the test writes Services and EndpointSlices as the endpoint controller
// would, so every connection that reaches a backend was translated at the
// socket (without it a ClusterIP leads nowhere).
//
// Three backend pods (one on node 0, two on node 1) serve TCP on a named
// port and UDP, each answering with its own name; clients are a pod on
// each node and node 0's host. FlowEvents (e2e/flow_events_test.go)
// checks the eBPF programs' flow records.
func TestServices(t *testing.T) {
	c := newServiceCluster(t)
	t.Run("SpreadTCP", c.spreadTCP)
	t.Run("SpreadUDP", c.spreadUDP)
	t.Run("Affinity", c.affinity)
	t.Run("ScaleDown", c.scaleDown)
	t.Run("NoEndpointsRefused", c.noEndpoints)
	t.Run("FastPathCarriesServiceTraffic", c.fastPath)
	t.Run("FlowEvents", c.flowEvents)
	t.Run("Onctl", c.onctl)
	t.Run("Modes", c.modes)
}

const svcNS = "svc"

type serviceCluster struct {
	l        *lab.Lab
	kube     kubernetes.Interface
	backends []*lab.Pod
	clients  []*lab.Pod // clients[i] on node i
}

// serviceLab is a lab of opts on the Kubernetes datastore with the
// Services' namespace, and an admin client of its API.
func serviceLab(t *testing.T, opts lab.Options) (*lab.Lab, kubernetes.Interface) {
	t.Helper()
	opts.Datastore = "kubernetes"
	l := labtest.Lab(t, opts)
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetNamespace(context.Background(), svcNS, nil); err != nil {
		t.Fatal(err)
	}
	return l, kube
}

func newServiceCluster(t *testing.T, agentArgs ...string) *serviceCluster {
	ctx := context.Background()
	l, kube := serviceLab(t, lab.Options{Nodes: 2, AgentArgs: agentArgs})
	c := &serviceCluster{l: l, kube: kube}
	for i, node := range []int{0, 1, 1} {
		p, err := l.AddPodSpec(ctx, l.Nodes[node], lab.PodSpec{Namespace: svcNS, Name: fmt.Sprintf("backend-%d", i),
			Labels: map[string]string{"app": "web"},
			Ports:  []corev1.ContainerPort{{Name: "http-alt", ContainerPort: 8080, Protocol: corev1.ProtocolTCP}}})
		if err != nil {
			t.Fatal(err)
		}
		serveName(t, p.Netns, p.Name)
		c.backends = append(c.backends, p)
	}
	for i := range l.Nodes {
		p, err := l.AddPodSpec(ctx, l.Nodes[i], lab.PodSpec{Namespace: svcNS, Name: fmt.Sprintf("client-%d", i)})
		if err != nil {
			t.Fatal(err)
		}
		c.clients = append(c.clients, p)
	}
	return c
}

// serveName answers every TCP connection on 8080 and every UDP datagram on
// 8053 with the pod's name, over IPv4.
func serveName(t *testing.T, netns, name string) {
	serveNameOn(listenTCP(t, netns, 8080), listenUDP(t, netns, 8053), name)
}

// serveNameOn answers every connection l accepts and every datagram u
// reads with name; a connection is then echoed, for request/response
// tests.
func serveNameOn(l net.Listener, u net.PacketConn, name string) {
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = io.WriteString(conn, name)
				_, _ = io.Copy(conn, conn) // then echo, for request/response tests
			}()
		}
	}()
	answerUDP(u, name)
}

// serveNameUDP answers every UDP datagram on 8053 with the pod's name.
func serveNameUDP(t *testing.T, netns, name string) { answerUDP(listenUDP(t, netns, 8053), name) }

func answerUDP(u net.PacketConn, name string) {
	go func() {
		buf := make([]byte, 64)
		for {
			_, from, err := u.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = u.WriteTo([]byte(name), from)
		}
	}()
}

// service creates a ClusterIP Service with an http (TCP 80 → named port
// http-alt) and a dns (UDP 53 → 8053) port, and its EndpointSlice with
// the given backends ready; it returns the allocated ClusterIP once every
// agent balances it with that many backends.
func (c *serviceCluster) service(t *testing.T, name string, affinity bool, backends ...*lab.Pod) netip.Addr {
	t.Helper()
	return netip.MustParseAddr(c.serviceWith(t, name, func(svc *corev1.Service) {
		if affinity {
			svc.Spec.SessionAffinity = corev1.ServiceAffinityClientIP
			svc.Spec.SessionAffinityConfig = &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(60))}}
		}
	}, backends...).Spec.ClusterIP)
}

// serviceWith is service with the Service edited before it is created;
// it returns the Service as created.
func (c *serviceCluster) serviceWith(t *testing.T, name string, edit func(*corev1.Service), backends ...*lab.Pod) *corev1.Service {
	t.Helper()
	ctx := context.Background()
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svcNS}, Spec: corev1.ServiceSpec{
		Selector: map[string]string{"app": "web"},
		Ports: []corev1.ServicePort{
			{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http-alt")},
			{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(8053)},
		}}}
	edit(svc)
	created, err := c.kube.CoreV1().Services(svcNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	vip := netip.MustParseAddr(created.Spec.ClusterIP)
	if len(backends) > 0 {
		c.setEndpoints(t, name, vip, backends, nil)
	} else {
		c.waitBalanced(t, vip, 0)
	}
	return created
}

// setEndpoints writes the Service's EndpointSlice: ready backends, and
// terminating ones (serving, not ready) as a scale-down leaves them.
func (c *serviceCluster) setEndpoints(t *testing.T, name string, vip netip.Addr, ready, terminating []*lab.Pod) {
	t.Helper()
	writeEndpoints(t, c.kube, name, ready, terminating)
	if len(ready) > 0 {
		c.waitBalanced(t, vip, len(ready))
	} else {
		c.waitBalanced(t, vip, len(terminating)) // used only when none is ready
	}
}

// writeEndpoints writes Service name's EndpointSlice, as the endpoint
// controller would: ready backends, and terminating ones (serving, not
// ready) as a scale-down leaves them.
func writeEndpoints(t *testing.T, kube kubernetes.Interface, name string, ready, terminating []*lab.Pod) {
	t.Helper()
	writeSlice(t, kube, name, discoveryv1.AddressTypeIPv4, ready, terminating)
}

// writeSlice writes Service name's EndpointSlice of an address type: the
// pods' IPv4 or IPv6 addresses.
func writeSlice(t *testing.T, kube kubernetes.Interface, name string, family discoveryv1.AddressType, ready, terminating []*lab.Pod) {
	t.Helper()
	ctx := context.Background()
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-" + strings.ToLower(string(family)) + "-abc12", Namespace: svcNS,
			Labels: map[string]string{discoveryv1.LabelServiceName: name}},
		AddressType: family,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(int32(8080))},
			{Name: ptr.To("dns"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To(int32(8053))},
		}}
	for _, set := range []struct {
		pods  []*lab.Pod
		ready bool
	}{{ready, true}, {terminating, false}} {
		for _, p := range set.pods {
			addr := p.IP
			if family == discoveryv1.AddressTypeIPv6 {
				addr = p.IPv6
			}
			slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{
				Addresses:  []string{addr.String()},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(set.ready), Serving: ptr.To(true), Terminating: ptr.To(!set.ready)},
				NodeName:   ptr.To(p.Node), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: svcNS, Name: p.Name}})
		}
	}
	slices := kube.DiscoveryV1().EndpointSlices(svcNS)
	if _, err := slices.Update(ctx, slice, metav1.UpdateOptions{}); err != nil {
		if _, err := slices.Create(ctx, slice, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitBalanced waits until every agent balances vip:80 with n backends.
func (c *serviceCluster) waitBalanced(t *testing.T, vip netip.Addr, n int) {
	t.Helper()
	want := netip.AddrPortFrom(vip, 80).String()
	deadline := time.Now().Add(15 * time.Second)
	for _, node := range c.l.Nodes {
		for {
			resp, err := agent(t, node).ListServices(context.Background(), &apiv1.ListServicesRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if s := findService(resp, want, "TCP"); s != nil && len(s.Backends) == n {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s does not balance %s with %d backends: %v", node.Name, want, n, resp.Services)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func findService(resp *apiv1.ListServicesResponse, vip, proto string) *apiv1.BalancedService {
	for _, s := range resp.Services {
		if s.Vip == vip && s.Proto == proto {
			return s
		}
	}
	return nil
}

// connectTCP connects from the namespace to addr and returns the name the
// backend answered with and the peer getpeername() reported.
func connectTCP(netns string, addr netip.AddrPort) (name, peer string, err error) {
	var conn net.Conn
	if err := lab.InNetns(netns, func() (err error) {
		conn, err = net.DialTimeout("tcp"+family(addr.Addr()), addr.String(), 3*time.Second)
		return err
	}); err != nil {
		return "", "", err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	buf := make([]byte, 64)
	n, err := conn.Read(buf)
	// Go's Dial asks getpeername() for the remote address.
	return string(buf[:n]), conn.RemoteAddr().String(), err
}

// family is "4" or "6", as Go's networks name a's family ("tcp4").
func family(a netip.Addr) string {
	if a.Is4() {
		return "4"
	}
	return "6"
}

// spread connects n times and counts the backends reached; every
// connection must report the ClusterIP as its peer.
func spreadOf(t *testing.T, netns string, addr netip.AddrPort, n int) map[string]int {
	t.Helper()
	seen := map[string]int{}
	for range n {
		name, peer, err := connectTCP(netns, addr)
		if err != nil {
			t.Fatalf("connect %s from %s: %v", addr, netns, err)
		}
		if peer != addr.String() {
			t.Fatalf("getpeername() after connect to %s reports %s", addr, peer)
		}
		seen[name]++
	}
	return seen
}

// requireEven fails unless every backend got a fair share: with n draws
// over k backends, each gets n/k on average; fewer than a quarter of that
// is (for n = 90, k = 3) a 1-in-10^8 event for a uniform choice.
func requireEven(t *testing.T, seen map[string]int, backends []*lab.Pod, n int) {
	t.Helper()
	t.Logf("%d attempts over %d backends: %v", n, len(backends), seen)
	for _, b := range backends {
		if seen[b.Name] < n/len(backends)/4 {
			t.Fatalf("backend %s got %d of %d attempts: %v", b.Name, seen[b.Name], n, seen)
		}
	}
}

func (c *serviceCluster) spreadTCP(t *testing.T) {
	vip := c.service(t, "spread", false, c.backends...)
	addr := netip.AddrPortFrom(vip, 80)
	const n = 90
	for _, netns := range []string{c.clients[0].Netns, c.clients[1].Netns, c.l.Nodes[0].Netns} {
		requireEven(t, spreadOf(t, netns, addr, n), c.backends, n)
	}
}

// UDP: each unconnected socket's datagrams reach a backend, and the reply
// reads as coming from the ClusterIP:53 it was sent to.
func (c *serviceCluster) spreadUDP(t *testing.T) {
	vip := c.service(t, "spread-udp", false, c.backends...)
	addr := netip.AddrPortFrom(vip, 53)
	const n = 90
	seen := map[string]int{}
	for range n {
		var sock net.PacketConn
		if err := lab.InNetns(c.clients[0].Netns, func() (err error) { sock, err = net.ListenPacket("udp4", ":0"); return err }); err != nil {
			t.Fatal(err)
		}
		_ = sock.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := sock.WriteTo([]byte("who"), net.UDPAddrFromAddrPort(addr)); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 64)
		m, from, err := sock.ReadFrom(buf)
		sock.Close()
		if err != nil {
			t.Fatalf("UDP to %s: %v", addr, err)
		}
		if from.String() != addr.String() {
			t.Fatalf("UDP reply from %s, want the ClusterIP %s", from, addr)
		}
		seen[string(buf[:m])]++
	}
	requireEven(t, seen, c.backends, n)
}

// ClientIP affinity: every connection of a client pod meets one backend.
func (c *serviceCluster) affinity(t *testing.T) {
	vip := c.service(t, "sticky", true, c.backends...)
	addr := netip.AddrPortFrom(vip, 80)
	for _, client := range c.clients {
		if seen := spreadOf(t, client.Netns, addr, 30); len(seen) != 1 {
			t.Fatalf("affinity: %s's 30 connections met %v", client.Name, seen)
		}
	}
}

// A backend scaled down (terminating while others are ready) gets no new
// connection once the agents have its EndpointSlice; when no backend is
// ready, the serving terminating ones are used rather than refusing.
func (c *serviceCluster) scaleDown(t *testing.T) {
	vip := c.service(t, "scale", false, c.backends...)
	addr := netip.AddrPortFrom(vip, 80)
	gone := c.backends[2]
	c.setEndpoints(t, "scale", vip, c.backends[:2], []*lab.Pod{gone})
	const n = 60
	seen := spreadOf(t, c.clients[0].Netns, addr, n)
	if seen[gone.Name] != 0 {
		t.Fatalf("the scaled-down %s got %d of %d new connections", gone.Name, seen[gone.Name], n)
	}
	requireEven(t, seen, c.backends[:2], n)

	c.setEndpoints(t, "scale", vip, nil, []*lab.Pod{gone}) // kube-proxy falls back to it
	if seen := spreadOf(t, c.clients[0].Netns, addr, 5); seen[gone.Name] != 5 {
		t.Fatalf("with only a terminating backend: %v", seen)
	}
}

// A Service without endpoints refuses at once, as kube-proxy's REJECT
// does: the client sees ECONNREFUSED, not a timeout.
func (c *serviceCluster) noEndpoints(t *testing.T) {
	vip := c.service(t, "empty", false)
	for _, netns := range []string{c.clients[0].Netns, c.l.Nodes[1].Netns} {
		start := time.Now()
		_, _, err := connectTCP(netns, netip.AddrPortFrom(vip, 80))
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Fatalf("connect to a Service without endpoints from %s: %v, want ECONNREFUSED", netns, err)
		}
		if d := time.Since(start); d > time.Second {
			t.Fatalf("refusal took %v", d)
		}
	}
}

// Service traffic across nodes rides the flow cache: the connection goes
// to the backend pod's IP from its first packet, so the egress program
// finds a fast-path peer (its hits rise) and never misses for want of one.
func (c *serviceCluster) fastPath(t *testing.T) {
	remote := c.backends[1] // on node 1
	vip := c.service(t, "remote", false, remote)
	node := c.l.Nodes[0]
	before := settled(t, node)
	conn := dialGreeted(t, c.clients[0], vip, remote)
	const exchanges = 200
	if err := rr(conn, exchanges); err != nil {
		t.Fatal(err)
	}
	after := settled(t, node)
	hits := after["egress_hit"] - before["egress_hit"]
	t.Logf("%s: %d request/response exchanges through the ClusterIP; egress hits +%d, miss_no_peer +%d",
		node.Name, exchanges, hits, after["egress_miss_no_peer"]-before["egress_miss_no_peer"])
	if hits < exchanges*9/10 {
		t.Fatalf("egress hits rose by %d over %d exchanges: the Service traffic did not ride the fast path", hits, exchanges)
	}
	if after["egress_miss_no_peer"] != before["egress_miss_no_peer"] {
		t.Fatalf("egress_miss_no_peer rose from %d to %d: packets to the ClusterIP reached the egress program",
			before["egress_miss_no_peer"], after["egress_miss_no_peer"])
	}
}

// dialGreeted connects client to vip:80, a Service of the one backend,
// and reads its greeting; the test's end closes the connection.
func dialGreeted(t *testing.T, client *lab.Pod, vip netip.Addr, backend *lab.Pod) net.Conn {
	t.Helper()
	var conn net.Conn
	if err := lab.InNetns(client.Netns, func() (err error) {
		conn, err = net.DialTimeout("tcp4", netip.AddrPortFrom(vip, 80).String(), 3*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	greeting := make([]byte, len(backend.Name))
	if _, err := io.ReadFull(conn, greeting); err != nil || string(greeting) != backend.Name {
		t.Fatalf("greeting %q, %v", greeting, err)
	}
	return conn
}

// onctl services shows the table with backends (pod, node), counters and
// affinity entries; onctl status says where socket LB is attached.
func (c *serviceCluster) onctl(t *testing.T) {
	n := c.l.Nodes[0]
	run := func(args ...string) string {
		out, err := exec.Command(c.l.BinDir+"/onctl", append([]string{"--socket", n.AgentSocket()}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("onctl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	table := run("services")
	for _, want := range []string{"svc/sticky:http", "svc/empty:http", "none: connections refused", "ClientIP 60s",
		c.backends[0].IP.String() + ":8080 (svc/backend-0 on " + c.backends[0].Node + ")", "AFFINITY OF", c.clients[0].IP.String()} {
		if !strings.Contains(table, want) {
			t.Fatalf("onctl services lacks %q:\n%s", want, table)
		}
	}
	status := run("status")
	if !regexp.MustCompile(`Socket LB:\s+all \(attached to cgroup `).MatchString(status) {
		t.Fatalf("onctl status does not say where socket LB attaches:\n%s", status)
	}
	resp, err := agent(t, n).ListServices(context.Background(), &apiv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var spread *apiv1.BalancedService
	for _, s := range resp.Services {
		if s.Name == svcNS+"/spread:http" {
			spread = s
		}
	}
	// One pod client on node 0 and node 0's host: 90 each, translated there.
	if spread == nil || spread.Translated != 180 {
		t.Fatalf("svc/spread:http on %s: %+v, want 180 translated connections", n.Name, spread)
	}
}

// --services=host-only balances the host's sockets and leaves the pods'
// (to kube-proxy in a cluster; in the lab, without one, the ClusterIP
// leads nowhere); off balances none; both say so. Back on all, the pods
// attached meanwhile are balanced again.
func (c *serviceCluster) modes(t *testing.T) {
	ctx := context.Background()
	vip := c.service(t, "modes", false, c.backends...)
	addr := netip.AddrPortFrom(vip, 80)
	n, pod := c.l.Nodes[0], c.clients[0]
	restart := func(mode string) *apiv1.NodeStatus {
		t.Helper()
		if err := c.l.RestartAgent(ctx, n, "--services="+mode); err != nil {
			t.Fatal(err)
		}
		st, err := n.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	unbalanced := func(netns string) {
		t.Helper()
		if name, _, err := connectTCP(netns, addr); err == nil {
			t.Fatalf("a connection from %s to %s reached %s: it was balanced", netns, addr, name)
		}
	}

	if st := restart("host-only"); st.SocketLb != "host-only" {
		t.Fatalf("status says socket LB %q, want host-only", st.SocketLb)
	}
	requireEven(t, spreadOf(t, n.Netns, addr, 30), c.backends, 30)
	unbalanced(pod.Netns)

	if st := restart("off"); !strings.HasPrefix(st.SocketLb, "off") || st.SocketLbCgroup != "" {
		t.Fatalf("status says socket LB %q on %q, want off", st.SocketLb, st.SocketLbCgroup)
	}
	if _, err := agent(t, n).ListServices(ctx, &apiv1.ListServicesRequest{}); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("ListServices with socket LB off: %v, want FailedPrecondition", err)
	}
	unbalanced(n.Netns)

	if st := restart("all"); st.SocketLb != "all" {
		t.Fatalf("status says socket LB %q, want all", st.SocketLb)
	}
	c.waitBalanced(t, vip, len(c.backends))
	requireEven(t, spreadOf(t, pod.Netns, addr, 30), c.backends, 30)
}
