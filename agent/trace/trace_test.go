package trace

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	agentpolicy "github.com/onc-net/onc/agent/policy"
	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/datapath/fastpath"
	"github.com/onc-net/onc/datapath/l4"
	"github.com/onc-net/onc/datapath/overlay"
	"github.com/onc-net/onc/datapath/policy"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func pod(name, node, ip string, labels map[string]string) *corev1.Pod {
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name, Labels: labels}}
	p.Spec.NodeName = node
	p.Status.Phase = corev1.PodRunning
	p.Status.PodIPs = []corev1.PodIP{{IP: ip}}
	return p
}

// hostPod is a pod on its node's network, labelled app=c (so x/c-from-a
// selects it, though no policy applies to such a pod).
func hostPod(name, node, ip string) *corev1.Pod {
	p := pod(name, node, ip, map[string]string{"app": "c"})
	p.Spec.HostNetwork = true
	p.Status.HostIP = ip
	return p
}

// ingressFrom is a policy of namespace x isolating the pods labelled
// app=to in ingress, letting in the pods labelled app=from on TCP port.
func ingressFrom(name, to, from string, port int) *networkingv1.NetworkPolicy {
	tcp := corev1.ProtocolTCP
	p := intstr.FromInt(port)
	return &networkingv1.NetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "x", Name: name},
		Spec: networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": to}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{{
				From:  []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": from}}}},
				Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &p}}}}}}
}

type fakeFastPath struct{ on bool }

func (f fakeFastPath) Enabled() bool { return f.on }
func (fakeFastPath) Dests() ([]fastpath.Dest, error) {
	return []fastpath.Dest{{Pod: netip.MustParseAddr("10.0.2.4"), Node: netip.MustParseAddr("192.168.0.2")}}, nil
}
func (fakeFastPath) Encaps() ([]fastpath.Encap, error) {
	return []fastpath.Encap{{Node: netip.MustParseAddr("192.168.0.2")}}, nil
}
func (fakeFastPath) Flows() ([]fastpath.Flow, error) { return nil, nil }

