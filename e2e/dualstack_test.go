//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/bypass/bypasstest"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	"github.com/onc-net/onc/lab/labtest"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
)

// A dual-stack lab (IPv4 first): every pod gets an address of each family
// from its node's blocks, onctl shows both, and the matrix passes in both
// families (pod↔pod on one node and across nodes, node→pod), on each
// datastore. On Kubernetes a NetworkPolicy that admits one client pod by
// its labels admits it over IPv6 too (its IPv6 address comes from its
// status.podIPs) and denies another pod in IPv6 as in IPv4, also when that
// pod sends with the client's IPv6 address.
func TestDualStack(t *testing.T) {
	t.Run("etcd", func(t *testing.T) {
		l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 2, IPFamily: lab.IPFamilyDual})
		dualStackAddresses(t, l)
		allPairsPass(t, l, "the dual-stack matrix")
		fastPathCarriesIPv6(t, l)
	})
	t.Run("kubernetes", func(t *testing.T) {
		l := labtest.Lab(t, lab.Options{Nodes: 2, PodsPerNode: 1, IPFamily: lab.IPFamilyDual, Datastore: "kubernetes"})
		dualStackAddresses(t, l)
		allPairsPass(t, l, "the dual-stack matrix")
		policyInBothFamilies(t, l)
	})
}

// fastPathCarriesIPv6: after the handshake, IPv6 TCP and UDP between pods
// on different nodes take the fast path both ways, counted as IPv6's.
func fastPathCarriesIPv6(t *testing.T, l *lab.Lab) {
	t.Helper()
	n1, n2 := l.Nodes[0], l.Nodes[1]
	a, b := n1.Pods[0], n2.Pods[0]
	bypasstest.ServeEcho(listenOn(t, b.Netns, "tcp6", 9000))
	echoUDP(listenPacketOn(t, b.Netns, "udp6", 9001))
	before1, before2 := settled(t, n1), settled(t, n2)
	if err := rr(dial(t, a.Netns, "tcp6", b.IPv6, 9000), 2000); err != nil {
		t.Fatal(err)
	}
	if err := udpRR(dial(t, a.Netns, "udp6", b.IPv6, 9001), 2000); err != nil {
		t.Fatal(err)
	}
	after1, after2 := stats(t, n1), stats(t, n2)
	for _, c := range []struct {
		node          string
		before, after map[string]uint64
	}{{n1.Name, before1, after1}, {n2.Name, before2, after2}} {
		for _, counter := range []string{"egress6_hit", "ingress6_hit"} {
			if got := c.after[counter] - c.before[counter]; got < 3900 {
				t.Errorf("%s %s = %d for 4000 IPv6 exchanges; want nearly all on the fast path", c.node, counter, got)
			}
		}
		if got := c.after["egress_hit"] - c.before["egress_hit"]; got > 100 {
			t.Errorf("%s: IPv4's egress_hit grew by %d over IPv6 exchanges", c.node, got)
		}
		if e := c.after["egress6_error"] + c.after["ingress6_error"]; e != 0 {
			t.Errorf("%s: %d IPv6 fast-path errors", c.node, e)
		}
	}
}

