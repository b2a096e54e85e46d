// Package trace answers onctl trace (docs/observability.md): what ONC
// does with a new connection from a pod of this node, hop by hop — the
// socket LB's translation, the egress policy with its deciding rule, how
// this node forwards it, and the destination's ingress policy — from the
// agent's own state and, for a pod of another node, that node's agent's
// own answer (Ingress, through agent/peer), never by sending a packet.
package trace

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/onc-net/onc/agent/flows"
	agentpolicy "github.com/onc-net/onc/agent/policy"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/l4"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/policy"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Steps of a trace.
const (
	StepSocketLB   = "socket-lb"
	StepEgress     = "egress-policy"
	StepForwarding = "forwarding"
	StepIngress    = "ingress-policy"
)

// Bases of a hop: this agent's own state, another node's own answer from
// what it enforces, or another node's verdict this agent computed from the
// cluster's policies (when that node could not answer).
const (
	BasisHere     = "here"
	BasisEnforced = "enforced"
	BasisComputed = "computed"
)

// PeerWait bounds how long a trace waits for one node's answer (each node
// is asked once: a node that gave none is not asked again in the trace).
var PeerWait = 2 * time.Second

// maxBackends bounds the paths a Service's trace forks into.
const maxBackends = 16

// FastPath is what a trace reads of the flow cache (datapath.FastPath).
type FastPath interface {
	Enabled() bool
	Dests() ([]fastpath.Dest, error)
	Encaps() ([]fastpath.Encap, error)
	Flows() ([]fastpath.Flow, error)
}

// State is what a trace reads of the agent.
type State struct {
	Node    string
	Rules   func() policy.Ruleset       // this node's pods, as last enforced
	Cluster func() agentpolicy.Snapshot // the cluster's pods, namespaces and policies
	// Services are the socket LB's frontends; nil without it.
	Services func() (*apiv1.ListServicesResponse, error)
	FastPath func() FastPath // nil while not loaded
	Bypass   func() *apiv1.BypassState
	// Lookup is the node kernel's forwarding of a packet from src, that
	// arrived on iif, to dst (overlay.Lookup).
	Lookup func(iif string, src, dst netip.Addr) (overlay.Forwarding, error)
	// Netns is the path of a local pod's network namespace, by pod key,
	// and Records this node's flow records since a time of packets from
	// an address and port: for probes.
	Netns   func(podKey string) string
	Records func(since time.Time, from netip.AddrPort) []*apiv1.FlowRecord
	// Peer asks another node's agent about a packet to one of its pods
	// (agent/peer); nil when this node's peer API is off.
	Peer func(ctx context.Context, node string, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error)
}

// request is a parsed TraceRequest.
type request struct {
	proto l4.Proto
	port  uint16
}