// bed is node n1 with pods x/a (app=a) and x/b (app=b), and x/c (app=c)
// on n2; x/allow-a lets a into b on TCP 80, x/c-from-a a into c on 80;
// and the policies more.
func bed(t *testing.T, more ...*networkingv1.NetworkPolicy) State {
	t.Helper()
	snap := agentpolicy.Snapshot{
		Pods: []*corev1.Pod{pod("a", "n1", "10.0.1.2", map[string]string{"app": "a"}), pod("b", "n1", "10.0.1.3", map[string]string{"app": "b"}),
			pod("c", "n2", "10.0.2.4", map[string]string{"app": "c"}), hostPod("h", "n2", "192.168.0.2")},
		Namespaces: []*corev1.Namespace{{ObjectMeta: metav1.ObjectMeta{Name: "x"}}},
		Policies:   append([]*networkingv1.NetworkPolicy{ingressFrom("allow-a", "b", "a", 80), ingressFrom("c-from-a", "c", "a", 80)}, more...),
	}
	rules := agentpolicy.Compile(snap, []agentpolicy.LocalPod{
		{Namespace: "x", Name: "a", Iface: "vetha", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.2")}},
		{Namespace: "x", Name: "b", Iface: "vethb", IPs: []netip.Addr{netip.MustParseAddr("10.0.1.3")}},
	})
	vtep, _ := net.ParseMAC("aa:bb:cc:dd:ee:02")
	return State{Node: "n1", Rules: func() policy.Ruleset { return rules }, Cluster: func() agentpolicy.Snapshot { return snap },
		Services: func() (*apiv1.ListServicesResponse, error) {
			return &apiv1.ListServicesResponse{Mode: "all", Services: []*apiv1.BalancedService{
				{Name: "x/web:http", Vip: "10.96.0.10:80", Proto: "TCP", Frontend: "ClusterIP", Scope: "socket",
					Backends: []*apiv1.ServiceBackend{{Addr: "10.0.1.3:80", Ready: true}, {Addr: "10.0.2.4:80", Ready: true}}},
				{Name: "x/empty:http", Vip: "10.96.0.11:80", Proto: "TCP", Frontend: "ClusterIP", Scope: "socket"},
				{Name: "x/web:http", Vip: "192.168.0.1:30080", Proto: "TCP", Frontend: "NodePort", Scope: "uplink"},
			}}, nil
		},
		Bypass: func() *apiv1.BypassState { return &apiv1.BypassState{Mode: "on"} },
		Lookup: func(iif string, src, dst netip.Addr) (overlay.Forwarding, error) {
			if iif != "vetha" && iif != "vethb" {
				t.Errorf("lookup from %s: not a local pod's veth", iif)
			}
			if netip.MustParsePrefix("10.0.0.0/16").Contains(dst) {
				f := overlay.Forwarding{Dev: overlay.DeviceName, Via: netip.MustParseAddr("10.0.2.0"), VTEPMAC: vtep, Remote: netip.MustParseAddr("192.168.0.2")}
				if dst == netip.MustParseAddr("10.0.3.9") {
					f.VTEPMAC, f.Remote, f.Missing = nil, netip.Addr{}, "neighbour 10.0.3.0 on onc.vxlan"
				}
				return f, nil
			}
			return overlay.Forwarding{Dev: "eth0", Via: netip.MustParseAddr("192.168.0.254")}, nil
		}}
}

// summary is a path's hops as "node step verdict" and its verdict.
func summary(p *apiv1.TracePath) string {
	var s []string
	for _, h := range p.Hops {
		s = append(s, h.Node+" "+h.Step+" "+h.Verdict)
	}
	return strings.Join(s, ", ") + " => " + p.Verdict
}

func TestTrace(t *testing.T) {
	for _, tc := range []struct {
		name, src, dst, proto string
		port                  uint32
		hops                  []string // the hops before the paths
		paths                 []string
		detail                []string // in some hop's detail
	}{
		{name: "same node allowed", src: "x/a", dst: "x/b", port: 80,
			paths:  []string{"n1 egress-policy not-isolated, n1 forwarding same-node, n1 ingress-policy allowed => allowed"},
			detail: []string{"allowed by x/allow-a ingress rule 0", "intra-node bypass (on)"}},
		{name: "same node, a port no rule allows", src: "10.0.1.2", dst: "10.0.1.3", port: 81,
			paths:  []string{"n1 egress-policy not-isolated, n1 forwarding same-node, n1 ingress-policy denied => denied"},
			detail: []string{"default deny: ingress isolated by x/allow-a"}},
		{name: "UDP to the same port: the rule is TCP's", src: "x/a", dst: "x/b", port: 80, proto: "udp",
			paths: []string{"n1 egress-policy not-isolated, n1 forwarding same-node, n1 ingress-policy denied => denied"}},
		{name: "another node, allowed there", src: "x/a", dst: "x/c", port: 80,
			paths:  []string{"n1 egress-policy not-isolated, n1 forwarding slow-path, n2 ingress-policy allowed => allowed"},
			detail: []string{"VTEP aa:bb:cc:dd:ee:02 is node 192.168.0.2", "allowed by x/c-from-a ingress rule 0 (computed on n1"}},
		{name: "another node, denied there", src: "x/b", dst: "10.0.2.4", port: 80,
			paths: []string{"n1 egress-policy not-isolated, n1 forwarding slow-path, n2 ingress-policy denied => denied"}},
		{name: "a Service forks into its backends", src: "x/a", dst: "10.96.0.10", port: 80,
			hops: []string{"n1 socket-lb translated"},
			paths: []string{"n1 egress-policy not-isolated, n1 forwarding same-node, n1 ingress-policy allowed => allowed",
				"n1 egress-policy not-isolated, n1 forwarding slow-path, n2 ingress-policy allowed => allowed"},
			detail: []string{"ClusterIP 10.96.0.10:80 of Service x/web: at connect() the socket is given one of 2 backends"}},
		{name: "a Service without backends refuses", src: "x/a", dst: "10.96.0.11", port: 80,
			hops: []string{"n1 socket-lb refused"}, detail: []string{"ECONNREFUSED"}},
		{name: "an uplink frontend is not the socket LB's", src: "x/a", dst: "192.168.0.1", port: 30080,
			paths: []string{"n1 egress-policy not-isolated, n1 forwarding outside => allowed"}, detail: []string{"leaves by eth0 via 192.168.0.254"}},
		{name: "an overlay route whose neighbour is missing", src: "x/a", dst: "10.0.3.9", port: 80,
			paths: []string{"n1 egress-policy not-isolated, n1 forwarding broken => unreachable"}, detail: []string{"no neighbour 10.0.3.0"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := Trace(t.Context(), bed(t), &apiv1.TraceRequest{Source: tc.src, Destination: tc.dst, Port: tc.port, Protocol: tc.proto})
			if err != nil {
				t.Fatal(err)
			}
			var hops, paths, details []string
			for _, h := range resp.Hops {
				hops = append(hops, h.Node+" "+h.Step+" "+h.Verdict)
				details = append(details, h.Detail)
			}
			for _, p := range resp.Paths {
				paths = append(paths, summary(p))
				for _, h := range p.Hops {
					details = append(details, h.Detail)
				}
			}
			if strings.Join(hops, "; ") != strings.Join(tc.hops, "; ") {
				t.Errorf("hops %q, want %q", hops, tc.hops)
			}
			if strings.Join(paths, "; ") != strings.Join(tc.paths, "; ") {
				t.Errorf("paths\n%q\nwant\n%q", paths, tc.paths)
			}
			all := strings.Join(details, "\n")
			for _, d := range tc.detail {
				if !strings.Contains(all, d) {
					t.Errorf("no hop says %q; they say:\n%s", d, all)
				}
			}
		})
	}
}

// TestTraceRule: the hop names the deciding rule by its index in its
// policy.
func TestTraceRule(t *testing.T) {
	st := bed(t)
	resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "x/b", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	in := resp.Paths[0].Hops[2]
	if in.Rule != 0 || len(in.Policies) != 1 || in.Policies[0] != "x/allow-a" || in.Basis != BasisHere {
		t.Errorf("ingress hop %v: want rule 0 of x/allow-a, decided here", in)
	}
	if eg := resp.Paths[0].Hops[0]; eg.Rule != -1 || eg.Policies != nil {
		t.Errorf("egress hop %v: no policy, rule -1", eg)
	}
}

// TestTraceAudit: audited policies never change a hop's verdict; its
// detail says what they would change, computed for another node's pod
// too.
func TestTraceAudit(t *testing.T) {
	audit := func(p *networkingv1.NetworkPolicy) *networkingv1.NetworkPolicy {
		p.Annotations = map[string]string{"onc.io/policy-mode": "audit"}
		return p
	}
	st := bed(t, audit(ingressFrom("a-audit", "a", "b", 9999)), audit(ingressFrom("b-audit", "b", "a", 81)), audit(ingressFrom("c-audit", "c", "b", 80)))
	for _, c := range []struct {
		src, dst     string
		port         int
		hop          int
		verdict, has string
	}{
		{"x/b", "x/a", 80, 2, "not-isolated", "; audited by x/a-audit (not enforced): would deny"},
		{"x/a", "x/b", 81, 2, "denied", "; audited x/b-audit ingress rule 0 (not enforced): would allow"},
		{"x/a", "x/b", 80, 2, "allowed", ""},
		{"x/a", "x/c", 80, 2, "allowed", ""},
		{"x/b", "x/c", 80, 2, "denied", "; audited x/c-audit ingress rule 0 (not enforced): would allow"},
	} {
		resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: c.src, Destination: c.dst, Port: uint32(c.port)})
		if err != nil {
			t.Fatal(err)
		}
		h := resp.Paths[0].Hops[c.hop]
		if h.Verdict != c.verdict || c.has != "" && !strings.Contains(h.Detail, c.has) || c.has == "" && strings.Contains(h.Detail, "audit") {
			t.Errorf("%s → %s:%d: %s %q, want %s saying %q", c.src, c.dst, c.port, h.Verdict, h.Detail, c.verdict, c.has)
		}
	}
}

