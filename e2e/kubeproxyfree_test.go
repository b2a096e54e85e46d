//go:build e2e

package e2e

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/internal/testutil"
	"github.com/onc-net/onc/lab"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// Without kube-proxy (--kube-proxy-replacement), for clients on the
// cluster's nodes: every frontend a Service has is ONC's. The lab runs no
// kube-proxy at all, so a connection that reaches a backend was translated
// by ONC, and the counters of the frontend it dialled show it was there.
func TestWithoutKubeProxy(t *testing.T) {
	c := newServiceCluster(t, "--kube-proxy-replacement")
	t.Run("Status", c.replaced)
	t.Run("NodePort", c.nodePort)
	t.Run("ExternalAndLoadBalancerIPs", c.externalIPs)
	t.Run("InternalTrafficPolicyLocal", c.internalLocal)
	t.Run("HostPort", c.hostPort)
	t.Run("SCTPNotServed", c.sctp)
	t.Run("Metrics", c.frontendMetrics)
}

// The per-frontend metrics agree with onctl services: as many frontends
// of each type and scope, and the NodePort's translations.
func (c *serviceCluster) frontendMetrics(t *testing.T) {
	ctx := context.Background()
	n := c.l.Nodes[0]
	resp, err := agent(t, n).ListServices(ctx, &apiv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[[2]string]float64{}
	var translated float64
	for _, s := range resp.Services {
		want[[2]string{s.Frontend, s.Scope}]++
		if s.Frontend == "NodePort" && s.Scope == "socket" {
			translated += float64(s.Translated)
		}
	}
	targets, err := c.l.MetricsTargets(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mfs := scrape(t, targets[0]) // node 0's agent
	var wants []metricWant
	for k, v := range want {
		wants = append(wants, metricWant{"onc_services_frontends", map[string]string{"frontend": k[0], "scope": k[1]}, v})
	}
	wants = append(wants, metricWant{"onc_services_frontend_connections_total",
		map[string]string{"frontend": "NodePort", "scope": "socket", "outcome": "translated"}, translated})
	wantValues(t, n.Name, mfs, wants)
	if translated < 120 || want[[2]string{"NodePort", "uplink"}] == 0 {
		t.Errorf("onctl services on %s: %v, NodePort translations %v", n.Name, want, translated)
	}
}

// hostPort: a pod's hostPort (the kubelet's portMappings, through ONC's
// own capability) is served on its node's address; the pod's deletion
// takes it away.
func (c *serviceCluster) hostPort(t *testing.T) {
	ctx := context.Background()
	n := c.l.Nodes[0]
	p, err := c.l.AddPodSpec(ctx, n, lab.PodSpec{Namespace: svcNS, Name: "hostport",
		Ports: []corev1.ContainerPort{{ContainerPort: 8080, HostPort: 18080, Protocol: corev1.ProtocolTCP}}})
	if err != nil {
		t.Fatal(err)
	}
	serveName(t, p.Netns, p.Name)
	addr := netip.AddrPortFrom(n.IP, 18080)
	if s := waitFrontend(t, n, addr, "TCP", "socket", 1); s.Frontend != "HostPort" {
		t.Fatalf("%s: %+v, want a HostPort", addr, s)
	}
	waitFrontend(t, n, addr, "TCP", "uplink", 1)
	for _, netns := range []string{c.clients[0].Netns, n.Netns} {
		if name, _, err := connectTCP(netns, addr); err != nil || name != p.Name {
			t.Fatalf("hostPort %s from %s: %q, %v", addr, netns, name, err)
		}
	}
	if err := c.l.DelPod(ctx, n, p); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, "the hostPort gone", 10*time.Second, func() bool {
		resp, err := agent(t, n).ListServices(ctx, &apiv1.ListServicesRequest{})
		return err == nil && findService(resp, addr.String(), "TCP") == nil
	})
}

func (c *serviceCluster) replaced(t *testing.T) {
	st, err := c.l.Nodes[0].Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(st.KubeProxy, "replaced") {
		t.Fatalf("onctl status says kube-proxy %q, want replaced", st.KubeProxy)
	}
	// kube-proxy's conntrack setting, which the upstream suite checks.
	var closeWait []byte
	if err := lab.InNetns(c.l.Nodes[0].Netns, func() (err error) {
		closeWait, err = os.ReadFile("/proc/sys/net/netfilter/nf_conntrack_tcp_timeout_close_wait")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(closeWait)); got != "3600" {
		t.Errorf("nf_conntrack_tcp_timeout_close_wait = %s, want 3600 (kube-proxy's)", got)
	}
}

// waitFrontend waits until node serves addr/proto for scope with n
// backends, and returns the entry.
func waitFrontend(t *testing.T, node *lab.Node, addr netip.AddrPort, proto, scope string, n int) *apiv1.BalancedService {
	t.Helper()
	var last []*apiv1.BalancedService
	deadline := time.Now().Add(15 * time.Second)
	for {
		resp, err := agent(t, node).ListServices(context.Background(), &apiv1.ListServicesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range resp.Services {
			if s.Vip == addr.String() && s.Proto == proto && s.Scope == scope && len(s.Backends) == n {
				return s
			}
		}
		last = resp.Services
		if time.Now().After(deadline) {
			t.Fatalf("%s does not serve %s/%s (%s) with %d backends: %v", node.Name, addr, proto, scope, n, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// nodePort: a NodePort on the node's own address, dialled by its pods and
// its host, spreads over every backend; the peer reads as the NodePort;
// UDP too; and the node serves it to clients outside as well.
func (c *serviceCluster) nodePort(t *testing.T) {
	svc := c.serviceWith(t, "np", func(s *corev1.Service) { s.Spec.Type = corev1.ServiceTypeNodePort }, c.backends...)
	n := c.l.Nodes[0]
	tcp := netip.AddrPortFrom(n.IP, uint16(svc.Spec.Ports[0].NodePort))
	udp := netip.AddrPortFrom(n.IP, uint16(svc.Spec.Ports[1].NodePort))
	waitFrontend(t, n, tcp, "TCP", "socket", len(c.backends))
	if s := waitFrontend(t, n, tcp, "TCP", "uplink", len(c.backends)); s.Frontend != "NodePort" || s.KeepClient {
		t.Fatalf("the uplink entry: %+v, want a NodePort that does not keep the client", s)
	}
	const tries = 60
	for _, netns := range []string{c.clients[0].Netns, n.Netns} {
		requireEven(t, spreadOf(t, netns, tcp, tries), c.backends, tries)
	}
	seen := map[string]int{}
	for range tries {
		name, from, err := askUDP(c.clients[0].Netns, udp)
		if err != nil || from != udp.String() {
			t.Fatalf("UDP to %s: reply from %s, %v", udp, from, err)
		}
		seen[name]++
	}
	requireEven(t, seen, c.backends, tries)
	if s := waitFrontend(t, n, tcp, "TCP", "socket", len(c.backends)); s.Translated != 2*tries {
		t.Fatalf("the NodePort's socket entry counted %d translations, want %d", s.Translated, 2*tries)
	}
	// Another node's NodePort is that node's: not translated here.
	other := netip.AddrPortFrom(c.l.Nodes[1].IP, tcp.Port())
	resp, err := agent(t, n).ListServices(context.Background(), &apiv1.ListServicesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if findService(resp, other.String(), "TCP") != nil {
		t.Fatalf("%s serves %s, another node's NodePort", n.Name, other)
	}
}

// externalIPs and a load balancer's ingress IP are served at the socket on
// every node, with the cluster's backends; a Proxy-mode ingress IP is not.
func (c *serviceCluster) externalIPs(t *testing.T) {
	ctx := context.Background()
	const extIP, lbIP, proxyIP = "203.0.113.10", "203.0.113.20", "203.0.113.21"
	svc := c.serviceWith(t, "lb", func(s *corev1.Service) {
		s.Spec.Type = corev1.ServiceTypeLoadBalancer
		s.Spec.ExternalIPs = []string{extIP}
	}, c.backends...)
	svc.Status.LoadBalancer.Ingress = []corev1.LoadBalancerIngress{{IP: lbIP},
		{IP: proxyIP, IPMode: ptr.To(corev1.LoadBalancerIPModeProxy)}}
	if _, err := c.kube.CoreV1().Services(svcNS).UpdateStatus(ctx, svc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, n := range c.l.Nodes {
		for _, ip := range []string{extIP, lbIP} {
			addr := netip.AddrPortFrom(netip.MustParseAddr(ip), 80)
			waitFrontend(t, n, addr, "TCP", "socket", len(c.backends))
			waitFrontend(t, n, addr, "TCP", "uplink", len(c.backends))
			requireEven(t, spreadOf(t, c.clients[i].Netns, addr, 30), c.backends, 30)
		}
		resp, err := agent(t, n).ListServices(ctx, &apiv1.ListServicesRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if s := findService(resp, proxyIP+":80", "TCP"); s != nil {
			t.Fatalf("%s serves the Proxy-mode ingress IP: %+v", n.Name, s)
		}
	}
}

// internalTrafficPolicy Local: a node with no local endpoint refuses at
// once (no kube-proxy is there to drop), a node with some uses only those.
func (c *serviceCluster) internalLocal(t *testing.T) {
	onNode1 := c.backends[1:] // backends 1 and 2 run on node 1
	svc := c.serviceWith(t, "itp", func(s *corev1.Service) {
		s.Spec.InternalTrafficPolicy = ptr.To(corev1.ServiceInternalTrafficPolicyLocal)
	})
	writeEndpoints(t, c.kube, "itp", onNode1, nil)
	addr := netip.AddrPortFrom(netip.MustParseAddr(svc.Spec.ClusterIP), 80)
	waitFrontend(t, c.l.Nodes[1], addr, "TCP", "socket", len(onNode1))
	waitFrontend(t, c.l.Nodes[0], addr, "TCP", "socket", 0)
	if _, _, err := connectTCP(c.clients[0].Netns, addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("from node 0, without a local endpoint: %v, want ECONNREFUSED", err)
	}
	requireEven(t, spreadOf(t, c.clients[1].Netns, addr, 30), onNode1, 30)
}

// An SCTP port is served by nobody: onctl says so, and the Service gets a
// Warning event naming the node.
func (c *serviceCluster) sctp(t *testing.T) {
	ctx := context.Background()
	svc := c.serviceWith(t, "sctp", func(s *corev1.Service) {
		s.Spec.Ports = append(s.Spec.Ports, corev1.ServicePort{Name: "assoc", Protocol: corev1.ProtocolSCTP, Port: 9999})
	}, c.backends...)
	testutil.WaitFor(t, "the event on svc/sctp", 15*time.Second, func() bool {
		evs, err := c.kube.CoreV1().Events(svcNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.uid=" + string(svc.UID)})
		if err != nil {
			return false
		}
		for _, e := range evs.Items {
			if e.Type == corev1.EventTypeWarning && e.Reason == "ProtocolNotSupported" && strings.Contains(e.Message, "svc/sctp:assoc/SCTP") {
				return true
			}
		}
		return false
	})
	n := c.l.Nodes[0]
	out, err := exec.Command(c.l.BinDir+"/onctl", "--socket", n.AgentSocket(), "services").CombinedOutput()
	if err != nil {
		t.Fatalf("onctl services: %v\n%s", err, out)
	}
	for _, want := range []string{"Not served: svc/sctp:assoc/SCTP: SCTP", "Kube-proxy: replaced by ONC", "NodePort"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("onctl services lacks %q:\n%s", want, out)
		}
	}
}
