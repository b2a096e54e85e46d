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
	dpservices "github.com/onc-net/onc/datapath/services"
	"github.com/onc-net/onc/lab"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
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

// namedPort is a Service's port: name, number (the Service's and the
// container's), and on a NodePort Service its nodePort.
type namedPort struct {
	name     string
	port     int32
	nodePort int32
}

var (
	// ctlPort is netperf's control connection's, in every config.
	ctlPort = namedPort{"np-ctl", 12865, 0}
	// dataPorts are the data connections' (netperf's test-specific -P),
	// one per config. With one shared port, a TCP_CRR connection through
	// kube-proxy that reuses the client port of a direct one still in
	// TIME_WAIT on the server (or the reverse) fails the server's PAWS
	// check, its TCP timestamps being derived from another destination
	// address, and waits a 1s SYN retransmission: a few of those halve a
	// 5s run (measured: TcpExtPAWSTimewait on the server).
	dataPorts = map[string]namedPort{SockLB: {"np-socklb", 12866, 0}, KubeProxy: {"np-kubeproxy", 12867, 0}, PodIP: {"np-podip", 12868, 0}}
	// servicePorts are the Service's: the ClusterIP configs' ports.
	servicePorts = []namedPort{ctlPort, dataPorts[SockLB], dataPorts[KubeProxy]}
)

// AddPods adds the bench's two pods: the client on node 0 and the netperf
// server on node 1, the latter with the ports the Services target; and,
// when the lab runs Flannel, a Flannel pod on each of the two nodes.
func AddPods(ctx context.Context, l *lab.Lab) error {
	if len(l.Nodes) < 2 {
		return fmt.Errorf("bench needs a lab with 2 nodes")
	}
	if _, err := l.AddPodSpec(ctx, l.Nodes[0], lab.PodSpec{Namespace: benchNS, Name: "client", Labels: map[string]string{"app": "client"}}); err != nil {
		return err
	}
	if _, err := l.AddPodSpec(ctx, l.Nodes[1], lab.PodSpec{Namespace: benchNS, Name: "server", Labels: map[string]string{"app": "netserver"},
		Ports: containerPorts(slices.Concat(servicePorts, []namedPort{dataPorts[PodIP]}, nodePortDataPorts()))}); err != nil {
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
// restarted whenever the socket-LB mode changes; the fast path is on. A
// run whose path check fails is a sample with its reason, and the section
// goes on.
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
	svc, err := createService(ctx, l, clusterIPService(spod))
	if err != nil {
		return nil, err
	}
	vip := svc.clusterIP
	if err := waitKubeProxy(ctx, client.Netns, clusterIPs(vip, servicePorts)); err != nil {
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
				logSample(o, s)
				out = append(out, s)
			}
		}
	}
	return out, nil
}

// logSample prints a run as it ends, or why it failed.
func logSample(o Options, s Sample) {
	what := fmt.Sprintf("%-10s %-24s", s.Test, s.Config)
	if s.Size > 0 {
		what = fmt.Sprintf("%-10s %5d B %-16s", s.Test, s.Size, s.Config)
	}
	if s.Error != "" {
		fmt.Fprintf(o.Log, "rep %d/%d  %s FAILED: %s\n", s.Rep, o.Reps, what, oneLine(s.Error))
		return
	}
	fmt.Fprintf(o.Log, "rep %d/%d  %s %12.1f %s  cpu %.2f %s\n", s.Rep, o.Reps, what, s.Value, s.Unit, s.CPU, s.CPUUnit)
}