// Trace answers req.
func Trace(ctx context.Context, st State, req *apiv1.TraceRequest) (*apiv1.TraceResponse, error) {
	var r request
	var err error
	if r.proto, r.port, err = parseL4(req.Protocol, req.Port); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	if req.Probe && r.proto == l4.SCTP {
		return nil, status.Error(codes.InvalidArgument, "probe: SCTP is not probed (kernels may have no SCTP sockets); trace it without the probe")
	}
	if req.Source == "" || req.Destination == "" {
		return nil, status.Error(codes.InvalidArgument, "source and destination: both needed (namespace/name of a pod, or an address)")
	}
	t := &tracer{State: st, rules: st.Rules(), cluster: st.Cluster(), request: r, unanswered: map[string]string{}}
	src, err := t.source(req.Source)
	if err != nil {
		return nil, err
	}
	dst, err := t.destination(req.Destination, src)
	if err != nil {
		return nil, err
	}
	resp := &apiv1.TraceResponse{Source: endpoint(t.srcEnd(src, dst.ip)), Destination: endpoint(dst), Protocol: r.proto.String()}
	hop, dsts, err := t.socketLB(dst)
	if err != nil {
		return nil, err
	}
	if hop != nil {
		resp.Hops = append(resp.Hops, hop)
	}
	t.compileRemote(dsts)
	for _, d := range dsts {
		resp.Paths = append(resp.Paths, t.path(ctx, src, d))
	}
	if req.Probe {
		if resp.Probe, err = t.probe(ctx, src, dst, resp); err != nil {
			if ctx.Err() != nil {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			return nil, status.Error(codes.Internal, err.Error())
		}
	}
	return resp, nil
}

// parseL4 reads the protocol (TCP by default) and port.
func parseL4(proto string, port uint32) (l4.Proto, uint16, error) {
	p := l4.TCP
	if proto != "" {
		var ok bool
		if p, ok = l4.ParseProto(proto); !ok {
			return 0, 0, fmt.Errorf("protocol %q: must be TCP, UDP or SCTP", proto)
		}
	}
	if port < 1 || port > 65535 {
		return 0, 0, fmt.Errorf("port %d: must be 1-65535 for %s", port, p)
	}
	return p, uint16(port), nil
}

type tracer struct {
	State
	request
	rules   policy.Ruleset
	cluster agentpolicy.Snapshot
	remote  policy.Ruleset             // the destination pods of other nodes (compileRemote)
	cache   *cacheView                 // the flow cache, read once per trace
	byIP    map[netip.Addr]*corev1.Pod // the cluster's pods by address, made once per trace
	// unanswered says, by node, why its agent gave no answer: it is not
	// waited for twice in one trace.
	unanswered map[string]string
}

// end is one end of the traced connection.
type end struct {
	ip   netip.Addr
	port uint16
	pod  *corev1.Pod // nil: no pod the agent knows
}

func endpoint(e end) *apiv1.FlowEndpoint {
	fe := &apiv1.FlowEndpoint{Kind: "ip", Ip: e.ip.String(), Port: uint32(e.port)}
	if e.pod != nil {
		fe.Kind, fe.Namespace, fe.Name, fe.Node = "pod", e.pod.Namespace, e.pod.Name, e.pod.Spec.NodeName
	}
	return fe
}

// local is the source: a pod of this node.
type local struct {
	policy.Pod
	ip netip.Addr // the address the trace sends from
}

func (t *tracer) srcEnd(src local, dst netip.Addr) end {
	ns, name, _ := strings.Cut(src.Key, "/")
	pod := t.clusterPod(ns, name)
	if pod == nil {
		pod = &corev1.Pod{}
		pod.Namespace, pod.Name, pod.Spec.NodeName = ns, name, t.Node
	}
	return end{ip: fromFor(src, dst), pod: pod}
}

// source finds the local pod s names (namespace/name or an address).
func (t *tracer) source(s string) (local, error) {
	if ip, err := netip.ParseAddr(s); err == nil {
		for _, p := range t.rules.Pods {
			if p.Has(ip) && !strings.Contains(p.Key, " ") {
				return local{Pod: p, ip: ip}, nil
			}
		}
		if pod := t.podByIP(ip); pod != nil {
			return local{}, status.Errorf(codes.FailedPrecondition, "source %s is pod %s/%s of node %s: run onctl trace on that node", s, pod.Namespace, pod.Name, pod.Spec.NodeName)
		}
		return local{}, status.Errorf(codes.NotFound, "source %s: no pod of this node (%s) has that address", s, t.Node)
	}
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" {
		return local{}, status.Errorf(codes.InvalidArgument, "source %q: namespace/name of a pod, or an address", s)
	}
	if p := t.rules.Pod(s); p != nil && len(p.IPs) > 0 {
		return local{Pod: *p, ip: p.IPs[0]}, nil
	}
	if pod := t.clusterPod(ns, name); pod != nil && pod.Spec.NodeName != t.Node {
		return local{}, status.Errorf(codes.FailedPrecondition, "source %s runs on node %s: run onctl trace on that node", s, pod.Spec.NodeName)
	}
	return local{}, status.Errorf(codes.NotFound, "source %s: no such pod on this node (%s)", s, t.Node)
}

// destination finds what d names, in the source's family where the
// destination pod has two.
func (t *tracer) destination(d string, src local) (end, error) {
	if ip, err := netip.ParseAddr(d); err == nil {
		ip = ip.Unmap()
		if fromFor(src, ip).Is4() != ip.Is4() {
			return end{}, status.Errorf(codes.InvalidArgument, "destination %s: the source has no address of its family", d)
		}
		return end{ip: ip, port: t.port, pod: t.podByIP(ip)}, nil
	}
	ns, name, ok := strings.Cut(d, "/")
	if !ok || ns == "" || name == "" {
		return end{}, status.Errorf(codes.InvalidArgument, "destination %q: namespace/name of a pod, or an address", d)
	}
	pod := t.clusterPod(ns, name)
	if pod == nil {
		return end{}, status.Errorf(codes.NotFound, "destination %s: no such pod", d)
	}
	if pod.Spec.HostNetwork {
		// Its address is its node's, which no NetworkPolicy of ONC polices.
		if ip, err := netip.ParseAddr(pod.Status.HostIP); err == nil && fromFor(src, ip).Is4() == ip.Is4() {
			return end{ip: ip.Unmap(), port: t.port}, nil
		}
		return end{}, status.Errorf(codes.FailedPrecondition, "destination %s is on its node's network, and its node's address %q is not of a family of %s", d, pod.Status.HostIP, src.Key)
	}
	ips := agentpolicy.PodAddrs(pod)
	for _, a := range ips {
		if a.Is4() == src.ip.Is4() {
			return end{ip: a, port: t.port, pod: pod}, nil
		}
	}
	return end{}, status.Errorf(codes.FailedPrecondition, "destination %s has no address in the family of %s (%v)", d, src.ip, ips)
}