// TestTraceFastPath: with the flow cache on and its entries for the
// destination's node, the forwarding hop says the fast path carries it.
func TestTraceFastPath(t *testing.T) {
	st := bed(t)
	for _, on := range []bool{false, true} {
		st.FastPath = func() FastPath { return fakeFastPath{on: on} }
		resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "x/c", Port: 80})
		if err != nil {
			t.Fatal(err)
		}
		want := map[bool]string{false: "slow-path", true: "fast-path"}[on]
		if fw := resp.Paths[0].Hops[1]; fw.Verdict != want {
			t.Errorf("fast path on=%v: forwarding %q (%s), want %s", on, fw.Verdict, fw.Detail, want)
		}
	}
}

// TestTraceWithoutTheSocketLB: where pods' sockets are not balanced here
// (host-only), the Service's hop says kube-proxy translates; without the
// socket LB at all, an address is traced with a warning that it may be a
// Service's, and a pod without one.
func TestTraceWithoutTheSocketLB(t *testing.T) {
	st := bed(t)
	all := st.Services
	st.Services = func() (*apiv1.ListServicesResponse, error) {
		l, err := all()
		l.Mode = "host-only"
		return l, err
	}
	resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "10.96.0.10", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Hops) != 1 || !strings.Contains(resp.Hops[0].Detail, "kube-proxy's DNAT gives the connection one of 2 backends") || len(resp.Paths) != 2 {
		t.Errorf("host-only: %v", resp)
	}
	st.Services = func() (*apiv1.ListServicesResponse, error) {
		return nil, status.Error(codes.FailedPrecondition, "socket load balancing: off")
	}
	resp, err = Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "10.96.0.10", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Hops) != 1 || resp.Hops[0].Verdict != "unknown" || !strings.Contains(resp.Hops[0].Detail, "trace a backend") || len(resp.Paths) != 1 {
		t.Errorf("no socket LB, an address: %v", resp)
	}
	resp, err = Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "x/c", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Hops) != 0 || len(resp.Paths) != 1 || resp.Paths[0].Verdict != "allowed" {
		t.Errorf("no socket LB, a pod: %v", resp)
	}
}

// TestTraceHostNetworkPod: a pod on its node's network is its node's
// address, which no NetworkPolicy of ONC polices, by name or address.
func TestTraceHostNetworkPod(t *testing.T) {
	for _, dst := range []string{"x/h", "192.168.0.2"} {
		resp, err := Trace(t.Context(), bed(t), &apiv1.TraceRequest{Source: "x/b", Destination: dst, Port: 80})
		if err != nil {
			t.Fatal(err)
		}
		if got := summary(resp.Paths[0]); got != "n1 egress-policy not-isolated, n1 forwarding outside => allowed" || resp.Destination.Kind != "ip" {
			t.Errorf("to %s: %s (%v), want its node's address with no ingress policy", dst, got, resp.Destination)
		}
	}
}