// serviceRun puts the client's node in cfg's socket-LB mode and runs one
// path-checked netperf: translated at the socket and by no netfilter rule
// (socklb), by kube-proxy's rules (kubeproxy), by neither (podip). An
// error is the lab's; a failed run or check is the sample's Error.
func serviceRun(ctx context.Context, o Options, client *lab.Node, cpod *lab.Pod, vip, pod netip.Addr, test, cfg string) (Sample, error) {
	if err := setSocketLB(ctx, o.Lab, client, socketLBMode(cfg), vip); err != nil {
		return Sample{}, err
	}
	if err := forgetConnections(ctx, []*lab.Node{client}, cpod.IP); err != nil {
		return Sample{}, err
	}
	data := dataPorts[cfg].port
	host, f := vip, frontend{netip.AddrPortFrom(vip, uint16(data)), dpservices.ClusterIP}
	if cfg == PodIP {
		// Its data port is no port of the Service: watch all of them.
		host, f.addr = pod, netip.AddrPortFrom(vip, 0)
	}
	read := func() (paths, error) { return readPaths(ctx, client, f, pod) }
	s := pathChecked(ctx, o, cpod.Netns, netip.AddrPortFrom(host, uint16(ctlPort.port)), data, test, read, func(d paths) error {
		switch {
		case cfg == SockLB && (d.socket == 0 || d.iptables != 0 || d.natted != 0):
			return fmt.Errorf("socket LB translated %d connections, kube-proxy %d, netfilter %d: want some, none and none", d.socket, d.iptables, d.natted)
		case cfg == KubeProxy && d.iptables == 0:
			return fmt.Errorf("kube-proxy translated no connection")
		case cfg == PodIP && (d.socket != 0 || d.iptables != 0):
			return fmt.Errorf("connections to the pod IP were translated (socket LB %d, kube-proxy %d)", d.socket, d.iptables)
		}
		return nil
	})
	s.Config = cfg
	return s, nil
}

// pathChecked runs one netperf from netns, its control connection to ctl
// and its data connections to ctl's address at port data, between two
// readings of the paths, and judges what they did with check. A failed
// reading, run or check is the sample's Error, its value kept but counted
// nowhere: the report lists it as a failed run with its reason.
func pathChecked(ctx context.Context, o Options, netns string, ctl netip.AddrPort, data int32, test string,
	read func() (paths, error), check func(paths) error) Sample {
	var s Sample
	before, err := read()
	if err == nil {
		s, err = netperfAt(ctx, o.Netperf, netns, ctl, test, o.Duration, o.CPUs, int(data))
	}
	if err == nil {
		var after paths
		if after, err = read(); err == nil {
			err = check(after.since(before))
		}
	}
	s.Test = test
	if err != nil {
		s.Error = err.Error()
	}
	return s
}

// forgetConnections flushes the nodes' flow caches and their conntrack
// entries of ip's earlier connections, so that every measurement starts
// alike. It also keeps the control connections, whose port all configs
// share, clear of a fast-path flaw: a cached flow outlives its
// connection, so a kube-proxy connection whose reply matches a flow cached
// from an earlier direct one on the same ports is delivered without its
// reverse DNAT, and a direct one whose source port conntrack remapped (its
// reply tuple clashing with a kube-proxy connection's in TIME_WAIT) leaves
// on the fast path unmapped; either stalls for good.
func forgetConnections(ctx context.Context, nodes []*lab.Node, ip netip.Addr) error {
	for _, n := range nodes {
		c, conn, err := n.AgentAPI()
		if err != nil {
			return err
		}
		_, err = c.FlushCache(ctx, &apiv1.FlushCacheRequest{})
		conn.Close()
		if err != nil {
			return fmt.Errorf("%s: flush the flow cache: %w", n.Name, err)
		}
		out, err := exec.CommandContext(ctx, "ip", "netns", "exec", n.Netns, "conntrack", "-D", "-s", ip.String()).CombinedOutput()
		if err != nil && !strings.Contains(string(out), " 0 flow entries") { // conntrack fails when it deleted none
			return fmt.Errorf("%s: conntrack -D -s %s: %w: %s", n.Name, ip, err, out)
		}
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
		settle()
		if err := SetFastPath(ctx, l, true); err != nil {
			return err
		}
	}
	if st, err = n.Status(ctx); err != nil {
		return err
	}
	if socketLBOf(st) != mode {
		return fmt.Errorf("%s: socket LB %q after restart with --services=%s", n.Name, st.SocketLb, mode)
	}
	if mode == "off" {
		if _, err := listServices(ctx, n); status.Code(err) != codes.FailedPrecondition {
			return fmt.Errorf("%s: ListServices with socket LB off: %v, want FAILED_PRECONDITION", n.Name, err)
		}
		return nil
	}
	return waitBalanced(ctx, n, clusterIPs(vip, servicePorts), dpservices.Socket)
}