// fromFor is the source's address in dst's family.
func fromFor(src local, dst netip.Addr) netip.Addr {
	for _, a := range src.IPs {
		if a.Is4() == dst.Is4() {
			return a
		}
	}
	return src.ip
}

func (t *tracer) clusterPod(ns, name string) *corev1.Pod {
	for _, p := range t.cluster.Pods {
		if p.Namespace == ns && p.Name == name {
			return p
		}
	}
	return nil
}

// podByIP is the pod NetworkPolicy sees with address ip, if any (of two
// with it, as flow records choose: agentpolicy.PodsByAddr).
func (t *tracer) podByIP(ip netip.Addr) *corev1.Pod {
	if t.byIP == nil {
		t.byIP = agentpolicy.PodsByAddr(t.cluster.Pods)
	}
	return t.byIP[ip]
}

// socketLB is the translation's hop when dst is a Service's frontend of
// this node's pods (nil when it is none), and the destinations the
// connection may reach: dst itself, a Service's backends, or none when
// the connection is refused.
func (t *tracer) socketLB(dst end) (*apiv1.TraceHop, []end, error) {
	var list *apiv1.ListServicesResponse
	if t.Services != nil {
		var err error
		if list, err = t.Services(); err != nil && status.Code(err) != codes.FailedPrecondition {
			return nil, nil, err
		}
	}
	if list == nil {
		if dst.pod != nil {
			return nil, []end{dst}, nil
		}
		// Without the socket LB the agent holds no Services: a Service's
		// address would be translated by kube-proxy's DNAT before policy
		// judges the packet, which this trace cannot show.
		return &apiv1.TraceHop{Node: t.Node, Step: StepSocketLB, Verdict: "unknown", Rule: -1, Basis: BasisHere,
			Detail: "this node's socket LB is off, so the agent knows no Service: if " + dst.ip.String() + " is a Service's address, kube-proxy translates it (DNAT) before policy judges the packet, and the paths below judge the address instead: trace a backend"}, []end{dst}, nil
	}
	vip := netip.AddrPortFrom(dst.ip, dst.port).String()
	for _, s := range list.Services {
		if s.Scope != "socket" || s.Vip != vip || !strings.EqualFold(s.Proto, t.proto.String()) {
			continue
		}
		hop := &apiv1.TraceHop{Node: t.Node, Step: StepSocketLB, Rule: -1, Basis: BasisHere}
		name, _, _ := strings.Cut(s.Name, ":")
		// With services host-only this node's socket LB balances only the
		// host's sockets; pods' connections meet kube-proxy's DNAT, among
		// the same endpoints.
		by, how := "the socket LB", "at connect() the socket is given"
		if list.Mode != "all" {
			by, how = "kube-proxy (this node's socket LB balances only the host's sockets)", "kube-proxy's DNAT gives the connection"
		}
		if len(s.Backends) == 0 {
			hop.Verdict = "refused"
			hop.Detail = fmt.Sprintf("%s %s of Service %s has no backend: %s refuses the connection (ECONNREFUSED)", s.Frontend, vip, name, by)
			return hop, nil, nil
		}
		var backends []end
		for _, b := range s.Backends {
			ap, err := netip.ParseAddrPort(b.Addr)
			if err != nil {
				return nil, nil, status.Errorf(codes.Internal, "service %s: backend %q: %v", s.Name, b.Addr, err)
			}
			backends = append(backends, end{ip: ap.Addr(), port: ap.Port(), pod: t.podByIP(ap.Addr())})
		}
		hop.Verdict = "translated"
		hop.Detail = fmt.Sprintf("%s %s of Service %s: %s one of %d backends, at random per connection%s",
			s.Frontend, vip, name, how, len(backends), affinity(s.AffinitySeconds))
		if len(backends) > maxBackends {
			hop.Detail += fmt.Sprintf(" (the first %d traced)", maxBackends)
			backends = backends[:maxBackends]
		}
		return hop, backends, nil
	}
	return nil, []end{dst}, nil
}

