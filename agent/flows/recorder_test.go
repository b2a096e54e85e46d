package flows

import (
	"fmt"
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
	r := NewRecorder(s, "n1", func() policy.Ruleset { return rules }, noneLogged, func() []*corev1.Pod { return pods })
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
		Policies: []string{"x/deny-all", "x/web"}, Tier: "NetworkPolicy",
		Reason: "default deny: ingress isolated by x/deny-all, x/web, and no rule of theirs allows this"}
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
// would deny where no enforcing policy isolates the pod (allowed, audit
// would-deny), and, of a packet the enforcing ones dropped (denied, audit
// would-allow), those of them with a rule allowing it.
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
	// W and U name the audited rules by their fingerprint; U's also names
	// the enforcing rules that dropped the packet by theirs: "ein" now,
	// "eold" before a change.
	history := map[string]policy.Logged{"ain": {Pod: "x/b", Direction: b.AuditIngress}, "aeg": {Pod: "x/b", Direction: b.AuditEgress},
		"ein": {Pod: "x/b", Direction: b.Ingress}, "eold": {Pod: "x/b", Direction: &policy.Direction{Policies: []string{"x/old-deny"}}}}
	logged := func(id string, ingress bool, fp string) (policy.Logged, bool) {
		l, ok := history[fp]
		return l, ok && id == policy.PodID("x/b") && ingress == (fp != "aeg")
	}
	s := NewStore(8)
	r := NewRecorder(s, "n1", func() policy.Ruleset { return rules }, logged, func() []*corev1.Pod { return nil })
	now := time.Now()
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldDeny, Fingerprint: "aeg", PodID: policy.PodID("x/b"), Proto: 17,
		Src: netip.MustParseAddrPort("10.244.0.5:5000"), Dst: netip.MustParseAddrPort("192.0.2.1:53")})
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldAllow, Ingress: true, Fingerprint: "ain", EnforcingFingerprint: "ein", PodID: policy.PodID("x/b"), Proto: 6,
		Src: netip.MustParseAddrPort("10.244.1.7:40000"), Dst: netip.MustParseAddrPort("10.244.0.5:80")})
	// Allowed by no audited rule as the agent read it.
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldAllow, Ingress: true, Fingerprint: "ain", EnforcingFingerprint: "ein", PodID: policy.PodID("x/b"), Proto: 6,
		Src: netip.MustParseAddrPort("10.244.1.7:40001"), Dst: netip.MustParseAddrPort("10.244.0.5:81")})
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldAllow, Ingress: true, Fingerprint: "ain", EnforcingFingerprint: "ein", PodID: policy.PodID("x/b"), Proto: 17,
		Src: netip.MustParseAddrPort("10.244.1.8:40000"), Dst: netip.MustParseAddrPort("10.244.0.5:53")})
	// Of audited rules the agent no longer holds.
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldDeny, Fingerprint: "gone", PodID: policy.PodID("x/b"), Proto: 17,
		Src: netip.MustParseAddrPort("10.244.0.5:5001"), Dst: netip.MustParseAddrPort("192.0.2.1:53")})
	// Dropped by enforcing rules since changed: the record names those.
	r.Packet(dpflows.Packet{Time: now, Verdict: dpflows.VerdictWouldAllow, Ingress: true, Fingerprint: "ain", EnforcingFingerprint: "eold", PodID: policy.PodID("x/b"), Proto: 17,
		Src: netip.MustParseAddrPort("10.244.1.8:40001"), Dst: netip.MustParseAddrPort("10.244.0.5:53")})
	got := s.List(Filter{})
	if len(got) != 6 {
		t.Fatalf("%d records, want 6: %+v", len(got), got)
	}
	for i, want := range []struct {
		verdict, audit, reason string
		policies               []string
	}{
		{VerdictAllowed, AuditWouldDeny, "audit would deny: egress audited by x/try-egress, no enforcing policy isolates it, and no rule of the audited ones allows this; not enforced",
			[]string{"x/try-egress"}},
		{VerdictDenied, AuditWouldAllow, "default deny: ingress isolated by x/deny-all, and no rule of theirs allows this; audited x/try-a would allow it",
			[]string{"x/deny-all", "x/try-a"}},
		{VerdictDenied, AuditWouldAllow, "default deny: ingress isolated by x/deny-all, and no rule of theirs allows this; yet no rule of the audited x/try-a, x/try-c allows it as the agent read it",
			[]string{"x/deny-all"}},
		{VerdictDenied, AuditWouldAllow, "default deny: ingress isolated by x/deny-all, and no rule of theirs allows this; audited x/try-c would allow it",
			[]string{"x/deny-all", "x/try-c"}},
		{VerdictAllowed, AuditWouldDeny, "audit would deny (not enforced) by egress rules this agent no longer holds (fingerprint gone)", nil},
		{VerdictDenied, AuditWouldAllow, "default deny: ingress isolated by x/old-deny, and no rule of theirs allows this; audited x/try-c would allow it",
			[]string{"x/old-deny", "x/try-c"}},
	} {
		if g := got[i]; g.Verdict != want.verdict || g.Audit != want.audit || g.Reason != want.reason || !reflect.DeepEqual(g.Policies, want.policies) || g.Event != EventPolicy {
			t.Errorf("record %d: %s (audit %s) %q %v, want %s (audit %s) %q %v", i, g.Verdict, g.Audit, g.Reason, g.Policies, want.verdict, want.audit, want.reason, want.policies)
		}
	}
}

