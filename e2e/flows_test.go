//go:build e2e

package e2e

import (
	"bufio"
	"net/netip"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	apiv1 "github.com/onc-net/onc/api/v1"
	"github.com/onc-net/onc/lab"
)

// onctlFlows runs onctl flows against n's agent with args and decodes its
// JSON lines.
func (c *policyCluster) onctlFlows(t *testing.T, n *lab.Node, args ...string) []*apiv1.FlowRecord {
	t.Helper()
	return onctlFlowRecords(t, c.l, n, args...)
}

// onctlFlowRecords runs onctl flows of lab l against n's agent with args
// and decodes its JSON lines.
func onctlFlowRecords(t *testing.T, l *lab.Lab, n *lab.Node, args ...string) []*apiv1.FlowRecord {
	t.Helper()
	args = append([]string{"--socket", n.AgentSocket(), "-o", "json", "flows"}, args...)
	out, err := exec.Command(filepath.Join(l.BinDir, "onctl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("onctl %s: %v: %s", strings.Join(args, " "), err, out)
	}
	var recs []*apiv1.FlowRecord
	for line := range strings.Lines(string(out)) {
		r := &apiv1.FlowRecord{}
		if err := protojson.Unmarshal([]byte(line), r); err != nil {
			t.Fatalf("onctl %s: %v in line %q", strings.Join(args, " "), err, line)
		}
		recs = append(recs, r)
	}
	return recs
}

// awaitRecord waits up to 2 s for onctl flows on n to show the first
// record with verdict, of pod, made since start of a packet from src to
// dst, and checks that it came within 1 s of start.
func (c *policyCluster) awaitRecord(t *testing.T, n *lab.Node, verdict, pod string, start time.Time, src, dst netip.AddrPort) *apiv1.FlowRecord {
	t.Helper()
	var rec *apiv1.FlowRecord
	for deadline := time.Now().Add(2 * time.Second); rec == nil && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		rec = findRecord(c.onctlFlows(t, n, "--verdict", verdict, "--pod", pod), verdict, start, src, dst)
	}
	if rec == nil {
		t.Fatalf("onctl flows on %s: no %s record of %s → %s; it has %v", n.Name, verdict, src, dst, c.onctlFlows(t, n))
	}
	if took := time.Unix(0, rec.TimeUnixNano).Sub(start); took > time.Second {
		t.Errorf("%s → %s recorded %v after the probe started, want within 1 s", src, dst, took)
	}
	return rec
}

// findRecord finds, among recs, the first record with verdict (or that
// audit) made since since of a packet from src to dst; src's port 0: any
// port.
func findRecord(recs []*apiv1.FlowRecord, verdict string, since time.Time, src, dst netip.AddrPort) *apiv1.FlowRecord {
	for _, r := range recs {
		if (r.Verdict == verdict || r.Audit == verdict) && r.TimeUnixNano >= since.UnixNano() && r.Source.GetIp() == src.Addr().String() &&
			(src.Port() == 0 || r.Source.GetPort() == uint32(src.Port())) &&
			r.Destination.GetIp() == dst.Addr().String() && r.Destination.GetPort() == uint32(dst.Port()) {
			return r
		}
	}
	return nil
}

// probeSource is the source of a probe from p in the family of dst that
// reported local: a failed TCP probe reports its port alone.
func probeSource(p *tpod, dst netip.Addr, local netip.AddrPort) netip.AddrPort {
	if local.Addr().IsUnspecified() {
		return netip.AddrPortFrom(p.addr(familyOf(dst)), local.Port())
	}
	return local
}

func familyOf(a netip.Addr) probeFamily {
	if a.Is6() {
		return probeIPv6
	}
	return probeIPv4
}