func affinity(seconds uint32) string {
	if seconds == 0 {
		return ""
	}
	return fmt.Sprintf(", the same one for %d s with ClientIP affinity", seconds)
}

// path traces the connection from src to one destination, asking another
// node's agent within ctx.
func (t *tracer) path(ctx context.Context, src local, dst end) *apiv1.TracePath {
	p := &apiv1.TracePath{Destination: endpoint(dst), Verdict: "allowed"}
	from := fromFor(src, dst.ip)
	eg := t.judge(StepEgress, t.Node, BasisHere, src.Egress, src.AuditEgress, dst.ip, dst.port)
	p.Hops = append(p.Hops, eg)
	fw, dstLocal := t.forwarding(src, from, dst)
	p.Hops = append(p.Hops, fw)
	var in, deliver *apiv1.TraceHop
	switch {
	case dstLocal != nil:
		in = t.judge(StepIngress, t.Node, BasisHere, dstLocal.Ingress, dstLocal.AuditIngress, from, dst.port)
	case dst.pod != nil:
		in, deliver = t.remoteIngress(ctx, dst, from)
	}
	for _, h := range []*apiv1.TraceHop{in, deliver} {
		if h != nil {
			p.Hops = append(p.Hops, h)
		}
	}
	for _, h := range p.Hops {
		switch h.Verdict {
		case "denied":
			p.Verdict = "denied"
			return p
		case "broken":
			p.Verdict = "unreachable"
		}
	}
	return p
}

// judge is a policy hop: dir's verdict on a new connection with peer,
// tier by tier (flows.Judge: the words of the flow records), and what the
// audited policies of the direction would change of it (audit, nil if
// none: never part of the verdict).
func (t *tracer) judge(step, node, basis string, dir, audit *policy.Direction, peer netip.Addr, port uint16) *apiv1.TraceHop {
	hop := &apiv1.TraceHop{Node: node, Step: step, Rule: -1, Basis: basis}
	way := strings.TrimSuffix(step, "-policy")
	dec := flows.Judge(dir, way, peer, t.proto, port, fmt.Sprintf("%s %s port %d", peer, t.proto, port))
	hop.Detail, hop.Policies, hop.Tier, hop.RuleName = dec.Reason, dec.Policies, dec.Tier, dec.Name
	switch {
	case dir == nil:
		hop.Verdict = "not-isolated"
	case dec.Allowed:
		hop.Verdict = "allowed"
	default:
		hop.Verdict = "denied"
	}
	if dec.Rule != nil {
		hop.Rule = int32(*dec.Rule)
	}
	hop.Detail += t.audited(dir, dec, way, audit, peer, port)
	if basis == BasisComputed {
		hop.Detail += " (computed on " + t.Node + " from the cluster's policies, as " + node + " compiles them)"
	}
	return hop
}

// remoteIngress is a pod of another node's ingress verdict and delivery
// as that node's agent answers them, saying where this node, compiling
// the same inputs, computes otherwise; or, when it cannot answer, the
// verdict computed here, saying why (and no delivery hop).
func (t *tracer) remoteIngress(ctx context.Context, dst end, from netip.Addr) (in, deliver *apiv1.TraceHop) {
	node := dst.pod.Spec.NodeName
	computed := &apiv1.TraceHop{Node: node, Step: StepIngress, Verdict: "unknown", Rule: -1, Basis: BasisComputed,
		Detail: "the pod's rules were not compiled"}
	if p := t.remote.Pod(dst.pod.Namespace + "/" + dst.pod.Name); p != nil { // compileRemote compiles every destination pod not of this node
		computed = t.judge(StepIngress, node, BasisComputed, p.Ingress, p.AuditIngress, from, dst.port)
	}
	ans, why := t.ask(ctx, node, &apiv1.TraceIngressRequest{Source: from.String(), Destination: dst.ip.String(), Port: uint32(dst.port), Protocol: t.proto.String()})
	if ans == nil {
		computed.Detail += "; " + node + "'s own answer: none (" + why + ")"
		return computed, nil
	}
	in = ans.Ingress
	// An agent before tiers sends none: the tier is compared only when
	// the answer has one (a decision of no tier names no policy, so the
	// policies tell it apart).
	otherTier := in.Tier != "" && in.Tier != computed.Tier
	if in.Verdict != computed.Verdict || otherTier || !slices.Equal(in.Policies, computed.Policies) || in.Rule != computed.Rule {
		in.Detail += fmt.Sprintf("; %s computes otherwise from its own view of the cluster: %s, %s: one of the two nodes has not seen the latest change of pods, namespaces or policies yet",
			t.Node, computed.Verdict, computed.Detail)
	}
	return in, ans.Forwarding
}