func TestTraceRefusals(t *testing.T) {
	for _, tc := range []struct {
		req  *apiv1.TraceRequest
		code codes.Code
		msg  string
	}{
		{&apiv1.TraceRequest{Source: "x/c", Destination: "x/a", Port: 80}, codes.FailedPrecondition, "runs on node n2"},
		{&apiv1.TraceRequest{Source: "10.0.2.4", Destination: "x/a", Port: 80}, codes.FailedPrecondition, "of node n2"},
		{&apiv1.TraceRequest{Source: "x/nobody", Destination: "x/a", Port: 80}, codes.NotFound, "no such pod on this node"},
		{&apiv1.TraceRequest{Source: "10.9.9.9", Destination: "x/a", Port: 80}, codes.NotFound, "no pod of this node"},
		{&apiv1.TraceRequest{Source: "x/a", Destination: "x/nobody", Port: 80}, codes.NotFound, "destination x/nobody"},
		{&apiv1.TraceRequest{Source: "x/a", Destination: "x/b", Port: 0}, codes.InvalidArgument, "port 0"},
		{&apiv1.TraceRequest{Source: "x/a", Destination: "x/b", Port: 70000}, codes.InvalidArgument, "port 70000"},
		{&apiv1.TraceRequest{Source: "x/a", Destination: "x/b", Port: 80, Protocol: "ICMP"}, codes.InvalidArgument, "protocol"},
		{&apiv1.TraceRequest{Source: "a", Destination: "x/b", Port: 80}, codes.InvalidArgument, "source"},
		{&apiv1.TraceRequest{Source: "x/a", Destination: "fd00::1", Port: 80}, codes.InvalidArgument, "no address of its family"},
		{&apiv1.TraceRequest{Destination: "x/b", Port: 80}, codes.InvalidArgument, "both needed"},
	} {
		_, err := Trace(t.Context(), bed(t), tc.req)
		if status.Code(err) != tc.code || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%v: %v, want %s with %q", tc.req, err, tc.code, tc.msg)
		}
	}
}

// TestJudgeProbe: a probe agrees when it met what the computed paths
// give: an answer where they allow, none where they deny, the socket LB's
// refusal at once where it has no backend; a UDP datagram nobody answered
// proves nothing unless the node recorded a denial.
func TestJudgeProbe(t *testing.T) {
	paths := func(verdicts ...string) *apiv1.TraceResponse {
		r := &apiv1.TraceResponse{}
		for _, v := range verdicts {
			r.Paths = append(r.Paths, &apiv1.TracePath{Verdict: v})
		}
		return r
	}
	lbRefused := &apiv1.TraceResponse{Hops: []*apiv1.TraceHop{{Step: StepSocketLB, Verdict: "refused"}}}
	denial := []*apiv1.FlowRecord{{Node: "n1", Verdict: "denied", Direction: "egress", Reason: "default deny"}}
	for _, tc := range []struct {
		name    string
		resp    *apiv1.TraceResponse
		proto   l4.Proto
		outcome string
		took    time.Duration
		records []*apiv1.FlowRecord
		want    string
	}{
		{"allowed, connected", paths("allowed"), l4.TCP, Connected, 0, nil, "agrees"},
		{"allowed, reset by a closed port", paths("allowed"), l4.TCP, Refused, 0, nil, "agrees"},
		{"allowed, timed out", paths("allowed"), l4.TCP, TimedOut, ProbeWait, nil, "disagrees"},
		{"denied, timed out", paths("denied"), l4.TCP, TimedOut, ProbeWait, denial, "agrees"},
		{"denied, connected", paths("denied"), l4.TCP, Connected, 0, nil, "disagrees"},
		{"unreachable, host unreachable", paths("unreachable"), l4.TCP, Unreachable, 0, nil, "agrees"},
		{"no backend, refused at once", lbRefused, l4.TCP, Refused, time.Millisecond, nil, "agrees"},
		{"no backend, connected", lbRefused, l4.TCP, Connected, time.Millisecond, nil, "disagrees"},
		{"backends differ", paths("allowed", "denied"), l4.TCP, TimedOut, ProbeWait, nil, "agrees"},
		{"UDP allowed, replied", paths("allowed"), l4.UDP, Replied, 0, nil, "agrees"},
		{"UDP allowed, no reply", paths("allowed"), l4.UDP, NoReply, ProbeWait, nil, "inconclusive"},
		{"UDP allowed, no reply, denied here", paths("allowed"), l4.UDP, NoReply, ProbeWait, denial, "disagrees"},
		{"UDP denied, no reply", paths("denied"), l4.UDP, NoReply, ProbeWait, denial, "agrees"},
	} {
		got, detail := judgeProbe(tc.resp, tc.proto, sent{outcome: tc.outcome, took: tc.took}, tc.records, []string{"n1"})
		if got != tc.want {
			t.Errorf("%s: %s (%s), want %s", tc.name, got, detail, tc.want)
		}
		if len(tc.records) > 0 && !strings.Contains(detail, "n1 DENIED egress (default deny)") {
			t.Errorf("%s: the detail %q does not name the node's record", tc.name, detail)
		}
	}
}