// socketLBOf is the mode in a status's socket-LB line ("all", or "off
// (--services=off): ...").
func socketLBOf(st *apiv1.NodeStatus) string {
	mode, _, _ := strings.Cut(st.SocketLb, " ")
	return mode
}

// listServices is onctl services. At 10,000 Services of 10 endpoints the
// answer is megabytes, past gRPC's default 4 MiB limit.
func listServices(ctx context.Context, n *lab.Node) (*apiv1.ListServicesResponse, error) {
	c, conn, err := n.AgentAPI()
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return c.ListServices(ctx, &apiv1.ListServicesRequest{}, grpc.MaxCallRecvMsgSize(1<<30))
}

// waitBalanced waits until n balances each of fronts in scope with exactly
// one backend.
func waitBalanced(ctx context.Context, n *lab.Node, fronts []frontend, scope dpservices.Scope) error {
	var last string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		resp, err := listServices(ctx, n)
		if err != nil {
			return err
		}
		missing := slices.DeleteFunc(slices.Clone(fronts), func(f frontend) bool {
			return slices.ContainsFunc(resp.Services, func(s *apiv1.BalancedService) bool {
				return f.is(s) && s.Scope == scope.String() && len(s.Backends) == 1
			})
		})
		if len(missing) == 0 {
			return nil
		}
		last = fmt.Sprint(missing)
		if time.Now().After(deadline) {
			return fmt.Errorf("%s does not balance %s with the server pod (%s scope) within 15s", n.Name, last, scope)
		}
	}
}

// A frontend the bench measures: the address:port clients connect to,
// port 0 for every port of the address, and its kind.
type frontend struct {
	addr netip.AddrPort
	kind dpservices.Frontend
}

func (f frontend) String() string { return f.kind.String() + " " + f.addr.String() }

func clusterIPs(vip netip.Addr, ports []namedPort) []frontend {
	var out []frontend
	for _, p := range ports {
		out = append(out, frontend{netip.AddrPortFrom(vip, uint16(p.port)), dpservices.ClusterIP})
	}
	return out
}

// is: s is f's entry in onctl services (either scope's).
func (f frontend) is(s *apiv1.BalancedService) bool {
	addr, err := netip.ParseAddrPort(s.Vip)
	return err == nil && s.Proto == "TCP" && s.Frontend == f.kind.String() &&
		addr.Addr() == f.addr.Addr() && (f.addr.Port() == 0 || addr.Port() == f.addr.Port())
}

// kubeProxyRule: rule (iptables-save) is kube-proxy's first match of
// f's connections: a KUBE-SERVICES rule for a ClusterIP, a KUBE-NODEPORTS
// rule for a NodePort (any of the node's addresses).
func (f frontend) kubeProxyRule(rule string) bool {
	if p := f.addr.Port(); p != 0 && !strings.Contains(rule, " --dport "+strconv.Itoa(int(p))+" ") {
		return false
	}
	if f.kind == dpservices.NodePort {
		return strings.HasPrefix(rule, "-A KUBE-NODEPORTS ")
	}
	return strings.HasPrefix(rule, "-A KUBE-SERVICES -d "+f.addr.Addr().String()+"/32 ")
}

// paths is what each path that may translate a frontend's connections did
// on one node.
type paths struct {
	// ONC's translations: at the socket, and on the uplink (onctl services;
	// none while the socket LB is off).
	socket, uplink uint64
	// Packets kube-proxy's iptables rules for the frontend matched (NAT
	// rules see a connection's first), and how many such rules there are.
	iptables      uint64
	iptablesRules int
	// Connections netfilter translated from the frontend to the backend,
	// as conntrack holds them: kube-proxy's in either mode. nftables mode
	// writes no counters, so this is its evidence; ONC's translations
	// happen before conntrack sees the packets, so they never count here.
	natted uint64
	// Packets ONC's uplink sent to a backend's node directly (direct
	// server return: dsr_sent), and whether the backend is on another
	// node than the one read, the only case that sends any.
	dsrSent uint64
	remote  bool
	// Packets ONC's uplink translated to any backend (uplink_translated).
	uplinkAll uint64
}