// flows: a connection a policy denies appears in onctl flows --verdict
// denied on the node that denied it within 1 s, with both pods (the other
// one of another node), the direction and the policy isolating the pod,
// in both families; an allowed one appears in --verdict allowed, with the
// policy and rule that allowed it, and makes no denied record; onctl flows
// --follow shows a denial as it happens; bad filters are refused.
func (c *policyCluster) flows(t *testing.T) {
	a, b, yb := c.pod("x/a"), c.pod("x/b"), c.pod("y/b")
	nb := c.node(b)
	if c.node(yb) == nb {
		t.Fatalf("%s and %s share node %s: the test wants the denied client on another node", yb.key(), b.key(), nb.Name)
	}
	pol := netpol("x", "b-from-a-tcp-80", sel("app", "b"), ingressOnly,
		ingressRule(from(networkingv1.NetworkPolicyPeer{PodSelector: selp("app", "a")}), port(corev1.ProtocolTCP, 80)), nil)
	c.set(t, []*networkingv1.NetworkPolicy{pol})

	for _, probe := range []struct {
		proto string
		dst   netip.AddrPort
	}{
		{"tcp", netip.AddrPortFrom(b.lp.IP, 80)},
		{"udp", netip.AddrPortFrom(b.lp.IPv6, 81)},
	} {
		start := time.Now()
		local, err := lab.Probe(yb.lp.Netns, probe.proto, probe.dst.Addr(), int(probe.dst.Port()), probeTimeout)
		if err == nil {
			t.Fatalf("%s → %s %s %s got through", yb.key(), b.key(), probe.proto, probe.dst)
		}
		local = probeSource(yb, probe.dst.Addr(), local)
		rec := c.awaitRecord(t, nb, "denied", b.key(), start, local, probe.dst)
		want := &apiv1.FlowRecord{Node: nb.Name, Event: "policy", Verdict: "denied", Direction: "ingress", Protocol: strings.ToUpper(probe.proto),
			Source:      &apiv1.FlowEndpoint{Kind: "pod", Namespace: "y", Name: "b", Node: c.node(yb).Name, Ip: local.Addr().String(), Port: uint32(local.Port())},
			Destination: &apiv1.FlowEndpoint{Kind: "pod", Namespace: "x", Name: "b", Node: nb.Name, Ip: probe.dst.Addr().String(), Port: uint32(probe.dst.Port())},
			Policies:    []string{"x/b-from-a-tcp-80"}, Path: "slow", Tier: "NetworkPolicy",
			Reason: "default deny: ingress isolated by x/b-from-a-tcp-80, and no rule of theirs allows this"}
		want.TimeUnixNano = rec.TimeUnixNano
		if got, w := protojson.Format(rec), protojson.Format(want); got != w {
			t.Errorf("record:\n%s\nwant:\n%s", got, w)
		}
	}

	// Allowed, from another node: an allowed record on b's node naming
	// the rule, and no denied one.
	if c.node(a) == nb {
		t.Fatalf("%s and %s share node %s: the test wants the allowed client on another node", a.key(), b.key(), nb.Name)
	}
	start := time.Now()
	local, err := lab.Probe(a.lp.Netns, "tcp", b.lp.IP, 80, 3*probeTimeout)
	if err != nil {
		t.Fatalf("%s → %s TCP/80: %v", a.key(), b.key(), err)
	}
	dst := netip.AddrPortFrom(b.lp.IP, 80)
	rec := c.awaitRecord(t, nb, "allowed", b.key(), start, local, dst)
	want := &apiv1.FlowRecord{TimeUnixNano: rec.TimeUnixNano, Node: nb.Name, Event: "policy", Verdict: "allowed", Direction: "ingress", Protocol: "TCP",
		Source:      &apiv1.FlowEndpoint{Kind: "pod", Namespace: "x", Name: "a", Node: c.node(a).Name, Ip: local.Addr().String(), Port: uint32(local.Port())},
		Destination: &apiv1.FlowEndpoint{Kind: "pod", Namespace: "x", Name: "b", Node: nb.Name, Ip: dst.Addr().String(), Port: uint32(dst.Port())},
		Policies:    []string{"x/b-from-a-tcp-80"}, Rule: proto.Int32(0), Path: "slow", Tier: "NetworkPolicy",
		Reason: "allowed by x/b-from-a-tcp-80 ingress rule 0"}
	if got, w := protojson.Format(rec), protojson.Format(want); got != w {
		t.Errorf("allowed record:\n%s\nwant:\n%s", got, w)
	}
	if r := findRecord(c.onctlFlows(t, nb), "denied", start, netip.AddrPortFrom(a.lp.IP, 0), dst); r != nil {
		t.Errorf("the allowed %s → %s TCP/80 has a denied record: %v", a.key(), b.key(), r)
	}

	// --follow prints a denial as it happens.
	cmd := exec.Command(filepath.Join(c.l.BinDir, "onctl"), "--socket", nb.AgentSocket(), "-o", "json", "flows", "--follow", "--pod", b.key(),
		"--since", "1s")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	start = time.Now()
	local, err = lab.Probe(yb.lp.Netns, "tcp", b.lp.IP, 8080, probeTimeout)
	if err == nil {
		t.Fatalf("%s → %s TCP/8080 got through", yb.key(), b.key())
	}
	dst = netip.AddrPortFrom(b.lp.IP, 8080)
	local = probeSource(yb, dst.Addr(), local)
	for timeout := time.After(time.Second); ; {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("onctl flows --follow ended")
			}
			r := &apiv1.FlowRecord{}
			if err := protojson.Unmarshal([]byte(line), r); err != nil {
				t.Fatalf("onctl flows --follow: %v in %q", err, line)
			}
			if findRecord([]*apiv1.FlowRecord{r}, "denied", start, local, dst) == nil {
				continue
			}
		case <-timeout:
			t.Fatalf("onctl flows --follow printed no record of %s → %s within 1 s", local, dst)
		}
		break
	}

	for _, bad := range [][]string{{"--verdict", "maybe"}, {"--pod", "b"}} {
		args := append([]string{"--socket", nb.AgentSocket(), "flows"}, bad...)
		out, err := exec.Command(filepath.Join(c.l.BinDir, "onctl"), args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), "InvalidArgument") || !strings.Contains(string(out), strings.TrimPrefix(bad[0], "--")) {
			t.Errorf("onctl flows %v: %v, %s; want InvalidArgument naming %s", bad, err, out, bad[0])
		}
	}
	if !slices.ContainsFunc(c.onctlFlows(t, nb, "--namespace", "y"), func(r *apiv1.FlowRecord) bool { return r.Source.GetNamespace() == "y" }) {
		t.Error("onctl flows --namespace y: no record from namespace y")
	}
}