// TestJudgeProbePickedBackend: through a Service whose backends differ,
// a record of the probe naming the backend decides which path it is
// judged by.
func TestJudgeProbePickedBackend(t *testing.T) {
	resp := &apiv1.TraceResponse{Paths: []*apiv1.TracePath{
		{Verdict: "allowed", Destination: &apiv1.FlowEndpoint{Ip: "10.0.1.3", Port: 80}},
		{Verdict: "denied", Destination: &apiv1.FlowEndpoint{Ip: "10.0.2.4", Port: 80}}}}
	deniedAt := func(ip string) []*apiv1.FlowRecord {
		return []*apiv1.FlowRecord{{Node: "n1", Verdict: "denied", Destination: &apiv1.FlowEndpoint{Ip: ip, Port: 80}}}
	}
	for _, tc := range []struct {
		outcome string
		records []*apiv1.FlowRecord
		want    string
	}{
		{TimedOut, deniedAt("10.0.2.4"), "agrees"},
		{Connected, deniedAt("10.0.2.4"), "disagrees"},
		{TimedOut, nil, "agrees"}, // no record: either backend
	} {
		if got, detail := judgeProbe(resp, l4.TCP, sent{outcome: tc.outcome, took: ProbeWait}, tc.records, []string{"n1"}); got != tc.want {
			t.Errorf("%s with %v: %s (%s), want %s", tc.outcome, tc.records, got, detail, tc.want)
		}
	}
}

// n2 is node n2 of bed, with its pod x/c (veth vethc), as its agent
// compiled the policies it has seen (all of bed's, or those given).
func n2(t *testing.T, records []*apiv1.FlowRecord, pols ...*networkingv1.NetworkPolicy) State {
	t.Helper()
	st := bed(t)
	snap := st.Cluster()
	if pols != nil {
		snap.Policies = pols
	}
	rules := agentpolicy.Compile(snap, []agentpolicy.LocalPod{{Namespace: "x", Name: "c", Iface: "vethc", IPs: []netip.Addr{netip.MustParseAddr("10.0.2.4")}}})
	return State{Node: "n2", Rules: func() policy.Ruleset { return rules }, Cluster: func() agentpolicy.Snapshot { return snap },
		Lookup: func(iif string, src, dst netip.Addr) (overlay.Forwarding, error) {
			if iif != overlay.DeviceName {
				t.Errorf("n2's lookup from %s: not the overlay", iif)
			}
			return overlay.Forwarding{Dev: "vethc"}, nil
		},
		Records: func(_ time.Time, from netip.AddrPort) []*apiv1.FlowRecord {
			// The store selects by source (agent/flows Filter.Source).
			return slices.DeleteFunc(slices.Clone(records), func(r *apiv1.FlowRecord) bool {
				return r.Source.GetIp() != from.Addr().String() || r.Source.GetPort() != uint32(from.Port())
			})
		}}
}

// TestTraceAsksTheDestination: a pod of another node's ingress hop is that
// node's own answer (Ingress), basis enforced, with its delivery to the
// pod; where it differs from what this node computes, the detail says
// so; where the node cannot answer, the hop is computed here and says
// why.
func TestTraceAsksTheDestination(t *testing.T) {
	trace := func(st State) *apiv1.TracePath {
		t.Helper()
		resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "x/c", Port: 80})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Paths[0]
	}
	asking := func(n2 State, asked *int) State {
		st := bed(t)
		st.Peer = func(_ context.Context, node string, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
			*asked++
			if node != "n2" || req.Source != "10.0.1.2" || req.Destination != "10.0.2.4" || req.Port != 80 || req.Protocol != "TCP" {
				t.Errorf("asked %s %v", node, req)
			}
			return Ingress(n2, req)
		}
		return st
	}
	var asked int
	p := trace(asking(n2(t, nil), &asked))
	in := p.Hops[2]
	if summary(p) != "n1 egress-policy not-isolated, n1 forwarding slow-path, n2 ingress-policy allowed, n2 forwarding delivered => allowed" ||
		in.Basis != BasisEnforced || in.Rule != 0 || in.Policies[0] != "x/c-from-a" || strings.Contains(in.Detail, "otherwise") || asked != 1 {
		t.Errorf("agreeing: %s; %v (asked %d)", summary(p), in, asked)
	}
	if d := p.Hops[3]; d.Basis != BasisEnforced || !strings.Contains(d.Detail, "x/c's veth vethc") {
		t.Errorf("delivery hop %v", d)
	}

	// n2 has not seen x/c-from-a yet: its answer stands, and says n1
	// computes otherwise.
	p = trace(asking(n2(t, nil, ingressFrom("allow-a", "b", "a", 80)), &asked))
	if in := p.Hops[2]; in.Verdict != "not-isolated" || in.Basis != BasisEnforced || !strings.Contains(in.Detail, "n1 computes otherwise from its own view of the cluster: allowed, allowed by x/c-from-a") {
		t.Errorf("disagreeing: %v", in)
	}

	// No answer: computed here, saying why, asked once per trace.
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.Unavailable, "connection refused"), "n2's own answer: none (unreachable, or the keys were refused: connection refused)"},
		{status.Error(codes.Unimplemented, "unknown service"), "its agent predates the peer API"},
		{status.Error(codes.PermissionDenied, "node n1 asks"), "PermissionDenied: node n1 asks"},
		{errors.New("node n2's record pins no peer key"), "pins no peer key"},
	} {
		st, calls := bed(t), 0
		st.Peer = func(context.Context, string, *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
			calls++
			return nil, tc.err
		}
		resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "10.96.0.10", Port: 80})
		if err != nil {
			t.Fatal(err)
		}
		p := resp.Paths[1]
		if in := p.Hops[2]; summary(p) != "n1 egress-policy not-isolated, n1 forwarding slow-path, n2 ingress-policy allowed => allowed" || in.Basis != BasisComputed || !strings.Contains(in.Detail, tc.want) {
			t.Errorf("%v: %s; %v", tc.err, summary(p), in)
		}
	}
	if in := trace(bed(t)).Hops[2]; in.Basis != BasisComputed || !strings.Contains(in.Detail, "peer API is off") {
		t.Errorf("without the peer API: %v", in)
	}
}

