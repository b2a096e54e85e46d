package bench

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// The Service section's configs: netperf to a ClusterIP balanced by ONC's
// socket LB (kube-proxy running too, the supported hybrid), to the same
// ClusterIP through kube-proxy (iptables mode; socket LB off on the
// client's node), and straight to the server pod's IP.
const (
	SockLB    = "service-socklb"
	KubeProxy = "service-kubeproxy"
	PodIP     = "service-podip"
)

// ServiceConfigs in the order a rotation starts with.
var ServiceConfigs = []string{SockLB, KubeProxy, PodIP}

// ServiceTests are the tests the Service section runs (of Options.Tests).
var ServiceTests = []string{"TCP_RR", "TCP_CRR"}

const (
	benchNS = "bench"
	svcName = "netperf"
)

type namedPort struct {
	name string
	port int32
}

var (
	// ctlPort is netperf's control connection's, in every config.
	ctlPort = namedPort{"np-ctl", 12865}
	// dataPorts are the data connections' (netperf's test-specific -P),
	// one per config. With one shared port, a TCP_CRR connection through
	// kube-proxy that reuses the client port of a direct one still in
	// TIME_WAIT on the server (or the reverse) fails the server's PAWS
	// check, its TCP timestamps being derived from another destination
	// address, and waits a 1s SYN retransmission: a few of those halve a
	// 5s run (measured: TcpExtPAWSTimewait on the server).
	dataPorts = map[string]namedPort{SockLB: {"np-socklb", 12866}, KubeProxy: {"np-kubeproxy", 12867}, PodIP: {"np-podip", 12868}}
	// servicePorts are the Service's: the ClusterIP configs' ports.
	servicePorts = []namedPort{ctlPort, dataPorts[SockLB], dataPorts[KubeProxy]}
)