// ask asks node's agent about a packet to one of its pods, within ctx
// and PeerWait; nil and why when it does not answer.
func (t *tracer) ask(ctx context.Context, node string, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, string) {
	if t.Peer == nil {
		return nil, "this node's peer API is off (--peer-port 0)"
	}
	if why, ok := t.unanswered[node]; ok {
		return nil, why
	}
	ctx, cancel := context.WithTimeout(ctx, PeerWait)
	defer cancel()
	ans, err := t.Peer(ctx, node, req)
	if err == nil && (ans.GetIngress() == nil || ans.Ingress.Node != node) {
		err = fmt.Errorf("an answer without %s's ingress hop", node)
	}
	if err == nil {
		return ans, ""
	}
	why := err.Error()
	if s, ok := status.FromError(err); ok {
		switch s.Code() {
		case codes.Unimplemented:
			why = "its agent predates the peer API"
		case codes.DeadlineExceeded, codes.Canceled:
			why = fmt.Sprintf("no answer within %v", PeerWait)
		case codes.Unavailable:
			why = "unreachable, or the keys were refused: " + s.Message()
		default:
			why = s.Code().String() + ": " + s.Message()
		}
	}
	t.unanswered[node] = why
	return nil, why
}

// audited is what the audited policies audit of a direction would
// change of its decision dec on a connection with peer, for a hop's
// detail, in agreement with audit's flow records and counters; ""
// otherwise. Audit is NetworkPolicy's: enforced beside the enforcing
// NetworkPolicies of dir, the audited ones would isolate the direction,
// which then allows only what a rule of either allows, after Admin and
// without Baseline. What Admin decides stands and is not audited (the
// table's audited sets hold where the direction would allow with the
// audited policies enforced, after the same Admin rules). A
// direction ClusterNetworkPolicy rules judge is never audited for
// would-deny: the table logs and counts would-deny only where no rule of
// any tier judges.
func (t *tracer) audited(dir *policy.Direction, dec flows.Decision, way string, audit *policy.Direction, peer netip.Addr, port uint16) string {
	if audit == nil || dec.Tier == policy.TierAdmin.String() {
		return ""
	}
	a := audit.Judge(peer, t.proto, port)
	switch {
	case !dec.Allowed && a.Allowed:
		return fmt.Sprintf("; audited %s %s rule %d (not enforced): would allow", a.Policy, way, a.Index)
	case !dec.Allowed || a.Allowed || dir != nil && !dir.ClusterOnly:
		return ""
	case dir != nil:
		return fmt.Sprintf("; audited by %s (not enforced): would deny, but ClusterNetworkPolicy rules judge the %s, where audit logs and counts no would-deny",
			strings.Join(audit.Policies, ", "), way)
	}
	return fmt.Sprintf("; audited by %s (not enforced): would deny", strings.Join(audit.Policies, ", "))
}

// localPod is the pod of this node with address ip, by its first
// attachment's rules; nil for none.
func (t *tracer) localPod(ip netip.Addr) *policy.Pod {
	for i, p := range t.rules.Pods {
		if p.Has(ip) && !strings.Contains(p.Key, " ") {
			return &t.rules.Pods[i]
		}
	}
	return nil
}

// compileRemote compiles, in one pass over the cluster's policies, the
// rules of the pods among dsts that are not this node's.
func (t *tracer) compileRemote(dsts []end) {
	var lps []agentpolicy.LocalPod
	seen := map[string]bool{}
	for _, d := range dsts {
		if d.pod == nil || t.localPod(d.ip) != nil || seen[d.pod.Namespace+"/"+d.pod.Name] {
			continue
		}
		seen[d.pod.Namespace+"/"+d.pod.Name] = true
		lps = append(lps, agentpolicy.LocalPod{Namespace: d.pod.Namespace, Name: d.pod.Name, IPs: agentpolicy.PodAddrs(d.pod)})
	}
	if len(lps) > 0 {
		t.remote = agentpolicy.Compile(t.cluster, lps)
	}
}