// flowsAudit: an audited deny-all lets a connection through, and the node
// that would have denied it records it in onctl flows --verdict would-deny
// within 1 s, with both pods and the policy; onctl policy counts it. With
// the fast path on, the audited pod's new connections open on the slow
// path, where the table sees them, and on the fast path again once the
// audit goes.
func (c *policyCluster) flowsAudit(t *testing.T) {
	b, yb := c.pod("x/b"), c.pod("y/b")
	nb := c.node(b)
	c.setFastPath(t, true)
	pol := netpol("x", "b-audit-deny-all", sel("app", "b"), ingressOnly, nil, nil)
	pol.Annotations = map[string]string{auditAnnotation: "audit"}
	c.set(t, []*networkingv1.NetworkPolicy{pol})
	defer c.set(t, nil)
	opened := stats(t, nb)["ingress_open"]

	// The counters are the pod's since it came: compare with before.
	ingress := func() *apiv1.PolicyDirection {
		var resp apiv1.ListPolicyResponse
		c.onctlJSON(t, nb, &resp, "policy", b.key())
		return resp.Pods[0].Ingress
	}
	before := ingress()
	start := time.Now()
	dst := netip.AddrPortFrom(b.lp.IP, 80)
	local, err := lab.Probe(yb.lp.Netns, "tcp", dst.Addr(), int(dst.Port()), 3*probeTimeout)
	if err != nil {
		t.Fatalf("%s → %s TCP/80 under an audited deny-all: %v", yb.key(), b.key(), err)
	}
	rec := c.awaitRecord(t, nb, "would-deny", b.key(), start, local, dst)
	want := &apiv1.FlowRecord{TimeUnixNano: rec.TimeUnixNano, Node: nb.Name, Event: "policy", Verdict: "allowed", Audit: "would-deny", Direction: "ingress", Protocol: "TCP",
		Source:      &apiv1.FlowEndpoint{Kind: "pod", Namespace: "y", Name: "b", Node: c.node(yb).Name, Ip: local.Addr().String(), Port: uint32(local.Port())},
		Destination: &apiv1.FlowEndpoint{Kind: "pod", Namespace: "x", Name: "b", Node: nb.Name, Ip: dst.Addr().String(), Port: uint32(dst.Port())},
		Policies:    []string{"x/b-audit-deny-all"}, Path: "slow",
		Reason: "audit would deny: ingress audited by x/b-audit-deny-all, no enforcing policy isolates it, and no rule of the audited ones allows this; not enforced"}
	if got, w := protojson.Format(rec), protojson.Format(want); got != w {
		t.Errorf("record:\n%s\nwant:\n%s", got, w)
	}
	if r := findRecord(c.onctlFlows(t, nb, "--verdict", "denied"), "denied", start, local, dst); r != nil {
		t.Errorf("the audited connection has a denied record: %v", r)
	}

	if in := ingress(); in.Isolated || !slices.Equal(in.AuditPolicies, []string{"x/b-audit-deny-all"}) || in.WouldDeny <= before.WouldDeny || in.Denied != before.Denied {
		t.Errorf("onctl policy %s: ingress %v, before the probe %v; want not isolated, audited by x/b-audit-deny-all, would deny 1 more or so, no more denied",
			b.key(), in, before)
	}
	if now := stats(t, nb)["ingress_open"]; now != opened {
		t.Errorf("%s: connections to the audited %s opened on the fast path (ingress_open %d → %d)", nb.Name, b.key(), opened, now)
	}

	// The audit goes: x/b rejoins the fast path's connection setup.
	c.set(t, nil)
	opened = stats(t, nb)["ingress_open"]
	if _, err := lab.Probe(yb.lp.Netns, "tcp", dst.Addr(), int(dst.Port()), 3*probeTimeout); err != nil {
		t.Fatalf("%s → %s TCP/80 without policy: %v", yb.key(), b.key(), err)
	}
	if now := stats(t, nb)["ingress_open"]; now == opened {
		t.Errorf("%s: with the audit gone, a new connection to %s did not open on the fast path (ingress_open %d)", nb.Name, b.key(), now)
	}
}
