package flows

import (
	"net/netip"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	dpflows "github.com/onc-net/onc/datapath/flows"
	"github.com/onc-net/onc/datapath/policy"
)

func clusterPod(ns, name, node, ip string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Spec: corev1.PodSpec{NodeName: node},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIPs: []corev1.PodIP{{IP: ip}}}}
}

// A logged packet becomes a record naming both pods, the local one by its
// chain's id, the other by its address among the cluster's pods, and the
// policies isolating the local one in the direction that denied.
func TestRecorderResolves(t *testing.T) {
	b := policy.Pod{Key: "x/b", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5")},
		Ingress: &policy.Direction{Policies: []string{"x/deny-all", "x/web"}}}
	rules := policy.Ruleset{Pods: []policy.Pod{b}}
	pods := []*corev1.Pod{clusterPod("y", "a", "n2", "10.244.1.7"), clusterPod("x", "b", "n1", "10.244.0.5")}
	s := NewStore(8)
	r := NewRecorder(s, "n1", func() policy.Ruleset { return rules }, func() []*corev1.Pod { return pods })
	now := time.Now()
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictDenied, Ingress: true, PodID: policy.PodID("x/b"), Proto: 6,
		Src: netip.MustParseAddrPort("10.244.1.7:40000"), Dst: netip.MustParseAddrPort("10.244.0.5:80")})
	// b's egress is not isolated (any more): the record says so.
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictDenied, PodID: policy.PodID("x/b"), Proto: 17,
		Src: netip.MustParseAddrPort("10.244.0.5:5000"), Dst: netip.MustParseAddrPort("192.0.2.1:53")})
	// A pod that left: its id is unknown.
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictDenied, Ingress: true, PodID: "0000000000", Proto: 6,
		Src: netip.MustParseAddrPort("10.244.1.7:40001"), Dst: netip.MustParseAddrPort("10.244.0.9:80")})
	got := s.List(Filter{})
	if len(got) != 3 {
		t.Fatalf("%d records, want 3: %+v", len(got), got)
	}
	want0 := Record{Time: now, Node: "n1", Event: EventPolicy, Verdict: VerdictDenied, Direction: "ingress", Proto: 6, Path: "slow",
		Src:      Endpoint{Kind: KindPod, Namespace: "y", Name: "a", Node: "n2", Addr: netip.MustParseAddrPort("10.244.1.7:40000")},
		Dst:      Endpoint{Kind: KindPod, Namespace: "x", Name: "b", Node: "n1", Addr: netip.MustParseAddrPort("10.244.0.5:80")},
		Policies: []string{"x/deny-all", "x/web"},
		Reason:   "default deny: ingress isolated by x/deny-all, x/web, and no rule of theirs allows this"}
	if g := got[0]; !reflect.DeepEqual(g, want0) {
		t.Errorf("ingress record:\n%+v\nwant\n%+v", g, want0)
	}
	if g := got[1]; g.Direction != "egress" || g.Src.Kind != KindPod || g.Src.Name != "b" || g.Dst.Kind != KindIP || g.Policies != nil ||
		g.Reason != "default deny: x/b (10.244.0.5:5000) was egress isolated then, and is not now" {
		t.Errorf("egress record of a pod no longer isolated: %+v", g)
	}
	if g := got[2]; g.Dst.Kind != KindIP || g.Src.Name != "a" || g.Reason != "default deny of a pod this agent's rules do not hold (new, or gone)" {
		t.Errorf("record of a gone pod: %+v", g)
	}
	// The cluster's pods are read again once they changed, at most once
	// a second.
	pods = []*corev1.Pod{clusterPod("z", "c", "n3", "10.244.1.7")}
	deny := func(port uint16) Endpoint {
		r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictDenied, Ingress: true, PodID: policy.PodID("x/b"), Proto: 6,
			Src: netip.AddrPortFrom(netip.MustParseAddr("10.244.1.7"), port), Dst: netip.MustParseAddrPort("10.244.0.5:80")})
		got := s.List(Filter{})
		return got[len(got)-1].Src
	}
	if e := deny(40002); e.Name != "a" {
		t.Errorf("before PodsChanged: %v, want y/a still", e)
	}
	r.PodsChanged()
	if e := deny(40003); e.Name != "a" {
		t.Errorf("right after PodsChanged: %v, want y/a still (read at most once a second)", e)
	}
	r.reindex = 0
	if e := deny(40004); e.Name != "c" || e.Namespace != "z" {
		t.Errorf("after PodsChanged and the wait: %v, want z/c", e)
	}
}