// forwarding is how this node sends from src to dst, and dst's rules if
// it is a pod of this node.
func (t *tracer) forwarding(src local, from netip.Addr, dst end) (*apiv1.TraceHop, *policy.Pod) {
	hop := &apiv1.TraceHop{Node: t.Node, Step: StepForwarding, Rule: -1, Basis: BasisHere}
	if p := t.localPod(dst.ip); p != nil {
		hop.Verdict = "same-node"
		hop.Detail = fmt.Sprintf("a pod of this node: %s's veth to %s's (%s) through the node's stack", src.Iface, p.Key, p.Iface)
		if t.proto == l4.TCP && t.Bypass != nil {
			if b := t.Bypass(); b.Mode == "on" || b.Mode == "size" {
				hop.Detail += fmt.Sprintf("; once established, the intra-node bypass (%s) carries its data socket to socket", b.Mode)
			}
		}
		return hop, p
	}
	f, err := t.Lookup(src.Iface, from, dst.ip)
	if err != nil {
		hop.Verdict, hop.Detail = "broken", err.Error()
		return hop, nil
	}
	if f.Dev != overlay.DeviceName {
		hop.Verdict = "outside"
		hop.Detail = fmt.Sprintf("not a pod of the cluster's overlay: leaves by %s%s", f.Dev, via(f.Via))
		return hop, nil
	}
	if f.Missing != "" {
		hop.Verdict = "broken"
		hop.Detail = fmt.Sprintf("route%s dev %s, but the overlay has no %s: the kernel cannot send it", via(f.Via), f.Dev, f.Missing)
		return hop, nil
	}
	hop.Verdict = "slow-path"
	hop.Detail = fmt.Sprintf("route%s dev %s; VTEP %s is node %s: VXLAN to %s", via(f.Via), f.Dev, f.VTEPMAC, f.Remote, f.Remote)
	if t.FastPath != nil {
		if fp := t.FastPath(); fp != nil {
			if fast := t.fastPath(fp, from, dst); fast != "" {
				hop.Verdict = "fast-path"
				hop.Detail += "; " + fast
			}
		}
	}
	return hop, nil
}

func via(gw netip.Addr) string {
	if !gw.IsValid() {
		return ""
	}
	return " via " + gw.String()
}

// cacheView is what a trace reads of the flow cache: once, however many
// paths it traces.
type cacheView struct {
	nodes  map[netip.Addr]netip.Addr // pod → node (egress entries)
	encaps map[netip.Addr]bool       // nodes whose headers are learned
	flows  []fastpath.Flow
}

// cacheOf reads the flow cache, nil while it is off or unreadable.
func (t *tracer) cacheOf(fp FastPath) *cacheView {
	if t.cache != nil || !fp.Enabled() {
		return t.cache
	}
	dests, err := fp.Dests()
	if err != nil {
		return nil
	}
	encaps, err := fp.Encaps()
	if err != nil {
		return nil
	}
	c := &cacheView{nodes: map[netip.Addr]netip.Addr{}, encaps: map[netip.Addr]bool{}}
	for _, d := range dests {
		c.nodes[d.Pod] = d.Node
	}
	for _, e := range encaps {
		c.encaps[e.Node] = true
	}
	c.flows, _ = fp.Flows()
	t.cache = c
	return c
}

// fastPath says what the flow cache holds for from → dst, or "" when it
// cannot carry the connection (off, or no entry for dst's node).
func (t *tracer) fastPath(fp FastPath, from netip.Addr, dst end) string {
	c := t.cacheOf(fp)
	if c == nil {
		return ""
	}
	node, ok := c.nodes[dst.ip]
	if !ok || !c.encaps[node] {
		return ""
	}
	cached := 0
	for _, f := range c.flows {
		if strings.EqualFold(f.Proto, t.proto.String()) && f.Local.Addr() == from && f.Remote == netip.AddrPortFrom(dst.ip, dst.port) && f.Live && f.Egress && f.Ingress {
			cached++
		}
	}
	return fmt.Sprintf("the flow cache has the headers to node %s: once the connection is learned, its packets skip the VXLAN device (%d flows of %s → %s cached now)",
		node, cached, from, netip.AddrPortFrom(dst.ip, dst.port))
}