// since is what happened between an earlier reading and p. natted is a
// count of entries, not a counter: the run's, since forgetConnections
// flushed the client's before it. A counter that went back (kube-proxy
// rewrote its chain) counts from zero.
func (p paths) since(earlier paths) paths {
	d := func(now, then uint64) uint64 {
		if now < then {
			return now
		}
		return now - then
	}
	return paths{socket: d(p.socket, earlier.socket), uplink: d(p.uplink, earlier.uplink),
		iptables: d(p.iptables, earlier.iptables), iptablesRules: p.iptablesRules, natted: p.natted,
		dsrSent: d(p.dsrSent, earlier.dsrSent), remote: p.remote, uplinkAll: d(p.uplinkAll, earlier.uplinkAll)}
}

// readPaths reads n's paths for connections to f whose backend is
// backend.
func readPaths(ctx context.Context, n *lab.Node, f frontend, backend netip.Addr) (paths, error) {
	var p paths
	resp, err := listServices(ctx, n)
	switch {
	case status.Code(err) == codes.FailedPrecondition: // socket LB off: ONC translates nothing
	case err != nil:
		return p, err
	default:
		for _, c := range resp.Counters {
			switch c.Name {
			case "dsr_sent":
				p.dsrSent = c.Value
			case "uplink_translated":
				p.uplinkAll = c.Value
			}
		}
		for _, s := range resp.Services {
			switch {
			case !f.is(s):
			case s.Scope == dpservices.Uplink.String():
				p.uplink += s.Translated
			default:
				p.socket += s.Translated
			}
		}
	}
	if p.iptables, p.iptablesRules, err = iptablesRules(ctx, n.Netns, f.kubeProxyRule); err != nil {
		return p, err
	}
	p.natted, err = natted(ctx, n.Netns, f.addr, backend)
	return p, err
}

// iptablesRules sums the packet counters of the rules in netns's nat
// table that match, and counts them.
func iptablesRules(ctx context.Context, netns string, match func(rule string) bool) (pkts uint64, rules int, err error) {
	out, err := exec.CommandContext(ctx, "ip", "netns", "exec", netns, "iptables-save", "-c", "-t", "nat").CombinedOutput()
	if err != nil {
		return 0, 0, fmt.Errorf("iptables-save in %s: %w: %s", netns, err, out)
	}
	pkts, rules, err = countRules(string(out), match)
	if err != nil {
		return 0, 0, fmt.Errorf("iptables-save in %s: %w", netns, err)
	}
	return pkts, rules, nil
}

// countRules sums the packet counters of iptables-save -c's rules that
// match ("[packets:bytes] -A CHAIN ..."), and counts them.
func countRules(save string, match func(rule string) bool) (pkts uint64, rules int, err error) {
	for _, line := range strings.Split(save, "\n") {
		counts, rule, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(counts, "[") || !match(rule) {
			continue
		}
		p, _, _ := strings.Cut(strings.Trim(counts, "[]"), ":")
		v, err := strconv.ParseUint(p, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("%q: %w", line, err)
		}
		pkts += v
		rules++
	}
	return pkts, rules, nil
}

// natted counts netns's conntrack entries of TCP connections to f (port 0:
// any) that netfilter translated to backend.
func natted(ctx context.Context, netns string, f netip.AddrPort, backend netip.Addr) (uint64, error) {
	args := []string{"netns", "exec", netns, "conntrack", "-L", "-p", "tcp", "-d", f.Addr().String(), "-r", backend.String()}
	if f.Port() != 0 {
		args = append(args, "--dport", strconv.Itoa(int(f.Port())))
	}
	// The entries go to stdout, the count of them to stderr.
	out, err := exec.CommandContext(ctx, "ip", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			err = fmt.Errorf("%w: %s", err, ee.Stderr)
		}
		return 0, fmt.Errorf("conntrack -L in %s: %w", netns, err)
	}
	return uint64(strings.Count(string(out), "\n")), nil
}