// Audit's packets become records naming the audited policies: what they
// would deny where no enforcing policy isolates the pod, and, of a packet
// the enforcing ones dropped, those of them with a rule allowing it.
func TestRecorderAudit(t *testing.T) {
	b := policy.Pod{Key: "x/b", IPs: []netip.Addr{netip.MustParseAddr("10.244.0.5")},
		// Room after the policies: a record that appends to them must not
		// write into the ruleset's, or another record's.
		Ingress: &policy.Direction{Policies: append(make([]string, 0, 4), "x/deny-all")},
		AuditIngress: &policy.Direction{Policies: []string{"x/try-a", "x/try-c"}, Rules: []policy.Rule{
			{Policy: "x/try-a", Peers: []netip.Prefix{netip.MustParsePrefix("10.244.1.7/32")}, Ports: []policy.PortRange{{Proto: policy.TCP, First: 80, Last: 80}}},
			{Policy: "x/try-c", Peers: []netip.Prefix{netip.MustParsePrefix("10.244.1.8/32")}}}},
		AuditEgress: &policy.Direction{Policies: []string{"x/try-egress"}}}
	rules := policy.Ruleset{Pods: []policy.Pod{b}}
	s := NewStore(8)
	r := NewRecorder(s, "n1", func() policy.Ruleset { return rules }, func() []*corev1.Pod { return nil })
	now := time.Now()
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldDeny, PodID: policy.PodID("x/b"), Proto: 17,
		Src: netip.MustParseAddrPort("10.244.0.5:5000"), Dst: netip.MustParseAddrPort("192.0.2.1:53")})
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldAllow, Ingress: true, PodID: policy.PodID("x/b"), Proto: 6,
		Src: netip.MustParseAddrPort("10.244.1.7:40000"), Dst: netip.MustParseAddrPort("10.244.0.5:80")})
	// Allowed by no audited rule now (the rules changed since).
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldAllow, Ingress: true, PodID: policy.PodID("x/b"), Proto: 6,
		Src: netip.MustParseAddrPort("10.244.1.7:40001"), Dst: netip.MustParseAddrPort("10.244.0.5:81")})
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldAllow, Ingress: true, PodID: policy.PodID("x/b"), Proto: 17,
		Src: netip.MustParseAddrPort("10.244.1.8:40000"), Dst: netip.MustParseAddrPort("10.244.0.5:53")})
	got := s.List(Filter{})
	if len(got) != 4 {
		t.Fatalf("%d records, want 4: %+v", len(got), got)
	}
	for i, want := range []struct {
		verdict, reason string
		policies        []string
	}{
		{VerdictWouldDeny, "audit would deny: egress audited by x/try-egress, no enforcing policy isolates it, and no rule of the audited ones allows this; not enforced",
			[]string{"x/try-egress"}},
		{VerdictWouldAllow, "default deny: ingress isolated by x/deny-all, and no rule of theirs allows this; audited x/try-a would allow it",
			[]string{"x/deny-all", "x/try-a"}},
		{VerdictWouldAllow, "default deny: ingress isolated by x/deny-all, and no rule of theirs allows this; an audited policy would have allowed it then, and none does now",
			[]string{"x/deny-all"}},
		{VerdictWouldAllow, "default deny: ingress isolated by x/deny-all, and no rule of theirs allows this; audited x/try-c would allow it",
			[]string{"x/deny-all", "x/try-c"}},
	} {
		if g := got[i]; g.Verdict != want.verdict || g.Reason != want.reason || !reflect.DeepEqual(g.Policies, want.policies) || g.Event != EventPolicy {
			t.Errorf("record %d: %s %q %v, want %s %q %v", i, g.Verdict, g.Reason, g.Policies, want.verdict, want.reason, want.policies)
		}
	}
}