// dualStackAddresses checks every pod's two addresses: IPv4 as before, IPv6
// from the cluster's IPv6 range, one /64 per node, none twice; and that
// onctl pods lists both (ips), the first as ip.
func dualStackAddresses(t *testing.T, l *lab.Lab) {
	t.Helper()
	cluster6 := netip.MustParsePrefix("fd00:10:244::/56")
	seen := map[netip.Addr]string{}
	blocks := map[netip.Prefix]string{}
	for _, n := range l.Nodes {
		resp, err := agent(t, n).ListPods(context.Background(), &apiv1.ListPodsRequest{})
		if err != nil {
			t.Fatal(err)
		}
		listed := map[string]string{}
		for _, p := range resp.Pods {
			listed[p.ContainerId] = p.Ip + " " + strings.Join(p.Ips, ",")
		}
		for _, p := range n.Pods {
			if !p.IP.Is4() || !cluster6.Contains(p.IPv6) || seen[p.IPv6] != "" {
				t.Fatalf("pod %s has %s and %s: want IPv4 and a unique IPv6 address of %s", p.Key(), p.IP, p.IPv6, cluster6)
			}
			seen[p.IPv6] = p.Key()
			block, _ := p.IPv6.Prefix(64)
			if other := blocks[block]; other != "" && other != n.Name {
				t.Fatalf("pod %s's IPv6 block %s is node %s's too", p.Key(), block, other)
			}
			blocks[block] = n.Name
			if want := p.IP.String() + " " + p.IP.String() + "," + p.IPv6.String(); listed[p.ContainerID] != want {
				t.Fatalf("onctl pods on %s lists %s with %q, want %q", n.Name, p.Key(), listed[p.ContainerID], want)
			}
		}
	}
}