// waitKubeProxy waits until kube-proxy (iptables mode) in netns has a rule
// for each of fronts.
func waitKubeProxy(ctx context.Context, netns string, fronts []frontend) error {
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		var missing []frontend
		for _, f := range fronts {
			_, rules, err := iptablesRules(ctx, netns, f.kubeProxyRule)
			if err != nil {
				return err
			}
			if rules == 0 {
				missing = append(missing, f)
			}
		}
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("kube-proxy in %s has no rule for %v after 30s", netns, missing)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
	}
}

// serviceSpec is a Service the bench writes, and its EndpointSlice, as
// the endpoint controller would: one slice owned by the Service, every
// endpoint ready; a pod endpoint names its node and Pod.
type serviceSpec struct {
	name     string
	nodePort bool // type NodePort, each port's nodePort set
	ports    []namedPort
	pods     []*lab.Pod   // real backends
	fakes    []netip.Addr // backends no process answers at, for the scale bench
}

// createdService is what the API made of a serviceSpec.
type createdService struct{ clusterIP netip.Addr }

func clusterIPService(server *lab.Pod) serviceSpec {
	return serviceSpec{name: svcName, ports: servicePorts, pods: []*lab.Pod{server}}
}

// createService creates spec's Service and its EndpointSlice in the bench
// namespace with kube.
func createService(ctx context.Context, l *lab.Lab, spec serviceSpec) (createdService, error) {
	kube, err := l.Kube()
	if err != nil {
		return createdService{}, err
	}
	return createServiceWith(ctx, kube, spec)
}

func createServiceWith(ctx context.Context, kube kubernetes.Interface, spec serviceSpec) (createdService, error) {
	svc, slice := spec.objects()
	created, err := kube.CoreV1().Services(benchNS).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return createdService{}, fmt.Errorf("service %s: %w", spec.name, err)
	}
	slice.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: spec.name, UID: created.UID,
		Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
	if _, err := kube.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, slice, metav1.CreateOptions{}); err != nil {
		return createdService{}, fmt.Errorf("endpointslice of %s: %w", spec.name, err)
	}
	ip, err := netip.ParseAddr(created.Spec.ClusterIP)
	return createdService{clusterIP: ip}, err
}

// objects are spec's Service and EndpointSlice (without its owner, the
// Service's UID being the API's).
func (spec serviceSpec) objects() (*corev1.Service, *discoveryv1.EndpointSlice) {
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: spec.name, Namespace: benchNS},
		Spec: corev1.ServiceSpec{Selector: map[string]string{"app": "netserver"}}}
	if spec.nodePort {
		svc.Spec.Type = corev1.ServiceTypeNodePort
	}
	slice := &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Name: spec.name + "-x7k2p", Namespace: benchNS, Labels: map[string]string{
			discoveryv1.LabelServiceName: spec.name, discoveryv1.LabelManagedBy: "endpointslice-controller.k8s.io"}},
		AddressType: discoveryv1.AddressTypeIPv4,
	}
	ready := discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)}
	for _, p := range spec.pods {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{p.IP.String()}, Conditions: ready,
			NodeName: ptr.To(p.Node), TargetRef: &corev1.ObjectReference{Kind: "Pod", Namespace: benchNS, Name: p.Name, UID: types.UID(p.UID)}})
	}
	for _, a := range spec.fakes {
		slice.Endpoints = append(slice.Endpoints, discoveryv1.Endpoint{Addresses: []string{a.String()}, Conditions: ready})
	}
	for _, p := range spec.ports {
		sp := corev1.ServicePort{Name: p.name, Protocol: corev1.ProtocolTCP, Port: p.port, TargetPort: intstr.FromString(p.name)}
		if spec.nodePort {
			sp.NodePort = p.nodePort
		}
		svc.Spec.Ports = append(svc.Spec.Ports, sp)
		slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{Name: ptr.To(p.name), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To(p.port)})
	}
	return svc, slice
}