// TestIngress: a node answers only about its own pods, and gives its
// records of the packet from the source's address and port.
func TestIngress(t *testing.T) {
	rec := func(ip string, port uint32) *apiv1.FlowRecord {
		return &apiv1.FlowRecord{Node: "n2", Verdict: "denied", Protocol: "TCP", Source: &apiv1.FlowEndpoint{Ip: ip, Port: port}}
	}
	st := n2(t, []*apiv1.FlowRecord{rec("10.0.1.2", 40000), rec("10.0.1.2", 40001), rec("10.0.1.3", 40000)})
	resp, err := Ingress(st, &apiv1.TraceIngressRequest{Source: "10.0.1.3", SourcePort: 40000, Destination: "10.0.2.4", Port: 80, RecordsSinceUnixNano: 1})
	if err != nil || resp.Node != "n2" || resp.Ingress.Verdict != "denied" || len(resp.Records) != 1 || resp.Records[0].Source.Ip != "10.0.1.3" {
		t.Fatalf("Ingress: %v, %v", resp, err)
	}
	if resp, err := Ingress(st, &apiv1.TraceIngressRequest{Source: "10.0.1.3", Destination: "10.0.2.4", Port: 80, RecordsSinceUnixNano: 1}); err != nil || len(resp.Records) != 0 {
		t.Errorf("without a source port: %v, %v; want no records", resp, err)
	}
	for _, tc := range []struct {
		req  *apiv1.TraceIngressRequest
		code codes.Code
	}{
		{&apiv1.TraceIngressRequest{Source: "10.0.1.2", Destination: "10.0.1.3", Port: 80}, codes.FailedPrecondition}, // n1's pod
		{&apiv1.TraceIngressRequest{Source: "10.0.1.2", Destination: "10.0.2.4"}, codes.InvalidArgument},
		{&apiv1.TraceIngressRequest{Source: "x", Destination: "10.0.2.4", Port: 80}, codes.InvalidArgument},
		{&apiv1.TraceIngressRequest{Source: "10.0.1.2", SourcePort: 70000, Destination: "10.0.2.4", Port: 80}, codes.InvalidArgument},
	} {
		if _, err := Ingress(st, tc.req); status.Code(err) != tc.code {
			t.Errorf("Ingress(%v): %v, want %s", tc.req, err, tc.code)
		}
	}
}

// TestRemoteRecords: a probe's records include those of each destination
// pod's node, asked once per node with the probe's source address and
// port; a node that cannot answer is named with why.
func TestRemoteRecords(t *testing.T) {
	denial := &apiv1.FlowRecord{Node: "n2", Verdict: "denied", Direction: "ingress", Protocol: "TCP", Policies: []string{"x/c-from-a"},
		Source: &apiv1.FlowEndpoint{Ip: "10.0.1.2", Port: 40000}, Reason: "default deny: ingress isolated by x/c-from-a"}
	var asked []*apiv1.TraceIngressRequest
	tr := &tracer{State: bed(t), request: request{proto: l4.TCP, port: 80}, unanswered: map[string]string{}}
	tr.Peer = func(_ context.Context, node string, req *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
		asked = append(asked, req)
		if node == "n3" {
			return nil, status.Error(codes.Unavailable, "connection refused")
		}
		return Ingress(n2(t, []*apiv1.FlowRecord{denial}), req)
	}
	pod := func(ip, node string) *apiv1.TracePath {
		return &apiv1.TracePath{Verdict: "denied", Destination: &apiv1.FlowEndpoint{Kind: "pod", Ip: ip, Port: 80, Node: node}}
	}
	resp := &apiv1.TraceResponse{Paths: []*apiv1.TracePath{pod("10.0.2.4", "n2"), pod("10.0.2.4", "n2"), pod("10.0.1.3", "n1"), pod("10.0.3.9", "n3")}}
	p := &apiv1.TraceProbe{}
	start := time.Now()
	read, unread := tr.remoteRecords(t.Context(), p, resp, netip.MustParseAddrPort("10.0.1.2:40000"), start)
	if len(asked) != 2 || asked[0].SourcePort != 40000 || asked[0].Source != "10.0.1.2" || asked[0].RecordsSinceUnixNano > start.UnixNano() {
		t.Errorf("asked %v; want n2 and n3 once each, with the probe's address and port", asked)
	}
	if len(p.Records) != 1 || p.Records[0] != denial || strings.Join(read, ",") != "n2" || len(unread) != 1 || !strings.Contains(unread[0], "n3's records unread: unreachable") {
		t.Errorf("records %v, read %v, unread %v", p.Records, read, unread)
	}
	opened := &apiv1.FlowRecord{Node: "n1", Event: "open", Verdict: "cached"} // no direction, no reason
	agreement, detail := judgeProbe(resp, l4.TCP, sent{outcome: TimedOut, took: ProbeWait}, append([]*apiv1.FlowRecord{opened}, p.Records...), append([]string{"n1"}, read...))
	if agreement != "agrees" || !strings.Contains(detail, "recorded: n1 open CACHED; n2 DENIED ingress (default deny: ingress isolated by x/c-from-a)") {
		t.Errorf("judged %s: %s", agreement, detail)
	}
}