// AddPods adds the bench's two pods: the client on node 0 and the netperf
// server on node 1, the latter with the ports the Service targets; and,
// when the lab runs Flannel, a Flannel pod on each of the two nodes.
func AddPods(ctx context.Context, l *lab.Lab) error {
	if len(l.Nodes) < 2 {
		return fmt.Errorf("bench needs a lab with 2 nodes")
	}
	if _, err := l.AddPodSpec(ctx, l.Nodes[0], lab.PodSpec{Namespace: benchNS, Name: "client", Labels: map[string]string{"app": "client"}}); err != nil {
		return err
	}
	if _, err := l.AddPodSpec(ctx, l.Nodes[1], lab.PodSpec{Namespace: benchNS, Name: "server", Labels: map[string]string{"app": "netserver"},
		Ports: containerPorts(append(slices.Clone(servicePorts), dataPorts[PodIP]))}); err != nil {
		return err
	}
	if l.Flannel == nil {
		return nil
	}
	for _, n := range l.Nodes[:2] {
		if _, err := l.AddFlannelPod(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

func containerPorts(ports []namedPort) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, p := range ports {
		out = append(out, corev1.ContainerPort{Name: p.name, ContainerPort: p.port, Protocol: corev1.ProtocolTCP})
	}
	return out
}

// socketLBMode is the client node's --services in each config. The pod IP
// baseline runs with it on, as the nodes of a cluster that uses it are.
func socketLBMode(cfg string) string {
	if cfg == KubeProxy {
		return "off"
	}
	return "all"
}

// RunServices measures the Service configs: kube-proxy on every node, a
// ClusterIP Service with an EndpointSlice naming the server pod, then
// every test of ServiceTests in o.Tests on every config, o.Reps times,
// rotating the config order each repetition. The client node's agent is
// restarted whenever the socket-LB mode changes; the fast path is on.
func RunServices(ctx context.Context, o Options) (out []Sample, err error) {
	l := o.Lab
	client, server, err := pair(l)
	if err != nil {
		return nil, err
	}
	cpod, spod := client.Pods[0], server.Pods[0]
	defer func() {
		if client.AgentArgs != nil { // restarted in another mode: back to the lab's
			err = errors.Join(err, l.RestartAgent(context.WithoutCancel(ctx), client))
		}
	}()
	tests := testsOf(o.Tests, ServiceTests)
	for _, n := range l.Nodes {
		// No periodic resync: it would rewrite KUBE-SERVICES and reset the
		// rule counters that show which path translated.
		if err := l.StartKubeProxy(ctx, n, lab.ProxyIPTables, "--iptables-sync-period", "1h"); err != nil {
			return nil, err
		}
		defer n.KubeProxy.Stop()
	}
	vip, err := createService(ctx, l, spod)
	if err != nil {
		return nil, err
	}
	if err := waitKubeProxy(ctx, client.Netns, vip); err != nil {
		return nil, err
	}
	stop, err := Netservers(o.Netperf, spod.Netns)
	if err != nil {
		return nil, err
	}
	defer stop()
	fmt.Fprintf(o.Log, "Service %s/%s: ClusterIP %s → %s (%s), kube-proxy on every node\n", benchNS, svcName, vip, spod.IP, spod.Key())
	for rep := 0; rep < o.Reps; rep++ {
		for _, test := range tests {
			for i := range ServiceConfigs {
				cfg := ServiceConfigs[(i+rep)%len(ServiceConfigs)]
				s, err := serviceRun(ctx, o, client, cpod, vip, spod.IP, test, cfg)
				if err != nil {
					return nil, fmt.Errorf("%s %s: %w", test, cfg, err)
				}
				s.Rep = rep + 1
				fmt.Fprintf(o.Log, "rep %d/%d  %-10s %-17s %12.1f %s  cpu %.2f %s\n", rep+1, o.Reps, test, cfg, s.Value, s.Unit, s.CPU, s.CPUUnit)
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// serviceRun puts the client's node in cfg's socket-LB mode, runs one
// netperf and checks that the connections took cfg's path: translated at
// the socket and never by kube-proxy (socklb), by kube-proxy (kubeproxy),
// by neither (podip).
func serviceRun(ctx context.Context, o Options, client *lab.Node, cpod *lab.Pod, vip, pod netip.Addr, test, cfg string) (Sample, error) {
	mode := socketLBMode(cfg)
	if err := setSocketLB(ctx, o.Lab, client, mode, vip); err != nil {
		return Sample{}, err
	}
	host := vip
	if cfg == PodIP {
		host = pod
	}
	if err := forgetConnections(ctx, client, cpod.IP); err != nil {
		return Sample{}, err
	}
	before, err := pathCounters(ctx, client, vip, mode)
	if err != nil {
		return Sample{}, err
	}
	s, err := Netperf(ctx, o.Netperf, cpod.Netns, host.String(), test, o.Duration, o.CPUs, int(dataPorts[cfg].port))
	if err != nil {
		return Sample{}, err
	}
	after, err := pathCounters(ctx, client, vip, mode)
	if err != nil {
		return Sample{}, err
	}
	sock, kp := after.socket-before.socket, after.kubeProxy-before.kubeProxy
	switch {
	case cfg == SockLB && (sock == 0 || kp != 0):
		err = fmt.Errorf("socket LB translated %d connections, kube-proxy %d: want some and none", sock, kp)
	case cfg == KubeProxy && kp == 0:
		err = fmt.Errorf("kube-proxy translated no connection")
	case cfg == PodIP && (sock != 0 || kp != 0):
		err = fmt.Errorf("connections to the pod IP were translated (socket LB %d, kube-proxy %d)", sock, kp)
	}
	s.Config = cfg
	return s, err
}

// forgetConnections flushes the client node's flow cache and its
// conntrack entries of the client pod's earlier connections, so that every
// measurement starts alike. It also keeps the control connections, whose
// port all configs share, clear of a fast-path flaw: a cached flow
// outlives its connection, so a kube-proxy connection whose reply matches
// a flow cached from an earlier direct one on the same ports is delivered
// without its reverse DNAT, and a direct one whose source port conntrack
// remapped (its reply tuple clashing with a kube-proxy connection's in
// TIME_WAIT) leaves on the fast path unmapped; either stalls for good.
func forgetConnections(ctx context.Context, n *lab.Node, ip netip.Addr) error {
	c, conn, err := n.AgentAPI()
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := c.FlushCache(ctx, &apiv1.FlushCacheRequest{}); err != nil {
		return fmt.Errorf("%s: flush the flow cache: %w", n.Name, err)
	}
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.Netns, "conntrack", "-D", "-s", ip.String()).CombinedOutput()
	if err != nil && !strings.Contains(string(out), " 0 flow entries") { // conntrack fails when it deleted none
		return fmt.Errorf("%s: conntrack -D -s %s: %w: %s", n.Name, ip, err, out)
	}
	return nil
}

// setSocketLB restarts the client's agent if its socket-LB mode is not
// mode, then checks the mode as onctl would see it: ListServices balances
// the Service ("all") or refuses with FAILED_PRECONDITION ("off").
func setSocketLB(ctx context.Context, l *lab.Lab, n *lab.Node, mode string, vip netip.Addr) error {
	st, err := n.Status(ctx)
	if err != nil {
		return err
	}
	if socketLBOf(st) != mode {
		if err := l.RestartAgent(ctx, n, "--services="+mode); err != nil {
			return err
		}
		if err := fastPath(ctx, l, true); err != nil {
			return err
		}
		time.Sleep(2 * time.Second) // let the restarted agent's reconciles settle
	}
	if st, err = n.Status(ctx); err != nil {
		return err
	}
	if socketLBOf(st) != mode {
		return fmt.Errorf("%s: socket LB %q after restart with --services=%s", n.Name, st.SocketLb, mode)
	}
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		svcs, err := listServices(ctx, n)
		switch {
		case mode == "off" && status.Code(err) == codes.FailedPrecondition:
			return nil
		case mode == "off":
			return fmt.Errorf("%s: ListServices with socket LB off: %v, want FAILED_PRECONDITION", n.Name, err)
		case err != nil:
			return err
		}
		if balanced(svcs, vip) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not balance the %d ports of %s with the server pod within 15s", n.Name, len(servicePorts), vip)
		}
	}
}

// socketLBOf is the mode in a status's socket-LB line ("all", or "off
// (--services=off): ...").
func socketLBOf(st *apiv1.NodeStatus) string {
	mode, _, _ := strings.Cut(st.SocketLb, " ")
	return mode
}

func listServices(ctx context.Context, n *lab.Node) (*apiv1.ListServicesResponse, error) {
	c, conn, err := n.AgentAPI()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return c.ListServices(ctx, &apiv1.ListServicesRequest{})
}

// balanced: every port of the Service has exactly one backend.
func balanced(resp *apiv1.ListServicesResponse, vip netip.Addr) bool {
	n := 0
	for _, s := range resp.Services {
		if isOurs(s, vip) && len(s.Backends) == 1 {
			n++
		}
	}
	return n == len(servicePorts)
}

func isOurs(s *apiv1.BalancedService, vip netip.Addr) bool {
	addr, err := netip.ParseAddrPort(s.Vip)
	return err == nil && addr.Addr() == vip && s.Proto == "TCP"
}

// counters of the connections to the ClusterIP each path translated.
type counters struct{ socket, kubeProxy uint64 }

// pathCounters reads n's socket-LB translations of the Service's ports
// (none when mode is off) and the packets kube-proxy's KUBE-SERVICES
// rules for the ClusterIP matched (NAT rules see a connection's first).
func pathCounters(ctx context.Context, n *lab.Node, vip netip.Addr, mode string) (counters, error) {
	var c counters
	if mode != "off" {
		resp, err := listServices(ctx, n)
		if err != nil {
			return c, err
		}
		for _, s := range resp.Services {
			if isOurs(s, vip) {
				c.socket += s.Translated
			}
		}
	}
	var err error
	c.kubeProxy, _, err = kubeProxyRules(n.Netns, vip)
	return c, err
}

// kubeProxyRules sums the packet counters of the KUBE-SERVICES rules for
// vip in netns's nat table, and counts them.
func kubeProxyRules(netns string, vip netip.Addr) (pkts uint64, rules int, err error) {
	out, err := exec.Command("ip", "netns", "exec", netns, "iptables-save", "-c", "-t", "nat").CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("iptables-save in %s: %w: %s", netns, err, out)
	}
	match := "-A KUBE-SERVICES -d " + vip.String() + "/32 "
	for _, line := range strings.Split(string(out), "\n") {
		// "[packets:bytes] -A KUBE-SERVICES -d VIP/32 -p tcp ... -j KUBE-SVC-..."
		counts, rule, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(rule, match) {
			continue
		}
		p, _, _ := strings.Cut(strings.Trim(counts, "[]"), ":")
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("iptables-save in %s: %q: %w", netns, line, err)
		}
		pkts += v
		rules++
	}
	return pkts, rules, nil
}

// waitKubeProxy waits until kube-proxy in netns has a rule for each of the
// Service's ports.
func waitKubeProxy(ctx context.Context, netns string, vip netip.Addr) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, rules, err := kubeProxyRules(netns, vip)
		if err != nil || rules == len(servicePorts) {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-proxy in %s has %d KUBE-SERVICES rules for %s after 30s, want %d", netns, rules, vip, len(servicePorts))
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// createService creates the ClusterIP Service of netperf's two ports and
// its EndpointSlice, written as the endpoint controller would: owned by
// the Service, the server pod ready, with its node and its Pod as target.
func createService(ctx context.Context, l *lab.Lab, server *lab.Pod) (netip.Addr, error) {
	kube, err := l.Kube()
	if err != nil {
		return netip.Addr{}, err
	}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: svcName, Namespace: benchNS},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "netserver"}}}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: svcName + "-x7k2p", Namespace: benchNS, Labels: map[string]string{
			discoveryv1.LabelServiceName: svcName, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints: []discoveryv1.Endpoint{{Addresses: []string{server.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(server.Node),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: benchNS, Name: server.Name, UID: types.UID(server.UID)}}},
	}
	for _, p := range servicePorts {
		svc.Spec.Ports = append(svc.Spec.Ports, corev1.ServicePort{Name: p.name, Protocol: corev1.ProtocolTCP, Port: p.port,
			TargetPort: intstr.FromString(p.name)})
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(p.port)})
	}
	created, err := kube.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return netip.Addr{}, fmt.Errorf("service: %w", err)
	}
	slice.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svcName, UID: created.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	if _, err := kube.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return netip.Addr{}, fmt.Errorf("endpointslice: %w", err)
	}
	return netip.ParseAddr(created.Spec.ClusterIP)
}