func noneLogged(string, bool, string) (policy.Logged, bool) { return policy.Logged{}, false }

// Records of a pod chain's verdicts name the rules of the fingerprint in
// the prefix, not the rules now: an allowed connection the first rule
// that allows it, a denied one the policies that isolated the pod, a
// fingerprint of rules since superseded too; one the agent no longer
// holds says so. Base chains' drops name the pod by its veth and the check.
func TestRecorderVerdicts(t *testing.T) {
	ip := netip.MustParseAddr
	b := policy.Pod{Key: "x/b", Iface: "onc1234", IPs: []netip.Addr{ip("10.244.0.5")},
		Ingress: &policy.Direction{Policies: []string{"x/now"}}}
	rules := policy.Ruleset{Pods: []policy.Pod{b}}
	// What the fingerprints in the prefixes stand for: cur is in force,
	// old was superseded by it.
	cur := &policy.Direction{Policies: []string{"x/allow-db", "x/allow-web"}, Rules: []policy.Rule{
		{Policy: "x/allow-web", Index: 0, Peers: []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")}, Ports: []policy.PortRange{{Proto: policy.TCP, First: 80, Last: 80}}},
		{Policy: "x/allow-db", Index: 3, Peers: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")}, Ports: []policy.PortRange{{Proto: policy.TCP, First: 5000, Last: 5999}}},
		{Policy: "x/allow-web", Index: 1, Peers: []netip.Prefix{netip.MustParsePrefix("10.244.1.7/32")}},
	}}
	old := &policy.Direction{Policies: []string{"x/old"}, Rules: []policy.Rule{
		{Policy: "x/old", Index: 2, Peers: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}},
	}}
	id := policy.PodID("x/b")
	history := map[string]policy.Logged{"cur": {Pod: "x/b", Direction: cur}, "old": {Pod: "x/b", Direction: old}}
	logged := func(gotID string, ingress bool, fp string) (policy.Logged, bool) {
		l, ok := history[fp]
		return l, ok && gotID == id && ingress
	}
	s := NewStore(16)
	r := NewRecorder(s, "n1", func() policy.Ruleset { return rules }, logged,
		func() []*corev1.Pod { return []*corev1.Pod{clusterPod("y", "a", "n2", "10.244.1.7")} })
	in := func(verdict, fp string, src string, dport uint16) Record {
		r.Packet(dpflows.Packet{Verdict: verdict, Ingress: true, PodID: id, Fingerprint: fp, Proto: 6,
			Src: netip.MustParseAddrPort(src), Dst: netip.AddrPortFrom(ip("10.244.0.5"), dport)})
		got := s.List(Filter{})
		return got[len(got)-1]
	}
	for _, c := range []struct {
		name     string
		got      Record
		verdict  string
		reason   string
		policies []string
		rule     *int
	}{
		{"allowed, by the first rule that allows it", in(dpflows.VerdictAllowed, "cur", "10.244.1.7:40000", 80),
			VerdictAllowed, "allowed by x/allow-web ingress rule 0", []string{"x/allow-web"}, ruleIndex(0)},
		{"allowed, in a port range", in(dpflows.VerdictAllowed, "cur", "10.244.1.8:40000", 5432),
			VerdictAllowed, "allowed by x/allow-db ingress rule 3", []string{"x/allow-db"}, ruleIndex(3)},
		{"allowed, on every port", in(dpflows.VerdictAllowed, "cur", "10.244.1.7:40000", 22),
			VerdictAllowed, "allowed by x/allow-web ingress rule 1", []string{"x/allow-web"}, ruleIndex(1)},
		{"allowed by a superseded ruleset", in(dpflows.VerdictAllowed, "old", "10.244.1.7:40000", 22),
			VerdictAllowed, "allowed by x/old ingress rule 2", []string{"x/old"}, ruleIndex(2)},
		{"allowed by rules the agent no longer holds", in(dpflows.VerdictAllowed, "gone", "10.244.1.7:40000", 22),
			VerdictAllowed, "allowed by ingress rules this agent no longer holds (fingerprint gone)", nil, nil},
		{"allowed, yet no rule allows it as read", in(dpflows.VerdictAllowed, "cur", "192.0.2.1:40000", 22),
			VerdictAllowed, "allowed, yet as the agent read the ingress rules: default deny: ingress isolated by x/allow-db, x/allow-web, and no rule of theirs allows this",
			[]string{"x/allow-db", "x/allow-web"}, nil},
		{"denied, isolated by the fingerprint's policies", in(dpflows.VerdictDenied, "cur", "192.0.2.1:40000", 22),
			VerdictDenied, "default deny: ingress isolated by x/allow-db, x/allow-web, and no rule of theirs allows this", []string{"x/allow-db", "x/allow-web"}, nil},
		{"denied, in a prefix without a fingerprint: the rules now", in(dpflows.VerdictDenied, "", "192.0.2.1:40000", 22),
			VerdictDenied, "default deny: ingress isolated by x/now, and no rule of theirs allows this", []string{"x/now"}, nil},
	} {
		g := c.got
		if g.Verdict != c.verdict || g.Reason != c.reason || !reflect.DeepEqual(g.Policies, c.policies) || !reflect.DeepEqual(g.Rule, c.rule) || g.Event != EventPolicy {
			t.Errorf("%s: %s %s %q policies %v rule %s, want %s %s %q policies %v rule %s", c.name, g.Event, g.Verdict, g.Reason, g.Policies, ruleString(g.Rule),
				EventPolicy, c.verdict, c.reason, c.policies, ruleString(c.rule))
		}
		if g.Dst.Kind != KindPod || g.Dst.Namespace != "x" || g.Dst.Name != "b" || g.Dst.Node != "n1" {
			t.Errorf("%s: the local end is %+v, want x/b on n1", c.name, g.Dst)
		}
	}

	drop := func(why string, ingress bool, iface string, src, dst string) Record {
		r.Packet(dpflows.Packet{Verdict: dpflows.VerdictDropped, Why: why, Ingress: ingress, Iface: iface, Proto: 6,
			Src: netip.MustParseAddrPort(src), Dst: netip.MustParseAddrPort(dst)})
		got := s.List(Filter{Verdict: VerdictDropped})
		return got[len(got)-1]
	}
	spoof := drop(dpflows.DropSpoof, false, "onc1234", "10.244.1.7:40000", "10.244.0.9:80")
	if spoof.Event != EventDrop || spoof.Direction != "egress" || spoof.Rule != nil || spoof.Src.Kind != KindPod || spoof.Src.Name != "b" ||
		spoof.Src.Addr.String() != "10.244.1.7:40000" || spoof.Reason != "spoofed source: 10.244.1.7 is not the address of x/b" {
		t.Errorf("spoofed: %+v", spoof)
	}
	for _, c := range []struct {
		why     string
		ingress bool
		iface   string
		reason  string
	}{
		{dpflows.DropInvalid, true, "onc1234", "conntrack state invalid: the packet belongs to no connection conntrack can follow"},
		{dpflows.DropNoSYN, true, "onc1234", "a new TCP connection without a SYN, to an isolated pod"},
		{dpflows.DropNoSYN, false, "onc1234", "a new TCP connection without a SYN, from an isolated pod"},
	} {
		g := drop(c.why, c.ingress, c.iface, "10.244.1.7:40000", "10.244.0.5:80")
		local := g.Src
		if c.ingress {
			local = g.Dst
		}
		if g.Event != EventDrop || g.Verdict != VerdictDropped || g.Reason != c.reason || local.Kind != KindPod || local.Name != "b" {
			t.Errorf("%s ingress=%v: %+v", c.why, c.ingress, g)
		}
	}
	if g := drop(dpflows.DropSpoof, false, "", "10.244.1.7:40000", "10.244.0.9:80"); g.Src.Kind != KindIP ||
		g.Reason != "spoofed source: 10.244.1.7 is not the address of a pod whose veth is gone" {
		t.Errorf("spoofed from a veth gone: %+v", g)
	}
}

func ruleIndex(i int) *int { return &i }

// Records of pods ClusterNetworkPolicy rules judge name the deciding rule
// by its tier, policy, priority, index and name: an Admin deny; an Admin
// pass, then a NetworkPolicy allow or default deny, naming the pass; where
// no NetworkPolicy isolates the pod, a Baseline deny (not "isolated by"
// anything) and accept, and no rule matching at all. Audit's records of
// such a direction name the deciding rule too; a would-deny (logged only
// where no rule of any tier judges) of a direction tiered since says so.
func TestRecorderTiers(t *testing.T) {
	ip, pfx := netip.MustParseAddr, netip.MustParsePrefix
	deny := policy.TierRule{Policy: "deny-all", Priority: 10, Index: 0, Name: "no-ingress", Action: policy.Deny, Peers: []netip.Prefix{pfx("192.0.2.0/24")}}
	pass := policy.TierRule{Policy: "default-pass", Priority: 20, Index: 2, Name: "pass-pods", Action: policy.Pass, Peers: []netip.Prefix{pfx("10.244.0.0/16")}}
	isolated := &policy.Direction{Policies: []string{"x/np"}, Admin: []policy.TierRule{deny, pass}, Rules: []policy.Rule{
		{Policy: "x/np", Index: 1, Peers: []netip.Prefix{pfx("10.244.1.0/24")}, Ports: []policy.PortRange{{Proto: policy.TCP, First: 80, Last: 80}}}}}
	clusterOnly := &policy.Direction{ClusterOnly: true, Admin: []policy.TierRule{deny}, Baseline: []policy.TierRule{
		{Policy: "base", Priority: 5, Index: 0, Action: policy.Deny, Peers: []netip.Prefix{pfx("10.244.2.0/24")}},
		{Policy: "base", Priority: 5, Index: 1, Name: "dns", Action: policy.Accept, Peers: []netip.Prefix{pfx("10.244.3.0/24")},
			Ports: []policy.PortRange{{Proto: policy.UDP, First: 53, Last: 53}}}}}
	id := policy.PodID("x/b")
	audited := &policy.Direction{Policies: []string{"x/try"}, Rules: []policy.Rule{{Policy: "x/try", Peers: []netip.Prefix{pfx("192.0.2.0/24"), pfx("10.244.2.0/24")}}}}
	history := map[string]policy.Logged{"iso": {Pod: "x/b", Direction: isolated}, "only": {Pod: "x/b", Direction: clusterOnly}, "aud": {Pod: "x/b", Direction: audited}}
	logged := func(gotID string, ingress bool, fp string) (policy.Logged, bool) {
		l, ok := history[fp]
		return l, ok && gotID == id && ingress
	}
	rules := policy.Ruleset{Pods: []policy.Pod{{Key: "x/b", IPs: []netip.Addr{ip("10.244.0.5")}, Ingress: clusterOnly}}}
	s := NewStore(16)
	r := NewRecorder(s, "n1", func() policy.Ruleset { return rules }, logged, func() []*corev1.Pod { return nil })
	in := func(verdict, fp string, proto uint8, src string, dport uint16) Record {
		r.Packet(dpflows.Packet{Verdict: verdict, Ingress: true, PodID: id, Fingerprint: fp, Proto: proto,
			Src: netip.MustParseAddrPort(src), Dst: netip.AddrPortFrom(ip("10.244.0.5"), dport)})
		got := s.List(Filter{})
		return got[len(got)-1]
	}
	audit := func(verdict, enforcing, src string) Record {
		r.Packet(dpflows.Packet{Verdict: verdict, Ingress: true, PodID: id, Fingerprint: "aud", EnforcingFingerprint: enforcing, Proto: 6,
			Src: netip.MustParseAddrPort(src), Dst: netip.AddrPortFrom(ip("10.244.0.5"), 80)})
		got := s.List(Filter{})
		return got[len(got)-1]
	}
	const passed = ` (ClusterNetworkPolicy default-pass (Admin, priority 20) ingress rule 2 "pass-pods" passed it on)`
	for _, c := range []struct {
		name                        string
		got                         Record
		verdict, tier, reason, rule string
		policies                    []string
		index                       *int
	}{
		{"Admin deny over a NetworkPolicy", in(dpflows.VerdictDenied, "iso", 6, "192.0.2.1:40000", 80),
			VerdictDenied, "Admin", `denied by ClusterNetworkPolicy deny-all (Admin, priority 10) ingress rule 0 "no-ingress"`, "no-ingress", []string{"deny-all"}, ruleIndex(0)},
		{"Admin pass, NetworkPolicy allows", in(dpflows.VerdictAllowed, "iso", 6, "10.244.1.7:40000", 80),
			VerdictAllowed, "NetworkPolicy", "allowed by NetworkPolicy x/np ingress rule 1" + passed, "", []string{"x/np"}, ruleIndex(1)},
		{"Admin pass, NetworkPolicy's default deny", in(dpflows.VerdictDenied, "iso", 6, "10.244.2.9:40000", 80),
			VerdictDenied, "NetworkPolicy", "default deny: ingress isolated by x/np, and no rule of theirs allows this" + passed, "", []string{"x/np"}, nil},
		{"Baseline deny, no NetworkPolicy", in(dpflows.VerdictDenied, "only", 6, "10.244.2.9:40000", 80),
			VerdictDenied, "Baseline", "denied by ClusterNetworkPolicy base (Baseline, priority 5) ingress rule 0", "", []string{"base"}, ruleIndex(0)},
		{"Baseline accept", in(dpflows.VerdictAllowed, "only", 17, "10.244.3.4:40000", 53),
			VerdictAllowed, "Baseline", `allowed by ClusterNetworkPolicy base (Baseline, priority 5) ingress rule 1 "dns"`, "dns", []string{"base"}, ruleIndex(1)},
		{"no rule of any tier matches", in(dpflows.VerdictAllowed, "only", 6, "10.244.4.4:40000", 80),
			VerdictAllowed, "", "allowed: no NetworkPolicy isolates the pod's ingress, and no ClusterNetworkPolicy rule matches", "", nil, nil},
		{"denied, yet no rule matches as read", in(dpflows.VerdictDenied, "only", 6, "10.244.4.4:40000", 80),
			VerdictDenied, "", "denied, yet as the agent read the ingress rules: allowed: no NetworkPolicy isolates the pod's ingress, and no ClusterNetworkPolicy rule matches", "", nil, nil},
		{"a prefix without a fingerprint: the rules now", in(dpflows.VerdictDenied, "", 6, "192.0.2.1:40000", 80),
			VerdictDenied, "Admin", `denied by ClusterNetworkPolicy deny-all (Admin, priority 10) ingress rule 0 "no-ingress"`, "no-ingress", []string{"deny-all"}, ruleIndex(0)},
		{"would allow after an Admin pass", audit(dpflows.VerdictWouldAllow, "iso", "10.244.2.9:40000"),
			VerdictDenied, "NetworkPolicy", "default deny: ingress isolated by x/np, and no rule of theirs allows this" + passed + "; audited x/try would allow it",
			"", []string{"x/np", "x/try"}, nil},
		{"would allow under a Baseline deny", audit(dpflows.VerdictWouldAllow, "only", "10.244.2.9:40000"),
			VerdictDenied, "Baseline", "denied by ClusterNetworkPolicy base (Baseline, priority 5) ingress rule 0; audited x/try would allow it", "", []string{"base", "x/try"}, ruleIndex(0)},
		{"would deny, ClusterNetworkPolicy rules since", audit(dpflows.VerdictWouldDeny, "", "10.244.4.4:40000"),
			VerdictAllowed, "", "audit would deny: ingress audited by x/try, no enforcing policy isolates it, and no rule of the audited ones allows this; not enforced " +
				"(logged before ClusterNetworkPolicy rules applied to the ingress, where audit reports no would-deny; as they judge it now: " +
				"allowed: no NetworkPolicy isolates the pod's ingress, and no ClusterNetworkPolicy rule matches)", "", []string{"x/try"}, nil},
	} {
		g := c.got
		if g.Verdict != c.verdict || g.Tier != c.tier || g.Reason != c.reason || g.RuleName != c.rule || !reflect.DeepEqual(g.Policies, c.policies) || !reflect.DeepEqual(g.Rule, c.index) {
			t.Errorf("%s: %s tier %q %q rule %s %q policies %v, want %s tier %q %q rule %s %q policies %v", c.name, g.Verdict, g.Tier, g.Reason, ruleString(g.Rule), g.RuleName, g.Policies,
				c.verdict, c.tier, c.reason, ruleString(c.index), c.rule, c.policies)
		}
	}
	// The API and its exports carry the tier and the rule's name.
	if a := toAPI(s.List(Filter{})[0]); a.Tier != "Admin" || a.RuleName != "no-ingress" || a.GetRule() != 0 || a.Rule == nil {
		t.Errorf("API record %v, want tier Admin, rule 0 \"no-ingress\"", a)
	}
}

func ruleString(rule *int) string {
	if rule == nil {
		return "none"
	}
	return fmt.Sprint(*rule)
}

// An address taken again: this node's pod (by the rules) wins over the
// cluster's, a running pod over a terminating one whatever their order,
// and a finished or host-network pod holds no address.
func TestRecorderIPReuse(t *testing.T) {
	ip := "10.244.1.7"
	old := clusterPod("x", "old", "n2", ip)
	old.DeletionTimestamp = &metav1.Time{Time: time.Unix(100, 0)}
	old.CreationTimestamp = metav1.Time{Time: time.Unix(50, 0)} // newer, yet terminating
	repl := clusterPod("x", "new", "n2", ip)
	done := clusterPod("x", "done", "n2", "10.244.1.8")
	done.Status.Phase = corev1.PodSucceeded
	host := clusterPod("kube-system", "hostnet", "n2", "10.244.1.9")
	host.Spec.HostNetwork = true
	legacy := clusterPod("x", "legacy", "n2", "")
	legacy.Status.PodIPs, legacy.Status.PodIP = nil, "10.244.1.10"
	for order, pods := range [][]*corev1.Pod{{old, repl, done, host, legacy}, {repl, old, done, host, legacy}} {
		r := NewRecorder(NewStore(1), "n1", func() policy.Ruleset { return policy.Ruleset{} }, noneLogged, func() []*corev1.Pod { return pods })
		if e, ok := r.ClusterPod(netip.MustParseAddr(ip)); !ok || e.Name != "new" {
			t.Errorf("order %d: %s is %+v, want the running x/new", order, ip, e)
		}
		for _, a := range []string{"10.244.1.8", "10.244.1.9"} {
			if e, ok := r.ClusterPod(netip.MustParseAddr(a)); ok {
				t.Errorf("%s is %+v, want none: its pod finished or is on the host network", a, e)
			}
		}
		if e, ok := r.ClusterPod(netip.MustParseAddr("10.244.1.10")); !ok || e.Name != "legacy" {
			t.Errorf("a pod with podIP alone: %+v", e)
		}
	}
	// This node's pod, as the rules hold it, took the address.
	local := policy.Ruleset{Pods: []policy.Pod{{Key: "y/mine", IPs: []netip.Addr{netip.MustParseAddr(ip)}}}}
	r := NewRecorder(NewStore(1), "n1", func() policy.Ruleset { return local }, noneLogged, func() []*corev1.Pod { return []*corev1.Pod{repl} })
	if e, ok := r.ClusterPod(netip.MustParseAddr(ip)); !ok || e.Name != "mine" || e.Node != "n1" {
		t.Errorf("a local pod's address: %+v, want y/mine of n1", e)
	}
}

// While one reader reads the cluster's pods again, the others go on with
// the last index: none waits for the copy.
func TestClusterPodNeverWaits(t *testing.T) {
	reading, release := make(chan struct{}), make(chan struct{})
	calls := 0
	r := NewRecorder(NewStore(1), "n1", func() policy.Ruleset { return policy.Ruleset{} }, noneLogged, func() []*corev1.Pod {
		if calls++; calls == 2 {
			close(reading)
			<-release
		}
		return []*corev1.Pod{clusterPod("x", "a", "n2", "10.244.1.7")}
	})
	a := netip.MustParseAddr("10.244.1.7")
	if _, ok := r.ClusterPod(a); !ok {
		t.Fatal("first reading")
	}
	r.PodsChanged()
	r.reindex = 0
	go r.ClusterPod(a) // reads again, and is held
	<-reading
	done := make(chan bool)
	go func() { _, ok := r.ClusterPod(a); done <- ok }()
	select {
	case ok := <-done:
		if !ok {
			t.Error("the last index not used while another reads the pods")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ClusterPod waited for another's reading of the pods")
	}
	close(release)
}