// policyInBothFamilies isolates a server pod to admit one client pod on
// one TCP and one UDP port: the client gets in over IPv4 and IPv6 alike
// (IPv6 alone in an IPv6 lab, where a pod's IP is its IPv6 address),
// another pod in neither, not even with the client's IPv6 address.
func policyInBothFamilies(t *testing.T, l *lab.Lab) {
	t.Helper()
	ctx := context.Background()
	kube, err := l.Kube()
	if err != nil {
		t.Fatal(err)
	}
	const ns = "dual"
	if err := l.SetNamespace(ctx, ns, nil); err != nil {
		t.Fatal(err)
	}
	add := func(n *lab.Node, name, role string) *lab.Pod {
		p, err := l.AddPodSpec(ctx, n, lab.PodSpec{Namespace: ns, Name: name, Labels: map[string]string{"role": role}})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	server, client, other := add(l.Nodes[1], "server", "server"), add(l.Nodes[0], "client", "client"), add(l.Nodes[0], "other", "other")
	const serverPort, udpPort = 9300, 9301
	for _, serve := range []func([]string, []int, []int) (func(), error){lab.ServeEcho, lab.ServeEcho6} {
		stop, err := serve([]string{server.Netns}, []int{serverPort}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(stop)
	}
	var pc net.PacketConn
	if err := lab.InNetns(server.Netns, func() (err error) {
		pc, err = net.ListenPacket("udp6", fmt.Sprintf(":%d", udpPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	// Before the policy, the other pod's IPv6 connection rides the fast
	// path (where it runs); the policy must end it (strict revocation, in
	// IPv6 too).
	before := settled(t, l.Nodes[1])
	early := dial(t, other.Netns, "tcp6", server.IPv6, serverPort)
	if err := rr(early, 200); err != nil {
		t.Fatal(err)
	}
	if hits := stats(t, l.Nodes[1])["ingress6_hit"] - before["ingress6_hit"]; hits < 150 && nodeStatus(t, l.Nodes[1]).FastPath {
		t.Fatalf("the server's node carried %d of 200 IPv6 requests on its fast path before the policy; want nearly all", hits)
	}
	pol := netpol(ns, "server", sel("role", "server"), ingressOnly,
		ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("role", "client")}),
			port(corev1.ProtocolTCP, serverPort), port(corev1.ProtocolUDP, udpPort)), nil)
	if _, err := kube.NetworkingV1().NetworkPolicies(ns).Create(ctx, pol, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	api := agent(t, l.Nodes[1])
	testutil.WaitFor(t, "the server isolated for ingress", 15*time.Second, func() bool {
		resp, err := api.ListPolicy(ctx, &apiv1.ListPolicyRequest{Pod: server.Key()})
		return err == nil && len(resp.Pods) == 1 && resp.Pods[0].Ingress.GetIsolated()
	})
	if err := rr(early, 1); err == nil {
		t.Fatal("an IPv6 connection the new policy denies went on after it took effect")
	}
	var failed []string
	for _, c := range []struct {
		from *lab.Pod
		dst  netip.Addr
		ok   bool
	}{
		{client, server.IP, true}, {client, server.IPv6, true},
		{other, server.IP, false}, {other, server.IPv6, false},
	} {
		_, err := lab.Probe(c.from.Netns, "tcp", c.dst, serverPort, 2*time.Second)
		if (err == nil) != c.ok {
			failed = append(failed, c.from.Name+" → "+c.dst.String()+": "+map[bool]string{true: "works", false: "fails"}[err == nil])
		}
	}
	if len(failed) > 0 {
		t.Fatalf("policy admitting only the client:\n%s", strings.Join(failed, "\n"))
	}

	// The other pod takes the client's IPv6 address too (as a pod may add
	// any to its interface): one-way UDP from it never arrives, while the
	// client's own does.
	if out, err := exec.Command("ip", "-n", other.Netns, "addr", "add", client.IPv6.String()+"/128", "dev", "eth0", "nodad").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	received := func(p *lab.Pod) bool {
		t.Helper()
		want := "from " + p.Name
		var c net.Conn
		if err := lab.InNetns(p.Netns, func() (err error) {
			d := net.Dialer{LocalAddr: &net.UDPAddr{IP: client.IPv6.AsSlice()}}
			c, err = d.Dial("udp6", netip.AddrPortFrom(server.IPv6, udpPort).String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return testutil.Delivered(t, c, pc, want)
	}
	if !received(client) {
		t.Fatal("the client's own IPv6 datagram did not arrive")
	}
	if received(other) {
		t.Fatal("a datagram another pod sent with the client's IPv6 address arrived")
	}
}

// A dual-stack Service (RequireDualStack) in a dual-stack lab on the
// Kubernetes datastore, the agents replacing kube-proxy (the lab runs
// none): a pod on node 0 reaches the backend on node 1 through the
// Service's IPv6 cluster IP, TCP and UDP, reading the cluster IP as its
// peer and as the replies' source; node 0's socket LB counted each call
// in its IPv6 hooks and on the IPv6 frontend, and onctl services shows
// the IPv6 frontend with its IPv6 backend. Its IPv4 cluster IP still
// reaches the backend's IPv4 address, and a Service with no IPv6
// endpoints refuses over IPv6 at once.
func TestDualStackServices(t *testing.T) {
	ctx := context.Background()
	l, kube := serviceLab(t, lab.Options{Nodes: 2, IPFamily: lab.IPFamilyDual, AgentArgs: []string{"--kube-proxy-replacement"}})
	backend, err := l.AddPodSpec(ctx, l.Nodes[1], lab.PodSpec{Namespace: svcNS, Name: "backend", Labels: map[string]string{"app": "web"}})
	if err != nil {
		t.Fatal(err)
	}
	client, err := l.AddPodSpec(ctx, l.Nodes[0], lab.PodSpec{Namespace: svcNS, Name: "client"})
	if err != nil {
		t.Fatal(err)
	}
	serveName(t, backend.Netns, backend.Name)
	var l6 net.Listener
	var u6 net.PacketConn
	if err := lab.InNetns(backend.Netns, func() (err error) {
		if l6, err = net.Listen("tcp6", ":8080"); err != nil {
			return err
		}
		u6, err = net.ListenPacket("udp6", ":8053")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l6.Close(); u6.Close() })
	serveNameOn(l6, u6, backend.Name)

	dual := func(name string) (v4, v6 netip.Addr) {
		t.Helper()
		policy := corev1.IPFamilyPolicyRequireDualStack
		svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: svcNS}, Spec: corev1.ServiceSpec{
			Selector: map[string]string{"app": "web"}, IPFamilyPolicy: &policy,
			IPFamilies: []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			Ports: []corev1.ServicePort{
				{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
				{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(8053)},
			}}}
		created, err := kube.CoreV1().Services(svcNS).Create(ctx, svc, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(created.Spec.ClusterIPs) != 2 {
			t.Fatalf("cluster IPs %v, want one of each family", created.Spec.ClusterIPs)
		}
		return netip.MustParseAddr(created.Spec.ClusterIPs[0]), netip.MustParseAddr(created.Spec.ClusterIPs[1])
	}
	vip4, vip6 := dual("web")
	writeSlice(t, kube, "web", discoveryv1.AddressTypeIPv4, []*lab.Pod{backend}, nil)
	writeSlice(t, kube, "web", discoveryv1.AddressTypeIPv6, []*lab.Pod{backend}, nil)
	n := l.Nodes[0]
	tcp6, udp6 := netip.AddrPortFrom(vip6, 80), netip.AddrPortFrom(vip6, 53)
	waitFrontend(t, n, netip.AddrPortFrom(vip4, 80), "TCP", "socket", 1)
	if s := waitFrontend(t, n, tcp6, "TCP", "socket", 1); s.Backends[0].Addr != netip.AddrPortFrom(backend.IPv6, 8080).String() {
		t.Fatalf("%s's backends %v, want the backend's IPv6 address", tcp6, s.Backends)
	}
	waitFrontend(t, n, udp6, "UDP", "socket", 1)

	before := lbCounters(t, n)
	const tries = 20
	for range tries {
		name, peer, err := connectTCP(client.Netns, tcp6)
		if err != nil || name != backend.Name || peer != tcp6.String() {
			t.Fatalf("TCP to %s: %q with peer %s, %v; want %s with the cluster IP as peer", tcp6, name, peer, err, backend.Name)
		}
		name, from, err := askUDP(client.Netns, udp6)
		if err != nil || name != backend.Name || from != udp6.String() {
			t.Fatalf("UDP to %s: %q from %s, %v; want %s from the cluster IP", udp6, name, from, err, backend.Name)
		}
	}
	after := lbCounters(t, n)
	for name, want := range map[string]uint64{"connect6_translated": tries, "sendmsg6_translated": tries, "getpeername6_reversed": tries,
		"recvmsg6_reversed": tries, "connect_translated": 0} {
		if got := after[name] - before[name]; got != want {
			t.Errorf("%s on %s rose by %d over %d calls, want %d", name, n.Name, got, tries, want)
		}
	}
	if s := waitFrontend(t, n, tcp6, "TCP", "socket", 1); s.Translated != tries {
		t.Errorf("the IPv6 frontend %s counted %d translations, want %d", tcp6, s.Translated, tries)
	}
	if name, peer, err := connectTCP(client.Netns, netip.AddrPortFrom(vip4, 80)); err != nil || name != backend.Name || peer != netip.AddrPortFrom(vip4, 80).String() {
		t.Fatalf("TCP to the IPv4 cluster IP %s: %q, %s, %v", vip4, name, peer, err)
	}
	out, err := exec.Command(l.BinDir+"/onctl", "--socket", n.AgentSocket(), "services").CombinedOutput()
	if err != nil {
		t.Fatalf("onctl services: %v\n%s", err, out)
	}
	row := tcp6.String() + "/TCP"
	if be := netip.AddrPortFrom(backend.IPv6, 8080).String() + " (" + svcNS + "/backend on " + backend.Node + ")"; !strings.Contains(string(out), row) ||
		!strings.Contains(string(out), be) || !strings.Contains(string(out), "connect6_translated=") {
		t.Fatalf("onctl services on %s lacks %s with %s:\n%s", n.Name, row, be, out)
	}

	// No IPv6 endpoints: refused over IPv6 at once.
	_, empty6 := dual("empty")
	writeSlice(t, kube, "empty", discoveryv1.AddressTypeIPv4, []*lab.Pod{backend}, nil)
	waitFrontend(t, n, netip.AddrPortFrom(empty6, 80), "TCP", "socket", 0)
	start := time.Now()
	if _, _, err := connectTCP(client.Netns, netip.AddrPortFrom(empty6, 80)); !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
		t.Fatalf("TCP to %s without IPv6 endpoints: %v after %v, want ECONNREFUSED at once", empty6, err, time.Since(start))
	}
	externalFrontends6(t, l, kube, client, backend)
}

// externalFrontends6: a dual-stack NodePort Service's IPv6 NodePort (on
// the node's IPv6 InternalIP) and IPv6 externalIP, and a dual-stack pod's
// hostPort on the node's IPv6 address, are served at the socket to the
// node's pods and host, with the IPv6 backends, and have their uplink
// entries (TestServicesFromOutsideIPv6 uses those); onctl services lists
// nothing as not served.
func externalFrontends6(t *testing.T, l *lab.Lab, kube kubernetes.Interface, client, backend *lab.Pod) {
	t.Helper()
	ctx := context.Background()
	n := l.Nodes[0]
	policy := corev1.IPFamilyPolicyRequireDualStack
	svc, err := kube.CoreV1().Services(svcNS).Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "ext6", Namespace: svcNS},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: map[string]string{"app": "web"}, IPFamilyPolicy: &policy,
			IPFamilies:  []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol},
			ExternalIPs: []string{"fd00:203::30"},
			Ports:       []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}}}},
		metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	writeSlice(t, kube, "ext6", discoveryv1.AddressTypeIPv4, []*lab.Pod{backend}, nil)
	writeSlice(t, kube, "ext6", discoveryv1.AddressTypeIPv6, []*lab.Pod{backend}, nil)
	hostPod, err := l.AddPodSpec(ctx, n, lab.PodSpec{Namespace: svcNS, Name: "hostport6",
		Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 18080, Protocol: corev1.ProtocolTCP}}})
	if err != nil {
		t.Fatal(err)
	}
	serveNameOn(listenOn(t, hostPod.Netns, "tcp6", 8080), listenPacketOn(t, hostPod.Netns, "udp6", 8053), hostPod.Name)
	for _, c := range []struct {
		what     string
		addr     netip.AddrPort
		frontend string
		want     *lab.Pod
	}{
		{"the IPv6 NodePort", netip.AddrPortFrom(n.IPv6, uint16(svc.Spec.Ports[0].NodePort)), "NodePort", backend},
		{"the IPv6 externalIP", netip.MustParseAddrPort("[fd00:203::30]:80"), "ExternalIP", backend},
		{"the hostPort on the node's IPv6 address", netip.AddrPortFrom(n.IPv6, 18080), "HostPort", hostPod},
	} {
		s := waitFrontend(t, n, c.addr, "TCP", "socket", 1)
		if want := c.want.IPv6.String(); s.Frontend != c.frontend || netip.MustParseAddrPort(s.Backends[0].Addr).Addr().String() != want {
			t.Fatalf("%s: %+v, want a %s to %s", c.what, s, c.frontend, want)
		}
		for _, netns := range []string{client.Netns, n.Netns} {
			if name, peer, err := connectTCP(netns, c.addr); err != nil || name != c.want.Name || peer != c.addr.String() {
				t.Fatalf("%s %s from %s: %q with peer %s, %v; want %s", c.what, c.addr, netns, name, peer, err, c.want.Name)
			}
		}
		if s := waitFrontend(t, n, c.addr, "TCP", "uplink", 1); s.Frontend != c.frontend {
			t.Fatalf("%s's uplink entry: %+v", c.what, s)
		}
	}
	out, err := exec.Command(l.BinDir+"/onctl", "--socket", n.AgentSocket(), "services").CombinedOutput()
	if err != nil {
		t.Fatalf("onctl services: %v\n%s", err, out)
	}
	if strings.Contains(string(out), "Not served") {
		t.Errorf("onctl services lists frontends as not served:\n%s", out)
	}
}