// TestTraceTiers: a policy hop is decided tier by tier, naming the
// deciding ClusterNetworkPolicy rule (tier, policy, priority, index,
// name) or the Admin rule that passed the decision on to the
// NetworkPolicies; a direction no NetworkPolicy isolates is never said to
// be isolated by one; audit never overrides Admin, and its note agrees
// with audit's records: what Admin decides is never audited; a tiered
// direction's would-deny is neither logged nor counted.
func TestTraceTiers(t *testing.T) {
	pfx := netip.MustParsePrefix
	tcp := func(port uint16) []policy.PortRange {
		return []policy.PortRange{{Proto: policy.TCP, First: port, Last: port}}
	}
	noEgress := policy.TierRule{Policy: "deny-all", Priority: 10, Name: "no-egress", Action: policy.Deny, Peers: []netip.Prefix{pfx("10.0.1.3/32")}, Ports: tcp(80)}
	pass := policy.TierRule{Policy: "default-pass", Priority: 20, Index: 2, Name: "pods", Action: policy.Pass, Peers: []netip.Prefix{pfx("10.0.0.0/16")}}
	baseDeny := policy.TierRule{Policy: "base", Priority: 5, Index: 1, Action: policy.Deny, Peers: []netip.Prefix{pfx("10.0.0.0/16")}, Ports: tcp(81)}
	noIngress := policy.TierRule{Policy: "quarantine", Priority: 1, Index: 3, Name: "from-a", Action: policy.Deny, Peers: []netip.Prefix{pfx("10.0.1.2/32")}}
	auditAllow := &policy.Direction{Policies: []string{"x/try"}, Rules: []policy.Rule{{Policy: "x/try", Peers: []netip.Prefix{pfx("10.0.1.2/32")}}}}
	auditDeny := &policy.Direction{Policies: []string{"x/try"}}
	for _, c := range []struct {
		name                   string
		egress, ingress, audit func(*policy.Direction) *policy.Direction // of x/a, x/b's as compiled, x/b's audit
		port                   uint32
		hop                    int
		verdict, tier, detail  string
		policies               []string
		rule                   int32
		ruleName               string
	}{
		{name: "Admin deny of egress", port: 80, hop: 0, verdict: "denied", tier: "Admin",
			egress: func(*policy.Direction) *policy.Direction {
				return &policy.Direction{ClusterOnly: true, Admin: []policy.TierRule{noEgress}}
			},
			detail:   `denied by ClusterNetworkPolicy deny-all (Admin, priority 10) egress rule 0 "no-egress"`,
			policies: []string{"deny-all"}, rule: 0, ruleName: "no-egress"},
		{name: "Admin pass, then the NetworkPolicy allows", port: 80, hop: 2, verdict: "allowed", tier: "NetworkPolicy",
			ingress: func(d *policy.Direction) *policy.Direction {
				d.Admin = []policy.TierRule{pass}
				return d
			},
			detail:   `allowed by NetworkPolicy x/allow-a ingress rule 0 (ClusterNetworkPolicy default-pass (Admin, priority 20) ingress rule 2 "pods" passed it on)`,
			policies: []string{"x/allow-a"}, rule: 0},
		{name: "Baseline deny, no NetworkPolicy", port: 81, hop: 2, verdict: "denied", tier: "Baseline",
			ingress: func(*policy.Direction) *policy.Direction {
				return &policy.Direction{ClusterOnly: true, Baseline: []policy.TierRule{baseDeny}}
			},
			detail: "denied by ClusterNetworkPolicy base (Baseline, priority 5) ingress rule 1", policies: []string{"base"}, rule: 1},
		{name: "Baseline deny, an audited policy would allow", port: 81, hop: 2, verdict: "denied", tier: "Baseline",
			ingress: func(*policy.Direction) *policy.Direction {
				return &policy.Direction{ClusterOnly: true, Baseline: []policy.TierRule{baseDeny}}
			},
			audit:    func(*policy.Direction) *policy.Direction { return auditAllow },
			detail:   "denied by ClusterNetworkPolicy base (Baseline, priority 5) ingress rule 1; audited x/try ingress rule 0 (not enforced): would allow",
			policies: []string{"base"}, rule: 1},
		{name: "Admin deny stands whatever audit says", port: 80, hop: 2, verdict: "denied", tier: "Admin",
			ingress: func(*policy.Direction) *policy.Direction {
				return &policy.Direction{ClusterOnly: true, Admin: []policy.TierRule{noIngress}}
			},
			audit:  func(*policy.Direction) *policy.Direction { return auditAllow },
			detail: `denied by ClusterNetworkPolicy quarantine (Admin, priority 1) ingress rule 3 "from-a"`, policies: []string{"quarantine"}, rule: 3, ruleName: "from-a"},
		{name: "Admin accept is not audited", port: 80, hop: 2, verdict: "allowed", tier: "Admin",
			ingress: func(*policy.Direction) *policy.Direction {
				accept := noIngress
				accept.Action = policy.Accept
				return &policy.Direction{ClusterOnly: true, Admin: []policy.TierRule{accept}}
			},
			audit:  func(*policy.Direction) *policy.Direction { return auditDeny },
			detail: `allowed by ClusterNetworkPolicy quarantine (Admin, priority 1) ingress rule 3 "from-a"`, policies: []string{"quarantine"}, rule: 3, ruleName: "from-a"},
		{name: "no tier rule matches, an audited policy would deny", port: 82, hop: 2, verdict: "allowed",
			ingress: func(*policy.Direction) *policy.Direction {
				return &policy.Direction{ClusterOnly: true, Baseline: []policy.TierRule{baseDeny}}
			},
			audit: func(*policy.Direction) *policy.Direction { return auditDeny },
			detail: "allowed: no NetworkPolicy isolates the pod's ingress, and no ClusterNetworkPolicy rule matches; " +
				"audited by x/try (not enforced): would deny, but ClusterNetworkPolicy rules judge the ingress, where audit logs and counts no would-deny", rule: -1},
		{name: "no rule of any tier matches", port: 82, hop: 2, verdict: "allowed",
			ingress: func(*policy.Direction) *policy.Direction {
				return &policy.Direction{ClusterOnly: true, Baseline: []policy.TierRule{baseDeny}}
			},
			detail: "allowed: no NetworkPolicy isolates the pod's ingress, and no ClusterNetworkPolicy rule matches", rule: -1},
	} {
		st := bed(t)
		rules := st.Rules()
		rules.Pods = slices.Clone(rules.Pods)
		a, b := &rules.Pods[0], &rules.Pods[1]
		if c.egress != nil {
			a.Egress = c.egress(a.Egress)
		}
		if c.ingress != nil {
			in := *b.Ingress
			b.Ingress = c.ingress(&in)
		}
		if c.audit != nil {
			b.AuditIngress = c.audit(b.AuditIngress)
		}
		st.Rules = func() policy.Ruleset { return rules }
		resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "x/b", Port: c.port})
		if err != nil {
			t.Fatal(err)
		}
		h := resp.Paths[0].Hops[c.hop]
		if h.Verdict != c.verdict || h.Tier != c.tier || h.Detail != c.detail || !slices.Equal(h.Policies, c.policies) || h.Rule != c.rule || h.RuleName != c.ruleName {
			t.Errorf("%s: %s tier %q %q %v rule %d %q\nwant %s tier %q %q %v rule %d %q", c.name, h.Verdict, h.Tier, h.Detail, h.Policies, h.Rule, h.RuleName,
				c.verdict, c.tier, c.detail, c.policies, c.rule, c.ruleName)
		}
	}
}

// TestTraceTierDisagreement: another node's answer that names the same
// rule in another tier is a disagreement, and the detail says so.
func TestTraceTierDisagreement(t *testing.T) {
	st := bed(t)
	st.Peer = func(context.Context, string, *apiv1.TraceIngressRequest) (*apiv1.TraceIngressResponse, error) {
		return &apiv1.TraceIngressResponse{Node: "n2", Ingress: &apiv1.TraceHop{Node: "n2", Step: StepIngress, Verdict: "allowed", Basis: BasisEnforced,
			Policies: []string{"x/c-from-a"}, Rule: 0, Tier: "Admin", Detail: "allowed by ClusterNetworkPolicy x/c-from-a"}}, nil
	}
	resp, err := Trace(t.Context(), st, &apiv1.TraceRequest{Source: "x/a", Destination: "x/c", Port: 80})
	if err != nil {
		t.Fatal(err)
	}
	if in := resp.Paths[0].Hops[2]; in.Tier != "Admin" || !strings.Contains(in.Detail, "n1 computes otherwise from its own view of the cluster: allowed, allowed by x/c-from-a ingress rule 0") {
		t.Errorf("n2 names the rule in another tier: %v", in)
	}
}
